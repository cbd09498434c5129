/*
 * amqpx.h - the few AMQP operations inbox-loadgen needs that common/mq.h
 * does not offer: a confirmed publish with a header whose value is a byte
 * array (the binary-header malformed class), and queue.bind / queue.unbind
 * (the chaos run unbinds the DLQ from the dead-letter exchange for a while;
 * rabbitmqctl has no unbind).
 *
 * Each call opens its own connection, does its one thing and closes it:
 * they are rare, and a fresh connection makes a retry after a broker
 * restart trivial.  Errors are described in err; nothing is kept.
 */
#ifndef INBOX_LG_AMQPX_H
#define INBOX_LG_AMQPX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cfg.h"

struct lgx_binary_message {
	const char *exchange;
	const char *routing_key;
	const char *message_id;
	const char *order_id;   /* a string header, as publish adds to every message */
	const void *body;
	size_t len;
	const char *bin_key;    /* header whose value is sent as field kind 'x' (bytes) */
	const void *bin_value;
	size_t bin_len;
	int64_t published_us;   /* > 0: the x-published-us header */
};

/* Publish mandatory and persistent, wait for the broker's confirm.
 * Returns 0, or -1 with err filled (connection lost, nacked, returned). */
int lgx_publish_binary(const struct cfg_amqp *a, const struct lgx_binary_message *msg, char *err, size_t errlen);

/* queue.bind (bind true) or queue.unbind.  Returns 0 or -1 with err. */
int lgx_queue_bind(const struct cfg_amqp *a, const char *queue, const char *exchange, const char *key, bool bind,
                   char *err, size_t errlen);

#endif
