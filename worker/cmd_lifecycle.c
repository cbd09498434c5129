/*
 * cmd_lifecycle.c - `inbox-worker lifecycle check FILE` and run's start-up
 * step.  Both read a definition the same way (lc_load), check it with the
 * same simulation of the same decision function (lc_decide), so what the
 * check accepts is what run runs.
 */
#include "cmd_lifecycle.h"

#include <stdbool.h>
#include <string.h>

#include "lifecycle.h"
#include "order.h"

#define LC_USAGE "usage: inbox-worker lifecycle check FILE"

int lifecycle_main(int argc, char **argv, FILE *out, FILE *err)
{
	struct lc_errors errs;
	struct lc_check chk;
	struct order_binding b;
	struct lc_def *d;
	char why[512];
	bool ok;

	if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
		fprintf(out, "%s\n\n"
		             "  check FILE  validate a lifecycle definition (see doc/lifecycle.md), print its\n"
		             "              decision table, and check exhaustively that any arrival order of\n"
		             "              its events, with duplicates, ends the same; exit 0 when it does,\n"
		             "              1 when the definition is refused, 2 on a usage error\n",
		        LC_USAGE);
		return 0;
	}
	if (argc != 3 || strcmp(argv[1], "check") != 0) {
		fprintf(err, "inbox-worker: %s\n", LC_USAGE);
		return 2;
	}
	d = lc_load_file(argv[2], &errs);
	if (d == NULL) {
		lc_errors_print(&errs, argv[2], err);
		return 1;
	}
	lc_print_table(d, out);
	ok = lc_check_order_independence(d, &chk);
	fputc('\n', out);
	if (!ok) {
		fprintf(err, "%s: order-dependent: %s\n", argv[2], chk.why);
		lc_free(d);
		return 1;
	}
	fprintf(out, "arrival order: independent (%ld sets of event types, each alone and with one type twice, "
	             "%ld arrival orders simulated; %ld sets skipped as conflicts between terminal states)\n",
	        chk.sets, chk.runs, chk.conflicts);
	if (order_bind(d, &b, why, sizeof why) == 0)
		fprintf(out, "this worker can run it: INBOX_LIFECYCLE=%s\n", argv[2]);
	else
		fprintf(out, "this worker cannot run it yet: %s\n", why);
	lc_free(d);
	return 0;
}

/* Kept for the process's life: order_decide reads it from every thread. */
static struct lc_def *run_def;
static struct order_binding run_binding;

int lifecycle_setup(const struct cfg *conf)
{
	const char *name = conf->lifecycle != NULL && conf->lifecycle[0] != '\0' ? conf->lifecycle : NULL;
	struct lc_errors errs;
	struct lc_check chk;
	char why[512];

	run_def = name != NULL ? lc_load_file(name, &errs) : lc_load(lc_builtin_order, lc_builtin_order_len, &errs);
	if (run_def == NULL) {
		/* one line: the first error; `lifecycle check` prints them all */
		fprintf(stderr, "inbox-worker: INBOX_LIFECYCLE %s: line %d: %s%s\n", name ? name : "(built-in)",
		        errs.e[0].line, errs.e[0].text, errs.n > 1 ? " (and more: run `inbox-worker lifecycle check`)" : "");
		return 2;
	}
	if (!lc_check_order_independence(run_def, &chk)) {
		fprintf(stderr, "inbox-worker: INBOX_LIFECYCLE %s is order-dependent: %s\n", name ? name : "(built-in)",
		        chk.why);
		goto fail;
	}
	if (order_bind(run_def, &run_binding, why, sizeof why) != 0) {
		fprintf(stderr, "inbox-worker: INBOX_LIFECYCLE %s: %s\n", name ? name : "(built-in)", why);
		goto fail;
	}
	order_use(&run_binding);
	return 0;
fail:
	lc_free(run_def);
	run_def = NULL;
	return 2;
}
