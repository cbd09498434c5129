/*
 * cmd_migrate.h - `inbox-worker migrate`: apply migrations/NNNN_name.sql in name
 * order, each once, recorded in schema_migrations with its SHA-256.
 */
#ifndef INBOX_CMD_MIGRATE_H
#define INBOX_CMD_MIGRATE_H

#include <stdbool.h>

#include "cfg.h"

/* Returns a process exit code: 0 done, 1 failed (reason logged).  The
 * contract files (migration.h) are applied when contract is set, or when
 * the database had no migration before; otherwise they wait, said. */
int migrate_main(const struct cfg *conf, bool contract);

/* `migrate --status`: print every migration file (numbered, then
 * procedures) as applied, pending or changed, with its SHA-256, and every
 * record without a file as missing, then a summary line, on stdout.  Only
 * reads.  Returns 0 when the report was printed, 1 when the database or
 * the files cannot be read. */
int migrate_status(const struct cfg *conf);

#endif
