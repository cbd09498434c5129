/*
 * min_pipeline.c - ceiling (b) of the benchmark: the smallest loop that does
 * the worker's job.  Per thread: one AMQP connection consuming the inbox
 * queue with manual acks (prefetch as the pool), one DB connection; per
 * message: parse the body with jansson, SHA-256 it, run the inbox
 * transaction (a duplicate key rolls back), ack.  Nothing else — no
 * validation beyond the fields it needs, no state machine, no dead-letters,
 * no outbox — so pool / min_pipeline is the price of those guarantees.
 *
 *   min_pipeline --threads N [--expect M] [--idle S] [--prefetch P] [--batch B] [--emit]
 *
 * --batch B (> 1): the batched ceiling.  A thread takes up to B deliveries
 * that are already waiting (as the pool does), runs them in one
 * transaction whose statements are array-bound over the batch (four round
 * trips: claim, order, ledger, COMMIT) and acks them with one cumulative
 * basic.ack.
 *
 * --emit (with --batch): also the least an inbox that emits events can do
 * for them.  After each commit the thread publishes, on a second
 * connection in confirm mode, one persistent OrderPaid to the out exchange
 * per PaymentAuthorized of the batch (duplicates included: 22 % of the
 * messages of bench/run's backlog, where the pool's outbox, which also
 * sends compensations, emits about 27 %), and waits for the
 * broker's confirms before the ack.  No outbox table, no relay: a ceiling,
 * not exactly-once.  pool / this is the price of the outbox alone.
 *
 * Drains until M messages were handled or nothing came for S seconds, then
 * prints `min_pipeline threads=N msgs=... seconds=... mps=... emitted=...`
 * (seconds from the first delivery to the last ack).
 */
#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_tx.h"
#include "cfg.h"
#include "log.h"
#include "mq.h"

struct mp_shared {
	const struct cfg *conf;
	long expect;
	long idle_s;
	int prefetch;
	int batch;
	bool emit;
	atomic_long handled;
	atomic_long emitted;
	pthread_mutex_t mu;
	double first, last;
};

struct mp_thread {
	pthread_t th;
	int index;
	struct mp_shared *sh;
	int rc;
};

static double mp_now(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
		return 0;
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void mp_mark(struct mp_shared *sh, double t)
{
	pthread_mutex_lock(&sh->mu);
	if (sh->first == 0 || t < sh->first)
		sh->first = t;
	if (t > sh->last)
		sh->last = t;
	pthread_mutex_unlock(&sh->mu);
}

static const char *mp_str(json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));
	return s != NULL ? s : "";
}

static int mp_handle(struct bench_tx *tx, const struct mq_delivery *d, EVP_MD_CTX *md)
{
	json_error_t jerr;
	json_t *o = json_loadb(d->body, d->len, 0, &jerr);
	unsigned char sha[32];
	unsigned int shalen = 0;
	struct bench_msg m;
	int rc;

	if (o == NULL)
		return ST_OK; /* not ours to judge: ack and move on */
	if (EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1 || EVP_DigestUpdate(md, d->body, d->len) != 1 ||
	    EVP_DigestFinal_ex(md, sha, &shalen) != 1) {
		json_decref(o);
		return ST_ERR_INVALID;
	}
	for (int i = 0; i < 32; i++)
		snprintf(m.sha_hex + 2 * i, 3, "%02x", sha[i]);
	m.consumer = "bench";
	m.source = mp_str(o, "source");
	m.message_id = mp_str(o, "message_id");
	m.type = mp_str(o, "type");
	m.order_id = mp_str(o, "order_id");
	m.published_us = d->published_us;
	for (int attempt = 0; attempt < 20; attempt++) {
		rc = bench_tx_run(tx, &m);
		if (rc != ST_ERR_DB_DEADLOCK && rc != ST_ERR_DB_LOCK_TIMEOUT)
			break;
	}
	json_decref(o);
	return rc == ST_ERR_DB_DUPLICATE ? ST_OK : rc;
}

/* Parse and hash one delivery into m (strings borrowed from *o, which the
 * caller frees after the transaction).  -1: not ours to judge. */
static int mp_prepare(const struct mq_delivery *d, EVP_MD_CTX *md, struct bench_msg *m, json_t **o)
{
	json_error_t jerr;
	unsigned char sha[32];
	unsigned int shalen = 0;

	*o = json_loadb(d->body, d->len, 0, &jerr);
	if (*o == NULL)
		return -1;
	if (EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1 || EVP_DigestUpdate(md, d->body, d->len) != 1 ||
	    EVP_DigestFinal_ex(md, sha, &shalen) != 1)
		return -1;
	for (int i = 0; i < 32; i++)
		snprintf(m->sha_hex + 2 * i, 3, "%02x", sha[i]);
	m->consumer = "bench";
	m->source = mp_str(*o, "source");
	m->message_id = mp_str(*o, "message_id");
	m->type = mp_str(*o, "type");
	m->order_id = mp_str(*o, "order_id");
	m->published_us = d->published_us;
	return 0;
}

/* --emit: one OrderPaid per PaymentAuthorized of the committed batch,
 * confirmed. */
static int mp_emit(struct mp_shared *sh, struct mq *pub, const struct bench_msg *m, int k)
{
	long n = 0;

	for (int i = 0; i < k; i++) {
		char body[256];
		struct mq_message e = { .exchange = sh->conf->out_exchange, .routing_key = "order.paid", .body = body };
		int rc;

		if (m[i].type == NULL || strcmp(m[i].type, "PaymentAuthorized") != 0)
			continue;
		e.len = (size_t)snprintf(body, sizeof body, "{\"type\":\"OrderPaid\",\"order_id\":\"%s\",\"caused_by\":\"%s\"}",
		                         m[i].order_id, m[i].message_id);
		if (e.len >= sizeof body)
			continue;
		rc = mq_publish(pub, &e);
		if (rc != ST_OK)
			return rc;
		n++;
	}
	atomic_fetch_add(&sh->emitted, n);
	return n > 0 ? mq_wait_confirms(pub, 10000) : ST_OK;
}

/* The batched loop (--batch B). */
static void mp_batched(struct mp_thread *t, struct mq *mq, struct mq *pub, struct bench_tx *tx, EVP_MD_CTX *md)
{
	struct mp_shared *sh = t->sh;
	int cap = sh->batch;
	struct mq_delivery *d = calloc((size_t)cap, sizeof *d);
	struct bench_msg *m = calloc((size_t)cap, sizeof *m);
	json_t **o = calloc((size_t)cap, sizeof *o);
	double last_seen = mp_now();

	if (d == NULL || m == NULL || o == NULL) {
		t->rc = ST_ERR_NOMEM;
		goto out;
	}
	while (atomic_load(&sh->handled) < sh->expect) {
		int n = 0, k = 0, rc = mq_consume(mq, &d[0], 500);

		if (rc == ST_ERR_TIMEOUT) {
			if (mp_now() - last_seen >= (double)sh->idle_s)
				break;
			continue;
		}
		if (rc != ST_OK) {
			t->rc = rc;
			break;
		}
		for (n = 1; n < cap && mq_consume(mq, &d[n], 0) == ST_OK; n++)
			;
		last_seen = mp_now();
		mp_mark(sh, last_seen);
		for (int i = 0; i < n; i++)
			if (mp_prepare(&d[i], md, &m[k], &o[k]) == 0)
				k++;
			else
				json_decref(o[k]);
		rc = ST_OK;
		for (int attempt = 0; k > 0 && attempt < 20; attempt++) {
			rc = bench_tx_run_batch(tx, m, k);
			if (rc != ST_ERR_DB_DEADLOCK && rc != ST_ERR_DB_LOCK_TIMEOUT)
				break;
		}
		if (rc != ST_OK)
			fprintf(stderr, "min_pipeline: thread %d: transaction: %s\n", t->index, db_errmsg(tx->db));
		if (rc == ST_OK && pub != NULL) {
			rc = mp_emit(sh, pub, m, k);
			if (rc != ST_OK)
				fprintf(stderr, "min_pipeline: thread %d: emit: %s\n", t->index, mq_errmsg(pub));
		}
		for (int i = 0; i < k; i++)
			json_decref(o[i]);
		if (rc != ST_OK) {
			t->rc = rc;
			break;
		}
		rc = mq_ack(mq, d[n - 1].tag, true);
		for (int i = 0; i < n; i++)
			mq_delivery_release(mq, &d[i]);
		if (rc != ST_OK) {
			t->rc = rc;
			break;
		}
		mp_mark(sh, mp_now());
		atomic_fetch_add(&sh->handled, n);
	}
out:
	free(d);
	free(m);
	free(o);
}

static void *mp_main(void *arg)
{
	struct mp_thread *t = arg;
	struct mp_shared *sh = t->sh;
	struct mq *mq = NULL, *pub = NULL;
	struct bench_tx tx;
	struct mq_delivery d;
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	double last_seen = mp_now();
	char name[48];

	db_thread_init();
	memset(&tx, 0, sizeof tx);
	memset(&d, 0, sizeof d);
	snprintf(name, sizeof name, "min-pipeline-%d", t->index);
	t->rc = md != NULL ? ST_OK : ST_ERR_NOMEM;
	if (t->rc == ST_OK)
		t->rc = bench_tx_open(&tx, &sh->conf->db);
	if (t->rc == ST_OK)
		t->rc = mq_open(&mq, &sh->conf->amqp, sh->conf->heartbeat_s, name);
	if (t->rc == ST_OK)
		t->rc = mq_consume_start(mq, sh->conf->queue, sh->prefetch, 0);
	if (t->rc == ST_OK && sh->emit)
		t->rc = mq_open(&pub, &sh->conf->amqp, 0, name);
	if (t->rc == ST_OK && sh->emit)
		t->rc = mq_confirm_select(pub);
	if (t->rc != ST_OK) {
		fprintf(stderr, "min_pipeline: thread %d: setup failed: %s\n", t->index, st_strerror(t->rc));
		goto out;
	}
	if (sh->batch > 1) {
		mp_batched(t, mq, pub, &tx, md);
		goto out;
	}
	while (atomic_load(&sh->handled) < sh->expect) {
		int rc = mq_consume(mq, &d, 500);
		if (rc == ST_ERR_TIMEOUT) {
			if (mp_now() - last_seen >= (double)sh->idle_s)
				break;
			continue;
		}
		if (rc != ST_OK) {
			fprintf(stderr, "min_pipeline: thread %d: consume: %s\n", t->index, mq_errmsg(mq));
			t->rc = rc;
			break;
		}
		last_seen = mp_now();
		mp_mark(sh, last_seen);
		rc = mp_handle(&tx, &d, md);
		if (rc != ST_OK) {
			fprintf(stderr, "min_pipeline: thread %d: transaction: %s\n", t->index, db_errmsg(tx.db));
			t->rc = rc;
			break;
		}
		rc = mq_ack(mq, d.tag, false);
		mq_delivery_release(mq, &d);
		if (rc != ST_OK) {
			t->rc = rc;
			break;
		}
		mp_mark(sh, mp_now());
		atomic_fetch_add(&sh->handled, 1);
	}
out:
	mq_close(&mq);
	mq_close(&pub);
	bench_tx_close(&tx);
	EVP_MD_CTX_free(md);
	db_thread_end();
	return NULL;
}

int main(int argc, char **argv)
{
	struct cfg conf;
	struct mp_shared sh;
	struct mp_thread *ts;
	char err[256];
	char *cargv[] = { argv[0], NULL };
	long threads = 4, expect = 1L << 40, idle = 3, prefetch = -1, batch = 1;
	bool emit = false;
	int code = 0;

	for (int i = 1; i < argc; i++) {
		long *dst = NULL, max = 1024;
		if (strcmp(argv[i], "--emit") == 0) {
			emit = true;
			continue;
		}
		if (strcmp(argv[i], "--threads") == 0)
			dst = &threads;
		else if (strcmp(argv[i], "--expect") == 0) {
			dst = &expect;
			max = 1L << 40;
		} else if (strcmp(argv[i], "--idle") == 0)
			dst = &idle;
		else if (strcmp(argv[i], "--prefetch") == 0) {
			dst = &prefetch;
			max = 65535;
		} else if (strcmp(argv[i], "--batch") == 0) {
			dst = &batch;
			max = 500;
		}
		if (dst == NULL || i + 1 >= argc || cfg_parse_long(argv[++i], 1, max, dst, err, sizeof err) != 0) {
			fprintf(stderr, "usage: min_pipeline [--threads N] [--expect M] [--idle S] [--prefetch P] [--batch B]"
			                " [--emit]\n");
			return 2;
		}
	}
	if (cfg_load(&conf, 1, cargv, err, sizeof err) != CFG_OK) {
		fprintf(stderr, "min_pipeline: %s\n", err);
		return 2;
	}
	log_setup(LOG_LEVEL_WARN, LOG_FORMAT_TEXT);
	if (db_global_init() != ST_OK)
		return 1;
	memset(&sh, 0, sizeof sh);
	sh.conf = &conf;
	sh.expect = expect;
	sh.idle_s = idle;
	sh.batch = (int)batch;
	sh.emit = emit && batch > 1;
	sh.prefetch = prefetch > 0 ? (int)prefetch : conf.prefetch;
	if (sh.prefetch < sh.batch)
		sh.prefetch = 2 * sh.batch; /* as the pool's default: two batches in flight */
	pthread_mutex_init(&sh.mu, NULL);
	{
		/* The queue must exist before the threads consume it. */
		struct mq *m = NULL;
		if (mq_open(&m, &conf.amqp, 0, "min-pipeline-setup") != ST_OK || mq_declare_topology(m, &conf) != ST_OK) {
			fprintf(stderr, "min_pipeline: broker setup failed\n");
			mq_close(&m);
			return 1;
		}
		mq_close(&m);
	}
	ts = calloc((size_t)threads, sizeof *ts);
	if (ts == NULL)
		return 1;
	for (long i = 0; i < threads; i++) {
		ts[i] = (struct mp_thread){ .index = (int)i, .sh = &sh };
		if (pthread_create(&ts[i].th, NULL, mp_main, &ts[i]) != 0) {
			fprintf(stderr, "min_pipeline: pthread_create failed\n");
			return 1;
		}
	}
	for (long i = 0; i < threads; i++) {
		pthread_join(ts[i].th, NULL);
		if (ts[i].rc != ST_OK)
			code = 1;
	}
	{
		long n = atomic_load(&sh.handled);
		double dt = sh.last > sh.first ? sh.last - sh.first : 0;
		printf("min_pipeline threads=%ld msgs=%ld seconds=%.2f mps=%.0f emitted=%ld\n", threads, n, dt,
		       dt > 0 ? (double)n / dt : 0.0, atomic_load(&sh.emitted));
	}
	free(ts);
	pthread_mutex_destroy(&sh.mu);
	db_global_end();
	cfg_free(&conf);
	return code;
}
