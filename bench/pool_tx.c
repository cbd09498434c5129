/*
 * pool_tx.c - the pool's own transaction without a broker: N threads run
 * inbox_apply (claim, order lock, state machine, order row, ledger row,
 * outbox rows, commit) over synthetic orders going through the happy path,
 * for a fixed time.  Set against bare_tx it shows what the database side of
 * our guarantees costs, apart from the broker.
 *
 *   pool_tx --threads N [--seconds S] [--batch B]   (connection from INBOX_DB_URL)
 *
 * Prints one line: `pool_tx threads=N tx=... seconds=... tps=...`.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cfg.h"
#include "db.h"
#include "inbox.h"
#include "log.h"
#include "msg.h"
#include "status.h"

struct pt_thread {
	pthread_t th;
	int index;
	const struct cfg *conf;
	double end;
	long run;
	int batch;
	uint64_t done;
	int rc;
};

static double pt_now(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
		return 0;
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static const char *const pt_types[4] = { "OrderCreated", "PaymentAuthorized", "InventoryReserved",
                                         "ShipmentCreated" };

static void *pt_main(void *arg)
{
	struct pt_thread *t = arg;
	struct db *db = NULL;
	struct inbox *ib = NULL;
	struct msg *m = calloc((size_t)t->batch, sizeof *m);
	struct inbox_in *in = calloc((size_t)t->batch, sizeof *in);
	struct inbox_result *res = calloc((size_t)t->batch, sizeof *res);
	char body[512];

	db_thread_init();
	t->rc = m != NULL && in != NULL && res != NULL ? db_open(&db, &t->conf->db) : ST_ERR_NOMEM;
	if (t->rc == ST_OK)
		t->rc = inbox_open(&ib, db, t->conf);
	if (t->rc != ST_OK) {
		fprintf(stderr, "pool_tx: thread %d: %s\n", t->index, db ? db_errmsg(db) : st_strerror(t->rc));
		goto out;
	}
	for (uint64_t i = 0; pt_now() < t->end;) {
		int n;
		for (n = 0; n < t->batch; n++, i++) {
			int len = snprintf(body, sizeof body,
			                   "{\"message_id\":\"pt-%ld-%d-%llu\",\"source\":\"bench\",\"type\":\"%s\","
			                   "\"order_id\":\"pt-%ld-%d-o%llu\",\"data\":{\"amount_cents\":4200}}",
			                   t->run, t->index, (unsigned long long)i, pt_types[i % 4], t->run, t->index,
			                   (unsigned long long)(i / 4));
			if (msg_parse(body, (size_t)len, 65536, NULL, &m[n]) != MSG_REASON_NONE) {
				t->rc = ST_ERR_INVALID;
				goto out;
			}
		}
		for (int k = 0; k < n; k++)
			in[k] = (struct inbox_in){ .msg = &m[k], .routing_key = "order.bench" };
		t->rc = inbox_run(ib, in, n, res);
		if (t->rc != ST_OK) {
			fprintf(stderr, "pool_tx: thread %d: %s\n", t->index, db_errmsg(db));
			goto out;
		}
		t->done += (uint64_t)n;
	}
out:
	inbox_close(&ib);
	db_close(&db);
	free(m);
	free(in);
	free(res);
	db_thread_end();
	return NULL;
}

int main(int argc, char **argv)
{
	struct cfg conf;
	char err[512];
	char *cargv[] = { argv[0], NULL };
	long threads = 4, seconds = 10, batch = 1;
	struct pt_thread *t;
	uint64_t total = 0;
	double start, took;
	int rc = 0;

	for (int i = 1; i < argc; i++) {
		long *dst = NULL;
		char *end;
		if (strcmp(argv[i], "--threads") == 0)
			dst = &threads;
		else if (strcmp(argv[i], "--seconds") == 0)
			dst = &seconds;
		else if (strcmp(argv[i], "--batch") == 0)
			dst = &batch;
		if (dst == NULL || i + 1 >= argc) {
			fprintf(stderr, "usage: pool_tx [--threads N] [--seconds S] [--batch B]\n");
			return 2;
		}
		*dst = strtol(argv[++i], &end, 10);
		if (*end != '\0' || *dst < 1 || *dst > 500) {
			fprintf(stderr, "pool_tx: %s: want 1..500\n", argv[i - 1]);
			return 2;
		}
	}
	if (cfg_load(&conf, 1, cargv, err, sizeof err) != CFG_OK) {
		fprintf(stderr, "pool_tx: %s\n", err);
		return 2;
	}
	log_setup(LOG_LEVEL_WARN, LOG_FORMAT_TEXT);
	if (db_global_init() != ST_OK || (t = calloc((size_t)threads, sizeof *t)) == NULL) {
		cfg_free(&conf);
		return 1;
	}
	start = pt_now();
	for (long i = 0; i < threads; i++) {
		t[i] = (struct pt_thread){ .index = (int)i, .conf = &conf, .end = start + (double)seconds,
		                           .run = (long)time(NULL), .batch = (int)batch };
		if (pthread_create(&t[i].th, NULL, pt_main, &t[i]) != 0) {
			threads = i;
			rc = 1;
			break;
		}
	}
	for (long i = 0; i < threads; i++) {
		pthread_join(t[i].th, NULL);
		total += t[i].done;
		if (t[i].rc != ST_OK)
			rc = 1;
	}
	took = pt_now() - start;
	printf("pool_tx threads=%ld batch=%ld tx=%llu seconds=%.2f tps=%.0f\n", threads, batch,
	       (unsigned long long)total, took, (double)total / took);
	free(t);
	db_global_end();
	cfg_free(&conf);
	return rc;
}
