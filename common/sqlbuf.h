/*
 * sqlbuf.h - SQL text with values spliced in safely, for the requests that
 * carry a whole batch in one round trip (common/inbox.c).
 *
 * Why text: a batch's rows go to the server as multi-row statements, several
 * in one request (db_multi).  A prepared statement carries one statement
 * only, and its parameter count is fixed, so a batch of any size in two
 * round trips needs text (measured in bench/: the same rows cost the server
 * about a third less as multi-row text than through JSON_TABLE procedures).
 * The rule that keeps it safe: no SQL is ever built from message text.  Our
 * own fixed SQL goes in with sqlbuf_sql; every value goes in through a
 * function of its kind — strings escaped for the connection (db_escape)
 * inside quotes, bytes as a hex literal, numbers formatted here.
 *
 * Errors are sticky: a failed allocation or a string the connection cannot
 * escape sets err, later calls do nothing, and the owner checks err once
 * before sending (sqlbuf_err).
 *
 * Every buffer has a ceiling (max): by default the connection's
 * db_max_request, the most one request may hold below the server's
 * max_allowed_packet, read at connect.  Growing past it is the sticky
 * ST_ERR_DB_DATA, with the size in the connection's db_errmsg: that is how
 * a request is known not to fit before it is sent (db.h says why it must
 * be).  A buffer whose rows are later cut into several requests (the
 * sections of inbox_write.c's write) sets a ceiling of its own and cuts on:
 * then the place before each row or statement is recorded (sqlbuf_item, sqlbuf_row, sqlbuf_stmt),
 * so that the rows can be sent a request-full at a time.
 *
 * Ownership: the struct is the caller's (zeroed to start); p is malloc'd
 * here and freed by sqlbuf_free.  db is borrowed; it must be the
 * connection the text is sent on (escaping depends on its character set
 * and SQL mode).
 */
#ifndef INBOX_SQLBUF_H
#define INBOX_SQLBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "db.h"

struct sqlbuf {
	char *p;
	size_t len, cap;
	int err;           /* ST_OK, or the first error */
	struct db *db;     /* escaping is per connection */
	size_t mark;       /* where the current list of rows began */
	bool in_row;       /* inside sqlbuf_row: values are comma-separated */
	bool first;        /* no value in the row yet */
	size_t max;        /* the ceiling; 0: db_max_request(db) */
	/* Cut points (when cuts_on): offsets where a row of a list, or a
	 * whole statement, begins (a list's rows after the first begin with
	 * their comma). */
	bool cuts_on;
	size_t *cuts;
	size_t ncuts, cuts_cap;
};

/* Our own SQL text (a literal of the caller's, never data). */
void sqlbuf_sql(struct sqlbuf *b, const char *sql);
/* n bytes of SQL text this module built (a part of another sqlbuf). */
void sqlbuf_sqln(struct sqlbuf *b, const char *sql, size_t n);
/* A whole statement begins here (a cut point, when cuts_on). */
void sqlbuf_stmt(struct sqlbuf *b);
/* The ceiling in bytes (sqlbuf_reserve refuses to grow past it). */
size_t sqlbuf_max(const struct sqlbuf *b);
/* Our own SQL text as one value of a row (e.g. "NOW(6)", "NULL"). */
void sqlbuf_value(struct sqlbuf *b, const char *sql);
/* A quoted, escaped string literal; s NULL gives NULL. */
void sqlbuf_str(struct sqlbuf *b, const char *s);
void sqlbuf_strn(struct sqlbuf *b, const char *s, size_t n);
/* Bytes as a hex literal (X'..'): any bytes, no character set involved. */
void sqlbuf_bytes(struct sqlbuf *b, const void *p, size_t n);
void sqlbuf_i64(struct sqlbuf *b, int64_t v);
/* Microseconds since the epoch as FROM_UNIXTIME(s.micros). */
void sqlbuf_unix_us(struct sqlbuf *b, int64_t us);

/* Rows of a multi-row statement: sqlbuf_list starts a list (after the
 * caller's head, e.g. "INSERT ... VALUES "); sqlbuf_row opens a row,
 * with a comma before it unless it is the list's first, and the values
 * added until sqlbuf_row_end are comma-separated inside its parentheses.
 * sqlbuf_item: the separator alone, for a list of bare values. */
void sqlbuf_list(struct sqlbuf *b);
void sqlbuf_row(struct sqlbuf *b);
void sqlbuf_row_end(struct sqlbuf *b);
void sqlbuf_item(struct sqlbuf *b);

/* Back to len bytes (a length it had), its error cleared: undoes what
 * did not fit, to send what did first. */
void sqlbuf_undo(struct sqlbuf *b, size_t len);
/* Back to empty, keeping the memory (and the connection). */
void sqlbuf_reset(struct sqlbuf *b);
/* Give the memory back if it grew past keep bytes, then reset. */
void sqlbuf_trim(struct sqlbuf *b, size_t keep);
void sqlbuf_free(struct sqlbuf *b);
/* ST_OK, or the first error of a call since the last reset. */
int sqlbuf_err(const struct sqlbuf *b);

#endif
