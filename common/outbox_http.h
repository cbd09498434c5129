/*
 * outbox_http.h - the courier of one HTTP destination: the outbox rows
 * the definition routes there (destination = its name, migration 0019),
 * delivered by http_call.h with the row's message_id as the
 * Idempotency-Key, each settled on its own.
 *
 * A round leases the due rows of the destination as the relay leases
 * ours (leased_until, a committed write, so two couriers of a fleet never
 * call with the same row at once in the normal case), then calls with
 * each in id order and settles it:
 *
 *   delivered (2xx)       sent_at set;
 *   retry (408, 425, 429, 5xx, no answer) and attempts left
 *                         attempts + 1, next_attempt_at after a backoff
 *                         (half fixed, half jitter, doubling from 1 s to
 *                         60 s, never before Retry-After), last_error;
 *   refused (other 4xx), or INBOX_HTTP_MAX_ATTEMPTS reached
 *                         in one transaction: the row marked sent with
 *                         its last_error, and a dead-letter row (reason
 *                         delivery-failed, the status and the body's
 *                         first bytes in the detail, x-inbox-destination)
 *                         for the relay to publish to the DLX.
 *
 * One destination's courier is one thread (worker/courier.c), so a slow
 * or failing endpoint holds back only its own rows: our exchange's rows
 * are the relay's, other destinations have couriers of their own, and no
 * consuming thread waits for any call.  A crash between a 2xx and its
 * mark calls again with the same key after the lease runs out: the
 * destination deduplicates by it.
 *
 * Ownership: outbox_http_open prepares statements on a caller-owned db
 * (they die with it) and keeps conf and dest (borrowed, outliving it); it
 * owns its HTTP client and row buffers.
 */
#ifndef INBOX_OUTBOX_HTTP_H
#define INBOX_OUTBOX_HTTP_H

#include <stdatomic.h>
#include <stdint.h>

#include "cfg.h"
#include "db.h"
#include "http_call.h"

/* Rows a round takes, at most: each call may take the destination's
 * time-out, and the lease covers them all. */
#define OUTBOX_HTTP_ROUND_MAX 16

struct outbox_http;

struct outbox_http_round {
	int taken;
	int delivered;
	int retried;       /* failed, to be called again */
	int dead_lettered; /* refused, or out of attempts */
};

/* name: the destination's name in the rows and the metrics; index: its
 * place in the definition (metrics_delivery). */
int outbox_http_open(struct outbox_http **out, struct db *db, const struct cfg *conf, const char *name, int index,
                     const struct http_dest *dest);
void outbox_http_close(struct outbox_http **c);

/* A flag the round reads between calls (the pool's stop): once set, the
 * rows not called yet are given back (their lease ended) and the round
 * returns, so a stop waits for one call at most.  NULL: none. */
void outbox_http_set_stop(struct outbox_http *c, const atomic_bool *stop);

/* One round over up to limit due rows.  ST_OK (*r filled), or a database
 * error: the caller reconnects; a row called but not settled is called
 * again when its lease ran out. */
int outbox_http_round(struct outbox_http *c, int limit, struct outbox_http_round *r);

/* The destination's undelivered rows and the oldest one's age in
 * seconds (0 when none), for the gauges. */
int outbox_http_stats(struct outbox_http *c, int64_t *pending, double *oldest_s);

/* The wait before the next call after attempts failures (>= 1): half of
 * min(60 s, 1 s * 2^(attempts-1)) fixed and half jitter, raised to
 * Retry-After (retry_after_ms >= 0). */
long long outbox_http_backoff_ms(int64_t attempts, long long retry_after_ms, uint64_t *rng);

#endif
