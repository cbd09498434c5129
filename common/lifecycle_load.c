/*
 * lifecycle_load.c - read a lifecycle definition (see lifecycle.h), validate
 * it with each error's line, and compile its decision table.  What the
 * table decides is lifecycle.c's; the arrival-order check is
 * lifecycle_check.c's.
 *
 * Why JSON through jansson: jansson is already what parses every message, so
 * the definition costs no new library, and its parse errors carry a line and
 * a column.  jansson keeps no positions for values, so an error about a value
 * (an unknown state, a misspelt key) is located by lc_locate, a small scanner
 * that walks the already-valid text along the value's path.
 *
 * The table is derived, not spelled out cell by cell: a person declares each
 * event's from/to states and what it does after a terminal state, and the
 * rules below (compile) fill in the rest the same way for every lifecycle:
 *
 *  - no aggregate yet: a creation event applies, anything else is held;
 *  - in a state an event moves from: applied;
 *  - a creation event once the aggregate exists: ignored;
 *  - before a terminal state: an event whose target is on the main path at
 *    or before the current state is stale (ignored); one that can still
 *    apply later (a from state at or after the current one) is held;
 *  - after a terminal state: what the event's "after" says; without it,
 *    stale events are ignored and anything else is an error in the file,
 *    so no cell is left to a default nobody chose.
 */
#include "lifecycle.h"
#include "lifecycle_emit.h"
#include "lifecycle_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/evp.h>

#define LC_FILE_MAX (1024 * 1024) /* a definition is a page, not a data set */

/* ---- locating a value in the text ---------------------------------------- */

struct scan {
	const char *p, *end;
	int line, col;
};

static void sc_adv(struct scan *s)
{
	if (*s->p == '\n') {
		s->line++;
		s->col = 1;
	} else {
		s->col++;
	}
	s->p++;
}

static void sc_ws(struct scan *s)
{
	while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
		sc_adv(s);
}

/* Past a string; key (when not NULL) gets its raw bytes, escapes kept. */
static bool sc_string(struct scan *s, char *key, size_t cap)
{
	size_t n = 0;

	if (s->p >= s->end || *s->p != '"')
		return false;
	sc_adv(s);
	while (s->p < s->end && *s->p != '"') {
		if (*s->p == '\\' && s->p + 1 < s->end) {
			if (key != NULL && n + 1 < cap)
				key[n++] = *s->p;
			sc_adv(s);
		}
		if (key != NULL && n + 1 < cap)
			key[n++] = *s->p;
		sc_adv(s);
	}
	if (key != NULL)
		key[n] = '\0';
	if (s->p >= s->end)
		return false;
	sc_adv(s);
	return true;
}

static bool sc_value(struct scan *s, int depth)
{
	char open, close;

	if (depth > 64 || s->p >= s->end)
		return false;
	if (*s->p == '"')
		return sc_string(s, NULL, 0);
	if (*s->p != '{' && *s->p != '[') {
		while (s->p < s->end && strchr(",]} \t\r\n", *s->p) == NULL)
			sc_adv(s);
		return true;
	}
	open = *s->p;
	close = open == '{' ? '}' : ']';
	sc_adv(s);
	sc_ws(s);
	if (s->p < s->end && *s->p == close) {
		sc_adv(s);
		return true;
	}
	for (;;) {
		sc_ws(s);
		if (open == '{') {
			if (!sc_string(s, NULL, 0))
				return false;
			sc_ws(s);
			if (s->p >= s->end || *s->p != ':')
				return false;
			sc_adv(s);
			sc_ws(s);
		}
		if (!sc_value(s, depth + 1))
			return false;
		sc_ws(s);
		if (s->p >= s->end)
			return false;
		if (*s->p == close) {
			sc_adv(s);
			return true;
		}
		if (*s->p != ',')
			return false;
		sc_adv(s);
	}
}

/* Line and column of the value at path (of the deepest part found). */
static void lc_locate(const char *text, size_t len, const struct lc_path *path, int *line, int *col)
{
	struct scan s = { text, text + len, 1, 1 };
	char key[LC_NAME_MAX * 2];

	sc_ws(&s);
	*line = s.line;
	*col = s.col;
	for (int d = 0; d < path->n; d++) {
		const struct lc_step *st = &path->s[d];
		bool found = false;

		if (s.p >= s.end || *s.p != (st->key != NULL ? '{' : '['))
			return;
		sc_adv(&s);
		for (int i = 0;; i++) {
			sc_ws(&s);
			if (s.p >= s.end || *s.p == '}' || *s.p == ']')
				return;
			if (st->key != NULL) {
				if (!sc_string(&s, key, sizeof key))
					return;
				sc_ws(&s);
				if (s.p >= s.end || *s.p != ':')
					return;
				sc_adv(&s);
				sc_ws(&s);
				found = strcmp(key, st->key) == 0;
			} else {
				found = i == st->index;
			}
			if (found)
				break;
			if (!sc_value(&s, 0))
				return;
			sc_ws(&s);
			if (s.p >= s.end || *s.p != ',')
				return;
			sc_adv(&s);
		}
		*line = s.line;
		*col = s.col;
	}
}

/* ---- loading -------------------------------------------------------------- */

void lc_push_key(struct lc_ctx *c, const char *key)
{
	if (c->path.n < LC_PATH_MAX)
		c->path.s[c->path.n] = (struct lc_step){ key, 0 };
	c->path.n++;
}

void lc_push_index(struct lc_ctx *c, int index)
{
	if (c->path.n < LC_PATH_MAX)
		c->path.s[c->path.n] = (struct lc_step){ NULL, index };
	c->path.n++;
}

void lc_pop(struct lc_ctx *c)
{
	c->path.n--;
}

static void add_error(struct lc_errors *errs, int line, int col, const char *fmt, va_list ap)
	__attribute__((format(printf, 4, 0)));
static void add_error(struct lc_errors *errs, int line, int col, const char *fmt, va_list ap)
{
	if (errs->n >= LC_MAX_ERRORS) {
		errs->more = true;
		return;
	}
	errs->e[errs->n].line = line;
	errs->e[errs->n].column = col;
	vsnprintf(errs->e[errs->n].text, sizeof errs->e[errs->n].text, fmt, ap);
	errs->n++;
}

static void err_line(struct lc_errors *errs, int line, int col, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void err_line(struct lc_errors *errs, int line, int col, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	add_error(errs, line, col, fmt, ap);
	va_end(ap);
}

/* An error about the value at the current path. */
void lc_err(struct lc_ctx *c, const char *fmt, ...)
{
	struct lc_path p = c->path;
	int line, col;
	va_list ap;

	if (p.n > LC_PATH_MAX)
		p.n = LC_PATH_MAX;
	lc_locate(c->text, c->len, &p, &line, &col);
	va_start(ap, fmt);
	add_error(c->errs, line, col, fmt, ap);
	va_end(ap);
}

int lc_here_line(struct lc_ctx *c)
{
	int line, col;
	struct lc_path p = c->path;

	if (p.n > LC_PATH_MAX)
		p.n = LC_PATH_MAX;
	lc_locate(c->text, c->len, &p, &line, &col);
	return line;
}

/* Names people choose: states, event and emitted types. */
static bool name_ok(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > LC_NAME_MAX || !((s[0] >= 'A' && s[0] <= 'Z') || (s[0] >= 'a' && s[0] <= 'z')))
		return false;
	for (size_t i = 1; i < n; i++) {
		char ch = s[i];
		if (!((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_'))
			return false;
	}
	return true;
}

bool lc_column_reserved(const char *column)
{
	static const char *const kept[] = { "id", "status", "version", "flags", "created_at", "updated_at",
		                            "lifecycle_version", NULL };

	for (int k = 0; kept[k] != NULL; k++)
		if (strcmp(column, kept[k]) == 0)
			return true;
	return false;
}

/* SQL identifiers (table, key, columns): a strict alphabet, so that they can
 * be quoted into DDL without escaping and never carry anything else. */
static bool ident_ok(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > LC_NAME_MAX || !(s[0] >= 'a' && s[0] <= 'z'))
		return false;
	for (size_t i = 1; i < n; i++) {
		char ch = s[i];
		if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_'))
			return false;
	}
	return true;
}

/* An AMQP header's name as a definition may say it: what producers' headers
 * are called (x-sequence, Event-Version, eventstore.version). */
static bool header_name_ok(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > LC_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char ch = s[i];
		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
		      ch == '-' || ch == '_' || ch == '.' || ch == ':'))
			return false;
	}
	return true;
}

/* Into a name field (LC_NAME_MAX + 1 bytes); the *_ok checks bound the
 * length before every call, the cut is a second guard. */
static void copy_name(char *dst, const char *src)
{
	snprintf(dst, LC_NAME_MAX + 1, "%s", src);
}

/* Check obj's keys against the allowed list. */
void lc_known_keys(struct lc_ctx *c, json_t *obj, const char *const *allowed, const char *what)
{
	const char *key;
	json_t *v;

	json_object_foreach(obj, key, v) {
		bool ok = false;
		char list[256] = "";
		size_t used = 0;

		for (int i = 0; allowed[i] != NULL; i++) {
			if (strcmp(key, allowed[i]) == 0)
				ok = true;
			if (used < sizeof list) {
				int w = snprintf(list + used, sizeof list - used, "%s\"%s\"", i ? ", " : "", allowed[i]);
				if (w > 0)
					used += (size_t)w;
			}
		}
		if (!ok) {
			lc_push_key(c, key);
			lc_err(c, "unknown key \"%s\" in %s: write one of %s", key, what, list);
			lc_pop(c);
		}
	}
}

/* A member that must be a name string; copies it to out. */
static bool get_name(struct lc_ctx *c, json_t *obj, const char *key, char *out, bool ident, const char *example)
{
	json_t *v = json_object_get(obj, key);

	if (v == NULL) {
		lc_err(c, "missing \"%s\": write \"%s\": \"%s\"", key, key, example);
		return false;
	}
	lc_push_key(c, key);
	if (!json_is_string(v) || !(ident ? ident_ok(json_string_value(v)) : name_ok(json_string_value(v)))) {
		lc_err(c, "\"%s\" must be %s, like \"%s\"", key,
		    ident ? "a lower-case SQL name ([a-z][a-z0-9_]*, at most 64)"
		          : "a name (a letter, then letters, digits or _, at most 64)",
		    example);
		lc_pop(c);
		return false;
	}
	copy_name(out, json_string_value(v));
	lc_pop(c);
	return true;
}

int lc_state_index(const struct lc_def *d, const char *name)
{
	for (int s = 1; s < d->nstates; s++) {
		if (strcmp(d->states[s], name) == 0)
			return s;
	}
	return -1;
}

/* A state name at the current path; -1 (said) when it is not declared. */
static int state_ref(struct lc_ctx *c, json_t *v)
{
	int s;

	if (!json_is_string(v)) {
		lc_err(c, "a state name is a string: write one of the names in \"states\"");
		return -1;
	}
	s = lc_state_index(c->def, json_string_value(v));
	if (s < 0)
		lc_err(c, "\"%s\" is not a declared state: write one of the names in \"states\", or add it there",
		    json_string_value(v));
	return s;
}

/* A list of states as a bitmask. */
static uint32_t state_list(struct lc_ctx *c, json_t *arr, const char *key)
{
	uint32_t bits = 0;
	size_t i;
	json_t *v;

	if (!json_is_array(arr) || json_array_size(arr) == 0) {
		lc_err(c, "\"%s\" is a non-empty list of state names, like [\"%s\"]", key, c->def->states[1]);
		return 0;
	}
	json_array_foreach(arr, i, v) {
		int s;

		lc_push_index(c, (int)i);
		s = state_ref(c, v);
		if (s > 0) {
			if (bits & (1u << s))
				lc_err(c, "\"%s\" is listed twice: write it once", c->def->states[s]);
			bits |= 1u << s;
		}
		lc_pop(c);
	}
	return bits;
}

static int emit_ref(struct lc_ctx *c, json_t *v)
{
	struct lc_def *d = c->def;
	const char *name;

	if (!json_is_string(v) || !name_ok(json_string_value(v))) {
		lc_err(c, "an emitted event is a type name (a letter, then letters, digits or _), like \"RefundRequested\"");
		return -1;
	}
	name = json_string_value(v);
	for (int i = 0; i < d->nemits; i++) {
		if (strcmp(d->emits[i], name) == 0)
			return i;
	}
	if (d->nemits >= LC_MAX_EMITS) {
		lc_err(c, "more than %d distinct emitted types: emit fewer", LC_MAX_EMITS);
		return -1;
	}
	copy_name(d->emits[d->nemits], name);
	return d->nemits++;
}

static uint32_t emit_list(struct lc_ctx *c, json_t *arr, const char *key)
{
	uint32_t bits = 0;
	size_t i;
	json_t *v;

	if (!json_is_array(arr)) {
		lc_err(c, "\"%s\" is a list of event types to emit, like [\"RefundRequested\"]", key);
		return 0;
	}
	json_array_foreach(arr, i, v) {
		int e;

		lc_push_index(c, (int)i);
		e = emit_ref(c, v);
		if (e >= 0)
			bits |= 1u << e;
		lc_pop(c);
	}
	return bits;
}

/* Where a set's value comes from ("from", sets only: a field is
 * data.<its name>), its type and bounds, into st. */
static void parse_value_spec(struct lc_ctx *c, struct lc_set *st, json_t *spec, const char *name, bool field)
{
	static const char *const set_keys[] = { "from", "type", "min", "max", "max_length", "required", NULL };
	static const char *const field_keys[] = { "type", "min", "max", "max_length", "required", NULL };
	json_t *from, *type, *v;
	const char *f, *t;

	lc_known_keys(c, spec, field ? field_keys : set_keys, field ? "a field" : "a column");
	from = json_object_get(spec, "from");
	type = json_object_get(spec, "type");
	f = json_is_string(from) ? json_string_value(from) : "";
	t = json_is_string(type) ? json_string_value(type) : "";
	if (field) {
		st->src = LC_SRC_DATA;
		copy_name(st->field, name);
		if (from != NULL) {
			lc_push_key(c, "from");
			lc_err(c, "a field is data.<its name>: remove \"from\" (a value from elsewhere is a parameter: "
			          ":occurred_at, :message_id)");
			lc_pop(c);
		}
	} else if (strcmp(f, "applied_at") == 0) {
		st->src = LC_SRC_APPLIED_AT;
	} else if (strcmp(f, "occurred_at") == 0) {
		st->src = LC_SRC_OCCURRED_AT;
	} else if (strcmp(f, "message_id") == 0) {
		st->src = LC_SRC_MESSAGE_ID;
	} else if (strncmp(f, "data.", 5) == 0 && ident_ok(f + 5)) {
		st->src = LC_SRC_DATA;
		copy_name(st->field, f + 5);
	} else {
		lc_push_key(c, "from");
		lc_err(c, "\"from\" must be \"applied_at\", \"occurred_at\", \"message_id\" or \"data.<field>\" "
		          "(a lower-case field name), like \"data.amount_cents\"");
		lc_pop(c);
	}
	if (strcmp(t, "datetime") == 0) {
		st->type = LC_TYPE_DATETIME;
	} else if (strcmp(t, "integer") == 0) {
		st->type = LC_TYPE_INTEGER;
	} else if (strcmp(t, "string") == 0) {
		st->type = LC_TYPE_STRING;
	} else {
		lc_push_key(c, "type");
		lc_err(c, "\"type\" must be \"datetime\", \"integer\" or \"string\"");
		lc_pop(c);
		return;
	}
	if ((st->src == LC_SRC_APPLIED_AT || st->src == LC_SRC_OCCURRED_AT) && st->type != LC_TYPE_DATETIME)
		lc_err(c, "\"%s\" comes from a time: write \"type\": \"datetime\"", name);
	if (st->src == LC_SRC_MESSAGE_ID && st->type != LC_TYPE_STRING)
		lc_err(c, "\"%s\" comes from the message id: write \"type\": \"string\"", name);
	st->min = INT64_MIN;
	st->max = INT64_MAX;
	st->max_length = 255;
	v = json_object_get(spec, "min");
	if (v != NULL) {
		if (!json_is_integer(v) || st->type != LC_TYPE_INTEGER)
			lc_err(c, "\"min\" is an integer bound of an \"integer\" %s, like \"min\": 0", field ? "field" : "column");
		else
			st->min = json_integer_value(v);
	}
	v = json_object_get(spec, "max");
	if (v != NULL) {
		if (!json_is_integer(v) || st->type != LC_TYPE_INTEGER)
			lc_err(c, "\"max\" is an integer bound of an \"integer\" %s, like \"max\": 100000000",
			       field ? "field" : "column");
		else
			st->max = json_integer_value(v);
	}
	if (st->min > st->max)
		lc_err(c, "\"min\" is above \"max\": swap them");
	v = json_object_get(spec, "max_length");
	if (v != NULL) {
		if (!json_is_integer(v) || st->type != LC_TYPE_STRING || json_integer_value(v) < 1 ||
		    json_integer_value(v) > 4096)
			lc_err(c, "\"max_length\" is the length bound of a \"string\" %s, 1..4096, like \"max_length\": 64",
			       field ? "field" : "column");
		else
			st->max_length = json_integer_value(v);
	}
	v = json_object_get(spec, "required");
	if (v != NULL) {
		if (!json_is_boolean(v) || st->src != LC_SRC_DATA)
			lc_err(c, "\"required\" (true or false) says whether a data field must be present; "
			          "only a \"data.<field>\" column has it");
		else
			st->required = json_is_true(v);
	}
}

static void parse_sets(struct lc_ctx *c, struct lc_event *ev, json_t *obj)
{
	const char *col;
	json_t *spec;

	if (!json_is_object(obj)) {
		lc_err(c, "\"sets\" maps a column to where its value comes from, like "
		          "{\"paid_at\": {\"from\": \"applied_at\", \"type\": \"datetime\"}}");
		return;
	}
	json_object_foreach(obj, col, spec) {
		struct lc_set *st;

		lc_push_key(c, col);
		if (ev->nsets >= LC_MAX_SETS) {
			lc_err(c, "more than %d columns and fields of one event: set fewer", LC_MAX_SETS);
			lc_pop(c);
			continue;
		}
		st = &ev->sets[ev->nsets];
		memset(st, 0, sizeof *st);
		if (!ident_ok(col)) {
			lc_err(c, "column \"%s\" must be a lower-case SQL name ([a-z][a-z0-9_]*, at most 64), like \"paid_at\"", col);
			lc_pop(c);
			continue;
		}
		if (lc_column_reserved(col)) {
			lc_err(c, "column \"%s\" is one the worker keeps itself (id, status, version, flags, created_at, "
			          "updated_at, lifecycle_version): name it otherwise, like \"%s_%s\"", col, ev->type[0] ? "event" : "my", col);
			lc_pop(c);
			continue;
		}
		for (int k = 0; k < ev->nsets; k++) {
			if (strcmp(ev->sets[k].column, col) == 0)
				lc_err(c, "column \"%s\" is set twice: set it once", col);
		}
		copy_name(st->column, col);
		if (!json_is_object(spec)) {
			lc_err(c, "say where \"%s\" comes from, like {\"from\": \"occurred_at\", \"type\": \"datetime\"}", col);
			lc_pop(c);
			continue;
		}
		parse_value_spec(c, st, spec, col, false);
		ev->nsets++;
		lc_pop(c);
	}
}

/* "fields": data fields the event's statements read, typed and bounded
 * as a set's are, kept in ev->sets with no column (lifecycle.h). */
static void parse_fields(struct lc_ctx *c, struct lc_event *ev, json_t *obj)
{
	const char *name;
	json_t *spec;

	if (!json_is_object(obj)) {
		lc_err(c, "\"fields\" maps a data field the statements read to its type, like "
		          "{\"amount_cents\": {\"type\": \"integer\", \"required\": true}}");
		return;
	}
	json_object_foreach(obj, name, spec) {
		struct lc_set *st;
		bool twice = false;

		lc_push_key(c, name);
		if (ev->nsets >= LC_MAX_SETS) {
			lc_err(c, "more than %d columns and fields of one event: declare fewer", LC_MAX_SETS);
			lc_pop(c);
			continue;
		}
		if (!ident_ok(name)) {
			lc_err(c, "field \"%s\" must be a lower-case name ([a-z][a-z0-9_]*, at most 64), like \"amount_cents\"",
			       name);
			lc_pop(c);
			continue;
		}
		for (int k = 0; k < ev->nsets && !twice; k++)
			twice = ev->sets[k].src == LC_SRC_DATA && strcmp(ev->sets[k].field, name) == 0;
		if (twice) {
			lc_err(c, "field \"%s\" is declared twice: a set's \"from\": \"data.%s\" declares it already; "
			          "remove it here", name, name);
			lc_pop(c);
			continue;
		}
		if (!json_is_object(spec)) {
			lc_err(c, "say what \"%s\" is, like {\"type\": \"integer\", \"required\": true}", name);
			lc_pop(c);
			continue;
		}
		st = &ev->sets[ev->nsets];
		memset(st, 0, sizeof *st);
		parse_value_spec(c, st, spec, name, true);
		ev->nsets++;
		lc_pop(c);
	}
}

static void parse_after(struct lc_ctx *c, struct lc_event *ev, json_t *obj)
{
	const char *sname;
	json_t *v;

	if (!json_is_object(obj)) {
		lc_err(c, "\"after\" maps a terminal state to what the event does there, like "
		       "{\"Cancelled\": \"ignore\"}");
		return;
	}
	json_object_foreach(obj, sname, v) {
		int s = lc_state_index(c->def, sname);

		lc_push_key(c, sname);
		if (s <= 0) {
			lc_err(c, "\"%s\" is not a state of the definition", sname);
			lc_pop(c);
			continue;
		}
		if (!(c->def->terminal & (1u << s)) && !lc_sequenced(c->def) && !json_is_string(v)) {
			lc_err(c, "\"%s\" is not a terminal state: before one, an event may only be \"ignore\" or "
			       "\"invalid-transition\" (a compensation too, in a definition whose producer numbers its "
			       "events: \"sequence\")", sname);
			lc_pop(c);
			continue;
		}
		if (ev->from & (1u << s)) {
			lc_err(c, "\"%s\" moves from \"%s\": \"after\" names states it does not apply in", ev->type, sname);
			lc_pop(c);
			continue;
		}
		if (json_is_string(v) && strcmp(json_string_value(v), "ignore") == 0) {
			ev->after[s] = LC_AFTER_IGNORE;
		} else if (json_is_string(v) && strcmp(json_string_value(v), "invalid-transition") == 0) {
			ev->after[s] = LC_AFTER_INVALID;
		} else if (json_is_object(v) && json_object_get(v, "compensate") != NULL) {
			static const char *const keys[] = { "compensate", "statements", NULL };

			lc_known_keys(c, v, keys, "a compensation after a terminal state");
			ev->after[s] = LC_AFTER_COMPENSATE;
			lc_push_key(c, "compensate");
			ev->after_emits[s] = emit_list(c, json_object_get(v, "compensate"), "compensate");
			lc_pop(c);
		} else if (json_is_object(v) && json_object_get(v, "statements") != NULL) {
			lc_err(c, "statements after a terminal state run when the event compensates: write "
			          "{\"compensate\": [event types to emit, or none], \"statements\": [...]}");
		} else {
			lc_err(c, "write \"ignore\", \"invalid-transition\" or {\"compensate\": [event types to emit]}");
		}
		lc_pop(c);
	}
}

static void parse_event(struct lc_ctx *c, struct lc_event *ev, json_t *obj)
{
	static const char *const keys[] = { "type", "aliases", "creates", "from", "to", "emits",
		                                "compensations", "after", "sets", "fields", "statements", NULL };
	json_t *v;

	ev->mark = -1;
	ev->line = lc_here_line(c);
	if (!json_is_object(obj)) {
		lc_err(c, "an event is an object, like {\"type\": \"OrderPaid\", \"from\": [\"Created\"], \"to\": \"Paid\"}");
		return;
	}
	lc_known_keys(c, obj, keys, "an event");
	get_name(c, obj, "type", ev->type, false, "PaymentAuthorized");
	v = json_object_get(obj, "aliases");
	if (v != NULL) {
		size_t i;
		json_t *a;

		lc_push_key(c, "aliases");
		if (!json_is_array(v) || json_array_size(v) > LC_MAX_ALIASES)
			lc_err(c, "\"aliases\" is a list of at most %d other names of this event, like [\"PaymentConfirmed\"]",
			    LC_MAX_ALIASES);
		else
			json_array_foreach(v, i, a) {
				lc_push_index(c, (int)i);
				if (!json_is_string(a) || !name_ok(json_string_value(a)))
					lc_err(c, "an alias is a name (a letter, then letters, digits or _), like \"PaymentConfirmed\"");
				else
					copy_name(ev->aliases[ev->naliases++], json_string_value(a));
				lc_pop(c);
			}
		lc_pop(c);
	}
	v = json_object_get(obj, "creates");
	if (v != NULL) {
		lc_push_key(c, "creates");
		ev->creates = state_ref(c, v);
		if (ev->creates > 0 && (c->def->terminal & (1u << ev->creates)))
			lc_err(c, "an aggregate cannot be created in the terminal state \"%s\": create it in the first "
			       "state of \"main_path\"", c->def->states[ev->creates]);
		if (ev->creates < 0)
			ev->creates = 0;
		ev->to = ev->creates;
		lc_pop(c);
		if (json_object_get(obj, "from") != NULL || json_object_get(obj, "to") != NULL)
			lc_err(c, "a creation event (\"creates\") has no \"from\" or \"to\": remove them, or remove \"creates\"");
	} else {
		v = json_object_get(obj, "from");
		if (v == NULL) {
			lc_err(c, "missing \"from\": write the states it moves from, like \"from\": [\"%s\"] "
			       "(or \"creates\": \"%s\" for the event that creates the aggregate)",
			    c->def->states[1], c->def->states[1]);
		} else {
			lc_push_key(c, "from");
			ev->from = state_list(c, v, "from");
			for (int s = 1; s < c->def->nstates; s++) {
				if ((ev->from & (1u << s)) && (c->def->terminal & (1u << s))) {
					lc_err(c, "\"%s\" is terminal: an event does not move out of it; to say what \"%s\" does "
					       "there, write \"after\": {\"%s\": \"ignore\" | \"invalid-transition\" | "
					       "{\"compensate\": [...]}}", c->def->states[s], ev->type, c->def->states[s]);
					ev->from &= ~(1u << s);
				}
			}
			lc_pop(c);
		}
		v = json_object_get(obj, "to");
		if (v == NULL) {
			lc_err(c, "missing \"to\": write the state it moves to, like \"to\": \"%s\"", c->def->states[1]);
		} else {
			lc_push_key(c, "to");
			ev->to = state_ref(c, v);
			if (ev->to < 0)
				ev->to = 0;
			lc_pop(c);
		}
	}
	v = json_object_get(obj, "emits");
	if (v != NULL) {
		lc_push_key(c, "emits");
		ev->emits = emit_list(c, v, "emits");
		lc_pop(c);
	}
	v = json_object_get(obj, "after");
	if (v != NULL) {
		lc_push_key(c, "after");
		parse_after(c, ev, v);
		lc_pop(c);
	}
	v = json_object_get(obj, "sets");
	if (v != NULL) {
		lc_push_key(c, "sets");
		parse_sets(c, ev, v);
		lc_pop(c);
	}
	v = json_object_get(obj, "fields");
	if (v != NULL) {
		lc_push_key(c, "fields");
		parse_fields(c, ev, v);
		lc_pop(c);
	}
}

/* "compensations" name other events, so they are read once all are known. */
static void parse_compensations(struct lc_ctx *c, int evi, json_t *obj)
{
	struct lc_def *d = c->def;
	struct lc_event *ev = &d->events[evi];
	json_t *arr = json_object_get(obj, "compensations"), *v;
	size_t i;

	if (arr == NULL)
		return;
	lc_push_key(c, "compensations");
	if (ev->to <= 0 || !(d->terminal & (1u << ev->to))) {
		lc_err(c, "only a transition into a terminal state owes compensations: remove \"compensations\", "
		       "or make \"to\" a terminal state");
		lc_pop(c);
		return;
	}
	if (!json_is_array(arr)) {
		lc_err(c, "\"compensations\" is a list like [{\"if_took_effect\": \"PaymentAuthorized\", "
		       "\"emit\": \"RefundRequested\"}]");
		lc_pop(c);
		return;
	}
	json_array_foreach(arr, i, v) {
		static const char *const keys[] = { "if_took_effect", "emit", NULL };
		json_t *iff = json_object_get(v, "if_took_effect"), *em = json_object_get(v, "emit");
		int target = -1, e;

		lc_push_index(c, (int)i);
		if (!json_is_object(v) || iff == NULL || em == NULL) {
			lc_err(c, "a compensation is {\"if_took_effect\": \"<event type>\", \"emit\": \"<event type to emit>\"}");
			lc_pop(c);
			continue;
		}
		lc_known_keys(c, v, keys, "a compensation");
		lc_push_key(c, "if_took_effect");
		if (json_is_string(iff))
			target = lc_event_find(d, json_string_value(iff));
		if (target < 0 || target == evi)
			lc_err(c, "\"if_took_effect\" names another event type of this file, like \"%s\"",
			    d->events[evi == 0 ? (d->nevents > 1 ? 1 : 0) : 0].type);
		lc_pop(c);
		lc_push_key(c, "emit");
		e = emit_ref(c, em);
		lc_pop(c);
		if (target >= 0 && target != evi && e >= 0 && ev->ncomp < LC_MAX_EMITS) {
			ev->comp[ev->ncomp].mark = target; /* an event index until marks are numbered */
			ev->comp[ev->ncomp].emit = e;
			ev->ncomp++;
		}
		lc_pop(c);
	}
	lc_pop(c);
}

static int path_pos(const struct lc_def *d, int s)
{
	for (int i = 0; i < d->npath; i++) {
		if (d->path[i] == s)
			return i;
	}
	return -1;
}

/* The table of a sequenced definition: the number says the event is
 * next, so nothing is held or stale by the states.  An event applies in
 * a state it moves from; anywhere else it does what its "after" says for
 * that state, and without a word it is an invalid transition.  A second
 * creation is one too. */
static void compile_sequenced(struct lc_def *d)
{
	for (int e = 0; e < d->nevents; e++) {
		const struct lc_event *ev = &d->events[e];

		for (int s = 0; s < d->nstates; s++) {
			struct lc_rule *r = &d->rules[s][e];

			r->next = s;
			r->emits = 0;
			if (s == 0 && ev->creates > 0) {
				r->decision = LC_APPLY;
				r->next = ev->creates;
			} else if (s == 0) {
				r->decision = LC_HOLD; /* before its creation: number 1 is the creation */
			} else if (ev->creates == 0 && (ev->from & (1u << s))) {
				r->decision = LC_APPLY;
				r->next = ev->to;
			} else if (ev->after[s] == LC_AFTER_IGNORE) {
				r->decision = LC_IGNORE;
			} else if (ev->after[s] == LC_AFTER_COMPENSATE) {
				r->decision = LC_COMPENSATE;
				r->emits = ev->after_emits[s];
			} else {
				r->decision = LC_INVALID;
			}
		}
	}
}

/* Fill rules[s][e] by the rules in the header comment. */
static void compile(struct lc_ctx *c)
{
	struct lc_def *d = c->def;

	if (lc_sequenced(d)) {
		compile_sequenced(d);
		return;
	}

	for (int e = 0; e < d->nevents; e++) {
		const struct lc_event *ev = &d->events[e];
		int to_pos = path_pos(d, ev->to);

		for (int s = 0; s < d->nstates; s++) {
			struct lc_rule *r = &d->rules[s][e];
			int s_pos = path_pos(d, s);

			r->next = s;
			r->emits = 0;
			if (s == 0) {
				r->decision = ev->creates > 0 ? LC_APPLY : LC_HOLD;
				r->next = ev->creates > 0 ? ev->creates : 0;
			} else if (d->terminal & (1u << s)) {
				switch (ev->after[s]) {
				case LC_AFTER_IGNORE:
					r->decision = LC_IGNORE;
					break;
				case LC_AFTER_INVALID:
					r->decision = LC_INVALID;
					break;
				case LC_AFTER_COMPENSATE:
					r->decision = LC_COMPENSATE;
					r->emits = ev->after_emits[s];
					break;
				case LC_AFTER_AUTO:
					if (ev->creates > 0 || ev->to == s || (s_pos >= 0 && to_pos >= 0 && to_pos <= s_pos)) {
						r->decision = LC_IGNORE;
						break;
					}
					r->decision = LC_INVALID;
					err_line(c->errs, ev->line, 0,
					         "\"%s\" can arrive after the terminal state \"%s\" and nothing says what it "
					         "does there: write \"after\": {\"%s\": \"ignore\"} (or \"invalid-transition\", or "
					         "{\"compensate\": [event types to emit]})",
					         ev->type, d->states[s], d->states[s]);
					break;
				}
			} else if (ev->creates > 0) {
				r->decision = LC_IGNORE;
			} else if (ev->from & (1u << s)) {
				r->decision = LC_APPLY;
				r->next = ev->to;
			} else if (ev->after[s] == LC_AFTER_IGNORE) {
				/* said for a state before the terminal ones: the
				 * arrival-order check proves it or says which orders
				 * differ */
				r->decision = LC_IGNORE;
			} else if (ev->after[s] == LC_AFTER_INVALID) {
				r->decision = LC_INVALID;
			} else if (to_pos >= 0 && s_pos >= 0 && to_pos <= s_pos) {
				r->decision = LC_IGNORE;
			} else {
				bool later = false;

				for (int f = 1; f < d->nstates; f++) {
					if ((ev->from & (1u << f)) && path_pos(d, f) >= s_pos)
						later = true;
				}
				r->decision = LC_HOLD;
				if (!later && ev->from != 0)
					err_line(c->errs, ev->line, 0,
					         "\"%s\" arriving in \"%s\" could never apply (its \"from\" states all come "
					         "before \"%s\" on the main path) and would be held until it expires: "
					         "add \"%s\" to its \"from\", or move its target",
					         ev->type, d->states[s], d->states[s], d->states[s]);
			}
		}
	}
}

/* The aggregate's names: its own, its table's and its key's. */
static void parse_names(struct lc_ctx *c, json_t *root)
{
	struct lc_def *d = c->def;

	if (get_name(c, root, "aggregate", d->aggregate, true, "order") && strlen(d->aggregate) > LC_NAME_MAX - 7) {
		lc_push_key(c, "aggregate");
		lc_err(c, "\"aggregate\" is at most %d characters, so that its ledger %s_events is a SQL name: shorten it",
		    LC_NAME_MAX - 7, d->aggregate);
		lc_pop(c);
	}
	if (get_name(c, root, "table", d->table, true, "orders") && d->aggregate[0] != '\0') {
		char ledger[LC_NAME_MAX + 16], locks[LC_NAME_MAX + 16];

		snprintf(ledger, sizeof ledger, "%s_events", d->aggregate);
		snprintf(locks, sizeof locks, "%s_locks", d->aggregate);
		if (strcmp(d->table, ledger) == 0 || strcmp(d->table, locks) == 0) {
			lc_push_key(c, "table");
			lc_err(c, "\"%s\" is the name of the aggregate's ledger or lock table: name the table otherwise, "
			       "like \"%ss\"", d->table, d->aggregate);
			lc_pop(c);
		}
	}
	if (get_name(c, root, "key", d->key, true, "order_id")) {
		static const char *const taken[] = { "id", "consumer", "source", "message_id", "type", "outcome",
			                             "from_status", "to_status", "version", "applied_at",
			                             "payload_sha256", "held", NULL };
		for (int k = 0; taken[k] != NULL; k++) {
			if (strcmp(d->key, taken[k]) == 0) {
				lc_push_key(c, "key");
				lc_err(c, "\"%s\" is a column of the ledger already: name the key otherwise, like \"%s_id\"",
				    d->key, d->aggregate[0] ? d->aggregate : "order");
				lc_pop(c);
			}
		}
	}
}

/* "states"; false when there are none to name (everything else names
 * states, so nothing more is read). */
static bool parse_states(struct lc_ctx *c, json_t *root)
{
	struct lc_def *d = c->def;
	json_t *v, *x;
	size_t i;

	d->nstates = 1;
	d->states[0][0] = '\0';
	v = json_object_get(root, "states");
	lc_push_key(c, "states");
	if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) >= LC_MAX_STATES) {
		lc_err(c, "\"states\" is a list of 1 to %d state names, like [\"Created\", \"Paid\", \"Cancelled\"]",
		    LC_MAX_STATES - 1);
		lc_pop(c);
		return false; /* everything else names states */
	}
	json_array_foreach(v, i, x) {
		lc_push_index(c, (int)i);
		if (!json_is_string(x) || !name_ok(json_string_value(x)))
			lc_err(c, "a state is a name (a letter, then letters, digits or _, at most 64), like \"Created\"");
		else if (lc_state_index(d, json_string_value(x)) > 0)
			lc_err(c, "state \"%s\" is declared twice: declare it once", json_string_value(x));
		else
			copy_name(d->states[d->nstates++], json_string_value(x));
		lc_pop(c);
	}
	lc_pop(c);
	return d->nstates >= 2;
}

/* "terminal" and "main_path", and every state on one of them. */
static void parse_path(struct lc_ctx *c, json_t *root)
{
	struct lc_def *d = c->def;
	json_t *v, *x;
	size_t i;

	v = json_object_get(root, "terminal");
	lc_push_key(c, "terminal");
	if (v == NULL)
		lc_err(c, "missing \"terminal\": write the states the lifecycle ends in, like \"terminal\": [\"%s\"]",
		    d->states[d->nstates - 1]);
	else
		d->terminal = state_list(c, v, "terminal");
	lc_pop(c);

	v = json_object_get(root, "main_path");
	lc_push_key(c, "main_path");
	if (!json_is_array(v) || json_array_size(v) == 0) {
		lc_err(c, "\"main_path\" is the states in the order the lifecycle normally goes through, like [\"%s\"]",
		    d->states[1]);
	} else {
		json_array_foreach(v, i, x) {
			int s;

			lc_push_index(c, (int)i);
			s = state_ref(c, x);
			if (s > 0 && path_pos(d, s) >= 0)
				lc_err(c, "\"%s\" is on the main path twice: list it once", d->states[s]);
			else if (s > 0 && (d->terminal & (1u << s)) && i + 1 != json_array_size(v))
				lc_err(c, "the terminal state \"%s\" can only end the main path: move it last, or out of "
				       "\"terminal\"", d->states[s]);
			else if (s > 0)
				d->path[d->npath++] = s;
			lc_pop(c);
		}
	}
	lc_pop(c);
	lc_push_key(c, "states");
	for (int s = 1; s < d->nstates; s++) {
		if (!(d->terminal & (1u << s)) && path_pos(d, s) < 0) {
			lc_push_index(c, s - 1);
			lc_err(c, "\"%s\" is neither on the main path nor terminal: add it to \"main_path\" or to \"terminal\"",
			    d->states[s]);
			lc_pop(c);
		}
	}
	lc_pop(c);
}

/* "events": each one, names unique across types and aliases, the
 * compensations (which name other events), and one event that creates;
 * false when there is no list of events to read. */
static bool parse_events(struct lc_ctx *c, json_t *root)
{
	struct lc_def *d = c->def;
	json_t *v, *x;
	size_t i;

	v = json_object_get(root, "events");
	lc_push_key(c, "events");
	if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > LC_MAX_EVENTS) {
		lc_err(c, "\"events\" is a list of 1 to %d event types, like [{\"type\": \"OrderCreated\", "
		       "\"creates\": \"%s\"}, ...]", LC_MAX_EVENTS, d->states[1]);
		lc_pop(c);
		return false;
	}
	d->nevents = (int)json_array_size(v);
	json_array_foreach(v, i, x) {
		lc_push_index(c, (int)i);
		parse_event(c, &d->events[i], x);
		lc_pop(c);
	}
	/* Names are unique across types and aliases: a message's type picks one. */
	for (int e = 0; e < d->nevents; e++) {
		for (int a = -1; a < d->events[e].naliases; a++) {
			const char *n = a < 0 ? d->events[e].type : d->events[e].aliases[a];

			for (int f = 0; f <= e && n[0] != '\0'; f++) {
				for (int b = -1; b < d->events[f].naliases; b++) {
					const char *m = b < 0 ? d->events[f].type : d->events[f].aliases[b];

					if ((f < e || b < a) && strcmp(n, m) == 0)
						err_line(c->errs, d->events[e].line, 0,
						         "the event name \"%s\" is used twice: each type and alias names one event",
						         n);
				}
			}
		}
	}
	json_array_foreach(v, i, x) {
		lc_push_index(c, (int)i);
		if (json_is_object(x))
			parse_compensations(c, (int)i, x);
		if (json_is_object(x))
			lc_parse_statements(c, (int)i, x);
		lc_pop(c);
	}
	lc_pop(c);
	{
		bool creator = false;

		for (int e = 0; e < d->nevents; e++)
			creator |= d->events[e].creates > 0;
		if (!creator)
			lc_err(c, "no event creates the aggregate: give one event \"creates\": \"%s\"",
			    d->npath > 0 ? d->states[d->path[0]] : d->states[1]);
	}
	return true;
}

static void assign_marks(struct lc_def *d)
{
	/* Marks: the events a compensation depends on, and those compensated
	 * themselves (so that the second one is stale), in file order. */
	for (int e = 0; e < d->nevents; e++) {
		bool needed = false;

		for (int s = 1; s < d->nstates; s++)
			needed |= d->events[e].after[s] == LC_AFTER_COMPENSATE;
		for (int f = 0; f < d->nevents; f++) {
			for (int k = 0; k < d->events[f].ncomp; k++)
				needed |= d->events[f].comp[k].mark == e;
		}
		if (needed) {
			d->events[e].mark = d->nmarks;
			d->marks[d->nmarks++] = e;
		}
	}
	for (int f = 0; f < d->nevents; f++) {
		for (int k = 0; k < d->events[f].ncomp; k++)
			d->events[f].comp[k].mark = d->events[d->events[f].comp[k].mark].mark;
	}
}

/* "sequence": {"from": "data.<field>"}: the producer numbers each
 * aggregate's events 1, 2, ... in that field (an integer the event must
 * carry, like a declared field); {"from": "cloudevents.sequence"}: in the
 * event's sequence attribute. */
static void parse_sequence(struct lc_ctx *c, json_t *root)
{
	static const char *const keys[] = { "from", NULL };
	json_t *v = json_object_get(root, "sequence"), *from;
	const char *f;

	if (v == NULL)
		return;
	lc_push_key(c, "sequence");
	if (!json_is_object(v)) {
		lc_err(c, "\"sequence\" says where the producer numbers each event: {\"from\": \"data.seq\"}");
		goto done;
	}
	lc_known_keys(c, v, keys, "\"sequence\"");
	from = json_object_get(v, "from");
	f = json_string_value(from);
	if (f != NULL && strcmp(f, "cloudevents.sequence") == 0) {
		snprintf(c->def->seq_field, sizeof c->def->seq_field, "sequence");
		c->def->seq_attr = true;
		goto done;
	}
	if (f != NULL && strncmp(f, "header.", 7) == 0) {
		if (!header_name_ok(f + 7)) {
			lc_push_key(c, "from");
			lc_err(c, "\"header.<name>\": the AMQP header's name, 1 to %d letters, digits and any of "
			       "\"-_.:\"", LC_NAME_MAX);
			lc_pop(c);
			goto done;
		}
		snprintf(c->def->seq_field, sizeof c->def->seq_field, "%s", f + 7);
		c->def->seq_header = true;
		goto done;
	}
	if (f == NULL || strncmp(f, "data.", 5) != 0 || !ident_ok(f + 5) || strlen(f + 5) > LC_NAME_MAX) {
		if (from != NULL)
			lc_push_key(c, "from");
		lc_err(c, "write \"from\": \"data.<field>\", the data field that carries the event's number in its "
		       "aggregate's sequence (1, 2, ...), \"cloudevents.sequence\", the event's sequence attribute, or "
		       "\"header.<name>\", an AMQP header of the delivery");
		if (from != NULL)
			lc_pop(c);
		goto done;
	}
	snprintf(c->def->seq_field, sizeof c->def->seq_field, "%s", f + 5);
done:
	lc_pop(c);
}

/* "version": what the rows and held events it decides remember it by.
 * Printable ASCII, so it reads as written in a log line and fits the
 * columns' ascii charset; no trailing space, which those columns' PAD
 * SPACE collation would compare equal to none ("2 " = "2"). */
static void parse_version(struct lc_ctx *c, json_t *root)
{
	json_t *v = json_object_get(root, "version");
	const char *s = json_string_value(v);
	size_t n = s != NULL ? json_string_length(v) : 0;
	bool ok = s != NULL && n >= 1 && n <= LC_VERSION_MAX && s[n - 1] != ' ';

	if (v == NULL)
		return;
	for (size_t i = 0; ok && i < n; i++)
		ok = s[i] >= 0x20 && s[i] <= 0x7e;
	if (!ok) {
		lc_push_key(c, "version");
		lc_err(c, "\"version\" is 1 to %d printable characters, like \"version\": \"2\" or \"2026-12-07\" "
		       "(none: the worker names the definition by a hash of its content)", LC_VERSION_MAX);
		lc_pop(c);
		return;
	}
	memcpy(c->def->version, s, n + 1);
	c->def->version_declared = true;
}

/* An undeclared version: the first LC_VERSION_HASH hex digits of the
 * SHA-256 of the definition re-serialised compact with sorted keys (as a
 * message's payload hash is), "version" left out, so whitespace and key
 * order are not an edit.  Removes "version" from root.  0, or -1 when
 * jansson or OpenSSL fails (out of memory). */
static int content_version(json_t *root, char out[LC_VERSION_MAX + 1])
{
	static const char hex[] = "0123456789abcdef";
	unsigned char sha[EVP_MAX_MD_SIZE];
	unsigned int n = 0;
	char *text;
	int rc = -1;

	(void)json_object_del(root, "version"); /* -1: it had none */
	text = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
	if (text == NULL)
		return -1;
	if (EVP_Digest(text, strlen(text), sha, &n, EVP_sha256(), NULL) == 1 && n * 2 >= LC_VERSION_HASH) {
		for (int i = 0; i < LC_VERSION_HASH; i++)
			out[i] = hex[(sha[i / 2] >> (i % 2 ? 0 : 4)) & 0xf];
		out[LC_VERSION_HASH] = '\0';
		rc = 0;
	}
	free(text);
	return rc;
}

static void parse_top(struct lc_ctx *c, json_t *root)
{
	static const char *const keys[] = { "lifecycle", "version", "aggregate", "table", "key", "states", "main_path",
		                                "terminal", "events", "destinations", "deliver", "sequence", NULL };
	char why[320];
	json_t *v;
	int line;

	if (!json_is_object(root)) {
		lc_err(c, "a definition is one JSON object: {\"lifecycle\": 1, \"aggregate\": ..., \"states\": [...], ...}");
		return;
	}
	lc_known_keys(c, root, keys, "the definition");
	v = json_object_get(root, "lifecycle");
	if (!json_is_integer(v) || json_integer_value(v) != 1) {
		if (v != NULL)
			lc_push_key(c, "lifecycle");
		lc_err(c, "the format version is 1: write \"lifecycle\": 1");
		if (v != NULL)
			lc_pop(c);
	}
	parse_version(c, root);
	parse_names(c, root);
	parse_sequence(c, root);
	if (!parse_states(c, root))
		return;
	parse_path(c, root);
	if (!parse_events(c, root))
		return;
	if (c->errs->n == 0 && lc_emit_split(c->def, why, sizeof why, &line) != 0) {
		err_line(c->errs, line, 0, "%s", why);
		return;
	}
	if (c->errs->n == 0)
		lc_parse_destinations(c, root);
	assign_marks(c->def);
}

struct lc_def *lc_load(const char *text, size_t len, struct lc_errors *errs)
{
	struct lc_ctx c = { text, len, errs, { 0, { { NULL, 0 } } }, NULL };
	json_error_t jerr;
	json_t *root = NULL;

	memset(errs, 0, sizeof *errs);
	if (len > LC_FILE_MAX) {
		err_line(errs, 0, 0, "the definition is %zu bytes, more than %d: a definition is a page", len, LC_FILE_MAX);
		return NULL;
	}
	root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	if (root == NULL) {
		err_line(errs, jerr.line, jerr.column, "not valid JSON: %s", jerr.text);
		return NULL;
	}
	c.def = calloc(1, sizeof *c.def);
	if (c.def == NULL) {
		err_line(errs, 0, 0, "out of memory reading the definition");
		goto cleanup;
	}
	parse_top(&c, root);
	if (errs->n == 0)
		compile(&c);
	if (errs->n == 0 && !c.def->version_declared && content_version(root, c.def->version) != 0)
		err_line(errs, 0, 0, "out of memory computing the definition's version");
cleanup:
	json_decref(root);
	if (errs->n > 0) {
		free(c.def);
		return NULL;
	}
	return c.def;
}

struct lc_def *lc_load_builtin(struct lc_errors *errs)
{
	struct lc_def *d = lc_load(lc_builtin_order, lc_builtin_order_len, errs);

	if (d != NULL && !d->version_declared)
		snprintf(d->version, sizeof d->version, "%s", LC_BUILTIN_ORDER_VERSION);
	return d;
}

struct lc_def *lc_load_file(const char *path, struct lc_errors *errs)
{
	struct lc_def *def = NULL;
	char *buf = NULL;
	size_t n = 0;
	FILE *f;

	memset(errs, 0, sizeof *errs);
	f = fopen(path, "rb");
	if (f == NULL) {
		err_line(errs, 0, 0, "cannot open: %s", strerror(errno));
		return NULL;
	}
	buf = malloc(LC_FILE_MAX + 1);
	if (buf == NULL) {
		err_line(errs, 0, 0, "out of memory reading the definition");
		goto cleanup;
	}
	n = fread(buf, 1, LC_FILE_MAX + 1, f);
	if (ferror(f)) {
		err_line(errs, 0, 0, "cannot read: %s", strerror(errno));
		goto cleanup;
	}
	def = lc_load(buf, n, errs);
cleanup:
	free(buf);
	fclose(f);
	return def;
}

void lc_free(struct lc_def *def)
{
	free(def);
}

void lc_errors_print(const struct lc_errors *errs, const char *name, FILE *f)
{
	for (int i = 0; i < errs->n; i++) {
		if (errs->e[i].line > 0 && errs->e[i].column > 0)
			fprintf(f, "%s:%d:%d: %s\n", name, errs->e[i].line, errs->e[i].column, errs->e[i].text);
		else if (errs->e[i].line > 0)
			fprintf(f, "%s:%d: %s\n", name, errs->e[i].line, errs->e[i].text);
		else
			fprintf(f, "%s: %s\n", name, errs->e[i].text);
	}
	if (errs->more)
		fprintf(f, "%s: more errors not shown: fix these first\n", name);
}
