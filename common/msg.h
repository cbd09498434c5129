/*
 * msg.h - the incoming event: bounded parsing, validation per SPEC.md, and
 * the canonical payload hash.
 *
 * msg_parse never allocates on behalf of the caller: the decoded event lands
 * in fixed-size fields of struct msg, whose bounds are the SPEC's bounds.
 * The body is checked for size before jansson sees it.  The hash is SHA-256
 * over the body re-serialised as compact JSON with sorted keys, so that
 * whitespace and key order never turn a duplicate into a conflict.
 */
#ifndef INBOX_MSG_H
#define INBOX_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lifecycle.h"

#define MSG_ID_MAX 128
#define MSG_SOURCE_MAX 64
/* An event that came in an envelope (common/envelope.h) follows the
 * envelope's wider rules (SPEC.md, Envelopes): a CloudEvents id is any
 * printable ASCII and its source a URI-reference, each up to 255
 * characters.  struct msg and every buffer that holds a key are this wide;
 * native messages still get MSG_ID_MAX and MSG_SOURCE_MAX. */
#define MSG_WIDE_ID_MAX 255
#define MSG_WIDE_SOURCE_MAX 255
#define MSG_ORDER_ID_MAX 64
#define MSG_TYPE_NAME_MAX 32
#define MSG_TIME_MAX 40
#define MSG_DETAIL_MAX 200
#define MSG_MAX_DEPTH 32 /* nesting deeper than this is invalid-field */
/* The text of the values an event's sets carry (struct msg_val). */
#define MSG_TEXT_MAX 4096
#define MSG_TIME_SQL_MAX 26 /* "YYYY-MM-DD HH:MM:SS.ffffff", UTC */

/* The event types of the built-in order definition.  A message's type is
 * the bound definition's event index (aggregate.h); for the order definition
 * these. */
enum msg_type {
	MSG_ORDER_CREATED = 0,
	MSG_PAYMENT_AUTHORIZED, /* PaymentConfirmed is the same event */
	MSG_INVENTORY_RESERVED,
	MSG_SHIPMENT_CREATED,
	MSG_ORDER_CANCELLED,
	MSG_TYPE_COUNT
};

/* Why a message is dead-lettered: the x-inbox-reason header values. */
enum msg_reason {
	MSG_REASON_NONE = 0,
	MSG_REASON_MALFORMED_JSON,
	MSG_REASON_MISSING_FIELD,
	MSG_REASON_INVALID_FIELD,
	MSG_REASON_UNKNOWN_TYPE,
	MSG_REASON_TOO_LARGE,
	MSG_REASON_PAYLOAD_CONFLICT,
	MSG_REASON_HOLD_EXPIRED,
	MSG_REASON_INVALID_TRANSITION,
	MSG_REASON_RETRIES_EXHAUSTED,
	MSG_REASON_UNPROCESSABLE, /* the database refused the message's own values */
	MSG_REASON_EFFECT_FAILED, /* a statement of the definition refused the message's own data */
	MSG_REASON_DELIVERY_FAILED, /* an HTTP destination refused an emitted event, or never took it */
	MSG_REASON_SEQUENCE_GAP, /* held past INBOX_HOLD_TTL waiting for an earlier number (lc_sequenced) */
	MSG_REASON_COUNT
};

struct json_t;
/* AMQP properties that may carry message_id and type; NULL/0 when absent.
 * Not NUL-terminated (they point into the AMQP frame).  sequence: for a
 * definition numbered by a header (lifecycle.h, seq_header), the header's
 * value as JSON (an integer, a string, or false for another type; NULL:
 * absent), which becomes the event's own "sequence" (borrowed). */
struct msg_props {
	const char *message_id;
	size_t message_id_len;
	const char *type;
	size_t type_len;
	struct json_t *sequence;
};

/* A value one of the event's sets gives its column (the definition's
 * events[type].sets[k] is vals[k]): an integer in i, or text (a string as
 * sent; a datetime as MSG_TIME_SQL_MAX UTC; a message id) at text + off.
 * has false: the column is left as it is (an optional data field absent,
 * no occurred_at).  A set from applied_at has has and no text (the time the
 * worker applies it). */
struct msg_val {
	bool has;
	int64_t i;
	uint16_t off, len;
};

struct msg {
	char message_id[MSG_WIDE_ID_MAX + 1];
	char source[MSG_WIDE_SOURCE_MAX + 1];  /* "" when absent */
	char order_id[MSG_ORDER_ID_MAX + 1];   /* the aggregate's id: the definition's key field */
	char type_name[MSG_TYPE_NAME_MAX + 1]; /* as sent: "PaymentConfirmed" stays */
	enum msg_type type;
	char occurred_at[MSG_TIME_MAX + 1];    /* "" when absent */
	int64_t seq;                           /* its number, in a sequenced definition (lc_sequenced); else 0 */
	struct msg_val vals[LC_MAX_SETS];
	unsigned char sha256[32];
	char detail[MSG_DETAIL_MAX];           /* one human line when the parse fails */
	size_t text_used;
	/* Last, and not cleared by the parse (only text_used bytes are
	 * meaningful): a message costs no more to parse than before. */
	char text[MSG_TEXT_MAX];
};

/* The value the message gives column (a set of its event), or NULL when
 * its event sets no such column or the message does not carry it. */
const struct msg_val *msg_value(const struct msg *m, const char *column);

/*
 * Parse and validate body (len bytes, not NUL-terminated).  Returns
 * MSG_REASON_NONE and fills out, or the dead-letter reason with out->detail
 * set (and out->message_id set when it was readable, else "").  Bodies longer
 * than max_body return MSG_REASON_TOO_LARGE without being parsed.
 */
enum msg_reason msg_parse(const void *body, size_t len, size_t max_body,
                          const struct msg_props *props, struct msg *out);

/*
 * Validate an event the envelope layer mapped into our canonical form: a
 * JSON object with message_id, source, type (one of ours), order_id and
 * optionally occurred_at and data, nothing else.  The envelope rules apply
 * (msg_wide_id_valid, msg_uri_ref_valid, both up to 255); order_id,
 * occurred_at and data follow the native rules.  The hash is over root
 * itself (compact, sorted keys), so two envelopes carrying one event hash
 * alike.  root is the caller's.  names: what the producer called each field
 * (CloudEvents' "id", "subject", ...), for the detail line; NULL: ours.
 */
struct msg_names {
	const char *message_id, *source, *type, *order_id, *occurred_at, *data;
};
enum msg_reason msg_parse_event(struct json_t *root, const struct msg_names *names, struct msg *out);

/* A CloudEvents id as we store it: 1..max printable ASCII characters
 * (0x20-0x7e), not ending in a space (the key columns' collation pads with
 * spaces, so "a" and "a " would be one key there and two here). */
bool msg_wide_id_valid(const char *s, size_t len, size_t max);
/* An RFC 3986 URI-reference of min..max characters: unreserved, reserved
 * and well-formed %XX escapes only. */
bool msg_uri_ref_valid(const char *s, size_t len, size_t min, size_t max);

/* The bound definition's canonical name of an event type ("OrderCreated"
 * etc.; PaymentAuthorized for PaymentConfirmed). */
const char *msg_type_name(enum msg_type t);
/* Map a type name or alias of the bound definition (PaymentConfirmed) to
 * its type; -1 if unknown. */
int msg_type_from_name(const char *name, size_t len);

/* "malformed-json" etc.; "" for MSG_REASON_NONE. */
const char *msg_reason_name(enum msg_reason r);

/* true when s (len bytes) is 1..max characters of [A-Za-z0-9._:-]; min 0
 * allows the empty string (source). */
bool msg_id_valid(const char *s, size_t len, size_t min, size_t max);

/* Hex of a SHA-256 digest: out must hold 65 bytes. */
void msg_sha256_hex(const unsigned char sha[32], char out[65]);

#endif
