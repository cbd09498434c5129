/*
 * inbox_int.h - what the inbox's files share and nothing else sees: the
 * transaction's state (struct inbox) and the types it holds, and the
 * functions one file calls in another.  inbox.c runs the batch and owns
 * the transaction (inbox_batch, inbox_end), inbox_write.c writes what it
 * decided, inbox_held.c holds, releases and expires held events.  The
 * API is inbox.h.
 */
#ifndef INBOX_INBOX_INT_H
#define INBOX_INBOX_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "inbox.h"
#include "lifecycle_schema.h"
#include "sqlbuf.h"
/* The widths of the columns a held event is kept in (migrations/0002):
 * what a stored row may hold, whatever INBOX_MAX_BODY says today — it may
 * have been larger when the event was held. */
#define INBOX_BODY_COLUMN_MAX 16777215u /* MEDIUMBLOB */
#define INBOX_PROPS_COLUMN_MAX 65535u   /* TEXT */

/* The write's statements, in the order they run (inbox_flush). */
enum { W_DEL, W_HOLD, W_ORDER, W_EVENT, W_OUTBOX, W_OUTCOME, W_LOCK, W_MARK, W_NSECT };

/* An aggregate of the transaction, locked: its state as it evolves. */
struct inbox_agg {
	char id[MSG_ORDER_ID_MAX + 1];
	int state; /* an index of the bound definition */
	unsigned flags;
	int64_t version;
	/* A numbered definition's (lc_sequenced): the events it emitted so
	 * far, whose count numbers the next one's data.sequence (1, 2, ...:
	 * a downstream worker orders by it without gaps). */
	int64_t emitted;
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
 * the order definition, the statements inbox.c always ran. */
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
	/* The definition's version as a quoted SQL literal, escaped once on
	 * the inbox's connection: every aggregate row and held event the
	 * transaction writes says it (a printable ASCII constant). */
	char version_lit[2 * LC_VERSION_MAX + 3];
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
enum { HV_ORDER, HV_SOURCE, HV_MID, HV_TYPE, HV_RK, HV_PROPS, HV_BODY, HV_EVENT, HV_CONTEXT, HV_VERSION, HV_N };
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
	/* The definition's own statements (effects.h); NULL: it has none.
	 * They are deferred to the batch's end and run once a statement,
	 * unless fx_careful: the batch runs again a message at a time
	 * because one such run was refused (fx_again, inbox_batch). */
	struct effects *fx;
	bool fx_careful, fx_again;
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
	bool skipped;             /* ignored by an operator's decision (inbox_in.skip) */
};

/* Where an event being carried out comes from: the delivery (its inbox
 * row says 'applied' from the claim), held_events (its row says 'held'),
 * or held in memory earlier in this batch (its row says 'applied', and
 * must say that it waited). */
enum inbox_src { SRC_LIVE, SRC_HELD_ROW, SRC_HELD_MEM };

/* ---- inbox.c: the batch ---------------------------------------------- */

/* The event from a parsed message, for a live delivery and a released
 * held event alike. */
void inbox_event_from_msg(struct inbox_event *ev, const struct msg *m, const void *body, size_t len,
                          const char *routing_key, const char *props);
/* Room for a batch of n. */
int inbox_reserve(struct inbox *ib, int n);
/* Locked orders (ib->orders) in id order, and one of them by id, or NULL. */
int inbox_order_cmp(const void *a, const void *b);
struct inbox_agg *inbox_find_order(struct inbox *ib, const char *id);
/* Two strings by pointer, for qsort of ib->order_ids. */
int inbox_str_cmp(const void *a, const void *b);
/* A whole integer column of a text row, or ST_ERR_DB. */
int inbox_col_i64(const char *v, int64_t *out);
/* The claim's result rows (db_multi's row callback; arg the inbox):
 * hold expiry's request reads the same orders and held events. */
int inbox_claim_row(void *arg, int stmt, const char *const *v, const unsigned long *lens, int ncols);
/* The claim's statements that lock the orders of ib->order_ids and read
 * them back. */
void inbox_sql_lock_orders(const struct inbox *ib, struct sqlbuf *q);
void inbox_sql_read_orders(const struct inbox *ib, struct sqlbuf *q);
/* End the transaction: the write and COMMIT when rc is ST_OK, else
 * ROLLBACK; returns what became of it. */
int inbox_end(struct inbox *ib, int rc, bool hooks);

/* ---- inbox_write.c: the write ---------------------------------------- */

/* The batch's distinct keys as a condition on processed_messages. */
void inbox_sql_keys(struct inbox *ib, struct sqlbuf *q, const char *alias);
/* Write what the transaction decided so far, with the COMMIT when commit
 * is set. */
int inbox_flush(struct inbox *ib, bool commit);
/* Give back what the transaction grew and forget its rows. */
void inbox_forget(struct inbox *ib);
/* The predicate of every statement on one inbox row. */
void inbox_sql_key_is(const struct inbox *ib, struct sqlbuf *b, const char *source, const char *message_id);
/* The final outcome of a key, and the dead-letter copy of an event. */
void inbox_w_outcome(struct inbox *ib, const struct inbox_event *ev, const char *outcome, const char *reason,
                     bool waited);
int inbox_w_dead_letter(struct inbox *ib, const struct inbox_event *ev, const char *reason, const char *detail);
/* Carry out a verdict (not LC_HOLD) on a locked order, the definition's
 * statements first; *reason: why it was dead-lettered instead, or
 * MSG_REASON_NONE. */
int inbox_act(struct inbox *ib, struct inbox_agg *o, const struct inbox_event *ev, struct agg_verdict v,
              enum inbox_src src, struct inbox_result *res, bool *changed, enum msg_reason *reason);
/* A sequenced definition's verdict (lc_sequenced) on event number n of o,
 * which has taken every number up to o->version: the table's verdict v
 * when n is the next, LC_HOLD when n is ahead; *taken when n was taken
 * already (by another event: a copy of the same one is settled by its
 * key before this). */
struct agg_verdict inbox_seq_verdict(const struct inbox_agg *o, int64_t n, struct agg_verdict v, bool *taken);
/* Dead-letter ev for number n taken already, from src, into the write. */
int inbox_seq_taken(struct inbox *ib, const struct inbox_agg *o, const struct inbox_event *ev, int64_t n,
                    enum inbox_src src, struct inbox_result *res);

/* ---- inbox_held.c: the held events ----------------------------------- */

/* One row of a read of held events into ib->hrows. */
int inbox_hrow_add(struct inbox *ib, const char *const *v, const unsigned long *lens, int ncols);
/* A read of held events back whole: those of the orders listed above
 * after, or the rows listed by id. */
void inbox_sql_held_read(struct inbox *ib, struct sqlbuf *q, const char *const *orders, int norders,
                         const int64_t *ids, int nids, int64_t after);
/* Give each locked order its held events among ib->hrows. */
int inbox_held_assign(struct inbox *ib);
/* Re-evaluate every held event of the order. */
int inbox_release_held(struct inbox *ib, struct inbox_agg *o, struct inbox_result *res);
/* Hold an event in memory, and keep one still held in held_events. */
void inbox_hold(struct inbox *ib, const struct inbox_in *in, struct inbox_agg *o);
void inbox_hold_write(struct inbox *ib, const struct inbox_in *in, struct inbox_agg *o);

#endif
