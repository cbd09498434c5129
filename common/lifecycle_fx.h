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

enum lc_fx_kind { LC_FX_INSERT = 0, LC_FX_UPDATE, LC_FX_DELETE, LC_FX_REPLACE };

/* Where a parameter's value comes from when the statement runs: the
 * message's key fields, the aggregate's key, or a value the event's sets
 * (or fields) typed and kept (set: its index among the event's sets). */
enum lc_fx_src { LC_FX_MESSAGE_ID = 0, LC_FX_SOURCE, LC_FX_TYPE, LC_FX_KEY, LC_FX_SET };

struct lc_fx_param {
	enum lc_fx_src src;
	int set;
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
