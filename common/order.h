/*
 * order.h - the order state machine as a pure table: (state, flags, event)
 * -> one decision.  No I/O; the worker reads the order row, asks
 * order_decide, and carries the verdict out in the same transaction.  The
 * table is the lifecycle definition (lifecycle.h): lifecycles/order.json
 * compiled in, or the file of INBOX_LIFECYCLE bound by order_bind, which
 * may be any aggregate's (a shipment's): the names below are the order's,
 * the values are the bound definition's indexes (struct order_verdict).
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

/* Messages emitted through the outbox: bits into the definition's emits
 * (lifecycle.h numbers them in the order the file first names them); for
 * the built-in order definition these (order_bind checks). */
#define ORDER_EMIT_PAID 0x1u     /* OrderPaid notification */
#define ORDER_EMIT_REFUND 0x2u   /* RefundRequested */
#define ORDER_EMIT_RELEASE 0x4u  /* InventoryReleaseRequested */

/*
 * A verdict.  For the order definition its values are the enums above; for
 * any other definition they are the definition's indexes: a state is its
 * index in def->states (0: none yet), an event type (enum msg_type) its
 * index in def->events, flags the marks (bit i: def->marks[i] took
 * effect), emits bits into def->emits.  The built-in file lists its states
 * and events in the enums' order, so the two agree (order_bind checks).
 */
struct order_verdict {
	enum order_decision decision;
	enum order_state next;   /* state after the event (== current unless APPLY) */
	unsigned flags;          /* flags after the event */
	unsigned emits;          /* bits into def->emits to write to the outbox */
};

/* Every verdict precomputed, when they fit (else lc_decide per call). */
#define ORDER_CELLS_MAX 4096
/* The distinct columns a definition's events set (the aggregate row's
 * columns beyond id, status, version, flags, created_at, updated_at). */
#define ORDER_COLS_MAX 32

/* A definition bound to run (see order.c). */
struct order_binding {
	const struct lc_def *def;  /* not owned */
	int nflags;                /* 1 << def->nmarks */
	bool tabled;               /* cells holds every verdict */
	/* "an order", "a shipment": how a detail line names one aggregate. */
	char a_name[LC_NAME_MAX + 4];
	/* The distinct set columns, in the file's order of first mention,
	 * and per event and set its column's index here. */
	const char *cols[ORDER_COLS_MAX];
	int ncols;
	int col_of[LC_MAX_EVENTS][LC_MAX_SETS];
	struct order_verdict cells[ORDER_CELLS_MAX]; /* [state][flags][event] */
};

/* Bind d to run: 0, or -1 with why saying what this worker cannot run
 * (more set columns than ORDER_COLS_MAX, string fields wider than a
 * message holds).  b keeps pointers into d. */
int order_bind(const struct lc_def *d, struct order_binding *b, char *why, size_t why_size);
/* Decide with b from now on (NULL: the built-in file).  Call before any
 * thread decides; b and its definition must outlive them. */
void order_use(const struct order_binding *b);
/* The binding in use (the built-in one unless order_use set another). */
const struct order_binding *order_binding_current(void);
/* The event type (index) a type name or alias of the bound definition
 * names, or -1. */
int order_type_find(const char *name, size_t len);
/* The bound definition's canonical type name of an event type; "" when
 * out of range. */
const char *order_type_name(int type);

struct order_verdict order_decide(enum order_state state, unsigned flags, enum msg_type ev);

/* The bound definition's state names ("Created", ... for orders); "" for NONE. */
const char *order_state_name(enum order_state s);
/* Inverse of order_state_name; -1 when unknown. */
int order_state_from_name(const char *name);
/* "applied", "held", "ignored", "compensated", "dead_lettered" */
const char *order_decision_outcome(enum order_decision d);

#endif
