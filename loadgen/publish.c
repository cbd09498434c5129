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
#include "amqpx.h"
#include "snapshot.h"
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
	atomic_ullong republished; /* publishes repeated after a broker fault */
	atomic_ullong reconnects;
	atomic_int finished;
	atomic_bool failed;
	int retry_s;
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
		snprintf(r->err, sizeof r->err, "%s: %.200s", what, detail);
	pthread_mutex_unlock(&r->err_mu);
	atomic_store(&r->failed, true);
	lg_barrier_abort(&r->barrier);
}

/* Publish one item on m (not yet confirmed), or, for the binary-header
 * class, on a connection of its own, confirmed before this returns. */
static int lg_publish_item(struct lg_run *r, struct mq *m, const struct lg_item *it)
{
	const struct lg_scenario *s = r->s;
	const struct lg_msg *msg = &s->msgs[it->msg];
	const char *order_id = msg->order >= 0 ? s->orders[msg->order].id : msg->id;
	struct mq_header h[1 + LG_CE_HEADERS] = { { "order_id", order_id } };
	struct lg_ce_vals ce;
	char rk[64];
	/* The message-id property carries the id in every envelope: what the
	 * DLQ copies are told apart by (verify), as most AMQP producers of
	 * CloudEvents set it too. */
	struct mq_message out = {
		.exchange = r->conf->exchange, .routing_key = rk, .message_id = msg->id,
		.headers = h, .nheaders = 1, .mandatory = true,
	};
	size_t len = 0;
	char *body = lg_body(s, it, &len);
	int rc;

	if (s->opts.envelope == LG_ENV_CE)
		out.props_json = "{\"content_type\":\"application/cloudevents+json\"}";
	/* binary mode's attributes, and a number a header carries */
	if (s->opts.envelope == LG_ENV_CE_BINARY || s->plan.def->seq_header) {
		int n = lg_ce_headers(s, it, h + 1, LG_CE_HEADERS, &ce);
		if (n < 0) {
			free(body);
			lg_run_fail(r, "headers", "cannot build the CloudEvents headers");
			return ST_ERR_NOMEM;
		}
		out.nheaders += n;
	}

	if (body == NULL) {
		lg_run_fail(r, "body", "cannot build a message body");
		return ST_ERR_NOMEM;
	}
	lg_routing_key(s, msg, rk, sizeof rk);
	if (msg->bad == LG_BAD_BINARY_HEADER) {
		struct lgx_binary_message bm = {
			.exchange = r->conf->exchange, .routing_key = rk, .message_id = msg->id, .order_id = order_id,
			.body = body, .len = len, .bin_key = "trace", .bin_value = lg_binary_trace,
			.bin_len = sizeof lg_binary_trace, .published_us = lg_now_us(),
		};
		char err[256];
		double end = lg_mono() + r->retry_s;

		/* Its own connection: struct mq_header has string values only. */
		while ((rc = lgx_publish_binary(&r->conf->amqp, &bm, err, sizeof err)) != 0 && lg_mono() < end &&
		       !atomic_load(&r->failed)) {
			atomic_fetch_add(&r->republished, 1);
			lg_sleep_ms(500);
		}
		free(body);
		if (rc != 0) {
			lg_run_fail(r, "binary-header publish", err);
			return ST_ERR_MQ_CONN;
		}
		return ST_OK;
	}
	out.body = body;
	out.len = len;
	rc = mq_publish_at(m, &out, lg_now_us());
	free(body);
	return rc;
}

/* Open a publisher connection in confirm mode; 0 or -1 (connection closed). */
static int lg_pub_open(struct lg_run *r, struct mq **m, const char *name, char *err, size_t errlen)
{
	int rc;

	/* Heartbeats off: between phases the connection may sit idle while
	 * nothing services it. */
	rc = mq_open_why(m, &r->conf->amqp, 0, name, err, errlen);
	if (rc != ST_OK)
		return -1;
	if (mq_confirm_select(*m) != ST_OK) {
		snprintf(err, errlen, "confirm.select: %s", mq_errmsg(*m));
		mq_close(m);
		return -1;
	}
	return 0;
}

/* A publish or a confirm failed (the broker restarted, a nack, a return):
 * reconnect and publish again everything not confirmed yet — the broker
 * may or may not have taken it, so a copy it did take becomes a duplicate,
 * which the worker absorbs and the ledger tolerates (verify counts
 * effects).  Gives up after retry_s seconds.  Returns ST_OK with *pending
 * confirmed, or an error after lg_run_fail. */
static int lg_recover(struct lg_run *r, struct mq **m, const char *name, const struct lg_item **inflight,
                      uint64_t *pending, const char *why)
{
	double end = lg_mono() + r->retry_s;
	char err[256];
	int delay_ms = 200;

	snprintf(err, sizeof err, "%s", why);
	atomic_fetch_add(&r->reconnects, 1);
	for (;;) {
		uint64_t i;
		int rc = ST_OK;

		mq_close(m);
		if (atomic_load(&r->failed))
			return ST_ERR_MQ_CONN;
		if (lg_mono() > end) {
			lg_run_fail(r, "broker (gave up re-publishing)", err);
			return ST_ERR_MQ_CONN;
		}
		lg_sleep_ms(delay_ms);
		delay_ms = delay_ms < 2000 ? delay_ms * 2 : 2000;
		if (lg_pub_open(r, m, name, err, sizeof err) != 0)
			continue;
		for (i = 0; i < *pending && rc == ST_OK; i++)
			rc = lg_publish_item(r, *m, inflight[i]);
		if (rc == ST_OK)
			rc = mq_wait_confirms(*m, LG_CONFIRM_TIMEOUT_MS);
		if (rc != ST_OK) {
			snprintf(err, sizeof err, "%s", mq_errmsg(*m));
			continue;
		}
		atomic_fetch_add(&r->republished, *pending);
		atomic_fetch_add(&r->confirmed, *pending);
		*pending = 0;
		return ST_OK;
	}
}

static int lg_settle(struct lg_run *r, struct mq **m, const char *name, const struct lg_item **inflight,
                     uint64_t *pending)
{
	int rc;

	if (*pending == 0)
		return ST_OK;
	rc = mq_wait_confirms(*m, LG_CONFIRM_TIMEOUT_MS);
	if (rc != ST_OK)
		return lg_recover(r, m, name, inflight, pending, mq_errmsg(*m));
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
	const struct lg_item **inflight = NULL;
	char name[64], err[256];
	uint64_t pending = 0, mine = 0;
	double start;

	snprintf(name, sizeof name, "inbox-loadgen-%d", p->col);
	inflight = calloc(LG_CONFIRM_EVERY + 1, sizeof *inflight);
	if (inflight == NULL) {
		lg_run_fail(r, "publisher", "out of memory");
		goto done;
	}
	if (lg_pub_open(r, &m, name, err, sizeof err) != 0) {
		/* The broker may be restarting: the same patience as later. */
		if (lg_recover(r, &m, name, inflight, &pending, err) != ST_OK)
			goto done;
	}
	start = lg_mono();
	for (size_t row = 0; row < r->ph->rows && !atomic_load(&r->failed); row++) {
		const struct lg_item *it = &r->ph->slots[row * (size_t)r->cols + (size_t)p->col];

		if (it->msg != UINT32_MAX) {
			int rc;

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
			rc = lg_publish_item(r, m, it);
			if (atomic_load(&r->failed))
				break;
			mine++;
			atomic_fetch_add(&r->sent, 1);
			if (s->msgs[it->msg].bad == LG_BAD_BINARY_HEADER) {
				/* confirmed on its own connection already */
				atomic_fetch_add(&r->confirmed, 1);
			} else {
				inflight[pending++] = it;
				if (rc != ST_OK && lg_recover(r, &m, name, inflight, &pending, mq_errmsg(m)) != ST_OK)
					break;
				if (pending >= LG_CONFIRM_EVERY && lg_settle(r, &m, name, inflight, &pending) != ST_OK)
					break;
			}
		}
		if ((row + 1) % LG_ROW_SYNC == 0) {
			if (pending >= LG_CONFIRM_EVERY / 2 && lg_settle(r, &m, name, inflight, &pending) != ST_OK)
				break;
			lg_barrier_wait(&r->barrier);
		}
	}
	if (!atomic_load(&r->failed))
		(void)lg_settle(r, &m, name, inflight, &pending);
done:
	free(inflight);
	mq_close(&m);
	atomic_fetch_add(&r->finished, 1);
	return NULL;
}

static void lg_fmt_secs(char *buf, size_t cap, double s)
{
	long t = s < 0 ? 0 : (long)(s + 0.5);

	if (t >= 3600)
		snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
	else
		snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

void lg_progress_line(char *buf, size_t cap, const char *label, unsigned long long sent,
                      unsigned long long confirmed, size_t total, double elapsed_s, bool have_rate, double rate)
{
	char el[24], eta[24] = "--";
	double pct = total > 0 ? 100.0 * (double)sent / (double)total : 100.0;

	/* Sent, not confirmed, drives the figures: confirms come in batches
	 * and would show a stalled run between them. */
	lg_fmt_secs(el, sizeof el, elapsed_s);
	if (have_rate && rate > 0)
		lg_fmt_secs(eta, sizeof eta, (double)(total > sent ? total - sent : 0) / rate);
	snprintf(buf, cap, "%s: sent %llu/%zu (%.1f%%), confirmed %llu, elapsed %s, %.0f msg/s, ETA %s", label, sent,
	         total, pct, confirmed, el, have_rate ? rate : 0.0, eta);
}

/* Until every started publisher has finished: progress on a terminal (or
 * with --progress). */
static void lg_phase_progress(struct lg_run *r, int started, bool show, const char *label, double t0)
{
	bool tty = isatty(2) != 0;
	double last_t = t0, shown_rate = 0;
	unsigned long long last_c = 0;
	bool have_rate = false;

	while (atomic_load(&r->finished) < started) {
		lg_sleep_ms(200);
		if (tty || show) {
			double now = lg_mono();
			unsigned long long c = atomic_load(&r->confirmed);
			unsigned long long sent = atomic_load(&r->sent);
			char line[200];

			/* The rate is smoothed over one-second samples (EWMA,
			 * weight 0.3), so one slow second does not swing the
			 * ETA; until the first sample there is none. */
			if (now - last_t >= 1.0) {
				double sample = (double)(sent - last_c) / (now - last_t);
				shown_rate = have_rate ? 0.3 * sample + 0.7 * shown_rate : sample;
				have_rate = true;
				last_c = sent;
				last_t = now;
			} else if (!tty && have_rate) {
				continue; /* to a log: one line a second */
			}
			lg_progress_line(line, sizeof line, label, sent, c, r->ph->items, now - t0, have_rate, shown_rate);
			fprintf(stderr, tty ? "\r%s   " : "%s\n", line);
		}
	}
	if (tty)
		fprintf(stderr, "\r%-130s\r", "");
}

/* The run's locks and barrier: all of them or none (-1). */
static int lg_run_sync_init(struct lg_run *r)
{
	if (pthread_mutex_init(&r->err_mu, NULL) != 0)
		return -1;
	if (pthread_mutex_init(&r->barrier.mu, NULL) != 0)
		goto err_mu;
	if (pthread_cond_init(&r->barrier.cv, NULL) != 0)
		goto barrier_mu;
	return 0;
barrier_mu:
	pthread_mutex_destroy(&r->barrier.mu);
err_mu:
	pthread_mutex_destroy(&r->err_mu);
	return -1;
}

static void lg_run_sync_fini(struct lg_run *r)
{
	pthread_cond_destroy(&r->barrier.cv);
	pthread_mutex_destroy(&r->barrier.mu);
	pthread_mutex_destroy(&r->err_mu);
}

/* Start a publisher per column; returns how many started.  One that
 * cannot start fails the run, and the barrier, which counts every column
 * and so could never open, is aborted. */
static int lg_start_publishers(struct lg_run *r, struct lg_pub *pubs)
{
	int started = 0;

	for (int i = 0; i < r->cols; i++) {
		pubs[i].run = r;
		pubs[i].col = i;
		if (pthread_create(&pubs[i].thread, NULL, lg_pub_main, &pubs[i]) != 0) {
			lg_run_fail(r, "pthread_create", strerror(errno));
			break;
		}
		started++;
	}
	if (started < r->cols)
		lg_barrier_abort(&r->barrier);
	return started;
}

/* Publish one phase; shows progress on a terminal (or with --progress).
 * Returns 0 or -1. */
static int lg_publish_phase(const struct cfg *conf, const struct lg_scenario *s, const struct lg_phase *ph,
                            const struct lg_publish_opts *po, const char *label, unsigned long long *republished,
                            unsigned long long *reconnects)
{
	struct lg_run r;
	struct lg_pub *pubs;
	int cols = s->opts.connections;
	double t0 = lg_mono(), dt;
	int started;

	if (ph->items == 0)
		return 0;
	memset(&r, 0, sizeof r);
	r.conf = conf;
	r.s = s;
	r.ph = ph;
	r.cols = cols;
	r.rate = po->rate > 0 ? po->rate / cols : 0;
	r.retry_s = po->retry_s;
	r.barrier.parties = cols;
	pubs = calloc((size_t)cols, sizeof *pubs);
	if (pubs == NULL || lg_run_sync_init(&r) != 0) {
		free(pubs);
		fprintf(stderr, "inbox-loadgen: %s phase: out of memory\n", label);
		return -1;
	}
	started = lg_start_publishers(&r, pubs);
	lg_phase_progress(&r, started, po->progress, label, t0);
	for (int i = 0; i < started; i++)
		pthread_join(pubs[i].thread, NULL);
	free(pubs);
	lg_run_sync_fini(&r);
	*republished += atomic_load(&r.republished);
	*reconnects += atomic_load(&r.reconnects);
	if (atomic_load(&r.failed)) {
		fprintf(stderr, "inbox-loadgen: %s phase failed after %llu confirmed: %s\n", label,
		        (unsigned long long)atomic_load(&r.confirmed), r.err);
		return -1;
	}
	dt = lg_mono() - t0;
	fprintf(stderr, "inbox-loadgen: %s: %zu messages confirmed in %.1f s (%.0f msg/s)\n", label, ph->items, dt,
	        dt > 0 ? (double)ph->items / dt : 0.0);
	return 0;
}

/* Wait until every valid original of the run has an inbox row.  A
 * database that goes away meanwhile (a restart, a crash) is waited for
 * within the same bound.  With stall_s > 0, a count that has not moved for
 * stall_s seconds ends the wait early with success: the missing originals
 * are not coming (lost, or dead-lettered by the broker), the delayed phase
 * goes out anyway and verify names them. */
static int lg_wait_originals(const struct cfg *conf, const struct lg_scenario *s, int timeout_s, int stall_s)
{
	double moved = lg_mono();
	int64_t last_have = -1;
	struct db *d = NULL;
	struct db_stmt *q = NULL;
	char like[LG_PREFIX_MAX + 4];
	char last_err[256] = "";
	double end = lg_mono() + timeout_s;
	bool tty = isatty(2) != 0;
	int64_t have = -1;
	int rc = ST_OK;

	snprintf(like, sizeof like, "%s-%%", s->prefix);
	for (;;) {
		struct db_param p[] = { DBP_STR(conf->consumer), DBP_STR(like) };
		struct db_col c[] = { DBC_I64() };

		if (d == NULL) {
			rc = db_open_why(&d, &conf->db, last_err, sizeof last_err);
			if (st_refusal(rc)) {
				log_refused(rc, "db", conf->db.user, conf->db.redacted, last_err);
				return rc;
			}
			if (rc == ST_OK)
				rc = db_prepare(d, &q, "SELECT COUNT(*) FROM processed_messages WHERE consumer = ?"
				                       " AND message_id LIKE ?");
		}
		if (rc == ST_OK) {
			int r = db_stmt_query_row(q, p, ARRAY_LEN(p), c, ARRAY_LEN(c));
			if (r < 0)
				rc = r;
			else if (r == 1)
				have = c[0].i64;
		}
		if (d != NULL)
			db_rollback(d);
		if (rc != ST_OK) {
			if (d != NULL)
				snprintf(last_err, sizeof last_err, "%s", db_errmsg(d));
			db_close(&d);
			q = NULL;
		} else if (have >= (int64_t)s->originals) {
			break;
		} else if (have != last_have) {
			last_have = have;
			moved = lg_mono();
		} else if (stall_s > 0 && lg_mono() - moved > stall_s) {
			fprintf(stderr,
			        "%sinbox-loadgen: %lld of %zu originals have an inbox row and none came for %d s;"
			        " publishing the delayed phase anyway (verify names the missing)\n",
			        tty ? "\n" : "", (long long)have, s->originals, stall_s);
			break;
		}
		if (lg_mono() > end) {
			fprintf(stderr,
			        "\ninbox-loadgen: only %lld of %zu originals processed after %d s (are workers running?)%s%s\n",
			        (long long)have, s->originals, timeout_s, last_err[0] ? "; last database error: " : "",
			        last_err);
			rc = ST_ERR_TIMEOUT;
			break;
		}
		if (tty)
			fprintf(stderr, "\rwaiting for the originals to be processed: %lld/%zu   ", (long long)have,
			        s->originals);
		lg_sleep_ms(rc == ST_OK ? 250 : 1000);
	}
	if (tty)
		fprintf(stderr, "\r%-78s\r", "");
	db_close(&d);
	return rc == ST_OK ? 0 : -1;
}

int lg_publish(const struct cfg *conf, struct lg_scenario *s, const struct lg_publish_opts *po)
{
	struct lg_snapshot snap;
	struct mq *m = NULL;
	char vq[300], why[300];
	FILE *f;
	unsigned long long republished = 0, reconnects = 0;
	int rc;

	lg_verify_queue_name(conf, vq, sizeof vq);
	/* Before the first message: the baseline of what the definition's
	 * statements add to, which verify holds the end values against. */
	if (lg_snapshot_take(conf, s, &snap) != 0)
		return 1;
	f = fopen(po->ledger, "w");
	if (f == NULL) {
		fprintf(stderr, "inbox-loadgen: cannot write %s: %s\n", po->ledger, strerror(errno));
		lg_snapshot_free(&snap);
		return 1;
	}
	if (lg_ledger_write(s, f, conf->consumer, conf->queue, conf->dlq, vq) != 0 ||
	    lg_snapshot_write(&snap, s->plan.def, f) != 0) {
		fprintf(stderr, "inbox-loadgen: writing %s: %s\n", po->ledger, strerror(errno));
		lg_snapshot_free(&snap);
		fclose(f);
		return 1;
	}
	lg_snapshot_free(&snap);
	if (fclose(f) != 0) {
		fprintf(stderr, "inbox-loadgen: writing %s: %s\n", po->ledger, strerror(errno));
		return 1;
	}

	/* The topology first, and the queue that collects what the worker
	 * emits, so nothing it publishes during the run is lost to the verifier. */
	rc = mq_open_why(&m, &conf->amqp, 0, "inbox-loadgen-setup", why, sizeof why);
	if (st_refusal(rc)) {
		log_refused(rc, "amqp", conf->amqp.user, conf->amqp.redacted, why);
		return 1;
	}
	if (rc == ST_OK)
		rc = mq_declare_topology(m, conf);
	if (rc == ST_OK)
		rc = mq_queue_declare_bind_type(m, vq, conf->out_exchange, "#", conf->dlq_type == CFG_QUEUE_QUORUM);
	if (rc != ST_OK) {
		fprintf(stderr, "inbox-loadgen: broker setup: %s\n", m ? mq_errmsg(m) : why);
		mq_close(&m);
		return 1;
	}
	mq_close(&m);

	fprintf(stderr,
	        "inbox-loadgen: run %s: %zu orders, %zu originals + %zu immediate, %zu concurrent, %zu delayed copies,"
	        " %zu conflicts, %zu malformed over %d connections\n",
	        s->prefix, s->norders, s->originals, s->copies_immediate, s->copies_concurrent, s->copies_delayed,
	        s->conflict_copies, s->malformed, s->opts.connections);
	if (lg_publish_phase(conf, s, &s->main, po, "publish", &republished, &reconnects) != 0)
		return 1;
	if (s->late.items > 0) {
		if (lg_wait_originals(conf, s, po->settle_timeout_s, po->settle_stall_s) != 0)
			return 1;
		if (lg_publish_phase(conf, s, &s->late, po, "delayed copies and conflicts", &republished, &reconnects) != 0)
			return 1;
	}
	printf("published %zu messages (run %s); ledger %s\n", s->main.items + s->late.items, s->prefix, po->ledger);
	/* Scripts read this line (scripts/chaos): keep its words. */
	printf("re-published %llu unconfirmed messages after %llu broker faults\n", republished, reconnects);
	return 0;
}
