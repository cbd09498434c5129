/*
 * props.c - AMQP basic properties and headers as JSON, and back (see
 * props.h).
 *
 * Whatever a producer sent must serialise: the JSON is what a held event
 * keeps (held_events.props) and what a dead-letter copy made later restores
 * (outbox.props), and a copy that cannot be made would leave the message
 * unsettled.  So nothing here fails for the message's sake:
 * - A value JSON carries natively stays plain (string, integer, boolean,
 *   finite double, void as null).  Every other kind is a one-key object
 *   tagged with "$": byte arrays {"$bytes": base64} (so they come back as
 *   byte arrays), text that is not UTF-8 {"$utf8b64": base64},
 *   {"$timestamp"}, {"$f32"}, {"$decimal": [decimals, value]},
 *   {"$table": {...}}, {"$array": [...]}.  No plain value is an object, so
 *   the tags cannot be mistaken for data.
 * - Escaped (not UTF-8) values are kept; values that cannot be kept are
 *   dropped: a key that is not UTF-8 or holds a NUL byte, a repeated key,
 *   a value over PROPS_VALUE_MAX, nesting deeper than PROPS_DEPTH_MAX, a NaN
 *   or infinity, an unsigned 64-bit integer over INT64_MAX (a kind RabbitMQ
 *   refuses), headers past MQ_HEADERS_KEEP or past the total budget.  All
 *   of it in the order of the frame, so the same message always gives the
 *   same JSON.
 * - What was escaped or dropped is said in one short line, returned to the
 *   caller (for x-inbox-detail) and kept in the JSON as "inbox_note" for
 *   dead-letter copies made later from a stored row.
 * - The whole is at most MQ_PROPS_JSON_MAX bytes, well inside a TEXT
 *   column (65,535 bytes) and a frame (131,072).
 */
#include "props.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deadletter.h"
#include "mq.h"
#include "status.h"

#define PROPS_VALUE_MAX 4096   /* encoded bytes of one header value */
#define PROPS_DEPTH_MAX 8      /* tables and arrays inside a header */
#define PROPS_NOTE_MAX 360

const amqp_field_value_t *props_header(const amqp_basic_properties_t *p, const char *key)
{
	size_t klen = strlen(key);

	if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG))
		return NULL;
	for (int i = 0; i < p->headers.num_entries; i++) {
		const amqp_table_entry_t *e = &p->headers.entries[i];
		if (e->key.len == klen && memcmp(e->key.bytes, key, klen) == 0)
			return &e->value;
	}
	return NULL;
}

bool props_field_int(const amqp_field_value_t *v, int64_t *out)
{
	switch (v->kind) {
	case AMQP_FIELD_KIND_I8: *out = v->value.i8; return true;
	case AMQP_FIELD_KIND_U8: *out = v->value.u8; return true;
	case AMQP_FIELD_KIND_I16: *out = v->value.i16; return true;
	case AMQP_FIELD_KIND_U16: *out = v->value.u16; return true;
	case AMQP_FIELD_KIND_I32: *out = v->value.i32; return true;
	case AMQP_FIELD_KIND_U32: *out = v->value.u32; return true;
	case AMQP_FIELD_KIND_I64: *out = v->value.i64; return true;
	case AMQP_FIELD_KIND_U64: *out = (int64_t)v->value.u64; return true;
	case AMQP_FIELD_KIND_TIMESTAMP: *out = (int64_t)v->value.u64; return true;
	default: return false;
	}
}


/* env_header_fn over the delivery's AMQP headers: long strings and byte
 * arrays are strings, a timestamp is one. */
enum env_hdr props_env_header(const void *arg, const char *key, const char **val, size_t *len)
{
	const amqp_field_value_t *v = props_header(arg, key);
	int64_t i;

	if (v == NULL)
		return ENV_HDR_ABSENT;
	/* CloudEvents' AMQP binding sends a Timestamp attribute (time) as an
	 * AMQP timestamp: seconds since the epoch in AMQP 0-9-1. */
	if (v->kind == AMQP_FIELD_KIND_TIMESTAMP && v->value.u64 <= SIZE_MAX) {
		*val = NULL;
		*len = (size_t)v->value.u64;
		return ENV_HDR_TIMESTAMP;
	}
	/* a definition's number may come in a header (lifecycle.h, seq_header) */
	if (props_field_int(v, &i)) {
		*val = NULL;
		*len = (size_t)(i >= 0 ? i : 0);
		return i >= 0 ? ENV_HDR_INTEGER : ENV_HDR_OTHER;
	}
	if (v->kind != AMQP_FIELD_KIND_UTF8 && v->kind != AMQP_FIELD_KIND_BYTES)
		return ENV_HDR_OTHER;
	*val = v->value.bytes.bytes;
	*len = v->value.bytes.len;
	return ENV_HDR_STRING;
}

int props_saved_envelope(const char *props_json, struct props_out *o, struct env_delivery *e)
{
	const struct mq_message msg = { .props_json = props_json };
	int rc = props_build(o, &msg);

	*e = (struct env_delivery){ .header = props_env_header, .header_arg = &o->p };
	return rc;
}

struct props_enc {
	char esc[112];          /* names of values kept as base64 */
	size_t esc_len;
	int esc_more;
	char drop[160];         /* "name (why)" of values dropped */
	size_t drop_len;
	int drop_more;
};

static void props_list_add(char *list, size_t cap, size_t *len, int *more, const char *item)
{
	size_t n = strlen(item);

	/* Room is kept for ", +NN more" at the end; once one item did not
	 * fit, none after it is listed, so the list stays in frame order. */
	if (*more > 0 || *len + n + 2 + 12 >= cap) {
		(*more)++;
		return;
	}
	if (*len > 0) {
		memcpy(list + *len, ", ", 2);
		*len += 2;
	}
	memcpy(list + *len, item, n + 1);
	*len += n;
}

static void props_escaped(struct props_enc *e, const char *path)
{
	props_list_add(e->esc, sizeof e->esc, &e->esc_len, &e->esc_more, path);
}

static void props_dropped(struct props_enc *e, const char *path, const char *why)
{
	char item[160];

	snprintf(item, sizeof item, "%s (%s)", path, why);
	props_list_add(e->drop, sizeof e->drop, &e->drop_len, &e->drop_more, item);
}

/* The one line: "escaped (not UTF-8, kept as base64): a, b; dropped: c
 * (why)"; "" when nothing changed. */
static void props_note_line(const struct props_enc *e, char *out, size_t cap)
{
	char em[24] = "", dm[24] = "";

	if (e->esc_more > 0)
		snprintf(em, sizeof em, ", +%d more", e->esc_more);
	if (e->drop_more > 0)
		snprintf(dm, sizeof dm, ", +%d more", e->drop_more);
	snprintf(out, cap, "%s%s%s%s%s%s%s", e->esc_len > 0 ? "escaped (not UTF-8, kept as base64): " : "", e->esc,
	         em, e->esc_len > 0 && e->drop_len > 0 ? "; " : "", e->drop_len > 0 ? "dropped: " : "", e->drop, dm);
}

/* A key from the frame made safe for the note: printable ASCII, cut. */
static void props_safe_name(char *out, size_t cap, const char *prefix, amqp_bytes_t key)
{
	size_t n = 0, plen = prefix != NULL ? strlen(prefix) : 0;

	if (cap == 0)
		return;
	for (size_t i = 0; i < plen && n + 1 < cap; i++)
		out[n++] = prefix[i];
	if (plen > 0 && n + 1 < cap)
		out[n++] = '.';
	for (size_t i = 0; i < key.len && i < 40 && n + 1 < cap; i++) {
		unsigned char ch = ((const unsigned char *)key.bytes)[i];
		out[n++] = ch > 0x20 && ch < 0x7f && ch != ';' ? (char)ch : '?';
	}
	if (key.len > 40 && n + 4 < cap) {
		memcpy(out + n, "...", 3);
		n += 3;
	}
	out[n] = '\0';
}

/* Strict UTF-8 as MariaDB's utf8mb4 and jansson take it: no overlong
 * forms, no surrogates, nothing past U+10FFFF.  log.c's utf8_seq_len
 * applies the same rules one sequence at a time (to escape a log line);
 * the two are kept apart so that the logger depends on nothing. */
bool props_utf8_valid(const void *p, size_t len)
{
	const unsigned char *s = p;
	size_t i = 0;

	while (i < len) {
		unsigned char c = s[i];
		size_t need;
		uint32_t cp;

		if (c < 0x80) {
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf) {
			need = 1;
			cp = c & 0x1f;
		} else if (c >= 0xe0 && c <= 0xef) {
			need = 2;
			cp = c & 0x0f;
		} else if (c >= 0xf0 && c <= 0xf4) {
			need = 3;
			cp = c & 0x07;
		} else {
			return false;
		}
		if (len - i <= need)
			return false;
		for (size_t k = 1; k <= need; k++) {
			if ((s[i + k] & 0xc0) != 0x80)
				return false;
			cp = (cp << 6) | (s[i + k] & 0x3f);
		}
		if ((need == 2 && cp < 0x800) || (need == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
		    (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		i += need + 1;
	}
	return true;
}

static const char props_b64chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* {"<tag>": base64 of b}; NULL only when memory ran out. */
static json_t *props_b64_tagged(const char *tag, amqp_bytes_t b)
{
	const unsigned char *in = b.bytes;
	size_t olen = (b.len + 2) / 3 * 4;
	char *out = malloc(olen + 1);
	size_t o = 0;
	json_t *r;

	if (out == NULL)
		return NULL;
	for (size_t i = 0; i < b.len; i += 3) {
		uint32_t v = (uint32_t)in[i] << 16;
		if (i + 1 < b.len)
			v |= (uint32_t)in[i + 1] << 8;
		if (i + 2 < b.len)
			v |= in[i + 2];
		out[o++] = props_b64chars[(v >> 18) & 63];
		out[o++] = props_b64chars[(v >> 12) & 63];
		out[o++] = i + 1 < b.len ? props_b64chars[(v >> 6) & 63] : '=';
		out[o++] = i + 2 < b.len ? props_b64chars[v & 63] : '=';
	}
	out[o] = '\0';
	r = json_pack("{s:s}", tag, out);
	free(out);
	return r;
}

/* Decode base64 into pool memory; false when s is not base64. */
static bool props_b64_decode(amqp_pool_t *pool, const char *s, amqp_bytes_t *out)
{
	size_t len = strlen(s), o = 0;
	unsigned char *buf;

	if (len % 4 != 0)
		return false;
	buf = amqp_pool_alloc(pool, len / 4 * 3 + 1);
	if (buf == NULL)
		return false;
	for (size_t i = 0; i < len; i += 4) {
		uint32_t v = 0;
		int pad = 0;
		for (int k = 0; k < 4; k++) {
			const char *c = s[i + k] != '\0' ? strchr(props_b64chars, s[i + k]) : NULL;
			if (s[i + k] == '=' && i + 4 == len && k >= 2) {
				pad++;
				v <<= 6;
				continue;
			}
			if (c == NULL || pad > 0)
				return false;
			v = (v << 6) | (uint32_t)(c - props_b64chars);
		}
		buf[o++] = (unsigned char)(v >> 16);
		if (pad < 2)
			buf[o++] = (unsigned char)(v >> 8);
		if (pad < 1)
			buf[o++] = (unsigned char)v;
	}
	out->bytes = buf;
	out->len = o;
	return true;
}


static json_t *props_enc_value(struct props_enc *e, const amqp_field_value_t *v, const char *path, int depth);

/* jansson refuses a NULL pointer even for no bytes; a decoder may give
 * one for an empty string. */
static json_t *props_jstring(amqp_bytes_t b)
{
	return b.len == 0 ? json_string("") : json_stringn(b.bytes, b.len);
}

/* A table's entries into a JSON object, in frame order; max_entries and
 * budget bound what is kept (0: no bound of their own). */
static json_t *props_enc_table(struct props_enc *e, const amqp_table_t *t, const char *path, int depth,
                            int max_entries, size_t budget)
{
	json_t *o = json_object();
	size_t used = 2;
	int past = 0;

	if (o == NULL)
		return NULL;
	for (int i = 0; i < t->num_entries; i++) {
		const amqp_table_entry_t *en = &t->entries[i];
		char name[96], key[256];
		json_t *jv;
		size_t sz;

		props_safe_name(name, sizeof name, path, en->key);
		if (en->key.len == 0 || en->key.len >= sizeof key || memchr(en->key.bytes, 0, en->key.len) != NULL ||
		    !props_utf8_valid(en->key.bytes, en->key.len)) {
			props_dropped(e, name, en->key.len == 0 ? "empty key" : "key not UTF-8");
			continue;
		}
		memcpy(key, en->key.bytes, en->key.len);
		key[en->key.len] = '\0';
		if (json_object_get(o, key) != NULL) {
			props_dropped(e, name, "repeated key");
			continue;
		}
		if (max_entries > 0 && i >= max_entries) {
			past++;
			continue;
		}
		jv = props_enc_value(e, &en->value, name, depth);
		if (jv == NULL)
			continue;
		sz = json_dumpb(jv, NULL, 0, JSON_COMPACT | JSON_ENCODE_ANY) + en->key.len * 6 + 4;
		if (budget > 0 && used + sz > budget) {
			json_decref(jv);
			props_dropped(e, name, "over the size limit of all properties");
			continue;
		}
		if (json_object_set_new(o, key, jv) != 0) {
			json_decref(o);
			return NULL;
		}
		used += sz;
	}
	if (past > 0) {
		char what[80];
		snprintf(what, sizeof what, "%d headers past the first %d", past, max_entries);
		props_dropped(e, path != NULL && path[0] ? path : "headers", what);
	}
	return o;
}

/* One value as JSON; NULL when it is dropped (noted) or memory ran out. */
static json_t *props_enc_value(struct props_enc *e, const amqp_field_value_t *v, const char *path, int depth)
{
	json_t *r = NULL;
	int64_t i;

	if (v->kind == AMQP_FIELD_KIND_U64 && v->value.u64 > INT64_MAX) {
		/* RabbitMQ never delivers the kind (it refuses 'L' frames), and
		 * a copy carrying it would be refused in turn. */
		props_dropped(e, path, "unsigned 64-bit");
		return NULL;
	}
	if (v->kind == AMQP_FIELD_KIND_TIMESTAMP)
		return json_pack("{s:I}", "$timestamp", (json_int_t)v->value.u64);
	if (props_field_int(v, &i))
		return json_integer(i);
	switch (v->kind) {
	case AMQP_FIELD_KIND_UTF8:
	case AMQP_FIELD_KIND_BYTES: {
		bool utf8 = props_utf8_valid(v->value.bytes.bytes, v->value.bytes.len);
		if (v->value.bytes.len > PROPS_VALUE_MAX) {
			char what[64];
			snprintf(what, sizeof what, "%zu bytes, over %d", v->value.bytes.len, PROPS_VALUE_MAX);
			props_dropped(e, path, what);
			return NULL;
		}
		if (v->kind == AMQP_FIELD_KIND_BYTES || !utf8) {
			if (!utf8)
				props_escaped(e, path);
			return props_b64_tagged(v->kind == AMQP_FIELD_KIND_BYTES ? "$bytes" : "$utf8b64", v->value.bytes);
		}
		return props_jstring(v->value.bytes);
	}
	case AMQP_FIELD_KIND_BOOLEAN:
		return json_boolean(v->value.boolean);
	case AMQP_FIELD_KIND_VOID:
		return json_null();
	case AMQP_FIELD_KIND_F64:
	case AMQP_FIELD_KIND_F32: {
		double d = v->kind == AMQP_FIELD_KIND_F64 ? v->value.f64 : (double)v->value.f32;
		if (isnan(d) || isinf(d)) {
			props_dropped(e, path, "not a finite number");
			return NULL;
		}
		return v->kind == AMQP_FIELD_KIND_F64 ? json_real(d) : json_pack("{s:f}", "$f32", d);
	}
	case AMQP_FIELD_KIND_DECIMAL:
		return json_pack("{s:[i,I]}", "$decimal", (int)v->value.decimal.decimals,
		                 (json_int_t)v->value.decimal.value);
	case AMQP_FIELD_KIND_TABLE:
	case AMQP_FIELD_KIND_ARRAY:
		if (depth >= PROPS_DEPTH_MAX) {
			props_dropped(e, path, "nested too deep");
			return NULL;
		}
		if (v->kind == AMQP_FIELD_KIND_TABLE) {
			json_t *t = props_enc_table(e, &v->value.table, path, depth + 1, 0, 0);
			r = t != NULL ? json_pack("{s:o}", "$table", t) : NULL;
		} else {
			json_t *a = json_array();
			for (int k = 0; a != NULL && k < v->value.array.num_entries; k++) {
				char name[112];
				json_t *x;
				snprintf(name, sizeof name, "%s[%d]", path, k);
				x = props_enc_value(e, &v->value.array.entries[k], name, depth + 1);
				if (x != NULL && json_array_append_new(a, x) != 0) {
					json_decref(a);
					a = NULL;
				}
			}
			r = a != NULL ? json_pack("{s:o}", "$array", a) : NULL;
		}
		if (r != NULL && json_dumpb(r, NULL, 0, JSON_COMPACT) > PROPS_VALUE_MAX) {
			json_decref(r);
			props_dropped(e, path, "over its size limit");
			return NULL;
		}
		return r;
	default: {
		char what[48];
		snprintf(what, sizeof what, "unknown field kind 0x%02x", v->kind);
		props_dropped(e, path, what);
		return NULL;
	}
	}
}

/* A short-string property: plain when UTF-8, else {"$bytes": base64}. */
static int props_enc_prop(struct props_enc *e, json_t *o, const char *k, amqp_bytes_t b)
{
	json_t *v;

	if (b.len == 0 || (props_utf8_valid(b.bytes, b.len) && memchr(b.bytes, 0, b.len) == NULL)) {
		v = props_jstring(b);
	} else {
		props_escaped(e, k);
		v = props_b64_tagged("$bytes", b);
	}
	return v != NULL ? json_object_set_new(o, k, v) : -1;
}

char *props_to_json(const amqp_basic_properties_t *p, char *note, size_t note_cap)
{
	struct props_enc e = { .esc_len = 0 };
	char line[PROPS_NOTE_MAX];
	json_t *o = json_object();
	char *out = NULL;
	size_t used;

	if (note != NULL && note_cap > 0)
		note[0] = '\0';
	if (o == NULL)
		goto cleanup;
	if (p->_flags & AMQP_BASIC_CONTENT_TYPE_FLAG && props_enc_prop(&e, o, "content_type", p->content_type) != 0)
		goto cleanup;
	if (p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG && props_enc_prop(&e, o, "message_id", p->message_id) != 0)
		goto cleanup;
	if (p->_flags & AMQP_BASIC_TYPE_FLAG && props_enc_prop(&e, o, "type", p->type) != 0)
		goto cleanup;
	if (p->_flags & AMQP_BASIC_CORRELATION_ID_FLAG &&
	    props_enc_prop(&e, o, "correlation_id", p->correlation_id) != 0)
		goto cleanup;
	if (p->_flags & AMQP_BASIC_APP_ID_FLAG && props_enc_prop(&e, o, "app_id", p->app_id) != 0)
		goto cleanup;
	if (p->_flags & AMQP_BASIC_TIMESTAMP_FLAG &&
	    json_object_set_new(o, "timestamp", json_integer((json_int_t)p->timestamp)) != 0)
		goto cleanup;
	/* Five short strings of at most 255 bytes: under 8 KiB even with
	 * every byte escaped, so the headers get the rest of the budget. */
	used = json_dumpb(o, NULL, 0, JSON_COMPACT) + PROPS_NOTE_MAX * 2 + 64;
	if (p->_flags & AMQP_BASIC_HEADERS_FLAG) {
		json_t *h = props_enc_table(&e, &p->headers, "", 0, MQ_HEADERS_KEEP, MQ_PROPS_JSON_MAX - used);
		if (h == NULL || json_object_set_new(o, "headers", h) != 0)
			goto cleanup;
	}
	props_note_line(&e, line, sizeof line);
	if (line[0] != '\0' && json_object_set_new(o, "inbox_note", json_string(line)) != 0)
		goto cleanup;
	out = json_dumps(o, JSON_COMPACT);
	if (out != NULL && note != NULL && note_cap > 0)
		snprintf(note, note_cap, "%s", line);
cleanup:
	json_decref(o);
	return out;
}

void props_json_note(const char *props_json, char *buf, size_t cap)
{
	json_error_t err;
	json_t *o;

	if (cap == 0)
		return;
	buf[0] = '\0';
	if (props_json == NULL)
		return;
	o = json_loads(props_json, JSON_ALLOW_NUL, &err);
	if (json_is_string(json_object_get(o, "inbox_note")))
		snprintf(buf, cap, "%s", json_string_value(json_object_get(o, "inbox_note")));
	json_decref(o);
}

/* A saved short string: plain, or {"$bytes": base64} when it was not
 * UTF-8. */
static void props_set_str(amqp_pool_t *pool, amqp_bytes_t *dst, amqp_flags_t *flags, amqp_flags_t flag,
                             json_t *v)
{
	json_t *b = json_object_get(v, "$bytes");

	if (json_is_string(v)) {
		dst->bytes = (void *)json_string_value(v);
		dst->len = json_string_length(v);
		*flags |= flag;
	} else if (json_is_string(b) && props_b64_decode(pool, json_string_value(b), dst) && dst->len < 256) {
		*flags |= flag;
	}
}

/* The inverse of props_enc_value: false when v is not a value we wrote (it
 * is then left out).  One branch a kind, alike in shape only. */
static bool props_dec_value(amqp_pool_t *pool, json_t *v, amqp_field_value_t *out, int depth)
{
	const char *tag;
	json_t *x;

	if (json_is_string(v)) {
		out->kind = AMQP_FIELD_KIND_UTF8;
		out->value.bytes.bytes = (void *)json_string_value(v);
		out->value.bytes.len = json_string_length(v);
		return true;
	}
	if (json_is_integer(v)) {
		out->kind = AMQP_FIELD_KIND_I64;
		out->value.i64 = json_integer_value(v);
		return true;
	}
	if (json_is_real(v)) {
		out->kind = AMQP_FIELD_KIND_F64;
		out->value.f64 = json_real_value(v);
		return true;
	}
	if (json_is_boolean(v)) {
		out->kind = AMQP_FIELD_KIND_BOOLEAN;
		out->value.boolean = json_is_true(v);
		return true;
	}
	if (json_is_null(v)) {
		out->kind = AMQP_FIELD_KIND_VOID;
		return true;
	}
	if (!json_is_object(v) || json_object_size(v) != 1 || depth > PROPS_DEPTH_MAX)
		return false;
	tag = json_object_iter_key(json_object_iter(v));
	x = json_object_iter_value(json_object_iter(v));
	if ((strcmp(tag, "$bytes") == 0 || strcmp(tag, "$utf8b64") == 0) && json_is_string(x)) {
		out->kind = tag[1] == 'b' ? AMQP_FIELD_KIND_BYTES : AMQP_FIELD_KIND_UTF8;
		return props_b64_decode(pool, json_string_value(x), &out->value.bytes);
	}
	if (strcmp(tag, "$timestamp") == 0 && json_is_integer(x)) {
		out->kind = AMQP_FIELD_KIND_TIMESTAMP;
		out->value.u64 = (uint64_t)json_integer_value(x);
		return true;
	}
	if (strcmp(tag, "$f32") == 0 && json_is_number(x)) {
		out->kind = AMQP_FIELD_KIND_F32;
		out->value.f32 = (float)json_number_value(x);
		return true;
	}
	if (strcmp(tag, "$decimal") == 0 && json_is_array(x) && json_array_size(x) == 2 &&
	    json_is_integer(json_array_get(x, 0)) && json_is_integer(json_array_get(x, 1))) {
		out->kind = AMQP_FIELD_KIND_DECIMAL;
		out->value.decimal.decimals = (uint8_t)json_integer_value(json_array_get(x, 0));
		out->value.decimal.value = (uint32_t)json_integer_value(json_array_get(x, 1));
		return true;
	}
	if (strcmp(tag, "$table") == 0 && json_is_object(x)) {
		size_t cap = json_object_size(x);
		amqp_table_entry_t *es = amqp_pool_alloc(pool, (cap > 0 ? cap : 1) * sizeof *es);
		const char *k;
		json_t *y;
		int n = 0;

		if (es == NULL)
			return false;
		json_object_foreach(x, k, y) {
			es[n].key = amqp_cstring_bytes(k);
			if (props_dec_value(pool, y, &es[n].value, depth + 1))
				n++;
		}
		out->kind = AMQP_FIELD_KIND_TABLE;
		out->value.table.num_entries = n;
		out->value.table.entries = es;
		return true;
	}
	if (strcmp(tag, "$array") == 0 && json_is_array(x)) {
		size_t cap = json_array_size(x), i;
		amqp_field_value_t *es = amqp_pool_alloc(pool, (cap > 0 ? cap : 1) * sizeof *es);
		json_t *y;
		int n = 0;

		if (es == NULL)
			return false;
		json_array_foreach(x, i, y) {
			if (props_dec_value(pool, y, &es[n], depth + 1))
				n++;
		}
		out->kind = AMQP_FIELD_KIND_ARRAY;
		out->value.array.num_entries = n;
		out->value.array.entries = es;
		return true;
	}
	return false;
}

int props_build(struct props_out *o, const struct mq_message *msg)
{
	amqp_basic_properties_t *p = &o->p;
	int n = 0;

	memset(p, 0, sizeof *p);
	o->saved = NULL;
	init_amqp_pool(&o->pool, 4096);
	p->_flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG;
	p->delivery_mode = AMQP_DELIVERY_PERSISTENT;
	p->content_type = amqp_cstring_bytes("application/json");
	if (msg->props_json != NULL) {
		json_error_t jerr;
		json_t *hs;
		const char *k;
		json_t *v;
		/* Saved headers first, ours after them, all in the array. */
		int keep = PROPS_HEADERS_MAX - msg->nheaders - 1;

		o->saved = json_loads(msg->props_json, JSON_ALLOW_NUL, &jerr);
		if (o->saved == NULL || !json_is_object(o->saved))
			return ST_ERR_INVALID;
		props_set_str(&o->pool, &p->content_type, &p->_flags, AMQP_BASIC_CONTENT_TYPE_FLAG,
		                 json_object_get(o->saved, "content_type"));
		props_set_str(&o->pool, &p->message_id, &p->_flags, AMQP_BASIC_MESSAGE_ID_FLAG,
		                 json_object_get(o->saved, "message_id"));
		props_set_str(&o->pool, &p->type, &p->_flags, AMQP_BASIC_TYPE_FLAG, json_object_get(o->saved, "type"));
		props_set_str(&o->pool, &p->correlation_id, &p->_flags, AMQP_BASIC_CORRELATION_ID_FLAG,
		                 json_object_get(o->saved, "correlation_id"));
		props_set_str(&o->pool, &p->app_id, &p->_flags, AMQP_BASIC_APP_ID_FLAG,
		                 json_object_get(o->saved, "app_id"));
		v = json_object_get(o->saved, "timestamp");
		if (json_is_integer(v)) {
			p->timestamp = (uint64_t)json_integer_value(v);
			p->_flags |= AMQP_BASIC_TIMESTAMP_FLAG;
		}
		if (keep > MQ_HEADERS_KEEP)
			keep = MQ_HEADERS_KEEP;
		hs = json_object_get(o->saved, "headers");
		json_object_foreach(hs, k, v) {
			amqp_table_entry_t *e = &o->h[n];
			if (n >= keep)
				break;
			/* Broker bookkeeping of the original delivery is not ours to
			 * copy into a new message, nor our headers of an earlier
			 * dead-lettering (deadletter.h). */
			if (strcmp(k, "x-delivery-count") == 0 || strncmp(k, DEADLETTER_PREFIX, sizeof DEADLETTER_PREFIX - 1) == 0)
				continue;
			e->key = amqp_cstring_bytes(k);
			if (props_dec_value(&o->pool, v, &e->value, 0))
				n++;
		}
	}
	if (msg->message_id != NULL) {
		p->message_id = amqp_cstring_bytes(msg->message_id);
		p->_flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
	}
	if (msg->type != NULL) {
		p->type = amqp_cstring_bytes(msg->type);
		p->_flags |= AMQP_BASIC_TYPE_FLAG;
	}
	for (int i = 0; i < msg->nheaders && n < PROPS_HEADERS_MAX; i++, n++) {
		o->h[n].key = amqp_cstring_bytes(msg->headers[i].key);
		o->h[n].value.kind = AMQP_FIELD_KIND_UTF8;
		o->h[n].value.value.bytes = amqp_cstring_bytes(msg->headers[i].value);
	}
	if (msg->published_us > 0 && n < PROPS_HEADERS_MAX) {
		/* An integer header: the worker reads it as a number. */
		o->h[n].key = amqp_cstring_bytes(MQ_HEADER_PUBLISHED_US);
		o->h[n].value.kind = AMQP_FIELD_KIND_I64;
		o->h[n].value.value.i64 = msg->published_us;
		n++;
	}
	if (n > 0) {
		p->headers.num_entries = n;
		p->headers.entries = o->h;
		p->_flags |= AMQP_BASIC_HEADERS_FLAG;
	}
	return ST_OK;
}

void props_out_release(struct props_out *o)
{
	json_decref(o->saved);
	o->saved = NULL;
	empty_amqp_pool(&o->pool);
}

int props_json_wire(const char *props_json, void *buf, size_t cap, size_t *len)
{
	struct mq_message msg = { .props_json = props_json };
	amqp_bytes_t out = { .len = cap, .bytes = buf };
	struct props_out o;
	int rc = props_build(&o, &msg);

	if (rc == ST_OK) {
		int n = amqp_encode_properties(AMQP_BASIC_CLASS, &o.p, out);
		if (n < 0)
			rc = ST_ERR_INVALID;
		else
			*len = (size_t)n;
	}
	props_out_release(&o);
	return rc;
}
