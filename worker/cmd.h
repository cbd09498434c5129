/*
 * cmd.h - the commands of inbox-worker, one file each (cmd_run.c,
 * cmd_migrate.c, cmd_cleanup.c, cmd_dlq.c), in the one shape main.c runs
 * them by: take the command's own words and options out of argv (args.h),
 * load the settings from what is left (cfg.h), run.  main.c owns
 * everything around that (--help, the settings, logging, the database
 * client's global state), once for all of them.  The start-up checks
 * several of them share are preflight.h's: no command includes another
 * command's header, nor the pool's (but run, which starts it).
 *
 * Ownership: a command's options point into argv; run gets the loaded
 * settings read-only and opens and closes every connection it uses.
 */
#ifndef INBOX_CMD_H
#define INBOX_CMD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "args.h"
#include "cfg.h"
#include "cmd_dlq.h"

/* Every command's own options; each command reads its part. */
struct cmd_opts {
	bool dry_run;        /* cleanup --dry-run */
	bool status;         /* migrate --status */
	bool contract;       /* migrate --contract */
	struct dlq_opts dlq; /* dlq SUBCOMMAND ... */
};

struct cmd {
	const char *name;
	/* Take the command's words and options out of argv (argv[0] is its
	 * name), leaving its name and the settings' flags for cfg_load,
	 * *argc updated: ARGS_OK, or ARGS_ERROR with one line in err.  NULL:
	 * the command has none of its own. */
	enum args_result (*take)(int *argc, char **argv, struct cmd_opts *o, char *err, size_t cap);
	/* The process's exit code: 0 done, 1 a runtime failure. */
	int (*run)(const struct cfg *conf, const struct cmd_opts *o);
	/* Its lines of --help. */
	void (*usage)(FILE *f);
};

extern const struct cmd cmd_run, cmd_migrate, cmd_cleanup, cmd_dlq;

#endif
