/*
 * deadletter.h - the dead-letter copy on the wire: the names of the
 * headers the worker puts on it and the one function that builds them.
 *
 * A message is dead-lettered on two paths: directly by the worker, which
 * publishes the copy itself before it acks the original (worker/worker.c:
 * bad input, a conflict, retries run out), and through the outbox, where
 * the transaction that decided it writes the copy as a row that the relay
 * publishes later (common/outbox.c: an invalid transition, an expired hold,
 * a stored body that no longer applies).  Both call deadletter_headers, so
 * a copy says the same things whichever path sent it; `inbox-worker dlq`
 * (common/dlq_entry.c) reads the same names back.  SPEC.md ("AMQP
 * topology") requires x-inbox-reason and x-inbox-detail; the time and the
 * delivery count are ours, for `dlq list`.
 *
 * Ownership: struct deadletter_headers holds the values its headers point
 * at; it must not be copied or moved while they are in use.
 */
#ifndef INBOX_DEADLETTER_H
#define INBOX_DEADLETTER_H

#include <stdint.h>

#include "pub.h"

/* Why (SPEC.md's reason words: msg_reason_name) and one human line. */
#define DEADLETTER_REASON "x-inbox-reason"
#define DEADLETTER_DETAIL "x-inbox-detail"
/* When, as 2026-12-02T00:00:00Z (UTC, seconds). */
#define DEADLETTER_AT "x-inbox-dead-lettered-at"
/* After how many deliveries, this one counted (a quorum queue counts the
 * earlier ones); absent when not known (deadletter_headers). */
#define DEADLETTER_DELIVERIES "x-inbox-delivery-count"
/* Every header of ours starts so: a replayed copy or a copy of a copy
 * drops them (props.c, for dlq replay's copies too), so that they always
 * describe the latest dead-lettering. */
#define DEADLETTER_PREFIX "x-inbox-"
/* The header a replayed copy carries: how often it was replayed.  Not an
 * x-inbox-* name, so that a worker's dead-letter copy keeps it. */
#define DEADLETTER_REPLAYS "x-replay-count"

/* The HTTP destination a delivery-failed copy was for (issue 45): dlq
 * replay gives the row back to it, under the same idempotency key. */
#define DEADLETTER_DESTINATION "x-inbox-destination"

#define DEADLETTER_HEADERS_MAX 5
#define DEADLETTER_DETAIL_MAX 640

struct deadletter_headers {
	struct mq_header h[DEADLETTER_HEADERS_MAX];
	int n;
	char detail[DEADLETTER_DETAIL_MAX];
	char at[32];
	char deliveries[24];
};

/*
 * Fill out with the headers of a dead-letter copy: reason, detail (with
 * props_note, what the saved properties had to escape or drop, appended
 * when not empty; NULL = nothing), now, and deliveries — how often the
 * broker delivered the message, the delivery in hand counted — when it is
 * known (> 0).  It is not known for an event that was held in the
 * database: the delivery that brought it was acked long before.
 */
void deadletter_headers(struct deadletter_headers *out, const char *reason, const char *detail,
                        const char *props_note, int64_t deliveries);

/* The headers as a flat JSON object of strings (the outbox's headers
 * column).  malloc'd (the caller frees), NULL when out of memory. */
char *deadletter_headers_json(const struct deadletter_headers *dh);

#endif
