/*
 * test_errors.c - what the programs say and do when a link fails
 * (issue 12, items 2 and 4).
 *
 * A refusal that will not fix itself (credentials, a vhost or database that
 * does not exist, a topology the broker refuses, a metrics port in use)
 * ends the program at start-up with exit 1 and one line naming the link,
 * the user and what the server said.  A transient fault (a server that
 * refuses or drops connections for a while) is retried, and logged once
 * when it starts, again only when its reason changes, and once when it
 * ends, with the socket's real reason.
 */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "itest.h"

/* The URL of the stack's broker or database with one part replaced. */
static void amqp_url(char *buf, size_t cap, const char *user, const char *pass, int port, const char *vhost)
{
	const struct cfg *c = itest_cfg();

	snprintf(buf, cap, "INBOX_AMQP_URL=amqp://%s:%s@127.0.0.1:%d/%s", user ? user : c->amqp.user,
	         pass ? pass : c->amqp.password, port ? port : c->amqp.port, vhost ? vhost : c->amqp.vhost);
}

static void db_url(char *buf, size_t cap, const char *var, const char *pass, int port, const char *database)
{
	const struct cfg *c = itest_cfg();

	snprintf(buf, cap, "%s=mysql://%s:%s@127.0.0.1:%d/%s", var, c->db.user, pass ? pass : c->db.password,
	         port ? port : c->db.port, database ? database : c->db.database);
}

/* Run `inbox-worker args` with env: it must give up at start, saying
 * every one of texts on one error line (itest_expect_fatal). */
static void expect_fatal(const char *const *args, const char *const *env, const char *const *texts, const char *secret)
{
	char logf[] = "/tmp/itest-errors-XXXXXX";
	int fd = mkstemp(logf);

	cr_assert_geq(fd, 0);
	close(fd);
	itest_expect_fatal(itest_spawn_logged(args, env, logf), logf, args[0], texts, secret);
	unlink(logf);
}

Test(errors, wrong_broker_password_is_fatal_at_start)
{
	char url[512];
	const char *env[] = { url, NULL };
	const char *run[] = { "run", "--threads", "3", NULL };
	const char *texts[] = { "link=amqp", "user=inbox", "403", "ACCESS_REFUSED", NULL };

	itest_fresh();
	amqp_url(url, sizeof url, NULL, "Wr0ngPassw0rd", 0, NULL);
	expect_fatal(run, env, texts, "Wr0ngPassw0rd");
}

Test(errors, unknown_vhost_is_fatal_at_start)
{
	char url[512];
	const char *env[] = { url, NULL };
	const char *run[] = { "run", "--threads", "3", NULL };
	const char *texts[] = { "link=amqp", "user=inbox", "530", "no-such-vhost", NULL };

	itest_fresh();
	amqp_url(url, sizeof url, NULL, NULL, 0, "no-such-vhost");
	expect_fatal(run, env, texts, NULL);
}

/* Every command that connects to the database says the same. */
Test(errors, wrong_database_password_is_fatal_for_every_command)
{
	char url[512], murl[512];
	const char *env[] = { url, murl, NULL };
	const char *run[] = { "run", "--threads", "3", NULL };
	const char *migrate[] = { "migrate", NULL };
	const char *cleanup[] = { "cleanup", NULL };
	const char *dry[] = { "cleanup", "--dry-run", NULL };
	const char *const *cmds[] = { run, migrate, cleanup, dry };
	const char *texts[] = { "link=db", "user=inbox", "1045", "Access denied", NULL };

	itest_fresh();
	db_url(url, sizeof url, "INBOX_DB_URL", "Wr0ngPassw0rd", 0, NULL);
	/* migrate uses the owner's URL; here the worker's, wrong too */
	db_url(murl, sizeof murl, "INBOX_MIGRATE_DB_URL", "Wr0ngPassw0rd", 0, NULL);
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
		expect_fatal(cmds[i], env, texts, "Wr0ngPassw0rd");
}

Test(errors, unknown_database_is_fatal_for_every_command)
{
	char url[512], murl[512];
	const char *env[] = { url, murl, NULL };
	const char *run[] = { "run", "--threads", "2", NULL };
	const char *migrate[] = { "migrate", NULL };
	const char *cleanup[] = { "cleanup", NULL };
	const char *const *cmds[] = { run, migrate, cleanup };
	/* 1044 for an account without rights on it, 1049 when it may see
	 * every database: either way the line names it */
	const char *texts[] = { "link=db", "user=inbox", "no_such_db", NULL };

	itest_fresh();
	db_url(url, sizeof url, "INBOX_DB_URL", NULL, 0, "no_such_db");
	db_url(murl, sizeof murl, "INBOX_MIGRATE_DB_URL", NULL, 0, "no_such_db");
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
		expect_fatal(cmds[i], env, texts, NULL);
}

/* inbox-loadgen connects too: the same refusal, the same kind of line. */
Test(errors, loadgen_with_a_wrong_broker_password_says_so)
{
	char url[512], ledger[] = "/tmp/itest-errors-ledger-XXXXXX", logf[] = "/tmp/itest-errors-XXXXXX";
	const char *env[] = { url, NULL };
	const char *texts[] = { "link=amqp", "user=inbox", "403", NULL };
	const char *bin = getenv("INBOX_LOADGEN_BIN");
	int fd1 = mkstemp(ledger), fd2 = mkstemp(logf);
	pid_t pid;
	int code;

	cr_assert(fd1 >= 0 && fd2 >= 0 && bin != NULL);
	close(fd1);
	close(fd2);
	itest_fresh();
	amqp_url(url, sizeof url, NULL, "Wr0ngPassw0rd", 0, NULL);
	{
		const char *args[] = { "publish", "--orders", "5", "--ledger", ledger, NULL };
		pid = itest_spawn_program(bin, args, env, logf, false);
	}
	code = itest_wait_exit(pid, 60);
	code = WIFEXITED(code) ? WEXITSTATUS(code) : 128 + WTERMSIG(code);
	if (code != 1 || itest_log_lines(logf, texts) < 1)
		itest_show_log(logf);
	cr_assert_eq(code, 1);
	cr_assert_geq(itest_log_lines(logf, texts), 1);
	unlink(ledger);
	unlink(logf);
}

/*
 * Both servers refuse connections for a while at start (nothing listens on
 * the worker's ports), then come back.  Each thread logs the outage once,
 * with the socket's reason, however many attempts it made (the attempts
 * are at debug level), and once when it is over; then the worker works.
 */
Test(errors, a_refused_connection_period_is_logged_once_per_state_change, .timeout = 240)
{
	const struct cfg *c;
	char logf[] = "/tmp/itest-errors-XXXXXX", aurl[512], durl[512], body[512];
	const char *env[] = { aurl, durl, "INBOX_LOG_LEVEL=debug", NULL };
	const char *run[] = { "run", "--threads", "1", NULL };
	const char *db_attempt[] = { "database connect attempt failed", "connection refused", NULL };
	const char *db_down[] = { "database unavailable", "connection refused", NULL };
	const char *db_down_any[] = { " warn ", "database unavailable", NULL };
	const char *db_up[] = { "database reconnected", NULL };
	const char *mq_attempt[] = { "broker connect attempt failed", "connection refused", NULL };
	const char *mq_down[] = { "broker unavailable", "connection refused", NULL };
	const char *mq_down_any[] = { " warn ", "broker unavailable", NULL };
	const char *mq_up[] = { "broker reconnected", NULL };
	const char *janitor[] = { "thread=janitor", NULL };
	const char *minus_one[] = { "worker=-1", NULL };
	int fd = mkstemp(logf), dport = itest_free_port(), aport = itest_free_port();
	pid_t pid, fdb, fmq;

	cr_assert_geq(fd, 0);
	close(fd);
	itest_fresh();
	c = itest_cfg();
	amqp_url(aurl, sizeof aurl, NULL, NULL, aport, NULL);
	db_url(durl, sizeof durl, "INBOX_DB_URL", NULL, dport, NULL);
	pid = itest_spawn_logged(run, env, logf);

	/* The database refuses: many attempts, one line per thread (the
	 * worker thread and the janitor). */
	cr_assert_geq(itest_wait_log_lines(logf, db_attempt, 8, 60), 8, "the worker keeps trying the database");
	cr_assert_eq(itest_log_lines(logf, db_down), 2, "one line per thread when the outage starts");
	cr_assert_eq(itest_log_lines(logf, db_down_any), 2, "and no other");
	/* The server comes back on the port the worker was told to use. */
	fdb = itest_forward("127.0.0.1", dport, c->db.port);
	cr_assert_eq(itest_wait_log_lines(logf, db_up, 2, 60), 2, "one line per thread when it ends");

	/* The broker refuses: the same. */
	cr_assert_geq(itest_wait_log_lines(logf, mq_attempt, 8, 60), 8, "the worker keeps trying the broker");
	cr_assert_geq(itest_log_lines(logf, mq_down), 1);
	cr_assert_leq(itest_log_lines(logf, mq_down_any), 2, "one line per thread that needs the broker");
	fmq = itest_forward("127.0.0.1", aport, c->amqp.port);
	cr_assert_geq(itest_wait_log_lines(logf, mq_up, 1, 60), 1);

	/* And then it works. */
	{
		struct mq *m = itest_mq();
		itest_event(body, sizeof body, "err-1", "OrderCreated", "o-err-1");
		itest_publish(m, "OrderCreated", body, NULL);
		cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM orders WHERE id = 'o-err-1'", 1, 60), 1);
	}
	cr_assert_eq(itest_stop(pid, SIGTERM, 30), 0);
	kill(fdb, SIGTERM);
	kill(fmq, SIGTERM);
	waitpid(fdb, NULL, 0);
	waitpid(fmq, NULL, 0);
	cr_assert_eq(itest_log_lines(logf, db_down_any), 2, "still one line per thread");
	cr_assert_geq(itest_log_lines(logf, janitor), 1, "the janitor logs under its own name");
	cr_assert_eq(itest_log_lines(logf, minus_one), 0);
	if (itest_log_lines(logf, (const char *const[]){ NULL }) > 400)
		itest_show_log(logf);
	unlink(logf);
}

/* INBOX_ORDERING=sharded needs the consistent-hash exchange plugin: a
 * broker without it refuses the exchange type.  Say what and what to
 * enable, and exit. */
Test(errors, sharded_ordering_without_the_plugin_says_what_to_enable, .timeout = 240)
{
	const char *stack = getenv("INBOX_STACK");
	const char *env[] = { "INBOX_ORDERING=sharded", NULL };
	const char *run[] = { "run", "--threads", "2", NULL };
	const char *texts[] = { "link=amqp", "x-consistent-hash", "rabbitmq_consistent_hash_exchange", NULL };
	char cmd[1024];
	int rc;

	cr_assert_not_null(stack, "INBOX_STACK is not set (eval \"$(scripts/stack env)\")");
	itest_fresh();
	snprintf(cmd, sizeof cmd, "%s plugins disable rabbitmq_consistent_hash_exchange >/dev/null 2>&1", stack);
	cr_assert_eq(system(cmd), 0, "cannot disable the plugin");
	/* The exchange of an earlier sharded test would stay declared. */
	{
		struct mq *m = itest_mq();
		char hx[300];
		snprintf(hx, sizeof hx, "%s.sharded", itest_cfg()->exchange);
		(void)mq_exchange_delete(m, hx);
	}
	expect_fatal(run, env, texts, NULL);
	snprintf(cmd, sizeof cmd, "%s plugins enable rabbitmq_consistent_hash_exchange >/dev/null 2>&1", stack);
	rc = system(cmd);
	cr_assert_eq(rc, 0, "cannot enable the plugin again");
}

/* --metrics-addr: what the check accepts, the server binds; a port in use
 * is one line with what to do. */
Test(errors, metrics_address_forms_are_served)
{
	const char *forms[] = { "localhost:", ":", "127.0.0.1:", "[::1]:" };
	char body[4096];

	itest_fresh();
	for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
		char addr[64], logf[] = "/tmp/itest-errors-XXXXXX";
		int port = itest_metrics_port(0), fd = mkstemp(logf);
		const char *args[] = { "run", "--threads", "1", "--metrics-addr", addr, NULL };
		pid_t pid;

		cr_assert_geq(fd, 0);
		close(fd);
		snprintf(addr, sizeof addr, "%s%d", forms[i], port);
		pid = itest_spawn_logged(args, NULL, logf);
		if (strncmp(addr, "[::1]", 5) == 0) {
			/* itest_http_get speaks IPv4: ask the log instead */
			const char *served[] = { "serving /metrics", NULL };
			cr_assert_eq(itest_wait_log_lines(logf, served, 1, 30), 1, "%s is served", addr);
		} else if (itest_wait_http(port, "/healthz", 200, body, sizeof body, 30) != 200) {
			itest_show_log(logf);
			cr_assert_fail("%s is not served", addr);
		}
		cr_assert_eq(itest_stop(pid, SIGTERM, 30), 0);
		unlink(logf);
	}
}

Test(errors, a_metrics_port_in_use_says_so_and_what_to_do)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int port = itest_metrics_port(1), fd = socket(AF_INET, SOCK_STREAM, 0), on = 1;
	char addr[64];
	const char *args[] = { "run", "--threads", "1", "--metrics-addr", addr, NULL };
	const char *texts[] = { "INBOX_METRICS_ADDR", "in use", "choose a free port", NULL };

	itest_fresh();
	sa.sin_port = htons((uint16_t)port);
	cr_assert_geq(fd, 0);
	cr_assert_eq(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on), 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	cr_assert_eq(listen(fd, 4), 0);
	snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
	expect_fatal(args, NULL, texts, NULL);
	close(fd);
}
