/*
 * order.h - the order state machine as a pure table: (state, flags, event)
 * -> one decision.  No I/O; the worker reads the order row, asks
 * order_decide, and carries the verdict out in the same transaction.  The
 * table is the lifecycle definition (lifecycle.h): lifecycles/order.json
 * compiled in, or the file of INBOX_LIFECYCLE bound by order_bind.
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

#include "lifecycle.h"
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
#define ORDER_FLAGS_ALL 0x3u

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

#define ORDER_ALIAS_MAX 16

/* A definition bound to the worker's order schema (see order.c). */
struct order_binding {
	const struct lc_def *def;  /* not owned */
	int state_to_lc[ORDER_STATE_COUNT];
	int lc_to_state[LC_MAX_STATES];
	int type_to_lc[MSG_TYPE_COUNT];
	int lc_to_type[LC_MAX_EVENTS];
	unsigned mark_to_flag[LC_MAX_EVENTS]; /* lc mark bit -> ORDER_FLAG_* */
	unsigned emit_to_order[LC_MAX_EMITS]; /* lc emit index -> ORDER_EMIT_* */
	struct {
		const char *name; /* into def */
		int type;         /* enum msg_type */
	} aliases[ORDER_ALIAS_MAX];
	int naliases;
	/* Every verdict, filled by order_bind from the definition. */
	struct order_verdict cells[ORDER_STATE_COUNT][ORDER_FLAGS_ALL + 1][MSG_TYPE_COUNT];
};

/* Bind d to the order schema: 0, or -1 with why saying what would need a
 * schema or code change.  b keeps pointers into d. */
int order_bind(const struct lc_def *d, struct order_binding *b, char *why, size_t why_size);
/* Decide with b from now on (NULL: the built-in file).  Call before any
 * thread decides; b and its definition must outlive them. */
void order_use(const struct order_binding *b);
/* The binding in use (the built-in one unless order_use set another). */
const struct order_binding *order_binding_current(void);
/* The event type an alias of the definition names, or -1. */
int order_alias_type(const char *name, size_t len);

struct order_verdict order_decide(enum order_state state, unsigned flags, enum msg_type ev);

/* "Created", "Paid", "InventoryReserved", "Shipped", "Cancelled"; "" for NONE. */
const char *order_state_name(enum order_state s);
/* Inverse of order_state_name; -1 when unknown. */
int order_state_from_name(const char *name);
/* "applied", "held", "ignored", "compensated", "dead_lettered" */
const char *order_decision_outcome(enum order_decision d);

#endif
