/*
 * db.h - one MariaDB/MySQL connection and its prepared statements.
 *
 * A struct db belongs to one thread.  It runs with autocommit off (a
 * transaction starts with the first statement, which saves the BEGIN round
 * trip), READ COMMITTED (no gap locks between unrelated orders) and
 * MYSQL_OPT_RECONNECT off: the connector refuses to reconnect inside a
 * transaction and silently drops prepared statements when it does, so
 * db_reconnect does it explicitly and re-prepares every statement, keeping
 * the caller's struct db_stmt pointers valid.
 *
 * Errors are translated here and nowhere else: 1062 -> ST_ERR_DB_DUPLICATE,
 * 1213 -> ST_ERR_DB_DEADLOCK, 1205 -> ST_ERR_DB_LOCK_TIMEOUT, 1242 ->
 * ST_ERR_DB_CARDINALITY, 2002/2003/2006/
 * 2013/... -> ST_ERR_DB_CONN, 1044/1045/1049/... -> ST_ERR_ACCESS, 2026 for
 * a server certificate that fails verification -> ST_ERR_TLS_CERT, anything
 * else -> ST_ERR_DB.  db_errmsg gives
 * the server's text for logs.
 *
 * Ownership: db_open returns a handle freed by db_close (NULL-safe, clears
 * the pointer).  Statements belong to their db and die with it.
 * mysql_library_init must have run (db_global_init) before any thread opens
 * a db; each thread that uses a db calls db_thread_init/db_thread_end.
 */
#ifndef INBOX_DB_H
#define INBOX_DB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "array.h"
#include "cfg.h"

struct db;
struct db_stmt;

enum db_type { DB_NULL = 0, DB_I64, DB_STR, DB_BLOB, DB_DOUBLE };

/* The most parameters a statement run through db_stmt_exec/_query binds
 * (its MYSQL_BIND array is on the stack); a caller with a fixed list
 * checks its size against it at compile time. */
#define DB_MAX_PARAMS 64

/* An input parameter.  str/blob are borrowed for the call. */
struct db_param {
	enum db_type type;
	const void *ptr;
	size_t len;
	int64_t i64;
	double dbl;
};

#define DBP_NULL() ((struct db_param){ .type = DB_NULL })
#define DBP_I64(v) ((struct db_param){ .type = DB_I64, .i64 = (int64_t)(v) })
#define DBP_STR(s) ((struct db_param){ .type = DB_STR, .ptr = (s), .len = strlen(s) })
#define DBP_STRN(s, n) ((struct db_param){ .type = DB_STR, .ptr = (s), .len = (n) })
#define DBP_BLOB(p, n) ((struct db_param){ .type = DB_BLOB, .ptr = (p), .len = (n) })
#define DBP_DBL(v) ((struct db_param){ .type = DB_DOUBLE, .dbl = (v) })

/* An output column.  For DB_STR/DB_BLOB the caller gives buf/cap; the value
 * is NUL-terminated when it fits (cap includes the NUL) and len is the full
 * length.  A value longer than cap-1 is an error (ST_ERR_DB), never silently
 * cut: every column we read has a bounded width in the schema. */
struct db_col {
	enum db_type type;
	void *buf;
	size_t cap;
	unsigned long len;
	int64_t i64;
	double dbl;
	bool is_null;
	/* DBC_GROW: a heap buffer owned by the caller that db_stmt_fetch
	 * grows (realloc) to fit the value, up to max bytes. */
	char **grow;
	size_t *grow_cap;
	size_t max;
};

#define DBC_I64() ((struct db_col){ .type = DB_I64 })
#define DBC_STR(b, n) ((struct db_col){ .type = DB_STR, .buf = (b), .cap = (n) })
#define DBC_BLOB(b, n) ((struct db_col){ .type = DB_BLOB, .buf = (b), .cap = (n) })
#define DBC_DBL() ((struct db_col){ .type = DB_DOUBLE })
/* A value whose width the data, not the schema, bounds (a stored body
 * written under a larger INBOX_MAX_BODY than today's): *pbuf (malloc'd or
 * NULL, capacity *pcap, owned by the caller, freed with free) grows to fit
 * up to max bytes plus a NUL; a longer value is ST_ERR_DB_TOO_LONG. */
#define DBC_GROW(pbuf, pcap, maxlen) \
	((struct db_col){ .type = DB_BLOB, .grow = (pbuf), .grow_cap = (pcap), .max = (maxlen) })

int db_global_init(void);
void db_global_end(void);
void db_thread_init(void);
void db_thread_end(void);

/* Connect.  ST_ERR_DB_CONN when the server is unreachable or full for
 * now (a passing fault: retry); ST_ERR_ACCESS when it refused the account
 * or the database (1044, 1045, 1049, ...: a retry cannot help);
 * ST_ERR_TLS_CERT when its certificate failed verification (chain, or the
 * URL's host not among its names or IP addresses; a cluster's other nodes
 * are tried first).  Logs
 * nothing: the _why forms put the server's number and message, or the
 * socket's reason ("connection refused", "timed out"), in why for the
 * caller's one line.  conf may list a cluster's nodes (conf->next): each
 * is tried once, in list order; the _from forms start at node *node (0 =
 * the first; wraps around) and leave in *node the index of the node
 * connected to, so a caller whose connection was lost moves on. */
int db_open(struct db **out, const struct cfg_db *conf);
int db_open_why(struct db **out, const struct cfg_db *conf, char *why, size_t cap);
int db_open_from(struct db **out, const struct cfg_db *conf, int *node);
int db_open_from_why(struct db **out, const struct cfg_db *conf, int *node, char *why, size_t cap);
void db_close(struct db **d);

/* Drop the connection and connect again, re-preparing every statement. */
int db_reconnect(struct db *d);
bool db_connected(const struct db *d);

/* Run one statement without parameters, discarding any result. */
int db_exec(struct db *d, const char *sql);
int db_commit(struct db *d);
/* Roll back; a failure is logged and ends the connection (the next use
 * reconnects), so callers need no error path of their own.  It leaves
 * db_errmsg/db_errno as they were: the first error stands. */
void db_rollback(struct db *d);

/* Prepare sql on d.  The statement is owned by d. */
int db_prepare(struct db *d, struct db_stmt **out, const char *sql);
/* db_prepare for a statement someone else wrote (a lifecycle's own): a
 * refusal is logged by nobody here, the caller says it with its origin. */
int db_prepare_theirs(struct db *d, struct db_stmt **out, const char *sql);

/*
 * Every call below that takes a parameter or column count checks it
 * against the statement's (`?` markers, result columns): a count that
 * differs is ST_ERR_DB ("parameter count mismatch", "column count
 * mismatch") before anything is bound.  Callers pass ARRAY_LEN (array.h)
 * of the array they built, never a number written beside it.
 */

/* Execute with n parameters; *affected (may be NULL) gets the row count. */
int db_stmt_exec(struct db_stmt *s, const struct db_param *p, int n, uint64_t *affected);
/* Execute once over nrows rows of ncols parameters (p is row-major:
 * row r is p[r * ncols .. r * ncols + ncols - 1]) in one round trip:
 * MariaDB's array binding (STMT_ATTR_ARRAY_SIZE), a server-side feature
 * MySQL does not have.  DB_STR, DB_BLOB and DB_I64 parameters, and
 * DB_NULL in any row; the first row with a value types its column.  Used by
 * the benchmark's ceilings and by the lifecycle's own statements
 * (effects.h). */
int db_stmt_exec_bulk(struct db_stmt *s, const struct db_param *p, int ncols, int nrows, uint64_t *affected);
/* Execute a query; then call db_stmt_fetch until it returns 0. */
int db_stmt_query(struct db_stmt *s, const struct db_param *p, int n);
/* 1 = a row is in cols, 0 = no more rows, < 0 = error. */
int db_stmt_fetch(struct db_stmt *s, struct db_col *cols, int ncols);
/* Release a query's remaining rows (needed before the next statement when
 * the caller stops fetching early). */
void db_stmt_done(struct db_stmt *s);
/* A query read for its first row only (a lookup by key, a COUNT, a
 * GET_LOCK): db_stmt_query, one db_stmt_fetch, the rest released.
 * 1 = the row is in cols, 0 = no row, < 0 = error. */
int db_stmt_query_row(struct db_stmt *s, const struct db_param *p, int n, struct db_col *cols, int ncols);
uint64_t db_stmt_insert_id(struct db_stmt *s);

/* The last error's server text and number, for logs. */
const char *db_errmsg(const struct db *d);
unsigned db_errno(const struct db *d);

/* Run a script of several statements (a migration file), discarding
 * results; stops at the first error. */
int db_exec_script(struct db *d, const char *sql, size_t len);

/* A row of a text result: vals[i] is NUL-terminated text of lens[i] bytes,
 * or NULL for SQL NULL; borrowed for the call.  stmt: the 0-based index
 * of the statement in the request that produced it.  A value other than
 * ST_OK stops the calls (the rest of the results is still read) and is
 * returned by db_multi. */
typedef int (*db_row_fn)(void *arg, int stmt, const char *const *vals, const unsigned long *lens, int ncols);

/* Several statements of text SQL in one round trip (the connection allows
 * multi-statements; only values escaped with db_escape, or our own
 * numbers, may be spliced into sql).  Each row of each result goes to fn
 * (may be NULL: results discarded).  Stops at the first failing statement
 * and returns its error; the statements before it stay done inside the
 * open transaction. */
int db_multi(struct db *d, const char *sql, size_t len, db_row_fn fn, void *arg);

/* The 0-based index of the statement whose error ended the last db_multi
 * (also one that failed while it sent its rows); -1 when it ran to the
 * end, or failed without a statement's error (not connected, a row
 * function's verdict). */
int db_multi_failed_at(const struct db *d);

/* Escape len bytes of from for a quoted string literal on this connection
 * (its character set, and NO_BACKSLASH_ESCAPES if the server runs with
 * it): to must hold 2 * len + 1 bytes.  Returns the escaped length, or
 * SIZE_MAX when the text cannot be escaped for the connection. */
size_t db_escape(struct db *d, char *to, const char *from, size_t len);

/* Requests sent to the server on this handle since db_open (statements,
 * multi-statement requests, COMMITs and ROLLBACKs): what the round-trip
 * budget of a batch is measured by. */
uint64_t db_round_trips(const struct db *d);

/*
 * The size limit of one request.  The server refuses a request larger than
 * its max_allowed_packet (1153) and closes the connection as it does, so
 * the client sees either 1153 or a lost connection (2006/2013) depending on
 * how much it had written: a race that once made a batch look like an
 * outage, re-sent for ever.  So a request is sized before it is sent.
 * db_max_packet: the server's max_allowed_packet as read at connect (each
 * connection reads it: a session keeps the global value of when it
 * connected).  db_max_request: the most bytes of SQL text one request may
 * hold, a margin below it; what sqlbuf grows to at most (sqlbuf.h).
 */
size_t db_max_packet(const struct db *d);
size_t db_max_request(const struct db *d);
/* Record "a request of at least need bytes would exceed the server's
 * max_allowed_packet" as the last error; returns ST_ERR_DB_DATA (the size
 * comes from the messages' values, and a retry cannot change it). */
int db_too_large(struct db *d, size_t need);
/* Record why (one line) as the last error of a value refused before it
 * reached the server; returns ST_ERR_DB_DATA. */
int db_refuse_value(struct db *d, const char *why);

#endif
