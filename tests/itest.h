/*
 * itest.h - helpers for the integration suites: a fresh schema and fresh
 * queues per test, the worker binary as a child process, publishing, and
 * bounded waits for a database condition.  Every helper asserts (criterion)
 * on failure, so a test reads as its scenario.
 *
 * The stack comes from `scripts/stack up`: INBOX_AMQP_URL and INBOX_DB_URL
 * must be set; a missing one fails the test, never skips it.
 */
#ifndef INBOX_ITEST_H
#define INBOX_ITEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cfg.h"
#include "db.h"
#include "mq.h"

/* Load the configuration from the environment; drop every table, delete
 * the test queues, run `inbox-worker migrate`. */
void itest_fresh(void);
const struct cfg *itest_cfg(void);

/* A database connection for assertions and schema changes, as the schema
 * owner (INBOX_MIGRATE_DB_URL, else INBOX_DB_URL; autocommit off; each
 * query ends its own transaction).  Workers run as INBOX_DB_URL. */
struct db *itest_db(void);
/* Run a fixed query returning one integer (COUNT, SUM...). */
int64_t itest_int(const char *sql);
/* Same, with one string parameter. */
int64_t itest_int1(const char *sql, const char *arg);
/* Read one string column of the first row into buf; false when no row. */
bool itest_str1(const char *sql, const char *arg, char *buf, size_t cap);

/* Poll sql until it returns want or timeout_s passes; returns the last value. */
int64_t itest_wait_int(const char *sql, int64_t want, int timeout_s);

/* Run the worker binary with args (NULL-terminated) and extra "K=V"
 * environment entries (NULL-terminated, may be NULL).  Output goes to a log
 * file named after the test. */
pid_t itest_spawn(const char *const *args, const char *const *env);
pid_t itest_worker(int threads, const char *const *env);
/* The same with stderr sent to log_path (truncated first). */
pid_t itest_spawn_logged(const char *const *args, const char *const *env, const char *log_path);
pid_t itest_worker_logged(int threads, const char *const *env, const char *log_path);
/* Any program: stderr (and stdout too, when with_stdout) into log_path. */
pid_t itest_spawn_program(const char *bin, const char *const *args, const char *const *env, const char *log_path,
                          bool with_stdout);
/* Sum of key=N over the lines of log_path that contain marker. */
int64_t itest_log_sum(const char *log_path, const char *marker, const char *key);
/* How many lines of log_path contain text. */
int itest_log_count(const char *log_path, const char *text);
/* Whether log_path holds a line containing text. */
bool itest_log_has(const char *log_path, const char *text);
/* Send sig and wait (bounded) for the exit; returns the wait status. */
int itest_stop(pid_t pid, int sig, int timeout_s);
/* Wait for a child to exit by itself (bounded); returns the wait status. */
int itest_wait_exit(pid_t pid, int timeout_s);

/* A broker connection in confirm mode; topology declared. */
struct mq *itest_mq(void);
/* Publish body to the orders exchange with routing key order.<type>,
 * confirmed.  message_id_prop / type_prop may be NULL. */
void itest_publish(struct mq *m, const char *type, const char *body, const char *message_id_prop);
/* Publish without waiting for the confirm (pipelined); call
 * itest_confirm_all afterwards. */
void itest_publish_async(struct mq *m, const char *type, const char *body, const char *message_id_prop);
void itest_confirm_all(struct mq *m);
/* Publish with the order_id header that sharded mode hashes on. */
void itest_publish_keyed(struct mq *m, const char *type, const char *body, const char *order_id, bool wait);

/* A standard event body. */
void itest_event(char *buf, size_t cap, const char *message_id, const char *type, const char *order_id);

/* Messages ready in a queue (passive declare). */
uint32_t itest_queue_depth(const char *queue);
/* Wait until queue has no ready or unacked messages and (by polling the
 * worker's effect) the condition holds. */
void itest_wait_queue_empty(const char *queue, int timeout_s);

/* Drain the DLQ: up to cap messages; for each, the message id (property or
 * body) and the x-inbox-reason header. */
struct itest_dead {
	char message_id[129];
	char reason[40];
	char detail[200];
	char type[40];
	size_t len;         /* body length */
	uint64_t body_hash; /* itest_hash of the body */
};
int itest_dlq_drain(struct itest_dead *out, int cap, int expect, int timeout_s);
/* The same for any queue. */
int itest_drain(const char *queue, struct itest_dead *out, int cap, int expect, int timeout_s);
/* Declare a durable queue bound to exchange with binding, emptied. */
void itest_bind_queue(const char *queue, const char *exchange, const char *binding);

/* GET path from 127.0.0.1:port (HTTP/1.0); the whole response, headers
 * included, into body.  Returns the status code, 0 when nothing answers. */
int itest_http_get(int port, const char *path, char *body, size_t cap);
/* Poll GET path until it answers want or timeout_s passes; returns the last
 * status (the last response in body). */
int itest_wait_http(int port, const char *path, int want, char *body, size_t cap, int timeout_s);

/* A metrics port for the k-th worker of a test, derived from the broker's
 * port so that stacks side by side on one machine never share one. */
int itest_metrics_port(int k);

/* FNV-1a of len bytes: tells whether a queued body is the one published. */
uint64_t itest_hash(const void *p, size_t len);

/* The path of a file in the source tree. */
const char *itest_source(const char *rel, char *buf, size_t cap);

#endif
