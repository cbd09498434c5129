/*
 * cmd_lifecycle.h - `inbox-worker lifecycle check FILE`, and the start-up
 * step of `run` that loads, checks and binds the lifecycle definition.
 */
#ifndef INBOX_CMD_LIFECYCLE_H
#define INBOX_CMD_LIFECYCLE_H

#include <stdio.h>

#include "cfg.h"

/* `lifecycle check FILE` (argv[0] is "lifecycle"): validate FILE, print its
 * decision table and the arrival-order check on out, errors on err.
 * Returns 0 when the definition is valid and order-independent, 1 when it
 * is refused (each reason printed), 2 on a usage error. */
int lifecycle_main(int argc, char **argv, FILE *out, FILE *err);

/* Its lines of inbox-worker --help. */
void lifecycle_usage(FILE *f);

/* `run`: load conf->lifecycle (the built-in file when empty), check it and
 * bind it as the order engine (agg_use) before any thread starts.
 * Returns 0, or 2 after one line on stderr saying why it cannot run.  The
 * definition stays loaded until the process exits. */
int lifecycle_setup(const struct cfg *conf);

/* `migrate` with INBOX_LIFECYCLE set, after the migrations: create the
 * definition's tables where they are missing (CREATE TABLE IF NOT EXISTS,
 * the schema owner's account) and say what an existing one lacks.
 * Returns 0 when the schema matches the definition, 1 otherwise (each
 * difference logged with the statement that fixes it). */
int lifecycle_migrate(const struct cfg *conf);

/* `run`, after lifecycle_setup: 2 (one line on stderr, the first
 * difference and the remedy) when the database's tables differ from what
 * the bound definition needs, else 0.  A database that cannot be read now
 * is the pool's to wait for, and a schema never migrated is the worker's
 * first statement's to report: both are 0 here. */
int lifecycle_schema_check(const struct cfg *conf);

#endif
