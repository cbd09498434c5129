/*
 * verify.h - inbox-loadgen verify: checks the database, the dead-letter
 * queue and the emitted messages against a ledger written by publish.
 */
#ifndef INBOX_LG_VERIFY_H
#define INBOX_LG_VERIFY_H

#include <stdbool.h>

#include "cfg.h"
#include "lifecycle.h"

struct lg_verify_opts {
	const char *ledger;
	int timeout_s;  /* bound on waiting for the worker to go idle */
	int list_max;   /* ids listed per problem kind */
	bool json;      /* the report as one JSON object on stdout instead of text */
	const struct lc_def *def; /* the lifecycle the ledger was planned from (required) */
	const char *lifecycle;    /* its file, or NULL for the built-in order lifecycle */
};

/* Prints the report on stdout.  Returns the exit code: 0 when nothing is
 * missing, doubled, wrong or unexpected; 1 otherwise or on a runtime
 * failure. */
int lg_verify(const struct cfg *conf, const struct lg_verify_opts *vo);

#endif
