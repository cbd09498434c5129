/*
 * cmd_run.c - `inbox-worker run`: the pool (pool.h) until SIGTERM.  It has
 * no options of its own: every one is a setting (cfg.h).
 */
#include "cmd.h"
#include "envelope.h"
#include "pool.h"
#include "preflight.h"

/* The lifecycle definition is loaded, checked and bound before any thread
 * starts (exit 2: it cannot run), the settings that name its types judged
 * by it, and a database that a newer build migrated is refused: this
 * build's statements may not fit it. */
static int run_main(const struct cfg *conf, const struct cmd_opts *o)
{
	char err[512];

	(void)o;
	if (preflight_lifecycle(conf) != 0)
		return 2; /* said */
	if (env_check_settings(conf, err, sizeof err) != 0) {
		fprintf(stderr, "inbox-worker: %s\n", err);
		return 2;
	}
	if (preflight_lifecycle_schema(conf) != 0)
		return 2; /* said */
	return preflight_known_migrations(conf) != 0 ? 1 : pool_main(conf);
}

static void run_usage(FILE *f)
{
	fputs("  run       consume the queue and apply each message exactly once\n", f);
}

const struct cmd cmd_run = { "run", NULL, run_main, run_usage };
