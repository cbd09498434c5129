/*
 * lifecycle_diff.h - what changes between two lifecycle definitions for
 * the rows and held events of the old one (issue 46, item 3): `inbox-worker
 * lifecycle diff OLD NEW`.
 *
 * Said, one line each, in this order: the two versions ("version 1 ->
 * 2"; a version kept over a change is said there, and counts as one);
 * the aggregate, table, key and numbering; states removed (their rows could not be decided by NEW) and
 * added; events removed (their held events could not be released) and
 * added; then every decision that differs, by state and event, as
 * lc_print_table shows cells ("in Shipped, PaymentAuthorized: compensate
 * +RefundRequested -> ignore").  States and events are matched by name,
 * so a renamed one is a removal and an addition.
 *
 * Ownership: reads both definitions, writes to f, keeps nothing.
 */
#ifndef INBOX_LIFECYCLE_DIFF_H
#define INBOX_LIFECYCLE_DIFF_H

#include <stdio.h>

#include "lifecycle.h"

/* The differences of b from a, written to f after the versions' line;
 * returns how many, or -1 when it cannot gather them (out of memory). */
int lc_diff(const struct lc_def *a, const struct lc_def *b, FILE *f);

#endif
