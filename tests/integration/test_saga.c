/*
 * test_saga.c - the order saga against the real stack: any arrival order
 * with duplicates ends where in-order arrival ends; an event for an unknown
 * order never races its OrderCreated into a stranded hold; holds expire into
 * the DLQ; compensations leave through the outbox, also across a crash; and
 * sharded mode keeps each order's events in publish order.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "db.h"
#include "itest.h"
#include "lifecycle.h"
#include "lifecycle_schema.h"
#include "spec_oracle.h"
#include "status.h"

#define WAIT_S 240

static const char *const type_names[MSG_TYPE_COUNT] = {
	"OrderCreated", "PaymentAuthorized", "InventoryReserved", "ShipmentCreated", "OrderCancelled",
};

/* The four full sequences an order can have (a cancel after shipment is too
 * late and is not order-independent, so it is not among them). */
static const enum msg_type seq_happy[] = { MSG_ORDER_CREATED, MSG_PAYMENT_AUTHORIZED, MSG_INVENTORY_RESERVED,
                                           MSG_SHIPMENT_CREATED };
static const enum msg_type seq_cancel_created[] = { MSG_ORDER_CREATED, MSG_ORDER_CANCELLED };
static const enum msg_type seq_cancel_paid[] = { MSG_ORDER_CREATED, MSG_PAYMENT_AUTHORIZED, MSG_ORDER_CANCELLED };
static const enum msg_type seq_cancel_reserved[] = { MSG_ORDER_CREATED, MSG_PAYMENT_AUTHORIZED,
                                                     MSG_INVENTORY_RESERVED, MSG_ORDER_CANCELLED };
static const struct {
	const enum msg_type *ev;
	int n;
} seqs[] = { { seq_happy, 4 }, { seq_cancel_created, 2 }, { seq_cancel_paid, 3 }, { seq_cancel_reserved, 4 } };

struct expect {
	enum spec_status state;
	int version;
	int emits;        /* outbox rows */
	char types[128];  /* their types, sorted, comma-separated */
	char ledger[128]; /* the message ids with an order_events row, sorted */
};

/* In-order arrival as SPEC.md says (loadgen/spec_oracle.c, typed in from
 * SPEC, not the worker's agg_decide): the reference.  Every event of
 * these sequences takes effect, whatever the arrival order. */
static struct expect in_order(int s, const char *order)
{
	static const char *const emit_names[] = { "InventoryReleaseRequested", "OrderPaid", "RefundRequested" };
	static const unsigned emit_bits[] = { SPEC_EMIT_RELEASE, SPEC_EMIT_ORDER_PAID, SPEC_EMIT_REFUND };
	struct expect e = { SPEC_NONE, 0, 0, "", "" };
	enum spec_outcome out[4];
	struct spec_fold f;

	cr_assert_eq(spec_fold(seqs[s].ev, (size_t)seqs[s].n, out, NULL, &f), 0);
	for (int i = 0; i < seqs[s].n; i++) {
		size_t l = strlen(e.ledger);
		cr_assert(spec_takes_effect(out[i]), "sequence %d event %d is %s in order", s, i,
		          spec_outcome_name(out[i]));
		snprintf(e.ledger + l, sizeof e.ledger - l, "%s%s-%d", i ? "," : "", order, i);
	}
	e.state = f.end.status;
	e.version = f.version;
	e.emits = f.nemits;
	for (size_t b = 0; b < sizeof emit_bits / sizeof emit_bits[0]; b++) {
		size_t l = strlen(e.types);
		if (f.emits & emit_bits[b])
			snprintf(e.types + l, sizeof e.types - l, "%s%s", l ? "," : "", emit_names[b]);
	}
	return e;
}

static void log_path(char *buf, size_t cap, const char *name)
{
	snprintf(buf, cap, "/tmp/inbox-itest-%d-%s.log", (int)getpid(), name);
}

/* One message to publish. */
struct pub {
	char order[32];
	char id[48];
	enum msg_type type;
};

struct pub_set {
	struct pub *p;
	int n;
};

struct pub_slice {
	const struct pub_set *set;
	int from, to, step;
	bool keyed;
};

/*
 * Publish the slice, pipelined, and wait for every confirm.  Like any
 * at-least-once producer, a slice whose confirms do not come is published
 * again, whole and in order, on a new connection: the inbox takes the
 * copies that did land as duplicates.  Right after the sharded tests
 * delete and declare their quorum queues again, RabbitMQ 3.10 now and then
 * never confirmed a channel's publishes, and none of them reached a shard
 * queue (all four stayed empty for the 30 s, their consumers attached), so
 * the test failed without the worker ever seeing a message; the run log
 * says when the second attempt was needed.
 */
static void *publish_slice(void *arg)
{
	struct pub_slice *s = arg;
	char body[512];

	for (int attempt = 0;; attempt++) {
		struct mq *m = itest_mq();
		int rc;

		for (int i = s->from; i < s->to; i += s->step) {
			const struct pub *p = &s->set->p[i];
			itest_event(body, sizeof body, p->id, type_names[p->type], p->order);
			if (s->keyed)
				itest_publish_keyed(m, type_names[p->type], body, p->order, false);
			else
				itest_publish_async(m, type_names[p->type], body, NULL);
		}
		rc = mq_wait_confirms(m, 30000);
		if (rc == ST_OK) {
			mq_close(&m);
			return NULL;
		}
		cr_assert_lt(attempt, 2, "confirm: %s (attempt %d)", mq_errmsg(m), attempt + 1);
		fprintf(stderr, "publish_slice: no confirm within 30 s (%s); publishing the slice again on a new"
		                " connection\n", mq_errmsg(m));
		mq_close(&m);
	}
}

static void shuffle(struct pub *p, int n, unsigned *seed)
{
	for (int i = n - 1; i > 0; i--) {
		int j = (int)(rand_r(seed) % (unsigned)(i + 1));
		struct pub t = p[i];
		p[i] = p[j];
		p[j] = t;
	}
}

Test(saga, any_arrival_order_with_duplicates_ends_as_in_order, .timeout = 900)
{
	enum { ORDERS = 300, CONNS = 4 };
	static struct pub all[ORDERS * 4 * 2];
	struct pub_set set = { all, 0 };
	struct pub_slice slices[CONNS];
	pthread_t t[CONNS];
	unsigned seed = 20261129;
	int kinds[ORDERS];
	int unique = 0, emits = 0;
	char logf[2][256];
	pid_t w[2];

	for (int o = 0; o < ORDERS; o++) {
		int s = o % 4;
		kinds[o] = s;
		for (int i = 0; i < seqs[s].n; i++) {
			struct pub *p = &all[set.n++];
			snprintf(p->order, sizeof p->order, "prop-%d", o);
			snprintf(p->id, sizeof p->id, "prop-%d-%d", o, i);
			p->type = seqs[s].ev[i];
			unique++;
			if (rand_r(&seed) % 4 == 0) /* a quarter of the events come twice */
				all[set.n++] = *p;
		}
		emits += in_order(s, "").emits;
	}
	/* Interleave all orders' events in one random permutation. */
	shuffle(all, set.n, &seed);

	itest_fresh();
	for (int p = 0; p < 2; p++) {
		char name[32];
		snprintf(name, sizeof name, "prop-%d", p);
		log_path(logf[p], sizeof logf[p], name);
		/* One process one message per transaction, the other batches;
		 * small prefetch windows, so that every thread of both takes
		 * part (the first thread, of the highest consumer priority,
		 * would take all of a light load). */
		w[p] = itest_worker_logged(3,
		                           p == 0 ? (const char *[]){ "INBOX_BATCH=1", "INBOX_PREFETCH=2", NULL }
		                                  : (const char *[]){ "INBOX_BATCH=8", "INBOX_PREFETCH=8", NULL },
		                           logf[p]);
	}
	for (int c = 0; c < CONNS; c++) {
		slices[c] = (struct pub_slice){ &set, c, set.n, CONNS, false };
		cr_assert_eq(pthread_create(&t[c], NULL, publish_slice, &slices[c]), 0);
	}
	for (int c = 0; c < CONNS; c++)
		pthread_join(t[c], NULL);

	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages WHERE outcome <> 'held'", unique, WAIT_S),
	             unique);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL", 0, WAIT_S), 0,
	             "the relay must publish every outbox row");
	for (int p = 0; p < 2; p++)
		itest_stop_ok(w[p]);

	for (int o = 0; o < ORDERS; o++) {
		char order[32], status[32], got[256];
		struct expect e;

		snprintf(order, sizeof order, "prop-%d", o);
		e = in_order(kinds[o], order);
		cr_assert(itest_str1("SELECT status FROM orders WHERE id = ?", order, status, sizeof status),
		          "%s missing", order);
		cr_assert_str_eq(status, spec_status_name(e.state), "%s: %s, SPEC says %s", order, status,
		                 spec_status_name(e.state));
		cr_assert_eq(itest_int1("SELECT version FROM orders WHERE id = ?", order), e.version, "%s version", order);
		/* Which events have a ledger row, not only how many: a missing one
		 * and a stray one would add up to the right count. */
		cr_assert(itest_str1("SELECT COALESCE(GROUP_CONCAT(message_id ORDER BY message_id), '')"
		                     " FROM order_events WHERE order_id = ?", order, got, sizeof got));
		cr_assert_str_eq(got, e.ledger, "%s: ledger rows for %s, SPEC says %s", order, got, e.ledger);
		cr_assert(itest_str1("SELECT COALESCE(GROUP_CONCAT(type ORDER BY type), '') FROM outbox WHERE order_id = ?",
		                     order, got, sizeof got));
		cr_assert_str_eq(got, e.types, "%s: emitted %s, SPEC says %s", order, got, e.types);
	}
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"), unique, "every event took effect exactly once");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE outcome NOT IN ('applied', 'compensated')"),
	             0, "SPEC: every event of these sequences takes effect, in any arrival order");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM held_events"), 0, "nothing remains held");
	cr_assert_eq(itest_int("SELECT COALESCE(SUM(held), 0) FROM order_locks"), 0);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox"), emits, "the same compensations as in order");
	cr_assert_eq(itest_queue_depth(itest_cfg()->dlq), 0);
}

/* InventoryReserved for a new order at the same instant as its OrderCreated
 * and PaymentAuthorized: without one lock per order, even before it exists,
 * the reservation could be held after the payment was applied and stay
 * stranded. */
struct race {
	pthread_barrier_t *go;
	int orders;
	enum msg_type type;
};

static void *race_main(void *arg)
{
	struct race *r = arg;
	struct mq *m = itest_mq();
	char body[512], id[64], order[64];

	for (int o = 0; o < r->orders; o++) {
		snprintf(order, sizeof order, "race-%d", o);
		snprintf(id, sizeof id, "race-%d-%d", o, (int)r->type);
		itest_event(body, sizeof body, id, type_names[r->type], order);
		pthread_barrier_wait(r->go); /* the three events of an order leave together */
		itest_publish_async(m, type_names[r->type], body, NULL);
	}
	itest_confirm_all(m);
	mq_close(&m);
	return NULL;
}

Test(saga, reservation_racing_creation_is_never_stranded, .timeout = 900)
{
	enum { ORDERS = 300 };
	const enum msg_type types[3] = { MSG_INVENTORY_RESERVED, MSG_ORDER_CREATED, MSG_PAYMENT_AUTHORIZED };
	pthread_barrier_t go;
	struct race r[3];
	pthread_t t[3];
	pid_t w[2];

	itest_fresh();
	/* Windows of two: the racing events spread over all eight threads. */
	w[0] = itest_worker(4, (const char *[]){ "INBOX_PREFETCH=2", NULL });
	w[1] = itest_worker(4, (const char *[]){ "INBOX_PREFETCH=2", NULL });
	cr_assert_eq(pthread_barrier_init(&go, NULL, 3), 0);
	for (int i = 0; i < 3; i++) {
		r[i] = (struct race){ &go, ORDERS, types[i] };
		cr_assert_eq(pthread_create(&t[i], NULL, race_main, &r[i]), 0);
	}
	for (int i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	pthread_barrier_destroy(&go);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM orders WHERE status = 'InventoryReserved' AND version = 3",
	                            ORDERS, WAIT_S),
	             ORDERS, "every reservation must be applied, none stranded");
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w[0]);
	itest_stop_ok(w[1]);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM held_events"), 0);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"), 3 * ORDERS);
}

Test(saga, hold_expires_into_the_dlq_and_nothing_else)
{
	struct itest_dead dead[4];
	char body[512], outcome[32];
	struct mq *m;
	pid_t w;

	itest_fresh();
	w = itest_worker(2, (const char *[]){ "INBOX_HOLD_TTL=2s", NULL });
	m = itest_mq();
	itest_event(body, sizeof body, "ship-1", "ShipmentCreated", "lonely-1");
	itest_publish(m, "ShipmentCreated", body, "ship-1");
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM held_events", 1, WAIT_S), 1, "first it is held");
	cr_assert_eq(itest_dlq_drain(dead, 4, 1, WAIT_S), 1, "after the TTL it is dead-lettered, once");
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_str_eq(dead[0].reason, "hold-expired");
	cr_assert_str_eq(dead[0].message_id, "ship-1", "the DLQ copy keeps the original properties");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM held_events"), 0);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders"), 0);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"), 0);
	cr_assert(itest_str1("SELECT outcome FROM processed_messages WHERE message_id = ?", "ship-1", outcome,
	                     sizeof outcome));
	cr_assert_str_eq(outcome, "dead_lettered");
}

static int count_type(const struct itest_dead *d, int n, const char *mid)
{
	int c = 0;
	for (int i = 0; i < n; i++)
		c += strcmp(d[i].message_id, mid) == 0;
	return c;
}

Test(saga, compensations_leave_through_the_outbox)
{
	const char *out = "itest.out";
	struct itest_dead got[16];
	char body[512];
	struct mq *m;
	pid_t w;
	int n;

	itest_fresh();
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	m = itest_mq();
	/* o-a: cancelled after payment -> OrderPaid, RefundRequested.
	 * o-b: cancelled after reservation, the reservation arriving last ->
	 *      OrderPaid, RefundRequested, InventoryReleaseRequested. */
	itest_event(body, sizeof body, "a-1", "OrderCreated", "o-a");
	itest_publish(m, "OrderCreated", body, NULL);
	itest_event(body, sizeof body, "a-2", "PaymentAuthorized", "o-a");
	itest_publish(m, "PaymentAuthorized", body, NULL);
	itest_event(body, sizeof body, "a-3", "OrderCancelled", "o-a");
	itest_publish(m, "OrderCancelled", body, NULL);
	itest_event(body, sizeof body, "b-1", "OrderCreated", "o-b");
	itest_publish(m, "OrderCreated", body, NULL);
	itest_event(body, sizeof body, "b-2", "PaymentAuthorized", "o-b");
	itest_publish(m, "PaymentAuthorized", body, NULL);
	w = itest_worker(1, NULL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", 5, WAIT_S), 5);
	itest_event(body, sizeof body, "b-4", "OrderCancelled", "o-b");
	itest_publish(m, "OrderCancelled", body, NULL);
	itest_event(body, sizeof body, "b-3", "InventoryReserved", "o-b");
	itest_publish(m, "InventoryReserved", body, NULL);
	n = itest_drain(out, got, 16, 5, WAIT_S);
	itest_event(body, sizeof body, "b-5", "ShipmentCreated", "o-b");
	itest_publish(m, "ShipmentCreated", body, "b-5");
	{
		struct itest_dead dead[2];
		cr_assert_eq(itest_dlq_drain(dead, 2, 1, WAIT_S), 1);
		cr_assert_str_eq(dead[0].reason, "invalid-transition", "ShipmentCreated on a cancelled order");
	}
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_eq(n, 5, "five emitted messages, got %d", n);
	cr_assert_eq(count_type(got, n, "OrderPaid:o-a"), 1);
	cr_assert_eq(count_type(got, n, "RefundRequested:o-a"), 1);
	cr_assert_eq(count_type(got, n, "OrderPaid:o-b"), 1);
	cr_assert_eq(count_type(got, n, "RefundRequested:o-b"), 1);
	cr_assert_eq(count_type(got, n, "InventoryReleaseRequested:o-b"), 1);
	cr_assert_eq(itest_int1("SELECT version FROM orders WHERE id = ?", "o-b"), 4);
	{
		char outcome[32];
		cr_assert(itest_str1("SELECT outcome FROM processed_messages WHERE message_id = ?", "b-3", outcome,
		                     sizeof outcome));
		cr_assert_str_eq(outcome, "compensated");
	}
}

Test(saga, crash_between_commit_and_publish_loses_no_compensation)
{
	const char *out = "itest.out";
	struct itest_dead got[8];
	char body[512];
	struct mq *m;
	pid_t w;
	int st;

	itest_fresh();
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	m = itest_mq();
	itest_event(body, sizeof body, "c-1", "OrderCreated", "o-c");
	itest_publish(m, "OrderCreated", body, NULL);
	itest_event(body, sizeof body, "c-2", "OrderCancelled", "o-c");
	itest_publish(m, "OrderCancelled", body, NULL);
	w = itest_worker(1, NULL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", 2, WAIT_S), 2);
	itest_stop_ok(w);
	/* The payment arrives after the cancellation: compensated, and the
	 * process dies right after the commit, before ack and relay. */
	w = itest_worker(1, (const char *[]){ "INBOX_FAULT=after-commit", NULL });
	itest_event(body, sizeof body, "c-3", "PaymentAuthorized", "o-c");
	itest_publish(m, "PaymentAuthorized", body, NULL);
	st = itest_wait_exit(w, WAIT_S);
	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL"), 2,
	             "OrderPaid and RefundRequested committed, not yet published");
	w = itest_worker(1, NULL);
	cr_assert_eq(itest_drain(out, got, 8, 2, WAIT_S), 2);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL", 0, WAIT_S), 0);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_eq(count_type(got, 2, "RefundRequested:o-c"), 1);
	cr_assert_eq(count_type(got, 2, "OrderPaid:o-c"), 1);
	cr_assert_eq(itest_int1("SELECT version FROM orders WHERE id = ?", "o-c"), 3);
}

Test(saga, sharded_mode_keeps_publish_order_per_order, .timeout = 900)
{
	enum { ORDERS = 120 };
	static struct pub all[ORDERS * 4];
	struct pub_set set = { all, 0 };
	struct pub_slice slice = { &set, 0, 0, 1, true };
	pthread_t t;
	char logf[2][256];
	const char *env[] = { "INBOX_ORDERING=sharded", "INBOX_SHARDS=4", NULL };
	pid_t w[2];
	int64_t held = 0;

	/* Orders interleaved, each order's events in order. */
	for (int i = 0; i < 4; i++)
		for (int o = 0; o < ORDERS; o++) {
			struct pub *p = &all[set.n++];
			snprintf(p->order, sizeof p->order, "shard-%d", o);
			snprintf(p->id, sizeof p->id, "shard-%d-%d", o, i);
			p->type = seq_happy[i];
		}
	slice.to = set.n;
	itest_fresh();
	for (int p = 0; p < 2; p++) {
		char name[32];
		snprintf(name, sizeof name, "shard-%d", p);
		log_path(logf[p], sizeof logf[p], name);
		w[p] = itest_worker_logged(4, env, logf[p]);
	}
	/* Wait until both have declared the sharded topology and consume
	 * every shard: each of the four threads of each process consumes its
	 * shard once the topology is declared. */
	for (int p = 0; p < 2; p++)
		cr_assert_eq(itest_wait_log_lines(logf[p], (const char *const[]){ "consuming worker=", NULL }, 4, WAIT_S),
		             4, "process %d: not every thread consumes, see %s", p, logf[p]);
	cr_assert_eq(pthread_create(&t, NULL, publish_slice, &slice), 0);
	pthread_join(t, NULL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", 4 * ORDERS, WAIT_S), 4 * ORDERS);
	for (int p = 0; p < 2; p++)
		itest_stop_ok(w[p]);
	for (int p = 0; p < 2; p++)
		held += itest_log_sum(logf[p], "stopped", "held");
	cr_assert_eq(held, 0, "in-order publishing needs no holds in sharded mode");
	/* The ledger of each order is in publish order: the i-th event
	 * published (message id suffix i) became version i + 1. */
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"
	                       " WHERE message_id <> CONCAT(order_id, '-', version - 1)"),
	             0);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders WHERE status = 'Shipped' AND version = 4"), ORDERS);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE outcome <> 'applied'"), 0);
}

/* Consumers of queue, active or standby, from the broker's own list. */
static int shard_consumers(const char *queue)
{
	char root[4096], cmd[4600], line[512];
	FILE *p;
	int n = 0;

	snprintf(cmd, sizeof cmd, "%s ctl -q list_consumers -p inbox --no-table-headers queue_name 2>/dev/null",
	         itest_source("scripts/stack", root, sizeof root));
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	while (fgets(line, sizeof line, p) != NULL) {
		line[strcspn(line, "\r\n \t")] = '\0';
		n += strcmp(line, queue) == 0;
	}
	pclose(p);
	return n;
}

/* Fewer threads than shards: every shard must still have a consumer in
 * every process, or the events hashed to the uncovered shards sit in their
 * queues with nobody to take them while /readyz says ready. */
Test(saga, sharded_mode_with_fewer_threads_than_shards_strands_nothing, .timeout = 900)
{
	enum { ORDERS = 150, SHARDS = 4 };
	static struct pub all[ORDERS * 4];
	static char page[8192];
	struct pub_set set = { all, 0 };
	struct pub_slice slice = { &set, 0, 0, 1, true };
	pthread_t t;
	char logf[2][256], addr[2][64];
	pid_t w[2];

	for (int i = 0; i < 4; i++)
		for (int o = 0; o < ORDERS; o++) {
			struct pub *p = &all[set.n++];
			snprintf(p->order, sizeof p->order, "strand-%d", o);
			snprintf(p->id, sizeof p->id, "strand-%d-%d", o, i);
			p->type = seq_happy[i];
		}
	slice.to = set.n;
	itest_fresh();
	for (int p = 0; p < 2; p++) {
		char name[32];
		snprintf(name, sizeof name, "strand-%d", p);
		log_path(logf[p], sizeof logf[p], name);
		snprintf(addr[p], sizeof addr[p], "INBOX_METRICS_ADDR=127.0.0.1:%d", itest_metrics_port(p));
		w[p] = itest_worker_logged(2, (const char *[]){ "INBOX_ORDERING=sharded", addr[p], NULL }, logf[p]);
	}
	for (int p = 0; p < 2; p++)
		cr_assert_eq(itest_wait_http(itest_metrics_port(p), "/readyz", 200, page, sizeof page, WAIT_S), 200,
		             "%s", page);
	cr_assert_eq(pthread_create(&t, NULL, publish_slice, &slice), 0);
	pthread_join(t, NULL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", 4 * ORDERS, 90), 4 * ORDERS,
	             "every event applied, none left in a shard queue");
	for (int s = 0; s < SHARDS; s++) {
		char q[300];
		snprintf(q, sizeof q, "%s.shard.%d", itest_cfg()->queue, s);
		/* A wait, not a look: copies of a slice published twice
		 * (publish_slice) may still be on their way, as duplicates. */
		cr_assert_eq(itest_wait_depth(q, 0, WAIT_S), 0, "%s is drained", q);
		/* Single active consumer: the broker's count shows the active
		 * one only; list_consumers shows the standbys too. */
		cr_assert_eq(shard_consumers(q), 2, "%s has a consumer in each process", q);
	}
	for (int p = 0; p < 2; p++) {
		cr_assert_eq(itest_http_get(itest_metrics_port(p), "/metrics", page, sizeof page), 200);
		cr_assert_neq(strstr(page, "\ninbox_shards_without_consumer 0\n"), NULL, "%s", page);
	}
	for (int p = 0; p < 2; p++)
		itest_stop_ok(w[p]);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders WHERE status = 'Shipped' AND version = 4"), ORDERS);
}

/* More threads than shards: the extra threads are standby consumers of a
 * shard (single active consumer), so nothing changes for ordering and
 * nothing is stranded. */
Test(saga, sharded_mode_with_more_threads_than_shards_adds_standbys, .timeout = 900)
{
	enum { ORDERS = 60 };
	static struct pub all[ORDERS * 4];
	static char page[8192];
	struct pub_set set = { all, 0 };
	struct pub_slice slice = { &set, 0, 0, 1, true };
	pthread_t t;
	char logf[256], addr[64];
	pid_t w;

	for (int i = 0; i < 4; i++)
		for (int o = 0; o < ORDERS; o++) {
			struct pub *p = &all[set.n++];
			snprintf(p->order, sizeof p->order, "standby-%d", o);
			snprintf(p->id, sizeof p->id, "standby-%d-%d", o, i);
			p->type = seq_happy[i];
		}
	slice.to = set.n;
	cr_assert_eq(setenv("INBOX_ORDERING", "sharded", 1), 0);
	cr_assert_eq(setenv("INBOX_SHARDS", "2", 1), 0);
	itest_fresh();
	log_path(logf, sizeof logf, "standby");
	snprintf(addr, sizeof addr, "INBOX_METRICS_ADDR=127.0.0.1:%d", itest_metrics_port(0));
	w = itest_worker_logged(3, (const char *[]){ addr, NULL }, logf);
	cr_assert_eq(itest_wait_http(itest_metrics_port(0), "/readyz", 200, page, sizeof page, WAIT_S), 200, "%s", page);
	cr_assert_eq(pthread_create(&t, NULL, publish_slice, &slice), 0);
	pthread_join(t, NULL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", 4 * ORDERS, 90), 4 * ORDERS);
	cr_assert_eq(shard_consumers("orders.inbox.shard.0"), 2, "threads 0 and 2");
	cr_assert_eq(shard_consumers("orders.inbox.shard.1"), 1, "thread 1");
	itest_stop_ok(w);
	cr_assert_eq(itest_log_sum(logf, "stopped", "held"), 0, "in-order publishing needs no holds");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"
	                       " WHERE message_id <> CONCAT(order_id, '-', version - 1)"),
	             0);
}

/*
 * The saga over the matrix of issue 43, part C: a scenario of
 * inbox-loadgen (every arrival order within the window, duplicates of
 * every kind, conflicts, malformed messages) published to two workers and
 * verified against the plan of the definition that runs, for
 *   lifecycle {built-in order, lifecycles/shipment.json,
 *              tests/lifecycles/ticket_notifies_thrice.json (one type
 *              emitted by three events, each under its own id)}
 *   x envelope {native, CloudEvents structured, CloudEvents binary}
 *   x dispatch {thread, relay} (INBOX_OUTBOX_DISPATCH).
 * Not the full product (18 cells): a covering design of 9 in which every
 * pair of values of two factors meets at least once — a seam opens
 * between two features, and each pair is where it would show.  Every
 * lifecycle meets every envelope (9 = 3 x 3, the largest pair product),
 * and the dispatch alternates so that each lifecycle and each envelope
 * meets both dispatch modes.  CloudEvents structured also emits as
 * CloudEvents (INBOX_EMIT_ENVELOPE), which verify reads; binary runs the
 * worker with INBOX_ENVELOPE=auto, structured with cloudevents.  One
 * cell: doc/testing.md, "The matrix".
 */
struct cell {
	const char *lifecycle; /* a file of the tree, or NULL: the built-in one */
	const char *envelope;  /* inbox-loadgen publish --envelope */
	const char *dispatch;
};

/* The accounting suite's rule, for every cell: the two workers' counters,
 * added, say what the database and the DLQ hold.  Each key ends in one
 * row of processed_messages and is counted once, in its final outcome, by
 * whichever worker settled it; every dead letter is one DLQ copy. */
static void cell_accounts(const char *name)
{
	static char page[2][65536];
	static const char *const outcomes[] = { "applied", "ignored", "compensated" };
	double sum;

	for (int k = 0; k < 2; k++)
		cr_assert_eq(itest_http_get(itest_metrics_port(k), "/metrics", page[k], sizeof page[k]), 200,
		             "%s: worker %d's /metrics", name, k);
	for (size_t i = 0; i < sizeof outcomes / sizeof outcomes[0]; i++) {
		char metric[96];

		snprintf(metric, sizeof metric, "inbox_messages_total{outcome=\"%s\"}", outcomes[i]);
		sum = itest_metric(page[0], metric) + itest_metric(page[1], metric);
		cr_expect_eq((int64_t)sum, itest_int1("SELECT COUNT(*) FROM processed_messages WHERE outcome = ?", outcomes[i]),
		             "%s: %s, both workers, against the inbox rows", name, metric);
	}
	sum = itest_metric(page[0], "inbox_messages_total{outcome=\"dead_lettered\"}") +
	      itest_metric(page[1], "inbox_messages_total{outcome=\"dead_lettered\"}");
	cr_expect_eq((uint32_t)sum, itest_queue_depth(itest_cfg()->dlq), "%s: every dead letter is one DLQ copy", name);
	sum = itest_metric(page[0], "inbox_outbox_pending") + itest_metric(page[1], "inbox_outbox_pending");
	cr_expect_eq((int64_t)sum, 0, "%s: nothing left in the outbox", name);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL"), 0, "%s", name);
}

static void run_cell(const struct cell *c, const char *name)
{
	const char *root = getenv("INBOX_SOURCE_ROOT");
	char file[1024] = "", env_lc[1100], env_d[64], ledger[256], plog[300], vlog[300];
	const char *env[8] = { env_d };
	char metrics[2][64];
	const char *migrate[] = { "migrate", NULL };
	const char *pub[24] = { "publish", "--ledger", ledger, "--orders", "150", "--conflicts", "5", "--malformed", "16",
	                        "--invalid-share", "0.05", "--connections", "4", "--reorder-window", "3",
	                        "--settle-timeout", "120", "--envelope", c->envelope };
	const char *ver[12] = { "verify", "--ledger", ledger, "--timeout", "120" };
	int ne = 1, np = 19, nv = 5, st, rc;
	pid_t w1, w2;

	cr_assert_not_null(root, "INBOX_SOURCE_ROOT is set by meson");
	snprintf(env_d, sizeof env_d, "INBOX_OUTBOX_DISPATCH=%s", c->dispatch);
	if (strcmp(c->envelope, "cloudevents") == 0) {
		env[ne++] = "INBOX_ENVELOPE=cloudevents";
		env[ne++] = "INBOX_EMIT_ENVELOPE=cloudevents";
	} else if (strcmp(c->envelope, "cloudevents-binary") == 0) {
		env[ne++] = "INBOX_ENVELOPE=auto";
	}
	itest_fresh();
	if (c->lifecycle != NULL) {
		char tables[LC_SCHEMA_TABLES][LC_NAME_MAX + 16];
		struct lc_errors errs;
		struct lc_def *def;

		snprintf(file, sizeof file, "%s/%s", root, c->lifecycle);
		def = lc_load_file(file, &errs);
		cr_assert_not_null(def, "%s loads", file);
		lc_schema_tables(def, tables);
		lc_free(def);
		snprintf(env_lc, sizeof env_lc, "INBOX_LIFECYCLE=%s", file);
		env[ne++] = env_lc;
		pub[np++] = ver[nv++] = "--lifecycle";
		pub[np++] = ver[nv++] = file;
		/* itest_fresh drops the order's tables; a definition's own are
		 * dropped here, so migrate creates them as this build says. */
		for (size_t i = 0; i < LC_SCHEMA_TABLES; i++) {
			char sql[sizeof tables + 32];
			snprintf(sql, sizeof sql, "DROP TABLE IF EXISTS `%s`", tables[i]);
			cr_assert_eq(db_exec(itest_db(), sql), ST_OK, "%s: %s", sql, db_errmsg(itest_db()));
		}
	}
	env[ne] = NULL;
	pub[np] = NULL;
	ver[nv] = NULL;
	snprintf(ledger, sizeof ledger, "/tmp/inbox-itest-%d-matrix-%s.jsonl", (int)getpid(), name);
	snprintf(plog, sizeof plog, "%s.publish.log", ledger);
	snprintf(vlog, sizeof vlog, "%s.verify.log", ledger);
	st = itest_wait_exit(itest_spawn(migrate, env), 120);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: migrate failed (status %d)", name, st);
	for (int k = 0; k < 2; k++)
		snprintf(metrics[k], sizeof metrics[k], "INBOX_METRICS_ADDR=127.0.0.1:%d", itest_metrics_port(k));
	env[ne] = metrics[0];
	w1 = itest_worker(3, env);
	env[ne] = metrics[1];
	w2 = itest_worker(3, env);
	env[ne] = NULL;
	rc = itest_loadgen(pub, NULL, plog, 300);
	if (rc == 0)
		rc = itest_loadgen(ver, NULL, vlog, 300) == 0 ? 0 : 100;
	if (rc == 0)
		cell_accounts(name);
	itest_stop_ok(w1);
	itest_stop_ok(w2);
	cr_assert_eq(rc == 100 ? 0 : rc, 0, "%s: publish failed, see %s", name, plog);
	cr_assert_eq(rc, 0, "%s: verify found what the ledger does not expect, see %s", name, vlog);
	cr_assert(itest_log_has(vlog, "missing 0, doubled 0"), "%s: see %s", name, vlog);
	cr_assert(itest_log_has(vlog, "without the stable id 0)"), "%s: see %s", name, vlog);
}

#define SHIPMENT "lifecycles/shipment.json"
#define TICKET "tests/lifecycles/ticket_notifies_thrice.json"
#define CELL(lc, lcname, env, envname, disp)                                                              \
	Test(saga, matrix_##lcname##_##envname##_##disp, .timeout = 600)                                   \
	{                                                                                                   \
		static const struct cell c = { lc, env, #disp };                                            \
		run_cell(&c, #lcname "-" #envname "-" #disp);                                               \
	}
CELL(NULL, builtin, "native", native, thread)
CELL(NULL, builtin, "cloudevents", cloudevents, relay)
CELL(NULL, builtin, "cloudevents-binary", cloudevents_binary, thread)
CELL(SHIPMENT, shipment, "native", native, relay)
CELL(SHIPMENT, shipment, "cloudevents", cloudevents, thread)
CELL(SHIPMENT, shipment, "cloudevents-binary", cloudevents_binary, relay)
CELL(TICKET, ticket, "native", native, thread)
CELL(TICKET, ticket, "cloudevents", cloudevents, relay)
CELL(TICKET, ticket, "cloudevents-binary", cloudevents_binary, thread)
