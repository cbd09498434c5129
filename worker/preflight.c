/*
 * preflight.c - the commands' shared start-up checks (preflight.h).
 *
 * The lifecycle is judged the way `lifecycle check` judges it (lc_load,
 * lc_check_order_independence, agg_bind), so what the check accepts is
 * what run runs; its tables are compared by the same list migrate creates
 * them from (lifecycle_schema.h).  The migrations are read as migrate reads
 * them (migration.h), so what migrate refuses to go on with, run refuses
 * to start on.
 */
#include "preflight.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "effects.h"
#include "lifecycle_schema.h"
#include "log.h"
#include "metrics.h"
#include "lifecycle_dest.h"
#include "migration.h"
#include "aggregate.h"
#include "status.h"

/* A connection's failure, as logged (the pool's POOL_WHY_MAX). */
#define PREFLIGHT_WHY_MAX 300

int preflight_db_open(struct db **out, const struct cfg_db *c)
{
	char why[PREFLIGHT_WHY_MAX];
	int rc = db_open_why(out, c, why, sizeof why);

	if (st_refusal(rc))
		log_refused(rc, "db", c->user, c->redacted, why);
	else if (rc != ST_OK)
		LOG(LOG_LEVEL_ERROR, "cannot connect to the database", LOG_S("link", "db"), LOG_S("user", c->user),
		    LOG_S("db", c->redacted), LOG_S("error", why));
	return rc;
}

struct lc_def *preflight_lifecycle_load(const struct cfg *conf, struct lc_errors *errs)
{
	if (conf->lifecycle != NULL && conf->lifecycle[0] != '\0')
		return lc_load_file(conf->lifecycle, errs);
	return lc_load_builtin(errs);
}

/* Kept for the process's life: agg_decide reads it from every thread. */
static struct lc_def *run_def;
static struct agg_binding run_binding;

int preflight_lifecycle(const struct cfg *conf)
{
	const char *name = conf->lifecycle != NULL && conf->lifecycle[0] != '\0' ? conf->lifecycle : NULL;
	struct lc_errors errs;
	struct lc_check chk;
	char why[512];

	run_def = preflight_lifecycle_load(conf, &errs);
	if (run_def == NULL) {
		/* one line: the first error; `lifecycle check` prints them all */
		fprintf(stderr, "inbox-worker: INBOX_LIFECYCLE %s: line %d: %s%s\n", name ? name : "(built-in)",
		        errs.e[0].line, errs.e[0].text, errs.n > 1 ? " (and more: run `inbox-worker lifecycle check`)" : "");
		return 2;
	}
	if (!lc_check_order_independence(run_def, &chk)) {
		fprintf(stderr, "inbox-worker: INBOX_LIFECYCLE %s %s: %s\n", name ? name : "(built-in)",
		        chk.sequenced ? "is refused" : "is order-dependent", chk.why);
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
	if (run_def->nstmts > 0) {
		const char *names[LC_MAX_EVENTS] = { NULL };

		for (int e = 0; e < run_def->nevents; e++)
			names[e] = effects_count(run_def, e) > 0 ? run_def->events[e].type : NULL;
		if (metrics_set_statement_events(names, run_def->nevents) != 0)
			LOG(LOG_LEVEL_WARN, "the lifecycle's statements are not counted in /metrics",
			    LOG_S("aggregate", run_def->aggregate));
	}
	for (int d = 0; d < run_def->ndests; d++) {
		struct http_dest dest;
		char err[600];
		int rc = lc_dest_resolve(run_def, d, &dest, err, sizeof err);

		http_dest_free(&dest);
		if (rc != ST_OK) {
			fprintf(stderr, "inbox-worker: INBOX_LIFECYCLE %s: %s\n", name ? name : "(built-in)", err);
			goto fail;
		}
	}
	if (run_def->ndests > 0) {
		const char *names[LC_MAX_DESTS];

		for (int d = 0; d < run_def->ndests; d++)
			names[d] = run_def->dests[d].name;
		if (metrics_set_destinations(names, run_def->ndests) != 0)
			LOG(LOG_LEVEL_WARN, "the lifecycle's destinations are not counted in /metrics",
			    LOG_S("aggregate", run_def->aggregate));
	}
	return 0;
fail:
	lc_free(run_def);
	run_def = NULL;
	return 2;
}

int preflight_effects(struct db *db, const struct lc_def *d, const char *file)
{
	struct effects *fx = NULL;
	struct effects_refusal r;
	char line[600];
	int rc;

	rc = effects_open(&fx, db, d, &r);
	effects_close(&fx);
	if (rc == ST_OK)
		return 0;
	if (rc == ST_ERR_DB_CONN)
		return 0; /* the pool waits for the database, and prepares them again */
	effects_refusal_line(d, &r, file, line, sizeof line);
	fprintf(stderr, "inbox-worker: %s\n", line);
	return 2;
}

int preflight_lifecycle_schema(const struct cfg *conf)
{
	static struct lc_column cols[LC_SCHEMA_COLUMNS_MAX];
	static char diff[8192];
	const struct lc_def *d = agg_current()->def;
	const char *name = conf->lifecycle != NULL && conf->lifecycle[0] != '\0' ? conf->lifecycle : "(built-in)";
	struct db *db = NULL;
	int n = 0, rc, code = 0;

	rc = db_open(&db, &conf->db);
	if (rc != ST_OK)
		return 0; /* the pool waits for it, or says why not, in its own line */
	rc = lc_schema_read(db, d, cols, LC_SCHEMA_COLUMNS_MAX, &n);
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
		goto cleanup;
	}
	code = preflight_effects(db, d, name);
cleanup:
	db_rollback(db);
	db_close(&db);
	return code;
}

/* ---- the migrations ------------------------------------------------------ */

int preflight_known_migrations(const struct cfg *conf)
{
	struct db *db = NULL;
	bool have_table = false;
	char **names = NULL, unknown[201] = "";
	int count = 0, code = 0, rc;

	/* A database that is away now is the pool's to wait for; the check
	 * needs it, so it is skipped (said), not made a reason to exit. */
	rc = db_open(&db, &conf->db);
	if (rc == ST_ERR_ACCESS)
		return 0; /* refused: the pool says so in its one line, and exits */
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_WARN, "cannot check the schema's migrations at start-up: the database is unavailable",
		    LOG_S("db", conf->db.redacted), LOG_S("error", st_strerror(rc)));
		return 0;
	}
	if (migration_list(conf->migrations_dir, migration_name_ok, &names, &count) != ST_OK) {
		LOG(LOG_LEVEL_WARN, "cannot check the schema's migrations at start-up: cannot list the migrations",
		    LOG_S("dir", conf->migrations_dir), LOG_S("error", strerror(errno)));
		goto cleanup;
	}
	rc = migration_have_table(db, &have_table);
	/* Never migrated: the worker's first statement says so. */
	if (rc == ST_OK && have_table)
		rc = migration_find_unknown(db, names, count, unknown, sizeof unknown);
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_WARN, "cannot check the schema's migrations at start-up",
		    LOG_S("error", db_errmsg(db)));
		goto cleanup;
	}
	if (unknown[0] != '\0') {
		migration_log_unknown("the database holds a migration this build does not know; refusing to start",
		                    unknown, conf->migrations_dir);
		code = 1;
	}
cleanup:
	db_rollback(db);
	migration_names_free(names, count);
	db_close(&db);
	return code;
}
