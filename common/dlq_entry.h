/*
 * dlq_entry.h - a dead letter read into what it says about itself, for
 * `inbox-worker dlq` (worker/cmd_dlq.c), which lists, shows, judges and
 * chooses dead letters by it.
 *
 * A dead letter is read as the worker reads a delivery (envelope.h, then
 * msg.h): one that passes today's checks is known by its own key, type and
 * order; one that fails is still listed by what can be read of it (the
 * envelope's fields, the AMQP message-id and type, the body's JSON read
 * leniently).  Why, when and after how many deliveries it was
 * dead-lettered come from our headers (deadletter.h) or, for a message the
 * broker dead-lettered itself (a delivery limit), from its first x-death
 * entry.  Every id and name taken from the message is cut to printable
 * ASCII (dlq_entry_text): it ends up in one line of output.
 *
 * Ownership: the caller owns struct dlq_entry (it is large: a struct msg
 * inside); dlq_entry_read allocates its props and props_text, also when it
 * fails, and dlq_entry_free frees them (again harmless).  The delivery is
 * only read: nothing in the entry points into it.
 */
#ifndef INBOX_DLQ_ENTRY_H
#define INBOX_DLQ_ENTRY_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "mq.h"
#include "msg.h"

/* What one dead letter says about itself. */
struct dlq_entry {
	long position;                       /* 1-based place in the queue */
	char message_id[MSG_WIDE_ID_MAX + 1]; /* "-" when unreadable */
	char source[MSG_WIDE_SOURCE_MAX + 1];
	char type[MSG_TYPE_NAME_MAX + 1];
	char order_id[MSG_ORDER_ID_MAX + 1];
	char reason[40];
	char detail[700];
	char at[40];                         /* when it was dead-lettered, "" unknown */
	int64_t at_s;
	int64_t deliveries;                  /* -1 unknown */
	int64_t replays;
	int64_t dlq_count;                   /* the DLQ's own x-delivery-count (a quorum DLQ) */
	enum msg_reason parse;               /* the body under today's rules */
	struct msg m;
	json_t *props;                       /* the AMQP properties as mq_delivery_props_json */
	char *props_text;
};

/* Fill e from a delivery at position (1-based) in the queue, by conf's
 * envelope settings, body limit and delivery limit.  ST_OK, or
 * ST_ERR_NOMEM only. */
int dlq_entry_read(const struct cfg *conf, const struct mq_delivery *d, long position, struct dlq_entry *e);

/* Free what dlq_entry_read allocated (NULL-safe: e may be freed twice or
 * filled again). */
void dlq_entry_free(struct dlq_entry *e);

/* Printable ASCII, cut to cap (dst always terminated): s's len bytes with
 * every other byte '?', for a name from a message (a routing key) that
 * goes into one line of output. */
void dlq_entry_text(char *dst, size_t cap, const char *s, size_t len);

#endif
