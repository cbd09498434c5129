/*
 * test_migrate.c - `inbox-worker migrate` against the real MariaDB: applies
 * each file once, is a no-op the second time, survives two concurrent runs,
 * and refuses an applied file that changed; leaves a contract file to
 * `migrate --contract` on a database with history; and the commands that
 * write rows refuse a database that lacks a migration of their build.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "db.h"
#include "itest.h"
#include "status.h"

static int run_migrate(const char *dir)
{
	char env[4200];
	const char *args[] = { "migrate", NULL };
	const char *envv[] = { env, NULL };
	snprintf(env, sizeof env, "INBOX_MIGRATIONS_DIR=%s", dir);
	return itest_wait_exit(itest_spawn(args, dir ? envv : NULL), 120);
}

static int count_migration_files(void)
{
	char dir[4096];
	char cmd[4200];
	FILE *p;
	int n = -1;

	/* The numbered files and the procedure files (none today), each
	 * recorded once. */
	snprintf(cmd, sizeof cmd, "(ls %s; ls %s/procedures 2>/dev/null) | grep -c '\\.sql$'",
	         itest_source("migrations", dir, sizeof dir), dir);
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	cr_assert_eq(fscanf(p, "%d", &n), 1);
	pclose(p);
	return n;
}

/* Write (mode "w") or append ("a") text to dir/name. */
static void write_file(const char *dir, const char *name, const char *mode, const char *text)
{
	char path[4200];
	FILE *f;

	snprintf(path, sizeof path, "%s/%s", dir, name);
	f = fopen(path, mode);
	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	cr_assert_geq(fputs(text, f), 0);
	cr_assert_eq(fclose(f), 0);
}

/* How many migration files of the source tree (numbered and procedures/)
 * have their schema_migrations row, under their own name, holding their
 * own checksum.  After COUNT(*) matched, this is what can still be wrong
 * (a row recorded under another name, or with another file's checksum). */
static int files_recorded_with_their_checksum(void)
{
	char dir[4096], cmd[4300], line[512];
	FILE *p;
	int n = 0;

	/* The checksum leaves out annotation lines ("-- @word", migration.h). */
	snprintf(cmd, sizeof cmd,
	         "cd %s && for f in *.sql $(ls procedures/*.sql 2>/dev/null); do"
	         " printf '%%s %%s\\n' \"$(grep -v '^-- @[a-z]' \"$f\" | sha256sum | cut -c1-64)\" \"$f\"; done",
	         itest_source("migrations", dir, sizeof dir));
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	while (fgets(line, sizeof line, p) != NULL) {
		char sha[65], name[300], key[400];

		cr_assert_eq(sscanf(line, "%64s %299s", sha, name), 2, "sha256sum: %s", line);
		snprintf(key, sizeof key, "%s:%s", name, sha);
		n += (int)itest_int1("SELECT COUNT(*) FROM schema_migrations WHERE CONCAT(name, ':', sha256) = ?", key);
	}
	pclose(p);
	return n;
}

/* A copy of migrations/ in a new folder (tmpl, a mkdtemp template, gets its
 * name); with_probe: and a procedures/ folder holding itest_probe.sql, a
 * procedure of the test's own (the worker uses none today, 0011). */
static void copy_migrations(char *tmpl, bool with_probe)
{
	char src[4096], cmd[8400];

	cr_assert_not_null(mkdtemp(tmpl));
	snprintf(cmd, sizeof cmd, "cp -r %s/. %s/", itest_source("migrations", src, sizeof src), tmpl);
	cr_assert_eq(system(cmd), 0);
	if (with_probe) {
		snprintf(cmd, sizeof cmd, "%s/procedures", tmpl);
		cr_assert(mkdir(cmd, 0700) == 0 || errno == EEXIST, "mkdir %s: %s", cmd, strerror(errno));
		write_file(tmpl, "procedures/itest_probe.sql", "w",
		           "DROP PROCEDURE IF EXISTS itest_probe;\nCREATE PROCEDURE itest_probe() SELECT 1;\n");
	}
}

static void remove_tree(const char *dir)
{
	char cmd[4200];

	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	cr_assert_eq(system(cmd), 0);
}

Test(migrate, second_run_is_a_noop)
{
	char dir[4096];
	int files = count_migration_files();
	int st;

	itest_fresh(); /* drops everything and migrates once */
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM schema_migrations"), files);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE()"
	                       " AND table_name = 'processed_messages' AND index_name = 'uq_processed_messages_key'"
	                       " AND non_unique = 0"),
	             3, "UNIQUE (consumer, source, message_id) must exist");
	int64_t before = itest_int("SELECT CAST(UNIX_TIMESTAMP(MAX(applied_at)) * 1000000 AS SIGNED) FROM schema_migrations");
	st = run_migrate(itest_source("migrations", dir, sizeof dir));
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM schema_migrations"), files);
	cr_assert_eq(itest_int("SELECT CAST(UNIX_TIMESTAMP(MAX(applied_at)) * 1000000 AS SIGNED) FROM schema_migrations"), before,
	             "a second run must not re-apply anything");
}

Test(migrate, concurrent_runs_apply_each_file_once)
{
	char dir[4096];
	const char *args[] = { "migrate", NULL };
	char env[4200];
	const char *envv[] = { env, NULL };
	pid_t a, b;
	int sa, sb;

	itest_fresh();
	cr_assert_eq(db_exec(itest_db(), "DROP TABLE order_events, processed_messages, orders, order_locks,"
	                                 " held_events, outbox, schema_migrations"), 0);
	snprintf(env, sizeof env, "INBOX_MIGRATIONS_DIR=%s", itest_source("migrations", dir, sizeof dir));
	a = itest_spawn(args, envv);
	b = itest_spawn(args, envv);
	sa = itest_wait_exit(a, 120);
	sb = itest_wait_exit(b, 120);
	cr_assert(WIFEXITED(sa) && WEXITSTATUS(sa) == 0, "first migrate failed");
	cr_assert(WIFEXITED(sb) && WEXITSTATUS(sb) == 0, "second migrate failed");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM schema_migrations"), count_migration_files());
	cr_assert_eq(files_recorded_with_their_checksum(), count_migration_files(),
	             "each file recorded once, under its name, with its checksum");
}

Test(migrate, changed_applied_file_is_refused)
{
	char tmpl[] = "/tmp/inbox-migrations-XXXXXX";
	int st;

	itest_fresh();
	copy_migrations(tmpl, false);
	st = run_migrate(tmpl);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "unchanged copy must be accepted");

	write_file(tmpl, "0001_inbox.sql", "a", "\n-- an edit after the fact\n");
	st = run_migrate(tmpl);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "a changed applied migration must be refused (exit 1)");
	remove_tree(tmpl);
}

/* A procedure lives in one file of migrations/procedures/: an edited file
 * is applied again (the procedure replaced, its checksum recorded anew),
 * an unchanged one is left alone.  The worker itself uses none today
 * (0011 dropped the batch procedures), so the test brings its own. */
Test(migrate, changed_procedure_file_is_applied_again)
{
	char tmpl[] = "/tmp/inbox-migrations-XXXXXX", sha1[65], sha2[65];
	int st;

	itest_fresh();
	copy_migrations(tmpl, true);
	st = run_migrate(tmpl);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "unchanged copy must be accepted");
	cr_assert(itest_str1("SELECT sha256 FROM schema_migrations WHERE name = ?", "procedures/itest_probe.sql",
	                     sha1, sizeof sha1));

	write_file(tmpl, "procedures/itest_probe.sql", "a", "\n-- an edit after the fact\n");
	st = run_migrate(tmpl);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "a changed procedure file must be applied again");
	cr_assert(itest_str1("SELECT sha256 FROM schema_migrations WHERE name = ?", "procedures/itest_probe.sql",
	                     sha2, sizeof sha2));
	cr_assert_str_neq(sha1, sha2, "the new checksum is recorded");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM information_schema.routines WHERE routine_schema = DATABASE()"
	                       " AND routine_name = 'itest_probe'"), 1);
	remove_tree(tmpl);
}

/* The line of the status report that names file, or NULL. */
static char *status_line(const char *report, const char *file, char *line, size_t cap)
{
	const char *p = report;
	size_t n = strlen(file);

	while ((p = strstr(p, file)) != NULL) {
		const char *start = p, *end;
		while (start > report && start[-1] != '\n')
			start--;
		end = strchr(p, '\n');
		if (end == NULL)
			end = p + strlen(p);
		/* the file's own name, not one that merely contains it */
		if ((p[n] == ' ' || p[n] == '\n' || p[n] == '\0') && (p == report || p[-1] == ' ')) {
			snprintf(line, cap, "%.*s", (int)(end - start), start);
			return line;
		}
		p += n;
	}
	return NULL;
}

static int run_status(const char *dir, char *out, size_t cap)
{
	char env[4200], logf[256];
	const char *args[] = { "migrate", "--status", NULL };
	const char *envv[] = { env, "INBOX_LOG_LEVEL=warn", NULL };
	int st;

	snprintf(env, sizeof env, "INBOX_MIGRATIONS_DIR=%s", dir);
	snprintf(logf, sizeof logf, "/tmp/inbox-itest-%d-migrate-status.log", (int)getpid());
	st = itest_wait_exit(itest_spawn_program(getenv("INBOX_WORKER_BIN"), args, envv, logf, true), 120);
	itest_read_file(logf, out, cap);
	return st;
}

/* `migrate --status` only reads: it lists every file applied, pending or
 * changed since it was applied, with its checksum, and every record whose
 * file is gone; it creates nothing and applies nothing. */
Test(migrate, status_lists_applied_pending_and_changed_files_and_only_reads)
{
	char tmpl[] = "/tmp/inbox-migrations-XXXXXX", sha[65], line[600];
	static char out[65536];
	struct db *db;
	int st, files;

	itest_fresh();
	/* The worker uses no procedure today (0011): the test brings one, and
	 * migrates once to apply it. */
	copy_migrations(tmpl, true);
	st = run_migrate(tmpl);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	files = count_migration_files() + 1;

	/* Up to date: every file applied, with the recorded checksum. */
	st = run_status(tmpl, out, sizeof out);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, out);
	cr_assert(itest_str1("SELECT sha256 FROM schema_migrations WHERE name = ?", "0001_inbox.sql", sha, sizeof sha));
	cr_assert_not_null(status_line(out, "0001_inbox.sql", line, sizeof line), "%s", out);
	cr_assert_eq(strncmp(line, "applied", 7), 0, "%s", line);
	cr_assert_not_null(strstr(line, sha), "the checksum: %s", line);
	cr_assert_not_null(status_line(out, "procedures/itest_probe.sql", line, sizeof line), "%s", out);
	cr_assert_eq(strncmp(line, "applied", 7), 0, "%s", line);
	snprintf(line, sizeof line, "applied=%d pending=0 changed=0 missing=0", files);
	cr_assert_not_null(strstr(out, line), "%s", out);

	/* A new file, an edited numbered file, an edited procedure, a record
	 * without a file. */
	write_file(tmpl, "9999_later.sql", "w", "CREATE TABLE IF NOT EXISTS later (id INT PRIMARY KEY);\n");
	write_file(tmpl, "0002_saga.sql", "a", "\n-- an edit after the fact\n");
	write_file(tmpl, "procedures/itest_probe.sql", "a", "\n-- an edit\n");
	db = itest_db();
	cr_assert_eq(db_exec(db, "INSERT INTO schema_migrations (name, sha256, applied_at)"
	                         " VALUES ('0003_gone.sql', REPEAT('a', 64), NOW(6))"),
	             ST_OK);
	cr_assert_eq(db_commit(db), ST_OK);
	st = run_status(tmpl, out, sizeof out);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, out);
	cr_assert_not_null(status_line(out, "9999_later.sql", line, sizeof line), "%s", out);
	cr_assert_eq(strncmp(line, "pending", 7), 0, "%s", line);
	cr_assert_not_null(strstr(line, "sha256="), "%s", line);
	cr_assert_not_null(status_line(out, "0002_saga.sql", line, sizeof line), "%s", out);
	cr_assert_eq(strncmp(line, "CHANGED", 7), 0, "%s", line);
	cr_assert_not_null(strstr(line, "refuses"), "says what migrate will do: %s", line);
	cr_assert_not_null(status_line(out, "procedures/itest_probe.sql", line, sizeof line), "%s", out);
	cr_assert_eq(strncmp(line, "changed", 7), 0, "%s", line);
	cr_assert_not_null(strstr(line, "applies it again"), "%s", line);
	cr_assert_not_null(status_line(out, "0003_gone.sql", line, sizeof line), "%s", out);
	cr_assert_eq(strncmp(line, "missing", 7), 0, "%s", line);
	snprintf(line, sizeof line, "applied=%d pending=1 changed=2 missing=1", files - 2);
	cr_assert_not_null(strstr(out, line), "%s", out);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()"
	                       " AND table_name = 'later'"),
	             0, "nothing applied");

	/* A database never migrated: everything pending, and the status
	 * creates no schema_migrations table. */
	cr_assert_eq(db_exec(db, "DROP TABLE schema_migrations"), ST_OK);
	st = run_status(tmpl, out, sizeof out);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, out);
	snprintf(line, sizeof line, "applied=0 pending=%d changed=0 missing=0", files + 1);
	cr_assert_not_null(strstr(out, line), "%s", out);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()"
	                       " AND table_name = 'schema_migrations'"),
	             0, "status created nothing");
	remove_tree(tmpl);
}

/* A database that a newer build migrated holds a numbered record this
 * build has no file for: migrate must not call that "done" (exit 0,
 * applied=0), and run must not start on it either.  Both refuse with
 * one line that names the record, exit 1 (a runtime failure: the
 * database found is not one this build can work on; no setting of
 * this invocation is wrong). */
Test(migrate, a_record_this_build_does_not_know_is_refused_by_migrate_and_run)
{
	char dir[4096], logf[256];
	const char *args[] = { "migrate", NULL };
	const char *runargs[] = { "run", "--threads", "1", NULL };
	const char *envv[] = { "INBOX_METRICS_ADDR=", NULL };
	struct db *db;
	int st;

	itest_fresh();
	db = itest_db();
	cr_assert_eq(db_exec(db, "INSERT INTO schema_migrations (name, sha256, applied_at)"
	                         " VALUES ('9990_from_a_newer_build.sql', REPEAT('b', 64), NOW(6))"),
	             ST_OK);
	cr_assert_eq(db_commit(db), ST_OK);
	itest_source("migrations", dir, sizeof dir);

	itest_log_path(logf, sizeof logf, "migrate-unknown");
	st = itest_wait_exit(itest_spawn_logged(args, NULL, logf), 120);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "migrate must refuse (exit 1), got %d", st);
	cr_assert(itest_log_has(logf, "9990_from_a_newer_build.sql"), "the line names the record");
	cr_assert(!itest_log_has(logf, "migrations done"), "not 'done'");

	itest_log_path(logf, sizeof logf, "run-unknown");
	st = itest_wait_exit(itest_spawn_logged(runargs, envv, logf), 120);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "run must refuse at start-up (exit 1), got %d", st);
	cr_assert(itest_log_has(logf, "9990_from_a_newer_build.sql"), "the line names the record");

	/* So does every other command that writes rows. */
	{
		const char *cleanup[] = { "cleanup", NULL };
		const char *replay[] = { "dlq", "replay", NULL };

		itest_log_path(logf, sizeof logf, "cleanup-unknown");
		st = itest_wait_exit(itest_spawn_logged(cleanup, NULL, logf), 120);
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "cleanup must refuse (exit 1), got %d", st);
		cr_assert(itest_log_has(logf, "9990_from_a_newer_build.sql"), "the line names the record");
		itest_log_path(logf, sizeof logf, "replay-unknown");
		st = itest_wait_exit(itest_spawn_logged(replay, NULL, logf), 120);
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "dlq replay must refuse (exit 1), got %d", st);
		cr_assert(itest_log_has(logf, "9990_from_a_newer_build.sql"), "the line names the record");
	}
}

/* The migration lock is the database's, as retention's is: a session of
 * the same server holding the lock under the old server-wide name (a
 * migrate of another database, by today's builds) does not hold this
 * database's migrate back.  Before, this migrate waited the full 120 s
 * for it and failed. */
Test(migrate, the_lock_is_per_database)
{
	struct db *db;
	const char *args[] = { "migrate", NULL };
	int st;

	itest_fresh();
	db = itest_db();
	cr_assert_eq(itest_int("SELECT GET_LOCK('inbox-worker.migrate', 0)"), 1);
	st = itest_wait_exit(itest_spawn(args, NULL), 200);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	          "a migrate must not wait behind another database's migration lock: got %d", st);
	cr_assert_eq(db_exec(db, "DO RELEASE_LOCK('inbox-worker.migrate')"), ST_OK);
}

/* `inbox-worker ARGS...` to exit; its status, its output in log (named). */
static int run_logged(const char *const *args, const char *name, char *logf, size_t cap)
{
	const char *envv[] = { "INBOX_METRICS_ADDR=", NULL };

	itest_log_path(logf, cap, name);
	return itest_wait_exit(itest_spawn_logged(args, envv, logf), 120);
}

static int64_t procedure_count(const char *name)
{
	return itest_int1("SELECT COUNT(*) FROM information_schema.routines WHERE routine_schema = DATABASE()"
	                  " AND routine_name = ?", name);
}

/* A database with history, as 0.1.0 left it: its procedure inbox_claim in
 * place and 0021 (a contract file: it drops them) not applied.  A plain
 * migrate leaves 0021 and says so, the commands start with it pending, and
 * `migrate --contract` applies it.  Before contract files, 0010 dropped the
 * procedure in the same run that the 0.1.0 fleet kept running through. */
Test(migrate, a_contract_file_waits_for_migrate_contract_on_a_database_with_history)
{
	const char *migrate[] = { "migrate", NULL };
	const char *contract[] = { "migrate", "--contract", NULL };
	const char *cleanup[] = { "cleanup", NULL };
	const char *rec = "SELECT COUNT(*) FROM schema_migrations WHERE name = '0021_contract_claim_procedures.sql'";
	char logf[256];
	int st;

	itest_fresh();
	cr_assert_eq(itest_int(rec), 1, "a new database takes its contract files at once");
	cr_assert_eq(procedure_count("inbox_claim"), 0);
	cr_assert_eq(db_exec(itest_db(), "DELETE FROM schema_migrations WHERE name = '0021_contract_claim_procedures.sql'"),
	             ST_OK);
	cr_assert_eq(db_commit(itest_db()), ST_OK);
	cr_assert_eq(db_exec(itest_db(), "CREATE PROCEDURE inbox_claim() SELECT 1"), ST_OK, "%s", db_errmsg(itest_db()));

	st = run_logged(migrate, "migrate-history", logf, sizeof logf);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "migrate must succeed, got %d (see %s)", st, logf);
	cr_assert(itest_log_has(logf, "contract migration left for `inbox-worker migrate --contract`"), "see %s", logf);
	cr_assert_eq(itest_int(rec), 0, "the contract file must wait");
	cr_assert_eq(procedure_count("inbox_claim"), 1, "an old worker's procedure must stay while it may run");

	{
		static char out[65536];
		char dir[4096];

		st = run_status(itest_source("migrations", dir, sizeof dir), out, sizeof out);
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s", out);
		cr_assert_not_null(strstr(out, "pending  0021_contract_claim_procedures.sql"), "%s", out);
		cr_assert_not_null(strstr(out, "(contract: applied by `migrate --contract`"), "%s", out);
	}

	st = run_logged(cleanup, "cleanup-contract-pending", logf, sizeof logf);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "a pending contract file must not stop a command (see %s)",
	          logf);

	st = run_logged(contract, "migrate-contract", logf, sizeof logf);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "migrate --contract must succeed (see %s)", logf);
	cr_assert_eq(itest_int(rec), 1);
	cr_assert_eq(procedure_count("inbox_claim"), 0, "--contract drops it");
}

/* A newer build on an older schema: every command that writes rows
 * refuses at start-up in one line that names the file and the remedy.
 * 0020's columns are IF NOT EXISTS, so forgetting its record is all it
 * takes; before, run started (its statements prepared) and nothing said
 * the schema was behind. */
Test(migrate, a_database_lacking_a_migration_of_this_build_is_refused_in_one_line)
{
	const char *run[] = { "run", "--threads", "1", NULL };
	const char *cleanup[] = { "cleanup", NULL };
	const char *migrate[] = { "migrate", NULL };
	char logf[256];
	int st;

	itest_fresh();
	cr_assert_eq(db_exec(itest_db(), "DELETE FROM schema_migrations WHERE name = '0020_lifecycle_version.sql'"), ST_OK);
	cr_assert_eq(db_commit(itest_db()), ST_OK);

	st = run_logged(run, "run-behind", logf, sizeof logf);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "run must refuse (exit 1), got %d (see %s)", st, logf);
	cr_assert(itest_log_has(logf, "the database lacks migration 0020_lifecycle_version.sql of this build:"
	                              " run `inbox-worker migrate`"),
	          "see %s", logf);
	cr_assert(!itest_log_has(logf, "consuming"), "it must not have started (see %s)", logf);
	st = run_logged(cleanup, "cleanup-behind", logf, sizeof logf);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "cleanup must refuse (exit 1), got %d", st);
	cr_assert(itest_log_has(logf, "lacks migration 0020_lifecycle_version.sql"), "see %s", logf);

	st = run_logged(migrate, "migrate-behind", logf, sizeof logf);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	st = run_logged(cleanup, "cleanup-caught-up", logf, sizeof logf);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "after migrate it starts (see %s)", logf);
}

/* 0010's text up to 0.8.0 dropped 0.1.0's procedures; the file names that
 * text (-- @replaces), so a database that recorded it is not refused; and
 * an annotation added to an applied file changes nothing, where any other
 * edit is still refused (changed_applied_file_is_refused). */
Test(migrate, an_earlier_text_the_file_replaces_and_new_annotations_are_accepted)
{
	char tmpl[] = "/tmp/inbox-migrations-XXXXXX";
	int st;

	itest_fresh();
	cr_assert_eq(db_exec(itest_db(), "UPDATE schema_migrations SET sha256 ="
	                                 " '0857675009fde3dea49e29713c6a17b7a39690e45a2b25750d09aed62f2bc1c2'"
	                                 " WHERE name = '0010_batch_claim.sql'"),
	             ST_OK);
	cr_assert_eq(db_commit(itest_db()), ST_OK);
	copy_migrations(tmpl, false);
	st = run_migrate(tmpl);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "0.8.0's record of 0010 must be accepted");
	{
		static char out[65536];

		st = run_status(tmpl, out, sizeof out);
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s", out);
		cr_assert_not_null(strstr(out, "(recorded as an earlier text this file replaces)"), "%s", out);
		cr_assert_not_null(strstr(out, "changed=0"), "%s", out);
	}

	write_file(tmpl, "0001_inbox.sql", "a", "-- @locks a note added after the fact\n");
	st = run_migrate(tmpl);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "an annotation is not a change");
	write_file(tmpl, "0001_inbox.sql", "a", "-- @lcoks a typo\n");
	st = run_migrate(tmpl);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "an unknown annotation must be refused (exit 1)");
	remove_tree(tmpl);
}
