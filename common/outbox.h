/*
 * outbox.h - the relay that publishes outbox rows with publisher confirms.
 *
 * Rows are claimed with SELECT ... FOR UPDATE SKIP LOCKED, so several relays
 * (threads or processes) share the work without publishing a row twice in
 * the normal case; a row is marked sent only after the broker confirmed it.
 * A crash between the confirm and the commit re-publishes the row later with
 * the same message-id, which downstream consumers deduplicate.
 *
 * Each row is settled on its own: a confirmed row is marked sent whatever
 * happens to the rows beside it; a row that the broker returns (a mandatory
 * dead-letter copy with no queue bound), nacks or refuses, or one that
 * cannot be published at all (stored headers that are not a JSON object of
 * strings, a name too long for AMQP), gets attempts + 1, a backoff of its own
 * (next_attempt_at; 1 s doubling up to 60 s) and last_error, and is left
 * alone until then.  A row's failure is logged when it starts and when its
 * reason changes, and its recovery once, not every retry.
 *
 * Ownership: outbox_open prepares statements on a caller-owned db and owns
 * the row buffers (grown to fit what is stored); the mq publisher is
 * borrowed per call.
 */
#ifndef INBOX_OUTBOX_H
#define INBOX_OUTBOX_H

#include "cfg.h"
#include "db.h"
#include "mq.h"

struct outbox;

/* What one relay round did. */
struct outbox_round {
	int taken;  /* rows claimed (a round with taken == limit may have left more) */
	int sent;   /* confirmed and marked sent */
	int failed; /* returned, nacked or unpublishable: attempts + 1, retried later */
};

int outbox_open(struct outbox **out, struct db *db, const struct cfg *conf);
void outbox_close(struct outbox **ob);

/* One round over up to limit pending rows (at most 64).  Returns ST_OK, a
 * broker error (ST_ERR_MQ*: the caller reconnects the publisher; rows
 * confirmed before it are marked sent all the same, the others stay
 * pending) or a database error (the round is rolled back; every row stays
 * pending).  *r is filled when the round committed. */
int outbox_relay(struct outbox *ob, struct mq *pub, int limit, struct outbox_round *r);

/* Pending rows and the age in seconds of the oldest (0 when none), for the
 * inbox_outbox_pending and inbox_outbox_oldest_pending_seconds gauges. */
int outbox_stats(struct outbox *ob, int64_t *pending, double *oldest_s);

#endif
