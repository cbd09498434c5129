/*
 * cmd_lifecycle.c - `inbox-worker lifecycle check FILE` and run's start-up
 * step.  Both read a definition the same way (lc_load), check it with the
 * same simulation of the same decision function (lc_decide), so what the
 * check accepts is what run runs.
 */
#include "cmd_lifecycle.h"

#include <stdbool.h>
#include <string.h>

#include "db.h"
#include "lifecycle.h"
#include "lifecycle_schema.h"
#include "log.h"
#include "metrics.h"
#include "aggregate.h"
#include "status.h"

#define LC_USAGE "usage: inbox-worker lifecycle check|schema FILE"

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

void lifecycle_usage(FILE *f)
{
	fputs("  lifecycle check FILE\n"
	      "            validate a lifecycle definition, print its decision table and check\n"
	      "            that it is arrival-order independent (doc/lifecycle.md)\n"
	      "  lifecycle schema FILE\n"
	      "            print the tables the definition needs (what migrate creates with\n"
	      "            INBOX_LIFECYCLE=FILE)\n", f);
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
		             "              decision table, and check exhaustively that any arrival order of\n"
		             "              its events, with duplicates, ends the same; exit 0 when it does,\n"
		             "              1 when the definition is refused, 2 on a usage error\n"
		             "  schema FILE the tables the definition needs, as the CREATE TABLE statements\n"
		             "              `migrate` runs with INBOX_LIFECYCLE=FILE\n",
		        LC_USAGE);
		return 0;
	}
	if (argc == 3 && strcmp(argv[1], "schema") == 0)
		return print_schema(argv[2], out, err);
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
	/* The same judgement as run's (lifecycle_setup): what it refuses,
	 * check refuses, with the same exit as any other refusal. */
	if (agg_bind(d, &b, why, sizeof why) == 0) {
		fprintf(out, "this worker can run it: INBOX_LIFECYCLE=%s\n", argv[2]);
		code = 0;
	} else {
		fprintf(out, "this worker cannot run it: %s\n", why);
		fprintf(err, "%s: this worker cannot run it: %s\n", argv[2], why);
		code = 1;
	}
	lc_free(d);
	return code;
}

/* Kept for the process's life: agg_decide reads it from every thread. */
static struct lc_def *run_def;
static struct agg_binding run_binding;

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
	if (agg_bind(run_def, &run_binding, why, sizeof why) != 0) {
		fprintf(stderr, "inbox-worker: INBOX_LIFECYCLE %s: %s\n", name ? name : "(built-in)", why);
		goto fail;
	}
	agg_use(&run_binding);
	/* /metrics names the aggregate (inbox_lifecycle_info); a name lc_load
	 * took is always a valid label, so a refusal only means "set before". */
	if (metrics_set_lifecycle(run_def->aggregate, run_def->table, run_def->key) != 0)
		LOG(LOG_LEVEL_WARN, "the lifecycle is not named in /metrics", LOG_S("aggregate", run_def->aggregate));
	return 0;
fail:
	lc_free(run_def);
	run_def = NULL;
	return 2;
}

#define LC_COLS_MAX 256

/* Every column of the definition's three tables, from information_schema
 * (the names are parameters, never spliced into the SQL). */
static int read_columns(struct db *db, const struct lc_def *d, struct lc_column *cols, int *n)
{
	char names[LC_SCHEMA_TABLES][LC_NAME_MAX + 16];
	struct db_stmt *q = NULL;
	int rc, r;

	lc_schema_tables(d, names);
	rc = db_prepare(db, &q,
	                "SELECT table_name, column_name, LOWER(data_type), COALESCE(character_maximum_length, 0)"
	                " FROM information_schema.columns WHERE table_schema = DATABASE()"
	                " AND table_name IN (?, ?, ?) ORDER BY table_name, ordinal_position");
	if (rc != ST_OK)
		return rc;
	{
		struct db_param p[] = { DBP_STR(names[0]), DBP_STR(names[1]), DBP_STR(names[2]) };

		rc = db_stmt_query(q, p, ARRAY_LEN(p));
	}
	if (rc != ST_OK)
		return rc;
	*n = 0;
	for (;;) {
		struct lc_column *c = &cols[*n];
		struct db_col out[] = { DBC_STR(c->table, sizeof c->table), DBC_STR(c->column, sizeof c->column),
			                DBC_STR(c->data_type, sizeof c->data_type), DBC_I64() };

		if (*n >= LC_COLS_MAX) {
			db_stmt_done(q);
			break;
		}
		r = db_stmt_fetch(q, out, ARRAY_LEN(out));
		if (r < 0)
			return r;
		if (r == 0)
			break;
		c->length = out[3].i64;
		(*n)++;
	}
	return ST_OK;
}

static struct lc_def *load_conf(const struct cfg *conf, struct lc_errors *errs)
{
	if (conf->lifecycle != NULL && conf->lifecycle[0] != '\0')
		return lc_load_file(conf->lifecycle, errs);
	return lc_load(lc_builtin_order, lc_builtin_order_len, errs);
}

int lifecycle_migrate(const struct cfg *conf)
{
	static struct lc_column cols[LC_COLS_MAX];
	static char ddl[16384], diff[8192];
	struct lc_errors errs;
	struct lc_def *d = load_conf(conf, &errs);
	struct db *db = NULL;
	int n = 0, ndiff, code = 1, rc;

	if (d == NULL) {
		lc_errors_print(&errs, conf->lifecycle, stderr);
		return 1;
	}
	if (lc_schema_ddl(d, ddl, sizeof ddl) != 0) {
		LOG(LOG_LEVEL_ERROR, "the lifecycle's tables cannot be written as DDL", LOG_S("lifecycle", conf->lifecycle));
		goto cleanup;
	}
	rc = db_open(&db, cfg_migrate_db(conf));
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_ERROR, "cannot connect to the database for the lifecycle's tables",
		    LOG_S("db", cfg_migrate_db(conf)->redacted), LOG_S("error", st_strerror(rc)));
		goto cleanup;
	}
	rc = db_exec_script(db, ddl, strlen(ddl));
	if (rc == ST_OK)
		rc = read_columns(db, d, cols, &n);
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_ERROR, "creating the lifecycle's tables failed", LOG_S("error", db_errmsg(db)));
		goto cleanup;
	}
	ndiff = lc_schema_compare(d, cols, n, diff, sizeof diff);
	if (ndiff > 0) {
		/* Columns narrower than what the worker accepts into them (an
		 * older version's widths) are widened, their rows kept, but only
		 * when that is all that differs: a table that differs otherwise
		 * is the user's to change, and migrate changes none of it. */
		int nalter = lc_schema_widen(d, cols, n, ddl, sizeof ddl);

		if (nalter < 0) {
			LOG(LOG_LEVEL_ERROR, "the lifecycle's tables cannot be widened as DDL",
			    LOG_S("lifecycle", conf->lifecycle));
			goto cleanup;
		}
		if (nalter == ndiff) {
			rc = db_exec_script(db, ddl, strlen(ddl));
			if (rc == ST_OK)
				rc = read_columns(db, d, cols, &n);
			if (rc != ST_OK) {
				LOG(LOG_LEVEL_ERROR, "widening the lifecycle's columns failed", LOG_S("error", db_errmsg(db)));
				goto cleanup;
			}
			LOG(LOG_LEVEL_INFO, "the lifecycle's columns widened", LOG_S("lifecycle", conf->lifecycle),
			    LOG_I("columns", nalter));
			ndiff = lc_schema_compare(d, cols, n, diff, sizeof diff);
		}
	}
	if (ndiff == 0) {
		LOG(LOG_LEVEL_INFO, "the lifecycle's tables match its definition", LOG_S("lifecycle", conf->lifecycle),
		    LOG_S("table", d->table));
		code = 0;
	} else {
		/* An existing table is the user's: say what differs, change nothing. */
		for (char *line = diff, *nl; *line != '\0'; line = nl + 1) {
			nl = strchr(line, '\n');
			if (nl == NULL)
				break;
			*nl = '\0';
			LOG(LOG_LEVEL_ERROR, "the lifecycle's table differs from its definition", LOG_S("difference", line));
		}
	}
cleanup:
	db_close(&db);
	lc_free(d);
	return code;
}

int lifecycle_schema_check(const struct cfg *conf)
{
	static struct lc_column cols[LC_COLS_MAX];
	static char diff[8192];
	const struct lc_def *d = agg_current()->def;
	const char *name = conf->lifecycle != NULL && conf->lifecycle[0] != '\0' ? conf->lifecycle : "(built-in)";
	struct db *db = NULL;
	int n = 0, rc, code = 0;

	rc = db_open(&db, &conf->db);
	if (rc != ST_OK)
		return 0; /* the pool waits for it, or says why not, in its own line */
	rc = read_columns(db, d, cols, &n);
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_WARN, "cannot check the lifecycle's tables at start-up", LOG_S("error", db_errmsg(db)));
		goto cleanup;
	}
	if (n == 0)
		goto cleanup; /* never migrated: the worker's first statement says so */
	if (lc_schema_compare(d, cols, n, diff, sizeof diff) > 0) {
		char *nl = strchr(diff, '\n');

		if (nl != NULL)
			*nl = '\0';
		fprintf(stderr, "inbox-worker: INBOX_LIFECYCLE %s needs a schema change: %s (run `inbox-worker migrate` "
		                "with the same INBOX_LIFECYCLE)\n", name, diff);
		code = 2;
	}
cleanup:
	db_rollback(db);
	db_close(&db);
	return code;
}
