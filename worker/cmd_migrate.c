/*
 * cmd_migrate.c - `inbox-worker migrate [--status]`: schema migrations,
 * then a lifecycle of the user's own its tables.  The folder and its
 * records are read by common/migration.c, as the start-up check of every
 * command that writes rows reads them (preflight_known_migrations).
 *
 * Two processes may migrate at once (several workers starting together), so
 * the whole run holds a named lock (GET_LOCK): the second waits, then finds
 * every file recorded and does nothing.  MySQL commits DDL implicitly, so a
 * file and its record cannot be one transaction; files are written to be
 * re-runnable (IF NOT EXISTS) so a crash between them is harmless.
 *
 * A recorded file whose checksum changed is refused: the database no longer
 * matches the file, and guessing which one is right is not our job.  So is
 * a numbered record with no file here (a newer build migrated this
 * database): "nothing to apply" would be a lie, and `run` refuses it too
 * (preflight_known_migrations), since this build's statements may not fit it.
 *
 * Stored procedures are the exception: each lives in one file of
 * migrations/procedures/ (DROP PROCEDURE IF EXISTS, then CREATE), which is
 * applied after the numbered files whenever its checksum differs from the
 * one recorded (as "procedures/<name>"), so a procedure is changed by
 * editing its file, not by copying it into a new numbered migration.
 *
 * `migrate --status` only reads: it takes no lock, creates no table, and
 * compares each file's checksum with its record, so an operator sees what
 * a migrate would do (apply, re-apply, refuse) before running it.
 */
#include "cmd_migrate.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "array.h"
#include "cmd.h"
#include "db.h"
#include "lifecycle.h"
#include "lifecycle_schema.h"
#include "log.h"
#include "migration.h"
#include "preflight.h"
#include "status.h"

/* The lock is the database's, not the server's (as retention's is): two
 * databases on one server migrate side by side.  GET_LOCK names are at
 * most 64 characters; a longer database name is cut, which at worst makes
 * two such databases share a lock, never lets one database migrate twice
 * at once. */
#define MIGRATE_LOCK_PREFIX "inbox-worker.migrate."
#define MIGRATE_LOCK_NAME "LEFT(CONCAT('" MIGRATE_LOCK_PREFIX "', DATABASE()), 64)"
#define MIGRATE_LOCK_WAIT_S 120

/* One run of migrate: its statements, whether contract files may be
 * applied, and what it did. */
struct migrate_ctx {
	struct db *db;
	struct db_stmt *get, *put;
	bool contract_ok;
	int applied, waiting;
};

/* Apply one file unless recorded.  A changed numbered file is refused; a
 * changed procedure file (record = "procedures/<name>") is applied again
 * and its record replaced.  A contract file waits for --contract. */
static int migrate_one(struct migrate_ctx *m, const char *dir, const char *name, const char *record)
{
	bool reapply = record != name;
	struct migration_file f;
	char stored[65];
	struct db_param p[] = { DBP_STR(record) };
	struct db_col c[] = { DBC_STR(stored, sizeof stored) };
	int rc, r;

	rc = migration_read_file(dir, name, &f);
	if (rc != ST_OK)
		goto cleanup;
	r = db_stmt_query_row(m->get, p, ARRAY_LEN(p), c, ARRAY_LEN(c));
	if (r < 0) {
		rc = r;
		goto cleanup;
	}
	if (r == 1) {
		if (migration_file_matches(&f, stored))
			goto cleanup;
		if (!reapply) {
			LOG(LOG_LEVEL_ERROR, "applied migration has changed since; refusing to go on",
			    LOG_S("file", name), LOG_S("applied_sha256", stored), LOG_S("file_sha256", f.sha256));
			rc = ST_ERR_MIGRATION_CHANGED;
			goto cleanup;
		}
	}
	if (f.contract && !m->contract_ok) {
		m->waiting++;
		LOG(LOG_LEVEL_INFO,
		    "contract migration left for `inbox-worker migrate --contract`, once no worker of an earlier release runs",
		    LOG_S("file", name));
		goto cleanup;
	}
	rc = db_exec_script(m->db, f.sql, f.len);
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_ERROR, "migration failed", LOG_S("file", name), LOG_S("error", db_errmsg(m->db)));
		goto cleanup;
	}
	{
		struct db_param pp[] = { DBP_STR(record), DBP_STR(f.sha256) };
		rc = db_stmt_exec(m->put, pp, ARRAY_LEN(pp), NULL);
	}
	if (rc == ST_OK)
		rc = db_commit(m->db);
	if (rc == ST_OK) {
		m->applied++;
		LOG(LOG_LEVEL_INFO, "migration applied", LOG_S("file", record), LOG_S("sha256", f.sha256));
	}
cleanup:
	migration_file_free(&f);
	return rc;
}

/* migrations/procedures/: after the numbered files, whose tables they use.
 * No such folder: nothing to do. */
static int migrate_procedures(struct migrate_ctx *m, const char *dir)
{
	char pdir[4096], record[256];
	char **names = NULL;
	int count = 0, rc;

	rc = migration_list_procedures(dir, pdir, sizeof pdir, &names, &count);
	for (int i = 0; rc == ST_OK && i < count; i++) {
		snprintf(record, sizeof record, "procedures/%s", names[i]);
		rc = migrate_one(m, pdir, names[i], record);
	}
	migration_names_free(names, count);
	return rc;
}

int migrate_main(const struct cfg *conf, bool contract)
{
	struct db *db = NULL;
	struct db_stmt *lock = NULL, *unlock = NULL, *history = NULL;
	struct migrate_ctx m = { .contract_ok = contract };
	char **names = NULL, unknown[201];
	int count = 0, rc;
	bool locked = false;

	/* The schema owner's account when one is given: the worker's own
	 * account may only read and write rows and call the procedures. */
	rc = preflight_db_open(&db, cfg_migrate_db(conf));
	if (rc != ST_OK)
		return 1; /* said */
	rc = migration_list_numbered(conf->migrations_dir, &names, &count);
	if (rc != ST_OK)
		goto cleanup;
	rc = db_prepare(db, &lock, "SELECT GET_LOCK(" MIGRATE_LOCK_NAME ", ?)");
	if (rc == ST_OK)
		rc = db_prepare(db, &unlock, "SELECT RELEASE_LOCK(" MIGRATE_LOCK_NAME ")");
	if (rc != ST_OK)
		goto cleanup;
	{
		struct db_param p[] = { DBP_I64(MIGRATE_LOCK_WAIT_S) };
		struct db_col c[] = { DBC_I64() };
		int r = db_stmt_query_row(lock, p, ARRAY_LEN(p), c, ARRAY_LEN(c));
		if (r == 1 && !c[0].is_null && c[0].i64 == 1) {
			locked = true;
		} else {
			LOG(LOG_LEVEL_ERROR, "could not take the migration lock", LOG_S("lock", MIGRATE_LOCK_PREFIX "<database>"));
			rc = r < 0 ? r : ST_ERR_TIMEOUT;
			goto cleanup;
		}
	}
	rc = db_exec(db, "CREATE TABLE IF NOT EXISTS schema_migrations ("
	                 " name VARCHAR(200) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,"
	                 " sha256 CHAR(64) CHARACTER SET ascii NOT NULL,"
	                 " applied_at DATETIME(6) NOT NULL) ENGINE=InnoDB");
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_ERROR, "cannot create schema_migrations", LOG_S("error", db_errmsg(db)));
		goto cleanup;
	}
	rc = migration_find_unknown(db, names, count, unknown, sizeof unknown);
	if (rc == ST_OK && unknown[0] != '\0') {
		migration_log_unknown("the database holds a migration this build does not know; refusing to go on",
		                    unknown, conf->migrations_dir);
		rc = ST_ERR_MIGRATION_CHANGED;
		goto cleanup;
	}
	/* A database that had no numbered migration before this run has no
	 * fleet of an earlier release on it: its contract files go in now. */
	if (rc == ST_OK && !contract) {
		struct db_col c[] = { DBC_I64() };
		int r;

		rc = db_prepare(db, &history, "SELECT COUNT(*) FROM schema_migrations WHERE name NOT LIKE 'procedures/%'");
		r = rc == ST_OK ? db_stmt_query_row(history, NULL, 0, c, ARRAY_LEN(c)) : rc;
		if (r < 0)
			rc = r;
		else
			m.contract_ok = r == 1 && c[0].i64 == 0;
	}
	m.db = db;
	if (rc == ST_OK)
		rc = db_prepare(db, &m.get, "SELECT sha256 FROM schema_migrations WHERE name = ?");
	if (rc == ST_OK)
		rc = db_prepare(db, &m.put, "REPLACE INTO schema_migrations (name, sha256, applied_at) VALUES (?, ?, NOW(6))");
	for (int i = 0; rc == ST_OK && i < count; i++)
		rc = migrate_one(&m, conf->migrations_dir, names[i], names[i]);
	if (rc == ST_OK)
		rc = migrate_procedures(&m, conf->migrations_dir);
	if (rc == ST_OK)
		LOG(LOG_LEVEL_INFO, "migrations done", LOG_I("applied", m.applied), LOG_I("files", count),
		    LOG_I("contract_waiting", m.waiting), LOG_S("dir", conf->migrations_dir));
cleanup:
	if (locked) {
		struct db_col c[] = { DBC_I64() };
		/* The lock also ends with the session; releasing it early only
		 * lets a waiting migrator go sooner. */
		(void)db_stmt_query_row(unlock, NULL, 0, c, ARRAY_LEN(c));
	}
	migration_names_free(names, count);
	db_close(&db);
	return rc == ST_OK ? 0 : 1;
}

/* ---- migrate --status ---------------------------------------------------- */

/* A row of schema_migrations, and whether a file matched it. */
struct migrate_record {
	char name[201];
	char sha256[65];
	char applied_at[32];
	bool seen;
};

struct migrate_tally {
	int applied, pending, changed, missing;
};

static struct migrate_record *migrate_find(struct migrate_record *rec, int n, const char *name)
{
	for (int i = 0; i < n; i++)
		if (strcmp(rec[i].name, name) == 0)
			return &rec[i];
	return NULL;
}

/* One line for the file dir/name, recorded as record. */
static int migrate_status_file(const char *dir, const char *name, const char *record, bool procedure,
                               struct migrate_record *rec, int nrec, struct migrate_tally *t)
{
	struct migration_file f;
	struct migrate_record *r;
	int rc = migration_read_file(dir, name, &f);

	if (rc != ST_OK)
		goto cleanup;
	r = migrate_find(rec, nrec, record);
	if (r == NULL) {
		t->pending++;
		printf("pending  %s  sha256=%s%s\n", record, f.sha256,
		       f.contract ? "  (contract: applied by `migrate --contract`, once no worker of an earlier release runs)"
		                  : "");
		goto cleanup;
	}
	r->seen = true;
	if (migration_file_matches(&f, r->sha256)) {
		t->applied++;
		printf("applied  %s  sha256=%s  applied_at=%s%s\n", record, f.sha256, r->applied_at,
		       strcmp(r->sha256, f.sha256) != 0 ? "  (recorded as an earlier text this file replaces)" : "");
		goto cleanup;
	}
	t->changed++;
	/* A changed numbered file stops migrate; say so loudly. */
	printf("%s  %s  sha256=%s  recorded=%s  applied_at=%s  (%s)\n", procedure ? "changed" : "CHANGED", record,
	       f.sha256, r->sha256, r->applied_at,
	       procedure ? "migrate applies it again"
	                 : "changed since it was applied: migrate refuses to go on until the file is restored");
cleanup:
	migration_file_free(&f);
	return rc;
}

int migrate_status(const struct cfg *conf)
{
	struct db *db = NULL;
	struct db_stmt *list = NULL;
	struct migrate_record *rec = NULL;
	struct migrate_tally t = { 0 };
	char **names = NULL, **procs = NULL, pdir[4096];
	int count = 0, nproc = 0, nrec = 0, rc;
	bool have_table = false;

	rc = db_open(&db, cfg_migrate_db(conf));
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_ERROR, "cannot connect to the database", LOG_S("db", cfg_migrate_db(conf)->redacted),
		    LOG_S("error", st_strerror(rc)));
		return 1;
	}
	rc = migration_list_numbered(conf->migrations_dir, &names, &count);
	if (rc != ST_OK)
		goto cleanup;
	rc = migration_list_procedures(conf->migrations_dir, pdir, sizeof pdir, &procs, &nproc);
	if (rc != ST_OK)
		goto cleanup;
	/* No schema_migrations yet: nothing applied (and nothing created). */
	rc = migration_have_table(db, &have_table);
	rec = calloc(2 * MIGRATION_MAX_FILES, sizeof *rec);
	if (rc == ST_OK && rec == NULL)
		rc = ST_ERR_NOMEM;
	if (rc == ST_OK && have_table) {
		rc = db_prepare(db, &list,
		                "SELECT name, sha256, DATE_FORMAT(applied_at, '%Y-%m-%dT%H:%i:%S')"
		                " FROM schema_migrations ORDER BY name");
		if (rc == ST_OK)
			rc = db_stmt_query(list, NULL, 0);
		while (rc == ST_OK) {
			struct migrate_record spill, *r = nrec < 2 * MIGRATION_MAX_FILES ? &rec[nrec] : &spill;
			struct db_col c[] = { DBC_STR(r->name, sizeof r->name), DBC_STR(r->sha256, sizeof r->sha256),
			                      DBC_STR(r->applied_at, sizeof r->applied_at) };
			int f = db_stmt_fetch(list, c, ARRAY_LEN(c));
			if (f < 0)
				rc = f;
			if (f <= 0)
				break;
			if (r != &spill)
				nrec++;
		}
	}
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_ERROR, "cannot read schema_migrations", LOG_S("error", db_errmsg(db)));
		goto cleanup;
	}
	printf("migrations in %s\n", conf->migrations_dir);
	for (int i = 0; rc == ST_OK && i < count; i++)
		rc = migrate_status_file(conf->migrations_dir, names[i], names[i], false, rec, nrec, &t);
	for (int i = 0; rc == ST_OK && i < nproc; i++) {
		char record[256];
		snprintf(record, sizeof record, "procedures/%s", procs[i]);
		rc = migrate_status_file(pdir, procs[i], record, true, rec, nrec, &t);
	}
	for (int i = 0; rc == ST_OK && i < nrec; i++) {
		if (rec[i].seen)
			continue;
		t.missing++;
		printf("missing  %s  recorded=%s  applied_at=%s  (recorded, but no such file here%s)\n", rec[i].name,
		       rec[i].sha256, rec[i].applied_at,
		       migration_name_ok(rec[i].name) ? ": migrate and run refuse this database" : "");
	}
	if (rc == ST_OK)
		printf("status applied=%d pending=%d changed=%d missing=%d\n", t.applied, t.pending, t.changed,
		       t.missing);
	if (rc == ST_OK && fflush(stdout) != 0)
		rc = ST_ERR_IO;
cleanup:
	db_rollback(db);
	migration_names_free(names, count);
	migration_names_free(procs, nproc);
	free(rec);
	db_close(&db);
	return rc == ST_OK ? 0 : 1;
}

/* ---- a lifecycle's tables ------------------------------------------------- */

/* With INBOX_LIFECYCLE set, after the migrations: create the definition's
 * tables where they are missing (CREATE TABLE IF NOT EXISTS, the schema
 * owner's account) and say what an existing one lacks.  Returns 0 when the
 * schema matches the definition, 1 otherwise (each difference logged with
 * the statement that fixes it). */
static int lifecycle_migrate(const struct cfg *conf)
{
	static struct lc_column cols[LC_SCHEMA_COLUMNS_MAX];
	static char ddl[16384], diff[8192], add[4096];
	struct lc_errors errs;
	struct lc_def *d = preflight_lifecycle_load(conf, &errs);
	struct db *db = NULL;
	int n = 0, ndiff, code = 1, rc;

	if (d == NULL) {
		lc_errors_print(&errs, conf->lifecycle, stderr);
		return 1;
	}
	if (lc_schema_ddl(d, ddl, sizeof ddl) != 0) {
		LOG(LOG_LEVEL_ERROR, "the lifecycle's tables cannot be written as DDL", LOG_S("lifecycle", conf->lifecycle));
		goto cleanup;
	}
	rc = db_open(&db, cfg_migrate_db(conf));
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_ERROR, "cannot connect to the database for the lifecycle's tables",
		    LOG_S("db", cfg_migrate_db(conf)->redacted), LOG_S("error", st_strerror(rc)));
		goto cleanup;
	}
	rc = db_exec_script(db, ddl, strlen(ddl));
	if (rc == ST_OK)
		rc = lc_schema_read(db, d, cols, LC_SCHEMA_COLUMNS_MAX, &n);
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_ERROR, "creating the lifecycle's tables failed", LOG_S("error", db_errmsg(db)));
		goto cleanup;
	}
	ndiff = lc_schema_compare(d, cols, n, diff, sizeof diff);
	if (ndiff > 0) {
		/* Columns narrower than what the worker accepts into them (an
		 * older version's widths) are widened, their rows kept, and the
		 * columns the worker keeps itself that a later version added
		 * (lifecycle_version) are added, but only when that is all that
		 * differs: a table that differs otherwise is the user's to
		 * change, and migrate changes none of it. */
		int nalter = lc_schema_widen(d, cols, n, ddl, sizeof ddl);
		int nadd = lc_schema_add_kept(d, cols, n, add, sizeof add);

		if (nalter < 0 || nadd < 0) {
			LOG(LOG_LEVEL_ERROR, "the lifecycle's tables cannot be widened as DDL",
			    LOG_S("lifecycle", conf->lifecycle));
			goto cleanup;
		}
		if (nalter + nadd == ndiff) {
			rc = nalter > 0 ? db_exec_script(db, ddl, strlen(ddl)) : ST_OK;
			if (rc == ST_OK && nadd > 0)
				rc = db_exec_script(db, add, strlen(add));
			if (rc == ST_OK)
				rc = lc_schema_read(db, d, cols, LC_SCHEMA_COLUMNS_MAX, &n);
			if (rc != ST_OK) {
				LOG(LOG_LEVEL_ERROR, "widening the lifecycle's columns failed", LOG_S("error", db_errmsg(db)));
				goto cleanup;
			}
			if (nalter > 0)
				LOG(LOG_LEVEL_INFO, "the lifecycle's columns widened", LOG_S("lifecycle", conf->lifecycle),
				    LOG_I("columns", nalter));
			if (nadd > 0)
				LOG(LOG_LEVEL_INFO, "the worker's own columns added to the lifecycle's tables",
				    LOG_S("lifecycle", conf->lifecycle), LOG_I("columns", nadd));
			ndiff = lc_schema_compare(d, cols, n, diff, sizeof diff);
		}
	}
	if (ndiff == 0) {
		LOG(LOG_LEVEL_INFO, "the lifecycle's tables match its definition", LOG_S("lifecycle", conf->lifecycle),
		    LOG_S("table", d->table));
		code = 0;
	} else {
		/* An existing table is the user's: say what differs, change nothing. */
		for (char *line = diff, *nl; *line != '\0'; line = nl + 1) {
			nl = strchr(line, '\n');
			if (nl == NULL)
				break;
			*nl = '\0';
			LOG(LOG_LEVEL_ERROR, "the lifecycle's table differs from its definition", LOG_S("difference", line));
		}
	}
cleanup:
	db_close(&db);
	lc_free(d);
	return code;
}

/* ---- the command --------------------------------------------------------- */

static int migrate_run(const struct cfg *conf, const struct cmd_opts *o)
{
	int code;

	if (o->status)
		return migrate_status(conf);
	code = migrate_main(conf, o->contract);
	/* A lifecycle of the user's own: its tables after the migrations. */
	if (code == 0 && conf->lifecycle != NULL && conf->lifecycle[0] != '\0')
		code = lifecycle_migrate(conf);
	return code;
}

static const char *const migrate_names[] = { "migrate" };
static const struct args_opt migrate_opts[] = {
	{ "--status", ARGS_ALL, ARGS_FLAG, 0, 0, offsetof(struct cmd_opts, status), 0, NULL,
	  "list applied, pending and changed files with their checksums; applies nothing" },
	{ "--contract", ARGS_ALL, ARGS_FLAG, 0, 0, offsetof(struct cmd_opts, contract), 0, NULL,
	  "also apply the contract files (-- @contract), once no worker of an earlier release runs" },
};
static const struct args_spec migrate_spec = {
	.prefix = "", .cmd_names = migrate_names, .ncmds = ARRAY_LEN(migrate_names),
	.opts = migrate_opts, .nopts = ARRAY_LEN(migrate_opts),
};

static enum args_result migrate_take(int *argc, char **argv, struct cmd_opts *o, char *err, size_t cap)
{
	return args_take(&migrate_spec, 0, argc, argv, o, err, cap);
}

static void migrate_usage(FILE *f)
{
	fputs("  migrate   apply the SQL files of the migrations folder not yet applied\n"
	      "            (--status: list applied, pending and changed files with their\n"
	      "            checksums; applies nothing.  --contract: also the contract\n"
	      "            files, which drop what an earlier release's workers use: run\n"
	      "            it once the last of them stopped)\n", f);
}

const struct cmd cmd_migrate = { "migrate", migrate_take, migrate_run, migrate_usage };
