/*
 * lifecycle_int.h - what the lifecycle's files share and nothing else sees:
 * a declared state found by its name (lifecycle_load.c resolves the
 * definition's references with it, lifecycle.c's lc_state_find answers
 * with it).
 */
#ifndef INBOX_LIFECYCLE_INT_H
#define INBOX_LIFECYCLE_INT_H

#include <jansson.h>

#include "lifecycle.h"

#define LC_PATH_MAX 8

/* Where the reading is in the file: the value at path (object members and
 * array elements from the root), located in text when an error needs its
 * line (lifecycle_load.c's lc_locate). */
struct lc_step {
	const char *key; /* object member, or NULL for ... */
	int index;       /* ... an array element */
};

struct lc_path {
	int n;
	struct lc_step s[LC_PATH_MAX];
};

struct lc_ctx {
	const char *text;
	size_t len;
	struct lc_errors *errs;
	struct lc_path path;
	struct lc_def *def;
};

/* Descend into a member or an element, and back. */
void lc_push_key(struct lc_ctx *c, const char *key);
void lc_push_index(struct lc_ctx *c, int index);
void lc_pop(struct lc_ctx *c);
/* An error about the value at the current path, and its line. */
void lc_err(struct lc_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int lc_here_line(struct lc_ctx *c);
/* obj's keys checked against allowed (NULL-ended); what names obj. */
void lc_known_keys(struct lc_ctx *c, json_t *obj, const char *const *allowed, const char *what);

/* The definition's own statements (lifecycle_stmts.c), read once every
 * event is: event evi's "statements" and those of its "after"
 * compensations (obj is the event's object). */
void lc_parse_statements(struct lc_ctx *c, int evi, json_t *obj);

/* The definition's "destinations" and "deliver" (lifecycle_dest.c),
 * read once the events (and so the emitted kinds) are. */
void lc_parse_destinations(struct lc_ctx *c, json_t *root);

/* The index of the declared state called name (1..nstates-1), or -1. */
int lc_state_index(const struct lc_def *d, const char *name);

#endif
