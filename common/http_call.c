/*
 * http_call.c - not written yet: every function fails, so that
 * tests/unit/test_http_call.c can be seen failing first.
 */
#include "http_call.h"

#include <string.h>

#include "status.h"

int http_dest_init(struct http_dest *dest, const char *url, enum http_method method, char *err, size_t errlen)
{
	(void)url; (void)method; (void)err; (void)errlen;
	memset(dest, 0, sizeof *dest);
	return ST_ERR_INVALID;
}

int http_dest_header(struct http_dest *dest, const char *name, const char *value, char *err, size_t errlen)
{
	(void)dest; (void)name; (void)value; (void)err; (void)errlen;
	return ST_ERR_INVALID;
}

int http_dest_header_file(struct http_dest *dest, const char *name, const char *path, char *err, size_t errlen)
{
	(void)dest; (void)name; (void)path; (void)err; (void)errlen;
	return ST_ERR_INVALID;
}

int http_dest_ca_file(struct http_dest *dest, const char *path, char *err, size_t errlen)
{
	(void)dest; (void)path; (void)err; (void)errlen;
	return ST_ERR_INVALID;
}

int http_dest_timeouts(struct http_dest *dest, long timeout_ms, long connect_timeout_ms, char *err, size_t errlen)
{
	(void)dest; (void)timeout_ms; (void)connect_timeout_ms; (void)err; (void)errlen;
	return ST_ERR_INVALID;
}

void http_dest_free(struct http_dest *dest)
{
	(void)dest;
}

int http_dest_format(const struct http_dest *dest, char *buf, size_t cap)
{
	(void)dest;
	if (cap > 0)
		buf[0] = '\0';
	return -1;
}

int http_global_init(void)
{
	return ST_OK;
}

void http_global_end(void)
{
}

struct http_client *http_client_new(void)
{
	return NULL;
}

void http_client_free(struct http_client **client)
{
	(void)client;
}

int http_call_send(struct http_client *client, const struct http_dest *dest, const void *body, size_t len,
                   const char *content_type, const char *idempotency_key, const char *traceparent,
                   struct http_result *out)
{
	(void)client; (void)dest; (void)body; (void)len; (void)content_type; (void)idempotency_key;
	(void)traceparent;
	memset(out, 0, sizeof *out);
	out->outcome = HTTP_REFUSED;
	return ST_ERR_INVALID;
}

enum http_outcome http_classify_status(int status)
{
	(void)status;
	return HTTP_REFUSED;
}

long long http_retry_after_ms(const char *value, time_t now)
{
	(void)value; (void)now;
	return -2;
}

const char *http_outcome_name(enum http_outcome outcome)
{
	(void)outcome;
	return "";
}

long long http_backoff_ms(int attempt, long long base_ms, long long cap_ms, long long retry_after_ms,
                          uint64_t *rng_state)
{
	(void)attempt; (void)base_ms; (void)cap_ms; (void)retry_after_ms; (void)rng_state;
	return -1;
}
