/*
 * test_changelog.c - CHANGELOG.md is one a script can read and an
 * operator can trust.
 *
 * The file's header states the rules; this holds it to them: releases as
 * "## [X.Y.Z] - YYYY-MM-DD", strictly descending, the top one the
 * project's version (config.h) and "Commit: this tree", every other one
 * naming its commit by its full hash; each migration file of migrations/
 * named in the release that added it (and any that changed it), in its
 * Upgrading notes; every
 * setting and every dead-letter reason the worker has named somewhere.
 * The commits are looked up in the repository when the source root is a
 * full git checkout (each exists, each an ancestor of the release above
 * it); a release tarball or a shallow clone has nothing to look them up
 * in, and that test says so and skips.
 */
#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cfg.h"
#include "config.h"
#include "msg.h"

#define CL_MAX 400000
#define CL_RELEASES 64
#define CL_HASH 40

struct release {
	int ver[3];
	char date[11];
	char commit[CL_HASH + 1]; /* "" for "this tree" */
	const char *body;         /* after the heading line, up to end */
	const char *end;          /* the next release's heading, or the file's end */
	int line;
};

/* The whole file, NUL-terminated (the caller frees). */
static char *cl_slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *buf;
	size_t n;

	cr_assert_not_null(f, "cannot open %s", path);
	buf = malloc(CL_MAX + 1);
	cr_assert_not_null(buf);
	n = fread(buf, 1, CL_MAX, f);
	cr_assert_lt(n, (size_t)CL_MAX, "%s is longer than the test reads", path);
	cr_assert_eq(fclose(f), 0);
	buf[n] = '\0';
	return buf;
}

static char *cl_read(void)
{
	char path[4096];
	const char *root = getenv("INBOX_SOURCE_ROOT");

	cr_assert_not_null(root, "INBOX_SOURCE_ROOT is set by meson");
	snprintf(path, sizeof path, "%s/CHANGELOG.md", root);
	return cl_slurp(path);
}

/* "X.Y.Z" at s, each part digits without a leading zero (SemVer 2.0.0,
 * item 2); the length read, or 0. */
static size_t cl_semver(const char *s, int ver[3])
{
	const char *p = s;

	for (int i = 0; i < 3; i++) {
		long v = 0;
		const char *d = p;

		while (isdigit((unsigned char)*p) && p - d < 9)
			v = v * 10 + (*p++ - '0');
		if (p == d || (p - d > 1 && *d == '0'))
			return 0;
		ver[i] = (int)v;
		if (i < 2 && *p++ != '.')
			return 0;
	}
	return (size_t)(p - s);
}

static bool cl_date(const char *s)
{
	for (int i = 0; i < 10; i++)
		if (i == 4 || i == 7 ? s[i] != '-' : !isdigit((unsigned char)s[i]))
			return false;
	return !isdigit((unsigned char)s[10]);
}

/* "Commit: `<40 hex>`" or "Commit: this tree" on the line at s. */
static bool cl_commit_line(const char *s, char *commit)
{
	static const char tree[] = "Commit: this tree\n";
	static const char head[] = "Commit: `";

	commit[0] = '\0';
	if (strncmp(s, tree, strlen(tree)) == 0)
		return true;
	if (strncmp(s, head, strlen(head)) != 0)
		return false;
	s += strlen(head);
	for (int i = 0; i < CL_HASH; i++)
		if (!isxdigit((unsigned char)s[i]) || isupper((unsigned char)s[i]))
			return false;
	if (strncmp(s + CL_HASH, "`\n", 2) != 0)
		return false;
	memcpy(commit, s, CL_HASH);
	commit[CL_HASH] = '\0';
	return true;
}

/* Every "## [" heading as a release; fails on one that is not
 * "## [X.Y.Z] - YYYY-MM-DD" followed by its commit line. */
static int cl_releases(const char *doc, struct release *r, int cap)
{
	int n = 0, line = 1;

	for (const char *l = doc; *l != '\0'; l += strcspn(l, "\n") + (l[strcspn(l, "\n")] != '\0'), line++) {
		if (strncmp(l, "## ", 3) != 0)
			continue;
		if (n > 0)
			r[n - 1].end = l;
		cr_assert_lt(n, cap);
		struct release *x = &r[n++];
		size_t v = strncmp(l, "## [", 4) == 0 ? cl_semver(l + 4, x->ver) : 0;

		x->line = line;
		cr_assert(v > 0 && strncmp(l + 4 + v, "] - ", 4) == 0 && cl_date(l + 8 + v),
		          "CHANGELOG.md:%d: a release heading is '## [X.Y.Z] - YYYY-MM-DD': %.*s", line,
		          (int)strcspn(l, "\n"), l);
		memcpy(x->date, l + 8 + v, 10);
		x->date[10] = '\0';
		x->body = l + strcspn(l, "\n") + 1;
		cr_assert(cl_commit_line(x->body, x->commit),
		          "CHANGELOG.md:%d: the line after a release's heading is \"Commit: `<40 lower-case hex>`\" "
		          "(or \"Commit: this tree\" for the top one): %.*s",
		          line + 1, (int)strcspn(x->body, "\n"), x->body);
		x->end = doc + strlen(doc);
	}
	return n;
}

static int cl_cmp(const int a[3], const int b[3])
{
	for (int i = 0; i < 3; i++)
		if (a[i] != b[i])
			return a[i] < b[i] ? -1 : 1;
	return 0;
}

/* Whether word occurs in [p, end) with no name character either side
 * (letters, digits, '_', '.', '-': a file, a setting or a reason). */
static bool cl_names(const char *p, const char *end, const char *word)
{
	size_t n = strlen(word);

	for (const char *h = p; (h = strstr(h, word)) != NULL && h + n <= end; h++) {
		bool before = h > p && (isalnum((unsigned char)h[-1]) || strchr("_.-", h[-1]) != NULL);
		bool after = h + n < end && (isalnum((unsigned char)h[n]) || h[n] == '_' ||
		                             ((h[n] == '.' || h[n] == '-') && isalnum((unsigned char)h[n + 1])));

		if (!before && !after)
			return true;
	}
	return false;
}

/* The release's "### Upgrading" subsection: [*from, *to), or false. */
static bool cl_upgrading(const struct release *r, const char **from, const char **to)
{
	const char *u = strstr(r->body, "\n### Upgrading\n");

	if (u == NULL || u >= r->end)
		return false;
	*from = u + 1;
	*to = strstr(*from + 1, "\n### ");
	if (*to == NULL || *to > r->end)
		*to = r->end;
	return true;
}

Test(changelog, releases_are_headed_dated_and_descending_to_this_version)
{
	static struct release r[CL_RELEASES];
	char *doc = cl_read();
	int n = cl_releases(doc, r, CL_RELEASES);
	char top[32];

	cr_assert_geq(n, 2, "CHANGELOG.md has %d releases", n);
	snprintf(top, sizeof top, "%d.%d.%d", r[0].ver[0], r[0].ver[1], r[0].ver[2]);
	cr_expect_str_eq(top, INBOX_VERSION, "the top release is %s, meson.build's project version %s", top,
	                 INBOX_VERSION);
	cr_expect_str_eq(r[0].commit, "", "the top release (CHANGELOG.md:%d) is this tree's: 'Commit: this tree'",
	                 r[0].line);
	for (int i = 1; i < n; i++) {
		cr_expect_neq(r[i].commit[0], '\0', "CHANGELOG.md:%d: only the top release is 'this tree'", r[i].line);
		cr_expect_lt(cl_cmp(r[i].ver, r[i - 1].ver), 0, "CHANGELOG.md:%d: %d.%d.%d is not below %d.%d.%d",
		             r[i].line, r[i].ver[0], r[i].ver[1], r[i].ver[2], r[i - 1].ver[0], r[i - 1].ver[1],
		             r[i - 1].ver[2]);
		cr_expect_leq(strcmp(r[i].date, r[i - 1].date), 0, "CHANGELOG.md:%d: %s is after the release above (%s)",
		              r[i].line, r[i].date, r[i - 1].date);
		for (int j = 1; j < i; j++)
			cr_expect_str_neq(r[i].commit, r[j].commit, "CHANGELOG.md:%d: two releases at one commit", r[i].line);
	}
	free(doc);
}

/* Each migration file is named in the release that added it, in its
 * Upgrading notes, and so by any later release that changed it; every
 * migration file the changelog names exists. */
Test(changelog, each_migration_is_named_by_one_release_in_its_upgrading_notes)
{
	static struct release r[CL_RELEASES];
	char *doc = cl_read();
	int n = cl_releases(doc, r, CL_RELEASES), files = 0, bad = 0;
	char path[4096];
	DIR *d;
	struct dirent *e;

	snprintf(path, sizeof path, "%s/migrations", getenv("INBOX_SOURCE_ROOT"));
	d = opendir(path);
	cr_assert_not_null(d, "cannot read %s", path);
	while ((e = readdir(d)) != NULL) {
		size_t len = strlen(e->d_name);
		int count = 0;
		const char *from, *to;

		if (len < 5 || strcmp(e->d_name + len - 4, ".sql") != 0)
			continue;
		files++;
		for (int i = 0; i < n; i++) {
			if (!cl_names(r[i].body, r[i].end, e->d_name))
				continue;
			count++;
			if (!cl_upgrading(&r[i], &from, &to) || !cl_names(from, to, e->d_name)) {
				cr_log_error("CHANGELOG.md:%d: %s is not named under that release's '### Upgrading'", r[i].line,
				             e->d_name);
				bad++;
			}
		}
		if (count == 0) {
			cr_log_error("CHANGELOG.md: no release names %s (the one that added it must)", e->d_name);
			bad++;
		}
	}
	cr_assert_eq(closedir(d), 0);
	cr_assert_gt(files, 10, "only %d migrations in %s", files, path);
	/* The other way: a name like 0001_x.sql with no file is a typo, or a
	 * file the tree (a tarball) lacks. */
	for (const char *p = doc; (p = strstr(p, ".sql")) != NULL; p++) {
		const char *s = p;
		char name[256], file[4400];
		FILE *f;

		while (s > doc && (isalnum((unsigned char)s[-1]) || s[-1] == '_'))
			s--;
		if (p - s < 6 || !isdigit((unsigned char)s[0]) || !isdigit((unsigned char)s[3]) || s[4] != '_' ||
		    (size_t)(p - s) + 5 > sizeof name)
			continue; /* not NNNN_name.sql: invoice.sql, say */
		snprintf(name, sizeof name, "%.*s.sql", (int)(p - s), s);
		snprintf(file, sizeof file, "%s/%s", path, name);
		f = fopen(file, "r");
		if (f == NULL) {
			cr_log_error("CHANGELOG.md names %s, which migrations/ does not hold", name);
			bad++;
		} else {
			cr_assert_eq(fclose(f), 0);
		}
	}
	cr_assert_eq(bad, 0, "%d differences between CHANGELOG.md and migrations/", bad);
	free(doc);
}

/* Every INBOX_* setting --help lists, and every dead-letter reason,
 * is named somewhere (in the release that added it, by the header's
 * rule; the test cannot tell which release that was). */
Test(changelog, every_setting_and_dead_letter_reason_is_named)
{
	char *doc = cl_read(), *help = NULL, *save = NULL;
	const char *end = doc + strlen(doc);
	size_t len = 0;
	FILE *mem = open_memstream(&help, &len);
	int bad = 0, settings = 0;

	cr_assert_not_null(mem);
	cfg_print_help(mem, NULL, NULL);
	cr_assert_eq(fclose(mem), 0);
	for (char *line = strtok_r(help, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
		char env[64];

		if (strncmp(line, "  INBOX_", 8) != 0 || sscanf(line, " %63s", env) != 1)
			continue;
		settings++;
		if (!cl_names(doc, end, env)) {
			cr_log_error("CHANGELOG.md does not name the setting %s", env);
			bad++;
		}
	}
	cr_assert_gt(settings, 20, "only %d settings in --help", settings);
	for (int i = MSG_REASON_NONE + 1; i < MSG_REASON_COUNT; i++) {
		char quoted[64];

		snprintf(quoted, sizeof quoted, "`%s`", msg_reason_name((enum msg_reason)i));
		if (strstr(doc, quoted) == NULL) {
			cr_log_error("CHANGELOG.md does not name the dead-letter reason %s", quoted);
			bad++;
		}
	}
	cr_assert_eq(bad, 0, "%d settings or dead-letter reasons CHANGELOG.md does not name", bad);
	free(help);
	free(doc);
}

/* The output of a shell command, its first line, or "" (exit status in *rc). */
static void cl_sh(const char *cmd, char *out, size_t cap, int *rc)
{
	FILE *p = popen(cmd, "r");
	size_t n;

	cr_assert_not_null(p, "%s", cmd);
	n = fread(out, 1, cap - 1, p);
	out[n] = '\0';
	out[strcspn(out, "\n")] = '\0';
	*rc = pclose(p);
}

/* Whether the source root is the top of a full (not shallow) git
 * checkout: where the release commits can be looked up. */
static bool cl_full_checkout(const char *root, char *why, size_t cap)
{
	char cmd[8192], out[256];
	int rc;

	snprintf(cmd, sizeof cmd,
	         "cd '%s' && top=$(git rev-parse --show-toplevel 2>/dev/null) && "
	         "[ \"$(cd \"$top\" && pwd -P)\" = \"$(pwd -P)\" ] && git rev-parse --is-shallow-repository",
	         root);
	cl_sh(cmd, out, sizeof out, &rc);
	if (rc != 0) {
		snprintf(why, cap, "%s is not a git checkout (a release tarball?): no repository to find the "
		         "releases' commits in", root);
		return false;
	}
	if (strcmp(out, "false") != 0) {
		snprintf(why, cap, "%s is a shallow clone: the releases' commits may not be in it "
		         "(git fetch --unshallow)", root);
		return false;
	}
	return true;
}

Test(changelog, each_release_commit_is_in_the_repository_below_the_one_above)
{
	static struct release r[CL_RELEASES];
	const char *root = getenv("INBOX_SOURCE_ROOT");
	char *doc = cl_read();
	int n = cl_releases(doc, r, CL_RELEASES), rc;
	char why[4400], cmd[8192], out[64];

	cr_assert_null(strchr(root, '\''), "a source root with a quote: %s", root);
	if (!cl_full_checkout(root, why, sizeof why)) {
		free(doc);
		cr_skip_test("%s", why);
	}
	for (int i = 1; i < n; i++) {
		snprintf(cmd, sizeof cmd, "git -C '%s' cat-file -e '%s^{commit}' 2>&1", root, r[i].commit);
		cl_sh(cmd, out, sizeof out, &rc);
		cr_expect_eq(rc, 0, "CHANGELOG.md:%d: %s is no commit of this repository", r[i].line, r[i].commit);
		/* Each release holds the one below it: HEAD holds the newest. */
		snprintf(cmd, sizeof cmd, "git -C '%s' merge-base --is-ancestor '%s' '%s' 2>&1", root, r[i].commit,
		         i == 1 ? "HEAD" : r[i - 1].commit);
		cl_sh(cmd, out, sizeof out, &rc);
		cr_expect_eq(rc, 0, "CHANGELOG.md:%d: %s is not an ancestor of %s", r[i].line, r[i].commit,
		             i == 1 ? "HEAD" : r[i - 1].commit);
	}
	free(doc);
}
