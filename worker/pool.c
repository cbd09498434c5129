/*
 * pool.c - the worker pool.
 *
 * Signals: main blocks SIGINT/SIGTERM before starting threads, so only its
 * sigtimedwait sees them.  The first sets the stop flag: threads stop
 * consuming, finish and ack the message in hand, close and exit.  A second
 * signal exits at once (what is unacked is redelivered, which the inbox
 * absorbs).
 *
 * Per batch of deliveries (worker_handle; a batch is one delivery unless
 * INBOX_BATCH > 1, and never waits for more than is already here):
 *   size, parse and routing key checks -> dead-letter on bad input
 *   (confirmed);
 *   the valid ones in one transaction (worker_transact): deadlock / lock
 *   wait time-out retry with jittered exponential backoff up to
 *   max_retries; a batch that still cannot commit, or that holds a value
 *   the database refuses, is split into single messages, and a single one
 *   then goes to the DLQ as retries-exhausted or unprocessable;
 *   a lost database connection, or any other database fault, is never the
 *   messages': keep them, wait with backoff, run them again.  Ack only
 *   after the commit (or after the dead-letter copy is confirmed; a nacked
 *   or unroutable copy is retried with backoff, the original kept); while
 *   more deliveries are already waiting, acks are gathered into one
 *   cumulative ack (worker_ack_flush).
 *
 * One message's fault stays its own (SPEC.md): nothing about a delivery
 * makes worker_handle fail, so the consumer channel is reset only when the
 * broker connection itself fails.  A reset hands every prefetched delivery
 * back and raises its delivery count, which would push innocent messages
 * towards the delivery limit.
 *
 * Each process also runs one janitor thread (janitor_main): the outbox
 * relay, hold expiry, the outbox gauge and retention cleanup in slices
 * (janitor_retention).
 */
#include "pool.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "db.h"
#include "dlq.h"
#include "fault.h"
#include "gauge.h"
#include "inbox.h"
#include "log.h"
#include "metrics.h"
#include "mq.h"
#include "msg.h"
#include "outbox.h"
#include "retention.h"
#include "status.h"

#define POOL_CONSUME_TIMEOUT_MS 250
#define POOL_HOUSEKEEPING_MS 1000  /* hold expiry and the outbox gauge */
#define POOL_RELAY_IDLE_MS 250     /* relay rows of crashed peers at least this often */
/* A retention pass runs one tick per POOL_CLEANUP_TICK_MS until it has
 * caught up; a tick starts no slice after POOL_CLEANUP_BUDGET_MS (and runs
 * RETENTION_TICK_SLICES at most), so the relay and hold expiry wait for one
 * tick at most, and the deletes take about a tenth of one connection. */
#define POOL_CLEANUP_TICK_MS 1000
#define POOL_CLEANUP_BUDGET_MS 100
/* At most this often the janitor relays: each round ends in a COMMIT, and
 * on a busy database a commit (its fsync) per emitted row would cost the
 * consuming threads more than the few milliseconds of latency saved. */
#define POOL_RELAY_MIN_GAP_MS 50
#define POOL_BACKOFF_MAX_MS 5000
#define POOL_CONFIRM_TIMEOUT_MS 10000
#define POOL_WHY_MAX 300   /* a link's failure, as logged */

/* The one global: raised by the signal thread, read by workers. */
static atomic_bool pool_stop;

/* The thread's name in log lines: worker=N, or thread=janitor. */
#define WORKER_KV(w) ((w)->index >= 0 ? LOG_I("worker", (w)->index) : LOG_S("thread", "janitor"))

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
};

/* A link (database or broker) as this thread last reported it: a failing
 * link is logged when it starts failing and when its reason changes, and
 * once when it works again; each attempt only at debug level.  ever_up:
 * the link worked once, so a refusal now is someone changing the server
 * under a running pool (retried) rather than a wrong setting (fatal). */
enum pool_link { POOL_LINK_DB = 0, POOL_LINK_AMQP = 1 };
struct link_log {
	bool down;
	bool ever_up;
	int attempts;
	int64_t since_ms;
	char why[POOL_WHY_MAX];
};

struct worker {
	int index;
	const struct cfg *conf;
	pthread_t thread;
	struct mq *consumer;
	struct mq *publisher;
	struct mq *probe;     /* the janitor's: reads the DLQ's depth */
	struct db *db;
	/* The broker node each connection starts from (INBOX_AMQP_URL may
	 * list a cluster's nodes): moved on past a node whose connection
	 * failed, so a thread goes to another node instead of waiting. */
	int consumer_node;
	int publisher_node;
	int db_node;          /* the same for the first database connection */
	struct inbox *inbox;
	struct outbox *outbox;
	struct retention *retention; /* the janitor's, prepared on first use */
	struct gauge *gauge;         /* the janitor's, prepared on first use */
	/* The queues this thread consumes: indexes for mq_consume_queue_name
	 * (one, 0, in shared ordering; its shards in sharded ordering). */
	int shard[64];
	int nshards;
	uint64_t shard_mask;  /* sharded ordering: bit i = shard i */
	bool consumed_once;   /* a topology refusal after this is not fatal */
	char name[64];
	unsigned seed;
	struct pool_shared *shared; /* wakes the janitor; says a refusal was logged */
	struct link_log link[2];    /* by enum pool_link */
	atomic_int exit_code; /* written by the thread, read by main */
	struct item *items;   /* INBOX_BATCH deliveries */
	struct inbox_in *ins; /* the valid ones of a batch, as the inbox takes them */
	struct inbox_result *res;
	/* Settled deliveries not yet acked: every tag up to ack_tag is done
	 * (committed or confirmed in the DLQ), so one basic.ack with
	 * multiple=true settles them all (see worker_ack_flush). */
	uint64_t ack_tag;
	int ack_pending;
	bool joined;
};

static int64_t pool_now_ms(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
		return 0;
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static double pool_now_s(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
		return 0;
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Sleep in short steps so that a stop request is seen within 100 ms. */
static void pool_sleep_ms(int ms)
{
	while (ms > 0 && !atomic_load(&pool_stop)) {
		int step = ms > 100 ? 100 : ms;
		struct timespec ts = { .tv_sec = 0, .tv_nsec = (long)step * 1000000L };
		while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
			;
		ms -= step;
	}
}

/* Full jitter: a random wait in [base/2, base], base doubling per attempt. */
static int pool_backoff_ms(struct worker *w, int attempt, int first_ms)
{
	long base = first_ms;

	for (int i = 0; i < attempt && base < POOL_BACKOFF_MAX_MS; i++)
		base *= 2;
	if (base > POOL_BACKOFF_MAX_MS)
		base = POOL_BACKOFF_MAX_MS;
	return (int)(base / 2 + rand_r(&w->seed) % (base / 2 + 1));
}

/* Readiness: the thread is ready when it has both connections and every
 * one of its consumers; its shards count as covered only then. */
static void worker_ready(struct worker *w, bool ready)
{
	metrics_thread_ready(w->index, ready);
	metrics_thread_shards(w->index, ready ? w->shard_mask : 0);
}

/* Ack every settled delivery in one frame.  Acks are deferred only while
 * more deliveries are already waiting (worker_main): in a backlog one
 * cumulative ack per several messages spares the broker a settle per
 * message (on a quorum queue each is a log entry), and when traffic is
 * light nothing waits, so each ack still leaves right after its commit.  A
 * crash between a commit and the deferred ack only means redeliveries,
 * which the inbox settles as duplicates. */
static int worker_ack_flush(struct worker *w)
{
	int rc;

	if (w->ack_pending == 0)
		return ST_OK;
	rc = mq_ack(w->consumer, w->ack_tag, w->ack_pending > 1);
	w->ack_pending = 0;
	return rc;
}

/*
 * Wait ms while keeping the consumer connection alive.  rabbitmq-c sends
 * and answers heartbeats only while the thread is inside the library, so a
 * thread that slept through a database outage lost its consumer after two
 * heartbeat intervals, and the broker returned everything it held and had
 * prefetched, raising each message's delivery count (a flapping database
 * could push valid messages over the delivery limit).  Here the thread
 * waits for frames instead; deliveries that arrive are kept aside by
 * mq_service and handed out by mq_consume later, so no new work is taken
 * meanwhile.  Without a consumer it just sleeps.  Deliveries of the batch
 * in hand stay unacked; the ones already settled are acked first.  Stops within 100 ms of
 * the stop flag either way.
 */
static void worker_wait(struct worker *w, int ms)
{
	int64_t end = pool_now_ms() + ms;

	/* What is settled is acked before a wait that may be long (a
	 * database outage): a crash meanwhile must not redeliver it. */
	if (w->consumer != NULL && worker_ack_flush(w) != ST_OK)
		LOG(LOG_LEVEL_WARN, "ack before waiting failed; the broker redelivers, the inbox absorbs it",
		    WORKER_KV(w));

	while (!atomic_load(&pool_stop)) {
		int64_t left = end - pool_now_ms();
		int step = left > 100 ? 100 : (int)left;

		if (step <= 0)
			return;
		if (w->consumer == NULL || mq_service(w->consumer, step) != ST_OK)
			pool_sleep_ms(step); /* no consumer, or it failed: the ack will say so */
	}
}

static void worker_close_db(struct worker *w)
{
	retention_close(&w->retention);
	gauge_close(&w->gauge);
	outbox_close(&w->outbox);
	inbox_close(&w->inbox);
	db_close(&w->db);
}

static const struct {
	const char *name, *attempt, *down, *up;
} pool_links[2] = {
	[POOL_LINK_DB] = { "db", "database connect attempt failed", "database unavailable, retrying",
	                   "database reconnected" },
	[POOL_LINK_AMQP] = { "amqp", "broker connect attempt failed", "broker unavailable, retrying",
	                     "broker reconnected" },
};

/* One failed attempt on link k, for why. */
static void link_failed(struct worker *w, enum pool_link k, const char *why)
{
	struct link_log *l = &w->link[k];
	const struct cfg *c = w->conf;

	l->attempts++;
	LOG(LOG_LEVEL_DEBUG, pool_links[k].attempt, WORKER_KV(w), LOG_I("attempt", l->attempts), LOG_S("error", why));
	if (l->down && strcmp(l->why, why) == 0)
		return;
	if (!l->down)
		l->since_ms = pool_now_ms();
	l->down = true;
	snprintf(l->why, sizeof l->why, "%s", why);
	LOG(LOG_LEVEL_WARN, pool_links[k].down, WORKER_KV(w),
	    LOG_S(pool_links[k].name, k == POOL_LINK_DB ? c->db.redacted : c->amqp.redacted), LOG_S("error", why));
}

static void link_up(struct worker *w, enum pool_link k)
{
	struct link_log *l = &w->link[k];

	if (l->down)
		LOG(LOG_LEVEL_INFO, pool_links[k].up, WORKER_KV(w), LOG_I("attempts", l->attempts),
		    LOG_I("down_ms", pool_now_ms() - l->since_ms));
	l->down = false;
	l->attempts = 0;
	l->ever_up = true;
}

int pool_db_open(struct db **out, const struct cfg_db *c)
{
	char why[POOL_WHY_MAX];
	int rc = db_open_why(out, c, why, sizeof why);

	if (rc == ST_ERR_ACCESS)
		log_refused("db", c->user, c->redacted, why);
	else if (rc != ST_OK)
		LOG(LOG_LEVEL_ERROR, "cannot connect to the database", LOG_S("link", "db"), LOG_S("user", c->user),
		    LOG_S("db", c->redacted), LOG_S("error", why));
	return rc;
}

/* A refusal that ends the process (a wrong setting, not a passing fault):
 * the first thread that meets one logs it, every thread stops. */
static int worker_refused(struct worker *w, enum pool_link k, const char *what, const char *why, int rc)
{
	const struct cfg *c = w->conf;
	bool db = k == POOL_LINK_DB;

	if (!atomic_exchange(&w->shared->refused, true)) {
		if (what == NULL)
			log_refused(pool_links[k].name, db ? c->db.user : c->amqp.user,
			            db ? c->db.redacted : c->amqp.redacted, why);
		else
			LOG(LOG_LEVEL_ERROR, what, LOG_S("link", pool_links[k].name),
			    LOG_S("user", db ? c->db.user : c->amqp.user),
			    LOG_S(pool_links[k].name, db ? c->db.redacted : c->amqp.redacted), LOG_S("error", why));
	}
	atomic_store(&w->exit_code, 1);
	atomic_store(&pool_stop, true);
	return rc;
}

/* Connect (or reconnect) the database side until it works or we stop.
 * ST_ERR_ACCESS (logged, the pool stopping) when the server refuses the
 * account before this thread ever connected; another error when the
 * schema is not usable. */
static int worker_db_up(struct worker *w)
{
	char why[POOL_WHY_MAX];

	while (!atomic_load(&pool_stop)) {
		int rc;

		if (w->db != NULL && db_connected(w->db))
			return ST_OK;
		if (w->db != NULL) {
			rc = db_reconnect(w->db);
			if (rc != ST_OK)
				snprintf(why, sizeof why, "%u %s", db_errno(w->db), db_errmsg(w->db));
		} else {
			rc = db_open_from_why(&w->db, &w->conf->db, &w->db_node, why, sizeof why);
			if (rc == ST_OK)
				rc = inbox_open(&w->inbox, w->db, w->conf);
			if (rc == ST_OK)
				rc = outbox_open(&w->outbox, w->db, w->conf);
			if (rc != ST_OK && w->db != NULL && rc != ST_ERR_DB_CONN) {
				/* A prepare failing means the schema is missing or
				 * wrong, or a grant: waiting will not fix it. */
				char err[POOL_WHY_MAX];
				snprintf(err, sizeof err, "%u %s", db_errno(w->db), db_errmsg(w->db));
				worker_close_db(w);
				return worker_refused(w, POOL_LINK_DB, "database not usable: run `inbox-worker migrate`"
				                      " (a table or procedure is missing), or grant the account what it lacks",
				                      err, rc);
			}
			if (rc != ST_OK && w->db != NULL) {
				snprintf(why, sizeof why, "%u %s", db_errno(w->db), db_errmsg(w->db));
				/* The node took the connection but not the
				 * statements (a Galera node answering 1047):
				 * start from the next node of the list. */
				w->db_node++;
			}
			if (rc != ST_OK) {
				worker_close_db(w);
			}
		}
		if (rc == ST_OK) {
			if (w->link[POOL_LINK_DB].ever_up)
				metrics_reconnect(METRICS_PEER_DB);
			link_up(w, POOL_LINK_DB);
			return ST_OK;
		}
		if (rc == ST_ERR_ACCESS && !w->link[POOL_LINK_DB].ever_up)
			return worker_refused(w, POOL_LINK_DB, NULL, why, rc);
		worker_ready(w, false);
		link_failed(w, POOL_LINK_DB, why);
		/* The thread may hold deliveries (and has prefetched more):
		 * keep its broker connection alive meanwhile. */
		worker_wait(w, pool_backoff_ms(w, w->link[POOL_LINK_DB].attempts - 1, 200));
	}
	return ST_ERR_STOPPED;
}

/* basic.consume on every queue of the thread.  The thread's prefetch is
 * shared among its consumers (the broker counts it per consumer), so a
 * thread holds about INBOX_PREFETCH unacked deliveries however many shards
 * it consumes. */
static int worker_consume(struct worker *w)
{
	int per = (w->conf->prefetch + w->nshards - 1) / w->nshards;
	bool sharded = w->conf->ordering == CFG_ORDERING_SHARDED;

	for (int i = 0; i < w->nshards; i++) {
		char queue[300];
		int rc;

		if (mq_consume_queue_name(w->conf, w->shard[i], queue, sizeof queue) != 0)
			return ST_ERR_INVALID;
		rc = mq_consume_start(w->consumer, queue, per, sharded);
		if (rc != ST_OK)
			return rc;
		LOG(LOG_LEVEL_INFO, "consuming", WORKER_KV(w), LOG_S("queue", queue), LOG_I("prefetch", per));
	}
	return ST_OK;
}

static int worker_mq_up(struct worker *w)
{
	char why[POOL_WHY_MAX];

	while (!atomic_load(&pool_stop)) {
		int rc;

		if (w->consumer != NULL)
			return ST_OK;
		w->ack_pending = 0; /* delivery tags belong to the channel that is gone */
		rc = mq_open_from_why(&w->consumer, &w->conf->amqp, w->conf->heartbeat_s, w->name, &w->consumer_node, why,
		                      sizeof why);
		if (rc == ST_OK)
			rc = mq_declare_topology(w->consumer, w->conf);
		if (rc == ST_OK)
			rc = worker_consume(w);
		if (rc == ST_OK) {
			if (w->link[POOL_LINK_AMQP].ever_up)
				metrics_reconnect(METRICS_PEER_AMQP);
			link_up(w, POOL_LINK_AMQP);
			w->consumed_once = true;
			return ST_OK;
		}
		if (w->consumer != NULL) {
			snprintf(why, sizeof why, "%s", mq_errmsg(w->consumer));
			mq_close(&w->consumer);
		} else {
			w->consumer_node++; /* the next tour starts at the next node */
		}
		if (rc == ST_ERR_ACCESS && !w->link[POOL_LINK_AMQP].ever_up)
			return worker_refused(w, POOL_LINK_AMQP, NULL, why, rc);
		if (rc == ST_ERR_MQ && !w->consumed_once) {
			/* The broker refused a declaration (a queue that exists
			 * with other arguments, an exchange type it lacks).  At
			 * start-up that is a configuration error: retrying will
			 * not help.  Once the thread has consumed, someone
			 * changed the broker under us (a queue deleted and not
			 * yet declarable, a limit): keep trying, not ready, and
			 * say why (link_failed). */
			return worker_refused(w, POOL_LINK_AMQP, "broker refused the topology", why, rc);
		}
		worker_ready(w, false);
		link_failed(w, POOL_LINK_AMQP, why);
		pool_sleep_ms(pool_backoff_ms(w, w->link[POOL_LINK_AMQP].attempts - 1, 200));
	}
	return ST_ERR_STOPPED;
}

/* Publish one message on the thread's publisher, reconnecting once if the
 * connection went idle and died meanwhile (or the broker closed its
 * channel). */
static int worker_publish(struct worker *w, const struct mq_message *m)
{
	int rc = ST_ERR_MQ_CONN;

	for (int attempt = 0; attempt < 2; attempt++) {
		if (w->publisher == NULL) {
			/* Heartbeats off: the publisher sits idle between
			 * dead-letters and nothing would service them. */
			rc = mq_open_from(&w->publisher, &w->conf->amqp, 0, w->name, &w->publisher_node);
			if (rc != ST_OK)
				return rc;
		}
		rc = mq_publish_confirmed(w->publisher, m, POOL_CONFIRM_TIMEOUT_MS);
		if (rc == ST_OK || rc == ST_ERR_MQ_NACK)
			return rc;
		mq_close(&w->publisher);
		w->publisher_node++;
	}
	return rc;
}

/* Relay rounds while they come back full.  Each row is settled on its own
 * (common/outbox.c): a row the broker returns or refuses is pushed back by
 * its own backoff and logged there, so a round only fails for the broker
 * connection or the database as a whole. */
static void worker_relay(struct worker *w)
{
	for (int round = 0; round < 100 && !atomic_load(&pool_stop); round++) {
		struct outbox_round r;
		int rc;

		if (w->publisher == NULL) {
			char why[POOL_WHY_MAX];

			rc = mq_open_from_why(&w->publisher, &w->conf->amqp, 0, w->name, &w->publisher_node, why, sizeof why);
			if (rc == ST_ERR_ACCESS && !w->link[POOL_LINK_AMQP].ever_up) {
				(void)worker_refused(w, POOL_LINK_AMQP, NULL, why, rc);
				return;
			}
			if (rc != ST_OK) {
				w->publisher_node++; /* the next tour starts at the next node */
				link_failed(w, POOL_LINK_AMQP, why);
				return; /* the janitor comes back within POOL_RELAY_IDLE_MS */
			}
			link_up(w, POOL_LINK_AMQP);
		}
		rc = outbox_relay(w->outbox, w->publisher, 64, &r);
		metrics_outbox_failed(r.failed);
		if (rc != ST_OK) {
			bool broker = rc == ST_ERR_MQ_CONN || rc == ST_ERR_MQ || rc == ST_ERR_MQ_NACK;
			/* A refusal already charged to its row was logged with it. */
			LOG(r.failed > 0 ? LOG_LEVEL_DEBUG : LOG_LEVEL_WARN, "outbox relay interrupted; unconfirmed rows stay pending",
			    WORKER_KV(w), LOG_I("sent", r.sent),
			    LOG_S("error", broker ? mq_errmsg(w->publisher) : db_errmsg(w->db)));
			if (broker) {
				mq_close(&w->publisher);
				w->publisher_node++;
			}
			return;
		}
		if (r.taken < 64)
			return;
	}
}

/* Dead-letter a delivery directly (bad input, a conflict, retries run
 * out, a value the database refused): original body and properties plus
 * our headers, confirmed before the caller acks the original.
 *
 * Nothing about the message can make this fail: its properties always
 * serialise (mq_delivery_props_json escapes or drops what JSON cannot
 * carry, and the detail says so).  A nack, an unroutable return (the DLQ
 * unbound from the DLX) or a channel the broker closed (an exchange
 * missing) is the topology's fault: the message stays unacked and the
 * publish is retried with backoff until it is confirmed, without touching
 * the consumer channel.  Returns ST_OK; ST_ERR_STOPPED when asked to stop
 * meanwhile; ST_ERR_MQ_CONN when the broker cannot be reached even on a
 * fresh connection: that is a broker fault, the consumer connection is
 * most likely gone too, and the caller resets it (the message, unacked,
 * comes again). */
static int worker_dead_letter(struct worker *w, const struct mq_delivery *d, const char *rk,
                              const char *reason, const char *detail)
{
	char note[400], full[640], last[POOL_WHY_MAX] = "", at[32], deliveries[24];
	char *props = mq_delivery_props_json_note(d, note, sizeof note);
	/* When, and after how many deliveries: what `inbox-worker dlq list`
	 * shows (the quorum queue counts earlier deliveries). */
	struct mq_header h[4] = { { "x-inbox-reason", reason }, { "x-inbox-detail", full },
		                  { DLQ_HEADER_AT, at }, { DLQ_HEADER_DELIVERIES, deliveries } };
	struct mq_message m = {
		.exchange = w->conf->dlx, .routing_key = rk, .body = d->body, .len = d->len,
		.props_json = props, .headers = h, .nheaders = 4, .mandatory = true,
	};
	time_t now = time(NULL);
	struct tm tm;
	int rc;

	if (gmtime_r(&now, &tm) == NULL || strftime(at, sizeof at, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
		snprintf(at, sizeof at, "unknown");
	snprintf(deliveries, sizeof deliveries, "%lld", (long long)d->delivery_count + 1);
	if (props == NULL)
		snprintf(note, sizeof note, "not kept (out of memory)");
	snprintf(full, sizeof full, "%s%s%s", detail, note[0] ? "; properties: " : "", note);
	for (int attempt = 0;; attempt++) {
		char why[POOL_WHY_MAX];

		rc = worker_publish(w, &m);
		if (rc == ST_OK) {
			if (attempt > 0)
				LOG(LOG_LEVEL_INFO, "dead-letter publish recovered", WORKER_KV(w), LOG_S("reason", reason),
				    LOG_I("attempts", attempt + 1));
			break;
		}
		/* Logged when it starts failing and when the broker's answer
		 * changes, not on every retry (a DLQ unbound for minutes). */
		snprintf(why, sizeof why, "%s: %s", st_strerror(rc), w->publisher != NULL ? mq_errmsg(w->publisher) : "");
		LOG(attempt == 0 || strcmp(why, last) != 0 ? LOG_LEVEL_WARN : LOG_LEVEL_DEBUG,
		    "dead-letter publish failed; message kept, retrying", WORKER_KV(w), LOG_S("reason", reason),
		    LOG_S("error", why), LOG_I("attempt", attempt + 1));
		snprintf(last, sizeof last, "%s", why);
		if (rc == ST_ERR_MQ_CONN)
			break;
		if (atomic_load(&pool_stop)) {
			rc = ST_ERR_STOPPED;
			break;
		}
		worker_wait(w, pool_backoff_ms(w, attempt, 200));
	}
	free(props);
	return rc;
}

static char *worker_props_json(const void *arg)
{
	return mq_delivery_props_json(arg);
}

/* One delivery of a batch and what became of it. */
struct item {
	struct mq_delivery d;
	struct msg m;
	enum msg_reason reason;     /* why it was dead-lettered (NONE: it was not) */
	bool valid;                 /* passed the checks: went to the transaction */
	struct inbox_result res;
	bool done;                  /* settled: ack it */
};

static const char *item_rk(const struct item *it)
{
	return it->d.routing_key[0] ? it->d.routing_key : "order.unknown";
}

/* Run the transaction over the valid items of a batch, retrying the whole
 * batch on deadlock and lock wait time-out.  Returns ST_OK when committed;
 * ST_ERR_DB_DEADLOCK when retries ran out; ST_ERR_DB_DATA when the database
 * refused a value of one of the messages; ST_ERR_FAULT when the test hook
 * fired; ST_ERR_STOPPED when asked to stop while waiting.  Any other fault
 * (connection lost, a missing table, a statement the server refuses) is
 * not the messages': they are kept and the batch is run again after a
 * backoff, as during a database outage. */
static int worker_transact(struct worker *w, struct item **v, int n)
{
	int attempt = 0, outage = 0;
	char last[POOL_WHY_MAX] = "";

	for (;;) {
		int rc = worker_db_up(w);
		int i;

		if (rc != ST_OK)
			return rc;
		for (i = 0; i < n; i++)
			w->ins[i] = (struct inbox_in){
				.msg = &v[i]->m, .body = v[i]->d.body, .len = v[i]->d.len, .routing_key = item_rk(v[i]),
				.props_json = worker_props_json, .props_arg = &v[i]->d,
				.published_us = v[i]->d.published_us,
			};
		rc = inbox_run(w->inbox, w->ins, n, w->res);
		for (i = 0; rc == ST_OK && i < n; i++)
			v[i]->res = w->res[i];
		if (rc == ST_OK && outage > 0)
			LOG(LOG_LEVEL_INFO, "transaction recovered", WORKER_KV(w), LOG_I("messages", n), LOG_I("attempts", outage + 1));
		if (rc == ST_OK || rc == ST_ERR_FAULT)
			return rc;
		if (rc == ST_ERR_DB_DEADLOCK || rc == ST_ERR_DB_LOCK_TIMEOUT) {
			if (attempt >= w->conf->max_retries)
				return ST_ERR_DB_DEADLOCK;
			metrics_db_retry(); /* counted when it is retried, not when it gives up */
			LOG(LOG_LEVEL_DEBUG, "transaction retry", WORKER_KV(w), LOG_I("messages", n),
			    LOG_S("error", st_strerror(rc)), LOG_I("attempt", attempt + 1));
			worker_wait(w, pool_backoff_ms(w, attempt++, 10));
			continue;
		}
		if (rc == ST_ERR_DB_DATA) {
			LOG(LOG_LEVEL_WARN, "database refused a value", WORKER_KV(w), LOG_I("messages", n),
			    LOG_S("error", db_errmsg(w->db)));
			return rc;
		}
		if (rc == ST_ERR_DB_CONN) {
			/* Not the messages' fault: keep them and wait for the
			 * database (worker_db_up reconnects with backoff). */
			LOG(LOG_LEVEL_WARN, "database connection lost; messages kept", WORKER_KV(w),
			    LOG_I("messages", n));
			worker_ready(w, false);
			continue;
		}
		/* A missing table, a privilege, a full disk...: the database's
		 * fault, not the messages' nor the broker's.  Keep the batch
		 * and the channel; try again later. */
		{
			/* Once when it starts and when the error changes, not
			 * on every retry (a missing table can last). */
			const char *why = w->db ? db_errmsg(w->db) : st_strerror(rc);

			LOG(outage == 0 || strcmp(why, last) != 0 ? LOG_LEVEL_ERROR : LOG_LEVEL_DEBUG,
			    "transaction failed; messages kept, retrying", WORKER_KV(w), LOG_I("messages", n),
			    LOG_S("error", why), LOG_I("attempt", outage + 1));
			snprintf(last, sizeof last, "%s", why);
		}
		metrics_thread_ready(w->index, false);
		if (atomic_load(&pool_stop))
			return ST_ERR_STOPPED;
		worker_wait(w, pool_backoff_ms(w, outage++, 200));
	}
}

/* The server's message for a value it refused, as one ASCII line (it
 * may quote the value). */
static void worker_db_detail(struct worker *w, char *buf, size_t cap)
{
	int n = snprintf(buf, cap, "the database refused a value: %s", db_errmsg(w->db));

	for (int i = 0; i < n && (size_t)i < cap && buf[i] != '\0'; i++)
		if ((unsigned char)buf[i] < 0x20 || (unsigned char)buf[i] > 0x7e)
			buf[i] = '?';
}

/* Settle the valid items: one transaction for all, or, when that cannot
 * commit (retries exhausted, an unexpected error), one transaction each so
 * that one bad apple does not hold the others back. */
static int worker_settle(struct worker *w, struct item **v, int n)
{
	int rc = worker_transact(w, v, n);

	if (rc == ST_OK) {
		for (int i = 0; i < n; i++)
			v[i]->done = true;
		return ST_OK;
	}
	if (rc == ST_ERR_FAULT) {
		/* Test hook: behave as if the process had failed before the
		 * commit; the broker gets the messages back. */
		for (int i = 0; i < n; i++)
			if (mq_reject(w->consumer, v[i]->d.tag, true) != ST_OK)
				return ST_ERR_MQ_CONN;
		return ST_OK;
	}
	if (n > 1 && rc != ST_ERR_STOPPED) {
		for (int i = 0; i < n; i++) {
			rc = worker_settle(w, &v[i], 1);
			if (rc != ST_OK)
				return rc;
		}
		return ST_OK;
	}
	if (rc == ST_ERR_DB_DEADLOCK || rc == ST_ERR_DB_DATA) {
		char detail[300];
		enum msg_reason reason = rc == ST_ERR_DB_DATA ? MSG_REASON_UNPROCESSABLE : MSG_REASON_RETRIES_EXHAUSTED;

		if (rc == ST_ERR_DB_DATA)
			worker_db_detail(w, detail, sizeof detail);
		else
			snprintf(detail, sizeof detail, "deadlock or lock wait timeout after %d retries",
			         w->conf->max_retries);
		rc = worker_dead_letter(w, &v[0]->d, item_rk(v[0]), msg_reason_name(reason), detail);
		if (rc != ST_OK)
			return rc;
		v[0]->reason = reason;
		v[0]->done = true;
		/* for the "handled" line worker_handle writes */
		snprintf(v[0]->m.detail, sizeof v[0]->m.detail, "%.*s", (int)sizeof v[0]->m.detail - 1, detail);
		return ST_OK;
	}
	return rc;
}

/* A batch left half settled (asked to stop, or the broker gone): ack what
 * is settled, one by one (a cumulative ack must not reach past the rest),
 * so that nothing already dead-lettered comes back to be dead-lettered
 * twice.  Best effort: a dead consumer connection acks nothing. */
static void worker_ack_settled(struct worker *w, struct item *items, int n)
{
	if (w->consumer == NULL || worker_ack_flush(w) != ST_OK)
		return;
	for (int i = 0; i < n; i++)
		if (items[i].done && mq_ack(w->consumer, items[i].d.tag, false) != ST_OK)
			return;
}

/* Count a committed message in /metrics: its own decision (a hold only as
 * a hold: it is counted in its outcome when it is settled), and every held
 * event its transaction released, in the outcome it got then. */
static void worker_count(const struct inbox_result *res)
{
	static const enum metrics_outcome as[INBOX_OUTCOME_COUNT] = {
		[INBOX_APPLIED] = METRICS_APPLIED, [INBOX_IGNORED] = METRICS_IGNORED,
		[INBOX_COMPENSATED] = METRICS_COMPENSATED, [INBOX_DUPLICATE] = METRICS_DUPLICATE,
	};

	switch (res->outcome) {
	case INBOX_HELD:
		metrics_held();
		break;
	case INBOX_DEAD_LETTERED:
		metrics_dead_letter(MSG_REASON_INVALID_TRANSITION, 1);
		break;
	case INBOX_CONFLICT: /* counted by the caller once its copy is confirmed */
	case INBOX_OUTCOME_COUNT:
		break;
	default:
		metrics_outcome(as[res->outcome], 1);
		break;
	}
	metrics_released(res->released);
	metrics_outcome(METRICS_APPLIED, res->released_as[INBOX_APPLIED]);
	metrics_outcome(METRICS_IGNORED, res->released_as[INBOX_IGNORED]);
	metrics_outcome(METRICS_COMPENSATED, res->released_as[INBOX_COMPENSATED]);
	/* the dead-lettered ones (released_as[INBOX_DEAD_LETTERED]) by reason */
	for (int r = 1; r < MSG_REASON_COUNT; r++)
		metrics_dead_letter((enum msg_reason)r, res->released_reason[r]);
}

/* Handle a batch of deliveries.  Returns ST_OK when every delivery was
 * acked (or handed back); ST_ERR_STOPPED when asked to stop while a fault
 * that is not the messages' kept some (they stay unacked); or a broker
 * connection error, of the consumer or of the publisher on a fresh
 * connection (then the caller drops the consumer connection so the broker
 * redelivers what is unacked).  Nothing about one message makes it
 * return an error: each ends acked, in the database or in the DLQ. */
static int worker_handle(struct worker *w, struct item *items, int n)
{
	/* n <= conf->batch <= CFG_BATCH_MAX (cfg refuses more) */
	struct item *valid[CFG_BATCH_MAX];
	double t0 = pool_now_s();
	int nvalid = 0, rc, outbox_rows = 0;
	bool all_done;

	for (int i = 0; i < n; i++) {
		struct item *it = &items[i];
		struct msg_props props = it->d.props;

		it->done = false;
		it->valid = false;
		memset(&it->res, 0, sizeof it->res); /* a dead-lettered one has no transaction's result */
		if (it->d.redelivered)
			metrics_redelivered();
		it->reason = msg_parse(it->d.body, it->d.len, (size_t)w->conf->max_body, &props, &it->m);
		if (it->reason == MSG_REASON_NONE && !it->d.routing_key_valid) {
			/* It would be stored with a held event or a dead-letter
			 * row, whose utf8mb4 column refuses it: say so now, the
			 * same whatever the order of arrival. */
			it->reason = MSG_REASON_INVALID_FIELD;
			snprintf(it->m.detail, sizeof it->m.detail,
			         "routing key is not valid UTF-8 or holds a NUL byte");
		}
		if (it->reason == MSG_REASON_NONE) {
			it->valid = true;
			valid[nvalid++] = it;
			continue;
		}
		if (it->m.message_id[0] == '\0' && it->d.props.message_id != NULL) {
			/* For the log line: the body did not yield an id, the
			 * property may (the logger escapes what it prints). */
			size_t len = it->d.props.message_id_len < MSG_ID_MAX ? it->d.props.message_id_len : MSG_ID_MAX;
			memcpy(it->m.message_id, it->d.props.message_id, len);
			it->m.message_id[len] = '\0';
		}
		rc = worker_dead_letter(w, &it->d, item_rk(it), msg_reason_name(it->reason), it->m.detail);
		if (rc != ST_OK) {
			worker_ack_settled(w, items, n);
			return rc;
		}
		/* the same line as a dead letter of the transaction's (below);
		 * order and type only when the body yielded them */
		if (it->m.order_id[0] != '\0' && it->m.type_name[0] != '\0')
			LOG(LOG_LEVEL_WARN, "handled", WORKER_KV(w), LOG_S("message_id", it->m.message_id),
			    LOG_S("order", it->m.order_id), LOG_S("type", it->m.type_name),
			    LOG_S("outcome", "dead_lettered"), LOG_S("reason", msg_reason_name(it->reason)),
			    LOG_S("detail", it->m.detail));
		else
			LOG(LOG_LEVEL_WARN, "handled", WORKER_KV(w), LOG_S("message_id", it->m.message_id),
			    LOG_S("outcome", "dead_lettered"), LOG_S("reason", msg_reason_name(it->reason)),
			    LOG_S("detail", it->m.detail));
		it->done = true;
	}
	if (nvalid > 0) {
		rc = worker_settle(w, valid, nvalid);
		if (rc != ST_OK) {
			worker_ack_settled(w, items, n);
			return rc;
		}
	}

	for (int i = 0; i < nvalid; i++) {
		struct item *it = valid[i];
		/* The outcome is one of SPEC.md's outcome names; a dead
		 * letter also says why, in x-inbox-reason's words. */
		const char *outcome = "dead_lettered";
		const char *reason = NULL;
		char detail[320] = "";

		if (!it->done)
			continue; /* handed back by the fault hook */
		if (it->reason != MSG_REASON_NONE) {
			/* retries-exhausted, unprocessable: no transaction
			 * committed, so nothing was released either */
			metrics_dead_letter(it->reason, 1);
			reason = msg_reason_name(it->reason);
			snprintf(detail, sizeof detail, "%s", it->m.detail);
		} else if (it->res.outcome == INBOX_CONFLICT) {
			snprintf(detail, sizeof detail, "message %s from '%s' arrived again with a different payload",
			         it->m.message_id, it->m.source);
			rc = worker_dead_letter(w, &it->d, item_rk(it), "payload-conflict", detail);
			if (rc != ST_OK) {
				it->done = false; /* not in the DLQ yet: must come again */
				worker_ack_settled(w, items, n);
				return rc;
			}
			metrics_dead_letter(MSG_REASON_PAYLOAD_CONFLICT, 1);
			reason = "payload-conflict";
		} else {
			worker_count(&it->res);
			outcome = inbox_outcome_name(it->res.outcome);
			if (it->res.outcome == INBOX_DEAD_LETTERED) {
				/* its dead-letter copy is in the outbox */
				reason = msg_reason_name(MSG_REASON_INVALID_TRANSITION);
				snprintf(detail, sizeof detail, "%s not allowed on an order in state %s",
				         it->m.type_name, order_state_name(it->res.state));
			}
		}
		outbox_rows += it->res.outbox_rows;
		if (reason != NULL)
			LOG(LOG_LEVEL_WARN, "handled", WORKER_KV(w), LOG_S("message_id", it->m.message_id),
			    LOG_S("order", it->m.order_id), LOG_S("type", it->m.type_name),
			    LOG_S("outcome", outcome), LOG_S("reason", reason),
			    LOG_S("detail", detail[0] != '\0' ? detail : NULL), LOG_I("released", it->res.released));
		else
			LOG(LOG_LEVEL_DEBUG, "handled", WORKER_KV(w), LOG_S("message_id", it->m.message_id),
			    LOG_S("order", it->m.order_id), LOG_S("type", it->m.type_name),
			    LOG_S("outcome", outcome), LOG_I("released", it->res.released));
	}
	if (fault_hit("after-commit")) {
		/* Test hook: die between the commit and the ack, as a SIGKILL
		 * would; the redelivery must be recognised as a duplicate. */
		raise(SIGKILL);
	}
	all_done = true;
	for (int i = 0; i < n; i++)
		all_done = all_done && items[i].done;
	if (!all_done) {
		/* Some were handed back (the fault hook rejected them): a
		 * cumulative ack must not reach past them, so ack one by one. */
		rc = worker_ack_flush(w);
		if (rc != ST_OK)
			return rc;
	}
	for (int i = 0; i < n; i++) {
		if (!items[i].done)
			continue;
		if (!items[i].valid)
			metrics_dead_letter(items[i].reason, 1); /* the valid ones are counted above */
		metrics_processing_seconds(pool_now_s() - t0);
		if (all_done) {
			w->ack_tag = items[i].d.tag;
			w->ack_pending++;
			continue;
		}
		rc = mq_ack(w->consumer, items[i].d.tag, false);
		if (rc != ST_OK)
			return rc;
	}
	if (outbox_rows > 0 && pthread_mutex_lock(&w->shared->mu) == 0) {
		w->shared->pending = true;
		pthread_cond_signal(&w->shared->cv);
		pthread_mutex_unlock(&w->shared->mu);
	}
	return ST_OK;
}

/* A retention pass of the janitor, spread over ticks. */
struct janitor_pass {
	bool due;               /* a pass is under way */
	int64_t next_pass_ms;   /* when the next pass starts */
	int64_t next_tick_ms;
	int64_t started_ms;
	uint64_t deleted;       /* in this pass so far */
	int ticks;
};

/* One tick of retention cleanup when one is due (see POOL_CLEANUP_TICK_MS).
 * A pass starts cleanup_interval after the previous one ended and ticks on
 * until it has caught up; it ends early, and says so, when another process
 * holds the cleanup lock: that process is doing the work. */
static void janitor_retention(struct worker *w, struct janitor_pass *p, int64_t now)
{
	static const struct retention_limits lim = {
		.slice_rows = RETENTION_SLICE_ROWS,
		.max_slices = RETENTION_TICK_SLICES,
		.budget_ms = POOL_CLEANUP_BUDGET_MS,
		.lock_wait_s = 0,
		.retries = 0, /* a conflicting slice waits for the next tick */
	};
	enum retention_state state;
	uint64_t n = 0;
	int rc;

	if (!p->due) {
		if (now < p->next_pass_ms)
			return;
		p->due = true;
		p->started_ms = now;
		p->next_tick_ms = now;
		p->deleted = 0;
		p->ticks = 0;
	}
	if (now < p->next_tick_ms)
		return;
	if (w->retention == NULL) {
		rc = retention_open(&w->retention, w->db, w->conf);
		if (rc != ST_OK) {
			LOG(LOG_LEVEL_WARN, "retention cleanup cannot prepare its statements", LOG_S("error", db_errmsg(w->db)));
			p->next_tick_ms = now + POOL_CLEANUP_TICK_MS;
			return;
		}
	}
	rc = retention_run(w->retention, &lim, &state, &n);
	p->deleted += n;
	p->ticks++;
	now = pool_now_ms();
	p->next_tick_ms = now + POOL_CLEANUP_TICK_MS;
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_WARN, "retention cleanup tick failed; next tick goes on", LOG_S("error", db_errmsg(w->db)));
		return;
	}
	if (state == RETENTION_MORE)
		return;
	p->due = false;
	p->next_pass_ms = now + w->conf->cleanup_interval_s * 1000;
	if (state == RETENTION_BUSY)
		LOG0(LOG_LEVEL_INFO, "retention cleanup skipped: another process holds the cleanup lock");
	else if (p->deleted > 0)
		LOG(LOG_LEVEL_INFO, "retention cleanup", LOG_I("deleted", p->deleted), LOG_I("ticks", p->ticks),
		    LOG_I("ms", now - p->started_ms), LOG_I("retention_s", w->conf->retention_s));
}

/* The DLQ's depth for /metrics, a passive declare on a connection of its
 * own: on the publisher it would interleave with the relay's confirms and
 * returns (seen: a relay round then timed out waiting for its confirms
 * and published a row twice).  A missing queue closes the channel: the
 * probe is opened again next time, and the gauge says nothing meanwhile. */
static void janitor_dlq_depth(struct worker *w)
{
	uint32_t depth = 0;

	if (w->probe == NULL && mq_open(&w->probe, &w->conf->amqp, 0, w->name) != ST_OK) {
		metrics_dlq_depth(-1);
		return;
	}
	if (mq_queue_counts(w->probe, w->conf->dlq, &depth, NULL) == ST_OK) {
		metrics_dlq_depth(depth);
		return;
	}
	metrics_dlq_depth(-1);
	mq_close(&w->probe);
}

/*
 * The janitor: one thread per process that publishes the outbox (woken by
 * the workers, and every POOL_RELAY_IDLE_MS for rows left by a crashed
 * process), expires holds, updates the outbox gauge and cleans up past the
 * retention window.  It has its own database and publisher connections, so
 * consuming threads never wait for a publisher confirm of the outbox.
 */
static void *janitor_main(void *arg)
{
	struct worker *w = arg;
	int64_t last_housekeeping = 0, last_relay = 0;
	bool gauge_warned = false;
	struct janitor_pass pass = { .next_pass_ms = pool_now_ms() + w->conf->cleanup_interval_s * 1000 };

	db_thread_init();
	while (!atomic_load(&pool_stop)) {
		struct timespec until;
		int64_t now;
		int rc;

		if (clock_gettime(CLOCK_MONOTONIC, &until) == 0) {
			until.tv_nsec += POOL_RELAY_IDLE_MS * 1000000L;
			until.tv_sec += until.tv_nsec / 1000000000L;
			until.tv_nsec %= 1000000000L;
		}
		if (pthread_mutex_lock(&w->shared->mu) == 0) {
			while (!w->shared->pending && !atomic_load(&pool_stop))
				if (pthread_cond_timedwait(&w->shared->cv, &w->shared->mu, &until) != 0)
					break; /* time-out: relay anyway */
			w->shared->pending = false;
			pthread_mutex_unlock(&w->shared->mu);
		}
		now = pool_now_ms();
		if (now - last_relay < POOL_RELAY_MIN_GAP_MS)
			pool_sleep_ms((int)(POOL_RELAY_MIN_GAP_MS - (now - last_relay)));
		rc = worker_db_up(w);
		if (rc == ST_ERR_STOPPED)
			break;
		if (rc != ST_OK) {
			/* Refused (logged, the pool stopping) */
			atomic_store(&w->exit_code, 1);
			atomic_store(&pool_stop, true);
			break;
		}
		worker_relay(w);
		last_relay = now = pool_now_ms();
		if (now - last_housekeeping >= POOL_HOUSEKEEPING_MS) {
			int expired = 0;
			int64_t pending;
			double oldest;

			last_housekeeping = now;
			if (inbox_expire_holds(w->inbox, 64, &expired) != ST_OK)
				LOG(LOG_LEVEL_WARN, "hold expiry failed", LOG_S("error", db_errmsg(w->db)));
			/* counted even when the pass failed later: each one
			 * expired in a committed transaction of its own */
			metrics_dead_letter(MSG_REASON_HOLD_EXPIRED, expired);
			if (expired > 0)
				worker_relay(w);
			if (outbox_stats(w->outbox, &pending, &oldest) == ST_OK) {
				metrics_outbox_pending(pending);
				metrics_outbox_oldest_pending(oldest);
			}
			if (w->gauge == NULL && gauge_open(&w->gauge, w->db, w->conf) != ST_OK && !gauge_warned) {
				gauge_warned = true; /* once: it is retried every second */
				LOG(LOG_LEVEL_WARN, "held events gauge cannot prepare its statement", LOG_S("error", db_errmsg(w->db)));
			}
			if (w->gauge != NULL && gauge_held(w->gauge, &pending, &oldest) == ST_OK)
				metrics_held_now(pending, oldest);
			janitor_dlq_depth(w);
		}
		janitor_retention(w, &pass, now);
	}
	mq_close(&w->probe);
	mq_close(&w->publisher);
	worker_close_db(w);
	db_thread_end();
	return NULL;
}

static void worker_release(struct worker *w, int n)
{
	for (int i = 0; i < n; i++)
		mq_delivery_release(w->consumer, &w->items[i].d);
}

/* The broker cancelled one of the thread's consumers (its queue was
 * deleted, or its leader moved away): declare the topology again, which
 * re-creates a deleted queue, and consume from it on the same channel, so
 * the deliveries the thread holds from its other queues stay valid. */
static int worker_consume_again(struct worker *w)
{
	int rc;

	worker_ready(w, false);
	LOG(LOG_LEVEL_WARN, "consumer cancelled by the broker; consuming again", WORKER_KV(w),
	    LOG_S("error", mq_errmsg(w->consumer)));
	rc = worker_ack_flush(w);
	if (rc == ST_OK)
		rc = mq_declare_topology(w->consumer, w->conf);
	if (rc == ST_OK)
		rc = mq_consume_again(w->consumer);
	if (rc == ST_OK)
		LOG(LOG_LEVEL_INFO, "consuming again", WORKER_KV(w));
	return rc;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;

	db_thread_init();
	while (!atomic_load(&pool_stop)) {
		int n = 0;
		int rc = worker_db_up(w);

		if (rc == ST_OK)
			rc = worker_mq_up(w);
		if (rc == ST_ERR_STOPPED)
			break;
		if (rc != ST_OK) {
			atomic_store(&w->exit_code, 1);
			atomic_store(&pool_stop, true);
			break;
		}
		if (mq_cancelled(w->consumer) > 0 && worker_consume_again(w) != ST_OK)
			goto reset;
		worker_ready(w, true);
		rc = ST_ERR_TIMEOUT;
		/* Owe at most half the prefetch window, so the broker's
		 * next deliveries are on their way before the buffer runs dry. */
		if (w->ack_pending > 0 && 2 * w->ack_pending < w->conf->prefetch)
			rc = mq_consume(w->consumer, &w->items[0].d, 0);
		if (rc == ST_ERR_TIMEOUT) {
			/* Nothing more is here (or enough acks are owed): settle
			 * before waiting, so the broker can send more. */
			rc = worker_ack_flush(w);
			if (rc == ST_OK)
				rc = mq_consume(w->consumer, &w->items[0].d, POOL_CONSUME_TIMEOUT_MS);
		}
		if (rc == ST_ERR_TIMEOUT)
			continue;
		if (rc == ST_OK) {
			/* A batch is what is already here, never a wait for more:
			 * batching must not add latency when traffic is light. */
			for (n = 1; n < w->conf->batch; n++) {
				rc = mq_consume(w->consumer, &w->items[n].d, 0);
				if (rc != ST_OK)
					break;
			}
			if (rc == ST_ERR_TIMEOUT)
				rc = ST_OK;
			if (rc == ST_OK)
				rc = worker_handle(w, w->items, n);
			worker_release(w, n);
			if (rc == ST_OK)
				continue;
			if (rc == ST_ERR_STOPPED)
				break; /* what is unacked goes back when we close */
		}
		/* The broker connection failed (never one message: worker_handle
		 * settles each, in the database or in the DLQ, and waits out
		 * database and dead-letter faults itself): drop the consumer so
		 * the broker redelivers what we hold. */
reset:
		LOG(LOG_LEVEL_WARN, "broker connection reset", WORKER_KV(w),
		    LOG_S("error", w->consumer ? mq_errmsg(w->consumer) : st_strerror(rc)));
		worker_ready(w, false);
		if (w->consumer != NULL)
			(void)worker_ack_flush(w); /* earlier batches: settled; best effort */
		mq_close(&w->consumer);
		w->consumer_node++; /* a cluster's next node first (mq_open_from) */
		pool_sleep_ms(pool_backoff_ms(w, 0, 200));
	}
	worker_ready(w, false);
	if (w->consumer != NULL && worker_ack_flush(w) != ST_OK)
		LOG(LOG_LEVEL_WARN, "final ack failed; the broker redelivers, the inbox absorbs it", WORKER_KV(w));
	mq_close(&w->consumer);
	mq_close(&w->publisher);
	worker_close_db(w);
	db_thread_end();
	return NULL;
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
	int t = conf->threads, s = conf->shards;

	w->nshards = 0;
	w->shard_mask = 0;
	if (conf->ordering != CFG_ORDERING_SHARDED) {
		w->shard[w->nshards++] = 0;
		return;
	}
	if (t > s) {
		w->shard[w->nshards++] = w->index % s;
	} else {
		for (int k = w->index; k < s; k += t)
			w->shard[w->nshards++] = k;
	}
	for (int k = 0; k < w->nshards; k++)
		w->shard_mask |= (uint64_t)1 << w->shard[k];
}

int pool_main(const struct cfg *conf)
{
	struct worker *workers = NULL;
	struct pool_shared shared = { .pending = false };
	pthread_condattr_t ca;
	sigset_t set;
	int started = 0, code = 0;
	const int nthreads = conf->threads + 1; /* the workers and the janitor */

	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0) {
		LOG0(LOG_LEVEL_ERROR, "cannot block signals");
		return 1;
	}
	/* The janitor's timed wait runs on the monotonic clock: a wall clock
	 * step must not stall the outbox. */
	if (pthread_condattr_init(&ca) != 0 || pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) != 0 ||
	    pthread_cond_init(&shared.cv, &ca) != 0 || pthread_mutex_init(&shared.mu, NULL) != 0) {
		LOG0(LOG_LEVEL_ERROR, "cannot initialise the janitor's condition variable");
		return 1;
	}
	pthread_condattr_destroy(&ca);
	workers = calloc((size_t)nthreads, sizeof *workers);
	if (workers == NULL) {
		LOG0(LOG_LEVEL_ERROR, "out of memory");
		code = 1;
		goto done;
	}
	if (metrics_start(conf->metrics_addr) != 0) {
		code = 1;
		goto done;
	}
	metrics_set_threads(conf->threads);
	metrics_set_shards(conf->ordering == CFG_ORDERING_SHARDED ? conf->shards : 0);
	LOG(LOG_LEVEL_INFO, "starting", LOG_S("version", INBOX_VERSION), LOG_I("threads", conf->threads), LOG_S("amqp", conf->amqp.redacted),
	    LOG_S("db", conf->db.redacted), LOG_S("queue", conf->queue), LOG_S("consumer", conf->consumer));
	for (int i = 0; i < nthreads; i++) {
		struct worker *w = &workers[i];
		bool janitor = i == conf->threads;
		w->index = janitor ? -1 : i;
		w->conf = conf;
		w->shared = &shared;
		w->seed = (unsigned)time(NULL) ^ (unsigned)getpid() ^ (unsigned)(i * 2654435761u);
		snprintf(w->name, sizeof w->name, "inbox-worker pid=%d %s=%d", (int)getpid(),
		         janitor ? "janitor" : "thread", i);
		if (!janitor) {
			w->items = calloc((size_t)conf->batch, sizeof *w->items);
			w->ins = calloc((size_t)conf->batch, sizeof *w->ins);
			w->res = calloc((size_t)conf->batch, sizeof *w->res);
			pool_assign_shards(conf, w);
			if (w->items == NULL || w->ins == NULL || w->res == NULL) {
				LOG(LOG_LEVEL_ERROR, "cannot prepare worker thread", LOG_I("worker", i));
				atomic_store(&pool_stop, true);
				code = 1;
				break;
			}
		}
		if (pthread_create(&w->thread, NULL, janitor ? janitor_main : worker_main, w) != 0) {
			LOG(LOG_LEVEL_ERROR, "cannot start worker thread", LOG_I("worker", i));
			atomic_store(&pool_stop, true);
			code = 1;
			break;
		}
		started++;
	}
	/* The signal loop: the first signal asks for a graceful stop, the
	 * second ends the process now. */
	for (;;) {
		struct timespec ts = { .tv_sec = 0, .tv_nsec = 200 * 1000000L };
		int sig = sigtimedwait(&set, NULL, &ts);
		bool all_done = true;

		if (sig == SIGINT || sig == SIGTERM) {
			if (atomic_load(&pool_stop)) {
				LOG0(LOG_LEVEL_WARN, "second signal: exiting now");
				_exit(1);
			}
			LOG(LOG_LEVEL_INFO, "stopping: finishing messages in hand", LOG_S("signal", sig == SIGINT ? "SIGINT" : "SIGTERM"));
			atomic_store(&pool_stop, true);
		}
		for (int i = 0; i < started; i++)
			if (atomic_load(&workers[i].exit_code) != 0)
				atomic_store(&pool_stop, true);
		if (!atomic_load(&pool_stop))
			continue;
		for (int i = 0; i < started; i++) {
			if (workers[i].joined)
				continue;
			/* A joined thread must not be joined again. */
			if (pthread_tryjoin_np(workers[i].thread, NULL) == 0)
				workers[i].joined = true;
			else
				all_done = false;
		}
		if (all_done)
			break;
	}
	for (int i = 0; i < started; i++)
		if (atomic_load(&workers[i].exit_code) != 0)
			code = atomic_load(&workers[i].exit_code);
	metrics_stop();
	LOG(LOG_LEVEL_INFO, "stopped", LOG_I("applied", metrics_outcome_count(METRICS_APPLIED)),
	    LOG_I("redelivered", metrics_redelivered_count()),
	    LOG_I("held", metrics_held_count()), LOG_I("released", metrics_released_count()),
	    LOG_I("ignored", metrics_outcome_count(METRICS_IGNORED)),
	    LOG_I("compensated", metrics_outcome_count(METRICS_COMPENSATED)),
	    LOG_I("duplicates", metrics_outcome_count(METRICS_DUPLICATE)),
	    LOG_I("dead_lettered", metrics_outcome_count(METRICS_DEAD_LETTERED)));
done:
	/* The exit code is decided above; nothing reads workers after this. */
	if (workers != NULL)
		for (int i = 0; i < nthreads; i++) {
			free(workers[i].items);
			free(workers[i].ins);
			free(workers[i].res);
		}
	free(workers);
	pthread_cond_destroy(&shared.cv);
	pthread_mutex_destroy(&shared.mu);
	return code;
}

/* `inbox-worker cleanup`: slices until caught up, one process at a time.
 * It waits a moment for the lock, long enough for a janitor's tick to end,
 * so a cron job is not skipped because a pool happened to be mid-tick; a
 * real second cleanup holds it for longer, and then this one skips (exit 0:
 * the other run does the work). */
int cleanup_main(const struct cfg *conf)
{
	static const struct retention_limits lim = {
		.slice_rows = RETENTION_SLICE_ROWS,
		.max_slices = 0,
		.budget_ms = 0,
		.lock_wait_s = 1,
		.retries = 60, /* about a minute of conflicts in a row on one slice */
	};
	struct db *db = NULL;
	struct retention *ret = NULL;
	enum retention_state state = RETENTION_MORE;
	uint64_t deleted = 0;
	int rc;

	rc = pool_db_open(&db, &conf->db);
	if (rc != ST_OK)
		return 1; /* said */
	rc = retention_open(&ret, db, conf);
	if (rc == ST_OK)
		rc = retention_run(ret, &lim, &state, &deleted);
	if (rc == ST_OK && state == RETENTION_MORE)
		rc = ST_ERR_DB_LOCK_TIMEOUT; /* the retries ran out */
	if (rc != ST_OK)
		LOG(LOG_LEVEL_ERROR, "cleanup failed", LOG_I("deleted", deleted),
		    LOG_S("error", db ? db_errmsg(db) : st_strerror(rc)));
	else if (state == RETENTION_BUSY)
		LOG0(LOG_LEVEL_INFO, "cleanup skipped: another process holds the cleanup lock");
	else
		LOG(LOG_LEVEL_INFO, "cleanup done", LOG_I("deleted", deleted), LOG_I("retention_s", conf->retention_s));
	retention_close(&ret);
	db_close(&db);
	return rc == ST_OK ? 0 : 1;
}
