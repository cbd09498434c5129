/*
 * preflight.h - the start-up checks the commands share, before any of
 * them does its work: the database connection a one-shot command opens,
 * the lifecycle definition loaded, checked and bound, the database's
 * tables held to it, and the database's migrations held to this build's
 * folder.  Each command asks for the checks it needs (cmd_run.c,
 * cmd_migrate.c, cmd_cleanup.c, cmd_dlq.c); no command includes another's
 * header.
 *
 * Ownership: each check opens and closes its own connection;
 * preflight_db_open's is the caller's to close (db_close).  The definition
 * preflight_lifecycle binds stays loaded until the process exits;
 * preflight_lifecycle_load's is the caller's to free (lc_free).
 */
#ifndef INBOX_PREFLIGHT_H
#define INBOX_PREFLIGHT_H

#include "cfg.h"
#include "db.h"
#include "lifecycle.h"

/* db_open for the one-shot commands (migrate, cleanup): on failure, the
 * one line that says why (log_refused for a refused login). */
int preflight_db_open(struct db **out, const struct cfg_db *c);

/* The definition conf names (conf->lifecycle; the built-in order one when
 * empty), loaded: NULL with errs filled when it is refused. */
struct lc_def *preflight_lifecycle_load(const struct cfg *conf, struct lc_errors *errs);

/* `run` and `dlq`: load conf->lifecycle (the built-in file when empty),
 * check it and bind it as the aggregate engine (agg_use) before any thread
 * starts.  Returns 0, or 2 after one line on stderr saying why it cannot
 * run. */
int preflight_lifecycle(const struct cfg *conf);

/* `run`, after preflight_lifecycle: 2 (one line on stderr, the first
 * difference and the remedy) when the database's tables differ from what
 * the bound definition needs, or (one line each, the count and the
 * remedy) when rows are in a state or held events of an event it no
 * longer has; else 0, having logged what earlier versions of the
 * definition decided.  A database that cannot be read now
 * is the pool's to wait for, and a schema never migrated is the worker's
 * first statement's to report: both are 0 here. */
int preflight_lifecycle_schema(const struct cfg *conf);

/* The definition's own statements prepared on db (its tables must
 * exist; the read is the caller's to end): 0, or 2 after one line on
 * stderr, "FILE:LINE: statement N of EVENT: the server's words" (file:
 * the definition's, or "(built-in)").  `run` (inside
 * preflight_lifecycle_schema) and `lifecycle check` with a database. */
int preflight_effects(struct db *db, const struct lc_def *d, const char *file);

/* Every command that writes rows (run, cleanup, dlq replay), at start-up:
 * 1 (said in one line) when schema_migrations holds a numbered migration
 * that conf->migrations_dir has no file for (a newer build migrated the
 * database), or lacks one of its files that is not a contract file (this
 * build is newer than the schema), else 0; a database or folder it cannot
 * read is a warning, not a refusal (the pool waits for the database). */
int preflight_known_migrations(const struct cfg *conf);

#endif
