/*
 * verify_ledger.h - the ledger of inbox-loadgen verify, read into memory,
 * and the state every step of verify fills in: what the ledger expects of
 * each message and order (read by v_load), next to what the readers found
 * (verify_read.c), for the judge (verify_judge.c) to compare.
 *
 * The ledger's lines (JSON, one object a line, "k" says which):
 *   run       the run: prefix, counts, queues, the lifecycle it was planned from;
 *   order     one per aggregate: id, status, version, emits; for a
 *             definition with statements also "route" (its index among
 *             plan.h's routes) and "data" (each integer and string field's
 *             value in its messages, a JSON number or string);
 *   msg       one per message, its aggregate's in canonical order;
 *   stmt      one per addition publish took a baseline of (snapshot.h):
 *             "stmt" (its index in def->stmts), "event", "after",
 *             "index", "table", "column", "key", so that verify refuses a
 *             ledger of other statements;
 *   sum       one per key of a stmt line: "stmt", "key" (text), "rows"
 *             and "sum" (text): the key's rows and their sum before the run.
 * A line of an unknown k is skipped.
 *
 * Ownership: struct v_state is the caller's; v_load allocates its orders,
 * msgs, maps, run line and fx, which lg_verify releases (v_state_free).
 */
#ifndef INBOX_LG_VERIFY_LEDGER_H
#define INBOX_LG_VERIFY_LEDGER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "db.h"
#include "lifecycle_schema.h"
#include "plan.h"
#include "scenario.h"

#define V_REASON_MAX 40
#define V_DEAD_REASONS 16
/* Emitted message kinds, the bits of v_order.emits / .seen, are the
 * indexes of the definition's emits (def->emits). */

struct v_order {
	char id[LG_ID_MAX];
	/* For a definition with statements: the route it was planned on
	 * (-1: the ledger does not say) and its messages, msgs[first_msg ..
	 * first_msg + nmsg) in canonical order (apart: they were not listed
	 * together, and cannot be folded). */
	int route;
	uint32_t first_msg, nmsg;
	bool apart;
	char status[24];
	unsigned version;
	uint32_t emits;      /* expected: bits into def->emits */
	uint32_t seen;       /* emitted messages seen */
	/* A numbered definition's (lc_sequenced) emitted events one by one,
	 * from the ledger's "emitted": kind (a bit of emits) and the number
	 * of its cause, which its id ends with; seen_inst: bits into them. */
	uint8_t inst_kind[LG_INST_MAX], inst_num[LG_INST_MAX];
	int ninst;
	uint32_t seen_inst;
	bool found;
	char got_status[24];
	int64_t got_version;
};

struct v_msg {
	char id[LG_ID_MAX];
	char order[LG_ID_MAX];
	bool effect;
	char reason[V_REASON_MAX];
	int conflicts;
	int copies;         /* deliveries published: 1 + its duplicate copies */
	char sha[65];
	bool row;
	char got_outcome[20];
	char got_reason[V_REASON_MAX];
	char got_sha[65];
	int64_t events;
	int dlq_hits;       /* DLQ copies with the expected reason */
	int conflict_hits;  /* DLQ copies marked payload-conflict */
	int bare_hits;      /* DLQ copies without x-inbox-reason (the broker's delivery limit) */
};

/* Open addressing from an id to an index; ids are unique per kind. */
struct v_map {
	uint32_t *slot; /* index + 1, 0 = empty */
	size_t cap;
};

/* A list of problems: counted in full, the first `max` kept for the report. */
struct v_list {
	const char *title;
	long count;
	int max;
	char (*lines)[200];
};

struct v_state {
	const struct cfg *conf;
	const struct lc_def *def;     /* the lifecycle (verify's --lifecycle) */
	const char *lifecycle;        /* its file, or NULL: the built-in order lifecycle */
	struct lg_plan plan;          /* for the order emits are listed in */
	char tables[LC_SCHEMA_TABLES][LC_NAME_MAX + 16]; /* the aggregate's table, ledger, locks */
	char prefix[LG_PREFIX_MAX];
	char like[LG_PREFIX_MAX + 4];
	char verify_queue[300];
	struct v_order *orders;
	size_t norders;
	struct v_msg *msgs;
	size_t nmsgs;
	struct v_map omap, mmap;
	json_t *run;
	struct v_list missing, doubled, wrong, unexpected;
	long foreign;       /* queue messages of other runs (left in place, ignored) */
	struct {
		char reason[V_REASON_MAX];
		long n;
	} dead_by_reason[V_DEAD_REASONS]; /* the run's DLQ copies by x-inbox-reason */
	int ndead_reasons;
	long republished;   /* emitted messages seen more than once under their stable id (allowed) */
	long wrong_ids;     /* emitted messages without their stable id (in the WRONG list too) */
	/* v_wait_idle's look at the DLQ, per message: copies with the reason
	 * the ledger expects, and payload-conflict copies (calloc'd there). */
	int *probe_dead, *probe_conflicts;
	/* The missing list by kind, for the report's totals. */
	long miss_effects, miss_dead, miss_dead_bare, miss_conflicts, miss_orders, miss_emits;
	long outcome_count[6];
	/* Rows with held_at: events that waited.  By what became of them:
	 * released into an outcome (v_outcomes index 0..3), expired, still
	 * held. */
	long held_total, held_released[4], held_expired, held_still;
	int64_t *lat;       /* publish -> commit, microseconds */
	size_t nlat;
	int64_t first_pub, last_done;
	struct db *db;
	/* What the definition's own statements wrote (verify_effects.h):
	 * allocated by v_load, released by v_state_free. */
	struct v_fx *fx;
};

/* Find key (len bytes); name(arr, i) gives entry i's id.  Returns the index
 * or -1; with insert >= 0 stores that index when absent. */
long v_map_find(struct v_map *m, const char *key, size_t len, const char *(*name)(const void *, uint32_t),
                const void *arr, long insert);
const char *v_order_name(const void *arr, uint32_t i);
const char *v_msg_name(const void *arr, uint32_t i);

/* Append a problem to l (counted always, kept while under l->max). */
__attribute__((format(printf, 2, 3)))
void v_add(struct v_list *l, const char *fmt, ...);

/* The bit of an emitted kind by its label (lc_emit_label: the type, or
 * "<type>:<cause>"; its index in def->emits); 0 when the definition does
 * not emit it. */
uint32_t v_emit_bit(const struct v_state *st, const char *label);
/* Copy a JSON string (or "" for anything else) into dst. */
void v_copy(char *dst, size_t cap, json_t *v);
/* Whether id (len bytes) belongs to this run (starts with its prefix). */
bool v_ours(const struct v_state *st, const char *id, size_t len);

/* Read the ledger at path into st (st->def set: the ledger's run line
 * must name the same lifecycle, or none for the order's).  Returns 0, or
 * -1 with a message on stderr. */
int v_load(struct v_state *st, const char *path);
/* Release what v_load and the readers allocated (not the lists' lines). */
void v_state_free(struct v_state *st);

#endif
