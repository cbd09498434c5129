/*
 * order.c - the order state machine as one declarative table.
 *
 * Each (state, event) cell says what the event does to an order in that
 * state.  Two rules are computed from the flags instead of being spelled out
 * per cell, because they are what makes arrival order irrelevant:
 *
 *  - OrderCancelled emits RefundRequested iff the payment took effect and
 *    InventoryReleaseRequested iff the reservation did (ORDER_FLAG_*), so a
 *    cancellation owes exactly the compensations of what happened before it;
 *  - a COMPENSATE cell whose flag is already set is IGNORE: that payment or
 *    reservation already took effect (before the cancel, or as an earlier
 *    compensation), so a second one is stale.
 *
 * A compensated payment emits the OrderPaid notification as well as the
 * refund: an in-order Created, Paid, Cancelled emits OrderPaid then
 * RefundRequested, and Created, Cancelled, Paid must emit the same set.
 */
#include "order.h"

#include <stddef.h>
#include <string.h>

#include "array.h"

struct order_rule {
	enum order_decision decision;
	enum order_state next; /* for APPLY; ignored otherwise */
	unsigned sets;         /* ORDER_FLAG_* the effect records */
	unsigned emits;        /* ORDER_EMIT_* besides the cancel rule */
};

#define APPLY(st, fl, em) { ORDER_APPLY, st, fl, em }
#define COMPENSATE(fl, em) { ORDER_COMPENSATE, ORDER_NONE, fl, em }
#define HOLD { ORDER_HOLD, ORDER_NONE, 0, 0 }
#define IGNORE { ORDER_IGNORE, ORDER_NONE, 0, 0 }
#define INVALID { ORDER_INVALID, ORDER_NONE, 0, 0 }

static const struct order_rule rules[][MSG_TYPE_COUNT] = {
	/* The order does not exist yet: everything but its creation waits. */
	[ORDER_NONE] = {
		[MSG_ORDER_CREATED] = APPLY(ORDER_CREATED, 0, 0),
		[MSG_PAYMENT_AUTHORIZED] = HOLD,
		[MSG_INVENTORY_RESERVED] = HOLD,
		[MSG_SHIPMENT_CREATED] = HOLD,
		[MSG_ORDER_CANCELLED] = HOLD,
	},
	[ORDER_CREATED] = {
		[MSG_ORDER_CREATED] = IGNORE,
		[MSG_PAYMENT_AUTHORIZED] = APPLY(ORDER_PAID, ORDER_FLAG_PAID, ORDER_EMIT_PAID),
		[MSG_INVENTORY_RESERVED] = HOLD,
		[MSG_SHIPMENT_CREATED] = HOLD,
		[MSG_ORDER_CANCELLED] = APPLY(ORDER_CANCELLED, 0, 0),
	},
	[ORDER_PAID] = {
		[MSG_ORDER_CREATED] = IGNORE,
		[MSG_PAYMENT_AUTHORIZED] = IGNORE,
		[MSG_INVENTORY_RESERVED] = APPLY(ORDER_RESERVED, ORDER_FLAG_RESERVED, 0),
		[MSG_SHIPMENT_CREATED] = HOLD,
		[MSG_ORDER_CANCELLED] = APPLY(ORDER_CANCELLED, 0, 0),
	},
	[ORDER_RESERVED] = {
		[MSG_ORDER_CREATED] = IGNORE,
		[MSG_PAYMENT_AUTHORIZED] = IGNORE,
		[MSG_INVENTORY_RESERVED] = IGNORE,
		[MSG_SHIPMENT_CREATED] = APPLY(ORDER_SHIPPED, 0, 0),
		[MSG_ORDER_CANCELLED] = APPLY(ORDER_CANCELLED, 0, 0),
	},
	/* Shipped is final: a cancellation is too late to carry out. */
	[ORDER_SHIPPED] = {
		[MSG_ORDER_CREATED] = IGNORE,
		[MSG_PAYMENT_AUTHORIZED] = IGNORE,
		[MSG_INVENTORY_RESERVED] = IGNORE,
		[MSG_SHIPMENT_CREATED] = IGNORE,
		[MSG_ORDER_CANCELLED] = INVALID,
	},
	/* Cancelled is final; what took effect elsewhere is compensated. */
	[ORDER_CANCELLED] = {
		[MSG_ORDER_CREATED] = IGNORE,
		[MSG_PAYMENT_AUTHORIZED] =
			COMPENSATE(ORDER_FLAG_PAID, ORDER_EMIT_REFUND | ORDER_EMIT_PAID),
		[MSG_INVENTORY_RESERVED] = COMPENSATE(ORDER_FLAG_RESERVED, ORDER_EMIT_RELEASE),
		[MSG_SHIPMENT_CREATED] = INVALID,
		[MSG_ORDER_CANCELLED] = IGNORE,
	},
};
_Static_assert(ARRAY_LEN(rules) == ORDER_STATE_COUNT, "one row of rules per enum order_state");

struct order_verdict order_decide(enum order_state state, unsigned flags, enum msg_type ev)
{
	struct order_verdict v = { ORDER_INVALID, state, flags, 0 };
	const struct order_rule *r;

	if ((unsigned)state >= ORDER_STATE_COUNT || (unsigned)ev >= MSG_TYPE_COUNT)
		return v;
	r = &rules[state][ev];
	v.decision = r->decision;
	switch (r->decision) {
	case ORDER_APPLY:
		v.next = r->next;
		v.flags = flags | r->sets;
		v.emits = r->emits;
		if (ev == MSG_ORDER_CANCELLED) {
			if (flags & ORDER_FLAG_PAID)
				v.emits |= ORDER_EMIT_REFUND;
			if (flags & ORDER_FLAG_RESERVED)
				v.emits |= ORDER_EMIT_RELEASE;
		}
		break;
	case ORDER_COMPENSATE:
		if ((flags & r->sets) == r->sets) {
			v.decision = ORDER_IGNORE;
			break;
		}
		v.flags = flags | r->sets;
		v.emits = r->emits;
		break;
	case ORDER_HOLD:
	case ORDER_IGNORE:
	case ORDER_INVALID:
		break;
	}
	return v;
}

static const char *const state_names[] = {
	[ORDER_NONE] = "",
	[ORDER_CREATED] = "Created",
	[ORDER_PAID] = "Paid",
	[ORDER_RESERVED] = "InventoryReserved",
	[ORDER_SHIPPED] = "Shipped",
	[ORDER_CANCELLED] = "Cancelled",
};
_Static_assert(ARRAY_LEN(state_names) == ORDER_STATE_COUNT, "one name per enum order_state");

const char *order_state_name(enum order_state s)
{
	if ((unsigned)s >= ORDER_STATE_COUNT)
		return "";
	return state_names[s];
}

int order_state_from_name(const char *name)
{
	if (name == NULL || name[0] == '\0')
		return -1;
	for (int s = ORDER_CREATED; s < ORDER_STATE_COUNT; s++) {
		if (strcmp(state_names[s], name) == 0)
			return s;
	}
	return -1;
}

const char *order_decision_outcome(enum order_decision d)
{
	switch (d) {
	case ORDER_APPLY:
		return "applied";
	case ORDER_HOLD:
		return "held";
	case ORDER_IGNORE:
		return "ignored";
	case ORDER_COMPENSATE:
		return "compensated";
	case ORDER_INVALID:
		return "dead_lettered";
	}
	return "";
}
