/*
 * test_spec.c - the worker's decision table (agg_decide) against the
 * table typed in from SPEC.md (loadgen/spec_oracle.c), cell by cell: every
 * order SPEC can have, every event type; the outcome, the state and flags
 * after, the messages emitted.  Also checks the oracle itself: it covers
 * every reachable order once, and folding any arrival order of a saga ends
 * where in-order arrival does (SPEC's promise), so the two tables are not
 * just equal but right.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "aggregate.h"
#include "spec_oracle.h"

static const char *const ev_name[MSG_TYPE_COUNT] = {
	"OrderCreated", "PaymentAuthorized", "InventoryReserved", "ShipmentCreated", "OrderCancelled",
};

/* SPEC's status to the worker's enum, by the status text both print. */
static enum order_state to_state(enum spec_status s)
{
	int st;

	if (s == SPEC_NONE)
		return ORDER_NONE;
	st = agg_state_from_name(spec_status_name(s));
	cr_assert_geq(st, 0, "the worker has no state named '%s'", spec_status_name(s));
	return (enum order_state)st;
}

static unsigned to_flags(bool paid, bool reserved)
{
	return (paid ? ORDER_FLAG_PAID : 0u) | (reserved ? ORDER_FLAG_RESERVED : 0u);
}

static unsigned to_emits(unsigned spec)
{
	return ((spec & SPEC_EMIT_REFUND) ? ORDER_EMIT_REFUND : 0u) |
	       ((spec & SPEC_EMIT_RELEASE) ? ORDER_EMIT_RELEASE : 0u) |
	       ((spec & SPEC_EMIT_ORDER_PAID) ? ORDER_EMIT_PAID : 0u);
}

Test(spec, order_decide_agrees_with_spec_in_every_cell)
{
	int wrong = 0;

	for (size_t i = 0; i < spec_ncells; i++) {
		const struct spec_cell *c = &spec_cells[i];
		enum order_state st = to_state(c->status);
		struct agg_verdict v = agg_decide(st, to_flags(c->paid, c->reserved), c->event);
		const char *got = lc_decision_outcome(v.decision);
		char where[128];

		snprintf(where, sizeof where, "%s on '%s'%s%s", ev_name[c->event], spec_status_name(c->status),
		         c->paid ? " paid" : "", c->reserved ? " reserved" : "");
		if (strcmp(got, spec_outcome_name(c->outcome)) != 0 || v.next != (int)to_state(c->next) ||
		    v.flags != to_flags(c->next_paid, c->next_reserved) || v.emits != to_emits(c->emits)) {
			cr_log_error("%s: agg_decide says %s -> '%s' flags %#x emits %#x; SPEC says %s -> '%s' "
			             "flags %#x emits %#x",
			             where, got, agg_state_name(v.next), v.flags, v.emits,
			             spec_outcome_name(c->outcome), spec_status_name(c->next),
			             to_flags(c->next_paid, c->next_reserved), to_emits(c->emits));
			wrong++;
		}
	}
	cr_assert_eq(wrong, 0, "%d cells of agg_decide disagree with SPEC.md", wrong);
}

/* The orders reachable from "no order" through any events, by the oracle's
 * own cells; each must have exactly one cell per event, and no cell may
 * start from an order that cannot be reached. */
Test(spec, oracle_covers_every_reachable_order_once)
{
	struct spec_order seen[32];
	size_t nseen = 1;

	seen[0] = (struct spec_order){ SPEC_NONE, false, false };
	for (size_t i = 0; i < nseen; i++) {
		for (int ev = 0; ev < MSG_TYPE_COUNT; ev++) {
			const struct spec_cell *c = spec_decide(&seen[i], (enum msg_type)ev);
			struct spec_order next;
			bool known = false;
			int count = 0;

			cr_assert_not_null(c, "no cell for %s on '%s' %d%d", ev_name[ev], spec_status_name(seen[i].status),
			                   seen[i].paid, seen[i].reserved);
			for (size_t k = 0; k < spec_ncells; k++)
				count += spec_cells[k].status == seen[i].status && spec_cells[k].paid == seen[i].paid &&
				         spec_cells[k].reserved == seen[i].reserved && (int)spec_cells[k].event == ev;
			cr_assert_eq(count, 1, "%d cells for one order and event", count);
			next = spec_after(c);
			cr_assert(spec_takes_effect(c->outcome) ||
			          (next.status == seen[i].status && next.paid == seen[i].paid &&
			           next.reserved == seen[i].reserved),
			          "an outcome without effect changed the order");
			cr_assert_eq(c->reason != NULL, c->outcome == SPEC_DEAD_LETTERED);
			for (size_t k = 0; k < nseen; k++)
				known = known || (seen[k].status == next.status && seen[k].paid == next.paid &&
				                  seen[k].reserved == next.reserved);
			if (!known) {
				cr_assert_lt(nseen, sizeof seen / sizeof seen[0]);
				seen[nseen++] = next;
			}
		}
	}
	cr_assert_eq(nseen * MSG_TYPE_COUNT, spec_ncells, "%zu reachable orders, %zu cells", nseen, spec_ncells);
}

static bool next_perm(enum msg_type *a, size_t n)
{
	size_t i, j;

	if (n < 2)
		return false;
	i = n - 1;
	while (i > 0 && a[i - 1] >= a[i])
		i--;
	if (i == 0)
		return false;
	j = n - 1;
	while (a[j] <= a[i - 1])
		j--;
	{
		enum msg_type t = a[i - 1];
		a[i - 1] = a[j];
		a[j] = t;
	}
	for (size_t l = i, r = n - 1; l < r; l++, r--) {
		enum msg_type t = a[l];
		a[l] = a[r];
		a[r] = t;
	}
	return true;
}

/* SPEC: "Whatever order a set of events arrives in ... the same state, the
 * same version ... the same compensations".  The oracle must keep it. */
Test(spec, oracle_ends_every_arrival_order_as_in_order)
{
	static const struct {
		enum msg_type ev[4];
		size_t n;
		enum spec_status status;
		int version;
		unsigned emits;
	} sets[] = {
		/* by hand from SPEC's text; sorted, so the first permutation */
		{ { MSG_ORDER_CREATED, MSG_PAYMENT_AUTHORIZED, MSG_INVENTORY_RESERVED, MSG_SHIPMENT_CREATED }, 4,
		  SPEC_SHIPPED, 4, SPEC_EMIT_ORDER_PAID },
		{ { MSG_ORDER_CREATED, MSG_PAYMENT_AUTHORIZED, MSG_INVENTORY_RESERVED, MSG_ORDER_CANCELLED }, 4,
		  SPEC_CANCELLED, 4, SPEC_EMIT_ORDER_PAID | SPEC_EMIT_REFUND | SPEC_EMIT_RELEASE },
		{ { MSG_ORDER_CREATED, MSG_PAYMENT_AUTHORIZED, MSG_ORDER_CANCELLED }, 3, SPEC_CANCELLED, 3,
		  SPEC_EMIT_ORDER_PAID | SPEC_EMIT_REFUND },
		{ { MSG_ORDER_CREATED, MSG_ORDER_CANCELLED }, 2, SPEC_CANCELLED, 2, 0 },
	};

	for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++) {
		enum msg_type perm[4];
		int perms = 0;

		memcpy(perm, sets[s].ev, sizeof perm);
		do {
			enum spec_outcome out[4];
			struct spec_fold f;

			cr_assert_eq(spec_fold(perm, sets[s].n, out, NULL, &f), 0);
			cr_assert_eq(f.end.status, sets[s].status, "set %zu perm %d: '%s'", s, perms,
			             spec_status_name(f.end.status));
			cr_assert_eq(f.version, sets[s].version, "set %zu perm %d", s, perms);
			cr_assert_eq(f.emits, sets[s].emits, "set %zu perm %d", s, perms);
			cr_assert_eq(f.nemits, __builtin_popcount(sets[s].emits), "each message emitted once");
			for (size_t i = 0; i < sets[s].n; i++)
				cr_assert(spec_takes_effect(out[i]), "set %zu perm %d: event %zu %s", s, perms, i,
				          spec_outcome_name(out[i]));
			perms++;
		} while (next_perm(perm, sets[s].n));
	}
}

/* Cancel after shipment is the one set whose end depends on arrival: SPEC
 * says too late, dead-lettered; before shipment it is applied. */
Test(spec, cancel_after_shipment_is_invalid_and_before_is_applied)
{
	enum msg_type late[] = { MSG_ORDER_CREATED, MSG_PAYMENT_AUTHORIZED, MSG_INVENTORY_RESERVED,
	                         MSG_SHIPMENT_CREATED, MSG_ORDER_CANCELLED };
	enum msg_type early[] = { MSG_ORDER_CREATED, MSG_PAYMENT_AUTHORIZED, MSG_INVENTORY_RESERVED,
	                          MSG_ORDER_CANCELLED, MSG_SHIPMENT_CREATED };
	enum spec_outcome out[5];
	struct spec_fold f;

	cr_assert_eq(spec_fold(late, 5, out, NULL, &f), 0);
	cr_assert_eq(out[4], SPEC_DEAD_LETTERED);
	cr_assert_eq(f.end.status, SPEC_SHIPPED);
	/* the text, not the pointer: a sanitizer build does not merge equal literals */
	cr_assert_str_eq(spec_decide(&(struct spec_order){ SPEC_SHIPPED, true, true }, MSG_ORDER_CANCELLED)->reason,
	                 SPEC_REASON_INVALID);
	cr_assert_eq(spec_fold(early, 5, out, NULL, &f), 0);
	cr_assert_eq(out[3], SPEC_APPLIED);
	cr_assert_eq(out[4], SPEC_DEAD_LETTERED);
	cr_assert_eq(f.end.status, SPEC_CANCELLED);
	cr_assert_eq(f.emits, SPEC_EMIT_ORDER_PAID | SPEC_EMIT_REFUND | SPEC_EMIT_RELEASE);
}
