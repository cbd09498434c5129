/*
 * test_args.c - args_value, the option reader of `inbox-worker dlq` and
 * `inbox-loadgen`: both spellings, a name that only starts the same, and
 * a value that is missing.
 */
#include <criterion/criterion.h>
#include <stdbool.h>

#include "args.h"

Test(args, both_spellings_give_the_value_and_advance_past_a_separate_one)
{
	char *argv[] = { "dlq", "--reason=x", "--reason", "y", "--limit", NULL };
	bool missing = false;
	int i = 1;

	cr_assert_str_eq(args_value(5, argv, &i, "--reason", &missing), "x");
	cr_assert_eq(i, 1, "a joined value does not advance");
	i = 2;
	cr_assert_str_eq(args_value(5, argv, &i, "--reason", &missing), "y");
	cr_assert_eq(i, 3, "a separate value is consumed");
	cr_assert_not(missing);
}

Test(args, another_option_or_a_longer_name_is_not_this_one)
{
	char *argv[] = { "dlq", "--reasons", "--id", "--reason-x=1", NULL };
	bool missing = false;

	for (int k = 1; k < 4; k++) {
		int i = k;
		cr_assert_null(args_value(4, argv, &i, "--reason", &missing), "%s", argv[k]);
		cr_assert_eq(i, k);
	}
	cr_assert_not(missing);
}

Test(args, a_value_missing_at_the_end_is_reported)
{
	char *argv[] = { "dlq", "--since", NULL };
	bool missing = false;
	int i = 1;

	cr_assert_null(args_value(2, argv, &i, "--since", &missing));
	cr_assert(missing);
	cr_assert_eq(i, 1);
}
