/*
 * test_db.c - the db_ boundary against the real MariaDB: values longer than
 * a fixed buffer are refused, a DBC_GROW column grows to fit them up to its
 * limit, a value refused by its column maps to ST_ERR_DB_DATA, and so do
 * the other server errors to their codes; parameter and column counts that
 * differ from the statement's are errors; a lost connection reconnects
 * behind the same statements; db_multi, db_escape, db_exec_script and the
 * bulk execution against the server.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "array.h"
#include "db.h"
#include "itest.h"
#include "sqlbuf.h"
#include "status.h"

static struct db *fresh_table(void)
{
	struct db *d = itest_db();

	cr_assert_eq(db_exec(d, "DROP TABLE IF EXISTS test_db_blob"), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_exec(d, "CREATE TABLE test_db_blob (id INT PRIMARY KEY, b MEDIUMBLOB, s VARCHAR(8))"),
	             ST_OK, "%s", db_errmsg(d));
	return d;
}

static void put_blob(struct db *d, int id, size_t len)
{
	struct db_stmt *ins;
	char *v = malloc(len);

	cr_assert_not_null(v);
	for (size_t i = 0; i < len; i++)
		v[i] = (char)('a' + i % 26);
	cr_assert_eq(db_prepare(d, &ins, "INSERT INTO test_db_blob (id, b) VALUES (?, ?)"), ST_OK);
	struct db_param p[] = { DBP_I64(id), DBP_BLOB(v, len) };
	cr_assert_eq(db_stmt_exec(ins, p, ARRAY_LEN(p), NULL), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_commit(d), ST_OK);
	free(v);
}

Test(db, grow_column_fits_a_value_longer_than_its_first_buffer)
{
	struct db *d;
	struct db_stmt *sel;
	char *buf = NULL;
	size_t cap = 0;
	char small[16];

	itest_cfg();
	d = fresh_table();
	put_blob(d, 1, 10);
	put_blob(d, 2, 100000);
	cr_assert_eq(db_prepare(d, &sel, "SELECT id, b FROM test_db_blob ORDER BY id"), ST_OK);
	cr_assert_eq(db_stmt_query(sel, NULL, 0), ST_OK);
	for (int want = 1; want <= 2; want++) {
		struct db_col c[] = { DBC_I64(), DBC_GROW(&buf, &cap, 200000) };
		cr_assert_eq(db_stmt_fetch(sel, c, ARRAY_LEN(c)), 1, "%s", db_errmsg(d));
		cr_assert_eq(c[0].i64, want);
		cr_assert_eq(c[1].len, want == 1 ? 10u : 100000u);
		cr_assert_eq(buf[0], 'a');
		cr_assert_eq(buf[c[1].len - 1], (char)('a' + (c[1].len - 1) % 26));
		cr_assert_eq(buf[c[1].len], '\0');
	}
	{
		struct db_col c[] = { DBC_I64(), DBC_GROW(&buf, &cap, 200000) };
		cr_assert_eq(db_stmt_fetch(sel, c, ARRAY_LEN(c)), 0);
	}
	/* Over the limit: a data error, not a broken connection. */
	cr_assert_eq(db_stmt_query(sel, NULL, 0), ST_OK);
	{
		struct db_col c[] = { DBC_I64(), DBC_GROW(&buf, &cap, 50) };
		cr_assert_eq(db_stmt_fetch(sel, c, ARRAY_LEN(c)), 1);
		cr_assert_eq(db_stmt_fetch(sel, c, ARRAY_LEN(c)), ST_ERR_DB_DATA);
	}
	/* A fixed buffer is never cut silently. */
	cr_assert_eq(db_stmt_query(sel, NULL, 0), ST_OK);
	{
		struct db_col c[] = { DBC_I64(), DBC_BLOB(small, sizeof small) };
		cr_assert_eq(db_stmt_fetch(sel, c, ARRAY_LEN(c)), 1);
		cr_assert_lt(db_stmt_fetch(sel, c, ARRAY_LEN(c)), 0);
	}
	db_stmt_done(sel);
	db_rollback(d);
	cr_assert(db_connected(d));
	free(buf);
}

Test(db, value_refused_by_its_column_is_a_data_error)
{
	struct db *d;
	struct db_stmt *ins;

	itest_cfg();
	d = fresh_table();
	cr_assert_eq(db_prepare(d, &ins, "INSERT INTO test_db_blob (id, s) VALUES (?, ?)"), ST_OK);
	struct db_param p[] = { DBP_I64(1), DBP_STR("far longer than eight") };
	cr_assert_eq(db_stmt_exec(ins, p, ARRAY_LEN(p), NULL), ST_ERR_DB_DATA, "%s", db_errmsg(d));
	db_rollback(d);
	cr_assert(db_connected(d));
}

/* A lock held by another connection for longer than the lock wait time-out
 * is a lock wait time-out (the statement rolled back, the connection
 * intact), never a lost connection: the session's innodb_lock_wait_timeout
 * must run out before the client's read time-out does. */
Test(db, long_lock_wait_is_a_lock_timeout_not_a_lost_connection, .timeout = 300)
{
	struct db *holder, *waiter = NULL;

	itest_cfg();
	holder = fresh_table();
	cr_assert_eq(db_exec(holder, "INSERT INTO test_db_blob (id, s) VALUES (1, 'a')"), ST_OK, "%s",
	             db_errmsg(holder));
	cr_assert_eq(db_commit(holder), ST_OK);
	/* A holder that works, not one idle in its transaction (those the
	 * server ends: the next test). */
	cr_assert_eq(db_exec(holder, "SET SESSION idle_write_transaction_timeout = 0"), ST_OK, "%s", db_errmsg(holder));
	cr_assert_eq(db_exec(holder, "UPDATE test_db_blob SET s = 'b' WHERE id = 1"), ST_OK, "%s", db_errmsg(holder));
	cr_assert_eq(db_open(&waiter, &itest_cfg()->db), ST_OK);
	cr_assert_eq(db_exec(waiter, "UPDATE test_db_blob SET s = 'c' WHERE id = 1"), ST_ERR_DB_LOCK_TIMEOUT, "%s",
	             db_errmsg(waiter));
	cr_assert(db_connected(waiter), "the connection survives a lock wait time-out");
	db_rollback(waiter);
	db_close(&waiter);
	db_rollback(holder);
}

/* A client that vanishes inside a transaction (a network that drops its
 * packets, a host gone) leaves the server a session it believes alive,
 * holding the transaction's row locks until the client's TCP stack gets
 * a close through, minutes later.  Every transaction that needs one of
 * those rows waited its whole lock wait, retried and waited again: after
 * a 120 s blackhole of the database port the workers took 114 s to drain
 * and events held behind those rows expired.  Our sessions ask the server
 * to end a transaction that wrote and was left idle (db.c, DB_IDLE_TX_TIMEOUT_S), so the
 * waiter gets the row, never a lock wait time-out.  The vanished client
 * is a connection through a forwarder that is then stopped: the server
 * sees no close and no packet. */
Test(db, a_vanished_client_s_row_locks_are_freed_by_the_server, .timeout = 300)
{
	struct cfg_db via = itest_cfg()->db;
	struct db *d = fresh_table(), *gone = NULL;
	int port = itest_free_port();
	char cmd[64];
	pid_t fwd;
	int rc;

	cr_assert_eq(db_exec(d, "INSERT INTO test_db_blob (id, s) VALUES (1, 'a')"), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_commit(d), ST_OK);
	fwd = itest_forward("127.0.0.1", port, via.port);
	via.host = (char *)"127.0.0.1";
	via.port = port;
	via.next = NULL;
	cr_assert_eq(db_open(&gone, &via), ST_OK, "%s", gone != NULL ? db_errmsg(gone) : "");
	cr_assert_eq(db_exec(gone, "UPDATE test_db_blob SET s = 'gone' WHERE id = 1"), ST_OK, "%s", db_errmsg(gone));
	/* socat's child for this connection stops relaying: both sockets
	 * stay open, nothing passes. */
	snprintf(cmd, sizeof cmd, "pkill -STOP -P %d", (int)fwd);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	rc = db_exec(d, "UPDATE test_db_blob SET s = 'live' WHERE id = 1");
	snprintf(cmd, sizeof cmd, "pkill -CONT -P %d", (int)fwd);
	(void)system(cmd); /* before any assertion: a stopped forwarder outlives the test */
	kill(fwd, SIGTERM);
	waitpid(fwd, NULL, 0);
	db_close(&gone);
	cr_assert_eq(rc, ST_OK, "the row a vanished client held is still locked: %s", db_errmsg(d));
	cr_assert_eq(db_commit(d), ST_OK);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM test_db_blob WHERE id = 1 AND s = 'live'"), 1,
	             "the vanished client's update was rolled back, the live one committed");
}

/* What db_multi hands back: the values of the last row it gave. */
struct got {
	int rows;
	int stop_after; /* > 0: return ST_ERR_NOT_FOUND at this row */
	char v[4][1024];
	unsigned long len[4];
	bool null[4];
};

static int got_row(void *arg, int stmt, const char *const *v, const unsigned long *lens, int ncols)
{
	struct got *g = arg;

	(void)stmt;
	cr_assert(ncols <= 4);
	for (int i = 0; i < ncols; i++) {
		g->null[i] = v[i] == NULL;
		g->len[i] = lens[i];
		cr_assert(lens[i] < sizeof g->v[i]);
		if (v[i] != NULL)
			memcpy(g->v[i], v[i], lens[i]);
	}
	g->rows++;
	return g->stop_after > 0 && g->rows == g->stop_after ? ST_ERR_NOT_FOUND : ST_OK;
}

/* Every value sqlbuf splices into SQL comes back from the server exactly:
 * strings with quotes, backslashes, control bytes and UTF-8 (the plain
 * fast path and the connector's escaping alike), any bytes as a hex
 * literal, the extreme integers, and NULL.  A value that broke out of its
 * literal would change the statement, or the value. */
Test(db, sqlbuf_values_reach_the_server_unchanged)
{
	static const char *const strs[] = {
		"", "plain-id_1.2:3", "it's", "back\\slash", "\"dq\"", "\\'; DROP TABLE orders; -- ",
		"nl\nand\rcr\tand\x1a", "\xc3\xbc\xe2\x82\xac\xf0\x9f\x98\x80", "%s%d_%",
	};
	static const int64_t nums[] = { 0, -1, 1, INT64_MAX, INT64_MIN, 1796067065000000 };
	struct db *d = itest_db();
	struct sqlbuf b = { .db = d };
	unsigned char bytes[256];

	for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
		struct got g = { 0 };

		sqlbuf_reset(&b);
		sqlbuf_sql(&b, "SELECT ");
		sqlbuf_str(&b, strs[i]);
		sqlbuf_sql(&b, ", CHAR_LENGTH(");
		sqlbuf_str(&b, strs[i]);
		sqlbuf_sql(&b, ")");
		cr_assert_eq(sqlbuf_err(&b), ST_OK);
		cr_assert_eq(db_multi(d, b.p, b.len, got_row, &g), ST_OK, "%s: %s", b.p, db_errmsg(d));
		cr_assert_eq(g.rows, 1);
		cr_expect_eq(g.len[0], strlen(strs[i]), "string %zu: length %lu", i, g.len[0]);
		cr_expect(memcmp(g.v[0], strs[i], strlen(strs[i])) == 0, "string %zu came back changed", i);
	}
	for (int i = 0; i < 256; i++)
		bytes[i] = (unsigned char)i;
	{
		struct got g = { 0 };

		sqlbuf_reset(&b);
		sqlbuf_sql(&b, "SELECT ");
		sqlbuf_bytes(&b, bytes, sizeof bytes);
		sqlbuf_sql(&b, ", NULL");
		cr_assert_eq(db_multi(d, b.p, b.len, got_row, &g), ST_OK, "%s", db_errmsg(d));
		cr_expect_eq(g.len[0], 256);
		cr_expect(memcmp(g.v[0], bytes, 256) == 0, "bytes came back changed");
		cr_expect(g.null[1], "NULL came back as a value");
	}
	for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
		struct got g = { 0 };
		char want[32];

		sqlbuf_reset(&b);
		sqlbuf_sql(&b, "SELECT ");
		sqlbuf_i64(&b, nums[i]);
		cr_assert_eq(db_multi(d, b.p, b.len, got_row, &g), ST_OK, "%s: %s", b.p, db_errmsg(d));
		snprintf(want, sizeof want, "%lld", (long long)nums[i]);
		cr_expect_str_eq(g.v[0], want);
	}
	{
		struct got g = { 0 };

		sqlbuf_reset(&b);
		sqlbuf_sql(&b, "SELECT UNIX_TIMESTAMP(");
		sqlbuf_unix_us(&b, INT64_C(1796067065000042));
		sqlbuf_sql(&b, ")");
		cr_assert_eq(db_multi(d, b.p, b.len, got_row, &g), ST_OK, "%s: %s", b.p, db_errmsg(d));
		cr_expect_str_eq(g.v[0], "1796067065.000042");
	}
	/* Rows, in a multi-statement request: the separators come out right. */
	{
		struct got g = { 0 };

		sqlbuf_reset(&b);
		sqlbuf_sql(&b, "DROP TABLE IF EXISTS sqlbuf_t; CREATE TABLE sqlbuf_t (a INT, b VARCHAR(8));"
		              " INSERT INTO sqlbuf_t VALUES ");
		sqlbuf_list(&b);
		for (int i = 1; i <= 3; i++) {
			sqlbuf_row(&b);
			sqlbuf_i64(&b, i);
			sqlbuf_str(&b, i == 2 ? "it's" : "x");
			sqlbuf_row_end(&b);
		}
		sqlbuf_sql(&b, "; SELECT COUNT(*), SUM(a), GROUP_CONCAT(b ORDER BY a) FROM sqlbuf_t;"
		               " DROP TABLE sqlbuf_t");
		cr_assert_eq(db_multi(d, b.p, b.len, got_row, &g), ST_OK, "%s: %s", b.p, db_errmsg(d));
		cr_expect_str_eq(g.v[0], "3");
		cr_expect_str_eq(g.v[1], "6");
		cr_expect_str_eq(g.v[2], "x,it's,x");
	}
	sqlbuf_free(&b);
}

/* ---- the counts of a statement's parameters and columns ---------------- */

/* A parameter list longer or shorter than the statement's `?` is refused
 * before anything is sent (the connector would read past the list, or
 * bind NULL for what is missing), and the connection stays usable. */
Test(db, parameter_count_other_than_the_statement_is_an_error)
{
	struct db *d;
	struct db_stmt *ins;
	struct db_param p[3] = { DBP_I64(1), DBP_BLOB("x", 1), DBP_STR("y") };

	itest_cfg();
	d = fresh_table();
	cr_assert_eq(db_prepare(d, &ins, "INSERT INTO test_db_blob (id, b) VALUES (?, ?)"), ST_OK);
	cr_assert_eq(db_stmt_exec(ins, p, 1, NULL), ST_ERR_DB, "one parameter for two");
	cr_assert_str_eq(db_errmsg(d), "parameter count mismatch");
	cr_assert_eq(db_stmt_exec(ins, p, 3, NULL), ST_ERR_DB, "three parameters for two");
	cr_assert_eq(db_stmt_query(ins, p, 0), ST_ERR_DB, "none for two");
	cr_assert_eq(db_stmt_exec_bulk(ins, p, 3, 1, NULL), ST_ERR_DB, "a bulk row of three for two");
	cr_assert(db_connected(d));
	cr_assert_eq(db_stmt_exec(ins, p, 2, NULL), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_commit(d), ST_OK);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM test_db_blob"), 1, "only the right call wrote");
}

/* Columns likewise: a fetch into fewer columns than the result has would
 * let the connector bind the rest from whatever follows, and a fetch into
 * more would leave the extra ones as they were, looking like values. */
Test(db, column_count_other_than_the_result_is_an_error)
{
	struct db *d;
	struct db_stmt *sel;
	char b[16];

	itest_cfg();
	d = fresh_table();
	put_blob(d, 7, 3);
	cr_assert_eq(db_prepare(d, &sel, "SELECT id, b FROM test_db_blob"), ST_OK);
	{
		struct db_col c[1] = { DBC_I64() };
		cr_assert_eq(db_stmt_query(sel, NULL, 0), ST_OK);
		cr_assert_eq(db_stmt_fetch(sel, c, 1), ST_ERR_DB, "one column for two");
		cr_assert_str_eq(db_errmsg(d), "column count mismatch");
	}
	{
		struct db_col c[3] = { DBC_I64(), DBC_BLOB(b, sizeof b), DBC_I64() };
		c[2].i64 = 42;
		cr_assert_eq(db_stmt_query(sel, NULL, 0), ST_OK);
		cr_assert_eq(db_stmt_fetch(sel, c, 3), ST_ERR_DB, "three columns for two");
	}
	{
		struct db_col c[2] = { DBC_I64(), DBC_BLOB(b, sizeof b) };
		cr_assert_eq(db_stmt_query(sel, NULL, 0), ST_OK, "%s", db_errmsg(d));
		cr_assert_eq(db_stmt_fetch(sel, c, ARRAY_LEN(c)), 1, "%s", db_errmsg(d));
		cr_assert_eq(c[0].i64, 7);
		cr_assert_str_eq(b, "abc");
		db_stmt_done(sel);
	}
	db_rollback(d);
	cr_assert(db_connected(d));
}

/* db_stmt_query_row: the first row, or none, and the statement (and the
 * connection) ready for the next query whatever rows were left unread. */
Test(db, query_row_reads_the_first_row_and_releases_the_rest)
{
	struct db *d;
	struct db_stmt *sel;
	struct db_param p[1] = { DBP_I64(0) };
	struct db_col c[2] = { DBC_I64(), DBC_I64() };

	itest_cfg();
	d = fresh_table();
	for (int id = 1; id <= 3; id++)
		put_blob(d, id, (size_t)id);
	cr_assert_eq(db_prepare(d, &sel, "SELECT id, LENGTH(b) FROM test_db_blob WHERE id > ? ORDER BY id"), ST_OK);
	cr_assert_eq(db_stmt_query_row(sel, p, ARRAY_LEN(p), c, ARRAY_LEN(c)), 1, "%s", db_errmsg(d));
	cr_assert_eq(c[0].i64, 1);
	cr_assert_eq(c[1].i64, 1);
	/* Two rows were left: the same statement runs again at once. */
	p[0] = DBP_I64(2);
	cr_assert_eq(db_stmt_query_row(sel, p, ARRAY_LEN(p), c, ARRAY_LEN(c)), 1, "%s", db_errmsg(d));
	cr_assert_eq(c[0].i64, 3);
	p[0] = DBP_I64(3);
	cr_assert_eq(db_stmt_query_row(sel, p, ARRAY_LEN(p), c, ARRAY_LEN(c)), 0, "no row");
	/* And so does another statement on the connection. */
	cr_assert_eq(db_exec(d, "SELECT 1"), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_stmt_query_row(sel, p, 2, c, ARRAY_LEN(c)), ST_ERR_DB, "the counts are checked");
	db_rollback(d);
}

/* ---- how server errors map to our codes -------------------------------- */

Test(db, errors_map_to_status_codes)
{
	struct db *d;
	struct db_stmt *ins;
	struct db_param p[2] = { DBP_I64(1), DBP_BLOB("x", 1) };

	itest_cfg();
	d = fresh_table();
	cr_assert_eq(db_prepare(d, &ins, "INSERT INTO test_db_blob (id, b) VALUES (?, ?)"), ST_OK);
	cr_assert_eq(db_stmt_exec(ins, p, ARRAY_LEN(p), NULL), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_stmt_exec(ins, p, ARRAY_LEN(p), NULL), ST_ERR_DB_DUPLICATE, "%s", db_errmsg(d));
	cr_assert_eq(db_errno(d), 1062);
	cr_assert_eq(db_exec(d, "SELECT * FROM no_such_table"), ST_ERR_DB);
	cr_assert_eq(db_errno(d), 1146);
	cr_assert(strstr(db_errmsg(d), "no_such_table") != NULL, "%s", db_errmsg(d));
	cr_assert_eq(db_exec(d, "SELEC 1"), ST_ERR_DB, "a syntax error");
	cr_assert_eq(db_exec(d, "INSERT INTO test_db_blob (id, s) VALUES (2, 'far longer than eight')"),
	             ST_ERR_DB_DATA, "%s", db_errmsg(d));
	cr_assert(db_connected(d), "none of these ends the connection");
	db_rollback(d);
}

Test(db, refused_account_is_access_and_closed_port_is_conn)
{
	struct cfg_db bad = itest_cfg()->db;
	struct db *d = NULL;
	char why[256];

	bad.next = NULL;
	bad.password = "not-the-password";
	cr_assert_eq(db_open_why(&d, &bad, why, sizeof why), ST_ERR_ACCESS, "%s", why);
	cr_assert_null(d);
	cr_assert(strncmp(why, "1045 ", 5) == 0, "the server's number first: %s", why);
	bad = itest_cfg()->db;
	bad.next = NULL;
	bad.socket = NULL;
	bad.host = "127.0.0.1";
	bad.port = 1; /* nothing listens on tcpmux */
	cr_assert_eq(db_open_why(&d, &bad, why, sizeof why), ST_ERR_DB_CONN, "%s", why);
	cr_assert_null(d);
	cr_assert(strstr(why, "refused") != NULL, "the socket's reason: %s", why);
}

/* A connection the server ends is ST_ERR_DB_CONN and db_connected turns
 * false; db_reconnect prepares every statement again behind the same
 * pointer, so the caller's handles keep working. */
Test(db, lost_connection_reconnects_behind_the_same_statements)
{
	struct db *victim = NULL, *killer;
	struct db_stmt *sel;
	struct db_param p[1] = { DBP_I64(41) };
	struct db_col c[1] = { DBC_I64() };
	char sql[64];
	int64_t id;

	killer = itest_db();
	/* The same account as the killer's: KILL needs no privilege then. */
	cr_assert_eq(db_open(&victim, cfg_migrate_db(itest_cfg())), ST_OK);
	cr_assert_eq(db_prepare(victim, &sel, "SELECT ? + 1"), ST_OK);
	cr_assert_eq(db_stmt_query_row(sel, p, ARRAY_LEN(p), c, ARRAY_LEN(c)), 1, "%s", db_errmsg(victim));
	cr_assert_eq(c[0].i64, 42);
	db_rollback(victim);
	cr_assert_eq(db_prepare(victim, &sel, "SELECT CONNECTION_ID()"), ST_OK);
	cr_assert_eq(db_stmt_query_row(sel, NULL, 0, c, ARRAY_LEN(c)), 1, "%s", db_errmsg(victim));
	id = c[0].i64;
	db_rollback(victim);
	snprintf(sql, sizeof sql, "KILL CONNECTION %lld", (long long)id);
	cr_assert_eq(db_exec(killer, sql), ST_OK, "%s", db_errmsg(killer));
	cr_assert_eq(db_stmt_query_row(sel, NULL, 0, c, ARRAY_LEN(c)), ST_ERR_DB_CONN, "%s", db_errmsg(victim));
	cr_assert_not(db_connected(victim));
	cr_assert_eq(db_reconnect(victim), ST_OK, "%s", db_errmsg(victim));
	cr_assert(db_connected(victim));
	cr_assert_eq(db_stmt_query_row(sel, NULL, 0, c, ARRAY_LEN(c)), 1, "%s", db_errmsg(victim));
	cr_assert_neq(c[0].i64, id, "a new session");
	db_rollback(victim);
	db_close(&victim);
	cr_assert_null(victim, "db_close clears the pointer");
	db_close(&victim); /* and takes NULL */
}

struct deadlock_arg {
	struct db *d;
	int rc;
};

static void *deadlock_other(void *arg)
{
	struct deadlock_arg *a = arg;

	db_thread_init();
	a->rc = db_exec(a->d, "UPDATE test_db_blob SET s = 'b' WHERE id = 1");
	if (a->rc == ST_OK)
		db_commit(a->d);
	else
		db_rollback(a->d);
	db_thread_end();
	return NULL;
}

/* Two transactions that take two rows in opposite orders: the server
 * picks one as the victim (1213), which is ST_ERR_DB_DEADLOCK, and the
 * other goes through once the victim rolled back. */
Test(db, deadlock_is_a_deadlock, .timeout = 120)
{
	struct db *a, *b = NULL;
	struct deadlock_arg other;
	pthread_t t;
	int rc;

	itest_cfg();
	a = fresh_table();
	cr_assert_eq(db_exec(a, "INSERT INTO test_db_blob (id, s) VALUES (1, 'a'), (2, 'a')"), ST_OK);
	cr_assert_eq(db_commit(a), ST_OK);
	cr_assert_eq(db_open(&b, &itest_cfg()->db), ST_OK);
	cr_assert_eq(db_exec(a, "UPDATE test_db_blob SET s = 'x' WHERE id = 1"), ST_OK, "%s", db_errmsg(a));
	cr_assert_eq(db_exec(b, "UPDATE test_db_blob SET s = 'y' WHERE id = 2"), ST_OK, "%s", db_errmsg(b));
	other = (struct deadlock_arg){ .d = b };
	/* b asks for row 1, which a holds... */
	cr_assert_eq(pthread_create(&t, NULL, deadlock_other, &other), 0);
	/* ...and a asks for row 2, which b holds.  Whichever of the two
	 * asks second closes the cycle, so no wait for the first is needed. */
	rc = db_exec(a, "UPDATE test_db_blob SET s = 'x' WHERE id = 2");
	if (rc == ST_OK)
		db_commit(a);
	else
		db_rollback(a);
	cr_assert_eq(pthread_join(t, NULL), 0);
	cr_assert((rc == ST_ERR_DB_DEADLOCK) != (other.rc == ST_ERR_DB_DEADLOCK),
	          "exactly one deadlock victim: a %s, b %s", st_strerror(rc), st_strerror(other.rc));
	cr_assert(rc == ST_OK || other.rc == ST_OK, "the other one went through");
	db_close(&b);
}

/* ---- text SQL ----------------------------------------------------------- */

/* db_multi stops at the first failing statement and returns its code; the
 * statements before it are done inside the open transaction (so the caller
 * rolls back), the connection stays usable, and a row function's own
 * error stops its calls and comes back as the result. */
Test(db, multi_stops_at_the_first_error_and_keeps_the_connection)
{
	struct db *d;
	struct got g = { 0 };
	static const char bad[] = "INSERT INTO test_db_blob (id, s) VALUES (1, 'a');"
	                          " INSERT INTO test_db_blob (id, s) VALUES (1, 'b');"
	                          " INSERT INTO test_db_blob (id, s) VALUES (3, 'c')";
	static const char three[] = "SELECT 1; SELECT 2; SELECT 3";

	itest_cfg();
	d = fresh_table();
	cr_assert_eq(db_multi(d, bad, sizeof bad - 1, NULL, NULL), ST_ERR_DB_DUPLICATE, "%s", db_errmsg(d));
	cr_assert(db_connected(d));
	cr_assert_eq(db_multi(d, "SELECT COUNT(*), MAX(s) FROM test_db_blob", 41, got_row, &g), ST_OK, "%s",
	             db_errmsg(d));
	cr_assert_str_eq(g.v[0], "1", "the statement before the failure is done, the one after is not");
	cr_assert_str_eq(g.v[1], "a");
	db_rollback(d);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM test_db_blob"), 0, "and rolled back with the transaction");
	/* The row function says stop: no more calls, its code comes back, the
	 * remaining results are read. */
	memset(&g, 0, sizeof g);
	g.stop_after = 2;
	cr_assert_eq(db_multi(d, three, sizeof three - 1, got_row, &g), ST_ERR_NOT_FOUND);
	cr_assert_eq(g.rows, 2);
	cr_assert_eq(db_exec(d, "SELECT 1"), ST_OK, "the connection is in step: %s", db_errmsg(d));
	db_rollback(d);
}

/* db_escape: any bytes come back from a quoted literal as they went in,
 * also under NO_BACKSLASH_ESCAPES, where a backslash is a plain character
 * and only the quote is doubled. */
Test(db, escape_round_trips_any_bytes_in_both_sql_modes)
{
	static const char raw[] = "it's \\ a \"test\"\n\r\x1a and a \0 NUL";
	struct db *d = NULL;
	char esc[2 * sizeof raw + 1];
	char sql[3 * sizeof raw + 64];

	itest_cfg();
	cr_assert_eq(db_open(&d, &itest_cfg()->db), ST_OK);
	for (int mode = 0; mode < 2; mode++) {
		struct got g = { 0 };
		size_t n, len;

		if (mode == 1)
			cr_assert_eq(db_exec(d, "SET SESSION sql_mode = CONCAT(@@sql_mode, ',NO_BACKSLASH_ESCAPES')"),
			             ST_OK, "%s", db_errmsg(d));
		n = db_escape(d, esc, raw, sizeof raw - 1);
		cr_assert_neq(n, SIZE_MAX);
		cr_assert_lt(n, sizeof esc);
		len = (size_t)snprintf(sql, sizeof sql, "SELECT '");
		memcpy(sql + len, esc, n);
		len += n;
		len += (size_t)snprintf(sql + len, sizeof sql - len, "'");
		cr_assert_eq(db_multi(d, sql, len, got_row, &g), ST_OK, "mode %d: %s", mode, db_errmsg(d));
		cr_assert_eq(g.len[0], sizeof raw - 1, "mode %d: length %lu", mode, g.len[0]);
		cr_assert(memcmp(g.v[0], raw, sizeof raw - 1) == 0, "mode %d: the value came back changed", mode);
	}
	db_close(&d);
}

/* db_exec_script runs every statement of a file; db_stmt_exec_bulk writes
 * many rows in one request; the round-trip counter counts requests. */
Test(db, script_and_bulk_write_their_rows_and_count_requests)
{
	struct db *d;
	struct db_stmt *ins;
	static const char script[] = "INSERT INTO test_db_blob (id, s) VALUES (1, 'a');\n"
	                             "UPDATE test_db_blob SET s = 'b' WHERE id = 1;\n"
	                             "INSERT INTO test_db_blob (id, s) VALUES (2, 'c');\n";
	struct db_param rows[3][2];
	uint64_t before, affected = 0;

	itest_cfg();
	d = fresh_table();
	cr_assert_eq(db_exec_script(d, script, sizeof script - 1), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_commit(d), ST_OK);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM test_db_blob WHERE (id, s) IN ((1, 'b'), (2, 'c'))"), 2);
	cr_assert_eq(db_prepare(d, &ins, "INSERT INTO test_db_blob (id, s) VALUES (?, ?)"), ST_OK);
	for (int r = 0; r < 3; r++) {
		rows[r][0] = DBP_I64(10 + r);
		rows[r][1] = DBP_STR(r == 1 ? "it's" : "x");
	}
	before = db_round_trips(d);
	cr_assert_eq(db_stmt_exec_bulk(ins, &rows[0][0], ARRAY_LEN(rows[0]), ARRAY_LEN(rows), &affected), ST_OK,
	             "%s", db_errmsg(d));
	cr_assert_eq(db_round_trips(d) - before, 1, "one request for three rows");
	cr_assert_eq(affected, 3);
	cr_assert_eq(db_commit(d), ST_OK);
	cr_assert_eq(db_round_trips(d) - before, 2, "and one for the COMMIT");
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM test_db_blob WHERE id >= 10"), 3);
	cr_assert_eq(itest_int("SELECT COUNT(*) FROM test_db_blob WHERE id = 11 AND s = 'it''s'"), 1);
	/* Single executions again afterwards. */
	struct db_param one[2] = { DBP_I64(20), DBP_STR("y") };
	cr_assert_eq(db_stmt_exec(ins, one, ARRAY_LEN(one), &affected), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(affected, 1);
	cr_assert_eq(db_stmt_insert_id(ins), 0, "no AUTO_INCREMENT column");
	cr_assert_eq(db_commit(d), ST_OK);
}

/* Issue 22 item 3: the first error stands.  A rollback after a failed
 * statement that itself fails (the connection died meanwhile) used to
 * replace the statement's error with its own "Lost connection", so a
 * message dead-lettered for the first said the second. */
Test(db, a_failed_rollback_keeps_the_first_error)
{
	struct db *d = NULL;
	struct got g = { 0 };
	char root[4096], cmd[4400];
	static const char q[] = "SELECT CONNECTION_ID()";

	cr_assert_eq(db_open(&d, cfg_migrate_db(itest_cfg())), ST_OK);
	cr_assert_eq(db_multi(d, q, sizeof q - 1, got_row, &g), ST_OK, "%s", db_errmsg(d));
	cr_assert_eq(db_exec(d, "SELECT * FROM test_db_no_such_table"), ST_ERR_DB);
	cr_assert_eq(db_errno(d), 1146u);
	snprintf(cmd, sizeof cmd, "%s sql -e 'KILL CONNECTION %s' >&2", itest_source("scripts/stack", root, sizeof root),
	         g.v[0]);
	cr_assert_eq(system(cmd), 0, "KILL CONNECTION %s", g.v[0]);
	db_rollback(d);
	cr_assert(!db_connected(d), "a failed rollback ends the connection");
	cr_expect_eq(db_errno(d), 1146u, "the first error stands, not %u %s", db_errno(d), db_errmsg(d));
	cr_expect_neq(strstr(db_errmsg(d), "test_db_no_such_table"), NULL, "detail: %s", db_errmsg(d));
	db_close(&d);
}

/* Issue 24 item 5: a sqlbuf grows no further than one request may be (the
 * server's max_allowed_packet, read at connect, less a margin), or than
 * its own ceiling; growing past it is ST_ERR_DB_DATA with the size in the
 * connection's error, before anything is sent. */
Test(db, sqlbuf_refuses_to_grow_past_the_request_limit)
{
	struct db *d = itest_db();
	struct sqlbuf b = { .db = d };
	struct sqlbuf small = { .db = d, .max = 100 };
	int64_t packet = itest_int("SELECT @@max_allowed_packet");
	size_t n = db_max_request(d) / 2 + 16;
	char *big = calloc(1, n);

	cr_assert_not_null(big);
	cr_assert_eq((int64_t)db_max_packet(d), packet, "read at connect");
	cr_assert(db_max_request(d) < (size_t)packet && db_max_request(d) > (size_t)packet / 2);
	sqlbuf_sql(&b, "SELECT ");
	sqlbuf_bytes(&b, big, n); /* hex: twice n, past the limit */
	cr_assert_eq(sqlbuf_err(&b), ST_ERR_DB_DATA);
	cr_assert_neq(strstr(db_errmsg(d), "max_allowed_packet"), NULL, "detail: %s", db_errmsg(d));
	cr_assert(b.cap <= db_max_request(d), "never grew past it (%zu)", b.cap);
	sqlbuf_sql(&small, "SELECT 'this fits'");
	cr_assert_eq(sqlbuf_err(&small), ST_OK);
	for (int i = 0; i < 10; i++)
		sqlbuf_sql(&small, ", 'and more'");
	cr_assert_eq(sqlbuf_err(&small), ST_ERR_DB_DATA, "its own ceiling");
	cr_assert(small.len < 100);
	sqlbuf_free(&b);
	sqlbuf_free(&small);
	free(big);
}

/* Issue 24 item 6: 1242 is translated here, like every server error, so
 * inbox_write.c's claim guard reads a code, not mysql's number. */
Test(db, a_subquery_of_two_rows_maps_to_its_code)
{
	struct db *d = itest_db();

	cr_assert_eq(db_exec(d, "SET @test_db_guard = (SELECT 1 UNION ALL SELECT 2)"), ST_ERR_DB_CARDINALITY, "%s",
	             db_errmsg(d));
	db_rollback(d);
}
