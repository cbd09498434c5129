/*
 * publish.c - the publishing half of inbox-loadgen.
 *
 * One thread per connection (rabbitmq-c connections are not shared between
 * threads), each in confirm mode, publishing its column of the scenario's
 * rows.  Publishes are pipelined and settled with mq_wait_confirms every few
 * hundred messages; only confirmed messages count as sent, and a nack or an
 * unroutable return (mandatory) fails the run, because the ledger would
 * then promise messages the broker never took.
 *
 * The threads pass a barrier every LG_ROW_SYNC rows so that the copies of a
 * concurrent duplicate, placed in one row, leave within a moment of each
 * other from different connections.  The barrier can be aborted, so a
 * failing thread never leaves the others waiting.
 *
 * Delayed duplicates and conflicting payloads are a second phase, published
 * only once every original has an inbox row: a conflict must arrive after
 * its original to be the one dead-lettered, and a delayed copy is meant to
 * meet an already-processed key.
 */
#include "publish.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "db.h"
#include "log.h"
#include "mq.h"
#include "status.h"

#define LG_ROW_SYNC 64
#define LG_CONFIRM_EVERY 500
#define LG_CONFIRM_TIMEOUT_MS 60000

int64_t lg_now_us(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
		return 0;
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

double lg_mono(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
		return 0;
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void lg_sleep_ms(int ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

void lg_verify_queue_name(const struct cfg *conf, char *buf, size_t cap)
{
	snprintf(buf, cap, "%s.verify", conf->out_exchange);
}

/* A barrier that a failing thread can open for everyone. */
struct lg_barrier {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int parties, waiting;
	unsigned long gen;
	bool aborted;
};

static void lg_barrier_wait(struct lg_barrier *b)
{
	unsigned long gen;

	pthread_mutex_lock(&b->mu);
	gen = b->gen;
	if (!b->aborted && ++b->waiting == b->parties) {
		b->waiting = 0;
		b->gen++;
		pthread_cond_broadcast(&b->cv);
	} else {
		while (!b->aborted && gen == b->gen)
			pthread_cond_wait(&b->cv, &b->mu);
	}
	pthread_mutex_unlock(&b->mu);
}

static void lg_barrier_abort(struct lg_barrier *b)
{
	pthread_mutex_lock(&b->mu);
	b->aborted = true;
	pthread_cond_broadcast(&b->cv);
	pthread_mutex_unlock(&b->mu);
}

struct lg_run {
	const struct cfg *conf;
	const struct lg_scenario *s;
	const struct lg_phase *ph;
	int cols;
	double rate; /* per connection, 0 = unlimited */
	struct lg_barrier barrier;
	atomic_ullong sent;
	atomic_ullong confirmed;
	atomic_int finished;
	atomic_bool failed;
	char err[256];
	pthread_mutex_t err_mu;
};

struct lg_pub {
	struct lg_run *run;
	int col;
	pthread_t thread;
};

static void lg_run_fail(struct lg_run *r, const char *what, const char *detail)
{
	pthread_mutex_lock(&r->err_mu);
	if (r->err[0] == '\0')
		snprintf(r->err, sizeof r->err, "%s: %s", what, detail);
	pthread_mutex_unlock(&r->err_mu);
	atomic_store(&r->failed, true);
	lg_barrier_abort(&r->barrier);
}

static int lg_settle(struct lg_run *r, struct mq *m, uint64_t *pending)
{
	int rc;

	if (*pending == 0)
		return ST_OK;
	rc = mq_wait_confirms(m, LG_CONFIRM_TIMEOUT_MS);
	if (rc != ST_OK) {
		lg_run_fail(r, "publisher confirms", mq_errmsg(m));
		return rc;
	}
	atomic_fetch_add(&r->confirmed, *pending);
	*pending = 0;
	return ST_OK;
}

static void *lg_pub_main(void *arg)
{
	struct lg_pub *p = arg;
	struct lg_run *r = p->run;
	const struct lg_scenario *s = r->s;
	struct mq *m = NULL;
	char name[64], rk[64];
	uint64_t pending = 0, mine = 0;
	double start;
	int rc;

	snprintf(name, sizeof name, "inbox-loadgen-%d", p->col);
	/* Heartbeats off: between phases the connection may sit idle while
	 * nothing services it. */
	rc = mq_open(&m, &r->conf->amqp, 0, name);
	if (rc != ST_OK) {
		lg_run_fail(r, "broker connect", st_strerror(rc));
		goto done;
	}
	if (mq_confirm_select(m) != ST_OK) {
		lg_run_fail(r, "confirm.select", mq_errmsg(m));
		goto done;
	}
	start = lg_mono();
	for (size_t row = 0; row < r->ph->rows && !atomic_load(&r->failed); row++) {
		const struct lg_item *it = &r->ph->slots[row * (size_t)r->cols + (size_t)p->col];

		if (it->msg != UINT32_MAX) {
			const struct lg_msg *msg = &s->msgs[it->msg];
			const char *order_id = msg->order >= 0 ? s->orders[msg->order].id : msg->id;
			struct mq_header h[1] = { { "order_id", order_id } };
			struct mq_message out = {
				.exchange = r->conf->exchange, .routing_key = rk, .message_id = msg->id,
				.headers = h, .nheaders = 1, .mandatory = true,
			};
			size_t len = 0;
			char *body = lg_body(s, it, &len);

			if (body == NULL) {
				lg_run_fail(r, "body", "cannot build a message body");
				break;
			}
			if (r->rate > 0) {
				/* Paced by row, not by this connection's own count:
				 * columns hold different numbers of messages, and a
				 * column paced by its count ran ahead of the others by
				 * up to LG_ROW_SYNC rows, so an order's events (adjacent
				 * rows, other columns) went out hundreds of ms apart and
				 * the early ones waited, held, for their prerequisite:
				 * the tail of publish-to-commit latency at --rate. */
				double per_row = r->ph->rows > 0 ? (double)r->ph->items / (double)r->ph->rows : 1.0;
				double due = start + (double)row * per_row / (r->rate * r->cols);
				double now = lg_mono();
				if (due > now)
					lg_sleep_ms((int)((due - now) * 1000.0) + 1);
			}
			lg_routing_key(s, msg, rk, sizeof rk);
			out.body = body;
			out.len = len;
			rc = mq_publish_at(m, &out, lg_now_us());
			free(body);
			if (rc != ST_OK) {
				lg_run_fail(r, "basic.publish", mq_errmsg(m));
				break;
			}
			mine++;
			pending++;
			atomic_fetch_add(&r->sent, 1);
			if (pending >= LG_CONFIRM_EVERY && lg_settle(r, m, &pending) != ST_OK)
				break;
		}
		if ((row + 1) % LG_ROW_SYNC == 0) {
			if (pending >= LG_CONFIRM_EVERY / 2 && lg_settle(r, m, &pending) != ST_OK)
				break;
			lg_barrier_wait(&r->barrier);
		}
	}
	if (!atomic_load(&r->failed))
		(void)lg_settle(r, m, &pending);
done:
	mq_close(&m);
	atomic_fetch_add(&r->finished, 1);
	return NULL;
}

/* Publish one phase; shows progress on a terminal.  Returns 0 or -1. */
static int lg_publish_phase(const struct cfg *conf, const struct lg_scenario *s, const struct lg_phase *ph,
                            double rate, const char *label)
{
	struct lg_run r;
	struct lg_pub *pubs;
	int cols = s->opts.connections;
	bool tty = isatty(2) != 0;
	double t0 = lg_mono(), last_t = t0;
	unsigned long long last_c = 0;
	double shown_rate = 0;
	int started = 0;

	if (ph->items == 0)
		return 0;
	memset(&r, 0, sizeof r);
	r.conf = conf;
	r.s = s;
	r.ph = ph;
	r.cols = cols;
	r.rate = rate > 0 ? rate / cols : 0;
	pthread_mutex_init(&r.err_mu, NULL);
	pthread_mutex_init(&r.barrier.mu, NULL);
	pthread_cond_init(&r.barrier.cv, NULL);
	r.barrier.parties = cols;
	pubs = calloc((size_t)cols, sizeof *pubs);
	if (pubs == NULL)
		return -1;
	for (int i = 0; i < cols; i++) {
		pubs[i].run = &r;
		pubs[i].col = i;
		if (pthread_create(&pubs[i].thread, NULL, lg_pub_main, &pubs[i]) != 0) {
			lg_run_fail(&r, "pthread_create", strerror(errno));
			break;
		}
		started++;
	}
	if (started < cols) {
		/* The barrier counts every column: without them all it
		 * could never open, so abort it. */
		lg_barrier_abort(&r.barrier);
	}
	while (atomic_load(&r.finished) < started) {
		lg_sleep_ms(200);
		if (tty) {
			double now = lg_mono();
			unsigned long long c = atomic_load(&r.confirmed);
			unsigned long long sent = atomic_load(&r.sent);
			double eta;

			if (now - last_t >= 1.0) {
				shown_rate = (double)(c - last_c) / (now - last_t);
				last_c = c;
				last_t = now;
			}
			eta = shown_rate > 0 ? (double)(ph->items - c) / shown_rate : 0;
			fprintf(stderr, "\r%s: sent %llu/%zu confirmed %llu  %.0f msg/s  ETA %.0fs   ", label, sent,
			        ph->items, c, shown_rate, eta);
		}
	}
	for (int i = 0; i < started; i++)
		pthread_join(pubs[i].thread, NULL);
	if (tty)
		fprintf(stderr, "\r%-78s\r", "");
	free(pubs);
	pthread_cond_destroy(&r.barrier.cv);
	pthread_mutex_destroy(&r.barrier.mu);
	pthread_mutex_destroy(&r.err_mu);
	if (atomic_load(&r.failed)) {
		fprintf(stderr, "inbox-loadgen: %s phase failed after %llu confirmed: %s\n", label,
		        (unsigned long long)atomic_load(&r.confirmed), r.err);
		return -1;
	}
	{
		double dt = lg_mono() - t0;
		fprintf(stderr, "inbox-loadgen: %s: %zu messages confirmed in %.1f s (%.0f msg/s)\n", label, ph->items,
		        dt, dt > 0 ? (double)ph->items / dt : 0.0);
	}
	return 0;
}

/* Wait until every valid original of the run has an inbox row. */
static int lg_wait_originals(const struct cfg *conf, const struct lg_scenario *s, int timeout_s)
{
	struct db *d = NULL;
	struct db_stmt *q = NULL;
	char like[LG_PREFIX_MAX + 4];
	double end = lg_mono() + timeout_s;
	bool tty = isatty(2) != 0;
	int64_t have = -1;
	int rc;

	snprintf(like, sizeof like, "%s-%%", s->prefix);
	rc = db_open(&d, &conf->db);
	if (rc == ST_OK)
		rc = db_prepare(d, &q, "SELECT COUNT(*) FROM processed_messages WHERE consumer = ? AND message_id LIKE ?");
	if (rc != ST_OK) {
		fprintf(stderr, "inbox-loadgen: database: %s\n", d ? db_errmsg(d) : st_strerror(rc));
		db_close(&d);
		return -1;
	}
	for (;;) {
		struct db_param p[2] = { DBP_STR(conf->consumer), DBP_STR(like) };
		struct db_col c[1] = { DBC_I64() };

		rc = db_stmt_query(q, p, 2);
		if (rc == ST_OK && db_stmt_fetch(q, c, 1) == 1) {
			have = c[0].i64;
			db_stmt_done(q);
		}
		db_rollback(d);
		if (rc != ST_OK) {
			fprintf(stderr, "inbox-loadgen: database: %s\n", db_errmsg(d));
			break;
		}
		if (have >= (int64_t)s->originals)
			break;
		if (lg_mono() > end) {
			fprintf(stderr,
			        "\ninbox-loadgen: only %lld of %zu originals processed after %d s (are workers running?)\n",
			        (long long)have, s->originals, timeout_s);
			rc = ST_ERR_TIMEOUT;
			break;
		}
		if (tty)
			fprintf(stderr, "\rwaiting for the originals to be processed: %lld/%zu   ", (long long)have,
			        s->originals);
		lg_sleep_ms(250);
	}
	if (tty)
		fprintf(stderr, "\r%-78s\r", "");
	db_close(&d);
	return rc == ST_OK ? 0 : -1;
}

int lg_publish(const struct cfg *conf, struct lg_scenario *s, const struct lg_publish_opts *po)
{
	struct mq *m = NULL;
	char vq[300];
	FILE *f;
	int rc;

	lg_verify_queue_name(conf, vq, sizeof vq);
	f = fopen(po->ledger, "w");
	if (f == NULL) {
		fprintf(stderr, "inbox-loadgen: cannot write %s: %s\n", po->ledger, strerror(errno));
		return 1;
	}
	if (lg_ledger_write(s, f, conf->consumer, conf->queue, conf->dlq, vq) != 0) {
		fprintf(stderr, "inbox-loadgen: writing %s: %s\n", po->ledger, strerror(errno));
		fclose(f);
		return 1;
	}
	if (fclose(f) != 0) {
		fprintf(stderr, "inbox-loadgen: writing %s: %s\n", po->ledger, strerror(errno));
		return 1;
	}

	/* The topology first, and the queue that collects what the worker
	 * emits, so nothing it publishes during the run is lost to the verifier. */
	rc = mq_open(&m, &conf->amqp, 0, "inbox-loadgen-setup");
	if (rc == ST_OK)
		rc = mq_declare_topology(m, conf);
	if (rc == ST_OK)
		rc = mq_queue_declare_bind(m, vq, conf->out_exchange, "#", true);
	if (rc != ST_OK) {
		fprintf(stderr, "inbox-loadgen: broker setup: %s\n", m ? mq_errmsg(m) : st_strerror(rc));
		mq_close(&m);
		return 1;
	}
	mq_close(&m);

	fprintf(stderr,
	        "inbox-loadgen: run %s: %zu orders, %zu originals + %zu immediate, %zu concurrent, %zu delayed copies,"
	        " %zu conflicts, %zu malformed over %d connections\n",
	        s->prefix, s->norders, s->originals, s->copies_immediate, s->copies_concurrent, s->copies_delayed,
	        s->conflict_copies, s->malformed, s->opts.connections);
	if (lg_publish_phase(conf, s, &s->main, po->rate, "publish") != 0)
		return 1;
	if (s->late.items > 0) {
		if (lg_wait_originals(conf, s, po->settle_timeout_s) != 0)
			return 1;
		if (lg_publish_phase(conf, s, &s->late, po->rate, "delayed copies and conflicts") != 0)
			return 1;
	}
	printf("published %zu messages (run %s); ledger %s\n", s->main.items + s->late.items, s->prefix, po->ledger);
	return 0;
}
