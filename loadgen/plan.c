/*
 * plan.c - a load scenario's routes from a lifecycle definition, each
 * checked over every arrival order.  See plan.h.
 */
#include "plan.h"

#include <stdio.h>
#include <string.h>

#include "msg.h"
#include "spec_oracle.h"

/* Decide message i on the aggregate as it is, and carry it out; whether
 * the aggregate changed (or, numbered, took a number: *took). */
static bool lg_fold_one(const struct lc_def *def, const int *ev, int i, struct lg_fold *f, bool *took)
{
	struct lc_verdict v = lc_decide(def, f->state, f->marks, ev[i]);

	*took = false;
	f->out[i] = v.decision;
	f->before[i] = f->state;
	if (v.decision == LC_HOLD)
		return false;
	*took = v.decision != LC_INVALID;
	if (v.decision != LC_APPLY && v.decision != LC_COMPENSATE)
		return false;
	f->state = v.next;
	f->marks = v.marks;
	f->version++;
	f->emits |= v.emits;
	f->ev_emits[i] = v.emits;
	return true;
}

/* Whether held message i may go now: a state-ordered one when its
 * decision is no longer a hold, a numbered one when its number is next. */
static bool lg_due(const struct lc_def *def, const int *ev, const int *num, int i, const struct lg_fold *f,
                   int taken)
{
	if (num != NULL)
		return num[i] == taken + 1;
	return lc_decide(def, f->state, f->marks, ev[i]).decision != LC_HOLD;
}

void lg_fold_run(const struct lc_def *def, const int *ev, const int *num, int n, struct lg_fold *f)
{
	int held[LG_ROUTE_MAX], nheld = 0, taken = 0;

	memset(f, 0, sizeof *f);
	for (int i = 0; i < n; i++) {
		bool progress, took;

		if (num != NULL && num[i] != taken + 1) {
			f->out[i] = LC_HOLD; /* ahead of its turn (a taken number is no message of a route) */
			f->before[i] = f->state;
			f->held[i] = true;
			held[nheld++] = i;
			continue;
		}
		(void)lg_fold_one(def, ev, i, f, &took);
		if (f->out[i] == LC_HOLD) {
			f->held[i] = true;
			held[nheld++] = i;
			continue;
		}
		taken += took;
		if (!took && num != NULL)
			continue;
		if (num == NULL && f->out[i] != LC_APPLY && f->out[i] != LC_COMPENSATE)
			continue;
		/* Re-evaluated whenever the aggregate changes: oldest first,
		 * again after every change, until nothing more can go. */
		do {
			progress = false;
			for (int h = 0; h < nheld; h++) {
				if (!lg_due(def, ev, num, held[h], f, taken))
					continue;
				(void)lg_fold_one(def, ev, held[h], f, &took);
				if (f->out[held[h]] == LC_HOLD)
					continue;
				taken += took;
				memmove(&held[h], &held[h + 1], (size_t)(nheld - h - 1) * sizeof held[0]);
				nheld--;
				progress = true;
				break;
			}
		} while (progress);
	}
}

static bool lg_takes_effect(enum lc_decision d)
{
	return d == LC_APPLY || d == LC_COMPENSATE;
}

/* The numbers of a route's n messages in canonical order, 1..n, for a
 * numbered definition; NULL for one ordered by its states. */
static const int *lg_nums(const struct lc_def *def, int *buf, int n)
{
	if (!lc_sequenced(def))
		return NULL;
	for (int i = 0; i < n; i++)
		buf[i] = i + 1;
	return buf;
}

/* The route's expectations from its canonical order; false when an event
 * ends neither in an effect nor in a dead-letter (held for ever, ignored):
 * the ledger has no expectation for that. */
static bool lg_route_expect(const struct lc_def *def, struct lg_route *r)
{
	struct lg_fold f;
	int nums[LG_ROUTE_MAX];

	lg_fold_run(def, r->ev, lg_nums(def, nums, r->n), r->n, &f);
	r->ninst = 0;
	for (int i = 0; i < r->n; i++) {
		if (!lg_takes_effect(f.out[i]) && f.out[i] != LC_INVALID)
			return false;
		r->dead[i] = f.out[i] == LC_INVALID;
		r->out[i] = f.out[i];
		r->before[i] = f.before[i];
		for (int b = 0; lc_sequenced(def) && b < def->nemits; b++) {
			if (!(f.ev_emits[i] & (1u << b)))
				continue;
			if (r->ninst == LG_INST_MAX)
				return false;
			r->inst_kind[r->ninst] = (uint8_t)b;
			r->inst_num[r->ninst++] = (uint8_t)(i + 1);
		}
	}
	r->end = f.state;
	r->version = f.version;
	r->emits = f.emits;
	return true;
}

bool lg_stmt_same(const struct lc_def *def, int a, int b)
{
	const struct lc_stmt *x = &def->stmts[a], *y = &def->stmts[b];

	if (strcmp(x->fx.sql, y->fx.sql) != 0 || x->fx.nparams != y->fx.nparams)
		return false;
	for (int i = 0; i < x->fx.nparams; i++) {
		const struct lc_fx_param *p = &x->fx.params[i], *q = &y->fx.params[i];
		const struct lc_set *ps, *qs;

		if (p->src != q->src)
			return false;
		if (p->src != LC_FX_SET)
			continue;
		ps = &def->events[x->event].sets[p->set];
		qs = &def->events[y->event].sets[q->set];
		if (ps->src != qs->src || (ps->src == LC_SRC_DATA && strcmp(ps->field, qs->field) != 0))
			return false;
	}
	return true;
}

/* Whether event ev runs the same statements decided as a in state sa as
 * decided as b in state sb: verify predicts the rows they write. */
static bool lg_same_stmts(const struct lc_def *def, int ev, enum lc_decision a, int sa, enum lc_decision b, int sb)
{
	int fa = 0, fb = 0, na = lc_event_stmts(def, ev, sa, a, &fa), nb = lc_event_stmts(def, ev, sb, b, &fb);

	if (na != nb)
		return false;
	for (int i = 0; i < na; i++) {
		if (fa + i != fb + i && !lg_stmt_same(def, fa + i, fb + i))
			return false;
	}
	return true;
}

/* Every arrival order of the route (Heap's algorithm) ends as the
 * canonical one: the same state, version and emits, and each message the
 * same effect or dead-letter, running the same statements. */
static bool lg_route_stable(const struct lc_def *def, const struct lg_route *r)
{
	int perm[LG_ROUTE_MAX], ev[LG_ROUTE_MAX], c[LG_ROUTE_MAX] = { 0 };
	int i = 1;

	for (int k = 0; k < r->n; k++)
		perm[k] = k;
	for (;;) {
		struct lg_fold f;

		for (int k = 0; k < r->n; k++)
			ev[k] = r->ev[perm[k]];
		lg_fold_run(def, ev, NULL, r->n, &f);
		if (f.state != r->end || f.version != r->version || f.emits != r->emits)
			return false;
		for (int k = 0; k < r->n; k++)
			if (!(f.out[k] == LC_INVALID ? r->dead[perm[k]] : lg_takes_effect(f.out[k]) && !r->dead[perm[k]]) ||
			    !lg_same_stmts(def, ev[k], f.out[k], f.before[k], r->out[perm[k]], r->before[perm[k]]))
				return false;
		while (i < r->n && c[i] >= i) {
			c[i] = 0;
			i++;
		}
		if (i >= r->n)
			return true;
		{
			int j = i % 2 == 0 ? 0 : c[i], t = perm[j];
			perm[j] = perm[i];
			perm[i] = t;
		}
		c[i]++;
		i = 1;
	}
}

static void lg_route_describe(const struct lc_def *def, const struct lg_route *r, char *buf, size_t cap)
{
	size_t used = 0;

	buf[0] = '\0';
	for (int k = 0; k < r->n && used < cap; k++) {
		int n = snprintf(buf + used, cap - used, "%s%s", k ? ", " : "", def->events[r->ev[k]].type);
		if (n < 0)
			break;
		used += (size_t)n;
	}
}

/* Add r when it has expectations and keeps them over every arrival order;
 * otherwise say why it is left out (stderr) and return false. */
static bool lg_route_add(struct lg_plan *p, struct lg_route *r, bool quiet)
{
	char what[512];

	if (p->nroutes == LG_ROUTES_MAX)
		return false;
	/* A numbered route needs no check over arrival orders: the numbers
	 * put every order back into the route's (plan.h). */
	if (!lg_route_expect(p->def, r) || (!lc_sequenced(p->def) && !lg_route_stable(p->def, r))) {
		if (!quiet) {
			lg_route_describe(p->def, r, what, sizeof what);
			fprintf(stderr, "inbox-loadgen: note: route %s left out: its outcome depends on arrival order\n",
			        what);
		}
		return false;
	}
	p->routes[p->nroutes++] = *r;
	if (r->n > p->max_len)
		p->max_len = r->n;
	return true;
}

/* r: a route of kind that starts with ev[0..n) and then takes e. */
static void lg_route_from(struct lg_route *r, enum lg_route_kind kind, const int *ev, int n, int e)
{
	memset(r, 0, sizeof *r);
	r->kind = kind;
	memcpy(r->ev, ev, (size_t)n * sizeof r->ev[0]);
	r->n = n;
	r->ev[r->n++] = e;
}

static int lg_main_route(struct lg_plan *p, struct lg_route *r, char *err, size_t cap)
{
	const struct lc_def *d = p->def;

	memset(r, 0, sizeof *r);
	r->kind = LG_ROUTE_MAIN;
	for (int e = 0; e < d->nevents && r->n == 0; e++)
		if (d->events[e].creates == d->path[0])
			r->ev[r->n++] = e;
	if (r->n == 0) {
		snprintf(err, cap, "no event creates %s, the main path's first state", d->states[d->path[0]]);
		return -1;
	}
	for (int k = 0; k + 1 < d->npath; k++) {
		int found = -1;

		for (int e = 0; e < d->nevents && found < 0; e++) {
			const struct lc_event *ev = &d->events[e];
			if (ev->creates == 0 && (ev->from & (1u << d->path[k])) && ev->to == d->path[k + 1])
				found = e;
		}
		if (found < 0) {
			snprintf(err, cap, "no event moves %s to %s along the main path", d->states[d->path[k]],
			         d->states[d->path[k + 1]]);
			return -1;
		}
		if (r->n == LG_ROUTE_MAX) {
			snprintf(err, cap, "the main path has more than %d events", LG_ROUTE_MAX);
			return -1;
		}
		r->ev[r->n++] = found;
	}
	return 0;
}

static bool lg_on_main(const struct lc_def *d, int s)
{
	for (int k = 0; k < d->npath; k++)
		if (d->path[k] == s)
			return true;
	return false;
}

static void lg_branches(struct lg_plan *p, const struct lg_route *main_route)
{
	const struct lc_def *d = p->def;

	for (int k = 0; k + 1 < d->npath && k < main_route->n; k++) {
		for (int e = 0; e < d->nevents; e++) {
			const struct lc_event *ev = &d->events[e];
			struct lg_route r;

			if (ev->creates != 0 || !(ev->from & (1u << d->path[k])) || !(d->terminal & (1u << ev->to)) ||
			    lg_on_main(d, ev->to) || k + 2 > LG_ROUTE_MAX)
				continue;
			lg_route_from(&r, LG_ROUTE_BRANCH, main_route->ev, k + 1, e);
			if (lg_route_add(p, &r, false))
				p->nbranch++;
		}
	}
}

static bool lg_in_route(const struct lg_route *r, int e)
{
	for (int k = 0; k < r->n; k++)
		if (r->ev[k] == e)
			return true;
	return false;
}

/* The first branch that an event can follow only as invalid-transition,
 * whatever the order: candidates that some order lets apply are skipped
 * quietly (they are conflicts, not invalid routes). */
static void lg_invalid_route(struct lg_plan *p)
{
	const struct lc_def *d = p->def;

	p->invalid = -1;
	for (int b = 1; b <= p->nbranch; b++) {
		const struct lg_route *br = &p->routes[b];

		if (br->n + 1 > LG_ROUTE_MAX)
			continue;
		for (int e = 0; e < d->nevents; e++) {
			struct lg_route r = *br;
			struct lg_fold f;

			if (lg_in_route(br, e))
				continue;
			lg_fold_run(d, br->ev, NULL, br->n, &f);
			if (lc_decide(d, f.state, f.marks, e).decision != LC_INVALID)
				continue;
			r.kind = LG_ROUTE_INVALID;
			r.ev[r.n++] = e;
			if (lg_route_add(p, &r, true)) {
				p->invalid = p->nroutes - 1;
				return;
			}
		}
	}
}

/* A numbered definition's loops (plan.h): from state path[i] of the main
 * path an event back to path[j], j <= i (a renewal that stays where it
 * is too), then the main path's events from path[j] to path[i] again,
 * and on to its end. */
static void lg_loops(struct lg_plan *p, const struct lg_route *m)
{
	const struct lc_def *d = p->def;

	for (int i = 1; i < d->npath && i < m->n; i++) {
		for (int e = 0; e < d->nevents; e++) {
			const struct lc_event *ev = &d->events[e];
			struct lg_route r;
			int j = -1;

			if (ev->creates != 0 || !(ev->from & (1u << d->path[i])))
				continue;
			for (int k = 0; k <= i; k++)
				if (d->path[k] == ev->to)
					j = k;
			if (j < 0 || m->n + 1 + (i - j) > LG_ROUTE_MAX)
				continue;
			lg_route_from(&r, LG_ROUTE_BRANCH, m->ev, i + 1, e);
			memcpy(r.ev + r.n, m->ev + j + 1, (size_t)(i - j) * sizeof r.ev[0]);
			r.n += i - j;
			memcpy(r.ev + r.n, m->ev + i + 1, (size_t)(m->n - i - 1) * sizeof r.ev[0]);
			r.n += m->n - i - 1;
			if (lg_route_add(p, &r, false))
				p->nbranch++;
		}
	}
}

/* A numbered definition's invalid route: the shortest prefix of the main
 * path after which some event is invalid, and that event, last. */
static void lg_invalid_numbered(struct lg_plan *p, const struct lg_route *m)
{
	const struct lc_def *d = p->def;
	int nums[LG_ROUTE_MAX];

	p->invalid = -1;
	for (int k = 1; k <= m->n && k < LG_ROUTE_MAX; k++) {
		struct lg_fold f;

		lg_fold_run(d, m->ev, lg_nums(d, nums, k), k, &f);
		for (int e = 0; e < d->nevents; e++) {
			struct lg_route r;

			if (d->events[e].creates != 0 || lc_decide(d, f.state, f.marks, e).decision != LC_INVALID)
				continue;
			lg_route_from(&r, LG_ROUTE_INVALID, m->ev, k, e);
			if (lg_route_add(p, &r, true)) {
				p->invalid = p->nroutes - 1;
				return;
			}
		}
	}
}

static void lg_fields(struct lg_plan *p)
{
	const struct lc_def *d = p->def;

	p->required_ev = p->required_field = p->data_ev = p->data_field = -1;
	for (int e = 0; e < d->nevents; e++) {
		for (int k = 0; k < d->events[e].nsets; k++) {
			const struct lc_set *s = &d->events[e].sets[k];
			int have = -1;

			if (s->src != LC_SRC_DATA)
				continue;
			for (int f = 0; f < p->nfields; f++)
				if (strcmp(p->fields[f].set->field, s->field) == 0)
					have = f;
			if (have < 0 && p->nfields < LG_FIELDS_MAX) {
				have = p->nfields;
				p->fields[p->nfields++].set = s;
			}
			if (have < 0)
				continue;
			if (p->data_ev < 0) {
				p->data_ev = e;
				p->data_field = have;
			}
			if (s->required && p->required_ev < 0) {
				p->required_ev = e;
				p->required_field = have;
			}
		}
	}
}

/* SPEC's emitted messages, in the order of its SPEC_EMIT_* bits: the order
 * the ledger always listed them in. */
static const char *const lg_spec_emits[] = { "RefundRequested", "InventoryReleaseRequested", "OrderPaid" };

/* SPEC's emit bits as the definition's; false when SPEC emits something
 * the definition never does. */
static bool lg_spec_bits_to_def(const struct lc_def *d, unsigned spec, uint32_t *out)
{
	*out = 0;
	for (int b = 0; b < 3; b++) {
		bool found = false;

		if (!(spec & (1u << b)))
			continue;
		for (int i = 0; i < d->nemits; i++)
			if (strcmp(d->emits[i], lg_spec_emits[b]) == 0) {
				*out |= 1u << i;
				found = true;
			}
		if (!found)
			return false;
	}
	return true;
}

/* The order definition's routes against SPEC's table, typed in from
 * SPEC.md: what the file says must be what SPEC says. */
static int lg_spec_check(const struct lg_plan *p, char *err, size_t cap)
{
	const struct lc_def *d = p->def;

	for (int i = 0; i < p->nroutes; i++) {
		const struct lg_route *r = &p->routes[i];
		enum msg_type ev[LG_ROUTE_MAX];
		enum spec_outcome out[LG_ROUTE_MAX];
		struct spec_fold f;
		char what[512];
		uint32_t bits;
		bool same;

		for (int k = 0; k < r->n; k++) {
			const char *name = d->events[r->ev[k]].type;
			int t = msg_type_from_name(name, strlen(name));

			if (t < 0) {
				snprintf(err, cap, "the order definition's event %s is not one of SPEC's", name);
				return -1;
			}
			ev[k] = (enum msg_type)t;
		}
		same = spec_fold(ev, (size_t)r->n, out, NULL, &f) == 0 &&
		       strcmp(spec_status_name(f.end.status), d->states[r->end]) == 0 &&
		       f.version == (int)r->version && lg_spec_bits_to_def(d, f.emits, &bits) && bits == r->emits;
		for (int k = 0; same && k < r->n; k++)
			same = (out[k] == SPEC_DEAD_LETTERED) == r->dead[k];
		if (!same) {
			lg_route_describe(d, r, what, sizeof what);
			snprintf(err, cap, "the order definition disagrees with SPEC's table on %s", what);
			return -1;
		}
	}
	return 0;
}

static void lg_emit_order(struct lg_plan *p)
{
	const struct lc_def *d = p->def;
	bool taken[LC_MAX_EMITS] = { false };
	int n = 0;

	if (p->is_order) {
		for (int b = 0; b < 3; b++)
			for (int i = 0; i < d->nemits; i++)
				if (!taken[i] && strcmp(d->emits[i], lg_spec_emits[b]) == 0) {
					taken[i] = true;
					p->emit_order[n++] = i;
				}
	}
	for (int i = 0; i < d->nemits; i++)
		if (!taken[i])
			p->emit_order[n++] = i;
}

int lg_plan_build(struct lg_plan *p, const struct lc_def *def, char *err, size_t cap)
{
	struct lg_route main_route;

	memset(p, 0, sizeof *p);
	p->def = def;
	p->invalid = -1;
	p->is_order = strcmp(def->aggregate, "order") == 0 && strcmp(def->table, "orders") == 0 &&
	              strcmp(def->key, "order_id") == 0;
	/* The worker refuses such a definition (lifecycle check): a ledger
	 * for it would predict what no arrival order promises.  A numbered
	 * one's numbers promise it. */
	if (!lc_sequenced(def)) {
		struct lc_check chk;
		if (!lc_check_order_independence(def, &chk)) {
			snprintf(err, cap, "the definition is not arrival-order independent: %s", chk.why);
			return -1;
		}
	}
	if (def->npath < 1) {
		snprintf(err, cap, "the definition has no main path");
		return -1;
	}
	if (lg_main_route(p, &main_route, err, cap) != 0)
		return -1;
	if (!lg_route_add(p, &main_route, false)) {
		snprintf(err, cap, "the main path's outcome depends on arrival order (or an event of it never takes effect)");
		return -1;
	}
	if (lc_sequenced(def))
		lg_loops(p, &p->routes[0]);
	lg_branches(p, &p->routes[0]);
	if (lc_sequenced(def))
		lg_invalid_numbered(p, &p->routes[0]);
	else
		lg_invalid_route(p);
	lg_fields(p);
	lg_emit_order(p);
	if (p->is_order && lg_spec_check(p, err, cap) != 0)
		return -1;
	return 0;
}

const char *lg_plan_source(const struct lg_plan *p, int ev)
{
	static const struct {
		const char *type, *source;
	} order_sources[] = {
		{ "PaymentAuthorized", "payments" },
		{ "InventoryReserved", "inventory" },
		{ "ShipmentCreated", "shipping" },
	};

	if (p->is_order) {
		for (size_t i = 0; i < sizeof order_sources / sizeof order_sources[0]; i++)
			if (strcmp(p->def->events[ev].type, order_sources[i].type) == 0)
				return order_sources[i].source;
	}
	return p->def->table;
}
