/*
 * db.c - the MariaDB Connector/C boundary.  Nothing above this file reads
 * mysql_errno: errors become st_code values here, so the worker's retry
 * policy (deadlock -> retry, connection lost -> reconnect and keep the
 * message) is written once, in terms of our codes.
 *
 * Prepared statements are remembered with their SQL so that db_reconnect can
 * prepare them again on the new connection behind the same db_stmt pointer.
 */
#include "db.h"

#include <errno.h>
#include <mysql.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <mysqld_error.h>
#include <errmsg.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "addr.h"
#include "log.h"
#include "status.h"

/*
 * Two time-outs that must stay in this order.  The client's read time-out
 * (MYSQL_OPT_READ_TIMEOUT) bounds how long a thread hangs on a half-open
 * TCP connection after the server vanished; when it fires the connection is
 * treated as lost.  A statement waiting for a row lock is also silent on
 * the wire, so the server's lock wait time-out (innodb_lock_wait_timeout,
 * 50 s by default) must run out first: then a long wait ends as 1205, a
 * retry on the same connection, and never as a lost connection (a
 * reconnect, and for a COMMIT an unknown outcome).  20 s also stays well
 * inside two heartbeat intervals of the default INBOX_HEARTBEAT (30 s), the
 * longest a consuming thread may spend inside one statement.
 */
#define DB_READ_TIMEOUT_S 30
#define DB_LOCK_WAIT_TIMEOUT_S 20
_Static_assert(DB_LOCK_WAIT_TIMEOUT_S < DB_READ_TIMEOUT_S,
               "a lock wait must end before the client gives the connection up");
/*
 * A client that vanishes inside a transaction (its packets dropped, its
 * host gone) leaves the server a session it believes alive, holding the
 * transaction's row locks until a close gets through: after a long
 * blackhole, the kernel's next retransmission of the FIN, minutes on.
 * Meanwhile every transaction needing those rows waits its lock wait,
 * retries and waits again.  So our sessions ask the server to end a
 * transaction that wrote and was then left idle for DB_IDLE_TX_TIMEOUT_S
 * (MariaDB's idle_write_transaction_timeout): ours never idle after a
 * write (a batch's statements follow each other and commit; a lease or a
 * mark commits at once), so only a vanished client's is ended, before
 * anyone's lock wait runs out.  Not idle_transaction_timeout: a read
 * left open while a thread waits (the janitor between rounds) is ours and
 * holds no lock a writer waits for; ending it cost the thread its
 * connection (seen in the outbox suite).  A
 * server without the variable (MySQL) is told nothing, said once.
 */
#define DB_IDLE_TX_TIMEOUT_S 10
_Static_assert(DB_IDLE_TX_TIMEOUT_S < DB_LOCK_WAIT_TIMEOUT_S,
               "a vanished client's locks must be freed before a waiter gives up");
#define DB_STR2(x) #x
#define DB_STR(x) DB_STR2(x)

#define DB_MAX_COLS 24
#define DB_GROW_FIRST 4096
/* Our own number for a DBC_GROW value over its max, and for a request
 * that would not fit the server's max_allowed_packet (db_too_large): both
 * the fault of the data (mapped to ST_ERR_DB_DATA). */
#define DB_ERRNO_TOO_LONG 0xfffe
/* What a request may hold below the server's max_allowed_packet: the
 * packet carries the command byte too, and a margin keeps us clear of the
 * edge (the server answers an oversized request with 1153 and closes the
 * connection, and whether the client then reads 1153 or a lost connection
 * depends on how far it got writing: a race, see db_max_request). */
#define DB_PACKET_MARGIN 1024
/* What we assume before the server said (db_connect_one reads it); the
 * server's own minimum. */
#define DB_PACKET_MIN 1024

struct db_stmt {
	struct db *db;
	MYSQL_STMT *st;
	char *sql;
	struct db_stmt *next;
	bool has_result;
};

struct db {
	MYSQL *my;
	const struct cfg_db *conf;  /* the first node of the list */
	const struct cfg_db *node;  /* the node connected to (or last tried) */
	struct db_stmt *stmts;
	bool broken; /* a connection-lost error was seen: reconnect before use */
	uint64_t round_trips; /* requests sent since db_open (db_round_trips) */
	int failed_at;        /* db_multi_failed_at */
	/* The server's max_allowed_packet, read at each connect: a session
	 * sees the global value of when it connected. */
	size_t max_packet;
	unsigned last_errno;
	char last_error[256];
};

static int db_map_errno(unsigned e)
{
	switch (e) {
	case 0:
		return ST_OK;
	case ER_DUP_ENTRY:
		return ST_ERR_DB_DUPLICATE;
	case ER_LOCK_DEADLOCK:
		return ST_ERR_DB_DEADLOCK;
	case ER_LOCK_WAIT_TIMEOUT:
	case 3572: /* ER_LOCK_NOWAIT: MySQL 8.0's for FOR UPDATE NOWAIT (MariaDB says 1205) */
		return ST_ERR_DB_LOCK_TIMEOUT;
	case ER_SUBQUERY_NO_1_ROW:
		return ST_ERR_DB_CARDINALITY;
	case CR_SERVER_GONE_ERROR:
	case CR_SERVER_LOST:
	case CR_CONNECTION_ERROR:
	case CR_CONN_HOST_ERROR:
	case CR_SERVER_LOST_EXTENDED:
	case CR_COMMANDS_OUT_OF_SYNC: /* our state is unknown: start over */
	case ER_SERVER_SHUTDOWN:
	case ER_CONNECTION_KILLED:
	case 4031: /* ER_CLIENT_INTERACTION_TIMEOUT */
	/* The server is full for now: a passing fault like an outage. */
	case ER_CON_COUNT_ERROR:
	case ER_TOO_MANY_USER_CONNECTIONS:
	/* Galera: "WSREP has not yet prepared node for application use" (the
	 * node left the primary component or is still joining).  Nothing on
	 * this connection will work until it is back: treat it as lost, so
	 * the thread moves on to another node of the list. */
	case ER_UNKNOWN_COM_ERROR:
		return ST_ERR_DB_CONN;
	/* The server refused who we are or what we asked to open: the
	 * URL (user, password, database) or the account must change, and
	 * no retry will do it.  Seen at connect. */
	case ER_ACCESS_DENIED_ERROR:            /* 1045: user or password */
	case ER_DBACCESS_DENIED_ERROR:          /* 1044: no rights on the database */
	case ER_BAD_DB_ERROR:                   /* 1049: no such database */
	case ER_HOST_NOT_PRIVILEGED:            /* 1130: not from this host */
	case ER_HOST_IS_BLOCKED:                /* 1129: until FLUSH HOSTS */
	case ER_NOT_SUPPORTED_AUTH_MODE:
	case ER_ACCESS_DENIED_NO_PASSWORD_ERROR:
	case ER_MUST_CHANGE_PASSWORD_LOGIN:
	case ER_ACCOUNT_HAS_BEEN_LOCKED:
	case CR_AUTH_PLUGIN_CANNOT_LOAD:
		return ST_ERR_ACCESS;
	/* The value itself is wrong for its column: retrying cannot help,
	 * and it is the fault of whoever supplied the value. */
	case ER_DATA_TOO_LONG:
	case ER_TRUNCATED_WRONG_VALUE_FOR_FIELD:
	case ER_TRUNCATED_WRONG_VALUE:
	case ER_WARN_DATA_OUT_OF_RANGE:
	case WARN_DATA_TRUNCATED:
	case ER_BAD_NULL_ERROR:
	case ER_INVALID_CHARACTER_STRING:
	case ER_NET_PACKET_TOO_LARGE: /* a request over max_allowed_packet (db_max_request) */
	case CR_NET_PACKET_TOO_LARGE: /* the same refused by the client library */
	case ER_DIVISION_BY_ZERO:
	case DB_ERRNO_TOO_LONG:
		return ST_ERR_DB_DATA;
	default:
		return ST_ERR_DB;
	}
}

static int db_fail(struct db *d, unsigned e, const char *msg)
{
	int rc = db_map_errno(e);

	d->last_errno = e;
	snprintf(d->last_error, sizeof d->last_error, "%s", msg ? msg : "");
	/* The server closes the connection after 1153 too: the next use
	 * reconnects, and the error stays the data's (ST_ERR_DB_DATA). */
	if (rc == ST_ERR_DB_CONN || e == ER_NET_PACKET_TOO_LARGE)
		d->broken = true;
	return rc;
}

static int db_fail_my(struct db *d)
{
	return db_fail(d, mysql_errno(d->my), mysql_error(d->my));
}

/* A failure after the one being reported (rc, not ST_OK): it may end the
 * connection, but the first error's number and text stand (db_errmsg
 * tells why rc happened, not what followed). */
static int db_fail_after(struct db *d, int rc)
{
	if (db_map_errno(mysql_errno(d->my)) == ST_ERR_DB_CONN)
		d->broken = true;
	return rc;
}

static int db_fail_stmt(struct db_stmt *s)
{
	return db_fail(s->db, mysql_stmt_errno(s->st), mysql_stmt_error(s->st));
}

int db_global_init(void)
{
	return mysql_library_init(0, NULL, NULL) == 0 ? ST_OK : ST_ERR_DB;
}

void db_global_end(void)
{
	mysql_library_end();
}

void db_thread_init(void)
{
	/* Connector/C's mysql_thread_init cannot fail in practice; its result
	 * is documented as always zero. */
	(void)mysql_thread_init();
}

void db_thread_end(void)
{
	mysql_thread_end();
}

/*
 * Whether a CR_SSL_CONNECTION_ERROR at connect is the server's certificate
 * failing verification, which waiting will not fix, rather than a
 * handshake cut short.  Connector/C 3.3 gives no code of its own for it,
 * only "TLS/SSL error: " followed by OpenSSL's text for the chain's error
 * (X509_verify_cert_error_string: the same libssl, so the same text) or by
 * its own line for a host name or IP address the certificate does not name.
 */
static bool db_cert_refused(const char *msg)
{
	static const char prefix[] = "TLS/SSL error: ";
	const char *p = strstr(msg, prefix), *unknown = X509_verify_cert_error_string(-1);

	if (p == NULL)
		return false;
	p += sizeof prefix - 1;
	if (strstr(p, "Validation of SSL server certificate failed") != NULL)
		return true;
	/* X509_V_OK is 0; OpenSSL 3's codes run to about 95. */
	for (long e = 1; e < 256; e++) {
		const char *t = X509_verify_cert_error_string(e);

		if (strcmp(t, unknown) != 0 && strcmp(p, t) == 0)
			return true;
	}
	return false;
}

/* The server's max_allowed_packet into d->max_packet; nonzero (with the
 * connector's error set) when the query fails. */
static int db_read_max_packet(struct db *d)
{
	MYSQL_RES *res;
	MYSQL_ROW row;
	unsigned long long v = 0;
	char *end = NULL;

	if (mysql_query(d->my, "SELECT @@max_allowed_packet") != 0)
		return -1;
	res = mysql_store_result(d->my);
	if (res == NULL)
		return -1;
	row = mysql_fetch_row(res);
	if (row != NULL && row[0] != NULL) {
		v = strtoull(row[0], &end, 10);
		if (end == row[0] || *end != '\0')
			v = 0;
	}
	mysql_free_result(res);
	/* A value we cannot read is taken as the server's minimum: requests
	 * are then cut small, never sent too large. */
	d->max_packet = v >= DB_PACKET_MIN && v <= SIZE_MAX ? (size_t)v : DB_PACKET_MIN;
	return 0;
}

/*
 * The URL's TLS files, loaded as the connector will load them.  Connector/C
 * reports a file it cannot load as any other CR_SSL_CONNECTION_ERROR ("No
 * such file or directory (2)", "key values mismatch"), which reads like a
 * handshake cut short; loaded here first, a wrong path or a key that is not
 * the certificate's is named, and is ST_ERR_TLS_CERT: waiting will not fix
 * it.  ST_OK when every file loads (or OpenSSL cannot even make a context:
 * the connector then says why).
 */
static int db_tls_files(struct db *d, const struct cfg_db *c)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
	const char *what = NULL, *path = NULL;
	char reason[120] = "";

	if (ctx == NULL)
		return ST_OK;
	ERR_clear_error();
	if ((c->ssl_ca != NULL || c->ssl_capath != NULL) &&
	    SSL_CTX_load_verify_locations(ctx, c->ssl_ca, c->ssl_capath) != 1) {
		what = c->ssl_ca != NULL ? "cannot load ssl-ca" : "cannot load ssl-capath";
		path = c->ssl_ca != NULL ? c->ssl_ca : c->ssl_capath;
	} else if (c->ssl_cert != NULL && SSL_CTX_use_certificate_chain_file(ctx, c->ssl_cert) != 1) {
		what = "cannot load ssl-cert";
		path = c->ssl_cert;
	} else if (c->ssl_key != NULL && SSL_CTX_use_PrivateKey_file(ctx, c->ssl_key, SSL_FILETYPE_PEM) != 1) {
		what = "cannot load ssl-key";
		path = c->ssl_key;
	} else if (c->ssl_cert != NULL && SSL_CTX_check_private_key(ctx) != 1) {
		what = "ssl-key does not match ssl-cert";
		path = c->ssl_key;
	}
	if (what != NULL) {
		unsigned long e = ERR_peek_last_error();

		/* OpenSSL says "system lib" for a file it cannot open: the
		 * system's own reason is clearer. */
		if (path != NULL && access(path, R_OK) != 0)
			snprintf(reason, sizeof reason, "%s", strerror(errno));
		else if (e != 0)
			ERR_error_string_n(e, reason, sizeof reason);
		snprintf(d->last_error, sizeof d->last_error, "%s %s%s%s", what, path, reason[0] != '\0' ? ": " : "",
		         reason);
		d->last_errno = CR_SSL_CONNECTION_ERROR;
	}
	ERR_clear_error();
	SSL_CTX_free(ctx);
	return what != NULL ? ST_ERR_TLS_CERT : ST_OK;
}

/* The read and write time-outs bound the connector's own waits; a send
 * the kernel cannot deliver (a link dropped without a reset) is bounded
 * the same way by TCP_USER_TIMEOUT, and an idle connection is probed by
 * keepalive (issue 43).  Not for a Unix socket. */
static int db_bound_socket(struct db *d)
{
	int fd = (int)mysql_get_socket(d->my), domain = 0, on = 1, idle = DB_READ_TIMEOUT_S / 2, intvl = 1,
	    cnt = DB_READ_TIMEOUT_S / 2;
	unsigned user_ms = DB_READ_TIMEOUT_S * 1000u;
	socklen_t len = sizeof domain;

	if (fd < 0 || getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0)
		return db_fail(d, CR_UNKNOWN_ERROR, "cannot read the connection's socket");
	if (domain != AF_INET && domain != AF_INET6)
		return ST_OK;
	if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) != 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) != 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl) != 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt) != 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof user_ms) != 0)
		return db_fail(d, CR_UNKNOWN_ERROR, "cannot set keepalive and user time-out");
	return ST_OK;
}

static int db_connect_one(struct db *d)
{
	const struct cfg_db *c = d->node;
	my_bool off = 0;
	unsigned timeout = (unsigned)c->connect_timeout_s;
	/* Read/write time-outs bound how long a thread can hang on a
	 * half-open TCP connection after the server vanished. */
	unsigned rw_timeout = DB_READ_TIMEOUT_S;

	if (c->ssl && db_tls_files(d, c) != ST_OK)
		return ST_ERR_TLS_CERT;
	d->my = mysql_init(NULL);
	if (d->my == NULL)
		return db_fail(d, CR_OUT_OF_MEMORY, "mysql_init failed");
	if (mysql_options(d->my, MYSQL_OPT_RECONNECT, &off) != 0 ||
	    mysql_options(d->my, MYSQL_OPT_CONNECT_TIMEOUT, &timeout) != 0 ||
	    mysql_options(d->my, MYSQL_OPT_READ_TIMEOUT, &rw_timeout) != 0 ||
	    mysql_options(d->my, MYSQL_OPT_WRITE_TIMEOUT, &rw_timeout) != 0 ||
	    mysql_options(d->my, MYSQL_SET_CHARSET_NAME, "utf8mb4") != 0)
		goto fail;
	if (c->ssl) {
		/* ENFORCE: a server that offers no TLS is refused, never
		 * talked to in plain text.  VERIFY_SERVER_CERT checks the
		 * chain against ssl-ca/ssl-capath (else the system's store)
		 * and the host name against the certificate. */
		my_bool on = 1;
		my_bool verify = c->ssl_verify ? 1 : 0;
		if (mysql_options(d->my, MYSQL_OPT_SSL_ENFORCE, &on) != 0 ||
		    mysql_options(d->my, MYSQL_OPT_SSL_VERIFY_SERVER_CERT, &verify) != 0 ||
		    mysql_ssl_set(d->my, c->ssl_key, c->ssl_cert, c->ssl_ca, c->ssl_capath, NULL) != 0)
			goto fail;
	}
	if (mysql_real_connect(d->my, c->host, c->user, c->password, c->database,
	                       (unsigned)c->port, c->socket, CLIENT_FOUND_ROWS | CLIENT_MULTI_STATEMENTS) == NULL)
		goto fail;
	if (db_bound_socket(d) != ST_OK) {
		mysql_close(d->my);
		d->my = NULL;
		return ST_ERR_DB_CONN;
	}
	/* Autocommit off: the first statement opens the transaction, which
	 * saves one round trip per message over sending BEGIN. */
	if (mysql_autocommit(d->my, 0) != 0)
		goto fail;
	if (mysql_query(d->my, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED") != 0)
		goto fail;
	if (mysql_query(d->my, "SET SESSION innodb_lock_wait_timeout = " DB_STR(DB_LOCK_WAIT_TIMEOUT_S)) != 0)
		goto fail;
	if (mysql_query(d->my, "SET SESSION idle_write_transaction_timeout = " DB_STR(DB_IDLE_TX_TIMEOUT_S)) != 0) {
		static atomic_bool said;

		if (mysql_errno(d->my) != ER_UNKNOWN_SYSTEM_VARIABLE)
			goto fail;
		if (!atomic_exchange(&said, true))
			LOG(LOG_LEVEL_WARN, "the server has no idle_write_transaction_timeout: a client that vanishes inside a "
			    "transaction holds its row locks until the server notices", LOG_S("error", mysql_error(d->my)));
	}
	if (db_read_max_packet(d) != 0)
		goto fail;
	return ST_OK;
fail:;
	int rc = db_fail_my(d);
	/* Any other failure while connecting means "no usable connection". */
	if (rc != ST_ERR_DB_CONN && rc != ST_ERR_ACCESS && d->last_errno >= 2000 && d->last_errno < 3000)
		rc = ST_ERR_DB_CONN;
	if (d->last_errno == CR_SSL_CONNECTION_ERROR && c->ssl_verify && db_cert_refused(d->last_error))
		rc = ST_ERR_TLS_CERT;
	if (d->last_errno == CR_CONNECTION_ERROR || d->last_errno == CR_CONN_HOST_ERROR) {
		/* The connector connects without blocking and reports the
		 * errno of that ("(115)", EINPROGRESS), not the socket's own
		 * error: ask the socket once more, for the log line. */
		char why[64];

		addr_probe(c->host, c->port, c->socket, 1000, why, sizeof why);
		if (c->socket != NULL)
			snprintf(d->last_error, sizeof d->last_error, "cannot connect to socket %.150s: %s",
			         c->socket, why);
		else
			snprintf(d->last_error, sizeof d->last_error, "cannot connect to %.150s:%d: %s", c->host,
			         c->port, why);
	}
	mysql_close(d->my);
	d->my = NULL;
	return rc;
}

/*
 * Connect to a node of the list (conf->next: the other nodes of a
 * cluster), starting at `from` and trying each once in list order; d->node
 * is the node connected to.  A node that refuses or is unreachable is
 * logged and the next one tried; the caller backs off when none answers.
 */
static int db_connect(struct db *d, const struct cfg_db *from)
{
	const struct cfg_db *n = from;
	/* the node of the connection before (NULL: none yet, the first) */
	const struct cfg_db *had = d->node != NULL ? d->node : d->conf;
	const struct cfg_db *cert = NULL; /* the first node whose certificate we refused */
	char cert_error[sizeof d->last_error] = "";
	int rc = ST_ERR_DB_CONN;

	do {
		d->node = n;
		rc = db_connect_one(d);
		if (rc == ST_OK) {
			if (n != had)
				LOG(LOG_LEVEL_INFO, "database connected to another node of the cluster",
				    LOG_S("db", n->redacted));
			return ST_OK;
		}
		if (rc == ST_ERR_ACCESS)
			return rc; /* the cluster's nodes share their accounts */
		if (rc == ST_ERR_TLS_CERT && cert == NULL) {
			/* each node has its own certificate: try the others */
			cert = n;
			snprintf(cert_error, sizeof cert_error, "%s", d->last_error);
		}
		if (d->conf->next != NULL)
			LOG(LOG_LEVEL_WARN, "database node unavailable; trying the next", LOG_S("db", n->redacted),
			    LOG_I("errno", d->last_errno), LOG_S("error", d->last_error));
		n = n->next != NULL ? n->next : d->conf;
	} while (n != from);
	if (cert != NULL) {
		/* No node took us and one showed a certificate we refuse: that
		 * is the answer, and waiting will not change it. */
		d->node = cert;
		d->last_errno = CR_SSL_CONNECTION_ERROR;
		snprintf(d->last_error, sizeof d->last_error, "%s", cert_error);
		return ST_ERR_TLS_CERT;
	}
	return rc;
}

static int db_stmt_prepare_on(struct db_stmt *s)
{
	s->st = mysql_stmt_init(s->db->my);
	if (s->st == NULL)
		return db_fail_my(s->db);
	if (mysql_stmt_prepare(s->st, s->sql, (unsigned long)strlen(s->sql)) != 0) {
		int rc = db_fail_stmt(s);
		mysql_stmt_close(s->st);
		s->st = NULL;
		return rc;
	}
	s->has_result = false;
	return ST_OK;
}

static int db_open_at(struct db **out, const struct cfg_db *conf, int *node, char *why, size_t cap)
{
	struct db *d = calloc(1, sizeof *d);
	const struct cfg_db *from = conf;
	int rc, count = 0, i;

	*out = NULL;
	if (why != NULL && cap > 0)
		why[0] = '\0';
	if (d == NULL)
		return ST_ERR_NOMEM;
	d->failed_at = -1;
	d->conf = conf;
	for (const struct cfg_db *n = conf; n != NULL; n = n->next)
		count++;
	i = ((*node % count) + count) % count;
	for (int j = 0; j < i; j++)
		from = from->next;
	rc = db_connect(d, from);
	if (rc != ST_OK) {
		if (why != NULL && cap > 0)
			snprintf(why, cap, "%u %s", d->last_errno, d->last_error);
		free(d);
		return rc;
	}
	i = 0;
	for (const struct cfg_db *n = conf; n != d->node; n = n->next)
		i++;
	*node = i;
	*out = d;
	return ST_OK;
}

int db_open(struct db **out, const struct cfg_db *conf)
{
	int node = 0;

	return db_open_at(out, conf, &node, NULL, 0);
}

int db_open_why(struct db **out, const struct cfg_db *conf, char *why, size_t cap)
{
	int node = 0;

	return db_open_at(out, conf, &node, why, cap);
}

int db_open_from(struct db **out, const struct cfg_db *conf, int *node)
{
	return db_open_at(out, conf, node, NULL, 0);
}

int db_open_from_why(struct db **out, const struct cfg_db *conf, int *node, char *why, size_t cap)
{
	return db_open_at(out, conf, node, why, cap);
}

static void db_disconnect(struct db *d)
{
	for (struct db_stmt *s = d->stmts; s != NULL; s = s->next) {
		if (s->st != NULL)
			mysql_stmt_close(s->st);
		s->st = NULL;
		s->has_result = false;
	}
	if (d->my != NULL)
		mysql_close(d->my);
	d->my = NULL;
}

void db_close(struct db **dp)
{
	struct db *d;

	if (dp == NULL || *dp == NULL)
		return;
	d = *dp;
	db_disconnect(d);
	while (d->stmts != NULL) {
		struct db_stmt *s = d->stmts;
		d->stmts = s->next;
		free(s->sql);
		free(s);
	}
	free(d);
	*dp = NULL;
}

bool db_connected(const struct db *d)
{
	return d->my != NULL && !d->broken;
}

int db_reconnect(struct db *d)
{
	int rc;

	db_disconnect(d);
	d->broken = false;
	/* A lost connection moves on to the next node of a cluster (the one
	 * it had is the last tried): the node may be down, or no longer
	 * ready (1047), and waiting for it would stall the thread. */
	rc = db_connect(d, d->node != NULL && d->node->next != NULL ? d->node->next : d->conf);
	if (rc != ST_OK)
		return rc;
	for (struct db_stmt *s = d->stmts; s != NULL; s = s->next) {
		rc = db_stmt_prepare_on(s);
		if (rc != ST_OK) {
			db_disconnect(d);
			return rc;
		}
	}
	return ST_OK;
}

int db_exec(struct db *d, const char *sql)
{
	MYSQL_RES *res;

	if (d->my == NULL)
		return db_fail(d, CR_SERVER_GONE_ERROR, "not connected");
	d->round_trips++;
	if (mysql_query(d->my, sql) != 0)
		return db_fail_my(d);
	res = mysql_store_result(d->my);
	if (res != NULL)
		mysql_free_result(res);
	else if (mysql_errno(d->my) != 0)
		return db_fail_my(d);
	return ST_OK;
}

int db_exec_script(struct db *d, const char *sql, size_t len)
{
	return db_multi(d, sql, len, NULL, NULL);
}

int db_commit(struct db *d)
{
	if (d->my == NULL)
		return db_fail(d, CR_SERVER_GONE_ERROR, "not connected");
	d->round_trips++;
	if (mysql_commit(d->my) != 0)
		return db_fail_my(d);
	return ST_OK;
}

void db_rollback(struct db *d)
{
	if (d->my == NULL)
		return;
	d->round_trips++;
	if (mysql_rollback(d->my) != 0) {
		/* Logged, and not kept as the last error: a rollback follows
		 * the failure the caller is about to report (db_errmsg), and
		 * the server's "Lost connection" after, say, an oversized
		 * request must not replace why the transaction failed. */
		LOG(LOG_LEVEL_WARN, "rollback failed, dropping the connection",
		    LOG_I("errno", mysql_errno(d->my)), LOG_S("error", mysql_error(d->my)));
		/* A connection whose transaction state is unknown is useless:
		 * the next use reconnects. */
		d->broken = true;
		db_disconnect(d);
	}
}

static int db_prepare_as(struct db *d, struct db_stmt **out, const char *sql, bool quiet)
{
	struct db_stmt *s = calloc(1, sizeof *s);
	int rc;

	*out = NULL;
	if (s == NULL)
		return ST_ERR_NOMEM;
	s->db = d;
	s->sql = strdup(sql);
	if (s->sql == NULL) {
		free(s);
		return ST_ERR_NOMEM;
	}
	if (d->my != NULL) {
		rc = db_stmt_prepare_on(s);
		if (rc != ST_OK) {
			if (!quiet)
				LOG(LOG_LEVEL_ERROR, "prepare failed", LOG_S("error", d->last_error), LOG_S("sql", sql));
			free(s->sql);
			free(s);
			return rc;
		}
	}
	s->next = d->stmts;
	d->stmts = s;
	*out = s;
	return ST_OK;
}

int db_prepare(struct db *d, struct db_stmt **out, const char *sql)
{
	return db_prepare_as(d, out, sql, false);
}

int db_prepare_theirs(struct db *d, struct db_stmt **out, const char *sql)
{
	return db_prepare_as(d, out, sql, true);
}

static void db_bind_params(MYSQL_BIND *b, const struct db_param *p, int n)
{
	memset(b, 0, sizeof(MYSQL_BIND) * (size_t)n);
	for (int i = 0; i < n; i++) {
		switch (p[i].type) {
		case DB_NULL:
			b[i].buffer_type = MYSQL_TYPE_NULL;
			break;
		case DB_I64:
			b[i].buffer_type = MYSQL_TYPE_LONGLONG;
			b[i].buffer = (void *)&p[i].i64;
			break;
		case DB_DOUBLE:
			b[i].buffer_type = MYSQL_TYPE_DOUBLE;
			b[i].buffer = (void *)&p[i].dbl;
			break;
		case DB_STR:
			b[i].buffer_type = MYSQL_TYPE_STRING;
			b[i].buffer = (void *)p[i].ptr;
			b[i].buffer_length = (unsigned long)p[i].len;
			break;
		case DB_BLOB:
			b[i].buffer_type = MYSQL_TYPE_BLOB;
			b[i].buffer = (void *)p[i].ptr;
			b[i].buffer_length = (unsigned long)p[i].len;
			break;
		}
	}
}

static int db_stmt_run(struct db_stmt *s, const struct db_param *p, int n)
{
	MYSQL_BIND b[DB_MAX_PARAMS];

	if (s->db->my == NULL || s->st == NULL)
		return db_fail(s->db, CR_SERVER_GONE_ERROR, "not connected");
	if (n > DB_MAX_PARAMS || (unsigned long)n != mysql_stmt_param_count(s->st))
		return db_fail(s->db, 0xffff, "parameter count mismatch");
	if (s->has_result)
		db_stmt_done(s);
	if (n > 0) {
		db_bind_params(b, p, n);
		if (mysql_stmt_bind_param(s->st, b) != 0)
			return db_fail_stmt(s);
	}
	s->db->round_trips++;
	if (mysql_stmt_execute(s->st) != 0)
		return db_fail_stmt(s);
	return ST_OK;
}

int db_stmt_exec(struct db_stmt *s, const struct db_param *p, int n, uint64_t *affected)
{
	int rc = db_stmt_run(s, p, n);

	if (rc != ST_OK)
		return rc;
	if (affected != NULL)
		*affected = (uint64_t)mysql_stmt_affected_rows(s->st);
	return ST_OK;
}

int db_stmt_exec_bulk(struct db_stmt *s, const struct db_param *p, int ncols, int nrows, uint64_t *affected)
{
	MYSQL_BIND b[DB_MAX_PARAMS];
	const void **ptrs = NULL;
	unsigned long *lens = NULL;
	long long *vals = NULL;
	char *ind = NULL;
	unsigned int size = (unsigned int)nrows;
	int rc = ST_OK;

	if (s->db->my == NULL || s->st == NULL)
		return db_fail(s->db, CR_SERVER_GONE_ERROR, "not connected");
	if (ncols <= 0 || nrows <= 0 || ncols > DB_MAX_PARAMS || (unsigned long)ncols != mysql_stmt_param_count(s->st))
		return db_fail(s->db, 0xffff, "parameter count mismatch");
	if (s->has_result)
		db_stmt_done(s);
	/* Column-wise: per column an array of values (integers) or of
	 * pointers and lengths (strings). */
	ptrs = calloc((size_t)ncols * (size_t)nrows, sizeof *ptrs);
	lens = calloc((size_t)ncols * (size_t)nrows, sizeof *lens);
	vals = calloc((size_t)ncols * (size_t)nrows, sizeof *vals);
	if (ptrs == NULL || lens == NULL || vals == NULL) {
		rc = db_fail(s->db, CR_OUT_OF_MEMORY, "out of memory");
		goto cleanup;
	}
	memset(b, 0, sizeof(MYSQL_BIND) * (size_t)ncols);
	for (int c = 0; c < ncols; c++) {
		size_t base = (size_t)c * (size_t)nrows;
		enum db_type type = DB_NULL;
		bool nulls = false;

		for (int r = 0; r < nrows; r++) {
			const struct db_param *v = &p[(size_t)r * (size_t)ncols + (size_t)c];
			ptrs[base + (size_t)r] = v->ptr;
			lens[base + (size_t)r] = (unsigned long)v->len;
			vals[base + (size_t)r] = v->i64;
			if (v->type == DB_NULL)
				nulls = true;
			else if (type == DB_NULL)
				type = v->type; /* the first row that has a value types the column */
		}
		if (nulls) {
			/* A NULL row: an indicator per row (STMT_INDICATOR_NULL). */
			if (ind == NULL)
				ind = calloc((size_t)ncols * (size_t)nrows, 1);
			if (ind == NULL) {
				rc = db_fail(s->db, CR_OUT_OF_MEMORY, "out of memory");
				goto cleanup;
			}
			for (int r = 0; r < nrows; r++)
				ind[base + (size_t)r] = p[(size_t)r * (size_t)ncols + (size_t)c].type == DB_NULL
				                            ? STMT_INDICATOR_NULL
				                            : STMT_INDICATOR_NONE;
			b[c].u.indicator = &ind[base];
		}
		if (type == DB_I64) {
			b[c].buffer_type = MYSQL_TYPE_LONGLONG;
			b[c].buffer = &vals[base];
		} else {
			b[c].buffer_type = type == DB_BLOB ? MYSQL_TYPE_BLOB : MYSQL_TYPE_STRING;
			b[c].buffer = (void *)&ptrs[base];
			b[c].length = &lens[base];
		}
	}
	if (mysql_stmt_attr_set(s->st, STMT_ATTR_ARRAY_SIZE, &size) != 0 || mysql_stmt_bind_param(s->st, b) != 0 ||
	    (s->db->round_trips++, mysql_stmt_execute(s->st) != 0)) {
		rc = db_fail_stmt(s);
	} else if (affected != NULL) {
		*affected = (uint64_t)mysql_stmt_affected_rows(s->st);
	}
	size = 0; /* back to single executions for the next caller */
	(void)mysql_stmt_attr_set(s->st, STMT_ATTR_ARRAY_SIZE, &size);
cleanup:
	free(ptrs);
	free(lens);
	free(vals);
	free(ind);
	return rc;
}

int db_stmt_query(struct db_stmt *s, const struct db_param *p, int n)
{
	int rc = db_stmt_run(s, p, n);

	if (rc != ST_OK)
		return rc;
	s->has_result = true;
	return ST_OK;
}

/* A fetch reported truncation: grow the DBC_GROW columns that did not fit
 * and read them again with mysql_stmt_fetch_column (no round trip: the row
 * is already here).  Any other column cut short means the schema and the
 * code disagree. */
static int db_fetch_grow(struct db_stmt *s, MYSQL_BIND *b, const my_bool *errs, struct db_col *cols, int ncols)
{
	for (int i = 0; i < ncols; i++) {
		struct db_col *c = &cols[i];
		char *nb;

		if (!errs[i])
			continue;
		if (c->grow == NULL)
			return db_fail(s->db, 0xffff, "column value longer than its buffer");
		if (c->len > c->max) {
			char msg[120];
			snprintf(msg, sizeof msg, "stored value of %lu bytes is over the limit of %zu", c->len, c->max);
			return db_fail(s->db, DB_ERRNO_TOO_LONG, msg);
		}
		nb = realloc(*c->grow, (size_t)c->len + 1);
		if (nb == NULL)
			return db_fail(s->db, CR_OUT_OF_MEMORY, "out of memory");
		*c->grow = nb;
		*c->grow_cap = (size_t)c->len + 1;
		c->buf = nb;
		c->cap = *c->grow_cap;
		b[i].buffer = nb;
		b[i].buffer_length = (unsigned long)c->len;
		if (mysql_stmt_fetch_column(s->st, &b[i], (unsigned)i, 0) != 0)
			return db_fail_stmt(s);
	}
	return ST_OK;
}

/* Bind column c of a fetch to its caller's storage (a growing buffer
 * gets its first allocation here).  ST_OK or out of memory. */
static int db_bind_col(struct db_stmt *s, struct db_col *c, MYSQL_BIND *b)
{
	b->length = &c->len;
	switch (c->type) {
	case DB_I64:
	case DB_NULL:
		b->buffer_type = MYSQL_TYPE_LONGLONG;
		b->buffer = &c->i64;
		break;
	case DB_DOUBLE:
		b->buffer_type = MYSQL_TYPE_DOUBLE;
		b->buffer = &c->dbl;
		break;
	case DB_STR:
	case DB_BLOB:
		if (c->grow != NULL && *c->grow == NULL) {
			*c->grow = malloc(DB_GROW_FIRST);
			if (*c->grow == NULL)
				return db_fail(s->db, CR_OUT_OF_MEMORY, "out of memory");
			*c->grow_cap = DB_GROW_FIRST;
		}
		if (c->grow != NULL) {
			c->buf = *c->grow;
			c->cap = *c->grow_cap;
		}
		b->buffer_type = c->type == DB_STR ? MYSQL_TYPE_STRING : MYSQL_TYPE_BLOB;
		b->buffer = c->buf;
		b->buffer_length = c->cap > 0 ? (unsigned long)c->cap - 1 : 0;
		break;
	}
	return ST_OK;
}

/* A fetched row into the caller's columns: NULLs, the limit of a grown
 * buffer, text NUL-terminated.  1 (a row) or an error. */
static int db_fetch_finish(struct db_stmt *s, struct db_col *cols, int ncols, const my_bool *nulls)
{
	for (int i = 0; i < ncols; i++) {
		struct db_col *c = &cols[i];
		c->is_null = nulls[i] != 0;
		if (c->grow != NULL && !c->is_null && c->len > c->max) {
			/* It fitted a buffer grown for an earlier row. */
			char msg[120];
			snprintf(msg, sizeof msg, "stored value of %lu bytes is over the limit of %zu", c->len, c->max);
			db_stmt_done(s);
			return db_fail(s->db, DB_ERRNO_TOO_LONG, msg);
		}
		if ((c->type == DB_STR || c->type == DB_BLOB) && c->cap > 0)
			((char *)c->buf)[c->is_null ? 0 : c->len] = '\0';
	}
	return 1;
}

int db_stmt_fetch(struct db_stmt *s, struct db_col *cols, int ncols)
{
	MYSQL_BIND b[DB_MAX_COLS];
	/* Zeroed: Connector/C writes a column's error flag only when it
	 * truncates that column, so a flag left from the stack read as
	 * "truncated" and failed the fetch of a column that fitted (seen
	 * as "column value longer than its buffer" once the caller's stack
	 * changed, an integer column taken for a truncated one, a relay
	 * round failing after its publishes). */
	my_bool nulls[DB_MAX_COLS] = { 0 };
	my_bool errs[DB_MAX_COLS] = { 0 };
	int r;

	if (!s->has_result || ncols > DB_MAX_COLS)
		return db_fail(s->db, 0xffff, "fetch without a result");
	/* The connector binds as many columns as the result has, from
	 * whatever the array holds: fewer would bind zeroed entries, more
	 * would leave the caller's extra ones looking like values. */
	if (ncols < 0 || (unsigned)ncols != mysql_stmt_field_count(s->st))
		return db_fail(s->db, 0xffff, "column count mismatch");
	memset(b, 0, sizeof b);
	for (int i = 0; i < ncols; i++) {
		b[i].is_null = &nulls[i];
		b[i].error = &errs[i];
		r = db_bind_col(s, &cols[i], &b[i]);
		if (r != ST_OK)
			return r;
	}
	if (mysql_stmt_bind_result(s->st, b) != 0)
		return db_fail_stmt(s);
	r = mysql_stmt_fetch(s->st);
	if (r == MYSQL_NO_DATA) {
		db_stmt_done(s);
		return 0;
	}
	if (r == 1)
		return db_fail_stmt(s);
	if (r == MYSQL_DATA_TRUNCATED) {
		r = db_fetch_grow(s, b, errs, cols, ncols);
		if (r != ST_OK) {
			db_stmt_done(s);
			return r;
		}
	}
	return db_fetch_finish(s, cols, ncols, nulls);
}

void db_stmt_done(struct db_stmt *s)
{
	if (s->st != NULL && s->has_result) {
		/* Drains unread rows locally (no round trip, unlike
		 * mysql_stmt_reset); a failure surfaces on the next statement. */
		(void)mysql_stmt_free_result(s->st);
		/* A CALL ends with a status result of its own; it is already on
		 * the wire, so reading it past costs no round trip. */
		while (mysql_stmt_more_results(s->st)) {
			if (mysql_stmt_next_result(s->st) != 0)
				break;
			(void)mysql_stmt_free_result(s->st);
		}
	}
	s->has_result = false;
}

int db_stmt_query_row(struct db_stmt *s, const struct db_param *p, int n, struct db_col *cols, int ncols)
{
	int rc = db_stmt_query(s, p, n);

	if (rc != ST_OK)
		return rc;
	rc = db_stmt_fetch(s, cols, ncols);
	if (rc == 1)
		db_stmt_done(s);
	return rc;
}

uint64_t db_stmt_insert_id(struct db_stmt *s)
{
	return s->st != NULL ? (uint64_t)mysql_stmt_insert_id(s->st) : 0;
}

const char *db_errmsg(const struct db *d)
{
	return d->last_error;
}

unsigned db_errno(const struct db *d)
{
	return d->last_errno;
}

/* The statements of one request run in order and the server stops at the
 * first that fails, so a failed request leaves at most a prefix of it done
 * inside the open transaction: the caller rolls back, as after any failed
 * statement.  Every result is read to its end, also after an error of the
 * caller's row function, so the connection is ready for the next request. */
int db_multi(struct db *d, const char *sql, size_t len, db_row_fn fn, void *arg)
{
	int rc = ST_OK, status, stmt = 0;

	d->failed_at = -1;
	if (d->my == NULL)
		return db_fail(d, CR_SERVER_GONE_ERROR, "not connected");
	d->round_trips++;
	if (mysql_real_query(d->my, sql, (unsigned long)len) != 0) {
		d->failed_at = 0;
		return db_fail_my(d);
	}
	do {
		MYSQL_RES *res = mysql_store_result(d->my);

		if (res != NULL) {
			unsigned ncols = mysql_num_fields(res);
			MYSQL_ROW row;

			while (rc == ST_OK && fn != NULL && (row = mysql_fetch_row(res)) != NULL) {
				unsigned long *lens = mysql_fetch_lengths(res);

				if (lens == NULL)
					rc = db_fail(d, CR_UNKNOWN_ERROR, "no lengths for a fetched row");
				else
					rc = fn(arg, stmt, (const char *const *)row, lens, (int)ncols);
			}
			mysql_free_result(res);
		} else if (mysql_field_count(d->my) != 0) {
			/* A result set that could not be read: the statement
			 * failed while it sent its rows (a lock it could not
			 * take), the client ran out of memory, or the connection
			 * dropped while reading. */
			d->failed_at = rc == ST_OK ? stmt : -1;
			return rc == ST_OK ? db_fail_my(d) : db_fail_after(d, rc);
		}
		stmt++;
		status = mysql_next_result(d->my);
		if (status > 0) {
			d->failed_at = rc == ST_OK ? stmt : -1;
			return rc == ST_OK ? db_fail_my(d) : db_fail_after(d, rc);
		}
	} while (status == 0);
	return rc;
}

int db_multi_failed_at(const struct db *d)
{
	return d->failed_at;
}

size_t db_escape(struct db *d, char *to, const char *from, size_t len)
{
	unsigned long n = mysql_real_escape_string(d->my, to, from, (unsigned long)len);

	return n == (unsigned long)-1 ? SIZE_MAX : (size_t)n;
}

uint64_t db_round_trips(const struct db *d)
{
	return d->round_trips;
}

size_t db_max_request(const struct db *d)
{
	size_t p = d->max_packet > 0 ? d->max_packet : DB_PACKET_MIN;

	return p > 2 * DB_PACKET_MARGIN ? p - DB_PACKET_MARGIN : p / 2;
}

size_t db_max_packet(const struct db *d)
{
	return d->max_packet;
}

int db_too_large(struct db *d, size_t need)
{
	char msg[200];

	snprintf(msg, sizeof msg, "a request of at least %zu bytes would exceed the server's max_allowed_packet (%zu)",
	         need, d->max_packet);
	return db_fail(d, DB_ERRNO_TOO_LONG, msg);
}

int db_refuse_value(struct db *d, const char *why)
{
	return db_fail(d, DB_ERRNO_TOO_LONG, why);
}
