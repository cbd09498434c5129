/*
 * gauge.h - figures /metrics shows that only the database knows: the
 * events held now for this consumer, across every process, and the age of
 * the oldest.  A process-local count could not say this: a hold is made
 * by one process and settled by whichever process next changes its order,
 * or by any janitor when it expires.  The janitor reads them once a
 * second, beside the outbox gauge (outbox_stats).
 *
 * Ownership: gauge_open prepares its statement on a caller-owned db, which
 * must outlive it; gauge_close frees it (NULL-safe, clears the pointer).
 */
#ifndef INBOX_GAUGE_H
#define INBOX_GAUGE_H

#include <stdint.h>

#include "cfg.h"
#include "db.h"

struct gauge;

int gauge_open(struct gauge **out, struct db *db, const struct cfg *conf);
void gauge_close(struct gauge **g);

/* The held events of this consumer now and the oldest one's age in
 * seconds (0 when none).  Ends its read-only transaction. */
int gauge_held(struct gauge *g, int64_t *n, double *oldest_s);

#endif
