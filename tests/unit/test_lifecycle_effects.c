/*
 * test_lifecycle_effects.c - a definition's own statements and fields as
 * lc_load reads them (issue 45): where each statement belongs (the event
 * applied, or compensated after a terminal state), what its parameters
 * are bound from, what is refused at its line, and what the arrival-order
 * check makes of them.  lc_fx_compile's own reading is test_lifecycle_fx.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aggregate.h"
#include "lifecycle.h"
#include "lifecycle_schema.h"
#include "msg.h"

static struct lc_def *load_source_file(const char *rel)
{
	char path[4096];
	const char *root = getenv("INBOX_SOURCE_ROOT");
	struct lc_errors errs;
	struct lc_def *d;

	cr_assert_not_null(root);
	snprintf(path, sizeof path, "%s/%s", root, rel);
	d = lc_load_file(path, &errs);
	if (d == NULL)
		lc_errors_print(&errs, path, stderr);
	cr_assert_not_null(d, "%s loads", rel);
	return d;
}

static void expect_error(const char *text, int line, const char *want)
{
	struct lc_errors errs;
	struct lc_def *d = lc_load(text, strlen(text), &errs);
	bool found = false;

	cr_assert_null(d, "refused: %s", want);
	for (int i = 0; i < errs.n; i++) {
		if (strstr(errs.e[i].text, want) != NULL) {
			found = true;
			cr_expect_eq(errs.e[i].line, line, "'%s' at line %d, want %d", errs.e[i].text, errs.e[i].line, line);
		}
	}
	if (!found)
		lc_errors_print(&errs, "test", stderr);
	cr_expect(found, "an error saying '%s'", want);
}

/* A two-event definition whose second event (line 6) carries EXTRA. */
static char *def_with(const char *extra)
{
	static const char head[] = "{\"lifecycle\": 1, \"aggregate\": \"a\", \"table\": \"t\", \"key\": \"k\",\n"
	                           "\"states\": [\"A\", \"B\"], \"main_path\": [\"A\", \"B\"], \"terminal\": [\"B\"],\n"
	                           "\"events\": [{\"type\": \"E\", \"creates\": \"A\"},\n"
	                           "  {\"type\": \"F\", \"from\": [\"A\"], \"to\": \"B\",\n"
	                           "   \"fields\": {\"n\": {\"type\": \"integer\", \"required\": true}},\n";
	size_t len = sizeof head + strlen(extra) + 8;
	char *out = malloc(len);

	cr_assert_not_null(out);
	snprintf(out, len, "%s%s}]}", head, extra);
	return out;
}

static void expect_def_error(const char *extra, int line, const char *want)
{
	char *text = def_with(extra);

	expect_error(text, line, want);
	free(text);
}

static bool check_of(const char *extra, struct lc_check *chk)
{
	char *text = def_with(extra);
	struct lc_errors errs;
	struct lc_def *d = lc_load(text, strlen(text), &errs);
	bool ok;

	if (d == NULL)
		lc_errors_print(&errs, "test", stderr);
	cr_assert_not_null(d, "loads: %s", extra);
	ok = lc_check_order_independence(d, chk);
	lc_free(d);
	free(text);
	return ok;
}

Test(lifecycle_effects, the_invoice_statements_belong_to_their_event_and_case)
{
	struct lc_def *d = load_source_file("lifecycles/invoice.json");
	int pay = lc_event_find(d, "PaymentReceived"), paid = lc_state_find(d, "Paid"),
	    cancelled = lc_state_find(d, "Cancelled"), issued = lc_state_find(d, "Issued"), first;
	const struct lc_stmt *st;

	cr_assert_geq(pay, 0);
	cr_expect_eq(d->nstmts, 4, "two applied, two compensating after Cancelled");
	cr_expect_eq(lc_event_stmts(d, pay, issued, LC_APPLY, &first), 2);
	st = &d->stmts[first];
	cr_expect_eq(st->event, pay);
	cr_expect_eq(st->after, 0);
	cr_expect_eq(st->index, 1);
	cr_expect_gt(st->line, 20, "the statement's own line, not the event's: %d", st->line);
	cr_expect_eq(st->fx.kind, LC_FX_INSERT);
	cr_expect_str_eq(st->fx.table, "ledger_entries");
	cr_expect(st->fx.commutes, "keyed by :message_id: %s", st->fx.why);
	cr_expect_eq(st->fx.nparams, 4);
	cr_expect_eq(st->fx.params[0].src, LC_FX_MESSAGE_ID);
	cr_expect_eq(st->fx.params[2].src, LC_FX_KEY, ":invoice_id is the aggregate's key");
	cr_assert_eq(st->fx.params[1].src, LC_FX_SET);
	cr_expect_str_eq(d->events[pay].sets[st->fx.params[1].set].field, "account_id");
	cr_expect_str_eq(d->events[pay].sets[st->fx.params[1].set].column, "", "a field, not a column");
	cr_expect_eq(d->events[pay].sets[st->fx.params[1].set].type, LC_TYPE_INTEGER);
	cr_expect_not_null(strstr(st->fx.sql, "NOW(6)"), ":applied_at is the server's clock: %s", st->fx.sql);
	cr_expect(d->stmts[first + 1].fx.commutes, "an addition: %s", d->stmts[first + 1].fx.why);
	cr_expect_eq(d->stmts[first + 1].index, 2);

	cr_expect_eq(lc_event_stmts(d, pay, cancelled, LC_COMPENSATE, &first), 2);
	cr_expect_eq(d->stmts[first].after, cancelled);
	cr_expect_not_null(strstr(d->stmts[first].fx.sql, "'refund_due'"));
	cr_expect_eq(lc_event_stmts(d, pay, paid, lc_decide(d, paid, 0, pay).decision, &first), 0,
	             "a second payment of a paid invoice is ignored, and runs nothing");
	cr_expect_eq(lc_event_stmts(d, pay, issued, LC_IGNORE, &first), 0, "nothing runs unless it takes effect");
	cr_expect_eq(lc_event_stmts(d, lc_event_find(d, "InvoiceCancelled"), issued, LC_APPLY, &first), 0);
	lc_free(d);
}

Test(lifecycle_effects, the_invoice_is_order_independent_with_its_statements)
{
	struct lc_def *d = load_source_file("lifecycles/invoice.json");
	struct lc_check chk;

	cr_expect(lc_check_order_independence(d, &chk), "%s", chk.why);
	lc_free(d);
}

Test(lifecycle_effects, fields_are_typed_values_and_no_columns)
{
	struct lc_def *d = load_source_file("lifecycles/invoice.json");
	struct agg_binding b;
	char why[512] = "", *ddl = malloc(65536);
	struct msg m;
	const char *body = "{\"message_id\":\"m-1\",\"type\":\"PaymentReceived\",\"invoice_id\":\"i-1\","
	                   "\"data\":{\"account_id\":7,\"amount_cents\":1250}}";
	int pay = lc_event_find(d, "PaymentReceived");

	cr_assert_not_null(ddl);
	cr_assert_eq(agg_bind(d, &b, why, sizeof why), 0, "%s", why);
	for (int c = 0; c < b.ncols; c++)
		cr_expect_neq(b.cols[c][0], '\0', "column %d has a name", c);
	agg_use(&b);
	cr_assert_eq(msg_parse(body, strlen(body), 65536, NULL, &m), MSG_REASON_NONE, "%s", m.detail);
	for (int k = 0; k < d->events[pay].nsets; k++) {
		const struct lc_set *st = &d->events[pay].sets[k];

		if (strcmp(st->field, "amount_cents") == 0) {
			cr_expect(m.vals[k].has);
			cr_expect_eq(m.vals[k].i, 1250);
		}
	}
	body = "{\"message_id\":\"m-2\",\"type\":\"PaymentReceived\",\"invoice_id\":\"i-1\",\"data\":{\"account_id\":7}}";
	cr_expect_eq(msg_parse(body, strlen(body), 65536, NULL, &m), MSG_REASON_MISSING_FIELD);
	cr_expect_str_eq(m.detail, "data.amount_cents is missing (PaymentReceived needs it)");
	body = "{\"message_id\":\"m-3\",\"type\":\"PaymentReceived\",\"invoice_id\":\"i-1\","
	       "\"data\":{\"account_id\":7,\"amount_cents\":0}}";
	cr_expect_eq(msg_parse(body, strlen(body), 65536, NULL, &m), MSG_REASON_INVALID_FIELD, "below min");
	agg_use(NULL);
	cr_assert_eq(lc_schema_ddl(d, ddl, 65536), 0);
	cr_expect_null(strstr(ddl, "``"), "no column without a name:\n%s", ddl);
	cr_expect_not_null(strstr(ddl, "`amount_due_cents`"), "%s", ddl);
	cr_expect_null(strstr(ddl, "`amount_cents`"), "a field is no column of invoices:\n%s", ddl);
	free(ddl);
	lc_free(d);
}

Test(lifecycle_effects, a_statement_is_refused_at_its_own_line)
{
	expect_def_error("   \"statements\": [\n\"UPDATE x SET y = y + :data.missing\"]", 7,
	                 "statement 1 of F: \":data.missing\" names no parameter this event declares");
	expect_def_error("   \"statements\": [\"INSERT INTO l (n, m) VALUES (:data.n, :message_id)\",\n"
	                 "\"DROP TABLE l\"]",
	                 7, "statement 2 of F: ");
	expect_def_error("   \"statements\": [\n\"INSERT INTO processed_messages (message_id) VALUES (:message_id)\"]", 7,
	                 "writes processed_messages, a table the worker keeps itself");
	expect_def_error("   \"statements\": [\n\"UPDATE t SET n = n + :data.n\"]", 7,
	                 "writes t, a table the worker keeps itself");
	expect_def_error("   \"statements\": [\n\"DELETE FROM a_events WHERE 1 = :data.n\"]", 7,
	                 "writes a_events, a table the worker keeps itself");
	expect_def_error("   \"statements\": [\n7]", 7, "a statement is a string of SQL");
	expect_def_error("   \"statements\": \"UPDATE x SET y = y + 1\"", 6, "\"statements\" is a list");
	expect_def_error("   \"fields\": {},\n   \"sets\": {\"c\": {\"from\": \"data.n\", \"type\": \"integer\"}}", 6,
	                 "duplicate object key");
	expect_def_error("   \"after\": {\"B\": {\"statements\": [\"UPDATE x SET y = y + :data.n\"]}}", 6,
	                 "statements after a terminal state run when the event compensates");
}

Test(lifecycle_effects, a_field_is_declared_once_with_a_type)
{
	char *text = def_with("   \"sets\": {\"c\": {\"from\": \"data.n\", \"type\": \"integer\"}}");

	expect_error(text, 5, "field \"n\" is declared twice");
	free(text);
	expect_error("{\"lifecycle\": 1, \"aggregate\": \"a\", \"table\": \"t\", \"key\": \"k\",\n"
	             "\"states\": [\"A\"], \"main_path\": [\"A\"], \"terminal\": [\"A\"],\n"
	             "\"events\": [{\"type\": \"E\", \"creates\": \"A\",\n"
	             "  \"fields\": {\"n\": {\"from\": \"data.m\", \"type\": \"integer\"}}}]}",
	             4, "a field is data.<its name>: remove \"from\"");
}

Test(lifecycle_effects, the_check_refuses_a_statement_that_does_not_commute)
{
	struct lc_check chk;

	cr_expect(check_of("   \"statements\": [\"UPDATE x SET y = y + :data.n WHERE id = :k\"]", &chk), "%s", chk.why);
	cr_expect_not(check_of("   \"statements\": [\"UPDATE x SET y = :data.n WHERE id = 1\"]", &chk));
	cr_expect_not_null(strstr(chk.why, "statement 1 of F (line 6) does not commute"), "%s", chk.why);
	cr_expect_not_null(strstr(chk.why, "two arrival orders"), "%s", chk.why);
}

Test(lifecycle_effects, the_check_refuses_statements_one_arrival_order_runs_and_another_does_not)
{
	struct lc_check chk;
	/* [E, F, G]: F applies and runs its statement; [E, G, F]: F comes
	 * after B and compensates, which runs none.  State, version, ledger
	 * rows and emits are the same either way: only the statements differ. */
	static const char text[] =
		"{\"lifecycle\": 1, \"aggregate\": \"a\", \"table\": \"t\", \"key\": \"k\",\n"
		"\"states\": [\"A\", \"M\", \"B\"], \"main_path\": [\"A\", \"M\", \"B\"], \"terminal\": [\"B\"],\n"
		"\"events\": [{\"type\": \"E\", \"creates\": \"A\"},\n"
		"  {\"type\": \"F\", \"from\": [\"A\"], \"to\": \"M\", \"after\": {\"B\": {\"compensate\": []}},\n"
		"   \"statements\": [\"INSERT INTO l (m) VALUES (:message_id)\"]},\n"
		"  {\"type\": \"G\", \"from\": [\"A\", \"M\"], \"to\": \"B\", \"after\": {\"B\": \"ignore\"}}]}";
	struct lc_errors errs;
	struct lc_def *d = lc_load(text, strlen(text), &errs);

	if (d == NULL)
		lc_errors_print(&errs, "test", stderr);
	cr_assert_not_null(d);
	cr_expect_not(lc_check_order_independence(d, &chk));
	cr_expect_not_null(strstr(chk.why, "statements of F run"), "%s", chk.why);
	lc_free(d);
}

Test(lifecycle_effects, the_same_statements_applied_or_compensating_are_one_effect)
{
	struct lc_check chk;
	/* As above, but F runs the same statement when it compensates after
	 * B: its row is written whichever way it takes effect. */
	static const char text[] =
		"{\"lifecycle\": 1, \"aggregate\": \"a\", \"table\": \"t\", \"key\": \"k\",\n"
		"\"states\": [\"A\", \"M\", \"B\"], \"main_path\": [\"A\", \"M\", \"B\"], \"terminal\": [\"B\"],\n"
		"\"events\": [{\"type\": \"E\", \"creates\": \"A\"},\n"
		"  {\"type\": \"F\", \"from\": [\"A\"], \"to\": \"M\", \"after\": {\"B\": {\"compensate\": [],\n"
		"   \"statements\": [\"INSERT INTO l (m) VALUES (:message_id)\"]}},\n"
		"   \"statements\": [\"INSERT INTO l (m) VALUES (:message_id)\"]},\n"
		"  {\"type\": \"G\", \"from\": [\"A\", \"M\"], \"to\": \"B\", \"after\": {\"B\": \"ignore\"}}]}";
	struct lc_errors errs;
	struct lc_def *d = lc_load(text, strlen(text), &errs);

	if (d == NULL)
		lc_errors_print(&errs, "test", stderr);
	cr_assert_not_null(d);
	cr_expect(lc_check_order_independence(d, &chk), "%s", chk.why);
	lc_free(d);
}
