/*
 * bare_tx.c - ceiling (a) of the benchmark: the inbox transaction alone, no
 * broker.  N threads, one connection each, run bench_tx_run on synthetic
 * messages for a fixed time; each thread works on its own orders so the
 * figure is the database's, not lock contention's.
 *
 *   bare_tx --threads N [--seconds S]      (connection from INBOX_DB_URL)
 *
 * Prints one line: `bare_tx threads=N tx=... seconds=... tps=...`.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_tx.h"
#include "cfg.h"
#include "log.h"

struct bt_thread {
	pthread_t th;
	int index;
	const struct cfg *conf;
	double end;
	long run;
	uint64_t done;
	int rc;
};

static double bt_now(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
		return 0;
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *bt_main(void *arg)
{
	struct bt_thread *t = arg;
	struct bench_tx tx;
	char id[96], order[64];
	struct bench_msg m = { .consumer = "bench", .source = "bench", .message_id = id, .type = "OrderCreated",
	                       .order_id = order };

	db_thread_init();
	memset(m.sha_hex, 'a', 64);
	m.sha_hex[64] = '\0';
	t->rc = bench_tx_open(&tx, &t->conf->db);
	if (t->rc != ST_OK) {
		fprintf(stderr, "bare_tx: thread %d: %s\n", t->index, tx.db ? db_errmsg(tx.db) : st_strerror(t->rc));
		goto out;
	}
	for (uint64_t i = 0; bt_now() < t->end; i++) {
		snprintf(id, sizeof id, "bt-%ld-%d-%llu", t->run, t->index, (unsigned long long)i);
		snprintf(order, sizeof order, "bt-%ld-%d-o%llu", t->run, t->index, (unsigned long long)(i % 1000));
		t->rc = bench_tx_run(&tx, &m);
		if (t->rc != ST_OK && t->rc != ST_ERR_DB_DEADLOCK && t->rc != ST_ERR_DB_LOCK_TIMEOUT) {
			fprintf(stderr, "bare_tx: thread %d: %s\n", t->index, db_errmsg(tx.db));
			break;
		}
		if (t->rc == ST_OK)
			t->done++;
		t->rc = ST_OK;
	}
out:
	bench_tx_close(&tx);
	db_thread_end();
	return NULL;
}

int main(int argc, char **argv)
{
	struct cfg conf;
	char err[256];
	char *cargv[] = { argv[0], NULL };
	long threads = 4, seconds = 10;
	struct bt_thread *ts;
	uint64_t total = 0;
	double t0, dt;
	int code = 0;

	for (int i = 1; i < argc; i++) {
		long *dst = NULL;
		if (strcmp(argv[i], "--threads") == 0)
			dst = &threads;
		else if (strcmp(argv[i], "--seconds") == 0)
			dst = &seconds;
		if (dst == NULL || i + 1 >= argc || cfg_parse_long(argv[++i], 1, 1024, dst, err, sizeof err) != 0) {
			fprintf(stderr, "usage: bare_tx [--threads N] [--seconds S]\n");
			return 2;
		}
	}
	if (cfg_load(&conf, 1, cargv, err, sizeof err) != CFG_OK) {
		fprintf(stderr, "bare_tx: %s\n", err);
		return 2;
	}
	log_setup(LOG_LEVEL_WARN, LOG_FORMAT_TEXT);
	if (db_global_init() != ST_OK)
		return 1;
	ts = calloc((size_t)threads, sizeof *ts);
	if (ts == NULL)
		return 1;
	t0 = bt_now();
	for (long i = 0; i < threads; i++) {
		ts[i] = (struct bt_thread){ .index = (int)i, .conf = &conf, .end = t0 + (double)seconds, .run = (long)time(NULL) };
		if (pthread_create(&ts[i].th, NULL, bt_main, &ts[i]) != 0) {
			fprintf(stderr, "bare_tx: pthread_create failed\n");
			return 1;
		}
	}
	for (long i = 0; i < threads; i++) {
		pthread_join(ts[i].th, NULL);
		total += ts[i].done;
		if (ts[i].rc != ST_OK)
			code = 1;
	}
	dt = bt_now() - t0;
	printf("bare_tx threads=%ld tx=%llu seconds=%.2f tps=%.0f\n", threads, (unsigned long long)total, dt,
	       (double)total / dt);
	free(ts);
	db_global_end();
	cfg_free(&conf);
	return code;
}
