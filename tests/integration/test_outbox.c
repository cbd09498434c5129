/*
 * test_outbox.c - the outbox relay against the real stack: each row is
 * settled on its own.  A dead-letter copy that cannot be routed (the DLQ
 * unbound from the DLX) or a row the broker refuses stays pending with its
 * attempts counted while the rows beside it are published exactly once and
 * marked sent; a stored body longer than today's INBOX_MAX_BODY is still
 * relayed; the failures and the age of the oldest pending row are on
 * /metrics; two processes never publish a row twice.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"
#include "outbox.h"
#include "status.h"

#define WAIT_S 120

static void publish_event(struct mq *m, const char *id, const char *type, const char *order)
{
	char body[512];

	itest_event(body, sizeof body, id, type, order);
	itest_publish(m, type, body, NULL);
}

/* An outbox row written directly, as a worker of another configuration (or
 * an older version) may have left it.  headers may be NULL. */
static void insert_row(const char *message_id, const char *exchange, const char *rk, const char *headers,
                       const void *body, size_t len, int age_s)
{
	struct db *d = itest_db();
	struct db_stmt *ins;
	struct db_param p[] = {
		DBP_STR(message_id), DBP_STR(exchange), DBP_STR(rk), DBP_STR("Test"), DBP_STR("o-direct"),
		headers ? DBP_STR(headers) : DBP_NULL(), DBP_BLOB(body, len), DBP_I64(age_s),
	};

	cr_assert_eq(db_prepare(d, &ins, "INSERT INTO outbox (message_id, exchange, routing_key, type, order_id,"
	                                 " headers, body, created_at) VALUES (?, ?, ?, ?, ?, ?, ?,"
	                                 " NOW(6) - INTERVAL ? SECOND)"),
	             ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_stmt_exec(ins, p, ARRAY_LEN(p), NULL), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_commit(d), ST_OK);
}

static int count_id(const struct itest_dead *g, int n, const char *id)
{
	int c = 0;

	for (int i = 0; i < n; i++)
		c += strcmp(g[i].message_id, id) == 0;
	return c;
}

static void dlq_unbind(void)
{
	struct mq *m = itest_mq();

	cr_assert_eq(mq_queue_unbind(m, itest_cfg()->dlq, itest_cfg()->dlx, "#"), ST_OK, "%s", mq_errmsg(m));
	mq_close(&m);
}

static void dlq_rebind(void)
{
	struct mq *m = itest_mq();

	cr_assert_eq(mq_queue_declare_bind(m, itest_cfg()->dlq, itest_cfg()->dlx, "#", true), ST_OK, "%s",
	             mq_errmsg(m));
	mq_close(&m);
}

/* The same with either dispatch: with the committing thread's, its failed
 * publish leaves the row to the sweep (after INBOX_OUTBOX_SWEEP, 1 s here),
 * which retries it as the relay would. */
static void unroutable_dead_letter(const char *const *env, const char *logname)
{
	const char *out = "itest.outbox.out";
	struct itest_dead got[64];
	struct itest_dead dead[4];
	char logf[256];
	struct mq *m;
	pid_t w;
	int n;

	itest_fresh();
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	itest_log_path(logf, sizeof logf, logname);
	w = itest_worker_logged(1, env, logf);
	m = itest_mq();
	/* o-ship goes all the way to Shipped (emitting OrderPaid)... */
	publish_event(m, "ship-1", "OrderCreated", "o-ship");
	publish_event(m, "ship-2", "PaymentAuthorized", "o-ship");
	publish_event(m, "ship-3", "InventoryReserved", "o-ship");
	publish_event(m, "ship-4", "ShipmentCreated", "o-ship");
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", 4, WAIT_S), 4);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL", 0, WAIT_S), 0);
	/* ...then, with nothing bound to the DLX, its cancellation is too late:
	 * the dead-letter copy in the outbox cannot be routed. */
	dlq_unbind();
	publish_event(m, "ship-5", "OrderCancelled", "o-ship");
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE message_id = 'ship-5'", 1, WAIT_S), 1);
	/* A paid order cancelled behind it: OrderPaid and RefundRequested. */
	publish_event(m, "ref-1", "OrderCreated", "o-ref");
	publish_event(m, "ref-2", "PaymentAuthorized", "o-ref");
	publish_event(m, "ref-3", "OrderCancelled", "o-ref");
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE message_id = 'RefundRequested:o-ref'"
	                            " AND sent_at IS NOT NULL",
	                            1, 60),
	             1, "the row behind the unroutable one must be published and marked sent");
	/* Several more relay rounds pass over the failing row... */
	cr_assert_geq(itest_wait_int("SELECT LEAST(attempts, 3) FROM outbox WHERE message_id = 'ship-5'", 3, WAIT_S), 3,
	              "the unroutable row is retried");
	/* ...and none of them publishes the rows beside it again. */
	n = itest_drain(out, got, 64, 3, WAIT_S);
	cr_assert_eq(count_id(got, n, "RefundRequested:o-ref"), 1, "RefundRequested exactly once (%d messages)", n);
	cr_assert_eq(count_id(got, n, "OrderPaid:o-ref"), 1);
	cr_assert_eq(count_id(got, n, "OrderPaid:o-ship"), 1);
	cr_assert_eq(n, 3);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE message_id = 'ship-5' AND sent_at IS NULL"), 1,
	             "the dead-letter copy stays pending");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL"), 1, "every other row is sent");
	cr_assert_eq(itest_queue_depth(itest_cfg()->dlq), 0);

	/* The DLQ bound again: the copy lands there once, and nothing is left. */
	dlq_rebind();
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL", 0, WAIT_S), 0);
	cr_assert_eq(itest_dlq_drain(dead, 4, 1, WAIT_S), 1, "exactly one copy in the DLQ");
	cr_assert_str_eq(dead[0].message_id, "ship-5");
	cr_assert_str_eq(dead[0].reason, "invalid-transition");
	cr_assert_eq(itest_drain(out, got, 64, 0, 0), 0, "nothing more on orders.out");
	itest_stop_ok(w);
	mq_close(&m);
	/* One line when the row started failing and one when it recovered, not
	 * one per retry. */
	cr_assert_eq(itest_log_lines(logf, (const char *const[]){ "outbox row failing", "message_id=ship-5", NULL }), 1);
	cr_assert_eq(itest_log_lines(logf, (const char *const[]){ "outbox row recovered", "message_id=ship-5", NULL }), 1);
}

Test(outbox, unroutable_dead_letter_holds_back_no_other_row, .timeout = 600)
{
	unroutable_dead_letter((const char *[]){ "INBOX_OUTBOX_DISPATCH=relay", NULL }, "outbox-unroutable-relay");
}

Test(outbox, unroutable_dead_letter_holds_back_no_other_row_with_thread_dispatch, .timeout = 600)
{
	unroutable_dead_letter((const char *[]){ "INBOX_OUTBOX_DISPATCH=thread", "INBOX_OUTBOX_SWEEP=1s", NULL },
	                       "outbox-unroutable-thread");
}

Test(outbox, unpublishable_rows_are_retried_alone, .timeout = 600)
{
	const char *out = "itest.outbox.out";
	const char *ok_body = "{\"ok\":1}";
	struct itest_dead got[16];
	char logf[256], why[256];
	pid_t w;
	int n;

	itest_fresh();
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	/* Stored headers that are not a JSON object of strings, a row for an
	 * exchange that does not exist (the broker closes the channel), and
	 * good rows before, between and after them. */
	insert_row("good-1", itest_cfg()->out_exchange, "order.Test", NULL, ok_body, strlen(ok_body), 0);
	insert_row("bad-headers", itest_cfg()->out_exchange, "order.Test", "not json", ok_body, strlen(ok_body), 0);
	insert_row("good-2", itest_cfg()->out_exchange, "order.Test", NULL, ok_body, strlen(ok_body), 0);
	insert_row("no-exchange", "itest.no.such.exchange", "order.Test", NULL, ok_body, strlen(ok_body), 0);
	insert_row("good-3", itest_cfg()->out_exchange, "order.Test", "{\"x-extra\":\"1\"}", ok_body,
	           strlen(ok_body), 0);
	itest_log_path(logf, sizeof logf, "outbox-unpublishable");
	w = itest_worker_logged(1, NULL, logf);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE message_id LIKE 'good-%'"
	                            " AND sent_at IS NOT NULL",
	                            3, 60),
	             3, "the good rows are published whatever their neighbours");
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE message_id IN ('bad-headers', 'no-exchange')"
	                            " AND sent_at IS NULL AND attempts >= 2",
	                            2, WAIT_S),
	             2, "the bad rows stay pending and are retried");
	n = itest_drain(out, got, 16, 3, WAIT_S);
	itest_stop_ok(w);
	cr_assert_eq(n, 3, "each good row once");
	for (int i = 1; i <= 3; i++) {
		char id[16];
		snprintf(id, sizeof id, "good-%d", i);
		cr_assert_eq(count_id(got, n, id), 1, "%s once", id);
	}
	cr_assert(itest_str1("SELECT last_error FROM outbox WHERE message_id = ?", "bad-headers", why, sizeof why));
	cr_assert_neq(strstr(why, "headers"), NULL, "the row says why: %s", why);
	cr_assert(itest_str1("SELECT last_error FROM outbox WHERE message_id = ?", "no-exchange", why, sizeof why));
	cr_assert_neq(strstr(why, "itest.no.such.exchange"), NULL, "the row says why: %s", why);
	cr_assert_eq(itest_log_lines(logf, (const char *const[]){ "outbox row failing", "message_id=bad-headers", NULL }), 1);
	cr_assert_eq(itest_log_lines(logf, (const char *const[]){ "outbox row failing", "message_id=no-exchange", NULL }), 1);
}

Test(outbox, body_longer_than_a_lowered_max_body_is_relayed, .timeout = 600)
{
	const char *out = "itest.outbox.out";
	enum { BIG = 300000 };
	struct itest_dead got[8];
	char *big = malloc(BIG);
	char *headers = malloc(40000);
	const char *small = "{\"small\":1}";
	pid_t w;
	int n;

	cr_assert_not_null(big);
	cr_assert_not_null(headers);
	for (size_t i = 0; i < BIG; i++)
		big[i] = (char)('a' + i % 26);
	/* A header value longer than INBOX_MAX_BODY too. */
	snprintf(headers, 40000, "{\"x-long\":\"%0*d\"}", 30000, 7);
	itest_fresh();
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	/* Written under a larger INBOX_MAX_BODY than the worker now runs with. */
	insert_row("big-1", itest_cfg()->out_exchange, "order.Test", NULL, big, BIG, 0);
	insert_row("big-2", itest_cfg()->out_exchange, "order.Test", headers, small, strlen(small), 0);
	insert_row("small-1", itest_cfg()->out_exchange, "order.Test", NULL, small, strlen(small), 0);
	w = itest_worker(1, (const char *[]){ "INBOX_MAX_BODY=1024", NULL });
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL", 0, 60), 0,
	             "every row is relayed");
	n = itest_drain(out, got, 8, 3, WAIT_S);
	itest_stop_ok(w);
	cr_assert_eq(n, 3);
	for (int i = 0; i < n; i++)
		if (strcmp(got[i].message_id, "big-1") == 0)
			cr_assert_eq(got[i].len, (size_t)BIG, "the whole body");
	cr_assert_eq(count_id(got, n, "big-1"), 1);
	cr_assert_eq(count_id(got, n, "big-2"), 1);
	cr_assert_eq(count_id(got, n, "small-1"), 1);
	free(big);
	free(headers);
}

Test(outbox, failures_and_oldest_pending_on_metrics, .timeout = 600)
{
	const char *body = "{\"dead\":1}";
	char addr[64], env_addr[96];
	static char page[65536];
	int port = itest_free_port(), code = 0;
	double v;
	pid_t w;

	snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
	snprintf(env_addr, sizeof env_addr, "INBOX_METRICS_ADDR=%s", addr);
	itest_fresh();
	w = itest_worker(1, (const char *[]){ env_addr, NULL });
	/* Ready: the worker has declared (and bound) the topology; unbind the
	 * DLQ after that. */
	code = itest_wait_http(port, "/readyz", 200, page, sizeof page, 60);
	cr_assert_eq(code, 200);
	dlq_unbind();
	/* A dead-letter copy written 30 s ago that cannot be routed now. */
	insert_row("dead-1", itest_cfg()->dlx, "order.Test", "{\"x-inbox-reason\":\"invalid-transition\"}", body,
	           strlen(body), 30);
	cr_assert_eq(itest_wait_int("SELECT LEAST(attempts, 2) FROM outbox WHERE message_id = 'dead-1'", 2, WAIT_S), 2);
	v = itest_wait_metric(port, "inbox_outbox_failed_total", 2, 1e9, page, sizeof page, 60);
	cr_assert_geq(v, 2, "every failed attempt counts (got %g)", v);
	v = itest_wait_metric(port, "inbox_outbox_oldest_pending_seconds", 30, 3600, page, sizeof page, 60);
	cr_assert(v >= 30 && v < 3600, "the row's age: %g s", v);
	v = itest_wait_metric(port, "inbox_outbox_pending", 1, 1, page, sizeof page, 60);
	cr_assert_eq(v, 1);
	dlq_rebind();
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL", 0, WAIT_S), 0);
	v = itest_wait_metric(port, "inbox_outbox_oldest_pending_seconds", 0, 0, page, sizeof page, 60);
	cr_assert_eq(v, 0, "nothing pending, no age (got %g)", v);
	itest_stop_ok(w);
	cr_assert_eq(itest_queue_depth(itest_cfg()->dlq), 1);
}

/* Not a defect fixed here but the property per-row settlement must keep:
 * several relays share the rows and never publish one twice. */
Test(outbox, two_processes_publish_each_row_once, .timeout = 600)
{
	enum { ROWS = 400 };
	const char *out = "itest.outbox.out";
	static struct itest_dead got[ROWS + 50];
	char id[32];
	pid_t w[2];
	int n;

	itest_fresh();
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	for (int i = 0; i < ROWS; i++) {
		snprintf(id, sizeof id, "many-%d", i);
		insert_row(id, itest_cfg()->out_exchange, "order.Test", NULL, id, strlen(id), 0);
	}
	w[0] = itest_worker(1, NULL);
	w[1] = itest_worker(1, NULL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL", 0, WAIT_S), 0);
	n = itest_drain(out, got, ROWS + 50, ROWS, WAIT_S);
	itest_stop_ok(w[0]);
	itest_stop_ok(w[1]);
	cr_assert_eq(n, ROWS, "each row once: %d messages for %d rows", n, ROWS);
	for (int i = 0; i < ROWS; i++) {
		snprintf(id, sizeof id, "many-%d", i);
		cr_assert_eq(count_id(got, n, id), 1, "%s", id);
	}
}

/* ---- outbox_ directly: one relay round at a time, no worker ---------------- */

struct relay {
	struct db *db;
	struct outbox *ob;
	struct mq *pub;
};

/* An outbox on a connection of the worker's account and a confirmed
 * publisher (topology declared), as a worker's janitor has them. */
static void relay_open(struct relay *x)
{
	memset(x, 0, sizeof *x);
	cr_assert_eq(db_open(&x->db, &itest_cfg()->db), ST_OK);
	cr_assert_eq(outbox_open(&x->ob, x->db, itest_cfg()), ST_OK, "%s", db_errmsg(x->db));
	x->pub = itest_mq();
}

static void relay_close(struct relay *x)
{
	outbox_close(&x->ob);
	cr_assert_null(x->ob, "outbox_close clears the pointer");
	outbox_close(&x->ob); /* and takes NULL */
	mq_close(&x->pub);
	db_close(&x->db);
}

static struct outbox_round round_of(struct relay *x, int limit)
{
	struct outbox_round r;

	cr_assert_eq(outbox_relay(x->ob, x->pub, limit, &r), ST_OK, "%s", db_errmsg(x->db));
	return r;
}

/* A round publishes the pending rows with their message ids, marks each
 * sent, and says so in its counts; outbox_stats counts them before and
 * not after; a second round finds nothing and publishes nothing again. */
Test(outbox, relay_round_publishes_marks_sent_and_counts, .timeout = 120)
{
	const char *out = "itest.outbox.direct";
	const char *body = "{\"direct\":1}";
	struct itest_dead got[8];
	struct outbox_round r;
	struct relay x;
	int64_t pending = -1;
	double oldest = -1;

	itest_fresh();
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	insert_row("d-1", itest_cfg()->out_exchange, "order.Test", NULL, body, strlen(body), 20);
	insert_row("d-2", itest_cfg()->out_exchange, "order.Test", "{\"x-extra\":\"2\"}", body, strlen(body), 0);
	insert_row("d-3", itest_cfg()->out_exchange, "order.Test", NULL, body, strlen(body), 0);
	relay_open(&x);
	cr_assert_eq(outbox_stats(x.ob, &pending, &oldest), ST_OK, "%s", db_errmsg(x.db));
	cr_assert_eq(pending, 3);
	cr_assert(oldest >= 20 && oldest < 3600, "the oldest row's age: %g s", oldest);
	r = round_of(&x, 64);
	cr_assert_eq(r.taken, 3);
	cr_assert_eq(r.sent, 3);
	cr_assert_eq(r.failed, 0);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NOT NULL AND leased_until IS NULL"
	                       " AND attempts = 0"),
	             3, "each row marked sent, its lease cleared");
	cr_assert_eq(outbox_stats(x.ob, &pending, &oldest), ST_OK);
	cr_assert_eq(pending, 0);
	cr_assert_eq(oldest, 0);
	r = round_of(&x, 64);
	cr_assert_eq(r.taken, 0, "nothing left to take");
	relay_close(&x);
	cr_assert_eq(itest_drain(out, got, 8, 3, 30), 3);
	cr_assert_eq(count_id(got, 3, "d-1") + count_id(got, 3, "d-2") + count_id(got, 3, "d-3"), 3,
	             "each row once, under its message id");
	cr_assert_eq(got[0].len, strlen(body));
}

/* n pending rows <prefix>-0 .. <prefix>-(n-1) for the out exchange, and a
 * queue bound to catch what is published. */
static void seed_rows(const char *out, const char *prefix, int n)
{
	const char *body = "{\"direct\":1}";
	char id[32];

	itest_fresh();
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	for (int i = 0; i < n; i++) {
		snprintf(id, sizeof id, "%s-%d", prefix, i);
		insert_row(id, itest_cfg()->out_exchange, "order.Test", NULL, body, strlen(body), 0);
	}
}

/* Exactly the n seeded rows reached out, each once, in id order. */
static void assert_published_in_order(const char *out, const char *prefix, int n)
{
	struct itest_dead got[8];
	char id[32];

	cr_assert(n <= 8);
	cr_assert_eq(itest_drain(out, got, 8, n, 30), n, "%d rows, %d messages", n, n);
	for (int i = 0; i < n; i++) {
		snprintf(id, sizeof id, "%s-%d", prefix, i);
		cr_assert_str_eq(got[i].message_id, id, "each once, in id order");
	}
}

/* limit bounds a round; what it leaves waits for the next, oldest id
 * first, and no row is taken by two rounds. */
Test(outbox, limit_bounds_a_round_in_id_order, .timeout = 120)
{
	const char *out = "itest.outbox.direct";
	struct outbox_round r;
	struct relay x;

	seed_rows(out, "l", 5);
	relay_open(&x);
	for (int i = 0; i < 3; i++) {
		int want = i < 2 ? 2 : 1;

		r = round_of(&x, 2);
		cr_assert_eq(r.taken, want, "round %d", i);
		cr_assert_eq(r.sent, want, "round %d", i);
	}
	cr_assert_eq(round_of(&x, 2).taken, 0);
	relay_close(&x);
	assert_published_in_order(out, "l", 5);
}

/* A round whose time is up publishes nothing more (but always one row)
 * and gives back the lease of the rows it did not publish, at once: a
 * round that went on past its lease would publish rows another relay has
 * taken meanwhile (the cluster suite once saw 664 messages for 600 rows).
 * With a budget of 0 each round publishes exactly one row. */
Test(outbox, a_round_past_its_budget_stops_and_gives_back_the_rest, .timeout = 120)
{
	const char *out = "itest.outbox.direct";
	struct outbox_round r;
	struct relay x;

	seed_rows(out, "b", 3);
	relay_open(&x);
	outbox_set_round_budget(x.ob, 0);
	r = round_of(&x, 64);
	cr_assert_eq(r.sent, 1, "one row, then the budget is spent");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL AND leased_until IS NULL"), 2,
	             "the two rows not published are free again at once, not left leased");
	cr_assert_eq(round_of(&x, 64).sent, 1);
	cr_assert_eq(round_of(&x, 64).sent, 1);
	cr_assert_eq(round_of(&x, 64).taken, 0);
	relay_close(&x);
	assert_published_in_order(out, "b", 3);
}

/* A row under another relay's lease is left alone until the lease runs
 * out; then it is taken. */
Test(outbox, a_leased_row_is_left_to_its_relay_until_the_lease_ends, .timeout = 120)
{
	const char *out = "itest.outbox.direct";
	const char *body = "{\"direct\":1}";
	struct itest_dead got[4];
	struct relay x;
	struct db *d;

	itest_fresh();
	d = itest_db();
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	insert_row("leased-1", itest_cfg()->out_exchange, "order.Test", NULL, body, strlen(body), 0);
	cr_assert_eq(db_exec(d, "UPDATE outbox SET leased_until = NOW(6) + INTERVAL 1 HOUR"), ST_OK);
	cr_assert_eq(db_commit(d), ST_OK);
	relay_open(&x);
	cr_assert_eq(round_of(&x, 64).taken, 0, "another relay's lease is respected");
	cr_assert_eq(itest_drain(out, got, 4, 0, 0), 0, "nothing published");
	cr_assert_eq(db_exec(d, "UPDATE outbox SET leased_until = NOW(6) - INTERVAL 1 SECOND"), ST_OK);
	cr_assert_eq(db_commit(d), ST_OK);
	cr_assert_eq(round_of(&x, 64).sent, 1, "a lease that ran out is taken over");
	relay_close(&x);
	cr_assert_eq(itest_drain(out, got, 4, 1, 30), 1);
	cr_assert_str_eq(got[0].message_id, "leased-1");
}

/* A row that cannot be published (stored headers that are not a JSON
 * object) fails alone: attempts + 1, a backoff and the reason on the row,
 * counted as failed, while the row beside it is sent; the next round does
 * not take it before its backoff runs out. */
Test(outbox, an_unpublishable_row_fails_alone_with_its_backoff, .timeout = 120)
{
	const char *out = "itest.outbox.direct";
	const char *body = "{\"direct\":1}";
	struct itest_dead got[4];
	struct outbox_round r;
	struct relay x;
	char why[256];

	itest_fresh();
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	insert_row("bad-1", itest_cfg()->out_exchange, "order.Test", "[1, 2]", body, strlen(body), 0);
	insert_row("good-1", itest_cfg()->out_exchange, "order.Test", NULL, body, strlen(body), 0);
	relay_open(&x);
	r = round_of(&x, 64);
	cr_assert_eq(r.taken, 2);
	cr_assert_eq(r.sent, 1);
	cr_assert_eq(r.failed, 1);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE message_id = 'bad-1' AND sent_at IS NULL"
	                       " AND attempts = 1 AND next_attempt_at > NOW(6) AND leased_until IS NULL"),
	             1, "attempts + 1, a backoff, no lease");
	cr_assert(itest_str1("SELECT last_error FROM outbox WHERE message_id = ?", "bad-1", why, sizeof why));
	cr_assert_neq(why[0], '\0', "the reason is kept on the row");
	cr_assert_eq(round_of(&x, 64).taken, 0, "not retried before its backoff ends");
	relay_close(&x);
	cr_assert_eq(itest_drain(out, got, 4, 1, 30), 1);
	cr_assert_str_eq(got[0].message_id, "good-1");
}

/* ---- dispatched from memory (issue 25) ------------------------------------ */

/* OrderPaid, emitted by the PaymentAuthorized's transaction, is published
 * by the thread that committed it, right after the commit, and marked sent
 * by it; the relay would take the row only after an hour
 * (INBOX_OUTBOX_SWEEP), so whatever reaches the queue the thread sent, and
 * once. */
Test(outbox, emitted_events_are_published_once_by_the_committing_thread, .timeout = 300)
{
	const char *out = "itest.outbox.mem";
	static struct itest_dead got[8];
	static char page[65536];
	char env_addr[96];
	int port = itest_metrics_port(0), n;
	struct mq *m;
	pid_t w;

	snprintf(env_addr, sizeof env_addr, "INBOX_METRICS_ADDR=127.0.0.1:%d", port);
	itest_fresh();
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	w = itest_worker(1, (const char *[]){ env_addr, "INBOX_OUTBOX_DISPATCH=thread", "INBOX_OUTBOX_SWEEP=1h", NULL });
	m = itest_mq();
	publish_event(m, "mem-c", "OrderCreated", "o-mem");
	publish_event(m, "mem-p", "PaymentAuthorized", "o-mem");
	n = itest_drain(out, got, 8, 1, WAIT_S);
	cr_assert_eq(n, 1, "%d messages", n);
	cr_assert_str_eq(got[0].message_id, "OrderPaid:o-mem");
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL", 0, WAIT_S), 0,
	             "the thread marks what it published");
	cr_assert_eq(itest_wait_metric(port, "inbox_outbox_dispatched_total", 1, 1, page, sizeof page, WAIT_S), 1,
	             "published by the committing thread: %s", page);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE message_id = 'OrderPaid:o-mem' AND sent_at IS NOT NULL"),
	             1);
	cr_assert_eq(itest_drain(out, got, 8, 0, 0), 0, "nothing more on the queue");
}

/* Many transactions' copies in flight at once: each thread publishes a
 * batch's events after its commit and reads their confirms while its next
 * batches run (common/outbox_dispatch.c, outbox_dispatcher_poll).  300 orders paid,
 * two threads, batches of 8: every OrderPaid reaches the queue once, every
 * row is marked sent by the thread that published it (the relay would
 * wait an hour), and the dispatched count is the rows'. */
Test(outbox, pipelined_dispatch_publishes_and_marks_every_row_once, .timeout = 300)
{
	enum { ORDERS = 300 };
	const char *out = "itest.outbox.pipe";
	static char page[65536];
	char env_addr[96], id[32], order[32];
	int port = itest_metrics_port(0);
	struct mq *m;
	pid_t w;

	snprintf(env_addr, sizeof env_addr, "INBOX_METRICS_ADDR=127.0.0.1:%d", port);
	itest_fresh();
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	m = itest_mq();
	for (int i = 0; i < ORDERS; i++) {
		snprintf(order, sizeof order, "o-pipe-%d", i);
		snprintf(id, sizeof id, "pipe-c-%d", i);
		publish_event(m, id, "OrderCreated", order);
		snprintf(id, sizeof id, "pipe-p-%d", i);
		publish_event(m, id, "PaymentAuthorized", order);
	}
	w = itest_worker(2, (const char *[]){ env_addr, "INBOX_OUTBOX_DISPATCH=thread", "INBOX_OUTBOX_SWEEP=1h",
	                                      "INBOX_BATCH=8", NULL });
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE type = 'OrderPaid' AND sent_at IS NOT NULL",
	                            ORDERS, WAIT_S),
	             ORDERS, "every row marked sent by its thread");
	cr_assert_eq(itest_wait_metric(port, "inbox_outbox_dispatched_total", ORDERS, ORDERS, page, sizeof page, WAIT_S),
	             ORDERS, "all published by the committing threads: %s", page);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_eq(itest_queue_depth(out), ORDERS, "each OrderPaid once");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL"), 0);
	itest_delete_queue(out);
}

/* With the default batch and prefetch (100 of 200), a thread draining a
 * backlog owes half its window after every full batch.  Flushing those acks
 * must not make it wait for its outbox copies' confirms and write their
 * marks in a transaction of their own: that is the idle path, and taking it
 * after every batch undid the pipelining (one wait and one extra commit a
 * batch).  It waits only when it finds nothing to do, or when its window is
 * full: 8 transactions, or 128 copies, unconfirmed.  The backlog keeps the
 * window from filling on the count of copies (about 9 a batch, 22 batches:
 * OrderCreated, and a PaymentAuthorized for every tenth order 9 messages
 * behind it), so that a slow broker can make the thread wait only when 8
 * batches in a row are unconfirmed, a few times in the run at most, where
 * a wait a batch is 22.  (With 100 copies a batch, one batch unconfirmed
 * fills the window: the waits then count the broker's speed.) */
Test(outbox, a_thread_draining_a_backlog_does_not_wait_for_its_confirms, .timeout = 300)
{
	enum { ORDERS = 2000, PAID = ORDERS / 10, BATCHES = (ORDERS + PAID) / 100 };
	const char *out = "itest.outbox.nowait";
	static char page[65536];
	char env_addr[96], id[32], order[32];
	int port = itest_metrics_port(0);
	double waits;
	struct mq *m;
	pid_t w;

	snprintf(env_addr, sizeof env_addr, "INBOX_METRICS_ADDR=127.0.0.1:%d", port);
	itest_fresh();
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	m = itest_mq();
	for (int i = 0; i < ORDERS; i++) {
		snprintf(order, sizeof order, "o-nowait-%d", i);
		snprintf(id, sizeof id, "nowait-c-%d", i);
		publish_event(m, id, "OrderCreated", order);
		if (i % 10 == 9) {
			snprintf(order, sizeof order, "o-nowait-%d", i - 9);
			snprintf(id, sizeof id, "nowait-p-%d", i - 9);
			publish_event(m, id, "PaymentAuthorized", order);
		}
	}
	w = itest_worker(1, (const char *[]){ env_addr, "INBOX_OUTBOX_DISPATCH=thread", "INBOX_OUTBOX_SWEEP=1h",
	                                      "INBOX_BATCH=100", "INBOX_PREFETCH=200", NULL });
	cr_assert_eq(itest_wait_metric(port, "inbox_outbox_dispatched_total", PAID, PAID, page, sizeof page, WAIT_S),
	             PAID, "all published by the committing thread: %s", page);
	waits = itest_metric(page, "inbox_outbox_confirm_waits_total");
	cr_assert(waits >= 0 && waits <= BATCHES / 4, "the thread waited for its confirms %.0f times in a backlog of %d batches",
	          waits, BATCHES);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_eq(itest_queue_depth(out), PAID, "each OrderPaid once");
	itest_delete_queue(out);
}

/* Light traffic: the thread runs out of work after every batch while its
 * outbox copies are still unconfirmed (a persistent copy is confirmed once
 * the broker has written it).  It reads their confirms between looks for
 * deliveries instead of stopping for them: under a steady trickle, a wait
 * there was added to every message behind it. */
Test(outbox, an_idle_thread_reads_its_confirms_without_waiting_for_them, .timeout = 300)
{
	enum { ORDERS = 20 };
	const char *out = "itest.outbox.idle";
	static char page[65536];
	char env_addr[96], id[32], order[32];
	int port = itest_metrics_port(0);
	double waits;
	struct mq *m;
	pid_t w;

	snprintf(env_addr, sizeof env_addr, "INBOX_METRICS_ADDR=127.0.0.1:%d", port);
	itest_fresh();
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	m = itest_mq();
	w = itest_worker(1, (const char *[]){ env_addr, "INBOX_OUTBOX_DISPATCH=thread", "INBOX_OUTBOX_SWEEP=1h", NULL });
	for (int i = 0; i < ORDERS; i++) {
		snprintf(order, sizeof order, "o-idle-%d", i);
		snprintf(id, sizeof id, "idle-c-%d", i);
		publish_event(m, id, "OrderCreated", order);
		snprintf(id, sizeof id, "idle-p-%d", i);
		publish_event(m, id, "PaymentAuthorized", order);
		cr_assert_eq(itest_wait_metric(port, "inbox_outbox_dispatched_total", i + 1, i + 1, page, sizeof page, WAIT_S),
		             i + 1, "order %d's OrderPaid published by its thread: %s", i, page);
	}
	waits = itest_metric(page, "inbox_outbox_confirm_waits_total");
	cr_assert_eq(waits, 0, "the idle thread stopped for its confirms %.0f times in %d orders", waits, ORDERS);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NOT NULL", ORDERS, WAIT_S), ORDERS,
	             "every row marked sent");
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_eq(itest_queue_depth(out), ORDERS, "each OrderPaid once");
	itest_delete_queue(out);
}

/* A crash between the commit and the publish (the crash-before-dispatch
 * fault): the row stays pending, and the relay of the next worker sweeps
 * it once it is older than INBOX_OUTBOX_SWEEP, under its stable id; the
 * redelivered payment is a duplicate and emits nothing new. */
Test(outbox, a_crash_between_commit_and_publish_leaves_the_row_to_the_sweep, .timeout = 300)
{
	const char *out = "itest.outbox.mem";
	static struct itest_dead got[8];
	struct mq *m;
	pid_t w;
	int st, n;

	itest_fresh();
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	m = itest_mq();
	publish_event(m, "crash-c", "OrderCreated", "o-crash");
	publish_event(m, "crash-p", "PaymentAuthorized", "o-crash");
	w = itest_worker(1, (const char *[]){ "INBOX_FAULT=crash-before-dispatch", "INBOX_OUTBOX_DISPATCH=thread", "INBOX_OUTBOX_SWEEP=1h", NULL });
	st = itest_wait_exit(w, WAIT_S);
	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the fault kills the worker (status %d)", st);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE message_id = 'OrderPaid:o-crash' AND sent_at IS NULL"),
	             1, "committed, not published");
	cr_assert_eq(itest_queue_depth(out), 0);
	w = itest_worker(1, (const char *[]){ "INBOX_OUTBOX_DISPATCH=thread", "INBOX_OUTBOX_SWEEP=2s", NULL });
	n = itest_drain(out, got, 8, 1, WAIT_S);
	cr_assert_eq(n, 1, "%d messages", n);
	cr_assert_str_eq(got[0].message_id, "OrderPaid:o-crash");
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL", 0, WAIT_S), 0);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE order_id = 'o-crash'"), 1, "one row, swept once");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events WHERE order_id = 'o-crash'"), 2);
	cr_assert_eq(itest_drain(out, got, 8, 0, 0), 0, "nothing more on the queue");
}

/* Issue 43, item 1: one batch commits order A's events, a dead-letter copy
 * the broker returns (nothing bound to the DLX) and order C's events.  Each
 * row's fate is its own: A's and C's rows leave once, published and marked
 * by the committing thread (the sweep would wait an hour), and only the
 * returned copy is left pending.  The worker is stopped while the seven
 * deliveries are published, so that they reach it as one batch. */
Test(outbox, a_returned_copy_costs_its_neighbours_nothing_with_thread_dispatch, .timeout = 300)
{
	const char *out = "itest.outbox.mem";
	static struct itest_dead got[16];
	static char page[65536];
	char env_addr[96];
	int port = itest_metrics_port(0), n;
	struct mq *m;
	pid_t w;

	snprintf(env_addr, sizeof env_addr, "INBOX_METRICS_ADDR=127.0.0.1:%d", port);
	itest_fresh();
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	w = itest_worker(1, (const char *[]){ env_addr, "INBOX_OUTBOX_DISPATCH=thread", "INBOX_OUTBOX_SWEEP=1h",
	                                      "INBOX_BATCH=16", NULL });
	m = itest_mq();
	/* o-b shipped: a later cancellation of it is dead-lettered. */
	publish_event(m, "b-1", "OrderCreated", "o-b");
	publish_event(m, "b-2", "PaymentAuthorized", "o-b");
	publish_event(m, "b-3", "InventoryReserved", "o-b");
	publish_event(m, "b-4", "ShipmentCreated", "o-b");
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", 4, WAIT_S), 4);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL", 0, WAIT_S), 0);
	cr_assert_eq(itest_drain(out, got, 16, 1, WAIT_S), 1, "OrderPaid:o-b");
	dlq_unbind();
	cr_assert_eq(kill(w, SIGSTOP), 0);
	publish_event(m, "a-1", "OrderCreated", "o-a");
	publish_event(m, "a-2", "PaymentAuthorized", "o-a");
	publish_event(m, "a-3", "OrderCancelled", "o-a");
	publish_event(m, "b-5", "OrderCancelled", "o-b");
	publish_event(m, "c-1", "OrderCreated", "o-c");
	publish_event(m, "c-2", "PaymentAuthorized", "o-c");
	publish_event(m, "c-3", "OrderCancelled", "o-c");
	cr_assert_eq(kill(w, SIGCONT), 0);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", 10, WAIT_S), 10);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE order_id IN ('o-a', 'o-c') AND sent_at IS NULL",
	                            0, 60),
	             0, "the rows beside the returned copy are published and marked by the thread");
	n = itest_drain(out, got, 16, 4, WAIT_S);
	cr_assert_eq(count_id(got, n, "OrderPaid:o-a"), 1, "%d messages", n);
	cr_assert_eq(count_id(got, n, "RefundRequested:o-a"), 1, "%d messages", n);
	cr_assert_eq(count_id(got, n, "OrderPaid:o-c"), 1, "%d messages", n);
	cr_assert_eq(count_id(got, n, "RefundRequested:o-c"), 1, "%d messages", n);
	cr_assert_eq(n, 4, "each once, nothing re-published (%d messages)", n);
	cr_assert_eq(itest_wait_metric(port, "inbox_outbox_dispatched_total", 5, 5, page, sizeof page, WAIT_S), 5,
	             "five rows confirmed by the committing thread: %s", page);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL"), 1, "only the returned copy");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE message_id = 'b-5' AND sent_at IS NULL"), 1);
	itest_stop_ok(w);
	mq_close(&m);
	dlq_rebind();
	cr_assert_eq(itest_drain(out, got, 16, 0, 0), 0, "nothing more on orders.out");
}
