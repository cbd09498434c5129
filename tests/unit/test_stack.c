/*
 * test_stack.c - scripts/stack as a developer's tool: `env` speaks only for
 * this checkout's stack.  When that stack is down it must not print the
 * default-port URLs, which another checkout's stack (a CI clone beside this
 * one) may be answering on: tests evaluated from them run against servers
 * that are not theirs.  Needs nothing running: it points the script at an
 * empty state folder of its own.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Run a shell command line; capture its standard output. */
static int sh(const char *line, char *out, size_t cap)
{
	FILE *p = popen(line, "r");
	size_t n;
	int st;

	cr_assert_not_null(p);
	n = fread(out, 1, cap - 1, p);
	out[n] = '\0';
	st = pclose(p);
	cr_assert(WIFEXITED(st), "%s: did not exit", line);
	return WEXITSTATUS(st);
}

struct down {
	char dir[64];
	char stack[1024];
};

static void down_init(struct down *d)
{
	const char *root = getenv("INBOX_SOURCE_ROOT");

	cr_assert_not_null(root, "INBOX_SOURCE_ROOT is not set");
	snprintf(d->dir, sizeof d->dir, "%s", "/tmp/inbox-stack-test-XXXXXX");
	cr_assert_not_null(mkdtemp(d->dir));
	snprintf(d->stack, sizeof d->stack, "INBOX_STACK_DIR=%s %s/scripts/stack", d->dir, root);
}

static void down_end(struct down *d)
{
	cr_assert_eq(rmdir(d->dir), 0, "the state folder was written to");
}

Test(stack, env_of_a_stack_that_is_down_exports_nothing_and_fails_the_eval)
{
	struct down d;
	char line[2048], out[4096];
	int rc;

	down_init(&d);
	snprintf(line, sizeof line, "%s env 2>/dev/null", d.stack);
	rc = sh(line, out, sizeof out);
	cr_expect_neq(rc, 0, "env exited 0 for a stack that is down");
	cr_expect_null(strstr(out, "INBOX_AMQP_URL"), "env printed URLs for a stack that is down:\n%s", out);
	cr_expect_null(strstr(out, "INBOX_TEST_DB_URL"), "env printed URLs for a stack that is down:\n%s", out);

	/* The way every script and the README use it: the eval itself fails,
	 * so `set -e` stops there, and the reason is on standard error. */
	snprintf(line, sizeof line,
	         "bash -ec 'eval \"$(%s env)\"; echo reached; env | grep -c ^INBOX_AMQP_URL=' 2>&1", d.stack);
	rc = sh(line, out, sizeof out);
	cr_expect_neq(rc, 0, "the eval succeeded:\n%s", out);
	cr_expect_null(strstr(out, "reached"), "a set -e script went on past the eval:\n%s", out);
	cr_expect_not_null(strstr(out, "not up"), "no reason on standard error:\n%s", out);
	cr_expect_not_null(strstr(out, "scripts/stack up"), "the reason does not say what to run:\n%s", out);
	down_end(&d);
}

Test(stack, env_of_a_cluster_that_is_down_exports_nothing_and_fails_the_eval)
{
	struct down d;
	char line[2048], out[8192];
	int rc;

	down_init(&d);
	snprintf(line, sizeof line, "INBOX_CLUSTER_DIR=%s/cluster %s env --cluster 2>/dev/null", d.dir, d.stack);
	rc = sh(line, out, sizeof out);
	cr_expect_neq(rc, 0, "env --cluster exited 0 for a cluster that is down");
	cr_expect_null(strstr(out, "INBOX_AMQP_URL"), "env --cluster printed URLs for a cluster that is down:\n%s", out);
	snprintf(line, sizeof line,
	         "bash -ec 'eval \"$(INBOX_CLUSTER_DIR=%s/cluster %s env --cluster)\"; echo reached' 2>&1", d.dir,
	         d.stack);
	rc = sh(line, out, sizeof out);
	cr_expect_neq(rc, 0, "the eval succeeded:\n%s", out);
	cr_expect_null(strstr(out, "reached"), "a set -e script went on past the eval:\n%s", out);
	cr_expect_not_null(strstr(out, "not up"), "no reason on standard error:\n%s", out);
	down_end(&d);
}
