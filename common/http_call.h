/*
 * http_call.h - one HTTP request to another service, and what its answer
 * means for the outbox: delivered, retry later, or refused for good.
 *
 * The HTTP half of "calls to other services through the outbox" (issue
 * 45): the outbox's dispatcher will hand a row's body here, keyed by the
 * row's idempotency key, and act on the outcome.  This module decides
 * nothing about rows; it sends, bounds and classifies:
 *
 *   HTTP_DELIVERED  a 2xx
 *   HTTP_RETRY      408, 425, 429, 5xx, and every transport failure
 *                   (refused, DNS, time-out, TLS): the same request, with
 *                   the same key, may succeed later
 *   HTTP_REFUSED    any other status (1xx, 3xx - redirects are never
 *                   followed - and 4xx): dead-letter at once
 *
 * libcurl is the transport; nothing of it shows in this header, so the
 * callers never read a CURLcode (the module boundary of STYLE.md 3).
 *
 * Threads: http_global_init once in main before any thread starts (it is
 * curl_global_init), http_global_end after they are all joined.  A struct
 * http_client belongs to one thread: it is one curl easy handle, reused so
 * that its connections stay open between calls (keep-alive).
 *
 * Ownership: struct http_dest owns its strings (malloc'd by the
 * http_dest_* setters, released by http_dest_free).  http_client_new
 * returns a client http_client_free releases (NULL-safe, clears the
 * caller's pointer).  struct http_result is the caller's, filled in place,
 * and holds no pointers.
 */
#ifndef INBOX_HTTP_CALL_H
#define INBOX_HTTP_CALL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* Extra headers one destination may send. */
#define HTTP_DEST_MAX_HEADERS 16
/* The longest header value we accept, secret files included (a JWT fits). */
#define HTTP_HEADER_VALUE_MAX 8192
/* The longest idempotency key (before quoting). */
#define HTTP_KEY_MAX 255
/* How much of a response body is kept for the dead-letter detail. */
#define HTTP_EXCERPT_MAX 512
/* The room for an error text (libcurl's CURL_ERROR_SIZE). */
#define HTTP_ERROR_MAX 256
/* The largest Retry-After honoured: a server asking for an hour still gets
 * asked again in ten minutes (the backoff's own cap may be lower). */
#define HTTP_RETRY_AFTER_MAX_MS (600LL * 1000)
/* Bounds of the destination's time-outs. */
#define HTTP_TIMEOUT_MAX_MS (600L * 1000)
#define HTTP_TIMEOUT_DEFAULT_MS 10000L
#define HTTP_CONNECT_TIMEOUT_DEFAULT_MS 3000L

enum http_method {
	HTTP_POST,
	HTTP_PUT,
};

struct http_header {
	char *name;
	char *value;
	bool secret; /* read from a file: shown as *** by http_dest_format */
};

/* A destination.  Fill it with the setters, not by hand: they validate
 * (an http:// or https:// URL; header names that are tokens and none of
 * the headers this module sets itself; values without control
 * characters; time-outs within bounds), so http_call_send need not. */
struct http_dest {
	char *url;
	enum http_method method;
	struct http_header headers[HTTP_DEST_MAX_HEADERS];
	int n_headers;
	char *ca_file;           /* NULL: the system's CA store */
	long timeout_ms;         /* the whole request, connect included */
	long connect_timeout_ms; /* the TCP connect and the TLS handshake */
};

/*
 * The dest functions return ST_OK, or ST_ERR_INVALID (a bad value),
 * ST_ERR_IO / ST_ERR_NOT_FOUND (a file that cannot be read) or
 * ST_ERR_NOMEM, with one line in err (never a header's value, never a
 * URL's password; err may be NULL).  On error dest is as it was, but for
 * http_dest_init.
 */
/* Start dest afresh (it need not be initialised): url, method, the
 * default time-outs, no headers, no CA file.  On error dest is zeroed
 * (http_dest_free on it is harmless). */
int http_dest_init(struct http_dest *dest, const char *url, enum http_method method, char *err, size_t errlen);
/* Add a header sent on every request to dest. */
int http_dest_header(struct http_dest *dest, const char *name, const char *value, char *err, size_t errlen);
/* Add a header whose value is the content of the file at path, one
 * trailing newline (\n or \r\n) stripped: a secret (a token, a key) that
 * must not sit in the configuration or the logs. */
int http_dest_header_file(struct http_dest *dest, const char *name, const char *path, char *err, size_t errlen);
/* Verify servers against the CA certificates in path (PEM) instead of the
 * system's store.  The file must be readable now. */
int http_dest_ca_file(struct http_dest *dest, const char *path, char *err, size_t errlen);
/* Set the time-outs: 1 <= connect_timeout_ms <= timeout_ms <=
 * HTTP_TIMEOUT_MAX_MS. */
int http_dest_timeouts(struct http_dest *dest, long timeout_ms, long connect_timeout_ms, char *err, size_t errlen);
/* Release dest's strings and zero it (NULL-safe). */
void http_dest_free(struct http_dest *dest);
/* dest for a log line, into buf:
 *   POST https://host:8443/hook?*** headers=[X-Tenant: acme, Authorization: ***] ca=/etc/ca.pem timeout_ms=10000 connect_timeout_ms=3000
 * A URL's password and its query (where webhook URLs carry their tokens)
 * show as ***, and so does every header read from a file.  Returns the
 * length it needed, like snprintf: a result >= cap means buf was cut. */
int http_dest_format(const struct http_dest *dest, char *buf, size_t cap);

/* Once per process, before any thread: ST_OK or ST_ERR_NOMEM. */
int http_global_init(void);
/* After every client is freed and every thread joined. */
void http_global_end(void);

struct http_client;
/* A client for one thread; NULL when out of memory. */
struct http_client *http_client_new(void);
void http_client_free(struct http_client **client);

enum http_outcome {
	HTTP_DELIVERED,
	HTTP_RETRY,
	HTTP_REFUSED,
};

struct http_result {
	enum http_outcome outcome;
	int status;                    /* the final HTTP status; 0 when none came */
	char error[HTTP_ERROR_MAX];    /* why the transfer failed ("" when it did
	                                * not, or why the call was not made) */
	char excerpt[HTTP_EXCERPT_MAX + 1]; /* the response body's first bytes,
	                                * NUL-terminated; any bytes: escape
	                                * them for a log (the log module does) */
	size_t excerpt_len;
	bool excerpt_cut;              /* the body was longer than the excerpt */
	long long retry_after_ms;      /* Retry-After, capped at
	                                * HTTP_RETRY_AFTER_MAX_MS; -1 when absent
	                                * or unparsable */
};

/*
 * Send body[0..len) to dest with `method url`, the headers
 *   Content-Type: <content_type>
 *   Idempotency-Key: "<idempotency_key>"   (an sf-string, see http_call.c)
 *   traceparent: <traceparent>             (when not NULL)
 * and dest's own, and classify the answer into *out.  Waits at most
 * dest->timeout_ms.  TLS is always verified; only http and https are
 * spoken; redirects are not followed (a 3xx is HTTP_REFUSED).
 *
 * Returns ST_OK when the request was attempted (whatever its outcome);
 * ST_ERR_INVALID when the arguments are refused before anything is sent
 * (outcome HTTP_REFUSED: the same arguments will be refused again: a key
 * that is not 1 to HTTP_KEY_MAX printable ASCII characters, a control
 * character in content_type or traceparent, no body with len > 0);
 * ST_ERR_NOMEM, and ST_ERR_IO when libcurl refuses an option (one built
 * without TLS, say), both with outcome HTTP_RETRY.  *out is always filled
 * (but for out NULL: ST_ERR_INVALID).  A call whose transfer failed after
 * a final status came is judged by that status, out->error set too.
 */
int http_call_send(struct http_client *client, const struct http_dest *dest, const void *body, size_t len,
                   const char *content_type, const char *idempotency_key, const char *traceparent,
                   struct http_result *out);

/* The outcome of a final status received (100..599; others HTTP_REFUSED). */
enum http_outcome http_classify_status(int status);
/* A Retry-After field value in milliseconds from now: delta-seconds or an
 * HTTP-date (a date past is 0), capped at HTTP_RETRY_AFTER_MAX_MS; -1 when
 * value is NULL or not one of those.  now is passed for the tests. */
long long http_retry_after_ms(const char *value, time_t now);
/* The name of an outcome ("delivered", "retry", "refused"), for logs. */
const char *http_outcome_name(enum http_outcome outcome);

/*
 * How long to wait before attempt number `attempt` + 1 (attempt >= 0 is
 * how many attempts have failed before, less one: 0 after the first
 * failure).  Full jitter: uniform in [0, min(cap_ms, base_ms * 2^attempt)],
 * then raised to min(retry_after_ms, cap_ms) when the server sent one
 * (retry_after_ms >= 0).  Always in [0, cap_ms].  The randomness is a
 * splitmix64 stream in *rng_state: the same state gives the same delays
 * (seed it from the CSPRNG or the clock per thread; any value works).
 */
long long http_backoff_ms(int attempt, long long base_ms, long long cap_ms, long long retry_after_ms,
                          uint64_t *rng_state);

#endif
