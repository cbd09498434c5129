/*
 * lifecycle_schema.h - the tables a lifecycle definition needs, as DDL, and
 * what an existing schema lacks of them.  Pure but for lc_schema_read, which
 * reads information_schema on the caller's connection; the caller runs the
 * DDL (worker/cmd_migrate.c) and compares (there, and worker/preflight.c).
 *
 * Three tables per aggregate, named from the definition: its table
 * (def->table: id, status, version, flags, created_at, updated_at,
 * lifecycle_version and the columns its events set), its ledger <aggregate>_events (one row per
 * applied or compensated effect, keyed by def->key) and its lock rows
 * <aggregate>_locks (def->key, held).  For the order definition these are
 * exactly orders, order_events and order_locks of migrations/.
 *
 * Identifiers come from the definition only (never from message text),
 * are checked against [a-z][a-z0-9_]* by lc_load and backtick-quoted.
 */
#ifndef INBOX_LIFECYCLE_SCHEMA_H
#define INBOX_LIFECYCLE_SCHEMA_H

#include <stddef.h>

#include "db.h"
#include "lifecycle.h"

#define LC_SCHEMA_TABLES 3

/* The three table names: [0] def->table, [1] ledger, [2] locks. */
void lc_schema_tables(const struct lc_def *def, char names[LC_SCHEMA_TABLES][LC_NAME_MAX + 16]);

/* CREATE TABLE IF NOT EXISTS for the three tables, ';'-separated, into
 * buf.  Returns 0, or -1 when cap is too small. */
int lc_schema_ddl(const struct lc_def *def, char *buf, size_t cap);

/* One column as information_schema.columns has it. */
struct lc_column {
	char table[LC_NAME_MAX + 16];
	char column[LC_NAME_MAX + 1];
	char data_type[32];   /* "varchar", "datetime", "bigint", ... */
	long long length;     /* character_maximum_length; 0 when none */
};

/* Columns a caller's array for lc_schema_read holds: more than the three
 * tables of the largest definition have. */
#define LC_SCHEMA_COLUMNS_MAX 256

/*
 * Every column of def's three tables in the connected database, from
 * information_schema (the names are parameters, never spliced into the
 * SQL), into cols (cap of them; the rest are not read), *n of them: 0
 * when none of the tables exists.  The statement is owned by db; the read
 * is left open for the caller to commit or roll back.  Returns ST_OK or
 * the database's error.
 */
int lc_schema_read(struct db *db, const struct lc_def *def, struct lc_column *cols, int cap, int *n);

/*
 * What the existing columns (cols, n; every column of the three tables)
 * lack for def: one line per difference, each saying what to do, into
 * diff (cut at cap).  Returns the number of differences.  A table of which
 * no column is listed is missing.
 */
int lc_schema_compare(const struct lc_def *def, const struct lc_column *cols, int n, char *diff, size_t cap);

/*
 * The statements that widen the existing columns (cols, n) that are of
 * the right type but narrower than def needs (a table an older version
 * created, before one rule decided the widths): ALTER TABLE ... MODIFY,
 * ';'-separated, into buf.  Widening keeps every row.  Returns how many,
 * or -1 when cap is too small.
 */
int lc_schema_widen(const struct lc_def *def, const struct lc_column *cols, int n, char *buf, size_t cap);

/*
 * The statements that add to the existing tables (cols, n) the columns the
 * worker keeps itself that a later version added (lifecycle_version, for
 * tables created before it): ALTER TABLE ... ADD COLUMN, in place
 * (ALGORITHM=INSTANT), ';'-separated, into buf.  Adding keeps every row;
 * the rows written before say NULL.  Returns how many, or -1 when cap is
 * too small.
 */
int lc_schema_add_kept(const struct lc_def *def, const struct lc_column *cols, int n, char *buf, size_t cap);

#endif
