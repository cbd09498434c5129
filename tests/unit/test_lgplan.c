/*
 * test_lgplan.c - inbox-loadgen's planner and scenario read from a
 * lifecycle definition (loadgen/plan.c, loadgen/scenario.c), without a
 * broker or a database:
 *
 *   - lifecycles/shipment.json plans the routes typed in here by hand from
 *     the file (events, end state, version, emitted events, dead letters),
 *     and a hand-folded arrival order ends as typed;
 *   - every message of a shipment scenario carries a type of the
 *     definition, the key field shipment_id (never order_id) and
 *     data.tracking_number as the file bounds it; a conflict changes the
 *     payload and its hash;
 *   - the order definition plans the five paths the load generator always
 *     had, and one that disagrees with SPEC's table is refused;
 *   - through the binary (no broker: the ledger is written first):
 *     publish --lifecycle lifecycles/order.json writes the built-in
 *     lifecycle's ledger, and verify refuses a ledger of another lifecycle.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lifecycle.h"
#include "plan.h"
#include "scenario.h"

static struct lc_def *load_def(const char *rel)
{
	const char *root = getenv("INBOX_SOURCE_ROOT");
	char path[1024];
	struct lc_errors errs;
	struct lc_def *d;

	cr_assert_not_null(root, "INBOX_SOURCE_ROOT is set by meson");
	snprintf(path, sizeof path, "%s/%s", root, rel);
	memset(&errs, 0, sizeof errs);
	d = lc_load_file(path, &errs);
	if (d == NULL)
		lc_errors_print(&errs, path, stderr);
	cr_assert_not_null(d, "%s loads", path);
	return d;
}

/* Event indexes of names, -1-terminated, for a hand-typed route. */
static int route_of(const struct lc_def *d, const char *const *names, int *ev)
{
	int n = 0;

	for (; names[n] != NULL; n++) {
		ev[n] = lc_event_find(d, names[n]);
		cr_assert_geq(ev[n], 0, "%s is an event of %s", names[n], d->aggregate);
	}
	return n;
}

static uint32_t emits_of(const struct lc_def *d, const char *const *names)
{
	uint32_t bits = 0;

	for (int k = 0; names[k] != NULL; k++) {
		int found = -1;
		for (int i = 0; i < d->nemits; i++)
			if (strcmp(d->emits[i], names[k]) == 0)
				found = i;
		cr_assert_geq(found, 0, "%s is emitted by %s", names[k], d->aggregate);
		bits |= 1u << found;
	}
	return bits;
}

/* One route as typed in by hand from lifecycles/shipment.json. */
struct hand_route {
	enum lg_route_kind kind;
	const char *events[8];
	const char *end;
	unsigned version;
	const char *emits[8];
	int dead; /* index of the dead-lettered event, or -1 */
};

static const struct hand_route shipment_routes[] = {
	{ LG_ROUTE_MAIN, { "ShipmentLabelled", "ParcelPickedUp", "ParcelInTransit", "ParcelDelivered" },
	  "Delivered", 4, { "ShipmentDispatched", "DeliveryConfirmed" }, -1 },
	/* Lost from PickedUp: nothing went in transit, so no carrier claim. */
	{ LG_ROUTE_BRANCH, { "ShipmentLabelled", "ParcelPickedUp", "ParcelLost" },
	  "Lost", 3, { "ShipmentDispatched", "CustomerRefundRequested" }, -1 },
	/* Lost in transit: ParcelLost's compensation files the claim. */
	{ LG_ROUTE_BRANCH, { "ShipmentLabelled", "ParcelPickedUp", "ParcelInTransit", "ParcelLost" },
	  "Lost", 4, { "ShipmentDispatched", "CustomerRefundRequested", "CarrierClaimFiled" }, -1 },
	{ LG_ROUTE_BRANCH, { "ShipmentLabelled", "ParcelPickedUp", "ParcelInTransit", "ParcelReturned" },
	  "Returned", 4, { "ShipmentDispatched", "ReturnReceived" }, -1 },
	/* Delivered after Lost is invalid-transition, and before it is held
	 * (it needs InTransit, which never comes). */
	{ LG_ROUTE_INVALID, { "ShipmentLabelled", "ParcelPickedUp", "ParcelLost", "ParcelDelivered" },
	  "Lost", 3, { "ShipmentDispatched", "CustomerRefundRequested" }, 3 },
};

Test(lgplan, shipment_routes_are_the_hand_typed_ones)
{
	struct lc_def *d = load_def("lifecycles/shipment.json");
	struct lg_plan p;
	char err[512] = "";
	int n = (int)(sizeof shipment_routes / sizeof shipment_routes[0]);

	cr_assert_eq(lg_plan_build(&p, d, err, sizeof err), 0, "plan: %s", err);
	cr_assert_eq(p.nroutes, n, "%d routes, typed %d", p.nroutes, n);
	cr_assert_eq(p.nbranch, 3);
	cr_assert_eq(p.invalid, 4);
	cr_assert(!p.is_order);
	for (int r = 0; r < n; r++) {
		const struct hand_route *h = &shipment_routes[r];
		const struct lg_route *got = &p.routes[r];
		int ev[8], len = route_of(d, h->events, ev);

		cr_assert_eq(got->kind, h->kind, "route %d kind", r);
		cr_assert_eq(got->n, len, "route %d: %d events, typed %d", r, got->n, len);
		for (int k = 0; k < len; k++) {
			cr_assert_eq(got->ev[k], ev[k], "route %d event %d: %s, typed %s", r, k,
			             d->events[got->ev[k]].type, h->events[k]);
			cr_assert_eq(got->dead[k], k == h->dead, "route %d event %d dead-lettered", r, k);
		}
		cr_assert_str_eq(d->states[got->end], h->end, "route %d end state", r);
		cr_assert_eq(got->version, h->version, "route %d version", r);
		cr_assert_eq(got->emits, emits_of(d, h->emits), "route %d emits", r);
	}
	/* The one data field its events read. */
	cr_assert_eq(p.nfields, 1);
	cr_assert_str_eq(p.fields[0].set->field, "tracking_number");
	lc_free(d);
}

/* Folded by hand: Lost, InTransit and PickedUp arrive before the label;
 * all three wait, the label releases PickedUp, which releases Lost (no
 * claim yet: InTransit has not taken effect), and InTransit, arriving
 * after a Lost, compensates with the claim.  The end is the canonical
 * route's: Lost, version 4, the same three events. */
Test(lgplan, shipment_fold_by_hand)
{
	struct lc_def *d = load_def("lifecycles/shipment.json");
	static const char *const order[] = { "ParcelLost", "ParcelInTransit", "ParcelPickedUp", "ShipmentLabelled", NULL };
	static const enum lc_decision out[] = { LC_APPLY, LC_COMPENSATE, LC_APPLY, LC_APPLY };
	static const bool held[] = { true, true, true, false };
	static const char *const emits[] = { "ShipmentDispatched", "CustomerRefundRequested", "CarrierClaimFiled", NULL };
	int ev[8], n = route_of(d, order, ev);
	struct lg_fold f;

	lg_fold_run(d, ev, NULL, n, &f);
	for (int i = 0; i < n; i++) {
		cr_assert_eq(f.out[i], out[i], "%s: %s, typed %s", order[i], lc_decision_outcome(f.out[i]),
		             lc_decision_outcome(out[i]));
		cr_assert_eq(f.held[i], held[i], "%s held", order[i]);
	}
	cr_assert_str_eq(d->states[f.state], "Lost");
	cr_assert_eq(f.version, 4);
	cr_assert_eq(f.emits, emits_of(d, emits));
	lc_free(d);
}

static const struct lg_opts base_opts = {
	.seed = 7, .run = "t", .orders = 300, .cancel_share = 0.4, .invalid_share = 0.1, .dup_rate = 0.2,
	.concurrent_dups = 0.25, .delayed_dups = 0.25, .reorder_window = 3, .interleave = 8, .conflicts = 10,
	.malformed = 16, .connections = 4, .max_body = 65536,
};

static json_t *body_json(const struct lg_scenario *s, uint32_t msg, uint8_t variant)
{
	struct lg_item it = { msg, variant, 0 };
	size_t len = 0;
	char *body = lg_body(s, &it, &len);
	json_error_t jerr;
	json_t *o;

	cr_assert_not_null(body);
	o = json_loadb(body, len, 0, &jerr);
	free(body);
	return o;
}

/* Every valid message of a shipment scenario: a type (or alias) of the
 * definition, the key field, tracking_number within its bound; each
 * aggregate's expectation is its route's. */
Test(lgplan, shipment_scenario_messages_follow_the_definition)
{
	struct lc_def *d = load_def("lifecycles/shipment.json");
	struct lg_opts o = base_opts;
	struct lg_scenario s;
	int per_route[LG_ROUTES_MAX] = { 0 };

	o.def = d;
	o.lifecycle = "lifecycles/shipment.json";
	cr_assert_eq(lg_scenario_build(&s, &o), 0);
	for (size_t i = 0; i < s.norders; i++) {
		const struct lg_order *od = &s.orders[i];
		const struct lg_route *r = &s.plan.routes[od->route];

		per_route[od->route]++;
		cr_assert_eq(od->nmsg, (uint32_t)r->n);
		cr_assert_eq(od->final_state, r->end);
		cr_assert_eq(od->final_version, r->version);
		cr_assert_eq(od->emits, r->emits);
	}
	for (int r = 0; r < s.plan.nroutes; r++)
		cr_assert_gt(per_route[r], 0, "route %d is used", r);
	for (size_t i = 0; i < s.originals; i++) {
		const struct lg_msg *m = &s.msgs[i];
		json_t *b = body_json(&s, (uint32_t)i, LG_VAR_ORIGINAL);
		const char *type = json_string_value(json_object_get(b, "type"));
		json_t *tn = json_object_get(json_object_get(b, "data"), "tracking_number");

		cr_assert_not_null(b, "%s is JSON", m->id);
		cr_assert_not_null(type);
		cr_assert_eq(lc_event_find(d, type), m->ev, "%s: type %s is the definition's", m->id, type);
		cr_assert_str_eq(json_string_value(json_object_get(b, "shipment_id")), s.orders[m->order].id);
		cr_assert_null(json_object_get(b, "order_id"), "%s carries no order_id", m->id);
		cr_assert(json_is_string(tn) && json_string_length(tn) >= 1 && json_string_length(tn) <= 64,
		          "%s: data.tracking_number a string of 1..64", m->id);
		json_decref(b);
	}
	/* Malformed: missing-key has no shipment_id, the rest name it; the two
	 * data classes of a lifecycle whose events read data: ShipmentLabelled
	 * without its required tracking_number (missing-field), and with a
	 * number for it (invalid-field). */
	int data_classes = 0;
	for (size_t i = s.originals; i < s.nmsgs; i++) {
		const struct lg_msg *m = &s.msgs[i];
		json_t *b, *tn;

		if (m->bad == LG_BAD_BINARY_HEADER || m->bad == LG_BAD_UTF8 || m->bad == LG_BAD_JSON ||
		    m->bad == LG_BAD_TOO_LARGE)
			continue;
		b = body_json(&s, (uint32_t)i, LG_VAR_ORIGINAL);
		cr_assert_not_null(b);
		cr_assert_eq(json_object_get(b, "shipment_id") == NULL, m->bad == LG_BAD_MISSING, "%s (%d)", m->id, m->bad);
		cr_assert_null(json_object_get(b, "order_id"));
		tn = json_object_get(json_object_get(b, "data"), "tracking_number");
		if (m->bad == LG_BAD_MISSING_DATA || m->bad == LG_BAD_INVALID_DATA) {
			data_classes |= m->bad == LG_BAD_MISSING_DATA ? 1 : 2;
			cr_assert_str_eq(json_string_value(json_object_get(b, "type")), "ShipmentLabelled");
			cr_assert_eq(m->reason, m->bad == LG_BAD_MISSING_DATA ? MSG_REASON_MISSING_FIELD : MSG_REASON_INVALID_FIELD);
			if (m->bad == LG_BAD_MISSING_DATA)
				cr_assert_null(tn, "%s: no tracking_number", m->id);
			else
				cr_assert(json_is_integer(tn), "%s: tracking_number not a string", m->id);
		}
		json_decref(b);
	}
	cr_assert_eq(data_classes, 3, "both data classes are published");
	lg_scenario_free(&s);
	lc_free(d);
}

/* A conflicting copy differs from its original in data.tracking_number
 * only: another payload under the same key. */
Test(lgplan, shipment_conflict_changes_the_payload)
{
	struct lc_def *d = load_def("lifecycles/shipment.json");
	struct lg_opts o = base_opts;
	struct lg_scenario s;
	size_t checked = 0;

	o.def = d;
	cr_assert_eq(lg_scenario_build(&s, &o), 0);
	for (size_t i = 0; i < s.originals; i++) {
		json_t *a, *b;

		if (s.msgs[i].conflicts == 0)
			continue;
		a = body_json(&s, (uint32_t)i, LG_VAR_ORIGINAL);
		b = body_json(&s, (uint32_t)i, LG_VAR_CONFLICT);
		cr_assert(!json_equal(a, b), "%s: the conflict is another payload", s.msgs[i].id);
		json_object_del(json_object_get(a, "data"), "tracking_number");
		json_object_del(json_object_get(b, "data"), "tracking_number");
		cr_assert(json_equal(a, b), "%s: ... in tracking_number only", s.msgs[i].id);
		json_decref(a);
		json_decref(b);
		checked++;
	}
	cr_assert_gt(checked, 0);
	lg_scenario_free(&s);
	lc_free(d);
}

/* The order definition, built in and read from its file: the paths the
 * load generator always had, in their order. */
Test(lgplan, order_routes_are_the_old_paths)
{
	static const struct {
		enum lg_route_kind kind;
		const char *events[5];
		const char *end;
	} paths[] = {
		{ LG_ROUTE_MAIN, { "OrderCreated", "PaymentAuthorized", "InventoryReserved", "ShipmentCreated" }, "Shipped" },
		{ LG_ROUTE_BRANCH, { "OrderCreated", "OrderCancelled" }, "Cancelled" },
		{ LG_ROUTE_BRANCH, { "OrderCreated", "PaymentAuthorized", "OrderCancelled" }, "Cancelled" },
		{ LG_ROUTE_BRANCH, { "OrderCreated", "PaymentAuthorized", "InventoryReserved", "OrderCancelled" }, "Cancelled" },
		{ LG_ROUTE_INVALID, { "OrderCreated", "OrderCancelled", "ShipmentCreated" }, "Cancelled" },
	};
	struct lc_errors errs;
	struct lc_def *defs[2];

	memset(&errs, 0, sizeof errs);
	defs[0] = lc_load(lc_builtin_order, lc_builtin_order_len, &errs);
	defs[1] = load_def("lifecycles/order.json");
	cr_assert_not_null(defs[0]);
	for (int k = 0; k < 2; k++) {
		struct lg_plan p;
		char err[512] = "";

		cr_assert_eq(lg_plan_build(&p, defs[k], err, sizeof err), 0, "plan: %s", err);
		cr_assert(p.is_order);
		cr_assert_eq(p.nroutes, 5);
		for (int r = 0; r < 5; r++) {
			int ev[8], n = route_of(defs[k], paths[r].events, ev);
			cr_assert_eq(p.routes[r].kind, paths[r].kind);
			cr_assert_eq(p.routes[r].n, n, "route %d", r);
			cr_assert_arr_eq(p.routes[r].ev, ev, (size_t)n * sizeof ev[0], "route %d", r);
			cr_assert_str_eq(defs[k]->states[p.routes[r].end], paths[r].end);
		}
		/* The ledger lists emits in SPEC's order. */
		cr_assert_str_eq(defs[k]->emits[p.emit_order[0]], "RefundRequested");
		cr_assert_str_eq(defs[k]->emits[p.emit_order[1]], "InventoryReleaseRequested");
		cr_assert_str_eq(defs[k]->emits[p.emit_order[2]], "OrderPaid");
		lc_free(defs[k]);
	}
}

/* An order definition that is arrival-order independent but emits no
 * OrderPaid: SPEC's table says otherwise, and the planner refuses it
 * rather than predict what SPEC does not promise. */
Test(lgplan, order_definition_against_spec)
{
	static const char text[] =
		"{\"lifecycle\":1,\"aggregate\":\"order\",\"table\":\"orders\",\"key\":\"order_id\","
		"\"states\":[\"Created\",\"Paid\",\"InventoryReserved\",\"Shipped\",\"Cancelled\"],"
		"\"main_path\":[\"Created\",\"Paid\",\"InventoryReserved\",\"Shipped\"],"
		"\"terminal\":[\"Shipped\",\"Cancelled\"],\"events\":["
		"{\"type\":\"OrderCreated\",\"creates\":\"Created\"},"
		"{\"type\":\"PaymentAuthorized\",\"from\":[\"Created\"],\"to\":\"Paid\","
		"\"after\":{\"Cancelled\":{\"compensate\":[\"RefundRequested\"]}}},"
		"{\"type\":\"InventoryReserved\",\"from\":[\"Paid\"],\"to\":\"InventoryReserved\","
		"\"after\":{\"Cancelled\":{\"compensate\":[\"InventoryReleaseRequested\"]}}},"
		"{\"type\":\"ShipmentCreated\",\"from\":[\"InventoryReserved\"],\"to\":\"Shipped\","
		"\"after\":{\"Cancelled\":\"invalid-transition\"}},"
		"{\"type\":\"OrderCancelled\",\"from\":[\"Created\",\"Paid\",\"InventoryReserved\"],\"to\":\"Cancelled\","
		"\"compensations\":[{\"if_took_effect\":\"PaymentAuthorized\",\"emit\":\"RefundRequested\"},"
		"{\"if_took_effect\":\"InventoryReserved\",\"emit\":\"InventoryReleaseRequested\"}],"
		"\"after\":{\"Shipped\":\"invalid-transition\"}}]}";
	struct lc_errors errs;
	struct lc_def *d;
	struct lg_plan p;
	char err[512] = "";

	memset(&errs, 0, sizeof errs);
	d = lc_load(text, sizeof text - 1, &errs);
	if (d == NULL)
		lc_errors_print(&errs, "(test)", stderr);
	cr_assert_not_null(d);
	cr_assert_eq(lg_plan_build(&p, d, err, sizeof err), -1);
	cr_assert(strstr(err, "disagrees with SPEC") != NULL, "%s", err);
	lc_free(d);
}

/* A definition the worker would refuse (order-dependent on purpose, from
 * tests/lifecycles/) is refused by the planner too. */
Test(lgplan, order_dependent_definition_refused)
{
	struct lc_def *d = load_def("tests/lifecycles/bad_cancel_forgets_refund.json");
	struct lg_plan p;
	char err[1200] = "";

	cr_assert_eq(lg_plan_build(&p, d, err, sizeof err), -1);
	cr_assert(strstr(err, "not arrival-order independent") != NULL, "%s", err);
	lc_free(d);
}

/* Run inbox-loadgen (INBOX_LOADGEN_BIN) with args, no INBOX_LIFECYCLE in
 * its environment, output to log; its exit code. */
static int loadgen(const char *const *args, const char *log)
{
	const char *bin = getenv("INBOX_LOADGEN_BIN");
	char *argv[40];
	int n = 0, st;
	pid_t pid;

	cr_assert_not_null(bin, "INBOX_LOADGEN_BIN is set by meson");
	argv[n++] = (char *)bin;
	for (int i = 0; args[i] != NULL && n < 39; i++)
		argv[n++] = (char *)args[i];
	argv[n] = NULL;
	pid = fork();
	cr_assert_neq(pid, -1);
	if (pid == 0) {
		FILE *f = freopen(log, "w", stdout);
		if (f == NULL || dup2(fileno(stdout), 2) < 0 || unsetenv("INBOX_LIFECYCLE") != 0)
			_exit(127);
		execv(bin, argv);
		_exit(127);
	}
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st), "inbox-loadgen did not exit (status %d)", st);
	return WEXITSTATUS(st);
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *buf;
	long n;

	cr_assert_not_null(f, "cannot read %s", path);
	cr_assert_eq(fseek(f, 0, SEEK_END), 0);
	n = ftell(f);
	cr_assert_geq(n, 0);
	rewind(f);
	buf = calloc((size_t)n + 1, 1);
	cr_assert_not_null(buf);
	cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	return buf;
}

static void tmp_path(char *buf, size_t cap, const char *name)
{
	snprintf(buf, cap, "%s/inbox-lgplan-%s-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", name, (int)getpid());
}

/* The ledger is written before publish connects, so a broker that is not
 * there (port 1) still leaves it; publish then fails (exit 1). */
#define NO_BROKER "--amqp-url", "amqp://guest:guest@127.0.0.1:1/"

/* publish --lifecycle lifecycles/order.json plans exactly what the
 * built-in order lifecycle plans: every ledger line alike but the run
 * line, which names the file. */
Test(lgplan, order_file_ledger_is_the_builtin_ledger)
{
	char file[1024], a[300], b[300], loga[320], logb[320];
	const char *pa[] = { "publish", "--ledger", a, "--run", "same", "--seed", "11", "--orders", "300", "--malformed",
	                     "18", "--conflicts", "9", "--invalid-share", "0.05", NO_BROKER, NULL };
	const char *pb[] = { "publish", "--lifecycle", file, "--ledger", b, "--run", "same", "--seed", "11", "--orders",
	                     "300", "--malformed", "18", "--conflicts", "9", "--invalid-share", "0.05", NO_BROKER, NULL };
	char *ta, *tb, *ra, *rb;

	snprintf(file, sizeof file, "%s/lifecycles/order.json", getenv("INBOX_SOURCE_ROOT"));
	tmp_path(a, sizeof a, "builtin.jsonl");
	tmp_path(b, sizeof b, "file.jsonl");
	snprintf(loga, sizeof loga, "%s.log", a);
	snprintf(logb, sizeof logb, "%s.log", b);
	cr_assert_eq(loadgen(pa, loga), 1, "publish without a broker fails after the ledger, see %s", loga);
	cr_assert_eq(loadgen(pb, logb), 1, "publish without a broker fails after the ledger, see %s", logb);
	ta = slurp(a);
	tb = slurp(b);
	ra = strchr(ta, '\n');
	rb = strchr(tb, '\n');
	cr_assert(ra != NULL && rb != NULL);
	cr_assert(strstr(ta, "\"lifecycle\"") == NULL || strstr(ta, "\"lifecycle\"") > ra,
	          "the built-in ledger's run line is as it always was");
	cr_assert(strstr(tb, "\"aggregate\":\"order\"") != NULL && strstr(tb, "\"aggregate\":\"order\"") < rb);
	cr_assert_str_eq(ra, rb, "the order lines and msg lines are the same");
	free(ta);
	free(tb);
}

/* A shipment ledger verified as orders (no --lifecycle), or as another
 * lifecycle, is refused before anything is read, naming the one to give. */
Test(lgplan, verify_refuses_a_ledger_of_another_lifecycle)
{
	char ship[1024], order[1024], ledger[300], log[320];
	const char *pub[] = { "publish", "--lifecycle", ship, "--ledger", ledger, "--orders", "20", NO_BROKER, NULL };
	const char *v_none[] = { "verify", "--ledger", ledger, "--timeout", "1", NO_BROKER, NULL };
	const char *v_order[] = { "verify", "--lifecycle", order, "--ledger", ledger, "--timeout", "1", NO_BROKER, NULL };
	char *text;

	snprintf(ship, sizeof ship, "%s/lifecycles/shipment.json", getenv("INBOX_SOURCE_ROOT"));
	snprintf(order, sizeof order, "%s/lifecycles/order.json", getenv("INBOX_SOURCE_ROOT"));
	tmp_path(ledger, sizeof ledger, "ship.jsonl");
	snprintf(log, sizeof log, "%s.log", ledger);
	cr_assert_eq(loadgen(pub, log), 1, "see %s", log);
	cr_assert_eq(loadgen(v_none, log), 1, "see %s", log);
	text = slurp(log);
	cr_assert(strstr(text, "published for the shipment lifecycle") != NULL && strstr(text, "--lifecycle") != NULL,
	          "%s", text);
	free(text);
	cr_assert_eq(loadgen(v_order, log), 1, "see %s", log);
	text = slurp(log);
	cr_assert(strstr(text, "published for the shipment lifecycle") != NULL, "%s", text);
	free(text);
}

/* What verify folds a definition's own statements by: each route event's
 * decision and the state it was reached in, and one statement for two of
 * the same text and values (another event's, or compensating), so that a
 * route whose events run the same statements in every arrival order is
 * kept (bench's order_fx1: five routes, as the order's) and verify checks
 * those rows once. */
Test(lgplan, routes_say_which_statements_each_event_runs)
{
	struct lc_def *inv = load_def("lifecycles/invoice.json"), *fx1 = load_def("bench/lifecycles/order_fx1.json");
	int pay = lc_event_find(inv, "PaymentReceived"), first = -1, n;
	struct lg_plan p;
	char err[512] = "";

	cr_assert_eq(lg_plan_build(&p, inv, err, sizeof err), 0, "plan: %s", err);
	cr_assert_eq(p.routes[0].ev[1], pay);
	cr_expect_eq(p.routes[0].out[1], LC_APPLY);
	cr_expect_str_eq(inv->states[p.routes[0].before[1]], "Issued");
	n = lc_event_stmts(inv, pay, p.routes[0].before[1], p.routes[0].out[1], &first);
	cr_assert_eq(n, 2);
	cr_expect_eq(inv->stmts[first].fx.shape, LC_FX_SHAPE_INSERT);
	cr_expect_eq(inv->stmts[first + 1].fx.shape, LC_FX_SHAPE_ADD);
	/* the payment's and the refund's rows differ by their literal */
	cr_expect(!lg_stmt_same(inv, first, first + 2));
	cr_expect(lg_stmt_same(inv, first, first));

	cr_assert_eq(lg_plan_build(&p, fx1, err, sizeof err), 0, "plan: %s", err);
	cr_expect_eq(p.nroutes, 5, "a route dropped although its statements are the same in every order");
	cr_expect(lg_stmt_same(fx1, 0, fx1->nstmts - 1), "one text, one statement, whichever event runs it");
	lc_free(inv);
	lc_free(fx1);
}

/* The events of route r as "A B C", into buf. */
static const char *route_text(const struct lc_def *d, const struct lg_route *r, char *buf, size_t cap)
{
	size_t used = 0;

	buf[0] = '\0';
	for (int k = 0; k < r->n; k++)
		used += (size_t)snprintf(buf + used, cap - used, "%s%s", k ? " " : "", d->events[r->ev[k]].type);
	return buf;
}

/* A numbered definition (lifecycles/ticket.json) is planned by its
 * numbers: the main path, the reopen loop taken once (TicketResolved
 * twice: CustomerNotified at numbers 3 and 5) and an invalid route that
 * ends in its invalid event; none is checked over arrival orders, and a
 * fold in any arrival order of the loop route, by its numbers, ends as
 * the route does. */
Test(lgplan, a_numbered_definition_plans_its_loop_by_numbers)
{
	struct lc_def *d = load_def("lifecycles/ticket.json");
	struct lg_plan p;
	char err[512], text[512];
	const struct lg_route *loop;
	int ev[LG_ROUTE_MAX], num[LG_ROUTE_MAX];
	static const int arrival[] = { 5, 2, 0, 3, 1, 4 }; /* canonical positions, in arrival order */
	struct lg_fold f;

	cr_assert_eq(lg_plan_build(&p, d, err, sizeof err), 0, "%s", err);
	cr_assert_eq(p.nroutes, 3, "main, the loop, the invalid route");
	cr_expect_str_eq(route_text(d, &p.routes[0], text, sizeof text),
	                 "TicketOpened WorkStarted TicketResolved TicketClosed");
	loop = &p.routes[1];
	cr_expect_str_eq(route_text(d, loop, text, sizeof text),
	                 "TicketOpened WorkStarted TicketResolved TicketReopened TicketResolved TicketClosed");
	cr_expect_str_eq(d->states[loop->end], "Closed");
	cr_expect_eq(loop->version, 6);
	cr_assert_eq(loop->ninst, 3);
	cr_expect_str_eq(d->emits[loop->inst_kind[0]], "CustomerNotified");
	cr_expect_eq(loop->inst_num[0], 3);
	cr_expect_str_eq(d->emits[loop->inst_kind[1]], "CustomerNotified");
	cr_expect_eq(loop->inst_num[1], 5);
	cr_expect_str_eq(d->emits[loop->inst_kind[2]], "SurveySent");
	cr_expect_eq(loop->inst_num[2], 6);
	cr_assert_eq(p.invalid, 2);
	cr_expect_str_eq(route_text(d, &p.routes[2], text, sizeof text), "TicketOpened TicketResolved");
	cr_expect(!p.routes[2].dead[0] && p.routes[2].dead[1], "the creation applies, the resolution is invalid");
	cr_expect_eq(p.routes[2].version, 1);

	for (int i = 0; i < loop->n; i++) {
		ev[i] = loop->ev[arrival[i]];
		num[i] = arrival[i] + 1;
	}
	lg_fold_run(d, ev, num, loop->n, &f);
	cr_expect_eq(f.state, loop->end);
	cr_expect_eq(f.version, loop->version);
	cr_expect(f.held[0] && f.held[1] && !f.held[2], "number 6 and 3 wait; 1 goes");
	lc_free(d);
}
