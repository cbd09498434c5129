/*
 * courier.c - see courier.h.  Rounds while they come back full, else a
 * wait of COURIER_IDLE_MS: rows of a destination reach it within that of
 * their commit (the committing thread does not hand them over; the row is
 * the courier's at once, claim NULL), and rows backing off when they are
 * due.
 */
#include "courier.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "aggregate.h"
#include "lifecycle_dest.h"
#include "log.h"
#include "metrics.h"
#include "outbox_http.h"
#include "status.h"

#define COURIER_IDLE_MS 100
#define COURIER_STATS_MS 1000

int courier_init(struct courier *c, int dest, const struct cfg *conf, struct pool_shared *shared)
{
	const struct lc_def *def = agg_current()->def;
	char err[600];
	int rc;

	memset(c, 0, sizeof *c);
	c->t.index = -2 - dest;
	c->t.conf = conf;
	c->t.shared = shared;
	c->t.seed = (unsigned)getpid() ^ (unsigned)(dest * 2654435761u);
	c->dest = dest;
	c->dname = def->dests[dest].name;
	snprintf(c->t.name, sizeof c->t.name, "inbox-worker pid=%d courier=%.20s", (int)getpid(), c->dname);
	rc = lc_dest_resolve(def, dest, &c->http, err, sizeof err);
	if (rc != ST_OK)
		fprintf(stderr, "inbox-worker: %s\n", err);
	return rc;
}

void courier_free(struct courier *c)
{
	http_dest_free(&c->http);
}

static void courier_down(struct courier *c)
{
	outbox_http_close(&c->ob);
	pool_db_close(&c->d);
}

void *courier_main(void *arg)
{
	struct courier *c = arg;
	int64_t last_stats = 0;
	char shown[512];

	pool_beat_bind(&c->t);
	db_thread_init();
	(void)http_dest_format(&c->http, shown, sizeof shown);
	LOG(LOG_LEVEL_INFO, "courier started", LOG_S("destination", c->dname), LOG_S("to", shown));
	while (!atomic_load(&pool_stop)) {
		struct outbox_http_round r = { 0 };
		int rc;

		pool_beat();
		if (pool_thread_ends(&c->t, pool_db_up(&c->t, &c->d, NULL, NULL)))
			break;
		if (c->ob == NULL && outbox_http_open(&c->ob, c->d.db, c->t.conf, c->dname, c->dest, &c->http) != ST_OK) {
			LOG(LOG_LEVEL_WARN, "courier cannot prepare its statements", LOG_S("destination", c->dname),
			    LOG_S("error", db_errmsg(c->d.db)));
			courier_down(c);
			pool_sleep_ms(1000);
			continue;
		}
		outbox_http_set_stop(c->ob, &pool_stop);
		rc = outbox_http_round(c->ob, OUTBOX_HTTP_ROUND_MAX, &r);
		if (rc != ST_OK) {
			LOG(LOG_LEVEL_WARN, "courier round interrupted; its rows are called again", LOG_S("destination", c->dname),
			    LOG_S("error", db_errmsg(c->d.db)));
			courier_down(c);
			pool_sleep_ms(pool_backoff_ms(&c->t, 1, 200));
			continue;
		}
		if (pool_now_ms() - last_stats >= COURIER_STATS_MS) {
			int64_t pending;
			double oldest;

			last_stats = pool_now_ms();
			if (outbox_http_stats(c->ob, &pending, &oldest) == ST_OK)
				metrics_destination_backlog(c->dest, pending, oldest);
		}
		if (r.taken < OUTBOX_HTTP_ROUND_MAX)
			pool_sleep_ms(COURIER_IDLE_MS);
	}
	courier_down(c);
	db_thread_end();
	return NULL;
}
