/*
 * inbox_write.c - the write of the inbox's transaction: the rows its
 * decisions give, each in the section of its statement (ib->w), and those
 * statements with the COMMIT, cut into requests that fit the server
 * (inbox_flush); a verdict carried out into its rows (inbox_act), and the
 * outcome and dead-letter rows.
 *
 * Separate from the batch (inbox.c) because it is the one writer of every
 * kind of row, whoever decided it: each kind is written in one place, its
 * section of inbox_flush, which the release of held events and the
 * janitor's hold expiry use too.  It opens no transaction and ends none:
 * inbox_end (inbox.c) calls inbox_flush to COMMIT.
 */
#include "inbox.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deadletter.h"
#include "effects.h"
#include "inbox_int.h"
#include "outbox.h"
#include "outbox_dispatch.h"
#include "sqlbuf.h"
#include "status.h"
/* A request buffer grown past this (a batch with large held bodies) is
 * given back after the transaction, so one large message does not pin its
 * memory. */
#define INBOX_SQL_KEEP (256u * 1024u)

/* The write's statements: each section of ib->w holds the rows of one
 * multi-row statement (head + rows + tail), or for the outcome and held
 * count updates, whole statements of their own (one row each: a key, or
 * an order, may be written twice in one request, and must end as its last
 * write says). */
static const struct {
	const char *head, *tail;
} inbox_wsql[W_NSECT] = {
	[W_DEL] = { "DELETE FROM held_events WHERE id IN (", ")" },
	[W_HOLD] = { "INSERT INTO held_events (consumer, source, message_id, order_id, type, routing_key, props, body,"
	             " held_at, event, context, lifecycle_version) VALUES ", "" },
	[W_ORDER] = { NULL, NULL }, /* the definition's: ib->sql.agg_head, agg_tail */
	[W_EVENT] = { NULL, "" },   /* ib->sql.event_head */
	[W_OUTBOX] = { OUTBOX_INSERT_HEAD, "" },
	[W_OUTCOME] = { NULL, NULL },
	[W_LOCK] = { NULL, NULL },
	[W_MARK] = { NULL, NULL }, /* whole statements: outbox_dispatcher_write_marks */
};

/* The batch's distinct keys as a condition on processed_messages, one IN
 * list per source (keys are in index order, so a source's keys are
 * together; the range optimiser takes this better than a list of row
 * constructors): ((source = 'a' AND message_id IN (...)) OR (...)); alias
 * ("p." or "") names the table when the statement joins another. */
void inbox_sql_keys(struct inbox *ib, struct sqlbuf *q, const char *alias)
{
	sqlbuf_sql(q, "(");
	for (int k = 0; k < ib->nkeys; k++) {
		const struct msg *m = ib->keymsg[k];

		if (k == 0 || strcmp(ib->keymsg[k - 1]->source, m->source) != 0) {
			sqlbuf_sql(q, k == 0 ? "(" : ")) OR (");
			sqlbuf_sql(q, alias);
			sqlbuf_sql(q, "source = ");
			sqlbuf_str(q, m->source);
			sqlbuf_sql(q, " AND ");
			sqlbuf_sql(q, alias);
			sqlbuf_sql(q, "message_id IN (");
			sqlbuf_list(q);
		}
		sqlbuf_item(q);
		sqlbuf_str(q, m->message_id);
	}
	sqlbuf_sql(q, ")))");
}

/*
 * Galera only, the statement before the COMMIT: fail unless this
 * transaction still holds its claim.  A node that aborts a transaction for
 * another node's write set (a brute-force abort) is known to swallow the
 * error inside stored procedures (mysql-wsrep issue #191: what follows
 * runs in a new transaction, and its COMMIT commits a part); the chaos run
 * on the cluster met it with the procedures of that time, and once more
 * with these requests (one effect missing, one order a version short).
 * If our claim's rows are not all there with our token, the statements so
 * far did not run in the transaction that claimed: the scalar subquery
 * then yields two rows, the server refuses it (1242; DO would only warn)
 * and stops the
 * request before the COMMIT, and inbox_end retries the batch like a
 * deadlock.  No round trip of its own.
 */
static void inbox_claim_guard(struct inbox *ib, struct sqlbuf *q)
{
	sqlbuf_sql(q, "SET @inbox_claim_guard = (SELECT 1 UNION ALL SELECT 2 FROM DUAL WHERE (SELECT COUNT(*)"
	              " FROM processed_messages"
	              " WHERE consumer = ");
	sqlbuf_str(q, ib->conf->consumer);
	sqlbuf_sql(q, " AND claim = ");
	sqlbuf_i64(q, ib->token);
	sqlbuf_sql(q, " AND ");
	inbox_sql_keys(ib, q, "");
	sqlbuf_sql(q, ") <> ");
	sqlbuf_i64(q, ib->nmine);
	sqlbuf_sql(q, ");");
}

/* Send the request in hand (ib->req, SQL text that fits: sqlbuf's
 * ceiling) and start the next; the transaction stays open. */
static int inbox_send(struct inbox *ib)
{
	struct sqlbuf *q = &ib->req;
	int rc = sqlbuf_err(q);

	if (rc == ST_OK && q->len > 0)
		rc = db_multi(ib->db, q->p, q->len, NULL, NULL);
	sqlbuf_reset(q);
	return rc;
}

/*
 * Append section s of the write to the request, as many requests as its
 * rows need: rows (or, for the sections of whole statements, statements)
 * are added while they fit beside what is there, then the request is sent
 * and the rest goes in the next.  Where a cut falls depends only on the
 * rows and the server's limit, never on the wire (db.h).  A row that does
 * not fit an empty request is refused (ST_ERR_DB_DATA, and db_errmsg says
 * so): the start-up check (inbox_limits) keeps that from any body the
 * configuration accepts.  reserve: room kept for what must follow in the
 * last request (the COMMIT).
 */
static int inbox_flush_section(struct inbox *ib, int s, bool commit)
{
	struct sqlbuf *q = &ib->req, *b = &ib->w[s];
	const char *head = s == W_ORDER ? ib->sql.agg_head : s == W_EVENT ? ib->sql.event_head : inbox_wsql[s].head;
	const char *tail = s == W_ORDER ? ib->sql.agg_tail : inbox_wsql[s].tail;
	size_t hlen = head != NULL ? strlen(head) : 0, tlen = tail != NULL ? strlen(tail) + 1 : 0;
	size_t max = sqlbuf_max(q), reserve = commit ? sizeof "COMMIT" : 0;
	bool open = false; /* a statement of this section is open in q */
	int rc = ST_OK;

	if (b->len == 0)
		return ST_OK;
	if (q->len + hlen + b->len + tlen + reserve + 1 < max) {
		/* All of it fits beside what is there (the common case). */
		if (head != NULL)
			sqlbuf_sql(q, head);
		sqlbuf_sqln(q, b->p, b->len);
		if (tail != NULL) {
			sqlbuf_sql(q, tail);
			sqlbuf_sql(q, ";");
		}
		return sqlbuf_err(q);
	}
	for (size_t u = 0; u <= b->ncuts; u++) {
		/* Unit u: from its cut to the next (the first from 0; the
		 * cuts of an empty prefix are skipped). */
		size_t from = u == 0 ? 0 : b->cuts[u - 1];
		size_t to = u < b->ncuts ? b->cuts[u] : b->len;

		if (to <= from)
			continue;
		if (head != NULL && b->p[from] == ',' && !open)
			from++; /* a list's row that starts a statement: no comma */
		if (q->len + (open ? 0 : hlen) + (to - from) + tlen + reserve + 1 >= max && q->len > 0) {
			if (open) {
				sqlbuf_sql(q, tail);
				sqlbuf_sql(q, ";");
			}
			open = false;
			rc = inbox_send(ib);
			if (rc != ST_OK)
				return rc;
			if (head != NULL && b->p[from] == ',')
				from++;
		}
		if (hlen + (to - from) + tlen + reserve + 1 >= max)
			return db_too_large(ib->db, hlen + (to - from) + tlen + reserve);
		if (head != NULL && !open) {
			sqlbuf_sql(q, head);
			open = true;
		}
		sqlbuf_sqln(q, b->p + from, to - from);
	}
	if (open) {
		sqlbuf_sql(q, tail);
		sqlbuf_sql(q, ";");
	}
	return sqlbuf_err(q);
}

/* Write what the transaction decided so far, and COMMIT in the same
 * request when commit is set.  Order rows and held counts go as they stand
 * now: absolute values, so writing an order twice in one transaction is
 * harmless.  With nothing to write, commit alone is one COMMIT. */
int inbox_flush(struct inbox *ib, bool commit)
{
	struct sqlbuf *q = &ib->req;
	bool any = false;
	int rc = ST_OK;

	for (int i = 0; i < ib->norders; i++) {
		struct inbox_agg *r = &ib->orders[i];

		if (r->dirty) {
			struct sqlbuf *o = &ib->w[W_ORDER];

			sqlbuf_row(o);
			sqlbuf_str(o, r->id);
			sqlbuf_str(o, agg_state_name(r->state));
			sqlbuf_i64(o, r->version);
			sqlbuf_i64(o, r->flags);
			if (lc_sequenced(ib->bind->def))
				sqlbuf_i64(o, r->emitted);
			for (int c = 0; c < ib->bind->ncols; c++) {
				sqlbuf_value(o, r->col[c] != 0 ? ib->vals.p + r->col[c] - 1 : "NULL");
				r->col[c] = 0;
			}
			sqlbuf_value(o, ib->sql.version_lit); /* the definition that decided it */
			sqlbuf_value(o, "NOW(6)");
			sqlbuf_value(o, "NOW(6)");
			sqlbuf_row_end(o);
			r->dirty = false;
		}
		if (r->held_dirty) {
			struct sqlbuf *l = &ib->w[W_LOCK];

			sqlbuf_stmt(l);
			sqlbuf_sql(l, ib->sql.held_set);
			sqlbuf_i64(l, r->held);
			sqlbuf_sql(l, ib->sql.held_where);
			sqlbuf_str(l, r->id);
			sqlbuf_sql(l, ";");
			r->held_dirty = false;
		}
	}
	if (commit)
		outbox_dispatcher_write_marks(ib->out, &ib->w[W_MARK]);
	for (int s = 0; s < W_NSECT; s++) {
		if (sqlbuf_err(&ib->w[s]) != ST_OK && rc == ST_OK)
			rc = sqlbuf_err(&ib->w[s]);
		any = any || ib->w[s].len > 0;
	}
	sqlbuf_reset(q);
	for (int s = 0; rc == ST_OK && s < W_NSECT; s++)
		rc = inbox_flush_section(ib, s, commit);
	if (rc == ST_OK && commit) {
		/* The claim guard and the COMMIT go together, after the rows;
		 * when they do not fit beside the last of them, the rows go
		 * first. */
		size_t at = q->len;
		bool guard = ib->galera && ib->nkeys > 0;

		any = any || guard;
		for (int pass = 0; pass < 2; pass++) {
			if (guard)
				inbox_claim_guard(ib, q);
			sqlbuf_sql(q, "COMMIT");
			if (sqlbuf_err(q) == ST_OK || at == 0 || pass > 0)
				break;
			sqlbuf_undo(q, at);
			rc = inbox_send(ib);
			if (rc != ST_OK)
				break;
			at = 0;
		}
	}
	if (rc == ST_OK)
		rc = sqlbuf_err(q);
	if (rc == ST_OK && any)
		rc = inbox_send(ib);
	else if (rc == ST_OK && commit)
		rc = db_commit(ib->db);
	for (int s = 0; s < W_NSECT; s++)
		sqlbuf_reset(&ib->w[s]);
	sqlbuf_reset(&ib->vals); /* every col was written (and cleared) above */
	return rc;
}

void inbox_forget(struct inbox *ib)
{
	for (int s = 0; s < W_NSECT; s++)
		sqlbuf_trim(&ib->w[s], INBOX_SQL_KEEP);
	sqlbuf_trim(&ib->req, INBOX_SQL_KEEP);
	sqlbuf_trim(&ib->vals, INBOX_SQL_KEEP);
	ib->nhrows = 0;
	ib->hlen = 0;
	if (ib->hcap > INBOX_SQL_KEEP) {
		free(ib->hbuf);
		ib->hbuf = NULL;
		ib->hcap = 0;
	}
	ib->norders = 0;
	ib->nkeys = 0;
}

/* "consumer = .. AND source = .. AND message_id = .." for one key of this
 * consumer's, escaped: the predicate of every statement on one inbox row. */
void inbox_sql_key_is(const struct inbox *ib, struct sqlbuf *b, const char *source, const char *message_id)
{
	sqlbuf_sql(b, "consumer = ");
	sqlbuf_str(b, ib->conf->consumer);
	sqlbuf_sql(b, " AND source = ");
	sqlbuf_str(b, source);
	sqlbuf_sql(b, " AND message_id = ");
	sqlbuf_str(b, message_id);
}

/* The final outcome of a key whose claim said 'applied' (or 'held').
 * waited: the event was held (held_at, migration 0012); a row held in an
 * earlier transaction has it already. */
void inbox_w_outcome(struct inbox *ib, const struct inbox_event *ev, const char *outcome,
                     const char *reason, bool waited)
{
	struct sqlbuf *b = &ib->w[W_OUTCOME];

	sqlbuf_stmt(b);
	sqlbuf_sql(b, "UPDATE processed_messages SET outcome = ");
	sqlbuf_str(b, outcome);
	sqlbuf_sql(b, ", reason = ");
	sqlbuf_str(b, reason);
	sqlbuf_sql(b, waited ? ", processed_at = NOW(6), held_at = NOW(6) WHERE "
	                     : ", processed_at = NOW(6) WHERE ");
	inbox_sql_key_is(ib, b, ev->source, ev->message_id);
	sqlbuf_sql(b, ";");
}

/* The dead-letter copy of ev into the outbox (common/outbox.c builds it). */
int inbox_w_dead_letter(struct inbox *ib, const struct inbox_event *ev, const char *reason,
                        const char *detail)
{
	const struct outbox_dead_letter d = {
		.message_id = ev->message_id, .routing_key = ev->routing_key, .type = ev->type_name,
		.order_id = ev->order_id, .props = ev->props, .body = ev->body, .len = ev->len, .reason = reason,
		.detail = detail, .deliveries = ev->deliveries,
	};

	return outbox_row_dead_letter(&ib->w[W_OUTBOX], ib->conf, ib->emit, &d);
}

/* The values ev's sets give their columns, as SQL text kept in ib->vals
 * until the aggregate's row is written (inbox_flush): the event took
 * effect on o. */
static int inbox_set_columns(struct inbox *ib, struct inbox_agg *o, const struct inbox_event *ev)
{
	const struct lc_def *d = ib->bind->def;
	const struct lc_event *e;

	if (ev->msg == NULL || (unsigned)ev->type >= (unsigned)d->nevents)
		return ST_OK;
	e = &d->events[ev->type];
	for (int k = 0; k < e->nsets; k++) {
		const struct msg_val *v = &ev->msg->vals[k];
		size_t at = ib->vals.len;

		if (!v->has || ib->bind->col_of[ev->type][k] < 0) /* absent, or a field of its statements */
			continue;
		if (e->sets[k].src == LC_SRC_APPLIED_AT)
			sqlbuf_sql(&ib->vals, "NOW(6)");
		else if (e->sets[k].type == LC_TYPE_INTEGER)
			sqlbuf_i64(&ib->vals, v->i);
		else
			sqlbuf_strn(&ib->vals, ev->msg->text + v->off, v->len);
		sqlbuf_sqln(&ib->vals, "", 1); /* NUL-terminated: sqlbuf_value reads it */
		if (sqlbuf_err(&ib->vals) != ST_OK)
			return sqlbuf_err(&ib->vals);
		o->col[ib->bind->col_of[ev->type][k]] = (uint32_t)at + 1;
	}
	return ST_OK;
}

/* The definition's own statements for ev's verdict on o, in the
 * transaction: ST_OK, with *refused set when the message's own data was
 * refused (detail says how; nothing of them stays), or the server's code. */
_Static_assert(INBOX_EVENTS_MAX == LC_MAX_EVENTS, "a result counts the statements of every event");
_Static_assert(INBOX_DETAIL_MAX < DEADLETTER_DETAIL_MAX, "a dead letter's header carries the inbox's detail whole");

static int inbox_effects(struct inbox *ib, const struct inbox_agg *o, const struct inbox_event *ev,
                         enum lc_decision decision, struct inbox_result *res, bool *refused, char *detail,
                         size_t cap)
{
	const struct effects_args a = {
		.message_id = ev->message_id, .source = ev->source, .type_name = ev->type_name, .key = ev->order_id,
		.m = ev->msg,
	};
	int ran = 0, rc;

	*refused = false;
	if (ib->fx == NULL)
		return ST_OK;
	if (!ib->fx_careful && effects_bulk(ib->fx)) {
		/* run at the end of the batch, once a statement (inbox_end) */
		rc = effects_defer(ib->fx, (int)ev->type, o->state, decision, &a, &ran);
		if (rc == ST_OK)
			res->stmts_ran[ev->type] = (uint16_t)(res->stmts_ran[ev->type] + ran);
		return rc;
	}
	rc = effects_run(ib->fx, (int)ev->type, o->state, decision, &a, &ran, detail, cap);
	if (rc == ST_ERR_DB_DATA) {
		*refused = true;
		res->stmts_refused[ev->type]++;
		return ST_OK;
	}
	if (rc == ST_OK)
		res->stmts_ran[ev->type] = (uint16_t)(res->stmts_ran[ev->type] + ran);
	return rc;
}

/* The ledger row of ev taking version o->version + 1 (to state next). */
static void inbox_ledger_row(struct inbox *ib, const struct inbox_agg *o, const struct inbox_event *ev,
                             const char *outcome, int next)
{
	struct sqlbuf *e = &ib->w[W_EVENT];

	sqlbuf_row(e);
	sqlbuf_str(e, ev->order_id);
	sqlbuf_str(e, ib->conf->consumer);
	sqlbuf_str(e, ev->source);
	sqlbuf_str(e, ev->message_id);
	sqlbuf_str(e, ev->type_name);
	sqlbuf_str(e, outcome);
	sqlbuf_str(e, o->state == ORDER_NONE ? "None" : agg_state_name(o->state));
	sqlbuf_str(e, agg_state_name(next));
	sqlbuf_i64(e, o->version + 1);
	sqlbuf_value(e, "NOW(6)");
	if (ev->sha[0] != '\0')
		sqlbuf_str(e, ev->sha);
	else
		sqlbuf_value(e, "NULL");
	sqlbuf_row_end(e);
}

struct agg_verdict inbox_seq_verdict(const struct inbox_agg *o, int64_t n, struct agg_verdict v, bool *taken)
{
	*taken = n <= o->version;
	if (n > o->version + 1)
		v.decision = LC_HOLD;
	return v;
}

int inbox_seq_taken(struct inbox *ib, const struct inbox_agg *o, const struct inbox_event *ev, int64_t n,
                    enum inbox_src src, struct inbox_result *res)
{
	const char *reason = msg_reason_name(MSG_REASON_PAYLOAD_CONFLICT);
	char detail[INBOX_DETAIL_MAX];
	int rc;

	/* The payload hash covers the message id, so another id with the
	 * same number is another event: the first one stands. */
	snprintf(detail, sizeof detail, "%s is number %lld of %s %s, which another event took (the %s is at %lld)",
	         ev->type_name, (long long)n, ib->bind->def->aggregate, o->id, ib->bind->def->aggregate,
	         (long long)o->version);
	rc = inbox_w_dead_letter(ib, ev, reason, detail);
	if (rc != ST_OK)
		return rc;
	inbox_w_outcome(ib, ev, "dead_lettered", reason, src == SRC_HELD_MEM);
	res->outbox_rows++;
	if (src == SRC_LIVE) {
		res->reason = MSG_REASON_PAYLOAD_CONFLICT;
		snprintf(res->detail, sizeof res->detail, "%s", detail);
	}
	return ST_OK;
}

/* Carry out a verdict (not LC_HOLD) on a locked order: the definition's
 * statements run, then the order's new state, its ledger row, the outbox
 * rows and the inbox outcome go to the write.  *changed is set when the
 * order changed (held events may now apply); *reason says why the event
 * was dead-lettered instead (MSG_REASON_NONE: it was not), and for the
 * live delivery res->reason and res->detail say it too. */
int inbox_act(struct inbox *ib, struct inbox_agg *o, const struct inbox_event *ev,
              struct agg_verdict v, enum inbox_src src, struct inbox_result *res, bool *changed,
              enum msg_reason *reason)
{
	const struct lc_def *d = ib->bind->def;
	const char *outcome = lc_decision_outcome(v.decision);
	char detail[INBOX_DETAIL_MAX] = "";
	bool refused = false;
	int nrows = 0, rc = ST_OK;

	*changed = false;
	*reason = MSG_REASON_NONE;
	if (v.decision == LC_APPLY || v.decision == LC_COMPENSATE)
		rc = inbox_effects(ib, o, ev, v.decision, res, &refused, detail, sizeof detail);
	if (rc != ST_OK)
		return rc;
	if (refused) {
		*reason = MSG_REASON_EFFECT_FAILED;
		outcome = "dead_lettered";
		rc = inbox_w_dead_letter(ib, ev, msg_reason_name(*reason), detail);
		nrows++;
	} else if (v.decision == LC_APPLY || v.decision == LC_COMPENSATE) {
		/* in the definition's order of emits (OrderPaid, RefundRequested,
		 * InventoryReleaseRequested for orders) */
		for (int i = 0; rc == ST_OK && i < d->nemits; i++) {
			if (v.emits & (1u << i)) {
				rc = outbox_row_event(&ib->w[W_OUTBOX], ib->conf, ib->emit, i, ev->order_id, ev->message_id,
				                      ev->type_name, ev->ctx, lc_sequenced(d) ? o->version + 1 : 0,
				                      lc_sequenced(d) ? ++o->emitted : 0);
				nrows++;
			}
		}
		if (rc == ST_OK)
			rc = inbox_set_columns(ib, o, ev);
		if (rc == ST_OK) {
			inbox_ledger_row(ib, o, ev, outcome, v.next);
			o->version++;
			o->state = v.next;
			o->flags = v.flags;
			o->dirty = true;
			*changed = true;
		}
	} else if (v.decision == LC_IGNORE && lc_sequenced(d)) {
		/* the number is taken all the same: the next one may follow, and
		 * the ledger remembers it (a copy after retention forgot its key
		 * is a duplicate, not a conflict over a taken number) */
		inbox_ledger_row(ib, o, ev, outcome, o->state);
		o->version++;
		o->dirty = true;
		*changed = true;
	} else if (v.decision == LC_INVALID) {
		*reason = MSG_REASON_INVALID_TRANSITION;
		if (lc_sequenced(d))
			snprintf(detail, sizeof detail, "%s (number %lld) not allowed on %s in state %s; the %s waits at "
			         "number %lld for it: later numbers are held until it is replayed or skipped",
			         ev->type_name, (long long)(o->version + 1), ib->bind->def->aggregate,
			         agg_state_name(o->state), ib->bind->def->aggregate, (long long)(o->version + 1));
		else
			snprintf(detail, sizeof detail, "%s not allowed on %s in state %s", ev->type_name, ib->bind->a_name,
			         agg_state_name(o->state));
		rc = inbox_w_dead_letter(ib, ev, msg_reason_name(*reason), detail);
		nrows++;
	}
	/* On an error the rows written so far go with the rolled-back
	 * transaction (inbox_end resets the write).  A live delivery's inbox
	 * row says 'applied' from the claim; any other outcome is written. */
	if (rc == ST_OK && (src != SRC_LIVE || v.decision != LC_APPLY || *reason != MSG_REASON_NONE))
		inbox_w_outcome(ib, ev, outcome,
		                *reason != MSG_REASON_NONE ? msg_reason_name(*reason) : ev->skipped ? "skipped" : NULL,
		                src == SRC_HELD_MEM);
	if (rc != ST_OK)
		return rc;
	if (src == SRC_LIVE && *reason != MSG_REASON_NONE) {
		res->reason = *reason;
		snprintf(res->detail, sizeof res->detail, "%s", detail);
	}
	res->outbox_rows += nrows;
	return ST_OK;
}
