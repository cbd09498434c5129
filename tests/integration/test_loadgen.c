/*
 * test_loadgen.c - inbox-loadgen against the real stack: a small scenario
 * with every kind of duplicate verifies clean with two worker processes, and
 * the verifier itself fails, naming the message, when the database lost an
 * effect or holds one twice.  A verifier that cannot fail proves nothing, so
 * the second half matters as much as the first.
 */
#include <criterion/criterion.h>
#include <errno.h>
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
#include "status.h"

static void lg_ledger_path(char *buf, size_t cap, const char *name)
{
	snprintf(buf, cap, "%s/inbox-lg-%s-%d.jsonl", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", name, (int)getpid());
}

static void lg_exec1(const char *sql, const char *arg)
{
	struct db *d = itest_db();
	struct db_stmt *s;
	struct db_param p[1];

	cr_assert_eq(db_prepare(d, &s, sql), ST_OK, "prepare %s: %s", sql, db_errmsg(d));
	if (arg != NULL)
		p[0] = DBP_STR(arg);
	cr_assert_eq(db_stmt_exec(s, p, arg != NULL ? 1 : 0, NULL), ST_OK, "%s: %s", sql, db_errmsg(d));
	cr_assert_eq(db_commit(d), ST_OK, "commit: %s", db_errmsg(d));
}

/* Publish a small scenario while two workers run, wait until every original
 * has its final inbox row and the outbox is empty, then stop the workers so
 * that the database holds still for tampering. */
static void lg_settled_run(const char *ledger, const char *run)
{
	const char *pub[] = { "publish", "--ledger", ledger, "--run", run, "--orders", "40", "--delayed-dups", "0",
	                      "--connections", "3", NULL };
	pid_t w1 = itest_worker(2, NULL), w2 = itest_worker(2, NULL);
	char log[256];
	int64_t originals;

	snprintf(log, sizeof log, "%s.publish.log", ledger);
	cr_assert_eq(itest_loadgen(pub, NULL, log, 120), 0, "publish failed, see %s", log);
	originals = itest_ledger_int(ledger, "originals");
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages WHERE outcome <> 'held'", originals, 120),
	             originals, "the workers did not settle every original");
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL", 0, 60), 0);
	itest_stop(w1, SIGTERM, 30);
	itest_stop(w2, SIGTERM, 30);
}

static bool lg_file_has(const char *path, const char *a, const char *b)
{
	FILE *f = fopen(path, "r");
	char line[1024];
	bool found = false;

	cr_assert_not_null(f, "cannot open %s", path);
	while (!found && fgets(line, sizeof line, f) != NULL)
		found = strstr(line, a) != NULL && (b == NULL || strstr(line, b) != NULL);
	fclose(f);
	return found;
}

Test(loadgen, small_scenario_with_every_duplicate_kind_verifies_clean, .timeout = 600)
{
	char ledger[256], plog[300], vlog[300];
	const char *pub[] = { "publish", "--ledger", ledger, "--orders", "150", "--conflicts", "5", "--malformed", "14",
	                      "--connections", "4", "--reorder-window", "3", "--settle-timeout", "120", NULL };
	const char *ver[] = { "verify", "--ledger", ledger, "--timeout", "120", NULL };
	pid_t w1, w2;
	int rc;

	itest_fresh();
	lg_ledger_path(ledger, sizeof ledger, "clean");
	snprintf(plog, sizeof plog, "%s.publish.log", ledger);
	snprintf(vlog, sizeof vlog, "%s.verify.log", ledger);
	w1 = itest_worker(4, NULL);
	w2 = itest_worker(4, NULL);
	cr_assert_eq(itest_loadgen(pub, NULL, plog, 300), 0, "publish failed, see %s", plog);
	rc = itest_loadgen(ver, NULL, vlog, 300);
	itest_stop(w1, SIGTERM, 30);
	itest_stop(w2, SIGTERM, 30);
	cr_assert_eq(rc, 0, "verify failed, see %s", vlog);
	cr_assert(lg_file_has(vlog, "missing 0, doubled 0", NULL), "report lacks the zero counts, see %s", vlog);
	cr_assert(lg_file_has(vlog, "latency", "p99"), "report lacks latency, see %s", vlog);
}

Test(loadgen, verifier_names_a_removed_effect, .timeout = 600)
{
	char ledger[256], vlog[300], victim[129];
	const char *ver[] = { "verify", "--ledger", ledger, "--timeout", "30", NULL };

	itest_fresh();
	lg_ledger_path(ledger, sizeof ledger, "removed");
	snprintf(vlog, sizeof vlog, "%s.verify.log", ledger);
	lg_settled_run(ledger, "removed");
	cr_assert(itest_str1("SELECT message_id FROM order_events WHERE type = ? ORDER BY id LIMIT 1",
	                     "InventoryReserved", victim, sizeof victim));
	lg_exec1("DELETE FROM order_events WHERE message_id = ?", victim);
	cr_assert_neq(itest_loadgen(ver, NULL, vlog, 120), 0, "verify passed a database with an effect removed, see %s", vlog);
	cr_assert(lg_file_has(vlog, victim, "no order_events row"), "report does not name %s, see %s", victim, vlog);
}

Test(loadgen, verifier_names_a_doubled_effect, .timeout = 600)
{
	char ledger[256], vlog[300], victim[129];
	const char *ver[] = { "verify", "--ledger", ledger, "--timeout", "30", NULL };

	itest_fresh();
	lg_ledger_path(ledger, sizeof ledger, "doubled");
	snprintf(vlog, sizeof vlog, "%s.verify.log", ledger);
	lg_settled_run(ledger, "doubled");
	cr_assert(itest_str1("SELECT message_id FROM order_events WHERE type = ? ORDER BY id LIMIT 1",
	                     "OrderCreated", victim, sizeof victim));
	/* The schema's second guard would refuse the double; a verifier must
	 * catch it even when that guard is gone. */
	lg_exec1("ALTER TABLE order_events DROP INDEX uq_order_events_message", NULL);
	lg_exec1("INSERT INTO order_events (order_id, consumer, source, message_id, type, outcome, from_status,"
	         " to_status, version, applied_at) SELECT order_id, consumer, source, message_id, type, outcome,"
	         " from_status, to_status, version + 1000, applied_at FROM order_events WHERE message_id = ?",
	         victim);
	cr_assert_neq(itest_loadgen(ver, NULL, vlog, 120), 0, "verify passed a database with a doubled effect, see %s", vlog);
	cr_assert(lg_file_has(vlog, victim, "order_events rows"), "report does not name %s, see %s", victim, vlog);
}

/* The chaos run unbinds the DLQ with `inbox-loadgen dlq unbind`: a
 * mandatory publish to the dead-letter exchange then comes back unroutable,
 * and `dlq bind` makes it land again. */
Test(loadgen, dlq_unbind_and_bind, .timeout = 120)
{
	const struct cfg *c;
	const char *unbind[] = { "dlq", "unbind", NULL }, *bind[] = { "dlq", "bind", NULL };
	char log[256], body[512];
	struct mq_message msg = { .routing_key = "order.OrderCreated", .message_id = "dlq-bind-1", .mandatory = true };
	struct mq *m;

	itest_fresh();
	c = itest_cfg();
	msg.exchange = c->dlx;
	itest_event(body, sizeof body, "dlq-bind-1", "OrderCreated", "dlq-bind-o1");
	msg.body = body;
	msg.len = strlen(body);
	lg_ledger_path(log, sizeof log, "dlq-bind");
	/* itest_mq declares the topology, which binds the DLQ: open it first. */
	m = itest_mq();
	cr_assert_eq(itest_loadgen(unbind, NULL, log, 60), 0, "dlq unbind failed, see %s", log);
	cr_assert_eq(mq_publish_confirmed(m, &msg, 10000), ST_ERR_MQ_NACK,
	             "a dead-letter must be unroutable while the DLQ is unbound");
	cr_assert_eq(itest_queue_depth(c->dlq), 0);
	cr_assert_eq(itest_loadgen(bind, NULL, log, 60), 0, "dlq bind failed, see %s", log);
	cr_assert_eq(mq_publish_confirmed(m, &msg, 10000), ST_OK, "bound again, the dead-letter must land");
	mq_close(&m);
	cr_assert_eq(itest_queue_depth(c->dlq), 1);
}

/* The binary-header class: a body that is not JSON with a `trace` header
 * whose value is bytes that are not UTF-8; the ledger expects it in the DLQ
 * as malformed-json.  No worker runs: the message is read off the queue. */
Test(loadgen, binary_header_class_is_published_and_expected_as_malformed_json, .timeout = 120)
{
	char ledger[256], plog[300], trace[16];
	const char *pub[] = { "publish", "--ledger", ledger, "--run", "binhdr", "--orders", "1", "--dup-rate", "0",
	                      "--malformed", "8", "--connections", "1", NULL };
	struct mq *m;
	struct mq_delivery d;
	bool seen = false;

	itest_fresh();
	lg_ledger_path(ledger, sizeof ledger, "binhdr");
	snprintf(plog, sizeof plog, "%s.publish.log", ledger);
	cr_assert_eq(itest_loadgen(pub, NULL, plog, 60), 0, "publish failed, see %s", plog);
	cr_assert(lg_file_has(ledger, "\"class\":\"binary-header\"", "\"reason\":\"malformed-json\""),
	          "the ledger lacks the binary-header class, see %s", ledger);
	m = itest_mq();
	memset(&d, 0, sizeof d);
	while (mq_get(m, itest_cfg()->queue, &d) == ST_OK) {
		/* ids are lg<seed>-<run>-bad-<n>; class 8 is the eighth malformed */
		if (d.props.message_id != NULL && d.props.message_id_len == strlen("lg1-binhdr-bad-7") &&
		    memcmp(d.props.message_id, "lg1-binhdr-bad-7", d.props.message_id_len) == 0) {
			seen = true;
			cr_assert_eq(mq_delivery_header(&d, "trace", trace, sizeof trace), ST_OK, "no trace header");
			/* The value is cut at its NUL byte here: ff fe 00 ... */
			cr_assert_str_eq(trace, "\xff\xfe", "trace header is not the binary value");
		}
		cr_assert_eq(mq_ack(m, d.tag, false), ST_OK);
		mq_delivery_release(m, &d);
	}
	mq_close(&m);
	cr_assert(seen, "the binary-header message is not in %s", itest_cfg()->queue);
}

/* The publisher survives a broker restart: what was not confirmed is
 * published again after reconnecting, and the run still verifies (a copy
 * the broker had taken is a duplicate the worker absorbs). */
Test(loadgen, publisher_republishes_after_a_broker_restart, .timeout = 600)
{
	char ledger[256], plog[300], vlog[300], root[4096], cmd[4300];
	const char *pub[] = { "publish", "--ledger", ledger, "--orders", "400", "--rate", "100", "--delayed-dups", "0",
	                      "--connections", "2", "--retry-timeout", "120", NULL };
	const char *ver[] = { "verify", "--ledger", ledger, "--timeout", "300", NULL };
	const char *bin = getenv("INBOX_LOADGEN_BIN");
	pid_t w1, w2, p;
	int st, rc;

	cr_assert_not_null(bin, "INBOX_LOADGEN_BIN is not set (run through meson test)");
	itest_fresh();
	lg_ledger_path(ledger, sizeof ledger, "brokerrestart");
	snprintf(plog, sizeof plog, "%s.publish.log", ledger);
	snprintf(vlog, sizeof vlog, "%s.verify.log", ledger);
	w1 = itest_worker(2, NULL);
	w2 = itest_worker(2, NULL);
	p = itest_spawn_program(bin, pub, NULL, plog, true);
	/* Restart the broker once the publisher is well under way. */
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) >= 200 FROM processed_messages", 1, 120), 1,
	             "the run did not start, see %s", plog);
	snprintf(cmd, sizeof cmd, "%s restart-mq >&2", itest_source("scripts/stack", root, sizeof root));
	cr_assert_eq(system(cmd), 0, "scripts/stack restart-mq failed");
	st = itest_wait_exit(p, 300);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "publish did not survive the restart (status %d), see %s", st,
	          plog);
	cr_assert_eq(itest_log_has(plog, "re-published") && !itest_log_has(plog, "after 0 broker faults"), true,
	             "the publisher saw no broker fault, see %s", plog);
	rc = itest_loadgen(ver, NULL, vlog, 400);
	itest_stop(w1, SIGTERM, 60);
	itest_stop(w2, SIGTERM, 60);
	cr_assert_eq(rc, 0, "verify failed, see %s", vlog);
}

/* The whole report but the lines that may differ between two readings of
 * the same settled run: none should.  Returns the file's text (malloc). */
static char *lg_slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *buf = NULL;
	size_t len = 0;

	cr_assert_not_null(f, "cannot open %s", path);
	cr_assert_eq(getdelim(&buf, &len, '\0', f) >= 0, true, "cannot read %s", path);
	fclose(f);
	return buf;
}

/* A verifier reads: run twice on one ledger it gives the same report, and
 * the DLQ and the emitted-message queue keep every message it looked at,
 * those of other runs included. */
Test(loadgen, verify_twice_gives_the_same_report_and_leaves_the_queues, .timeout = 600)
{
	char ledger[256], plog[300], v1[300], v2[300], vq[300], body[512];
	const char *pub[] = { "publish", "--ledger", ledger, "--run", "twice", "--orders", "30", "--malformed", "6",
	                      "--delayed-dups", "0", "--connections", "2", NULL };
	const char *ver1[] = { "verify", "--ledger", ledger, "--timeout", "60", NULL };
	const char *ver2[] = { "verify", "--ledger", ledger, "--timeout", "60", NULL };
	struct mq_message msg = { .routing_key = "order.OrderCreated", .message_id = "otherrun-1", .mandatory = true };
	const struct cfg *c;
	uint32_t dlq_before, vq_before;
	pid_t w1;
	char *r1, *r2;
	struct mq *m;

	itest_fresh();
	c = itest_cfg();
	snprintf(vq, sizeof vq, "%s.verify", c->out_exchange);
	lg_ledger_path(ledger, sizeof ledger, "twice");
	snprintf(plog, sizeof plog, "%s.publish.log", ledger);
	snprintf(v1, sizeof v1, "%s.verify1.log", ledger);
	snprintf(v2, sizeof v2, "%s.verify2.log", ledger);
	w1 = itest_worker(2, NULL);
	cr_assert_eq(itest_loadgen(pub, NULL, plog, 120), 0, "publish failed, see %s", plog);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages WHERE outcome <> 'held'",
	                            itest_ledger_int(ledger, "originals"), 120), itest_ledger_int(ledger, "originals"));
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL", 0, 60), 0);
	itest_stop(w1, SIGTERM, 30);
	/* A dead-letter and an emitted message of another run. */
	m = itest_mq();
	itest_event(body, sizeof body, "otherrun-1", "OrderCreated", "otherrun-o1");
	msg.body = body;
	msg.len = strlen(body);
	msg.exchange = c->dlx;
	cr_assert_eq(mq_publish_confirmed(m, &msg, 10000), ST_OK);
	msg.exchange = c->out_exchange;
	cr_assert_eq(mq_publish_confirmed(m, &msg, 10000), ST_OK);
	mq_close(&m);
	dlq_before = itest_queue_depth(c->dlq);
	vq_before = itest_queue_depth(vq);
	cr_assert_gt(dlq_before, 1, "the run left no dead-letter to read");
	cr_assert_gt(vq_before, 1, "the run emitted nothing to read");

	cr_assert_eq(itest_loadgen(ver1, NULL, v1, 120), 0, "first verify failed, see %s", v1);
	cr_assert_eq(itest_queue_depth(c->dlq), dlq_before, "verify removed dead-letters, see %s", v1);
	cr_assert_eq(itest_queue_depth(vq), vq_before, "verify removed emitted messages, see %s", v1);
	cr_assert_eq(itest_loadgen(ver2, NULL, v2, 120), 0, "second verify failed, see %s", v2);
	cr_assert_eq(itest_queue_depth(c->dlq), dlq_before, "verify removed dead-letters, see %s", v2);
	cr_assert_eq(itest_queue_depth(vq), vq_before, "verify removed emitted messages, see %s", v2);
	r1 = lg_slurp(v1);
	r2 = lg_slurp(v2);
	cr_assert_str_eq(r1, r2, "two verifications of one run differ: %s and %s", v1, v2);
	free(r1);
	free(r2);
}

/* Whether pid is stopped (state T in /proc/PID/stat). */
static bool lg_stopped(pid_t pid)
{
	char path[64], buf[256], *p;
	FILE *f;
	bool stopped = false;

	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (f == NULL)
		return false;
	if (fgets(buf, sizeof buf, f) != NULL && (p = strrchr(buf, ')')) != NULL)
		stopped = p[1] == ' ' && p[2] == 'T';
	fclose(f);
	return stopped;
}

/* Issue 43, item 9: a verifier whose link went silent in the middle of a
 * browse (here: it stops itself with the emitted messages in hand, as a
 * blackholed link leaves them unacked on the broker) must not make the
 * next verify of the same ledger report them missing.  The next one waits
 * until the broker has them back (the silent one's heartbeat runs out),
 * and gives the first one's report. */
Test(loadgen, verify_after_a_verifier_lost_its_link_mid_browse_gives_the_same_report, .timeout = 600)
{
	char ledger[256], plog[300], v1[300], v2[300], v3[300];
	const char *pub[] = { "publish", "--ledger", ledger, "--run", "lost", "--orders", "30", "--malformed", "6",
	                      "--delayed-dups", "0", "--connections", "2", NULL };
	const char *ver[] = { "verify", "--ledger", ledger, "--timeout", "60", NULL };
	/* The DLQ is read twice first (by id while waiting, then browsed):
	 * skip both, stop in the emitted queue's browse. */
	const char *lost_env[] = { "INBOX_FAULT=verify-stop-before-requeue", "INBOX_FAULT_SKIP=2", "INBOX_HEARTBEAT=2",
	                           NULL };
	const char *bin = getenv("INBOX_LOADGEN_BIN");
	pid_t w1, lost;
	char *r1, *r3;
	int st;

	itest_fresh();
	cr_assert_not_null(bin, "INBOX_LOADGEN_BIN is not set");
	lg_ledger_path(ledger, sizeof ledger, "lost");
	snprintf(plog, sizeof plog, "%s.publish.log", ledger);
	snprintf(v1, sizeof v1, "%s.verify1.log", ledger);
	snprintf(v2, sizeof v2, "%s.verify2.log", ledger);
	snprintf(v3, sizeof v3, "%s.verify3.log", ledger);
	w1 = itest_worker(2, NULL);
	cr_assert_eq(itest_loadgen(pub, NULL, plog, 120), 0, "publish failed, see %s", plog);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages WHERE outcome <> 'held'",
	                            itest_ledger_int(ledger, "originals"), 120), itest_ledger_int(ledger, "originals"));
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL", 0, 60), 0);
	itest_stop(w1, SIGTERM, 30);
	cr_assert_eq(itest_loadgen(ver, NULL, v1, 120), 0, "first verify failed, see %s", v1);

	lost = itest_spawn_program(bin, ver, lost_env, v2, true);
	for (int i = 0; i < 600 && !lg_stopped(lost); i++)
		usleep(100 * 1000);
	cr_assert(lg_stopped(lost), "the verifier did not stop in its browse, see %s", v2);

	cr_assert_eq(itest_loadgen(ver, NULL, v3, 120), 0, "a verify after the lost one failed, see %s", v3);
	kill(lost, SIGKILL);
	cr_assert_eq(waitpid(lost, &st, 0), lost);
	r1 = lg_slurp(v1);
	r3 = lg_slurp(v3);
	cr_assert_str_eq(r1, r3, "two verifications of one run differ: %s and %s", v1, v3);
	free(r1);
	free(r3);
}

/* Durations as the worker takes them: `--timeout 5m` is five minutes, not
 * a usage error (the ledger is missing, so verify stops at reading it). */
Test(loadgen, durations_are_taken_like_the_worker, .timeout = 60)
{
	char log[256];
	const char *ver[] = { "verify", "--ledger", "/nonexistent/ledger.jsonl", "--timeout", "5m", NULL };
	const char *pub[] = { "publish", "--ledger", "/nonexistent/ledger.jsonl", "--settle-timeout", "2m",
	                      "--settle-stall", "30s", "--retry-timeout", "1h", NULL };
	const char *bad[] = { "verify", "--ledger", "/nonexistent/ledger.jsonl", "--timeout", "5 minutes", NULL };

	lg_ledger_path(log, sizeof log, "durations");
	cr_assert_eq(itest_loadgen(ver, NULL, log, 30), 1, "verify --timeout 5m refused, see %s", log);
	cr_assert(lg_file_has(log, "cannot read", NULL), "verify did not get to the ledger, see %s", log);
	cr_assert_eq(itest_loadgen(pub, NULL, log, 30), 1, "publish refused its durations, see %s", log);
	cr_assert(lg_file_has(log, "cannot write", NULL), "publish did not get to the ledger, see %s", log);
	cr_assert_eq(itest_loadgen(bad, NULL, log, 30), 2, "a bad duration must be a usage error, see %s", log);
	cr_assert(lg_file_has(log, "--timeout", "bad duration"), "the error does not name the option, see %s", log);
}

/* --help lists the settings inbox-loadgen reads, not the worker's pool,
 * retention or metrics settings. */
Test(loadgen, help_lists_only_the_settings_it_uses, .timeout = 60)
{
	char log[256];
	const char *help[] = { "--help", NULL };

	lg_ledger_path(log, sizeof log, "help");
	cr_assert_eq(itest_loadgen(help, NULL, log, 30), 0);
	cr_assert(lg_file_has(log, "INBOX_AMQP_URL", NULL), "see %s", log);
	cr_assert(lg_file_has(log, "INBOX_DB_URL", NULL), "see %s", log);
	cr_assert(lg_file_has(log, "INBOX_DLQ", NULL), "see %s", log);
	cr_assert(lg_file_has(log, "--timeout", NULL), "see %s", log);
	cr_assert(!lg_file_has(log, "INBOX_THREADS", NULL), "help lists the worker's thread count, see %s", log);
	cr_assert(!lg_file_has(log, "INBOX_RETENTION", NULL), "help lists retention, see %s", log);
	cr_assert(!lg_file_has(log, "INBOX_METRICS_ADDR", NULL), "help lists the metrics address, see %s", log);
}

/* The progress line (on a terminal, or with --progress) shows the elapsed
 * time, a percentage and a smoothed rate, and "ETA --" until the rate is
 * known.  No worker needed: publishing alone makes progress. */
Test(loadgen, progress_line_shows_elapsed_percentage_and_eta, .timeout = 120)
{
	char ledger[256], plog[300];
	const char *pub[] = { "publish", "--ledger", ledger, "--run", "progress", "--orders", "60", "--dup-rate", "0",
	                      "--delayed-dups", "0", "--rate", "100", "--connections", "1", "--progress", NULL };

	itest_fresh();
	lg_ledger_path(ledger, sizeof ledger, "progress");
	snprintf(plog, sizeof plog, "%s.publish.log", ledger);
	cr_assert_eq(itest_loadgen(pub, NULL, plog, 60), 0, "publish failed, see %s", plog);
	cr_assert(lg_file_has(plog, "ETA --", "elapsed 0:00"), "no first progress line with ETA --, see %s", plog);
	cr_assert(lg_file_has(plog, "%)", "msg/s"), "no percentage and rate, see %s", plog);
	cr_assert(lg_file_has(plog, "ETA 0:0", NULL), "no ETA once the rate is known, see %s", plog);
}

/* Publish with pub (its --ledger is ledger) to a worker of `threads`
 * threads, wait until every original is settled and the outbox is empty,
 * stop the worker.  plog: where publish wrote. */
static void lg_publish_settled(const char *const *pub, const char *ledger, const char *plog, int threads)
{
	pid_t w = itest_worker(threads, NULL);

	cr_assert_eq(itest_loadgen(pub, NULL, plog, 120), 0, "publish failed, see %s", plog);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages WHERE outcome <> 'held'",
	                            itest_ledger_int(ledger, "originals"), 120), itest_ledger_int(ledger, "originals"));
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL", 0, 60), 0);
	itest_stop(w, SIGTERM, 30);
}

/* Run `verify ... --json` (ver), which must pass, and read its one JSON
 * object from vlog.  The caller owns the object. */
static json_t *lg_verify_json(const char *const *ver, const char *vlog)
{
	json_error_t jerr;
	json_t *o;
	FILE *f;

	cr_assert_eq(itest_loadgen(ver, NULL, vlog, 120), 0, "verify --json failed, see %s", vlog);
	f = fopen(vlog, "r");
	cr_assert_not_null(f);
	o = json_loadf(f, JSON_DISABLE_EOF_CHECK, &jerr);
	fclose(f);
	cr_assert_not_null(o, "%s is not one JSON object: %s", vlog, jerr.text);
	return o;
}

/* `verify --json` prints one JSON object with every figure of the report,
 * and they agree with the database, the DLQ and the ledger; the text report
 * adds the duplicates absorbed. */
Test(loadgen, verify_json_has_every_figure_and_they_agree_with_the_database, .timeout = 600)
{
	char ledger[256], plog[300], vlog[300], tlog[300];
	const char *pub[] = { "publish", "--ledger", ledger, "--run", "json", "--orders", "30", "--malformed", "6",
	                      "--delayed-dups", "0", "--connections", "2", NULL };
	const char *ver[] = { "verify", "--ledger", ledger, "--timeout", "1m", "--json", NULL };
	const char *txt[] = { "verify", "--ledger", ledger, "--timeout", "1m", NULL };
	json_t *o, *rows;
	int64_t copies;

	itest_fresh();
	lg_ledger_path(ledger, sizeof ledger, "json");
	snprintf(plog, sizeof plog, "%s.publish.log", ledger);
	snprintf(vlog, sizeof vlog, "%s.verify.json", ledger);
	snprintf(tlog, sizeof tlog, "%s.verify.txt", ledger);
	lg_publish_settled(pub, ledger, plog, 2);
	o = lg_verify_json(ver, vlog);
	cr_assert(json_is_true(json_object_get(o, "ok")), "see %s", vlog);
	rows = json_object_get(o, "inbox_rows");
	cr_assert_eq(json_integer_value(json_object_get(rows, "applied")),
	             itest_int("SELECT COUNT(*) FROM processed_messages WHERE outcome = 'applied'"), "see %s", vlog);
	cr_assert_eq(json_integer_value(json_object_get(rows, "dead_lettered")),
	             itest_int("SELECT COUNT(*) FROM processed_messages WHERE outcome = 'dead_lettered'"), "see %s", vlog);
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(o, "effects"), "exactly_once")),
	             itest_int("SELECT COUNT(*) FROM order_events"), "see %s", vlog);
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(o, "dead_letters"), "found")),
	             itest_queue_depth(itest_cfg()->dlq), "see %s", vlog);
	{
		json_t *dl = json_object_get(o, "dead_letters"), *v;
		const char *k;
		int64_t sum = 0;
		cr_assert_eq(json_integer_value(json_object_get(dl, "expected")),
		             json_integer_value(json_object_get(dl, "found")), "see %s", vlog);
		cr_assert_gt(json_object_size(json_object_get(dl, "copies_by_reason")), 0, "see %s", vlog);
		json_object_foreach(json_object_get(dl, "copies_by_reason"), k, v)
			sum += json_integer_value(v);
		cr_assert_eq(sum, itest_queue_depth(itest_cfg()->dlq), "see %s", vlog);
	}
	copies = itest_ledger_int(ledger, "copies_immediate") + itest_ledger_int(ledger, "copies_concurrent") +
	         itest_ledger_int(ledger, "copies_delayed");
	cr_assert_gt(copies, 0);
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(o, "duplicates"), "published")), copies);
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(o, "duplicates"), "absorbed")), copies);
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(o, "missing"), "total")), 0);
	cr_assert(json_is_integer(json_object_get(json_object_get(o, "emitted"), "found")), "see %s", vlog);
	json_decref(o);
	cr_assert_eq(itest_loadgen(txt, NULL, tlog, 120), 0, "verify failed, see %s", tlog);
	cr_assert(lg_file_has(tlog, "duplicates", "absorbed"), "the text report lacks the duplicates, see %s", tlog);
}

/* The verify report counts, from the inbox rows (held_at), the events that
 * had to wait and what became of them (released into each outcome,
 * expired, still held), in text and in --json. */
Test(loadgen, verify_reports_held_then_released_events_from_the_rows, .timeout = 600)
{
	char ledger[256], plog[300], vlog[300], tlog[300], like[64], line[200];
	const char *pub[] = { "publish", "--ledger", ledger, "--run", "hold", "--orders", "40", "--reorder-window", "4",
	                      "--delayed-dups", "0", "--connections", "2", NULL };
	const char *ver[] = { "verify", "--ledger", ledger, "--timeout", "1m", "--json", NULL };
	const char *txt[] = { "verify", "--ledger", ledger, "--timeout", "1m", NULL };
	json_t *o, *h, *by;
	int64_t held, released, copies;

	itest_fresh();
	lg_ledger_path(ledger, sizeof ledger, "hold");
	snprintf(plog, sizeof plog, "%s.publish.log", ledger);
	snprintf(vlog, sizeof vlog, "%s.verify.json", ledger);
	snprintf(tlog, sizeof tlog, "%s.verify.txt", ledger);
	lg_publish_settled(pub, ledger, plog, 1);
	snprintf(like, sizeof like, "%s-%%", "lg1-hold");
	held = itest_int1("SELECT COUNT(*) FROM processed_messages WHERE held_at IS NOT NULL AND message_id LIKE ?", like);
	released = itest_int1("SELECT COUNT(*) FROM processed_messages WHERE held_at IS NOT NULL AND outcome <> 'held'"
	                      " AND COALESCE(reason, '') <> 'hold-expired' AND message_id LIKE ?",
	                      like);
	cr_assert_gt(held, 0, "a reorder window of 4 holds some events");

	o = lg_verify_json(ver, vlog);
	h = json_object_get(o, "holds");
	cr_assert(json_is_object(h), "no holds in %s", vlog);
	cr_assert_eq(json_integer_value(json_object_get(h, "held")), held, "see %s", vlog);
	cr_assert_eq(json_integer_value(json_object_get(h, "released")), released, "see %s", vlog);
	cr_assert_eq(json_integer_value(json_object_get(h, "expired")), 0, "see %s", vlog);
	cr_assert_eq(json_integer_value(json_object_get(h, "still_held")), 0, "see %s", vlog);
	by = json_object_get(h, "released_by_outcome");
	cr_assert_eq(json_integer_value(json_object_get(by, "applied")) +
	                 json_integer_value(json_object_get(by, "compensated")) +
	                 json_integer_value(json_object_get(by, "ignored")) +
	                 json_integer_value(json_object_get(by, "dead_lettered")),
	             released, "see %s", vlog);
	cr_assert_eq(json_integer_value(json_object_get(by, "applied")),
	             itest_int1("SELECT COUNT(*) FROM processed_messages WHERE held_at IS NOT NULL"
	                        " AND outcome = 'applied' AND message_id LIKE ?",
	                        like),
	             "see %s", vlog);
	copies = itest_ledger_int(ledger, "copies_immediate") + itest_ledger_int(ledger, "copies_concurrent") +
	         itest_ledger_int(ledger, "copies_delayed");
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(o, "duplicates"), "absorbed")), copies);
	json_decref(o);

	cr_assert_eq(itest_loadgen(txt, NULL, tlog, 120), 0, "verify failed, see %s", tlog);
	snprintf(line, sizeof line, "held %lld, released %lld (", (long long)held, (long long)released);
	cr_assert(lg_file_has(tlog, "holds ", line), "the text report lacks '%s', see %s", line, tlog);
	cr_assert(lg_file_has(tlog, "holds ", "expired 0, still held 0"), "see %s", tlog);
}

/* A delivery that a worker holds unacknowledged for long (a lock wait, a
 * reset) is neither ready nor missing: verify must not judge while one of
 * the run's messages has left no trace yet.  The test holds one original
 * itself, unacked, while two workers settle the rest and verify runs;
 * verify must not finish while it is held (before, it judged after five
 * quiet seconds and reported it missing: a false FAIL).  The hold lasts
 * 20 s or until verify exits, whichever is first: the bound of the
 * observation, not a timed assertion; then the message goes back, the
 * workers apply it, and verify must pass. */
Test(loadgen, verify_waits_for_a_delivery_held_unacked, .timeout = 600)
{
	char ledger[256], plog[300], vlog[300];
	/* No duplicate copies: the message held must be the only copy of
	 * its key, or a copy of it would settle it meanwhile. */
	const char *pub[] = { "publish", "--ledger", ledger, "--run", "held", "--orders", "20", "--dup-rate", "0",
	                      "--delayed-dups", "0", "--connections", "2", NULL };
	const char *ver[] = { "verify", "--ledger", ledger, "--timeout", "120", NULL };
	struct mq *hold = NULL;
	struct mq_delivery d;
	uint64_t others[400];
	int nothers = 0;
	pid_t w, v;
	bool exited_while_held = false;
	int st = 0;

	itest_fresh();
	lg_ledger_path(ledger, sizeof ledger, "held");
	snprintf(plog, sizeof plog, "%s.publish.log", ledger);
	snprintf(vlog, sizeof vlog, "%s.verify.log", ledger);
	cr_assert_eq(itest_loadgen(pub, NULL, plog, 120), 0, "publish failed, see %s", plog);
	cr_assert_eq(mq_open(&hold, &itest_cfg()->amqp, 0, "itest-holder"), ST_OK);
	/* A ShipmentCreated: nothing waits for it, so while it is away no
	 * held event, no outbox row and no ready message says the run is
	 * unsettled; the others taken on the way go straight back. */
	for (int i = 0;; i++) {
		json_error_t jerr;
		json_t *o;
		bool ship;

		cr_assert_lt(i, 400, "no ShipmentCreated among the first 400 messages");
		cr_assert_eq(mq_get(hold, itest_cfg()->queue, &d), ST_OK, "%s", mq_errmsg(hold));
		o = json_loadb(d.body, d.len, 0, &jerr);
		ship = json_is_string(json_object_get(o, "type")) &&
		       strcmp(json_string_value(json_object_get(o, "type")), "ShipmentCreated") == 0;
		json_decref(o);
		if (ship)
			break;
		others[nothers++] = d.tag;
	}
	/* Together and after the search: one by one, a requeued message
	 * would be at the head again and taken again. */
	for (int i = 0; i < nothers; i++)
		cr_assert_eq(mq_reject(hold, others[i], true), ST_OK, "%s", mq_errmsg(hold));
	w = itest_worker(2, NULL);
	v = itest_spawn_program(getenv("INBOX_LOADGEN_BIN"), ver, NULL, vlog, true);
	for (int i = 0; i < 200 && !exited_while_held; i++) {
		pid_t r = waitpid(v, &st, WNOHANG);
		cr_assert_neq(r, -1, "waitpid: %s", strerror(errno));
		exited_while_held = r == v;
		if (!exited_while_held)
			usleep(100 * 1000); /* polling the child's exit */
	}
	mq_delivery_release(hold, &d);
	mq_close(&hold); /* the held delivery goes back to the queue */
	if (!exited_while_held)
		st = itest_wait_exit(v, 180);
	itest_stop(w, SIGTERM, 30);
	cr_expect(!exited_while_held, "verify judged while a delivery was held unacked, see %s", vlog);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "verify failed (status %d), see %s", st, vlog);
}

/* An emitted effect under a second message id is two effects downstream,
 * not a harmless re-publish (a re-publish repeats the stable id
 * "<type>:<order>"); one without the stable id cannot be deduplicated at
 * all.  verify fails on both, naming the order. */
Test(loadgen, verify_fails_an_effect_emitted_under_another_id, .timeout = 600)
{
	char ledger[256], vlog[300], order[130], body[512], stable[200];
	const char *ver[] = { "verify", "--ledger", ledger, "--timeout", "60", NULL };
	struct mq_message msg = { .routing_key = "order.RefundRequested", .mandatory = true };
	struct mq *m;

	itest_fresh();
	lg_ledger_path(ledger, sizeof ledger, "emitid");
	snprintf(vlog, sizeof vlog, "%s.verify.log", ledger);
	lg_settled_run(ledger, "emitid");
	cr_assert_eq(itest_loadgen(ver, NULL, vlog, 120), 0, "the untouched run must verify, see %s", vlog);
	cr_assert(itest_str1("SELECT order_id FROM outbox WHERE type = ? ORDER BY id LIMIT 1", "RefundRequested", order,
	                     sizeof order), "the run emitted no RefundRequested");
	snprintf(stable, sizeof stable, "RefundRequested:%s", order);
	m = itest_mq();
	msg.exchange = itest_cfg()->out_exchange;
	/* The same effect again under its stable id: a re-publish, allowed. */
	snprintf(body, sizeof body,
	         "{\"message_id\":\"%s\",\"source\":\"order-status\",\"type\":\"RefundRequested\",\"order_id\":\"%s\"}",
	         stable, order);
	msg.body = body;
	msg.len = strlen(body);
	msg.message_id = stable;
	cr_assert_eq(mq_publish_confirmed(m, &msg, 10000), ST_OK);
	cr_assert_eq(itest_loadgen(ver, NULL, vlog, 120), 0, "a re-publish under the stable id is allowed, see %s", vlog);
	/* Under another id. */
	snprintf(body, sizeof body,
	         "{\"message_id\":\"other-%s\",\"source\":\"order-status\",\"type\":\"RefundRequested\",\"order_id\":\"%s\"}",
	         order, order);
	msg.len = strlen(body);
	snprintf(stable, sizeof stable, "other-%s", order);
	msg.message_id = stable;
	cr_assert_eq(mq_publish_confirmed(m, &msg, 10000), ST_OK);
	cr_assert_neq(itest_loadgen(ver, NULL, vlog, 120), 0, "verify passed an effect emitted under a second id, see %s", vlog);
	cr_assert(lg_file_has(vlog, order, "RefundRequested"), "report does not name %s, see %s", order, vlog);
	mq_close(&m);
}
