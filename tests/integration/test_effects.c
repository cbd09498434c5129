/*
 * test_effects.c - a definition's own statements run in the claim's
 * transaction (issue 45), against the real database: lifecycles/invoice.json
 * with its own tables (lifecycles/invoice.sql).
 *
 *   - a batch where some payments' statements are refused by their own
 *     data (a foreign key, a value out of range in the second statement,
 *     a duplicate key) dead-letters those as effect-failed with the
 *     server's words, and applies every other message of the batch, each
 *     statement once; a held payment runs its statements when released;
 *     the batch delivered again changes nothing;
 *   - a statement that waits past the lock wait time-out (a fault of the
 *     server, not of the message) rolls the batch back whole and
 *     dead-letters nothing: run again, it applies;
 *   - the worker itself: a payment after a cancellation compensates and
 *     runs the compensation's statements, a refused one reaches the DLQ
 *     with reason effect-failed and the server's words in its detail;
 *   - `run` refuses a definition whose statement the server cannot
 *     prepare, with exit 2 and one line naming the file, the line and the
 *     server's words.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "aggregate.h"
#include "db.h"
#include "inbox.h"
#include "itest.h"
#include "receiver.h"
#include "lifecycle.h"
#include "msg.h"
#include "status.h"

#define WAIT_S 120
#define MAXB 16
#define NEAR_MAX "9223372036854775000" /* a balance one payment takes out of BIGINT's range */

static struct lc_def *invoice_def;
static struct agg_binding invoice_bind;
/* The mail service invoice.json sends its receipts to (INVOICE_MAIL_URL);
 * the suite test_destinations is where they are judged. */
static struct rcv_child mail;

/* Fresh worker tables for the invoice definition, and the example's own
 * tables with accounts 1, 2 and 5 (5 near BIGINT's end); 3 does not exist.
 * invoice.sql seeds accounts 1 .. 1000 for the load generator: these tests
 * need accounts of their own making, so its seed is removed first. */
static void invoice_setup(void)
{
	char path[4096], env[4200], sql[16384];
	const char *menv[] = { env, NULL };
	const char *margs[] = { "migrate", NULL };
	struct lc_errors errs;
	struct db *d;
	size_t len;
	int st;

	itest_fresh();
	if (mail.pid == 0) {
		char url[64];

		rcv_start(&mail, NULL);
		cr_assert_eq(unlink(mail.log), 0, "read by no one here");
		snprintf(url, sizeof url, "http://127.0.0.1:%d/receipts", mail.port);
		cr_assert_eq(setenv("INVOICE_MAIL_URL", url, 1), 0);
	}
	d = itest_db();
	cr_assert_eq(db_exec(d, "DROP TABLE IF EXISTS ledger_entries, accounts, invoices, invoice_events, invoice_locks"),
	             ST_OK, "%s", db_errmsg(d));
	len = itest_read_file(itest_source("lifecycles/invoice.sql", path, sizeof path), sql, sizeof sql);
	cr_assert_gt(len, 0);
	cr_assert_eq(db_exec_script(d, sql, len), ST_OK, "invoice.sql: %s", db_errmsg(d));
	cr_assert_eq(db_exec(d, "DELETE FROM accounts"), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_exec(d, "INSERT INTO accounts (id, balance_cents) VALUES (1, 0), (2, 0), (5, " NEAR_MAX ")"),
	             ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_commit(d), ST_OK);
	snprintf(env, sizeof env, "INBOX_LIFECYCLE=%s", itest_source("lifecycles/invoice.json", path, sizeof path));
	st = itest_wait_exit(itest_spawn(margs, menv), 120);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "migrate with the invoice lifecycle (status %d)", st);
	if (invoice_def == NULL) {
		char why[512] = "";

		invoice_def = lc_load_file(path, &errs);
		cr_assert_not_null(invoice_def);
		cr_assert_eq(agg_bind(invoice_def, &invoice_bind, why, sizeof why), 0, "%s", why);
	}
}

struct tb {
	char body[MAXB][512];
	struct msg m[MAXB];
	struct inbox_in in[MAXB];
	struct inbox_result res[MAXB];
	int n;
};

static void tb_add(struct tb *b, const char *id, const char *type, const char *invoice, const char *data)
{
	int i = b->n++;

	cr_assert(i < MAXB);
	snprintf(b->body[i], sizeof b->body[i],
	         "{\"message_id\":\"%s\",\"source\":\"billing\",\"type\":\"%s\",\"invoice_id\":\"%s\","
	         "\"occurred_at\":\"2026-12-01T10:00:00Z\",\"data\":{%s}}", id, type, invoice, data);
	cr_assert_eq(msg_parse(b->body[i], strlen(b->body[i]), 65536, NULL, &b->m[i]), MSG_REASON_NONE, "%s: %s", id,
	             b->m[i].detail);
	b->in[i] = (struct inbox_in){ .msg = &b->m[i], .body = b->body[i], .len = strlen(b->body[i]),
		                          .routing_key = "order.itest" };
}

static int tb_run(struct inbox *ib, struct tb *b)
{
	memset(b->res, 0, sizeof b->res);
	return inbox_run(ib, b->in, b->n, b->res);
}

static struct inbox *open_inbox(struct db **d)
{
	struct inbox *ib = NULL;

	cr_assert_eq(db_open(d, &itest_cfg()->db), ST_OK);
	cr_assert_eq(inbox_open(&ib, *d, itest_cfg()), ST_OK, "%s", db_errmsg(*d));
	return ib;
}

static int64_t ledger_rows(const char *message_id)
{
	return itest_int1("SELECT COUNT(*) FROM ledger_entries WHERE message_id = ?", message_id);
}

static void expect_effect_failed(const struct tb *b, int i, const char *words)
{
	char detail[512] = "";

	cr_expect_eq(b->res[i].outcome, INBOX_DEAD_LETTERED, "%s: outcome %d", b->m[i].message_id, b->res[i].outcome);
	cr_expect_eq(b->res[i].reason, MSG_REASON_EFFECT_FAILED, "%s: reason %d", b->m[i].message_id, b->res[i].reason);
	cr_expect_eq(itest_int1("SELECT COUNT(*) FROM processed_messages WHERE message_id = ? AND outcome = 'dead_lettered'"
	                        " AND reason = 'effect-failed'", b->m[i].message_id), 1, "%s", b->m[i].message_id);
	cr_expect(itest_str1("SELECT JSON_VALUE(CAST(headers AS CHAR), '$.\"x-inbox-detail\"') FROM outbox"
	                     " WHERE message_id = ? AND exchange LIKE '%.dlx'", b->m[i].message_id, detail, sizeof detail),
	          "%s has a dead-letter copy in the outbox", b->m[i].message_id);
	cr_expect(strstr(detail, words) != NULL, "%s detail: %s", b->m[i].message_id, detail);
	cr_expect(strstr(detail, "statement ") != NULL, "%s detail names the statement: %s", b->m[i].message_id, detail);
	cr_expect_eq(ledger_rows(b->m[i].message_id) - (strcmp(b->m[i].message_id, "pay-5") == 0), 0,
	             "%s: nothing of its statements stays", b->m[i].message_id);
}

Test(effects, a_refused_statement_dead_letters_its_message_and_nothing_else_in_the_batch, .timeout = 300)
{
	struct tb issue = { .n = 0 }, pay = { .n = 0 };
	struct inbox *ib;
	struct db *d = NULL;
	int rc;

	invoice_setup();
	agg_use(&invoice_bind);
	/* A row of the ledger written by someone else under pay-5's key. */
	cr_assert_eq(db_exec(itest_db(), "INSERT INTO ledger_entries (message_id, kind, account_id, invoice_id,"
	                                 " amount_cents, entry_at) VALUES ('pay-5', 'payment', 1, 'elsewhere', 1, NOW(6))"),
	             ST_OK);
	cr_assert_eq(db_commit(itest_db()), ST_OK);
	ib = open_inbox(&d);
	tb_add(&issue, "iss-1", "InvoiceIssued", "i-1", "\"account_id\":1,\"amount_cents\":1000");
	tb_add(&issue, "iss-2", "InvoiceIssued", "i-2", "\"account_id\":3,\"amount_cents\":200");
	tb_add(&issue, "iss-3", "InvoiceIssued", "i-3", "\"account_id\":2,\"amount_cents\":700");
	tb_add(&issue, "iss-4", "InvoiceIssued", "i-4", "\"account_id\":5,\"amount_cents\":1000");
	tb_add(&issue, "iss-5", "InvoiceIssued", "i-5", "\"account_id\":1,\"amount_cents\":300");
	cr_assert_eq(tb_run(ib, &issue), ST_OK, "%s", db_errmsg(d));

	tb_add(&pay, "pay-1", "PaymentReceived", "i-1", "\"account_id\":1,\"amount_cents\":1000");
	tb_add(&pay, "pay-2", "PaymentReceived", "i-2", "\"account_id\":3,\"amount_cents\":200");   /* no account 3 */
	tb_add(&pay, "pay-3", "PaymentReceived", "i-3", "\"account_id\":2,\"amount_cents\":700");
	tb_add(&pay, "pay-4", "PaymentReceived", "i-4", "\"account_id\":5,\"amount_cents\":1000");  /* overflows */
	tb_add(&pay, "pay-5", "PaymentReceived", "i-5", "\"account_id\":1,\"amount_cents\":300");   /* key taken */
	tb_add(&pay, "pay-6", "PaymentReceived", "i-6", "\"account_id\":2,\"amount_cents\":40");    /* held ... */
	tb_add(&pay, "iss-6", "InvoiceIssued", "i-6", "\"account_id\":2,\"amount_cents\":40");      /* ... released */
	rc = tb_run(ib, &pay);
	cr_assert_eq(rc, ST_OK, "the batch commits: %s", db_errmsg(d));

	cr_expect_eq(pay.res[0].outcome, INBOX_APPLIED);
	cr_expect_eq(pay.res[2].outcome, INBOX_APPLIED);
	expect_effect_failed(&pay, 1, "foreign key constraint fails");
	expect_effect_failed(&pay, 3, "out of range");
	expect_effect_failed(&pay, 4, "Duplicate entry");
	cr_expect_eq(pay.res[6].outcome, INBOX_APPLIED, "the issue releases the held payment");
	cr_expect_eq(ledger_rows("pay-1"), 1);
	cr_expect_eq(ledger_rows("pay-3"), 1);
	cr_expect_eq(ledger_rows("pay-6"), 1, "the held payment ran its statements when it was released");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM ledger_entries WHERE message_id = 'pay-4'"), 0,
	             "the first statement of pay-4 is undone with the second");
	cr_expect_eq(itest_int("SELECT balance_cents FROM accounts WHERE id = 1"), 1000);
	cr_expect_eq(itest_int("SELECT balance_cents FROM accounts WHERE id = 2"), 740);
	cr_expect_eq(itest_int("SELECT balance_cents = " NEAR_MAX " FROM accounts WHERE id = 5"), 1);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM invoices WHERE status = 'Paid'"), 3, "i-1, i-3, i-6");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM invoices WHERE status = 'Issued' AND version = 1"), 3,
	             "i-2, i-4, i-5: a refused effect leaves the invoice as it was");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM invoice_events WHERE message_id IN ('pay-2', 'pay-4', 'pay-5')"), 0);

	/* Delivered again: duplicates, and no statement runs twice. */
	rc = tb_run(ib, &pay);
	cr_assert_eq(rc, ST_OK, "%s", db_errmsg(d));
	for (int i = 0; i < pay.n; i++)
		cr_expect_eq(pay.res[i].outcome, INBOX_DUPLICATE, "%s again", pay.m[i].message_id);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM ledger_entries"), 4, "pay-1, pay-3, pay-6 and the row of elsewhere");
	cr_expect_eq(itest_int("SELECT balance_cents FROM accounts WHERE id = 2"), 740);
	inbox_close(&ib);
	db_close(&d);
	agg_use(NULL);
}

/* Deferred to the batch's end, each statement runs once over every
 * payment of the batch: one payment or twelve cost the same round trips
 * (the claim, the write with its COMMIT, one per statement). */
Test(effects, a_batch_runs_each_statement_once_however_many_payments, .timeout = 300)
{
	struct tb issue = { .n = 0 }, one = { .n = 0 }, many = { .n = 0 };
	struct inbox *ib;
	struct db *d = NULL;
	uint64_t before, r1, r12;
	char id[32], inv[32];

	invoice_setup();
	agg_use(&invoice_bind);
	ib = open_inbox(&d);
	for (int i = 0; i < 13; i++) {
		snprintf(id, sizeof id, "iss-%d", i);
		snprintf(inv, sizeof inv, "i-%d", i);
		tb_add(&issue, id, "InvoiceIssued", inv, "\"account_id\":1,\"amount_cents\":10");
		snprintf(id, sizeof id, "pay-%d", i);
		tb_add(i == 0 ? &one : &many, id, "PaymentReceived", inv, "\"account_id\":1,\"amount_cents\":10");
	}
	cr_assert_eq(tb_run(ib, &issue), ST_OK, "%s", db_errmsg(d));
	before = db_round_trips(d);
	cr_assert_eq(tb_run(ib, &one), ST_OK, "%s", db_errmsg(d));
	r1 = db_round_trips(d) - before;
	before = db_round_trips(d);
	cr_assert_eq(tb_run(ib, &many), ST_OK, "%s", db_errmsg(d));
	r12 = db_round_trips(d) - before;
	cr_expect_eq(r12, r1, "one payment: %llu round trips, twelve: %llu", (unsigned long long)r1,
	             (unsigned long long)r12);
	cr_expect_eq(r1, 4, "the claim, two statements, the write: %llu", (unsigned long long)r1);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM ledger_entries"), 13);
	cr_expect_eq(itest_int("SELECT balance_cents FROM accounts WHERE id = 1"), 130);
	inbox_close(&ib);
	db_close(&d);
	agg_use(NULL);
}

Test(effects, a_statement_the_server_fails_rolls_the_batch_back_and_dead_letters_nothing, .timeout = 300)
{
	struct tb issue = { .n = 0 }, pay = { .n = 0 };
	struct inbox *ib;
	struct db *d = NULL, *holder = NULL;
	uint64_t n = 0;
	int rc;

	invoice_setup();
	agg_use(&invoice_bind);
	ib = open_inbox(&d);
	tb_add(&issue, "iss-1", "InvoiceIssued", "i-1", "\"account_id\":1,\"amount_cents\":1000");
	tb_add(&issue, "iss-2", "InvoiceIssued", "i-2", "\"account_id\":2,\"amount_cents\":500");
	cr_assert_eq(tb_run(ib, &issue), ST_OK, "%s", db_errmsg(d));
	tb_add(&pay, "pay-2", "PaymentReceived", "i-2", "\"account_id\":2,\"amount_cents\":500");
	tb_add(&pay, "pay-1", "PaymentReceived", "i-1", "\"account_id\":1,\"amount_cents\":1000");

	/* Another transaction holds account 1 past the worker's lock wait. */
	cr_assert_eq(db_open(&holder, &itest_cfg()->db), ST_OK);
	cr_assert_eq(db_exec(holder, "UPDATE accounts SET balance_cents = balance_cents WHERE id = 1"), ST_OK);
	rc = tb_run(ib, &pay);
	cr_expect_eq(rc, ST_ERR_DB_LOCK_TIMEOUT, "the server's fault is the batch's: %d (%s)", rc, db_errmsg(d));
	db_rollback(holder);
	db_close(&holder);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM ledger_entries"), 0, "nothing of the batch stays");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE message_id LIKE 'pay-%'"), 0);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE exchange LIKE '%.dlx'"), 0, "nothing dead-lettered");

	rc = tb_run(ib, &pay);
	cr_assert_eq(rc, ST_OK, "run again, it applies: %s", db_errmsg(d));
	cr_expect_eq(pay.res[0].outcome, INBOX_APPLIED);
	cr_expect_eq(pay.res[1].outcome, INBOX_APPLIED);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM ledger_entries"), 2);
	cr_expect_eq(itest_int("SELECT SUM(balance_cents) FROM accounts WHERE id IN (1, 2)"), 1500);
	(void)n;
	inbox_close(&ib);
	db_close(&d);
	agg_use(NULL);
}

Test(effects, the_worker_runs_applied_and_compensating_statements_and_dead_letters_a_refused_one, .timeout = 300)
{
	char env[4200], path[4096], log[256], body[512], maddr[64];
	static char page[1 << 16];
	const char *menv[] = { env, maddr, NULL };
	struct itest_dead dead[4];
	struct mq *m;
	pid_t w;
	int n;
	static const char *const evs[][4] = {
		{ "c-iss-1", "InvoiceIssued", "c-1", "\"account_id\":1,\"amount_cents\":900" },
		{ "c-can-1", "InvoiceCancelled", "c-1", "" },
		{ "c-pay-1", "PaymentReceived", "c-1", "\"account_id\":1,\"amount_cents\":900" }, /* after: refund due */
		{ "c-pay-2", "PaymentReceived", "c-2", "\"account_id\":2,\"amount_cents\":60" },  /* held, then paid */
		{ "c-iss-2", "InvoiceIssued", "c-2", "\"account_id\":2,\"amount_cents\":60" },
		{ "c-iss-3", "InvoiceIssued", "c-3", "\"account_id\":3,\"amount_cents\":10" },
		{ "c-pay-3", "PaymentReceived", "c-3", "\"account_id\":3,\"amount_cents\":10" },  /* no account 3 */
		{ "c-pay-2", "PaymentReceived", "c-2", "\"account_id\":2,\"amount_cents\":60" },  /* a duplicate */
	};

	invoice_setup();
	snprintf(env, sizeof env, "INBOX_LIFECYCLE=%s", itest_source("lifecycles/invoice.json", path, sizeof path));
	m = itest_mq();
	for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++) {
		snprintf(body, sizeof body,
		         "{\"message_id\":\"%s\",\"source\":\"billing\",\"type\":\"%s\",\"invoice_id\":\"%s\",\"data\":{%s}}",
		         evs[i][0], evs[i][1], evs[i][2], evs[i][3]);
		itest_publish(m, evs[i][1], body, evs[i][0]);
	}
	snprintf(maddr, sizeof maddr, "INBOX_METRICS_ADDR=127.0.0.1:%d", itest_metrics_port(0));
	itest_log_path(log, sizeof log, "effects-worker");
	w = itest_worker_logged(1, menv, log);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages", 7, WAIT_S), 7, "see %s", log);
	n = itest_dlq_drain(dead, 4, 1, WAIT_S);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	/* c-pay-2 and c-pay-1 ran two each (applied, compensating); c-pay-3's first was refused */
	cr_expect_eq(itest_wait_metric(itest_metrics_port(0),
	                               "inbox_statements_total{event=\"PaymentReceived\",result=\"ran\"}", 4, 4, page,
	                               sizeof page, WAIT_S), 4, "%s", page);
	cr_expect_eq(itest_metric(page, "inbox_statements_total{event=\"PaymentReceived\",result=\"refused\"}"), 1);
	cr_expect_eq(itest_metric(page, "inbox_dead_letters_total{reason=\"effect-failed\"}"), 1, "%s", page);
	cr_expect(strstr(page, "inbox_statements_total{event=\"InvoiceIssued\"") == NULL, "only events with statements");
	itest_stop_ok(w);
	mq_close(&m);

	cr_assert_eq(n, 1, "one dead letter; see %s", log);
	cr_expect_str_eq(dead[0].message_id, "c-pay-3");
	cr_expect_str_eq(dead[0].reason, "effect-failed");
	cr_expect(strstr(dead[0].detail, "statement 1 of PaymentReceived") != NULL, "%s", dead[0].detail);
	cr_expect(strstr(dead[0].detail, "foreign key constraint fails") != NULL, "%s", dead[0].detail);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM ledger_entries WHERE message_id = 'c-pay-1' AND kind = 'refund_due'"
	                       " AND amount_cents = 900"), 1, "the compensation's statements ran");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM ledger_entries WHERE message_id = 'c-pay-1' AND kind = 'payment'"), 0);
	cr_expect_eq(itest_int("SELECT refunds_due_cents FROM accounts WHERE id = 1"), 900);
	cr_expect_eq(itest_int("SELECT balance_cents FROM accounts WHERE id = 1"), 0);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM ledger_entries WHERE message_id = 'c-pay-2' AND kind = 'payment'"), 1);
	cr_expect_eq(itest_int("SELECT balance_cents FROM accounts WHERE id = 2"), 60, "once, the duplicate ran nothing");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE message_id = 'c-pay-3'"
	                       " AND reason = 'effect-failed'"), 1);
	cr_expect(itest_log_has(log, "effect-failed"), "the handled line says why; see %s", log);
}

Test(effects, run_refuses_a_statement_the_server_cannot_prepare_with_its_file_and_line, .timeout = 300)
{
	char src[4096], bad[4200], env[4300], log[256], text[16384];
	const char *menv[] = { env, NULL };
	const char *rargs[] = { "run", NULL };
	char *at;
	size_t len;
	FILE *f;
	int st, line = 1;

	invoice_setup();
	len = itest_read_file(itest_source("lifecycles/invoice.json", src, sizeof src), text, sizeof text);
	cr_assert_gt(len, 0);
	at = strstr(text, "SET balance_cents = balance_cents");
	cr_assert_not_null(at);
	memcpy(at, "SET balanse_cents = balanse_cents", 33);
	for (const char *p = text; p < at; p++)
		line += *p == '\n';
	snprintf(bad, sizeof bad, "%s/inbox-effects-bad-%d.json", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
	         (int)getpid());
	f = fopen(bad, "w");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(text, 1, len, f), len);
	cr_assert_eq(fclose(f), 0);
	snprintf(env, sizeof env, "INBOX_LIFECYCLE=%s", bad);
	itest_log_path(log, sizeof log, "effects-refused");
	st = itest_wait_exit(itest_spawn_logged(rargs, menv, log), 60);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "run exits 2 (status %d); see %s", st, log);
	{
		char want[4400];

		snprintf(want, sizeof want, "%s:%d: statement 2 of PaymentReceived: Unknown column 'balanse_cents'", bad, line);
		cr_expect(itest_log_has(log, want), "the line says '%s'; see %s", want, log);
	}
	cr_expect_eq(itest_log_count(log, "inbox-worker:"), 1, "one line; see %s", log);
	unlink(bad);
}

/* effect-failed is the inbox's own verdict: dlq show says what a replay
 * would do, and once the data the statement needed exists, replay
 * reopens the key and the payment applies, its statements once. */
Test(effects, a_refused_payment_replayed_once_its_account_exists_applies, .timeout = 300)
{
	char env[4200], path[4096], log[256], slog[256], rlog[256], body[512];
	const char *menv[] = { env, NULL };
	const char *show[] = { "dlq", "show", "r-pay-3", NULL };
	const char *replay[] = { "dlq", "replay", "--reason", "effect-failed", NULL };
	const char *bin = getenv("INBOX_WORKER_BIN");
	struct mq *m;
	pid_t w;
	int st;

	invoice_setup();
	snprintf(env, sizeof env, "INBOX_LIFECYCLE=%s", itest_source("lifecycles/invoice.json", path, sizeof path));
	m = itest_mq();
	snprintf(body, sizeof body, "{\"message_id\":\"r-iss-3\",\"source\":\"billing\",\"type\":\"InvoiceIssued\","
	                            "\"invoice_id\":\"r-3\",\"data\":{\"account_id\":3,\"amount_cents\":25}}");
	itest_publish(m, "InvoiceIssued", body, "r-iss-3");
	snprintf(body, sizeof body, "{\"message_id\":\"r-pay-3\",\"source\":\"billing\",\"type\":\"PaymentReceived\","
	                            "\"invoice_id\":\"r-3\",\"data\":{\"account_id\":3,\"amount_cents\":25}}");
	itest_publish(m, "PaymentReceived", body, "r-pay-3");
	itest_log_path(log, sizeof log, "effects-replay-worker");
	w = itest_worker_logged(1, menv, log);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages WHERE reason = 'effect-failed'", 1, WAIT_S), 1,
	             "see %s", log);
	cr_assert_eq(itest_wait_depth(itest_cfg()->dlq, 1, WAIT_S), 1, "the dead letter is in the DLQ; see %s", log);

	itest_log_path(slog, sizeof slog, "effects-dlq-show");
	st = itest_wait_exit(itest_spawn_program(bin, show, menv, slog, true), 60);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "dlq show (status %d); see %s", st, slog);
	cr_expect(itest_log_has(slog, "effect-failed"), "see %s", slog);
	cr_expect(itest_log_has(slog, "its statements run again"), "show says what a replay does; see %s", slog);

	cr_assert_eq(db_exec(itest_db(), "INSERT INTO accounts (id) VALUES (3)"), ST_OK);
	cr_assert_eq(db_commit(itest_db()), ST_OK);
	itest_log_path(rlog, sizeof rlog, "effects-dlq-replay");
	st = itest_wait_exit(itest_spawn_program(bin, replay, menv, rlog, true), 60);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "dlq replay (status %d); see %s", st, rlog);
	cr_expect_eq(itest_wait_int("SELECT COUNT(*) FROM ledger_entries WHERE message_id = 'r-pay-3'", 1, WAIT_S), 1,
	             "the replayed payment ran its statements; see %s and %s", rlog, log);
	cr_expect_eq(itest_wait_int("SELECT COUNT(*) FROM invoices WHERE id = 'r-3' AND status = 'Paid'", 1, WAIT_S), 1);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
	cr_expect_eq(itest_int("SELECT balance_cents FROM accounts WHERE id = 3"), 25);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE message_id = 'r-pay-3'"
	                       " AND outcome = 'applied'"), 1);
}

/* A privilege the worker's account lacks is found by the database's
 * prepare, by `lifecycle check` as by `run`: mysql.* is no table of the
 * worker's account. */
Test(effects, lifecycle_check_prepares_each_statement_and_names_a_missing_privilege, .timeout = 120)
{
	char src[4096], bad[4200], log[256], text[16384];
	const char *args[] = { "lifecycle", "check", bad, NULL };
	const char *bin = getenv("INBOX_WORKER_BIN");
	char *at;
	size_t len;
	FILE *f;
	int st;

	invoice_setup();
	len = itest_read_file(itest_source("lifecycles/invoice.json", src, sizeof src), text, sizeof text);
	at = strstr(text, "UPDATE accounts SET refunds_due_cents");
	cr_assert_not_null(at);
	memcpy(at, "UPDATE mysql.db SET ", 20); /* "UPDATE accounts SET " */
	snprintf(bad, sizeof bad, "%s/inbox-effects-priv-%d.json", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
	         (int)getpid());
	f = fopen(bad, "w");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(text, 1, len, f), len);
	cr_assert_eq(fclose(f), 0);
	itest_log_path(log, sizeof log, "effects-check-priv");
	st = itest_wait_exit(itest_spawn_program(bin, args, NULL, log, true), 60);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "lifecycle check refuses it (status %d); see %s", st, log);
	cr_expect(itest_log_has(log, "statement 2 of PaymentReceived: UPDATE command denied"), "see %s", log);
	unlink(bad);
}
