/*
 * order.c - the order engine: the lifecycle definition (lifecycle.h) bound
 * to the worker's order schema.
 *
 * The decisions are not written here any more: they are lifecycles/order.json
 * (compiled in) or the file INBOX_LIFECYCLE names, compiled by lifecycle.c.
 * What stays in C is what the database and the rest of the worker already
 * speak: enum order_state (orders.status), enum msg_type (the parser's
 * types), ORDER_FLAG_* (orders.flags) and ORDER_EMIT_* (the outbox types).
 * order_bind maps each of them to the definition by name and refuses a
 * definition that would need another schema (another table, other states
 * or events, other columns, another meaning of orders.flags), saying so.
 *
 * The bound definition is process-wide: order_decide is called from every
 * worker thread with the signature it always had.  It is set once at
 * start-up, before threads start (order_use_lifecycle), and read-only after;
 * without that, the built-in file is bound on first use (pthread_once).
 */
#include "order.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "array.h"

static const char *const flag_events[] = { "PaymentAuthorized", "InventoryReserved" }; /* ORDER_FLAG_* bit order */
static const struct {
	unsigned bit;
	const char *name;
} emit_names[] = {
	{ ORDER_EMIT_REFUND, "RefundRequested" },
	{ ORDER_EMIT_RELEASE, "InventoryReleaseRequested" },
	{ ORDER_EMIT_PAID, "OrderPaid" },
};

static struct order_binding builtin;
static const struct order_binding *active;
static pthread_once_t builtin_once = PTHREAD_ONCE_INIT;

static const char *const state_names[] = {
	[ORDER_NONE] = "",
	[ORDER_CREATED] = "Created",
	[ORDER_PAID] = "Paid",
	[ORDER_RESERVED] = "InventoryReserved",
	[ORDER_SHIPPED] = "Shipped",
	[ORDER_CANCELLED] = "Cancelled",
};
_Static_assert(ARRAY_LEN(state_names) == ORDER_STATE_COUNT, "one name per enum order_state");

static bool set_is(const struct lc_set *st, const char *column, enum lc_source src, const char *field,
                   enum lc_type type, int64_t min)
{
	return strcmp(st->column, column) == 0 && st->src == src && strcmp(st->field, field) == 0 &&
	       st->type == type && (type != LC_TYPE_INTEGER || (st->min == min && st->max == INT64_MAX));
}

/* The definition's verdict, through the name mapping. */
static struct order_verdict decide_bound(const struct order_binding *b, enum order_state state, unsigned flags,
                                         enum msg_type ev)
{
	struct order_verdict v = { ORDER_INVALID, state, flags, 0 };
	struct lc_verdict lv;
	uint32_t marks = 0;

	for (int m = 0; m < b->def->nmarks; m++) {
		if (flags & b->mark_to_flag[m])
			marks |= 1u << m;
	}
	lv = lc_decide(b->def, b->state_to_lc[state], marks, b->type_to_lc[ev]);
	v.decision = (enum order_decision)lv.decision;
	v.next = (enum order_state)b->lc_to_state[lv.next];
	/* flags the definition does not remember pass through unchanged */
	for (int m = 0; m < b->def->nmarks; m++) {
		if (lv.marks & (1u << m))
			v.flags |= b->mark_to_flag[m];
	}
	for (int k = 0; k < b->def->nemits; k++) {
		if (lv.emits & (1u << k))
			v.emits |= b->emit_to_order[k];
	}
	return v;
}

int order_bind(const struct lc_def *d, struct order_binding *b, char *why, size_t why_size)
{
	static const char remedy[] = "the worker's schema (migrations/) is the order schema; a lifecycle "
	                             "with another schema cannot run yet";

	memset(b, 0, sizeof *b);
	b->def = d;
	if (strcmp(d->aggregate, "order") != 0 || strcmp(d->table, "orders") != 0 || strcmp(d->key, "order_id") != 0) {
		snprintf(why, why_size, "aggregate %s in table %s keyed by %s needs a schema change (the worker has "
		         "order in orders keyed by order_id): %s", d->aggregate, d->table, d->key, remedy);
		return -1;
	}
	if (d->nstates != ORDER_STATE_COUNT) {
		snprintf(why, why_size, "%d states need a schema change (orders.status holds Created, Paid, "
		         "InventoryReserved, Shipped, Cancelled): %s", d->nstates - 1, remedy);
		return -1;
	}
	for (int s = 1; s < ORDER_STATE_COUNT; s++) {
		int i = lc_state_find(d, state_names[s]);

		if (i < 0) {
			snprintf(why, why_size, "no state %s: orders.status holds Created, Paid, InventoryReserved, "
			         "Shipped, Cancelled; %s", state_names[s], remedy);
			return -1;
		}
		b->state_to_lc[s] = i;
		b->lc_to_state[i] = s;
	}
	if (d->nevents != MSG_TYPE_COUNT) {
		snprintf(why, why_size, "%d event types need a code change (the worker parses OrderCreated, "
		         "PaymentAuthorized, InventoryReserved, ShipmentCreated, OrderCancelled): %s", d->nevents, remedy);
		return -1;
	}
	for (int t = 0; t < MSG_TYPE_COUNT; t++) {
		int i = lc_event_find(d, msg_type_name((enum msg_type)t));

		if (i < 0 || strcmp(d->events[i].type, msg_type_name((enum msg_type)t)) != 0) {
			snprintf(why, why_size, "no event type %s: the worker parses OrderCreated, PaymentAuthorized, "
			         "InventoryReserved, ShipmentCreated, OrderCancelled; %s", msg_type_name((enum msg_type)t), remedy);
			return -1;
		}
		b->type_to_lc[t] = i;
		b->lc_to_type[i] = t;
	}
	for (int m = 0; m < d->nmarks; m++) {
		const char *ev = d->events[d->marks[m]].type;
		bool ok = false;

		for (unsigned f = 0; f < ARRAY_LEN(flag_events); f++) {
			if (strcmp(ev, flag_events[f]) == 0) {
				b->mark_to_flag[m] = 1u << f;
				ok = true;
			}
		}
		if (!ok) {
			snprintf(why, why_size, "remembering whether %s took effect needs a schema change (orders.flags "
			         "records PaymentAuthorized and InventoryReserved only): %s", ev, remedy);
			return -1;
		}
	}
	for (int k = 0; k < d->nemits; k++) {
		bool ok = false;

		for (unsigned i = 0; i < ARRAY_LEN(emit_names); i++) {
			if (strcmp(d->emits[k], emit_names[i].name) == 0) {
				b->emit_to_order[k] = emit_names[i].bit;
				ok = true;
			}
		}
		if (!ok) {
			snprintf(why, why_size, "emitting %s needs a code change (the outbox writes RefundRequested, "
			         "InventoryReleaseRequested, OrderPaid): %s", d->emits[k], remedy);
			return -1;
		}
	}
	for (int e = 0; e < d->nevents; e++) {
		const struct lc_event *ev = &d->events[e];
		bool payment = strcmp(ev->type, "PaymentAuthorized") == 0;

		if (payment ? !(ev->nsets == 2 &&
		                set_is(&ev->sets[0], "paid_at", LC_SRC_APPLIED_AT, "", LC_TYPE_DATETIME, 0) &&
		                set_is(&ev->sets[1], "amount_cents", LC_SRC_DATA, "amount_cents", LC_TYPE_INTEGER, 0) &&
		                !ev->sets[1].required)
		            : ev->nsets != 0) {
			snprintf(why, why_size, "what %s sets needs a schema change (orders has paid_at from applied_at "
			         "and amount_cents from data.amount_cents, integer, min 0, optional, set by "
			         "PaymentAuthorized only): %s", ev->type, remedy);
			return -1;
		}
		for (int a = 0; a < ev->naliases && b->naliases < ORDER_ALIAS_MAX; a++) {
			b->aliases[b->naliases].name = ev->aliases[a];
			b->aliases[b->naliases].type = b->lc_to_type[e];
			b->naliases++;
		}
	}
	for (int s = 0; s < ORDER_STATE_COUNT; s++) {
		for (unsigned f = 0; f <= ORDER_FLAGS_ALL; f++) {
			for (int t = 0; t < MSG_TYPE_COUNT; t++)
				b->cells[s][f][t] = decide_bound(b, (enum order_state)s, f, (enum msg_type)t);
		}
	}
	return 0;
}

static void bind_builtin(void)
{
	struct lc_errors errs;
	char why[512];
	struct lc_def *d = lc_load(lc_builtin_order, lc_builtin_order_len, &errs);

	/* The file is compiled in and tested (test_lifecycle): failing here
	 * is a build defect, and no order can be decided without it. */
	if (d == NULL) {
		lc_errors_print(&errs, "built-in lifecycles/order.json", stderr);
		abort();
	}
	if (order_bind(d, &builtin, why, sizeof why) != 0) {
		fprintf(stderr, "built-in lifecycles/order.json: %s\n", why);
		abort();
	}
}

static const struct order_binding *binding(void)
{
	if (active != NULL)
		return active;
	pthread_once(&builtin_once, bind_builtin);
	return &builtin;
}

void order_use(const struct order_binding *b)
{
	active = b;
}

const struct order_binding *order_binding_current(void)
{
	return binding();
}

int order_alias_type(const char *name, size_t len)
{
	const struct order_binding *b = binding();

	for (int i = 0; i < b->naliases; i++) {
		if (strlen(b->aliases[i].name) == len && memcmp(b->aliases[i].name, name, len) == 0)
			return b->aliases[i].type;
	}
	return -1;
}

/* A verdict is a lookup in the cells order_bind filled from the
 * definition: the same cost as the C table it replaces.  Flags outside
 * ORDER_FLAG_* (none are written) are carried through. */
struct order_verdict order_decide(enum order_state state, unsigned flags, enum msg_type ev)
{
	const struct order_binding *b = binding();
	struct order_verdict v = { ORDER_INVALID, state, flags, 0 };

	if ((unsigned)state >= ORDER_STATE_COUNT || (unsigned)ev >= MSG_TYPE_COUNT)
		return v;
	v = b->cells[state][flags & ORDER_FLAGS_ALL][ev];
	v.flags |= flags & ~ORDER_FLAGS_ALL;
	return v;
}

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
