/*
 * addr.c - URLs and listening addresses as operators write them, and why a
 * TCP connect fails (see addr.h).
 *
 * Why it is shaped so:
 * - The URL splitter only checks shape; url.c decides what each scheme
 *   needs.  Its rules keep passwords out of logs: an '@' after the host
 *   means a password holds an unencoded '/' or '?', and parsing on would put
 *   part of it in the host or the path.
 * - A listening address is parsed once, here, for both the configuration
 *   check and the server, so a value the check accepts is one the server
 *   binds (issue 12: `localhost:9464` passed the check and then failed).
 *   The server binds its socket itself so that the reason a bind fails
 *   (errno) reaches the operator with what to do about it.
 */
#include "addr.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

void addr_errf(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err == NULL || errlen == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

static bool is_alnum(char c)
{
	return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static int hex_value(char c)
{
	if (is_digit(c))
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

void addr_echo(char *dst, size_t dstlen, const char *s)
{
	size_t n = 0;

	if (s == NULL)
		s = "";
	for (; *s != '\0' && n + 1 < dstlen; s++) {
		if (n == ADDR_ECHO_MAX) {
			snprintf(dst + n, dstlen - n, "...");
			return;
		}
		dst[n++] = (*s >= 0x20 && *s < 0x7f) ? *s : '?';
	}
	dst[n] = '\0';
}

/* ---- URLs --------------------------------------------------------------- */

/*
 * Percent-decode s[0..n) into *out, which the caller frees.  Returns 0, or
 * -1 with a reason naming `what` (never the text itself: it may be a
 * password) and *out NULL.
 */
int addr_url_decode(const char *s, size_t n, const char *what, char **out, char *err, size_t errlen)
{
	char *d = malloc(n + 1);
	size_t j = 0;

	*out = NULL;
	if (d == NULL) {
		addr_errf(err, errlen, "out of memory");
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		if (s[i] != '%') {
			d[j++] = s[i];
			continue;
		}
		int hi = i + 2 < n ? hex_value(s[i + 1]) : -1;
		int lo = hi >= 0 ? hex_value(s[i + 2]) : -1;

		if (hi < 0 || lo < 0) {
			addr_errf(err, errlen, "bad URL: bad percent escape in %s", what);
			free(d);
			return -1;
		}
		if (hi == 0 && lo == 0) {
			addr_errf(err, errlen, "bad URL: %%00 not allowed in %s", what);
			free(d);
			return -1;
		}
		d[j++] = (char)(hi * 16 + lo);
		i += 2;
	}
	d[j] = '\0';
	*out = d;
	return 0;
}


int addr_url_port(const struct addr_url *v, int *port, char *err, size_t errlen)
{
	long p = 0;

	if (!v->has_port)
		return 0;
	if (v->port_len == 0) {
		addr_errf(err, errlen, "bad URL: missing port after ':'");
		return -1;
	}
	for (size_t i = 0; i < v->port_len; i++) {
		if (!is_digit(v->port[i])) {
			addr_errf(err, errlen, "bad URL: port is not a number");
			return -1;
		}
		if (p <= 65535)
			p = p * 10 + (v->port[i] - '0');
	}
	if (p < 1 || p > 65535) {
		addr_errf(err, errlen, "bad URL: port out of range [1, 65535]");
		return -1;
	}
	*port = (int)p;
	return 0;
}

/* Which of schemes (NULL-terminated, each ending in "://") url starts with,
 * case-insensitively: its index, with *len its length; or -1 with err set
 * (want names the accepted schemes). */
int addr_url_scheme(const char *url, const char *const *schemes, const char *want, size_t *len, char *err,
                    size_t errlen)
{
	if (url == NULL || url[0] == '\0') {
		addr_errf(err, errlen, "bad URL: empty");
		return -1;
	}
	for (int i = 0; schemes[i] != NULL; i++) {
		*len = strlen(schemes[i]);
		if (strncasecmp(url, schemes[i], *len) == 0)
			return i;
	}
	addr_errf(err, errlen, "bad URL: scheme must be %s", want);
	return -1;
}

/* The host of the authority [hp, end): "[v6]" or a name, and *colon the
 * ':' before a port (NULL: none).  0, or -1 with err set. */
static int addr_split_host(const char *hp, const char *end, struct addr_url *v, const char **colon, char *err,
                           size_t errlen)
{
	if (*hp == '[') {
		const char *close = memchr(hp, ']', (size_t)(end - hp));

		if (close == NULL) {
			addr_errf(err, errlen, "bad URL: missing ']' after IPv6 address");
			return -1;
		}
		v->host = hp + 1;
		v->host_len = (size_t)(close - hp - 1);
		for (size_t i = 0; i < v->host_len; i++) {
			if (!(hex_value(v->host[i]) >= 0 || v->host[i] == ':' || v->host[i] == '.')) {
				addr_errf(err, errlen, "bad URL: bad IPv6 address");
				return -1;
			}
		}
		if (v->host_len == 0) {
			addr_errf(err, errlen, "bad URL: missing host");
			return -1;
		}
		if (close + 1 != end && close[1] != ':') {
			addr_errf(err, errlen, "bad URL: expected ':' or '/' after ']'");
			return -1;
		}
		*colon = close + 1 != end ? close + 1 : NULL;
	} else {
		const char *c = memchr(hp, ':', (size_t)(end - hp));

		*colon = c;
		v->host = hp;
		v->host_len = (size_t)((c != NULL ? c : end) - hp);
		if (c != NULL && memchr(c + 1, ':', (size_t)(end - c - 1)) != NULL) {
			addr_errf(err, errlen, "bad URL: an IPv6 address must be in brackets: [::1]");
			return -1;
		}
		for (size_t i = 0; i < v->host_len; i++) {
			char h = v->host[i];

			if (!(is_alnum(h) || h == '.' || h == '-' || h == '_')) {
				addr_errf(err, errlen, "bad URL: bad character in host");
				return -1;
			}
		}
	}
	return 0;
}

int addr_url_split(const char *url, size_t scheme_len, struct addr_url *v, char *err, size_t errlen)
{
	const char *p = url + scheme_len;
	const char *auth_end, *at = NULL, *hp, *colon;

	memset(v, 0, sizeof *v);
	for (const char *q = url; *q != '\0'; q++) {
		if ((unsigned char)*q <= 0x20 || *q == 0x7f) {
			addr_errf(err, errlen, "bad URL: contains a space or control character");
			return -1;
		}
	}
	if (strchr(url, '#') != NULL) {
		addr_errf(err, errlen, "bad URL: '#' is not allowed (percent-encode it as %%23)");
		return -1;
	}
	auth_end = p + strcspn(p, "/?");
	/* An '@' past the authority means a user name or password holds an
	 * unencoded '/' or '?'; parsing on would put part of the password in
	 * the host or path, and from there into logs. */
	if (strchr(auth_end, '@') != NULL) {
		addr_errf(err, errlen, "bad URL: '@' after the host "
		        "(percent-encode '/', '?' and '@' in user name and password)");
		return -1;
	}
	for (const char *q = p; q < auth_end; q++)
		if (*q == '@')
			at = q; /* the last one: an unencoded '@' in a password */
	hp = p;
	if (at != NULL) {
		const char *c = memchr(p, ':', (size_t)(at - p));

		v->has_user = true;
		v->user = p;
		v->user_len = (size_t)((c != NULL ? c : at) - p);
		if (c != NULL) {
			v->has_pass = true;
			v->pass = c + 1;
			v->pass_len = (size_t)(at - c - 1);
		}
		if (v->user_len == 0) {
			addr_errf(err, errlen, "bad URL: empty user name");
			return -1;
		}
		hp = at + 1;
	}
	if (addr_split_host(hp, auth_end, v, &colon, err, errlen) != 0)
		return -1;
	if (colon != NULL) {
		v->has_port = true;
		v->port = colon + 1;
		v->port_len = (size_t)(auth_end - colon - 1);
	}
	if (*auth_end == '/') {
		const char *q = strchr(auth_end, '?');

		v->has_path = true;
		v->path = auth_end + 1;
		v->path_len = (size_t)((q != NULL ? q : auth_end + strlen(auth_end)) - v->path);
		auth_end = q != NULL ? q : v->path + v->path_len;
	}
	if (*auth_end == '?') {
		v->has_query = true;
		v->query = auth_end + 1;
		v->query_len = strlen(v->query);
	}
	return 0;
}

/* The URL with its password replaced by "***": safe to log.  The caller
 * frees it; NULL when out of memory. */
char *addr_url_redact(const char *url, const struct addr_url *v)
{
	size_t pre, post, n;
	char *r;

	if (!v->has_pass)
		return strdup(url);
	pre = (size_t)(v->pass - url);
	post = strlen(v->pass + v->pass_len);
	n = pre + 3 + post;
	r = malloc(n + 1);
	if (r == NULL)
		return NULL;
	memcpy(r, url, pre);
	memcpy(r + pre, "***", 3);
	memcpy(r + pre + 3, v->pass + v->pass_len, post + 1);
	return r;
}


/* ---- listening addresses ------------------------------------------------ */

int addr_hostport_parse(const char *s, struct addr_hostport *out, char *err, size_t errlen)
{
	const char *host = s, *host_end, *port;
	char shown[ADDR_ECHO_MAX + 4];
	long p = 0;
	bool ok = true;

	memset(out, 0, sizeof *out);
	if (s == NULL || s[0] == '\0') {
		addr_errf(err, errlen, "bad address: empty");
		return -1;
	}
	if (s[0] == '[') {
		const char *close = strchr(s, ']');

		host = s + 1;
		ok = close != NULL && close > host && close[1] == ':';
		for (const char *q = host; ok && q < close; q++)
			ok = hex_value(*q) >= 0 || *q == ':' || *q == '.' || *q == '%';
		host_end = close;
		port = ok ? close + 2 : NULL;
		out->v6 = true;
	} else {
		const char *colon = strrchr(s, ':');

		ok = colon != NULL && memchr(s, ':', (size_t)(colon - s)) == NULL;
		for (const char *q = s; ok && q < colon; q++)
			ok = is_alnum(*q) || *q == '.' || *q == '-' || *q == '_';
		host_end = colon;
		port = ok ? colon + 1 : NULL;
	}
	if (ok)
		ok = (size_t)(host_end - host) < sizeof out->host && port[0] != '\0' && strlen(port) <= 5;
	for (const char *q = port; ok && *q != '\0'; q++) {
		ok = is_digit(*q);
		p = p * 10 + (*q - '0');
	}
	if (ok)
		ok = p >= 1 && p <= 65535;
	if (!ok) {
		addr_echo(shown, sizeof shown, s);
		addr_errf(err, errlen, "bad address: '%s' (use host:port, :port or [v6]:port, "
		        "e.g. 127.0.0.1:9464, localhost:9464, :9464, [::1]:9464; empty turns it off)", shown);
		return -1;
	}
	memcpy(out->host, host, (size_t)(host_end - host));
	out->host[host_end - host] = '\0';
	out->port = (int)p;
	return 0;
}

/* What to do about a bind that failed with e. */
static const char *addr_remedy(int e)
{
	switch (e) {
	case EADDRINUSE:
		return "is in use by another process (another inbox-worker?): stop it, or choose a free port";
	case EACCES:
		return "needs privileges (ports below 1024): choose a port above 1023";
	case EADDRNOTAVAIL:
		return "is not an address of this machine: use one of its addresses, or :PORT for all";
	default:
		return "cannot be bound";
	}
}

int addr_listen(const struct addr_hostport *a, const char *setting, bool *is_v6, char *err, size_t errlen)
{
	struct addrinfo hints, *res = NULL;
	char port[8], shown[300];
	int rc, fd = -1, last = 0;

	memset(&hints, 0, sizeof hints);
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	/* ":port" is every IPv4 address; "[::]:port" every IPv6 one. */
	hints.ai_family = a->v6 ? AF_INET6 : a->host[0] == '\0' ? AF_INET : AF_UNSPEC;
	snprintf(port, sizeof port, "%d", a->port);
	snprintf(shown, sizeof shown, a->v6 ? "[%s]:%d" : "%s:%d", a->host, a->port);
	rc = getaddrinfo(a->host[0] != '\0' ? a->host : NULL, port, &hints, &res);
	if (rc != 0) {
		addr_errf(err, errlen, "%s: cannot resolve '%s': %s", setting, a->host, gai_strerror(rc));
		return -1;
	}
	for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
		int on = 1;

		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
		if (fd < 0) {
			last = errno;
			continue;
		}
		if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) == 0 &&
		    bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 64) == 0) {
			*is_v6 = ai->ai_family == AF_INET6;
			break;
		}
		last = errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0)
		addr_errf(err, errlen, "%s: port %d on %s %s (%s)", setting, a->port, shown, addr_remedy(last),
		        strerror(last));
	return fd;
}

/* ---- why a connect fails ------------------------------------------------ */

/* The words for a connect's errno, lower case as in a log line. */
static void addr_errno_words(int e, char *buf, size_t cap)
{
	switch (e) {
	case ECONNREFUSED:
		snprintf(buf, cap, "connection refused");
		return;
	case ETIMEDOUT:
		snprintf(buf, cap, "timed out");
		return;
	case EHOSTUNREACH:
		snprintf(buf, cap, "no route to host");
		return;
	case ENETUNREACH:
		snprintf(buf, cap, "network unreachable");
		return;
	case ENOENT:
		snprintf(buf, cap, "no such socket file");
		return;
	default:
		snprintf(buf, cap, "%s", strerror(e));
	}
}

/* One non-blocking connect of fd to sa, waiting at most timeout_ms: 0 when
 * it connected, else the errno (ETIMEDOUT when the time ran out). */
static int addr_try(int fd, const struct sockaddr *sa, socklen_t len, int timeout_ms)
{
	struct pollfd pfd = { .fd = fd, .events = POLLOUT };
	int e = 0, flags = fcntl(fd, F_GETFL);
	socklen_t elen = sizeof e;

	if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
		return errno;
	if (connect(fd, sa, len) == 0)
		return 0;
	if (errno != EINPROGRESS)
		return errno;
	for (;;) {
		int n = poll(&pfd, 1, timeout_ms);

		if (n > 0)
			break;
		if (n == 0)
			return ETIMEDOUT;
		if (errno != EINTR)
			return errno;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &elen) != 0)
		return errno;
	return e;
}

void addr_probe(const char *host, int port, const char *unix_path, int timeout_ms, char *buf, size_t cap)
{
	struct addrinfo hints, *res = NULL;
	char ports[8];
	int rc, e = 0;

	if (unix_path != NULL && unix_path[0] != '\0') {
		struct sockaddr_un sun = { .sun_family = AF_UNIX };
		int fd;

		if (strlen(unix_path) >= sizeof sun.sun_path) {
			snprintf(buf, cap, "socket path too long");
			return;
		}
		memcpy(sun.sun_path, unix_path, strlen(unix_path) + 1);
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		e = fd < 0 ? errno : addr_try(fd, (const struct sockaddr *)&sun, sizeof sun, timeout_ms);
		if (fd >= 0)
			close(fd);
		if (e == 0)
			snprintf(buf, cap, "accepted");
		else
			addr_errno_words(e, buf, cap);
		return;
	}
	memset(&hints, 0, sizeof hints);
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV;
	snprintf(ports, sizeof ports, "%d", port);
	rc = getaddrinfo(host, ports, &hints, &res);
	if (rc != 0) {
		snprintf(buf, cap, "host not found: %s", gai_strerror(rc));
		return;
	}
	/* Every address, as the clients do; the first one that connects
	 * means the server is there now, else the last address's reason. */
	for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);

		e = fd < 0 ? errno : addr_try(fd, ai->ai_addr, ai->ai_addrlen, timeout_ms);
		if (fd >= 0)
			close(fd);
		if (e == 0)
			break;
	}
	freeaddrinfo(res);
	if (e == 0)
		snprintf(buf, cap, "accepted");
	else
		addr_errno_words(e, buf, cap);
}
