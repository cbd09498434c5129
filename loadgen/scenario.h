/*
 * scenario.h - the deterministic load scenario of inbox-loadgen: orders,
 * their event sequences, the copies and variants to publish, and the
 * expected outcome of each one (the ledger).
 *
 * Everything here is a function of the options and the seed; only the run
 * tag (part of every id, so runs never collide in one database) may come
 * from the clock.  Bodies are not stored: lg_body rebuilds the bytes of any
 * published item from its message, so 100,000 messages cost a few MiB.
 *
 * Ownership: lg_scenario_build fills a caller-provided struct lg_scenario;
 * lg_scenario_free releases what it allocated.
 */
#ifndef INBOX_LG_SCENARIO_H
#define INBOX_LG_SCENARIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "lifecycle.h"
#include "msg.h"
#include "pub.h"
#include "plan.h"

/* Wide enough for a CloudEvents id (MSG_WIDE_ID_MAX): with --envelope
 * cloudevents part of the ids are long, as real producers' are. */
#define LG_ID_MAX (MSG_WIDE_ID_MAX + 1)
#define LG_PREFIX_MAX 40

/* The event sequences an aggregate can follow are the routes of its
 * lifecycle definition (plan.h): for the order definition the main path,
 * the three cancellations and a cancelled order that also gets a
 * ShipmentCreated.  None of them cancels after shipment: that outcome
 * depends on arrival order (cancel before ship is applied, after it is
 * invalid), so a ledger could not predict it. */

/* What the verifier must find for a message. */
enum lg_expect {
	LG_EXPECT_EFFECT = 0, /* exactly one <aggregate>_events row; outcome applied or compensated */
	LG_EXPECT_DEAD,       /* a DLQ copy with the reason; no <aggregate>_events row */
};

/* Variants of a published item. */
enum lg_variant {
	LG_VAR_ORIGINAL = 0,
	LG_VAR_DUP_SAME,   /* a byte-identical copy */
	LG_VAR_DUP_RESHAPED, /* same JSON, other key order and white space: still a duplicate */
	LG_VAR_CONFLICT,   /* same key, another value of the first data field (data.amount_cents
	                      for orders; occurred_at when there is none): payload-conflict */
};

/* Malformed classes, one per SPEC.md reason (and three ways to be malformed JSON). */
enum lg_bad {
	LG_BAD_NONE = 0,
	LG_BAD_JSON,        /* cut in the middle */
	LG_BAD_UTF8,        /* bytes that are not UTF-8 */
	LG_BAD_MISSING,     /* no key field (order_id) */
	LG_BAD_INVALID,     /* key field outside the alphabet */
	LG_BAD_ID_MISMATCH, /* message-id property differs from the body's */
	LG_BAD_UNKNOWN_TYPE,
	LG_BAD_TOO_LARGE,
	LG_BAD_BINARY_HEADER, /* not JSON, with a header whose value is a byte array that is not UTF-8 */
	/* Lifecycles other than the order's (whose classes stay SPEC's eight),
	 * when their events read data fields: */
	LG_BAD_MISSING_DATA,  /* a required data field left out: missing-field */
	LG_BAD_INVALID_DATA,  /* a data field of the wrong JSON type: invalid-field */
	LG_BAD_COUNT
};

/* One aggregate (an order, a shipment, ...). */
struct lg_order {
	char id[LG_ID_MAX];
	int route;                    /* index into plan.routes */
	int64_t data[LG_FIELDS_MAX];  /* plan.fields' values: the integer, or the draw a string is made of */
	uint32_t first_msg; /* its messages are msgs[first_msg .. first_msg + nmsg) in canonical order */
	uint32_t nmsg;
	int final_state;              /* the route's end state (plan.h) */
	unsigned final_version;
	uint32_t emits;               /* bits into def->emits */
};

struct lg_msg {
	char id[LG_ID_MAX];
	int32_t order;          /* -1 for a malformed message */
	int ev;                 /* event index in the definition */
	bool alias;             /* sent under the event's first alias ("PaymentConfirmed") */
	const char *source;
	enum lg_bad bad;
	enum lg_expect expect;
	enum msg_reason reason;  /* for LG_EXPECT_DEAD */
	const char *nominal;     /* outcome if handled in publication order */
	uint16_t dup_immediate;  /* extra copies soon after the original */
	uint16_t dup_concurrent; /* extra copies published with it from other connections */
	uint16_t dup_delayed;    /* extra copies after the originals were processed */
	uint16_t conflicts;      /* conflicting payloads under its key */
	unsigned char sha256[32];
};

/* One publish: which message, which variant; msg == UINT32_MAX is a hole. */
struct lg_item {
	uint32_t msg;
	uint8_t variant;
	uint16_t copy; /* copy number, to vary a conflict's amount */
};

/* Publish plan: rows of `columns` slots; column c is connection c's list.
 * Items of one row go out "at the same moment" (the publishers pass a
 * barrier every few rows), which is how concurrent duplicates are made. */
struct lg_phase {
	struct lg_item *slots; /* rows * columns */
	size_t rows;
	size_t items;          /* non-hole slots */
};

/* How each message is put on the wire (--envelope): our own format, or
 * CloudEvents 1.0 in structured or binary mode (SPEC.md, Envelopes).  The
 * scenario and its expectations are the same; in CloudEvents the ids and
 * sources are a real producer's (URIs, some longer than 64 characters,
 * some ids of 150), and the malformed classes are the envelope's own
 * forms of the same faults. */
enum lg_envelope { LG_ENV_NATIVE = 0, LG_ENV_CE, LG_ENV_CE_BINARY, LG_ENV_COUNT };
extern const char *const lg_envelope_names[LG_ENV_COUNT];

/* A CloudEvents source: a URI of up to this many characters. */
#define LG_CE_SOURCE_MAX 128

struct lg_opts {
	const struct lc_def *def; /* the lifecycle: lc_builtin_order's unless --lifecycle */
	const char *lifecycle;  /* --lifecycle FILE, or NULL: named in the ledger's run line */
	uint64_t seed;
	char run[24];           /* run tag; "" = from the clock */
	long orders;
	double cancel_share;
	double invalid_share;
	double dup_rate;
	double concurrent_dups;
	double delayed_dups;
	int reorder_window;
	long interleave;        /* orders whose events are interleaved in the queue */
	long conflicts;
	long malformed;
	int connections;
	long max_body;          /* from the configuration: too-large must exceed it */
	enum lg_envelope envelope;
};

struct lg_scenario {
	struct lg_opts opts;
	struct lg_plan plan;
	char prefix[LG_PREFIX_MAX]; /* every message and order id starts with it */
	struct lg_order *orders;
	size_t norders;
	struct lg_msg *msgs;
	size_t nmsgs;
	struct lg_phase main;    /* originals, immediate and concurrent copies, malformed */
	struct lg_phase late;    /* delayed copies and conflicts */
	size_t originals;        /* valid originals (each gets one inbox row) */
	size_t copies_immediate, copies_concurrent, copies_delayed, conflict_copies, malformed;
	/* CloudEvents sources, two per event of the definition (a short one
	 * and one longer than 64 characters), LG_CE_SOURCE_MAX each; NULL in
	 * the native envelope.  Messages point into it. */
	char (*ce_sources)[LG_CE_SOURCE_MAX];
};

/* Messages per aggregate on average for the given shares, for --messages
 * N; 0 when o->def has no plan. */
double lg_messages_per_order(const struct lg_opts *o);

/* Build the scenario of o (o->def required).  Returns 0, or -1 with a
 * line on stderr. */
int lg_scenario_build(struct lg_scenario *s, const struct lg_opts *o);
void lg_scenario_free(struct lg_scenario *s);

/* The body of one published item, malloc'd (caller frees), length in *len:
 * in the native envelope the event, in CloudEvents structured mode the
 * event as a CloudEvent, in binary mode its data alone. */
char *lg_body(const struct lg_scenario *s, const struct lg_item *it, size_t *len);

/* CloudEvents binary mode: the cloudEvents:* headers of a message (the
 * attributes its structured form carries), in h (cap entries) with their
 * values in vals.  Returns how many, or -1 when cap is too small. */
#define LG_CE_HEADERS 7
struct lg_ce_vals {
	char time[32];
	char subject[LG_ID_MAX];
	char seq[24];
};
/* In every envelope, for a definition numbered by a header (lifecycle.h,
 * seq_header), that header is among them too (the only one outside
 * binary mode). */
int lg_ce_headers(const struct lg_scenario *s, const struct lg_item *it, struct mq_header *h, int cap,
                  struct lg_ce_vals *vals);
/* The bytes of the binary `trace` header a LG_BAD_BINARY_HEADER message
 * carries (not UTF-8, with a NUL inside). */
extern const unsigned char lg_binary_trace[8];

/* A message's number in its aggregate's sequence, for a numbered
 * definition (lc_sequenced): its place in its route, from 1; 1 for a
 * malformed message. */
int lg_msg_number(const struct lg_scenario *s, const struct lg_msg *m);

/* The text of plan field f's value in aggregate order's messages (an
 * integer in decimal, a string as sent) into buf: 0, or -1 for a datetime
 * field (its occurred_at) or when cap is too small. */
int lg_scenario_field_text(const struct lg_scenario *s, int32_t order, int f, char *buf, size_t cap);

/* The routing key for an item's message (order.<type>, for every
 * lifecycle: the queue is bound with order.#, SPEC.md). */
void lg_routing_key(const struct lg_scenario *s, const struct lg_msg *m, char *buf, size_t cap);

/* Write the ledger as JSON lines: one "run" line, then "order" (one per
 * aggregate, whatever the lifecycle), "msg" and "conflict" lines.  With
 * --lifecycle the run line names the definition (aggregate, table, key);
 * for a definition with statements each order line also carries its
 * route and its data fields' values (verify_ledger.h).  publish appends
 * the additions' baseline (snapshot.h).  Returns 0 or -1 (errno set). */
int lg_ledger_write(const struct lg_scenario *s, FILE *f, const char *consumer,
                    const char *queue, const char *dlq, const char *verify_queue);

#endif
