/*
 * test_envelopes.c - the envelope layer end to end (SPEC.md, Envelopes):
 * a worker on the real stack takes CloudEvents in structured and binary
 * mode, MassTransit messages and native ones; one event in several modes
 * is applied once; a conflict and malformed envelopes go to the DLQ with
 * a reason and a detail naming the attribute; the W3C trace and the
 * correlation id continue through a hold and the outbox into the emitted
 * events, and the log lines of the causing message carry the trace; with
 * INBOX_EMIT_ENVELOPE=cloudevents the emitted events are CloudEvents.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "itest.h"
#include "status.h"

#define WAIT_S 240
#define MAP "INBOX_TYPE_MAP=com.example.order.created=OrderCreated,com.example.payment.authorized=PaymentAuthorized," \
            "com.example.order.cancelled=OrderCancelled"
#define TRACE "4bf92f3577b34da6a3ce929d0e0e4736"
#define TP "00-" TRACE "-00f067aa0ba902b7-01"
#define TRACE2 "0af7651916cd43dd8448eb211c80319c"
#define TP2 "00-" TRACE2 "-b7ad6b7169203331-01"

/* Publish body to the orders exchange (order.<rk>) with the properties
 * of props_json (content type, correlation id, headers), confirmed. */
static void publish(struct mq *m, const char *rk, const char *body, const char *props_json)
{
	char key[64];
	struct mq_message msg = {
		.exchange = itest_cfg()->exchange, .routing_key = key, .body = body, .len = strlen(body),
		.props_json = props_json,
	};

	snprintf(key, sizeof key, "order.%s", rk);
	cr_assert_eq(mq_publish_confirmed(m, &msg, 10000), ST_OK, "publish: %s", mq_errmsg(m));
}

static void ce_structured(char *buf, size_t cap, const char *id, const char *source, const char *type,
                          const char *subject, const char *data, const char *extra)
{
	snprintf(buf, cap,
	         "{\"specversion\":\"1.0\",\"id\":\"%s\",\"source\":\"%s\",\"type\":\"%s\",\"subject\":\"%s\","
	         "\"time\":\"2026-12-02T00:00:00Z\",\"datacontenttype\":\"application/json\",\"data\":%s%s}",
	         id, source, type, subject, data, extra != NULL ? extra : "");
}

/* The properties of a binary-mode CloudEvent. */
static void ce_binary_props(char *buf, size_t cap, const char *prefix, const char *id, const char *source,
                            const char *type, const char *subject, const char *extra)
{
	snprintf(buf, cap,
	         "{\"content_type\":\"application/json\",\"headers\":{\"%sspecversion\":\"1.0\",\"%sid\":\"%s\","
	         "\"%ssource\":\"%s\",\"%stype\":\"%s\",\"%ssubject\":\"%s\",\"%stime\":\"2026-12-02T00:00:00Z\"%s}}",
	         prefix, prefix, id, prefix, source, prefix, type, prefix, subject, prefix, extra != NULL ? extra : "");
}

static const char ce_ct[] = "{\"content_type\":\"application/cloudevents+json\"}";
static const char mt_ct[] = "{\"content_type\":\"application/vnd.masstransit+json\"}";

static pid_t worker(const char *const *env)
{
	return itest_worker(1, env);
}

static int64_t outcome_of(const char *message_id, char *outcome, size_t cap)
{
	return itest_str1("SELECT outcome FROM processed_messages WHERE message_id = ?", message_id, outcome, cap);
}

Test(envelopes, each_envelope_and_mode_is_applied)
{
	static const char *const env[] = { "INBOX_ENVELOPE=auto", MAP, NULL };
	char body[2048], props[2048], id[300], source[300], status[32];
	struct mq *m;
	pid_t w;

	itest_fresh();
	m = itest_mq();
	/* native, as always */
	itest_event(body, sizeof body, "n-1", "OrderCreated", "o-n");
	publish(m, "OrderCreated", body, NULL);
	/* CloudEvents, structured mode */
	ce_structured(body, sizeof body, "s-1", "https://sales.example.com/v1", "com.example.order.created", "o-s", "{}",
	              NULL);
	publish(m, "OrderCreated", body, ce_ct);
	ce_structured(body, sizeof body, "s-2", "https://payments.example.com/v1", "com.example.payment.authorized",
	              "o-s", "{\"amount_cents\":4200}", NULL);
	publish(m, "PaymentAuthorized", body, ce_ct);
	/* binary mode, both header spellings */
	ce_binary_props(props, sizeof props, "cloudEvents:", "b-1", "/sales", "com.example.order.created", "o-b", NULL);
	publish(m, "OrderCreated", "{}", props);
	ce_binary_props(props, sizeof props, "cloudEvents_", "b-2", "/payments", "com.example.payment.authorized", "o-b",
	                NULL);
	publish(m, "PaymentAuthorized", "{\"amount_cents\":1}", props);
	/* MassTransit: the order id in the message, the type by its URN */
	snprintf(body, sizeof body,
	         "{\"messageId\":\"7a1c0000-0000-4000-8000-000000000001\",\"sourceAddress\":\"rabbitmq://mt-host/sales\","
	         "\"messageType\":[\"urn:message:Sales.Contracts:OrderCreated\"],\"message\":{\"orderId\":\"o-m\"},"
	         "\"sentTime\":\"2026-12-02T00:00:00.1234567Z\"}");
	publish(m, "OrderCreated", body, mt_ct);
	/* the widest keys CloudEvents allows: 255 characters each */
	memset(id, 'i', 255);
	id[255] = '\0';
	snprintf(source, sizeof source, "urn:");
	memset(source + 4, 's', 251);
	source[255] = '\0';
	ce_structured(body, sizeof body, id, source, "OrderCreated", "o-w", "{}", NULL);
	publish(m, "OrderCreated", body, ce_ct);

	w = worker(env);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", 7, WAIT_S), 7);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert(itest_str1("SELECT status FROM orders WHERE id = ?", "o-s", status, sizeof status));
	cr_expect_str_eq(status, "Paid");
	cr_assert(itest_str1("SELECT status FROM orders WHERE id = ?", "o-b", status, sizeof status));
	cr_expect_str_eq(status, "Paid");
	cr_expect_eq(itest_int1("SELECT amount_cents FROM orders WHERE id = ?", "o-s"), 4200);
	cr_expect_eq(itest_int1("SELECT COUNT(*) FROM orders WHERE id = ?", "o-m"), 1);
	cr_expect_eq(itest_int1("SELECT COUNT(*) FROM orders WHERE id = ?", "o-w"), 1);
	/* CloudEvents' source + id is the dedup key */
	cr_expect_eq(itest_int1("SELECT COUNT(*) FROM processed_messages WHERE source = ? AND message_id = 's-2'",
	                        "https://payments.example.com/v1"),
	             1);
	cr_expect_eq(itest_int1("SELECT COUNT(*) FROM processed_messages WHERE source = ?", "mt-host/sales"), 1);
	cr_expect_eq(itest_int1("SELECT LENGTH(message_id) + LENGTH(source) FROM processed_messages WHERE order_id = ?",
	                        "o-w"),
	             510);
	cr_expect_eq(itest_queue_depth(itest_cfg()->dlq), 0);
}

Test(envelopes, one_event_in_several_modes_is_applied_once)
{
	static const char *const env[] = { "INBOX_ENVELOPE=cloudevents", MAP, NULL };
	char body[2048], props[2048], outcome[32];
	struct itest_dead dead[4];
	struct mq *m;
	pid_t w;

	itest_fresh();
	m = itest_mq();
	w = worker(env);
	ce_structured(body, sizeof body, "e-1", "https://sales.example.com/v1", "com.example.order.created", "o-d",
	              "{\"note\":\"x\"}", NULL);
	publish(m, "OrderCreated", body, ce_ct);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", 1, WAIT_S), 1);
	/* the same event in binary mode, both spellings, data with other
	 * whitespace: duplicates, not conflicts */
	ce_binary_props(props, sizeof props, "cloudEvents:", "e-1", "https://sales.example.com/v1",
	                "com.example.order.created", "o-d", NULL);
	publish(m, "OrderCreated", "{ \"note\" : \"x\" }", props);
	ce_binary_props(props, sizeof props, "cloudEvents_", "e-1", "https://sales.example.com/v1",
	                "com.example.order.created", "o-d", NULL);
	publish(m, "OrderCreated", "{\"note\":\"x\"}", props);
	/* and structured again */
	publish(m, "OrderCreated", body, ce_ct);
	/* the same key with other data: a conflict, the first one stands */
	publish(m, "OrderCreated", "{\"note\":\"y\"}", props);
	cr_assert_eq(itest_dlq_drain(dead, 4, 1, WAIT_S), 1);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
	cr_expect_str_eq(dead[0].reason, "payload-conflict");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM order_events"), 1);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM processed_messages"), 1);
	cr_assert(outcome_of("e-1", outcome, sizeof outcome));
	cr_expect_str_eq(outcome, "applied");
}

Test(envelopes, malformed_envelopes_are_dead_lettered_naming_the_attribute)
{
	static const char *const env[] = { "INBOX_ENVELOPE=auto", MAP, NULL };
	static const struct {
		const char *body, *props, *reason, *names;
	} cases[] = {
		{ "{\"specversion\":\"1.0\",\"source\":\"/s\",\"type\":\"OrderCreated\",\"subject\":\"o\"}", ce_ct,
		  "missing-field", "'id'" },
		{ "{\"specversion\":\"0.3\",\"id\":\"x-2\",\"source\":\"/s\",\"type\":\"OrderCreated\",\"subject\":\"o\"}",
		  ce_ct, "invalid-field", "specversion" },
		{ "{\"specversion\":\"1.0\",\"id\":\"x-3\",\"source\":\"/s\",\"type\":\"com.example.unknown\","
		  "\"subject\":\"o\"}",
		  ce_ct, "unknown-type", "'type'" },
		{ "{\"specversion\":\"1.0\",\"id\":\"x-4\",\"source\":\"/s\",\"type\":\"OrderCreated\"}", ce_ct,
		  "missing-field", "subject" },
		{ "{\"specversion\":\"1.0\",", ce_ct, "malformed-json", "CloudEvents" },
		{ "{}", "{\"content_type\":\"application/json\",\"headers\":{\"cloudEvents:specversion\":\"1.0\","
		        "\"cloudEvents:id\":\"x-6\",\"cloudEvents:type\":\"OrderCreated\"}}",
		  "missing-field", "cloudEvents:source" },
		{ "{\"messageId\":\"x-7\",\"message\":{\"orderId\":\"o\"}}", mt_ct, "missing-field", "messageType" },
		{ "{\"messageId\":\"x-8\",\"messageType\":[\"urn:message:A:OrderCreated\"],\"message\":{}}", mt_ct,
		  "missing-field", "orderId" },
	};
	enum { N = sizeof cases / sizeof cases[0] };
	struct itest_dead dead[N + 1];
	struct mq *m;
	pid_t w;
	int n;

	itest_fresh();
	m = itest_mq();
	for (int i = 0; i < N; i++)
		publish(m, "OrderCreated", cases[i].body, cases[i].props);
	w = worker(env);
	n = itest_dlq_drain(dead, N + 1, N, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_eq(n, N, "%d dead letters, want %d", n, N);
	/* one worker thread takes them in order */
	for (int i = 0; i < N; i++) {
		cr_expect_str_eq(dead[i].reason, cases[i].reason, "case %d: %s", i, dead[i].detail);
		cr_expect_not_null(strstr(dead[i].detail, cases[i].names), "case %d: detail '%s' does not name %s", i,
		                   dead[i].detail, cases[i].names);
	}
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM order_events"), 0);
}

/* One emitted event of type (its message-id "<type>:<order>") from queue:
 * its properties as JSON (mq_delivery_props_json) and its body, acked.
 * Waits (bounded) for it; others met on the way are acked and dropped. */
static json_t *emitted(const char *queue, const char *stable_id, char *body, size_t cap)
{
	struct mq *m = itest_mq();
	time_t end = time(NULL) + WAIT_S;
	json_t *props = NULL;

	while (props == NULL) {
		struct mq_delivery d;
		int rc = mq_get(m, queue, &d);

		if (rc == ST_ERR_NOT_FOUND) {
			struct timespec ts = { 0, 100 * 1000000L };

			cr_assert(time(NULL) < end, "no %s emitted", stable_id);
			nanosleep(&ts, NULL);
			continue;
		}
		cr_assert_eq(rc, ST_OK, "basic.get: %s", mq_errmsg(m));
		if (d.props.message_id_len == strlen(stable_id) &&
		    memcmp(d.props.message_id, stable_id, d.props.message_id_len) == 0) {
			char *j = mq_delivery_props_json(&d);

			cr_assert_not_null(j);
			props = json_loads(j, 0, NULL);
			free(j);
			cr_assert_not_null(props);
			snprintf(body, cap, "%.*s", (int)d.len, (const char *)d.body);
		}
		cr_assert_eq(mq_ack(m, d.tag, false), ST_OK);
		mq_delivery_release(m, &d);
	}
	mq_close(&m);
	return props;
}

static const char *jstr(json_t *o, const char *path)
{
	json_t *v = o;
	char seg[64];

	while (v != NULL && *path != '\0') {
		const char *dot = strchr(path, '.');
		size_t n = dot != NULL ? (size_t)(dot - path) : strlen(path);

		snprintf(seg, sizeof seg, "%.*s", (int)n, path);
		v = json_object_get(v, seg);
		path += n + (dot != NULL);
	}
	return json_is_string(v) ? json_string_value(v) : "";
}

/* "00-<trace>-<span>-01": the trace id and a span that is not the one
 * the cause came with. */
static void expect_continued(const char *tp, const char *trace, const char *cause_span, char span[17])
{
	cr_assert_eq(strlen(tp), 55, "traceparent '%s'", tp);
	cr_expect_eq(strncmp(tp, "00-", 3), 0, "%s", tp);
	cr_expect_eq(strncmp(tp + 3, trace, 32), 0, "traceparent %s does not continue trace %s", tp, trace);
	snprintf(span, 17, "%.16s", tp + 36);
	cr_expect_str_neq(span, cause_span, "the emitted event's parent is the cause's own span, not its parent");
	cr_expect_str_eq(tp + 52, "-01");
}

Test(envelopes, trace_and_correlation_continue_through_a_hold_and_the_outbox)
{
	static const char *const env[] = { "INBOX_ENVELOPE=auto", MAP, "INBOX_LOG_FORMAT=json", "INBOX_LOG_LEVEL=debug",
		                           NULL };
	const char *out = "itest.env.out";
	char body[2048], props[2048], got[4096], log[256], span[17], want[128];
	json_t *p;
	struct mq *m;
	pid_t w;

	itest_fresh();
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	itest_log_path(log, sizeof log, "envelopes-trace");
	m = itest_mq();
	w = itest_worker_logged(1, env, log);
	/* A payment (binary mode, traceparent as the CloudEvents attribute)
	 * before its order: held, with its trace. */
	ce_binary_props(props, sizeof props, "cloudEvents:", "t-pay", "/payments", "com.example.payment.authorized",
	                "o-t", ",\"cloudEvents:traceparent\":\"" TP "\",\"cloudEvents:tracestate\":\"congo=t61rcWkgMzE\"");
	publish(m, "PaymentAuthorized", "{\"amount_cents\":700}", props);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM held_events", 1, WAIT_S), 1);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM held_events WHERE context LIKE '%" TRACE "%'"), 1,
	             "the held event keeps its trace");
	/* Its order (native, no trace): the payment is released, applied,
	 * and the OrderPaid it causes continues the payment's trace. */
	itest_event(body, sizeof body, "t-new", "OrderCreated", "o-t");
	publish(m, "OrderCreated", body, NULL);
	p = emitted(out, "OrderPaid:o-t", got, sizeof got);
	expect_continued(jstr(p, "headers.traceparent"), TRACE, "00f067aa0ba902b7", span);
	cr_expect_str_eq(jstr(p, "headers.tracestate"), "congo=t61rcWkgMzE");
	cr_expect_str_eq(jstr(p, "correlation_id"), "t-pay", "no correlation id came: the cause's message id");
	json_decref(p);

	/* A cancellation with a trace header and a correlation id (native
	 * envelope): the RefundRequested it causes carries both. */
	itest_event(body, sizeof body, "t-cancel", "OrderCancelled", "o-t");
	publish(m, "OrderCancelled", body,
	        "{\"correlation_id\":\"checkout-42\",\"headers\":{\"traceparent\":\"" TP2 "\"}}");
	p = emitted(out, "RefundRequested:o-t", got, sizeof got);
	expect_continued(jstr(p, "headers.traceparent"), TRACE2, "b7ad6b7169203331", span);
	cr_expect_str_eq(jstr(p, "correlation_id"), "checkout-42");
	cr_expect_str_eq(jstr(p, "content_type"), "application/json");
	json_decref(p);
	itest_stop_ok(w);
	mq_close(&m);

	/* The log lines about the cancellation carry its trace and its own
	 * span -- the parent id of the refund. */
	snprintf(want, sizeof want, "\"span_id\":\"%s\"", span);
	{
		const char *texts[] = { "\"message_id\":\"t-cancel\"", "\"trace_id\":\"" TRACE2 "\"", want, NULL };
		const char *any[] = { "\"message_id\":\"t-cancel\"", NULL };

		cr_expect_geq(itest_log_lines(log, texts), 1, "no log line of t-cancel with its trace (%s)", log);
		cr_expect_eq(itest_log_lines(log, texts), itest_log_lines(log, any),
		             "every line about t-cancel carries its trace");
	}
	{
		/* the held payment's lines (held, then released) carry its trace */
		const char *texts[] = { "\"message_id\":\"t-pay\"", "\"trace_id\":\"" TRACE "\"", NULL };
		const char *any[] = { "\"message_id\":\"t-pay\"", NULL };

		cr_expect_geq(itest_log_lines(log, texts), 2, "held and released lines of t-pay with its trace (%s)", log);
		cr_expect_eq(itest_log_lines(log, texts), itest_log_lines(log, any));
	}
	{
		/* the order without a trace has none */
		const char *texts[] = { "\"message_id\":\"t-new\"", "trace_id", NULL };

		cr_expect_eq(itest_log_lines(log, texts), 0);
	}
}

Test(envelopes, emitted_as_cloudevents)
{
	static const char *const env[] = { "INBOX_ENVELOPE=cloudevents", MAP, "INBOX_EMIT_ENVELOPE=cloudevents", NULL };
	const char *out = "itest.env.out";
	char body[2048], got[4096];
	json_t *p, *ce;
	struct mq *m;
	pid_t w;

	itest_fresh();
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	m = itest_mq();
	w = worker(env);
	ce_structured(body, sizeof body, "c-1", "/sales", "com.example.order.created", "o-c", "{}", NULL);
	publish(m, "OrderCreated", body, ce_ct);
	ce_structured(body, sizeof body, "c-2", "/payments", "com.example.payment.authorized", "o-c", "{}", NULL);
	publish(m, "PaymentAuthorized", body, ce_ct);
	ce_structured(body, sizeof body, "c-3", "/sales", "com.example.order.cancelled", "o-c", "{}",
	              ",\"traceparent\":\"" TP "\"");
	publish(m, "OrderCancelled", body, "{\"content_type\":\"application/cloudevents+json; charset=utf-8\"}");
	p = emitted(out, "RefundRequested:o-c", got, sizeof got);
	itest_stop_ok(w);
	mq_close(&m);
	cr_expect_str_eq(jstr(p, "content_type"), "application/cloudevents+json");
	ce = json_loads(got, 0, NULL);
	cr_assert_not_null(ce, "body is not JSON: %s", got);
	cr_expect_str_eq(jstr(ce, "specversion"), "1.0");
	cr_expect_str_eq(jstr(ce, "id"), "RefundRequested:o-c", "id is the stable id, the AMQP message-id");
	cr_expect_str_eq(jstr(ce, "source"), "urn:inbox-worker:order-status");
	cr_expect_str_eq(jstr(ce, "type"), "RefundRequested");
	cr_expect_str_eq(jstr(ce, "subject"), "o-c");
	cr_expect_neq(jstr(ce, "time")[0], '\0');
	cr_expect_str_eq(jstr(ce, "data.cause_message_id"), "c-3");
	cr_expect_eq(strncmp(jstr(ce, "traceparent"), "00-" TRACE "-", 36), 0, "traceparent '%s'", jstr(ce, "traceparent"));
	cr_expect_str_eq(jstr(ce, "traceparent"), jstr(p, "headers.traceparent"));
	cr_expect_str_eq(jstr(p, "correlation_id"), "c-3");
	json_decref(ce);
	json_decref(p);
}

/* A producer that is not ours: the official CloudEvents SDK for JavaScript
 * (tests/node/ce_producer.mjs, with amqplib) publishes an order's events in
 * structured and binary mode, one of them twice. */
Test(envelopes, the_cloudevents_sdk_for_javascript_as_producer)
{
	static const char *const env[] = { "INBOX_ENVELOPE=auto", MAP, NULL };
	const char *out = "itest.env.out";
	char script[4096], modules[4096], log[256], url[1024], got[4096], status[32], span[17];
	const char *args[5];
	json_t *p;
	pid_t w, node;
	int st;

	if (access("/usr/bin/node", X_OK) != 0)
		cr_skip_test("node is not installed (/usr/bin/node): the CloudEvents SDK producer cannot run");
	itest_source("tests/node/node_modules/cloudevents/package.json", modules, sizeof modules);
	cr_assert_eq(access(modules, R_OK), 0,
	             "%s is missing: run `npm ci` in tests/node (scripts/test does it before the suites)", modules);
	itest_source("tests/node/ce_producer.mjs", script, sizeof script);
	/* amqplib takes the worker's URL as it is */
	snprintf(url, sizeof url, "%s", getenv("INBOX_AMQP_URL"));
	itest_fresh();
	itest_bind_queue(out, itest_cfg()->out_exchange, "#");
	w = worker(env);
	args[0] = script;
	args[1] = url;
	args[2] = itest_cfg()->exchange;
	args[3] = "o-sdk";
	args[4] = NULL;
	itest_log_path(log, sizeof log, "envelopes-node");
	node = itest_spawn_program("/usr/bin/node", args, NULL, log, true);
	st = itest_wait_exit(node, WAIT_S);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the node producer failed; see %s", log);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages WHERE order_id = 'o-sdk'", 3, WAIT_S), 3);
	/* in the order they were emitted (emitted() drops what it passes) */
	p = emitted(out, "OrderPaid:o-sdk", got, sizeof got);
	expect_continued(jstr(p, "headers.traceparent"), TRACE, "00f067aa0ba902b7", span);
	json_decref(p);
	p = emitted(out, "RefundRequested:o-sdk", got, sizeof got);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	cr_assert(itest_str1("SELECT status FROM orders WHERE id = ?", "o-sdk", status, sizeof status));
	cr_expect_str_eq(status, "Cancelled");
	cr_expect_eq(itest_int1("SELECT amount_cents FROM orders WHERE id = ?", "o-sdk"), 4200);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM order_events WHERE order_id = 'o-sdk'"), 3,
	             "created, paid, cancelled: the second payment was a duplicate");
	cr_expect_eq(itest_int1("SELECT COUNT(*) FROM processed_messages WHERE source = ? AND message_id = 'o-sdk-paid'",
	                        "https://payments.example.com/v1"),
	             1);
	cr_expect_eq(itest_queue_depth(itest_cfg()->dlq), 0, "nothing dead-lettered (no conflict between the modes)");
	/* the cancellation came without a trace (the payment's OrderPaid
	 * carried the SDK's traceparent on, above) */
	cr_expect_str_eq(jstr(p, "headers.traceparent"), "");
	cr_expect_str_eq(jstr(p, "correlation_id"), "o-sdk-cancelled");
	json_decref(p);
}

/* A user's definition through the envelopes (issue 43, items 2 and 6): the
 * type map names the shipment lifecycle's types, INBOX_ORDER_ID_FIELD=subject
 * leaves MassTransit its default (the key in camelCase, shipmentId), a
 * binary-mode time that is an AMQP timestamp is the occurred_at the
 * definition records, and data that is an array or a string is applied by
 * an event that reads no data field. */
Test(envelopes, a_users_lifecycle_through_every_envelope, .timeout = 600)
{
	char lc[4200], path[4096], body[2048], props[2048], got[64];
	const char *env[] = { lc, "INBOX_ENVELOPE=auto", "INBOX_ORDER_ID_FIELD=subject",
		              "INBOX_TYPE_MAP=com.example.labelled=ShipmentLabelled,com.example.picked=ParcelPickedUp", NULL };
	const char *margs[] = { "migrate", NULL };
	struct db *d;
	struct mq *m;
	pid_t w;
	int st;

	itest_fresh();
	d = itest_db();
	cr_assert_eq(db_exec(d, "DROP TABLE IF EXISTS shipments, shipment_events, shipment_locks"), ST_OK);
	snprintf(lc, sizeof lc, "INBOX_LIFECYCLE=%s", itest_source("lifecycles/shipment.json", path, sizeof path));
	st = itest_wait_exit(itest_spawn(margs, env), 120);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "migrate with the shipment lifecycle (status %d)", st);
	m = itest_mq();
	/* s-1: binary mode, time as an AMQP timestamp (2026-12-02T00:00:00Z) */
	publish(m, "ShipmentLabelled", "{\"tracking_number\":\"TRK-1\"}",
	        "{\"content_type\":\"application/json\",\"headers\":{\"cloudEvents:specversion\":\"1.0\","
	        "\"cloudEvents:id\":\"l-1\",\"cloudEvents:source\":\"/carrier\",\"cloudEvents:type\":\"com.example.labelled\","
	        "\"cloudEvents:subject\":\"s-1\",\"cloudEvents:time\":{\"$timestamp\":1796169600}}}");
	/* s-1: structured, data an array */
	ce_structured(body, sizeof body, "p-1", "/carrier", "com.example.picked", "s-1", "[1,2]", NULL);
	publish(m, "ParcelPickedUp", body, ce_ct);
	/* s-2: labelled by MassTransit (its key: message.shipmentId), picked up
	 * in binary mode with a string for data */
	publish(m, "ShipmentLabelled",
	        "{\"messageId\":\"7a1c0000-0000-4000-8000-0000000000s2\",\"messageType\":[\"urn:message:Carrier:"
	        "ShipmentLabelled\"],\"message\":{\"shipmentId\":\"s-2\",\"tracking_number\":\"TRK-2\"}}",
	        mt_ct);
	ce_binary_props(props, sizeof props, "cloudEvents:", "p-2", "/carrier", "com.example.picked", "s-2", NULL);
	publish(m, "ParcelPickedUp", "\"hello\"", props);
	w = worker(env);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM shipments WHERE status = 'PickedUp'", 2, WAIT_S), 2);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert(itest_str1("SELECT DATE_FORMAT(labelled_at, '%Y-%m-%dT%H:%i:%sZ') FROM shipments WHERE id = ?", "s-1",
	                     got, sizeof got));
	cr_expect_str_eq(got, "2026-12-02T00:00:00Z");
}

/* Issue 43, item 3: a user's lifecycle takes CloudEvents keys as wide as
 * SPEC allows (255 characters of source and of id), as the built-in one
 * does; and a ledger created narrow by an older version is widened by
 * migrate, its rows kept. */
Test(envelopes, a_users_lifecycle_takes_cloudevents_keys_of_any_width, .timeout = 600)
{
	char lc[4200], path[4096], body[2048], src[256], id[256], got[512];
	const char *env[] = { lc, "INBOX_ENVELOPE=auto", NULL };
	const char *margs[] = { "migrate", NULL };
	struct db *d;
	struct mq *m;
	pid_t w;
	int st;

	itest_fresh();
	d = itest_db();
	cr_assert_eq(db_exec(d, "DROP TABLE IF EXISTS shipments, shipment_events, shipment_locks"), ST_OK);
	snprintf(lc, sizeof lc, "INBOX_LIFECYCLE=%s", itest_source("lifecycles/shipment.json", path, sizeof path));
	st = itest_wait_exit(itest_spawn(margs, env), 120);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "migrate with the shipment lifecycle (status %d)", st);
	/* The ledger as the code before this test made it, with a row. */
	cr_assert_eq(db_exec(d, "ALTER TABLE shipment_events MODIFY source VARCHAR(64) CHARACTER SET ascii COLLATE"
	                        " ascii_bin NOT NULL, MODIFY message_id VARCHAR(128) CHARACTER SET ascii COLLATE"
	                        " ascii_bin NOT NULL"),
	             ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_exec(d, "INSERT INTO shipment_events (shipment_id, consumer, source, message_id, type, outcome,"
	                        " from_status, to_status, version, applied_at) VALUES ('s-old', 'c', 'carrier', 'old-1',"
	                        " 'ShipmentLabelled', 'applied', 'None', 'Labelled', 1, NOW(6))"),
	             ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_commit(d), ST_OK);
	st = itest_wait_exit(itest_spawn(margs, env), 120);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "migrate widens the narrow ledger (status %d)", st);
	cr_expect_eq(itest_int("SELECT CHARACTER_MAXIMUM_LENGTH FROM information_schema.columns WHERE table_schema ="
	                       " DATABASE() AND table_name = 'shipment_events' AND column_name = 'source'"),
	             255);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM shipment_events WHERE message_id = 'old-1'"), 1, "its rows kept");

	memset(src, 'a', sizeof src);
	memcpy(src, "https://carrier.example.com/", 28);
	src[200] = '\0';
	memset(id, 'i', sizeof id);
	id[250] = '\0';
	ce_structured(body, sizeof body, id, src, "ShipmentLabelled", "s-wide", "{\"tracking_number\":\"TRK-W\"}", NULL);
	m = itest_mq();
	publish(m, "ShipmentLabelled", body, ce_ct);
	w = worker(env);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM shipments WHERE id = 's-wide'", 1, WAIT_S), 1,
	             "applied, not dead-lettered");
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert(itest_str1("SELECT source FROM shipment_events WHERE shipment_id = ?", "s-wide", got, sizeof got));
	cr_expect_str_eq(got, src);
	cr_assert(itest_str1("SELECT message_id FROM shipment_events WHERE shipment_id = ?", "s-wide", got, sizeof got));
	cr_expect_str_eq(got, id);
	cr_expect_eq(itest_queue_depth(itest_cfg()->dlq), 0);
}
