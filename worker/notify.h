/*
 * notify.h - telling the service manager how `inbox-worker run` is doing:
 * the notification protocol of sd_notify(3), READY=1, WATCHDOG=1,
 * STOPPING=1 and STATUS=, for systemd's Type=notify units
 * (systemd/inbox-worker.service).
 *
 * Spoken here directly, not through libsystemd.  A Type=notify unit whose
 * binary cannot notify waits at start until TimeoutStartSec and is killed
 * (pgbouncer's issue #1416: built without libsystemd, the unit hung).  With
 * the protocol compiled in unconditionally there is no build of this
 * program that cannot send READY=1: no dependency can be missing, no
 * option can leave it out, and the units can be installed by every build.
 * The protocol is small and documented as stable (sd_notify(3), "Notes"):
 * one datagram of newline-separated VARIABLE=value lines sent to the
 * AF_UNIX socket named by $NOTIFY_SOCKET, a path or, with a leading '@', a
 * name in the abstract namespace.  The watchdog is asked for by
 * $WATCHDOG_USEC (and $WATCHDOG_PID, when set, must be ours).
 *
 * Without $NOTIFY_SOCKET (not under systemd) everything here is a no-op.
 */
#ifndef INBOX_NOTIFY_H
#define INBOX_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

struct notify {
	int fd;                   /* -1: nobody to notify */
	struct sockaddr_un addr;
	socklen_t addrlen;
	int64_t watchdog_ms;      /* the manager's watchdog interval; 0: none */
	bool send_failed;         /* a send failed (logged once) */
};

/* From the environment.  Returns 0, also when there is nothing to notify;
 * -1 when $NOTIFY_SOCKET or $WATCHDOG_USEC is set but unusable (logged:
 * the manager would wait for a READY=1 that cannot come, so the caller
 * exits rather than run unnoticed). */
int notify_open(struct notify *n);
void notify_close(struct notify *n);
bool notify_enabled(const struct notify *n);
/* Send one message (newline-separated assignments).  Returns 0, or -1
 * (logged once per process) when the manager's socket refused it. */
int notify_send(struct notify *n, const char *msg);

#endif
