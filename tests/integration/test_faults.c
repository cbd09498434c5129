/*
 * test_faults.c - failures at the worst moments: a fault between the claim
 * and the commit, a SIGKILL between the commit and the ack, MariaDB stopped
 * while messages flow, RabbitMQ restarted under the pool, SIGTERM under
 * load.  The build must have -Dfault_hooks=true (scripts/test sets it).
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"
#include "status.h"

#define WAIT_S 180

/* Start scripts/stack with what in the background: the server comes back
 * while the test goes on. */
static pid_t stack_async(const char *what)
{
	char root[4096];
	const char *script = itest_source("scripts/stack", root, sizeof root);
	pid_t pid = fork();

	cr_assert_neq(pid, -1);
	if (pid == 0) {
		if (dup2(2, 1) < 0)
			_exit(126);
		execl(script, script, what, (char *)NULL);
		_exit(127);
	}
	return pid;
}

/* Whatever a test that stops a server did, pass or fail, the next test
 * finds both servers up and taking connections as the accounts the tests
 * and the workers use (start-* does nothing when the server is up). */
static void servers_back(void)
{
	itest_stack("start-db");
	itest_stack("start-mq");
	itest_wait_db_back();
	itest_wait_mq_back();
}

/* The helpers a test uses after it restarted a server must wait until
 * that server takes connections again, however slow a loaded machine
 * makes it, not fail at their first attempt (issue 22, item 14: "cannot
 * connect to the database: database connection lost" at itest.c).  Here
 * the servers come back while the helpers are already asking. */
Test(faults, the_helpers_wait_for_a_server_that_is_coming_back, .timeout = 600, .fini = servers_back)
{
	struct mq *m;
	pid_t p;
	int st;

	itest_fresh();
	itest_stack("stop-db");
	p = stack_async("start-db");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages"), 0);
	st = itest_wait_exit(p, 300);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "scripts/stack start-db failed");
	itest_wait_db_back();

	itest_stack("stop-mq");
	p = stack_async("start-mq");
	m = itest_mq();
	mq_close(&m);
	st = itest_wait_exit(p, 300);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "scripts/stack start-mq failed");
	itest_wait_mq_back();
}

Test(faults, failure_after_claim_before_commit_leaves_message_eligible)
{
	char logf[256], body[512];
	struct mq *m;
	pid_t w;
	int st;

	itest_fresh();
	snprintf(logf, sizeof logf, "/tmp/inbox-itest-%d-fault.log", (int)getpid());
	w = itest_worker_logged(1, (const char *[]){ "INBOX_FAULT=before-commit", "INBOX_FAULT_COUNT=1", NULL }, logf);
	m = itest_mq();
	itest_event(body, sizeof body, "f-1", "OrderCreated", "o-f");
	itest_publish(m, "OrderCreated", body, NULL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", 1, WAIT_S), 1);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	st = itest_stop(w, SIGTERM, 60);
	mq_close(&m);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	cr_assert(itest_log_has(logf, "\"fault injected\" point=before-commit"), "the fault must have fired");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages"), 1);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"), 1, "applied once after the redelivery");
	cr_assert_eq(itest_log_sum(logf, "stopped", "duplicates"), 0, "the rolled-back claim left no trace");
}

Test(faults, sigkill_after_commit_before_ack_redelivers_as_duplicate)
{
	char logf[256], body[512];
	struct mq *m;
	pid_t w;
	int st;

	itest_fresh();
	snprintf(logf, sizeof logf, "/tmp/inbox-itest-%d-kill.log", (int)getpid());
	w = itest_worker(1, (const char *[]){ "INBOX_FAULT=after-commit", NULL });
	m = itest_mq();
	itest_event(body, sizeof body, "k-1", "OrderCreated", "o-k");
	itest_publish(m, "OrderCreated", body, NULL);
	st = itest_wait_exit(w, WAIT_S);
	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the worker must die by SIGKILL after the commit");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"), 1, "the commit happened");

	w = itest_worker_logged(1, NULL, logf);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages", 1, WAIT_S), 1);
	st = itest_stop(w, SIGTERM, 60);
	mq_close(&m);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	cr_assert_eq(itest_log_sum(logf, "stopped", "duplicates"), 1, "the redelivery is a duplicate");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"), 1);
	cr_assert_eq(itest_int1("SELECT version FROM orders WHERE id = ?", "o-k"), 1);
}

Test(faults, database_outage_dead_letters_nothing, .timeout = 900, .fini = servers_back)
{
	enum { N = 400 };
	char logf[256];
	struct mq *m;
	pid_t w;

	itest_fresh();
	itest_log_path(logf, sizeof logf, "db-outage");
	w = itest_worker_logged(4, NULL, logf);
	m = itest_mq();
	itest_publish_orders(m, "db", 0, N / 2);
	itest_stack("stop-db");
	itest_publish_orders(m, "db", N / 2, N);
	/* The outage itself, until messages have flowed while the database is
	 * down: the worker saw it, and took every message published since
	 * (they wait, unacked, in its threads). */
	itest_wait_log(logf, "database unavailable", WAIT_S);
	cr_assert_eq(itest_wait_depth(itest_cfg()->queue, 0, WAIT_S), 0, "the worker must have taken the messages");
	itest_stack("start-db");
	itest_wait_db_back();
	itest_assert_each_applied_once("db", N, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
}

Test(faults, broker_restart_pool_reconnects_and_finishes, .timeout = 900, .fini = servers_back)
{
	enum { N = 400 };
	struct mq *m;
	pid_t w;

	itest_fresh();
	w = itest_worker(4, NULL);
	m = itest_mq();
	itest_publish_orders(m, "mq", 0, N / 2);
	mq_close(&m);
	itest_stack("restart-mq");
	itest_wait_mq_back();
	m = itest_mq();
	itest_publish_orders(m, "mq", N / 2, N);
	itest_assert_each_applied_once("mq", N, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
}

Test(faults, sigterm_under_load_loses_nothing, .timeout = 600)
{
	enum { N = 3000 };
	struct mq *m;
	pid_t w;
	int st;
	int64_t done;
	uint32_t ready;

	itest_fresh();
	m = itest_mq();
	itest_publish_orders(m, "term", 0, N);
	w = itest_worker(4, NULL);
	/* Stop it in the middle of the backlog. */
	itest_wait_int("SELECT COUNT(*) >= 300 FROM processed_messages", 1, WAIT_S);
	st = itest_stop(w, SIGTERM, 60);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "SIGTERM must exit 0");
	done = itest_int("SELECT COUNT(*) FROM processed_messages");
	ready = itest_queue_depth(itest_cfg()->queue);
	cr_assert_eq(done + (int64_t)ready, N,
	             "every message is either applied and acked or still ready (%lld applied, %u ready)",
	             (long long)done, ready);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"), done);
	mq_close(&m);
}

/* A message that kills every worker that takes it must not loop forever:
 * the quorum queue's delivery limit sends it to the DLQ. */
Test(faults, poison_message_ends_in_the_dlq_by_delivery_limit, .timeout = 600)
{
	char body[512];
	struct itest_dead dead[2];
	struct mq *m;
	const char *env[] = { "INBOX_FAULT=crash-before-commit", "INBOX_FAULT_COUNT=1000", NULL };
	int deaths = 0, got = 0;
	pid_t w;

	/* Before the configuration is loaded: the test and its workers
	 * declare the queue alike. */
	cr_assert_eq(setenv("INBOX_DELIVERY_LIMIT", "2", 1), 0);
	itest_fresh();
	m = itest_mq();
	itest_event(body, sizeof body, "poison-1", "OrderCreated", "o-p");
	itest_publish(m, "OrderCreated", body, "poison-1");
	while (got == 0 && deaths < 6) {
		int st;
		w = itest_worker(1, env);
		st = itest_wait_exit(w, 120);
		cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the poison kills the worker");
		deaths++;
		got = itest_drain(itest_cfg()->dlq, dead, 2, 0, 2);
	}
	if (got == 0) /* the last death may still be settling in the broker */
		got = itest_dlq_drain(dead, 2, 1, 60);
	mq_close(&m);
	cr_assert_eq(got, 1, "dead-lettered by the broker after %d deaths", deaths);
	cr_assert_str_eq(dead[0].message_id, "poison-1");
	cr_assert_leq(deaths, 3, "delivery limit 2: at most three deliveries");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages"), 0, "never committed");
}

/* A worker that cannot finish the message in hand (its transaction waits on
 * a row lock held elsewhere) stops on the second signal at once; the
 * message, never acked, is still in the queue. */
Test(faults, second_signal_exits_at_once_and_keeps_the_message, .timeout = 300)
{
	char body[512], logf[256];
	struct db *holder = NULL;
	struct mq *m;
	pid_t w;
	int st;

	itest_fresh();
	/* Another transaction holds the order's lock row. */
	holder = itest_hold_order("o-stuck");
	itest_log_path(logf, sizeof logf, "second-signal");
	w = itest_worker_logged(1, NULL, logf);
	m = itest_mq();
	itest_event(body, sizeof body, "stuck-1", "OrderCreated", "o-stuck");
	itest_publish(m, "OrderCreated", body, NULL);
	/* Once delivered, the message is in hand: its transaction waits on
	 * the lock, and a graceful stop would have to wait with it. */
	cr_assert_eq(itest_wait_depth(itest_cfg()->queue, 0, 60), 0, "the worker must have taken the message");
	cr_assert_eq(kill(w, SIGTERM), 0);
	/* The first signal taken (a graceful stop begun), then the second. */
	itest_wait_log(logf, "stopping: finishing messages in hand", 30);
	st = itest_stop(w, SIGTERM, 20); /* well inside the 50 s lock wait */
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "the second signal exits at once (status %d)", st);
	db_rollback(holder);
	db_close(&holder);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages"), 0, "nothing committed");
	cr_assert_eq(itest_wait_depth(itest_cfg()->queue, 1, 10), 1, "the unacked message is back in the queue");
	mq_close(&m);
}

/* A database outage longer than several heartbeat intervals, while the
 * thread holds a message and more are prefetched: the consumer connection
 * must stay up (its heartbeats serviced while the thread waits for the
 * database), so nothing is returned to the queue, nothing is redelivered
 * and no delivery count goes up; each message is applied once. */
Test(faults, database_outage_keeps_the_broker_connection_alive, .timeout = 600, .fini = servers_back)
{
	enum { N = 20 };
	char logf[256], body[512];
	struct mq *m;
	pid_t w;
	int st;

	/* The test declares the topology too: with the worker's arguments. */
	cr_assert_eq(setenv("INBOX_DELIVERY_LIMIT", "1", 1), 0);
	itest_fresh();
	snprintf(logf, sizeof logf, "/tmp/inbox-itest-%d-heartbeat.log", (int)getpid());
	w = itest_worker_logged(1, (const char *[]){ "INBOX_HEARTBEAT=2", NULL }, logf);
	m = itest_mq();
	itest_event(body, sizeof body, "hb-first", "OrderCreated", "o-hb-first");
	itest_publish(m, "OrderCreated", body, NULL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages", 1, WAIT_S), 1);
	itest_stack("stop-db");
	itest_publish_orders(m, "hb", 0, N);
	cr_assert_eq(itest_wait_depth(itest_cfg()->queue, 0, 60), 0, "the worker must have taken the messages");
	/* The outage itself: five heartbeat intervals from the moment the
	 * worker saw it.  Not a wait for a condition: the duration is the
	 * fault (the broker drops a connection silent for two intervals), so
	 * it is a fixed time, counted from the observed outage. */
	itest_wait_log(logf, "database unavailable", 60);
	sleep(10);
	itest_stack("start-db");
	itest_wait_db_back();
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages", N + 1, WAIT_S), N + 1);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	st = itest_stop(w, SIGTERM, 60);
	mq_close(&m);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"), N + 1, "each applied once");
	cr_assert(itest_log_has(logf, "database unavailable"), "the outage must have been seen");
	cr_assert(!itest_log_has(logf, "broker connection reset"), "the consumer connection was dropped");
	cr_assert_eq(itest_log_count(logf, " consuming worker="), 1, "one consume, never a second");
	cr_assert_eq(itest_log_sum(logf, "stopped", "duplicates"), 0, "nothing came twice");
	cr_assert_eq(itest_log_sum(logf, "stopped", "redelivered"), 0, "no delivery was returned to the queue");
	cr_assert_eq(itest_queue_depth(itest_cfg()->dlq), 0, "no delivery count reached the limit");
}

static void set_max_queues(int n)
{
	char cmd[128];

	if (n < 0)
		snprintf(cmd, sizeof cmd, "ctl -q clear_vhost_limits -p inbox");
	else
		snprintf(cmd, sizeof cmd, "ctl -q set_vhost_limits -p inbox '{\"max-queues\": %d}'", n);
	itest_stack(cmd);
}

/* The broker cancels a consumer whose queue is deleted: the worker must
 * hear it (consumer_cancel_notify), say so on /readyz while it has no
 * consumer, declare the queue again and consume from it. */
/* After the test, pass or fail: no limit may outlive it (clearing limits
 * that are already gone fails, which is fine here). */
static void clear_max_queues(void)
{
	char root[4096], cmd[4300];
	snprintf(cmd, sizeof cmd, "%s ctl -q clear_vhost_limits -p inbox >/dev/null 2>&1",
	         itest_source("scripts/stack", root, sizeof root));
	if (system(cmd) != 0)
		return;
}

/* Delete a queue the worker consumes (the inbox queue, or shard 1 of two)
 * while no new queue may be declared, see /readyz say 503 (naming what is
 * missing), allow declarations again, and see the worker consume again and
 * apply a message published afterwards. */
static void deleted_queue_case(bool sharded)
{
	static char page[8192];
	char logf[256], body[512], cmd[400], queue[300];
	const int port = itest_metrics_port(0);
	char addr[64];
	struct mq *m;
	pid_t w;
	int st, nqueues = 0;

	if (sharded) {
		/* The test declares the topology too: with the worker's
		 * arguments. */
		cr_assert_eq(setenv("INBOX_ORDERING", "sharded", 1), 0);
		cr_assert_eq(setenv("INBOX_SHARDS", "2", 1), 0);
	}
	itest_fresh();
	snprintf(logf, sizeof logf, "/tmp/inbox-itest-%d-cancel.log", (int)getpid());
	snprintf(addr, sizeof addr, "INBOX_METRICS_ADDR=127.0.0.1:%d", port);
	w = itest_worker_logged(1, (const char *[]){ addr, NULL }, logf);
	cr_assert_eq(itest_wait_http(port, "/readyz", 200, page, sizeof page, WAIT_S), 200, "%s", page);
	{
		/* Keep the queue from coming back at once, so that the gap
		 * can be seen: no new queue may be declared for a while. */
		char root[4096], line[512];
		FILE *p;
		snprintf(cmd, sizeof cmd, "%s ctl -q list_queues -p inbox --no-table-headers name 2>/dev/null",
		         itest_source("scripts/stack", root, sizeof root));
		p = popen(cmd, "r");
		cr_assert_not_null(p);
		while (fgets(line, sizeof line, p) != NULL)
			nqueues++;
		pclose(p);
	}
	cr_assert_gt(nqueues, 1);
	set_max_queues(nqueues - 1);
	if (sharded)
		snprintf(queue, sizeof queue, "%s.shard.1", itest_cfg()->queue);
	else
		snprintf(queue, sizeof queue, "%s", itest_cfg()->queue);
	snprintf(cmd, sizeof cmd, "ctl -q delete_queue -p inbox %s", queue);
	itest_stack(cmd);
	cr_assert_eq(itest_wait_http(port, "/readyz", 503, page, sizeof page, 60), 503,
	             "a thread without a consumer is not ready: %s", page);
	cr_assert_neq(strstr(page, "thread 0 has no consumer"), NULL, "%s", page);
	if (sharded)
		cr_assert_neq(strstr(page, "shard 1 has no consumer"), NULL, "%s", page);
	set_max_queues(-1);
	cr_assert_eq(itest_wait_http(port, "/readyz", 200, page, sizeof page, WAIT_S), 200, "%s", page);
	m = itest_mq();
	itest_event(body, sizeof body, "cancel-1", "OrderCreated", "o-cancel");
	if (sharded)
		itest_publish_keyed(m, "OrderCreated", body, "o-cancel", true);
	else
		itest_publish(m, "OrderCreated", body, NULL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", 1, WAIT_S), 1,
	             "a message published after the queue came back is applied");
	itest_wait_queue_empty(queue, WAIT_S);
	st = itest_stop(w, SIGTERM, 60);
	mq_close(&m);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	cr_assert(itest_log_has(logf, "consumer cancelled by the broker"));
}

Test(faults, deleted_queue_is_declared_and_consumed_again, .timeout = 600, .fini = clear_max_queues)
{
	deleted_queue_case(false);
}

Test(faults, deleted_shard_queue_is_named_by_readyz_and_consumed_again, .timeout = 600, .fini = clear_max_queues)
{
	deleted_queue_case(true);
}

/* Deliveries of one message (basic.get, reject with requeue) until the
 * broker takes it out of the inbox queue; at most cap. */
static int deliveries_until_gone(struct mq *m, const char *queue, int cap)
{
	struct mq_delivery d;
	int n = 0;

	memset(&d, 0, sizeof d);
	while (n < cap) {
		int rc = ST_ERR_NOT_FOUND;
		/* A requeued message is back at once; a short bounded wait
		 * covers the broker's return. */
		for (int i = 0; i < 20 && rc == ST_ERR_NOT_FOUND; i++) {
			rc = mq_get(m, queue, &d);
			if (rc == ST_ERR_NOT_FOUND)
				usleep(50 * 1000);
		}
		if (rc == ST_ERR_NOT_FOUND)
			break;
		cr_assert_eq(rc, ST_OK, "basic.get: %s", mq_errmsg(m));
		n++;
		cr_assert_eq(mq_reject(m, d.tag, true), ST_OK);
		mq_delivery_release(m, &d);
	}
	return n;
}

/* Set (or replace) the test's policy on the inbox queue. */
static void limit_policy(const struct cfg *c, int limit)
{
	char root[4096], cmd[4600];

	snprintf(cmd, sizeof cmd,
	         "%s ctl set_policy --apply-to queues --priority 10 inbox-test-limit '^%s$'"
	         " '{\"delivery-limit\": %d, \"dead-letter-exchange\": \"%s\"}' >&2",
	         itest_source("scripts/stack", root, sizeof root), c->queue, limit, c->dlx);
	cr_assert_eq(system(cmd), 0, "set_policy failed");
}

/* The delivery limit of a running queue changes through a policy (doc/operations.md:
 * "Changing the delivery limit"): no 406, no queue deleted, and the
 * worker's declaration still passes afterwards.  A policy lowers the limit
 * the worker declared (x-delivery-limit, 5 here) and cannot raise it: the
 * broker takes the lower of argument and policy.  Both halves are what the
 * operator's guide tells operators. */
Test(faults, delivery_limit_policy_changes_a_running_queue, .timeout = 300)
{
	char body[512], root[4096], cmd[4600];
	const struct cfg *c;
	struct itest_dead dead[2];
	struct mq *m;
	int lowered, raised;

	itest_fresh();
	c = itest_cfg();
	cr_assert_eq(c->delivery_limit, 5);
	m = itest_mq(); /* declares the topology as the worker does */
	limit_policy(c, 1);
	itest_event(body, sizeof body, "policy-1", "OrderCreated", "o-pol");
	itest_publish(m, "OrderCreated", body, "policy-1");
	lowered = deliveries_until_gone(m, c->queue, 20);
	cr_assert_eq(itest_dlq_drain(dead, 2, 1, 30), 1, "the message is not in the DLQ");
	cr_assert_str_eq(dead[0].message_id, "policy-1");
	limit_policy(c, 10);
	itest_event(body, sizeof body, "policy-2", "OrderCreated", "o-pol2");
	itest_publish(m, "OrderCreated", body, "policy-2");
	raised = deliveries_until_gone(m, c->queue, 20);
	snprintf(cmd, sizeof cmd, "%s ctl clear_policy inbox-test-limit >&2",
	         itest_source("scripts/stack", root, sizeof root));
	cr_assert_eq(system(cmd), 0, "clear_policy failed");
	cr_assert_eq(lowered, 2, "policy delivery-limit 1: dead-lettered after 2 deliveries, not %d", lowered);
	cr_assert_eq(raised, 6, "policy delivery-limit 10 over argument 5: the argument (6 deliveries), not %d", raised);
	cr_assert_eq(itest_dlq_drain(dead, 2, 1, 30), 1, "the second message is not in the DLQ");
	mq_close(&m);
	/* The queue was not replaced: the worker's declaration still passes. */
	m = itest_mq();
	mq_close(&m);
}
