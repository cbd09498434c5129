/*
 * aggregate.c - the decision engine: a lifecycle definition (lifecycle.h)
 * bound to run.
 *
 * The decisions are not written here: they are lifecycles/order.json
 * (compiled in) or the file INBOX_LIFECYCLE names, compiled by lifecycle_load.c.
 * Binding precomputes every verdict (state x remembered marks x event) so
 * that a decision is one lookup, and what the rest of the worker needs to
 * write an aggregate of that definition: its set columns, how a detail line
 * names it.  States, event types, flags and emits are the definition's
 * indexes; the built-in order file lists its states and events in the
 * order of enum order_state and enum msg_type, and its emits in the order
 * of ORDER_EMIT_*, so aggregate.h's ORDER_* names stay valid for it
 * (checked when it is bound, at first use).
 *
 * The bound definition is process-wide: agg_decide is called from every
 * worker thread.  It is set once at
 * start-up, before threads start (agg_use), and read-only after;
 * without that, the built-in file is bound on first use (pthread_once).
 */
#include "aggregate.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "array.h"
#include "msg.h"

static struct agg_binding builtin;
static const struct agg_binding *active;
static pthread_once_t builtin_once = PTHREAD_ONCE_INIT;

/* The definition's verdict in the engine's terms. */
static struct agg_verdict decide_def(const struct lc_def *d, int state, unsigned flags, int ev)
{
	struct agg_verdict v = { LC_INVALID, state, flags, 0 };
	struct lc_verdict lv = lc_decide(d, state, flags & ((1u << d->nmarks) - 1u), ev);

	v.decision = lv.decision;
	v.next = lv.next;
	/* flags the definition does not remember pass through unchanged */
	v.flags = (flags & ~((1u << d->nmarks) - 1u)) | lv.marks;
	v.emits = lv.emits;
	return v;
}

int agg_bind(const struct lc_def *d, struct agg_binding *b, char *why, size_t why_size)
{
	memset(b, 0, sizeof *b);
	b->def = d;
	b->nflags = 1 << d->nmarks;
	snprintf(b->a_name, sizeof b->a_name, "%s %s", strchr("aeiou", d->aggregate[0]) != NULL ? "an" : "a",
	         d->aggregate);
	for (int e = 0; e < d->nevents; e++) {
		const struct lc_event *ev = &d->events[e];
		size_t text = 0;

		for (int k = 0; k < ev->nsets; k++) {
			const struct lc_set *st = &ev->sets[k];
			int c = 0;

			/* what a message keeps of the event's values (msg.h) */
			text += st->src == LC_SRC_MESSAGE_ID  ? MSG_WIDE_ID_MAX + 1
			        : st->type == LC_TYPE_STRING ? 4 * (size_t)st->max_length + 1
			                                     : MSG_TIME_SQL_MAX + 1;
			if (st->column[0] == '\0') { /* a field: its statements' alone */
				b->col_of[e][k] = -1;
				continue;
			}
			while (c < b->ncols && strcmp(b->cols[c], st->column) != 0)
				c++;
			if (c == b->ncols) {
				if (b->ncols >= AGG_COLS_MAX) {
					snprintf(why, why_size, "its events set more than %d columns: this worker writes at "
					         "most %d", AGG_COLS_MAX, AGG_COLS_MAX);
					return -1;
				}
				b->cols[b->ncols++] = st->column;
			}
			b->col_of[e][k] = c;
		}
		if (text > MSG_TEXT_MAX) {
			snprintf(why, why_size, "%s sets more text than a message holds (%d bytes, a string column "
			         "takes 4 a character): make its strings' max_length smaller", ev->type, MSG_TEXT_MAX);
			return -1;
		}
	}
	b->tabled = (size_t)d->nstates * (size_t)b->nflags * (size_t)d->nevents <= AGG_CELLS_MAX;
	for (int s = 0; b->tabled && s < d->nstates; s++) {
		for (int f = 0; f < b->nflags; f++) {
			for (int t = 0; t < d->nevents; t++)
				b->cells[(s * b->nflags + f) * d->nevents + t] = decide_def(d, s, (unsigned)f, t);
		}
	}
	return 0;
}

static void bind_builtin(void)
{
	struct lc_errors errs;
	char why[512];
	struct lc_def *d = lc_load_builtin(&errs);

	/* The file is compiled in and tested (test_lifecycle): failing here
	 * is a build defect, and no order can be decided without it. */
	if (d == NULL) {
		lc_errors_print(&errs, "built-in lifecycles/order.json", stderr);
		abort();
	}
	if (agg_bind(d, &builtin, why, sizeof why) != 0) {
		fprintf(stderr, "built-in lifecycles/order.json: %s\n", why);
		abort();
	}
	/* aggregate.h's names are the built-in file's indexes */
	if (d->nstates != ORDER_STATE_COUNT || d->nevents != MSG_TYPE_COUNT ||
	    lc_state_find(d, "Cancelled") != ORDER_CANCELLED || lc_state_find(d, "InventoryReserved") != ORDER_RESERVED ||
	    lc_event_find(d, "OrderCancelled") != MSG_ORDER_CANCELLED ||
	    lc_event_find(d, "ShipmentCreated") != MSG_SHIPMENT_CREATED || d->nmarks != 2 ||
	    d->marks[0] != MSG_PAYMENT_AUTHORIZED || d->marks[1] != MSG_INVENTORY_RESERVED || d->nemits != 3 ||
	    strcmp(d->emits[0], "OrderPaid") != 0 || strcmp(d->emits[1], "RefundRequested") != 0) {
		fprintf(stderr, "built-in lifecycles/order.json: its states, events, marks or emits are not in aggregate.h's order\n");
		abort();
	}
}

static const struct agg_binding *binding(void)
{
	if (active != NULL)
		return active;
	pthread_once(&builtin_once, bind_builtin);
	return &builtin;
}

void agg_use(const struct agg_binding *b)
{
	active = b;
}

const struct agg_binding *agg_current(void)
{
	return binding();
}

int agg_type_find(const char *name, size_t len)
{
	return name == NULL ? -1 : lc_event_findn(binding()->def, name, len);
}

const char *agg_type_name(int type)
{
	const struct lc_def *d = binding()->def;

	return type >= 0 && type < d->nevents ? d->events[type].type : "";
}

/* A verdict is a lookup in the cells agg_bind filled from the
 * definition: the same cost as the C table it replaces. */
struct agg_verdict agg_decide(int state, unsigned flags, enum msg_type ev)
{
	const struct agg_binding *b = binding();
	const struct lc_def *d = b->def;
	struct agg_verdict v = { LC_INVALID, state, flags, 0 };
	unsigned known = (unsigned)b->nflags - 1u;

	if ((unsigned)state >= (unsigned)d->nstates || (unsigned)ev >= (unsigned)d->nevents)
		return v;
	if (!b->tabled)
		return decide_def(d, state, flags, (int)ev);
	v = b->cells[(state * b->nflags + (int)(flags & known)) * d->nevents + (int)ev];
	v.flags |= flags & ~known;
	return v;
}

const char *agg_state_name(int s)
{
	const struct lc_def *d = binding()->def;

	if ((unsigned)s >= (unsigned)d->nstates)
		return "";
	return d->states[s];
}

int agg_state_from_name(const char *name)
{
	if (name == NULL || name[0] == '\0')
		return -1;
	return lc_state_find(binding()->def, name);
}
