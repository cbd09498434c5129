/*
 * test_man.c - the man pages and --help name the same things.
 *
 * The SETTINGS (and inbox-loadgen's OPTIONS) sections are printed by the
 * programs from the tables --help reads (man/mkman.py), so they agree by
 * construction; the commands and their own options are prose in
 * man/inbox-*.1.md.  This suite reads the built pages and each program's
 * --help, and fails on every --flag or INBOX_* variable that one of them
 * names and the other does not.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAN_MAX 200000
#define MAN_WORDS 256

struct words {
	char w[MAN_WORDS][64];
	int n;
};

static void add(struct words *ws, const char *s, size_t len)
{
	if (len >= sizeof ws->w[0])
		len = sizeof ws->w[0] - 1;
	for (int i = 0; i < ws->n; i++)
		if (strlen(ws->w[i]) == len && strncmp(ws->w[i], s, len) == 0)
			return;
	cr_assert_lt(ws->n, MAN_WORDS);
	memcpy(ws->w[ws->n], s, len);
	ws->w[ws->n++][len] = '\0';
}

static bool is_word(char c, bool upper)
{
	return (c >= '0' && c <= '9') || c == '-' || c == '_' ||
	       (upper ? (c >= 'A' && c <= 'Z') : (c >= 'a' && c <= 'z'));
}

/* Every "--name" and "INBOX_NAME" of text (roff's "\-" read as "-"). */
static void words_of(const char *text, struct words *flags, struct words *vars)
{
	char *t = malloc(strlen(text) + 1);
	size_t j = 0;

	cr_assert_not_null(t);
	for (size_t i = 0; text[i] != '\0'; i++) {
		if (text[i] == '\\' && text[i + 1] == '-')
			i++;
		t[j++] = text[i];
	}
	t[j] = '\0';
	for (const char *p = t; *p != '\0'; p++) {
		size_t n = 0;

		if (p[0] == '-' && p[1] == '-' && p[2] >= 'a' && p[2] <= 'z' && (p == t || !is_word(p[-1], false))) {
			n = 2;
			while (is_word(p[n], false))
				n++;
			while (n > 2 && p[n - 1] == '-') /* "--flag-" of a line break */
				n--;
			add(flags, p, n);
		} else if (strncmp(p, "INBOX_", 6) == 0 && (p == t || !is_word(p[-1], true))) {
			n = 6;
			while (is_word(p[n], true) && p[n] != '-')
				n++;
			while (n > 6 && p[n - 1] == '_')
				n--;
			add(vars, p, n);
		}
		if (n > 0)
			p += n - 1;
	}
	free(t);
}

static char *slurp_cmd(const char *cmd)
{
	FILE *f = popen(cmd, "r");
	char *buf = malloc(MAN_MAX + 1);
	size_t n;

	cr_assert_not_null(f, "cannot run %s", cmd);
	cr_assert_not_null(buf);
	n = fread(buf, 1, MAN_MAX, f);
	buf[n] = '\0';
	cr_assert_eq(pclose(f), 0, "%s failed", cmd);
	return buf;
}

/* Each word of a missing from b, logged; returns how many. */
static int missing(const struct words *a, const char *a_name, const struct words *b, const char *b_name)
{
	int bad = 0;

	for (int i = 0; i < a->n; i++) {
		bool found = false;

		for (int k = 0; k < b->n && !found; k++)
			found = strcmp(a->w[i], b->w[k]) == 0;
		if (!found) {
			cr_log_error("%s names %s, %s does not", a_name, a->w[i], b_name);
			bad++;
		}
	}
	return bad;
}

static void check(const char *bin_env, const char *page)
{
	static struct words hf, hv, mf, mv;
	const char *bin = getenv(bin_env), *dir = getenv("INBOX_MAN_DIR");
	char cmd[4096], path[4096];
	char *help, *man;
	int bad;

	cr_assert_not_null(bin, "%s is not set (meson test sets it)", bin_env);
	cr_assert_not_null(dir, "INBOX_MAN_DIR is not set (meson test sets it)");
	memset(&hf, 0, sizeof hf);
	memset(&hv, 0, sizeof hv);
	memset(&mf, 0, sizeof mf);
	memset(&mv, 0, sizeof mv);
	snprintf(cmd, sizeof cmd, "env -u INBOX_MIGRATIONS_DIR '%s' --help", bin);
	help = slurp_cmd(cmd);
	snprintf(path, sizeof path, "cat '%s/%s'", dir, page);
	man = slurp_cmd(path);
	words_of(help, &hf, &hv);
	words_of(man, &mf, &mv);
	cr_assert_gt(hf.n, 10, "only %d flags in --help", hf.n);
	bad = missing(&hf, "--help", &mf, page) + missing(&mf, page, &hf, "--help") +
	      missing(&hv, "--help", &mv, page) + missing(&mv, page, &hv, "--help");
	cr_assert_eq(bad, 0, "%d differences between %s --help and %s (see the lines above)", bad, bin, page);
	free(help);
	free(man);
}

Test(man, worker_page_names_what_help_names)
{
	check("INBOX_WORKER_BIN", "inbox-worker.1");
}

Test(man, loadgen_page_names_what_help_names)
{
	check("INBOX_LOADGEN_BIN", "inbox-loadgen.1");
}
