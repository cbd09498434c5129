/*
 * pool.c - the worker pool: its threads and signals, and what each of its
 * threads does the same way (clocks, backoff, links that fail and come
 * back, the database side).
 *
 * Signals: main blocks SIGINT/SIGTERM before starting threads, so only its
 * sigtimedwait sees them.  The first sets the stop flag: threads stop
 * consuming, finish and ack the message in hand, close and exit.  A second
 * signal exits at once (what is unacked is redelivered, which the inbox
 * absorbs).
 *
 * The service manager (systemd, Type=notify) hears from the signal loop
 * too (pool_watch_tick below).
 *
 * The threads: INBOX_THREADS consuming threads (worker.c: a batch of
 * deliveries screened, settled in one transaction, counted and acked) and
 * one janitor (janitor.c: the outbox relay, hold expiry, gauges and
 * retention cleanup).
 */
#include "pool.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "aggregate.h"
#include "config.h"
#include "courier.h"
#include "http_call.h"
#include "db.h"
#include "inbox.h"
#include "inflight.h"
#include "janitor.h"
#include "metrics.h"
#include "notify.h"
#include "outbox.h"
#include "status.h"
#include "worker.h"

#define POOL_BACKOFF_MAX_MS 5000
/* After the stop flag, how long a thread holding deliveries goes on
 * reconnecting a database that is down, to finish them, before it hands
 * them back (pool_db_up).  Well inside two heartbeat intervals of the
 * default INBOX_HEARTBEAT, and inside the usual stop timeout of a service
 * manager (systemd: 90 s). */
#define POOL_STOP_DB_MS 10000

atomic_bool pool_stop;

/* Set once a thread of this process has prepared every statement: from
 * then on the schema is known to be this build's, and a prepare that
 * fails is a fault to wait out, not a refusal (pool_db_up). */
static atomic_bool pool_schema_seen;

/* The calling thread's progress counter; NULL in main and other threads. */
static _Thread_local atomic_ullong *pool_my_beats;

void pool_beat_bind(struct pool_thread *t)
{
	pool_my_beats = &t->beats;
}

void pool_beat(void)
{
	if (pool_my_beats != NULL)
		atomic_fetch_add_explicit(pool_my_beats, 1, memory_order_relaxed);
}

int64_t pool_now_ms(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
		return 0;
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double pool_now_s(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
		return 0;
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void pool_sleep_ms(int ms)
{
	while (ms > 0 && !atomic_load(&pool_stop)) {
		int step = ms > 100 ? 100 : ms;

		pool_beat();
		struct timespec ts = { .tv_sec = 0, .tv_nsec = (long)step * 1000000L };
		while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
			;
		ms -= step;
	}
}

int pool_backoff_ms(struct pool_thread *t, int attempt, int first_ms)
{
	long base = first_ms;

	for (int i = 0; i < attempt && base < POOL_BACKOFF_MAX_MS; i++)
		base *= 2;
	if (base > POOL_BACKOFF_MAX_MS)
		base = POOL_BACKOFF_MAX_MS;
	return (int)(base / 2 + rand_r(&t->seed) % (base / 2 + 1));
}

void pool_thread_unready(struct pool_thread *t)
{
	metrics_thread_ready(t->index, false);
	metrics_thread_shards(t->index, 0);
}

void pool_db_close(struct pool_db *d)
{
	outbox_close(&d->outbox);
	inbox_close(&d->inbox);
	db_close(&d->db);
}

static const struct {
	const char *name, *attempt, *down, *up;
	enum metrics_peer peer;
} pool_links[2] = {
	[POOL_LINK_DB] = { "db", "database connect attempt failed", "database unavailable, retrying",
	                   "database reconnected", METRICS_PEER_DB },
	[POOL_LINK_AMQP] = { "amqp", "broker connect attempt failed", "broker unavailable, retrying",
	                     "broker reconnected", METRICS_PEER_AMQP },
};

bool pool_why_changed(char *last, bool first, const char *why)
{
	bool changed = first || strcmp(last, why) != 0;

	snprintf(last, POOL_WHY_MAX, "%s", why);
	return changed;
}

void pool_link_failed(struct pool_thread *t, enum pool_link k, const char *why)
{
	struct pool_link_log *l = &t->link[k];
	const struct cfg *c = t->conf;

	l->attempts++;
	LOG(LOG_LEVEL_DEBUG, pool_links[k].attempt, POOL_KV(t), LOG_I("attempt", l->attempts), LOG_S("error", why));
	if (!pool_why_changed(l->why, !l->down, why))
		return;
	if (!l->down)
		l->since_ms = pool_now_ms();
	l->down = true;
	LOG(LOG_LEVEL_WARN, pool_links[k].down, POOL_KV(t),
	    LOG_S(pool_links[k].name, k == POOL_LINK_DB ? c->db.redacted : c->amqp.redacted), LOG_S("error", why));
}

void pool_link_up(struct pool_thread *t, enum pool_link k)
{
	struct pool_link_log *l = &t->link[k];

	if (l->down)
		LOG(LOG_LEVEL_INFO, pool_links[k].up, POOL_KV(t), LOG_I("attempts", l->attempts),
		    LOG_I("down_ms", pool_now_ms() - l->since_ms));
	l->down = false;
	l->attempts = 0;
	l->ever_up = true;
}

void pool_link_back(struct pool_thread *t, enum pool_link k)
{
	if (t->link[k].ever_up)
		metrics_reconnect(pool_links[k].peer);
	pool_link_up(t, k);
}

int pool_link_retry_ms(struct pool_thread *t, enum pool_link k, const char *why)
{
	pool_thread_unready(t);
	pool_link_failed(t, k, why);
	return pool_backoff_ms(t, t->link[k].attempts - 1, 200);
}

int pool_refused(struct pool_thread *t, enum pool_link k, const char *what, const char *why, int rc)
{
	const struct cfg *c = t->conf;
	bool db = k == POOL_LINK_DB;

	if (!atomic_exchange(&t->shared->refused, true)) {
		if (what == NULL)
			log_refused(rc, pool_links[k].name, db ? c->db.user : c->amqp.user,
			            db ? c->db.redacted : c->amqp.redacted, why);
		else
			LOG(LOG_LEVEL_ERROR, what, LOG_S("link", pool_links[k].name),
			    LOG_S("user", db ? c->db.user : c->amqp.user),
			    LOG_S(pool_links[k].name, db ? c->db.redacted : c->amqp.redacted), LOG_S("error", why));
	}
	atomic_store(&t->exit_code, 1);
	atomic_store(&pool_stop, true);
	return rc;
}

int pool_misconfigured(struct pool_thread *t, const char *why)
{
	if (!atomic_exchange(&t->shared->refused, true))
		LOG(LOG_LEVEL_ERROR, "configuration cannot work", LOG_S("error", why));
	/* SPEC: a configuration error exits 2, a runtime failure 1.  Two
	 * settings that cannot work together (INBOX_MAX_BODY and the
	 * server's max_allowed_packet) are a configuration error: no retry
	 * or restart fixes them, only changing one of them. */
	atomic_store(&t->exit_code, 2);
	atomic_store(&pool_stop, true);
	return ST_ERR_INVALID;
}

bool pool_thread_ends(struct pool_thread *t, int rc)
{
	if (rc == ST_OK)
		return false;
	if (rc != ST_ERR_STOPPED) {
		/* Refused (logged, the pool stopping), or unusable; a code
		 * set already (2: misconfigured) stands. */
		int none = 0;

		(void)atomic_compare_exchange_strong(&t->exit_code, &none, 1);
		atomic_store(&pool_stop, true);
	}
	return true;
}

/* After the stop flag: whether to give the database up now.  A thread
 * that holds nothing (wait NULL) gives up at once, one holding deliveries
 * after POOL_STOP_DB_MS (*give_up: when, 0 before the first call). */
static bool pool_db_give_up(pool_wait_fn *wait, int64_t *give_up)
{
	if (wait == NULL)
		return true;
	if (*give_up == 0) {
		*give_up = pool_now_ms() + POOL_STOP_DB_MS;
		return false;
	}
	return pool_now_ms() >= *give_up;
}

/* A new connection and the inbox's and outbox's statements on it.  ST_OK;
 * else d is closed again and why says what failed.  *final: the failure
 * is a refusal to report and stop on (the return value is then
 * pool_refused's), not one to retry. */
static int pool_db_open_all(struct pool_thread *t, struct pool_db *d, char *why, size_t cap, bool *final)
{
	int rc = db_open_from_why(&d->db, &t->conf->db, &d->node, why, cap);

	*final = false;
	if (rc == ST_OK)
		rc = inbox_open(&d->inbox, d->db, t->conf);
	if (rc == ST_OK)
		rc = outbox_open(&d->outbox, d->db, t->conf);
	if (rc == ST_OK) {
		atomic_store(&pool_schema_seen, true);
		return ST_OK;
	}
	if (d->db != NULL && rc != ST_ERR_DB_CONN && !atomic_load(&pool_schema_seen)) {
		/* A prepare failing at start-up means the schema is missing or
		 * wrong, or a grant: waiting will not fix it.  Once any thread
		 * of the process has prepared its statements, the same failure
		 * is a table renamed or dropped under a running pool (the
		 * janitor may first connect only then): what is held is kept
		 * and the link retried (pool_db_up) until the schema is back,
		 * as for an outage. */
		char err[POOL_WHY_MAX];
		snprintf(err, sizeof err, "%u %s", db_errno(d->db), db_errmsg(d->db));
		pool_db_close(d);
		*final = true;
		return pool_refused(t, POOL_LINK_DB, "database not usable: run `inbox-worker migrate`"
		                      " (a table or procedure is missing), or grant the account what it lacks",
		                      err, rc);
	}
	if (d->db != NULL) {
		snprintf(why, cap, "%u %s", db_errno(d->db), db_errmsg(d->db));
		/* The node took the connection but not the statements (a Galera
		 * node answering 1047): start from the next node of the list. */
		d->node++;
	}
	pool_db_close(d);
	return rc;
}

/*
 * A stop finishes what the thread holds (SPEC): once the stop flag is up, a
 * thread that may hold deliveries (wait set: a consuming thread, between
 * the steps of a batch it read, a split's second half, a retry) still gets
 * its connection, and one that is down is reconnected for up to
 * POOL_STOP_DB_MS: a database down at stop time is given up on only after
 * that bound, and what is in hand then goes back to the broker.  A thread
 * that holds nothing (the janitor) stops at once.
 */
int pool_db_up(struct pool_thread *t, struct pool_db *d, pool_wait_fn *wait, void *arg)
{
	char why[POOL_WHY_MAX];
	int64_t give_up = 0;

	for (;;) {
		bool final = false;
		int rc;

		if (d->db != NULL && db_connected(d->db))
			return ST_OK;
		if (atomic_load(&pool_stop) && pool_db_give_up(wait, &give_up))
			break;
		if (d->db != NULL) {
			rc = db_reconnect(d->db);
			if (rc != ST_OK)
				snprintf(why, sizeof why, "%u %s", db_errno(d->db), db_errmsg(d->db));
		} else {
			rc = pool_db_open_all(t, d, why, sizeof why, &final);
			if (final)
				return rc;
		}
		/* Each connection reads the server's max_allowed_packet: a
		 * body the configuration accepts must fit it (inbox_limits). */
		if (rc == ST_OK && d->inbox != NULL && inbox_limits(d->inbox, why, sizeof why) != ST_OK) {
			pool_db_close(d);
			return pool_misconfigured(t, why);
		}
		if (rc == ST_OK) {
			pool_link_back(t, POOL_LINK_DB);
			return ST_OK;
		}
		if (st_refusal(rc) && !t->link[POOL_LINK_DB].ever_up)
			return pool_refused(t, POOL_LINK_DB, NULL, why, rc);
		/* A consuming thread may hold deliveries (and has
		 * prefetched more): its wait keeps the broker connection
		 * alive meanwhile. */
		if (wait != NULL)
			wait(arg, pool_link_retry_ms(t, POOL_LINK_DB, why));
		else
			pool_sleep_ms(pool_link_retry_ms(t, POOL_LINK_DB, why));
	}
	return ST_ERR_STOPPED;
}

/*
 * Which queues thread i consumes.  Shared ordering: the one queue.
 * Sharded ordering: every shard must have a consumer in every process
 * whatever the thread count, else the events hashed to an uncovered shard
 * wait with nobody to take them.  With T threads and S shards:
 *   T <= S: thread i consumes every shard s with s % T == i (several
 *           basic.consume on its one channel);
 *   T > S:  thread i consumes shard i % S; the threads from S on are a
 *           second consumer of a shard, which single-active-consumer keeps
 *           as a standby that takes over at once if the active one's
 *           connection fails.  They add no parallelism: a shard is
 *           handled one message at a time.
 */
static void pool_assign_shards(const struct cfg *conf, struct worker *w)
{
	int t = conf->threads, s = conf->shards, index = w->t.index;

	w->nshards = 0;
	w->shard_mask = 0;
	if (conf->ordering != CFG_ORDERING_SHARDED) {
		w->shard[w->nshards++] = 0;
		return;
	}
	if (t > s) {
		w->shard[w->nshards++] = index % s;
	} else {
		for (int k = index; k < s; k += t)
			w->shard[w->nshards++] = k;
	}
	for (int k = 0; k < w->nshards; k++)
		w->shard_mask |= (uint64_t)1 << w->shard[k];
}

/* Thread i's common part (the janitor is i == conf->threads). */
static void pool_thread_init(struct pool_thread *t, int i, const struct cfg *conf, struct pool_shared *shared)
{
	bool janitor = i == conf->threads;

	t->index = janitor ? -1 : i;
	t->conf = conf;
	t->shared = shared;
	t->seed = (unsigned)time(NULL) ^ (unsigned)getpid() ^ (unsigned)(i * 2654435761u);
	snprintf(t->name, sizeof t->name, "inbox-worker pid=%d %s=%d", (int)getpid(), janitor ? "janitor" : "thread", i);
}

/*
 * What the service manager is told (notify.h), from main's signal loop:
 *   READY=1   the first time every thread is ready: what /readyz answers
 *             200 for (both connections, every consumer, every shard);
 *   STATUS=   whenever readiness or its reason changes, and why a
 *             watchdog ping is withheld (`systemctl status` shows it);
 *   WATCHDOG=1  every quarter of the watchdog interval (a slot), but only
 *             while every running thread's progress counter
 *             (pool_thread.beats) moved in the last two slots, half the
 *             interval: one step of a healthy thread may then take up to
 *             half of it (the unit's WatchdogSec leaves room for the
 *             longest, a statement's 30 s read time-out) without a ping
 *             being missed, and a thread silent for longer withholds them,
 *             so the manager acts within 1.25 to 1.5 intervals of the
 *             stall.  A thread bumps it every time round its
 *             loop and every step of its waits (at least every 250 ms when
 *             idle, every 100 ms of a backoff), so a thread waiting for a
 *             server that is down keeps the pings coming -- restarting
 *             would not bring the server back -- while a thread stuck in a
 *             call that never returns, or spinning without finishing
 *             anything, stops them, and the manager restarts the process
 *             after WatchdogSec;
 *   STOPPING=1  once, when the pool starts stopping (a signal, or a
 *             thread that failed for good).
 */
struct pool_watch {
	struct notify n;
	bool ready_sent, stopping_sent, withheld;
	char status[256];                 /* the last STATUS= sent */
	int64_t next_slot_ms;
	unsigned long long *last;         /* each thread's beats at the last slot */
	int *stale;                       /* each thread's slots in a row without progress */
};

/* Send prefix (assignments ending in a newline, or "") and STATUS=status;
 * a status without a prefix only when it changed, unless always. */
static void pool_watch_status(struct pool_watch *pw, const char *prefix, const char *status, bool always)
{
	char msg[400];

	if (!always && prefix[0] == '\0' && strcmp(pw->status, status) == 0)
		return;
	snprintf(pw->status, sizeof pw->status, "%s", status);
	snprintf(msg, sizeof msg, "%sSTATUS=%s", prefix, status);
	(void)notify_send(&pw->n, msg); /* a failure is logged once there */
}

static void pool_watch_tick(struct pool_watch *pw, struct pool_thread **threads, int started, int nthreads)
{
	char why[200], status[256];
	int64_t now = pool_now_ms();
	int stuck = -2; /* the first thread without progress; -2: none */

	if (!notify_enabled(&pw->n))
		return;
	if (atomic_load(&pool_stop)) {
		if (!pw->stopping_sent) {
			pw->stopping_sent = true;
			pool_watch_status(pw, "STOPPING=1\n", "stopping: finishing the messages in hand", true);
		}
	} else if (started == nthreads) {
		bool ready = metrics_readiness(why, sizeof why);

		if (ready)
			snprintf(status, sizeof status, "ready: every thread consuming");
		else
			snprintf(status, sizeof status, "not ready: %s", why);
		if (ready && !pw->ready_sent) {
			pw->ready_sent = true;
			pool_watch_status(pw, "READY=1\n", status, true);
		} else if (!pw->withheld) {
			pool_watch_status(pw, "", status, false);
		}
	}
	if (pw->n.watchdog_ms <= 0 || now < pw->next_slot_ms)
		return;
	pw->next_slot_ms = now + (pw->n.watchdog_ms / 4 > 0 ? pw->n.watchdog_ms / 4 : 1);
	for (int i = 0; i < started; i++) {
		unsigned long long b = atomic_load_explicit(&threads[i]->beats, memory_order_relaxed);

		pw->stale[i] = b == pw->last[i] ? pw->stale[i] + 1 : 0;
		pw->last[i] = b;
		/* A thread that ended is not stuck: the pool is stopping. */
		if (pw->stale[i] >= 2 && !threads[i]->joined && stuck == -2)
			stuck = i;
	}
	if (stuck == -2) {
		if (pw->withheld)
			LOG0(LOG_LEVEL_INFO, "watchdog: every thread makes progress again");
		pw->withheld = false;
		(void)notify_send(&pw->n, "WATCHDOG=1");
		return;
	}
	/* Withheld: say so on every slot (the status, and a debug line), and
	 * once at warning level. */
	if (threads[stuck]->index >= 0)
		snprintf(status, sizeof status, "watchdog withheld: worker=%d made no progress", threads[stuck]->index);
	else
		snprintf(status, sizeof status, "watchdog withheld: the janitor made no progress");
	LOG(pw->withheld ? LOG_LEVEL_DEBUG : LOG_LEVEL_WARN,
	    "watchdog withheld: a thread made no progress in half the watchdog interval", POOL_KV(threads[stuck]),
	    LOG_I("watchdog_ms", pw->n.watchdog_ms));
	pw->withheld = true;
	pool_watch_status(pw, "", status, true);
}

/* What pool_main holds while it runs, released by pool_release whatever
 * was reached: every path out of pool_main goes through it. */
struct pool {
	const struct cfg *conf;
	int nthreads;                 /* the workers and the janitor */
	struct worker *workers;
	struct janitor *janitor;
	struct pool_thread **threads; /* workers, then the janitor */
	int started;                  /* threads created, each to be joined */
	struct pool_shared shared;
	bool have_cv, have_mu;
	struct pool_watch watch;
	/* One per HTTP destination (courier.h), outside the watchdog's
	 * threads: a call waits its destination's time-out at most. */
	struct courier *couriers;
	int ncouriers, couriers_started;
	bool http_up;
};

/* Only the signal loop sees SIGINT/SIGTERM: blocked before any thread
 * starts, so every thread inherits the mask. */
static int pool_block_signals(sigset_t *set)
{
	sigemptyset(set);
	sigaddset(set, SIGINT);
	sigaddset(set, SIGTERM);
	if (pthread_sigmask(SIG_BLOCK, set, NULL) != 0) {
		LOG0(LOG_LEVEL_ERROR, "cannot block signals");
		return -1;
	}
	return 0;
}

/* The janitor's timed wait runs on the monotonic clock: a wall clock step
 * must not stall the outbox. */
static int pool_shared_init(struct pool *p)
{
	pthread_condattr_t ca;
	bool attr = pthread_condattr_init(&ca) == 0;

	p->have_cv = attr && pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
	             pthread_cond_init(&p->shared.cv, &ca) == 0;
	if (attr)
		pthread_condattr_destroy(&ca);
	p->have_mu = p->have_cv && pthread_mutex_init(&p->shared.mu, NULL) == 0;
	if (!p->have_mu) {
		LOG0(LOG_LEVEL_ERROR, "cannot initialise the janitor's condition variable");
		return -1;
	}
	return 0;
}

static int pool_alloc(struct pool *p)
{
	const struct cfg *conf = p->conf;

	p->workers = calloc((size_t)conf->threads, sizeof *p->workers);
	p->janitor = calloc(1, sizeof *p->janitor);
	p->threads = calloc((size_t)p->nthreads, sizeof *p->threads);
	p->watch.last = calloc((size_t)p->nthreads, sizeof *p->watch.last);
	p->watch.stale = calloc((size_t)p->nthreads, sizeof *p->watch.stale);
	if (p->workers == NULL || p->janitor == NULL || p->threads == NULL || p->watch.last == NULL ||
	    p->watch.stale == NULL ||
	    (conf->threads > 1 && conf->ordering == CFG_ORDERING_SHARED &&
	     inflight_open(&p->shared.inflight, conf->threads, conf->batch) != ST_OK)) {
		LOG0(LOG_LEVEL_ERROR, "out of memory");
		return -1;
	}
	return 0;
}

/* Start every thread, the janitor last.  A thread that cannot be prepared
 * or started stops the pool: the ones started are joined by the signal
 * loop.  Returns 0, or 1 when one could not be started. */
static int pool_start(struct pool *p)
{
	const struct cfg *conf = p->conf;

	for (int i = 0; i < p->nthreads; i++) {
		bool is_janitor = i == conf->threads;
		struct pool_thread *t = is_janitor ? &p->janitor->t : &p->workers[i].t;

		p->threads[i] = t;
		pool_thread_init(t, i, conf, &p->shared);
		if (!is_janitor) {
			pool_assign_shards(conf, &p->workers[i]);
			if (worker_alloc(&p->workers[i]) != ST_OK) {
				LOG(LOG_LEVEL_ERROR, "cannot prepare worker thread", LOG_I("worker", i));
				atomic_store(&pool_stop, true);
				return 1;
			}
		}
		if (pthread_create(&t->thread, NULL, is_janitor ? janitor_main : worker_main,
		                   is_janitor ? (void *)p->janitor : (void *)&p->workers[i]) != 0) {
			LOG(LOG_LEVEL_ERROR, "cannot start worker thread", LOG_I("worker", i));
			atomic_store(&pool_stop, true);
			return 1;
		}
		p->started++;
	}
	return 0;
}

/* The couriers, after the other threads: 1 when one cannot start (the
 * pool stops). */
static int pool_start_couriers(struct pool *p)
{
	const struct lc_def *def = agg_current()->def;

	if (def->ndests == 0)
		return 0;
	if (http_global_init() != ST_OK) {
		LOG0(LOG_LEVEL_ERROR, "cannot initialise libcurl");
		atomic_store(&pool_stop, true);
		return 1;
	}
	p->http_up = true;
	p->couriers = calloc((size_t)def->ndests, sizeof *p->couriers);
	if (p->couriers == NULL) {
		LOG0(LOG_LEVEL_ERROR, "out of memory");
		atomic_store(&pool_stop, true);
		return 1;
	}
	for (int d = 0; d < def->ndests; d++) {
		p->ncouriers++;
		if (courier_init(&p->couriers[d], d, p->conf, &p->shared) != ST_OK ||
		    pthread_create(&p->couriers[d].t.thread, NULL, courier_main, &p->couriers[d]) != 0) {
			LOG(LOG_LEVEL_ERROR, "cannot start a courier thread", LOG_S("destination", def->dests[d].name));
			atomic_store(&pool_stop, true);
			return 1;
		}
		p->couriers_started++;
	}
	return 0;
}

/* Join what has ended; true when every started thread has. */
static bool pool_join_ended(struct pool *p)
{
	bool all_done = true;

	for (int i = 0; i < p->started; i++) {
		if (p->threads[i]->joined)
			continue;
		/* A joined thread must not be joined again. */
		if (pthread_tryjoin_np(p->threads[i]->thread, NULL) == 0)
			p->threads[i]->joined = true;
		else
			all_done = false;
	}
	return all_done;
}

/* The signal loop, until every started thread has ended: the first
 * signal asks for a graceful stop, the second ends the process now; a
 * thread that ended with an exit code stops the others. */
static void pool_wait(struct pool *p, const sigset_t *set)
{
	for (;;) {
		struct timespec ts = { .tv_sec = 0, .tv_nsec = 200 * 1000000L };
		int sig = sigtimedwait(set, NULL, &ts);

		if (sig == SIGINT || sig == SIGTERM) {
			if (atomic_load(&pool_stop)) {
				LOG0(LOG_LEVEL_WARN, "second signal: exiting now");
				_exit(1);
			}
			LOG(LOG_LEVEL_INFO, "stopping: finishing messages in hand", LOG_S("signal", sig == SIGINT ? "SIGINT" : "SIGTERM"));
			atomic_store(&pool_stop, true);
		}
		for (int i = 0; i < p->started; i++)
			if (atomic_load(&p->threads[i]->exit_code) != 0)
				atomic_store(&pool_stop, true);
		pool_watch_tick(&p->watch, p->threads, p->started, p->nthreads);
		if (atomic_load(&pool_stop) && pool_join_ended(p))
			return;
	}
}

static void pool_log_stopped(void)
{
	LOG(LOG_LEVEL_INFO, "stopped", LOG_I("applied", metrics_outcome_count(METRICS_APPLIED)),
	    LOG_I("redelivered", metrics_redelivered_count()),
	    LOG_I("held", metrics_held_count()), LOG_I("released", metrics_released_count()),
	    LOG_I("ignored", metrics_outcome_count(METRICS_IGNORED)),
	    LOG_I("compensated", metrics_outcome_count(METRICS_COMPENSATED)),
	    LOG_I("duplicates", metrics_outcome_count(METRICS_DUPLICATE)),
	    LOG_I("dead_lettered", metrics_outcome_count(METRICS_DEAD_LETTERED)));
}

/* In reverse order of acquisition; anything not reached is NULL or
 * flagged off.  Nothing reads the workers after this. */
static void pool_release(struct pool *p)
{
	notify_close(&p->watch.n);
	if (p->workers != NULL)
		for (int i = 0; i < p->conf->threads; i++)
			worker_free(&p->workers[i]);
	inflight_close(&p->shared.inflight);
	for (int i = 0; i < p->ncouriers; i++)
		courier_free(&p->couriers[i]);
	free(p->couriers);
	if (p->http_up)
		http_global_end();
	free(p->workers);
	free(p->janitor);
	free(p->threads);
	free(p->watch.last);
	free(p->watch.stale);
	if (p->have_mu)
		pthread_mutex_destroy(&p->shared.mu);
	if (p->have_cv)
		pthread_cond_destroy(&p->shared.cv);
}

int pool_main(const struct cfg *conf)
{
	struct pool p = { .conf = conf, .nthreads = conf->threads + 1, .watch = { .n = { .fd = -1 } } };
	sigset_t set;
	int code = 1;

	if (pool_block_signals(&set) != 0 || pool_shared_init(&p) != 0 || pool_alloc(&p) != 0)
		goto done;
	/* Before anything starts: a manager waiting for READY=1 that cannot
	 * come must learn it from our exit, not from its start time-out. */
	if (notify_open(&p.watch.n) != 0)
		goto done;
	if (notify_enabled(&p.watch.n))
		LOG(LOG_LEVEL_INFO, "notifying the service manager", LOG_I("watchdog_ms", p.watch.n.watchdog_ms));
	p.watch.next_slot_ms = pool_now_ms() + p.watch.n.watchdog_ms / 4;
	if (metrics_start(conf->metrics_addr) != 0)
		goto done;
	metrics_set_threads(conf->threads);
	metrics_set_shards(conf->ordering == CFG_ORDERING_SHARDED ? conf->shards : 0);
	LOG(LOG_LEVEL_INFO, "starting", LOG_S("version", INBOX_VERSION), LOG_I("threads", conf->threads), LOG_S("amqp", conf->amqp.redacted),
	    LOG_S("db", conf->db.redacted), LOG_S("queue", conf->queue), LOG_S("consumer", conf->consumer));
	code = pool_start(&p);
	if (code == 0)
		code = pool_start_couriers(&p);
	pool_wait(&p, &set);
	for (int i = 0; i < p.couriers_started; i++) {
		pthread_join(p.couriers[i].t.thread, NULL);
		if (atomic_load(&p.couriers[i].t.exit_code) != 0)
			code = atomic_load(&p.couriers[i].t.exit_code);
	}
	for (int i = 0; i < p.started; i++)
		if (atomic_load(&p.threads[i]->exit_code) != 0)
			code = atomic_load(&p.threads[i]->exit_code);
	metrics_stop();
	pool_log_stopped();
done:
	pool_release(&p);
	return code;
}
