/*
 * metrics.h - process-wide counters for /metrics and the logs.
 *
 * Counters are C11 atomics updated with relaxed ordering from any thread:
 * they are statistics, never used to make a decision.  The HTTP endpoint
 * (libmicrohttpd, optional at build time) serves /metrics in the Prometheus
 * text format, /healthz, and /readyz (200 only while every worker thread
 * reports both connections and its consumers up and, in sharded ordering,
 * every shard has a consumer in this process; otherwise 503 naming what
 * is missing).
 *
 * Ownership: one static registry per process; metrics_start/stop bracket the
 * HTTP server.
 */
#ifndef INBOX_METRICS_H
#define INBOX_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum metrics_outcome {
	METRICS_APPLIED = 0,
	METRICS_HELD,
	METRICS_IGNORED,
	METRICS_COMPENSATED,
	METRICS_DEAD_LETTERED,
	METRICS_DUPLICATE,
	METRICS_OUTCOME_COUNT
};

enum metrics_peer { METRICS_PEER_AMQP = 0, METRICS_PEER_DB, METRICS_PEER_COUNT };

void metrics_outcome(enum metrics_outcome o);
void metrics_db_retry(void);
void metrics_reconnect(enum metrics_peer p);
void metrics_processing_seconds(double s);
void metrics_outbox_pending(int64_t n);
/* Outbox publishes that failed for their own row (returned, nacked,
 * unpublishable) and the age of the oldest pending row. */
void metrics_outbox_failed(int n);
void metrics_outbox_oldest_pending(double seconds);
/* Messages ready in the DLQ (the janitor's passive declare); the gauge is
 * left out of /metrics until it was read once, and again after a negative
 * value (unknown). */
void metrics_dlq_depth(int64_t n);
/* Thread readiness for /readyz: threads call it as their connections come
 * and go. */
void metrics_set_threads(int n);
void metrics_thread_ready(int thread, bool ready);
/* Sharded ordering: the number of shards, and the shards (bit i = shard i)
 * a thread consumes right now (0 while it has no consumer).  Ready needs
 * every shard covered in this process, as well as every thread ready. */
void metrics_set_shards(int n);
void metrics_thread_shards(int thread, uint64_t mask);
bool metrics_ready(void);
/* metrics_ready, and when not ready a line naming each thread without its
 * connections and each shard without a consumer into why (may be NULL). */
bool metrics_readiness(char *why, size_t cap);
/* A delivery taken into processing carried the redelivered flag. */
void metrics_redelivered(void);
uint64_t metrics_redelivered_count(void);

uint64_t metrics_outcome_count(enum metrics_outcome o);
const char *metrics_outcome_name(enum metrics_outcome o);

/* Render the Prometheus text into buf; returns the length or -1 if cap is
 * too small. */
int metrics_render(char *buf, size_t cap);

/* Serve on addr ("host:port"); "" or NULL serves nothing.  Returns 0 or -1
 * with a reason logged. */
int metrics_start(const char *addr);
void metrics_stop(void);

#endif
