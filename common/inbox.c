/*
 * inbox.c - the transaction at the heart of the worker, for a batch of
 * messages (a batch may be one message): its claim, its decisions and its
 * end.  The write it ends with is common/inbox_write.c's, the held events
 * it releases (and the expiry of holds) common/inbox_held.c's;
 * inbox_int.h is what the three files share.
 *
 *
 * Two round trips a batch, whatever its size: on loopback a round trip
 * costs more CPU, in the kernel on both sides, than the statements it
 * carries, and every statement the server parses and runs per row counts
 * on two cores (see bench/).  Both requests are multi-statement text built
 * with sqlbuf (values escaped or hex-encoded; no SQL from message text):
 *   1. The claim (inbox_claim): every distinct key of the batch in one
 *      multi-row INSERT into processed_messages, sorted so that two batches
 *      take their index locks in the same order; a key already taken is
 *      left as it is (the UNIQUE index stays the only arbiter), and the
 *      rows we inserted carry the transaction's random claim token.  Then
 *      the order_locks rows of the batch's orders, sorted by id, created
 *      or bumped (a real write: a certification-based cluster only sees
 *      rows that change); then, read back, the keys that are not new
 *      (another claim's, whose stored hash says duplicate or conflict,
 *      and ours that the ledger, order_events, knows: forgotten), in one
 *      range with the ledger joined, and the locked orders.
 *   2. Decide in C (common/aggregate.c), per message in delivery order,
 *      against the order state as it evolves inside the batch; every row
 *      to write goes to the section of its statement (held events, order
 *      rows, ledger rows, outbox rows, outcomes, held counts).
 *   3. The write (inbox_flush, common/inbox_write.c): those statements
 *      and the COMMIT in one request (the test fault hooks fire just
 *      before it).
 * inbox_run_nowait (the worker's batches) opens the claim's request with
 * the batch's order locks taken without waiting (FOR UPDATE NOWAIT); only
 * when one is held elsewhere, and that statement failed before anything
 * else ran, does it send a round trip before the claim, the probe
 * (inbox_probe): it locks the batch's orders that no one holds, still
 * without waiting, and leaves the deliveries of the others for a second
 * transaction (issue 25; doc/fleet.md).
 * Held events are released in the same transaction (common/inbox_held.c).
 *
 * One owner: inbox_run opens the transaction (autocommit is off: the
 * claim opens it), runs it and ends it in inbox_end, where hold expiry
 * (common/inbox_held.c) ends its own too.  The SQL is portable between
 * MariaDB 10.11 and MySQL 8.0 (multi-row INSERT ... ON DUPLICATE KEY
 * UPDATE, no RETURNING).
 */
#include "inbox.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "effects.h"
#include "fault.h"
#include "inbox_int.h"
#include "lifecycle_schema.h"
#include "log.h"
#include "outbox_dispatch.h"
#include "sqlbuf.h"
#include "status.h"

/* The ceiling of a section of the write (ib->w): its rows are cut into
 * requests that fit the server's max_allowed_packet (inbox_flush), so a
 * section is not a request and may hold more than one; what it holds is
 * bounded by the configuration (a batch's rows, plus a page of released
 * held events), and this is the ceiling of that: 1 GiB, the largest
 * max_allowed_packet a server allows. */
#define INBOX_SECTION_MAX (1024u * 1024u * 1024u)
/* What one message's largest row needs in a request besides its body's
 * hex (2 bytes a byte): the properties escaped (up to twice the column),
 * the routing key escaped, ids, names, the dead-letter headers and the
 * statement's head. */
#define INBOX_ROW_OVERHEAD (2u * INBOX_PROPS_COLUMN_MAX + 8192u)
/* processed_messages.published_at is filled with FROM_UNIXTIME, whose range
 * ends at 2038-01-19 on MariaDB 10.11; strict mode refuses a row past it.
 * The header only measures latency, so a value out of range is dropped
 * instead of costing the message anything. */
#define INBOX_PUBLISHED_US_MAX (INT64_C(2147483647) * 1000000)
/* inbox_claim with its NOWAIT lock found an order another transaction
 * holds (not a status: it never leaves this file). */
#define INBOX_HELD_ELSEWHERE 1

/* The event from a parsed message: the one place that says which fields of
 * a message reach the database, for a live delivery and a released held
 * event alike, so that a held event takes effect as it would have live. */
void inbox_event_from_msg(struct inbox_event *ev, const struct msg *m, const void *body, size_t len,
                          const char *routing_key, const char *props)
{
	*ev = (struct inbox_event){
		.source = m->source, .message_id = m->message_id, .type_name = m->type_name, .type = m->type,
		.order_id = m->order_id, .body = body, .len = len, .routing_key = routing_key, .props = props,
		.msg = m,
	};
	msg_sha256_hex(m->sha256, ev->sha);
}

/* inbox_decide and the releases turn a decision into an outcome with a
 * cast: the two enums must agree value for value up to DEAD_LETTERED. */
_Static_assert((int)INBOX_APPLIED == (int)LC_APPLY && (int)INBOX_HELD == (int)LC_HOLD &&
                   (int)INBOX_IGNORED == (int)LC_IGNORE && (int)INBOX_COMPENSATED == (int)LC_COMPENSATE &&
                   (int)INBOX_DEAD_LETTERED == (int)LC_INVALID,
               "enum inbox_outcome and enum lc_decision must agree up to DEAD_LETTERED");

static const char *const inbox_outcome_names[] = {
	[INBOX_APPLIED] = "applied",         [INBOX_HELD] = "held",
	[INBOX_IGNORED] = "ignored",         [INBOX_COMPENSATED] = "compensated",
	[INBOX_DEAD_LETTERED] = "dead_lettered", [INBOX_DUPLICATE] = "duplicate",
	[INBOX_CONFLICT] = "payload-conflict",
};
_Static_assert(sizeof inbox_outcome_names / sizeof inbox_outcome_names[0] == INBOX_OUTCOME_COUNT, "one name per outcome");

const char *inbox_outcome_name(enum inbox_outcome o)
{
	return (unsigned)o < sizeof inbox_outcome_names / sizeof inbox_outcome_names[0]
	           ? inbox_outcome_names[o]
	           : "unknown";
}

/* ---- open / close ----------------------------------------------------- */

static int inbox_wsrep_row(void *arg, int stmt, const char *const *v, const unsigned long *lens, int ncols)
{
	(void)stmt;
	(void)lens;
	if (ncols == 2 && v[1] != NULL)
		*(bool *)arg = strcmp(v[1], "ON") == 0;
	return ST_OK;
}

/* The statements' SQL that names the bound definition's tables and
 * columns (ib->sql), once per inbox: the batch builds its requests from
 * these constants as it always did from literals.  A column keeps the
 * value of the last event that took effect and set it; an event that sets
 * nothing there (an optional field absent) leaves it as it was. */
static int inbox_names_build(struct inbox *ib)
{
	const struct lc_def *d = ib->bind->def;
	struct inbox_names *n = &ib->sql;
	const char *t, *ev, *lk, *k = d->key;
	size_t hl, tl;
	int w = 0;

	lc_schema_tables(d, n->table);
	t = n->table[0];
	ev = n->table[1];
	lk = n->table[2];

#define NAME(field, ...) (w |= snprintf(n->field, sizeof n->field, __VA_ARGS__) >= (int)sizeof n->field)
	NAME(lock_rows, "INSERT INTO `%s` (`%s`, held, locks) VALUES ", lk, k);
	NAME(lock_rows_tail, " ON DUPLICATE KEY UPDATE locks = `%s`.locks + 1;", lk);
	NAME(key_in, "`%s` IN (", k);
	/* a numbered definition's rows count what they emitted (emitted) */
	NAME(read_aggs, "SELECT l.`%s`, l.held, o.status, o.version, o.flags%s FROM `%s` l"
	     " LEFT JOIN `%s` o ON o.id = l.`%s` WHERE l.", k, lc_sequenced(d) ? ", o.emitted" : "", lk, t, k);
	NAME(read_keys, "SELECT p.source, p.message_id, p.payload_sha256, e.`%s`, e.type, e.payload_sha256,"
	     " p.claim <=> ", k);
	NAME(read_keys_join, " FROM processed_messages p LEFT JOIN `%s` e ON e.consumer = p.consumer"
	     " AND e.source = p.source AND e.message_id = p.message_id AND p.claim <=> ", ev);
	NAME(probe, "SELECT `%s` FROM `%s` WHERE ", k, lk);
	NAME(held_set, "UPDATE `%s` SET held = ", lk);
	NAME(held_where, " WHERE `%s` = ", k);
	NAME(event_head, "INSERT INTO `%s` (`%s`, consumer, source, message_id, type, outcome, from_status,"
	     " to_status, version, applied_at, payload_sha256) VALUES ", ev, k);
	NAME(agg_head, "INSERT INTO `%s` (id, status, version, flags%s", t, lc_sequenced(d) ? ", emitted" : "");
	NAME(agg_tail, " ON DUPLICATE KEY UPDATE status = VALUES(status), version = VALUES(version),"
	     " flags = VALUES(flags), lifecycle_version = VALUES(lifecycle_version)%s",
	     lc_sequenced(d) ? ", emitted = VALUES(emitted)" : "");
#undef NAME
	for (int c = 0; c < ib->bind->ncols; c++) {
		const char *col = ib->bind->cols[c];

		hl = strlen(n->agg_head);
		tl = strlen(n->agg_tail);
		w |= snprintf(n->agg_head + hl, sizeof n->agg_head - hl, ", `%s`", col) >= (int)(sizeof n->agg_head - hl);
		w |= snprintf(n->agg_tail + tl, sizeof n->agg_tail - tl, ", `%s` = COALESCE(VALUES(`%s`), `%s`.`%s`)", col,
		              col, t, col) >= (int)(sizeof n->agg_tail - tl);
	}
	hl = strlen(n->agg_head);
	tl = strlen(n->agg_tail);
	w |= snprintf(n->agg_head + hl, sizeof n->agg_head - hl, ", lifecycle_version, created_at, updated_at) VALUES ") >=
	     (int)(sizeof n->agg_head - hl);
	w |= snprintf(n->agg_tail + tl, sizeof n->agg_tail - tl, ", updated_at = VALUES(updated_at)") >=
	     (int)(sizeof n->agg_tail - tl);
	return w ? ST_ERR_INVALID : ST_OK;
}

/* The bound definition's version as SQL text, escaped once (ib->sql). */
static int inbox_version_lit(struct inbox *ib)
{
	struct sqlbuf *q = &ib->req;
	int rc;

	sqlbuf_reset(q);
	sqlbuf_str(q, ib->bind->def->version);
	rc = sqlbuf_err(q);
	if (rc == ST_OK && q->len >= sizeof ib->sql.version_lit)
		rc = ST_ERR_INVALID; /* lc_load bounds it: twice its length and the quotes fit */
	if (rc == ST_OK) {
		memcpy(ib->sql.version_lit, q->p, q->len);
		ib->sql.version_lit[q->len] = '\0';
	}
	sqlbuf_reset(q);
	return rc;
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
	ib->bind = agg_current();
	rc = inbox_names_build(ib);
	if (rc != ST_OK)
		goto fail;
#define PREP(field, sql)                                        \
	do {                                                    \
		rc = db_prepare(db, &ib->field, sql);           \
		if (rc != ST_OK)                                \
			goto fail;                              \
	} while (0)
	/* Never run: the claim reads the ledger's hashes, and (since issue
	 * 43) the claim and hold expiry lock orders and read held events, in
	 * requests of their own.  Prepared so that a schema without those
	 * tables and columns (migrations 0015, 0017 not run) is refused at
	 * start, with the remedy (pool_db_up), instead of failing every
	 * batch. */
	{
		const struct lc_def *d = ib->bind->def;
		char (*tb)[LC_NAME_MAX + 16] = ib->sql.table;
		char q[INBOX_NAME_SQL];

		snprintf(q, sizeof q, "INSERT INTO `%s` (`%s`, held, locks) VALUES (?, 0, 1)"
		         " ON DUPLICATE KEY UPDATE locks = locks + 1", tb[2], d->key);
		PREP(lock_touch, q);
		snprintf(q, sizeof q, "SELECT l.held, o.status, o.version, o.flags FROM `%s` l"
		         " LEFT JOIN `%s` o ON o.id = l.`%s` WHERE l.`%s` = ? FOR UPDATE", tb[2], tb[0], d->key, d->key);
		PREP(lock_read, q);
		snprintf(q, sizeof q, "SELECT payload_sha256 FROM `%s` WHERE consumer = ? AND source = ?"
		         " AND message_id = ?", tb[1]);
		PREP(ledger_probe, q);
	}
	PREP(held_get, "SELECT source, message_id, type, routing_key, props, body, event, context, lifecycle_version"
	               " FROM held_events WHERE id = ? AND consumer = ?");
	PREP(expired_list, "SELECT id, order_id FROM held_events WHERE consumer = ?"
	                   " AND held_at < NOW(6) - INTERVAL ? SECOND ORDER BY id LIMIT ?");
#undef PREP
	/* The definition's own statements: prepared here as ours are, so a
	 * schema that lacks their tables is refused at start (preflight says
	 * which statement and line before the pool starts). */
	rc = effects_open(&ib->fx, db, ib->bind->def, NULL);
	if (rc != ST_OK)
		goto fail;
	/* The request: at most what the server takes (sqlbuf's default
	 * ceiling); the sections: cut into requests by inbox_flush. */
	ib->req.db = db;
	ib->vals.db = db;
	rc = inbox_version_lit(ib);
	if (rc != ST_OK)
		goto fail;
	for (int i = 0; i < W_NSECT; i++) {
		ib->w[i].db = db;
		ib->w[i].max = INBOX_SECTION_MAX;
		ib->w[i].cuts_on = true;
	}
	/* Galera?  (No row: no wsrep; the answer is the same on every node.) */
	{
		static const char show[] = "SHOW VARIABLES LIKE 'wsrep_on'";
		rc = db_multi(db, show, sizeof show - 1, inbox_wsrep_row, &ib->galera);
	}
	db_rollback(db);
	if (rc != ST_OK)
		goto fail;
	*out = ib;
	return ST_OK;
fail:
	inbox_close(&ib);
	return rc;
}

int inbox_limits(const struct inbox *ib, char *why, size_t cap)
{
	size_t have = db_max_request(ib->db), packet = db_max_packet(ib->db);
	/* An enveloped held event also keeps its canonical event
	 * (held_events.event): at most the body again plus the attributes its
	 * headers carried (bounded by the properties' column), also as hex. */
	bool env = ib->conf->envelope != CFG_ENVELOPE_NATIVE;
	size_t per = env ? 4 : 2, over = INBOX_ROW_OVERHEAD + (env ? 2u * INBOX_PROPS_COLUMN_MAX : 0);
	size_t need = per * (size_t)ib->conf->max_body + over;

	if (need <= have)
		return ST_OK;
	/* The server keeps max_allowed_packet in multiples of 1 KiB. */
	snprintf(why, cap,
	         "INBOX_MAX_BODY=%ld needs the database's max_allowed_packet >= %zu (the server has %zu): raise"
	         " max_allowed_packet (SET GLOBAL and the server's configuration) or lower INBOX_MAX_BODY to %zu",
	         ib->conf->max_body, (need + (packet - have) + 1023) / 1024 * 1024, packet,
	         have > over ? (have - over) / per : 0);
	return ST_ERR_INVALID;
}

void inbox_close(struct inbox **ibp)
{
	struct inbox *ib;

	if (ibp == NULL || *ibp == NULL)
		return;
	ib = *ibp;
	/* Statements belong to the db and die with it. */
	effects_close(&ib->fx);
	free(ib->hrows);
	free(ib->hbuf);
	free(ib->hex);
	free(ib->key_of);
	free(ib->sorted);
	free(ib->keys);
	free(ib->keymsg);
	free(ib->order_ids);
	free(ib->pend);
	free(ib->orders);
	free(ib->ostate);
	free(ib->klater);
	free(ib->sub_in);
	free(ib->sub_res);
	free(ib->sub_of);
	sqlbuf_free(&ib->req);
	sqlbuf_free(&ib->vals);
	for (int s = 0; s < W_NSECT; s++)
		sqlbuf_free(&ib->w[s]);
	free(ib);
	*ibp = NULL;
}

/* Room for a batch of n. */
int inbox_reserve(struct inbox *ib, int n)
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
	GROW(keymsg);
	GROW(order_ids);
	GROW(pend);
	GROW(orders);
	GROW(ostate);
	GROW(klater);
	GROW(sub_in);
	GROW(sub_res);
	GROW(sub_of);
#undef GROW
	ib->cap = n;
	return ST_OK;
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

int inbox_order_cmp(const void *a, const void *b)
{
	return strcmp(((const struct inbox_agg *)a)->id, ((const struct inbox_agg *)b)->id);
}

struct inbox_agg *inbox_find_order(struct inbox *ib, const char *id)
{
	struct inbox_agg key;

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

/* An order as read under its lock: held count, and status/version/flags
 * of its row (status NULL: no order yet).  One place for the batch claim
 * and for hold expiry. */
static int inbox_order_fill(struct inbox_agg *o, const char *id, int64_t held, const char *status,
                            int64_t version, int64_t flags)
{
	memset(o, 0, sizeof *o);
	snprintf(o->id, sizeof o->id, "%s", id);
	o->held = held;
	if (status == NULL) {
		o->state = ORDER_NONE;
		return ST_OK;
	}
	int st = agg_state_from_name(status);
	if (st < 0)
		return ST_ERR_DB;
	o->state = st;
	o->version = version;
	o->flags = (unsigned)flags;
	return ST_OK;
}

/* A whole integer column of a text row, or ST_ERR_DB. */
int inbox_col_i64(const char *v, int64_t *out)
{
	char *end;
	long long x;

	if (v == NULL)
		return ST_ERR_DB;
	errno = 0;
	x = strtoll(v, &end, 10);
	if (errno != 0 || end == v || *end != '\0')
		return ST_ERR_DB;
	*out = x;
	return ST_OK;
}

/* The batch's key (source, message_id), or NULL.  Keys are in index
 * order (inbox_claim), so bisect. */
static struct inbox_key *inbox_key_find(struct inbox *ib, const char *source, const char *message_id)
{
	int lo = 0, hi = ib->nkeys - 1;

	while (lo <= hi) {
		int mid = (lo + hi) / 2;
		const struct msg *m = ib->keymsg[mid];
		int c = strcmp(m->source, source);

		if (c == 0)
			c = strcmp(m->message_id, message_id);
		if (c == 0)
			return &ib->keys[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return NULL;
}

/* The claim's result rows (statements 0 and 1 lock the orders and insert
 * the keys): statement 2 lists the keys that are not ours
 * (source, message_id, stored hash, and the ledger's row of ours),
 * statement 3 the locked orders (order_id, held, status, version, flags),
 * statement 4 their held events read back whole (inbox_sql_held_read). */
int inbox_claim_row(void *arg, int stmt, const char *const *v, const unsigned long *lens, int ncols)
{
	struct inbox *ib = arg;

	(void)lens;
	if (stmt == 2 && ncols == 7) {
		struct inbox_key *k;

		if (v[0] == NULL || v[1] == NULL || v[6] == NULL)
			return ST_ERR_DB;
		k = inbox_key_find(ib, v[0], v[1]);
		if (k == NULL)
			return ST_ERR_DB; /* a row we did not ask for */
		if (strcmp(v[6], "1") != 0) {
			/* Another claim's: its stored hash decides. */
			if (v[2] == NULL)
				return ST_ERR_DB;
			k->mine = false;
			snprintf(k->stored, sizeof k->stored, "%s", v[2]);
			return ST_OK;
		}
		/*
		 * A key the claim inserted whose effect the ledger holds: its
		 * inbox row was deleted by retention (or by hand) and it came
		 * back, reused by its producer or replayed.  It is not new:
		 * the ledger is a longer memory than processed_messages, and
		 * its UNIQUE index on the key would refuse a second effect
		 * anyway.  It is decided against the ledger row as against a
		 * stored inbox row (inbox_known): a duplicate when the payload
		 * is the same, a conflict otherwise, the first one standing.
		 * Its inbox row is deleted again in the write (inbox_run), so
		 * it leaves no row, like any duplicate or conflict.
		 */
		if (v[3] == NULL || v[4] == NULL)
			return ST_ERR_DB;
		k->mine = false;
		k->forgotten = true;
		snprintf(k->stored, sizeof k->stored, "%s", v[5] != NULL ? v[5] : "");
		snprintf(k->order_id, sizeof k->order_id, "%s", v[3]);
		snprintf(k->type, sizeof k->type, "%s", v[4]);
		return ST_OK;
	}
	if (stmt == 3 && ncols == (lc_sequenced(ib->bind->def) ? 6 : 5)) {
		int64_t held, version = 0, flags = 0, emitted = 0;
		int rc;

		if (ib->norders >= ib->cap || v[0] == NULL || inbox_col_i64(v[1], &held) != ST_OK)
			return ST_ERR_DB;
		if (v[2] != NULL && (inbox_col_i64(v[3], &version) != ST_OK || inbox_col_i64(v[4], &flags) != ST_OK ||
		                     (ncols == 6 && inbox_col_i64(v[5], &emitted) != ST_OK)))
			return ST_ERR_DB;
		rc = inbox_order_fill(&ib->orders[ib->norders], v[0], held, v[2], version, flags);
		ib->orders[ib->norders++].emitted = emitted;
		return rc;
	}
	if (stmt == 4)
		return inbox_hrow_add(ib, v, lens, ncols);
	return ST_ERR_DB;
}

int inbox_str_cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The batch's distinct keys in index order (ib->keys, ib->keymsg, and
 * ib->key_of per message), and its distinct orders sorted by id
 * (ib->order_ids, ib->nlock): every key's order, ours or not. */
static void inbox_claim_index(struct inbox *ib, const struct inbox_in *in, int n)
{
	int norder = 0, k = 0;

	for (int i = 0; i < n; i++)
		ib->sorted[i] = (struct inbox_sortent){ .m = in[i].msg, .i = i };
	qsort(ib->sorted, (size_t)n, sizeof *ib->sorted, inbox_key_cmp);
	ib->nkeys = 0;
	for (int s = 0; s < n; s++) {
		int i = ib->sorted[s].i;
		const struct msg *m = in[i].msg;

		if (ib->nkeys > 0) {
			const struct msg *p = ib->keymsg[ib->nkeys - 1];
			if (strcmp(p->source, m->source) == 0 && strcmp(p->message_id, m->message_id) == 0) {
				ib->key_of[i] = ib->nkeys - 1; /* the same key again in this batch */
				continue;
			}
		}
		ib->key_of[i] = ib->nkeys;
		ib->keymsg[ib->nkeys] = m;
		ib->keys[ib->nkeys++] = (struct inbox_key){ .first = i, .mine = true, .forgotten = false };
		ib->order_ids[norder++] = m->order_id;
	}
	qsort(ib->order_ids, (size_t)norder, sizeof *ib->order_ids, inbox_str_cmp);
	for (int i = 0; i < norder; i++)
		if (k == 0 || strcmp(ib->order_ids[k - 1], ib->order_ids[i]) != 0)
			ib->order_ids[k++] = ib->order_ids[i];
	ib->nlock = k;
}

/* "order_id IN (...)": the batch's orders, sorted. */
static void inbox_sql_order_ids(const struct inbox *ib, struct sqlbuf *q)
{
	sqlbuf_sql(q, ib->sql.key_in);
	sqlbuf_list(q);
	for (int i = 0; i < ib->nlock; i++) {
		sqlbuf_item(q);
		sqlbuf_str(q, ib->order_ids[i]);
	}
	sqlbuf_sql(q, ")");
}

/* Claim statement 0: the order_locks rows of the batch's orders, sorted
 * by id, created or bumped (a real write: a certification-based cluster
 * only sees rows that change). */
void inbox_sql_lock_orders(const struct inbox *ib, struct sqlbuf *q)
{
	sqlbuf_sql(q, ib->sql.lock_rows);
	sqlbuf_list(q);
	for (int i = 0; i < ib->nlock; i++) {
		sqlbuf_row(q);
		sqlbuf_str(q, ib->order_ids[i]);
		sqlbuf_value(q, "0");
		sqlbuf_value(q, "1");
		sqlbuf_row_end(q);
	}
	sqlbuf_sql(q, ib->sql.lock_rows_tail);
}

/* Claim statement 1: every distinct key in one multi-row INSERT, in index
 * order, the rows we insert carrying the transaction's claim token. */
static void inbox_sql_claim_keys(const struct inbox *ib, struct sqlbuf *q, const struct inbox_in *in)
{
	sqlbuf_sql(q, "INSERT INTO processed_messages (consumer, source, message_id, payload_sha256, type, order_id,"
	              " outcome, published_at, processed_at, claim) VALUES ");
	sqlbuf_list(q);
	for (int k = 0; k < ib->nkeys; k++) {
		int i = ib->keys[k].first;
		const struct msg *m = in[i].msg;
		int64_t pub = in[i].published_us > 0 && in[i].published_us <= INBOX_PUBLISHED_US_MAX ? in[i].published_us : 0;

		sqlbuf_row(q);
		sqlbuf_str(q, ib->conf->consumer);
		sqlbuf_str(q, m->source);
		sqlbuf_str(q, m->message_id);
		sqlbuf_str(q, ib->hex[i]);
		sqlbuf_str(q, m->type_name);
		sqlbuf_str(q, m->order_id);
		sqlbuf_value(q, "'applied'");
		if (pub > 0)
			sqlbuf_unix_us(q, pub);
		else
			sqlbuf_value(q, "NULL");
		sqlbuf_value(q, "NOW(6)");
		sqlbuf_i64(q, ib->token);
		sqlbuf_row_end(q);
	}
	/* A key already taken stays as it is: the no-op update waits for,
	 * then locks, the row of a concurrent claim, as a failed INSERT would,
	 * and a value its column refuses is still an error (INSERT IGNORE
	 * would store it cut). */
	sqlbuf_sql(q, " ON DUPLICATE KEY UPDATE claim = processed_messages.claim;");
}

/*
 * Claim statement 2, one row per key that is not new: a key another claim
 * holds (its stored hash says duplicate or conflict), or a key we inserted
 * whose effect the ledger holds (uq_order_events_message: it was forgotten,
 * see inbox_claim_row).  One range over processed_messages, where every key
 * of the batch has a row now, ours or not; the ledger is looked up only for
 * ours.  Read after our claim, so no transaction can add a ledger row
 * meanwhile: only the claimant of a key writes its effect.
 */
static void inbox_sql_known_keys(struct inbox *ib, struct sqlbuf *q)
{
	sqlbuf_sql(q, ib->sql.read_keys);
	sqlbuf_i64(q, ib->token);
	sqlbuf_sql(q, ib->sql.read_keys_join);
	sqlbuf_i64(q, ib->token);
	sqlbuf_sql(q, " WHERE p.consumer = ");
	sqlbuf_str(q, ib->conf->consumer);
	sqlbuf_sql(q, " AND ");
	inbox_sql_keys(ib, q, "p.");
	sqlbuf_sql(q, " AND (NOT (p.claim <=> ");
	sqlbuf_i64(q, ib->token);
	sqlbuf_sql(q, ") OR e.message_id IS NOT NULL);");
}

/* Claim statement 3: the locked orders, as they stand. */
void inbox_sql_read_orders(const struct inbox *ib, struct sqlbuf *q)
{
	sqlbuf_sql(q, ib->sql.read_aggs);
	inbox_sql_order_ids(ib, q);
}

/* The claim's rows when its request opens with the NOWAIT lock
 * (inbox_claim): that statement's rows are not needed, the others are the
 * claim's own, one statement later. */
static int inbox_claim_row_locked(void *arg, int stmt, const char *const *v, const unsigned long *lens, int ncols)
{
	return stmt == 0 ? ST_OK : inbox_claim_row(arg, stmt - 1, v, lens, ncols);
}

/* Round trip 1: lock the orders of the batch (sorted), claim its distinct
 * keys (sorted), and read back the keys that are not ours (with the
 * ledger rows of ours), the orders, and their held events whole, up to
 * what one read carries (inbox_claim_row reads the answers): a batch that
 * releases held events needs no round trip of its own to read them.
 * nowait: the request opens by locking the batch's existing orders
 * without waiting (FOR UPDATE NOWAIT): if another transaction holds one,
 * that statement fails at once and nothing of the claim runs
 * (INBOX_HELD_ELSEWHERE; the transaction holds nothing). */
static int inbox_claim(struct inbox *ib, const struct inbox_in *in, int n, bool nowait)
{
	struct sqlbuf *q = &ib->req;
	int rc;

	inbox_claim_index(ib, in, n);
	rc = inbox_token(&ib->token);
	if (rc != ST_OK)
		return rc;
	if (ib->conf->outbox_dispatch == CFG_DISPATCH_THREAD)
		ib->emit = outbox_dispatcher_begin(ib->out, ib->token);
	/* Orders first, then keys: a key's row is only ever written under its
	 * order's lock (a released or expired held event's outcome is written
	 * by whoever holds the order), so a batch holding a duplicate of a
	 * held event must not lock that key before the order, or it and the
	 * releasing batch deadlock.  Every key's order, ours or not, sorted
	 * and distinct: a duplicate's order costs a lock, and spares a round
	 * trip. */
	sqlbuf_reset(q);
	if (nowait) {
		sqlbuf_sql(q, ib->sql.probe);
		inbox_sql_order_ids(ib, q);
		sqlbuf_sql(q, " FOR UPDATE NOWAIT;");
	}
	inbox_sql_lock_orders(ib, q);
	inbox_sql_claim_keys(ib, q, in);
	inbox_sql_known_keys(ib, q);
	inbox_sql_read_orders(ib, q);
	sqlbuf_sql(q, ";");
	inbox_sql_held_read(ib, q, ib->order_ids, ib->nlock, NULL, 0, 0);
	rc = sqlbuf_err(q);
	if (rc != ST_OK)
		return rc;
	ib->norders = 0;
	ib->nhrows = 0;
	ib->hlen = 0;
	rc = db_multi(ib->db, q->p, q->len, nowait ? inbox_claim_row_locked : inbox_claim_row, ib);
	if (rc == ST_ERR_DB_LOCK_TIMEOUT && nowait && db_multi_failed_at(ib->db) == 0)
		return INBOX_HELD_ELSEWHERE;
	if (rc != ST_OK)
		return rc;
	if (ib->norders != ib->nlock)
		return ST_ERR_DB; /* every order was just written */
	qsort(ib->orders, (size_t)ib->norders, sizeof *ib->orders, inbox_order_cmp);
	return inbox_held_assign(ib);
}

/* A message whose key is not new: a duplicate when it carries the
 * payload the key was first seen with, else a conflict (the first one
 * stands).  A ledger row written before migration 0015 has no hash: then
 * the same order and type is the same effect, a duplicate. */
static enum inbox_outcome inbox_known(const struct inbox_key *k, const struct msg *m, const char *hex)
{
	if (k->stored[0] != '\0')
		return strcmp(k->stored, hex) == 0 ? INBOX_DUPLICATE : INBOX_CONFLICT;
	return k->forgotten && strcmp(k->order_id, m->order_id) == 0 && strcmp(k->type, m->type_name) == 0
	           ? INBOX_DUPLICATE
	           : INBOX_CONFLICT;
}

/* Delete the inbox row this transaction's claim inserted for m's key. */
static void inbox_w_unclaim(struct inbox *ib, const struct msg *m)
{
	struct sqlbuf *b = &ib->w[W_OUTCOME];

	sqlbuf_sql(b, "DELETE FROM processed_messages WHERE ");
	inbox_sql_key_is(ib, b, m->source, m->message_id);
	sqlbuf_sql(b, " AND claim = ");
	sqlbuf_i64(b, ib->token);
	sqlbuf_sql(b, ";");
}

/* Decide one message on its locked order and put its writes in the
 * document. */
static int inbox_decide(struct inbox *ib, const struct inbox_in *in, struct inbox_result *res)
{
	const struct msg *m = in->msg;
	struct inbox_agg *o = inbox_find_order(ib, m->order_id);
	struct inbox_event ev;
	struct agg_verdict v;
	enum msg_reason reason = MSG_REASON_NONE;
	bool changed = false;
	char *props = NULL;
	int rc = ST_OK;

	if (o == NULL)
		return ST_ERR_DB; /* the claim locks the order of every key it inserted */
	inbox_event_from_msg(&ev, m, in->body, in->len, in->routing_key, NULL);
	ev.deliveries = in->deliveries;
	ev.ctx = in->ctx;
	ev.skipped = in->skip;
	v = agg_decide(o->state, o->flags, m->type);
	if (lc_sequenced(ib->bind->def)) {
		bool taken;

		v = inbox_seq_verdict(o, m->seq, v, &taken);
		if (taken) {
			rc = inbox_seq_taken(ib, o, &ev, m->seq, SRC_LIVE, res);
			if (rc != ST_OK)
				return rc;
			res->outcome = INBOX_DEAD_LETTERED;
			res->state = o->state;
			return ST_OK;
		}
	}
	if (in->skip && v.decision != LC_HOLD)
		v = (struct agg_verdict){ .decision = LC_IGNORE, .next = o->state, .flags = o->flags };
	if (v.decision == LC_HOLD) {
		inbox_hold(ib, in, o);
	} else {
		/* the properties a dead-letter copy keeps, when it may need one */
		if ((v.decision == LC_INVALID || effects_count(ib->bind->def, (int)m->type) > 0) &&
		    in->props_json != NULL) {
			props = in->props_json(in->props_arg);
			ev.props = props;
		}
		rc = inbox_act(ib, o, &ev, v, SRC_LIVE, res, &changed, &reason);
	}
	if (rc == ST_OK && changed && (o->held > 0 || o->pending > 0))
		rc = inbox_release_held(ib, o, res);
	free(props);
	if (rc != ST_OK)
		return rc;
	/* the enums agree up to DEAD_LETTERED */
	res->outcome = reason != MSG_REASON_NONE ? INBOX_DEAD_LETTERED : (enum inbox_outcome)v.decision;
	res->state = o->state;
	return ST_OK;
}

/* End the transaction: when rc is ST_OK, write what is pending and COMMIT
 * in one request (the test fault hooks, for a message's transaction, fire
 * just before it); else, or when that fails, ROLLBACK. */
int inbox_end(struct inbox *ib, int rc, bool hooks)
{
	if (rc == ST_OK && hooks) {
		if (fault_hit("before-commit"))
			rc = ST_ERR_FAULT;
		else if (fault_hit("crash-before-commit"))
			raise(SIGKILL); /* a message that kills its worker */
	}
	/* If the connection breaks during the request we cannot know whether
	 * the COMMIT happened.  That is safe: the caller reconnects and runs
	 * the messages again; if it did happen, their keys are taken now and
	 * they are settled as duplicates instead of applied twice. */
	ib->fx_again = false;
	if (rc == ST_OK)
		rc = effects_flush(ib->fx, &ib->fx_again);
	if (rc == ST_OK) {
		rc = inbox_flush(ib, true);
		if (rc == ST_ERR_DB_CARDINALITY && ib->galera) {
			LOG(LOG_LEVEL_WARN, "the transaction lost its claim (a Galera abort); retrying the batch",
			    LOG_I("claimed", ib->nmine));
			rc = ST_ERR_DB_DEADLOCK;
		}
	}
	if (rc == ST_OK) {
		outbox_dispatcher_committed(ib->out); /* the marks went with the COMMIT */
	} else {
		db_rollback(ib->db);
		outbox_dispatcher_abort(ib->out); /* nothing of it was committed */
	}
	ib->emit = NULL;
	effects_discard(ib->fx);
	inbox_forget(ib);
	return rc;
}

/* A batch (n >= 1, room reserved) in the transaction, from the claim to
 * its end: the body of inbox_run and of inbox_run_nowait's part. */
static int inbox_batch(struct inbox *ib, const struct inbox_in *in, int n, struct inbox_result *res, bool nowait)
{
	int rc;

	ib->emit = NULL; /* inbox_claim gives the batch's copies their buffer */
	for (int i = 0; i < n; i++) {
		memset(&res[i], 0, sizeof res[i]);
		msg_sha256_hex(in[i].msg->sha256, ib->hex[i]);
	}
	ib->in = in;
	ib->npend = 0;
	rc = inbox_claim(ib, in, n, nowait);
	if (rc == INBOX_HELD_ELSEWHERE) {
		/* Nothing was claimed and nothing is locked: the caller
		 * finds out which orders (inbox_run_nowait). */
		ib->in = NULL;
		return rc;
	}
	ib->nmine = 0;
	for (int k = 0; rc == ST_OK && k < ib->nkeys; k++)
		ib->nmine += ib->keys[k].mine ? 1 : 0;
	for (int i = 0; rc == ST_OK && i < n; i++) {
		const struct inbox_key *k = &ib->keys[ib->key_of[i]];

		if (k->mine && k->first != i) {
			/* The same key again in this batch: the first one's hash
			 * stands, as the stored one would. */
			res[i].outcome = strcmp(ib->hex[k->first], ib->hex[i]) == 0 ? INBOX_DUPLICATE : INBOX_CONFLICT;
		} else if (!k->mine) {
			res[i].outcome = inbox_known(k, in[i].msg, ib->hex[i]);
			res[i].forgotten = k->forgotten;
		} else {
			rc = inbox_decide(ib, &in[i], &res[i]);
		}
	}
	/* A forgotten key leaves no row (inbox_claim_row): ours goes again. */
	for (int k = 0; rc == ST_OK && k < ib->nkeys; k++)
		if (ib->keys[k].forgotten)
			inbox_w_unclaim(ib, ib->keymsg[k]);
	/* What is still held in memory is kept in held_events. */
	for (int k = 0; rc == ST_OK && k < ib->npend; k++) {
		if (ib->pend[k] >= 0) {
			const struct inbox_in *h = &in[ib->pend[k]];
			inbox_hold_write(ib, h, inbox_find_order(ib, h->msg->order_id));
		}
	}
	ib->in = NULL;
	ib->npend = 0;
	rc = inbox_end(ib, rc, true);
	if (rc != ST_OK && ib->fx_again && !ib->fx_careful) {
		int refused = 0;

		/* The server refused a statement run over the batch's rows at
		 * once: which message's row, only a run a message at a time can
		 * tell, so the batch (rolled back) runs once more that way. */
		LOG(LOG_LEVEL_DEBUG, "the lifecycle's statements were refused for the batch; running it a message at a time",
		    LOG_S("error", db_errmsg(ib->db)));
		ib->fx_again = false;
		ib->fx_careful = true;
		rc = inbox_batch(ib, in, n, res, nowait);
		ib->fx_careful = false;
		for (int i = 0; rc == ST_OK && i < n; i++)
			for (int e = 0; e < INBOX_EVENTS_MAX; e++)
				refused += res[i].stmts_refused[e];
		if (rc == ST_OK && refused == 0) {
			/* no message's data: the server cannot run them at once */
			LOG0(LOG_LEVEL_WARN, "the database refused the lifecycle's statements run over a batch at once and"
			                     " no message's alone: on this connection they run a message at a time");
			effects_bulk_off(ib->fx);
		}
	}
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
	return inbox_batch(ib, in, n, res, false);
}

/* What the probe found of an order (ib->ostate), and whether a delivery
 * of it was left for later. */
enum { INBOX_O_GOT = 1, INBOX_O_EXISTS = 2, INBOX_O_LATER = 4 };

/* The index of an order of the batch in ib->order_ids, or -1. */
static int inbox_order_index(const struct inbox *ib, const char *id)
{
	const char *const *p = bsearch(&id, ib->order_ids, (size_t)ib->nlock, sizeof *ib->order_ids, inbox_str_cmp);

	return p != NULL ? (int)(p - ib->order_ids) : -1;
}

/* The probe's rows: statement 0 the orders locked, 1 those that exist. */
static int inbox_probe_row(void *arg, int stmt, const char *const *v, const unsigned long *lens, int ncols)
{
	struct inbox *ib = arg;
	int o;

	(void)lens;
	if (ncols != 1 || v[0] == NULL || stmt < 0 || stmt > 1)
		return ST_ERR_DB;
	o = inbox_order_index(ib, v[0]);
	if (o < 0)
		return ST_ERR_DB; /* a row we did not ask for */
	ib->ostate[o] |= stmt == 0 ? INBOX_O_GOT : INBOX_O_EXISTS;
	return ST_OK;
}

/*
 * The probe, the transaction's first round trip: lock the order_locks rows
 * of the batch's orders that no one holds, without waiting for the others
 * (SKIP LOCKED, MariaDB 10.6 and MySQL 8.0), and read which rows exist (a
 * read that takes no lock; READ COMMITTED, so it sees what is committed
 * now).  An order that exists and was not locked is another transaction's.
 * One that does not exist yet is new: the claim creates its row, and
 * waits only if another transaction is creating the same one right now
 * (an uncommitted row is neither locked here nor read).  No lock is
 * waited for, so the probe cannot deadlock, and the claim after it takes
 * the batch's locks in the same sorted order as ever.
 */
static int inbox_probe(struct inbox *ib)
{
	struct sqlbuf *q = &ib->req;
	int rc;

	memset(ib->ostate, 0, (size_t)ib->nlock * sizeof *ib->ostate);
	sqlbuf_reset(q);
	sqlbuf_sql(q, ib->sql.probe);
	inbox_sql_order_ids(ib, q);
	sqlbuf_sql(q, " FOR UPDATE SKIP LOCKED;");
	sqlbuf_sql(q, ib->sql.probe);
	inbox_sql_order_ids(ib, q);
	rc = sqlbuf_err(q);
	if (rc == ST_OK)
		rc = db_multi(ib->db, q->p, q->len, inbox_probe_row, ib);
	return rc;
}

/* Which deliveries the probe leaves for later, in delivery order: one
 * whose order another transaction holds, and every one after it that
 * shares its order or its key (inflight_split's rule, for the same
 * reasons: no event overtakes an earlier one of its order, no copy of a
 * key an earlier copy).  Returns how many. */
static int inbox_leave(struct inbox *ib, const struct inbox_in *in, int n, bool *later)
{
	int nlater = 0;

	memset(ib->klater, 0, (size_t)ib->nkeys * sizeof *ib->klater);
	for (int i = 0; i < n; i++) {
		int o = inbox_order_index(ib, in[i].msg->order_id), k = ib->key_of[i];

		later[i] = o < 0 || (ib->ostate[o] & (INBOX_O_GOT | INBOX_O_EXISTS)) == INBOX_O_EXISTS ||
		           (ib->ostate[o] & INBOX_O_LATER) || ib->klater[k];
		if (!later[i])
			continue;
		if (o >= 0)
			ib->ostate[o] |= INBOX_O_LATER;
		ib->klater[k] = true;
		nlater++;
	}
	return nlater;
}

int inbox_run_nowait(struct inbox *ib, const struct inbox_in *in, int n, struct inbox_result *res, bool *later,
                     int *nlater)
{
	int k = 0, rc;

	*nlater = 0;
	for (int i = 0; i < n; i++)
		later[i] = false;
	if (n <= 0)
		return ST_ERR_INVALID;
	rc = inbox_reserve(ib, n);
	if (rc != ST_OK)
		return rc;
	if (n < 2)
		return inbox_batch(ib, in, n, res, false);
	/* The common case first: no order of the batch is held elsewhere,
	 * and the claim's request itself takes their locks.  In a fleet
	 * whose processes share orders most batches find one held, and then
	 * the failed lock is a round trip the probe would have spared: after
	 * a failure the probe goes first, until one finds nothing held. */
	if (!ib->probe_first) {
		rc = inbox_batch(ib, in, n, res, true);
		if (rc != INBOX_HELD_ELSEWHERE)
			return rc;
		ib->probe_first = true;
	}
	inbox_claim_index(ib, in, n);
	rc = inbox_probe(ib);
	if (rc != ST_OK) {
		db_rollback(ib->db);
		inbox_forget(ib);
		return rc;
	}
	*nlater = inbox_leave(ib, in, n, later);
	if (*nlater == 0)
		ib->probe_first = false;
	if (*nlater == 0 || *nlater == n) {
		/* Nothing held elsewhere, or everything behind it: whole, in
		 * the transaction that holds the probe's locks (waiting, in
		 * the second case, as inbox_run). */
		for (int i = 0; i < n; i++)
			later[i] = false;
		*nlater = 0;
		return inbox_batch(ib, in, n, res, false);
	}
	for (int i = 0; i < n; i++) {
		if (later[i]) {
			memset(&res[i], 0, sizeof res[i]);
			continue;
		}
		ib->sub_in[k] = in[i];
		ib->sub_of[k++] = i;
	}
	rc = inbox_batch(ib, ib->sub_in, k, ib->sub_res, false);
	for (int j = 0; rc == ST_OK && j < k; j++)
		res[ib->sub_of[j]] = ib->sub_res[j];
	return rc;
}

void inbox_set_outbox(struct inbox *ib, struct outbox_dispatcher *out)
{
	ib->out = out;
}

int inbox_flush_marks(struct inbox *ib)
{
	if (outbox_dispatcher_marks_pending(ib->out) == 0)
		return ST_OK;
	return inbox_end(ib, ST_OK, false); /* the marks and the COMMIT, one round trip */
}
