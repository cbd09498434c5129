/*
 * lifecycle_schema.c - DDL and schema differences from a definition.
 *
 * Why one list of required columns drives both: what migrate creates is
 * then by construction what run checks, and the order definition's list is
 * held to migrations/ by test_lifecycle_schema against the real database.
 * Widths are lower bounds: a wider varchar or a larger integer type passes
 * (the order schema's status is VARCHAR(24), more than its longest state).
 */
#include "lifecycle_schema.h"
#include "array.h"
#include "msg.h"
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum family { F_VARCHAR, F_INT, F_DATETIME, F_CHAR };

struct need {
	int table;          /* 0 aggregate, 1 ledger, 2 locks */
	bool kept;          /* the worker's own, added by a later version: migrate adds it to a table */
	char column[LC_NAME_MAX + 1];
	enum family family;
	long long length;   /* F_VARCHAR/F_CHAR: at least this */
	const char *ddl;    /* the column's type and nullability */
	char ddl_buf[96];
};

#define NEED_MAX (32 + LC_MAX_EVENTS * LC_MAX_SETS)

static int name_width(const char names[][LC_NAME_MAX + 1], int from, int n)
{
	int w = 1;

	for (int i = from; i < n; i++) {
		int l = (int)strlen(names[i]);
		if (l > w)
			w = l;
	}
	return w;
}

static int event_width(const struct lc_def *d)
{
	int w = 1;

	for (int e = 0; e < d->nevents; e++) {
		int l = (int)strlen(d->events[e].type);
		if (l > w)
			w = l;
		for (int a = 0; a < d->events[e].naliases; a++) {
			l = (int)strlen(d->events[e].aliases[a]);
			if (l > w)
				w = l;
		}
	}
	return w;
}

static void add(struct need *nd, int *n, int table, const char *column, enum family f, long long len, const char *ddl)
{
	struct need *x = &nd[*n];

	x->table = table;
	snprintf(x->column, sizeof x->column, "%s", column);
	x->family = f;
	x->length = len;
	x->ddl = ddl;
	x->kept = false;
	(*n)++;
}

static void add_fmt(struct need *nd, int *n, int table, const char *column, enum family f, long long len,
                    const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static void add_fmt(struct need *nd, int *n, int table, const char *column, enum family f, long long len,
                    const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(nd[*n].ddl_buf, sizeof nd[*n].ddl_buf, fmt, ap);
	va_end(ap);
	add(nd, n, table, column, f, len, nd[*n].ddl_buf);
}

#define ID "VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL"
/* One rule for every width: a column is as wide as the widest value the
 * worker accepts into it.  The key columns take what the envelopes accept
 * (msg.h: a CloudEvent's source and id, 255 each, as migration 0017 made
 * order_events); a column several events set, the widest declaration. */
#define STR_(x) #x
#define STR(x) STR_(x)
#define WIDE_KEY(n) "VARCHAR(" STR(n) ") CHARACTER SET ascii COLLATE ascii_bin NOT NULL"
/* A version is printable ASCII (lc_load), compared byte for byte; NULL: a
 * row written before versions were recorded. */
#define LC_VERSION_DDL "VARCHAR(" STR(LC_VERSION_MAX) ") CHARACTER SET ascii COLLATE ascii_bin NULL"

/* The required columns, in table order; a set column appears once even if
 * several events set it (the first one's type stands: lc_load does not
 * compare them, so they are compared here). */
static int needs(const struct lc_def *d, struct need *nd, char *diff, size_t cap, int *ndiff)
{
	int n = 0, sw = name_width(d->states, 1, d->nstates), ew = event_width(d);

	add(nd, &n, 0, "id", F_VARCHAR, 64, ID);
	add_fmt(nd, &n, 0, "status", F_VARCHAR, sw, "VARCHAR(%d) CHARACTER SET ascii NOT NULL", sw < 24 ? 24 : sw);
	add(nd, &n, 0, "version", F_INT, 0, "INT UNSIGNED NOT NULL");
	add(nd, &n, 0, "flags", F_INT, 0, "INT UNSIGNED NOT NULL DEFAULT 0");
	/* what a numbered aggregate emitted so far: its emitted events' own
	 * numbers (inbox_int.h) */
	if (lc_sequenced(d)) {
		add(nd, &n, 0, "emitted", F_INT, 0, "INT UNSIGNED NOT NULL DEFAULT 0");
		/* migrate adds it to a numbered table of an earlier build, whose
		 * emitted events said their cause's number: counting starts there */
		nd[n - 1].kept = true;
	}
	for (int e = 0; e < d->nevents; e++) {
		for (int k = 0; k < d->events[e].nsets; k++) {
			const struct lc_set *st = &d->events[e].sets[k];
			bool seen = st->column[0] == '\0'; /* a field: no column */

			for (int i = 0; i < n && !seen; i++) {
				if (nd[i].table != 0 || strcmp(nd[i].column, st->column) != 0)
					continue;
				seen = true;
				if (nd[i].family == F_VARCHAR && st->type == LC_TYPE_STRING &&
				    st->max_length > nd[i].length) {
					nd[i].length = st->max_length;
					snprintf(nd[i].ddl_buf, sizeof nd[i].ddl_buf,
					         "VARCHAR(%lld) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL",
					         (long long)st->max_length);
					nd[i].ddl = nd[i].ddl_buf;
				}
			}
			if (seen)
				continue;
			if (lc_column_reserved(st->column)) { /* lc_load refuses it; kept for a def built by hand */
				snprintf(diff, cap, "%s sets \"%s\", a column the worker keeps itself: name it otherwise\n",
				         d->events[e].type, st->column);
				(*ndiff)++;
				continue;
			}
			switch (st->type) {
			case LC_TYPE_DATETIME:
				add(nd, &n, 0, st->column, F_DATETIME, 0, "DATETIME(6) NULL");
				break;
			case LC_TYPE_INTEGER:
				add(nd, &n, 0, st->column, F_INT, 0, "BIGINT NULL");
				break;
			case LC_TYPE_STRING:
				add_fmt(nd, &n, 0, st->column, F_VARCHAR, st->max_length,
				        "VARCHAR(%lld) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL", (long long)st->max_length);
				break;
			}
		}
	}
	add(nd, &n, 0, "created_at", F_DATETIME, 0, "DATETIME(6) NOT NULL");
	add(nd, &n, 0, "updated_at", F_DATETIME, 0, "DATETIME(6) NOT NULL");
	/* The definition's version that last wrote the row (migration 0020
	 * for orders): last, where ALTER TABLE ... ADD COLUMN puts it. */
	add(nd, &n, 0, "lifecycle_version", F_VARCHAR, LC_VERSION_MAX, LC_VERSION_DDL);
	nd[n - 1].kept = true;

	add(nd, &n, 1, "id", F_INT, 0, "BIGINT UNSIGNED NOT NULL AUTO_INCREMENT");
	add(nd, &n, 1, d->key, F_VARCHAR, 64, ID);
	add(nd, &n, 1, "consumer", F_VARCHAR, 64, ID);
	add(nd, &n, 1, "source", F_VARCHAR, MSG_WIDE_SOURCE_MAX, WIDE_KEY(MSG_WIDE_SOURCE_MAX));
	add(nd, &n, 1, "message_id", F_VARCHAR, MSG_WIDE_ID_MAX, WIDE_KEY(MSG_WIDE_ID_MAX));
	add_fmt(nd, &n, 1, "type", F_VARCHAR, ew, "VARCHAR(%d) CHARACTER SET ascii NOT NULL", ew < 32 ? 32 : ew);
	add(nd, &n, 1, "outcome", F_VARCHAR, 16, "VARCHAR(16) CHARACTER SET ascii NOT NULL");
	/* "None" is the from_status of a creation */
	add_fmt(nd, &n, 1, "from_status", F_VARCHAR, sw < 4 ? 4 : sw, "VARCHAR(%d) CHARACTER SET ascii NOT NULL",
	        sw < 24 ? 24 : sw);
	add_fmt(nd, &n, 1, "to_status", F_VARCHAR, sw, "VARCHAR(%d) CHARACTER SET ascii NOT NULL", sw < 24 ? 24 : sw);
	add(nd, &n, 1, "version", F_INT, 0, "INT UNSIGNED NOT NULL");
	add(nd, &n, 1, "applied_at", F_DATETIME, 0, "DATETIME(6) NOT NULL");
	add(nd, &n, 1, "payload_sha256", F_CHAR, 64, "CHAR(64) CHARACTER SET ascii NULL");

	add(nd, &n, 2, d->key, F_VARCHAR, 64, ID);
	add(nd, &n, 2, "held", F_INT, 0, "INT UNSIGNED NOT NULL DEFAULT 0");
	/* transactions that locked it: the claim's real write (migration 0010) */
	add(nd, &n, 2, "locks", F_INT, 0, "BIGINT UNSIGNED NOT NULL DEFAULT 0");
	return n;
}

void lc_schema_tables(const struct lc_def *d, char names[LC_SCHEMA_TABLES][LC_NAME_MAX + 16])
{
	snprintf(names[0], LC_NAME_MAX + 16, "%s", d->table);
	snprintf(names[1], LC_NAME_MAX + 16, "%s_events", d->aggregate);
	snprintf(names[2], LC_NAME_MAX + 16, "%s_locks", d->aggregate);
}

struct out {
	char *p;
	size_t cap, used;
	bool full;
};

static void put(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct out *o, const char *fmt, ...)
{
	va_list ap;
	int w;

	if (o->full)
		return;
	va_start(ap, fmt);
	w = vsnprintf(o->p + o->used, o->cap - o->used, fmt, ap);
	va_end(ap);
	if (w < 0 || (size_t)w >= o->cap - o->used) {
		o->full = true;
		return;
	}
	o->used += (size_t)w;
}

int lc_schema_ddl(const struct lc_def *d, char *buf, size_t cap)
{
	struct need nd[NEED_MAX]; /* ~30 KiB: called at start-up, not per message */
	char names[LC_SCHEMA_TABLES][LC_NAME_MAX + 16], ignored[256];
	struct out o = { buf, cap, 0, false };
	int ndiff = 0, n;

	if (cap == 0)
		return -1;
	buf[0] = '\0';
	n = needs(d, nd, ignored, sizeof ignored, &ndiff);
	if (ndiff > 0)
		return -1;
	lc_schema_tables(d, names);
	for (int t = 0; t < LC_SCHEMA_TABLES; t++) {
		put(&o, "CREATE TABLE IF NOT EXISTS `%s` (\n", names[t]);
		for (int i = 0; i < n; i++) {
			if (nd[i].table == t)
				put(&o, "  `%s` %s,\n", nd[i].column, nd[i].ddl);
		}
		if (t == 0)
			put(&o, "  PRIMARY KEY (`id`)\n");
		else if (t == 1)
			put(&o, "  PRIMARY KEY (`id`),\n  UNIQUE KEY `uq_%s_message` (`consumer`, `source`, `message_id`),\n"
			        "  UNIQUE KEY `uq_%s_version` (`%s`, `version`)\n",
			    names[1], names[1], d->key);
		else
			put(&o, "  PRIMARY KEY (`%s`)\n", d->key);
		put(&o, ") ENGINE=InnoDB DEFAULT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;\n");
	}
	return o.full ? -1 : 0;
}

static enum family family_of(const char *t, bool *known)
{
	*known = true;
	if (strcmp(t, "varchar") == 0)
		return F_VARCHAR;
	if (strcmp(t, "char") == 0)
		return F_CHAR;
	if (strcmp(t, "datetime") == 0 || strcmp(t, "timestamp") == 0)
		return F_DATETIME;
	if (strcmp(t, "tinyint") == 0 || strcmp(t, "smallint") == 0 || strcmp(t, "mediumint") == 0 ||
	    strcmp(t, "int") == 0 || strcmp(t, "bigint") == 0)
		return F_INT;
	*known = false;
	return F_VARCHAR;
}

static const char *family_name(enum family f)
{
	switch (f) {
	case F_VARCHAR: return "varchar";
	case F_INT: return "an integer type";
	case F_DATETIME: return "datetime";
	case F_CHAR: return "char";
	}
	return "";
}

int lc_schema_compare(const struct lc_def *d, const struct lc_column *cols, int n, char *diff, size_t cap)
{
	struct need nd[NEED_MAX]; /* ~30 KiB: called at start-up, not per message */
	char names[LC_SCHEMA_TABLES][LC_NAME_MAX + 16];
	struct out o = { diff, cap, 0, false };
	int ndiff = 0, nn;
	bool present[LC_SCHEMA_TABLES] = { false, false, false };

	if (cap == 0)
		return -1;
	diff[0] = '\0';
	nn = needs(d, nd, diff, cap, &ndiff);
	if (ndiff > 0)
		return ndiff;
	lc_schema_tables(d, names);
	for (int i = 0; i < n; i++) {
		for (int t = 0; t < LC_SCHEMA_TABLES; t++)
			present[t] |= strcmp(cols[i].table, names[t]) == 0;
	}
	for (int t = 0; t < LC_SCHEMA_TABLES; t++) {
		if (!present[t]) {
			put(&o, "table %s is missing: run `inbox-worker migrate` with this INBOX_LIFECYCLE to create it\n",
			    names[t]);
			ndiff++;
		}
	}
	for (int i = 0; i < nn; i++) {
		const struct lc_column *have = NULL;
		bool known;
		enum family f;

		if (!present[nd[i].table])
			continue;
		for (int k = 0; k < n && have == NULL; k++) {
			if (strcmp(cols[k].table, names[nd[i].table]) == 0 && strcmp(cols[k].column, nd[i].column) == 0)
				have = &cols[k];
		}
		if (have == NULL) {
			put(&o, "%s.%s is missing: ALTER TABLE `%s` ADD COLUMN `%s` %s\n", names[nd[i].table], nd[i].column,
			    names[nd[i].table], nd[i].column, nd[i].ddl);
			ndiff++;
			continue;
		}
		f = family_of(have->data_type, &known);
		if (!known || f != nd[i].family) {
			put(&o, "%s.%s is %s, the definition needs %s: ALTER TABLE `%s` MODIFY COLUMN `%s` %s\n",
			    names[nd[i].table], nd[i].column, have->data_type, family_name(nd[i].family),
			    names[nd[i].table], nd[i].column, nd[i].ddl);
			ndiff++;
		} else if ((f == F_VARCHAR || f == F_CHAR) && have->length < nd[i].length) {
			put(&o, "%s.%s holds %lld characters, the definition needs %lld: ALTER TABLE `%s` MODIFY COLUMN `%s` %s\n",
			    names[nd[i].table], nd[i].column, have->length, nd[i].length, names[nd[i].table],
			    nd[i].column, nd[i].ddl);
			ndiff++;
		}
	}
	return ndiff;
}

/* What the statements that change existing tables (lc_schema_widen,
 * lc_schema_add_kept) start from: the columns d needs, in nd, and the
 * tables' names.  The count, or 0 for a definition whose tables cannot be
 * written (lc_schema_compare says why). */
static int alter_needs(const struct lc_def *d, struct need *nd, char names[LC_SCHEMA_TABLES][LC_NAME_MAX + 16])
{
	char ignored[256];
	int ndiff = 0, nn = needs(d, nd, ignored, sizeof ignored, &ndiff);

	lc_schema_tables(d, names);
	return ndiff > 0 ? 0 : nn;
}

int lc_schema_widen(const struct lc_def *d, const struct lc_column *cols, int n, char *buf, size_t cap)
{
	struct need nd[NEED_MAX]; /* ~30 KiB: called at start-up, not per message */
	char names[LC_SCHEMA_TABLES][LC_NAME_MAX + 16];
	struct out o = { buf, cap, 0, false };
	int nn, nalter = 0;

	if (cap == 0)
		return -1;
	buf[0] = '\0';
	nn = alter_needs(d, nd, names);
	for (int i = 0; i < nn; i++) {
		for (int k = 0; k < n; k++) {
			bool known;
			enum family f;

			if (strcmp(cols[k].table, names[nd[i].table]) != 0 || strcmp(cols[k].column, nd[i].column) != 0)
				continue;
			f = family_of(cols[k].data_type, &known);
			if (known && f == nd[i].family && (f == F_VARCHAR || f == F_CHAR) && cols[k].length < nd[i].length) {
				put(&o, "ALTER TABLE `%s` MODIFY COLUMN `%s` %s;\n", names[nd[i].table], nd[i].column,
				    nd[i].ddl);
				nalter++;
			}
			break;
		}
	}
	return o.full ? -1 : nalter;
}

int lc_schema_add_kept(const struct lc_def *d, const struct lc_column *cols, int n, char *buf, size_t cap)
{
	struct need nd[NEED_MAX]; /* ~30 KiB: called at start-up, not per message */
	char names[LC_SCHEMA_TABLES][LC_NAME_MAX + 16];
	struct out o = { buf, cap, 0, false };
	bool present[LC_SCHEMA_TABLES] = { false, false, false };
	int nn, nadd = 0;

	if (cap == 0)
		return -1;
	buf[0] = '\0';
	nn = alter_needs(d, nd, names);
	for (int k = 0; k < n; k++) {
		for (int t = 0; t < LC_SCHEMA_TABLES; t++)
			present[t] |= strcmp(cols[k].table, names[t]) == 0;
	}
	for (int i = 0; i < nn; i++) {
		bool have = false;

		if (!nd[i].kept || !present[nd[i].table])
			continue;
		for (int k = 0; k < n && !have; k++)
			have = strcmp(cols[k].table, names[nd[i].table]) == 0 && strcmp(cols[k].column, nd[i].column) == 0;
		if (have)
			continue;
		/* At the end with a NULL default: MariaDB adds it in place,
		 * without copying the table (as migration 0020 does). */
		put(&o, "ALTER TABLE `%s` ADD COLUMN IF NOT EXISTS `%s` %s, ALGORITHM=INSTANT;\n", names[nd[i].table],
		    nd[i].column, nd[i].ddl);
		nadd++;
	}
	return o.full ? -1 : nadd;
}

int lc_schema_read(struct db *db, const struct lc_def *def, struct lc_column *cols, int cap, int *n)
{
	char names[LC_SCHEMA_TABLES][LC_NAME_MAX + 16];
	struct db_stmt *q = NULL;
	int rc, r;

	lc_schema_tables(def, names);
	rc = db_prepare(db, &q,
	                "SELECT table_name, column_name, LOWER(data_type), COALESCE(character_maximum_length, 0)"
	                " FROM information_schema.columns WHERE table_schema = DATABASE()"
	                " AND table_name IN (?, ?, ?) ORDER BY table_name, ordinal_position");
	if (rc != ST_OK)
		return rc;
	{
		struct db_param p[] = { DBP_STR(names[0]), DBP_STR(names[1]), DBP_STR(names[2]) };

		rc = db_stmt_query(q, p, ARRAY_LEN(p));
	}
	if (rc != ST_OK)
		return rc;
	*n = 0;
	while (*n < cap) {
		struct lc_column *c = &cols[*n];
		struct db_col out[] = { DBC_STR(c->table, sizeof c->table), DBC_STR(c->column, sizeof c->column),
			                DBC_STR(c->data_type, sizeof c->data_type), DBC_I64() };

		r = db_stmt_fetch(q, out, ARRAY_LEN(out));
		if (r < 0)
			return r;
		if (r == 0)
			return ST_OK;
		c->length = out[3].i64;
		(*n)++;
	}
	db_stmt_done(q); /* cap reached: the rest are not read */
	return ST_OK;
}
