/*
 * test_poison.c - one message's fault stays its own (SPEC.md, AMQP
 * topology): a delivery whose properties do not serialise, whose routing key
 * or values a column refuses, or whose dead-letter copy cannot be routed for
 * a while, ends in the DLQ with its reason (or waits, unacked, for the
 * broker), and never costs another delivery an attempt.  The worker's log
 * must hold no "broker connection reset": a channel reset hands every
 * prefetched message back and raises its delivery count.
 *
 * Messages are published with librabbitmq directly: common/pub.c only sends
 * the header kinds the worker itself uses, and these tests need byte arrays,
 * tables, decimals and bytes that are not UTF-8.
 */
#include <criterion/criterion.h>
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"
#include "status.h"

#define WAIT_S 90

/* ---- a raw librabbitmq connection ------------------------------------------ */

static void raw_ok(amqp_connection_state_t c, const char *what)
{
	amqp_rpc_reply_t r = amqp_get_rpc_reply(c);
	cr_assert_eq(r.reply_type, AMQP_RESPONSE_NORMAL, "%s failed (reply type %d)", what, (int)r.reply_type);
}

static amqp_connection_state_t raw_open(void)
{
	const struct cfg_amqp *a = &itest_cfg()->amqp;
	amqp_connection_state_t c = amqp_new_connection();
	amqp_socket_t *s;
	amqp_rpc_reply_t r;

	cr_assert_not_null(c);
	s = amqp_tcp_socket_new(c);
	cr_assert_not_null(s);
	cr_assert_eq(amqp_socket_open(s, a->host, a->port), AMQP_STATUS_OK);
	r = amqp_login(c, a->vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, a->user, a->password);
	cr_assert_eq(r.reply_type, AMQP_RESPONSE_NORMAL, "login");
	cr_assert_not_null(amqp_channel_open(c, 1));
	raw_ok(c, "channel.open");
	cr_assert_not_null(amqp_confirm_select(c, 1));
	raw_ok(c, "confirm.select");
	return c;
}

static void raw_close(amqp_connection_state_t c)
{
	(void)amqp_channel_close(c, 1, AMQP_REPLY_SUCCESS);
	(void)amqp_connection_close(c, AMQP_REPLY_SUCCESS);
	cr_assert_eq(amqp_destroy_connection(c), AMQP_STATUS_OK);
}

/* Publish to the orders exchange and wait for the broker's ack. */
static void raw_publish(amqp_connection_state_t c, const char *rk, const char *body,
                        amqp_basic_properties_t *p)
{
	amqp_frame_t f;
	amqp_bytes_t b = { .len = strlen(body), .bytes = (void *)body };

	p->_flags |= AMQP_BASIC_DELIVERY_MODE_FLAG;
	p->delivery_mode = AMQP_DELIVERY_PERSISTENT;
	cr_assert_eq(amqp_basic_publish(c, 1, amqp_cstring_bytes(itest_cfg()->exchange), amqp_cstring_bytes(rk), 0,
	                                0, p, b),
	             AMQP_STATUS_OK);
	cr_assert_eq(amqp_simple_wait_frame(c, &f), AMQP_STATUS_OK);
	cr_assert_eq(f.frame_type, AMQP_FRAME_METHOD);
	cr_assert_eq(f.payload.method.id, AMQP_BASIC_ACK_METHOD, "publish not acked (method 0x%08x)",
	             f.payload.method.id);
}

/* basic.get + ack; false when the queue stays empty for timeout_s. */
static bool raw_get(amqp_connection_state_t c, const char *queue, amqp_message_t *msg, int timeout_s)
{
	for (int i = 0; i <= timeout_s * 10; i++) {
		amqp_rpc_reply_t r;

		amqp_maybe_release_buffers(c);
		r = amqp_basic_get(c, 1, amqp_cstring_bytes(queue), 1);
		cr_assert_eq(r.reply_type, AMQP_RESPONSE_NORMAL, "basic.get");
		if (r.reply.id == AMQP_BASIC_GET_OK_METHOD) {
			r = amqp_read_message(c, 1, msg, 0);
			cr_assert_eq(r.reply_type, AMQP_RESPONSE_NORMAL, "read message");
			return true;
		}
		if (i < timeout_s * 10)
			usleep(100 * 1000);
	}
	return false;
}

static const amqp_field_value_t *hdr(const amqp_message_t *m, const char *key)
{
	const amqp_basic_properties_t *p = &m->properties;

	if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG))
		return NULL;
	for (int i = 0; i < p->headers.num_entries; i++) {
		const amqp_table_entry_t *e = &p->headers.entries[i];
		if (e->key.len == strlen(key) && memcmp(e->key.bytes, key, e->key.len) == 0)
			return &e->value;
	}
	return NULL;
}

/* A string header as a NUL-terminated copy ("" when absent). */
static void hdr_str(const amqp_message_t *m, const char *key, char *buf, size_t cap)
{
	const amqp_field_value_t *v = hdr(m, key);

	buf[0] = '\0';
	if (v != NULL && (v->kind == AMQP_FIELD_KIND_UTF8 || v->kind == AMQP_FIELD_KIND_BYTES))
		snprintf(buf, cap, "%.*s", (int)v->value.bytes.len, (const char *)v->value.bytes.bytes);
}

static bool bytes_eq(amqp_bytes_t b, const void *want, size_t len)
{
	return b.len == len && memcmp(b.bytes, want, len) == 0;
}

static amqp_table_entry_t entry(const char *key, amqp_field_value_t v)
{
	return (amqp_table_entry_t){ .key = amqp_cstring_bytes(key), .value = v };
}

static amqp_field_value_t fv_bytes(uint8_t kind, const void *p, size_t len)
{
	amqp_field_value_t v = { .kind = kind };
	v.value.bytes.bytes = (void *)p;
	v.value.bytes.len = len;
	return v;
}

/* The exchanges and queues exist before anything is published. */
static void topology(void)
{
	struct mq *m = itest_mq();
	mq_close(&m);
}

static const unsigned char NOT_UTF8[] = { 0xff, 0xfe, 0x00, 0x41, 0x80, 0xc3 };

/* ---- 1. properties that do not serialise ----------------------------------- */

/* issue 9 item 1 as seen: one thread, a body that is not JSON with a byte
 * array header that is not UTF-8, then 100 valid events. */
Test(poison, bytes_header_poison_is_dead_lettered_alone, .timeout = 300)
{
	enum { N = 100 };
	char body[512], id[32], order[32], logf[256], reason[64], detail[512];
	amqp_connection_state_t c;
	amqp_table_entry_t h[2];
	amqp_basic_properties_t p = { 0 };
	amqp_message_t got;
	struct mq *m;
	pid_t w;

	itest_fresh();
	itest_log_path(logf, sizeof logf, "poison-bytes");
	topology();
	c = raw_open();
	h[0] = entry("trace", fv_bytes(AMQP_FIELD_KIND_BYTES, NOT_UTF8, sizeof NOT_UTF8));
	h[1] = entry("note", fv_bytes(AMQP_FIELD_KIND_UTF8, "\xc3\x28 bad", 6));
	p._flags = AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG;
	p.message_id = amqp_cstring_bytes("poison-1");
	p.headers = (amqp_table_t){ .num_entries = 2, .entries = h };
	raw_publish(c, "order.OrderCreated", "this is not json", &p);
	m = itest_mq();
	for (int i = 0; i < N; i++) {
		snprintf(id, sizeof id, "ok-%d", i);
		snprintf(order, sizeof order, "o-%d", i);
		itest_event(body, sizeof body, id, "OrderCreated", order);
		itest_publish_async(m, "OrderCreated", body, NULL);
	}
	itest_confirm_all(m);
	mq_close(&m);

	w = itest_worker_logged(1, NULL, logf);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", N, 10), N, "every valid message applied");

	cr_assert(raw_get(c, itest_cfg()->dlq, &got, 10), "the poison message is in the DLQ");
	hdr_str(&got, "x-inbox-reason", reason, sizeof reason);
	hdr_str(&got, "x-inbox-detail", detail, sizeof detail);
	cr_expect_str_eq(reason, "malformed-json", "reason (detail: %s)", detail);
	cr_expect(strstr(detail, "trace") != NULL && strstr(detail, "note") != NULL,
	          "the detail names the escaped headers: %s", detail);
	cr_expect(bytes_eq(got.properties.message_id, "poison-1", 8));
	cr_expect(bytes_eq(got.body, "this is not json", 16));
	{
		const amqp_field_value_t *t = hdr(&got, "trace"), *n = hdr(&got, "note");
		cr_assert_not_null(t, "the trace header is kept");
		cr_expect_eq(t->kind, AMQP_FIELD_KIND_BYTES, "a byte array comes back as one");
		cr_expect(bytes_eq(t->value.bytes, NOT_UTF8, sizeof NOT_UTF8), "the same bytes");
		cr_assert_not_null(n, "the note header is kept");
		cr_expect(bytes_eq(n->value.bytes, "\xc3\x28 bad", 6), "the same bytes");
	}
	amqp_destroy_message(&got);
	cr_expect(!raw_get(c, itest_cfg()->dlq, &got, 0), "no valid message in the DLQ");
	raw_close(c);
	itest_stop_ok(w);
	cr_expect(!itest_log_has(logf, "broker connection reset"), "one message must not reset the channel (%s)",
	          logf);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM processed_messages"), N);
}

/* Every kind of header value and property a producer may send: nested
 * tables and arrays, decimals, void, floats JSON cannot carry, a huge
 * value, more headers than are kept, bytes that are not UTF-8 in the
 * correlation-id.  (No unsigned 64-bit value and no NaN: RabbitMQ refuses
 * both in a frame, so they never reach a consumer.)  The message is held (its order is unseen), so its
 * properties go through held_events.props and, when the hold expires,
 * come back on the dead-letter copy the outbox publishes. */
Test(poison, every_property_kind_survives_a_hold, .timeout = 300)
{
	enum { NH = 90 };
	static char huge[40000];
	char body[512], logf[256], reason[64], detail[512], key[NH][16];
	amqp_connection_state_t c;
	amqp_table_entry_t h[NH], inner[2];
	amqp_field_value_t arr[3];
	amqp_basic_properties_t p = { 0 };
	amqp_message_t got;
	pid_t w;
	int nh = 0;

	itest_fresh();
	itest_log_path(logf, sizeof logf, "poison-kinds");
	memset(huge, 'x', sizeof huge - 1);
	inner[0] = entry("deep", fv_bytes(AMQP_FIELD_KIND_BYTES, NOT_UTF8, sizeof NOT_UTF8));
	inner[1] = (amqp_table_entry_t){ .key = amqp_cstring_bytes("n"),
	                                 .value = { .kind = AMQP_FIELD_KIND_I32, .value.i32 = -7 } };
	arr[0] = fv_bytes(AMQP_FIELD_KIND_UTF8, "a", 1);
	arr[1] = (amqp_field_value_t){ .kind = AMQP_FIELD_KIND_BOOLEAN, .value.boolean = 1 };
	arr[2] = (amqp_field_value_t){ .kind = AMQP_FIELD_KIND_TABLE,
	                               .value.table = { .num_entries = 2, .entries = inner } };
	h[nh++] = entry("trace", fv_bytes(AMQP_FIELD_KIND_BYTES, NOT_UTF8, sizeof NOT_UTF8));
	h[nh++] = (amqp_table_entry_t){ .key = amqp_cstring_bytes("tbl"),
	                                .value = { .kind = AMQP_FIELD_KIND_TABLE,
	                                           .value.table = { .num_entries = 2, .entries = inner } } };
	h[nh++] = (amqp_table_entry_t){ .key = amqp_cstring_bytes("arr"),
	                                .value = { .kind = AMQP_FIELD_KIND_ARRAY,
	                                           .value.array = { .num_entries = 3, .entries = arr } } };
	h[nh++] = (amqp_table_entry_t){ .key = amqp_cstring_bytes("dec"),
	                                .value = { .kind = AMQP_FIELD_KIND_DECIMAL,
	                                           .value.decimal = { .decimals = 2, .value = 12345 } } };
	h[nh++] = (amqp_table_entry_t){ .key = amqp_cstring_bytes("nothing"), .value = { .kind = AMQP_FIELD_KIND_VOID } };
	h[nh++] = entry("huge", fv_bytes(AMQP_FIELD_KIND_UTF8, huge, sizeof huge - 1));
	while (nh < NH) {
		snprintf(key[nh], sizeof key[nh], "h%02d", nh);
		h[nh] = entry(key[nh], fv_bytes(AMQP_FIELD_KIND_UTF8, "v", 1));
		nh++;
	}
	p._flags = AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_CORRELATION_ID_FLAG;
	p.message_id = amqp_cstring_bytes("kinds-1");
	p.correlation_id = (amqp_bytes_t){ .len = sizeof NOT_UTF8, .bytes = (void *)NOT_UTF8 };
	p.headers = (amqp_table_t){ .num_entries = nh, .entries = h };
	topology();
	c = raw_open();
	itest_event(body, sizeof body, "kinds-1", "PaymentAuthorized", "o-unseen");
	raw_publish(c, "order.PaymentAuthorized", body, &p);

	w = itest_worker_logged(1, (const char *[]){ "INBOX_HOLD_TTL=1s", NULL }, logf);
	cr_assert(raw_get(c, itest_cfg()->dlq, &got, WAIT_S), "the held event is dead-lettered when its hold expires");
	hdr_str(&got, "x-inbox-reason", reason, sizeof reason);
	hdr_str(&got, "x-inbox-detail", detail, sizeof detail);
	cr_expect_str_eq(reason, "hold-expired", "reason (detail %s)", detail);
	cr_expect(strstr(detail, "huge") != NULL, "the detail names what was dropped: %s", detail);
	cr_expect(bytes_eq(got.properties.message_id, "kinds-1", 7));
	cr_expect(bytes_eq(got.properties.correlation_id, NOT_UTF8, sizeof NOT_UTF8), "correlation-id bytes kept");
	{
		const amqp_field_value_t *v;

		v = hdr(&got, "trace");
		cr_assert_not_null(v);
		cr_expect_eq(v->kind, AMQP_FIELD_KIND_BYTES);
		cr_expect(bytes_eq(v->value.bytes, NOT_UTF8, sizeof NOT_UTF8));
		v = hdr(&got, "tbl");
		cr_assert_not_null(v, "a nested table is kept");
		cr_assert_eq(v->kind, AMQP_FIELD_KIND_TABLE);
		cr_assert_eq(v->value.table.num_entries, 2);
		cr_expect(bytes_eq(v->value.table.entries[0].key, "deep", 4));
		cr_expect_eq(v->value.table.entries[0].value.kind, AMQP_FIELD_KIND_BYTES);
		cr_expect(bytes_eq(v->value.table.entries[0].value.value.bytes, NOT_UTF8, sizeof NOT_UTF8));
		v = hdr(&got, "arr");
		cr_assert_not_null(v, "an array is kept");
		cr_assert_eq(v->kind, AMQP_FIELD_KIND_ARRAY);
		cr_assert_eq(v->value.array.num_entries, 3);
		cr_expect_eq(v->value.array.entries[2].kind, AMQP_FIELD_KIND_TABLE);
		v = hdr(&got, "dec");
		cr_assert_not_null(v, "a decimal is kept");
		cr_expect_eq(v->kind, AMQP_FIELD_KIND_DECIMAL);
		cr_expect(v->value.decimal.decimals == 2 && v->value.decimal.value == 12345);
		v = hdr(&got, "nothing");
		cr_assert_not_null(v, "void is kept");
		cr_expect_eq(v->kind, AMQP_FIELD_KIND_VOID);
		cr_expect_null(hdr(&got, "huge"), "a huge value is dropped, not stored");
		cr_expect_not_null(hdr(&got, "h10"), "the first headers are kept");
		cr_expect_null(hdr(&got, "h89"), "headers past the limit are dropped");
	}
	amqp_destroy_message(&got);
	raw_close(c);
	itest_stop_ok(w);
	cr_expect(!itest_log_has(logf, "broker connection reset"), "see %s", logf);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE outcome = 'dead_lettered'"), 1);
}

/* ---- 3. values a column refuses ------------------------------------------- */

/* n valid OrderCreated messages (PREFIX-ok-I, orders o-I) and one
 * PaymentAuthorized, bad_id, for an order that does not exist yet (so it
 * would be held, its routing key stored), published under bad_rk after
 * the valid message bad_after (-1: before them all).  A worker with
 * batches of 8 must apply the n valid ones and dead-letter bad_id alone,
 * with reason and a detail holding detail_has, without a channel reset. */
static void one_refused_among_valid(const char *prefix, int n, int bad_after, const char *bad_id,
                                    const char *bad_rk, const char *reason_want, const char *detail_has)
{
	char body[512], id[32], order[32], logf[256], reason[64], detail[512];
	amqp_connection_state_t c;
	amqp_basic_properties_t p = { 0 };
	amqp_message_t got;
	pid_t w;

	snprintf(id, sizeof id, "poison-%s", prefix);
	itest_log_path(logf, sizeof logf, id);
	topology();
	c = raw_open();
	for (int i = -1; i < n; i++) {
		if (i >= 0) {
			snprintf(id, sizeof id, "%s-ok-%d", prefix, i);
			snprintf(order, sizeof order, "o-%d", i);
			itest_event(body, sizeof body, id, "OrderCreated", order);
			p = (amqp_basic_properties_t){ 0 };
			raw_publish(c, "order.OrderCreated", body, &p);
		}
		if (i == bad_after) {
			itest_event(body, sizeof body, bad_id, "PaymentAuthorized", "o-unseen");
			p = (amqp_basic_properties_t){ 0 };
			raw_publish(c, bad_rk, body, &p);
		}
	}
	w = itest_worker_logged(1, (const char *[]){ "INBOX_BATCH=8", NULL }, logf);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", n, 10), n);
	cr_assert(raw_get(c, itest_cfg()->dlq, &got, 10), "the message is in the DLQ");
	hdr_str(&got, "x-inbox-reason", reason, sizeof reason);
	hdr_str(&got, "x-inbox-detail", detail, sizeof detail);
	cr_expect_str_eq(reason, reason_want, "reason (detail %s)", detail);
	cr_expect(strstr(detail, detail_has) != NULL, "detail: %s", detail);
	snprintf(id, sizeof id, "\"message_id\":\"%s\"", bad_id);
	cr_expect(memmem(got.body.bytes, got.body.len, id, strlen(id)) != NULL, "the refused message itself");
	amqp_destroy_message(&got);
	cr_expect(!raw_get(c, itest_cfg()->dlq, &got, 0), "nothing else in the DLQ");
	raw_close(c);
	itest_stop_ok(w);
	cr_expect(!itest_log_has(logf, "broker connection reset"), "see %s", logf);
}

/* A routing key that is not UTF-8 cannot be stored with a held event
 * (held_events.routing_key is utf8mb4): it is refused at the boundary
 * with its reason, and the valid messages beside it in a batch stand. */
Test(poison, routing_key_not_utf8_is_dead_lettered, .timeout = 300)
{
	itest_fresh();
	one_refused_among_valid("rk", 20, -1, "rk-1", "order.\xff\xfe", "invalid-field", "routing key");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM held_events"), 0);
}

/* A value the database refuses for its column (here: a held event's
 * routing key, with the column narrowed so that a valid key no longer
 * fits) is the message's own fault: its batch is split, the message is
 * dead-lettered as unprocessable with the server's message, the others
 * are applied. */
Test(poison, value_refused_by_the_database_is_unprocessable, .timeout = 300)
{
	itest_fresh();
	cr_assert_eq(db_exec(itest_db(), "ALTER TABLE held_events MODIFY routing_key VARCHAR(8) NOT NULL"), ST_OK);
	one_refused_among_valid("ref", 12, 6, "ref-1", "order.PaymentAuthorized", "unprocessable", "too long");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE message_id = 'ref-1'"), 0,
	             "the refused message's claim is rolled back");
}

/* ---- 4. faults that are not the message's ----------------------------------- */

/* A missing table is not the messages' fault and not the broker's: the
 * batch is kept and retried until the table is back; nothing is
 * dead-lettered and the channel is not reset. */
Test(poison, missing_table_keeps_messages_without_reset, .timeout = 300)
{
	enum { N = 10 };
	char body[512], id[32], order[32], logf[256];
	struct db *db;
	struct mq *m;
	pid_t w;

	itest_fresh();
	db = itest_db();
	itest_log_path(logf, sizeof logf, "poison-table");
	/* At debug level each retry is logged with its attempt number. */
	w = itest_worker_logged(1, (const char *[]){ "INBOX_LOG_LEVEL=debug", NULL }, logf);
	itest_wait_log(logf, "consuming", 60);
	cr_assert_eq(db_exec(db, "RENAME TABLE order_events TO order_events_away"), ST_OK);
	m = itest_mq();
	for (int i = 0; i < N; i++) {
		snprintf(id, sizeof id, "tbl-%d", i);
		snprintf(order, sizeof order, "o-%d", i);
		itest_event(body, sizeof body, id, "OrderCreated", order);
		itest_publish_async(m, "OrderCreated", body, NULL);
	}
	itest_confirm_all(m);
	mq_close(&m);
	/* Kept and retried a few times while the table is away. */
	cr_assert_geq(itest_wait_log_lines(logf, (const char *const[]){ "transaction failed", "attempt=3", NULL }, 1, 60),
	              1, "no third attempt, see %s", logf);
	cr_assert_eq(db_exec(db, "RENAME TABLE order_events_away TO order_events"), ST_OK);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", N, WAIT_S), N);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	cr_expect_eq(itest_queue_depth(itest_cfg()->dlq), 0, "nothing dead-lettered");
	cr_expect(!itest_log_has(logf, "broker connection reset"), "see %s", logf);
}

/* The DLQ unbound from orders.dlx: the mandatory dead-letter publish comes
 * back unroutable.  That is the topology's fault: the message stays
 * unacked and the publish is retried with backoff until the queue is bound
 * again; the consumer channel is not reset. */
Test(poison, unroutable_dead_letter_is_retried_without_reset, .timeout = 300)
{
	enum { N = 20 };
	char body[512], id[32], order[32], logf[256], reason[64];
	amqp_connection_state_t c;
	amqp_basic_properties_t p = { 0 };
	amqp_message_t got;
	pid_t w;

	itest_fresh();
	itest_log_path(logf, sizeof logf, "poison-unbound");
	/* The worker binds the DLQ when it starts: unbind it afterwards.  At
	 * debug level each retry is logged with its attempt number. */
	w = itest_worker_logged(1, (const char *[]){ "INBOX_LOG_LEVEL=debug", NULL }, logf);
	itest_wait_log(logf, "consuming", 60);
	c = raw_open();
	cr_assert_not_null(amqp_queue_unbind(c, 1, amqp_cstring_bytes(itest_cfg()->dlq),
	                                     amqp_cstring_bytes(itest_cfg()->dlx), amqp_cstring_bytes("#"),
	                                     amqp_empty_table));
	raw_ok(c, "queue.unbind");
	p._flags = AMQP_BASIC_MESSAGE_ID_FLAG;
	p.message_id = amqp_cstring_bytes("unbound-1");
	raw_publish(c, "order.OrderCreated", "{not json", &p);
	/* Raw publishes: itest_mq would declare the topology, binding the
	 * DLQ again. */
	for (int i = 0; i < N; i++) {
		snprintf(id, sizeof id, "ub-%d", i);
		snprintf(order, sizeof order, "o-%d", i);
		itest_event(body, sizeof body, id, "OrderCreated", order);
		p = (amqp_basic_properties_t){ 0 };
		raw_publish(c, "order.OrderCreated", body, &p);
	}
	/* Kept and retried a few times while the DLQ is unbound. */
	cr_assert_geq(itest_wait_log_lines(logf, (const char *const[]){ "dead-letter publish failed", "attempt=3", NULL },
	                                   1, 60),
	              1, "no third attempt, see %s", logf);
	cr_assert_not_null(amqp_queue_bind(c, 1, amqp_cstring_bytes(itest_cfg()->dlq),
	                                   amqp_cstring_bytes(itest_cfg()->dlx), amqp_cstring_bytes("#"),
	                                   amqp_empty_table));
	raw_ok(c, "queue.bind");
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM order_events", N, 10), N);
	cr_assert(raw_get(c, itest_cfg()->dlq, &got, 10), "the malformed message is in the DLQ");
	hdr_str(&got, "x-inbox-reason", reason, sizeof reason);
	cr_expect_str_eq(reason, "malformed-json");
	cr_expect(bytes_eq(got.properties.message_id, "unbound-1", 9));
	amqp_destroy_message(&got);
	cr_expect(!raw_get(c, itest_cfg()->dlq, &got, 0), "only once, nothing else");
	raw_close(c);
	itest_stop_ok(w);
	cr_expect(!itest_log_has(logf, "broker connection reset"), "see %s", logf);
}

/* x-published-us only measures latency: a value the DATETIME column cannot
 * hold (FROM_UNIXTIME ends in 2038 on MariaDB 10.11; strict mode then
 * refuses the row) must not cost a valid message anything. */
Test(poison, absurd_published_header_is_ignored, .timeout = 300)
{
	char body[512], logf[256];
	amqp_connection_state_t c;
	amqp_table_entry_t h[1];
	amqp_basic_properties_t p = { 0 };
	pid_t w;

	itest_fresh();
	itest_log_path(logf, sizeof logf, "poison-published");
	topology();
	c = raw_open();
	h[0] = (amqp_table_entry_t){ .key = amqp_cstring_bytes(MQ_HEADER_PUBLISHED_US),
	                             .value = { .kind = AMQP_FIELD_KIND_I64, .value.i64 = INT64_C(100000000000000000) } };
	p._flags = AMQP_BASIC_HEADERS_FLAG;
	p.headers = (amqp_table_t){ .num_entries = 1, .entries = h };
	itest_event(body, sizeof body, "pub-1", "OrderCreated", "o-1");
	raw_publish(c, "order.OrderCreated", body, &p);
	raw_close(c);
	w = itest_worker_logged(1, NULL, logf);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM order_events"), 1, "applied (see %s)", logf);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE published_at IS NULL"), 1);
	cr_expect_eq(itest_queue_depth(itest_cfg()->dlq), 0);
}
