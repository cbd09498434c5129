/*
 * notify.c - see notify.h.  The protocol, as sd_notify(3) documents it:
 * a SOCK_DGRAM send of the message to $NOTIFY_SOCKET; an address starting
 * with '@' is abstract (the '@' becomes a NUL byte and the length counts
 * only the name).  Nothing is sent unless the variable is set, so the
 * same binary runs the same outside systemd.
 */
#include "notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

/* $WATCHDOG_USEC: the interval in microseconds; 0 when unset or not for
 * us ($WATCHDOG_PID names another process); -1 when unparsable. */
static int64_t notify_watchdog_ms(void)
{
	const char *usec = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
	char *end;
	unsigned long long v;

	if (usec == NULL || usec[0] == '\0')
		return 0;
	if (pid != NULL && pid[0] != '\0') {
		errno = 0;
		v = strtoull(pid, &end, 10);
		if (errno != 0 || *end != '\0')
			return -1;
		if (v != (unsigned long long)getpid())
			return 0; /* meant for the process that started us */
	}
	errno = 0;
	v = strtoull(usec, &end, 10);
	if (errno != 0 || *end != '\0' || v == 0 || v > (unsigned long long)INT64_MAX / 2)
		return -1;
	/* under a millisecond: still a watchdog, pinged every main tick */
	return v < 1000 ? 1 : (int64_t)(v / 1000);
}

int notify_open(struct notify *n)
{
	const char *path = getenv("NOTIFY_SOCKET");
	size_t len;

	memset(n, 0, sizeof *n);
	n->fd = -1;
	if (path == NULL || path[0] == '\0')
		return 0;
	n->watchdog_ms = notify_watchdog_ms();
	if (n->watchdog_ms < 0) {
		LOG(LOG_LEVEL_ERROR, "WATCHDOG_USEC or WATCHDOG_PID is not a number",
		    LOG_S("WATCHDOG_USEC", getenv("WATCHDOG_USEC")));
		return -1;
	}
	len = strlen(path);
	/* Only the two forms systemd 252 uses (a later systemd may also
	 * give a vsock: address, for virtual machines). */
	if ((path[0] != '/' && path[0] != '@') || len >= sizeof n->addr.sun_path) {
		LOG(LOG_LEVEL_ERROR, "NOTIFY_SOCKET is not a unix socket path or abstract name",
		    LOG_S("NOTIFY_SOCKET", path));
		return -1;
	}
	n->addr.sun_family = AF_UNIX;
	memcpy(n->addr.sun_path, path, len);
	if (path[0] == '@')
		n->addr.sun_path[0] = '\0';
	n->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + (path[0] == '/' ? 1 : 0));
	n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (n->fd < 0) {
		LOG(LOG_LEVEL_ERROR, "cannot open a socket to notify the service manager",
		    LOG_S("error", strerror(errno)));
		return -1;
	}
	return 0;
}

void notify_close(struct notify *n)
{
	if (n->fd >= 0)
		close(n->fd);
	n->fd = -1;
}

bool notify_enabled(const struct notify *n)
{
	return n->fd >= 0;
}

int notify_send(struct notify *n, const char *msg)
{
	ssize_t r;

	if (n->fd < 0)
		return 0;
	/* Never blocks: a manager that does not read (its queue of datagrams
	 * is full: net.unix.max_dgram_qlen, 10 or so) must not stall the
	 * thread that pings, or a stop that takes a while (a stop finishes
	 * what it holds) would hang in sendto.  A dropped ping is what a
	 * stalled service looks like to that manager anyway. */
	do
		r = sendto(n->fd, msg, strlen(msg), MSG_NOSIGNAL | MSG_DONTWAIT, (const struct sockaddr *)&n->addr,
		           n->addrlen);
	while (r < 0 && errno == EINTR);
	if (r >= 0)
		return 0;
	if (!n->send_failed) {
		/* Once: the manager's socket is gone or full; it decides what
		 * a silent service means (a watchdog kills it). */
		n->send_failed = true;
		LOG(LOG_LEVEL_WARN, "cannot notify the service manager", LOG_S("error", strerror(errno)));
	}
	return -1;
}
