/*
 * sqlbuf.c - SQL text with escaped values (see sqlbuf.h for the rule).
 */
#include "sqlbuf.h"

#include <stdlib.h>
#include <string.h>

#include "status.h"

size_t sqlbuf_max(const struct sqlbuf *b)
{
	if (b->max > 0)
		return b->max;
	return b->db != NULL ? db_max_request(b->db) : SIZE_MAX / 4;
}

static bool sqlbuf_reserve(struct sqlbuf *b, size_t more)
{
	size_t cap, max = sqlbuf_max(b);
	char *np;

	if (b->err != ST_OK)
		return false;
	if (max > SIZE_MAX / 4)
		max = SIZE_MAX / 4;
	/* +1: the NUL kept after the text. */
	if (b->len >= max || more >= max - b->len) {
		b->err = b->db != NULL ? db_too_large(b->db, b->len + more) : ST_ERR_DB_DATA;
		return false;
	}
	if (b->len + more + 1 <= b->cap)
		return true;
	cap = b->cap > 0 ? b->cap : 4096;
	while (cap < b->len + more + 1)
		cap *= 2;
	if (cap > max)
		cap = max; /* the ceiling holds the memory too (len + more + 1 <= max) */
	np = realloc(b->p, cap);
	if (np == NULL) {
		b->err = ST_ERR_NOMEM;
		return false;
	}
	b->p = np;
	b->cap = cap;
	return true;
}

static void sqlbuf_raw(struct sqlbuf *b, const char *s, size_t n)
{
	if (!sqlbuf_reserve(b, n))
		return;
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

/* Inside a row: the comma before every value but the first. */
static void sqlbuf_sep(struct sqlbuf *b)
{
	if (!b->in_row)
		return;
	if (!b->first)
		sqlbuf_raw(b, ",", 1);
	b->first = false;
}

void sqlbuf_value(struct sqlbuf *b, const char *sql)
{
	sqlbuf_sep(b);
	sqlbuf_raw(b, sql, strlen(sql));
}

void sqlbuf_sql(struct sqlbuf *b, const char *sql)
{
	sqlbuf_raw(b, sql, strlen(sql));
}

void sqlbuf_sqln(struct sqlbuf *b, const char *sql, size_t n)
{
	sqlbuf_raw(b, sql, n);
}

/* Record a cut point at the end of the text. */
static void sqlbuf_cut(struct sqlbuf *b)
{
	if (!b->cuts_on || b->err != ST_OK)
		return;
	if (b->ncuts == b->cuts_cap) {
		size_t cap = b->cuts_cap > 0 ? 2 * b->cuts_cap : 64;
		size_t *nc = cap < SIZE_MAX / sizeof *nc ? realloc(b->cuts, cap * sizeof *nc) : NULL;

		if (nc == NULL) {
			b->err = ST_ERR_NOMEM;
			return;
		}
		b->cuts = nc;
		b->cuts_cap = cap;
	}
	b->cuts[b->ncuts++] = b->len;
}

void sqlbuf_stmt(struct sqlbuf *b)
{
	sqlbuf_cut(b);
}

/* Bytes that never need escaping in a quoted literal, whatever the
 * connection's character set (every one we allow is ASCII-compatible) and
 * SQL mode: printable ASCII but the quotes and the backslash.  Most values
 * (ids, names, hashes) are made of these alone and are copied as they are;
 * the connector's escaping walks the character set byte by byte. */
static bool sqlbuf_plain(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c < 0x20 || c > 0x7e || c == '\'' || c == '"' || c == '\\')
			return false;
	}
	return true;
}

void sqlbuf_strn(struct sqlbuf *b, const char *s, size_t n)
{
	size_t e;

	/* The escaped text is at most twice as long, plus quotes. */
	sqlbuf_sep(b);
	if (n > (SIZE_MAX / 4) || !sqlbuf_reserve(b, 2 * n + 3))
		return;
	b->p[b->len++] = '\'';
	if (sqlbuf_plain(s, n)) {
		memcpy(b->p + b->len, s, n);
		e = n;
	} else {
		e = db_escape(b->db, b->p + b->len, s, n);
	}
	if (e == SIZE_MAX) {
		b->err = db_refuse_value(b->db, "a value cannot be escaped in the connection's character set");
		return;
	}
	b->len += e;
	b->p[b->len++] = '\'';
	b->p[b->len] = '\0';
}

void sqlbuf_str(struct sqlbuf *b, const char *s)
{
	if (s == NULL)
		sqlbuf_value(b, "NULL");
	else
		sqlbuf_strn(b, s, strlen(s));
}

void sqlbuf_bytes(struct sqlbuf *b, const void *p, size_t n)
{
	static const char hexd[] = "0123456789abcdef";
	const unsigned char *s = p;
	char *o;

	sqlbuf_sep(b);
	if (n > (SIZE_MAX / 4) || !sqlbuf_reserve(b, 2 * n + 3))
		return;
	o = b->p + b->len;
	*o++ = 'X';
	*o++ = '\'';
	for (size_t i = 0; i < n; i++) {
		*o++ = hexd[s[i] >> 4];
		*o++ = hexd[s[i] & 15];
	}
	*o++ = '\'';
	b->len = (size_t)(o - b->p);
	b->p[b->len] = '\0';
}

/* Decimal digits of v, right-aligned in t[0..24); returns where they
 * start.  (snprintf costs about ten times as much, and a batch formats a
 * few numbers per row.) */
static size_t sqlbuf_digits(char t[24], int64_t v)
{
	uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
	size_t i = 24;

	do {
		t[--i] = (char)('0' + u % 10);
		u /= 10;
	} while (u != 0);
	if (v < 0)
		t[--i] = '-';
	return i;
}

void sqlbuf_i64(struct sqlbuf *b, int64_t v)
{
	char t[24];
	size_t i = sqlbuf_digits(t, v);

	sqlbuf_sep(b);
	sqlbuf_raw(b, t + i, 24 - i);
}

void sqlbuf_unix_us(struct sqlbuf *b, int64_t us)
{
	char t[24], frac[6];
	size_t i;
	int64_t f;

	if (us < 0)
		us = 0;
	i = sqlbuf_digits(t, us / 1000000);
	f = us % 1000000;
	for (int k = 5; k >= 0; k--, f /= 10)
		frac[k] = (char)('0' + f % 10);
	sqlbuf_sep(b);
	sqlbuf_raw(b, "FROM_UNIXTIME(", 14);
	sqlbuf_raw(b, t + i, 24 - i);
	sqlbuf_raw(b, ".", 1);
	sqlbuf_raw(b, frac, 6);
	sqlbuf_raw(b, ")", 1);
}

void sqlbuf_list(struct sqlbuf *b)
{
	b->mark = b->len;
}

void sqlbuf_row(struct sqlbuf *b)
{
	b->in_row = false;
	sqlbuf_item(b);
	sqlbuf_raw(b, "(", 1);
	b->in_row = true;
	b->first = true;
}

void sqlbuf_row_end(struct sqlbuf *b)
{
	b->in_row = false;
	sqlbuf_raw(b, ")", 1);
}

void sqlbuf_item(struct sqlbuf *b)
{
	sqlbuf_cut(b);
	if (b->len > b->mark)
		sqlbuf_raw(b, ",", 1);
}

void sqlbuf_undo(struct sqlbuf *b, size_t len)
{
	if (len > b->len)
		return;
	b->len = len;
	b->err = ST_OK;
	while (b->ncuts > 0 && b->cuts[b->ncuts - 1] > len)
		b->ncuts--;
	if (b->p != NULL)
		b->p[b->len] = '\0';
}

void sqlbuf_reset(struct sqlbuf *b)
{
	b->len = 0;
	b->mark = 0;
	b->in_row = false;
	b->first = false;
	b->err = ST_OK;
	b->ncuts = 0;
	if (b->p != NULL)
		b->p[0] = '\0';
}

void sqlbuf_trim(struct sqlbuf *b, size_t keep)
{
	if (b->cap > keep) {
		free(b->p);
		b->p = NULL;
		b->cap = 0;
		free(b->cuts);
		b->cuts = NULL;
		b->cuts_cap = 0;
	}
	sqlbuf_reset(b);
}

void sqlbuf_free(struct sqlbuf *b)
{
	free(b->p);
	b->p = NULL;
	b->cap = 0;
	free(b->cuts);
	b->cuts = NULL;
	b->cuts_cap = 0;
	sqlbuf_reset(b);
}

int sqlbuf_err(const struct sqlbuf *b)
{
	return b->err;
}
