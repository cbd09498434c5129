/*
 * lifecycle_int.h - what the lifecycle's files share and nothing else sees:
 * a declared state found by its name (lifecycle_load.c resolves the
 * definition's references with it, lifecycle.c's lc_state_find answers
 * with it).
 */
#ifndef INBOX_LIFECYCLE_INT_H
#define INBOX_LIFECYCLE_INT_H

#include "lifecycle.h"

/* The index of the declared state called name (1..nstates-1), or -1. */
int lc_state_index(const struct lc_def *d, const char *name);

#endif
