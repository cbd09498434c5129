/*
 * lifecycle_check.c - the arrival-order property: every order in which a set
 * of event types can arrive, played through lc_decide as the worker would
 * (held events re-evaluated whenever the aggregate changes), ends the same.
 *
 * Compensation once per event type, from the marks (lifecycle.c), is what
 * makes a well-formed table order-independent, and
 * lc_check_order_independence proves it for the file at hand instead of
 * trusting it.
 */
#include "lifecycle.h"

#include <string.h>

#define SIM_MAX (LC_CHECK_MAX_EVENTS + 1)

struct sim {
	int state;
	uint32_t marks;
	int version;
	int ledger[LC_MAX_EVENTS]; /* applied + compensated rows per event type */
	/* The definition's own statements run, per event type and the state
	 * it took effect after (applied ones and compensations differ). */
	int fx[LC_MAX_EVENTS][LC_MAX_STATES];
	int emitted[LC_MAX_EMITS];
	int held[SIM_MAX];
	int nheld;
	bool lifo;
};

/* Which statements run, as the check counts them: the case (0 applied,
 * else the terminal state compensated after) whose list is the first with
 * the same texts, so that an event that runs the same statements applied
 * and compensating (an effect recorded either way) is one effect. */
static int sim_fx_case(const struct lc_def *d, int ev, int c)
{
	const struct lc_event *e = &d->events[ev];
	int n = c == 0 ? e->nfx : e->cfx_n[c], first = c == 0 ? e->fx_first : e->cfx_first[c];

	for (int k = 0; k < c; k++) {
		int kn = k == 0 ? e->nfx : e->cfx_n[k], kf = k == 0 ? e->fx_first : e->cfx_first[k];
		bool same = kn == n;

		for (int i = 0; same && i < n; i++)
			same = strcmp(d->stmts[kf + i].fx.sql, d->stmts[first + i].fx.sql) == 0;
		if (same && n > 0)
			return k;
	}
	return c;
}

static void sim_record(const struct lc_def *d, struct sim *s, int ev, struct lc_verdict v)
{
	switch (v.decision) {
	case LC_APPLY:
	case LC_COMPENSATE: {
		int first;

		if (lc_event_stmts(d, ev, s->state, v.decision, &first) > 0)
			s->fx[ev][sim_fx_case(d, ev, v.decision == LC_APPLY ? 0 : s->state)]++;
		s->state = v.next;
		s->marks = v.marks;
		s->version++;
		s->ledger[ev]++;
		for (int k = 0; k < d->nemits; k++)
			s->emitted[k] += (v.emits >> k) & 1u;
		break;
	}
	case LC_HOLD:
		if (s->nheld < SIM_MAX)
			s->held[s->nheld++] = ev;
		break;
	case LC_IGNORE:
	case LC_INVALID:
		break;
	}
}

/* The worker re-evaluates held events whenever the aggregate changes. */
static void sim_deliver(const struct lc_def *d, struct sim *s, int ev)
{
	struct lc_verdict v = lc_decide(d, s->state, s->marks, ev);
	bool moved;

	sim_record(d, s, ev, v);
	if (v.decision != LC_APPLY && v.decision != LC_COMPENSATE)
		return;
	do {
		moved = false;
		for (int k = 0; k < s->nheld && !moved; k++) {
			int i = s->lifo ? s->nheld - 1 - k : k;
			int h = s->held[i];

			v = lc_decide(d, s->state, s->marks, h);
			if (v.decision == LC_HOLD)
				continue;
			memmove(&s->held[i], &s->held[i + 1], (size_t)(s->nheld - i - 1) * sizeof s->held[0]);
			s->nheld--;
			sim_record(d, s, h, v);
			moved = true;
		}
	} while (moved);
}

static void sim_run(const struct lc_def *d, const int *seq, int n, bool lifo, struct sim *s)
{
	memset(s, 0, sizeof *s);
	s->lifo = lifo;
	for (int i = 0; i < n; i++)
		sim_deliver(d, s, seq[i]);
}

/* What differs between two end states, in words; false when nothing. */
static bool sim_differs(const struct lc_def *d, const struct sim *a, const struct sim *b, char *buf, size_t cap)
{
	int ha[LC_MAX_EVENTS] = { 0 }, hb[LC_MAX_EVENTS] = { 0 };

	if (a->state != b->state) {
		snprintf(buf, cap, "state %s vs %s", a->state ? d->states[a->state] : "(none)",
		         b->state ? d->states[b->state] : "(none)");
		return true;
	}
	if (a->version != b->version) {
		snprintf(buf, cap, "version %d vs %d", a->version, b->version);
		return true;
	}
	for (int e = 0; e < d->nevents; e++) {
		if (a->ledger[e] != b->ledger[e]) {
			snprintf(buf, cap, "%d vs %d ledger rows for %s", a->ledger[e], b->ledger[e], d->events[e].type);
			return true;
		}
	}
	for (int e = 0; e < d->nevents; e++) {
		for (int s = 0; s < d->nstates; s++) {
			if (a->fx[e][s] != b->fx[e][s]) {
				snprintf(buf, cap, "statements of %s run %d vs %d times%s%s", d->events[e].type, a->fx[e][s],
				         b->fx[e][s], s ? " compensating after " : " applied", s ? d->states[s] : "");
				return true;
			}
		}
	}
	for (int k = 0; k < d->nemits; k++) {
		if (a->emitted[k] != b->emitted[k]) {
			snprintf(buf, cap, "%d vs %d %s emitted", a->emitted[k], b->emitted[k], d->emits[k]);
			return true;
		}
	}
	for (int i = 0; i < a->nheld; i++)
		ha[a->held[i]]++;
	for (int i = 0; i < b->nheld; i++)
		hb[b->held[i]]++;
	for (int e = 0; e < d->nevents; e++) {
		if (ha[e] != hb[e]) {
			snprintf(buf, cap, "%d vs %d %s still held", ha[e], hb[e], d->events[e].type);
			return true;
		}
	}
	if (a->marks != b->marks) {
		snprintf(buf, cap, "what took effect (marks %#x vs %#x)", (unsigned)a->marks, (unsigned)b->marks);
		return true;
	}
	return false;
}

static void describe(const struct lc_def *d, const int *seq, int n, char *buf, size_t cap)
{
	size_t used = 0;

	buf[0] = '\0';
	for (int i = 0; i < n && used < cap; i++) {
		int w = snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", d->events[seq[i]].type);
		if (w < 0)
			break;
		used += (size_t)w;
	}
}

struct check {
	const struct lc_def *d;
	struct lc_check *out;
	bool failed;
};

/* Every distinct permutation of seq[0..n) (sorted on entry) against the
 * first, each played oldest-first and newest-first. */
static void check_sequence(struct check *k, int *seq, int n)
{
	int first[SIM_MAX];
	struct sim want, got;
	char how[160], a[300], b[300];

	memcpy(first, seq, (size_t)n * sizeof seq[0]);
	sim_run(k->d, first, n, false, &want);
	for (;;) {
		for (int lifo = 0; lifo < 2 && !k->failed; lifo++) {
			sim_run(k->d, seq, n, lifo, &got);
			k->out->runs++;
			if (sim_differs(k->d, &want, &got, how, sizeof how)) {
				describe(k->d, first, n, a, sizeof a);
				describe(k->d, seq, n, b, sizeof b);
				snprintf(k->out->why, sizeof k->out->why, "arrival order [%s] and [%s]%s end differently: %s", a, b,
				         lifo ? " (held events re-evaluated newest first)" : "", how);
				k->failed = true;
			}
		}
		if (k->failed)
			return;
		/* next lexicographic permutation (duplicates give each order once) */
		int i = n - 2;
		while (i >= 0 && seq[i] >= seq[i + 1])
			i--;
		if (i < 0)
			return;
		int j = n - 1;
		while (seq[j] <= seq[i])
			j--;
		int t = seq[i];
		seq[i] = seq[j];
		seq[j] = t;
		for (int l = i + 1, r = n - 1; l < r; l++, r--) {
			t = seq[l];
			seq[l] = seq[r];
			seq[r] = t;
		}
	}
}

/* Two events of the set lead into different terminal states. */
static bool conflicting(const struct lc_def *d, uint32_t set)
{
	uint32_t ends = 0;

	for (int e = 0; e < d->nevents; e++) {
		int to = d->events[e].to;

		if ((set & (1u << e)) && d->events[e].creates == 0 && to > 0 && (d->terminal & (1u << to)))
			ends |= 1u << to;
	}
	return (ends & (ends - 1)) != 0;
}

/* A sequenced definition: the producer's numbers fix each aggregate's
 * order, so loops are allowed and there is no arrival order to prove.
 * What is left to check: every state reachable from a creation by the
 * table, and every event applying in some state (one that applies
 * nowhere would be dead-lettered every time). */
static bool check_sequenced(const struct lc_def *d, struct lc_check *out)
{
	uint32_t seen = 0, applies = 0;
	bool grew = true;

	out->sequenced = true;
	for (int e = 0; e < d->nevents; e++) {
		if (d->events[e].creates > 0) {
			seen |= 1u << d->events[e].creates;
			applies |= 1u << e;
		}
	}
	while (grew) {
		grew = false;
		for (int s = 1; s < d->nstates; s++) {
			if (!(seen & (1u << s)))
				continue;
			for (int e = 0; e < d->nevents; e++) {
				const struct lc_rule *r = &d->rules[s][e];

				if (r->decision != LC_APPLY)
					continue;
				applies |= 1u << e;
				if (!(seen & (1u << r->next))) {
					seen |= 1u << r->next;
					grew = true;
				}
			}
		}
	}
	for (int s = 1; s < d->nstates; s++) {
		if (!(seen & (1u << s))) {
			snprintf(out->why, sizeof out->why, "the state %s cannot be reached: no event leads to it from a "
			         "state the creation leads to", d->states[s]);
			return false;
		}
		out->reachable++;
	}
	for (int e = 0; e < d->nevents; e++) {
		if (!(applies & (1u << e))) {
			snprintf(out->why, sizeof out->why, "%s applies in no reachable state: it would be dead-lettered "
			         "every time", d->events[e].type);
			return false;
		}
	}
	return true;
}

bool lc_check_order_independence(const struct lc_def *d, struct lc_check *out)
{
	struct check k = { d, out, false };
	int n = d->nevents;

	memset(out, 0, sizeof *out);
	if (lc_sequenced(d))
		return check_sequenced(d, out);
	/* A statement that does not commute with another run of itself ends
	 * on whichever message came last, between aggregates as much as
	 * within one: no arrival order of one aggregate's events proves it. */
	for (int i = 0; i < d->nstmts; i++) {
		const struct lc_stmt *st = &d->stmts[i];

		if (!st->fx.commutes) {
			snprintf(out->why, sizeof out->why, "statement %d of %s (line %d) does not commute: %s; two arrival "
			         "orders can end differently, so the check cannot prove this definition",
			         st->index, d->events[st->event].type, st->line, st->fx.why);
			return false;
		}
	}
	if (n > LC_CHECK_MAX_EVENTS) {
		snprintf(out->why, sizeof out->why, "%d event types: the exhaustive check covers at most %d", n,
		         LC_CHECK_MAX_EVENTS);
		return false;
	}
	/* Each non-empty set of event types, alone and with one type twice
	 * (two messages of one type, as a retried publish with a new id). */
	for (uint32_t set = 1; set < (1u << n) && !k.failed; set++) {
		int seq[SIM_MAX], m = 0;

		if (conflicting(d, set)) {
			out->conflicts++;
			continue;
		}
		out->sets++;
		for (int e = 0; e < n; e++) {
			if (set & (1u << e))
				seq[m++] = e;
		}
		check_sequence(&k, seq, m);
		for (int dup = 0; dup < n && !k.failed; dup++) {
			int s2[SIM_MAX], m2 = 0;

			if (!(set & (1u << dup)))
				continue;
			for (int e = 0; e < n; e++) {
				if (set & (1u << e))
					s2[m2++] = e;
				if (e == dup)
					s2[m2++] = e;
			}
			check_sequence(&k, s2, m2);
		}
	}
	return !k.failed;
}
