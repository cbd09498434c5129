/*
 * verify_read.c - the database and queue readers of inbox-loadgen verify.
 *
 * Everything is matched by id, so rows of other runs in the same database
 * are ignored (the run prefix selects ours).  The two queues are browsed,
 * not drained (v_browse): every message read is put back, so verify can
 * run again on the same ledger and other runs' messages stay.
 */
#include "verify_read.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "deadletter.h"
#include "fault.h"
#include "lifecycle_emit.h"
#include "log.h"
#include "mq.h"
#include "publish.h"
#include "status.h"

static const char *const v_outcomes[6] = { "applied", "compensated", "ignored", "dead_lettered", "held", "other" };

static int v_outcome_index(const char *s)
{
	for (int i = 0; i < 5; i++) {
		if (strcmp(s, v_outcomes[i]) == 0)
			return i;
	}
	return 5;
}

/* One integer from a query with the run's LIKE pattern (and the consumer
 * when with_consumer). */
static int v_count(struct v_state *st, const char *sql, bool with_consumer, int64_t *out)
{
	struct db_stmt *q = NULL;
	struct db_param p[2];
	struct db_col c[] = { DBC_I64() };
	int n = 0, rc;

	if (with_consumer)
		p[n++] = DBP_STR(st->conf->consumer);
	p[n++] = DBP_STR(st->like);
	rc = db_prepare(st->db, &q, sql);
	if (rc == ST_OK) {
		int r = db_stmt_query_row(q, p, n, c, ARRAY_LEN(c));
		if (r < 0)
			rc = r;
		else if (r == 1)
			*out = c[0].is_null ? 0 : c[0].i64;
	}
	db_rollback(st->db);
	return rc;
}

static int v_ready_messages(struct v_state *st, struct mq *m, uint32_t *ready)
{
	const struct cfg *c = st->conf;
	int nq = c->ordering == CFG_ORDERING_SHARDED ? c->shards : 1;

	*ready = 0;
	for (int i = 0; i < nq; i++) {
		char q[300];
		uint32_t n = 0;
		int rc;

		if (mq_consume_queue_name(c, i, q, sizeof q) != 0)
			return ST_ERR_INVALID;
		rc = mq_queue_counts(m, q, &n, NULL);
		if (rc != ST_OK)
			return rc;
		*ready += n;
	}
	return ST_OK;
}

static int v_browse(struct v_state *st, const char *queue, void (*on_msg)(struct v_state *, const struct mq_delivery *));
static void v_delivery_id(const struct mq_delivery *d, char *buf, size_t cap);

/* A DLQ copy of ours that the judge will count: the reason the ledger
 * expects, or a conflict's. */
static void v_on_dead_probe(struct v_state *st, const struct mq_delivery *d)
{
	char id[MSG_WIDE_ID_MAX + 8], reason[V_REASON_MAX];
	long i;

	v_delivery_id(d, id, sizeof id);
	if (!v_ours(st, id, strlen(id)) || mq_delivery_header(d, DEADLETTER_REASON, reason, sizeof reason) != ST_OK)
		return;
	i = v_map_find(&st->mmap, id, strlen(id), v_msg_name, st->msgs, -1);
	if (i < 0)
		return;
	if (!st->msgs[i].effect && strcmp(reason, st->msgs[i].reason) == 0)
		st->probe_dead[i]++;
	else if (st->msgs[i].conflicts > 0 && strcmp(reason, "payload-conflict") == 0)
		st->probe_conflicts[i]++;
}

/* Whether every dead letter the run must leave is in the DLQ, by id and
 * reason: a count cannot tell, since a dead letter may be there twice (the
 * DLQ is at-least-once) while another is still on its way.  *ok false
 * when one is missing; the failure of a browse otherwise. */
static int v_dead_letters_there(struct v_state *st, bool *ok)
{
	int rc;

	*ok = false;
	if (st->probe_dead == NULL)
		st->probe_dead = calloc(st->nmsgs + 1, sizeof *st->probe_dead);
	if (st->probe_conflicts == NULL)
		st->probe_conflicts = calloc(st->nmsgs + 1, sizeof *st->probe_conflicts);
	if (st->probe_dead == NULL || st->probe_conflicts == NULL)
		return ST_ERR_NOMEM;
	memset(st->probe_dead, 0, (st->nmsgs + 1) * sizeof *st->probe_dead);
	memset(st->probe_conflicts, 0, (st->nmsgs + 1) * sizeof *st->probe_conflicts);
	rc = v_browse(st, st->conf->dlq, v_on_dead_probe);
	if (rc != ST_OK)
		return rc;
	for (size_t i = 0; i < st->nmsgs; i++)
		if ((!st->msgs[i].effect && st->probe_dead[i] == 0) || st->probe_conflicts[i] < st->msgs[i].conflicts)
			return ST_OK;
	*ok = true;
	return ST_OK;
}

/* What the ledger says the run must leave behind before it can be
 * judged: an inbox row for each valid original, and in the DLQ at least
 * one copy per message that must be dead-lettered and per conflicting
 * copy (other runs' dead letters only make the DLQ longer). */
static void v_expected_traces(const struct v_state *st, int64_t *rows, int64_t *dead, int64_t *emitted)
{
	*rows = json_integer_value(json_object_get(st->run, "originals"));
	*dead = 0;
	for (size_t i = 0; i < st->nmsgs; i++)
		*dead += (st->msgs[i].effect ? 0 : 1) + st->msgs[i].conflicts;
	*emitted = 0;
	for (size_t i = 0; i < st->norders; i++)
		*emitted += lc_sequenced(st->def) ? st->orders[i].ninst : __builtin_popcount(st->orders[i].emits);
}

/*
 * Settled, and judged, only when every message of the run has left its
 * trace: no ready message in the inbox queue(s), no held event, no unsent
 * outbox row, an inbox row for every valid original, at least as many
 * dead letters in the DLQ as the run must leave, and the row count
 * unchanged for a second, and then every dead letter the ledger expects
 * found in the DLQ by id and reason.  A client cannot see unacknowledged deliveries
 * (a passive declare counts ready ones only, and a quorum queue whose
 * leader does not answer says 0), so "quiet for a while" is no proof: a
 * delivery a worker holds (a 20 s lock wait, a reset on its way back) is
 * neither ready nor recorded.  What is not there yet is waited for until
 * --timeout; a message really lost is reported then.  A broker or
 * database that is away for a moment (the end of a chaos run) is waited
 * for within the same bound; the last error is reported if it never
 * comes back.
 */
/* What v_wait_idle counts each round. */
struct v_traces {
	uint32_t ready, dead, emitted;
	int64_t held, pending, rows;
};

/* Connect what is not connected.  ST_OK, a fault to wait out (last_err
 * says it), or a refusal (logged): the caller gives up. */
static int v_connect(struct v_state *st, struct mq **m, char *last_err, size_t cap)
{
	int rc = ST_OK;

	if (*m == NULL) {
		rc = mq_open_why(m, &st->conf->amqp, st->conf->heartbeat_s, "inbox-loadgen-verify", last_err, cap);
		if (st_refusal(rc)) {
			log_refused(rc, "amqp", st->conf->amqp.user, st->conf->amqp.redacted, last_err);
			return rc;
		}
	}
	if (st->db == NULL && rc == ST_OK) {
		rc = db_open_why(&st->db, &st->conf->db, last_err, cap);
		if (st_refusal(rc)) {
			mq_close(m);
			log_refused(rc, "db", st->conf->db.user, st->conf->db.redacted, last_err);
		}
	}
	return rc;
}

/* The queues' and the tables' counts; a link that fails is closed, to be
 * connected again next round (last_err says why). */
static int v_count_traces(struct v_state *st, struct mq **m, struct v_traces *t, char *last_err, size_t cap)
{
	int rc = v_ready_messages(st, *m, &t->ready);

	if (rc == ST_OK)
		rc = mq_queue_counts(*m, st->conf->dlq, &t->dead, NULL);
	if (rc == ST_OK && st->verify_queue[0] != '\0')
		rc = mq_queue_counts(*m, st->verify_queue, &t->emitted, NULL);
	if (rc != ST_OK) {
		snprintf(last_err, cap, "queue counts: %s", mq_errmsg(*m));
		mq_close(m);
		return rc;
	}
	rc = v_count(st, "SELECT COUNT(*) FROM held_events WHERE consumer = ? AND message_id LIKE ?", true, &t->held);
	if (rc == ST_OK)
		rc = v_count(st, "SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL AND order_id LIKE ?", false, &t->pending);
	if (rc == ST_OK)
		rc = v_count(st, "SELECT COUNT(*) FROM processed_messages WHERE consumer = ? AND message_id LIKE ?", true,
		             &t->rows);
	if (rc != ST_OK) {
		snprintf(last_err, cap, "database: %s", db_errmsg(st->db));
		db_close(&st->db);
	}
	return rc;
}

int v_wait_idle(struct v_state *st, int timeout_s)
{
	struct mq *m = NULL;
	double end = lg_mono() + timeout_s, stable_since = 0, last_probe = 0;
	bool probed = false; /* the DLQ was read by id and found short */
	int64_t last_rows = -1, expected, dead_expected, emit_expected;
	bool tty = isatty(2) != 0;
	char last_err[256] = "";
	int rc = ST_OK;

	v_expected_traces(st, &expected, &dead_expected, &emit_expected);
	if (st->verify_queue[0] == '\0')
		emit_expected = 0; /* a ledger from before the verify queue: not counted */
	for (;;) {
		struct v_traces t = { 0, 0, 0, 0, 0, 0 };
		double now;

		rc = v_connect(st, &m, last_err, sizeof last_err);
		if (st_refusal(rc))
			return rc;
		if (rc == ST_OK)
			rc = v_count_traces(st, &m, &t, last_err, sizeof last_err);
		now = lg_mono();
		if (rc == ST_OK) {
			if (t.rows != last_rows) {
				last_rows = t.rows;
				stable_since = now;
			}
			/* The DLQ is read by id only once the counts say it can
			 * be complete, and then at most every two seconds. */
			/* The emitted queue too: a browse that another verifier
			 * lost its link in the middle of leaves its messages
			 * unacked until the broker gives that connection up
			 * (its heartbeat); judged before, they would be missing
			 * here and there again later (issue 43). */
			if (t.ready == 0 && t.held == 0 && t.pending == 0 && t.rows >= expected && t.dead >= dead_expected &&
			    t.emitted >= emit_expected && now - stable_since >= 1.0 && now - last_probe >= 2.0) {
				bool there = false;

				last_probe = now;
				probed = true;
				rc = v_dead_letters_there(st, &there);
				if (rc == ST_OK && there)
					break;
				if (rc != ST_OK)
					snprintf(last_err, sizeof last_err, "reading %s", st->conf->dlq);
			}
		}
		if (now > end) {
			if (rc != ST_OK) {
				fprintf(stderr, "%sinbox-loadgen: %s\n", tty ? "\n" : "", last_err);
				break;
			}
			fprintf(stderr,
			        "%sinbox-loadgen: not idle after %d s (ready %u, held %lld, outbox pending %lld, rows %lld/%lld,"
			        " dead letters %u/%lld%s, emitted %u/%lld); verifying anyway\n", tty ? "\n" : "", timeout_s,
			        t.ready, (long long)t.held, (long long)t.pending, (long long)t.rows, (long long)expected, t.dead,
			        (long long)dead_expected, probed ? ", but not every one the run needs" : "", t.emitted,
			        (long long)emit_expected);
			break;
		}
		if (tty && rc == ST_OK)
			fprintf(stderr, "\rwaiting for the worker: ready %u, held %lld, outbox %lld, inbox rows %lld/%lld   ",
			        t.ready, (long long)t.held, (long long)t.pending, (long long)t.rows, (long long)expected);
		rc = ST_OK;
		lg_sleep_ms(500);
	}
	if (tty)
		fprintf(stderr, "\r%-90s\r", "");
	mq_close(&m);
	return rc == ST_OK ? 0 : -1;
}

static int v_read_inbox(struct v_state *st)
{
	struct db_stmt *q = NULL;
	struct db_param p[] = { DBP_STR(st->conf->consumer), DBP_STR(st->like) };
	char id[MSG_WIDE_ID_MAX + 1], outcome[20], reason[V_REASON_MAX], sha[65];
	size_t cap = 1024;
	int rc, r;

	st->lat = malloc(cap * sizeof *st->lat);
	if (st->lat == NULL)
		return ST_ERR_NOMEM;
	st->first_pub = INT64_MAX;
	st->last_done = INT64_MIN;
	/* Times relative to a fixed DATETIME, so the session time zone does
	 * not matter. */
	rc = db_prepare(st->db, &q,
	                "SELECT message_id, outcome, COALESCE(reason, ''), payload_sha256,"
	                " TIMESTAMPDIFF(MICROSECOND, '2020-01-01', published_at),"
	                " TIMESTAMPDIFF(MICROSECOND, '2020-01-01', processed_at), held_at IS NOT NULL"
	                " FROM processed_messages WHERE consumer = ? AND message_id LIKE ?");
	if (rc == ST_OK)
		rc = db_stmt_query(q, p, ARRAY_LEN(p));
	while (rc == ST_OK) {
		struct db_col c[] = { DBC_STR(id, sizeof id), DBC_STR(outcome, sizeof outcome),
		                      DBC_STR(reason, sizeof reason), DBC_STR(sha, sizeof sha), DBC_I64(), DBC_I64(),
		                      DBC_I64() };
		int oi;
		long i;

		r = db_stmt_fetch(q, c, ARRAY_LEN(c));
		if (r <= 0) {
			rc = r;
			break;
		}
		oi = v_outcome_index(outcome);
		st->outcome_count[oi]++;
		if (c[6].i64 != 0) {
			st->held_total++;
			if (oi == 4)
				st->held_still++;
			else if (strcmp(reason, "hold-expired") == 0)
				st->held_expired++;
			else if (oi < 4)
				st->held_released[oi]++;
		}
		if (!c[4].is_null) {
			if (st->nlat == cap) {
				int64_t *n = realloc(st->lat, cap * 2 * sizeof *n);
				if (n == NULL) {
					db_stmt_done(q);
					rc = ST_ERR_NOMEM;
					break;
				}
				st->lat = n;
				cap *= 2;
			}
			st->lat[st->nlat++] = c[5].i64 - c[4].i64;
			if (c[4].i64 < st->first_pub)
				st->first_pub = c[4].i64;
		}
		if (c[5].i64 > st->last_done)
			st->last_done = c[5].i64;
		i = v_map_find(&st->mmap, id, strlen(id), v_msg_name, st->msgs, -1);
		if (i < 0) {
			v_add(&st->unexpected, "%s: inbox row (%s) for a message the ledger does not know", id, outcome);
			continue;
		}
		st->msgs[i].row = true;
		snprintf(st->msgs[i].got_outcome, sizeof st->msgs[i].got_outcome, "%s", outcome);
		snprintf(st->msgs[i].got_reason, sizeof st->msgs[i].got_reason, "%s", reason);
		snprintf(st->msgs[i].got_sha, sizeof st->msgs[i].got_sha, "%s", sha);
	}
	db_rollback(st->db);
	return rc;
}

/* v_read_inbox, v_read_events and v_read_orders share the shape of every
 * row loop over db.h (prepare, query, fetch until 0, rollback) and nothing
 * else: their columns, maps and records differ, so a common loop would
 * take a callback and a column array each and say less. */
static int v_read_events(struct v_state *st)
{
	struct db_stmt *q = NULL;
	struct db_param p[] = { DBP_STR(st->conf->consumer), DBP_STR(st->like) };
	char id[MSG_WIDE_ID_MAX + 1], sql[256];
	int rc, r;

	/* Counted per message id, not per (consumer, source, message_id): a
	 * second effect of one message is a double whatever else differs.
	 * The table name is the definition's, [a-z][a-z0-9_]* (lc_load). */
	snprintf(sql, sizeof sql, "SELECT message_id, COUNT(*) FROM `%s` WHERE consumer = ?"
	         " AND message_id LIKE ? GROUP BY message_id", st->tables[1]);
	rc = db_prepare(st->db, &q, sql);
	if (rc == ST_OK)
		rc = db_stmt_query(q, p, ARRAY_LEN(p));
	while (rc == ST_OK) {
		struct db_col c[] = { DBC_STR(id, sizeof id), DBC_I64() };
		long i;

		r = db_stmt_fetch(q, c, ARRAY_LEN(c));
		if (r <= 0) {
			rc = r;
			break;
		}
		i = v_map_find(&st->mmap, id, strlen(id), v_msg_name, st->msgs, -1);
		if (i < 0)
			v_add(&st->unexpected, "%s: %s row for a message the ledger does not know", id, st->tables[1]);
		else
			st->msgs[i].events = c[1].i64;
	}
	db_rollback(st->db);
	return rc;
}

static int v_read_orders(struct v_state *st)
{
	struct db_stmt *q = NULL;
	struct db_param p[] = { DBP_STR(st->like) };
	char id[MSG_ORDER_ID_MAX + 1], status[24], sql[160];
	int rc, r;

	snprintf(sql, sizeof sql, "SELECT id, status, version FROM `%s` WHERE id LIKE ?", st->tables[0]);
	rc = db_prepare(st->db, &q, sql);
	if (rc == ST_OK)
		rc = db_stmt_query(q, p, ARRAY_LEN(p));
	while (rc == ST_OK) {
		struct db_col c[] = { DBC_STR(id, sizeof id), DBC_STR(status, sizeof status), DBC_I64() };
		long i;

		r = db_stmt_fetch(q, c, ARRAY_LEN(c));
		if (r <= 0) {
			rc = r;
			break;
		}
		i = v_map_find(&st->omap, id, strlen(id), v_order_name, st->orders, -1);
		if (i < 0) {
			v_add(&st->unexpected, "%s: %s row the ledger does not know", id, st->def->aggregate);
			continue;
		}
		st->orders[i].found = true;
		snprintf(st->orders[i].got_status, sizeof st->orders[i].got_status, "%s", status);
		st->orders[i].got_version = c[2].i64;
	}
	db_rollback(st->db);
	return rc;
}

/* The message id of a queued message: its property, else its body's. */
static void v_delivery_id(const struct mq_delivery *d, char *buf, size_t cap)
{
	buf[0] = '\0';
	if (d->props.message_id != NULL) {
		snprintf(buf, cap, "%.*s", (int)d->props.message_id_len, d->props.message_id);
		return;
	}
	{
		json_error_t jerr;
		json_t *o = json_loadb(d->body, d->len, 0, &jerr);
		v_copy(buf, cap, json_object_get(o, "message_id"));
		json_decref(o);
	}
}

/* Browse a queue: basic.get every message that is ready, without acking,
 * then reject them all with requeue.  The verifier only reads — a second
 * run on the same ledger sees the same queues, and other runs' messages
 * stay.  basic.get rather than a consumer: a held (unacked) message is not
 * handed out again, so each is seen once, and the browse stops at the
 * ready count of a passive declare taken first (the run is settled, and
 * nothing we requeue could come back to the head while we still read).
 * The requeue happens only after the whole queue is read; a classic queue
 * puts each message back in its place.  The passive declare after the
 * rejects is a round trip behind them on the same channel, so when this
 * returns the queue holds them again. */
static int v_browse(struct v_state *st, const char *queue, void (*on_msg)(struct v_state *, const struct mq_delivery *))
{
	struct mq *m = NULL;
	struct mq_delivery d;
	uint64_t *tags = NULL;
	uint32_t ready = 0, after = 0;
	size_t n = 0;
	char why[300];
	int rc;

	/* Heartbeats on: should this verifier's link go silent with the
	 * messages in hand, the broker gives the connection up and puts them
	 * back within two intervals (without, it held them until TCP gave up,
	 * and the next verify found them missing: issue 43). */
	rc = mq_open_why(&m, &st->conf->amqp, st->conf->heartbeat_s, "inbox-loadgen-verify", why, sizeof why);
	if (rc == ST_OK)
		rc = mq_queue_counts(m, queue, &ready, NULL);
	if (st_refusal(rc))
		log_refused(rc, "amqp", st->conf->amqp.user, st->conf->amqp.redacted, why);
	else if (rc != ST_OK) {
		fprintf(stderr, "inbox-loadgen: cannot read %s: %s\n", queue, m ? mq_errmsg(m) : why);
		mq_close(&m);
		return rc;
	}
	if (ready > 0) {
		tags = malloc((size_t)ready * sizeof *tags);
		if (tags == NULL) {
			mq_close(&m);
			return ST_ERR_NOMEM;
		}
	}
	memset(&d, 0, sizeof d);
	while (n < ready) {
		rc = mq_get(m, queue, &d);
		if (rc == ST_ERR_NOT_FOUND) {
			rc = ST_OK; /* fewer than counted: another reader took some */
			break;
		}
		if (rc != ST_OK) {
			fprintf(stderr, "inbox-loadgen: reading %s: %s\n", queue, mq_errmsg(m));
			break;
		}
		tags[n++] = d.tag;
		on_msg(st, &d);
		mq_delivery_release(m, &d);
	}
	if (fault_hit("verify-stop-before-requeue"))
		(void)raise(SIGSTOP); /* test hook: the messages stay unacked on a silent link */
	for (size_t i = 0; i < n && rc == ST_OK; i++) {
		rc = mq_reject(m, tags[i], true);
		if (rc != ST_OK)
			fprintf(stderr, "inbox-loadgen: requeueing %s: %s\n", queue, mq_errmsg(m));
	}
	if (rc == ST_OK)
		rc = mq_queue_counts(m, queue, &after, NULL);
	/* On an error the connection's close requeues what is still unacked. */
	mq_close(&m);
	free(tags);
	return rc;
}

static void v_tally_reason(struct v_state *st, const char *reason)
{
	int i;

	for (i = 0; i < st->ndead_reasons; i++) {
		if (strcmp(st->dead_by_reason[i].reason, reason) == 0)
			break;
	}
	if (i == st->ndead_reasons) {
		if (i == V_DEAD_REASONS)
			i--; /* more kinds than SPEC.md has: the last slot takes the rest */
		else
			st->ndead_reasons++;
		snprintf(st->dead_by_reason[i].reason, sizeof st->dead_by_reason[i].reason, "%s", reason);
	}
	st->dead_by_reason[i].n++;
}

static void v_on_dead(struct v_state *st, const struct mq_delivery *d)
{
	char id[MSG_WIDE_ID_MAX + 8], reason[V_REASON_MAX];
	struct v_msg *m;
	long i;

	v_delivery_id(d, id, sizeof id);
	if (!v_ours(st, id, strlen(id))) {
		st->foreign++;
		return;
	}
	if (mq_delivery_header(d, DEADLETTER_REASON, reason, sizeof reason) != ST_OK)
		snprintf(reason, sizeof reason, "(none)");
	v_tally_reason(st, reason);
	i = v_map_find(&st->mmap, id, strlen(id), v_msg_name, st->msgs, -1);
	if (i < 0) {
		v_add(&st->unexpected, "%s: dead-lettered (%s), not in the ledger", id, reason);
		return;
	}
	m = &st->msgs[i];
	if (mq_delivery_header(d, DEADLETTER_REASON, reason, sizeof reason) != ST_OK)
		m->bare_hits++;
	if (!m->effect && strcmp(reason, m->reason) == 0)
		m->dlq_hits++;
	else if (m->conflicts > 0 && strcmp(reason, "payload-conflict") == 0)
		m->conflict_hits++;
	else
		v_add(&st->unexpected, "%s: dead-lettered as %s", id, reason);
}

/* An emitted message: its kind counted for its order, and its id held to
 * the rule downstream consumers deduplicate by: every copy of one effect
 * carries its kind's stable id (lc_emit_id: "<type>:<order>", or
 * "<type>:<order>:<cause>" for a type several events emit) as its AMQP
 * message-id (and, when the body names an id, the same there).  A copy
 * under that id again is a re-publish (the outbox is at-least-once:
 * allowed); one under another id, or without one, is an effect a consumer
 * would take twice: WRONG.  Native and CloudEvents (structured: "id",
 * "subject") bodies. */
static unsigned v_emit_kind(const struct v_state *st, const char *type, const char *order, const char *prop,
                            char *stable, size_t cap)
{
	unsigned first = 0;

	stable[0] = '\0';
	for (int k = 0; k < st->def->nemits; k++) {
		char id[LG_ID_MAX];

		if (strcmp(st->def->emits[k], type) != 0 || lc_emit_id(st->def, k, order, id, sizeof id) < 0)
			continue;
		if (first == 0) {
			first = 1u << k;
			snprintf(stable, cap, "%s", id);
		}
		if (strcmp(id, prop) == 0) {
			snprintf(stable, cap, "%s", id);
			return 1u << k;
		}
	}
	return first; /* of the type, but under no id of its kinds: stable says the first */
}

/* A numbered definition's emitted message: one of its order's events of
 * the ledger by kind and cause number, its id the kind's stable id with
 * ":<number>" (outbox.c), which a loop makes differ for one kind. */
static void v_on_numbered(struct v_state *st, struct v_order *od, const char *type, const char *prop,
                          const char *body_id)
{
	char id[LG_ID_MAX + 24], want[LG_ID_MAX + 24] = "", base[LG_ID_MAX + 32] = "";

	for (int j = 0; j < od->ninst; j++) {
		int k = od->inst_kind[j];
		size_t n;

		if (strcmp(st->def->emits[k], type) != 0 || lc_emit_id(st->def, k, od->id, id, sizeof id) < 0)
			continue;
		n = strlen(id);
		snprintf(base, sizeof base, "%s:", id);
		snprintf(id + n, sizeof id - n, ":%d", od->inst_num[j]);
		if (want[0] == '\0')
			snprintf(want, sizeof want, "%s", id);
		if (strcmp(id, prop) != 0)
			continue;
		if (body_id != NULL && strcmp(body_id, id) != 0) {
			st->wrong_ids++;
			v_add(&st->wrong, "%s: %s emitted under message-id %s but body id %s: a second effect downstream",
			      od->id, type, prop, body_id);
		} else if (od->seen_inst & (1u << j)) {
			st->republished++; /* the same id again: downstream dedups it */
		}
		od->seen_inst |= 1u << j;
		return;
	}
	if (want[0] == '\0') {
		v_add(&st->unexpected, "%s: emitted %s, not in the ledger", od->id, type);
		return;
	}
	/* its kind's stable id, for a number whose event the ledger does not
	 * expect to emit it: an effect too many, not a wrong id */
	if (strncmp(prop, base, strlen(base)) == 0 && prop[strlen(base)] != '\0' &&
	    strspn(prop + strlen(base), "0123456789") == strlen(prop + strlen(base))) {
		v_add(&st->unexpected, "%s: emitted %s for number %s, which the ledger does not expect to emit it", od->id,
		      type, prop + strlen(base));
		return;
	}
	st->wrong_ids++;
	v_add(&st->wrong, "%s: %s emitted under message-id %s, not the stable id of one of its causes (%s, ...)",
	      od->id, type, prop[0] ? prop : "(none)", want);
}

static void v_on_emitted(struct v_state *st, const struct mq_delivery *d)
{
	json_error_t jerr;
	json_t *o = json_loadb(d->body, d->len, 0, &jerr);
	bool ce = json_object_get(o, "specversion") != NULL;
	const char *type = json_string_value(json_object_get(o, "type"));
	const char *order = json_string_value(json_object_get(o, ce ? "subject" : st->def->key));
	const char *body_id = json_string_value(json_object_get(o, ce ? "id" : "message_id"));
	char stable[LG_ID_MAX], prop[MSG_WIDE_ID_MAX + 1] = "";
	unsigned bit;
	long i;

	if (type == NULL || order == NULL || !v_ours(st, order, strlen(order))) {
		st->foreign++;
		json_decref(o);
		return;
	}
	if (d->props.message_id != NULL)
		snprintf(prop, sizeof prop, "%.*s", (int)d->props.message_id_len, d->props.message_id);
	i = v_map_find(&st->omap, order, strlen(order), v_order_name, st->orders, -1);
	if (i >= 0 && lc_sequenced(st->def)) {
		v_on_numbered(st, &st->orders[i], type, prop, body_id);
		json_decref(o);
		return;
	}
	bit = v_emit_kind(st, type, order, prop, stable, sizeof stable);
	if (i < 0 || bit == 0 || !(st->orders[i].emits & bit)) {
		v_add(&st->unexpected, "%s: emitted %s, not in the ledger", order, type);
		json_decref(o);
		return;
	}
	if (prop[0] == '\0' || strcmp(prop, stable) != 0 || (body_id != NULL && strcmp(body_id, stable) != 0))
		st->wrong_ids++;
	if (prop[0] == '\0')
		v_add(&st->wrong, "%s: %s emitted without a message-id (its stable id is %s)", order, type, stable);
	else if (strcmp(prop, stable) != 0 || (body_id != NULL && strcmp(body_id, stable) != 0))
		v_add(&st->wrong, "%s: %s emitted under message-id %s (body %s), not its stable id %s: a second effect"
		      " downstream", order, type, prop, body_id != NULL ? body_id : "-", stable);
	else if (st->orders[i].seen & bit)
		st->republished++; /* the same id again: downstream dedups it */
	st->orders[i].seen |= bit;
	json_decref(o);
}

int v_read_db(struct v_state *st)
{
	int rc = v_read_inbox(st);

	if (rc == ST_OK)
		rc = v_read_events(st);
	if (rc == ST_OK)
		rc = v_read_orders(st);
	return rc;
}

int v_read_queues(struct v_state *st)
{
	int rc = v_browse(st, st->conf->dlq, v_on_dead);

	if (rc == ST_OK)
		rc = v_browse(st, st->verify_queue, v_on_emitted);
	return rc;
}
