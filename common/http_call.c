/*
 * http_call.c - one HTTP request to another service with libcurl, and its
 * answer classified for the outbox (see http_call.h).
 *
 * Why it is shaped so:
 * - The easy handle is reset (curl_easy_reset) and every option set again
 *   on each call: no option of one destination leaks into the next call,
 *   and the reset keeps what a reused handle is for, its open connections
 *   (keep-alive), its DNS cache and its TLS sessions.
 * - Every call is bounded (CURLOPT_TIMEOUT_MS and CURLOPT_CONNECTTIMEOUT_MS,
 *   never curl's "no limit" default) and signal-free (CURLOPT_NOSIGNAL: a
 *   worker thread must not take the process's SIGALRM for its DNS time-out).
 *   Only http and https are spoken, redirects are not followed (the
 *   destination is the operator's, not the server's, to choose), TLS is
 *   always verified, TLS 1.2 at least.
 * - Idempotency-Key: the IETF httpapi draft (draft-ietf-httpapi-
 *   idempotency-key-header, since -01) makes the field an Item Structured
 *   Header (RFC 8941) whose value MUST be a String, so it is sent quoted:
 *   Idempotency-Key: "evt-42", with '"' and '\' escaped by a '\'.  An
 *   sf-string holds printable ASCII only (0x20-0x7e); a key with anything
 *   else is refused before sending rather than altered, so that what the
 *   server deduplicates on is exactly our key.
 * - Classification: every transport failure is HTTP_RETRY, a TLS
 *   certificate that fails verification included.  That one will not heal
 *   by itself, but it heals when the operator (or the server's renewal)
 *   fixes it, and dead-lettering every row meanwhile would turn a
 *   configuration slip into lost deliveries; the error text names it.  A
 *   failure after the request was sent (a reset before the answer) is
 *   retried too: the idempotency key is what makes that safe.  A transfer
 *   that failed after a final status came (a body cut short) is judged by
 *   its status: the server has decided.
 * - No "Expect: 100-continue": curl sends it for large bodies (over 1 KiB
 *   before 7.87, over 1 MiB since) and then waits up to a second for a
 *   "100 Continue" that many servers never send.
 * - The response body is kept up to HTTP_EXCERPT_MAX bytes and the rest
 *   read and dropped: the excerpt is for the dead-letter detail, and no
 *   server decides how much memory we use.
 * - Secrets: a value read from a file is marked, shown as *** by
 *   http_dest_format, and wiped before its memory is freed.  Error texts
 *   never quote a header's value.
 */
#include "http_call.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "addr.h"
#include "config.h"
#include "status.h"

_Static_assert(HTTP_ERROR_MAX >= CURL_ERROR_SIZE, "the result's error holds curl's error buffer");

static const char *const http_schemes[] = { "http://", "https://", NULL };

/* The headers http_call_send sets itself, or that only the transport may:
 * a destination may not send them a second time. */
static const char *const http_reserved[] = {
	"Content-Type", "Content-Length", "Idempotency-Key", "traceparent",
	"Host", "Transfer-Encoding", "Expect", "Connection",
};

/* ---- checks ---------------------------------------------------------------- */

/* RFC 9110 tchar. */
static bool http_is_tchar(unsigned char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static bool http_token_ok(const char *s)
{
	if (s == NULL || s[0] == '\0' || strlen(s) > 128)
		return false;
	for (; *s != '\0'; s++)
		if (!http_is_tchar((unsigned char)*s))
			return false;
	return true;
}

/* A field value: no control character but HTAB, no DEL (a CR or LF would
 * start another header).  Bytes above 0x7e (obs-text) pass. */
static bool http_value_ok(const char *s, size_t len)
{
	if (len > HTTP_HEADER_VALUE_MAX)
		return false;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];

		if ((c < 0x20 && c != '\t') || c == 0x7f)
			return false;
	}
	return true;
}

/* ---- destinations ------------------------------------------------------------ */

static int http_check_url(const char *url, char *err, size_t errlen)
{
	struct addr_url v;
	size_t slen;
	int port = 0;

	if (addr_url_scheme(url, http_schemes, "http:// or https://", &slen, err, errlen) < 0 ||
	    addr_url_split(url, slen, &v, err, errlen) != 0 || addr_url_port(&v, &port, err, errlen) != 0)
		return ST_ERR_INVALID;
	if (v.host_len == 0) {
		addr_errf(err, errlen, "bad URL: missing host");
		return ST_ERR_INVALID;
	}
	return ST_OK;
}

int http_dest_init(struct http_dest *dest, const char *url, enum http_method method, char *err, size_t errlen)
{
	char *copy;
	int rc;

	if (dest == NULL) {
		addr_errf(err, errlen, "no destination");
		return ST_ERR_INVALID;
	}
	memset(dest, 0, sizeof *dest);
	if (method != HTTP_POST && method != HTTP_PUT) {
		addr_errf(err, errlen, "bad method: POST or PUT");
		return ST_ERR_INVALID;
	}
	rc = http_check_url(url, err, errlen);
	if (rc != ST_OK)
		return rc;
	copy = strdup(url);
	if (copy == NULL) {
		addr_errf(err, errlen, "out of memory");
		return ST_ERR_NOMEM;
	}
	dest->url = copy;
	dest->method = method;
	dest->timeout_ms = HTTP_TIMEOUT_DEFAULT_MS;
	dest->connect_timeout_ms = HTTP_CONNECT_TIMEOUT_DEFAULT_MS;
	return ST_OK;
}

/* name and value[0..len) checked and added; value copied. */
static int http_dest_add(struct http_dest *dest, const char *name, const char *value, size_t len, bool secret,
                         char *err, size_t errlen)
{
	char echo[ADDR_ECHO_MAX + 4];
	char *n = NULL, *v = NULL;

	addr_echo(echo, sizeof echo, name);
	if (dest == NULL || dest->url == NULL) {
		addr_errf(err, errlen, "header %s: the destination has no URL", echo);
		return ST_ERR_INVALID;
	}
	if (!http_token_ok(name)) {
		addr_errf(err, errlen, "header \"%s\": a name is 1 to 128 letters, digits or !#$%%&'*+-.^_`|~", echo);
		return ST_ERR_INVALID;
	}
	for (size_t i = 0; i < sizeof http_reserved / sizeof http_reserved[0]; i++) {
		if (strcasecmp(name, http_reserved[i]) == 0) {
			addr_errf(err, errlen, "header %s: set by the call itself, a destination may not", echo);
			return ST_ERR_INVALID;
		}
	}
	for (int i = 0; i < dest->n_headers; i++) {
		if (strcasecmp(name, dest->headers[i].name) == 0) {
			addr_errf(err, errlen, "header %s: given twice", echo);
			return ST_ERR_INVALID;
		}
	}
	if (dest->n_headers >= HTTP_DEST_MAX_HEADERS) {
		addr_errf(err, errlen, "header %s: a destination has at most %d headers", echo, HTTP_DEST_MAX_HEADERS);
		return ST_ERR_INVALID;
	}
	/* Never the value in the message: it may be the secret. */
	if (!http_value_ok(value, len) || memchr(value, '\0', len) != NULL) {
		addr_errf(err, errlen, "header %s: the value holds a control character or is longer than %d bytes",
		          echo, HTTP_HEADER_VALUE_MAX);
		return ST_ERR_INVALID;
	}
	n = strdup(name);
	v = malloc(len + 1);
	if (n == NULL || v == NULL) {
		free(n);
		free(v);
		addr_errf(err, errlen, "out of memory");
		return ST_ERR_NOMEM;
	}
	memcpy(v, value, len);
	v[len] = '\0';
	dest->headers[dest->n_headers].name = n;
	dest->headers[dest->n_headers].value = v;
	dest->headers[dest->n_headers].secret = secret;
	dest->n_headers++;
	return ST_OK;
}

int http_dest_header(struct http_dest *dest, const char *name, const char *value, char *err, size_t errlen)
{
	if (value == NULL) {
		addr_errf(err, errlen, "header without a value");
		return ST_ERR_INVALID;
	}
	return http_dest_add(dest, name, value, strlen(value), false, err, errlen);
}

/* A file's open failure as our code, with what to do. */
static int http_open_error(const char *what, const char *path, int e, char *err, size_t errlen)
{
	char echo[ADDR_ECHO_MAX + 4];

	addr_echo(echo, sizeof echo, path);
	addr_errf(err, errlen, "%s %s: %s", what, echo, strerror(e));
	return e == ENOENT ? ST_ERR_NOT_FOUND : ST_ERR_IO;
}

int http_dest_header_file(struct http_dest *dest, const char *name, const char *path, char *err, size_t errlen)
{
	/* One byte more than a value may hold, and two for "\r\n": a longer
	 * file is refused, not cut. */
	char *buf = NULL;
	size_t cap = HTTP_HEADER_VALUE_MAX + 3, n;
	FILE *f = NULL;
	int rc;

	if (path == NULL) {
		addr_errf(err, errlen, "header file: no path");
		return ST_ERR_INVALID;
	}
	buf = malloc(cap);
	if (buf == NULL) {
		addr_errf(err, errlen, "out of memory");
		return ST_ERR_NOMEM;
	}
	f = fopen(path, "r");
	if (f == NULL) {
		rc = http_open_error("header file", path, errno, err, errlen);
		goto cleanup;
	}
	n = fread(buf, 1, cap, f);
	if (ferror(f)) {
		rc = http_open_error("header file", path, errno, err, errlen);
		goto cleanup;
	}
	if (n == cap) {
		addr_errf(err, errlen, "header file: longer than %d bytes", HTTP_HEADER_VALUE_MAX);
		rc = ST_ERR_INVALID;
		goto cleanup;
	}
	/* One trailing newline is how editors and `echo` end a file; any other
	 * line break is refused by the value check. */
	if (n > 0 && buf[n - 1] == '\n')
		n--;
	if (n > 0 && buf[n - 1] == '\r')
		n--;
	if (n == 0) {
		addr_errf(err, errlen, "header file: empty");
		rc = ST_ERR_INVALID;
		goto cleanup;
	}
	rc = http_dest_add(dest, name, buf, n, true, err, errlen);
cleanup:
	if (f != NULL)
		(void)fclose(f); /* read-only: a failed close loses nothing read */
	explicit_bzero(buf, cap);
	free(buf);
	return rc;
}

int http_dest_ca_file(struct http_dest *dest, const char *path, char *err, size_t errlen)
{
	FILE *f;
	char *copy;

	if (dest == NULL || dest->url == NULL || path == NULL || path[0] == '\0') {
		addr_errf(err, errlen, "CA file: no destination or no path");
		return ST_ERR_INVALID;
	}
	/* Readable now, so that a typo is found when the configuration is
	 * read rather than as every call's TLS error. */
	f = fopen(path, "r");
	if (f == NULL)
		return http_open_error("CA file", path, errno, err, errlen);
	if (fclose(f) != 0)
		return http_open_error("CA file", path, errno, err, errlen);
	copy = strdup(path);
	if (copy == NULL) {
		addr_errf(err, errlen, "out of memory");
		return ST_ERR_NOMEM;
	}
	free(dest->ca_file);
	dest->ca_file = copy;
	return ST_OK;
}

int http_dest_timeouts(struct http_dest *dest, long timeout_ms, long connect_timeout_ms, char *err, size_t errlen)
{
	if (dest == NULL) {
		addr_errf(err, errlen, "no destination");
		return ST_ERR_INVALID;
	}
	if (connect_timeout_ms < 1 || connect_timeout_ms > timeout_ms || timeout_ms > HTTP_TIMEOUT_MAX_MS) {
		addr_errf(err, errlen, "time-outs: 1 <= connect (%ld ms) <= whole call (%ld ms) <= %ld ms",
		          connect_timeout_ms, timeout_ms, HTTP_TIMEOUT_MAX_MS);
		return ST_ERR_INVALID;
	}
	dest->timeout_ms = timeout_ms;
	dest->connect_timeout_ms = connect_timeout_ms;
	return ST_OK;
}

void http_dest_free(struct http_dest *dest)
{
	if (dest == NULL)
		return;
	for (int i = 0; i < dest->n_headers; i++) {
		if (dest->headers[i].secret)
			explicit_bzero(dest->headers[i].value, strlen(dest->headers[i].value));
		free(dest->headers[i].name);
		free(dest->headers[i].value);
	}
	free(dest->url);
	free(dest->ca_file);
	memset(dest, 0, sizeof *dest);
}

/* snprintf into a buffer that counts what it would have needed. */
struct http_fmt {
	char *buf;
	size_t cap, len;
};

__attribute__((format(printf, 2, 3)))
static void http_put(struct http_fmt *f, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(f->len < f->cap ? f->buf + f->len : NULL, f->len < f->cap ? f->cap - f->len : 0, fmt, ap);
	va_end(ap);
	if (n > 0)
		f->len += (size_t)n;
}

/* The URL with its password and its query as ***. */
static void http_put_url(struct http_fmt *f, const char *url)
{
	struct addr_url v;
	const char *p = url, *end;
	size_t slen;

	if (url == NULL || addr_url_scheme(url, http_schemes, "", &slen, NULL, 0) < 0 ||
	    addr_url_split(url, slen, &v, NULL, 0) != 0) {
		http_put(f, "(no valid URL)");
		return;
	}
	end = v.has_query ? v.query - 1 : url + strlen(url);
	if (v.has_pass) {
		http_put(f, "%.*s***", (int)(v.pass - url), url);
		p = v.pass + v.pass_len;
	}
	http_put(f, "%.*s", (int)(end - p), p);
	if (v.has_query)
		http_put(f, "?***");
}

int http_dest_format(const struct http_dest *dest, char *buf, size_t cap)
{
	struct http_fmt f = { .buf = buf, .cap = cap };

	if (buf != NULL && cap > 0)
		buf[0] = '\0';
	if (buf == NULL)
		f.cap = 0;
	if (dest == NULL) {
		http_put(&f, "(no destination)");
		return (int)f.len;
	}
	http_put(&f, "%s ", dest->method == HTTP_PUT ? "PUT" : "POST");
	http_put_url(&f, dest->url);
	for (int i = 0; i < dest->n_headers; i++)
		http_put(&f, "%s%s: %s", i == 0 ? " headers=[" : ", ", dest->headers[i].name,
		         dest->headers[i].secret ? "***" : dest->headers[i].value);
	if (dest->n_headers > 0)
		http_put(&f, "]");
	if (dest->ca_file != NULL)
		http_put(&f, " ca=%s", dest->ca_file);
	http_put(&f, " timeout_ms=%ld connect_timeout_ms=%ld", dest->timeout_ms, dest->connect_timeout_ms);
	return f.len > (size_t)INT32_MAX ? INT32_MAX : (int)f.len;
}

/* ---- the client ---------------------------------------------------------------- */

struct http_client {
	CURL *h;
	char errbuf[CURL_ERROR_SIZE];
};

int http_global_init(void)
{
	/* Not thread-safe before curl 7.84: main calls it before any thread. */
	return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? ST_OK : ST_ERR_NOMEM;
}

void http_global_end(void)
{
	curl_global_cleanup();
}

struct http_client *http_client_new(void)
{
	struct http_client *c = calloc(1, sizeof *c);

	if (c == NULL)
		return NULL;
	c->h = curl_easy_init();
	if (c->h == NULL) {
		free(c);
		return NULL;
	}
	return c;
}

void http_client_free(struct http_client **client)
{
	if (client == NULL || *client == NULL)
		return;
	curl_easy_cleanup((*client)->h);
	free(*client);
	*client = NULL;
}

/* ---- one call ---------------------------------------------------------------------- */

/* Longer than any Retry-After we could parse (an IMF-fixdate is 29). */
#define HTTP_RETRY_AFTER_FIELD_MAX 64

/* What the callbacks gather of the answer being read. */
struct http_answer {
	struct http_result *out;
	char retry_after[HTTP_RETRY_AFTER_FIELD_MAX];
	bool has_retry_after;
};

static size_t http_on_body(char *data, size_t size, size_t nmemb, void *userdata)
{
	struct http_answer *a = userdata;
	struct http_result *out = a->out;
	size_t n = size * nmemb, room = HTTP_EXCERPT_MAX - out->excerpt_len;
	size_t take = n < room ? n : room;

	memcpy(out->excerpt + out->excerpt_len, data, take);
	out->excerpt_len += take;
	out->excerpt[out->excerpt_len] = '\0';
	if (take < n)
		out->excerpt_cut = true;
	return n; /* all of it taken: the rest is dropped, not an error */
}

static size_t http_on_header(char *data, size_t size, size_t nitems, void *userdata)
{
	struct http_answer *a = userdata;
	size_t n = size * nitems, k = sizeof "retry-after:" - 1;

	/* Each response's status line starts its headers afresh: a "100
	 * Continue" or a proxy's CONNECT answer says nothing of the final one. */
	if (n >= 5 && memcmp(data, "HTTP/", 5) == 0) {
		a->has_retry_after = false;
		a->retry_after[0] = '\0';
	} else if (n > k && strncasecmp(data, "retry-after:", k) == 0) {
		const char *v = data + k, *end = data + n;

		while (end > v && (end[-1] == '\r' || end[-1] == '\n'))
			end--;
		a->has_retry_after = true;
		/* Too long to be valid: kept as a value that will not parse. */
		if ((size_t)(end - v) >= sizeof a->retry_after)
			snprintf(a->retry_after, sizeof a->retry_after, "(too long)");
		else
			snprintf(a->retry_after, sizeof a->retry_after, "%.*s", (int)(end - v), v);
	}
	return n;
}

static void http_result_reset(struct http_result *out, enum http_outcome outcome)
{
	memset(out, 0, sizeof *out);
	out->outcome = outcome;
	out->retry_after_ms = -1;
}

__attribute__((format(printf, 4, 5)))
static int http_fail(struct http_result *out, enum http_outcome outcome, int rc, const char *fmt, ...)
{
	va_list ap;

	out->outcome = outcome;
	va_start(ap, fmt);
	vsnprintf(out->error, sizeof out->error, fmt, ap);
	va_end(ap);
	return rc;
}

/* "name: value" onto *list; false when out of memory.  curl drops a header
 * written "name:" with nothing after it, and sends "name;" as an empty one. */
static bool http_list_add(struct curl_slist **list, const char *name, const char *value, bool secret)
{
	struct curl_slist *l;
	char *line = NULL;
	int n;

	n = value[0] == '\0' ? asprintf(&line, "%s;", name) : asprintf(&line, "%s: %s", name, value);
	if (n < 0)
		return false;
	l = curl_slist_append(*list, line);
	if (secret)
		explicit_bzero(line, (size_t)n);
	free(line);
	if (l == NULL)
		return false;
	*list = l;
	return true;
}

/* key as an sf-string (RFC 8941 3.3.3) into q; false when it cannot be one. */
static bool http_sf_string(const char *key, char *q, size_t cap)
{
	size_t j = 0, len = strlen(key);

	if (len == 0 || len > HTTP_KEY_MAX || cap < 2 * len + 3)
		return false;
	q[j++] = '"';
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)key[i];

		if (c < 0x20 || c > 0x7e)
			return false;
		if (c == '"' || c == '\\')
			q[j++] = '\\';
		q[j++] = (char)c;
	}
	q[j++] = '"';
	q[j] = '\0';
	return true;
}

/* Set one option, or name it and leave: every setopt's return is read. */
#define HTTP_SET(opt, val)                                         \
	do {                                                       \
		cc = curl_easy_setopt(h, opt, val);                \
		if (cc != CURLE_OK) {                              \
			failed_opt = #opt;                         \
			goto setopt_failed;                        \
		}                                                  \
	} while (0)

int http_call_send(struct http_client *client, const struct http_dest *dest, const void *body, size_t len,
                   const char *content_type, const char *idempotency_key, const char *traceparent,
                   struct http_result *out)
{
	struct http_answer ans = { .out = out };
	struct curl_slist *hdrs = NULL, *l;
	char key[2 * HTTP_KEY_MAX + 3];
	const char *failed_opt = NULL;
	CURLcode cc, perf;
	long status = 0;
	CURL *h;
	int rc = ST_OK;

	if (out == NULL)
		return ST_ERR_INVALID;
	http_result_reset(out, HTTP_REFUSED);
	if (client == NULL || client->h == NULL || dest == NULL || dest->url == NULL)
		return http_fail(out, HTTP_REFUSED, ST_ERR_INVALID, "no client or no destination");
	if (body == NULL && len > 0)
		return http_fail(out, HTTP_REFUSED, ST_ERR_INVALID, "no body");
	if (content_type == NULL || content_type[0] == '\0' || !http_value_ok(content_type, strlen(content_type)))
		return http_fail(out, HTTP_REFUSED, ST_ERR_INVALID, "bad Content-Type");
	if (idempotency_key == NULL || !http_sf_string(idempotency_key, key, sizeof key))
		return http_fail(out, HTTP_REFUSED, ST_ERR_INVALID,
		                 "bad idempotency key: 1 to %d printable ASCII characters", HTTP_KEY_MAX);
	if (traceparent != NULL &&
	    (traceparent[0] == '\0' || strlen(traceparent) > 512 || !http_value_ok(traceparent, strlen(traceparent))))
		return http_fail(out, HTTP_REFUSED, ST_ERR_INVALID, "bad traceparent");

	if (!http_list_add(&hdrs, "Content-Type", content_type, false) ||
	    !http_list_add(&hdrs, "Idempotency-Key", key, false) ||
	    (traceparent != NULL && !http_list_add(&hdrs, "traceparent", traceparent, false))) {
		rc = http_fail(out, HTTP_RETRY, ST_ERR_NOMEM, "out of memory");
		goto cleanup;
	}
	for (int i = 0; i < dest->n_headers; i++) {
		if (!http_list_add(&hdrs, dest->headers[i].name, dest->headers[i].value, dest->headers[i].secret)) {
			rc = http_fail(out, HTTP_RETRY, ST_ERR_NOMEM, "out of memory");
			goto cleanup;
		}
	}
	/* "Expect:" with no value: curl sends no Expect header (see above). */
	l = curl_slist_append(hdrs, "Expect:");
	if (l == NULL) {
		rc = http_fail(out, HTTP_RETRY, ST_ERR_NOMEM, "out of memory");
		goto cleanup;
	}
	hdrs = l;

	h = client->h;
	curl_easy_reset(h);
	client->errbuf[0] = '\0';
	HTTP_SET(CURLOPT_ERRORBUFFER, client->errbuf);
	HTTP_SET(CURLOPT_URL, dest->url);
	HTTP_SET(CURLOPT_NOSIGNAL, 1L);
#if LIBCURL_VERSION_NUM >= 0x075500 /* 7.85.0: the _STR forms; the others deprecated */
	HTTP_SET(CURLOPT_PROTOCOLS_STR, "http,https");
	HTTP_SET(CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
	HTTP_SET(CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
	HTTP_SET(CURLOPT_REDIR_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
	HTTP_SET(CURLOPT_FOLLOWLOCATION, 0L);
	HTTP_SET(CURLOPT_SSL_VERIFYPEER, 1L);
	HTTP_SET(CURLOPT_SSL_VERIFYHOST, 2L);
	HTTP_SET(CURLOPT_SSLVERSION, (long)CURL_SSLVERSION_TLSv1_2);
	if (dest->ca_file != NULL)
		HTTP_SET(CURLOPT_CAINFO, dest->ca_file);
	HTTP_SET(CURLOPT_TIMEOUT_MS, dest->timeout_ms);
	HTTP_SET(CURLOPT_CONNECTTIMEOUT_MS, dest->connect_timeout_ms);
	HTTP_SET(CURLOPT_USERAGENT, "inbox-worker/" INBOX_VERSION);
	HTTP_SET(CURLOPT_POST, 1L);
	/* Never NULL: with no POSTFIELDS curl would read the body from stdin. */
	HTTP_SET(CURLOPT_POSTFIELDS, body != NULL ? body : "");
	HTTP_SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
	if (dest->method == HTTP_PUT)
		HTTP_SET(CURLOPT_CUSTOMREQUEST, "PUT");
	HTTP_SET(CURLOPT_HTTPHEADER, hdrs);
	HTTP_SET(CURLOPT_WRITEFUNCTION, http_on_body);
	HTTP_SET(CURLOPT_WRITEDATA, &ans);
	HTTP_SET(CURLOPT_HEADERFUNCTION, http_on_header);
	HTTP_SET(CURLOPT_HEADERDATA, &ans);

	perf = curl_easy_perform(h);
	cc = curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
	if (cc != CURLE_OK || status < 0 || status > 999)
		status = 0;
	if (perf != CURLE_OK) {
		size_t n = strlen(client->errbuf);

		while (n > 0 && client->errbuf[n - 1] == '\n')
			client->errbuf[--n] = '\0';
		snprintf(out->error, sizeof out->error, "%s", n > 0 ? client->errbuf : curl_easy_strerror(perf));
	}
	/* Only a final status (>= 200) is the server's decision; without one
	 * the transfer failed and is tried again. */
	out->status = (int)status;
	if (perf == CURLE_OK || status >= 200)
		out->outcome = http_classify_status(out->status);
	else
		out->outcome = HTTP_RETRY;
	if (ans.has_retry_after)
		out->retry_after_ms = http_retry_after_ms(ans.retry_after, time(NULL));
	goto cleanup;

setopt_failed:
	/* A libcurl built without what we ask (TLS, say): the operator's to
	 * fix, and the rows wait for it rather than being dead-lettered. */
	rc = http_fail(out, HTTP_RETRY, cc == CURLE_OUT_OF_MEMORY ? ST_ERR_NOMEM : ST_ERR_IO,
	               "libcurl refused %s: %s", failed_opt, curl_easy_strerror(cc));
cleanup:
	curl_slist_free_all(hdrs);
	return rc;
}

#undef HTTP_SET

/* ---- classification, Retry-After, backoff ------------------------------------------- */

enum http_outcome http_classify_status(int status)
{
	if (status >= 200 && status <= 299)
		return HTTP_DELIVERED;
	/* 408 Request Timeout, 425 Too Early, 429 Too Many Requests: the
	 * request was fine, its moment was not.  5xx: the server's fault. */
	if (status == 408 || status == 425 || status == 429 || (status >= 500 && status <= 599))
		return HTTP_RETRY;
	return HTTP_REFUSED;
}

const char *http_outcome_name(enum http_outcome outcome)
{
	switch (outcome) {
	case HTTP_DELIVERED:
		return "delivered";
	case HTTP_RETRY:
		return "retry";
	case HTTP_REFUSED:
		return "refused";
	}
	return "unknown";
}

static const char *const http_wkday[7] = { "Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat" };
static const char *const http_weekday[7] = { "Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday",
                                             "Saturday" };
static const char *const http_month[12] = { "Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec" };

static int http_digits(const char *p, int n)
{
	int v = 0;

	for (int i = 0; i < n; i++) {
		if (p[i] < '0' || p[i] > '9')
			return -1;
		v = v * 10 + (p[i] - '0');
	}
	return v;
}

static int http_month_of(const char *p)
{
	for (int i = 0; i < 12; i++)
		if (memcmp(p, http_month[i], 3) == 0)
			return i;
	return -1;
}

static bool http_wkday_of(const char *p)
{
	for (int i = 0; i < 7; i++)
		if (memcmp(p, http_wkday[i], 3) == 0)
			return true;
	return false;
}

/* "hh:mm:ss" at p into tm; 23:59:60 is a leap second. */
static bool http_hms(const char *p, struct tm *tm)
{
	if (p[2] != ':' || p[5] != ':')
		return false;
	tm->tm_hour = http_digits(p, 2);
	tm->tm_min = http_digits(p + 3, 2);
	tm->tm_sec = http_digits(p + 6, 2);
	return tm->tm_hour >= 0 && tm->tm_hour <= 23 && tm->tm_min >= 0 && tm->tm_min <= 59 && tm->tm_sec >= 0 &&
	       tm->tm_sec <= 60;
}

/* The day exists (timegm would move 31 Feb to March). */
static bool http_day_ok(const struct tm *tm)
{
	static const int days[12] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
	int y = tm->tm_year + 1900, max;

	if (y < 1970 || tm->tm_mon < 0 || tm->tm_mon > 11)
		return false;
	max = days[tm->tm_mon];
	if (tm->tm_mon == 1 && ((y % 4 == 0 && y % 100 != 0) || y % 400 == 0))
		max = 29;
	return tm->tm_mday >= 1 && tm->tm_mday <= max;
}

/*
 * An HTTP-date (RFC 9110 5.6.7), the three forms a recipient must accept,
 * each exactly (the day's name is not checked against the date):
 *   IMF-fixdate  Sun, 06 Nov 1994 08:49:37 GMT
 *   RFC 850      Sunday, 06-Nov-94 08:49:37 GMT   (YY below 70 is 20YY)
 *   asctime      Sun Nov  6 08:49:37 1994
 * (time_t)-1 when s is none of them.
 */
static time_t http_date(const char *s)
{
	size_t len = strlen(s);
	struct tm tm = { 0 };
	const char *p = NULL;

	if (len == 29 && http_wkday_of(s) && memcmp(s + 3, ", ", 2) == 0 && s[7] == ' ' && s[11] == ' ' &&
	    s[16] == ' ' && memcmp(s + 25, " GMT", 4) == 0) {
		tm.tm_mday = http_digits(s + 5, 2);
		tm.tm_mon = http_month_of(s + 8);
		tm.tm_year = http_digits(s + 12, 4) - 1900;
		p = s + 17;
	} else if (len == 24 && http_wkday_of(s) && s[3] == ' ' && s[7] == ' ' && s[10] == ' ' && s[19] == ' ') {
		tm.tm_mon = http_month_of(s + 4);
		tm.tm_mday = s[8] == ' ' ? http_digits(s + 9, 1) : http_digits(s + 8, 2);
		tm.tm_year = http_digits(s + 20, 4) - 1900;
		p = s + 11;
	} else {
		for (int i = 0; i < 7 && p == NULL; i++) {
			size_t w = strlen(http_weekday[i]);
			const char *d = s + w;
			int yy;

			if (len != w + 24 || memcmp(s, http_weekday[i], w) != 0 || memcmp(d, ", ", 2) != 0 ||
			    d[4] != '-' || d[8] != '-' || d[11] != ' ' || memcmp(d + 20, " GMT", 4) != 0)
				continue;
			tm.tm_mday = http_digits(d + 2, 2);
			tm.tm_mon = http_month_of(d + 5);
			yy = http_digits(d + 9, 2);
			tm.tm_year = yy < 0 ? -1 : (yy < 70 ? 100 + yy : yy);
			p = d + 12;
		}
	}
	if (p == NULL || !http_hms(p, &tm) || !http_day_ok(&tm))
		return (time_t)-1;
	return timegm(&tm);
}

long long http_retry_after_ms(const char *value, time_t now)
{
	const long long cap_s = HTTP_RETRY_AFTER_MAX_MS / 1000;
	char s[HTTP_RETRY_AFTER_FIELD_MAX];
	const char *b, *e;
	long long secs = 0;
	time_t t;

	if (value == NULL)
		return -1;
	/* The field's white space around the value is not the value. */
	for (b = value; *b == ' ' || *b == '\t'; b++)
		;
	for (e = b + strlen(b); e > b && (e[-1] == ' ' || e[-1] == '\t'); e--)
		;
	if (e == b || (size_t)(e - b) >= sizeof s)
		return -1;
	memcpy(s, b, (size_t)(e - b));
	s[e - b] = '\0';
	if (s[0] >= '0' && s[0] <= '9') {
		/* delay-seconds = 1*DIGIT, saturated at the cap. */
		for (const char *p = s; *p != '\0'; p++) {
			if (*p < '0' || *p > '9')
				return -1;
			if (secs <= cap_s)
				secs = secs * 10 + (*p - '0');
		}
	} else {
		t = http_date(s);
		if (t == (time_t)-1)
			return -1;
		secs = t > now ? (long long)(t - now) : 0;
	}
	return secs > cap_s ? HTTP_RETRY_AFTER_MAX_MS : secs * 1000;
}

/* splitmix64 (Steele, Lea, Flood 2014): any state, even 0, gives a full
 * period stream; one 64-bit word is all a thread keeps. */
static uint64_t http_splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

long long http_backoff_ms(int attempt, long long base_ms, long long cap_ms, long long retry_after_ms,
                          uint64_t *rng_state)
{
	long long ceiling, v;

	if (cap_ms < 0)
		cap_ms = 0;
	if (base_ms < 0)
		base_ms = 0;
	ceiling = base_ms < cap_ms ? base_ms : cap_ms;
	/* Doubling until the cap: at most 63 rounds whatever attempt is. */
	for (int i = 0; i < attempt && ceiling > 0 && ceiling < cap_ms; i++)
		ceiling = ceiling > cap_ms / 2 ? cap_ms : ceiling * 2;
	/* Full jitter (uniform in [0, ceiling]): clients that failed together
	 * do not come back together.  The modulo's bias is below 2^-40 for
	 * any ceiling under 2^24 ms. */
	if (rng_state == NULL || ceiling == 0)
		v = ceiling;
	else
		v = (long long)(http_splitmix64(rng_state) % ((uint64_t)ceiling + 1));
	/* The server's Retry-After is a floor, within our cap. */
	if (retry_after_ms >= 0 && v < retry_after_ms)
		v = retry_after_ms < cap_ms ? retry_after_ms : cap_ms;
	return v;
}
