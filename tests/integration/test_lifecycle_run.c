/*
 * test_lifecycle_run.c - the worker runs a lifecycle that is not the
 * order's (issue 27): lifecycles/shipment.json, migrated and run with
 * INBOX_LIFECYCLE, against the real stack.
 *
 * The expectations are typed in by hand from shipment.json, not asked of
 * the worker's decision table: states Labelled (L), PickedUp (P),
 * InTransit (T), Delivered (D), Lost (X), Returned (R); main path
 * L P T D; terminal D X R.
 *
 *   state   event             decision     next   emits
 *   none    ShipmentLabelled  applied      L
 *   none    ParcelPickedUp    held
 *   L       ParcelPickedUp    applied      P      ShipmentDispatched
 *   L       PickedUp (alias)  applied      P      ShipmentDispatched
 *   P       ParcelInTransit   applied      T
 *   P       ParcelLost        applied      X      CustomerRefundRequested
 *   T       ParcelPickedUp    ignored      T      (stale)
 *   T       ParcelDelivered   applied      D      DeliveryConfirmed
 *   X       ParcelInTransit   compensated  X      CarrierClaimFiled
 *   D       ParcelLost        invalid-transition (dead-lettered)
 *
 * and the message rules of the contract: the key is "shipment_id", data
 * carries tracking_number (a string of at most 64, required by
 * ShipmentLabelled); labelled_at, picked_up_at, delivered_at come from
 * occurred_at.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "itest.h"
#include "status.h"

#define WAIT_S 120
#define T0 "2026-01-02T03:04:05Z"

static void drop_shipment_tables(void)
{
	struct db *d = itest_db();

	cr_assert_eq(db_exec(d, "DROP TABLE IF EXISTS shipments, shipment_events, shipment_locks"), ST_OK, "%s",
	             db_errmsg(d));
}

/* A native shipment message: data is the inside of "data" or NULL. */
static void ship(char *buf, size_t cap, const char *id, const char *type, const char *shipment, const char *data)
{
	snprintf(buf, cap,
	         "{\"message_id\":\"%s\",\"source\":\"carrier\",\"type\":\"%s\",\"shipment_id\":\"%s\","
	         "\"occurred_at\":\"" T0 "\"%s%s%s}",
	         id, type, shipment, data != NULL ? ",\"data\":{" : "", data != NULL ? data : "", data != NULL ? "}" : "");
}

static void pub(struct mq *m, const char *id, const char *type, const char *shipment, const char *data)
{
	char body[512];

	ship(body, sizeof body, id, type, shipment, data);
	itest_publish(m, type, body, id);
}

static void expect_shipment(const char *id, const char *status, int64_t version)
{
	char got[64] = "";

	cr_expect(itest_str1("SELECT status FROM shipments WHERE id = ?", id, got, sizeof got), "%s has no row", id);
	cr_expect_str_eq(got, status, "%s", id);
	cr_expect_eq(itest_int1("SELECT version FROM shipments WHERE id = ?", id), version, "%s version", id);
	cr_expect_eq(itest_int1("SELECT COUNT(*) FROM shipment_events WHERE shipment_id = ?", id), version,
	             "%s: one ledger row per effect", id);
}

/* The outbox rows of a shipment, their types sorted, comma-separated. */
static void expect_emits(const char *id, const char *types)
{
	char got[256] = "";

	(void)itest_str1("SELECT COALESCE(GROUP_CONCAT(type ORDER BY type SEPARATOR ','), '') FROM outbox"
	                 " WHERE order_id = ? AND message_id = CONCAT(type, ':', order_id)", id, got, sizeof got);
	cr_expect_str_eq(got, types, "%s emits", id);
}

Test(lifecycle_run, the_worker_runs_the_shipment_lifecycle_end_to_end, .timeout = 600)
{
	char env[4200], path[4096], log[256], body[512], got[128];
	const char *menv[] = { env, NULL };
	const char *margs[] = { "migrate", NULL };
	struct itest_dead dead[16];
	struct mq *m;
	pid_t w;
	int st, n;

	itest_fresh();
	drop_shipment_tables();
	snprintf(env, sizeof env, "INBOX_LIFECYCLE=%s", itest_source("lifecycles/shipment.json", path, sizeof path));
	st = itest_wait_exit(itest_spawn(margs, menv), 120);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "migrate with the shipment lifecycle (status %d)", st);

	itest_log_path(log, sizeof log, "lc-run-shipment");
	w = itest_worker_logged(1, menv, log);
	m = itest_mq();

	/* s-1: the main path, the alias on the way. */
	pub(m, "s1-1", "ShipmentLabelled", "s-1", "\"tracking_number\":\"TRK-1\"");
	pub(m, "s1-2", "PickedUp", "s-1", NULL);
	pub(m, "s1-3", "ParcelInTransit", "s-1", NULL);
	pub(m, "s1-4", "ParcelDelivered", "s-1", NULL);
	/* s-2: picked up before it is labelled: held, then released. */
	pub(m, "s2-2", "ParcelPickedUp", "s-2", NULL);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM held_events WHERE message_id = 's2-2'", 1, WAIT_S), 1,
	             "an event before its shipment exists is held; see %s", log);
	pub(m, "s2-1", "ShipmentLabelled", "s-2", "\"tracking_number\":\"TRK-2\"");
	/* s-3: a stale pick-up once in transit is ignored. */
	pub(m, "s3-1", "ShipmentLabelled", "s-3", "\"tracking_number\":\"TRK-3\"");
	pub(m, "s3-2", "ParcelPickedUp", "s-3", NULL);
	pub(m, "s3-3", "ParcelInTransit", "s-3", NULL);
	pub(m, "s3-4", "ParcelPickedUp", "s-3", NULL);
	/* s-4: in transit reported after lost: compensated with a claim. */
	pub(m, "s4-1", "ShipmentLabelled", "s-4", "\"tracking_number\":\"TRK-4\"");
	pub(m, "s4-2", "ParcelPickedUp", "s-4", NULL);
	pub(m, "s4-3", "ParcelLost", "s-4", NULL);
	pub(m, "s4-4", "ParcelInTransit", "s-4", NULL);
	/* s-5: lost after delivered cannot be carried out. */
	pub(m, "s5-1", "ShipmentLabelled", "s-5", "\"tracking_number\":\"TRK-5\"");
	pub(m, "s5-2", "ParcelPickedUp", "s-5", NULL);
	pub(m, "s5-3", "ParcelInTransit", "s-5", NULL);
	pub(m, "s5-4", "ParcelDelivered", "s-5", NULL);
	pub(m, "s5-5", "ParcelLost", "s-5", NULL);
	/* A duplicate (same body) and a payload conflict (same key, other body). */
	pub(m, "s1-1", "ShipmentLabelled", "s-1", "\"tracking_number\":\"TRK-1\"");
	pub(m, "s1-1", "ShipmentLabelled", "s-1", "\"tracking_number\":\"TRK-OTHER\"");
	/* The message rules of the definition. */
	pub(m, "bad-1", "ShipmentLabelled", "s-6", NULL);
	pub(m, "bad-2", "ShipmentLabelled", "s-7",
	    "\"tracking_number\":\"0123456789012345678901234567890123456789012345678901234567890123X\"");
	pub(m, "bad-3", "ShipmentLabelled", "s-8", "\"tracking_number\":42");
	snprintf(body, sizeof body, "{\"message_id\":\"bad-4\",\"type\":\"ShipmentLabelled\",\"order_id\":\"s-9\","
	                            "\"data\":{\"tracking_number\":\"TRK-9\"}}");
	itest_publish(m, "ShipmentLabelled", body, "bad-4");
	pub(m, "bad-5", "OrderCreated", "s-10", NULL);

	/* Ledger rows: s-1 4, s-2 2, s-3 3, s-4 4, s-5 4. */
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM shipment_events", 17, WAIT_S), 17, "see %s", log);
	n = itest_dlq_drain(dead, 16, 7, WAIT_S);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_eq(n, 7, "dead letters; see %s", log);

	expect_shipment("s-1", "Delivered", 4);
	expect_shipment("s-2", "PickedUp", 2);
	expect_shipment("s-3", "InTransit", 3);
	expect_shipment("s-4", "Lost", 4);
	expect_shipment("s-5", "Delivered", 4);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM shipments"), 5, "no row for a refused message");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM held_events"), 0, "the held pick-up was released");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM orders"), 0, "nothing reaches the order tables");

	/* The columns the events set, from the message. */
	cr_expect(itest_str1("SELECT tracking_number FROM shipments WHERE id = ?", "s-1", got, sizeof got));
	cr_expect_str_eq(got, "TRK-1", "the duplicate and the conflict left the row as the first copy wrote it");
	cr_expect(itest_str1("SELECT CONCAT_WS('|', CAST(labelled_at AS CHAR), CAST(picked_up_at AS CHAR),"
	                     " CAST(delivered_at AS CHAR)) FROM shipments WHERE id = ?", "s-1", got, sizeof got));
	cr_expect_str_eq(got, "2026-01-02 03:04:05.000000|2026-01-02 03:04:05.000000|2026-01-02 03:04:05.000000");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM shipments WHERE id = 's-3' AND delivered_at IS NULL"
	                       " AND picked_up_at IS NOT NULL"), 1);
	cr_expect_eq(itest_int1("SELECT flags FROM shipments WHERE id = ?", "s-4"), 1,
	             "the in-transit report took effect (compensated): remembered, so a second one is ignored");

	/* The decisions, as the ledger and the inbox keep them. */
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM shipment_events WHERE message_id = 's4-4' AND outcome = 'compensated'"
	                       " AND from_status = 'Lost' AND to_status = 'Lost' AND version = 4"), 1);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM shipment_events WHERE message_id = 's2-1' AND from_status = 'None'"
	                       " AND to_status = 'Labelled' AND version = 1"), 1);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM shipment_events WHERE message_id = 's1-2' AND type = 'PickedUp'"),
	             1, "the alias is recorded as sent");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE message_id = 's3-4' AND outcome = 'ignored'"
	                       " AND order_id = 's-3'"), 1);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE message_id = 's2-2' AND outcome = 'applied'"),
	             1);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE message_id = 's5-5'"
	                       " AND reason = 'invalid-transition'"), 1);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE message_id = 's1-1'"), 1);

	/* What each emits, with its stable id and the key in its body. */
	expect_emits("s-1", "DeliveryConfirmed,ShipmentDispatched");
	expect_emits("s-2", "ShipmentDispatched");
	expect_emits("s-3", "ShipmentDispatched");
	expect_emits("s-4", "CarrierClaimFiled,CustomerRefundRequested,ShipmentDispatched");
	expect_emits("s-5", "DeliveryConfirmed,ShipmentDispatched");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE message_id = 'CarrierClaimFiled:s-4'"
	                       " AND JSON_VALUE(CAST(body AS CHAR), '$.shipment_id') = 's-4'"
	                       " AND JSON_VALUE(CAST(body AS CHAR), '$.data.cause_message_id') = 's4-4'"), 1);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE JSON_VALUE(CAST(body AS CHAR), '$.order_id')"
	                       " IS NOT NULL"), 0, "a shipment's events carry shipment_id, not order_id");

	/* The dead letters, each with its reason and a detail that says why. */
	itest_expect_dead(dead, n, "s5-5", "invalid-transition", "ParcelLost not allowed on a shipment in state Delivered");
	itest_expect_dead(dead, n, "s1-1", "payload-conflict", NULL);
	itest_expect_dead(dead, n, "bad-1", "missing-field", "tracking_number");
	itest_expect_dead(dead, n, "bad-2", "invalid-field", "tracking_number");
	itest_expect_dead(dead, n, "bad-3", "invalid-field", "tracking_number");
	itest_expect_dead(dead, n, "bad-4", "missing-field", "shipment_id");
	itest_expect_dead(dead, n, "bad-5", "unknown-type", "OrderCreated");
	drop_shipment_tables();
	itest_fresh(); /* the next suite's schema */
}

/*
 * Several transitions emit one type (issue 43, item 4): each emitted event
 * has an id of its own, derived from what caused it, so that a consumer
 * that deduplicates by message-id, as SPEC invites it to, keeps all three
 * CustomerNotified.  A type with one cause keeps "<type>:<key>".
 */
Test(lifecycle_run, each_emitted_event_has_its_own_stable_id, .timeout = 300)
{
	char env[4200], path[4096], log[256], body[512], got[512] = "";
	const char *menv[] = { env, NULL };
	const char *margs[] = { "migrate", NULL };
	struct itest_dead dead[4];
	struct mq *m;
	pid_t w;
	int st;

	itest_fresh();
	(void)db_exec(itest_db(), "DROP TABLE IF EXISTS tickets, ticket_events, ticket_locks");
	snprintf(env, sizeof env, "INBOX_LIFECYCLE=%s",
	         itest_source("tests/lifecycles/ticket_notifies_thrice.json", path, sizeof path));
	st = itest_wait_exit(itest_spawn(margs, menv), 120);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "migrate with the ticket lifecycle (status %d)", st);
	itest_log_path(log, sizeof log, "lc-run-ticket");
	w = itest_worker_logged(1, menv, log);
	m = itest_mq();
	/* Closed first, then opened, then assigned: the worker holds and
	 * releases, and the ids do not depend on the order either. */
	static const char *const evs[][2] = { { "t1-3", "TicketClosed" }, { "t1-1", "TicketOpened" },
		                                  { "t1-2", "TicketAssigned" } };
	for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++) {
		snprintf(body, sizeof body,
		         "{\"message_id\":\"%s\",\"source\":\"desk\",\"type\":\"%s\",\"ticket_id\":\"t-1\","
		         "\"occurred_at\":\"" T0 "\"}", evs[i][0], evs[i][1]);
		itest_publish(m, evs[i][1], body, evs[i][0]);
	}
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM ticket_events", 3, WAIT_S), 3, "see %s", log);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
	cr_expect_eq(itest_dlq_drain(dead, 4, 0, 2), 0, "nothing dead-lettered; see %s", log);

	(void)itest_str1("SELECT COALESCE(GROUP_CONCAT(message_id ORDER BY message_id SEPARATOR ','), '') FROM outbox"
	                 " WHERE order_id = ?", "t-1", got, sizeof got);
	cr_expect_str_eq(got, "AgentPaged:t-1,CustomerNotified:t-1:TicketAssigned,CustomerNotified:t-1:TicketClosed,"
	                      "CustomerNotified:t-1:TicketOpened", "one id per emitted event; see %s", log);
	cr_expect_eq(itest_int("SELECT COUNT(DISTINCT message_id) FROM outbox WHERE order_id = 't-1'"), 4);
	(void)db_exec(itest_db(), "DROP TABLE IF EXISTS tickets, ticket_events, ticket_locks");
	itest_fresh(); /* the next suite's schema */
}
