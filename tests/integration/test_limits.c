/*
 * test_limits.c - every limit agrees with the others (issue 22, items 2-5):
 * a batch larger than the server's max_allowed_packet is cut into requests
 * that fit, never sent whole (and so never read as an outage); an
 * INBOX_MAX_BODY the server's packet cannot carry is refused at start-up;
 * a database whose default character set is latin1 stores whatever the
 * worker accepts; and a prefetch above the old 512 deliveries keeps the
 * broker connection alive through a database outage.
 *
 * Tests that change a server setting restore it in their .fini, pass or
 * fail; new connections see a SET GLOBAL, so each starts its worker after.
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

/* A statement as the server's root (SET GLOBAL, ALTER DATABASE). */
static int root_sql(const char *sql)
{
	char root[4096], cmd[4600];
	snprintf(cmd, sizeof cmd, "%s sql -e \"%s\" >&2", itest_source("scripts/stack", root, sizeof root), sql);
	return system(cmd);
}

static void packet_restore(void)
{
	if (root_sql("SET GLOBAL max_allowed_packet = 16777216") != 0)
		fprintf(stderr, "test_limits: could not restore max_allowed_packet\n");
}

/* A valid event whose data carries pad bytes of filler: a large body. */
static char *big_event(const char *id, const char *type, const char *order, size_t pad)
{
	size_t cap = pad + 512;
	char *b = malloc(cap);
	int n;

	cr_assert_not_null(b);
	n = snprintf(b, cap,
	             "{\"message_id\":\"%s\",\"source\":\"itest\",\"type\":\"%s\",\"order_id\":\"%s\","
	             "\"data\":{\"amount_cents\":100,\"note\":\"",
	             id, type, order);
	cr_assert(n > 0 && (size_t)n + pad + 8 < cap);
	memset(b + n, 'x', pad);
	snprintf(b + n + pad, cap - (size_t)n - pad, "\"}}");
	return b;
}

/* Issue 22 item 2: 100 held payments of 150 KB with INBOX_MAX_BODY=256KiB
 * and one thread, against a server max_allowed_packet of 1 MiB: the batch's
 * write (30 MB of hex) used to go as one request, which the server
 * answered with 1153 or by dropping the connection mid-write, and the
 * worker, reading the latter as an outage, reconnected and sent it again,
 * hundreds of times.  Now the rows are cut into requests that fit: all 100
 * are held promptly with no database reconnect, and released whole when
 * their orders arrive. */
Test(limits, a_batch_larger_than_the_packet_is_cut_into_requests_that_fit, .timeout = 600, .fini = packet_restore)
{
	enum { N = 100, PAD = 150 * 1024 };
	static char page[65536];
	const int port = itest_metrics_port(0);
	char logf[256], addr[64], id[64], order[64], body[512];
	struct mq *m;
	pid_t w;
	int st;

	itest_fresh();
	cr_assert_eq(root_sql("SET GLOBAL max_allowed_packet = 1048576"), 0);
	m = itest_mq();
	for (int i = 0; i < N; i++) {
		char *b;

		snprintf(id, sizeof id, "big-pay-%d", i);
		snprintf(order, sizeof order, "o-big-%d", i);
		b = big_event(id, "PaymentAuthorized", order, PAD);
		itest_publish_async(m, "PaymentAuthorized", b, NULL);
		free(b);
	}
	itest_confirm_all(m);
	itest_log_path(logf, sizeof logf, "limits-packet");
	snprintf(addr, sizeof addr, "INBOX_METRICS_ADDR=127.0.0.1:%d", port);
	w = itest_worker_logged(1, (const char *[]){ "INBOX_MAX_BODY=262144", addr, NULL }, logf);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages WHERE outcome = 'held'", N, WAIT_S), N,
	             "every payment held (log %s)", logf);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM held_events WHERE LENGTH(body) > 150 * 1024"), N,
	             "each body stored whole");
	cr_assert_eq(itest_wait_http(port, "/metrics", 200, page, sizeof page, 30), 200);
	cr_assert_eq(itest_metric(page, "inbox_reconnects_total{peer=\"db\"}"), 0,
	             "no database reconnect: the requests fit the server's limit");
	cr_assert(!itest_log_has(logf, "database connection lost"), "never taken for an outage");
	/* Released whole: each order's arrival applies its payment. */
	for (int i = 0; i < N; i++) {
		snprintf(id, sizeof id, "big-create-%d", i);
		snprintf(order, sizeof order, "o-big-%d", i);
		itest_event(body, sizeof body, id, "OrderCreated", order);
		itest_publish_async(m, "OrderCreated", body, NULL);
	}
	itest_confirm_all(m);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM orders WHERE status = 'Paid'", N, WAIT_S), N,
	             "every held payment applied (log %s)", logf);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM held_events"), 0);
	cr_assert_eq(itest_wait_http(port, "/metrics", 200, page, sizeof page, 30), 200);
	cr_assert_eq(itest_metric(page, "inbox_reconnects_total{peer=\"db\"}"), 0);
	st = itest_stop(w, SIGTERM, 60);
	mq_close(&m);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	cr_assert_eq(itest_queue_depth(itest_cfg()->dlq), 0, "nothing dead-lettered");
}

/* Issue 22 item 3: an INBOX_MAX_BODY whose bodies cannot be held or
 * dead-lettered through the server's max_allowed_packet (a row carries the
 * body as hex) is refused at start-up with one line that names both
 * settings and the remedy, exit 2 (a configuration error: SPEC), instead
 * of dead-lettering valid messages as unprocessable later. */
Test(limits, a_max_body_the_packet_cannot_carry_is_refused_at_start, .timeout = 300, .fini = packet_restore)
{
	char logf[256];
	pid_t w;
	int st;

	itest_fresh();
	cr_assert_eq(root_sql("SET GLOBAL max_allowed_packet = 1048576"), 0);
	itest_log_path(logf, sizeof logf, "limits-refused");
	w = itest_worker_logged(1, (const char *[]){ "INBOX_MAX_BODY=600000", NULL }, logf);
	st = itest_wait_exit(w, 60);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "exit 2 for a configuration that cannot work (status %d, log %s)",
	          st, logf);
	cr_assert_eq(itest_log_count(logf, "INBOX_MAX_BODY=600000 needs the database's max_allowed_packet >="), 1,
	             "one line naming both settings (log %s)", logf);
	cr_assert(itest_log_has(logf, "lower INBOX_MAX_BODY to"), "and the remedy");
}

/* ... and the largest body that configuration accepts is held, and
 * dead-lettered whole when its hold expires. */
Test(limits, the_largest_accepted_body_is_held_and_dead_lettered, .timeout = 300, .fini = packet_restore)
{
	/* 1 MiB of packet carries a body of about 450 KB as hex beside the
	 * rest of its row (inbox_limits). */
	enum { MAX_BODY = 440000 };
	struct itest_dead dead[2];
	char logf[256], *b;
	struct mq *m;
	pid_t w;
	int st;

	itest_fresh();
	cr_assert_eq(root_sql("SET GLOBAL max_allowed_packet = 1048576"), 0);
	m = itest_mq();
	b = big_event("largest-1", "PaymentAuthorized", "o-largest", MAX_BODY - 200);
	cr_assert(strlen(b) <= MAX_BODY);
	itest_publish(m, "PaymentAuthorized", b, NULL);
	itest_log_path(logf, sizeof logf, "limits-largest");
	w = itest_worker_logged(1, (const char *[]){ "INBOX_MAX_BODY=440000", "INBOX_HOLD_TTL=2s", NULL }, logf);
	cr_assert_eq(itest_dlq_drain(dead, 2, 1, WAIT_S), 1, "dead-lettered when its hold expired (log %s)", logf);
	cr_assert_str_eq(dead[0].reason, "hold-expired", "detail: %s", dead[0].detail);
	cr_assert_eq(dead[0].len, strlen(b), "the body whole");
	cr_assert_eq(dead[0].body_hash, itest_hash(b, strlen(b)));
	st = itest_stop(w, SIGTERM, 60);
	mq_close(&m);
	free(b);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void latin1_restore(void)
{
	if (root_sql("ALTER DATABASE inbox DEFAULT CHARACTER SET utf8mb4") != 0)
		fprintf(stderr, "test_limits: could not restore the database's character set\n");
}

/* Issue 22 item 4: on a database whose default character set is latin1
 * (MariaDB's upstream default), a valid held payment with a header value
 * outside Latin-1 used to be refused ("Incorrect string value ... for
 * column held_events.props") and dead-lettered unprocessable.  The schema
 * says utf8mb4 itself now: it is held, released, and applied. */
Test(limits, a_latin1_database_stores_any_header, .timeout = 300, .fini = latin1_restore)
{
	char logf[256], body[512];
	struct mq_header h[1] = { { "x-note", "\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x93\xa6" } }; /* 日本 📦 */
	struct mq_message msg = { .routing_key = "order.PaymentAuthorized", .headers = h, .nheaders = 1 };
	char cs[64];
	struct mq *m;
	pid_t w;
	int st;

	cr_assert_eq(root_sql("ALTER DATABASE inbox DEFAULT CHARACTER SET latin1"), 0);
	itest_fresh(); /* the tables made anew, under latin1, then migrated */
	cr_assert(itest_str1("SELECT DEFAULT_CHARACTER_SET_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?",
	                     "inbox", cs, sizeof cs));
	cr_assert_str_eq(cs, "latin1", "the database's default is latin1");
	/* 0002 made its text columns in the default (latin1); 0015 converts
	 * them: no text column of ours is in anything but ascii or utf8mb4. */
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()"
	                       " AND CHARACTER_SET_NAME IS NOT NULL AND CHARACTER_SET_NAME NOT IN ('ascii', 'utf8mb4')"),
	             0, "every text column says its character set");
	m = itest_mq();
	itest_event(body, sizeof body, "latin1-pay", "PaymentAuthorized", "o-latin1");
	msg.exchange = itest_cfg()->exchange;
	msg.body = body;
	msg.len = strlen(body);
	cr_assert_eq(mq_publish_confirmed(m, &msg, 30000), ST_OK, "publish: %s", mq_errmsg(m));
	itest_log_path(logf, sizeof logf, "limits-latin1");
	w = itest_worker_logged(1, NULL, logf);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM held_events", 1, WAIT_S), 1, "held (log %s)", logf);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM held_events WHERE props LIKE '%\xe6\x97\xa5\xe6\x9c\xac%'"), 1,
	             "the header kept as it came");
	itest_event(body, sizeof body, "latin1-create", "OrderCreated", "o-latin1");
	itest_publish(m, "OrderCreated", body, NULL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM orders WHERE id = 'o-latin1' AND status = 'Paid'", 1, WAIT_S), 1,
	             "released and applied (log %s)", logf);
	st = itest_stop(w, SIGTERM, 60);
	mq_close(&m);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	cr_assert_eq(itest_queue_depth(itest_cfg()->dlq), 0, "nothing dead-lettered");
}

/* Issue 22 item 5: with INBOX_PREFETCH above 512 (the configuration
 * accepts up to 65535) a thread that waited out a database outage ran out
 * of room for the deliveries it puts aside, slept instead of servicing
 * the connection, missed heartbeats, and the broker reset it, handing every
 * delivery back with a raised delivery count.  The room now grows to the
 * prefetch: with a delivery limit of 1 any redelivery would reach the DLQ. */
Test(limits, a_prefetch_over_512_keeps_the_broker_connection_through_an_outage, .timeout = 600)
{
	enum { N = 1200 };
	char logf[256];
	struct mq *m;
	pid_t w;
	int st;

	cr_assert_eq(setenv("INBOX_DELIVERY_LIMIT", "1", 1), 0);
	itest_fresh();
	itest_log_path(logf, sizeof logf, "limits-prefetch");
	w = itest_worker_logged(1, (const char *[]){ "INBOX_HEARTBEAT=2", "INBOX_PREFETCH=1000", NULL }, logf);
	m = itest_mq();
	/* Connected to both (the database first), then the outage. */
	itest_wait_log(logf, " consuming worker=", 60);
	itest_stack("stop-db");
	itest_publish_orders(m, "pf", 0, N);
	/* The worker takes its prefetch (1,000 of the 1,200) and holds it. */
	cr_assert_eq(itest_wait_depth(itest_cfg()->queue, N - 1000, 60), N - 1000,
	             "the worker must have taken a whole prefetch");
	/* The outage itself: five heartbeat intervals from the moment the
	 * worker saw it (the broker drops a connection silent for two). */
	itest_wait_log(logf, "database unavailable", 60);
	sleep(10);
	itest_stack("start-db");
	itest_assert_each_applied_once("pf", N, WAIT_S);
	st = itest_stop(w, SIGTERM, 60);
	mq_close(&m);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	cr_assert(!itest_log_has(logf, "broker connection reset"), "the consumer connection was dropped (log %s)", logf);
	cr_assert_eq(itest_log_count(logf, " consuming worker="), 1, "one consume, never a second");
	cr_assert_eq(itest_log_sum(logf, "stopped", "redelivered"), 0, "no delivery was returned to the queue");
	cr_assert_eq(itest_queue_depth(itest_cfg()->dlq), 0, "no delivery count reached the limit");
}
