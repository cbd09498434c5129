/*
 * test_sequence.c - events the producer numbers (issue 46, item 1),
 * against the real stack: lifecycles/ticket.json, whose events carry their
 * place in their ticket's sequence in data.seq, and whose graph has a
 * loop (a resolved ticket reopened goes back to InProgress).
 *
 * Typed in by hand from ticket.json: Open (O), InProgress (P), Resolved
 * (R), Closed (C, terminal); TicketOpened creates O; WorkStarted O->P;
 * TicketResolved P->R emits CustomerNotified; TicketReopened R->P;
 * TicketClosed R->C emits SurveySent, and is ignored in C.  Anything else
 * is an invalid transition.
 *
 *   - t-1: seven numbers published in the order 1 3 2 6 4 7 5, one copy
 *     twice: applied in number order through the loop (the ledger's
 *     versions are the numbers, its types the producer's order), Closed at
 *     version 7, CustomerNotified emitted twice under two ids;
 *   - t-2: 1 and 3 only: 3 waits for 2, and after INBOX_HOLD_TTL is
 *     dead-lettered as sequence-gap naming the number that never came;
 *   - t-3: number 2 sent by two events: the second one a payload-conflict;
 *   - t-4: number 2 an invalid transition (TicketClosed while Open):
 *     dead-lettered, saying the ticket waits at 2; number 3 waits behind it
 *     and expires as a gap;
 *   - t-5: a message without its number: missing-field;
 *   - t-9: an invalid number the ticket waits at, left by `dlq replay`
 *     while the definition refuses it, and moved on by a replay under a
 *     changed definition (tests/lifecycles/ticket_close_ignored_when_open.json);
 *   - t-11: a sequence-gap letter that `dlq replay` leaves, naming the
 *     number it waits for, until that number has come, and then applies;
 *   - t-14: an invalid number skipped by the operator (`dlq skip`): the
 *     number taken without its effect, the one held behind it released;
 *     a letter that is not its ticket's next number is left, saying why;
 *   - t-13: numbered by an AMQP header (tests/lifecycles/ticket_by_header.json):
 *     a held event keeps its number through its kept headers.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "itest.h"
#include "status.h"

#define WAIT_S 120
#define T0 "2026-03-04T05:06:07Z"

static void tk(struct mq *m, const char *id, const char *type, const char *ticket, int seq)
{
	char body[512];

	if (seq > 0)
		snprintf(body, sizeof body,
		         "{\"message_id\":\"%s\",\"source\":\"helpdesk\",\"type\":\"%s\",\"ticket_id\":\"%s\","
		         "\"occurred_at\":\"" T0 "\",\"data\":{\"seq\":%d}}", id, type, ticket, seq);
	else
		snprintf(body, sizeof body,
		         "{\"message_id\":\"%s\",\"source\":\"helpdesk\",\"type\":\"%s\",\"ticket_id\":\"%s\","
		         "\"occurred_at\":\"" T0 "\"}", id, type, ticket);
	itest_publish(m, type, body, id);
}

/* Fresh tables for the ticket, migrated by lifecycles/ticket.json; env
 * gets its INBOX_LIFECYCLE= setting (menv: the worker's environment, env
 * among it). */
static void ticket_fresh(char *env, size_t cap, const char *const *menv)
{
	const char *margs[] = { "migrate", NULL };
	char path[4096];
	int st;

	itest_fresh();
	cr_assert_eq(db_exec(itest_db(), "DROP TABLE IF EXISTS tickets, ticket_events, ticket_locks"), ST_OK);
	snprintf(env, cap, "INBOX_LIFECYCLE=%s", itest_source("lifecycles/ticket.json", path, sizeof path));
	st = itest_wait_exit(itest_spawn(margs, menv), 120);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "migrate with the ticket lifecycle (status %d)", st);
}

Test(sequence, a_numbered_ticket_applies_in_its_producers_order_through_a_loop, .timeout = 600)
{
	char env[4200], log[256], got[512];
	const char *menv[] = { env, "INBOX_HOLD_TTL=4s", NULL };
	struct itest_dead dead[16];
	struct mq *m;
	pid_t w;
	int n;

	ticket_fresh(env, sizeof env, menv);
	itest_log_path(log, sizeof log, "sequence-ticket");
	w = itest_worker_logged(1, menv, log);
	m = itest_mq();

	/* t-1: opened, started, resolved, reopened, resolved, closed, closed
	 * again, published out of order */
	tk(m, "t1-1", "TicketOpened", "t-1", 1);
	tk(m, "t1-3", "TicketResolved", "t-1", 3);
	tk(m, "t1-2", "WorkStarted", "t-1", 2);
	tk(m, "t1-6", "TicketClosed", "t-1", 6);
	tk(m, "t1-4", "TicketReopened", "t-1", 4);
	tk(m, "t1-3", "TicketResolved", "t-1", 3); /* a copy: its key settles it */
	tk(m, "t1-7", "TicketClosed", "t-1", 7);   /* closed again: ignored in Closed, its number taken */
	tk(m, "t1-5", "TicketResolved", "t-1", 5);
	/* t-2: number 2 never comes */
	tk(m, "t2-1", "TicketOpened", "t-2", 1);
	tk(m, "t2-3", "TicketResolved", "t-2", 3);
	/* t-3: number 2 twice, by two events */
	tk(m, "t3-1", "TicketOpened", "t-3", 1);
	tk(m, "t3-2", "WorkStarted", "t-3", 2);
	cr_assert_eq(itest_wait_int("SELECT version FROM tickets WHERE id = 't-3'", 2, WAIT_S), 2, "see %s", log);
	tk(m, "t3-2b", "WorkStarted", "t-3", 2);
	/* t-4: number 2 cannot apply while Open; 3 waits behind it */
	tk(m, "t4-1", "TicketOpened", "t-4", 1);
	tk(m, "t4-2", "TicketClosed", "t-4", 2);
	tk(m, "t4-3", "WorkStarted", "t-4", 3);
	/* t-5: no number */
	tk(m, "t5-1", "TicketOpened", "t-5", 0);

	n = itest_dlq_drain(dead, 16, 5, WAIT_S);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM held_events", 0, WAIT_S), 0, "see %s", log);
	itest_stop_ok(w);
	mq_close(&m);
	cr_assert_eq(n, 5, "dead letters; see %s", log);

	/* t-1: through the loop in the producer's order */
	cr_expect(itest_str1("SELECT CONCAT(status, ' ', version) FROM tickets WHERE id = ?", "t-1", got, sizeof got));
	cr_expect_str_eq(got, "Closed 7", "the ignored close took its number");
	cr_expect(itest_str1("SELECT GROUP_CONCAT(CONCAT(version, ':', type, ':', to_status) ORDER BY version"
	                     " SEPARATOR ' ') FROM ticket_events WHERE ticket_id = ?", "t-1", got, sizeof got));
	cr_expect_str_eq(got, "1:TicketOpened:Open 2:WorkStarted:InProgress 3:TicketResolved:Resolved "
	                      "4:TicketReopened:InProgress 5:TicketResolved:Resolved 6:TicketClosed:Closed "
	                      "7:TicketClosed:Closed");
	cr_expect(itest_str1("SELECT GROUP_CONCAT(message_id ORDER BY message_id SEPARATOR ' ') FROM outbox"
	                     " WHERE order_id = ?", "t-1", got, sizeof got));
	cr_expect_str_eq(got, "CustomerNotified:t-1:3 CustomerNotified:t-1:5 SurveySent:t-1:6",
	                 "each resolution notifies once, under its own id");
	cr_expect(itest_str1("SELECT CAST(body AS CHAR) FROM outbox WHERE message_id = ?", "CustomerNotified:t-1:5", got,
	                     sizeof got));
	cr_expect(strstr(got, "\"cause_sequence\":5") != NULL, "the emitted event carries its cause's number: %s", got);
	cr_expect(strstr(got, "\"sequence\":2") != NULL, "and its own among the ticket's emitted events: %s", got);
	cr_expect_eq(itest_int1("SELECT emitted FROM tickets WHERE id = ?", "t-1"), 3, "the ticket emitted three");
	cr_expect_eq(itest_int1("SELECT COUNT(*) FROM processed_messages WHERE message_id = ? AND outcome = 'ignored'",
	                        "t1-7"), 1);
	cr_expect_eq(itest_int1("SELECT COUNT(*) FROM ticket_events WHERE message_id = ? AND outcome = 'ignored'"
	                        " AND version = 7", "t1-7"), 1, "the ledger keeps every number taken, an ignored one too");

	/* t-2: the gap */
	cr_expect(itest_str1("SELECT CONCAT(status, ' ', version) FROM tickets WHERE id = ?", "t-2", got, sizeof got));
	cr_expect_str_eq(got, "Open 1");
	itest_expect_dead(dead, n, "t2-3", "sequence-gap", "TicketResolved (number 3) held longer than INBOX_HOLD_TTL (4s): "
	                                             "number 2 of ticket t-2 never came");
	/* t-3: a number taken */
	itest_expect_dead(dead, n, "t3-2b", "payload-conflict", "WorkStarted is number 2 of ticket t-3, which another event "
	                                                  "took (the ticket is at 2)");
	/* t-4: the invalid transition, and the number behind it */
	itest_expect_dead(dead, n, "t4-2", "invalid-transition", "TicketClosed (number 2) not allowed on ticket in state Open; "
	                                                   "the ticket waits at number 2");
	itest_expect_dead(dead, n, "t4-3", "sequence-gap", "number 2 of ticket t-4 never came");
	cr_expect(itest_str1("SELECT CONCAT(status, ' ', version) FROM tickets WHERE id = ?", "t-4", got, sizeof got));
	cr_expect_str_eq(got, "Open 1");
	/* t-5 */
	itest_expect_dead(dead, n, "t5-1", "missing-field", "data.seq (the event's number in its ticket's sequence) is missing");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM tickets WHERE id = 't-5'"), 0);
}

/* An invalid number holds its ticket at that number; `dlq replay` of it
 * is left while the definition still refuses it, and once the definition
 * has changed (a close while Open is now ignored: its number taken) the
 * replay moves the ticket on, releasing the number held behind it. */
Test(sequence, a_replay_under_a_changed_definition_moves_a_waiting_ticket_on, .timeout = 600)
{
	char env1[4200], env2[4200], path[4096], log1[256], log2[256], rlog1[256], rlog2[256], got[128];
	const char *menv1[] = { env1, NULL };
	const char *menv2[] = { env2, NULL };
	const char *replay[] = { "dlq", "replay", "--reason", "invalid-transition", NULL };
	const char *bin = getenv("INBOX_WORKER_BIN");
	struct mq *m;
	pid_t w;
	int st;

	ticket_fresh(env1, sizeof env1, menv1);
	snprintf(env2, sizeof env2, "INBOX_LIFECYCLE=%s",
	         itest_source("tests/lifecycles/ticket_close_ignored_when_open.json", path, sizeof path));
	itest_log_path(log1, sizeof log1, "sequence-replay-1");
	w = itest_worker_logged(1, menv1, log1);
	m = itest_mq();
	tk(m, "t9-1", "TicketOpened", "t-9", 1);
	tk(m, "t9-2", "TicketClosed", "t-9", 2);
	tk(m, "t9-3", "WorkStarted", "t-9", 3);
	cr_assert_eq(itest_wait_depth(itest_cfg()->dlq, 1, WAIT_S), 1, "the invalid close is dead-lettered; see %s", log1);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM held_events WHERE message_id = 't9-3'", 1, WAIT_S), 1,
	             "number 3 waits behind it; see %s", log1);

	/* the same definition: still invalid, so the replay leaves it */
	itest_log_path(rlog1, sizeof rlog1, "sequence-replay-left");
	st = itest_wait_exit(itest_spawn_program(bin, replay, menv1, rlog1, true), 60);
	cr_expect(WIFEXITED(st), "dlq replay (status %d); see %s", st, rlog1);
	cr_expect(itest_log_has(rlog1, "still an impossible transition"), "see %s", rlog1);
	itest_stop_ok(w);

	/* the changed definition: the close, replayed, is ignored and takes
	 * number 2; number 3 is released */
	itest_log_path(log2, sizeof log2, "sequence-replay-2");
	w = itest_worker_logged(1, menv2, log2);
	itest_log_path(rlog2, sizeof rlog2, "sequence-replay-moved");
	st = itest_wait_exit(itest_spawn_program(bin, replay, menv2, rlog2, true), 60);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "dlq replay (status %d); see %s", st, rlog2);
	cr_expect_eq(itest_wait_int("SELECT version FROM tickets WHERE id = 't-9'", 3, WAIT_S), 3, "see %s and %s", rlog2,
	             log2);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
	cr_expect(itest_str1("SELECT status FROM tickets WHERE id = ?", "t-9", got, sizeof got));
	cr_expect_str_eq(got, "InProgress");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM held_events"), 0);
	cr_expect_eq(itest_int1("SELECT COUNT(*) FROM processed_messages WHERE message_id = ? AND outcome = 'ignored'",
	                        "t9-2"), 1);
}

/* A sequence-gap letter judged by its number: while the number before it
 * has not come, a replay leaves it and says what it waits for; once it
 * has, the replay applies it. */
Test(sequence, a_gap_letter_is_replayed_once_the_number_before_it_came, .timeout = 600)
{
	char env[4200], log[256], rlog1[256], rlog2[256];
	const char *menv[] = { env, "INBOX_HOLD_TTL=2s", NULL };
	const char *replay[] = { "dlq", "replay", "--reason", "sequence-gap", NULL };
	const char *bin = getenv("INBOX_WORKER_BIN");
	struct mq *m;
	pid_t w;
	int st;

	ticket_fresh(env, sizeof env, menv);
	itest_log_path(log, sizeof log, "sequence-gap-replay");
	w = itest_worker_logged(1, menv, log);
	m = itest_mq();
	tk(m, "t11-1", "TicketOpened", "t-11", 1);
	tk(m, "t11-3", "TicketResolved", "t-11", 3);
	cr_assert_eq(itest_wait_depth(itest_cfg()->dlq, 1, WAIT_S), 1, "the gap expired; see %s", log);

	itest_log_path(rlog1, sizeof rlog1, "sequence-gap-left");
	st = itest_wait_exit(itest_spawn_program(bin, replay, menv, rlog1, true), 60);
	cr_expect(WIFEXITED(st), "dlq replay (status %d); see %s", st, rlog1);
	cr_expect(itest_log_has(rlog1, "number 3 waits for number 2 (ticket t-11 is at 1)"), "see %s", rlog1);
	cr_expect_eq(itest_int("SELECT version FROM tickets WHERE id = 't-11'"), 1);

	tk(m, "t11-2", "WorkStarted", "t-11", 2);
	cr_assert_eq(itest_wait_int("SELECT version FROM tickets WHERE id = 't-11'", 2, WAIT_S), 2, "see %s", log);
	itest_log_path(rlog2, sizeof rlog2, "sequence-gap-replayed");
	st = itest_wait_exit(itest_spawn_program(bin, replay, menv, rlog2, true), 60);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "dlq replay (status %d); see %s", st, rlog2);
	cr_expect_eq(itest_wait_int("SELECT version FROM tickets WHERE id = 't-11'", 3, WAIT_S), 3, "see %s and %s", rlog2,
	             log);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
	cr_expect_eq(itest_int1("SELECT COUNT(*) FROM ticket_events WHERE message_id = ? AND version = 3", "t11-3"), 1);
}

/* Retention forgets keys, the ledger does not: a copy of a numbered event
 * that was ignored (its number taken) comes back after its inbox row is
 * gone, and is a duplicate, not a payload-conflict. */
Test(sequence, a_copy_of_an_ignored_number_after_retention_is_a_duplicate, .timeout = 600)
{
	char env[4200], log[256];
	const char *menv[] = { env, NULL };
	struct mq *m;
	pid_t w;

	ticket_fresh(env, sizeof env, menv);
	itest_log_path(log, sizeof log, "sequence-retention");
	w = itest_worker_logged(1, menv, log);
	m = itest_mq();
	tk(m, "t12-1", "TicketOpened", "t-12", 1);
	tk(m, "t12-2", "WorkStarted", "t-12", 2);
	tk(m, "t12-3", "TicketResolved", "t-12", 3);
	tk(m, "t12-4", "TicketClosed", "t-12", 4);
	tk(m, "t12-5", "TicketClosed", "t-12", 5);
	cr_assert_eq(itest_wait_int("SELECT version FROM tickets WHERE id = 't-12'", 5, WAIT_S), 5, "see %s", log);
	/* as retention would */
	cr_assert_eq(db_exec(itest_db(), "DELETE FROM processed_messages WHERE message_id = 't12-5'"), ST_OK);
	cr_assert_eq(db_commit(itest_db()), ST_OK);
	tk(m, "t12-5", "TicketClosed", "t-12", 5);
	tk(m, "t12-6", "TicketClosed", "t-12", 6); /* a marker: once it is taken, the copy before it was settled */
	cr_assert_eq(itest_wait_int("SELECT version FROM tickets WHERE id = 't-12'", 6, WAIT_S), 6, "see %s", log);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
	cr_expect_eq(itest_wait_depth(itest_cfg()->dlq, 0, 5), 0, "nothing dead-lettered; see %s", log);
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM processed_messages WHERE message_id = 't12-5'"), 0,
	             "settled as a duplicate of what the ledger holds, leaving no row");
}

/* The number in an AMQP header ("from": "header.x-seq"): numbers 1 3 2 5 4
 * end Resolved at 5 (3 and 5 were held, and found their numbers again in
 * their kept headers when released); a body's own "sequence" does not
 * stand in for a missing header. */
Test(sequence, a_number_in_an_amqp_header_orders_the_events, .timeout = 600)
{
	char env[4200], path[4096], log[256], got[512], body[512];
	const char *menv[] = { env, NULL };
	static const struct { const char *id, *type; int seq; } evs[] = {
		{ "t13-1", "TicketOpened", 1 }, { "t13-3", "TicketResolved", 3 }, { "t13-2", "WorkStarted", 2 },
		{ "t13-5", "TicketResolved", 5 }, { "t13-3", "TicketResolved", 3 }, { "t13-4", "TicketReopened", 4 },
	};
	struct itest_dead dead[4];
	struct mq *m;
	pid_t w;
	int n;

	ticket_fresh(env, sizeof env, menv);
	snprintf(env, sizeof env, "INBOX_LIFECYCLE=%s",
	         itest_source("tests/lifecycles/ticket_by_header.json", path, sizeof path));
	itest_log_path(log, sizeof log, "sequence-header");
	w = itest_worker_logged(1, menv, log);
	m = itest_mq();
	for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++) {
		char seq[16];

		snprintf(body, sizeof body,
		         "{\"message_id\":\"%s\",\"source\":\"helpdesk\",\"type\":\"%s\",\"ticket_id\":\"t-13\","
		         "\"occurred_at\":\"" T0 "\"}", evs[i].id, evs[i].type);
		snprintf(seq, sizeof seq, "%d", evs[i].seq);
		itest_publish_header(m, evs[i].type, body, "x-seq", seq);
		if (i == 1)
			cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM held_events WHERE message_id = 't13-3'", 1, WAIT_S),
			             1, "number 3 is held in the table, not only in a batch; see %s", log);
	}
	itest_publish(m, "WorkStarted",
	              "{\"message_id\":\"t13-x\",\"source\":\"helpdesk\",\"type\":\"WorkStarted\","
	              "\"ticket_id\":\"t-13\",\"sequence\":6}", "t13-x");
	n = itest_dlq_drain(dead, 4, 1, WAIT_S);
	cr_assert_eq(itest_wait_int("SELECT version FROM tickets WHERE id = 't-13'", 5, WAIT_S), 5, "see %s", log);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);
	cr_expect(itest_str1("SELECT GROUP_CONCAT(CONCAT(version, ':', type) ORDER BY version SEPARATOR ' ')"
	                     " FROM ticket_events WHERE ticket_id = ?", "t-13", got, sizeof got));
	cr_expect_str_eq(got, "1:TicketOpened 2:WorkStarted 3:TicketResolved 4:TicketReopened 5:TicketResolved");
	cr_expect(itest_str1("SELECT status FROM tickets WHERE id = ?", "t-13", got, sizeof got));
	cr_expect_str_eq(got, "Resolved");
	cr_expect_eq(n, 1, "see %s", log);
	itest_expect_dead(dead, n, "t13-x", "missing-field", "header x-seq (the event's number in its ticket's sequence) "
	                                                    "is missing");
}

/* `dlq skip`: the operator's decision on an invalid number the ticket
 * waits at.  The number is taken without its effect (ledger and inbox say
 * ignored, the inbox row's reason skipped), number 3 held behind it is
 * released in the same transaction, the letter leaves the DLQ.  A letter
 * that is not its ticket's next number (a taken one) is left. */
Test(sequence, an_operator_skips_the_number_a_ticket_waits_at, .timeout = 600)
{
	char env[4200], log[256], rlog1[256], rlog2[256], got[256];
	const char *menv[] = { env, NULL };
	const char *dry[] = { "dlq", "skip", "--order", "t-14", "--dry-run", NULL };
	const char *skip[] = { "dlq", "skip", "--order", "t-14", NULL };
	const char *bin = getenv("INBOX_WORKER_BIN");
	struct mq *m;
	pid_t w;
	int st;

	ticket_fresh(env, sizeof env, menv);
	itest_log_path(log, sizeof log, "sequence-skip");
	w = itest_worker_logged(1, menv, log);
	m = itest_mq();
	tk(m, "t14-1", "TicketOpened", "t-14", 1);
	tk(m, "t14-2", "TicketClosed", "t-14", 2);   /* invalid while Open: the ticket waits at 2 */
	tk(m, "t14-3", "WorkStarted", "t-14", 3);
	tk(m, "t14-3b", "WorkStarted", "t-14", 1);   /* number 1 is taken: payload-conflict */
	cr_assert_eq(itest_wait_depth(itest_cfg()->dlq, 2, WAIT_S), 2, "see %s", log);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM held_events WHERE message_id = 't14-3'", 1, WAIT_S), 1,
	             "number 3 waits behind it; see %s", log);

	itest_log_path(rlog1, sizeof rlog1, "sequence-skip-dry");
	st = itest_wait_exit(itest_spawn_program(bin, dry, menv, rlog1, true), 60);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "dlq skip --dry-run (status %d); see %s", st, rlog1);
	cr_expect(itest_log_has(rlog1, "would skip"), "see %s", rlog1);
	cr_expect_eq(itest_int("SELECT version FROM tickets WHERE id = 't-14'"), 1, "a dry run changes nothing");

	itest_log_path(rlog2, sizeof rlog2, "sequence-skip");
	st = itest_wait_exit(itest_spawn_program(bin, skip, menv, rlog2, true), 60);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "dlq skip (status %d); see %s", st, rlog2);
	cr_expect(itest_log_has(rlog2, "number 1 of ticket t-14 was taken"), "the conflict is left; see %s", rlog2);
	cr_expect(itest_log_has(rlog2, "skipped 1"), "see %s", rlog2);
	cr_expect_eq(itest_wait_int("SELECT version FROM tickets WHERE id = 't-14'", 3, WAIT_S), 3, "see %s", rlog2);
	itest_stop_ok(w);
	mq_close(&m);
	cr_expect(itest_str1("SELECT status FROM tickets WHERE id = ?", "t-14", got, sizeof got));
	cr_expect_str_eq(got, "InProgress", "number 2 took no effect, number 3 did");
	cr_expect(itest_str1("SELECT GROUP_CONCAT(CONCAT(version, ':', type, ':', outcome) ORDER BY version SEPARATOR ' ')"
	                     " FROM ticket_events WHERE ticket_id = ?", "t-14", got, sizeof got));
	cr_expect_str_eq(got, "1:TicketOpened:applied 2:TicketClosed:ignored 3:WorkStarted:applied");
	cr_expect(itest_str1("SELECT CONCAT(outcome, ' ', reason) FROM processed_messages WHERE message_id = ?", "t14-2",
	                     got, sizeof got));
	cr_expect_str_eq(got, "ignored skipped");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM held_events"), 0);
	cr_expect_eq(itest_wait_depth(itest_cfg()->dlq, 1, 5), 1, "only the conflict stays in the DLQ");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM outbox WHERE message_id LIKE 'SurveySent:t-14%'"), 0,
	             "a skipped close emits nothing");
}
