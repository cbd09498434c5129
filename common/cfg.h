/*
 * cfg.h - configuration: one declarative table of settings (name, flag,
 * default, bounds) read from the environment, then from flags of the same
 * meaning (--threads overrides INBOX_THREADS), then checked once.
 *
 * Each *_URL may instead come from the file named by *_URL_FILE (container
 * secrets); the file's content is trimmed of trailing white space.  Setting
 * both the URL and the _FILE variable is an error.
 *
 * Ownership: cfg_load fills a caller-provided struct cfg and allocates its
 * strings; cfg_free releases them.  The loaded cfg is then read-only and
 * passed as `const struct cfg *` to every thread.  Passwords live only in
 * amqp.password and db.password; the *_redacted strings are safe to log.
 */
#ifndef INBOX_CFG_H
#define INBOX_CFG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "log.h"

struct cfg_amqp {
	char *host;
	int port;        /* default 5672, 5671 for amqps */
	char *user;
	char *password;
	char *vhost;     /* percent-decoded; "/" when the URL says %2f or nothing */
	bool tls;        /* amqps:// */
	/* amqps:// options, named as in RabbitMQ's URI spec (?cacertfile=...);
	 * NULL when unset.  Without cacertfile the system's CA store is used. */
	char *cacertfile;
	char *certfile;  /* client certificate, with keyfile */
	char *keyfile;
	bool tls_verify; /* verify=verify_peer (default) | verify_none */
	/* server_name_indication=NAME: the name the ClientHello carries and,
	 * with verify_peer, the name the certificate must be issued to (as in
	 * RabbitMQ's URI spec); NULL: the URL's host for both. */
	char *sni;
	char *redacted;  /* the URL with the password replaced by "***" */
	/* The next node of the same cluster (INBOX_AMQP_URL lists several,
	 * comma-separated), NULL after the last; owned by this node and
	 * freed with it by url_amqp_free. */
	struct cfg_amqp *next;
};

struct cfg_db {
	char *host;
	int port;        /* default 3306 */
	char *user;
	char *password;
	char *database;
	char *socket;    /* ?socket=/path, NULL when unset */
	/* TLS (SPEC.md): ssl=1 or any ssl-* option turns it on, and then the
	 * server certificate (chain and host name) is verified unless
	 * ssl-verify=0.  ssl=0 with another ssl-* option is an error. */
	bool ssl;        /* TLS on */
	bool ssl_verify; /* verify the server certificate (only with ssl) */
	char *ssl_ca;    /* ?ssl-ca=/path: CA file, NULL when unset */
	char *ssl_capath; /* ?ssl-capath=/dir: CA directory */
	char *ssl_cert;  /* ?ssl-cert=/path: client certificate (with ssl-key) */
	char *ssl_key;   /* ?ssl-key=/path: its private key */
	int connect_timeout_s; /* ?connect-timeout=5, default 5 */
	char *redacted;
	/* The next node of the same cluster (comma-separated URLs), NULL
	 * after the last; owned by this node, freed by url_db_free. */
	struct cfg_db *next;
};

/* The type of the queues the worker declares beside the inbox queue (the
 * DLQ; inbox-loadgen's verify queue follows it).  A classic queue lives on
 * one node of a RabbitMQ cluster: while that node is down it cannot be
 * declared (404) and what is routed to it is dropped.  On a cluster, use
 * quorum.  Classic is the default so that a running deployment's DLQ,
 * declared classic before, still matches its declaration. */
enum cfg_queue_type {
	CFG_QUEUE_CLASSIC = 0,
	CFG_QUEUE_QUORUM = 1,
};

enum cfg_ordering {
	CFG_ORDERING_SHARED = 0,  /* one queue, holds put events in order */
	CFG_ORDERING_SHARDED = 1, /* consistent-hash exchange, one active consumer per shard */
};

/* INBOX_ENVELOPE: how deliveries are read (common/envelope.h). */
enum cfg_envelope {
	CFG_ENVELOPE_NATIVE = 0,      /* SPEC.md's message format */
	CFG_ENVELOPE_CLOUDEVENTS = 1, /* structured or binary mode, by the delivery */
	CFG_ENVELOPE_MASSTRANSIT = 2,
	CFG_ENVELOPE_AUTO = 3,        /* each delivery by its content type and headers */
};

/* INBOX_OUTBOX_DISPATCH: who publishes the outbox rows a batch commits. */
enum cfg_outbox_dispatch {
	CFG_DISPATCH_RELAY = 0,  /* the relay, woken by the commit */
	CFG_DISPATCH_THREAD = 1, /* the committing thread, from memory; the relay sweeps */
};

/* INBOX_EMIT_ENVELOPE: how emitted events are written. */
enum cfg_emit_envelope {
	CFG_EMIT_NATIVE = 0,
	CFG_EMIT_CLOUDEVENTS = 1, /* structured mode */
};

/* The largest INBOX_BATCH: the one bound of a batch, which cfg enforces
 * and every array sized for a batch (the worker's, the broker
 * connection's held deliveries) is checked against at compile time. */
#define CFG_BATCH_MAX 500

struct cfg {
	struct cfg_amqp amqp;       /* INBOX_AMQP_URL / --amqp-url */
	struct cfg_db db;           /* INBOX_DB_URL / --db-url: the worker's account */
	struct cfg_db migrate_db;   /* INBOX_MIGRATE_DB_URL / --migrate-db-url: the schema
	                             * owner for `migrate`; host NULL when unset */
	int threads;                /* INBOX_THREADS 4 [1,256] */
	int prefetch;               /* INBOX_PREFETCH 32 [1,65535] */
	char *consumer;             /* INBOX_CONSUMER order-status, dedup key alphabet, 1-64 */
	char *queue;                /* INBOX_QUEUE orders.inbox */
	char *exchange;             /* INBOX_EXCHANGE orders */
	char *dlx;                  /* INBOX_DLX orders.dlx */
	char *dlq;                  /* INBOX_DLQ orders.inbox.dlq */
	enum cfg_queue_type dlq_type; /* INBOX_DLQ_TYPE classic|quorum */
	char *out_exchange;         /* INBOX_OUT_EXCHANGE orders.out */
	char *bind;                 /* INBOX_BIND more routing keys, "a,b"; "" = none */
	long max_body;              /* INBOX_MAX_BODY 65536 [64, 16 MiB] */
	long retention_s;           /* INBOX_RETENTION 7d, >= 1m */
	long cleanup_interval_s;    /* INBOX_CLEANUP_INTERVAL 10m, >= 1s: janitor's retention passes */
	long hold_ttl_s;            /* INBOX_HOLD_TTL 10m, >= 1s */
	char *metrics_addr;         /* INBOX_METRICS_ADDR 127.0.0.1:9464, "" = off */
	enum log_format log_format; /* INBOX_LOG_FORMAT text */
	enum log_level log_level;   /* INBOX_LOG_LEVEL info */
	int delivery_limit;         /* INBOX_DELIVERY_LIMIT 5 [1,1000]: x-delivery-limit */
	int max_retries;            /* INBOX_MAX_RETRIES 8 [0,100]: deadlock/lock-timeout retries */
	int heartbeat_s;            /* INBOX_HEARTBEAT 30 [0,600] */
	enum cfg_ordering ordering; /* INBOX_ORDERING shared|sharded */
	int shards;                 /* INBOX_SHARDS 4 [1,64] */
	char *migrations_dir;       /* INBOX_MIGRATIONS_DIR, default: the installed/source dir */
	int batch;                  /* INBOX_BATCH 100 [1,CFG_BATCH_MAX], <= prefetch: messages per transaction */
	char *lifecycle;            /* INBOX_LIFECYCLE "", a definition file; "": the built-in one */
	enum cfg_envelope envelope; /* INBOX_ENVELOPE native */
	char *type_map;             /* INBOX_TYPE_MAP "theirs=Ours,...", checked; "" = none */
	char *order_id_field;       /* INBOX_ORDER_ID_FIELD "subject", a dotted path, or
	                             * "cloudevents=F,masstransit=F"; "" = per envelope (cfg_order_id_field) */
	enum cfg_emit_envelope emit_envelope; /* INBOX_EMIT_ENVELOPE native */
	enum cfg_outbox_dispatch outbox_dispatch; /* INBOX_OUTBOX_DISPATCH relay */
	long outbox_sweep_s;        /* INBOX_OUTBOX_SWEEP 30s [1s, 1d]: the relay's delay for dispatched rows */
	int http_max_attempts;      /* INBOX_HTTP_MAX_ATTEMPTS 10 [1,1000]: calls to a destination per row */
};

enum cfg_result {
	CFG_OK = 0,
	CFG_HELP = 1,    /* --help was given: caller prints cfg_print_help, exits 0 */
	CFG_VERSION = 2, /* --version was given: caller prints it, exits 0 */
	CFG_ERROR = -1,  /* err holds one line naming the setting; exit 2 */
};

/*
 * Load from environ and argv (argv[0] is skipped; unknown flags and
 * positional arguments are errors).  On CFG_ERROR, err (size errlen) holds
 * one line such as "INBOX_THREADS: not a number: 'abc'" and *out holds
 * nothing that needs freeing.
 */
enum cfg_result cfg_load(struct cfg *out, int argc, char **argv, char *err, size_t errlen);
void cfg_free(struct cfg *c);

/* The account `migrate` uses: INBOX_MIGRATE_DB_URL, else INBOX_DB_URL. */
const struct cfg_db *cfg_migrate_db(const struct cfg *c);

/*
 * Overwrite with '*' the password of every URL given as a flag ("--x-url V"
 * or "--x-url=V") in argv, in place.  The argument memory is what
 * /proc/PID/cmdline and `ps` show to every local user; call this at start,
 * after cfg_load copied what it needs (argv's strings must be writable: a
 * program's own argv is).  The window between exec and this call is why
 * --help recommends the environment or a *_URL_FILE instead.
 */
void cfg_scrub_argv(int argc, char **argv);

/* Print every setting with its variable, flag, default and meaning; keep
 * (may be NULL: every setting) picks the rows by variable name, as in
 * cfg_print_doc. */
void cfg_print_help(FILE *f, const char *usage_line, bool (*keep)(const char *env));

/*
 * The same table as documentation, so that --help, the man pages and the
 * README's settings table cannot say different things: CFG_DOC_MAN is a
 * pandoc markdown definition list (the SETTINGS section of inbox-worker(1)
 * and inbox-loadgen(1), built by man/meson.build), CFG_DOC_README the
 * README's table, rows in the table's order.  Both add a row's longer notes
 * to its --help text.  keep (may be NULL: every setting) picks the rows by
 * variable name.
 */
enum cfg_doc_format { CFG_DOC_MAN, CFG_DOC_README };
void cfg_print_doc(FILE *f, enum cfg_doc_format fmt, bool (*keep)(const char *env));

/* Whole seconds as the largest unit that divides them: 604800 -> "7d". */
void cfg_format_duration(char *dst, size_t dstlen, long s);

/* The order id field INBOX_ORDER_ID_FIELD (the checked value v) gives env
 * (cloudevents or masstransit): "subject" or a path (len bytes, not
 * NUL-terminated), or NULL when it names none for env (the envelope's
 * default applies). */
const char *cfg_order_id_field(const char *v, enum cfg_envelope env, size_t *len);

/* Building blocks, exposed for tests, loadgen and the other readers of
 * settings.  Each returns 0 or -1 with a reason in err (without the
 * setting's name).  The URL settings are parsed by url.h. */
int cfg_parse_duration(const char *s, long *seconds, char *err, size_t errlen);
int cfg_parse_long(const char *s, long min, long max, long *out, char *err, size_t errlen);

#endif
