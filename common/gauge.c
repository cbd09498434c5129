/*
 * gauge.c - database gauges for /metrics.  One short read-only statement
 * each, over the indexes the inbox already has (held_events by held_at).
 */
#include "gauge.h"

#include <stdlib.h>
#include <string.h>

#include "status.h"

struct gauge {
	struct db *db;
	const struct cfg *conf;
	struct db_stmt *held;
};

int gauge_open(struct gauge **out, struct db *db, const struct cfg *conf)
{
	struct gauge *g = calloc(1, sizeof *g);
	int rc;

	*out = NULL;
	if (g == NULL)
		return ST_ERR_NOMEM;
	g->db = db;
	g->conf = conf;
	rc = db_prepare(db, &g->held,
	                "SELECT COUNT(*), COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(held_at), NOW(6)), 0)"
	                " FROM held_events WHERE consumer = ?");
	if (rc != ST_OK) {
		gauge_close(&g);
		return rc;
	}
	*out = g;
	return ST_OK;
}

void gauge_close(struct gauge **g)
{
	if (g == NULL || *g == NULL)
		return;
	free(*g); /* the statement belongs to the db */
	*g = NULL;
}

int gauge_held(struct gauge *g, int64_t *n, double *oldest_s)
{
	struct db_param p[] = { DBP_STR(g->conf->consumer) };
	struct db_col c[] = { DBC_I64(), DBC_I64() };
	int r = db_stmt_query_row(g->held, p, ARRAY_LEN(p), c, ARRAY_LEN(c));

	if (r < 0)
		return r;
	*n = r == 1 ? c[0].i64 : 0;
	*oldest_s = r == 1 && !c[1].is_null && c[1].i64 > 0 ? (double)c[1].i64 / 1e6 : 0;
	db_rollback(g->db);
	return ST_OK;
}
