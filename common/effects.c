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

struct effects {
	struct db *db;
	const struct lc_def *def;
	struct db_stmt *st[LC_MAX_STMTS];
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
