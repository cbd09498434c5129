/*
 * lifecycle_fx.h - a definition's own SQL statement (issue 45, "effects"),
 * read: the text a person wrote, with named parameters, made into the
 * text the server prepares, every parameter a `?` bound at run time, and
 * judged for whether two arrival orders can end differently.
 *
 * No I/O, no database: preparing the statement against the server is the
 * caller's (it needs a connection).  What is refused here is refused before
 * anything runs: anything but one INSERT, UPDATE, DELETE or REPLACE, a
 * second statement, a comment (MariaDB runs what an executable comment holds), a
 * `?` or an @variable (the parameters are named and ours), a name that is
 * no parameter the event declares.  Quoted text is copied as it is: a
 * `:name` inside quotes is text, not a parameter.
 */
#ifndef INBOX_LIFECYCLE_FX_H
#define INBOX_LIFECYCLE_FX_H

#include <stdbool.h>
#include <stddef.h>

#define LC_FX_SQL_MAX 2048
#define LC_FX_PARAMS 32
#define LC_FX_WHY_MAX 240
#define LC_FX_COLS 16         /* columns of a shaped INSERT, equalities of a shaped UPDATE's WHERE */
#define LC_FX_LITERAL_MAX 128 /* a literal's text; a longer one leaves the statement without a shape */

enum lc_fx_kind { LC_FX_INSERT = 0, LC_FX_UPDATE, LC_FX_DELETE, LC_FX_REPLACE };

/* Where a parameter's value comes from when the statement runs: the
 * message's key fields, the aggregate's key, or a value the event's sets
 * (or fields) typed and kept (set: its index among the event's sets). */
enum lc_fx_src { LC_FX_MESSAGE_ID = 0, LC_FX_SOURCE, LC_FX_TYPE, LC_FX_KEY, LC_FX_SET };

struct lc_fx_param {
	enum lc_fx_src src;
	int set;
};

/* The shape of a statement that commutes, for a reader that checks what it
 * wrote (inbox-loadgen verify): read from the text once, here, so that no
 * caller parses SQL again.  Only the two forms whose effect can be told
 * from their text alone have one; anything else is LC_FX_SHAPE_NONE, and
 * a checker must say it cannot check it rather than guess. */
enum lc_fx_shape {
	LC_FX_SHAPE_NONE = 0,
	/* INSERT INTO t (c, ...) VALUES (v, ...): one VALUES row, each value a
	 * parameter, a literal or :applied_at.  Keyed by :message_id (it
	 * commutes), so each message that runs it leaves exactly one row. */
	LC_FX_SHAPE_INSERT,
	/* UPDATE t SET c = c + v (or - v) WHERE k = :q [AND k2 = literal ...]:
	 * v a parameter or a number.  The rows of one key end at what they
	 * held plus the sum of what the messages that ran it added. */
	LC_FX_SHAPE_ADD,
};

/* A value in a shaped statement. */
enum lc_fx_value_kind {
	LC_FX_VAL_PARAM = 0, /* params[param] */
	LC_FX_VAL_NUMBER,    /* a number written in the definition, text as written ("-5", "2.50") */
	LC_FX_VAL_STRING,    /* a quoted string written in the definition, text unquoted and unescaped */
	LC_FX_VAL_CLOCK,     /* :applied_at, the server's clock at the write: nothing to predict */
};

struct lc_fx_value {
	enum lc_fx_value_kind kind;
	int param;                    /* LC_FX_VAL_PARAM: index into params */
	char text[LC_FX_LITERAL_MAX]; /* LC_FX_VAL_NUMBER, LC_FX_VAL_STRING */
};

struct lc_fx_col {
	char name[64 + 1];            /* as written, without backticks */
	struct lc_fx_value v;
};

struct lc_fx {
	char sql[LC_FX_SQL_MAX];      /* what the server prepares */
	enum lc_fx_kind kind;
	char table[64 + 1];           /* the table it writes, as written (unquoted) */
	struct lc_fx_param params[LC_FX_PARAMS]; /* in the order of their `?` */
	int nparams;
	/* Whether it commutes with every other statement of its kind: an
	 * INSERT keyed by :message_id, an UPDATE whose every assignment adds
	 * to the column itself (x = x + ..., x = x - ...) and whose WHERE reads
	 * none of them.  When not, why says so in one line. */
	bool commutes;
	bool keyed;                   /* it binds :message_id */
	char why[LC_FX_WHY_MAX];
	/* The shape (above), when it commutes and has one.  INSERT: cols are
	 * its columns with their values, in the order written.  ADD: cols are
	 * the WHERE's equalities, the key first (its value a parameter), then
	 * those on literals; add_column gains add_sign (+1, -1) times add. */
	enum lc_fx_shape shape;
	struct lc_fx_col cols[LC_FX_COLS];
	int ncols;
	char add_column[64 + 1];
	int add_sign;
	struct lc_fx_value add;
};

/* Resolve a parameter's name (without the ':'; "data.amount_cents",
 * "message_id", ...; len bytes, not NUL-terminated): 0 with *out filled,
 * or -1 when the event declares no such name. */
typedef int (*lc_fx_names_fn)(void *arg, const char *name, size_t len, struct lc_fx_param *out);

/* Read text into out: true, or false with err (cap bytes) saying what is
 * wrong and what to write instead.  :applied_at becomes NOW(6), the
 * server's clock at the write, as the sets' applied_at. */
bool lc_fx_compile(const char *text, lc_fx_names_fn names, void *arg, struct lc_fx *out, char *err, size_t cap);

#endif
