/*
 * test_lifecycle_schema.c - the tables of a lifecycle definition against a
 * real database: migrate creates them from the file, and says what an
 * existing one lacks; run refuses a schema its definition does not fit.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "itest.h"
#include "status.h"

static void drop_shipment_tables(void)
{
	struct db *d = itest_db();

	cr_assert_eq(db_exec(d, "DROP TABLE IF EXISTS shipments, shipment_events, shipment_locks"), ST_OK, "%s",
	             db_errmsg(d));
}

static void lifecycle_env(char *buf, size_t cap, const char *rel)
{
	char path[4096];

	snprintf(buf, cap, "INBOX_LIFECYCLE=%s", itest_source(rel, path, sizeof path));
}

static int run_logged(const char *cmd, const char *env1, const char *log)
{
	const char *args[] = { cmd, NULL };
	const char *env[] = { env1, NULL };
	pid_t pid = itest_spawn_logged(args, env1 != NULL ? env : NULL, log);
	int st = itest_wait_exit(pid, 120);

	cr_assert(WIFEXITED(st), "%s ended by a signal", cmd);
	return WEXITSTATUS(st);
}

Test(lifecycle_schema, the_order_definition_fits_the_migrated_schema)
{
	char env[4200], log[256];

	itest_fresh();
	lifecycle_env(env, sizeof env, "lifecycles/order.json");
	itest_log_path(log, sizeof log, "lc-order-migrate");
	cr_expect_eq(run_logged("migrate", env, log), 0, "see %s", log);
	cr_expect(itest_log_has(log, "the lifecycle's tables match its definition"), "see %s", log);
}

Test(lifecycle_schema, migrate_creates_the_shipment_tables_and_says_what_an_existing_one_lacks)
{
	char env[4200], log[256];
	struct db *d;

	itest_fresh();
	drop_shipment_tables();
	lifecycle_env(env, sizeof env, "lifecycles/shipment.json");
	itest_log_path(log, sizeof log, "lc-shipment-migrate");
	cr_assert_eq(run_logged("migrate", env, log), 0, "see %s", log);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()"
	                       " AND table_name IN ('shipments', 'shipment_events', 'shipment_locks')"),
	             3);
	cr_expect_eq(itest_int("SELECT character_maximum_length FROM information_schema.columns WHERE"
	                       " table_schema = DATABASE() AND table_name = 'shipments' AND column_name = 'tracking_number'"),
	             64);
	/* Twice is the same: the tables are there, nothing differs. */
	cr_assert_eq(run_logged("migrate", env, log), 0, "see %s", log);

	/* The table is the user's: a difference is said, with its remedy,
	 * and nothing is changed. */
	d = itest_db();
	cr_assert_eq(db_exec(d, "ALTER TABLE shipments DROP COLUMN delivered_at"), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_exec(d, "ALTER TABLE shipments MODIFY COLUMN tracking_number VARCHAR(20) NULL"), ST_OK, "%s",
	             db_errmsg(d));
	cr_expect_eq(run_logged("migrate", env, log), 1, "see %s", log);
	cr_expect(itest_log_has(log, "shipments.delivered_at is missing: ALTER TABLE `shipments` ADD COLUMN "
	                             "`delivered_at` DATETIME(6) NULL"), "see %s", log);
	cr_expect(itest_log_has(log, "shipments.tracking_number holds 20 characters, the definition needs 64"),
	          "see %s", log);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE()"
	                       " AND table_name = 'shipments' AND column_name = 'delivered_at'"),
	             0, "migrate changed nothing in an existing table");
	cr_expect_eq(itest_int("SELECT character_maximum_length FROM information_schema.columns WHERE"
	                       " table_schema = DATABASE() AND table_name = 'shipments' AND column_name = 'tracking_number'"),
	             20, "migrate widens nothing in a table that differs otherwise");
	drop_shipment_tables();
}

/* A table an earlier version created lacks the column a later one keeps
 * itself (lifecycle_version, issue 46): run says to migrate, and migrate
 * adds it, keeping the rows, which say no version. */
Test(lifecycle_schema, migrate_adds_the_workers_own_new_column_to_an_existing_table)
{
	char env[4200], log[256], text[4096];
	struct db *d;

	itest_fresh();
	drop_shipment_tables();
	lifecycle_env(env, sizeof env, "lifecycles/shipment.json");
	itest_log_path(log, sizeof log, "lc-kept-migrate");
	cr_assert_eq(run_logged("migrate", env, log), 0, "see %s", log);
	d = itest_db();
	cr_assert_eq(db_exec(d, "ALTER TABLE shipments DROP COLUMN lifecycle_version"), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_exec(d, "INSERT INTO shipments (id, status, version, flags, created_at, updated_at)"
	                        " VALUES ('s-1', 'Labelled', 1, 0, NOW(6), NOW(6))"), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_commit(d), ST_OK);

	itest_log_path(log, sizeof log, "lc-kept-run");
	cr_expect_eq(run_logged("run", env, log), 2, "see %s", log);
	itest_read_file(log, text, sizeof text);
	cr_expect(strstr(text, "shipments.lifecycle_version is missing: ALTER TABLE `shipments` ADD COLUMN "
	                       "`lifecycle_version` VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL (run "
	                       "`inbox-worker migrate` with the same INBOX_LIFECYCLE)") != NULL, "%s", text);

	itest_log_path(log, sizeof log, "lc-kept-migrate-again");
	cr_expect_eq(run_logged("migrate", env, log), 0, "see %s", log);
	cr_expect(itest_log_has(log, "the worker's own columns added to the lifecycle's tables"), "see %s", log);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM shipments WHERE id = 's-1' AND lifecycle_version IS NULL"), 1,
	             "the row is kept, of no version");
	drop_shipment_tables();
}

Test(lifecycle_schema, run_refuses_a_schema_the_definition_does_not_fit)
{
	char log[256], text[4096];
	struct db *d;

	itest_fresh();
	d = itest_db();
	cr_assert_eq(db_exec(d, "ALTER TABLE orders DROP COLUMN paid_at"), ST_OK, "%s", db_errmsg(d));
	itest_log_path(log, sizeof log, "lc-run-refused");
	cr_expect_eq(run_logged("run", NULL, log), 2, "see %s", log);
	itest_read_file(log, text, sizeof text);
	cr_expect(strstr(text, "inbox-worker: INBOX_LIFECYCLE (built-in) needs a schema change: orders.paid_at is "
	                       "missing: ALTER TABLE `orders` ADD COLUMN `paid_at` DATETIME(6) NULL (run `inbox-worker "
	                       "migrate` with the same INBOX_LIFECYCLE)\n") != NULL, "%s", text);
	itest_fresh(); /* the next suite's schema */
}
