/*
 * mq.c - the rabbitmq-c boundary.  Every librabbitmq result is checked here
 * and turned into an st_code; the reply of the last failure is kept as a
 * human line for logs.  After any failure other than a time-out the
 * connection is considered broken: callers close it and open a new one, which
 * is simpler and safer than repairing a half-closed channel.
 *
 * This file holds the connection (open, TLS, close), the topology and the
 * consuming side; publishing with confirms is pub.c, properties <-> JSON
 * props.c.  struct mq itself is in mq_private.h, shared with pub.c.
 */
#include "mq.h"

#include <amqp.h>
#include <amqp_ssl_socket.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <amqp_tcp_socket.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

#include "addr.h"
#include "fault.h"
#include "log.h"
#include "mq_private.h"
#include "aggregate.h"
#include "props.h"
#include "status.h"

amqp_bytes_t mq_b(const char *s)
{
	return s != NULL ? amqp_cstring_bytes(s) : amqp_empty_bytes;
}

int mq_fail(struct mq *m, int code, const char *what, const char *detail)
{
	snprintf(m->err, sizeof m->err, "%s: %s", what, detail);
	if (code != ST_ERR_TIMEOUT)
		m->broken = true;
	return code;
}

int mq_status(struct mq *m, int status, const char *what)
{
	if (status == AMQP_STATUS_OK)
		return ST_OK;
	if (status == AMQP_STATUS_TIMEOUT)
		return mq_fail(m, ST_ERR_TIMEOUT, what, amqp_error_string2(status));
	return mq_fail(m, ST_ERR_MQ_CONN, what, amqp_error_string2(status));
}

/* What a connection.close with code means.  At login, 403 (credentials,
 * or no rights on the vhost) and 530 (no such vhost) are refusals a retry
 * cannot fix.  Later, 403, 530, 503 (COMMAND_INVALID: an exchange type the
 * broker does not have, e.g. x-consistent-hash without its plugin) and 540
 * are the broker refusing what we asked for.  Anything else (320 the broker
 * shutting down, 541 an internal error, a frame error) is the connection
 * failing: reconnect. */
static int mq_close_code(unsigned code, const char *what)
{
	if (strcmp(what, "login") == 0 && (code == 403 || code == 530))
		return ST_ERR_ACCESS;
	if (code == 403 || code == 530 || code == 503 || code == 540)
		return ST_ERR_MQ;
	return ST_ERR_MQ_CONN;
}

/* The two branches differ only in the decoded struct's type
 * (amqp_channel_close_t, amqp_connection_close_t: the same fields, two
 * unrelated types), so they stay two. */
unsigned mq_close_line(const amqp_method_t *method, char *buf, size_t cap)
{
	if (method->id == AMQP_CHANNEL_CLOSE_METHOD) {
		const amqp_channel_close_t *c = method->decoded;
		snprintf(buf, cap, "channel closed by broker: %u %.*s", c->reply_code, (int)c->reply_text.len,
		         (const char *)c->reply_text.bytes);
		return c->reply_code;
	}
	{
		const amqp_connection_close_t *c = method->decoded;
		snprintf(buf, cap, "connection closed by broker: %u %.*s", c->reply_code, (int)c->reply_text.len,
		         (const char *)c->reply_text.bytes);
		return c->reply_code;
	}
}

static int mq_reply(struct mq *m, amqp_rpc_reply_t r, const char *what)
{
	char buf[200];

	switch (r.reply_type) {
	case AMQP_RESPONSE_NORMAL:
		return ST_OK;
	case AMQP_RESPONSE_NONE:
		return mq_fail(m, ST_ERR_MQ_CONN, what, "missing RPC reply");
	case AMQP_RESPONSE_LIBRARY_EXCEPTION:
		return mq_status(m, r.library_error, what);
	case AMQP_RESPONSE_SERVER_EXCEPTION:
		if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
			unsigned code = mq_close_line(&r.reply, buf, sizeof buf);
			return mq_fail(m, mq_close_code(code, what), what, buf);
		}
		if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
			(void)mq_close_line(&r.reply, buf, sizeof buf);
			return mq_fail(m, ST_ERR_MQ, what, buf);
		}
		return mq_fail(m, ST_ERR_MQ, what, "unexpected server method");
	}
	return mq_fail(m, ST_ERR_MQ, what, "unknown reply type");
}

int mq_rpc(struct mq *m, const char *what)
{
	amqp_rpc_reply_t r = amqp_get_rpc_reply(m->conn);

	/* An RPC that ran out of its time-out (mq_bound_socket): rabbitmq-c
	 * has closed the socket (simple_rpc_inner), so the link is lost, not
	 * a wait to try again. */
	if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && r.library_error == AMQP_STATUS_TIMEOUT)
		return mq_fail(m, ST_ERR_MQ_CONN, what, "no reply within the link's time-out");
	return mq_reply(m, r, what);
}

/*
 * What is verified, and what the ClientHello names.  rabbitmq-c 0.11 checks
 * the URL's host against the certificate's DNS names (and CN) only, so a
 * URL naming the server by its IP address never verifies, and it has no
 * setter for SNI.  So its own host check is off and OpenSSL's does it, as
 * every OpenSSL client does: the verify parameter of the socket's SSL_CTX
 * (copied into the SSL that amqp_socket_open makes from it) names the host
 * (X509_VERIFY_PARAM_set1_host) or the IP address (set1_ip_asc) to match.
 * A mismatch then fails the chain result that rabbitmq-c checks with
 * verify_peer.
 *
 * rabbitmq-c names the URL's host on the SSL just before SSL_connect; the
 * info callback puts our choice back at SSL_CB_HANDSHAKE_START, which
 * OpenSSL 3 calls at the top of its handshake state machine, before the
 * write side builds the ClientHello (ssl/statem/statem.c, state_machine):
 * server_name_indication when given, else nothing for an IP address
 * (RFC 6066 allows DNS names only), else the host as rabbitmq-c set it.
 * Both ride in the SSL_CTX's ex_data: rabbitmq-c makes one SSL_CTX per
 * socket and frees it with the socket (mq_sni_free frees the name's copy).
 */
static int mq_sni_index = -1;   /* char *: the name to send, "" for none */
static int mq_owner_index = -1; /* struct mq *: whose handshake it is */
static pthread_once_t mq_tls_once = PTHREAD_ONCE_INIT;

static void mq_sni_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl, void *argp)
{
	OPENSSL_free(ptr);
}

static void mq_tls_init(void)
{
	mq_sni_index = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, mq_sni_free);
	mq_owner_index = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, NULL);
}

static void mq_sni_info_cb(const SSL *ssl, int where, int ret)
{
	char *name, *send;

	if ((where & SSL_CB_HANDSHAKE_START) == 0)
		return;
	name = SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), mq_sni_index);
	/* On failure (out of memory) the ClientHello names the URL's host;
	 * the certificate is still checked against the name (mq_tls_name). */
	if (name == NULL)
		return;
	send = name[0] != '\0' ? name : NULL;
	(void)SSL_set_tlsext_host_name((SSL *)ssl, send);
}

/* Keeps the first verification error for the log line; changes nothing
 * (the verify mode stays rabbitmq-c's SSL_VERIFY_NONE: the handshake
 * completes and rabbitmq-c then refuses a result that is not X509_V_OK). */
static int mq_verify_cb(int ok, X509_STORE_CTX *x)
{
	SSL *ssl = X509_STORE_CTX_get_ex_data(x, SSL_get_ex_data_X509_STORE_CTX_idx());
	struct mq *m = ssl != NULL ? SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), mq_owner_index) : NULL;

	if (!ok && m != NULL && m->tls_verify_err == 0)
		m->tls_verify_err = X509_STORE_CTX_get_error(x);
	return ok;
}

static bool mq_is_ip(const char *host)
{
	unsigned char buf[sizeof(struct in6_addr)];

	return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

/* The name checks and the ClientHello's name (above).  The certificate is
 * checked against server_name_indication when given, as RabbitMQ's URI
 * spec has it (Erlang's ssl uses the SNI name for its host name check),
 * else against the URL's host, as a name or as an IP address. */
static int mq_tls_name(struct mq *m, amqp_socket_t *sock, const struct cfg_amqp *conf)
{
	SSL_CTX *ctx = amqp_ssl_socket_get_context(sock);
	const char *name = conf->sni != NULL ? conf->sni : conf->host;
	bool ip = conf->sni == NULL && mq_is_ip(conf->host);
	char *copy = NULL;

	if (pthread_once(&mq_tls_once, mq_tls_init) != 0 || mq_sni_index < 0 || mq_owner_index < 0 || ctx == NULL)
		return mq_fail(m, ST_ERR_MQ, "tls", "cannot set up the TLS context");
	if (conf->sni != NULL || ip) {
		copy = OPENSSL_strdup(ip ? "" : conf->sni);
		if (copy == NULL)
			return mq_fail(m, ST_ERR_NOMEM, "tls", "out of memory");
		if (SSL_CTX_set_ex_data(ctx, mq_sni_index, copy) != 1) {
			OPENSSL_free(copy);
			return mq_fail(m, ST_ERR_MQ, "tls", "cannot set up server_name_indication");
		}
		SSL_CTX_set_info_callback(ctx, mq_sni_info_cb);
	}
	if (!conf->tls_verify)
		return ST_OK;
	if (SSL_CTX_set_ex_data(ctx, mq_owner_index, m) != 1)
		return mq_fail(m, ST_ERR_MQ, "tls", "cannot set up the TLS context");
	SSL_CTX_set_verify(ctx, SSL_CTX_get_verify_mode(ctx), mq_verify_cb);
	if ((ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_CTX_get0_param(ctx), name)
	        : X509_VERIFY_PARAM_set1_host(SSL_CTX_get0_param(ctx), name, 0)) != 1)
		return mq_fail(m, ST_ERR_MQ, "tls", "cannot set the name to verify");
	amqp_ssl_socket_set_verify_hostname(sock, 0);
	return ST_OK;
}

/*
 * TLS as the URL asks (cfg.h).  rabbitmq-c's context starts with an empty
 * trust store, so without cacertfile the system's store is loaded, else
 * every verified handshake would fail.  Verification covers the chain and
 * the name of mq_tls_name.  A file that cannot be loaded is a
 * configuration fault: ST_ERR_TLS_CERT, which the programs do not wait out.
 */
static int mq_tls_setup(struct mq *m, amqp_socket_t *sock, const struct cfg_amqp *conf)
{
	char why[200];

	if (conf->cacertfile != NULL) {
		if (amqp_ssl_socket_set_cacert(sock, conf->cacertfile) != AMQP_STATUS_OK) {
			snprintf(why, sizeof why, "cannot load cacertfile %s", conf->cacertfile);
			return mq_fail(m, ST_ERR_TLS_CERT, "tls", why);
		}
	} else if (conf->tls_verify) {
		SSL_CTX *ctx = amqp_ssl_socket_get_context(sock);

		if (ctx == NULL || SSL_CTX_set_default_verify_paths(ctx) != 1)
			return mq_fail(m, ST_ERR_TLS_CERT, "tls", "cannot load the system's CA certificates");
	}
	if (conf->certfile != NULL &&
	    amqp_ssl_socket_set_key(sock, conf->certfile, conf->keyfile) != AMQP_STATUS_OK) {
		snprintf(why, sizeof why, "cannot load certfile %s with keyfile %s", conf->certfile,
		         conf->keyfile);
		return mq_fail(m, ST_ERR_TLS_CERT, "tls", why);
	}
	amqp_ssl_socket_set_verify_peer(sock, conf->tls_verify ? 1 : 0);
	amqp_ssl_socket_set_verify_hostname(sock, 0);
	return mq_tls_name(m, sock, conf);
}

/* A failed TLS connect, with the reason: the verification error ("IP
 * address mismatch", "self-signed certificate in certificate chain"), else
 * OpenSSL's ("wrong version number" for a plain-text port).  A certificate
 * that fails verification is ST_ERR_TLS_CERT: it will not fix itself. */
static int mq_tls_fail(struct mq *m, int status)
{
	char why[200], ossl[120] = "";
	unsigned long e = ERR_peek_last_error();
	bool cert = status == AMQP_STATUS_SSL_PEER_VERIFY_FAILED || status == AMQP_STATUS_SSL_HOSTNAME_VERIFY_FAILED;

	if (cert && m->tls_verify_err != 0)
		snprintf(ossl, sizeof ossl, "%s", X509_verify_cert_error_string(m->tls_verify_err));
	else if (e != 0)
		ERR_error_string_n(e, ossl, sizeof ossl);
	ERR_clear_error();
	snprintf(why, sizeof why, "%s%s%s", amqp_error_string2(status), ossl[0] != '\0' ? ": " : "", ossl);
	return mq_fail(m, cert ? ST_ERR_TLS_CERT : ST_ERR_MQ_CONN, "tls handshake", why);
}


/*
 * Every wait on the link has a bound (issue 43: a broker cut off without a
 * reset left threads blocked for minutes in a channel.close that could
 * never be answered, and the watchdog went silent).  One bound per
 * connection, from its heartbeat: twice the interval (what rabbitmq-c's
 * heartbeat takes to notice silence), at least MQ_BOUND_MIN_S (a busy
 * broker's declare), at most MQ_BOUND_MAX_S, which is also the bound of a
 * connection without heartbeats.  It bounds:
 *   - the TCP connect (and at most MQ_CONNECT_MAX_S, as before);
 *   - the login handshake and every RPC (amqp_set_handshake_timeout,
 *     amqp_set_rpc_timeout); an RPC that runs out is a lost link (mq_reply);
 *   - a send that cannot leave (TCP_USER_TIMEOUT: the kernel gives the
 *     connection up when what it sent stays unacknowledged that long;
 *     rabbitmq-c's own sends wait without a deadline);
 *   - an idle link (TCP keepalive, probing from half the bound on, under
 *     the same user time-out).
 * The longest of them, with the connect before it, stays inside half the
 * unit's WatchdogSec (90 s: a thread may spend 45 s in one step), so a
 * dead link never withholds a watchdog ping.
 */
#define MQ_BOUND_MIN_S 5
#define MQ_BOUND_MAX_S 20
#define MQ_CONNECT_MAX_S 10
_Static_assert(MQ_CONNECT_MAX_S + MQ_BOUND_MAX_S < 45, "a connect and one bounded wait fit half the WatchdogSec");

int mq_link_bound_s(int heartbeat_s)
{
	int b = heartbeat_s > 0 && heartbeat_s <= MQ_BOUND_MAX_S ? 2 * heartbeat_s : MQ_BOUND_MAX_S;

	return b < MQ_BOUND_MIN_S ? MQ_BOUND_MIN_S : b > MQ_BOUND_MAX_S ? MQ_BOUND_MAX_S : b;
}

/* The socket's side of the bound (above); a failure is the connection's
 * (it could not be bounded), never ignored. */
static int mq_bound_socket(struct mq *m, int bound_s)
{
	int fd = amqp_get_sockfd(m->conn);
	int on = 1, idle = bound_s / 2 > 0 ? bound_s / 2 : 1, intvl = 1, cnt = bound_s - idle > 0 ? bound_s - idle : 1;
	unsigned user_ms = (unsigned)bound_s * 1000u;
	struct timeval tv = { .tv_sec = bound_s };

	if (fd < 0)
		return mq_fail(m, ST_ERR_MQ_CONN, "socket", "no socket after connect");
	if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) != 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) != 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl) != 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt) != 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof user_ms) != 0)
		return mq_fail(m, ST_ERR_MQ_CONN, "socket", "cannot set keepalive and user time-out");
	if (amqp_set_handshake_timeout(m->conn, &tv) != AMQP_STATUS_OK ||
	    amqp_set_rpc_timeout(m->conn, &tv) != AMQP_STATUS_OK)
		return mq_fail(m, ST_ERR_MQ_CONN, "socket", "cannot set the handshake and RPC time-outs");
	return ST_OK;
}

/* The socket, TLS when configured, and the TCP (and TLS) connect, each
 * failure said as the cause the user can act on. */
static int mq_connect_socket(struct mq *m, const struct cfg_amqp *conf, int bound_s)
{
	amqp_socket_t *sock = conf->tls ? amqp_ssl_socket_new(m->conn) : amqp_tcp_socket_new(m->conn);
	struct timeval tv = { .tv_sec = bound_s < MQ_CONNECT_MAX_S ? bound_s : MQ_CONNECT_MAX_S };
	int rc, status;

	if (sock == NULL)
		return mq_fail(m, ST_ERR_NOMEM, "socket", "cannot create socket");
	if (conf->tls) {
		rc = mq_tls_setup(m, sock, conf);
		if (rc != ST_OK)
			return rc;
		/* rabbitmq-c leaves OpenSSL's reason in this thread's error
		 * queue: start it empty so what is found there is this
		 * handshake's. */
		ERR_clear_error();
	}
	status = amqp_socket_open_noblock(sock, conf->host, conf->port, &tv);
	if (status == AMQP_STATUS_SOCKET_ERROR) {
		/* rabbitmq-c keeps only "a socket error occurred" (errno is
		 * its non-blocking connect's EINPROGRESS): find out why. */
		char reason[64];

		addr_probe(conf->host, conf->port, NULL, 1000, reason, sizeof reason);
		if (strcmp(reason, "accepted") != 0)
			return mq_fail(m, ST_ERR_MQ_CONN, "connect", reason);
	}
	if (conf->tls && status != AMQP_STATUS_OK && status != AMQP_STATUS_TIMEOUT)
		return mq_tls_fail(m, status);
	rc = mq_status(m, status, "connect");
	if (rc == ST_OK)
		rc = mq_bound_socket(m, bound_s);
	return rc == ST_ERR_TIMEOUT ? ST_ERR_MQ_CONN : rc;
}

/* Log in under the connection name and open the one channel. */
static int mq_login(struct mq *m, const struct cfg_amqp *conf, int heartbeat_s, const char *name)
{
	amqp_table_entry_t prop[2], cap;
	amqp_table_t props;
	int rc;

	prop[0].key = amqp_cstring_bytes("connection_name");
	prop[0].value.kind = AMQP_FIELD_KIND_UTF8;
	prop[0].value.value.bytes = amqp_cstring_bytes(name != NULL ? name : "inbox-worker");
	/* Without consumer_cancel_notify the broker drops a consumer whose
	 * queue was deleted (or whose leader moved away) without a word, and
	 * the thread would wait for deliveries that never come.  rabbitmq-c
	 * merges this table into its own default capabilities. */
	cap.key = amqp_cstring_bytes("consumer_cancel_notify");
	cap.value.kind = AMQP_FIELD_KIND_BOOLEAN;
	cap.value.value.boolean = 1;
	prop[1].key = amqp_cstring_bytes("capabilities");
	prop[1].value.kind = AMQP_FIELD_KIND_TABLE;
	prop[1].value.value.table.num_entries = 1;
	prop[1].value.value.table.entries = &cap;
	props.num_entries = 2;
	props.entries = prop;
	rc = mq_reply(m, amqp_login_with_properties(m->conn, conf->vhost, 0, 131072, heartbeat_s,
	                                            &props, AMQP_SASL_METHOD_PLAIN, conf->user,
	                                            conf->password), "login");
	if (rc == ST_ERR_TIMEOUT) /* the handshake's bound (mq_bound_socket): the link is lost */
		return mq_fail(m, ST_ERR_MQ_CONN, "login", "no reply within the link's time-out");
	if (rc != ST_OK)
		return rc;
	if (amqp_channel_open(m->conn, MQ_CHANNEL) == NULL) {
		rc = mq_rpc(m, "channel.open");
		return rc != ST_OK ? rc : ST_ERR_MQ_CONN; /* no channel whatever the reply said */
	}
	return ST_OK;
}

int mq_open_why(struct mq **out, const struct cfg_amqp *conf, int heartbeat_s, const char *name, char *why,
                size_t why_cap)
{
	struct mq *m = calloc(1, sizeof *m);
	int rc;

	*out = NULL;
	if (why != NULL && why_cap > 0)
		snprintf(why, why_cap, "out of memory");
	if (m == NULL)
		return ST_ERR_NOMEM;
	pub_state_init(&m->pub);
	m->conn = amqp_new_connection();
	if (m->conn == NULL) {
		free(m);
		return ST_ERR_NOMEM;
	}
	rc = mq_connect_socket(m, conf, mq_link_bound_s(heartbeat_s));
	if (rc == ST_OK)
		rc = mq_login(m, conf, heartbeat_s, name);
	if (rc == ST_OK) {
		*out = m;
		return ST_OK;
	}
	if (why != NULL && why_cap > 0)
		snprintf(why, why_cap, "%s", m->err);
	mq_close(&m);
	return rc;
}

int mq_open_from_why(struct mq **out, const struct cfg_amqp *conf, int heartbeat_s, const char *name, int *node,
                     char *why, size_t cap)
{
	int count = 0, rc = ST_ERR_MQ_CONN;
	bool cert = false;
	char cert_why[256] = "";

	for (const struct cfg_amqp *a = conf; a != NULL; a = a->next)
		count++;
	for (int k = 0; k < count; k++) {
		int i = ((*node % count) + count + k) % count;
		const struct cfg_amqp *a = conf;

		for (int j = 0; j < i; j++)
			a = a->next;
		rc = mq_open_why(out, a, heartbeat_s, name, why, cap);
		if (rc == ST_OK) {
			if (k > 0 || *node % count != 0)
				LOG(LOG_LEVEL_INFO, "broker connected to another node of the cluster",
				    LOG_S("amqp", a->redacted), LOG_I("node", i + 1));
			*node = i;
			return ST_OK;
		}
		if (rc == ST_ERR_ACCESS)
			return rc; /* the cluster's nodes share their users and vhosts */
		/* A node's certificate is its own: another node may still take
		 * us.  When none does, that refusal is the answer. */
		if (rc == ST_ERR_TLS_CERT && !cert) {
			cert = true;
			if (why != NULL && cap > 0)
				snprintf(cert_why, sizeof cert_why, "%s", why);
		}
	}
	if (cert) {
		if (why != NULL && cap > 0)
			snprintf(why, cap, "%s", cert_why);
		return ST_ERR_TLS_CERT;
	}
	return rc;
}

int mq_open_from(struct mq **out, const struct cfg_amqp *conf, int heartbeat_s, const char *name, int *node)
{
	return mq_open_from_why(out, conf, heartbeat_s, name, node, NULL, 0);
}

int mq_open(struct mq **out, const struct cfg_amqp *conf, int heartbeat_s, const char *name)
{
	int node = 0;

	return mq_open_from(out, conf, heartbeat_s, name, &node);
}

void mq_close(struct mq **mp)
{
	struct mq *m;

	if (mp == NULL || *mp == NULL)
		return;
	m = *mp;
	for (int i = 0; i < m->nslots; i++) {
		if (m->env_used[i])
			amqp_destroy_envelope(m->envs[i]);
		free(m->envs[i]);
	}
	free(m->envs);
	free(m->env_used);
	free(m->free_slots);
	free(m->stash);
	if (m->has_got)
		amqp_destroy_message(&m->got);
	if (!m->broken) {
		/* Polite close, bounded by the RPC time-out (mq_bound_socket);
		 * its failure changes nothing for us.  A link known to be
		 * lost (broken, or mq_drop) is closed without it: a reply
		 * that cannot come is not waited for. */
		(void)amqp_channel_close(m->conn, MQ_CHANNEL, AMQP_REPLY_SUCCESS);
		(void)amqp_connection_close(m->conn, AMQP_REPLY_SUCCESS);
	}
	if (amqp_destroy_connection(m->conn) != AMQP_STATUS_OK)
		LOG0(LOG_LEVEL_DEBUG, "amqp_destroy_connection reported an error");
	free(m);
	*mp = NULL;
}

void mq_drop(struct mq **mp)
{
	if (mp != NULL && *mp != NULL)
		(*mp)->broken = true;
	mq_close(mp);
}

const char *mq_errmsg(const struct mq *m)
{
	return m->err;
}

bool mq_broken(const struct mq *m)
{
	return m->broken;
}

static int mq_exchange(struct mq *m, const char *name, const char *type, amqp_table_t args)
{
	amqp_exchange_declare(m->conn, MQ_CHANNEL, mq_b(name), mq_b(type), 0, 1, 0, 0, args);
	return mq_rpc(m, "exchange.declare");
}

static int mq_queue(struct mq *m, const char *name, amqp_table_t args)
{
	amqp_queue_declare(m->conn, MQ_CHANNEL, mq_b(name), 0, 1, 0, 0, args);
	return mq_rpc(m, "queue.declare");
}

static int mq_bind(struct mq *m, const char *queue, const char *exchange, const char *key)
{
	amqp_queue_bind(m->conn, MQ_CHANNEL, mq_b(queue), mq_b(exchange), mq_b(key), amqp_empty_table);
	return mq_rpc(m, "queue.bind");
}

int mq_consume_queue_name(const struct cfg *conf, int thread_index, char *buf, size_t cap)
{
	int n;

	if (conf->ordering == CFG_ORDERING_SHARDED)
		n = snprintf(buf, cap, "%s.shard.%d", conf->queue, thread_index % conf->shards);
	else
		n = snprintf(buf, cap, "%s", conf->queue);
	return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* The arguments every inbox queue carries: quorum, a delivery limit so a
 * message that crashes workers ends in the DLQ instead of looping, and the
 * DLX that the limit needs (newer brokers drop messages past the limit when
 * no DLX is set). */
static int mq_inbox_queue(struct mq *m, const struct cfg *conf, const char *name, bool single_active)
{
	amqp_table_entry_t e[4];
	amqp_table_t args = { .num_entries = 3, .entries = e };

	e[0].key = amqp_cstring_bytes("x-queue-type");
	e[0].value.kind = AMQP_FIELD_KIND_UTF8;
	e[0].value.value.bytes = amqp_cstring_bytes("quorum");
	e[1].key = amqp_cstring_bytes("x-delivery-limit");
	e[1].value.kind = AMQP_FIELD_KIND_I64;
	e[1].value.value.i64 = conf->delivery_limit;
	e[2].key = amqp_cstring_bytes("x-dead-letter-exchange");
	e[2].value.kind = AMQP_FIELD_KIND_UTF8;
	e[2].value.value.bytes = amqp_cstring_bytes(conf->dlx);
	if (single_active) {
		e[3].key = amqp_cstring_bytes("x-single-active-consumer");
		e[3].value.kind = AMQP_FIELD_KIND_BOOLEAN;
		e[3].value.value.boolean = 1;
		args.num_entries = 4;
	}
	return mq_queue(m, name, args);
}

int mq_declare_topology(struct mq *m, const struct cfg *conf)
{
	int rc;
	char shard[300], aggregate_key[LC_NAME_MAX + 3] = "";
	const struct lc_def *def = agg_current()->def;

	/* The queue takes order.# (SPEC), and <aggregate>.# too when the
	 * lifecycle definition the worker runs is another aggregate's. */
	if (strcmp(def->aggregate, "order") != 0)
		snprintf(aggregate_key, sizeof aggregate_key, "%s.#", def->aggregate);

	rc = mq_exchange(m, conf->exchange, "topic", amqp_empty_table);
	if (rc == ST_OK)
		rc = mq_exchange(m, conf->dlx, "topic", amqp_empty_table);
	if (rc == ST_OK)
		rc = mq_exchange(m, conf->out_exchange, "topic", amqp_empty_table);
	if (rc == ST_OK)
		rc = mq_queue_declare_bind_type(m, conf->dlq, conf->dlx, "#", conf->dlq_type == CFG_QUEUE_QUORUM);
	if (rc != ST_OK)
		return rc;
	if (conf->ordering == CFG_ORDERING_SHARED) {
		rc = mq_inbox_queue(m, conf, conf->queue, false);
		if (rc == ST_OK)
			rc = mq_bind(m, conf->queue, conf->exchange, "order.#");
		if (rc == ST_OK && aggregate_key[0] != '\0')
			rc = mq_bind(m, conf->queue, conf->exchange, aggregate_key);
		for (const char *k = conf->bind; rc == ST_OK && k != NULL && *k != '\0';) {
			char key[256];
			size_t n = strcspn(k, ",");

			snprintf(key, sizeof key, "%.*s", (int)n, k); /* 1..255 (cfg.c) */
			rc = mq_bind(m, conf->queue, conf->exchange, key);
			k += n + (k[n] == ',');
		}
		return rc;
	}
	/* Sharded: orders -> <exchange>.sharded (x-consistent-hash on the
	 * order_id header) -> one queue per shard with a single active
	 * consumer, so one order's events are handled one at a time in
	 * broker order however many workers run. */
	{
		char hx[300];
		amqp_table_entry_t e;
		amqp_table_t args = { .num_entries = 1, .entries = &e };

		snprintf(hx, sizeof hx, "%s.sharded", conf->exchange);
		e.key = amqp_cstring_bytes("hash-header");
		e.value.kind = AMQP_FIELD_KIND_UTF8;
		e.value.value.bytes = amqp_cstring_bytes("order_id");
		rc = mq_exchange(m, hx, "x-consistent-hash", args);
		if (rc == ST_ERR_MQ && strstr(m->err, "invalid exchange type") != NULL) {
			/* The broker lacks the plugin: say what to do. */
			size_t n = strlen(m->err);
			snprintf(m->err + n, sizeof m->err - n, "; INBOX_ORDERING=sharded needs the plugin: "
			         "rabbitmq-plugins enable rabbitmq_consistent_hash_exchange");
		}
		if (rc != ST_OK)
			return rc;
		amqp_exchange_bind(m->conn, MQ_CHANNEL, mq_b(hx), mq_b(conf->exchange), mq_b("order.#"),
		                   amqp_empty_table);
		rc = mq_rpc(m, "exchange.bind");
		if (rc == ST_OK && aggregate_key[0] != '\0') {
			amqp_exchange_bind(m->conn, MQ_CHANNEL, mq_b(hx), mq_b(conf->exchange), mq_b(aggregate_key),
			                   amqp_empty_table);
			rc = mq_rpc(m, "exchange.bind");
		}
		for (const char *k = conf->bind; rc == ST_OK && k != NULL && *k != '\0';) {
			char key[256];
			size_t n = strcspn(k, ",");

			snprintf(key, sizeof key, "%.*s", (int)n, k);
			amqp_exchange_bind(m->conn, MQ_CHANNEL, mq_b(hx), mq_b(conf->exchange), mq_b(key), amqp_empty_table);
			rc = mq_rpc(m, "exchange.bind");
			k += n + (k[n] == ',');
		}
		for (int i = 0; rc == ST_OK && i < conf->shards; i++) {
			snprintf(shard, sizeof shard, "%s.shard.%d", conf->queue, i);
			rc = mq_inbox_queue(m, conf, shard, true);
			if (rc == ST_OK)
				rc = mq_bind(m, shard, hx, "1");
		}
	}
	return rc;
}

static int mq_basic_consume(struct mq *m, struct mq_consumer *c)
{
	amqp_table_entry_t prio = { .key = amqp_cstring_bytes("x-priority"),
		                    .value = { .kind = AMQP_FIELD_KIND_I32, .value = { .i32 = c->priority } } };
	amqp_table_t args = { .num_entries = c->priority != 0 ? 1 : 0, .entries = &prio };
	amqp_basic_consume_ok_t *ok;
	int rc;

	/* Per consumer (global=0): quorum queues refuse a channel-wide
	 * prefetch. */
	amqp_basic_qos(m->conn, MQ_CHANNEL, 0, (uint16_t)c->prefetch, 0);
	rc = mq_rpc(m, "basic.qos");
	if (rc != ST_OK)
		return rc;
	ok = amqp_basic_consume(m->conn, MQ_CHANNEL, mq_b(c->queue), amqp_empty_bytes, 0, 0, 0, args);
	if (ok == NULL)
		return mq_rpc(m, "basic.consume");
	snprintf(c->tag, sizeof c->tag, "%.*s", (int)ok->consumer_tag.len, (const char *)ok->consumer_tag.bytes);
	c->cancelled = false;
	return ST_OK;
}

/* Grow the room to n slots (never shrinks; see mq_private.h).  The slots
 * in use keep their envelopes (pointers move, envelopes do not); the ring
 * of deliveries kept aside is laid out again from its head. */
static int mq_room(struct mq *m, int n)
{
	amqp_envelope_t **envs;
	bool *used;
	int *free_slots, *stash;

	if (n <= m->nslots)
		return ST_OK;
	envs = realloc(m->envs, (size_t)n * sizeof *envs);
	if (envs == NULL)
		return ST_ERR_NOMEM;
	m->envs = envs;
	used = realloc(m->env_used, (size_t)n * sizeof *used);
	if (used == NULL)
		return ST_ERR_NOMEM;
	m->env_used = used;
	free_slots = realloc(m->free_slots, (size_t)n * sizeof *free_slots);
	if (free_slots == NULL)
		return ST_ERR_NOMEM;
	m->free_slots = free_slots;
	stash = malloc((size_t)n * sizeof *stash);
	if (stash == NULL)
		return ST_ERR_NOMEM;
	for (int i = 0; i < m->nstash; i++)
		stash[i] = m->stash[(m->stash_head + i) % m->nslots];
	free(m->stash);
	m->stash = stash;
	m->stash_head = 0;
	/* The new slots are free: the highest at the bottom, so the lowest
	 * is taken first. */
	for (int i = n - 1; i >= m->nslots; i--) {
		m->envs[i] = NULL;
		m->env_used[i] = false;
		m->free_slots[m->nfree++] = i;
	}
	m->nslots = n;
	return ST_OK;
}

int mq_consume_start(struct mq *m, const char *queue, int prefetch, int priority)
{
	struct mq_consumer *c;
	int rc, room = 0;

	if (m->nconsumers >= MQ_MAX_CONSUMERS || strlen(queue) >= sizeof c->queue)
		return mq_fail(m, ST_ERR_INVALID, "basic.consume", "too many consumers or queue name too long");
	c = &m->consumers[m->nconsumers];
	memset(c, 0, sizeof *c);
	snprintf(c->queue, sizeof c->queue, "%s", queue);
	c->prefetch = prefetch < 1 ? 1 : prefetch > 65535 ? 65535 : prefetch;
	c->priority = priority;
	/* Room for every delivery the broker may send, before it may, and
	 * one slot more: with every delivery it may send in hand, mq_service
	 * must still read the next frame (a heartbeat, a cancel), and a free
	 * slot is what it reads into.  Without it a full room stopped the
	 * servicing, and the broker dropped the silent connection. */
	for (int i = 0; i <= m->nconsumers; i++)
		room += m->consumers[i].prefetch;
	room++;
	if (mq_room(m, room) != ST_OK)
		return mq_fail(m, ST_ERR_NOMEM, "basic.consume", "out of memory for the prefetch's deliveries");
	rc = mq_basic_consume(m, c);
	if (rc == ST_OK)
		m->nconsumers++;
	return rc;
}

int mq_cancelled(const struct mq *m)
{
	return m->ncancelled;
}

int mq_consume_again(struct mq *m)
{
	for (int i = 0; i < m->nconsumers; i++) {
		struct mq_consumer *c = &m->consumers[i];
		int rc;

		if (!c->cancelled)
			continue;
		rc = mq_basic_consume(m, c);
		if (rc != ST_OK)
			return rc;
		m->ncancelled--;
	}
	return ST_OK;
}

/* The broker cancelled a consumer (consumer_cancel_notify): remember which,
 * so that the owner consumes again.  The broker expects no reply. */
static void mq_on_cancel(struct mq *m, const amqp_basic_cancel_t *bc)
{
	for (int i = 0; i < m->nconsumers; i++) {
		struct mq_consumer *c = &m->consumers[i];
		if (!c->cancelled && strlen(c->tag) == bc->consumer_tag.len &&
		    memcmp(c->tag, bc->consumer_tag.bytes, bc->consumer_tag.len) == 0) {
			c->cancelled = true;
			m->ncancelled++;
			snprintf(m->err, sizeof m->err, "consumer cancelled by the broker: queue %s", c->queue);
			LOG(LOG_LEVEL_WARN, "consumer cancelled by the broker", LOG_S("queue", c->queue));
		}
	}
}

static void mq_set_routing_key(struct mq_delivery *d, amqp_bytes_t rk)
{
	snprintf(d->routing_key, sizeof d->routing_key, "%.*s", (int)rk.len, (const char *)rk.bytes);
	d->routing_key_valid = rk.len == 0 || (rk.len < sizeof d->routing_key && memchr(rk.bytes, 0, rk.len) == NULL &&
	                                       props_utf8_valid(rk.bytes, rk.len));
}

static void mq_fill_delivery(struct mq_delivery *d, const amqp_message_t *msg)
{
	const amqp_basic_properties_t *p = &msg->properties;
	const amqp_field_value_t *v;

	d->body = msg->body.bytes;
	d->len = msg->body.len;
	memset(&d->props, 0, sizeof d->props);
	if (p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG) {
		d->props.message_id = p->message_id.bytes;
		d->props.message_id_len = p->message_id.len;
	}
	if (p->_flags & AMQP_BASIC_TYPE_FLAG) {
		d->props.type = p->type.bytes;
		d->props.type_len = p->type.len;
	}
	d->published_us = 0;
	d->delivery_count = 0;
	v = props_header(p, MQ_HEADER_PUBLISHED_US);
	if (v != NULL && !props_field_int(v, &d->published_us))
		d->published_us = 0;
	v = props_header(p, "x-delivery-count");
	if (v != NULL && !props_field_int(v, &d->delivery_count))
		d->delivery_count = 0;
}

void mq_delivery_envelope(const struct mq_delivery *d, struct env_delivery *e)
{
	const amqp_message_t *msg = d->priv;
	const amqp_basic_properties_t *p = msg != NULL ? &msg->properties : NULL;

	*e = (struct env_delivery){ .body = d->body, .len = d->len, .props = d->props };
	if (p == NULL)
		return;
	if (p->_flags & AMQP_BASIC_CONTENT_TYPE_FLAG) {
		e->content_type = p->content_type.bytes;
		e->content_type_len = p->content_type.len;
	}
	if (p->_flags & AMQP_BASIC_CORRELATION_ID_FLAG) {
		e->correlation_id = p->correlation_id.bytes;
		e->correlation_id_len = p->correlation_id.len;
	}
	if (p->_flags & AMQP_BASIC_HEADERS_FLAG) {
		e->header = props_env_header;
		e->header_arg = p;
	}
}

/* Read one delivery into a free envelope slot, waiting up to timeout_ms
 * (rabbitmq-c sends and checks heartbeats while it waits).  Returns the
 * slot, or an st_code: ST_ERR_TIMEOUT also when the frame that came was a
 * basic.cancel (recorded for mq_cancelled). */
static int mq_read(struct mq *m, int timeout_ms)
{
	struct timeval tv = { .tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000 };
	amqp_rpc_reply_t r;
	amqp_envelope_t *env;
	int slot;

	if (m->broken)
		return ST_ERR_MQ_CONN;
	if (m->nfree == 0)
		return mq_fail(m, ST_ERR_INVALID, "consume", "too many deliveries held");
	slot = m->free_slots[m->nfree - 1];
	if (m->envs[slot] == NULL) {
		m->envs[slot] = calloc(1, sizeof *m->envs[slot]);
		if (m->envs[slot] == NULL)
			return mq_fail(m, ST_ERR_MQ_CONN, "consume", "out of memory for a delivery");
	}
	env = m->envs[slot];
	amqp_maybe_release_buffers(m->conn);
	r = amqp_consume_message(m->conn, env, &tv, 0);
	if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
	    r.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
		/* A frame other than a delivery: on a consumer channel that is a
		 * basic.cancel (queue deleted, leader moved), a channel.close or
		 * a connection.close.  Read it to act on it. */
		amqp_frame_t f;
		if (amqp_simple_wait_frame(m->conn, &f) == AMQP_STATUS_OK && f.frame_type == AMQP_FRAME_METHOD) {
			char buf[80];
			if (f.payload.method.id == AMQP_BASIC_CANCEL_METHOD) {
				mq_on_cancel(m, f.payload.method.decoded);
				return ST_ERR_TIMEOUT;
			}
			snprintf(buf, sizeof buf, "unexpected method 0x%08x", f.payload.method.id);
			return mq_fail(m, f.payload.method.id == AMQP_CHANNEL_CLOSE_METHOD ? ST_ERR_MQ : ST_ERR_MQ_CONN,
			               "consume", buf);
		}
		return mq_fail(m, ST_ERR_MQ_CONN, "consume", "unexpected frame");
	}
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
		return mq_reply(m, r, "consume");
	m->nfree--;
	m->env_used[slot] = true;
	return slot;
}

static void mq_fill_from_slot(struct mq *m, int slot, struct mq_delivery *d)
{
	amqp_envelope_t *env = m->envs[slot];

	d->slot = slot;
	d->tag = env->delivery_tag;
	mq_set_routing_key(d, env->routing_key);
	d->redelivered = env->redelivered != 0;
	d->priv = &env->message;
	mq_fill_delivery(d, &env->message);
}

int mq_consume(struct mq *m, struct mq_delivery *d, int timeout_ms)
{
	int slot;

	if (m->nstash > 0) {
		slot = m->stash[m->stash_head];
		m->stash_head = (m->stash_head + 1) % m->nslots;
		m->nstash--;
	} else {
		slot = mq_read(m, timeout_ms);
		if (slot < 0)
			return slot;
	}
	mq_fill_from_slot(m, slot, d);
	return ST_OK;
}

int mq_ms_left(struct mq *m, const struct timespec *start, int timeout_ms, const char *what, long *left)
{
	struct timespec now;

	if (clock_gettime(CLOCK_MONOTONIC, &now) != 0)
		return mq_fail(m, ST_ERR_MQ_CONN, what, "clock_gettime failed");
	*left = timeout_ms - ((now.tv_sec - start->tv_sec) * 1000L + (now.tv_nsec - start->tv_nsec) / 1000000L);
	return ST_OK;
}

int mq_service(struct mq *m, int timeout_ms)
{
	struct timespec start;

	if (clock_gettime(CLOCK_MONOTONIC, &start) != 0)
		return mq_fail(m, ST_ERR_MQ_CONN, "service", "clock_gettime failed");
	for (;;) {
		long left;
		int slot, rc = mq_ms_left(m, &start, timeout_ms, "service", &left);

		if (rc != ST_OK)
			return rc;
		if (left <= 0)
			return ST_OK;
		if (m->nfree == 0)
			return ST_ERR_INVALID; /* no room: more came than the prefetch allows */
		slot = mq_read(m, (int)left);
		if (slot == ST_ERR_TIMEOUT)
			continue;
		if (slot < 0)
			return slot;
		m->stash[(m->stash_head + m->nstash) % m->nslots] = slot;
		m->nstash++;
	}
}

void mq_delivery_release(struct mq *m, struct mq_delivery *d)
{
	if (d->priv != NULL && d->priv != &m->got && d->slot >= 0 && d->slot < m->nslots &&
	    m->env_used[d->slot] && d->priv == &m->envs[d->slot]->message) {
		amqp_destroy_envelope(m->envs[d->slot]);
		m->env_used[d->slot] = false;
		m->free_slots[m->nfree++] = d->slot;
	} else if (d->priv == &m->got && m->has_got) {
		amqp_destroy_message(&m->got);
		m->has_got = false;
	}
	d->priv = NULL;
	d->body = NULL;
	d->len = 0;
}

int mq_ack(struct mq *m, uint64_t tag, bool multiple)
{
	if (m->broken)
		return ST_ERR_MQ_CONN;
	return mq_status(m, amqp_basic_ack(m->conn, MQ_CHANNEL, tag, multiple), "basic.ack");
}

int mq_reject(struct mq *m, uint64_t tag, bool requeue)
{
	return mq_status(m, amqp_basic_reject(m->conn, MQ_CHANNEL, tag, requeue), "basic.reject");
}

/* d->priv points at the amqp_message_t of the envelope (consume) or of a
 * basic.get. */
static const amqp_basic_properties_t *mq_delivery_properties(const struct mq_delivery *d)
{
	return &((const amqp_message_t *)d->priv)->properties;
}

char *mq_delivery_props_json_note(const struct mq_delivery *d, char *note, size_t note_cap)
{
	if (d->priv == NULL) {
		if (note != NULL && note_cap > 0)
			note[0] = '\0';
		return NULL;
	}
	return props_to_json(mq_delivery_properties(d), note, note_cap);
}

char *mq_delivery_props_json(const struct mq_delivery *d)
{
	return mq_delivery_props_json_note(d, NULL, 0);
}

void mq_props_json_note(const char *props_json, char *buf, size_t cap)
{
	props_json_note(props_json, buf, cap);
}


int mq_delivery_header(const struct mq_delivery *d, const char *key, char *buf, size_t cap)
{
	const amqp_field_value_t *v;
	int n;

	if (d->priv == NULL)
		return ST_ERR_NOT_FOUND;
	v = props_header(mq_delivery_properties(d), key);
	if (v == NULL || (v->kind != AMQP_FIELD_KIND_UTF8 && v->kind != AMQP_FIELD_KIND_BYTES))
		return ST_ERR_NOT_FOUND;
	n = snprintf(buf, cap, "%.*s", (int)v->value.bytes.len, (const char *)v->value.bytes.bytes);
	return n < 0 || (size_t)n >= cap ? ST_ERR_INVALID : ST_OK;
}

int mq_queue_counts(struct mq *m, const char *queue, uint32_t *messages, uint32_t *consumers)
{
	amqp_queue_declare_ok_t *ok;

	ok = amqp_queue_declare(m->conn, MQ_CHANNEL, mq_b(queue), 1, 0, 0, 0, amqp_empty_table);
	if (ok == NULL) {
		amqp_rpc_reply_t r = amqp_get_rpc_reply(m->conn);
		if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION && r.reply.id == AMQP_CHANNEL_CLOSE_METHOD &&
		    ((amqp_channel_close_t *)r.reply.decoded)->reply_code == AMQP_NOT_FOUND) {
			mq_reply(m, r, "queue.declare passive");
			return ST_ERR_NOT_FOUND;
		}
		return mq_reply(m, r, "queue.declare passive");
	}
	if (messages != NULL)
		*messages = ok->message_count;
	if (consumers != NULL)
		*consumers = ok->consumer_count;
	return ST_OK;
}

int mq_get(struct mq *m, const char *queue, struct mq_delivery *d)
{
	amqp_rpc_reply_t r;
	int rc;

	if (m->has_got) {
		amqp_destroy_message(&m->got);
		m->has_got = false;
	}
	amqp_maybe_release_buffers(m->conn);
	r = amqp_basic_get(m->conn, MQ_CHANNEL, mq_b(queue), 0);
	rc = mq_reply(m, r, "basic.get");
	if (rc != ST_OK)
		return rc;
	if (r.reply.id == AMQP_BASIC_GET_EMPTY_METHOD)
		return ST_ERR_NOT_FOUND;
	{
		amqp_basic_get_ok_t *ok = r.reply.decoded;
		d->tag = ok->delivery_tag;
		d->redelivered = ok->redelivered != 0;
		mq_set_routing_key(d, ok->routing_key);
	}
	rc = mq_reply(m, amqp_read_message(m->conn, MQ_CHANNEL, &m->got, 0), "read message");
	if (rc != ST_OK)
		return rc;
	m->has_got = true;
	d->slot = -1;
	d->priv = &m->got;
	mq_fill_delivery(d, &m->got);
	return ST_OK;
}

int mq_queue_purge(struct mq *m, const char *queue)
{
	amqp_queue_purge(m->conn, MQ_CHANNEL, mq_b(queue));
	return mq_rpc(m, "queue.purge");
}

int mq_queue_delete(struct mq *m, const char *queue)
{
	amqp_queue_delete(m->conn, MQ_CHANNEL, mq_b(queue), 0, 0);
	return mq_rpc(m, "queue.delete");
}

int mq_exchange_delete(struct mq *m, const char *exchange)
{
	amqp_exchange_delete(m->conn, MQ_CHANNEL, mq_b(exchange), 0);
	return mq_rpc(m, "exchange.delete");
}

bool mq_browsed_queue_limit(const char *server_version, int64_t *limit)
{
	char *end;
	long major;

	if (server_version == NULL)
		return false;
	major = strtol(server_version, &end, 10);
	if (end == server_version || *end != '.')
		return false;
	*limit = -1;
	return major >= 4;
}

/* The broker's "version" server property ("3.10.8"), into buf; "" when it
 * does not say. */
static void mq_server_version(struct mq *m, char *buf, size_t cap)
{
	const amqp_table_t *p = amqp_get_server_properties(m->conn);

	buf[0] = '\0';
	for (int i = 0; p != NULL && i < p->num_entries; i++) {
		const amqp_table_entry_t *e = &p->entries[i];

		if (e->key.len == 7 && memcmp(e->key.bytes, "version", 7) == 0 &&
		    (e->value.kind == AMQP_FIELD_KIND_UTF8 || e->value.kind == AMQP_FIELD_KIND_BYTES))
			snprintf(buf, cap, "%.*s", (int)e->value.value.bytes.len, (const char *)e->value.value.bytes.bytes);
	}
}

/* Channel 2, opened for one question only: does the broker take this
 * declaration?  A refusal (406: the queue exists with other arguments)
 * closes that channel alone, so the channel in use, its consumers and the
 * deliveries it holds are not touched.  ST_OK with *refused telling
 * whether it was refused as inequivalent, else the failure. */
#define MQ_PROBE_CHANNEL 2
static int mq_queue_probe(struct mq *m, const char *name, amqp_table_t args, bool *refused)
{
	amqp_rpc_reply_t r;

	*refused = false;
	if (amqp_channel_open(m->conn, MQ_PROBE_CHANNEL) == NULL)
		return mq_rpc(m, "channel.open (probe)");
	amqp_queue_declare(m->conn, MQ_PROBE_CHANNEL, mq_b(name), 0, 1, 0, 0, args);
	r = amqp_get_rpc_reply(m->conn);
	if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION && r.reply.id == AMQP_CHANNEL_CLOSE_METHOD &&
	    ((amqp_channel_close_t *)r.reply.decoded)->reply_code == AMQP_PRECONDITION_FAILED) {
		amqp_channel_close_ok_t ok = { 0 };

		if (amqp_send_method(m->conn, MQ_PROBE_CHANNEL, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok) != AMQP_STATUS_OK)
			return mq_fail(m, ST_ERR_MQ_CONN, "queue.declare (probe)", "cannot confirm the channel's close");
		*refused = true;
		return ST_OK;
	}
	if (mq_reply(m, r, "queue.declare (probe)") != ST_OK)
		return ST_ERR_MQ;
	return mq_reply(m, amqp_channel_close(m->conn, MQ_PROBE_CHANNEL, AMQP_REPLY_SUCCESS), "channel.close (probe)");
}

int mq_queue_declare_bind_type(struct mq *m, const char *queue, const char *exchange,
                               const char *binding, bool quorum)
{
	amqp_table_entry_t e[2];
	amqp_table_t args = { .num_entries = quorum ? 1 : 0, .entries = e };
	char version[32];
	int64_t limit;
	bool refused;
	int rc;

	e[0].key = amqp_cstring_bytes("x-queue-type");
	e[0].value.kind = AMQP_FIELD_KIND_UTF8;
	e[0].value.value.bytes = amqp_cstring_bytes("quorum");
	mq_server_version(m, version, sizeof version);
	/* The tests' RabbitMQ is 3.10: this takes the 4.x path against a
	 * queue that exists without the argument (the probe's refusal). */
	if (fault_armed("mq-broker-4"))
		snprintf(version, sizeof version, "4.0.0-pretend");
	if (quorum && mq_browsed_queue_limit(version, &limit)) {
		e[1].key = amqp_cstring_bytes("x-delivery-limit");
		e[1].value.kind = AMQP_FIELD_KIND_I64;
		e[1].value.value.i64 = limit;
		args.num_entries = 2;
		/* A queue declared before (by an older build) without the
		 * argument would refuse it (406, inequivalent): then it keeps
		 * what it has, and the operator is told how to lift its limit
		 * with a policy (doc/operations.md, Dead letters). */
		rc = mq_queue_probe(m, queue, args, &refused);
		if (rc != ST_OK)
			return rc;
		if (refused) {
			LOG(LOG_LEVEL_WARN, "this quorum queue was declared without x-delivery-limit -1: on RabbitMQ 4.0-4.2"
			    " each read of it counts toward the broker's default delivery limit (20) and would in the end"
			    " drop messages; set a policy with delivery-limit -1 on it (doc/operations.md, Dead letters)",
			    LOG_S("queue", queue), LOG_S("broker", version));
			args.num_entries = 1;
		}
	}
	rc = mq_queue(m, queue, quorum ? args : amqp_empty_table);
	if (rc == ST_OK)
		rc = mq_bind(m, queue, exchange, binding);
	return rc;
}

int mq_queue_declare_bind(struct mq *m, const char *queue, const char *exchange,
                          const char *binding, bool durable)
{
	amqp_queue_declare(m->conn, MQ_CHANNEL, mq_b(queue), 0, durable, 0, 0, amqp_empty_table);
	if (mq_rpc(m, "queue.declare") != ST_OK)
		return ST_ERR_MQ;
	return mq_bind(m, queue, exchange, binding);
}

int mq_queue_unbind(struct mq *m, const char *queue, const char *exchange, const char *binding)
{
	amqp_queue_unbind(m->conn, MQ_CHANNEL, mq_b(queue), mq_b(exchange), mq_b(binding), amqp_empty_table);
	return mq_rpc(m, "queue.unbind");
}
