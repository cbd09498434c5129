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
/* How long the helpers wait for a server that is coming back (a test
 * stopped or restarted it; a loaded machine is slow to start it): a
 * generous bound, not a timing.  itest_db, the queries and itest_mq retry
 * a lost or refused connection until it passes. */
#define ITEST_BACK_S 240
/* After a test started the database again: wait (ITEST_BACK_S) until it
 * takes connections and answers as both accounts, the workers'
 * (INBOX_DB_URL) and the tests' own (itest_db). */
void itest_wait_db_back(void);
/* The same for the broker: a connection opens and declares the topology. */
void itest_wait_mq_back(void);
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
/* Run inbox-loadgen (INBOX_LOADGEN_BIN) with args and extra env (both
 * NULL-terminated; env may be NULL), stdout and stderr into log_path;
 * asserts it exited within timeout_s and returns its exit code. */
int itest_loadgen(const char *const *args, const char *const *env, const char *log_path, int timeout_s);
/* An integer of the run line (the first) of an inbox-loadgen ledger:
 * "published", "originals", ... */
int64_t itest_ledger_int(const char *ledger, const char *key);
/* /tmp/inbox-itest-PID-NAME.log: a log file named after its test. */
void itest_log_path(char *buf, size_t cap, const char *name);
/* SIGTERM, and the process must exit 0 (bounded). */
void itest_stop_ok(pid_t pid);
/* How many lines of log_path hold every one of texts (NULL-terminated;
 * none: every line counts); 0 while the file does not exist. */
int itest_log_lines(const char *log_path, const char *const *texts);
/* Poll log_path until at least want lines hold every text or timeout_s
 * passes; returns the last count. */
int itest_wait_log_lines(const char *log_path, const char *const *texts, int want, int timeout_s);
/* Poll until a line holds text; fails the test after timeout_s. */
void itest_wait_log(const char *log_path, const char *text, int timeout_s);
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
/* Copy log_path to stderr, for a failure that is about to be reported. */
void itest_show_log(const char *log_path);
/* A process (named name in a failure) that must give up at start: it
 * exits 1 within 60 s, its log holds one error line, that line holds
 * every one of texts, no line says it retries, and secret (when not NULL)
 * is on no line.  A failure shows the log. */
void itest_expect_fatal(pid_t pid, const char *log_path, const char *name, const char *const *texts,
                        const char *secret);

/* A broker connection in confirm mode; topology declared. */
struct mq *itest_mq(void);
/* Publish body to the orders exchange with routing key order.<type>,
 * confirmed.  message_id_prop / type_prop may be NULL. */
void itest_publish(struct mq *m, const char *type, const char *body, const char *message_id_prop);
/* Publish without waiting for the confirm (pipelined); call
 * itest_confirm_all afterwards. */
void itest_publish_async(struct mq *m, const char *type, const char *body, const char *message_id_prop);
void itest_confirm_all(struct mq *m);
/* Publish, confirmed, with one string header key: value beside it. */
void itest_publish_header(struct mq *m, const char *type, const char *body, const char *key, const char *value);
/* Publish with the order_id header that sharded mode hashes on. */
void itest_publish_keyed(struct mq *m, const char *type, const char *body, const char *order_id, bool wait);

/* A standard event body. */
void itest_event(char *buf, size_t cap, const char *message_id, const char *type, const char *order_id);
/* Publish an OrderCreated for each of orders PREFIX-I, from <= I < to, as
 * message PREFIX-c-I, pipelined and then confirmed.  m NULL: on a
 * connection of its own (the first node that answers, on a cluster). */
void itest_publish_orders(struct mq *m, const char *prefix, int from, int to);
/* Ledger rows (order_events) that are exactly the effect of their own
 * message from itest_publish_orders(prefix): message PREFIX-c-I on order
 * PREFIX-I, type OrderCreated, source itest, applied, from None to
 * Created at version 1.  With COUNT(*) of the ledger it tells that every
 * message took its own effect, not only that there were as many effects
 * (the UNIQUE index on message_id already guarantees they are distinct). */
int64_t itest_ledger_created(const char *prefix);
/* After itest_publish_orders(prefix) of n orders through a fault: waits
 * (bounded) for n inbox rows and an empty inbox queue, then asserts one
 * ledger row per message, each its own effect (itest_ledger_created), and
 * an empty DLQ. */
void itest_assert_each_applied_once(const char *prefix, int n, int timeout_s);

/* A connection of its own that holds order_id's lock row (created and
 * committed first, then locked FOR UPDATE in an open transaction), as
 * another transaction of another process would: the caller lets go with
 * db_rollback and closes it. */
struct db *itest_hold_order(const char *order_id);

/* Messages ready in a queue (passive declare). */
uint32_t itest_queue_depth(const char *queue);
/* Poll until queue holds want ready messages or timeout_s passes; returns
 * the last depth.  want 0 after publishing to a running worker: every
 * message has been handed to it (prefetched, unacked). */
uint32_t itest_wait_depth(const char *queue, uint32_t want, int timeout_s);
/* Wait until queue has no ready or unacked messages and (by polling the
 * worker's effect) the condition holds. */
void itest_wait_queue_empty(const char *queue, int timeout_s);

/* Drain the DLQ: up to cap messages; for each, the message id (property or
 * body) and the x-inbox-reason header. */
struct itest_dead {
	char message_id[129];
	char reason[40];
	char detail[640]; /* deadletter.h's DEADLETTER_DETAIL_MAX */
	char type[40];
	size_t len;         /* body length */
	uint64_t body_hash; /* itest_hash of the body */
};
int itest_dlq_drain(struct itest_dead *out, int cap, int expect, int timeout_s);
/* The same for any queue. */
int itest_drain(const char *queue, struct itest_dead *out, int cap, int expect, int timeout_s);
/* The letter of message_id among dead[0..n) has reason and, unless
 * detail_part is NULL, a detail containing it (the letters listed when
 * it is missing). */
void itest_expect_dead(const struct itest_dead *dead, int n, const char *message_id, const char *reason,
                       const char *detail_part);
/* Declare a durable queue bound to exchange with binding, emptied. */
void itest_bind_queue(const char *queue, const char *exchange, const char *binding);
/* Delete a queue a test declared, so it stops taking copies of what is
 * published after the test. */
void itest_delete_queue(const char *queue);

/* GET path from 127.0.0.1:port (HTTP/1.0); the whole response, headers
 * included, into body.  Returns the status code, 0 when nothing answers
 * within timeout_s (a connection left in the listen backlog, or accepted
 * and never served, gives 0 then instead of hanging the test). */
int itest_http_get_within(int port, const char *path, char *body, size_t cap, int timeout_s);
/* The same within 30 s. */
int itest_http_get(int port, const char *path, char *body, size_t cap);
/* Poll GET path until it answers want or timeout_s passes; returns the last
 * status (the last response in body). */
int itest_wait_http(int port, const char *path, int want, char *body, size_t cap, int timeout_s);

/* The value of the series whose line starts with name (labels included)
 * on a /metrics page; -1 when there is none. */
double itest_metric(const char *page, const char *name);
/* Poll GET /metrics on 127.0.0.1:port until name's value is within lo..hi
 * or timeout_s passes; page (cap bytes) keeps the last page; returns the
 * last value (-1: absent or not answered). */
double itest_wait_metric(int port, const char *name, double lo, double hi, char *page, size_t cap, int timeout_s);

/* A loopback port nobody listens on right now (bound to 0, read, closed). */
int itest_free_port(void);

/* A metrics port for the k-th worker of a test, derived from the broker's
 * port so that stacks side by side on one machine never share one. */
int itest_metrics_port(int k);

/* FNV-1a of len bytes: tells whether a queued body is the one published. */
uint64_t itest_hash(const void *p, size_t len);

/* Read the file at path into out (cap bytes, NUL-terminated; a longer
 * file is cut); fails the test when it cannot be opened.  Returns the
 * length read. */
size_t itest_read_file(const char *path, char *out, size_t cap);

/* The path of a file in the source tree. */
const char *itest_source(const char *rel, char *buf, size_t cap);
/* socat from bind_ip:port to the server on 127.0.0.1:to (a server coming
 * back on another port, or reached at another address); returns once it
 * accepts connections (bounded, 30 s).  It dies with the test; stop it
 * with SIGTERM and reap it. */
pid_t itest_forward(const char *bind_ip, int port, int to);
/* Run `scripts/stack what` (stop db, start mq, ...), its output on
 * stderr; fails the test when it fails. */
void itest_stack(const char *what);

#endif
