/*
 * fuzz_envelope.c - libFuzzer target for the envelope layer (env_parse:
 * CloudEvents structured and binary mode, MassTransit, native, auto) and
 * the trace context it reads.
 *
 * Any bytes must give a reason with a bounded, printable detail line and
 * never crash, leak or read past len.  An accepted enveloped event must
 * obey the envelope's key rules (printable ASCII id and URI-reference
 * source, 1..255) and SPEC.md's order id and type rules; its canonical
 * event must be compact, key-sorted JSON that parses again
 * (msg_parse_event) to the same key, order, type and hash -- the form a
 * held event is released from.  A native delivery must come out exactly as
 * msg_parse says, with no event.  The context must hold a valid trace or
 * none, and survive its JSON (what a held event keeps).
 *
 * Input layout: byte 0: bits 0-1 the envelope (native, cloudevents,
 * masstransit, auto), bits 2-4 the content type (of a fixed list, 0:
 * none), bit 5 a correlation-id property, bit 6 a small INBOX_MAX_BODY,
 * bit 7 an order id field path; byte 1: how many headers (mod 8); then each
 * header: a name byte (of a fixed list; bit 7: not a string), a length
 * byte, the bytes; then the correlation id (length byte, bytes) when
 * asked; the rest is the body.
 */
#include <jansson.h>
#include <string.h>

#include "envelope.h"
#include "fuzz.h"
#include "msg.h"

#define FUZZ_MAX_BODY 4096
#define FUZZ_SMALL_BODY 64
#define FUZZ_HEADERS 8

/* data.amount_cents as the order definition keeps it (PaymentAuthorized's
 * sets), 0 when the message does not carry it. */
static int64_t amount_of(const struct msg *m)
{
	const struct msg_val *v = msg_value(m, "amount_cents");

	return v != NULL ? v->i : 0;
}

static const char *const header_names[] = {
	"cloudEvents:specversion", "cloudEvents:id",      "cloudEvents:source",   "cloudEvents:type",
	"cloudEvents:subject",     "cloudEvents:time",    "cloudEvents:traceparent", "cloudEvents:tracestate",
	"cloudEvents_specversion", "cloudEvents_id",      "cloudEvents_source",   "cloudEvents_type",
	"cloudEvents_subject",     "traceparent",         "tracestate",           "x-other",
};
static const char *const content_types[] = {
	NULL, "application/cloudevents+json", "application/json", "application/vnd.masstransit+json",
	"text/plain", "APPLICATION/CloudEvents+JSON; charset=utf-8", "application/cloudevents-batch+json",
	"application/x+json",
};

struct fuzz_hdr {
	const char *key;
	const char *val;
	size_t len;
	bool other;
};

struct fuzz_hdrs {
	struct fuzz_hdr h[FUZZ_HEADERS];
	int n;
};

static enum env_hdr lookup(const void *arg, const char *key, const char **val, size_t *len)
{
	const struct fuzz_hdrs *hs = arg;

	/* The first of a repeated key, as props_header finds it. */
	for (int i = 0; i < hs->n; i++) {
		if (strcmp(hs->h[i].key, key) != 0)
			continue;
		if (hs->h[i].other)
			return ENV_HDR_OTHER;
		*val = hs->h[i].val;
		*len = hs->h[i].len;
		return ENV_HDR_STRING;
	}
	return ENV_HDR_ABSENT;
}

static bool take(const uint8_t **data, size_t *size, const char **s, size_t *len)
{
	size_t n;

	if (*size == 0)
		return false;
	n = (*data)[0];
	if (n > *size - 1)
		n = *size - 1;
	*s = (const char *)*data + 1;
	*len = n;
	*data += 1 + n;
	*size -= 1 + n;
	return true;
}

static bool printable_line(const char *s, size_t cap)
{
	size_t n = strnlen(s, cap);

	if (n >= cap)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
			return false;
	return true;
}

static bool lower_hex_nonzero(const char *s, size_t n)
{
	bool zero = true;

	if (strlen(s) != n)
		return false;
	for (size_t i = 0; i < n; i++) {
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
		zero = zero && s[i] == '0';
	}
	return !zero;
}

static void check_context(const struct env_context *ctx)
{
	struct env_context back;
	char tp[ENV_TRACEPARENT_LEN + 1];
	char *json;

	if (ctx->trace_id[0] != '\0') {
		FUZZ_CHECK(lower_hex_nonzero(ctx->trace_id, 32));
		FUZZ_CHECK(lower_hex_nonzero(ctx->span_id, 16));
		FUZZ_CHECK(strlen(ctx->flags) == 2);
		FUZZ_CHECK(env_traceparent(ctx, tp, sizeof tp) && strlen(tp) == ENV_TRACEPARENT_LEN);
	} else {
		FUZZ_CHECK(ctx->span_id[0] == '\0');
		FUZZ_CHECK(!env_traceparent(ctx, tp, sizeof tp));
	}
	FUZZ_CHECK(printable_line(ctx->tracestate, sizeof ctx->tracestate));
	FUZZ_CHECK(printable_line(ctx->correlation_id, sizeof ctx->correlation_id));
	json = env_context_json(ctx);
	env_context_from_json(json, &back);
	FUZZ_CHECK(strcmp(back.trace_id, ctx->trace_id) == 0);
	FUZZ_CHECK(strcmp(back.span_id, ctx->span_id) == 0);
	FUZZ_CHECK(strcmp(back.correlation_id, ctx->correlation_id) == 0);
	/* tracestate is kept only with a trace */
	FUZZ_CHECK(ctx->trace_id[0] == '\0' || strcmp(back.tracestate, ctx->tracestate) == 0);
	free(json);
}

/* An accepted enveloped event and its canonical form. */
static void check_event(const struct msg *m, const char *event)
{
	json_t *root;
	struct msg again;
	char *dumped;

	FUZZ_CHECK(msg_wide_id_valid(m->message_id, strlen(m->message_id), MSG_WIDE_ID_MAX));
	FUZZ_CHECK(msg_uri_ref_valid(m->source, strlen(m->source), 0, MSG_WIDE_SOURCE_MAX));
	FUZZ_CHECK(event != NULL);
	root = json_loads(event, JSON_REJECT_DUPLICATES, NULL);
	FUZZ_CHECK(root != NULL);
	dumped = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
	FUZZ_CHECK(dumped != NULL && strcmp(dumped, event) == 0);
	free(dumped);
	FUZZ_CHECK(msg_parse_event(root, NULL, &again) == MSG_REASON_NONE);
	FUZZ_CHECK(strcmp(again.message_id, m->message_id) == 0);
	FUZZ_CHECK(strcmp(again.source, m->source) == 0);
	FUZZ_CHECK(strcmp(again.order_id, m->order_id) == 0);
	FUZZ_CHECK(strcmp(again.type_name, m->type_name) == 0 && again.type == m->type);
	FUZZ_CHECK(strcmp(again.occurred_at, m->occurred_at) == 0);
	FUZZ_CHECK(amount_of(&again) == amount_of(m));
	FUZZ_CHECK(memcmp(again.sha256, m->sha256, 32) == 0);
	json_decref(root);
}

void fuzz_envelope_one(const uint8_t *data, size_t size)
{
	static char empty[] = "", field[] = "data.order.id";
	struct fuzz_hdrs hs = { .n = 0 };
	struct env_delivery d;
	struct env_context ctx;
	struct cfg conf;
	struct msg m;
	char *event = (char *)"unset";
	const char *corr = NULL;
	size_t corr_len = 0, max_body;
	uint8_t mode, nh;
	enum msg_reason r;

	if (size < 2)
		return;
	mode = data[0];
	nh = data[1] % (FUZZ_HEADERS + 1);
	data += 2;
	size -= 2;
	for (int i = 0; i < nh && size > 0; i++) {
		struct fuzz_hdr *h = &hs.h[hs.n];
		uint8_t k = data[0];

		data++;
		size--;
		h->key = header_names[(k & 0x7f) % (sizeof header_names / sizeof header_names[0])];
		h->other = (k & 0x80) != 0;
		if (!take(&data, &size, &h->val, &h->len))
			break;
		hs.n++;
	}
	if (mode & 0x20)
		(void)take(&data, &size, &corr, &corr_len);
	memset(&conf, 0, sizeof conf);
	conf.envelope = (enum cfg_envelope)(mode & 3);
	conf.type_map = (char *)"com.example.payment.authorized=PaymentAuthorized,A.B:Paid=PaymentAuthorized";
	conf.order_id_field = (mode & 0x80) ? field : empty;
	max_body = (mode & 0x40) ? FUZZ_SMALL_BODY : FUZZ_MAX_BODY;
	d = (struct env_delivery){
		.body = data, .len = size, .correlation_id = corr, .correlation_id_len = corr_len,
		.header = hs.n > 0 ? lookup : NULL, .header_arg = &hs,
		.content_type = content_types[(mode >> 2) & 7],
	};
	d.content_type_len = d.content_type != NULL ? strlen(d.content_type) : 0;

	r = env_parse(&conf, &d, max_body, &m, &ctx, &event);
	FUZZ_CHECK((unsigned)r < MSG_REASON_COUNT);
	FUZZ_CHECK(printable_line(m.detail, sizeof m.detail));
	check_context(&ctx);
	if (r != MSG_REASON_NONE) {
		FUZZ_CHECK(event == NULL);
		FUZZ_CHECK(m.detail[0] != '\0');
		return;
	}
	FUZZ_CHECK(m.detail[0] == '\0');
	FUZZ_CHECK(msg_id_valid(m.order_id, strlen(m.order_id), 1, MSG_ORDER_ID_MAX));
	FUZZ_CHECK(msg_type_from_name(m.type_name, strlen(m.type_name)) == (int)m.type);
	if (env_detect(&conf, &d) == CFG_ENVELOPE_NATIVE) {
		struct msg n;

		FUZZ_CHECK(event == NULL);
		FUZZ_CHECK(msg_parse(d.body, d.len, max_body, &d.props, &n) == MSG_REASON_NONE);
		FUZZ_CHECK(memcmp(n.sha256, m.sha256, 32) == 0 && strcmp(n.message_id, m.message_id) == 0);
		return;
	}
	check_event(&m, event);
	free(event);
}

#ifdef FUZZ_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_envelope_one(data, size);
	return 0;
}
#endif
