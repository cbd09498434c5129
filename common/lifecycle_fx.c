/*
 * lifecycle_fx.c - a definition's own SQL statement read (lifecycle_fx.h).
 *
 * Not a parser of SQL: a scanner that knows MariaDB's quoting (strings in
 * ' and " with backslash escapes and doubled quotes, identifiers in
 * backticks), so that it can tell a parameter from text and find what
 * must not be there, and a reading of the token stream just deep enough
 * to say what kind of statement it is, which table it writes and whether
 * its assignments add to themselves.  Whatever this lets through, the
 * server still prepares before anything runs (the caller's), and
 * whatever it cannot prove commutes it says so, never the other way.
 *
 * The same token stream gives a statement that commutes its shape
 * (lifecycle_fx.h), read once here rather than by each checker: only the
 * forms simple enough that what they wrote follows from their text, so
 * that a checker never predicts rows from a statement it misread.
 */
#include "lifecycle_fx.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define FX_TOKENS 512
#define FX_ASSIGNED 16

enum tok_type { T_WORD, T_QWORD, T_STR, T_NUM, T_PARAM, T_CLOCK, T_PUNCT };

struct tok {
	enum tok_type type;
	const char *p; /* into the text; for T_QWORD without the backticks */
	size_t len;
};

struct fx_scan {
	const char *text;
	struct lc_fx *out;
	size_t olen;
	struct tok t[FX_TOKENS];
	int n;
	char *err;
	size_t cap;
	bool failed;
};

static void fail(struct fx_scan *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct fx_scan *s, const char *fmt, ...)
{
	va_list ap;

	if (s->failed)
		return;
	s->failed = true;
	va_start(ap, fmt);
	vsnprintf(s->err, s->cap, fmt, ap);
	va_end(ap);
}

static void emit(struct fx_scan *s, const char *p, size_t len)
{
	if (s->olen + len + 1 > sizeof s->out->sql) {
		fail(s, "the statement is longer than %zu bytes: make it shorter", sizeof s->out->sql - 1);
		return;
	}
	memcpy(s->out->sql + s->olen, p, len);
	s->olen += len;
	s->out->sql[s->olen] = '\0';
}

static void token(struct fx_scan *s, enum tok_type type, const char *p, size_t len)
{
	if (s->n >= FX_TOKENS) {
		fail(s, "the statement has more than %d words and signs: make it shorter", FX_TOKENS);
		return;
	}
	s->t[s->n++] = (struct tok){ type, p, len };
}

static bool word_char(char c)
{
	return isalnum((unsigned char)c) || c == '_' || c == '$';
}

/* A quoted string or identifier from text[i] (the quote): the index just
 * past its closing quote, or 0 when it is not closed. */
static size_t quoted(const char *text, size_t i)
{
	char q = text[i];

	for (size_t j = i + 1; text[j] != '\0'; j++) {
		if (q != '`' && text[j] == '\\' && text[j + 1] != '\0') {
			j++;
		} else if (text[j] == q) {
			if (text[j + 1] != q)
				return j + 1;
			j++; /* a doubled quote stands for itself */
		}
	}
	return 0;
}

static void param(struct fx_scan *s, const char *name, size_t len, lc_fx_names_fn names, void *arg)
{
	struct lc_fx_param p;

	if (len == sizeof "applied_at" - 1 && memcmp(name, "applied_at", len) == 0) {
		emit(s, "NOW(6)", 6);
		token(s, T_CLOCK, name, len);
		return;
	}
	if (names(arg, name, len, &p) != 0) {
		fail(s, "\":%.*s\" names no parameter this event declares: declare a data field in \"fields\" "
		        "(or \"sets\"), or write :message_id, :source, :type, the aggregate's key, :occurred_at "
		        "or :applied_at", (int)len, name);
		return;
	}
	if (s->out->nparams >= LC_FX_PARAMS) {
		fail(s, "more than %d parameters in one statement: split it", LC_FX_PARAMS);
		return;
	}
	s->out->params[s->out->nparams++] = p;
	if (p.src == LC_FX_MESSAGE_ID)
		s->out->keyed = true;
	emit(s, "?", 1);
	token(s, T_PARAM, name, len);
}

static void scan(struct fx_scan *s, lc_fx_names_fn names, void *arg)
{
	const char *t = s->text;
	size_t i = 0, j;

	while (t[i] != '\0' && !s->failed) {
		char c = t[i];

		if (isspace((unsigned char)c)) {
			emit(s, &t[i++], 1);
		} else if (c == '\'' || c == '"' || c == '`') {
			j = quoted(t, i);
			if (j == 0) {
				fail(s, "a quote (%c) that is not closed: close it", c);
				return;
			}
			emit(s, &t[i], j - i);
			token(s, c == '`' ? T_QWORD : T_STR, c == '`' ? &t[i + 1] : &t[i], c == '`' ? j - i - 2 : j - i);
			i = j;
		} else if (c == '#' || (c == '-' && t[i + 1] == '-') || (c == '/' && t[i + 1] == '*')) {
			fail(s, "a comment: write the statement without comments (MariaDB runs what some of them hold)");
		} else if (c == ';') {
			fail(s, "one statement per string: write each statement as a string of its own in \"statements\"");
		} else if (c == '?') {
			fail(s, "write a named parameter (:data.<field>, :message_id, ...) instead of ?");
		} else if (c == '@') {
			fail(s, "an @variable: write a named parameter instead (a variable carries a value from one "
			        "message to the next)");
		} else if (c == ':' && t[i + 1] == '=') {
			fail(s, "\":=\" assigns a variable: compare or assign with \"=\"");
		} else if (c == ':' && (isalpha((unsigned char)t[i + 1]) || t[i + 1] == '_')) {
			for (j = i + 1; word_char(t[j]) || t[j] == '.'; j++)
				;
			param(s, &t[i + 1], j - i - 1, names, arg);
			i = j;
		} else if (word_char(c)) {
			enum tok_type type = isdigit((unsigned char)c) ? T_NUM : T_WORD;

			for (j = i; word_char(t[j]) || (type == T_NUM && t[j] == '.'); j++)
				;
			emit(s, &t[i], j - i);
			token(s, type, &t[i], j - i);
			i = j;
		} else {
			emit(s, &t[i], 1);
			token(s, T_PUNCT, &t[i], 1);
			i++;
		}
	}
}

static bool is_word(const struct tok *k, const char *w)
{
	return k->type == T_WORD && k->len == strlen(w) && strncasecmp(k->p, w, k->len) == 0;
}

static bool is_punct(const struct tok *k, char c)
{
	return k->type == T_PUNCT && k->p[0] == c;
}

static bool is_name(const struct tok *k)
{
	return k->type == T_WORD || k->type == T_QWORD;
}

static bool same_name(const struct tok *a, const struct tok *b)
{
	return is_name(a) && is_name(b) && a->len == b->len && strncasecmp(a->p, b->p, a->len) == 0;
}

static void why(struct lc_fx *fx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void why(struct lc_fx *fx, const char *fmt, ...)
{
	va_list ap;

	fx->commutes = false;
	va_start(ap, fmt);
	vsnprintf(fx->why, sizeof fx->why, fmt, ap);
	va_end(ap);
}

/* An UPDATE's SET list from token i: every assignment "x = x + ..." or
 * "x = x - ..." whose right side names no column, and a WHERE that reads
 * none of the columns added to. */
static void judge_update(const struct fx_scan *s, int i, struct lc_fx *fx)
{
	const struct tok *assigned[FX_ASSIGNED];
	int nassigned = 0, depth = 0;

	for (; i < s->n && !is_word(&s->t[i], "SET"); i++) {
		if (is_punct(&s->t[i], ',') || is_word(&s->t[i], "JOIN")) {
			why(fx, "an UPDATE of several tables: the check cannot tell what it adds to");
			return;
		}
	}
	for (i++; i < s->n;) {
		const struct tok *col = NULL;
		int eq = -1, end;

		for (end = i; end < s->n; end++) {
			const struct tok *k = &s->t[end];

			depth += is_punct(k, '(') - is_punct(k, ')');
			if (depth == 0 && (is_punct(k, ',') || is_word(k, "WHERE") || is_word(k, "ORDER") ||
			                   is_word(k, "LIMIT")))
				break;
			if (eq < 0 && is_punct(k, '='))
				eq = end;
		}
		if (eq > i && is_name(&s->t[eq - 1]))
			col = &s->t[eq - 1];
		if (col == NULL || eq + 2 >= end || !same_name(&s->t[eq + 1], col) ||
		    !(is_punct(&s->t[eq + 2], '+') || is_punct(&s->t[eq + 2], '-'))) {
			const struct tok *c = col != NULL ? col : &s->t[i];

			why(fx, "SET %.*s = ...: whichever message arrives last decides %.*s; write it as an addition "
			        "(%.*s = %.*s + ...), or let the producer number its events", (int)c->len, c->p,
			    (int)c->len, c->p, (int)c->len, c->p, (int)c->len, c->p);
			return;
		}
		for (int k = eq + 3; k < end; k++) {
			if (is_name(&s->t[k])) {
				why(fx, "SET %.*s = %.*s +/- an expression that reads %.*s: add a parameter or a number",
				    (int)col->len, col->p, (int)col->len, col->p, (int)s->t[k].len, s->t[k].p);
				return;
			}
		}
		if (nassigned < FX_ASSIGNED)
			assigned[nassigned++] = col;
		i = end;
		if (i >= s->n || !is_punct(&s->t[i], ','))
			break;
		i++;
	}
	for (; i < s->n; i++) {
		if (is_word(&s->t[i], "ORDER") || is_word(&s->t[i], "LIMIT")) {
			why(fx, "ORDER BY or LIMIT picks rows by their order: the order of arrival decides which");
			return;
		}
		for (int a = 0; a < nassigned; a++) {
			if (same_name(&s->t[i], assigned[a])) {
				why(fx, "the WHERE reads %.*s, which the statement adds to: the order of arrival decides "
				        "which rows match", (int)assigned[a]->len, assigned[a]->p);
				return;
			}
		}
	}
}

static void judge(const struct fx_scan *s, int table_at, bool ignore, struct lc_fx *fx)
{
	fx->commutes = true;
	fx->why[0] = '\0';
	if (ignore) {
		why(fx, "IGNORE keeps whichever row came first and drops the error: write it without IGNORE");
		return;
	}
	switch (fx->kind) {
	case LC_FX_REPLACE:
		why(fx, "REPLACE overwrites a row: whichever message arrives last decides what it holds");
		return;
	case LC_FX_DELETE:
		why(fx, "DELETE removes rows another event may write: the order of arrival decides what is left");
		return;
	case LC_FX_INSERT:
		for (int i = table_at; i < s->n; i++) {
			if (is_word(&s->t[i], "DUPLICATE")) {
				why(fx, "ON DUPLICATE KEY UPDATE: a second message changes what the first one wrote");
				return;
			}
		}
		if (!fx->keyed)
			why(fx, "an INSERT not keyed by :message_id: bind :message_id into a unique column, so that "
			        "each message's row is its own");
		return;
	case LC_FX_UPDATE:
		judge_update(s, table_at, fx);
		return;
	}
}

/* The index into params of the parameter token k: the parameters were
 * appended in the order of their tokens. */
static int param_index(const struct fx_scan *s, int k)
{
	int n = 0;

	for (int j = 0; j < k; j++)
		n += s->t[j].type == T_PARAM;
	return n;
}

/* A name token into out without its backticks; false when too long. */
static bool copy_name(const struct tok *k, char *out, size_t cap)
{
	if (!is_name(k) || k->len >= cap)
		return false;
	memcpy(out, k->p, k->len);
	out[k->len] = '\0';
	return true;
}

/* A quoted string's text as the server reads it (doubled quotes and
 * backslash escapes undone); false when it does not fit or holds a NUL,
 * which a C string cannot compare. */
static bool unquote(const struct tok *k, char *out, size_t cap)
{
	char q = k->p[0];
	size_t o = 0;

	for (size_t i = 1; i + 1 < k->len; i++) {
		char c = k->p[i], pre = '\0';

		if (c == '\\' && i + 2 < k->len) {
			c = k->p[++i];
			switch (c) {
			case 'n': c = '\n'; break;
			case 't': c = '\t'; break;
			case 'r': c = '\r'; break;
			case 'b': c = '\b'; break;
			case 'Z': c = '\x1a'; break;
			case '0': return false;
			case '%': case '_': pre = '\\'; break; /* the server keeps these two escapes as written */
			default: break;
			}
		} else if (c == q) {
			i++; /* a doubled quote (quoted() let no single one through) */
		}
		if (o + 2 >= cap)
			return false;
		if (pre != '\0')
			out[o++] = pre;
		out[o++] = c;
	}
	out[o] = '\0';
	return true;
}

/* The value at token *k (a parameter, :applied_at, a number with an
 * optional minus, a quoted string) into v, *k moved past it; false for
 * anything else, an expression above all. */
static bool shape_value(const struct fx_scan *s, int *k, struct lc_fx_value *v)
{
	const struct tok *t;
	bool neg = false;

	memset(v, 0, sizeof *v);
	v->param = -1;
	if (*k >= s->n)
		return false;
	t = &s->t[*k];
	if (is_punct(t, '-') && *k + 1 < s->n && s->t[*k + 1].type == T_NUM) {
		neg = true;
		t = &s->t[++*k];
	}
	switch (t->type) {
	case T_PARAM:
		v->kind = LC_FX_VAL_PARAM;
		v->param = param_index(s, *k);
		break;
	case T_CLOCK:
		v->kind = LC_FX_VAL_CLOCK;
		break;
	case T_NUM:
		if (t->len + 2 > sizeof v->text)
			return false;
		v->kind = LC_FX_VAL_NUMBER;
		snprintf(v->text, sizeof v->text, "%s%.*s", neg ? "-" : "", (int)t->len, t->p);
		break;
	case T_STR:
		v->kind = LC_FX_VAL_STRING;
		if (!unquote(t, v->text, sizeof v->text))
			return false;
		break;
	default:
		return false;
	}
	++*k;
	return true;
}

/* INSERT ... t (c, ...) VALUES (v, ...) from token i (just past the
 * table), the statement's end right after the row. */
static bool shape_insert(const struct fx_scan *s, int i, struct lc_fx *fx)
{
	int ncols = 0;

	if (i >= s->n || !is_punct(&s->t[i], '('))
		return false;
	for (i++;; i++) {
		if (i >= s->n || ncols >= LC_FX_COLS || !copy_name(&s->t[i], fx->cols[ncols].name, sizeof fx->cols[0].name))
			return false;
		ncols++;
		if (++i >= s->n || !is_punct(&s->t[i], ','))
			break;
	}
	if (i + 2 >= s->n || !is_punct(&s->t[i], ')') ||
	    !(is_word(&s->t[i + 1], "VALUES") || is_word(&s->t[i + 1], "VALUE")) || !is_punct(&s->t[i + 2], '('))
		return false;
	i += 3;
	for (int c = 0; c < ncols; c++) {
		if (c > 0 && (i >= s->n || !is_punct(&s->t[i++], ',')))
			return false;
		if (!shape_value(s, &i, &fx->cols[c].v))
			return false;
	}
	if (i + 1 != s->n || !is_punct(&s->t[i], ')'))
		return false;
	fx->ncols = ncols;
	return true;
}

/* UPDATE t SET c = c +/- v WHERE k = :q [AND k2 = literal ...] from token
 * i (just past the table), the statement's end right after the WHERE. */
static bool shape_update(const struct fx_scan *s, int i, struct lc_fx *fx)
{
	const struct tok *col;
	bool key = false;
	int n = 1; /* cols[0] is the key's */

	if (i + 5 >= s->n || !is_word(&s->t[i], "SET"))
		return false;
	col = &s->t[i + 1];
	if (!copy_name(col, fx->add_column, sizeof fx->add_column) || !is_punct(&s->t[i + 2], '=') ||
	    !same_name(&s->t[i + 3], col) || !(is_punct(&s->t[i + 4], '+') || is_punct(&s->t[i + 4], '-')))
		return false;
	fx->add_sign = is_punct(&s->t[i + 4], '+') ? 1 : -1;
	i += 5;
	if (!shape_value(s, &i, &fx->add) || (fx->add.kind != LC_FX_VAL_PARAM && fx->add.kind != LC_FX_VAL_NUMBER))
		return false;
	if (i >= s->n || !is_word(&s->t[i++], "WHERE"))
		return false;
	for (;;) {
		struct lc_fx_col c;

		if (i + 1 >= s->n || !copy_name(&s->t[i], c.name, sizeof c.name) || !is_punct(&s->t[i + 1], '='))
			return false;
		i += 2;
		if (!shape_value(s, &i, &c.v) || c.v.kind == LC_FX_VAL_CLOCK)
			return false;
		if (c.v.kind == LC_FX_VAL_PARAM) {
			if (key)
				return false; /* two keys: which messages meet on a row is no longer one value's */
			key = true;
			fx->cols[0] = c;
		} else {
			if (n >= LC_FX_COLS)
				return false;
			fx->cols[n++] = c;
		}
		if (i == s->n)
			break;
		if (!is_word(&s->t[i++], "AND"))
			return false;
	}
	if (!key)
		return false;
	fx->ncols = n;
	return true;
}

/* fx's shape, read from token i (just past the table); left NONE, with
 * nothing of a half-read shape behind, when it has none. */
static void shape(const struct fx_scan *s, int i, struct lc_fx *fx)
{
	bool ok = false;

	if (fx->kind == LC_FX_INSERT)
		ok = shape_insert(s, i, fx);
	else if (fx->kind == LC_FX_UPDATE)
		ok = shape_update(s, i, fx);
	if (ok) {
		fx->shape = fx->kind == LC_FX_INSERT ? LC_FX_SHAPE_INSERT : LC_FX_SHAPE_ADD;
		return;
	}
	fx->shape = LC_FX_SHAPE_NONE;
	memset(fx->cols, 0, sizeof fx->cols);
	fx->ncols = 0;
	fx->add_column[0] = '\0';
	fx->add_sign = 0;
	memset(&fx->add, 0, sizeof fx->add);
}

bool lc_fx_compile(const char *text, lc_fx_names_fn names, void *arg, struct lc_fx *out, char *err, size_t cap)
{
	static const char *const kinds[] = { [LC_FX_INSERT] = "INSERT", [LC_FX_UPDATE] = "UPDATE",
		                                 [LC_FX_DELETE] = "DELETE", [LC_FX_REPLACE] = "REPLACE" };
	static const char *const modifiers[] = { "LOW_PRIORITY", "DELAYED", "HIGH_PRIORITY", "QUICK", "INTO",
		                                     "FROM", "IGNORE" };
	static const char *const banned[] = { "OUTFILE", "DUMPFILE", "LOAD_FILE", "SLEEP", "BENCHMARK",
		                                  "GET_LOCK", "RELEASE_LOCK" };
	static struct fx_scan s; /* the token array is large; a definition is read by one thread */
	bool ignore = false, kind = false, qualified = false;
	int i = 1;

	memset(out, 0, sizeof *out);
	s = (struct fx_scan){ .text = text, .out = out, .err = err, .cap = cap };
	if (cap > 0)
		err[0] = '\0';
	scan(&s, names, arg);
	if (s.failed)
		return false;
	for (int k = 0; s.n > 0 && k < (int)(sizeof kinds / sizeof kinds[0]); k++) {
		if (is_word(&s.t[0], kinds[k])) {
			out->kind = (enum lc_fx_kind)k;
			kind = true;
		}
	}
	if (!kind) {
		fail(&s, "only INSERT, UPDATE, DELETE or REPLACE: an effect changes rows, and the worker owns the "
		         "transaction");
		return false;
	}
	for (int k = 0; k < s.n; k++) {
		for (size_t b = 0; b < sizeof banned / sizeof banned[0]; b++) {
			if (is_word(&s.t[k], banned[b])) {
				fail(&s, "\"%s\" has no place in an effect: it reaches outside the transaction", banned[b]);
				return false;
			}
		}
	}
	for (bool more = true; more && i < s.n;) {
		more = false;
		for (size_t m = 0; m < sizeof modifiers / sizeof modifiers[0]; m++) {
			if (is_word(&s.t[i], modifiers[m])) {
				ignore = ignore || m == sizeof modifiers / sizeof modifiers[0] - 1;
				i++;
				more = true;
				break;
			}
		}
	}
	if (i < s.n && is_name(&s.t[i])) {
		int at = i;

		if (i + 2 < s.n && is_punct(&s.t[i + 1], '.') && is_name(&s.t[i + 2])) {
			at = i + 2; /* database.table */
			qualified = true;
		}
		snprintf(out->table, sizeof out->table, "%.*s", (int)s.t[at].len, s.t[at].p);
		i = at + 1;
	}
	judge(&s, i, ignore, out);
	/* Another database's table: a checker would read ours under its name. */
	if (out->commutes && !qualified)
		shape(&s, i, out);
	return true;
}
