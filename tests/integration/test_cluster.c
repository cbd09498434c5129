/*
 * test_cluster.c - node failover of each link, against the three-node
 * RabbitMQ and Galera clusters of `scripts/stack up --cluster` (the
 * `cluster` suite; scripts/test runs it when the cluster can be started).
 * INBOX_AMQP_URL and INBOX_DB_URL list the three nodes; each test kills or
 * disables a node under a running worker, checks that the worker went on
 * through the others and applied every message once, and brings the node
 * back so the next test starts with three.
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

#define WAIT_S 240

/* The cluster's scripts/stack command ("PATH --cluster"), asserted. */
static void cluster(const char *what)
{
	const char *stack = getenv("INBOX_CLUSTER_STACK");
	char cmd[4400];

	cr_assert_not_null(stack, "INBOX_CLUSTER_STACK is not set: start the cluster "
	                          "(scripts/stack up --cluster; eval \"$(scripts/stack env --cluster)\")");
	snprintf(cmd, sizeof cmd, "%s %s >&2", stack, what);
	cr_assert_eq(system(cmd), 0, "scripts/stack --cluster %s failed", what);
}

static void cluster_sql(int node, const char *sql)
{
	char what[600];

	snprintf(what, sizeof what, "sql --node %d -e \"%s\"", node, sql);
	cluster(what);
}

static void setup(void)
{
	cr_assert_not_null(getenv("INBOX_CLUSTER"), "not a cluster: the cluster suite needs "
	                                            "scripts/stack up --cluster and its env");
	/* three of each, whatever an earlier run left behind */
	cluster("start-db --node 1");
	cluster("start-mq --node 1");
	itest_fresh();
}

/* Whatever a test did, the next one starts with three healthy nodes of
 * each (start-* waits until the node is back in the cluster). */
static void teardown(void)
{
	cluster("start-db --node 1");
	cluster("start-mq --node 1");
	cluster_sql(1, "SET GLOBAL wsrep_reject_queries = NONE");
}

TestSuite(cluster, .init = setup, .fini = teardown, .timeout = 900);

/* One node fault under a running worker (two threads, the cluster's lists
 * of URLs): half of n orders applied, the fault, the other half; then every
 * message applied once, nothing dead-lettered, and the worker's log says it
 * moved on to another node (moved).  The three tests below differ only in
 * the fault. */
static void node_fault_under_a_running_worker(const char *prefix, int n, const char *fault, bool fault_is_sql,
                                              const char *moved)
{
	char logf[256];
	pid_t w;

	itest_log_path(logf, sizeof logf, prefix);
	w = itest_worker_logged(2, NULL, logf);
	itest_publish_orders(NULL, prefix, 0, n / 2);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages", n / 2, WAIT_S), n / 2);
	if (fault_is_sql)
		cluster_sql(1, fault);
	else
		cluster(fault);
	itest_publish_orders(NULL, prefix, n / 2, n);
	itest_assert_each_applied_once(prefix, n, WAIT_S);
	itest_stop_ok(w);
	cr_assert(itest_log_has(logf, moved), "the worker must have moved on to another node");
}

/* INBOX_DB_URL lists node 1 first: every thread starts there. */
Test(cluster, database_node_killed_under_a_running_worker_goes_on)
{
	node_fault_under_a_running_worker("gdb", 400, "kill-db --node 1", false,
	                                  "database connected to another node of the cluster");
}

/* INBOX_AMQP_URL lists node 1 first: the consumers and publishers start
 * there, and node 1 declared the queue, so it leads it. */
Test(cluster, broker_node_killed_under_a_running_worker_goes_on)
{
	node_fault_under_a_running_worker("gmq", 400, "kill-mq --node 1", false,
	                                  "broker connected to another node of the cluster");
}

/* A Galera node that is not ready answers 1047 ("WSREP has not yet
 * prepared node for application use") to every query; wsrep_reject_queries
 * makes a healthy node answer so, without a partition.  The worker must
 * move on to another node, not retry the same one for ever. */
Test(cluster, a_node_answering_1047_makes_the_worker_move_on)
{
	node_fault_under_a_running_worker("g47", 200, "SET GLOBAL wsrep_reject_queries = ALL", true,
	                                  "database connected to another node of the cluster");
}

/* The outbox relay on two Galera nodes at once.  Row locks (FOR UPDATE
 * SKIP LOCKED) are local to a node, so two relays on different nodes used
 * to take the same rows, both publish them, and one commit failed its
 * certification: rows published twice.  A claim must be a committed write
 * that certification sees before anything is published. */
Test(cluster, two_relays_on_different_nodes_publish_each_row_once)
{
	enum { ROWS = 600 };
	const char *out = "itest.cluster.out";
	static struct itest_dead got[2 * ROWS];
	char db1[600], db2[600], id[32];
	struct db *d = itest_db();
	struct db_stmt *ins;
	pid_t w[2];
	int n;

	cr_assert_not_null(getenv("INBOX_CLUSTER_DB_URL_1"));
	cr_assert_not_null(getenv("INBOX_CLUSTER_DB_URL_2"));
	snprintf(db1, sizeof db1, "INBOX_DB_URL=%s", getenv("INBOX_CLUSTER_DB_URL_1"));
	snprintf(db2, sizeof db2, "INBOX_DB_URL=%s", getenv("INBOX_CLUSTER_DB_URL_2"));
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	cr_assert_eq(db_prepare(d, &ins, "INSERT INTO outbox (message_id, exchange, routing_key, type, order_id,"
	                                 " body, created_at) VALUES (?, ?, 'order.Test', 'Test', 'o-direct', ?,"
	                                 " NOW(6))"),
	             ST_OK, "%s", db_errmsg(d));
	for (int i = 0; i < ROWS; i++) {
		struct db_param p[] = { DBP_STR(id), DBP_STR(itest_cfg()->out_exchange), DBP_STR(id) };
		snprintf(id, sizeof id, "relay-%d", i);
		p[0] = DBP_STR(id);
		p[2] = DBP_STR(id);
		cr_assert_eq(db_stmt_exec(ins, p, ARRAY_LEN(p), NULL), ST_OK, "%s", db_errmsg(d));
	}
	cr_assert_eq(db_commit(d), ST_OK, "%s", db_errmsg(d));
	/* Both start before either can have taken the rows. */
	w[0] = itest_worker(1, (const char *[]){ db1, NULL });
	w[1] = itest_worker(1, (const char *[]){ db2, NULL });
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL", 0, WAIT_S), 0);
	for (int i = 0; i < 2; i++)
		itest_stop_ok(w[i]);
	n = itest_drain(out, got, 2 * ROWS, ROWS, WAIT_S);
	cr_assert_eq(n, ROWS, "each row once: %d messages for %d rows", n, ROWS);
}
