/*
 * effects.c - a definition's own statements run in the claim's
 * transaction (effects.h).
 *
 * Which refusals are the data's: the server's numbers for a value its
 * column or its constraints will not take.  They are listed here, by
 * number, rather than in db.c's map: db.c calls a duplicate key
 * ST_ERR_DB_DUPLICATE because the claim is built on it, and a foreign
 * key is nothing the worker's own statements can meet; only a statement
 * a person wrote can, and only its caller knows that it is the message's
 * fault and not ours.  The numbers are the same in MariaDB and MySQL
 * except the CHECK constraint's, which is listed under both.
 */
#include "effects.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "array.h"
#include "status.h"

#define EFFECTS_SAVEPOINT "inbox_effects"

/* A parameter kept for a deferred run: its value, text as an offset into
 * the runner's arena (which moves as it grows). */
struct effects_val {
	enum db_type type;
	int64_t i64;
	size_t off, len;
};

/* The rows one statement runs over when the batch ends. */
struct effects_rows {
	struct effects_val *v; /* n rows of the statement's nparams values */
	int n, cap;
};

struct effects {
	struct db *db;
	const struct lc_def *def;
	struct db_stmt *st[LC_MAX_STMTS];
	/* Deferred runs (effects_defer): per statement its rows, their text
	 * in arena, and the parameters built for one array-bound execution. */
	bool bulk;
	struct effects_rows rows[LC_MAX_STMTS];
	char *arena;
	size_t alen, acap;
	struct db_param *params;
	size_t nparams_cap;
};

static bool effects_data_errno(unsigned e)
{
	switch (e) {
	case 1062: /* ER_DUP_ENTRY */
	case 1586: /* ER_DUP_ENTRY_WITH_KEY_NAME */
	case 1451: /* ER_ROW_IS_REFERENCED_2: a foreign key points at the row */
	case 1452: /* ER_NO_REFERENCED_ROW_2: a foreign key points nowhere */
	case 1216: /* ER_NO_REFERENCED_ROW */
	case 1217: /* ER_ROW_IS_REFERENCED */
	case 1048: /* ER_BAD_NULL_ERROR */
	case 1364: /* ER_NO_DEFAULT_FOR_FIELD */
	case 1264: /* ER_WARN_DATA_OUT_OF_RANGE */
	case 1690: /* ER_DATA_OUT_OF_RANGE: an expression left its type's range */
	case 1406: /* ER_DATA_TOO_LONG */
	case 1265: /* WARN_DATA_TRUNCATED */
	case 1292: /* ER_TRUNCATED_WRONG_VALUE */
	case 1366: /* ER_TRUNCATED_WRONG_VALUE_FOR_FIELD */
	case 1300: /* ER_INVALID_CHARACTER_STRING */
	case 1365: /* ER_DIVISION_BY_ZERO */
	case 4025: /* MariaDB's ER_CONSTRAINT_FAILED: a CHECK */
	case 3819: /* MySQL's ER_CHECK_CONSTRAINT_VIOLATED */
		return true;
	default:
		return false;
	}
}

int effects_open(struct effects **out, struct db *db, const struct lc_def *def, struct effects_refusal *refused)
{
	struct effects *fx;
	int rc = ST_OK;

	*out = NULL;
	if (def->nstmts == 0)
		return ST_OK;
	fx = calloc(1, sizeof *fx);
	if (fx == NULL)
		return ST_ERR_NOMEM;
	fx->db = db;
	fx->def = def;
	fx->bulk = true;
	for (int i = 0; i < def->nstmts; i++) {
		rc = db_prepare_theirs(db, &fx->st[i], def->stmts[i].fx.sql);
		if (rc != ST_OK) {
			if (refused != NULL) {
				refused->stmt = i;
				snprintf(refused->why, sizeof refused->why, "%s", db_errmsg(db));
			}
			goto fail;
		}
	}
	*out = fx;
	return ST_OK;
fail:
	/* the statements prepared so far stay db's, unused, until it closes */
	free(fx);
	return rc;
}

void effects_close(struct effects **fx)
{
	if (fx == NULL || *fx == NULL)
		return;
	for (int i = 0; i < LC_MAX_STMTS; i++)
		free((*fx)->rows[i].v);
	free((*fx)->arena);
	free((*fx)->params);
	free(*fx);
	*fx = NULL;
}

void effects_refusal_line(const struct lc_def *def, const struct effects_refusal *r, const char *file, char *buf,
                          size_t cap)
{
	const struct lc_stmt *st = &def->stmts[r->stmt];

	snprintf(buf, cap, "%s%s%d: statement %d of %s: %s", file != NULL ? file : "line ", file != NULL ? ":" : "",
	         st->line, st->index, def->events[st->event].type, r->why);
}

int effects_count(const struct lc_def *def, int ev)
{
	int n;

	if (ev < 0 || ev >= def->nevents)
		return 0;
	n = def->events[ev].nfx;
	for (int s = 0; s < def->nstates; s++)
		n += def->events[ev].cfx_n[s];
	return n;
}

/* One parameter's value, borrowed from a (the message's text and keys). */
static struct db_param effects_param(const struct lc_def *def, int ev, const struct lc_fx_param *p,
                                     const struct effects_args *a)
{
	const struct msg_val *v;

	switch (p->src) {
	case LC_FX_MESSAGE_ID:
		return DBP_STR(a->message_id);
	case LC_FX_SOURCE:
		return DBP_STR(a->source != NULL ? a->source : "");
	case LC_FX_TYPE:
		return DBP_STR(a->type_name);
	case LC_FX_KEY:
		return DBP_STR(a->key);
	case LC_FX_SET:
		break;
	}
	if (a->m == NULL || p->set < 0 || p->set >= def->events[ev].nsets)
		return DBP_NULL();
	v = &a->m->vals[p->set];
	if (!v->has)
		return DBP_NULL();
	if (def->events[ev].sets[p->set].type == LC_TYPE_INTEGER)
		return DBP_I64(v->i);
	return DBP_STRN(a->m->text + v->off, v->len);
}

int effects_run(struct effects *fx, int ev, int state, enum lc_decision decision, const struct effects_args *a,
                int *ran, char *detail, size_t cap)
{
	const struct lc_def *def;
	int first, n, rc = ST_OK;

	*ran = 0;
	if (fx == NULL)
		return ST_OK;
	def = fx->def;
	n = lc_event_stmts(def, ev, state, decision, &first);
	if (n == 0)
		return ST_OK;
	/* One statement undoes itself when it fails (the server rolls back
	 * the statement, not the transaction); a second must also undo the
	 * first's rows. */
	if (n > 1) {
		rc = db_exec(fx->db, "SAVEPOINT " EFFECTS_SAVEPOINT);
		if (rc != ST_OK)
			return rc;
	}
	for (int i = first; i < first + n; i++) {
		const struct lc_stmt *st = &def->stmts[i];
		struct db_param p[LC_FX_PARAMS];
		uint64_t affected = 0;

		for (int k = 0; k < st->fx.nparams; k++)
			p[k] = effects_param(def, ev, &st->fx.params[k], a);
		rc = db_stmt_exec(fx->st[i], p, st->fx.nparams, &affected);
		if (rc == ST_OK) {
			(*ran)++;
			continue;
		}
		if (!effects_data_errno(db_errno(fx->db)))
			return rc; /* the server's: the caller rolls back */
		snprintf(detail, cap, "statement %d of %s: %s", st->index, def->events[ev].type, db_errmsg(fx->db));
		if (n > 1) {
			int rb = db_exec(fx->db, "ROLLBACK TO SAVEPOINT " EFFECTS_SAVEPOINT);

			if (rb != ST_OK)
				return rb;
		}
		return ST_ERR_DB_DATA;
	}
	return ST_OK;
}

/* ---- deferred: one array-bound execution per statement and batch ------- */

bool effects_bulk(const struct effects *fx)
{
	return fx != NULL && fx->bulk;
}

void effects_bulk_off(struct effects *fx)
{
	if (fx != NULL)
		fx->bulk = false;
}

static int effects_keep_text(struct effects *fx, const void *p, size_t len, size_t *off)
{
	if (fx->alen + len > fx->acap) {
		size_t cap = fx->acap > 0 ? fx->acap : 4096;
		char *a;

		while (cap < fx->alen + len)
			cap *= 2;
		a = realloc(fx->arena, cap);
		if (a == NULL)
			return ST_ERR_NOMEM;
		fx->arena = a;
		fx->acap = cap;
	}
	if (len > 0)
		memcpy(fx->arena + fx->alen, p, len);
	*off = fx->alen;
	fx->alen += len;
	return ST_OK;
}

int effects_defer(struct effects *fx, int ev, int state, enum lc_decision decision, const struct effects_args *a,
                  int *n)
{
	const struct lc_def *def;
	int first, rc;

	*n = 0;
	if (fx == NULL)
		return ST_OK;
	def = fx->def;
	*n = lc_event_stmts(def, ev, state, decision, &first);
	for (int i = first; i < first + *n; i++) {
		const struct lc_stmt *st = &def->stmts[i];
		struct effects_rows *r = &fx->rows[i];
		int np = st->fx.nparams;

		if (r->n == r->cap) {
			int cap = r->cap > 0 ? r->cap * 2 : 64;
			struct effects_val *v = realloc(r->v, (size_t)cap * (size_t)(np > 0 ? np : 1) * sizeof *v);

			if (v == NULL)
				return ST_ERR_NOMEM;
			r->v = v;
			r->cap = cap;
		}
		for (int k = 0; k < np; k++) {
			struct db_param p = effects_param(def, ev, &st->fx.params[k], a);
			struct effects_val *v = &r->v[(size_t)r->n * (size_t)np + (size_t)k];

			*v = (struct effects_val){ .type = p.type, .i64 = p.i64 };
			if (p.type == DB_STR || p.type == DB_BLOB) {
				rc = effects_keep_text(fx, p.ptr, p.len, &v->off);
				if (rc != ST_OK)
					return rc;
				v->len = p.len;
			}
		}
		r->n++;
	}
	return ST_OK;
}

void effects_discard(struct effects *fx)
{
	if (fx == NULL)
		return;
	for (int i = 0; i < LC_MAX_STMTS; i++)
		fx->rows[i].n = 0;
	fx->alen = 0;
}

/* One statement's rows in one execution (a statement without parameters
 * runs once a row: there is nothing to bind an array to). */
static int effects_flush_one(struct effects *fx, int i)
{
	const struct lc_stmt *st = &fx->def->stmts[i];
	struct effects_rows *r = &fx->rows[i];
	int np = st->fx.nparams, rc = ST_OK;
	size_t need = (size_t)r->n * (size_t)np;

	if (np == 0) {
		for (int k = 0; rc == ST_OK && k < r->n; k++)
			rc = db_stmt_exec(fx->st[i], NULL, 0, NULL);
		return rc;
	}
	if (need > fx->nparams_cap) {
		struct db_param *p = realloc(fx->params, need * sizeof *p);

		if (p == NULL)
			return ST_ERR_NOMEM;
		fx->params = p;
		fx->nparams_cap = need;
	}
	for (size_t k = 0; k < need; k++) {
		const struct effects_val *v = &r->v[k];

		fx->params[k] = (struct db_param){ .type = v->type, .i64 = v->i64 };
		if (v->type == DB_STR || v->type == DB_BLOB) {
			fx->params[k].ptr = fx->arena + v->off;
			fx->params[k].len = v->len;
		}
	}
	return db_stmt_exec_bulk(fx->st[i], fx->params, np, r->n, NULL);
}

int effects_flush(struct effects *fx, bool *again)
{
	int rc = ST_OK;

	*again = false;
	if (fx == NULL)
		return ST_OK;
	for (int i = 0; rc == ST_OK && i < fx->def->nstmts; i++) {
		if (fx->rows[i].n > 0)
			rc = effects_flush_one(fx, i);
	}
	effects_discard(fx);
	/* A lost connection, a deadlock, a lock wait: the server's, as in
	 * effects_run; anything else may be one row's data, which only a run
	 * a message at a time can tell. */
	if (rc != ST_OK && rc != ST_ERR_DB_CONN && rc != ST_ERR_DB_DEADLOCK && rc != ST_ERR_DB_LOCK_TIMEOUT &&
	    rc != ST_ERR_NOMEM)
		*again = true;
	return rc;
}
