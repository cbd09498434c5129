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
