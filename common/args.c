/*
 * args.c - see args.h.
 *
 * The error texts are the ones the commands printed before they shared
 * this parser (tests/unit/test_cli.c holds them): a number's come from
 * cfg_parse_long, a duration's from cfg_parse_duration, so that a value
 * the worker rejects in a setting is rejected in the same words here.
 */
#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "addr.h"
#include "cfg.h"

#define ARGS_WHY_MAX 160
#define ARGS_WRAP 100 /* --help lines are wrapped before this column */

enum args_result args_asks(int argc, char *const *argv)
{
	bool version = false;

	for (int i = 1; i < argc && argv[i] != NULL; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
			return ARGS_HELP;
		if (strcmp(argv[i], "--version") == 0)
			version = true;
	}
	return version ? ARGS_VERSION : ARGS_OK;
}

const char *args_value(int argc, char **argv, int *i, const char *name, bool *missing)
{
	size_t n = strlen(name);
	const char *a = argv[*i];

	if (strncmp(a, name, n) != 0)
		return NULL;
	if (a[n] == '=')
		return a + n + 1;
	if (a[n] != '\0')
		return NULL;
	if (*i + 1 >= argc) {
		*missing = true;
		return NULL;
	}
	return argv[++*i];
}

int args_find(const char *const *names, size_t n, const char *word)
{
	for (size_t i = 0; i < n; i++)
		if (names[i] != NULL && strcmp(names[i], word) == 0)
			return (int)i;
	return -1;
}

/* The row whose name argv word a is ("--name" or "--name=..."). */
static const struct args_opt *args_lookup(const struct args_spec *spec, const char *a)
{
	for (size_t k = 0; k < spec->nopts; k++) {
		size_t n = strlen(spec->opts[k].name);

		if (strncmp(a, spec->opts[k].name, n) == 0 && (a[n] == '\0' || a[n] == '='))
			return &spec->opts[k];
	}
	return NULL;
}

static bool args_positive(const struct args_opt *o)
{
	return o->min == 1 && o->max == ARGS_NO_MAX;
}

/* "--limit: only for dlq replay": the commands that take o. */
static void args_only_for(const struct args_spec *spec, const struct args_opt *o, char *err, size_t cap)
{
	size_t used = (size_t)snprintf(err, cap, "%s: only for %s", o->name, spec->prefix);
	bool first = true;

	for (size_t c = 0; c < spec->ncmds && used < cap; c++) {
		if (!(o->cmds & ARGS_BIT(c)))
			continue;
		used += (size_t)snprintf(err + used, cap - used, "%s%s", first ? "" : ", ", spec->cmd_names[c]);
		first = false;
	}
}

static int args_number(const struct args_opt *o, const char *v, void *dst, char *err, size_t cap)
{
	char why[ARGS_WHY_MAX], shown[ADDR_ECHO_MAX + 4];
	long n;

	if (cfg_parse_long(v, o->min, o->max, &n, why, sizeof why) != 0) {
		addr_echo(shown, sizeof shown, v);
		if (args_positive(o))
			addr_errf(err, cap, "%s: not a positive number: '%s'", o->name, shown);
		else
			addr_errf(err, cap, "%s: %s", o->name, why);
		return -1;
	}
	switch (o->kind) {
	case ARGS_LONG: *(long *)dst = n; break;
	case ARGS_INT: *(int *)dst = (int)n; break;
	case ARGS_U64: *(uint64_t *)dst = (uint64_t)n; break;
	default: *(double *)dst = (double)n; break; /* ARGS_RATE */
	}
	return 0;
}

static int args_duration(const struct args_opt *o, const char *v, void *dst, char *err, size_t cap)
{
	char why[ARGS_WHY_MAX], shown[ADDR_ECHO_MAX + 4];
	long s;

	if (cfg_parse_duration(v, &s, why, sizeof why) != 0) {
		addr_errf(err, cap, "%s: %s", o->name, why);
		return -1;
	}
	if (s < o->min || s > o->max) {
		addr_echo(shown, sizeof shown, v);
		if (args_positive(o))
			addr_errf(err, cap, "%s: must be positive: '%s'", o->name, shown);
		else
			addr_errf(err, cap, "%s: out of range [%lds, %lds]: '%s'", o->name, o->min, o->max, shown);
		return -1;
	}
	if (o->kind == ARGS_DUR)
		*(long *)dst = s;
	else
		*(int *)dst = (int)s;
	return 0;
}

/* Value v of option o into its place in dst.  0, or -1 with err. */
static int args_store(const struct args_opt *o, const char *v, void *base, char *err, size_t cap)
{
	char shown[ADDR_ECHO_MAX + 4];
	void *dst = (char *)base + o->off;

	switch (o->kind) {
	case ARGS_FLAG:
		*(bool *)dst = true;
		return 0;
	case ARGS_STR:
		*(const char **)dst = v;
		return 0;
	case ARGS_STRS: {
		int *count = (int *)((char *)base + o->count_off);

		if (*count >= o->max) {
			addr_errf(err, cap, "%s: at most %ld", o->name, o->max);
			return -1;
		}
		((const char **)dst)[(*count)++] = v;
		return 0;
	}
	case ARGS_SHARE: {
		char *end;
		double d;

		errno = 0;
		d = strtod(v, &end);
		if (errno != 0 || end == v || *end != '\0' || !isfinite(d) || d < 0.0 || d > 1.0) {
			addr_echo(shown, sizeof shown, v);
			addr_errf(err, cap, "%s: not a share between 0 and 1: '%s'", o->name, shown);
			return -1;
		}
		*(double *)dst = d;
		return 0;
	}
	case ARGS_DUR:
	case ARGS_DUR_INT:
		return args_duration(o, v, dst, err, cap);
	case ARGS_TAG: {
		size_t n = strlen(v);

		if (n == 0 || n > (size_t)o->max ||
		    strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") != n) {
			addr_echo(shown, sizeof shown, v);
			addr_errf(err, cap, "%s: 1..%ld characters of [A-Za-z0-9]: '%s'", o->name, o->max, shown);
			return -1;
		}
		memcpy(dst, v, n + 1);
		return 0;
	}
	case ARGS_LONG:
	case ARGS_INT:
	case ARGS_U64:
	case ARGS_RATE:
		return args_number(o, v, dst, err, cap);
	}
	addr_errf(err, cap, "%s: internal error: unknown kind", o->name);
	return -1;
}

enum args_result args_take(const struct args_spec *spec, size_t cmd, int *argc, char **argv, void *dst, char *err,
                           size_t cap)
{
	enum args_result asked = args_asks(*argc, argv);
	int n = *argc, j = 1;

	if (asked != ARGS_OK)
		return asked;
	for (int i = 1; i < n; i++) {
		const struct args_opt *o = args_lookup(spec, argv[i]);
		const char *v = NULL;
		bool missing = false;

		if (o == NULL) {
			argv[j++] = argv[i]; /* a setting's flag, for cfg_load */
			continue;
		}
		if (!(o->cmds & ARGS_BIT(cmd))) {
			args_only_for(spec, o, err, cap);
			return ARGS_ERROR;
		}
		if (o->kind == ARGS_FLAG) {
			if (argv[i][strlen(o->name)] == '=') {
				addr_errf(err, cap, "%s: takes no value", o->name);
				return ARGS_ERROR;
			}
		} else {
			v = args_value(n, argv, &i, o->name, &missing);
			if (missing) {
				addr_errf(err, cap, "%s: missing value", o->name);
				return ARGS_ERROR;
			}
		}
		if (args_store(o, v, dst, err, cap) != 0)
			return ARGS_ERROR;
	}
	argv[j] = NULL;
	*argc = j;
	return ARGS_OK;
}

/* The default of option o as text ("" when it has none to show: a
 * string, a flag, or a number below the option's minimum, which means
 * unset). */
static void args_default(const struct args_spec *spec, const struct args_opt *o, char *dst, size_t n)
{
	const void *v = (const char *)spec->defaults + o->off;

	dst[0] = '\0';
	if (spec->defaults == NULL)
		return;
	switch (o->kind) {
	case ARGS_LONG:
		if (*(const long *)v >= o->min)
			snprintf(dst, n, "%ld", *(const long *)v);
		break;
	case ARGS_INT:
		if (*(const int *)v >= o->min)
			snprintf(dst, n, "%d", *(const int *)v);
		break;
	case ARGS_U64: snprintf(dst, n, "%llu", (unsigned long long)*(const uint64_t *)v); break;
	case ARGS_RATE:
	case ARGS_SHARE: snprintf(dst, n, "%g", *(const double *)v); break;
	case ARGS_DUR: cfg_format_duration(dst, n, *(const long *)v); break;
	case ARGS_DUR_INT: cfg_format_duration(dst, n, *(const int *)v); break;
	case ARGS_FLAG:
	case ARGS_STR:
	case ARGS_STRS:
	case ARGS_TAG: break;
	}
}

void args_print_help(FILE *f, const struct args_spec *spec, size_t cmd)
{
	for (size_t i = 0; i < spec->nopts; i++) {
		const struct args_opt *o = &spec->opts[i];
		char left[64], def[32], text[512];
		const char *p;
		int col;

		if (!(o->cmds & ARGS_BIT(cmd)))
			continue;
		args_default(spec, o, def, sizeof def);
		snprintf(left, sizeof left, "%s%s%s", o->name, o->metavar ? " " : "", o->metavar ? o->metavar : "");
		snprintf(text, sizeof text, "%s%s%s%s", o->help, def[0] ? " (" : "", def, def[0] ? ")" : "");
		fprintf(f, "  %-22s", left);
		col = 25;
		for (p = text; *p != '\0';) {
			size_t w = strcspn(p, " ");

			if (col > 25 && col + 1 + (int)w > ARGS_WRAP) {
				fprintf(f, "\n%24s", "");
				col = 24;
			}
			fputc(' ', f);
			col++;
			fprintf(f, "%.*s", (int)w, p);
			col += (int)w;
			p += w;
			while (*p == ' ')
				p++;
		}
		fputc('\n', f);
	}
}

/* Text into pandoc markdown (as cfg.c's put_md). */
static void args_put_md(FILE *f, const char *s)
{
	for (; *s != '\0'; s++) {
		if (strchr("\\*_[]<>|#~^$@", *s) != NULL)
			fputc('\\', f);
		fputc(*s, f);
	}
}

void args_print_man(FILE *f, const struct args_spec *spec, size_t cmd)
{
	for (size_t i = 0; i < spec->nopts; i++) {
		const struct args_opt *o = &spec->opts[i];
		char def[32];

		if (!(o->cmds & ARGS_BIT(cmd)))
			continue;
		args_default(spec, o, def, sizeof def);
		fputs("**\\-\\-", f);
		args_put_md(f, o->name + 2);
		fputs("**", f);
		if (o->metavar != NULL)
			fprintf(f, " *%s*", o->metavar);
		fputs("\n:   ", f);
		args_put_md(f, o->help);
		fputs(".", f);
		if (def[0] != '\0')
			fprintf(f, " Default: %s.", def);
		fputs("\n\n", f);
	}
}
