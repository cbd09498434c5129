/*
 * test_holds.c - held events against the real stack: a released event takes
 * effect exactly as it would have in order, with every field of its data
 * (the property test walks every arrival order of each saga, with
 * duplicates); release looks at every held event of an order however many
 * there are; one expiry pass expires as many rows as it was asked for; and
 * neither expiry nor release wedges on a stored body larger than today's
 * INBOX_MAX_BODY.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "inbox.h"
#include "itest.h"
#include "msg.h"
#include "spec_oracle.h"
#include "status.h"

#define WAIT_S 240

/* The events of a saga by letter. */
static const char *type_of(char letter)
{
	switch (letter) {
	case 'C':
		return "OrderCreated";
	case 'P':
		return "PaymentAuthorized";
	case 'R':
		return "InventoryReserved";
	case 'S':
		return "ShipmentCreated";
	case 'X':
		return "OrderCancelled";
	}
	cr_assert_fail("no event type for '%c'", letter);
	return NULL;
}

/* An event body.  Message ids end in "-<letter>" so the ledger can be read
 * back per event.  Only the payment carries an amount (SPEC's example); the
 * others carry data of their own, which must change nothing. */
static void saga_event(char *buf, size_t cap, const char *order, char letter, long amount, size_t pad)
{
	char *padding = malloc(pad + 1);
	int n;

	cr_assert_not_null(padding);
	memset(padding, 'x', pad);
	padding[pad] = '\0';
	if (letter == 'P')
		n = snprintf(buf, cap,
		             "{\"message_id\":\"%s-P\",\"source\":\"payments\",\"type\":\"PaymentAuthorized\","
		             "\"order_id\":\"%s\",\"occurred_at\":\"2026-11-29T18:00:00Z\","
		             "\"data\":{\"amount_cents\":%ld,\"currency\":\"EUR\",\"pad\":\"%s\"}}",
		             order, order, amount, padding);
	else
		n = snprintf(buf, cap,
		             "{\"message_id\":\"%s-%c\",\"source\":\"payments\",\"type\":\"%s\",\"order_id\":\"%s\","
		             "\"occurred_at\":\"2026-11-29T18:00:00Z\",\"data\":{\"note\":\"%c\",\"pad\":\"%s\"}}",
		             order, letter, type_of(letter), order, letter, padding);
	free(padding);
	cr_assert(n > 0 && (size_t)n < cap, "event body does not fit");
}

static void publish_event(struct mq *m, const char *order, char letter, long amount)
{
	char body[1024];

	saga_event(body, sizeof body, order, letter, amount, 0);
	itest_publish_async(m, type_of(letter), body, NULL);
}

/* ---- the property test ---------------------------------------------------- */

/*
 * The event sets of the saga and what SPEC.md says each ends in, written by
 * hand: the state and version of the orders table, the amount of the
 * payment (NULL with no payment), paid_at set iff a payment took effect, and
 * the compensations of the Orders section.
 *
 * A set whose cancellation may come before or after a payment or a
 * reservation has several in-order histories: OrderCancelled then
 * PaymentAuthorized (the payment is compensated) is as much "in order" as the
 * other way round, and the worker cannot tell which the producers meant when
 * both arrive before their OrderCreated.  Whatever the arrival order, the
 * order row must equal that of every history (they agree), and the ledger,
 * the outcomes and the emitted rows must equal those of one history, each of
 * which is computed by running it in order through the worker.
 */
struct saga_set {
	const char *name;
	const char *events;          /* the set, as letters */
	const char *histories[4];    /* every valid in-order sequence of it */
	long amount;                 /* data.amount_cents of its payment */
	/* by hand, from SPEC.md */
	const char *status;
	int version;
	const char *amount_cents;    /* "NULL" when never paid */
	const char *paid;            /* "paid" / "unpaid" (paid_at NULL or not) */
	const char *emitted;         /* outbox types, sorted, comma-separated */
};

static const struct saga_set sets[] = {
	{ "H", "CPRS", { "CPRS" }, 1111, "Shipped", 4, "1111", "paid", "OrderPaid" },
	{ "XR", "CPRX", { "CPRX", "CPXR", "CXPR", "CXRP" }, 2222, "Cancelled", 4, "2222", "paid",
	  "InventoryReleaseRequested,OrderPaid,RefundRequested" },
	{ "XP", "CPX", { "CPX", "CXP" }, 3333, "Cancelled", 3, "3333", "paid", "OrderPaid,RefundRequested" },
	{ "XC", "CX", { "CX" }, 0, "Cancelled", 2, "NULL", "unpaid", "" },
};
#define NSETS (int)(sizeof sets / sizeof sets[0])

/* The orders row, every column that is not a timestamp. */
static const char sql_row[] =
	"SELECT CONCAT_WS('|', status, version, flags, COALESCE(amount_cents, 'NULL'),"
	" IF(paid_at IS NULL, 'unpaid', 'paid')) FROM orders WHERE id = ?";
/* The ledger in version order: event, type, outcome, from -> to. */
static const char sql_ledger[] =
	"SELECT GROUP_CONCAT(CONCAT_WS(',', version, SUBSTRING_INDEX(message_id, '-', -1), type, outcome,"
	" from_status, to_status) ORDER BY version SEPARATOR ';') FROM order_events WHERE order_id = ?";
/* The emitted rows in outbox order: type, stable id, cause, exchange. */
static const char sql_outbox[] =
	"SELECT GROUP_CONCAT(CONCAT_WS(',', type, message_id = CONCAT(type, ':', order_id),"
	" JSON_VALUE(CONVERT(body USING utf8mb4), '$.data.cause_type'),"
	" SUBSTRING_INDEX(JSON_VALUE(CONVERT(body USING utf8mb4), '$.data.cause_message_id'), '-', -1),"
	" JSON_VALUE(CONVERT(body USING utf8mb4), '$.order_id') = order_id, exchange)"
	" ORDER BY id SEPARATOR ';') FROM outbox WHERE order_id = ?";
/* Each event's final inbox outcome. */
static const char sql_outcomes[] =
	"SELECT GROUP_CONCAT(CONCAT(SUBSTRING_INDEX(message_id, '-', -1), '=', outcome, ':', COALESCE(reason, ''))"
	" ORDER BY message_id SEPARATOR ';') FROM processed_messages WHERE order_id = ?";
static const char sql_emitted[] =
	"SELECT GROUP_CONCAT(type ORDER BY type SEPARATOR ',') FROM outbox WHERE order_id = ?";

struct outcome {
	char row[256];
	char history[2048]; /* ledger, outbox and outcomes */
};

static void read_outcome(const char *order, struct outcome *o)
{
	char ledger[512], outbox[1024], outcomes[256];

	cr_assert(itest_str1(sql_row, order, o->row, sizeof o->row), "order %s missing", order);
	cr_assert(itest_str1(sql_ledger, order, ledger, sizeof ledger));
	cr_assert(itest_str1(sql_outbox, order, outbox, sizeof outbox));
	cr_assert(itest_str1(sql_outcomes, order, outcomes, sizeof outcomes));
	snprintf(o->history, sizeof o->history, "ledger[%s] outbox[%s] outcomes[%s]", ledger, outbox, outcomes);
}

/* What SPEC.md says, independently of any run. */
static void check_by_hand(const struct saga_set *s, const char *order)
{
	char want[128], emitted[256];
	struct outcome o;

	read_outcome(order, &o);
	snprintf(want, sizeof want, "%s|%d|", s->status, s->version);
	cr_assert(strncmp(o.row, want, strlen(want)) == 0, "%s: row %s, SPEC says %s...", order, o.row, want);
	snprintf(want, sizeof want, "|%s|%s", s->amount_cents, s->paid);
	cr_assert(strlen(o.row) >= strlen(want) && strcmp(o.row + strlen(o.row) - strlen(want), want) == 0,
	          "%s: row %s, SPEC says amount_cents and paid_at ...%s", order, o.row, want);
	cr_assert(itest_str1(sql_emitted, order, emitted, sizeof emitted));
	cr_assert_str_eq(emitted, s->emitted, "%s: emitted %s, SPEC says %s", order, emitted, s->emitted);
}

static enum msg_type event_of(char letter)
{
	switch (letter) {
	case 'C':
		return MSG_ORDER_CREATED;
	case 'P':
		return MSG_PAYMENT_AUTHORIZED;
	case 'R':
		return MSG_INVENTORY_RESERVED;
	case 'S':
		return MSG_SHIPMENT_CREATED;
	default:
		break;
	}
	return MSG_ORDER_CANCELLED;
}

/* Each event's outcome in an in-order history, from SPEC's table
 * (loadgen/spec_oracle.c, typed in from SPEC.md, never agg_decide). */
static void check_outcomes_by_spec(const char *history, const char *order)
{
	enum msg_type ev[8];
	enum spec_outcome out[8];
	size_t n = strlen(history);
	struct spec_fold f;
	char want[256] = "", letters[8], got[256];

	cr_assert_leq(n, sizeof ev / sizeof ev[0]);
	for (size_t i = 0; i < n; i++)
		ev[i] = event_of(history[i]);
	cr_assert_eq(spec_fold(ev, n, out, NULL, &f), 0, "%s: SPEC knows no such history", history);
	/* sql_outcomes lists them by message id, that is by letter */
	memcpy(letters, history, n + 1);
	for (size_t i = 0; i < n; i++) {
		size_t best = 0, l = strlen(want);
		for (size_t k = 1; k < n; k++)
			if (letters[k] < letters[best])
				best = k;
		snprintf(want + l, sizeof want - l, "%s%c=%s:", l ? ";" : "", letters[best], spec_outcome_name(out[best]));
		letters[best] = '\x7f';
	}
	cr_assert(itest_str1(sql_outcomes, order, got, sizeof got));
	cr_assert_str_eq(got, want, "%s (in order %s): outcomes %s, SPEC says %s", order, history, got, want);
}

static bool next_permutation(char *a, int n)
{
	int i = n - 2, j = n - 1;

	while (i >= 0 && a[i] >= a[i + 1])
		i--;
	if (i < 0)
		return false;
	while (a[j] <= a[i])
		j--;
	{
		char t = a[i];
		a[i] = a[j];
		a[j] = t;
	}
	for (int l = i + 1, r = n - 1; l < r; l++, r--) {
		char t = a[l];
		a[l] = a[r];
		a[r] = t;
	}
	return true;
}

/* One order to publish: its id, its set and its arrival sequence. */
struct arrival {
	char order[32];
	int set;
	char seq[16]; /* letters, duplicates included */
};

static void every_arrival_order(const char *const *env)
{
	static struct arrival a[256];
	int n = 0, unique = 0, refs = 0;
	unsigned seed = 20261130;
	struct mq *m;
	pid_t w;

	/* The histories, each in order, once. */
	for (int s = 0; s < NSETS; s++)
		for (int h = 0; h < 4 && sets[s].histories[h] != NULL; h++) {
			snprintf(a[n].order, sizeof a[n].order, "ref-%s-%d", sets[s].name, h);
			a[n].set = s;
			snprintf(a[n].seq, sizeof a[n].seq, "%s", sets[s].histories[h]);
			unique += (int)strlen(a[n].seq);
			n++;
			refs++;
		}
	/* Every permutation of every set, a third of the events twice (the
	 * copy at a random later place, so some arrive while still held). */
	for (int s = 0; s < NSETS; s++) {
		char perm[8];
		int len = (int)strlen(sets[s].events), k = 0;

		snprintf(perm, sizeof perm, "%s", sets[s].events); /* sorted: the first permutation */
		do {
			char seq[16];
			int sl = len;

			memcpy(seq, perm, (size_t)len);
			seq[len] = '\0';
			for (int i = 0; i < len; i++) {
				if (rand_r(&seed) % 3 != 0)
					continue;
				/* insert a copy of perm[i] somewhere after its first arrival */
				int first = (int)(strchr(seq, perm[i]) - seq);
				int at = first + 1 + (int)(rand_r(&seed) % (unsigned)(sl - first));
				memmove(seq + at + 1, seq + at, (size_t)(sl - at));
				seq[at] = perm[i];
				sl++;
				seq[sl] = '\0';
			}
			cr_assert_lt(n, (int)(sizeof a / sizeof a[0]));
			snprintf(a[n].order, sizeof a[n].order, "pp-%s-%d", sets[s].name, k++);
			a[n].set = s;
			snprintf(a[n].seq, sizeof a[n].seq, "%s", seq);
			unique += len;
			n++;
		} while (next_permutation(perm, len));
	}

	itest_fresh();
	/* One thread: each order's events are handled in exactly the order
	 * published. */
	w = itest_worker(1, env);
	m = itest_mq();
	for (int i = 0; i < n; i++)
		for (const char *c = a[i].seq; *c != '\0'; c++)
			publish_event(m, a[i].order, *c, sets[a[i].set].amount);
	itest_confirm_all(m);
	mq_close(&m);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages WHERE outcome <> 'held'", unique, WAIT_S),
	             unique, "every event settled");
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages"), unique, "one inbox row per event");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM held_events"), 0, "nothing remains held");
	cr_assert_eq(itest_int("SELECT COALESCE(SUM(held), 0) FROM order_locks"), 0);
	cr_assert_eq(itest_queue_depth(itest_cfg()->dlq), 0, "no valid history dead-letters anything");

	/* The references: every history of a set ends in the same row, and in
	 * what SPEC.md says. */
	for (int i = 0; i < refs; i++) {
		struct outcome o, first;

		check_by_hand(&sets[a[i].set], a[i].order);
		check_outcomes_by_spec(a[i].seq, a[i].order);
		read_outcome(a[i].order, &o);
		for (int j = 0; j < i; j++)
			if (a[j].set == a[i].set) {
				read_outcome(a[j].order, &first);
				cr_assert_str_eq(o.row, first.row, "%s and %s: two histories, two rows", a[i].order,
				                 a[j].order);
			}
	}
	/* Every arrival order ends as one of its set's histories did in order. */
	for (int i = refs; i < n; i++) {
		struct outcome o, ref;
		bool matched = false;
		char hist[4096] = "";

		read_outcome(a[i].order, &o);
		for (int j = 0; j < refs && !matched; j++) {
			size_t hl = strlen(hist);
			if (a[j].set != a[i].set)
				continue;
			read_outcome(a[j].order, &ref);
			cr_assert_str_eq(o.row, ref.row, "%s (arrival %s): row %s, in order (%s) %s", a[i].order,
			                 a[i].seq, o.row, a[j].seq, ref.row);
			matched = strcmp(o.history, ref.history) == 0;
			snprintf(hist + hl, sizeof hist - hl, "\n  in order %s: %s", a[j].seq, ref.history);
		}
		cr_assert(matched, "%s (arrival %s) ends as no in-order history:\n  got: %s%s", a[i].order, a[i].seq,
		          o.history, hist);
		check_by_hand(&sets[a[i].set], a[i].order);
	}
}

Test(holds, every_arrival_order_with_data_and_duplicates_ends_as_in_order, .timeout = 900)
{
	every_arrival_order(NULL);
}

Test(holds, every_arrival_order_ends_as_in_order_batched, .timeout = 900)
{
	every_arrival_order((const char *[]){ "INBOX_BATCH=8", NULL });
}

/* ---- item by item ----------------------------------------------------------- */

/* The example: the payment's amount survives its hold. */
Test(holds, held_payment_is_applied_with_its_amount)
{
	char amount[32];
	struct mq *m;
	pid_t w;

	itest_fresh();
	w = itest_worker(1, NULL);
	m = itest_mq();
	publish_event(m, "amt-1", 'P', 4200);
	itest_confirm_all(m);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM held_events", 1, WAIT_S), 1, "first the payment is held");
	publish_event(m, "amt-1", 'C', 0);
	itest_confirm_all(m);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM orders WHERE status = 'Paid'", 1, WAIT_S), 1);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert(itest_str1("SELECT COALESCE(amount_cents, 'NULL') FROM orders WHERE id = ?", "amt-1", amount,
	                     sizeof amount));
	cr_assert_str_eq(amount, "4200", "in order the order ends with 4200");
	cr_assert_eq(itest_int1("SELECT paid_at IS NOT NULL FROM orders WHERE id = ?", "amt-1"), 1);
}

/* A payment that carries no amount leaves amount_cents NULL, in order and
 * held alike: "no amount" is not an amount of 0. */
Test(holds, payment_without_amount_leaves_amount_null)
{
	char body[512];
	struct mq *m;
	pid_t w;

	itest_fresh();
	w = itest_worker(1, NULL);
	m = itest_mq();
	for (int held = 0; held < 2; held++) {
		const char *order = held ? "noamt-held" : "noamt-inorder";
		char created[512];
		snprintf(body, sizeof body,
		         "{\"message_id\":\"%s-P\",\"type\":\"PaymentAuthorized\",\"order_id\":\"%s\",\"data\":{}}",
		         order, order);
		snprintf(created, sizeof created, "{\"message_id\":\"%s-C\",\"type\":\"OrderCreated\",\"order_id\":\"%s\"}",
		         order, order);
		if (held) {
			itest_publish(m, "PaymentAuthorized", body, NULL);
			cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM held_events", 1, WAIT_S), 1);
			itest_publish(m, "OrderCreated", created, NULL);
		} else {
			itest_publish(m, "OrderCreated", created, NULL);
			itest_publish(m, "PaymentAuthorized", body, NULL);
		}
	}
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM orders WHERE status = 'Paid'", 2, WAIT_S), 2);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM orders WHERE amount_cents IS NULL AND paid_at IS NOT NULL"), 2,
	             "a payment without data.amount_cents must leave amount_cents NULL (found %lld orders with it set)",
	             (long long)itest_int("SELECT COUNT(*) FROM orders WHERE amount_cents IS NOT NULL"));
}

/* 70 held shipments ahead of the payment: the payment must be found and
 * applied when the order is created, and every shipment settled once the
 * order can take them, well inside the hold TTL. */
Test(holds, release_considers_every_held_event, .timeout = 600)
{
	enum { SHIPMENTS = 70 };
	char body[1024], id[64], status[32], amount[32];
	struct mq *m;
	pid_t w;

	itest_fresh();
	w = itest_worker(1, (const char *[]){ "INBOX_HOLD_TTL=1h", NULL });
	m = itest_mq();
	for (int i = 0; i < SHIPMENTS; i++) {
		snprintf(id, sizeof id, "many-S%d", i);
		itest_event(body, sizeof body, id, "ShipmentCreated", "many");
		itest_publish_async(m, "ShipmentCreated", body, NULL);
	}
	publish_event(m, "many", 'P', 4200);
	publish_event(m, "many", 'C', 0);
	itest_confirm_all(m);
	/* Bounded well below the hour of INBOX_HOLD_TTL: a payment left
	 * unreleased would wait for it. */
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM orders WHERE id = 'many' AND status = 'Paid'", 1, 60), 1,
	             "the 71st held event (the payment) must be released with the order's creation");
	cr_assert(itest_str1("SELECT COALESCE(amount_cents, 'NULL') FROM orders WHERE id = ?", "many", amount,
	                     sizeof amount));
	cr_assert_str_eq(amount, "4200");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM held_events"), SHIPMENTS, "the shipments still wait");
	cr_assert_eq(itest_int1("SELECT held FROM order_locks WHERE order_id = ?", "many"), SHIPMENTS);
	/* The reservation lets the first shipment apply; the other 69 are then
	 * stale, and all of them settle. */
	publish_event(m, "many", 'R', 0);
	itest_confirm_all(m);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM held_events", 0, 60), 0, "every held event settled");
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert(itest_str1("SELECT status FROM orders WHERE id = ?", "many", status, sizeof status));
	cr_assert_str_eq(status, "Shipped");
	cr_assert_eq(itest_int1("SELECT version FROM orders WHERE id = ?", "many"), 4);
	cr_assert_eq(itest_int1("SELECT held FROM order_locks WHERE order_id = ?", "many"), 0);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events WHERE type = 'ShipmentCreated'"), 1);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events WHERE type = 'ShipmentCreated'"
	                       " AND message_id = 'many-S0'"),
	             1, "the first shipment held is the one applied");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE outcome = 'ignored'"), SHIPMENTS - 1);
	cr_assert_eq(itest_queue_depth(itest_cfg()->dlq), 0);
}

/* Through the inbox API: 64 expired holds and one pass asked for 64. */
Test(holds, one_expiry_pass_expires_every_row_it_asked_for)
{
	enum { N = 64 };
	struct cfg conf;
	struct db *d = NULL;
	struct inbox *ib = NULL;
	int expired = -1;

	itest_fresh();
	conf = *itest_cfg();
	conf.hold_ttl_s = 0; /* every hold is past its TTL at once */
	cr_assert_eq(db_open(&d, &conf.db), ST_OK);
	cr_assert_eq(inbox_open(&ib, d, &conf), ST_OK);
	for (int i = 0; i < N; i++) {
		char body[1024], order[32];
		struct msg msg;
		struct inbox_result res;

		snprintf(order, sizeof order, "exp-%d", i);
		saga_event(body, sizeof body, order, 'S', 0, 0);
		cr_assert_eq(msg_parse(body, strlen(body), (size_t)conf.max_body, NULL, &msg), MSG_REASON_NONE);
		struct inbox_in in = { .msg = &msg, .body = body, .len = strlen(body),
		                       .routing_key = "order.ShipmentCreated" };
		cr_assert_eq(inbox_run(ib, &in, 1, &res), ST_OK, "%s", db_errmsg(d));
		cr_assert_eq(res.outcome, INBOX_HELD);
	}
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM held_events"), N);
	cr_assert_eq(inbox_expire_holds(ib, N, &expired), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(expired, N, "one pass asked for %d rows expired %d", N, expired);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM held_events"), 0);
	cr_assert_eq(itest_int("SELECT COALESCE(SUM(held), 0) FROM order_locks"), 0);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages"
	                       " WHERE outcome = 'dead_lettered' AND reason = 'hold-expired'"),
	             N);
	cr_assert_eq(itest_int1("SELECT COUNT(*) FROM outbox WHERE exchange = ?"
	                        " AND JSON_VALUE(headers, '$.\"x-inbox-reason\"') = 'hold-expired'",
	                        conf.dlx),
	             N);
	inbox_close(&ib);
	db_close(&d);
}

/* Hold one event through the inbox API (its own batch). */
static void hold_one(struct inbox *ib, struct db *d, const struct cfg *conf, const char *order, char letter)
{
	char body[1024];
	struct msg msg;
	struct inbox_result res;

	saga_event(body, sizeof body, order, letter, 0, 0);
	cr_assert_eq(msg_parse(body, strlen(body), (size_t)conf->max_body, NULL, &msg), MSG_REASON_NONE);
	struct inbox_in in = { .msg = &msg, .body = body, .len = strlen(body), .routing_key = "order.itest" };
	cr_assert_eq(inbox_run(ib, &in, 1, &res), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(res.outcome, INBOX_HELD);
}

/* A pass of hold expiry costs the same round trips for one expired row as
 * for 64 (issue 43: four round trips a row, each in a transaction of its
 * own, before), here with two rows of one order among them. */
Test(holds, an_expiry_pass_costs_the_same_round_trips_however_many_rows)
{
	enum { ORDERS = 32 };
	struct cfg conf;
	struct db *d = NULL;
	struct inbox *ib = NULL;
	uint64_t before, one, many;
	int expired = -1;
	char order[32];

	itest_fresh();
	conf = *itest_cfg();
	conf.hold_ttl_s = 0; /* every hold is past its TTL at once */
	cr_assert_eq(db_open(&d, &conf.db), ST_OK);
	cr_assert_eq(inbox_open(&ib, d, &conf), ST_OK);
	hold_one(ib, d, &conf, "exp1", 'S');
	before = db_round_trips(d);
	cr_assert_eq(inbox_expire_holds(ib, 64, &expired), ST_OK, "%s", db_errmsg(d));
	one = db_round_trips(d) - before;
	cr_assert_eq(expired, 1);
	for (int i = 0; i < ORDERS; i++) {
		snprintf(order, sizeof order, "expm-%d", i);
		hold_one(ib, d, &conf, order, 'S');
		hold_one(ib, d, &conf, order, 'R');
	}
	before = db_round_trips(d);
	cr_assert_eq(inbox_expire_holds(ib, 64, &expired), ST_OK, "%s", db_errmsg(d));
	many = db_round_trips(d) - before;
	cr_assert_eq(expired, 2 * ORDERS);
	cr_expect(one <= 3, "a pass expiring 1 row: %llu round trips", (unsigned long long)one);
	cr_expect_eq(many, one, "a pass expiring %d rows: %llu round trips, 1 row: %llu", 2 * ORDERS,
	             (unsigned long long)many, (unsigned long long)one);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM held_events"), 0);
	cr_assert_eq(itest_int("SELECT COALESCE(SUM(held), 0) FROM order_locks"), 0);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM processed_messages"
	                       " WHERE outcome = 'dead_lettered' AND reason = 'hold-expired'"),
	             2 * ORDERS + 1);
	cr_assert_eq(itest_int1("SELECT COUNT(*) FROM outbox WHERE exchange = ? AND body LIKE '%\"expm-7-R\"%'",
	                        conf.dlx), 1, "each dead-letter copy carries its own body");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_locks WHERE order_id LIKE 'expm-%' AND locks >= 3"), ORDERS,
	             "each order's lock was written by the pass");
	inbox_close(&ib);
	db_close(&d);
}

/* A body held under the default INBOX_MAX_BODY, and the worker restarted
 * with a smaller one. */
enum { BIG_PAD = 20000 };

Test(holds, oversized_stored_body_expires_whole_into_the_dlq, .timeout = 600)
{
	static char body[BIG_PAD + 1024];
	struct itest_dead dead[4];
	char outcome[32];
	struct mq *m;
	pid_t w;

	itest_fresh();
	w = itest_worker(1, (const char *[]){ "INBOX_HOLD_TTL=1h", NULL });
	m = itest_mq();
	saga_event(body, sizeof body, "big-e", 'S', 0, BIG_PAD);
	itest_publish(m, "ShipmentCreated", body, "big-e-S");
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM held_events", 1, WAIT_S), 1);
	itest_stop_ok(w);
	w = itest_worker(1, (const char *[]){ "INBOX_MAX_BODY=1024", "INBOX_HOLD_TTL=2s", NULL });
	cr_assert_eq(itest_dlq_drain(dead, 4, 1, 60), 1, "the hold must expire into the DLQ");
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL", 0, 60), 0);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_str_eq(dead[0].reason, "hold-expired");
	cr_assert_str_eq(dead[0].message_id, "big-e-S");
	cr_assert_eq(dead[0].len, strlen(body), "the whole body: %zu bytes of %zu", dead[0].len, strlen(body));
	cr_assert_eq(dead[0].body_hash, itest_hash(body, strlen(body)));
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM held_events"), 0);
	cr_assert(itest_str1("SELECT outcome FROM processed_messages WHERE message_id = ?", "big-e-S", outcome,
	                     sizeof outcome));
	cr_assert_str_eq(outcome, "dead_lettered");
}

Test(holds, oversized_stored_body_is_released_whole, .timeout = 600)
{
	static char pay[BIG_PAD + 1024], ship[BIG_PAD + 1024];
	struct itest_dead dead[4];
	char amount[32], status[32];
	struct mq *m;
	pid_t w;

	itest_fresh();
	w = itest_worker(1, (const char *[]){ "INBOX_HOLD_TTL=1h", NULL });
	m = itest_mq();
	saga_event(pay, sizeof pay, "big-r", 'P', 4200, BIG_PAD);
	itest_publish(m, "PaymentAuthorized", pay, NULL);
	saga_event(ship, sizeof ship, "big-r", 'S', 0, BIG_PAD);
	itest_publish(m, "ShipmentCreated", ship, NULL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM held_events", 2, WAIT_S), 2);
	itest_stop_ok(w);
	w = itest_worker(1, (const char *[]){ "INBOX_MAX_BODY=1024", "INBOX_HOLD_TTL=1h", NULL });
	/* The order's creation releases the payment, read and parsed whole. */
	publish_event(m, "big-r", 'C', 0);
	itest_confirm_all(m);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM orders WHERE status = 'Paid'", 1, 60), 1);
	cr_assert(itest_str1("SELECT COALESCE(amount_cents, 'NULL') FROM orders WHERE id = ?", "big-r", amount,
	                     sizeof amount));
	cr_assert_str_eq(amount, "4200");
	/* The cancellation makes the shipment impossible: released as an
	 * invalid transition, its dead-letter copy carries the whole body. */
	publish_event(m, "big-r", 'X', 0);
	itest_confirm_all(m);
	cr_assert_eq(itest_dlq_drain(dead, 4, 1, 60), 1);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL", 0, 60), 0);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_str_eq(dead[0].reason, "invalid-transition");
	cr_assert_str_eq(dead[0].message_id, "big-r-S");
	cr_assert_eq(dead[0].len, strlen(ship), "the whole body: %zu bytes of %zu", dead[0].len, strlen(ship));
	cr_assert_eq(dead[0].body_hash, itest_hash(ship, strlen(ship)));
	cr_assert(itest_str1("SELECT status FROM orders WHERE id = ?", "big-r", status, sizeof status));
	cr_assert_str_eq(status, "Cancelled");
	cr_assert_eq(itest_int1("SELECT version FROM orders WHERE id = ?", "big-r"), 3);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM held_events"), 0);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE type = 'RefundRequested'"), 1);
}

/* A held event whose stored body no longer parses (the rules changed while
 * it waited) is dead-lettered with the parse's reason when its order
 * releases it; the order goes on. */
Test(holds, held_event_that_no_longer_parses_is_dead_lettered_on_release)
{
	struct itest_dead dead[4];
	char outcome[64], status[32];
	struct mq *m;
	pid_t w;

	itest_fresh();
	w = itest_worker(1, (const char *[]){ "INBOX_HOLD_TTL=1h", NULL });
	m = itest_mq();
	publish_event(m, "stale-1", 'P', 4200);
	itest_confirm_all(m);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM held_events", 1, WAIT_S), 1);
	cr_assert_eq(db_exec(itest_db(), "UPDATE held_events SET body = '{\"message_id\":\"stale-1-P\"'"), ST_OK);
	cr_assert_eq(db_commit(itest_db()), ST_OK);
	publish_event(m, "stale-1", 'C', 0);
	itest_confirm_all(m);
	cr_assert_eq(itest_dlq_drain(dead, 4, 1, 60), 1);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_str_eq(dead[0].reason, "malformed-json");
	cr_assert_str_eq(dead[0].message_id, "stale-1-P");
	cr_assert(itest_str1("SELECT CONCAT(outcome, ':', reason) FROM processed_messages WHERE message_id = ?",
	                     "stale-1-P", outcome, sizeof outcome));
	cr_assert_str_eq(outcome, "dead_lettered:malformed-json");
	cr_assert(itest_str1("SELECT status FROM orders WHERE id = ?", "stale-1", status, sizeof status));
	cr_assert_str_eq(status, "Created", "the order is created; the unparsable payment has no effect");
	cr_assert_eq(itest_int1("SELECT version FROM orders WHERE id = ?", "stale-1"), 1);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM held_events"), 0);
	cr_assert_eq(itest_int1("SELECT held FROM order_locks WHERE order_id = ?", "stale-1"), 0);
}
