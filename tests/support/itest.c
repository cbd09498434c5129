/*
 * itest.c - see itest.h.  Waits poll a condition with a bound; the bound is
 * generous because the assertion is about the state reached, never about how
 * fast it was reached.
 */
#include "itest.h"

#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "status.h"

extern char **environ;

static struct cfg itest_conf;
static bool itest_loaded;
static struct db *itest_conn;
static int itest_db_node; /* where itest_conn starts in a list of cluster nodes */

static struct mq *itest_mq_connect(const char *name);

static void itest_sleep_ms(int ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static double itest_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

const struct cfg *itest_cfg(void)
{
	if (!itest_loaded) {
		char err[512];
		char *argv[] = { "itest", NULL };
		cr_assert_not_null(getenv("INBOX_AMQP_URL"),
		                   "INBOX_AMQP_URL is not set: start the stack (scripts/stack up; eval \"$(scripts/stack env)\")");
		cr_assert_not_null(getenv("INBOX_DB_URL"), "INBOX_DB_URL is not set: start the stack");
		cr_assert_eq(cfg_load(&itest_conf, 1, argv, err, sizeof err), CFG_OK, "config: %s", err);
		log_setup(LOG_LEVEL_WARN, LOG_FORMAT_TEXT);
		cr_assert_eq(db_global_init(), ST_OK);
		itest_loaded = true;
	}
	return &itest_conf;
}

struct db *itest_db(void)
{
	if (itest_conn == NULL || !db_connected(itest_conn)) {
		/* A cluster's list: a lost connection moves on to the next
		 * node, as the worker's threads do. */
		if (itest_conn != NULL)
			itest_db_node++;
		db_close(&itest_conn);
		/* The tests' own connection is the schema owner's (when the
		 * stack gives one): tests drop, alter and rename tables, which
		 * the worker's account may not. */
		/* A test may have just started the server again, and a
		 * loaded machine is slow to take connections: wait for it,
		 * bounded, rather than fail the first attempt. */
		double end = itest_now() + ITEST_BACK_S;
		int rc;

		for (;;) {
			rc = db_open_from(&itest_conn, cfg_migrate_db(itest_cfg()), &itest_db_node);
			if (rc != ST_ERR_DB_CONN || itest_now() > end)
				break;
			itest_db_node++;
			itest_sleep_ms(200);
		}
		cr_assert_eq(rc, ST_OK, "cannot connect to the database (waited up to %d s): %s", ITEST_BACK_S,
		             st_strerror(rc));
	}
	return itest_conn;
}

/* One connection as c that runs a statement: ST_OK, ST_ERR_DB_CONN while
 * the server is not back, or another code (asserted by the caller). */
static int itest_db_answers(const struct cfg_db *c, char *why, size_t cap)
{
	struct db *d = NULL;
	int rc = db_open_why(&d, c, why, cap);

	if (rc == ST_OK) {
		rc = db_exec(d, "DO 1");
		if (rc != ST_OK)
			snprintf(why, cap, "%s", db_errmsg(d));
	}
	db_close(&d);
	return rc;
}

void itest_wait_db_back(void)
{
	const struct cfg *c = itest_cfg();
	double end = itest_now() + ITEST_BACK_S;
	char why[300] = "";
	int rc;

	for (;;) {
		rc = itest_db_answers(&c->db, why, sizeof why);
		if (rc == ST_OK)
			rc = itest_db_answers(cfg_migrate_db(c), why, sizeof why);
		if (rc == ST_OK)
			return;
		cr_assert_eq(rc, ST_ERR_DB_CONN, "the database refuses the tests' accounts: %s", why);
		cr_assert(itest_now() < end, "the database did not take connections within %d s: %s", ITEST_BACK_S,
		          why);
		itest_sleep_ms(200);
	}
}

void itest_wait_mq_back(void)
{
	double end = itest_now() + ITEST_BACK_S;
	char why[300] = "";

	for (;;) {
		struct mq *m = NULL;
		int node = 0;
		int rc = mq_open_from_why(&m, &itest_cfg()->amqp, 0, "itest-wait", &node, why, sizeof why);

		mq_close(&m);
		if (rc == ST_OK)
			return;
		cr_assert_eq(rc, ST_ERR_MQ_CONN, "the broker refuses the tests' account: %s", why);
		cr_assert(itest_now() < end, "the broker did not take connections within %d s: %s", ITEST_BACK_S, why);
		itest_sleep_ms(200);
	}
}

static int64_t itest_query(const char *sql, const char *arg, bool *found)
{
	struct db_param p[1];
	struct db_col c[1];
	int rc = ST_OK, r = 0;

	if (arg != NULL)
		p[0] = DBP_STR(arg);
	/* The fault tests restart the server under us: a lost connection is
	 * retried on a new one (itest_db waits for one), bounded in time. */
	double end = itest_now() + ITEST_BACK_S;

	for (;;) {
		struct db *d = itest_db();
		struct db_stmt *s;

		c[0] = DBC_I64();
		rc = db_prepare(d, &s, sql);
		if (rc == ST_OK) {
			r = db_stmt_query_row(s, p, arg != NULL ? ARRAY_LEN(p) : 0, c, ARRAY_LEN(c));
			if (r < 0)
				rc = r;
		}
		if (rc == ST_OK) {
			db_rollback(d);
			break;
		}
		cr_assert_eq(rc, ST_ERR_DB_CONN, "query '%s': %s", sql, db_errmsg(d));
		itest_db_node++; /* a cluster's next node */
		db_close(&itest_conn);
		if (itest_now() > end)
			break;
		itest_sleep_ms(200);
	}
	cr_assert_eq(rc, ST_OK, "query '%s': database unreachable for %d s", sql, ITEST_BACK_S);
	*found = r == 1;
	return r == 1 && !c[0].is_null ? c[0].i64 : 0;
}

int64_t itest_int(const char *sql)
{
	bool found;
	return itest_query(sql, NULL, &found);
}

int64_t itest_int1(const char *sql, const char *arg)
{
	bool found;
	return itest_query(sql, arg, &found);
}

bool itest_str1(const char *sql, const char *arg, char *buf, size_t cap)
{
	struct db *d = itest_db();
	struct db_stmt *s;
	struct db_param p[1];
	struct db_col c[1] = { DBC_STR(buf, cap) };
	int r;

	cr_assert_eq(db_prepare(d, &s, sql), ST_OK, "prepare: %s", db_errmsg(d));
	if (arg != NULL)
		p[0] = DBP_STR(arg);
	r = db_stmt_query_row(s, p, arg != NULL ? ARRAY_LEN(p) : 0, c, ARRAY_LEN(c));
	cr_assert_geq(r, 0, "query: %s", db_errmsg(d));
	db_rollback(d);
	return r == 1;
}

struct db *itest_hold_order(const char *order_id)
{
	struct db *d = NULL;
	struct db_stmt *create, *lock;
	struct db_param p[1] = { DBP_STR(order_id) };
	char got[128];
	struct db_col c[1] = { DBC_STR(got, sizeof got) };

	cr_assert_eq(db_open(&d, &itest_cfg()->db), ST_OK);
	cr_assert_eq(db_prepare(d, &create, "INSERT INTO order_locks (order_id, held) VALUES (?, 0)"), ST_OK, "%s",
	             db_errmsg(d));
	cr_assert_eq(db_prepare(d, &lock, "SELECT order_id FROM order_locks WHERE order_id = ? FOR UPDATE"), ST_OK,
	             "%s", db_errmsg(d));
	cr_assert_eq(db_stmt_exec(create, p, ARRAY_LEN(p), NULL), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_commit(d), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_stmt_query_row(lock, p, ARRAY_LEN(p), c, ARRAY_LEN(c)), 1, "%s", db_errmsg(d));
	return d;
}

int64_t itest_wait_int(const char *sql, int64_t want, int timeout_s)
{
	double end = itest_now() + timeout_s;
	int64_t v;

	for (;;) {
		v = itest_int(sql);
		if (v == want || itest_now() > end)
			return v;
		itest_sleep_ms(100);
	}
}

size_t itest_read_file(const char *path, char *out, size_t cap)
{
	FILE *f = fopen(path, "r");
	size_t len;

	cr_assert_not_null(f, "cannot open %s", path);
	len = fread(out, 1, cap - 1, f);
	out[len] = '\0';
	fclose(f);
	return len;
}

const char *itest_source(const char *rel, char *buf, size_t cap)
{
	const char *root = getenv("INBOX_SOURCE_ROOT");
	cr_assert_not_null(root, "INBOX_SOURCE_ROOT is not set (run through meson test)");
	snprintf(buf, cap, "%s/%s", root, rel);
	return buf;
}

pid_t itest_forward(const char *bind_ip, int port, int to)
{
	char listen[96], target[64];
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	pid_t pid;

	cr_assert_eq(inet_pton(AF_INET, bind_ip, &a.sin_addr), 1, "not an IPv4 address: %s", bind_ip);
	snprintf(listen, sizeof listen, "TCP-LISTEN:%d,bind=%s,fork,reuseaddr", port, bind_ip);
	snprintf(target, sizeof target, "TCP:127.0.0.1:%d", to);
	pid = fork();
	cr_assert_neq(pid, -1, "fork: %s", strerror(errno));
	if (pid == 0) {
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
			_exit(126);
		execlp("socat", "socat", listen, target, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 300; i++) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		int ok;

		cr_assert_geq(fd, 0, "socket: %s", strerror(errno));
		ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
		close(fd);
		if (ok)
			return pid;
		cr_assert_eq(waitpid(pid, NULL, WNOHANG), 0, "socat exited (is it installed?)");
		itest_sleep_ms(100);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	cr_assert_fail("socat did not listen on %s:%d within 30 s", bind_ip, port);
	return -1;
}

void itest_stack(const char *what)
{
	char root[4096], cmd[4300];

	snprintf(cmd, sizeof cmd, "%s %s >&2", itest_source("scripts/stack", root, sizeof root), what);
	cr_assert_eq(system(cmd), 0, "scripts/stack %s failed", what);
}

static void itest_drop_tables(void)
{
	static const char *const tables[] = { "order_events", "processed_messages", "orders", "order_locks",
	                                      "held_events", "outbox", "schema_migrations" };
	struct db *d = itest_db();
	char sql[128];

	for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
		snprintf(sql, sizeof sql, "DROP TABLE IF EXISTS %s", tables[i]);
		cr_assert_eq(db_exec(d, sql), ST_OK, "%s: %s", sql, db_errmsg(d));
	}
}

static void itest_delete_queues(void)
{
	const struct cfg *c = itest_cfg();
	struct mq *m = NULL;
	char name[300];

	m = itest_mq_connect("itest-reset");
	cr_assert_eq(mq_queue_delete(m, c->queue), ST_OK, "%s", mq_errmsg(m));
	cr_assert_eq(mq_queue_delete(m, c->dlq), ST_OK, "%s", mq_errmsg(m));
	/* inbox-loadgen's copy of what the worker emits: verify only reads it,
	 * so a test starts without an earlier test's messages. */
	snprintf(name, sizeof name, "%s.verify", c->out_exchange);
	cr_assert_eq(mq_queue_delete(m, name), ST_OK, "%s", mq_errmsg(m));
	for (int i = 0; i < 8; i++) {
		snprintf(name, sizeof name, "%s.shard.%d", c->queue, i);
		cr_assert_eq(mq_queue_delete(m, name), ST_OK, "%s", mq_errmsg(m));
	}
	/* A sharded test leaves orders -> orders.sharded bound. */
	snprintf(name, sizeof name, "%s.sharded", c->exchange);
	cr_assert_eq(mq_exchange_delete(m, name), ST_OK, "%s", mq_errmsg(m));
	mq_close(&m);
}

void itest_fresh(void)
{
	const char *args[] = { "migrate", NULL };
	pid_t pid;
	int st;

	itest_cfg();
	itest_drop_tables();
	itest_delete_queues();
	pid = itest_spawn(args, NULL);
	st = itest_wait_exit(pid, 120);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "migrate failed (status %d)", st);
}

pid_t itest_spawn(const char *const *args, const char *const *env)
{
	return itest_spawn_logged(args, env, NULL);
}

pid_t itest_spawn_logged(const char *const *args, const char *const *env, const char *log_path)
{
	const char *bin = getenv("INBOX_WORKER_BIN");

	cr_assert_not_null(bin, "INBOX_WORKER_BIN is not set (run through meson test)");
	return itest_spawn_program(bin, args, env, log_path, false);
}

pid_t itest_spawn_program(const char *bin, const char *const *args, const char *const *env, const char *log_path,
                          bool with_stdout)
{
	char *argv[40];
	int n = 0;
	pid_t pid;

	argv[n++] = (char *)bin;
	for (int i = 0; args[i] != NULL && n < 39; i++)
		argv[n++] = (char *)args[i];
	argv[n] = NULL;
	pid = fork();
	cr_assert_neq(pid, -1, "fork: %s", strerror(errno));
	if (pid == 0) {
		/* A failed assertion ends the test process: its workers must
		 * not outlive it and steal the next test's messages. */
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
			_exit(126);
		if (log_path != NULL) {
			if (freopen(log_path, "w", stderr) == NULL)
				_exit(126);
			if (with_stdout && dup2(fileno(stderr), 1) < 0)
				_exit(126);
		}
		for (int i = 0; env != NULL && env[i] != NULL; i++)
			putenv((char *)env[i]);
		if (getenv("INBOX_LOG_LEVEL") == NULL)
			setenv("INBOX_LOG_LEVEL", "info", 1);
		/* Tests run several workers: no metrics port to fight over. */
		setenv("INBOX_METRICS_ADDR", "", 0);
		execv(bin, argv);
		_exit(127);
	}
	return pid;
}

pid_t itest_worker(int threads, const char *const *env)
{
	char t[32];
	const char *args[] = { "run", "--threads", t, NULL };
	snprintf(t, sizeof t, "%d", threads);
	return itest_spawn(args, env);
}

pid_t itest_worker_logged(int threads, const char *const *env, const char *log_path)
{
	char t[32];
	const char *args[] = { "run", "--threads", t, NULL };
	snprintf(t, sizeof t, "%d", threads);
	return itest_spawn_logged(args, env, log_path);
}

int64_t itest_log_sum(const char *log_path, const char *marker, const char *key)
{
	FILE *f = fopen(log_path, "r");
	char line[4096];
	char pat[128];
	int64_t sum = 0;

	cr_assert_not_null(f, "cannot open %s", log_path);
	snprintf(pat, sizeof pat, " %s=", key);
	while (fgets(line, sizeof line, f) != NULL) {
		char *p;
		if (strstr(line, marker) == NULL || (p = strstr(line, pat)) == NULL)
			continue;
		sum += strtoll(p + strlen(pat), NULL, 10);
	}
	fclose(f);
	return sum;
}

/* Lines of log_path holding every one of texts; a missing file is 0 lines,
 * or a failure when must_exist. */
static int itest_log_scan(const char *log_path, const char *const *texts, bool must_exist)
{
	FILE *f = fopen(log_path, "r");
	char line[4096];
	int n = 0;

	cr_assert(f != NULL || !must_exist, "cannot open %s", log_path);
	while (f != NULL && fgets(line, sizeof line, f) != NULL) {
		bool all = true;

		for (int i = 0; all && texts[i] != NULL; i++)
			all = strstr(line, texts[i]) != NULL;
		n += all;
	}
	if (f != NULL)
		fclose(f);
	return n;
}

int itest_log_lines(const char *log_path, const char *const *texts)
{
	return itest_log_scan(log_path, texts, false);
}

int itest_log_count(const char *log_path, const char *text)
{
	return itest_log_scan(log_path, (const char *const[]){ text, NULL }, true);
}

int itest_loadgen(const char *const *args, const char *const *env, const char *log_path, int timeout_s)
{
	const char *bin = getenv("INBOX_LOADGEN_BIN");
	int st;

	cr_assert_not_null(bin, "INBOX_LOADGEN_BIN is not set (run through meson test)");
	st = itest_wait_exit(itest_spawn_program(bin, args, env, log_path, true), timeout_s);
	cr_assert(WIFEXITED(st), "inbox-loadgen did not exit normally (status %d)", st);
	return WEXITSTATUS(st);
}

int64_t itest_ledger_int(const char *ledger, const char *key)
{
	FILE *f = fopen(ledger, "r");
	char line[4096];
	json_error_t jerr;
	json_t *o;
	int64_t v;

	cr_assert_not_null(f, "cannot open %s", ledger);
	cr_assert_not_null(fgets(line, sizeof line, f), "empty ledger");
	fclose(f);
	o = json_loads(line, 0, &jerr);
	cr_assert_not_null(o, "ledger run line: %s", jerr.text);
	v = json_integer_value(json_object_get(o, key));
	json_decref(o);
	return v;
}

bool itest_log_has(const char *log_path, const char *text)
{
	return itest_log_scan(log_path, (const char *const[]){ text, NULL }, false) > 0;
}

int itest_wait_log_lines(const char *log_path, const char *const *texts, int want, int timeout_s)
{
	double end = itest_now() + timeout_s;
	int n;

	for (;;) {
		n = itest_log_lines(log_path, texts);
		if (n >= want || itest_now() > end)
			return n;
		itest_sleep_ms(100);
	}
}

void itest_wait_log(const char *log_path, const char *text, int timeout_s)
{
	cr_assert_gt(itest_wait_log_lines(log_path, (const char *const[]){ text, NULL }, 1, timeout_s), 0,
	             "no line with '%s' in %s within %d s", text, log_path, timeout_s);
}

void itest_log_path(char *buf, size_t cap, const char *name)
{
	snprintf(buf, cap, "/tmp/inbox-itest-%d-%s.log", (int)getpid(), name);
}

void itest_stop_ok(pid_t pid)
{
	int st = itest_stop(pid, SIGTERM, 60);

	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "must exit 0 on SIGTERM (status %d)", st);
}

int itest_wait_exit(pid_t pid, int timeout_s)
{
	double end = itest_now() + timeout_s;
	int st = 0;

	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		cr_assert_neq(r, -1, "waitpid: %s", strerror(errno));
		if (r == pid)
			return st;
		if (itest_now() > end) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			cr_assert_fail("process %d did not exit within %d s", (int)pid, timeout_s);
		}
		itest_sleep_ms(50);
	}
}

void itest_show_log(const char *log_path)
{
	char buf[1 << 14];
	size_t n;
	FILE *f = fopen(log_path, "r");

	if (f == NULL) {
		fprintf(stderr, "(cannot show %s: %s)\n", log_path, strerror(errno));
		return;
	}
	fprintf(stderr, "--- %s\n", log_path);
	while ((n = fread(buf, 1, sizeof buf, f)) > 0)
		if (fwrite(buf, 1, n, stderr) != n)
			break;
	fclose(f);
}

void itest_expect_fatal(pid_t pid, const char *log_path, const char *name, const char *const *texts,
                        const char *secret)
{
	const char *error_level[] = { " error ", NULL };
	const char *retrying[] = { "retrying", NULL };
	const char *secret_t[] = { secret, NULL };
	int code = itest_wait_exit(pid, 60);

	code = WIFEXITED(code) ? WEXITSTATUS(code) : 128 + WTERMSIG(code);
	if (code != 1 || itest_log_lines(log_path, texts) != 1 || itest_log_lines(log_path, error_level) != 1 ||
	    itest_log_lines(log_path, retrying) != 0 || (secret != NULL && itest_log_lines(log_path, secret_t) != 0))
		itest_show_log(log_path);
	cr_assert_eq(code, 1, "%s: exit code %d, want 1 (see %s)", name, code, log_path);
	cr_assert_eq(itest_log_lines(log_path, error_level), 1, "%s: one error line (see %s)", name, log_path);
	cr_assert_eq(itest_log_lines(log_path, texts), 1, "%s: one line holds every one of the texts (see %s)",
	             name, log_path);
	cr_assert_eq(itest_log_lines(log_path, retrying), 0, "%s: nothing is retried (see %s)", name, log_path);
	if (secret != NULL)
		cr_assert_eq(itest_log_lines(log_path, secret_t), 0, "%s: the password is not logged (see %s)", name,
		             log_path);
}

int itest_stop(pid_t pid, int sig, int timeout_s)
{
	cr_assert_eq(kill(pid, sig), 0, "kill: %s", strerror(errno));
	return itest_wait_exit(pid, timeout_s);
}

/* A broker connection, waiting (ITEST_BACK_S) for a broker that a test
 * restarted; the first node that answers, on a cluster. */
static struct mq *itest_mq_connect(const char *name)
{
	double end = itest_now() + ITEST_BACK_S;
	char why[300] = "";
	struct mq *m = NULL;
	int rc;

	for (;;) {
		int node = 0;

		rc = mq_open_from_why(&m, &itest_cfg()->amqp, 0, name, &node, why, sizeof why);
		if (rc != ST_ERR_MQ_CONN || itest_now() > end)
			break;
		itest_sleep_ms(200);
	}
	cr_assert_eq(rc, ST_OK, "cannot connect to the broker (waited up to %d s): %s", ITEST_BACK_S, why);
	return m;
}

struct mq *itest_mq(void)
{
	struct mq *m = itest_mq_connect("itest-publisher");
	int rc;

	rc = mq_declare_topology(m, itest_cfg());
	cr_assert_eq(rc, ST_OK, "declare: %s", mq_errmsg(m));
	cr_assert_eq(mq_confirm_select(m), ST_OK);
	return m;
}

/* Publish one message, and with wait, until the broker confirms it.  A
 * quorum queue declared a moment ago (every test starts from deleted
 * queues) may nack a publish while its leader is being elected: that
 * message was not taken, so it is sent again, for up to 10 s. */
static void itest_pub_msg(struct mq *m, const struct mq_message *msg, bool wait)
{
	for (int attempt = 0;; attempt++) {
		int rc;

		cr_assert_eq(mq_publish(m, msg), ST_OK, "publish: %s", mq_errmsg(m));
		if (!wait)
			return;
		rc = mq_wait_confirms(m, 10000);
		if (rc == ST_OK)
			return;
		cr_assert(rc == ST_ERR_MQ_NACK && attempt < 40, "confirm: %s", mq_errmsg(m));
		itest_sleep_ms(250); /* a backoff between attempts, not a wait for a condition */
	}
}

static void itest_pub(struct mq *m, const char *type, const char *body, const char *mid, bool wait)
{
	char rk[64];
	struct mq_message msg = {
		.exchange = itest_cfg()->exchange, .routing_key = rk, .body = body, .len = strlen(body),
		.message_id = mid,
	};
	snprintf(rk, sizeof rk, "order.%s", type);
	itest_pub_msg(m, &msg, wait);
}

void itest_publish(struct mq *m, const char *type, const char *body, const char *mid)
{
	itest_pub(m, type, body, mid, true);
}

void itest_publish_async(struct mq *m, const char *type, const char *body, const char *mid)
{
	itest_pub(m, type, body, mid, false);
}

void itest_publish_keyed(struct mq *m, const char *type, const char *body, const char *order_id, bool wait)
{
	char rk[64];
	struct mq_header h[1] = { { "order_id", order_id } };
	struct mq_message msg = {
		.exchange = itest_cfg()->exchange, .routing_key = rk, .body = body, .len = strlen(body),
		.headers = h, .nheaders = 1,
	};
	snprintf(rk, sizeof rk, "order.%s", type);
	itest_pub_msg(m, &msg, wait);
}

void itest_publish_header(struct mq *m, const char *type, const char *body, const char *key, const char *value)
{
	char rk[64];
	struct mq_header h[1] = { { key, value } };
	struct mq_message msg = {
		.exchange = itest_cfg()->exchange, .routing_key = rk, .body = body, .len = strlen(body),
		.headers = h, .nheaders = 1,
	};
	snprintf(rk, sizeof rk, "order.%s", type);
	itest_pub_msg(m, &msg, true);
}

void itest_confirm_all(struct mq *m)
{
	cr_assert_eq(mq_wait_confirms(m, 30000), ST_OK, "confirm: %s", mq_errmsg(m));
}

void itest_event(char *buf, size_t cap, const char *message_id, const char *type, const char *order_id)
{
	snprintf(buf, cap,
	         "{\"message_id\":\"%s\",\"source\":\"itest\",\"type\":\"%s\",\"order_id\":\"%s\","
	         "\"occurred_at\":\"2026-11-29T18:00:00Z\",\"data\":{\"amount_cents\":4200}}",
	         message_id, type, order_id);
}

void itest_publish_orders(struct mq *m, const char *prefix, int from, int to)
{
	char body[512], id[64], order[64];
	struct mq *own = m == NULL ? itest_mq() : NULL;

	for (int i = from; i < to; i++) {
		snprintf(order, sizeof order, "%s-%d", prefix, i);
		snprintf(id, sizeof id, "%s-c-%d", prefix, i);
		itest_event(body, sizeof body, id, "OrderCreated", order);
		itest_publish_async(m != NULL ? m : own, "OrderCreated", body, NULL);
	}
	itest_confirm_all(m != NULL ? m : own);
	mq_close(&own);
}

int64_t itest_ledger_created(const char *prefix)
{
	/* The order is named after the message: PREFIX-c-I belongs to PREFIX-I. */
	return itest_int1("SELECT COUNT(*) FROM order_events e, (SELECT ? AS p) a"
	                  " WHERE e.message_id LIKE CONCAT(a.p, '-c-%')"
	                  " AND e.order_id = CONCAT(a.p, '-', SUBSTRING(e.message_id, CHAR_LENGTH(a.p) + 4))"
	                  " AND e.type = 'OrderCreated' AND e.source = 'itest' AND e.outcome = 'applied'"
	                  " AND e.from_status = 'None' AND e.to_status = 'Created' AND e.version = 1",
	                  prefix);
}

void itest_assert_each_applied_once(const char *prefix, int n, int timeout_s)
{
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages", n, timeout_s), n);
	itest_wait_queue_empty(itest_cfg()->queue, timeout_s);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM order_events"), n, "one effect per message");
	cr_assert_eq(itest_ledger_created(prefix), n, "each message's own effect");
	cr_assert_eq(itest_queue_depth(itest_cfg()->dlq), 0, "the fault dead-lettered nothing");
}

uint32_t itest_queue_depth(const char *queue)
{
	struct mq *m = NULL;
	uint32_t n = 0;
	int rc;

	m = itest_mq_connect("itest-inspect");
	rc = mq_queue_counts(m, queue, &n, NULL);
	mq_close(&m);
	return rc == ST_OK ? n : 0;
}

uint32_t itest_wait_depth(const char *queue, uint32_t want, int timeout_s)
{
	double end = itest_now() + timeout_s;
	uint32_t n;

	for (;;) {
		n = itest_queue_depth(queue);
		if (n == want || itest_now() > end)
			return n;
		itest_sleep_ms(100);
	}
}

/* Ready plus unacknowledged messages: only the broker's management view
 * counts the unacked ones, so ask rabbitmqctl through scripts/stack. */
static long itest_queue_total(const char *queue)
{
	char root[4096], cmd[4600], line[512];
	FILE *p;
	long total = -1;

	/* The cluster suite's broker is the cluster's (any node that is up). */
	if (getenv("INBOX_CLUSTER_STACK") != NULL)
		snprintf(cmd, sizeof cmd, "%s ctl -q list_queues -p inbox name messages 2>/dev/null",
		         getenv("INBOX_CLUSTER_STACK"));
	else
		snprintf(cmd, sizeof cmd, "%s ctl -q list_queues -p inbox name messages 2>/dev/null",
		         itest_source("scripts/stack", root, sizeof root));
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	while (fgets(line, sizeof line, p) != NULL) {
		char name[300];
		long n;
		if (sscanf(line, "%299s %ld", name, &n) == 2 && strcmp(name, queue) == 0)
			total = n;
	}
	pclose(p);
	return total;
}

void itest_wait_queue_empty(const char *queue, int timeout_s)
{
	double end = itest_now() + timeout_s;

	while (itest_queue_total(queue) != 0) {
		cr_assert(itest_now() < end, "queue %s not drained within %d s", queue, timeout_s);
		itest_sleep_ms(200);
	}
}

int itest_dlq_drain(struct itest_dead *out, int cap, int expect, int timeout_s)
{
	return itest_drain(itest_cfg()->dlq, out, cap, expect, timeout_s);
}

void itest_bind_queue(const char *queue, const char *exchange, const char *binding)
{
	struct mq *m = itest_mq();

	cr_assert_eq(mq_queue_declare_bind(m, queue, exchange, binding, true), ST_OK, "%s", mq_errmsg(m));
	cr_assert_eq(mq_queue_purge(m, queue), ST_OK, "%s", mq_errmsg(m));
	mq_close(&m);
}

void itest_delete_queue(const char *queue)
{
	struct mq *m = itest_mq();

	cr_assert_eq(mq_queue_delete(m, queue), ST_OK, "%s", mq_errmsg(m));
	mq_close(&m);
}

uint64_t itest_hash(const void *p, size_t len)
{
	const unsigned char *b = p;
	uint64_t h = 1469598103934665603ULL;

	for (size_t i = 0; i < len; i++) {
		h ^= b[i];
		h *= 1099511628211ULL;
	}
	return h;
}

int itest_drain(const char *queue, struct itest_dead *out, int cap, int expect, int timeout_s)
{
	struct mq *m = NULL;
	double end = itest_now() + timeout_s;
	int n = 0;

	m = itest_mq_connect("itest-dlq");
	while (n < cap) {
		struct mq_delivery d;
		int rc = mq_get(m, queue, &d);
		if (rc == ST_ERR_NOT_FOUND) {
			if (n >= expect || itest_now() > end)
				break;
			itest_sleep_ms(100);
			continue;
		}
		cr_assert_eq(rc, ST_OK, "basic.get: %s", mq_errmsg(m));
		memset(&out[n], 0, sizeof out[n]);
		out[n].len = d.len;
		out[n].body_hash = itest_hash(d.body, d.len);
		if (d.props.message_id != NULL)
			snprintf(out[n].message_id, sizeof out[n].message_id, "%.*s", (int)d.props.message_id_len,
			         d.props.message_id);
		if (d.props.type != NULL)
			snprintf(out[n].type, sizeof out[n].type, "%.*s", (int)d.props.type_len, d.props.type);
		if (mq_delivery_header(&d, "x-inbox-reason", out[n].reason, sizeof out[n].reason) != ST_OK)
			snprintf(out[n].reason, sizeof out[n].reason, "(none)");
		if (mq_delivery_header(&d, "x-inbox-detail", out[n].detail, sizeof out[n].detail) != ST_OK)
			out[n].detail[0] = '\0';
		cr_assert_eq(mq_ack(m, d.tag, false), ST_OK);
		mq_delivery_release(m, &d);
		n++;
	}
	mq_close(&m);
	return n;
}

int itest_http_get_within(int port, const char *path, char *body, size_t cap, int timeout_s)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	struct timeval tv = { .tv_sec = timeout_s, .tv_usec = 0 };
	char req[256];
	size_t len = 0;
	ssize_t r;
	int fd, status = 0;

	cr_assert_eq(inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr), 1);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert_geq(fd, 0);
	/* Bounds connect (SO_SNDTIMEO), the request and each read. */
	cr_assert_eq(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
	cr_assert_eq(setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv), 0);
	body[0] = '\0';
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		close(fd);
		return 0;
	}
	snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
	if (write(fd, req, strlen(req)) != (ssize_t)strlen(req)) {
		close(fd);
		return 0;
	}
	while (len + 1 < cap && (r = read(fd, body + len, cap - 1 - len)) > 0)
		len += (size_t)r;
	body[len] = '\0';
	close(fd);
	if (sscanf(body, "HTTP/1.%*d %d", &status) != 1)
		return 0;
	return status;
}

int itest_http_get(int port, const char *path, char *body, size_t cap)
{
	return itest_http_get_within(port, path, body, cap, 30);
}

double itest_metric(const char *page, const char *name)
{
	char pat[256];
	const char *p;

	snprintf(pat, sizeof pat, "\n%s ", name);
	p = strstr(page, pat);
	return p ? strtod(p + strlen(pat), NULL) : -1;
}

double itest_wait_metric(int port, const char *name, double lo, double hi, char *page, size_t cap, int timeout_s)
{
	double end = itest_now() + timeout_s;
	double v;

	for (;;) {
		v = itest_wait_http(port, "/metrics", 200, page, cap, 0) == 200 ? itest_metric(page, name) : -1;
		if ((v >= lo && v <= hi) || itest_now() > end)
			return v;
		itest_sleep_ms(100);
	}
}

int itest_free_port(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof sa;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0, "bind: %s", strerror(errno));
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	close(fd);
	return ntohs(sa.sin_port);
}

int itest_wait_http(int port, const char *path, int want, char *body, size_t cap, int timeout_s)
{
	double end = itest_now() + timeout_s;
	int code;

	for (;;) {
		/* Each request bounded too: a server whose clients are all
		 * taken must not hold the poll past its bound. */
		code = itest_http_get_within(port, path, body, cap, 2);
		if (code == want || itest_now() > end)
			return code;
		itest_sleep_ms(100);
	}
}

int itest_metrics_port(int k)
{
	return itest_cfg()->amqp.port + 14000 + k;
}

void itest_expect_dead(const struct itest_dead *dead, int n, const char *message_id, const char *reason,
                       const char *detail_part)
{
	const struct itest_dead *d = NULL;

	for (int i = 0; d == NULL && i < n; i++) {
		if (strcmp(dead[i].message_id, message_id) == 0)
			d = &dead[i];
	}
	for (int i = 0; d == NULL && i < n; i++)
		cr_log_error("dead letter %d: '%s' %s %s", i, dead[i].message_id, dead[i].reason, dead[i].detail);
	cr_assert_not_null(d, "%s was not dead-lettered", message_id);
	cr_expect_str_eq(d->reason, reason, "%s", message_id);
	if (detail_part != NULL)
		cr_expect(strstr(d->detail, detail_part) != NULL, "%s detail: %s", message_id, d->detail);
}
