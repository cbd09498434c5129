/*
 * bench_tx.h - the one inbox transaction both ceilings run: claim the key in
 * processed_messages, bump the order, write its ledger row, commit.  Shared
 * by bare_tx (no broker) and min_pipeline (broker, nothing else) so that the
 * two ceilings differ only by the broker.
 *
 * It is deliberately the least the inbox can do: three statements on a
 * connection with autocommit off (no BEGIN round trip), prepared once.  The
 * order row is an upsert and the ledger row reads the version the upsert
 * left, so events of one order never collide on (order_id, version).
 */
#ifndef INBOX_BENCH_TX_H
#define INBOX_BENCH_TX_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "status.h"

struct bench_tx {
	struct db *db;
	struct db_stmt *claim, *order, *ledger;
	struct db_stmt *claim_ig, *ledger_ig; /* the batched variants */
};

/* The batched variants write their rows' ids themselves.  On MariaDB
 * 10.11 an array-bound INSERT IGNORE that lets the server pick AUTO_INCREMENT
 * ids collides on PRIMARY with another connection's concurrent array (1062
 * "for key 'PRIMARY'", seen here from 2 threads up), and IGNORE drops the
 * row as if it were a duplicate: the ceiling lost 5-20 % of its claims at
 * 8 threads, silently, and so did less than the work it stands for
 * (found on 2026-12-04, fixed in 3652fe4; why the server's ids collide
 * was not found, and a synthetic loop of batches did not reproduce it:
 * bench/check_ceilings.c drives the loop itself).  Ids from one counter, above every row the tables held
 * when the first connection opened, never collide. */
static _Atomic uint64_t bench_tx_next_id;

struct bench_msg {
	const char *consumer, *source, *message_id, *type, *order_id;
	char sha_hex[65];
	int64_t published_us;
};

static inline int bench_tx_open(struct bench_tx *t, const struct cfg_db *conf)
{
	int rc;

	memset(t, 0, sizeof *t);
	rc = db_open(&t->db, conf);
	if (rc == ST_OK)
		rc = db_prepare(t->db, &t->claim,
		                "INSERT INTO processed_messages (consumer, source, message_id, payload_sha256, type,"
		                " order_id, outcome, published_at, processed_at) VALUES (?, ?, ?, ?, ?, ?, 'applied',"
		                " IF(? > 0, FROM_UNIXTIME(? / 1000000), NULL), NOW(6))");
	if (rc == ST_OK)
		rc = db_prepare(t->db, &t->order,
		                "INSERT INTO orders (id, status, version, flags, created_at, updated_at)"
		                " VALUES (?, ?, 1, 0, NOW(6), NOW(6))"
		                " ON DUPLICATE KEY UPDATE status = VALUES(status), version = version + 1,"
		                " updated_at = NOW(6)");
	if (rc == ST_OK)
		rc = db_prepare(t->db, &t->ledger,
		                "INSERT INTO order_events (order_id, consumer, source, message_id, type, outcome,"
		                " from_status, to_status, version, applied_at)"
		                " SELECT id, ?, ?, ?, ?, 'applied', '', status, version, NOW(6) FROM orders WHERE id = ?");
	/* Batched (bench_tx_run_batch): a duplicate must not fail the
	 * whole array, so the claim and the ledger row are INSERT IGNORE. */
	if (rc == ST_OK)
		rc = db_prepare(t->db, &t->claim_ig,
		                "INSERT IGNORE INTO processed_messages (id, consumer, source, message_id, payload_sha256, type,"
		                " order_id, outcome, published_at, processed_at) VALUES (?, ?, ?, ?, ?, ?, ?, 'applied',"
		                " IF(? > 0, FROM_UNIXTIME(? / 1000000), NULL), NOW(6))");
	if (rc == ST_OK)
		/* Array binding takes no INSERT ... SELECT: the row's version
		 * comes from the caller (bench_tx_run_batch). */
		rc = db_prepare(t->db, &t->ledger_ig,
		                "INSERT IGNORE INTO order_events (id, order_id, consumer, source, message_id, type, outcome,"
		                " from_status, to_status, version, applied_at)"
		                " VALUES (?, ?, ?, ?, ?, ?, 'applied', '', ?, ?, NOW(6))");
	if (rc == ST_OK) {
		struct db_stmt *top = NULL;
		struct db_col col[1] = { DBC_I64() };
		uint64_t seen;

		rc = db_prepare(t->db, &top,
		                "SELECT GREATEST(COALESCE((SELECT MAX(id) FROM processed_messages), 0),"
		                " COALESCE((SELECT MAX(id) FROM order_events), 0))");
		if (rc == ST_OK)
			rc = db_stmt_query_row(top, NULL, 0, col, 1) == 1 ? ST_OK : ST_ERR_DB;
		if (rc == ST_OK)
			rc = db_commit(t->db);
		seen = rc == ST_OK && col[0].i64 > 0 ? (uint64_t)col[0].i64 : 0;
		for (uint64_t cur = atomic_load(&bench_tx_next_id);
		     cur < seen && !atomic_compare_exchange_weak(&bench_tx_next_id, &cur, seen);)
			;
	}
	return rc;
}

/* n messages in one transaction, each statement array-bound over the n
 * (one round trip each) and one COMMIT: four round trips a batch.  A
 * duplicate is skipped by the claim and the ledger (INSERT IGNORE), though
 * it still bumps its order: a ceiling, not an inbox.  ST_OK committed, or
 * an error (rolled back). */
static inline int bench_tx_run_batch(struct bench_tx *t, const struct bench_msg *m, int n)
{
	struct db_param *c = calloc((size_t)n * 9, sizeof *c);
	struct db_param *o = calloc((size_t)n * 2, sizeof *o);
	struct db_param *l = calloc((size_t)n * 8, sizeof *l);
	/* A ledger version unique in the process, so that rows of one order
	 * from two threads do not collide on (order_id, version). */
	static _Atomic long long version;
	int rc = c != NULL && o != NULL && l != NULL ? ST_OK : ST_ERR_NOMEM;

	for (int i = 0; rc == ST_OK && i < n; i++) {
		const struct bench_msg *x = &m[i];
		int64_t id = (int64_t)atomic_fetch_add(&bench_tx_next_id, 1) + 1;
		struct db_param ci[9] = { DBP_I64(id), DBP_STR(x->consumer), DBP_STR(x->source), DBP_STR(x->message_id),
		                          DBP_STR(x->sha_hex), DBP_STR(x->type), DBP_STR(x->order_id),
		                          DBP_I64(x->published_us), DBP_I64(x->published_us) };
		struct db_param oi[2] = { DBP_STR(x->order_id), DBP_STR(x->type) };
		struct db_param li[8] = { DBP_I64(id), DBP_STR(x->order_id), DBP_STR(x->consumer), DBP_STR(x->source),
		                          DBP_STR(x->message_id), DBP_STR(x->type), DBP_STR(x->type),
		                          DBP_I64(++version) };
		memcpy(&c[i * 9], ci, sizeof ci);
		memcpy(&o[i * 2], oi, sizeof oi);
		memcpy(&l[i * 8], li, sizeof li);
	}
	if (rc == ST_OK)
		rc = db_stmt_exec_bulk(t->claim_ig, c, 9, n, NULL);
	if (rc == ST_OK)
		rc = db_stmt_exec_bulk(t->order, o, 2, n, NULL);
	if (rc == ST_OK)
		rc = db_stmt_exec_bulk(t->ledger_ig, l, 8, n, NULL);
	if (rc == ST_OK)
		rc = db_commit(t->db);
	if (rc != ST_OK && rc != ST_ERR_NOMEM)
		db_rollback(t->db);
	free(c);
	free(o);
	free(l);
	return rc;
}

/* ST_OK committed, ST_ERR_DB_DUPLICATE (rolled back: a duplicate), or an
 * error (rolled back). */
static inline int bench_tx_run(struct bench_tx *t, const struct bench_msg *m)
{
	struct db_param c[8] = { DBP_STR(m->consumer), DBP_STR(m->source), DBP_STR(m->message_id),
	                         DBP_STR(m->sha_hex), DBP_STR(m->type), DBP_STR(m->order_id),
	                         DBP_I64(m->published_us), DBP_I64(m->published_us) };
	struct db_param o[2] = { DBP_STR(m->order_id), DBP_STR(m->type) };
	struct db_param l[5] = { DBP_STR(m->consumer), DBP_STR(m->source), DBP_STR(m->message_id),
	                         DBP_STR(m->type), DBP_STR(m->order_id) };
	int rc = db_stmt_exec(t->claim, c, 8, NULL);

	if (rc == ST_OK)
		rc = db_stmt_exec(t->order, o, 2, NULL);
	if (rc == ST_OK)
		rc = db_stmt_exec(t->ledger, l, 5, NULL);
	if (rc == ST_OK)
		rc = db_commit(t->db);
	if (rc != ST_OK)
		db_rollback(t->db);
	return rc;
}

static inline void bench_tx_close(struct bench_tx *t)
{
	db_close(&t->db);
}

#endif
