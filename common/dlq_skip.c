/*
 * dlq_skip.c - the operator's skip of a number an aggregate waits at (see
 * dlq_skip.h).
 */
#include "dlq_skip.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aggregate.h"
#include "envelope.h"
#include "lifecycle.h"
#include "log.h"
#include "status.h"

/* A transaction that lost a deadlock or a lock wait to a worker's is run
 * again, as the worker runs its own; this many times at most. */
#define DLQ_SKIP_ATTEMPTS 8

/* Whether e's aggregate waits at e's number and its key is free to claim
 * (never recorded, or recorded as this very payload dead-lettered); else
 * why not.  ST_OK or a database error. */
static int dlq_skip_due(struct dlq_judge *j, const struct dlq_entry *e, bool *due, char *why, size_t cap)
{
	const struct lc_def *def = agg_current()->def;
	struct dlq_judge_order_row ord;
	struct dlq_judge_inbox_row in;
	char sha[65];
	int rc;

	*due = false;
	if (!lc_sequenced(def)) {
		snprintf(why, cap, "the %s definition is ordered by its states, not numbered: nothing waits for this "
		         "letter (dlq purge removes it)", def->aggregate);
		return ST_OK;
	}
	if (e->parse != MSG_REASON_NONE) {
		snprintf(why, cap, "it does not parse (%s: %s): it has no number to skip", msg_reason_name(e->parse),
		         e->m.detail);
		return ST_OK;
	}
	rc = dlq_judge_order_lookup(j, e->m.order_id, &ord);
	if (rc == ST_OK)
		rc = dlq_judge_inbox_lookup(j, &e->m, &in);
	if (rc != ST_OK)
		return rc;
	msg_sha256_hex(e->m.sha256, sha);
	if (!ord.found)
		snprintf(why, cap, "%s %s does not exist: its number 1 is what comes first", def->aggregate,
		         e->m.order_id);
	else if (e->m.seq <= ord.version)
		snprintf(why, cap, "number %lld of %s %s was taken (it is at %lld): nothing waits for this letter",
		         (long long)e->m.seq, def->aggregate, e->m.order_id, (long long)ord.version);
	else if (e->m.seq > ord.version + 1)
		snprintf(why, cap, "number %lld waits for number %lld (%s %s is at %lld): skip that one first",
		         (long long)e->m.seq, (long long)(ord.version + 1), def->aggregate, e->m.order_id,
		         (long long)ord.version);
	else if (in.found && (strcmp(in.outcome, "dead_lettered") != 0 || strcmp(in.sha, sha) != 0))
		snprintf(why, cap, "the inbox recorded this key as %s%s: it is not this letter's to skip", in.outcome,
		         strcmp(in.sha, sha) != 0 ? " with another payload" : "");
	else
		*due = true;
	return ST_OK;
}

/* The letter as a delivery to the inbox, told to skip it; one
 * transaction, run again when a worker's won a lock from it. */
static int dlq_skip_run(struct dlq_skip *s, struct dlq_judge *j, const struct mq_delivery *d,
                        struct inbox_result *res)
{
	struct env_delivery env;
	struct env_context ctx;
	struct msg m;
	char *event = NULL;
	int rc;

	/* Read again for what only the envelope layer keeps (the canonical
	 * event, the trace context): held, as a skipped letter never is
	 * while its number is due, it would need them. */
	mq_delivery_envelope(d, &env);
	if (env_parse(j->conf, &env, (size_t)j->conf->max_body, &m, &ctx, &event) != MSG_REASON_NONE)
		return ST_ERR_INVALID; /* dlq_skip_due saw it parse */
	if (s->ib == NULL) {
		rc = inbox_open(&s->ib, j->db, j->conf);
		if (rc != ST_OK)
			goto cleanup;
	}
	{
		struct inbox_in in = {
			.msg = &m, .body = d->body, .len = d->len, .routing_key = d->routing_key,
			.ctx = &ctx, .event = event, .skip = true,
		};

		for (int attempt = 1;; attempt++) {
			memset(res, 0, sizeof *res);
			rc = inbox_run(s->ib, &in, 1, res);
			if ((rc != ST_ERR_DB_DEADLOCK && rc != ST_ERR_DB_LOCK_TIMEOUT) || attempt == DLQ_SKIP_ATTEMPTS)
				break;
		}
	}
cleanup:
	free(event);
	return rc;
}

int dlq_skip_entry(struct dlq_skip *s, struct dlq_judge *j, const struct mq_delivery *d,
                   const struct dlq_entry *e, bool dry_run, bool *skipped, char *why, size_t cap)
{
	const struct lc_def *def = agg_current()->def;
	struct inbox_result res;
	bool due;
	int rc;

	*skipped = false;
	rc = dlq_skip_due(j, e, &due, why, cap);
	if (rc != ST_OK || !due)
		return rc;
	if (dry_run) {
		*skipped = true;
		snprintf(why, cap, "would skip: number %lld of %s %s taken without its effect, the numbers held behind it "
		         "released", (long long)e->m.seq, def->aggregate, e->m.order_id);
		return ST_OK;
	}
	rc = dlq_judge_reopen(j, e);
	if (rc == ST_OK)
		rc = dlq_skip_run(s, j, d, &res);
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_ERROR, "cannot skip; the dead letter stays", LOG_S("msg", e->message_id),
		    LOG_S("error", st_strerror(rc)), LOG_S("db", dlq_judge_errmsg(j)));
		return rc;
	}
	if (res.outcome != INBOX_IGNORED) {
		/* claimed by another since the look (a copy, another skip) */
		snprintf(why, cap, "the inbox took it as %s meanwhile%s%s", inbox_outcome_name(res.outcome),
		         res.detail[0] ? ": " : "", res.detail);
		*skipped = res.outcome == INBOX_DUPLICATE;
		return ST_OK;
	}
	*skipped = true;
	snprintf(why, cap, "number %lld of %s %s taken without its effect; %d held behind it released", (long long)e->m.seq,
	         def->aggregate, e->m.order_id, res.released);
	return ST_OK;
}

void dlq_skip_close(struct dlq_skip *s)
{
	inbox_close(&s->ib);
}
