/*
 * migration.c - the migration folder and its records (migration.h).
 *
 * A folder is read whole and bounded: MIGRATION_MAX_FILES names, each file
 * at most MIGRATION_MAX_SIZE bytes, so a stray large file is refused, not
 * sent to the server.
 */
#include "migration.h"

#include <dirent.h>
#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "array.h"
#include "log.h"
#include "msg.h"
#include "status.h"

#define MIGRATION_MAX_SIZE (4 * 1024 * 1024)

int migration_name_ok(const char *name)
{
	size_t n = strlen(name);

	if (n < 10 || n > 200 || strcmp(name + n - 4, ".sql") != 0)
		return 0;
	for (int i = 0; i < 4; i++)
		if (name[i] < '0' || name[i] > '9')
			return 0;
	return name[4] == '_';
}

/* migrations/procedures/<name>.sql: re-applied when changed. */
int migration_proc_name_ok(const char *name)
{
	size_t n = strlen(name);

	return n > 4 && n <= 180 && name[0] != '.' && strcmp(name + n - 4, ".sql") == 0;
}

static int migration_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Read a whole file (bounded) into a malloc'd buffer. */
static int migration_read(const char *path, char **out, size_t *len)
{
	FILE *f = fopen(path, "rb");
	struct stat st;
	char *buf = NULL;
	int rc = ST_ERR_IO;

	*out = NULL;
	if (f == NULL)
		return ST_ERR_IO;
	if (fstat(fileno(f), &st) != 0 || st.st_size > MIGRATION_MAX_SIZE)
		goto cleanup;
	buf = malloc((size_t)st.st_size + 1);
	if (buf == NULL) {
		rc = ST_ERR_NOMEM;
		goto cleanup;
	}
	if (fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size)
		goto cleanup;
	buf[st.st_size] = '\0';
	*out = buf;
	*len = (size_t)st.st_size;
	buf = NULL;
	rc = ST_OK;
cleanup:
	free(buf);
	if (fclose(f) != 0 && rc == ST_OK) {
		free(*out);
		*out = NULL;
		rc = ST_ERR_IO;
	}
	return rc;
}

/* Frees what migration_list returned (NULL-safe). */
void migration_names_free(char **names, int count)
{
	for (int i = 0; i < count; i++)
		free(names[i]);
	free(names);
}

int migration_list(const char *dir, int (*name_ok)(const char *), char ***names, int *count)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char **v = NULL;
	int n = 0;

	*names = NULL;
	*count = 0;
	if (d == NULL)
		return ST_ERR_IO;
	v = calloc(MIGRATION_MAX_FILES, sizeof *v);
	if (v == NULL) {
		closedir(d);
		return ST_ERR_NOMEM;
	}
	errno = 0;
	while ((e = readdir(d)) != NULL) {
		if (!name_ok(e->d_name))
			continue;
		if (n == MIGRATION_MAX_FILES || (v[n] = strdup(e->d_name)) == NULL) {
			migration_names_free(v, n);
			closedir(d);
			return ST_ERR_NOMEM;
		}
		n++;
	}
	closedir(d);
	qsort(v, (size_t)n, sizeof *v, migration_cmp);
	*names = v;
	*count = n;
	return ST_OK;
}

/* The numbered files of dir, sorted; says why when it cannot list them. */
int migration_list_numbered(const char *dir, char ***names, int *count)
{
	int rc = migration_list(dir, migration_name_ok, names, count);

	if (rc != ST_OK)
		LOG(LOG_LEVEL_ERROR, "cannot list migrations", LOG_S("dir", dir), LOG_S("error", strerror(errno)));
	return rc;
}

/* The files of dir/procedures/ (pdir: that path), sorted; none when the
 * folder does not exist.  Says why when it cannot list them. */
int migration_list_procedures(const char *dir, char *pdir, size_t cap, char ***names, int *count)
{
	struct stat st;
	int rc;

	if (snprintf(pdir, cap, "%s/procedures", dir) >= (int)cap)
		return ST_ERR_INVALID;
	if (stat(pdir, &st) != 0 && errno == ENOENT)
		return ST_OK;
	rc = migration_list(pdir, migration_proc_name_ok, names, count);
	if (rc != ST_OK)
		LOG(LOG_LEVEL_ERROR, "cannot list procedures", LOG_S("dir", pdir), LOG_S("error", strerror(errno)));
	return rc;
}

/* "-- @word" at the start of line [p, p + n): the word's length, else 0. */
static size_t migration_annotation(const char *p, size_t n, const char **word)
{
	size_t w = 0;

	if (n < 5 || memcmp(p, "-- @", 4) != 0)
		return 0;
	*word = p + 4;
	while (4 + w < n && p[4 + w] >= 'a' && p[4 + w] <= 'z')
		w++;
	return w;
}

static bool migration_hex64(const char *p, size_t n)
{
	if (n < 64)
		return false;
	for (size_t i = 0; i < 64; i++)
		if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
			return false;
	return n == 64 || p[64] == ' ' || p[64] == '\n' || p[64] == '\r';
}

/* One annotation line into f; ST_ERR_INVALID for a word we do not know,
 * or a @replaces without a checksum. */
static int migration_annotate(struct migration_file *f, const char *path, const char *line, size_t n)
{
	const char *word = NULL;
	size_t w = migration_annotation(line, n, &word);
	const char *arg = word + w;
	size_t argn = n - 4 - w;

	while (argn > 0 && *arg == ' ') {
		arg++;
		argn--;
	}
	if (w == 6 && memcmp(word, "online", 6) == 0) {
		f->online = true;
	} else if (w == 5 && memcmp(word, "locks", 5) == 0) {
		f->locks = true;
	} else if (w == 8 && memcmp(word, "contract", 8) == 0) {
		f->contract = true;
	} else if (w == 8 && memcmp(word, "replaces", 8) == 0 && migration_hex64(arg, argn) &&
	           f->nreplaces < MIGRATION_REPLACES_MAX) {
		memcpy(f->replaces[f->nreplaces], arg, 64);
		f->replaces[f->nreplaces++][64] = '\0';
	} else {
		char shown[81];

		snprintf(shown, sizeof shown, "%.*s", (int)(n < 80 ? n : 80), line);
		LOG(LOG_LEVEL_ERROR,
		    "a migration's annotation is not one of @online, @locks, @contract, @replaces <sha256>"
		    " (at most 4 @replaces)",
		    LOG_S("file", path), LOG_S("line", shown));
		return ST_ERR_INVALID;
	}
	return ST_OK;
}

int migration_read_file(const char *dir, const char *name, struct migration_file *f)
{
	char path[4096];
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned mdlen = 0;
	EVP_MD_CTX *ctx = NULL;
	int rc;

	memset(f, 0, sizeof *f);
	if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
		return ST_ERR_INVALID;
	rc = migration_read(path, &f->sql, &f->len);
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_ERROR, "cannot read migration", LOG_S("file", path), LOG_S("error", strerror(errno)));
		return rc;
	}
	ctx = EVP_MD_CTX_new();
	if (ctx == NULL || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
		rc = ST_ERR_NOMEM;
		goto cleanup;
	}
	/* The checksum is of every line but the annotations, each line whole
	 * with its newline, so a file without annotations keeps the checksum
	 * of its bytes that earlier builds recorded. */
	for (size_t at = 0; at < f->len;) {
		const char *line = f->sql + at, *nl = memchr(line, '\n', f->len - at);
		size_t n = nl != NULL ? (size_t)(nl - line) + 1 : f->len - at;
		const char *word;

		if (migration_annotation(line, n, &word) > 0) {
			rc = migration_annotate(f, path, line, nl != NULL ? n - 1 : n);
			if (rc != ST_OK)
				goto cleanup;
		} else if (EVP_DigestUpdate(ctx, line, n) != 1) {
			rc = ST_ERR_NOMEM;
			goto cleanup;
		}
		at += n;
	}
	if (EVP_DigestFinal_ex(ctx, md, &mdlen) != 1 || mdlen != 32) {
		rc = ST_ERR_NOMEM;
		goto cleanup;
	}
	msg_sha256_hex(md, f->sha256);
	rc = ST_OK;
cleanup:
	EVP_MD_CTX_free(ctx);
	return rc;
}

void migration_file_free(struct migration_file *f)
{
	free(f->sql);
	f->sql = NULL;
	f->len = 0;
}

bool migration_file_matches(const struct migration_file *f, const char *recorded)
{
	if (strcmp(f->sha256, recorded) == 0)
		return true;
	for (int i = 0; i < f->nreplaces; i++)
		if (strcmp(f->replaces[i], recorded) == 0)
			return true;
	return false;
}

/* The numbered records of schema_migrations, sorted, as migration_list
 * gives names (the caller frees them with migration_names_free).  Commits
 * its read. */
static int migration_records(struct db *db, char ***out, int *count)
{
	struct db_stmt *list = NULL;
	char name[201], **v = NULL;
	int n = 0, rc;

	*out = NULL;
	*count = 0;
	rc = db_prepare(db, &list, "SELECT name FROM schema_migrations ORDER BY name");
	if (rc == ST_OK)
		rc = db_stmt_query(list, NULL, 0);
	while (rc == ST_OK) {
		struct db_col c[] = { DBC_STR(name, sizeof name) };
		int f = db_stmt_fetch(list, c, ARRAY_LEN(c));
		char **grown;

		if (f < 0)
			rc = f;
		if (f <= 0)
			break;
		if (!migration_name_ok(name))
			continue;
		if (n >= 2 * MIGRATION_MAX_FILES) {
			rc = ST_ERR_NOMEM;
			break;
		}
		grown = realloc(v, (size_t)(n + 1) * sizeof *v);
		if (grown == NULL) {
			rc = ST_ERR_NOMEM;
			break;
		}
		v = grown;
		v[n] = strdup(name);
		if (v[n] == NULL) {
			rc = ST_ERR_NOMEM;
			break;
		}
		n++;
	}
	if (rc == ST_OK)
		rc = db_commit(db);
	if (rc != ST_OK) {
		migration_names_free(v, n);
		return rc;
	}
	*out = v;
	*count = n;
	return ST_OK;
}

static bool migration_has(char *const *names, int count, const char *name)
{
	return bsearch(&(const char *){ name }, names, (size_t)count, sizeof *names, migration_cmp) != NULL;
}

/* The first numbered record of schema_migrations that has no file among
 * names (sorted, count of them), into unknown (""): none.  Procedure
 * records are left out: a procedure file of an older build may be gone
 * for good (0011 dropped them). */
int migration_find_unknown(struct db *db, char *const *names, int count, char *unknown, size_t cap)
{
	char **rec = NULL;
	int nrec = 0, rc = migration_records(db, &rec, &nrec);

	unknown[0] = '\0';
	for (int i = 0; rc == ST_OK && i < nrec; i++)
		if (!migration_has(names, count, rec[i])) {
			snprintf(unknown, cap, "%s", rec[i]);
			break;
		}
	migration_names_free(rec, nrec);
	return rc;
}

int migration_find_pending(struct db *db, const char *dir, char *const *names, int count, char *pending,
                           size_t cap)
{
	char **rec = NULL;
	int nrec = 0, rc = migration_records(db, &rec, &nrec);

	pending[0] = '\0';
	for (int i = 0; rc == ST_OK && i < count; i++) {
		struct migration_file f;

		if (migration_has(rec, nrec, names[i]))
			continue;
		rc = migration_read_file(dir, names[i], &f);
		if (rc == ST_OK && !f.contract) {
			snprintf(pending, cap, "%s", names[i]);
			migration_file_free(&f);
			break;
		}
		migration_file_free(&f);
	}
	migration_names_free(rec, nrec);
	return rc;
}

void migration_log_unknown(const char *what, const char *unknown, const char *dir)
{
	LOG(LOG_LEVEL_ERROR, what, LOG_S("record", unknown), LOG_S("dir", dir),
	    LOG_S("remedy", "run the build that applied it (or restore its file in this folder)"));
}

/* Whether schema_migrations exists in the connected database (a database
 * never migrated has none).  The statement is owned by db. */
int migration_have_table(struct db *db, bool *have)
{
	struct db_stmt *exists = NULL;
	struct db_col c[] = { DBC_I64() };
	int r, rc = db_prepare(db, &exists,
	                       "SELECT COUNT(*) FROM information_schema.tables"
	                       " WHERE table_schema = DATABASE() AND table_name = 'schema_migrations'");

	if (rc != ST_OK)
		return rc;
	r = db_stmt_query_row(exists, NULL, 0, c, ARRAY_LEN(c));
	if (r < 0)
		return r;
	*have = r == 1 && c[0].i64 > 0;
	return ST_OK;
}
