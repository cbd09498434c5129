/*
 * pub.c - publishing with publisher confirms on a struct mq (see pub.h).
 *
 * Why it is shaped so: every publish of the worker waits for the broker's
 * ack before the message it came from is acked (a dead-letter must land
 * before the original goes), and the outbox relay pipelines many but must
 * settle each row by its own outcome.  So each publish in confirm mode
 * gets a sequence number and a slot in a ring of MQ_TRACK_MAX outcomes,
 * and the wait reads frames until every tracked publish is settled, not
 * merely until the high-water mark passes it.
 */
#include "pub.h"

#include <amqp.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "mq_private.h"
#include "props.h"
#include "status.h"

void pub_state_init(struct pub_state *s)
{
	memset(s, 0, sizeof *s);
	s->next_seq = 1;
}

int mq_confirm_select(struct mq *m)
{
	if (m->pub.confirming)
		return ST_OK;
	amqp_confirm_select(m->conn, MQ_CHANNEL);
	if (mq_rpc(m, "confirm.select") != ST_OK)
		return ST_ERR_MQ_CONN;
	m->pub.confirming = true;
	return ST_OK;
}

int mq_publish(struct mq *m, const struct mq_message *msg)
{
	struct props_out o;
	amqp_bytes_t body = { .len = msg->len, .bytes = (void *)msg->body };
	int rc;

	if (m->broken)
		return ST_ERR_MQ_CONN;
	rc = props_build(&o, msg);
	if (rc == ST_OK) {
		rc = mq_status(m, amqp_basic_publish(m->conn, MQ_CHANNEL, mq_b(msg->exchange),
		                                     mq_b(msg->routing_key), msg->mandatory, 0, &o.p, body),
		               "basic.publish");
		if (rc == ST_ERR_TIMEOUT)
			rc = mq_fail(m, ST_ERR_MQ_CONN, "basic.publish", "timed out");
		if (rc == ST_OK && m->pub.confirming) {
			struct pub_track *t = &m->pub.track[m->pub.next_seq % MQ_TRACK_MAX];
			if (t->seq != 0 && t->outcome == MQ_OUTCOME_PENDING)
				m->pub.track_pending--; /* overwritten: no longer tracked */
			*t = (struct pub_track){ .seq = m->pub.next_seq, .outcome = MQ_OUTCOME_PENDING };
			m->pub.track_pending++;
			if (msg->mandatory)
				m->pub.mandatory_seq = m->pub.next_seq;
			m->pub.next_seq++;
		}
	}
	props_out_release(&o);
	return rc;
}

int mq_publish_at(struct mq *m, const struct mq_message *msg, int64_t published_us)
{
	struct mq_message stamped = *msg;

	stamped.published_us = published_us;
	return mq_publish(m, &stamped);
}

uint64_t mq_unconfirmed(const struct mq *m)
{
	return m->pub.next_seq - 1 - m->pub.confirmed;
}

uint64_t mq_next_seq(const struct mq *m)
{
	return m->pub.next_seq;
}

enum mq_outcome mq_outcome(const struct mq *m, uint64_t seq)
{
	const struct pub_track *t = &m->pub.track[seq % MQ_TRACK_MAX];

	if (seq == 0 || t->seq != seq)
		return MQ_OUTCOME_UNKNOWN;
	if (t->returned)
		return MQ_OUTCOME_RETURNED;
	return (enum mq_outcome)t->outcome;
}

/* Settle one tracked publish (a no-op for one settled or no longer tracked). */
static void pub_track_settle(struct mq *m, uint64_t seq, enum mq_outcome o)
{
	struct pub_track *t = &m->pub.track[seq % MQ_TRACK_MAX];

	if (t->seq != seq || t->outcome != MQ_OUTCOME_PENDING)
		return;
	t->outcome = (uint8_t)o;
	m->pub.track_pending--;
}

/* An ack or nack for tag, or with multiple for every publish up to tag. */
static void pub_track_confirm(struct mq *m, uint64_t tag, bool multiple, enum mq_outcome o)
{
	uint64_t from = tag;

	if (m->pub.track_pending == 0)
		return;
	if (multiple)
		from = tag >= MQ_TRACK_MAX ? tag - MQ_TRACK_MAX + 1 : 1;
	for (uint64_t seq = from; seq <= tag; seq++)
		pub_track_settle(m, seq, o);
}

/* Take one frame read on the publisher: an ack or nack (for tag, or with
 * multiple for every publish up to it), a basic.return (an unroutable
 * mandatory publish, followed by its ack, so it is remembered as a
 * failure), or the close that ends the channel.  Each tracked publish gets
 * its own outcome (mq_outcome). */
static int pub_take_frame(struct mq *m, const amqp_frame_t *f)
{
	if (f->frame_type != AMQP_FRAME_METHOD)
		return ST_OK; /* header/body of a returned message */
	switch (f->payload.method.id) {
	case AMQP_BASIC_ACK_METHOD: {
		const amqp_basic_ack_t *a = f->payload.method.decoded;
		m->pub.confirmed = a->multiple ? a->delivery_tag : (a->delivery_tag > m->pub.confirmed ? a->delivery_tag : m->pub.confirmed);
		/* Single acks may arrive out of order only for tags above
		 * confirmed; RabbitMQ confirms in order per channel, so the
		 * high-water mark is exact.  The tracked outcomes do not
		 * rely on it. */
		pub_track_confirm(m, a->delivery_tag, a->multiple != 0, MQ_OUTCOME_ACKED);
		return ST_OK;
	}
	case AMQP_BASIC_NACK_METHOD: {
		const amqp_basic_nack_t *a = f->payload.method.decoded;
		m->pub.confirmed = a->delivery_tag > m->pub.confirmed ? a->delivery_tag : m->pub.confirmed;
		m->pub.nacked = true;
		pub_track_confirm(m, a->delivery_tag, a->multiple != 0, MQ_OUTCOME_NACKED);
		return ST_OK;
	}
	case AMQP_BASIC_RETURN_METHOD: {
		/* No delivery tag: the latest mandatory publish (see mq.h).
		 * Its ack follows and settles it. */
		struct pub_track *t = &m->pub.track[m->pub.mandatory_seq % MQ_TRACK_MAX];
		if (m->pub.mandatory_seq != 0 && t->seq == m->pub.mandatory_seq && t->outcome == MQ_OUTCOME_PENDING)
			t->returned = true;
		m->pub.nacked = true;
		return ST_OK;
	}
	case AMQP_CHANNEL_CLOSE_METHOD:
	case AMQP_CONNECTION_CLOSE_METHOD: {
		/* Unlike an RPC's reply (mq.c, mq_close_code), a
		 * connection.close here is a failed connection whatever
		 * its code: what was in flight is unknown. */
		char buf[200];

		mq_close_line(&f->payload.method, buf, sizeof buf);
		return mq_fail(m, f->payload.method.id == AMQP_CHANNEL_CLOSE_METHOD ? ST_ERR_MQ : ST_ERR_MQ_CONN,
		               "confirm", buf);
	}
	default:
		return ST_OK;
	}
}

/* Read frames until every publish is settled. */
int mq_wait_confirms(struct mq *m, int timeout_ms)
{
	struct timespec start;
	int rc = ST_OK;

	if (!m->pub.confirming)
		return ST_OK;
	if (clock_gettime(CLOCK_MONOTONIC, &start) != 0)
		return mq_fail(m, ST_ERR_MQ_CONN, "confirm", "clock_gettime failed");
	while (m->pub.confirmed + 1 < m->pub.next_seq || m->pub.track_pending > 0) {
		amqp_frame_t f;
		struct timeval tv;
		long left;
		int st;

		rc = mq_ms_left(m, &start, timeout_ms, "confirm", &left);
		if (rc != ST_OK)
			return rc;
		if (left <= 0)
			return mq_fail(m, ST_ERR_MQ_CONN, "confirm", "no confirm within the time-out");
		tv.tv_sec = left / 1000;
		tv.tv_usec = (left % 1000) * 1000;
		amqp_maybe_release_buffers(m->conn);
		st = amqp_simple_wait_frame_noblock(m->conn, &f, &tv);
		if (st != AMQP_STATUS_OK) {
			rc = mq_status(m, st, "confirm");
			return rc == ST_ERR_TIMEOUT ? mq_fail(m, ST_ERR_MQ_CONN, "confirm", "timed out") : rc;
		}
		rc = pub_take_frame(m, &f);
		if (rc != ST_OK)
			return rc;
	}
	if (m->pub.nacked) {
		m->pub.nacked = false;
		snprintf(m->err, sizeof m->err, "publish nacked or returned unroutable");
		return ST_ERR_MQ_NACK;
	}
	return rc;
}

int mq_poll_confirms(struct mq *m)
{
	if (!m->pub.confirming || m->broken)
		return m->broken ? ST_ERR_MQ_CONN : ST_OK;
	while (m->pub.confirmed + 1 < m->pub.next_seq || m->pub.track_pending > 0) {
		amqp_frame_t f;
		struct timeval tv = { 0, 0 };
		int st, rc;

		amqp_maybe_release_buffers(m->conn);
		st = amqp_simple_wait_frame_noblock(m->conn, &f, &tv);
		if (st == AMQP_STATUS_TIMEOUT)
			break; /* nothing more has come */
		if (st != AMQP_STATUS_OK)
			return mq_status(m, st, "confirm");
		rc = pub_take_frame(m, &f);
		if (rc != ST_OK)
			return rc;
	}
	/* The outcomes are per publish (mq_outcome); a later wait must not
	 * report this poll's nack as its own. */
	m->pub.nacked = false;
	return ST_OK;
}

int mq_keepalive(struct mq *m)
{
	if (m->broken)
		return ST_ERR_MQ_CONN;
	for (;;) {
		amqp_frame_t f;
		struct timeval tv = { 0, 0 };
		int st, rc;

		amqp_maybe_release_buffers(m->conn);
		st = amqp_simple_wait_frame_noblock(m->conn, &f, &tv);
		if (st == AMQP_STATUS_TIMEOUT) {
			m->pub.nacked = false; /* as mq_poll_confirms: outcomes are per publish */
			return ST_OK;          /* nothing more has come */
		}
		if (st != AMQP_STATUS_OK)
			return mq_status(m, st, "keepalive");
		/* A confirm that came is settled as mq_poll_confirms would;
		 * a close ends the connection. */
		rc = pub_take_frame(m, &f);
		if (rc != ST_OK)
			return rc;
	}
}

int mq_publish_confirmed(struct mq *m, const struct mq_message *msg, int timeout_ms)
{
	int rc = mq_confirm_select(m);

	if (rc == ST_OK)
		rc = mq_publish(m, msg);
	if (rc == ST_OK)
		rc = mq_wait_confirms(m, timeout_ms);
	return rc;
}
