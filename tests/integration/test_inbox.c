/*
 * test_inbox.c - the worker pool against the real stack: duplicates in a
 * row, concurrent duplicates from many connections into threads and
 * processes, payload conflicts, canonical hashing, and every class of bad
 * input.  Each test asserts database state and queue contents.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "itest.h"
#include "status.h"

#define WAIT_S 120

Test(inbox, same_message_twice_in_a_row_applies_once)
{
	char body[512], logf[256];
	struct mq *m;
	pid_t w;

	itest_fresh();
	itest_log_path(logf, sizeof logf, "twice");
	w = itest_worker_logged(2, NULL, logf);
	m = itest_mq();
	itest_event(body, sizeof body, "m-1", "OrderCreated", "o-1");
	itest_publish(m, "OrderCreated", body, NULL);
	itest_publish(m, "OrderCreated", body, NULL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", 1, WAIT_S), 1);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages"), 1);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"), 1);
	cr_assert_eq(itest_int1("SELECT version FROM orders WHERE id = ?", "o-1"), 1);
	cr_assert_eq(itest_log_sum(logf, "stopped", "duplicates"), 1);
	cr_assert_eq(itest_queue_depth(itest_cfg()->queue), 0, "the duplicate must be acked");
	cr_assert_eq(itest_queue_depth(itest_cfg()->dlq), 0);
}

/* A backlog makes the thread defer its acks (one cumulative ack per half a
 * prefetch window).  Once the backlog is gone the worker must owe the
 * broker nothing: the queue is empty counting unacked messages, and a
 * SIGKILL then hands nothing back. */
Test(inbox, backlog_acks_are_all_settled_once_idle, .timeout = 300)
{
	enum { N = 307 }; /* not a multiple of the ack window: some acks are owed at the end */
	char body[512], id[32], order[32];
	struct mq *m;
	pid_t w;
	int st;

	itest_fresh();
	m = itest_mq();
	for (int i = 0; i < N; i++) {
		snprintf(id, sizeof id, "ack-%d", i);
		snprintf(order, sizeof order, "ack-o%d", i);
		itest_event(body, sizeof body, id, "OrderCreated", order);
		itest_publish_async(m, "OrderCreated", body, NULL);
	}
	itest_confirm_all(m);
	mq_close(&m);
	w = itest_worker(1, (const char *[]){ "INBOX_PREFETCH=40", NULL });
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", N, WAIT_S), N);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	st = itest_stop(w, SIGKILL, 30);
	cr_assert(WIFSIGNALED(st), "status %d", st);
	{
		/* The broker returns a dead consumer's unacked messages when it
		 * drops the consumer: once none is left, the count is final. */
		struct mq *q = NULL;
		uint32_t ready = 0, consumers = 1;
		cr_assert_eq(mq_open(&q, &itest_cfg()->amqp, 0, "itest-acks"), ST_OK);
		for (int i = 0; i < WAIT_S * 10 && consumers > 0; i++) {
			cr_assert_eq(mq_queue_counts(q, itest_cfg()->queue, &ready, &consumers), ST_OK);
			if (consumers > 0)
				usleep(100 * 1000);
		}
		mq_close(&q);
		cr_assert_eq(consumers, 0, "the killed worker's consumer is still registered");
		cr_assert_eq(ready, 0, "a killed idle worker owed no acks, so nothing comes back");
	}
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages"), N);
}

/* Log lines (issue 12, item 5): the message id is message_id in text and
 * in JSON, outcomes are SPEC.md's names and a dead letter says why, the
 * janitor has its own name, the start line has the version. */
Test(inbox, log_lines_name_message_outcome_reason_thread_and_version)
{
	char body[512], text_log[256], json_log[256];
	const char *types[] = { "OrderCreated", "OrderCancelled", "ShipmentCreated" };
	struct mq *m;
	pid_t w;

	itest_fresh();
	itest_log_path(text_log, sizeof text_log, "logwords");
	itest_log_path(json_log, sizeof json_log, "logwords-json");
	m = itest_mq();
	for (int i = 0; i < 3; i++) {
		char id[32];
		snprintf(id, sizeof id, "lw-%d", i);
		itest_event(body, sizeof body, id, types[i], "o-lw");
		itest_publish(m, types[i], body, NULL);
	}
	w = itest_worker_logged(1, (const char *[]){ "INBOX_LOG_LEVEL=debug", NULL }, text_log);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages", 3, WAIT_S), 3);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	cr_assert(itest_log_has(text_log, " info starting version=" INBOX_VERSION " "));
	cr_assert(itest_log_has(text_log, "message_id=lw-0 order=o-lw type=OrderCreated outcome=applied"));
	cr_assert(itest_log_has(text_log, "message_id=lw-2 order=o-lw type=ShipmentCreated outcome=dead_lettered "
	                                  "reason=invalid-transition detail=\"ShipmentCreated not allowed on an "
	                                  "order in state Cancelled\""));
	cr_assert_not(itest_log_has(text_log, " msg="), "no msg= key");
	cr_assert_not(itest_log_has(text_log, "worker=-1"), "the janitor has a name of its own");
	cr_assert_not(itest_log_has(text_log, "outcome=payload-conflict"));

	/* Bad input: the same outcome word and a reason. */
	itest_publish(m, "OrderCreated", "{not json", "lw-bad");
	/* The same in JSON: one key for the message id. */
	itest_event(body, sizeof body, "lw-3", "PaymentAuthorized", "o-lw");
	itest_publish(m, "PaymentAuthorized", body, NULL);
	w = itest_worker_logged(1, (const char *[]){ "INBOX_LOG_LEVEL=debug", "INBOX_LOG_FORMAT=json", NULL },
	                        json_log);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages", 4, WAIT_S), 4);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert(itest_log_has(json_log, "\"message_id\":\"lw-3\""));
	cr_assert(itest_log_has(json_log, "\"message_id\":\"lw-bad\",\"outcome\":\"dead_lettered\","
	                                  "\"reason\":\"malformed-json\""));
	cr_assert(itest_log_has(json_log, "\"outcome\":\"compensated\""));
	cr_assert(itest_log_has(json_log, "\"version\":\"" INBOX_VERSION "\""));
	cr_assert_not(itest_log_has(json_log, "msg_id"));
}

/* Light traffic goes to one thread.  The broker hands each delivery to the
 * next consumer with room, so without consumer priorities consecutive
 * events of one order went to different threads at once, and each
 * transaction waited in the database for the one before it, holding its
 * other orders meanwhile: four threads had ten times the p99 of one
 * (bench/latency).  With x-priority by thread index the broker gives
 * everything to the first thread while its prefetch window has room, and
 * the others only take what it cannot.  Twelve events of three orders,
 * published while every thread consumes: all twelve handled by thread 0. */
Test(inbox, light_traffic_is_handled_by_the_first_thread_alone, .timeout = 180)
{
	static const char *const types[] = { "OrderCreated", "PaymentAuthorized", "InventoryReserved",
		                             "ShipmentCreated" };
	char body[512], logf[256], id[32], order[32];
	struct mq *m;
	pid_t w;

	itest_fresh();
	itest_log_path(logf, sizeof logf, "priority");
	w = itest_worker_logged(4, (const char *[]){ "INBOX_LOG_LEVEL=debug", NULL }, logf);
	cr_assert_eq(itest_wait_log_lines(logf, (const char *const[]){ " consuming worker=", NULL }, 4, WAIT_S), 4,
	             "all four threads consume before anything is published");
	m = itest_mq();
	for (int i = 0; i < 12; i++) {
		snprintf(id, sizeof id, "pr-%d", i);
		snprintf(order, sizeof order, "o-pr-%d", i / 4);
		itest_event(body, sizeof body, id, types[i % 4], order);
		itest_publish(m, types[i % 4], body, NULL);
	}
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", 12, WAIT_S), 12);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_eq(itest_log_count(logf, " handled worker="), 12, "a handled line per message");
	cr_assert_eq(itest_log_count(logf, " handled worker=0 message_id=pr-"), 12,
	             "every message went to the first thread");
}

/* A thread whose batch shares an order with another thread's transaction
 * settles the rest of its batch first (worker/inflight.h).  Before, it
 * locked the batch's orders in one statement and waited, with the orders
 * it had locked, for the whole of the other transaction, which here waits
 * on a lock this test holds: an order nobody else touched stayed undone
 * as long as that lasted.  Two threads with windows of two: one takes
 * o-ap-x and o-ap-z and waits on o-ap-z; the other gets o-ap-y and a second
 * event of o-ap-x.  o-ap-y must be applied while o-ap-z is still locked. */
Test(inbox, an_order_another_thread_waits_on_does_not_hold_up_the_rest_of_a_batch, .timeout = 240)
{
	char body[512], logf[256];
	struct db *locker = NULL;
	struct mq *m;
	pid_t w;

	itest_fresh();
	itest_log_path(logf, sizeof logf, "apart");
	cr_assert_eq(db_open(&locker, &itest_cfg()->db), ST_OK);
	cr_assert_eq(db_exec(locker, "INSERT INTO order_locks (order_id) VALUES ('o-ap-z')"), ST_OK);
	cr_assert_eq(db_commit(locker), ST_OK);
	cr_assert_eq(db_exec(locker, "UPDATE order_locks SET held = held WHERE order_id = 'o-ap-z'"), ST_OK);
	/* All queued before the worker starts: each thread gets two at once
	 * as it starts consuming, the first x1 and z1, the second y1 and x2. */
	m = itest_mq();
	for (int i = 0; i < 4; i++) {
		static const char *const ev[4][3] = {
			{ "ap-x1", "OrderCreated", "o-ap-x" },
			{ "ap-z1", "OrderCreated", "o-ap-z" },
			{ "ap-y1", "OrderCreated", "o-ap-y" },
			{ "ap-x2", "PaymentAuthorized", "o-ap-x" },
		};
		itest_event(body, sizeof body, ev[i][0], ev[i][1], ev[i][2]);
		itest_publish(m, ev[i][1], body, NULL);
	}
	w = itest_worker_logged(2, (const char *[]){ "INBOX_LOG_LEVEL=debug", "INBOX_PREFETCH=2", "INBOX_BATCH=2", NULL },
	                        logf);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events WHERE order_id = 'o-ap-y'", 1, 30), 1,
	             "o-ap-y applied while another thread waits on o-ap-z");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events WHERE order_id = 'o-ap-z'"), 0,
	             "o-ap-z still waits for this test's lock");
	db_rollback(locker);
	db_close(&locker);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", 4, WAIT_S), 4);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events WHERE order_id = 'o-ap-x'"), 2);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
}

/* The seeds' example: the same PaymentConfirmed handled twice reports
 * processed, then duplicate. */
Test(inbox, payment_confirmed_twice_is_processed_then_duplicate)
{
	char body[512], logf[256], status[32];
	struct mq *m;
	pid_t w;

	itest_fresh();
	itest_log_path(logf, sizeof logf, "paycfm");
	m = itest_mq();
	itest_event(body, sizeof body, "c-1", "OrderCreated", "o-7");
	itest_publish(m, "OrderCreated", body, NULL);
	w = itest_worker_logged(1, (const char *[]){ "INBOX_LOG_LEVEL=debug", NULL }, logf);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM orders", 1, WAIT_S), 1);
	itest_event(body, sizeof body, "pay-7", "PaymentConfirmed", "o-7");
	itest_publish(m, "PaymentConfirmed", body, NULL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", 2, WAIT_S), 2);
	itest_publish(m, "PaymentConfirmed", body, NULL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages", 2, WAIT_S), 2);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert(itest_str1("SELECT status FROM orders WHERE id = ?", "o-7", status, sizeof status));
	cr_assert_str_eq(status, "Paid");
	cr_assert_eq(itest_int1("SELECT paid_at IS NOT NULL FROM orders WHERE id = ?", "o-7"), 1);
	cr_assert(itest_log_has(logf, "message_id=pay-7 order=o-7 type=PaymentConfirmed outcome=applied"));
	cr_assert(itest_log_has(logf, "message_id=pay-7 order=o-7 type=PaymentConfirmed outcome=duplicate"));
}

/* Publish every message of a set from `conns` connections at the same
 * moment (a barrier releases them together). */
struct blast {
	pthread_barrier_t *start;
	int orders;
};

static void *blast_main(void *arg)
{
	struct blast *b = arg;
	struct mq *m = itest_mq();
	char body[512], id[64], order[64];

	pthread_barrier_wait(b->start);
	for (int i = 0; i < b->orders; i++) {
		snprintf(order, sizeof order, "o-%d", i);
		snprintf(id, sizeof id, "c-%d", i);
		itest_event(body, sizeof body, id, "OrderCreated", order);
		itest_publish_async(m, "OrderCreated", body, NULL);
		snprintf(id, sizeof id, "p-%d", i);
		itest_event(body, sizeof body, id, "PaymentAuthorized", order);
		itest_publish_async(m, "PaymentAuthorized", body, NULL);
	}
	itest_confirm_all(m);
	mq_close(&m);
	return NULL;
}

static void concurrent_duplicates(int processes, int threads, const char *const *env)
{
	enum { CONNS = 8, ORDERS = 50 };
	pthread_t t[CONNS];
	pthread_barrier_t start;
	struct blast b = { .start = &start, .orders = ORDERS };
	char logf[2][256];
	pid_t w[2];
	int64_t dups = 0;

	itest_fresh();
	for (int p = 0; p < processes; p++) {
		char name[32];
		snprintf(name, sizeof name, "conc-%d-%d", processes, p);
		itest_log_path(logf[p], sizeof logf[p], name);
		w[p] = itest_worker_logged(threads, env, logf[p]);
	}
	cr_assert_eq(pthread_barrier_init(&start, NULL, CONNS), 0);
	for (int i = 0; i < CONNS; i++)
		cr_assert_eq(pthread_create(&t[i], NULL, blast_main, &b), 0);
	for (int i = 0; i < CONNS; i++)
		pthread_join(t[i], NULL);
	pthread_barrier_destroy(&start);

	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages", 2 * ORDERS, WAIT_S), 2 * ORDERS);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	for (int p = 0; p < processes; p++)
		itest_stop_ok(w[p]);
	/* Exactly one effect per message, whatever the interleaving. */
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"), 2 * ORDERS);
	/* ...and each the effect of its own message: c-I created order o-I,
	 * p-I paid it (the UNIQUE index on message_id makes a count of
	 * distinct ids equal the count above whatever happened). */
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events WHERE order_id = CONCAT('o-', SUBSTRING(message_id, 3))"
	                       " AND ((message_id LIKE 'c-%' AND type = 'OrderCreated' AND to_status = 'Created'"
	                       " AND version = 1) OR (message_id LIKE 'p-%' AND type = 'PaymentAuthorized'"
	                       " AND from_status = 'Created' AND to_status = 'Paid' AND version = 2))"),
	             2 * ORDERS);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders WHERE status = 'Paid' AND version = 2"
	                       " AND amount_cents = 4200"),
	             ORDERS, "every order paid with the published amount");
	/* Order of arrival is not guaranteed across connections: a payment
	 * may be held and released, but nothing stays held. */
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM held_events"), 0);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE outcome <> 'applied'"), 0);
	for (int p = 0; p < processes; p++)
		dups += itest_log_sum(logf[p], "stopped", "duplicates");
	cr_assert_eq(dups, (int64_t)(CONNS - 1) * 2 * ORDERS, "every other copy must be counted as a duplicate");
	/* The copies raced in several threads, not one (the callers' small
	 * prefetch windows): the second thread settled some of them. */
	cr_assert_gt(itest_log_count(logf[0], " handled worker=1 "), 0, "thread 1 of process 0 took part, see %s",
	             logf[0]);
	cr_assert_eq(itest_queue_depth(itest_cfg()->dlq), 0);
}

/* A prefetch window of two: the first thread (the highest consumer
 * priority) takes two copies and the next go to the next thread, so the
 * copies of one message race in different threads, as they would in a
 * backlog; with the default window the first thread would take them all. */
Test(inbox, concurrent_duplicates_apply_once_four_threads, .timeout = 600)
{
	concurrent_duplicates(1, 4, (const char *[]){ "INBOX_PREFETCH=2", "INBOX_LOG_LEVEL=debug", NULL });
}

Test(inbox, concurrent_duplicates_apply_once_two_processes, .timeout = 600)
{
	concurrent_duplicates(2, 4, (const char *[]){ "INBOX_PREFETCH=2", "INBOX_LOG_LEVEL=debug", NULL });
}

/* Several messages per transaction: a duplicate inside a batch must not
 * undo the rest of it. */
Test(inbox, concurrent_duplicates_apply_once_batched, .timeout = 600)
{
	concurrent_duplicates(2, 4,
	                      (const char *[]){ "INBOX_BATCH=16", "INBOX_PREFETCH=16", "INBOX_LOG_LEVEL=debug", NULL });
}

Test(inbox, conflicting_payload_first_stands_second_dead_lettered)
{
	char body[512];
	struct itest_dead dead[4];
	struct mq *m;
	pid_t w;

	itest_fresh();
	m = itest_mq();
	itest_event(body, sizeof body, "k-1", "OrderCreated", "o-1");
	itest_publish(m, "OrderCreated", body, "k-1");
	itest_event(body, sizeof body, "k-1", "OrderCreated", "o-2"); /* same key, other payload */
	itest_publish(m, "OrderCreated", body, "k-1");
	w = itest_worker(2, NULL);
	cr_assert_eq(itest_dlq_drain(dead, 4, 1, WAIT_S), 1);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_str_eq(dead[0].reason, "payload-conflict");
	cr_assert_str_eq(dead[0].message_id, "k-1");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders"), 1);
	cr_assert_eq(itest_int1("SELECT COUNT(*) FROM orders WHERE id = ?", "o-1"), 1, "the first one stands");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"), 1);
}

Test(inbox, reserialised_payload_is_a_duplicate_not_a_conflict)
{
	const char *a = "{\"message_id\":\"r-1\",\"type\":\"OrderCreated\",\"order_id\":\"o-9\",\"data\":{\"x\":1,\"y\":[1,2]}}";
	const char *b = "{ \"data\" : { \"y\" : [ 1 , 2 ] , \"x\" : 1 } ,\n  \"order_id\":\"o-9\",\t\"type\":\"OrderCreated\", \"message_id\" : \"r-1\" }";
	char logf[256];
	struct mq *m;
	pid_t w;

	itest_fresh();
	itest_log_path(logf, sizeof logf, "reser");
	m = itest_mq();
	itest_publish(m, "OrderCreated", a, NULL);
	itest_publish(m, "OrderCreated", b, NULL);
	w = itest_worker_logged(1, NULL, logf);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages", 1, WAIT_S), 1);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_eq(itest_log_sum(logf, "stopped", "duplicates"), 1);
	cr_assert_eq(itest_queue_depth(itest_cfg()->dlq), 0, "no conflict may be reported");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"), 1);
}

struct bad_case {
	const char *id;      /* message-id property, to find it in the DLQ */
	const char *reason;
	const char *body;    /* NULL: generated */
};

Test(inbox, every_bad_input_class_is_dead_lettered_and_the_worker_goes_on, .timeout = 600)
{
	static char deep[6000], large[70000], badutf8[256], mismatch_type[256];
	struct bad_case cases[] = {
		{ "b-json", "malformed-json", "{\"message_id\": \"b-json\", " },
		{ "b-array", "malformed-json", "[1, 2, 3]" },
		{ "b-missing", "missing-field", "{\"message_id\":\"b-missing\",\"type\":\"OrderCreated\"}" },
		{ "b-type", "invalid-field", "{\"message_id\":\"b-type\",\"type\":\"OrderCreated\",\"order_id\":42}" },
		{ "b-chars", "invalid-field", "{\"message_id\":\"b-chars\",\"type\":\"OrderCreated\",\"order_id\":\"o 1;DROP\"}" },
		{ "b-long", "invalid-field", NULL },
		{ "b-unknown", "unknown-type", "{\"message_id\":\"b-unknown\",\"type\":\"OrderExploded\",\"order_id\":\"o-1\"}" },
		{ "b-large", "too-large", large },
		{ "b-utf8", "malformed-json", badutf8 },
		{ "b-mismatch", "invalid-field", "{\"message_id\":\"other-id\",\"type\":\"OrderCreated\",\"order_id\":\"o-1\"}" },
		{ "b-deep", "malformed-json", deep },
		{ "b-typeprop", "invalid-field", mismatch_type },
	};
	enum { N = sizeof cases / sizeof cases[0] };
	char longid[200], longbody[512], good[512];
	struct itest_dead dead[N + 4];
	struct mq *m;
	pid_t w;
	size_t off = 0;

	memset(longid, 'x', 129);
	longid[129] = '\0';
	snprintf(longbody, sizeof longbody, "{\"message_id\":\"b-long\",\"type\":\"OrderCreated\",\"order_id\":\"%s\"}", longid);
	cases[5].body = longbody;
	snprintf(large, sizeof large, "{\"message_id\":\"b-large\",\"type\":\"OrderCreated\",\"order_id\":\"o-1\",\"data\":{\"pad\":\"");
	off = strlen(large);
	memset(large + off, 'a', 66000);
	snprintf(large + off + 66000, sizeof large - off - 66000, "\"}}");
	snprintf(badutf8, sizeof badutf8, "{\"message_id\":\"b-utf8\",\"type\":\"OrderCreated\",\"order_id\":\"o-1\",\"data\":{\"n\":\"\xff\xfe\"}}");
	off = 0;
	for (int i = 0; i < 2500; i++)
		deep[off++] = '[';
	for (int i = 0; i < 2500; i++)
		deep[off++] = ']';
	deep[off] = '\0';
	snprintf(mismatch_type, sizeof mismatch_type, "{\"message_id\":\"b-typeprop\",\"type\":\"OrderCreated\",\"order_id\":\"o-1\"}");

	itest_fresh();
	w = itest_worker(2, NULL);
	m = itest_mq();
	for (int i = 0; i < N; i++) {
		if (strcmp(cases[i].id, "b-typeprop") == 0) {
			/* type property disagrees with the body */
			struct mq_message msg = { .exchange = itest_cfg()->exchange, .routing_key = "order.X",
			                          .body = cases[i].body, .len = strlen(cases[i].body),
			                          .message_id = cases[i].id, .type = "PaymentAuthorized" };
			cr_assert_eq(mq_publish_confirmed(m, &msg, 10000), ST_OK);
			continue;
		}
		itest_publish(m, "OrderCreated", cases[i].body, cases[i].id);
	}
	itest_event(good, sizeof good, "g-1", "OrderCreated", "o-good");
	itest_publish(m, "OrderCreated", good, NULL);
	cr_assert_eq(itest_dlq_drain(dead, N + 4, N, WAIT_S), N, "every bad message must reach the DLQ once");
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM orders WHERE id = 'o-good'", 1, WAIT_S), 1,
	             "the worker must go on with the next good message");
	itest_stop_ok(w);
	mq_close(&m);
	for (int i = 0; i < N; i++) {
		bool found = false;
		for (int j = 0; j < N; j++) {
			if (strcmp(dead[j].message_id, cases[i].id) != 0)
				continue;
			found = true;
			cr_expect_str_eq(dead[j].reason, cases[i].reason, "%s: reason %s, want %s (detail: %s)",
			                 cases[i].id, dead[j].reason, cases[i].reason, dead[j].detail);
			cr_expect_neq(strlen(dead[j].detail), 0, "%s: x-inbox-detail must say why", cases[i].id);
		}
		cr_expect(found, "%s not in the DLQ", cases[i].id);
	}
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"), 1);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages"), 1);
}

/* A minimal HTTP/1.0 GET on loopback; returns the status code. */
/* The value of a sample line (not its # HELP line). */
static int64_t metric(const char *text, const char *name)
{
	char pat[256];
	const char *p;

	snprintf(pat, sizeof pat, "\n%s", name);
	p = strstr(text, pat);
	return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

Test(inbox, metrics_health_and_readiness_endpoints)
{
	static char page[65536];
	char body[512];
	struct mq *m;
	pid_t w;
	int code = 0;

	char addr[64];
	int port = itest_metrics_port(7);

	itest_fresh();
	/* A port of this stack's (itest_metrics_port), not a fixed one: two
	 * stacks on one machine run this test side by side. */
	snprintf(addr, sizeof addr, "INBOX_METRICS_ADDR=127.0.0.1:%d", port);
	w = itest_worker(2, (const char *[]){ addr, NULL });
	code = itest_wait_http(port, "/readyz", 200, page, sizeof page, 30);
	cr_assert_eq(code, 200, "ready once every thread has both connections");
	cr_assert_eq(itest_http_get(port, "/healthz", page, sizeof page), 200);
	cr_assert_eq(itest_http_get(port, "/nope", page, sizeof page), 404);
	m = itest_mq();
	itest_event(body, sizeof body, "met-1", "OrderCreated", "o-met");
	itest_publish(m, "OrderCreated", body, NULL);
	itest_publish(m, "OrderCreated", body, NULL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", 1, WAIT_S), 1);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	cr_assert_eq(itest_http_get(port, "/metrics", page, sizeof page), 200);
	cr_assert_eq(metric(page, "inbox_messages_total{outcome=\"applied\"} "), 1, "%s", page);
	cr_assert_eq(metric(page, "inbox_messages_total{outcome=\"duplicate\"} "), 1);
	cr_assert_eq(metric(page, "inbox_duplicates_total "), 1, "SPEC.md's name, the same count as outcome=duplicate");
	cr_assert_eq(metric(page, "inbox_processing_seconds_count "), 2);
	cr_assert_neq(strstr(page, "inbox_reconnects_total{peer=\"db\"}"), NULL);
	cr_assert_neq(strstr(page, "inbox_db_retries_total"), NULL);
	cr_assert_neq(strstr(page, "inbox_outbox_pending"), NULL);
	itest_stop_ok(w);
	mq_close(&m);
}

/* Idle sockets must not starve the health checks: 32 connections that
 * never send a byte (more than one client may hold at once) are closed by
 * the server's connection time-out, after which /healthz and /readyz answer
 * again.  Polled with a bound of the time-out plus a margin, never timed. */
Test(inbox, idle_metrics_connections_do_not_starve_health_checks, .timeout = 180)
{
	enum { IDLE = 32 };
	const int port = itest_metrics_port(0);
	char addr[64];
	int idle[IDLE], code = 0;
	char page[4096];
	pid_t w;

	itest_fresh();
	snprintf(addr, sizeof addr, "INBOX_METRICS_ADDR=127.0.0.1:%d", port);
	w = itest_worker(1, (const char *[]){ addr, NULL });
	code = itest_wait_http(port, "/readyz", 200, page, sizeof page, 30);
	cr_assert_eq(code, 200, "ready once every thread has both connections");
	for (int i = 0; i < IDLE; i++) {
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
		cr_assert_eq(inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr), 1);
		idle[i] = socket(AF_INET, SOCK_STREAM, 0);
		cr_assert_geq(idle[i], 0);
		cr_assert_eq(connect(idle[i], (struct sockaddr *)&sa, sizeof sa), 0, "idle connection %d", i);
	}
	/* The server's idle time-out is METRICS_CONN_TIMEOUT_S (5 s); 30 s is
	 * the time-out plus a wide margin for a loaded machine. */
	code = itest_wait_http(port, "/healthz", 200, page, sizeof page, 30);
	cr_assert_eq(code, 200, "/healthz must answer while %d idle connections are open", IDLE);
	code = itest_wait_http(port, "/readyz", 200, page, sizeof page, 30);
	cr_assert_eq(code, 200, "/readyz must answer while %d idle connections are open", IDLE);
	for (int i = 0; i < IDLE; i++)
		close(idle[i]);
	itest_stop_ok(w);
}

Test(inbox, cleanup_deletes_rows_past_retention_only)
{
	const char *args[] = { "cleanup", NULL };
	char body[512];
	struct mq *m;
	pid_t w;
	int st;

	itest_fresh();
	w = itest_worker(1, NULL);
	m = itest_mq();
	itest_event(body, sizeof body, "old-1", "OrderCreated", "o-old");
	itest_publish(m, "OrderCreated", body, NULL);
	itest_event(body, sizeof body, "new-1", "OrderCreated", "o-new");
	itest_publish(m, "OrderCreated", body, NULL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages", 2, WAIT_S), 2);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_eq(db_exec(itest_db(), "UPDATE processed_messages SET processed_at = NOW(6) - INTERVAL 8 DAY"
	                                 " WHERE message_id = 'old-1'"), 0);
	cr_assert_eq(db_commit(itest_db()), 0);
	st = itest_wait_exit(itest_spawn(args, (const char *[]){ "INBOX_RETENTION=7d", NULL }), 60);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE message_id = 'old-1'"), 0);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE message_id = 'new-1'"), 1);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"), 2, "the ledger is not the inbox's to clean");
}
