/*
 * test_docs.c - the documents say what the tree and the programs say.
 *
 * The README's settings table says what the settings table (common/cfg.c)
 * says, as --help prints it: one row per setting, in the table's order,
 * with its flag, its default and its help text.  The table is generated
 * (inbox-worker --help-readme, between two markers); this test is what
 * keeps a hand edit of either side from drifting.  It reads --help's text,
 * not cfg.c's internals, so that it checks what a user sees.  Likewise the
 * operator's guide's table of /metrics series (doc/operations.md) against
 * what metrics_render serves; the README's *Layout* against the folders
 * of the tree, and each code folder's own README against the files in it;
 * and every relative link of the README, doc/ and the folders' READMEs
 * against the files and headings it points to.
 */
#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

/* The README's rows under the "| variable |" header of *Settings*:
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
	                            "tests/unit/test_docs.c fails when they differ -->\n";
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
 * guide's row says so): under AddressSanitizer, or without it. */
static bool heap_absent(const char *name)
{
#if INBOX_HAVE_MALLINFO2 && !defined(__SANITIZE_ADDRESS__)
	(void)name;
	return false;
#else
	return strncmp(name, "inbox_heap_", 11) == 0;
#endif
}

/* The operator's guide's table of series (*Monitoring*) and what /metrics
 * renders: every family the worker serves has a row, and every series a
 * row names is served.  (The DLQ gauge is rendered once the janitor read
 * the queue's depth, the lifecycle's series once it is bound: set here, as
 * the janitor and the start-up would.) */
Test(docs, operations_series_table_is_what_metrics_serves)
{
	static char page[65536];
	char path[4096], name[128];
	char *doc, *p, *end;
	int bad = 0, rows = 0;

	metrics_set_threads(1);
	metrics_dlq_depth(0);
	cr_assert_eq(metrics_set_lifecycle("order", "orders", "order_id"), 0); /* served once the worker binds it */
	{
		/* served when the lifecycle has statements of its own */
		const char *const events[] = { "PaymentReceived" };

		cr_assert_eq(metrics_set_statement_events(events, 1), 0);
	}
	{
		/* served when the lifecycle has HTTP destinations */
		const char *const dests[] = { "mail" };

		cr_assert_eq(metrics_set_destinations(dests, 1), 0);
	}
	cr_assert_gt(metrics_render(page, sizeof page), 0);
	snprintf(path, sizeof path, "%s/doc/operations.md", getenv("INBOX_SOURCE_ROOT"));
	doc = slurp(path);
	p = strstr(doc, "\n| series | type | what |");
	cr_assert_not_null(p, "doc/operations.md has no table of series");
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
			cr_log_error("doc/operations.md: no row for %s, which /metrics serves", name);
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
				cr_log_error("doc/operations.md names %s, which /metrics does not serve", name);
				bad++;
			}
			n = strchr(n + 1, '`'); /* the closing mark */
			if (n == NULL)
				break;
		}
	}
	cr_assert_gt(rows, 10);
	cr_assert_eq(bad, 0, "%d differences between doc/operations.md's table of series and /metrics", bad);
	free(doc);
}

/* Whether ROOT/REL exists; as a folder when want_dir. */
static bool path_is(const char *root, const char *rel, bool want_dir)
{
	char path[4096];
	struct stat st;

	snprintf(path, sizeof path, "%s/%s", root, rel);
	if (stat(path, &st) != 0)
		return false;
	return want_dir ? S_ISDIR(st.st_mode) : true;
}

/* The next `code` span of [p, end) into tok; NULL when there is none. */
static const char *next_code(const char *p, const char *end, char *tok, size_t cap)
{
	const char *a = memchr(p, '`', (size_t)(end - p)), *b;

	if (a == NULL)
		return NULL;
	b = memchr(a + 1, '`', (size_t)(end - a - 1));
	if (b == NULL)
		return NULL;
	snprintf(tok, cap, "%.*s", (int)(b - a - 1), a + 1);
	return b + 1;
}

/* A token that names no file: a command line, a setting, a pattern, a
 * constant, an option. */
static bool not_a_name(const char *t)
{
	if (t[0] == '\0' || t[0] == '-')
		return true;
	for (const char *c = t; *c != '\0'; c++)
		if (*c == ' ' || *c == '=' || *c == ':' || *c == '*' || isupper((unsigned char)*c))
			return true;
	return false;
}

static bool has_ext(const char *t)
{
	static const char *const ext[] = {".c", ".h", ".py", ".md", ".sh", ".sql"};
	size_t n = strlen(t);

	for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++)
		if (n > strlen(ext[i]) && strcmp(t + n - strlen(ext[i]), ext[i]) == 0)
			return true;
	return false;
}

/* Whether the row text [p, end) names FILE: as itself, by its stem (x for
 * x.c and x.h), or by its sibling (x.c for x.h). */
static bool row_names(const char *p, const char *end, const char *file)
{
	char tok[256], stem[256];
	size_t n = strlen(file);

	snprintf(stem, sizeof stem, "%s", file);
	if (n > 2 && (strcmp(file + n - 2, ".c") == 0 || strcmp(file + n - 2, ".h") == 0))
		stem[n - 2] = '\0';
	for (const char *q = p; (q = next_code(q, end, tok, sizeof tok)) != NULL;) {
		size_t m = strlen(tok);

		if (strcmp(tok, file) == 0 || strcmp(tok, stem) == 0)
			return true;
		if (m > 2 && (strcmp(tok + m - 2, ".c") == 0 || strcmp(tok + m - 2, ".h") == 0) &&
		    strlen(stem) == m - 2 && strncmp(tok, stem, m - 2) == 0)
			return true;
	}
	return false;
}

/* A build folder meson made inside the tree (build/, build-asan/, ...). */
static bool is_build_dir(const char *root, const char *name)
{
	char rel[512];

	snprintf(rel, sizeof rel, "%s/meson-private", name);
	return path_is(root, rel, true);
}

/* The README's *Layout*: every folder of the tree has a row, every row's
 * folder exists, and every file or folder a row names is there.  The rows
 * say what a folder is for; the files are named in the folder's own
 * README (docs/folder_readmes_name_their_files). */
Test(docs, readme_layout_is_the_tree)
{
	const char *root = getenv("INBOX_SOURCE_ROOT");
	char path[4096], folders[32][64], tok[256];
	int nf = 0, bad = 0;
	char *doc, *p;
	DIR *d;
	struct dirent *e;

	snprintf(path, sizeof path, "%s/README.md", root);
	doc = slurp(path);
	p = strstr(doc, "\n| folder | what it holds |\n|---|---|\n");
	cr_assert_not_null(p, "README has no layout table");
	p = strchr(p + 1, '\n');
	p = strchr(p + 1, '\n') + 1;
	for (char *end; *p == '|'; p = end + 1) {
		const char *text;
		char folder[64];

		end = strchr(p, '\n');
		cr_assert_not_null(end);
		text = next_code(p, end, tok, sizeof tok);
		cr_assert_not_null(text, "a layout row without a `folder/`: %.*s", (int)(end - p), p);
		snprintf(folder, sizeof folder, "%.*s", (int)strcspn(tok, "/"), tok);
		cr_assert_lt(nf, 32);
		snprintf(folders[nf++], sizeof folders[0], "%s", folder);
		if (!path_is(root, tok, false)) {
			cr_log_error("README layout: %s is not in the tree", tok);
			bad++;
			continue;
		}
		if (!path_is(root, folder, true) || tok[strlen(tok) - 1] != '/')
			continue; /* a file of its own: .ci/run */
		for (const char *q = text; (q = next_code(q, end, tok, sizeof tok)) != NULL;) {
			char rel[512];
			bool ok;

			if (not_a_name(tok))
				continue;
			if (strchr(tok, '/') != NULL && tok[strlen(tok) - 1] != '/') {
				ok = path_is(root, tok, false); /* a path from the root */
			} else if (tok[strlen(tok) - 1] == '/') {
				snprintf(rel, sizeof rel, "%s/%s", folder, tok);
				ok = path_is(root, rel, true) || path_is(root, tok, true);
			} else if (has_ext(tok)) {
				snprintf(rel, sizeof rel, "%s/%s", folder, tok);
				ok = path_is(root, rel, false);
			} else {
				continue; /* a program's or command's name */
			}
			if (!ok) {
				cr_log_error("README layout: %s/ names %s, which is not there", folder, tok);
				bad++;
			}
		}
	}
	d = opendir(root);
	cr_assert_not_null(d);
	while ((e = readdir(d)) != NULL) {
		bool listed = false;

		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 || !path_is(root, e->d_name, true))
			continue;
		/* Hidden folders are the stacks' state and git's, but .ci. */
		if ((e->d_name[0] == '.' && strcmp(e->d_name, ".ci") != 0) || is_build_dir(root, e->d_name))
			continue;
		for (int i = 0; i < nf; i++)
			listed = listed || strcmp(folders[i], e->d_name) == 0;
		if (!listed) {
			cr_log_error("README layout: no row for the folder %s/", e->d_name);
			bad++;
		}
	}
	closedir(d);
	/* And the build: every folder meson.build descends into or installs. */
	free(doc);
	snprintf(path, sizeof path, "%s/meson.build", root);
	doc = slurp(path);
	for (const char *q = doc; (q = strstr(q, "subdir('")) != NULL; q++) {
		char name[64];
		bool listed = false;

		q += strlen("subdir('");
		snprintf(name, sizeof name, "%.*s", (int)strcspn(q, "'"), q);
		for (int i = 0; i < nf; i++)
			listed = listed || strcmp(folders[i], name) == 0;
		if (!listed) {
			cr_log_error("README layout: no row for %s/, which meson.build builds", name);
			bad++;
		}
	}
	cr_assert_gt(nf, 10);
	cr_assert_eq(bad, 0, "%d differences between README.md's layout and the tree", bad);
	free(doc);
}

/* The folders whose own README.md names every file and folder in them
 * (the tests' rooms too: their READMEs' links are checked as well). */
static const char *const docs_readme_folders[] = { "common", "worker", "loadgen", "scripts", "bench", "tests",
	                                           "tests/unit", "tests/integration", "tests/support" };

/* Whether REL is one of docs_readme_folders (checked on its own). */
static bool docs_listed_folder(const char *rel)
{
	for (size_t i = 0; i < sizeof docs_readme_folders / sizeof docs_readme_folders[0]; i++)
		if (strcmp(docs_readme_folders[i], rel) == 0)
			return true;
	return false;
}

#define DOCS_ENTRIES 256

struct docs_entry {
	char name[256];
	bool dir;
};

/* Add NAME to the folder's entries once (a folder's files all name it). */
static void entry_add(struct docs_entry *v, int *n, const char *name, size_t len, bool dir)
{
	for (int i = 0; i < *n; i++)
		if (strlen(v[i].name) == len && strncmp(v[i].name, name, len) == 0)
			return;
	cr_assert_lt(*n, DOCS_ENTRIES, "more entries than the test holds");
	snprintf(v[*n].name, sizeof v[0].name, "%.*s", (int)len, name);
	v[(*n)++].dir = dir;
}

/* What is directly in ROOT/FOLDER: its tracked files and the folders that
 * hold tracked files, as git lists them (a build's or a stack's output is
 * not the tree's); the folder as it is on disk where git cannot say (a
 * tree unpacked without .git). */
static int folder_entries(const char *root, const char *folder, struct docs_entry *v)
{
	char cmd[8192], path[4096], *buf = NULL;
	size_t cap = 0, prefix = strlen(folder) + 1;
	ssize_t len;
	int n = 0, st;
	FILE *git;
	DIR *d;
	struct dirent *e;

	cr_assert_null(strchr(root, '\''), "a source root with a quote: %s", root);
	snprintf(cmd, sizeof cmd, "git -C '%s' ls-files -z -- '%s/' 2>/dev/null", root, folder);
	git = popen(cmd, "r");
	if (git != NULL) {
		while ((len = getdelim(&buf, &cap, '\0', git)) > 0) {
			const char *rel = buf + prefix, *slash;

			if ((size_t)len <= prefix || strncmp(buf, folder, prefix - 1) != 0)
				continue;
			slash = strchr(rel, '/');
			entry_add(v, &n, rel, slash != NULL ? (size_t)(slash - rel) : strlen(rel), slash != NULL);
		}
		free(buf);
		st = pclose(git);
		if (st == 0 && n > 0)
			return n;
		n = 0;
	}
	snprintf(path, sizeof path, "%s/%s", root, folder);
	d = opendir(path);
	cr_assert_not_null(d, "cannot read %s", path);
	while ((e = readdir(d)) != NULL) {
		char rel[512];

		if (e->d_name[0] == '.')
			continue;
		snprintf(rel, sizeof rel, "%s/%s", folder, e->d_name);
		entry_add(v, &n, e->d_name, strlen(e->d_name), path_is(root, rel, true));
	}
	closedir(d);
	return n;
}

/* Whether the text names the folder NAME/ (or FOLDER/NAME/). */
static bool text_names_dir(const char *p, const char *end, const char *folder, const char *name)
{
	char tok[256], a[256], b[512];

	snprintf(a, sizeof a, "%s/", name);
	snprintf(b, sizeof b, "%s/%s/", folder, name);
	for (const char *q = p; (q = next_code(q, end, tok, sizeof tok)) != NULL;)
		if (strcmp(tok, a) == 0 || strcmp(tok, b) == 0)
			return true;
	return false;
}

/* FOLDER/README.md names every tracked file directly in FOLDER (as itself,
 * by its stem, by its sibling, or as FOLDER/file) and every folder in it
 * (as `name/`), and every file name it gives without a path is there; a
 * folder in it with a README.md of its own is held to the same, and one
 * with a meson.build must have one.  Returns the differences. */
static int check_folder_readme(const char *root, const char *folder, int depth)
{
	struct docs_entry *v = calloc(DOCS_ENTRIES, sizeof *v);
	char path[4096], own[300], tok[256];
	const char *end;
	char *doc;
	int n, bad = 0;

	cr_assert_not_null(v);
	snprintf(own, sizeof own, "%s/README.md", folder);
	if (!path_is(root, own, false)) {
		cr_log_error("%s/ has no README.md naming its files", folder);
		free(v);
		return 1;
	}
	snprintf(path, sizeof path, "%s/%s/README.md", root, folder);
	doc = slurp(path);
	end = doc + strlen(doc);
	n = folder_entries(root, folder, v);
	for (int i = 0; i < n; i++) {
		char rel[512], full[600];

		snprintf(rel, sizeof rel, "%s/%s", folder, v[i].name);
		if (v[i].dir) {
			if (!text_names_dir(doc, end, folder, v[i].name)) {
				cr_log_error("%s/README.md does not name the folder %s/", folder, v[i].name);
				bad++;
			}
			snprintf(full, sizeof full, "%s/README.md", rel);
			if (path_is(root, full, false)) {
				if (depth < 4 && !docs_listed_folder(rel))
					bad += check_folder_readme(root, rel, depth + 1);
				continue;
			}
			/* A room that builds (tests/unit, tests/integration, ...)
			 * names its own files: the parent names only the room. */
			snprintf(full, sizeof full, "%s/meson.build", rel);
			if (path_is(root, full, false)) {
				cr_log_error("%s/ has a meson.build but no README.md naming its files", rel);
				bad++;
			}
			continue;
		}
		if (strcmp(v[i].name, "README.md") == 0)
			continue;
		if (!row_names(doc, end, v[i].name) && !row_names(doc, end, rel)) {
			cr_log_error("%s/README.md does not name %s", folder, v[i].name);
			bad++;
		}
	}
	for (const char *q = doc; (q = next_code(q, end, tok, sizeof tok)) != NULL;) {
		char rel[512];

		if (not_a_name(tok) || strchr(tok, '/') != NULL || !has_ext(tok))
			continue;
		snprintf(rel, sizeof rel, "%s/%s", folder, tok);
		if (!path_is(root, rel, false)) {
			cr_log_error("%s/README.md names %s, which is not there", folder, tok);
			bad++;
		}
	}
	free(doc);
	free(v);
	return bad;
}

/* Each code and script folder's README names its files: the README's
 * *Layout* says what a folder is for, the folder says what is in it. */
Test(docs, folder_readmes_name_their_files)
{
	const char *root = getenv("INBOX_SOURCE_ROOT");
	int bad = 0;

	for (size_t i = 0; i < sizeof docs_readme_folders / sizeof docs_readme_folders[0]; i++)
		bad += check_folder_readme(root, docs_readme_folders[i], 0);
	cr_assert_eq(bad, 0, "%d differences between the folders and their READMEs", bad);
}

/* GitHub's anchor of a heading: lower case, spaces to '-', everything but
 * letters, digits, '-' and '_' dropped (bytes past ASCII too: no heading
 * linked to has a letter there). */
static void slug(char *dst, size_t cap, const char *h, size_t len)
{
	size_t j = 0;

	for (size_t i = 0; i < len && j + 1 < cap; i++) {
		unsigned char c = (unsigned char)h[i];

		if (c == ' ')
			dst[j++] = '-';
		else if (c < 0x80 && (isalnum(c) || c == '-' || c == '_'))
			dst[j++] = (char)tolower(c);
	}
	dst[j] = '\0';
}

/* Whether the markdown text has a heading whose anchor is frag (headings
 * inside ``` blocks are not headings). */
static bool has_anchor(const char *text, const char *frag)
{
	bool fence = false;
	char s[512];

	for (const char *l = text; *l != '\0'; l += strcspn(l, "\n") + (l[strcspn(l, "\n")] != '\0')) {
		size_t len = strcspn(l, "\n");

		if (strncmp(l, "```", 3) == 0)
			fence = !fence;
		if (fence || l[0] != '#')
			continue;
		size_t h = strspn(l, "#");
		if (l[h] != ' ')
			continue;
		slug(s, sizeof s, l + h + 1, len - h - 1);
		if (strcmp(s, frag) == 0)
			return true;
	}
	return false;
}

/* Whether the relative link file, in the document rel (a path inside the
 * tree), climbs above the tree's root, judged on the text alone. */
static bool docs_link_leaves(const char *rel, const char *file)
{
	int depth = 0;

	if (file[0] == '/')
		return true;
	for (const char *p = rel; *p != '\0'; p++)
		depth += *p == '/';
	for (const char *f = file; *f != '\0';) {
		size_t n = strcspn(f, "/");

		if (n == 2 && strncmp(f, "..", 2) == 0) {
			if (--depth < 0)
				return true;
		} else if (!(n == 1 && f[0] == '.') && n > 0) {
			depth++;
		}
		f += n + (f[n] == '/');
	}
	return false;
}

/* Every relative link in one document (ROOT/rel) reaches a file of the
 * tree and, with a #fragment, a heading of it.  A link that leaves the tree
 * is broken even when it resolves here: a clone anywhere else (a private
 * home folder, CI) cannot follow it (the project's SPEC.md beside this
 * checkout was one).  Web addresses are not ours to check.  Returns the
 * number of broken links; *nlinks, how many it checked. */
static int check_links(const char *root, const char *rootreal, const char *rel, int *nlinks)
{
	char path[4096], dir[4096], target[4096 + 1024 + 2], real[PATH_MAX];
	char *doc = NULL;
	const char *slash = strrchr(rel, '/');
	bool fence = false;
	int bad = 0, links = 0;

	snprintf(path, sizeof path, "%s/%s", root, rel);
	doc = slurp(path);
	snprintf(dir, sizeof dir, "%s/%.*s", root, slash != NULL ? (int)(slash - rel) : 0, rel);
	for (const char *l = doc; *l != '\0'; l += strcspn(l, "\n") + (l[strcspn(l, "\n")] != '\0')) {
		size_t len = strcspn(l, "\n");

		if (strncmp(l, "```", 3) == 0)
			fence = !fence;
		if (fence)
			continue;
		for (const char *m = l; (m = strstr(m, "](")) != NULL && m < l + len; m += 2) {
			const char *t = m + 2;
			size_t tl = strcspn(t, ")\n"), pl = strcspn(t, "#)\n");
			char file[1024], frag[512] = "";

			if (strncmp(t, "http://", 7) == 0 || strncmp(t, "https://", 8) == 0 || strncmp(t, "mailto:", 7) == 0)
				continue;
			links++;
			snprintf(file, sizeof file, "%.*s", (int)pl, t);
			if (pl < tl)
				snprintf(frag, sizeof frag, "%.*s", (int)(tl - pl - 1), t + pl + 1);
			if (docs_link_leaves(rel, file)) {
				cr_log_error("%s: the link to %s leaves the tree: a clone elsewhere cannot follow it "
				             "(name the file in text instead)", rel, file);
				bad++;
				continue;
			}
			if (file[0] == '\0')
				snprintf(target, sizeof target, "%s", path);
			else
				snprintf(target, sizeof target, "%s/%s", dir, file);
			if (realpath(target, real) == NULL) {
				cr_log_error("%s: the link to %s leads nowhere", rel, file);
				bad++;
				continue;
			}
			if (strncmp(real, rootreal, strlen(rootreal)) != 0 || real[strlen(rootreal)] != '/')
				if (strcmp(real, rootreal) != 0)
					continue; /* outside the tree */
			if (frag[0] != '\0') {
				char *text = slurp(real);

				if (!has_anchor(text, frag)) {
					cr_log_error("%s: %s has no heading #%s", rel, file[0] != '\0' ? file : rel, frag);
					bad++;
				}
				free(text);
			}
		}
	}
	free(doc);
	*nlinks = links;
	return bad;
}

Test(docs, links_in_the_documents_reach_their_files_and_headings)
{
	const char *root = getenv("INBOX_SOURCE_ROOT");
	char rootreal[PATH_MAX], path[4096], rel[512];
	int bad = 0, docs = 0, links = 0;
	DIR *d;
	struct dirent *e;

	cr_assert_not_null(realpath(root, rootreal));
	bad += check_links(root, rootreal, "README.md", &links);
	cr_assert_gt(links, 5, "the README links to %d documents", links);
	for (size_t i = 0; i < sizeof docs_readme_folders / sizeof docs_readme_folders[0]; i++) {
		snprintf(rel, sizeof rel, "%s/README.md", docs_readme_folders[i]);
		if (path_is(root, rel, false))
			bad += check_links(root, rootreal, rel, &links);
	}
	snprintf(path, sizeof path, "%s/doc", root);
	d = opendir(path);
	cr_assert_not_null(d, "no doc/ folder");
	while ((e = readdir(d)) != NULL) {
		size_t n = strlen(e->d_name);

		if (n < 4 || strcmp(e->d_name + n - 3, ".md") != 0)
			continue;
		snprintf(rel, sizeof rel, "doc/%s", e->d_name);
		bad += check_links(root, rootreal, rel, &links);
		docs++;
	}
	closedir(d);
	cr_assert_geq(docs, 3);
	cr_assert_eq(bad, 0, "%d broken links in the documents", bad);
}

/* The README's test command (the first line of the code block under
 * *Tests*) is the command CI runs: what .ci/run hands over to with exec. */
Test(docs, readme_test_command_is_what_ci_runs)
{
	const char *root = getenv("INBOX_SOURCE_ROOT");
	char path[4096], readme_cmd[256] = "", ci_cmd[256] = "";
	char *doc, *ci, *p;

	snprintf(path, sizeof path, "%s/README.md", root);
	doc = slurp(path);
	p = strstr(doc, "\n## Tests\n");
	cr_assert_not_null(p, "README has no Tests section");
	p = strstr(p, "\n```sh\n");
	cr_assert_not_null(p, "README's Tests section has no ```sh block");
	p += strlen("\n```sh\n");
	snprintf(readme_cmd, sizeof readme_cmd, "%.*s", (int)strcspn(p, " \n"), p);
	snprintf(path, sizeof path, "%s/.ci/run", root);
	ci = slurp(path);
	p = strstr(ci, "\nexec ");
	cr_assert_not_null(p, ".ci/run does not exec its test command");
	p += strlen("\nexec ");
	snprintf(ci_cmd, sizeof ci_cmd, "%.*s", (int)strcspn(p, " \n"), p);
	cr_assert_str_eq(readme_cmd, ci_cmd, "the README's test command is %s, .ci/run runs %s", readme_cmd, ci_cmd);
	free(ci);
	free(doc);
}

/* The rooms that hold suites: the suite follows the folder. */
static const char *const docs_test_rooms[] = { "tests/unit", "tests/integration" };

/* doc/testing.md's list of suites names every test of the rooms (test
 * NAME is tests/<room>/test_NAME.c), so a new suite is not left out of
 * it; and no test_*.c lies outside a room (tests/ and tests/support
 * declare no suite, so it would be in none, or in the wrong one). */
Test(docs, testing_guide_names_every_test)
{
	static const char *const no_suites[] = { "tests", "tests/support" };
	const char *root = getenv("INBOX_SOURCE_ROOT");
	char path[4096], want[128];
	char *doc, *p, *end;
	int bad = 0, n = 0;
	DIR *d;
	struct dirent *e;

	snprintf(path, sizeof path, "%s/doc/testing.md", root);
	doc = slurp(path);
	p = strstr(doc, "Criterion suites registered with meson:");
	cr_assert_not_null(p, "doc/testing.md does not list the suites");
	end = strstr(p, "\n\n");
	cr_assert_not_null(end);
	*end = '\0';
	for (size_t r = 0; r < sizeof docs_test_rooms / sizeof docs_test_rooms[0]; r++) {
		snprintf(path, sizeof path, "%s/%s", root, docs_test_rooms[r]);
		d = opendir(path);
		cr_assert_not_null(d, "cannot read %s", path);
		while ((e = readdir(d)) != NULL) {
			size_t len = strlen(e->d_name);
			const char *hit;
			bool found = false;

			if (strncmp(e->d_name, "test_", 5) != 0 || len < 8 || strcmp(e->d_name + len - 2, ".c") != 0)
				continue;
			snprintf(want, sizeof want, "%.*s", (int)(len - 7), e->d_name + 5);
			n++;
			/* As a word of the list (a suite's own name is in `marks`). */
			for (hit = strstr(p, want); hit != NULL && !found; hit = strstr(hit + 1, want))
				found = strchr("( `\n", hit[-1]) != NULL && strchr(", )`\n", hit[strlen(want)]) != NULL;
			if (!found) {
				cr_log_error("doc/testing.md: the list of suites does not name %s (%s/%s)", want,
				             docs_test_rooms[r], e->d_name);
				bad++;
			}
		}
		closedir(d);
	}
	for (size_t r = 0; r < sizeof no_suites / sizeof no_suites[0]; r++) {
		snprintf(path, sizeof path, "%s/%s", root, no_suites[r]);
		d = opendir(path);
		cr_assert_not_null(d, "cannot read %s", path);
		while ((e = readdir(d)) != NULL) {
			size_t len = strlen(e->d_name);

			if (strncmp(e->d_name, "test_", 5) == 0 && len > 2 && strcmp(e->d_name + len - 2, ".c") == 0) {
				cr_log_error("%s/%s is in no room: move it to tests/unit or tests/integration", no_suites[r],
				             e->d_name);
				bad++;
			}
		}
		closedir(d);
	}
	cr_assert_gt(n, 20);
	cr_assert_eq(bad, 0, "%d tests missing from doc/testing.md's list of suites or outside a room", bad);
	free(doc);
}
