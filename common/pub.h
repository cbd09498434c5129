/*
 * pub.h - publishing on a struct mq, with publisher confirms: what an
 * outgoing message is, confirm.select, basic.publish, and the wait for the
 * broker's acks, nacks and returns, each publish's own outcome tracked.
 *
 * The functions keep the mq_ names they had before the split from mq.c:
 * they are methods of the same handle the caller consumes with (mq.h
 * includes this header), and their callers (the pool, the inbox, the
 * outbox relay, the dead-letter tools, the load generator, the tests)
 * stay as they were.  Only the file and the bookkeeping are pub.c's.
 *
 * Errors are st_code values as in mq.h: ST_ERR_MQ_NACK when a publish was
 * nacked or returned unroutable (mandatory), ST_ERR_MQ_CONN when the
 * connection failed or no confirm came within the time-out (the publishes
 * in flight are then unknown: reconnect and publish again), ST_ERR_MQ when
 * the broker closed the channel (e.g. a publish to a missing exchange).
 *
 * Ownership: a struct mq_message and what it points at are the caller's;
 * nothing is kept after mq_publish returns (the properties are built on
 * its stack, props.h).
 */
#ifndef INBOX_PUB_H
#define INBOX_PUB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct mq;

/* A header added to an outgoing message. */
struct mq_header {
	const char *key;
	const char *value;
};

/* An outgoing message.  props_json, when set, restores the properties and
 * headers saved by mq_delivery_props_json (dead-letters keep the original's
 * properties); message_id / type / headers are then added on top. */
struct mq_message {
	const char *exchange;
	const char *routing_key;
	const void *body;
	size_t len;
	const char *props_json;
	const char *message_id;
	const char *type;
	const struct mq_header *headers;
	int nheaders;
	bool mandatory; /* unroutable -> ST_ERR_MQ_NACK (dead-letters must land) */
	int64_t published_us; /* > 0: sent as the MQ_HEADER_PUBLISHED_US header */
};

/* Publisher: confirm.select once, then publish and wait for the broker's
 * acks.  mq_publish_confirmed is the one path every publish of the worker
 * takes; mq_publish + mq_wait_confirms pipeline many (outbox relay, loadgen). */
int mq_confirm_select(struct mq *m);
int mq_publish(struct mq *m, const struct mq_message *msg);
int mq_wait_confirms(struct mq *m, int timeout_ms);
int mq_publish_confirmed(struct mq *m, const struct mq_message *msg, int timeout_ms);
/* Service an idle publisher without waiting: rabbitmq-c sends its
 * heartbeat and notices the broker's silence only inside a call, so a
 * connection with heartbeats that publishes seldom is kept alive (and a
 * dead one found) by calling this now and then, well inside the interval.
 * Reads what has come (confirms are settled, a close fails it):
 * ST_OK, or the error that ended the connection. */
int mq_keepalive(struct mq *m);
/* mq_publish with MQ_HEADER_PUBLISHED_US added as an int64 header (the
 * worker reads it as a number); for the load generator and benchmarks. */
int mq_publish_at(struct mq *m, const struct mq_message *msg, int64_t published_us);
/* Take the confirms that have come, without waiting (a publisher that
 * pipelines across its own work: the worker's dispatch from memory).  The
 * outcomes are mq_outcome's; a nack read here is not reported by a later
 * mq_wait_confirms.  ST_OK, or the error that broke the connection. */
int mq_poll_confirms(struct mq *m);
/* Publishes not yet confirmed. */
uint64_t mq_unconfirmed(const struct mq *m);

/* Per-publish outcomes, for callers that settle each publish on its own
 * (the outbox relay).  In confirm mode every publish gets a sequence number
 * (its delivery tag in the broker's acks and nacks): mq_next_seq before
 * mq_publish gives it.  After mq_wait_confirms (whatever it returned),
 * mq_outcome tells what became of it; the last MQ_TRACK_MAX publishes are
 * remembered, older ones are MQ_OUTCOME_UNKNOWN.
 *
 * A basic.return carries no delivery tag: it is put on the latest
 * mandatory publish.  That is exact only while at most one mandatory
 * publish is unconfirmed, so a caller that needs exact outcomes waits for
 * the confirms before each mandatory publish (non-mandatory publishes are
 * never returned and may be pipelined around it). */
#define MQ_TRACK_MAX 256
enum mq_outcome {
	MQ_OUTCOME_UNKNOWN = 0, /* not tracked (too old), or never published */
	MQ_OUTCOME_PENDING,     /* no ack or nack yet (e.g. the connection failed) */
	MQ_OUTCOME_ACKED,       /* the broker took it: routed, or unroutable and not mandatory */
	MQ_OUTCOME_NACKED,      /* the broker could not take it */
	MQ_OUTCOME_RETURNED,    /* mandatory and unroutable (returned, then acked) */
};
uint64_t mq_next_seq(const struct mq *m);
enum mq_outcome mq_outcome(const struct mq *m, uint64_t seq);

#endif
