/*
 * test_lifecycle_version.c - a definition that changes (issue 46, item 3)
 * against the real stack: every aggregate row and held event remembers
 * the version of the definition that decided it, a held event is decided
 * by the definition running when it is released, and `run` refuses at
 * start-up a definition that has lost a state rows are in or an event
 * held events are of, one line each with the count and the remedy.
 *
 * The definitions are tickets numbered by their producer (data.seq):
 *   - lifecycles/ticket.json, version "1": TicketClosed while Open is an
 *     invalid transition (test_sequence's t-4 pins that);
 *   - tests/lifecycles/ticket_close_ignored_when_open.json, no version
 *     declared (known by its content's hash): the same, with TicketClosed
 *     ignored while Open;
 *   - tests/lifecycles/ticket_v2.json, version "2": TicketReopened
 *     removed, a state Archived added (TicketArchived, from Resolved).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "itest.h"
#include "lifecycle.h"
#include "status.h"

#define WAIT_S 120
#define T0 "2026-03-04T05:06:07Z"

static void tk(struct mq *m, const char *id, const char *type, const char *ticket, int seq)
{
	char body[512];

	snprintf(body, sizeof body,
	         "{\"message_id\":\"%s\",\"source\":\"helpdesk\",\"type\":\"%s\",\"ticket_id\":\"%s\","
	         "\"occurred_at\":\"" T0 "\",\"data\":{\"seq\":%d}}", id, type, ticket, seq);
	itest_publish(m, type, body, id);
}

/* INBOX_LIFECYCLE=<the file rel of the source tree> into env. */
static void lifecycle_env(char *env, size_t cap, const char *rel)
{
	char path[4096];

	snprintf(env, cap, "INBOX_LIFECYCLE=%s", itest_source(rel, path, sizeof path));
}

/* The version a definition file is known by, as the worker loads it. */
static void version_of(const char *rel, char *out, size_t cap)
{
	char path[4096];
	struct lc_errors errs;
	struct lc_def *d = lc_load_file(itest_source(rel, path, sizeof path), &errs);

	cr_assert_not_null(d, "%s loads", rel);
	snprintf(out, cap, "%s", d->version);
	lc_free(d);
}

/* Fresh tables for the ticket, migrated by the definition in env. */
static void ticket_fresh(const char *const *menv)
{
	const char *margs[] = { "migrate", NULL };
	int st;

	itest_fresh();
	cr_assert_eq(db_exec(itest_db(), "DROP TABLE IF EXISTS tickets, ticket_events, ticket_locks"), ST_OK);
	st = itest_wait_exit(itest_spawn(margs, menv), 120);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "migrate with the ticket lifecycle (status %d)", st);
}

/* `run` by the definition in menv, which must refuse to start: exit 2,
 * having consumed nothing.  Its log in log. */
static void expect_refused(const char *const *menv, const char *log)
{
	const char *args[] = { "run", NULL };
	int st = itest_wait_exit(itest_spawn_logged(args, menv, log), 60);

	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "run refuses (status %d); see %s", st, log);
}

/* A held event keeps the version it was held under; released by a worker
 * running another definition it is decided by that one's table (here
 * ignored where the old one dead-letters it), the release says both
 * versions, and the row it leaves says the new one.  The change is one
 * the worker can honour: it starts, saying what was decided under the
 * old version. */
Test(lifecycle_version, a_held_event_is_decided_by_the_definition_that_releases_it, .timeout = 600)
{
	char env1[4200], env2[4200], log1[256], log2[256], got[128], v2[LC_VERSION_MAX + 1], want[256];
	const char *menv1[] = { env1, NULL };
	const char *menv2[] = { env2, NULL };
	struct mq *m;
	pid_t w;

	lifecycle_env(env1, sizeof env1, "lifecycles/ticket.json");
	lifecycle_env(env2, sizeof env2, "tests/lifecycles/ticket_close_ignored_when_open.json");
	version_of("tests/lifecycles/ticket_close_ignored_when_open.json", v2, sizeof v2);
	ticket_fresh(menv1);

	/* version 1: t-2 is open, and t-1's number 2 (a close) waits for its
	 * number 1 */
	itest_log_path(log1, sizeof log1, "lcv-held-1");
	w = itest_worker_logged(1, menv1, log1);
	m = itest_mq();
	tk(m, "t2-1", "TicketOpened", "t-2", 1);
	tk(m, "t1-2", "TicketClosed", "t-1", 2);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM held_events WHERE message_id = 't1-2'", 1, WAIT_S), 1,
	             "the close is held; see %s", log1);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM tickets WHERE id = 't-2'", 1, WAIT_S), 1, "see %s", log1);
	itest_stop_ok(w);
	cr_expect(itest_str1("SELECT lifecycle_version FROM held_events WHERE message_id = ?", "t1-2", got, sizeof got));
	cr_expect_str_eq(got, "1", "held under version 1");
	cr_expect(itest_str1("SELECT lifecycle_version FROM tickets WHERE id = ?", "t-2", got, sizeof got));
	cr_expect_str_eq(got, "1", "the row says the version that decided it");

	/* the other definition: it starts, and says what version 1 decided */
	itest_log_path(log2, sizeof log2, "lcv-held-2");
	w = itest_worker_logged(1, menv2, log2);
	snprintf(want, sizeof want, "definition version changed from 1 to %s: 1 rows, 1 held events decided under 1", v2);
	itest_wait_log(log2, want, WAIT_S);
	tk(m, "t1-1", "TicketOpened", "t-1", 1);
	cr_assert_eq(itest_wait_int("SELECT version FROM tickets WHERE id = 't-1'", 2, WAIT_S), 2,
	             "the close took number 2; see %s", log2);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);

	cr_expect(itest_str1("SELECT CONCAT(status, ' ', version, ' ', lifecycle_version) FROM tickets WHERE id = ?", "t-1",
	                     got, sizeof got));
	snprintf(want, sizeof want, "Open 2 %s", v2);
	cr_expect_str_eq(got, want, "ignored by the new definition, which the row names");
	cr_expect_eq(itest_int1("SELECT COUNT(*) FROM processed_messages WHERE message_id = ? AND outcome = 'ignored'",
	                        "t1-2"), 1, "version 1 would have dead-lettered it");
	cr_expect_eq(itest_queue_depth(itest_cfg()->dlq), 0, "nothing dead-lettered");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM held_events"), 0);
	snprintf(want, sizeof want, "decided_by=%s", v2);
	cr_expect(itest_log_lines(log2, (const char *const[]){ "held event decided by another definition version",
	                                                       "message_id=t1-2", "held_under=1", want, "outcome=ignored",
	                                                       NULL }) == 1, "one line says both versions; see %s", log2);
}

/* A definition that no longer has an event which held events are of
 * cannot release them: run refuses, counting them, with the remedy, and
 * consumes nothing. */
Test(lifecycle_version, run_refuses_a_definition_without_an_event_held_events_are_of, .timeout = 600)
{
	char env1[4200], env2[4200], log1[256], log2[256];
	const char *menv1[] = { env1, NULL };
	const char *menv2[] = { env2, NULL };
	struct mq *m;
	pid_t w;

	lifecycle_env(env1, sizeof env1, "lifecycles/ticket.json");
	lifecycle_env(env2, sizeof env2, "tests/lifecycles/ticket_v2.json");
	ticket_fresh(menv1);
	itest_log_path(log1, sizeof log1, "lcv-event-1");
	w = itest_worker_logged(1, menv1, log1);
	m = itest_mq();
	tk(m, "t3-2", "TicketReopened", "t-3", 2);
	tk(m, "t4-5", "TicketReopened", "t-4", 5);
	tk(m, "t4-3", "WorkStarted", "t-4", 3);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM held_events", 3, WAIT_S), 3, "see %s", log1);
	itest_stop_ok(w);

	tk(m, "t3-1", "TicketOpened", "t-3", 1);
	mq_close(&m);
	cr_assert_eq(itest_wait_depth(itest_cfg()->queue, 1, WAIT_S), 1);

	itest_log_path(log2, sizeof log2, "lcv-event-2");
	expect_refused(menv2, log2);
	cr_expect(itest_log_has(log2, "inbox-worker: the definition (version 2) has no event TicketReopened, which 2 held "
	                              "events are of: keep it (run version 1) until they are released or expire "
	                              "(INBOX_HOLD_TTL), then start version 2"), "see %s", log2);
	cr_expect_eq(itest_log_lines(log2, (const char *const[]){ NULL }), 1, "one line; see %s", log2);
	cr_expect_eq(itest_queue_depth(itest_cfg()->queue), 1, "nothing consumed");
	cr_expect_eq(itest_int("SELECT COUNT(*) FROM held_events"), 3);
}

/* A definition that no longer has a state which rows are in cannot decide
 * their events: run refuses, counting the rows, with the remedy. */
Test(lifecycle_version, run_refuses_a_definition_without_a_state_rows_are_in, .timeout = 600)
{
	char env1[4200], env2[4200], log1[256], log2[256];
	const char *menv1[] = { env1, NULL };
	const char *menv2[] = { env2, NULL };
	struct mq *m;
	pid_t w;

	lifecycle_env(env1, sizeof env1, "tests/lifecycles/ticket_v2.json");
	lifecycle_env(env2, sizeof env2, "lifecycles/ticket.json");
	ticket_fresh(menv1);
	itest_log_path(log1, sizeof log1, "lcv-state-1");
	w = itest_worker_logged(1, menv1, log1);
	m = itest_mq();
	for (int t = 5; t <= 6; t++) {
		char id[16], mid[32];

		snprintf(id, sizeof id, "t-%d", t);
		snprintf(mid, sizeof mid, "t%d-1", t);
		tk(m, mid, "TicketOpened", id, 1);
		snprintf(mid, sizeof mid, "t%d-2", t);
		tk(m, mid, "WorkStarted", id, 2);
		snprintf(mid, sizeof mid, "t%d-3", t);
		tk(m, mid, "TicketResolved", id, 3);
		snprintf(mid, sizeof mid, "t%d-4", t);
		tk(m, mid, "TicketArchived", id, 4);
	}
	tk(m, "t7-1", "TicketOpened", "t-7", 1);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM tickets WHERE status = 'Archived'", 2, WAIT_S), 2, "see %s",
	             log1);
	itest_wait_queue_empty(itest_cfg()->queue, WAIT_S);
	itest_stop_ok(w);
	mq_close(&m);

	itest_log_path(log2, sizeof log2, "lcv-state-2");
	expect_refused(menv2, log2);
	cr_expect(itest_log_has(log2, "inbox-worker: the definition (version 1) has no state Archived, which 2 tickets "
	                              "rows are in: add the state back, or move those rows (UPDATE tickets SET status = "
	                              "'<a state of version 1>' WHERE status = 'Archived') before starting version 1"),
	          "see %s", log2);
	cr_expect_eq(itest_log_lines(log2, (const char *const[]){ NULL }), 1, "one line; see %s", log2);
}
