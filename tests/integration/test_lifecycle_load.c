/*
 * test_lifecycle_load.c - inbox-loadgen driven by a lifecycle definition
 * against the real stack: publish --lifecycle FILE, two workers with
 * INBOX_LIFECYCLE=FILE, verify --lifecycle FILE: every effect exactly once,
 * every aggregate in the state and version its route ends in, every
 * emitted event once under its stable id.
 *
 *   - lifecycles/order.json: the order lifecycle read from its file, as the
 *     worker runs it today;
 *   - lifecycles/shipment.json: another aggregate, table and key
 *     (shipments, shipment_events, shipment_id); needs a worker that runs
 *     any definition (issue 27, helper 1's wt-lrun).
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "db.h"
#include "itest.h"
#include "status.h"

/* Migrate with the definition, publish a scenario of it while two workers
 * run it, verify against it.  tables: the definition's own tables, dropped
 * first so that migrate creates them as this build's definition says
 * (itest_fresh drops the order's); NULL for the order definition. */
static void run_lifecycle(const char *rel, const char *name, const char *const *tables)
{
	const char *root = getenv("INBOX_SOURCE_ROOT");
	char file[1024], env_lc[1100], ledger[256], plog[300], vlog[300];
	const char *env[] = { env_lc, NULL };
	const char *migrate[] = { "migrate", NULL };
	const char *pub[] = { "publish", "--lifecycle", file, "--ledger", ledger, "--orders", "150", "--conflicts", "5",
	                      "--malformed", "14", "--invalid-share", "0.05", "--connections", "4",
	                      "--reorder-window", "3", "--settle-timeout", "120", NULL };
	const char *ver[] = { "verify", "--lifecycle", file, "--ledger", ledger, "--timeout", "120", NULL };
	pid_t w1, w2;
	int st, rc;

	cr_assert_not_null(root, "INBOX_SOURCE_ROOT is set by meson");
	snprintf(file, sizeof file, "%s/%s", root, rel);
	snprintf(env_lc, sizeof env_lc, "INBOX_LIFECYCLE=%s", file);
	snprintf(ledger, sizeof ledger, "%s/inbox-lgl-%s-%d.jsonl", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", name,
	         (int)getpid());
	snprintf(plog, sizeof plog, "%s.publish.log", ledger);
	snprintf(vlog, sizeof vlog, "%s.verify.log", ledger);
	itest_fresh();
	for (int i = 0; tables != NULL && tables[i] != NULL; i++) {
		char sql[160];
		snprintf(sql, sizeof sql, "DROP TABLE IF EXISTS `%s`", tables[i]);
		cr_assert_eq(db_exec(itest_db(), sql), ST_OK, "%s: %s", sql, db_errmsg(itest_db()));
	}
	st = itest_wait_exit(itest_spawn(migrate, env), 120);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "migrate with %s failed (status %d)", rel, st);
	w1 = itest_worker(4, env);
	w2 = itest_worker(4, env);
	rc = itest_loadgen(pub, NULL, plog, 300);
	if (rc == 0)
		rc = itest_loadgen(ver, NULL, vlog, 300) == 0 ? 0 : 100;
	itest_stop(w1, SIGTERM, 30);
	itest_stop(w2, SIGTERM, 30);
	cr_assert_neq(rc, 100, "verify failed, see %s", vlog);
	cr_assert_eq(rc, 0, "publish failed, see %s", plog);
	cr_assert(itest_log_has(vlog, "missing 0, doubled 0"), "report lacks the zero counts, see %s", vlog);
	cr_assert(itest_log_has(vlog, "missing     0 in all"), "see %s", vlog);
	cr_assert(itest_log_has(vlog, "without the stable id 0)"), "see %s", vlog);
}

Test(lifecycle_load, order_definition_file_verifies_clean, .timeout = 600)
{
	run_lifecycle("lifecycles/order.json", "order", NULL);
}

Test(lifecycle_load, shipment_definition_verifies_clean, .timeout = 600)
{
	static const char *const tables[] = { "shipment_events", "shipment_locks", "shipments", NULL };

	run_lifecycle("lifecycles/shipment.json", "shipment", tables);
}
