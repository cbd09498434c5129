/*
 * test_notify.c - `inbox-worker run` under a service manager (Type=notify,
 * worker/notify.h): the test plays systemd, binding the datagram socket
 * that NOTIFY_SOCKET names and reading what the worker sends, in order.
 *   READY=1 comes once every thread is ready (/readyz answers 200 then),
 *           and not while a thread cannot reach its database;
 *   WATCHDOG=1 keeps coming while the pool is healthy or waiting for a
 *           server, and stops while a consuming thread is stuck (the
 *           worker-stall fault hook): the worker says STATUS=watchdog
 *           withheld on every slot instead;
 *   STOPPING=1 comes on SIGTERM, and the worker exits 0.
 * Every wait is for a message or a condition, each bounded generously.
 * The build must have -Dfault_hooks=true (scripts/test sets it).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"
#include "notify_sock.h"

#ifndef WAIT_S
#define WAIT_S 120
#endif
/* 4 s: a ping every second, withheld after 2 s without progress, eight
 * times the longest idle step of a thread (250 ms), so that a loaded
 * machine does not withhold pings by itself. */
#define WATCHDOG_USEC "WATCHDOG_USEC=4000000"

/* Read messages until one holds line; fails the test after WAIT_S without
 * one.  Counts on the way what held other lines (may be NULL). */
static void wait_line(struct sock *s, const char *line, const char *count_line, int *count)
{
	char msg[1024];

	for (;;) {
		cr_assert(sock_recv(s, msg, sizeof msg, WAIT_S), "no %s within %d s", line, WAIT_S);
		if (count_line != NULL && has_line(msg, count_line))
			(*count)++;
		if (has_line(msg, line))
			return;
	}
}

/* SIGTERM: STOPPING=1 arrives, then the worker exits 0. */
static void stop_expect_stopping(struct sock *s, pid_t w)
{
	int st;

	cr_assert_eq(kill(w, SIGTERM), 0);
	wait_line(s, "STOPPING=1", NULL, NULL);
	st = itest_wait_exit(w, WAIT_S);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the worker did not exit 0 on SIGTERM (status %d)", st);
}

Test(notify, ready_after_readiness_watchdog_while_healthy_stopping_on_sigterm)
{
	char logf[256], addr[64], body[2048], msg[1024];
	struct sock s;
	int port, pings = 0;
	pid_t w;

	itest_fresh();
	itest_log_path(logf, sizeof logf, "notify-healthy");
	sock_bind(&s, "healthy", false);
	port = itest_metrics_port(0);
	snprintf(addr, sizeof addr, "INBOX_METRICS_ADDR=127.0.0.1:%d", port);
	w = itest_worker_logged(2, (const char *[]){ s.env, WATCHDOG_USEC, addr, NULL }, logf);

	/* READY=1, and at that moment /readyz says ready: READY is what
	 * /readyz says, not "the process started". */
	for (;;) {
		cr_assert(sock_recv(&s, msg, sizeof msg, WAIT_S), "no READY=1 within %d s", WAIT_S);
		if (has_line(msg, "READY=1"))
			break;
	}
	cr_expect(has_line(msg, "STATUS=ready: every thread consuming"), "READY=1 came with: %s", msg);
	cr_assert_eq(itest_http_get(port, "/readyz", body, sizeof body), 200,
	             "READY=1 was sent while /readyz said: %s", body);

	/* The pings keep coming while it is healthy, and READY=1 is sent once. */
	while (pings < 4) {
		cr_assert(sock_recv(&s, msg, sizeof msg, WAIT_S), "the watchdog pings stopped after %d", pings);
		cr_assert_not(has_line(msg, "READY=1"), "READY=1 sent twice");
		cr_assert_not(strstr(msg, "withheld"), "a ping withheld from a healthy pool: %s", msg);
		if (has_line(msg, "WATCHDOG=1"))
			pings++;
	}
	stop_expect_stopping(&s, w);
	sock_close(&s);
}

Test(notify, no_ready_while_the_database_is_unreachable_but_the_pings_go_on)
{
	char logf[256], db[200], addr[64], body[2048], msg[1024];
	struct sock s;
	int port, pings = 0, not_ready = 0;
	pid_t w;

	itest_fresh();
	itest_log_path(logf, sizeof logf, "notify-nodb");
	/* the abstract-namespace form of NOTIFY_SOCKET */
	sock_bind(&s, "nodb", true);
	/* a port nobody listens on: connection refused, which the pool waits
	 * out (it is not a wrong setting) */
	snprintf(db, sizeof db, "INBOX_DB_URL=mysql://inbox:inbox@127.0.0.1:%d/inbox", itest_free_port());
	port = itest_metrics_port(1);
	snprintf(addr, sizeof addr, "INBOX_METRICS_ADDR=127.0.0.1:%d", port);
	w = itest_worker_logged(1, (const char *[]){ s.env, WATCHDOG_USEC, db, addr, NULL }, logf);
	itest_wait_log(logf, "database unavailable, retrying", WAIT_S);

	/* Three pings while waiting for the database (restarting would not
	 * bring it back), none of them after a READY=1. */
	while (pings < 3) {
		cr_assert(sock_recv(&s, msg, sizeof msg, WAIT_S), "the watchdog pings stopped after %d", pings);
		cr_assert_not(has_line(msg, "READY=1"), "READY=1 sent while the database is unreachable: %s", msg);
		if (strstr(msg, "STATUS=not ready: ") != NULL)
			not_ready++;
		if (has_line(msg, "WATCHDOG=1"))
			pings++;
	}
	cr_expect_geq(not_ready, 1, "no STATUS=not ready was sent");
	cr_assert_eq(itest_http_get(port, "/readyz", body, sizeof body), 503, "/readyz: %s", body);
	stop_expect_stopping(&s, w);
	sock_close(&s);
}

Test(notify, watchdog_stops_while_a_worker_is_stuck)
{
	char logf[256], msg[1024];
	struct sock s;
	int withheld = 0;
	pid_t w;

	itest_fresh();
	itest_log_path(logf, sizeof logf, "notify-stall");
	sock_bind(&s, "stall", false);
	w = itest_worker_logged(2, (const char *[]){ s.env, WATCHDOG_USEC, "INBOX_FAULT=worker-stall", NULL }, logf);
	wait_line(&s, "READY=1", NULL, NULL);
	wait_line(&s, "WATCHDOG=1", NULL, NULL);

	/* One message: the thread that takes it hangs with it. */
	itest_publish_orders(NULL, "stall", 0, 1);
	itest_wait_log(logf, "stalling until asked to stop", WAIT_S);

	/* From the first withheld slot on, three slots in a row without a
	 * ping: the messages come in the order they were sent. */
	for (;;) {
		cr_assert(sock_recv(&s, msg, sizeof msg, WAIT_S), "neither a ping nor a withheld status within %d s", WAIT_S);
		if (strstr(msg, "STATUS=watchdog withheld: worker=") != NULL)
			break;
	}
	for (withheld = 1; withheld < 3;) {
		cr_assert(sock_recv(&s, msg, sizeof msg, WAIT_S), "no message within %d s", WAIT_S);
		cr_assert_not(has_line(msg, "WATCHDOG=1"), "a ping while a worker is stuck");
		if (strstr(msg, "STATUS=watchdog withheld: worker=") != NULL)
			withheld++;
	}
	cr_assert(itest_log_has(logf, "watchdog withheld"), "the withheld ping was not logged");

	/* SIGTERM ends the stall; the message goes back or is applied, and
	 * the worker exits 0. */
	stop_expect_stopping(&s, w);
	sock_close(&s);
}
