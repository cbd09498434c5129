/*
 * addr.h - network addresses as an operator writes them, and what a TCP
 * connect to one meets.
 *
 * One parser per shape, used by every reader of that shape, so that what
 * the configuration check accepts is exactly what the program then uses:
 *
 *   URLs       scheme://user:pass@host:port/path?query  (addr_url_split;
 *              url.c reads amqp:// and mysql:// URLs through it)
 *   listeners  host:port, :port, [v6]:port  (addr_hostport_parse; the
 *              INBOX_METRICS_ADDR check and the metrics server both use it)
 *
 * Ownership: a struct addr_url points into the caller's string and owns
 * nothing; addr_url_redact returns a malloc'd copy the caller frees.
 * addr_listen returns a socket the caller owns (close it, or hand it to a
 * server that does).  Errors are one line in the caller's buffer.
 */
#ifndef INBOX_ADDR_H
#define INBOX_ADDR_H

#include <stdbool.h>
#include <stddef.h>

/* One-line errors about what an operator wrote, the convention of the
 * modules that read it (addr, url, cfg): printf into err (nothing when
 * err is NULL or errlen 0), and a value quoted back in one: printable
 * ASCII only ('?' for the rest), cut after ADDR_ECHO_MAX bytes with "...",
 * "" for NULL: a buffer of ADDR_ECHO_MAX + 4 holds any. */
#define ADDR_ECHO_MAX 64
__attribute__((format(printf, 3, 4)))
void addr_errf(char *err, size_t errlen, const char *fmt, ...);
void addr_echo(char *dst, size_t dstlen, const char *s);

/* The pieces of scheme://user:pass@host:port/path?query, pointing into the
 * URL.  Lengths rather than copies: nothing to free on the error paths. */
struct addr_url {
	const char *user, *pass, *host, *port, *path, *query;
	size_t user_len, pass_len, host_len, port_len, path_len, query_len;
	bool has_user, has_pass, has_port, has_path, has_query;
};

/* Which of schemes (NULL-terminated, each ending in "://") url starts with,
 * case-insensitively: its index, with *len its length; or -1 with err set
 * (want names the accepted schemes). */
int addr_url_scheme(const char *url, const char *const *schemes, const char *want, size_t *len, char *err,
                    size_t errlen);
/* Split the part after the scheme.  Only checks the shape (no spaces or
 * control characters, no '#', no '@' after the host, a bracketed IPv6
 * literal, host characters); the callers decide what a missing host or a
 * query means for them.  0, or -1 with err set ("bad URL: ..."). */
int addr_url_split(const char *url, size_t scheme_len, struct addr_url *v, char *err, size_t errlen);
/* The port of v into *port (left alone when the URL has none): 0 or -1. */
int addr_url_port(const struct addr_url *v, int *port, char *err, size_t errlen);
/* Percent-decode s[0..n) into *out (malloc'd, the caller frees).  0, or -1
 * with a reason naming `what` (never the text: it may be a password) and
 * *out NULL; %00 is refused. */
int addr_url_decode(const char *s, size_t n, const char *what, char **out, char *err, size_t errlen);
/* The URL with its password replaced by "***": safe to log.  malloc'd;
 * NULL when out of memory. */
char *addr_url_redact(const char *url, const struct addr_url *v);

/* A listening address: host:port, :port (every IPv4 address), [v6]:port
 * ([::] for every IPv6 address), where host is an IPv4 literal or a name. */
struct addr_hostport {
	char host[256]; /* "" for :port; an IPv6 literal without its brackets */
	int port;       /* 1..65535 */
	bool v6;        /* written in brackets */
};

/* Parse s: 0, or -1 with err set (one line, the value echoed safely). */
int addr_hostport_parse(const char *s, struct addr_hostport *out, char *err, size_t errlen);

/* A listening TCP socket (SO_REUSEADDR, backlog 64) on a, resolved with
 * getaddrinfo; the first address that binds wins.  Returns the socket, or
 * -1 with err saying what failed and what to do ("port 9464 on 127.0.0.1
 * is in use by another process: stop it or choose another port"). */
int addr_listen(const struct addr_hostport *a, const char *setting, bool *is_v6, char *err, size_t errlen);

/*
 * What a TCP connect to host:port (or, with unix_path, to that socket)
 * meets now, in words: "connection refused", "timed out", "no route to
 * host", "host not found: ...", or "accepted" when it connects.  For log
 * lines: rabbitmq-c and MariaDB Connector/C both connect without blocking
 * and lose the socket's own error (they report "a socket error occurred"
 * and errno 115, EINPROGRESS), so a failed connect is tried once more here
 * to find out why.  Waits at most timeout_ms.
 */
void addr_probe(const char *host, int port, const char *unix_path, int timeout_ms, char *buf, size_t cap);

#endif
