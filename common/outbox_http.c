/*
 * outbox_http.c - see outbox_http.h.  A round: the lease (one
 * transaction), then each row read back, called and settled in a
 * transaction of its own, so a row's outcome never waits on another's.
 */
#include "outbox_http.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "array.h"
#include "log.h"
#include "metrics.h"
#include "msg.h"
#include "outbox.h"
#include "sqlbuf.h"
#include "status.h"

#define OUTBOX_HTTP_BACKOFF_FIRST_MS 1000LL
#define OUTBOX_HTTP_BACKOFF_MAX_MS 60000LL
/* Stored columns' widths (migrations 0001, 0016). */
#define OUTBOX_HTTP_ID_MAX 255
#define OUTBOX_HTTP_BODY_MAX ((size_t)16 * 1024 * 1024 - 1)
#define OUTBOX_HTTP_PROPS_MAX ((size_t)65535)

struct outbox_http {
	struct db *db;
	const struct cfg *conf;
	const char *name;
	int index;
	const struct http_dest *dest;
	struct http_client *client;
	uint64_t rng;
	const atomic_bool *stop;
	struct db_stmt *take_due, *take_new, *lease, *release, *read, *mark, *fail, *dead, *stats;
	char *body, *props;
	size_t body_cap, props_cap;
};

/* A row read back for its call. */
struct outbox_http_row {
	int64_t id, attempts;
	char message_id[OUTBOX_HTTP_ID_MAX + 1];
	char routing_key[OUTBOX_HTTP_ID_MAX + 1];
	char type[OUTBOX_HTTP_ID_MAX + 1];
	char order_id[OUTBOX_HTTP_ID_MAX + 1];
	bool has_props;
	size_t len;
};

long long outbox_http_backoff_ms(int64_t attempts, long long retry_after_ms, uint64_t *rng)
{
	long long full = OUTBOX_HTTP_BACKOFF_FIRST_MS, half, ms;

	for (int64_t i = 1; i < attempts && full < OUTBOX_HTTP_BACKOFF_MAX_MS; i++)
		full *= 2;
	if (full > OUTBOX_HTTP_BACKOFF_MAX_MS)
		full = OUTBOX_HTTP_BACKOFF_MAX_MS;
	half = full / 2;
	/* http_backoff_ms's full jitter over the other half: a fixed half
	 * keeps a row's attempts spread over minutes, so an endpoint away
	 * for a while does not use them up in seconds */
	ms = half + http_backoff_ms(0, full - half, full - half, -1, rng);
	if (retry_after_ms > ms)
		ms = retry_after_ms < HTTP_RETRY_AFTER_MAX_MS ? retry_after_ms : HTTP_RETRY_AFTER_MAX_MS;
	return ms;
}

/* The lease: longer than a round's calls can take, each up to the
 * destination's time-out. */
static long outbox_http_lease_s(const struct outbox_http *c, int n)
{
	return (long)(n * c->dest->timeout_ms / 1000) + 30;
}

int outbox_http_open(struct outbox_http **out, struct db *db, const struct cfg *conf, const char *name, int index,
                     const struct http_dest *dest)
{
	struct outbox_http *c = calloc(1, sizeof *c);
	int rc;

	*out = NULL;
	if (c == NULL)
		return ST_ERR_NOMEM;
	*c = (struct outbox_http){ .db = db, .conf = conf, .name = name, .index = index, .dest = dest,
		                   .rng = (uint64_t)time(NULL) ^ ((uint64_t)index << 32) ^ (uint64_t)(uintptr_t)c };
	c->client = http_client_new();
	if (c->client == NULL) {
		free(c);
		return ST_ERR_NOMEM;
	}
	/* Both scans read ix_outbox_route (migration 0019): this
	 * destination's range of it only. */
	rc = db_prepare(db, &c->take_due,
	                "SELECT id FROM outbox WHERE sent_at IS NULL AND destination = ? AND next_attempt_at <= NOW(6)"
	                " AND (leased_until IS NULL OR leased_until <= NOW(6))"
	                " ORDER BY next_attempt_at, id LIMIT ? FOR UPDATE SKIP LOCKED");
	if (rc == ST_OK)
		rc = db_prepare(db, &c->take_new,
		                "SELECT id FROM outbox WHERE sent_at IS NULL AND destination = ? AND next_attempt_at IS NULL"
		                " AND (leased_until IS NULL OR leased_until <= NOW(6))"
		                " ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED");
	if (rc == ST_OK)
		rc = db_prepare(db, &c->lease, "UPDATE outbox SET leased_until = NOW(6) + INTERVAL ? SECOND WHERE id = ?");
	if (rc == ST_OK)
		rc = db_prepare(db, &c->release, "UPDATE outbox SET leased_until = NULL WHERE id = ? AND sent_at IS NULL");
	if (rc == ST_OK)
		rc = db_prepare(db, &c->read,
		                "SELECT message_id, routing_key, type, order_id, props, body, attempts FROM outbox"
		                " WHERE id = ? AND sent_at IS NULL");
	if (rc == ST_OK)
		rc = db_prepare(db, &c->mark,
		                "UPDATE outbox SET sent_at = NOW(6), leased_until = NULL WHERE id = ? AND sent_at IS NULL");
	if (rc == ST_OK)
		rc = db_prepare(db, &c->fail,
		                "UPDATE outbox SET attempts = attempts + 1, next_attempt_at = NOW(6) + INTERVAL ? MICROSECOND,"
		                " last_error = ?, leased_until = NULL WHERE id = ? AND sent_at IS NULL");
	if (rc == ST_OK)
		rc = db_prepare(db, &c->dead,
		                "UPDATE outbox SET sent_at = NOW(6), attempts = attempts + 1, last_error = ?,"
		                " leased_until = NULL WHERE id = ? AND sent_at IS NULL");
	if (rc == ST_OK)
		rc = db_prepare(db, &c->stats,
		                "SELECT COUNT(*), COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), NOW(6)), 0)"
		                " FROM outbox WHERE sent_at IS NULL AND destination = ?");
	if (rc != ST_OK) {
		outbox_http_close(&c);
		return rc;
	}
	*out = c;
	return ST_OK;
}

void outbox_http_close(struct outbox_http **cp)
{
	if (cp == NULL || *cp == NULL)
		return;
	http_client_free(&(*cp)->client);
	free((*cp)->body);
	free((*cp)->props);
	free(*cp);
	*cp = NULL;
}

/* The ids of one scan's due rows, appended to ids. */
static int outbox_http_take(struct outbox_http *c, struct db_stmt *scan, int limit, int64_t *ids, int *n)
{
	struct db_param p[2] = { DBP_STR(c->name), DBP_I64(limit - *n) };
	int rc = db_stmt_query(scan, p, ARRAY_LEN(p));

	if (rc != ST_OK)
		return rc;
	for (;;) {
		struct db_col col[1] = { DBC_I64() };
		int r = db_stmt_fetch(scan, col, 1);

		if (r < 0)
			return r;
		if (r == 0)
			return ST_OK;
		if (*n < limit)
			ids[(*n)++] = col[0].i64;
	}
}

/* last_error and the detail: printable ASCII only (the column's and the
 * header's safe subset), whatever the endpoint answered. */
static void outbox_http_ascii(char *s)
{
	for (; *s != '\0'; s++)
		if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
			*s = '?';
}

/* What the call got, for last_error and the dead letter's detail. */
static void outbox_http_why(const struct outbox_http *c, const struct http_result *res, int64_t attempts, char *buf,
                            size_t cap)
{
	char excerpt[200];

	snprintf(excerpt, sizeof excerpt, "%.*s", (int)(res->excerpt_len < 160 ? res->excerpt_len : 160), res->excerpt);
	if (res->status > 0)
		snprintf(buf, cap, "destination %s: HTTP %d after %lld attempt%s%s%s%s", c->name, res->status,
		         (long long)attempts, attempts == 1 ? "" : "s", excerpt[0] ? ": " : "", excerpt,
		         res->excerpt_cut || res->excerpt_len > 160 ? "..." : "");
	else
		snprintf(buf, cap, "destination %s: no answer after %lld attempt%s: %s", c->name, (long long)attempts,
		         attempts == 1 ? "" : "s", res->error[0] ? res->error : "unknown");
	outbox_http_ascii(buf);
}

/* The traceparent and content type the row's properties carry. */
static void outbox_http_props(const char *props, char *tp, size_t tpcap, char *ct, size_t ctcap)
{
	json_t *o = props != NULL ? json_loads(props, 0, NULL) : NULL;
	const char *s;

	tp[0] = '\0';
	snprintf(ct, ctcap, "application/json");
	if (o == NULL)
		return;
	s = json_string_value(json_object_get(json_object_get(o, "headers"), "traceparent"));
	if (s != NULL)
		snprintf(tp, tpcap, "%s", s);
	s = json_string_value(json_object_get(o, "content_type"));
	if (s != NULL && s[0] != '\0')
		snprintf(ct, ctcap, "%s", s);
	json_decref(o);
}

/* The dead letter of a row and its mark, one transaction. */
static int outbox_http_dead_letter(struct outbox_http *c, const struct outbox_http_row *row, const char *why)
{
	struct sqlbuf b = { .db = c->db };
	struct outbox_dead_letter d = {
		.message_id = row->message_id, .routing_key = row->routing_key, .type = row->type,
		.order_id = row->order_id, .props = row->has_props ? c->props : NULL, .body = c->body, .len = row->len,
		.reason = msg_reason_name(MSG_REASON_DELIVERY_FAILED), .detail = why, .destination = c->name,
	};
	struct db_param p[2] = { DBP_STR(why), DBP_I64(row->id) };
	uint64_t affected = 0;
	char last[256];
	int rc;

	snprintf(last, sizeof last, "dead-lettered: %.230s", why);
	p[0] = DBP_STR(last);
	rc = db_stmt_exec(c->dead, p, ARRAY_LEN(p), &affected);
	if (rc == ST_OK && affected == 0) {
		db_rollback(c->db); /* settled by another courier meanwhile */
		return ST_OK;
	}
	if (rc == ST_OK) {
		sqlbuf_sql(&b, OUTBOX_INSERT_HEAD);
		sqlbuf_list(&b);
		rc = outbox_row_dead_letter(&b, c->conf, NULL, &d);
		if (rc == ST_OK)
			rc = sqlbuf_err(&b);
		if (rc == ST_OK)
			rc = db_exec(c->db, b.p);
	}
	sqlbuf_free(&b);
	if (rc == ST_OK)
		rc = db_commit(c->db);
	if (rc != ST_OK)
		db_rollback(c->db);
	return rc;
}

/* Read row id back, call with it, settle it. */
static int outbox_http_one(struct outbox_http *c, int64_t id, struct outbox_http_round *r)
{
	struct outbox_http_row row = { .id = id };
	struct db_param p[1] = { DBP_I64(id) };
	struct db_col col[7] = {
		DBC_STR(row.message_id, sizeof row.message_id), DBC_STR(row.routing_key, sizeof row.routing_key),
		DBC_STR(row.type, sizeof row.type), DBC_STR(row.order_id, sizeof row.order_id),
		DBC_GROW(&c->props, &c->props_cap, OUTBOX_HTTP_PROPS_MAX), DBC_GROW(&c->body, &c->body_cap, OUTBOX_HTTP_BODY_MAX),
		DBC_I64(),
	};
	char tp[64], ct[256], why[600];
	struct http_result res;
	int got, rc;

	got = db_stmt_query_row(c->read, p, 1, col, ARRAY_LEN(col));
	if (got < 0)
		return got;
	db_rollback(c->db); /* a read: nothing held across the call */
	if (got == 0)
		return ST_OK; /* delivered by another courier meanwhile */
	row.has_props = !col[4].is_null;
	row.len = col[5].len;
	row.attempts = col[6].i64;
	outbox_http_props(row.has_props ? c->props : NULL, tp, sizeof tp, ct, sizeof ct);
	(void)http_call_send(c->client, c->dest, c->body, row.len, ct, row.message_id, tp[0] ? tp : NULL, &res);
	if (res.outcome == HTTP_DELIVERED) {
		rc = db_stmt_exec(c->mark, p, 1, NULL);
		if (rc == ST_OK)
			rc = db_commit(c->db);
		if (rc == ST_OK) {
			r->delivered++;
			metrics_delivery(c->index, METRICS_HTTP_DELIVERED, 1);
		}
		return rc;
	}
	outbox_http_why(c, &res, row.attempts + 1, why, sizeof why);
	if (res.outcome == HTTP_RETRY && row.attempts + 1 < c->conf->http_max_attempts) {
		long long ms = outbox_http_backoff_ms(row.attempts + 1, res.retry_after_ms, &c->rng);
		struct db_param f[3] = { DBP_I64(ms * 1000), DBP_STRN(why, strlen(why) > 255 ? 255 : strlen(why)),
			                 DBP_I64(id) };

		LOG(row.attempts == 0 ? LOG_LEVEL_INFO : LOG_LEVEL_DEBUG, "HTTP delivery failed; it is called again",
		    LOG_S("destination", c->name), LOG_S("msg", row.message_id), LOG_S("why", why),
		    LOG_I("retry_in_ms", ms));
		rc = db_stmt_exec(c->fail, f, ARRAY_LEN(f), NULL);
		if (rc == ST_OK)
			rc = db_commit(c->db);
		if (rc == ST_OK) {
			r->retried++;
			metrics_delivery(c->index, METRICS_HTTP_RETRIED, 1);
		}
		return rc;
	}
	LOG(LOG_LEVEL_WARN, "HTTP delivery failed for good; the event is dead-lettered as delivery-failed",
	    LOG_S("destination", c->name), LOG_S("msg", row.message_id), LOG_S("why", why));
	rc = outbox_http_dead_letter(c, &row, why);
	if (rc == ST_OK) {
		r->dead_lettered++;
		metrics_delivery(c->index, METRICS_HTTP_DEAD_LETTERED, 1);
	}
	return rc;
}

int outbox_http_round(struct outbox_http *c, int limit, struct outbox_http_round *r)
{
	int64_t ids[OUTBOX_HTTP_ROUND_MAX];
	int n = 0, rc;

	*r = (struct outbox_http_round){ 0 };
	if (limit > OUTBOX_HTTP_ROUND_MAX)
		limit = OUTBOX_HTTP_ROUND_MAX;
	rc = outbox_http_take(c, c->take_due, limit, ids, &n);
	if (rc == ST_OK && n < limit)
		rc = outbox_http_take(c, c->take_new, limit, ids, &n);
	for (int i = 0; rc == ST_OK && i < n; i++) {
		struct db_param p[2] = { DBP_I64(outbox_http_lease_s(c, n)), DBP_I64(ids[i]) };

		rc = db_stmt_exec(c->lease, p, ARRAY_LEN(p), NULL);
	}
	if (rc == ST_OK)
		rc = db_commit(c->db);
	if (rc != ST_OK) {
		db_rollback(c->db);
		return rc;
	}
	r->taken = n;
	for (int i = 0; i < n; i++) {
		if (c->stop != NULL && atomic_load(c->stop)) {
			for (int k = i; rc == ST_OK && k < n; k++) {
				struct db_param p[1] = { DBP_I64(ids[k]) };

				rc = db_stmt_exec(c->release, p, 1, NULL);
			}
			if (rc == ST_OK)
				rc = db_commit(c->db);
			if (rc != ST_OK)
				db_rollback(c->db); /* their leases run out instead */
			return rc;
		}
		rc = outbox_http_one(c, ids[i], r);
		if (rc != ST_OK) {
			db_rollback(c->db);
			return rc; /* the rest keep their lease until it runs out */
		}
	}
	return ST_OK;
}

void outbox_http_set_stop(struct outbox_http *c, const atomic_bool *stop)
{
	c->stop = stop;
}

int outbox_http_stats(struct outbox_http *c, int64_t *pending, double *oldest_s)
{
	struct db_param p[1] = { DBP_STR(c->name) };
	struct db_col col[2] = { DBC_I64(), DBC_I64() };
	int got = db_stmt_query_row(c->stats, p, 1, col, 2);

	db_rollback(c->db);
	if (got < 0)
		return got;
	*pending = got > 0 ? col[0].i64 : 0;
	*oldest_s = got > 0 ? (double)col[1].i64 / 1e6 : 0;
	return ST_OK;
}
