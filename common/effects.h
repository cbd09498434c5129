/*
 * effects.h - a definition's own statements (lifecycle.h's def->stmts) run
 * in the claim's transaction: prepared once on the thread's connection,
 * executed with every parameter bound when an event takes effect.
 *
 * The caller's transaction is open: the statements' rows commit or roll
 * back with the claim, the aggregate's row and the ledger, which is what
 * makes them exactly once.  A statement refused by the message's own data
 * (a duplicate key, a foreign key, a value out of range or NULL, a CHECK)
 * is the message's fault: effects_run undoes what the event's earlier
 * statements did (a SAVEPOINT, when it has more than one) and says so with
 * ST_ERR_DB_DATA and the server's words, and the transaction goes on for
 * every other message.  Anything else (a lost connection, a deadlock, a
 * lock wait) is the server's: the code is returned as it came, and the
 * caller rolls the whole transaction back and runs it again.
 *
 * Ownership: effects_open returns a runner freed by effects_close
 * (NULL-safe, clears the pointer); its prepared statements belong to db
 * (db_reconnect prepares them again) and die with it, so the runner is
 * closed before its db.  def is borrowed and outlives the runner.
 */
#ifndef INBOX_EFFECTS_H
#define INBOX_EFFECTS_H

#include <stdbool.h>
#include <stddef.h>

#include "db.h"
#include "lifecycle.h"
#include "msg.h"

struct effects;

/* Where a statement failed to prepare: its index in def->stmts, the
 * server's words. */
struct effects_refusal {
	int stmt;
	char why[256];
};

/* Prepare every statement of def on db: ST_OK with *out (NULL when def has
 * none: nothing to run), or the database's code with *refused filled (may
 * be NULL). */
int effects_open(struct effects **out, struct db *db, const struct lc_def *def, struct effects_refusal *refused);
void effects_close(struct effects **fx);

/* One line for a refusal: "FILE:LINE: statement N of EVENT: WHY" (file
 * may be NULL: "line LINE: ..."), into buf. */
void effects_refusal_line(const struct lc_def *def, const struct effects_refusal *r, const char *file, char *buf,
                          size_t cap);

/* What an event brings to its statements' parameters: its key fields, the
 * aggregate's key, and its parsed values (m->vals, by def->events[type].sets). */
struct effects_args {
	const char *message_id;
	const char *source;
	const char *type_name;
	const char *key;
	const struct msg *m;
};

/* Run the statements of event ev for decision, reached in state (the state
 * before it): ST_OK (also when it has none), ST_ERR_DB_DATA with one line
 * in detail ("statement N of EVENT: the server's words") and nothing of
 * them left, or the server's code.  *ran: how many ran to the end. */
int effects_run(struct effects *fx, int ev, int state, enum lc_decision decision, const struct effects_args *a,
                int *ran, char *detail, size_t cap);

/*
 * Deferred, the fast way: effects_defer keeps the values of ev's
 * statements instead of running them, and effects_flush, at the end of
 * the batch, runs each statement once over every row kept (MariaDB's
 * array binding: one round trip a statement, not one a message).  The
 * order changes (statement by statement, not message by message), which
 * the arrival-order check makes harmless: every statement it accepts
 * commutes.  What one execution cannot tell is which row the server
 * refused: effects_flush then says *again, the caller rolls the batch
 * back and runs it once more with effects_run, a message at a time, where
 * a refusal is the message's own (effect-failed).  *again is also set for
 * a failure that is no row's (a server without array binding): a run that
 * then refuses nothing turns deferral off (effects_bulk_off).  A
 * connection lost, a deadlock or a lock wait is returned as it came, to
 * be retried as any other.  effects_discard forgets what was kept (a
 * batch rolled back); effects_flush forgets it too.
 */
bool effects_bulk(const struct effects *fx);
void effects_bulk_off(struct effects *fx);
int effects_defer(struct effects *fx, int ev, int state, enum lc_decision decision, const struct effects_args *a,
                  int *n);
int effects_flush(struct effects *fx, bool *again);
void effects_discard(struct effects *fx);

/* Whether ev can run statements at all (the caller keeps what a
 * dead-letter copy would need only then). */
int effects_count(const struct lc_def *def, int ev);

#endif
