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
 * connection in confirm mode, what the pool emits for the same messages,
 * and acks the batch once the broker has confirmed them, going on with its
 * next batches meanwhile (up to MP_PENDING_MAX of them unacked, within the
 * prefetch window, as the pool does with its dispatch): each event once, as
 * persistent messages to the out exchange under the same routing key,
 * stable message-id, type, correlation id and JSON envelope as the pool's
 * outbox writes (common/outbox.c).  Which events those are it decides
 * from memory (mp_model: each key's first delivery, the order's state and
 * flags, held events released when their order moves on) with the pool's
 * own state machine (agg_decide), where the pool reads the order row.
 * Until 2899e57 it published one bare OrderPaid per PaymentAuthorized
 * delivery instead (22 % of bench/run's backlog, duplicates included,
 * against the pool's 27 %: a ceiling that did a fifth less publishing than
 * the pool it bounds), and it waited for each batch's confirms before it
 * took the next one (at 8 threads that made no difference that showed).
 * No outbox table, no relay: a ceiling, not exactly-once.  pool / this is
 * the price of the outbox alone.
 *
 * Drains until M messages were handled or nothing came for S seconds, then
 * prints `min_pipeline threads=N msgs=... seconds=... mps=... emitted=...`
 * (seconds from the first delivery to the last ack).
 */
#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <search.h> /* tsearch, tdestroy */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_tx.h"
#include "cfg.h"
#include "log.h"
#include "mq.h"
#include "aggregate.h"

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
	/* --emit's decisions (mp_model), under model_mu: the keys seen (their
	 * strings) and the orders (struct mp_order), each a tsearch tree that
	 * owns its nodes.  Not hsearch_r: glibc's hash of a string is
	 * decided by its first eight characters, which all of a run's keys
	 * share, and every lookup walked the whole table (strcmp was 56 % of
	 * the loop's CPU). */
	pthread_mutex_t model_mu;
	void *seen, *orders;
	atomic_long model_overflow;
};

/* An order as the emit model knows it: its state and flags, and the
 * events that came before their prerequisite (held, in arrival order). */
#define MP_HELD_MAX 8
struct mp_order {
	char id[72];
	int state;
	unsigned flags;
	int nheld;
	struct {
		int type;
		char *message_id;
	} held[MP_HELD_MAX];
};

/* One event to publish: what outbox_row_event would have written. */
struct mp_out {
	const char *type; /* the definition's emit name */
	char order_id[72];
	char cause_id[MSG_WIDE_ID_MAX + 1];
	char cause_type[MSG_TYPE_NAME_MAX + 1];
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

static int mp_str_cmp(const void *a, const void *b)
{
	return strcmp(a, b);
}

static int mp_order_cmp(const void *a, const void *b)
{
	return strcmp(((const struct mp_order *)a)->id, ((const struct mp_order *)b)->id);
}

static void mp_order_free(void *p)
{
	struct mp_order *o = p;

	for (int h = 0; h < o->nheld; h++)
		free(o->held[h].message_id);
	free(o);
}

static void mp_model_close(struct mp_shared *sh)
{
	tdestroy(sh->seen, free);
	tdestroy(sh->orders, mp_order_free);
	sh->seen = sh->orders = NULL;
}

/* Remember key: true the first time.  Looked up before anything is
 * allocated: most keys of a batch are known only once. */
static bool mp_first_seen(struct mp_shared *sh, const char *key)
{
	char *copy;
	char **node;

	if (tfind(key, &sh->seen, mp_str_cmp) != NULL)
		return false;
	copy = strdup(key);
	node = copy != NULL ? tsearch(copy, &sh->seen, mp_str_cmp) : NULL;
	if (node == NULL) {
		free(copy);
		atomic_fetch_add(&sh->model_overflow, 1);
		return false;
	}
	return true;
}

/* The order of that id, created (no state yet) the first time; NULL when
 * memory ran out.  Only a new order costs an allocation. */
static struct mp_order *mp_order_of(struct mp_shared *sh, const char *id)
{
	struct mp_order key, *o, **node;

	snprintf(key.id, sizeof key.id, "%s", id);
	node = tfind(&key, &sh->orders, mp_order_cmp);
	if (node != NULL)
		return *node;
	o = calloc(1, sizeof *o);
	if (o != NULL) {
		memcpy(o->id, key.id, sizeof o->id);
		node = tsearch(o, &sh->orders, mp_order_cmp);
	}
	if (o == NULL || node == NULL) {
		free(o);
		atomic_fetch_add(&sh->model_overflow, 1);
		return NULL;
	}
	return o;
}

/* The emits of verdict v for the event (type, cause) of order o, in the
 * definition's order of emits, as inbox_act writes them. */
static void mp_out_add(struct mp_shared *sh, struct mp_out **out, int *nout, int *cap, unsigned emits,
                       const char *order_id, const char *cause_id, int type)
{
	const struct lc_def *d = agg_current()->def;

	for (int i = 0; i < d->nemits; i++) {
		struct mp_out *x;

		if (!(emits & (1u << i)))
			continue;
		if (*nout == *cap) {
			int ncap = *cap > 0 ? 2 * *cap : 64;
			struct mp_out *g = realloc(*out, (size_t)ncap * sizeof *g);
			if (g == NULL) {
				atomic_fetch_add(&sh->model_overflow, 1);
				return;
			}
			*out = g;
			*cap = ncap;
		}
		x = &(*out)[(*nout)++];
		x->type = d->emits[i];
		snprintf(x->order_id, sizeof x->order_id, "%s", order_id);
		snprintf(x->cause_id, sizeof x->cause_id, "%s", cause_id);
		snprintf(x->cause_type, sizeof x->cause_type, "%s", agg_type_name(type));
	}
}

/* Decide event (type, cause) on o as the pool would: applied or
 * compensated -> its emits, and the order moves on; held -> kept on o.
 * True when the order changed. */
static bool mp_decide(struct mp_order *o, const char *order_id, int type, const char *cause_id, bool may_hold,
                      struct mp_out **out, int *nout, int *cap, struct mp_shared *sh)
{
	struct agg_verdict v = agg_decide(o->state, o->flags, (enum msg_type)type);

	if (v.decision == LC_HOLD) {
		if (may_hold) {
			char *id = o->nheld < MP_HELD_MAX ? strdup(cause_id) : NULL;
			if (id == NULL) {
				atomic_fetch_add(&sh->model_overflow, 1);
				return false;
			}
			o->held[o->nheld].type = type;
			o->held[o->nheld].message_id = id;
			o->nheld++;
		}
		return false;
	}
	if (v.decision != LC_APPLY && v.decision != LC_COMPENSATE)
		return false;
	mp_out_add(sh, out, nout, cap, v.emits, order_id, cause_id, type);
	o->state = v.next;
	o->flags = v.flags;
	return true;
}

/* What the pool emits for the batch m[0..k), decided from memory (see the
 * header): each key's first delivery only, each order's held events
 * retried, in arrival order, whenever the order moves on. */
static int mp_model(struct mp_shared *sh, const struct bench_msg *m, int k, struct mp_out **out, int *cap)
{
	int nout = 0;

	pthread_mutex_lock(&sh->model_mu);
	for (int i = 0; i < k; i++) {
		char key[2 * MSG_WIDE_ID_MAX + 2];
		struct mp_order *o;
		int type = m[i].type != NULL ? agg_type_find(m[i].type, strlen(m[i].type)) : -1;

		snprintf(key, sizeof key, "%s\x1f%s", m[i].source, m[i].message_id);
		if (type < 0 || !mp_first_seen(sh, key))
			continue; /* not an event of ours, or a key seen before: no effect */
		o = mp_order_of(sh, m[i].order_id);
		if (o == NULL)
			continue;
		if (!mp_decide(o, m[i].order_id, type, m[i].message_id, true, out, &nout, cap, sh))
			continue;
		for (bool moved = true; moved && o->nheld > 0;) {
			moved = false;
			for (int h = 0; h < o->nheld; h++) {
				if (!mp_decide(o, m[i].order_id, o->held[h].type, o->held[h].message_id, false, out, &nout,
				               cap, sh) &&
				    agg_decide(o->state, o->flags, (enum msg_type)o->held[h].type).decision == LC_HOLD)
					continue;
				free(o->held[h].message_id);
				memmove(&o->held[h], &o->held[h + 1], (size_t)(o->nheld - h - 1) * sizeof o->held[0]);
				o->nheld--;
				moved = true;
				break;
			}
		}
	}
	pthread_mutex_unlock(&sh->model_mu);
	return nout;
}

/* --emit: what the pool emits for the committed batch (mp_model), each as
 * outbox_row_event builds it, published in confirm mode without waiting:
 * [*first, *last) are their sequence numbers, settled by mp_settle. */
static int mp_emit(struct mp_shared *sh, struct mq *pub, const struct bench_msg *m, int k, struct mp_out **out,
                   int *cap, uint64_t *first, uint64_t *last)
{
	const struct lc_def *def = agg_current()->def;
	int n = mp_model(sh, m, k, out, cap);
	char ts[32];
	time_t now = time(NULL);
	struct tm tm;

	*first = *last = mq_next_seq(pub);
	if (gmtime_r(&now, &tm) == NULL || strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
		return ST_ERR_INVALID;
	for (int i = 0; i < n; i++) {
		struct mp_out *x = &(*out)[i];
		char id[MSG_ID_MAX + 1], rk[300];
		json_t *body, *props;
		char *b = NULL, *p = NULL;
		int rc = ST_ERR_NOMEM;

		snprintf(id, sizeof id, "%s:%s", x->type, x->order_id);
		snprintf(rk, sizeof rk, "%s.%s", def->aggregate, x->type);
		body = json_pack("{s:s, s:s, s:s, s:s, s:s, s:{s:s, s:s}}", "message_id", id, "source", sh->conf->consumer,
		                 "type", x->type, def->key, x->order_id, "occurred_at", ts, "data", "cause_message_id",
		                 x->cause_id, "cause_type", x->cause_type);
		props = json_pack("{s:s}", "correlation_id", x->cause_id);
		if (body != NULL)
			b = json_dumps(body, JSON_COMPACT | JSON_SORT_KEYS);
		if (props != NULL)
			p = json_dumps(props, JSON_COMPACT | JSON_SORT_KEYS);
		json_decref(body);
		json_decref(props);
		if (b != NULL && p != NULL) {
			struct mq_message e = { .exchange = sh->conf->out_exchange, .routing_key = rk, .body = b,
				                .len = strlen(b), .props_json = p, .message_id = id, .type = x->type };
			rc = mq_publish(pub, &e);
		}
		free(b);
		free(p);
		if (rc != ST_OK)
			return rc;
	}
	atomic_fetch_add(&sh->emitted, n);
	*last = mq_next_seq(pub);
	return ST_OK;
}

/* A committed batch, acked (cumulatively, up to tag) once the events it
 * published, sequence numbers [first, last), are confirmed. */
struct mp_pending {
	uint64_t tag, first, last;
	int n;
};
#define MP_PENDING_MAX 8

/* Ack the committed batches, oldest first, whose events the broker
 * confirmed; wait: until every one is.  Without a publisher each is acked
 * at once. */
static int mp_settle(struct mp_shared *sh, struct mq *mq, struct mq *pub, struct mp_pending *p, int *np, bool wait)
{
	uint64_t tag = 0;
	long n = 0;
	int done = 0, rc = ST_OK;

	if (*np == 0)
		return ST_OK;
	if (pub != NULL)
		rc = wait ? mq_wait_confirms(pub, 10000) : mq_poll_confirms(pub);
	if (rc != ST_OK)
		return rc;
	for (; done < *np; done++) {
		bool confirmed = true;

		for (uint64_t q = p[done].first; confirmed && q < p[done].last; q++) {
			enum mq_outcome o = mq_outcome(pub, q);
			if (o != MQ_OUTCOME_PENDING && o != MQ_OUTCOME_ACKED)
				return ST_ERR_MQ_NACK; /* a ceiling has no outbox to fall back on */
			confirmed = o == MQ_OUTCOME_ACKED;
		}
		if (!confirmed)
			break;
		tag = p[done].tag;
		n += p[done].n;
	}
	if (done == 0)
		return ST_OK;
	rc = mq_ack(mq, tag, true);
	memmove(p, p + done, (size_t)(*np - done) * sizeof *p);
	*np -= done;
	if (rc == ST_OK) {
		mp_mark(sh, mp_now());
		atomic_fetch_add(&sh->handled, n);
	}
	return rc;
}

/* The batched loop (--batch B). */
static void mp_batched(struct mp_thread *t, struct mq *mq, struct mq *pub, struct bench_tx *tx, EVP_MD_CTX *md)
{
	struct mp_shared *sh = t->sh;
	int cap = sh->batch;
	struct mq_delivery *d = calloc((size_t)cap, sizeof *d);
	struct bench_msg *m = calloc((size_t)cap, sizeof *m);
	json_t **o = calloc((size_t)cap, sizeof *o);
	struct mp_out *out = NULL;
	int out_cap = 0, npending = 0;
	struct mp_pending pending[MP_PENDING_MAX];
	double last_seen = mp_now();

	if (d == NULL || m == NULL || o == NULL) {
		t->rc = ST_ERR_NOMEM;
		goto out;
	}
	while (atomic_load(&sh->handled) < sh->expect) {
		uint64_t first = 0, last = 0;
		int n = 0, k = 0, rc;

		/* Committed batches wait for their confirms while the next ones
		 * run; a full window of them, half the publishes pub.c tracks
		 * outcomes for, or a prefetch with nothing left to hand out
		 * waits for them. */
		rc = mp_settle(sh, mq, pub, pending, &npending,
		               npending == MP_PENDING_MAX || (pub != NULL && mq_unconfirmed(pub) > MQ_TRACK_MAX / 2));
		if (rc != ST_OK) {
			t->rc = rc;
			break;
		}
		rc = mq_consume(mq, &d[0], npending > 0 ? 1 : 500);
		if (rc == ST_ERR_TIMEOUT) {
			if (npending > 0) {
				rc = mp_settle(sh, mq, pub, pending, &npending, true);
				if (rc != ST_OK) {
					t->rc = rc;
					break;
				}
				continue;
			}
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
			rc = mp_emit(sh, pub, m, k, &out, &out_cap, &first, &last);
			if (rc != ST_OK)
				fprintf(stderr, "min_pipeline: thread %d: emit: %s\n", t->index, mq_errmsg(pub));
		}
		for (int i = 0; i < k; i++)
			json_decref(o[i]);
		if (rc != ST_OK) {
			t->rc = rc;
			break;
		}
		pending[npending++] = (struct mp_pending){ .tag = d[n - 1].tag, .first = first, .last = last, .n = n };
		for (int i = 0; i < n; i++)
			mq_delivery_release(mq, &d[i]);
	}
	while (t->rc == ST_OK && npending > 0) {
		int rc = mp_settle(sh, mq, pub, pending, &npending, true);
		if (rc != ST_OK)
			t->rc = rc;
	}
out:
	free(d);
	free(m);
	free(o);
	free(out);
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
	pthread_mutex_init(&sh.model_mu, NULL);
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
	if (atomic_load(&sh.model_overflow) > 0)
		fprintf(stderr,
		        "min_pipeline: the emit model lost track of %ld keys, orders, events or held events (out of"
		        " memory, or more held events of one order than it keeps): the emitted count is short\n",
		        atomic_load(&sh.model_overflow));
	free(ts);
	mp_model_close(&sh);
	pthread_mutex_destroy(&sh.model_mu);
	pthread_mutex_destroy(&sh.mu);
	db_global_end();
	cfg_free(&conf);
	return code;
}
