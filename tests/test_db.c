/*
 * test_db.c - the db_ boundary against the real MariaDB: values longer than
 * a fixed buffer are refused, a DBC_GROW column grows to fit them up to its
 * limit, and a value refused by its column maps to ST_ERR_DB_DATA.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

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
	struct db_param p[2] = { DBP_I64(id), DBP_BLOB(v, len) };
	cr_assert_eq(db_stmt_exec(ins, p, 2, NULL), ST_OK, "%s", db_errmsg(d));
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
		struct db_col c[2] = { DBC_I64(), DBC_GROW(&buf, &cap, 200000) };
		cr_assert_eq(db_stmt_fetch(sel, c, 2), 1, "%s", db_errmsg(d));
		cr_assert_eq(c[0].i64, want);
		cr_assert_eq(c[1].len, want == 1 ? 10u : 100000u);
		cr_assert_eq(buf[0], 'a');
		cr_assert_eq(buf[c[1].len - 1], (char)('a' + (c[1].len - 1) % 26));
		cr_assert_eq(buf[c[1].len], '\0');
	}
	{
		struct db_col c[2] = { DBC_I64(), DBC_GROW(&buf, &cap, 200000) };
		cr_assert_eq(db_stmt_fetch(sel, c, 2), 0);
	}
	/* Over the limit: a data error, not a broken connection. */
	cr_assert_eq(db_stmt_query(sel, NULL, 0), ST_OK);
	{
		struct db_col c[2] = { DBC_I64(), DBC_GROW(&buf, &cap, 50) };
		cr_assert_eq(db_stmt_fetch(sel, c, 2), 1);
		cr_assert_eq(db_stmt_fetch(sel, c, 2), ST_ERR_DB_DATA);
	}
	/* A fixed buffer is never cut silently. */
	cr_assert_eq(db_stmt_query(sel, NULL, 0), ST_OK);
	{
		struct db_col c[2] = { DBC_I64(), DBC_BLOB(small, sizeof small) };
		cr_assert_eq(db_stmt_fetch(sel, c, 2), 1);
		cr_assert_lt(db_stmt_fetch(sel, c, 2), 0);
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
	struct db_param p[2] = { DBP_I64(1), DBP_STR("far longer than eight") };
	cr_assert_eq(db_stmt_exec(ins, p, 2, NULL), ST_ERR_DB_DATA, "%s", db_errmsg(d));
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
	cr_assert_eq(db_exec(holder, "UPDATE test_db_blob SET s = 'b' WHERE id = 1"), ST_OK, "%s", db_errmsg(holder));
	cr_assert_eq(db_open(&waiter, &itest_cfg()->db), ST_OK);
	cr_assert_eq(db_exec(waiter, "UPDATE test_db_blob SET s = 'c' WHERE id = 1"), ST_ERR_DB_LOCK_TIMEOUT, "%s",
	             db_errmsg(waiter));
	cr_assert(db_connected(waiter), "the connection survives a lock wait time-out");
	db_rollback(waiter);
	db_close(&waiter);
	db_rollback(holder);
}

/* What db_multi hands back: the values of the last row it gave. */
struct got {
	int rows;
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
	return ST_OK;
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
