/*
 * inbox.c - the transaction at the heart of the worker, for a batch of
 * messages (a batch may be one message).
 *
 * Round trips, and why: on loopback a round trip costs more CPU, in the
 * kernel on both sides, than the statements it carries (see bench/), so a
 * batch costs the same few round trips whatever its size:
 *   1. CALL inbox_claim_batch (migrations/procedures/): every distinct key
 *      of the batch in one multi-row INSERT, sorted so that two batches
 *      take their index locks in the same order; a key already taken is
 *      left as it is, and reading the rows back tells ours (they carry the
 *      transaction's random claim token) from the others (their stored
 *      hash says duplicate or conflict).  The UNIQUE index stays the only
 *      arbiter.  In the same CALL the order_locks rows of our keys' orders
 *      are created or bumped (a real write: a certification-based cluster
 *      only sees rows that change), sorted by order id, and read with
 *      their orders.
 *   2. Decide in C (common/order.c), per message in delivery order,
 *      against the order state as it evolves inside the batch; every row
 *      to write is appended to one JSON document.
 *   3. CALL inbox_write_batch: held events, order rows, ledger rows, outbox
 *      rows, outcomes and held counts, all in one round trip.
 *   4. COMMIT (the test fault hooks fire between 3 and 4).
 * Held events to re-evaluate (an order changed and has some) are read in
 * pages of 64 after writing what is pending, so the reads see the batch's
 * own writes; that is the one case with more round trips.  A released
 * event is read back whole and parsed again (msg_parse), so it takes
 * effect with every field of its data exactly as it would have arriving in
 * order.
 *
 * One owner: inbox_run opens the transaction (autocommit is off: statement
 * 1 opens it), runs it and ends it; the procedures never commit or roll
 * back.  Each write lives in one place, inbox_write_batch; the janitor's
 * hold expiry uses it too.
 */
#include "inbox.h"

#include <errno.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
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
/* A JSON buffer grown past this (a large held body) is given back after
 * the transaction, so one large message does not pin its memory. */
#define INBOX_JBUF_KEEP (256u * 1024u)

/* A growing byte buffer for the JSON documents the procedures read. */
struct jbuf {
	char *p;
	size_t len, cap;
	bool oom;
};

/* inbox_write_batch's arrays, in the order of its parameters and of its
 * writes (migrations/procedures/inbox_write_batch.sql). */
enum { W_DEL, W_HOLD, W_ORDER, W_EVENT, W_OUTBOX, W_OUTCOME, W_LOCK, W_NSECT };

/* An order of the transaction, locked: its state as it evolves. */
struct inbox_order {
	char id[MSG_ORDER_ID_MAX + 1];
	enum order_state state;
	unsigned flags;
	int64_t version;
	int64_t held;
	/* Not yet written: the row (dirty), the held count (held_dirty), a
	 * payment that took effect (paid_now), the last amount seen. */
	bool dirty, held_dirty, paid_now, has_amount;
	int64_t amount_cents;
};

/* A message of the batch, to sort by key. */
struct inbox_sortent {
	const struct msg *m;
	int i;
};

/* A distinct key of the batch, as claimed. */
struct inbox_key {
	int first;         /* index of its first message in delivery order */
	bool mine;         /* the claim inserted it */
	bool seen;         /* the claim returned its row */
	char stored[65];   /* the hash of the row: ours or the one before us */
};

struct inbox {
	struct db *db;
	const struct cfg *conf;
	struct db_stmt *claim_batch;
	struct db_stmt *write_batch;
	struct db_stmt *lock_touch;
	struct db_stmt *lock_read;
	struct db_stmt *held_list;
	struct db_stmt *held_get;
	struct db_stmt *expired_list;
	/* Galera (wsrep_on): before the COMMIT, count the claim's rows (see
	 * inbox_claim_check).  NULL on a server without Galera. */
	struct db_stmt *claim_check;
	int64_t token;      /* the claim token of the batch in hand */
	int nmine;          /* keys whose row this transaction inserted */
	/* A held event read back: grown by db_stmt_fetch (DBC_GROW) to fit
	 * the stored row, reused, and shrunk again after an oversized one. */
	char *body;
	size_t body_cap;
	char *props;
	size_t props_cap;
	/* The batch in hand, grown to the largest batch seen: per message its
	 * hash and key, per key its claim, the orders locked. */
	int cap;
	char (*hex)[65];
	int *key_of;
	struct inbox_sortent *sorted;
	struct inbox_key *keys;
	int nkeys;
	struct inbox_order *orders;
	int norders;
	/* The claim's keys and the write's arrays (one per kind of row). */
	struct jbuf claim;
	struct jbuf w[W_NSECT];
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
		.amount_cents = m->amount_cents, .has_amount = m->type == MSG_PAYMENT_AUTHORIZED && m->has_amount,
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

/* ---- JSON documents --------------------------------------------------- */

static void jb_reserve(struct jbuf *b, size_t more)
{
	size_t cap;
	char *np;

	if (b->oom || b->len + more + 1 <= b->cap)
		return;
	cap = b->cap > 0 ? b->cap : 1024;
	while (cap < b->len + more + 1)
		cap *= 2;
	np = realloc(b->p, cap);
	if (np == NULL) {
		b->oom = true;
		return;
	}
	b->p = np;
	b->cap = cap;
}

static void jb_raw(struct jbuf *b, const char *s, size_t n)
{
	jb_reserve(b, n);
	if (b->oom)
		return;
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

static void jb_ch(struct jbuf *b, char c)
{
	jb_raw(b, &c, 1);
}

/* A comma unless the array or object was just opened. */
static void jb_sep(struct jbuf *b)
{
	if (b->len > 0 && b->p[b->len - 1] != '[' && b->p[b->len - 1] != '{')
		jb_ch(b, ',');
}

/* A JSON string.  The text is UTF-8 (validated at the boundary, or read
 * from a utf8mb4 column); only the characters JSON requires are escaped. */
static void jb_strn(struct jbuf *b, const char *s, size_t n)
{
	static const char hexd[] = "0123456789abcdef";

	jb_sep(b);
	jb_reserve(b, n + 2);
	jb_ch(b, '"');
	for (size_t i = 0; i < n && !b->oom; i++) {
		unsigned char c = (unsigned char)s[i];
		size_t run = i;

		while (run < n && (unsigned char)s[run] >= 0x20 && s[run] != '"' && s[run] != '\\')
			run++;
		if (run > i) {
			jb_raw(b, s + i, run - i);
			i = run - 1;
			continue;
		}
		if (c == '"' || c == '\\') {
			char e[2] = { '\\', (char)c };
			jb_raw(b, e, 2);
		} else {
			char e[6] = { '\\', 'u', '0', '0', hexd[c >> 4], hexd[c & 15] };
			jb_raw(b, e, 6);
		}
	}
	jb_ch(b, '"');
}

static void jb_str(struct jbuf *b, const char *s)
{
	if (s == NULL) {
		jb_sep(b);
		jb_raw(b, "null", 4);
		return;
	}
	jb_strn(b, s, strlen(s));
}

static void jb_i64(struct jbuf *b, int64_t v)
{
	char t[24];
	int n = snprintf(t, sizeof t, "%lld", (long long)v);

	jb_sep(b);
	jb_raw(b, t, (size_t)n);
}

static void jb_null(struct jbuf *b)
{
	jb_sep(b);
	jb_raw(b, "null", 4);
}

/* Bytes as a base64 JSON string: a stored body need not be text. */
static void jb_b64(struct jbuf *b, const void *p, size_t n)
{
	size_t out = 4 * ((n + 2) / 3);

	jb_sep(b);
	jb_reserve(b, out + 2);
	if (b->oom)
		return;
	b->p[b->len++] = '"';
	if (n > 0)
		b->len += (size_t)EVP_EncodeBlock((unsigned char *)b->p + b->len, p, (int)n);
	b->p[b->len++] = '"';
	b->p[b->len] = '\0';
}

/* Open a row of an array of rows (opening the array on its first row). */
static void jb_row(struct jbuf *b)
{
	if (b->len == 0)
		jb_ch(b, '[');
	jb_sep(b);
	jb_ch(b, '[');
}

static void jb_end(struct jbuf *b)
{
	jb_ch(b, ']');
}

static void jb_clear(struct jbuf *b)
{
	b->len = 0;
	b->oom = false;
	if (b->p != NULL)
		b->p[0] = '\0';
}

static void jb_trim(struct jbuf *b)
{
	if (b->cap > INBOX_JBUF_KEEP) {
		free(b->p);
		b->p = NULL;
		b->cap = 0;
	}
	jb_clear(b);
}

/* ---- open / close ----------------------------------------------------- */

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
	/* migrations/procedures/: the claim of a batch, and its writes. */
	PREP(claim_batch, "CALL inbox_claim_batch(?, ?, ?)");
	PREP(write_batch, "CALL inbox_write_batch(?, ?, ?, ?, ?, ?, ?, ?)");
	/* Hold expiry locks one order outside a batch: the same real write
	 * as inbox_claim_batch's, then the locking read. */
	/* Galera? (SHOW VARIABLES answers on MariaDB and MySQL alike; no
	 * row: no wsrep.) */
	{
		struct db_stmt *show = NULL;
		char name[32], value[32];
		struct db_col c[2] = { DBC_STR(name, sizeof name), DBC_STR(value, sizeof value) };
		bool galera = false;
		int r;

		PREP(claim_check, "SHOW VARIABLES LIKE 'wsrep_on'");
		show = ib->claim_check;
		ib->claim_check = NULL;
		rc = db_stmt_query(show, NULL, 0);
		if (rc != ST_OK)
			goto fail;
		r = db_stmt_fetch(show, c, 2);
		if (r < 0) {
			rc = r;
			goto fail;
		}
		if (r == 1) {
			galera = strcmp(value, "ON") == 0;
			db_stmt_done(show);
		}
		db_rollback(db);
		if (galera)
			PREP(claim_check, "SELECT COUNT(*) FROM JSON_TABLE(?, '$[*]' COLUMNS ("
			                  " source VARCHAR(255) PATH '$[0]', message_id VARCHAR(255) PATH '$[1]')) k"
			                  " JOIN processed_messages p ON p.consumer = ?"
			                  " AND p.source = CONVERT(k.source USING ascii) COLLATE ascii_bin"
			                  " AND p.message_id = CONVERT(k.message_id USING ascii) COLLATE ascii_bin"
			                  " WHERE p.claim = ?");
	}
	PREP(lock_touch, "INSERT INTO order_locks (order_id, held, locks) VALUES (?, 0, 1)"
	                 " ON DUPLICATE KEY UPDATE locks = locks + 1");
	PREP(lock_read, "SELECT l.held, o.status, o.version, o.flags FROM order_locks l"
	                " LEFT JOIN orders o ON o.id = l.order_id WHERE l.order_id = ? FOR UPDATE");
	/* A page of the order's held events after a given id
	 * (ix_held_events_order). */
	PREP(held_list, "SELECT id, source, message_id, type FROM held_events WHERE order_id = ? AND consumer = ?"
	                " AND id > ? ORDER BY id LIMIT ?");
	PREP(held_get, "SELECT source, message_id, type, routing_key, props, body FROM held_events"
	               " WHERE id = ? AND consumer = ?");
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
	free(ib->hex);
	free(ib->key_of);
	free(ib->sorted);
	free(ib->keys);
	free(ib->orders);
	free(ib->claim.p);
	for (int s = 0; s < W_NSECT; s++)
		free(ib->w[s].p);
	free(ib);
	*ibp = NULL;
}

/* Room for a batch of n. */
static int inbox_reserve(struct inbox *ib, int n)
{
	void *p;

	if (n <= ib->cap)
		return ST_OK;
#define GROW(field)                                                          \
	do {                                                                 \
		p = realloc(ib->field, (size_t)n * sizeof *ib->field);       \
		if (p == NULL)                                               \
			return ST_ERR_NOMEM;                                 \
		ib->field = p;                                               \
	} while (0)
	GROW(hex);
	GROW(key_of);
	GROW(sorted);
	GROW(keys);
	GROW(orders);
#undef GROW
	ib->cap = n;
	return ST_OK;
}

/* ---- the write document ----------------------------------------------- */

/* Send what the transaction decided so far (inbox_write_batch) and start
 * the sections anew.  Order rows and held counts go as they stand now:
 * the procedure writes absolute values, so writing an order twice in one
 * transaction is harmless. */
static int inbox_flush(struct inbox *ib)
{
	struct jbuf *o = &ib->w[W_ORDER], *l = &ib->w[W_LOCK];
	bool any = false;
	int rc;

	for (int i = 0; i < ib->norders; i++) {
		struct inbox_order *r = &ib->orders[i];

		if (r->dirty) {
			jb_row(o);
			jb_str(o, r->id);
			jb_str(o, order_state_name(r->state));
			jb_i64(o, r->version);
			jb_i64(o, r->flags);
			jb_i64(o, r->paid_now ? 1 : 0);
			if (r->has_amount)
				jb_i64(o, r->amount_cents);
			else
				jb_null(o);
			jb_end(o);
			r->dirty = r->paid_now = r->has_amount = false;
		}
		if (r->held_dirty) {
			jb_row(l);
			jb_str(l, r->id);
			jb_i64(l, r->held);
			jb_end(l);
			r->held_dirty = false;
		}
	}
	{
		struct db_param p[1 + W_NSECT];

		p[0] = DBP_STR(ib->conf->consumer);
		for (int s = 0; s < W_NSECT; s++) {
			struct jbuf *b = &ib->w[s];

			if (b->len > 0)
				jb_ch(b, ']');
			if (b->oom)
				return ST_ERR_NOMEM;
			p[1 + s] = b->len > 0 ? DBP_STRN(b->p, b->len) : DBP_NULL();
			any = any || b->len > 0;
		}
		rc = any ? db_stmt_exec(ib->write_batch, p, 1 + W_NSECT, NULL) : ST_OK;
	}
	for (int s = 0; s < W_NSECT; s++)
		jb_clear(&ib->w[s]);
	return rc;
}

static void inbox_forget(struct inbox *ib)
{
	for (int s = 0; s < W_NSECT; s++)
		jb_trim(&ib->w[s]);
	jb_trim(&ib->claim);
	ib->norders = 0;
	ib->nkeys = 0;
}

static void inbox_w_outcome(struct inbox *ib, const struct inbox_event *ev, const char *outcome,
                            const char *reason)
{
	struct jbuf *b = &ib->w[W_OUTCOME];

	jb_row(b);
	jb_str(b, ev->source);
	jb_str(b, ev->message_id);
	jb_str(b, outcome);
	jb_str(b, reason);
	jb_end(b);
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

static void inbox_w_outrow(struct inbox *ib, const struct inbox_outrow *r, const char *order_id)
{
	struct jbuf *b = &ib->w[W_OUTBOX];

	jb_row(b);
	jb_str(b, r->id);
	jb_str(b, r->exchange);
	jb_str(b, r->rk);
	jb_str(b, r->type);
	jb_str(b, order_id);
	jb_str(b, r->props);
	jb_str(b, r->headers);
	jb_b64(b, r->body, r->len);
	jb_end(b);
}

static const char *inbox_reason_of(enum order_decision d)
{
	return d == ORDER_INVALID ? "invalid-transition" : NULL;
}

/* Carry out a verdict (not ORDER_HOLD) on a locked order: the order's new
 * state, its ledger row, the outbox rows and the inbox outcome go to the
 * write document.  held_row: the event comes from held_events (its inbox
 * row says 'held' and must get the final outcome).  *changed is set when
 * the order changed (held events may now apply). */
static int inbox_act(struct inbox *ib, struct inbox_order *o, const struct inbox_event *ev,
                     struct order_verdict v, bool held_row, struct inbox_result *res, bool *changed)
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
	const char *outcome = order_decision_outcome(v.decision);
	int nrows = 0, rc = ST_OK;

	*changed = false;
	if (v.decision == ORDER_APPLY || v.decision == ORDER_COMPENSATE) {
		struct jbuf *e = &ib->w[W_EVENT];

		for (size_t i = 0; rc == ST_OK && i < sizeof emits / sizeof emits[0]; i++)
			if (v.emits & emits[i].bit)
				rc = inbox_emit_row(ib, emits[i].type, ev, &rows[nrows++]);
		if (rc == ST_OK) {
			jb_row(e);
			jb_str(e, ev->order_id);
			jb_str(e, ev->source);
			jb_str(e, ev->message_id);
			jb_str(e, ev->type_name);
			jb_str(e, outcome);
			jb_str(e, o->state == ORDER_NONE ? "None" : order_state_name(o->state));
			jb_str(e, order_state_name(v.next));
			jb_i64(e, o->version + 1);
			jb_end(e);
			if ((v.flags & ORDER_FLAG_PAID) && !(o->flags & ORDER_FLAG_PAID))
				o->paid_now = true;
			if (ev->has_amount) {
				o->has_amount = true;
				o->amount_cents = ev->amount_cents;
			}
			o->version++;
			o->state = v.next;
			o->flags = v.flags;
			o->dirty = true;
			*changed = true;
		}
	} else if (v.decision == ORDER_INVALID) {
		char detail[160];
		snprintf(detail, sizeof detail, "%s not allowed on an order in state %s", ev->type_name,
		         order_state_name(o->state));
		rc = inbox_dead_letter_row(ib, ev, "invalid-transition", detail, &rows[nrows++]);
	}
	for (int i = 0; rc == ST_OK && i < nrows; i++)
		inbox_w_outrow(ib, &rows[i], ev->order_id);
	if (rc == ST_OK && (held_row || v.decision != ORDER_APPLY))
		inbox_w_outcome(ib, ev, outcome, inbox_reason_of(v.decision));
	for (int i = 0; i < nrows; i++)
		inbox_outrow_free(&rows[i]);
	if (rc != ST_OK)
		return rc;
	res->outbox_rows += nrows;
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
	const char *reason = msg_reason_name(r);
	int rc = inbox_dead_letter_row(ib, raw, reason, detail, &row);

	if (rc == ST_OK) {
		inbox_w_outrow(ib, &row, raw->order_id);
		inbox_w_outcome(ib, raw, "dead_lettered", reason);
		res->outbox_rows++;
	}
	inbox_outrow_free(&row);
	LOG(LOG_WARN, "held event cannot be applied; dead-lettered", LOG_S("msg", raw->message_id),
	    LOG_S("order", raw->order_id), LOG_S("reason", reason), LOG_S("detail", detail));
	return rc;
}

/* Re-evaluate one listed held event on the locked order.  One that must
 * still wait is left alone (*settled false); any other is read whole,
 * parsed again and carried out exactly as if it had just arrived, then
 * leaves held_events.  *changed: the order row changed. */
static int inbox_release_one(struct inbox *ib, struct inbox_order *o, const struct inbox_held *listed,
                             struct inbox_result *res, bool *settled, bool *changed)
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
	raw.order_id = o->id;
	reason = inbox_held_parse(&h, o->id, &raw, &m);
	if (reason != MSG_REASON_NONE) {
		rc = inbox_held_reject(ib, &raw, reason, m.detail, res);
	} else {
		inbox_event_from_msg(&ev, &m, raw.body, raw.len, raw.routing_key, raw.props);
		rc = inbox_act(ib, o, &ev, v, true, res, changed);
	}
	if (rc != ST_OK)
		return rc;
	jb_row(&ib->w[W_DEL]);
	jb_i64(&ib->w[W_DEL], h.id);
	jb_end(&ib->w[W_DEL]);
	*settled = true;
	LOG(LOG_DEBUG, "held event settled", LOG_S("msg", h.message_id), LOG_S("order", o->id),
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
 * What the transaction decided so far is written before each page is
 * listed, so the list sees the batch's own holds and releases.  Memory
 * stays at one page whatever the number of held events. */
static int inbox_release_held(struct inbox *ib, struct inbox_order *o, struct inbox_result *res)
{
	struct inbox_held page[INBOX_RELEASE_PAGE];
	bool progress = true;
	int released = 0, rc = ST_OK;

	while (rc == ST_OK && progress && o->held > 0) {
		int64_t after = 0;
		int n = 0;

		progress = false;
		do {
			rc = inbox_flush(ib);
			if (rc == ST_OK)
				rc = inbox_held_page(ib, o->id, after, page, INBOX_RELEASE_PAGE, &n);
			for (int i = 0; rc == ST_OK && i < n && o->held > 0; i++) {
				bool settled, changed;

				rc = inbox_release_one(ib, o, &page[i], res, &settled, &changed);
				if (rc == ST_OK && settled) {
					o->held--;
					o->held_dirty = true;
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
	return ST_OK;
}

/* Keep the event in held_events and count it on its order's lock row, and
 * record the 'held' outcome. */
static void inbox_hold(struct inbox *ib, const struct inbox_in *in, const struct inbox_event *ev,
                       struct inbox_order *o)
{
	char *props = in->props_json != NULL ? in->props_json(in->props_arg) : NULL;
	struct jbuf *b = &ib->w[W_HOLD];

	jb_row(b);
	jb_str(b, ev->source);
	jb_str(b, ev->message_id);
	jb_str(b, ev->order_id);
	jb_str(b, ev->type_name);
	jb_str(b, ev->routing_key);
	jb_str(b, props);
	jb_b64(b, ev->body, ev->len);
	jb_end(b);
	free(props);
	inbox_w_outcome(ib, ev, "held", NULL);
	o->held++;
	o->held_dirty = true;
}

/* ---- the batch -------------------------------------------------------- */

/* Keys in the order of the UNIQUE index (binary: ASCII and ascii_bin
 * agree), the first in delivery order leading among equal keys. */
static int inbox_key_cmp(const void *a, const void *b)
{
	const struct inbox_sortent *x = a, *y = b;
	int c = strcmp(x->m->source, y->m->source);

	if (c == 0)
		c = strcmp(x->m->message_id, y->m->message_id);
	if (c == 0)
		c = x->i - y->i;
	return c;
}

static int inbox_order_cmp(const void *a, const void *b)
{
	return strcmp(((const struct inbox_order *)a)->id, ((const struct inbox_order *)b)->id);
}

static struct inbox_order *inbox_find_order(struct inbox *ib, const char *id)
{
	struct inbox_order key;

	snprintf(key.id, sizeof key.id, "%s", id);
	return bsearch(&key, ib->orders, (size_t)ib->norders, sizeof *ib->orders, inbox_order_cmp);
}

/* A random claim token: a row carrying it was inserted by this
 * transaction.  64 bits from the kernel, so that no other transaction's
 * row, however old, carries it by chance. */
static int inbox_token(int64_t *token)
{
	uint64_t t = 0;

	for (;;) {
		ssize_t r = getrandom(&t, sizeof t, 0);
		if (r == (ssize_t)sizeof t)
			break;
		if (r < 0 && errno != EINTR)
			return ST_ERR_IO;
	}
	*token = (int64_t)(t >> 1); /* a positive BIGINT on either side */
	return ST_OK;
}

/* Round trip 1: claim the distinct keys (sorted), lock the orders of ours
 * and read them. */
/* An order as read under its lock: held count, and status/version/flags
 * of its row (status NULL: no order yet).  One place for the batch claim
 * and for hold expiry. */
static int inbox_order_fill(struct inbox_order *o, const char *id, const struct db_col *held,
                            const struct db_col *status, const struct db_col *version, const struct db_col *flags)
{
	memset(o, 0, sizeof *o);
	snprintf(o->id, sizeof o->id, "%s", id);
	o->held = held->i64;
	if (status->is_null) {
		o->state = ORDER_NONE;
		return ST_OK;
	}
	int st = order_state_from_name(status->buf);
	if (st < 0)
		return ST_ERR_DB;
	o->state = (enum order_state)st;
	o->version = version->i64;
	o->flags = (unsigned)flags->i64;
	return ST_OK;
}

static int inbox_claim(struct inbox *ib, const struct inbox_in *in, int n)
{
	struct jbuf *b = &ib->claim;
	int64_t token;
	int rc, r;

	for (int i = 0; i < n; i++)
		ib->sorted[i] = (struct inbox_sortent){ .m = in[i].msg, .i = i };
	qsort(ib->sorted, (size_t)n, sizeof *ib->sorted, inbox_key_cmp);
	ib->nkeys = 0;
	jb_clear(b);
	jb_ch(b, '[');
	for (int s = 0; s < n; s++) {
		int i = ib->sorted[s].i;
		const struct msg *m = in[i].msg;
		int64_t pub = in[i].published_us > 0 && in[i].published_us <= INBOX_PUBLISHED_US_MAX ? in[i].published_us : 0;

		if (s > 0) {
			const struct msg *p = in[ib->keys[ib->nkeys - 1].first].msg;
			if (strcmp(p->source, m->source) == 0 && strcmp(p->message_id, m->message_id) == 0) {
				ib->key_of[i] = ib->nkeys - 1; /* the same key again in this batch */
				continue;
			}
		}
		ib->key_of[i] = ib->nkeys;
		ib->keys[ib->nkeys++] = (struct inbox_key){ .first = i };
		jb_row(b);
		jb_str(b, m->source);
		jb_str(b, m->message_id);
		jb_str(b, ib->hex[i]);
		jb_str(b, m->type_name);
		jb_str(b, m->order_id);
		jb_i64(b, pub);
		jb_end(b);
	}
	jb_ch(b, ']');
	if (b->oom)
		return ST_ERR_NOMEM;
	rc = inbox_token(&token);
	if (rc != ST_OK)
		return rc;
	ib->token = token;
	{
		struct db_param p[3] = { DBP_STR(ib->conf->consumer), DBP_I64(token), DBP_STRN(b->p, b->len) };
		rc = db_stmt_query(ib->claim_batch, p, 3);
	}
	if (rc != ST_OK)
		return rc;
	ib->norders = 0;
	for (;;) {
		char txt[65], status[32]; /* a hash or an order id: 64 at most */
		struct db_col c[8] = {
			DBC_I64(), DBC_I64(), DBC_STR(txt, sizeof txt), DBC_I64(),
			DBC_I64(), DBC_STR(status, sizeof status), DBC_I64(), DBC_I64(),
		};

		r = db_stmt_fetch(ib->claim_batch, c, 8);
		if (r < 0)
			return r;
		if (r == 0)
			break;
		if (c[0].i64 == 0) {
			struct inbox_key *k;

			if (c[1].i64 < 1 || c[1].i64 > ib->nkeys)
				return ST_ERR_DB;
			k = &ib->keys[c[1].i64 - 1];
			k->seen = true;
			k->mine = c[3].i64 == 1;
			snprintf(k->stored, sizeof k->stored, "%s", txt);
		} else {
			struct inbox_order *o;

			if (ib->norders >= n)
				return ST_ERR_DB;
			o = &ib->orders[ib->norders++];
			if (inbox_order_fill(o, txt, &c[4], &c[5], &c[6], &c[7]) != ST_OK)
				return ST_ERR_DB;
		}
	}
	for (int k = 0; k < ib->nkeys; k++)
		if (!ib->keys[k].seen)
			return ST_ERR_DB_DEADLOCK; /* cannot be: the INSERT left a row either way; start over */
	qsort(ib->orders, (size_t)ib->norders, sizeof *ib->orders, inbox_order_cmp);
	return ST_OK;
}

/* Decide one message on its locked order and put its writes in the
 * document. */
static int inbox_decide(struct inbox *ib, const struct inbox_in *in, struct inbox_result *res)
{
	const struct msg *m = in->msg;
	struct inbox_order *o = inbox_find_order(ib, m->order_id);
	struct inbox_event ev;
	struct order_verdict v;
	bool changed = false;
	char *props = NULL;
	int rc = ST_OK;

	if (o == NULL)
		return ST_ERR_DB; /* the claim locks the order of every key it inserted */
	inbox_event_from_msg(&ev, m, in->body, in->len, in->routing_key, NULL);
	v = order_decide(o->state, o->flags, m->type);
	if (v.decision == ORDER_HOLD) {
		inbox_hold(ib, in, &ev, o);
	} else {
		if (v.decision == ORDER_INVALID && in->props_json != NULL) {
			props = in->props_json(in->props_arg);
			ev.props = props;
		}
		rc = inbox_act(ib, o, &ev, v, false, res, &changed);
	}
	if (rc == ST_OK && changed && o->held > 0)
		rc = inbox_release_held(ib, o, res);
	free(props);
	if (rc != ST_OK)
		return rc;
	res->outcome = (enum inbox_outcome)v.decision; /* the enums agree up to DEAD_LETTERED */
	res->state = o->state;
	return ST_OK;
}

/*
 * Galera only: the claim's rows must still be there before the COMMIT.
 * A Galera node that aborts a transaction for a conflicting write set
 * (a "brute force" abort) while it runs a statement inside a stored
 * procedure may swallow the error: the CALL succeeds although the
 * transaction was rolled back, and what follows, the COMMIT included,
 * runs in a new one (mysql-wsrep issue #191).  The batch would be acked
 * with nothing applied.  The rows this transaction claimed are the
 * evidence: if any is missing, the transaction is not the one we ran, so
 * it is rolled back and retried like a deadlock.  One more round trip per
 * batch, on Galera only.
 */
static int inbox_claim_check(struct inbox *ib)
{
	struct db_param p[3] = { DBP_STRN(ib->claim.p, ib->claim.len), DBP_STR(ib->conf->consumer),
		                 DBP_I64(ib->token) };
	struct db_col c[1] = { DBC_I64() };
	int rc = db_stmt_query(ib->claim_check, p, 3);
	int r;

	if (rc != ST_OK)
		return rc;
	r = db_stmt_fetch(ib->claim_check, c, 1);
	if (r < 0)
		return r;
	if (r == 1)
		db_stmt_done(ib->claim_check);
	if (r == 0 || c[0].i64 != ib->nmine) {
		LOG(LOG_WARN, "the transaction lost its claim (a Galera abort inside a procedure); retrying",
		    LOG_I("claimed", ib->nmine), LOG_I("found", r == 0 ? 0 : c[0].i64));
		return ST_ERR_DB_DEADLOCK;
	}
	return ST_OK;
}

/* End the transaction: COMMIT when rc is ST_OK (the test fault hooks,
 * for a message's transaction, fire just before it), else ROLLBACK. */
static int inbox_end(struct inbox *ib, int rc, bool hooks)
{
	if (rc == ST_OK && !hooks) {
		rc = db_commit(ib->db);
	} else if (rc == ST_OK) {
		if (fault_hit("before-commit")) {
			rc = ST_ERR_FAULT;
		} else {
			if (fault_hit("crash-before-commit"))
				raise(SIGKILL); /* a message that kills its worker */
			/* If the connection breaks during COMMIT we cannot know
			 * whether it happened.  That is safe: the caller
			 * reconnects and runs the messages again; if the commit
			 * did happen, their keys are taken now and they are
			 * settled as duplicates instead of applied twice. */
			rc = db_commit(ib->db);
		}
	}
	if (rc != ST_OK)
		db_rollback(ib->db);
	inbox_forget(ib);
	return rc;
}

int inbox_run(struct inbox *ib, const struct inbox_in *in, int n, struct inbox_result *res)
{
	int rc;

	if (n <= 0)
		return ST_ERR_INVALID;
	rc = inbox_reserve(ib, n);
	if (rc != ST_OK)
		return rc;
	for (int i = 0; i < n; i++) {
		memset(&res[i], 0, sizeof res[i]);
		msg_sha256_hex(in[i].msg->sha256, ib->hex[i]);
	}
	rc = inbox_claim(ib, in, n);
	ib->nmine = 0;
	for (int k = 0; rc == ST_OK && k < ib->nkeys; k++)
		ib->nmine += ib->keys[k].mine;
	for (int i = 0; rc == ST_OK && i < n; i++) {
		const struct inbox_key *k = &ib->keys[ib->key_of[i]];

		if (k->first != i) {
			/* The same key again in this batch: the first one's hash
			 * stands, as the stored one would. */
			const char *ref = k->mine ? ib->hex[k->first] : k->stored;
			res[i].outcome = strcmp(ref, ib->hex[i]) == 0 ? INBOX_DUPLICATE : INBOX_CONFLICT;
		} else if (!k->mine) {
			res[i].outcome = strcmp(k->stored, ib->hex[i]) == 0 ? INBOX_DUPLICATE : INBOX_CONFLICT;
		} else {
			rc = inbox_decide(ib, &in[i], &res[i]);
		}
	}
	if (rc == ST_OK)
		rc = inbox_flush(ib);
	if (rc == ST_OK && ib->claim_check != NULL)
		rc = inbox_claim_check(ib);
	return inbox_end(ib, rc, true);
}

/* Lock one order outside a batch (hold expiry) and read it into the
 * transaction's one order slot. */
static int inbox_lock_one(struct inbox *ib, const char *order_id, struct inbox_order **out)
{
	char status[32];
	struct db_col c[4] = { DBC_I64(), DBC_STR(status, sizeof status), DBC_I64(), DBC_I64() };
	struct db_param p[1] = { DBP_STR(order_id) };
	struct inbox_order *o;
	int rc, r;

	rc = inbox_reserve(ib, 1);
	if (rc == ST_OK)
		rc = db_stmt_exec(ib->lock_touch, p, 1, NULL);
	if (rc == ST_OK)
		rc = db_stmt_query(ib->lock_read, p, 1);
	if (rc != ST_OK)
		return rc;
	r = db_stmt_fetch(ib->lock_read, c, 4);
	if (r < 0)
		return r;
	if (r == 0)
		return ST_ERR_DB; /* we just wrote it */
	db_stmt_done(ib->lock_read);
	o = &ib->orders[0];
	if (inbox_order_fill(o, order_id, &c[0], &c[1], &c[2], &c[3]) != ST_OK)
		return ST_ERR_DB;
	ib->norders = 1;
	*out = o;
	return ST_OK;
}

/* Dead-letter one expired held event in a transaction of its own, under
 * its order's lock; *done is false when its order settled it meanwhile. */
static int inbox_expire_one(struct inbox *ib, int64_t id, const char *order_id, bool *done)
{
	struct inbox_order *o = NULL;
	struct inbox_held h;
	struct inbox_event ev;
	struct inbox_outrow row;
	char rk[256], detail[160];
	int rc;

	*done = false;
	rc = inbox_lock_one(ib, order_id, &o);
	if (rc == ST_OK)
		rc = inbox_held_load(ib, id, &h, rk, sizeof rk, &ev);
	if (rc == ST_ERR_NOT_FOUND)
		return inbox_end(ib, ST_OK, false); /* released meanwhile; only the lock was written */
	if (rc != ST_OK)
		return inbox_end(ib, rc, false);
	ev.order_id = order_id;
	snprintf(detail, sizeof detail, "%s held longer than INBOX_HOLD_TTL (%lds) without its prerequisite", h.type,
	         ib->conf->hold_ttl_s);
	rc = inbox_dead_letter_row(ib, &ev, "hold-expired", detail, &row);
	if (rc == ST_OK) {
		inbox_w_outrow(ib, &row, order_id);
		inbox_w_outcome(ib, &ev, "dead_lettered", "hold-expired");
		jb_row(&ib->w[W_DEL]);
		jb_i64(&ib->w[W_DEL], id);
		jb_end(&ib->w[W_DEL]);
		o->held = o->held > 0 ? o->held - 1 : 0;
		o->held_dirty = true;
	}
	inbox_outrow_free(&row);
	if (rc == ST_OK)
		rc = inbox_flush(ib);
	/* No fault hooks here: those stand for a message's transaction. */
	rc = inbox_end(ib, rc, false);
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
