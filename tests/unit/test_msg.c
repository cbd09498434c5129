/*
 * test_msg.c - msg_parse against every class of bad input, with the exact
 * dead-letter reason each must get, and the canonical payload hash.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msg.h"

#define MAX_BODY 65536

static enum msg_reason parse_props(const char *body, const struct msg_props *props, struct msg *m)
{
	return msg_parse(body, strlen(body), MAX_BODY, props, m);
}

static enum msg_reason parse(const char *body, struct msg *m)
{
	return parse_props(body, NULL, m);
}

/* The reason for body, with a failure message that shows the detail. */
static void expect(const char *body, enum msg_reason want)
{
	struct msg m;
	enum msg_reason got = parse(body, &m);

	cr_expect_eq(got, want, "body %s: got %s (%s), want %s", body, msg_reason_name(got),
	             m.detail, msg_reason_name(want));
	if (want != MSG_REASON_NONE)
		cr_expect_neq(m.detail[0], '\0', "body %s: no detail", body);
}

static void hex_of(const char *body, char hex[65])
{
	struct msg m;

	cr_assert_eq(parse(body, &m), MSG_REASON_NONE, "body %s: %s", body, m.detail);
	msg_sha256_hex(m.sha256, hex);
}

/* A valid body whose object/array nesting is exactly depth levels (the
 * root object counts as one). */
static char *nested_body(int depth)
{
	static const char head[] = "{\"message_id\":\"m-1\",\"type\":\"OrderCreated\","
	                            "\"order_id\":\"o-1\",\"x\":";
	size_t inner = (size_t)(depth - 1);
	size_t n = sizeof head - 1 + 2 * inner + 2;
	char *b = malloc(n);
	size_t i = 0;

	cr_assert_not_null(b);
	memcpy(b, head, sizeof head - 1);
	i = sizeof head - 1;
	if (inner == 0)
		b[i++] = '0';
	for (size_t k = 0; k < inner; k++)
		b[i++] = '[';
	for (size_t k = 0; k < inner; k++)
		b[i++] = ']';
	b[i++] = '}';
	b[i] = '\0';
	return b;
}

/* ---- good messages ------------------------------------------------------- */

/* data.amount_cents as the order definition keeps it (PaymentAuthorized's
 * sets), 0 when the message does not carry it. */
static int64_t amount_of(const struct msg *m)
{
	const struct msg_val *v = msg_value(m, "amount_cents");

	return v != NULL ? v->i : 0;
}

Test(msg, full_example_parses_every_field)
{
	struct msg m;
	const char *body = "{\n  \"message_id\": \"5b0d9f6e-2c1a-4d3e-9a55-0c6d1e2f3a4b\",\n"
	                   "  \"source\": \"payments\",\n  \"type\": \"PaymentAuthorized\",\n"
	                   "  \"order_id\": \"o-000123\",\n  \"occurred_at\": \"2026-11-29T18:00:00Z\",\n"
	                   "  \"data\": { \"amount_cents\": 4200 }\n}";

	cr_assert_eq(parse(body, &m), MSG_REASON_NONE, "%s", m.detail);
	cr_expect_str_eq(m.message_id, "5b0d9f6e-2c1a-4d3e-9a55-0c6d1e2f3a4b");
	cr_expect_str_eq(m.source, "payments");
	cr_expect_str_eq(m.type_name, "PaymentAuthorized");
	cr_expect_eq(m.type, MSG_PAYMENT_AUTHORIZED);
	cr_expect_str_eq(m.order_id, "o-000123");
	cr_expect_str_eq(m.occurred_at, "2026-11-29T18:00:00Z");
	cr_expect_eq(amount_of(&m), 4200);
	cr_expect_str_eq(m.detail, "");
}

Test(msg, optional_fields_default_when_absent_or_null)
{
	struct msg m;

	cr_assert_eq(parse("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\"}", &m),
	             MSG_REASON_NONE);
	cr_expect_str_eq(m.source, "");
	cr_expect_str_eq(m.occurred_at, "");
	cr_expect_eq(amount_of(&m), 0);
	cr_assert_eq(parse("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\","
	                   "\"source\":null,\"occurred_at\":null,\"data\":null}", &m),
	             MSG_REASON_NONE, "%s", m.detail);
	cr_expect_str_eq(m.source, "");
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"source\":\"\"}",
	       MSG_REASON_NONE);
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"data\":{}}",
	       MSG_REASON_NONE);
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\","
	       "\"data\":{\"amount_cents\":0,\"note\":[1,\"x\"]}}", MSG_REASON_NONE);
}

Test(msg, unknown_top_level_fields_are_allowed)
{
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"v\":2,"
	       "\"trace\":{\"id\":\"t\"}}", MSG_REASON_NONE);
}

Test(msg, message_id_only_in_property)
{
	struct msg m;
	struct msg_props p = { .message_id = "prop-id-1XYZ", .message_id_len = 9 };

	cr_assert_eq(parse_props("{\"type\":\"OrderCreated\",\"order_id\":\"o\"}", &p, &m),
	             MSG_REASON_NONE, "%s", m.detail);
	cr_expect_str_eq(m.message_id, "prop-id-1");
}

Test(msg, type_only_in_property)
{
	struct msg m;
	struct msg_props p = { .type = "ShipmentCreated", .type_len = 15 };

	cr_assert_eq(parse_props("{\"message_id\":\"m\",\"order_id\":\"o\"}", &p, &m),
	             MSG_REASON_NONE, "%s", m.detail);
	cr_expect_eq(m.type, MSG_SHIPMENT_CREATED);
	cr_expect_str_eq(m.type_name, "ShipmentCreated");
}

Test(msg, equal_property_and_body_are_accepted)
{
	struct msg m;
	struct msg_props p = { "m-1", 3, "OrderCancelled", 14, NULL };

	cr_assert_eq(parse_props("{\"message_id\":\"m-1\",\"type\":\"OrderCancelled\","
	                         "\"order_id\":\"o\"}", &p, &m), MSG_REASON_NONE, "%s", m.detail);
	cr_expect_eq(m.type, MSG_ORDER_CANCELLED);
}

Test(msg, empty_property_counts_as_absent)
{
	struct msg m;
	struct msg_props p = { "", 0, "", 0, NULL };

	cr_expect_eq(parse_props("{\"message_id\":\"m-1\",\"type\":\"OrderCreated\","
	                         "\"order_id\":\"o\"}", &p, &m), MSG_REASON_NONE, "%s", m.detail);
	cr_expect_eq(parse_props("{\"type\":\"OrderCreated\",\"order_id\":\"o\"}", &p, &m),
	             MSG_REASON_MISSING_FIELD);
}

Test(msg, payment_confirmed_is_payment_authorized_keeping_its_name)
{
	struct msg m;

	cr_assert_eq(parse("{\"message_id\":\"m\",\"type\":\"PaymentConfirmed\",\"order_id\":\"o\"}", &m),
	             MSG_REASON_NONE);
	cr_expect_eq(m.type, MSG_PAYMENT_AUTHORIZED);
	cr_expect_str_eq(m.type_name, "PaymentConfirmed");
}

Test(msg, every_event_type_parses)
{
	static const char *const names[] = { "OrderCreated", "PaymentAuthorized", "PaymentConfirmed",
		                             "InventoryReserved", "ShipmentCreated", "OrderCancelled" };
	static const enum msg_type types[] = { MSG_ORDER_CREATED, MSG_PAYMENT_AUTHORIZED,
		                               MSG_PAYMENT_AUTHORIZED, MSG_INVENTORY_RESERVED,
		                               MSG_SHIPMENT_CREATED, MSG_ORDER_CANCELLED };
	char body[256];
	struct msg m;

	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		snprintf(body, sizeof body, "{\"message_id\":\"m\",\"type\":\"%s\",\"order_id\":\"o\"}",
		         names[i]);
		cr_assert_eq(parse(body, &m), MSG_REASON_NONE, "%s", names[i]);
		cr_expect_eq(m.type, types[i], "%s", names[i]);
		cr_expect_str_eq(m.type_name, names[i]);
	}
}

Test(msg, body_need_not_be_nul_terminated)
{
	/* The AMQP frame holds no terminator: only len bytes may be read. */
	static const char frame[] = "{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\"}GARBAGE";
	struct msg m;

	cr_expect_eq(msg_parse(frame, sizeof frame - 1 - 7, MAX_BODY, NULL, &m), MSG_REASON_NONE,
	             "%s", m.detail);
}

/* ---- malformed-json ------------------------------------------------------ */

Test(msg, not_json_is_malformed)
{
	expect("hello", MSG_REASON_MALFORMED_JSON);
	expect("", MSG_REASON_MALFORMED_JSON);
	expect("{\"message_id\":\"m\",", MSG_REASON_MALFORMED_JSON);
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\"} x",
	       MSG_REASON_MALFORMED_JSON);
	expect("{'message_id':'m'}", MSG_REASON_MALFORMED_JSON);
}

Test(msg, jansson_error_text_is_in_the_detail)
{
	struct msg m;

	cr_assert_eq(parse("{\"a\":}", &m), MSG_REASON_MALFORMED_JSON);
	cr_expect(strstr(m.detail, "invalid JSON at line 1") != NULL, "%s", m.detail);
	cr_expect_str_eq(m.message_id, "");
}

Test(msg, not_an_object_is_malformed)
{
	struct msg m;

	cr_assert_eq(parse("[{\"message_id\":\"m\"}]", &m), MSG_REASON_MALFORMED_JSON);
	cr_expect_str_eq(m.detail, "body is not a JSON object");
	expect("\"x\"", MSG_REASON_MALFORMED_JSON);
	expect("42", MSG_REASON_MALFORMED_JSON);
	expect("null", MSG_REASON_MALFORMED_JSON);
}

Test(msg, duplicate_keys_are_malformed)
{
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"order_id\":\"p\"}",
	       MSG_REASON_MALFORMED_JSON);
}

Test(msg, invalid_utf8_is_malformed)
{
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"x\":\"\xff\"}",
	       MSG_REASON_MALFORMED_JSON);
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"x\":\"\xc3\x28\"}",
	       MSG_REASON_MALFORMED_JSON);
	/* An overlong encoding of '/' and a lone surrogate escape. */
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"x\":\"\xc0\xaf\"}",
	       MSG_REASON_MALFORMED_JSON);
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"x\":\"\\ud800\"}",
	       MSG_REASON_MALFORMED_JSON);
}

Test(msg, embedded_nul_is_malformed)
{
	static const char body[] = "{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\0\"}";
	struct msg m;

	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\\u0000\"}",
	       MSG_REASON_MALFORMED_JSON);
	cr_expect_eq(msg_parse(body, sizeof body - 1, MAX_BODY, NULL, &m), MSG_REASON_MALFORMED_JSON);
}

Test(msg, integer_beyond_int64_is_malformed)
{
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\","
	       "\"data\":{\"amount_cents\":99999999999999999999}}", MSG_REASON_MALFORMED_JSON);
}

/* ---- missing-field ------------------------------------------------------- */

Test(msg, each_missing_required_field)
{
	expect("{\"type\":\"OrderCreated\",\"order_id\":\"o\"}", MSG_REASON_MISSING_FIELD);
	expect("{\"message_id\":\"m\",\"order_id\":\"o\"}", MSG_REASON_MISSING_FIELD);
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\"}", MSG_REASON_MISSING_FIELD);
	expect("{}", MSG_REASON_MISSING_FIELD);
}

Test(msg, null_required_field_is_missing)
{
	expect("{\"message_id\":null,\"type\":\"OrderCreated\",\"order_id\":\"o\"}",
	       MSG_REASON_MISSING_FIELD);
	expect("{\"message_id\":\"m\",\"type\":null,\"order_id\":\"o\"}", MSG_REASON_MISSING_FIELD);
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":null}",
	       MSG_REASON_MISSING_FIELD);
}

/* ---- invalid-field ------------------------------------------------------- */

Test(msg, wrong_json_type_for_each_field)
{
	expect("{\"message_id\":42,\"type\":\"OrderCreated\",\"order_id\":\"o\"}",
	       MSG_REASON_INVALID_FIELD);
	expect("{\"message_id\":[\"m\"],\"type\":\"OrderCreated\",\"order_id\":\"o\"}",
	       MSG_REASON_INVALID_FIELD);
	expect("{\"message_id\":\"m\",\"type\":7,\"order_id\":\"o\"}", MSG_REASON_INVALID_FIELD);
	expect("{\"message_id\":\"m\",\"type\":true,\"order_id\":\"o\"}", MSG_REASON_INVALID_FIELD);
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":123}",
	       MSG_REASON_INVALID_FIELD);
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":{}}",
	       MSG_REASON_INVALID_FIELD);
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"source\":1}",
	       MSG_REASON_INVALID_FIELD);
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"occurred_at\":"
	       "1764439200}", MSG_REASON_INVALID_FIELD);
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"data\":[]}",
	       MSG_REASON_INVALID_FIELD);
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"data\":\"x\"}",
	       MSG_REASON_INVALID_FIELD);
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"data\":"
	       "{\"amount_cents\":\"4200\"}}", MSG_REASON_INVALID_FIELD);
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"data\":"
	       "{\"amount_cents\":42.5}}", MSG_REASON_INVALID_FIELD);
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"data\":"
	       "{\"amount_cents\":4200.0}}", MSG_REASON_INVALID_FIELD);
}

Test(msg, negative_amount_is_invalid)
{
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"data\":"
	       "{\"amount_cents\":-1}}", MSG_REASON_INVALID_FIELD);
}

Test(msg, bad_characters_are_invalid)
{
	expect("{\"message_id\":\"m 1\",\"type\":\"OrderCreated\",\"order_id\":\"o\"}",
	       MSG_REASON_INVALID_FIELD);
	expect("{\"message_id\":\"m/1\",\"type\":\"OrderCreated\",\"order_id\":\"o\"}",
	       MSG_REASON_INVALID_FIELD);
	expect("{\"message_id\":\"m\xc3\xa9\",\"type\":\"OrderCreated\",\"order_id\":\"o\"}",
	       MSG_REASON_INVALID_FIELD);
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o#1\"}",
	       MSG_REASON_INVALID_FIELD);
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"source\":"
	       "\"pay ments\"}", MSG_REASON_INVALID_FIELD);
}

Test(msg, empty_ids_are_invalid)
{
	expect("{\"message_id\":\"\",\"type\":\"OrderCreated\",\"order_id\":\"o\"}",
	       MSG_REASON_INVALID_FIELD);
	expect("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"\"}",
	       MSG_REASON_INVALID_FIELD);
}

Test(msg, id_length_bounds)
{
	char id[200];
	char body[600];

	memset(id, 'a', sizeof id);
	id[128] = '\0';
	snprintf(body, sizeof body, "{\"message_id\":\"%s\",\"type\":\"OrderCreated\",\"order_id\":\"o\"}", id);
	expect(body, MSG_REASON_NONE);
	id[128] = 'a';
	id[129] = '\0';
	snprintf(body, sizeof body, "{\"message_id\":\"%s\",\"type\":\"OrderCreated\",\"order_id\":\"o\"}", id);
	expect(body, MSG_REASON_INVALID_FIELD);

	id[64] = '\0';
	snprintf(body, sizeof body, "{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"%s\","
	         "\"source\":\"%s\"}", id, id);
	expect(body, MSG_REASON_NONE);
	id[64] = 'a';
	id[65] = '\0';
	snprintf(body, sizeof body, "{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"%s\"}", id);
	expect(body, MSG_REASON_INVALID_FIELD);
	snprintf(body, sizeof body, "{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\","
	         "\"source\":\"%s\"}", id);
	expect(body, MSG_REASON_INVALID_FIELD);
}

Test(msg, property_id_is_validated_too)
{
	struct msg m;
	struct msg_props p = { .message_id = "bad id", .message_id_len = 6 };

	cr_expect_eq(parse_props("{\"type\":\"OrderCreated\",\"order_id\":\"o\"}", &p, &m),
	             MSG_REASON_INVALID_FIELD);
	cr_expect_str_eq(m.message_id, "");
}

Test(msg, message_id_property_must_equal_body)
{
	struct msg m;
	struct msg_props p = { .message_id = "a", .message_id_len = 1 };

	cr_assert_eq(parse_props("{\"message_id\":\"b\",\"type\":\"OrderCreated\",\"order_id\":\"o\"}",
	                         &p, &m), MSG_REASON_INVALID_FIELD);
	cr_expect_str_eq(m.detail, "message_id property 'a' differs from body 'b'");
}

Test(msg, type_property_must_equal_body)
{
	struct msg m;
	struct msg_props p = { .type = "OrderCreated", .type_len = 12 };

	cr_assert_eq(parse_props("{\"message_id\":\"m\",\"type\":\"OrderCancelled\",\"order_id\":\"o\"}",
	                         &p, &m), MSG_REASON_INVALID_FIELD);
	cr_expect_str_eq(m.detail, "type property 'OrderCreated' differs from body 'OrderCancelled'");
	/* PaymentConfirmed and PaymentAuthorized name one event but are not
	 * the same string: the producer contradicts itself. */
	p = (struct msg_props){ .type = "PaymentConfirmed", .type_len = 16 };
	cr_expect_eq(parse_props("{\"message_id\":\"m\",\"type\":\"PaymentAuthorized\",\"order_id\":\"o\"}",
	                         &p, &m), MSG_REASON_INVALID_FIELD);
}

Test(msg, nesting_32_levels_is_allowed)
{
	char *b = nested_body(MSG_MAX_DEPTH);

	expect(b, MSG_REASON_NONE);
	free(b);
}

Test(msg, nesting_33_and_40_levels_is_invalid_field)
{
	char *b = nested_body(MSG_MAX_DEPTH + 1);

	expect(b, MSG_REASON_INVALID_FIELD);
	free(b);
	b = nested_body(40);
	expect(b, MSG_REASON_INVALID_FIELD);
	free(b);
}

Test(msg, nesting_5000_levels_is_malformed_json)
{
	/* jansson stops at its own limit (2048) before we see a tree. */
	char *b = nested_body(5000);
	struct msg m;

	cr_expect_eq(parse(b, &m), MSG_REASON_MALFORMED_JSON, "%s", m.detail);
	cr_expect(strstr(m.detail, "maximum parsing depth") != NULL, "%s", m.detail);
	free(b);
}

Test(msg, nesting_inside_data_counts)
{
	/* root(1) data(2) + 31 arrays = 33 */
	char body[512];
	int n = snprintf(body, sizeof body,
	                 "{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"data\":{\"x\":");

	for (int i = 0; i < 31; i++)
		body[n++] = '[';
	for (int i = 0; i < 31; i++)
		body[n++] = ']';
	body[n++] = '}';
	body[n++] = '}';
	body[n] = '\0';
	expect(body, MSG_REASON_INVALID_FIELD);
}

Test(msg, occurred_at_forms)
{
	static const char *const good[] = {
		"2026-11-29T18:00:00Z", "2026-11-29t18:00:00z", "2026-11-29T18:00:00.123Z",
		"2026-11-29T18:00:00.123456789+05:30", "2026-11-29T18:00:00-08:00",
		"2024-02-29T00:00:00Z", "2016-12-31T23:59:60Z", "2000-02-29T00:00:00Z",
	};
	static const char *const bad[] = {
		"", "2026-11-29", "2026-11-29T18:00:00", "2026-11-29 18:00:00Z",
		"2026-13-01T00:00:00Z", "2026-00-01T00:00:00Z", "2026-02-29T00:00:00Z",
		"1900-02-29T00:00:00Z", "2026-04-31T00:00:00Z", "2026-11-00T00:00:00Z",
		"2026-11-29T24:00:00Z", "2026-11-29T18:60:00Z", "2026-11-29T18:00:61Z",
		"2026-11-29T18:00:00.Z", "2026-11-29T18:00:00+2:00", "2026-11-29T18:00:00+0200",
		"2026-11-29T18:00:00+24:00", "2026-11-29T18:00:00Z ", "2026-1-29T18:00:00Z",
		"+2026-11-29T18:00:00Z", "2026-11-29T18:00:00.12345678901234567890Z",
		"2026-11-29T18:00:00ZZ", "yesterday",
	};
	char body[256];

	for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
		snprintf(body, sizeof body, "{\"message_id\":\"m\",\"type\":\"OrderCreated\","
		         "\"order_id\":\"o\",\"occurred_at\":\"%s\"}", good[i]);
		expect(body, MSG_REASON_NONE);
	}
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		snprintf(body, sizeof body, "{\"message_id\":\"m\",\"type\":\"OrderCreated\","
		         "\"order_id\":\"o\",\"occurred_at\":\"%s\"}", bad[i]);
		expect(body, MSG_REASON_INVALID_FIELD);
	}
}

/* ---- unknown-type, too-large --------------------------------------------- */

Test(msg, unknown_type)
{
	struct msg m;

	expect("{\"message_id\":\"m\",\"type\":\"OrderShipped\",\"order_id\":\"o\"}",
	       MSG_REASON_UNKNOWN_TYPE);
	expect("{\"message_id\":\"m\",\"type\":\"ordercreated\",\"order_id\":\"o\"}",
	       MSG_REASON_UNKNOWN_TYPE);
	expect("{\"message_id\":\"m\",\"type\":\"\",\"order_id\":\"o\"}", MSG_REASON_UNKNOWN_TYPE);
	cr_assert_eq(parse("{\"message_id\":\"m\",\"type\":\"OrderCreatedXXXXXXXXXXXXXXXXXXXXXXXXXXXX"
	                   "XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX\",\"order_id\":\"o\"}", &m),
	             MSG_REASON_UNKNOWN_TYPE);
	cr_expect(strlen(m.detail) < MSG_DETAIL_MAX);
}

Test(msg, too_large_is_checked_before_parsing)
{
	static const char body[] = "{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\"}";
	struct msg m;

	cr_assert_eq(msg_parse(body, sizeof body - 1, sizeof body - 2, NULL, &m), MSG_REASON_TOO_LARGE);
	cr_expect_str_eq(m.detail, "body of 55 bytes exceeds INBOX_MAX_BODY (54)");
	cr_expect_str_eq(m.message_id, "");
	cr_expect_eq(msg_parse(body, sizeof body - 1, sizeof body - 1, NULL, &m), MSG_REASON_NONE);
	/* Not even looked at: garbage over the limit is too-large, not malformed. */
	cr_expect_eq(msg_parse("\xff\xff\xff", 3, 2, NULL, &m), MSG_REASON_TOO_LARGE);
}

/* ---- logging context and detail ------------------------------------------ */

Test(msg, message_id_is_kept_when_a_later_field_fails)
{
	struct msg m;

	cr_assert_eq(parse("{\"message_id\":\"keep-me\",\"type\":\"Nope\",\"order_id\":\"o\"}", &m),
	             MSG_REASON_UNKNOWN_TYPE);
	cr_expect_str_eq(m.message_id, "keep-me");
	cr_assert_eq(parse("{\"message_id\":\"keep-me\",\"type\":\"OrderCreated\"}", &m),
	             MSG_REASON_MISSING_FIELD);
	cr_expect_str_eq(m.message_id, "keep-me");
	cr_assert_eq(parse("{\"message_id\":\"bad id\",\"type\":\"OrderCreated\",\"order_id\":\"o\"}", &m),
	             MSG_REASON_INVALID_FIELD);
	cr_expect_str_eq(m.message_id, "");
}

Test(msg, detail_is_one_printable_bounded_line)
{
	char body[1024];
	char id[300];
	struct msg m;

	memset(id, 'x', sizeof id);
	id[299] = '\0';
	snprintf(body, sizeof body, "{\"message_id\":\"a\\nb\\u0001%s\",\"type\":\"OrderCreated\","
	         "\"order_id\":\"o\"}", id);
	cr_assert_eq(parse(body, &m), MSG_REASON_INVALID_FIELD);
	cr_expect(strlen(m.detail) < MSG_DETAIL_MAX);
	for (const char *p = m.detail; *p; p++)
		cr_expect(*p >= 0x20 && *p <= 0x7e, "byte 0x%02x in detail", (unsigned char)*p);
	cr_expect(strstr(m.detail, "...") != NULL, "%s", m.detail);
	cr_assert_eq(parse("{\"x\":\"\xe2\x82\xac\" \x01}", &m), MSG_REASON_MALFORMED_JSON);
	for (const char *p = m.detail; *p; p++)
		cr_expect(*p >= 0x20 && *p <= 0x7e, "byte 0x%02x in detail", (unsigned char)*p);
}

/* ---- the canonical hash -------------------------------------------------- */

Test(msg, hash_known_answer)
{
	/* printf '%s' '{"data":{"amount_cents":4200,"currency":"EUR"},"message_id":"m-1",
	 * "order_id":"o-1","type":"PaymentAuthorized"}' | sha256sum */
	static const char want[] = "f0fa0deb8396960d06ccb53e732a4e716c231e1592cf744a6bfa208e8c2b498a";
	char hex[65];

	hex_of("{\"data\":{\"amount_cents\":4200,\"currency\":\"EUR\"},\"message_id\":\"m-1\","
	       "\"order_id\":\"o-1\",\"type\":\"PaymentAuthorized\"}", hex);
	cr_expect_str_eq(hex, want);
	hex_of("{ \"type\" : \"PaymentAuthorized\",\n\t\"order_id\": \"o-1\", \"message_id\":\"m-1\",\r\n"
	       "  \"data\": {\"currency\": \"EUR\", \"amount_cents\": 4200} }\n", hex);
	cr_expect_str_eq(hex, want);
}

Test(msg, hash_ignores_whitespace_and_key_order)
{
	char a[65], b[65], c[65];

	hex_of("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\","
	       "\"data\":{\"b\":[1,{\"y\":2,\"x\":1}],\"a\":\"\\u00e9\"}}", a);
	hex_of("  {\"data\" : { \"a\" : \"\xc3\xa9\" , \"b\" : [ 1 , { \"x\" : 1 , \"y\" : 2 } ] } ,\n"
	       "\"order_id\":\"o\" , \"type\":\"OrderCreated\", \"message_id\" : \"m\"}  ", b);
	hex_of("{\"order_id\":\"o\",\"message_id\":\"m\",\"data\":{\"a\":\"\xc3\xa9\","
	       "\"b\":[1,{\"x\":1,\"y\":2}]},\"type\":\"OrderCreated\"}", c);
	cr_expect_str_eq(a, b);
	cr_expect_str_eq(a, c);
}

Test(msg, hash_changes_with_any_value)
{
	char base[65], h[65];

	hex_of("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"data\":{\"amount_cents\":1}}",
	       base);
	hex_of("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"data\":{\"amount_cents\":2}}",
	       h);
	cr_expect_str_neq(base, h);
	hex_of("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"p\",\"data\":{\"amount_cents\":1}}",
	       h);
	cr_expect_str_neq(base, h);
	hex_of("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"data\":{\"amount_cents\":1},"
	       "\"extra\":true}", h);
	cr_expect_str_neq(base, h);
	/* Array order is meaningful. */
	hex_of("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"x\":[1,2]}", base);
	hex_of("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"x\":[2,1]}", h);
	cr_expect_str_neq(base, h);
}

Test(msg, hash_ignores_amqp_properties)
{
	static const char body[] = "{\"message_id\":\"m-1\",\"type\":\"OrderCreated\",\"order_id\":\"o\"}";
	struct msg_props p = { "m-1", 3, "OrderCreated", 12, NULL };
	struct msg a, b;

	cr_assert_eq(parse(body, &a), MSG_REASON_NONE);
	cr_assert_eq(parse_props(body, &p, &b), MSG_REASON_NONE);
	cr_expect_arr_eq(a.sha256, b.sha256, 32);
}

Test(msg, hash_of_a_large_body)
{
	/* Longer than the hash buffer, with a token longer than it too. */
	size_t n = 20000;
	char *body = malloc(n + 100);
	char hex[65];
	int k;

	cr_assert_not_null(body);
	k = snprintf(body, 100, "{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\",\"x\":\"");
	memset(body + k, 'z', n);
	memcpy(body + k + n, "\"}", 3);
	hex_of(body, hex);
	cr_expect_eq(strlen(hex), 64);
	free(body);
}

/* ---- names and helpers --------------------------------------------------- */

Test(msg, every_reason_has_its_spec_name)
{
	static const char *const spec[] = { "malformed-json", "missing-field", "invalid-field",
		                            "unknown-type", "too-large", "payload-conflict",
		                            "hold-expired", "invalid-transition", "retries-exhausted",
		                            "unprocessable", "effect-failed", "delivery-failed", "sequence-gap" };

	cr_assert_eq(MSG_REASON_COUNT - 1, (int)(sizeof spec / sizeof spec[0]));
	cr_expect_str_eq(msg_reason_name(MSG_REASON_NONE), "");
	for (int r = 1; r < MSG_REASON_COUNT; r++)
		cr_expect_str_eq(msg_reason_name((enum msg_reason)r), spec[r - 1]);
	cr_expect_str_eq(msg_reason_name(MSG_REASON_COUNT), "");
}

Test(msg, type_names_round_trip)
{
	for (int t = 0; t < MSG_TYPE_COUNT; t++) {
		const char *n = msg_type_name((enum msg_type)t);

		cr_expect_neq(n[0], '\0');
		cr_expect_lt(strlen(n), MSG_TYPE_NAME_MAX);
		cr_expect_eq(msg_type_from_name(n, strlen(n)), t);
	}
	cr_expect_eq(msg_type_from_name("PaymentConfirmed", 16), MSG_PAYMENT_AUTHORIZED);
	cr_expect_str_eq(msg_type_name(MSG_PAYMENT_AUTHORIZED), "PaymentAuthorized");
	cr_expect_eq(msg_type_from_name("OrderCreated", 5), -1);
	cr_expect_eq(msg_type_from_name("OrderCreatedX", 13), -1);
	cr_expect_eq(msg_type_from_name(NULL, 0), -1);
	cr_expect_str_eq(msg_type_name(MSG_TYPE_COUNT), "");
}

Test(msg, id_alphabet_and_bounds)
{
	cr_expect(msg_id_valid("aZ09._:-", 8, 1, 128));
	cr_expect(msg_id_valid("", 0, 0, 64));
	cr_expect_not(msg_id_valid("", 0, 1, 64));
	cr_expect_not(msg_id_valid("abc", 3, 1, 2));
	cr_expect_not(msg_id_valid("a b", 3, 1, 128));
	cr_expect_not(msg_id_valid("a/b", 3, 1, 128));
	cr_expect_not(msg_id_valid("a\0b", 3, 1, 128));
	cr_expect_not(msg_id_valid("a+b", 3, 1, 128));
}

Test(msg, sha256_hex)
{
	unsigned char sha[32];
	char hex[65];

	for (int i = 0; i < 32; i++)
		sha[i] = (unsigned char)(i * 8 + 7);
	msg_sha256_hex(sha, hex);
	cr_expect_str_eq(hex, "070f171f272f373f474f575f676f777f878f979fa7afb7bfc7cfd7dfe7eff7ff");
}

/* message_id, source and order_id share one rule (their bounds, the
 * alphabet [A-Za-z0-9._:-]) and one wording of the detail, which names the
 * field and its bounds: a value one past a bound, or one character outside
 * the alphabet, is invalid-field for each of them, and the longest value
 * within the bounds is kept whole. */
Test(msg, identifier_fields_share_one_rule_and_one_detail)
{
	static const struct {
		const char *field;
		size_t min, max;
	} ids[] = { { "message_id", 1, MSG_ID_MAX }, { "source", 0, MSG_SOURCE_MAX }, { "order_id", 1, MSG_ORDER_ID_MAX } };
	char longest[MSG_ID_MAX + 2], body[1024], want[256];

	for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
		struct msg m;

		for (int bad = 0; bad < 3; bad++) {
			const char *v = bad == 0 ? "a b" : bad == 1 ? "x/y" : NULL;
			const char *shown = v;

			if (v == NULL) { /* one past the bound */
				memset(longest, 'k', ids[i].max + 1);
				longest[ids[i].max + 1] = '\0';
				v = longest;
			}
			snprintf(body, sizeof body,
			         "{\"message_id\":\"%s\",\"source\":\"%s\",\"type\":\"OrderCreated\",\"order_id\":\"%s\"}",
			         strcmp(ids[i].field, "message_id") == 0 ? v : "m-1",
			         strcmp(ids[i].field, "source") == 0 ? v : "shop",
			         strcmp(ids[i].field, "order_id") == 0 ? v : "o-1");
			cr_assert_eq(parse(body, &m), MSG_REASON_INVALID_FIELD, "%s = %s: %s", ids[i].field, v, m.detail);
			if (shown != NULL) {
				snprintf(want, sizeof want, "%s '%s' is not %zu..%zu characters of [A-Za-z0-9._:-]",
				         ids[i].field, shown, ids[i].min, ids[i].max);
				cr_expect_str_eq(m.detail, want);
			} else {
				snprintf(want, sizeof want, "%s '", ids[i].field);
				cr_expect(strncmp(m.detail, want, strlen(want)) == 0, "%s", m.detail);
			}
		}
		memset(longest, 'k', ids[i].max);
		longest[ids[i].max] = '\0';
		snprintf(body, sizeof body,
		         "{\"message_id\":\"%s\",\"source\":\"%s\",\"type\":\"OrderCreated\",\"order_id\":\"%s\"}",
		         strcmp(ids[i].field, "message_id") == 0 ? longest : "m-1",
		         strcmp(ids[i].field, "source") == 0 ? longest : "shop",
		         strcmp(ids[i].field, "order_id") == 0 ? longest : "o-1");
		cr_assert_eq(parse(body, &m), MSG_REASON_NONE, "%s of %zu: %s", ids[i].field, ids[i].max, m.detail);
		cr_expect_str_eq(strcmp(ids[i].field, "message_id") == 0 ? m.message_id
		                 : strcmp(ids[i].field, "source") == 0    ? m.source
		                                                          : m.order_id,
		                 longest);
	}
}
