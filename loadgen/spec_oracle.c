/*
 * spec_oracle.c - SPEC.md's "Orders" section as a table of every cell, typed
 * in by hand from the text (not derived from common/aggregate.c).
 *
 * How each cell follows from SPEC, so a reader can check it against the text:
 *  - applied: the event's "effect when applicable" row of SPEC's event table,
 *    from the state it names (Created -> Paid, Paid -> InventoryReserved,
 *    InventoryReserved -> Shipped; OrderCancelled from Created, Paid or
 *    InventoryReserved, emitting RefundRequested if it was paid and
 *    InventoryReleaseRequested if inventory was reserved);
 *  - held: "its prerequisite has not arrived yet (the order does not exist,
 *    or is behind)": every event but OrderCreated before the order exists, a
 *    reservation before the payment, a shipment before the reservation;
 *  - ignored: "the order is already at or past where the event leads", and
 *    OrderCancelled on a Cancelled order (said in so many words);
 *  - compensated: "the order was cancelled before a payment or reservation
 *    event arrived": it emits RefundRequested / InventoryReleaseRequested.
 *    A payment (reservation) that already took effect before, or as an
 *    earlier compensation, is at or past: ignored;
 *  - dead_lettered, invalid-transition: OrderCancelled on Shipped ("too
 *    late"), ShipmentCreated on Cancelled (SPEC's example).
 * OrderPaid is the worker's notification, not SPEC's (see the header).
 */
#include "spec_oracle.h"

#define C MSG_ORDER_CREATED
#define P MSG_PAYMENT_AUTHORIZED
#define R MSG_INVENTORY_RESERVED
#define S MSG_SHIPMENT_CREATED
#define X MSG_ORDER_CANCELLED

#define REF SPEC_EMIT_REFUND
#define REL SPEC_EMIT_RELEASE
#define PAIDN SPEC_EMIT_ORDER_PAID
#define INV SPEC_REASON_INVALID

/* before (status, paid, reserved), event -> outcome, after (status, paid,
 * reserved), emits, reason.  Nine orders SPEC can have, five events each.
 * Every row is spelled out, the alike ones too: the point of this table is
 * to be read against SPEC's text cell by cell, not to be short. */
const struct spec_cell spec_cells[] = {
	/* no order yet */
	{ SPEC_NONE, false, false, C, SPEC_APPLIED, SPEC_CREATED, false, false, 0, NULL },
	{ SPEC_NONE, false, false, P, SPEC_HELD, SPEC_NONE, false, false, 0, NULL },
	{ SPEC_NONE, false, false, R, SPEC_HELD, SPEC_NONE, false, false, 0, NULL },
	{ SPEC_NONE, false, false, S, SPEC_HELD, SPEC_NONE, false, false, 0, NULL },
	{ SPEC_NONE, false, false, X, SPEC_HELD, SPEC_NONE, false, false, 0, NULL },
	/* Created */
	{ SPEC_CREATED, false, false, C, SPEC_IGNORED, SPEC_CREATED, false, false, 0, NULL },
	{ SPEC_CREATED, false, false, P, SPEC_APPLIED, SPEC_PAID, true, false, PAIDN, NULL },
	{ SPEC_CREATED, false, false, R, SPEC_HELD, SPEC_CREATED, false, false, 0, NULL },
	{ SPEC_CREATED, false, false, S, SPEC_HELD, SPEC_CREATED, false, false, 0, NULL },
	{ SPEC_CREATED, false, false, X, SPEC_APPLIED, SPEC_CANCELLED, false, false, 0, NULL },
	/* Paid */
	{ SPEC_PAID, true, false, C, SPEC_IGNORED, SPEC_PAID, true, false, 0, NULL },
	{ SPEC_PAID, true, false, P, SPEC_IGNORED, SPEC_PAID, true, false, 0, NULL },
	{ SPEC_PAID, true, false, R, SPEC_APPLIED, SPEC_RESERVED, true, true, 0, NULL },
	{ SPEC_PAID, true, false, S, SPEC_HELD, SPEC_PAID, true, false, 0, NULL },
	{ SPEC_PAID, true, false, X, SPEC_APPLIED, SPEC_CANCELLED, true, false, REF, NULL },
	/* InventoryReserved */
	{ SPEC_RESERVED, true, true, C, SPEC_IGNORED, SPEC_RESERVED, true, true, 0, NULL },
	{ SPEC_RESERVED, true, true, P, SPEC_IGNORED, SPEC_RESERVED, true, true, 0, NULL },
	{ SPEC_RESERVED, true, true, R, SPEC_IGNORED, SPEC_RESERVED, true, true, 0, NULL },
	{ SPEC_RESERVED, true, true, S, SPEC_APPLIED, SPEC_SHIPPED, true, true, 0, NULL },
	{ SPEC_RESERVED, true, true, X, SPEC_APPLIED, SPEC_CANCELLED, true, true, REF | REL, NULL },
	/* Shipped */
	{ SPEC_SHIPPED, true, true, C, SPEC_IGNORED, SPEC_SHIPPED, true, true, 0, NULL },
	{ SPEC_SHIPPED, true, true, P, SPEC_IGNORED, SPEC_SHIPPED, true, true, 0, NULL },
	{ SPEC_SHIPPED, true, true, R, SPEC_IGNORED, SPEC_SHIPPED, true, true, 0, NULL },
	{ SPEC_SHIPPED, true, true, S, SPEC_IGNORED, SPEC_SHIPPED, true, true, 0, NULL },
	{ SPEC_SHIPPED, true, true, X, SPEC_DEAD_LETTERED, SPEC_SHIPPED, true, true, 0, INV },
	/* Cancelled before any payment or reservation took effect */
	{ SPEC_CANCELLED, false, false, C, SPEC_IGNORED, SPEC_CANCELLED, false, false, 0, NULL },
	{ SPEC_CANCELLED, false, false, P, SPEC_COMPENSATED, SPEC_CANCELLED, true, false, REF | PAIDN, NULL },
	{ SPEC_CANCELLED, false, false, R, SPEC_COMPENSATED, SPEC_CANCELLED, false, true, REL, NULL },
	{ SPEC_CANCELLED, false, false, S, SPEC_DEAD_LETTERED, SPEC_CANCELLED, false, false, 0, INV },
	{ SPEC_CANCELLED, false, false, X, SPEC_IGNORED, SPEC_CANCELLED, false, false, 0, NULL },
	/* Cancelled, paid (before the cancel, or compensated) */
	{ SPEC_CANCELLED, true, false, C, SPEC_IGNORED, SPEC_CANCELLED, true, false, 0, NULL },
	{ SPEC_CANCELLED, true, false, P, SPEC_IGNORED, SPEC_CANCELLED, true, false, 0, NULL },
	{ SPEC_CANCELLED, true, false, R, SPEC_COMPENSATED, SPEC_CANCELLED, true, true, REL, NULL },
	{ SPEC_CANCELLED, true, false, S, SPEC_DEAD_LETTERED, SPEC_CANCELLED, true, false, 0, INV },
	{ SPEC_CANCELLED, true, false, X, SPEC_IGNORED, SPEC_CANCELLED, true, false, 0, NULL },
	/* Cancelled, reserved but not paid (a reservation compensated first) */
	{ SPEC_CANCELLED, false, true, C, SPEC_IGNORED, SPEC_CANCELLED, false, true, 0, NULL },
	{ SPEC_CANCELLED, false, true, P, SPEC_COMPENSATED, SPEC_CANCELLED, true, true, REF | PAIDN, NULL },
	{ SPEC_CANCELLED, false, true, R, SPEC_IGNORED, SPEC_CANCELLED, false, true, 0, NULL },
	{ SPEC_CANCELLED, false, true, S, SPEC_DEAD_LETTERED, SPEC_CANCELLED, false, true, 0, INV },
	{ SPEC_CANCELLED, false, true, X, SPEC_IGNORED, SPEC_CANCELLED, false, true, 0, NULL },
	/* Cancelled, paid and reserved */
	{ SPEC_CANCELLED, true, true, C, SPEC_IGNORED, SPEC_CANCELLED, true, true, 0, NULL },
	{ SPEC_CANCELLED, true, true, P, SPEC_IGNORED, SPEC_CANCELLED, true, true, 0, NULL },
	{ SPEC_CANCELLED, true, true, R, SPEC_IGNORED, SPEC_CANCELLED, true, true, 0, NULL },
	{ SPEC_CANCELLED, true, true, S, SPEC_DEAD_LETTERED, SPEC_CANCELLED, true, true, 0, INV },
	{ SPEC_CANCELLED, true, true, X, SPEC_IGNORED, SPEC_CANCELLED, true, true, 0, NULL },
};
const size_t spec_ncells = sizeof spec_cells / sizeof spec_cells[0];

const struct spec_cell *spec_decide(const struct spec_order *o, enum msg_type ev)
{
	for (size_t i = 0; i < spec_ncells; i++) {
		const struct spec_cell *c = &spec_cells[i];
		if (c->status == o->status && c->paid == o->paid && c->reserved == o->reserved && c->event == ev)
			return c;
	}
	return NULL;
}

struct spec_order spec_after(const struct spec_cell *c)
{
	struct spec_order o = { c->next, c->next_paid, c->next_reserved };
	return o;
}

bool spec_takes_effect(enum spec_outcome out)
{
	return out == SPEC_APPLIED || out == SPEC_COMPENSATED;
}

const char *spec_outcome_name(enum spec_outcome out)
{
	switch (out) {
	case SPEC_APPLIED:
		return "applied";
	case SPEC_HELD:
		return "held";
	case SPEC_IGNORED:
		return "ignored";
	case SPEC_COMPENSATED:
		return "compensated";
	case SPEC_DEAD_LETTERED:
		return "dead_lettered";
	}
	return "";
}

const char *spec_status_name(enum spec_status s)
{
	switch (s) {
	case SPEC_NONE:
	case SPEC_STATUS_COUNT:
		break;
	case SPEC_CREATED:
		return "Created";
	case SPEC_PAID:
		return "Paid";
	case SPEC_RESERVED:
		return "InventoryReserved";
	case SPEC_SHIPPED:
		return "Shipped";
	case SPEC_CANCELLED:
		return "Cancelled";
	}
	return "";
}

static int spec_count(unsigned emits)
{
	int n = 0;
	for (; emits != 0; emits &= emits - 1)
		n++;
	return n;
}

/* Carry out one cell that is not a hold on the fold. */
static void spec_take(struct spec_fold *res, const struct spec_cell *c)
{
	if (!spec_takes_effect(c->outcome))
		return;
	res->end = spec_after(c);
	res->version++;
	res->emits |= c->emits;
	res->nemits += spec_count(c->emits);
}

int spec_fold(const enum msg_type *ev, size_t n, enum spec_outcome *out, bool *held_first,
              struct spec_fold *res)
{
	size_t held[16];
	size_t nheld = 0;

	res->end = (struct spec_order){ SPEC_NONE, false, false };
	res->version = 0;
	res->emits = 0;
	res->nemits = 0;
	for (size_t i = 0; i < n; i++) {
		const struct spec_cell *c = spec_decide(&res->end, ev[i]);
		bool progress;

		if (c == NULL)
			return -1;
		if (held_first != NULL)
			held_first[i] = c->outcome == SPEC_HELD;
		out[i] = c->outcome;
		if (c->outcome == SPEC_HELD) {
			if (nheld == sizeof held / sizeof held[0])
				return -1;
			held[nheld++] = i;
			continue;
		}
		if (!spec_takes_effect(c->outcome))
			continue;
		spec_take(res, c);
		/* "re-evaluated whenever the order changes": oldest first, again
		 * after every change, until nothing more can go. */
		do {
			progress = false;
			for (size_t h = 0; h < nheld; h++) {
				const struct spec_cell *hc = spec_decide(&res->end, ev[held[h]]);
				if (hc == NULL)
					return -1;
				if (hc->outcome == SPEC_HELD)
					continue;
				out[held[h]] = hc->outcome;
				spec_take(res, hc);
				for (size_t k = h + 1; k < nheld; k++)
					held[k - 1] = held[k];
				nheld--;
				progress = true;
				break;
			}
		} while (progress);
	}
	return 0;
}
