/*
 * msg.c - turns an AMQP body into a validated struct msg, or into the one
 * dead-letter reason that says why it cannot be one.
 *
 * Shape: size check, one jansson parse (duplicate keys rejected, so the hash
 * is over an unambiguous document), then each field checked for type and
 * length in a fixed order; the first failure wins.  message_id is read first
 * so that even a rejected message can be logged under its id.  JSON null on
 * any field counts as "absent": a required field that is null is
 * missing-field, an optional one takes its default.
 *
 * The payload hash streams jansson's compact, key-sorted serialisation into
 * SHA-256 through a small buffer, so no second copy of the body is built.  It
 * covers the body only: AMQP properties never change the hash.
 *
 * Every detail line is bounded by MSG_DETAIL_MAX and scrubbed to printable
 * ASCII, because it ends up in an AMQP header and in log lines.
 */
#include "msg.h"

#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "array.h"
#include "aggregate.h"

/* Untrusted strings quoted in a detail line are cut to this many bytes. */
#define QUOTE_MAX 48

/* Bytes gathered before each EVP_DigestUpdate: jansson hands out tokens of a
 * few bytes, and one digest call per token would dominate the hash cost. */
#define HASH_BUF 512

static const char *const reason_names[] = {
	[MSG_REASON_NONE] = "",
	[MSG_REASON_MALFORMED_JSON] = "malformed-json",
	[MSG_REASON_MISSING_FIELD] = "missing-field",
	[MSG_REASON_INVALID_FIELD] = "invalid-field",
	[MSG_REASON_UNKNOWN_TYPE] = "unknown-type",
	[MSG_REASON_TOO_LARGE] = "too-large",
	[MSG_REASON_PAYLOAD_CONFLICT] = "payload-conflict",
	[MSG_REASON_HOLD_EXPIRED] = "hold-expired",
	[MSG_REASON_INVALID_TRANSITION] = "invalid-transition",
	[MSG_REASON_RETRIES_EXHAUSTED] = "retries-exhausted",
	[MSG_REASON_UNPROCESSABLE] = "unprocessable",
	[MSG_REASON_EFFECT_FAILED] = "effect-failed",
	[MSG_REASON_DELIVERY_FAILED] = "delivery-failed",
	[MSG_REASON_SEQUENCE_GAP] = "sequence-gap",
};
_Static_assert(ARRAY_LEN(reason_names) == MSG_REASON_COUNT, "one name per enum msg_reason");

const char *msg_type_name(enum msg_type t)
{
	return agg_type_name((int)t);
}

int msg_type_from_name(const char *name, size_t len)
{
	/* Types and aliases (PaymentConfirmed) are the lifecycle definition's. */
	return agg_type_find(name, len);
}

const char *msg_reason_name(enum msg_reason r)
{
	if ((unsigned)r >= MSG_REASON_COUNT)
		return "";
	return reason_names[r];
}

static bool id_char(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
	       c == '.' || c == '_' || c == ':' || c == '-';
}

bool msg_id_valid(const char *s, size_t len, size_t min, size_t max)
{
	if (len < min || len > max)
		return false;
	if (len > 0 && s == NULL)
		return false;
	for (size_t i = 0; i < len; i++) {
		if (!id_char((unsigned char)s[i]))
			return false;
	}
	return true;
}

bool msg_wide_id_valid(const char *s, size_t len, size_t max)
{
	if (len < 1 || len > max || s == NULL || s[len - 1] == ' ')
		return false;
	for (size_t i = 0; i < len; i++) {
		if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
			return false;
	}
	return true;
}

static bool hex_digit(unsigned char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

bool msg_uri_ref_valid(const char *s, size_t len, size_t min, size_t max)
{
	/* RFC 3986's unreserved and reserved characters; '%' only as the head
	 * of an escape.  A URI-reference is made of nothing else (its grammar
	 * beyond the alphabet would not make a key any safer). */
	static const char other[] = "-._~:/?#[]@!$&'()*+,;=";

	if (len < min || len > max || (len > 0 && s == NULL))
		return false;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c == '%') {
			if (len - i < 3 || !hex_digit((unsigned char)s[i + 1]) || !hex_digit((unsigned char)s[i + 2]))
				return false;
			i += 2;
			continue;
		}
		if (!id_char(c) && (c == '\0' || strchr(other, c) == NULL))
			return false;
	}
	return true;
}

void msg_sha256_hex(const unsigned char sha[32], char out[65])
{
	static const char hex[] = "0123456789abcdef";

	for (size_t i = 0; i < 32; i++) {
		out[2 * i] = hex[sha[i] >> 4];
		out[2 * i + 1] = hex[sha[i] & 0xf];
	}
	out[64] = '\0';
}

/* ---- detail lines -------------------------------------------------------- */

__attribute__((format(printf, 2, 3)))
static void set_detail(struct msg *out, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(out->detail, sizeof out->detail, fmt, ap);
	va_end(ap);
	/* Quoted values and jansson's "near '...'" come from the body: keep the
	 * line one printable ASCII line whatever they hold. */
	for (char *p = out->detail; *p != '\0'; p++) {
		unsigned char c = (unsigned char)*p;
		if (c < 0x20 || c > 0x7e)
			*p = '?';
	}
}

/* Length to print of an untrusted value, and the marker that it was cut. */
static int qlen(size_t len)
{
	return len > QUOTE_MAX ? QUOTE_MAX : (int)len;
}

static const char *qcut(size_t len)
{
	return len > QUOTE_MAX ? "..." : "";
}

/* ---- field access -------------------------------------------------------- */

/* A string field of the body.  Absent or null: *s = NULL and MSG_REASON_NONE.
 * Any other non-string: invalid-field. */
static enum msg_reason body_string(json_t *root, const char *key, const char *name, const char **s,
                                   size_t *len, struct msg *out)
{
	json_t *v = json_object_get(root, key);

	*s = NULL;
	*len = 0;
	if (v == NULL || json_is_null(v))
		return MSG_REASON_NONE;
	if (!json_is_string(v)) {
		set_detail(out, "%s must be a string", name);
		return MSG_REASON_INVALID_FIELD;
	}
	*s = json_string_value(v);
	*len = json_string_length(v);
	return MSG_REASON_NONE;
}

/* The value from the body or from the AMQP property (empty means absent);
 * when both are present they must agree. */
static enum msg_reason body_or_prop(json_t *root, const char *key, const char *name, const char *prop,
                                    size_t prop_len, const char **s, size_t *len, struct msg *out)
{
	const char *b;
	size_t blen;
	enum msg_reason r = body_string(root, key, name, &b, &blen, out);

	if (r != MSG_REASON_NONE)
		return r;
	if (prop == NULL || prop_len == 0) {
		prop = NULL;
		prop_len = 0;
	}
	if (b != NULL && prop != NULL && (blen != prop_len || memcmp(b, prop, blen) != 0)) {
		set_detail(out, "%s property '%.*s%s' differs from body '%.*s%s'", name,
		           qlen(prop_len), prop, qcut(prop_len), qlen(blen), b, qcut(blen));
		return MSG_REASON_INVALID_FIELD;
	}
	if (b == NULL && prop == NULL) {
		set_detail(out, "%s is missing from body and properties", name);
		return MSG_REASON_MISSING_FIELD;
	}
	*s = b != NULL ? b : prop;
	*len = b != NULL ? blen : prop_len;
	return MSG_REASON_NONE;
}

/* Copy a value already checked to fit. */
static void copy_field(char *dst, const char *s, size_t len)
{
	memcpy(dst, s, len);
	dst[len] = '\0';
}

/* An identifier field (message_id, source, order_id): min..max characters
 * of [A-Za-z0-9._:-], copied into dst (which holds max + 1); otherwise
 * invalid-field, with a detail that names the field and quotes the value.
 * The one check for the three, so their rule and wording cannot drift. */
static enum msg_reason take_id(struct msg *out, const char *field, const char *s, size_t slen, size_t min,
                               size_t max, char *dst)
{
	if (!msg_id_valid(s, slen, min, max)) {
		set_detail(out, "%s '%.*s%s' is not %zu..%zu characters of [A-Za-z0-9._:-]", field, qlen(slen), s,
		           qcut(slen), min, max);
		return MSG_REASON_INVALID_FIELD;
	}
	copy_field(dst, s, slen);
	return MSG_REASON_NONE;
}

/* Deeper than MSG_MAX_DEPTH object/array levels?  The recursion stops one
 * level past the limit, so it is bounded whatever the body holds. */
static bool too_deep(json_t *v, int depth)
{
	if (json_is_object(v)) {
		const char *key;
		json_t *child;

		if (depth > MSG_MAX_DEPTH)
			return true;
		json_object_foreach(v, key, child) {
			if (too_deep(child, depth + 1))
				return true;
		}
	} else if (json_is_array(v)) {
		size_t i;
		json_t *child;

		if (depth > MSG_MAX_DEPTH)
			return true;
		json_array_foreach(v, i, child) {
			if (too_deep(child, depth + 1))
				return true;
		}
	}
	return false;
}

/* ---- occurred_at --------------------------------------------------------- */

static bool digits(const char *s, size_t n, int *val)
{
	int v = 0;

	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		v = v * 10 + (s[i] - '0');
	}
	*val = v;
	return true;
}

static int days_in_month(int year, int month)
{
	static const int days[12] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
	bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;

	return month == 2 && leap ? 29 : days[month - 1];
}

/* RFC 3339 date-time: YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM), with the
 * lowercase t/z the RFC also allows.  Second 60 is a leap second. */
static bool rfc3339_valid(const char *s, size_t len)
{
	int year, month, day, hour, min, sec, oh, om;
	size_t i = 19;

	if (len < 20 || len > MSG_TIME_MAX)
		return false;
	if (!digits(s, 4, &year) || s[4] != '-' || !digits(s + 5, 2, &month) || s[7] != '-' ||
	    !digits(s + 8, 2, &day) || (s[10] != 'T' && s[10] != 't') || !digits(s + 11, 2, &hour) ||
	    s[13] != ':' || !digits(s + 14, 2, &min) || s[16] != ':' || !digits(s + 17, 2, &sec))
		return false;
	if (month < 1 || month > 12 || day < 1 || day > days_in_month(year, month) || hour > 23 ||
	    min > 59 || sec > 60)
		return false;
	if (s[i] == '.') {
		size_t start = ++i;
		while (i < len && s[i] >= '0' && s[i] <= '9')
			i++;
		if (i == start)
			return false;
	}
	if (i < len && (s[i] == 'Z' || s[i] == 'z'))
		return i + 1 == len;
	if (i < len && (s[i] == '+' || s[i] == '-')) {
		if (len - i != 6 || !digits(s + i + 1, 2, &oh) || s[i + 3] != ':' ||
		    !digits(s + i + 4, 2, &om))
			return false;
		return oh <= 23 && om <= 59;
	}
	return false;
}

/* ---- the values an event sets ------------------------------------------ */

static int64_t days_from_civil(int64_t y, int m, int d)
{
	/* days since 1970-01-01 of a proleptic Gregorian date */
	y -= m <= 2;
	int64_t era = (y >= 0 ? y : y - 399) / 400;
	int64_t yoe = y - era * 400;
	int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
	int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;

	return era * 146097 + doe - 719468;
}

/* An RFC 3339 date-time (rfc3339_valid) as a DATETIME(6) literal's text in
 * UTC, the fraction cut to microseconds, a leap second as :59.  false when
 * the result leaves DATETIME's years 1000..9999. */
static bool rfc3339_sql(const char *s, size_t len, char out[MSG_TIME_SQL_MAX + 1])
{
	int year = 0, month = 0, day = 0, hour = 0, min = 0, sec = 0, off = 0;
	long usec = 0;
	size_t i = 19;
	int64_t t, days, secs;

	(void)digits(s, 4, &year);
	(void)digits(s + 5, 2, &month);
	(void)digits(s + 8, 2, &day);
	(void)digits(s + 11, 2, &hour);
	(void)digits(s + 14, 2, &min);
	(void)digits(s + 17, 2, &sec);
	if (sec == 60)
		sec = 59;
	if (i < len && s[i] == '.') {
		long scale = 100000;

		for (i++; i < len && s[i] >= '0' && s[i] <= '9'; i++) {
			usec += (s[i] - '0') * scale;
			scale /= 10;
		}
	}
	if (i < len && (s[i] == '+' || s[i] == '-')) {
		int oh = 0, om = 0;

		(void)digits(s + i + 1, 2, &oh);
		(void)digits(s + i + 4, 2, &om);
		off = (oh * 60 + om) * 60 * (s[i] == '-' ? -1 : 1);
	}
	t = days_from_civil(year, month, day) * 86400 + hour * 3600 + min * 60 + sec - off;
	days = t >= 0 ? t / 86400 : -((-t + 86399) / 86400);
	secs = t - days * 86400;
	{
		/* civil_from_days */
		int64_t z = days + 719468, era = (z >= 0 ? z : z - 146096) / 146097;
		int64_t doe = z - era * 146097, yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
		int64_t y = yoe + era * 400, doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
		int d = (int)(doy - (153 * mp + 2) / 5 + 1), m = (int)(mp < 10 ? mp + 3 : mp - 9);

		y += m <= 2;
		if (y < 1000 || y > 9999)
			return false;
		char tmp[80];

		snprintf(tmp, sizeof tmp, "%04d-%02d-%02d %02d:%02d:%02d.%06d", (int)y % 10000, m % 100,
		         d % 100, (int)(secs / 3600) % 100, (int)(secs / 60 % 60), (int)(secs % 60), (int)(usec % 1000000));
		memcpy(out, tmp, MSG_TIME_SQL_MAX);
		out[MSG_TIME_SQL_MAX] = '\0';
	}
	return true;
}

/* Characters (code points) of UTF-8 text jansson validated. */
static size_t utf8_chars(const char *s, size_t len)
{
	size_t n = 0;

	for (size_t i = 0; i < len; i++)
		n += ((unsigned char)s[i] & 0xc0) != 0x80;
	return n;
}

/* Keep len bytes of text in the message for val (bind made room). */
static void keep_text(struct msg *out, struct msg_val *val, const char *s, size_t len)
{
	if (out->text_used + len + 1 > sizeof out->text)
		return; /* agg_bind refuses a definition whose values do not fit */
	memcpy(out->text + out->text_used, s, len);
	out->text[out->text_used + len] = '\0';
	val->off = (uint16_t)out->text_used;
	val->len = (uint16_t)len;
	val->has = true;
	out->text_used += len + 1;
}

/* One data field a set reads: typed and bounded as declared.  own: a set
 * of the message's event (a required one must be there, and its value is
 * kept in val); otherwise a field another event reads, checked the same
 * way when present (so that a field means one thing on every message). */
static enum msg_reason data_value(json_t *data, const struct lc_set *st, bool own, const char *dname,
                                  const char *type, struct msg *out, struct msg_val *val)
{
	json_t *v = data != NULL ? json_object_get(data, st->field) : NULL;
	char sql[MSG_TIME_SQL_MAX + 1];

	if (v == NULL || json_is_null(v)) {
		if (own && st->required) {
			set_detail(out, "%s.%s is missing (%s needs it)", dname, st->field, type);
			return MSG_REASON_MISSING_FIELD;
		}
		return MSG_REASON_NONE;
	}
	switch (st->type) {
	case LC_TYPE_INTEGER:
		if (!json_is_integer(v) || json_integer_value(v) < st->min || json_integer_value(v) > st->max) {
			if (st->max == INT64_MAX && st->min == INT64_MIN)
				set_detail(out, "%s.%s must be an integer", dname, st->field);
			else if (st->max == INT64_MAX)
				set_detail(out, "%s.%s must be an integer >= %lld", dname, st->field, (long long)st->min);
			else if (st->min == INT64_MIN)
				set_detail(out, "%s.%s must be an integer <= %lld", dname, st->field, (long long)st->max);
			else
				set_detail(out, "%s.%s must be an integer in %lld..%lld", dname, st->field,
				           (long long)st->min, (long long)st->max);
			return MSG_REASON_INVALID_FIELD;
		}
		if (own) {
			val->i = (int64_t)json_integer_value(v);
			val->has = true;
		}
		return MSG_REASON_NONE;
	case LC_TYPE_STRING:
		if (!json_is_string(v) ||
		    utf8_chars(json_string_value(v), json_string_length(v)) > (size_t)st->max_length) {
			set_detail(out, "%s.%s must be a string of at most %lld characters", dname, st->field,
			           (long long)st->max_length);
			return MSG_REASON_INVALID_FIELD;
		}
		if (own)
			keep_text(out, val, json_string_value(v), json_string_length(v));
		return MSG_REASON_NONE;
	case LC_TYPE_DATETIME:
		if (!json_is_string(v) || !rfc3339_valid(json_string_value(v), json_string_length(v)) ||
		    !rfc3339_sql(json_string_value(v), json_string_length(v), sql)) {
			set_detail(out, "%s.%s must be an RFC 3339 date-time (years 1000..9999)", dname, st->field);
			return MSG_REASON_INVALID_FIELD;
		}
		if (own)
			keep_text(out, val, sql, strlen(sql));
		return MSG_REASON_NONE;
	}
	return MSG_REASON_NONE;
}

/* The values the message's event sets (out->vals), and every other data
 * field the definition reads, checked.  The event's own sets first, in
 * the file's order; the first failure wins. */
static enum msg_reason msg_values(const struct lc_def *def, int type, json_t *data, const char *dname,
                                  struct msg *out)
{
	const struct lc_event *ev = &def->events[type];
	enum msg_reason r;
	char sql[MSG_TIME_SQL_MAX + 1];

	for (int k = 0; k < ev->nsets; k++) {
		const struct lc_set *st = &ev->sets[k];
		struct msg_val *val = &out->vals[k];

		switch (st->src) {
		case LC_SRC_APPLIED_AT:
			val->has = true;
			break;
		case LC_SRC_OCCURRED_AT:
			if (out->occurred_at[0] != '\0') {
				if (!rfc3339_sql(out->occurred_at, strlen(out->occurred_at), sql)) {
					set_detail(out, "occurred_at '%s' is outside the years 1000..9999", out->occurred_at);
					return MSG_REASON_INVALID_FIELD;
				}
				keep_text(out, val, sql, strlen(sql));
			}
			break;
		case LC_SRC_MESSAGE_ID:
			keep_text(out, val, out->message_id, strlen(out->message_id));
			break;
		case LC_SRC_DATA:
			r = data_value(data, st, true, dname, ev->type, out, val);
			if (r != MSG_REASON_NONE)
				return r;
			break;
		}
	}
	for (int e = 0; e < def->nevents; e++) {
		for (int k = 0; e != type && k < def->events[e].nsets; k++) {
			const struct lc_set *st = &def->events[e].sets[k];
			bool seen = false;

			if (st->src != LC_SRC_DATA)
				continue;
			for (int j = 0; j < ev->nsets && !seen; j++)
				seen = ev->sets[j].src == LC_SRC_DATA && strcmp(ev->sets[j].field, st->field) == 0;
			for (int f = 0; f < e && !seen; f++) {
				for (int j = 0; f != type && j < def->events[f].nsets && !seen; j++)
					seen = def->events[f].sets[j].src == LC_SRC_DATA &&
					       strcmp(def->events[f].sets[j].field, st->field) == 0;
			}
			if (seen)
				continue;
			r = data_value(data, st, false, dname, ev->type, out, NULL);
			if (r != MSG_REASON_NONE)
				return r;
		}
	}
	return MSG_REASON_NONE;
}

const struct msg_val *msg_value(const struct msg *m, const char *column)
{
	const struct lc_def *def = agg_current()->def;
	const struct lc_event *ev;

	if ((unsigned)m->type >= (unsigned)def->nevents)
		return NULL;
	ev = &def->events[m->type];
	for (int k = 0; k < ev->nsets; k++) {
		if (strcmp(ev->sets[k].column, column) == 0)
			return m->vals[k].has ? &m->vals[k] : NULL;
	}
	return NULL;
}

/* ---- hash ---------------------------------------------------------------- */

struct hash_ctx {
	EVP_MD_CTX *md;
	size_t used;
	unsigned char buf[HASH_BUF];
};

static int hash_chunk(const char *chunk, size_t size, void *data)
{
	struct hash_ctx *h = data;

	if (size > sizeof h->buf - h->used) {
		if (h->used > 0 && EVP_DigestUpdate(h->md, h->buf, h->used) != 1)
			return -1;
		h->used = 0;
		if (size > sizeof h->buf)
			return EVP_DigestUpdate(h->md, chunk, size) == 1 ? 0 : -1;
	}
	memcpy(h->buf + h->used, chunk, size);
	h->used += size;
	return 0;
}

/* OpenSSL 3 looks the digest up in its provider tables on every
 * EVP_DigestInit_ex given EVP_sha256() (an implicit fetch: about 3,000
 * instructions a message, measured with bench/callgrind); fetched once, the
 * digest is shared by every thread (EVP_MD objects are read-only). */
static EVP_MD *msg_sha256_md;
static pthread_once_t msg_sha256_once = PTHREAD_ONCE_INIT;

static void msg_sha256_fetch(void)
{
	msg_sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
}

/* The producer's number of the event in its aggregate: 1, 2, ... as an
 * integer (2^53 is as far as every producer's JSON counts), or as the
 * decimal string CloudEvents' sequence extension types it. */
static enum msg_reason msg_sequence(const struct lc_def *def, json_t *root, json_t *data, const struct msg_names *nm,
                                    struct msg *out)
{
	bool own = def->seq_attr || def->seq_header; /* the event's own "sequence" (lifecycle.h) */
	json_t *n = own ? json_object_get(root, "sequence")
	            : data != NULL && json_is_object(data) ? json_object_get(data, def->seq_field) : NULL;
	char name[320];
	int64_t v = 0;

	if (def->seq_header)
		snprintf(name, sizeof name, "header %s", def->seq_field);
	else if (def->seq_attr)
		snprintf(name, sizeof name, "sequence");
	else
		snprintf(name, sizeof name, "%s.%s", nm->data, def->seq_field);
	if (n == NULL || json_is_null(n)) {
		set_detail(out, "%s (the event's number in its %s's sequence) is missing", name, def->aggregate);
		return MSG_REASON_MISSING_FIELD;
	}
	if (json_is_integer(n)) {
		v = (int64_t)json_integer_value(n);
	} else if (json_is_string(n)) {
		const char *s = json_string_value(n);
		size_t len = json_string_length(n);

		for (size_t i = 0; i < len && v >= 0; i++)
			v = s[i] >= '0' && s[i] <= '9' && i < 16 ? v * 10 + (s[i] - '0') : -1;
		if (len == 0)
			v = -1;
	} else {
		v = -1;
	}
	if (v < 1 || v > (1LL << 53)) {
		set_detail(out, "%s must be an integer from 1 to 2^53 (the event's number in its %s's sequence)", name,
		           def->aggregate);
		return MSG_REASON_INVALID_FIELD;
	}
	out->seq = v;
	return MSG_REASON_NONE;
}

/* SHA-256 of the compact, key-sorted serialisation of root.  False when
 * OpenSSL or jansson (out of memory) fails. */
static bool body_hash(json_t *root, unsigned char sha[32])
{
	struct hash_ctx h;
	unsigned int n = 0;
	bool ok = false;

	h.used = 0;
	h.md = NULL;
	if (pthread_once(&msg_sha256_once, msg_sha256_fetch) != 0 || msg_sha256_md == NULL)
		goto out;
	h.md = EVP_MD_CTX_new();
	if (h.md == NULL)
		goto out;
	if (EVP_DigestInit_ex(h.md, msg_sha256_md, NULL) != 1)
		goto out;
	if (json_dump_callback(root, hash_chunk, &h, JSON_COMPACT | JSON_SORT_KEYS) != 0)
		goto out;
	if (h.used > 0 && EVP_DigestUpdate(h.md, h.buf, h.used) != 1)
		goto out;
	if (EVP_DigestFinal_ex(h.md, sha, &n) != 1 || n != 32)
		goto out;
	ok = true;
out:
	EVP_MD_CTX_free(h.md);
	return ok;
}

/* The fields of a parsed event, checked in a fixed order (the first
 * failure wins) and the hash over root.  names == NULL: a native message
 * (its rules, its field names, the AMQP properties that may carry the id
 * and type); otherwise an event mapped from an envelope (msg_parse_event),
 * with the envelope's wider key rules and the producer's names in the
 * details. */
static enum msg_reason msg_check(json_t *root, const struct msg_props *props, const struct msg_names *names,
                                 struct msg *out)
{
	static const struct msg_names ours = { "message_id", "source", "type", "order_id", "occurred_at", "data" };
	const struct msg_names *nm = names != NULL ? names : &ours;
	bool wide = names != NULL;
	json_t *data;
	const struct lc_def *def = agg_current()->def;
	const char *s, *key, *key_name;
	size_t slen;
	int type;
	enum msg_reason r;

	/* message_id first: from here on a failure can be logged under it. */
	r = body_or_prop(root, "message_id", nm->message_id, props->message_id, props->message_id_len, &s, &slen,
	                 out);
	if (r != MSG_REASON_NONE)
		return r;
	if (!wide) {
		r = take_id(out, nm->message_id, s, slen, 1, MSG_ID_MAX, out->message_id);
		if (r != MSG_REASON_NONE)
			return r;
	} else if (!msg_wide_id_valid(s, slen, MSG_WIDE_ID_MAX)) {
		set_detail(out, "%s '%.*s%s' is not 1..%d printable ASCII characters (not ending in a space)",
		           nm->message_id, qlen(slen), s, qcut(slen), MSG_WIDE_ID_MAX);
		return MSG_REASON_INVALID_FIELD;
	} else {
		copy_field(out->message_id, s, slen);
	}

	if (too_deep(root, 1)) {
		set_detail(out, "%s nests objects/arrays deeper than %d levels", wide ? nm->data : "body",
		           MSG_MAX_DEPTH);
		return MSG_REASON_INVALID_FIELD;
	}

	r = body_string(root, "source", nm->source, &s, &slen, out);
	if (r != MSG_REASON_NONE)
		return r;
	if (s != NULL && !wide) {
		r = take_id(out, nm->source, s, slen, 0, MSG_SOURCE_MAX, out->source);
		if (r != MSG_REASON_NONE)
			return r;
	} else if (s != NULL) {
		if (!msg_uri_ref_valid(s, slen, 0, MSG_WIDE_SOURCE_MAX)) {
			set_detail(out, "%s '%.*s%s' is not a URI-reference of 1..%d characters", nm->source,
			           qlen(slen), s, qcut(slen), MSG_WIDE_SOURCE_MAX);
			return MSG_REASON_INVALID_FIELD;
		}
		copy_field(out->source, s, slen);
	}

	r = body_or_prop(root, "type", nm->type, props->type, props->type_len, &s, &slen, out);
	if (r != MSG_REASON_NONE)
		return r;
	type = msg_type_from_name(s, slen);
	if (type < 0) {
		set_detail(out, "unknown event type '%.*s%s'%s", qlen(slen), s, qcut(slen),
		           wide ? " (map it with INBOX_TYPE_MAP)" : "");
		return MSG_REASON_UNKNOWN_TYPE;
	}
	out->type = (enum msg_type)type;
	copy_field(out->type_name, s, slen); /* a known name: always fits */

	/* The aggregate's id: the definition's key field in a native message
	 * ("order_id" for orders), "order_id" in an envelope's canonical
	 * event (envelope.h maps the producer's field there). */
	key = wide ? "order_id" : def->key;
	key_name = wide ? nm->order_id : def->key;
	r = body_string(root, key, key_name, &s, &slen, out);
	if (r != MSG_REASON_NONE)
		return r;
	if (s == NULL) {
		set_detail(out, "%s (the %s id) is missing", key_name, def->aggregate);
		return MSG_REASON_MISSING_FIELD;
	}
	r = take_id(out, key_name, s, slen, 1, MSG_ORDER_ID_MAX, out->order_id);
	if (r != MSG_REASON_NONE)
		return r;

	r = body_string(root, "occurred_at", nm->occurred_at, &s, &slen, out);
	if (r != MSG_REASON_NONE)
		return r;
	if (s != NULL) {
		if (!rfc3339_valid(s, slen)) {
			set_detail(out, "%s '%.*s%s' is not an RFC 3339 date-time", nm->occurred_at, qlen(slen), s,
			           qcut(slen));
			return MSG_REASON_INVALID_FIELD;
		}
		copy_field(out->occurred_at, s, slen);
	}

	data = json_object_get(root, "data");
	if (data != NULL && json_is_null(data))
		data = NULL;
	/* CloudEvents' data is any JSON value: in an envelope's event an
	 * array, a string or a number is data without fields, and a field a
	 * set reads is missing from it (msg_values).  Ours is an object. */
	if (data != NULL && !json_is_object(data) && !wide) {
		set_detail(out, "%s must be an object", nm->data);
		return MSG_REASON_INVALID_FIELD;
	}
	r = msg_values(def, type, data, nm->data, out);
	if (r != MSG_REASON_NONE)
		return r;
	if (lc_sequenced(def)) {
		r = msg_sequence(def, root, data, nm, out);
		if (r != MSG_REASON_NONE)
			return r;
	}

	if (!body_hash(root, out->sha256)) {
		/* Only out of memory ends up here; jansson reports that as a parse
		 * error too, so it shares the reason. */
		set_detail(out, "cannot hash body (out of memory)");
		return MSG_REASON_MALFORMED_JSON;
	}
	return MSG_REASON_NONE;
}

enum msg_reason msg_parse_event(json_t *root, const struct msg_names *names, struct msg *out)
{
	static const struct msg_props no_props = { NULL, 0, NULL, 0, NULL };
	static const struct msg_names canonical = { "message_id", "source", "type", "order_id", "occurred_at",
		                                    "data" };

	if (out == NULL)
		return MSG_REASON_MALFORMED_JSON;
	memset(out, 0, offsetof(struct msg, text));
	if (root == NULL || !json_is_object(root)) {
		set_detail(out, "event is not a JSON object");
		return MSG_REASON_MALFORMED_JSON;
	}
	return msg_check(root, &no_props, names != NULL ? names : &canonical, out);
}

/* ---- the parse ----------------------------------------------------------- */

enum msg_reason msg_parse(const void *body, size_t len, size_t max_body,
                          const struct msg_props *props, struct msg *out)
{
	static const struct msg_props no_props = { NULL, 0, NULL, 0, NULL };
	json_error_t err;
	json_t *root = NULL;
	enum msg_reason r = MSG_REASON_NONE;

	if (out == NULL)
		return MSG_REASON_MALFORMED_JSON;
	memset(out, 0, offsetof(struct msg, text));
	if (props == NULL)
		props = &no_props;
	if (len > max_body) {
		set_detail(out, "body of %zu bytes exceeds INBOX_MAX_BODY (%zu)", len, max_body);
		return MSG_REASON_TOO_LARGE;
	}
	if (body == NULL) {
		if (len > 0) {
			set_detail(out, "no body");
			return MSG_REASON_MALFORMED_JSON;
		}
		body = "";
	}

	root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &err);
	if (root == NULL) {
		set_detail(out, "invalid JSON at line %d column %d: %s", err.line, err.column, err.text);
		r = MSG_REASON_MALFORMED_JSON;
		goto cleanup;
	}
	if (!json_is_object(root)) {
		set_detail(out, "body is not a JSON object");
		r = MSG_REASON_MALFORMED_JSON;
		goto cleanup;
	}

	/* A header's number is the event's own (the hash covers it); a body's
	 * "sequence" does not stand in for a header that is missing. */
	if (agg_current()->def->seq_header) {
		(void)json_object_del(root, "sequence"); /* -1: the body had none */
		if (props->sequence != NULL && json_object_set(root, "sequence", props->sequence) != 0) {
			set_detail(out, "out of memory");
			r = MSG_REASON_MALFORMED_JSON;
			goto cleanup;
		}
	}
	r = msg_check(root, props, NULL, out);

cleanup:
	json_decref(root);
	return r;
}
