/*
 * args.h - the options of a program's commands as one declarative table
 * (name, the commands that take it, kind, bounds, field, help), read by
 * one parser, and printed from the same rows as --help and as the man
 * page's definition list.  inbox-worker dlq (worker/cmd_dlq.c), migrate,
 * cleanup and every inbox-loadgen command read their own options so; what
 * is left over are the settings' flags, for cfg_load (cfg.c, the other
 * table: settings that also come from the environment and _FILE forms).
 *
 * Rules every command shares, so that no two say the same thing two ways:
 * - "--name value" and "--name=value"; a flag takes no value.
 * - --help, -h and --version win wherever they stand and whatever else is
 *   wrong (as in cfg_load).
 * - An option of the table that this command does not take is an error
 *   naming the commands that do ("--limit: only for dlq replay"), not a
 *   setting passed on, nor silently accepted.
 * - Every error is one line that starts with the option's name.
 *
 * Ownership: strings stored (ARGS_STR, ARGS_STRS) point into argv, which
 * must outlive them; nothing is allocated.
 */
#ifndef INBOX_ARGS_H
#define INBOX_ARGS_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* A range without a ceiling.  [1, ARGS_NO_MAX] reads as "positive": a
 * number's error is then "not a positive number", a duration's "must be
 * positive". */
#define ARGS_NO_MAX LONG_MAX

enum args_kind {
	ARGS_FLAG,    /* bool, no value */
	ARGS_STR,     /* const char *; the last one given wins */
	ARGS_STRS,    /* repeatable: const char *[max] at off, their int count at count_off */
	ARGS_LONG,    /* long in [min, max] */
	ARGS_INT,     /* int in [min, max] */
	ARGS_U64,     /* uint64_t in [min, max] */
	ARGS_RATE,    /* double holding a whole number in [min, max] */
	ARGS_SHARE,   /* double in [0, 1] */
	ARGS_DUR,     /* long seconds in [min, max], as cfg_parse_duration reads them */
	ARGS_DUR_INT, /* int seconds likewise */
	ARGS_TAG,     /* char[max + 1]: 1..max of [A-Za-z0-9] */
};

struct args_opt {
	const char *name;    /* "--reason" */
	unsigned cmds;       /* bit i: command i of the spec takes it */
	enum args_kind kind;
	long min, max;       /* bounds; ARGS_STRS: max is the array's length; ARGS_TAG: the longest */
	size_t off;          /* of the value in the options struct */
	size_t count_off;    /* ARGS_STRS: of the int count */
	const char *metavar; /* NULL for a flag */
	const char *help;    /* one line of --help and the man page; the default is added */
};

/* One program's (or one command's) options and the names of the commands
 * the bits of args_opt.cmds stand for. */
struct args_spec {
	const char *prefix;             /* before a command's name in errors: "dlq " */
	const char *const *cmd_names;   /* index = bit */
	size_t ncmds;
	const struct args_opt *opts;
	size_t nopts;
	const void *defaults;           /* what --help shows as defaults; NULL: none */
};

#define ARGS_BIT(i) (1u << (i))
#define ARGS_ALL (~0u)

enum args_result {
	ARGS_OK = 0,
	ARGS_HELP = 1,    /* --help or -h: print the usage, exit 0 */
	ARGS_VERSION = 2, /* --version: print it, exit 0 */
	ARGS_ERROR = -1,  /* one line in err; exit 2 */
};

/* Whether argv[1..argc) asks for --help/-h (first) or --version. */
enum args_result args_asks(int argc, char *const *argv);

/*
 * Take the options of spec out of argv[1..*argc) for command cmd (an
 * index into spec->cmd_names) into dst; everything else (argv[0] first)
 * is kept in order for cfg_load, *argc updated and argv[*argc] = NULL.
 * Returns ARGS_HELP/ARGS_VERSION (args_asks) before anything else, then
 * ARGS_OK or ARGS_ERROR with one line in err.
 */
enum args_result args_take(const struct args_spec *spec, size_t cmd, int *argc, char **argv, void *dst, char *err,
                           size_t cap);

/* The index of word in names[0..n), or -1. */
int args_find(const char *const *names, size_t n, const char *word);

/* The options of command cmd as --help lines, "  --name META  help
 * (default)", the help wrapped under itself. */
void args_print_help(FILE *f, const struct args_spec *spec, size_t cmd);

/* The same rows as a pandoc definition list, for a man page. */
void args_print_man(FILE *f, const struct args_spec *spec, size_t cmd);

/* The value of option `name` at argv[*i], advancing *i past a separate
 * value; NULL when argv[*i] is another option (a longer name that starts
 * the same, too).  *missing is set when argv[*i] is this option and its
 * value is absent (the last argument). */
const char *args_value(int argc, char **argv, int *i, const char *name, bool *missing);

#endif
