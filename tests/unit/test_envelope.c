/*
 * test_envelope.c - the envelope layer (common/envelope.c) without a
 * broker: each envelope and mode mapped to our event, one event in two
 * modes hashing alike, malformed and incomplete envelopes with the reason
 * and a detail naming the attribute, the type map and order id field, and
 * the trace context and correlation id read out.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envelope.h"
#include "lifecycle.h"
#include "aggregate.h"

#define MAX_BODY 65536
#define TP "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

struct hdr {
	const char *key, *val;
	int other; /* HDR_STRING (false), HDR_OTHER (true: present, not a string), HDR_TS, HDR_INT */
};
#define HDR_TS 2  /* an AMQP timestamp: val is its seconds since the epoch */
#define HDR_INT 3 /* an AMQP integer (any width): val is its decimal value */

static enum env_hdr lookup(const void *arg, const char *key, const char **val, size_t *len)
{
	for (const struct hdr *h = arg; h->key != NULL; h++) {
		if (strcmp(h->key, key) != 0)
			continue;
		if (h->other == HDR_TS) {
			*val = NULL;
			*len = (size_t)strtoull(h->val, NULL, 10);
			return ENV_HDR_TIMESTAMP;
		}
		if (h->other == HDR_INT) {
			*val = NULL;
			*len = (size_t)strtoull(h->val, NULL, 10);
			return ENV_HDR_INTEGER;
		}
		if (h->other)
			return ENV_HDR_OTHER;
		*val = h->val;
		*len = strlen(h->val);
		return ENV_HDR_STRING;
	}
	return ENV_HDR_ABSENT;
}

static struct cfg conf_of(enum cfg_envelope env, const char *map, const char *field)
{
	static char empty[] = "";
	struct cfg c;

	memset(&c, 0, sizeof c);
	c.envelope = env;
	c.type_map = map != NULL ? (char *)map : empty;
	c.order_id_field = field != NULL ? (char *)field : empty;
	c.consumer = (char *)"order-status";
	return c;
}

static enum msg_reason run(const struct cfg *c, const char *body, const char *ct, const struct hdr *h,
                           const char *corr, struct msg *m, struct env_context *ctx, char **event)
{
	struct env_delivery d = {
		.body = body, .len = strlen(body), .content_type = ct, .content_type_len = ct != NULL ? strlen(ct) : 0,
		.correlation_id = corr, .correlation_id_len = corr != NULL ? strlen(corr) : 0,
		.header = h != NULL ? lookup : NULL, .header_arg = h,
	};

	return env_parse(c, &d, MAX_BODY, m, ctx, event);
}

#define CE_MAP "com.example.payment.authorized=PaymentAuthorized"
static const char ce_structured[] =
	"{\"specversion\":\"1.0\",\"id\":\"A234-1234-1234\",\"source\":\"https://payments.example.com/v1\","
	"\"type\":\"com.example.payment.authorized\",\"subject\":\"o-1\",\"time\":\"2026-11-29T18:00:00Z\","
	"\"datacontenttype\":\"application/json\",\"data\":{\"amount_cents\":4200}}";
static const struct hdr ce_binary_hdrs[] = {
	{ "cloudEvents:specversion", "1.0", false }, { "cloudEvents:id", "A234-1234-1234", false },
	{ "cloudEvents:source", "https://payments.example.com/v1", false },
	{ "cloudEvents:type", "com.example.payment.authorized", false }, { "cloudEvents:subject", "o-1", false },
	{ "cloudEvents:time", "2026-11-29T18:00:00Z", false }, { NULL, NULL, false },
};

/* The reason for a delivery, and that its detail names `names`. */
static void expect_reason(const struct cfg *c, const char *body, const char *ct, const struct hdr *h,
                          enum msg_reason want, const char *names)
{
	struct msg m;
	char *event = NULL;
	enum msg_reason got = run(c, body, ct, h, NULL, &m, NULL, &event);

	cr_expect_eq(got, want, "%s: got %s (%s), want %s", body, msg_reason_name(got), m.detail, msg_reason_name(want));
	cr_expect_null(event, "a refused delivery has no event");
	if (names != NULL)
		cr_expect_not_null(strstr(m.detail, names), "detail '%s' does not name '%s'", m.detail, names);
	free(event);
}

/* data.amount_cents as the order definition keeps it (PaymentAuthorized's
 * sets), 0 when the message does not carry it. */
static int64_t amount_of(const struct msg *m)
{
	const struct msg_val *v = msg_value(m, "amount_cents");

	return v != NULL ? v->i : 0;
}

Test(envelope, cloudevents_structured_maps_to_our_event)
{
	struct cfg c = conf_of(CFG_ENVELOPE_CLOUDEVENTS, CE_MAP, NULL);
	struct msg m;
	char *event = NULL;

	cr_assert_eq(run(&c, ce_structured, "application/cloudevents+json", NULL, NULL, &m, NULL, &event),
	             MSG_REASON_NONE, "%s", m.detail);
	cr_expect_str_eq(m.message_id, "A234-1234-1234");
	cr_expect_str_eq(m.source, "https://payments.example.com/v1");
	cr_expect_eq(m.type, MSG_PAYMENT_AUTHORIZED);
	cr_expect_str_eq(m.order_id, "o-1");
	cr_expect_str_eq(m.occurred_at, "2026-11-29T18:00:00Z");
	cr_expect(amount_of(&m) == 4200);
	cr_assert_not_null(event);
	/* The canonical event: what a held one keeps, and what is hashed. */
	cr_expect_str_eq(event, "{\"data\":{\"amount_cents\":4200},\"message_id\":\"A234-1234-1234\",\"occurred_at\":"
	                        "\"2026-11-29T18:00:00Z\",\"order_id\":\"o-1\",\"source\":"
	                        "\"https://payments.example.com/v1\",\"type\":\"PaymentAuthorized\"}");
	free(event);
}

Test(envelope, binary_and_structured_modes_of_one_event_hash_alike)
{
	struct cfg c = conf_of(CFG_ENVELOPE_AUTO, CE_MAP, NULL);
	static const struct hdr underscored[] = {
		{ "cloudEvents_specversion", "1.0", false }, { "cloudEvents_id", "A234-1234-1234", false },
		{ "cloudEvents_source", "https://payments.example.com/v1", false },
		{ "cloudEvents_type", "com.example.payment.authorized", false }, { "cloudEvents_subject", "o-1", false },
		{ "cloudEvents_time", "2026-11-29T18:00:00Z", false }, { NULL, NULL, false },
	};
	struct msg s, b, u;
	char *e1 = NULL, *e2 = NULL, *e3 = NULL;

	cr_assert_eq(run(&c, ce_structured, "application/cloudevents+json; charset=utf-8", NULL, NULL, &s, NULL, &e1),
	             MSG_REASON_NONE, "%s", s.detail);
	cr_assert_eq(run(&c, "{ \"amount_cents\" : 4200 }", "application/json", ce_binary_hdrs, NULL, &b, NULL, &e2),
	             MSG_REASON_NONE, "%s", b.detail);
	cr_assert_eq(run(&c, "{\"amount_cents\":4200}", "application/json", underscored, NULL, &u, NULL, &e3),
	             MSG_REASON_NONE, "%s", u.detail);
	cr_expect_eq(memcmp(s.sha256, b.sha256, 32), 0, "structured and binary hash differently");
	cr_expect_eq(memcmp(s.sha256, u.sha256, 32), 0, "cloudEvents_ headers hash differently");
	cr_expect_str_eq(b.message_id, s.message_id);
	cr_expect_str_eq(b.source, s.source);
	cr_expect_str_eq(b.order_id, "o-1");
	cr_expect_str_eq(e1, e2);
	free(e1);
	free(e2);
	free(e3);
}

Test(envelope, another_data_is_another_payload)
{
	struct cfg c = conf_of(CFG_ENVELOPE_CLOUDEVENTS, CE_MAP, NULL);
	struct msg a, b;
	char *e1 = NULL, *e2 = NULL;

	cr_assert_eq(run(&c, "{\"amount_cents\":4200}", "application/json", ce_binary_hdrs, NULL, &a, NULL, &e1),
	             MSG_REASON_NONE);
	cr_assert_eq(run(&c, "{\"amount_cents\":4300}", "application/json", ce_binary_hdrs, NULL, &b, NULL, &e2),
	             MSG_REASON_NONE);
	cr_expect_neq(memcmp(a.sha256, b.sha256, 32), 0);
	free(e1);
	free(e2);
}

Test(envelope, masstransit_maps_to_our_event)
{
	struct cfg c = conf_of(CFG_ENVELOPE_AUTO, NULL, NULL);
	static const char body[] =
		"{\"messageId\":\"0c6d1e2f-3a4b-4d3e-9a55-5b0d9f6e2c1a\",\"correlationId\":\"c0ffee00-0000-4000-8000-"
		"000000000001\",\"sourceAddress\":\"rabbitmq://broker:5672/sales/payments_service?temporary=true\","
		"\"destinationAddress\":\"rabbitmq://broker/orders\",\"messageType\":[\"urn:message:Sales.Contracts:"
		"PaymentAuthorized\",\"urn:message:Sales.Contracts:IPayment\"],\"message\":{\"orderId\":\"o-7\","
		"\"amount_cents\":99},\"sentTime\":\"2026-12-01T10:00:00.1234567Z\",\"headers\":{}}";
	struct msg m;
	struct env_context ctx;
	char *event = NULL;

	cr_assert_eq(run(&c, body, "application/vnd.masstransit+json", NULL, "amqp-corr", &m, &ctx, &event),
	             MSG_REASON_NONE, "%s", m.detail);
	cr_expect_str_eq(m.message_id, "0c6d1e2f-3a4b-4d3e-9a55-5b0d9f6e2c1a");
	cr_expect_str_eq(m.source, "broker/sales/payments_service");
	cr_expect_eq(m.type, MSG_PAYMENT_AUTHORIZED);
	cr_expect_str_eq(m.order_id, "o-7");
	cr_expect_eq(amount_of(&m), 99);
	cr_expect_str_eq(m.occurred_at, "2026-12-01T10:00:00.1234567Z");
	/* the envelope's correlationId wins over the AMQP property */
	cr_expect_str_eq(ctx.correlation_id, "c0ffee00-0000-4000-8000-000000000001");
	cr_expect_str_eq(ctx.trace_id, "");
	free(event);
}

Test(envelope, masstransit_types_through_the_map)
{
	struct cfg c = conf_of(CFG_ENVELOPE_MASSTRANSIT, "Sales.Contracts:PaymentSettled=PaymentAuthorized", NULL);
	struct cfg nomap = conf_of(CFG_ENVELOPE_MASSTRANSIT, NULL, NULL);
	static const char body[] = "{\"messageId\":\"m-1\",\"messageType\":[\"urn:message:Sales.Contracts:PaymentSettled\"],"
	                           "\"message\":{\"orderId\":\"o-1\"}}";
	struct msg m;
	char *event = NULL;

	cr_assert_eq(run(&c, body, NULL, NULL, NULL, &m, NULL, &event), MSG_REASON_NONE, "%s", m.detail);
	cr_expect_eq(m.type, MSG_PAYMENT_AUTHORIZED);
	cr_expect_str_eq(m.source, "");
	free(event);
	expect_reason(&nomap, body, NULL, NULL, MSG_REASON_UNKNOWN_TYPE, "messageType");
}

Test(envelope, auto_leaves_native_messages_as_they_were)
{
	struct cfg c = conf_of(CFG_ENVELOPE_AUTO, NULL, NULL);
	static const char body[] = "{\"message_id\":\"m-1\",\"source\":\"payments\",\"type\":\"PaymentAuthorized\","
	                           "\"order_id\":\"o-1\",\"data\":{\"amount_cents\":5}}";
	struct msg a, b;
	char *event = (char *)"not touched";

	cr_assert_eq(run(&c, body, "application/json", NULL, NULL, &a, NULL, &event), MSG_REASON_NONE, "%s", a.detail);
	cr_expect_null(event, "a native delivery allocates no event");
	cr_assert_eq(msg_parse(body, strlen(body), MAX_BODY, NULL, &b), MSG_REASON_NONE);
	cr_expect_eq(memcmp(a.sha256, b.sha256, 32), 0);
	/* native keeps its own rules: a CloudEvents-wide source is refused */
	expect_reason(&c, "{\"message_id\":\"m-1\",\"source\":\"https://x.example/v1\",\"type\":\"OrderCreated\","
	                  "\"order_id\":\"o-1\"}",
	              NULL, NULL, MSG_REASON_INVALID_FIELD, "source");
}

Test(envelope, incomplete_cloudevents_name_the_attribute)
{
	struct cfg c = conf_of(CFG_ENVELOPE_CLOUDEVENTS, CE_MAP, NULL);
	static const char ct[] = "application/cloudevents+json";

	expect_reason(&c, "{\"id\":\"1\",\"source\":\"s\",\"type\":\"OrderCreated\",\"subject\":\"o\"}", ct, NULL,
	              MSG_REASON_MISSING_FIELD, "specversion");
	expect_reason(&c, "{\"specversion\":\"0.3\",\"id\":\"1\",\"source\":\"s\",\"type\":\"OrderCreated\"}", ct,
	              NULL, MSG_REASON_INVALID_FIELD, "specversion");
	expect_reason(&c, "{\"specversion\":\"1.0\",\"source\":\"s\",\"type\":\"OrderCreated\",\"subject\":\"o\"}", ct,
	              NULL, MSG_REASON_MISSING_FIELD, "'id'");
	expect_reason(&c, "{\"specversion\":\"1.0\",\"id\":\"1\",\"type\":\"OrderCreated\",\"subject\":\"o\"}", ct,
	              NULL, MSG_REASON_MISSING_FIELD, "'source'");
	expect_reason(&c, "{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"s\",\"subject\":\"o\"}", ct, NULL,
	              MSG_REASON_MISSING_FIELD, "'type'");
	expect_reason(&c, "{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"s\",\"type\":\"OrderCreated\"}", ct,
	              NULL, MSG_REASON_MISSING_FIELD, "subject");
	expect_reason(&c, "{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"s\",\"type\":\"com.x.unknown\","
	                  "\"subject\":\"o\"}",
	              ct, NULL, MSG_REASON_UNKNOWN_TYPE, "'type'");
	expect_reason(&c, "{\"specversion\":\"1.0\",\"id\":7,\"source\":\"s\",\"type\":\"OrderCreated\"}", ct, NULL,
	              MSG_REASON_INVALID_FIELD, "'id'");
	expect_reason(&c, "{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"a b\",\"type\":\"OrderCreated\","
	                  "\"subject\":\"o\"}",
	              ct, NULL, MSG_REASON_INVALID_FIELD, "'source'");
	expect_reason(&c, "{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"s\",\"type\":\"OrderCreated\","
	                  "\"subject\":\"o\",\"time\":\"yesterday\"}",
	              ct, NULL, MSG_REASON_INVALID_FIELD, "'time'");
	expect_reason(&c, "{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"s\",\"type\":\"OrderCreated\","
	                  "\"subject\":\"o\",\"data_base64\":\"AAAA\"}",
	              ct, NULL, MSG_REASON_INVALID_FIELD, "data_base64");
	expect_reason(&c, "{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"s\",\"type\":\"OrderCreated\","
	                  "\"subject\":\"o\",\"datacontenttype\":\"text/plain\",\"data\":\"hi\"}",
	              ct, NULL, MSG_REASON_INVALID_FIELD, "datacontenttype");
	expect_reason(&c, "{\"specversion\":\"1.0\",\"id\":\"1\",", ct, NULL, MSG_REASON_MALFORMED_JSON, "CloudEvents");
	expect_reason(&c, "[{\"specversion\":\"1.0\"}]", "application/cloudevents-batch+json", NULL,
	              MSG_REASON_MALFORMED_JSON, "batch");
}

Test(envelope, incomplete_binary_mode_names_the_header)
{
	struct cfg c = conf_of(CFG_ENVELOPE_AUTO, CE_MAP, NULL);
	static const struct hdr no_source[] = {
		{ "cloudEvents:specversion", "1.0", false }, { "cloudEvents:id", "1", false },
		{ "cloudEvents:type", "OrderCreated", false }, { NULL, NULL, false },
	};
	static const struct hdr not_string[] = {
		{ "cloudEvents:specversion", "1.0", false }, { "cloudEvents:id", "1", true }, { NULL, NULL, false },
	};

	expect_reason(&c, "{}", "application/json", no_source, MSG_REASON_MISSING_FIELD, "cloudEvents:source");
	expect_reason(&c, "{}", "application/json", not_string, MSG_REASON_INVALID_FIELD, "cloudEvents:id");
	expect_reason(&c, "{\"amount_cents\":", "application/json", ce_binary_hdrs, MSG_REASON_MALFORMED_JSON, "body");
	expect_reason(&c, "hello", "text/plain", ce_binary_hdrs, MSG_REASON_INVALID_FIELD, "content-type");
}

Test(envelope, keys_follow_the_cloudevents_widths)
{
	struct cfg c = conf_of(CFG_ENVELOPE_CLOUDEVENTS, NULL, NULL);
	char id[300], source[300], body[1024];
	struct msg m;
	char *event = NULL;

	memset(id, 'i', 255);
	id[255] = '\0';
	memset(source, 's', 255);
	source[0] = '/';
	source[255] = '\0';
	snprintf(body, sizeof body, "{\"specversion\":\"1.0\",\"id\":\"%s\",\"source\":\"%s\",\"type\":\"OrderCreated\","
	                            "\"subject\":\"o-1\"}", id, source);
	cr_assert_eq(run(&c, body, NULL, NULL, NULL, &m, NULL, &event), MSG_REASON_NONE, "%s", m.detail);
	cr_expect_eq(strlen(m.message_id), 255);
	cr_expect_eq(strlen(m.source), 255);
	free(event);
	/* one more character each is too many */
	snprintf(body, sizeof body, "{\"specversion\":\"1.0\",\"id\":\"%sx\",\"source\":\"/s\",\"type\":\"OrderCreated\","
	                            "\"subject\":\"o-1\"}", id);
	expect_reason(&c, body, NULL, NULL, MSG_REASON_INVALID_FIELD, "'id'");
	snprintf(body, sizeof body, "{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"%sx\",\"type\":\"OrderCreated\","
	                            "\"subject\":\"o-1\"}", source);
	expect_reason(&c, body, NULL, NULL, MSG_REASON_INVALID_FIELD, "'source'");
	/* printable ASCII with spaces inside, not at the end (the key
	 * columns pad with spaces) */
	cr_assert_eq(run(&c, "{\"specversion\":\"1.0\",\"id\":\"a b!\\\"#\",\"source\":\"urn:x\",\"type\":\"OrderCreated\","
	                     "\"subject\":\"o-1\"}",
	                 NULL, NULL, NULL, &m, NULL, &event),
	             MSG_REASON_NONE, "%s", m.detail);
	cr_expect_str_eq(m.message_id, "a b!\"#");
	free(event);
	expect_reason(&c, "{\"specversion\":\"1.0\",\"id\":\"a \",\"source\":\"urn:x\",\"type\":\"OrderCreated\","
	                  "\"subject\":\"o-1\"}",
	              NULL, NULL, MSG_REASON_INVALID_FIELD, "'id'");
	expect_reason(&c, "{\"specversion\":\"1.0\",\"id\":\"\\u00e9\",\"source\":\"urn:x\",\"type\":\"OrderCreated\","
	                  "\"subject\":\"o-1\"}",
	              NULL, NULL, MSG_REASON_INVALID_FIELD, "'id'");
	expect_reason(&c, "{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"urn:%zz\",\"type\":\"OrderCreated\","
	                  "\"subject\":\"o-1\"}",
	              NULL, NULL, MSG_REASON_INVALID_FIELD, "'source'");
}

Test(envelope, order_id_from_a_path_into_the_data)
{
	struct cfg c = conf_of(CFG_ENVELOPE_CLOUDEVENTS, NULL, "data.order.id");
	struct cfg bare = conf_of(CFG_ENVELOPE_CLOUDEVENTS, NULL, "order.id");
	static const char body[] = "{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"urn:x\",\"type\":\"OrderCreated\","
	                           "\"data\":{\"order\":{\"id\":\"o-9\"}}}";
	struct msg m;
	char *event = NULL;

	cr_assert_eq(run(&c, body, NULL, NULL, NULL, &m, NULL, &event), MSG_REASON_NONE, "%s", m.detail);
	cr_expect_str_eq(m.order_id, "o-9");
	free(event);
	event = NULL;
	cr_assert_eq(run(&bare, body, NULL, NULL, NULL, &m, NULL, &event), MSG_REASON_NONE, "%s", m.detail);
	cr_expect_str_eq(m.order_id, "o-9");
	free(event);
	expect_reason(&c, "{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"urn:x\",\"type\":\"OrderCreated\","
	                  "\"data\":{\"order\":{}}}",
	              NULL, NULL, MSG_REASON_MISSING_FIELD, "data.order.id");
	expect_reason(&c, "{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"urn:x\",\"type\":\"OrderCreated\","
	                  "\"data\":{\"order\":{\"id\":12}}}",
	              NULL, NULL, MSG_REASON_INVALID_FIELD, "data.order.id");
}

Test(envelope, trace_context_from_a_header_or_the_extension)
{
	struct cfg c = conf_of(CFG_ENVELOPE_AUTO, CE_MAP, NULL);
	static const struct hdr amqp[] = { { "traceparent", TP, false }, { "tracestate", "congo=t61rcWkgMzE", false },
		                           { NULL, NULL, false } };
	static const struct hdr bad[] = { { "traceparent", "00-00000000000000000000000000000000-b7ad6b7169203331-01",
		                            false },
		                          { NULL, NULL, false } };
	char ext[1024], tp[ENV_TRACEPARENT_LEN + 1];
	struct env_context ctx, back;
	struct msg m;
	char *event = NULL, *json;

	cr_assert_eq(run(&c, "{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\"}", NULL, amqp,
	                 "corr-1", &m, &ctx, &event),
	             MSG_REASON_NONE, "%s", m.detail);
	cr_expect_str_eq(ctx.trace_id, "0af7651916cd43dd8448eb211c80319c");
	cr_expect_eq(strlen(ctx.span_id), 16);
	cr_expect_str_neq(ctx.span_id, "b7ad6b7169203331", "the message gets a span of its own");
	cr_expect_str_eq(ctx.flags, "01");
	cr_expect_str_eq(ctx.tracestate, "congo=t61rcWkgMzE");
	cr_expect_str_eq(ctx.correlation_id, "corr-1");
	cr_assert(env_traceparent(&ctx, tp, sizeof tp));
	cr_expect_eq(strncmp(tp, "00-0af7651916cd43dd8448eb211c80319c-", 36), 0, "%s", tp);
	json = env_context_json(&ctx);
	cr_assert_not_null(json);
	env_context_from_json(json, &back);
	cr_expect_str_eq(back.trace_id, ctx.trace_id);
	cr_expect_str_eq(back.span_id, ctx.span_id, "a held event keeps its own span");
	cr_expect_str_eq(back.tracestate, ctx.tracestate);
	cr_expect_str_eq(back.correlation_id, "corr-1");
	free(json);

	/* an invalid traceparent is ignored: no trace */
	cr_assert_eq(run(&c, "{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\"}", NULL, bad, NULL,
	                 &m, &ctx, &event),
	             MSG_REASON_NONE);
	cr_expect_str_eq(ctx.trace_id, "");
	cr_expect_not(env_traceparent(&ctx, tp, sizeof tp));
	cr_expect_null(env_context_json(&ctx));

	/* CloudEvents' distributed-tracing extension, structured mode */
	snprintf(ext, sizeof ext, "{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"urn:x\",\"type\":\"OrderCreated\","
	                          "\"subject\":\"o\",\"traceparent\":\"%s\"}", TP);
	cr_assert_eq(run(&c, ext, "application/cloudevents+json", NULL, NULL, &m, &ctx, &event), MSG_REASON_NONE,
	             "%s", m.detail);
	cr_expect_str_eq(ctx.trace_id, "0af7651916cd43dd8448eb211c80319c");
	free(event);
	event = NULL;
	/* the binary-mode attribute */
	{
		static const struct hdr bin[] = {
			{ "cloudEvents:specversion", "1.0", false }, { "cloudEvents:id", "1", false },
			{ "cloudEvents:source", "urn:x", false },   { "cloudEvents:type", "OrderCreated", false },
			{ "cloudEvents:subject", "o", false },      { "cloudEvents:traceparent", TP, false },
			{ NULL, NULL, false },
		};
		cr_assert_eq(run(&c, "", NULL, bin, NULL, &m, &ctx, &event), MSG_REASON_NONE, "%s", m.detail);
		cr_expect_str_eq(ctx.trace_id, "0af7651916cd43dd8448eb211c80319c");
		free(event);
	}
}

/* MassTransit copies its send context's headers into the envelope's
 * "headers" (OpenTelemetry's traceparent among them, whatever the
 * transport); an AMQP traceparent header still wins over it. */
Test(envelope, masstransit_trace_from_the_envelope_headers)
{
	struct cfg c = conf_of(CFG_ENVELOPE_MASSTRANSIT, NULL, NULL);
	static const struct hdr amqp[] = { { "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		                             false },
		                           { NULL, NULL, false } };
	char body[1024];
	struct env_context ctx;
	struct msg m;
	char *event = NULL;

	snprintf(body, sizeof body,
	         "{\"messageId\":\"m-1\",\"messageType\":[\"urn:message:Sales.Contracts:PaymentAuthorized\"],"
	         "\"message\":{\"orderId\":\"o-1\"},\"headers\":{\"traceparent\":\"%s\",\"tracestate\":\"mt=1\","
	         "\"MT-Activity-Id\":\"x\"}}",
	         TP);
	cr_assert_eq(run(&c, body, NULL, NULL, NULL, &m, &ctx, &event), MSG_REASON_NONE, "%s", m.detail);
	cr_expect_str_eq(ctx.trace_id, "0af7651916cd43dd8448eb211c80319c");
	cr_expect_str_eq(ctx.tracestate, "mt=1");
	free(event);
	event = NULL;
	cr_assert_eq(run(&c, body, NULL, amqp, NULL, &m, &ctx, &event), MSG_REASON_NONE, "%s", m.detail);
	cr_expect_str_eq(ctx.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736", "the AMQP header wins");
	free(event);
}

/* A message refused after its envelope was read still names itself (its
 * log line and `dlq list`): the id, source and order as far as they are
 * printable. */
Test(envelope, a_refused_envelope_keeps_its_known_keys)
{
	struct cfg c = conf_of(CFG_ENVELOPE_AUTO, NULL, NULL);
	static const char body[] =
		"{\"specversion\":\"1.0\",\"id\":\"ce-9\",\"source\":\"https://x.example.com\","
		"\"type\":\"com.example.unknown\",\"subject\":\"o-9\"}";
	struct msg m;
	char *event = NULL;

	cr_assert_eq(run(&c, body, "application/cloudevents+json", NULL, NULL, &m, NULL, &event),
	             MSG_REASON_UNKNOWN_TYPE);
	cr_expect_str_eq(m.message_id, "ce-9");
	cr_expect_str_eq(m.source, "https://x.example.com");
	cr_expect_str_eq(m.order_id, "o-9");
	cr_expect_null(event);
}

Test(envelope, too_large_before_any_parse)
{
	struct cfg c = conf_of(CFG_ENVELOPE_CLOUDEVENTS, NULL, NULL);
	struct env_delivery d = { .body = "{}", .len = 2 };
	struct msg m;
	char *event = NULL;

	cr_expect_eq(env_parse(&c, &d, 1, &m, NULL, &event), MSG_REASON_TOO_LARGE);
	cr_expect_null(event);
}

/* ---- the CloudEvents AMQP binding's types (issue 43, item 6) ------------- */

/* In binary mode an attribute comes in its AMQP type: a Timestamp as an
 * AMQP timestamp (over AMQP 0-9-1, seconds since the epoch) is the time,
 * and hashes as the same time written as a string would. */
Test(envelope, binary_mode_time_as_an_amqp_timestamp_is_occurred_at)
{
	struct cfg c = conf_of(CFG_ENVELOPE_AUTO, CE_MAP, NULL);
	static const struct hdr stamped[] = {
		{ "cloudEvents:specversion", "1.0", false }, { "cloudEvents:id", "A234-1234-1234", false },
		{ "cloudEvents:source", "https://payments.example.com/v1", false },
		{ "cloudEvents:type", "com.example.payment.authorized", false },
		{ "cloudEvents:subject", "o-1", false },
		{ "cloudEvents:time", "1796169600", HDR_TS }, /* 2026-12-02T00:00:00Z */
		{ NULL, NULL, false },
	};
	static const struct hdr as_string[] = {
		{ "cloudEvents:specversion", "1.0", false }, { "cloudEvents:id", "A234-1234-1234", false },
		{ "cloudEvents:source", "https://payments.example.com/v1", false },
		{ "cloudEvents:type", "com.example.payment.authorized", false },
		{ "cloudEvents:subject", "o-1", false },
		{ "cloudEvents:time", "2026-12-02T00:00:00Z", false }, { NULL, NULL, false },
	};
	static const struct hdr not_a_time[] = {
		{ "cloudEvents:specversion", "1.0", false }, { "cloudEvents:id", "1", false },
		{ "cloudEvents:source", "/s", false }, { "cloudEvents:type", "OrderCreated", false },
		{ "cloudEvents:subject", "o-1", false }, { "cloudEvents:time", "x", true },
		{ NULL, NULL, false },
	};
	static const struct hdr id_as_timestamp[] = {
		{ "cloudEvents:specversion", "1.0", false }, { "cloudEvents:id", "7", HDR_TS },
		{ "cloudEvents:source", "/s", false }, { "cloudEvents:type", "OrderCreated", false },
		{ NULL, NULL, false },
	};
	struct msg a, b;
	char *e1 = NULL, *e2 = NULL;

	cr_assert_eq(run(&c, "{\"amount_cents\":1}", "application/json", stamped, NULL, &a, NULL, &e1), MSG_REASON_NONE,
	             "%s", a.detail);
	cr_expect_str_eq(a.occurred_at, "2026-12-02T00:00:00Z");
	cr_assert_eq(run(&c, "{\"amount_cents\":1}", "application/json", as_string, NULL, &b, NULL, &e2), MSG_REASON_NONE,
	             "%s", b.detail);
	cr_expect_eq(memcmp(a.sha256, b.sha256, 32), 0, "a timestamp and its string are one payload");
	cr_expect_str_eq(e1, e2);
	free(e1);
	free(e2);
	/* A time in neither form, and a String attribute as a timestamp,
	 * stay refused, each naming the header. */
	expect_reason(&c, "{}", "application/json", not_a_time, MSG_REASON_INVALID_FIELD, "cloudEvents:time");
	expect_reason(&c, "{}", "application/json", id_as_timestamp, MSG_REASON_INVALID_FIELD, "cloudEvents:id");
}

/* CloudEvents' data is any JSON value: an array, a string, a number, a
 * boolean, null.  A definition whose event reads no data field applies it;
 * a data field it requires is missing, as from an object without it. */
Test(envelope, data_may_be_any_json_value)
{
	struct cfg c = conf_of(CFG_ENVELOPE_AUTO, NULL, NULL);
	static const char *const values[] = { "[1,2]", "\"hello\"", "42", "true", "false", "null", "{}" };
	static const struct hdr created[] = {
		{ "cloudEvents:specversion", "1.0", false }, { "cloudEvents:id", "b-1", false },
		{ "cloudEvents:source", "/s", false }, { "cloudEvents:type", "OrderCreated", false },
		{ "cloudEvents:subject", "o-1", false }, { NULL, NULL, false },
	};
	char body[512];

	for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
		struct msg m;
		char *event = NULL;

		snprintf(body, sizeof body,
		         "{\"specversion\":\"1.0\",\"id\":\"s-1\",\"source\":\"/s\",\"type\":\"OrderCreated\","
		         "\"subject\":\"o-1\",\"data\":%s}", values[i]);
		cr_expect_eq(run(&c, body, "application/cloudevents+json", NULL, NULL, &m, NULL, &event), MSG_REASON_NONE,
		             "structured, data %s: %s", values[i], m.detail);
		free(event);
		event = NULL;
		cr_expect_eq(run(&c, values[i], "application/json", created, NULL, &m, NULL, &event), MSG_REASON_NONE,
		             "binary, data %s: %s", values[i], m.detail);
		free(event);
	}
	/* PaymentAuthorized reads data.amount_cents, not required: absent. */
	{
		struct msg m;
		char *event = NULL;

		cr_assert_eq(run(&c, "{\"specversion\":\"1.0\",\"id\":\"s-2\",\"source\":\"/s\",\"type\":\"PaymentAuthorized\","
		                     "\"subject\":\"o-1\",\"data\":[4200]}",
		                 "application/cloudevents+json", NULL, NULL, &m, NULL, &event),
		             MSG_REASON_NONE, "%s", m.detail);
		cr_expect_eq(amount_of(&m), 0);
		free(event);
	}
}

/* ---- a user's definition (issue 43, item 2) ------------------------------ */

static struct lc_def *ship_def;
static struct agg_binding ship_binding;

/* lifecycles/shipment.json as the definition that runs. */
static void use_shipment(void)
{
	char path[4096], why[512];
	const char *root = getenv("INBOX_SOURCE_ROOT");
	struct lc_errors errs;

	cr_assert_not_null(root, "INBOX_SOURCE_ROOT is set by meson");
	snprintf(path, sizeof path, "%s/lifecycles/shipment.json", root);
	ship_def = lc_load_file(path, &errs);
	cr_assert_not_null(ship_def, "%s: %s", path, errs.e[0].text);
	cr_assert_eq(agg_bind(ship_def, &ship_binding, why, sizeof why), 0, "%s", why);
	agg_use(&ship_binding);
}

/* The type map is judged by the definition that runs: its types and
 * aliases, not the built-in order's. */
Test(envelope, the_type_map_is_judged_by_the_definition_that_runs)
{
	struct cfg ok = conf_of(CFG_ENVELOPE_AUTO, "com.example.labelled=ShipmentLabelled,x=PickedUp", "");
	struct cfg bad = conf_of(CFG_ENVELOPE_AUTO, "com.example.labelled=ShipmentLabelled,x=OrderCreated", "");
	struct cfg builtin = conf_of(CFG_ENVELOPE_AUTO, "x=OrderCreated,y=PaymentConfirmed", "");
	char err[512];
	struct msg m;
	char *event = NULL;

	cr_expect_eq(env_check_settings(&builtin, err, sizeof err), 0, "%s", err);
	use_shipment();
	cr_assert_eq(env_check_settings(&ok, err, sizeof err), 0, "%s", err);
	cr_expect_eq(env_check_settings(&bad, err, sizeof err), -1);
	cr_expect_str_eq(err, "INBOX_TYPE_MAP: 'OrderCreated' is not an event type of the shipment lifecycle "
	                      "(ShipmentLabelled, ParcelPickedUp, ParcelInTransit, ParcelDelivered, ParcelLost, "
	                      "ParcelReturned, or an alias): 'x=OrderCreated'");
	cr_assert_eq(run(&ok, "{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"/carrier\",\"type\":\"com.example.labelled\","
	                      "\"subject\":\"s-1\",\"data\":{\"tracking_number\":\"TRK-1\"}}",
	                 "application/cloudevents+json", NULL, NULL, &m, NULL, &event),
	             MSG_REASON_NONE, "%s", m.detail);
	cr_expect_str_eq(m.order_id, "s-1");
	cr_expect_str_eq(m.type_name, "ShipmentLabelled");
	free(event);
	/* A required data field of the definition, where data is not an
	 * object: missing, as from an object without it. */
	expect_reason(&ok, "{\"specversion\":\"1.0\",\"id\":\"2\",\"source\":\"/carrier\",\"type\":\"ShipmentLabelled\","
	                   "\"subject\":\"s-2\",\"data\":\"TRK-2\"}",
	              "application/cloudevents+json", NULL, MSG_REASON_MISSING_FIELD, "data.tracking_number");
}

/* INBOX_ORDER_ID_FIELD applies to the envelopes it fits: subject to
 * CloudEvents alone, so that under auto a MassTransit message keeps its
 * default; the per-envelope form names each. */
Test(envelope, the_order_id_field_applies_to_the_envelopes_it_fits)
{
	struct cfg subject = conf_of(CFG_ENVELOPE_AUTO, NULL, "subject");
	struct cfg each = conf_of(CFG_ENVELOPE_AUTO, NULL, "cloudevents=data.order.id,masstransit=message.order.ref");
	static const char mt[] = "{\"messageId\":\"m-1\",\"messageType\":[\"urn:message:Sales:OrderCreated\"],"
	                         "\"message\":{\"orderId\":\"o-1\",\"order\":{\"ref\":\"o-2\"}}}";
	static const char ce[] = "{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"/s\",\"type\":\"OrderCreated\","
	                         "\"subject\":\"o-3\",\"data\":{\"order\":{\"id\":\"o-4\"}}}";
	struct msg m;
	char *event = NULL;

	cr_assert_eq(run(&subject, mt, "application/vnd.masstransit+json", NULL, NULL, &m, NULL, &event),
	             MSG_REASON_NONE, "%s", m.detail);
	cr_expect_str_eq(m.order_id, "o-1");
	free(event);
	event = NULL;
	cr_assert_eq(run(&subject, ce, "application/cloudevents+json", NULL, NULL, &m, NULL, &event), MSG_REASON_NONE,
	             "%s", m.detail);
	cr_expect_str_eq(m.order_id, "o-3");
	free(event);
	event = NULL;
	cr_assert_eq(run(&each, mt, "application/vnd.masstransit+json", NULL, NULL, &m, NULL, &event), MSG_REASON_NONE,
	             "%s", m.detail);
	cr_expect_str_eq(m.order_id, "o-2");
	free(event);
	event = NULL;
	cr_assert_eq(run(&each, ce, "application/cloudevents+json", NULL, NULL, &m, NULL, &event), MSG_REASON_NONE, "%s",
	             m.detail);
	cr_expect_str_eq(m.order_id, "o-4");
	free(event);
}

/* The key's default name follows the definition: a MassTransit message of
 * the shipment lifecycle (key shipment_id) carries message.shipmentId, as
 * one of orders carries message.orderId. */
Test(envelope, the_masstransit_key_follows_the_definition)
{
	struct cfg c = conf_of(CFG_ENVELOPE_MASSTRANSIT, NULL, NULL);
	static const char body[] = "{\"messageId\":\"m-1\",\"messageType\":[\"urn:message:Carrier:ParcelPickedUp\"],"
	                           "\"message\":{\"shipmentId\":\"s-7\"}}";
	struct msg m;
	char *event = NULL;

	use_shipment();
	cr_assert_eq(run(&c, body, NULL, NULL, NULL, &m, NULL, &event), MSG_REASON_NONE, "%s", m.detail);
	cr_expect_str_eq(m.order_id, "s-7");
	free(event);
	expect_reason(&c, "{\"messageId\":\"m-2\",\"messageType\":[\"urn:message:Carrier:ParcelPickedUp\"],"
	                  "\"message\":{\"orderId\":\"s-7\"}}",
	              NULL, NULL, MSG_REASON_MISSING_FIELD, "message.shipmentId");
}

/* The writer and the reader are one module: what the worker emits in
 * either format reads back, through the same layer, as the event it wrote
 * (its id, source, type, key and time), with the trace it continued. */
Test(envelope, an_emitted_event_reads_back_in_either_format)
{
	static const enum cfg_emit_envelope formats[] = { CFG_EMIT_NATIVE, CFG_EMIT_CLOUDEVENTS };
	const struct env_emitted e = {
		.id = "OrderCreated:o-7", .type = "OrderCreated", .key_field = "order_id", .key = "o-7",
		.time = "2026-12-06T10:00:00.000000Z", .cause_message_id = "m-1", .cause_type = "OrderCreated",
		.traceparent = TP, .tracestate = "vendor=1",
	};

	for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
		struct cfg c = conf_of(CFG_ENVELOPE_AUTO, NULL, NULL);
		struct env_context ctx;
		struct msg m;
		char *body, *event = NULL;
		bool ce = formats[i] == CFG_EMIT_CLOUDEVENTS;

		c.emit_envelope = formats[i];
		body = env_emit_body(&c, &e);
		cr_assert_not_null(body);
		memset(&ctx, 0, sizeof ctx);
		cr_assert_eq(run(&c, body, env_emit_content_type(&c), NULL, NULL, &m, &ctx, &event), MSG_REASON_NONE,
		             "%s: %s", body, m.detail);
		cr_expect_str_eq(m.message_id, "OrderCreated:o-7");
		cr_expect_str_eq(m.source, ce ? "urn:inbox-worker:order-status" : "order-status");
		cr_expect_eq(m.type, MSG_ORDER_CREATED);
		cr_expect_str_eq(m.order_id, "o-7");
		cr_expect_str_eq(m.occurred_at, "2026-12-06T10:00:00.000000Z");
		if (ce) {
			cr_expect_str_eq(env_emit_content_type(&c), "application/cloudevents+json");
			cr_expect(strstr(body, "\"traceparent\":\"" TP "\"") != NULL, "%s", body);
			cr_expect(strstr(body, "\"tracestate\":\"vendor=1\"") != NULL, "%s", body);
		} else {
			cr_expect_null(env_emit_content_type(&c));
		}
		free(event);
		free(body);
	}
}

/* ---- the producer's numbers (issue 46) ------------------------------------ */

static struct lc_def *seq_def;
static struct agg_binding seq_binding;

/* lifecycles/ticket.json with its number read from `from` (a "sequence"
 * source, quoted) instead of data.seq, as the definition that runs. */
static void use_ticket_numbered_by(const char *from)
{
	char path[4096], why[512];
	static char text[8192];
	const char *root = getenv("INBOX_SOURCE_ROOT");
	struct lc_errors errs;
	FILE *f;
	size_t n;
	char *at;

	cr_assert_not_null(root, "INBOX_SOURCE_ROOT is set by meson");
	snprintf(path, sizeof path, "%s/lifecycles/ticket.json", root);
	f = fopen(path, "r");
	cr_assert_not_null(f);
	n = fread(text, 1, sizeof text - 1 - strlen(from), f);
	cr_assert_eq(fclose(f), 0);
	text[n] = '\0';
	at = strstr(text, "\"data.seq\"");
	cr_assert_not_null(at);
	memmove(at + strlen(from), at + strlen("\"data.seq\""), strlen(at + strlen("\"data.seq\"")) + 1);
	memcpy(at, from, strlen(from));
	lc_free(seq_def);
	seq_def = lc_load(text, strlen(text), &errs);
	cr_assert_not_null(seq_def, "%s", errs.e[0].text);
	cr_assert_eq(agg_bind(seq_def, &seq_binding, why, sizeof why), 0, "%s", why);
	agg_use(&seq_binding);
}

static void use_ticket_by_attribute(void)
{
	use_ticket_numbered_by("\"cloudevents.sequence\"");
}

/* CloudEvents' sequence extension carries the number, in structured mode
 * (a string, as the extension types it, or a JSON integer) and in binary
 * mode (the header); a native message says it at the top, beside its id. */
Test(envelope, the_cloudevents_sequence_attribute_numbers_an_event)
{
	struct cfg c = conf_of(CFG_ENVELOPE_AUTO, NULL, NULL);
	static const struct hdr bin[] = {
		{ "cloudEvents:specversion", "1.0", false }, { "cloudEvents:id", "t-1-2", false },
		{ "cloudEvents:source", "/helpdesk", false }, { "cloudEvents:type", "WorkStarted", false },
		{ "cloudEvents:subject", "t-1", false }, { "cloudEvents:sequence", "2", false }, { NULL, NULL, false },
	};
	struct msg m;
	char *event = NULL;

	use_ticket_by_attribute();
	cr_assert_eq(run(&c, "{\"specversion\":\"1.0\",\"id\":\"t-1-3\",\"source\":\"/helpdesk\",\"type\":\"TicketResolved\","
	                     "\"subject\":\"t-1\",\"sequence\":\"3\"}",
	                 "application/cloudevents+json", NULL, NULL, &m, NULL, &event),
	             MSG_REASON_NONE, "%s", m.detail);
	cr_expect_eq(m.seq, 3);
	cr_expect(strstr(event, "\"sequence\":\"3\"") != NULL, "the held event keeps its number: %s", event);
	free(event);
	event = NULL;
	cr_assert_eq(run(&c, "{\"specversion\":\"1.0\",\"id\":\"t-1-4\",\"source\":\"/helpdesk\",\"type\":\"TicketReopened\","
	                     "\"subject\":\"t-1\",\"sequence\":4}",
	                 "application/cloudevents+json", NULL, NULL, &m, NULL, &event),
	             MSG_REASON_NONE, "%s", m.detail);
	cr_expect_eq(m.seq, 4);
	free(event);
	event = NULL;
	cr_assert_eq(run(&c, "{}", "application/json", bin, NULL, &m, NULL, &event), MSG_REASON_NONE, "%s", m.detail);
	cr_expect_eq(m.seq, 2);
	free(event);
	event = NULL;
	cr_assert_eq(run(&c, "{\"message_id\":\"t-1-1\",\"type\":\"TicketOpened\",\"ticket_id\":\"t-1\",\"sequence\":1}",
	                 NULL, NULL, NULL, &m, NULL, &event),
	             MSG_REASON_NONE, "%s", m.detail);
	cr_expect_eq(m.seq, 1);
	free(event);
	expect_reason(&c, "{\"specversion\":\"1.0\",\"id\":\"x\",\"source\":\"/h\",\"type\":\"WorkStarted\",\"subject\":\"t-1\"}",
	              "application/cloudevents+json", NULL, MSG_REASON_MISSING_FIELD, "sequence");
	expect_reason(&c, "{\"specversion\":\"1.0\",\"id\":\"x\",\"source\":\"/h\",\"type\":\"WorkStarted\",\"subject\":\"t-1\","
	                  "\"sequence\":\"2a\"}",
	              "application/cloudevents+json", NULL, MSG_REASON_INVALID_FIELD, "sequence");
	expect_reason(&c, "{\"specversion\":\"1.0\",\"id\":\"x\",\"source\":\"/h\",\"type\":\"WorkStarted\",\"subject\":\"t-1\","
	                  "\"sequence\":\"0\"}",
	              "application/cloudevents+json", NULL, MSG_REASON_INVALID_FIELD, "sequence");
	agg_use(NULL);
}

/* An AMQP header carries the number ("from": "header.x-seq"), as an
 * integer of any width or a decimal string, whatever the envelope; the
 * number joins the event the payload hash covers (and a held event keeps),
 * and a body's own "sequence" does not stand in for a missing header. */
Test(envelope, an_amqp_header_numbers_an_event_in_any_envelope)
{
	struct cfg c = conf_of(CFG_ENVELOPE_AUTO, NULL, NULL);
	static const struct hdr as_int[] = { { "x-seq", "3", HDR_INT }, { NULL, NULL, false } };
	static const struct hdr as_text[] = { { "x-seq", "4", false }, { NULL, NULL, false } };
	static const struct hdr as_float[] = { { "x-seq", "4", true }, { NULL, NULL, false } };
	static const struct hdr bin[] = {
		{ "cloudEvents:specversion", "1.0", false }, { "cloudEvents:id", "t-1-2", false },
		{ "cloudEvents:source", "/helpdesk", false }, { "cloudEvents:type", "WorkStarted", false },
		{ "cloudEvents:subject", "t-1", false }, { "x-seq", "2", HDR_INT }, { NULL, NULL, false },
	};
	static const char native[] = "{\"message_id\":\"t-1-3\",\"type\":\"TicketResolved\",\"ticket_id\":\"t-1\"}";
	unsigned char first[32];
	struct msg m;
	char *event = NULL;

	use_ticket_numbered_by("\"header.x-seq\"");
	cr_assert_eq(run(&c, native, NULL, as_int, NULL, &m, NULL, &event), MSG_REASON_NONE, "%s", m.detail);
	cr_expect_eq(m.seq, 3);
	cr_expect_null(event, "a native event is its body (a held one reads its number from its kept headers)");
	memcpy(first, m.sha256, sizeof first);
	free(event);
	event = NULL;
	cr_assert_eq(run(&c, native, NULL, as_text, NULL, &m, NULL, &event), MSG_REASON_NONE, "%s", m.detail);
	cr_expect_eq(m.seq, 4);
	cr_expect(memcmp(first, m.sha256, sizeof first) != 0, "another number is another payload");
	free(event);
	event = NULL;
	cr_assert_eq(run(&c, "{}", "application/json", bin, NULL, &m, NULL, &event), MSG_REASON_NONE, "%s", m.detail);
	cr_expect_eq(m.seq, 2);
	cr_expect(strstr(event, "\"sequence\":2") != NULL, "%s", event);
	free(event);
	event = NULL;
	cr_assert_eq(run(&c, "{\"specversion\":\"1.0\",\"id\":\"t-1-5\",\"source\":\"/helpdesk\","
	                     "\"type\":\"TicketReopened\",\"subject\":\"t-1\"}",
	                 "application/cloudevents+json", as_int, NULL, &m, NULL, &event),
	             MSG_REASON_NONE, "%s", m.detail);
	cr_expect_eq(m.seq, 3);
	free(event);
	expect_reason(&c, "{\"message_id\":\"t-1-3\",\"type\":\"TicketResolved\",\"ticket_id\":\"t-1\",\"sequence\":3}",
	              NULL, NULL, MSG_REASON_MISSING_FIELD, "header x-seq");
	expect_reason(&c, native, NULL, as_float, MSG_REASON_INVALID_FIELD, "header x-seq");
	agg_use(NULL);
}

/* A definition that does not read the sequence attribute hashes the
 * event as before it was read at all: a copy of an event first seen by an
 * earlier build is still a duplicate. */
Test(envelope, the_sequence_attribute_stays_out_of_other_definitions_events)
{
	struct cfg c = conf_of(CFG_ENVELOPE_CLOUDEVENTS, CE_MAP, NULL);
	struct msg m;
	char *event = NULL;

	cr_assert_eq(run(&c, "{\"specversion\":\"1.0\",\"id\":\"p-1\",\"source\":\"/pay\",\"type\":\"PaymentAuthorized\","
	                     "\"subject\":\"o-1\",\"sequence\":\"7\",\"data\":{\"amount_cents\":10}}",
	                 "application/cloudevents+json", NULL, NULL, &m, NULL, &event),
	             MSG_REASON_NONE, "%s", m.detail);
	cr_expect(strstr(event, "sequence") == NULL, "%s", event);
	cr_expect_eq(m.seq, 0);
	free(event);
}
