/*
 * cmd_dlq.c - `inbox-worker dlq list | show | replay | purge` (see
 * cmd_dlq.h).
 *
 * Every subcommand walks the queue the same way (dlq_walk): the message
 * count from a passive declare, then one consumer whose prefetch window is
 * that count, reading exactly that many deliveries, in queue order, and
 * settling only what the subcommand means to remove.  The window is why a
 * browse never needs to ack, reject or requeue a message one by one (each
 * of which moves it or, on a quorum queue, counts a delivery): what is not
 * acked goes back when the connection closes, in its place.  Messages
 * that arrive while a walk runs are behind the counted ones and are not
 * visited, so a replayed message that the worker dead-letters again at
 * once is not taken a second time by the same run.
 *
 * What a dead letter says is read by common/dlq_entry.c; what replaying
 * it would do is asked of the database by common/dlq_judge.c.  This file
 * is the command: the walk, and what each subcommand does with an entry.
 */
#include "cmd_dlq.h"

#include <jansson.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "array.h"
#include "cmd.h"
#include "deadletter.h"
#include "outbox.h"
#include "dlq_entry.h"
#include "dlq_judge.h"
#include "dlq_skip.h"
#include "envelope.h"
#include "fault.h"
#include "lifecycle.h"
#include "log.h"
#include "mq.h"
#include "msg.h"
#include "aggregate.h"
#include "preflight.h"
#include "status.h"

/* The broker delivers at most this many unacked messages to one consumer
 * (basic.qos takes 16 bits): a longer queue is read up to here. */
#define DLQ_WINDOW_MAX 65535
/* How long a walk waits for the next counted message before it concludes
 * that another consumer holds the rest. */
#define DLQ_WAIT_MS 5000
#define DLQ_CONFIRM_MS 30000

struct dlq_run {
	const struct cfg *conf;
	const struct dlq_opts *o;
	FILE *out;
	struct mq *mq;      /* the consumer of the walk */
	struct mq *pub;     /* replay: confirmed publishes */
	struct dlq_judge judge; /* show, replay, skip: the database (dlq_judge.h) */
	struct dlq_skip skip;   /* skip: its inbox on the judge's connection */
	uint32_t in_queue;  /* messages ready when the walk began */
	long read, shown, chosen, acted;
	long by_verdict[DLQ_JUDGE_COUNT];
	json_t *by_reason;  /* reason -> count of what was shown/chosen */
	json_t *list;       /* list --json: the entries */
	json_t *replayed;   /* replay: what this run sent, "source\x1fid" -> [sha256, position] */
	long unroutable;    /* replay: copies the broker returned or refused, their dead letters left */
	bool stop;          /* replay --limit reached */
	bool counted;       /* the DLQ counts deliveries: a quorum queue */
	int failed;         /* st_code of a failure that ended the walk */
};

/* A repeatable option (--reason, --id): any of its n values, or anything
 * when it was not given. */
static bool dlq_any_of(const char *const *values, int n, const char *v)
{
	for (int i = 0; i < n; i++)
		if (strcmp(values[i], v) == 0)
			return true;
	return n == 0;
}

static bool dlq_matches(const struct dlq_opts *o, const struct dlq_entry *e, int64_t now)
{
	if (!dlq_any_of(o->reasons, o->nreasons, e->reason) || !dlq_any_of(o->ids, o->nids, e->message_id))
		return false;
	if (o->order_id != NULL && strcmp(o->order_id, e->order_id) != 0)
		return false;
	/* A dead letter that does not say when is not known to be recent. */
	if (o->since_s > 0 && (e->at_s == 0 || e->at_s < now - o->since_s))
		return false;
	return true;
}

static int dlq_count_reason(struct dlq_run *r, const char *reason)
{
	json_t *v = json_object_get(r->by_reason, reason);

	return json_object_set_new(r->by_reason, reason, json_integer(json_is_integer(v) ? json_integer_value(v) + 1 : 1)) == 0
	               ? ST_OK
	               : ST_ERR_NOMEM;
}

/* Whether a replay or purge acts on e: it matches the options.  A chosen
 * one is counted, in all and by its reason.  ST_OK, or ST_ERR_NOMEM. */
static int dlq_choose(struct dlq_run *r, const struct dlq_entry *e, bool *chosen)
{
	*chosen = dlq_matches(r->o, e, (int64_t)time(NULL));
	if (!*chosen)
		return ST_OK;
	r->chosen++;
	return dlq_count_reason(r, e->reason);
}

static void dlq_print_by_reason(struct dlq_run *r, const char *what)
{
	const char *k;
	json_t *v;
	bool first = true;

	fprintf(r->out, "%s:", what);
	json_object_foreach(r->by_reason, k, v) {
		fprintf(r->out, "%s %s %lld", first ? "" : ",", k, (long long)json_integer_value(v));
		first = false;
	}
	fprintf(r->out, "%s\n", first ? " none" : "");
}

/* ---- the walk ------------------------------------------------------------ */

typedef int (*dlq_visit_fn)(struct dlq_run *r, const struct mq_delivery *d, struct dlq_entry *e);

/* Read the messages that are in the queue now, in order, handing each to
 * visit; nothing is settled here.  The caller closes r->mq afterwards,
 * which returns whatever was not acked. */
static int dlq_walk(struct dlq_run *r, dlq_visit_fn visit)
{
	int rc;
	uint32_t window;

	rc = mq_queue_counts(r->mq, r->conf->dlq, &r->in_queue, NULL);
	if (rc == ST_ERR_NOT_FOUND) {
		LOG(LOG_LEVEL_ERROR, "the dead-letter queue does not exist", LOG_S("queue", r->conf->dlq));
		return rc;
	}
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_ERROR, "cannot read the dead-letter queue", LOG_S("error", mq_errmsg(r->mq)));
		return rc;
	}
	if (r->in_queue == 0)
		return ST_OK;
	window = r->in_queue > DLQ_WINDOW_MAX ? DLQ_WINDOW_MAX : r->in_queue;
	if (window < r->in_queue)
		LOG(LOG_LEVEL_WARN, "the queue is longer than one consumer's window: only its head is read",
		    LOG_I("in_queue", r->in_queue), LOG_I("read", window));
	rc = mq_consume_start(r->mq, r->conf->dlq, (int)window, 0);
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_ERROR, "cannot consume the dead-letter queue", LOG_S("error", mq_errmsg(r->mq)));
		return rc;
	}
	while (r->read < (long)window && !r->stop) {
		struct mq_delivery d;
		struct dlq_entry e;

		memset(&d, 0, sizeof d);
		rc = mq_consume(r->mq, &d, DLQ_WAIT_MS);
		if (rc == ST_ERR_TIMEOUT) {
			/* Another consumer (a second operator, a verifier) holds
			 * the rest for now. */
			LOG(LOG_LEVEL_WARN, "fewer messages came than the queue counted; another consumer holds the rest",
			    LOG_I("in_queue", r->in_queue), LOG_I("read", r->read));
			break;
		}
		if (rc != ST_OK) {
			LOG(LOG_LEVEL_ERROR, "reading the dead-letter queue failed", LOG_S("error", mq_errmsg(r->mq)));
			return rc;
		}
		r->read++;
		rc = dlq_entry_read(r->conf, &d, r->read, &e);
		if (rc == ST_OK && e.dlq_count > 0 && !r->counted) {
			r->counted = true;
			LOG(LOG_LEVEL_WARN, "the dead-letter queue counts deliveries (a quorum queue): every read adds one to"
			    " each message's x-delivery-count, so it must have no delivery limit (RabbitMQ 3.x) or"
			    " delivery-limit -1 (4.x; doc/operations.md, Dead letters), or reads would drop messages",
			    LOG_S("queue", r->conf->dlq));
		}
		if (rc == ST_OK)
			rc = visit(r, &d, &e);
		dlq_entry_free(&e);
		mq_delivery_release(r->mq, &d);
		if (rc != ST_OK)
			return rc;
	}
	return ST_OK;
}

/* ---- list ---------------------------------------------------------------- */

static int dlq_visit_list(struct dlq_run *r, const struct mq_delivery *d, struct dlq_entry *e)
{
	char rk[256];

	dlq_entry_text(rk, sizeof rk, d->routing_key, strlen(d->routing_key));
	if (!dlq_matches(r->o, e, (int64_t)time(NULL)))
		return ST_OK;
	r->shown++;
	if (dlq_count_reason(r, e->reason) != ST_OK)
		return ST_ERR_NOMEM;
	if (r->o->json) {
		json_t *j = json_pack("{s:I, s:s, s:s, s:s, s:s, s:s, s:s, s:s?, s:o, s:I, s:s}", "position",
		                      (json_int_t)e->position, "message_id", e->message_id, "source", e->source, "type",
		                      e->type, "order_id", e->order_id, "reason", e->reason, "detail", e->detail,
		                      "dead_lettered_at", e->at[0] ? e->at : NULL, "deliveries",
		                      e->deliveries >= 0 ? json_integer((json_int_t)e->deliveries) : json_null(), "replays", (json_int_t)e->replays, "routing_key", rk);
		if (j == NULL || json_array_append_new(r->list, j) != 0)
			return ST_ERR_NOMEM;
		return ST_OK;
	}
	if (r->shown == 1)
		fprintf(r->out, "%-4s %-24s %-10s %-18s %-12s %-20s %-20s %5s %s\n", "#", "MESSAGE_ID", "SOURCE", "TYPE",
		        "ORDER", "REASON", "DEAD_LETTERED_AT", "DELIV", "DETAIL");
	{
		char deliv[24];

		if (e->deliveries >= 0)
			snprintf(deliv, sizeof deliv, "%lld", (long long)e->deliveries);
		else
			snprintf(deliv, sizeof deliv, "-");
		fprintf(r->out, "%-4ld %-24s %-10s %-18s %-12s %-20s %-20s %5s %s%s\n", e->position, e->message_id,
		        e->source[0] ? e->source : "-", e->type[0] ? e->type : "-", e->order_id[0] ? e->order_id : "-",
		        e->reason, e->at[0] ? e->at : "-", deliv, e->detail[0] ? e->detail : "-",
		        e->replays > 0 ? " [replayed before]" : "");
	}
	return ST_OK;
}

/* ---- show ---------------------------------------------------------------- */

static bool dlq_is_text(const void *p, size_t len)
{
	const unsigned char *s = p;

	for (size_t i = 0; i < len; i++)
		if ((s[i] < 0x20 && s[i] != '\n' && s[i] != '\t' && s[i] != '\r') || s[i] == 0x7f)
			return false;
	return true;
}

static int dlq_visit_show(struct dlq_run *r, const struct mq_delivery *d, struct dlq_entry *e)
{
	struct dlq_judge_inbox_row in;
	struct dlq_judge_order_row ord;
	enum dlq_judge_verdict v;
	char why[800], sha[65], label[LC_NAME_MAX + 8];
	char *props;
	int rc;

	if (strcmp(e->message_id, r->o->message_id) != 0)
		return ST_OK;
	r->shown++;
	fprintf(r->out, "%sdead letter %s at position %ld of %u in %s\n", r->shown > 1 ? "\n" : "", e->message_id,
	        e->position, r->in_queue, r->conf->dlq);
	fprintf(r->out, "reason:       %s\n", e->reason);
	fprintf(r->out, "detail:       %s\n", e->detail[0] ? e->detail : "-");
	if (e->deliveries >= 0)
		snprintf(why, sizeof why, "%lld", (long long)e->deliveries);
	else
		snprintf(why, sizeof why, "unknown");
	fprintf(r->out, "dead-lettered %s, deliveries %s, replays %lld\n", e->at[0] ? e->at : "at an unknown time",
	        why, (long long)e->replays);
	fprintf(r->out, "routing key:  %s\n", d->routing_key);
	props = json_dumps(e->props, JSON_INDENT(2) | JSON_SORT_KEYS);
	fprintf(r->out, "properties:   %s\n", props != NULL ? props : "?");
	free(props);
	if (dlq_is_text(d->body, d->len))
		fprintf(r->out, "body (%zu bytes):\n%.*s\n", d->len, (int)(d->len > 65536 ? 65536 : d->len),
		        (const char *)d->body);
	else
		fprintf(r->out, "body (%zu bytes): not text\n", d->len);
	if (e->parse != MSG_REASON_NONE) {
		fprintf(r->out, "parse:        %s: %s\n", msg_reason_name(e->parse), e->m.detail);
	} else {
		msg_sha256_hex(e->m.sha256, sha);
		fprintf(r->out, "parse:        ok, key (%s, %s, %s), sha256 %s\n", r->conf->consumer, e->m.source,
		        e->m.message_id, sha);
		rc = dlq_judge_inbox_lookup(&r->judge, &e->m, &in);
		if (rc != ST_OK)
			return rc;
		if (in.found)
			fprintf(r->out, "inbox row:    outcome %s%s%s, sha256 %s (%s payload), processed_at %s\n",
			        in.outcome, in.reason[0] ? ", reason " : "", in.reason, in.sha,
			        strcmp(in.sha, sha) == 0 ? "the same" : "ANOTHER", in.at);
		else
			fprintf(r->out, "inbox row:    none\n");
		rc = dlq_judge_order_lookup(&r->judge, e->m.order_id, &ord);
		if (rc != ST_OK)
			return rc;
		/* "order row:    ", "shipment row: ": the aggregate's name in the
		 * label's column. */
		snprintf(label, sizeof label, "%s row:", agg_current()->def->aggregate);
		if (ord.found) {
			const struct agg_binding *b = agg_current();

			fprintf(r->out, "%-13s %s status %s, version %lld, flags %lld", label, e->m.order_id, ord.status,
			        (long long)ord.version, (long long)ord.flags);
			for (int k = 0; k < b->ncols; k++)
				fprintf(r->out, ", %s %s", b->cols[k], ord.col_null[k] ? "NULL" : ord.col[k]);
			fprintf(r->out, "\n");
		} else {
			fprintf(r->out, "%-13s %s does not exist\n", label, e->m.order_id);
		}
	}
	rc = dlq_judge_entry(&r->judge, e, &v, why, sizeof why);
	if (rc != ST_OK)
		return rc;
	fprintf(r->out, "replay:       %s: %s\n", v <= DLQ_JUDGE_REOPEN ? "would replay" : "would leave it", why);
	return ST_OK;
}

/* ---- replay -------------------------------------------------------------- */

/* The run's own memory of the keys it replayed (or, in a dry run, would
 * have).  The database cannot tell: a key this run reopened has no row
 * any more, and the copy may not have been taken yet, so a second dead
 * letter of that key would read as "never seen".  Kept apart from
 * dlq_judge_entry, which judges by what the database says. */
static int dlq_run_key(const struct msg *m, char *buf, size_t cap)
{
	int n = snprintf(buf, cap, "%s\x1f%s", m->source, m->message_id);

	return n < 0 || (size_t)n >= cap ? ST_ERR_INVALID : ST_OK;
}

/* Whether this run replayed e's key already; if so *v and why say what a
 * copy of e would be: a duplicate of that copy, or a conflict with it. */
static bool dlq_run_judge(struct dlq_run *r, const struct dlq_entry *e, enum dlq_judge_verdict *v, char *why,
                          size_t cap)
{
	char key[MSG_WIDE_SOURCE_MAX + MSG_WIDE_ID_MAX + 4], sha[65];
	json_t *seen;

	if (e->parse != MSG_REASON_NONE || dlq_run_key(&e->m, key, sizeof key) != ST_OK)
		return false;
	seen = json_object_get(r->replayed, key);
	if (seen == NULL)
		return false;
	msg_sha256_hex(e->m.sha256, sha);
	if (strcmp(json_string_value(json_array_get(seen, 0)), sha) == 0) {
		*v = DLQ_JUDGE_DUPLICATE;
		snprintf(why, cap, "this run %s this payload already (position %lld): the copy is a duplicate, no effect",
		         r->o->dry_run ? "would have replayed" : "replayed",
		         (long long)json_integer_value(json_array_get(seen, 1)));
	} else {
		*v = DLQ_JUDGE_CONFLICT;
		snprintf(why, cap, "this run %s another payload for this key (position %lld): the first one stands;"
		         " replaying would only dead-letter it again", r->o->dry_run ? "would have replayed" : "replayed",
		         (long long)json_integer_value(json_array_get(seen, 1)));
	}
	return true;
}

/* Remember that this run sent (or would send) e.  ST_OK, ST_ERR_NOMEM. */
static int dlq_remember(struct dlq_run *r, const struct dlq_entry *e)
{
	char key[MSG_WIDE_SOURCE_MAX + MSG_WIDE_ID_MAX + 4], sha[65];

	if (e->parse != MSG_REASON_NONE || dlq_run_key(&e->m, key, sizeof key) != ST_OK)
		return ST_OK;
	if (json_object_get(r->replayed, key) != NULL)
		return ST_OK; /* the first one is what a later copy is measured against */
	msg_sha256_hex(e->m.sha256, sha);
	return json_object_set_new(r->replayed, key, json_pack("[s, I]", sha, (json_int_t)e->position)) == 0
	               ? ST_OK
	               : ST_ERR_NOMEM;
}

/* The saved properties without the previous replay count (ours replaces
 * it); x-inbox-* headers and the broker's x-delivery-count are dropped by
 * mq_publish itself.  Malloc'd, NULL when out of memory. */
static char *dlq_replay_props(const struct dlq_entry *e)
{
	json_t *copy = json_deep_copy(e->props);
	char *out;

	if (copy == NULL)
		return NULL;
	json_object_del(json_object_get(copy, "headers"), DEADLETTER_REPLAYS);
	out = json_dumps(copy, JSON_COMPACT);
	json_decref(copy);
	return out;
}

static int dlq_publish_copy(struct dlq_run *r, const struct mq_delivery *d, const struct dlq_entry *e)
{
	char replays[24], rk[300];
	char *props = dlq_replay_props(e);
	struct mq_header h[1] = { { DEADLETTER_REPLAYS, replays } };
	struct mq_message msg = {
		.exchange = r->conf->exchange, .routing_key = rk, .body = d->body, .len = d->len,
		.props_json = props, .headers = h, .nheaders = 1,
		/* An unroutable copy (the inbox queue unbound) must not be
		 * taken for delivered: the dead letter stays. */
		.mandatory = true,
	};
	int rc;

	if (props == NULL)
		return ST_ERR_NOMEM;
	snprintf(replays, sizeof replays, "%lld", (long long)e->replays + 1);
	snprintf(rk, sizeof rk, "%s", d->routing_key[0] ? d->routing_key : "order.unknown");
	if (r->pub == NULL) {
		rc = mq_open(&r->pub, &r->conf->amqp, 0, "inbox-worker dlq replay");
		if (rc != ST_OK)
			goto cleanup;
	}
	rc = mq_publish_confirmed(r->pub, &msg, DLQ_CONFIRM_MS);
cleanup:
	free(props);
	return rc;
}

/* A delivery-failed dead letter (an emitted event an HTTP destination
 * never took) goes back to its destination's outbox, not to our queue: a
 * row like the one that failed, the same id and so the same
 * Idempotency-Key, for the destination's courier (common/outbox_http.h).
 * Returns ST_OK when e is not such a letter (*done false). */
static int dlq_replay_delivery(struct dlq_run *r, const struct mq_delivery *d, struct dlq_entry *e, bool *done)
{
	const char *dest = json_string_value(json_object_get(json_object_get(e->props, "headers"), DEADLETTER_DESTINATION));
	char exch[300], *props = NULL;
	struct db_stmt *ins = NULL;
	int rc;

	*done = false;
	if (strcmp(e->reason, msg_reason_name(MSG_REASON_DELIVERY_FAILED)) != 0 || dest == NULL)
		return ST_OK;
	*done = true;
	if (r->o->dry_run)
		goto said;
	props = dlq_replay_props(e);
	if (props == NULL)
		return ST_ERR_NOMEM;
	snprintf(exch, sizeof exch, "%s%s", OUTBOX_HTTP_EXCHANGE, dest);
	rc = db_prepare(r->judge.db, &ins,
	                "INSERT INTO outbox (message_id, exchange, routing_key, type, order_id, props, body, created_at,"
	                " destination) VALUES (?, ?, ?, ?, ?, ?, ?, NOW(6), ?)");
	if (rc == ST_OK) {
		struct db_param p[8] = {
			DBP_STR(e->message_id), DBP_STR(exch), DBP_STR(d->routing_key), DBP_STR(e->type),
			DBP_STR(e->order_id), DBP_STR(props), DBP_BLOB(d->body, d->len), DBP_STR(dest),
		};

		rc = db_stmt_exec(ins, p, 8, NULL);
	}
	if (rc == ST_OK)
		rc = db_commit(r->judge.db);
	free(props);
	if (rc != ST_OK) {
		db_rollback(r->judge.db);
		LOG(LOG_LEVEL_ERROR, "cannot give the event back to its destination; the dead letter stays",
		    LOG_S("msg", e->message_id), LOG_S("destination", dest), LOG_S("error", dlq_judge_errmsg(&r->judge)));
		return rc;
	}
	rc = mq_ack(r->mq, d->tag, false);
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_ERROR, "replayed, but the dead letter could not be removed: a later replay calls again with"
		    " the same key", LOG_S("msg", e->message_id), LOG_S("error", mq_errmsg(r->mq)));
		return rc;
	}
said:
	r->acted++;
	fprintf(r->out, "%-10s %-24s %-12s %-20s back to destination %s, the same Idempotency-Key\n",
	        r->o->dry_run ? "would replay" : "replayed", e->message_id, e->order_id[0] ? e->order_id : "-", e->reason,
	        dest);
	if (r->o->limit > 0 && r->acted >= r->o->limit)
		r->stop = true;
	return ST_OK;
}

static int dlq_visit_replay(struct dlq_run *r, const struct mq_delivery *d, struct dlq_entry *e)
{
	enum dlq_judge_verdict v;
	char why[800];
	const char *what;
	bool chosen;
	int rc = dlq_choose(r, e, &chosen);

	bool done;

	if (rc != ST_OK || !chosen)
		return rc;
	rc = dlq_replay_delivery(r, d, e, &done);
	if (rc != ST_OK || done)
		return rc;
	if (!dlq_run_judge(r, e, &v, why, sizeof why)) {
		rc = dlq_judge_entry(&r->judge, e, &v, why, sizeof why);
		if (rc != ST_OK) {
			LOG(LOG_LEVEL_ERROR, "database lookup failed", LOG_S("error", dlq_judge_errmsg(&r->judge)));
			return rc;
		}
	}
	r->by_verdict[v]++;
	if (v > DLQ_JUDGE_REOPEN) {
		fprintf(r->out, "left       %-24s %-12s %-20s %s\n", e->message_id, e->order_id[0] ? e->order_id : "-",
		        e->reason, why);
		return ST_OK;
	}
	what = r->o->dry_run ? "would replay" : "replayed";
	if (!r->o->dry_run) {
		if (v == DLQ_JUDGE_REOPEN) {
			rc = dlq_judge_reopen(&r->judge, e);
			if (rc != ST_OK)
				return rc;
		}
		rc = dlq_publish_copy(r, d, e);
		if (rc == ST_ERR_MQ_NACK) {
			/* This copy's own fault (its routing key reaches no
			 * queue, or the broker refused it), not the
			 * connection's: the dead letter stays, the walk goes
			 * on, and the exit status says one was skipped.  A key
			 * reopened for it stays open: the next replay finds
			 * "no record" and sends it, which is what it is for. */
			char rk[256];

			r->by_verdict[v]--;
			r->unroutable++;
			dlq_entry_text(rk, sizeof rk, d->routing_key, strlen(d->routing_key));
			LOG(LOG_LEVEL_WARN, "replay copy returned or refused by the broker; the dead letter stays",
			    LOG_S("msg", e->message_id), LOG_S("exchange", r->conf->exchange), LOG_S("routing_key", rk),
			    LOG_S("error", mq_errmsg(r->pub)));
			fprintf(r->out, "left       %-24s %-12s %-20s unroutable: the broker returned or refused the copy"
			        " (exchange %s, routing key %s)\n", e->message_id, e->order_id[0] ? e->order_id : "-",
			        e->reason, r->conf->exchange, rk);
			return ST_OK;
		}
		if (rc != ST_OK) {
			LOG(LOG_LEVEL_ERROR, "replay publish not confirmed; the dead letter stays", LOG_S("msg", e->message_id),
			    LOG_S("exchange", r->conf->exchange), LOG_S("error", r->pub != NULL ? mq_errmsg(r->pub) : st_strerror(rc)));
			return rc;
		}
		/* The copy is the broker's now.  Dying here leaves both: the
		 * next replay sends the dead letter again, and the inbox takes
		 * the second copy for a duplicate. */
		if (fault_hit("dlq-replay-after-confirm"))
			(void)raise(SIGKILL);
		rc = mq_ack(r->mq, d->tag, false);
		if (rc != ST_OK) {
			LOG(LOG_LEVEL_ERROR, "replayed, but the dead letter could not be removed: a later replay of it is a"
			    " duplicate", LOG_S("msg", e->message_id), LOG_S("error", mq_errmsg(r->mq)));
			return rc;
		}
	}
	rc = dlq_remember(r, e);
	if (rc != ST_OK)
		return rc;
	r->acted++;
	fprintf(r->out, "%-10s %-24s %-12s %-20s %s\n", what, e->message_id, e->order_id[0] ? e->order_id : "-",
	        e->reason, why);
	if (r->o->limit > 0 && r->acted >= r->o->limit)
		r->stop = true;
	return ST_OK;
}

/* ---- purge --------------------------------------------------------------- */

static int dlq_visit_purge(struct dlq_run *r, const struct mq_delivery *d, struct dlq_entry *e)
{
	bool chosen;
	int rc = dlq_choose(r, e, &chosen);

	if (rc != ST_OK || !chosen)
		return rc;
	if (r->o->yes) {
		rc = mq_ack(r->mq, d->tag, false);
		if (rc != ST_OK) {
			LOG(LOG_LEVEL_ERROR, "purge interrupted", LOG_S("error", mq_errmsg(r->mq)));
			return rc;
		}
		r->acted++;
	}
	fprintf(r->out, "%-12s %-24s %-12s %-20s %s\n", r->o->yes ? "purged" : "would purge", e->message_id,
	        e->order_id[0] ? e->order_id : "-", e->reason, e->detail[0] ? e->detail : "-");
	return ST_OK;
}

/* ---- skip ---------------------------------------------------------------- */

static int dlq_visit_skip(struct dlq_run *r, const struct mq_delivery *d, struct dlq_entry *e)
{
	char why[800];
	bool chosen, skipped;
	int rc = dlq_choose(r, e, &chosen);

	if (rc != ST_OK || !chosen)
		return rc;
	rc = dlq_skip_entry(&r->skip, &r->judge, d, e, r->o->dry_run, &skipped, why, sizeof why);
	if (rc != ST_OK)
		return rc;
	if (skipped && !r->o->dry_run) {
		/* Dying before this ack leaves the letter: a second skip finds
		 * its key taken and removes it. */
		rc = mq_ack(r->mq, d->tag, false);
		if (rc != ST_OK) {
			LOG(LOG_LEVEL_ERROR, "skipped, but the dead letter could not be removed: a later skip removes it",
			    LOG_S("msg", e->message_id), LOG_S("error", mq_errmsg(r->mq)));
			return rc;
		}
	}
	if (skipped)
		r->acted++;
	fprintf(r->out, "%-10s %-24s %-12s %-20s %s\n", !skipped ? "left" : r->o->dry_run ? "would skip" : "skipped",
	        e->message_id, e->order_id[0] ? e->order_id : "-", e->reason, why);
	return ST_OK;
}

/* ---- commands ------------------------------------------------------------ */

int dlq_main(const struct cfg *conf, const struct dlq_opts *o, FILE *out)
{
	struct dlq_run r = { .conf = conf, .o = o, .out = out };
	static const dlq_visit_fn visits[] = {
		[DLQ_LIST] = dlq_visit_list, [DLQ_SHOW] = dlq_visit_show,
		[DLQ_REPLAY] = dlq_visit_replay, [DLQ_PURGE] = dlq_visit_purge, [DLQ_SKIP] = dlq_visit_skip,
	};
	int rc, code = 1;

	r.by_reason = json_object();
	r.list = json_array();
	r.replayed = json_object();
	if (r.by_reason == NULL || r.list == NULL || r.replayed == NULL)
		goto cleanup;
	if ((o->cmd == DLQ_SHOW || o->cmd == DLQ_REPLAY || o->cmd == DLQ_SKIP) && dlq_judge_open(&r.judge, conf) != ST_OK)
		goto cleanup;
	rc = mq_open(&r.mq, &conf->amqp, 0, "inbox-worker dlq");
	if (rc != ST_OK)
		goto cleanup;
	rc = dlq_walk(&r, visits[o->cmd]);
	/* Hand back every message not acked, in its place, before saying
	 * anything more. */
	mq_close(&r.mq);
	/* A replay or purge that failed half-way still says what it did. */
	if (rc != ST_OK && o->cmd != DLQ_REPLAY && o->cmd != DLQ_PURGE && o->cmd != DLQ_SKIP)
		goto cleanup;
	switch (o->cmd) {
	case DLQ_LIST:
		if (o->json) {
			json_t *doc = json_pack("{s:s, s:I, s:I, s:I, s:O, s:O}", "queue", conf->dlq, "in_queue",
			                        (json_int_t)r.in_queue, "read", (json_int_t)r.read, "shown",
			                        (json_int_t)r.shown, "by_reason", r.by_reason, "dead_letters", r.list);
			char *s = doc != NULL ? json_dumps(doc, JSON_INDENT(2)) : NULL;
			json_decref(doc);
			if (s == NULL)
				goto cleanup;
			fprintf(out, "%s\n", s);
			free(s);
		} else {
			fprintf(out, "%ld dead letters shown, %ld read, %u in %s\n", r.shown, r.read, r.in_queue, conf->dlq);
			dlq_print_by_reason(&r, "by reason");
		}
		code = 0;
		break;
	case DLQ_SHOW:
		if (r.shown == 0) {
			fprintf(out, "no dead letter with message id %s among the %ld read from %s\n", o->message_id, r.read,
			        conf->dlq);
			goto cleanup;
		}
		code = 0;
		break;
	case DLQ_REPLAY: {
		long left = r.chosen - r.acted;
		fprintf(out, "%s%ld chosen of %u in %s; %s %ld (keys reopened %ld, duplicates %ld); left in the queue %ld",
		        o->dry_run ? "dry run, nothing changed: " : "", r.chosen, r.in_queue, conf->dlq,
		        o->dry_run ? "would replay" : "replayed", r.acted, r.by_verdict[DLQ_JUDGE_REOPEN],
		        r.by_verdict[DLQ_JUDGE_DUPLICATE], left);
		int first = 1;
		for (int v = DLQ_JUDGE_MALFORMED; v < DLQ_JUDGE_COUNT; v++)
			if (r.by_verdict[v] > 0) {
				fprintf(out, "%s %s %ld", first ? ":" : ",", dlq_judge_verdict_name((enum dlq_judge_verdict)v),
				        r.by_verdict[v]);
				first = 0;
			}
		if (r.unroutable > 0)
			fprintf(out, "%s unroutable %ld", first ? ":" : ",", r.unroutable);
		fprintf(out, "\n");
		dlq_print_by_reason(&r, "chosen by reason");
		/* 1 also when the walk went to the end but left a dead letter
		 * for a broker reason (a copy returned or refused): that one
		 * needs the operator, unlike a verdict's "left". */
		code = rc == ST_OK && r.unroutable == 0 ? 0 : 1;
		break;
	}
	case DLQ_PURGE:
		if (o->yes)
			fprintf(out, "purged %ld of %u in %s\n", r.acted, r.in_queue, conf->dlq);
		else
			fprintf(out, "would purge %ld of %u in %s; nothing purged (add --yes)\n", r.chosen, r.in_queue,
			        conf->dlq);
		code = rc == ST_OK ? 0 : 1;
		break;
	case DLQ_SKIP:
		fprintf(out, "%s%ld chosen of %u in %s; %s %ld; left in the queue %ld\n",
		        o->dry_run ? "dry run, nothing changed: " : "", r.chosen, r.in_queue, conf->dlq,
		        o->dry_run ? "would skip" : "skipped", r.acted, r.chosen - r.acted);
		code = rc == ST_OK ? 0 : 1;
		break;
	case DLQ_CMD_COUNT: /* not a command: cmd_dlq_take never sets it */
		break;
	}
cleanup:
	mq_close(&r.mq);
	mq_close(&r.pub);
	dlq_skip_close(&r.skip);
	dlq_judge_close(&r.judge);
	json_decref(r.by_reason);
	json_decref(r.list);
	json_decref(r.replayed);
	return code;
}

/* ---- arguments ----------------------------------------------------------- */

void dlq_usage(FILE *f)
{
	fprintf(f, "  dlq list [--reason R]... [--id ID]... [--order ID] [--since DURATION] [--json]\n"
	           "            every dead letter, in queue order, and a count by reason; reads only\n"
	           "  dlq show MESSAGE_ID\n"
	           "            body, properties, the inbox row and the order row of a dead letter\n"
	           "  dlq replay [--reason R]... [--id ID]... [--order ID] [--since D] [--limit N] [--dry-run]\n"
	           "            publish the chosen dead letters to the inbox exchange again; each is\n"
	           "            removed only after the broker confirmed its copy\n"
	           "  dlq purge --reason R [--id ID]... [--order ID] [--since D] [--yes]\n"
	           "            count (and with --yes remove) the chosen dead letters\n"
	           "  dlq skip (--id ID | --order ID)... [--reason R]... [--since D] [--dry-run]\n"
	           "            a numbered lifecycle's letters whose aggregate waits at their number: the\n"
	           "            number is taken without the event's effect, what waits behind it released\n");
}

static const char *const dlq_cmd_names[] = {
	[DLQ_LIST] = "list", [DLQ_SHOW] = "show", [DLQ_REPLAY] = "replay", [DLQ_PURGE] = "purge",
	[DLQ_SKIP] = "skip",
};
_Static_assert(ARRAY_LEN(dlq_cmd_names) == DLQ_CMD_COUNT, "one name per enum dlq_cmd");

#define L ARGS_BIT(DLQ_LIST)
#define R ARGS_BIT(DLQ_REPLAY)
#define P ARGS_BIT(DLQ_PURGE)
#define S ARGS_BIT(DLQ_SKIP)
#define O(field) offsetof(struct dlq_opts, field)

/* The options of every dlq subcommand.  show takes none: its MESSAGE_ID
 * says which one.  The help texts are dlq_usage's, which --help prints. */
static const struct args_opt dlq_opt_table[] = {
	{ "--reason", L | R | P | S, ARGS_STRS, 0, DLQ_MAX_REASONS, O(reasons), O(nreasons), "R", "any of these reasons" },
	{ "--id", L | R | P | S, ARGS_STRS, 0, DLQ_MAX_IDS, O(ids), O(nids), "ID", "any of these message ids" },
	{ "--order", L | R | P | S, ARGS_STR, 0, 0, O(order_id), 0, "ID", "this order's" },
	{ "--since", L | R | P | S, ARGS_DUR, 1, ARGS_NO_MAX, O(since_s), 0, "DURATION", "dead-lettered within" },
	{ "--limit", R, ARGS_LONG, 1, ARGS_NO_MAX, O(limit), 0, "N", "most messages replayed" },
	{ "--json", L, ARGS_FLAG, 0, 0, O(json), 0, NULL, "one JSON document" },
	{ "--dry-run", R | S, ARGS_FLAG, 0, 0, O(dry_run), 0, NULL, "judge, change nothing" },
	{ "--yes", P, ARGS_FLAG, 0, 0, O(yes), 0, NULL, "remove them" },
};

#undef L
#undef R
#undef P
#undef S
#undef O

static const struct args_spec dlq_spec = {
	.prefix = "dlq ", .cmd_names = dlq_cmd_names, .ncmds = DLQ_CMD_COUNT,
	.opts = dlq_opt_table, .nopts = ARRAY_LEN(dlq_opt_table),
};

enum args_result cmd_dlq_take(int *argc, char **argv, struct dlq_opts *o, char *err, size_t cap)
{
	enum args_result r = args_asks(*argc, argv);
	int cmd, words, n;
	char **rest;

	memset(o, 0, sizeof *o);
	if (r != ARGS_OK)
		return r;
	if (*argc < 2 || argv[1][0] == '-') {
		snprintf(err, cap, "dlq: missing subcommand (list, show, replay, purge, skip)");
		return ARGS_ERROR;
	}
	cmd = args_find(dlq_cmd_names, DLQ_CMD_COUNT, argv[1]);
	if (cmd < 0) {
		snprintf(err, cap, "dlq: unknown subcommand '%s' (list, show, replay, purge, skip)", argv[1]);
		return ARGS_ERROR;
	}
	o->cmd = (enum dlq_cmd)cmd;
	words = 1;
	if (o->cmd == DLQ_SHOW) {
		if (*argc < 3 || argv[2][0] == '-') {
			snprintf(err, cap, "dlq show: missing MESSAGE_ID");
			return ARGS_ERROR;
		}
		o->message_id = argv[2];
		words = 2;
	}
	/* The options after the words; rest[0] is the last word, as args_take
	 * and cfg_load skip their argv[0]. */
	n = *argc - words;
	rest = argv + words;
	r = args_take(&dlq_spec, (size_t)cmd, &n, rest, o, err, cap);
	if (r != ARGS_OK)
		return r;
	if (o->cmd == DLQ_PURGE && o->nreasons == 0) {
		snprintf(err, cap, "dlq purge: --reason is required (rabbitmqctl purge_queue empties it all)");
		return ARGS_ERROR;
	}
	if (o->cmd == DLQ_SKIP && o->nids == 0 && o->order_id == NULL) {
		snprintf(err, cap, "dlq skip: say which: --id ID or --order ID (a skip is a decision about an event)");
		return ARGS_ERROR;
	}
	for (int i = 1; i <= n; i++) /* the settings' flags, and the NULL after them */
		argv[i] = rest[i];
	*argc = n;
	return ARGS_OK;
}

/* ---- the command --------------------------------------------------------- */

static enum args_result dlq_take(int *argc, char **argv, struct cmd_opts *o, char *err, size_t cap)
{
	return cmd_dlq_take(argc, argv, &o->dlq, err, cap);
}

/* A replay writes rows (it reopens keys): it refuses a database a newer
 * build migrated, as every command that writes does; the others read. */
static int dlq_run(const struct cfg *conf, const struct cmd_opts *o)
{
	char err[512];
	int code;

	if ((o->dlq.cmd == DLQ_REPLAY || o->dlq.cmd == DLQ_SKIP) && !o->dlq.dry_run &&
	    preflight_known_migrations(conf) != 0)
		return 1;
	/* Dead letters are read, judged and shown by the lifecycle the
	 * worker runs (INBOX_LIFECYCLE; the built-in order one without). */
	code = preflight_lifecycle(conf);
	if (code != 0)
		return code;
	/* and read by the worker's envelope settings, judged by that lifecycle */
	if (env_check_settings(conf, err, sizeof err) != 0) {
		fprintf(stderr, "inbox-worker: %s\n", err);
		return 2;
	}
	return dlq_main(conf, &o->dlq, stdout);
}

const struct cmd cmd_dlq = { "dlq", dlq_take, dlq_run, dlq_usage };
