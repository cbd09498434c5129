/*
 * retention.h - deleting what the retention window no longer needs:
 * processed_messages rows older than INBOX_RETENTION (never a held one) and
 * outbox rows sent longer ago than that (never an unsent one).
 *
 * The work is cut into slices: one DELETE of at most slice_rows rows in the
 * order of an index on the age column (ix_processed_messages_processed_at,
 * ix_outbox_route), each its own short transaction, so no slice holds
 * many locks, a large undo log or a Galera write set, and the caller can
 * stop between any two.  The pool's janitor runs a few slices per tick
 * within a time budget and comes back for more until it has caught up;
 * `inbox-worker cleanup` runs slices until nothing is left.
 *
 * One process at a time: a run holds the named lock
 * "inbox-worker.cleanup.<database>" (GET_LOCK) on its session and releases
 * it before it returns; a process that finds it taken does nothing and says
 * so (RETENTION_BUSY).  GET_LOCK is local to one server: on a Galera cluster
 * processes connected to different nodes do not see each other's lock, and
 * recent MariaDB releases refuse GET_LOCK outright while wsrep_on is set
 * (MDEV-30473).
 * A refused lock is logged once and the run goes on without it: deleting
 * expired rows twice is harmless, and overlapping slices at worst conflict
 * (1213), which ends that slice and is retried.
 *
 * Ownership: retention_open prepares its statements on a caller-owned db,
 * which must outlive it; retention_close frees it (NULL-safe, clears the
 * pointer).
 */
#ifndef INBOX_RETENTION_H
#define INBOX_RETENTION_H

#include <stdint.h>

#include "cfg.h"
#include "db.h"

/* The janitor's slices: rows one DELETE removes at most, and slices one
 * tick runs at most before it returns to the relay. */
#define RETENTION_SLICE_ROWS 500
#define RETENTION_TICK_SLICES 8

/* A janitor's tick starts no slice after this long (and runs
 * RETENTION_TICK_SLICES at most), so the relay and hold expiry wait for one
 * tick at most.  It is here, not in the janitor, because `inbox-worker
 * cleanup` depends on it too: its wait for the cleanup lock outlasts one
 * tick (cmd_cleanup.c checks that when it compiles). */
#define RETENTION_CLEANUP_BUDGET_MS 100

struct retention;

struct retention_limits {
	int slice_rows;  /* rows per DELETE (each its own transaction), >= 1 */
	int max_slices;  /* stop after this many slices; 0: until caught up */
	int budget_ms;   /* start no slice after this long; 0: no limit */
	int lock_wait_s; /* how long to wait for another process's run */
	int retries;     /* a slice that hits a deadlock or lock wait time-out
	                  * is retried this often (with backoff) before the run
	                  * returns; 0: the run stops and says RETENTION_MORE */
};

enum retention_state {
	RETENTION_DONE = 0, /* caught up: nothing past the window is left */
	RETENTION_MORE,     /* stopped by the limits; call again */
	RETENTION_BUSY,     /* another process holds the lock; nothing deleted */
};

int retention_open(struct retention **out, struct db *db, const struct cfg *conf);
void retention_close(struct retention **r);

/* One run within lim.  *deleted gets the rows deleted by this run.
 * Returns ST_OK (see *state) or the database error that ended the run (the
 * slice in hand is rolled back; the lock is released). */
int retention_run(struct retention *r, const struct retention_limits *lim, enum retention_state *state,
                  uint64_t *deleted);

/* What a run would delete now, without deleting anything and without the
 * lock: inbox rows past the window that are not held, sent outbox rows past
 * it (the same conditions as the DELETEs).  For `cleanup --dry-run`; rows
 * may expire between this count and a real run.  Statements are prepared
 * on db; the read is rolled back. */
int retention_count(struct db *db, const struct cfg *conf, uint64_t *inbox_rows, uint64_t *outbox_rows);

#endif
