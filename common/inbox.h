/*
 * inbox.h - a batch's transaction: claim every key through the UNIQUE
 * index, decide each message with the order state machine, write, commit.
 *
 * The claim is an INSERT into processed_messages and nothing else decides
 * duplicates: a concurrent duplicate's INSERT waits on the first one's index
 * record lock and then fails with 1062 (or succeeds if the first rolled
 * back).  Every event of an order serialises on that order's order_locks row,
 * which exists before the order does, so an event for an unknown order can
 * never race its OrderCreated into the held set unseen.
 *
 * Side effects outside the database (compensations, notifications, the
 * dead-letter copy of an invalid transition) are written as outbox rows in
 * the same transaction and published later by outbox_relay.
 *
 * Ownership: inbox_open prepares its statements on a caller-owned db, which
 * must outlive the inbox; inbox_close frees the inbox (NULL-safe).
 */
#ifndef INBOX_INBOX_H
#define INBOX_INBOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "db.h"
#include "envelope.h"
#include "msg.h"
#include "aggregate.h"
#include "outbox.h"

struct outbox_dispatcher;

struct inbox;

enum inbox_outcome {
	INBOX_APPLIED = 0,
	INBOX_HELD,
	INBOX_IGNORED,
	INBOX_COMPENSATED,
	INBOX_DEAD_LETTERED, /* invalid-transition: the DLQ copy is in the outbox */
	INBOX_DUPLICATE,     /* same key, same hash: rolled back, ack it */
	INBOX_CONFLICT,      /* same key, other hash: rolled back, dead-letter it */
	INBOX_OUTCOME_COUNT
};

/* One delivery to record.  body/props_json are only read when the event is
 * held (kept for a later dead-letter) or dead-lettered through the outbox. */
struct inbox_in {
	const struct msg *msg;
	const void *body;
	size_t len;
	const char *routing_key;
	char *(*props_json)(const void *arg); /* malloc'd JSON of the AMQP properties */
	const void *props_arg;
	int64_t published_us; /* 0 when unknown */
	int64_t deliveries;   /* how often delivered, this time counted (x-delivery-count + 1); 0 when unknown */
	/* What the message carries into the events it causes (NULL: nothing),
	 * and its canonical event when it came in an envelope (NULL: native;
	 * envelope.h): both kept with it when it is held. */
	const struct env_context *ctx;
	const char *event;
	/* An operator's decision (dlq_skip.h): when the event's turn has come
	 * it is ignored whatever the definition says, and in a numbered
	 * definition takes its number; its inbox row's reason is skipped. */
	bool skip;
};

#define INBOX_EVENTS_MAX 16 /* lifecycle.h's LC_MAX_EVENTS */
/* A dead letter's detail the inbox decides: the server's words about a
 * statement are longer than a parse's line (MSG_DETAIL_MAX); below
 * deadletter.h's DEADLETTER_DETAIL_MAX, which also carries a note. */
#define INBOX_DETAIL_MAX 400

struct inbox_result {
	enum inbox_outcome outcome;
	/* When outcome is INBOX_DEAD_LETTERED: why (invalid-transition, or
	 * effect-failed: a statement of the definition refused the message's
	 * data), and the detail its dead-letter copy carries. */
	enum msg_reason reason;
	char detail[INBOX_DETAIL_MAX];
	int released;      /* held events applied/settled by this transaction */
	/* The released ones by their final outcome (INBOX_APPLIED,
	 * INBOX_IGNORED, INBOX_COMPENSATED, INBOX_DEAD_LETTERED) and the
	 * dead-lettered ones by reason (invalid-transition, or why a stored
	 * body no longer parses): what /metrics counts them as. */
	int released_as[INBOX_OUTCOME_COUNT];
	int released_reason[MSG_REASON_COUNT];
	int outbox_rows;   /* rows written to the outbox */
	/* The lifecycle's own statements this transaction ran (they commit
	 * with it) and refused (effect-failed), by event index: the
	 * delivery's and those of every event it released. */
	uint16_t stmts_ran[INBOX_EVENTS_MAX], stmts_refused[INBOX_EVENTS_MAX];
	int state;         /* the aggregate's, after: an index of the bound definition */
	/* A duplicate or conflict of a key the inbox had forgotten (its row
	 * deleted by retention) and the ledger remembers. */
	bool forgotten;
};

int inbox_open(struct inbox **out, struct db *db, const struct cfg *conf);
void inbox_close(struct inbox **ib);

/* Whether every body INBOX_MAX_BODY accepts can be held and dead-lettered
 * through this connection: a row carries the body as hex (twice its
 * length) and must fit one request below the server's max_allowed_packet
 * (db_max_request, read at connect).  ST_OK, or ST_ERR_INVALID with one
 * line in why naming both settings and the remedy. */
int inbox_limits(const struct inbox *ib, char *why, size_t cap);

/*
 * The transaction of a batch of n messages (n >= 1), from its first
 * statement to its end: inbox_run opens it, runs it and commits it or rolls
 * it back; nobody else ends it.  Two round trips and the COMMIT, however
 * many messages: one claims every key and locks every order of the batch,
 * one writes every row the batch decided (held events to release add round
 * trips of their own).  Messages are decided in delivery order against the
 * order state as it evolves inside the batch; a duplicate or a conflict
 * (res[i].outcome) touches only itself.
 * ST_OK: committed, res[i] says what became of in[i].
 * ST_ERR_DB_DEADLOCK / ST_ERR_DB_LOCK_TIMEOUT: rolled back; run it again.
 * ST_ERR_DB_DATA: the database refused a value of one of the messages;
 * rolled back (run them one at a time to find which).  ST_ERR_DB_CONN: the
 * connection is gone and, if it broke during COMMIT, the outcome is
 * unknown; reconnect and run it again — the claim makes that safe.
 * ST_ERR_FAULT: a test fault fired before COMMIT; rolled back.
 */
int inbox_run(struct inbox *ib, const struct inbox_in *in, int n, struct inbox_result *res);

/*
 * inbox_run, without waiting for an order another transaction holds (one
 * of another process's threads, or of this one's).  The claim's request
 * first locks the batch's orders without waiting (FOR UPDATE NOWAIT):
 * when no one else holds one, the batch runs whole in the round trips of
 * inbox_run.  Otherwise that statement fails at once, nothing of the
 * claim has run, and one round trip takes the locks of the batch's orders
 * that no one holds (SELECT ... FOR UPDATE SKIP LOCKED) and reads which
 * exist; a delivery
 * whose order is held elsewhere is left for later (later[i], *nlater),
 * and so is every delivery after it that shares its order or its message
 * key (so that nothing overtakes an earlier event of its order, nor an
 * earlier copy of its key); the rest is run as inbox_run runs a batch, in
 * the transaction that holds those locks.  The caller settles the ones
 * left, in delivery order, in a transaction of its own right after
 * (inbox_run, which waits).  When every delivery, or none, would be left,
 * the batch runs whole, as inbox_run.  res[i] is only meaningful where
 * later[i] is false.  Returns as inbox_run.  On a Galera cluster row locks
 * are local to a node: orders held on this node are left for later, and a
 * transaction of another node that wrote the same order makes one COMMIT
 * fail certification (ST_ERR_DB_DEADLOCK: run it again), as without this.
 */
int inbox_run_nowait(struct inbox *ib, const struct inbox_in *in, int n, struct inbox_result *res, bool *later,
                     int *nlater);

/* The thread's outbox dispatcher (borrowed, outliving ib; NULL: none):
 * with INBOX_OUTBOX_DISPATCH=thread a batch's rows are tagged and copied
 * to it (outbox_dispatcher_begin), and every write carries its pending
 * marks.  The thread publishes after the commit itself. */
void inbox_set_outbox(struct inbox *ib, struct outbox_dispatcher *out);

/* Write the pending marks in a transaction of their own (an idle thread:
 * no next transaction to carry them). */
int inbox_flush_marks(struct inbox *ib);

/* Dead-letter held events older than the hold TTL through the outbox, at
 * most limit of them; *expired gets the count. */
int inbox_expire_holds(struct inbox *ib, int limit, int *expired);

const char *inbox_outcome_name(enum inbox_outcome o);

#endif
