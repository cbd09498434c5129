/*
 * test_notify_proto.c - worker/notify.c alone, no servers: the two address
 * forms of NOTIFY_SOCKET carry a message intact, a watchdog meant for
 * another process (WATCHDOG_PID) is not ours, what cannot be used is
 * refused (so `run` exits instead of leaving a manager waiting), and
 * without NOTIFY_SOCKET nothing is sent.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "notify.h"

static void clear_env(void)
{
	unsetenv("NOTIFY_SOCKET");
	unsetenv("WATCHDOG_USEC");
	unsetenv("WATCHDOG_PID");
}

/* A bound datagram socket; *name is what NOTIFY_SOCKET is set to. */
static int bind_sock(bool abstract, char *name, size_t cap)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	socklen_t len;
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0), n;

	cr_assert_geq(fd, 0);
	if (abstract) {
		n = snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1, "inbox-proto-%d", (int)getpid());
		len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
		snprintf(name, cap, "@%s", sa.sun_path + 1);
	} else {
		snprintf(sa.sun_path, sizeof sa.sun_path, "/tmp/inbox-proto-%d.sock", (int)getpid());
		unlink(sa.sun_path);
		len = (socklen_t)sizeof sa;
		snprintf(name, cap, "%s", sa.sun_path);
	}
	cr_assert_eq(bind(fd, (struct sockaddr *)&sa, len), 0, "bind: %s", strerror(errno));
	return fd;
}

static void expect_message(int fd, const char *want)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char buf[512];
	ssize_t r;

	cr_assert_eq(poll(&p, 1, 10000), 1, "nothing arrived");
	r = recv(fd, buf, sizeof buf - 1, 0);
	cr_assert_geq(r, 0);
	buf[r] = '\0';
	cr_assert_str_eq(buf, want);
}

static void round_trip(bool abstract)
{
	struct notify n;
	char name[120];
	int fd;

	clear_env();
	fd = bind_sock(abstract, name, sizeof name);
	setenv("NOTIFY_SOCKET", name, 1);
	setenv("WATCHDOG_USEC", "3000000", 1);
	cr_assert_eq(notify_open(&n), 0);
	cr_assert(notify_enabled(&n));
	cr_assert_eq(n.watchdog_ms, 3000);
	cr_assert_eq(notify_send(&n, "READY=1\nSTATUS=ready"), 0);
	expect_message(fd, "READY=1\nSTATUS=ready");
	cr_assert_eq(notify_send(&n, "WATCHDOG=1"), 0);
	expect_message(fd, "WATCHDOG=1");
	notify_close(&n);
	close(fd);
	if (!abstract)
		unlink(name);
	clear_env();
}

Test(notify_proto, a_path_socket_gets_each_message_intact)
{
	round_trip(false);
}

Test(notify_proto, an_abstract_socket_gets_each_message_intact)
{
	round_trip(true);
}

Test(notify_proto, a_watchdog_for_another_process_is_not_ours)
{
	struct notify n;
	char pid[32];

	clear_env();
	setenv("NOTIFY_SOCKET", "/tmp/inbox-proto-unused.sock", 1);
	setenv("WATCHDOG_USEC", "3000000", 1);
	snprintf(pid, sizeof pid, "%d", (int)getpid() + 1);
	setenv("WATCHDOG_PID", pid, 1);
	cr_assert_eq(notify_open(&n), 0);
	cr_assert_eq(n.watchdog_ms, 0);
	notify_close(&n);
	snprintf(pid, sizeof pid, "%d", (int)getpid());
	setenv("WATCHDOG_PID", pid, 1);
	cr_assert_eq(notify_open(&n), 0);
	cr_assert_eq(n.watchdog_ms, 3000);
	notify_close(&n);
	clear_env();
}

Test(notify_proto, what_cannot_be_used_is_refused)
{
	static const char *const sockets[] = { "relative/path", "vsock:2:1234", NULL };
	struct notify n;
	char longpath[200];

	for (int i = 0; sockets[i] != NULL; i++) {
		clear_env();
		setenv("NOTIFY_SOCKET", sockets[i], 1);
		cr_expect_eq(notify_open(&n), -1, "NOTIFY_SOCKET=%s accepted", sockets[i]);
		cr_expect_not(notify_enabled(&n));
	}
	memset(longpath, 'a', sizeof longpath - 1);
	longpath[0] = '/';
	longpath[sizeof longpath - 1] = '\0';
	setenv("NOTIFY_SOCKET", longpath, 1);
	cr_expect_eq(notify_open(&n), -1, "a path longer than sun_path accepted");
	setenv("NOTIFY_SOCKET", "/tmp/x.sock", 1);
	setenv("WATCHDOG_USEC", "soon", 1);
	cr_expect_eq(notify_open(&n), -1, "WATCHDOG_USEC=soon accepted");
	setenv("WATCHDOG_USEC", "0", 1);
	cr_expect_eq(notify_open(&n), -1, "WATCHDOG_USEC=0 accepted");
	clear_env();
}

Test(notify_proto, without_notify_socket_nothing_is_sent)
{
	struct notify n;

	clear_env();
	setenv("WATCHDOG_USEC", "3000000", 1);
	cr_assert_eq(notify_open(&n), 0);
	cr_assert_not(notify_enabled(&n));
	cr_assert_eq(notify_send(&n, "READY=1"), 0);
	notify_close(&n);
	clear_env();
}
