/*
 * outbox.c - see outbox.h.  One relay pass: lock a batch of pending rows,
 * publish them all (pipelined), wait for the confirms, mark them sent,
 * commit.  Holding the row locks across the publish is what keeps a second
 * relay from taking the same rows.
 */
#include "outbox.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "status.h"

#define OUTBOX_BATCH_MAX 64
#define OUTBOX_TEXT_MAX 65536
#define OUTBOX_CONFIRM_MS 10000

struct outbox {
	struct db *db;
	const struct cfg *conf;
	struct db_stmt *take;
	struct db_stmt *mark;
	struct db_stmt *count;
	char *body;
	size_t body_cap;
	char *props;
	char *headers;
};

int outbox_open(struct outbox **out, struct db *db, const struct cfg *conf)
{
	struct outbox *ob = calloc(1, sizeof *ob);
	int rc = ST_ERR_NOMEM;

	*out = NULL;
	if (ob == NULL)
		return ST_ERR_NOMEM;
	ob->db = db;
	ob->conf = conf;
	/* Emitted bodies are small; dead-letter copies are at most max_body. */
	ob->body_cap = (size_t)conf->max_body + 1;
	ob->body = malloc(ob->body_cap);
	ob->props = malloc(OUTBOX_TEXT_MAX);
	ob->headers = malloc(OUTBOX_TEXT_MAX);
	if (ob->body == NULL || ob->props == NULL || ob->headers == NULL)
		goto fail;
	rc = db_prepare(db, &ob->take,
	                "SELECT id, message_id, exchange, routing_key, type, props, headers, body FROM outbox"
	                " WHERE sent_at IS NULL ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED");
	if (rc == ST_OK) {
		/* One statement marks a whole batch: unused places repeat the
		 * first id, which changes nothing. */
		static const char head[] = "UPDATE outbox SET sent_at = NOW(6) WHERE id IN (?";
		char sql[sizeof head + OUTBOX_BATCH_MAX * 3];
		size_t len = sizeof head - 1;

		memcpy(sql, head, len);
		for (int i = 1; i < OUTBOX_BATCH_MAX; i++) {
			memcpy(sql + len, ", ?", 3);
			len += 3;
		}
		sql[len++] = ')';
		sql[len] = '\0';
		rc = db_prepare(db, &ob->mark, sql);
	}
	if (rc == ST_OK)
		rc = db_prepare(db, &ob->count, "SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL");
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
	free(ob);
	*obp = NULL;
}

/* Extra headers are stored as a flat JSON object of strings. */
static int outbox_headers(const char *json, json_t **keep, struct mq_header *h, int cap)
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

int outbox_relay(struct outbox *ob, struct mq *pub, int limit, int *sent)
{
	int64_t ids[OUTBOX_BATCH_MAX];
	int n = 0, rc;
	struct db_param p[1];

	*sent = 0;
	if (limit > OUTBOX_BATCH_MAX)
		limit = OUTBOX_BATCH_MAX;
	p[0] = DBP_I64(limit);
	rc = mq_confirm_select(pub);
	if (rc != ST_OK)
		return rc;
	rc = db_stmt_query(ob->take, p, 1);
	if (rc != ST_OK)
		goto rollback;
	for (;;) {
		char mid[256], exch[256], rk[256], type[65];
		struct db_col c[8] = {
			DBC_I64(), DBC_STR(mid, sizeof mid), DBC_STR(exch, sizeof exch), DBC_STR(rk, sizeof rk),
			DBC_STR(type, sizeof type), DBC_STR(ob->props, OUTBOX_TEXT_MAX),
			DBC_STR(ob->headers, OUTBOX_TEXT_MAX), DBC_BLOB(ob->body, ob->body_cap),
		};
		struct mq_header h[8];
		json_t *keep = NULL;
		struct mq_message m;
		int nh, r;

		r = db_stmt_fetch(ob->take, c, 8);
		if (r < 0) {
			rc = r;
			goto rollback;
		}
		if (r == 0)
			break;
		nh = outbox_headers(c[6].is_null ? NULL : ob->headers, &keep, h, 8);
		if (nh < 0) {
			json_decref(keep);
			LOG(LOG_ERROR, "outbox row has bad headers; left pending", LOG_I("id", c[0].i64));
			continue;
		}
		m = (struct mq_message){
			.exchange = exch, .routing_key = rk, .body = ob->body, .len = c[7].len,
			.props_json = c[5].is_null ? NULL : ob->props, .message_id = mid, .type = type,
			.headers = h, .nheaders = nh,
			/* A dead-letter copy must land in its queue; an emitted
			 * event is pub/sub and may have no subscriber yet. */
			.mandatory = strcmp(exch, ob->conf->dlx) == 0,
		};
		rc = mq_publish(pub, &m);
		json_decref(keep);
		if (rc != ST_OK)
			goto rollback;
		ids[n++] = c[0].i64;
	}
	if (n == 0) {
		db_rollback(ob->db);
		return ST_OK;
	}
	rc = mq_wait_confirms(pub, OUTBOX_CONFIRM_MS);
	if (rc != ST_OK)
		goto rollback;
	{
		struct db_param mp[OUTBOX_BATCH_MAX];
		for (int i = 0; i < OUTBOX_BATCH_MAX; i++)
			mp[i] = DBP_I64(ids[i < n ? i : 0]);
		rc = db_stmt_exec(ob->mark, mp, OUTBOX_BATCH_MAX, NULL);
		if (rc != ST_OK)
			goto rollback;
	}
	rc = db_commit(ob->db);
	if (rc != ST_OK)
		goto rollback;
	*sent = n;
	return ST_OK;
rollback:
	db_rollback(ob->db);
	return rc;
}

int outbox_pending(struct outbox *ob, int64_t *n)
{
	struct db_col c[1] = { DBC_I64() };
	int rc = db_stmt_query(ob->count, NULL, 0);
	int r;

	if (rc != ST_OK)
		return rc;
	r = db_stmt_fetch(ob->count, c, 1);
	if (r < 0)
		return r;
	if (r == 1)
		db_stmt_done(ob->count);
	*n = c[0].i64;
	db_rollback(ob->db);
	return ST_OK;
}
