/*
 * args.h - reading one "--name value" or "--name=value" option of a
 * subcommand's argv, for the option loops of `inbox-worker dlq` (dlq.c)
 * and `inbox-loadgen` (loadgen/main.c).  The worker's own settings are
 * read by cfg.c, which also takes their _FILE forms and environment.
 *
 * Ownership: the value returned points into argv; nothing is allocated.
 */
#ifndef INBOX_ARGS_H
#define INBOX_ARGS_H

#include <stdbool.h>

/* The value of option `name` at argv[*i], advancing *i past a separate
 * value; NULL when argv[*i] is another option (a longer name that starts
 * the same, too).  *missing is set when argv[*i] is this option and its
 * value is absent (the last argument). */
const char *args_value(int argc, char **argv, int *i, const char *name, bool *missing);

#endif
