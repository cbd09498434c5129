/*
 * lifecycle.c - what a compiled lifecycle table decides (lc_decide), its
 * names found, and the table as text (lc_print_table).  lifecycle_load.c
 * reads the definition and compiles the table; lifecycle_check.c proves it
 * arrival-order independent.
 *
 * Compensation is once per event type: an event that can be compensated is
 * remembered (a mark) when it takes effect, and a second one is stale.  A
 * transition into a terminal state emits its compensations from the marks,
 * so a cancellation owes exactly what took effect before it.
 */
#include "lifecycle.h"
#include "lifecycle_emit.h"
#include "lifecycle_int.h"

#include <string.h>

/* ---- deciding ------------------------------------------------------------- */

struct lc_verdict lc_decide(const struct lc_def *def, int state, uint32_t marks, int ev)
{
	struct lc_verdict v = { LC_INVALID, state, marks, 0 };
	const struct lc_event *e;
	const struct lc_rule *r;
	uint32_t bit;

	if (state < 0 || state >= def->nstates || ev < 0 || ev >= def->nevents)
		return v;
	e = &def->events[ev];
	r = &def->rules[state][ev];
	bit = e->mark >= 0 ? 1u << e->mark : 0;
	v.decision = r->decision;
	switch (r->decision) {
	case LC_APPLY:
		v.next = r->next;
		v.marks = marks | bit;
		v.emits = e->emits;
		for (int k = 0; k < e->ncomp; k++) {
			if (marks & (1u << e->comp[k].mark))
				v.emits |= 1u << e->comp[k].emit;
		}
		break;
	case LC_COMPENSATE:
		/* Once per event type: the second one is stale. */
		if (marks & bit) {
			v.decision = LC_IGNORE;
			break;
		}
		v.marks = marks | bit;
		v.emits = r->emits;
		break;
	case LC_HOLD:
	case LC_IGNORE:
	case LC_INVALID:
		break;
	}
	return v;
}

static bool name_is(const char *have, const char *name, size_t len)
{
	return strlen(have) == len && memcmp(have, name, len) == 0;
}

int lc_event_findn(const struct lc_def *def, const char *name, size_t len)
{
	for (int e = 0; e < def->nevents; e++) {
		if (name_is(def->events[e].type, name, len))
			return e;
		for (int a = 0; a < def->events[e].naliases; a++) {
			if (name_is(def->events[e].aliases[a], name, len))
				return e;
		}
	}
	return -1;
}

int lc_event_find(const struct lc_def *def, const char *name)
{
	return lc_event_findn(def, name, strlen(name));
}

int lc_event_stmts(const struct lc_def *def, int ev, int state, enum lc_decision decision, int *first)
{
	const struct lc_event *e;

	*first = 0;
	if (ev < 0 || ev >= def->nevents)
		return 0;
	e = &def->events[ev];
	if (decision == LC_APPLY) {
		*first = e->fx_first;
		return e->nfx;
	}
	if (decision == LC_COMPENSATE && state > 0 && state < def->nstates) {
		*first = e->cfx_first[state];
		return e->cfx_n[state];
	}
	return 0;
}

int lc_state_find(const struct lc_def *def, const char *name)
{
	return name[0] == '\0' ? -1 : lc_state_index(def, name);
}

const char *lc_decision_outcome(enum lc_decision d)
{
	switch (d) {
	case LC_APPLY:
		return "applied";
	case LC_HOLD:
		return "held";
	case LC_IGNORE:
		return "ignored";
	case LC_COMPENSATE:
		return "compensated";
	case LC_INVALID:
		return "dead_lettered";
	}
	return "";
}

/* ---- the table as text ---------------------------------------------------- */

void lc_cell_text(const struct lc_def *d, int s, int e, char *buf, size_t cap)
{
	const struct lc_rule *r = &d->rules[s][e];
	const struct lc_event *ev = &d->events[e];
	size_t used = 0;
	uint32_t emits = 0;
	int w;

	switch (r->decision) {
	case LC_APPLY:
		w = snprintf(buf, cap, "-> %s", d->states[r->next]);
		emits = ev->emits;
		break;
	case LC_HOLD:
		w = snprintf(buf, cap, "hold");
		break;
	case LC_IGNORE:
		w = snprintf(buf, cap, "ignore");
		break;
	case LC_COMPENSATE:
		w = snprintf(buf, cap, "compensate");
		emits = r->emits;
		break;
	default:
		w = snprintf(buf, cap, "invalid");
		break;
	}
	if (w < 0)
		return;
	used = (size_t)w;
	for (int k = 0; k < d->nemits && used < cap; k++) {
		if (emits & (1u << k)) {
			w = snprintf(buf + used, cap - used, " +%s", d->emits[k]);
			if (w > 0)
				used += (size_t)w;
		}
	}
	if (r->decision == LC_APPLY) {
		for (int k = 0; k < ev->ncomp && used < cap; k++) {
			w = snprintf(buf + used, cap - used, " +%s if %s took effect", d->emits[ev->comp[k].emit],
			             d->events[d->marks[ev->comp[k].mark]].type);
			if (w > 0)
				used += (size_t)w;
		}
	}
}

const char *lc_seq_source(const struct lc_def *d, char *buf, size_t cap)
{
	if (d->seq_header)
		snprintf(buf, cap, "header %s", d->seq_field);
	else if (d->seq_attr)
		snprintf(buf, cap, "the sequence attribute");
	else
		snprintf(buf, cap, "data.%s", d->seq_field);
	return buf;
}

void lc_print_table(const struct lc_def *d, FILE *f)
{
	char cell[512];

	fprintf(f, "aggregate %s: table %s, key %s, version %s (%s)\n", d->aggregate, d->table, d->key, d->version,
	        d->version_declared ? "declared" : "its content's hash: none declared");
	for (int s = 0; s < d->nstates; s++) {
		fprintf(f, "\nin %s%s:\n", s == 0 ? "(no aggregate yet)" : d->states[s],
		        (d->terminal & (1u << s)) ? " (terminal)" : "");
		for (int e = 0; e < d->nevents; e++) {
			lc_cell_text(d, s, e, cell, sizeof cell);
			fprintf(f, "  %-24s %s\n", d->events[e].type, cell);
		}
	}
	fprintf(f, "\nonce per aggregate (a second one is ignored once compensated):");
	for (int m = 0; m < d->nmarks; m++)
		fprintf(f, " %s", d->events[d->marks[m]].type);
	fprintf(f, "%s\n", d->nmarks == 0 ? " none" : "");
	/* What a consumer downstream deduplicates by. */
	fprintf(f, "\nemitted, each under its own message-id:");
	for (int k = 0; k < d->nemits; k++) {
		char key[LC_NAME_MAX + 3], id[3 * LC_NAME_MAX + 8];

		snprintf(key, sizeof key, "<%s>", d->key);
		if (lc_emit_id(d, k, key, id, sizeof id) >= 0)
			fprintf(f, " %s%s", id, lc_sequenced(d) ? ":<number>" : "");
	}
	fprintf(f, "%s\n", d->nemits == 0 ? " none" : "");
}
