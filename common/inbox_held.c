/*
 * inbox_held.c - the held events: an event whose prerequisite has not
 * happened yet is held (in memory for the rest of the batch, in
 * held_events if still held when it ends), re-evaluated whenever its order
 * changes, and dead-lettered by hold expiry once held past INBOX_HOLD_TTL.
 *
 * Held events to re-evaluate (an order changed and has some) are read in
 * pages of 64 after writing what is pending (without the COMMIT), so the
 * reads see the batch's own writes; that is the one case with more round
 * trips.  A released event is read back whole and parsed again
 * (msg_parse), so it takes effect with every field of its data exactly as
 * it would have arriving in order.
 *
 * Separate from the batch (inbox.c) because it is the one part of the
 * transaction that reads rows back whole and parses them again.  It owns
 * no transaction: it runs inside the batch's (inbox_decide calls
 * inbox_release_held), on the orders the claim locked, and writes through
 * the write's sections (inbox_write.c).  Hold expiry is here because it
 * reads held rows the same way and settles them; its transaction, like a
 * batch's, ends in inbox_end (inbox.c).
 */
#include "inbox.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "array.h"
#include "effects.h"
#include "inbox_int.h"
#include "log.h"
#include "props.h"
#include "sqlbuf.h"
#include "status.h"
/* What one read of held events carries back at most (inbox_held_read):
 * the bytes of their stored values, each row counted INBOX_HELD_ROW_COST
 * more for its ids and names, and always the first row, however large.
 * The claim reads the held events of the batch's orders within it, so a
 * batch releases them without a round trip of its own (issue 43: one read
 * per held event kept a batch open for a minute on a slow link); an order
 * whose held events outgrow it is read on a page at a time. */
#define INBOX_HELD_READ_MAX (4u * 1024u * 1024u)
#define INBOX_HELD_ROW_COST 512u
/* Held events one pass of hold expiry takes at most (inbox_expire_holds). */
#define INBOX_EXPIRE_MAX 64

/* A held event's key and type, as it is parsed again (inbox_held_parse). */
struct inbox_held {
	int64_t id;
	char source[MSG_WIDE_SOURCE_MAX + 1];
	char message_id[MSG_WIDE_ID_MAX + 1];
	char type[MSG_TYPE_NAME_MAX + 1];
};

/* Read with the rest of a held event (inbox_hrow_event): the canonical
 * event of an enveloped message (NULL: native, the body is the event) and
 * what it carries into what it causes. */
struct inbox_held_more {
	const char *event;
	size_t event_len;
	struct env_context ctx;
};

/* Parse a held event's stored body again, as it was parsed when it
 * arrived: the key and type it was held under stand for the AMQP
 * properties that may have carried them, and the size limit is the
 * column's (the body was within INBOX_MAX_BODY when it came).  A body that
 * no longer parses or no longer matches its row (the rules changed since)
 * gives the reason to dead-letter it with, and m->detail. */
static enum msg_reason inbox_held_parse(const struct inbox_held *h, const struct inbox_held_more *x,
                                        const char *order_id, const struct inbox_event *raw, struct msg *m)
{
	struct msg_props props = {
		.message_id = h->message_id, .message_id_len = strlen(h->message_id),
		.type = h->type, .type_len = strlen(h->type),
	};
	struct props_out saved;
	struct env_delivery d;
	enum msg_reason r;

	if (x->event == NULL && agg_current()->def->seq_header) {
		/* its number came in a header, kept with its properties */
		(void)props_saved_envelope(raw->props, &saved, &d);
		props.sequence = env_header_number(&d);
		props_out_release(&saved);
	}
	if (x->event != NULL) {
		/* Enveloped: its canonical event, as the envelope layer read it
		 * when it came (a changed INBOX_TYPE_MAP does not reread it). */
		json_t *root = json_loadb(x->event, x->event_len, JSON_REJECT_DUPLICATES, NULL);

		r = msg_parse_event(root, NULL, m);
		json_decref(root);
	} else {
		r = msg_parse(raw->body, raw->len, INBOX_BODY_COLUMN_MAX, &props, m);
		json_decref(props.sequence);
	}
	if (r != MSG_REASON_NONE)
		return r;
	if (strcmp(m->message_id, h->message_id) != 0 || strcmp(m->source, h->source) != 0 ||
	    strcmp(m->order_id, order_id) != 0 || strcmp(m->type_name, h->type) != 0) {
		snprintf(m->detail, sizeof m->detail, "stored body does not match its held event");
		return MSG_REASON_INVALID_FIELD;
	}
	return MSG_REASON_NONE;
}

/* Settle a held event whose stored body cannot be applied: its
 * dead-letter copy with the reason, no effect on the order. */
static int inbox_held_reject(struct inbox *ib, const struct inbox_event *raw, enum msg_reason r,
                             const char *detail, struct inbox_result *res)
{
	const char *reason = msg_reason_name(r);
	int rc = inbox_w_dead_letter(ib, raw, reason, detail);

	if (rc == ST_OK) {
		inbox_w_outcome(ib, raw, "dead_lettered", reason, false);
		res->outbox_rows++;
	}
	LOG(LOG_LEVEL_WARN, "held event cannot be applied; dead-lettered", LOG_S("message_id", raw->message_id),
	    LOG_S("order", raw->order_id), LOG_S("reason", reason), LOG_S("detail", detail));
	return rc;
}

/* One row of a read of held events (inbox_sql_held_read: id, the HV_*
 * values, n) into ib->hrows.  Every value is checked against its column's
 * width here, so the rest of the file reads them as the strings they are. */
int inbox_hrow_add(struct inbox *ib, const char *const *v, const unsigned long *lens, int ncols)
{
	static const size_t cap[HV_N] = {
		[HV_ORDER] = MSG_ORDER_ID_MAX, [HV_SOURCE] = MSG_WIDE_SOURCE_MAX, [HV_MID] = MSG_WIDE_ID_MAX,
		[HV_TYPE] = MSG_TYPE_NAME_MAX, [HV_RK] = 255, [HV_PROPS] = INBOX_PROPS_COLUMN_MAX,
		[HV_BODY] = INBOX_BODY_COLUMN_MAX, [HV_EVENT] = INBOX_BODY_COLUMN_MAX,
		[HV_CONTEXT] = INBOX_PROPS_COLUMN_MAX, [HV_VERSION] = LC_VERSION_MAX,
	};
	struct inbox_hrow *r;
	size_t need = 0;
	int64_t id, n;

	if (ncols != HV_N + 2 || inbox_col_i64(v[0], &id) != ST_OK || inbox_col_i64(v[HV_N + 1], &n) != ST_OK)
		return ST_ERR_DB;
	for (int c = 0; c < HV_N; c++) {
		bool nullable = c == HV_PROPS || c == HV_EVENT || c == HV_CONTEXT || c == HV_VERSION;

		if ((v[1 + c] == NULL && !nullable) || lens[1 + c] > cap[c])
			return ST_ERR_DB; /* the schema's widths and ours disagree */
		need += lens[1 + c] + 1;
	}
	if (ib->nhrows == ib->hrows_cap) {
		int ncap = ib->hrows_cap > 0 ? 2 * ib->hrows_cap : 64;
		void *p = realloc(ib->hrows, (size_t)ncap * sizeof *ib->hrows);

		if (p == NULL)
			return ST_ERR_NOMEM;
		ib->hrows = p;
		ib->hrows_cap = ncap;
	}
	if (ib->hcap - ib->hlen < need) {
		size_t ncap = ib->hcap > 0 ? 2 * ib->hcap : 64 * 1024;
		void *p;

		while (ncap - ib->hlen < need)
			ncap *= 2;
		p = realloc(ib->hbuf, ncap);
		if (p == NULL)
			return ST_ERR_NOMEM;
		ib->hbuf = p;
		ib->hcap = ncap;
	}
	r = &ib->hrows[ib->nhrows++];
	*r = (struct inbox_hrow){ .id = id, .matched = n };
	for (int c = 0; c < HV_N; c++) {
		r->off[c] = ib->hlen;
		r->len[c] = lens[1 + c];
		if (v[1 + c] == NULL)
			r->null |= 1u << c;
		else
			memcpy(ib->hbuf + ib->hlen, v[1 + c], lens[1 + c]);
		ib->hbuf[ib->hlen + lens[1 + c]] = '\0';
		ib->hlen += lens[1 + c] + 1;
	}
	return ST_OK;
}

/* Value c of held row r: NUL-terminated, or NULL for SQL NULL. */
static const char *inbox_hval(const struct inbox *ib, const struct inbox_hrow *r, int c)
{
	return (r->null & (1u << c)) != 0 ? NULL : ib->hbuf + r->off[c];
}

/*
 * A read of held events back whole, by order and oldest first (the order
 * in which their order's lifecycle runs them): those of the orders listed
 * with an id above after, or the rows listed by id.  It carries at most
 * INBOX_HELD_READ_MAX (always the first row): the window sums what the
 * rows before each one hold, and the join reads the values of only the
 * rows within it.  n is how many rows of its order the condition matched,
 * within the bound or not, so the reader knows whether it has them all.
 * One statement, so it goes in the claim's request as well as alone.
 */
void inbox_sql_held_read(struct inbox *ib, struct sqlbuf *q, const char *const *orders, int norders,
                         const int64_t *ids, int nids, int64_t after)
{
	int n = orders != NULL ? norders : nids;

	sqlbuf_sql(q, "SELECT h.id, h.order_id, h.source, h.message_id, h.type, h.routing_key, h.props, h.body,"
	              " h.event, h.context, h.lifecycle_version, t.n FROM (SELECT id, COUNT(*) OVER (PARTITION BY order_id) AS n,"
	              " COALESCE(SUM(LENGTH(body) + COALESCE(LENGTH(props), 0) + COALESCE(LENGTH(event), 0)"
	              " + COALESCE(LENGTH(context), 0) + ");
	sqlbuf_i64(q, INBOX_HELD_ROW_COST);
	sqlbuf_sql(q, ") OVER (ORDER BY order_id, id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS ahead"
	              " FROM held_events WHERE consumer = ");
	sqlbuf_str(q, ib->conf->consumer);
	sqlbuf_sql(q, orders != NULL ? " AND order_id IN (" : " AND id IN (");
	sqlbuf_list(q);
	for (int i = 0; i < n; i++) {
		sqlbuf_item(q);
		if (orders != NULL)
			sqlbuf_str(q, orders[i]);
		else
			sqlbuf_i64(q, ids[i]);
	}
	sqlbuf_sql(q, ") AND id > ");
	sqlbuf_i64(q, after);
	sqlbuf_sql(q, ") t JOIN held_events h ON h.id = t.id WHERE t.ahead < ");
	sqlbuf_i64(q, INBOX_HELD_READ_MAX);
	sqlbuf_sql(q, " ORDER BY h.order_id, h.id;");
}

/* Give each locked order its held events among ib->hrows (read with the
 * claim, by order): a run of rows of one order.  hall: they are all it
 * has (n says how many matched), or it has none; else the rest is read a
 * page at a time on release.  A second run of one order (ids equal under
 * the column's collation) is left to those pages. */
int inbox_held_assign(struct inbox *ib)
{
	for (int i = 0; i < ib->norders; i++)
		ib->orders[i].hall = ib->orders[i].held == 0;
	for (int i = 0, j; i < ib->nhrows; i = j) {
		const char *oid = inbox_hval(ib, &ib->hrows[i], HV_ORDER);
		struct inbox_agg *o = inbox_find_order(ib, oid);

		for (j = i + 1; j < ib->nhrows && strcmp(inbox_hval(ib, &ib->hrows[j], HV_ORDER), oid) == 0; j++)
			;
		if (o == NULL)
			return ST_ERR_DB; /* a row we did not ask for */
		if (o->hcount > 0) {
			o->hall = false;
			continue;
		}
		o->hfirst = i;
		o->hcount = j - i;
		o->hlast = ib->hrows[j - 1].id;
		o->hall = ib->hrows[i].matched == j - i;
	}
	return ST_OK;
}

static int inbox_held_page_row(void *arg, int stmt, const char *const *v, const unsigned long *lens, int ncols)
{
	return stmt == 0 ? inbox_hrow_add(arg, v, lens, ncols) : ST_ERR_DB;
}

/* Read the next page of order o's held events, those above after, onto
 * the end of ib->hrows (one round trip); *complete: none is left beyond
 * them. */
static int inbox_held_page(struct inbox *ib, const struct inbox_agg *o, int64_t after, bool *complete)
{
	struct sqlbuf *q = &ib->req;
	const char *id = o->id;
	int from = ib->nhrows, rc;

	sqlbuf_reset(q);
	inbox_sql_held_read(ib, q, &id, 1, NULL, 0, after);
	rc = sqlbuf_err(q);
	if (rc == ST_OK)
		rc = db_multi(ib->db, q->p, q->len, inbox_held_page_row, ib);
	sqlbuf_reset(q);
	*complete = ib->nhrows == from || ib->hrows[from].matched == ib->nhrows - from;
	return rc;
}

/* A held row as the release reads it: h its key and type, x its
 * canonical event and context, raw its routing key, properties and body
 * (borrowed from ib->hbuf until the rows are cut). */
static void inbox_hrow_event(const struct inbox *ib, const struct inbox_hrow *r, struct inbox_held *h,
                             struct inbox_held_more *x, struct inbox_event *raw)
{
	h->id = r->id;
	snprintf(h->source, sizeof h->source, "%s", inbox_hval(ib, r, HV_SOURCE));
	snprintf(h->message_id, sizeof h->message_id, "%s", inbox_hval(ib, r, HV_MID));
	snprintf(h->type, sizeof h->type, "%s", inbox_hval(ib, r, HV_TYPE));
	*raw = (struct inbox_event){
		.source = h->source, .message_id = h->message_id, .type_name = h->type,
		.body = inbox_hval(ib, r, HV_BODY), .len = r->len[HV_BODY], .routing_key = inbox_hval(ib, r, HV_RK),
		.props = inbox_hval(ib, r, HV_PROPS),
	};
	x->event = inbox_hval(ib, r, HV_EVENT);
	x->event_len = r->len[HV_EVENT];
	env_context_from_json(inbox_hval(ib, r, HV_CONTEXT), &x->ctx);
}

/* A held event held under another version of the definition than the
 * one that has just decided it (the worker was started by a changed
 * definition while it waited): said, since its outcome may be one the
 * old version would not have given. */
static void inbox_held_log_version(const struct inbox *ib, const struct inbox_agg *o, const struct inbox_hrow *r,
                                   const struct inbox_held *h, const char *outcome)
{
	const char *was = inbox_hval(ib, r, HV_VERSION), *now = ib->bind->def->version;

	if (was != NULL && strcmp(was, now) == 0)
		return;
	LOG(LOG_LEVEL_INFO, "held event decided by another definition version", LOG_S("message_id", h->message_id),
	    LOG_S("order", o->id), LOG_S("type", h->type), LOG_S("held_under", was != NULL ? was : "unrecorded"),
	    LOG_S("decided_by", now), LOG_S("outcome", outcome));
}

/* Re-evaluate one held event, read back whole, on the locked order.  One
 * that must still wait is left alone (*settled false); any other is
 * parsed again and carried out exactly as if it had just arrived, then
 * leaves held_events.  *changed: the order row changed. */
static int inbox_release_one(struct inbox *ib, struct inbox_agg *o, const struct inbox_hrow *r,
                             struct inbox_result *res, bool *settled, bool *changed)
{
	const char *type = inbox_hval(ib, r, HV_TYPE);
	struct inbox_held h;
	struct inbox_held_more x;
	struct inbox_event raw, ev;
	struct agg_verdict v;
	struct msg m;
	enum msg_reason reason;
	int t = msg_type_from_name(type, r->len[HV_TYPE]);
	int rc;

	*settled = false;
	*changed = false;
	if (t < 0)
		return ST_ERR_DB; /* we only ever store validated types */
	v = agg_decide(o->state, o->flags, (enum msg_type)t);
	if (v.decision == LC_HOLD)
		return ST_OK;
	inbox_hrow_event(ib, r, &h, &x, &raw);
	raw.order_id = o->id;
	/* Its lines carry its trace (the worker's are of the delivery in hand). */
	log_trace_set(x.ctx.trace_id, x.ctx.span_id);
	reason = inbox_held_parse(&h, &x, o->id, &raw, &m);
	if (reason == MSG_REASON_NONE && lc_sequenced(ib->bind->def)) {
		bool taken;

		v = inbox_seq_verdict(o, m.seq, v, &taken);
		if (taken) {
			rc = inbox_seq_taken(ib, o, &raw, m.seq, SRC_HELD_ROW, res);
			reason = MSG_REASON_PAYLOAD_CONFLICT;
			goto settled;
		}
		if (v.decision == LC_HOLD) {
			log_trace_clear();
			return ST_OK; /* not its number's turn yet */
		}
	}
	if (reason != MSG_REASON_NONE) {
		rc = inbox_held_reject(ib, &raw, reason, m.detail, res);
	} else {
		inbox_event_from_msg(&ev, &m, raw.body, raw.len, raw.routing_key, raw.props);
		ev.ctx = &x.ctx;
		rc = inbox_act(ib, o, &ev, v, SRC_HELD_ROW, res, changed, &reason);
	}
settled:
	if (rc != ST_OK) {
		log_trace_clear();
		return rc;
	}
	sqlbuf_item(&ib->w[W_DEL]);
	sqlbuf_i64(&ib->w[W_DEL], h.id);
	*settled = true;
	res->released_as[reason != MSG_REASON_NONE ? INBOX_DEAD_LETTERED : (enum inbox_outcome)v.decision]++;
	res->released_reason[reason]++;
	inbox_held_log_version(ib, o, r, &h, reason != MSG_REASON_NONE ? "dead_lettered" : lc_decision_outcome(v.decision));
	LOG(LOG_LEVEL_DEBUG, "held event settled", LOG_S("message_id", h.message_id), LOG_S("order", o->id),
	    LOG_S("outcome", reason != MSG_REASON_NONE ? "dead_lettered" : lc_decision_outcome(v.decision)));
	log_trace_clear();
	return ST_OK;
}

/* Re-evaluate the held rows [from, to) of ib->hrows (all of order o's),
 * oldest first, those not settled yet. */
static int inbox_release_rows(struct inbox *ib, struct inbox_agg *o, int from, int to, struct inbox_result *res,
                              int *released, bool *progress)
{
	for (int i = from; i < to && o->held > 0; i++) {
		bool settled, changed;
		int rc;

		if (ib->hrows[i].settled)
			continue;
		rc = inbox_release_one(ib, o, &ib->hrows[i], res, &settled, &changed);
		if (rc != ST_OK)
			return rc;
		if (settled) {
			ib->hrows[i].settled = true;
			o->held--;
			o->held_dirty = true;
			(*released)++;
			*progress = *progress || changed;
		}
	}
	return ST_OK;
}

/* The held events of order o that the claim's read left out (they
 * outgrew it), a page at a time after the last one it read; each page is
 * forgotten once looked at, so memory stays at one read.  Rows a page
 * releases leave held_events (the write so far is sent) before the next
 * page is read, so a later pass never reads them again. */
static int inbox_release_paged(struct inbox *ib, struct inbox_agg *o, struct inbox_result *res, int *released,
                               bool *progress)
{
	int64_t after = o->hlast;
	int mark = ib->nhrows;
	size_t mark_len = ib->hlen;
	bool complete = false;
	int rc = ST_OK;

	while (rc == ST_OK && !complete && o->held > 0) {
		if (ib->w[W_DEL].len > 0)
			rc = inbox_flush(ib, false);
		if (rc == ST_OK)
			rc = inbox_held_page(ib, o, after, &complete);
		if (rc == ST_OK)
			rc = inbox_release_rows(ib, o, mark, ib->nhrows, res, released, progress);
		if (ib->nhrows > mark)
			after = ib->hrows[ib->nhrows - 1].id;
		ib->nhrows = mark;
		ib->hlen = mark_len;
	}
	return rc;
}

/* Re-evaluate the order's events held in memory earlier in this batch, in
 * arrival order (newer than any in held_events): one that can take effect
 * now does, exactly as if it had just arrived (it was parsed from the
 * delivery in hand), and never reaches held_events.  *progress: the order
 * changed. */
static int inbox_release_pending(struct inbox *ib, struct inbox_agg *o, struct inbox_result *res,
                                 int *released, bool *progress)
{
	for (int k = 0; k < ib->npend && o->pending > 0; k++) {
		const struct inbox_in *in;
		struct inbox_event ev;
		struct agg_verdict v;
		enum msg_reason reason = MSG_REASON_NONE;
		char *props = NULL;
		bool changed = false, taken = false;
		int rc;

		if (ib->pend[k] < 0)
			continue;
		in = &ib->in[ib->pend[k]];
		if (strcmp(in->msg->order_id, o->id) != 0)
			continue;
		v = agg_decide(o->state, o->flags, in->msg->type);
		if (lc_sequenced(ib->bind->def))
			v = inbox_seq_verdict(o, in->msg->seq, v, &taken);
		if (v.decision == LC_HOLD && !taken)
			continue;
		inbox_event_from_msg(&ev, in->msg, in->body, in->len, in->routing_key, NULL);
		ev.deliveries = in->deliveries;
		ev.ctx = in->ctx;
		if (taken) {
			/* a later event of this batch took its number */
			rc = inbox_seq_taken(ib, o, &ev, in->msg->seq, SRC_HELD_MEM, res);
			if (rc != ST_OK)
				return rc;
			ib->pend[k] = -1;
			o->pending--;
			(*released)++;
			res->released_as[INBOX_DEAD_LETTERED]++;
			res->released_reason[MSG_REASON_PAYLOAD_CONFLICT]++;
			continue;
		}
		if ((v.decision == LC_INVALID || effects_count(ib->bind->def, (int)in->msg->type) > 0) &&
		    in->props_json != NULL) {
			props = in->props_json(in->props_arg);
			ev.props = props;
		}
		rc = inbox_act(ib, o, &ev, v, SRC_HELD_MEM, res, &changed, &reason);
		free(props);
		if (rc != ST_OK)
			return rc;
		ib->pend[k] = -1;
		o->pending--;
		(*released)++;
		*progress = *progress || changed;
		/* the enums agree up to DEAD_LETTERED */
		res->released_as[reason != MSG_REASON_NONE ? INBOX_DEAD_LETTERED : (enum inbox_outcome)v.decision]++;
		res->released_reason[reason]++;
	}
	return ST_OK;
}

/* Re-evaluate every held event of the order, oldest first — those in
 * held_events (read with the claim, and any the claim's read left out a
 * page at a time), then those held in memory in this batch — in passes
 * until a pass leaves the order as it found it: an event skipped early in
 * a pass may apply after a later one changed the order.  Passes over what
 * the claim read cost no round trip, however many events wait. */
int inbox_release_held(struct inbox *ib, struct inbox_agg *o, struct inbox_result *res)
{
	bool progress = true;
	int released = 0, rc = ST_OK;

	while (rc == ST_OK && progress && (o->held > 0 || o->pending > 0)) {
		progress = false;
		rc = inbox_release_rows(ib, o, o->hfirst, o->hfirst + o->hcount, res, &released, &progress);
		if (rc == ST_OK && !o->hall)
			rc = inbox_release_paged(ib, o, res, &released, &progress);
		if (rc == ST_OK)
			rc = inbox_release_pending(ib, o, res, &released, &progress);
	}
	if (rc != ST_OK)
		return rc;
	res->released += released;
	return ST_OK;
}

/* Hold an event: in memory for now (the rest of the batch may release
 * it, and then it never costs a row); inbox_hold_write keeps it in
 * held_events if it is still held when the batch ends. */
void inbox_hold(struct inbox *ib, const struct inbox_in *in, struct inbox_agg *o)
{
	ib->pend[ib->npend++] = (int)(in - ib->in);
	o->pending++;
}

/* Keep a still-held event in held_events, count it on its order's lock
 * row, and record the 'held' outcome. */
void inbox_hold_write(struct inbox *ib, const struct inbox_in *in, struct inbox_agg *o)
{
	char *props = in->props_json != NULL ? in->props_json(in->props_arg) : NULL;
	char *context = env_context_json(in->ctx);
	struct sqlbuf *b = &ib->w[W_HOLD];
	struct inbox_event ev;

	inbox_event_from_msg(&ev, in->msg, in->body, in->len, in->routing_key, NULL);
	sqlbuf_row(b);
	sqlbuf_str(b, ib->conf->consumer);
	sqlbuf_str(b, ev.source);
	sqlbuf_str(b, ev.message_id);
	sqlbuf_str(b, ev.order_id);
	sqlbuf_str(b, ev.type_name);
	sqlbuf_str(b, ev.routing_key);
	sqlbuf_str(b, props);
	sqlbuf_bytes(b, ev.body, ev.len);
	sqlbuf_value(b, "NOW(6)");
	if (in->event != NULL)
		sqlbuf_bytes(b, in->event, strlen(in->event));
	else
		sqlbuf_value(b, "NULL");
	sqlbuf_str(b, context); /* NULL prints NULL */
	sqlbuf_value(b, ib->sql.version_lit); /* what it is held under */
	sqlbuf_row_end(b);
	free(props);
	free(context);
	inbox_w_outcome(ib, &ev, "held", NULL, true);
	o->held++;
	o->held_dirty = true;
}

/* ---- hold expiry ------------------------------------------------------ */
/* A held event past its TTL, as listed. */
struct inbox_expiring {
	int64_t id;
	char order_id[MSG_ORDER_ID_MAX + 1];
};

/* What the log says of an expired hold once its transaction committed. */
struct inbox_expired {
	char message_id[MSG_WIDE_ID_MAX + 1];
	char order_id[MSG_ORDER_ID_MAX + 1];
	char type[MSG_TYPE_NAME_MAX + 1];
	struct env_context ctx;
};

/* Up to limit held events past the TTL, oldest first (one round trip; it
 * takes no lock, and the transaction it opens goes on). */
static int inbox_expire_list(struct inbox *ib, struct inbox_expiring *rows, int limit, int *n)
{
	struct db_param p[3] = { DBP_STR(ib->conf->consumer), DBP_I64(ib->conf->hold_ttl_s), DBP_I64(limit) };
	struct inbox_expiring spill; /* LIMIT keeps the rows within limit; spill is for safety */
	int rc = db_stmt_query(ib->expired_list, p, ARRAY_LEN(p));

	*n = 0;
	while (rc == ST_OK) {
		struct inbox_expiring *r = *n < limit ? &rows[*n] : &spill;
		struct db_col c[2] = { DBC_I64(), DBC_STR(r->order_id, sizeof r->order_id) };
		int f = db_stmt_fetch(ib->expired_list, c, ARRAY_LEN(c));

		if (f <= 0)
			return f;
		r->id = c[0].i64;
		if (*n < limit)
			(*n)++;
	}
	return rc;
}

/* The expiry request's rows: statement 0 locks the orders (no rows), 1
 * reads them and 2 the listed held events still there, as the claim's
 * statements 3 and 4 do. */
static int inbox_expire_row(void *arg, int stmt, const char *const *v, const unsigned long *lens, int ncols)
{
	return stmt == 0 ? ST_ERR_DB : inbox_claim_row(arg, stmt + 2, v, lens, ncols);
}

/* Lock the orders of the n listed rows (sorted, the claim's real write)
 * and read them and those rows whole in one round trip.  A row its order
 * released meanwhile is not read; nor one past what a read carries (the
 * next pass takes it). */
static int inbox_expire_read(struct inbox *ib, const struct inbox_expiring *rows, int n)
{
	struct sqlbuf *q = &ib->req;
	int64_t ids[INBOX_EXPIRE_MAX];
	int k = 0, rc;

	for (int i = 0; i < n; i++) {
		ib->order_ids[i] = rows[i].order_id;
		ids[i] = rows[i].id;
	}
	qsort(ib->order_ids, (size_t)n, sizeof *ib->order_ids, inbox_str_cmp);
	for (int i = 0; i < n; i++)
		if (k == 0 || strcmp(ib->order_ids[k - 1], ib->order_ids[i]) != 0)
			ib->order_ids[k++] = ib->order_ids[i];
	ib->nlock = k;
	sqlbuf_reset(q);
	inbox_sql_lock_orders(ib, q);
	inbox_sql_read_orders(ib, q);
	sqlbuf_sql(q, ";");
	inbox_sql_held_read(ib, q, NULL, 0, ids, n, 0);
	rc = sqlbuf_err(q);
	ib->norders = 0;
	ib->nhrows = 0;
	ib->hlen = 0;
	if (rc == ST_OK)
		rc = db_multi(ib->db, q->p, q->len, inbox_expire_row, ib);
	sqlbuf_reset(q);
	if (rc == ST_OK && ib->norders != ib->nlock)
		rc = ST_ERR_DB; /* every order was just written */
	if (rc == ST_OK)
		qsort(ib->orders, (size_t)ib->norders, sizeof *ib->orders, inbox_order_cmp);
	return rc;
}

/* Why a held event expires: in a sequenced definition only a missing
 * number holds one. */
static const char *inbox_expiry_reason(const struct inbox *ib)
{
	return msg_reason_name(lc_sequenced(ib->bind->def) ? MSG_REASON_SEQUENCE_GAP : MSG_REASON_HOLD_EXPIRED);
}

/* Dead-letter every held row read back (past its TTL, under its order's
 * lock) into the write: its copy through the outbox, its outcome, its
 * row deleted, its order's held count.  log[*n]: what to log of each. */
static int inbox_expire_write(struct inbox *ib, struct inbox_expired *log, int *n)
{
	for (int i = 0; i < ib->nhrows; i++) {
		const struct inbox_hrow *r = &ib->hrows[i];
		struct inbox_agg *o = inbox_find_order(ib, inbox_hval(ib, r, HV_ORDER));
		struct inbox_held h;
		struct inbox_held_more x;
		struct inbox_event ev;
		char detail[INBOX_DETAIL_MAX];
		int rc;

		if (o == NULL)
			return ST_ERR_DB; /* a row we did not ask for */
		inbox_hrow_event(ib, r, &h, &x, &ev);
		ev.order_id = o->id;
		if (lc_sequenced(ib->bind->def)) {
			/* what it waited for: the number after the aggregate's */
			struct inbox_event raw = ev;
			struct msg m;

			if (inbox_held_parse(&h, &x, o->id, &raw, &m) == MSG_REASON_NONE)
				snprintf(detail, sizeof detail, "%s (number %lld) held longer than INBOX_HOLD_TTL (%lds): number "
				         "%lld of %s %s never came", h.type, (long long)m.seq, ib->conf->hold_ttl_s,
				         (long long)(o->version + 1), ib->bind->def->aggregate, o->id);
			else
				snprintf(detail, sizeof detail, "%s held longer than INBOX_HOLD_TTL (%lds): number %lld of %s %s "
				         "never came", h.type, ib->conf->hold_ttl_s, (long long)(o->version + 1),
				         ib->bind->def->aggregate, o->id);
		} else {
			snprintf(detail, sizeof detail, "%s held longer than INBOX_HOLD_TTL (%lds) without its prerequisite",
			         h.type, ib->conf->hold_ttl_s);
		}
		rc = inbox_w_dead_letter(ib, &ev, inbox_expiry_reason(ib), detail);
		if (rc != ST_OK)
			return rc;
		inbox_w_outcome(ib, &ev, "dead_lettered", inbox_expiry_reason(ib), false);
		sqlbuf_item(&ib->w[W_DEL]);
		sqlbuf_i64(&ib->w[W_DEL], r->id);
		o->held = o->held > 0 ? o->held - 1 : 0;
		o->held_dirty = true;
		snprintf(log[*n].message_id, sizeof log[*n].message_id, "%s", h.message_id);
		snprintf(log[*n].order_id, sizeof log[*n].order_id, "%s", o->id);
		snprintf(log[*n].type, sizeof log[*n].type, "%s", h.type);
		log[*n].ctx = x.ctx;
		(*n)++;
	}
	return ST_OK;
}

/*
 * One pass of hold expiry, in one transaction of three round trips however
 * many rows it expires: list them, lock their orders and read them back
 * whole, then the write and the COMMIT (before issue 43 each row had a
 * transaction of four round trips).  A row released meanwhile by a batch
 * that held its order is passed over; only its order's lock was written.
 */
int inbox_expire_holds(struct inbox *ib, int limit, int *expired)
{
	struct inbox_expiring rows[INBOX_EXPIRE_MAX];
	struct inbox_expired *log = NULL;
	int n = 0, nlog = 0, rc;

	*expired = 0;
	if (limit > INBOX_EXPIRE_MAX)
		limit = INBOX_EXPIRE_MAX;
	if (limit <= 0)
		return ST_OK;
	rc = inbox_expire_list(ib, rows, limit, &n);
	if (rc != ST_OK || n == 0) {
		db_rollback(ib->db); /* end the read-only transaction */
		return rc;
	}
	rc = inbox_reserve(ib, n);
	if (rc == ST_OK) {
		log = malloc((size_t)n * sizeof *log);
		rc = log != NULL ? ST_OK : ST_ERR_NOMEM;
	}
	ib->emit = NULL; /* the relay publishes what expiry writes */
	if (rc == ST_OK)
		rc = inbox_expire_read(ib, rows, n);
	if (rc == ST_OK)
		rc = inbox_expire_write(ib, log, &nlog);
	/* No fault hooks here: those stand for a message's transaction. */
	rc = inbox_end(ib, rc, false);
	for (int i = 0; rc == ST_OK && i < nlog; i++) {
		log_trace_set(log[i].ctx.trace_id, log[i].ctx.span_id);
		LOG(LOG_LEVEL_INFO, "hold expired", LOG_S("message_id", log[i].message_id), LOG_S("order", log[i].order_id),
		    LOG_S("type", log[i].type), LOG_S("outcome", "dead_lettered"), LOG_S("reason", inbox_expiry_reason(ib)));
		log_trace_clear();
	}
	if (rc == ST_OK)
		*expired = nlog;
	free(log);
	return rc;
}
