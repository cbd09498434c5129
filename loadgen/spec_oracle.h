/*
 * spec_oracle.h - what ../shared/SPEC.md says an order event does, written
 * out by hand as a table, independently of the worker's state machine.
 *
 * Why it exists: the load generator's ledger and the saga tests used to take
 * their expectations from agg_decide, the table under test, so a wrong cell
 * passed everywhere.  This file is the second opinion: it does not include
 * aggregate.h and never calls agg_decide.  test_spec compares the two cell by
 * cell; the saga, holds and loadgen checks expect what this table says.
 *
 * Only msg.h's event types are shared (they are the parser's, not the
 * decision's).  Ownership: everything returned points into static tables.
 */
#ifndef INBOX_SPEC_ORACLE_H
#define INBOX_SPEC_ORACLE_H

#include <stdbool.h>
#include <stddef.h>

#include "msg.h"

/* SPEC "Orders": the states, and "no order yet" before OrderCreated. */
enum spec_status {
	SPEC_NONE = 0,
	SPEC_CREATED,
	SPEC_PAID,
	SPEC_RESERVED,
	SPEC_SHIPPED,
	SPEC_CANCELLED,
	SPEC_STATUS_COUNT
};

/* SPEC's outcome column (processed_messages.outcome). */
enum spec_outcome {
	SPEC_APPLIED = 0,
	SPEC_HELD,
	SPEC_IGNORED,
	SPEC_COMPENSATED,
	SPEC_DEAD_LETTERED,
};

/* Messages an event makes the worker emit.  REFUND and RELEASE are SPEC's
 * compensations.  ORDER_PAID is not in SPEC's table: it is the worker's
 * notification of a payment that took effect, and SPEC's rule "the same
 * compensations emitted whatever the arrival order" only holds for it if a
 * compensated payment emits it as well as an applied one; it is listed so
 * the outbox can be checked whole, marked as design, not contract. */
#define SPEC_EMIT_REFUND 0x1u     /* RefundRequested */
#define SPEC_EMIT_RELEASE 0x2u    /* InventoryReleaseRequested */
#define SPEC_EMIT_ORDER_PAID 0x4u /* OrderPaid (design, see above) */

/* An order as SPEC sees it: its status and whether a payment / reservation
 * took effect (applied, or compensated after the cancel). */
struct spec_order {
	enum spec_status status;
	bool paid;
	bool reserved;
};

/* One cell: an event arriving at an order. */
struct spec_cell {
	enum spec_status status; /* the order before */
	bool paid, reserved;
	enum msg_type event;
	enum spec_outcome outcome;
	enum spec_status next;   /* the order after (== before unless applied) */
	bool next_paid, next_reserved;
	unsigned emits;          /* SPEC_EMIT_* */
	const char *reason;      /* x-inbox-reason when dead-lettered, else NULL */
};

/* The whole table: every reachable order and every event type. */
extern const struct spec_cell spec_cells[];
extern const size_t spec_ncells;

/* The cell for this order and event; NULL when SPEC knows no such order
 * (a status with flags it cannot have, e.g. Created and paid). */
const struct spec_cell *spec_decide(const struct spec_order *o, enum msg_type ev);
/* The order after the cell. */
struct spec_order spec_after(const struct spec_cell *c);
/* True when the outcome counts: version + 1 and one order_events row. */
bool spec_takes_effect(enum spec_outcome out);

/* "applied", "held", "ignored", "compensated", "dead_lettered". */
const char *spec_outcome_name(enum spec_outcome out);
/* SPEC's status text: "Created", ... "Cancelled"; "" for SPEC_NONE. */
const char *spec_status_name(enum spec_status s);

/*
 * The rest of SPEC's decisions, which depend on the key and not on the
 * order: a duplicate (same key, same hash) is acked with no effect and no new
 * row, and keeps the first outcome; the same key with another hash is
 * dead-lettered with this reason, the first one standing; a held event whose
 * prerequisite never comes is dead-lettered with SPEC_REASON_HOLD_EXPIRED
 * after INBOX_HOLD_TTL.
 */
#define SPEC_REASON_CONFLICT "payload-conflict"
#define SPEC_REASON_HOLD_EXPIRED "hold-expired"
#define SPEC_REASON_INVALID "invalid-transition"

/*
 * One order's events handled one at a time in the given order, as SPEC says:
 * a held event is re-evaluated whenever the order changes (oldest first) and
 * takes effect then.  out[i] is event i's final outcome (a held event that
 * later took effect gets that outcome; held_first[i], when not NULL, says it
 * was held first).  Fills *end, and the version and emits the events add up
 * to.  Returns -1 when an event meets an order SPEC does not know.
 */
struct spec_fold {
	struct spec_order end;
	int version;
	unsigned emits;   /* SPEC_EMIT_* of all events */
	int nemits;       /* emitted messages (each event emits each kind once) */
};
int spec_fold(const enum msg_type *ev, size_t n, enum spec_outcome *out, bool *held_first,
              struct spec_fold *res);

#endif
