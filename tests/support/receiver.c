/*
 * receiver.c - http_receiver as a test's child; see receiver.h.
 */
#include "receiver.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

void rcv_start(struct rcv_child *rv, const char *const *extra)
{
	const char *bin = getenv("INBOX_HTTP_RECEIVER_BIN");
	const char *argv[32];
	int pfd[2], fd, n = 0;
	char line[128];

	cr_assert_not_null(bin, "INBOX_HTTP_RECEIVER_BIN is not set");
	snprintf(rv->log, sizeof rv->log, "/tmp/test_http_receiverXXXXXX");
	fd = mkstemp(rv->log);
	cr_assert_geq(fd, 0);
	cr_assert_eq(close(fd), 0);
	argv[n++] = bin;
	argv[n++] = "--port";
	argv[n++] = "0";
	argv[n++] = "--out";
	argv[n++] = rv->log;
	for (; extra != NULL && *extra != NULL && n < 30; extra++)
		argv[n++] = *extra;
	argv[n] = NULL;
	cr_assert_eq(pipe(pfd), 0);
	rv->pid = fork();
	cr_assert_geq(rv->pid, 0);
	if (rv->pid == 0) {
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || dup2(pfd[1], STDOUT_FILENO) < 0)
			_exit(127);
		close(pfd[0]);
		close(pfd[1]);
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	cr_assert_eq(close(pfd[1]), 0);
	rv->out = fdopen(pfd[0], "r");
	cr_assert_not_null(rv->out);
	cr_assert_not_null(fgets(line, sizeof line, rv->out), "the receiver said nothing");
	cr_assert_eq(sscanf(line, "ready %d", &rv->port), 1, "%s", line);
	cr_assert_gt(rv->port, 0);
}

void rcv_stop(struct rcv_child *rv)
{
	int st;

	cr_assert_eq(kill(rv->pid, SIGTERM), 0);
	cr_assert_eq(waitpid(rv->pid, &st, 0), rv->pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the receiver ended with status %d", st);
	cr_assert_eq(fclose(rv->out), 0);
}

int rcv_lines(const struct rcv_child *rv, json_t **lines, int cap)
{
	FILE *f = fopen(rv->log, "r");
	char buf[8192];
	int n = 0;

	cr_assert_not_null(f);
	while (fgets(buf, sizeof buf, f) != NULL) {
		json_error_t je;

		cr_assert_lt(n, cap);
		cr_assert_neq(strchr(buf, '\n'), NULL, "one whole line per request");
		lines[n] = json_loads(buf, 0, &je);
		cr_assert_not_null(lines[n], "%s: %s", je.text, buf);
		n++;
	}
	cr_assert_eq(fclose(f), 0);
	return n;
}

int rcv_accepted(const struct rcv_child *rv, int *keys, int *replays, int *conflicts)
{
	json_t *accepted = json_object();
	FILE *f = fopen(rv->log, "r");
	char buf[8192];
	int calls = 0, rep = 0, conf = 0;
	const char *k;
	json_t *v;

	cr_assert_not_null(accepted);
	cr_assert_not_null(f);
	while (fgets(buf, sizeof buf, f) != NULL) {
		json_t *o = json_loads(buf, 0, NULL);
		const char *key;
		json_int_t status;

		cr_assert_not_null(o, "%s", buf);
		calls++;
		key = json_string_value(json_object_get(o, "idempotency_key"));
		status = json_integer_value(json_object_get(o, "status"));
		cr_assert_not_null(key, "every call carries its key: %s", buf);
		if (status == 422)
			conf++;
		else if (status == 200 && json_is_true(json_object_get(o, "replay")))
			rep++;
		else if (status == 200)
			cr_assert_eq(json_object_set_new(accepted, key,
			                                 json_integer(json_integer_value(json_object_get(accepted, key)) + 1)),
			             0);
		json_decref(o);
	}
	cr_assert_eq(fclose(f), 0);
	json_object_foreach(accepted, k, v)
		cr_expect_eq(json_integer_value(v), 1, "%s accepted %lld times", k, (long long)json_integer_value(v));
	if (keys != NULL)
		*keys = (int)json_object_size(accepted);
	if (replays != NULL)
		*replays = rep;
	if (conflicts != NULL)
		*conflicts = conf;
	json_decref(accepted);
	return calls;
}
