/*
 * inbox.c - the transaction at the heart of the worker.
 *
 * Order of statements, and why:
 *   1. INSERT the key into processed_messages (the claim).  A duplicate
 *      fails here with 1062 before anything else is touched; the stored hash
 *      then tells a duplicate from a conflict.
 *   2. Lock the order's order_locks row (creating it for a new order) and
 *      read the order.
 *   Steps 1 and 2 run server-side in one CALL (inbox_claim, migrations
 *   0003/0004): round trips on loopback are what a message costs.
 *   3. Decide with order_decide and carry the verdict out: order row,
 *      ledger row, outbox row and inbox outcome in one CALL (inbox_settle,
 *      0004), or a held row.
 *   4. If the order changed and it has held events, re-evaluate them, all
 *      of them a page at a time by id, in passes until a pass changes the
 *      order no more.  A held event that can now take effect is read back
 *      whole and parsed again (msg_parse), so it takes effect with every
 *      field of its data exactly as it would have arriving in order.
 *   5. COMMIT.  The caller acks only after this returns ST_OK.  A message
 *      alone in its transaction commits inside the CALL of step 3 (and a
 *      lone duplicate rolls back inside step 1): two round trips a message.
 * Autocommit is off, so statement 1 opens the transaction.
 */
#include "inbox.h"

#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fault.h"
#include "log.h"
#include "mq.h"
#include "status.h"

/* The widths of the columns a held event is kept in (migrations/0002):
 * what a stored row may hold, whatever INBOX_MAX_BODY says today — it may
 * have been larger when the event was held. */
#define INBOX_BODY_COLUMN_MAX 16777215u /* MEDIUMBLOB */
#define INBOX_PROPS_COLUMN_MAX 65535u   /* TEXT */
/* Held events listed per round trip while releasing. */
#define INBOX_RELEASE_PAGE 64
/* processed_messages.published_at is filled with FROM_UNIXTIME, whose range
 * ends at 2038-01-19 on MariaDB 10.11; strict mode refuses a row past it.
 * The header only measures latency, so a value out of range is dropped
 * instead of costing the message anything. */
#define INBOX_PUBLISHED_US_MAX (INT64_C(2147483647) * 1000000)

struct inbox {
	struct db *db;
	const struct cfg *conf;
	struct db_stmt *claim_lock;
	struct db_stmt *settle;
	struct db_stmt *set_outcome;
	struct db_stmt *lock_read;
	struct db_stmt *lock_create;
	struct db_stmt *outbox_add;
	struct db_stmt *hold_add;
	struct db_stmt *held_count;
	struct db_stmt *held_list;
	struct db_stmt *held_get;
	struct db_stmt *held_del;
	struct db_stmt *expired_list;
	/* A held event read back: grown by db_stmt_fetch (DBC_GROW) to fit
	 * the stored row, reused, and shrunk again after an oversized one. */
	char *body;
	size_t body_cap;
	char *props;
	size_t props_cap;
};

/* The order as read under its lock. */
struct inbox_order {
	enum order_state state;
	unsigned flags;
	int64_t version;
	int64_t held;
};

/* One event as the transaction sees it: the live delivery or a held row. */
struct inbox_event {
	const char *source;
	const char *message_id;
	const char *type_name;
	enum msg_type type;
	const char *order_id;
	const void *body;
	size_t len;
	const char *routing_key;
	const char *props;        /* JSON or NULL */
	int64_t amount_cents;
	bool has_amount;
};

/* The event from a parsed message: the one place that says which fields of
 * a message reach the database, for a live delivery and a released held
 * event alike, so that a held event takes effect as it would have live. */
static void inbox_event_from_msg(struct inbox_event *ev, const struct msg *m, const void *body, size_t len,
                                 const char *routing_key, const char *props)
{
	*ev = (struct inbox_event){
		.source = m->source, .message_id = m->message_id, .type_name = m->type_name, .type = m->type,
		.order_id = m->order_id, .body = body, .len = len, .routing_key = routing_key, .props = props,
		.amount_cents = m->amount_cents, .has_amount = m->type == MSG_PAYMENT_AUTHORIZED,
	};
}

static const char *const inbox_outcome_names[] = {
	[INBOX_APPLIED] = "applied",         [INBOX_HELD] = "held",
	[INBOX_IGNORED] = "ignored",         [INBOX_COMPENSATED] = "compensated",
	[INBOX_DEAD_LETTERED] = "dead_lettered", [INBOX_DUPLICATE] = "duplicate",
	[INBOX_CONFLICT] = "payload-conflict",
};

const char *inbox_outcome_name(enum inbox_outcome o)
{
	return (unsigned)o < sizeof inbox_outcome_names / sizeof inbox_outcome_names[0]
	           ? inbox_outcome_names[o]
	           : "unknown";
}

int inbox_open(struct inbox **out, struct db *db, const struct cfg *conf)
{
	struct inbox *ib = calloc(1, sizeof *ib);
	int rc = ST_OK;

	*out = NULL;
	if (ib == NULL)
		return ST_ERR_NOMEM;
	ib->db = db;
	ib->conf = conf;
#define PREP(field, sql)                                        \
	do {                                                    \
		rc = db_prepare(db, &ib->field, sql);           \
		if (rc != ST_OK)                                \
			goto fail;                              \
	} while (0)
	/* migrations/0003_claim_procedure.sql: the claim, the duplicate's
	 * stored hash or the order lock, in one round trip. */
	PREP(claim_lock, "CALL inbox_claim(?, ?, ?, ?, ?, ?, ?, ?)");
	/* 0004: order row, ledger row, one outbox row, outcome, COMMIT. */
	PREP(settle, "CALL inbox_settle(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
	PREP(set_outcome, "UPDATE processed_messages SET outcome = ?, reason = ?, processed_at = NOW(6)"
	                  " WHERE consumer = ? AND source = ? AND message_id = ?");
	PREP(lock_read, "SELECT l.held, o.status, o.version, o.flags FROM order_locks l"
	                " LEFT JOIN orders o ON o.id = l.order_id WHERE l.order_id = ? FOR UPDATE");
	PREP(lock_create, "INSERT INTO order_locks (order_id, held) VALUES (?, 0)");
	PREP(outbox_add, "INSERT INTO outbox (message_id, exchange, routing_key, type, order_id, props,"
	                 " headers, body, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NOW(6))");
	PREP(hold_add, "INSERT INTO held_events (consumer, source, message_id, order_id, type, routing_key,"
	               " props, body, held_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NOW(6))");
	PREP(held_count, "UPDATE order_locks SET held = held + ? WHERE order_id = ?");
	/* A page of the order's held events after a given id
	 * (ix_held_events_order). */
	PREP(held_list, "SELECT id, source, message_id, type FROM held_events WHERE order_id = ? AND consumer = ?"
	                " AND id > ? ORDER BY id LIMIT ?");
	PREP(held_get, "SELECT source, message_id, type, routing_key, props, body FROM held_events"
	               " WHERE id = ? AND consumer = ?");
	PREP(held_del, "DELETE FROM held_events WHERE id = ?");
	PREP(expired_list, "SELECT id, order_id FROM held_events WHERE consumer = ?"
	                   " AND held_at < NOW(6) - INTERVAL ? SECOND ORDER BY id LIMIT ?");
#undef PREP
	*out = ib;
	return ST_OK;
fail:
	inbox_close(&ib);
	return rc;
}

void inbox_close(struct inbox **ibp)
{
	struct inbox *ib;

	if (ibp == NULL || *ibp == NULL)
		return;
	ib = *ibp;
	/* Statements belong to the db and die with it. */
	free(ib->body);
	free(ib->props);
	free(ib);
	*ibp = NULL;
}

/* Fill o from a locked read: held count, and status/version/flags of the
 * order row (status NULL: the order does not exist yet). */
static int inbox_order_from_row(struct inbox_order *o, const struct db_col *held, const struct db_col *status,
                                const struct db_col *version, const struct db_col *flags)
{
	int st;

	o->held = held->i64;
	if (status->is_null) {
		o->state = ORDER_NONE;
		o->version = 0;
		o->flags = 0;
		return ST_OK;
	}
	st = order_state_from_name(status->buf);
	if (st < 0)
		return ST_ERR_DB;
	o->state = (enum order_state)st;
	o->version = version->i64;
	o->flags = (unsigned)flags->i64;
	return ST_OK;
}

/* Lock the order (creating its lock row on first sight) and read it. */
static int inbox_lock_order(struct inbox *ib, const char *order_id, struct inbox_order *o)
{
	char status[32];
	struct db_col c[4];
	struct db_param p[1] = { DBP_STR(order_id) };
	int rc, r;

	for (int attempt = 0; attempt < 2; attempt++) {
		c[0] = DBC_I64();
		c[1] = DBC_STR(status, sizeof status);
		c[2] = DBC_I64();
		c[3] = DBC_I64();
		rc = db_stmt_query(ib->lock_read, p, 1);
		if (rc != ST_OK)
			return rc;
		r = db_stmt_fetch(ib->lock_read, c, 4);
		if (r < 0)
			return r;
		if (r == 1) {
			db_stmt_done(ib->lock_read);
			return inbox_order_from_row(o, &c[0], &c[1], &c[2], &c[3]);
		}
		/* First event of this order.  A concurrent first event makes our
		 * INSERT wait for its commit and fail with 1062; then the
		 * locking read above finds the row. */
		rc = db_stmt_exec(ib->lock_create, p, 1, NULL);
		if (rc == ST_OK) {
			o->held = 0;
			o->state = ORDER_NONE;
			o->version = 0;
			o->flags = 0;
			return ST_OK;
		}
		if (rc != ST_ERR_DB_DUPLICATE)
			return rc;
	}
	return ST_ERR_DB_DEADLOCK; /* the row vanished twice: let the caller retry */
}

static int inbox_set_outcome(struct inbox *ib, const char *source, const char *message_id,
                             const char *outcome, const char *reason)
{
	struct db_param p[5] = {
		DBP_STR(outcome), reason ? DBP_STR(reason) : DBP_NULL(), DBP_STR(ib->conf->consumer),
		DBP_STR(source), DBP_STR(message_id),
	};
	return db_stmt_exec(ib->set_outcome, p, 5, NULL);
}

static int inbox_outbox(struct inbox *ib, const char *message_id, const char *exchange, const char *rk,
                        const char *type, const char *order_id, const char *props, const char *headers,
                        const void *body, size_t len)
{
	struct db_param p[8] = {
		DBP_STR(message_id), DBP_STR(exchange), DBP_STR(rk), DBP_STR(type), DBP_STR(order_id),
		props ? DBP_STR(props) : DBP_NULL(), headers ? DBP_STR(headers) : DBP_NULL(),
		DBP_BLOB(body, len),
	};
	return db_stmt_exec(ib->outbox_add, p, 8, NULL);
}

/* One outbox row as it is about to be written. */
struct inbox_outrow {
	char id[MSG_ID_MAX + 1];
	char rk[256];
	const char *exchange;
	const char *type;
	const char *props;   /* JSON or NULL */
	char *headers;       /* malloc'd JSON or NULL */
	char *body;          /* malloc'd, or borrowed when body_owned is false */
	size_t len;
	bool body_owned;
};

static void inbox_outrow_free(struct inbox_outrow *r)
{
	free(r->headers);
	if (r->body_owned)
		free(r->body);
	r->headers = NULL;
	r->body = NULL;
}

/* An emitted event in SPEC's envelope; its id is stable per order and type
 * so that a re-publish after a crash is recognisable downstream. */
static int inbox_emit_row(struct inbox *ib, const char *type, const struct inbox_event *cause,
                          struct inbox_outrow *r)
{
	json_t *o = NULL;
	char ts[32];
	time_t now = time(NULL);
	struct tm tm;
	int rc = ST_ERR_NOMEM;

	memset(r, 0, sizeof *r);
	snprintf(r->id, sizeof r->id, "%s:%s", type, cause->order_id);
	snprintf(r->rk, sizeof r->rk, "order.%s", type);
	r->exchange = ib->conf->out_exchange;
	r->type = type;
	r->body_owned = true;
	/* occurred_at: the time of the emission, RFC 3339 UTC. */
	if (gmtime_r(&now, &tm) == NULL || strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
		return ST_ERR_INVALID;
	o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:{s:s, s:s}}", "message_id", r->id, "source", ib->conf->consumer,
	              "type", type, "order_id", cause->order_id, "occurred_at", ts, "data", "cause_message_id",
	              cause->message_id, "cause_type", cause->type_name);
	if (o == NULL)
		goto cleanup;
	r->body = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
	if (r->body == NULL)
		goto cleanup;
	r->len = strlen(r->body);
	rc = ST_OK;
cleanup:
	json_decref(o);
	return rc;
}

/* The dead-letter copy of an event whose transition is impossible (or whose
 * hold expired): original body and properties, plus our reason headers. */
static int inbox_dead_letter_row(struct inbox *ib, const struct inbox_event *ev, const char *reason,
                                 const char *detail, struct inbox_outrow *r)
{
	char note[400], full[640];
	json_t *h;

	/* What the saved properties had to escape or drop, said where the
	 * DLQ reader looks (mq.c keeps the note ASCII). */
	mq_props_json_note(ev->props, note, sizeof note);
	snprintf(full, sizeof full, "%s%s%s", detail, note[0] ? "; properties: " : "", note);
	h = json_pack("{s:s, s:s}", "x-inbox-reason", reason, "x-inbox-detail", full);

	memset(r, 0, sizeof *r);
	snprintf(r->id, sizeof r->id, "%s", ev->message_id);
	snprintf(r->rk, sizeof r->rk, "%s", ev->routing_key);
	r->exchange = ib->conf->dlx;
	r->type = ev->type_name;
	r->props = ev->props;
	r->body = (char *)ev->body;
	r->len = ev->len;
	r->headers = h != NULL ? json_dumps(h, JSON_COMPACT) : NULL;
	json_decref(h);
	return r->headers != NULL ? ST_OK : ST_ERR_NOMEM;
}

static int inbox_outrow_insert(struct inbox *ib, const struct inbox_outrow *r, const char *order_id)
{
	return inbox_outbox(ib, r->id, r->exchange, r->rk, r->type, order_id, r->props, r->headers, r->body, r->len);
}

/* Everything one inbox_settle call writes (migrations/0004). */
struct inbox_write {
	enum { INBOX_ORDER_KEEP = 0, INBOX_ORDER_CREATE = 1, INBOX_ORDER_UPDATE = 2 } order_op;
	const char *status;    /* the order's new state; ledger to_status */
	const char *from;      /* ledger from_status */
	unsigned flags;
	bool paid_now;
	int64_t version;       /* the ledger row's version */
	bool set_outcome;      /* record outcome/reason on the inbox row */
	const char *outcome;
	const char *reason;
	const struct inbox_outrow *out; /* NULL: no outbox row */
	bool commit;
};

static int inbox_settle(struct inbox *ib, const struct inbox_event *ev, const struct inbox_write *w)
{
	const struct inbox_outrow *r = w->out;
	struct db_param p[23] = {
		DBP_STR(ib->conf->consumer), DBP_STR(ev->source), DBP_STR(ev->message_id), DBP_STR(ev->type_name),
		DBP_STR(ev->order_id), DBP_I64(w->order_op),
		w->status ? DBP_STR(w->status) : DBP_NULL(), DBP_I64(w->flags), DBP_I64(w->paid_now ? 1 : 0),
		ev->has_amount ? DBP_I64(ev->amount_cents) : DBP_NULL(),
		w->from ? DBP_STR(w->from) : DBP_NULL(), DBP_I64(w->version), DBP_I64(w->set_outcome ? 1 : 0),
		DBP_STR(w->outcome), w->reason ? DBP_STR(w->reason) : DBP_NULL(),
		r ? DBP_STR(r->id) : DBP_NULL(), r ? DBP_STR(r->exchange) : DBP_NULL(),
		r ? DBP_STR(r->rk) : DBP_NULL(), r ? DBP_STR(r->type) : DBP_NULL(),
		r && r->props ? DBP_STR(r->props) : DBP_NULL(), r && r->headers ? DBP_STR(r->headers) : DBP_NULL(),
		r ? DBP_BLOB(r->body, r->len) : DBP_NULL(), DBP_I64(w->commit ? 1 : 0),
	};
	return db_stmt_exec(ib->settle, p, 23, NULL);
}

static const char *inbox_reason_of(enum order_decision d)
{
	return d == ORDER_INVALID ? "invalid-transition" : NULL;
}

/* Carry out a verdict (not ORDER_HOLD) on a locked order in one
 * inbox_settle call, plus a plain INSERT for each outbox row past the
 * first.  held_row: the event comes from held_events (its inbox row says
 * 'held' and must get the final outcome).  commit: end the transaction in
 * the same call.  *changed is set when the order row changed (held events
 * may now apply). */
static int inbox_act(struct inbox *ib, struct inbox_order *o, const struct inbox_event *ev,
                     struct order_verdict v, bool held_row, bool commit, struct inbox_result *res, bool *changed)
{
	static const struct {
		unsigned bit;
		const char *type;
	} emits[] = {
		{ ORDER_EMIT_PAID, "OrderPaid" },
		{ ORDER_EMIT_REFUND, "RefundRequested" },
		{ ORDER_EMIT_RELEASE, "InventoryReleaseRequested" },
	};
	struct inbox_outrow rows[3];
	struct inbox_write w = {
		.set_outcome = held_row || v.decision != ORDER_APPLY,
		.outcome = order_decision_outcome(v.decision),
		.reason = inbox_reason_of(v.decision),
		.commit = commit,
	};
	int nrows = 0, rc = ST_OK;

	*changed = false;
	if (v.decision == ORDER_APPLY || v.decision == ORDER_COMPENSATE) {
		w.order_op = o->state == ORDER_NONE ? INBOX_ORDER_CREATE : INBOX_ORDER_UPDATE;
		w.from = o->state == ORDER_NONE ? "None" : order_state_name(o->state);
		w.status = order_state_name(v.next);
		w.flags = v.flags;
		w.paid_now = (v.flags & ORDER_FLAG_PAID) && !(o->flags & ORDER_FLAG_PAID);
		w.version = o->version + 1;
		for (size_t i = 0; rc == ST_OK && i < sizeof emits / sizeof emits[0]; i++)
			if (v.emits & emits[i].bit)
				rc = inbox_emit_row(ib, emits[i].type, ev, &rows[nrows++]);
	} else if (v.decision == ORDER_INVALID) {
		char detail[160];
		snprintf(detail, sizeof detail, "%s not allowed on an order in state %s", ev->type_name,
		         order_state_name(o->state));
		rc = inbox_dead_letter_row(ib, ev, "invalid-transition", detail, &rows[nrows++]);
	}
	/* Every row but the last is a plain INSERT before the CALL, which
	 * writes the last one: the outbox keeps their order. */
	for (int i = 0; rc == ST_OK && i < nrows - 1; i++)
		rc = inbox_outrow_insert(ib, &rows[i], ev->order_id);
	w.out = nrows > 0 ? &rows[nrows - 1] : NULL;
	if (rc == ST_OK)
		rc = inbox_settle(ib, ev, &w);
	for (int i = 0; i < nrows; i++)
		inbox_outrow_free(&rows[i]);
	if (rc != ST_OK)
		return rc;
	res->outbox_rows += nrows;
	if (w.order_op != INBOX_ORDER_KEEP) {
		o->version++;
		o->state = v.next;
		o->flags = v.flags;
		*changed = true;
	}
	return ST_OK;
}

/* A held event as listed for re-evaluation: what the decision needs.  The
 * rest of it is read only once it can take effect. */
struct inbox_held {
	int64_t id;
	char source[MSG_SOURCE_MAX + 1];
	char message_id[MSG_ID_MAX + 1];
	char type[MSG_TYPE_NAME_MAX + 1];
};

/* Give back the memory of an oversized held event read back (one larger
 * than today's INBOX_MAX_BODY, and than the properties' column, so a small
 * setting does not make every release reallocate). */
static void inbox_trim(struct inbox *ib)
{
	if (ib->body_cap > (size_t)ib->conf->max_body + 1 && ib->body_cap > INBOX_PROPS_COLUMN_MAX + 1) {
		free(ib->body);
		ib->body = NULL;
		ib->body_cap = 0;
	}
}

/* Read a held event whole: h gets its key and type, ev its routing key (in
 * rk), properties and body (in the inbox's buffers, grown to fit the stored
 * row up to the columns' widths).  ev->order_id is the caller's.
 * ST_ERR_NOT_FOUND: the row is gone. */
static int inbox_held_load(struct inbox *ib, int64_t id, struct inbox_held *h, char *rk, size_t rk_cap,
                           struct inbox_event *ev)
{
	struct db_param p[2] = { DBP_I64(id), DBP_STR(ib->conf->consumer) };
	struct db_col c[6] = {
		DBC_STR(h->source, sizeof h->source), DBC_STR(h->message_id, sizeof h->message_id),
		DBC_STR(h->type, sizeof h->type), DBC_STR(rk, rk_cap),
		DBC_GROW(&ib->props, &ib->props_cap, INBOX_PROPS_COLUMN_MAX),
		DBC_GROW(&ib->body, &ib->body_cap, INBOX_BODY_COLUMN_MAX),
	};
	int rc = db_stmt_query(ib->held_get, p, 2);
	int r;

	if (rc != ST_OK)
		return rc;
	r = db_stmt_fetch(ib->held_get, c, 6);
	if (r < 0)
		return r;
	if (r == 0)
		return ST_ERR_NOT_FOUND;
	db_stmt_done(ib->held_get);
	h->id = id;
	*ev = (struct inbox_event){
		.source = h->source, .message_id = h->message_id, .type_name = h->type, .body = ib->body,
		.len = c[5].len, .routing_key = rk, .props = c[4].is_null ? NULL : ib->props,
	};
	return ST_OK;
}

/* Parse a held event's stored body again, as it was parsed when it
 * arrived: the key and type it was held under stand for the AMQP
 * properties that may have carried them, and the size limit is the
 * column's (the body was within INBOX_MAX_BODY when it came).  A body that
 * no longer parses or no longer matches its row (the rules changed since)
 * gives the reason to dead-letter it with, and m->detail. */
static enum msg_reason inbox_held_parse(const struct inbox_held *h, const char *order_id,
                                        const struct inbox_event *raw, struct msg *m)
{
	struct msg_props props = {
		.message_id = h->message_id, .message_id_len = strlen(h->message_id),
		.type = h->type, .type_len = strlen(h->type),
	};
	enum msg_reason r = msg_parse(raw->body, raw->len, INBOX_BODY_COLUMN_MAX, &props, m);

	if (r != MSG_REASON_NONE)
		return r;
	if (strcmp(m->message_id, h->message_id) != 0 || strcmp(m->source, h->source) != 0 ||
	    strcmp(m->order_id, order_id) != 0 || strcmp(m->type_name, h->type) != 0) {
		snprintf(m->detail, sizeof m->detail, "stored body does not match its held event");
		return MSG_REASON_INVALID_FIELD;
	}
	return MSG_REASON_NONE;
}

/* Settle a held event whose stored body cannot be applied: its
 * dead-letter copy with the reason, no effect on the order. */
static int inbox_held_reject(struct inbox *ib, const struct inbox_event *raw, enum msg_reason r,
                             const char *detail, struct inbox_result *res)
{
	struct inbox_outrow row;
	struct inbox_write w = {
		.set_outcome = true, .outcome = "dead_lettered", .reason = msg_reason_name(r), .out = &row,
	};
	int rc = inbox_dead_letter_row(ib, raw, w.reason, detail, &row);

	if (rc == ST_OK)
		rc = inbox_settle(ib, raw, &w);
	inbox_outrow_free(&row);
	if (rc == ST_OK)
		res->outbox_rows++;
	LOG(LOG_WARN, "held event cannot be applied; dead-lettered", LOG_S("msg", raw->message_id),
	    LOG_S("order", raw->order_id), LOG_S("reason", w.reason), LOG_S("detail", detail));
	return rc;
}

/* Re-evaluate one listed held event on the locked order.  One that must
 * still wait is left alone (*settled false); any other is read whole,
 * parsed again and carried out exactly as if it had just arrived, then
 * leaves held_events.  *changed: the order row changed. */
static int inbox_release_one(struct inbox *ib, struct inbox_order *o, const struct inbox_held *listed,
                             const char *order_id, struct inbox_result *res, bool *settled, bool *changed)
{
	struct inbox_held h;
	struct inbox_event raw, ev;
	struct order_verdict v;
	struct msg m;
	enum msg_reason reason;
	char rk[256];
	int t = msg_type_from_name(listed->type, strlen(listed->type));
	int rc;

	*settled = false;
	*changed = false;
	if (t < 0)
		return ST_ERR_DB; /* we only ever store validated types */
	v = order_decide(o->state, o->flags, (enum msg_type)t);
	if (v.decision == ORDER_HOLD)
		return ST_OK;
	rc = inbox_held_load(ib, listed->id, &h, rk, sizeof rk, &raw);
	if (rc != ST_OK)
		return rc == ST_ERR_NOT_FOUND ? ST_ERR_DB : rc; /* listed under the order's lock: cannot vanish */
	raw.order_id = order_id;
	reason = inbox_held_parse(&h, order_id, &raw, &m);
	if (reason != MSG_REASON_NONE) {
		rc = inbox_held_reject(ib, &raw, reason, m.detail, res);
	} else {
		inbox_event_from_msg(&ev, &m, raw.body, raw.len, raw.routing_key, raw.props);
		rc = inbox_act(ib, o, &ev, v, true, false, res, changed);
	}
	if (rc == ST_OK) {
		struct db_param dp[1] = { DBP_I64(h.id) };
		rc = db_stmt_exec(ib->held_del, dp, 1, NULL);
	}
	if (rc != ST_OK)
		return rc;
	*settled = true;
	LOG(LOG_DEBUG, "held event settled", LOG_S("msg", h.message_id), LOG_S("order", order_id),
	    LOG_S("outcome", reason != MSG_REASON_NONE ? "dead_lettered" : order_decision_outcome(v.decision)));
	return ST_OK;
}

/* List up to cap held events of the order with an id above after, in id
 * order, reading the result to its end (the connection is then free for
 * the statements that settle them). */
static int inbox_held_page(struct inbox *ib, const char *order_id, int64_t after, struct inbox_held *page,
                           int cap, int *n)
{
	struct db_param p[4] = { DBP_STR(order_id), DBP_STR(ib->conf->consumer), DBP_I64(after), DBP_I64(cap) };
	struct inbox_held spill; /* LIMIT keeps the rows within cap; this is for safety */
	int rc = db_stmt_query(ib->held_list, p, 4);

	*n = 0;
	if (rc != ST_OK)
		return rc;
	for (;;) {
		struct inbox_held *h = *n < cap ? &page[*n] : &spill;
		struct db_col c[4] = {
			DBC_I64(), DBC_STR(h->source, sizeof h->source), DBC_STR(h->message_id, sizeof h->message_id),
			DBC_STR(h->type, sizeof h->type),
		};
		int r = db_stmt_fetch(ib->held_list, c, 4);

		if (r < 0)
			return r;
		if (r == 0)
			return ST_OK;
		h->id = c[0].i64;
		if (*n < cap)
			(*n)++;
	}
}

/* Re-evaluate every held event of the order, oldest first, a page at a
 * time, in passes until a pass leaves the order as it found it: an event
 * skipped early in a pass may apply after a later one changed the order.
 * Memory stays at one page whatever the number of held events. */
static int inbox_release_held(struct inbox *ib, struct inbox_order *o, struct inbox_result *res,
                              const char *order_id)
{
	struct inbox_held page[INBOX_RELEASE_PAGE];
	bool progress = true;
	int released = 0, rc = ST_OK;

	while (rc == ST_OK && progress && o->held > 0) {
		int64_t after = 0;
		int n;

		progress = false;
		do {
			rc = inbox_held_page(ib, order_id, after, page, INBOX_RELEASE_PAGE, &n);
			for (int i = 0; rc == ST_OK && i < n && o->held > 0; i++) {
				bool settled, changed;

				rc = inbox_release_one(ib, o, &page[i], order_id, res, &settled, &changed);
				if (rc == ST_OK && settled) {
					o->held--;
					released++;
					progress = progress || changed;
				}
			}
			if (n > 0)
				after = page[n - 1].id;
		} while (rc == ST_OK && n == INBOX_RELEASE_PAGE && o->held > 0);
	}
	inbox_trim(ib);
	if (rc != ST_OK)
		return rc;
	res->released += released;
	if (released > 0) {
		struct db_param p[2] = { DBP_I64(-(int64_t)released), DBP_STR(order_id) };
		rc = db_stmt_exec(ib->held_count, p, 2, NULL);
	}
	return rc;
}

/* Keep the event in held_events and count it on its order's lock row; the
 * caller records the 'held' outcome. */
static int inbox_hold(struct inbox *ib, const struct inbox_in *in, const struct inbox_event *ev)
{
	char *props = in->props_json != NULL ? in->props_json(in->props_arg) : NULL;
	struct db_param p[8] = {
		DBP_STR(ib->conf->consumer), DBP_STR(ev->source), DBP_STR(ev->message_id), DBP_STR(ev->order_id),
		DBP_STR(ev->type_name), DBP_STR(ev->routing_key), props ? DBP_STR(props) : DBP_NULL(),
		DBP_BLOB(ev->body, ev->len),
	};
	int rc = db_stmt_exec(ib->hold_add, p, 8, NULL);

	free(props);
	if (rc == ST_OK) {
		struct db_param q[2] = { DBP_I64(1), DBP_STR(ev->order_id) };
		rc = db_stmt_exec(ib->held_count, q, 2, NULL);
	}
	return rc;
}

/* Claim the key and lock the order (inbox_claim, one round trip).  On a
 * duplicate key res->outcome says DUPLICATE or CONFLICT by the stored
 * hash; a failed INSERT is rolled back alone, so the rest of a batch's
 * transaction stands, and with alone set the procedure ends the
 * transaction itself. */
static int inbox_claim_lock(struct inbox *ib, const struct inbox_in *in, const char *hex, bool alone,
                            struct inbox_order *o, struct inbox_result *res)
{
	const struct msg *m = in->msg;
	char stored[65], status[32];
	int64_t published_us = in->published_us > 0 && in->published_us <= INBOX_PUBLISHED_US_MAX ? in->published_us : 0;
	struct db_param p[8] = {
		DBP_STR(ib->conf->consumer), DBP_STR(m->source), DBP_STR(m->message_id), DBP_STR(hex),
		DBP_STR(m->type_name), DBP_STR(m->order_id), DBP_I64(published_us), DBP_I64(alone ? 1 : 0),
	};
	struct db_col c[6] = {
		DBC_I64(), DBC_STR(stored, sizeof stored), DBC_I64(), DBC_STR(status, sizeof status), DBC_I64(),
		DBC_I64(),
	};
	int rc, r;

	rc = db_stmt_query(ib->claim_lock, p, 8);
	if (rc != ST_OK)
		return rc;
	r = db_stmt_fetch(ib->claim_lock, c, 6);
	if (r < 0)
		return r;
	if (r == 0)
		return ST_ERR_DB_DEADLOCK; /* the first claim rolled back meanwhile: retry */
	db_stmt_done(ib->claim_lock);
	if (c[0].i64 == 1) {
		res->outcome = strcmp(stored, hex) == 0 ? INBOX_DUPLICATE : INBOX_CONFLICT;
		res->ended = alone;
		return ST_OK;
	}
	return inbox_order_from_row(o, &c[2], &c[3], &c[4], &c[5]);
}

int inbox_apply(struct inbox *ib, const struct inbox_in *in, struct inbox_result *res)
{
	const struct msg *m = in->msg;
	char hex[65];
	struct inbox_order o;
	struct inbox_event ev;
	/* The test hooks fire between the last statement and COMMIT, so with
	 * one armed the COMMIT stays a statement of its own. */
	bool alone = in->alone && !fault_armed("before-commit") && !fault_armed("crash-before-commit");
	struct order_verdict v;
	bool changed = false, commit;
	char *props = NULL;
	int rc;

	memset(res, 0, sizeof *res);
	inbox_event_from_msg(&ev, m, in->body, in->len, in->routing_key, NULL);
	msg_sha256_hex(m->sha256, hex);
	rc = inbox_claim_lock(ib, in, hex, alone, &o, res);
	if (rc != ST_OK || res->outcome == INBOX_DUPLICATE || res->outcome == INBOX_CONFLICT)
		return rc;
	v = order_decide(o.state, o.flags, m->type);
	/* Held events to re-evaluate keep the transaction open. */
	commit = alone && !(o.held > 0 && (v.decision == ORDER_APPLY || v.decision == ORDER_COMPENSATE));
	if (v.decision == ORDER_HOLD) {
		struct inbox_write w = { .set_outcome = true, .outcome = "held", .commit = commit };
		rc = inbox_hold(ib, in, &ev);
		if (rc == ST_OK)
			rc = inbox_settle(ib, &ev, &w);
	} else {
		if (v.decision == ORDER_INVALID && in->props_json != NULL) {
			props = in->props_json(in->props_arg);
			ev.props = props;
		}
		rc = inbox_act(ib, &o, &ev, v, false, commit, res, &changed);
	}
	if (rc == ST_OK && changed && o.held > 0)
		rc = inbox_release_held(ib, &o, res, m->order_id);
	free(props);
	if (rc != ST_OK)
		return rc;
	res->outcome = (enum inbox_outcome)v.decision; /* the enums agree up to DEAD_LETTERED */
	res->state = o.state;
	res->ended = commit;
	return ST_OK;
}

int inbox_commit(struct inbox *ib)
{
	int rc;

	if (fault_hit("before-commit")) {
		db_rollback(ib->db);
		return ST_ERR_FAULT;
	}
	if (fault_hit("crash-before-commit"))
		raise(SIGKILL); /* a message that kills its worker */
	/* If the connection breaks during COMMIT we cannot know whether it
	 * happened.  That is safe: the caller reconnects and runs the
	 * messages again; if the commit did happen, their claims now fail with
	 * 1062 and they are settled as duplicates instead of applied twice. */
	rc = db_commit(ib->db);
	if (rc != ST_OK)
		db_rollback(ib->db);
	return rc;
}

void inbox_abort(struct inbox *ib)
{
	db_rollback(ib->db);
}

/* Dead-letter one expired held event in a transaction of its own, under
 * its order's lock; *done is false when its order settled it meanwhile. */
static int inbox_expire_one(struct inbox *ib, int64_t id, const char *order_id, bool *done)
{
	struct inbox_order o;
	struct inbox_held h;
	struct inbox_event ev;
	struct inbox_outrow row;
	char rk[256], detail[160];
	int rc;

	*done = false;
	rc = inbox_lock_order(ib, order_id, &o);
	if (rc == ST_OK)
		rc = inbox_held_load(ib, id, &h, rk, sizeof rk, &ev);
	if (rc == ST_ERR_NOT_FOUND) {
		db_rollback(ib->db);
		return ST_OK;
	}
	if (rc != ST_OK)
		return rc;
	ev.order_id = order_id;
	snprintf(detail, sizeof detail, "%s held longer than INBOX_HOLD_TTL (%lds) without its prerequisite", h.type,
	         ib->conf->hold_ttl_s);
	rc = inbox_dead_letter_row(ib, &ev, "hold-expired", detail, &row);
	if (rc == ST_OK)
		rc = inbox_outrow_insert(ib, &row, order_id);
	inbox_outrow_free(&row);
	if (rc == ST_OK)
		rc = inbox_set_outcome(ib, h.source, h.message_id, "dead_lettered", "hold-expired");
	if (rc == ST_OK) {
		struct db_param dp[1] = { DBP_I64(id) };
		rc = db_stmt_exec(ib->held_del, dp, 1, NULL);
	}
	if (rc == ST_OK) {
		struct db_param cp[2] = { DBP_I64(-1), DBP_STR(order_id) };
		rc = db_stmt_exec(ib->held_count, cp, 2, NULL);
	}
	if (rc == ST_OK)
		rc = db_commit(ib->db);
	if (rc != ST_OK)
		return rc;
	*done = true;
	LOG(LOG_INFO, "hold expired", LOG_S("msg", h.message_id), LOG_S("order", order_id), LOG_S("type", h.type));
	return ST_OK;
}

/* A held event past its TTL, as listed. */
struct inbox_expiring {
	int64_t id;
	char order_id[MSG_ORDER_ID_MAX + 1];
};

int inbox_expire_holds(struct inbox *ib, int limit, int *expired)
{
	enum { MAXN = 64 };
	struct inbox_expiring rows[MAXN], spill; /* LIMIT keeps the rows within MAXN; spill is for safety */
	int n = 0, rc;

	*expired = 0;
	if (limit > MAXN)
		limit = MAXN;
	if (limit <= 0)
		return ST_OK;
	{
		struct db_param p[3] = { DBP_STR(ib->conf->consumer), DBP_I64(ib->conf->hold_ttl_s), DBP_I64(limit) };
		rc = db_stmt_query(ib->expired_list, p, 3);
		if (rc != ST_OK)
			goto rollback;
		for (;;) {
			struct inbox_expiring *r = n < MAXN ? &rows[n] : &spill;
			struct db_col c[2] = { DBC_I64(), DBC_STR(r->order_id, sizeof r->order_id) };
			int f = db_stmt_fetch(ib->expired_list, c, 2);
			if (f < 0) {
				rc = f;
				goto rollback;
			}
			if (f == 0)
				break;
			r->id = c[0].i64;
			if (n < MAXN)
				n++;
		}
	}
	db_rollback(ib->db); /* end the read-only transaction */
	for (int i = 0; i < n; i++) {
		bool done;

		rc = inbox_expire_one(ib, rows[i].id, rows[i].order_id, &done);
		if (rc != ST_OK)
			goto rollback;
		if (done)
			(*expired)++;
	}
	inbox_trim(ib);
	return ST_OK;
rollback:
	db_rollback(ib->db);
	inbox_trim(ib);
	return rc;
}
