/*
 * outbox_dispatch.h - the committing thread's outbox dispatcher: the one
 * owner of an emitted event's way from the transaction that wrote its row
 * to the mark that says it was confirmed.
 *
 * The outbox dispatched from memory (issue 25): the transaction that
 * writes rows tags them with its claim token (outbox.claim, migration
 * 0018) and adds a copy of each to the dispatcher's buffer
 * (outbox_dispatcher_begin gives it to the row writers of outbox.h); right
 * after its COMMIT the thread publishes the copies
 * (outbox_dispatcher_after_commit), with confirms, and goes on to its next
 * batch while the broker confirms.  The confirms are read later
 * (outbox_dispatcher_poll); the rows whose copies were acked are marked
 * sent by the one mark statement (outbox_dispatcher_write_marks) in the
 * next transaction's write, no round trip of its own, or in a transaction
 * of their own once the thread is idle.  A row's fate is its own: a copy
 * returned, nacked or not publishable from here leaves that row alone,
 * unmarked, to the relay's sweep (outbox.h, after INBOX_OUTBOX_SWEEP), and
 * the rows beside it are published and marked.  Ids are stable, so a
 * swept row that was in fact published is a duplicate downstream, never a
 * new event.
 *
 * Steps and their owner, in the order one transaction takes them:
 *   outbox_dispatcher_begin        the transaction starts (inbox)
 *   row writers (outbox.h)         it appends its rows and copies (inbox)
 *   outbox_dispatcher_write_marks  its write carries the pending marks (inbox)
 *   outbox_dispatcher_committed    its COMMIT succeeded (inbox)
 *   outbox_dispatcher_abort        or it was rolled back (inbox)
 *   outbox_dispatcher_after_commit the copies are published (the thread)
 *   outbox_dispatcher_poll         confirms read, marks made (the thread)
 *   outbox_dispatcher_drain        every confirm awaited, at stop (the thread)
 *
 * The dispatcher also holds the thread's publisher, which publishes the
 * thread's own dead letters (outbox_dispatcher_publish) between the
 * copies.  Every wait on it is bounded (OUTBOX_CONFIRM_TIMEOUT_MS); a
 * publisher lost or silent is dropped without a close handshake, and what
 * it had in flight is the sweep's.
 *
 * Ownership: one per thread, embedded in its owner and never shared;
 * outbox_dispatcher_init keeps conf and name (borrowed, outliving it);
 * outbox_dispatcher_free closes the publisher and frees the copies and
 * marks.  The inbox borrows it (inbox_set_outbox).
 */
#ifndef INBOX_OUTBOX_DISPATCH_H
#define INBOX_OUTBOX_DISPATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "cfg.h"
#include "mq.h"
#include "outbox.h"
#include "sqlbuf.h"

/* Transactions whose copies may be unconfirmed at once. */
#define OUTBOX_INFLIGHT_MAX 8
/* Marks kept for the next write; past it a mark is dropped and its rows
 * are the sweep's (never reached while writes succeed: each carries them). */
#define OUTBOX_MARKS_MAX 64
/* How long a confirm may take before the publisher is taken as lost. */
#define OUTBOX_CONFIRM_TIMEOUT_MS 10000

/* One transaction's copies published from memory, until each publish has
 * its outcome.  first..last (exclusive): the publisher's sequence numbers
 * used; seq[i]: copy i's, 0 when it was not published; ok[i], once
 * settled: copy i was acked. */
struct outbox_sent {
	int64_t claim;
	struct outbox_mem mem;
	uint64_t *seq;
	bool *ok;
	int cap;
	uint64_t first, last;
	int n, acked;
	bool settled;
};

/* The rows of one transaction to mark sent: all of claim's, but the
 * message ids in except (owned), whose copies were not acked. */
struct outbox_mark {
	int64_t claim;
	char **except;
	int nexcept;
};

struct outbox_dispatcher {
	const struct cfg *conf;
	const char *name;     /* the connection's name */
	int index;            /* the thread's, for log lines */
	struct mq *pub;       /* confirm mode; NULL until needed */
	int node;             /* the broker node the next connection starts from */
	int64_t keepalive_ms; /* when pub was last serviced */
	struct outbox_mem mem; /* the open transaction's copies */
	struct outbox_sent ring[OUTBOX_INFLIGHT_MAX]; /* oldest first */
	int nsent;
	/* When an idle thread first found ring[0] (first sequence oldest)
	 * unconfirmed; 0: not waiting. */
	int64_t since_ms;
	uint64_t oldest;
	struct outbox_mark marks[OUTBOX_MARKS_MAX];
	int nmarks;
};

void outbox_dispatcher_init(struct outbox_dispatcher *d, const struct cfg *conf, const char *name, int index);
void outbox_dispatcher_free(struct outbox_dispatcher *d);

/* The transaction's side.  begin: the buffer its row writers add copies
 * to, tagged claim (NULL when d is NULL: the rows are the relay's). */
struct outbox_mem *outbox_dispatcher_begin(struct outbox_dispatcher *d, int64_t claim);
void outbox_dispatcher_abort(struct outbox_dispatcher *d);
/* The one statement that marks rows sent, as whole statements of b
 * (sqlbuf_stmt): "UPDATE outbox SET sent_at ... WHERE claim IN (...)" for
 * the marks with nothing excepted, one with "AND message_id NOT IN (...)"
 * for each of the others.  committed: they were written, with the COMMIT. */
void outbox_dispatcher_write_marks(const struct outbox_dispatcher *d, struct sqlbuf *b);
void outbox_dispatcher_committed(struct outbox_dispatcher *d);
int outbox_dispatcher_marks_pending(const struct outbox_dispatcher *d);

/* The thread's side.  after_commit: publish the committed copies without
 * waiting for their confirms (at most OUTBOX_INFLIGHT_MAX transactions,
 * and a window the publisher's outcome ring remembers, in flight).
 * poll: read the confirms that came (wait: all of them, bounded), making
 * the marks of every settled transaction.  idle: poll, service the
 * publisher, give up on a transaction unconfirmed for
 * OUTBOX_CONFIRM_TIMEOUT_MS; returns how long the thread may wait for
 * work (wait_ms, or a short poll while confirms are due).  drain: poll
 * with wait, at stop. */
void outbox_dispatcher_after_commit(struct outbox_dispatcher *d);
void outbox_dispatcher_poll(struct outbox_dispatcher *d, bool wait);
int outbox_dispatcher_idle(struct outbox_dispatcher *d, int wait_ms);
void outbox_dispatcher_drain(struct outbox_dispatcher *d);
/* Service an idle publisher (heartbeats), at most every few hundred ms. */
void outbox_dispatcher_keepalive(struct outbox_dispatcher *d);

/* Publish one message with its confirm on the thread's publisher (the
 * copies in flight settled first, so its outcome is its own), reconnecting
 * once if the publisher went away meanwhile.  ST_OK, ST_ERR_MQ_NACK, or
 * the broker error (the publisher is then dropped). */
int outbox_dispatcher_publish(struct outbox_dispatcher *d, const struct mq_message *m);
/* What the publisher last said, for a log line ("" when there is none). */
const char *outbox_dispatcher_errmsg(const struct outbox_dispatcher *d);

#endif
