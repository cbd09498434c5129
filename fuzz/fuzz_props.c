/*
 * fuzz_props.c - libFuzzer target for mq_delivery_props_json, the
 * conversion that saves a delivery's AMQP properties and headers as JSON so
 * that its dead-letter copy can carry them, and for the restore that turns
 * the saved JSON back into properties when that copy is published.
 *
 * The input is the property list of an AMQP content header (flags, then the
 * fields), exactly as the broker sends it; rabbitmq-c's own decoder turns it
 * into amqp_basic_properties_t, as amqp_consume_message does for a real
 * delivery.  So the conversion sees what a publisher can make the broker
 * hand us: any header kinds, nested tables and arrays, byte arrays, strings
 * that are not UTF-8 or hold NUL bytes.  Inputs the decoder refuses are
 * skipped (the broker would not deliver them).
 *
 * Checks: no crash, leak or bad read anywhere; the conversion never fails
 * (NULL is for out of memory only) and stays within MQ_PROPS_JSON_MAX; its
 * note is one printable line, the same one mq_props_json_note reads back;
 * the restore (props_json_wire, what a publish with props_json sends)
 * succeeds, rabbitmq-c decodes what it wrote, and converting that again
 * gives the same properties and headers (less the broker's bookkeeping the
 * restore leaves out) - escaped values come back as the same AMQP values.
 */
#include <amqp.h>
#include <amqp_framing.h>
#include <jansson.h>
#include <string.h>

#include "fuzz.h"
#include "mq.h"
#include "props.h"
#include "status.h"

#define NOTE_CAP 512
#define WIRE_CAP (1 << 17)

/* Headers a worker reads from a delivery; mq_delivery_header must bound
 * them to the buffer whatever the value. */
static const char *const read_headers[] = { "x-inbox-reason", "x-inbox-detail", "trace",
	                                        MQ_HEADER_PUBLISHED_US };

/* Short-string properties the restore puts back as they were saved. */
static const char *const kept_props[] = { "message_id", "type", "correlation_id", "app_id",
	                                      "timestamp", "content_type" };

static json_t *load(const char *s)
{
	json_error_t err;
	json_t *o = json_loads(s, JSON_ALLOW_NUL, &err);

	if (o == NULL)
		fprintf(stderr, "props JSON does not load: %s: %.200s\n", err.text, s);
	FUZZ_CHECK(json_is_object(o));
	return o;
}

/* Decode a property list into msg and point d at it, as mq_consume does
 * (mq_fill_delivery).  False when rabbitmq-c refuses the bytes. */
static bool delivery_from_wire(amqp_pool_t *pool, const void *data, size_t size, amqp_message_t *msg,
                               struct mq_delivery *d)
{
	amqp_bytes_t in = { .len = size, .bytes = (void *)data };
	void *decoded = NULL;

	if (amqp_decode_properties(AMQP_BASIC_CLASS, pool, in, &decoded) != AMQP_STATUS_OK ||
	    decoded == NULL)
		return false;
	memset(msg, 0, sizeof *msg);
	msg->properties = *(amqp_basic_properties_t *)decoded;
	memset(d, 0, sizeof *d);
	d->priv = msg;
	d->slot = -1;
	snprintf(d->routing_key, sizeof d->routing_key, "order.created");
	if (msg->properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG) {
		d->props.message_id = msg->properties.message_id.bytes;
		d->props.message_id_len = msg->properties.message_id.len;
	}
	if (msg->properties._flags & AMQP_BASIC_TYPE_FLAG) {
		d->props.type = msg->properties.type.bytes;
		d->props.type_len = msg->properties.type.len;
	}
	return true;
}

/* The saved JSON of the restored copy against the original's. */
static void check_round_trip(json_t *first, json_t *again, size_t first_len)
{
	json_t *h1 = json_object_get(first, "headers");
	json_t *h2 = json_object_get(again, "headers");
	const char *k;
	json_t *v;

	for (size_t i = 0; i < sizeof kept_props / sizeof kept_props[0]; i++) {
		json_t *a = json_object_get(first, kept_props[i]);
		if (a != NULL)
			FUZZ_CHECK(json_equal(a, json_object_get(again, kept_props[i])));
	}
	/* Near the size limit the copy's own budget (it gains content_type)
	 * may keep a header fewer: compare headers only well below it. */
	if (first_len > MQ_PROPS_JSON_MAX / 2)
		return;
	json_object_foreach(h1, k, v) {
		if (strcmp(k, "x-delivery-count") == 0 || strncmp(k, "x-inbox-", 8) == 0)
			continue;
		if (!json_equal(v, json_object_get(h2, k)))
			fprintf(stderr, "header %s not restored as it was saved\n", k);
		FUZZ_CHECK(json_equal(v, json_object_get(h2, k)));
	}
	json_object_foreach(h2, k, v)
		FUZZ_CHECK(json_object_get(h1, k) != NULL);
}

void fuzz_props_one(const uint8_t *data, size_t size)
{
	static unsigned char wire[WIRE_CAP];
	amqp_pool_t pool, pool2;
	amqp_message_t msg, msg2;
	struct mq_delivery d, d2;
	char note[NOTE_CAP], note2[NOTE_CAP];
	char *out = NULL, *out2 = NULL;
	json_t *o = NULL, *o2 = NULL;
	size_t wlen = 0, olen;

	init_amqp_pool(&pool, 4096);
	init_amqp_pool(&pool2, 4096);
	if (!delivery_from_wire(&pool, data, size, &msg, &d))
		goto cleanup;

	for (size_t i = 0; i < sizeof read_headers / sizeof read_headers[0]; i++) {
		char buf[64];
		if (mq_delivery_header(&d, read_headers[i], buf, sizeof buf) == ST_OK)
			FUZZ_CHECK(strlen(buf) < sizeof buf);
	}

	out = mq_delivery_props_json_note(&d, note, sizeof note);
	FUZZ_CHECK(out != NULL);
	olen = strlen(out);
	FUZZ_CHECK(olen <= MQ_PROPS_JSON_MAX);
	FUZZ_CHECK(strlen(note) < sizeof note);
	for (const char *p = note; *p != '\0'; p++)
		FUZZ_CHECK(*p >= 0x20 && *p <= 0x7e);
	mq_props_json_note(out, note2, sizeof note2);
	FUZZ_CHECK(strcmp(note, note2) == 0);
	o = load(out);
	FUZZ_CHECK(json_object_get(o, "headers") == NULL || json_is_object(json_object_get(o, "headers")));

	/* The restore, and the same conversion of what it would send. */
	FUZZ_CHECK(props_json_wire(out, wire, sizeof wire, &wlen) == ST_OK);
	FUZZ_CHECK(delivery_from_wire(&pool2, wire, wlen, &msg2, &d2));
	out2 = mq_delivery_props_json(&d2);
	FUZZ_CHECK(out2 != NULL);
	o2 = load(out2);
	check_round_trip(o, o2, olen);

cleanup:
	json_decref(o2);
	json_decref(o);
	free(out2);
	free(out);
	empty_amqp_pool(&pool2);
	empty_amqp_pool(&pool);
}

#ifdef FUZZ_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_props_one(data, size);
	return 0;
}
#endif
