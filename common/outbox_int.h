/*
 * outbox_int.h - what the outbox's files share and nothing else sees: the
 * stored row's limits and the reading back of its headers (outbox.c
 * writes and relays rows, outbox_dispatch.c publishes their copies).
 */
#ifndef INBOX_OUTBOX_INT_H
#define INBOX_OUTBOX_INT_H

#include <stdbool.h>

#include <jansson.h>

#include "mq.h"
#include "status.h"

#define OUTBOX_CONFIRM_MS 10000
#define OUTBOX_HEADERS_MAX 16
#define OUTBOX_SHORTSTR_MAX 255 /* an AMQP short string */

/* Extra headers as stored, a flat JSON object of strings, into h (at most
 * cap); *keep owns the strings (json_decref it).  The count, or -1 when
 * they are not such an object. */
int outbox_headers(const char *json, json_t **keep, struct mq_header *h, int cap);

/* A broker error, not a nack (which is a row's own outcome). */
static inline bool outbox_broker_error(int rc)
{
	return rc != ST_OK && rc != ST_ERR_MQ_NACK;
}

#endif
