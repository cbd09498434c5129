/*
 * janitor.h - the pool's housekeeping thread, one per process: the outbox
 * relay, hold expiry, the outbox, held-events and DLQ gauges, and
 * retention cleanup in slices (`inbox-worker cleanup`, cmd_cleanup.c, is
 * the same cleanup run to the end as a command).
 *
 * Ownership: pool_main fills t; the thread opens and closes every
 * connection below itself.  It owns only what it uses: its database side
 * (for the relay and hold expiry) and the retention and gauge statements
 * on it, a publisher in confirm mode for the relay, and a probe
 * connection for the DLQ's depth.
 */
#ifndef INBOX_JANITOR_H
#define INBOX_JANITOR_H

#include "pool.h"

/* A retention pass runs one tick per JANITOR_CLEANUP_TICK_MS until it has
 * caught up; a tick starts no slice after RETENTION_CLEANUP_BUDGET_MS
 * (retention.h; and runs RETENTION_TICK_SLICES at most), so the relay and
 * hold expiry wait for one tick at most, and the deletes take about a
 * tenth of one connection. */
#define JANITOR_CLEANUP_TICK_MS 1000

struct gauge;
struct mq;
struct retention;

struct janitor {
	struct pool_thread t; /* index -1 */
	struct pool_db d;
	struct mq *publisher;        /* confirm mode: the outbox relay */
	int publisher_node;          /* the broker node it starts from */
	struct mq *probe;            /* reads the DLQ's depth */
	struct retention *retention; /* prepared on first use */
	struct gauge *gauge;         /* prepared on first use */
	bool gauge_warned;           /* its failure to prepare was logged */
};

/* The thread, until the stop flag. */
void *janitor_main(void *arg);

#endif
