/*
 * test_cli.c - the command line contract of SPEC.md: a configuration error
 * exits 2 with one line naming the setting; --help and --version exit 0,
 * and --version names the release and the commit it was built from.
 * Runs the real binary; needs no servers (the error is found before any
 * connection is made).
 */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "config.h"

/* Run program bin with env assignments prefixed; capture stderr, or
 * stdout when want_stdout. */
static int run_program(const char *bin, const char *env, const char *args, bool want_stdout, char *err, size_t cap)
{
	char cmd[2048];
	FILE *p;
	size_t n;
	int st;

	cr_assert_not_null(bin);
	snprintf(cmd, sizeof cmd, "env -i PATH=/usr/bin:/bin %s %s %s %s", env, bin, args,
	         want_stdout ? "2>/dev/null" : "2>&1 >/dev/null");
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	n = fread(err, 1, cap - 1, p);
	err[n] = '\0';
	st = pclose(p);
	cr_assert(WIFEXITED(st));
	return WEXITSTATUS(st);
}

/* The worker, stderr captured. */
static int run(const char *env, const char *args, char *err, size_t cap)
{
	return run_program(getenv("INBOX_WORKER_BIN"), env, args, false, err, cap);
}

struct bad {
	const char *env;
	const char *args;
	const char *line;
};

Test(cli, every_class_of_bad_value_exits_2_with_one_line)
{
	static const struct bad cases[] = {
		{ "INBOX_THREADS=abc", "run", "inbox-worker: INBOX_THREADS: not a number: 'abc'\n" },
		{ "INBOX_THREADS=0", "run", "inbox-worker: INBOX_THREADS: out of range [1, 256]: '0'\n" },
		{ "", "run --prefetch 70000", "inbox-worker: INBOX_PREFETCH: out of range [1, 65535]: '70000'\n" },
		{ "INBOX_RETENTION=5x", "run", "inbox-worker: INBOX_RETENTION: bad duration: '5x' (use e.g. 30s, 10m, 7d)\n" },
		{ "INBOX_AMQP_URL=http://h/", "run", NULL },
		{ "INBOX_DB_URL=mysql://u:secret@/db", "run", NULL },
		{ "INBOX_DB_URL_FILE=/nonexistent/url", "run",
		  "inbox-worker: INBOX_DB_URL_FILE: cannot read '/nonexistent/url': No such file or directory\n" },
		{ "INBOX_LOG_FORMAT=xml", "run", "inbox-worker: INBOX_LOG_FORMAT: must be one of text, json: 'xml'\n" },
		{ "", "run --bogus", "inbox-worker: --bogus: unknown flag (see --help)\n" },
	};
	char err[1024];

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		int code = run(cases[i].env, cases[i].args, err, sizeof err);
		cr_expect_eq(code, 2, "%s %s: exit %d, want 2", cases[i].env, cases[i].args, code);
		cr_expect_eq(strchr(err, '\n') - err + 1, (long)strlen(err), "%s: exactly one line: %s", cases[i].env, err);
		cr_expect_null(strstr(err, "secret"), "a password must never be printed: %s", err);
		if (cases[i].line != NULL)
			cr_expect_str_eq(err, cases[i].line);
		else
			cr_expect(strstr(err, "_URL: ") != NULL, "the line names the URL setting: %s", err);
	}
}

Test(cli, help_and_version_exit_0)
{
	char out[65536];

	cr_assert_eq(run("", "--version", out, sizeof out), 0);
	cr_assert_eq(run("", "run --help", out, sizeof out), 0);
	cr_assert_eq(run("", "help", out, sizeof out), 0);
}

/* The commit this tree is, found here without the build's script: git's
 * HEAD when the source root is the top of a work tree, the commit a
 * release tarball records (.tarball-commit), else "unknown". */
static void tree_commit(char *out, size_t cap)
{
	const char *root = getenv("INBOX_SOURCE_ROOT");
	char cmd[4096];
	FILE *p;
	size_t n;

	cr_assert_not_null(root, "INBOX_SOURCE_ROOT is set by meson");
	cr_assert_null(strchr(root, '\''), "a source root with a quote: %s", root);
	snprintf(cmd, sizeof cmd,
	         "cd '%s' && if top=$(git rev-parse --show-toplevel 2>/dev/null) && "
	         "[ \"$(cd \"$top\" && pwd -P)\" = \"$(pwd -P)\" ]; then git rev-parse --short=12 HEAD; "
	         "elif [ -f .tarball-commit ]; then head -n 1 .tarball-commit; else echo unknown; fi",
	         root);
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	n = fread(out, 1, cap - 1, p);
	out[n] = '\0';
	cr_assert_eq(pclose(p), 0, "%s", cmd);
	out[strcspn(out, "\n")] = '\0';
	cr_assert_gt(strlen(out), 0);
}

/* What `NAME --version` must print: "NAME VERSION (COMMIT)\n", the
 * project's version and the tree's commit, "-dirty" after it when a
 * tracked file differs from that commit (only a checkout can say so). */
static void expect_version_line(const char *name, const char *out)
{
	char want[256], commit[128];
	size_t n;

	tree_commit(commit, sizeof commit);
	n = (size_t)snprintf(want, sizeof want, "%s %s (%s", name, INBOX_VERSION, commit);
	cr_assert_eq(strncmp(out, want, n), 0, "--version printed '%s', want '%s)'", out, want);
	cr_expect(strcmp(out + n, ")\n") == 0 || (strcmp(commit, "unknown") != 0 && strcmp(out + n, "-dirty)\n") == 0),
	          "--version printed '%s', want '%s)' or '%s-dirty)'", out, want, want);
}

Test(cli, version_names_the_release_and_its_commit)
{
	char out[1024];

	cr_assert_eq(run_program(getenv("INBOX_WORKER_BIN"), "", "--version", true, out, sizeof out), 0);
	expect_version_line("inbox-worker", out);
	cr_assert_eq(run_program(getenv("INBOX_LOADGEN_BIN"), "", "--version", true, out, sizeof out), 0);
	expect_version_line("inbox-loadgen", out);
}

Test(cli, unknown_command_exits_2)
{
	char err[1024];

	cr_assert_eq(run("", "frobnicate", err, sizeof err), 2);
	cr_assert_eq(run("", "", err, sizeof err), 2);
}

/* A URL given as a flag is visible in `ps` until the worker masks it, so
 * --help points at the variable or a *_URL_FILE for every URL. */
Test(cli, help_recommends_the_environment_or_a_file_for_urls)
{
	const char *bin = getenv("INBOX_WORKER_BIN");
	char cmd[1024], out[65536];
	size_t n;
	FILE *p;

	cr_assert_not_null(bin);
	snprintf(cmd, sizeof cmd, "env -i PATH=/usr/bin:/bin %s run --help", bin);
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	n = fread(out, 1, sizeof out - 1, p);
	out[n] = '\0';
	cr_assert_eq(pclose(p), 0);
	cr_assert_not_null(strstr(out, "INBOX_AMQP_URL_FILE"), "%s", out);
	cr_assert_not_null(strstr(out, "INBOX_DB_URL_FILE"), "%s", out);
	cr_assert_not_null(strstr(out, "INBOX_MIGRATE_DB_URL_FILE"), "%s", out);
	cr_assert_not_null(strstr(out, "Prefer the variable or the file: a password given with --db-url"), "%s", out);
}

Test(cli, dlq_usage_errors_exit_2_with_one_line)
{
	static const struct bad cases[] = {
		{ "", "dlq", "inbox-worker: dlq: missing subcommand (list, show, replay, purge, skip)\n" },
		{ "", "dlq frob", "inbox-worker: dlq: unknown subcommand 'frob' (list, show, replay, purge, skip)\n" },
		{ "", "dlq show", "inbox-worker: dlq show: missing MESSAGE_ID\n" },
		{ "", "dlq purge --yes",
		  "inbox-worker: dlq purge: --reason is required (rabbitmqctl purge_queue empties it all)\n" },
		{ "", "dlq list --limit 3", "inbox-worker: --limit: only for dlq replay\n" },
		{ "", "dlq replay --limit x", "inbox-worker: --limit: not a positive number: 'x'\n" },
		{ "", "dlq list --since 5x", "inbox-worker: --since: bad duration: '5x' (use e.g. 30s, 10m, 7d)\n" },
		{ "", "dlq list --reason", "inbox-worker: --reason: missing value\n" },
		{ "", "dlq list --bogus", "inbox-worker: --bogus: unknown flag (see --help)\n" },
		/* A dlq option of another subcommand is named as such, not
		 * passed on to the settings as an unknown flag. */
		{ "", "dlq list --yes", "inbox-worker: --yes: only for dlq purge\n" },
		{ "", "dlq show ID --json", "inbox-worker: --json: only for dlq list\n" },
		{ "", "dlq show ID --reason x", "inbox-worker: --reason: only for dlq list, replay, purge, skip\n" },
		{ "", "dlq skip --reason invalid-transition",
		  "inbox-worker: dlq skip: say which: --id ID or --order ID (a skip is a decision about an event)\n" },
		{ "", "cleanup --dry-run=1", "inbox-worker: --dry-run: takes no value\n" },
		{ "", "migrate --dry-run", "inbox-worker: --dry-run: unknown flag (see --help)\n" },
	};
	char err[1024];

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		int code = run(cases[i].env, cases[i].args, err, sizeof err);
		cr_expect_eq(code, 2, "%s: exit %d, want 2", cases[i].args, code);
		cr_expect_str_eq(err, cases[i].line);
	}
}

/* inbox-loadgen reads its options from the same kind of table as the
 * worker's dlq: a known option without its value, or one that another
 * command takes, is named as such (not "unknown flag", and not silently
 * taken: `dlq unbind --timeout 5` used to accept verify's option). */
Test(cli, loadgen_usage_errors_exit_2_with_one_line)
{
	/* Nothing listens on port 1: a command that got past its arguments
	 * fails with 1, not 2, and reaches no one's server. */
#define NOWHERE "INBOX_AMQP_URL=amqp://u:p@127.0.0.1:1/ INBOX_DB_URL=mysql://u:p@127.0.0.1:1/db"
	static const struct bad cases[] = {
		{ NOWHERE, "send rk body --message-id", "inbox-loadgen: --message-id: missing value\n" },
		{ NOWHERE, "dlq unbind --timeout 5", "inbox-loadgen: --timeout: only for verify\n" },
		{ NOWHERE, "dlq bind --ledger /nonexistent/ledger", "inbox-loadgen: --ledger: only for publish, verify\n" },
		{ NOWHERE, "publish --ledger /nonexistent/ledger --json", "inbox-loadgen: --json: only for verify\n" },
		{ "", "verify --ledger", "inbox-loadgen: --ledger: missing value\n" },
		{ "", "publish --ledger /nonexistent/ledger --seed abc", "inbox-loadgen: --seed: not a number: 'abc'\n" },
		{ "", "publish --ledger /nonexistent/ledger --settle-timeout 2d",
		  "inbox-loadgen: --settle-timeout: out of range [1s, 86400s]: '2d'\n" },
		{ NOWHERE, "publish --ledger /nonexistent/ledger --progress=1", "inbox-loadgen: --progress: takes no value\n" },
		{ "", "publish", "inbox-loadgen: --ledger: required\n" },
		{ "", "publish --ledger /nonexistent/ledger --bogus", "inbox-loadgen: --bogus: unknown flag (see --help)\n" },
	};
	char err[1024];

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		int code = run_program(getenv("INBOX_LOADGEN_BIN"), cases[i].env, cases[i].args, false, err, sizeof err);
		cr_expect_eq(code, 2, "%s: exit %d, want 2", cases[i].args, code);
		cr_expect_str_eq(err, cases[i].line);
	}
#undef NOWHERE
}

/* --help and --version are answered by every command, wherever they stand
 * and whatever else is wrong (as cfg_load answers them). */
Test(cli, help_and_version_win_in_every_command)
{
	static const char *const loadgen[] = {
		"publish --version", "send rk body --version", "send --version", "dlq bind --version",
		"verify --seed x --version",
	};
	static const char *const worker[] = {
		"dlq list --since 5x --version", "migrate --status --version", "cleanup --dry-run --version",
	};
	char out[65536];

	for (size_t i = 0; i < sizeof loadgen / sizeof loadgen[0]; i++) {
		cr_expect_eq(run_program(getenv("INBOX_LOADGEN_BIN"), "", loadgen[i], true, out, sizeof out), 0, "%s",
		             loadgen[i]);
		expect_version_line("inbox-loadgen", out);
	}
	for (size_t i = 0; i < sizeof worker / sizeof worker[0]; i++) {
		cr_expect_eq(run_program(getenv("INBOX_WORKER_BIN"), "", worker[i], true, out, sizeof out), 0, "%s",
		             worker[i]);
		expect_version_line("inbox-worker", out);
	}
	cr_expect_eq(run_program(getenv("INBOX_LOADGEN_BIN"), "", "send --help", true, out, sizeof out), 0);
	cr_expect_not_null(strstr(out, "send ROUTING_KEY BODY"), "%s", out);
}

/* INBOX_TYPE_MAP is judged by the definition that runs (issue 43, item
 * 2): under the shipment lifecycle a map to an order type is refused by
 * every command that reads messages with it, before any connection. */
Test(cli, the_type_map_is_judged_by_the_lifecycle_that_runs)
{
	static const char *const cmds[] = { "run", "dlq list" };
	const char *root = getenv("INBOX_SOURCE_ROOT");
	char env[4200], err[1024];

	cr_assert_not_null(root, "INBOX_SOURCE_ROOT is set by meson");
	snprintf(env, sizeof env, "INBOX_LIFECYCLE=%s/lifecycles/shipment.json INBOX_TYPE_MAP=x=OrderCreated", root);
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
		cr_expect_eq(run(env, cmds[i], err, sizeof err), 2, "%s: %s", cmds[i], err);
		cr_expect_str_eq(err, "inbox-worker: INBOX_TYPE_MAP: 'OrderCreated' is not an event type of the shipment "
		                      "lifecycle (ShipmentLabelled, ParcelPickedUp, ParcelInTransit, ParcelDelivered, "
		                      "ParcelLost, ParcelReturned, or an alias): 'x=OrderCreated'\n");
	}
}
