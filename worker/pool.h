/*
 * pool.h - `inbox-worker run`: the pool of threads, and what each of its
 * threads has in common.
 *
 * The pool is INBOX_THREADS consuming threads (worker.h) and one janitor
 * (janitor.h).  Each thread owns its connections: a MYSQL handle with its
 * prepared statements, and its broker connections.  Nothing is shared
 * between threads but the read-only configuration, the stop flag, the
 * janitor's wake-up (struct pool_shared) and the metrics counters.
 *
 * The second half of this header is for the pool's own threads
 * (worker.c, janitor.c): the stop flag, clocks and backoff, how a thread
 * logs a link that fails and comes back, and the database side both
 * kinds of thread open the same way.
 */
#ifndef INBOX_POOL_H
#define INBOX_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cfg.h"
#include "log.h"

/* Runs until SIGTERM/SIGINT; returns a process exit code. */
int pool_main(const struct cfg *conf);

/* ---- for the pool's threads ---- */

#define POOL_WHY_MAX 300   /* a link's failure, as logged */

/* Raised by the signal thread (or a thread meeting a refusal that ends
 * the process), read by every thread. */
extern atomic_bool pool_stop;

/* What the pool's threads share besides the stop flag.  Workers wake the
 * janitor through mu/cv/pending when they committed outbox rows, so
 * emitted messages leave within milliseconds without the worker waiting
 * for the broker's confirms itself.  refused: a refusal that ends the
 * process was logged, so the other threads, meeting the same, exit
 * without a word (the operator reads one line, not one per thread). */
struct pool_shared {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool pending;
	atomic_bool refused;
	/* The orders each consuming thread has in a transaction now
	 * (worker/inflight.h); NULL with one thread or sharded ordering,
	 * where no two threads take the same order's events. */
	struct inflight *inflight;
};

/* A link (database or broker) as this thread last reported it: a failing
 * link is logged when it starts failing and when its reason changes, and
 * once when it works again; each attempt only at debug level.  ever_up:
 * the link worked once, so a refusal now is someone changing the server
 * under a running pool (retried) rather than a wrong setting (fatal). */
enum pool_link { POOL_LINK_DB = 0, POOL_LINK_AMQP = 1 };
struct pool_link_log {
	bool down;
	bool ever_up;
	int attempts;
	int64_t since_ms;
	char why[POOL_WHY_MAX];
};

/* What every thread of the pool has, first member of struct worker and
 * struct janitor.  pool_main fills it and starts the thread; the thread
 * writes exit_code and link, main reads exit_code and joined. */
struct pool_thread {
	int index;            /* worker=N in log lines and metrics; -1: the janitor */
	const struct cfg *conf;
	pthread_t thread;
	bool joined;          /* main's: joined already */
	char name[64];        /* its connections' name, as the broker shows it */
	unsigned seed;        /* backoff jitter */
	struct pool_shared *shared;
	struct pool_link_log link[2]; /* by enum pool_link */
	atomic_int exit_code;
	/* Progress for the service manager's watchdog (pool.c): the thread
	 * bumps it each time round its loop and every step of a wait, so it
	 * stops only when the thread is stuck (in a call that does not
	 * return, or a loop that neither waits nor finishes). */
	atomic_ullong beats;
};

/* The thread's name in log lines: worker=N, or thread=janitor. */
#define POOL_KV(t) ((t)->index >= 0 ? LOG_I("worker", (t)->index) : LOG_S("thread", (t)->index == -1 ? "janitor" : "courier"))

/* The database side of a thread, opened and reopened by pool_db_up: the
 * handle and the statements prepared on it.  node: the database node the
 * next connection starts from (INBOX_DB_URL may list a cluster's). */
struct pool_db {
	struct db *db;
	int node;
	struct inbox *inbox;
	struct outbox *outbox;
};

/* The calling thread's progress counter is t->beats from now on
 * (pool_beat and pool_sleep_ms bump it); called first in each thread. */
void pool_beat_bind(struct pool_thread *t);
/* The calling thread made progress (a no-op outside the pool's threads). */
void pool_beat(void);

int64_t pool_now_ms(void);
double pool_now_s(void);
/* Sleep in short steps so that a stop request is seen within 100 ms; a
 * thread sleeping is waiting on purpose, so each step is a pool_beat. */
void pool_sleep_ms(int ms);
/* Full jitter: a random wait in [base/2, base], base doubling per attempt. */
int pool_backoff_ms(struct pool_thread *t, int attempt, int first_ms);

/* One failed attempt on link k, for why; the link works (again). */
void pool_link_failed(struct pool_thread *t, enum pool_link k, const char *why);
void pool_link_up(struct pool_thread *t, enum pool_link k);
/* The thread's own connection on link k is back: pool_link_up, and
 * counted in /metrics as a reconnect when it had worked before. */
void pool_link_back(struct pool_thread *t, enum pool_link k);
/* An attempt to bring link k back failed for why: the thread is not
 * ready, the failure logged (pool_link_failed); returns how long to wait
 * before the next attempt. */
int pool_link_retry_ms(struct pool_thread *t, enum pool_link k, const char *why);

/* For a failure logged when it starts and when its reason changes, not
 * on every retry: whether why is news (first, or not what last holds);
 * last (POOL_WHY_MAX bytes) then holds why. */
bool pool_why_changed(char *last, bool first, const char *why);
/* Not ready in /metrics, and its shards uncovered. */
void pool_thread_unready(struct pool_thread *t);

/* A refusal that ends the process (a wrong setting, not a passing fault):
 * the first thread that meets one logs it (log_refused when what is NULL,
 * else what), every thread stops.  Returns rc. */
int pool_refused(struct pool_thread *t, enum pool_link k, const char *what, const char *why, int rc);
/* Settings that cannot work together (why: one line naming them and the
 * remedy): logged once, every thread stops, the process exits 2.
 * Returns ST_ERR_INVALID. */
int pool_misconfigured(struct pool_thread *t, const char *why);

/* After the thread's links were brought up: false when rc is ST_OK (go
 * on); true when the thread must leave its loop, asked to stop or
 * failed for good (then its exit code is 1 and the pool stops). */
bool pool_thread_ends(struct pool_thread *t, int rc);

/* How a thread waits between database attempts (NULL: pool_sleep_ms); a
 * consuming thread keeps its broker connection alive meanwhile. */
typedef void pool_wait_fn(void *arg, int ms);

/* Connect (or reconnect) the database side until it works or we stop.
 * ST_ERR_ACCESS (logged, the pool stopping) when the server refuses the
 * account before this thread ever connected, ST_ERR_TLS_CERT likewise when
 * its certificate fails verification; another error when the
 * schema is not usable; ST_ERR_STOPPED when asked to stop: at once for a
 * thread without wait (it holds nothing), else only once the database has
 * been down for POOL_STOP_DB_MS since (a stop finishes what is in hand). */
int pool_db_up(struct pool_thread *t, struct pool_db *d, pool_wait_fn *wait, void *arg);
void pool_db_close(struct pool_db *d);

#endif
