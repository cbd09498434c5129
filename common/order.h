/*
 * order.h - the order state machine as a pure table: (state, flags, event)
 * -> one decision.  No I/O; the worker reads the order row, asks
 * order_decide, and carries the verdict out in the same transaction.
 *
 * The table is built so that any arrival order of a valid event sequence,
 * with duplicates, ends in the same state, version, ledger rows and
 * compensations as in-order arrival (see SPEC.md "Orders").  The flags record
 * that payment / reservation took effect, so that a payment arriving on a
 * cancelled order is compensated once and a second payment event is stale.
 */
#ifndef INBOX_ORDER_H
#define INBOX_ORDER_H

#include <stdbool.h>

#include "msg.h"

enum order_state {
	ORDER_NONE = 0, /* no OrderCreated yet */
	ORDER_CREATED,
	ORDER_PAID,
	ORDER_RESERVED, /* "InventoryReserved" */
	ORDER_SHIPPED,
	ORDER_CANCELLED,
	ORDER_STATE_COUNT
};

enum order_decision {
	ORDER_APPLY = 0,   /* transition: version + 1, one order_events row */
	ORDER_HOLD,        /* prerequisite missing: keep it, re-evaluate later */
	ORDER_IGNORE,      /* stale: no effect */
	ORDER_COMPENSATE,  /* cancelled first: version + 1, ledger row, emit */
	ORDER_INVALID,     /* dead-letter as invalid-transition */
};

/* What the order already went through; kept on the order row. */
#define ORDER_FLAG_PAID 0x1u
#define ORDER_FLAG_RESERVED 0x2u

/* Messages emitted through the outbox. */
#define ORDER_EMIT_REFUND 0x1u   /* RefundRequested */
#define ORDER_EMIT_RELEASE 0x2u  /* InventoryReleaseRequested */
#define ORDER_EMIT_PAID 0x4u     /* OrderPaid notification */

struct order_verdict {
	enum order_decision decision;
	enum order_state next;   /* state after the event (== current unless APPLY) */
	unsigned flags;          /* flags after the event */
	unsigned emits;          /* ORDER_EMIT_* to write to the outbox */
};

struct order_verdict order_decide(enum order_state state, unsigned flags, enum msg_type ev);

/* "Created", "Paid", "InventoryReserved", "Shipped", "Cancelled"; "" for NONE. */
const char *order_state_name(enum order_state s);
/* Inverse of order_state_name; -1 when unknown. */
int order_state_from_name(const char *name);
/* "applied", "held", "ignored", "compensated", "dead_lettered" */
const char *order_decision_outcome(enum order_decision d);

#endif
