/*
 * migration.h - the migration folder and its records in schema_migrations:
 * which files a folder holds (migrations/NNNN_name.sql, numbered, and
 * migrations/procedures/<name>.sql), each file's SHA-256, and which
 * numbered record of a database no file here matches (a newer build
 * migrated it).  Applying the files is `inbox-worker migrate`'s
 * (worker/cmd_migrate.c); the same reading is the start-up check of every
 * command that writes rows (worker/preflight.c).
 *
 * Ownership: a list of names is malloc'd, each name and the array, and the
 * caller frees it with migration_names_free (also after a failure, which
 * leaves it NULL and 0).  The database handles are the caller's: these
 * functions prepare their statements on it (db owns them) and never open,
 * commit other work of, or close it.
 */
#ifndef INBOX_MIGRATION_H
#define INBOX_MIGRATION_H

#include <stdbool.h>
#include <stddef.h>

#include "db.h"

/* Files a folder may hold, at most (a longer list fails as ST_ERR_NOMEM). */
#define MIGRATION_MAX_FILES 1000

/* NNNN_name.sql (10 to 200 characters): a numbered migration's name, as a
 * file or as its record. */
int migration_name_ok(const char *name);

/* <name>.sql in migrations/procedures/: re-applied when changed. */
int migration_proc_name_ok(const char *name);

/* The names in dir that name_ok accepts, sorted, into *names (count of
 * them).  Silent: errno says why it failed (ST_ERR_IO). */
int migration_list(const char *dir, int (*name_ok)(const char *), char ***names, int *count);

/* Frees what migration_list returned (NULL-safe). */
void migration_names_free(char **names, int count);

/* The numbered files of dir, sorted; says why when it cannot list them. */
int migration_list_numbered(const char *dir, char ***names, int *count);

/* The files of dir/procedures/ (pdir: that path, cap bytes), sorted; none
 * when the folder does not exist.  Says why when it cannot list them. */
int migration_list_procedures(const char *dir, char *pdir, size_t cap, char ***names, int *count);

/*
 * A file's annotations: lines that begin "-- @word".  They say what a
 * running fleet meets while the file is applied, so they may be written
 * and corrected after the file was released: the checksum leaves them out,
 * and a database that recorded the text without them still matches it.
 *
 *   -- @online  TEXT   whether workers of the release before keep running
 *   -- @locks   TEXT   which tables it holds, how, and for how long
 *   -- @contract TEXT  it drops what an earlier release's workers still
 *                      use: `migrate` applies it only with --contract
 *                      (after the last such worker stopped), or at once on
 *                      a database that had no migration before the run
 *   -- @replaces HEX TEXT  an earlier text of this file, by its checksum:
 *                      a database that recorded that text has what this
 *                      one does (its statements moved to another file)
 *
 * Any other "-- @" word is refused, so a typo cannot turn a contract file
 * into one applied under a running fleet.
 */
#define MIGRATION_REPLACES_MAX 4 /* the refusal says "at most 4" */

struct migration_file {
	char *sql;            /* the whole text, as sent to the server (malloc'd) */
	size_t len;
	char sha256[65];      /* of the text without its annotation lines */
	bool contract;
	bool online, locks;   /* the file says each */
	int nreplaces;
	char replaces[MIGRATION_REPLACES_MAX][65];
};

/* Read dir/name, its checksum and its annotations into *f, which the
 * caller frees with migration_file_free (also after a failure).  Says why
 * when it cannot read the file or an annotation is not one of the above. */
int migration_read_file(const char *dir, const char *name, struct migration_file *f);

void migration_file_free(struct migration_file *f);

/* Whether a record's checksum stands for the file: its own or one it
 * replaces. */
bool migration_file_matches(const struct migration_file *f, const char *recorded);

/* Whether schema_migrations exists in the connected database (a database
 * never migrated has none). */
int migration_have_table(struct db *db, bool *have);

/* The first numbered record of schema_migrations that has no file among
 * names (sorted, count of them), into unknown (""): none.  Procedure
 * records are left out: a procedure file of an older build may be gone
 * for good (0011 dropped them).  Commits its read. */
int migration_find_unknown(struct db *db, char *const *names, int count, char *unknown, size_t cap);

/* The first numbered file among names (sorted, count of them, in dir)
 * that schema_migrations does not record and that is not a contract file,
 * into pending (""): none.  A build whose schema is older than its files
 * must not start: its statements may not fit.  Commits its read. */
int migration_find_pending(struct db *db, const char *dir, char *const *names, int count, char *pending,
                           size_t cap);

/* The one error line for such a record: what (the message), the record,
 * the folder and the remedy. */
void migration_log_unknown(const char *what, const char *unknown, const char *dir);

#endif
