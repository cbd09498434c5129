/*
 * plan.h - the routes a load scenario sends aggregates along, read from a
 * lifecycle definition (common/lifecycle.h), and what each route must end
 * in: the state, version, emitted events and, per event, effect or
 * dead-letter.
 *
 * Routes, in this order (for lifecycles/order.json they are the five paths
 * the load generator always had; a numbered definition's are below):
 *   [0]            the main path: the creating event, then for each step
 *                  of main_path the first event (file order) that makes it;
 *   [1..nbranch]   the terminal branches: a prefix of the main path, then an
 *                  event that leaves it into a terminal state off the main
 *                  path (by position along the main path, then file order);
 *   [nbranch + 1]  at most one "invalid" route: the first branch plus the
 *                  first event that is invalid-transition in its terminal
 *                  state and that no arrival order lets apply first.
 * None of them has two events leading into different terminal states that
 * could both apply: that outcome depends on arrival order, so a ledger
 * could not predict it.  Every route is checked over every arrival order
 * (lg_plan_build): a route whose outcome depends on it is dropped, with a
 * note.
 *
 * The expectations come from lc_decide folded over the route in file
 * order, with held events re-evaluated oldest-first (the arrival-order
 * property makes that the answer for any order).  For the order
 * definition they are also held against SPEC's table (spec_oracle.c, typed
 * in from SPEC.md): a definition that disagrees is refused, so the order
 * lifecycle keeps an oracle of its own.
 *
 * A definition the producer numbers (lc_sequenced) orders its events by
 * their numbers, not its states: every arrival order ends as the number
 * order does, so nothing is checked over arrival orders, and a route may
 * loop.  Its routes: the main path; each loop (an event from a state of
 * the main path back to it or an earlier one), taken once on the way; the
 * terminal branches; and an invalid route, a prefix of the main path and
 * then an event invalid there, last (an invalid number blocks the ones
 * after it).  Message k of a route carries number k + 1.
 *
 * Ownership: struct lg_plan is the caller's and holds a borrowed pointer
 * to the definition, which must outlive it.  No allocation.
 */
#ifndef INBOX_LG_PLAN_H
#define INBOX_LG_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "lifecycle.h"

#define LG_ROUTE_MAX 9   /* events of the longest route: checked over n! orders */
/* Emitted events of one route in a numbered definition, each by its
 * cause's number (a loop emits a kind again under another number). */
#define LG_INST_MAX 24
#define LG_ROUTES_MAX 32
#define LG_FIELDS_MAX LC_MAX_SETS

enum lg_route_kind { LG_ROUTE_MAIN = 0, LG_ROUTE_BRANCH, LG_ROUTE_INVALID };

struct lg_route {
	enum lg_route_kind kind;
	int ev[LG_ROUTE_MAX]; /* event indexes, canonical (file) order */
	int n;
	bool dead[LG_ROUTE_MAX]; /* dead-lettered (invalid-transition) in canonical order */
	/* In canonical order, the decision each event ends in and the state it
	 * was reached in: what lc_event_stmts needs to say which of the
	 * definition's statements it runs (the same in every arrival order,
	 * or the route is dropped). */
	enum lc_decision out[LG_ROUTE_MAX];
	int before[LG_ROUTE_MAX];
	int end;               /* the state it ends in */
	unsigned version;      /* effects: applied + compensated */
	uint32_t emits;        /* bits into def->emits */
	/* A numbered definition's (lc_sequenced) emitted events one by one:
	 * the kind (an index into def->emits) and the number of the event
	 * that caused it, which its id ends with (":<n>"); an event's number
	 * is its place in the route, from 1. */
	uint8_t inst_kind[LG_INST_MAX], inst_num[LG_INST_MAX];
	int ninst;
};

/* One data field the scenario's messages carry (the union of the events'
 * `sets` from data.<field>, in the order they first appear): every message
 * of an aggregate carries each with the aggregate's value, as every order
 * message always carried data.amount_cents. */
struct lg_field {
	const struct lc_set *set;
};

struct lg_plan {
	const struct lc_def *def;
	bool is_order;         /* the order definition: SPEC's oracle applies */
	struct lg_route routes[LG_ROUTES_MAX];
	int nroutes;
	int nbranch;           /* routes[1..nbranch] */
	int invalid;           /* index of the invalid route, or -1 */
	struct lg_field fields[LG_FIELDS_MAX];
	int nfields;
	int emit_order[LC_MAX_EMITS]; /* the order the ledger lists emits in */
	/* For the malformed data classes: an event that requires a data field
	 * (and that field's index in fields), an event that reads one; -1 when
	 * none does. */
	int required_ev, required_field;
	int data_ev, data_field;
	int max_len;           /* events of the longest route */
};

/* What one arrival order does: per message (in the order given) its final
 * decision and whether it waited first; the aggregate at the end. */
struct lg_fold {
	enum lc_decision out[LG_ROUTE_MAX];
	int before[LG_ROUTE_MAX]; /* the state out[i] was decided in */
	bool held[LG_ROUTE_MAX];
	int state;
	uint32_t marks;
	unsigned version;
	uint32_t emits;
	uint32_t ev_emits[LG_ROUTE_MAX]; /* what each message emitted */
};

/* Fold ev[0..n) through lc_decide: holds re-evaluated oldest-first after
 * every change, as the worker does.  n <= LG_ROUTE_MAX.  For a numbered
 * definition num[i] is message i's number (NULL: a state-ordered one):
 * a message applies when its number is next, a later one waits, and the
 * waiting ones go in number order. */
void lg_fold_run(const struct lc_def *def, const int *ev, const int *num, int n, struct lg_fold *f);

/* Whether statements a and b of def are one statement: the same text
 * and the same value in each parameter (a data field by its name).  An
 * event that runs the same statements applied and compensating writes
 * the same rows either way, as the arrival-order check counts it. */
bool lg_stmt_same(const struct lc_def *def, int a, int b);

/* The routes and fields of def.  Returns 0, or -1 with one line in err
 * (no main path, a route too long, the order definition against SPEC). */
int lg_plan_build(struct lg_plan *p, const struct lc_def *def, char *err, size_t cap);

/* "orders" for OrderCreated, "payments" for PaymentAuthorized ...: the
 * sources the order scenario always used; other lifecycles' events come
 * from the aggregate's table name. */
const char *lg_plan_source(const struct lg_plan *p, int ev);

#endif
