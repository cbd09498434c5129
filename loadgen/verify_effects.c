/*
 * verify_effects.c - the rows a definition's own statements wrote, held
 * against the ledger (verify_effects.h).
 *
 * Expectations come from the route each order line names, folded as the
 * plan folded it (plan.h: the decision each message ends in and the state
 * it was reached in, the same in every arrival order), so verify never
 * needs the messages' bodies: the values the statements were given are
 * the aggregate's data, which the order line carries.  Rows are read per
 * statement with one query over the run's message ids (the run prefix
 * selects ours), the sums per key with the very query publish took the
 * baseline with (lg_fx_sum_sql).
 */
#include "verify_effects.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "array.h"
#include "snapshot.h"
#include "status.h"

#define V_FX_VALUE_MAX LC_FX_LITERAL_MAX
#define V_FX_WHY_MAX 200
/* A column of a row as read: the query cuts each at V_FX_CUT characters
 * (a fetch that does not fit fails, db.h), 4 bytes each in utf8mb4; what
 * is compared (an id, a drawn value) is far shorter. */
#define V_FX_CUT 250
#define V_FX_CELL (V_FX_CUT * 4 + 1)

/* V_FX_SAME: the same statement as an earlier one (lg_stmt_same: the
 * same text and values, another event's or another case's), checked as
 * that one, whose rows and sums are theirs together. */
enum v_fx_kind { V_FX_NONE = 0, V_FX_INSERT, V_FX_ADD, V_FX_SAME };

/* One key of an addition: its baseline (a "sum" line) and what the
 * run's messages added to it. */
struct v_fx_key {
	char key[V_FX_VALUE_MAX];
	int64_t rows0;
	char sum0[40];
	int64_t added;
	long runs;
};

struct v_fx_stmt {
	enum v_fx_kind kind;
	int same;                /* V_FX_SAME: the statement it is checked as */
	char why[V_FX_WHY_MAX];  /* why it is not checked (kind NONE) */
	int msgcol;              /* INSERT: the column bound to :message_id */
	uint8_t *expect;         /* INSERT: per message, whether it runs the statement */
	int32_t *found;          /* INSERT: per message, rows found */
	bool baseline;           /* ADD: the ledger has its stmt line */
	int key_field;           /* ADD: the plan field its key reads */
	int64_t addend;          /* ADD: a number written in the statement ... */
	int add_field;           /* ... or the plan field it adds (-1: the number) */
	struct v_fx_key *keys;   /* ADD: sorted by key */
	size_t nkeys, kcap;
	bool overflow;           /* ADD: a sum past int64: not checked */
};

struct v_fx {
	struct v_fx_stmt s[LC_MAX_STMTS];
	char (*data)[V_FX_VALUE_MAX]; /* order i's plan field f at [i * nfields + f]; "" when absent */
	int nfields;
	size_t ocap, mcap;
	struct v_fx_figures fig;
};

int v_fx_open(struct v_state *st, size_t ocap, size_t mcap)
{
	struct v_fx *fx;

	if (st->def->nstmts == 0)
		return 0;
	fx = calloc(1, sizeof *fx);
	if (fx == NULL)
		return -1;
	st->fx = fx;
	fx->ocap = ocap;
	fx->mcap = mcap;
	fx->nfields = st->plan.nfields;
	fx->fig.stmts = st->def->nstmts;
	if (fx->nfields > 0) {
		fx->data = calloc(ocap * (size_t)fx->nfields, sizeof *fx->data);
		if (fx->data == NULL)
			return -1;
	}
	for (int k = 0; k < st->def->nstmts; k++) {
		fx->s[k].key_field = -1;
		fx->s[k].add_field = -1;
		fx->s[k].msgcol = -1;
	}
	return 0;
}

void v_fx_order(struct v_state *st, size_t i, json_t *data)
{
	struct v_fx *fx = st->fx;

	if (fx == NULL || data == NULL || i >= fx->ocap)
		return;
	for (int f = 0; f < fx->nfields; f++) {
		json_t *v = json_object_get(data, st->plan.fields[f].set->field);
		char *cell = fx->data[i * (size_t)fx->nfields + (size_t)f];

		/* one spelling per value, as publish's snapshot keys: decimal, or the text */
		if (json_is_integer(v))
			snprintf(cell, V_FX_VALUE_MAX, "%lld", (long long)json_integer_value(v));
		else if (json_is_string(v))
			snprintf(cell, V_FX_VALUE_MAX, "%s", json_string_value(v));
	}
}

static int key_cmp(const void *a, const void *b)
{
	return strcmp(((const struct v_fx_key *)a)->key, ((const struct v_fx_key *)b)->key);
}

/* A stmt line must name the definition's statement of that index. */
static int stmt_line(struct v_state *st, json_t *o, const char *path, long line)
{
	json_int_t k = json_integer_value(json_object_get(o, "stmt"));
	const char *event = json_string_value(json_object_get(o, "event"));
	const char *table = json_string_value(json_object_get(o, "table"));
	const char *column = json_string_value(json_object_get(o, "column"));
	const struct lc_stmt *s;

	if (k < 0 || k >= st->def->nstmts)
		goto other;
	s = &st->def->stmts[k];
	if (event == NULL || table == NULL || column == NULL || strcmp(event, st->def->events[s->event].type) != 0 ||
	    json_integer_value(json_object_get(o, "index")) != s->index || strcmp(table, s->fx.table) != 0 ||
	    strcmp(column, s->fx.add_column) != 0)
		goto other;
	st->fx->s[k].baseline = true;
	return 0;
other:
	fprintf(stderr, "inbox-loadgen: %s:%ld: the ledger's statement %lld is not this definition's: verify with the"
	        " definition it was published with\n", path, line, (long long)k);
	return -1;
}

int v_fx_line(struct v_state *st, const char *k, json_t *o, const char *path, long line)
{
	struct v_fx_stmt *s;
	struct v_fx_key *key;
	json_int_t i = json_integer_value(json_object_get(o, "stmt"));

	if (st->fx == NULL) {
		fprintf(stderr, "inbox-loadgen: %s:%ld: a statement's baseline, but the %s definition has no statements:"
		        " verify with the definition it was published with\n", path, line, st->def->aggregate);
		return -1;
	}
	if (strcmp(k, "stmt") == 0)
		return stmt_line(st, o, path, line);
	if (i < 0 || i >= st->def->nstmts || !st->fx->s[i].baseline) {
		fprintf(stderr, "inbox-loadgen: %s:%ld: a sum line before its stmt line\n", path, line);
		return -1;
	}
	s = &st->fx->s[i];
	if (s->nkeys == s->kcap) {
		size_t cap = s->kcap ? s->kcap * 2 : 64;
		struct v_fx_key *n = realloc(s->keys, cap * sizeof *n);

		if (n == NULL) {
			fprintf(stderr, "inbox-loadgen: out of memory reading %s\n", path);
			return -1;
		}
		s->keys = n;
		s->kcap = cap;
	}
	key = &s->keys[s->nkeys++];
	memset(key, 0, sizeof *key);
	v_copy(key->key, sizeof key->key, json_object_get(o, "key"));
	v_copy(key->sum0, sizeof key->sum0, json_object_get(o, "sum"));
	key->rows0 = json_integer_value(json_object_get(o, "rows"));
	return 0;
}

static const char *value_of(const struct v_state *st, size_t order, int field)
{
	if (field < 0 || st->fx->data == NULL)
		return "";
	return st->fx->data[order * (size_t)st->fx->nfields + (size_t)field];
}

static bool parse_i64(const char *s, int64_t *out)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0')
		return false;
	*out = v;
	return true;
}

/* Whether statement k can be checked, and what with; why says so when not. */
static void classify(struct v_state *st, int k)
{
	const struct lc_stmt *ls = &st->def->stmts[k];
	const struct lc_fx *fx = &ls->fx;
	struct v_fx_stmt *s = &st->fx->s[k];
	bool quoted = false; /* a name with a backtick: we could not quote it */

	s->kind = V_FX_NONE;
	for (int j = 0; j < k; j++) {
		if (lg_stmt_same(st->def, j, k)) {
			s->kind = V_FX_SAME;
			s->same = j;
			return;
		}
	}
	if (fx->shape == LC_FX_SHAPE_INSERT) {
		for (int c = 0; c < fx->ncols; c++) {
			if (fx->cols[c].v.kind == LC_FX_VAL_PARAM && fx->params[fx->cols[c].v.param].src == LC_FX_MESSAGE_ID)
				s->msgcol = c;
			quoted = quoted || strchr(fx->cols[c].name, '`') != NULL;
		}
		if (quoted || strchr(fx->table, '`') != NULL) {
			snprintf(s->why, sizeof s->why, "a name holds a backtick, which verify does not quote");
			return;
		}
		if (s->msgcol < 0) {
			snprintf(s->why, sizeof s->why, "no column takes :message_id by itself");
			return;
		}
		s->expect = calloc(st->fx->mcap, sizeof *s->expect);
		s->found = calloc(st->fx->mcap, sizeof *s->found);
		if (s->expect == NULL || s->found == NULL) {
			snprintf(s->why, sizeof s->why, "out of memory");
			return;
		}
		s->kind = V_FX_INSERT;
		return;
	}
	if (fx->shape != LC_FX_SHAPE_ADD) {
		snprintf(s->why, sizeof s->why, "neither an INSERT of one VALUES row keyed by :message_id nor an addition"
		         " to one column by key (SET c = c + :p WHERE k = :q)");
		return;
	}
	if (!lg_fx_snapshotted(&st->plan, ls, &s->key_field)) {
		snprintf(s->why, sizeof s->why, "its key %s is no data field the scenario draws, so publish took no"
		         " baseline", fx->cols[0].name);
		return;
	}
	if (!s->baseline) {
		snprintf(s->why, sizeof s->why, "the ledger holds no baseline of %s.%s: publish it again with this build",
		         fx->table, fx->add_column);
		return;
	}
	if (fx->add.kind == LC_FX_VAL_NUMBER) {
		if (!parse_i64(fx->add.text, &s->addend)) {
			snprintf(s->why, sizeof s->why, "it adds %s, not a whole number", fx->add.text);
			return;
		}
	} else {
		s->add_field = lg_fx_param_field(&st->plan, ls, fx->add.param);
		if (s->add_field < 0 || st->plan.fields[s->add_field].set->type != LC_TYPE_INTEGER) {
			snprintf(s->why, sizeof s->why, "what it adds is no integer data field the scenario draws");
			return;
		}
	}
	qsort(s->keys, s->nkeys, sizeof *s->keys, key_cmp);
	s->kind = V_FX_ADD;
}

/* Message mi (of order oi) ran statement k: what it must have written. */
static void expect_run(struct v_state *st, int k, size_t oi, uint32_t mi)
{
	const struct lc_fx *fx;
	struct v_fx_stmt *s = &st->fx->s[k];
	struct v_fx_key want, *key;
	int64_t add;

	if (s->kind == V_FX_SAME) {
		k = s->same;
		s = &st->fx->s[k];
	}
	fx = &st->def->stmts[k].fx;
	add = s->addend;

	if (s->kind == V_FX_INSERT) {
		if (!s->expect[mi])
			st->fx->fig.rows_exp++;
		s->expect[mi] = 1;
		return;
	}
	if (s->kind != V_FX_ADD)
		return;
	snprintf(want.key, sizeof want.key, "%s", value_of(st, oi, s->key_field));
	key = bsearch(&want, s->keys, s->nkeys, sizeof *s->keys, key_cmp);
	if (key == NULL) {
		st->fx->fig.sums_unmeasured++;
		return;
	}
	if (s->add_field >= 0 && !parse_i64(value_of(st, oi, s->add_field), &add)) {
		s->overflow = true;
		return;
	}
	if (fx->add_sign < 0)
		add = -add;
	if (__builtin_add_overflow(key->added, add, &key->added))
		s->overflow = true;
	key->runs++;
}

/* Every order's messages through its route: which statements each ran. */
static void fold(struct v_state *st)
{
	for (size_t oi = 0; oi < st->norders; oi++) {
		const struct v_order *od = &st->orders[oi];
		const struct lg_route *r;

		if (od->route < 0 || od->route >= st->plan.nroutes || od->apart ||
		    (int)od->nmsg != st->plan.routes[od->route].n) {
			st->fx->fig.orders_unfolded++;
			continue;
		}
		r = &st->plan.routes[od->route];
		for (int m = 0; m < r->n; m++) {
			int first = 0, n = r->dead[m] ? 0 : lc_event_stmts(st->def, r->ev[m], r->before[m], r->out[m], &first);

			for (int j = first; j < first + n; j++)
				expect_run(st, j, oi, od->first_msg + (uint32_t)m);
		}
	}
}

/* Whether a column of a keyed INSERT is held against the ledger, and the
 * value it must hold for message m: the aggregate's key, a data field the
 * scenario drew.  The message id is the row's match; literals are in the
 * query's WHERE; the clock, occurred_at, :source and :type are not
 * compared (the ledger does not keep what they were). */
static bool compared(struct v_state *st, int k, int c, const struct v_msg *m, const char **want)
{
	const struct lc_stmt *ls = &st->def->stmts[k];
	const struct lc_fx_value *v = &ls->fx.cols[c].v;
	long oi;
	int f;

	if (v->kind != LC_FX_VAL_PARAM || c == st->fx->s[k].msgcol)
		return false;
	if (ls->fx.params[v->param].src == LC_FX_KEY) {
		*want = m->order;
		return true;
	}
	f = lg_fx_param_field(&st->plan, ls, v->param);
	if (f < 0)
		return false;
	oi = v_map_find(&st->omap, m->order, strlen(m->order), v_order_name, st->orders, -1);
	*want = oi >= 0 ? value_of(st, (size_t)oi, f) : "";
	return true;
}

/* SELECT the message id column, then every column (as text), of the run's
 * rows that hold the statement's literals. */
static int insert_sql(const struct lc_fx *fx, int msgcol, char *buf, size_t cap)
{
	size_t used;
	int n = snprintf(buf, cap, "SELECT LEFT(CAST(`%s` AS CHAR), %d)", fx->cols[msgcol].name, V_FX_CUT);

	for (int c = 0; n >= 0 && (size_t)n < cap && c < fx->ncols; c++)
		n += snprintf(buf + n, cap - (size_t)n, ", LEFT(CAST(`%s` AS CHAR), %d)", fx->cols[c].name, V_FX_CUT);
	if (n < 0 || (size_t)n >= cap)
		return -1;
	used = (size_t)n;
	n = snprintf(buf + used, cap - used, " FROM `%s` WHERE `%s` LIKE ?", fx->table, fx->cols[msgcol].name);
	for (int c = 0; n >= 0 && used + (size_t)n < cap && c < fx->ncols; c++) {
		if (fx->cols[c].v.kind == LC_FX_VAL_NUMBER || fx->cols[c].v.kind == LC_FX_VAL_STRING)
			n += snprintf(buf + used + n, cap - used - (size_t)n, " AND `%s` = ?", fx->cols[c].name);
	}
	return n >= 0 && used + (size_t)n < cap ? 0 : -1;
}

static void stmt_name(const struct v_state *st, int k, char *buf, size_t cap)
{
	const struct lc_stmt *ls = &st->def->stmts[k];

	if (ls->after > 0)
		snprintf(buf, cap, "statement %d of %s after %s", ls->index, st->def->events[ls->event].type,
		         st->def->states[ls->after]);
	else
		snprintf(buf, cap, "statement %d of %s", ls->index, st->def->events[ls->event].type);
}

static void judge_row(struct v_state *st, int k, const char *id, char (*vals)[V_FX_CELL], const char *name)
{
	const struct lc_fx *fx = &st->def->stmts[k].fx;
	struct v_fx_stmt *s = &st->fx->s[k];
	long mi = v_map_find(&st->mmap, id, strlen(id), v_msg_name, st->msgs, -1);

	if (mi < 0 || !s->expect[mi]) {
		st->fx->fig.rows_unexpected++;
		v_add(&st->unexpected, "%s: a %s row (%s) for a message %s", id, fx->table, name,
		      mi < 0 ? "the ledger does not know" : "that does not run it");
		return;
	}
	s->found[mi]++;
	for (int c = 0; c < fx->ncols; c++) {
		const char *want;

		if (compared(st, k, c, &st->msgs[mi], &want) && strcmp(vals[c], want) != 0) {
			st->fx->fig.rows_wrong++;
			v_add(&st->wrong, "%s: %s.%s is %s, the message carried %s (%s)", id, fx->table, fx->cols[c].name,
			      vals[c], want, name);
			return;
		}
	}
}

static int check_insert(struct v_state *st, int k)
{
	const struct lc_fx *fx = &st->def->stmts[k].fx;
	struct v_fx_stmt *s = &st->fx->s[k];
	struct db_stmt *q = NULL;
	struct db_param p[1 + LC_FX_COLS];
	char sql[LC_FX_COLS * 180 + 256], name[LC_NAME_MAX * 2 + 40], id[V_FX_CELL];
	static char vals[LC_FX_COLS][V_FX_CELL]; /* 16 KiB; verify is one thread */
	int np = 0, rc, r;

	stmt_name(st, k, name, sizeof name);
	if (insert_sql(fx, s->msgcol, sql, sizeof sql) != 0) {
		snprintf(s->why, sizeof s->why, "its names make a query longer than %zu bytes", sizeof sql);
		s->kind = V_FX_NONE;
		return ST_OK;
	}
	p[np++] = DBP_STR(st->like);
	for (int c = 0; c < fx->ncols; c++) {
		if (fx->cols[c].v.kind == LC_FX_VAL_NUMBER || fx->cols[c].v.kind == LC_FX_VAL_STRING)
			p[np++] = DBP_STR(fx->cols[c].v.text);
	}
	rc = db_prepare(st->db, &q, sql);
	if (rc == ST_OK)
		rc = db_stmt_query(q, p, np);
	while (rc == ST_OK) {
		struct db_col c[1 + LC_FX_COLS];

		c[0] = DBC_STR(id, sizeof id);
		for (int j = 0; j < fx->ncols; j++)
			c[1 + j] = DBC_STR(vals[j], sizeof vals[j]);
		r = db_stmt_fetch(q, c, 1 + fx->ncols);
		if (r <= 0) {
			rc = r;
			break;
		}
		for (int j = 0; j < fx->ncols; j++) {
			if (c[1 + j].is_null)
				snprintf(vals[j], sizeof vals[j], "NULL");
		}
		judge_row(st, k, id, vals, name);
	}
	db_rollback(st->db);
	if (rc != ST_OK)
		return rc;
	for (size_t mi = 0; mi < st->nmsgs; mi++) {
		if (!s->expect[mi])
			continue;
		if (s->found[mi] == 0) {
			st->fx->fig.rows_missing++;
			v_add(&st->missing, "%s: no %s row (%s)", st->msgs[mi].id, fx->table, name);
		} else if (s->found[mi] > 1) {
			st->fx->fig.rows_doubled++;
			v_add(&st->doubled, "%s: %d %s rows (%s)", st->msgs[mi].id, s->found[mi], fx->table, name);
		} else {
			st->fx->fig.rows_once++;
		}
	}
	return ST_OK;
}

static int check_add(struct v_state *st, int k)
{
	const struct lc_fx *fx = &st->def->stmts[k].fx;
	struct v_fx_stmt *s = &st->fx->s[k];
	struct db_stmt *q = NULL;
	char sql[LC_FX_COLS * 80 + 256], name[LC_NAME_MAX * 2 + 40];
	int rc = ST_OK;

	stmt_name(st, k, name, sizeof name);
	if (s->overflow || lg_fx_sum_sql(fx, sql, sizeof sql) != 0) {
		snprintf(s->why, sizeof s->why, s->overflow ? "what it adds passes 64 bits" : "its names do not make a query");
		s->kind = V_FX_NONE;
		return ST_OK;
	}
	rc = db_prepare(st->db, &q, sql);
	for (size_t i = 0; rc == ST_OK && i < s->nkeys; i++) {
		const struct v_fx_key *key = &s->keys[i];
		int64_t rows = 0, sum0, sum, want;
		char text[40];

		rc = lg_fx_sum_read(q, fx, key->key, st->plan.fields[s->key_field].set->type == LC_TYPE_INTEGER, &rows, text,
		                    sizeof text);
		if (rc != ST_OK)
			break;
		if (!parse_i64(key->sum0, &sum0) || !parse_i64(text, &sum) ||
		    __builtin_mul_overflow(key->rows0, key->added, &want) || __builtin_add_overflow(want, sum0, &want)) {
			st->fx->fig.sums_unmeasured++;
			continue;
		}
		st->fx->fig.sums_checked++;
		if (rows != key->rows0) {
			st->fx->fig.sums_wrong++;
			v_add(&st->wrong, "%s.%s where %s = %s: %lld rows, %lld before the run (%s)", fx->table, fx->add_column,
			      fx->cols[0].name, key->key, (long long)rows, (long long)key->rows0, name);
		} else if (sum != want) {
			st->fx->fig.sums_wrong++;
			v_add(&st->wrong, "%s.%s where %s = %s is %lld, expected %lld (%s before the run %+lld from %ld"
			      " messages; %s)", fx->table, fx->add_column, fx->cols[0].name, key->key, (long long)sum,
			      (long long)want, key->sum0, (long long)(want - sum0), key->runs, name);
		}
	}
	db_rollback(st->db);
	return rc;
}

int v_fx_check(struct v_state *st)
{
	struct v_fx *fx = st->fx;
	int rc = ST_OK;

	if (fx == NULL)
		return ST_OK;
	for (int k = 0; k < st->def->nstmts; k++)
		classify(st, k);
	fold(st);
	if (fx->fig.orders_unfolded > 0) {
		/* without every order's route, rows of the ones not folded would
		 * read as unexpected and their sums as wrong: check nothing */
		for (int k = 0; k < st->def->nstmts; k++) {
			fx->s[k].kind = V_FX_NONE;
			snprintf(fx->s[k].why, sizeof fx->s[k].why, "the ledger does not give the route of %ld orders",
			         fx->fig.orders_unfolded);
		}
	}
	for (int k = 0; rc == ST_OK && k < st->def->nstmts; k++) {
		if (fx->s[k].kind == V_FX_INSERT)
			rc = check_insert(st, k);
		else if (fx->s[k].kind == V_FX_ADD)
			rc = check_add(st, k);
	}
	for (int k = 0; k < st->def->nstmts; k++) {
		fx->fig.inserts += fx->s[k].kind == V_FX_INSERT;
		fx->fig.sums += fx->s[k].kind == V_FX_ADD;
		fx->fig.uncheckable += fx->s[k].kind == V_FX_NONE;
		fx->fig.same += fx->s[k].kind == V_FX_SAME && fx->s[fx->s[k].same].kind != V_FX_NONE;
		fx->fig.uncheckable += fx->s[k].kind == V_FX_SAME && fx->s[fx->s[k].same].kind == V_FX_NONE;
	}
	return rc;
}

const struct v_fx_figures *v_fx_figures(const struct v_state *st)
{
	static const struct v_fx_figures none;

	return st->fx != NULL ? &st->fx->fig : &none;
}

void v_fx_report_text(const struct v_state *st, FILE *f)
{
	const struct v_fx_figures *g = v_fx_figures(st);

	if (st->fx == NULL)
		return;
	fprintf(f, "statements  %d: checked %d (%d keyed inserts, %d additions", g->stmts, g->inserts + g->sums + g->same,
	        g->inserts, g->sums);
	if (g->same > 0)
		fprintf(f, ", %d the same as one of those", g->same);
	fprintf(f, "), cannot check %d\n", g->uncheckable);
	fprintf(f, "statement rows expected %ld, exactly once %ld, missing %ld, doubled %ld, wrong values %ld,"
	        " unexpected %ld\n", g->rows_exp, g->rows_once, g->rows_missing, g->rows_doubled, g->rows_wrong,
	        g->rows_unexpected);
	fprintf(f, "statement sums checked %ld, wrong %ld (keys without a baseline, not checked: %ld)\n", g->sums_checked,
	        g->sums_wrong, g->sums_unmeasured);
	for (int k = 0; k < st->def->nstmts; k++) {
		char name[LC_NAME_MAX * 2 + 40];

		const struct v_fx_stmt *s = &st->fx->s[k];

		if (s->kind == V_FX_SAME && st->fx->s[s->same].kind == V_FX_NONE)
			s = &st->fx->s[s->same];
		if (s->kind != V_FX_NONE)
			continue;
		stmt_name(st, k, name, sizeof name);
		fprintf(f, "cannot check %s: %s\n", name, s->why);
	}
	if (g->orders_unfolded > 0)
		fprintf(f, "cannot check the statements of %ld orders: the ledger does not give their route (publish with"
		        " this definition)\n", g->orders_unfolded);
}

json_t *v_fx_report_json(const struct v_state *st)
{
	const struct v_fx_figures *g = v_fx_figures(st);

	if (st->fx == NULL)
		return NULL;
	return json_pack("{s:i, s:i, s:i, s:i, s:i, s:I,"
	                 " s:{s:I, s:I, s:I, s:I, s:I, s:I}, s:{s:I, s:I, s:I}}",
	                 "count", g->stmts, "inserts", g->inserts, "additions", g->sums, "same_as_another", g->same,
	                 "not_checkable", g->uncheckable,
	                 "orders_unfolded", (json_int_t)g->orders_unfolded,
	                 "rows", "expected", (json_int_t)g->rows_exp, "exactly_once", (json_int_t)g->rows_once, "missing",
	                 (json_int_t)g->rows_missing, "doubled", (json_int_t)g->rows_doubled, "wrong",
	                 (json_int_t)g->rows_wrong, "unexpected", (json_int_t)g->rows_unexpected,
	                 "sums", "checked", (json_int_t)g->sums_checked, "wrong", (json_int_t)g->sums_wrong,
	                 "without_baseline", (json_int_t)g->sums_unmeasured);
}

void v_fx_free(struct v_fx **fx)
{
	if (fx == NULL || *fx == NULL)
		return;
	for (int k = 0; k < LC_MAX_STMTS; k++) {
		free((*fx)->s[k].expect);
		free((*fx)->s[k].found);
		free((*fx)->s[k].keys);
	}
	free((*fx)->data);
	free(*fx);
	*fx = NULL;
}
