/*
 * dlq_entry.c - a dead letter read into a struct dlq_entry (see
 * dlq_entry.h): the body as the worker reads it, then our headers, then
 * the broker's x-death.
 */
#include "dlq_entry.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "deadletter.h"
#include "envelope.h"
#include "status.h"


/* Printable ASCII, cut to cap: ids and names from a message end up in one
 * line of output, whatever the producer sent. */
void dlq_entry_text(char *dst, size_t cap, const char *s, size_t len)
{
	size_t n = 0;

	for (size_t i = 0; i < len && n + 1 < cap; i++) {
		unsigned char c = (unsigned char)s[i];
		dst[n++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
	}
	dst[n] = '\0';
}

static const char *dlq_entry_hstr(json_t *headers, const char *key)
{
	json_t *v = json_object_get(headers, key);

	return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool dlq_entry_hint(json_t *headers, const char *key, int64_t *out)
{
	json_t *v = json_object_get(headers, key);
	char *end;

	if (json_is_integer(v)) {
		*out = json_integer_value(v);
		return true;
	}
	if (json_is_string(v)) {
		long long n = strtoll(json_string_value(v), &end, 10);
		if (end != json_string_value(v) && *end == '\0') {
			*out = n;
			return true;
		}
	}
	return false;
}

static void dlq_entry_fmt_time(int64_t s, char *buf, size_t cap)
{
	time_t t = (time_t)s;
	struct tm tm;

	if (gmtime_r(&t, &tm) == NULL || strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
		snprintf(buf, cap, "%lld", (long long)s);
}

/* "2026-11-30T19:40:02Z" (what the worker writes) to seconds; 0 if not. */
static int64_t dlq_entry_parse_time(const char *s)
{
	struct tm tm;
	const char *end;

	memset(&tm, 0, sizeof tm);
	end = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
	if (end == NULL)
		return 0;
	return (int64_t)timegm(&tm);
}

/* The first x-death entry of a message the broker dead-lettered: {"$array":
 * [{"$table": {...}}]} as mq_delivery_props_json writes it. */
static json_t *dlq_entry_xdeath(json_t *headers)
{
	json_t *a = json_object_get(json_object_get(headers, "x-death"), "$array");

	return json_object_get(json_array_get(a, 0), "$table");
}

/* The fields of a body that failed the checks, as far as they can be read,
 * so that a malformed dead letter is still listed by its id and order. */
static void dlq_entry_lenient_fields(struct dlq_entry *e, const void *body, size_t len)
{
	static const struct {
		const char *key;
		size_t off, cap;
	} f[] = {
		{ "message_id", offsetof(struct dlq_entry, message_id), MSG_WIDE_ID_MAX + 1 },
		{ "source", offsetof(struct dlq_entry, source), MSG_WIDE_SOURCE_MAX + 1 },
		{ "type", offsetof(struct dlq_entry, type), MSG_TYPE_NAME_MAX + 1 },
		{ "order_id", offsetof(struct dlq_entry, order_id), MSG_ORDER_ID_MAX + 1 },
	};
	json_error_t jerr;
	json_t *o;

	if (len > (size_t)16 * 1024 * 1024)
		return;
	o = json_loadb(body, len, 0, &jerr);
	if (!json_is_object(o)) {
		json_decref(o);
		return;
	}
	for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
		json_t *v = json_object_get(o, f[i].key);
		char *dst = (char *)e + f[i].off;
		if (json_is_string(v) && dst[0] == '\0')
			dlq_entry_text(dst, f[i].cap, json_string_value(v), json_string_length(v));
	}
	json_decref(o);
}

int dlq_entry_read(const struct cfg *conf, const struct mq_delivery *d, long position, struct dlq_entry *e)
{
	struct env_delivery env;
	char *event = NULL;
	json_t *h, *xd;
	const char *s;
	json_error_t jerr;

	memset(e, 0, sizeof *e);
	e->position = position;
	e->deliveries = -1;
	e->props_text = mq_delivery_props_json(d);
	if (e->props_text == NULL)
		return ST_ERR_NOMEM;
	e->props = json_loads(e->props_text, 0, &jerr);
	if (e->props == NULL)
		return ST_ERR_NOMEM;
	h = json_object_get(e->props, "headers");
	/* Read as the worker reads it (envelope.h): an enveloped dead letter
	 * is judged and listed by its own key. */
	mq_delivery_envelope(d, &env);
	e->parse = env_parse(conf, &env, (size_t)conf->max_body, &e->m, NULL, &event);
	free(event);
	if (e->parse == MSG_REASON_NONE) {
		snprintf(e->message_id, sizeof e->message_id, "%s", e->m.message_id);
		snprintf(e->source, sizeof e->source, "%s", e->m.source);
		snprintf(e->type, sizeof e->type, "%s", e->m.type_name);
		snprintf(e->order_id, sizeof e->order_id, "%s", e->m.order_id);
	} else {
		/* What the envelope could read of a message that failed. */
		snprintf(e->message_id, sizeof e->message_id, "%s", e->m.message_id);
		snprintf(e->source, sizeof e->source, "%s", e->m.source);
		snprintf(e->order_id, sizeof e->order_id, "%s", e->m.order_id);
		if (d->props.message_id != NULL && e->message_id[0] == '\0')
			dlq_entry_text(e->message_id, sizeof e->message_id, d->props.message_id, d->props.message_id_len);
		if (d->props.type != NULL)
			dlq_entry_text(e->type, sizeof e->type, d->props.type, d->props.type_len);
		if (d->len <= (size_t)conf->max_body)
			dlq_entry_lenient_fields(e, d->body, d->len);
	}
	if (e->message_id[0] == '\0')
		snprintf(e->message_id, sizeof e->message_id, "-");
	xd = dlq_entry_xdeath(h);
	s = dlq_entry_hstr(h, DEADLETTER_REASON);
	if (s != NULL) {
		dlq_entry_text(e->reason, sizeof e->reason, s, strlen(s));
	} else if (json_is_string(json_object_get(xd, "reason"))) {
		/* Dead-lettered by the broker: "delivery_limit" is a message
		 * that crashed every worker that took it. */
		s = json_string_value(json_object_get(xd, "reason"));
		dlq_entry_text(e->reason, sizeof e->reason, s, strlen(s));
		for (char *p = e->reason; *p; p++)
			if (*p == '_')
				*p = '-';
	} else {
		snprintf(e->reason, sizeof e->reason, "none");
	}
	s = dlq_entry_hstr(h, DEADLETTER_DETAIL);
	if (s != NULL) {
		dlq_entry_text(e->detail, sizeof e->detail, s, strlen(s));
	} else if (xd != NULL) {
		const char *q = json_string_value(json_object_get(xd, "queue"));
		snprintf(e->detail, sizeof e->detail, "dead-lettered by the broker from %s", q != NULL ? q : "?");
	}
	s = dlq_entry_hstr(h, DEADLETTER_AT);
	if (s != NULL && (e->at_s = dlq_entry_parse_time(s)) != 0) {
		dlq_entry_fmt_time(e->at_s, e->at, sizeof e->at);
	} else {
		json_t *t = json_object_get(json_object_get(xd, "time"), "$timestamp");
		if (json_is_integer(t)) {
			e->at_s = json_integer_value(t);
			dlq_entry_fmt_time(e->at_s, e->at, sizeof e->at);
		}
	}
	if (!dlq_entry_hint(h, DEADLETTER_DELIVERIES, &e->deliveries)) {
		json_t *c = json_object_get(xd, "count");
		if (json_is_integer(c) && json_is_string(json_object_get(xd, "reason")) &&
		    strcmp(json_string_value(json_object_get(xd, "reason")), "delivery_limit") == 0)
			e->deliveries = conf->delivery_limit + 1; /* past the limit */
		else if (json_is_integer(c))
			e->deliveries = json_integer_value(c);
	}
	if (!dlq_entry_hint(h, DEADLETTER_REPLAYS, &e->replays))
		e->replays = 0;
	if (!dlq_entry_hint(h, "x-delivery-count", &e->dlq_count))
		e->dlq_count = 0;
	return ST_OK;
}

void dlq_entry_free(struct dlq_entry *e)
{
	json_decref(e->props);
	free(e->props_text);
	e->props = NULL;
	e->props_text = NULL;
}
