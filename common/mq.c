/*
 * mq.c - the rabbitmq-c boundary.  Every librabbitmq result is checked here
 * and turned into an st_code; the reply of the last failure is kept as a
 * human line for logs.  After any failure other than a time-out the
 * connection is considered broken: callers close it and open a new one, which
 * is simpler and safer than repairing a half-closed channel.
 */
#include "mq.h"

#include <amqp.h>
#include <amqp_ssl_socket.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <amqp_tcp_socket.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "addr.h"
#include "log.h"
#include "status.h"

#define MQ_CHANNEL 1
/* Headers of an outgoing message: the saved ones (at most
 * MQ_HEADERS_KEEP) plus ours. */
#define MQ_HEADERS_MAX (MQ_HEADERS_KEEP + 16)
/* Deliveries one connection can hold at once (a batch); each has its own
 * envelope, so they can be settled together. */
#define MQ_MAX_HELD 512
_Static_assert(MQ_MAX_HELD >= CFG_BATCH_MAX, "a connection must hold a whole batch of deliveries");

/* Consumers one channel can carry: a thread consumes at most every shard. */
#define MQ_MAX_CONSUMERS 64

struct mq_consumer {
	char tag[128];          /* the broker's consumer tag */
	char queue[256];
	int prefetch;
	bool cancelled;         /* the broker sent basic.cancel for it */
};

struct mq {
	amqp_connection_state_t conn;
	bool broken;
	bool confirming;
	uint64_t next_seq;      /* delivery tag of the next publish */
	uint64_t confirmed;     /* all seq <= confirmed are settled */
	bool nacked;            /* a nack or return arrived since the last wait */
	/* Outcomes of the last MQ_TRACK_MAX publishes, at seq % MQ_TRACK_MAX
	 * (see mq_outcome); track_pending counts those still awaiting their
	 * ack or nack, so that a wait ends only when each one is settled. */
	struct mq_track {
		uint64_t seq;
		uint8_t outcome;    /* enum mq_outcome */
		bool returned;
	} track[MQ_TRACK_MAX];
	int track_pending;
	uint64_t mandatory_seq; /* the latest mandatory publish: a return is its */
	amqp_envelope_t envs[MQ_MAX_HELD];
	bool env_used[MQ_MAX_HELD];
	int free_slots[MQ_MAX_HELD];
	int nfree;
	/* Deliveries read by mq_service while the thread took no new work, in
	 * arrival order (a ring of envelope slots); mq_consume hands them out
	 * before it reads the socket again.  The broker's prefetch bounds how
	 * many arrive. */
	int stash[MQ_MAX_HELD];
	int stash_head;
	int nstash;
	struct mq_consumer consumers[MQ_MAX_CONSUMERS];
	int nconsumers;
	int ncancelled;
	amqp_message_t got;     /* basic.get result */
	bool has_got;
	char err[256];
};

static amqp_bytes_t mq_b(const char *s)
{
	return s != NULL ? amqp_cstring_bytes(s) : amqp_empty_bytes;
}

static int mq_fail(struct mq *m, int code, const char *what, const char *detail)
{
	snprintf(m->err, sizeof m->err, "%s: %s", what, detail);
	if (code != ST_ERR_TIMEOUT)
		m->broken = true;
	return code;
}

static int mq_status(struct mq *m, int status, const char *what)
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
			amqp_connection_close_t *c = r.reply.decoded;
			snprintf(buf, sizeof buf, "connection closed by broker: %u %.*s",
			         c->reply_code, (int)c->reply_text.len, (const char *)c->reply_text.bytes);
			return mq_fail(m, mq_close_code(c->reply_code, what), what, buf);
		}
		if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
			amqp_channel_close_t *c = r.reply.decoded;
			snprintf(buf, sizeof buf, "channel closed by broker: %u %.*s",
			         c->reply_code, (int)c->reply_text.len, (const char *)c->reply_text.bytes);
			return mq_fail(m, ST_ERR_MQ, what, buf);
		}
		return mq_fail(m, ST_ERR_MQ, what, "unexpected server method");
	}
	return mq_fail(m, ST_ERR_MQ, what, "unknown reply type");
}

static int mq_rpc(struct mq *m, const char *what)
{
	return mq_reply(m, amqp_get_rpc_reply(m->conn), what);
}

/*
 * server_name_indication.  rabbitmq-c 0.11 has no setter: amqp_socket_open
 * makes the SSL and names the URL's host on it just before SSL_connect, so
 * the name is put back in the info callback at SSL_CB_HANDSHAKE_START, which
 * OpenSSL 3 calls at the top of its handshake state machine, before the
 * write side builds the ClientHello (ssl/statem/statem.c, state_machine).
 * The name rides in the SSL_CTX's ex_data: rabbitmq-c makes one SSL_CTX per
 * socket and frees it with the socket, and mq_sni_free then frees the copy.
 */
static int mq_sni_index = -1;
static pthread_once_t mq_sni_once = PTHREAD_ONCE_INIT;

static void mq_sni_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl, void *argp)
{
	OPENSSL_free(ptr);
}

static void mq_sni_init(void)
{
	mq_sni_index = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, mq_sni_free);
}

static void mq_sni_info_cb(const SSL *ssl, int where, int ret)
{
	const char *name;

	if ((where & SSL_CB_HANDSHAKE_START) == 0)
		return;
	name = SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), mq_sni_index);
	/* On failure (out of memory) the ClientHello goes without SNI; the
	 * certificate is still checked against the name (mq_tls_setup). */
	if (name != NULL)
		(void)SSL_set_tlsext_host_name((SSL *)ssl, name);
}

/* Send conf->sni in the ClientHello and, when verifying, check the
 * certificate against it instead of the URL's host, as RabbitMQ's URI spec
 * has it (Erlang's ssl uses the SNI name for its host name check).
 * rabbitmq-c's own host check would use the URL's host, so it is turned
 * off and OpenSSL's (X509_VERIFY_PARAM_set1_host) does it: a mismatch
 * fails the chain result that rabbitmq-c checks with verify_peer. */
static int mq_tls_sni(struct mq *m, amqp_socket_t *sock, const struct cfg_amqp *conf)
{
	SSL_CTX *ctx = amqp_ssl_socket_get_context(sock);
	char *copy;

	if (pthread_once(&mq_sni_once, mq_sni_init) != 0 || mq_sni_index < 0 || ctx == NULL)
		return mq_fail(m, ST_ERR_MQ, "tls", "cannot set up server_name_indication");
	copy = OPENSSL_strdup(conf->sni);
	if (copy == NULL)
		return mq_fail(m, ST_ERR_NOMEM, "tls", "out of memory");
	if (SSL_CTX_set_ex_data(ctx, mq_sni_index, copy) != 1) {
		OPENSSL_free(copy);
		return mq_fail(m, ST_ERR_MQ, "tls", "cannot set up server_name_indication");
	}
	SSL_CTX_set_info_callback(ctx, mq_sni_info_cb);
	if (conf->tls_verify) {
		if (X509_VERIFY_PARAM_set1_host(SSL_CTX_get0_param(ctx), conf->sni, 0) != 1)
			return mq_fail(m, ST_ERR_MQ, "tls", "cannot set the name to verify");
		amqp_ssl_socket_set_verify_hostname(sock, 0);
	}
	return ST_OK;
}

/*
 * TLS as the URL asks (cfg.h).  rabbitmq-c's context starts with an empty
 * trust store, so without cacertfile the system's store is loaded, else
 * every verified handshake would fail.  Verification covers the chain and
 * the host name of the URL (server_name_indication's when given: mq_tls_sni).
 * A file that cannot be loaded is a configuration fault: ST_ERR_MQ, which
 * the pool does not wait out.
 */
static int mq_tls_setup(struct mq *m, amqp_socket_t *sock, const struct cfg_amqp *conf)
{
	char why[200];

	if (conf->cacertfile != NULL) {
		if (amqp_ssl_socket_set_cacert(sock, conf->cacertfile) != AMQP_STATUS_OK) {
			snprintf(why, sizeof why, "cannot load cacertfile %s", conf->cacertfile);
			return mq_fail(m, ST_ERR_MQ, "tls", why);
		}
	} else if (conf->tls_verify) {
		SSL_CTX *ctx = amqp_ssl_socket_get_context(sock);

		if (ctx == NULL || SSL_CTX_set_default_verify_paths(ctx) != 1)
			return mq_fail(m, ST_ERR_MQ, "tls", "cannot load the system's CA certificates");
	}
	if (conf->certfile != NULL &&
	    amqp_ssl_socket_set_key(sock, conf->certfile, conf->keyfile) != AMQP_STATUS_OK) {
		snprintf(why, sizeof why, "cannot load certfile %s with keyfile %s", conf->certfile,
		         conf->keyfile);
		return mq_fail(m, ST_ERR_MQ, "tls", why);
	}
	amqp_ssl_socket_set_verify_peer(sock, conf->tls_verify ? 1 : 0);
	amqp_ssl_socket_set_verify_hostname(sock, conf->tls_verify ? 1 : 0);
	return conf->sni != NULL ? mq_tls_sni(m, sock, conf) : ST_OK;
}

/* A failed TLS connect, with OpenSSL's reason when it left one ("certificate
 * verify failed", "wrong version number" for a plain-text port). */
static int mq_tls_fail(struct mq *m, int status)
{
	char why[200], ossl[120] = "";
	unsigned long e = ERR_peek_last_error();

	if (e != 0) {
		ERR_error_string_n(e, ossl, sizeof ossl);
		ERR_clear_error();
	}
	snprintf(why, sizeof why, "%s%s%s", amqp_error_string2(status), ossl[0] != '\0' ? ": " : "", ossl);
	return mq_fail(m, ST_ERR_MQ_CONN, "tls handshake", why);
}


int mq_open_why(struct mq **out, const struct cfg_amqp *conf, int heartbeat_s, const char *name, char *why,
                size_t why_cap)
{
	struct mq *m = calloc(1, sizeof *m);
	amqp_socket_t *sock;
	struct timeval tv = { .tv_sec = 10 };
	amqp_table_entry_t prop[2], cap;
	amqp_table_t props;
	int rc, status;

	*out = NULL;
	if (why != NULL && why_cap > 0)
		snprintf(why, why_cap, "out of memory");
	if (m == NULL)
		return ST_ERR_NOMEM;
	m->next_seq = 1;
	for (int i = 0; i < MQ_MAX_HELD; i++)
		m->free_slots[i] = MQ_MAX_HELD - 1 - i;
	m->nfree = MQ_MAX_HELD;
	m->conn = amqp_new_connection();
	if (m->conn == NULL) {
		free(m);
		return ST_ERR_NOMEM;
	}
	sock = conf->tls ? amqp_ssl_socket_new(m->conn) : amqp_tcp_socket_new(m->conn);
	if (sock == NULL) {
		rc = mq_fail(m, ST_ERR_NOMEM, "socket", "cannot create socket");
		goto fail;
	}
	if (conf->tls) {
		rc = mq_tls_setup(m, sock, conf);
		if (rc != ST_OK)
			goto fail;
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
		if (strcmp(reason, "accepted") != 0) {
			rc = mq_fail(m, ST_ERR_MQ_CONN, "connect", reason);
			goto fail;
		}
	}
	if (conf->tls && status != AMQP_STATUS_OK && status != AMQP_STATUS_TIMEOUT) {
		rc = mq_tls_fail(m, status);
		goto fail;
	}
	rc = mq_status(m, status, "connect");
	if (rc != ST_OK) {
		if (rc == ST_ERR_TIMEOUT)
			rc = ST_ERR_MQ_CONN;
		goto fail;
	}
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
	if (rc != ST_OK)
		goto fail;
	if (amqp_channel_open(m->conn, MQ_CHANNEL) == NULL) {
		rc = mq_rpc(m, "channel.open");
		goto fail;
	}
	*out = m;
	return ST_OK;
fail:
	if (why != NULL && why_cap > 0)
		snprintf(why, why_cap, "%s", m->err);
	mq_close(&m);
	return rc != ST_OK ? rc : ST_ERR_MQ_CONN;
}

int mq_open_from_why(struct mq **out, const struct cfg_amqp *conf, int heartbeat_s, const char *name, int *node,
                     char *why, size_t cap)
{
	int count = 0, rc = ST_ERR_MQ_CONN;

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
	for (int i = 0; i < MQ_MAX_HELD; i++)
		if (m->env_used[i])
			amqp_destroy_envelope(&m->envs[i]);
	if (m->has_got)
		amqp_destroy_message(&m->got);
	if (!m->broken) {
		/* Polite close; its failure changes nothing for us. */
		(void)amqp_channel_close(m->conn, MQ_CHANNEL, AMQP_REPLY_SUCCESS);
		(void)amqp_connection_close(m->conn, AMQP_REPLY_SUCCESS);
	}
	if (amqp_destroy_connection(m->conn) != AMQP_STATUS_OK)
		LOG0(LOG_LEVEL_DEBUG, "amqp_destroy_connection reported an error");
	free(m);
	*mp = NULL;
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
	char shard[300];

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
	amqp_basic_consume_ok_t *ok;
	int rc;

	/* Per consumer (global=0): quorum queues refuse a channel-wide
	 * prefetch. */
	amqp_basic_qos(m->conn, MQ_CHANNEL, 0, (uint16_t)c->prefetch, 0);
	rc = mq_rpc(m, "basic.qos");
	if (rc != ST_OK)
		return rc;
	ok = amqp_basic_consume(m->conn, MQ_CHANNEL, mq_b(c->queue), amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
	if (ok == NULL)
		return mq_rpc(m, "basic.consume");
	snprintf(c->tag, sizeof c->tag, "%.*s", (int)ok->consumer_tag.len, (const char *)ok->consumer_tag.bytes);
	c->cancelled = false;
	return ST_OK;
}

int mq_consume_start(struct mq *m, const char *queue, int prefetch, bool single_active)
{
	struct mq_consumer *c;
	int rc;

	(void)single_active; /* a queue argument, set at declaration */
	if (m->nconsumers >= MQ_MAX_CONSUMERS || strlen(queue) >= sizeof c->queue)
		return mq_fail(m, ST_ERR_INVALID, "basic.consume", "too many consumers or queue name too long");
	c = &m->consumers[m->nconsumers];
	memset(c, 0, sizeof *c);
	snprintf(c->queue, sizeof c->queue, "%s", queue);
	c->prefetch = prefetch < 1 ? 1 : prefetch > 65535 ? 65535 : prefetch;
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

static const amqp_field_value_t *mq_header(const amqp_basic_properties_t *p, const char *key)
{
	size_t klen = strlen(key);

	if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG))
		return NULL;
	for (int i = 0; i < p->headers.num_entries; i++) {
		const amqp_table_entry_t *e = &p->headers.entries[i];
		if (e->key.len == klen && memcmp(e->key.bytes, key, klen) == 0)
			return &e->value;
	}
	return NULL;
}

static bool mq_field_int(const amqp_field_value_t *v, int64_t *out)
{
	switch (v->kind) {
	case AMQP_FIELD_KIND_I8: *out = v->value.i8; return true;
	case AMQP_FIELD_KIND_U8: *out = v->value.u8; return true;
	case AMQP_FIELD_KIND_I16: *out = v->value.i16; return true;
	case AMQP_FIELD_KIND_U16: *out = v->value.u16; return true;
	case AMQP_FIELD_KIND_I32: *out = v->value.i32; return true;
	case AMQP_FIELD_KIND_U32: *out = v->value.u32; return true;
	case AMQP_FIELD_KIND_I64: *out = v->value.i64; return true;
	case AMQP_FIELD_KIND_U64: *out = (int64_t)v->value.u64; return true;
	case AMQP_FIELD_KIND_TIMESTAMP: *out = (int64_t)v->value.u64; return true;
	default: return false;
	}
}

static bool mq_utf8_valid(const void *p, size_t len);

static void mq_set_routing_key(struct mq_delivery *d, amqp_bytes_t rk)
{
	snprintf(d->routing_key, sizeof d->routing_key, "%.*s", (int)rk.len, (const char *)rk.bytes);
	d->routing_key_valid = rk.len == 0 || (rk.len < sizeof d->routing_key && memchr(rk.bytes, 0, rk.len) == NULL &&
	                                       mq_utf8_valid(rk.bytes, rk.len));
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
	v = mq_header(p, MQ_HEADER_PUBLISHED_US);
	if (v != NULL && !mq_field_int(v, &d->published_us))
		d->published_us = 0;
	v = mq_header(p, "x-delivery-count");
	if (v != NULL && !mq_field_int(v, &d->delivery_count))
		d->delivery_count = 0;
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
	env = &m->envs[slot];
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
	amqp_envelope_t *env = &m->envs[slot];

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
		m->stash_head = (m->stash_head + 1) % MQ_MAX_HELD;
		m->nstash--;
	} else {
		slot = mq_read(m, timeout_ms);
		if (slot < 0)
			return slot;
	}
	mq_fill_from_slot(m, slot, d);
	return ST_OK;
}

int mq_service(struct mq *m, int timeout_ms)
{
	struct timespec start, now;

	if (clock_gettime(CLOCK_MONOTONIC, &start) != 0)
		return mq_fail(m, ST_ERR_MQ_CONN, "service", "clock_gettime failed");
	for (;;) {
		long left;
		int slot;

		if (clock_gettime(CLOCK_MONOTONIC, &now) != 0)
			return mq_fail(m, ST_ERR_MQ_CONN, "service", "clock_gettime failed");
		left = timeout_ms - ((now.tv_sec - start.tv_sec) * 1000L + (now.tv_nsec - start.tv_nsec) / 1000000L);
		if (left <= 0)
			return ST_OK;
		if (m->nfree == 0)
			return ST_ERR_INVALID; /* no room: the prefetch is larger than MQ_MAX_HELD */
		slot = mq_read(m, (int)left);
		if (slot == ST_ERR_TIMEOUT)
			continue;
		if (slot < 0)
			return slot;
		m->stash[(m->stash_head + m->nstash) % MQ_MAX_HELD] = slot;
		m->nstash++;
	}
}

void mq_delivery_release(struct mq *m, struct mq_delivery *d)
{
	if (d->priv != NULL && d->priv != &m->got && d->slot >= 0 && d->slot < MQ_MAX_HELD &&
	    m->env_used[d->slot] && d->priv == &m->envs[d->slot].message) {
		amqp_destroy_envelope(&m->envs[d->slot]);
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

/*
 * Properties and headers as JSON (mq_delivery_props_json), and back
 * (mq_build_props).
 *
 * Whatever a producer sent must serialise: the JSON is what a held event
 * keeps (held_events.props) and what a dead-letter copy made later restores
 * (outbox.props), and a copy that cannot be made would leave the message
 * unsettled.  So nothing here fails for the message's sake:
 * - A value JSON carries natively stays plain (string, integer, boolean,
 *   finite double, void as null).  Every other kind is a one-key object
 *   tagged with "$": byte arrays {"$bytes": base64} (so they come back as
 *   byte arrays), text that is not UTF-8 {"$utf8b64": base64},
 *   {"$timestamp"}, {"$f32"}, {"$decimal": [decimals, value]},
 *   {"$table": {...}}, {"$array": [...]}.  No plain value is an object, so
 *   the tags cannot be mistaken for data.
 * - Escaped (not UTF-8) values are kept; values that cannot be kept are
 *   dropped: a key that is not UTF-8 or holds a NUL byte, a repeated key,
 *   a value over MQ_VALUE_MAX, nesting deeper than MQ_DEPTH_MAX, a NaN or
 *   infinity, an unsigned 64-bit integer over INT64_MAX (a kind RabbitMQ
 *   refuses), headers past MQ_HEADERS_KEEP or past the total budget.  All
 *   of it in the order of the frame, so the same message always gives the
 *   same JSON.
 * - What was escaped or dropped is said in one short line, returned to the
 *   caller (for x-inbox-detail) and kept in the JSON as "inbox_note" for
 *   dead-letter copies made later from a stored row.
 * - The whole is at most MQ_PROPS_JSON_MAX bytes, well inside a TEXT
 *   column (65,535 bytes) and a frame (131,072).
 */
#define MQ_VALUE_MAX 4096   /* encoded bytes of one header value */
#define MQ_DEPTH_MAX 8      /* tables and arrays inside a header */
#define MQ_NOTE_MAX 360

struct mq_enc {
	char esc[112];          /* names of values kept as base64 */
	size_t esc_len;
	int esc_more;
	char drop[160];         /* "name (why)" of values dropped */
	size_t drop_len;
	int drop_more;
};

static void mq_list_add(char *list, size_t cap, size_t *len, int *more, const char *item)
{
	size_t n = strlen(item);

	/* Room is kept for ", +NN more" at the end; once one item did not
	 * fit, none after it is listed, so the list stays in frame order. */
	if (*more > 0 || *len + n + 2 + 12 >= cap) {
		(*more)++;
		return;
	}
	if (*len > 0) {
		memcpy(list + *len, ", ", 2);
		*len += 2;
	}
	memcpy(list + *len, item, n + 1);
	*len += n;
}

static void mq_escaped(struct mq_enc *e, const char *path)
{
	mq_list_add(e->esc, sizeof e->esc, &e->esc_len, &e->esc_more, path);
}

static void mq_dropped(struct mq_enc *e, const char *path, const char *why)
{
	char item[160];

	snprintf(item, sizeof item, "%s (%s)", path, why);
	mq_list_add(e->drop, sizeof e->drop, &e->drop_len, &e->drop_more, item);
}

/* The one line: "escaped (not UTF-8, kept as base64): a, b; dropped: c
 * (why)"; "" when nothing changed. */
static void mq_note_line(const struct mq_enc *e, char *out, size_t cap)
{
	char em[24] = "", dm[24] = "";

	if (e->esc_more > 0)
		snprintf(em, sizeof em, ", +%d more", e->esc_more);
	if (e->drop_more > 0)
		snprintf(dm, sizeof dm, ", +%d more", e->drop_more);
	snprintf(out, cap, "%s%s%s%s%s%s%s", e->esc_len > 0 ? "escaped (not UTF-8, kept as base64): " : "", e->esc,
	         em, e->esc_len > 0 && e->drop_len > 0 ? "; " : "", e->drop_len > 0 ? "dropped: " : "", e->drop, dm);
}

/* A key from the frame made safe for the note: printable ASCII, cut. */
static void mq_safe_name(char *out, size_t cap, const char *prefix, amqp_bytes_t key)
{
	size_t n = 0, plen = prefix != NULL ? strlen(prefix) : 0;

	if (cap == 0)
		return;
	for (size_t i = 0; i < plen && n + 1 < cap; i++)
		out[n++] = prefix[i];
	if (plen > 0 && n + 1 < cap)
		out[n++] = '.';
	for (size_t i = 0; i < key.len && i < 40 && n + 1 < cap; i++) {
		unsigned char ch = ((const unsigned char *)key.bytes)[i];
		out[n++] = ch > 0x20 && ch < 0x7f && ch != ';' ? (char)ch : '?';
	}
	if (key.len > 40 && n + 4 < cap) {
		memcpy(out + n, "...", 3);
		n += 3;
	}
	out[n] = '\0';
}

/* Strict UTF-8 as MariaDB's utf8mb4 and jansson take it: no overlong
 * forms, no surrogates, nothing past U+10FFFF. */
static bool mq_utf8_valid(const void *p, size_t len)
{
	const unsigned char *s = p;
	size_t i = 0;

	while (i < len) {
		unsigned char c = s[i];
		size_t need;
		uint32_t cp;

		if (c < 0x80) {
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf) {
			need = 1;
			cp = c & 0x1f;
		} else if (c >= 0xe0 && c <= 0xef) {
			need = 2;
			cp = c & 0x0f;
		} else if (c >= 0xf0 && c <= 0xf4) {
			need = 3;
			cp = c & 0x07;
		} else {
			return false;
		}
		if (len - i <= need)
			return false;
		for (size_t k = 1; k <= need; k++) {
			if ((s[i + k] & 0xc0) != 0x80)
				return false;
			cp = (cp << 6) | (s[i + k] & 0x3f);
		}
		if ((need == 2 && cp < 0x800) || (need == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
		    (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		i += need + 1;
	}
	return true;
}

static const char mq_b64chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* {"<tag>": base64 of b}; NULL only when memory ran out. */
static json_t *mq_b64_tagged(const char *tag, amqp_bytes_t b)
{
	const unsigned char *in = b.bytes;
	size_t olen = (b.len + 2) / 3 * 4;
	char *out = malloc(olen + 1);
	size_t o = 0;
	json_t *r;

	if (out == NULL)
		return NULL;
	for (size_t i = 0; i < b.len; i += 3) {
		uint32_t v = (uint32_t)in[i] << 16;
		if (i + 1 < b.len)
			v |= (uint32_t)in[i + 1] << 8;
		if (i + 2 < b.len)
			v |= in[i + 2];
		out[o++] = mq_b64chars[(v >> 18) & 63];
		out[o++] = mq_b64chars[(v >> 12) & 63];
		out[o++] = i + 1 < b.len ? mq_b64chars[(v >> 6) & 63] : '=';
		out[o++] = i + 2 < b.len ? mq_b64chars[v & 63] : '=';
	}
	out[o] = '\0';
	r = json_pack("{s:s}", tag, out);
	free(out);
	return r;
}

/* Decode base64 into pool memory; false when s is not base64. */
static bool mq_b64_decode(amqp_pool_t *pool, const char *s, amqp_bytes_t *out)
{
	size_t len = strlen(s), o = 0;
	unsigned char *buf;

	if (len % 4 != 0)
		return false;
	buf = amqp_pool_alloc(pool, len / 4 * 3 + 1);
	if (buf == NULL)
		return false;
	for (size_t i = 0; i < len; i += 4) {
		uint32_t v = 0;
		int pad = 0;
		for (int k = 0; k < 4; k++) {
			const char *c = s[i + k] != '\0' ? strchr(mq_b64chars, s[i + k]) : NULL;
			if (s[i + k] == '=' && i + 4 == len && k >= 2) {
				pad++;
				v <<= 6;
				continue;
			}
			if (c == NULL || pad > 0)
				return false;
			v = (v << 6) | (uint32_t)(c - mq_b64chars);
		}
		buf[o++] = (unsigned char)(v >> 16);
		if (pad < 2)
			buf[o++] = (unsigned char)(v >> 8);
		if (pad < 1)
			buf[o++] = (unsigned char)v;
	}
	out->bytes = buf;
	out->len = o;
	return true;
}

static json_t *mq_enc_value(struct mq_enc *e, const amqp_field_value_t *v, const char *path, int depth);

/* jansson refuses a NULL pointer even for no bytes; a decoder may give
 * one for an empty string. */
static json_t *mq_jstring(amqp_bytes_t b)
{
	return b.len == 0 ? json_string("") : json_stringn(b.bytes, b.len);
}

/* A table's entries into a JSON object, in frame order; max_entries and
 * budget bound what is kept (0: no bound of their own). */
static json_t *mq_enc_table(struct mq_enc *e, const amqp_table_t *t, const char *path, int depth,
                            int max_entries, size_t budget)
{
	json_t *o = json_object();
	size_t used = 2;
	int past = 0;

	if (o == NULL)
		return NULL;
	for (int i = 0; i < t->num_entries; i++) {
		const amqp_table_entry_t *en = &t->entries[i];
		char name[96], key[256];
		json_t *jv;
		size_t sz;

		mq_safe_name(name, sizeof name, path, en->key);
		if (en->key.len == 0 || en->key.len >= sizeof key || memchr(en->key.bytes, 0, en->key.len) != NULL ||
		    !mq_utf8_valid(en->key.bytes, en->key.len)) {
			mq_dropped(e, name, en->key.len == 0 ? "empty key" : "key not UTF-8");
			continue;
		}
		memcpy(key, en->key.bytes, en->key.len);
		key[en->key.len] = '\0';
		if (json_object_get(o, key) != NULL) {
			mq_dropped(e, name, "repeated key");
			continue;
		}
		if (max_entries > 0 && i >= max_entries) {
			past++;
			continue;
		}
		jv = mq_enc_value(e, &en->value, name, depth);
		if (jv == NULL)
			continue;
		sz = json_dumpb(jv, NULL, 0, JSON_COMPACT | JSON_ENCODE_ANY) + en->key.len * 6 + 4;
		if (budget > 0 && used + sz > budget) {
			json_decref(jv);
			mq_dropped(e, name, "over the size limit of all properties");
			continue;
		}
		if (json_object_set_new(o, key, jv) != 0) {
			json_decref(o);
			return NULL;
		}
		used += sz;
	}
	if (past > 0) {
		char what[80];
		snprintf(what, sizeof what, "%d headers past the first %d", past, max_entries);
		mq_dropped(e, path != NULL && path[0] ? path : "headers", what);
	}
	return o;
}

/* One value as JSON; NULL when it is dropped (noted) or memory ran out. */
static json_t *mq_enc_value(struct mq_enc *e, const amqp_field_value_t *v, const char *path, int depth)
{
	json_t *r = NULL;
	int64_t i;

	if (v->kind == AMQP_FIELD_KIND_U64 && v->value.u64 > INT64_MAX) {
		/* RabbitMQ never delivers the kind (it refuses 'L' frames), and
		 * a copy carrying it would be refused in turn. */
		mq_dropped(e, path, "unsigned 64-bit");
		return NULL;
	}
	if (v->kind == AMQP_FIELD_KIND_TIMESTAMP)
		return json_pack("{s:I}", "$timestamp", (json_int_t)v->value.u64);
	if (mq_field_int(v, &i))
		return json_integer(i);
	switch (v->kind) {
	case AMQP_FIELD_KIND_UTF8:
	case AMQP_FIELD_KIND_BYTES: {
		bool utf8 = mq_utf8_valid(v->value.bytes.bytes, v->value.bytes.len);
		if (v->value.bytes.len > MQ_VALUE_MAX) {
			char what[64];
			snprintf(what, sizeof what, "%zu bytes, over %d", v->value.bytes.len, MQ_VALUE_MAX);
			mq_dropped(e, path, what);
			return NULL;
		}
		if (v->kind == AMQP_FIELD_KIND_BYTES || !utf8) {
			if (!utf8)
				mq_escaped(e, path);
			return mq_b64_tagged(v->kind == AMQP_FIELD_KIND_BYTES ? "$bytes" : "$utf8b64", v->value.bytes);
		}
		return mq_jstring(v->value.bytes);
	}
	case AMQP_FIELD_KIND_BOOLEAN:
		return json_boolean(v->value.boolean);
	case AMQP_FIELD_KIND_VOID:
		return json_null();
	case AMQP_FIELD_KIND_F64:
	case AMQP_FIELD_KIND_F32: {
		double d = v->kind == AMQP_FIELD_KIND_F64 ? v->value.f64 : (double)v->value.f32;
		if (isnan(d) || isinf(d)) {
			mq_dropped(e, path, "not a finite number");
			return NULL;
		}
		return v->kind == AMQP_FIELD_KIND_F64 ? json_real(d) : json_pack("{s:f}", "$f32", d);
	}
	case AMQP_FIELD_KIND_DECIMAL:
		return json_pack("{s:[i,I]}", "$decimal", (int)v->value.decimal.decimals,
		                 (json_int_t)v->value.decimal.value);
	case AMQP_FIELD_KIND_TABLE:
	case AMQP_FIELD_KIND_ARRAY:
		if (depth >= MQ_DEPTH_MAX) {
			mq_dropped(e, path, "nested too deep");
			return NULL;
		}
		if (v->kind == AMQP_FIELD_KIND_TABLE) {
			json_t *t = mq_enc_table(e, &v->value.table, path, depth + 1, 0, 0);
			r = t != NULL ? json_pack("{s:o}", "$table", t) : NULL;
		} else {
			json_t *a = json_array();
			for (int k = 0; a != NULL && k < v->value.array.num_entries; k++) {
				char name[112];
				json_t *x;
				snprintf(name, sizeof name, "%s[%d]", path, k);
				x = mq_enc_value(e, &v->value.array.entries[k], name, depth + 1);
				if (x != NULL && json_array_append_new(a, x) != 0) {
					json_decref(a);
					a = NULL;
				}
			}
			r = a != NULL ? json_pack("{s:o}", "$array", a) : NULL;
		}
		if (r != NULL && json_dumpb(r, NULL, 0, JSON_COMPACT) > MQ_VALUE_MAX) {
			json_decref(r);
			mq_dropped(e, path, "over its size limit");
			return NULL;
		}
		return r;
	default: {
		char what[48];
		snprintf(what, sizeof what, "unknown field kind 0x%02x", v->kind);
		mq_dropped(e, path, what);
		return NULL;
	}
	}
}

/* A short-string property: plain when UTF-8, else {"$bytes": base64}. */
static int mq_enc_prop(struct mq_enc *e, json_t *o, const char *k, amqp_bytes_t b)
{
	json_t *v;

	if (b.len == 0 || (mq_utf8_valid(b.bytes, b.len) && memchr(b.bytes, 0, b.len) == NULL)) {
		v = mq_jstring(b);
	} else {
		mq_escaped(e, k);
		v = mq_b64_tagged("$bytes", b);
	}
	return v != NULL ? json_object_set_new(o, k, v) : -1;
}

char *mq_delivery_props_json_note(const struct mq_delivery *d, char *note, size_t note_cap)
{
	const amqp_basic_properties_t *p;
	struct mq_enc e = { .esc_len = 0 };
	char line[MQ_NOTE_MAX];
	json_t *o = json_object();
	char *out = NULL;
	size_t used;

	if (note != NULL && note_cap > 0)
		note[0] = '\0';
	if (o == NULL || d->priv == NULL)
		goto cleanup;
	p = mq_delivery_properties(d);
	if (p->_flags & AMQP_BASIC_CONTENT_TYPE_FLAG && mq_enc_prop(&e, o, "content_type", p->content_type) != 0)
		goto cleanup;
	if (p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG && mq_enc_prop(&e, o, "message_id", p->message_id) != 0)
		goto cleanup;
	if (p->_flags & AMQP_BASIC_TYPE_FLAG && mq_enc_prop(&e, o, "type", p->type) != 0)
		goto cleanup;
	if (p->_flags & AMQP_BASIC_CORRELATION_ID_FLAG &&
	    mq_enc_prop(&e, o, "correlation_id", p->correlation_id) != 0)
		goto cleanup;
	if (p->_flags & AMQP_BASIC_APP_ID_FLAG && mq_enc_prop(&e, o, "app_id", p->app_id) != 0)
		goto cleanup;
	if (p->_flags & AMQP_BASIC_TIMESTAMP_FLAG &&
	    json_object_set_new(o, "timestamp", json_integer((json_int_t)p->timestamp)) != 0)
		goto cleanup;
	/* Five short strings of at most 255 bytes: under 8 KiB even with
	 * every byte escaped, so the headers get the rest of the budget. */
	used = json_dumpb(o, NULL, 0, JSON_COMPACT) + MQ_NOTE_MAX * 2 + 64;
	if (p->_flags & AMQP_BASIC_HEADERS_FLAG) {
		json_t *h = mq_enc_table(&e, &p->headers, "", 0, MQ_HEADERS_KEEP, MQ_PROPS_JSON_MAX - used);
		if (h == NULL || json_object_set_new(o, "headers", h) != 0)
			goto cleanup;
	}
	mq_note_line(&e, line, sizeof line);
	if (line[0] != '\0' && json_object_set_new(o, "inbox_note", json_string(line)) != 0)
		goto cleanup;
	out = json_dumps(o, JSON_COMPACT);
	if (out != NULL && note != NULL && note_cap > 0)
		snprintf(note, note_cap, "%s", line);
cleanup:
	json_decref(o);
	return out;
}

char *mq_delivery_props_json(const struct mq_delivery *d)
{
	return mq_delivery_props_json_note(d, NULL, 0);
}

void mq_props_json_note(const char *props_json, char *buf, size_t cap)
{
	json_error_t err;
	json_t *o;

	if (cap == 0)
		return;
	buf[0] = '\0';
	if (props_json == NULL)
		return;
	o = json_loads(props_json, JSON_ALLOW_NUL, &err);
	if (json_is_string(json_object_get(o, "inbox_note")))
		snprintf(buf, cap, "%s", json_string_value(json_object_get(o, "inbox_note")));
	json_decref(o);
}

int mq_delivery_header(const struct mq_delivery *d, const char *key, char *buf, size_t cap)
{
	const amqp_field_value_t *v;
	int n;

	if (d->priv == NULL)
		return ST_ERR_NOT_FOUND;
	v = mq_header(mq_delivery_properties(d), key);
	if (v == NULL || (v->kind != AMQP_FIELD_KIND_UTF8 && v->kind != AMQP_FIELD_KIND_BYTES))
		return ST_ERR_NOT_FOUND;
	n = snprintf(buf, cap, "%.*s", (int)v->value.bytes.len, (const char *)v->value.bytes.bytes);
	return n < 0 || (size_t)n >= cap ? ST_ERR_INVALID : ST_OK;
}

int mq_confirm_select(struct mq *m)
{
	if (m->confirming)
		return ST_OK;
	amqp_confirm_select(m->conn, MQ_CHANNEL);
	if (mq_rpc(m, "confirm.select") != ST_OK)
		return ST_ERR_MQ_CONN;
	m->confirming = true;
	return ST_OK;
}

/* Everything an outgoing message's properties point at lives here for the
 * duration of one publish. */
struct mq_outprops {
	amqp_basic_properties_t p;
	amqp_table_entry_t h[MQ_HEADERS_MAX];
	json_t *saved;
	amqp_pool_t pool;       /* decoded bytes, nested tables and arrays */
};

/* A saved short string: plain, or {"$bytes": base64} when it was not
 * UTF-8. */
static void mq_props_set_str(amqp_pool_t *pool, amqp_bytes_t *dst, amqp_flags_t *flags, amqp_flags_t flag,
                             json_t *v)
{
	json_t *b = json_object_get(v, "$bytes");

	if (json_is_string(v)) {
		dst->bytes = (void *)json_string_value(v);
		dst->len = json_string_length(v);
		*flags |= flag;
	} else if (json_is_string(b) && mq_b64_decode(pool, json_string_value(b), dst) && dst->len < 256) {
		*flags |= flag;
	}
}

/* The inverse of mq_enc_value: false when v is not a value we wrote (it
 * is then left out). */
static bool mq_dec_value(amqp_pool_t *pool, json_t *v, amqp_field_value_t *out, int depth)
{
	const char *tag;
	json_t *x;

	if (json_is_string(v)) {
		out->kind = AMQP_FIELD_KIND_UTF8;
		out->value.bytes.bytes = (void *)json_string_value(v);
		out->value.bytes.len = json_string_length(v);
		return true;
	}
	if (json_is_integer(v)) {
		out->kind = AMQP_FIELD_KIND_I64;
		out->value.i64 = json_integer_value(v);
		return true;
	}
	if (json_is_real(v)) {
		out->kind = AMQP_FIELD_KIND_F64;
		out->value.f64 = json_real_value(v);
		return true;
	}
	if (json_is_boolean(v)) {
		out->kind = AMQP_FIELD_KIND_BOOLEAN;
		out->value.boolean = json_is_true(v);
		return true;
	}
	if (json_is_null(v)) {
		out->kind = AMQP_FIELD_KIND_VOID;
		return true;
	}
	if (!json_is_object(v) || json_object_size(v) != 1 || depth > MQ_DEPTH_MAX)
		return false;
	tag = json_object_iter_key(json_object_iter(v));
	x = json_object_iter_value(json_object_iter(v));
	if ((strcmp(tag, "$bytes") == 0 || strcmp(tag, "$utf8b64") == 0) && json_is_string(x)) {
		out->kind = tag[1] == 'b' ? AMQP_FIELD_KIND_BYTES : AMQP_FIELD_KIND_UTF8;
		return mq_b64_decode(pool, json_string_value(x), &out->value.bytes);
	}
	if (strcmp(tag, "$timestamp") == 0 && json_is_integer(x)) {
		out->kind = AMQP_FIELD_KIND_TIMESTAMP;
		out->value.u64 = (uint64_t)json_integer_value(x);
		return true;
	}
	if (strcmp(tag, "$f32") == 0 && json_is_number(x)) {
		out->kind = AMQP_FIELD_KIND_F32;
		out->value.f32 = (float)json_number_value(x);
		return true;
	}
	if (strcmp(tag, "$decimal") == 0 && json_is_array(x) && json_array_size(x) == 2 &&
	    json_is_integer(json_array_get(x, 0)) && json_is_integer(json_array_get(x, 1))) {
		out->kind = AMQP_FIELD_KIND_DECIMAL;
		out->value.decimal.decimals = (uint8_t)json_integer_value(json_array_get(x, 0));
		out->value.decimal.value = (uint32_t)json_integer_value(json_array_get(x, 1));
		return true;
	}
	if (strcmp(tag, "$table") == 0 && json_is_object(x)) {
		size_t cap = json_object_size(x);
		amqp_table_entry_t *es = amqp_pool_alloc(pool, (cap > 0 ? cap : 1) * sizeof *es);
		const char *k;
		json_t *y;
		int n = 0;

		if (es == NULL)
			return false;
		json_object_foreach(x, k, y) {
			es[n].key = amqp_cstring_bytes(k);
			if (mq_dec_value(pool, y, &es[n].value, depth + 1))
				n++;
		}
		out->kind = AMQP_FIELD_KIND_TABLE;
		out->value.table.num_entries = n;
		out->value.table.entries = es;
		return true;
	}
	if (strcmp(tag, "$array") == 0 && json_is_array(x)) {
		size_t cap = json_array_size(x), i;
		amqp_field_value_t *es = amqp_pool_alloc(pool, (cap > 0 ? cap : 1) * sizeof *es);
		json_t *y;
		int n = 0;

		if (es == NULL)
			return false;
		json_array_foreach(x, i, y) {
			if (mq_dec_value(pool, y, &es[n], depth + 1))
				n++;
		}
		out->kind = AMQP_FIELD_KIND_ARRAY;
		out->value.array.num_entries = n;
		out->value.array.entries = es;
		return true;
	}
	return false;
}

static int mq_build_props(struct mq_outprops *o, const struct mq_message *msg)
{
	amqp_basic_properties_t *p = &o->p;
	int n = 0;

	memset(p, 0, sizeof *p);
	o->saved = NULL;
	init_amqp_pool(&o->pool, 4096);
	p->_flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG;
	p->delivery_mode = AMQP_DELIVERY_PERSISTENT;
	p->content_type = amqp_cstring_bytes("application/json");
	if (msg->props_json != NULL) {
		json_error_t jerr;
		json_t *hs;
		const char *k;
		json_t *v;
		/* Saved headers first, ours after them, all in the array. */
		int keep = MQ_HEADERS_MAX - msg->nheaders - 1;

		o->saved = json_loads(msg->props_json, JSON_ALLOW_NUL, &jerr);
		if (o->saved == NULL || !json_is_object(o->saved))
			return ST_ERR_INVALID;
		mq_props_set_str(&o->pool, &p->content_type, &p->_flags, AMQP_BASIC_CONTENT_TYPE_FLAG,
		                 json_object_get(o->saved, "content_type"));
		mq_props_set_str(&o->pool, &p->message_id, &p->_flags, AMQP_BASIC_MESSAGE_ID_FLAG,
		                 json_object_get(o->saved, "message_id"));
		mq_props_set_str(&o->pool, &p->type, &p->_flags, AMQP_BASIC_TYPE_FLAG, json_object_get(o->saved, "type"));
		mq_props_set_str(&o->pool, &p->correlation_id, &p->_flags, AMQP_BASIC_CORRELATION_ID_FLAG,
		                 json_object_get(o->saved, "correlation_id"));
		mq_props_set_str(&o->pool, &p->app_id, &p->_flags, AMQP_BASIC_APP_ID_FLAG,
		                 json_object_get(o->saved, "app_id"));
		v = json_object_get(o->saved, "timestamp");
		if (json_is_integer(v)) {
			p->timestamp = (uint64_t)json_integer_value(v);
			p->_flags |= AMQP_BASIC_TIMESTAMP_FLAG;
		}
		if (keep > MQ_HEADERS_KEEP)
			keep = MQ_HEADERS_KEEP;
		hs = json_object_get(o->saved, "headers");
		json_object_foreach(hs, k, v) {
			amqp_table_entry_t *e = &o->h[n];
			if (n >= keep)
				break;
			/* Broker bookkeeping of the original delivery is not ours to
			 * copy into a new message. */
			if (strcmp(k, "x-delivery-count") == 0 || strncmp(k, "x-inbox-", 8) == 0)
				continue;
			e->key = amqp_cstring_bytes(k);
			if (mq_dec_value(&o->pool, v, &e->value, 0))
				n++;
		}
	}
	if (msg->message_id != NULL) {
		p->message_id = amqp_cstring_bytes(msg->message_id);
		p->_flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
	}
	if (msg->type != NULL) {
		p->type = amqp_cstring_bytes(msg->type);
		p->_flags |= AMQP_BASIC_TYPE_FLAG;
	}
	for (int i = 0; i < msg->nheaders && n < MQ_HEADERS_MAX; i++, n++) {
		o->h[n].key = amqp_cstring_bytes(msg->headers[i].key);
		o->h[n].value.kind = AMQP_FIELD_KIND_UTF8;
		o->h[n].value.value.bytes = amqp_cstring_bytes(msg->headers[i].value);
	}
	if (msg->published_us > 0 && n < MQ_HEADERS_MAX) {
		/* An integer header: the worker reads it as a number. */
		o->h[n].key = amqp_cstring_bytes(MQ_HEADER_PUBLISHED_US);
		o->h[n].value.kind = AMQP_FIELD_KIND_I64;
		o->h[n].value.value.i64 = msg->published_us;
		n++;
	}
	if (n > 0) {
		p->headers.num_entries = n;
		p->headers.entries = o->h;
		p->_flags |= AMQP_BASIC_HEADERS_FLAG;
	}
	return ST_OK;
}

int mq_publish(struct mq *m, const struct mq_message *msg)
{
	struct mq_outprops o;
	amqp_bytes_t body = { .len = msg->len, .bytes = (void *)msg->body };
	int rc;

	if (m->broken)
		return ST_ERR_MQ_CONN;
	rc = mq_build_props(&o, msg);
	if (rc == ST_OK) {
		rc = mq_status(m, amqp_basic_publish(m->conn, MQ_CHANNEL, mq_b(msg->exchange),
		                                     mq_b(msg->routing_key), msg->mandatory, 0, &o.p, body),
		               "basic.publish");
		if (rc == ST_ERR_TIMEOUT)
			rc = mq_fail(m, ST_ERR_MQ_CONN, "basic.publish", "timed out");
		if (rc == ST_OK && m->confirming) {
			struct mq_track *t = &m->track[m->next_seq % MQ_TRACK_MAX];
			if (t->seq != 0 && t->outcome == MQ_OUTCOME_PENDING)
				m->track_pending--; /* overwritten: no longer tracked */
			*t = (struct mq_track){ .seq = m->next_seq, .outcome = MQ_OUTCOME_PENDING };
			m->track_pending++;
			if (msg->mandatory)
				m->mandatory_seq = m->next_seq;
			m->next_seq++;
		}
	}
	json_decref(o.saved);
	empty_amqp_pool(&o.pool);
	return rc;
}

int mq_props_json_wire(const char *props_json, void *buf, size_t cap, size_t *len)
{
	struct mq_message msg = { .props_json = props_json };
	amqp_bytes_t out = { .len = cap, .bytes = buf };
	struct mq_outprops o;
	int rc = mq_build_props(&o, &msg);

	if (rc == ST_OK) {
		int n = amqp_encode_properties(AMQP_BASIC_CLASS, &o.p, out);
		if (n < 0)
			rc = ST_ERR_INVALID;
		else
			*len = (size_t)n;
	}
	json_decref(o.saved);
	empty_amqp_pool(&o.pool);
	return rc;
}

int mq_publish_at(struct mq *m, const struct mq_message *msg, int64_t published_us)
{
	struct mq_message stamped = *msg;

	stamped.published_us = published_us;
	return mq_publish(m, &stamped);
}

uint64_t mq_unconfirmed(const struct mq *m)
{
	return m->next_seq - 1 - m->confirmed;
}

uint64_t mq_next_seq(const struct mq *m)
{
	return m->next_seq;
}

enum mq_outcome mq_outcome(const struct mq *m, uint64_t seq)
{
	const struct mq_track *t = &m->track[seq % MQ_TRACK_MAX];

	if (seq == 0 || t->seq != seq)
		return MQ_OUTCOME_UNKNOWN;
	if (t->returned)
		return MQ_OUTCOME_RETURNED;
	return (enum mq_outcome)t->outcome;
}

/* Settle one tracked publish (a no-op for one settled or no longer tracked). */
static void mq_track_settle(struct mq *m, uint64_t seq, enum mq_outcome o)
{
	struct mq_track *t = &m->track[seq % MQ_TRACK_MAX];

	if (t->seq != seq || t->outcome != MQ_OUTCOME_PENDING)
		return;
	t->outcome = (uint8_t)o;
	m->track_pending--;
}

/* An ack or nack for tag, or with multiple for every publish up to tag. */
static void mq_track_confirm(struct mq *m, uint64_t tag, bool multiple, enum mq_outcome o)
{
	uint64_t from = tag;

	if (m->track_pending == 0)
		return;
	if (multiple)
		from = tag >= MQ_TRACK_MAX ? tag - MQ_TRACK_MAX + 1 : 1;
	for (uint64_t seq = from; seq <= tag; seq++)
		mq_track_settle(m, seq, o);
}

/* A channel.close or connection.close from the broker, as a log line. */
static int mq_closed_by_broker(struct mq *m, const amqp_frame_t *f, const char *what)
{
	char buf[200];

	if (f->payload.method.id == AMQP_CHANNEL_CLOSE_METHOD) {
		const amqp_channel_close_t *c = f->payload.method.decoded;
		snprintf(buf, sizeof buf, "channel closed by broker: %u %.*s", c->reply_code, (int)c->reply_text.len,
		         (const char *)c->reply_text.bytes);
		return mq_fail(m, ST_ERR_MQ, what, buf);
	}
	{
		const amqp_connection_close_t *c = f->payload.method.decoded;
		snprintf(buf, sizeof buf, "connection closed by broker: %u %.*s", c->reply_code,
		         (int)c->reply_text.len, (const char *)c->reply_text.bytes);
		return mq_fail(m, ST_ERR_MQ_CONN, what, buf);
	}
}

/* Read frames until every publish is settled.  Acks and nacks may cover
 * several publishes ("multiple"); a basic.return (unroutable mandatory
 * publish) is followed by its ack, so it is remembered as a failure.  Each
 * tracked publish gets its own outcome (mq_outcome). */
int mq_wait_confirms(struct mq *m, int timeout_ms)
{
	struct timespec start, now;
	int rc = ST_OK;

	if (!m->confirming)
		return ST_OK;
	if (clock_gettime(CLOCK_MONOTONIC, &start) != 0)
		return mq_fail(m, ST_ERR_MQ_CONN, "confirm", "clock_gettime failed");
	while (m->confirmed + 1 < m->next_seq || m->track_pending > 0) {
		amqp_frame_t f;
		struct timeval tv;
		long left;
		int st;

		if (clock_gettime(CLOCK_MONOTONIC, &now) != 0)
			return mq_fail(m, ST_ERR_MQ_CONN, "confirm", "clock_gettime failed");
		left = timeout_ms - ((now.tv_sec - start.tv_sec) * 1000L + (now.tv_nsec - start.tv_nsec) / 1000000L);
		if (left <= 0)
			return mq_fail(m, ST_ERR_MQ_CONN, "confirm", "no confirm within the time-out");
		tv.tv_sec = left / 1000;
		tv.tv_usec = (left % 1000) * 1000;
		amqp_maybe_release_buffers(m->conn);
		st = amqp_simple_wait_frame_noblock(m->conn, &f, &tv);
		if (st != AMQP_STATUS_OK) {
			rc = mq_status(m, st, "confirm");
			return rc == ST_ERR_TIMEOUT ? mq_fail(m, ST_ERR_MQ_CONN, "confirm", "timed out") : rc;
		}
		if (f.frame_type != AMQP_FRAME_METHOD)
			continue; /* header/body of a returned message */
		switch (f.payload.method.id) {
		case AMQP_BASIC_ACK_METHOD: {
			amqp_basic_ack_t *a = f.payload.method.decoded;
			m->confirmed = a->multiple ? a->delivery_tag : (a->delivery_tag > m->confirmed ? a->delivery_tag : m->confirmed);
			/* Single acks may arrive out of order only for tags above
			 * confirmed; RabbitMQ confirms in order per channel, so the
			 * high-water mark is exact.  The tracked outcomes do not
			 * rely on it. */
			mq_track_confirm(m, a->delivery_tag, a->multiple != 0, MQ_OUTCOME_ACKED);
			break;
		}
		case AMQP_BASIC_NACK_METHOD: {
			amqp_basic_nack_t *a = f.payload.method.decoded;
			m->confirmed = a->delivery_tag > m->confirmed ? a->delivery_tag : m->confirmed;
			m->nacked = true;
			mq_track_confirm(m, a->delivery_tag, a->multiple != 0, MQ_OUTCOME_NACKED);
			break;
		}
		case AMQP_BASIC_RETURN_METHOD: {
			/* No delivery tag: the latest mandatory publish (see mq.h).
			 * Its ack follows and settles it. */
			struct mq_track *t = &m->track[m->mandatory_seq % MQ_TRACK_MAX];
			if (m->mandatory_seq != 0 && t->seq == m->mandatory_seq && t->outcome == MQ_OUTCOME_PENDING)
				t->returned = true;
			m->nacked = true;
			break;
		}
		case AMQP_CHANNEL_CLOSE_METHOD:
		case AMQP_CONNECTION_CLOSE_METHOD:
			return mq_closed_by_broker(m, &f, "confirm");
		default:
			break;
		}
	}
	if (m->nacked) {
		m->nacked = false;
		snprintf(m->err, sizeof m->err, "publish nacked or returned unroutable");
		return ST_ERR_MQ_NACK;
	}
	return rc;
}

int mq_publish_confirmed(struct mq *m, const struct mq_message *msg, int timeout_ms)
{
	int rc = mq_confirm_select(m);

	if (rc == ST_OK)
		rc = mq_publish(m, msg);
	if (rc == ST_OK)
		rc = mq_wait_confirms(m, timeout_ms);
	return rc;
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

int mq_queue_declare_bind_type(struct mq *m, const char *queue, const char *exchange,
                               const char *binding, bool quorum)
{
	amqp_table_entry_t e;
	amqp_table_t args = { .num_entries = quorum ? 1 : 0, .entries = &e };
	int rc;

	e.key = amqp_cstring_bytes("x-queue-type");
	e.value.kind = AMQP_FIELD_KIND_UTF8;
	e.value.value.bytes = amqp_cstring_bytes("quorum");
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
