/*
 * verify_judge.c - the judge of inbox-loadgen verify: the ledger's
 * expectations against what the readers found, and the report's figures.
 */
#include "verify_judge.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lifecycle_emit.h"

static int v_cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

/* Each message and order against the ledger. */
static void v_judge_rows(struct v_state *st, long *effects_expected, long *effects_found, long *dead_expected,
                         long *emits_expected)
{
	const char *events = st->tables[1];

	for (size_t i = 0; i < st->nmsgs; i++) {
		struct v_msg *m = &st->msgs[i];
		bool malformed = m->order[0] == '\0';

		if (m->effect) {
			(*effects_expected)++;
			if (m->events == 1)
				(*effects_found)++;
			if (m->events == 0)
				st->miss_effects++;
			if (m->events == 0)
				v_add(&st->missing, "%s: no %s row%s", m->id, events,
				      !m->row ? " and no inbox row" : strcmp(m->got_outcome, "held") == 0 ? " (still held)" : "");
			else if (m->events > 1) {
				char n[24];
				snprintf(n, sizeof n, "%lld", (long long)m->events);
				v_add(&st->doubled, "%s: %s %s rows", m->id, n, events);
			}
			if (m->row && m->events >= 1 && strcmp(m->got_outcome, "applied") != 0 &&
			    strcmp(m->got_outcome, "compensated") != 0)
				v_add(&st->wrong, "%s: outcome %s, expected applied or compensated", m->id, m->got_outcome);
		} else {
			(*dead_expected)++;
			if (m->dlq_hits == 0) {
				st->miss_dead++;
				if (m->bare_hits > 0)
					st->miss_dead_bare++;
				v_add(&st->missing, "%s: no dead-letter with reason %s%s", m->id, m->reason,
				      m->bare_hits > 0 ? " (a copy without x-inbox-reason came: the delivery limit)" : "");
			}
			if (m->events > 0)
				v_add(&st->doubled, "%s: has an %s row but must be dead-lettered (%s)", m->id, events, m->reason);
			if (malformed && m->row)
				v_add(&st->wrong, "%s: malformed message has an inbox row (%s)", m->id, m->got_outcome);
			if (!malformed && m->row && strcmp(m->got_outcome, "dead_lettered") != 0)
				v_add(&st->wrong, "%s: outcome %s, expected dead_lettered", m->id, m->got_outcome);
		}
		if (m->conflicts > 0) {
			if (m->conflict_hits < m->conflicts)
				st->miss_conflicts++;
			if (m->conflict_hits < m->conflicts)
				v_add(&st->missing, "%s: conflicting payload not dead-lettered as %s", m->id, "payload-conflict");
			if (m->row && strcmp(m->got_sha, m->sha) != 0)
				v_add(&st->wrong, "%s: stored payload hash is not the original's (the conflict won)%s", m->id, "");
		}
	}
	for (size_t i = 0; i < st->norders; i++) {
		struct v_order *o = &st->orders[i];
		if (!o->found) {
			st->miss_orders++;
			v_add(&st->missing, "%s: no %s row (expected %s)", o->id, st->def->aggregate, o->status);
		} else if (strcmp(o->got_status, o->status) != 0 || o->got_version != (int64_t)o->version) {
			char exp[64];
			snprintf(exp, sizeof exp, "%s v%u, found %s v%lld", o->status, o->version, o->got_status,
			         (long long)o->got_version);
			v_add(&st->wrong, "%s: expected %s", o->id, exp);
		}
		/* A numbered definition's, one by one with their numbers */
		for (int j = 0; j < o->ninst; j++) {
			char label[2 * LC_NAME_MAX + 2];

			(*emits_expected)++;
			if (o->seen_inst & (1u << j))
				continue;
			st->miss_emits++;
			(void)lc_emit_label(st->def, o->inst_kind[j], label, sizeof label);
			v_add(&st->missing, "%s: %s (cause number %d) not emitted", o->id, label, o->inst_num[j]);
		}
		/* In the ledger's order (SPEC's for orders). */
		for (int k = 0; !lc_sequenced(st->def) && k < st->def->nemits; k++) {
			int b = st->plan.emit_order[k];
			if (!(o->emits & (1u << b)))
				continue;
			(*emits_expected)++;
			if (!(o->seen & (1u << b)))
				st->miss_emits++;
			if (!(o->seen & (1u << b))) {
				char label[2 * LC_NAME_MAX + 2];

				(void)lc_emit_label(st->def, b, label, sizeof label);
				v_add(&st->missing, "%s: %s not emitted", o->id, label);
			}
		}
	}
}

void v_judge(struct v_state *st, struct v_figures *f)
{
	memset(f, 0, sizeof *f);
	v_judge_rows(st, &f->eff_exp, &f->eff_found, &f->dead_exp, &f->emit_exp);
	for (size_t i = 0; i < st->nmsgs; i++)
		f->dead_seen += st->msgs[i].dlq_hits > 0 ? 1 : 0;
	for (size_t i = 0; i < st->norders; i++)
		f->emits_seen += __builtin_popcount(st->orders[i].seen) + __builtin_popcount(st->orders[i].seen_inst);
	{
		long long copies = (long long)json_integer_value(json_object_get(st->run, "copies_immediate")) +
		                   (long long)json_integer_value(json_object_get(st->run, "copies_concurrent")) +
		                   (long long)json_integer_value(json_object_get(st->run, "copies_delayed"));
		/* A copy is absorbed when its message has its inbox row (the
		 * key it found taken) and it made no second effect: counted
		 * from the rows, so a message that went missing absorbed
		 * nothing. */
		f->dups_published = copies;
		for (size_t i = 0; i < st->nmsgs; i++) {
			const struct v_msg *m = &st->msgs[i];
			long long extra = m->events > 1 ? m->events - 1 : 0;
			if (m->row && m->copies > 1 + extra)
				f->dups_absorbed += m->copies - 1 - extra;
		}
	}
	if (st->nlat > 0 && st->last_done > st->first_pub) {
		for (int i = 0; i < 5; i++)
			f->rows += (size_t)st->outcome_count[i];
		qsort(st->lat, st->nlat, sizeof *st->lat, v_cmp_i64);
		f->span = (double)(st->last_done - st->first_pub) / 1e6;
		f->tput = (double)f->rows / f->span;
		f->p50 = (double)st->lat[st->nlat / 2] / 1e3;
		f->p99 = (double)st->lat[(st->nlat * 99) / 100] / 1e3;
		f->pmax = (double)st->lat[st->nlat - 1] / 1e3;
	}
}
