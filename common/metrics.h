/*
 * metrics.h - process-wide counters for /metrics and the logs.
 *
 * The counters add up: every delivery is counted once in
 * inbox_messages_total, by its final decision.  An event that had to wait
 * is counted in inbox_held_total when it is held and in
 * inbox_messages_total when it is settled (released by its order's change,
 * or expired by the janitor), by whichever process settles it; the events
 * held right now are a gauge read from the database.  Every dead letter the
 * worker decides is counted once by its reason, and that count is the
 * dead_lettered outcome.
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

#include "msg.h"

enum metrics_outcome {
	METRICS_APPLIED = 0,
	METRICS_IGNORED,
	METRICS_COMPENSATED,
	METRICS_DEAD_LETTERED,
	METRICS_DUPLICATE,
	METRICS_OUTCOME_COUNT
};

enum metrics_peer { METRICS_PEER_AMQP = 0, METRICS_PEER_DB, METRICS_PEER_COUNT };

/* n deliveries (or held events settled) with final decision o; a dead
 * letter goes through metrics_dead_letter instead, which knows why. */
void metrics_outcome(enum metrics_outcome o, int n);
/* n dead letters for reason r: counted by reason and as dead_lettered. */
void metrics_dead_letter(enum msg_reason r, int n);
/* An event held on arrival, and n held events settled by their order. */
void metrics_held(void);
void metrics_released(int n);
/* The events held now (this consumer, all processes) and the age of the
 * oldest, as the janitor read them. */
void metrics_held_now(int64_t n, double oldest_s);
void metrics_db_retry(void);
void metrics_reconnect(enum metrics_peer p);
void metrics_processing_seconds(double s);
void metrics_outbox_pending(int64_t n);
/* Outbox publishes that failed for their own row (returned, nacked,
 * unpublishable) and the age of the oldest pending row. */
void metrics_outbox_failed(int n);
/* Outbox rows published from memory by their committing thread. */
void metrics_outbox_dispatched(int n);
/* A worker thread waited for its published outbox copies' confirms. */
void metrics_confirm_wait(void);
/* A batch cut in two (worker.c, worker_settle_apart): n of its deliveries
 * went to a second transaction because another transaction held one of
 * their orders (METRICS_SPLIT_DATABASE: found by the claim's NOWAIT lock,
 * any process's) or another thread of this process had one in hand
 * (METRICS_SPLIT_THREAD: worker/inflight.h).  A batch cut for both reasons
 * counts once under each. */
enum metrics_split { METRICS_SPLIT_DATABASE = 0, METRICS_SPLIT_THREAD, METRICS_SPLIT_COUNT };
void metrics_batch_split(enum metrics_split why, int n);
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

/* The lifecycle this process runs, for inbox_lifecycle_info{aggregate,
 * table,key} (absent until set).  Once, before the threads start; names as
 * lc_load allows them ([a-z][a-z0-9_]*, up to METRICS_NAME_MAX).  Why an
 * info series and not an `aggregate` label on every series: one process
 * runs one lifecycle, so the label would be constant per process, and
 * adding it to inbox_messages_total and the rest would change the identity
 * of the series SPEC.md names (a new label set is a new series: rates,
 * alerts and dashboards across the upgrade would break).  Join it where
 * the aggregate matters: `... * on(instance) group_left(aggregate)
 * inbox_lifecycle_info`.  0, or -1 (a bad name, or set already). */
#define METRICS_NAME_MAX 64
int metrics_set_lifecycle(const char *aggregate, const char *table, const char *key);

/* The event types whose statements inbox_statements_total{event,result}
 * counts: names[e] for event index e, NULL for one that runs none (n at
 * most METRICS_EVENTS_MAX, the lifecycle's LC_MAX_EVENTS).  Once, before
 * the threads start; absent when never set.  0, or -1 (a bad name, or set
 * already). */
#define METRICS_EVENTS_MAX 16
int metrics_set_statement_events(const char *const *names, int n);
/* Statements of event that ran (committed with their batch) and were
 * refused by their message's data. */
void metrics_statements(int event, int ran, int refused);
uint64_t metrics_statements_count(int event, bool refused);

uint64_t metrics_outcome_count(enum metrics_outcome o);
uint64_t metrics_dead_letter_count(enum msg_reason r);
uint64_t metrics_held_count(void);
uint64_t metrics_released_count(void);

/* Render the Prometheus text into buf; returns the length or -1 if cap is
 * too small. */
/* The HTTP destinations of the running definition (names as lc_load
 * checked them), at most METRICS_DESTS_MAX, once before the threads
 * start; then per destination index: deliveries by result, and the
 * undelivered rows' count and oldest age. */
#define METRICS_DESTS_MAX 8
enum metrics_delivery { METRICS_HTTP_DELIVERED = 0, METRICS_HTTP_RETRIED, METRICS_HTTP_DEAD_LETTERED, METRICS_DELIVERY_COUNT };
int metrics_set_destinations(const char *const *names, int n);
void metrics_delivery(int dest, enum metrics_delivery result, int n);
uint64_t metrics_delivery_count(int dest, enum metrics_delivery result);
void metrics_destination_backlog(int dest, int64_t pending, double oldest_s);

int metrics_render(char *buf, size_t cap);

/* Serve on addr ("host:port"); "" or NULL serves nothing.  Returns 0 or -1
 * with a reason logged. */
int metrics_start(const char *addr);
void metrics_stop(void);

#endif
