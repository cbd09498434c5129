/*
 * test_http_call.c - an HTTP call to another service and what its answer
 * means (common/http_call.c), against a libmicrohttpd server of this
 * process on 127.0.0.1 and an ephemeral port: what the server receives
 * (the idempotency key as an sf-string, the trace, the type, the body, the
 * destination's headers, a secret read from a file), every class of
 * answer (2xx delivered; 408, 425, 429, 5xx, a closed port, a time-out,
 * TLS against a plain server retried; other 4xx and redirects refused),
 * Retry-After in both forms, and the backoff.  Also the test receiver of
 * loadgen/http_receiver.c, run as a child: one JSON line per request.
 * Nothing leaves 127.0.0.1; no assertion reads a clock.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "http_call.h"
#include "receiver.h"
#include "status.h"

/* ---- the server ---------------------------------------------------------- */

/* What the server saw; "(none)" for a header that did not come. */
struct seen {
	int requests;
	char method[16], path[256], key[512], trace[128], ctype[128], tenant[128], auth[256], expect[64];
	char body[4096];
	size_t body_len;
	unsigned client_port[2]; /* the first request's and the last one's */
};

struct upload {
	char body[4096];
	size_t len;
};

static struct MHD_Daemon *srv;
static int srv_port;
static pthread_mutex_t seen_mu = PTHREAD_MUTEX_INITIALIZER;
static struct seen seen;
/* What /retry-date answers in Retry-After (set by the test before). */
static char retry_date[64];

static void copy_header(struct MHD_Connection *c, const char *name, char *dst, size_t cap)
{
	const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);

	snprintf(dst, cap, "%s", v != NULL ? v : "(none)");
}

static void record(struct MHD_Connection *c, const char *method, const char *url, const struct upload *up)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	unsigned port = 0;

	if (ci != NULL && ci->client_addr->sa_family == AF_INET)
		port = ntohs(((const struct sockaddr_in *)(const void *)ci->client_addr)->sin_port);
	pthread_mutex_lock(&seen_mu);
	if (seen.requests == 0)
		seen.client_port[0] = port;
	seen.client_port[1] = port;
	seen.requests++;
	snprintf(seen.method, sizeof seen.method, "%s", method);
	snprintf(seen.path, sizeof seen.path, "%s", url);
	copy_header(c, "Idempotency-Key", seen.key, sizeof seen.key);
	copy_header(c, "traceparent", seen.trace, sizeof seen.trace);
	copy_header(c, "Content-Type", seen.ctype, sizeof seen.ctype);
	copy_header(c, "X-Tenant", seen.tenant, sizeof seen.tenant);
	copy_header(c, "Authorization", seen.auth, sizeof seen.auth);
	copy_header(c, "Expect", seen.expect, sizeof seen.expect);
	memcpy(seen.body, up->body, up->len);
	seen.body_len = up->len;
	pthread_mutex_unlock(&seen_mu);
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *body, const char *hname,
                             const char *hvalue)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
	enum MHD_Result ret;

	if (r == NULL)
		return MHD_NO;
	if (hname != NULL && MHD_add_response_header(r, hname, hvalue) != MHD_YES) {
		MHD_destroy_response(r);
		return MHD_NO;
	}
	ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

/*
 * /ok            200 "ok"
 * /status/N      N with the body "status N body" (a 3xx: Location: /ok)
 * /long/N        N with 2000 bytes of 'x'
 * /retry/N       429 with Retry-After: N
 * /retry-date    429 with Retry-After: retry_date
 * /sleep         200 after one second
 */
static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *data, size_t *data_size, void **req_cls)
{
	struct upload *up = *req_cls;
	char text[2048];
	int n;

	(void)cls; (void)version;
	if (up == NULL) {
		up = calloc(1, sizeof *up);
		if (up == NULL)
			return MHD_NO;
		*req_cls = up;
		return MHD_YES;
	}
	if (*data_size > 0) {
		size_t take = *data_size < sizeof up->body - up->len ? *data_size : sizeof up->body - up->len;

		memcpy(up->body + up->len, data, take);
		up->len += take;
		*data_size = 0;
		return MHD_YES;
	}
	record(c, method, url, up);
	if (strcmp(url, "/ok") == 0)
		return reply(c, 200, "ok", NULL, NULL);
	if (sscanf(url, "/status/%d", &n) == 1) {
		snprintf(text, sizeof text, "status %d body", n);
		return reply(c, (unsigned)n, text, n >= 300 && n < 400 ? "Location" : NULL, "/ok");
	}
	if (sscanf(url, "/long/%d", &n) == 1) {
		memset(text, 'x', 2000);
		text[2000] = '\0';
		return reply(c, (unsigned)n, text, NULL, NULL);
	}
	if (strncmp(url, "/retry/", 7) == 0)
		return reply(c, 429, "slow down", "Retry-After", url + 7);
	if (strcmp(url, "/retry-date") == 0)
		return reply(c, 429, "slow down", "Retry-After", retry_date);
	if (strcmp(url, "/sleep") == 0) {
		struct timespec ts = { .tv_sec = 1 };

		nanosleep(&ts, NULL);
		return reply(c, 200, "late", NULL, NULL);
	}
	return reply(c, 404, "no such path", NULL, NULL);
}

static void done(void *cls, struct MHD_Connection *c, void **req_cls, enum MHD_RequestTerminationCode why)
{
	(void)cls; (void)c; (void)why;
	free(*req_cls);
	*req_cls = NULL;
}

static void setup(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	const union MHD_DaemonInfo *info;

	/* The calls go to 127.0.0.1 directly, whatever proxy the shell names. */
	unsetenv("http_proxy");
	unsetenv("https_proxy");
	unsetenv("HTTPS_PROXY");
	unsetenv("ALL_PROXY");
	unsetenv("all_proxy");
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(http_global_init(), ST_OK);
	srv = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL, answer, NULL,
	                       MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
	                       MHD_OPTION_NOTIFY_COMPLETED, done, NULL, MHD_OPTION_END);
	cr_assert_not_null(srv);
	info = MHD_get_daemon_info(srv, MHD_DAEMON_INFO_BIND_PORT);
	cr_assert_not_null(info);
	srv_port = info->port;
	cr_assert_gt(srv_port, 0);
}

static void teardown(void)
{
	MHD_stop_daemon(srv);
	srv = NULL;
	http_global_end();
}

TestSuite(http_call, .init = setup, .fini = teardown);

static void dest_for(struct http_dest *d, const char *path)
{
	char url[256], err[256];

	snprintf(url, sizeof url, "http://127.0.0.1:%d%s", srv_port, path);
	cr_assert_eq(http_dest_init(d, url, HTTP_POST, err, sizeof err), ST_OK, "%s", err);
}

/* One POST of a small JSON body to path; the result. */
static struct http_result call_dest(const struct http_dest *d)
{
	struct http_client *cl = http_client_new();
	struct http_result r;

	cr_assert_not_null(cl);
	cr_assert_eq(http_call_send(cl, d, "{}", 2, "application/json", "k-1", NULL, &r), ST_OK, "%s", r.error);
	http_client_free(&cl);
	cr_assert_null(cl);
	return r;
}

static struct http_result call(const char *path)
{
	struct http_dest d;
	struct http_result r;

	dest_for(&d, path);
	r = call_dest(&d);
	http_dest_free(&d);
	return r;
}

/* ---- what is sent ---------------------------------------------------------- */

Test(http_call, a_200_is_delivered_with_key_trace_type_body_and_headers)
{
	const char *tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
	const char *body = "{\"order_id\":\"o-1\",\"amount\":12}";
	struct http_client *cl = http_client_new();
	struct http_dest d;
	struct http_result r;
	char err[256];

	cr_assert_not_null(cl);
	dest_for(&d, "/ok");
	cr_assert_eq(http_dest_header(&d, "X-Tenant", "acme", err, sizeof err), ST_OK, "%s", err);
	cr_assert_eq(http_call_send(cl, &d, body, strlen(body), "application/json", "evt-42:ship", tp, &r), ST_OK);
	cr_assert_eq(r.outcome, HTTP_DELIVERED, "%s", r.error);
	cr_assert_eq(r.status, 200);
	cr_assert_str_eq(r.error, "");
	cr_assert_str_eq(r.excerpt, "ok");
	cr_assert_eq(r.excerpt_len, 2);
	cr_assert_not(r.excerpt_cut);
	cr_assert_eq(r.retry_after_ms, -1);

	cr_assert_eq(seen.requests, 1);
	cr_assert_str_eq(seen.method, "POST");
	cr_assert_str_eq(seen.path, "/ok");
	cr_assert_str_eq(seen.key, "\"evt-42:ship\"", "the key as an sf-string");
	cr_assert_str_eq(seen.trace, tp);
	cr_assert_str_eq(seen.ctype, "application/json");
	cr_assert_str_eq(seen.tenant, "acme");
	cr_assert_str_eq(seen.expect, "(none)", "no 100-continue round trip");
	cr_assert_eq(seen.body_len, strlen(body));
	cr_assert_eq(memcmp(seen.body, body, strlen(body)), 0);
	http_dest_free(&d);
	http_client_free(&cl);
}

Test(http_call, put_is_sent_as_put_and_no_trace_is_no_traceparent)
{
	struct http_client *cl = http_client_new();
	struct http_dest d;
	struct http_result r;
	char url[256], err[256];
	/* Past curl's 100-continue threshold in older versions (1 KiB). */
	static char big[3000];

	memset(big, 'b', sizeof big);
	snprintf(url, sizeof url, "http://127.0.0.1:%d/ok", srv_port);
	cr_assert_eq(http_dest_init(&d, url, HTTP_PUT, err, sizeof err), ST_OK, "%s", err);
	cr_assert_eq(http_call_send(cl, &d, big, sizeof big, "text/plain", "k", NULL, &r), ST_OK);
	cr_assert_eq(r.outcome, HTTP_DELIVERED, "%s", r.error);
	cr_assert_str_eq(seen.method, "PUT");
	cr_assert_str_eq(seen.trace, "(none)");
	cr_assert_str_eq(seen.ctype, "text/plain");
	cr_assert_str_eq(seen.expect, "(none)");
	cr_assert_eq(seen.body_len, sizeof big);
	http_dest_free(&d);
	http_client_free(&cl);
}

Test(http_call, the_key_is_escaped_as_an_sf_string)
{
	struct http_client *cl = http_client_new();
	struct http_dest d;
	struct http_result r;

	dest_for(&d, "/ok");
	cr_assert_eq(http_call_send(cl, &d, "x", 1, "text/plain", "a\"b\\c d", NULL, &r), ST_OK);
	cr_assert_eq(r.outcome, HTTP_DELIVERED, "%s", r.error);
	cr_assert_str_eq(seen.key, "\"a\\\"b\\\\c d\"");
	http_dest_free(&d);
	http_client_free(&cl);
}

Test(http_call, a_key_or_header_that_cannot_be_sent_is_refused_before_sending)
{
	const char *bad_keys[] = { "", "line\nbreak", "tab\tkey", "caf\xc3\xa9" };
	struct http_client *cl = http_client_new();
	struct http_dest d;
	struct http_result r;
	char longkey[HTTP_KEY_MAX + 2];

	dest_for(&d, "/ok");
	for (size_t i = 0; i < sizeof bad_keys / sizeof bad_keys[0]; i++) {
		cr_assert_eq(http_call_send(cl, &d, "x", 1, "text/plain", bad_keys[i], NULL, &r), ST_ERR_INVALID, "%zu", i);
		cr_assert_eq(r.outcome, HTTP_REFUSED);
		cr_assert_eq(r.status, 0);
		cr_assert_neq(r.error[0], '\0');
	}
	memset(longkey, 'k', sizeof longkey - 1);
	longkey[sizeof longkey - 1] = '\0';
	cr_assert_eq(http_call_send(cl, &d, "x", 1, "text/plain", longkey, NULL, &r), ST_ERR_INVALID);
	cr_assert_eq(http_call_send(cl, &d, "x", 1, "text/plain", "k", "00-x\r\nX-Evil: 1", &r), ST_ERR_INVALID);
	cr_assert_eq(http_call_send(cl, &d, "x", 1, "text/\nplain", "k", NULL, &r), ST_ERR_INVALID);
	cr_assert_eq(http_call_send(cl, &d, "x", 1, NULL, "k", NULL, &r), ST_ERR_INVALID);
	cr_assert_eq(http_call_send(cl, &d, NULL, 1, "text/plain", "k", NULL, &r), ST_ERR_INVALID);
	cr_assert_eq(http_call_send(NULL, &d, "x", 1, "text/plain", "k", NULL, &r), ST_ERR_INVALID);
	cr_assert_eq(seen.requests, 0, "nothing reached the server");
	/* An empty body is a body. */
	cr_assert_eq(http_call_send(cl, &d, NULL, 0, "text/plain", "k", NULL, &r), ST_OK);
	cr_assert_eq(r.outcome, HTTP_DELIVERED, "%s", r.error);
	cr_assert_eq(seen.body_len, 0);
	http_dest_free(&d);
	http_client_free(&cl);
}

Test(http_call, a_client_keeps_its_connection_between_calls)
{
	struct http_client *cl = http_client_new();
	struct http_dest d;
	struct http_result r;

	dest_for(&d, "/ok");
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(http_call_send(cl, &d, "x", 1, "text/plain", "k", NULL, &r), ST_OK);
		cr_assert_eq(r.outcome, HTTP_DELIVERED, "%s", r.error);
	}
	cr_assert_eq(seen.requests, 3);
	cr_assert_eq(seen.client_port[0], seen.client_port[1], "one connection, kept alive");
	http_dest_free(&d);
	http_client_free(&cl);
}

/* ---- what the answer means ------------------------------------------------- */

Test(http_call, transient_statuses_are_retried)
{
	const int codes[] = { 500, 502, 503, 504, 429, 408, 425 };

	for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
		char path[64];
		struct http_result r;

		snprintf(path, sizeof path, "/status/%d", codes[i]);
		r = call(path);
		cr_assert_eq(r.outcome, HTTP_RETRY, "%d", codes[i]);
		cr_assert_eq(r.status, codes[i]);
		cr_assert_eq(r.retry_after_ms, -1);
	}
}

Test(http_call, retry_after_in_seconds_is_kept)
{
	struct http_result r = call("/retry/3");

	cr_assert_eq(r.outcome, HTTP_RETRY);
	cr_assert_eq(r.status, 429);
	cr_assert_eq(r.retry_after_ms, 3000);
	cr_assert_str_eq(r.excerpt, "slow down");
}

Test(http_call, retry_after_as_an_http_date_is_parsed)
{
	/* Two minutes ahead of now; the parse itself is pinned with a fixed
	 * clock below, here only that the header reached it. */
	time_t t = time(NULL) + 120;
	struct tm tm;
	struct http_result r;

	cr_assert_not_null(gmtime_r(&t, &tm));
	cr_assert_gt(strftime(retry_date, sizeof retry_date, "%a, %d %b %Y %H:%M:%S GMT", &tm), 0);
	r = call("/retry-date");
	cr_assert_eq(r.outcome, HTTP_RETRY);
	cr_assert_gt(r.retry_after_ms, 60000, "%lld", r.retry_after_ms);
	cr_assert_leq(r.retry_after_ms, 120000, "%lld", r.retry_after_ms);
}

Test(http_call, permanent_statuses_are_refused_with_the_body_kept)
{
	const int codes[] = { 400, 401, 403, 404, 409, 410, 413, 422 };

	for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
		char path[64], want[64];
		struct http_result r;

		snprintf(path, sizeof path, "/status/%d", codes[i]);
		snprintf(want, sizeof want, "status %d body", codes[i]);
		r = call(path);
		cr_assert_eq(r.outcome, HTTP_REFUSED, "%d", codes[i]);
		cr_assert_eq(r.status, codes[i]);
		cr_assert_str_eq(r.excerpt, want);
		cr_assert_str_eq(r.error, "");
	}
}

Test(http_call, a_long_body_is_cut_to_the_excerpt)
{
	struct http_result r = call("/long/422");

	cr_assert_eq(r.outcome, HTTP_REFUSED);
	cr_assert_eq(r.excerpt_len, HTTP_EXCERPT_MAX);
	cr_assert_eq(strlen(r.excerpt), HTTP_EXCERPT_MAX);
	cr_assert(r.excerpt_cut);
}

Test(http_call, redirects_are_not_followed_and_refused)
{
	const int codes[] = { 301, 302, 303, 307, 308 };

	for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
		char path[64];
		struct http_result r;

		snprintf(path, sizeof path, "/status/%d", codes[i]);
		r = call(path);
		cr_assert_eq(r.outcome, HTTP_REFUSED, "%d", codes[i]);
		cr_assert_eq(r.status, codes[i]);
	}
	cr_assert_eq(seen.requests, 5, "no request to /ok: %s", seen.path);
	cr_assert_str_eq(seen.path, "/status/308");
}

Test(http_call, a_closed_port_is_retried_with_the_transport_error)
{
	/* Bound and not listening: a connect is refused, and no other process
	 * can take the port while we hold it. */
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof sa;
	struct http_dest d;
	struct http_result r;
	char url[128], err[256];

	cr_assert_geq(fd, 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
	snprintf(url, sizeof url, "http://127.0.0.1:%d/ok", ntohs(sa.sin_port));
	cr_assert_eq(http_dest_init(&d, url, HTTP_POST, err, sizeof err), ST_OK, "%s", err);
	r = call_dest(&d);
	cr_assert_eq(r.outcome, HTTP_RETRY);
	cr_assert_eq(r.status, 0);
	cr_assert_neq(r.error[0], '\0');
	cr_assert_eq(r.retry_after_ms, -1);
	http_dest_free(&d);
	close(fd);
}

Test(http_call, a_server_slower_than_the_timeout_is_retried)
{
	struct http_dest d;
	struct http_result r;
	char err[256];

	dest_for(&d, "/sleep");
	cr_assert_eq(http_dest_timeouts(&d, 200, 200, err, sizeof err), ST_OK, "%s", err);
	r = call_dest(&d);
	cr_assert_eq(r.outcome, HTTP_RETRY);
	cr_assert_eq(r.status, 0);
	cr_assert_neq(r.error[0], '\0');
	http_dest_free(&d);
}

Test(http_call, tls_against_a_plain_server_is_retried)
{
	struct http_dest d;
	struct http_result r;
	char url[128], err[256];

	snprintf(url, sizeof url, "https://127.0.0.1:%d/ok", srv_port);
	cr_assert_eq(http_dest_init(&d, url, HTTP_POST, err, sizeof err), ST_OK, "%s", err);
	r = call_dest(&d);
	cr_assert_eq(r.outcome, HTTP_RETRY);
	cr_assert_eq(r.status, 0);
	cr_assert_neq(r.error[0], '\0');
	http_dest_free(&d);
}

Test(http_call, a_secret_header_from_a_file_is_sent_and_logged_as_stars)
{
	char path[] = "/tmp/test_http_call_secretXXXXXX";
	int fd = mkstemp(path);
	const char *secret = "Bearer s3cr3t-t0ken\r\n";
	struct http_dest d;
	struct http_result r;
	char err[256], line[1024];
	int n;

	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, secret, strlen(secret)), (ssize_t)strlen(secret));
	cr_assert_eq(close(fd), 0);
	dest_for(&d, "/ok");
	cr_assert_eq(http_dest_header(&d, "X-Tenant", "acme", err, sizeof err), ST_OK, "%s", err);
	cr_assert_eq(http_dest_header_file(&d, "Authorization", path, err, sizeof err), ST_OK, "%s", err);
	cr_assert_eq(unlink(path), 0);
	r = call_dest(&d);
	cr_assert_eq(r.outcome, HTTP_DELIVERED, "%s", r.error);
	cr_assert_str_eq(seen.auth, "Bearer s3cr3t-t0ken", "one trailing newline stripped");

	n = http_dest_format(&d, line, sizeof line);
	cr_assert_gt(n, 0);
	cr_assert_lt(n, (int)sizeof line);
	cr_assert_null(strstr(line, "s3cr3t"), "%s", line);
	cr_assert_not_null(strstr(line, "Authorization: ***"), "%s", line);
	cr_assert_not_null(strstr(line, "X-Tenant: acme"), "%s", line);
	cr_assert_not_null(strstr(line, "POST http://127.0.0.1:"), "%s", line);
	cr_assert_not_null(strstr(line, "timeout_ms=10000"), "%s", line);
	/* Cut short, it still says how much it needed and ends the string. */
	cr_assert_eq(http_dest_format(&d, line, 10), n);
	cr_assert_eq(strlen(line), 9);
	http_dest_free(&d);
}

/* ---- destinations ---------------------------------------------------------- */

Test(http_call, a_destination_is_validated_when_it_is_built)
{
	const char *reserved[] = { "Idempotency-Key", "content-type", "TRACEPARENT", "Content-Length", "Host",
	                           "Transfer-Encoding", "Expect" };
	struct http_dest d;
	char err[256], name[32];

	cr_assert_eq(http_dest_init(&d, "ftp://127.0.0.1/x", HTTP_POST, err, sizeof err), ST_ERR_INVALID);
	cr_assert_eq(http_dest_init(&d, "file:///etc/passwd", HTTP_POST, err, sizeof err), ST_ERR_INVALID);
	cr_assert_eq(http_dest_init(&d, "http://", HTTP_POST, err, sizeof err), ST_ERR_INVALID);
	cr_assert_eq(http_dest_init(&d, "http://h/x y", HTTP_POST, err, sizeof err), ST_ERR_INVALID);
	cr_assert_eq(http_dest_init(&d, NULL, HTTP_POST, err, sizeof err), ST_ERR_INVALID);
	cr_assert_eq(http_dest_init(&d, "http://h/", (enum http_method)7, err, sizeof err), ST_ERR_INVALID);

	cr_assert_eq(http_dest_init(&d, "HTTPS://user:pw@h:8443/hook?code=abc", HTTP_POST, err, sizeof err), ST_OK, "%s", err);
	cr_assert_eq(d.timeout_ms, HTTP_TIMEOUT_DEFAULT_MS);
	cr_assert_eq(d.connect_timeout_ms, HTTP_CONNECT_TIMEOUT_DEFAULT_MS);
	for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
		cr_assert_eq(http_dest_header(&d, reserved[i], "v", err, sizeof err), ST_ERR_INVALID, "%s", reserved[i]);
	cr_assert_eq(http_dest_header(&d, "Bad Name", "v", err, sizeof err), ST_ERR_INVALID);
	cr_assert_eq(http_dest_header(&d, "", "v", err, sizeof err), ST_ERR_INVALID);
	cr_assert_eq(http_dest_header(&d, "X-A", "v\r\nX-Evil: 1", err, sizeof err), ST_ERR_INVALID);
	cr_assert_null(strstr(err, "Evil"), "the value is not echoed: %s", err);
	cr_assert_eq(d.n_headers, 0);
	for (int i = 0; i < HTTP_DEST_MAX_HEADERS; i++) {
		snprintf(name, sizeof name, "X-H%d", i);
		cr_assert_eq(http_dest_header(&d, name, "v", err, sizeof err), ST_OK, "%s", err);
	}
	cr_assert_eq(http_dest_header(&d, "X-One-Too-Many", "v", err, sizeof err), ST_ERR_INVALID);
	cr_assert_eq(d.n_headers, HTTP_DEST_MAX_HEADERS);

	cr_assert_eq(http_dest_timeouts(&d, 0, 0, err, sizeof err), ST_ERR_INVALID);
	cr_assert_eq(http_dest_timeouts(&d, 1000, 2000, err, sizeof err), ST_ERR_INVALID);
	cr_assert_eq(http_dest_timeouts(&d, HTTP_TIMEOUT_MAX_MS + 1, 1000, err, sizeof err), ST_ERR_INVALID);
	cr_assert_eq(http_dest_timeouts(&d, 5000, 1000, err, sizeof err), ST_OK);
	cr_assert_eq(d.timeout_ms, 5000);

	cr_assert_eq(http_dest_header_file(&d, "X-Secret", "/nonexistent/secret", err, sizeof err), ST_ERR_NOT_FOUND);
	cr_assert_eq(http_dest_ca_file(&d, "/nonexistent/ca.pem", err, sizeof err), ST_ERR_NOT_FOUND);
	cr_assert_null(d.ca_file);

	{
		char line[1024];

		cr_assert_lt(http_dest_format(&d, line, sizeof line), (int)sizeof line);
		cr_assert_null(strstr(line, "pw"), "%s", line);
		cr_assert_null(strstr(line, "code=abc"), "%s", line);
		cr_assert_not_null(strstr(line, "/hook?***"), "%s", line);
	}
	http_dest_free(&d);
	cr_assert_null(d.url);
	cr_assert_eq(d.n_headers, 0);
	http_dest_free(&d); /* twice is fine */
	http_dest_free(NULL);
}

Test(http_call, a_secret_file_must_hold_one_line)
{
	char path[] = "/tmp/test_http_call_secretXXXXXX";
	int fd = mkstemp(path);
	struct http_dest d;
	char err[256];

	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, "one\ntwo\n", 8), 8);
	cr_assert_eq(close(fd), 0);
	dest_for(&d, "/ok");
	cr_assert_eq(http_dest_header_file(&d, "Authorization", path, err, sizeof err), ST_ERR_INVALID);
	cr_assert_null(strstr(err, "one"), "%s", err);
	cr_assert_eq(d.n_headers, 0);
	cr_assert_eq(unlink(path), 0);
	http_dest_free(&d);
}

/* ---- the pure parts ---------------------------------------------------------- */

Test(http_call, every_status_has_its_outcome)
{
	for (int s = 0; s < 700; s++) {
		enum http_outcome want = HTTP_REFUSED;

		if (s >= 200 && s <= 299)
			want = HTTP_DELIVERED;
		else if (s == 408 || s == 425 || s == 429 || (s >= 500 && s <= 599))
			want = HTTP_RETRY;
		cr_assert_eq(http_classify_status(s), want, "%d", s);
	}
	cr_assert_str_eq(http_outcome_name(HTTP_DELIVERED), "delivered");
	cr_assert_str_eq(http_outcome_name(HTTP_RETRY), "retry");
	cr_assert_str_eq(http_outcome_name(HTTP_REFUSED), "refused");
	cr_assert_str_eq(http_outcome_name((enum http_outcome)9), "unknown");
}

Test(http_call, retry_after_values)
{
	/* Sun, 06 Nov 1994 08:49:37 GMT (RFC 9110's example). */
	const time_t t = 784111777;

	cr_assert_eq(http_retry_after_ms("3", t), 3000);
	cr_assert_eq(http_retry_after_ms("0", t), 0);
	cr_assert_eq(http_retry_after_ms("120", t), 120000);
	cr_assert_eq(http_retry_after_ms(" 7 ", t), 7000, "white space around the value is not the value");
	cr_assert_eq(http_retry_after_ms("86400", t), HTTP_RETRY_AFTER_MAX_MS);
	cr_assert_eq(http_retry_after_ms("99999999999999999999999", t), HTTP_RETRY_AFTER_MAX_MS);
	cr_assert_eq(http_retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT", t - 10), 10000);
	cr_assert_eq(http_retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT", t), 0);
	cr_assert_eq(http_retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT", t + 50), 0, "a date past is now");
	cr_assert_eq(http_retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT", t - 100000), HTTP_RETRY_AFTER_MAX_MS);
	/* The two obsolete forms a recipient must accept (RFC 9110 5.6.7). */
	cr_assert_eq(http_retry_after_ms("Sunday, 06-Nov-94 08:49:37 GMT", t - 10), 10000);
	cr_assert_eq(http_retry_after_ms("Sun Nov  6 08:49:37 1994", t - 10), 10000);

	cr_assert_eq(http_retry_after_ms(NULL, t), -1);
	cr_assert_eq(http_retry_after_ms("", t), -1);
	cr_assert_eq(http_retry_after_ms("-1", t), -1);
	cr_assert_eq(http_retry_after_ms("+3", t), -1);
	cr_assert_eq(http_retry_after_ms("3.5", t), -1);
	cr_assert_eq(http_retry_after_ms("3s", t), -1);
	cr_assert_eq(http_retry_after_ms("soon", t), -1);
	cr_assert_eq(http_retry_after_ms("Sun, 31 Feb 1994 08:49:37 GMT", t), -1);
	cr_assert_eq(http_retry_after_ms("Sun, 06 Nov 1994 25:49:37 GMT", t), -1);
	cr_assert_eq(http_retry_after_ms("Sun, 06 Nov 1994 08:49:37 PST", t), -1);
}

Test(http_call, backoff_grows_stays_within_the_cap_and_honours_retry_after)
{
	uint64_t rng = 42, again = 42;
	double mean[8] = { 0 };

	for (int a = 0; a < 8; a++) {
		long long ceiling = 100LL << a;

		for (int i = 0; i < 2000; i++) {
			long long v = http_backoff_ms(a, 100, 100000, -1, &rng);

			cr_assert_geq(v, 0);
			cr_assert_leq(v, ceiling, "attempt %d: %lld", a, v);
			mean[a] += (double)v / 2000;
		}
		if (a > 0)
			cr_assert_gt(mean[a], mean[a - 1] * 1.5, "attempt %d: %f after %f", a, mean[a], mean[a - 1]);
	}
	/* Far past the cap, and past any shift. */
	for (int a = 0; a < 200; a += 7) {
		long long v = http_backoff_ms(a, 100, 5000, -1, &rng);

		cr_assert_geq(v, 0);
		cr_assert_leq(v, 5000);
	}
	cr_assert_leq(http_backoff_ms(-3, 100, 5000, -1, &rng), 100);
	/* Retry-After is a floor, itself capped. */
	for (int i = 0; i < 500; i++) {
		cr_assert_geq(http_backoff_ms(0, 100, 60000, 5000, &rng), 5000);
		cr_assert_eq(http_backoff_ms(3, 100, 60000, 1000000, &rng), 60000);
	}
	/* The same state, the same delays. */
	rng = 42;
	for (int i = 0; i < 100; i++)
		cr_assert_eq(http_backoff_ms(i % 10, 50, 30000, -1, &rng), http_backoff_ms(i % 10, 50, 30000, -1, &again));
	/* A cap of 0, a base of 0: never a negative wait. */
	cr_assert_eq(http_backoff_ms(4, 100, 0, 3000, &rng), 0);
	cr_assert_eq(http_backoff_ms(4, 0, 1000, -1, &rng), 0);
}

/* ---- the test receiver (loadgen/http_receiver.c) ---------------------- */

static struct http_result receiver_send(const struct rcv_child *rv, struct http_client *cl, enum http_method m,
                                        const char *path, const char *body, const char *key, const char *tp)
{
	struct http_dest d;
	struct http_result r;
	char url[256], err[256];

	snprintf(url, sizeof url, "http://127.0.0.1:%d%s", rv->port, path);
	cr_assert_eq(http_dest_init(&d, url, m, err, sizeof err), ST_OK, "%s", err);
	cr_assert_eq(http_call_send(cl, &d, body, strlen(body), "application/json", key, tp, &r), ST_OK);
	http_dest_free(&d);
	return r;
}

static const char *jstr(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);

	cr_assert(json_is_string(v), "%s", k);
	return json_string_value(v);
}

TestSuite(http_receiver, .init = setup, .fini = teardown, .timeout = 60);

Test(http_receiver, records_one_line_per_request)
{
	const char *tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
	struct http_client *cl = http_client_new();
	struct rcv_child rv;
	struct http_result r;
	json_t *lines[8];

	rcv_start(&rv, NULL);
	r = receiver_send(&rv, cl, HTTP_POST, "/a", "{\"n\":1}", "key-1", tp);
	cr_assert_eq(r.outcome, HTTP_DELIVERED, "%s", r.error);
	r = receiver_send(&rv, cl, HTTP_PUT, "/b/c", "{\"n\":2}", "key-2", NULL);
	cr_assert_eq(r.outcome, HTTP_DELIVERED, "%s", r.error);
	r = receiver_send(&rv, cl, HTTP_POST, "/a", "caf\xc3\xa9 \"q\"", "key-3", NULL);
	cr_assert_eq(r.outcome, HTTP_DELIVERED, "%s", r.error);
	rcv_stop(&rv);

	cr_assert_eq(rcv_lines(&rv, lines, 8), 3);
	cr_assert_str_eq(jstr(lines[0], "method"), "POST");
	cr_assert_str_eq(jstr(lines[0], "path"), "/a");
	cr_assert_str_eq(jstr(lines[0], "idempotency_key"), "\"key-1\"", "as it came: an sf-string");
	cr_assert_str_eq(jstr(lines[0], "traceparent"), tp);
	cr_assert_str_eq(jstr(lines[0], "body"), "{\"n\":1}");
	cr_assert_eq(json_integer_value(json_object_get(lines[0], "status")), 200);
	cr_assert_str_eq(jstr(lines[1], "method"), "PUT");
	cr_assert_str_eq(jstr(lines[1], "path"), "/b/c");
	cr_assert_str_eq(jstr(lines[1], "idempotency_key"), "\"key-2\"");
	cr_assert(json_is_null(json_object_get(lines[1], "traceparent")));
	cr_assert_str_eq(jstr(lines[2], "body"), "caf\xc3\xa9 \"q\"");
	for (int i = 0; i < 3; i++)
		json_decref(lines[i]);
	http_client_free(&cl);
	cr_assert_eq(unlink(rv.log), 0);
}

/* The promise a real service makes for an Idempotency-Key: the chaos run
 * judges exactly once by it, since a courier killed between the 200 and
 * its own record calls again. */
Test(http_receiver, answers_a_key_again_without_a_second_effect_and_refuses_it_for_another_body)
{
	struct http_client *cl = http_client_new();
	struct rcv_child rv;
	struct http_result r;
	json_t *lines[8];

	rcv_start(&rv, NULL);
	r = receiver_send(&rv, cl, HTTP_POST, "/a", "{\"n\":1}", "key-1", NULL);
	cr_assert_eq(r.outcome, HTTP_DELIVERED, "%s", r.error);
	r = receiver_send(&rv, cl, HTTP_POST, "/a", "{\"n\":1}", "key-1", NULL);
	cr_assert_eq(r.outcome, HTTP_DELIVERED, "the same call again is answered as before: %s", r.error);
	r = receiver_send(&rv, cl, HTTP_POST, "/a", "{\"n\":2}", "key-1", NULL);
	cr_assert_eq(r.outcome, HTTP_REFUSED, "the key reused for another body");
	cr_assert_eq(r.status, 422);
	r = receiver_send(&rv, cl, HTTP_POST, "/a", "{\"n\":2}", "key-2", NULL);
	cr_assert_eq(r.outcome, HTTP_DELIVERED, "%s", r.error);
	rcv_stop(&rv);

	cr_assert_eq(rcv_lines(&rv, lines, 8), 4);
	cr_assert(json_is_false(json_object_get(lines[0], "replay")));
	cr_assert(json_is_true(json_object_get(lines[1], "replay")));
	cr_assert_eq(json_integer_value(json_object_get(lines[1], "status")), 200);
	cr_assert_eq(json_integer_value(json_object_get(lines[2], "status")), 422);
	cr_assert(json_is_false(json_object_get(lines[2], "replay")));
	cr_assert(json_is_false(json_object_get(lines[3], "replay")));
	for (int i = 0; i < 4; i++)
		json_decref(lines[i]);
	http_client_free(&cl);
	cr_assert_eq(unlink(rv.log), 0);
}

Test(http_receiver, refuses_a_seeded_fraction_and_asks_for_patience)
{
	const char *fail_all[] = { "--fail-ratio", "1", NULL };
	const char *slow_all[] = { "--429-ratio", "1", "--retry-after", "7", NULL };
	const char *half[] = { "--fail-ratio", "0.5", "--seed", "7", NULL };
	struct http_client *cl = http_client_new();
	struct rcv_child rv;
	struct http_result r;
	json_t *lines[64];
	char pattern[2][33];
	int retried = 0;

	rcv_start(&rv, fail_all);
	r = receiver_send(&rv, cl, HTTP_POST, "/x", "{}", "k", NULL);
	cr_assert_eq(r.outcome, HTTP_RETRY);
	cr_assert_eq(r.status, 503);
	rcv_stop(&rv);
	cr_assert_eq(rcv_lines(&rv, lines, 64), 1);
	cr_assert_eq(json_integer_value(json_object_get(lines[0], "status")), 503, "refused requests are recorded too");
	json_decref(lines[0]);
	cr_assert_eq(unlink(rv.log), 0);

	rcv_start(&rv, slow_all);
	r = receiver_send(&rv, cl, HTTP_POST, "/x", "{}", "k", NULL);
	cr_assert_eq(r.status, 429);
	cr_assert_eq(r.retry_after_ms, 7000);
	rcv_stop(&rv);
	cr_assert_eq(unlink(rv.log), 0);

	/* The same seed, the same answers in the same order. */
	for (int run = 0; run < 2; run++) {
		rcv_start(&rv, half);
		for (int i = 0; i < 32; i++) {
			r = receiver_send(&rv, cl, HTTP_POST, "/x", "{}", "k", NULL);
			pattern[run][i] = r.outcome == HTTP_DELIVERED ? '.' : 'R';
			retried += r.outcome == HTTP_RETRY;
		}
		pattern[run][32] = '\0';
		rcv_stop(&rv);
		cr_assert_eq(unlink(rv.log), 0);
	}
	cr_assert_str_eq(pattern[0], pattern[1]);
	cr_assert(retried > 0 && retried < 64, "%s", pattern[0]);
	http_client_free(&cl);
}

Test(http_receiver, goes_away_on_sigusr1_and_comes_back)
{
	const char *away[] = { "--away-seconds", "2", NULL };
	struct http_client *cl = http_client_new();
	struct rcv_child rv;
	struct http_result r;
	char line[128];
	int port;

	rcv_start(&rv, away);
	r = receiver_send(&rv, cl, HTTP_POST, "/x", "{}", "k-1", NULL);
	cr_assert_eq(r.outcome, HTTP_DELIVERED, "%s", r.error);
	cr_assert_eq(kill(rv.pid, SIGUSR1), 0);
	cr_assert_not_null(fgets(line, sizeof line, rv.out));
	cr_assert_str_eq(line, "away\n");
	r = receiver_send(&rv, cl, HTTP_POST, "/x", "{}", "k-2", NULL);
	cr_assert_eq(r.outcome, HTTP_RETRY, "refused while away");
	cr_assert_eq(r.status, 0);
	cr_assert_not_null(fgets(line, sizeof line, rv.out));
	cr_assert_eq(sscanf(line, "ready %d", &port), 1, "%s", line);
	cr_assert_eq(port, rv.port, "back on the same port");
	r = receiver_send(&rv, cl, HTTP_POST, "/x", "{}", "k-3", NULL);
	cr_assert_eq(r.outcome, HTTP_DELIVERED, "%s", r.error);
	rcv_stop(&rv);
	{
		json_t *lines[8];

		cr_assert_eq(rcv_lines(&rv, lines, 8), 2);
		cr_assert_str_eq(jstr(lines[1], "idempotency_key"), "\"k-3\"");
		json_decref(lines[0]);
		json_decref(lines[1]);
	}
	cr_assert_eq(unlink(rv.log), 0);
	http_client_free(&cl);
}
