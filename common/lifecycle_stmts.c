/*
 * lifecycle_stmts.c - a definition's own statements (issue 45) read into
 * def->stmts: each event's "statements" (run when it applies) and those of
 * its "after" compensations (run when it compensates after that terminal
 * state), every named parameter resolved against what the event declares.
 *
 * Read once every event is, like "compensations": a statement names the
 * aggregate's key and the event's fields, and every error points at the
 * statement's own line.  What the text may say is lifecycle_fx.c's; what
 * is decided here is where each value comes from and which tables are the
 * worker's own, which no statement may write (the worker's rows would no
 * longer say what the worker did).
 */
#include "lifecycle_int.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

struct names {
	struct lc_def *def;
	struct lc_event *ev;
};

static bool is(const char *name, size_t len, const char *want)
{
	return strlen(want) == len && memcmp(name, want, len) == 0;
}

/* A parameter of ev: its key fields, the aggregate's key, occurred_at (a
 * column-less set added the first time a statement reads it) and its
 * declared data fields. */
static int resolve(void *arg, const char *name, size_t len, struct lc_fx_param *out)
{
	struct names *n = arg;
	struct lc_event *ev = n->ev;

	out->set = -1;
	if (is(name, len, "message_id")) {
		out->src = LC_FX_MESSAGE_ID;
		return 0;
	}
	if (is(name, len, "source")) {
		out->src = LC_FX_SOURCE;
		return 0;
	}
	if (is(name, len, "type")) {
		out->src = LC_FX_TYPE;
		return 0;
	}
	if (is(name, len, n->def->key)) {
		out->src = LC_FX_KEY;
		return 0;
	}
	out->src = LC_FX_SET;
	if (is(name, len, "occurred_at")) {
		for (int k = 0; k < ev->nsets; k++) {
			if (ev->sets[k].src == LC_SRC_OCCURRED_AT) {
				out->set = k;
				return 0;
			}
		}
		if (ev->nsets >= LC_MAX_SETS)
			return -1;
		memset(&ev->sets[ev->nsets], 0, sizeof ev->sets[0]);
		ev->sets[ev->nsets].src = LC_SRC_OCCURRED_AT;
		ev->sets[ev->nsets].type = LC_TYPE_DATETIME;
		out->set = ev->nsets++;
		return 0;
	}
	if (len > 5 && memcmp(name, "data.", 5) == 0) {
		for (int k = 0; k < ev->nsets; k++) {
			if (ev->sets[k].src == LC_SRC_DATA && is(name + 5, len - 5, ev->sets[k].field)) {
				out->set = k;
				return 0;
			}
		}
	}
	return -1;
}

/* The tables the worker writes itself: its migrations' and the bound
 * definition's three. */
static bool table_ours(const struct lc_def *d, const char *table)
{
	static const char *const fixed[] = { "processed_messages", "outbox", "held_events", "schema_migrations",
		                                 "orders", "order_events", "order_locks", NULL };
	char name[LC_NAME_MAX + 16];

	for (int i = 0; fixed[i] != NULL; i++) {
		if (strcasecmp(table, fixed[i]) == 0)
			return true;
	}
	if (strcasecmp(table, d->table) == 0)
		return true;
	snprintf(name, sizeof name, "%s_events", d->aggregate);
	if (strcasecmp(table, name) == 0)
		return true;
	snprintf(name, sizeof name, "%s_locks", d->aggregate);
	return strcasecmp(table, name) == 0;
}

/* One list (at the current path) into def->stmts: after 0 for the
 * event's own, else the terminal state of the compensation. */
static void parse_list(struct lc_ctx *c, int evi, int after, json_t *arr)
{
	struct lc_def *d = c->def;
	struct lc_event *ev = &d->events[evi];
	struct names n = { d, ev };
	int first = d->nstmts, count = 0;
	size_t i;
	json_t *v;

	if (!json_is_array(arr) || json_array_size(arr) == 0 || json_array_size(arr) > LC_MAX_EVENT_STMTS) {
		lc_err(c, "\"statements\" is a list of 1 to %d SQL statements, each a string, like "
		          "[\"UPDATE accounts SET balance_cents = balance_cents + :data.amount_cents WHERE id = "
		          ":data.account_id\"]", LC_MAX_EVENT_STMTS);
		return;
	}
	json_array_foreach(arr, i, v) {
		struct lc_stmt *st = &d->stmts[d->nstmts];
		char why[LC_FX_WHY_MAX + 80];

		lc_push_index(c, (int)i);
		if (!json_is_string(v)) {
			lc_err(c, "a statement is a string of SQL, like \"INSERT INTO ledger (message_id) VALUES (:message_id)\"");
			lc_pop(c);
			continue;
		}
		if (d->nstmts >= LC_MAX_STMTS) {
			lc_err(c, "more than %d statements in one definition: write fewer", LC_MAX_STMTS);
			lc_pop(c);
			continue;
		}
		memset(st, 0, sizeof *st);
		st->event = evi;
		st->after = after;
		st->index = (int)i + 1;
		st->line = lc_here_line(c);
		if (!lc_fx_compile(json_string_value(v), resolve, &n, &st->fx, why, sizeof why)) {
			lc_err(c, "statement %d of %s: %s", st->index, ev->type, why);
		} else if (table_ours(d, st->fx.table)) {
			lc_err(c, "statement %d of %s writes %s, a table the worker keeps itself: write to a table of "
			          "your own", st->index, ev->type, st->fx.table);
		} else {
			d->nstmts++;
			count++;
		}
		lc_pop(c);
	}
	if (after == 0) {
		ev->fx_first = first;
		ev->nfx = count;
	} else {
		ev->cfx_first[after] = first;
		ev->cfx_n[after] = count;
	}
}

void lc_parse_statements(struct lc_ctx *c, int evi, json_t *obj)
{
	struct lc_event *ev = &c->def->events[evi];
	json_t *v = json_object_get(obj, "statements"), *after = json_object_get(obj, "after"), *x;
	const char *sname;

	if (v != NULL) {
		lc_push_key(c, "statements");
		parse_list(c, evi, 0, v);
		lc_pop(c);
	}
	if (!json_is_object(after))
		return;
	lc_push_key(c, "after");
	json_object_foreach(after, sname, x) {
		int s = lc_state_index(c->def, sname);
		json_t *list = json_is_object(x) ? json_object_get(x, "statements") : NULL;

		/* parse_after said what is wrong with any other case */
		if (list == NULL || s < 0 || ev->after[s] != LC_AFTER_COMPENSATE)
			continue;
		lc_push_key(c, sname);
		lc_push_key(c, "statements");
		parse_list(c, evi, s, list);
		lc_pop(c);
		lc_pop(c);
	}
	lc_pop(c);
}
