/*
 * outbox.h - the relay that publishes outbox rows with publisher confirms.
 *
 * Rows are claimed with SELECT ... FOR UPDATE SKIP LOCKED, so several relays
 * (threads or processes) share the work without publishing a row twice in
 * the normal case; a row is marked sent only after the broker confirmed it.
 * A crash between the confirm and the commit re-publishes the row later with
 * the same message-id, which downstream consumers deduplicate.
 *
 * Ownership: outbox_open prepares statements on a caller-owned db; the mq
 * publisher is borrowed per call.
 */
#ifndef INBOX_OUTBOX_H
#define INBOX_OUTBOX_H

#include "cfg.h"
#include "db.h"
#include "mq.h"

struct outbox;

int outbox_open(struct outbox **out, struct db *db, const struct cfg *conf);
void outbox_close(struct outbox **ob);

/* Publish up to limit pending rows; *sent gets how many were confirmed and
 * marked.  Broker errors roll back (rows stay pending). */
int outbox_relay(struct outbox *ob, struct mq *pub, int limit, int *sent);

/* Pending rows (for the inbox_outbox_pending gauge). */
int outbox_pending(struct outbox *ob, int64_t *n);

#endif
