/*
 * verify_effects.h - what a definition's own statements (issue 45) wrote,
 * checked by inbox-loadgen verify: from the plan's expectations (which
 * messages of each aggregate take effect, applied or compensated, in
 * which state: lc_event_stmts), every keyed INSERT must have left exactly
 * one row per message that ran it, with the aggregate's key and the data
 * the scenario drew, and every addition by key must have moved each
 * key's rows from the baseline publish took (snapshot.h) by the sum of
 * what those messages added.
 *
 * Only statements with a shape (lifecycle_fx.h) are checked; any other
 * is named as not checkable, never guessed at.  Sums assume that nothing
 * but this run's messages adds to those rows between publish and verify.
 * Problems go to the lists of struct v_state (missing, doubled, wrong,
 * unexpected), so they fail verify as a missing effect does.
 *
 * Ownership: st->fx is allocated by v_fx_open and released by v_fx_free
 * (NULL-safe; clears the pointer).
 */
#ifndef INBOX_LG_VERIFY_EFFECTS_H
#define INBOX_LG_VERIFY_EFFECTS_H

#include <jansson.h>
#include <stdio.h>

#include "verify_ledger.h"

struct v_fx_figures {
	int stmts;             /* the definition's */
	int inserts, sums;     /* checked, by shape */
	int same;              /* checked as an identical earlier statement (lg_stmt_same) */
	int uncheckable;
	long rows_exp, rows_once, rows_missing, rows_doubled, rows_wrong, rows_unexpected;
	long sums_checked, sums_wrong;
	long sums_unmeasured;  /* keys messages added to that have no baseline (not checked) */
	long orders_unfolded;  /* orders whose messages could not be matched to their route */
};

/* Room for ocap orders and mcap messages (v_load's run line).  0 or -1. */
int v_fx_open(struct v_state *st, size_t ocap, size_t mcap);
/* An order line's "data" (may be NULL) for order index i. */
void v_fx_order(struct v_state *st, size_t i, json_t *data);
/* A "stmt" or "sum" line (k) of the ledger at path:line.  0, or -1 with a
 * message on stderr (a ledger of statements this definition has not). */
int v_fx_line(struct v_state *st, const char *k, json_t *o, const char *path, long line);
/* Fold the expectations, read the statements' tables (st->db open) and
 * judge; ST_OK or a database error (db_errmsg says which). */
int v_fx_check(struct v_state *st);
/* Its figures (zeros before v_fx_check). */
const struct v_fx_figures *v_fx_figures(const struct v_state *st);
/* The report's statement lines (none for a definition without statements). */
void v_fx_report_text(const struct v_state *st, FILE *f);
/* The same as a JSON object (new reference), or NULL without statements. */
json_t *v_fx_report_json(const struct v_state *st);
void v_fx_free(struct v_fx **fx);

#endif
