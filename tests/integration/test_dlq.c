/*
 * test_dlq.c - `inbox-worker dlq list | show | replay | purge` (issue 15)
 * against the real broker and database: list only reads (same count, same
 * order, also on a quorum queue), replay of a fixed cause applies each
 * message exactly once even when replay is SIGKILLed between a confirmed
 * copy and the removal of its dead letter, a conflict and a malformed
 * message are reported and left instead of going round, --dry-run changes
 * nothing, purge counts first, and /metrics shows the DLQ's depth.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <amqp.h>
#include <amqp_tcp_socket.h>

#include "itest.h"
#include "status.h"

/* Run `inbox-worker dlq ARGS...` with extra environment; its stdout into
 * out (NUL-terminated), its stderr into the log called name
 * (itest_log_path: in /tmp, not in the directory the suite runs from).
 * Returns the wait status. */
static int run_dlq(const char *const *args, const char *const *env, char *out, size_t cap, const char *name)
{
	const char *bin = getenv("INBOX_WORKER_BIN");
	char outp[256], log[256];
	char *argv[40];
	int n = 0, st;
	pid_t pid;

	cr_assert_not_null(bin);
	argv[n++] = (char *)bin;
	argv[n++] = "dlq";
	for (int i = 0; args[i] != NULL && n < 39; i++)
		argv[n++] = (char *)args[i];
	argv[n] = NULL;
	itest_log_path(outp, sizeof outp, "dlq-out");
	itest_log_path(log, sizeof log, name);
	pid = fork();
	cr_assert_neq(pid, -1);
	if (pid == 0) {
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
			_exit(126);
		if (freopen(outp, "w", stdout) == NULL || freopen(log, "w", stderr) == NULL)
			_exit(126);
		for (int i = 0; env != NULL && env[i] != NULL; i++)
			putenv((char *)env[i]);
		execv(bin, argv);
		_exit(127);
	}
	st = itest_wait_exit(pid, 120);
	itest_read_file(outp, out, cap);
	return st;
}

static bool exited_0(int st)
{
	return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* `dlq list --json [more]` as a JSON document (caller decrefs). */
static json_t *list_json(const char *const *more, const char *const *env)
{
	static char out[1 << 20];
	const char *args[16] = { "list", "--json" };
	json_error_t jerr;
	json_t *doc;
	int n = 2, st;

	for (int i = 0; more != NULL && more[i] != NULL; i++)
		args[n++] = more[i];
	args[n] = NULL;
	st = run_dlq(args, env, out, sizeof out, "dlq-list");
	cr_assert(exited_0(st), "dlq list exit status %d; see its log in /tmp (dlq-list)", st);
	doc = json_loads(out, 0, &jerr);
	cr_assert_not_null(doc, "dlq list --json printed no JSON: %s (%s)", jerr.text, out);
	return doc;
}

/* Publish one dead letter straight to the dead-letter exchange, as the
 * worker would: body, message-id, and the reason headers. */
static void put_dead(struct mq *m, const char *id, const char *reason, const char *order, const char *rk)
{
	char body[2048];
	struct mq_header h[3] = { { "x-inbox-reason", reason }, { "x-inbox-detail", "put there by the test" },
		                  { "x-inbox-dead-lettered-at", "2020-01-01T12:00:00Z" } };
	struct mq_message msg = { .exchange = itest_cfg()->dlx, .routing_key = rk, .body = body,
		                  .message_id = id, .headers = h, .nheaders = 3, .mandatory = true };

	snprintf(body, sizeof body,
	         "{\"message_id\":\"%s\",\"type\":\"PaymentAuthorized\",\"order_id\":\"%s\",\"data\":{\"amount_cents\":100}}",
	         id, order);
	msg.len = strlen(body);
	cr_assert_eq(mq_publish_confirmed(m, &msg, 10000), ST_OK, "%s", mq_errmsg(m));
}

static const char *const reasons[] = { "hold-expired", "payload-conflict", "malformed-json", "invalid-transition" };

/* The ids in the JSON list, in order, must be want[0..n). */
static void expect_ids(json_t *doc, const char *const *want, int n)
{
	json_t *list = json_object_get(doc, "dead_letters");

	cr_assert_eq((int)json_array_size(list), n, "listed %zu, want %d", json_array_size(list), n);
	for (int i = 0; i < n; i++)
		cr_expect_str_eq(json_string_value(json_object_get(json_array_get(list, (size_t)i), "message_id")), want[i],
		                 "position %d", i + 1);
}

/* Take every message of queue with basic.get + ack, in order, at most cap
 * of them, each shown to fn (n: its position) before it is acked. */
typedef void drain_fn(const struct mq_delivery *d, int n, void *arg);

static int drain_each(const char *queue, int cap, drain_fn *fn, void *arg)
{
	struct mq *m = NULL;
	int n = 0;

	cr_assert_eq(mq_open(&m, &itest_cfg()->amqp, 0, "itest-dlq-drain"), ST_OK);
	while (n < cap) {
		struct mq_delivery d;
		int rc = mq_get(m, queue, &d);
		if (rc == ST_ERR_NOT_FOUND)
			break;
		cr_assert_eq(rc, ST_OK, "basic.get: %s", mq_errmsg(m));
		fn(&d, n, arg);
		cr_assert_eq(mq_ack(m, d.tag, false), ST_OK);
		mq_delivery_release(m, &d);
		n++;
	}
	mq_close(&m);
	return n;
}

struct counted {
	struct itest_dead *out;
	int64_t max_count;
};

static void drain_counted_one(const struct mq_delivery *d, int n, void *arg)
{
	struct counted *c = arg;
	struct itest_dead *e = &c->out[n];

	memset(e, 0, sizeof *e);
	snprintf(e->message_id, sizeof e->message_id, "%.*s", (int)d->props.message_id_len,
	         d->props.message_id != NULL ? d->props.message_id : "");
	if (mq_delivery_header(d, "x-inbox-reason", e->reason, sizeof e->reason) != ST_OK)
		snprintf(e->reason, sizeof e->reason, "(none)");
	if (d->delivery_count > c->max_count)
		c->max_count = d->delivery_count;
}

/* Ids, reasons, and the largest x-delivery-count seen. */
static int drain_counted(const char *queue, struct itest_dead *out, int cap, int64_t *max_count)
{
	struct counted c = { out, 0 };
	int n = drain_each(queue, cap, drain_counted_one, &c);

	*max_count = c.max_count;
	return n;
}

/* Returns the largest x-delivery-count after three lists. */
static int64_t list_keeps_count_and_order(const char *dlq, const char *const *env)
{
	int64_t dc;
	enum { N = 40 };
	static char ids[N][16];
	const char *want[N];
	struct itest_dead dead[N + 4];
	struct mq *m = itest_mq();
	json_t *doc;
	int got;

	for (int i = 0; i < N; i++) {
		snprintf(ids[i], sizeof ids[i], "dead-%02d", i);
		want[i] = ids[i];
		put_dead(m, ids[i], reasons[i % 4], i % 2 ? "o-odd" : "o-even", "order.PaymentAuthorized");
	}
	mq_close(&m);
	cr_assert_eq(itest_queue_depth(dlq), N);
	for (int round = 0; round < 3; round++) {
		doc = list_json(NULL, env);
		cr_assert_eq(json_integer_value(json_object_get(doc, "in_queue")), N);
		cr_assert_eq(json_integer_value(json_object_get(doc, "read")), N);
		expect_ids(doc, want, N);
		cr_expect_eq(json_integer_value(json_object_get(json_object_get(doc, "by_reason"), "hold-expired")), N / 4);
		json_decref(doc);
		/* Back in the queue, all of them, before the command returned. */
		cr_assert_eq(itest_queue_depth(dlq), N, "round %d: the list took messages away", round);
	}
	/* Filters choose, they do not move anything either. */
	{
		const char *f[] = { "--reason", "payload-conflict", "--order", "o-odd", NULL };
		doc = list_json(f, env);
		cr_assert_eq(json_integer_value(json_object_get(doc, "shown")), N / 4);
		cr_expect_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(doc, "dead_letters"), 0),
		                                                   "message_id")), "dead-01");
		json_decref(doc);
	}
	got = drain_counted(dlq, dead, N + 4, &dc);
	cr_assert_eq(got, N, "the queue holds %d messages after listing, want %d", got, N);
	for (int i = 0; i < N; i++) {
		cr_expect_str_eq(dead[i].message_id, ids[i], "queue position %d after listing", i + 1);
		cr_expect_str_eq(dead[i].reason, reasons[i % 4]);
	}
	return dc;
}

Test(dlq, list_leaves_the_queue_unchanged)
{
	itest_fresh();
	/* A classic queue counts nothing. */
	cr_expect_eq(list_keeps_count_and_order(itest_cfg()->dlq, NULL), 0);
}

/* A quorum queue bound to the DLX, declared with rabbitmq-c directly (the
 * worker's own code declares its DLQ classic and has no call for this). */
static void declare_quorum_dlq(const char *queue)
{
	const struct cfg_amqp *c = &itest_cfg()->amqp;
	amqp_connection_state_t conn = amqp_new_connection();
	amqp_socket_t *sock = amqp_tcp_socket_new(conn);
	amqp_table_entry_t e = { .key = amqp_cstring_bytes("x-queue-type"),
		                 .value = { .kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes("quorum") } };
	amqp_table_t args = { .num_entries = 1, .entries = &e };

	cr_assert_not_null(sock);
	cr_assert_eq(amqp_socket_open(sock, c->host, c->port), AMQP_STATUS_OK);
	cr_assert_eq(amqp_login(conn, c->vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, c->user, c->password).reply_type,
	             AMQP_RESPONSE_NORMAL);
	cr_assert_not_null(amqp_channel_open(conn, 1));
	cr_assert_not_null(amqp_queue_declare(conn, 1, amqp_cstring_bytes(queue), 0, 1, 0, 0, args));
	cr_assert_not_null(amqp_queue_bind(conn, 1, amqp_cstring_bytes(queue), amqp_cstring_bytes(itest_cfg()->dlx),
	                                   amqp_cstring_bytes("#"), amqp_empty_table));
	cr_assert_not_null(amqp_queue_purge(conn, 1, amqp_cstring_bytes(queue)));
	amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
	amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(conn);
}

/* The worker declares its DLQ as a classic queue, but an operator may
 * have made it a quorum queue: the order must survive a list there too. */
Test(dlq, list_on_a_quorum_dlq_keeps_count_and_order)
{
	const char *q = "orders.test.dlq.quorum";
	const char *env[] = { "INBOX_DLQ=orders.test.dlq.quorum", NULL };
	struct mq *m;

	itest_fresh();
	m = itest_mq();
	(void)mq_queue_delete(m, q);
	mq_close(&m);
	declare_quorum_dlq(q);
	m = itest_mq();
	cr_assert_eq(mq_queue_unbind(m, itest_cfg()->dlq, itest_cfg()->dlx, "#"), ST_OK, "%s", mq_errmsg(m));
	mq_close(&m);
	/* Seen on RabbitMQ 3.10: the order survives (the window hands all
	 * of them back at once, in order, and a quorum queue puts returned
	 * messages behind the rest), but each of the four lists counted one
	 * delivery of every message.  Hence dlq list warns on such a queue,
	 * and a delivery-limit must never be set on a DLQ. */
	cr_expect_eq(list_keeps_count_and_order(q, env), 4);
	m = itest_mq();
	(void)mq_queue_delete(m, q);
	mq_close(&m);
}

static char out[1 << 20];

static int replay(const char *const *args, const char *const *env)
{
	const char *a[16] = { "replay" };
	int n = 1;

	for (int i = 0; args != NULL && args[i] != NULL; i++)
		a[n++] = args[i];
	a[n] = NULL;
	return run_dlq(a, env, out, sizeof out, "dlq-replay");
}

/* The ids and replay counts of a list, as one string ("id:replays ..."). */
static void list_signature(char *buf, size_t cap)
{
	json_t *doc = list_json(NULL, NULL);
	json_t *e;
	size_t i, len = 0;

	buf[0] = '\0';
	json_array_foreach(json_object_get(doc, "dead_letters"), i, e) {
		int k = snprintf(buf + len, cap - len, "%s:%s:%lld ", json_string_value(json_object_get(e, "message_id")),
		                 json_string_value(json_object_get(e, "reason")),
		                 (long long)json_integer_value(json_object_get(e, "replays")));
		cr_assert(k > 0 && (size_t)k < cap - len);
		len += (size_t)k;
	}
	json_decref(doc);
}

/* Where a test's worker logs: in /tmp beside the other suites' logs, not
 * in the directory the suite runs from. */
static const char *dlq_worker_log(int k)
{
	static char path[2][256];

	itest_log_path(path[k], sizeof path[k], k == 0 ? "dlq-worker" : "dlq-worker2");
	return path[k];
}

/*
 * The issue's case: payments arrive for orders that do not exist (the
 * order service was down) and their holds expire.  Replayed before the
 * orders exist, they are left (replay would only hold them again);
 * after, replay applies each exactly once, although the first replay is
 * SIGKILLed between the broker's confirm of a copy and the removal of its
 * dead letter, and a second replay sends that one again.
 */
Test(dlq, replay_of_a_fixed_cause_applies_once_also_after_sigkill)
{
	enum { N = 20 };
	const char *wenv[] = { "INBOX_HOLD_TTL=1s", NULL };
	const char *dlq = NULL;
	char body[512], id[32], order[32], before[8192], after[8192];
	struct mq *m;
	pid_t w;
	int st;

	itest_fresh();
	dlq = itest_cfg()->dlq;
	w = itest_worker_logged(2, wenv, dlq_worker_log(0));
	m = itest_mq();
	for (int i = 0; i < N; i++) {
		snprintf(id, sizeof id, "pay-%02d", i);
		snprintf(order, sizeof order, "ro-%02d", i);
		itest_event(body, sizeof body, id, "PaymentAuthorized", order);
		itest_publish_async(m, "PaymentAuthorized", body, NULL);
	}
	itest_confirm_all(m);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages WHERE reason = 'hold-expired'", N, 60), N);
	cr_assert_eq(itest_wait_depth(dlq, N, 60), N, "the expired holds did not all reach the DLQ");

	/* The cause is not fixed yet: nothing is replayed. */
	st = replay(NULL, NULL);
	cr_assert(exited_0(st), "replay exit %d: %s", st, out);
	cr_expect(strstr(out, "replayed 0") != NULL && strstr(out, "prerequisite-missing 20") != NULL, "%s", out);
	cr_assert_eq(itest_queue_depth(dlq), N);

	for (int i = 0; i < N; i++) {
		snprintf(id, sizeof id, "create-%02d", i);
		snprintf(order, sizeof order, "ro-%02d", i);
		itest_event(body, sizeof body, id, "OrderCreated", order);
		itest_publish_async(m, "OrderCreated", body, NULL);
	}
	itest_confirm_all(m);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM orders WHERE status = 'Created'", N, 60), N);

	/* --dry-run: says what it would do, changes nothing. */
	list_signature(before, sizeof before);
	{
		const char *a[] = { "--dry-run", NULL };
		st = replay(a, NULL);
	}
	cr_assert(exited_0(st), "replay --dry-run exit %d: %s", st, out);
	cr_expect(strstr(out, "would replay 20") != NULL, "%s", out);
	list_signature(after, sizeof after);
	cr_assert_str_eq(after, before, "a dry run changed the DLQ");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE reason = 'hold-expired'"), N);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders WHERE status = 'Created'"), N);

	/* Killed after the tenth copy was confirmed, before its dead letter
	 * was removed. */
	{
		const char *env[] = { "INBOX_FAULT=dlq-replay-after-confirm", "INBOX_FAULT_SKIP=9", NULL };
		const char *a[] = { "--reason", "hold-expired", NULL };
		st = replay(a, env);
	}
	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the replay was not killed (status %d): %s", st, out);
	cr_assert_eq(itest_wait_depth(dlq, N - 9, 10), N - 9, "nine dead letters removed, the tenth back in the queue");

	st = replay(NULL, NULL);
	cr_assert(exited_0(st), "replay exit %d: %s", st, out);
	cr_expect(strstr(out, "replayed 11") != NULL, "%s", out);

	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM orders WHERE status = 'Paid'", N, 60), N);
	itest_wait_queue_empty(itest_cfg()->queue, 60);
	cr_assert_eq(itest_queue_depth(dlq), 0);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM order_events WHERE type = 'PaymentAuthorized'"), N,
	             "each payment took effect exactly once");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM order_events"), 2 * N);
	cr_expect_eq(itest_int("SELECT SUM(version) FROM orders"), 2 * N);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE message_id LIKE 'pay-%'"
	                       " AND outcome = 'applied'"), N);
	mq_close(&m);
	itest_stop(w, SIGTERM, 30);
}

/* A conflict stays a conflict and a body that does not parse stays
 * malformed: replay reports both and leaves them where they are, run after
 * run, instead of sending them round through the worker again. */
Test(dlq, conflict_and_malformed_are_reported_not_looped)
{
	const char *dlq;
	char body[512], before[8192], after[8192];
	struct mq *m;
	pid_t w;
	int st;

	itest_fresh();
	dlq = itest_cfg()->dlq;
	w = itest_worker_logged(1, NULL, dlq_worker_log(0));
	m = itest_mq();
	itest_event(body, sizeof body, "k-1", "OrderCreated", "ko-1");
	itest_publish(m, "OrderCreated", body, NULL);
	itest_event(body, sizeof body, "k-1", "OrderCreated", "ko-2"); /* the same key, another payload */
	itest_publish(m, "OrderCreated", body, NULL);
	cr_assert_eq(itest_wait_depth(dlq, 1, 30), 1); /* so that the order in the DLQ is known */
	itest_publish(m, "OrderCreated", "{\"message_id\": \"bad-1\", \"type\": \"OrderCreated\", oops", "bad-1");
	cr_assert_eq(itest_wait_depth(dlq, 2, 30), 2);
	list_signature(before, sizeof before);
	cr_assert_str_eq(before, "k-1:payload-conflict:0 bad-1:malformed-json:0 ");

	for (int round = 0; round < 2; round++) {
		st = replay(NULL, NULL);
		cr_assert(exited_0(st), "replay exit %d: %s", st, out);
		cr_expect(strstr(out, "replayed 0") != NULL && strstr(out, "payload-conflict 1") != NULL &&
		          strstr(out, "still-malformed 1") != NULL, "round %d: %s", round, out);
		cr_expect(strstr(out, "the first one stands") != NULL, "the conflict is explained: %s", out);
		list_signature(after, sizeof after);
		cr_assert_str_eq(after, before, "round %d: replay moved or resent a dead letter", round);
	}
	/* Chosen by id, the same. */
	{
		const char *a[] = { "--id", "k-1", NULL };
		st = replay(a, NULL);
		cr_assert(exited_0(st));
		cr_expect(strstr(out, "1 chosen") != NULL && strstr(out, "payload-conflict 1") != NULL, "%s", out);
	}
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM orders"), 1);
	cr_expect_eq(itest_int("SELECT version FROM orders WHERE id = 'ko-1'"), 1);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM processed_messages"), 1);

	/* show: everything an operator needs to decide about the conflict. */
	{
		const char *a[] = { "show", "k-1", NULL };
		st = run_dlq(a, NULL, out, sizeof out, "dlq-show");
		cr_assert(exited_0(st), "show exit %d", st);
		cr_expect(strstr(out, "reason:       payload-conflict") != NULL, "%s", out);
		cr_expect(strstr(out, "\"order_id\":\"ko-2\"") != NULL, "the body: %s", out);
		cr_expect(strstr(out, "(ANOTHER payload)") != NULL, "the inbox row: %s", out);
		cr_expect(strstr(out, "order row:    ko-1") == NULL && strstr(out, "ko-2 does not exist") != NULL,
		          "the dead letter's own order: %s", out);
		cr_expect(strstr(out, "would leave it") != NULL, "%s", out);
	}
	{
		const char *a[] = { "show", "no-such-message", NULL };
		st = run_dlq(a, NULL, out, sizeof out, "dlq-show");
		cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "show of a missing id: status %d", st);
	}
	cr_assert_eq(itest_queue_depth(dlq), 2);
	mq_close(&m);
	itest_stop(w, SIGTERM, 30);
}

/* A cause fixed by configuration: bodies over INBOX_MAX_BODY.  A dry run
 * under the old limit says they still fail, under the new one says it
 * would replay them, and neither changes anything; the replay then
 * applies them. */
Test(dlq, dry_run_changes_nothing_and_a_raised_limit_lets_replay_apply)
{
	enum { N = 5 };
	const char *small[] = { "INBOX_MAX_BODY=200", NULL };
	const char *dlq;
	char body[1024], id[32], order[32], before[8192], after[8192];
	struct mq *m;
	pid_t w;
	int st;

	itest_fresh();
	dlq = itest_cfg()->dlq;
	w = itest_worker_logged(1, small, dlq_worker_log(0));
	m = itest_mq();
	for (int i = 0; i < N; i++) {
		snprintf(id, sizeof id, "big-%d", i);
		snprintf(order, sizeof order, "bo-%d", i);
		snprintf(body, sizeof body,
		         "{\"message_id\":\"%s\",\"type\":\"OrderCreated\",\"order_id\":\"%s\",\"data\":{\"note\":"
		         "\"%0200d\"}}", id, order, 0);
		itest_publish(m, "OrderCreated", body, NULL);
	}
	cr_assert_eq(itest_wait_depth(dlq, N, 30), N);
	itest_stop(w, SIGTERM, 30);
	list_signature(before, sizeof before);

	st = replay(NULL, small);
	cr_assert(exited_0(st));
	cr_expect(strstr(out, "still-malformed 5") != NULL && strstr(out, "too-large") != NULL, "%s", out);
	{
		const char *a[] = { "--dry-run", NULL };
		st = replay(a, NULL);
	}
	cr_assert(exited_0(st));
	cr_expect(strstr(out, "dry run, nothing changed") != NULL && strstr(out, "would replay 5") != NULL, "%s", out);
	list_signature(after, sizeof after);
	cr_assert_str_eq(after, before, "a dry run changed the DLQ");
	cr_assert_eq(itest_queue_depth(itest_cfg()->queue), 0, "a dry run published");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages"), 0);

	/* The fix: workers with the default limit; then the replay. */
	w = itest_worker_logged(1, NULL, dlq_worker_log(1));
	{
		const char *a[] = { "--reason", "too-large", "--limit", "3", NULL };
		st = replay(a, NULL);
	}
	cr_assert(exited_0(st), "%s", out);
	cr_expect(strstr(out, "replayed 3") != NULL, "--limit 3: %s", out);
	st = replay(NULL, NULL);
	cr_assert(exited_0(st));
	cr_expect(strstr(out, "replayed 2") != NULL, "the rest: %s", out);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM orders WHERE status = 'Created'", N, 30), N);
	itest_wait_queue_empty(itest_cfg()->queue, 30);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM order_events"), N);
	cr_expect_eq(itest_queue_depth(dlq), 0);
	mq_close(&m);
	itest_stop(w, SIGTERM, 30);
}

/* purge counts first, and removes only the reason asked for. */
Test(dlq, purge_counts_first_and_removes_only_that_reason)
{
	const char *dlq;
	struct itest_dead dead[8];
	struct mq *m;
	int64_t dc;
	int st;

	itest_fresh();
	dlq = itest_cfg()->dlq;
	m = itest_mq();
	put_dead(m, "g-1", "malformed-json", "x", "order.X");
	put_dead(m, "c-1", "payload-conflict", "x", "order.X");
	put_dead(m, "g-2", "malformed-json", "x", "order.X");
	put_dead(m, "c-2", "payload-conflict", "x", "order.X");
	put_dead(m, "g-3", "malformed-json", "x", "order.X");
	mq_close(&m);
	{
		const char *a[] = { "purge", "--reason", "malformed-json", NULL };
		st = run_dlq(a, NULL, out, sizeof out, "dlq-purge");
	}
	cr_assert(exited_0(st));
	cr_expect(strstr(out, "would purge 3 of 5") != NULL, "%s", out);
	cr_assert_eq(itest_queue_depth(dlq), 5);
	{
		const char *a[] = { "purge", NULL };
		st = run_dlq(a, NULL, out, sizeof out, "dlq-purge");
		cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "purge without --reason: status %d", st);
	}
	{
		const char *a[] = { "purge", "--reason", "malformed-json", "--yes", NULL };
		st = run_dlq(a, NULL, out, sizeof out, "dlq-purge");
	}
	cr_assert(exited_0(st));
	cr_expect(strstr(out, "purged 3 of 5") != NULL, "%s", out);
	cr_assert_eq(drain_counted(dlq, dead, 8, &dc), 2);
	cr_expect_str_eq(dead[0].message_id, "c-1");
	cr_expect_str_eq(dead[1].message_id, "c-2");
}

/* /metrics shows the DLQ's depth as the worker's janitor reads it. */
Test(dlq, metrics_show_the_dlq_depth)
{
	char addr[64], metrics_env[128], body[8192];
	const char *env[] = { metrics_env, NULL };
	struct mq *m;
	pid_t w;
	int port = itest_metrics_port(0);

	itest_fresh();
	snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
	snprintf(metrics_env, sizeof metrics_env, "INBOX_METRICS_ADDR=%s", addr);
	w = itest_worker_logged(1, env, dlq_worker_log(0));
	m = itest_mq();
	put_dead(m, "d-1", "malformed-json", "x", "order.X");
	put_dead(m, "d-2", "malformed-json", "x", "order.X");
	put_dead(m, "d-3", "malformed-json", "x", "order.X");
	mq_close(&m);
	cr_expect_eq(itest_wait_metric(port, "inbox_dlq_messages", 3, 3, body, sizeof body, 10), 3,
	             "inbox_dlq_messages 3 never shown: %s", body);
	itest_stop(w, SIGTERM, 30);
}

/* A message the broker dead-lettered (the delivery limit: it crashed
 * every worker that took it) has no x-inbox-reason, only x-death: it is
 * listed as delivery-limit with the broker's time, and replayed like any
 * other once the cause is gone. */
Test(dlq, a_broker_dead_letter_is_listed_and_replayed)
{
	const struct cfg *c;
	char body[512];
	struct mq *m;
	json_t *doc, *e;
	pid_t w;
	int st, rounds = 0;

	itest_fresh();
	c = itest_cfg();
	m = itest_mq();
	itest_event(body, sizeof body, "poison-1", "OrderCreated", "po-1");
	itest_publish(m, "OrderCreated", body, NULL);
	mq_close(&m);
	/* Each delivery handed back (no worker runs): past the limit the
	 * broker dead-letters it. */
	cr_assert_eq(mq_open(&m, &c->amqp, 0, "itest-dlq-poison"), ST_OK);
	while (itest_queue_depth(c->dlq) == 0 && rounds++ < 50) {
		struct mq_delivery d;
		if (mq_get(m, c->queue, &d) != ST_OK) {
			usleep(50 * 1000); /* a bounded poll: the requeued message is back */
			continue;
		}
		cr_assert_eq(mq_reject(m, d.tag, true), ST_OK);
		mq_delivery_release(m, &d);
	}
	mq_close(&m);
	cr_assert_eq(itest_wait_depth(c->dlq, 1, 10), 1, "the broker did not dead-letter it");
	doc = list_json(NULL, NULL);
	e = json_array_get(json_object_get(doc, "dead_letters"), 0);
	cr_assert_not_null(e);
	cr_expect_str_eq(json_string_value(json_object_get(e, "message_id")), "poison-1");
	cr_expect_str_eq(json_string_value(json_object_get(e, "reason")), "delivery-limit");
	cr_expect_str_eq(json_string_value(json_object_get(e, "detail")), "dead-lettered by the broker from orders.inbox");
	cr_expect(json_is_string(json_object_get(e, "dead_lettered_at")), "the x-death time");
	cr_expect_gt(json_integer_value(json_object_get(e, "deliveries")), c->delivery_limit);
	json_decref(doc);
	{
		char log[256];

		itest_log_path(log, sizeof log, "dlq-list");
		cr_expect(!itest_log_has(log, "counts deliveries"), "a classic DLQ taken for a quorum one");
	}

	w = itest_worker_logged(1, NULL, dlq_worker_log(0));
	{
		const char *a[] = { "--reason", "delivery-limit", NULL };
		st = replay(a, NULL);
	}
	cr_assert(exited_0(st), "%s", out);
	cr_expect(strstr(out, "replayed 1") != NULL, "%s", out);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM orders WHERE id = 'po-1'", 1, 30), 1);
	itest_wait_queue_empty(c->queue, 30);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM order_events"), 1);
	cr_expect_eq(itest_queue_depth(c->dlq), 0);
	itest_stop(w, SIGTERM, 30);
}

/* --since chooses by when a message was dead-lettered: the worker's
 * x-inbox-dead-lettered-at; one that does not say is not known to be
 * recent. */
Test(dlq, list_since_chooses_by_the_dead_letter_time)
{
	char now[32], body[256];
	time_t t = time(NULL);
	struct tm tm;
	struct mq *m;
	json_t *doc;
	struct mq_header recent[2] = { { "x-inbox-reason", "malformed-json" }, { "x-inbox-dead-lettered-at", now } };
	struct mq_header bare[1] = { { "x-inbox-reason", "malformed-json" } };
	struct mq_message msg = { .routing_key = "order.X", .body = body, .mandatory = true };

	itest_fresh();
	cr_assert_not_null(gmtime_r(&t, &tm));
	cr_assert_neq(strftime(now, sizeof now, "%Y-%m-%dT%H:%M:%SZ", &tm), 0);
	snprintf(body, sizeof body, "{}");
	msg.exchange = itest_cfg()->dlx;
	msg.len = strlen(body);
	m = itest_mq();
	put_dead(m, "old-1", "malformed-json", "x", "order.X"); /* dead-lettered in 2020 */
	msg.message_id = "recent-1";
	msg.headers = recent;
	msg.nheaders = 2;
	cr_assert_eq(mq_publish_confirmed(m, &msg, 10000), ST_OK);
	msg.message_id = "unknown-1";
	msg.headers = bare;
	msg.nheaders = 1;
	cr_assert_eq(mq_publish_confirmed(m, &msg, 10000), ST_OK);
	mq_close(&m);
	{
		const char *f[] = { "--since", "1h", NULL };
		const char *want[] = { "recent-1" };
		doc = list_json(f, NULL);
		expect_ids(doc, want, 1);
		json_decref(doc);
	}
	{
		const char *want[] = { "old-1", "recent-1", "unknown-1" };
		doc = list_json(NULL, NULL);
		expect_ids(doc, want, 3);
		cr_expect(json_is_null(json_object_get(json_array_get(json_object_get(doc, "dead_letters"), 2),
		                                       "dead_lettered_at")));
		json_decref(doc);
	}
}

/* One dead letter whose copy the broker cannot route (its routing key is
 * bound to nothing on the inbox exchange) is reported and left where it
 * is, and the walk goes on: the valid dead letters behind it are
 * replayed, run after run.  The exit status says something was left
 * unreplayed for a broker reason (1). */
Test(dlq, an_unroutable_copy_is_skipped_and_the_walk_goes_on)
{
	const char *dlq;
	char sig[8192];
	struct mq *m;
	int st;

	itest_fresh();
	dlq = itest_cfg()->dlq;
	m = itest_mq();
	put_dead(m, "ur-1", "hold-expired", "uo-1", "order.PaymentAuthorized");
	put_dead(m, "ur-2", "hold-expired", "uo-2", "nowhere.PaymentAuthorized"); /* routes nowhere */
	put_dead(m, "ur-3", "hold-expired", "uo-3", "order.PaymentAuthorized");
	mq_close(&m);
	cr_assert_eq(itest_wait_depth(dlq, 3, 10), 3);

	st = replay(NULL, NULL);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "a skipped dead letter makes the exit 1: %d (%s)", st, out);
	cr_expect(strstr(out, "replayed 2") != NULL, "the walk went on past the unroutable one: %s", out);
	cr_expect(strstr(out, "unroutable 1") != NULL, "the summary counts it: %s", out);
	cr_expect(strstr(out, "ur-2") != NULL, "the skipped one is named: %s", out);
	cr_assert_eq(itest_wait_depth(itest_cfg()->queue, 2, 10), 2, "two copies reached the inbox");
	list_signature(sig, sizeof sig);
	cr_assert_str_eq(sig, "ur-2:hold-expired:0 ", "only the unroutable one is left, unchanged");

	/* The next run stops at nothing either: it reports the same one. */
	st = replay(NULL, NULL);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "%d (%s)", st, out);
	cr_expect(strstr(out, "replayed 0") != NULL && strstr(out, "unroutable 1") != NULL, "%s", out);
	cr_assert_eq(itest_queue_depth(dlq), 1);
	cr_assert_eq(itest_queue_depth(itest_cfg()->queue), 2, "nothing sent twice");
}

/* Replay's verdict on a key sees what the same run did to it before.
 * Three dead letters of one key and one payload, the inbox's row
 * dead-lettered (hold-expired) and the order there now: the first one
 * reopens the key and is replayed; the two behind it would only be
 * duplicates of that copy, and are said to be, not "the inbox has no
 * record of it" (which is what the reopened key looks like in the
 * database).  A dry run says the same. */
Test(dlq, a_second_dead_letter_of_a_key_sees_the_runs_own_reopen)
{
	const char *wenv[] = { "INBOX_HOLD_TTL=1s", NULL };
	const char *dlq;
	char body[512];
	struct mq *m;
	pid_t w;
	int st;

	itest_fresh();
	dlq = itest_cfg()->dlq;
	w = itest_worker_logged(1, wenv, dlq_worker_log(0));
	m = itest_mq();
	/* put_dead's body, through the worker: held, then dead-lettered. */
	snprintf(body, sizeof body,
	         "{\"message_id\":\"%s\",\"type\":\"PaymentAuthorized\",\"order_id\":\"%s\",\"data\":{\"amount_cents\":100}}",
	         "twice-1", "to-1");
	itest_publish(m, "PaymentAuthorized", body, "twice-1");
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages WHERE reason = 'hold-expired'", 1, 60), 1);
	cr_assert_eq(itest_wait_depth(dlq, 1, 60), 1);
	put_dead(m, "twice-1", "hold-expired", "to-1", "order.PaymentAuthorized");
	put_dead(m, "twice-1", "hold-expired", "to-1", "order.PaymentAuthorized");
	cr_assert_eq(itest_wait_depth(dlq, 3, 10), 3);
	itest_event(body, sizeof body, "create-to-1", "OrderCreated", "to-1");
	itest_publish(m, "OrderCreated", body, NULL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM orders WHERE id = 'to-1'", 1, 60), 1);
	/* The copies must not be taken before the walk judged them all. */
	itest_stop(w, SIGTERM, 30);

	{
		const char *a[] = { "--dry-run", NULL };
		st = replay(a, NULL);
	}
	cr_assert(exited_0(st), "%d: %s", st, out);
	cr_expect(strstr(out, "no record") == NULL, "a dry run must see its own would-be reopen: %s", out);
	cr_expect(strstr(out, "would replay 3 (keys reopened 1, duplicates 2)") != NULL, "%s", out);

	st = replay(NULL, NULL);
	cr_assert(exited_0(st), "%d: %s", st, out);
	cr_expect(strstr(out, "no record") == NULL, "the second and third saw the run's own reopen: %s", out);
	cr_expect(strstr(out, "replayed 3 (keys reopened 1, duplicates 2)") != NULL, "%s", out);
	cr_assert_eq(itest_queue_depth(dlq), 0);

	w = itest_worker_logged(1, NULL, dlq_worker_log(1));
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM orders WHERE id = 'to-1' AND status = 'Paid'", 1, 60), 1);
	itest_wait_queue_empty(itest_cfg()->queue, 60);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM order_events WHERE type = 'PaymentAuthorized'"), 1);
	mq_close(&m);
	itest_stop(w, SIGTERM, 30);
}

/* What could give queue a delivery limit, as rabbitmqctl prints it: its
 * line of "list_queues name arguments policy", then every policy and
 * operator policy of the vhost (3.10 lists neither a queue's operator
 * policy nor its effective_policy_definition), into buf. */
static void queue_definition(const char *queue, char *buf, size_t cap)
{
	char root[4096], cmd[3 * 4096 + 400], line[2048];
	size_t len = 0;
	bool listed = false;
	FILE *p;

	buf[0] = '\0';
	itest_source("scripts/stack", root, sizeof root);
	snprintf(cmd, sizeof cmd,
	         "%s ctl -q list_queues -p inbox name arguments policy 2>/dev/null; "
	         "%s ctl -q list_policies -p inbox 2>/dev/null; %s ctl -q list_operator_policies -p inbox 2>/dev/null",
	         root, root, root);
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	while (fgets(line, sizeof line, p) != NULL) {
		bool mine = strncmp(line, queue, strlen(queue)) == 0 &&
		            (line[strlen(queue)] == '\t' || line[strlen(queue)] == ' ');
		bool queue_line = strncmp(line, "orders.", 7) == 0;

		listed = listed || mine;
		if ((mine || !queue_line) && len + strlen(line) < cap) {
			memcpy(buf + len, line, strlen(line) + 1);
			len += strlen(line);
		}
	}
	pclose(p);
	cr_assert(listed, "rabbitmqctl does not list %s", queue);
}

/* Reading a quorum DLQ that the worker declared (INBOX_DLQ_TYPE=quorum)
 * never brings a dead letter closer to removal.  RabbitMQ 3.10 counts a
 * delivery per read (nothing avoids it: every message handed back is
 * counted), so the proof is that nothing can remove one for it: 25 lists,
 * more than 4.0's default limit of 20, leave every dead letter in place and
 * in order, and the queue has no delivery limit from its arguments or a
 * policy.  On RabbitMQ 4 the worker declares it with x-delivery-limit -1
 * (mq_browsed_queue_limit; the unit suite pins the choice). */
Test(dlq, reading_a_quorum_dlq_never_drops_a_dead_letter)
{
	enum { N = 5, READS = 25 };
	const char *q = "orders.test.dlq.q25";
	const char *env[] = { "INBOX_DLQ=orders.test.dlq.q25", "INBOX_DLQ_TYPE=quorum", NULL };
	struct itest_dead dead[N + 2];
	char id[32], def[2048];
	int64_t count;
	struct mq *m;
	pid_t w;

	itest_fresh();
	m = itest_mq();
	(void)mq_queue_delete(m, q);
	cr_assert_eq(mq_queue_unbind(m, itest_cfg()->dlq, itest_cfg()->dlx, "#"), ST_OK, "%s", mq_errmsg(m));
	mq_close(&m);
	w = itest_worker_logged(1, env, dlq_worker_log(0));
	itest_wait_log(dlq_worker_log(0), "consuming", 60);
	m = itest_mq();
	for (int i = 0; i < N; i++) {
		snprintf(id, sizeof id, "q25-%d", i);
		put_dead(m, id, "hold-expired", "qo", "order.PaymentAuthorized");
	}
	mq_close(&m);
	cr_assert_eq(itest_wait_depth(q, N, 10), N);
	for (int i = 0; i < READS; i++) {
		json_t *doc = list_json(NULL, env + 0);
		cr_assert_eq(json_integer_value(json_object_get(doc, "read")), N, "read %d", i + 1);
		json_decref(doc);
		cr_assert_eq(itest_queue_depth(q), N, "read %d took a dead letter away", i + 1);
	}
	queue_definition(q, def, sizeof def);
	cr_expect(strstr(def, "x-queue-type") != NULL && strstr(def, "quorum") != NULL, "%s", def);
	cr_expect(strstr(def, "delivery-limit") == NULL, "RabbitMQ 3.x: no delivery limit may apply: %s", def);
	itest_stop(w, SIGTERM, 30);
	cr_assert_eq(drain_counted(q, dead, N + 2, &count), N, "every dead letter is still there");
	for (int i = 0; i < N; i++) {
		snprintf(id, sizeof id, "q25-%d", i);
		cr_expect_str_eq(dead[i].message_id, id, "in its place");
	}
	cr_expect_eq(count, READS, "3.10 counts each read (the reason 4.x needs -1)");
	m = itest_mq();
	(void)mq_queue_delete(m, q);
	mq_close(&m);
}

/* On RabbitMQ 4 a browsed quorum queue that an older build declared
 * without x-delivery-limit -1 would refuse the new declaration (406,
 * inequivalent).  The worker asks on a channel of its own, keeps the
 * queue as it is, says what to set, and runs: taken here with the 4.x
 * path forced (mq-broker-4) against such a queue on this 3.10 broker. */
Test(dlq, an_existing_quorum_dlq_without_the_limit_is_kept_with_a_warning)
{
	const char *q = "orders.test.dlq.old";
	const char *env[] = { "INBOX_DLQ=orders.test.dlq.old", "INBOX_DLQ_TYPE=quorum", "INBOX_FAULT=mq-broker-4", NULL };
	char body[512];
	struct mq *m;
	pid_t w;

	itest_fresh();
	m = itest_mq();
	(void)mq_queue_delete(m, q);
	mq_close(&m);
	declare_quorum_dlq(q); /* without the argument, as builds before did */
	w = itest_worker_logged(1, env, dlq_worker_log(0));
	itest_wait_log(dlq_worker_log(0), "declared without x-delivery-limit -1", 60);
	m = itest_mq();
	itest_event(body, sizeof body, "after-probe-1", "OrderCreated", "ap-1");
	itest_publish(m, "OrderCreated", body, NULL);
	mq_close(&m);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM orders WHERE id = 'ap-1'", 1, 60), 1,
	             "the worker runs on after the refused probe");
	itest_stop_ok(w);
	m = itest_mq();
	(void)mq_queue_delete(m, q);
	mq_close(&m);
}

/* The headers of one dead letter, as the broker delivered it: whether each
 * of ours is there. */
static const char *const dead_letter_headers[] = { "x-inbox-reason", "x-inbox-detail", "x-inbox-dead-lettered-at",
	                                           "x-inbox-delivery-count" };
enum { DEAD_LETTER_HEADERS = sizeof dead_letter_headers / sizeof dead_letter_headers[0] };

struct dead_headers {
	char message_id[64];
	char value[DEAD_LETTER_HEADERS][256];
	bool has[DEAD_LETTER_HEADERS];
};

static void drain_headers_one(const struct mq_delivery *d, int n, void *arg)
{
	struct dead_headers *e = &((struct dead_headers *)arg)[n];

	memset(e, 0, sizeof *e);
	snprintf(e->message_id, sizeof e->message_id, "%.*s", (int)d->props.message_id_len,
	         d->props.message_id != NULL ? d->props.message_id : "");
	for (int h = 0; h < DEAD_LETTER_HEADERS; h++)
		e->has[h] = mq_delivery_header(d, dead_letter_headers[h], e->value[h], sizeof e->value[h]) == ST_OK;
}

/* One dead-letter format whichever path wrote it (issue 24.3): the copy
 * the worker publishes itself (a body that is not JSON) and the copy it
 * writes into the outbox in the event's transaction (an invalid
 * transition) carry the same headers, and `dlq list` reads the same
 * fields from both — the delivery count included. */
Test(dlq, the_direct_and_the_outbox_dead_letter_carry_the_same_headers)
{
	struct dead_headers got[4];
	char body[512];
	struct mq *m;
	json_t *doc, *e;
	size_t i;
	pid_t w;
	int n;

	itest_fresh();
	w = itest_worker_logged(1, NULL, dlq_worker_log(0));
	m = itest_mq();
	itest_publish(m, "OrderCreated", "{not json", "bad-1");
	itest_event(body, sizeof body, "hdr-1", "OrderCreated", "o-hdr");
	itest_publish(m, "OrderCreated", body, NULL);
	itest_event(body, sizeof body, "hdr-2", "OrderCancelled", "o-hdr");
	itest_publish(m, "OrderCancelled", body, NULL);
	itest_event(body, sizeof body, "hdr-3", "ShipmentCreated", "o-hdr"); /* on a cancelled order */
	itest_publish(m, "ShipmentCreated", body, NULL);
	mq_close(&m);
	cr_assert_eq(itest_wait_depth(itest_cfg()->dlq, 2, 60), 2, "both dead letters in the DLQ");
	itest_stop_ok(w);

	doc = list_json(NULL, NULL);
	cr_assert_eq(json_array_size(json_object_get(doc, "dead_letters")), 2);
	json_array_foreach(json_object_get(doc, "dead_letters"), i, e) {
		const char *id = json_string_value(json_object_get(e, "message_id"));
		cr_expect(json_is_string(json_object_get(e, "dead_lettered_at")), "%s: no dead-letter time", id);
		cr_expect_eq(json_integer_value(json_object_get(e, "deliveries")), 1,
		             "%s: deliveries %s, want 1 (it was delivered once)", id,
		             json_is_null(json_object_get(e, "deliveries")) ? "unknown" : "other");
	}
	json_decref(doc);

	n = drain_each(itest_cfg()->dlq, 4, drain_headers_one, got);
	cr_assert_eq(n, 2);
	for (int k = 0; k < n; k++)
		for (int h = 0; h < DEAD_LETTER_HEADERS; h++)
			cr_expect(got[k].has[h], "%s has no %s", got[k].message_id, dead_letter_headers[h]);
	cr_expect_str_eq(got[0].value[3], got[1].value[3], "the delivery counts differ");
}

/* ---- enveloped dead letters (issue 26) ------------------------------------ */

/* Publish a structured-mode CloudEvent to the orders exchange. */
static void publish_ce(struct mq *m, const char *id, const char *type, const char *subject, const char *data)
{
	char body[1024];
	struct mq_message msg = {
		.exchange = itest_cfg()->exchange, .routing_key = "order.ce", .body = body,
		.props_json = "{\"content_type\":\"application/cloudevents+json\"}",
	};

	snprintf(body, sizeof body,
	         "{\"specversion\":\"1.0\",\"id\":\"%s\",\"source\":\"https://payments.example.com/v1\",\"type\":\"%s\","
	         "\"subject\":\"%s\",\"time\":\"2026-12-02T00:00:00Z\",\"data\":%s}",
	         id, type, subject, data);
	msg.len = strlen(body);
	cr_assert_eq(mq_publish_confirmed(m, &msg, 10000), ST_OK, "%s", mq_errmsg(m));
}

/* A CloudEvent the worker could not map (a type the map lacked) is listed
 * by its own id, source and order (the CloudEvents id and subject, not
 * "-"), under the rules of the configuration `dlq` runs with: with the
 * map fixed it is a PaymentAuthorized the inbox never recorded, and replay
 * applies it once. */
Test(dlq, an_enveloped_dead_letter_is_listed_by_its_own_key_and_replayed)
{
	static const char *const old_env[] = {
		"INBOX_ENVELOPE=auto", "INBOX_TYPE_MAP=com.example.order.created=OrderCreated", NULL
	};
	static const char *const new_env[] = {
		"INBOX_ENVELOPE=auto",
		"INBOX_TYPE_MAP=com.example.order.created=OrderCreated,com.example.payment.captured=PaymentAuthorized", NULL
	};
	const struct cfg *c;
	struct mq *m;
	json_t *doc, *e;
	char status[32];
	pid_t w;
	int st;

	itest_fresh();
	c = itest_cfg();
	w = itest_worker_logged(1, old_env, dlq_worker_log(0));
	m = itest_mq();
	publish_ce(m, "ce-dl-c", "com.example.order.created", "o-ce-dl", "{}");
	publish_ce(m, "ce-dl-p", "com.example.payment.captured", "o-ce-dl", "{\"amount_cents\":4200}");
	mq_close(&m);
	cr_assert_eq(itest_wait_depth(c->dlq, 1, 60), 1, "the unmapped payment is dead-lettered");
	itest_wait_queue_empty(c->queue, 60);
	itest_stop(w, SIGTERM, 30);

	/* Under the old map it does not parse: still listed by its key. */
	doc = list_json(NULL, old_env);
	e = json_array_get(json_object_get(doc, "dead_letters"), 0);
	cr_assert_not_null(e);
	cr_expect_str_eq(json_string_value(json_object_get(e, "message_id")), "ce-dl-p");
	cr_expect_str_eq(json_string_value(json_object_get(e, "source")), "https://payments.example.com/v1");
	cr_expect_str_eq(json_string_value(json_object_get(e, "order_id")), "o-ce-dl");
	cr_expect_str_eq(json_string_value(json_object_get(e, "reason")), "unknown-type");
	json_decref(doc);
	/* Under the fixed map it is our event. */
	doc = list_json(NULL, new_env);
	e = json_array_get(json_object_get(doc, "dead_letters"), 0);
	cr_assert_not_null(e);
	cr_expect_str_eq(json_string_value(json_object_get(e, "message_id")), "ce-dl-p");
	cr_expect_str_eq(json_string_value(json_object_get(e, "type")), "PaymentAuthorized");
	cr_expect_str_eq(json_string_value(json_object_get(e, "order_id")), "o-ce-dl");
	json_decref(doc);

	w = itest_worker_logged(1, new_env, dlq_worker_log(1));
	{
		const char *a[] = { "--reason", "unknown-type", NULL };
		st = replay(a, new_env);
	}
	cr_assert(exited_0(st), "%s", out);
	cr_expect(strstr(out, "replayed 1") != NULL, "%s", out);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events WHERE order_id = 'o-ce-dl'", 2, 60), 2);
	itest_wait_queue_empty(c->queue, 30);
	itest_stop(w, SIGTERM, 30);
	cr_assert(itest_str1("SELECT status FROM orders WHERE id = ?", "o-ce-dl", status, sizeof status));
	cr_expect_str_eq(status, "Paid");
	cr_expect_eq(itest_queue_depth(c->dlq), 0);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE message_id = 'ce-dl-p'"
	                       " AND source = 'https://payments.example.com/v1'"),
	             1);
}

/* ---- a lifecycle of the user's own (issue 27) ----------------------------- */

static void publish_shipment(struct mq *m, const char *id, const char *type, const char *data)
{
	char body[512];

	snprintf(body, sizeof body,
	         "{\"message_id\":\"%s\",\"source\":\"carrier\",\"type\":\"%s\",\"shipment_id\":\"s-dl\"%s%s%s}", id,
	         type, data != NULL ? ",\"data\":{" : "", data != NULL ? data : "", data != NULL ? "}" : "");
	itest_publish(m, type, body, id);
}

/* The tools read a dead letter by the lifecycle the worker runs
 * (INBOX_LIFECYCLE): a shipment lost after it was delivered is listed by
 * its shipment and type, shown with its shipment row, and judged by the
 * shipment's state (still impossible), not as a body that fails the
 * order's checks. */
Test(dlq, a_lifecycle_s_dead_letter_is_read_by_its_definition, .timeout = 600)
{
	char env[4200], path[4096];
	const char *lenv[] = { env, NULL };
	const char *margs[] = { "migrate", NULL };
	struct db *d;
	struct mq *m;
	json_t *doc, *e;
	pid_t w;
	int st;

	itest_fresh();
	d = itest_db();
	cr_assert_eq(db_exec(d, "DROP TABLE IF EXISTS shipments, shipment_events, shipment_locks"), ST_OK, "%s",
	             db_errmsg(d));
	snprintf(env, sizeof env, "INBOX_LIFECYCLE=%s", itest_source("lifecycles/shipment.json", path, sizeof path));
	st = itest_wait_exit(itest_spawn(margs, lenv), 120);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "migrate with the shipment lifecycle (status %d)", st);
	w = itest_worker_logged(1, lenv, dlq_worker_log(0));
	m = itest_mq();
	publish_shipment(m, "sdl-1", "ShipmentLabelled", "\"tracking_number\":\"TRK-DL\"");
	publish_shipment(m, "sdl-2", "ParcelPickedUp", NULL);
	publish_shipment(m, "sdl-3", "ParcelInTransit", NULL);
	publish_shipment(m, "sdl-4", "ParcelDelivered", NULL);
	publish_shipment(m, "sdl-5", "ParcelLost", NULL);
	mq_close(&m);
	cr_assert_eq(itest_wait_depth(itest_cfg()->dlq, 1, 120), 1, "the lost-after-delivered is dead-lettered");
	itest_wait_queue_empty(itest_cfg()->queue, 60);
	itest_stop(w, SIGTERM, 30);

	doc = list_json(NULL, lenv);
	e = json_array_get(json_object_get(doc, "dead_letters"), 0);
	cr_assert_not_null(e);
	cr_expect_str_eq(json_string_value(json_object_get(e, "message_id")), "sdl-5");
	cr_expect_str_eq(json_string_value(json_object_get(e, "order_id")), "s-dl", "the shipment it names");
	cr_expect_str_eq(json_string_value(json_object_get(e, "reason")), "invalid-transition");
	json_decref(doc);

	{
		const char *a[] = { "show", "sdl-5", NULL };

		st = run_dlq(a, lenv, out, sizeof out, "dlq-show");
	}
	cr_assert(exited_0(st), "dlq show exit status %d: %s", st, out);
	cr_expect(strstr(out, "parse:        ok") != NULL, "read by the shipment definition: %s", out);
	cr_expect(strstr(out, "shipment row: s-dl status Delivered, version 4") != NULL, "%s", out);
	cr_expect(strstr(out, "tracking_number TRK-DL") != NULL, "the columns its events set: %s", out);
	{
		const char *a[] = { "--reason", "invalid-transition", "--dry-run", NULL };

		st = replay(a, lenv);
	}
	cr_assert(exited_0(st), "%s", out);
	cr_expect(strstr(out, "still an impossible transition (shipment s-dl: Delivered)") != NULL, "%s", out);
	cr_expect(strstr(out, "still-malformed") == NULL, "%s", out);
	cr_expect_eq(itest_queue_depth(itest_cfg()->dlq), 1, "a dry run leaves it");
}
