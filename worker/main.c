/*
 * main.c - `inbox-worker run | migrate | cleanup | dlq ...`.
 *
 * Exit codes (SPEC.md): 0 done, 1 runtime failure, 2 usage or configuration
 * error (one line naming the bad setting).
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cfg.h"
#include "cmd_lifecycle.h"
#include "config.h"
#include "db.h"
#include "dlq.h"
#include "log.h"
#include "janitor.h"
#include "migrate.h"
#include "pool.h"
#include "retention.h"
#include "status.h"

#define USAGE "usage: inbox-worker run|migrate|cleanup|dlq [options] | lifecycle check|schema FILE"

static void usage(FILE *f)
{
	fprintf(f, "%s\n\n"
	           "  run       consume the queue and apply each message exactly once\n"
	           "  migrate   apply the SQL files of the migrations folder not yet applied\n"
	           "            (--status: list applied, pending and changed files with their\n"
	           "            checksums; applies nothing)\n"
	           "  cleanup   delete inbox rows older than the retention window, then exit\n"
	           "            (--dry-run: count what it would delete, delete nothing)\n"
	           "  lifecycle check FILE\n"
	           "            validate a lifecycle definition, print its decision table and check\n"
	           "            that it is arrival-order independent (doc/lifecycle.md)\n"
	           "  lifecycle schema FILE\n"
	           "            print the tables the definition needs (what migrate creates with\n"
	           "            INBOX_LIFECYCLE=FILE)\n",
	        USAGE);
	dlq_usage(f);
	fputc('\n', f);
	cfg_print_help(f, NULL);
}

/* `cleanup --dry-run`: the counts a cleanup would delete now, nothing
 * deleted.  Exit 0, or 1 when the database cannot be read. */
static int cleanup_dry_run(const struct cfg *conf)
{
	struct db *db = NULL;
	uint64_t inbox_rows = 0, outbox_rows = 0;
	int rc;

	rc = pool_db_open(&db, &conf->db);
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

int main(int argc, char **argv)
{
	struct cfg conf;
	char err[512];
	const char *cmd;
	bool dry_run = false, status = false;
	struct dlq_opts dlq;
	int code;

	if (argc < 2) {
		fprintf(stderr, "inbox-worker: missing command\n%s\n", USAGE);
		return 2;
	}
	cmd = argv[1];
	if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
		usage(stdout);
		return 0;
	}
	if (strcmp(cmd, "--version") == 0) {
		printf("inbox-worker %s\n", INBOX_VERSION);
		return 0;
	}
	/* Not in --help: the settings table as the SETTINGS section of
	 * inbox-worker(1) (man/meson.build builds it from this) and as
	 * README.md's table (tests/test_docs.c holds the README to it). */
	if (strcmp(cmd, "--help-man") == 0 && (argc < 3 || strcmp(argv[2], "settings") != 0)) {
		fprintf(stderr, "inbox-worker: --help-man settings\n");
		return 2;
	}
	if (strcmp(cmd, "--help-man") == 0 || strcmp(cmd, "--help-readme") == 0) {
		cfg_print_doc(stdout, strcmp(cmd, "--help-man") == 0 ? CFG_DOC_MAN : CFG_DOC_README, NULL);
		return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
	}
	/* Reads a file, no settings. */
	if (strcmp(cmd, "lifecycle") == 0)
		return lifecycle_main(argc - 1, argv + 1, stdout, stderr);
	if (strcmp(cmd, "run") != 0 && strcmp(cmd, "migrate") != 0 && strcmp(cmd, "cleanup") != 0 &&
	    strcmp(cmd, "dlq") != 0) {
		fprintf(stderr, "inbox-worker: unknown command '%s'\n%s\n", cmd, USAGE);
		return 2;
	}
	/* cleanup's and migrate's own flags, taken out before the settings
	 * are read. */
	if (strcmp(cmd, "cleanup") == 0 || strcmp(cmd, "migrate") == 0) {
		const char *own = cmd[0] == 'c' ? "--dry-run" : "--status";
		int j = 2;
		for (int i = 2; i < argc; i++) {
			if (strcmp(argv[i], own) != 0)
				argv[j++] = argv[i];
			else if (cmd[0] == 'c')
				dry_run = true;
			else
				status = true;
		}
		argc = j;
		argv[argc] = NULL;
	}
	/* dlq's subcommand and its own flags, likewise; the settings are
	 * run's. */
	if (strcmp(cmd, "dlq") == 0 && dlq_take_args(&argc, argv, &dlq, err, sizeof err) != 0) {
		fprintf(stderr, "inbox-worker: %s\n", err);
		return 2;
	}
	/* cfg_load copies what it keeps, so the passwords in argv can go,
	 * whatever the outcome: they are visible to every local user. */
	enum cfg_result loaded = cfg_load(&conf, argc - 1, argv + 1, err, sizeof err);

	cfg_scrub_argv(argc - 1, argv + 1);
	switch (loaded) {
	case CFG_OK:
		break;
	case CFG_HELP:
		usage(stdout);
		return 0;
	case CFG_VERSION:
		printf("inbox-worker %s\n", INBOX_VERSION);
		return 0;
	case CFG_ERROR:
	default:
		fprintf(stderr, "inbox-worker: %s\n", err);
		return 2;
	}
	log_setup(conf.log_level, conf.log_format);
	if (db_global_init() != 0) {
		LOG0(LOG_LEVEL_ERROR, "mysql_library_init failed");
		cfg_free(&conf);
		return 1;
	}
	if (strcmp(cmd, "migrate") == 0) {
		code = status ? migrate_status(&conf) : migrate_main(&conf);
		/* A lifecycle of the user's own: its tables after the migrations. */
		if (code == 0 && !status && conf.lifecycle != NULL && conf.lifecycle[0] != '\0')
			code = lifecycle_migrate(&conf);
	}
	/* Every command that writes rows refuses a database that a newer
	 * build migrated (migrate itself says so in migrate_main). */
	else if (strcmp(cmd, "cleanup") == 0)
		code = dry_run ? cleanup_dry_run(&conf) : migrate_check_known(&conf) != 0 ? 1 : cleanup_main(&conf);
	else if (strcmp(cmd, "dlq") == 0)
		code = dlq.cmd == DLQ_REPLAY && !dlq.dry_run && migrate_check_known(&conf) != 0 ? 1
		                                                                              : dlq_main(&conf, &dlq, stdout);
	else if (lifecycle_setup(&conf) != 0 || lifecycle_schema_check(&conf) != 0)
		code = 2; /* said */
	else
		code = migrate_check_known(&conf) != 0 ? 1 : pool_main(&conf);
	db_global_end();
	cfg_free(&conf);
	return code;
}
