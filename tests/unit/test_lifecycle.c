/*
 * test_lifecycle.c - the lifecycle definition (common/lifecycle.h) and the
 * order engine it drives.
 *
 * today_table below is the order table as the C table in common/aggregate.c
 * decided it before the definition file existed: every (state, flags,
 * event) cell, 6 x 4 x 5 = 120, recorded by running that code.  It is the
 * record the file-driven engine must reproduce cell for cell.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lifecycle.h"
#include "lifecycle_emit.h"
#include "lifecycle_schema.h"
#include "msg.h"
#include "aggregate.h"

struct cell {
	enum order_state state;
	unsigned flags;
	enum msg_type ev;
	enum lc_decision decision;
	enum order_state next;
	unsigned next_flags;
	unsigned emits;
};

/* Recorded from common/aggregate.c's C table (commit 5bfff4a). */
static const struct cell today_table[] = {
	{ ORDER_NONE, 0u, MSG_ORDER_CREATED, LC_APPLY, ORDER_CREATED, 0u, 0u },
	{ ORDER_NONE, 0u, MSG_PAYMENT_AUTHORIZED, LC_HOLD, ORDER_NONE, 0u, 0u },
	{ ORDER_NONE, 0u, MSG_INVENTORY_RESERVED, LC_HOLD, ORDER_NONE, 0u, 0u },
	{ ORDER_NONE, 0u, MSG_SHIPMENT_CREATED, LC_HOLD, ORDER_NONE, 0u, 0u },
	{ ORDER_NONE, 0u, MSG_ORDER_CANCELLED, LC_HOLD, ORDER_NONE, 0u, 0u },
	{ ORDER_NONE, 1u, MSG_ORDER_CREATED, LC_APPLY, ORDER_CREATED, 1u, 0u },
	{ ORDER_NONE, 1u, MSG_PAYMENT_AUTHORIZED, LC_HOLD, ORDER_NONE, 1u, 0u },
	{ ORDER_NONE, 1u, MSG_INVENTORY_RESERVED, LC_HOLD, ORDER_NONE, 1u, 0u },
	{ ORDER_NONE, 1u, MSG_SHIPMENT_CREATED, LC_HOLD, ORDER_NONE, 1u, 0u },
	{ ORDER_NONE, 1u, MSG_ORDER_CANCELLED, LC_HOLD, ORDER_NONE, 1u, 0u },
	{ ORDER_NONE, 2u, MSG_ORDER_CREATED, LC_APPLY, ORDER_CREATED, 2u, 0u },
	{ ORDER_NONE, 2u, MSG_PAYMENT_AUTHORIZED, LC_HOLD, ORDER_NONE, 2u, 0u },
	{ ORDER_NONE, 2u, MSG_INVENTORY_RESERVED, LC_HOLD, ORDER_NONE, 2u, 0u },
	{ ORDER_NONE, 2u, MSG_SHIPMENT_CREATED, LC_HOLD, ORDER_NONE, 2u, 0u },
	{ ORDER_NONE, 2u, MSG_ORDER_CANCELLED, LC_HOLD, ORDER_NONE, 2u, 0u },
	{ ORDER_NONE, 3u, MSG_ORDER_CREATED, LC_APPLY, ORDER_CREATED, 3u, 0u },
	{ ORDER_NONE, 3u, MSG_PAYMENT_AUTHORIZED, LC_HOLD, ORDER_NONE, 3u, 0u },
	{ ORDER_NONE, 3u, MSG_INVENTORY_RESERVED, LC_HOLD, ORDER_NONE, 3u, 0u },
	{ ORDER_NONE, 3u, MSG_SHIPMENT_CREATED, LC_HOLD, ORDER_NONE, 3u, 0u },
	{ ORDER_NONE, 3u, MSG_ORDER_CANCELLED, LC_HOLD, ORDER_NONE, 3u, 0u },
	{ ORDER_CREATED, 0u, MSG_ORDER_CREATED, LC_IGNORE, ORDER_CREATED, 0u, 0u },
	{ ORDER_CREATED, 0u, MSG_PAYMENT_AUTHORIZED, LC_APPLY, ORDER_PAID, 1u, 1u },
	{ ORDER_CREATED, 0u, MSG_INVENTORY_RESERVED, LC_HOLD, ORDER_CREATED, 0u, 0u },
	{ ORDER_CREATED, 0u, MSG_SHIPMENT_CREATED, LC_HOLD, ORDER_CREATED, 0u, 0u },
	{ ORDER_CREATED, 0u, MSG_ORDER_CANCELLED, LC_APPLY, ORDER_CANCELLED, 0u, 0u },
	{ ORDER_CREATED, 1u, MSG_ORDER_CREATED, LC_IGNORE, ORDER_CREATED, 1u, 0u },
	{ ORDER_CREATED, 1u, MSG_PAYMENT_AUTHORIZED, LC_APPLY, ORDER_PAID, 1u, 1u },
	{ ORDER_CREATED, 1u, MSG_INVENTORY_RESERVED, LC_HOLD, ORDER_CREATED, 1u, 0u },
	{ ORDER_CREATED, 1u, MSG_SHIPMENT_CREATED, LC_HOLD, ORDER_CREATED, 1u, 0u },
	{ ORDER_CREATED, 1u, MSG_ORDER_CANCELLED, LC_APPLY, ORDER_CANCELLED, 1u, 2u },
	{ ORDER_CREATED, 2u, MSG_ORDER_CREATED, LC_IGNORE, ORDER_CREATED, 2u, 0u },
	{ ORDER_CREATED, 2u, MSG_PAYMENT_AUTHORIZED, LC_APPLY, ORDER_PAID, 3u, 1u },
	{ ORDER_CREATED, 2u, MSG_INVENTORY_RESERVED, LC_HOLD, ORDER_CREATED, 2u, 0u },
	{ ORDER_CREATED, 2u, MSG_SHIPMENT_CREATED, LC_HOLD, ORDER_CREATED, 2u, 0u },
	{ ORDER_CREATED, 2u, MSG_ORDER_CANCELLED, LC_APPLY, ORDER_CANCELLED, 2u, 4u },
	{ ORDER_CREATED, 3u, MSG_ORDER_CREATED, LC_IGNORE, ORDER_CREATED, 3u, 0u },
	{ ORDER_CREATED, 3u, MSG_PAYMENT_AUTHORIZED, LC_APPLY, ORDER_PAID, 3u, 1u },
	{ ORDER_CREATED, 3u, MSG_INVENTORY_RESERVED, LC_HOLD, ORDER_CREATED, 3u, 0u },
	{ ORDER_CREATED, 3u, MSG_SHIPMENT_CREATED, LC_HOLD, ORDER_CREATED, 3u, 0u },
	{ ORDER_CREATED, 3u, MSG_ORDER_CANCELLED, LC_APPLY, ORDER_CANCELLED, 3u, 6u },
	{ ORDER_PAID, 0u, MSG_ORDER_CREATED, LC_IGNORE, ORDER_PAID, 0u, 0u },
	{ ORDER_PAID, 0u, MSG_PAYMENT_AUTHORIZED, LC_IGNORE, ORDER_PAID, 0u, 0u },
	{ ORDER_PAID, 0u, MSG_INVENTORY_RESERVED, LC_APPLY, ORDER_RESERVED, 2u, 0u },
	{ ORDER_PAID, 0u, MSG_SHIPMENT_CREATED, LC_HOLD, ORDER_PAID, 0u, 0u },
	{ ORDER_PAID, 0u, MSG_ORDER_CANCELLED, LC_APPLY, ORDER_CANCELLED, 0u, 0u },
	{ ORDER_PAID, 1u, MSG_ORDER_CREATED, LC_IGNORE, ORDER_PAID, 1u, 0u },
	{ ORDER_PAID, 1u, MSG_PAYMENT_AUTHORIZED, LC_IGNORE, ORDER_PAID, 1u, 0u },
	{ ORDER_PAID, 1u, MSG_INVENTORY_RESERVED, LC_APPLY, ORDER_RESERVED, 3u, 0u },
	{ ORDER_PAID, 1u, MSG_SHIPMENT_CREATED, LC_HOLD, ORDER_PAID, 1u, 0u },
	{ ORDER_PAID, 1u, MSG_ORDER_CANCELLED, LC_APPLY, ORDER_CANCELLED, 1u, 2u },
	{ ORDER_PAID, 2u, MSG_ORDER_CREATED, LC_IGNORE, ORDER_PAID, 2u, 0u },
	{ ORDER_PAID, 2u, MSG_PAYMENT_AUTHORIZED, LC_IGNORE, ORDER_PAID, 2u, 0u },
	{ ORDER_PAID, 2u, MSG_INVENTORY_RESERVED, LC_APPLY, ORDER_RESERVED, 2u, 0u },
	{ ORDER_PAID, 2u, MSG_SHIPMENT_CREATED, LC_HOLD, ORDER_PAID, 2u, 0u },
	{ ORDER_PAID, 2u, MSG_ORDER_CANCELLED, LC_APPLY, ORDER_CANCELLED, 2u, 4u },
	{ ORDER_PAID, 3u, MSG_ORDER_CREATED, LC_IGNORE, ORDER_PAID, 3u, 0u },
	{ ORDER_PAID, 3u, MSG_PAYMENT_AUTHORIZED, LC_IGNORE, ORDER_PAID, 3u, 0u },
	{ ORDER_PAID, 3u, MSG_INVENTORY_RESERVED, LC_APPLY, ORDER_RESERVED, 3u, 0u },
	{ ORDER_PAID, 3u, MSG_SHIPMENT_CREATED, LC_HOLD, ORDER_PAID, 3u, 0u },
	{ ORDER_PAID, 3u, MSG_ORDER_CANCELLED, LC_APPLY, ORDER_CANCELLED, 3u, 6u },
	{ ORDER_RESERVED, 0u, MSG_ORDER_CREATED, LC_IGNORE, ORDER_RESERVED, 0u, 0u },
	{ ORDER_RESERVED, 0u, MSG_PAYMENT_AUTHORIZED, LC_IGNORE, ORDER_RESERVED, 0u, 0u },
	{ ORDER_RESERVED, 0u, MSG_INVENTORY_RESERVED, LC_IGNORE, ORDER_RESERVED, 0u, 0u },
	{ ORDER_RESERVED, 0u, MSG_SHIPMENT_CREATED, LC_APPLY, ORDER_SHIPPED, 0u, 0u },
	{ ORDER_RESERVED, 0u, MSG_ORDER_CANCELLED, LC_APPLY, ORDER_CANCELLED, 0u, 0u },
	{ ORDER_RESERVED, 1u, MSG_ORDER_CREATED, LC_IGNORE, ORDER_RESERVED, 1u, 0u },
	{ ORDER_RESERVED, 1u, MSG_PAYMENT_AUTHORIZED, LC_IGNORE, ORDER_RESERVED, 1u, 0u },
	{ ORDER_RESERVED, 1u, MSG_INVENTORY_RESERVED, LC_IGNORE, ORDER_RESERVED, 1u, 0u },
	{ ORDER_RESERVED, 1u, MSG_SHIPMENT_CREATED, LC_APPLY, ORDER_SHIPPED, 1u, 0u },
	{ ORDER_RESERVED, 1u, MSG_ORDER_CANCELLED, LC_APPLY, ORDER_CANCELLED, 1u, 2u },
	{ ORDER_RESERVED, 2u, MSG_ORDER_CREATED, LC_IGNORE, ORDER_RESERVED, 2u, 0u },
	{ ORDER_RESERVED, 2u, MSG_PAYMENT_AUTHORIZED, LC_IGNORE, ORDER_RESERVED, 2u, 0u },
	{ ORDER_RESERVED, 2u, MSG_INVENTORY_RESERVED, LC_IGNORE, ORDER_RESERVED, 2u, 0u },
	{ ORDER_RESERVED, 2u, MSG_SHIPMENT_CREATED, LC_APPLY, ORDER_SHIPPED, 2u, 0u },
	{ ORDER_RESERVED, 2u, MSG_ORDER_CANCELLED, LC_APPLY, ORDER_CANCELLED, 2u, 4u },
	{ ORDER_RESERVED, 3u, MSG_ORDER_CREATED, LC_IGNORE, ORDER_RESERVED, 3u, 0u },
	{ ORDER_RESERVED, 3u, MSG_PAYMENT_AUTHORIZED, LC_IGNORE, ORDER_RESERVED, 3u, 0u },
	{ ORDER_RESERVED, 3u, MSG_INVENTORY_RESERVED, LC_IGNORE, ORDER_RESERVED, 3u, 0u },
	{ ORDER_RESERVED, 3u, MSG_SHIPMENT_CREATED, LC_APPLY, ORDER_SHIPPED, 3u, 0u },
	{ ORDER_RESERVED, 3u, MSG_ORDER_CANCELLED, LC_APPLY, ORDER_CANCELLED, 3u, 6u },
	{ ORDER_SHIPPED, 0u, MSG_ORDER_CREATED, LC_IGNORE, ORDER_SHIPPED, 0u, 0u },
	{ ORDER_SHIPPED, 0u, MSG_PAYMENT_AUTHORIZED, LC_IGNORE, ORDER_SHIPPED, 0u, 0u },
	{ ORDER_SHIPPED, 0u, MSG_INVENTORY_RESERVED, LC_IGNORE, ORDER_SHIPPED, 0u, 0u },
	{ ORDER_SHIPPED, 0u, MSG_SHIPMENT_CREATED, LC_IGNORE, ORDER_SHIPPED, 0u, 0u },
	{ ORDER_SHIPPED, 0u, MSG_ORDER_CANCELLED, LC_INVALID, ORDER_SHIPPED, 0u, 0u },
	{ ORDER_SHIPPED, 1u, MSG_ORDER_CREATED, LC_IGNORE, ORDER_SHIPPED, 1u, 0u },
	{ ORDER_SHIPPED, 1u, MSG_PAYMENT_AUTHORIZED, LC_IGNORE, ORDER_SHIPPED, 1u, 0u },
	{ ORDER_SHIPPED, 1u, MSG_INVENTORY_RESERVED, LC_IGNORE, ORDER_SHIPPED, 1u, 0u },
	{ ORDER_SHIPPED, 1u, MSG_SHIPMENT_CREATED, LC_IGNORE, ORDER_SHIPPED, 1u, 0u },
	{ ORDER_SHIPPED, 1u, MSG_ORDER_CANCELLED, LC_INVALID, ORDER_SHIPPED, 1u, 0u },
	{ ORDER_SHIPPED, 2u, MSG_ORDER_CREATED, LC_IGNORE, ORDER_SHIPPED, 2u, 0u },
	{ ORDER_SHIPPED, 2u, MSG_PAYMENT_AUTHORIZED, LC_IGNORE, ORDER_SHIPPED, 2u, 0u },
	{ ORDER_SHIPPED, 2u, MSG_INVENTORY_RESERVED, LC_IGNORE, ORDER_SHIPPED, 2u, 0u },
	{ ORDER_SHIPPED, 2u, MSG_SHIPMENT_CREATED, LC_IGNORE, ORDER_SHIPPED, 2u, 0u },
	{ ORDER_SHIPPED, 2u, MSG_ORDER_CANCELLED, LC_INVALID, ORDER_SHIPPED, 2u, 0u },
	{ ORDER_SHIPPED, 3u, MSG_ORDER_CREATED, LC_IGNORE, ORDER_SHIPPED, 3u, 0u },
	{ ORDER_SHIPPED, 3u, MSG_PAYMENT_AUTHORIZED, LC_IGNORE, ORDER_SHIPPED, 3u, 0u },
	{ ORDER_SHIPPED, 3u, MSG_INVENTORY_RESERVED, LC_IGNORE, ORDER_SHIPPED, 3u, 0u },
	{ ORDER_SHIPPED, 3u, MSG_SHIPMENT_CREATED, LC_IGNORE, ORDER_SHIPPED, 3u, 0u },
	{ ORDER_SHIPPED, 3u, MSG_ORDER_CANCELLED, LC_INVALID, ORDER_SHIPPED, 3u, 0u },
	{ ORDER_CANCELLED, 0u, MSG_ORDER_CREATED, LC_IGNORE, ORDER_CANCELLED, 0u, 0u },
	{ ORDER_CANCELLED, 0u, MSG_PAYMENT_AUTHORIZED, LC_COMPENSATE, ORDER_CANCELLED, 1u, 3u },
	{ ORDER_CANCELLED, 0u, MSG_INVENTORY_RESERVED, LC_COMPENSATE, ORDER_CANCELLED, 2u, 4u },
	{ ORDER_CANCELLED, 0u, MSG_SHIPMENT_CREATED, LC_INVALID, ORDER_CANCELLED, 0u, 0u },
	{ ORDER_CANCELLED, 0u, MSG_ORDER_CANCELLED, LC_IGNORE, ORDER_CANCELLED, 0u, 0u },
	{ ORDER_CANCELLED, 1u, MSG_ORDER_CREATED, LC_IGNORE, ORDER_CANCELLED, 1u, 0u },
	{ ORDER_CANCELLED, 1u, MSG_PAYMENT_AUTHORIZED, LC_IGNORE, ORDER_CANCELLED, 1u, 0u },
	{ ORDER_CANCELLED, 1u, MSG_INVENTORY_RESERVED, LC_COMPENSATE, ORDER_CANCELLED, 3u, 4u },
	{ ORDER_CANCELLED, 1u, MSG_SHIPMENT_CREATED, LC_INVALID, ORDER_CANCELLED, 1u, 0u },
	{ ORDER_CANCELLED, 1u, MSG_ORDER_CANCELLED, LC_IGNORE, ORDER_CANCELLED, 1u, 0u },
	{ ORDER_CANCELLED, 2u, MSG_ORDER_CREATED, LC_IGNORE, ORDER_CANCELLED, 2u, 0u },
	{ ORDER_CANCELLED, 2u, MSG_PAYMENT_AUTHORIZED, LC_COMPENSATE, ORDER_CANCELLED, 3u, 3u },
	{ ORDER_CANCELLED, 2u, MSG_INVENTORY_RESERVED, LC_IGNORE, ORDER_CANCELLED, 2u, 0u },
	{ ORDER_CANCELLED, 2u, MSG_SHIPMENT_CREATED, LC_INVALID, ORDER_CANCELLED, 2u, 0u },
	{ ORDER_CANCELLED, 2u, MSG_ORDER_CANCELLED, LC_IGNORE, ORDER_CANCELLED, 2u, 0u },
	{ ORDER_CANCELLED, 3u, MSG_ORDER_CREATED, LC_IGNORE, ORDER_CANCELLED, 3u, 0u },
	{ ORDER_CANCELLED, 3u, MSG_PAYMENT_AUTHORIZED, LC_IGNORE, ORDER_CANCELLED, 3u, 0u },
	{ ORDER_CANCELLED, 3u, MSG_INVENTORY_RESERVED, LC_IGNORE, ORDER_CANCELLED, 3u, 0u },
	{ ORDER_CANCELLED, 3u, MSG_SHIPMENT_CREATED, LC_INVALID, ORDER_CANCELLED, 3u, 0u },
	{ ORDER_CANCELLED, 3u, MSG_ORDER_CANCELLED, LC_IGNORE, ORDER_CANCELLED, 3u, 0u },
};

static const char *const decision_names[] = { "APPLY", "HOLD", "IGNORE", "COMPENSATE", "INVALID" };

Test(lifecycle, agg_decide_reproduces_the_recorded_table_cell_for_cell)
{
	int wrong = 0;

	cr_assert_eq(sizeof today_table / sizeof today_table[0],
	             (size_t)ORDER_STATE_COUNT * 4u * MSG_TYPE_COUNT, "every cell recorded");
	for (size_t i = 0; i < sizeof today_table / sizeof today_table[0]; i++) {
		const struct cell *c = &today_table[i];
		struct agg_verdict v = agg_decide(c->state, c->flags, c->ev);

		if (v.decision != c->decision || v.next != (int)c->next || v.flags != c->next_flags ||
		    v.emits != c->emits) {
			cr_log_error("%s flags %u + %s: got %s -> %s flags %u emits %#x; recorded %s -> %s flags %u emits %#x",
			             agg_state_name(c->state), c->flags, msg_type_name(c->ev),
			             decision_names[v.decision], agg_state_name(v.next), v.flags, v.emits,
			             decision_names[c->decision], agg_state_name(c->next), c->next_flags, c->emits);
			wrong++;
		}
	}
	cr_assert_eq(wrong, 0, "%d cells differ from the recorded table", wrong);
}

/* ---- the definition file -------------------------------------------------- */

static struct lc_def *load_builtin(void)
{
	struct lc_errors errs;
	struct lc_def *d = lc_load(lc_builtin_order, lc_builtin_order_len, &errs);

	if (d == NULL)
		lc_errors_print(&errs, "lifecycles/order.json", stderr);
	cr_assert_not_null(d, "the built-in order lifecycle loads");
	return d;
}

/* The order file, read by the generic engine, gives the recorded table:
 * states, events, marks and emits bound by name, not by position. */
Test(lifecycle, order_file_through_lc_decide_gives_the_recorded_table)
{
	static const char *const emit_names[] = { "OrderPaid", "RefundRequested", "InventoryReleaseRequested" }; /* ORDER_EMIT_* bit order */
	static const char *const mark_events[] = { "PaymentAuthorized", "InventoryReserved" };
	struct lc_def *d = load_builtin();
	int wrong = 0;

	for (size_t i = 0; i < sizeof today_table / sizeof today_table[0]; i++) {
		const struct cell *c = &today_table[i];
		int s = c->state == ORDER_NONE ? 0 : lc_state_find(d, agg_state_name(c->state));
		int e = lc_event_find(d, msg_type_name(c->ev));
		uint32_t marks = 0, flags = 0, emits = 0;
		struct lc_verdict v;

		cr_assert_geq(s, 0);
		cr_assert_geq(e, 0);
		for (int m = 0; m < d->nmarks; m++) {
			for (unsigned b = 0; b < 2; b++) {
				if ((c->flags & (1u << b)) && strcmp(d->events[d->marks[m]].type, mark_events[b]) == 0)
					marks |= 1u << m;
			}
		}
		v = lc_decide(d, s, marks, e);
		for (int m = 0; m < d->nmarks; m++) {
			for (unsigned b = 0; b < 2; b++) {
				if ((v.marks & (1u << m)) && strcmp(d->events[d->marks[m]].type, mark_events[b]) == 0)
					flags |= 1u << b;
			}
		}
		for (int k = 0; k < d->nemits; k++) {
			for (unsigned b = 0; b < 3; b++) {
				if ((v.emits & (1u << k)) && strcmp(d->emits[k], emit_names[b]) == 0)
					emits |= 1u << b;
			}
		}
		if ((int)v.decision != (int)c->decision ||
		    strcmp(v.next == 0 ? "" : d->states[v.next], agg_state_name(c->next)) != 0 ||
		    flags != c->next_flags || emits != c->emits) {
			cr_log_error("%s flags %u + %s: file says %s -> %s flags %u emits %#x; recorded %s -> %s flags %u emits %#x",
			             agg_state_name(c->state), c->flags, msg_type_name(c->ev),
			             decision_names[v.decision], d->states[v.next], flags, emits,
			             decision_names[c->decision], agg_state_name(c->next), c->next_flags, c->emits);
			wrong++;
		}
	}
	lc_free(d);
	cr_assert_eq(wrong, 0, "%d cells of lifecycles/order.json differ from the recorded table", wrong);
}

Test(lifecycle, builtin_is_the_shipped_file)
{
	char path[4096];
	const char *root = getenv("INBOX_SOURCE_ROOT");
	FILE *f;
	static char buf[1 << 16];
	size_t n;

	cr_assert_not_null(root, "INBOX_SOURCE_ROOT is set by meson");
	snprintf(path, sizeof path, "%s/lifecycles/order.json", root);
	f = fopen(path, "rb");
	cr_assert_not_null(f, "%s", path);
	n = fread(buf, 1, sizeof buf, f);
	fclose(f);
	cr_assert_eq(n, lc_builtin_order_len);
	cr_assert(memcmp(buf, lc_builtin_order, n) == 0, "the compiled-in definition is lifecycles/order.json");
}

Test(lifecycle, builtin_order_is_order_independent)
{
	struct lc_def *d = load_builtin();
	struct lc_check chk;
	bool ok = lc_check_order_independence(d, &chk);

	cr_expect(ok, "%s", chk.why);
	/* 2^5 - 1 sets, of which those with ShipmentCreated and OrderCancelled
	 * (2^3 = 8) are conflicts between two terminal states. */
	cr_expect_eq(chk.conflicts, 8);
	cr_expect_eq(chk.sets, 23);
	cr_expect_gt(chk.runs, 1000);
	lc_free(d);
}

/* One error, expected at line:column, its text containing want. */
static void expect_error(const char *text, int line, int col, const char *want)
{
	struct lc_errors errs;
	struct lc_def *d = lc_load(text, strlen(text), &errs);
	bool found = false;

	cr_assert_null(d, "refused: %s", want);
	for (int i = 0; i < errs.n; i++) {
		if (strstr(errs.e[i].text, want) != NULL) {
			found = true;
			cr_expect_eq(errs.e[i].line, line, "'%s' at line %d, want %d", errs.e[i].text, errs.e[i].line, line);
			if (col > 0)
				cr_expect_eq(errs.e[i].column, col, "'%s' at column %d, want %d", errs.e[i].text,
				             errs.e[i].column, col);
		}
	}
	if (!found)
		lc_errors_print(&errs, "test", stderr);
	cr_expect(found, "an error saying '%s'", want);
}

#define HEAD "{\"lifecycle\": 1, \"aggregate\": \"a\", \"table\": \"t\", \"key\": \"k\",\n"

Test(lifecycle, errors_say_where_and_what_to_write)
{
	expect_error("{\"lifecycle\": 1,\n  \"states\": [\"A\",]\n}", 2, 18, "not valid JSON");
	expect_error(HEAD "\"states\": [\"A\", \"B\"],\n\"main_path\": [\"A\"],\n\"terminal\": [\"B\"],\n"
	             "\"events\": [{\"type\": \"E\", \"creates\": \"A\"},\n"
	             "  {\"type\": \"F\", \"from\": [\"A\"], \"to\": \"C\"}]}",
	             6, 38, "\"C\" is not a declared state: write one of the names in \"states\"");
	expect_error(HEAD "\"states\": [\"A\", \"B\"],\n\"main_path\": [\"A\"],\n\"terminal\": [\"B\"],\n"
	             "\"events\": [{\"type\": \"E\", \"creates\": \"A\", \"emit\": []}]}",
	             5, 50, "unknown key \"emit\" in an event: write one of");
	expect_error(HEAD "\"states\": [\"A\", \"B\", \"C\"],\n\"main_path\": [\"A\"],\n\"terminal\": [\"B\"],\n"
	             "\"events\": [{\"type\": \"E\", \"creates\": \"A\"}]}",
	             2, 22, "\"C\" is neither on the main path nor terminal: add it to \"main_path\" or to \"terminal\"");
	/* An event that can arrive after a terminal state and says nothing. */
	expect_error(HEAD "\"states\": [\"A\", \"B\", \"X\"],\n\"main_path\": [\"A\", \"B\"],\n\"terminal\": [\"B\", \"X\"],\n"
	             "\"events\": [{\"type\": \"E\", \"creates\": \"A\"},\n"
	             "  {\"type\": \"F\", \"from\": [\"A\"], \"to\": \"B\"},\n"
	             "  {\"type\": \"G\", \"from\": [\"A\"], \"to\": \"X\"}]}",
	             7, 0, "write \"after\": {\"B\": \"ignore\"}");
	expect_error(HEAD "\"states\": [\"A\", \"B\"],\n\"main_path\": [\"A\"],\n\"terminal\": [\"B\"],\n"
	             "\"events\": [{\"type\": \"E\", \"creates\": \"A\",\n"
	             "  \"sets\": {\"Bad-Col\": {\"from\": \"occurred_at\", \"type\": \"datetime\"}}}]}",
	             6, 23, "must be a lower-case SQL name");
	expect_error(HEAD "\"states\": [\"A\", \"B\"],\n\"main_path\": [\"A\"],\n\"terminal\": [\"B\"],\n"
	             "\"events\": [{\"type\": \"E\", \"creates\": \"A\"},\n"
	             "  {\"type\": \"F\", \"from\": [\"B\"], \"to\": \"A\"}]}",
	             6, 25, "\"B\" is terminal: an event does not move out of it");
	expect_error(HEAD "\"states\": [\"A\", \"B\"],\n\"main_path\": [\"A\"],\n\"terminal\": [\"B\"],\n"
	             "\"events\": [{\"type\": \"E\", \"from\": [\"A\"], \"to\": \"B\"}]}",
	             1, 1, "no event creates the aggregate: give one event \"creates\": \"A\"");
	expect_error("{\"lifecycle\": 1, \"lifecycle\": 1}", 1, 0, "duplicate object key");
	/* SQL names: a strict alphabet, and none that the ledger already has. */
	expect_error("{\"lifecycle\": 1, \"aggregate\": \"a\", \"table\": \"t; DROP TABLE x\", \"key\": \"k\",\n"
	             "\"states\": [\"A\"], \"main_path\": [\"A\"], \"terminal\": [\"A\"], \"events\": []}",
	             1, 45, "\"table\" must be a lower-case SQL name");
	expect_error("{\"lifecycle\": 1, \"aggregate\": \"a\", \"table\": \"a_events\", \"key\": \"version\",\n"
	             "\"states\": [\"A\"], \"main_path\": [\"A\"], \"terminal\": [\"A\"], \"events\": []}",
	             1, 45, "is the name of the aggregate's ledger or lock table");
	expect_error("{\"lifecycle\": 1, \"aggregate\": \"a\", \"table\": \"a_events\", \"key\": \"version\",\n"
	             "\"states\": [\"A\"], \"main_path\": [\"A\"], \"terminal\": [\"A\"], \"events\": []}",
	             1, 64, "\"version\" is a column of the ledger already: name the key otherwise, like \"a_id\"");
}

/* ---- the order engine bound to another definition ------------------------ */

static char *builtin_with(const char *from, const char *to)
{
	const char *at = strstr(lc_builtin_order, from);
	size_t flen = strlen(from), tlen = strlen(to);
	char *out;

	cr_assert_not_null(at, "the built-in file contains %s", from);
	out = malloc(lc_builtin_order_len - flen + tlen + 1);
	cr_assert_not_null(out);
	memcpy(out, lc_builtin_order, (size_t)(at - lc_builtin_order));
	memcpy(out + (at - lc_builtin_order), to, tlen);
	memcpy(out + (at - lc_builtin_order) + tlen, at + flen, strlen(at + flen) + 1);
	return out;
}

Test(lifecycle, order_decide_and_the_parser_follow_the_bound_definition)
{
	char *text = builtin_with("\"aliases\": [\"PaymentConfirmed\"]", "\"aliases\": [\"PaymentCaptured\"]");
	char *text2;
	struct lc_errors errs;
	struct lc_def *d = lc_load(text, strlen(text), &errs), *d2;
	struct agg_binding b, b2;
	char why[512];

	cr_assert_not_null(d);
	cr_assert_eq(agg_bind(d, &b, why, sizeof why), 0, "%s", why);
	cr_expect_eq(msg_type_from_name("PaymentConfirmed", 16), MSG_PAYMENT_AUTHORIZED, "built-in alias");
	agg_use(&b);
	cr_expect_eq(msg_type_from_name("PaymentCaptured", 15), MSG_PAYMENT_AUTHORIZED, "the file's alias");
	cr_expect_eq(msg_type_from_name("PaymentConfirmed", 16), -1, "no longer an alias");

	/* A decision changed in the file is the worker's decision. */
	text2 = builtin_with("\"Cancelled\": \"invalid-transition\"", "\"Cancelled\": \"ignore\"");
	d2 = lc_load(text2, strlen(text2), &errs);
	cr_assert_not_null(d2);
	cr_assert_eq(agg_bind(d2, &b2, why, sizeof why), 0, "%s", why);
	cr_expect_eq(agg_decide(ORDER_CANCELLED, 0, MSG_SHIPMENT_CREATED).decision, LC_INVALID);
	agg_use(&b2);
	cr_expect_eq(agg_decide(ORDER_CANCELLED, 0, MSG_SHIPMENT_CREATED).decision, LC_IGNORE);
	agg_use(NULL);
	cr_expect_eq(agg_decide(ORDER_CANCELLED, 0, MSG_SHIPMENT_CREATED).decision, LC_INVALID);
	lc_free(d);
	lc_free(d2);
	free(text);
	free(text2);
}

/* What used to need another schema binds now (issue 27): another table,
 * other columns, another emitted type, another event to remember. */
static void expect_bound(const char *from, const char *to)
{
	char *text = builtin_with(from, to);
	struct lc_errors errs;
	struct lc_def *d = lc_load(text, strlen(text), &errs);
	struct agg_binding b;
	char why[512] = "";

	cr_assert_not_null(d, "%s loads", to);
	cr_expect_eq(agg_bind(d, &b, why, sizeof why), 0, "%s binds: %s", to, why);
	lc_free(d);
	free(text);
}

Test(lifecycle, a_definition_of_another_schema_binds)
{
	expect_bound("\"table\": \"orders\"", "\"table\": \"shipments\"");
	expect_bound("\"paid_at\": { \"from\": \"applied_at\"", "\"paid_at\": { \"from\": \"occurred_at\"");
	expect_bound("\"compensate\": [\"InventoryReleaseRequested\"]", "\"compensate\": [\"StockReturned\"]");
	expect_bound("\"Cancelled\": \"invalid-transition\"", "\"Cancelled\": {\"compensate\": [\"OrderPaid\"]}");
}

/* ---- the example: lifecycles/shipment.json -------------------------------- */

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

struct ship_cell {
	const char *state; /* "" = no shipment yet */
	const char *event;
	const char *decision;
	const char *next;
	const char *emits; /* space-separated, in the file's order of first mention */
};

/* Typed in by hand from lifecycles/shipment.json and the rules of
 * doc/lifecycle.md, with no ParcelInTransit taken effect (marks 0). */
static const struct ship_cell ship_table[] = {
	{ "", "ShipmentLabelled", "applied", "Labelled", "" },
	{ "", "ParcelPickedUp", "held", "", "" },
	{ "", "ParcelInTransit", "held", "", "" },
	{ "", "ParcelDelivered", "held", "", "" },
	{ "", "ParcelLost", "held", "", "" },
	{ "", "ParcelReturned", "held", "", "" },
	{ "Labelled", "ShipmentLabelled", "ignored", "Labelled", "" },
	{ "Labelled", "ParcelPickedUp", "applied", "PickedUp", "ShipmentDispatched" },
	{ "Labelled", "ParcelInTransit", "held", "Labelled", "" },
	{ "Labelled", "ParcelDelivered", "held", "Labelled", "" },
	{ "Labelled", "ParcelLost", "held", "Labelled", "" },
	{ "Labelled", "ParcelReturned", "held", "Labelled", "" },
	{ "PickedUp", "ShipmentLabelled", "ignored", "PickedUp", "" },
	{ "PickedUp", "ParcelPickedUp", "ignored", "PickedUp", "" },
	{ "PickedUp", "ParcelInTransit", "applied", "InTransit", "" },
	{ "PickedUp", "ParcelDelivered", "held", "PickedUp", "" },
	{ "PickedUp", "ParcelLost", "applied", "Lost", "CustomerRefundRequested" },
	{ "PickedUp", "ParcelReturned", "held", "PickedUp", "" },
	{ "InTransit", "ShipmentLabelled", "ignored", "InTransit", "" },
	{ "InTransit", "ParcelPickedUp", "ignored", "InTransit", "" },
	{ "InTransit", "ParcelInTransit", "ignored", "InTransit", "" },
	{ "InTransit", "ParcelDelivered", "applied", "Delivered", "DeliveryConfirmed" },
	{ "InTransit", "ParcelLost", "applied", "Lost", "CustomerRefundRequested" },
	{ "InTransit", "ParcelReturned", "applied", "Returned", "ReturnReceived" },
	{ "Delivered", "ShipmentLabelled", "ignored", "Delivered", "" },
	{ "Delivered", "ParcelPickedUp", "ignored", "Delivered", "" },
	{ "Delivered", "ParcelInTransit", "ignored", "Delivered", "" },
	{ "Delivered", "ParcelDelivered", "ignored", "Delivered", "" },
	{ "Delivered", "ParcelLost", "dead_lettered", "Delivered", "" },
	{ "Delivered", "ParcelReturned", "dead_lettered", "Delivered", "" },
	{ "Lost", "ShipmentLabelled", "ignored", "Lost", "" },
	{ "Lost", "ParcelPickedUp", "ignored", "Lost", "" },
	{ "Lost", "ParcelInTransit", "compensated", "Lost", "CarrierClaimFiled" },
	{ "Lost", "ParcelDelivered", "dead_lettered", "Lost", "" },
	{ "Lost", "ParcelLost", "ignored", "Lost", "" },
	{ "Lost", "ParcelReturned", "dead_lettered", "Lost", "" },
	{ "Returned", "ShipmentLabelled", "ignored", "Returned", "" },
	{ "Returned", "ParcelPickedUp", "ignored", "Returned", "" },
	{ "Returned", "ParcelInTransit", "ignored", "Returned", "" },
	{ "Returned", "ParcelDelivered", "dead_lettered", "Returned", "" },
	{ "Returned", "ParcelLost", "dead_lettered", "Returned", "" },
	{ "Returned", "ParcelReturned", "ignored", "Returned", "" },
};

static void emits_text(const struct lc_def *d, uint32_t emits, char *buf, size_t cap)
{
	size_t used = 0;

	buf[0] = '\0';
	for (int k = 0; k < d->nemits && used < cap; k++) {
		if (emits & (1u << k)) {
			int w = snprintf(buf + used, cap - used, "%s%s", used ? " " : "", d->emits[k]);
			if (w > 0)
				used += (size_t)w;
		}
	}
}

static void expect_ship_cell(const struct lc_def *d, const struct ship_cell *c, uint32_t marks)
{
	int s = c->state[0] == '\0' ? 0 : lc_state_find(d, c->state);
	int e = lc_event_find(d, c->event);
	struct lc_verdict v;
	char emits[256];

	cr_assert_geq(s, 0, "%s", c->state);
	cr_assert_geq(e, 0, "%s", c->event);
	v = lc_decide(d, s, marks, e);
	emits_text(d, v.emits, emits, sizeof emits);
	cr_expect_str_eq(lc_decision_outcome(v.decision), c->decision, "%s + %s", c->state, c->event);
	cr_expect_str_eq(d->states[v.next], c->next, "%s + %s: next", c->state, c->event);
	cr_expect_str_eq(emits, c->emits, "%s + %s: emits", c->state, c->event);
}

Test(lifecycle, shipment_table_as_typed_in_by_hand)
{
	struct lc_def *d = load_source_file("lifecycles/shipment.json");
	int transit = lc_event_find(d, "ParcelInTransit");
	static const struct ship_cell marked[] = {
		/* ParcelInTransit took effect: the loss owes the carrier claim,
		 * and a late ParcelInTransit is stale, not compensated again. */
		{ "InTransit", "ParcelLost", "applied", "Lost", "CarrierClaimFiled CustomerRefundRequested" },
		{ "Lost", "ParcelInTransit", "ignored", "Lost", "" },
	};

	cr_assert_eq(d->nstates * d->nevents, (int)(sizeof ship_table / sizeof ship_table[0]), "every cell typed");
	cr_assert_eq(d->nmarks, 1, "only ParcelInTransit is remembered");
	cr_assert_eq(d->marks[0], transit);
	cr_expect_eq(lc_event_find(d, "PickedUp"), lc_event_find(d, "ParcelPickedUp"), "the alias");
	for (size_t i = 0; i < sizeof ship_table / sizeof ship_table[0]; i++)
		expect_ship_cell(d, &ship_table[i], 0);
	for (size_t i = 0; i < sizeof marked / sizeof marked[0]; i++)
		expect_ship_cell(d, &marked[i], 1u);
	cr_expect_eq(d->events[0].nsets, 2);
	cr_expect_str_eq(d->events[0].sets[0].column, "tracking_number");
	cr_expect_eq(d->events[0].sets[0].max_length, 64);
	cr_expect(d->events[0].sets[0].required);
	lc_free(d);
}

Test(lifecycle, shipment_is_order_independent)
{
	struct lc_def *d = load_source_file("lifecycles/shipment.json");
	struct lc_check chk;

	cr_expect(lc_check_order_independence(d, &chk), "%s", chk.why);
	/* 2^6 - 1 sets; those with two or three of ParcelDelivered, ParcelLost,
	 * ParcelReturned (4 such choices) conflict, whatever the other three
	 * events (2^3): 32. */
	cr_expect_eq(chk.sets + chk.conflicts, 63);
	cr_expect_eq(chk.conflicts, 32);
	lc_free(d);
}

Test(lifecycle, order_dependent_definitions_are_refused_with_the_two_orders)
{
	static const struct {
		const char *file, *why;
	} bad[] = {
		{ "tests/lifecycles/bad_payment_after_cancel_ignored.json",
		  "arrival order [OrderCreated, PaymentAuthorized, OrderCancelled] and "
		  "[OrderCreated, OrderCancelled, PaymentAuthorized] end differently: version 3 vs 2" },
		{ "tests/lifecycles/bad_cancel_forgets_refund.json",
		  "arrival order [OrderCreated, PaymentAuthorized, OrderCancelled] and "
		  "[OrderCreated, OrderCancelled, PaymentAuthorized] end differently: 0 vs 1 RefundRequested emitted" },
	};

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct lc_def *d = load_source_file(bad[i].file);
		struct lc_check chk;

		cr_expect_not(lc_check_order_independence(d, &chk), "%s is refused", bad[i].file);
		cr_expect_str_eq(chk.why, bad[i].why);
		lc_free(d);
	}
}

/* ---- the parser run by the shipment definition (issue 27) ----------------- */

static enum msg_reason parse_text(const char *body, struct msg *m)
{
	return msg_parse(body, strlen(body), 65536, NULL, m);
}

static const char *text_of(const struct msg *m, const char *column)
{
	const struct msg_val *v = msg_value(m, column);

	return v != NULL ? m->text + v->off : NULL;
}

Test(lifecycle, the_parser_reads_a_shipment_message_by_the_bound_definition)
{
	struct lc_def *d = load_source_file("lifecycles/shipment.json");
	struct agg_binding b;
	char why[512] = "";
	struct msg m;

	cr_assert_eq(agg_bind(d, &b, why, sizeof why), 0, "%s", why);
	agg_use(&b);

	cr_assert_eq(parse_text("{\"message_id\":\"m-1\",\"type\":\"ShipmentLabelled\",\"shipment_id\":\"s-1\","
	                        "\"occurred_at\":\"2026-01-01T00:30:00.25+01:00\",\"data\":{\"tracking_number\":\"Ünï-1\"}}",
	                        &m),
	             MSG_REASON_NONE, "%s", m.detail);
	cr_expect_eq(m.type, lc_event_find(d, "ShipmentLabelled"));
	cr_expect_str_eq(m.order_id, "s-1");
	cr_expect_str_eq(text_of(&m, "tracking_number"), "Ünï-1");
	cr_expect_str_eq(text_of(&m, "labelled_at"), "2025-12-31 23:30:00.250000", "occurred_at in UTC");
	cr_expect_eq(parse_text("{\"message_id\":\"m-2\",\"type\":\"PickedUp\",\"shipment_id\":\"s-1\"}", &m),
	             MSG_REASON_NONE, "the alias: %s", m.detail);
	cr_expect_eq(m.type, lc_event_find(d, "ParcelPickedUp"));
	cr_expect_str_eq(m.type_name, "PickedUp");
	cr_expect_null(msg_value(&m, "picked_up_at"), "no occurred_at: the column is left as it is");

	cr_expect_eq(parse_text("{\"message_id\":\"m\",\"type\":\"ShipmentLabelled\",\"shipment_id\":\"s\"}", &m),
	             MSG_REASON_MISSING_FIELD);
	cr_expect_str_eq(m.detail, "data.tracking_number is missing (ShipmentLabelled needs it)");
	cr_expect_eq(parse_text("{\"message_id\":\"m\",\"type\":\"ShipmentLabelled\",\"shipment_id\":\"s\","
	                        "\"data\":{\"tracking_number\":7}}", &m),
	             MSG_REASON_INVALID_FIELD);
	cr_expect_str_eq(m.detail, "data.tracking_number must be a string of at most 64 characters");
	cr_expect_eq(parse_text("{\"message_id\":\"m\",\"type\":\"ParcelLost\",\"shipment_id\":\"s\","
	                        "\"data\":{\"tracking_number\":7}}", &m),
	             MSG_REASON_INVALID_FIELD, "a field the definition reads means one thing on every message");
	cr_expect_eq(parse_text("{\"message_id\":\"m\",\"type\":\"ParcelLost\",\"order_id\":\"s\"}", &m),
	             MSG_REASON_MISSING_FIELD);
	cr_expect_str_eq(m.detail, "shipment_id (the shipment id) is missing");
	cr_expect_eq(parse_text("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"shipment_id\":\"s\"}", &m),
	             MSG_REASON_UNKNOWN_TYPE);

	agg_use(NULL);
	cr_expect_eq(parse_text("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\"}", &m),
	             MSG_REASON_NONE, "the built-in definition again: %s", m.detail);
	lc_free(d);
}

Test(lifecycle, integer_bounds_are_the_definitions_and_said_as_declared)
{
	char *text = builtin_with("\"min\": 0, \"required\": false", "\"min\": 1, \"max\": 99, \"required\": true");
	struct lc_errors errs;
	struct lc_def *d = lc_load(text, strlen(text), &errs);
	struct agg_binding b;
	char why[512] = "";
	struct msg m;

	cr_assert_not_null(d);
	cr_assert_eq(agg_bind(d, &b, why, sizeof why), 0, "%s", why);
	agg_use(&b);
	cr_expect_eq(parse_text("{\"message_id\":\"m\",\"type\":\"PaymentAuthorized\",\"order_id\":\"o\","
	                        "\"data\":{\"amount_cents\":100}}", &m),
	             MSG_REASON_INVALID_FIELD);
	cr_expect_str_eq(m.detail, "data.amount_cents must be an integer in 1..99");
	cr_expect_eq(parse_text("{\"message_id\":\"m\",\"type\":\"PaymentAuthorized\",\"order_id\":\"o\"}", &m),
	             MSG_REASON_MISSING_FIELD);
	cr_expect_eq(parse_text("{\"message_id\":\"m\",\"type\":\"OrderCreated\",\"order_id\":\"o\"}", &m),
	             MSG_REASON_NONE, "required by PaymentAuthorized only: %s", m.detail);
	cr_expect_eq(parse_text("{\"message_id\":\"m\",\"type\":\"PaymentAuthorized\",\"order_id\":\"o\","
	                        "\"data\":{\"amount_cents\":42}}", &m),
	             MSG_REASON_NONE, "%s", m.detail);
	cr_expect_eq(msg_value(&m, "amount_cents")->i, 42);
	cr_expect_not_null(msg_value(&m, "paid_at"), "applied_at: always given");
	agg_use(NULL);
	lc_free(d);
	free(text);
}

/* Issue 43, item 3: a column two events set is as wide as the widest
 * declaration (the first one's width cut the second's valid values), and a
 * definition's ledger holds every key the envelopes accept (255 characters
 * of source and of id), as order_events does since migration 0017. */
Test(lifecycle, every_table_holds_what_the_worker_accepts_into_it)
{
	static const char text[] = HEAD
	        "\"states\": [\"A\", \"B\"], \"main_path\": [\"A\", \"B\"], \"terminal\": [\"B\"],\n"
	        "\"events\": [\n"
	        " {\"type\": \"Made\", \"creates\": \"A\", \"sets\": {\"note\": {\"from\": \"data.note\", \"type\": \"string\","
	        " \"max_length\": 10}}},\n"
	        " {\"type\": \"Done\", \"from\": [\"A\"], \"to\": \"B\", \"sets\": {\"note\": {\"from\": \"data.note\","
	        " \"type\": \"string\", \"max_length\": 200}}}\n"
	        "]}\n";
	static char ddl[16384];
	struct lc_errors errs;
	struct lc_def *d = lc_load(text, strlen(text), &errs);
	char want[96];

	if (d == NULL)
		lc_errors_print(&errs, "test", stderr);
	cr_assert_not_null(d);
	cr_assert_eq(lc_schema_ddl(d, ddl, sizeof ddl), 0);
	cr_expect(strstr(ddl, "`note` VARCHAR(200)") != NULL, "the widest declaration: %s", ddl);
	snprintf(want, sizeof want, "`source` VARCHAR(%d)", MSG_WIDE_SOURCE_MAX);
	cr_expect(strstr(ddl, want) != NULL, "%s: %s", want, ddl);
	snprintf(want, sizeof want, "`message_id` VARCHAR(%d)", MSG_WIDE_ID_MAX);
	cr_expect(strstr(ddl, want) != NULL, "%s: %s", want, ddl);
	lc_free(d);
}

/* ---- one id per emitted event (issue 43, item 4) -------------------------- */

static void expect_id(const struct lc_def *d, int k, const char *want)
{
	char id[256];

	cr_assert_geq(lc_emit_id(d, k, "o-1", id, sizeof id), 0, "kind %d has an id", k);
	cr_expect_str_eq(id, want);
}

static int kind_of(const struct lc_def *d, uint32_t emits, const char *type)
{
	int found = -1;

	for (int k = 0; k < d->nemits; k++) {
		if ((emits & (1u << k)) && strcmp(d->emits[k], type) == 0) {
			cr_expect_eq(found, -1, "one %s in one verdict", type);
			found = k;
		}
	}
	return found;
}

Test(lifecycle, each_emitted_event_has_one_id_derived_from_its_cause)
{
	struct lc_def *d = load_builtin();
	char id[256];
	int paid = lc_event_find(d, "PaymentAuthorized"), cancel = lc_event_find(d, "OrderCancelled");
	int cancelled = lc_state_find(d, "Cancelled");
	struct lc_verdict v;

	/* The built-in types have one cause each: their ids are unchanged. */
	cr_assert_eq(d->nemits, 3);
	expect_id(d, 0, "OrderPaid:o-1");
	expect_id(d, 1, "RefundRequested:o-1");
	expect_id(d, 2, "InventoryReleaseRequested:o-1");
	/* The refund is the payment's: one kind, whether the cancellation
	 * owed it or the payment came after the cancellation. */
	v = lc_decide(d, lc_state_find(d, "Paid"), 1u << d->events[paid].mark, cancel);
	cr_assert_eq(v.decision, LC_APPLY);
	cr_expect_eq(kind_of(d, v.emits, "RefundRequested"), 1);
	v = lc_decide(d, cancelled, 0, paid);
	cr_assert_eq(v.decision, LC_COMPENSATE);
	cr_expect_eq(kind_of(d, v.emits, "RefundRequested"), 1);
	cr_expect_eq(kind_of(d, v.emits, "OrderPaid"), 0);
	lc_free(d);

	/* Three transitions emit CustomerNotified: three kinds, three ids. */
	d = load_source_file("tests/lifecycles/ticket_notifies_thrice.json");
	cr_assert_eq(d->nemits, 4);
	expect_id(d, 0, "CustomerNotified:o-1:TicketOpened");
	expect_id(d, 1, "CustomerNotified:o-1:TicketAssigned");
	expect_id(d, 2, "CustomerNotified:o-1:TicketClosed");
	expect_id(d, 3, "AgentPaged:o-1");
	cr_expect_eq(lc_emit_label(d, 1, id, sizeof id), (int)strlen("CustomerNotified:TicketAssigned"));
	cr_expect_str_eq(id, "CustomerNotified:TicketAssigned");
	cr_expect_eq(lc_emit_find_label(d, "CustomerNotified:TicketClosed"), 2);
	cr_expect_eq(lc_emit_find_label(d, "CustomerNotified"), -1, "the type alone names none of the three");
	v = lc_decide(d, lc_state_find(d, "Opened"), 0, lc_event_find(d, "TicketAssigned"));
	cr_expect_eq(v.emits, (1u << 1) | (1u << 3));
	cr_expect_eq(lc_emit_id(d, 0, "o-1", id, 10), -1, "an id is never cut");
	lc_free(d);
}

Test(lifecycle, a_definition_that_emits_two_events_under_one_id_is_refused)
{
	/* The payment emits OrderPaid, and the cancellation that compensates
	 * it would emit OrderPaid again: both are the payment's, one id. */
	char *text = builtin_with("\"emit\": \"RefundRequested\"", "\"emit\": \"OrderPaid\"");
	const char *at = strstr(text, "\"type\": \"OrderCancelled\"");
	int line = 1;

	for (const char *p = text; p < at; p++)
		line += *p == '\n';
	expect_error(text, line - 1, 0,
	             "\"OrderPaid\" is emitted when PaymentAuthorized takes effect and again when OrderCancelled "
	             "compensates it: one aggregate would emit two events under one id");
	free(text);
}

/* ---- a definition's version (issue 46, item 3) ---------------------------- */

#define VHEAD "{\"lifecycle\": 1, \"aggregate\": \"a\", \"table\": \"t\", \"key\": \"k\","
#define VBODY "\"states\": [\"A\", \"B\"], \"main_path\": [\"A\", \"B\"], \"terminal\": [\"B\"],\n" \
	"\"events\": [{\"type\": \"E\", \"creates\": \"A\"}, {\"type\": \"F\", \"from\": [\"A\"], \"to\": \"B\"}]}\n"

static void load_version(const char *text, char *out, size_t cap, bool *declared)
{
	struct lc_errors errs;
	struct lc_def *d = lc_load(text, strlen(text), &errs);

	if (d == NULL)
		lc_errors_print(&errs, "test", stderr);
	cr_assert_not_null(d, "%s", text);
	snprintf(out, cap, "%s", d->version);
	*declared = d->version_declared;
	lc_free(d);
}

/* A declared version is the file's; without one the version is its
 * content: the same definition spelt with other whitespace or key order
 * has the same version, an edit another. */
Test(lifecycle, a_definition_declares_its_version_or_is_known_by_its_content)
{
	char v1[LC_VERSION_MAX + 1], v2[LC_VERSION_MAX + 1], v3[LC_VERSION_MAX + 1], v4[LC_VERSION_MAX + 1];
	bool declared;

	load_version(VHEAD "\"version\": \"2026-12-07\",\n" VBODY, v1, sizeof v1, &declared);
	cr_expect_str_eq(v1, "2026-12-07");
	cr_expect(declared);

	load_version(VHEAD "\n" VBODY, v1, sizeof v1, &declared);
	cr_expect(!declared);
	cr_expect_eq(strlen(v1), LC_VERSION_HASH, "a hash of %d hex digits: \"%s\"", LC_VERSION_HASH, v1);
	cr_expect_eq(strspn(v1, "0123456789abcdef"), strlen(v1), "hex: \"%s\"", v1);
	/* whitespace and key order are not content */
	load_version("{ \"key\" : \"k\",  \"table\":\"t\", \"aggregate\": \"a\",\t\"lifecycle\": 1,\n\n" VBODY, v2,
	             sizeof v2, &declared);
	cr_expect_str_eq(v2, v1, "the same definition, spelt otherwise");
	/* an edit is: an alias added */
	load_version(VHEAD "\"states\": [\"A\", \"B\"], \"main_path\": [\"A\", \"B\"], \"terminal\": [\"B\"],\n"
	             "\"events\": [{\"type\": \"E\", \"creates\": \"A\"},\n"
	             " {\"type\": \"F\", \"aliases\": [\"G\"], \"from\": [\"A\"], \"to\": \"B\"}]}\n",
	             v3, sizeof v3, &declared);
	cr_expect_str_neq(v3, v1, "an edited definition has another version");
	/* the hash leaves a declared version out: declaring one changes nothing else */
	load_version(VHEAD "\"version\": \"7\"," VBODY, v4, sizeof v4, &declared);
	cr_expect_str_eq(v4, "7");
}

Test(lifecycle, a_version_is_1_to_64_printable_characters)
{
	char longest[LC_VERSION_MAX + 2], text[1024];
	bool declared;

	memset(longest, 'v', LC_VERSION_MAX);
	longest[LC_VERSION_MAX] = '\0';
	snprintf(text, sizeof text, VHEAD "\"version\": \"%s\",\n" VBODY, longest);
	load_version(text, longest, sizeof longest, &declared);
	cr_expect_eq(strlen(longest), LC_VERSION_MAX);

	expect_error(VHEAD "\"version\": 2,\n" VBODY, 1, 72, "\"version\" is 1 to 64 printable characters, like "
	                                                  "\"version\": \"2\" or \"2026-12-07\"");
	expect_error(VHEAD "\"version\": \"\",\n" VBODY, 1, 72, "\"version\" is 1 to 64 printable characters");
	expect_error(VHEAD "\"version\": \"a\\tb\",\n" VBODY, 1, 72, "\"version\" is 1 to 64 printable characters");
	expect_error(VHEAD "\"version\": \"2 \",\n" VBODY, 1, 72, "\"version\" is 1 to 64 printable characters");
	memset(longest, 'v', LC_VERSION_MAX + 1);
	longest[LC_VERSION_MAX + 1] = '\0';
	snprintf(text, sizeof text, VHEAD "\"version\": \"%s\",\n" VBODY, longest);
	expect_error(text, 1, 72, "\"version\" is 1 to 64 printable characters");
}

/* The built-in definition is known by a name, not its hash; the hash is
 * held here so that an edit of lifecycles/order.json cannot keep the name
 * of the definition it replaced. */
Test(lifecycle, the_builtin_definition_has_a_fixed_version_bumped_with_its_content)
{
	struct lc_errors errs;
	struct lc_def *b = lc_load_builtin(&errs), *raw = lc_load(lc_builtin_order, lc_builtin_order_len, &errs);

	cr_assert_not_null(b);
	cr_assert_not_null(raw);
	cr_expect_str_eq(b->version, LC_BUILTIN_ORDER_VERSION);
	cr_expect_str_eq(raw->version, "eca5dfc927eb",
	                 "lifecycles/order.json changed (its content hash is %s): bump LC_BUILTIN_ORDER_VERSION in "
	                 "common/lifecycle.h and record the new hash here", raw->version);
	lc_free(raw);
	lc_free(b);
}
