/*
 * fuzz_msg.c - libFuzzer target for msg_parse: any bytes, with and without
 * AMQP properties, must give a reason and a bounded, printable detail line
 * and never crash, leak or read past len.  Built by hand (see README), not
 * by meson.
 */
#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct msg m;
	struct msg_props props = { 0 };
	const struct msg_props *pp = NULL;
	enum msg_reason r;

	/* First byte picks the property set; the split byte carves a message-id
	 * property off the front so that the mismatch paths are reached. */
	if (size >= 2 && (data[0] & 1)) {
		size_t n = data[1] % 40;

		if (n > size - 2)
			n = size - 2;
		props.message_id = (const char *)data + 2;
		props.message_id_len = n;
		if (data[0] & 2) {
			props.type = "OrderCreated";
			props.type_len = 12;
		}
		pp = &props;
		data += 2 + n;
		size -= 2 + n;
	}
	r = msg_parse(data, size, 4096, pp, &m);
	assert((unsigned)r < MSG_REASON_COUNT);
	assert(r != MSG_REASON_PAYLOAD_CONFLICT && r != MSG_REASON_HOLD_EXPIRED);
	assert(strlen(m.detail) < MSG_DETAIL_MAX);
	assert(strlen(m.message_id) <= MSG_ID_MAX);
	for (const char *p = m.detail; *p != '\0'; p++)
		assert(*p >= 0x20 && *p <= 0x7e);
	if (r == MSG_REASON_NONE) {
		assert(msg_id_valid(m.message_id, strlen(m.message_id), 1, MSG_ID_MAX));
		assert(msg_id_valid(m.order_id, strlen(m.order_id), 1, MSG_ORDER_ID_MAX));
		assert(msg_id_valid(m.source, strlen(m.source), 0, MSG_SOURCE_MAX));
		assert(m.detail[0] == '\0');
		assert(m.amount_cents >= 0);
	} else {
		assert(m.detail[0] != '\0');
	}
	return 0;
}
