/*
 * test_batch.c - a batch of messages in one transaction (inbox_run)
 * against the real database: events of one order inside one batch see
 * each other's effect in delivery order, duplicates and conflicts inside
 * a batch touch only themselves, and two batches that share orders and
 * keys in opposite delivery order, run at the same moment, take their
 * locks in one order (no deadlock) and apply every message once.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inbox.h"
#include "itest.h"
#include "msg.h"
#include "status.h"

#define MAXB 128

/* A batch built from (message_id, type, order_id) triples. */
struct tb {
	char body[MAXB][512];
	struct msg m[MAXB];
	struct inbox_in in[MAXB];
	struct inbox_result res[MAXB];
	int n;
};

static void tb_add_body(struct tb *b, const char *body, const char *type)
{
	int i = b->n++;

	cr_assert(i < MAXB);
	snprintf(b->body[i], sizeof b->body[i], "%s", body);
	cr_assert_eq(msg_parse(b->body[i], strlen(b->body[i]), 65536, NULL, &b->m[i]), MSG_REASON_NONE,
	             "%s", b->m[i].detail);
	b->in[i] = (struct inbox_in){ .msg = &b->m[i], .body = b->body[i], .len = strlen(b->body[i]) };
	(void)type;
	b->in[i].routing_key = "order.itest";
}

static void tb_add(struct tb *b, const char *id, const char *type, const char *order)
{
	char body[512];

	itest_event(body, sizeof body, id, type, order);
	tb_add_body(b, body, type);
}

static struct inbox *open_inbox(struct db **d, const struct cfg *conf)
{
	struct inbox *ib = NULL;

	cr_assert_eq(db_open(d, &conf->db), ST_OK);
	cr_assert_eq(inbox_open(&ib, *d, conf), ST_OK, "%s", db_errmsg(*d));
	return ib;
}

Test(batch, second_event_of_an_order_sees_the_first)
{
	struct tb *b = calloc(1, sizeof *b);
	struct db *d = NULL;
	struct inbox *ib;
	uint64_t before;

	itest_fresh();
	ib = open_inbox(&d, itest_cfg());
	/* In order: each needs the one before it. */
	tb_add(b, "a1", "OrderCreated", "o-a");
	tb_add(b, "a2", "PaymentAuthorized", "o-a");
	tb_add(b, "a3", "InventoryReserved", "o-a");
	/* Out of order inside the batch: the payment is held, then released
	 * by the creation behind it, in the same transaction. */
	tb_add(b, "b2", "PaymentAuthorized", "o-b");
	tb_add(b, "b1", "OrderCreated", "o-b");
	before = db_round_trips(d);
	cr_assert_eq(inbox_run(ib, b->in, b->n, b->res), ST_OK, "%s", db_errmsg(d));
	/* An event held and released inside one batch never leaves memory:
	 * still the batch's two requests. */
	cr_expect_eq(db_round_trips(d) - before, 2, "round trips: %llu", (unsigned long long)(db_round_trips(d) - before));
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE message_id = 'b2' AND outcome = 'applied'"
	                       " AND held_at IS NOT NULL"), 1, "the event waited: held_at says so");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE held_at IS NOT NULL"), 1);
	for (int i = 0; i < 3; i++)
		cr_expect_eq(b->res[i].outcome, INBOX_APPLIED, "a%d: %s", i + 1, inbox_outcome_name(b->res[i].outcome));
	cr_expect_eq(b->res[3].outcome, INBOX_HELD);
	cr_expect_eq(b->res[4].outcome, INBOX_APPLIED);
	cr_expect_eq(b->res[4].released, 1);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders WHERE id = 'o-a' AND status = 'InventoryReserved'"
	                       " AND version = 3 AND amount_cents = 4200 AND paid_at IS NOT NULL"), 1);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders WHERE id = 'o-b' AND status = 'Paid' AND version = 2"
	                       " AND amount_cents = 4200 AND paid_at IS NOT NULL"), 1);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events WHERE order_id = 'o-a'"), 3);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events WHERE order_id = 'o-a' AND"
	                       " ((message_id = 'a1' AND version = 1 AND from_status = 'None' AND to_status = 'Created')"
	                       " OR (message_id = 'a2' AND version = 2 AND from_status = 'Created' AND to_status = 'Paid')"
	                       " OR (message_id = 'a3' AND version = 3 AND from_status = 'Paid'"
	                       " AND to_status = 'InventoryReserved'))"), 3);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events WHERE order_id = 'o-b' AND"
	                       " ((message_id = 'b1' AND version = 1) OR (message_id = 'b2' AND version = 2))"), 2);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM held_events"), 0);
	cr_assert_eq(itest_int("SELECT COALESCE(SUM(held), 0) FROM order_locks"), 0);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE outcome = 'applied'"), 5);
	/* Taking an order's lock is a real write (Galera sees only changed rows). */
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_locks WHERE locks = 1"), 2);
	inbox_close(&ib);
	db_close(&d);
	free(b);
}

Test(batch, duplicates_and_conflicts_inside_one_batch_touch_only_themselves)
{
	struct tb *b = calloc(1, sizeof *b), *first = calloc(1, sizeof *first);
	struct db *d = NULL;
	struct inbox *ib;
	char other[512];

	itest_fresh();
	ib = open_inbox(&d, itest_cfg());
	tb_add(first, "pre", "OrderCreated", "o-pre");
	cr_assert_eq(inbox_run(ib, first->in, 1, first->res), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(first->res[0].outcome, INBOX_APPLIED);

	tb_add(b, "pre", "OrderCreated", "o-pre");               /* 0: stored before: duplicate */
	tb_add(b, "k1", "OrderCreated", "o-k");                  /* 1: applied */
	tb_add(b, "k1", "OrderCreated", "o-k");                  /* 2: the same key again: duplicate */
	snprintf(other, sizeof other,
	         "{\"message_id\":\"k1\",\"source\":\"itest\",\"type\":\"OrderCreated\",\"order_id\":\"o-k\","
	         "\"data\":{\"amount_cents\":1}}");
	tb_add_body(b, other, "OrderCreated");                   /* 3: same key, other payload: conflict */
	snprintf(other, sizeof other,
	         "{\"message_id\":\"pre\",\"source\":\"itest\",\"type\":\"OrderCreated\",\"order_id\":\"o-pre\","
	         "\"data\":{\"amount_cents\":1}}");
	tb_add_body(b, other, "OrderCreated");                   /* 4: stored key, other payload: conflict */
	tb_add(b, "k2", "PaymentAuthorized", "o-k");             /* 5: applied on 1's order */
	tb_add(b, "k3", "PaymentAuthorized", "o-pre");           /* 6: applied on the stored order */
	cr_assert_eq(inbox_run(ib, b->in, b->n, b->res), ST_OK, "%s", db_errmsg(d));
	{
		enum inbox_outcome want[] = { INBOX_DUPLICATE, INBOX_APPLIED, INBOX_DUPLICATE, INBOX_CONFLICT,
			                      INBOX_CONFLICT, INBOX_APPLIED, INBOX_APPLIED };
		for (int i = 0; i < b->n; i++)
			cr_expect_eq(b->res[i].outcome, want[i], "message %d: %s, want %s", i,
			             inbox_outcome_name(b->res[i].outcome), inbox_outcome_name(want[i]));
	}
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages"), 4);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"), 4);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders WHERE status = 'Paid' AND version = 2"), 2);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders WHERE amount_cents = 1"), 0, "the first payload stands");
	inbox_close(&ib);
	db_close(&d);
	free(b);
	free(first);
}

static char *tb_props(const void *arg)
{
	return strdup(arg);
}

/* The round-trip budget of a batch (issue 10): one request claims it, one
 * writes it and commits, whatever it holds — new keys, a stored
 * duplicate, a conflict, the same key twice, two events of one order, a
 * held event.  (Releasing held events reads them back: that alone costs
 * more, and is not in this batch.)  Text that reaches the database as
 * literals (a routing key and properties with quotes, backslashes and
 * UTF-8) is stored byte for byte. */
Test(batch, a_batch_costs_two_round_trips)
{
	struct tb *b = calloc(1, sizeof *b), *first = calloc(1, sizeof *first);
	static const char rk[] = "order.it's\\ \xc3\xbc \"q\"";
	static const char props[] = "{\"headers\":{\"note\":\"it's \\\\ \\\"x\\\" \xc3\xbc\"}}";
	struct db *d = NULL;
	struct inbox *ib;
	char other[512], id[32], order[32];
	uint64_t before;

	itest_fresh();
	ib = open_inbox(&d, itest_cfg());
	tb_add(first, "pre", "OrderCreated", "o-pre");
	tb_add(first, "pre2", "OrderCreated", "o-pre2");
	cr_assert_eq(inbox_run(ib, first->in, 2, first->res), ST_OK, "%s", db_errmsg(d));

	for (int i = 0; i < 40; i++) {
		snprintf(id, sizeof id, "n%02d", i);
		snprintf(order, sizeof order, "o-%02d", i);
		tb_add(b, id, "OrderCreated", order);
	}
	tb_add(b, "n05", "OrderCreated", "o-05");                  /* 40: the same key again */
	tb_add(b, "p05", "PaymentAuthorized", "o-05");             /* 41: sees 5's order */
	tb_add(b, "pre", "OrderCreated", "o-pre");                 /* 42: stored: duplicate */
	snprintf(other, sizeof other,
	         "{\"message_id\":\"pre2\",\"source\":\"itest\",\"type\":\"OrderCreated\",\"order_id\":\"o-pre2\","
	         "\"data\":{\"amount_cents\":1}}");
	tb_add_body(b, other, "OrderCreated");                     /* 43: stored, other payload: conflict */
	tb_add(b, "h1", "ShipmentCreated", "o-h");                 /* 44: no order yet: held */
	b->in[44].routing_key = rk;
	b->in[44].props_json = tb_props;
	b->in[44].props_arg = props;
	before = db_round_trips(d);
	cr_assert_eq(inbox_run(ib, b->in, b->n, b->res), ST_OK, "%s", db_errmsg(d));
	cr_expect_eq(db_round_trips(d) - before, 2, "round trips for one batch: %llu",
	             (unsigned long long)(db_round_trips(d) - before));
	for (int i = 0; i < 40; i++)
		cr_expect_eq(b->res[i].outcome, INBOX_APPLIED, "message %d: %s", i, inbox_outcome_name(b->res[i].outcome));
	cr_expect_eq(b->res[40].outcome, INBOX_DUPLICATE);
	cr_expect_eq(b->res[41].outcome, INBOX_APPLIED);
	cr_expect_eq(b->res[42].outcome, INBOX_DUPLICATE);
	cr_expect_eq(b->res[43].outcome, INBOX_CONFLICT);
	cr_expect_eq(b->res[44].outcome, INBOX_HELD);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders WHERE id LIKE 'o-__' AND status = 'Created'"
	                       " AND version = 1"), 39);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders WHERE id = 'o-05' AND status = 'Paid' AND version = 2"), 1);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"), 2 + 41);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages"), 2 + 42);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE message_id = 'h1' AND outcome = 'held'"),
	             1);
	cr_assert_eq(itest_int("SELECT held FROM order_locks WHERE order_id = 'o-h'"), 1);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE type = 'OrderPaid' AND order_id = 'o-05'"), 1);
	{
		char got_rk[64] = "", got_props[128] = "";

		cr_assert(itest_str1("SELECT routing_key FROM held_events WHERE message_id = ?", "h1", got_rk,
		                     sizeof got_rk));
		cr_expect_str_eq(got_rk, rk);
		cr_assert(itest_str1("SELECT props FROM held_events WHERE message_id = ?", "h1", got_props,
		                     sizeof got_props));
		cr_expect_str_eq(got_props, props);
		cr_assert_eq(itest_int("SELECT COUNT(*) FROM held_events WHERE message_id = 'h1'"
		                       " AND body LIKE '%\"order_id\":\"o-h\"%'"), 1);
	}
	inbox_close(&ib);
	db_close(&d);
	free(b);
	free(first);
}

/* Two batches at once over the same ORDERS orders and the same keys, one
 * in ascending and one in descending delivery order. */
#define ORDERS 60
#define ROUNDS 40

struct racer {
	pthread_t th;
	pthread_barrier_t *go;
	bool descending;
	int round;
	struct tb *b;
	struct db *d;
	struct inbox *ib;
	int rc;
	int retries;
};

static void *racer_main(void *arg)
{
	struct racer *r = arg;

	db_thread_init();
	pthread_barrier_wait(r->go);
	for (int attempt = 0; attempt < 50; attempt++) {
		r->rc = inbox_run(r->ib, r->b->in, r->b->n, r->b->res);
		if (r->rc != ST_ERR_DB_DEADLOCK && r->rc != ST_ERR_DB_LOCK_TIMEOUT)
			break;
		r->retries++;
	}
	db_thread_end();
	return NULL;
}

static void racer_batch(struct racer *r)
{
	char id[64], order[64];

	r->b->n = 0;
	for (int k = 0; k < ORDERS; k++) {
		int i = r->descending ? ORDERS - 1 - k : k;
		/* Both batches carry both events of each order, so every key
		 * is claimed by both at once, and each order is locked by both. */
		const char *first = r->descending ? "PaymentAuthorized" : "OrderCreated";
		const char *second = r->descending ? "OrderCreated" : "PaymentAuthorized";

		snprintf(order, sizeof order, "r%d-o%d", r->round, i);
		snprintf(id, sizeof id, "r%d-%d-%c", r->round, i, first[0]);
		tb_add(r->b, id, first, order);
		snprintf(id, sizeof id, "r%d-%d-%c", r->round, i, second[0]);
		tb_add(r->b, id, second, order);
	}
}

Test(batch, concurrent_batches_sharing_orders_in_opposite_order_apply_once, .timeout = 300)
{
	struct racer r[2];
	pthread_barrier_t go;
	int retries = 0;

	itest_fresh();
	memset(r, 0, sizeof r);
	for (int t = 0; t < 2; t++) {
		r[t].b = calloc(1, sizeof *r[t].b);
		r[t].ib = open_inbox(&r[t].d, itest_cfg());
		r[t].descending = t == 1;
		r[t].go = &go;
	}
	for (int round = 0; round < ROUNDS; round++) {
		cr_assert_eq(pthread_barrier_init(&go, NULL, 2), 0);
		for (int t = 0; t < 2; t++) {
			r[t].round = round;
			racer_batch(&r[t]);
			cr_assert_eq(pthread_create(&r[t].th, NULL, racer_main, &r[t]), 0);
		}
		for (int t = 0; t < 2; t++) {
			pthread_join(r[t].th, NULL);
			cr_assert_eq(r[t].rc, ST_OK, "round %d batch %d: %s (%s)", round, t, st_strerror(r[t].rc),
			             db_errmsg(r[t].d));
		}
		pthread_barrier_destroy(&go);
		/* Each message took effect in exactly one of the two batches. */
		for (int i = 0; i < 2 * ORDERS; i++) {
			int applied = 0;
			for (int t = 0; t < 2; t++)
				applied += r[t].b->res[i].outcome != INBOX_DUPLICATE;
			cr_assert_eq(applied, 1, "round %d message %d: taken by %d batches", round, i, applied);
		}
	}
	for (int t = 0; t < 2; t++)
		retries += r[t].retries;
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders WHERE status = 'Paid' AND version = 2"), ORDERS * ROUNDS);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"), 2 * ORDERS * ROUNDS);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE outcome = 'applied'"),
	             2 * ORDERS * ROUNDS);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM held_events"), 0);
	cr_assert_eq(itest_int("SELECT COALESCE(SUM(held), 0) FROM order_locks"), 0);
	/* Orders, then keys, are locked in one sorted order by every batch,
	 * so opposite delivery orders do not deadlock. */
	cr_expect_eq(retries, 0, "%d deadlocks or lock wait time-outs in %d rounds", retries, ROUNDS);
	for (int t = 0; t < 2; t++) {
		inbox_close(&r[t].ib);
		db_close(&r[t].d);
		free(r[t].b);
	}
}

/* Two batches that release held events of different orders must not wait
 * on each other: the delete of released held rows has to find its rows by
 * primary key, not by scanning held_events (a scan locked other batches'
 * rows; in the chaos run two releases deadlocked and a message ran out of
 * retries).  The first connection keeps its delete uncommitted; the
 * second, with a short lock wait, must delete its own row regardless. */
Test(batch, releases_of_different_orders_do_not_lock_each_other, .timeout = 120)
{
	struct db *a = itest_db(), *b = NULL;
	struct db_stmt *ins, *lw;
	int64_t ids[2];
	char list[96];

	itest_fresh();
	cr_assert_eq(db_prepare(a, &ins, "INSERT INTO held_events (consumer, source, message_id, order_id, type,"
	                                 " routing_key, props, body, held_at)"
	                                 " VALUES ('order-status', '', ?, ?, 'ShipmentCreated', 'order.x', NULL, 'b', NOW(6))"),
	             ST_OK, "%s", db_errmsg(a));
	for (int i = 0; i < 2; i++) {
		char mid[32], oid[32];
		snprintf(mid, sizeof mid, "lock-m%d", i);
		snprintf(oid, sizeof oid, "lock-o%d", i);
		struct db_param p[] = { DBP_STR(mid), DBP_STR(oid) };
		cr_assert_eq(db_stmt_exec(ins, p, ARRAY_LEN(p), NULL), ST_OK, "%s", db_errmsg(a));
		ids[i] = (int64_t)db_stmt_insert_id(ins);
	}
	cr_assert_eq(db_commit(a), ST_OK);
	cr_assert_eq(db_open(&b, &itest_cfg()->db), ST_OK);
	cr_assert_eq(db_prepare(b, &lw, "SET SESSION innodb_lock_wait_timeout = 2"), ST_OK);
	cr_assert_eq(db_stmt_exec(lw, NULL, 0, NULL), ST_OK);
	/* The statement inbox_flush sends for released rows (its W_DEL
	 * section): a list of primary keys. */
	snprintf(list, sizeof list, "DELETE FROM held_events WHERE id IN (%lld)", (long long)ids[0]);
	cr_assert_eq(db_exec(a, list), ST_OK, "%s", db_errmsg(a));
	/* The higher id second: a scan in id order would reach the lower one,
	 * held by the other connection, before its own. */
	snprintf(list, sizeof list, "DELETE FROM held_events WHERE id IN (%lld)", (long long)ids[1]);
	{
		int rc = db_exec(b, list);
		cr_assert_eq(rc, ST_OK, "the second release waited on the first's row: %s (%s)", st_strerror(rc),
		             db_errmsg(b));
	}
	cr_assert_eq(db_commit(b), ST_OK);
	cr_assert_eq(db_commit(a), ST_OK);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM held_events"), 0);
	db_close(&b);
}

/*
 * Issue 25: across processes a batch never waits for an order another
 * transaction holds.  Connection a (another process's transaction) holds
 * order nw-x's lock open; the batch [p-x, c-y, p-x again naming nw-v,
 * p-y, c-v] settles what does not follow nw-x — c-y and p-y commit while
 * a is still open (seen from a third connection) — and leaves p-x, the
 * other copy of its key and c-v (the order of that copy) for later, in
 * delivery order.  After a commits, the rest is settled in a second
 * transaction: the first copy of p-x stands, the second is the conflict.
 * The batch's lock wait is short (2 s): a batch that waited for a
 * would fail with it rather than hang.
 */
/* inbox_run_nowait over batch b, which must succeed; the round trips it
 * took. */
static uint64_t nowait_round_trips(struct inbox *ib, struct db *d, struct tb *b, bool *later, int *nlater)
{
	uint64_t before = db_round_trips(d);

	cr_assert_eq(inbox_run_nowait(ib, b->in, b->n, b->res, later, nlater), ST_OK, "%s", db_errmsg(d));
	return db_round_trips(d) - before;
}

/* The common case of inbox_run_nowait, no order held elsewhere, costs
 * what inbox_run costs: the batch's locks are taken without waiting in the
 * claim's own request (FOR UPDATE NOWAIT), and only a batch that finds
 * one held pays a round trip to learn which (the probe). */
Test(batch, a_batch_no_one_else_holds_costs_two_round_trips_without_waiting)
{
	struct tb *pre = calloc(1, sizeof *pre), *b = calloc(1, sizeof *b);
	struct db *d = NULL;
	struct inbox *ib;
	bool later[MAXB];
	int nlater = -1;
	uint64_t rt;

	itest_fresh();
	ib = open_inbox(&d, itest_cfg());
	tb_add(pre, "c-a", "OrderCreated", "rt-a");
	cr_assert_eq(inbox_run(ib, pre->in, 1, pre->res), ST_OK, "%s", db_errmsg(d));
	tb_add(b, "p-a", "PaymentAuthorized", "rt-a"); /* an order with its lock row */
	tb_add(b, "c-b", "OrderCreated", "rt-b");      /* a new one */
	tb_add(b, "c-a", "OrderCreated", "rt-a");      /* stored: duplicate */
	rt = nowait_round_trips(ib, d, b, later, &nlater);
	cr_expect_eq(rt, 2, "round trips: %llu", (unsigned long long)rt);
	cr_expect_eq(nlater, 0);
	cr_expect_eq(b->res[0].outcome, INBOX_APPLIED, "%s", inbox_outcome_name(b->res[0].outcome));
	cr_expect_eq(b->res[1].outcome, INBOX_APPLIED, "%s", inbox_outcome_name(b->res[1].outcome));
	cr_expect_eq(b->res[2].outcome, INBOX_DUPLICATE, "%s", inbox_outcome_name(b->res[2].outcome));
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders WHERE id = 'rt-a' AND status = 'Paid' AND version = 2"), 1);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders WHERE id = 'rt-b' AND status = 'Created'"), 1);
	inbox_close(&ib);
	db_close(&d);
	free(pre);
	free(b);
}

/* After a batch found an order held elsewhere, the next one probes first
 * (a fleet that shares orders would pay a failed lock on most batches),
 * and once a probe finds nothing held the lock goes back into the claim. */
Test(batch, after_a_held_order_the_probe_goes_first_until_none_is_held, .timeout = 120)
{
	struct tb *pre = calloc(1, sizeof *pre), *b = calloc(1, sizeof *b), *c = calloc(1, sizeof *c),
	          *e = calloc(1, sizeof *e);
	struct db *d = NULL, *a = NULL;
	struct inbox *ib;
	bool later[MAXB];
	int nlater = -1;
	uint64_t rt;

	itest_fresh();
	ib = open_inbox(&d, itest_cfg());
	tb_add(pre, "c-h", "OrderCreated", "pf-h");
	cr_assert_eq(inbox_run(ib, pre->in, 1, pre->res), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_open(&a, &itest_cfg()->db), ST_OK);
	cr_assert_eq(db_exec(a, "UPDATE order_locks SET locks = locks + 1 WHERE order_id = 'pf-h'"), ST_OK, "%s",
	             db_errmsg(a));
	tb_add(b, "p-h", "PaymentAuthorized", "pf-h"); /* held elsewhere: later */
	tb_add(b, "c-1", "OrderCreated", "pf-1");
	(void)nowait_round_trips(ib, d, b, later, &nlater);
	cr_expect_eq(nlater, 1);
	cr_assert_eq(db_commit(a), ST_OK);

	tb_add(c, "c-2", "OrderCreated", "pf-2");
	tb_add(c, "c-3", "OrderCreated", "pf-3");
	rt = nowait_round_trips(ib, d, c, later, &nlater);
	cr_expect_eq(rt, 3, "the probe first: %llu round trips", (unsigned long long)rt);
	cr_expect_eq(nlater, 0);

	tb_add(e, "c-4", "OrderCreated", "pf-4");
	tb_add(e, "c-5", "OrderCreated", "pf-5");
	rt = nowait_round_trips(ib, d, e, later, &nlater);
	cr_expect_eq(rt, 2, "the lock back in the claim: %llu round trips", (unsigned long long)rt);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders WHERE id IN ('pf-1', 'pf-2', 'pf-3', 'pf-4', 'pf-5')"), 5);
	inbox_close(&ib);
	db_close(&a);
	db_close(&d);
	free(pre);
	free(b);
	free(c);
	free(e);
}

Test(batch, a_batch_settles_the_orders_no_one_holds_and_leaves_the_rest, .timeout = 120)
{
	struct tb *pre = calloc(1, sizeof *pre), *b = calloc(1, sizeof *b), *rest = calloc(1, sizeof *rest);
	struct db *d = NULL, *a = NULL;
	struct inbox *ib;
	bool later[MAXB];
	int nlater = -1, rc;

	itest_fresh();
	ib = open_inbox(&d, itest_cfg());
	tb_add(pre, "c-x", "OrderCreated", "nw-x");
	cr_assert_eq(inbox_run(ib, pre->in, 1, pre->res), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_open(&a, &itest_cfg()->db), ST_OK);
	cr_assert_eq(db_exec(a, "INSERT INTO order_locks (order_id, held, locks) VALUES ('nw-x', 0, 1)"
	                        " ON DUPLICATE KEY UPDATE locks = locks + 1"), ST_OK, "%s", db_errmsg(a));
	cr_assert_eq(db_exec(d, "SET SESSION innodb_lock_wait_timeout = 2"), ST_OK, "%s", db_errmsg(d));

	tb_add(b, "p-x", "PaymentAuthorized", "nw-x"); /* 0: its order is held: later */
	tb_add(b, "c-y", "OrderCreated", "nw-y");      /* 1: now */
	tb_add(b, "p-x", "OrderCreated", "nw-v");      /* 2: a copy of 0's key: later */
	tb_add(b, "p-y", "PaymentAuthorized", "nw-y"); /* 3: now, after 1 */
	tb_add(b, "c-v", "OrderCreated", "nw-v");      /* 4: 2's order: later */
	rc = inbox_run_nowait(ib, b->in, b->n, b->res, later, &nlater);
	cr_assert_eq(rc, ST_OK, "the batch waited for the order another transaction holds: %s (%s)", st_strerror(rc),
	             db_errmsg(d));
	cr_expect_eq(nlater, 3);
	cr_expect(later[0] && later[2] && later[4], "later: %d %d %d", later[0], later[2], later[4]);
	cr_expect(!later[1] && !later[3]);
	cr_expect_eq(b->res[1].outcome, INBOX_APPLIED, "%s", inbox_outcome_name(b->res[1].outcome));
	cr_expect_eq(b->res[3].outcome, INBOX_APPLIED, "%s", inbox_outcome_name(b->res[3].outcome));
	/* Committed while a is still open. */
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders WHERE id = 'nw-y' AND status = 'Paid' AND version = 2"), 1);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE message_id IN ('p-x', 'c-v')"), 0);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders WHERE id IN ('nw-v')"), 0);
	cr_assert_eq(db_commit(a), ST_OK);

	for (int i = 0; i < b->n; i++) {
		if (!later[i])
			continue;
		tb_add_body(rest, b->body[i], NULL);
	}
	cr_assert_eq(rest->n, 3);
	cr_assert_eq(inbox_run(ib, rest->in, rest->n, rest->res), ST_OK, "%s", db_errmsg(d));
	cr_expect_eq(rest->res[0].outcome, INBOX_APPLIED, "%s", inbox_outcome_name(rest->res[0].outcome));
	cr_expect_eq(rest->res[1].outcome, INBOX_CONFLICT, "%s", inbox_outcome_name(rest->res[1].outcome));
	cr_expect_eq(rest->res[2].outcome, INBOX_APPLIED, "%s", inbox_outcome_name(rest->res[2].outcome));
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders WHERE id = 'nw-x' AND status = 'Paid' AND version = 2"), 1);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders WHERE id = 'nw-v' AND status = 'Created'"), 1);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events WHERE order_id = 'nw-v'"), 1);
	inbox_close(&ib);
	db_close(&a);
	db_close(&d);
	free(pre);
	free(b);
	free(rest);
}

/* Whether order_id is Paid (a) and b Created, or the log says a
 * transaction was retried, whichever comes first (bounded). */
static bool settled_or_retried(const char *logf, const char *a, const char *b, int timeout_s)
{
	for (int i = 0; i < timeout_s * 10; i++) {
		struct timespec ts = { .tv_sec = 0, .tv_nsec = 100 * 1000000L };

		if (itest_int1("SELECT COUNT(*) FROM orders WHERE id = ? AND status = 'Paid'", a) == 1 &&
		    itest_int1("SELECT COUNT(*) FROM orders WHERE id = ?", b) == 1)
			return true;
		if (itest_log_has(logf, "transaction retry"))
			return false;
		nanosleep(&ts, NULL);
	}
	return false;
}

/* The same through the worker: another process's transaction holds order
 * wp-h; the worker's batch of four (all published before it starts)
 * settles wp-a's two events and wp-b's without waiting for it (before
 * issue 25 the batch waited out the lock wait time-out and was retried),
 * and wp-h's once the other transaction ends. */
Test(batch, a_worker_settles_other_orders_while_another_process_holds_one, .timeout = 300)
{
	char body[512], logf[256];
	struct db *locker = NULL;
	struct mq *m;
	pid_t w;
	static const char *const ev[4][3] = {
		{ "wp-a1", "OrderCreated", "wp-a" },
		{ "wp-h1", "OrderCreated", "wp-h" },
		{ "wp-b1", "OrderCreated", "wp-b" },
		{ "wp-a2", "PaymentAuthorized", "wp-a" },
	};

	itest_fresh();
	itest_log_path(logf, sizeof logf, "otherproc");
	cr_assert_eq(db_open(&locker, &itest_cfg()->db), ST_OK);
	cr_assert_eq(db_exec(locker, "INSERT INTO order_locks (order_id) VALUES ('wp-h')"), ST_OK);
	cr_assert_eq(db_commit(locker), ST_OK);
	cr_assert_eq(db_exec(locker, "UPDATE order_locks SET locks = locks + 1 WHERE order_id = 'wp-h'"), ST_OK);
	m = itest_mq();
	for (int i = 0; i < 4; i++) {
		itest_event(body, sizeof body, ev[i][0], ev[i][1], ev[i][2]);
		itest_publish(m, ev[i][1], body, NULL);
	}
	w = itest_worker_logged(1, (const char *[]){ "INBOX_LOG_LEVEL=debug", "INBOX_PREFETCH=16", "INBOX_BATCH=16", NULL },
	                        logf);
	cr_assert(settled_or_retried(logf, "wp-a", "wp-b", 120), "the batch waited for the order another process holds");
	cr_assert_eq(itest_int1("SELECT COUNT(*) FROM processed_messages WHERE message_id = ?", "wp-h1"), 0);
	db_rollback(locker);
	db_close(&locker);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM orders WHERE id = 'wp-h'", 1, 60), 1);
	itest_wait_queue_empty(itest_cfg()->queue, 60);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"), 4);
	cr_assert_eq(itest_log_count(logf, "transaction retry"), 0);
}

/* ---- releasing held events (issue 43) ------------------------------------ */

/* Hold n events of order (each a separate key, each sent before the order
 * exists), then send the order's creation alone: returns the round trips of
 * that releasing batch, and checks that every held event settled exactly
 * as the lifecycle says (the oldest payment applied, the others stale). */
static uint64_t release_round_trips(struct inbox *ib, struct db *d, const char *order, int n)
{
	struct tb *h = calloc(1, sizeof *h), *c = calloc(1, sizeof *c);
	char id[64], sql[256];
	uint64_t before, rt;

	cr_assert_not_null(h);
	cr_assert_not_null(c);
	for (int i = 0; i < n; i++) {
		snprintf(id, sizeof id, "%s-p%02d", order, i);
		tb_add(h, id, "PaymentAuthorized", order);
	}
	cr_assert_eq(inbox_run(ib, h->in, h->n, h->res), ST_OK, "%s", db_errmsg(d));
	for (int i = 0; i < n; i++)
		cr_assert_eq(h->res[i].outcome, INBOX_HELD, "%d: %s", i, inbox_outcome_name(h->res[i].outcome));
	cr_assert_eq(itest_int1("SELECT held FROM order_locks WHERE order_id = ?", order), n);
	snprintf(id, sizeof id, "%s-c", order);
	tb_add(c, id, "OrderCreated", order);
	before = db_round_trips(d);
	cr_assert_eq(inbox_run(ib, c->in, 1, c->res), ST_OK, "%s", db_errmsg(d));
	rt = db_round_trips(d) - before;
	cr_expect_eq(c->res[0].outcome, INBOX_APPLIED, "%s", inbox_outcome_name(c->res[0].outcome));
	cr_expect_eq(c->res[0].released, n, "released %d of %d", c->res[0].released, n);
	cr_assert_eq(itest_int1("SELECT COUNT(*) FROM orders WHERE id = ? AND status = 'Paid' AND version = 2"
	                        " AND amount_cents = 4200", order), 1);
	cr_assert_eq(itest_int1("SELECT COUNT(*) FROM held_events WHERE order_id = ?", order), 0);
	cr_assert_eq(itest_int1("SELECT held FROM order_locks WHERE order_id = ?", order), 0);
	snprintf(sql, sizeof sql, "SELECT COUNT(*) FROM order_events WHERE order_id = ? AND type = 'PaymentAuthorized'"
	                          " AND message_id = '%s-p00' AND version = 2", order);
	cr_assert_eq(itest_int1(sql, order), 1, "the oldest held payment is the one applied");
	cr_assert_eq(itest_int1("SELECT COUNT(*) FROM processed_messages WHERE order_id = ? AND outcome = 'ignored'"
	                        " AND held_at IS NOT NULL", order), n - 1);
	free(h);
	free(c);
	return rt;
}

/* A batch's round trips do not grow with the held events it releases
 * (issue 43: at 150 ms a round trip, one read per held event kept a
 * batch's transaction open for a minute).  The held events of the batch's
 * orders are read with the claim, so releasing one or fifty costs the
 * batch's two requests. */
Test(batch, releasing_held_events_costs_the_same_round_trips_however_many)
{
	struct db *d = NULL;
	struct inbox *ib;
	uint64_t one, fifty;

	itest_fresh();
	ib = open_inbox(&d, itest_cfg());
	one = release_round_trips(ib, d, "rel-1", 1);
	fifty = release_round_trips(ib, d, "rel-50", 50);
	cr_expect_eq(one, 2, "releasing 1 held event: %llu round trips", (unsigned long long)one);
	cr_expect_eq(fifty, one, "releasing 50 held events: %llu round trips, 1: %llu", (unsigned long long)fifty,
	             (unsigned long long)one);
	inbox_close(&ib);
	db_close(&d);
}

/* Held events of n bodies of about 60 KB for order, sent before it
 * exists, in batches of 10: ShipmentCreated, then (last) one payment. */
enum { BIG_HELD = 80, BIG_PAD = 60000 };

static void hold_big(struct inbox *ib, struct db *d, const char *order)
{
	static char body[10][BIG_PAD + 512];
	static struct msg m[10];
	struct inbox_in in[10];
	struct inbox_result res[10];
	char *pad = malloc(BIG_PAD + 1);

	cr_assert_not_null(pad);
	memset(pad, 'x', BIG_PAD);
	pad[BIG_PAD] = '\0';
	for (int from = 0; from < BIG_HELD; from += 10) {
		for (int k = 0; k < 10; k++) {
			int i = from + k;
			bool pay = i == BIG_HELD - 1;

			snprintf(body[k], sizeof body[k],
			         "{\"message_id\":\"%s-%c-%02d\",\"source\":\"itest\",\"type\":\"%s\",\"order_id\":\"%s\","
			         "\"occurred_at\":\"2026-11-29T18:00:00Z\",\"data\":{\"amount_cents\":4200,\"pad\":\"%s\"}}",
			         order, pay ? 'p' : 's', i, pay ? "PaymentAuthorized" : "ShipmentCreated", order,
			         pay ? "" : pad);
			cr_assert_eq(msg_parse(body[k], strlen(body[k]), 65536, NULL, &m[k]), MSG_REASON_NONE, "%s",
			             m[k].detail);
			in[k] = (struct inbox_in){ .msg = &m[k], .body = body[k], .len = strlen(body[k]),
			                           .routing_key = "order.itest" };
		}
		cr_assert_eq(inbox_run(ib, in, 10, res), ST_OK, "%s", db_errmsg(d));
		for (int k = 0; k < 10; k++)
			cr_assert_eq(res[k].outcome, INBOX_HELD);
	}
	free(pad);
}

/* Held events past what one read carries (their bodies outgrow the bytes
 * the claim reads back: about 4.7 MB here) are read a page at a time, in
 * the order they were held: the payment held behind 79 large shipments is
 * found and applied when the order is created, the shipments wait, and
 * the reservation then applies the oldest of them.  Still a few round
 * trips for the batch, not one per held event. */
Test(batch, held_events_past_one_read_are_released_oldest_first, .timeout = 300)
{
	struct tb *c = calloc(1, sizeof *c), *r = calloc(1, sizeof *r);
	struct db *d = NULL;
	struct inbox *ib;
	uint64_t before, rt;

	itest_fresh();
	ib = open_inbox(&d, itest_cfg());
	hold_big(ib, d, "big");
	cr_assert_eq(itest_int1("SELECT held FROM order_locks WHERE order_id = ?", "big"), BIG_HELD);
	tb_add(c, "big-c", "OrderCreated", "big");
	before = db_round_trips(d);
	cr_assert_eq(inbox_run(ib, c->in, 1, c->res), ST_OK, "%s", db_errmsg(d));
	rt = db_round_trips(d) - before;
	cr_expect_eq(c->res[0].released, 1);
	cr_expect(rt <= 8, "releasing behind %d large held events: %llu round trips", BIG_HELD - 1,
	          (unsigned long long)rt);
	cr_assert_eq(itest_int1("SELECT COUNT(*) FROM orders WHERE id = ? AND status = 'Paid' AND version = 2"
	                        " AND amount_cents = 4200", "big"), 1);
	cr_assert_eq(itest_int1("SELECT held FROM order_locks WHERE order_id = ?", "big"), BIG_HELD - 1);
	cr_assert_eq(itest_int1("SELECT COUNT(*) FROM held_events WHERE order_id = ?", "big"), BIG_HELD - 1);

	tb_add(r, "big-r", "InventoryReserved", "big");
	cr_assert_eq(inbox_run(ib, r->in, 1, r->res), ST_OK, "%s", db_errmsg(d));
	cr_expect_eq(r->res[0].released, BIG_HELD - 1);
	cr_assert_eq(itest_int1("SELECT COUNT(*) FROM orders WHERE id = ? AND status = 'Shipped' AND version = 4",
	                        "big"), 1);
	cr_assert_eq(itest_int1("SELECT COUNT(*) FROM order_events WHERE order_id = ? AND type = 'ShipmentCreated'"
	                        " AND message_id = 'big-s-00'", "big"), 1, "the oldest shipment is the one applied");
	cr_assert_eq(itest_int1("SELECT COUNT(*) FROM processed_messages WHERE order_id = ? AND outcome = 'ignored'",
	                        "big"), BIG_HELD - 2);
	cr_assert_eq(itest_int1("SELECT held FROM order_locks WHERE order_id = ?", "big"), 0);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM held_events"), 0);
	inbox_close(&ib);
	db_close(&d);
	free(c);
	free(r);
}
