/*
 * janitor.c - the pool's housekeeping thread.
 *
 * One janitor per process publishes the outbox (woken by the workers, and
 * every JANITOR_RELAY_IDLE_MS for rows left by a crashed process), expires
 * holds, updates the outbox, held-events and DLQ gauges, and cleans up
 * past the retention window in ticks (janitor_retention).  It has its own
 * database and publisher connections, so consuming threads never wait for
 * a publisher confirm of the outbox.
 *
 * `inbox-worker cleanup` (cmd_cleanup.c) is the same retention run with
 * other limits: its wait for the cleanup lock outlasts one janitor tick
 * (RETENTION_CLEANUP_BUDGET_MS, retention.h), which the compiler checks there.
 */
#include "janitor.h"

#include <stdio.h>
#include <time.h>

#include "aggregate.h"
#include "db.h"
#include "gauge.h"
#include "inbox.h"
#include "metrics.h"
#include "mq.h"
#include "msg.h"
#include "outbox.h"
#include "retention.h"
#include "status.h"

#define JANITOR_HOUSEKEEPING_MS 1000  /* hold expiry and the gauges */
#define JANITOR_RELAY_IDLE_MS 250     /* relay rows of crashed peers at least this often */
/* At most this often the janitor relays: each round ends in a COMMIT, and
 * on a busy database a commit (its fsync) per emitted row would cost the
 * consuming threads more than the few milliseconds of latency saved. */
#define JANITOR_RELAY_MIN_GAP_MS 50
#define JANITOR_HOLDS_PER_PASS 64  /* held events expired a housekeeping pass, at most */
#define JANITOR_RELAY_ROUND 64     /* outbox rows a relay round takes, at most */

#define JANITOR_KV(j) POOL_KV(&(j)->t)

/* Relay rounds while they come back full.  Each row is settled on its own
 * (common/outbox.c): a row the broker returns or refuses is pushed back by
 * its own backoff and logged there, so a round only fails for the broker
 * connection or the database as a whole. */
static void janitor_relay(struct janitor *j)
{
	for (int round = 0; round < 100 && !atomic_load(&pool_stop); round++) {
		struct outbox_round r;
		int rc;

		if (j->publisher == NULL) {
			char why[POOL_WHY_MAX];

			/* Heartbeats on (serviced by janitor_keepalive between
			 * rounds): a dead link is found, not waited on. */
			rc = mq_open_from_why(&j->publisher, &j->t.conf->amqp, j->t.conf->heartbeat_s, j->t.name,
			                      &j->publisher_node, why, sizeof why);
			if (st_refusal(rc) && !j->t.link[POOL_LINK_AMQP].ever_up) {
				(void)pool_refused(&j->t, POOL_LINK_AMQP, NULL, why, rc);
				return;
			}
			if (rc != ST_OK) {
				j->publisher_node++; /* the next tour starts at the next node */
				pool_link_failed(&j->t, POOL_LINK_AMQP, why);
				return; /* the janitor comes back within JANITOR_RELAY_IDLE_MS */
			}
			pool_link_up(&j->t, POOL_LINK_AMQP);
		}
		rc = outbox_relay(j->d.outbox, j->publisher, JANITOR_RELAY_ROUND, &r);
		metrics_outbox_failed(r.failed);
		if (rc != ST_OK) {
			bool broker = rc == ST_ERR_MQ_CONN || rc == ST_ERR_MQ || rc == ST_ERR_MQ_NACK;
			/* A refusal already charged to its row was logged with it. */
			LOG(r.failed > 0 ? LOG_LEVEL_DEBUG : LOG_LEVEL_WARN, "outbox relay interrupted; unconfirmed rows stay pending",
			    JANITOR_KV(j), LOG_I("sent", r.sent),
			    LOG_S("error", broker ? mq_errmsg(j->publisher) : db_errmsg(j->d.db)));
			if (broker) {
				mq_drop(&j->publisher); /* its close could wait on a dead link */
				j->publisher_node++;
			}
			return;
		}
		if (r.taken < JANITOR_RELAY_ROUND)
			return;
	}
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

/* One tick of retention cleanup when one is due (see JANITOR_CLEANUP_TICK_MS).
 * A pass starts cleanup_interval after the previous one ended and ticks on
 * until it has caught up; it ends early, and says so, when another process
 * holds the cleanup lock: that process is doing the work. */
static void janitor_retention(struct janitor *j, struct janitor_pass *p, int64_t now)
{
	static const struct retention_limits lim = {
		.slice_rows = RETENTION_SLICE_ROWS,
		.max_slices = RETENTION_TICK_SLICES,
		.budget_ms = RETENTION_CLEANUP_BUDGET_MS,
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
	if (j->retention == NULL) {
		rc = retention_open(&j->retention, j->d.db, j->t.conf);
		if (rc != ST_OK) {
			LOG(LOG_LEVEL_WARN, "retention cleanup cannot prepare its statements", LOG_S("error", db_errmsg(j->d.db)));
			p->next_tick_ms = now + JANITOR_CLEANUP_TICK_MS;
			return;
		}
	}
	rc = retention_run(j->retention, &lim, &state, &n);
	p->deleted += n;
	p->ticks++;
	now = pool_now_ms();
	p->next_tick_ms = now + JANITOR_CLEANUP_TICK_MS;
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_WARN, "retention cleanup tick failed; next tick goes on", LOG_S("error", db_errmsg(j->d.db)));
		return;
	}
	if (state == RETENTION_MORE)
		return;
	p->due = false;
	p->next_pass_ms = now + j->t.conf->cleanup_interval_s * 1000;
	if (state == RETENTION_BUSY)
		LOG0(LOG_LEVEL_INFO, "retention cleanup skipped: another process holds the cleanup lock");
	else if (p->deleted > 0)
		LOG(LOG_LEVEL_INFO, "retention cleanup", LOG_I("deleted", p->deleted), LOG_I("ticks", p->ticks),
		    LOG_I("ms", now - p->started_ms), LOG_I("retention_s", j->t.conf->retention_s));
}

/* The DLQ's depth for /metrics, a passive declare on a connection of its
 * own: on the publisher it would interleave with the relay's confirms and
 * returns (seen: a relay round then timed out waiting for its confirms
 * and published a row twice).  A missing queue closes the channel: the
 * probe is opened again next time, and the gauge says nothing meanwhile. */
static void janitor_dlq_depth(struct janitor *j)
{
	uint32_t depth = 0;

	/* The relay's step before this one may have spent a connect's bound
	 * on a dead link: that was progress, and so is each bounded step. */
	pool_beat();
	/* Heartbeats on: the passive declare every second services them, and
	 * the declare itself is bounded (mq.h, mq_link_bound_s). */
	if (j->probe == NULL && mq_open(&j->probe, &j->t.conf->amqp, j->t.conf->heartbeat_s, j->t.name) != ST_OK) {
		metrics_dlq_depth(-1);
		return;
	}
	if (mq_queue_counts(j->probe, j->t.conf->dlq, &depth, NULL) == ST_OK) {
		metrics_dlq_depth(depth);
		return;
	}
	metrics_dlq_depth(-1);
	mq_drop(&j->probe); /* a missing queue closed the channel, or the link is lost */
}

/* Wait for a worker's wake-up (outbox rows committed), at most
 * JANITOR_RELAY_IDLE_MS: rows a crashed process left behind go out too. */
static void janitor_wait_for_work(struct janitor *j)
{
	struct pool_shared *s = j->t.shared;
	struct timespec until;

	if (clock_gettime(CLOCK_MONOTONIC, &until) == 0) {
		until.tv_nsec += JANITOR_RELAY_IDLE_MS * 1000000L;
		until.tv_sec += until.tv_nsec / 1000000000L;
		until.tv_nsec %= 1000000000L;
	}
	if (pthread_mutex_lock(&s->mu) == 0) {
		while (!s->pending && !atomic_load(&pool_stop))
			if (pthread_cond_timedwait(&s->cv, &s->mu, &until) != 0)
				break; /* time-out: relay anyway */
		s->pending = false;
		pthread_mutex_unlock(&s->mu);
	}
}

/* Once a JANITOR_HOUSEKEEPING_MS: hold expiry (and the relay of the
 * dead-letter copies it wrote), the outbox and held-events gauges, the
 * DLQ's depth. */
static void janitor_housekeeping(struct janitor *j)
{
	int expired = 0;
	int64_t pending;
	double oldest;

	if (inbox_expire_holds(j->d.inbox, JANITOR_HOLDS_PER_PASS, &expired) != ST_OK)
		LOG(LOG_LEVEL_WARN, "hold expiry failed", LOG_S("error", db_errmsg(j->d.db)));
	/* 0 when the pass failed: it is one transaction (issue 43), and
	 * nothing of it was committed */
	metrics_dead_letter(lc_sequenced(agg_current()->def) ? MSG_REASON_SEQUENCE_GAP : MSG_REASON_HOLD_EXPIRED,
	                    expired);
	if (expired > 0)
		janitor_relay(j);
	if (outbox_stats(j->d.outbox, &pending, &oldest) == ST_OK) {
		metrics_outbox_pending(pending);
		metrics_outbox_oldest_pending(oldest);
	}
	if (j->gauge == NULL && gauge_open(&j->gauge, j->d.db, j->t.conf) != ST_OK && !j->gauge_warned) {
		j->gauge_warned = true; /* once: it is retried every second */
		LOG(LOG_LEVEL_WARN, "held events gauge cannot prepare its statement", LOG_S("error", db_errmsg(j->d.db)));
	}
	if (j->gauge != NULL && gauge_held(j->gauge, &pending, &oldest) == ST_OK)
		metrics_held_now(pending, oldest);
	janitor_dlq_depth(j);
}

void *janitor_main(void *arg)
{
	struct janitor *j = arg;
	int64_t last_housekeeping = 0, last_relay = 0;
	struct janitor_pass pass = { .next_pass_ms = pool_now_ms() + j->t.conf->cleanup_interval_s * 1000 };

	pool_beat_bind(&j->t);
	db_thread_init();
	while (!atomic_load(&pool_stop)) {
		int64_t now;

		pool_beat();
		janitor_wait_for_work(j);
		now = pool_now_ms();
		if (now - last_relay < JANITOR_RELAY_MIN_GAP_MS)
			pool_sleep_ms((int)(JANITOR_RELAY_MIN_GAP_MS - (now - last_relay)));
		/* No broker connection to keep alive while it waits. */
		if (pool_thread_ends(&j->t, pool_db_up(&j->t, &j->d, NULL, NULL)))
			break;
		if (j->publisher != NULL && mq_keepalive(j->publisher) != ST_OK) {
			/* an idle publisher whose link failed: the next round opens another */
			mq_drop(&j->publisher);
			j->publisher_node++;
		}
		janitor_relay(j);
		last_relay = now = pool_now_ms();
		if (now - last_housekeeping >= JANITOR_HOUSEKEEPING_MS) {
			last_housekeeping = now;
			janitor_housekeeping(j);
		}
		janitor_retention(j, &pass, now);
	}
	mq_close(&j->probe);
	mq_close(&j->publisher);
	retention_close(&j->retention);
	gauge_close(&j->gauge);
	pool_db_close(&j->d);
	db_thread_end();
	return NULL;
}
