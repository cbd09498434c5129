/*
 * test_docs.c - the README's settings table says what the settings table
 * (common/cfg.c) says, as --help prints it: one row per setting, in the
 * table's order, with its flag, its default and its help text.
 *
 * The README's table is generated (inbox-worker --help-readme, between two
 * markers); this test is what keeps a hand edit of either side from
 * drifting.  It reads --help's text, not cfg.c's internals, so that it
 * checks what a user sees.  Likewise the README's table of /metrics
 * series against what metrics_render serves.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cfg.h"
#include "config.h"
#include "metrics.h"

#define DOCS_MAX 200000
#define DOCS_ROWS 64

struct row {
	char env[64];
	char flag[64];
	char def[256];
	char help[2048];
};

/* Read a whole file into a NUL-terminated buffer (the caller frees). */
static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *buf;
	size_t n;

	cr_assert_not_null(f, "cannot open %s", path);
	buf = malloc(DOCS_MAX + 1);
	cr_assert_not_null(buf);
	n = fread(buf, 1, DOCS_MAX, f);
	fclose(f);
	buf[n] = '\0';
	return buf;
}

/* cfg_print_help's blocks: "  ENV  --flag META  default: D", then the help
 * line indented by six (a URL setting adds "or ..._FILE" lines, not help). */
static int help_rows(struct row *rows, int cap)
{
	char *buf = NULL, *line, *save = NULL;
	size_t len = 0;
	FILE *mem = open_memstream(&buf, &len);
	int n = 0;
	bool want_help = false;

	cr_assert_not_null(mem);
	cfg_print_help(mem, NULL, NULL);
	cr_assert_eq(fclose(mem), 0);
	for (line = strtok_r(buf, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
		if (strncmp(line, "  INBOX_", 8) == 0) {
			const char *d = strstr(line, "default: ");

			cr_assert_lt(n, cap);
			cr_assert_not_null(d, "no default in %s", line);
			cr_assert_eq(sscanf(line, " %63s %63s", rows[n].env, rows[n].flag), 2);
			snprintf(rows[n].def, sizeof rows[n].def, "%s", d + 9);
			rows[n].help[0] = '\0';
			n++;
			want_help = true;
		} else if (want_help && strncmp(line, "      ", 6) == 0) {
			snprintf(rows[n - 1].help, sizeof rows[n - 1].help, "%s", line + 6);
			want_help = false;
		}
	}
	free(buf);
	return n;
}

/* Markdown cell text as plain text: `code` marks and backslash escapes
 * dropped, white space trimmed. */
static void plain(char *dst, size_t cap, const char *s, size_t len)
{
	size_t j = 0;

	while (len > 0 && (*s == ' ')) {
		s++;
		len--;
	}
	while (len > 0 && s[len - 1] == ' ')
		len--;
	for (size_t i = 0; i < len && j + 1 < cap; i++) {
		if (s[i] == '`')
			continue;
		if (s[i] == '\\' && i + 1 < len)
			i++;
		dst[j++] = s[i];
	}
	dst[j] = '\0';
}

/* The README's rows under the "| variable |" header of *Configuration*:
 * cells split on unescaped '|'. */
static int readme_rows(struct row *rows, int cap, char cells[][4][2048])
{
	char path[4096];
	char *doc, *p, *end;
	int n = 0;

	snprintf(path, sizeof path, "%s/README.md", getenv("INBOX_SOURCE_ROOT"));
	doc = slurp(path);
	p = strstr(doc, "\n| variable |");
	cr_assert_not_null(p, "README has no settings table");
	p = strchr(p + 1, '\n'); /* the header */
	cr_assert_not_null(p);
	p = strchr(p + 1, '\n'); /* the |---| line */
	cr_assert_not_null(p);
	for (p++; *p == '|'; p = end + 1) {
		const char *c = p + 1;
		int k = 0;

		end = strchr(p, '\n');
		cr_assert_not_null(end);
		cr_assert_lt(n, cap);
		for (const char *q = c; q < end && k < 4; q++) {
			if (*q == '\\') {
				q++;
				continue;
			}
			if (*q == '|') {
				plain(cells[n][k++], sizeof cells[n][0], c, (size_t)(q - c));
				c = q + 1;
			}
		}
		while (k < 4)
			cells[n][k++][0] = '\0';
		n++;
	}
	free(doc);
	(void)rows;
	return n;
}

Test(docs, readme_settings_table_says_what_help_says)
{
	static struct row help[DOCS_ROWS];
	static char cells[DOCS_ROWS][4][2048];
	int nh = help_rows(help, DOCS_ROWS);
	int nr = readme_rows(NULL, DOCS_ROWS, cells);
	static char text[2048];
	int bad = 0;

	cr_assert_gt(nh, 20, "only %d settings in --help", nh);
	for (int i = 0; i < nh; i++) {
		int at = -1;

		for (int r = 0; r < nr; r++)
			if (strncmp(cells[r][0], help[i].env, strlen(help[i].env)) == 0 &&
			    (cells[r][0][strlen(help[i].env)] == '\0' || cells[r][0][strlen(help[i].env)] == ' '))
				at = r;
		if (at < 0) {
			cr_log_error("README: no row for %s", help[i].env);
			bad++;
			continue;
		}
		if (at != i) {
			cr_log_error("README: %s is row %d, the table's %d", help[i].env, at + 1, i + 1);
			bad++;
		}
		if (strncmp(cells[at][1], help[i].flag, strlen(help[i].flag)) != 0) {
			cr_log_error("README: %s: flag '%s', --help '%s'", help[i].env, cells[at][1], help[i].flag);
			bad++;
		}
		/* The computed default (the migrations folder) is a path of
		 * this machine in --help; the README describes it. */
		if (strcmp(help[i].env, "INBOX_MIGRATIONS_DIR") != 0 && strcmp(cells[at][2], help[i].def) != 0) {
			cr_log_error("README: %s: default '%s', --help '%s'", help[i].env, cells[at][2], help[i].def);
			bad++;
		}
		/* --help shows `code` marks as typed; the README renders them. */
		plain(text, sizeof text, help[i].help, strlen(help[i].help));
		if (strncmp(cells[at][3], text, strlen(text)) != 0) {
			cr_log_error("README: %s: meaning\n  '%s'\ndoes not start with --help's\n  '%s'", help[i].env,
			             cells[at][3], text);
			bad++;
		}
	}
	if (nr != nh) {
		cr_log_error("README: %d rows, the settings table %d", nr, nh);
		bad++;
	}
	cr_assert_eq(bad, 0, "%d differences between README.md's settings table and --help (regenerate it: "
	             "build/worker/inbox-worker --help-readme)", bad);
}

/* Byte for byte what inbox-worker --help-readme prints, between the
 * markers: the test above reads the rows as a user would, this one catches
 * what it cannot (a note of the table's left out, an escaped '|'). */
Test(docs, readme_settings_table_is_generated_from_the_table)
{
	static const char begin[] = "<!-- settings: generated from common/cfg.c by `inbox-worker --help-readme`; "
	                            "tests/test_docs.c fails when they differ -->\n";
	static const char end[] = "<!-- end of settings -->\n";
	char path[4096];
	char *doc, *want = NULL, *a, *b;
	size_t len = 0;
	FILE *mem = open_memstream(&want, &len);

	cr_assert_not_null(mem);
	cfg_print_doc(mem, CFG_DOC_README, NULL);
	cr_assert_eq(fclose(mem), 0);
	snprintf(path, sizeof path, "%s/README.md", getenv("INBOX_SOURCE_ROOT"));
	doc = slurp(path);
	a = strstr(doc, begin);
	cr_assert_not_null(a, "README.md lacks the line %s", begin);
	a += strlen(begin);
	b = strstr(a, end);
	cr_assert_not_null(b, "README.md lacks the line %s", end);
	*b = '\0';
	for (size_t i = 0; a[i] != '\0' || want[i] != '\0'; i++) {
		if (a[i] == want[i])
			continue;
		/* Name the line that differs, whole, from each side. */
		size_t s0 = i;
		while (s0 > 0 && want[s0 - 1] != '\n')
			s0--;
		cr_assert_fail("README.md's settings table differs from `inbox-worker --help-readme` at byte %zu:\n"
		               "README: %.*s\ntable:  %.*s\n(replace the lines between the markers with its output)",
		               i, (int)strcspn(a + s0, "\n"), a + s0, (int)strcspn(want + s0, "\n"), want + s0);
	}
	free(want);
	free(doc);
}

/* The heap series are left out where glibc's mallinfo2 cannot say (the
 * README's row says so): under AddressSanitizer, or without it. */
static bool heap_absent(const char *name)
{
#if INBOX_HAVE_MALLINFO2 && !defined(__SANITIZE_ADDRESS__)
	(void)name;
	return false;
#else
	return strncmp(name, "inbox_heap_", 11) == 0;
#endif
}

/* The README's table of series (*Observability*) and what /metrics
 * renders: every family the worker serves has a row, and every series a
 * row names is served.  (The DLQ gauge is rendered once the janitor read
 * the queue's depth; set here, as the janitor would.) */
Test(docs, readme_series_table_is_what_metrics_serves)
{
	static char page[65536];
	char path[4096], name[128];
	char *doc, *p, *end;
	int bad = 0, rows = 0;

	metrics_set_threads(1);
	metrics_dlq_depth(0);
	cr_assert_gt(metrics_render(page, sizeof page), 0);
	snprintf(path, sizeof path, "%s/README.md", getenv("INBOX_SOURCE_ROOT"));
	doc = slurp(path);
	p = strstr(doc, "\n| series | type | what |");
	cr_assert_not_null(p, "README has no table of series");
	p = strchr(p + 1, '\n');
	cr_assert_not_null(p);
	p = strchr(p + 1, '\n'); /* |---| */
	cr_assert_not_null(p);
	/* Each family of the page ("# TYPE name kind") in some row's first cell. */
	for (const char *t = strstr(page, "# TYPE "); t != NULL; t = strstr(t + 1, "# TYPE ")) {
		char want[140];

		cr_assert_eq(sscanf(t, "# TYPE %127s", name), 1);
		snprintf(want, sizeof want, "`%s", name);
		end = strstr(p, "\n\n");
		cr_assert_not_null(end);
		bool found = false;
		for (const char *q = p; q != NULL && q < end && !found; q = strchr(q + 1, '\n')) {
			const char *cell_end = strchr(q + 2, '|');
			const char *hit = strstr(q, want);

			found = hit != NULL && cell_end != NULL && hit < cell_end &&
			        (hit[strlen(want)] == '`' || hit[strlen(want)] == '{');
		}
		if (!found) {
			cr_log_error("README: no row for %s, which /metrics serves", name);
			bad++;
		}
	}
	/* Each name in a row's first cell is served. */
	end = strstr(p, "\n\n");
	for (const char *q = p + 1; q < end; q = strchr(q, '\n') + 1) {
		const char *cell_end = strchr(q + 1, '|');

		rows++;
		for (const char *n = strchr(q, '`'); n != NULL && n < cell_end; n = strchr(n + 1, '`')) {
			size_t len = strcspn(n + 1, "`{");
			char served[140];

			snprintf(name, sizeof name, "%.*s", (int)len, n + 1);
			snprintf(served, sizeof served, "# TYPE %s ", name);
			if (strstr(page, served) == NULL && !heap_absent(name)) {
				cr_log_error("README names %s, which /metrics does not serve", name);
				bad++;
			}
			n = strchr(n + 1, '`'); /* the closing mark */
			if (n == NULL)
				break;
		}
	}
	cr_assert_gt(rows, 10);
	cr_assert_eq(bad, 0, "%d differences between README.md's table of series and /metrics", bad);
	free(doc);
}
