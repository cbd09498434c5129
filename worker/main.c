/*
 * main.c - `inbox-worker run | migrate | cleanup | dlq ...`: a table of
 * commands (cmd.h, one file each) and the one path every command takes:
 * its own words and options, the settings, logging and the database
 * client, run, and everything released once.
 *
 * Exit codes (SPEC.md): 0 done, 1 runtime failure, 2 usage or configuration
 * error (one line naming the bad setting).
 */
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "array.h"
#include "cfg.h"
#include "cmd.h"
#include "cmd_lifecycle.h"
#include "config.h"
#include "db.h"
#include "log.h"
#include "status.h"
#include "version.h"

#define USAGE "usage: inbox-worker run|migrate|cleanup|dlq [options] | lifecycle check|schema FILE | lifecycle diff OLD NEW"

/* In the order --help lists them. */
static const struct cmd *const commands[] = { &cmd_run, &cmd_migrate, &cmd_cleanup, &cmd_dlq };

static void usage(FILE *f)
{
	fprintf(f, "%s\n\n", USAGE);
	for (size_t i = 0; i < ARRAY_LEN(commands); i++)
		commands[i]->usage(f);
	lifecycle_usage(f);
	fputc('\n', f);
	cfg_print_help(f, NULL, NULL);
}

static int say_help(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	usage(stdout);
	return 0;
}

/* "inbox-worker VERSION (COMMIT)": the release, and the commit it was built
 * from (version.h), which is what names a build in CHANGELOG.md and in a
 * bug report.  A scripted reader takes the second word for the version. */
static int say_version(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	printf("inbox-worker %s (%s)\n", INBOX_VERSION, INBOX_COMMIT);
	return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}

/* Not in --help: the settings table as the SETTINGS section of
 * inbox-worker(1) (man/meson.build builds it from this) and as README.md's
 * table (tests/unit/test_docs.c holds the README to it). */
static int say_doc(enum cfg_doc_format fmt)
{
	cfg_print_doc(stdout, fmt, NULL);
	return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}

static int say_man(int argc, char **argv)
{
	if (argc < 3 || strcmp(argv[2], "settings") != 0) {
		fprintf(stderr, "inbox-worker: --help-man settings\n");
		return 2;
	}
	return say_doc(CFG_DOC_MAN);
}

static int say_readme(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	return say_doc(CFG_DOC_README);
}

/* `lifecycle check|schema FILE` reads a file and no settings. */
static int say_lifecycle(int argc, char **argv)
{
	return lifecycle_main(argc - 1, argv + 1, stdout, stderr);
}

/* The words in the place of a command that are not one. */
static const struct {
	const char *name;
	int (*say)(int argc, char **argv);
} answers[] = {
	{ "--help", say_help }, { "-h", say_help }, { "help", say_help }, { "--version", say_version },
	{ "--help-man", say_man }, { "--help-readme", say_readme }, { "lifecycle", say_lifecycle },
};

/* Command c with argv[0] its name: its own arguments, the settings,
 * logging and the database client around c->run.  The exit code. */
static int run_command(const struct cmd *c, int argc, char **argv)
{
	struct cmd_opts opts = { 0 };
	struct cfg conf;
	char err[512];
	enum args_result asked = args_asks(argc, argv);
	int code;

	if (asked == ARGS_HELP)
		return say_help(argc, argv);
	if (asked == ARGS_VERSION)
		return say_version(argc, argv);
	if (c->take != NULL && c->take(&argc, argv, &opts, err, sizeof err) != ARGS_OK) {
		fprintf(stderr, "inbox-worker: %s\n", err);
		return 2;
	}
	/* cfg_load copies what it keeps, so the passwords in argv can go,
	 * whatever the outcome: they are visible to every local user. */
	enum cfg_result loaded = cfg_load(&conf, argc, argv, err, sizeof err);

	cfg_scrub_argv(argc, argv);
	switch (loaded) {
	case CFG_OK:
		break;
	case CFG_HELP:
		return say_help(argc, argv);
	case CFG_VERSION:
		return say_version(argc, argv);
	case CFG_ERROR:
	default:
		fprintf(stderr, "inbox-worker: %s\n", err);
		return 2;
	}
	log_setup(conf.log_level, conf.log_format);
	if (db_global_init() != 0) {
		LOG0(LOG_LEVEL_ERROR, "mysql_library_init failed");
		code = 1;
	} else {
		code = c->run(&conf, &opts);
		db_global_end();
	}
	cfg_free(&conf);
	return code;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "inbox-worker: missing command\n%s\n", USAGE);
		return 2;
	}
	for (size_t i = 0; i < ARRAY_LEN(answers); i++)
		if (strcmp(argv[1], answers[i].name) == 0)
			return answers[i].say(argc, argv);
	for (size_t i = 0; i < ARRAY_LEN(commands); i++)
		if (strcmp(argv[1], commands[i]->name) == 0)
			return run_command(commands[i], argc - 1, argv + 1);
	fprintf(stderr, "inbox-worker: unknown command '%s'\n%s\n", argv[1], USAGE);
	return 2;
}
