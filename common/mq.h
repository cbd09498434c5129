/*
 * mq.h - the rabbitmq-c boundary: connections, topology, consuming, and the
 * one confirmed publish path.
 *
 * A struct mq belongs to one thread and carries one AMQP connection with one
 * channel.  A worker thread holds two: a consumer, and a publisher in confirm
 * mode for dead-letters and outbox rows.  Keeping them apart means a confirm
 * never arrives interleaved with deliveries, so neither path has to buffer
 * the other's frames.
 *
 * Errors become st_code values: ST_ERR_MQ_CONN when the connection is gone
 * (reconnect), ST_ERR_ACCESS when the broker refused the login,
 * ST_ERR_TLS_CERT when we refused the broker's certificate, ST_ERR_MQ
 * when the broker refused something (channel closed, e.g. a declare with
 * other arguments, or a publish to a missing exchange; or the connection
 * closed with 503, e.g. an exchange type it does not have),
 * ST_ERR_MQ_NACK when a publish was nacked or returned unroutable,
 * ST_ERR_TIMEOUT when a bounded wait ran out.
 *
 * Publishing with confirms is in pub.c (pub.h), properties <-> JSON in
 * props.c (props.h); both work on this handle or for it.
 *
 * Ownership: mq_open returns a handle freed by mq_close (NULL-safe, clears
 * the pointer).  A delivery filled by mq_consume borrows the connection's
 * memory until mq_delivery_release; as many may be held at once as the
 * broker may send (the prefetch of the connection's consumers, summed: a
 * batch plus what mq_service keeps aside).
 * A delivery from mq_get lives until the next mq_get or its release.
 */
#ifndef INBOX_MQ_H
#define INBOX_MQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "envelope.h"
#include "msg.h"
/* The publishing half of a struct mq's API: one handle, one include. */
#include "pub.h"

struct mq;

/* Header name carrying the publisher's clock (microseconds since the epoch)
 * so that latency from publish to commit can be measured. */
#define MQ_HEADER_PUBLISHED_US "x-published-us"

struct mq_delivery {
	uint64_t tag;
	bool redelivered;
	const void *body;
	size_t len;
	struct msg_props props;   /* message-id / type properties, borrowed */
	int64_t published_us;     /* MQ_HEADER_PUBLISHED_US, 0 when absent */
	int64_t delivery_count;   /* x-delivery-count of quorum queues, 0 when absent */
	char routing_key[256];    /* cut at 255 bytes (ours are short) */
	/* The routing key as sent is storable text: UTF-8 without NUL bytes
	 * (held_events.routing_key and outbox.routing_key are utf8mb4). */
	bool routing_key_valid;
	void *priv;               /* the message; mq_ only */
	int slot;                 /* the envelope slot; mq_ only */
};

/* Connect to the first node of conf's list that answers, trying each once
 * in list order (conf->next: the other nodes of a cluster). */
int mq_open(struct mq **out, const struct cfg_amqp *conf, int heartbeat_s, const char *name);
/* Connect, log in and open the channel on conf's one node.  ST_ERR_MQ_CONN
 * when the broker cannot be reached (a passing fault: retry);
 * ST_ERR_ACCESS when it refused the login (403: user, password or rights
 * on the vhost; 530: no such vhost), which a retry cannot fix;
 * ST_ERR_TLS_CERT when the broker's certificate failed verification (its
 * chain, or the URL's host or server_name_indication not among its names
 * or IP addresses), which a retry cannot fix either.  Logs
 * nothing: why gets the reason ("login: connection closed by broker: 403
 * ACCESS_REFUSED ...", "connect: connection refused") for the caller's one
 * line. */
int mq_open_why(struct mq **out, const struct cfg_amqp *conf, int heartbeat_s, const char *name, char *why,
                size_t cap);
/* The same, starting at node *node (0 = the first; wraps around) and
 * ending at the one before it; on success *node is the node connected to.
 * A caller whose connection was lost passes the next index, so that it
 * moves on to another node of the cluster rather than wait for this one. */
int mq_open_from(struct mq **out, const struct cfg_amqp *conf, int heartbeat_s, const char *name, int *node);
/* The same with the last node's reason in why (see mq_open_why); a
 * refused login ends the tour (the nodes share users and vhosts).  A
 * refused certificate does not (each node has its own): when no node
 * took us, ST_ERR_TLS_CERT with the first such node's reason. */
int mq_open_from_why(struct mq **out, const struct cfg_amqp *conf, int heartbeat_s, const char *name, int *node,
                     char *why, size_t cap);
void mq_close(struct mq **m);
/* Close a link known or suspected lost (no confirm came, the peer went
 * silent): without the channel.close/connection.close handshake, whose
 * reply cannot come.  NULL-safe, clears the pointer. */
void mq_drop(struct mq **m);
/* The bound, in seconds, of every wait on a connection opened with this
 * heartbeat: connect (at most 10 s), login, each RPC, a send that cannot
 * leave (TCP_USER_TIMEOUT), an idle link (TCP keepalive).  See mq.c. */
int mq_link_bound_s(int heartbeat_s);
/* A short human line for the last broker error (for logs). */
const char *mq_errmsg(const struct mq *m);
/* Whether a failure other than a time-out ended the connection's use. */
bool mq_broken(const struct mq *m);

/* Declare exchanges, queues and bindings of SPEC.md (idempotent). */
int mq_declare_topology(struct mq *m, const struct cfg *conf);
/* The queue of shard index: conf->queue, or in sharded mode shard
 * (index % shards) "<queue>.shard.<n>".  Returns 0 or -1. */
int mq_consume_queue_name(const struct cfg *conf, int index, char *buf, size_t cap);

/* basic.qos(prefetch) for the consumer and basic.consume with manual acks.
 * One connection may consume several queues (up to 64): call it once per
 * queue; their deliveries share the channel and its delivery tags.
 * priority: the consumer priority (x-priority; 0: none, the broker's
 * default): the broker delivers to the highest priority consumer of the
 * queue that has room in its prefetch window. */
int mq_consume_start(struct mq *m, const char *queue, int prefetch, int priority);
/* Wait up to timeout_ms for a delivery: ST_OK, ST_ERR_TIMEOUT or an error.
 * Deliveries kept aside by mq_service come first, in arrival order.  A
 * basic.cancel from the broker (the queue was deleted, its leader moved)
 * is recorded for mq_cancelled and returns ST_ERR_TIMEOUT. */
int mq_consume(struct mq *m, struct mq_delivery *d, int timeout_ms);
/* Keep the connection alive for timeout_ms without taking new work: wait
 * for frames (rabbitmq-c sends and answers heartbeats only while it waits
 * or publishes) and keep every delivery that arrives for mq_consume.
 * ST_OK when the time is up; ST_ERR_INVALID when there is no room to keep
 * another delivery (more came than the prefetch allows); a broker error when the
 * connection failed. */
int mq_service(struct mq *m, int timeout_ms);
/* Consumers the broker cancelled (consumer_cancel_notify) since they were
 * started; mq_consume_again starts them anew on the same channel (declare
 * the topology first: a deleted queue must exist again). */
int mq_cancelled(const struct mq *m);
int mq_consume_again(struct mq *m);
void mq_delivery_release(struct mq *m, struct mq_delivery *d);
int mq_ack(struct mq *m, uint64_t tag, bool multiple);
/* Return a message to the queue (requeue) — for shutdown with work in hand
 * that could not be finished. */
int mq_reject(struct mq *m, uint64_t tag, bool requeue);

/* The saved properties are at most this long (they go into TEXT columns
 * of 65,535 bytes), with at most MQ_HEADERS_KEEP headers. */
#define MQ_PROPS_JSON_MAX 32768
#define MQ_HEADERS_KEEP 60

/* Save a delivery's properties and headers as a JSON object (malloc'd,
 * caller frees) so that a dead-letter made later keeps them.  Never fails
 * for what the producer sent: values JSON cannot carry are escaped (kept,
 * and restored as the same AMQP value by a publish with props_json) or
 * dropped, deterministically, and the result is bounded by
 * MQ_PROPS_JSON_MAX.  NULL only when memory ran out or d holds no message.
 * d->priv must point at the amqp_message_t (mq_consume and mq_get do so). */
char *mq_delivery_props_json(const struct mq_delivery *d);
/* The same, and note (when not NULL) gets one human line saying which
 * values were escaped or dropped ("" when none), for x-inbox-detail. */
char *mq_delivery_props_json_note(const struct mq_delivery *d, char *note, size_t note_cap);
/* The note kept inside saved properties, for a dead-letter copy made
 * later from a stored row; "" when none.  props_json_note under the name
 * its caller (inbox.c) has used since before the split. */
void mq_props_json_note(const char *props_json, char *buf, size_t cap);


/* Passive queue inspection for tests and the verifier: message and
 * consumer counts; ST_ERR_NOT_FOUND when the queue does not exist. */
int mq_queue_counts(struct mq *m, const char *queue, uint32_t *messages, uint32_t *consumers);
/* Fetch one message with basic.get (no_ack=false): ST_OK, ST_ERR_NOT_FOUND
 * when empty.  The delivery is released with mq_delivery_release. */
int mq_get(struct mq *m, const char *queue, struct mq_delivery *d);
/* The delivery as the envelope layer reads it (common/envelope.h): body,
 * properties and a lookup of its headers, all borrowed from d. */
void mq_delivery_envelope(const struct mq_delivery *d, struct env_delivery *e);

/* Read a string header of a delivery into buf; ST_ERR_NOT_FOUND if absent. */
int mq_delivery_header(const struct mq_delivery *d, const char *key, char *buf, size_t cap);

/* Declare and purge are test and tool helpers. */
int mq_queue_purge(struct mq *m, const char *queue);
int mq_queue_delete(struct mq *m, const char *queue);
int mq_exchange_delete(struct mq *m, const char *exchange);
int mq_queue_declare_bind(struct mq *m, const char *queue, const char *exchange,
                          const char *binding, bool durable);
/* Declare a durable queue (quorum, or classic) and bind it; the broker's
 * refusal (a queue of another type under that name: 406) is ST_ERR_MQ.
 * For the queues that are only read by browsing (the DLQ, the verifier's
 * queue): a quorum one gets an unlimited delivery limit where the broker
 * has one (mq_browsed_queue_limit), so that reads never drop a message; an
 * existing one declared without it is kept as it is, with a warning. */
/* Whether a browsed quorum queue is declared with x-delivery-limit on a
 * broker of this version (its "version" server property), and *limit:
 * -1 (unlimited) on RabbitMQ 4 and later, whose quorum queues have a
 * default limit of 20 and count a read handed back toward it.
 * None on 3.x or an unknown version: 3.x has no default limit, and takes
 * -1 as a limit that every return exceeds (rabbit_fifo: count > limit). */
bool mq_browsed_queue_limit(const char *server_version, int64_t *limit);
int mq_queue_declare_bind_type(struct mq *m, const char *queue, const char *exchange,
                               const char *binding, bool quorum);
int mq_queue_unbind(struct mq *m, const char *queue, const char *exchange, const char *binding);

#endif
