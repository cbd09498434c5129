/*
 * retention.c - retention cleanup in slices, one process at a time.
 *
 * Why slices ordered by the age index and not one DELETE per table: a
 * DELETE of every expired row locks and logs them all in one transaction
 * (2 million rows take minutes, and a Galera write set that size is
 * refused), and whoever runs it is stuck until it ends.  A slice walks
 * ix_processed_messages_processed_at (or ix_outbox_route) from its oldest
 * entry and stops after slice_rows rows, so its cost is bounded by the rows
 * it deletes plus the held rows it steps over.  Rows come and go only at
 * the young end of those indexes, so slices contend with no live
 * transaction but a late duplicate's claim or the release of an old held
 * row, both short.
 */
#include "retention.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "log.h"
#include "status.h"

/* Per database: two inbox databases on one server clean up independently.
 * MySQL refuses lock names over 64 characters. */
#define RETENTION_LOCK_NAME "LEFT(CONCAT('inbox-worker.cleanup.', DATABASE()), 64)"
#define RETENTION_BACKOFF_MAX_MS 1000

struct retention {
	struct db *db;
	const struct cfg *conf;
	struct db_stmt *lock;
	struct db_stmt *unlock;
	struct db_stmt *slice[2]; /* processed_messages, outbox */
	bool lock_refused;        /* logged once: GET_LOCK is refused here */
};

static const char *const retention_table[2] = { "processed_messages", "outbox" };

int retention_open(struct retention **out, struct db *db, const struct cfg *conf)
{
	struct retention *r = calloc(1, sizeof *r);
	int rc;

	*out = NULL;
	if (r == NULL)
		return ST_ERR_NOMEM;
	r->db = db;
	r->conf = conf;
	rc = db_prepare(db, &r->lock, "SELECT GET_LOCK(" RETENTION_LOCK_NAME ", ?)");
	if (rc == ST_OK)
		rc = db_prepare(db, &r->unlock, "SELECT RELEASE_LOCK(" RETENTION_LOCK_NAME ")");
	/* A held row is never deleted: its event still waits for its
	 * prerequisite, and the row is what makes a redelivery a duplicate. */
	if (rc == ST_OK)
		rc = db_prepare(db, &r->slice[0],
		                "DELETE FROM processed_messages WHERE processed_at < NOW(6) - INTERVAL ? SECOND"
		                " AND outcome <> 'held' ORDER BY processed_at LIMIT ?");
	/* An unsent row (sent_at NULL) is outside the range: it has yet to
	 * leave, however old it is. */
	if (rc == ST_OK)
		rc = db_prepare(db, &r->slice[1],
		                "DELETE FROM outbox WHERE sent_at IS NOT NULL AND sent_at < NOW(6) - INTERVAL ? SECOND"
		                " ORDER BY sent_at LIMIT ?");
	if (rc != ST_OK) {
		retention_close(&r);
		return rc;
	}
	*out = r;
	return ST_OK;
}

void retention_close(struct retention **rp)
{
	if (rp == NULL || *rp == NULL)
		return;
	/* Statements belong to the db and die with it. */
	free(*rp);
	*rp = NULL;
}

static int64_t retention_now_ms(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
		return 0;
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void retention_sleep_ms(int ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* Take the lock: *locked true when this session holds it.  A server that
 * refuses GET_LOCK (Galera) lets the run go on unlocked; see retention.h. */
static int retention_lock(struct retention *r, int wait_s, bool *locked, bool *busy)
{
	struct db_param p[] = { DBP_I64(wait_s) };
	struct db_col c[] = { DBC_I64() };
	int got;

	*locked = false;
	*busy = false;
	got = db_stmt_query_row(r->lock, p, ARRAY_LEN(p), c, ARRAY_LEN(c));
	if (got == ST_ERR_DB) {
		if (!r->lock_refused)
			LOG(LOG_LEVEL_WARN, "retention cleanup runs without its lock: the server refuses GET_LOCK",
			    LOG_S("error", db_errmsg(r->db)));
		r->lock_refused = true;
		return ST_OK;
	}
	if (got < 0)
		return got;
	/* 1: ours; 0: another session's; NULL: the server failed to take it. */
	if (got == 1 && !c[0].is_null && c[0].i64 == 1)
		*locked = true;
	else if (got == 1 && !c[0].is_null && c[0].i64 == 0)
		*busy = true;
	else
		return ST_ERR_DB;
	return ST_OK;
}

/* The lock also ends with the session, so a failure here (a lost
 * connection) releases it as well; nothing to report. */
static void retention_unlock(struct retention *r)
{
	struct db_col c[] = { DBC_I64() };

	(void)db_stmt_query_row(r->unlock, NULL, 0, c, ARRAY_LEN(c));
}

static int retention_count1(struct db *db, const char *sql, int64_t retention_s, uint64_t *out)
{
	struct db_stmt *q = NULL;
	struct db_param p[] = { DBP_I64(retention_s) };
	struct db_col c[] = { DBC_I64() };
	int rc, r;

	*out = 0;
	rc = db_prepare(db, &q, sql);
	if (rc != ST_OK)
		return rc;
	r = db_stmt_query_row(q, p, ARRAY_LEN(p), c, ARRAY_LEN(c));
	if (r < 0)
		return r;
	if (r == 1)
		*out = c[0].is_null || c[0].i64 < 0 ? 0 : (uint64_t)c[0].i64;
	return ST_OK;
}

int retention_count(struct db *db, const struct cfg *conf, uint64_t *inbox_rows, uint64_t *outbox_rows)
{
	int rc;

	/* Keep these in step with the DELETEs of retention_open. */
	rc = retention_count1(db,
	                      "SELECT COUNT(*) FROM processed_messages WHERE processed_at < NOW(6) - INTERVAL ? SECOND"
	                      " AND outcome <> 'held'",
	                      conf->retention_s, inbox_rows);
	if (rc == ST_OK)
		rc = retention_count1(db,
		                      "SELECT COUNT(*) FROM outbox WHERE sent_at IS NOT NULL"
		                      " AND sent_at < NOW(6) - INTERVAL ? SECOND",
		                      conf->retention_s, outbox_rows);
	db_rollback(db);
	return rc;
}

/* One slice of table t: DELETE and COMMIT; *n gets the rows deleted. */
static int retention_slice(struct retention *r, int t, int rows, uint64_t *n)
{
	struct db_param p[] = { DBP_I64(r->conf->retention_s), DBP_I64(rows) };
	int rc;

	*n = 0;
	rc = db_stmt_exec(r->slice[t], p, ARRAY_LEN(p), n);
	if (rc == ST_OK)
		rc = db_commit(r->db);
	if (rc != ST_OK) {
		/* 1205 rolls back only the statement: end the transaction. */
		db_rollback(r->db);
		*n = 0;
	}
	return rc;
}

int retention_run(struct retention *r, const struct retention_limits *lim, enum retention_state *state,
                  uint64_t *deleted)
{
	const int64_t start = retention_now_ms();
	bool locked, busy;
	int slices = 0, rc;

	*state = RETENTION_MORE;
	*deleted = 0;
	if (lim->slice_rows < 1)
		return ST_ERR_INVALID;
	rc = retention_lock(r, lim->lock_wait_s, &locked, &busy);
	if (rc != ST_OK)
		return rc;
	if (busy) {
		*state = RETENTION_BUSY;
		return ST_OK;
	}
	for (int t = 0; t < 2; t++) {
		int conflicts = 0;

		for (;;) {
			uint64_t n;

			if ((lim->max_slices > 0 && slices >= lim->max_slices) ||
			    (lim->budget_ms > 0 && retention_now_ms() - start >= lim->budget_ms))
				goto out; /* RETENTION_MORE */
			rc = retention_slice(r, t, lim->slice_rows, &n);
			slices++;
			if (rc == ST_ERR_DB_DEADLOCK || rc == ST_ERR_DB_LOCK_TIMEOUT) {
				/* Another transaction holds a row of this slice (a
				 * late duplicate, a held row being released, a peer's
				 * slice on another Galera node): its commit is near. */
				LOG(LOG_LEVEL_DEBUG, "retention slice conflicted", LOG_S("table", retention_table[t]),
				    LOG_S("error", st_strerror(rc)));
				if (conflicts >= lim->retries) {
					rc = ST_OK;
					goto out; /* RETENTION_MORE: the next run goes on */
				}
				{
					int ms = 50 << (conflicts < 5 ? conflicts : 5);
					retention_sleep_ms(ms < RETENTION_BACKOFF_MAX_MS ? ms : RETENTION_BACKOFF_MAX_MS);
				}
				conflicts++;
				continue;
			}
			if (rc != ST_OK)
				goto out;
			conflicts = 0;
			*deleted += n;
			if (n < (uint64_t)lim->slice_rows)
				break; /* this table has caught up */
		}
	}
	*state = RETENTION_DONE;
out:
	if (locked)
		retention_unlock(r);
	return rc;
}
