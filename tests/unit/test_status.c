/*
 * test_status.c - every st_code has a string, so a code added to status.h
 * without one in status.c fails here rather than in a log line at 3 a.m.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "status.h"

Test(status, every_code_has_a_string)
{
	for (int code = ST_OK; code >= ST_CODE_MIN; code--) {
		const char *s = st_strerror(code);

		cr_assert_not_null(s, "code %d", code);
		cr_assert_str_neq(s, "unknown status", "code %d has no string", code);
		cr_assert_gt(strlen(s), 0, "code %d has an empty string", code);
	}
}

Test(status, codes_have_distinct_strings)
{
	for (int a = ST_OK; a >= ST_CODE_MIN; a--)
		for (int b = a - 1; b >= ST_CODE_MIN; b--)
			cr_assert_str_neq(st_strerror(a), st_strerror(b), "codes %d and %d", a, b);
}

Test(status, out_of_range_code_is_unknown)
{
	cr_assert_str_eq(st_strerror(ST_CODE_MIN - 1), "unknown status");
	cr_assert_str_eq(st_strerror(1), "unknown status");
	cr_assert_str_eq(st_strerror(-1000), "unknown status");
	cr_assert_str_eq(st_strerror(1000), "unknown status");
}

Test(status, ok_is_ok)
{
	cr_assert_str_eq(st_strerror(ST_OK), "ok");
}
