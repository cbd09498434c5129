/*
 * test_cleanup.c - retention cleanup against the real stack: one process
 * at a time (the others skip and say so), slices that leave the janitor
 * free to relay the outbox while thousands of expired rows are deleted,
 * and the rows that must stay (inside the window, held, unsent).  Expired
 * rows are seeded with INSERT ... SELECT from MariaDB's sequence engine.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"
#include "retention.h"
#include "status.h"

#define WAIT_S 120

/* What the seeded rows are recognised by. */
#define EXPIRED_SQL "SELECT COUNT(*) FROM processed_messages WHERE consumer = 'order-status' AND source = 'expired'"

static void exec_ok(const char *sql)
{
	cr_assert_eq(db_exec(itest_db(), sql), ST_OK, "%s: %s", sql, db_errmsg(itest_db()));
	cr_assert_eq(db_commit(itest_db()), ST_OK);
}

/* n processed_messages rows of source 'expired', 8 days old (past the
 * default 7d retention), in processed_at order of their number. */
static void seed_expired(int n)
{
	char sql[1024];

	snprintf(sql, sizeof sql,
	         "INSERT INTO processed_messages (consumer, source, message_id, payload_sha256, type, order_id,"
	         " outcome, processed_at)"
	         " SELECT 'order-status', 'expired', CONCAT('exp-', seq), SHA2(seq, 256), 'OrderCreated',"
	         " CONCAT('exp-o', seq), 'applied', NOW(6) - INTERVAL 8 DAY + INTERVAL seq * 1000 MICROSECOND"
	         " FROM seq_1_to_%d",
	         n);
	exec_ok(sql);
	cr_assert_eq(itest_int(EXPIRED_SQL), n);
}

/* n outbox rows PREFIX-1..PREFIX-n for orders.out, created and sent at
 * the given SQL times (sent_at "NULL": still to leave). */
static void seed_outbox(const char *prefix, int n, const char *created_at, const char *sent_at)
{
	char sql[1024];

	snprintf(sql, sizeof sql,
	         "INSERT INTO outbox (message_id, exchange, routing_key, type, order_id, body, created_at, sent_at)"
	         " SELECT CONCAT('%s-', seq), 'orders.out', 'order.OrderPaid', 'OrderPaid', 'o', '{}', %s, %s"
	         " FROM seq_1_to_%d",
	         prefix, created_at, sent_at, n);
	exec_ok(sql);
}

static int exit_code(int st)
{
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* Two `inbox-worker cleanup` at once: the second finds the named lock
 * taken, deletes nothing and says so; the first deletes every expired row.
 * To have both run at once without a race, the test locks the oldest
 * expired row, so the first cleanup stays in its first slice (holding the
 * cleanup lock) until the test lets go. */
Test(cleanup, two_cleanups_at_once_only_one_deletes, .timeout = 300)
{
	const char *args[] = { "cleanup", NULL };
	char log_a[256], log_b[256];
	struct db *hold = NULL;
	pid_t a, b;
	int st_a, st_b;

	itest_fresh();
	seed_expired(5000);
	cr_assert_eq(db_open(&hold, &itest_cfg()->db), ST_OK);
	cr_assert_eq(db_exec(hold, "SELECT id FROM processed_messages WHERE consumer = 'order-status'"
	                           " AND source = 'expired' AND message_id = 'exp-1' FOR UPDATE"), ST_OK,
	             "%s", db_errmsg(hold));
	itest_log_path(log_a, sizeof log_a, "cleanup-a");
	itest_log_path(log_b, sizeof log_b, "cleanup-b");
	a = itest_spawn_logged(args, NULL, log_a);
	/* Not asserted here: a build without the lock never takes it, and
	 * then the assertions on B below say what went wrong. */
	itest_wait_int("SELECT IS_USED_LOCK(CONCAT('inbox-worker.cleanup.', DATABASE())) IS NOT NULL", 1, 30);
	b = itest_spawn_logged(args, NULL, log_b);
	st_b = itest_wait_exit(b, WAIT_S);
	db_rollback(hold);
	db_close(&hold);
	st_a = itest_wait_exit(a, WAIT_S);
	cr_assert(itest_log_has(log_b, "cleanup skipped"), "the second cleanup must skip and say so (see %s)", log_b);
	cr_assert_eq(exit_code(st_b), 0, "a skipped cleanup is not an error (status %d)", st_b);
	cr_assert_not(itest_log_has(log_b, "cleanup done"), "the second cleanup must not delete (see %s)", log_b);
	cr_assert_eq(exit_code(st_a), 0, "the first cleanup must finish (status %d, see %s)", st_a, log_a);
	cr_assert_eq(itest_log_sum(log_a, "cleanup done", "deleted"), 5000);
	cr_assert_eq(itest_int(EXPIRED_SQL), 0);
}

/* The janitor deletes in slices of RETENTION_SLICE_ROWS rows, at most
 * RETENTION_TICK_SLICES of them before it goes back to the relay.  An
 * OrderPaid committed while 201,250 expired rows are being deleted must be
 * relayed before the cleanup is done, with at most one tick's rows deleted
 * between its commit and its relay (two ticks allowed, for the moment the
 * test reads the count).  Not a timed assertion: it counts rows.  The
 * cleanup is 50 ticks long so that on any machine it is still under way
 * when the OrderPaid commits (with 50,000 rows, 12 ticks, a fast machine
 * finished it between the test's polls, and "nothing left" then said
 * nothing of the relay).  Not a multiple of a slice: a pass that ends on
 * a full slice says "retention cleanup" only at the next tick, which the
 * worker's stop may come before. */
Test(cleanup, janitor_slices_leave_the_relay_running, .timeout = 600)
{
	const int64_t tick_rows = (int64_t)RETENTION_SLICE_ROWS * RETENTION_TICK_SLICES;
	const char *out = "itest.out";
	struct itest_dead got[4];
	char body[512], logf[256];
	int64_t c0, c1;
	struct mq *m;
	pid_t w;

	itest_fresh();
	seed_expired(201250);
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	m = itest_mq();
	itest_event(body, sizeof body, "c-1", "OrderCreated", "o-c");
	itest_publish(m, "OrderCreated", body, NULL);
	itest_log_path(logf, sizeof logf, "janitor-cleanup");
	/* The relay publishes the row: with the committing thread's dispatch
	 * (the default) the janitor would have nothing to publish. */
	w = itest_worker_logged(1, (const char *[]){ "INBOX_CLEANUP_INTERVAL=1s", "INBOX_OUTBOX_DISPATCH=relay", NULL },
	                        logf);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", 1, WAIT_S), 1);
	cr_assert_eq(itest_wait_int("SELECT (" EXPIRED_SQL ") < 201250", 1, WAIT_S), 1, "the cleanup never started");
	itest_event(body, sizeof body, "c-2", "PaymentAuthorized", "o-c");
	itest_publish(m, "PaymentAuthorized", body, NULL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox", 1, WAIT_S), 1);
	c0 = itest_int(EXPIRED_SQL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NOT NULL", 1, WAIT_S), 1,
	             "the OrderPaid was never relayed");
	c1 = itest_int(EXPIRED_SQL);
	cr_assert_gt(c1, 0, "the relay waited for the whole cleanup (%lld expired rows left at commit)", (long long)c0);
	cr_assert_leq(c0 - c1, 2 * tick_rows, "%lld rows deleted between the commit and the relay; a tick is %lld",
	              (long long)(c0 - c1), (long long)tick_rows);
	cr_assert_eq(itest_drain(out, got, 4, 1, WAIT_S), 1);
	cr_assert_str_eq(got[0].message_id, "OrderPaid:o-c");
	/* The janitor goes on until it has caught up. */
	cr_assert_eq(itest_wait_int(EXPIRED_SQL, 0, 300), 0, "the janitor did not finish the cleanup");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages"), 2, "the live messages' rows stay");
	{
		int st = itest_stop(w, SIGTERM, 60);
		cr_assert_eq(exit_code(st), 0, "worker must exit 0 on SIGTERM (status %d)", st);
	}
	mq_close(&m);
	cr_assert_eq(itest_log_sum(logf, "retention cleanup", "deleted"), 201250, "see %s", logf);
}

/* Across several slices: rows inside the retention window, held rows
 * (whatever their age) and unsent outbox rows stay; expired inbox rows and
 * sent outbox rows past the window go. */
Test(cleanup, rows_inside_the_window_held_and_unsent_are_kept, .timeout = 300)
{
	const char *args[] = { "cleanup", NULL };
	char logf[256];
	int st;

	itest_fresh();
	seed_expired(3 * RETENTION_SLICE_ROWS + 7);
	/* Held rows among the expired ones, older than the window. */
	exec_ok("UPDATE processed_messages SET outcome = 'held' WHERE source = 'expired'"
	        " AND message_id IN ('exp-1', 'exp-250', 'exp-700', 'exp-1200', 'exp-1507')");
	exec_ok("INSERT INTO processed_messages (consumer, source, message_id, payload_sha256, type, order_id,"
	        " outcome, processed_at)"
	        " SELECT 'order-status', 'recent', CONCAT('rec-', seq), SHA2(seq, 256), 'OrderCreated',"
	        " CONCAT('rec-o', seq), 'applied', NOW(6) - INTERVAL 6 DAY + INTERVAL seq SECOND FROM seq_1_to_10");
	/* Outbox: sent long ago (goes), sent yesterday (stays), never sent
	 * though created long ago (stays: it still has to leave). */
	seed_outbox("old-sent", 700, "NOW(6) - INTERVAL 9 DAY", "NOW(6) - INTERVAL 8 DAY + INTERVAL seq SECOND");
	seed_outbox("new-sent", 3, "NOW(6) - INTERVAL 1 DAY", "NOW(6) - INTERVAL 1 DAY");
	seed_outbox("unsent", 3, "NOW(6) - INTERVAL 9 DAY", "NULL");
	itest_log_path(logf, sizeof logf, "cleanup-kept");
	st = itest_wait_exit(itest_spawn_logged(args, NULL, logf), WAIT_S);
	cr_assert_eq(exit_code(st), 0, "status %d, see %s", st, logf);
	cr_assert_eq(itest_int(EXPIRED_SQL " AND outcome <> 'held'"), 0);
	cr_assert_eq(itest_int(EXPIRED_SQL " AND outcome = 'held'"), 5, "held rows are never deleted");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE source = 'recent'"), 10,
	             "rows inside the retention window stay");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE message_id LIKE 'old-sent-%'"), 0);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE message_id LIKE 'new-sent-%'"), 3);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL"), 3, "unsent rows stay");
	cr_assert_eq(itest_log_sum(logf, "cleanup done", "deleted"), 3 * RETENTION_SLICE_ROWS + 7 - 5 + 700);
}

/* `cleanup --dry-run` counts what a cleanup would delete — expired inbox
 * rows that are not held, sent outbox rows past the window — deletes
 * nothing and says so; the real cleanup then deletes exactly that many. */
Test(cleanup, dry_run_counts_and_deletes_nothing, .timeout = 300)
{
	const char *dry[] = { "cleanup", "--dry-run", NULL }, *real[] = { "cleanup", NULL };
	char logd[256], logr[256];
	int st;

	itest_fresh();
	seed_expired(RETENTION_SLICE_ROWS + 3);
	exec_ok("UPDATE processed_messages SET outcome = 'held' WHERE source = 'expired'"
	        " AND message_id IN ('exp-1', 'exp-2')");
	seed_outbox("old-sent", 40, "NOW(6) - INTERVAL 9 DAY", "NOW(6) - INTERVAL 8 DAY");
	seed_outbox("unsent", 3, "NOW(6) - INTERVAL 9 DAY", "NULL");
	itest_log_path(logd, sizeof logd, "cleanup-dry");
	st = itest_wait_exit(itest_spawn_logged(dry, NULL, logd), WAIT_S);
	cr_assert_eq(exit_code(st), 0, "status %d, see %s", st, logd);
	cr_assert_eq(itest_int(EXPIRED_SQL), RETENTION_SLICE_ROWS + 3, "a dry run deleted inbox rows, see %s", logd);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox"), 43, "a dry run deleted outbox rows, see %s", logd);
	cr_assert(itest_log_has(logd, "dry run"), "the dry run does not say it deleted nothing, see %s", logd);
	cr_assert_eq(itest_log_sum(logd, "cleanup dry run", "processed_messages"), RETENTION_SLICE_ROWS + 1,
	             "see %s", logd);
	cr_assert_eq(itest_log_sum(logd, "cleanup dry run", "outbox"), 40, "see %s", logd);
	itest_log_path(logr, sizeof logr, "cleanup-after-dry");
	st = itest_wait_exit(itest_spawn_logged(real, NULL, logr), WAIT_S);
	cr_assert_eq(exit_code(st), 0, "status %d, see %s", st, logr);
	cr_assert_eq(itest_log_sum(logr, "cleanup done", "deleted"), RETENTION_SLICE_ROWS + 1 + 40, "see %s", logr);
}
