/*
 * test_aggregate.c - the order state machine: every reachable (state, flags,
 * event) cell against the contract, and the property the table exists for:
 * any arrival order of a valid event sequence ends where in-order arrival
 * ends.
 */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "aggregate.h"

#define C MSG_ORDER_CREATED
#define P MSG_PAYMENT_AUTHORIZED
#define R MSG_INVENTORY_RESERVED
#define S MSG_SHIPMENT_CREATED
#define X MSG_ORDER_CANCELLED

#define FP ORDER_FLAG_PAID
#define FR ORDER_FLAG_RESERVED
#define EREF ORDER_EMIT_REFUND
#define EREL ORDER_EMIT_RELEASE
#define EPAID ORDER_EMIT_PAID

struct cell {
	enum order_state state;
	unsigned flags;
	enum msg_type ev;
	enum lc_decision decision;
	enum order_state next;
	unsigned flags_after;
	unsigned emits;
};

/* The contract, one row per reachable (state, flags) and event. */
static const struct cell cells[] = {
	{ ORDER_NONE, 0, C, LC_APPLY, ORDER_CREATED, 0, 0 },
	{ ORDER_NONE, 0, P, LC_HOLD, ORDER_NONE, 0, 0 },
	{ ORDER_NONE, 0, R, LC_HOLD, ORDER_NONE, 0, 0 },
	{ ORDER_NONE, 0, S, LC_HOLD, ORDER_NONE, 0, 0 },
	{ ORDER_NONE, 0, X, LC_HOLD, ORDER_NONE, 0, 0 },

	{ ORDER_CREATED, 0, C, LC_IGNORE, ORDER_CREATED, 0, 0 },
	{ ORDER_CREATED, 0, P, LC_APPLY, ORDER_PAID, FP, EPAID },
	{ ORDER_CREATED, 0, R, LC_HOLD, ORDER_CREATED, 0, 0 },
	{ ORDER_CREATED, 0, S, LC_HOLD, ORDER_CREATED, 0, 0 },
	{ ORDER_CREATED, 0, X, LC_APPLY, ORDER_CANCELLED, 0, 0 },

	{ ORDER_PAID, FP, C, LC_IGNORE, ORDER_PAID, FP, 0 },
	{ ORDER_PAID, FP, P, LC_IGNORE, ORDER_PAID, FP, 0 },
	{ ORDER_PAID, FP, R, LC_APPLY, ORDER_RESERVED, FP | FR, 0 },
	{ ORDER_PAID, FP, S, LC_HOLD, ORDER_PAID, FP, 0 },
	{ ORDER_PAID, FP, X, LC_APPLY, ORDER_CANCELLED, FP, EREF },

	{ ORDER_RESERVED, FP | FR, C, LC_IGNORE, ORDER_RESERVED, FP | FR, 0 },
	{ ORDER_RESERVED, FP | FR, P, LC_IGNORE, ORDER_RESERVED, FP | FR, 0 },
	{ ORDER_RESERVED, FP | FR, R, LC_IGNORE, ORDER_RESERVED, FP | FR, 0 },
	{ ORDER_RESERVED, FP | FR, S, LC_APPLY, ORDER_SHIPPED, FP | FR, 0 },
	{ ORDER_RESERVED, FP | FR, X, LC_APPLY, ORDER_CANCELLED, FP | FR, EREF | EREL },

	{ ORDER_SHIPPED, FP | FR, C, LC_IGNORE, ORDER_SHIPPED, FP | FR, 0 },
	{ ORDER_SHIPPED, FP | FR, P, LC_IGNORE, ORDER_SHIPPED, FP | FR, 0 },
	{ ORDER_SHIPPED, FP | FR, R, LC_IGNORE, ORDER_SHIPPED, FP | FR, 0 },
	{ ORDER_SHIPPED, FP | FR, S, LC_IGNORE, ORDER_SHIPPED, FP | FR, 0 },
	{ ORDER_SHIPPED, FP | FR, X, LC_INVALID, ORDER_SHIPPED, FP | FR, 0 },

	/* Cancelled with nothing paid or reserved yet. */
	{ ORDER_CANCELLED, 0, C, LC_IGNORE, ORDER_CANCELLED, 0, 0 },
	{ ORDER_CANCELLED, 0, P, LC_COMPENSATE, ORDER_CANCELLED, FP, EREF | EPAID },
	{ ORDER_CANCELLED, 0, R, LC_COMPENSATE, ORDER_CANCELLED, FR, EREL },
	{ ORDER_CANCELLED, 0, S, LC_INVALID, ORDER_CANCELLED, 0, 0 },
	{ ORDER_CANCELLED, 0, X, LC_IGNORE, ORDER_CANCELLED, 0, 0 },

	/* Cancelled after (or compensated for) payment. */
	{ ORDER_CANCELLED, FP, C, LC_IGNORE, ORDER_CANCELLED, FP, 0 },
	{ ORDER_CANCELLED, FP, P, LC_IGNORE, ORDER_CANCELLED, FP, 0 },
	{ ORDER_CANCELLED, FP, R, LC_COMPENSATE, ORDER_CANCELLED, FP | FR, EREL },
	{ ORDER_CANCELLED, FP, S, LC_INVALID, ORDER_CANCELLED, FP, 0 },
	{ ORDER_CANCELLED, FP, X, LC_IGNORE, ORDER_CANCELLED, FP, 0 },

	/* Reservation compensated, payment not yet seen. */
	{ ORDER_CANCELLED, FR, C, LC_IGNORE, ORDER_CANCELLED, FR, 0 },
	{ ORDER_CANCELLED, FR, P, LC_COMPENSATE, ORDER_CANCELLED, FP | FR, EREF | EPAID },
	{ ORDER_CANCELLED, FR, R, LC_IGNORE, ORDER_CANCELLED, FR, 0 },
	{ ORDER_CANCELLED, FR, S, LC_INVALID, ORDER_CANCELLED, FR, 0 },
	{ ORDER_CANCELLED, FR, X, LC_IGNORE, ORDER_CANCELLED, FR, 0 },

	/* Both took effect. */
	{ ORDER_CANCELLED, FP | FR, C, LC_IGNORE, ORDER_CANCELLED, FP | FR, 0 },
	{ ORDER_CANCELLED, FP | FR, P, LC_IGNORE, ORDER_CANCELLED, FP | FR, 0 },
	{ ORDER_CANCELLED, FP | FR, R, LC_IGNORE, ORDER_CANCELLED, FP | FR, 0 },
	{ ORDER_CANCELLED, FP | FR, S, LC_INVALID, ORDER_CANCELLED, FP | FR, 0 },
	{ ORDER_CANCELLED, FP | FR, X, LC_IGNORE, ORDER_CANCELLED, FP | FR, 0 },
};

#define NCELLS (sizeof cells / sizeof cells[0])

static const struct cell *find_cell(enum order_state s, unsigned flags, enum msg_type ev)
{
	for (size_t i = 0; i < NCELLS; i++) {
		if (cells[i].state == s && cells[i].flags == flags && cells[i].ev == ev)
			return &cells[i];
	}
	return NULL;
}

Test(order, every_reachable_cell_matches_the_contract)
{
	for (size_t i = 0; i < NCELLS; i++) {
		const struct cell *c = &cells[i];
		struct agg_verdict v = agg_decide(c->state, c->flags, c->ev);

		cr_expect_eq(v.decision, c->decision, "row %zu (%s/%u/%s): decision %s, want %s", i,
		             agg_state_name(c->state), c->flags, msg_type_name(c->ev),
		             lc_decision_outcome(v.decision), lc_decision_outcome(c->decision));
		cr_expect_eq(v.next, c->next, "row %zu: next %d, want %d", i, v.next, c->next);
		cr_expect_eq(v.flags, c->flags_after, "row %zu: flags %u, want %u", i, v.flags,
		             c->flags_after);
		cr_expect_eq(v.emits, c->emits, "row %zu: emits %u, want %u", i, v.emits, c->emits);
	}
}

/* Walk the machine from "no order" through every event that takes effect:
 * the table above must hold a row for every event in every state reached,
 * so that no reachable cell goes untested. */
Test(order, the_table_covers_every_reachable_state)
{
	struct { int s; unsigned f; } seen[64], todo[64];
	size_t nseen = 0, ntodo = 0;

	todo[ntodo].s = ORDER_NONE;
	todo[ntodo++].f = 0;
	seen[nseen++] = todo[0];
	while (ntodo > 0) {
		enum order_state s = todo[ntodo - 1].s;
		unsigned f = todo[--ntodo].f;

		for (int ev = 0; ev < MSG_TYPE_COUNT; ev++) {
			struct agg_verdict v = agg_decide(s, f, (enum msg_type)ev);
			bool known = false;

			cr_assert_not_null(find_cell(s, f, (enum msg_type)ev), "no row for %s/%u/%s",
			                   agg_state_name(s), f, msg_type_name((enum msg_type)ev));
			for (size_t i = 0; i < nseen; i++)
				known = known || (seen[i].s == v.next && seen[i].f == v.flags);
			if (!known) {
				cr_assert_lt(nseen, 64);
				seen[nseen].s = v.next;
				seen[nseen++].f = v.flags;
				todo[ntodo].s = v.next;
				todo[ntodo++].f = v.flags;
			}
		}
	}
	cr_expect_eq(nseen * MSG_TYPE_COUNT, NCELLS, "%zu reachable states", nseen);
}

Test(order, verdict_keeps_state_unless_applied)
{
	for (size_t i = 0; i < NCELLS; i++) {
		struct agg_verdict v = agg_decide(cells[i].state, cells[i].flags, cells[i].ev);

		if (v.decision != LC_APPLY)
			cr_expect_eq(v.next, cells[i].state, "row %zu", i);
		if (v.decision != LC_APPLY && v.decision != LC_COMPENSATE) {
			cr_expect_eq(v.flags, cells[i].flags, "row %zu", i);
			cr_expect_eq(v.emits, 0u, "row %zu", i);
		}
	}
}

Test(order, out_of_range_input_is_invalid)
{
	struct agg_verdict v = agg_decide(ORDER_STATE_COUNT, 0, C);

	cr_expect_eq(v.decision, LC_INVALID);
	v = agg_decide(ORDER_CREATED, FP, MSG_TYPE_COUNT);
	cr_expect_eq(v.decision, LC_INVALID);
	cr_expect_eq(v.next, ORDER_CREATED);
	cr_expect_eq(v.flags, FP);
	cr_expect_eq(v.emits, 0u);
}

Test(order, state_names_round_trip)
{
	static const char *const want[ORDER_STATE_COUNT] = { "", "Created", "Paid",
		                                             "InventoryReserved", "Shipped",
		                                             "Cancelled" };

	for (int s = 0; s < ORDER_STATE_COUNT; s++) {
		cr_expect_str_eq(agg_state_name((enum order_state)s), want[s]);
		if (s != ORDER_NONE)
			cr_expect_eq(agg_state_from_name(want[s]), s);
	}
	cr_expect_eq(agg_state_from_name(""), -1);
	cr_expect_eq(agg_state_from_name("paid"), -1);
	cr_expect_eq(agg_state_from_name("Reserved"), -1);
	cr_expect_eq(agg_state_from_name(NULL), -1);
	cr_expect_str_eq(agg_state_name(ORDER_STATE_COUNT), "");
}

Test(order, decision_outcomes_are_the_spec_names)
{
	cr_expect_str_eq(lc_decision_outcome(LC_APPLY), "applied");
	cr_expect_str_eq(lc_decision_outcome(LC_HOLD), "held");
	cr_expect_str_eq(lc_decision_outcome(LC_IGNORE), "ignored");
	cr_expect_str_eq(lc_decision_outcome(LC_COMPENSATE), "compensated");
	cr_expect_str_eq(lc_decision_outcome(LC_INVALID), "dead_lettered");
}

/* ---- order independence -------------------------------------------------- */

#define SIM_MAX 8

/* What the database would hold for one order: the row, the held events, the
 * ledger (one effect per event type here) and the outbox. */
struct sim {
	enum order_state state;
	unsigned flags;
	int version;               /* APPLY + COMPENSATE */
	int effects[MSG_TYPE_COUNT]; /* order_events rows per event type */
	int emits[3];              /* REFUND, RELEASE, PAID */
	int ignored;
	int invalid;
	enum msg_type held[SIM_MAX];
	size_t nheld;
	bool lifo;                 /* re-evaluate the newest held event first */
};

static void sim_record(struct sim *s, enum msg_type ev, struct agg_verdict v)
{
	switch (v.decision) {
	case LC_APPLY:
	case LC_COMPENSATE:
		s->state = v.next;
		s->flags = v.flags;
		s->version++;
		s->effects[ev]++;
		s->emits[0] += (v.emits & ORDER_EMIT_REFUND) != 0;
		s->emits[1] += (v.emits & ORDER_EMIT_RELEASE) != 0;
		s->emits[2] += (v.emits & ORDER_EMIT_PAID) != 0;
		break;
	case LC_IGNORE:
		s->ignored++;
		break;
	case LC_INVALID:
		s->invalid++;
		break;
	case LC_HOLD:
		cr_assert_lt(s->nheld, SIM_MAX);
		s->held[s->nheld++] = ev;
		break;
	}
}

/* After a change, give every held event another look until none moves. */
static void sim_release_held(struct sim *s)
{
	bool moved = true;

	while (moved) {
		moved = false;
		for (size_t k = 0; k < s->nheld && !moved; k++) {
			size_t i = s->lifo ? s->nheld - 1 - k : k;
			enum msg_type ev = s->held[i];
			struct agg_verdict v = agg_decide(s->state, s->flags, ev);

			if (v.decision == LC_HOLD)
				continue;
			memmove(&s->held[i], &s->held[i + 1], (s->nheld - i - 1) * sizeof s->held[0]);
			s->nheld--;
			sim_record(s, ev, v);
			moved = true;
		}
	}
}

static void sim_deliver(struct sim *s, enum msg_type ev)
{
	struct agg_verdict v = agg_decide(s->state, s->flags, ev);

	sim_record(s, ev, v);
	if (v.decision == LC_APPLY || v.decision == LC_COMPENSATE)
		sim_release_held(s);
}

static void sim_run(const enum msg_type *evs, size_t n, bool lifo, struct sim *s)
{
	memset(s, 0, sizeof *s);
	s->lifo = lifo;
	for (size_t i = 0; i < n; i++)
		sim_deliver(s, evs[i]);
}

static void describe(const enum msg_type *evs, size_t n, char *buf, size_t size)
{
	size_t used = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < n && used < size; i++) {
		int w = snprintf(buf + used, size - used, "%s%s", i ? "," : "", msg_type_name(evs[i]));
		if (w < 0)
			break;
		used += (size_t)w;
	}
}

static void expect_same_end(const struct sim *want, const struct sim *got, const char *what)
{
	cr_expect_eq(got->state, want->state, "%s: state %s, want %s", what,
	             agg_state_name(got->state), agg_state_name(want->state));
	cr_expect_eq(got->flags, want->flags, "%s: flags %u, want %u", what, got->flags, want->flags);
	cr_expect_eq(got->version, want->version, "%s: version %d, want %d", what, got->version,
	             want->version);
	cr_expect_arr_eq(got->effects, want->effects, sizeof got->effects, "%s: ledger differs", what);
	cr_expect_eq(got->emits[0], want->emits[0], "%s: %d RefundRequested, want %d", what,
	             got->emits[0], want->emits[0]);
	cr_expect_eq(got->emits[1], want->emits[1], "%s: %d InventoryReleaseRequested, want %d",
	             what, got->emits[1], want->emits[1]);
	cr_expect_eq(got->emits[2], want->emits[2], "%s: %d OrderPaid, want %d", what,
	             got->emits[2], want->emits[2]);
	cr_expect_eq(got->nheld, 0u, "%s: %zu events still held", what, got->nheld);
	cr_expect_eq(got->invalid, 0, "%s: %d dead-lettered", what, got->invalid);
	cr_expect_eq(got->ignored, 0, "%s: %d ignored", what, got->ignored);
}

/* Every permutation of seq (Heap's algorithm), each played with held events
 * re-evaluated oldest-first and newest-first. Returns how many were run. */
static int check_permutations(const enum msg_type *seq, size_t n)
{
	enum msg_type a[SIM_MAX];
	size_t c[SIM_MAX] = { 0 };
	struct sim want, got;
	char what[160];
	size_t i = 1;
	int runs = 0;

	cr_assert_leq(n, SIM_MAX);
	sim_run(seq, n, false, &want);
	cr_assert_eq(want.nheld, 0u, "in order, nothing may be held");
	memcpy(a, seq, n * sizeof a[0]);
	for (;;) {
		for (int lifo = 0; lifo < 2; lifo++) {
			sim_run(a, n, lifo, &got);
			describe(a, n, what, sizeof what);
			expect_same_end(&want, &got, what);
		}
		runs++;
		while (i < n && c[i] >= i) {
			c[i] = 0;
			i++;
		}
		if (i >= n)
			break;
		if (i % 2 == 0) {
			enum msg_type t = a[0];
			a[0] = a[i];
			a[i] = t;
		} else {
			enum msg_type t = a[c[i]];
			a[c[i]] = a[i];
			a[i] = t;
		}
		c[i]++;
		i = 1;
	}
	return runs;
}

Test(order, happy_path_any_order)
{
	static const enum msg_type seq[] = { C, P, R, S };
	struct sim s;

	cr_expect_eq(check_permutations(seq, 4), 24);
	sim_run(seq, 4, false, &s);
	cr_expect_eq(s.state, ORDER_SHIPPED);
	cr_expect_eq(s.version, 4);
	cr_expect_eq(s.emits[2], 1);
}

Test(order, cancel_at_created_any_order)
{
	static const enum msg_type seq[] = { C, X };
	struct sim s;

	cr_expect_eq(check_permutations(seq, 2), 2);
	sim_run(seq, 2, false, &s);
	cr_expect_eq(s.state, ORDER_CANCELLED);
	cr_expect_eq(s.version, 2);
	cr_expect_eq(s.emits[0] + s.emits[1] + s.emits[2], 0);
}

Test(order, cancel_after_payment_any_order)
{
	/* SPEC: Created, Paid, Cancelled and Created, Cancelled, Paid both end
	 * Cancelled, version 3, one RefundRequested. */
	static const enum msg_type seq[] = { C, P, X };
	static const enum msg_type spec_order[] = { C, X, P };
	struct sim s;

	cr_expect_eq(check_permutations(seq, 3), 6);
	sim_run(spec_order, 3, false, &s);
	cr_expect_eq(s.state, ORDER_CANCELLED);
	cr_expect_eq(s.version, 3);
	cr_expect_eq(s.emits[0], 1);
	cr_expect_eq(s.emits[1], 0);
}

Test(order, cancel_after_reservation_any_order)
{
	static const enum msg_type seq[] = { C, P, R, X };
	struct sim s;

	cr_expect_eq(check_permutations(seq, 4), 24);
	sim_run(seq, 4, false, &s);
	cr_expect_eq(s.state, ORDER_CANCELLED);
	cr_expect_eq(s.version, 4);
	cr_expect_eq(s.emits[0], 1);
	cr_expect_eq(s.emits[1], 1);
}

Test(order, a_repeated_event_is_stale_whatever_the_state)
{
	/* The inbox drops redeliveries by key, but a producer may send the same
	 * event under a new id (PaymentConfirmed after PaymentAuthorized): the
	 * second must never take effect again. */
	static const enum msg_type seqs[][5] = {
		{ C, P, P, R, S }, { C, X, P, P, R }, { C, X, R, R, P }, { C, P, R, S, S },
	};

	for (size_t k = 0; k < sizeof seqs / sizeof seqs[0]; k++) {
		struct sim s;

		sim_run(seqs[k], 5, false, &s);
		cr_expect_eq(s.ignored, 1, "sequence %zu", k);
		cr_expect_eq(s.version, 4, "sequence %zu", k);
		cr_expect_eq(s.nheld, 0u, "sequence %zu", k);
	}
}
