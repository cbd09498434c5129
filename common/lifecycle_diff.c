/*
 * lifecycle_diff.c - two definitions compared for the rows of the first;
 * see lifecycle_diff.h.
 */
#include "lifecycle_diff.h"
#include "lifecycle_int.h"

#include <stdlib.h>
#include <string.h>

static int event_index(const struct lc_def *d, const char *type)
{
	for (int e = 0; e < d->nevents; e++) {
		if (strcmp(d->events[e].type, type) == 0)
			return e;
	}
	return -1;
}

static const char *numbering(const struct lc_def *d, char *buf, size_t cap)
{
	if (!lc_sequenced(d))
		return "the states";
	char where[LC_NAME_MAX + 32];

	snprintf(buf, cap, "the producer (%s)", lc_seq_source(d, where, sizeof where));
	return buf;
}

/* What changes for the rows, one line each, after the versions' line. */
static int diff_rows(const struct lc_def *a, const struct lc_def *b, FILE *f)
{
	char ca[512], cb[512], na[LC_NAME_MAX + 48], nb[LC_NAME_MAX + 48];
	int n = 0;

	if (strcmp(a->aggregate, b->aggregate) != 0 || strcmp(a->table, b->table) != 0 || strcmp(a->key, b->key) != 0) {
		fprintf(f, "aggregate %s (table %s, key %s) -> %s (table %s, key %s): the old rows stay in %s, where the "
		           "new definition does not look\n", a->aggregate, a->table, a->key, b->aggregate, b->table, b->key,
		        a->table);
		n++;
	}
	{
		const char *oa = numbering(a, na, sizeof na), *ob = numbering(b, nb, sizeof nb);

		if (strcmp(oa, ob) != 0) {
			fprintf(f, "ordered by %s -> %s\n", oa, ob);
			n++;
		}
	}
	for (int s = 1; s < a->nstates; s++) {
		if (lc_state_index(b, a->states[s]) < 0) {
			fprintf(f, "state %s removed: rows in it could not be decided by the new definition\n", a->states[s]);
			n++;
		}
	}
	for (int s = 1; s < b->nstates; s++) {
		if (lc_state_index(a, b->states[s]) < 0) {
			fprintf(f, "state %s added\n", b->states[s]);
			n++;
		}
	}
	for (int s = 1; s < a->nstates; s++) {
		int t = lc_state_index(b, a->states[s]);

		if (t > 0 && ((a->terminal >> s) & 1u) != ((b->terminal >> t) & 1u)) {
			fprintf(f, "state %s: %s\n", a->states[s],
			        (b->terminal >> t) & 1u ? "now terminal" : "no longer terminal");
			n++;
		}
	}
	for (int e = 0; e < a->nevents; e++) {
		if (event_index(b, a->events[e].type) < 0) {
			fprintf(f, "event %s removed: events of it held could not be released\n", a->events[e].type);
			n++;
		}
	}
	for (int e = 0; e < b->nevents; e++) {
		if (event_index(a, b->events[e].type) < 0) {
			fprintf(f, "event %s added\n", b->events[e].type);
			n++;
		}
	}
	/* Every cell both have, by name; state 0 is "no aggregate yet" in both. */
	for (int s = 0; s < a->nstates; s++) {
		int t = s == 0 ? 0 : lc_state_index(b, a->states[s]);

		if (t < 0)
			continue;
		for (int e = 0; e < a->nevents; e++) {
			int g = event_index(b, a->events[e].type);

			if (g < 0)
				continue;
			lc_cell_text(a, s, e, ca, sizeof ca);
			lc_cell_text(b, t, g, cb, sizeof cb);
			if (strcmp(ca, cb) != 0) {
				fprintf(f, "in %s, %s: %s -> %s\n", s == 0 ? "(no aggregate yet)" : a->states[s],
				        a->events[e].type, ca, cb);
				n++;
			}
		}
	}
	return n;
}

int lc_diff(const struct lc_def *a, const struct lc_def *b, FILE *f)
{
	char *body = NULL;
	size_t len = 0;
	FILE *mem = open_memstream(&body, &len);
	int n;

	if (mem == NULL)
		return -1;
	n = diff_rows(a, b, mem);
	if (fclose(mem) != 0 || body == NULL) {
		free(body);
		return -1;
	}
	/* The versions first, and whether keeping one was right: a version
	 * kept over an edit leaves the worker unable to tell the rows the old
	 * definition decided from those the new one decides. */
	if (n > 0 && strcmp(a->version, b->version) == 0) {
		fprintf(f, "version %s -> %s: the definition changed and kept its version: declare a new one, or rows "
		           "decided by the new one cannot be told from the old one's\n", a->version, b->version);
		n++;
	} else {
		fprintf(f, "version %s -> %s\n", a->version, b->version);
	}
	fwrite(body, 1, len, f);
	free(body);
	return n;
}
