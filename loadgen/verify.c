/*
 * verify.c - the verifying half of inbox-loadgen.
 *
 * It first waits, with a bound, until the run is settled: the inbox queue
 * holds no ready message, none of the run's events is held, its outbox rows
 * are all sent, and the number of its inbox rows has stopped changing.
 * Then it reads what the worker left behind — processed_messages,
 * order_events, orders, the dead-letter queue, and the `<out>.verify` queue
 * that publish bound to the out exchange — and holds each against the
 * ledger:
 *
 *   missing    an effect without its order_events row (or without an inbox
 *              row, or still held), an expected dead-letter or emitted
 *              message that never came;
 *   doubled    a message with more than one order_events row;
 *   wrong      an order whose status or version differs, an outcome or
 *              stored hash other than the ledger's;
 *   unexpected a dead-letter or emitted message the ledger does not foresee.
 *
 * Everything is matched by id, so rows of other runs in the same database
 * are ignored (the run prefix selects ours).  The two queues are browsed,
 * not drained (v_browse): every message read is put back, so verify can
 * run again on the same ledger and other runs' messages stay.
 */
#include "verify.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "db.h"
#include "mq.h"
#include "publish.h"
#include "scenario.h"
#include "status.h"

#define V_REASON_MAX 40
#define V_DEAD_REASONS 16
#define V_EMIT_REFUND 0x1u
#define V_EMIT_RELEASE 0x2u
#define V_EMIT_PAID 0x4u

struct v_order {
	char id[LG_ID_MAX];
	char status[24];
	unsigned version;
	unsigned emits;      /* expected V_EMIT_* */
	unsigned seen;       /* emitted messages seen */
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

static uint64_t v_hash(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ULL;

	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 1099511628211ULL;
	}
	return h;
}

static int v_map_init(struct v_map *m, size_t n)
{
	m->cap = 16;
	while (m->cap < n * 2 + 16)
		m->cap *= 2;
	m->slot = calloc(m->cap, sizeof *m->slot);
	return m->slot != NULL ? 0 : -1;
}

/* Find key (len bytes); names(i) gives entry i's id.  Returns the index
 * or -1; with insert >= 0 stores that index when absent. */
static long v_map_find(struct v_map *m, const char *key, size_t len, const char *(*name)(const void *, uint32_t),
                       const void *arr, long insert)
{
	size_t i = (size_t)v_hash(key, len) & (m->cap - 1);

	while (m->slot[i] != 0) {
		const char *n = name(arr, m->slot[i] - 1);
		if (strlen(n) == len && memcmp(n, key, len) == 0)
			return (long)m->slot[i] - 1;
		i = (i + 1) & (m->cap - 1);
	}
	if (insert >= 0)
		m->slot[i] = (uint32_t)insert + 1;
	return -1;
}

static const char *v_order_name(const void *arr, uint32_t i)
{
	return ((const struct v_order *)arr)[i].id;
}

static const char *v_msg_name(const void *arr, uint32_t i)
{
	return ((const struct v_msg *)arr)[i].id;
}

/* A list of problems: counted in full, the first `max` kept for the report. */
struct v_list {
	const char *title;
	long count;
	int max;
	char (*lines)[200];
};

__attribute__((format(printf, 2, 3)))
static void v_add(struct v_list *l, const char *fmt, ...)
{
	if (l->count < l->max) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(l->lines[l->count], sizeof l->lines[0], fmt, ap);
		va_end(ap);
	}
	l->count++;
}

struct v_state {
	const struct cfg *conf;
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
	long republished;   /* emitted messages seen more than once (allowed) */
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
};

static const char *const v_outcomes[6] = { "applied", "compensated", "ignored", "dead_lettered", "held", "other" };

static int v_outcome_index(const char *s)
{
	for (int i = 0; i < 5; i++) {
		if (strcmp(s, v_outcomes[i]) == 0)
			return i;
	}
	return 5;
}

static unsigned v_emit_bit(const char *name)
{
	if (strcmp(name, "RefundRequested") == 0)
		return V_EMIT_REFUND;
	if (strcmp(name, "InventoryReleaseRequested") == 0)
		return V_EMIT_RELEASE;
	if (strcmp(name, "OrderPaid") == 0)
		return V_EMIT_PAID;
	return 0;
}

static void v_copy(char *dst, size_t cap, json_t *v)
{
	snprintf(dst, cap, "%s", json_is_string(v) ? json_string_value(v) : "");
}

static int v_load(struct v_state *st, const char *path)
{
	FILE *f = fopen(path, "r");
	char *line = NULL;
	size_t lcap = 0, ocap = 0, mcap = 0;
	ssize_t n;
	long lineno = 0;
	int rc = -1;

	if (f == NULL) {
		fprintf(stderr, "inbox-loadgen: cannot read %s: %s\n", path, strerror(errno));
		return -1;
	}
	while ((n = getline(&line, &lcap, f)) > 0) {
		json_error_t jerr;
		json_t *o = json_loadb(line, (size_t)n, 0, &jerr);
		const char *k;

		lineno++;
		if (o == NULL || !json_is_object(o)) {
			fprintf(stderr, "inbox-loadgen: %s:%ld: not a ledger line: %s\n", path, lineno, jerr.text);
			json_decref(o);
			goto out;
		}
		k = json_string_value(json_object_get(o, "k"));
		if (k == NULL) {
			json_decref(o);
			continue;
		}
		if (strcmp(k, "run") == 0) {
			json_t *a = json_object_get(o, "orders"), *b = json_object_get(o, "messages");
			st->run = json_incref(o);
			v_copy(st->prefix, sizeof st->prefix, json_object_get(o, "prefix"));
			ocap = (size_t)json_integer_value(a) + 1;
			mcap = (size_t)json_integer_value(b) + 1;
			st->orders = calloc(ocap, sizeof *st->orders);
			st->msgs = calloc(mcap, sizeof *st->msgs);
			if (st->orders == NULL || st->msgs == NULL || v_map_init(&st->omap, ocap) != 0 ||
			    v_map_init(&st->mmap, mcap) != 0) {
				json_decref(o);
				goto out;
			}
		} else if (st->run == NULL) {
			fprintf(stderr, "inbox-loadgen: %s: the first line must be the run line\n", path);
			json_decref(o);
			goto out;
		} else if (strcmp(k, "order") == 0 && st->norders < ocap) {
			struct v_order *od = &st->orders[st->norders];
			json_t *e;
			size_t i;
			v_copy(od->id, sizeof od->id, json_object_get(o, "id"));
			v_copy(od->status, sizeof od->status, json_object_get(o, "status"));
			od->version = (unsigned)json_integer_value(json_object_get(o, "version"));
			json_array_foreach(json_object_get(o, "emits"), i, e) {
				if (json_is_string(e))
					od->emits |= v_emit_bit(json_string_value(e));
			}
			v_map_find(&st->omap, od->id, strlen(od->id), v_order_name, st->orders, (long)st->norders);
			st->norders++;
		} else if (strcmp(k, "msg") == 0 && st->nmsgs < mcap) {
			struct v_msg *m = &st->msgs[st->nmsgs];
			const char *ex = json_string_value(json_object_get(o, "expect"));
			v_copy(m->id, sizeof m->id, json_object_get(o, "id"));
			v_copy(m->order, sizeof m->order, json_object_get(o, "order"));
			v_copy(m->reason, sizeof m->reason, json_object_get(o, "reason"));
			v_copy(m->sha, sizeof m->sha, json_object_get(o, "sha256"));
			m->effect = ex != NULL && strcmp(ex, "effect") == 0;
			m->conflicts = (int)json_integer_value(json_object_get(o, "conflicts"));
			m->copies = (int)json_integer_value(json_object_get(o, "copies"));
			v_map_find(&st->mmap, m->id, strlen(m->id), v_msg_name, st->msgs, (long)st->nmsgs);
			st->nmsgs++;
		}
		json_decref(o);
	}
	if (st->run == NULL) {
		fprintf(stderr, "inbox-loadgen: %s holds no run line\n", path);
		goto out;
	}
	snprintf(st->like, sizeof st->like, "%s-%%", st->prefix);
	rc = 0;
out:
	free(line);
	fclose(f);
	return rc;
}

static bool v_ours(const struct v_state *st, const char *id, size_t len)
{
	size_t pl = strlen(st->prefix);
	return len > pl && memcmp(id, st->prefix, pl) == 0 && id[pl] == '-';
}

/* One integer from a query with the run's LIKE pattern (and the consumer
 * when with_consumer). */
static int v_count(struct v_state *st, const char *sql, bool with_consumer, int64_t *out)
{
	struct db_stmt *q = NULL;
	struct db_param p[2];
	struct db_col c[1] = { DBC_I64() };
	int n = 0, rc;

	if (with_consumer)
		p[n++] = DBP_STR(st->conf->consumer);
	p[n++] = DBP_STR(st->like);
	rc = db_prepare(st->db, &q, sql);
	if (rc == ST_OK)
		rc = db_stmt_query(q, p, n);
	if (rc == ST_OK) {
		int r = db_stmt_fetch(q, c, 1);
		if (r < 0)
			rc = r;
		else if (r == 1) {
			*out = c[0].is_null ? 0 : c[0].i64;
			db_stmt_done(q);
		}
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

/* Wait until the run is settled or timeout_s passes (then verify anyway
 * and let the report show what is missing).  A broker or database that is
 * away for a moment (the end of a chaos run) is waited for within the same
 * bound; the last error is reported if it never comes back. */
static int v_wait_idle(struct v_state *st, int timeout_s)
{
	struct mq *m = NULL;
	double end = lg_mono() + timeout_s, stable_since = 0;
	int64_t last_rows = -1;
	int64_t expected = json_integer_value(json_object_get(st->run, "originals"));
	bool tty = isatty(2) != 0;
	char last_err[256] = "";
	int rc = ST_OK;

	for (;;) {
		uint32_t ready = 0;
		int64_t held = 0, pending = 0, rows = 0;
		double now;

		if (m == NULL) {
			rc = mq_open(&m, &st->conf->amqp, 0, "inbox-loadgen-verify");
			if (rc != ST_OK)
				snprintf(last_err, sizeof last_err, "broker: %s", st_strerror(rc));
		}
		if (st->db == NULL && rc == ST_OK) {
			rc = db_open(&st->db, &st->conf->db);
			if (rc != ST_OK) {
				snprintf(last_err, sizeof last_err, "database: %s",
				         st->db != NULL ? db_errmsg(st->db) : st_strerror(rc));
				db_close(&st->db);
			}
		}
		if (rc == ST_OK) {
			rc = v_ready_messages(st, m, &ready);
			if (rc != ST_OK) {
				snprintf(last_err, sizeof last_err, "queue counts: %s", mq_errmsg(m));
				mq_close(&m);
			}
		}
		if (rc == ST_OK) {
			rc = v_count(st, "SELECT COUNT(*) FROM held_events WHERE consumer = ? AND message_id LIKE ?", true,
			             &held);
			if (rc == ST_OK)
				rc = v_count(st, "SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL AND order_id LIKE ?", false,
				             &pending);
			if (rc == ST_OK)
				rc = v_count(st,
				             "SELECT COUNT(*) FROM processed_messages WHERE consumer = ? AND message_id LIKE ?",
				             true, &rows);
			if (rc != ST_OK) {
				snprintf(last_err, sizeof last_err, "database: %s", db_errmsg(st->db));
				db_close(&st->db);
			}
		}
		now = lg_mono();
		if (rc == ST_OK) {
			if (rows != last_rows) {
				last_rows = rows;
				stable_since = now;
			}
			if (ready == 0 && held == 0 && pending == 0) {
				/* All rows there: one quiet second is enough; otherwise
				 * give in-flight deliveries five seconds to show up. */
				double need = rows >= expected ? 1.0 : 5.0;
				if (now - stable_since >= need)
					break;
			}
		}
		if (now > end) {
			if (rc != ST_OK) {
				fprintf(stderr, "%sinbox-loadgen: %s\n", tty ? "\n" : "", last_err);
				break;
			}
			fprintf(stderr,
			        "%sinbox-loadgen: not idle after %d s (ready %u, held %lld, outbox pending %lld, rows %lld/%lld);"
			        " verifying anyway\n", tty ? "\n" : "", timeout_s, ready, (long long)held, (long long)pending,
			        (long long)rows, (long long)expected);
			break;
		}
		if (tty && rc == ST_OK)
			fprintf(stderr, "\rwaiting for the worker: ready %u, held %lld, outbox %lld, inbox rows %lld/%lld   ",
			        ready, (long long)held, (long long)pending, (long long)rows, (long long)expected);
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
	struct db_param p[2] = { DBP_STR(st->conf->consumer), DBP_STR(st->like) };
	char id[MSG_ID_MAX + 1], outcome[20], reason[V_REASON_MAX], sha[65];
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
		rc = db_stmt_query(q, p, 2);
	while (rc == ST_OK) {
		struct db_col c[7] = { DBC_STR(id, sizeof id), DBC_STR(outcome, sizeof outcome),
		                       DBC_STR(reason, sizeof reason), DBC_STR(sha, sizeof sha), DBC_I64(), DBC_I64(),
		                       DBC_I64() };
		int oi;
		long i;

		r = db_stmt_fetch(q, c, 7);
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

static int v_read_events(struct v_state *st)
{
	struct db_stmt *q = NULL;
	struct db_param p[2] = { DBP_STR(st->conf->consumer), DBP_STR(st->like) };
	char id[MSG_ID_MAX + 1];
	int rc, r;

	/* Counted per message id, not per (consumer, source, message_id): a
	 * second effect of one message is a double whatever else differs. */
	rc = db_prepare(st->db, &q, "SELECT message_id, COUNT(*) FROM order_events WHERE consumer = ?"
	                            " AND message_id LIKE ? GROUP BY message_id");
	if (rc == ST_OK)
		rc = db_stmt_query(q, p, 2);
	while (rc == ST_OK) {
		struct db_col c[2] = { DBC_STR(id, sizeof id), DBC_I64() };
		long i;

		r = db_stmt_fetch(q, c, 2);
		if (r <= 0) {
			rc = r;
			break;
		}
		i = v_map_find(&st->mmap, id, strlen(id), v_msg_name, st->msgs, -1);
		if (i < 0)
			v_add(&st->unexpected, "%s: order_events row for a message the ledger does not know%s", id, "");
		else
			st->msgs[i].events = c[1].i64;
	}
	db_rollback(st->db);
	return rc;
}

static int v_read_orders(struct v_state *st)
{
	struct db_stmt *q = NULL;
	struct db_param p[1] = { DBP_STR(st->like) };
	char id[MSG_ORDER_ID_MAX + 1], status[24];
	int rc, r;

	rc = db_prepare(st->db, &q, "SELECT id, status, version FROM orders WHERE id LIKE ?");
	if (rc == ST_OK)
		rc = db_stmt_query(q, p, 1);
	while (rc == ST_OK) {
		struct db_col c[3] = { DBC_STR(id, sizeof id), DBC_STR(status, sizeof status), DBC_I64() };
		long i;

		r = db_stmt_fetch(q, c, 3);
		if (r <= 0) {
			rc = r;
			break;
		}
		i = v_map_find(&st->omap, id, strlen(id), v_order_name, st->orders, -1);
		if (i < 0) {
			v_add(&st->unexpected, "%s: order row the ledger does not know%s", id, "");
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
	int rc;

	rc = mq_open(&m, &st->conf->amqp, 0, "inbox-loadgen-verify");
	if (rc == ST_OK)
		rc = mq_queue_counts(m, queue, &ready, NULL);
	if (rc != ST_OK) {
		fprintf(stderr, "inbox-loadgen: cannot read %s: %s\n", queue, m ? mq_errmsg(m) : st_strerror(rc));
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
	char id[MSG_ID_MAX + 8], reason[V_REASON_MAX];
	struct v_msg *m;
	long i;

	v_delivery_id(d, id, sizeof id);
	if (!v_ours(st, id, strlen(id))) {
		st->foreign++;
		return;
	}
	if (mq_delivery_header(d, "x-inbox-reason", reason, sizeof reason) != ST_OK)
		snprintf(reason, sizeof reason, "(none)");
	v_tally_reason(st, reason);
	i = v_map_find(&st->mmap, id, strlen(id), v_msg_name, st->msgs, -1);
	if (i < 0) {
		v_add(&st->unexpected, "%s: dead-lettered (%s), not in the ledger", id, reason);
		return;
	}
	m = &st->msgs[i];
	if (mq_delivery_header(d, "x-inbox-reason", reason, sizeof reason) != ST_OK)
		m->bare_hits++;
	if (!m->effect && strcmp(reason, m->reason) == 0)
		m->dlq_hits++;
	else if (m->conflicts > 0 && strcmp(reason, "payload-conflict") == 0)
		m->conflict_hits++;
	else
		v_add(&st->unexpected, "%s: dead-lettered as %s", id, reason);
}

static void v_on_emitted(struct v_state *st, const struct mq_delivery *d)
{
	json_error_t jerr;
	json_t *o = json_loadb(d->body, d->len, 0, &jerr);
	const char *type = json_string_value(json_object_get(o, "type"));
	const char *order = json_string_value(json_object_get(o, "order_id"));
	unsigned bit;
	long i;

	if (type == NULL || order == NULL || !v_ours(st, order, strlen(order))) {
		st->foreign++;
		json_decref(o);
		return;
	}
	bit = v_emit_bit(type);
	i = v_map_find(&st->omap, order, strlen(order), v_order_name, st->orders, -1);
	if (i < 0 || bit == 0 || !(st->orders[i].emits & bit))
		v_add(&st->unexpected, "%s: emitted %s, not in the ledger", order, type);
	else if (st->orders[i].seen & bit)
		st->republished++; /* the outbox is at-least-once; downstream dedups by message-id */
	else
		st->orders[i].seen |= bit;
	json_decref(o);
}

static int v_cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

static void v_judge(struct v_state *st, long *effects_expected, long *effects_found, long *dead_expected,
                    long *emits_expected)
{
	static const char *const emit_names[3] = { "RefundRequested", "InventoryReleaseRequested", "OrderPaid" };

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
				v_add(&st->missing, "%s: no order_events row%s", m->id,
				      !m->row ? " and no inbox row" : strcmp(m->got_outcome, "held") == 0 ? " (still held)" : "");
			else if (m->events > 1) {
				char n[24];
				snprintf(n, sizeof n, "%lld", (long long)m->events);
				v_add(&st->doubled, "%s: %s order_events rows", m->id, n);
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
				v_add(&st->doubled, "%s: has an order_events row but must be dead-lettered (%s)", m->id, m->reason);
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
			v_add(&st->missing, "%s: no order row (expected %s)", o->id, o->status);
		} else if (strcmp(o->got_status, o->status) != 0 || o->got_version != (int64_t)o->version) {
			char exp[64];
			snprintf(exp, sizeof exp, "%s v%u, found %s v%lld", o->status, o->version, o->got_status,
			         (long long)o->got_version);
			v_add(&st->wrong, "%s: expected %s", o->id, exp);
		}
		for (unsigned b = 0; b < 3; b++) {
			if (!(o->emits & (1u << b)))
				continue;
			(*emits_expected)++;
			if (!(o->seen & (1u << b)))
				st->miss_emits++;
			if (!(o->seen & (1u << b)))
				v_add(&st->missing, "%s: %s not emitted", o->id, emit_names[b]);
		}
	}
}

static void v_print_list(const struct v_list *l)
{
	if (l->count == 0)
		return;
	printf("%s (%ld; first %ld):\n", l->title, l->count, l->count < l->max ? l->count : (long)l->max);
	for (long i = 0; i < l->count && i < l->max; i++)
		printf("  %s\n", l->lines[i]);
}

static json_t *v_list_json(const struct v_list *l)
{
	json_t *a = json_array();

	for (long i = 0; a != NULL && i < l->count && i < l->max; i++)
		json_array_append_new(a, json_string(l->lines[i]));
	return a;
}

/* The whole report as one JSON object on stdout: every figure of the text
 * report under a stable key.  Returns 0, or -1 when it could not be built. */
static long v_released(const struct v_state *st)
{
	return st->held_released[0] + st->held_released[1] + st->held_released[2] + st->held_released[3];
}

static int v_report_json(const struct v_state *st, const struct lg_verify_opts *vo, bool ok, long eff_exp,
                         long eff_found, long dead_exp, long dead_seen, long emit_exp, long emits_seen,
                         long long dups_published, long long dups_absorbed, double span, double tput, double p50,
                         double p99, double pmax)
{
	json_t *by_reason = json_object(), *o, *holds;
	char *text;

	for (int i = 0; by_reason != NULL && i < st->ndead_reasons; i++)
		json_object_set_new(by_reason, st->dead_by_reason[i].reason, json_integer(st->dead_by_reason[i].n));
	o = json_pack("{s:s, s:s, s:b,"
	              " s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I},"
	              " s:{s:I, s:I, s:I, s:I, s:I},"
	              " s:{s:I, s:I, s:I, s:I},"
	              " s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I},"
	              " s:{s:I, s:I},"
	              " s:{s:I, s:I, s:o},"
	              " s:{s:I, s:I, s:I},"
	              " s:{s:I, s:I},"
	              " s:I, s:I,"
	              " s:{s:f, s:f}, s:{s:f, s:f, s:f},"
	              " s:{s:o, s:o, s:o, s:o}}",
	              "run", st->prefix, "ledger", vo->ledger, "ok", ok,
	              "published",
	              "messages", (json_int_t)json_integer_value(json_object_get(st->run, "published")),
	              "originals", (json_int_t)json_integer_value(json_object_get(st->run, "originals")),
	              "copies_immediate", (json_int_t)json_integer_value(json_object_get(st->run, "copies_immediate")),
	              "copies_concurrent", (json_int_t)json_integer_value(json_object_get(st->run, "copies_concurrent")),
	              "copies_delayed", (json_int_t)json_integer_value(json_object_get(st->run, "copies_delayed")),
	              "conflicts", (json_int_t)json_integer_value(json_object_get(st->run, "conflicts")),
	              "malformed", (json_int_t)json_integer_value(json_object_get(st->run, "malformed")),
	              "orders", (json_int_t)st->norders,
	              "inbox_rows", "applied", (json_int_t)st->outcome_count[0], "compensated",
	              (json_int_t)st->outcome_count[1], "ignored", (json_int_t)st->outcome_count[2], "dead_lettered",
	              (json_int_t)st->outcome_count[3], "held", (json_int_t)st->outcome_count[4],
	              "effects", "expected", (json_int_t)eff_exp, "exactly_once", (json_int_t)eff_found, "missing",
	              (json_int_t)st->miss_effects, "doubled", (json_int_t)st->doubled.count,
	              "missing", "total", (json_int_t)st->missing.count, "effects", (json_int_t)st->miss_effects,
	              "dead_letters", (json_int_t)st->miss_dead, "dead_letters_without_reason",
	              (json_int_t)st->miss_dead_bare, "conflict_dead_letters", (json_int_t)st->miss_conflicts,
	              "order_rows", (json_int_t)st->miss_orders, "emitted", (json_int_t)st->miss_emits,
	              "orders", "checked", (json_int_t)st->norders, "wrong", (json_int_t)st->wrong.count,
	              "dead_letters", "expected", (json_int_t)dead_exp, "found", (json_int_t)dead_seen,
	              "copies_by_reason", by_reason,
	              "emitted", "expected", (json_int_t)emit_exp, "found", (json_int_t)emits_seen, "republished",
	              (json_int_t)st->republished,
	              "duplicates", "published", (json_int_t)dups_published, "absorbed", (json_int_t)dups_absorbed,
	              "unexpected", (json_int_t)st->unexpected.count, "other_runs_queue_messages",
	              (json_int_t)st->foreign,
	              "throughput", "msg_per_s", tput, "span_s", span,
	              "latency_ms", "p50", p50, "p99", p99, "max", pmax,
	              "lists", "missing", v_list_json(&st->missing), "doubled", v_list_json(&st->doubled), "wrong",
	              v_list_json(&st->wrong), "unexpected", v_list_json(&st->unexpected));
	/* Events that waited, from the rows' held_at (migration 0012). */
	holds = json_pack("{s:I, s:I, s:{s:I, s:I, s:I, s:I}, s:I, s:I}", "held", (json_int_t)st->held_total,
	                  "released", (json_int_t)v_released(st), "released_by_outcome", "applied",
	                  (json_int_t)st->held_released[0], "compensated", (json_int_t)st->held_released[1], "ignored",
	                  (json_int_t)st->held_released[2], "dead_lettered", (json_int_t)st->held_released[3], "expired",
	                  (json_int_t)st->held_expired, "still_held", (json_int_t)st->held_still);
	if (o == NULL || holds == NULL || json_object_set_new(o, "holds", holds) != 0) {
		fprintf(stderr, "inbox-loadgen: cannot build the JSON report\n");
		json_decref(o);
		return -1;
	}
	text = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	if (text == NULL)
		return -1;
	printf("%s\n", text);
	free(text);
	return 0;
}

int lg_verify(const struct cfg *conf, const struct lg_verify_opts *vo)
{
	struct v_state st;
	long eff_exp = 0, eff_found = 0, dead_exp = 0, emit_exp = 0, emits_seen = 0, dead_seen = 0;
	long long dups_published = 0, dups_absorbed = 0;
	double span = 0, tput = 0, p50 = 0, p99 = 0, pmax = 0;
	size_t rows = 0;
	char (*lines)[200] = NULL;
	int exit_code = 1;

	memset(&st, 0, sizeof st);
	st.conf = conf;
	lines = calloc((size_t)vo->list_max * 4, sizeof *lines);
	if (lines == NULL)
		return 1;
	st.missing = (struct v_list){ "MISSING", 0, vo->list_max, lines };
	st.doubled = (struct v_list){ "DOUBLED", 0, vo->list_max, lines + vo->list_max };
	st.wrong = (struct v_list){ "WRONG", 0, vo->list_max, lines + 2 * vo->list_max };
	st.unexpected = (struct v_list){ "UNEXPECTED", 0, vo->list_max, lines + 3 * vo->list_max };
	if (v_load(&st, vo->ledger) != 0)
		goto out;
	v_copy(st.verify_queue, sizeof st.verify_queue, json_object_get(st.run, "verify_queue"));
	if (v_wait_idle(&st, vo->timeout_s) != 0)
		goto out;
	if (v_read_inbox(&st) != ST_OK || v_read_events(&st) != ST_OK || v_read_orders(&st) != ST_OK) {
		fprintf(stderr, "inbox-loadgen: reading the database: %s\n", db_errmsg(st.db));
		goto out;
	}
	if (v_browse(&st, conf->dlq, v_on_dead) != ST_OK || v_browse(&st, st.verify_queue, v_on_emitted) != ST_OK)
		goto out;
	v_judge(&st, &eff_exp, &eff_found, &dead_exp, &emit_exp);
	for (size_t i = 0; i < st.nmsgs; i++)
		dead_seen += st.msgs[i].dlq_hits > 0 ? 1 : 0;
	for (size_t i = 0; i < st.norders; i++)
		emits_seen += __builtin_popcount(st.orders[i].seen);

	{
		long long copies = (long long)json_integer_value(json_object_get(st.run, "copies_immediate")) +
		                   (long long)json_integer_value(json_object_get(st.run, "copies_concurrent")) +
		                   (long long)json_integer_value(json_object_get(st.run, "copies_delayed"));
		/* A copy is absorbed when its message has its inbox row (the
		 * key it found taken) and it made no second effect: counted
		 * from the rows, so a message that went missing absorbed
		 * nothing. */
		dups_published = copies;
		for (size_t i = 0; i < st.nmsgs; i++) {
			const struct v_msg *m = &st.msgs[i];
			long long extra = m->events > 1 ? m->events - 1 : 0;
			if (m->row && m->copies > 1 + extra)
				dups_absorbed += m->copies - 1 - extra;
		}
	}
	if (st.nlat > 0 && st.last_done > st.first_pub) {
		for (int i = 0; i < 5; i++)
			rows += (size_t)st.outcome_count[i];
		qsort(st.lat, st.nlat, sizeof *st.lat, v_cmp_i64);
		span = (double)(st.last_done - st.first_pub) / 1e6;
		tput = (double)rows / span;
		p50 = (double)st.lat[st.nlat / 2] / 1e3;
		p99 = (double)st.lat[(st.nlat * 99) / 100] / 1e3;
		pmax = (double)st.lat[st.nlat - 1] / 1e3;
	}
	exit_code = st.missing.count == 0 && st.doubled.count == 0 && st.wrong.count == 0 && st.unexpected.count == 0 ? 0 : 1;
	if (vo->json) {
		exit_code = v_report_json(&st, vo, exit_code == 0, eff_exp, eff_found, dead_exp, dead_seen, emit_exp,
		                          emits_seen, dups_published, dups_absorbed, span, tput, p50, p99, pmax) == 0
		                    ? exit_code
		                    : 1;
		goto out;
	}
	printf("inbox-loadgen verify: run %s, ledger %s\n", st.prefix, vo->ledger);
	printf("published   %lld messages: %lld originals, duplicate copies %lld immediate + %lld concurrent + %lld delayed,"
	       " %lld conflicts, %lld malformed; %lld orders\n",
	       (long long)json_integer_value(json_object_get(st.run, "published")),
	       (long long)json_integer_value(json_object_get(st.run, "originals")),
	       (long long)json_integer_value(json_object_get(st.run, "copies_immediate")),
	       (long long)json_integer_value(json_object_get(st.run, "copies_concurrent")),
	       (long long)json_integer_value(json_object_get(st.run, "copies_delayed")),
	       (long long)json_integer_value(json_object_get(st.run, "conflicts")),
	       (long long)json_integer_value(json_object_get(st.run, "malformed")), (long long)st.norders);
	printf("inbox rows  applied %ld, compensated %ld, ignored %ld, dead_lettered %ld, held %ld\n",
	       st.outcome_count[0], st.outcome_count[1], st.outcome_count[2], st.outcome_count[3], st.outcome_count[4]);
	printf("effects     expected %ld, exactly once %ld, missing %ld, doubled %ld\n", eff_exp, eff_found,
	       st.miss_effects, st.doubled.count);
	/* Scripts read this line (scripts/chaos): keep its words. */
	printf("missing     %ld in all: effects %ld, dead-letters %ld (%ld of them reached the DLQ only without"
	       " x-inbox-reason), conflict dead-letters %ld, order rows %ld, emitted messages %ld\n",
	       st.missing.count, st.miss_effects, st.miss_dead, st.miss_dead_bare, st.miss_conflicts, st.miss_orders,
	       st.miss_emits);
	printf("orders      %zu checked, wrong state or version %ld\n", st.norders, st.wrong.count);
	printf("dead-letters expected %ld, found %ld; emitted expected %ld, found %ld (re-published %ld)\n", dead_exp,
	       dead_seen, emit_exp, emits_seen, st.republished);
	/* Copies, not messages: a message delivered again after a crash may be
	 * dead-lettered twice (the DLQ is at-least-once too). */
	printf("dead-letter copies by reason:");
	if (st.ndead_reasons == 0)
		printf(" none");
	for (int i = 0; i < st.ndead_reasons; i++)
		printf("%s %s %ld", i ? "," : "", st.dead_by_reason[i].reason, st.dead_by_reason[i].n);
	printf("\n");
	printf("duplicates  %lld copies published, absorbed %lld (doubled effects %ld)\n", dups_published,
	       dups_absorbed, st.doubled.count);
	printf("holds       held %ld, released %ld (applied %ld, compensated %ld, ignored %ld, dead_lettered %ld),"
	       " expired %ld, still held %ld\n",
	       st.held_total, v_released(&st), st.held_released[0], st.held_released[1], st.held_released[2],
	       st.held_released[3], st.held_expired, st.held_still);
	printf("unexpected  %ld (other runs' queue messages left in place: %ld)\n", st.unexpected.count, st.foreign);
	if (span > 0) {
		printf("throughput  %.0f msg/s (%zu inbox rows in %.2f s, first publish -> last commit)\n", tput, rows,
		       span);
		printf("latency     publish -> commit p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", p50, p99, pmax);
	}
	v_print_list(&st.missing);
	v_print_list(&st.doubled);
	v_print_list(&st.wrong);
	v_print_list(&st.unexpected);
	printf("result      %s\n", exit_code == 0 ? "OK: every effect exactly once" : "FAIL");
out:
	db_close(&st.db);
	json_decref(st.run);
	free(st.orders);
	free(st.msgs);
	free(st.omap.slot);
	free(st.mmap.slot);
	free(st.lat);
	free(lines);
	return exit_code;
}
