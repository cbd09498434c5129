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
 *     any definition (issue 27, helper 1's wt-lrun);
 *   - lifecycles/invoice.json: a definition with statements of its own
 *     (issue 45) on the tables of lifecycles/invoice.sql: verify also
 *     finds each payment's ledger_entries row once and every account's
 *     balance at its baseline plus the payments, and, once a row is taken
 *     away and a balance moved, says so and fails;
 *   - lifecycles/ticket.json: numbered by its producer (issue 46), with a
 *     reopen loop: the messages carry their numbers, verify counts each
 *     emitted event by its cause's number (CustomerNotified at 3 and 5 on
 *     the loop), and fails for a number the ledger expects and nothing
 *     emitted, and for one emitted that the ledger does not expect;
 *   - lifecycles/subscription.json: numbered in data.revision, renewed
 *     in place (Active to Active) and recovered from PastDue, with one
 *     emitted type (InvoiceIssued) from two events.
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
#include "receiver.h"
#include "status.h"

/* A run's files, for a test that verifies its ledger again. */
struct lgl_run {
	char file[1024], ledger[256], vlog[300];
};

/* Migrate with the definition, publish a scenario of it while two workers
 * run it, verify against it.  tables: the definition's own tables and
 * those of its statements, dropped first so that migrate and own_sql
 * create them as this build says (itest_fresh drops the order's); NULL
 * for the order definition.  own_sql: the file that creates its
 * statements' tables (relative to the source root), or NULL. */
static void run_lifecycle(const char *rel, const char *name, const char *const *tables, const char *own_sql,
                          struct lgl_run *out)
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
	if (own_sql != NULL) {
		static char script[16384];
		char path[1100];
		size_t len;

		snprintf(path, sizeof path, "%s/%s", root, own_sql);
		len = itest_read_file(path, script, sizeof script);
		cr_assert_gt(len, 0, "%s", path);
		cr_assert_eq(db_exec_script(itest_db(), script, len), ST_OK, "%s: %s", own_sql, db_errmsg(itest_db()));
		cr_assert_eq(db_commit(itest_db()), ST_OK);
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
	if (out != NULL) {
		snprintf(out->file, sizeof out->file, "%s", file);
		snprintf(out->ledger, sizeof out->ledger, "%s", ledger);
		snprintf(out->vlog, sizeof out->vlog, "%s", vlog);
	}
}

static const char *const invoice_tables[] = { "invoice_events", "invoice_locks", "invoices", "ledger_entries",
	                                           "accounts", NULL };

/* The run of the invoice definition, with the statement lines of a clean
 * report: every payment's row once, every sum right, nothing uncheckable. */
static void run_invoice(struct lgl_run *r)
{
	/* The mail service of its receipts: refusing a fifth of the calls */
	const char *flaky[] = { "--fail-ratio", "0.2", "--seed", "3", NULL };
	struct rcv_child mail;
	char url[64];
	int keys, replays, conflicts;

	rcv_start(&mail, flaky);
	snprintf(url, sizeof url, "http://127.0.0.1:%d/receipts", mail.port);
	cr_assert_eq(setenv("INVOICE_MAIL_URL", url, 1), 0);
	run_lifecycle("lifecycles/invoice.json", "invoice", invoice_tables, "lifecycles/invoice.sql", r);
	rcv_stop(&mail);
	/* verify waited for the outbox, the mail's rows with the rest: each
	 * receipt the workers wrote reached the service, accepted once */
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE destination = 'mail' AND sent_at IS NULL"), 0);
	(void)rcv_accepted(&mail, &keys, &replays, &conflicts);
	cr_assert_gt(keys, 0, "no receipt reached the mail service");
	cr_assert_eq(keys, itest_int("SELECT COUNT(*) FROM outbox WHERE destination = 'mail'"),
	             "every receipt the workers wrote accepted once, and no other");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE destination = 'mail' AND type <> 'ReceiptRequested'"),
	             0);
	cr_expect_eq(replays, 0, "no receipt sent again after its 200");
	cr_expect_eq(conflicts, 0, "no key sent with two bodies");
	cr_assert_eq(unlink(mail.log), 0);
	cr_assert(itest_log_has(r->vlog, "statements  4: checked 4 (2 keyed inserts, 2 additions), cannot check 0"),
	          "see %s", r->vlog);
	cr_assert(itest_log_has(r->vlog, "missing 0, doubled 0, wrong values 0, unexpected 0"), "see %s", r->vlog);
	cr_assert(itest_log_has(r->vlog, ", statement rows 0"), "see %s", r->vlog);
	cr_assert(itest_log_has(r->vlog, "statement sums checked "), "see %s", r->vlog);
	cr_assert(itest_log_has(r->vlog, ", wrong 0 (keys without a baseline, not checked: 0)"), "see %s", r->vlog);
	cr_assert_gt(itest_int("SELECT COUNT(*) FROM ledger_entries WHERE kind = 'payment'"), 0, "no payment ran");
	cr_assert_gt(itest_int("SELECT COUNT(*) FROM accounts WHERE balance_cents > 0"), 0, "no balance moved");
}

Test(lifecycle_load, order_definition_file_verifies_clean, .timeout = 600)
{
	run_lifecycle("lifecycles/order.json", "order", NULL, NULL, NULL);
}

Test(lifecycle_load, shipment_definition_verifies_clean, .timeout = 600)
{
	static const char *const tables[] = { "shipment_events", "shipment_locks", "shipments", NULL };

	run_lifecycle("lifecycles/shipment.json", "shipment", tables, NULL, NULL);
}

Test(lifecycle_load, invoice_definition_with_statements_verifies_rows_and_sums, .timeout = 600)
{
	struct lgl_run r;

	run_invoice(&r);
}

/* A verify that cannot fail checks nothing: after a clean run, one
 * payment's ledger row is taken away and one balance moved by a cent, and
 * verify, run again on the same ledger, must fail naming both. */
Test(lifecycle_load, invoice_verify_catches_a_lost_row_and_a_wrong_sum, .timeout = 600)
{
	struct lgl_run r;
	const char *ver[] = { "verify", "--lifecycle", r.file, "--ledger", r.ledger, "--timeout", "60", NULL };
	char vlog[320], lost[256], account[32];
	int64_t id;

	run_invoice(&r);
	snprintf(vlog, sizeof vlog, "%s.again.log", r.ledger);
	cr_assert(itest_str1("SELECT message_id FROM ledger_entries WHERE kind = ? ORDER BY id LIMIT 1", "payment", lost,
	                     sizeof lost));
	id = itest_int("SELECT MIN(id) FROM accounts WHERE balance_cents > 0");
	cr_assert_gt(id, 0);
	snprintf(account, sizeof account, "%lld", (long long)id);
	cr_assert_eq(db_exec(itest_db(), "DELETE FROM ledger_entries WHERE kind = 'payment' ORDER BY id LIMIT 1"), ST_OK,
	             "%s", db_errmsg(itest_db()));
	cr_assert_eq(db_exec(itest_db(), "UPDATE accounts SET balance_cents = balance_cents + 1 WHERE balance_cents > 0"
	                                 " ORDER BY id LIMIT 1"), ST_OK, "%s", db_errmsg(itest_db()));
	cr_assert_eq(db_commit(itest_db()), ST_OK);
	cr_assert_neq(itest_loadgen(ver, NULL, vlog, 300), 0, "verify passed a lost row and a wrong sum, see %s", vlog);
	cr_assert(itest_log_has(vlog, "missing 1, doubled 0, wrong values 0"), "see %s", vlog);
	cr_assert(itest_log_has(vlog, ", statement rows 1"), "see %s", vlog);
	cr_assert(itest_log_has(vlog, "statement sums checked "), "see %s", vlog);
	cr_assert(itest_log_has(vlog, ", wrong 1 (keys without a baseline"), "see %s", vlog);
	{
		char want[400];
		snprintf(want, sizeof want, "%s: no ledger_entries row (statement 1 of PaymentReceived)", lost);
		cr_assert(itest_log_has(vlog, want), "lacks \"%s\", see %s", want, vlog);
		snprintf(want, sizeof want, "accounts.balance_cents where id = %s is ", account);
		cr_assert(itest_log_has(vlog, want), "lacks \"%s\", see %s", want, vlog);
	}
	cr_assert(itest_log_has(vlog, "result      FAIL"), "see %s", vlog);
}

static const char *const ticket_tables[] = { "ticket_events", "ticket_locks", "tickets", NULL };

/* Rewrite the ledger at path: the first order line of the loop route
 * (its emitted list names CustomerNotified twice) loses its second
 * CustomerNotified, and the next such line gains one at number 9 that no
 * event caused.  The ids of both into lost and extra. */
static void ticket_ledger_tamper(const char *path, char *lost, char *extra, size_t cap)
{
	static char text[4 << 20], out[4 << 20];
	static const char twice[] = "[\"CustomerNotified\",3],[\"CustomerNotified\",5]";
	size_t len = itest_read_file(path, text, sizeof text), o = 0;
	char *line = text, *nl;
	int done = 0;
	FILE *f;

	cr_assert_gt(len, 0, "%s", path);
	lost[0] = extra[0] = '\0';
	for (; line < text + len; line = nl + 1) {
		char *at = strstr(line, twice);

		nl = strchr(line, '\n');
		cr_assert_not_null(nl);
		*nl = '\0';
		if (at != NULL && at < nl && done < 2) {
			const char *id = strstr(line, "\"id\":\"") + 6;

			snprintf(done == 0 ? lost : extra, cap, "%.*s", (int)strcspn(id, "\""), id);
			o += (size_t)snprintf(out + o, sizeof out - o, "%.*s%s%s\n", (int)(at - line), line,
			                      done == 0 ? "[\"CustomerNotified\",3]"
			                                : "[\"CustomerNotified\",3],[\"CustomerNotified\",5],[\"CustomerNotified\",9]",
			                      at + strlen(twice));
			done++;
		} else {
			o += (size_t)snprintf(out + o, sizeof out - o, "%s\n", line);
		}
	}
	cr_assert_eq(done, 2, "two aggregates on the loop route in %s", path);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(out, 1, o, f), o);
	cr_assert_eq(fclose(f), 0);
}

/* A numbered definition with a loop: a clean run, then the same run
 * judged against a ledger told one emitted event fewer on one ticket and
 * one more on another: verify must name both. */
Test(lifecycle_load, numbered_ticket_verifies_each_emitted_event_by_its_number, .timeout = 600)
{
	struct lgl_run r;
	const char *ver[] = { "verify", "--lifecycle", r.file, "--ledger", r.ledger, "--timeout", "60", NULL };
	char vlog[320], lost[128], extra[128], want[400];

	run_lifecycle("lifecycles/ticket.json", "ticket", ticket_tables, NULL, &r);
	cr_assert(itest_log_has(r.vlog, "result      OK"), "see %s", r.vlog);
	cr_assert_gt(itest_int("SELECT COUNT(*) FROM outbox WHERE message_id LIKE 'CustomerNotified:%:5'"), 0,
	             "no ticket took the loop");
	ticket_ledger_tamper(r.ledger, lost, extra, sizeof lost);
	snprintf(vlog, sizeof vlog, "%s.again.log", r.ledger);
	cr_assert_neq(itest_loadgen(ver, NULL, vlog, 300), 0, "verify passed a tampered ledger, see %s", vlog);
	snprintf(want, sizeof want, "%s: CustomerNotified (cause number 9) not emitted", extra);
	cr_assert(itest_log_has(vlog, want), "lacks \"%s\", see %s", want, vlog);
	snprintf(want, sizeof want, "%s: emitted CustomerNotified for number 5, which the ledger does not expect", lost);
	cr_assert(itest_log_has(vlog, want), "lacks \"%s\", see %s", want, vlog);
	cr_assert(itest_log_has(vlog, "result      FAIL"), "see %s", vlog);
}

/* The subscription: two loops, one a renewal that stays in Active, and
 * an emitted type two events share, each under its cause and number. */
Test(lifecycle_load, numbered_subscription_with_renewals_verifies_clean, .timeout = 600)
{
	static const char *const tables[] = { "subscription_events", "subscription_locks", "subscriptions", NULL };
	struct lgl_run r;

	run_lifecycle("lifecycles/subscription.json", "subscription", tables, NULL, &r);
	cr_assert(itest_log_has(r.vlog, "result      OK"), "see %s", r.vlog);
	cr_assert_gt(itest_int("SELECT COUNT(*) FROM outbox WHERE message_id LIKE 'InvoiceIssued:%:SubscriptionRenewed:%'"),
	             0, "no subscription was renewed");
	cr_assert_gt(itest_int("SELECT COUNT(*) FROM subscription_events WHERE type = 'PaymentRecovered'"), 0,
	             "no subscription recovered");
}
