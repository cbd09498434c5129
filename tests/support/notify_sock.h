/*
 * notify_sock.h - the service manager's side of sd_notify for the
 * integration suites (test_notify.c, test_network.c): bind the datagram
 * socket that NOTIFY_SOCKET names and read what the worker sends, in
 * order.  Header-only, static: each suite is one program.
 */
#ifndef INBOX_NOTIFY_SOCK_H
#define INBOX_NOTIFY_SOCK_H

#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

struct sock {
	int fd;
	char path[108]; /* "" for an abstract name */
	char env[140];  /* NOTIFY_SOCKET=... */
};

/* Bind the manager's socket: a file path, or an abstract name (the
 * '@' form of NOTIFY_SOCKET), as systemd uses both. */
static void sock_bind(struct sock *s, const char *name, bool abstract)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	socklen_t len;
	int n;

	s->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(s->fd, 0, "socket: %s", strerror(errno));
	if (abstract) {
		n = snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1, "inbox-notify-%d-%s", (int)getpid(), name);
		len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
		s->path[0] = '\0';
		snprintf(s->env, sizeof s->env, "NOTIFY_SOCKET=@%s", sa.sun_path + 1);
	} else {
		n = snprintf(s->path, sizeof s->path, "/tmp/inbox-notify-%d-%s.sock", (int)getpid(), name);
		cr_assert_lt(n, (int)sizeof s->path);
		unlink(s->path);
		memcpy(sa.sun_path, s->path, (size_t)n + 1);
		len = (socklen_t)sizeof sa;
		snprintf(s->env, sizeof s->env, "NOTIFY_SOCKET=%s", s->path);
	}
	cr_assert_eq(bind(s->fd, (struct sockaddr *)&sa, len), 0, "bind: %s", strerror(errno));
}

static void sock_close(struct sock *s)
{
	close(s->fd);
	if (s->path[0] != '\0')
		unlink(s->path);
}

/* The next datagram into buf (NUL-terminated); false when none came within
 * timeout_s. */
static bool sock_recv(struct sock *s, char *buf, size_t cap, int timeout_s)
{
	struct pollfd p = { .fd = s->fd, .events = POLLIN };
	ssize_t r;
	int rc;

	do
		rc = poll(&p, 1, timeout_s * 1000);
	while (rc < 0 && errno == EINTR);
	cr_assert_geq(rc, 0, "poll: %s", strerror(errno));
	if (rc == 0)
		return false;
	r = recv(s->fd, buf, cap - 1, 0);
	cr_assert_geq(r, 0, "recv: %s", strerror(errno));
	buf[r] = '\0';
	return true;
}

/* Whether a message holds the assignment line (e.g. "READY=1"). */
static bool has_line(const char *msg, const char *line)
{
	size_t n = strlen(line);

	for (const char *p = msg; (p = strstr(p, line)) != NULL; p += n)
		if ((p == msg || p[-1] == '\n') && (p[n] == '\0' || p[n] == '\n'))
			return true;
	return false;
}

#endif
