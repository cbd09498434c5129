/*
 * props.h - AMQP basic properties and headers as JSON, and back: the
 * tagged form ({"$bytes": base64}, {"$table": {...}}, ... see props.c) in
 * which a held event or a stored dead-letter copy keeps whatever the
 * producer sent, and the property list a publish restores from it.
 *
 * No broker here: plain functions over rabbitmq-c's property structs, used
 * by mq.c (deliveries) and pub.c (publishes), and by the unit tests and the
 * fuzz target without a connection.  The mq_ entry points callers use
 * (mq_delivery_props_json, mq_props_json_note) are in mq.h.
 *
 * Ownership: props_to_json returns a malloc'd string the caller frees.  A
 * struct props_out is the caller's (on its stack); props_build fills it
 * with pointers into msg, into its own parsed JSON and into its own pool,
 * so it lives no longer than msg and is released by props_out_release
 * (also after a failed props_build).  props_header returns a pointer into
 * p.
 */
#ifndef INBOX_PROPS_H
#define INBOX_PROPS_H

#include <amqp.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mq.h"

/* Headers of an outgoing message: the saved ones (at most
 * MQ_HEADERS_KEEP) plus ours. */
#define PROPS_HEADERS_MAX (MQ_HEADERS_KEEP + 16)

/* The properties and headers as JSON (at most MQ_PROPS_JSON_MAX bytes),
 * and in note (when not NULL) the line saying what was escaped or dropped
 * ("" when nothing).  Never fails for what the producer sent; NULL only
 * when memory ran out. */
char *props_to_json(const amqp_basic_properties_t *p, char *note, size_t note_cap);
/* The note kept inside saved properties ("inbox_note"); "" when none. */
void props_json_note(const char *props_json, char *buf, size_t cap);

/* Everything an outgoing message's properties point at lives here for the
 * duration of one publish. */
struct props_out {
	amqp_basic_properties_t p;
	amqp_table_entry_t h[PROPS_HEADERS_MAX];
	json_t *saved;
	amqp_pool_t pool;       /* decoded bytes, nested tables and arrays */
};
/* The properties of msg: persistent, application/json, then what
 * msg->props_json saved (the inverse of props_to_json; broker bookkeeping
 * such as x-delivery-count and our x-inbox-* headers left out), then
 * message_id, type, headers and published_us on top.  ST_OK, or
 * ST_ERR_INVALID when props_json does not load as an object. */
int props_build(struct props_out *o, const struct mq_message *msg);
void props_out_release(struct props_out *o);
/* The property list a publish with props_json (and nothing else set) would
 * carry, in the wire form amqp_encode_properties writes into a content
 * header.  ST_OK with *len set, ST_ERR_INVALID when props_json does not
 * load as an object or the result does not fit in cap bytes.  For tests
 * and fuzz/fuzz_props.c. */
int props_json_wire(const char *props_json, void *buf, size_t cap, size_t *len);

/* env_header_fn (envelope.h) over the headers of arg, a const
 * amqp_basic_properties_t *: long strings and byte arrays are strings,
 * a timestamp is one, an integer of any width is one. */
enum env_hdr props_env_header(const void *arg, const char *key, const char **val, size_t *len);
/* The headers of saved properties (props_to_json's) as the envelope layer
 * reads a delivery's: e->header over o, which the caller releases with
 * props_out_release whatever the result (ST_OK, or ST_ERR_INVALID when
 * props_json does not load; e then has no headers).  A held event's
 * number in a header is read back so. */
int props_saved_envelope(const char *props_json, struct props_out *o, struct env_delivery *e);

/* The header key of p, NULL when absent. */
const amqp_field_value_t *props_header(const amqp_basic_properties_t *p, const char *key);
/* An integer field of any width (and a timestamp) as int64; false for
 * other kinds. */
bool props_field_int(const amqp_field_value_t *v, int64_t *out);
/* Strict UTF-8 as MariaDB's utf8mb4 and jansson take it. */
bool props_utf8_valid(const void *p, size_t len);

#endif
