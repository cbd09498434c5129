/*
 * aggregate.h - the decision engine: an aggregate's lifecycle as a pure
 * table, (state, flags, event) -> one decision.  No I/O; the worker reads
 * the aggregate's row, asks agg_decide, and carries the verdict out in the
 * same transaction.  The table is the lifecycle definition (lifecycle.h)
 * bound to run: lifecycles/order.json compiled in, or the file of
 * INBOX_LIFECYCLE bound by agg_bind, which may be any aggregate's (a
 * shipment's).  States, events, flags and emits are the bound
 * definition's indexes; the ORDER_* names below are the built-in order
 * definition's, kept for the code and tests that speak of orders.
 *
 * The table is built so that any arrival order of a valid event sequence,
 * with duplicates, ends in the same state, version, ledger rows and
 * compensations as in-order arrival (see SPEC.md "Orders").  The flags record
 * that payment / reservation took effect, so that a payment arriving on a
 * cancelled order is compensated once and a second payment event is stale.
 */
#ifndef INBOX_AGGREGATE_H
#define INBOX_AGGREGATE_H

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

/* The built-in order definition's states, marks and emits, by index. */
/* What the order already went through; kept on the order row. */
#define ORDER_FLAG_PAID 0x1u
#define ORDER_FLAG_RESERVED 0x2u
#define ORDER_FLAGS_ALL 0x3u

/* Messages emitted through the outbox: bits into the definition's emits
 * (lifecycle.h numbers them in the order the file first names them); for
 * the built-in order definition these (agg_bind checks). */
#define ORDER_EMIT_PAID 0x1u     /* OrderPaid notification */
#define ORDER_EMIT_REFUND 0x2u   /* RefundRequested */
#define ORDER_EMIT_RELEASE 0x4u  /* InventoryReleaseRequested */

/*
 * A verdict: the definition's indexes (for the built-in order definition
 * the ORDER_* values above): a state is its
 * index in def->states (0: none yet), an event type (enum msg_type) its
 * index in def->events, flags the marks (bit i: def->marks[i] took
 * effect), emits bits into def->emits.  The built-in file lists its states
 * and events in the enums' order, so the two agree (agg_bind checks).
 */
struct agg_verdict {
	enum lc_decision decision;
	int next;                /* state after the event (== current unless APPLY) */
	unsigned flags;          /* flags after the event */
	unsigned emits;          /* bits into def->emits to write to the outbox */
};

/* Every verdict precomputed, when they fit (else lc_decide per call). */
#define AGG_CELLS_MAX 4096
/* The distinct columns a definition's events set (the aggregate row's
 * columns beyond id, status, version, flags, created_at, updated_at,
 * lifecycle_version). */
#define AGG_COLS_MAX 32

/* A definition bound to run (see aggregate.c). */
struct agg_binding {
	const struct lc_def *def;  /* not owned */
	int nflags;                /* 1 << def->nmarks */
	bool tabled;               /* cells holds every verdict */
	/* "an order", "a shipment": how a detail line names one aggregate. */
	char a_name[LC_NAME_MAX + 4];
	/* The distinct set columns, in the file's order of first mention,
	 * and per event and set its column's index here. */
	const char *cols[AGG_COLS_MAX];
	int ncols;
	int col_of[LC_MAX_EVENTS][LC_MAX_SETS];
	struct agg_verdict cells[AGG_CELLS_MAX]; /* [state][flags][event] */
};

/* Bind d to run: 0, or -1 with why saying what this worker cannot run
 * (more set columns than AGG_COLS_MAX, string fields wider than a
 * message holds).  b keeps pointers into d. */
int agg_bind(const struct lc_def *d, struct agg_binding *b, char *why, size_t why_size);
/* Decide with b from now on (NULL: the built-in file).  Call before any
 * thread decides; b and its definition must outlive them. */
void agg_use(const struct agg_binding *b);
/* The binding in use (the built-in one unless agg_use set another). */
const struct agg_binding *agg_current(void);
/* The event type (index) a type name or alias of the bound definition
 * names, or -1. */
int agg_type_find(const char *name, size_t len);
/* The bound definition's canonical type name of an event type; "" when
 * out of range. */
const char *agg_type_name(int type);

struct agg_verdict agg_decide(int state, unsigned flags, enum msg_type ev);

/* The bound definition's state names ("Created", ... for orders); "" for NONE. */
const char *agg_state_name(int s);
/* Inverse of agg_state_name; -1 when unknown. */
int agg_state_from_name(const char *name);

#endif
