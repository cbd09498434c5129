/*
 * verify_ledger.c - reads the ledger publish wrote (JSON lines: one "run"
 * line, then "order" and "msg" lines) into the id maps verify matches
 * everything else by.  See verify_ledger.h.
 */
#include "verify_ledger.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lifecycle_emit.h"
#include "verify_effects.h"

static uint64_t v_hash(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ULL;

	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 1099511628211ULL;
	}
	return h;
}

static int v_map_init(struct v_map *m, size_t n)
{
	m->cap = 16;
	while (m->cap < n * 2 + 16)
		m->cap *= 2;
	m->slot = calloc(m->cap, sizeof *m->slot);
	return m->slot != NULL ? 0 : -1;
}

long v_map_find(struct v_map *m, const char *key, size_t len, const char *(*name)(const void *, uint32_t),
                const void *arr, long insert)
{
	size_t i = (size_t)v_hash(key, len) & (m->cap - 1);

	while (m->slot[i] != 0) {
		const char *n = name(arr, m->slot[i] - 1);
		if (strlen(n) == len && memcmp(n, key, len) == 0)
			return (long)m->slot[i] - 1;
		i = (i + 1) & (m->cap - 1);
	}
	if (insert >= 0)
		m->slot[i] = (uint32_t)insert + 1;
	return -1;
}

const char *v_order_name(const void *arr, uint32_t i)
{
	return ((const struct v_order *)arr)[i].id;
}

const char *v_msg_name(const void *arr, uint32_t i)
{
	return ((const struct v_msg *)arr)[i].id;
}

void v_add(struct v_list *l, const char *fmt, ...)
{
	if (l->count < l->max) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(l->lines[l->count], sizeof l->lines[0], fmt, ap);
		va_end(ap);
	}
	l->count++;
}

uint32_t v_emit_bit(const struct v_state *st, const char *label)
{
	int k = label != NULL ? lc_emit_find_label(st->def, label) : -1;

	return k < 0 ? 0 : 1u << k;
}

void v_copy(char *dst, size_t cap, json_t *v)
{
	snprintf(dst, cap, "%s", json_is_string(v) ? json_string_value(v) : "");
}

/* The lifecycle the run line names (none: the order's) against the one
 * verify was given: a ledger of shipments read as orders would report
 * every shipment missing.  0, or -1 with a message on stderr. */
static int v_check_lifecycle(const struct v_state *st, json_t *run, const char *path)
{
	json_t *lc = json_object_get(run, "lifecycle");
	const char *agg = json_string_value(json_object_get(lc, "aggregate"));
	const char *table = json_string_value(json_object_get(lc, "table"));
	const char *key = json_string_value(json_object_get(lc, "key"));
	const struct lc_def *d = st->def;

	if (lc == NULL) {
		if (strcmp(d->aggregate, "order") == 0 && strcmp(d->table, "orders") == 0 && strcmp(d->key, "order_id") == 0)
			return 0;
		fprintf(stderr, "inbox-loadgen: %s was published for the order lifecycle, not %s: verify it without"
		        " --lifecycle (and without INBOX_LIFECYCLE)\n", path, d->aggregate);
		return -1;
	}
	if (agg == NULL || table == NULL || key == NULL || strcmp(agg, d->aggregate) != 0 || strcmp(table, d->table) != 0 ||
	    strcmp(key, d->key) != 0) {
		const char *file = json_string_value(json_object_get(lc, "file"));
		fprintf(stderr, "inbox-loadgen: %s was published for the %s lifecycle (table %s, key %s), not %s (table %s,"
		        " key %s): verify it with --lifecycle %s\n", path, agg ? agg : "?", table ? table : "?",
		        key ? key : "?", d->aggregate, d->table, d->key, file ? file : "FILE");
		return -1;
	}
	return 0;
}

/* The run line: the prefix, and room for the orders and messages it
 * announces (*ocap, *mcap).  -1 when out of memory. */
static int v_load_run(struct v_state *st, json_t *o, size_t *ocap, size_t *mcap)
{
	st->run = json_incref(o);
	v_copy(st->prefix, sizeof st->prefix, json_object_get(o, "prefix"));
	*ocap = (size_t)json_integer_value(json_object_get(o, "orders")) + 1;
	*mcap = (size_t)json_integer_value(json_object_get(o, "messages")) + 1;
	st->orders = calloc(*ocap, sizeof *st->orders);
	st->msgs = calloc(*mcap, sizeof *st->msgs);
	if (st->orders == NULL || st->msgs == NULL || v_map_init(&st->omap, *ocap) != 0 ||
	    v_map_init(&st->mmap, *mcap) != 0 || v_fx_open(st, *ocap, *mcap) != 0)
		return -1;
	return 0;
}

static void v_load_order(struct v_state *st, json_t *o)
{
	struct v_order *od = &st->orders[st->norders];
	json_t *e;
	size_t i;

	v_copy(od->id, sizeof od->id, json_object_get(o, "id"));
	v_copy(od->status, sizeof od->status, json_object_get(o, "status"));
	od->version = (unsigned)json_integer_value(json_object_get(o, "version"));
	json_array_foreach(json_object_get(o, "emits"), i, e) {
		if (json_is_string(e))
			od->emits |= v_emit_bit(st, json_string_value(e));
	}
	json_array_foreach(json_object_get(o, "emitted"), i, e) {
		uint32_t bit = v_emit_bit(st, json_string_value(json_array_get(e, 0)));

		if (bit != 0 && od->ninst < LG_INST_MAX) {
			od->inst_kind[od->ninst] = (uint8_t)__builtin_ctz(bit);
			od->inst_num[od->ninst++] = (uint8_t)json_integer_value(json_array_get(e, 1));
		}
	}
	e = json_object_get(o, "route");
	od->route = json_is_integer(e) ? (int)json_integer_value(e) : -1;
	v_fx_order(st, st->norders, json_object_get(o, "data"));
	v_map_find(&st->omap, od->id, strlen(od->id), v_order_name, st->orders, (long)st->norders);
	st->norders++;
}

static void v_load_msg(struct v_state *st, json_t *o)
{
	struct v_msg *m = &st->msgs[st->nmsgs];
	const char *ex = json_string_value(json_object_get(o, "expect"));
	long oi;

	v_copy(m->id, sizeof m->id, json_object_get(o, "id"));
	v_copy(m->order, sizeof m->order, json_object_get(o, "order"));
	v_copy(m->reason, sizeof m->reason, json_object_get(o, "reason"));
	v_copy(m->sha, sizeof m->sha, json_object_get(o, "sha256"));
	m->effect = ex != NULL && strcmp(ex, "effect") == 0;
	m->conflicts = (int)json_integer_value(json_object_get(o, "conflicts"));
	m->copies = (int)json_integer_value(json_object_get(o, "copies"));
	oi = m->order[0] != '\0' ? v_map_find(&st->omap, m->order, strlen(m->order), v_order_name, st->orders, -1) : -1;
	if (oi >= 0) {
		struct v_order *od = &st->orders[oi];

		if (od->nmsg == 0)
			od->first_msg = (uint32_t)st->nmsgs;
		else if (od->first_msg + od->nmsg != st->nmsgs)
			od->apart = true;
		od->nmsg++;
	}
	v_map_find(&st->mmap, m->id, strlen(m->id), v_msg_name, st->msgs, (long)st->nmsgs);
	st->nmsgs++;
}

int v_load(struct v_state *st, const char *path)
{
	FILE *f = fopen(path, "r");
	char *line = NULL;
	size_t lcap = 0, ocap = 0, mcap = 0;
	ssize_t n;
	long lineno = 0;
	int rc = -1;

	if (f == NULL) {
		fprintf(stderr, "inbox-loadgen: cannot read %s: %s\n", path, strerror(errno));
		return -1;
	}
	while ((n = getline(&line, &lcap, f)) > 0) {
		json_error_t jerr;
		json_t *o = json_loadb(line, (size_t)n, 0, &jerr);
		const char *k;
		bool bad = false;

		lineno++;
		if (o == NULL || !json_is_object(o)) {
			fprintf(stderr, "inbox-loadgen: %s:%ld: not a ledger line: %s\n", path, lineno, jerr.text);
			json_decref(o);
			goto out;
		}
		k = json_string_value(json_object_get(o, "k"));
		if (k == NULL) {
			/* not a line of ours: skipped */
		} else if (strcmp(k, "run") == 0) {
			bad = v_check_lifecycle(st, o, path) != 0 || v_load_run(st, o, &ocap, &mcap) != 0;
		} else if (st->run == NULL) {
			fprintf(stderr, "inbox-loadgen: %s: the first line must be the run line\n", path);
			bad = true;
		} else if (strcmp(k, "order") == 0 && st->norders < ocap) {
			v_load_order(st, o);
		} else if (strcmp(k, "msg") == 0 && st->nmsgs < mcap) {
			v_load_msg(st, o);
		} else if (strcmp(k, "stmt") == 0 || strcmp(k, "sum") == 0) {
			bad = v_fx_line(st, k, o, path, lineno) != 0;
		}
		json_decref(o);
		if (bad)
			goto out;
	}
	if (st->run == NULL) {
		fprintf(stderr, "inbox-loadgen: %s holds no run line\n", path);
		goto out;
	}
	snprintf(st->like, sizeof st->like, "%s-%%", st->prefix);
	rc = 0;
out:
	free(line);
	fclose(f);
	return rc;
}

bool v_ours(const struct v_state *st, const char *id, size_t len)
{
	size_t pl = strlen(st->prefix);
	return len > pl && memcmp(id, st->prefix, pl) == 0 && id[pl] == '-';
}

void v_state_free(struct v_state *st)
{
	db_close(&st->db);
	json_decref(st->run);
	free(st->orders);
	free(st->msgs);
	free(st->omap.slot);
	free(st->mmap.slot);
	free(st->lat);
	free(st->probe_dead);
	free(st->probe_conflicts);
	v_fx_free(&st->fx);
}
