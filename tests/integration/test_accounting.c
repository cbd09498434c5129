/*
 * test_accounting.c - the metrics add up (issue 12, item 3).  One worker
 * (one thread, so deliveries are decided in publish order) handles a known
 * scenario with every decision — applied, ignored, compensated, duplicates,
 * holds released into each final outcome, holds that expire, and dead
 * letters of every reason the worker gives — and then every counter of
 * /metrics is compared with what the database rows (processed_messages
 * outcomes and reasons, held_events, outbox) and the DLQ hold.  A held
 * event is counted once in inbox_messages_total, in its final outcome,
 * by whoever settles it (a release, or the janitor's expiry).
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
#include "mq.h"
#include "status.h"

#define WAIT_S 90
#define HOLD_TTL_S 6

static const char *const reasons[] = {
	"malformed-json", "missing-field", "invalid-field", "unknown-type", "too-large", "payload-conflict",
	"hold-expired", "invalid-transition", "retries-exhausted", "unprocessable",
};
#define NREASONS (sizeof reasons / sizeof reasons[0])

static int64_t count(const char *page, const char *name)
{
	return (int64_t)itest_metric(page, name);
}

static void scrape(char *page, size_t cap)
{
	cr_assert_eq(itest_http_get(itest_metrics_port(0), "/metrics", page, cap), 200);
}

/* Poll /metrics until the gauge has the value (it is refreshed by the
 * janitor about once a second). */
static double wait_metric(char *page, size_t cap, const char *name, double want, int timeout_s)
{
	return itest_wait_metric(itest_metrics_port(0), name, want, want, page, cap, timeout_s);
}

static int published;

static void pub(struct mq *m, const char *id, const char *type, const char *order)
{
	char body[512];

	itest_event(body, sizeof body, id, type, order);
	itest_publish(m, type, body, NULL);
	published++;
}

static void pub_raw(struct mq *m, const char *rk, const char *body)
{
	struct mq_message msg = {
		.exchange = itest_cfg()->exchange, .routing_key = rk, .body = body, .len = strlen(body),
	};

	cr_assert_eq(mq_publish(m, &msg), ST_OK, "publish: %s", mq_errmsg(m));
	cr_assert_eq(mq_wait_confirms(m, 10000), ST_OK, "confirm: %s", mq_errmsg(m));
	published++;
}

static void drained(void)
{
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
}

Test(accounting, every_counter_matches_the_database_and_the_dlq, .timeout = 600)
{
	static char page[65536];
	static struct itest_dead dead[64];
	char logf[256], big[3000], name[96];
	struct db *db, *locker;
	struct mq *m;
	int ndead, dlq_rows, by_reason[NREASONS] = { 0 };
	pid_t w;
	int st;

	itest_fresh();
	published = 0;
	db = itest_db();
	/* A value the database refuses: a held event's routing key longer
	 * than this narrowed column (the usual keys fit). */
	cr_assert_eq(db_exec(db, "ALTER TABLE held_events MODIFY routing_key VARCHAR(40) NOT NULL"), ST_OK);
	snprintf(logf, sizeof logf, "/tmp/inbox-itest-%d-accounting.log", (int)getpid());
	snprintf(name, sizeof name, "INBOX_METRICS_ADDR=127.0.0.1:%d", itest_metrics_port(0));
	w = itest_worker_logged(1,
	                        (const char *[]){ name, "INBOX_HOLD_TTL=" "6s", "INBOX_MAX_RETRIES=0",
	                                          "INBOX_MAX_BODY=2048", NULL },
	                        logf);
	cr_assert_eq(itest_wait_http(itest_metrics_port(0), "/readyz", 200, page, sizeof page, WAIT_S), 200, "%s",
	             page);
	m = itest_mq();

	/* Applied, then ignored (stale) and an invalid transition (too late). */
	pub(m, "a-1", "OrderCreated", "acc-a");
	pub(m, "a-2", "PaymentAuthorized", "acc-a");
	pub(m, "a-3", "InventoryReserved", "acc-a");
	pub(m, "a-4", "ShipmentCreated", "acc-a");
	pub(m, "a-5", "PaymentConfirmed", "acc-a");
	pub(m, "a-6", "OrderCancelled", "acc-a");
	/* Held, then applied by the order's creation. */
	pub(m, "b-2", "PaymentAuthorized", "acc-b");
	pub(m, "b-1", "OrderCreated", "acc-b");
	/* Compensated on arrival. */
	pub(m, "c-1", "OrderCreated", "acc-c");
	pub(m, "c-2", "OrderCancelled", "acc-c");
	pub(m, "c-3", "PaymentAuthorized", "acc-c");
	/* Held through the creation, then compensated by the cancellation. */
	pub(m, "d-3", "InventoryReserved", "acc-d");
	pub(m, "d-1", "OrderCreated", "acc-d");
	pub(m, "d-2", "OrderCancelled", "acc-d");
	/* Two payments held: the first applied, the second then ignored. */
	pub(m, "e-2", "PaymentAuthorized", "acc-e");
	pub(m, "e-3", "PaymentConfirmed", "acc-e");
	pub(m, "e-1", "OrderCreated", "acc-e");
	/* Held, then an invalid transition once the order is cancelled. */
	pub(m, "f-4", "ShipmentCreated", "acc-f");
	pub(m, "f-1", "OrderCreated", "acc-f");
	pub(m, "f-2", "OrderCancelled", "acc-f");
	/* Duplicates: of an applied event, of a released one, twice. */
	pub(m, "a-1", "OrderCreated", "acc-a");
	pub(m, "b-2", "PaymentAuthorized", "acc-b");
	pub(m, "b-2", "PaymentAuthorized", "acc-b");
	/* A conflict: a known key with another payload. */
	pub(m, "a-2", "PaymentAuthorized", "acc-other");
	/* Bad input of every class. */
	pub_raw(m, "order.OrderCreated", "not json");
	pub_raw(m, "order.OrderCreated", "{\"message_id\":\"bad-1\",\"type\":\"OrderCreated\"}");
	pub_raw(m, "order.OrderCreated", "{\"message_id\":\"bad 2\",\"type\":\"OrderCreated\",\"order_id\":\"x\"}");
	pub_raw(m, "order.Nope", "{\"message_id\":\"bad-3\",\"type\":\"Nope\",\"order_id\":\"x\"}");
	memset(big, ' ', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	memcpy(big, "{\"message_id\":\"bad-4\"}", 22);
	pub_raw(m, "order.OrderCreated", big);
	/* Unprocessable: held with a routing key its column refuses. */
	pub_raw(m, "order.PaymentAuthorized.with.a.routing.key.too.long.to.keep",
	        "{\"message_id\":\"u-1\",\"source\":\"itest\",\"type\":\"PaymentAuthorized\",\"order_id\":\"acc-u\"}");
	/* Held, its stored body spoilt meanwhile: released as malformed. */
	pub(m, "h-2", "PaymentAuthorized", "acc-h");
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM held_events WHERE message_id = 'h-2'", 1, WAIT_S), 1);
	cr_assert_eq(db_exec(db, "UPDATE held_events SET body = '{' WHERE message_id = 'h-2'"), ST_OK);
	cr_assert_eq(db_commit(db), ST_OK);
	pub(m, "h-1", "OrderCreated", "acc-h");
	drained();
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM held_events", 0, WAIT_S), 0, "every hold settled");

	/* Retries exhausted: the order's lock row held by another session
	 * past the lock wait time-out, with no retry allowed. */
	cr_assert_eq(db_open(&locker, &itest_cfg()->db), ST_OK);
	cr_assert_eq(db_exec(locker, "INSERT INTO order_locks (order_id) VALUES ('acc-r')"), ST_OK);
	cr_assert_eq(db_commit(locker), ST_OK);
	cr_assert_eq(db_exec(locker, "UPDATE order_locks SET held = held WHERE order_id = 'acc-r'"), ST_OK);
	{
		uint32_t before = itest_queue_depth(itest_cfg()->dlq);
		pub(m, "r-1", "OrderCreated", "acc-r");
		cr_assert_eq(itest_wait_depth(itest_cfg()->dlq, before + 1, 60), before + 1,
		             "dead-lettered after the lock wait");
	}
	db_rollback(locker);
	db_close(&locker);

	/* A hold that expires; while it waits the gauge shows it. */
	pub(m, "g-4", "ShipmentCreated", "acc-g");
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM held_events", 1, WAIT_S), 1);
	cr_expect_eq(wait_metric(page, sizeof page, "inbox_held_events", 1, HOLD_TTL_S), 1, "%s", page);
	cr_expect_gt(itest_metric(page, "inbox_held_oldest_seconds"), 0, "%s", page);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages WHERE reason = 'hold-expired'", 1, WAIT_S),
	             1);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL", 0, WAIT_S), 0);
	drained();

	ndead = itest_dlq_drain(dead, 64, 12, WAIT_S);
	for (int i = 0; i < ndead; i++) {
		size_t r = 0;
		while (r < NREASONS && strcmp(dead[i].reason, reasons[r]) != 0)
			r++;
		cr_assert_lt(r, NREASONS, "a DLQ copy with reason %s", dead[i].reason);
		by_reason[r]++;
	}
	for (size_t r = 0; r < NREASONS; r++)
		cr_assert_gt(by_reason[r], 0, "the scenario dead-letters %s", reasons[r]);

	cr_expect_eq(wait_metric(page, sizeof page, "inbox_held_events", 0, 10), 0);
	scrape(page, sizeof page);
	/* Every final decision, against the inbox rows. */
	cr_expect_eq(count(page, "inbox_messages_total{outcome=\"applied\"}"),
	             itest_int("SELECT COUNT(*) FROM processed_messages WHERE outcome = 'applied'"), "%s", page);
	cr_expect_eq(count(page, "inbox_messages_total{outcome=\"ignored\"}"),
	             itest_int("SELECT COUNT(*) FROM processed_messages WHERE outcome = 'ignored'"));
	cr_expect_eq(count(page, "inbox_messages_total{outcome=\"compensated\"}"),
	             itest_int("SELECT COUNT(*) FROM processed_messages WHERE outcome = 'compensated'"));
	cr_expect_eq(count(page, "inbox_messages_total{outcome=\"dead_lettered\"}"), ndead, "every DLQ copy");
	cr_expect_eq(itest_metric(page, "inbox_messages_total{outcome=\"held\"}"), -1, "held is a gauge now");
	dlq_rows = (int)itest_int("SELECT COUNT(*) FROM processed_messages WHERE outcome = 'dead_lettered'");
	/* A duplicate leaves no row: what was published and is neither a row
	 * nor a dead letter without a row. */
	cr_expect_eq(count(page, "inbox_messages_total{outcome=\"duplicate\"}"),
	             published - itest_int("SELECT COUNT(*) FROM processed_messages") - (ndead - dlq_rows));
	cr_expect_eq(count(page, "inbox_messages_total{outcome=\"duplicate\"}"), 3);
	cr_expect_eq(itest_metric(page, "inbox_duplicates_total"), 3, "SPEC.md's name, the same count as outcome=duplicate");
	/* Dead letters by reason, against the DLQ and the rows that say so. */
	for (size_t r = 0; r < NREASONS; r++) {
		char q[200];
		snprintf(name, sizeof name, "inbox_dead_letters_total{reason=\"%s\"}", reasons[r]);
		cr_expect_eq(count(page, name), by_reason[r], "%s", name);
		snprintf(q, sizeof q,
		         "SELECT COUNT(*) FROM processed_messages WHERE outcome = 'dead_lettered' AND reason = '%s'",
		         reasons[r]);
		cr_expect_leq(itest_int(q), by_reason[r], "%s", reasons[r]);
	}
	/* Holds: every event that waited, and those its order settled. */
	cr_expect_eq(count(page, "inbox_held_total"),
	             itest_int("SELECT COUNT(*) FROM processed_messages WHERE held_at IS NOT NULL"));
	cr_expect_eq(count(page, "inbox_released_total"),
	             itest_int("SELECT COUNT(*) FROM processed_messages WHERE held_at IS NOT NULL"
	                       " AND outcome <> 'held' AND COALESCE(reason, '') <> 'hold-expired'"));
	cr_expect_eq(count(page, "inbox_held_total"), 7);
	cr_expect_eq(itest_metric(page, "inbox_held_events"),
	             (double)itest_int("SELECT COUNT(*) FROM held_events"));
	cr_expect_eq(itest_metric(page, "inbox_held_oldest_seconds"), 0);
	/* Every delivery is decided once; nothing was redelivered or retried. */
	cr_expect_eq(count(page, "inbox_processing_seconds_count"), published);
	cr_expect_eq(count(page, "inbox_redelivered_total"), 0);
	cr_expect_eq(count(page, "inbox_db_retries_total"), 0, "no retry was allowed");
	cr_expect_eq(count(page, "inbox_reconnects_total{peer=\"amqp\"}"), 0);
	cr_expect_eq(count(page, "inbox_reconnects_total{peer=\"db\"}"), 0);
	cr_expect_eq(count(page, "inbox_outbox_pending"), itest_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL"));
	cr_expect_eq(count(page, "inbox_outbox_failed_total"), 0);
	cr_expect_eq(itest_metric(page, "inbox_outbox_oldest_pending_seconds"), 0);
	/* The process and the build. */
	cr_expect_eq(itest_metric(page, "inbox_thread_ready{thread=\"0\"}"), 1, "%s", page);
	cr_expect_not_null(strstr(page, "\ninbox_build_info{version=\""), "%s", page);
	cr_expect_gt(itest_metric(page, "process_cpu_seconds_total"), 0);
	cr_expect_gt(itest_metric(page, "process_resident_memory_bytes"), 1e6);
	cr_expect_gt(itest_metric(page, "process_open_fds"), 3);
	cr_expect_gt(itest_metric(page, "process_start_time_seconds"), 1.7e9);
	mq_close(&m);
	st = itest_stop(w, SIGTERM, 60);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit 0 (status %d)", st);
	/* The last line of the run says the same. */
	cr_expect_eq(itest_log_sum(logf, " stopped applied=", "dead_lettered"), ndead, "see %s", logf);
	cr_expect_eq(itest_log_sum(logf, " stopped applied=", "applied"),
	             itest_int("SELECT COUNT(*) FROM processed_messages WHERE outcome = 'applied'"), "see %s", logf);
	cr_expect_eq(itest_log_sum(logf, " stopped applied=", "held"), 7, "see %s", logf);
}

/* A batch that names an order another transaction holds is cut in two: the
 * rest settles at once, the held order's deliveries in a second
 * transaction that waits for it (worker.c, worker_settle_apart).  An
 * operator of a fleet sees how often that happens, and how many
 * deliveries it moved, by why: another transaction in the database (any
 * process), or another thread of this process (worker/inflight.h). */
Test(accounting, a_batch_split_by_an_order_held_elsewhere_is_counted, .timeout = 300)
{
	static char page[65536];
	char logf[256], name[96], body[512];
	struct db *holder = NULL;
	struct mq *m;
	pid_t w;
	int st;

	itest_fresh();
	holder = itest_hold_order("split-held");
	/* Both wait in the queue before the worker starts: one batch. */
	m = itest_mq();
	itest_event(body, sizeof body, "split-h1", "OrderCreated", "split-held");
	itest_publish(m, "OrderCreated", body, NULL);
	itest_event(body, sizeof body, "split-f1", "OrderCreated", "split-free");
	itest_publish(m, "OrderCreated", body, NULL);
	itest_log_path(logf, sizeof logf, "split-metrics");
	snprintf(name, sizeof name, "INBOX_METRICS_ADDR=127.0.0.1:%d", itest_metrics_port(0));
	w = itest_worker_logged(1, (const char *[]){ name, NULL }, logf);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages WHERE message_id = 'split-f1'", 1, 60), 1,
	             "the free order is settled while the other is held");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE message_id = 'split-h1'"), 0);
	cr_assert_eq(itest_wait_metric(itest_metrics_port(0), "inbox_batch_splits_total{by=\"database\"}", 1, 1, page,
	                               sizeof page, 30),
	             1, "%s", page);
	cr_expect_eq(itest_metric(page, "inbox_batch_split_deliveries_total{by=\"database\"}"), 1, "%s", page);
	cr_expect_eq(itest_metric(page, "inbox_batch_splits_total{by=\"thread\"}"), 0, "one thread: %s", page);
	cr_expect_eq(itest_metric(page, "inbox_batch_split_deliveries_total{by=\"thread\"}"), 0, "%s", page);
	/* Let go: the held order's delivery is settled in its own transaction. */
	db_rollback(holder);
	db_close(&holder);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages WHERE message_id = 'split-h1'", 1, 60), 1);
	mq_close(&m);
	st = itest_stop(w, SIGTERM, 60);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit 0 (status %d)", st);
}
