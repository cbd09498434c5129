/*
 * inbox.c - the transaction at the heart of the worker, for a batch of
 * messages (a batch may be one message).
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
 *   3. The write (inbox_flush): those statements and the COMMIT in one
 *      request (the test fault hooks fire just before it).
 * inbox_run_nowait (the worker's batches) opens the claim's request with
 * the batch's order locks taken without waiting (FOR UPDATE NOWAIT); only
 * when one is held elsewhere, and that statement failed before anything
 * else ran, does it send a round trip before the claim, the probe
 * (inbox_probe): it locks the batch's orders that no one holds, still
 * without waiting, and leaves the deliveries of the others for a second
 * transaction (issue 25; doc/fleet.md).
 * Held events to re-evaluate (an order changed and has some) are read in
 * pages of 64 after writing what is pending (without the COMMIT), so the
 * reads see the batch's own writes; that is the one case with more round
 * trips.  A released event is read back whole and parsed again
 * (msg_parse), so it takes effect with every field of its data exactly as
 * it would have arriving in order.
 *
 * One owner: inbox_run opens the transaction (autocommit is off: the
 * claim opens it), runs it and ends it in inbox_end; each kind of row is
 * written in one place, its section of inbox_flush, which the janitor's
 * hold expiry uses too.  The SQL is portable between MariaDB 10.11 and
 * MySQL 8.0 (multi-row INSERT ... ON DUPLICATE KEY UPDATE, no RETURNING).
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

#include <jansson.h>

#include "array.h"
#include "fault.h"
#include "lifecycle_schema.h"
#include "log.h"
#include "outbox.h"
#include "outbox_dispatch.h"
#include "sqlbuf.h"
#include "status.h"

/* The widths of the columns a held event is kept in (migrations/0002):
 * what a stored row may hold, whatever INBOX_MAX_BODY says today — it may
 * have been larger when the event was held. */
#define INBOX_BODY_COLUMN_MAX 16777215u /* MEDIUMBLOB */
#define INBOX_PROPS_COLUMN_MAX 65535u   /* TEXT */
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
/* What one read of held events carries back at most (inbox_held_read):
 * the bytes of their stored values, each row counted INBOX_HELD_ROW_COST
 * more for its ids and names, and always the first row, however large.
 * The claim reads the held events of the batch's orders within it, so a
 * batch releases them without a round trip of its own (issue 43: one read
 * per held event kept a batch open for a minute on a slow link); an order
 * whose held events outgrow it is read on a page at a time. */
#define INBOX_HELD_READ_MAX (4u * 1024u * 1024u)
#define INBOX_HELD_ROW_COST 512u
/* Held events one pass of hold expiry takes at most (inbox_expire_holds). */
#define INBOX_EXPIRE_MAX 64
/* processed_messages.published_at is filled with FROM_UNIXTIME, whose range
 * ends at 2038-01-19 on MariaDB 10.11; strict mode refuses a row past it.
 * The header only measures latency, so a value out of range is dropped
 * instead of costing the message anything. */
#define INBOX_PUBLISHED_US_MAX (INT64_C(2147483647) * 1000000)
/* A request buffer grown past this (a batch with large held bodies) is
 * given back after the transaction, so one large message does not pin its
 * memory. */
#define INBOX_SQL_KEEP (256u * 1024u)

/* The write's statements, in the order they run (inbox_flush). */
enum { W_DEL, W_HOLD, W_ORDER, W_EVENT, W_OUTBOX, W_OUTCOME, W_LOCK, W_MARK, W_NSECT };
/* inbox_claim with its NOWAIT lock found an order another transaction
 * holds (not a status: it never leaves this file). */
#define INBOX_HELD_ELSEWHERE 1

/* An aggregate of the transaction, locked: its state as it evolves. */
struct inbox_agg {
	char id[MSG_ORDER_ID_MAX + 1];
	int state; /* an index of the bound definition */
	unsigned flags;
	int64_t version;
	int64_t held;
	/* Events of this batch held in memory (inbox_hold): not written
	 * unless still held when the batch ends. */
	int pending;
	/* Not yet written: the row (dirty), the held count (held_dirty). */
	bool dirty, held_dirty;
	/* Its held events read with the claim (inbox_held_read): hcount rows
	 * of ib->hrows from hfirst, the last one's id hlast; hall: they are
	 * all of them (else the rest is read a page at a time). */
	int hfirst, hcount;
	int64_t hlast;
	bool hall;
	/* Per set column (agg_binding cols): the value the last event that
	 * took effect gave it, as SQL text at ib->vals.p + col[c] - 1; 0: none
	 * (the column keeps what it has). */
	uint32_t col[AGG_COLS_MAX];
};

/* The SQL that names the bound definition's tables and columns, built once
 * by inbox_open (identifiers validated by lc_load, backtick-quoted): for
 * the order definition, the statements this file always ran. */
#define INBOX_NAME_SQL 512
struct inbox_names {
	char lock_rows[INBOX_NAME_SQL];   /* INSERT INTO `<locks>` (`<key>`, held, locks) VALUES */
	char lock_rows_tail[INBOX_NAME_SQL];
	char key_in[INBOX_NAME_SQL];      /* `<key>` IN ( */
	char read_aggs[INBOX_NAME_SQL];   /* the locked aggregates, as they stand */
	char read_keys[INBOX_NAME_SQL];      /* the keys that are not new, up to the claim token */
	char read_keys_join[INBOX_NAME_SQL]; /* ... the ledger joined, up to the claim token */
	char probe[INBOX_NAME_SQL];       /* SELECT `<key>` FROM `<locks>` WHERE */
	char held_set[INBOX_NAME_SQL];    /* UPDATE `<locks>` SET held = */
	char held_where[INBOX_NAME_SQL];  /*  WHERE `<key>` = */
	char agg_head[2048], agg_tail[8192];
	char event_head[INBOX_NAME_SQL];
	char table[LC_SCHEMA_TABLES][LC_NAME_MAX + 16]; /* the aggregate's, its ledger, its locks */
};

/* A message of the batch, to sort by key. */
struct inbox_sortent {
	const struct msg *m;
	int i;
};

/* A distinct key of the batch, as claimed. */
struct inbox_key {
	int first;         /* index of its first message in delivery order */
	bool mine;         /* the claim inserted it, and it is new */
	/* Forgotten: the claim inserted it, but the ledger holds its effect
	 * (inbox_claim_row, statement 4); not new, so not mine. */
	bool forgotten;
	char stored[65];   /* when not mine: the hash of the row before us ("": a
	                    * ledger row written before migration 0015) */
	/* When forgotten: the order and type of its effect in the ledger. */
	char order_id[MSG_ORDER_ID_MAX + 1];
	char type[MSG_TYPE_NAME_MAX + 1];
};

/* A held event read back whole (inbox_held_read).  Its values, in the
 * order of the read's columns (HV_*), are NUL-terminated in ib->hbuf at
 * off[], len[] bytes each, SQL NULL where null has the bit. */
enum { HV_ORDER, HV_SOURCE, HV_MID, HV_TYPE, HV_RK, HV_PROPS, HV_BODY, HV_EVENT, HV_CONTEXT, HV_N };
struct inbox_hrow {
	int64_t id;
	size_t off[HV_N];
	size_t len[HV_N];
	unsigned null;
	int64_t matched; /* n: the rows of its order the read's condition matched */
	bool settled;    /* released in this transaction: its row is deleted in the write */
};

struct inbox {
	struct db *db;
	const struct cfg *conf;
	struct db_stmt *lock_touch;
	struct db_stmt *lock_read;
	struct db_stmt *held_get;
	struct db_stmt *expired_list;
	struct db_stmt *ledger_probe;
	/* Held events read back whole (inbox_held_read), in the order their
	 * order's lifecycle runs them (by order, oldest first): each value
	 * NUL-terminated in hbuf, found by its offset (hbuf grows). */
	struct inbox_hrow *hrows;
	int nhrows, hrows_cap;
	char *hbuf;
	size_t hlen, hcap;
	/* The batch in hand, grown to the largest batch seen: per message its
	 * hash and key, per key its claim, the orders locked. */
	int cap;
	char (*hex)[65];
	int *key_of;
	struct inbox_sortent *sorted;
	struct inbox_key *keys;
	const struct msg **keymsg;   /* per key (in index order): its first message */
	const char **order_ids;      /* the batch's orders, sorted, distinct */
	/* The batch in hand (inbox_run), and its events held in memory: their
	 * indexes in arrival order, -1 once released. */
	const struct inbox_in *in;
	int *pend;
	int npend;
	/* Galera (wsrep_on): the write request checks, just before its
	 * COMMIT, that the claim's rows are still this transaction's
	 * (inbox_claim_guard).  token/nmine: the batch's claim. */
	bool galera;
	int64_t token;
	int nmine;
	int nkeys;
	int nlock; /* distinct orders of the batch (order_ids) */
	/* inbox_run_nowait: the last NOWAIT lock failed, and no probe since
	 * found the batch's orders free; go to the probe first. */
	bool probe_first;
	/* inbox_run_nowait: per order (order_ids) what the probe found
	 * (INBOX_O_*), per key whether it is left for later, and the part of
	 * the batch that runs now with where each came from. */
	unsigned char *ostate;
	bool *klater;
	struct inbox_in *sub_in;
	struct inbox_result *sub_res;
	int *sub_of;
	struct inbox_agg *orders;
	int norders;
	/* The thread's outbox dispatcher (borrowed; NULL: none, the rows
	 * are the relay's): the copies of the transaction's rows go to emit,
	 * its buffer, when this transaction dispatches (a batch's rows; hold
	 * expiry's are the relay's), and its pending marks ride in the write
	 * (common/outbox_dispatch.h). */
	struct outbox_dispatcher *out;
	struct outbox_mem *emit;
	/* The request being built, and the rows of each write statement. */
	struct sqlbuf req;
	struct sqlbuf w[W_NSECT];
	/* The definition it runs, its statements' names, and the values set
	 * columns get in this transaction (struct inbox_agg's col). */
	const struct agg_binding *bind;
	struct inbox_names sql;
	struct sqlbuf vals;
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
	int64_t deliveries;       /* for the dead-letter copy; 0 when unknown (a held row) */
	const struct env_context *ctx; /* carried into what it causes; NULL: nothing */
	const struct msg *msg;    /* the values its sets give (msg->vals) */
	char sha[65];             /* the payload hash, hex: the ledger keeps it */
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
	NAME(read_aggs, "SELECT l.`%s`, l.held, o.status, o.version, o.flags FROM `%s` l"
	     " LEFT JOIN `%s` o ON o.id = l.`%s` WHERE l.", k, lk, t, k);
	NAME(read_keys, "SELECT p.source, p.message_id, p.payload_sha256, e.`%s`, e.type, e.payload_sha256,"
	     " p.claim <=> ", k);
	NAME(read_keys_join, " FROM processed_messages p LEFT JOIN `%s` e ON e.consumer = p.consumer"
	     " AND e.source = p.source AND e.message_id = p.message_id AND p.claim <=> ", ev);
	NAME(probe, "SELECT `%s` FROM `%s` WHERE ", k, lk);
	NAME(held_set, "UPDATE `%s` SET held = ", lk);
	NAME(held_where, " WHERE `%s` = ", k);
	NAME(event_head, "INSERT INTO `%s` (`%s`, consumer, source, message_id, type, outcome, from_status,"
	     " to_status, version, applied_at, payload_sha256) VALUES ", ev, k);
	NAME(agg_head, "INSERT INTO `%s` (id, status, version, flags", t);
	NAME(agg_tail, " ON DUPLICATE KEY UPDATE status = VALUES(status), version = VALUES(version),"
	     " flags = VALUES(flags)");
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
	w |= snprintf(n->agg_head + hl, sizeof n->agg_head - hl, ", created_at, updated_at) VALUES ") >=
	     (int)(sizeof n->agg_head - hl);
	w |= snprintf(n->agg_tail + tl, sizeof n->agg_tail - tl, ", updated_at = VALUES(updated_at)") >=
	     (int)(sizeof n->agg_tail - tl);
	return w ? ST_ERR_INVALID : ST_OK;
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

		if (!v->has)
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
	PREP(held_get, "SELECT source, message_id, type, routing_key, props, body, event, context FROM held_events"
	               " WHERE id = ? AND consumer = ?");
	PREP(expired_list, "SELECT id, order_id FROM held_events WHERE consumer = ?"
	                   " AND held_at < NOW(6) - INTERVAL ? SECOND ORDER BY id LIMIT ?");
#undef PREP
	/* The request: at most what the server takes (sqlbuf's default
	 * ceiling); the sections: cut into requests by inbox_flush. */
	ib->req.db = db;
	ib->vals.db = db;
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

/* ---- the write ------------------------------------------------------- */

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
	             " held_at, event, context) VALUES ", "" },
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
static void inbox_sql_keys(struct inbox *ib, struct sqlbuf *q, const char *alias)
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
static int inbox_flush(struct inbox *ib, bool commit)
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
			for (int c = 0; c < ib->bind->ncols; c++) {
				sqlbuf_value(o, r->col[c] != 0 ? ib->vals.p + r->col[c] - 1 : "NULL");
				r->col[c] = 0;
			}
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

static void inbox_forget(struct inbox *ib)
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
static void inbox_sql_key_is(const struct inbox *ib, struct sqlbuf *b, const char *source, const char *message_id)
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
static void inbox_w_outcome(struct inbox *ib, const struct inbox_event *ev, const char *outcome,
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
static int inbox_w_dead_letter(struct inbox *ib, const struct inbox_event *ev, const char *reason,
                               const char *detail)
{
	const struct outbox_dead_letter d = {
		.message_id = ev->message_id, .routing_key = ev->routing_key, .type = ev->type_name,
		.order_id = ev->order_id, .props = ev->props, .body = ev->body, .len = ev->len, .reason = reason,
		.detail = detail, .deliveries = ev->deliveries,
	};

	return outbox_row_dead_letter(&ib->w[W_OUTBOX], ib->conf, ib->emit, &d);
}

static const char *inbox_reason_of(enum lc_decision d)
{
	return d == LC_INVALID ? "invalid-transition" : NULL;
}

/* Where an event being carried out comes from: the delivery (its inbox
 * row says 'applied' from the claim), held_events (its row says 'held'),
 * or held in memory earlier in this batch (its row says 'applied', and
 * must say that it waited). */
enum inbox_src { SRC_LIVE, SRC_HELD_ROW, SRC_HELD_MEM };

/* Carry out a verdict (not LC_HOLD) on a locked order: the order's new
 * state, its ledger row, the outbox rows and the inbox outcome go to the
 * write.  *changed is set when the order changed (held events may now
 * apply). */
static int inbox_act(struct inbox *ib, struct inbox_agg *o, const struct inbox_event *ev,
                     struct agg_verdict v, enum inbox_src src, struct inbox_result *res, bool *changed)
{
	const struct lc_def *d = ib->bind->def;
	const char *outcome = lc_decision_outcome(v.decision);
	int nrows = 0, rc = ST_OK;

	*changed = false;
	if (v.decision == LC_APPLY || v.decision == LC_COMPENSATE) {
		struct sqlbuf *e = &ib->w[W_EVENT];

		/* in the definition's order of emits (OrderPaid, RefundRequested,
		 * InventoryReleaseRequested for orders) */
		for (int i = 0; rc == ST_OK && i < d->nemits; i++) {
			if (v.emits & (1u << i)) {
				rc = outbox_row_event(&ib->w[W_OUTBOX], ib->conf, ib->emit,
				                      i, ev->order_id, ev->message_id, ev->type_name, ev->ctx);
				nrows++;
			}
		}
		if (rc == ST_OK)
			rc = inbox_set_columns(ib, o, ev);
		if (rc == ST_OK) {
			sqlbuf_row(e);
			sqlbuf_str(e, ev->order_id);
			sqlbuf_str(e, ib->conf->consumer);
			sqlbuf_str(e, ev->source);
			sqlbuf_str(e, ev->message_id);
			sqlbuf_str(e, ev->type_name);
			sqlbuf_str(e, outcome);
			sqlbuf_str(e, o->state == ORDER_NONE ? "None" : agg_state_name(o->state));
			sqlbuf_str(e, agg_state_name(v.next));
			sqlbuf_i64(e, o->version + 1);
			sqlbuf_value(e, "NOW(6)");
			if (ev->sha[0] != '\0')
				sqlbuf_str(e, ev->sha);
			else
				sqlbuf_value(e, "NULL");
			sqlbuf_row_end(e);
			o->version++;
			o->state = v.next;
			o->flags = v.flags;
			o->dirty = true;
			*changed = true;
		}
	} else if (v.decision == LC_INVALID) {
		char detail[160];
		snprintf(detail, sizeof detail, "%s not allowed on %s in state %s", ev->type_name, ib->bind->a_name,
		         agg_state_name(o->state));
		rc = inbox_w_dead_letter(ib, ev, "invalid-transition", detail);
		nrows++;
	}
	/* On an error the rows written so far go with the rolled-back
	 * transaction (inbox_end resets the write). */
	if (rc == ST_OK && (src != SRC_LIVE || v.decision != LC_APPLY))
		inbox_w_outcome(ib, ev, outcome, inbox_reason_of(v.decision), src == SRC_HELD_MEM);
	if (rc != ST_OK)
		return rc;
	res->outbox_rows += nrows;
	return ST_OK;
}

/* A held event's key and type, as it is parsed again (inbox_held_parse). */
struct inbox_held {
	int64_t id;
	char source[MSG_WIDE_SOURCE_MAX + 1];
	char message_id[MSG_WIDE_ID_MAX + 1];
	char type[MSG_TYPE_NAME_MAX + 1];
};

/* Read with the rest of a held event (inbox_hrow_event): the canonical
 * event of an enveloped message (NULL: native, the body is the event) and
 * what it carries into what it causes. */
struct inbox_held_more {
	const char *event;
	size_t event_len;
	struct env_context ctx;
};

/* Parse a held event's stored body again, as it was parsed when it
 * arrived: the key and type it was held under stand for the AMQP
 * properties that may have carried them, and the size limit is the
 * column's (the body was within INBOX_MAX_BODY when it came).  A body that
 * no longer parses or no longer matches its row (the rules changed since)
 * gives the reason to dead-letter it with, and m->detail. */
static enum msg_reason inbox_held_parse(const struct inbox_held *h, const struct inbox_held_more *x,
                                        const char *order_id, const struct inbox_event *raw, struct msg *m)
{
	struct msg_props props = {
		.message_id = h->message_id, .message_id_len = strlen(h->message_id),
		.type = h->type, .type_len = strlen(h->type),
	};
	enum msg_reason r;

	if (x->event != NULL) {
		/* Enveloped: its canonical event, as the envelope layer read it
		 * when it came (a changed INBOX_TYPE_MAP does not reread it). */
		json_t *root = json_loadb(x->event, x->event_len, JSON_REJECT_DUPLICATES, NULL);

		r = msg_parse_event(root, NULL, m);
		json_decref(root);
	} else {
		r = msg_parse(raw->body, raw->len, INBOX_BODY_COLUMN_MAX, &props, m);
	}
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
	const char *reason = msg_reason_name(r);
	int rc = inbox_w_dead_letter(ib, raw, reason, detail);

	if (rc == ST_OK) {
		inbox_w_outcome(ib, raw, "dead_lettered", reason, false);
		res->outbox_rows++;
	}
	LOG(LOG_LEVEL_WARN, "held event cannot be applied; dead-lettered", LOG_S("message_id", raw->message_id),
	    LOG_S("order", raw->order_id), LOG_S("reason", reason), LOG_S("detail", detail));
	return rc;
}

static int inbox_col_i64(const char *v, int64_t *out);
static struct inbox_agg *inbox_find_order(struct inbox *ib, const char *id);

/* One row of a read of held events (inbox_sql_held_read: id, the HV_*
 * values, n) into ib->hrows.  Every value is checked against its column's
 * width here, so the rest of the file reads them as the strings they are. */
static int inbox_hrow_add(struct inbox *ib, const char *const *v, const unsigned long *lens, int ncols)
{
	static const size_t cap[HV_N] = {
		[HV_ORDER] = MSG_ORDER_ID_MAX, [HV_SOURCE] = MSG_WIDE_SOURCE_MAX, [HV_MID] = MSG_WIDE_ID_MAX,
		[HV_TYPE] = MSG_TYPE_NAME_MAX, [HV_RK] = 255, [HV_PROPS] = INBOX_PROPS_COLUMN_MAX,
		[HV_BODY] = INBOX_BODY_COLUMN_MAX, [HV_EVENT] = INBOX_BODY_COLUMN_MAX,
		[HV_CONTEXT] = INBOX_PROPS_COLUMN_MAX,
	};
	struct inbox_hrow *r;
	size_t need = 0;
	int64_t id, n;

	if (ncols != HV_N + 2 || inbox_col_i64(v[0], &id) != ST_OK || inbox_col_i64(v[HV_N + 1], &n) != ST_OK)
		return ST_ERR_DB;
	for (int c = 0; c < HV_N; c++) {
		bool nullable = c == HV_PROPS || c == HV_EVENT || c == HV_CONTEXT;

		if ((v[1 + c] == NULL && !nullable) || lens[1 + c] > cap[c])
			return ST_ERR_DB; /* the schema's widths and ours disagree */
		need += lens[1 + c] + 1;
	}
	if (ib->nhrows == ib->hrows_cap) {
		int ncap = ib->hrows_cap > 0 ? 2 * ib->hrows_cap : 64;
		void *p = realloc(ib->hrows, (size_t)ncap * sizeof *ib->hrows);

		if (p == NULL)
			return ST_ERR_NOMEM;
		ib->hrows = p;
		ib->hrows_cap = ncap;
	}
	if (ib->hcap - ib->hlen < need) {
		size_t ncap = ib->hcap > 0 ? 2 * ib->hcap : 64 * 1024;
		void *p;

		while (ncap - ib->hlen < need)
			ncap *= 2;
		p = realloc(ib->hbuf, ncap);
		if (p == NULL)
			return ST_ERR_NOMEM;
		ib->hbuf = p;
		ib->hcap = ncap;
	}
	r = &ib->hrows[ib->nhrows++];
	*r = (struct inbox_hrow){ .id = id, .matched = n };
	for (int c = 0; c < HV_N; c++) {
		r->off[c] = ib->hlen;
		r->len[c] = lens[1 + c];
		if (v[1 + c] == NULL)
			r->null |= 1u << c;
		else
			memcpy(ib->hbuf + ib->hlen, v[1 + c], lens[1 + c]);
		ib->hbuf[ib->hlen + lens[1 + c]] = '\0';
		ib->hlen += lens[1 + c] + 1;
	}
	return ST_OK;
}

/* Value c of held row r: NUL-terminated, or NULL for SQL NULL. */
static const char *inbox_hval(const struct inbox *ib, const struct inbox_hrow *r, int c)
{
	return (r->null & (1u << c)) != 0 ? NULL : ib->hbuf + r->off[c];
}

/*
 * A read of held events back whole, by order and oldest first (the order
 * in which their order's lifecycle runs them): those of the orders listed
 * with an id above after, or the rows listed by id.  It carries at most
 * INBOX_HELD_READ_MAX (always the first row): the window sums what the
 * rows before each one hold, and the join reads the values of only the
 * rows within it.  n is how many rows of its order the condition matched,
 * within the bound or not, so the reader knows whether it has them all.
 * One statement, so it goes in the claim's request as well as alone.
 */
static void inbox_sql_held_read(struct inbox *ib, struct sqlbuf *q, const char *const *orders, int norders,
                                const int64_t *ids, int nids, int64_t after)
{
	int n = orders != NULL ? norders : nids;

	sqlbuf_sql(q, "SELECT h.id, h.order_id, h.source, h.message_id, h.type, h.routing_key, h.props, h.body,"
	              " h.event, h.context, t.n FROM (SELECT id, COUNT(*) OVER (PARTITION BY order_id) AS n,"
	              " COALESCE(SUM(LENGTH(body) + COALESCE(LENGTH(props), 0) + COALESCE(LENGTH(event), 0)"
	              " + COALESCE(LENGTH(context), 0) + ");
	sqlbuf_i64(q, INBOX_HELD_ROW_COST);
	sqlbuf_sql(q, ") OVER (ORDER BY order_id, id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS ahead"
	              " FROM held_events WHERE consumer = ");
	sqlbuf_str(q, ib->conf->consumer);
	sqlbuf_sql(q, orders != NULL ? " AND order_id IN (" : " AND id IN (");
	sqlbuf_list(q);
	for (int i = 0; i < n; i++) {
		sqlbuf_item(q);
		if (orders != NULL)
			sqlbuf_str(q, orders[i]);
		else
			sqlbuf_i64(q, ids[i]);
	}
	sqlbuf_sql(q, ") AND id > ");
	sqlbuf_i64(q, after);
	sqlbuf_sql(q, ") t JOIN held_events h ON h.id = t.id WHERE t.ahead < ");
	sqlbuf_i64(q, INBOX_HELD_READ_MAX);
	sqlbuf_sql(q, " ORDER BY h.order_id, h.id;");
}

/* Give each locked order its held events among ib->hrows (read with the
 * claim, by order): a run of rows of one order.  hall: they are all it
 * has (n says how many matched), or it has none; else the rest is read a
 * page at a time on release.  A second run of one order (ids equal under
 * the column's collation) is left to those pages. */
static int inbox_held_assign(struct inbox *ib)
{
	for (int i = 0; i < ib->norders; i++)
		ib->orders[i].hall = ib->orders[i].held == 0;
	for (int i = 0, j; i < ib->nhrows; i = j) {
		const char *oid = inbox_hval(ib, &ib->hrows[i], HV_ORDER);
		struct inbox_agg *o = inbox_find_order(ib, oid);

		for (j = i + 1; j < ib->nhrows && strcmp(inbox_hval(ib, &ib->hrows[j], HV_ORDER), oid) == 0; j++)
			;
		if (o == NULL)
			return ST_ERR_DB; /* a row we did not ask for */
		if (o->hcount > 0) {
			o->hall = false;
			continue;
		}
		o->hfirst = i;
		o->hcount = j - i;
		o->hlast = ib->hrows[j - 1].id;
		o->hall = ib->hrows[i].matched == j - i;
	}
	return ST_OK;
}

static int inbox_held_page_row(void *arg, int stmt, const char *const *v, const unsigned long *lens, int ncols)
{
	return stmt == 0 ? inbox_hrow_add(arg, v, lens, ncols) : ST_ERR_DB;
}

/* Read the next page of order o's held events, those above after, onto
 * the end of ib->hrows (one round trip); *complete: none is left beyond
 * them. */
static int inbox_held_page(struct inbox *ib, const struct inbox_agg *o, int64_t after, bool *complete)
{
	struct sqlbuf *q = &ib->req;
	const char *id = o->id;
	int from = ib->nhrows, rc;

	sqlbuf_reset(q);
	inbox_sql_held_read(ib, q, &id, 1, NULL, 0, after);
	rc = sqlbuf_err(q);
	if (rc == ST_OK)
		rc = db_multi(ib->db, q->p, q->len, inbox_held_page_row, ib);
	sqlbuf_reset(q);
	*complete = ib->nhrows == from || ib->hrows[from].matched == ib->nhrows - from;
	return rc;
}

/* A held row as the release reads it: h its key and type, x its
 * canonical event and context, raw its routing key, properties and body
 * (borrowed from ib->hbuf until the rows are cut). */
static void inbox_hrow_event(const struct inbox *ib, const struct inbox_hrow *r, struct inbox_held *h,
                             struct inbox_held_more *x, struct inbox_event *raw)
{
	h->id = r->id;
	snprintf(h->source, sizeof h->source, "%s", inbox_hval(ib, r, HV_SOURCE));
	snprintf(h->message_id, sizeof h->message_id, "%s", inbox_hval(ib, r, HV_MID));
	snprintf(h->type, sizeof h->type, "%s", inbox_hval(ib, r, HV_TYPE));
	*raw = (struct inbox_event){
		.source = h->source, .message_id = h->message_id, .type_name = h->type,
		.body = inbox_hval(ib, r, HV_BODY), .len = r->len[HV_BODY], .routing_key = inbox_hval(ib, r, HV_RK),
		.props = inbox_hval(ib, r, HV_PROPS),
	};
	x->event = inbox_hval(ib, r, HV_EVENT);
	x->event_len = r->len[HV_EVENT];
	env_context_from_json(inbox_hval(ib, r, HV_CONTEXT), &x->ctx);
}

/* Re-evaluate one held event, read back whole, on the locked order.  One
 * that must still wait is left alone (*settled false); any other is
 * parsed again and carried out exactly as if it had just arrived, then
 * leaves held_events.  *changed: the order row changed. */
static int inbox_release_one(struct inbox *ib, struct inbox_agg *o, const struct inbox_hrow *r,
                             struct inbox_result *res, bool *settled, bool *changed)
{
	const char *type = inbox_hval(ib, r, HV_TYPE);
	struct inbox_held h;
	struct inbox_held_more x;
	struct inbox_event raw, ev;
	struct agg_verdict v;
	struct msg m;
	enum msg_reason reason;
	int t = msg_type_from_name(type, r->len[HV_TYPE]);
	int rc;

	*settled = false;
	*changed = false;
	if (t < 0)
		return ST_ERR_DB; /* we only ever store validated types */
	v = agg_decide(o->state, o->flags, (enum msg_type)t);
	if (v.decision == LC_HOLD)
		return ST_OK;
	inbox_hrow_event(ib, r, &h, &x, &raw);
	raw.order_id = o->id;
	/* Its lines carry its trace (the worker's are of the delivery in hand). */
	log_trace_set(x.ctx.trace_id, x.ctx.span_id);
	reason = inbox_held_parse(&h, &x, o->id, &raw, &m);
	if (reason != MSG_REASON_NONE) {
		rc = inbox_held_reject(ib, &raw, reason, m.detail, res);
	} else {
		inbox_event_from_msg(&ev, &m, raw.body, raw.len, raw.routing_key, raw.props);
		ev.ctx = &x.ctx;
		rc = inbox_act(ib, o, &ev, v, SRC_HELD_ROW, res, changed);
	}
	if (rc != ST_OK) {
		log_trace_clear();
		return rc;
	}
	sqlbuf_item(&ib->w[W_DEL]);
	sqlbuf_i64(&ib->w[W_DEL], h.id);
	*settled = true;
	if (reason == MSG_REASON_NONE && v.decision == LC_INVALID)
		reason = MSG_REASON_INVALID_TRANSITION;
	res->released_as[reason != MSG_REASON_NONE ? INBOX_DEAD_LETTERED : (enum inbox_outcome)v.decision]++;
	res->released_reason[reason]++;
	LOG(LOG_LEVEL_DEBUG, "held event settled", LOG_S("message_id", h.message_id), LOG_S("order", o->id),
	    LOG_S("outcome", reason != MSG_REASON_NONE ? "dead_lettered" : lc_decision_outcome(v.decision)));
	log_trace_clear();
	return ST_OK;
}

/* Re-evaluate the held rows [from, to) of ib->hrows (all of order o's),
 * oldest first, those not settled yet. */
static int inbox_release_rows(struct inbox *ib, struct inbox_agg *o, int from, int to, struct inbox_result *res,
                              int *released, bool *progress)
{
	for (int i = from; i < to && o->held > 0; i++) {
		bool settled, changed;
		int rc;

		if (ib->hrows[i].settled)
			continue;
		rc = inbox_release_one(ib, o, &ib->hrows[i], res, &settled, &changed);
		if (rc != ST_OK)
			return rc;
		if (settled) {
			ib->hrows[i].settled = true;
			o->held--;
			o->held_dirty = true;
			(*released)++;
			*progress = *progress || changed;
		}
	}
	return ST_OK;
}

/* The held events of order o that the claim's read left out (they
 * outgrew it), a page at a time after the last one it read; each page is
 * forgotten once looked at, so memory stays at one read.  Rows a page
 * releases leave held_events (the write so far is sent) before the next
 * page is read, so a later pass never reads them again. */
static int inbox_release_paged(struct inbox *ib, struct inbox_agg *o, struct inbox_result *res, int *released,
                               bool *progress)
{
	int64_t after = o->hlast;
	int mark = ib->nhrows;
	size_t mark_len = ib->hlen;
	bool complete = false;
	int rc = ST_OK;

	while (rc == ST_OK && !complete && o->held > 0) {
		if (ib->w[W_DEL].len > 0)
			rc = inbox_flush(ib, false);
		if (rc == ST_OK)
			rc = inbox_held_page(ib, o, after, &complete);
		if (rc == ST_OK)
			rc = inbox_release_rows(ib, o, mark, ib->nhrows, res, released, progress);
		if (ib->nhrows > mark)
			after = ib->hrows[ib->nhrows - 1].id;
		ib->nhrows = mark;
		ib->hlen = mark_len;
	}
	return rc;
}

/* Re-evaluate the order's events held in memory earlier in this batch, in
 * arrival order (newer than any in held_events): one that can take effect
 * now does, exactly as if it had just arrived (it was parsed from the
 * delivery in hand), and never reaches held_events.  *progress: the order
 * changed. */
static int inbox_release_pending(struct inbox *ib, struct inbox_agg *o, struct inbox_result *res,
                                 int *released, bool *progress)
{
	for (int k = 0; k < ib->npend && o->pending > 0; k++) {
		const struct inbox_in *in;
		struct inbox_event ev;
		struct agg_verdict v;
		char *props = NULL;
		bool changed = false;
		int rc;

		if (ib->pend[k] < 0)
			continue;
		in = &ib->in[ib->pend[k]];
		if (strcmp(in->msg->order_id, o->id) != 0)
			continue;
		v = agg_decide(o->state, o->flags, in->msg->type);
		if (v.decision == LC_HOLD)
			continue;
		inbox_event_from_msg(&ev, in->msg, in->body, in->len, in->routing_key, NULL);
		ev.deliveries = in->deliveries;
		ev.ctx = in->ctx;
		if (v.decision == LC_INVALID && in->props_json != NULL) {
			props = in->props_json(in->props_arg);
			ev.props = props;
		}
		rc = inbox_act(ib, o, &ev, v, SRC_HELD_MEM, res, &changed);
		free(props);
		if (rc != ST_OK)
			return rc;
		ib->pend[k] = -1;
		o->pending--;
		(*released)++;
		*progress = *progress || changed;
		res->released_as[(enum inbox_outcome)v.decision]++; /* the enums agree up to DEAD_LETTERED */
		res->released_reason[v.decision == LC_INVALID ? MSG_REASON_INVALID_TRANSITION : MSG_REASON_NONE]++;
	}
	return ST_OK;
}

/* Re-evaluate every held event of the order, oldest first — those in
 * held_events (read with the claim, and any the claim's read left out a
 * page at a time), then those held in memory in this batch — in passes
 * until a pass leaves the order as it found it: an event skipped early in
 * a pass may apply after a later one changed the order.  Passes over what
 * the claim read cost no round trip, however many events wait. */
static int inbox_release_held(struct inbox *ib, struct inbox_agg *o, struct inbox_result *res)
{
	bool progress = true;
	int released = 0, rc = ST_OK;

	while (rc == ST_OK && progress && (o->held > 0 || o->pending > 0)) {
		progress = false;
		rc = inbox_release_rows(ib, o, o->hfirst, o->hfirst + o->hcount, res, &released, &progress);
		if (rc == ST_OK && !o->hall)
			rc = inbox_release_paged(ib, o, res, &released, &progress);
		if (rc == ST_OK)
			rc = inbox_release_pending(ib, o, res, &released, &progress);
	}
	if (rc != ST_OK)
		return rc;
	res->released += released;
	return ST_OK;
}

/* Hold an event: in memory for now (the rest of the batch may release
 * it, and then it never costs a row); inbox_hold_write keeps it in
 * held_events if it is still held when the batch ends. */
static void inbox_hold(struct inbox *ib, const struct inbox_in *in, struct inbox_agg *o)
{
	ib->pend[ib->npend++] = (int)(in - ib->in);
	o->pending++;
}

/* Keep a still-held event in held_events, count it on its order's lock
 * row, and record the 'held' outcome. */
static void inbox_hold_write(struct inbox *ib, const struct inbox_in *in, struct inbox_agg *o)
{
	char *props = in->props_json != NULL ? in->props_json(in->props_arg) : NULL;
	char *context = env_context_json(in->ctx);
	struct sqlbuf *b = &ib->w[W_HOLD];
	struct inbox_event ev;

	inbox_event_from_msg(&ev, in->msg, in->body, in->len, in->routing_key, NULL);
	sqlbuf_row(b);
	sqlbuf_str(b, ib->conf->consumer);
	sqlbuf_str(b, ev.source);
	sqlbuf_str(b, ev.message_id);
	sqlbuf_str(b, ev.order_id);
	sqlbuf_str(b, ev.type_name);
	sqlbuf_str(b, ev.routing_key);
	sqlbuf_str(b, props);
	sqlbuf_bytes(b, ev.body, ev.len);
	sqlbuf_value(b, "NOW(6)");
	if (in->event != NULL)
		sqlbuf_bytes(b, in->event, strlen(in->event));
	else
		sqlbuf_value(b, "NULL");
	sqlbuf_str(b, context); /* NULL prints NULL */
	sqlbuf_row_end(b);
	free(props);
	free(context);
	inbox_w_outcome(ib, &ev, "held", NULL, true);
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
	return strcmp(((const struct inbox_agg *)a)->id, ((const struct inbox_agg *)b)->id);
}

static struct inbox_agg *inbox_find_order(struct inbox *ib, const char *id)
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
static int inbox_col_i64(const char *v, int64_t *out)
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
static int inbox_claim_row(void *arg, int stmt, const char *const *v, const unsigned long *lens, int ncols)
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
	if (stmt == 3 && ncols == 5) {
		int64_t held, version = 0, flags = 0;

		if (ib->norders >= ib->cap || v[0] == NULL || inbox_col_i64(v[1], &held) != ST_OK)
			return ST_ERR_DB;
		if (v[2] != NULL && (inbox_col_i64(v[3], &version) != ST_OK || inbox_col_i64(v[4], &flags) != ST_OK))
			return ST_ERR_DB;
		return inbox_order_fill(&ib->orders[ib->norders++], v[0], held, v[2], version, flags);
	}
	if (stmt == 4)
		return inbox_hrow_add(ib, v, lens, ncols);
	return ST_ERR_DB;
}

static int inbox_str_cmp(const void *a, const void *b)
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
static void inbox_sql_lock_orders(const struct inbox *ib, struct sqlbuf *q)
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
static void inbox_sql_read_orders(const struct inbox *ib, struct sqlbuf *q)
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
	bool changed = false;
	char *props = NULL;
	int rc = ST_OK;

	if (o == NULL)
		return ST_ERR_DB; /* the claim locks the order of every key it inserted */
	inbox_event_from_msg(&ev, m, in->body, in->len, in->routing_key, NULL);
	ev.deliveries = in->deliveries;
	ev.ctx = in->ctx;
	v = agg_decide(o->state, o->flags, m->type);
	if (v.decision == LC_HOLD) {
		inbox_hold(ib, in, o);
	} else {
		if (v.decision == LC_INVALID && in->props_json != NULL) {
			props = in->props_json(in->props_arg);
			ev.props = props;
		}
		rc = inbox_act(ib, o, &ev, v, SRC_LIVE, res, &changed);
	}
	if (rc == ST_OK && changed && (o->held > 0 || o->pending > 0))
		rc = inbox_release_held(ib, o, res);
	free(props);
	if (rc != ST_OK)
		return rc;
	res->outcome = (enum inbox_outcome)v.decision; /* the enums agree up to DEAD_LETTERED */
	res->state = o->state;
	return ST_OK;
}

/* End the transaction: when rc is ST_OK, write what is pending and COMMIT
 * in one request (the test fault hooks, for a message's transaction, fire
 * just before it); else, or when that fails, ROLLBACK. */
static int inbox_end(struct inbox *ib, int rc, bool hooks)
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
	return inbox_end(ib, rc, true);
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

/* A held event past its TTL, as listed. */
struct inbox_expiring {
	int64_t id;
	char order_id[MSG_ORDER_ID_MAX + 1];
};

/* What the log says of an expired hold once its transaction committed. */
struct inbox_expired {
	char message_id[MSG_WIDE_ID_MAX + 1];
	char order_id[MSG_ORDER_ID_MAX + 1];
	char type[MSG_TYPE_NAME_MAX + 1];
	struct env_context ctx;
};

/* Up to limit held events past the TTL, oldest first (one round trip; it
 * takes no lock, and the transaction it opens goes on). */
static int inbox_expire_list(struct inbox *ib, struct inbox_expiring *rows, int limit, int *n)
{
	struct db_param p[3] = { DBP_STR(ib->conf->consumer), DBP_I64(ib->conf->hold_ttl_s), DBP_I64(limit) };
	struct inbox_expiring spill; /* LIMIT keeps the rows within limit; spill is for safety */
	int rc = db_stmt_query(ib->expired_list, p, ARRAY_LEN(p));

	*n = 0;
	while (rc == ST_OK) {
		struct inbox_expiring *r = *n < limit ? &rows[*n] : &spill;
		struct db_col c[2] = { DBC_I64(), DBC_STR(r->order_id, sizeof r->order_id) };
		int f = db_stmt_fetch(ib->expired_list, c, ARRAY_LEN(c));

		if (f <= 0)
			return f;
		r->id = c[0].i64;
		if (*n < limit)
			(*n)++;
	}
	return rc;
}

/* The expiry request's rows: statement 0 locks the orders (no rows), 1
 * reads them and 2 the listed held events still there, as the claim's
 * statements 3 and 4 do. */
static int inbox_expire_row(void *arg, int stmt, const char *const *v, const unsigned long *lens, int ncols)
{
	return stmt == 0 ? ST_ERR_DB : inbox_claim_row(arg, stmt + 2, v, lens, ncols);
}

/* Lock the orders of the n listed rows (sorted, the claim's real write)
 * and read them and those rows whole in one round trip.  A row its order
 * released meanwhile is not read; nor one past what a read carries (the
 * next pass takes it). */
static int inbox_expire_read(struct inbox *ib, const struct inbox_expiring *rows, int n)
{
	struct sqlbuf *q = &ib->req;
	int64_t ids[INBOX_EXPIRE_MAX];
	int k = 0, rc;

	for (int i = 0; i < n; i++) {
		ib->order_ids[i] = rows[i].order_id;
		ids[i] = rows[i].id;
	}
	qsort(ib->order_ids, (size_t)n, sizeof *ib->order_ids, inbox_str_cmp);
	for (int i = 0; i < n; i++)
		if (k == 0 || strcmp(ib->order_ids[k - 1], ib->order_ids[i]) != 0)
			ib->order_ids[k++] = ib->order_ids[i];
	ib->nlock = k;
	sqlbuf_reset(q);
	inbox_sql_lock_orders(ib, q);
	inbox_sql_read_orders(ib, q);
	sqlbuf_sql(q, ";");
	inbox_sql_held_read(ib, q, NULL, 0, ids, n, 0);
	rc = sqlbuf_err(q);
	ib->norders = 0;
	ib->nhrows = 0;
	ib->hlen = 0;
	if (rc == ST_OK)
		rc = db_multi(ib->db, q->p, q->len, inbox_expire_row, ib);
	sqlbuf_reset(q);
	if (rc == ST_OK && ib->norders != ib->nlock)
		rc = ST_ERR_DB; /* every order was just written */
	if (rc == ST_OK)
		qsort(ib->orders, (size_t)ib->norders, sizeof *ib->orders, inbox_order_cmp);
	return rc;
}

/* Dead-letter every held row read back (past its TTL, under its order's
 * lock) into the write: its copy through the outbox, its outcome, its
 * row deleted, its order's held count.  log[*n]: what to log of each. */
static int inbox_expire_write(struct inbox *ib, struct inbox_expired *log, int *n)
{
	for (int i = 0; i < ib->nhrows; i++) {
		const struct inbox_hrow *r = &ib->hrows[i];
		struct inbox_agg *o = inbox_find_order(ib, inbox_hval(ib, r, HV_ORDER));
		struct inbox_held h;
		struct inbox_held_more x;
		struct inbox_event ev;
		char detail[160];
		int rc;

		if (o == NULL)
			return ST_ERR_DB; /* a row we did not ask for */
		inbox_hrow_event(ib, r, &h, &x, &ev);
		ev.order_id = o->id;
		snprintf(detail, sizeof detail, "%s held longer than INBOX_HOLD_TTL (%lds) without its prerequisite",
		         h.type, ib->conf->hold_ttl_s);
		rc = inbox_w_dead_letter(ib, &ev, "hold-expired", detail);
		if (rc != ST_OK)
			return rc;
		inbox_w_outcome(ib, &ev, "dead_lettered", "hold-expired", false);
		sqlbuf_item(&ib->w[W_DEL]);
		sqlbuf_i64(&ib->w[W_DEL], r->id);
		o->held = o->held > 0 ? o->held - 1 : 0;
		o->held_dirty = true;
		snprintf(log[*n].message_id, sizeof log[*n].message_id, "%s", h.message_id);
		snprintf(log[*n].order_id, sizeof log[*n].order_id, "%s", o->id);
		snprintf(log[*n].type, sizeof log[*n].type, "%s", h.type);
		log[*n].ctx = x.ctx;
		(*n)++;
	}
	return ST_OK;
}

/*
 * One pass of hold expiry, in one transaction of three round trips however
 * many rows it expires: list them, lock their orders and read them back
 * whole, then the write and the COMMIT (before issue 43 each row had a
 * transaction of four round trips).  A row released meanwhile by a batch
 * that held its order is passed over; only its order's lock was written.
 */
int inbox_expire_holds(struct inbox *ib, int limit, int *expired)
{
	struct inbox_expiring rows[INBOX_EXPIRE_MAX];
	struct inbox_expired *log = NULL;
	int n = 0, nlog = 0, rc;

	*expired = 0;
	if (limit > INBOX_EXPIRE_MAX)
		limit = INBOX_EXPIRE_MAX;
	if (limit <= 0)
		return ST_OK;
	rc = inbox_expire_list(ib, rows, limit, &n);
	if (rc != ST_OK || n == 0) {
		db_rollback(ib->db); /* end the read-only transaction */
		return rc;
	}
	rc = inbox_reserve(ib, n);
	if (rc == ST_OK) {
		log = malloc((size_t)n * sizeof *log);
		rc = log != NULL ? ST_OK : ST_ERR_NOMEM;
	}
	ib->emit = NULL; /* the relay publishes what expiry writes */
	if (rc == ST_OK)
		rc = inbox_expire_read(ib, rows, n);
	if (rc == ST_OK)
		rc = inbox_expire_write(ib, log, &nlog);
	/* No fault hooks here: those stand for a message's transaction. */
	rc = inbox_end(ib, rc, false);
	for (int i = 0; rc == ST_OK && i < nlog; i++) {
		log_trace_set(log[i].ctx.trace_id, log[i].ctx.span_id);
		LOG(LOG_LEVEL_INFO, "hold expired", LOG_S("message_id", log[i].message_id), LOG_S("order", log[i].order_id),
		    LOG_S("type", log[i].type), LOG_S("outcome", "dead_lettered"), LOG_S("reason", "hold-expired"));
		log_trace_clear();
	}
	if (rc == ST_OK)
		*expired = nlog;
	free(log);
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
