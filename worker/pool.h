/*
 * pool.h - `inbox-worker run`: the pool of worker threads.
 *
 * Each thread owns a consumer connection, a publisher connection (confirm
 * mode, for dead-letters and the outbox relay), a MYSQL handle and its
 * prepared statements.  Nothing is shared between threads but the read-only
 * configuration, the stop flag and the metrics counters.
 */
#ifndef INBOX_POOL_H
#define INBOX_POOL_H

#include "cfg.h"

/* Runs until SIGTERM/SIGINT; returns a process exit code. */
int pool_main(const struct cfg *conf);

/* db_open for the one-shot commands (migrate, cleanup): on failure, the
 * one line that says why (log_refused for a refused login). */
struct db;
struct cfg_db;
int pool_db_open(struct db **out, const struct cfg_db *c);

/* `inbox-worker cleanup`: one retention pass; returns an exit code. */
int cleanup_main(const struct cfg *conf);

#endif
