/*
 * cmd_lifecycle.c - `inbox-worker lifecycle check FILE` and `schema FILE`.
 * The check reads a definition the way run's start-up step does
 * (preflight_lifecycle: lc_load), checks it with the same simulation of
 * the same decision function (lc_decide), so what the check accepts is
 * what run runs.
 */
#include "cmd_lifecycle.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cfg.h"
#include "db.h"
#include "lifecycle.h"
#include "lifecycle_dest.h"
#include "lifecycle_diff.h"
#include "lifecycle_schema.h"
#include "aggregate.h"
#include "preflight.h"
#include "status.h"

#define LC_USAGE "usage: inbox-worker lifecycle check|schema FILE | lifecycle diff OLD NEW"

/* `lifecycle schema FILE`: the DDL migrate would run, nothing connected. */
static int print_schema(const char *path, FILE *out, FILE *err)
{
	static char ddl[16384];
	struct lc_errors errs;
	struct lc_def *d = lc_load_file(path, &errs);
	int code = 0;

	if (d == NULL) {
		lc_errors_print(&errs, path, err);
		return 1;
	}
	if (lc_schema_ddl(d, ddl, sizeof ddl) != 0) {
		fprintf(err, "%s: its tables cannot be written as DDL (a column named like one the worker keeps, "
		             "or too many columns)\n", path);
		code = 1;
	} else {
		fputs(ddl, out);
	}
	lc_free(d);
	return code;
}

/* The definition's own statements prepared as `run` prepares them, on
 * the database run's settings name (INBOX_DB_URL and the rest, read only
 * here: a definition without statements needs no database to be
 * checked).  0 when there are none, or each prepared, or there is no
 * INBOX_DB_URL to prepare them on (said); 1 when the server refused one
 * or could not be reached (said). */
static int prepare_statements(const struct lc_def *d, const char *path, FILE *out, FILE *err)
{
	char *argv[] = { "inbox-worker", NULL };
	char why[512];
	struct cfg conf;
	struct db *db = NULL;
	const char *url = getenv("INBOX_DB_URL");
	int code = 1;

	if (d->nstmts == 0)
		return 0;
	if (url == NULL || url[0] == '\0') {
		fprintf(out, "statements: %d, not prepared: set INBOX_DB_URL (as for run) to have the database prepare "
		             "each one\n", d->nstmts);
		return 0;
	}
	if (cfg_load(&conf, 1, argv, why, sizeof why) != CFG_OK) {
		fprintf(err, "%s: cannot prepare its statements: %s\n", path, why);
		return 1;
	}
	if (db_global_init() != 0) {
		fprintf(err, "%s: cannot prepare its statements: mysql_library_init failed\n", path);
		goto cleanup;
	}
	if (db_open_why(&db, &conf.db, why, sizeof why) != ST_OK) {
		fprintf(err, "%s: cannot prepare its statements: %s: %s\n", path, conf.db.redacted, why);
	} else if (preflight_effects(db, d, path) == 0) { /* says the refusal itself */
		fprintf(out, "statements: %d, each prepared by %s\n", d->nstmts, conf.db.redacted);
		code = 0;
	}
	db_rollback(db);
	db_close(&db);
	db_global_end();
cleanup:
	cfg_free(&conf);
	return code;
}

void lifecycle_usage(FILE *f)
{
	fputs("  lifecycle check FILE\n"
	      "            validate a lifecycle definition, print its decision table and check\n"
	      "            that it is arrival-order independent (doc/lifecycle.md)\n"
	      "  lifecycle schema FILE\n"
	      "            print the tables the definition needs (what migrate creates with\n"
	      "            INBOX_LIFECYCLE=FILE)\n", f);
}

/* Each destination as run would call it, resolved from this environment
 * (secrets as ***), and where each emitted type goes.  A value missing
 * here is said and not refused: the check may run where the secrets are
 * not, and run refuses it where they should be. */
static void print_routes(const struct lc_def *d, FILE *out)
{
	char line[1024], why[512];

	if (d->ndests == 0)
		return;
	for (int i = 0; i < d->ndests; i++) {
		struct http_dest hd = { 0 };

		if (lc_dest_resolve(d, i, &hd, why, sizeof why) == ST_OK) {
			(void)http_dest_format(&hd, line, sizeof line);
			fprintf(out, "destination %s: %s\n", d->dests[i].name, line);
		} else {
			/* why starts with "destination NAME: " */
			const char *what = strchr(why, ':');

			fprintf(out, "destination %s: not resolved here: %s; run exits 2 without it\n", d->dests[i].name,
			        what != NULL ? what + 2 : why);
		}
		http_dest_free(&hd);
	}
	fputs("emitted events go to:\n", out);
	for (int k = 0; k < d->nemits; k++) {
		const char *sep = "";

		fprintf(out, "  %s -> ", d->emits[k]);
		for (int i = 0; i < d->ndests; i++)
			if (lc_emit_to_dest(d, k, i)) {
				fprintf(out, "%s%s", sep, d->dests[i].name);
				sep = ", ";
			}
		if (lc_emit_to_exchange(d, k))
			fprintf(out, "%sour exchange", sep);
		fputc('\n', out);
	}
}

/* `lifecycle diff OLD NEW`: as diff(1) exits, 0 when nothing changes, 1
 * when something does, 2 when a definition cannot be read. */
static int print_diff(const char *old_path, const char *new_path, FILE *out, FILE *err)
{
	struct lc_errors errs;
	struct lc_def *a = lc_load_file(old_path, &errs), *b = NULL;
	int n, code = 2;

	if (a == NULL) {
		lc_errors_print(&errs, old_path, err);
		return 2;
	}
	b = lc_load_file(new_path, &errs);
	if (b == NULL) {
		lc_errors_print(&errs, new_path, err);
		goto cleanup;
	}
	n = lc_diff(a, b, out);
	if (n < 0) {
		fprintf(err, "inbox-worker: lifecycle diff: out of memory\n");
		goto cleanup;
	}
	if (n == 0)
		fprintf(out, "no differences for the rows of %s\n", old_path);
	code = n == 0 ? 0 : 1;
cleanup:
	lc_free(b);
	lc_free(a);
	return code;
}

int lifecycle_main(int argc, char **argv, FILE *out, FILE *err)
{
	struct lc_errors errs;
	struct lc_check chk;
	struct agg_binding b;
	struct lc_def *d;
	char why[512];
	bool ok;
	int code;

	if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
		fprintf(out, "%s\n\n"
		             "  check FILE  validate a lifecycle definition (see doc/lifecycle.md), print its\n"
		             "              version and decision table, and check exhaustively that any\n"
		             "              arrival order of its events, with duplicates, ends the same; with\n"
		             "              INBOX_DB_URL set, the database prepares each of its own statements;\n"
		             "              exit 0 when it does, 1 when the definition is refused, 2 on a\n"
		             "              usage error\n"
		             "  schema FILE the tables the definition needs, as the CREATE TABLE statements\n"
		             "              `migrate` runs with INBOX_LIFECYCLE=FILE\n"
		             "  diff OLD NEW what changes for the rows and held events of OLD when NEW runs:\n"
		             "              the two versions, states and events removed or added, each\n"
		             "              decision that differs; exit 0 when nothing does, 1 when\n"
		             "              something does, 2 when a file is refused\n",
		        LC_USAGE);
		return 0;
	}
	if (argc == 3 && strcmp(argv[1], "schema") == 0)
		return print_schema(argv[2], out, err);
	if (argc == 4 && strcmp(argv[1], "diff") == 0)
		return print_diff(argv[2], argv[3], out, err);
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
		fprintf(err, "%s: %s: %s\n", argv[2], chk.sequenced ? "refused" : "order-dependent", chk.why);
		lc_free(d);
		return 1;
	}
	if (chk.sequenced)
		fprintf(out, "arrival order: the producer's (each event's number in %s); every one of the %d states "
		             "reachable, every event applies in some state; loops allowed\n",
		        lc_seq_source(d, (char[LC_NAME_MAX + 32]){ 0 }, LC_NAME_MAX + 32), chk.reachable);
	else
		fprintf(out, "arrival order: independent (%ld sets of event types, each alone and with one type twice, "
	             "%ld arrival orders simulated; %ld sets skipped as conflicts between terminal states)\n",
	        chk.sets, chk.runs, chk.conflicts);
	/* The same judgement as run's (preflight_lifecycle): what it refuses,
	 * check refuses, with the same exit as any other refusal. */
	if (agg_bind(d, &b, why, sizeof why) == 0) {
		print_routes(d, out);
		code = prepare_statements(d, argv[2], out, err);
		if (code == 0)
			fprintf(out, "this worker can run it: INBOX_LIFECYCLE=%s\n", argv[2]);
	} else {
		fprintf(out, "this worker cannot run it: %s\n", why);
		fprintf(err, "%s: this worker cannot run it: %s\n", argv[2], why);
		code = 1;
	}
	lc_free(d);
	return code;
}
