/*
 * migrate.h - `inbox-worker migrate`: apply migrations/NNNN_name.sql in name
 * order, each once, recorded in schema_migrations with its SHA-256.
 */
#ifndef INBOX_MIGRATE_H
#define INBOX_MIGRATE_H

#include "cfg.h"

/* Returns a process exit code: 0 done, 1 failed (reason logged). */
int migrate_main(const struct cfg *conf);

#endif
