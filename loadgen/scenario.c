/*
 * scenario.c - builds the load scenario from the seed and writes its ledger.
 *
 * Why the expectations are computed and not hard-coded: each aggregate's
 * final state, version and emitted messages come from its route (plan.c):
 * the lifecycle definition folded over the canonical sequence, checked over
 * every arrival order, and for the order definition held against SPEC's
 * table (spec_oracle.c, typed in from SPEC.md, not the worker's
 * agg_decide, so a definition that disagrees with SPEC is refused
 * before anything is published).  SPEC.md promises that any arrival order
 * ends there.  The one thing that does depend on
 * arrival order is whether an effect is recorded as `applied` or
 * `compensated` (Created, Cancelled, Paid compensates the payment), so the
 * ledger's hard expectation is "one effect", and the outcome it gives for
 * publication order (`nominal`) is informative.
 *
 * Layout of a publish: orders are interleaved in chunks (so one order's
 * events travel through the queue among other orders' and reach different
 * workers), each order's events are shuffled within the reorder window,
 * immediate copies land a few hundred messages after their original, and a
 * concurrent copy sits in the same row as its original so that another
 * connection publishes it at the same moment.
 */
#include "scenario.h"

#include <errno.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "array.h"
#include "lifecycle_emit.h"

#define LG_SLOTS_PER_ORDER 8  /* key space per order per chunk (>= events; more for longer routes) */
#define LG_IMMEDIATE_SPREAD 2000.0 /* key units an immediate copy may trail its original */
#define LG_EPOCH 1798761600LL /* 2027-01-01T00:00:00Z: occurred_at base */

static const char *const lg_bad_names[] = {
	[LG_BAD_NONE] = "",
	[LG_BAD_JSON] = "truncated-json",
	[LG_BAD_UTF8] = "invalid-utf8",
	[LG_BAD_MISSING] = "missing-order-id",
	[LG_BAD_INVALID] = "invalid-order-id",
	[LG_BAD_ID_MISMATCH] = "message-id-mismatch",
	[LG_BAD_UNKNOWN_TYPE] = "unknown-type",
	[LG_BAD_TOO_LARGE] = "too-large",
	[LG_BAD_BINARY_HEADER] = "binary-header",
	[LG_BAD_MISSING_DATA] = "missing-data-field",
	[LG_BAD_INVALID_DATA] = "invalid-data-field",
};
_Static_assert(ARRAY_LEN(lg_bad_names) == LG_BAD_COUNT, "one name per enum lg_bad");

const char *const lg_envelope_names[LG_ENV_COUNT] = {
	[LG_ENV_NATIVE] = "native", [LG_ENV_CE] = "cloudevents", [LG_ENV_CE_BINARY] = "cloudevents-binary",
};

/* The reason SPEC.md gives for each malformed class. */
static const enum msg_reason lg_bad_reason[] = {
	[LG_BAD_NONE] = MSG_REASON_NONE,
	[LG_BAD_JSON] = MSG_REASON_MALFORMED_JSON,
	[LG_BAD_UTF8] = MSG_REASON_MALFORMED_JSON,
	[LG_BAD_MISSING] = MSG_REASON_MISSING_FIELD,
	[LG_BAD_INVALID] = MSG_REASON_INVALID_FIELD,
	[LG_BAD_ID_MISMATCH] = MSG_REASON_INVALID_FIELD,
	[LG_BAD_UNKNOWN_TYPE] = MSG_REASON_UNKNOWN_TYPE,
	[LG_BAD_TOO_LARGE] = MSG_REASON_TOO_LARGE,
	[LG_BAD_BINARY_HEADER] = MSG_REASON_MALFORMED_JSON,
	[LG_BAD_MISSING_DATA] = MSG_REASON_MISSING_FIELD,
	[LG_BAD_INVALID_DATA] = MSG_REASON_INVALID_FIELD,
};
_Static_assert(ARRAY_LEN(lg_bad_reason) == LG_BAD_COUNT, "one reason per enum lg_bad");

/* splitmix64: tiny, fast, and the same sequence on every platform. */
struct lg_rng {
	uint64_t s;
};

static uint64_t lg_next(struct lg_rng *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static double lg_unit(struct lg_rng *r)
{
	return (double)(lg_next(r) >> 11) / 9007199254740992.0; /* [0, 1) */
}

static uint32_t lg_below(struct lg_rng *r, uint32_t n)
{
	return n == 0 ? 0 : (uint32_t)(lg_next(r) % n);
}

/* Key space per aggregate per chunk: at least one slot per event. */
static double lg_slots(const struct lg_scenario *s)
{
	return s->plan.max_len > LG_SLOTS_PER_ORDER ? (double)s->plan.max_len : (double)LG_SLOTS_PER_ORDER;
}

/* The name a message's type goes under: its alias when it is sent as one. */
static const char *lg_type_name(const struct lg_scenario *s, const struct lg_msg *m)
{
	const struct lc_event *e = &s->plan.def->events[m->ev];
	return m->alias ? e->aliases[0] : e->type;
}

double lg_messages_per_order(const struct lg_opts *o)
{
	struct lg_plan p;
	char err[256];
	double happy = 1.0 - o->cancel_share - o->invalid_share, branches = 0, per;

	if (o->def == NULL || lg_plan_build(&p, o->def, err, sizeof err) != 0)
		return 0;
	for (int b = 1; b <= p.nbranch; b++)
		branches += p.routes[b].n;
	per = happy * p.routes[0].n + (p.nbranch > 0 ? o->cancel_share * branches / p.nbranch : 0) +
	      (p.invalid >= 0 ? o->invalid_share * p.routes[p.invalid].n : 0);
	return per * (1.0 + o->dup_rate * (1.0 + o->concurrent_dups * 0.5));
}

/* An entry of the main phase before it is laid out in rows. */
struct lg_entry {
	double key;
	uint32_t msg;
	uint8_t variant;
	uint8_t group; /* slots needed in one row: the original and its concurrent copies */
};

static int lg_entry_cmp(const void *a, const void *b)
{
	const struct lg_entry *x = a, *y = b;

	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	if (x->msg != y->msg)
		return x->msg < y->msg ? -1 : 1;
	return (int)x->variant - (int)y->variant;
}

/* A copy published beside or shortly after its original: the same bytes or
 * the same event re-serialised (a half each). */
static uint8_t lg_copy_variant(struct lg_rng *r)
{
	return (uint8_t)(lg_below(r, 2) ? LG_VAR_DUP_SAME : LG_VAR_DUP_RESHAPED);
}

/* Lay entries out in rows of `cols` slots; a group (an original and its
 * concurrent copies) stays in one row, starting a new one if it must. */
static int lg_layout(struct lg_phase *ph, const struct lg_entry *e, size_t n, int cols, struct lg_rng *r)
{
	size_t cap, row = 0, col = 0, total = 0, width = (size_t)cols;
	struct lg_item hole = { UINT32_MAX, 0, 0 };

	for (size_t i = 0; i < n; i++)
		total += e[i].group;
	cap = total * 2 + width;
	ph->slots = malloc(cap * sizeof *ph->slots);
	if (ph->slots == NULL)
		return -1;
	for (size_t i = 0; i < cap; i++)
		ph->slots[i] = hole;
	ph->items = 0;
	for (size_t i = 0; i < n; i++) {
		unsigned g = e[i].group;

		if (width > 1 && g > 1 && col + g > width) {
			col = 0;
			row++;
		}
		for (unsigned k = 0; k < g; k++) {
			ph->slots[row * width + col] = (struct lg_item){ e[i].msg, k == 0 ? e[i].variant : lg_copy_variant(r), 0 };
			ph->items++;
			if (++col == width) {
				col = 0;
				row++;
			}
		}
	}
	ph->rows = row + (col > 0 ? 1 : 0);
	return 0;
}

/* The outcome of each event if one worker handled them in this order,
 * holds included: "applied", "held-then-applied", "compensated", ...;
 * the definition's (plan.h's fold). */
static void lg_nominal(struct lg_scenario *s, const uint32_t *seq, unsigned n)
{
	static const char *const held_then[] = {
		[LC_APPLY] = "held-then-applied",
		[LC_HOLD] = "held",
		[LC_IGNORE] = "held-then-ignored",
		[LC_COMPENSATE] = "held-then-compensated",
		[LC_INVALID] = "held-then-dead_lettered",
	};
	int ev[LG_ROUTE_MAX], num[LG_ROUTE_MAX];
	struct lg_fold f;

	for (unsigned i = 0; i < n; i++) {
		ev[i] = s->msgs[seq[i]].ev;
		num[i] = lg_msg_number(s, &s->msgs[seq[i]]);
	}
	lg_fold_run(s->plan.def, ev, lc_sequenced(s->plan.def) ? num : NULL, (int)n, &f);
	for (unsigned i = 0; i < n; i++)
		s->msgs[seq[i]].nominal = f.held[i] ? held_then[f.out[i]] : lc_decision_outcome(f.out[i]);
}

/* Parse the original body of message idx as the worker would (props NULL:
 * no AMQP properties).  Returns 0 with *r set, or -1 when out of memory. */
static int lg_parse_original(const struct lg_scenario *s, uint32_t idx, const struct msg_props *props,
                             struct msg *parsed, enum msg_reason *r)
{
	struct lg_item it = { idx, LG_VAR_ORIGINAL, 0 };
	size_t len;
	char *body = lg_body(s, &it, &len);

	if (body == NULL)
		return -1;
	*r = msg_parse(body, len, (size_t)s->opts.max_body, props, parsed);
	free(body);
	return 0;
}

/* For the order definition only: msg_parse knows the order's types and
 * key, not another lifecycle's (the worker reads those through the
 * definition), so another lifecycle's classes are not cross-checked here. */
static int lg_check_bad(const struct lg_scenario *s, struct lg_msg *m, uint32_t idx)
{
	struct msg_props props = { m->id, strlen(m->id), NULL, 0, NULL };
	struct msg parsed;
	enum msg_reason r;

	if (!s->plan.is_order || s->opts.envelope != LG_ENV_NATIVE)
		return 0;
	if (lg_parse_original(s, idx, &props, &parsed, &r) != 0)
		return -1;
	if (r != m->reason)
		fprintf(stderr, "inbox-loadgen: note: msg_parse says '%s' for the %s class, SPEC.md says '%s'\n",
		        msg_reason_name(r), lg_bad_names[m->bad], msg_reason_name(m->reason));
	return 0;
}

/* The canonical payload hash as SPEC.md defines it (SHA-256 of the body
 * re-serialised compact with sorted keys), for a lifecycle msg_parse does
 * not know; 0 or -1. */
static int lg_hash_canonical(const struct lg_scenario *s, struct lg_msg *m, uint32_t idx)
{
	struct lg_item it = { idx, LG_VAR_ORIGINAL, 0 };
	size_t len;
	char *body = lg_body(s, &it, &len), *canon = NULL;
	json_error_t jerr;
	json_t *root = body != NULL ? json_loadb(body, len, 0, &jerr) : NULL;
	unsigned int n = 0;
	int rc = -1;

	/* a header's number joins the event (msg.c), as the string it is sent as */
	if (root != NULL && s->plan.def->seq_header &&
	    json_object_set_new(root, "sequence", json_sprintf("%d", lg_msg_number(s, m))) != 0) {
		json_decref(root);
		root = NULL;
	}
	if (root != NULL)
		canon = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
	if (canon != NULL && EVP_Digest(canon, strlen(canon), m->sha256, &n, EVP_sha256(), NULL) == 1 && n == 32)
		rc = 0;
	free(canon);
	json_decref(root);
	free(body);
	return rc;
}

static json_t *lg_data(const struct lg_scenario *s, const struct lg_item *it, const char *when);
static void lg_occurred_at(const struct lg_scenario *s, const struct lg_msg *m, long later, char *buf, size_t cap);

/* The payload hash of a message that came in an envelope, as SPEC.md
 * defines it (Envelopes): SHA-256 of the event in canonical form, the
 * mapped fields (message_id, source, type, order_id, occurred_at) and the
 * data, compact JSON with sorted keys — built here from the scenario, not
 * read back from the worker's envelope layer; 0 or -1. */
static int lg_hash_envelope(const struct lg_scenario *s, struct lg_msg *m, uint32_t idx)
{
	struct lg_item it = { idx, LG_VAR_ORIGINAL, 0 };
	char when[32], *canon = NULL;
	json_t *data, *ev;
	unsigned int n = 0;
	int rc = -1;

	lg_occurred_at(s, m, 0, when, sizeof when);
	data = lg_data(s, &it, when);
	ev = data != NULL ? json_pack("{s:s, s:s, s:s, s:s, s:s, s:O}", "message_id", m->id, "source", m->source,
	                              "type", lg_type_name(s, m), "order_id", s->orders[m->order].id,
	                              "occurred_at", when, "data", data)
	                  : NULL;
	/* the number as the envelope layer keeps it: the attribute's or the
	 * header's text (lg_body, lg_ce_headers send it as a string) */
	if (ev != NULL && (s->plan.def->seq_attr || s->plan.def->seq_header) &&
	    json_object_set_new(ev, "sequence", json_sprintf("%d", lg_msg_number(s, m))) != 0) {
		json_decref(ev);
		ev = NULL;
	}
	if (ev != NULL)
		canon = json_dumps(ev, JSON_COMPACT | JSON_SORT_KEYS);
	if (canon != NULL && EVP_Digest(canon, strlen(canon), m->sha256, &n, EVP_sha256(), NULL) == 1 && n == 32)
		rc = 0;
	free(canon);
	json_decref(ev);
	json_decref(data);
	return rc;
}

/* Fill sha256 (the canonical payload hash) of a valid message. */
static int lg_hash(const struct lg_scenario *s, struct lg_msg *m, uint32_t idx)
{
	struct msg parsed;
	enum msg_reason r;

	if (s->opts.envelope != LG_ENV_NATIVE)
		return lg_hash_envelope(s, m, idx);
	if (!s->plan.is_order)
		return lg_hash_canonical(s, m, idx);
	if (lg_parse_original(s, idx, NULL, &parsed, &r) != 0)
		return -1;
	if (r != MSG_REASON_NONE) {
		fprintf(stderr, "inbox-loadgen: generated an invalid event %s: %s\n", m->id, parsed.detail);
		return -1;
	}
	memcpy(m->sha256, parsed.sha256, sizeof m->sha256);
	return 0;
}

/* Every message and order id of the run starts with the prefix: the seed,
 * and the run tag or else the clock (two runs of one seed stay apart). */
static int lg_prefix(struct lg_scenario *s, const struct lg_opts *o)
{
	struct timespec ts;

	if (o->run[0] != '\0') {
		snprintf(s->prefix, sizeof s->prefix, "lg%llu-%s", (unsigned long long)(o->seed % 1000000), o->run);
		return 0;
	}
	if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
		return -1;
	snprintf(s->prefix, sizeof s->prefix, "lg%llu-%llx", (unsigned long long)(o->seed % 1000000),
	         (unsigned long long)ts.tv_sec * 1000ULL + (unsigned long long)ts.tv_nsec / 1000000ULL);
	return 0;
}

/* A route: the main path, or with cancel_share one of the terminal
 * branches (an even split), or with invalid_share the invalid route. */
static int lg_pick_route(const struct lg_scenario *s, struct lg_rng *r)
{
	const struct lg_opts *o = &s->opts;
	const struct lg_plan *p = &s->plan;
	double u = lg_unit(r);
	int route = 0;

	if (u < o->cancel_share && p->nbranch > 0)
		route = 1 + (int)(u / o->cancel_share * (double)p->nbranch);
	else if (u < o->cancel_share + o->invalid_share && p->invalid >= 0)
		route = p->invalid;
	return route > p->nbranch && route != p->invalid ? p->nbranch : route;
}

/* The aggregate's value of each data field: orders' amount_cents as it
 * always was (100 .. 100,099), other integers within their bounds, a draw
 * for a string (lg_field_text), nothing for a datetime (its occurred_at). */
static void lg_draw_fields(const struct lg_scenario *s, struct lg_order *od, struct lg_rng *r)
{
	for (int f = 0; f < s->plan.nfields; f++) {
		const struct lc_set *set = s->plan.fields[f].set;

		if (set->type == LC_TYPE_INTEGER && set->min <= 100 && set->max >= 100099) {
			od->data[f] = 100 + (int64_t)lg_below(r, 100000);
		} else if (set->type == LC_TYPE_INTEGER) {
			uint64_t span = (uint64_t)set->max - (uint64_t)set->min;
			od->data[f] = set->min + (int64_t)(span < 1000000 ? lg_next(r) % (span + 1) : lg_next(r) % 1000000);
		} else if (set->type == LC_TYPE_STRING) {
			od->data[f] = (int64_t)(lg_next(r) >> 1);
		}
	}
}

/* A CloudEvents producer's keys for message idx (the native ones stay in
 * our alphabet): its source a URI naming the producer, for every other
 * message one longer than 64 characters, and for every third message an
 * id of 150 characters with the '/' a real producer's ids have — what
 * SPEC's envelope accepts (1..255 each) and every table the message
 * reaches must hold.  The id still starts with the run's prefix, which
 * verify selects by. */
/* The aggregate id of a malformed message, which belongs to no planned
 * aggregate: its id as first written, before lg_ce_keys lengthened it
 * past what an aggregate id may be (a message must be malformed only in
 * the way its class says). */
static const char *lg_own_aggregate(const struct lg_msg *m, char *buf, size_t cap)
{
	size_t n = strcspn(m->id, "/");

	snprintf(buf, cap, "%.*s", (int)n, m->id);
	return buf;
}

static void lg_ce_keys(struct lg_scenario *s, struct lg_msg *m, size_t idx)
{
	enum { LONG_ID = 150 };
	size_t n;

	if (s->opts.envelope == LG_ENV_NATIVE)
		return;
	m->source = s->ce_sources[(size_t)m->ev * 2 + idx % 2];
	if (idx % 3 != 1)
		return;
	n = strlen(m->id);
	n += (size_t)snprintf(m->id + n, sizeof m->id - n, "/checkout/eu-west-1/attempt/");
	for (uint64_t h = 0x9e3779b97f4a7c15ULL * (idx + 1); n < LONG_ID && n + 1 < sizeof m->id; n++) {
		h = h * 6364136223846793005ULL + 1442695040888963407ULL;
		m->id[n] = "0123456789abcdef"[h >> 60];
	}
	m->id[n] = '\0';
}

/* The two CloudEvents sources of each event of the definition: the
 * producer the native scenario names (payments, inventory, the table) as
 * a URI, and the same with an instance, past 64 characters. */
static int lg_ce_sources(struct lg_scenario *s)
{
	int nev = s->plan.def->nevents;

	if (s->opts.envelope == LG_ENV_NATIVE)
		return 0;
	s->ce_sources = calloc((size_t)nev * 2, sizeof *s->ce_sources);
	if (s->ce_sources == NULL)
		return -1;
	for (int e = 0; e < nev; e++) {
		const char *who = lg_plan_source(&s->plan, e);

		snprintf(s->ce_sources[e * 2], LG_CE_SOURCE_MAX,
		         "https://%s.example.com/region/eu-west-1/service/checkout", who);
		snprintf(s->ce_sources[e * 2 + 1], LG_CE_SOURCE_MAX,
		         "https://%s.example.com/region/eu-west-1/service/checkout/instance/i-0a1b2c3d4e5f", who);
	}
	return 0;
}

/* Aggregate i, its route and its messages in canonical order, each
 * expected as the route says. */
static int lg_build_order(struct lg_scenario *s, size_t i, struct lg_rng *r)
{
	struct lg_order *od = &s->orders[i];
	const struct lg_route *rt;

	od->route = lg_pick_route(s, r);
	rt = &s->plan.routes[od->route];
	snprintf(od->id, sizeof od->id, "%s-o%zu", s->prefix, i);
	lg_draw_fields(s, od, r);
	od->first_msg = (uint32_t)s->nmsgs;
	od->nmsg = (uint32_t)rt->n;
	for (unsigned k = 0; k < od->nmsg; k++) {
		struct lg_msg *m = &s->msgs[s->nmsgs++];

		snprintf(m->id, sizeof m->id, "%s-%zu-%u", s->prefix, i, k);
		m->order = (int32_t)i;
		m->ev = rt->ev[k];
		m->alias = s->plan.def->events[m->ev].naliases > 0 && lg_below(r, 10) == 0;
		m->source = lg_plan_source(&s->plan, m->ev);
		lg_ce_keys(s, m, s->nmsgs - 1);
		if (rt->dead[k]) {
			m->expect = LG_EXPECT_DEAD;
			m->reason = MSG_REASON_INVALID_TRANSITION;
		} else {
			m->expect = LG_EXPECT_EFFECT;
		}
	}
	od->final_state = rt->end;
	od->final_version = rt->version;
	od->emits = rt->emits;
	return 0;
}

/* Malformed messages, an even spread over the classes, after the valid
 * originals: SPEC's eight for the order lifecycle (its ledger stays as it
 * was), and for another lifecycle the data classes its events allow.  A
 * malformed message is of the creating event, a data class of the event
 * that reads (requires) the field. */
static int lg_build_malformed(struct lg_scenario *s)
{
	enum lg_bad classes[LG_BAD_COUNT];
	int nclasses = 0;

	for (int c = 1; c <= LG_BAD_BINARY_HEADER; c++)
		classes[nclasses++] = (enum lg_bad)c;
	if (!s->plan.is_order && s->plan.required_ev >= 0)
		classes[nclasses++] = LG_BAD_MISSING_DATA;
	if (!s->plan.is_order && s->plan.data_ev >= 0)
		classes[nclasses++] = LG_BAD_INVALID_DATA;
	for (long i = 0; i < s->opts.malformed; i++) {
		struct lg_msg *m = &s->msgs[s->nmsgs];
		snprintf(m->id, sizeof m->id, "%s-bad-%ld", s->prefix, i);
		m->order = -1;
		m->bad = classes[i % nclasses];
		m->ev = m->bad == LG_BAD_MISSING_DATA   ? s->plan.required_ev
		        : m->bad == LG_BAD_INVALID_DATA ? s->plan.data_ev
		                                        : s->plan.routes[0].ev[0];
		m->source = lg_plan_source(&s->plan, m->ev);
		lg_ce_keys(s, m, s->nmsgs);
		m->expect = LG_EXPECT_DEAD;
		m->reason = lg_bad_reason[m->bad];
		m->nominal = "dead_lettered";
		if (lg_check_bad(s, m, (uint32_t)s->nmsgs) != 0)
			return -1;
		s->nmsgs++;
		s->malformed++;
	}
	return 0;
}

/* Which valid originals are published more than once, and how: concurrent
 * copies need another connection to go out beside the original. */
static void lg_build_dups(struct lg_scenario *s, struct lg_rng *r)
{
	const struct lg_opts *o = &s->opts;
	int cols = o->connections;

	for (size_t i = 0; i < s->originals; i++) {
		struct lg_msg *m = &s->msgs[i];
		double u;

		if (lg_unit(r) >= o->dup_rate)
			continue;
		u = lg_unit(r);
		if (u < o->concurrent_dups && cols > 1) {
			unsigned most = cols - 1 < 2 ? (unsigned)cols - 1 : 2;
			m->dup_concurrent = (uint16_t)(1 + lg_below(r, most));
			s->copies_concurrent += m->dup_concurrent;
		} else if (u < o->concurrent_dups + o->delayed_dups) {
			m->dup_delayed = 1;
			s->copies_delayed++;
		} else {
			m->dup_immediate = 1;
			s->copies_immediate++;
		}
	}
}

/* Keys re-sent later with another payload: each conflicted message needs
 * its canonical hash for the ledger. */
static int lg_build_conflicts(struct lg_scenario *s, struct lg_rng *r)
{
	size_t nvalid = s->originals;

	for (long c = 0; c < s->opts.conflicts && nvalid > 0; c++) {
		/* Pick a message without a conflict yet; a bounded search keeps
		 * this deterministic and finite. */
		for (int tries = 0; tries < 64; tries++) {
			struct lg_msg *m = &s->msgs[lg_below(r, (uint32_t)nvalid)];
			if (m->conflicts == 0 && m->expect == LG_EXPECT_EFFECT) {
				m->conflicts = 1;
				s->conflict_copies++;
				break;
			}
		}
	}
	for (size_t i = 0; i < nvalid; i++) {
		if (s->msgs[i].conflicts > 0 && lg_hash(s, &s->msgs[i], (uint32_t)i) != 0)
			return -1;
	}
	return 0;
}

/* A message of one order and its shuffle key. */
struct lg_shuffled {
	double key;
	uint32_t msg;
};

static int lg_shuffled_cmp(const void *a, const void *b)
{
	const struct lg_shuffled *x = a, *y = b;

	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	return x->msg < y->msg ? -1 : x->msg > y->msg; /* ties keep canonical order */
}

/* Order od's messages in publication order, into seq: sorted by position
 * plus a random offset below window+1, so no event moves further than
 * that. */
static void lg_shuffle_order(const struct lg_order *od, int window, struct lg_rng *r, uint32_t *seq)
{
	struct lg_shuffled e[LG_ROUTE_MAX];
	unsigned n = od->nmsg;

	for (unsigned k = 0; k < n; k++)
		e[k] = (struct lg_shuffled){ (double)k + (window > 0 ? lg_unit(r) * (window + 1) : 0.0),
			                     od->first_msg + k };
	qsort(e, n, sizeof *e, lg_shuffled_cmp);
	for (unsigned k = 0; k < n; k++)
		seq[k] = e[k].msg;
}

/* Order i's entries: each event at its place among the interleaved
 * orders, its immediate copy a little behind it (main), its delayed copy
 * and its conflict anywhere in the late phase. */
static void lg_order_entries(struct lg_scenario *s, size_t i, struct lg_rng *r, struct lg_entry *ent, size_t *nent,
                             struct lg_entry *late, size_t *nlate)
{
	const struct lg_opts *o = &s->opts;
	const struct lg_order *od = &s->orders[i];
	double chunk = (double)o->interleave;
	double chunk_base = (double)(i / (size_t)o->interleave) * chunk * lg_slots(s);
	uint32_t seq[LG_ROUTE_MAX];
	unsigned n = od->nmsg;

	lg_shuffle_order(od, o->reorder_window, r, seq);
	lg_nominal(s, seq, n);
	for (unsigned p = 0; p < n; p++) {
		struct lg_msg *m = &s->msgs[seq[p]];
		double key = chunk_base + (double)p * chunk + (double)(i % (size_t)o->interleave);
		ent[(*nent)++] = (struct lg_entry){ key, seq[p], LG_VAR_ORIGINAL, (uint8_t)(1 + m->dup_concurrent) };
		if (m->dup_immediate > 0) {
			double behind = key + 1.0 + lg_unit(r) * LG_IMMEDIATE_SPREAD;
			ent[(*nent)++] = (struct lg_entry){ behind, seq[p], lg_copy_variant(r), 1 };
		}
		if (m->dup_delayed > 0)
			late[(*nlate)++] = (struct lg_entry){ lg_unit(r), seq[p], LG_VAR_DUP_SAME, 1 };
		if (m->conflicts > 0)
			late[(*nlate)++] = (struct lg_entry){ lg_unit(r), seq[p], LG_VAR_CONFLICT, 1 };
	}
}

/* The two phases: keys for every entry, sorted, then laid out in rows.
 * Malformed messages are spread at random over the main phase's span. */
static int lg_build_phases(struct lg_scenario *s, struct lg_rng *r)
{
	const struct lg_opts *o = &s->opts;
	size_t il = (size_t)o->interleave, nent = 0, nlate = 0;
	double span = (double)((s->norders + il - 1) / il) * (double)il * lg_slots(s);
	struct lg_entry *ent = malloc((s->originals + s->copies_immediate + s->malformed + 1) * sizeof *ent);
	struct lg_entry *late = malloc((s->copies_delayed + s->conflict_copies + 1) * sizeof *late);
	int rc = -1;

	if (ent == NULL || late == NULL)
		goto out;
	for (size_t i = 0; i < s->norders; i++)
		lg_order_entries(s, i, r, ent, &nent, late, &nlate);
	for (size_t i = s->originals; i < s->nmsgs; i++)
		ent[nent++] = (struct lg_entry){ lg_unit(r) * (span > 0 ? span : 1.0), (uint32_t)i, LG_VAR_ORIGINAL, 1 };
	qsort(ent, nent, sizeof *ent, lg_entry_cmp);
	qsort(late, nlate, sizeof *late, lg_entry_cmp);
	if (lg_layout(&s->main, ent, nent, o->connections, r) != 0 ||
	    lg_layout(&s->late, late, nlate, o->connections, r) != 0)
		goto out;
	rc = 0;
out:
	free(ent);
	free(late);
	return rc;
}

/* The phases in the order their comments name, each drawing from the one
 * random sequence in turn: the same seed gives the same scenario. */
int lg_scenario_build(struct lg_scenario *s, const struct lg_opts *o)
{
	struct lg_rng r = { o->seed };
	char err[512];
	size_t cap;

	memset(s, 0, sizeof *s);
	s->opts = *o;
	if (o->def == NULL || lg_plan_build(&s->plan, o->def, err, sizeof err) != 0) {
		fprintf(stderr, "inbox-loadgen: cannot plan the %s lifecycle: %s\n", o->def ? o->def->aggregate : "(no)",
		        o->def ? err : "no definition");
		return -1;
	}
	if (lg_prefix(s, o) != 0)
		return -1;
	s->norders = (size_t)o->orders;
	s->orders = calloc(s->norders > 0 ? s->norders : 1, sizeof *s->orders);
	cap = s->norders * (size_t)s->plan.max_len + (size_t)o->malformed + 1;
	s->msgs = calloc(cap, sizeof *s->msgs);
	if (s->orders == NULL || s->msgs == NULL || lg_ce_sources(s) != 0)
		goto fail;
	for (size_t i = 0; i < s->norders; i++)
		if (lg_build_order(s, i, &r) != 0)
			goto fail;
	s->originals = s->nmsgs;
	if (lg_build_malformed(s) != 0)
		goto fail;
	lg_build_dups(s, &r);
	if (lg_build_conflicts(s, &r) != 0 || lg_build_phases(s, &r) != 0)
		goto fail;
	return 0;
fail:
	lg_scenario_free(s);
	return -1;
}

void lg_scenario_free(struct lg_scenario *s)
{
	free(s->orders);
	free(s->msgs);
	free(s->main.slots);
	free(s->late.slots);
	free(s->ce_sources);
	s->ce_sources = NULL;
	s->orders = NULL;
	s->msgs = NULL;
	s->main.slots = NULL;
	s->late.slots = NULL;
}

int lg_msg_number(const struct lg_scenario *s, const struct lg_msg *m)
{
	return m->order >= 0 ? (int)((uint32_t)(m - s->msgs) - s->orders[m->order].first_msg) + 1 : 1;
}

void lg_routing_key(const struct lg_scenario *s, const struct lg_msg *m, char *buf, size_t cap)
{
	if (m->bad == LG_BAD_UNKNOWN_TYPE)
		snprintf(buf, cap, "order.OrderTeleported");
	else
		snprintf(buf, cap, "order.%s", lg_type_name(s, m));
}

/* later: seconds added (a conflict of a lifecycle without data fields). */
static void lg_occurred_at(const struct lg_scenario *s, const struct lg_msg *m, long later, char *buf, size_t cap)
{
	long long t = LG_EPOCH + (m->order >= 0 ? (long long)m->order * 60 : 0) +
	              (long long)(m - s->msgs) % 60 + later;
	time_t tt = (time_t)t;
	struct tm tm;

	if (gmtime_r(&tt, &tm) == NULL || strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
		snprintf(buf, cap, "2027-01-01T00:00:00Z");
}

const unsigned char lg_binary_trace[8] = { 0xff, 0xfe, 0x00, 0x01, 0xc3, 0x28, 0x80, 0xbf };

/* A body written by hand (n from snprintf into buf): a copy, malloc'd. */
static char *lg_body_text(const char *buf, size_t cap, int n, size_t *len)
{
	char *body;

	if (n < 0 || (size_t)n >= cap)
		return NULL;
	body = strdup(buf);
	if (body != NULL)
		*len = (size_t)n;
	return body;
}

/* The bodies jansson cannot write: NULL for every other message. */
static char *lg_body_raw(const struct lg_scenario *s, const struct lg_msg *m, const char *order_id, size_t *len)
{
	char buf[512];

	if (m->bad == LG_BAD_BINARY_HEADER)
		/* Not JSON at all: what matters is the header publish adds, whose
		 * value does not serialise to JSON when the worker copies the
		 * properties into the dead-letter. */
		return lg_body_text(buf, sizeof buf,
		                    snprintf(buf, sizeof buf, "binary-header poison %s: this body is not JSON", m->id), len);
	if (m->bad == LG_BAD_UTF8 && s->opts.envelope == LG_ENV_CE_BINARY)
		return lg_body_text(buf, sizeof buf, snprintf(buf, sizeof buf, "{\"note\":\"caf\xe9 \xff\xfe\"}"), len);
	if (m->bad == LG_BAD_UTF8 && s->opts.envelope == LG_ENV_CE)
		return lg_body_text(buf, sizeof buf,
		                    snprintf(buf, sizeof buf,
		                             "{\"specversion\":\"1.0\",\"id\":\"%s\",\"source\":\"%s\",\"type\":\"%s\","
		                             "\"subject\":\"%s\",\"data\":{\"note\":\"caf\xe9 \xff\xfe\"}}",
		                             m->id, m->source, lg_type_name(s, m), order_id),
		                    len);
	if (m->bad == LG_BAD_UTF8)
		/* jansson cannot build invalid UTF-8, so this one is written by hand. */
		return lg_body_text(buf, sizeof buf,
		                    snprintf(buf, sizeof buf,
		                             "{\"message_id\":\"%s\",\"source\":\"%s\",\"type\":\"%s\","
		                             "\"%s\":\"%s\",\"data\":{\"note\":\"caf\xe9 \xff\xfe\"}}",
		                             m->id, m->source, lg_type_name(s, m), s->plan.def->key, order_id),
		                    len);
	return NULL;
}

/* data.padding: n bytes of 'x' (a body past INBOX_MAX_BODY). */
static int lg_pad(json_t *data, size_t n)
{
	char *pad = malloc(n + 1);
	int rc;

	if (pad == NULL)
		return -1;
	memset(pad, 'x', n);
	pad[n] = '\0';
	rc = json_object_set_new(data, "padding", json_string(pad));
	free(pad);
	return rc;
}

/* A string field's text from the aggregate's draw: hex digits, the ones
 * that vary first, cut at the field's max_length. */
static json_t *lg_field_text(uint64_t draw, int64_t max_length)
{
	char buf[17];
	int n = max_length > 0 && max_length < 16 ? (int)max_length : 16;

	snprintf(buf, sizeof buf, "%016llx", (unsigned long long)draw);
	buf[n] = '\0';
	return json_string(buf);
}

/* An integer field's value in the messages of aggregate order (-1: a
 * malformed message's 4200), within the field's bounds: what the worker
 * reads, and what the ledger tells verify the statements were given. */
static int64_t lg_order_int(const struct lg_scenario *s, int32_t order, int f)
{
	const struct lc_set *set = s->plan.fields[f].set;
	int64_t x = order >= 0 ? s->orders[order].data[f] : 4200;

	return x < set->min || x > set->max ? set->min : x;
}

int lg_scenario_field_text(const struct lg_scenario *s, int32_t order, int f, char *buf, size_t cap)
{
	const struct lc_set *set = s->plan.fields[f].set;
	int n;

	if (set->type == LC_TYPE_INTEGER) {
		n = snprintf(buf, cap, "%lld", (long long)lg_order_int(s, order, f));
	} else if (set->type == LC_TYPE_STRING && order >= 0) {
		json_t *v = lg_field_text((uint64_t)s->orders[order].data[f], set->max_length);

		n = v != NULL ? snprintf(buf, cap, "%s", json_string_value(v)) : -1;
		json_decref(v);
	} else {
		return -1;
	}
	return n >= 0 && (size_t)n < cap ? 0 : -1;
}

/* data: each field of the plan with the aggregate's value (a malformed
 * message: 4200, "x"); a conflict changes the first one. */
static json_t *lg_data(const struct lg_scenario *s, const struct lg_item *it, const char *when)
{
	const struct lg_msg *m = &s->msgs[it->msg];
	bool conflict = it->variant == LG_VAR_CONFLICT;
	json_t *data = json_object();

	for (int f = 0; data != NULL && f < s->plan.nfields; f++) {
		const struct lc_set *set = s->plan.fields[f].set;
		bool change = conflict && f == 0;
		json_t *v = NULL;

		if (m->bad == LG_BAD_MISSING_DATA && f == s->plan.required_field)
			continue;
		if (m->bad == LG_BAD_INVALID_DATA && f == s->plan.data_field) {
			/* the wrong JSON type for the field: a number for a string or
			 * a datetime, a string for an integer */
			v = set->type == LC_TYPE_INTEGER ? json_string("not a number") : json_integer(12345);
		} else if (set->type == LC_TYPE_INTEGER) {
			int64_t x = lg_order_int(s, m->order, f);
			if (change)
				x = x <= set->max - 1 - it->copy ? x + 1 + it->copy : x - 1 - it->copy;
			v = json_integer((json_int_t)x);
		} else if (set->type == LC_TYPE_STRING) {
			uint64_t draw = m->order >= 0 ? (uint64_t)s->orders[m->order].data[f] : 0;
			if (change)
				draw ^= (uint64_t)(it->copy % 7 + 1) << 60;
			v = m->order >= 0 || change ? lg_field_text(draw, set->max_length) : json_string("x");
		} else {
			v = json_string(when);
		}
		if (json_object_set_new(data, set->field, v) != 0) {
			json_decref(data);
			data = NULL;
		}
	}
	/* a definition numbered in its data: the number, an integer */
	if (data != NULL && lc_sequenced(s->plan.def) && !s->plan.def->seq_attr && !s->plan.def->seq_header &&
	    json_object_set_new(data, s->plan.def->seq_field, json_integer(lg_msg_number(s, m))) != 0) {
		json_decref(data);
		data = NULL;
	}
	return data;
}

/* The specversion a message claims: 1.0, or for the class that in our
 * own format is a message-id property against the body's (a CloudEvent
 * has no second place for its id) a version the worker must refuse,
 * invalid-field as well. */
static const char *lg_ce_specversion(const struct lg_msg *m)
{
	return m->bad == LG_BAD_ID_MISMATCH ? "0.3" : "1.0";
}

/* A structured-mode CloudEvent of m: the mapped attributes (SPEC.md,
 * Envelopes) and the data; the order id as the subject, left out for the
 * class without one. */
static json_t *lg_ce_event(const struct lg_scenario *s, const struct lg_msg *m, const char *type,
                           const char *order_id, const char *when, json_t *data)
{
	json_t *ce = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:O}", "specversion", lg_ce_specversion(m), "id", m->id,
	                       "source", m->source, "type", type, "time", when, "datacontenttype", "application/json",
	                       "data", data);

	(void)s;
	if (ce != NULL && m->bad != LG_BAD_MISSING && json_object_set_new(ce, "subject", json_string(order_id)) != 0) {
		json_decref(ce);
		ce = NULL;
	}
	/* CloudEvents' sequence extension is a string */
	if (ce != NULL && s->plan.def->seq_attr &&
	    json_object_set_new(ce, "sequence", json_sprintf("%d", lg_msg_number(s, m))) != 0) {
		json_decref(ce);
		ce = NULL;
	}
	return ce;
}

int lg_ce_headers(const struct lg_scenario *s, const struct lg_item *it, struct mq_header *h, int cap,
                  struct lg_ce_vals *vals)
{
	const struct lg_msg *m = &s->msgs[it->msg];
	const struct lc_def *d = s->plan.def;
	int n = 0;

	if (cap < LG_CE_HEADERS)
		return -1;
	snprintf(vals->seq, sizeof vals->seq, "%d", lg_msg_number(s, m));
	if (d->seq_header)
		h[n++] = (struct mq_header){ d->seq_field, vals->seq };
	if (s->opts.envelope != LG_ENV_CE_BINARY)
		return n;
	lg_occurred_at(s, m, it->variant == LG_VAR_CONFLICT && s->plan.nfields == 0 ? 1 + it->copy : 0, vals->time,
	               sizeof vals->time);
	if (m->bad == LG_BAD_INVALID)
		snprintf(vals->subject, sizeof vals->subject, "not a valid id!");
	else if (m->order >= 0)
		snprintf(vals->subject, sizeof vals->subject, "%s", s->orders[m->order].id);
	else
		lg_own_aggregate(m, vals->subject, sizeof vals->subject);
	h[n++] = (struct mq_header){ "cloudEvents:specversion", lg_ce_specversion(m) };
	h[n++] = (struct mq_header){ "cloudEvents:id", m->id };
	h[n++] = (struct mq_header){ "cloudEvents:source", m->source };
	h[n++] = (struct mq_header){ "cloudEvents:type",
		                     m->bad == LG_BAD_UNKNOWN_TYPE ? "OrderTeleported" : lg_type_name(s, m) };
	h[n++] = (struct mq_header){ "cloudEvents:time", vals->time };
	if (m->bad != LG_BAD_MISSING)
		h[n++] = (struct mq_header){ "cloudEvents:subject", vals->subject };
	if (d->seq_attr)
		h[n++] = (struct mq_header){ "cloudEvents:sequence", vals->seq };
	return n;
}

char *lg_body(const struct lg_scenario *s, const struct lg_item *it, size_t *len)
{
	const struct lg_msg *m = &s->msgs[it->msg];
	char own[LG_ID_MAX + 1];
	const char *order_id = m->order >= 0 ? s->orders[m->order].id : lg_own_aggregate(m, own, sizeof own);
	const char *type = lg_type_name(s, m);
	char when[32], other[LG_ID_MAX + 8];
	size_t flags = JSON_COMPACT;
	json_t *o, *data;
	char *body = NULL;

	if (m->bad == LG_BAD_BINARY_HEADER || m->bad == LG_BAD_UTF8)
		return lg_body_raw(s, m, order_id, len);
	if (it->variant == LG_VAR_DUP_RESHAPED)
		flags = JSON_INDENT(2) | JSON_SORT_KEYS;
	lg_occurred_at(s, m, it->variant == LG_VAR_CONFLICT && s->plan.nfields == 0 ? 1 + it->copy : 0, when,
	               sizeof when);
	if (m->bad == LG_BAD_INVALID)
		order_id = "not a valid id!";
	if (m->bad == LG_BAD_UNKNOWN_TYPE)
		type = "OrderTeleported";
	snprintf(other, sizeof other, "%s-other", m->id);
	o = json_pack("{s:s, s:s, s:s}", "message_id", m->bad == LG_BAD_ID_MISMATCH ? other : m->id,
	              "source", m->source, "type", type);
	data = lg_data(s, it, when);
	if (o == NULL || data == NULL)
		goto out;
	if (m->bad != LG_BAD_MISSING && json_object_set_new(o, s->plan.def->key, json_string(order_id)) != 0)
		goto out;
	if (json_object_set_new(o, "occurred_at", json_string(when)) != 0)
		goto out;
	/* a native message says the sequence attribute at the top (msg.c) */
	if (s->plan.def->seq_attr && json_object_set_new(o, "sequence", json_integer(lg_msg_number(s, m))) != 0)
		goto out;
	if (m->bad == LG_BAD_TOO_LARGE && lg_pad(data, (size_t)s->opts.max_body + 64) != 0)
		goto out;
	if (json_object_set(o, "data", data) != 0)
		goto out;
	if (s->opts.envelope != LG_ENV_NATIVE) {
		/* The same event as a CloudEvent: structured, the attributes
		 * and the data in the body; binary, the data alone (the
		 * attributes are headers, lg_ce_headers). */
		json_t *ce = s->opts.envelope == LG_ENV_CE_BINARY ? json_incref(data) : lg_ce_event(s, m, type, order_id,
		                                                                                       when, data);
		json_decref(o);
		o = ce;
		if (o == NULL)
			goto out;
	}
	body = json_dumps(o, flags);
	if (body == NULL)
		goto out;
	if (m->bad == LG_BAD_JSON)
		body[strlen(body) / 2] = '\0';
	*len = strlen(body);
out:
	json_decref(data);
	json_decref(o);
	return body;
}

/* The run line's tail naming the definition (--lifecycle only: without
 * it the ledger stays as it always was): the file as JSON, the names from
 * the definition, [a-z][a-z0-9_]* (lc_load checks them). */
static int lg_ledger_lifecycle(const struct lg_scenario *s, FILE *f)
{
	const struct lc_def *d = s->plan.def;
	json_t *name;
	char *file;
	int rc;

	if (s->opts.lifecycle == NULL)
		return fputs("}\n", f) < 0 ? -1 : 0;
	name = json_string(s->opts.lifecycle);
	file = name != NULL ? json_dumps(name, JSON_ENCODE_ANY) : NULL;
	json_decref(name);
	if (file == NULL)
		return -1;
	rc = fprintf(f, ",\"lifecycle\":{\"file\":%s,\"aggregate\":\"%s\",\"table\":\"%s\",\"key\":\"%s\"}}\n", file,
	             d->aggregate, d->table, d->key) < 0 ? -1 : 0;
	free(file);
	return rc;
}

/* An order line's tail for a definition with statements of its own (none:
 * the line stays as it was): its route (plan.h, the index verify folds it
 * by) and the values its messages carry in each integer and string field,
 * which verify expects the statements' rows and sums to hold. */
static int lg_ledger_fields(const struct lg_scenario *s, int32_t i, FILE *f)
{
	const struct lg_order *od = &s->orders[i];
	int n = 0;

	if (s->plan.def->nstmts == 0)
		return 0;
	if (fprintf(f, ",\"route\":%d,\"data\":{", od->route) < 0)
		return -1;
	for (int k = 0; k < s->plan.nfields; k++) {
		const struct lc_set *set = s->plan.fields[k].set;
		int rc = 0;

		/* field names are [a-z][a-z0-9_]* (lc_load), texts hex digits */
		if (set->type == LC_TYPE_INTEGER) {
			rc = fprintf(f, "%s\"%s\":%lld", n++ ? "," : "", set->field, (long long)lg_order_int(s, i, k));
		} else if (set->type == LC_TYPE_STRING) {
			json_t *v = lg_field_text((uint64_t)od->data[k], set->max_length);

			rc = v == NULL ? -1 : fprintf(f, "%s\"%s\":\"%s\"", n++ ? "," : "", set->field, json_string_value(v));
			json_decref(v);
		}
		if (rc < 0)
			return -1;
	}
	return fputs("}", f) < 0 ? -1 : 0;
}

/* A numbered definition's order line lists each emitted event with the
 * number of its cause, which its id ends with: "emitted":[["Kind",3],...]
 * (a kind a loop emits twice is there twice). */
static int lg_ledger_emitted(const struct lg_scenario *s, const struct lg_order *od, FILE *f)
{
	const struct lg_route *rt = &s->plan.routes[od->route];

	if (!lc_sequenced(s->plan.def))
		return 0;
	if (fputs(",\"emitted\":[", f) < 0)
		return -1;
	for (int k = 0; k < rt->ninst; k++) {
		char label[2 * LC_NAME_MAX + 2];

		if (lc_emit_label(s->plan.def, rt->inst_kind[k], label, sizeof label) < 0 ||
		    fprintf(f, "%s[\"%s\",%d]", k ? "," : "", label, rt->inst_num[k]) < 0)
			return -1;
	}
	return fputs("]", f) < 0 ? -1 : 0;
}

int lg_ledger_write(const struct lg_scenario *s, FILE *f, const char *consumer, const char *queue,
                    const char *dlq, const char *verify_queue)
{
	const struct lg_opts *o = &s->opts;
	size_t total = s->main.items + s->late.items;

	/* Every string written here is from our id alphabet, a fixed name, or
	 * a CloudEvents id or source of lg_ce_keys (letters, digits, "-", "/",
	 * ":", "."), so no JSON escaping is needed. */
	if (fprintf(f,
	            "{\"k\":\"run\",\"prefix\":\"%s\",\"seed\":%llu,\"consumer\":\"%s\",\"queue\":\"%s\","
	            "\"dlq\":\"%s\",\"verify_queue\":\"%s\",\"orders\":%zu,\"messages\":%zu,\"published\":%zu,"
	            "\"originals\":%zu,\"copies_immediate\":%zu,\"copies_concurrent\":%zu,\"copies_delayed\":%zu,"
	            "\"conflicts\":%zu,\"malformed\":%zu,\"reorder_window\":%d,\"connections\":%d,\"envelope\":\"%s\"",
	            s->prefix, (unsigned long long)o->seed, consumer, queue, dlq, verify_queue, s->norders,
	            s->nmsgs, total, s->originals, s->copies_immediate, s->copies_concurrent, s->copies_delayed,
	            s->conflict_copies, s->malformed, o->reorder_window, o->connections,
	            lg_envelope_names[o->envelope]) < 0 ||
	    lg_ledger_lifecycle(s, f) != 0)
		return -1;
	for (size_t i = 0; i < s->norders; i++) {
		const struct lg_order *od = &s->orders[i];
		if (fprintf(f, "{\"k\":\"order\",\"id\":\"%s\",\"status\":\"%s\",\"version\":%u,\"emits\":[",
		            od->id, s->plan.def->states[od->final_state], od->final_version) < 0)
			return -1;
		for (int k = 0, n = 0; k < s->plan.def->nemits; k++) {
			int e = s->plan.emit_order[k];
			char label[2 * LC_NAME_MAX + 2];

			if (!(od->emits & (1u << e)))
				continue;
			if (lc_emit_label(s->plan.def, e, label, sizeof label) < 0 ||
			    fprintf(f, "%s\"%s\"", n++ ? "," : "", label) < 0)
				return -1;
		}
		if (fputs("]", f) < 0 || lg_ledger_emitted(s, od, f) != 0 || lg_ledger_fields(s, (int32_t)i, f) != 0 ||
		    fputs("}\n", f) < 0)
			return -1;
	}
	for (size_t i = 0; i < s->nmsgs; i++) {
		const struct lg_msg *m = &s->msgs[i];
		char hex[65] = "";

		if (m->conflicts > 0)
			msg_sha256_hex(m->sha256, hex);
		if (fprintf(f,
		            "{\"k\":\"msg\",\"id\":\"%s\",\"source\":\"%s\",\"order\":\"%s\",\"type\":\"%s\","
		            "\"expect\":\"%s\",\"reason\":\"%s\",\"nominal\":\"%s\",\"class\":\"%s\",\"copies\":%u,"
		            "\"concurrent\":%u,\"delayed\":%u,\"conflicts\":%u,\"sha256\":\"%s\"}\n",
		            m->id, m->source, m->order >= 0 ? s->orders[m->order].id : "",
		            lg_type_name(s, m),
		            m->expect == LG_EXPECT_EFFECT ? "effect" : "dead_lettered", msg_reason_name(m->reason),
		            m->nominal != NULL ? m->nominal : "", lg_bad_names[m->bad],
		            1u + m->dup_immediate + m->dup_concurrent + m->dup_delayed, m->dup_concurrent,
		            m->dup_delayed, m->conflicts, hex) < 0)
			return -1;
	}
	return fflush(f) == 0 && !ferror(f) ? 0 : -1;
}
