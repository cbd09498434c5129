/*
 * snapshot.h - what a definition's additions (UPDATE ... SET c = c + :p
 * WHERE k = :q, lifecycle_fx.h's LC_FX_SHAPE_ADD) start from: publish
 * reads, before the first message goes out, the rows of every key the
 * scenario's aggregates draw, and writes them into the ledger, so that
 * verify can hold each key's end value against that baseline plus what
 * the run's messages added.
 *
 * Only additions whose key is bound from a data field are taken: those
 * are the keys the scenario chooses (an aggregate's own key names rows
 * that do not exist before the run).  The query is the same on both
 * sides (lg_fx_sum_sql), so that the baseline and the end are one
 * measure.  Names come from the definition (lc_load read them) and are
 * quoted with backticks; every value is a bound parameter.
 *
 * Ownership: struct lg_snapshot is the caller's; lg_snapshot_take
 * allocates its keys, lg_snapshot_free releases them (NULL-safe, twice-safe).
 */
#ifndef INBOX_LG_SNAPSHOT_H
#define INBOX_LG_SNAPSHOT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cfg.h"
#include "db.h"
#include "lifecycle.h"
#include "plan.h"
#include "scenario.h"

/* One key's rows before the run: how many match, and their column's sum
 * as the server prints it (an integer unless the column holds fractions). */
struct lg_snap_key {
	char key[LC_FX_LITERAL_MAX];
	int64_t rows;
	char sum[40];
};

struct lg_snap_stmt {
	int stmt;                /* index into def->stmts */
	bool key_int;            /* the key field is an integer (bound as one) */
	struct lg_snap_key *keys; /* sorted by key, each once */
	size_t nkeys;
};

struct lg_snapshot {
	struct lg_snap_stmt stmts[LC_MAX_STMTS];
	int n;
};

/* The plan field (index into p->fields) that parameter param of statement
 * st reads, or -1 when it reads no integer or string data field. */
int lg_fx_param_field(const struct lg_plan *p, const struct lc_stmt *st, int param);
/* Whether statement st is an addition whose key is a data field the plan
 * draws (the field's index in *field). */
bool lg_fx_snapshotted(const struct lg_plan *p, const struct lc_stmt *st, int *field);
/* The query of an addition's rows for one key: SELECT COUNT(*), the sum of
 * its column as text, with the key (then each literal equality, as text)
 * bound in that order.  0, or -1 when it does not fit or a name holds a
 * backtick (then the statement is not measured). */
int lg_fx_sum_sql(const struct lc_fx *fx, char *buf, size_t cap);
/* Measure one key with a statement of lg_fx_sum_sql on d: ST_OK with
 * *rows and sum (cap bytes) filled, or an error (db_errmsg says). */
int lg_fx_sum_read(struct db_stmt *q, const struct lc_fx *fx, const char *key, bool key_int, int64_t *rows,
                   char *sum, size_t cap);

/* Read the baseline of every snapshotted addition of s's definition from
 * the database of conf.  0 (nothing to do is 0 too), or -1 with a line on
 * stderr. */
int lg_snapshot_take(const struct cfg *conf, const struct lg_scenario *s, struct lg_snapshot *out);
/* Append its ledger lines to f: per statement a "stmt" line, then a "sum"
 * line per key (verify_ledger.h).  0, or -1 (errno set). */
int lg_snapshot_write(const struct lg_snapshot *snap, const struct lc_def *def, FILE *f);
void lg_snapshot_free(struct lg_snapshot *snap);

#endif
