/*
 * lifecycle_emit.c - emitted types split into kinds by cause, and their
 * stable ids (see lifecycle_emit.h for the rule and why).
 */
#include "lifecycle_emit.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Kind of old type x caused by event e in the new numbering. */
struct split {
	int kind[LC_MAX_EMITS][LC_MAX_EVENTS];
	char names[LC_MAX_EMITS][LC_NAME_MAX + 1];
	int cause[LC_MAX_EMITS];
	int n;
};

static uint32_t remap(const struct split *sp, uint32_t bits, int cause)
{
	uint32_t out = 0;

	for (int x = 0; x < LC_MAX_EMITS; x++) {
		if (bits & (1u << x))
			out |= 1u << sp->kind[x][cause];
	}
	return out;
}

/* The one pair of sites that both fire: X when P takes effect, and X
 * again when a terminal event compensates P. */
static int collision(const struct lc_def *d, char *why, size_t cap, int *line)
{
	for (int f = 0; f < d->nevents; f++) {
		const struct lc_event *ev = &d->events[f];

		for (int k = 0; k < ev->ncomp; k++) {
			int p = ev->comp[k].mark, x = ev->comp[k].emit;

			if (!(d->events[p].emits & (1u << x)))
				continue;
			snprintf(why, cap,
			         "\"%s\" is emitted when %s takes effect and again when %s compensates it: one "
			         "aggregate would emit two events under one id (%s:<%s>); emit another type for one of them",
			         d->emits[x], d->events[p].type, ev->type, d->emits[x], d->key);
			*line = ev->line;
			return -1;
		}
	}
	return 0;
}

int lc_emit_split(struct lc_def *d, char *why, size_t cap, int *line)
{
	struct split sp;
	uint32_t causes[LC_MAX_EMITS] = { 0 };

	*line = 0;
	if (collision(d, why, cap, line) != 0)
		return -1;
	for (int e = 0; e < d->nevents; e++) {
		const struct lc_event *ev = &d->events[e];

		for (int x = 0; x < d->nemits; x++) {
			if (ev->emits & (1u << x))
				causes[x] |= 1u << e;
		}
		for (int k = 0; k < ev->ncomp; k++)
			causes[ev->comp[k].emit] |= 1u << ev->comp[k].mark;
		for (int s = 0; s < d->nstates; s++) {
			for (int x = 0; x < d->nemits; x++) {
				if (ev->after[s] == LC_AFTER_COMPENSATE && (ev->after_emits[s] & (1u << x)))
					causes[x] |= 1u << e;
			}
		}
	}
	memset(&sp, 0, sizeof sp);
	/* In the file's order of types, and of causes within a type, so that a
	 * definition whose types have one cause each keeps its numbering. */
	for (int x = 0; x < d->nemits; x++) {
		bool several = (causes[x] & (causes[x] - 1)) != 0;

		for (int e = 0; e < d->nevents; e++) {
			if (several && !(causes[x] & (1u << e)))
				continue;
			if (several || e == 0) {
				if (sp.n >= LC_MAX_EMITS) {
					snprintf(why, cap,
					         "more than %d emitted events once each type is counted once per cause: emit fewer",
					         LC_MAX_EMITS);
					return -1;
				}
				memcpy(sp.names[sp.n], d->emits[x], sizeof sp.names[0]);
				sp.cause[sp.n] = several ? e : -1;
				sp.n++;
			}
			sp.kind[x][e] = sp.n - 1;
		}
	}
	for (int e = 0; e < d->nevents; e++) {
		struct lc_event *ev = &d->events[e];

		ev->emits = remap(&sp, ev->emits, e);
		for (int k = 0; k < ev->ncomp; k++)
			ev->comp[k].emit = sp.kind[ev->comp[k].emit][ev->comp[k].mark];
		for (int s = 0; s < d->nstates; s++)
			ev->after_emits[s] = remap(&sp, ev->after_emits[s], e);
	}
	memcpy(d->emits, sp.names, sizeof d->emits);
	memcpy(d->emit_cause, sp.cause, sizeof d->emit_cause);
	d->nemits = sp.n;
	return 0;
}

static int fits(int w, size_t cap)
{
	return w < 0 || (size_t)w >= cap ? -1 : w;
}

int lc_emit_id(const struct lc_def *d, int k, const char *key, char *buf, size_t cap)
{
	if (k < 0 || k >= d->nemits || cap == 0)
		return -1;
	if (d->emit_cause[k] < 0)
		return fits(snprintf(buf, cap, "%s:%s", d->emits[k], key), cap);
	return fits(snprintf(buf, cap, "%s:%s:%s", d->emits[k], key, d->events[d->emit_cause[k]].type), cap);
}

int lc_emit_label(const struct lc_def *d, int k, char *buf, size_t cap)
{
	if (k < 0 || k >= d->nemits || cap == 0)
		return -1;
	if (d->emit_cause[k] < 0)
		return fits(snprintf(buf, cap, "%s", d->emits[k]), cap);
	return fits(snprintf(buf, cap, "%s:%s", d->emits[k], d->events[d->emit_cause[k]].type), cap);
}

int lc_emit_find_label(const struct lc_def *d, const char *label)
{
	char own[2 * LC_NAME_MAX + 2];

	for (int k = 0; k < d->nemits; k++) {
		if (lc_emit_label(d, k, own, sizeof own) >= 0 && strcmp(own, label) == 0)
			return k;
	}
	return -1;
}
