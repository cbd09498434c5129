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
 *   4. If the order changed and it has held events, re-evaluate them in a
 *      loop until a pass settles none.
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

#define INBOX_PROPS_MAX 65536
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
	struct db_stmt *cleanup_inbox;
	struct db_stmt *cleanup_outbox;
	/* Buffers for a held event read back; sized once, reused. */
	char *body;
	size_t body_cap;
	char *props;
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
	ib->body_cap = (size_t)conf->max_body + 1;
	ib->body = malloc(ib->body_cap);
	ib->props = malloc(INBOX_PROPS_MAX);
	if (ib->body == NULL || ib->props == NULL) {
		rc = ST_ERR_NOMEM;
		goto fail;
	}
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
	PREP(held_list, "SELECT id, source, message_id, type FROM held_events WHERE order_id = ? AND consumer = ?"
	                " ORDER BY id");
	PREP(held_get, "SELECT source, message_id, type, routing_key, props, body FROM held_events"
	               " WHERE id = ? AND consumer = ?");
	PREP(held_del, "DELETE FROM held_events WHERE id = ?");
	PREP(expired_list, "SELECT id, order_id FROM held_events WHERE consumer = ?"
	                   " AND held_at < NOW(6) - INTERVAL ? SECOND ORDER BY id LIMIT ?");
	PREP(cleanup_inbox, "DELETE FROM processed_messages WHERE processed_at < NOW(6) - INTERVAL ? SECOND"
	                    " AND outcome <> 'held' ORDER BY processed_at LIMIT ?");
	PREP(cleanup_outbox, "DELETE FROM outbox WHERE sent_at IS NOT NULL"
	                     " AND sent_at < NOW(6) - INTERVAL ? SECOND ORDER BY sent_at LIMIT ?");
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

/* A held event as listed for re-evaluation; body and properties are read
 * only if it turns out to need a dead-letter copy. */
struct inbox_held {
	int64_t id;
	char source[MSG_SOURCE_MAX + 1];
	char message_id[MSG_ID_MAX + 1];
	char type[MSG_TYPE_NAME_MAX + 1];
};

/* Read a held event's routing key, properties and body into the inbox's
 * buffers (for its dead-letter copy). */
static int inbox_held_payload(struct inbox *ib, int64_t id, char *rk, size_t rk_cap, struct inbox_event *ev)
{
	char source[MSG_SOURCE_MAX + 1], mid[MSG_ID_MAX + 1], type[MSG_TYPE_NAME_MAX + 1];
	struct db_param p[2] = { DBP_I64(id), DBP_STR(ib->conf->consumer) };
	struct db_col c[6] = {
		DBC_STR(source, sizeof source), DBC_STR(mid, sizeof mid), DBC_STR(type, sizeof type),
		DBC_STR(rk, rk_cap), DBC_STR(ib->props, INBOX_PROPS_MAX), DBC_BLOB(ib->body, ib->body_cap),
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
	ev->body = ib->body;
	ev->len = c[5].len;
	ev->routing_key = rk;
	ev->props = c[4].is_null ? NULL : ib->props;
	return ST_OK;
}

/* Re-evaluate the order's held events until a pass settles none.  Each
 * settled event leaves held_events and gets its final inbox outcome. */
static int inbox_release_held(struct inbox *ib, struct inbox_order *o, struct inbox_result *res,
                              const char *order_id)
{
	enum { BATCH = 64 };
	struct inbox_held held[BATCH];
	struct inbox_held spill; /* rows past BATCH wait for the next pass */
	bool progress = true;
	int rc;

	while (progress && o->held > 0) {
		int n = 0;
		struct db_param p[2] = { DBP_STR(order_id), DBP_STR(ib->conf->consumer) };

		progress = false;
		rc = db_stmt_query(ib->held_list, p, 2);
		if (rc != ST_OK)
			return rc;
		for (;;) {
			struct inbox_held *h = n < BATCH ? &held[n] : &spill;
			struct db_col c[4] = {
				DBC_I64(), DBC_STR(h->source, sizeof h->source),
				DBC_STR(h->message_id, sizeof h->message_id), DBC_STR(h->type, sizeof h->type),
			};
			int r = db_stmt_fetch(ib->held_list, c, 4);
			if (r < 0)
				return r;
			if (r == 0)
				break;
			h->id = c[0].i64;
			if (n < BATCH)
				n++;
		}
		for (int i = 0; i < n; i++) {
			const struct inbox_held *h = &held[i];
			char rk[256];
			struct inbox_event ev = {
				.source = h->source, .message_id = h->message_id, .type_name = h->type,
				.order_id = order_id,
			};
			struct order_verdict v;
			bool changed;
			int t = msg_type_from_name(h->type, strlen(h->type));

			if (t < 0)
				return ST_ERR_DB; /* we only ever store validated types */
			ev.type = (enum msg_type)t;
			v = order_decide(o->state, o->flags, ev.type);
			if (v.decision == ORDER_HOLD)
				continue;
			if (v.decision == ORDER_INVALID) {
				rc = inbox_held_payload(ib, h->id, rk, sizeof rk, &ev);
				if (rc != ST_OK)
					return rc;
			}
			rc = inbox_act(ib, o, &ev, v, true, false, res, &changed);
			if (rc == ST_OK) {
				struct db_param dp[1] = { DBP_I64(h->id) };
				rc = db_stmt_exec(ib->held_del, dp, 1, NULL);
			}
			if (rc != ST_OK)
				return rc;
			o->held--;
			res->released++;
			progress = true;
			LOG(LOG_DEBUG, "held event settled", LOG_S("msg", h->message_id), LOG_S("order", order_id),
			    LOG_S("outcome", order_decision_outcome(v.decision)));
		}
	}
	if (res->released > 0) {
		struct db_param p[2] = { DBP_I64(-(int64_t)res->released), DBP_STR(order_id) };
		rc = db_stmt_exec(ib->held_count, p, 2, NULL);
		if (rc != ST_OK)
			return rc;
	}
	return ST_OK;
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
	struct inbox_event ev = {
		.source = m->source, .message_id = m->message_id, .type_name = m->type_name, .type = m->type,
		.order_id = m->order_id, .body = in->body, .len = in->len, .routing_key = in->routing_key,
		.props = NULL, .amount_cents = m->amount_cents, .has_amount = m->type == MSG_PAYMENT_AUTHORIZED,
	};
	/* The test hooks fire between the last statement and COMMIT, so with
	 * one armed the COMMIT stays a statement of its own. */
	bool alone = in->alone && !fault_armed("before-commit") && !fault_armed("crash-before-commit");
	struct order_verdict v;
	bool changed = false, commit;
	char *props = NULL;
	int rc;

	memset(res, 0, sizeof *res);
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

int inbox_expire_holds(struct inbox *ib, int limit, int *expired)
{
	enum { MAXN = 64 };
	int64_t ids[MAXN];
	char orders[MAXN][MSG_ORDER_ID_MAX + 1];
	int n = 0, rc;

	*expired = 0;
	if (limit > MAXN)
		limit = MAXN;
	{
		struct db_param p[3] = { DBP_STR(ib->conf->consumer), DBP_I64(ib->conf->hold_ttl_s), DBP_I64(limit) };
		rc = db_stmt_query(ib->expired_list, p, 3);
		if (rc != ST_OK)
			goto rollback;
		for (;;) {
			struct db_col c[2] = { DBC_I64(), DBC_STR(orders[n], sizeof orders[n]) };
			int r = db_stmt_fetch(ib->expired_list, c, 2);
			if (r < 0) {
				rc = r;
				goto rollback;
			}
			if (r == 0)
				break;
			ids[n] = c[0].i64;
			if (n < MAXN - 1)
				n++;
		}
	}
	db_rollback(ib->db); /* end the read-only transaction */
	for (int i = 0; i < n; i++) {
		struct inbox_order o;
		char source[MSG_SOURCE_MAX + 1], mid[MSG_ID_MAX + 1], type[MSG_TYPE_NAME_MAX + 1], rk[256];
		struct db_param gp[2] = { DBP_I64(ids[i]), DBP_STR(ib->conf->consumer) };
		struct db_col gc[6] = {
			DBC_STR(source, sizeof source), DBC_STR(mid, sizeof mid), DBC_STR(type, sizeof type),
			DBC_STR(rk, sizeof rk), DBC_STR(ib->props, INBOX_PROPS_MAX), DBC_BLOB(ib->body, ib->body_cap),
		};
		struct inbox_event ev;
		char detail[160];
		int r;

		rc = inbox_lock_order(ib, orders[i], &o);
		if (rc != ST_OK)
			goto rollback;
		rc = db_stmt_query(ib->held_get, gp, 2);
		if (rc != ST_OK)
			goto rollback;
		r = db_stmt_fetch(ib->held_get, gc, 6);
		if (r < 0) {
			rc = r;
			goto rollback;
		}
		if (r == 0) { /* settled by its order meanwhile */
			db_rollback(ib->db);
			continue;
		}
		db_stmt_done(ib->held_get);
		ev = (struct inbox_event){
			.source = source, .message_id = mid, .type_name = type, .order_id = orders[i],
			.body = ib->body, .len = gc[5].len, .routing_key = rk, .props = gc[4].is_null ? NULL : ib->props,
		};
		snprintf(detail, sizeof detail, "%s held longer than INBOX_HOLD_TTL (%lds) without its prerequisite",
		         type, ib->conf->hold_ttl_s);
		{
			struct inbox_outrow row;
			rc = inbox_dead_letter_row(ib, &ev, "hold-expired", detail, &row);
			if (rc == ST_OK)
				rc = inbox_outrow_insert(ib, &row, orders[i]);
			inbox_outrow_free(&row);
		}
		if (rc == ST_OK)
			rc = inbox_set_outcome(ib, source, mid, "dead_lettered", "hold-expired");
		if (rc == ST_OK) {
			struct db_param dp[1] = { DBP_I64(ids[i]) };
			rc = db_stmt_exec(ib->held_del, dp, 1, NULL);
		}
		if (rc == ST_OK) {
			struct db_param cp[2] = { DBP_I64(-1), DBP_STR(orders[i]) };
			rc = db_stmt_exec(ib->held_count, cp, 2, NULL);
		}
		if (rc == ST_OK)
			rc = db_commit(ib->db);
		if (rc != ST_OK)
			goto rollback;
		(*expired)++;
		LOG(LOG_INFO, "hold expired", LOG_S("msg", mid), LOG_S("order", orders[i]), LOG_S("type", type));
	}
	return ST_OK;
rollback:
	db_rollback(ib->db);
	return rc;
}

int inbox_cleanup(struct inbox *ib, int batch, uint64_t *deleted)
{
	struct db_stmt *stmts[2] = { ib->cleanup_inbox, ib->cleanup_outbox };
	int rc;

	*deleted = 0;
	for (int s = 0; s < 2; s++) {
		uint64_t n;
		do {
			struct db_param p[2] = { DBP_I64(ib->conf->retention_s), DBP_I64(batch) };
			rc = db_stmt_exec(stmts[s], p, 2, &n);
			if (rc == ST_OK)
				rc = db_commit(ib->db);
			if (rc != ST_OK) {
				db_rollback(ib->db);
				return rc;
			}
			*deleted += n;
		} while (n == (uint64_t)batch);
	}
	return ST_OK;
}
