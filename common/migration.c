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

/* Read dir/name and its SHA-256 as hex; *sql is malloc'd (the caller
 * frees it), or pass NULL when only the checksum is wanted. */
int migration_digest(const char *dir, const char *name, char **sql, size_t *len, char hex[65])
{
	char path[4096];
	char *buf = NULL;
	size_t n = 0;
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned mdlen = 0;
	int rc;

	if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
		return ST_ERR_INVALID;
	rc = migration_read(path, &buf, &n);
	if (rc != ST_OK) {
		LOG(LOG_LEVEL_ERROR, "cannot read migration", LOG_S("file", path), LOG_S("error", strerror(errno)));
		return rc;
	}
	if (EVP_Digest(buf, n, md, &mdlen, EVP_sha256(), NULL) != 1 || mdlen != 32) {
		free(buf);
		return ST_ERR_NOMEM;
	}
	msg_sha256_hex(md, hex);
	if (sql != NULL) {
		*sql = buf;
		*len = n;
	} else {
		free(buf);
	}
	return ST_OK;
}

/* The first numbered record of schema_migrations that has no file among
 * names (sorted, count of them), into unknown (""): none.  Procedure
 * records are left out: a procedure file of an older build may be gone
 * for good (0011 dropped them). */
int migration_find_unknown(struct db *db, char *const *names, int count, char *unknown, size_t cap)
{
	struct db_stmt *list = NULL;
	char name[201];
	int rc;

	unknown[0] = '\0';
	rc = db_prepare(db, &list, "SELECT name FROM schema_migrations ORDER BY name");
	if (rc == ST_OK)
		rc = db_stmt_query(list, NULL, 0);
	while (rc == ST_OK) {
		struct db_col c[] = { DBC_STR(name, sizeof name) };
		int f = db_stmt_fetch(list, c, ARRAY_LEN(c));

		if (f < 0)
			rc = f;
		if (f <= 0)
			break;
		if (unknown[0] == '\0' && migration_name_ok(name) &&
		    bsearch(&(const char *){ name }, names, (size_t)count, sizeof *names, migration_cmp) == NULL)
			snprintf(unknown, cap, "%s", name);
	}
	if (rc == ST_OK)
		rc = db_commit(db);
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
