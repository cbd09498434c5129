/*
 * dlq_skip.h - an operator's decision on a numbered definition's dead
 * letter (`inbox-worker dlq skip`, worker/cmd_dlq.c): the number its
 * aggregate waits at is taken without the event's effect, and what was
 * held behind it is released, in one transaction of the inbox's own.
 *
 * An invalid transition in a definition the producer numbers holds its
 * aggregate at that number (inbox_write.c): every later number is held
 * until the letter is replayed under a definition that takes it, or
 * skipped.  Skipping goes through the inbox (struct inbox_in.skip), not
 * around it: the letter's key is claimed as any delivery's is, so a copy
 * that comes later is a duplicate and two operators skipping at once
 * skip once; the ledger and the inbox row say ignored, the row's reason
 * skipped.  Only the aggregate's next number is skipped: a letter whose
 * number was taken since, or that waits for an earlier one, is left with
 * the reason.
 *
 * Ownership: struct dlq_skip is the caller's, zeroed before the first
 * call; it borrows the judge's connection (dlq_judge.h), which must
 * outlive it, and keeps one inbox on it, freed by dlq_skip_close.
 */
#ifndef INBOX_DLQ_SKIP_H
#define INBOX_DLQ_SKIP_H

#include <stdbool.h>
#include <stddef.h>

#include "dlq_entry.h"
#include "dlq_judge.h"
#include "inbox.h"
#include "mq.h"

struct dlq_skip {
	struct inbox *ib;
};

/*
 * Skip e (read from delivery d) when its aggregate waits at its number;
 * with dry_run, only say whether it would.  *skipped: it was (or would
 * be); why: one line either way ("number 2 of ticket t-4 taken without
 * its effect; 1 held behind it released"; "number 1 of ticket t-4 was
 * taken ...").  ST_OK, or a database error (the letter stays; the key
 * may be reopened, which the next skip finds and goes on from).
 */
int dlq_skip_entry(struct dlq_skip *s, struct dlq_judge *j, const struct mq_delivery *d,
                   const struct dlq_entry *e, bool dry_run, bool *skipped, char *why, size_t cap);

void dlq_skip_close(struct dlq_skip *s);

#endif
