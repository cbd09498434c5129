/*
 * dlq_judge.h - what replaying a dead letter would do, asked of the
 * database, for `inbox-worker dlq show` and `replay` (worker/cmd_dlq.c).
 *
 * A dead letter is judged as the worker would take its copy: a body that
 * still fails the checks is left; a key the inbox never recorded (nor the
 * ledger, which outlives retention) is replayed; a key recorded with this
 * payload makes the copy a harmless duplicate, one recorded with another
 * payload a conflict; a key the inbox dead-lettered itself (an impossible
 * transition, an expired hold) is reopened and replayed only when the
 * aggregate's row, under the lifecycle the worker runs (aggregate.h), now
 * lets the event take effect.  Judging reads only; the one write is
 * dlq_judge_reopen, which replay makes for a DLQ_JUDGE_REOPEN verdict
 * before it publishes the copy.  Every statement is prepared once by
 * dlq_judge_open, with the bound definition's table names.
 *
 * What replay's own run already sent is not the database's to know (a key
 * it reopened has no row until the copy is taken): cmd_dlq.c keeps that.
 *
 * Ownership: struct dlq_judge is the caller's (struct dlq_run embeds it);
 * dlq_judge_open opens its connection and prepares its statements, which
 * dlq_judge_close frees (also after a failed open; NULL-safe, a judge
 * never opened is all zero).  The rows and why are caller buffers, the
 * entry is only read.
 */
#ifndef INBOX_DLQ_JUDGE_H
#define INBOX_DLQ_JUDGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "db.h"
#include "dlq_entry.h"
#include "msg.h"
#include "aggregate.h"

/* What replay makes of a dead letter.  In this order: the verdicts up to
 * DLQ_JUDGE_REOPEN send a copy, the ones after it leave the dead letter
 * where it is. */
enum dlq_judge_verdict {
	DLQ_JUDGE_REPLAY = 0, /* the inbox never recorded the key: replay */
	DLQ_JUDGE_DUPLICATE,  /* the inbox recorded this payload: the copy is a harmless duplicate */
	DLQ_JUDGE_REOPEN,     /* the inbox dead-lettered it and the cause is gone: reopen the key, replay */
	DLQ_JUDGE_MALFORMED,  /* the body still fails the checks: left */
	DLQ_JUDGE_CONFLICT,   /* the inbox holds another payload for the key: left */
	DLQ_JUDGE_WAITING,    /* its prerequisite is still missing: left */
	DLQ_JUDGE_INVALID,    /* still an impossible transition: left */
	DLQ_JUDGE_COUNT
};

/* The verdict's word in replay's summary ("still-malformed"). */
const char *dlq_judge_verdict_name(enum dlq_judge_verdict v);

/* The inbox row of a key (processed_messages). */
struct dlq_judge_inbox_row {
	bool found;
	char outcome[24];
	char reason[40];
	char sha[65];
	char at[40];
};

/* The aggregate's row: its state, and the columns its events set as text
 * (the bound definition's, agg_binding cols), each cut to its first
 * DLQ_JUDGE_COL_CHARS characters (4 bytes each at most) for the screen. */
#define DLQ_JUDGE_COL_CHARS 64
#define DLQ_JUDGE_COL_TEXT (4 * DLQ_JUDGE_COL_CHARS + 1)
struct dlq_judge_order_row {
	bool found;
	char status[32];
	int64_t version;
	int64_t flags;
	char col[AGG_COLS_MAX][DLQ_JUDGE_COL_TEXT];
	bool col_null[AGG_COLS_MAX];
};

struct dlq_judge {
	const struct cfg *conf;
	struct db *db;
	struct db_stmt *q_inbox, *q_order, *q_reopen, *q_ledger;
};

/* Connect and prepare.  ST_OK, or the failure, logged. */
int dlq_judge_open(struct dlq_judge *j, const struct cfg *conf);
void dlq_judge_close(struct dlq_judge *j);

/* The inbox row of m's key under conf->consumer, and the aggregate's row
 * of order_id (row->found false: none).  Each commits its read.  ST_OK or
 * a database error (dlq_judge_errmsg). */
int dlq_judge_inbox_lookup(struct dlq_judge *j, const struct msg *m, struct dlq_judge_inbox_row *row);
int dlq_judge_order_lookup(struct dlq_judge *j, const char *order_id, struct dlq_judge_order_row *row);

/* What replaying e would do, and why in one line (cut to cap).  Reads
 * only.  ST_OK or a database error (dlq_judge_errmsg). */
int dlq_judge_entry(struct dlq_judge *j, const struct dlq_entry *e, enum dlq_judge_verdict *v, char *why,
                    size_t cap);

/* Reopen e's key: delete the inbox row that dead-lettered this very payload
 * and commit, so that the copy is taken as new.  A key claimed again since
 * the judgement is left alone (logged: the copy is then a duplicate, still
 * safe).  ST_OK, or the database error, logged and rolled back. */
int dlq_judge_reopen(struct dlq_judge *j, const struct dlq_entry *e);

/* The database's message for the last failure. */
const char *dlq_judge_errmsg(const struct dlq_judge *j);

#endif
