/*
 * test_mq_live.c - the mq_ boundary against the stack's RabbitMQ, without
 * the worker: opening (and the two ways it fails), publishing with
 * confirms (pub.c) and the outcome of each publish — acked, returned
 * unroutable, nacked by a full queue, too old to be tracked — and the
 * properties a publish restores from saved JSON (props.c) as a consumer
 * reads them back.  Every test asserts what the broker holds afterwards.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "itest.h"
#include "mq.h"
#include "status.h"

#define Q_MAIN "itest.mqlive"
#define Q_FULL "itest.mqlive.full"
/* Publishes go through the default exchange (routing key = queue name),
 * which no other suite binds anything to, so that what is unroutable here
 * stays so.  The queues are bound to orders.out only because
 * mq_queue_declare_bind binds; nothing is published there. */
#define RK_MAIN Q_MAIN
#define RK_FULL Q_FULL
#define RK_NOWHERE "itest.mqlive.nowhere"

/* Our queue, declared afresh and empty. */
static struct mq *live_open(void)
{
	struct mq *m = itest_mq();

	cr_assert_eq(mq_queue_delete(m, Q_MAIN), ST_OK, "%s", mq_errmsg(m));
	cr_assert_eq(mq_queue_declare_bind(m, Q_MAIN, itest_cfg()->out_exchange, "mqlive.main", true), ST_OK, "%s",
	             mq_errmsg(m));
	return m;
}

static struct mq_message live_msg(const char *rk, const char *body)
{
	struct mq_message msg = {
		.exchange = "",
		.routing_key = rk,
		.body = body,
		.len = strlen(body),
	};
	return msg;
}

/* The messages in queue now (a passive declare). */
static uint32_t live_depth(struct mq *m, const char *queue)
{
	uint32_t n = 0;

	cr_assert_eq(mq_queue_counts(m, queue, &n, NULL), ST_OK, "%s", mq_errmsg(m));
	return n;
}

static void live_stack(const char *args)
{
	const char *stack = getenv("INBOX_STACK");
	char cmd[1024];

	cr_assert_not_null(stack, "INBOX_STACK is not set (eval \"$(scripts/stack env)\")");
	snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>&1", stack, args);
	cr_assert_eq(system(cmd), 0, "failed: %s", cmd);
}

Test(mq_live, a_refused_login_is_access_and_a_closed_port_is_a_connection_fault)
{
	struct cfg_amqp bad = itest_cfg()->amqp;
	struct mq *m = NULL;
	char why[256], wrong[] = "not-the-password";

	bad.next = NULL;
	bad.password = wrong;
	cr_assert_eq(mq_open_why(&m, &bad, 0, "itest-mqlive", why, sizeof why), ST_ERR_ACCESS, "%s", why);
	cr_assert_null(m);
	cr_assert_not_null(strstr(why, "403"), "the broker's words: %s", why);
	cr_assert_null(strstr(why, "not-the-password"), "no password in: %s", why);

	bad.password = itest_cfg()->amqp.password;
	bad.port = 1; /* nothing listens on tcpmux here */
	cr_assert_eq(mq_open_why(&m, &bad, 0, "itest-mqlive", why, sizeof why), ST_ERR_MQ_CONN, "%s", why);
	cr_assert_null(m);
	cr_assert_str_eq(why, "connect: connection refused");
}

/* A list of nodes: the dead first node is passed over, *node says which
 * one answered, and a refused login ends the tour at once. */
Test(mq_live, open_from_moves_on_to_the_node_that_answers)
{
	struct cfg_amqp dead = itest_cfg()->amqp, live = itest_cfg()->amqp;
	struct mq *m = NULL;
	int node = 0;

	live.next = NULL;
	dead.port = 1;
	dead.next = &live;
	cr_assert_eq(mq_open_from(&m, &dead, 0, "itest-mqlive", &node), ST_OK);
	cr_assert_eq(node, 1);
	mq_close(&m);
	cr_assert_null(m);
}

Test(mq_live, confirmed_publishes_land_and_each_is_acked)
{
	struct mq *m = live_open();
	uint64_t first = mq_next_seq(m);

	for (int i = 0; i < 20; i++) {
		char body[32];
		struct mq_message msg;

		snprintf(body, sizeof body, "{\"n\":%d}", i);
		msg = live_msg(RK_MAIN, body);
		cr_assert_eq(mq_publish(m, &msg), ST_OK, "%s", mq_errmsg(m));
	}
	cr_assert_eq(mq_next_seq(m), first + 20);
	cr_assert_eq(mq_unconfirmed(m), 20);
	cr_assert_eq(mq_wait_confirms(m, 10000), ST_OK, "%s", mq_errmsg(m));
	cr_assert_eq(mq_unconfirmed(m), 0);
	for (uint64_t s = first; s < first + 20; s++)
		cr_assert_eq(mq_outcome(m, s), MQ_OUTCOME_ACKED, "publish %llu", (unsigned long long)s);
	cr_assert_eq(mq_outcome(m, first + 20), MQ_OUTCOME_UNKNOWN, "not published yet");
	cr_assert_eq(mq_outcome(m, 0), MQ_OUTCOME_UNKNOWN);
	cr_assert_eq(live_depth(m, Q_MAIN), 20);
	/* In publish order, bodies intact. */
	for (int i = 0; i < 20; i++) {
		struct mq_delivery d;
		char want[32];

		cr_assert_eq(mq_get(m, Q_MAIN, &d), ST_OK, "%s", mq_errmsg(m));
		snprintf(want, sizeof want, "{\"n\":%d}", i);
		cr_assert_eq(d.len, strlen(want));
		cr_assert_eq(memcmp(d.body, want, d.len), 0);
		cr_assert_str_eq(d.routing_key, RK_MAIN);
		cr_assert(d.routing_key_valid);
		cr_assert_eq(mq_ack(m, d.tag, false), ST_OK);
		mq_delivery_release(m, &d);
	}
	mq_close(&m);
}

/* Unroutable: a mandatory publish comes back (ST_ERR_MQ_NACK, outcome
 * RETURNED); one that is not mandatory is acked and dropped by the
 * broker; a routable one pipelined after the return is acked. */
Test(mq_live, an_unroutable_mandatory_publish_is_returned_and_only_it)
{
	struct mq *m = live_open();
	struct mq_message lost = live_msg(RK_NOWHERE, "{\"lost\":true}");
	struct mq_message kept = live_msg(RK_MAIN, "{\"kept\":true}");
	uint64_t s_lost, s_plain, s_kept;

	lost.mandatory = true;
	s_lost = mq_next_seq(m);
	cr_assert_eq(mq_publish(m, &lost), ST_OK, "%s", mq_errmsg(m));
	s_kept = mq_next_seq(m);
	cr_assert_eq(mq_publish(m, &kept), ST_OK, "%s", mq_errmsg(m));
	cr_assert_eq(mq_wait_confirms(m, 10000), ST_ERR_MQ_NACK);
	cr_assert_not_null(strstr(mq_errmsg(m), "returned unroutable"), "%s", mq_errmsg(m));
	cr_assert_not(mq_broken(m), "a return leaves the channel usable");
	cr_assert_eq(mq_outcome(m, s_lost), MQ_OUTCOME_RETURNED);
	cr_assert_eq(mq_outcome(m, s_kept), MQ_OUTCOME_ACKED);

	lost.mandatory = false;
	s_plain = mq_next_seq(m);
	cr_assert_eq(mq_publish_confirmed(m, &lost, 10000), ST_OK, "%s", mq_errmsg(m));
	cr_assert_eq(mq_outcome(m, s_plain), MQ_OUTCOME_ACKED);
	cr_assert_eq(live_depth(m, Q_MAIN), 1, "only the routable one");
	mq_close(&m);
}

/* A queue that refuses publishes when full (a policy: max-length 1,
 * overflow reject-publish) makes the broker nack: the nacked publish is
 * NACKED, the one it took ACKED, and the queue holds that one only. */
Test(mq_live, a_publish_the_broker_refuses_is_nacked)
{
	struct mq *m = itest_mq();
	struct mq_message msg = live_msg(RK_FULL, "{\"full\":1}");
	uint64_t s_first, s_nacked = 0;
	struct timespec t0, now;
	int rc;

	live_stack("ctl set_policy --apply-to queues mqlive-full '^itest\\.mqlive\\.full$' "
	           "'{\"max-length\":1,\"overflow\":\"reject-publish\"}'");
	cr_assert_eq(mq_queue_delete(m, Q_FULL), ST_OK, "%s", mq_errmsg(m));
	cr_assert_eq(mq_queue_declare_bind(m, Q_FULL, itest_cfg()->out_exchange, "mqlive.full", true), ST_OK, "%s",
	             mq_errmsg(m));
	s_first = mq_next_seq(m);
	cr_assert_eq(mq_publish_confirmed(m, &msg, 10000), ST_OK, "%s", mq_errmsg(m));
	cr_assert_eq(mq_outcome(m, s_first), MQ_OUTCOME_ACKED);
	/* The policy reaches a new queue within moments: until it does, a
	 * second message is taken; bounded by 10 s. */
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		uint64_t s = mq_next_seq(m);

		rc = mq_publish_confirmed(m, &msg, 10000);
		if (rc == ST_ERR_MQ_NACK) {
			s_nacked = s;
			break;
		}
		cr_assert_eq(rc, ST_OK, "%s", mq_errmsg(m));
		cr_assert_eq(mq_queue_purge(m, Q_FULL), ST_OK);
		cr_assert_eq(mq_publish_confirmed(m, &msg, 10000), ST_OK, "%s", mq_errmsg(m));
		clock_gettime(CLOCK_MONOTONIC, &now);
		cr_assert_lt(now.tv_sec - t0.tv_sec, 10, "the policy never applied");
	}
	cr_assert_eq(mq_outcome(m, s_nacked), MQ_OUTCOME_NACKED);
	cr_assert_not_null(strstr(mq_errmsg(m), "nacked"), "%s", mq_errmsg(m));
	cr_assert_not(mq_broken(m), "a nack leaves the channel usable");
	cr_assert_eq(live_depth(m, Q_FULL), 1);
	cr_assert_eq(mq_queue_delete(m, Q_FULL), ST_OK);
	mq_close(&m);
	live_stack("ctl clear_policy mqlive-full");
}

/* More publishes in flight than the ring tracks: every one is confirmed
 * and lands; the oldest are no longer tracked (UNKNOWN), the last
 * MQ_TRACK_MAX each ACKED. */
Test(mq_live, past_the_ring_the_oldest_outcomes_are_unknown_and_all_land)
{
	struct mq *m = live_open();
	const int n = MQ_TRACK_MAX + 44;
	uint64_t first = mq_next_seq(m);

	for (int i = 0; i < n; i++) {
		struct mq_message msg = live_msg(RK_MAIN, "{}");

		cr_assert_eq(mq_publish(m, &msg), ST_OK, "%s", mq_errmsg(m));
	}
	cr_assert_eq(mq_wait_confirms(m, 20000), ST_OK, "%s", mq_errmsg(m));
	cr_assert_eq(mq_unconfirmed(m), 0);
	for (int i = 0; i < n; i++) {
		enum mq_outcome want = i < n - MQ_TRACK_MAX ? MQ_OUTCOME_UNKNOWN : MQ_OUTCOME_ACKED;

		cr_assert_eq(mq_outcome(m, first + (uint64_t)i), want, "publish %d of %d", i, n);
	}
	cr_assert_eq(live_depth(m, Q_MAIN), (uint32_t)n);
	mq_close(&m);
}

/* A publish to an exchange that does not exist: the broker closes the
 * channel (404); the handle is broken and says why. */
Test(mq_live, a_publish_to_a_missing_exchange_breaks_the_channel)
{
	struct mq *m = live_open();
	struct mq_message msg = live_msg(RK_MAIN, "{}");

	msg.exchange = "itest.mqlive.no-such-exchange";
	cr_assert_eq(mq_publish_confirmed(m, &msg, 10000), ST_ERR_MQ);
	cr_assert(mq_broken(m));
	cr_assert_not_null(strstr(mq_errmsg(m), "404"), "%s", mq_errmsg(m));
	cr_assert_eq(mq_publish(m, &msg), ST_ERR_MQ_CONN, "a broken handle publishes nothing");
	mq_close(&m);
	m = itest_mq();
	cr_assert_eq(live_depth(m, Q_MAIN), 0);
	mq_close(&m);
}

/* Saved properties (the tagged JSON) restored by a publish reach the
 * consumer as the same AMQP values: saving the delivery again gives the
 * same JSON, our headers ride on top, and broker bookkeeping and our
 * x-inbox-* headers of the original are not copied. */
Test(mq_live, saved_properties_come_back_as_the_same_amqp_values)
{
	static const char saved[] =
		"{\"content_type\":\"application/json\",\"message_id\":\"m-1\",\"type\":\"order.created\","
		"\"correlation_id\":\"c-9\",\"app_id\":\"shop\",\"timestamp\":1700000000,"
		"\"headers\":{\"s\":\"text\",\"i\":-7,\"b\":true,\"n\":null,\"raw\":{\"$bytes\":\"QUJD\"},"
		"\"bad\":{\"$utf8b64\":\"/w==\"},\"ts\":{\"$timestamp\":1699999999},\"f\":{\"$f32\":1.5},"
		"\"dec\":{\"$decimal\":[2,12345]},\"t\":{\"$table\":{\"k\":{\"$array\":[1,\"x\"]}}},"
		"\"x-delivery-count\":3,\"x-inbox-reason\":\"old\"}}";
	static const char again[] =
		"{\"content_type\":\"application/json\",\"message_id\":\"m-1\",\"type\":\"order.created\","
		"\"correlation_id\":\"c-9\",\"app_id\":\"shop\",\"timestamp\":1700000000,"
		"\"headers\":{\"s\":\"text\",\"i\":-7,\"b\":true,\"n\":null,\"raw\":{\"$bytes\":\"QUJD\"},"
		"\"bad\":{\"$utf8b64\":\"/w==\"},\"ts\":{\"$timestamp\":1699999999},\"f\":{\"$f32\":1.5},"
		"\"dec\":{\"$decimal\":[2,12345]},\"t\":{\"$table\":{\"k\":{\"$array\":[1,\"x\"]}}},"
		"\"x-inbox-reason\":\"new\",\"x-published-us\":42},"
		"\"inbox_note\":\"escaped (not UTF-8, kept as base64): bad\"}";
	struct mq *m = live_open();
	struct mq_header ours[] = { { "x-inbox-reason", "new" } };
	struct mq_message msg = live_msg(RK_MAIN, "{}");
	struct mq_delivery d;
	char buf[64], note[256];
	char *json;

	msg.props_json = saved;
	msg.headers = ours;
	msg.nheaders = 1;
	msg.published_us = 42;
	cr_assert_eq(mq_publish_confirmed(m, &msg, 10000), ST_OK, "%s", mq_errmsg(m));
	cr_assert_eq(mq_get(m, Q_MAIN, &d), ST_OK, "%s", mq_errmsg(m));
	cr_assert_eq(d.published_us, 42, "an integer header, read as a number");
	cr_assert_eq(d.delivery_count, 0, "the original's count is not copied");
	cr_assert_eq(d.props.message_id_len, 3);
	cr_assert_eq(memcmp(d.props.message_id, "m-1", 3), 0);
	cr_assert_eq(mq_delivery_header(&d, "x-inbox-reason", buf, sizeof buf), ST_OK);
	cr_assert_str_eq(buf, "new");
	cr_assert_eq(mq_delivery_header(&d, "x-delivery-count", buf, sizeof buf), ST_ERR_NOT_FOUND);
	json = mq_delivery_props_json_note(&d, note, sizeof note);
	cr_assert_not_null(json);
	cr_assert_str_eq(json, again);
	cr_assert_str_eq(note, "escaped (not UTF-8, kept as base64): bad");
	free(json);
	cr_assert_eq(mq_ack(m, d.tag, false), ST_OK);
	mq_delivery_release(m, &d);
	cr_assert_null(d.body);
	mq_close(&m);
}

/* Saved properties that are not a JSON object: the publish is refused
 * before anything is sent, and the handle stays usable. */
Test(mq_live, saved_properties_that_do_not_load_send_nothing)
{
	struct mq *m = live_open();
	struct mq_message msg = live_msg(RK_MAIN, "{}");
	uint64_t seq = mq_next_seq(m);

	msg.props_json = "[1,2]";
	cr_assert_eq(mq_publish_confirmed(m, &msg, 10000), ST_ERR_INVALID);
	cr_assert_eq(mq_next_seq(m), seq, "no sequence number taken");
	cr_assert_not(mq_broken(m));
	msg.props_json = NULL;
	cr_assert_eq(mq_publish_confirmed(m, &msg, 10000), ST_OK, "%s", mq_errmsg(m));
	cr_assert_eq(live_depth(m, Q_MAIN), 1);
	mq_close(&m);
}
