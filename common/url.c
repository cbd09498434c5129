/*
 * url.c - the amqp:// and mysql:// URLs of the configuration, one node or
 * a comma-separated list of a cluster's nodes, into struct cfg_amqp and
 * struct cfg_db (see url.h).
 *
 * Why it is shaped so:
 * - addr.c splits a URL by its shape; what each scheme needs (a host, a
 *   user, a database name, which options) is decided here, so the shape
 *   rules that keep passwords out of logs are written once.
 * - Errors never echo the URL: one that failed to parse cannot be trusted
 *   to show where its password is.  Option names are echoed (cut, printable
 *   ASCII only); option values never are.
 * - A list is split at commas first (a comma never occurs unescaped in one
 *   of our URLs) and each node parsed on its own, by one loop for both
 *   kinds (url_list), so a bad node is named by its place the same way.
 */
#include "url.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "addr.h"

#define URL_ECHO_MAX ADDR_ECHO_MAX /* bytes of an option name quoted back */
#define URL_REASON_MAX 256

/* A NUL-terminated copy of s[0..n); the caller frees it. */
static char *dup_range(const char *s, size_t n)
{
	char *p = malloc(n + 1);

	if (p != NULL) {
		memcpy(p, s, n);
		p[n] = '\0';
	}
	return p;
}

void url_amqp_free(struct cfg_amqp *a)
{
	if (a == NULL)
		return;
	free(a->host);
	free(a->user);
	free(a->password);
	free(a->vhost);
	free(a->cacertfile);
	free(a->certfile);
	free(a->keyfile);
	free(a->sni);
	free(a->redacted);
	if (a->next != NULL) {
		url_amqp_free(a->next);
		free(a->next);
	}
	memset(a, 0, sizeof *a);
}

/* A DNS name as SNI carries it (RFC 6066: no IP literals, no trailing
 * dot); kept strict so that nothing odd reaches the ClientHello. */
static bool sni_name_ok(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > 253 || s[0] == '.' || s[n - 1] == '.' || strspn(s, "0123456789.") == n)
		return false;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
		      c == '.'))
			return false;
	}
	return true;
}

/* One name=value of a query: the name (name_len bytes) and the value as
 * written, still percent-encoded (value_len bytes); ctx is the caller's.
 * 0, or -1 with err set. */
typedef int url_option_fn(void *ctx, const char *name, size_t name_len, const char *value, size_t value_len,
                          char *err, size_t errlen);

/* The name=value pairs of a query, separated by '&', each handed to fn.  An
 * empty pair, or one without '=', is refused here for both kinds; what a
 * name means, and when its value is decoded, is fn's. */
static int url_query(const char *q, size_t n, url_option_fn *fn, void *ctx, char *err, size_t errlen)
{
	const char *end = q + n;

	while (q < end) {
		const char *amp = memchr(q, '&', (size_t)(end - q));
		const char *seg_end = amp != NULL ? amp : end;
		const char *eq = memchr(q, '=', (size_t)(seg_end - q));

		if (seg_end == q) {
			addr_errf(err, errlen, "bad URL: empty option");
			return -1;
		}
		if (eq == NULL) {
			char nm[URL_ECHO_MAX + 4], shown[URL_ECHO_MAX + 4];
			size_t len = (size_t)(seg_end - q);

			snprintf(nm, sizeof nm, "%.*s", (int)(len < URL_ECHO_MAX ? len : URL_ECHO_MAX), q);
			addr_echo(shown, sizeof shown, nm);
			addr_errf(err, errlen, "bad URL: option '%s' needs a value (name=value)", shown);
			return -1;
		}
		if (fn(ctx, q, (size_t)(eq - q), eq + 1, (size_t)(seg_end - eq - 1), err, errlen) != 0)
			return -1;
		q = amp != NULL ? amp + 1 : end;
	}
	return 0;
}

/*
 * An option of an amqps:// URL: RabbitMQ's URI spec names.
 * server_name_indication replaces the URL's host in the ClientHello and, as
 * in that spec (Erlang's ssl), in the certificate's host name check (mq.c).
 * The name is checked before the value is decoded.
 */
static int amqp_option(void *ctx, const char *name, size_t len, const char *raw, size_t raw_len, char *err,
                       size_t errlen)
{
	struct cfg_amqp *a = ctx;
	char nm[URL_ECHO_MAX + 4], shown[URL_ECHO_MAX + 4];
	char **path = NULL;
	char *value = NULL;

	snprintf(nm, sizeof nm, "%.*s", (int)(len < URL_ECHO_MAX ? len : URL_ECHO_MAX), name);
	addr_echo(shown, sizeof shown, nm);
	if (strcmp(nm, "cacertfile") == 0)
		path = &a->cacertfile;
	else if (strcmp(nm, "certfile") == 0)
		path = &a->certfile;
	else if (strcmp(nm, "keyfile") == 0)
		path = &a->keyfile;
	else if (strcmp(nm, "server_name_indication") == 0)
		path = &a->sni;
	else if (strcmp(nm, "verify") != 0 || len > URL_ECHO_MAX) {
		addr_errf(err, errlen, "bad URL: unknown option '%s' "
		        "(known: cacertfile, certfile, keyfile, verify, server_name_indication)", shown);
		return -1;
	}
	if (!a->tls) {
		addr_errf(err, errlen, "bad URL: TLS options need amqps://");
		return -1;
	}
	if (addr_url_decode(raw, raw_len, "option value", &value, err, errlen) != 0)
		return -1;
	if (path == NULL) {
		bool peer = strcmp(value, "verify_peer") == 0;

		if (!peer && strcmp(value, "verify_none") != 0) {
			free(value);
			addr_errf(err, errlen, "bad URL: verify must be verify_peer or verify_none");
			return -1;
		}
		a->tls_verify = peer;
		free(value);
	} else if (path == &a->sni && !sni_name_ok(value)) {
		free(value);
		addr_errf(err, errlen, "bad URL: server_name_indication must be a DNS name "
		        "(letters, digits, '-' and '.', at most 253)");
		return -1;
	} else if (value[0] == '\0') {
		free(value);
		addr_errf(err, errlen, "bad URL: %s needs a path", nm);
		return -1;
	} else {
		free(*path);
		*path = value;
	}
	return 0;
}

static int amqp_options(struct cfg_amqp *a, const char *q, size_t n, char *err, size_t errlen)
{
	if (url_query(q, n, amqp_option, a, err, errlen) != 0)
		return -1;
	if ((a->certfile == NULL) != (a->keyfile == NULL)) {
		addr_errf(err, errlen, "bad URL: certfile and keyfile go together");
		return -1;
	}
	return 0;
}

static int amqp_parse_one(const char *url, struct cfg_amqp *out, char *err, size_t errlen)
{
	static const char *const schemes[] = { "amqp://", "amqps://", NULL };
	struct cfg_amqp a = { 0 };
	struct addr_url v;
	size_t scheme_len;
	int scheme;

	memset(out, 0, sizeof *out);
	scheme = addr_url_scheme(url, schemes, "amqp:// or amqps://", &scheme_len, err, errlen);
	if (scheme < 0)
		return -1;
	a.tls = scheme == 1;
	a.tls_verify = a.tls;
	a.port = a.tls ? 5671 : 5672;
	if (addr_url_split(url, scheme_len, &v, err, errlen) != 0 ||
	    addr_url_port(&v, &a.port, err, errlen) != 0)
		return -1;
	if (v.host_len == 0) {
		addr_errf(err, errlen, "bad URL: missing host");
		return -1;
	}
	if (v.has_query && amqp_options(&a, v.query, v.query_len, err, errlen) != 0)
		goto fail;
	if (v.has_path && memchr(v.path, '/', v.path_len) != NULL) {
		addr_errf(err, errlen, "bad URL: vhost must not contain '/' (write it as %%2f)");
		goto fail;
	}
	/* rabbitmq-c's rules: user and password default to guest each. */
	if (addr_url_decode(v.has_user ? v.user : "guest", v.has_user ? v.user_len : 5,
	               "user name", &a.user, err, errlen) != 0 ||
	    addr_url_decode(v.has_pass ? v.pass : "guest", v.has_pass ? v.pass_len : 5,
	               "password", &a.password, err, errlen) != 0 ||
	    addr_url_decode(v.path_len > 0 ? v.path : "/", v.path_len > 0 ? v.path_len : 1,
	               "vhost", &a.vhost, err, errlen) != 0)
		goto fail;
	if (strlen(a.vhost) > 255) {
		addr_errf(err, errlen, "bad URL: vhost longer than 255 bytes");
		goto fail;
	}
	a.host = dup_range(v.host, v.host_len);
	a.redacted = addr_url_redact(url, &v);
	if (a.host == NULL || a.redacted == NULL) {
		addr_errf(err, errlen, "out of memory");
		goto fail;
	}
	*out = a;
	return 0;
fail:
	url_amqp_free(&a);
	return -1;
}

/* Alike url_amqp_free in shape only: one free a string of another struct. */
void url_db_free(struct cfg_db *d)
{
	if (d == NULL)
		return;
	free(d->host);
	free(d->user);
	free(d->password);
	free(d->database);
	free(d->socket);
	free(d->ssl_ca);
	free(d->ssl_capath);
	free(d->ssl_cert);
	free(d->ssl_key);
	free(d->redacted);
	if (d->next != NULL) {
		url_db_free(d->next);
		free(d->next);
	}
	memset(d, 0, sizeof *d);
}

static int parse_bool(const char *s, bool *out)
{
	if (strcmp(s, "1") == 0 || strcasecmp(s, "true") == 0) {
		*out = true;
		return 0;
	}
	if (strcmp(s, "0") == 0 || strcasecmp(s, "false") == 0) {
		*out = false;
		return 0;
	}
	return -1;
}

/* The TLS options as written, before they are settled into ssl and
 * ssl_verify: -1 unset, else 0 or 1. */
struct db_tls_opts {
	int ssl, verify;
};

/* One "name=value" of the query.  value is already percent-decoded. */
static int db_option(struct cfg_db *d, struct db_tls_opts *t, const char *name, size_t name_len,
                     const char *value, char *err, size_t errlen)
{
	char shown[URL_ECHO_MAX + 4];
	char nm[URL_ECHO_MAX + 1];
	char reason[URL_REASON_MAX];
	char **path = NULL;
	long t_s;

	snprintf(nm, sizeof nm, "%.*s", (int)(name_len < URL_ECHO_MAX ? name_len : URL_ECHO_MAX),
	         name);
	addr_echo(shown, sizeof shown, nm);
	if (strcmp(nm, "ssl") == 0 || strcmp(nm, "ssl-verify") == 0) {
		bool b;

		if (parse_bool(value, &b) != 0) {
			addr_errf(err, errlen, "bad URL: %s must be 0, 1, true or false", nm);
			return -1;
		}
		*(nm[3] == '\0' ? &t->ssl : &t->verify) = b ? 1 : 0;
		return 0;
	}
	if (strcmp(nm, "connect-timeout") == 0) {
		if (cfg_parse_long(value, 1, 3600, &t_s, reason, sizeof reason) != 0) {
			addr_errf(err, errlen, "bad URL: connect-timeout: %s", reason);
			return -1;
		}
		d->connect_timeout_s = (int)t_s;
		return 0;
	}
	if (strcmp(nm, "ssl-ca") == 0)
		path = &d->ssl_ca;
	else if (strcmp(nm, "ssl-capath") == 0)
		path = &d->ssl_capath;
	else if (strcmp(nm, "ssl-cert") == 0)
		path = &d->ssl_cert;
	else if (strcmp(nm, "ssl-key") == 0)
		path = &d->ssl_key;
	else if (strcmp(nm, "socket") == 0)
		path = &d->socket;
	if (path == NULL || name_len > URL_ECHO_MAX) {
		addr_errf(err, errlen, "bad URL: unknown option '%s' "
		        "(known: ssl, ssl-ca, ssl-capath, ssl-cert, ssl-key, ssl-verify, socket, "
		        "connect-timeout)", shown);
		return -1;
	}
	if (value[0] == '\0') {
		addr_errf(err, errlen, "bad URL: %s needs a path", nm);
		return -1;
	}
	free(*path);
	*path = strdup(value);
	if (*path == NULL) {
		addr_errf(err, errlen, "out of memory");
		return -1;
	}
	return 0;
}

/*
 * Settle TLS from the options as written.  A client that was given a CA,
 * a certificate or a verify flag and still talks in plain text protects
 * nothing while looking as if it did, so any of them turns TLS on; and TLS
 * without verifying the server's certificate stops only a passive
 * listener, so verifying is the default and ssl-verify=0 the way out.
 */
static int db_tls_settle(struct cfg_db *d, const struct db_tls_opts *t, char *err, size_t errlen)
{
	bool files = d->ssl_ca != NULL || d->ssl_capath != NULL || d->ssl_cert != NULL || d->ssl_key != NULL;

	if (t->ssl == 0 && (files || t->verify == 1)) {
		addr_errf(err, errlen, "bad URL: ssl=0 contradicts the other ssl-* options");
		return -1;
	}
	if ((d->ssl_cert == NULL) != (d->ssl_key == NULL)) {
		addr_errf(err, errlen, "bad URL: ssl-cert and ssl-key go together");
		return -1;
	}
	d->ssl = t->ssl == 1 || (t->ssl == -1 && (files || t->verify != -1));
	d->ssl_verify = d->ssl && t->verify != 0;
	return 0;
}

/* The query's state while it is read: the TLS options as written. */
struct db_query {
	struct cfg_db *d;
	struct db_tls_opts t;
};

/* The value is decoded before the name is looked at (db_option). */
static int db_query_option(void *ctx, const char *name, size_t name_len, const char *raw, size_t raw_len,
                           char *err, size_t errlen)
{
	struct db_query *dq = ctx;
	char *value;
	int rc;

	if (addr_url_decode(raw, raw_len, "option value", &value, err, errlen) != 0)
		return -1;
	rc = db_option(dq->d, &dq->t, name, name_len, value, err, errlen);
	free(value);
	return rc;
}

static int db_options(struct cfg_db *d, const char *q, size_t n, char *err, size_t errlen)
{
	struct db_query dq = { d, { -1, -1 } };

	if (url_query(q, n, db_query_option, &dq, err, errlen) != 0)
		return -1;
	return db_tls_settle(d, &dq.t, err, errlen);
}

static int db_parse_one(const char *url, struct cfg_db *out, char *err, size_t errlen)
{
	static const char *const schemes[] = { "mysql://", "mariadb://", NULL };
	struct cfg_db d = { 0 };
	struct addr_url v;
	size_t scheme_len;

	memset(out, 0, sizeof *out);
	if (addr_url_scheme(url, schemes, "mysql:// or mariadb://", &scheme_len, err, errlen) < 0)
		return -1;
	d.port = 3306;
	d.connect_timeout_s = 5;
	if (addr_url_split(url, scheme_len, &v, err, errlen) != 0 ||
	    addr_url_port(&v, &d.port, err, errlen) != 0)
		return -1;
	if (!v.has_user) {
		addr_errf(err, errlen, "bad URL: missing user name (mysql://user:pass@host/db)");
		return -1;
	}
	if (v.path_len == 0) {
		addr_errf(err, errlen, "bad URL: missing database name (mysql://user:pass@host/db)");
		return -1;
	}
	if (addr_url_decode(v.user, v.user_len, "user name", &d.user, err, errlen) != 0 ||
	    addr_url_decode(v.has_pass ? v.pass : "", v.pass_len, "password", &d.password,
	               err, errlen) != 0 ||
	    addr_url_decode(v.path, v.path_len, "database name", &d.database, err, errlen) != 0)
		goto fail;
	{
		size_t n = strlen(d.database);
		bool ok = n >= 1 && n <= 64 &&
		          strspn(d.database, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_$") == n;
		if (!ok) {
			addr_errf(err, errlen,
			        "bad URL: database name must be 1-64 characters of [A-Za-z0-9_$]");
			goto fail;
		}
	}
	if (v.has_query && db_options(&d, v.query, v.query_len, err, errlen) != 0)
		goto fail;
	if (v.host_len == 0 && d.socket == NULL) {
		addr_errf(err, errlen, "bad URL: missing host");
		goto fail;
	}
	/* With ?socket= and no host, the client library wants "localhost". */
	d.host = v.host_len > 0 ? dup_range(v.host, v.host_len) : strdup("localhost");
	d.redacted = addr_url_redact(url, &v);
	if (d.host == NULL || d.redacted == NULL) {
		addr_errf(err, errlen, "out of memory");
		goto fail;
	}
	*out = d;
	return 0;
fail:
	url_db_free(&d);
	return -1;
}

/* ---- lists of nodes ------------------------------------------------------ */
/* ---- lists of nodes ------------------------------------------------------ */

/*
 * The next URL of a comma-separated list of one cluster's nodes, in *one
 * (the caller frees it); *p moves past it and *last says whether it ended
 * the list.  A comma never occurs unescaped in one of our URLs (a password
 * or a path that holds one writes it %2C), so splitting first is safe.
 */
static int list_next(const char **p, int place, char **one, bool *last, char *err, size_t errlen)
{
	const char *comma = strchr(*p, ',');
	size_t len = comma != NULL ? (size_t)(comma - *p) : strlen(*p);

	*one = NULL;
	if (place > URL_MAX_NODES) {
		addr_errf(err, errlen, "more than %d nodes in the list", URL_MAX_NODES);
		return -1;
	}
	if (len == 0 && (comma != NULL || place > 1)) {
		addr_errf(err, errlen, "node %d of the list: empty", place);
		return -1;
	}
	*one = dup_range(*p, len);
	if (*one == NULL) {
		addr_errf(err, errlen, "out of memory");
		return -1;
	}
	*last = comma == NULL;
	*p = comma != NULL ? comma + 1 : *p + len;
	return 0;
}

/* How one kind of node is parsed and how the next one is hung from it. */
struct url_kind {
	int (*parse_one)(const char *url, void *node, char *err, size_t errlen);
	/* calloc the node after node, link it, return it; NULL: no memory */
	void *(*append)(void *node);
};

/* Every node of the list into first and the nodes hung from it; a node's
 * own error is prefixed with its place when there are several.  On error
 * the caller frees what was built (a node that failed was left empty). */
static int url_list(const char *url, void *first, const struct url_kind *k, char *err, size_t errlen)
{
	void *node = first;
	const char *p = url;
	bool many = strchr(url, ',') != NULL, last = false;

	for (int place = 1;; place++) {
		char *one, why[URL_REASON_MAX];
		int rc;

		if (list_next(&p, place, &one, &last, err, errlen) != 0)
			return -1;
		rc = k->parse_one(one, node, why, sizeof why);
		free(one);
		if (rc != 0) {
			if (many)
				addr_errf(err, errlen, "node %d of the list: %s", place, why);
			else
				addr_errf(err, errlen, "%s", why);
			return -1;
		}
		if (last)
			return 0;
		node = k->append(node);
		if (node == NULL) {
			addr_errf(err, errlen, "out of memory");
			return -1;
		}
	}
}

/* The hooks of the two kinds: alike by design, one pair a struct (the
 * loop they serve is written once, url_list). */
static int amqp_parse_node(const char *url, void *node, char *err, size_t errlen)
{
	return amqp_parse_one(url, node, err, errlen);
}

static void *amqp_append(void *node)
{
	struct cfg_amqp *a = node;

	a->next = calloc(1, sizeof *a->next);
	return a->next;
}

static int db_parse_node(const char *url, void *node, char *err, size_t errlen)
{
	return db_parse_one(url, node, err, errlen);
}

static void *db_append(void *node)
{
	struct cfg_db *d = node;

	d->next = calloc(1, sizeof *d->next);
	return d->next;
}

int url_parse_amqp(const char *url, struct cfg_amqp *out, char *err, size_t errlen)
{
	static const struct url_kind kind = { amqp_parse_node, amqp_append };

	memset(out, 0, sizeof *out);
	if (url_list(url, out, &kind, err, errlen) == 0)
		return 0;
	url_amqp_free(out);
	return -1;
}

int url_parse_db(const char *url, struct cfg_db *out, char *err, size_t errlen)
{
	static const struct url_kind kind = { db_parse_node, db_append };

	memset(out, 0, sizeof *out);
	if (url_list(url, out, &kind, err, errlen) == 0)
		return 0;
	url_db_free(out);
	return -1;
}
