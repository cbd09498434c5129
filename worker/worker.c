/*
 * worker.c - one consuming thread of the pool.
 *
 * Per batch of deliveries (worker_handle; a batch is one delivery unless
 * INBOX_BATCH > 1, and never waits for more than is already here), four
 * steps:
 *   screen (worker_screen): size, parse and routing key checks ->
 *   dead-letter on bad input (confirmed);
 *   settle (worker_settle): the valid ones in one transaction
 *   (worker_transact): deadlock / lock wait time-out retry with jittered
 *   exponential backoff up to max_retries; a batch that still cannot
 *   commit, or that holds a value the database refuses, is split into
 *   single messages, and a single one then goes to the DLQ as
 *   retries-exhausted or unprocessable; a lost database connection, or
 *   any other database fault, is never the messages': keep them, wait
 *   with backoff, run them again;
 *   account (worker_account): a payload conflict's dead-letter copy,
 *   /metrics and the "handled" line of each;
 *   ack (worker_ack): only after the commit (or after the dead-letter copy
 *   is confirmed; a nacked or unroutable copy is retried with backoff, the
 *   original kept); while more deliveries are already waiting, acks are
 *   gathered into one cumulative ack (worker_ack_flush).
 *
 * One message's fault stays its own (SPEC.md): nothing about a delivery
 * makes worker_handle fail, so the consumer channel is reset only when the
 * broker connection itself fails.  A reset hands every prefetched delivery
 * back and raises its delivery count, which would push innocent messages
 * towards the delivery limit.
 */
#include "worker.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "db.h"
#include "deadletter.h"
#include "fault.h"
#include "inbox.h"
#include "inflight.h"
#include "metrics.h"
#include "mq.h"
#include "msg.h"
#include "aggregate.h"
#include "outbox.h"
#include "status.h"

#define WORKER_CONSUME_TIMEOUT_MS 250

#define WORKER_KV(w) POOL_KV(&(w)->t)

/* One delivery of a batch and what became of it. */
struct item {
	struct mq_delivery d;
	struct msg m;
	enum msg_reason reason;     /* why it was dead-lettered (NONE: it was not) */
	bool valid;                 /* passed the checks: went to the transaction */
	struct inbox_result res;
	bool done;                  /* settled: ack it */
	struct env_context ctx;     /* trace and correlation it carries (envelope.h) */
	char *event;                /* its canonical event when enveloped; NULL: native */
};

/* The list of a batch's valid items lives on the thread's stack. */
_Static_assert(CFG_BATCH_MAX * sizeof(struct item *) <= 8192, "a batch's valid list must stay small on the stack");

int worker_alloc(struct worker *w)
{
	int batch = w->t.conf->batch;

	outbox_dispatcher_init(&w->out, w->t.conf, w->t.name, w->t.index);
	w->items = calloc((size_t)batch, sizeof *w->items);
	w->ins = calloc((size_t)batch, sizeof *w->ins);
	w->res = calloc((size_t)batch, sizeof *w->res);
	w->ids = calloc((size_t)batch, sizeof *w->ids);
	w->keys = calloc((size_t)batch, sizeof *w->keys);
	w->busy = calloc((size_t)batch, sizeof *w->busy);
	w->later = calloc((size_t)batch, sizeof *w->later);
	w->first = calloc((size_t)batch, sizeof *w->first);
	w->held = calloc((size_t)batch, sizeof *w->held);
	return w->items == NULL || w->ins == NULL || w->res == NULL || w->ids == NULL || w->keys == NULL ||
	               w->busy == NULL || w->later == NULL || w->first == NULL || w->held == NULL
	           ? ST_ERR_NOMEM
	           : ST_OK;
}

void worker_free(struct worker *w)
{
	for (int i = 0; w->items != NULL && i < w->t.conf->batch; i++)
		free(w->items[i].event);
	free(w->items);
	free(w->ins);
	free(w->res);
	free(w->ids);
	free(w->keys);
	free(w->busy);
	free(w->later);
	free(w->first);
	free(w->held);
	outbox_dispatcher_free(&w->out);
	w->items = NULL;
	w->ins = NULL;
	w->res = NULL;
	w->ids = NULL;
	w->keys = NULL;
	w->busy = NULL;
	w->later = NULL;
	w->first = NULL;
	w->held = NULL;
}

/* Readiness: the thread is ready when it has both connections and every
 * one of its consumers; its shards count as covered only then. */
static void worker_ready(struct worker *w, bool ready)
{
	if (!ready) {
		pool_thread_unready(&w->t);
		return;
	}
	metrics_thread_ready(w->t.index, true);
	metrics_thread_shards(w->t.index, w->shard_mask);
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
 * the stop flag either way, unless stopping is set: the thread is finishing
 * what it holds after the stop flag (a retry's backoff, a database
 * reconnect, both bounded by their callers), and waits the whole ms.
 */
static void worker_pause(struct worker *w, int ms, bool stopping)
{
	int64_t end = pool_now_ms() + ms;

	/* What is settled is acked before a wait that may be long (a
	 * database outage): a crash meanwhile must not redeliver it. */
	if (w->consumer != NULL && worker_ack_flush(w) != ST_OK)
		LOG(LOG_LEVEL_WARN, "ack before waiting failed; the broker redelivers, the inbox absorbs it",
		    WORKER_KV(w));

	while (stopping || !atomic_load(&pool_stop)) {
		int64_t left = end - pool_now_ms();
		int step = left > 100 ? 100 : (int)left;

		if (step <= 0)
			return;
		pool_beat();
		outbox_dispatcher_keepalive(&w->out);
		if (w->consumer == NULL || mq_service(w->consumer, step) != ST_OK) {
			/* no consumer, or it failed: the ack will say so */
			struct timespec ts = { .tv_sec = 0, .tv_nsec = (long)step * 1000000L };

			if (w->consumer != NULL)
				LOG(LOG_LEVEL_DEBUG, "cannot service the broker connection while waiting",
				    WORKER_KV(w), LOG_S("error", mq_errmsg(w->consumer)));
			while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
				;
		}
	}
}

static void worker_wait(struct worker *w, int ms)
{
	worker_pause(w, ms, false);
}

/* pool_db_up's wait: keeps the broker connection alive; after the stop
 * flag too, as pool_db_up bounds its reconnects then (a stop finishes what
 * the thread holds). */
static void worker_wait_fn(void *arg, int ms)
{
	worker_pause(arg, ms, true);
}

static int worker_db_up(struct worker *w)
{
	int rc = pool_db_up(&w->t, &w->d, worker_wait_fn, w);

	if (rc == ST_OK)
		inbox_set_outbox(w->d.inbox, &w->out);
	return rc;
}

/* basic.consume on every queue of the thread.  The thread's prefetch is
 * shared among its consumers (the broker counts it per consumer), so a
 * thread holds about INBOX_PREFETCH unacked deliveries however many shards
 * it consumes.
 *
 * On the shared queue each thread consumes with a consumer priority, the
 * first thread highest: the broker gives a delivery to the highest
 * priority consumer with room in its prefetch window, so light traffic all
 * goes to the first thread, and the others take only what it has no room
 * for (a backlog keeps all of them busy).  Without it the broker deals
 * consecutive deliveries round the threads, an order's events that come
 * close together land in several threads at once, and each transaction
 * waits in the database for the one before it while holding its other
 * orders: at 1,750 msg/s (bench/latency) four threads had a p99 of
 * 230-700 ms where one had 18 ms.  Shard queues have one consumer each. */
static int worker_consume(struct worker *w)
{
	int per = (w->t.conf->prefetch + w->nshards - 1) / w->nshards;
	bool sharded = w->t.conf->ordering == CFG_ORDERING_SHARDED;
	int priority = sharded ? 0 : w->t.conf->threads - w->t.index;

	for (int i = 0; i < w->nshards; i++) {
		char queue[300];
		int rc;

		if (mq_consume_queue_name(w->t.conf, w->shard[i], queue, sizeof queue) != 0)
			return ST_ERR_INVALID;
		rc = mq_consume_start(w->consumer, queue, per, priority);
		if (rc != ST_OK)
			return rc;
		LOG(LOG_LEVEL_INFO, "consuming", WORKER_KV(w), LOG_S("queue", queue), LOG_I("prefetch", per),
		    LOG_I("priority", priority));
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
		rc = mq_open_from_why(&w->consumer, &w->t.conf->amqp, w->t.conf->heartbeat_s, w->t.name, &w->consumer_node, why,
		                      sizeof why);
		if (rc == ST_OK)
			rc = mq_declare_topology(w->consumer, w->t.conf);
		if (rc == ST_OK)
			rc = worker_consume(w);
		if (rc == ST_OK) {
			pool_link_back(&w->t, POOL_LINK_AMQP);
			w->consumed_once = true;
			return ST_OK;
		}
		if (w->consumer != NULL) {
			snprintf(why, sizeof why, "%s", mq_errmsg(w->consumer));
			mq_close(&w->consumer);
		} else {
			w->consumer_node++; /* the next tour starts at the next node */
		}
		if (st_refusal(rc) && !w->t.link[POOL_LINK_AMQP].ever_up)
			return pool_refused(&w->t, POOL_LINK_AMQP, NULL, why, rc);
		if (rc == ST_ERR_MQ && !w->consumed_once) {
			/* The broker refused a declaration (a queue that exists
			 * with other arguments, an exchange type it lacks).  At
			 * start-up that is a configuration error: retrying will
			 * not help.  Once the thread has consumed, someone
			 * changed the broker under us (a queue deleted and not
			 * yet declarable, a limit): keep trying, not ready, and
			 * say why (link_failed). */
			return pool_refused(&w->t, POOL_LINK_AMQP, "broker refused the topology", why, rc);
		}
		pool_sleep_ms(pool_link_retry_ms(&w->t, POOL_LINK_AMQP, why));
	}
	return ST_ERR_STOPPED;
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
 * the consumer channel.  So is a publisher that cannot connect or whose
 * confirm does not come within OUTBOX_CONFIRM_TIMEOUT_MS (a broker under a
 * memory or disk alarm blocks the connections that publish, not a consumer
 * that only acks): the consumer is serviced while the publish is retried,
 * and its prefetched deliveries keep their attempts.  Returns ST_OK;
 * ST_ERR_STOPPED when asked to stop meanwhile; ST_ERR_MQ_CONN only when
 * the consumer connection itself has failed too (mq_broken): a fault of
 * the broker connection, and the caller resets it (the message, unacked,
 * comes again). */
static int worker_dead_letter(struct worker *w, const struct mq_delivery *d, const char *rk,
                              const char *reason, const char *detail)
{
	char note[400], last[POOL_WHY_MAX] = "";
	char *props = mq_delivery_props_json_note(d, note, sizeof note);
	struct deadletter_headers dh;
	struct mq_message m = {
		.exchange = w->t.conf->dlx, .routing_key = rk, .body = d->body, .len = d->len,
		.props_json = props, .headers = dh.h, .mandatory = true,
	};
	int rc;

	if (props == NULL)
		snprintf(note, sizeof note, "not kept (out of memory)");
	deadletter_headers(&dh, reason, detail, note, d->delivery_count + 1);
	m.nheaders = dh.n;
	for (int attempt = 0;; attempt++) {
		char why[POOL_WHY_MAX];
		enum log_level level;

		rc = outbox_dispatcher_publish(&w->out, &m);
		if (rc == ST_OK) {
			if (attempt > 0)
				LOG(LOG_LEVEL_INFO, "dead-letter publish recovered", WORKER_KV(w), LOG_S("reason", reason),
				    LOG_I("attempts", attempt + 1));
			break;
		}
		/* Logged when it starts failing and when the broker's answer
		 * changes, not on every retry (a DLQ unbound for minutes). */
		snprintf(why, sizeof why, "%s: %s", st_strerror(rc), outbox_dispatcher_errmsg(&w->out));
		level = pool_why_changed(last, attempt == 0, why) ? LOG_LEVEL_WARN : LOG_LEVEL_DEBUG;
		LOG(level, "dead-letter publish failed; message kept, retrying", WORKER_KV(w), LOG_S("reason", reason),
		    LOG_S("error", why), LOG_I("attempt", attempt + 1));
		if (rc == ST_ERR_MQ_CONN && (w->consumer == NULL || mq_broken(w->consumer)))
			break;
		if (atomic_load(&pool_stop)) {
			rc = ST_ERR_STOPPED;
			break;
		}
		worker_wait(w, pool_backoff_ms(&w->t, attempt, 200));
	}
	free(props);
	return rc;
}

static char *worker_props_json(const void *arg)
{
	return mq_delivery_props_json(arg);
}

static const char *item_rk(const struct item *it)
{
	return it->d.routing_key[0] ? it->d.routing_key : "order.unknown";
}

/* Run the transaction over the valid items of a batch, retrying the whole
 * batch on deadlock and lock wait time-out.  held: NULL, or the items
 * another transaction's orders keep out of this one (inbox_run_nowait:
 * held[i] set, v[i] not settled; the caller settles them next).  Returns ST_OK when committed;
 * ST_ERR_DB_DEADLOCK when retries ran out; ST_ERR_DB_DATA when the database
 * refused a value of one of the messages, a duplicate key on a statement
 * after the claim included (ST_ERR_DB_DUPLICATE: the claim itself never
 * fails on one, so a 1062 comes from another UNIQUE index on a key or an
 * order the message names, and it says the same on every retry);
 * ST_ERR_FAULT when the test hook
 * fired; ST_ERR_STOPPED when asked to stop while waiting.  Any other fault
 * (connection lost, a missing table, a statement the server refuses) is
 * not the messages': they are kept and the batch is run again after a
 * backoff, as during a database outage. */
static int worker_transact(struct worker *w, struct item **v, int n, bool *held)
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
				.published_us = v[i]->d.published_us, .deliveries = v[i]->d.delivery_count + 1,
				.ctx = &v[i]->ctx, .event = v[i]->event,
			};
		if (held != NULL) {
			int nheld;

			rc = inbox_run_nowait(w->d.inbox, w->ins, n, w->res, held, &nheld);
		} else {
			rc = inbox_run(w->d.inbox, w->ins, n, w->res);
		}
		for (i = 0; rc == ST_OK && i < n; i++)
			if (held == NULL || !held[i])
				v[i]->res = w->res[i];
		if (rc == ST_OK)
			outbox_dispatcher_after_commit(&w->out);
		if (rc == ST_OK && outage > 0)
			LOG(LOG_LEVEL_INFO, "transaction recovered", WORKER_KV(w), LOG_I("messages", n), LOG_I("attempts", outage + 1));
		if (rc == ST_OK || rc == ST_ERR_FAULT)
			return rc;
		if (rc == ST_ERR_DB_DEADLOCK || rc == ST_ERR_DB_LOCK_TIMEOUT) {
			if (attempt >= w->t.conf->max_retries)
				return ST_ERR_DB_DEADLOCK;
			metrics_db_retry(); /* counted when it is retried, not when it gives up */
			LOG(LOG_LEVEL_DEBUG, "transaction retry", WORKER_KV(w), LOG_I("messages", n),
			    LOG_S("error", st_strerror(rc)), LOG_I("attempt", attempt + 1));
			/* Waited out after the stop flag too: the retries are
			 * bounded by max_retries, and a backoff skipped would
			 * only use them up at once. */
			worker_pause(w, pool_backoff_ms(&w->t, attempt++, 10), true);
			continue;
		}
		if (rc == ST_ERR_DB_DATA || rc == ST_ERR_DB_DUPLICATE) {
			LOG(LOG_LEVEL_WARN, "database refused a value", WORKER_KV(w), LOG_I("messages", n),
			    LOG_S("error", db_errmsg(w->d.db)));
			return ST_ERR_DB_DATA;
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
			const char *why = w->d.db ? db_errmsg(w->d.db) : st_strerror(rc);

			/* the level first: LOG reads it twice */
			enum log_level level = pool_why_changed(last, outage == 0, why) ? LOG_LEVEL_ERROR : LOG_LEVEL_DEBUG;

			LOG(level, "transaction failed; messages kept, retrying", WORKER_KV(w), LOG_I("messages", n),
			    LOG_S("error", why), LOG_I("attempt", outage + 1));
		}
		metrics_thread_ready(w->t.index, false);
		if (atomic_load(&pool_stop))
			return ST_ERR_STOPPED;
		worker_wait(w, pool_backoff_ms(&w->t, outage++, 200));
	}
}

/* The server's message for a value it refused, as one ASCII line (it
 * may quote the value). */
static void worker_db_detail(struct worker *w, char *buf, size_t cap)
{
	int n = snprintf(buf, cap, "the database refused a value: %s", db_errmsg(w->d.db));

	for (int i = 0; i < n && (size_t)i < cap && buf[i] != '\0'; i++)
		if ((unsigned char)buf[i] < 0x20 || (unsigned char)buf[i] > 0x7e)
			buf[i] = '?';
}

/* Settle the valid items: one transaction for all, or, when that cannot
 * commit (retries exhausted, an unexpected error), one transaction each so
 * that one bad apple does not hold the others back.  held: as for
 * worker_transact; on every path but a commit it comes back clear (each
 * item was settled, or handed back, here). */
static int worker_settle(struct worker *w, struct item **v, int n, bool *held)
{
	int rc = worker_transact(w, v, n, held);

	if (rc == ST_OK) {
		for (int i = 0; i < n; i++)
			v[i]->done = held == NULL || !held[i];
		return ST_OK;
	}
	for (int i = 0; held != NULL && i < n; i++)
		held[i] = false;
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
			rc = worker_settle(w, &v[i], 1, NULL);
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
			         w->t.conf->max_retries);
		log_trace_set(v[0]->ctx.trace_id, v[0]->ctx.span_id);
		rc = worker_dead_letter(w, &v[0]->d, item_rk(v[0]), msg_reason_name(reason), detail);
		log_trace_clear();
		if (rc != ST_OK)
			return rc;
		v[0]->reason = reason;
		v[0]->done = true;
		/* for the "handled" line worker_account writes */
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
		metrics_dead_letter(res->reason != MSG_REASON_NONE ? res->reason : MSG_REASON_INVALID_TRANSITION, 1);
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
	for (int e = 0; e < INBOX_EVENTS_MAX; e++)
		metrics_statements(e, res->stmts_ran[e], res->stmts_refused[e]);
}

/* The one "handled" line of a settled message.  reason: why it was
 * dead-lettered (NULL: it was not; then only at debug level), with its
 * detail; order and type only when the body yielded them; released < 0:
 * no transaction settled it (bad input), so nothing was released. */
static void worker_log_handled(struct worker *w, const struct item *it, const char *outcome, const char *reason,
                               const char *detail, int released)
{
	enum log_level level = reason != NULL ? LOG_LEVEL_WARN : LOG_LEVEL_DEBUG;
	struct log_kv kv[8];
	int n = 0;

	if (!log_enabled(level))
		return;
	kv[n++] = WORKER_KV(w);
	kv[n++] = LOG_S("message_id", it->m.message_id);
	if (it->m.order_id[0] != '\0' && it->m.type_name[0] != '\0') {
		kv[n++] = LOG_S("order", it->m.order_id);
		kv[n++] = LOG_S("type", it->m.type_name);
	}
	kv[n++] = LOG_S("outcome", outcome);
	if (reason != NULL) {
		kv[n++] = LOG_S("reason", reason);
		kv[n++] = LOG_S("detail", detail != NULL && detail[0] != '\0' ? detail : NULL);
	}
	if (released >= 0)
		kv[n++] = LOG_I("released", released);
	log_emit(level, "handled", kv, n);
}

/* Screen one delivery: body size, parse, validation, routing key.  Sets
 * it->reason (NONE: valid). */
static void worker_check(struct worker *w, struct item *it)
{
	struct env_delivery e;

	it->done = false;
	it->valid = false;
	memset(&it->res, 0, sizeof it->res); /* a dead-lettered one has no transaction's result */
	if (it->d.redelivered)
		metrics_redelivered();
	/* The envelope layer: a native delivery goes to msg_parse as before. */
	mq_delivery_envelope(&it->d, &e);
	free(it->event);
	it->reason = env_parse(w->t.conf, &e, (size_t)w->t.conf->max_body, &it->m, &it->ctx, &it->event);
	if (it->reason == MSG_REASON_NONE && !it->d.routing_key_valid) {
		/* It would be stored with a held event or a dead-letter
		 * row, whose utf8mb4 column refuses it: say so now, the
		 * same whatever the order of arrival. */
		it->reason = MSG_REASON_INVALID_FIELD;
		snprintf(it->m.detail, sizeof it->m.detail, "routing key is not valid UTF-8 or holds a NUL byte");
	}
	if (it->reason == MSG_REASON_NONE)
		it->valid = true;
}

/* Dead-letter a delivery that failed the checks; settled once confirmed. */
static int worker_reject_bad(struct worker *w, struct item *it)
{
	int rc;

	if (it->m.message_id[0] == '\0' && it->d.props.message_id != NULL) {
		/* For the log line: the body did not yield an id, the
		 * property may (the logger escapes what it prints). */
		size_t len = it->d.props.message_id_len < MSG_ID_MAX ? it->d.props.message_id_len : MSG_ID_MAX;
		memcpy(it->m.message_id, it->d.props.message_id, len);
		it->m.message_id[len] = '\0';
	}
	log_trace_set(it->ctx.trace_id, it->ctx.span_id);
	rc = worker_dead_letter(w, &it->d, item_rk(it), msg_reason_name(it->reason), it->m.detail);
	if (rc == ST_OK) {
		/* the same line as a dead letter of the transaction's
		 * (worker_account) */
		worker_log_handled(w, it, "dead_lettered", msg_reason_name(it->reason), it->m.detail, -1);
		it->done = true;
	}
	log_trace_clear();
	return rc;
}

/* Step 1: screen every delivery; the valid ones go to valid[] (in
 * delivery order), the others to the DLQ. */
static int worker_screen(struct worker *w, struct item *items, int n, struct item **valid, int *nvalid)
{
	*nvalid = 0;
	for (int i = 0; i < n; i++) {
		struct item *it = &items[i];
		int rc;

		worker_check(w, it);
		if (it->valid) {
			valid[(*nvalid)++] = it;
			continue;
		}
		rc = worker_reject_bad(w, it);
		if (rc != ST_OK)
			return rc;
	}
	return ST_OK;
}

/* Step 2 with other transactions about: the valid items whose orders no
 * other transaction holds are settled first, in one transaction, and the
 * others right after in a second.  Two sources say which orders are held:
 * this process's other threads (worker/inflight.h: an order another thread
 * has in hand, before its transaction even locks it) and, for any process
 * or thread, the database (inbox_run_nowait: the orders the first
 * transaction cannot lock without waiting).  What goes second is closed,
 * in delivery order, under "shares an order or a key with an earlier item
 * that goes second" (inflight_split, inbox_run_nowait): a delivery never
 * overtakes an earlier one of its order (its effect would come first) nor
 * of its key (two copies of one key naming different orders: the first
 * one stands, SPEC, and it must be decided first).  An order may then
 * have its early events in the first transaction and the rest in the
 * second: still in delivery order, since the first commits before the
 * second starts.  The second waits in the database for what it still
 * finds held.  Without the split, a batch that shares one order with
 * another transaction waits in the database for all of it, while holding
 * its own orders from the transactions behind it (worker/inflight.h).
 * When every order, or none, is busy in this process the first part is
 * the whole batch. */
static int worker_settle_apart(struct worker *w, struct item **valid, int n)
{
	struct inflight *f = w->t.shared->inflight;
	int nfree, nfirst = 0, nsecond = 0, nheld = 0, rc;

	if (n < 2)
		return worker_settle(w, valid, n, NULL);
	for (int i = 0; i < n; i++)
		w->busy[i] = false;
	if (f != NULL) {
		for (int i = 0; i < n; i++)
			w->ids[i] = valid[i]->m.order_id;
		nfree = inflight_take(f, w->t.index, w->ids, n, w->busy);
		if (nfree == n || nfree == 0) {
			for (int i = 0; i < n; i++)
				w->busy[i] = false;
		} else {
			for (int i = 0; i < n; i++)
				w->keys[i] = (struct inflight_key){ .order_id = valid[i]->m.order_id,
					                            .source = valid[i]->m.source,
					                            .message_id = valid[i]->m.message_id };
			(void)inflight_split(w->keys, n, w->busy);
		}
	}
	for (int i = 0; i < n; i++) {
		if (w->busy[i])
			w->later[nsecond++] = valid[i];
		else
			w->first[nfirst++] = valid[i];
	}
	if (nfirst == 0) {
		/* Everything follows a busy one: the first part is the whole. */
		for (int i = 0; i < n; i++)
			w->first[i] = valid[i];
		nfirst = n;
		nsecond = 0;
	}
	rc = worker_settle(w, w->first, nfirst, w->held);
	if (f != NULL)
		inflight_drop(f, w->t.index);
	if (rc != ST_OK)
		return rc;
	/* The second part: the first's held items and this process's busy
	 * ones, merged back into delivery order (items lie in w->items in
	 * delivery order, so by address). */
	{
		int a = nsecond, i = 0, j = 0, m = 0;

		for (int k = 0; k < nfirst; k++)
			nheld += w->held[k] ? 1 : 0;
		metrics_batch_split(METRICS_SPLIT_THREAD, nsecond);
		metrics_batch_split(METRICS_SPLIT_DATABASE, nheld);
		if (nsecond + nheld == 0)
			return ST_OK;
		/* w->later[0..a) is in delivery order: move it to the end
		 * of its room (the ranges may overlap) and merge the held
		 * ones of w->first in front of it. */
		memmove(w->later + (n - a), w->later, (size_t)a * sizeof *w->later);
		i = n - a;
		while (i < n || j < nfirst) {
			while (j < nfirst && !w->held[j])
				j++;
			if (j < nfirst && (i >= n || w->first[j] < w->later[i]))
				w->later[m++] = w->first[j++];
			else if (i < n)
				w->later[m++] = w->later[i++];
		}
		nsecond = m;
	}
	LOG(LOG_LEVEL_DEBUG, "batch split: orders another transaction holds go second", WORKER_KV(w),
	    LOG_I("first", nfirst - nheld), LOG_I("second", nsecond), LOG_I("held_elsewhere", nheld));
	/* Now these orders are ours for the others to keep clear of, even
	 * those still in another transaction (we wait for it in the
	 * database). */
	if (f != NULL) {
		for (int i = 0; i < nsecond; i++)
			w->ids[i] = w->later[i]->m.order_id;
		(void)inflight_take(f, w->t.index, w->ids, nsecond, w->busy);
	}
	rc = worker_settle(w, w->later, nsecond, NULL);
	if (f != NULL)
		inflight_drop(f, w->t.index);
	return rc;
}

/* Step 3, for one settled valid item: a payload conflict's dead-letter
 * copy (it->done cleared when that fails: it must come again), /metrics
 * and its "handled" line. */
static int worker_account_one(struct worker *w, struct item *it)
{
	/* The outcome is one of SPEC.md's outcome names; a dead
	 * letter also says why, in x-inbox-reason's words. */
	const char *outcome = "dead_lettered";
	const char *reason = NULL;
	char detail[640] = "";

	if (it->reason != MSG_REASON_NONE) {
		/* retries-exhausted, unprocessable: no transaction
		 * committed, so nothing was released either */
		metrics_dead_letter(it->reason, 1);
		reason = msg_reason_name(it->reason);
		snprintf(detail, sizeof detail, "%s", it->m.detail);
	} else if (it->res.outcome == INBOX_CONFLICT) {
		int rc;

		snprintf(detail, sizeof detail, "message %s from '%s' arrived again with a different payload%s",
		         it->m.message_id, it->m.source,
		         it->res.forgotten ? " (its inbox row was past INBOX_RETENTION; the ledger keeps the first)" : "");
		rc = worker_dead_letter(w, &it->d, item_rk(it), "payload-conflict", detail);
		if (rc != ST_OK) {
			it->done = false; /* not in the DLQ yet: must come again */
			return rc;
		}
		metrics_dead_letter(MSG_REASON_PAYLOAD_CONFLICT, 1);
		reason = "payload-conflict";
	} else {
		worker_count(&it->res);
		outcome = inbox_outcome_name(it->res.outcome);
		if (it->res.outcome == INBOX_DEAD_LETTERED) {
			/* its dead-letter copy is in the outbox */
			reason = msg_reason_name(it->res.reason != MSG_REASON_NONE ? it->res.reason
			                                                           : MSG_REASON_INVALID_TRANSITION);
			snprintf(detail, sizeof detail, "%s", it->res.detail);
		}
	}
	worker_log_handled(w, it, outcome, reason, detail, it->res.released);
	return ST_OK;
}

/* Step 3: account for the settled valid items; *outbox_rows: the outbox
 * rows their transactions wrote. */
static int worker_account(struct worker *w, struct item **valid, int nvalid, int *outbox_rows)
{
	*outbox_rows = 0;
	for (int i = 0; i < nvalid; i++) {
		int rc;

		if (!valid[i]->done)
			continue; /* handed back by the fault hook */
		log_trace_set(valid[i]->ctx.trace_id, valid[i]->ctx.span_id);
		rc = worker_account_one(w, valid[i]);
		log_trace_clear();
		if (rc != ST_OK)
			return rc;
		*outbox_rows += valid[i]->res.outbox_rows;
	}
	return ST_OK;
}

/* Step 4: ack every settled delivery, cumulatively when all of the batch
 * is settled (worker_ack_flush sends it later), else one by one. */
static int worker_ack(struct worker *w, struct item *items, int n, double t0)
{
	bool all_done = true;
	int rc;

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
			metrics_dead_letter(items[i].reason, 1); /* the valid ones are counted in worker_account */
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
	return ST_OK;
}

/* Wake the janitor: this batch committed outbox rows for the relay. */
static void worker_wake_janitor(struct worker *w)
{
	struct pool_shared *s = w->t.shared;

	if (pthread_mutex_lock(&s->mu) == 0) {
		s->pending = true;
		pthread_cond_signal(&s->cv);
		pthread_mutex_unlock(&s->mu);
	}
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
	int nvalid = 0, outbox_rows = 0;
	int rc = worker_screen(w, items, n, valid, &nvalid);

	if (rc == ST_OK && nvalid > 0)
		rc = worker_settle_apart(w, valid, nvalid);
	if (rc == ST_OK)
		rc = worker_account(w, valid, nvalid, &outbox_rows);
	if (rc != ST_OK) {
		worker_ack_settled(w, items, n);
		return rc;
	}
	if (fault_hit("after-commit")) {
		/* Test hook: die between the commit and the ack, as a SIGKILL
		 * would; the redelivery must be recognised as a duplicate. */
		raise(SIGKILL);
	}
	rc = worker_ack(w, items, n, t0);
	if (rc != ST_OK)
		return rc;
	if (outbox_rows > 0 && w->t.conf->outbox_dispatch == CFG_DISPATCH_RELAY)
		worker_wake_janitor(w);
	return ST_OK;
}

static void worker_release(struct worker *w, int n)
{
	for (int i = 0; i < n; i++) {
		mq_delivery_release(w->consumer, &w->items[i].d);
		free(w->items[i].event);
		w->items[i].event = NULL;
	}
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
		rc = mq_declare_topology(w->consumer, w->t.conf);
	if (rc == ST_OK)
		rc = mq_consume_again(w->consumer);
	if (rc == ST_OK)
		LOG(LOG_LEVEL_INFO, "consuming again", WORKER_KV(w));
	return rc;
}

/* The "worker-stall" fault (tests): the thread hangs with a batch in hand
 * as if a call never returned -- no progress, so no watchdog pings (pool.c)
 * -- until the pool is asked to stop; then the batch is handled as usual. */
static void worker_stall(struct worker *w)
{
	LOG(LOG_LEVEL_WARN, "stalling until asked to stop (fault worker-stall)", WORKER_KV(w));
	while (!atomic_load(&pool_stop)) {
		struct timespec ts = { .tv_sec = 0, .tv_nsec = 50 * 1000000L };

		while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
			;
	}
}

/* A thread that found nothing to do: the outbox's confirms that came are
 * read (outbox_dispatcher_idle bounds how long one may take), and once all
 * are in, the marks no next transaction will carry are written; how long
 * to wait for a delivery now. */
static int worker_idle(struct worker *w)
{
	int wait_ms = outbox_dispatcher_idle(&w->out, WORKER_CONSUME_TIMEOUT_MS);

	if (w->out.nsent == 0 && w->d.inbox != NULL && outbox_dispatcher_marks_pending(&w->out) > 0 &&
	    inbox_flush_marks(w->d.inbox) != ST_OK)
		LOG(LOG_LEVEL_DEBUG, "outbox marks kept for the next write", WORKER_KV(w),
		    LOG_S("error", db_errmsg(w->d.db)));
	return wait_ms;
}

void *worker_main(void *arg)
{
	struct worker *w = arg;

	pool_beat_bind(&w->t);
	db_thread_init();
	while (!atomic_load(&pool_stop)) {
		int n = 0;
		int rc;

		pool_beat();
		outbox_dispatcher_keepalive(&w->out); /* a busy thread's publisher too: it may not publish for long */
		rc = worker_db_up(w);

		if (rc == ST_OK)
			rc = worker_mq_up(w);
		if (pool_thread_ends(&w->t, rc))
			break;
		if (mq_cancelled(w->consumer) > 0 && worker_consume_again(w) != ST_OK)
			goto reset;
		worker_ready(w, true);
		/* Owe at most half the prefetch window, so the broker's
		 * next deliveries are on their way before the buffer runs dry.
		 * Only the acks: with the default batch of half the window this
		 * comes after every full batch, and the outbox copies in flight
		 * are not waited for here (that is for a thread with nothing to
		 * do, below). */
		rc = ST_OK;
		if (w->ack_pending > 0 && 2 * w->ack_pending >= w->t.conf->prefetch)
			rc = worker_ack_flush(w);
		if (rc != ST_OK)
			goto reset;
		rc = mq_consume(w->consumer, &w->items[0].d, 0);
		if (rc == ST_ERR_TIMEOUT) {
			/* Nothing more is here: ack what is settled, so the broker
			 * can send more.  Outbox copies still unconfirmed are not
			 * waited for: a persistent copy is confirmed once the
			 * broker has written it, milliseconds in which deliveries
			 * keep coming, so the thread reads the confirms that came
			 * and looks for deliveries again soon (outbox_dispatcher_idle).
			 * Once all are in, it writes the marks no next
			 * transaction will carry, and waits for work. */
			int wait_ms = worker_idle(w);

			rc = worker_ack_flush(w);
			if (rc == ST_OK)
				rc = mq_consume(w->consumer, &w->items[0].d, wait_ms);
		}
		if (rc == ST_ERR_TIMEOUT)
			continue;
		if (rc == ST_OK) {
			/* A batch is what is already here, never a wait for more:
			 * batching must not add latency when traffic is light. */
			for (n = 1; n < w->t.conf->batch; n++) {
				rc = mq_consume(w->consumer, &w->items[n].d, 0);
				if (rc != ST_OK)
					break;
			}
			if (rc == ST_ERR_TIMEOUT)
				rc = ST_OK;
			if (rc == ST_OK && fault_hit("worker-stall"))
				worker_stall(w);
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
		pool_sleep_ms(pool_backoff_ms(&w->t, 0, 200));
	}
	worker_ready(w, false);
	outbox_dispatcher_drain(&w->out);
	if (w->d.inbox != NULL && inbox_flush_marks(w->d.inbox) != ST_OK)
		LOG(LOG_LEVEL_DEBUG, "outbox marks not written; the relay publishes those rows again", WORKER_KV(w));
	if (w->consumer != NULL && worker_ack_flush(w) != ST_OK)
		LOG(LOG_LEVEL_WARN, "final ack failed; the broker redelivers, the inbox absorbs it", WORKER_KV(w));
	mq_close(&w->consumer);
	pool_db_close(&w->d);
	db_thread_end();
	return NULL;
}

