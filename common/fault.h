/*
 * fault.h - test-only fault injection.  A build configured with
 * -Dfault_hooks=true honours INBOX_FAULT=<point> (fire at that point) and
 * INBOX_FAULT_COUNT=<n> (how many times in this process, default 1), after
 * INBOX_FAULT_SKIP=<k> reaches of the point that pass (default 0).  Points:
 *   before-commit  after the claim, before COMMIT: the transaction rolls back
 *   crash-before-commit  after the claim, before COMMIT: the process kills
 *                  itself (a poison message, for the delivery limit)
 *   after-commit   after COMMIT, before the ack: the process kills itself
 *   crash-before-dispatch  after a COMMIT that wrote outbox rows, before its
 *                  thread publishes them (common/outbox.h): the process
 *                  kills itself, leaving the rows to the relay's sweep
 *   worker-stall   a consuming thread, a batch in hand, hangs without progress
 *                  until the pool stops (the watchdog test, test_notify.c)
 *   dlq-replay-after-confirm  `dlq replay`: a copy confirmed, its dead
 *                  letter not yet acked: the process kills itself
 *   verify-stop-before-requeue  `inbox-loadgen verify`: a queue browsed,
 *                  its messages not yet handed back: the process stops
 *                  itself (SIGSTOP), a verifier whose link went silent
 * The default build compiles fault_hit to false, so nothing here can fire in
 * production.
 */
#ifndef INBOX_FAULT_H
#define INBOX_FAULT_H

#include <stdbool.h>

#include "config.h"

#if INBOX_FAULT_HOOKS
bool fault_hit(const char *point);
/* Whether point is the configured one (without using up a hit). */
bool fault_armed(const char *point);
#else
static inline bool fault_hit(const char *point)
{
	(void)point;
	return false;
}
static inline bool fault_armed(const char *point)
{
	(void)point;
	return false;
}
#endif

#endif
