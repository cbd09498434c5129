/*
 * inbox.h - one message's transaction: claim the key through the UNIQUE
 * index, decide with the order state machine, apply, and commit.
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
#include "msg.h"
#include "order.h"

struct inbox;

enum inbox_outcome {
	INBOX_APPLIED = 0,
	INBOX_HELD,
	INBOX_IGNORED,
	INBOX_COMPENSATED,
	INBOX_DEAD_LETTERED, /* invalid-transition: the DLQ copy is in the outbox */
	INBOX_DUPLICATE,     /* same key, same hash: rolled back, ack it */
	INBOX_CONFLICT,      /* same key, other hash: rolled back, dead-letter it */
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
	/* Nothing else shares the transaction: inbox_apply may end it itself
	 * (COMMIT in its last statement, or ROLLBACK of a duplicate) and says
	 * so in inbox_result.ended, saving the caller a round trip. */
	bool alone;
};

struct inbox_result {
	enum inbox_outcome outcome;
	int released;      /* held events applied/settled by this transaction */
	int outbox_rows;   /* rows written to the outbox */
	enum order_state state;
	bool ended;        /* the transaction is over: do not commit or abort it */
};

int inbox_open(struct inbox **out, struct db *db, const struct cfg *conf);
void inbox_close(struct inbox **ib);

/*
 * A message's transaction, also for a batch of messages in one transaction:
 * inbox_apply for each message (nothing is committed; a duplicate or a
 * conflict writes nothing and leaves the rest of the transaction intact),
 * then inbox_commit once — unless the message was alone and
 * inbox_result.ended says inbox_apply already ended the transaction (a lone
 * duplicate or conflict is then rolled back).
 * ST_ERR_DB_DEADLOCK / ST_ERR_DB_LOCK_TIMEOUT: call inbox_abort and retry the
 * whole transaction.  ST_ERR_DB_CONN: the connection is gone and the outcome
 * may be unknown if it broke during COMMIT; reconnect and run it again — the
 * claim makes the retry safe.  ST_ERR_FAULT (inbox_commit): a test fault
 * fired before COMMIT; rolled back.  After any other error from inbox_apply
 * call inbox_abort (after a deadlock everything is already rolled back; the
 * call is harmless).
 */
int inbox_apply(struct inbox *ib, const struct inbox_in *in, struct inbox_result *res);
int inbox_commit(struct inbox *ib);
void inbox_abort(struct inbox *ib);

/* Dead-letter held events older than the hold TTL through the outbox, at
 * most limit of them; *expired gets the count. */
int inbox_expire_holds(struct inbox *ib, int limit, int *expired);

const char *inbox_outcome_name(enum inbox_outcome o);

#endif
