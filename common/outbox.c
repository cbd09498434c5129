/*
 * outbox.c - see outbox.h.  One relay round, in two transactions:
 *
 *   1. the claim: the ids of rows whose backoff ran out (next_attempt_at
 *      <= now), then of rows that never failed, in id order, none under
 *      another relay's lease, locked (SKIP LOCKED) and leased
 *      (leased_until), COMMIT.  A lease is a committed write: on a Galera
 *      cluster, where row locks are local to a node, certification orders
 *      two relays' leases of the same row and the second one's COMMIT
 *      fails (a deadlock, 1213), so that relay publishes nothing this
 *      round.  Before migration 0014 the row locks alone were the claim,
 *      held across the publish, and relays on two nodes both published
 *      the same rows;
 *   2. the leased rows read back and published: the retried ones one at a
 *      time, each confirm awaited before the next (they failed before, so
 *      their outcome must be their own even if the broker closes the
 *      channel over one of them), the others pipelined;
 *   3. wait for the confirms; every publish has its own sequence number and
 *      outcome (mq_outcome), so each row is settled by its own confirm;
 *   4. mark the confirmed rows sent and push the failed ones back by their
 *      backoff (both clear the lease), release the lease of the rows left
 *      unconfirmed (the broker went away), COMMIT.
 *
 * A relay that dies between 1 and 4 leaves its lease to run out
 * (OUTBOX_LEASE_S); then another relay publishes the rows again, with the
 * same message-ids.  A live one stops publishing when its round's budget
 * is spent (OUTBOX_ROUND_BUDGET_MS) and gives the rest back in 4, so it
 * never publishes a row whose lease another relay may have taken.  Two COMMITs per round, however many rows: see the
 * janitor in worker/janitor.c for why commits are the cost.
 *
 * A basic.return carries no delivery tag.  Mandatory publishes (the
 * dead-letter copies: they must land in the DLQ) therefore wait until
 * nothing else is unconfirmed before they go out, so that at most one
 * mandatory publish is ever in flight and a return can only be its own.
 * The other choice, a correlation header on every copy, would put a header
 * of ours on dead-lettered messages that SPEC.md says keep their
 * properties; dead-letter copies are rare, so the round trip is cheap.
 *
 * A broker error in the middle of a round (a channel closed because an
 * exchange is missing, a lost connection, a confirm time-out) cannot be
 * pinned on one row of a pipeline: the confirmed rows are marked sent, the
 * unconfirmed ones stay pending untouched, and the next rounds publish one
 * row at a time (isolate) until a round passes without a broker error.
 * Then a row the broker refuses is charged with its own failure and the
 * others go on.  A row for an exchange the worker does not declare itself
 * (one that may not exist) is published alone from the start.
 */
#include "outbox.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "array.h"
#include "deadletter.h"
#include "lifecycle_dest.h"
#include "lifecycle_emit.h"
#include "log.h"
#include "outbox_int.h"
#include "aggregate.h"
#include "msg.h"
#include "status.h"

#define OUTBOX_BATCH_MAX 64
_Static_assert(OUTBOX_BATCH_MAX <= DB_MAX_PARAMS, "a round's ids are one statement's parameters");
#define OUTBOX_DUE_MAX 16          /* retried rows per round, each confirmed alone */
/* Column limits, not INBOX_MAX_BODY: what is stored must be publishable
 * whatever today's configuration says. */
#define OUTBOX_BODY_MAX ((size_t)16 * 1024 * 1024 - 1) /* MEDIUMBLOB */
#define OUTBOX_TEXT_MAX ((size_t)65535)                /* TEXT */
#define OUTBOX_NAME_MAX 1024       /* VARCHAR(255) of up to 4-byte characters */
/* A buffer grown past this for one large row is given back after the round. */
#define OUTBOX_KEEP_MAX ((size_t)1024 * 1024)
/* Longer than a round takes, short enough that rows a dead relay leased
 * go out again within a minute.  A round may take long: rows retried one
 * at a time (or all of them after a broker error) each wait for their own
 * confirm, up to OUTBOX_CONFIRM_MS.  So a round stops publishing once
 * OUTBOX_ROUND_BUDGET_MS have passed since its lease began and gives the
 * rest back; a publish started before then waits at most one confirm for
 * a mandatory neighbour and one for itself, and the round's last wait one
 * more: all within the lease, which no other relay can take meanwhile. */
#define OUTBOX_LEASE_S 60
#define OUTBOX_ROUND_BUDGET_MS 25000
_Static_assert(OUTBOX_ROUND_BUDGET_MS + 3 * OUTBOX_CONFIRM_MS < OUTBOX_LEASE_S * 1000,
               "a round must end within its lease");
#define OUTBOX_BACKOFF_FIRST_MS 1000
#define OUTBOX_BACKOFF_MAX_MS 60000

struct outbox {
	struct db *db;
	const struct cfg *conf;
	struct db_stmt *take_due;
	struct db_stmt *take_new;
	struct db_stmt *lease;   /* lease the ids of a round */
	struct db_stmt *read;    /* read them back, retried ones first */
	struct db_stmt *release; /* end the lease of rows left unconfirmed */
	struct db_stmt *mark;
	struct db_stmt *fail;
	struct db_stmt *stats;
	char *body;
	size_t body_cap;
	char *props;
	size_t props_cap;
	char *headers;
	size_t headers_cap;
	bool isolate; /* a broker error in the last round: one row at a time */
	int budget_ms;  /* OUTBOX_ROUND_BUDGET_MS, or a test's */
	struct timespec leased; /* when this round's lease began */
	/* A round's rows, allocated once: the janitor runs a round after
	 * every batch that wrote outbox rows, often for a handful. */
	struct outbox_row *rows;
};

/* A row taken in this round and what became of it. */
struct outbox_row {
	int64_t id;
	int64_t attempts;   /* failed publishes before this round */
	uint64_t seq;       /* publish sequence number; 0: not published */
	char why[256];      /* set: the row failed this round (its last_error) */
	char last_error[256];
	char mid[129];      /* for the log, cut */
	char exch[129];
};

#define OUTBOX_COLS "id, message_id, exchange, routing_key, type, props, headers, body, attempts, last_error"

#define OUTBOX_STR2(x) #x
#define OUTBOX_STR(x) OUTBOX_STR2(x)

/* ---- writing rows (for the deciding transaction) ---------------------- */

/* Now as RFC 3339 UTC, to the second. */
static int outbox_now(char *buf, size_t cap)
{
	time_t now = time(NULL);
	struct tm tm;

	if (gmtime_r(&now, &tm) == NULL || strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
		return ST_ERR_INVALID;
	return ST_OK;
}

static char *outbox_dup(const char *s)
{
	return s != NULL ? strdup(s) : NULL;
}

/* A copy of a row for its writer to publish after the commit. */
static int outbox_mem_add(struct outbox_mem *mem, const char *id, const char *exchange, const char *rk,
                          const char *type, const char *props, const char *headers, const void *body, size_t len)
{
	struct outbox_msg *m;

	if (mem->n == mem->cap) {
		int cap = mem->cap > 0 ? 2 * mem->cap : 16;
		void *p = realloc(mem->v, (size_t)cap * sizeof *mem->v);

		if (p == NULL)
			return ST_ERR_NOMEM;
		mem->v = p;
		mem->cap = cap;
	}
	m = &mem->v[mem->n];
	*m = (struct outbox_msg){
		.message_id = outbox_dup(id), .exchange = outbox_dup(exchange), .routing_key = outbox_dup(rk),
		.type = outbox_dup(type), .props = outbox_dup(props), .headers = outbox_dup(headers),
		.body = malloc(len > 0 ? len : 1), .len = len,
	};
	mem->n++; /* counted even when a copy failed: outbox_mem_reset frees it */
	if (m->message_id == NULL || m->exchange == NULL || m->routing_key == NULL || m->type == NULL ||
	    (props != NULL && m->props == NULL) || (headers != NULL && m->headers == NULL) || m->body == NULL)
		return ST_ERR_NOMEM;
	memcpy(m->body, body, len);
	return ST_OK;
}

void outbox_mem_reset(struct outbox_mem *mem)
{
	for (int i = 0; i < mem->n; i++) {
		struct outbox_msg *m = &mem->v[i];

		free(m->message_id);
		free(m->exchange);
		free(m->routing_key);
		free(m->type);
		free(m->props);
		free(m->headers);
		free(m->body);
	}
	mem->n = 0;
}

void outbox_mem_free(struct outbox_mem *mem)
{
	outbox_mem_reset(mem);
	free(mem->v);
	mem->v = NULL;
	mem->cap = 0;
}

/* dest: the running definition's destination index, -1 for none. */
static int outbox_row_sql(struct sqlbuf *b, struct outbox_mem *mem, const char *id, const char *exchange,
                          const char *rk, const char *type, const char *order_id, const char *props,
                          const char *headers, const void *body, size_t len, int dest)
{
	sqlbuf_row(b);
	sqlbuf_str(b, id);
	sqlbuf_str(b, exchange);
	sqlbuf_str(b, rk);
	sqlbuf_str(b, type);
	sqlbuf_str(b, order_id);
	sqlbuf_str(b, props);
	sqlbuf_str(b, headers);
	sqlbuf_bytes(b, body, len);
	sqlbuf_value(b, "NOW(6)");
	if (mem != NULL)
		sqlbuf_i64(b, mem->claim);
	else
		sqlbuf_value(b, "NULL");
	if (dest >= 0)
		sqlbuf_str(b, agg_current()->def->dests[dest].name);
	else
		sqlbuf_value(b, "NULL");
	sqlbuf_row_end(b);
	return mem != NULL ? outbox_mem_add(mem, id, exchange, rk, type, props, headers, body, len) : ST_OK;
}

/* The properties an emitted event is published with (props_build reads
 * them back): its correlation-id -- the cause's correlation id, else the
 * cause's message id, so a consumer can tell what it answers --, the trace
 * context continued (traceparent with the cause's trace id and its span as
 * the parent, tracestate as it came) and, for a CloudEvent, its content
 * type.  NULL only when memory ran out. */
static char *outbox_event_props(const struct cfg *conf, const char *cause_message_id, const struct env_context *ctx,
                                const char *tp)
{
	json_t *o = json_object(), *h = json_object();
	const char *corr = ctx != NULL && ctx->correlation_id[0] != '\0' ? ctx->correlation_id : cause_message_id;
	char *s = NULL;

	if (o == NULL || h == NULL)
		goto out;
	if (json_object_set_new(o, "correlation_id", json_string(corr)) != 0)
		goto out;
	if (env_emit_content_type(conf) != NULL &&
	    json_object_set_new(o, "content_type", json_string(env_emit_content_type(conf))) != 0)
		goto out;
	if (tp[0] != '\0') {
		if (json_object_set_new(h, "traceparent", json_string(tp)) != 0 ||
		    (ctx->tracestate[0] != '\0' && json_object_set_new(h, "tracestate", json_string(ctx->tracestate)) != 0))
			goto out;
		if (json_object_set(o, "headers", h) != 0)
			goto out;
	}
	s = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
out:
	json_decref(h);
	json_decref(o);
	return s;
}

int outbox_row_event(struct sqlbuf *b, const struct cfg *conf, struct outbox_mem *mem, int emit,
                     const char *order_id, const char *cause_message_id, const char *cause_type,
                     const struct env_context *ctx, int64_t seq, int64_t emitted)
{
	char id[MSG_WIDE_ID_MAX + 1], rk[OUTBOX_SHORTSTR_MAX + 1], ts[32], tp[ENV_TRACEPARENT_LEN + 1];
	char *body = NULL, *props = NULL;
	const struct lc_def *def = agg_current()->def;
	const char *type;
	int rc = outbox_now(ts, sizeof ts);

	if (rc != ST_OK)
		return rc;
	/* Names, key and cause are bounded (64 each): an id always fits the
	 * outbox's 255, so it is never cut into another event's id. */
	if (lc_emit_id(def, emit, order_id, id, sizeof id) < 0)
		return ST_ERR_INVALID;
	if (seq > 0) {
		size_t l = strlen(id);

		if (snprintf(id + l, sizeof id - l, ":%lld", (long long)seq) >= (int)(sizeof id - l))
			return ST_ERR_INVALID;
	}
	type = def->emits[emit];
	/* The aggregate's name and key are the lifecycle definition's
	 * ("order", "order_id" for the built-in one). */
	snprintf(rk, sizeof rk, "%s.%s", def->aggregate, type);
	(void)env_traceparent(ctx, tp, sizeof tp);
	{
		struct env_emitted e = {
			.id = id, .type = type, .key_field = def->key, .key = order_id, .time = ts,
			.cause_message_id = cause_message_id, .cause_type = cause_type, .traceparent = tp,
			.tracestate = tp[0] != '\0' ? ctx->tracestate : "", .cause_sequence = seq,
			.sequence = emitted,
		};

		body = env_emit_body(conf, &e);
	}
	props = outbox_event_props(conf, cause_message_id, ctx, tp);
	if (body == NULL || props == NULL) {
		free(body);
		free(props);
		return ST_ERR_NOMEM;
	}
	if (lc_emit_to_exchange(def, emit))
		rc = outbox_row_sql(b, mem, id, conf->out_exchange, rk, type, order_id, props, NULL, body, strlen(body),
		                    -1);
	for (int d = 0; rc == ST_OK && d < def->ndests; d++) {
		char exch[OUTBOX_SHORTSTR_MAX + 1];

		if (!lc_emit_to_dest(def, emit, d))
			continue;
		snprintf(exch, sizeof exch, "%s%s", OUTBOX_HTTP_EXCHANGE, def->dests[d].name);
		/* claim NULL, no copy: the destination's courier takes it at
		 * once (outbox_http.h), not the committing thread */
		rc = outbox_row_sql(b, NULL, id, exch, rk, type, order_id, props, NULL, body, strlen(body), d);
	}
	free(body);
	free(props);
	return rc;
}

int outbox_row_dead_letter(struct sqlbuf *b, const struct cfg *conf, struct outbox_mem *mem,
                           const struct outbox_dead_letter *d)
{
	struct deadletter_headers dh;
	char note[400];
	char *headers;
	int rc;

	/* What the saved properties had to escape or drop, said where the
	 * DLQ reader looks (props.c keeps the note ASCII). */
	mq_props_json_note(d->props, note, sizeof note);
	deadletter_headers(&dh, d->reason, d->detail, note, d->deliveries);
	if (d->destination != NULL)
		dh.h[dh.n++] = (struct mq_header){ DEADLETTER_DESTINATION, d->destination };
	headers = deadletter_headers_json(&dh);
	if (headers == NULL)
		return ST_ERR_NOMEM;
	rc = outbox_row_sql(b, mem, d->message_id, conf->dlx, d->routing_key, d->type, d->order_id, d->props, headers,
	                    d->body, d->len, -1);
	free(headers);
	return rc;
}

/* ---- the relay -------------------------------------------------------- */

/* Prepare head + "?, ?, ... ?)" (OUTBOX_BATCH_MAX places) + tail. */
static int outbox_prepare_in(struct db *db, struct db_stmt **st, const char *head, const char *tail)
{
	char sql[512 + OUTBOX_BATCH_MAX * 3];
	size_t len = strlen(head), tlen = strlen(tail);

	if (len + OUTBOX_BATCH_MAX * 3 + tlen + 2 > sizeof sql)
		return ST_ERR_INVALID;
	memcpy(sql, head, len);
	sql[len++] = '?';
	for (int i = 1; i < OUTBOX_BATCH_MAX; i++) {
		memcpy(sql + len, ", ?", 3);
		len += 3;
	}
	sql[len++] = ')';
	memcpy(sql + len, tail, tlen + 1);
	return db_prepare(db, st, sql);
}

/* Run an "id IN (...)" statement over ids (n >= 1). */
static int outbox_exec_in(struct db_stmt *st, const int64_t *ids, int n)
{
	struct db_param p[OUTBOX_BATCH_MAX];

	for (int i = 0; i < OUTBOX_BATCH_MAX; i++)
		p[i] = DBP_I64(ids[i < n ? i : 0]);
	return db_stmt_exec(st, p, ARRAY_LEN(p), NULL);
}

int outbox_open(struct outbox **out, struct db *db, const struct cfg *conf)
{
	struct outbox *ob = calloc(1, sizeof *ob);
	int rc = ST_ERR_NOMEM;

	*out = NULL;
	if (ob == NULL)
		return ST_ERR_NOMEM;
	ob->db = db;
	ob->conf = conf;
	ob->budget_ms = OUTBOX_ROUND_BUDGET_MS;
	/* Both scans read ix_outbox_route (migrations/0019) in its order,
	 * so rows backing off are never walked over by the first one, nor
	 * rows for an HTTP destination (its courier's, outbox_http.h). */
	rc = db_prepare(db, &ob->take_due,
	                "SELECT id FROM outbox WHERE sent_at IS NULL AND destination IS NULL AND next_attempt_at <= NOW(6)"
	                " AND (leased_until IS NULL OR leased_until <= NOW(6))"
	                " AND (claim IS NULL OR created_at < NOW(6) - INTERVAL ? SECOND)"
	                " ORDER BY next_attempt_at, id LIMIT ? FOR UPDATE SKIP LOCKED");
	if (rc == ST_OK)
		rc = db_prepare(db, &ob->take_new,
		                "SELECT id FROM outbox WHERE sent_at IS NULL AND destination IS NULL AND next_attempt_at IS NULL"
		                " AND (leased_until IS NULL OR leased_until <= NOW(6))"
		                " AND (claim IS NULL OR created_at < NOW(6) - INTERVAL ? SECOND)"
		                " ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED");
	/* One statement per batch for each of these: unused places repeat
	 * the first id, which changes nothing. */
	if (rc == ST_OK)
		rc = outbox_prepare_in(db, &ob->lease, "UPDATE outbox SET leased_until = NOW(6) + INTERVAL "
		                       OUTBOX_STR(OUTBOX_LEASE_S) " SECOND WHERE id IN (", "");
	if (rc == ST_OK)
		rc = outbox_prepare_in(db, &ob->read, "SELECT " OUTBOX_COLS ", next_attempt_at IS NOT NULL"
		                       " FROM outbox WHERE sent_at IS NULL AND id IN (",
		                       " ORDER BY next_attempt_at IS NULL, next_attempt_at, id");
	if (rc == ST_OK)
		rc = outbox_prepare_in(db, &ob->release, "UPDATE outbox SET leased_until = NULL WHERE id IN (", "");
	if (rc == ST_OK)
		rc = outbox_prepare_in(db, &ob->mark,
		                       "UPDATE outbox SET sent_at = NOW(6), leased_until = NULL WHERE id IN (", "");
	if (rc == ST_OK)
		rc = db_prepare(db, &ob->fail,
		                "UPDATE outbox SET attempts = attempts + 1, next_attempt_at = NOW(6) + INTERVAL ? MICROSECOND,"
		                " last_error = ?, leased_until = NULL WHERE id = ?");
	if (rc == ST_OK)
		rc = db_prepare(db, &ob->stats,
		                "SELECT COUNT(*), COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), NOW(6)), 0)"
		                " FROM outbox WHERE sent_at IS NULL AND destination IS NULL");
	if (rc != ST_OK)
		goto fail;
	*out = ob;
	return ST_OK;
fail:
	outbox_close(&ob);
	return rc;
}

void outbox_close(struct outbox **obp)
{
	struct outbox *ob;

	if (obp == NULL || *obp == NULL)
		return;
	ob = *obp;
	free(ob->body);
	free(ob->props);
	free(ob->headers);
	free(ob->rows);
	free(ob);
	*obp = NULL;
}

/* Give back a buffer that one large row grew; the next round starts small. */
static void outbox_shrink(char **buf, size_t *cap)
{
	if (*cap > OUTBOX_KEEP_MAX) {
		free(*buf);
		*buf = NULL;
		*cap = 0;
	}
}

int outbox_headers(const char *json, json_t **keep, struct mq_header *h, int cap)
{
	json_error_t err;
	const char *k;
	json_t *v;
	int n = 0;

	*keep = NULL;
	if (json == NULL)
		return 0;
	*keep = json_loads(json, 0, &err);
	if (*keep == NULL || !json_is_object(*keep))
		return -1;
	json_object_foreach(*keep, k, v) {
		if (n >= cap || !json_is_string(v))
			return -1;
		h[n].key = k;
		h[n].value = json_string_value(v);
		n++;
	}
	return n;
}

/* last_error is VARCHAR(255) in the table's character set: keep printable
 * ASCII only, so that no broker text can make the UPDATE itself fail. */
static void outbox_why(struct outbox_row *row, const char *a, const char *b, const char *c)
{
	size_t i;

	snprintf(row->why, sizeof row->why, "%s%s%s", a, b, c);
	for (i = 0; row->why[i] != '\0'; i++)
		if ((unsigned char)row->why[i] < 0x20 || (unsigned char)row->why[i] > 0x7e)
			row->why[i] = '?';
	if (row->why[0] == '\0')
		snprintf(row->why, sizeof row->why, "unknown");
}

static int outbox_backoff_ms(int64_t attempts)
{
	int64_t ms = OUTBOX_BACKOFF_FIRST_MS;

	for (int64_t i = 0; i < attempts && ms < OUTBOX_BACKOFF_MAX_MS; i++)
		ms *= 2;
	return (int)(ms > OUTBOX_BACKOFF_MAX_MS ? OUTBOX_BACKOFF_MAX_MS : ms);
}

/* Publish one fetched row.  alone: wait for its confirm before returning
 * (a retried row, or isolate mode), so that any broker error is its own.
 * *mqrc gets a broker error that ends the round's publishing. */
static void outbox_publish(struct outbox *ob, struct mq *pub, struct outbox_row *row, const struct db_col *c,
                           bool alone, int *mqrc)
{
	struct mq_header h[OUTBOX_HEADERS_MAX];
	json_t *keep = NULL;
	struct mq_message m;
	const char *exch = c[2].buf, *rk = c[3].buf;
	int nh, rc;

	if (c[1].len > OUTBOX_SHORTSTR_MAX || c[2].len > OUTBOX_SHORTSTR_MAX || c[3].len > OUTBOX_SHORTSTR_MAX ||
	    c[4].len > OUTBOX_SHORTSTR_MAX) {
		outbox_why(row, "message id, exchange, routing key or type longer than 255 bytes", "", "");
		return;
	}
	nh = outbox_headers(c[6].is_null ? NULL : ob->headers, &keep, h, OUTBOX_HEADERS_MAX);
	if (nh < 0) {
		json_decref(keep);
		outbox_why(row, "stored headers are not a JSON object of at most 16 strings", "", "");
		return;
	}
	/* Only the exchanges the worker declares are known to exist; a
	 * publish to another one may close the channel, so it goes alone and
	 * a missing exchange is charged to its own row. */
	if (strcmp(exch, ob->conf->out_exchange) != 0 && strcmp(exch, ob->conf->dlx) != 0)
		alone = true;
	m = (struct mq_message){
		.exchange = exch, .routing_key = rk, .body = ob->body, .len = c[7].len,
		.props_json = c[5].is_null ? NULL : ob->props, .message_id = c[1].buf, .type = c[4].buf,
		.headers = h, .nheaders = nh,
		/* A dead-letter copy must land in its queue; an emitted
		 * event is pub/sub and may have no subscriber yet. */
		.mandatory = strcmp(exch, ob->conf->dlx) == 0,
	};
	/* At most one mandatory publish in flight: a return is then its own. */
	if ((m.mandatory || alone) && mq_unconfirmed(pub) > 0) {
		rc = mq_wait_confirms(pub, OUTBOX_CONFIRM_MS);
		if (outbox_broker_error(rc)) {
			*mqrc = rc;
			json_decref(keep);
			return;
		}
	}
	row->seq = mq_next_seq(pub);
	rc = mq_publish(pub, &m);
	json_decref(keep);
	if (rc == ST_ERR_INVALID) {
		/* The stored properties did not parse; nothing was sent. */
		row->seq = 0;
		outbox_why(row, "stored properties are not a JSON object", "", "");
		return;
	}
	if (rc == ST_OK && alone)
		rc = mq_wait_confirms(pub, OUTBOX_CONFIRM_MS);
	if (!outbox_broker_error(rc))
		return;
	*mqrc = rc;
	if (alone) {
		/* Nothing else was in flight: the broker's refusal (e.g. "no
		 * exchange") is this row's.  A real outage charges at most
		 * this one row, which only delays it by its backoff. */
		row->seq = 0;
		outbox_why(row, "publish failed: ", mq_errmsg(pub), "");
	}
}

/* Claim: the ids of up to limit rows of one scan, appended to ids[]
 * (rows a thread dispatched from memory only once older than sweep_s). */
static int outbox_claim(struct db_stmt *scan, long sweep_s, int limit, int64_t *ids, int *n)
{
	struct db_param p[2] = { DBP_I64(sweep_s), DBP_I64(limit) };
	int rc = db_stmt_query(scan, p, ARRAY_LEN(p));

	if (rc != ST_OK)
		return rc;
	for (;;) {
		struct db_col c[1] = { DBC_I64() };
		int r;

		if (*n >= OUTBOX_BATCH_MAX) {
			db_stmt_done(scan);
			break;
		}
		r = db_stmt_fetch(scan, c, ARRAY_LEN(c));
		if (r < 0)
			return r;
		if (r == 0)
			break;
		ids[(*n)++] = c[0].i64;
	}
	return ST_OK;
}

void outbox_set_round_budget(struct outbox *ob, int ms)
{
	ob->budget_ms = ms;
}

/* The round's time since its lease began is spent (see OUTBOX_LEASE_S). */
static bool outbox_over_budget(const struct outbox *ob)
{
	struct timespec now;
	long ms;

	if (clock_gettime(CLOCK_MONOTONIC, &now) != 0)
		return true; /* no clock: one row a round, safe */
	ms = (now.tv_sec - ob->leased.tv_sec) * 1000L + (now.tv_nsec - ob->leased.tv_nsec) / 1000000L;
	return ms >= ob->budget_ms;
}

/* Read the leased rows back (retried ones first) and publish each: a
 * retried row alone, the others pipelined unless isolate.  *n counts the
 * rows read into rows[]. */
static int outbox_take(struct outbox *ob, struct mq *pub, const int64_t *ids, int nids, bool isolate,
                       struct outbox_row *rows, int *n, int *mqrc)
{
	struct db_param p[OUTBOX_BATCH_MAX];
	int rc;

	for (int i = 0; i < OUTBOX_BATCH_MAX; i++)
		p[i] = DBP_I64(ids[i < nids ? i : 0]);
	rc = db_stmt_query(ob->read, p, ARRAY_LEN(p));
	if (rc != ST_OK)
		return rc;
	for (;;) {
		char mid[OUTBOX_NAME_MAX + 1], exch[OUTBOX_NAME_MAX + 1], rk[OUTBOX_NAME_MAX + 1];
		char type[OUTBOX_NAME_MAX + 1], last_error[OUTBOX_NAME_MAX + 1];
		struct db_col c[11] = {
			DBC_I64(), DBC_STR(mid, sizeof mid), DBC_STR(exch, sizeof exch), DBC_STR(rk, sizeof rk),
			DBC_STR(type, sizeof type), DBC_GROW(&ob->props, &ob->props_cap, OUTBOX_TEXT_MAX),
			DBC_GROW(&ob->headers, &ob->headers_cap, OUTBOX_TEXT_MAX),
			DBC_GROW(&ob->body, &ob->body_cap, OUTBOX_BODY_MAX), DBC_I64(),
			DBC_STR(last_error, sizeof last_error), DBC_I64(),
		};
		struct outbox_row *row;
		int r;

		/* Time is up: the rows not read stay unpublished, and settle
		 * gives their lease back.  One row always goes, so every round
		 * makes progress. */
		if (*n >= OUTBOX_BATCH_MAX || (*n > 0 && outbox_over_budget(ob))) {
			db_stmt_done(ob->read);
			break;
		}
		r = db_stmt_fetch(ob->read, c, ARRAY_LEN(c));
		if (r < 0)
			return r;
		if (r == 0)
			break;
		row = &rows[(*n)++];
		memset(row, 0, sizeof *row);
		row->id = c[0].i64;
		row->attempts = c[8].i64;
		snprintf(row->mid, sizeof row->mid, "%.128s", mid);
		snprintf(row->exch, sizeof row->exch, "%.128s", exch);
		snprintf(row->last_error, sizeof row->last_error, "%.255s", c[9].is_null ? "" : last_error);
		outbox_publish(ob, pub, row, c, isolate || c[10].i64 != 0, mqrc);
		if (*mqrc != ST_OK) {
			/* The publisher is gone: the rest stay pending, untouched. */
			db_stmt_done(ob->read);
			break;
		}
	}
	return ST_OK;
}

/* Write what became of each row: the confirmed ones sent (one statement),
 * the failed ones pushed back by their backoff. */
static int outbox_settle(struct outbox *ob, struct mq *pub, struct outbox_row *rows, int n,
                         const int64_t *ids, int nids, struct outbox_round *r)
{
	int64_t sent[OUTBOX_BATCH_MAX], left[OUTBOX_BATCH_MAX];
	int nsent = 0, nleft = 0, rc;

	for (int i = 0; i < n; i++) {
		struct outbox_row *row = &rows[i];

		if (row->why[0] != '\0' || row->seq == 0)
			continue;
		switch (mq_outcome(pub, row->seq)) {
		case MQ_OUTCOME_ACKED:
			sent[nsent++] = row->id;
			break;
		case MQ_OUTCOME_RETURNED:
			outbox_why(row, "returned unroutable: no queue bound to ", row->exch, " for its routing key");
			break;
		case MQ_OUTCOME_NACKED:
			outbox_why(row, "nacked by the broker", "", "");
			break;
		default:
			/* No confirm (the connection failed): not this row's
			 * fault; published again by a later round. */
			break;
		}
	}
	/* Every leased row that is neither sent nor charged with a failure
	 * (unconfirmed, not published, or not even read after the publisher
	 * failed) is free again for the next round. */
	for (int j = 0; j < nids; j++) {
		bool settled = false;

		for (int i = 0; i < nsent && !settled; i++)
			settled = sent[i] == ids[j];
		for (int i = 0; i < n && !settled; i++)
			settled = rows[i].id == ids[j] && rows[i].why[0] != '\0';
		if (!settled)
			left[nleft++] = ids[j];
	}
	if (nsent > 0) {
		rc = outbox_exec_in(ob->mark, sent, nsent);
		if (rc != ST_OK)
			return rc;
	}
	if (nleft > 0) {
		rc = outbox_exec_in(ob->release, left, nleft);
		if (rc != ST_OK)
			return rc;
	}
	r->sent = nsent;
	for (int i = 0; i < n; i++) {
		struct outbox_row *row = &rows[i];
		struct db_param fp[3];

		if (row->why[0] == '\0')
			continue;
		fp[0] = DBP_I64((int64_t)outbox_backoff_ms(row->attempts) * 1000);
		fp[1] = DBP_STR(row->why);
		fp[2] = DBP_I64(row->id);
		rc = db_stmt_exec(ob->fail, fp, ARRAY_LEN(fp), NULL);
		if (rc != ST_OK)
			return rc;
		r->failed++;
	}
	return ST_OK;
}

/* After the commit: a row's failure is logged when it starts or its reason
 * changes, its recovery once; every other retry only at debug level. */
static void outbox_log(const struct outbox_row *rows, int n, struct mq *pub)
{
	for (int i = 0; i < n; i++) {
		const struct outbox_row *row = &rows[i];

		if (row->why[0] != '\0') {
			bool news = row->attempts == 0 || strcmp(row->why, row->last_error) != 0;
			LOG(news ? LOG_LEVEL_WARN : LOG_LEVEL_DEBUG, "outbox row failing; retried with backoff", LOG_I("id", row->id),
			    LOG_S("message_id", row->mid), LOG_S("exchange", row->exch), LOG_I("attempt", row->attempts + 1),
			    LOG_I("retry_ms", outbox_backoff_ms(row->attempts)), LOG_S("error", row->why));
		} else if (row->seq != 0 && row->attempts > 0 && mq_outcome(pub, row->seq) == MQ_OUTCOME_ACKED) {
			LOG(LOG_LEVEL_INFO, "outbox row recovered", LOG_I("id", row->id), LOG_S("message_id", row->mid),
			    LOG_S("exchange", row->exch), LOG_I("failed_attempts", row->attempts));
		}
	}
}

int outbox_relay(struct outbox *ob, struct mq *pub, int limit, struct outbox_round *r)
{
	struct outbox_row *rows = NULL;
	int64_t ids[OUTBOX_BATCH_MAX];
	int n = 0, nids = 0, rc, mqrc = ST_OK;

	memset(r, 0, sizeof *r);
	if (limit > OUTBOX_BATCH_MAX)
		limit = OUTBOX_BATCH_MAX;
	if (limit < 1)
		limit = 1;
	/* A publisher broken earlier would fail the first publish, and that
	 * failure must not be charged to a row. */
	if (mq_broken(pub))
		return ST_ERR_MQ_CONN;
	rc = mq_confirm_select(pub);
	if (rc != ST_OK)
		return rc;
	if (ob->rows == NULL && (ob->rows = malloc(OUTBOX_BATCH_MAX * sizeof *ob->rows)) == NULL)
		return ST_ERR_NOMEM;
	rows = ob->rows;
	memset(rows, 0, (size_t)limit * sizeof *rows);
	/* 1. the claim, committed before anything is published */
	rc = outbox_claim(ob->take_due, ob->conf->outbox_sweep_s, limit < OUTBOX_DUE_MAX ? limit : OUTBOX_DUE_MAX, ids, &nids);
	if (rc == ST_OK && nids < limit)
		rc = outbox_claim(ob->take_new, ob->conf->outbox_sweep_s, limit - nids, ids, &nids);
	if (rc == ST_OK && nids == 0) {
		db_rollback(ob->db);
		goto done;
	}
	/* The budget counts from before the lease: the lease runs from its
	 * UPDATE, so the round ends sooner than it, never later. */
	if (rc == ST_OK && clock_gettime(CLOCK_MONOTONIC, &ob->leased) != 0)
		memset(&ob->leased, 0, sizeof ob->leased); /* over budget at once: one row */
	if (rc == ST_OK)
		rc = outbox_exec_in(ob->lease, ids, nids);
	if (rc == ST_OK)
		rc = db_commit(ob->db);
	if (rc == ST_ERR_DB_DEADLOCK || rc == ST_ERR_DB_LOCK_TIMEOUT) {
		/* Another relay leased some of these rows first (on another
		 * node of a cluster): they are its to publish. */
		db_rollback(ob->db);
		rc = ST_OK;
		goto done;
	}
	if (rc != ST_OK)
		goto rollback;
	/* 2.-4. publish, settle, commit */
	rc = outbox_take(ob, pub, ids, nids, ob->isolate, rows, &n, &mqrc);
	if (rc != ST_OK)
		goto rollback;
	if (mqrc == ST_OK && n > 0) {
		int w = mq_wait_confirms(pub, OUTBOX_CONFIRM_MS);
		if (outbox_broker_error(w))
			mqrc = w;
	}
	rc = outbox_settle(ob, pub, rows, n, ids, nids, r);
	if (rc == ST_OK)
		rc = db_commit(ob->db);
	if (rc != ST_OK)
		goto rollback;
	r->taken = n;
	outbox_log(rows, n, pub);
	goto done;
rollback:
	db_rollback(ob->db);
	memset(r, 0, sizeof *r);
done:
	ob->isolate = mqrc != ST_OK;
	outbox_shrink(&ob->body, &ob->body_cap);
	outbox_shrink(&ob->props, &ob->props_cap);
	outbox_shrink(&ob->headers, &ob->headers_cap);
	return rc != ST_OK ? rc : mqrc;
}

int outbox_stats(struct outbox *ob, int64_t *pending, double *oldest_s)
{
	struct db_col c[2] = { DBC_I64(), DBC_I64() };
	int rc = db_stmt_query(ob->stats, NULL, 0);
	int r;

	if (rc != ST_OK)
		return rc;
	r = db_stmt_fetch(ob->stats, c, ARRAY_LEN(c));
	if (r < 0)
		return r;
	if (r == 1)
		db_stmt_done(ob->stats);
	*pending = c[0].i64;
	*oldest_s = c[1].is_null ? 0 : (double)c[1].i64 / 1e6;
	db_rollback(ob->db);
	return ST_OK;
}
