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

#include "msg.h"
#include "spec_oracle.h"

#define LG_ID_MAX 96
#define LG_PREFIX_MAX 40

/* The event sequences an order can follow.  None of them cancels after
 * shipment: that outcome depends on arrival order (cancel before ship is
 * applied, after it is invalid), so a ledger could not predict it. */
enum lg_path {
	LG_PATH_HAPPY = 0,      /* Created, Paid, Reserved, Shipped */
	LG_PATH_CANCEL_NEW,     /* Created, Cancelled */
	LG_PATH_CANCEL_PAID,    /* Created, Paid, Cancelled */
	LG_PATH_CANCEL_RESERVED, /* Created, Paid, Reserved, Cancelled */
	LG_PATH_INVALID_SHIP,   /* Created, Cancelled + ShipmentCreated: invalid-transition
	                           whatever the order (it can never apply) */
	LG_PATH_COUNT
};
#define LG_PATH_MAX 4 /* events of the longest path */

/* What the verifier must find for a message. */
enum lg_expect {
	LG_EXPECT_EFFECT = 0, /* exactly one order_events row; outcome applied or compensated */
	LG_EXPECT_DEAD,       /* a DLQ copy with the reason; no order_events row */
};

/* Variants of a published item. */
enum lg_variant {
	LG_VAR_ORIGINAL = 0,
	LG_VAR_DUP_SAME,   /* a byte-identical copy */
	LG_VAR_DUP_RESHAPED, /* same JSON, other key order and white space: still a duplicate */
	LG_VAR_CONFLICT,   /* same key, other data.amount_cents: payload-conflict */
};

/* Malformed classes, one per SPEC.md reason (and three ways to be malformed JSON). */
enum lg_bad {
	LG_BAD_NONE = 0,
	LG_BAD_JSON,        /* cut in the middle */
	LG_BAD_UTF8,        /* bytes that are not UTF-8 */
	LG_BAD_MISSING,     /* no order_id */
	LG_BAD_INVALID,     /* order_id outside the alphabet */
	LG_BAD_ID_MISMATCH, /* message-id property differs from the body's */
	LG_BAD_UNKNOWN_TYPE,
	LG_BAD_TOO_LARGE,
	LG_BAD_BINARY_HEADER, /* not JSON, with a header whose value is a byte array that is not UTF-8 */
	LG_BAD_COUNT
};

struct lg_order {
	char id[LG_ID_MAX];
	enum lg_path path;
	int64_t amount_cents;
	uint32_t first_msg; /* its messages are msgs[first_msg .. first_msg + nmsg) in canonical order */
	uint32_t nmsg;
	enum spec_status final_state; /* SPEC's table folded over the canonical order */
	unsigned final_version;
	unsigned emits;               /* SPEC_EMIT_* of the whole sequence */
};

struct lg_msg {
	char id[LG_ID_MAX];
	int32_t order;          /* -1 for a malformed message */
	enum msg_type type;
	bool confirmed_alias;   /* sent as "PaymentConfirmed" */
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

struct lg_opts {
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
};

struct lg_scenario {
	struct lg_opts opts;
	char prefix[LG_PREFIX_MAX]; /* every message and order id starts with it */
	struct lg_order *orders;
	size_t norders;
	struct lg_msg *msgs;
	size_t nmsgs;
	struct lg_phase main;    /* originals, immediate and concurrent copies, malformed */
	struct lg_phase late;    /* delayed copies and conflicts */
	size_t originals;        /* valid originals (each gets one inbox row) */
	size_t copies_immediate, copies_concurrent, copies_delayed, conflict_copies, malformed;
};

/* Messages per order on average for the given shares, for --messages N. */
double lg_messages_per_order(const struct lg_opts *o);

int lg_scenario_build(struct lg_scenario *s, const struct lg_opts *o);
void lg_scenario_free(struct lg_scenario *s);

/* The body of one published item, malloc'd (caller frees), length in *len. */
char *lg_body(const struct lg_scenario *s, const struct lg_item *it, size_t *len);
/* The bytes of the binary `trace` header a LG_BAD_BINARY_HEADER message
 * carries (not UTF-8, with a NUL inside). */
extern const unsigned char lg_binary_trace[8];

/* The routing key for an item's message (order.<type>). */
void lg_routing_key(const struct lg_scenario *s, const struct lg_msg *m, char *buf, size_t cap);

/* Write the ledger as JSON lines: one "run" line, then "order", "msg" and
 * "conflict" lines.  Returns 0 or -1 (errno set). */
int lg_ledger_write(const struct lg_scenario *s, FILE *f, const char *consumer,
                    const char *queue, const char *dlq, const char *verify_queue);

#endif
