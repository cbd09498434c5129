/*
 * gen_props_corpus.c - writes the seed corpus of fuzz_props: AMQP basic
 * property lists encoded by rabbitmq-c's amqp_encode_properties, the bytes
 * a content header carries on the wire.
 *
 *   gen_props_corpus DIR     (fuzz/corpus/props/ is what it wrote)
 *
 * The sets are what reaches the worker: our own publishes, quorum-queue
 * bookkeeping, a broker's x-death, and what a careless or hostile publisher
 * sends: byte arrays and strings that are not UTF-8 or hold NUL, every
 * field kind, nested tables and arrays, more headers than we keep, long
 * values, duplicate keys.  Built by -Dfuzz=true; rerun it only to change
 * the seeds.
 */
#include <amqp.h>
#include <amqp_framing.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ENC_MAX (1 << 17)
#define NEST_DEPTH 40

static const char *outdir;
static int failures;

static amqp_bytes_t str_bytes(const char *s)
{
	return amqp_cstring_bytes(s);
}

static amqp_bytes_t mem_bytes(const void *s, size_t n)
{
	amqp_bytes_t b = { .len = n, .bytes = (void *)s };
	return b;
}

static void emit(const char *name, amqp_basic_properties_t *p)
{
	static unsigned char buf[ENC_MAX];
	char path[4096];
	FILE *f;
	int n = amqp_encode_properties(AMQP_BASIC_CLASS, p, mem_bytes(buf, sizeof buf));

	if (n < 0) {
		fprintf(stderr, "%s: encode: %s\n", name, amqp_error_string2(n));
		failures++;
		return;
	}
	snprintf(path, sizeof path, "%s/%s", outdir, name);
	f = fopen(path, "wb");
	if (f == NULL || fwrite(buf, 1, (size_t)n, f) != (size_t)n) {
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
		failures++;
	}
	if (f != NULL && fclose(f) != 0) {
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
		failures++;
	}
}

static void with_headers(amqp_basic_properties_t *p, amqp_table_entry_t *e, int n)
{
	p->_flags |= AMQP_BASIC_HEADERS_FLAG;
	p->headers.num_entries = n;
	p->headers.entries = e;
}

static amqp_field_value_t utf8(amqp_bytes_t b)
{
	amqp_field_value_t v = { .kind = AMQP_FIELD_KIND_UTF8 };
	v.value.bytes = b;
	return v;
}

static amqp_field_value_t bytes(amqp_bytes_t b)
{
	amqp_field_value_t v = { .kind = AMQP_FIELD_KIND_BYTES };
	v.value.bytes = b;
	return v;
}

static amqp_field_value_t i64(int64_t x)
{
	amqp_field_value_t v = { .kind = AMQP_FIELD_KIND_I64 };
	v.value.i64 = x;
	return v;
}

static amqp_table_entry_t entry(const char *key, amqp_field_value_t v)
{
	amqp_table_entry_t e = { .key = str_bytes(key), .value = v };
	return e;
}

/* What the worker and loadgen publish: persistent JSON with ids. */
static void ours(void)
{
	amqp_basic_properties_t p = { 0 };
	amqp_table_entry_t h[1];

	p._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
	           AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TYPE_FLAG;
	p.content_type = str_bytes("application/json");
	p.delivery_mode = AMQP_DELIVERY_PERSISTENT;
	p.message_id = str_bytes("m-000001");
	p.type = str_bytes("OrderCreated");
	emit("ours-plain", &p);
	h[0] = entry("x-published-us", i64(1764520000000000));
	with_headers(&p, h, 1);
	emit("ours-published-us", &p);
}

static void empty_and_every_field(void)
{
	amqp_basic_properties_t p = { 0 };
	amqp_table_entry_t h[2];

	emit("empty", &p);
	p._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_CONTENT_ENCODING_FLAG |
	           AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_PRIORITY_FLAG |
	           AMQP_BASIC_CORRELATION_ID_FLAG | AMQP_BASIC_REPLY_TO_FLAG |
	           AMQP_BASIC_EXPIRATION_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG |
	           AMQP_BASIC_TIMESTAMP_FLAG | AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_USER_ID_FLAG |
	           AMQP_BASIC_APP_ID_FLAG | AMQP_BASIC_CLUSTER_ID_FLAG;
	p.content_type = str_bytes("application/json");
	p.content_encoding = str_bytes("identity");
	p.delivery_mode = 2;
	p.priority = 9;
	p.correlation_id = str_bytes("corr-1");
	p.reply_to = str_bytes("amq.rabbitmq.reply-to");
	p.expiration = str_bytes("60000");
	p.message_id = str_bytes("m-every-field");
	p.timestamp = 1764520000;
	p.type = str_bytes("PaymentConfirmed");
	p.user_id = str_bytes("inbox");
	p.app_id = str_bytes("payments");
	p.cluster_id = str_bytes("c1");
	emit("every-field", &p);
	h[0] = entry("x-delivery-count", i64(3));
	h[1] = entry("x-inbox-reason", utf8(str_bytes("malformed-json")));
	with_headers(&p, h, 2);
	emit("every-field-headers", &p);
}

/* Issue 9 item 1: a header that is a byte array and not UTF-8. */
static void poison(void)
{
	static const unsigned char trace[] = { 0xff, 0xfe, 0x00, 0x41, 0x80 };
	static const char bad_utf8[] = "caf\xc3\x28 \xed\xa0\x80 \xf8\x88\x80\x80\x80";
	static const char with_nul[] = "a\0b";
	amqp_basic_properties_t p = { 0 };
	amqp_table_entry_t h[3];

	h[0] = entry("trace", bytes(mem_bytes(trace, sizeof trace)));
	with_headers(&p, h, 1);
	emit("header-bytes-not-utf8", &p);
	h[0] = entry("trace", utf8(mem_bytes(bad_utf8, sizeof bad_utf8 - 1)));
	emit("header-utf8-invalid", &p);
	h[0] = entry("trace", utf8(mem_bytes(with_nul, sizeof with_nul - 1)));
	emit("header-utf8-nul", &p);
	h[0] = entry("trace", bytes(mem_bytes(with_nul, sizeof with_nul - 1)));
	emit("header-bytes-nul", &p);
	h[0].key = mem_bytes(bad_utf8, sizeof bad_utf8 - 1);
	h[0].value = utf8(str_bytes("ok"));
	emit("header-key-not-utf8", &p);
	h[0].key = mem_bytes(with_nul, sizeof with_nul - 1);
	emit("header-key-nul", &p);

	p._flags = AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_APP_ID_FLAG |
	           AMQP_BASIC_CONTENT_TYPE_FLAG;
	p.message_id = mem_bytes(bad_utf8, sizeof bad_utf8 - 1);
	p.type = mem_bytes(with_nul, sizeof with_nul - 1);
	p.app_id = mem_bytes(trace, sizeof trace);
	p.content_type = str_bytes("application/json");
	emit("props-not-utf8", &p);
	h[0] = entry("trace", bytes(mem_bytes(trace, sizeof trace)));
	h[1] = entry("x-published-us", utf8(str_bytes("not a number")));
	h[2] = entry("x-delivery-count", bytes(mem_bytes(trace, 2)));
	with_headers(&p, h, 3);
	emit("props-and-headers-not-utf8", &p);
}

static void every_kind(void)
{
	static amqp_field_value_t arr[3];
	static amqp_table_entry_t inner[2];
	amqp_basic_properties_t p = { 0 };
	amqp_table_entry_t h[16];
	int n = 0;

	h[n].key = str_bytes("bool");
	h[n].value.kind = AMQP_FIELD_KIND_BOOLEAN;
	h[n++].value.value.boolean = 1;
	h[n].key = str_bytes("i8");
	h[n].value.kind = AMQP_FIELD_KIND_I8;
	h[n++].value.value.i8 = -128;
	h[n].key = str_bytes("u8");
	h[n].value.kind = AMQP_FIELD_KIND_U8;
	h[n++].value.value.u8 = 255;
	h[n].key = str_bytes("i16");
	h[n].value.kind = AMQP_FIELD_KIND_I16;
	h[n++].value.value.i16 = -32768;
	h[n].key = str_bytes("u16");
	h[n].value.kind = AMQP_FIELD_KIND_U16;
	h[n++].value.value.u16 = 65535;
	h[n].key = str_bytes("i32");
	h[n].value.kind = AMQP_FIELD_KIND_I32;
	h[n++].value.value.i32 = INT32_MIN;
	h[n].key = str_bytes("u32");
	h[n].value.kind = AMQP_FIELD_KIND_U32;
	h[n++].value.value.u32 = UINT32_MAX;
	h[n++] = entry("i64", i64(INT64_MIN));
	h[n].key = str_bytes("u64");
	h[n].value.kind = AMQP_FIELD_KIND_U64;
	h[n++].value.value.u64 = UINT64_MAX; /* does not fit json_int_t */
	h[n].key = str_bytes("f32");
	h[n].value.kind = AMQP_FIELD_KIND_F32;
	h[n++].value.value.f32 = 1.5f;
	h[n].key = str_bytes("f64-nan");
	h[n].value.kind = AMQP_FIELD_KIND_F64;
	h[n++].value.value.f64 = NAN; /* JSON has no NaN */
	h[n].key = str_bytes("decimal");
	h[n].value.kind = AMQP_FIELD_KIND_DECIMAL;
	h[n].value.value.decimal.decimals = 2;
	h[n++].value.value.decimal.value = 4200;
	h[n].key = str_bytes("timestamp");
	h[n].value.kind = AMQP_FIELD_KIND_TIMESTAMP;
	h[n++].value.value.u64 = 1764520000;
	h[n].key = str_bytes("void");
	h[n++].value.kind = AMQP_FIELD_KIND_VOID;

	inner[0] = entry("queue", utf8(str_bytes("orders.inbox")));
	inner[1] = entry("count", i64(2));
	arr[0].kind = AMQP_FIELD_KIND_TABLE;
	arr[0].value.table.num_entries = 2;
	arr[0].value.table.entries = inner;
	arr[1] = utf8(str_bytes("x"));
	arr[2] = i64(7);
	h[n].key = str_bytes("x-death");
	h[n].value.kind = AMQP_FIELD_KIND_ARRAY;
	h[n].value.value.array.num_entries = 3;
	h[n++].value.value.array.entries = arr;
	h[n].key = str_bytes("table");
	h[n].value.kind = AMQP_FIELD_KIND_TABLE;
	h[n].value.value.table.num_entries = 2;
	h[n++].value.value.table.entries = inner;
	with_headers(&p, h, n);
	emit("header-every-kind", &p);

	with_headers(&p, h + 8, 2); /* u64 max, f32 */
	emit("header-u64-max", &p);
	with_headers(&p, h + 10, 1);
	emit("header-f64-nan", &p);
	h[10].value.value.f64 = INFINITY;
	emit("header-f64-inf", &p);
}

/* Tables inside tables, as deep as a publisher likes. */
static void nested(void)
{
	static amqp_table_entry_t level[NEST_DEPTH];
	amqp_basic_properties_t p = { 0 };

	for (int i = 0; i < NEST_DEPTH; i++) {
		level[i].key = str_bytes("n");
		if (i == NEST_DEPTH - 1) {
			level[i].value = utf8(str_bytes("leaf"));
		} else {
			level[i].value.kind = AMQP_FIELD_KIND_TABLE;
			level[i].value.value.table.num_entries = 1;
			level[i].value.value.table.entries = &level[i + 1];
		}
	}
	with_headers(&p, level, 1);
	emit("header-nested-tables", &p);
}

/* Sizes: more headers than MQ_HEADERS_MAX, long keys and values. */
static void sizes(void)
{
	static amqp_table_entry_t h[100];
	static char keys[100][8];
	static char longval[4000];
	static char longkey[255];
	amqp_basic_properties_t p = { 0 };

	for (int i = 0; i < 100; i++) {
		snprintf(keys[i], sizeof keys[i], "h%03d", i);
		h[i] = entry(keys[i], i64(i));
	}
	with_headers(&p, h, 100);
	emit("headers-100", &p);

	memset(longval, 'v', sizeof longval);
	memset(longkey, 'k', sizeof longkey);
	h[0].key = mem_bytes(longkey, sizeof longkey);
	h[0].value = utf8(mem_bytes(longval, sizeof longval));
	with_headers(&p, h, 1);
	p._flags |= AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TYPE_FLAG;
	p.message_id = mem_bytes(longval, 255);
	p.type = mem_bytes(longval, 255);
	emit("long-values", &p);

	h[0] = entry("dup", utf8(str_bytes("first")));
	h[1] = entry("dup", utf8(str_bytes("second")));
	h[2] = entry("", utf8(str_bytes("empty key")));
	with_headers(&p, h, 3);
	p._flags &= ~(amqp_flags_t)(AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TYPE_FLAG);
	emit("headers-duplicate-and-empty-key", &p);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: gen_props_corpus DIR\n");
		return 2;
	}
	outdir = argv[1];
	ours();
	empty_and_every_field();
	poison();
	every_kind();
	nested();
	sizes();
	return failures == 0 ? 0 : 1;
}
