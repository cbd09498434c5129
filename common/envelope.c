/*
 * envelope.c - CloudEvents 1.0 and MassTransit envelopes mapped into our
 * event, and the W3C trace context and correlation id a delivery carries
 * (see envelope.h; the mapping is SPEC.md's, Envelopes).
 *
 * Shape: pick the envelope (env_detect), read its attributes, build the
 * canonical event as a jansson object -- message_id, source, type (ours,
 * through INBOX_TYPE_MAP), order_id (INBOX_ORDER_ID_FIELD), occurred_at,
 * data -- and hand it to msg_parse_event, which validates it with the
 * envelope's rules and hashes it.  The envelope's own checks come first
 * (specversion, required attributes present and strings, data that is
 * JSON), each with a detail naming the attribute as the producer wrote it
 * ("CloudEvents attribute 'source' is missing", "header
 * cloudEvents:specversion '0.3' is not 1.0"); msg_parse_event's details
 * use the same names (struct msg_names).
 *
 * A native delivery costs what it cost before: msg_parse on the body, and
 * two header lookups (traceparent, tracestate) that only scan the table
 * when the delivery has headers.  Nothing is allocated for it.
 *
 * Trace context (W3C Trace Context, level 1): an AMQP header traceparent
 * (and tracestate) wins over CloudEvents' distributed-tracing extension
 * attribute; a value that is not a valid traceparent is ignored, as the
 * recommendation says, and the message then has no trace.  A message with
 * a trace gets a span id of its own from OpenSSL's CSPRNG: the parent id
 * of everything it causes, and the span_id of its log lines.
 */
#include "envelope.h"

#include <jansson.h>
#include <openssl/rand.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "aggregate.h"

/* Untrusted values quoted in a detail are cut to this many bytes. */
#define ENV_QUOTE_MAX 48
#define ENV_CT_CE "application/cloudevents+json"
#define ENV_CT_CE_BATCH "application/cloudevents-batch+json"
#define ENV_CT_MT "application/vnd.masstransit+json"
#define ENV_MT_URN "urn:message:"

__attribute__((format(printf, 2, 3)))
static void env_detail(struct msg *out, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(out->detail, sizeof out->detail, fmt, ap);
	va_end(ap);
	/* One printable ASCII line: it goes into an AMQP header and logs. */
	for (char *p = out->detail; *p != '\0'; p++)
		if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e)
			*p = '?';
}

static int qlen(size_t len)
{
	return len > ENV_QUOTE_MAX ? ENV_QUOTE_MAX : (int)len;
}

static const char *qcut(size_t len)
{
	return len > ENV_QUOTE_MAX ? "..." : "";
}

/* ---- trace context ----------------------------------------------------- */

static bool lower_hex(const char *s, size_t n, bool *all_zero)
{
	*all_zero = true;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];

		if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
			return false;
		if (c != '0')
			*all_zero = false;
	}
	return true;
}

/* version-traceid-parentid-flags, lowercase hex; version ff, an all-zero
 * trace or parent id are invalid.  A later version may append fields after
 * a '-' (the recommendation's forward compatibility); 00 may not. */
static bool tp_split(const char *tp, size_t len, char trace[33], char parent[17], char flags[3])
{
	bool zero;

	if (tp == NULL || len < ENV_TRACEPARENT_LEN)
		return false;
	if (!lower_hex(tp, 2, &zero) || memcmp(tp, "ff", 2) == 0 || tp[2] != '-' || tp[35] != '-' || tp[52] != '-')
		return false;
	if (memcmp(tp, "00", 2) == 0 ? len != ENV_TRACEPARENT_LEN : (len > ENV_TRACEPARENT_LEN && tp[55] != '-'))
		return false;
	if (!lower_hex(tp + 3, 32, &zero) || zero)
		return false;
	memcpy(trace, tp + 3, 32);
	trace[32] = '\0';
	if (!lower_hex(tp + 36, 16, &zero) || zero)
		return false;
	if (parent != NULL) {
		memcpy(parent, tp + 36, 16);
		parent[16] = '\0';
	}
	if (!lower_hex(tp + 53, 2, &zero))
		return false;
	memcpy(flags, tp + 53, 2);
	flags[2] = '\0';
	return true;
}

/* A new span id: 8 random bytes, not all zero, as hex. */
static bool new_span(char span[17])
{
	static const char hex[] = "0123456789abcdef";
	unsigned char b[8];

	for (int attempt = 0; attempt < 4; attempt++) {
		bool zero = true;

		if (RAND_bytes(b, sizeof b) != 1)
			return false;
		for (size_t i = 0; i < sizeof b; i++) {
			span[2 * i] = hex[b[i] >> 4];
			span[2 * i + 1] = hex[b[i] & 0xf];
			zero = zero && b[i] == 0;
		}
		span[16] = '\0';
		if (!zero)
			return true;
	}
	return false;
}

bool env_trace_parse(const char *tp, size_t len, struct env_context *ctx)
{
	char trace[33], flags[3], span[17];

	if (!tp_split(tp, len, trace, NULL, flags) || !new_span(span))
		return false;
	memcpy(ctx->trace_id, trace, sizeof trace);
	memcpy(ctx->flags, flags, sizeof flags);
	memcpy(ctx->span_id, span, sizeof span);
	return true;
}

/* tracestate is kept as it came when it is printable ASCII within the
 * recommendation's 512 characters; otherwise dropped (never fatal). */
static void set_tracestate(struct env_context *ctx, const char *s, size_t len)
{
	if (s == NULL || len == 0 || len > ENV_TRACESTATE_MAX || !msg_wide_id_valid(s, len, ENV_TRACESTATE_MAX))
		return;
	memcpy(ctx->tracestate, s, len);
	ctx->tracestate[len] = '\0';
}

/* A correlation id is kept when it is 1..255 printable ASCII (what an AMQP
 * correlation-id property carries back out). */
static bool set_correlation(struct env_context *ctx, const char *s, size_t len)
{
	if (s == NULL || !msg_wide_id_valid(s, len, ENV_CORRELATION_MAX))
		return false;
	memcpy(ctx->correlation_id, s, len);
	ctx->correlation_id[len] = '\0';
	return true;
}

bool env_traceparent(const struct env_context *ctx, char *out, size_t cap)
{
	if (ctx == NULL || ctx->trace_id[0] == '\0' || ctx->span_id[0] == '\0' || cap < ENV_TRACEPARENT_LEN + 1) {
		if (cap > 0)
			out[0] = '\0';
		return false;
	}
	snprintf(out, cap, "00-%s-%s-%s", ctx->trace_id, ctx->span_id, ctx->flags[0] ? ctx->flags : "00");
	return true;
}

char *env_context_json(const struct env_context *ctx)
{
	char tp[ENV_TRACEPARENT_LEN + 1];
	json_t *o;
	char *s = NULL;

	if (ctx == NULL)
		return NULL;
	(void)env_traceparent(ctx, tp, sizeof tp);
	if (tp[0] == '\0' && ctx->correlation_id[0] == '\0')
		return NULL;
	o = json_object();
	if (o == NULL)
		return NULL;
	if ((tp[0] != '\0' && json_object_set_new(o, "traceparent", json_string(tp)) != 0) ||
	    (tp[0] != '\0' && ctx->tracestate[0] != '\0' &&
	     json_object_set_new(o, "tracestate", json_string(ctx->tracestate)) != 0) ||
	    (ctx->correlation_id[0] != '\0' &&
	     json_object_set_new(o, "correlation_id", json_string(ctx->correlation_id)) != 0))
		goto out;
	s = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
out:
	json_decref(o);
	return s;
}

void env_context_from_json(const char *json, struct env_context *ctx)
{
	json_t *o, *v;

	memset(ctx, 0, sizeof *ctx);
	if (json == NULL)
		return;
	o = json_loads(json, 0, NULL);
	if (o == NULL)
		return;
	v = json_object_get(o, "traceparent");
	/* Stored by us: the span id in it is the message's own. */
	if (json_is_string(v) &&
	    tp_split(json_string_value(v), json_string_length(v), ctx->trace_id, ctx->span_id, ctx->flags)) {
		v = json_object_get(o, "tracestate");
		if (json_is_string(v))
			set_tracestate(ctx, json_string_value(v), json_string_length(v));
	} else {
		ctx->trace_id[0] = ctx->span_id[0] = ctx->flags[0] = '\0';
	}
	v = json_object_get(o, "correlation_id");
	if (json_is_string(v))
		(void)set_correlation(ctx, json_string_value(v), json_string_length(v));
	json_decref(o);
}

/* ---- which envelope ---------------------------------------------------- */

/* The media type of a content type (before ';', blanks trimmed) equals
 * want, case-insensitively (RFC 9110). */
static bool media_is(const char *ct, size_t len, const char *want)
{
	size_t n = 0, wl = strlen(want);

	if (ct == NULL)
		return false;
	while (n < len && ct[n] != ';')
		n++;
	while (n > 0 && (ct[n - 1] == ' ' || ct[n - 1] == '\t'))
		n--;
	while (n > 0 && (*ct == ' ' || *ct == '\t')) {
		ct++;
		n--;
	}
	return n == wl && strncasecmp(ct, want, wl) == 0;
}

/* JSON data: application/json, text/json or any +json suffix. */
static bool media_json(const char *ct, size_t len)
{
	size_t n = 0;

	while (n < len && ct[n] != ';')
		n++;
	while (n > 0 && (ct[n - 1] == ' ' || ct[n - 1] == '\t'))
		n--;
	if (media_is(ct, len, "application/json") || media_is(ct, len, "text/json"))
		return true;
	return n >= 5 && strncasecmp(ct + n - 5, "+json", 5) == 0;
}

static enum env_hdr header(const struct env_delivery *d, const char *key, const char **v, size_t *len)
{
	*v = NULL;
	*len = 0;
	if (d->header == NULL)
		return ENV_HDR_ABSENT;
	return d->header(d->header_arg, key, v, len);
}

/* A binary-mode attribute: header cloudEvents:<name>, or
 * cloudEvents_<name> (what AMQP 0-9-1 clients that refuse ':' send). */
static enum env_hdr ce_header(const struct env_delivery *d, const char *name, const char **v, size_t *len,
                              char *key, size_t cap)
{
	static const char prefix[] = "cloudEvents:";
	size_t plen = sizeof prefix - 1, nlen = strlen(name);
	enum env_hdr h;

	/* memcpy, not snprintf: auto asks this of every native delivery. */
	if (d->header == NULL || plen + nlen >= cap) {
		*v = NULL;
		*len = 0;
		return ENV_HDR_ABSENT;
	}
	memcpy(key, prefix, plen);
	memcpy(key + plen, name, nlen + 1);
	h = header(d, key, v, len);
	if (h != ENV_HDR_ABSENT)
		return h;
	key[plen - 1] = '_';
	h = header(d, key, v, len);
	if (h == ENV_HDR_ABSENT)
		key[plen - 1] = ':'; /* named so in a detail */
	return h;
}

enum cfg_envelope env_detect(const struct cfg *conf, const struct env_delivery *d)
{
	const char *v;
	size_t len;
	char key[48];

	if (conf->envelope != CFG_ENVELOPE_AUTO)
		return conf->envelope;
	if (media_is(d->content_type, d->content_type_len, ENV_CT_CE) ||
	    media_is(d->content_type, d->content_type_len, ENV_CT_CE_BATCH))
		return CFG_ENVELOPE_CLOUDEVENTS;
	if (media_is(d->content_type, d->content_type_len, ENV_CT_MT))
		return CFG_ENVELOPE_MASSTRANSIT;
	if (ce_header(d, "specversion", &v, &len, key, sizeof key) != ENV_HDR_ABSENT)
		return CFG_ENVELOPE_CLOUDEVENTS;
	return CFG_ENVELOPE_NATIVE;
}

/* ---- the mapping ------------------------------------------------------- */

/* What an envelope's reader found, before it becomes the canonical event.
 * Strings point into the delivery or into root; json values are borrowed. */
struct env_found {
	const char *id, *source, *type, *time, *subject;
	size_t id_len, source_len, type_len, time_len, subject_len;
	json_t *data;        /* NULL: none */
	json_t *sequence;    /* CloudEvents' sequence extension, as it came (a reference); NULL: none */
	const char *type_key; /* the key INBOX_TYPE_MAP is searched for (MassTransit: without urn:message:) */
	size_t type_key_len;
	bool mt;             /* MassTransit: the type's last ':' segment may be ours */
	struct msg_names names;
};

/* Our type for a producer's: INBOX_TYPE_MAP first, then the name itself
 * if it is ours (for MassTransit, its last ':' segment).  The map was
 * checked by cfg.c: "theirs=Ours" pairs, comma-separated. */
static const char *map_type(const char *map, const char *key, size_t klen, bool mt, size_t *olen)
{
	const char *p = map != NULL ? map : "";

	while (*p != '\0') {
		const char *comma = strchr(p, ',');
		const char *end = comma != NULL ? comma : p + strlen(p);
		const char *eq = memchr(p, '=', (size_t)(end - p));

		if (eq != NULL && (size_t)(eq - p) == klen && memcmp(p, key, klen) == 0) {
			*olen = (size_t)(end - eq - 1);
			return eq + 1;
		}
		p = comma != NULL ? comma + 1 : end;
	}
	if (msg_type_from_name(key, klen) >= 0) {
		*olen = klen;
		return key;
	}
	if (mt) {
		const char *last = key + klen;

		while (last > key && last[-1] != ':')
			last--;
		if (last > key && msg_type_from_name(last, (size_t)(key + klen - last)) >= 0) {
			*olen = (size_t)(key + klen - last);
			return last;
		}
	}
	return NULL;
}

/* The order id by INBOX_ORDER_ID_FIELD: the subject, or a dotted path into
 * the data ("data." in front optional).  NULL when absent. */
static json_t *find_order_id(const char *field, const struct env_found *f, json_t **owned)
{
	json_t *v = f->data;
	const char *p = field;

	*owned = NULL;
	if (strcmp(field, "subject") == 0) {
		if (f->subject == NULL)
			return NULL;
		*owned = json_stringn(f->subject, f->subject_len);
		return *owned != NULL ? *owned : json_null(); /* not UTF-8: msg_check says it is not a string */
	}
	if (strncmp(p, "data.", 5) == 0)
		p += 5;
	while (v != NULL && *p != '\0') {
		const char *dot = strchr(p, '.');
		size_t n = dot != NULL ? (size_t)(dot - p) : strlen(p);
		char seg[256];

		if (!json_is_object(v) || n >= sizeof seg)
			return NULL;
		memcpy(seg, p, n);
		seg[n] = '\0';
		v = json_object_get(v, seg);
		p = dot != NULL ? dot + 1 : p + n;
	}
	return v;
}

/* A value from the delivery's bytes into the canonical event; false when
 * it is not UTF-8 (detail set, naming it). */
static bool put_str(json_t *ev, const char *key, const char *s, size_t len, const char *name, struct msg *out)
{
	json_t *v;

	if (s == NULL)
		return true;
	v = json_stringn(s, len);
	if (v == NULL) {
		env_detail(out, "%s is not UTF-8", name);
		return false;
	}
	if (json_object_set_new(ev, key, v) != 0) {
		env_detail(out, "out of memory");
		return false;
	}
	return true;
}

/* Copy an attribute into a key field of a message that failed, when it is
 * printable ASCII and fits: what an operator lists it by (dlq list) and
 * its log line names, never what the inbox decides by. */
static void keep_known(char *dst, size_t cap, const char *s, size_t len)
{
	if (dst[0] != '\0' || s == NULL || len == 0 || len >= cap)
		return;
	for (size_t i = 0; i < len; i++)
		if (s[i] < 0x20 || s[i] > 0x7e)
			return;
	memcpy(dst, s, len);
	dst[len] = '\0';
}

/* A message that failed after its envelope was read still says which it
 * is: its id, source and order, as far as they were readable (as
 * msg_parse keeps the message id of a body that fails). */
static void env_keep_known(const char *field, const struct env_found *f, struct msg *out)
{
	json_t *owned = NULL, *oid;

	keep_known(out->message_id, sizeof out->message_id, f->id, f->id_len);
	keep_known(out->source, sizeof out->source, f->source, f->source_len);
	oid = find_order_id(field, f, &owned);
	if (json_is_string(oid))
		keep_known(out->order_id, sizeof out->order_id, json_string_value(oid), json_string_length(oid));
	json_decref(owned);
}

/* A definition's key (a lower-case SQL name, lc_load checked) as the
 * camelCase property a MassTransit message carries it in. */
static void env_key_camel(const char *key, char *out, size_t cap)
{
	size_t n = 0;
	bool up = false;

	for (const char *p = key; *p != '\0' && n + 1 < cap; p++) {
		if (*p == '_') {
			up = n > 0;
			continue;
		}
		out[n++] = up && *p >= 'a' && *p <= 'z' ? (char)(*p - 'a' + 'A') : *p;
		up = false;
	}
	out[n] = '\0';
}

/* The canonical event of f, validated and hashed by msg_parse_event; its
 * JSON into *event. */
json_t *env_header_number(const struct env_delivery *d)
{
	const struct lc_def *def = agg_current()->def;
	const char *v;
	size_t len;

	if (!def->seq_header)
		return NULL;
	switch (header(d, def->seq_field, &v, &len)) {
	case ENV_HDR_ABSENT: return NULL;
	case ENV_HDR_INTEGER: return json_integer(len <= (size_t)INT64_MAX ? (json_int_t)len : -1);
	case ENV_HDR_STRING: {
		json_t *s = json_stringn(v, len);
		return s != NULL ? s : json_false(); /* not UTF-8: not a number either */
	}
	default: return json_false();
	}
}

static enum msg_reason env_finish(const struct cfg *conf, const struct env_delivery *d, struct env_found *f,
                                  struct msg *out, char **event)
{
	const struct lc_def *def = agg_current()->def;
	char order_name[320], field[260];
	size_t flen = 0;
	const char *given = cfg_order_id_field(conf->order_id_field,
	                                       f->mt ? CFG_ENVELOPE_MASSTRANSIT : CFG_ENVELOPE_CLOUDEVENTS, &flen);
	const char *ours;
	size_t olen = 0;
	json_t *ev = NULL, *oid, *owned = NULL, *seq;
	enum msg_reason r = MSG_REASON_INVALID_FIELD;

	/* The key's field: INBOX_ORDER_ID_FIELD where it names one for this
	 * envelope, else the envelope's default -- CloudEvents' subject, or
	 * the definition's key in MassTransit's camelCase (order_id ->
	 * orderId, shipment_id -> shipmentId), as a native message carries
	 * the key itself.  MassTransit's data is its message: "message." in
	 * front is that envelope's own name for it. */
	if (given != NULL && flen < sizeof field) {
		if (f->mt && flen > 8 && memcmp(given, "message.", 8) == 0) {
			given += 8;
			flen -= 8;
		}
		memcpy(field, given, flen);
		field[flen] = '\0';
	} else if (f->mt) {
		env_key_camel(agg_current()->def->key, field, sizeof field);
	} else {
		snprintf(field, sizeof field, "subject");
	}

	/* The order id's name as the producer knows it. */
	if (strcmp(field, "subject") == 0)
		snprintf(order_name, sizeof order_name, "%s", f->names.order_id);
	else
		snprintf(order_name, sizeof order_name, "%s.%s", f->names.data,
		         strncmp(field, "data.", 5) == 0 ? field + 5 : field);
	f->names.order_id = order_name;

	ours = map_type(conf->type_map, f->type_key, f->type_key_len, f->mt, &olen);
	if (ours == NULL) {
		env_detail(out, "%s '%.*s%s' is neither mapped by INBOX_TYPE_MAP nor one of our event types",
		           f->names.type, qlen(f->type_len), f->type, qcut(f->type_len));
		r = MSG_REASON_UNKNOWN_TYPE;
		goto out;
	}
	ev = json_object();
	if (ev == NULL)
		goto nomem;
	if (!put_str(ev, "message_id", f->id, f->id_len, f->names.message_id, out) ||
	    !put_str(ev, "source", f->source, f->source_len, f->names.source, out) ||
	    !put_str(ev, "type", ours, olen, f->names.type, out) ||
	    !put_str(ev, "occurred_at", f->time, f->time_len, f->names.occurred_at, out))
		goto out;
	if (f->data != NULL && json_object_set(ev, "data", f->data) != 0)
		goto nomem;
	/* the number of a definition that reads it there (msg.c checks it),
	 * kept with the event so that a held one keeps it; only then, so
	 * that the payload hash of every other definition's events stays
	 * what it was (a copy after an upgrade is still a duplicate) */
	seq = def->seq_attr ? json_incref(f->sequence) : env_header_number(d);
	if (seq != NULL && json_object_set_new(ev, "sequence", seq) != 0)
		goto nomem;
	oid = find_order_id(field, f, &owned);
	if (oid != NULL && json_object_set(ev, "order_id", oid) != 0)
		goto nomem;
	r = msg_parse_event(ev, &f->names, out);
	if (r == MSG_REASON_NONE) {
		*event = json_dumps(ev, JSON_COMPACT | JSON_SORT_KEYS);
		if (*event == NULL)
			goto nomem;
	}
	goto out;
nomem:
	env_detail(out, "out of memory");
	r = MSG_REASON_MALFORMED_JSON;
out:
	if (r != MSG_REASON_NONE)
		env_keep_known(field, f, out);
	json_decref(owned);
	json_decref(ev);
	return r;
}

/* A string attribute of a JSON envelope: absent or null is NULL; another
 * kind is invalid-field naming it. */
static bool json_attr(json_t *root, const char *key, const char *what, const char **s, size_t *len,
                      struct msg *out)
{
	json_t *v = json_object_get(root, key);

	*s = NULL;
	*len = 0;
	if (v == NULL || json_is_null(v))
		return true;
	if (!json_is_string(v)) {
		env_detail(out, "%s '%s' must be a string", what, key);
		return false;
	}
	*s = json_string_value(v);
	*len = json_string_length(v);
	return true;
}

static enum msg_reason load_object(const struct env_delivery *d, const char *what, json_t **root, struct msg *out)
{
	json_error_t err;

	*root = json_loadb(d->body != NULL ? d->body : "", d->body != NULL ? d->len : 0, JSON_REJECT_DUPLICATES, &err);
	if (*root == NULL) {
		env_detail(out, "%s: invalid JSON at line %d column %d: %s", what, err.line, err.column, err.text);
		return MSG_REASON_MALFORMED_JSON;
	}
	if (!json_is_object(*root)) {
		env_detail(out, "%s: the body is not a JSON object%s", what,
		           json_is_array(*root) ? " (CloudEvents batches are not supported)" : "");
		json_decref(*root);
		*root = NULL;
		return MSG_REASON_MALFORMED_JSON;
	}
	return MSG_REASON_NONE;
}

static enum msg_reason ce_specversion(const char *name, const char *v, size_t len, struct msg *out)
{
	if (v == NULL) {
		env_detail(out, "%s is missing (not a CloudEvents 1.0 event)", name);
		return MSG_REASON_MISSING_FIELD;
	}
	if (len != 3 || memcmp(v, "1.0", 3) != 0) {
		env_detail(out, "%s '%.*s%s' is not 1.0", name, qlen(len), v, qcut(len));
		return MSG_REASON_INVALID_FIELD;
	}
	return MSG_REASON_NONE;
}

/* The attributes every CloudEvent has: present and not empty. */
static enum msg_reason ce_required(const struct env_found *f, struct msg *out)
{
	if (f->id == NULL || f->id_len == 0) {
		env_detail(out, "%s is missing", f->names.message_id);
		return MSG_REASON_MISSING_FIELD;
	}
	if (f->source == NULL || f->source_len == 0) {
		env_detail(out, "%s is missing", f->names.source);
		return MSG_REASON_MISSING_FIELD;
	}
	if (f->type == NULL || f->type_len == 0) {
		env_detail(out, "%s is missing", f->names.type);
		return MSG_REASON_MISSING_FIELD;
	}
	return MSG_REASON_NONE;
}

static enum msg_reason ce_structured(const struct cfg *conf, const struct env_delivery *d, struct msg *out,
                                     struct env_context *ctx, char **event)
{
	struct env_found f = {
		.names = { "CloudEvents attribute 'id'", "CloudEvents attribute 'source'", "CloudEvents attribute 'type'",
		           "CloudEvents attribute 'subject'", "CloudEvents attribute 'time'", "data" },
	};
	static const char what[] = "CloudEvents attribute";
	const char *spec, *ct, *tp, *ts;
	size_t spec_len, ct_len, tp_len, ts_len;
	json_t *root = NULL;
	enum msg_reason r = load_object(d, "CloudEvents (structured mode)", &root, out);

	if (r != MSG_REASON_NONE)
		return r;
	r = MSG_REASON_INVALID_FIELD;
	if (!json_attr(root, "specversion", what, &spec, &spec_len, out) ||
	    !json_attr(root, "id", what, &f.id, &f.id_len, out) ||
	    !json_attr(root, "source", what, &f.source, &f.source_len, out) ||
	    !json_attr(root, "type", what, &f.type, &f.type_len, out) ||
	    !json_attr(root, "subject", what, &f.subject, &f.subject_len, out) ||
	    !json_attr(root, "time", what, &f.time, &f.time_len, out) ||
	    !json_attr(root, "datacontenttype", what, &ct, &ct_len, out))
		goto out;
	if ((r = ce_specversion("CloudEvents attribute 'specversion'", spec, spec_len, out)) != MSG_REASON_NONE ||
	    (r = ce_required(&f, out)) != MSG_REASON_NONE)
		goto out;
	r = MSG_REASON_INVALID_FIELD;
	if (json_object_get(root, "data_base64") != NULL) {
		env_detail(out, "CloudEvents attribute 'data_base64': binary data is not an event (send JSON data)");
		goto out;
	}
	if (ct != NULL && !media_json(ct, ct_len)) {
		env_detail(out, "CloudEvents attribute 'datacontenttype' '%.*s%s' is not JSON", qlen(ct_len), ct,
		           qcut(ct_len));
		goto out;
	}
	f.data = json_object_get(root, "data");
	if (f.data != NULL && json_is_null(f.data))
		f.data = NULL;
	f.sequence = json_object_get(root, "sequence");
	f.type_key = f.type;
	f.type_key_len = f.type_len;
	/* The extension attributes of distributed tracing, when no AMQP
	 * header carried a trace. */
	if (ctx != NULL && ctx->trace_id[0] == '\0' && json_attr(root, "traceparent", what, &tp, &tp_len, out) &&
	    tp != NULL && env_trace_parse(tp, tp_len, ctx) && json_attr(root, "tracestate", what, &ts, &ts_len, out))
		set_tracestate(ctx, ts, ts_len);
	r = env_finish(conf, d, &f, out, event);
out:
	json_decref(root);
	return r;
}

/* An AMQP 0-9-1 timestamp (seconds since the epoch, UTC) as the RFC 3339
 * time our event carries; false past 9999-12-31T23:59:59Z. */
static bool env_stamp(size_t seconds, char *out, size_t cap)
{
	time_t t;
	struct tm tm;

	if (seconds > 253402300799u)
		return false;
	t = (time_t)seconds;
	if (gmtime_r(&t, &tm) == NULL)
		return false;
	return strftime(out, cap, "%Y-%m-%dT%H:%M:%SZ", &tm) > 0;
}

static enum msg_reason ce_binary(const struct cfg *conf, const struct env_delivery *d, struct msg *out,
                                 struct env_context *ctx, char **event)
{
	static const char *const attrs[] = { "specversion", "id", "source", "type", "subject", "time" };
	struct env_found f = {
		.names = { "header cloudEvents:id", "header cloudEvents:source", "header cloudEvents:type",
		           "header cloudEvents:subject", "header cloudEvents:time", "data (the body)" },
	};
	const char *val[6];
	size_t len[6];
	char stamp[32];
	json_t *data = NULL;
	enum msg_reason r;

	/* The AMQP binding carries each attribute in its own AMQP type, or in
	 * its canonical string form: String, URI-reference and URI ones are
	 * strings either way; time, a Timestamp, may be an AMQP timestamp. */
	for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
		char key[48];
		enum env_hdr h = ce_header(d, attrs[i], &val[i], &len[i], key, sizeof key);

		if (h == ENV_HDR_TIMESTAMP && strcmp(attrs[i], "time") == 0) {
			if (!env_stamp(len[i], stamp, sizeof stamp)) {
				env_detail(out, "header %s: the AMQP timestamp %zu is after the year 9999", key, len[i]);
				return MSG_REASON_INVALID_FIELD;
			}
			val[i] = stamp;
			len[i] = strlen(stamp);
		} else if (h == ENV_HDR_OTHER || h == ENV_HDR_TIMESTAMP) {
			if (strcmp(attrs[i], "time") == 0)
				env_detail(out, "header %s must be an AMQP timestamp or an RFC 3339 string", key);
			else
				env_detail(out, "header %s must be a string", key);
			return MSG_REASON_INVALID_FIELD;
		}
	}
	f.id = val[1], f.id_len = len[1];
	f.source = val[2], f.source_len = len[2];
	f.type = val[3], f.type_len = len[3];
	f.subject = val[4], f.subject_len = len[4];
	f.time = val[5], f.time_len = len[5];
	if ((r = ce_specversion("header cloudEvents:specversion", val[0], len[0], out)) != MSG_REASON_NONE ||
	    (r = ce_required(&f, out)) != MSG_REASON_NONE)
		return r;
	if (d->len > 0) {
		/* The data is the body, its datacontenttype the AMQP content-type. */
		if (d->content_type != NULL && d->content_type_len > 0 && !media_json(d->content_type, d->content_type_len)) {
			env_detail(out, "content-type '%.*s%s': the data (the body) must be JSON", qlen(d->content_type_len),
			           d->content_type, qcut(d->content_type_len));
			return MSG_REASON_INVALID_FIELD;
		}
		json_error_t err;

		data = json_loadb(d->body, d->len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &err);
		if (data == NULL) {
			env_detail(out, "data (the body): invalid JSON at line %d column %d: %s", err.line, err.column,
			           err.text);
			return MSG_REASON_MALFORMED_JSON;
		}
		if (json_is_null(data)) {
			json_decref(data);
			data = NULL;
		}
	}
	f.data = data;
	f.type_key = f.type;
	f.type_key_len = f.type_len;
	{
		const char *sq;
		size_t sq_len;
		char key[48];

		enum env_hdr h = ce_header(d, "sequence", &sq, &sq_len, key, sizeof key);

		if (h == ENV_HDR_STRING)
			f.sequence = json_stringn(sq, sq_len);
		if ((h == ENV_HDR_STRING && f.sequence == NULL) || h == ENV_HDR_OTHER || h == ENV_HDR_TIMESTAMP) {
			env_detail(out, "header %s must be a string (CloudEvents' sequence, in UTF-8)", key);
			json_decref(data);
			return MSG_REASON_INVALID_FIELD;
		}
	}
	if (ctx != NULL && ctx->trace_id[0] == '\0') {
		const char *tp, *ts;
		size_t tp_len, ts_len;
		char key[48];

		if (ce_header(d, "traceparent", &tp, &tp_len, key, sizeof key) == ENV_HDR_STRING &&
		    env_trace_parse(tp, tp_len, ctx) &&
		    ce_header(d, "tracestate", &ts, &ts_len, key, sizeof key) == ENV_HDR_STRING)
			set_tracestate(ctx, ts, ts_len);
	}
	r = env_finish(conf, d, &f, out, event);
	json_decref(f.sequence);
	json_decref(data);
	return r;
}

/* MassTransit's source: the host and path of sourceAddress
 * ("rabbitmq://broker:5672/vhost/payments?temporary=true" ->
 * "broker/vhost/payments"), into buf. */
static bool mt_source(const char *addr, size_t len, char *buf, size_t cap, size_t *out_len)
{
	const char *p = addr, *end = addr + len, *host, *host_end, *path;
	size_t n = 0;

	while (p + 2 < end && !(p[0] == ':' && p[1] == '/' && p[2] == '/'))
		p++;
	if (p + 2 >= end)
		return false;
	host = p + 3;
	path = host;
	while (path < end && *path != '/' && *path != '?' && *path != '#')
		path++;
	/* the authority without its userinfo and port */
	for (const char *q = host; q < path; q++)
		if (*q == '@')
			host = q + 1;
	host_end = path;
	if (host < path && *host != '[') {
		for (const char *q = host; q < path; q++)
			if (*q == ':') {
				host_end = q;
				break;
			}
	}
	for (const char *q = host; q < host_end && n + 1 < cap; q++)
		buf[n++] = *q;
	for (const char *q = path; q < end && *q != '?' && *q != '#' && n + 1 < cap; q++)
		buf[n++] = *q;
	if (n + 1 >= cap || host == host_end)
		return false;
	buf[n] = '\0';
	*out_len = n;
	return true;
}

static enum msg_reason masstransit(const struct cfg *conf, const struct env_delivery *d, struct msg *out,
                                   struct env_context *ctx, char **event)
{
	static const char what[] = "MassTransit field";
	struct env_found f = {
		.names = { "MassTransit field 'messageId'", "MassTransit field 'sourceAddress'",
		           "MassTransit field 'messageType'", "subject", "MassTransit field 'sentTime'", "message" },
		.mt = true,
	};
	const char *addr, *corr;
	size_t addr_len, corr_len;
	char source[MSG_WIDE_SOURCE_MAX + 2];
	json_t *root = NULL, *types, *t0, *hdrs;
	enum msg_reason r = load_object(d, "MassTransit", &root, out);

	if (r != MSG_REASON_NONE)
		return r;
	r = MSG_REASON_INVALID_FIELD;
	if (!json_attr(root, "messageId", what, &f.id, &f.id_len, out) ||
	    !json_attr(root, "sourceAddress", what, &addr, &addr_len, out) ||
	    !json_attr(root, "sentTime", what, &f.time, &f.time_len, out) ||
	    !json_attr(root, "correlationId", what, &corr, &corr_len, out))
		goto out;
	if (f.id == NULL || f.id_len == 0) {
		env_detail(out, "MassTransit field 'messageId' is missing");
		r = MSG_REASON_MISSING_FIELD;
		goto out;
	}
	types = json_object_get(root, "messageType");
	if (types == NULL || json_is_null(types) || (json_is_array(types) && json_array_size(types) == 0)) {
		env_detail(out, "MassTransit field 'messageType' is missing");
		r = MSG_REASON_MISSING_FIELD;
		goto out;
	}
	t0 = json_array_get(types, 0);
	if (!json_is_string(t0)) {
		env_detail(out, "MassTransit field 'messageType' must be an array of message URNs");
		goto out;
	}
	f.type = json_string_value(t0);
	f.type_len = json_string_length(t0);
	if (f.type_len < sizeof ENV_MT_URN - 1 || memcmp(f.type, ENV_MT_URN, sizeof ENV_MT_URN - 1) != 0) {
		env_detail(out, "MassTransit field 'messageType' '%.*s%s' is not a urn:message: URN", qlen(f.type_len),
		           f.type, qcut(f.type_len));
		goto out;
	}
	f.type_key = f.type + sizeof ENV_MT_URN - 1;
	f.type_key_len = f.type_len - (sizeof ENV_MT_URN - 1);
	f.data = json_object_get(root, "message");
	if (f.data == NULL || json_is_null(f.data)) {
		env_detail(out, "MassTransit field 'message' is missing");
		r = MSG_REASON_MISSING_FIELD;
		goto out;
	}
	if (addr != NULL) {
		if (!mt_source(addr, addr_len, source, sizeof source, &f.source_len)) {
			env_detail(out, "MassTransit field 'sourceAddress' '%.*s%s' is not an address with a host",
			           qlen(addr_len), addr, qcut(addr_len));
			goto out;
		}
		f.source = source;
	}
	/* The envelope's correlationId is what MassTransit means by it; the
	 * AMQP property only when the envelope has none. */
	if (ctx != NULL && corr != NULL && corr_len > 0)
		(void)set_correlation(ctx, corr, corr_len);
	/* MassTransit copies the send context's headers into the envelope
	 * (OpenTelemetry's traceparent among them): the trace when no AMQP
	 * header carried one.  Not ours to judge otherwise: a value that is
	 * not a string or not a traceparent is ignored, as in a header. */
	hdrs = json_object_get(root, "headers");
	if (ctx != NULL && ctx->trace_id[0] == '\0' && json_is_object(hdrs)) {
		json_t *tp = json_object_get(hdrs, "traceparent"), *ts = json_object_get(hdrs, "tracestate");

		if (json_is_string(tp) && env_trace_parse(json_string_value(tp), json_string_length(tp), ctx) &&
		    json_is_string(ts))
			set_tracestate(ctx, json_string_value(ts), json_string_length(ts));
	}
	r = env_finish(conf, d, &f, out, event);
out:
	json_decref(root);
	return r;
}

enum msg_reason env_parse(const struct cfg *conf, const struct env_delivery *d, size_t max_body, struct msg *out,
                          struct env_context *ctx, char **event)
{
	enum cfg_envelope kind = env_detect(conf, d);
	enum msg_reason r;
	const char *v;
	size_t len;

	*event = NULL;
	if (ctx != NULL) {
		ctx->trace_id[0] = ctx->span_id[0] = ctx->flags[0] = '\0';
		ctx->tracestate[0] = ctx->correlation_id[0] = '\0';
		/* The transport's trace context first (every envelope). */
		if (header(d, "traceparent", &v, &len) == ENV_HDR_STRING && env_trace_parse(v, len, ctx) &&
		    header(d, "tracestate", &v, &len) == ENV_HDR_STRING)
			set_tracestate(ctx, v, len);
	}
	if (kind == CFG_ENVELOPE_NATIVE) {
		struct msg_props props = d->props;

		props.sequence = env_header_number(d);
		r = msg_parse(d->body, d->len, max_body, &props, out);
		json_decref(props.sequence);
	} else {
		memset(out, 0, offsetof(struct msg, text)); /* text is not read before it is written (msg.h) */
		if (d->len > max_body) {
			env_detail(out, "body of %zu bytes exceeds INBOX_MAX_BODY (%zu)", d->len, max_body);
			r = MSG_REASON_TOO_LARGE;
		} else if (kind == CFG_ENVELOPE_MASSTRANSIT) {
			r = masstransit(conf, d, out, ctx, event);
		} else if (ce_header(d, "specversion", &v, &len, (char[48]){ 0 }, 48) != ENV_HDR_ABSENT &&
		           !media_is(d->content_type, d->content_type_len, ENV_CT_CE)) {
			r = ce_binary(conf, d, out, ctx, event);
		} else {
			r = ce_structured(conf, d, out, ctx, event);
		}
		if (r != MSG_REASON_NONE) {
			free(*event);
			*event = NULL;
		}
	}
	if (ctx != NULL && ctx->correlation_id[0] == '\0')
		(void)set_correlation(ctx, d->correlation_id, d->correlation_id_len);
	return r;
}

int env_check_settings(const struct cfg *conf, char *err, size_t errlen)
{
	const struct lc_def *def = agg_current()->def;
	const char *p = conf->type_map != NULL ? conf->type_map : "";

	while (*p != '\0') {
		const char *comma = strchr(p, ',');
		const char *end = comma != NULL ? comma : p + strlen(p);
		const char *eq = memchr(p, '=', (size_t)(end - p));

		/* cfg_load checked the shape: eq is there, Ours not empty. */
		if (eq != NULL && msg_type_from_name(eq + 1, (size_t)(end - eq - 1)) < 0) {
			char types[256] = "";
			size_t used = 0;

			for (int i = 0; i < def->nevents && used < sizeof types; i++)
				used += (size_t)snprintf(types + used, sizeof types - used, "%s, ", def->events[i].type);
			snprintf(err, errlen, "INBOX_TYPE_MAP: '%.*s' is not an event type of the %s lifecycle (%sor an "
			         "alias): '%.*s'", (int)(end - eq - 1), eq + 1, def->aggregate, types, (int)(end - p), p);
			return -1;
		}
		p = comma != NULL ? comma + 1 : end;
	}
	return 0;
}

/* ---- writing an emitted event ------------------------------------------- */

char *env_emit_body(const struct cfg *conf, const struct env_emitted *e)
{
	char src[128];
	char *body = NULL;
	json_t *o;

	if (conf->emit_envelope == CFG_EMIT_CLOUDEVENTS) {
		snprintf(src, sizeof src, "urn:inbox-worker:%s", conf->consumer);
		o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:{s:s, s:s}}", "specversion", "1.0", "id", e->id,
		              "source", src, "type", e->type, "subject", e->key, "time", e->time, "datacontenttype",
		              "application/json", "data", "cause_message_id", e->cause_message_id, "cause_type",
		              e->cause_type);
		if (o != NULL && e->traceparent[0] != '\0' &&
		    (json_object_set_new(o, "traceparent", json_string(e->traceparent)) != 0 ||
		     (e->tracestate[0] != '\0' && json_object_set_new(o, "tracestate", json_string(e->tracestate)) != 0))) {
			json_decref(o);
			o = NULL;
		}
	} else {
		o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:{s:s, s:s}}", "message_id", e->id, "source", conf->consumer,
		              "type", e->type, e->key_field, e->key, "occurred_at", e->time, "data", "cause_message_id",
		              e->cause_message_id, "cause_type", e->cause_type);
	}
	/* Its own number among the aggregate's emitted events, without gaps:
	 * a second worker downstream orders them by it ("sequence": {"from":
	 * "data.sequence"}), and a CloudEvent says it in the sequence
	 * extension too (a string).  The cause's number beside it. */
	if (o != NULL && e->cause_sequence > 0 &&
	    json_object_set_new(json_object_get(o, "data"), "cause_sequence", json_integer(e->cause_sequence)) != 0) {
		json_decref(o);
		o = NULL;
	}
	if (o != NULL && e->sequence > 0) {
		char n[24];

		snprintf(n, sizeof n, "%lld", (long long)e->sequence);
		if (json_object_set_new(json_object_get(o, "data"), "sequence", json_integer(e->sequence)) != 0 ||
		    (conf->emit_envelope == CFG_EMIT_CLOUDEVENTS && json_object_set_new(o, "sequence", json_string(n)) != 0)) {
			json_decref(o);
			o = NULL;
		}
	}
	if (o != NULL)
		body = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
	json_decref(o);
	return body;
}

const char *env_emit_content_type(const struct cfg *conf)
{
	return conf->emit_envelope == CFG_EMIT_CLOUDEVENTS ? "application/cloudevents+json" : NULL;
}
