/*
 * envelope.h - the envelope layer in front of validation (SPEC.md,
 * Envelopes): a delivery in our own format, in CloudEvents 1.0 (structured
 * or binary mode) or in MassTransit's JSON envelope becomes one struct msg,
 * and the trace and correlation context it carries is read out for the
 * events it causes.
 *
 * msg.c stays the validator of our event: a native delivery goes straight
 * to msg_parse, exactly as before the layer existed; an enveloped one is
 * mapped into our canonical form (message_id, source, type, order_id,
 * occurred_at, data) and validated by msg_parse_event, whose hash covers
 * that form, so one event sent structured and binary is one payload.
 *
 * No broker here: a delivery is its body, the few properties the layer
 * reads, and a header lookup (env_header_fn), so the unit tests and the
 * fuzz target drive it without a connection.  Nothing is allocated for a
 * native delivery; an enveloped one returns its canonical event as JSON
 * text (*event, malloc'd, the caller frees), which a held event keeps.
 *
 * The writer is here too (env_emit_body): an event the worker emits is
 * written in our own format or as a structured CloudEvent (INBOX_EMIT_
 * ENVELOPE), by the module that reads both, so the two directions of a
 * wire format cannot drift apart.
 */
#ifndef INBOX_ENVELOPE_H
#define INBOX_ENVELOPE_H

#include <stdbool.h>
#include <stddef.h>

#include "cfg.h"
#include "msg.h"

/* A header of the delivery, by the AMQP type it came in (CloudEvents' AMQP
 * binding carries each attribute in its own type): ENV_HDR_ABSENT,
 * ENV_HDR_STRING (*val, *len point at its bytes, not NUL-terminated),
 * ENV_HDR_TIMESTAMP (*val NULL, *len its seconds since the epoch, as AMQP
 * 0-9-1's timestamp carries it), ENV_HDR_INTEGER (*val NULL, *len its
 * value: an integer of any width, not negative; a negative one is other)
 * or ENV_HDR_OTHER (present, another type). */
enum env_hdr { ENV_HDR_ABSENT = 0, ENV_HDR_STRING, ENV_HDR_TIMESTAMP, ENV_HDR_INTEGER, ENV_HDR_OTHER };
typedef enum env_hdr (*env_header_fn)(const void *arg, const char *key, const char **val, size_t *len);

struct env_delivery {
	const void *body;
	size_t len;
	struct msg_props props;        /* message-id and type properties (native only) */
	const char *content_type;      /* NULL when absent; not NUL-terminated */
	size_t content_type_len;
	const char *correlation_id;    /* NULL when absent; not NUL-terminated */
	size_t correlation_id_len;
	env_header_fn header;          /* NULL: no headers */
	const void *header_arg;
};

#define ENV_TRACESTATE_MAX 512
#define ENV_CORRELATION_MAX 255
#define ENV_TRACEPARENT_LEN 55 /* "00-" 32 hex "-" 16 hex "-" 2 hex */

/* What a message carries into the events it causes.  trace_id "" when it
 * came without a (valid) W3C traceparent; then span_id is "" too and
 * nothing about a trace is emitted.  span_id is the message's own span, a
 * new one: the parent id of every event it causes. */
struct env_context {
	char trace_id[33];
	char span_id[17];
	char flags[3];
	char tracestate[ENV_TRACESTATE_MAX + 1];
	char correlation_id[ENV_CORRELATION_MAX + 1]; /* "" when none came */
};

/* The envelope a delivery is read with: conf->envelope, or for auto the
 * one its content type and headers say. */
enum cfg_envelope env_detect(const struct cfg *conf, const struct env_delivery *d);

/*
 * Read a delivery: MSG_REASON_NONE with out filled, or the dead-letter
 * reason with out->detail naming the attribute at fault.  ctx (may be
 * NULL) gets the trace and correlation context, whatever the outcome.
 * *event: NULL for a native delivery; for an enveloped one that passed,
 * its canonical event (malloc'd JSON, the caller frees; NULL with
 * MSG_REASON_MALFORMED_JSON only when memory ran out).
 */
enum msg_reason env_parse(const struct cfg *conf, const struct env_delivery *d, size_t max_body, struct msg *out,
                          struct env_context *ctx, char **event);

/*
 * The settings that name a type or a field, judged against the definition
 * that runs (call after agg_use): each right-hand side of INBOX_TYPE_MAP
 * must be one of its event types or aliases.  0, or -1 with one line in err
 * that starts with the setting's name (the caller exits 2).  What needs no
 * definition (the map's shape, INBOX_ORDER_ID_FIELD against INBOX_ENVELOPE)
 * cfg_load judged already.
 */
int env_check_settings(const struct cfg *conf, char *err, size_t errlen);

/* The number the running definition reads from a header (lifecycle.h,
 * seq_header) as msg.c judges it (msg_props.sequence): a JSON integer, a
 * string (decimal or not: msg.c says which), false for another AMQP type;
 * NULL when the header is absent or the definition reads no header.  A new
 * reference. */
struct json_t *env_header_number(const struct env_delivery *d);

/* The context's traceparent for what the message causes:
 * "00-<trace id>-<span id>-<flags>" into out (ENV_TRACEPARENT_LEN + 1
 * bytes); false (out "") when there is no trace. */
bool env_traceparent(const struct env_context *ctx, char *out, size_t cap);
/* The same context as JSON ({"traceparent","tracestate","correlation_id"},
 * the empty ones left out), malloc'd; NULL when there is nothing to keep or
 * memory ran out.  env_context_from_json reads it back (NULL or bad JSON:
 * an empty context). */
char *env_context_json(const struct env_context *ctx);
void env_context_from_json(const char *json, struct env_context *ctx);

/* Parse a W3C traceparent into ctx's trace id and flags, with a new span
 * id (from the CSPRNG); false when it is not a valid one (ctx untouched). */
bool env_trace_parse(const char *tp, size_t len, struct env_context *ctx);

/* An event the worker emits (outbox.h), in the terms of either format. */
struct env_emitted {
	const char *id;                /* its stable id */
	const char *type;
	const char *key_field;         /* the definition's key ("order_id") */
	const char *key;               /* the aggregate's */
	const char *time;              /* RFC 3339, UTC */
	const char *cause_message_id;
	const char *cause_type;
	const char *traceparent;       /* "" when there is no trace */
	const char *tracestate;        /* "" when none came */
	int64_t cause_sequence;        /* a sequenced definition's number of its cause (data.cause_sequence); 0: none */
	int64_t sequence;              /* its own number among its aggregate's emitted events (data.sequence); 0: none */
};
/* The body of e in conf->emit_envelope's format, compact JSON with sorted
 * keys, malloc'd (the caller frees); NULL only when memory ran out.  A
 * CloudEvent (structured mode, SPEC.md Envelopes) names this consumer as
 * its source (urn:inbox-worker:<consumer>) and the aggregate as subject. */
char *env_emit_body(const struct cfg *conf, const struct env_emitted *e);
/* The content type the body is published with: NULL for our own format. */
const char *env_emit_content_type(const struct cfg *conf);

#endif
