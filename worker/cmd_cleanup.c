/*
 * cmd_cleanup.c - `inbox-worker cleanup [--dry-run]`: one retention pass
 * (retention.h) run to the end, then exit; --dry-run counts what it would
 * delete and deletes nothing.  The pool's janitor runs the same retention
 * in slices between its other work (janitor.c).
 */
#include <stddef.h>
#include <stdint.h>

#include "array.h"
#include "cmd.h"
#include "db.h"
#include "log.h"
#include "preflight.h"
#include "retention.h"
#include "status.h"

/* Slices until caught up, one process at a time.  It waits a moment for
 * the cleanup lock, long enough for a janitor's tick to end (a tick starts
 * no slice after RETENTION_CLEANUP_BUDGET_MS), so a cron job is not skipped
 * because a pool happened to be mid-tick; a real second cleanup holds it
 * for longer, and then this one skips (exit 0: the other run does the
 * work). */
#define CLEANUP_LOCK_WAIT_S 1
_Static_assert(CLEANUP_LOCK_WAIT_S * 1000 > RETENTION_CLEANUP_BUDGET_MS,
               "cleanup's lock wait outlasts one janitor tick");

static int cleanup_main(const struct cfg *conf)
{
	static const struct retention_limits lim = {
		.slice_rows = RETENTION_SLICE_ROWS,
		.max_slices = 0,
		.budget_ms = 0,
		.lock_wait_s = CLEANUP_LOCK_WAIT_S,
		.retries = 60, /* about a minute of conflicts in a row on one slice */
	};
	struct db *db = NULL;
	struct retention *ret = NULL;
	enum retention_state state = RETENTION_MORE;
	uint64_t deleted = 0;
	int rc;

	rc = preflight_db_open(&db, &conf->db);
	if (rc != ST_OK)
		return 1; /* said */
	rc = retention_open(&ret, db, conf);
	if (rc == ST_OK)
		rc = retention_run(ret, &lim, &state, &deleted);
	if (rc == ST_OK && state == RETENTION_MORE)
		rc = ST_ERR_DB_LOCK_TIMEOUT; /* the retries ran out */
	if (rc != ST_OK)
		LOG(LOG_LEVEL_ERROR, "cleanup failed", LOG_I("deleted", deleted),
		    LOG_S("error", db ? db_errmsg(db) : st_strerror(rc)));
	else if (state == RETENTION_BUSY)
		LOG0(LOG_LEVEL_INFO, "cleanup skipped: another process holds the cleanup lock");
	else
		LOG(LOG_LEVEL_INFO, "cleanup done", LOG_I("deleted", deleted), LOG_I("retention_s", conf->retention_s));
	retention_close(&ret);
	db_close(&db);
	return rc == ST_OK ? 0 : 1;
}

/* `cleanup --dry-run`: the counts a cleanup would delete now, nothing
 * deleted.  Exit 0, or 1 when the database cannot be read. */
static int cleanup_dry_run(const struct cfg *conf)
{
	struct db *db = NULL;
	uint64_t inbox_rows = 0, outbox_rows = 0;
	int rc;

	rc = preflight_db_open(&db, &conf->db);
	if (rc != ST_OK)
		return 1; /* said */
	rc = retention_count(db, conf, &inbox_rows, &outbox_rows);
	if (rc != ST_OK)
		LOG(LOG_LEVEL_ERROR, "cleanup dry run failed", LOG_S("error", db ? db_errmsg(db) : st_strerror(rc)));
	else
		LOG(LOG_LEVEL_INFO, "cleanup dry run: would delete these rows, deleted nothing",
		    LOG_I("processed_messages", inbox_rows), LOG_I("outbox", outbox_rows),
		    LOG_I("retention_s", conf->retention_s));
	db_close(&db);
	return rc == ST_OK ? 0 : 1;
}

/* A cleanup that deletes refuses a database a newer build migrated; a dry
 * run only reads. */
static int cleanup_run(const struct cfg *conf, const struct cmd_opts *o)
{
	if (o->dry_run)
		return cleanup_dry_run(conf);
	return preflight_known_migrations(conf) != 0 ? 1 : cleanup_main(conf);
}

static const char *const cleanup_names[] = { "cleanup" };
static const struct args_opt cleanup_opts[] = {
	{ "--dry-run", ARGS_ALL, ARGS_FLAG, 0, 0, offsetof(struct cmd_opts, dry_run), 0, NULL,
	  "count what it would delete, delete nothing" },
};
static const struct args_spec cleanup_spec = {
	.prefix = "", .cmd_names = cleanup_names, .ncmds = ARRAY_LEN(cleanup_names),
	.opts = cleanup_opts, .nopts = ARRAY_LEN(cleanup_opts),
};

static enum args_result cleanup_take(int *argc, char **argv, struct cmd_opts *o, char *err, size_t cap)
{
	return args_take(&cleanup_spec, 0, argc, argv, o, err, cap);
}

static void cleanup_usage(FILE *f)
{
	fputs("  cleanup   delete inbox rows older than the retention window, then exit\n"
	      "            (--dry-run: count what it would delete, delete nothing)\n", f);
}

const struct cmd cmd_cleanup = { "cleanup", cleanup_take, cleanup_run, cleanup_usage };
