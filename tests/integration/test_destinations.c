/*
 * test_destinations.c - emitted events delivered to an HTTP destination
 * through the outbox (issue 45, item 2), against the real broker and
 * database and the suite's own receiver (loadgen/http_receiver.c):
 * lifecycles/invoice.json with ReceiptRequested routed to a "mail"
 * destination whose URL comes from the environment.
 *
 *   - a receiver that refuses a third of its calls (503) and answers 429
 *     with Retry-After to a fifth: every receipt is received with a 2xx,
 *     each call carrying the event's stable id as its Idempotency-Key and
 *     the trace context the payment brought; none is dead-lettered, and
 *     /metrics counts them per destination;
 *   - a receiver that refuses everything, with one attempt allowed: the
 *     receipt is dead-lettered as delivery-failed, the status in its
 *     detail and the destination in x-inbox-destination, while the
 *     invoice itself is paid;
 *   - a receiver away for 20 s: every receipt accepted once when it is
 *     back, none dead-lettered;
 *   - `dlq replay` gives a delivery-failed letter back to its destination
 *     under the same Idempotency-Key;
 *   - `run` with the destination's variable unset exits 2 and names it.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "db.h"
#include "itest.h"
#include "receiver.h"
#include "mq.h"
#include "status.h"

#define WAIT_S 120
#define TP "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

/* invoice.json with the mail destination, written to path; the worker
 * tables and the example's own ones fresh, accounts 1 and 2. */
static void mail_setup(char *path, size_t cap)
{
	char src[4096], env[4200], sql[16384];
	const char *menv[] = { env, NULL };
	const char *margs[] = { "migrate", NULL };
	json_error_t jerr;
	json_t *def;
	struct db *d;
	size_t len;
	int st;

	itest_fresh();
	d = itest_db();
	cr_assert_eq(db_exec(d, "DROP TABLE IF EXISTS ledger_entries, accounts, invoices, invoice_events, invoice_locks"),
	             ST_OK, "%s", db_errmsg(d));
	len = itest_read_file(itest_source("lifecycles/invoice.sql", src, sizeof src), sql, sizeof sql);
	cr_assert_gt(len, 0);
	cr_assert_eq(db_exec_script(d, sql, len), ST_OK, "invoice.sql: %s", db_errmsg(d));
	cr_assert_eq(db_commit(d), ST_OK);
	def = json_load_file(itest_source("lifecycles/invoice.json", src, sizeof src), 0, &jerr);
	cr_assert_not_null(def, "%s", jerr.text);
	cr_assert_eq(json_object_set_new(def, "destinations",
	                                 json_pack("{s:{s:{s:s},s:s,s:{s:s},s:i}}", "mail", "url", "env", "TEST_MAIL_URL",
	                                           "method", "POST", "headers", "X-Tenant", "acme", "timeout_ms", 5000)),
	             0);
	cr_assert_eq(json_object_set_new(def, "deliver", json_pack("{s:[s]}", "ReceiptRequested", "mail")), 0);
	snprintf(path, cap, "/tmp/test_destinations_invoice.json");
	cr_assert_eq(json_dump_file(def, path, JSON_INDENT(2)), 0);
	json_decref(def);
	snprintf(env, sizeof env, "INBOX_LIFECYCLE=%s", path);
	st = itest_wait_exit(itest_spawn(margs, menv), 120);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "migrate with the mail lifecycle (status %d)", st);
}

/* n invoices issued and paid, the payments with a trace context. */
static void publish_invoices(int n)
{
	struct mq *m = itest_mq();
	char body[512], id[64];

	for (int i = 1; i <= n; i++) {
		snprintf(id, sizeof id, "iss-%d", i);
		snprintf(body, sizeof body,
		         "{\"message_id\":\"%s\",\"source\":\"billing\",\"type\":\"InvoiceIssued\",\"invoice_id\":\"d-%d\","
		         "\"data\":{\"account_id\":%d,\"amount_cents\":100}}", id, i, 1 + i % 2);
		itest_publish(m, "InvoiceIssued", body, id);
		snprintf(id, sizeof id, "pay-%d", i);
		snprintf(body, sizeof body,
		         "{\"message_id\":\"%s\",\"source\":\"billing\",\"type\":\"PaymentReceived\",\"invoice_id\":\"d-%d\","
		         "\"data\":{\"account_id\":%d,\"amount_cents\":100}}", id, i, 1 + i % 2);
		{
			struct mq_header h[1] = { { "traceparent", TP } };
			struct mq_message msg = {
				.exchange = itest_cfg()->exchange, .routing_key = "order.PaymentReceived", .body = body,
				.len = strlen(body), .message_id = id, .headers = h, .nheaders = 1,
			};

			cr_assert_eq(mq_publish(m, &msg), ST_OK, "publish: %s", mq_errmsg(m));
			cr_assert_eq(mq_wait_confirms(m, 10000), ST_OK, "confirm: %s", mq_errmsg(m));
		}
	}
}

/* The receiver's lines: every call keyed by a receipt's stable id, with
 * the payment's trace, on the destination's path; n receipts each
 * accepted (200) once, and no call made again after its 200 (nothing here
 * kills a courier between the answer and its record).  Returns the calls
 * made. */
static int expect_each_accepted_once(const struct rcv_child *rv, int n)
{
	json_t *lines[512];
	int got = rcv_lines(rv, lines, 512), calls, keys, replays, conflicts;

	for (int i = 0; i < got; i++) {
		const char *key = json_string_value(json_object_get(lines[i], "idempotency_key"));
		const char *tp = json_string_value(json_object_get(lines[i], "traceparent"));

		cr_assert_not_null(key);
		cr_expect_eq(strncmp(key, "\"ReceiptRequested:d-", 20), 0, "%s", key);
		cr_expect(tp != NULL && strncmp(tp, "00-4bf92f3577b34da6a3ce929d0e0e4736-", 36) == 0, "%s", key);
		cr_expect_str_eq(json_string_value(json_object_get(lines[i], "path")), "/receipts");
		json_decref(lines[i]);
	}
	calls = rcv_accepted(rv, &keys, &replays, &conflicts);
	cr_expect_eq(keys, n, "every receipt accepted");
	cr_expect_eq(replays, 0, "no receipt sent again after its 200");
	cr_expect_eq(conflicts, 0, "no key sent with two bodies");
	return calls;
}

Test(destinations, every_receipt_reaches_a_flaky_receiver_once_accepted_by_its_idempotency_key, .timeout = 600)
{
	char path[256], lenv[300], uenv[128], maddr[64], log[256];
	static char page[1 << 16];
	const char *menv[] = { lenv, uenv, maddr, NULL };
	const char *flaky[] = { "--fail-ratio", "0.33", "--429-ratio", "0.2", "--retry-after", "1", "--seed", "7", NULL };
	struct rcv_child rv;
	pid_t w;
	int calls;
	const int n = 12;

	mail_setup(path, sizeof path);
	rcv_start(&rv, flaky);
	snprintf(lenv, sizeof lenv, "INBOX_LIFECYCLE=%s", path);
	snprintf(uenv, sizeof uenv, "TEST_MAIL_URL=http://127.0.0.1:%d/receipts", rv.port);
	snprintf(maddr, sizeof maddr, "INBOX_METRICS_ADDR=127.0.0.1:%d", itest_metrics_port(0));
	publish_invoices(n);
	itest_log_path(log, sizeof log, "destinations-worker");
	w = itest_worker_logged(2, menv, log);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE destination = 'mail' AND sent_at IS NOT NULL", n,
	                            WAIT_S), n, "see %s", log);
	cr_expect_eq(itest_wait_metric(itest_metrics_port(0),
	                               "inbox_http_deliveries_total{destination=\"mail\",result=\"delivered\"}", n, n,
	                               page, sizeof page, WAIT_S),
	             n);
	cr_expect_eq(itest_metric(page, "inbox_http_deliveries_total{destination=\"mail\",result=\"dead_lettered\"}"), 0);
	cr_expect_gt(itest_metric(page, "inbox_http_deliveries_total{destination=\"mail\",result=\"retried\"}"), 0,
	             "a third refused: some were called again");
	itest_stop_ok(w);
	rcv_stop(&rv);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE exchange LIKE '%.dlx'"), 0, "nothing dead-lettered");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM invoices WHERE status = 'Paid'"), n);

	calls = expect_each_accepted_once(&rv, n);
	cr_expect_gt(calls, n, "refused calls were made again");
	unlink(rv.log);
}

Test(destinations, a_receipt_refused_to_the_end_is_dead_lettered_as_delivery_failed, .timeout = 600)
{
	char path[256], lenv[300], uenv[128], log[256], maddr[64];
	static char page[1 << 16];
	const char *menv[] = { lenv, uenv, "INBOX_HTTP_MAX_ATTEMPTS=2", maddr, NULL };
	const char *down[] = { "--fail-ratio", "1", NULL };
	struct itest_dead dead[4];
	struct rcv_child rv;
	pid_t w;
	int got;

	mail_setup(path, sizeof path);
	rcv_start(&rv, down);
	snprintf(lenv, sizeof lenv, "INBOX_LIFECYCLE=%s", path);
	snprintf(uenv, sizeof uenv, "TEST_MAIL_URL=http://127.0.0.1:%d/receipts", rv.port);
	publish_invoices(1);
	itest_log_path(log, sizeof log, "destinations-refused");
	snprintf(maddr, sizeof maddr, "INBOX_METRICS_ADDR=127.0.0.1:%d", itest_metrics_port(0));
	w = itest_worker_logged(1, menv, log);
	got = itest_dlq_drain(dead, 4, 1, WAIT_S);
	/* counted per destination; not among the messages' dead letters,
	 * whose sum is the consumed messages dead-lettered (operations.md):
	 * an emitted event is not a delivery's decision */
	cr_expect_eq(itest_wait_metric(itest_metrics_port(0),
	                               "inbox_http_deliveries_total{destination=\"mail\",result=\"dead_lettered\"}", 1, 1,
	                               page, sizeof page, WAIT_S),
	             1, "see %s", log);
	cr_expect_eq(itest_metric(page, "inbox_dead_letters_total{reason=\"delivery-failed\"}"), 0);
	itest_stop_ok(w);
	rcv_stop(&rv);
	cr_assert_eq(got, 1, "see %s", log);
	cr_expect_str_eq(dead[0].reason, "delivery-failed");
	cr_expect_str_eq(dead[0].message_id, "ReceiptRequested:d-1");
	cr_expect(strstr(dead[0].detail, "destination mail: HTTP 503 after 2 attempts") != NULL, "%s", dead[0].detail);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM invoices WHERE status = 'Paid'"), 1, "the payment itself applied");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE destination = 'mail' AND sent_at IS NULL"), 0);
	unlink(rv.log);
}

Test(destinations, run_names_the_variable_a_destination_lacks, .timeout = 300)
{
	char path[256], lenv[300], log[256];
	const char *menv[] = { lenv, NULL };
	pid_t w;
	int st;

	mail_setup(path, sizeof path);
	unsetenv("TEST_MAIL_URL");
	snprintf(lenv, sizeof lenv, "INBOX_LIFECYCLE=%s", path);
	itest_log_path(log, sizeof log, "destinations-unset");
	w = itest_worker_logged(1, menv, log);
	st = itest_wait_exit(w, 60);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %d", st);
	cr_expect(itest_log_has(log, "destination mail: url: neither TEST_MAIL_URL nor TEST_MAIL_URL_FILE is set"),
	          "see %s", log);
}

Test(destinations, dlq_replay_gives_a_delivery_failed_event_back_to_its_destination_under_the_same_key, .timeout = 600)
{
	char path[256], lenv[300], uenv[128], log[256], line[8192];
	const char *menv[] = { lenv, uenv, "INBOX_HTTP_MAX_ATTEMPTS=1", NULL };
	const char *down[] = { "--fail-ratio", "1", NULL };
	const char *replay[] = { "dlq", "replay", NULL };
	struct rcv_child rv;
	FILE *f;
	pid_t w;
	int st, accepted = 0;

	mail_setup(path, sizeof path);
	rcv_start(&rv, down);
	snprintf(lenv, sizeof lenv, "INBOX_LIFECYCLE=%s", path);
	snprintf(uenv, sizeof uenv, "TEST_MAIL_URL=http://127.0.0.1:%d/receipts", rv.port);
	publish_invoices(1);
	itest_log_path(log, sizeof log, "destinations-replay");
	w = itest_worker_logged(1, menv, log);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE exchange LIKE '%.dlx' AND sent_at IS NOT NULL", 1,
	                            WAIT_S), 1, "see %s", log);
	itest_stop_ok(w);
	rcv_stop(&rv);
	unlink(rv.log);

	rcv_start(&rv, NULL); /* back, and taking every call */
	snprintf(uenv, sizeof uenv, "TEST_MAIL_URL=http://127.0.0.1:%d/receipts", rv.port);
	st = itest_wait_exit(itest_spawn(replay, menv), 120);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "dlq replay (status %d)", st);
	w = itest_worker_logged(1, menv, log);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE destination = 'mail' AND sent_at IS NOT NULL"
	                            " AND last_error IS NULL", 1, WAIT_S), 1, "see %s", log);
	itest_stop_ok(w);
	rcv_stop(&rv);
	f = fopen(rv.log, "r");
	cr_assert_not_null(f);
	while (fgets(line, sizeof line, f) != NULL) {
		json_t *o = json_loads(line, 0, NULL);

		cr_assert_not_null(o);
		cr_expect_str_eq(json_string_value(json_object_get(o, "idempotency_key")), "\"ReceiptRequested:d-1\"");
		accepted += json_integer_value(json_object_get(o, "status")) == 200;
		json_decref(o);
	}
	fclose(f);
	cr_expect_eq(accepted, 1);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE exchange LIKE '%.dlx'"), 1, "dead-lettered once only");
	unlink(rv.log);
}

Test(destinations, a_receiver_away_for_twenty_seconds_gets_every_receipt_once_none_dead_lettered, .timeout = 600)
{
	char path[256], lenv[300], uenv[128], log[256], away[8];
	const char *menv[] = { lenv, uenv, NULL };
	const char *args[] = { "--away-seconds", "20", NULL };
	struct rcv_child rv;
	pid_t w;
	const int n = 20;

	mail_setup(path, sizeof path);
	rcv_start(&rv, args);
	snprintf(lenv, sizeof lenv, "INBOX_LIFECYCLE=%s", path);
	snprintf(uenv, sizeof uenv, "TEST_MAIL_URL=http://127.0.0.1:%d/receipts", rv.port);
	cr_assert_eq(kill(rv.pid, SIGUSR1), 0);
	cr_assert_not_null(fgets(away, sizeof away, rv.out));
	cr_assert_eq(strncmp(away, "away", 4), 0, "%s", away);
	publish_invoices(n);
	itest_log_path(log, sizeof log, "destinations-away");
	w = itest_worker_logged(2, menv, log);
	/* the backoff doubles: the calls after 20 s away come some 30 s on */
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE destination = 'mail' AND sent_at IS NOT NULL", n,
	                            2 * WAIT_S), n, "see %s", log);
	cr_expect_gt(itest_int("SELECT MAX(attempts) FROM outbox WHERE destination = 'mail'"), 0,
	             "calls were refused while it was away");
	itest_stop_ok(w);
	rcv_stop(&rv);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE exchange LIKE '%.dlx'"), 0, "nothing dead-lettered");
	(void)expect_each_accepted_once(&rv, n);
	unlink(rv.log);
}
