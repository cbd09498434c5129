/*
 * dlq_judge.c - a dead letter judged against the database (see
 * dlq_judge.h): the inbox row, the ledger for a key retention forgot, and
 * the aggregate's row under the bound definition.
 */
#include "dlq_judge.h"

#include <stdio.h>
#include <string.h>

#include "array.h"
#include "lifecycle.h"
#include "lifecycle_schema.h"
#include "log.h"
#include "status.h"

static const char *const dlq_judge_verdict_names[] = {
	"replay", "duplicate", "reopen", "still-malformed", "payload-conflict", "prerequisite-missing",
	"invalid-transition",
};
_Static_assert(ARRAY_LEN(dlq_judge_verdict_names) == DLQ_JUDGE_COUNT, "one name per enum dlq_judge_verdict");

const char *dlq_judge_verdict_name(enum dlq_judge_verdict v)
{
	return (unsigned)v < DLQ_JUDGE_COUNT ? dlq_judge_verdict_names[v] : "?";
}

static int dlq_judge_sql_ledger(char *sql, size_t cap)
{
	const struct lc_def *d = agg_current()->def;
	char tb[LC_SCHEMA_TABLES][LC_NAME_MAX + 16];
	int n;

	lc_schema_tables(d, tb);
	n = snprintf(sql, cap,
	             "SELECT `%s`, type, COALESCE(payload_sha256, ''), CAST(applied_at AS CHAR)"
	             " FROM `%s` WHERE consumer = ? AND source = ? AND message_id = ?",
	             d->key, tb[1]);

	return n > 0 && (size_t)n < cap ? ST_OK : ST_ERR_INVALID;
}

static int dlq_judge_sql_row(char *sql, size_t cap)
{
	const struct agg_binding *b = agg_current();
	size_t len;
	int n = snprintf(sql, cap, "SELECT status, version, flags");

	for (int c = 0; n > 0 && (size_t)n < cap && c < b->ncols; c++) {
		len = (size_t)n;
		n += snprintf(sql + len, cap - len, ", LEFT(CAST(`%s` AS CHAR), %d)", b->cols[c], DLQ_JUDGE_COL_CHARS);
	}
	if (n > 0 && (size_t)n < cap) {
		len = (size_t)n;
		n += snprintf(sql + len, cap - len, " FROM `%s` WHERE id = ?", b->def->table);
	}
	return n > 0 && (size_t)n < cap ? ST_OK : ST_ERR_INVALID;
}

int dlq_judge_open(struct dlq_judge *j, const struct cfg *conf)
{
	char sql[4096];
	int rc;

	memset(j, 0, sizeof *j);
	j->conf = conf;
	rc = db_open(&j->db, &j->conf->db);
	if (rc == ST_OK)
		rc = db_prepare(j->db, &j->q_inbox,
		                "SELECT outcome, COALESCE(reason, ''), payload_sha256, CAST(processed_at AS CHAR)"
		                " FROM processed_messages WHERE consumer = ? AND source = ? AND message_id = ?");
	/* The ledger outlives the inbox rows (retention cleans only those):
	 * a key without an inbox row whose effect is here was forgotten, not
	 * never seen (dlq_judge_ledger). */
	/* The ledger and the row of the lifecycle the worker runs (the bound
	 * definition's names, validated by lc_load, backtick-quoted): for
	 * the order definition, order_events and orders. */
	if (rc == ST_OK)
		rc = dlq_judge_sql_ledger(sql, sizeof sql);
	if (rc == ST_OK)
		rc = db_prepare(j->db, &j->q_ledger, sql);
	if (rc == ST_OK)
		rc = dlq_judge_sql_row(sql, sizeof sql);
	if (rc == ST_OK)
		rc = db_prepare(j->db, &j->q_order, sql);
	/* Only a key the inbox dead-lettered with this very payload: a key
	 * that was claimed again meanwhile (applied, held) is left alone. */
	if (rc == ST_OK)
		rc = db_prepare(j->db, &j->q_reopen,
		                "DELETE FROM processed_messages WHERE consumer = ? AND source = ? AND message_id = ?"
		                " AND payload_sha256 = ? AND outcome = 'dead_lettered'");
	if (rc != ST_OK)
		LOG(LOG_LEVEL_ERROR, "database unavailable", LOG_S("db", j->conf->db.redacted),
		    LOG_S("error", j->db != NULL ? db_errmsg(j->db) : st_strerror(rc)));
	return rc;
}

int dlq_judge_inbox_lookup(struct dlq_judge *j, const struct msg *m, struct dlq_judge_inbox_row *row)
{
	struct db_param p[] = { DBP_STR(j->conf->consumer), DBP_STR(m->source), DBP_STR(m->message_id) };
	struct db_col c[] = { DBC_STR(row->outcome, sizeof row->outcome), DBC_STR(row->reason, sizeof row->reason),
		              DBC_STR(row->sha, sizeof row->sha), DBC_STR(row->at, sizeof row->at) };
	int got;

	memset(row, 0, sizeof *row);
	got = db_stmt_query_row(j->q_inbox, p, ARRAY_LEN(p), c, ARRAY_LEN(c));
	if (got < 0)
		return got;
	row->found = got == 1;
	return db_commit(j->db);
}

int dlq_judge_order_lookup(struct dlq_judge *j, const char *order_id, struct dlq_judge_order_row *row)
{
	const struct agg_binding *b = agg_current();
	struct db_param p[] = { DBP_STR(order_id) };
	struct db_col c[3 + AGG_COLS_MAX] = { DBC_STR(row->status, sizeof row->status), DBC_I64(), DBC_I64() };
	int got;

	memset(row, 0, sizeof *row);
	for (int k = 0; k < b->ncols; k++) {
		struct db_col text = DBC_STR(row->col[k], sizeof row->col[k]);

		c[3 + k] = text;
	}
	got = db_stmt_query_row(j->q_order, p, ARRAY_LEN(p), c, (size_t)(3 + b->ncols));
	if (got < 0)
		return got;
	if (got == 1) {
		row->found = true;
		row->version = c[1].i64;
		row->flags = c[2].i64;
		for (int k = 0; k < b->ncols; k++)
			row->col_null[k] = c[3 + k].is_null;
	}
	return db_commit(j->db);
}

/* A key the inbox has no row for: the verdict of its ledger row, as the
 * worker's claim judges a forgotten key (common/inbox.c, inbox_known): the
 * same payload (or, on a row written before migration 0015, without a
 * hash, the same order and type) is a duplicate, any other a conflict.
 * *found false: the ledger does not know it either. */
static int dlq_judge_ledger(struct dlq_judge *j, const struct dlq_entry *e, const char *sha, bool *found,
                           enum dlq_judge_verdict *v, char *why, size_t cap)
{
	struct db_param p[] = { DBP_STR(j->conf->consumer), DBP_STR(e->m.source), DBP_STR(e->m.message_id) };
	char order_id[MSG_ORDER_ID_MAX + 1], type[MSG_TYPE_NAME_MAX + 1], hash[65], at[40];
	struct db_col c[] = { DBC_STR(order_id, sizeof order_id), DBC_STR(type, sizeof type), DBC_STR(hash, sizeof hash),
		              DBC_STR(at, sizeof at) };
	bool same;
	int got = db_stmt_query_row(j->q_ledger, p, ARRAY_LEN(p), c, ARRAY_LEN(c));

	if (got < 0)
		return got;
	*found = got == 1;
	if (*found) {
		same = hash[0] != '\0' ? strcmp(hash, sha) == 0
		                       : strcmp(order_id, e->m.order_id) == 0 && strcmp(type, e->m.type_name) == 0;
		*v = same ? DLQ_JUDGE_DUPLICATE : DLQ_JUDGE_CONFLICT;
		if (same)
			snprintf(why, cap, "the inbox row is gone (retention), but the ledger holds this message's effect"
			         " (%s on order %s at %s): the copy is a duplicate, no effect", type, order_id, at);
		else
			snprintf(why, cap, "the inbox row is gone (retention), but the ledger holds another payload's effect"
			         " for this key (%s on order %s at %s): the first one stands; replaying would only"
			         " dead-letter it again", type, order_id, at);
	}
	return db_commit(j->db);
}

int dlq_judge_entry(struct dlq_judge *j, const struct dlq_entry *e, enum dlq_judge_verdict *v, char *why,
                    size_t cap)
{
	struct dlq_judge_inbox_row in;
	struct dlq_judge_order_row ord;
	char sha[65];
	int rc;

	if (e->parse != MSG_REASON_NONE) {
		*v = DLQ_JUDGE_MALFORMED;
		snprintf(why, cap, "the body still fails the checks: %s: %s", msg_reason_name(e->parse), e->m.detail);
		return ST_OK;
	}
	rc = dlq_judge_inbox_lookup(j, &e->m, &in);
	if (rc != ST_OK)
		return rc;
	msg_sha256_hex(e->m.sha256, sha);
	if (!in.found) {
		bool known;

		rc = dlq_judge_ledger(j, e, sha, &known, v, why, cap);
		if (rc != ST_OK || known)
			return rc;
		*v = DLQ_JUDGE_REPLAY;
		snprintf(why, cap, "the inbox has no record of it");
		return ST_OK;
	}
	if (strcmp(in.sha, sha) != 0) {
		*v = DLQ_JUDGE_CONFLICT;
		snprintf(why, cap, "the inbox holds another payload for this key (outcome %s, sha256 %.12s...): the"
		         " first one stands; replaying would only dead-letter it again", in.outcome, in.sha);
		return ST_OK;
	}
	if (strcmp(in.outcome, "dead_lettered") != 0) {
		*v = DLQ_JUDGE_DUPLICATE;
		snprintf(why, cap, "the inbox recorded this payload already (outcome %s): the copy is a duplicate,"
		         " no effect", in.outcome);
		return ST_OK;
	}
	/* The inbox dead-lettered this very payload (hold-expired,
	 * invalid-transition): only worth replaying if the order now lets
	 * it take effect. */
	rc = dlq_judge_order_lookup(j, e->m.order_id, &ord);
	if (rc != ST_OK)
		return rc;
	{
		int st = ord.found ? agg_state_from_name(ord.status) : ORDER_NONE;
		struct agg_verdict ov = agg_decide(st < 0 ? ORDER_NONE : st,
		                                       (unsigned)ord.flags, e->m.type);
		const char *now = ord.found ? ord.status : "absent";

		const char *agg = agg_current()->def->aggregate;

		/* A numbered definition decides by the number first, as the
		 * worker does (inbox_seq_verdict). */
		if (lc_sequenced(agg_current()->def) && e->m.seq <= ord.version) {
			*v = DLQ_JUDGE_CONFLICT;
			snprintf(why, cap, "number %lld was taken by another event since (%s %s is at %lld)",
			         (long long)e->m.seq, agg, e->m.order_id, (long long)ord.version);
		} else if (lc_sequenced(agg_current()->def) && e->m.seq > ord.version + 1) {
			*v = DLQ_JUDGE_WAITING;
			snprintf(why, cap, "number %lld waits for number %lld (%s %s is at %lld): it would be held again",
			         (long long)e->m.seq, (long long)(ord.version + 1), agg, e->m.order_id,
			         (long long)ord.version);
		} else if (ov.decision == LC_HOLD) {
			*v = DLQ_JUDGE_WAITING;
			snprintf(why, cap, "its prerequisite is still missing (%s %s: %s): it would be held again", agg,
			         e->m.order_id, now);
		} else if (ov.decision == LC_INVALID) {
			*v = DLQ_JUDGE_INVALID;
			snprintf(why, cap, "still an impossible transition (%s %s: %s)", agg, e->m.order_id, now);
		} else {
			*v = DLQ_JUDGE_REOPEN;
			snprintf(why, cap, "the inbox dead-lettered it (%s); %s %s is %s now: the key is reopened"
			         " and the event %s%s", in.reason, agg, e->m.order_id, now, lc_decision_outcome(ov.decision),
			         strcmp(in.reason, "effect-failed") == 0
			             ? "; its statements run again, and are refused again unless what they"
			               " need has changed (see the detail)"
			             : "");
		}
	}
	return ST_OK;
}

/* Only a key the inbox dead-lettered with this very payload (q_reopen). */
int dlq_judge_reopen(struct dlq_judge *j, const struct dlq_entry *e)
{
	char sha[65];
	uint64_t reopened = 0;
	int rc;

	msg_sha256_hex(e->m.sha256, sha);
	struct db_param p[] = { DBP_STR(j->conf->consumer), DBP_STR(e->m.source), DBP_STR(e->m.message_id),
		                DBP_STR(sha) };
	rc = db_stmt_exec(j->q_reopen, p, ARRAY_LEN(p), &reopened);
	/* 0: claimed again since the judgement (a concurrent replay): the
	 * copy is then a duplicate, still safe. */
	if (rc == ST_OK && reopened == 0)
		LOG(LOG_LEVEL_INFO, "the key was claimed again meanwhile; the copy will be a duplicate",
		    LOG_S("msg", e->m.message_id));
	if (rc == ST_OK)
		rc = db_commit(j->db);
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_ERROR, "cannot reopen the key; the dead letter stays", LOG_S("msg", e->message_id),
		    LOG_S("error", db_errmsg(j->db)));
		db_rollback(j->db);
	}
	return rc;
}

const char *dlq_judge_errmsg(const struct dlq_judge *j)
{
	return j->db != NULL ? db_errmsg(j->db) : "no database";
}

void dlq_judge_close(struct dlq_judge *j)
{
	/* The statements are the connection's (db_prepare). */
	db_close(&j->db);
	j->q_inbox = j->q_order = j->q_reopen = j->q_ledger = NULL;
}
