/*
 * test_args.c - the option table parser of `inbox-worker dlq | migrate |
 * cleanup` and `inbox-loadgen` (args.h): both spellings, a name that only
 * starts the same, a value that is missing, an option of another command,
 * a repeatable option's ceiling, and what is left for cfg_load.
 */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "args.h"

struct t_opts {
	bool yes;
	const char *who;
	const char *tags[2];
	int ntags;
	long count;
	long since;
	double share;
};

enum { T_A, T_B, T_N };
static const char *const t_names[] = { "alpha", "beta" };
static const struct args_opt t_table[] = {
	{ "--yes", ARGS_BIT(T_A), ARGS_FLAG, 0, 0, offsetof(struct t_opts, yes), 0, NULL, "yes" },
	{ "--who", ARGS_ALL, ARGS_STR, 0, 0, offsetof(struct t_opts, who), 0, "W", "who" },
	{ "--tag", ARGS_ALL, ARGS_STRS, 0, 2, offsetof(struct t_opts, tags), offsetof(struct t_opts, ntags), "T", "tag" },
	{ "--count", ARGS_BIT(T_B), ARGS_LONG, 1, ARGS_NO_MAX, offsetof(struct t_opts, count), 0, "N", "count" },
	{ "--since", ARGS_ALL, ARGS_DUR, 1, ARGS_NO_MAX, offsetof(struct t_opts, since), 0, "D", "since" },
	{ "--share", ARGS_ALL, ARGS_SHARE, 0, 0, offsetof(struct t_opts, share), 0, "F", "share" },
};
static const struct args_spec t_spec = { "t ", t_names, T_N, t_table, sizeof t_table / sizeof t_table[0], NULL };

/* args_take on a copy of words (argv[0] first); the error line in err. */
static enum args_result take(size_t cmd, struct t_opts *o, char **argv, int *argc, char *err, size_t cap)
{
	memset(o, 0, sizeof *o);
	err[0] = '\0';
	return args_take(&t_spec, cmd, argc, argv, o, err, cap);
}

Test(args, the_table_takes_its_options_and_leaves_the_settings_in_order)
{
	char *argv[] = { "t", "--threads", "4", "--yes", "--who=me", "--tag", "a", "--tag=b", "--queue", "q",
		         "--since", "5m", "--share", "0.5", NULL };
	int argc = 14;
	struct t_opts o;
	char err[256];

	cr_assert_eq(take(T_A, &o, argv, &argc, err, sizeof err), ARGS_OK, "%s", err);
	cr_assert(o.yes);
	cr_assert_str_eq(o.who, "me");
	cr_assert_eq(o.ntags, 2);
	cr_assert_str_eq(o.tags[0], "a");
	cr_assert_str_eq(o.tags[1], "b");
	cr_assert_eq(o.since, 300);
	cr_assert_float_eq(o.share, 0.5, 1e-9);
	cr_assert_eq(argc, 5);
	cr_assert_str_eq(argv[0], "t");
	cr_assert_str_eq(argv[1], "--threads");
	cr_assert_str_eq(argv[2], "4");
	cr_assert_str_eq(argv[3], "--queue");
	cr_assert_str_eq(argv[4], "q");
	cr_assert_null(argv[5]);
}

Test(args, each_error_is_one_line_naming_the_option)
{
	static const struct {
		size_t cmd;
		const char *words[4];
		const char *line;
	} cases[] = {
		{ T_B, { "--yes" }, "--yes: only for t alpha" },
		{ T_A, { "--count", "3" }, "--count: only for t beta" },
		{ T_A, { "--yes=1" }, "--yes: takes no value" },
		{ T_A, { "--who" }, "--who: missing value" },
		{ T_A, { "--tag", "a", "--tag=b", "--tag=c" }, "--tag: at most 2" },
		{ T_B, { "--count", "x" }, "--count: not a positive number: 'x'" },
		{ T_B, { "--count=0" }, "--count: not a positive number: '0'" },
		{ T_A, { "--since", "5x" }, "--since: bad duration: '5x' (use e.g. 30s, 10m, 7d)" },
		{ T_A, { "--since", "0" }, "--since: must be positive: '0'" },
		{ T_A, { "--share", "2" }, "--share: not a share between 0 and 1: '2'" },
	};

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *argv[6] = { "t" };
		int argc = 1;
		struct t_opts o;
		char err[256];

		for (int k = 0; k < 4 && cases[i].words[k] != NULL; k++)
			argv[argc++] = (char *)cases[i].words[k];
		argv[argc] = NULL;
		cr_expect_eq(take(cases[i].cmd, &o, argv, &argc, err, sizeof err), ARGS_ERROR, "%s", cases[i].line);
		cr_expect_str_eq(err, cases[i].line);
	}
}

Test(args, help_and_version_win_over_any_error)
{
	char *help[] = { "t", "--count", "x", "--bogus", "-h", NULL };
	char *version[] = { "t", "--since", "5x", "--version", NULL };
	int n1 = 5, n2 = 4;
	struct t_opts o;
	char err[256];

	cr_assert_eq(take(T_B, &o, help, &n1, err, sizeof err), ARGS_HELP);
	cr_assert_eq(take(T_A, &o, version, &n2, err, sizeof err), ARGS_VERSION);
}

Test(args, find_names_a_command)
{
	cr_assert_eq(args_find(t_names, T_N, "beta"), T_B);
	cr_assert_eq(args_find(t_names, T_N, "gamma"), -1);
}

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
