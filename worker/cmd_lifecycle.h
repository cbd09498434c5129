/*
 * cmd_lifecycle.h - `inbox-worker lifecycle check FILE` and `lifecycle
 * schema FILE` (the start-up step of `run` that loads, checks and binds
 * the definition is preflight_lifecycle, preflight.h).
 */
#ifndef INBOX_CMD_LIFECYCLE_H
#define INBOX_CMD_LIFECYCLE_H

#include <stdio.h>


/* `lifecycle check FILE` (argv[0] is "lifecycle"): validate FILE, print its
 * decision table and the arrival-order check on out, errors on err.
 * Returns 0 when the definition is valid and order-independent, 1 when it
 * is refused (each reason printed), 2 on a usage error. */
int lifecycle_main(int argc, char **argv, FILE *out, FILE *err);

/* Its lines of inbox-worker --help. */
void lifecycle_usage(FILE *f);

#endif
