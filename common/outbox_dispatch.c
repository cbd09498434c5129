/*
 * outbox_dispatch.c - the committing thread's dispatcher (see
 * outbox_dispatch.h): the copies of a transaction's rows, their publish,
 * their confirms and the marks, and the publisher they go out on.
 */
#include "outbox_dispatch.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "fault.h"
#include "log.h"
#include "metrics.h"
#include "outbox_int.h"
#include "status.h"

/* Copies of one transaction in flight before the next waits for confirms. */
#define OUTBOX_DISPATCH_WINDOW 128
_Static_assert(OUTBOX_DISPATCH_WINDOW < MQ_TRACK_MAX, "a window's outcomes must all be remembered");
/* How often an idle publisher is serviced (heartbeats). */
#define OUTBOX_KEEPALIVE_MS 500
/* What an idle thread waits for work while confirms are due. */
#define OUTBOX_CONFIRM_POLL_MS 2

#define DISPATCH_KV(d) LOG_I("worker", (d)->index)

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void outbox_dispatcher_init(struct outbox_dispatcher *d, const struct cfg *conf, const char *name, int index)
{
	*d = (struct outbox_dispatcher){ .conf = conf, .name = name, .index = index };
}

static void sent_free(struct outbox_sent *sent)
{
	outbox_mem_free(&sent->mem);
	free(sent->seq);
	free(sent->ok);
	*sent = (struct outbox_sent){ 0 };
}

static void mark_free(struct outbox_mark *mk)
{
	for (int k = 0; k < mk->nexcept; k++)
		free(mk->except[k]);
	free(mk->except);
	*mk = (struct outbox_mark){ 0 };
}

static void marks_clear(struct outbox_dispatcher *d)
{
	for (int i = 0; i < d->nmarks; i++)
		mark_free(&d->marks[i]);
	d->nmarks = 0;
}

void outbox_dispatcher_free(struct outbox_dispatcher *d)
{
	mq_close(&d->pub);
	outbox_mem_free(&d->mem);
	for (int i = 0; i < OUTBOX_INFLIGHT_MAX; i++)
		sent_free(&d->ring[i]);
	d->nsent = 0;
	marks_clear(d);
}

/* ---- the transaction's side ------------------------------------------- */

struct outbox_mem *outbox_dispatcher_begin(struct outbox_dispatcher *d, int64_t claim)
{
	if (d == NULL)
		return NULL;
	outbox_mem_reset(&d->mem);
	d->mem.claim = claim;
	return &d->mem;
}

void outbox_dispatcher_abort(struct outbox_dispatcher *d)
{
	if (d != NULL)
		outbox_mem_reset(&d->mem); /* nothing of it was committed */
}

void outbox_dispatcher_write_marks(const struct outbox_dispatcher *d, struct sqlbuf *b)
{
	const struct outbox_mark *mk = d != NULL ? d->marks : NULL;
	int n = d != NULL ? d->nmarks : 0;
	bool open = false;

	for (int i = 0; i < n; i++) {
		if (mk[i].nexcept > 0)
			continue;
		if (!open) {
			sqlbuf_stmt(b);
			sqlbuf_sql(b, "UPDATE outbox SET sent_at = NOW(6) WHERE sent_at IS NULL AND destination IS NULL"
			                 " AND claim IN (");
			sqlbuf_list(b);
			open = true;
		}
		sqlbuf_item(b);
		sqlbuf_i64(b, mk[i].claim);
	}
	if (open)
		sqlbuf_sql(b, ");");
	/* A row whose id an unacked copy of the same transaction shares is
	 * left to the sweep too: a duplicate downstream, never a loss. */
	for (int i = 0; i < n; i++) {
		if (mk[i].nexcept == 0)
			continue;
		sqlbuf_stmt(b);
		sqlbuf_sql(b, "UPDATE outbox SET sent_at = NOW(6) WHERE sent_at IS NULL AND destination IS NULL"
		                 " AND claim = ");
		sqlbuf_i64(b, mk[i].claim);
		sqlbuf_sql(b, " AND message_id NOT IN (");
		sqlbuf_list(b);
		for (int k = 0; k < mk[i].nexcept; k++) {
			sqlbuf_item(b);
			sqlbuf_str(b, mk[i].except[k]);
		}
		sqlbuf_sql(b, ");");
	}
}

void outbox_dispatcher_committed(struct outbox_dispatcher *d)
{
	if (d != NULL)
		marks_clear(d); /* written with the COMMIT */
}

int outbox_dispatcher_marks_pending(const struct outbox_dispatcher *d)
{
	return d != NULL ? d->nmarks : 0;
}

/* ---- publishing one transaction's copies ------------------------------ */

static int sent_room(struct outbox_sent *sent, int n)
{
	if (n > sent->cap) {
		uint64_t *seq = realloc(sent->seq, (size_t)n * sizeof *seq);
		bool *ok;

		if (seq == NULL)
			return ST_ERR_NOMEM;
		sent->seq = seq;
		ok = realloc(sent->ok, (size_t)n * sizeof *ok);
		if (ok == NULL)
			return ST_ERR_NOMEM;
		sent->ok = ok;
		sent->cap = n;
	}
	return ST_OK;
}

/*
 * As the relay publishes a row, from the copy: emitted events pipelined,
 * a dead-letter copy (mandatory) with nothing else in flight so that a
 * return is its own, and a row for an exchange the worker does not declare
 * alone.  What cannot be published from here (a copy whose headers do not
 * parse) is not charged to its row: the row is left unmarked and the sweep
 * publishes it with the relay's per-row failure handling, while the copies
 * after it go on.  sent takes mem's copies (a swap: mem gets the record's
 * emptied room back).  Returns ST_OK, ST_ERR_NOMEM, or the broker error
 * that ended it (every row of sent is then the sweep's).
 */
static int sent_publish(struct mq *pub, const struct cfg *conf, struct outbox_mem *mem, struct outbox_sent *sent)
{
	struct outbox_mem swap;
	uint64_t first;
	int rc;

	outbox_mem_reset(&sent->mem);
	swap = sent->mem;
	sent->mem = *mem;
	*mem = swap;
	sent->claim = sent->mem.claim;
	sent->n = sent->mem.n;
	sent->acked = 0;
	sent->settled = false;
	sent->first = sent->last = mq_next_seq(pub);
	rc = sent_room(sent, sent->n);
	if (rc != ST_OK)
		return rc;
	for (int i = 0; i < sent->n; i++)
		sent->seq[i] = 0, sent->ok[i] = false;
	if (sent->n == 0) {
		sent->settled = true;
		return ST_OK;
	}
	rc = mq_confirm_select(pub);
	if (rc != ST_OK)
		return rc;
	sent->first = first = mq_next_seq(pub);
	for (int i = 0; i < sent->n; i++) {
		const struct outbox_msg *c = &sent->mem.v[i];
		struct mq_header h[OUTBOX_HEADERS_MAX];
		json_t *keep = NULL;
		bool declared = strcmp(c->exchange, conf->out_exchange) == 0 || strcmp(c->exchange, conf->dlx) == 0;
		struct mq_message m = {
			.exchange = c->exchange, .routing_key = c->routing_key, .body = c->body, .len = c->len,
			.props_json = c->props, .message_id = c->message_id, .type = c->type, .headers = h,
			.mandatory = strcmp(c->exchange, conf->dlx) == 0,
		};
		uint64_t seq;

		m.nheaders = outbox_headers(c->headers, &keep, h, OUTBOX_HEADERS_MAX);
		if (m.nheaders < 0 || strlen(c->message_id) > OUTBOX_SHORTSTR_MAX ||
		    strlen(c->exchange) > OUTBOX_SHORTSTR_MAX || strlen(c->routing_key) > OUTBOX_SHORTSTR_MAX ||
		    strlen(c->type) > OUTBOX_SHORTSTR_MAX) {
			json_decref(keep);
			continue; /* the sweep charges it to its row */
		}
		/* A mandatory copy (or one to an exchange we do not declare)
		 * goes with nothing else in flight; the others in windows. */
		if ((m.mandatory || !declared || mq_next_seq(pub) - first >= OUTBOX_DISPATCH_WINDOW) &&
		    mq_unconfirmed(pub) > 0) {
			rc = mq_wait_confirms(pub, OUTBOX_CONFIRM_MS);
			if (outbox_broker_error(rc)) {
				json_decref(keep);
				return rc;
			}
		}
		if (mq_unconfirmed(pub) == 0)
			first = mq_next_seq(pub);
		seq = mq_next_seq(pub);
		rc = mq_publish(pub, &m);
		json_decref(keep);
		if (rc == ST_ERR_INVALID)
			continue; /* stored properties that do not parse: the sweep charges the row */
		if (rc == ST_OK)
			sent->seq[i] = seq;
		if (rc == ST_OK && (m.mandatory || !declared))
			rc = mq_wait_confirms(pub, OUTBOX_CONFIRM_MS);
		if (outbox_broker_error(rc))
			return rc;
	}
	sent->last = mq_next_seq(pub);
	return ST_OK; /* sent_settled tells when they are confirmed */
}

/* Whether every publish of sent has its outcome (then sent->ok and
 * sent->acked say which were acked); false while one is unconfirmed. */
static bool sent_settled(const struct mq *pub, struct outbox_sent *sent)
{
	if (sent->settled)
		return true;
	for (int i = 0; i < sent->n; i++)
		if (sent->seq[i] != 0 && mq_outcome(pub, sent->seq[i]) == MQ_OUTCOME_PENDING)
			return false;
	sent->acked = 0;
	for (int i = 0; i < sent->n; i++) {
		sent->ok[i] = sent->seq[i] != 0 && mq_outcome(pub, sent->seq[i]) == MQ_OUTCOME_ACKED;
		sent->acked += sent->ok[i];
	}
	sent->settled = true;
	return true;
}

/* The mark of a settled sent: every row of its claim but those whose
 * copies were not acked. */
static int mark_of(const struct outbox_sent *sent, struct outbox_mark *mk)
{
	int failed = sent->n - sent->acked;

	*mk = (struct outbox_mark){ .claim = sent->claim };
	if (failed == 0)
		return ST_OK;
	mk->except = calloc((size_t)failed, sizeof *mk->except);
	if (mk->except == NULL)
		return ST_ERR_NOMEM;
	for (int i = 0; i < sent->n; i++) {
		if (sent->ok[i])
			continue;
		mk->except[mk->nexcept] = strdup(sent->mem.v[i].message_id);
		if (mk->except[mk->nexcept] == NULL) {
			mark_free(mk);
			return ST_ERR_NOMEM;
		}
		mk->nexcept++;
	}
	return ST_OK;
}

/* ---- the thread's side ------------------------------------------------ */

/* The publisher failed or went silent: what it had in flight is unknown,
 * so its rows stay unmarked and the relay sweeps them after
 * INBOX_OUTBOX_SWEEP, under the same ids.  Dropped, not closed: a close
 * would wait for a reply that may never come. */
static void publisher_lost(struct outbox_dispatcher *d, const char *what)
{
	LOG(LOG_LEVEL_DEBUG, what, DISPATCH_KV(d), LOG_I("transactions", d->nsent),
	    LOG_S("error", outbox_dispatcher_errmsg(d)));
	d->nsent = 0;
	d->since_ms = 0;
	mq_drop(&d->pub);
	d->node++;
}

static int publisher_up(struct outbox_dispatcher *d)
{
	int rc;

	if (d->pub != NULL)
		return ST_OK;
	/* Heartbeats on, as for the consumer: the thread services the idle
	 * publisher (outbox_dispatcher_keepalive), and a link that went
	 * silent is found within the heartbeat instead of by a close that
	 * never returns. */
	rc = mq_open_from(&d->pub, &d->conf->amqp, d->conf->heartbeat_s, d->name, &d->node);
	if (rc != ST_OK)
		d->node++; /* a cluster's next node first */
	return rc;
}

void outbox_dispatcher_keepalive(struct outbox_dispatcher *d)
{
	int64_t now;

	if (d->pub == NULL)
		return;
	now = now_ms();
	if (now - d->keepalive_ms < OUTBOX_KEEPALIVE_MS)
		return;
	d->keepalive_ms = now;
	if (mq_keepalive(d->pub) != ST_OK)
		publisher_lost(d, "publisher lost while idle");
}

void outbox_dispatcher_poll(struct outbox_dispatcher *d, bool wait)
{
	struct outbox_sent done_v[OUTBOX_INFLIGHT_MAX];
	int rc, done = 0;

	if (d->nsent == 0)
		return;
	if (wait)
		metrics_confirm_wait();
	rc = wait ? mq_wait_confirms(d->pub, OUTBOX_CONFIRM_TIMEOUT_MS) : mq_poll_confirms(d->pub);
	if (outbox_broker_error(rc)) {
		publisher_lost(d, "outbox rows left to the relay: no confirms");
		return;
	}
	while (done < d->nsent && sent_settled(d->pub, &d->ring[done])) {
		const struct outbox_sent *s = &d->ring[done++];

		if (s->acked == 0)
			continue; /* the relay charges the rows that failed */
		metrics_outbox_dispatched(s->acked);
		if (d->nmarks >= OUTBOX_MARKS_MAX || mark_of(s, &d->marks[d->nmarks]) != ST_OK) {
			LOG(LOG_LEVEL_DEBUG, "outbox rows published, not marked: the relay publishes them again",
			    DISPATCH_KV(d), LOG_I("rows", s->acked));
			continue;
		}
		d->nmarks++;
	}
	/* The settled records go to the end of the ring with their room. */
	memcpy(done_v, d->ring, (size_t)done * sizeof d->ring[0]);
	memmove(d->ring, d->ring + done, (size_t)(OUTBOX_INFLIGHT_MAX - done) * sizeof d->ring[0]);
	memcpy(d->ring + OUTBOX_INFLIGHT_MAX - done, done_v, (size_t)done * sizeof d->ring[0]);
	d->nsent -= done;
}

void outbox_dispatcher_after_commit(struct outbox_dispatcher *d)
{
	int rc;

	if (d->mem.n == 0)
		return;
	if (fault_hit("crash-before-dispatch"))
		raise(SIGKILL); /* test hook: committed, not published */
	if (publisher_up(d) != ST_OK) {
		LOG(LOG_LEVEL_DEBUG, "outbox rows left to the relay: no publisher", DISPATCH_KV(d),
		    LOG_I("rows", d->mem.n));
		outbox_mem_reset(&d->mem);
		return;
	}
	outbox_dispatcher_poll(d, false);
	if (d->pub != NULL && (d->nsent == OUTBOX_INFLIGHT_MAX ||
	                       (d->nsent > 0 && mq_next_seq(d->pub) + (uint64_t)d->mem.n - d->ring[0].first >
	                                            MQ_TRACK_MAX / 2)))
		outbox_dispatcher_poll(d, true);
	if (d->pub == NULL) {
		outbox_mem_reset(&d->mem); /* lost while settling: the relay has these too */
		return;
	}
	rc = sent_publish(d->pub, d->conf, &d->mem, &d->ring[d->nsent]);
	outbox_mem_reset(&d->mem);
	if (rc == ST_ERR_NOMEM) {
		LOG(LOG_LEVEL_WARN, "outbox rows left to the relay: out of memory", DISPATCH_KV(d));
		return;
	}
	if (rc != ST_OK) {
		publisher_lost(d, "outbox rows left to the relay");
		return;
	}
	/* Its confirms are read before the next dispatch: a poll right now
	 * would find none and cost a system call a batch. */
	d->nsent++;
}

int outbox_dispatcher_idle(struct outbox_dispatcher *d, int wait_ms)
{
	outbox_dispatcher_poll(d, false);
	outbox_dispatcher_keepalive(d);
	if (d->nsent > 0) {
		/* Bounded per transaction: the oldest one in flight gets
		 * OUTBOX_CONFIRM_TIMEOUT_MS from when the thread first found
		 * it unconfirmed. */
		if (d->since_ms == 0 || d->oldest != d->ring[0].first) {
			d->since_ms = now_ms();
			d->oldest = d->ring[0].first;
		}
		wait_ms = OUTBOX_CONFIRM_POLL_MS;
		if (now_ms() - d->since_ms > OUTBOX_CONFIRM_TIMEOUT_MS)
			publisher_lost(d, "outbox rows left to the relay: no confirms");
	}
	if (d->nsent == 0)
		d->since_ms = 0;
	return wait_ms;
}

void outbox_dispatcher_drain(struct outbox_dispatcher *d)
{
	outbox_dispatcher_poll(d, true);
}

int outbox_dispatcher_publish(struct outbox_dispatcher *d, const struct mq_message *m)
{
	int rc = ST_ERR_MQ_CONN;

	for (int attempt = 0; attempt < 2; attempt++) {
		rc = publisher_up(d);
		if (rc != ST_OK)
			return rc;
		/* The copies in flight first: this publish's own outcome must
		 * not be one of theirs. */
		outbox_dispatcher_poll(d, true);
		if (d->pub == NULL)
			continue;
		rc = mq_publish_confirmed(d->pub, m, OUTBOX_CONFIRM_TIMEOUT_MS);
		if (rc == ST_OK || rc == ST_ERR_MQ_NACK)
			return rc;
		/* No confirm, or the link failed: dropped, not closed. */
		mq_drop(&d->pub);
		d->node++;
	}
	return rc;
}

const char *outbox_dispatcher_errmsg(const struct outbox_dispatcher *d)
{
	return d->pub != NULL ? mq_errmsg(d->pub) : "";
}
