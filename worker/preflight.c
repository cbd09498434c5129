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
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "array.h"
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

/* ---- the definition against the rows it inherits ------------------------ */

/* Rows of one GROUP BY read (states or types x versions): far more than a
 * database holds unless versions pile up; the rest is not read. */
#define PF_GROUPS_MAX 4096
#define PF_VERSIONS_MAX 16  /* earlier versions named; the rest counted together */
#define PF_MISSING_MAX 16   /* states or events said one line each; the rest counted */
#define PF_NAME_MAX 200     /* a status or type as read (LEFT(..., 200)) */

/* What an earlier version decided: its rows and its held events. */
struct pf_version {
	char v[LC_VERSION_MAX + 1]; /* "unrecorded" for NULL (before migration 0020) */
	int64_t rows, held;
};

/* A state rows are in, or an event held events are of, that the
 * definition lacks; top: the version that decided most of them. */
struct pf_missing {
	char name[4 * PF_NAME_MAX + 1]; /* 4 bytes a character: a column of yours may be utf8mb4 */
	int64_t n, top_n;
	char top[LC_VERSION_MAX + 1];
};

struct pf_seen {
	struct pf_version ver[PF_VERSIONS_MAX];
	int nver;
	int64_t other_rows, other_held; /* of versions past PF_VERSIONS_MAX */
	struct pf_missing miss[2][PF_MISSING_MAX]; /* [0] states, [1] events */
	int nmiss[2], more[2];
};

/* One group read: n rows (held: held events) of name decided under
 * version v (NULL: unrecorded). */
static void pf_tally(struct pf_seen *s, const struct lc_def *d, bool held, const char *name, const char *v,
                     int64_t n)
{
	const char *ver = v != NULL ? v : "unrecorded";
	bool known = held ? lc_event_find(d, name) >= 0 : lc_state_find(d, name) >= 0;
	int k = held ? 1 : 0, i;

	if (v == NULL || strcmp(v, d->version) != 0) {
		for (i = 0; i < s->nver && strcmp(s->ver[i].v, ver) != 0; i++)
			;
		if (i == s->nver && s->nver < PF_VERSIONS_MAX)
			snprintf(s->ver[s->nver++].v, sizeof s->ver[0].v, "%s", ver);
		if (i < s->nver)
			*(held ? &s->ver[i].held : &s->ver[i].rows) += n;
		else
			*(held ? &s->other_held : &s->other_rows) += n;
	}
	if (known)
		return;
	for (i = 0; i < s->nmiss[k] && strcmp(s->miss[k][i].name, name) != 0; i++)
		;
	if (i == s->nmiss[k]) {
		if (s->nmiss[k] == PF_MISSING_MAX) {
			s->more[k]++;
			return;
		}
		snprintf(s->miss[k][s->nmiss[k]++].name, sizeof s->miss[k][0].name, "%s", name);
	}
	s->miss[k][i].n += n;
	if (n > s->miss[k][i].top_n) {
		s->miss[k][i].top_n = n;
		snprintf(s->miss[k][i].top, sizeof s->miss[k][i].top, "%s", ver);
	}
}

/* Read a GROUP BY of (name, version, count) into s. */
static int pf_read_groups(struct db *db, const char *sql, const struct db_param *p, int np, bool held,
                          const struct lc_def *d, struct pf_seen *s)
{
	struct db_stmt *q = NULL;
	char name[4 * PF_NAME_MAX + 1], v[LC_VERSION_MAX + 1];
	int rc = db_prepare(db, &q, sql);

	if (rc == ST_OK)
		rc = db_stmt_query(q, p, np);
	for (int i = 0; rc == ST_OK; i++) {
		struct db_col c[] = { DBC_STR(name, sizeof name), DBC_STR(v, sizeof v), DBC_I64() };
		int r;

		if (i == PF_GROUPS_MAX) {
			db_stmt_done(q); /* the rest is not read: the lines say enough */
			break;
		}
		r = db_stmt_fetch(q, c, ARRAY_LEN(c));
		if (r < 0)
			rc = r;
		if (r <= 0)
			break;
		pf_tally(s, d, held, name, c[1].is_null ? NULL : v, c[2].i64);
	}
	return rc;
}

/* The version that decided the most, and what it decided. */
static const struct pf_version *pf_top(const struct pf_seen *s)
{
	const struct pf_version *t = &s->ver[0];

	for (int i = 1; i < s->nver; i++)
		if (s->ver[i].rows + s->ver[i].held > t->rows + t->held)
			t = &s->ver[i];
	return t;
}

/* One line on stderr for each state rows are in and each event held
 * events are of that d lacks, with the count and the remedy; how many. */
static int pf_refusals(const struct pf_seen *s, const struct lc_def *d)
{
	int n = 0;

	for (int i = 0; i < s->nmiss[0]; i++, n++)
		fprintf(stderr, "inbox-worker: the definition (version %s) has no state %s, which %lld %s rows are in: add "
		        "the state back, or move those rows (UPDATE %s SET status = '<a state of version %s>' WHERE status "
		        "= '%s') before starting version %s\n", d->version, s->miss[0][i].name,
		        (long long)s->miss[0][i].n, d->table, d->table, d->version, s->miss[0][i].name, d->version);
	for (int i = 0; i < s->nmiss[1]; i++, n++) {
		const struct pf_missing *m = &s->miss[1][i];
		char run[LC_VERSION_MAX + 32];

		/* Held under this very version: it changed and kept its name. */
		if (strcmp(m->top, "unrecorded") == 0 || strcmp(m->top, d->version) == 0)
			snprintf(run, sizeof run, "the definition they were held under");
		else
			snprintf(run, sizeof run, "version %s", m->top);
		fprintf(stderr, "inbox-worker: the definition (version %s) has no event %s, which %lld held events are of: "
		        "keep it (run %s) until they are released or expire (INBOX_HOLD_TTL), then start version %s\n",
		        d->version, m->name, (long long)m->n, run, d->version);
	}
	if (s->more[0] + s->more[1] > 0) {
		fprintf(stderr, "inbox-worker: the definition (version %s) lacks %d more states and %d more events that rows "
		        "and held events use: see `SELECT status, COUNT(*) FROM %s GROUP BY status` and held_events\n",
		        d->version, s->more[0], s->more[1], d->table);
		n++;
	}
	return n;
}

/* What earlier versions decided, said once the definition is accepted. */
static void pf_say_versions(const struct pf_seen *s, const struct lc_def *d)
{
	const struct pf_version *t;
	char msg[512];
	int w;

	if (s->nver == 0)
		return;
	t = pf_top(s);
	w = snprintf(msg, sizeof msg, "definition version changed from %s to %s: %lld rows, %lld held events decided "
	             "under %s", t->v, d->version, (long long)t->rows, (long long)t->held, t->v);
	if (s->nver > 1 && w > 0 && (size_t)w < sizeof msg) {
		int64_t rows = s->other_rows, held = s->other_held;

		for (int i = 0; i < s->nver; i++) {
			if (&s->ver[i] != t) {
				rows += s->ver[i].rows;
				held += s->ver[i].held;
			}
		}
		snprintf(msg + w, sizeof msg - (size_t)w, "; %lld rows, %lld held events under %d other earlier versions",
		         (long long)rows, (long long)held, s->nver - 1);
	}
	LOG(LOG_LEVEL_INFO, msg, LOG_S("from", t->v), LOG_S("to", d->version), LOG_I("rows", t->rows),
	    LOG_I("held", t->held));
}

/*
 * The rows and held events the database holds against d, before anything
 * is consumed: a state rows are in or an event held events are of that d
 * no longer has would fail every batch that meets one (the claim cannot
 * read the row, the release cannot decide the event), so it is refused
 * here, one line each.  One GROUP BY each (by status or type and by the
 * version that decided them), which reads every row of the aggregate's
 * table once: it has no index on status, and one on the version would
 * cost every write.  0, or 2 (said); a read that fails is a warning.
 */
static int preflight_lifecycle_rows(struct db *db, const struct lc_def *d, const char *consumer)
{
	static struct pf_seen seen;
	char sql[512];
	int rc;

	memset(&seen, 0, sizeof seen);
	snprintf(sql, sizeof sql, "SELECT LEFT(status, %d), lifecycle_version, COUNT(*) FROM `%s`"
	         " GROUP BY status, lifecycle_version", PF_NAME_MAX, d->table);
	rc = pf_read_groups(db, sql, NULL, 0, false, d, &seen);
	if (rc == ST_OK) {
		struct db_param p[] = { DBP_STR(consumer) };

		snprintf(sql, sizeof sql, "SELECT LEFT(type, %d), lifecycle_version, COUNT(*) FROM held_events"
		         " WHERE consumer = ? GROUP BY type, lifecycle_version", PF_NAME_MAX);
		rc = pf_read_groups(db, sql, p, ARRAY_LEN(p), true, d, &seen);
	}
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_WARN, "cannot compare the definition with the rows at start-up", LOG_S("error", db_errmsg(db)));
		return 0;
	}
	if (pf_refusals(&seen, d) > 0)
		return 2;
	pf_say_versions(&seen, d);
	return 0;
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
	code = preflight_lifecycle_rows(db, d, conf->consumer);
	if (code == 0)
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
	char **names = NULL, unknown[201] = "", pending[201] = "";
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
	if (rc == ST_OK && have_table && unknown[0] == '\0')
		rc = migration_find_pending(db, conf->migrations_dir, names, count, pending, sizeof pending);
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_WARN, "cannot check the schema's migrations at start-up",
		    LOG_S("error", db_errmsg(db)));
		goto cleanup;
	}
	if (unknown[0] != '\0') {
		migration_log_unknown("the database holds a migration this build does not know; refusing to start",
		                    unknown, conf->migrations_dir);
		code = 1;
	} else if (pending[0] != '\0') {
		/* This build's statements are written for its whole schema; an
		 * older one may take some of them and fail the rest mid-run.
		 * Contract files may wait: they only drop what it never uses. */
		fprintf(stderr,
		        "inbox-worker: the database lacks migration %s of this build: run `inbox-worker migrate` (workers of "
		        "the earlier release may keep running meanwhile), then start this one\n",
		        pending);
		code = 1;
	}
cleanup:
	db_rollback(db);
	migration_names_free(names, count);
	db_close(&db);
	return code;
}
