/*
 * snapshot.c - the baseline of a definition's additions, read by publish
 * and written into the ledger (snapshot.h).
 *
 * Keys are collected as text (an integer printed in decimal) and sorted,
 * each once: the same text verify builds from the ledger's order lines,
 * so the two sides meet on one spelling of each key.
 */
#include "snapshot.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "array.h"
#include "log.h"
#include "status.h"

int lg_fx_param_field(const struct lg_plan *p, const struct lc_stmt *st, int param)
{
	const struct lc_event *ev = &p->def->events[st->event];
	const struct lc_fx_param *pa;
	const struct lc_set *set;

	if (param < 0 || param >= st->fx.nparams)
		return -1;
	pa = &st->fx.params[param];
	if (pa->src != LC_FX_SET || pa->set < 0 || pa->set >= ev->nsets)
		return -1;
	set = &ev->sets[pa->set];
	if (set->src != LC_SRC_DATA || (set->type != LC_TYPE_INTEGER && set->type != LC_TYPE_STRING))
		return -1;
	for (int f = 0; f < p->nfields; f++) {
		/* the scenario gives each field one value per aggregate, whichever
		 * event declares it, so the name is the field */
		if (strcmp(p->fields[f].set->field, set->field) == 0)
			return p->fields[f].set->type == set->type ? f : -1;
	}
	return -1;
}

bool lg_fx_snapshotted(const struct lg_plan *p, const struct lc_stmt *st, int *field)
{
	if (st->fx.shape != LC_FX_SHAPE_ADD || st->fx.ncols < 1 || st->fx.cols[0].v.kind != LC_FX_VAL_PARAM)
		return false;
	*field = lg_fx_param_field(p, st, st->fx.cols[0].v.param);
	return *field >= 0;
}

static bool name_ok(const char *name)
{
	return name[0] != '\0' && strchr(name, '`') == NULL;
}

int lg_fx_sum_sql(const struct lc_fx *fx, char *buf, size_t cap)
{
	size_t used;
	int n;

	if (fx->shape != LC_FX_SHAPE_ADD || !name_ok(fx->table) || !name_ok(fx->add_column))
		return -1;
	n = snprintf(buf, cap, "SELECT COUNT(*), CAST(COALESCE(SUM(`%s`), 0) AS CHAR) FROM `%s` WHERE", fx->add_column,
	             fx->table);
	if (n < 0 || (size_t)n >= cap)
		return -1;
	used = (size_t)n;
	for (int c = 0; c < fx->ncols; c++) {
		if (!name_ok(fx->cols[c].name))
			return -1;
		n = snprintf(buf + used, cap - used, "%s `%s` = ?", c ? " AND" : "", fx->cols[c].name);
		if (n < 0 || (size_t)n >= cap - used)
			return -1;
		used += (size_t)n;
	}
	return 0;
}

int lg_fx_sum_read(struct db_stmt *q, const struct lc_fx *fx, const char *key, bool key_int, int64_t *rows,
                   char *sum, size_t cap)
{
	struct db_param p[LC_FX_COLS];
	struct db_col c[] = { DBC_I64(), DBC_STR(sum, cap) };
	int r;

	if (key_int) {
		char *end;
		long long v;

		errno = 0;
		v = strtoll(key, &end, 10);
		if (errno != 0 || end == key || *end != '\0')
			return ST_ERR_INVALID;
		p[0] = DBP_I64(v);
	} else {
		p[0] = DBP_STR(key);
	}
	for (int k = 1; k < fx->ncols; k++)
		p[k] = DBP_STR(fx->cols[k].v.text); /* a number as text: the server compares it as one */
	sum[0] = '\0';
	r = db_stmt_query_row(q, p, fx->ncols, c, ARRAY_LEN(c));
	if (r < 0)
		return r;
	*rows = r == 1 ? c[0].i64 : 0;
	if (r == 0 || c[1].is_null)
		snprintf(sum, cap, "0");
	return ST_OK;
}

static int key_cmp(const void *a, const void *b)
{
	return strcmp(((const struct lg_snap_key *)a)->key, ((const struct lg_snap_key *)b)->key);
}

/* The distinct values field f takes over s's aggregates, sorted. */
static int collect_keys(const struct lg_scenario *s, int f, struct lg_snap_stmt *out)
{
	const struct lc_set *set = s->plan.fields[f].set;
	size_t n = 0;

	out->keys = calloc(s->norders > 0 ? s->norders : 1, sizeof *out->keys);
	if (out->keys == NULL)
		return -1;
	out->key_int = set->type == LC_TYPE_INTEGER;
	for (size_t i = 0; i < s->norders; i++) {
		if (lg_scenario_field_text(s, (int32_t)i, f, out->keys[n].key, sizeof out->keys[n].key) == 0)
			n++;
	}
	qsort(out->keys, n, sizeof *out->keys, key_cmp);
	out->nkeys = 0;
	for (size_t i = 0; i < n; i++) {
		if (out->nkeys == 0 || strcmp(out->keys[out->nkeys - 1].key, out->keys[i].key) != 0)
			out->keys[out->nkeys++] = out->keys[i];
	}
	return 0;
}

int lg_snapshot_take(const struct cfg *conf, const struct lg_scenario *s, struct lg_snapshot *out)
{
	const struct lc_def *def = s->plan.def;
	struct db *d = NULL;
	char why[256] = "";
	int rc = ST_OK, ret = -1;

	memset(out, 0, sizeof *out);
	for (int k = 0; k < def->nstmts; k++) {
		const struct lc_stmt *st = &def->stmts[k];
		struct lg_snap_stmt *ss = &out->stmts[out->n];
		char sql[LC_FX_COLS * 80 + 256];
		struct db_stmt *q = NULL;
		int f;

		if (!lg_fx_snapshotted(&s->plan, st, &f) || lg_fx_sum_sql(&st->fx, sql, sizeof sql) != 0)
			continue;
		if (d == NULL) {
			rc = db_open_why(&d, &conf->db, why, sizeof why);
			if (st_refusal(rc)) {
				log_refused(rc, "db", conf->db.user, conf->db.redacted, why);
				goto cleanup;
			}
			if (rc != ST_OK) {
				fprintf(stderr, "inbox-loadgen: the snapshot of the statements' sums: %s\n", why);
				goto cleanup;
			}
		}
		ss->stmt = k;
		out->n++;
		if (collect_keys(s, f, ss) != 0) {
			fprintf(stderr, "inbox-loadgen: out of memory for the snapshot\n");
			goto cleanup;
		}
		rc = db_prepare(d, &q, sql);
		for (size_t i = 0; rc == ST_OK && i < ss->nkeys; i++)
			rc = lg_fx_sum_read(q, &st->fx, ss->keys[i].key, ss->key_int, &ss->keys[i].rows, ss->keys[i].sum,
			                    sizeof ss->keys[i].sum);
		db_rollback(d);
		if (rc != ST_OK) {
			fprintf(stderr, "inbox-loadgen: the snapshot of %s.%s (statement %d of %s): %s\n", st->fx.table,
			        st->fx.add_column, st->index, def->events[st->event].type, db_errmsg(d));
			goto cleanup;
		}
	}
	ret = 0;
cleanup:
	db_close(&d);
	if (ret != 0)
		lg_snapshot_free(out);
	return ret;
}

/* One JSON object as a ledger line; takes o. */
static int put_line(json_t *o, FILE *f)
{
	char *text = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
	int rc = text != NULL && fprintf(f, "%s\n", text) >= 0 ? 0 : -1;

	if (text == NULL)
		errno = ENOMEM;
	free(text);
	json_decref(o);
	return rc;
}

int lg_snapshot_write(const struct lg_snapshot *snap, const struct lc_def *def, FILE *f)
{
	for (int i = 0; i < snap->n; i++) {
		const struct lg_snap_stmt *ss = &snap->stmts[i];
		const struct lc_stmt *st = &def->stmts[ss->stmt];

		if (put_line(json_pack("{s:s, s:i, s:s, s:s, s:i, s:s, s:s, s:s}", "k", "stmt", "stmt", ss->stmt, "event",
		                       def->events[st->event].type, "after", def->states[st->after], "index", st->index,
		                       "table", st->fx.table, "column", st->fx.add_column, "key", st->fx.cols[0].name),
		             f) != 0)
			return -1;
		for (size_t k = 0; k < ss->nkeys; k++) {
			const struct lg_snap_key *key = &ss->keys[k];

			/* the key as text: verify compares it with the text it makes
			 * of the ledger's order lines */
			if (put_line(json_pack("{s:s, s:i, s:s, s:I, s:s}", "k", "sum", "stmt", ss->stmt, "key", key->key,
			                       "rows", (json_int_t)key->rows, "sum", key->sum),
			             f) != 0)
				return -1;
		}
	}
	return fflush(f) == 0 && !ferror(f) ? 0 : -1;
}

void lg_snapshot_free(struct lg_snapshot *snap)
{
	for (int i = 0; i < snap->n; i++) {
		free(snap->stmts[i].keys);
		snap->stmts[i].keys = NULL;
		snap->stmts[i].nkeys = 0;
	}
	snap->n = 0;
}
