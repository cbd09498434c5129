/*
 * test_security.c - what the process shows to other users of the machine,
 * and what the worker's database account may do.
 *
 * A URL given as a flag is in the process's argument memory, which
 * /proc/PID/cmdline (and so `ps`) shows to every local user: the worker
 * must overwrite the password there at start.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "itest.h"
#include "status.h"

/* The whole of /proc/pid/cmdline with its NULs turned into spaces. */
static size_t read_cmdline(pid_t pid, char *buf, size_t cap)
{
	char path[64];
	size_t n = 0;
	int fd;

	snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
	fd = open(path, O_RDONLY);
	cr_assert_geq(fd, 0, "cannot open %s", path);
	for (;;) {
		ssize_t r = read(fd, buf + n, cap - 1 - n);

		cr_assert_geq(r, 0);
		if (r == 0 || n + (size_t)r >= cap - 1) {
			n += (size_t)r;
			break;
		}
		n += (size_t)r;
	}
	close(fd);
	for (size_t i = 0; i < n; i++)
		if (buf[i] == '\0')
			buf[i] = ' ';
	buf[n] = '\0';
	return n;
}

Test(security, a_password_in_a_flag_is_not_in_the_process_list)
{
	const struct cfg *c;
	char port[16], addr[64], cmdline[8192], body[4096], pw_amqp[300], pw_db[300];
	const char *amqp_url = getenv("INBOX_AMQP_URL");
	const char *db_url = getenv("INBOX_DB_URL");
	pid_t pid;

	itest_fresh();
	c = itest_cfg();
	cr_assert(c->amqp.password[0] != '\0' && c->db.password[0] != '\0',
	          "the stack's URLs carry passwords");
	snprintf(pw_amqp, sizeof pw_amqp, ":%s@", c->amqp.password);
	snprintf(pw_db, sizeof pw_db, ":%s@", c->db.password);
	snprintf(port, sizeof port, "%d", itest_metrics_port(0));
	snprintf(addr, sizeof addr, "127.0.0.1:%s", port);
	{
		/* Both URLs as flags, one as "--flag value", one as "--flag=value". */
		char db_flag[1200];
		const char *args[] = { "run", "--threads", "1", "--amqp-url", amqp_url, db_flag,
		                       "--metrics-addr", addr, NULL };
		/* Only the flags say where to connect: glibc's putenv of a
		 * name without '=' removes the variable from the child. */
		const char *env[] = { "INBOX_AMQP_URL", "INBOX_DB_URL", NULL };

		snprintf(db_flag, sizeof db_flag, "--db-url=%s", db_url);
		pid = itest_spawn(args, env);
	}
	/* Ready means both connections were made with the flags' URLs. */
	cr_assert_eq(itest_wait_http(itest_metrics_port(0), "/readyz", 200, body, sizeof body, 60), 200,
	             "the worker did not become ready: %s", body);
	read_cmdline(pid, cmdline, sizeof cmdline);
	itest_stop(pid, SIGTERM, 30);
	cr_assert(strstr(cmdline, "--amqp-url") != NULL && strstr(cmdline, "@127.0.0.1") != NULL,
	          "read the worker's own command line: %s", cmdline);
	cr_expect_null(strstr(cmdline, pw_amqp), "the broker password shows in /proc/PID/cmdline: %s", cmdline);
	cr_expect_null(strstr(cmdline, pw_db), "the database password shows in /proc/PID/cmdline: %s", cmdline);
}

/*
 * Two accounts: `migrate` runs as the schema owner (INBOX_MIGRATE_DB_URL),
 * the worker as an account that may only read and write rows (DML).  The
 * worker still applies a message, and its account cannot change the
 * schema, nor create or run stored routines.
 */
Test(security, the_workers_account_reads_writes_and_executes_only)
{
	const struct cfg *c;
	struct db *w = NULL;
	struct mq *m;
	char body[512];
	static const char *const ddl[] = {
		"CREATE TABLE security_probe (id INT PRIMARY KEY)",
		"ALTER TABLE orders ADD COLUMN security_probe INT",
		"DROP TABLE order_events",
		"CREATE INDEX security_probe ON orders (status)",
		"CREATE PROCEDURE security_probe() SELECT 1",
	};
	pid_t pid;

	itest_fresh();
	c = itest_cfg();
	cr_assert_not_null(c->migrate_db.host, "INBOX_MIGRATE_DB_URL is not set: the stack gives no owner account");
	cr_assert_str_neq(c->migrate_db.user, c->db.user, "migrate and the worker use one account");
	cr_assert_eq(db_open(&w, &c->db), ST_OK);
	for (size_t i = 0; i < sizeof ddl / sizeof ddl[0]; i++) {
		int rc = db_exec(w, ddl[i]);

		/* 1142 (a table's privilege) is ST_ERR_DB, 1044 (the database's,
		 * as for a routine) ST_ERR_ACCESS: refused either way. */
		cr_expect(rc == ST_ERR_DB || rc == ST_ERR_ACCESS, "%s: the worker's account may change the schema (%d)",
		          ddl[i], rc);
		cr_expect(strstr(db_errmsg(w), "denied") != NULL, "%s: refused for its privileges: %s", ddl[i],
		          db_errmsg(w));
	}
	db_close(&w);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM information_schema.COLUMNS "
	                       "WHERE TABLE_SCHEMA = DATABASE() AND COLUMN_NAME = 'security_probe'"), 0);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM information_schema.TABLES "
	                       "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ('order_events', 'security_probe')"), 1);

	pid = itest_worker(1, NULL);
	m = itest_mq();
	itest_event(body, sizeof body, "sec-1", "OrderCreated", "o-sec-1");
	itest_publish(m, "OrderCreated", body, NULL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM orders WHERE id = 'o-sec-1' AND status = 'Created'", 1, 60), 1,
	             "the restricted worker applied the message");
	itest_stop(pid, SIGTERM, 30);
	mq_close(&m);
}
