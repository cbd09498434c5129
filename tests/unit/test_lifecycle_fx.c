/*
 * test_lifecycle_fx.c - a definition's own SQL statements (issue 45), as
 * lc_fx_compile reads them: what reaches the server (every parameter a
 * `?`, :applied_at the server's clock), what is refused before anything
 * runs, and whether two arrival orders can end differently.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "lifecycle_fx.h"

/* The names an event of the test declares: data.account_id (string),
 * data.amount_cents (integer), and the built-in ones. */
static int names(void *arg, const char *name, size_t len, struct lc_fx_param *out)
{
	static const struct {
		const char *name;
		enum lc_fx_src src;
		int set;
	} known[] = {
		{ "message_id", LC_FX_MESSAGE_ID, -1 }, { "source", LC_FX_SOURCE, -1 },
		{ "invoice_id", LC_FX_KEY, -1 },        { "occurred_at", LC_FX_SET, 2 },
		{ "data.account_id", LC_FX_SET, 0 },    { "data.amount_cents", LC_FX_SET, 1 },
	};

	(void)arg;
	for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
		if (strlen(known[i].name) == len && memcmp(known[i].name, name, len) == 0) {
			out->src = known[i].src;
			out->set = known[i].set;
			return 0;
		}
	}
	return -1;
}

static struct lc_fx fx;
static char why[256];

static bool compile(const char *sql)
{
	memset(&fx, 0, sizeof fx);
	why[0] = '\0';
	return lc_fx_compile(sql, names, NULL, &fx, why, sizeof why);
}

Test(lifecycle_fx, every_parameter_is_bound_and_applied_at_is_the_server_s_clock)
{
	cr_assert(compile("INSERT INTO ledger (account_id, amount_cents, message_id, at, booked)"
	                  " VALUES (:data.account_id, :data.amount_cents, :message_id, :applied_at, ':not_a_param')"),
	          "%s", why);
	cr_expect_str_eq(fx.sql, "INSERT INTO ledger (account_id, amount_cents, message_id, at, booked)"
	                         " VALUES (?, ?, ?, NOW(6), ':not_a_param')");
	cr_expect_eq(fx.kind, LC_FX_INSERT);
	cr_assert_eq(fx.nparams, 3);
	cr_expect(fx.params[0].src == LC_FX_SET && fx.params[0].set == 0);
	cr_expect(fx.params[1].src == LC_FX_SET && fx.params[1].set == 1);
	cr_expect(fx.params[2].src == LC_FX_MESSAGE_ID);
	cr_expect_str_eq(fx.table, "ledger");
	cr_expect(fx.commutes, "an insert keyed by the message: %s", fx.why);
}

Test(lifecycle_fx, only_one_data_changing_statement_is_taken)
{
	static const char *const refused[][2] = {
		{ "SELECT * FROM accounts", "INSERT, UPDATE, DELETE or REPLACE" },
		{ "DROP TABLE accounts", "INSERT, UPDATE, DELETE or REPLACE" },
		{ "COMMIT", "INSERT, UPDATE, DELETE or REPLACE" },
		{ "UPDATE a SET b = 1; DROP TABLE a", "one statement" },
		{ "UPDATE a SET b = ? WHERE id = :message_id", "named parameter" },
		{ "UPDATE a SET b = 1 /* hidden */", "comment" },
		{ "UPDATE a SET b = 1 -- hidden", "comment" },
		{ "UPDATE a SET b = @x", "variable" },
		{ "UPDATE a SET b = :data.acount_id", ":data.acount_id" },
		{ "UPDATE a SET b = 'open", "quote" },
		{ "", "INSERT, UPDATE, DELETE or REPLACE" },
	};

	for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
		cr_expect(!compile(refused[i][0]), "accepted: %s", refused[i][0]);
		cr_expect(strstr(why, refused[i][1]) != NULL, "%s: %s", refused[i][0], why);
	}
}

Test(lifecycle_fx, additions_and_inserts_by_the_message_commute_assignments_do_not)
{
	cr_assert(compile("UPDATE accounts SET balance_cents = balance_cents + :data.amount_cents,"
	                  " payments = payments + 1 WHERE id = :data.account_id"), "%s", why);
	cr_expect(fx.commutes, "%s", fx.why);
	cr_expect_eq(fx.kind, LC_FX_UPDATE);

	cr_assert(compile("UPDATE accounts SET balance_cents = balance_cents - (:data.amount_cents * 2)"
	                  " WHERE id = :data.account_id"), "%s", why);
	cr_expect(fx.commutes, "%s", fx.why);

	cr_assert(compile("UPDATE accounts SET last_invoice = :invoice_id WHERE id = :data.account_id"), "%s", why);
	cr_expect(!fx.commutes);
	cr_expect(strstr(fx.why, "last_invoice") != NULL, "%s", fx.why);

	cr_assert(compile("UPDATE accounts SET balance_cents = balance_cents + 1 WHERE balance_cents > 0"), "%s", why);
	cr_expect(!fx.commutes, "a WHERE that reads what it adds to");

	cr_assert(compile("INSERT INTO ledger (account_id) VALUES (:data.account_id)"), "%s", why);
	cr_expect(!fx.commutes, "an insert not keyed by the message");
	cr_expect(strstr(fx.why, ":message_id") != NULL, "%s", fx.why);

	cr_assert(compile("INSERT IGNORE INTO ledger (message_id) VALUES (:message_id)"), "%s", why);
	cr_expect(!fx.commutes);

	cr_assert(compile("REPLACE INTO ledger (message_id) VALUES (:message_id)"), "%s", why);
	cr_expect(!fx.commutes);
	cr_expect_eq(fx.kind, LC_FX_REPLACE);

	cr_assert(compile("DELETE FROM ledger WHERE account_id = :data.account_id"), "%s", why);
	cr_expect(!fx.commutes);
	cr_expect_eq(fx.kind, LC_FX_DELETE);
	cr_expect_str_eq(fx.table, "ledger");
}

/* The shapes a checker reads what a statement wrote by (inbox-loadgen
 * verify): read once, with the definition. */
static void expect_col(int i, const char *name, enum lc_fx_value_kind kind, int param, const char *text)
{
	cr_assert_lt(i, fx.ncols, "column %d of %d", i, fx.ncols);
	cr_expect_str_eq(fx.cols[i].name, name);
	cr_expect_eq(fx.cols[i].v.kind, kind, "%s: kind %d", name, (int)fx.cols[i].v.kind);
	if (kind == LC_FX_VAL_PARAM)
		cr_expect_eq(fx.cols[i].v.param, param, "%s: parameter %d", name, fx.cols[i].v.param);
	if (text != NULL)
		cr_expect_str_eq(fx.cols[i].v.text, text);
}

Test(lifecycle_fx, an_insert_of_one_row_has_each_column_s_value)
{
	cr_assert(compile("INSERT INTO ledger_entries (message_id, kind, account_id, invoice_id, amount_cents, entry_at,"
	                  " note, n) VALUES (:message_id, 'payment', :data.account_id, :invoice_id, :data.amount_cents,"
	                  " :applied_at, 'it''s \\\\ \\'so\\'', -5)"), "%s", why);
	cr_assert_eq(fx.shape, LC_FX_SHAPE_INSERT, "%s", fx.why);
	cr_assert_eq(fx.ncols, 8);
	expect_col(0, "message_id", LC_FX_VAL_PARAM, 0, NULL);
	expect_col(1, "kind", LC_FX_VAL_STRING, -1, "payment");
	expect_col(2, "account_id", LC_FX_VAL_PARAM, 1, NULL);
	expect_col(3, "invoice_id", LC_FX_VAL_PARAM, 2, NULL);
	expect_col(4, "amount_cents", LC_FX_VAL_PARAM, 3, NULL);
	expect_col(5, "entry_at", LC_FX_VAL_CLOCK, -1, NULL);
	expect_col(6, "note", LC_FX_VAL_STRING, -1, "it's \\ 'so'");
	expect_col(7, "n", LC_FX_VAL_NUMBER, -1, "-5");
	cr_expect_eq(fx.params[fx.cols[3].v.param].src, LC_FX_KEY);

	cr_assert(compile("INSERT INTO `ledger` (`message_id`, `kind`) VALUE (:message_id, \"x\")"), "%s", why);
	cr_assert_eq(fx.shape, LC_FX_SHAPE_INSERT);
	expect_col(0, "message_id", LC_FX_VAL_PARAM, 0, NULL);
	expect_col(1, "kind", LC_FX_VAL_STRING, -1, "x");
}

Test(lifecycle_fx, an_addition_by_key_has_its_column_sign_and_key)
{
	cr_assert(compile("UPDATE accounts SET balance_cents = balance_cents + :data.amount_cents WHERE id = :data.account_id"),
	          "%s", why);
	cr_assert_eq(fx.shape, LC_FX_SHAPE_ADD, "%s", fx.why);
	cr_expect_str_eq(fx.add_column, "balance_cents");
	cr_expect_eq(fx.add_sign, 1);
	cr_expect(fx.add.kind == LC_FX_VAL_PARAM && fx.add.param == 0);
	cr_assert_eq(fx.ncols, 1);
	expect_col(0, "id", LC_FX_VAL_PARAM, 1, NULL);

	cr_assert(compile("UPDATE `accounts` SET `refunds` = refunds - :data.amount_cents WHERE kind = 'shop' AND"
	                  " `id` = :data.account_id AND region = 3"), "%s", why);
	cr_assert_eq(fx.shape, LC_FX_SHAPE_ADD, "%s", fx.why);
	cr_expect_str_eq(fx.add_column, "refunds");
	cr_expect_eq(fx.add_sign, -1);
	cr_assert_eq(fx.ncols, 3);
	expect_col(0, "id", LC_FX_VAL_PARAM, 1, NULL);
	expect_col(1, "kind", LC_FX_VAL_STRING, -1, "shop");
	expect_col(2, "region", LC_FX_VAL_NUMBER, -1, "3");

	cr_assert(compile("UPDATE accounts SET payments = payments + 1 WHERE id = :data.account_id"), "%s", why);
	cr_assert_eq(fx.shape, LC_FX_SHAPE_ADD);
	cr_expect(fx.add.kind == LC_FX_VAL_NUMBER && strcmp(fx.add.text, "1") == 0);
	expect_col(0, "id", LC_FX_VAL_PARAM, 0, NULL);
}

Test(lifecycle_fx, any_other_statement_has_no_shape)
{
	static const char *const none[] = {
		"INSERT INTO ledger (message_id, a) VALUES (:message_id, :data.amount_cents * 2)",
		"INSERT INTO ledger (message_id, a) VALUES (:message_id, NOW())",
		"INSERT INTO ledger (message_id, a) VALUES (:message_id, NULL)",
		"INSERT INTO ledger (message_id, a) VALUES (:message_id)",
		"INSERT INTO ledger (message_id) VALUES (:message_id), (:source)",
		"INSERT INTO ledger SET message_id = :message_id",
		"INSERT INTO ledger (message_id) SELECT :message_id",
		"INSERT INTO ledger (account_id) VALUES (:data.account_id)",
		"INSERT INTO other.ledger (message_id) VALUES (:message_id)",
		"INSERT IGNORE INTO ledger (message_id) VALUES (:message_id)",
		"INSERT INTO ledger (message_id) VALUES (:message_id) ON DUPLICATE KEY UPDATE n = n + 1",
		"REPLACE INTO ledger (message_id) VALUES (:message_id)",
		"DELETE FROM ledger WHERE message_id = :message_id",
		"UPDATE accounts SET b = b + :data.amount_cents, n = n + 1 WHERE id = :data.account_id",
		"UPDATE accounts SET b = b + (:data.amount_cents * 2) WHERE id = :data.account_id",
		"UPDATE accounts SET b = b + :data.amount_cents WHERE id = :data.account_id OR id = 2",
		"UPDATE accounts SET b = b + :data.amount_cents WHERE id > :data.account_id",
		"UPDATE accounts SET b = b + :data.amount_cents WHERE id = :data.account_id AND kind = :source",
		"UPDATE accounts SET b = b + :data.amount_cents WHERE id = 7",
		"UPDATE accounts SET b = b + :data.amount_cents",
		"UPDATE accounts SET b = b + :data.amount_cents WHERE id = :data.account_id LIMIT 1",
		"UPDATE other.accounts SET b = b + :data.amount_cents WHERE id = :data.account_id",
		"UPDATE accounts SET last = :invoice_id WHERE id = :data.account_id",
	};

	for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
		cr_assert(compile(none[i]), "%s: %s", none[i], why);
		cr_expect_eq(fx.shape, LC_FX_SHAPE_NONE, "a shape for: %s", none[i]);
	}
}
