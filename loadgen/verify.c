/*
 * verify.c - the verifying half of inbox-loadgen.
 *
 * It first waits, with a bound, until the run is settled: every message
 * has left its trace (v_wait_idle: no ready message, no held event, no
 * unsent outbox row, every original's inbox row, the dead letters the run
 * must leave).
 * Then it reads what the worker left behind — processed_messages,
 * order_events, orders, the dead-letter queue, and the `<out>.verify` queue
 * that publish bound to the out exchange — and holds each against the
 * ledger.  This file runs those steps and prints the report; the ledger
 * reader is verify_ledger.c, the database and queue readers are
 * verify_read.c, the judge that compares them is verify_judge.c, and what
 * the definition's own statements wrote is verify_effects.c's.
 *
 * A statement's problems go to the same lists as the worker's own
 * (missing, doubled, wrong, unexpected), so they fail verify alike; the
 * effects, missing and orders lines count them apart, so that their words
 * (read by scripts/chaos) keep meaning what they meant.
 */
#include "verify.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "status.h"
#include "verify_effects.h"
#include "verify_judge.h"
#include "verify_ledger.h"
#include "verify_read.h"

static void v_print_list(const struct v_list *l)
{
	if (l->count == 0)
		return;
	printf("%s (%ld; first %ld):\n", l->title, l->count, l->count < l->max ? l->count : (long)l->max);
	for (long i = 0; i < l->count && i < l->max; i++)
		printf("  %s\n", l->lines[i]);
}

static json_t *v_list_json(const struct v_list *l)
{
	json_t *a = json_array();

	for (long i = 0; a != NULL && i < l->count && i < l->max; i++)
		json_array_append_new(a, json_string(l->lines[i]));
	return a;
}

/* The whole report as one JSON object on stdout: every figure of the text
 * report under a stable key.  Returns 0, or -1 when it could not be built. */
static long v_released(const struct v_state *st)
{
	return st->held_released[0] + st->held_released[1] + st->held_released[2] + st->held_released[3];
}

static int v_report_json(const struct v_state *st, const struct lg_verify_opts *vo, bool ok,
                         const struct v_figures *f)
{
	const struct v_fx_figures *g = v_fx_figures(st);
	json_t *by_reason = json_object(), *o, *holds, *stmts = v_fx_report_json(st);
	char *text;

	for (int i = 0; by_reason != NULL && i < st->ndead_reasons; i++)
		json_object_set_new(by_reason, st->dead_by_reason[i].reason, json_integer(st->dead_by_reason[i].n));
	o = json_pack("{s:s, s:s, s:b,"
	              " s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I},"
	              " s:{s:I, s:I, s:I, s:I, s:I},"
	              " s:{s:I, s:I, s:I, s:I},"
	              " s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I},"
	              " s:{s:I, s:I},"
	              " s:{s:I, s:I, s:o},"
	              " s:{s:I, s:I, s:I, s:I},"
	              " s:{s:I, s:I},"
	              " s:I, s:I,"
	              " s:{s:f, s:f}, s:{s:f, s:f, s:f},"
	              " s:{s:o, s:o, s:o, s:o}}",
	              "run", st->prefix, "ledger", vo->ledger, "ok", ok,
	              "published",
	              "messages", (json_int_t)json_integer_value(json_object_get(st->run, "published")),
	              "originals", (json_int_t)json_integer_value(json_object_get(st->run, "originals")),
	              "copies_immediate", (json_int_t)json_integer_value(json_object_get(st->run, "copies_immediate")),
	              "copies_concurrent", (json_int_t)json_integer_value(json_object_get(st->run, "copies_concurrent")),
	              "copies_delayed", (json_int_t)json_integer_value(json_object_get(st->run, "copies_delayed")),
	              "conflicts", (json_int_t)json_integer_value(json_object_get(st->run, "conflicts")),
	              "malformed", (json_int_t)json_integer_value(json_object_get(st->run, "malformed")),
	              "orders", (json_int_t)st->norders,
	              "inbox_rows", "applied", (json_int_t)st->outcome_count[0], "compensated",
	              (json_int_t)st->outcome_count[1], "ignored", (json_int_t)st->outcome_count[2], "dead_lettered",
	              (json_int_t)st->outcome_count[3], "held", (json_int_t)st->outcome_count[4],
	              "effects", "expected", (json_int_t)f->eff_exp, "exactly_once", (json_int_t)f->eff_found, "missing",
	              (json_int_t)st->miss_effects, "doubled", (json_int_t)(st->doubled.count - g->rows_doubled),
	              "missing", "total", (json_int_t)st->missing.count, "effects", (json_int_t)st->miss_effects,
	              "dead_letters", (json_int_t)st->miss_dead, "dead_letters_without_reason",
	              (json_int_t)st->miss_dead_bare, "conflict_dead_letters", (json_int_t)st->miss_conflicts,
	              "order_rows", (json_int_t)st->miss_orders, "emitted", (json_int_t)st->miss_emits,
	              "orders", "checked", (json_int_t)st->norders, "wrong",
	              (json_int_t)(st->wrong.count - st->wrong_ids - g->rows_wrong - g->sums_wrong),
	              "dead_letters", "expected", (json_int_t)f->dead_exp, "found", (json_int_t)f->dead_seen,
	              "copies_by_reason", by_reason,
	              "emitted", "expected", (json_int_t)f->emit_exp, "found", (json_int_t)f->emits_seen, "republished",
	              (json_int_t)st->republished, "without_stable_id", (json_int_t)st->wrong_ids,
	              "duplicates", "published", (json_int_t)f->dups_published, "absorbed", (json_int_t)f->dups_absorbed,
	              "unexpected", (json_int_t)st->unexpected.count, "other_runs_queue_messages",
	              (json_int_t)st->foreign,
	              "throughput", "msg_per_s", f->tput, "span_s", f->span,
	              "latency_ms", "p50", f->p50, "p99", f->p99, "max", f->pmax,
	              "lists", "missing", v_list_json(&st->missing), "doubled", v_list_json(&st->doubled), "wrong",
	              v_list_json(&st->wrong), "unexpected", v_list_json(&st->unexpected));
	/* Events that waited, from the rows' held_at (migration 0012). */
	holds = json_pack("{s:I, s:I, s:{s:I, s:I, s:I, s:I}, s:I, s:I}", "held", (json_int_t)st->held_total,
	                  "released", (json_int_t)v_released(st), "released_by_outcome", "applied",
	                  (json_int_t)st->held_released[0], "compensated", (json_int_t)st->held_released[1], "ignored",
	                  (json_int_t)st->held_released[2], "dead_lettered", (json_int_t)st->held_released[3], "expired",
	                  (json_int_t)st->held_expired, "still_held", (json_int_t)st->held_still);
	if (o == NULL || holds == NULL || json_object_set_new(o, "holds", holds) != 0 ||
	    (stmts != NULL && json_object_set_new(o, "statements", stmts) != 0) ||
	    (stmts != NULL && json_object_set_new(json_object_get(o, "missing"), "statement_rows",
	                                          json_integer((json_int_t)g->rows_missing)) != 0)) {
		fprintf(stderr, "inbox-loadgen: cannot build the JSON report\n");
		json_decref(o);
		return -1;
	}
	text = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	if (text == NULL)
		return -1;
	printf("%s\n", text);
	free(text);
	return 0;
}

/* The report for a reader (the figures, then each problem's ids). */
static void v_report_text(const struct v_state *st, const struct lg_verify_opts *vo, const struct v_figures *fig,
                          bool ok)
{
	const struct v_fx_figures *g = v_fx_figures(st);

	printf("inbox-loadgen verify: run %s, ledger %s\n", st->prefix, vo->ledger);
	printf("published   %lld messages: %lld originals, duplicate copies %lld immediate + %lld concurrent + %lld delayed,"
	       " %lld conflicts, %lld malformed; %lld orders\n",
	       (long long)json_integer_value(json_object_get(st->run, "published")),
	       (long long)json_integer_value(json_object_get(st->run, "originals")),
	       (long long)json_integer_value(json_object_get(st->run, "copies_immediate")),
	       (long long)json_integer_value(json_object_get(st->run, "copies_concurrent")),
	       (long long)json_integer_value(json_object_get(st->run, "copies_delayed")),
	       (long long)json_integer_value(json_object_get(st->run, "conflicts")),
	       (long long)json_integer_value(json_object_get(st->run, "malformed")), (long long)st->norders);
	printf("inbox rows  applied %ld, compensated %ld, ignored %ld, dead_lettered %ld, held %ld\n",
	       st->outcome_count[0], st->outcome_count[1], st->outcome_count[2], st->outcome_count[3], st->outcome_count[4]);
	printf("effects     expected %ld, exactly once %ld, missing %ld, doubled %ld\n", fig->eff_exp, fig->eff_found,
	       st->miss_effects, st->doubled.count - g->rows_doubled);
	/* Scripts read this line (scripts/chaos): keep its words. */
	printf("missing     %ld in all: effects %ld, dead-letters %ld (%ld of them reached the DLQ only without"
	       " x-inbox-reason), conflict dead-letters %ld, order rows %ld, emitted messages %ld",
	       st->missing.count, st->miss_effects, st->miss_dead, st->miss_dead_bare, st->miss_conflicts, st->miss_orders,
	       st->miss_emits);
	if (st->fx != NULL)
		printf(", statement rows %ld", g->rows_missing);
	printf("\n");
	printf("orders      %zu checked, wrong state or version %ld\n", st->norders,
	       st->wrong.count - st->wrong_ids - g->rows_wrong - g->sums_wrong);
	v_fx_report_text(st, stdout);
	printf("dead-letters expected %ld, found %ld; emitted expected %ld, found %ld (re-published %ld, without the"
	       " stable id %ld)\n", fig->dead_exp, fig->dead_seen, fig->emit_exp, fig->emits_seen, st->republished,
	       st->wrong_ids);
	/* Copies, not messages: a message delivered again after a crash may be
	 * dead-lettered twice (the DLQ is at-least-once too). */
	printf("dead-letter copies by reason:");
	if (st->ndead_reasons == 0)
		printf(" none");
	for (int i = 0; i < st->ndead_reasons; i++)
		printf("%s %s %ld", i ? "," : "", st->dead_by_reason[i].reason, st->dead_by_reason[i].n);
	printf("\n");
	printf("duplicates  %lld copies published, absorbed %lld (doubled effects %ld)\n", fig->dups_published,
	       fig->dups_absorbed, st->doubled.count - g->rows_doubled);
	printf("holds       held %ld, released %ld (applied %ld, compensated %ld, ignored %ld, dead_lettered %ld),"
	       " expired %ld, still held %ld\n",
	       st->held_total, v_released(st), st->held_released[0], st->held_released[1], st->held_released[2],
	       st->held_released[3], st->held_expired, st->held_still);
	printf("unexpected  %ld (other runs' queue messages left in place: %ld)\n", st->unexpected.count, st->foreign);
	if (fig->span > 0) {
		printf("throughput  %.0f msg/s (%zu inbox rows in %.2f s, first publish -> last commit)\n", fig->tput,
		       fig->rows, fig->span);
		printf("latency     publish -> commit p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", fig->p50, fig->p99, fig->pmax);
	}
	v_print_list(&st->missing);
	v_print_list(&st->doubled);
	v_print_list(&st->wrong);
	v_print_list(&st->unexpected);
	printf("result      %s\n", ok ? "OK: every effect exactly once" : "FAIL");
}

int lg_verify(const struct cfg *conf, const struct lg_verify_opts *vo)
{
	struct v_state st;
	struct v_figures fig;
	char (*lines)[200] = NULL;
	int exit_code = 1;

	memset(&st, 0, sizeof st);
	st.conf = conf;
	st.def = vo->def;
	st.lifecycle = vo->lifecycle;
	{
		char err[512];
		if (lg_plan_build(&st.plan, st.def, err, sizeof err) != 0) {
			fprintf(stderr, "inbox-loadgen: cannot read the %s lifecycle: %s\n", st.def->aggregate, err);
			return 1;
		}
	}
	lc_schema_tables(st.def, st.tables);
	lines = calloc((size_t)vo->list_max * 4, sizeof *lines);
	if (lines == NULL)
		return 1;
	st.missing = (struct v_list){ "MISSING", 0, vo->list_max, lines };
	st.doubled = (struct v_list){ "DOUBLED", 0, vo->list_max, lines + vo->list_max };
	st.wrong = (struct v_list){ "WRONG", 0, vo->list_max, lines + 2 * vo->list_max };
	st.unexpected = (struct v_list){ "UNEXPECTED", 0, vo->list_max, lines + 3 * vo->list_max };
	if (v_load(&st, vo->ledger) != 0)
		goto out;
	v_copy(st.verify_queue, sizeof st.verify_queue, json_object_get(st.run, "verify_queue"));
	if (v_wait_idle(&st, vo->timeout_s) != 0)
		goto out;
	if (v_read_db(&st) != ST_OK) {
		fprintf(stderr, "inbox-loadgen: reading the database: %s\n", db_errmsg(st.db));
		goto out;
	}
	if (v_read_queues(&st) != ST_OK)
		goto out;
	v_judge(&st, &fig);
	if (v_fx_check(&st) != ST_OK) {
		fprintf(stderr, "inbox-loadgen: reading what the statements wrote: %s\n", db_errmsg(st.db));
		goto out;
	}
	exit_code = st.missing.count == 0 && st.doubled.count == 0 && st.wrong.count == 0 && st.unexpected.count == 0 ? 0 : 1;
	if (vo->json) {
		exit_code = v_report_json(&st, vo, exit_code == 0, &fig) == 0
		                    ? exit_code
		                    : 1;
		goto out;
	}
	v_report_text(&st, vo, &fig, exit_code == 0);
out:
	v_state_free(&st);
	free(lines);
	return exit_code;
}
