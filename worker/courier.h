/*
 * courier.h - one thread per HTTP destination of the running definition:
 * it delivers the destination's outbox rows (common/outbox_http.h) and
 * keeps its gauges, so a slow or failing endpoint holds back nothing but
 * its own rows.
 *
 * Ownership: pool_main fills a struct courier with courier_init and
 * starts courier_main on it; the thread owns its database handle and its
 * HTTP client; courier_free (after the join) releases the destination.
 */
#ifndef INBOX_COURIER_H
#define INBOX_COURIER_H

#include "http_call.h"
#include "pool.h"

struct outbox_http;

struct courier {
	struct pool_thread t;  /* index -2 - dest: not a worker, not the janitor */
	int dest;              /* the definition's destination index */
	const char *dname;     /* its name (the definition's) */
	struct http_dest http; /* resolved at start */
	struct pool_db d;
	struct outbox_http *ob;
};

/* Resolve destination dest of the running definition for c: ST_OK, or an
 * error said in one line on stderr (preflight resolved it already, so
 * only a variable or file changed meanwhile). */
int courier_init(struct courier *c, int dest, const struct cfg *conf, struct pool_shared *shared);
void *courier_main(void *arg);
void courier_free(struct courier *c);

#endif
