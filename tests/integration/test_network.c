/*
 * test_network.c - the broker's link cut without a word (issue 43, item 7):
 * every packet to and from the stack's AMQP ports dropped for longer than
 * the heartbeat (scripts/netfault, iptables in a chain of the stack's own,
 * so no reset ever comes), while a worker consumes and the janitor probes.
 * What must hold, as a service manager sees it (the sd_notify socket of
 * notify_sock.h): every call that waits on the link is bounded, so no
 * thread and not the janitor stops making progress -- WATCHDOG=1 never
 * gaps longer than the watchdog interval, never withheld -- and once the
 * link heals every thread consumes again (/readyz 200) and the backlog
 * drains, each message applied once.
 *
 * Needs root and iptables: without them the test fails, never skips (a
 * fault that did not happen must not count as survived).  The build must
 * have -Dfault_hooks=true like the other integration suites.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "itest.h"
#include "notify_sock.h"

#define WAIT_S 120
/* 12 s: a ping every 3 s, withheld when a thread made no progress for
 * 6 s.  The link's bounds for a 2 s heartbeat (mq.c: 5 s) fit inside. */
#define WATCHDOG_S 12
#define HEARTBEAT_S 2
/* Longer than the heartbeat's detection (2 intervals) and the link's
 * bound, so that a wait without a bound shows. */
#define OUTAGE_S 15
/* What "after the heal" may take: issue 43's acceptance bound. */
#define DRAIN_S 30

static char chain_id[16];

static void netfault(const char *args)
{
	char cmd[512];
	const char *root = getenv("INBOX_SOURCE_ROOT");
	int st;

	cr_assert(root != NULL, "INBOX_SOURCE_ROOT is not set");
	snprintf(cmd, sizeof cmd, "%s/scripts/netfault %s %s", root, chain_id, args);
	st = system(cmd);
	cr_assert(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	          "`%s` failed (status %d): this test needs root and iptables", cmd, st);
}

static void net_down(void)
{
	char cmd[512];
	const char *root = getenv("INBOX_SOURCE_ROOT");

	if (root == NULL || chain_id[0] == '\0')
		return;
	snprintf(cmd, sizeof cmd, "%s/scripts/netfault %s down", root, chain_id);
	if (system(cmd) != 0)
		fprintf(stderr, "test_network: `%s` failed; remove the chain by hand\n", cmd);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* What the service manager saw while it waited. */
struct watch {
	int64_t last_ping_ms;
	int64_t longest_gap_ms;
	int withheld;
	int pings;
};

/* Read the notify socket until until_ms, or (when cond is not NULL)
 * until cond holds; returns whether it held. */
static bool watch_until(struct sock *s, struct watch *w, int64_t until_ms, bool (*cond)(void))
{
	char msg[1024];

	for (;;) {
		int64_t now = now_ms();

		if (cond != NULL && cond())
			return true;
		if (now >= until_ms)
			return false;
		if (sock_recv(s, msg, sizeof msg, 1)) {
			now = now_ms();
			if (has_line(msg, "WATCHDOG=1")) {
				if (w->last_ping_ms > 0 && now - w->last_ping_ms > w->longest_gap_ms)
					w->longest_gap_ms = now - w->last_ping_ms;
				w->last_ping_ms = now;
				w->pings++;
			}
			if (strstr(msg, "watchdog withheld") != NULL)
				w->withheld++;
		}
		/* No ping for that long is a gap too, even if none ever comes. */
		if (w->last_ping_ms > 0 && now - w->last_ping_ms > w->longest_gap_ms)
			w->longest_gap_ms = now - w->last_ping_ms;
	}
}

#define ORDERS 200

static int64_t want_rows;

static bool drained(void)
{
	return itest_int("SELECT COUNT(*) FROM processed_messages") == want_rows;
}

static int metrics_port;

static bool ready(void)
{
	char body[2048];

	return itest_http_get(metrics_port, "/readyz", body, sizeof body) == 200;
}

Test(network, broker_blackholed_past_the_heartbeat_every_thread_comes_back_and_the_pings_never_gap,
     .fini = net_down, .timeout = 600)
{
	const struct cfg *conf;
	char logf[256], addr[64], hb[40], wd[40], drop[64];
	struct sock s;
	struct watch w = { 0 };
	int64_t heal_ms;
	pid_t pid;

	itest_fresh();
	conf = itest_cfg();
	snprintf(chain_id, sizeof chain_id, "%d", conf->amqp.port);
	/* The plain port and the TLS one beside it (scripts/stack: +100). */
	snprintf(drop, sizeof drop, "drop %d %d", conf->amqp.port, conf->amqp.port + 100);
	netfault("down");
	netfault("up");

	itest_log_path(logf, sizeof logf, "network-blackhole");
	sock_bind(&s, "network", false);
	metrics_port = itest_metrics_port(0);
	snprintf(addr, sizeof addr, "INBOX_METRICS_ADDR=127.0.0.1:%d", metrics_port);
	snprintf(hb, sizeof hb, "INBOX_HEARTBEAT=%d", HEARTBEAT_S);
	snprintf(wd, sizeof wd, "WATCHDOG_USEC=%d000000", WATCHDOG_S);
	pid = itest_worker_logged(2, (const char *[]){ s.env, wd, hb, addr, NULL }, logf);
	cr_assert(watch_until(&s, &w, now_ms() + WAIT_S * 1000, ready), "the worker never got ready");

	/* Half the orders before the outage: every connection of the pool
	 * has been used (consumers, publishers, the janitor's probe). */
	itest_publish_orders(NULL, "net", 0, ORDERS / 2);
	want_rows = ORDERS / 2;
	cr_assert(watch_until(&s, &w, now_ms() + WAIT_S * 1000, drained), "the first orders were not applied");

	netfault(drop);
	(void)watch_until(&s, &w, now_ms() + OUTAGE_S * 1000, NULL);
	netfault("clear");
	heal_ms = now_ms();

	/* The other half after the heal, and every thread consuming again
	 * with the backlog drained within DRAIN_S of the heal. */
	itest_publish_orders(NULL, "net", ORDERS / 2, ORDERS);
	want_rows = ORDERS;
	cr_assert(watch_until(&s, &w, heal_ms + DRAIN_S * 1000, drained),
	          "%lld of %d messages applied %d s after the heal",
	          (long long)itest_int("SELECT COUNT(*) FROM processed_messages"), ORDERS, DRAIN_S);
	cr_assert(watch_until(&s, &w, heal_ms + DRAIN_S * 1000, ready), "not every thread consumes %d s after the heal",
	          DRAIN_S);
	/* A few more slots, so a thread still stuck past the heal shows. */
	(void)watch_until(&s, &w, now_ms() + 2 * WATCHDOG_S * 1000, NULL);

	cr_expect_eq(w.withheld, 0, "the watchdog ping was withheld %d times: a thread blocked on the dead link",
	             w.withheld);
	cr_expect_leq(w.longest_gap_ms, WATCHDOG_S * 1000, "%lld ms without a watchdog ping (interval %d s)",
	              (long long)w.longest_gap_ms, WATCHDOG_S);
	cr_expect_eq(itest_ledger_created("net"), ORDERS, "each message applied once, as its own effect");
	itest_stop_ok(pid);
	sock_close(&s);
}
