/*
 * amqpx.c - raw rabbitmq-c for the two things common/mq.c and pub.c have no call
 * for (see amqpx.h).  One connection per call, channel 1, heartbeats off.
 */
#include "amqpx.h"

#include <amqp.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>

#include "mq.h"

#define LGX_CHANNEL 1
#define LGX_CONFIRM_TIMEOUT_S 30

static int lgx_reply(amqp_rpc_reply_t r, const char *what, char *err, size_t errlen)
{
	switch (r.reply_type) {
	case AMQP_RESPONSE_NORMAL:
		return 0;
	case AMQP_RESPONSE_LIBRARY_EXCEPTION:
		snprintf(err, errlen, "%s: %s", what, amqp_error_string2(r.library_error));
		return -1;
	case AMQP_RESPONSE_SERVER_EXCEPTION:
		if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
			amqp_connection_close_t *c = r.reply.decoded;
			snprintf(err, errlen, "%s: connection closed by broker: %u %.*s", what, c->reply_code,
			         (int)c->reply_text.len, (const char *)c->reply_text.bytes);
			return -1;
		}
		if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
			amqp_channel_close_t *c = r.reply.decoded;
			snprintf(err, errlen, "%s: channel closed by broker: %u %.*s", what, c->reply_code,
			         (int)c->reply_text.len, (const char *)c->reply_text.bytes);
			return -1;
		}
		snprintf(err, errlen, "%s: unexpected server method", what);
		return -1;
	default:
		snprintf(err, errlen, "%s: no reply", what);
		return -1;
	}
}

/* Connect, log in, open the channel.  NULL with err filled on failure. */
static amqp_connection_state_t lgx_open(const struct cfg_amqp *a, char *err, size_t errlen)
{
	amqp_connection_state_t c = amqp_new_connection();
	amqp_socket_t *sock;
	struct timeval tv = { .tv_sec = 10 };
	int st;

	if (c == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	sock = a->tls ? amqp_ssl_socket_new(c) : amqp_tcp_socket_new(c);
	if (sock == NULL) {
		snprintf(err, errlen, "cannot create a socket");
		goto fail;
	}
	st = amqp_socket_open_noblock(sock, a->host, a->port, &tv);
	if (st != AMQP_STATUS_OK) {
		snprintf(err, errlen, "connect: %s", amqp_error_string2(st));
		goto fail;
	}
	if (lgx_reply(amqp_login(c, a->vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, a->user, a->password), "login",
	              err, errlen) != 0)
		goto fail;
	if (amqp_channel_open(c, LGX_CHANNEL) == NULL) {
		(void)lgx_reply(amqp_get_rpc_reply(c), "channel.open", err, errlen);
		goto fail;
	}
	return c;
fail:
	/* Its failure would change nothing: the connection is gone either way. */
	(void)amqp_destroy_connection(c);
	return NULL;
}

static void lgx_close(amqp_connection_state_t c, bool polite)
{
	if (polite) {
		/* Failures here change nothing: the work is done or reported. */
		(void)amqp_channel_close(c, LGX_CHANNEL, AMQP_REPLY_SUCCESS);
		(void)amqp_connection_close(c, AMQP_REPLY_SUCCESS);
	}
	(void)amqp_destroy_connection(c);
}

int lgx_publish_binary(const struct cfg_amqp *a, const struct lgx_binary_message *msg, char *err, size_t errlen)
{
	amqp_connection_state_t c = lgx_open(a, err, errlen);
	amqp_basic_properties_t p;
	amqp_table_entry_t h[3];
	bool returned = false, polite = false;
	int n = 0, st, rc = -1;

	if (c == NULL)
		return -1;
	amqp_confirm_select(c, LGX_CHANNEL);
	if (lgx_reply(amqp_get_rpc_reply(c), "confirm.select", err, errlen) != 0)
		goto out;
	memset(&p, 0, sizeof p);
	p._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG |
	           AMQP_BASIC_HEADERS_FLAG;
	p.delivery_mode = AMQP_DELIVERY_PERSISTENT;
	p.content_type = amqp_cstring_bytes("application/json");
	p.message_id = amqp_cstring_bytes(msg->message_id);
	h[n].key = amqp_cstring_bytes("order_id");
	h[n].value.kind = AMQP_FIELD_KIND_UTF8;
	h[n++].value.value.bytes = amqp_cstring_bytes(msg->order_id);
	h[n].key = amqp_cstring_bytes(msg->bin_key);
	h[n].value.kind = AMQP_FIELD_KIND_BYTES;
	h[n].value.value.bytes.bytes = (void *)msg->bin_value;
	h[n++].value.value.bytes.len = msg->bin_len;
	if (msg->published_us > 0) {
		h[n].key = amqp_cstring_bytes(MQ_HEADER_PUBLISHED_US);
		h[n].value.kind = AMQP_FIELD_KIND_I64;
		h[n++].value.value.i64 = msg->published_us;
	}
	p.headers.num_entries = n;
	p.headers.entries = h;
	st = amqp_basic_publish(c, LGX_CHANNEL, amqp_cstring_bytes(msg->exchange), amqp_cstring_bytes(msg->routing_key),
	                        1, 0, &p, (amqp_bytes_t){ .len = msg->len, .bytes = (void *)msg->body });
	if (st != AMQP_STATUS_OK) {
		snprintf(err, errlen, "basic.publish: %s", amqp_error_string2(st));
		goto out;
	}
	for (;;) {
		amqp_frame_t f;
		struct timeval tv = { .tv_sec = LGX_CONFIRM_TIMEOUT_S };

		st = amqp_simple_wait_frame_noblock(c, &f, &tv);
		if (st != AMQP_STATUS_OK) {
			snprintf(err, errlen, "confirm: %s", amqp_error_string2(st));
			goto out;
		}
		if (f.frame_type != AMQP_FRAME_METHOD)
			continue; /* header and body of a returned message */
		if (f.payload.method.id == AMQP_BASIC_RETURN_METHOD) {
			returned = true;
		} else if (f.payload.method.id == AMQP_BASIC_ACK_METHOD) {
			if (returned) {
				snprintf(err, errlen, "returned unroutable");
				goto out;
			}
			break;
		} else if (f.payload.method.id == AMQP_BASIC_NACK_METHOD) {
			snprintf(err, errlen, "nacked by the broker");
			goto out;
		} else if (f.payload.method.id == AMQP_CHANNEL_CLOSE_METHOD ||
		           f.payload.method.id == AMQP_CONNECTION_CLOSE_METHOD) {
			snprintf(err, errlen, "closed by the broker while waiting for the confirm");
			goto out;
		}
	}
	polite = true;
	rc = 0;
out:
	lgx_close(c, polite);
	return rc;
}

int lgx_queue_bind(const struct cfg_amqp *a, const char *queue, const char *exchange, const char *key, bool bind,
                   char *err, size_t errlen)
{
	amqp_connection_state_t c = lgx_open(a, err, errlen);
	int rc;

	if (c == NULL)
		return -1;
	if (bind)
		(void)amqp_queue_bind(c, LGX_CHANNEL, amqp_cstring_bytes(queue), amqp_cstring_bytes(exchange),
		                      amqp_cstring_bytes(key), amqp_empty_table);
	else
		(void)amqp_queue_unbind(c, LGX_CHANNEL, amqp_cstring_bytes(queue), amqp_cstring_bytes(exchange),
		                        amqp_cstring_bytes(key), amqp_empty_table);
	/* The decoded reply is read through the RPC reply, not the return value. */
	rc = lgx_reply(amqp_get_rpc_reply(c), bind ? "queue.bind" : "queue.unbind", err, errlen);
	lgx_close(c, rc == 0);
	return rc;
}
