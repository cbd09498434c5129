/*
 * dlq.h - the names of the headers a dead letter carries on the wire: what
 * the worker adds to its own dead-letter copies (worker/worker.c, the
 * outbox's in common/outbox.c) and what `inbox-worker dlq` reads back and
 * writes on replay (worker/cmd_dlq.c).  Only names: the command itself is
 * worker/cmd_dlq.{c,h}, outside the library.
 */
#ifndef INBOX_DLQ_H
#define INBOX_DLQ_H

/* The header a replayed copy carries: how often it was replayed.  Not an
 * x-inbox-* name, so that a worker's dead-letter copy keeps it. */
#define DLQ_HEADER_REPLAYS "x-replay-count"
/* Headers the worker adds to its own dead-letter copies besides
 * x-inbox-reason and x-inbox-detail (removed again on replay, as every
 * x-inbox-* header is). */
#define DLQ_HEADER_AT "x-inbox-dead-lettered-at"
#define DLQ_HEADER_DELIVERIES "x-inbox-delivery-count"

#endif
