/*
 * test_mq.c - the properties-to-JSON conversion without a broker: whatever
 * a producer sends, mq_delivery_props_json returns bounded JSON that parses,
 * the same JSON for the same input, and a note (ASCII) naming what it
 * escaped or dropped (common/props.c, through mq.h's entry points).  The
 * restore side is exercised through the broker in test_poison.c and
 * test_mq_live.c.
 */
#include <criterion/criterion.h>
#include <amqp.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mq.h"

static const unsigned char NOT_UTF8[] = { 0xff, 0xfe, 0x00, 0x41 };

static amqp_field_value_t fv_str(uint8_t kind, const void *p, size_t len)
{
	amqp_field_value_t v = { .kind = kind };
	v.value.bytes.bytes = (void *)p;
	v.value.bytes.len = len;
	return v;
}

/* Convert, check the invariants every result must meet, return the JSON
 * (caller frees) and the note. */
static char *convert(amqp_message_t *msg, char *note, size_t cap)
{
	struct mq_delivery d;
	char *a, *b, again[512], kept[512];
	json_error_t err;
	json_t *o;

	memset(&d, 0, sizeof d);
	d.priv = msg;
	a = mq_delivery_props_json_note(&d, note, cap);
	cr_assert_not_null(a, "never NULL for what a producer sent");
	cr_assert_leq(strlen(a), MQ_PROPS_JSON_MAX, "bounded: %zu bytes", strlen(a));
	o = json_loads(a, JSON_ALLOW_NUL, &err);
	cr_assert_not_null(o, "parses: %s", err.text);
	json_decref(o);
	b = mq_delivery_props_json_note(&d, again, sizeof again);
	cr_assert_str_eq(a, b, "deterministic");
	cr_assert_str_eq(note, again);
	free(b);
	for (const char *p = note; *p; p++)
		cr_assert((unsigned char)*p >= 0x20 && (unsigned char)*p < 0x7f, "the note is printable ASCII: %s", note);
	mq_props_json_note(a, kept, sizeof kept);
	cr_assert_str_eq(kept, note, "the note travels inside the JSON");
	return a;
}

Test(mq, plain_properties_are_kept_as_they_are)
{
	amqp_message_t msg = { 0 };
	amqp_table_entry_t h[2] = {
		{ .key = amqp_cstring_bytes("k"), .value = fv_str(AMQP_FIELD_KIND_UTF8, "v", 1) },
		{ .key = amqp_cstring_bytes("n"), .value = { .kind = AMQP_FIELD_KIND_I32, .value.i32 = 7 } },
	};
	char note[400], *j;

	msg.properties._flags = AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_HEADERS_FLAG;
	msg.properties.message_id = amqp_cstring_bytes("m-1");
	msg.properties.headers = (amqp_table_t){ .num_entries = 2, .entries = h };
	j = convert(&msg, note, sizeof note);
	cr_expect_str_eq(j, "{\"message_id\":\"m-1\",\"headers\":{\"k\":\"v\",\"n\":7}}");
	cr_expect_str_eq(note, "");
	free(j);
}

Test(mq, bytes_that_are_not_utf8_are_escaped_and_named)
{
	amqp_message_t msg = { 0 };
	amqp_table_entry_t h[2] = {
		{ .key = amqp_cstring_bytes("trace"), .value = fv_str(AMQP_FIELD_KIND_BYTES, NOT_UTF8, sizeof NOT_UTF8) },
		{ .key = amqp_cstring_bytes("text"), .value = fv_str(AMQP_FIELD_KIND_UTF8, "\xc3\x28", 2) },
	};
	char note[400], *j;

	msg.properties._flags = AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_TYPE_FLAG;
	msg.properties.type = (amqp_bytes_t){ .len = 2, .bytes = (void *)"\x80\x80" };
	msg.properties.headers = (amqp_table_t){ .num_entries = 2, .entries = h };
	j = convert(&msg, note, sizeof note);
	cr_expect(strstr(j, "\"trace\":{\"$bytes\":\"//4AQQ==\"}") != NULL, "%s", j);
	cr_expect(strstr(j, "\"text\":{\"$utf8b64\":") != NULL, "%s", j);
	cr_expect(strstr(j, "\"type\":{\"$bytes\":") != NULL, "%s", j);
	cr_expect_str_eq(note, "escaped (not UTF-8, kept as base64): type, trace, text");
	free(j);
}

Test(mq, what_cannot_be_kept_is_dropped_and_named)
{
	amqp_message_t msg = { 0 };
	amqp_table_entry_t h[6];
	char note[400], *j;

	h[0] = (amqp_table_entry_t){ .key = { .len = 2, .bytes = (void *)"\xff\x01" },
	                             .value = fv_str(AMQP_FIELD_KIND_UTF8, "a", 1) };
	h[1] = (amqp_table_entry_t){ .key = amqp_cstring_bytes("dup"), .value = fv_str(AMQP_FIELD_KIND_UTF8, "1", 1) };
	h[2] = (amqp_table_entry_t){ .key = amqp_cstring_bytes("dup"), .value = fv_str(AMQP_FIELD_KIND_UTF8, "2", 1) };
	h[3] = (amqp_table_entry_t){ .key = amqp_cstring_bytes("nan"),
	                             .value = { .kind = AMQP_FIELD_KIND_F64, .value.f64 = NAN } };
	h[4] = (amqp_table_entry_t){ .key = amqp_cstring_bytes("u"),
	                             .value = { .kind = AMQP_FIELD_KIND_U64, .value.u64 = UINT64_MAX } };
	h[5] = (amqp_table_entry_t){ .key = amqp_cstring_bytes("odd"), .value = { .kind = 'Z' } };
	msg.properties._flags = AMQP_BASIC_HEADERS_FLAG;
	msg.properties.headers = (amqp_table_t){ .num_entries = 6, .entries = h };
	j = convert(&msg, note, sizeof note);
	cr_expect_str_eq(j, "{\"headers\":{\"dup\":\"1\"},\"inbox_note\":\"dropped: ?? (key not UTF-8), dup (repeated key),"
	                    " nan (not a finite number), u (unsigned 64-bit), odd (unknown field kind 0x5a)\"}");
	free(j);
}

/* Nesting past the limit, a table that refers deeper and deeper. */
Test(mq, deep_nesting_is_cut)
{
	enum { DEPTH = 20 };
	amqp_message_t msg = { 0 };
	amqp_table_entry_t e[DEPTH];
	char note[400], *j;

	for (int i = 0; i < DEPTH; i++) {
		e[i].key = amqp_cstring_bytes("t");
		if (i + 1 < DEPTH) {
			e[i].value.kind = AMQP_FIELD_KIND_TABLE;
			e[i].value.value.table = (amqp_table_t){ .num_entries = 1, .entries = &e[i + 1] };
		} else {
			e[i].value = fv_str(AMQP_FIELD_KIND_UTF8, "leaf", 4);
		}
	}
	msg.properties._flags = AMQP_BASIC_HEADERS_FLAG;
	msg.properties.headers = (amqp_table_t){ .num_entries = 1, .entries = e };
	j = convert(&msg, note, sizeof note);
	cr_expect(strstr(note, "nested too deep") != NULL, "%s", note);
	cr_expect(strstr(j, "leaf") == NULL);
	free(j);
}

/* Far more than fits: many headers, each large; the total stays bounded
 * and the note stays one short line. */
Test(mq, size_is_bounded_whatever_comes)
{
	enum { NH = 400 };
	static char big[MQ_PROPS_JSON_MAX];
	static char keys[NH][8];
	static amqp_table_entry_t h[NH];
	amqp_message_t msg = { 0 };
	char note[400], *j;
	json_t *o;

	memset(big, '\x01', sizeof big); /* control bytes: six JSON bytes each */
	for (int i = 0; i < NH; i++) {
		snprintf(keys[i], sizeof keys[i], "h%03d", i);
		h[i].key = amqp_cstring_bytes(keys[i]);
		h[i].value = fv_str(AMQP_FIELD_KIND_UTF8, big, i % 2 == 0 ? 4000 : sizeof big);
	}
	msg.properties._flags = AMQP_BASIC_HEADERS_FLAG;
	msg.properties.headers = (amqp_table_t){ .num_entries = NH, .entries = h };
	j = convert(&msg, note, sizeof note);
	cr_expect(strstr(note, "over the size limit of all properties") != NULL, "%s", note);
	cr_expect(strstr(note, "more") != NULL, "%s", note);
	cr_expect_lt(strlen(note), 400);
	o = json_loads(j, 0, NULL);
	cr_expect_gt(json_object_size(json_object_get(o, "headers")), 0, "something is kept");
	cr_expect_null(json_object_get(json_object_get(o, "headers"), "h060"), "nothing past the first 60 headers");
	json_decref(o);
	free(j);
}

Test(mq, headers_past_the_limit_are_dropped_and_counted)
{
	enum { NH = 100 };
	static char keys[NH][8];
	static amqp_table_entry_t h[NH];
	amqp_message_t msg = { 0 };
	char note[400], *j;
	json_t *o;

	for (int i = 0; i < NH; i++) {
		snprintf(keys[i], sizeof keys[i], "h%03d", i);
		h[i].key = amqp_cstring_bytes(keys[i]);
		h[i].value = fv_str(AMQP_FIELD_KIND_UTF8, "v", 1);
	}
	msg.properties._flags = AMQP_BASIC_HEADERS_FLAG;
	msg.properties.headers = (amqp_table_t){ .num_entries = NH, .entries = h };
	j = convert(&msg, note, sizeof note);
	cr_expect_str_eq(note, "dropped: headers (40 headers past the first 60)");
	o = json_loads(j, 0, NULL);
	cr_expect_eq(json_object_size(json_object_get(o, "headers")), MQ_HEADERS_KEEP);
	json_decref(o);
	free(j);
}

/* A decoder may hand empty strings and keys as NULL pointers. */
Test(mq, empty_values_with_null_pointers)
{
	amqp_message_t msg = { 0 };
	amqp_table_entry_t h[2] = {
		{ .key = amqp_cstring_bytes("e"), .value = { .kind = AMQP_FIELD_KIND_BYTES } },
		{ .key = { .len = 0, .bytes = NULL }, .value = { .kind = AMQP_FIELD_KIND_UTF8 } },
	};
	char note[400], *j;

	msg.properties._flags = AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_APP_ID_FLAG;
	msg.properties.app_id = (amqp_bytes_t){ .len = 0, .bytes = NULL };
	msg.properties.headers = (amqp_table_t){ .num_entries = 2, .entries = h };
	j = convert(&msg, note, sizeof note);
	cr_expect_str_eq(j, "{\"app_id\":\"\",\"headers\":{\"e\":{\"$bytes\":\"\"}},\"inbox_note\":\"dropped:  (empty key)\"}");
	free(j);
}

/* A queue that is only read by browsing (the DLQ, the verifier's queue)
 * must never drop a message for having been read.  On a quorum queue every
 * read that hands a message back counts toward its delivery limit (3.x,
 * 4.0-4.2 every return; 4.3 one whose reader went away), and 4.0 gave
 * quorum queues a default limit of 20: such a queue is declared with
 * x-delivery-limit -1 ("unlimited", 4.0 and later).  On 3.x no limit is
 * the default, and -1 is no "unlimited" there: 3.10 compares count >
 * limit, so -1 drops a message at its first return (seen on 3.10.8: one
 * basic.get + nack, and the queue was empty); it gets none. */
Test(mq, a_browsed_quorum_queue_is_unlimited_on_4x_and_left_without_limit_on_3x)
{
	int64_t limit = 0;

	cr_assert(mq_browsed_queue_limit("4.0.5", &limit));
	cr_expect_eq(limit, -1);
	cr_assert(mq_browsed_queue_limit("4.2.1", &limit));
	cr_assert(mq_browsed_queue_limit("10.0.0", &limit));
	cr_expect(!mq_browsed_queue_limit("3.10.8", &limit));
	cr_expect(!mq_browsed_queue_limit("3.13.7", &limit));
	/* Unknown: the 3.x rule, since -1 there is the worst outcome. */
	cr_expect(!mq_browsed_queue_limit("", &limit));
	cr_expect(!mq_browsed_queue_limit(NULL, &limit));
	cr_expect(!mq_browsed_queue_limit("x.y", &limit));
}
