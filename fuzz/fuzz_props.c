/*
 * fuzz_props.c - libFuzzer target for mq_delivery_props_json, the
 * conversion that saves a delivery's AMQP properties and headers as JSON so
 * that its dead-letter copy can carry them.
 *
 * The input is the property list of an AMQP content header (flags, then the
 * fields), exactly as the broker sends it; rabbitmq-c's own decoder turns it
 * into amqp_basic_properties_t, as amqp_consume_message does for a real
 * delivery.  So the conversion sees what a publisher can make the broker
 * hand us: any header kinds, nested tables and arrays, byte arrays, strings
 * that are not UTF-8 or hold NUL bytes.  Inputs the decoder refuses are
 * skipped (the broker would not deliver them).
 *
 * The conversion may refuse (NULL); it must not crash, leak or read out of
 * bounds, and what it returns must load again with the flags the dead-letter
 * path restores it with (json_loads(..., 0): no NUL in strings), as an
 * object whose "headers", if present, is an object.  The restore itself
 * (mq_build_props) is static in mq.c and needs a connection, so it is not
 * called here; the load is the step of it that can fail on content.
 */
#include <amqp.h>
#include <amqp_framing.h>
#include <jansson.h>
#include <string.h>

#include "fuzz.h"
#include "mq.h"
#include "status.h"

/* Headers a worker reads from a delivery; mq_delivery_header must bound
 * them to the buffer whatever the value. */
static const char *const read_headers[] = { "x-inbox-reason", "x-inbox-detail", "trace",
	                                        MQ_HEADER_PUBLISHED_US };

static void check_json(const char *out)
{
	json_error_t err;
	json_t *o = json_loads(out, 0, &err);

	/* FUZZ_PROPS_ALLOW_NUL=1 lets a run look past the open finding of
	 * fuzz/regress/props/restore-nul-* (a NUL byte in a value comes out as
	 * \u0000, which the restore refuses); the default stays strict. */
	if (o == NULL && getenv("FUZZ_PROPS_ALLOW_NUL") != NULL)
		o = json_loads(out, JSON_ALLOW_NUL, &err);
	if (o == NULL)
		fprintf(stderr, "props JSON does not load: %s: %.200s\n", err.text, out);
	FUZZ_CHECK(o != NULL);
	FUZZ_CHECK(json_is_object(o));
	FUZZ_CHECK(json_object_get(o, "headers") == NULL || json_is_object(json_object_get(o, "headers")));
	json_decref(o);
}

void fuzz_props_one(const uint8_t *data, size_t size)
{
	amqp_pool_t pool;
	amqp_message_t msg;
	struct mq_delivery d;
	void *decoded = NULL;
	amqp_bytes_t in = { .len = size, .bytes = (void *)data };
	char *out;

	init_amqp_pool(&pool, 4096);
	if (amqp_decode_properties(AMQP_BASIC_CLASS, &pool, in, &decoded) != AMQP_STATUS_OK ||
	    decoded == NULL)
		goto cleanup;

	/* What mq_consume leaves behind (mq_fill_delivery): priv is the
	 * delivery's amqp_message_t, props borrow its message-id and type. */
	memset(&msg, 0, sizeof msg);
	msg.properties = *(amqp_basic_properties_t *)decoded;
	memset(&d, 0, sizeof d);
	d.priv = &msg;
	d.slot = -1;
	snprintf(d.routing_key, sizeof d.routing_key, "order.created");
	if (msg.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG) {
		d.props.message_id = msg.properties.message_id.bytes;
		d.props.message_id_len = msg.properties.message_id.len;
	}
	if (msg.properties._flags & AMQP_BASIC_TYPE_FLAG) {
		d.props.type = msg.properties.type.bytes;
		d.props.type_len = msg.properties.type.len;
	}

	out = mq_delivery_props_json(&d);
	if (out != NULL) {
		check_json(out);
		free(out);
	}
	for (size_t i = 0; i < sizeof read_headers / sizeof read_headers[0]; i++) {
		char buf[64];
		int rc = mq_delivery_header(&d, read_headers[i], buf, sizeof buf);

		if (rc == ST_OK)
			FUZZ_CHECK(strlen(buf) < sizeof buf);
	}

cleanup:
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
