/*
 * cfg.c - the worker's configuration: defaults, then INBOX_* variables, then
 * --flags, each value checked once at start-up.
 *
 * Why it is shaped so:
 * - Every setting is one row of cfg_settings[] (variable, flag, default,
 *   kind, bounds, help).  Loading, --help, the man pages, the README's
 *   table (cfg_print_doc) and the error messages all read the same row, so
 *   a setting cannot be documented one way and parsed another.  Defaults are strings parsed by the same code as user input.
 * - Every error is one line that starts with the variable's name and says
 *   what is wrong with the value ("INBOX_THREADS: not a number: 'abc'"), so
 *   the operator knows what to fix without reading code.  Echoed values are
 *   cut and stripped of control characters; URLs are never echoed, because a
 *   URL that failed to parse cannot be trusted to show where its password
 *   is.  A parsed URL keeps a `redacted` copy with the password as "***".
 * - Numbers go through strtol with end-pointer and range checks (no atoi):
 *   "8x", "" and "99999999999999999999" are errors, not 8, 0 and LONG_MAX.
 */
#include "cfg.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "addr.h"
#include "config.h"
#include "msg.h"
#include "url.h"

#define CFG_FILE_MAX 4096  /* a *_URL_FILE larger than this is not a URL */
#define CFG_ECHO_MAX ADDR_ECHO_MAX /* bytes of a bad value quoted back in an error */
#define CFG_REASON_MAX 256

/* Values are written through int * into enum fields; keep that honest. */
_Static_assert(sizeof(enum log_level) == sizeof(int), "enum log_level is an int");
_Static_assert(sizeof(enum log_format) == sizeof(int), "enum log_format is an int");
_Static_assert(sizeof(enum cfg_ordering) == sizeof(int), "enum cfg_ordering is an int");
_Static_assert(sizeof(enum cfg_envelope) == sizeof(int), "enum cfg_envelope is an int");
_Static_assert(sizeof(enum cfg_emit_envelope) == sizeof(int), "enum cfg_emit_envelope is an int");

/* ---- small helpers ------------------------------------------------------ */

/* ASCII only, as addr.c's (the same line): <ctype.h>'s follow the
 * locale, and a one-line test is not worth a shared header. */
static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

void cfg_format_duration(char *dst, size_t dstlen, long s)
{
	if (s != 0 && s % 86400 == 0)
		snprintf(dst, dstlen, "%ldd", s / 86400);
	else if (s != 0 && s % 3600 == 0)
		snprintf(dst, dstlen, "%ldh", s / 3600);
	else if (s != 0 && s % 60 == 0)
		snprintf(dst, dstlen, "%ldm", s / 60);
	else
		snprintf(dst, dstlen, "%lds", s);
}

/* ---- numbers and durations --------------------------------------------- */

int cfg_parse_long(const char *s, long min, long max, long *out, char *err, size_t errlen)
{
	char shown[CFG_ECHO_MAX + 4];
	char *end;
	long v;

	addr_echo(shown, sizeof shown, s);
	/* strtol alone would accept " 8", "+8" and "" (as 0). */
	if (s == NULL || !(is_digit(s[0]) || (s[0] == '-' && is_digit(s[1])))) {
		addr_errf(err, errlen, "not a number: '%s'", shown);
		return -1;
	}
	errno = 0;
	v = strtol(s, &end, 10);
	if (*end != '\0') {
		addr_errf(err, errlen, "not a number: '%s'", shown);
		return -1;
	}
	if (errno == ERANGE || v < min || v > max) {
		addr_errf(err, errlen, "out of range [%ld, %ld]: '%s'", min, max, shown);
		return -1;
	}
	*out = v;
	return 0;
}

int cfg_parse_duration(const char *s, long *seconds, char *err, size_t errlen)
{
	char shown[CFG_ECHO_MAX + 4];
	char *end;
	long v, mult;

	addr_echo(shown, sizeof shown, s);
	if (s == NULL || !is_digit(s[0]))
		goto bad;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno == ERANGE)
		goto too_large;
	switch (*end) {
	case '\0': mult = 1; break; /* a bare number means seconds */
	case 's': mult = 1; break;
	case 'm': mult = 60; break;
	case 'h': mult = 3600; break;
	case 'd': mult = 86400; break;
	default: goto bad;
	}
	if (*end != '\0' && end[1] != '\0')
		goto bad;
	if (v > LONG_MAX / mult)
		goto too_large;
	*seconds = v * mult;
	return 0;
bad:
	addr_errf(err, errlen, "bad duration: '%s' (use e.g. 30s, 10m, 7d)", shown);
	return -1;
too_large:
	addr_errf(err, errlen, "duration too large: '%s'", shown);
	return -1;
}


/* ---- the table of settings --------------------------------------------- */

enum cfg_kind {
	K_INT,      /* int field, [min, max] */
	K_LONG,     /* long field, [min, max] */
	K_DURATION, /* long field in seconds, [min, max] */
	K_NAME,     /* char *, 1..max characters of [A-Za-z0-9._:-] */
	K_PATH,     /* char *, not empty */
	K_ADDR,     /* char *, host:port, or "" for off */
	K_FILE,     /* char *, a file's path, or "" for the built-in */
	K_ENUM,     /* int-sized enum field, index into choices */
	K_AMQP_URL, /* struct cfg_amqp */
	K_DB_URL,   /* struct cfg_db */
	K_TYPE_MAP, /* char *, "theirs=Ours,..." (check_type_map); may be empty */
	K_FIELD,    /* char *, "subject" or a dotted path (check_field); may be empty */
	K_BINDINGS, /* char *, routing-key patterns separated by commas (check_bindings); may be empty */
};

struct cfg_setting {
	const char *env;
	const char *flag;      /* without the leading "--" */
	const char *file_env;  /* URL kinds: read the value from this file */
	const char *file_flag;
	const char *def;       /* NULL: computed by default_value() */
	enum cfg_kind kind;
	size_t off;            /* of the field in struct cfg */
	long min, max;
	const char *const *choices; /* K_ENUM, NULL-terminated, index = value */
	const char *help;      /* one line of --help */
	const char *more;      /* NULL, or notes the man page and README add */
};

static const char *const log_format_choices[] = {
	[LOG_FORMAT_TEXT] = "text", [LOG_FORMAT_JSON] = "json", NULL,
};
static const char *const log_level_choices[] = {
	[LOG_LEVEL_ERROR] = "error", [LOG_LEVEL_WARN] = "warn", [LOG_LEVEL_INFO] = "info", [LOG_LEVEL_DEBUG] = "debug",
	NULL,
};
static const char *const queue_type_choices[] = {
	[CFG_QUEUE_CLASSIC] = "classic", [CFG_QUEUE_QUORUM] = "quorum", NULL,
};
static const char *const ordering_choices[] = {
	[CFG_ORDERING_SHARED] = "shared", [CFG_ORDERING_SHARDED] = "sharded", NULL,
};
static const char *const envelope_choices[] = {
	[CFG_ENVELOPE_NATIVE] = "native", [CFG_ENVELOPE_CLOUDEVENTS] = "cloudevents",
	[CFG_ENVELOPE_MASSTRANSIT] = "masstransit", [CFG_ENVELOPE_AUTO] = "auto", NULL,
};
static const char *const emit_envelope_choices[] = {
	[CFG_EMIT_NATIVE] = "native", [CFG_EMIT_CLOUDEVENTS] = "cloudevents", NULL,
};

static const char *const outbox_dispatch_choices[] = {
	[CFG_DISPATCH_RELAY] = "relay", [CFG_DISPATCH_THREAD] = "thread", NULL,
};

#define F(field) offsetof(struct cfg, field)

static const struct cfg_setting cfg_settings[] = {
	{ "INBOX_AMQP_URL", "amqp-url", "INBOX_AMQP_URL_FILE", "amqp-url-file",
	  "amqp://guest:guest@127.0.0.1:5672/%2f", K_AMQP_URL, F(amqp), 0, 0, NULL,
	  "broker; amqps:// for TLS, with ?cacertfile=PATH&certfile=PATH&keyfile=PATH"
	  "&verify=verify_peer|verify_none (the server certificate and host name are verified "
	  "unless verify_none); several comma-separated URLs are the nodes of one cluster, tried in turn", NULL },
	{ "INBOX_DB_URL", "db-url", "INBOX_DB_URL_FILE", "db-url-file",
	  "mysql://inbox:inbox@127.0.0.1:3306/inbox", K_DB_URL, F(db), 0, 0, NULL,
	  "the worker's database account; options ?ssl-ca=PATH&ssl-capath=DIR&ssl-cert=PATH"
	  "&ssl-key=PATH&ssl=1&ssl-verify=0&socket=PATH&connect-timeout=S (any ssl option turns TLS on; "
	  "the server certificate is verified unless ssl-verify=0); several comma-separated URLs are "
	  "the nodes of one cluster, tried in turn", NULL },
	{ "INBOX_MIGRATE_DB_URL", "migrate-db-url", "INBOX_MIGRATE_DB_URL_FILE", "migrate-db-url-file",
	  "", K_DB_URL, F(migrate_db), 0, 0, NULL,
	  "the schema owner's account for `migrate` (DDL); unset: INBOX_DB_URL", NULL },
	{ "INBOX_THREADS", "threads", NULL, NULL, "4", K_INT, F(threads), 1, 256, NULL,
	  "worker threads, each with its own broker and database connection", NULL },
	{ "INBOX_PREFETCH", "prefetch", NULL, NULL, "200", K_INT, F(prefetch), 1, 65535, NULL,
	  "basic.qos prefetch per thread",
	  "Twice the default INBOX_BATCH.  Any value up to 65535 works: a thread keeps room for every "
	  "delivery its prefetch lets the broker send, so it services heartbeats through a database "
	  "outage whatever the value." },
	{ "INBOX_CONSUMER", "consumer", NULL, NULL, "order-status", K_NAME, F(consumer), 1, 64,
	  NULL, "this handler's name: the first part of the dedup key", NULL },
	{ "INBOX_QUEUE", "queue", NULL, NULL, "orders.inbox", K_NAME, F(queue), 1, 255, NULL,
	  "the queue consumed", NULL },
	{ "INBOX_EXCHANGE", "exchange", NULL, NULL, "orders", K_NAME, F(exchange), 1, 255, NULL,
	  "the exchange the queue is bound to (key order.#)", NULL },
	{ "INBOX_BIND", "bind", NULL, NULL, "", K_BINDINGS, F(bind), 0, 0, NULL,
	  "more routing keys the queue takes from INBOX_EXCHANGE, comma-separated (ticket.#)",
	  "A worker downstream of another consumes what the first emits: INBOX_EXCHANGE the first's "
	  "INBOX_OUT_EXCHANGE, INBOX_BIND its aggregate's events (`ticket.#`; the first publishes each "
	  "emitted event as `<aggregate>.<type>`).  Topic patterns, each 1-255 of [A-Za-z0-9._:-] and "
	  "`*`, `#`." },
	{ "INBOX_DLX", "dlx", NULL, NULL, "orders.dlx", K_NAME, F(dlx), 1, 255, NULL,
	  "dead-letter exchange", NULL },
	{ "INBOX_DLQ", "dlq", NULL, NULL, "orders.inbox.dlq", K_NAME, F(dlq), 1, 255, NULL,
	  "dead-letter queue", NULL },
	{ "INBOX_DLQ_TYPE", "dlq-type", NULL, NULL, "classic", K_ENUM, F(dlq_type), 0, 0, queue_type_choices,
	  "type of the dead-letter queue (and inbox-loadgen's verify queue): quorum on a RabbitMQ cluster, "
	  "where a classic queue is lost while its one node is down", NULL },
	{ "INBOX_OUT_EXCHANGE", "out-exchange", NULL, NULL, "orders.out", K_NAME,
	  F(out_exchange), 1, 255, NULL, "exchange the outbox publishes to", NULL },
	{ "INBOX_MAX_BODY", "max-body", NULL, NULL, "65536", K_LONG, F(max_body), 64,
	  16L * 1024 * 1024, NULL, "bytes; larger bodies are dead-lettered as too-large; twice it, plus 136 KiB, must fit "
	  "the database's max_allowed_packet (checked at connect)",
	  "Events held under a larger value before a restart are still released or expired whole "
	  "(stored rows are read up to their columns' widths: 16 MiB body, 64 KiB properties).  "
	  "A held or dead-lettered body travels as hex: each connection reads max_allowed_packet and "
	  "the worker refuses, with one line naming both, a value that cannot fit (exit 2); MariaDB's "
	  "default 16 MiB carries bodies up to about 8.3 MB.  A batch's writes are cut into requests "
	  "below that limit, never sent larger." },
	{ "INBOX_RETENTION", "retention", NULL, NULL, "7d", K_DURATION, F(retention_s), 60,
	  3650L * 86400, NULL,
	  "how long inbox rows and sent outbox rows are kept; must exceed the longest redelivery window", NULL },
	{ "INBOX_CLEANUP_INTERVAL", "cleanup-interval", NULL, NULL, "10m", K_DURATION,
	  F(cleanup_interval_s), 1, 3650L * 86400, NULL,
	  "how often the pool's janitor starts a retention cleanup pass", NULL },
	{ "INBOX_HOLD_TTL", "hold-ttl", NULL, NULL, "10m", K_DURATION, F(hold_ttl_s), 1,
	  3650L * 86400, NULL, "how long an out-of-order event waits for its prerequisite", NULL },
	{ "INBOX_METRICS_ADDR", "metrics-addr", NULL, NULL, "127.0.0.1:9464", K_ADDR,
	  F(metrics_addr), 0, 0, NULL, "HTTP address of /metrics, /healthz, /readyz; empty: off",
	  "host:port (an address or a name, e.g. localhost:9464), :port (every IPv4 address) or "
	  "[v6]:port ([::]:9464: every IPv6 one); the configuration check and the server read it with "
	  "the same parser." },
	{ "INBOX_LOG_FORMAT", "log-format", NULL, NULL, "text", K_ENUM, F(log_format), 0, 0,
	  log_format_choices, "json gives one JSON object a line", NULL },
	{ "INBOX_LOG_LEVEL", "log-level", NULL, NULL, "info", K_ENUM, F(log_level), 0, 0,
	  log_level_choices, "least severe level logged", NULL },
	{ "INBOX_DELIVERY_LIMIT", "delivery-limit", NULL, NULL, "5", K_INT, F(delivery_limit),
	  1, 1000, NULL, "x-delivery-limit: deliveries before a message is dead-lettered",
	  "The broker counts them on the quorum inbox queue: a message that keeps crashing workers "
	  "goes to the DLQ.  A policy (delivery-limit) lowers it on a running queue but cannot raise "
	  "it: the lower of argument and policy wins." },
	{ "INBOX_MAX_RETRIES", "max-retries", NULL, NULL, "8", K_INT, F(max_retries), 0, 100,
	  NULL, "retries of a transaction after a deadlock or lock wait timeout", NULL },
	{ "INBOX_HEARTBEAT", "heartbeat", NULL, NULL, "30", K_INT, F(heartbeat_s), 0, 600, NULL,
	  "AMQP heartbeat in seconds; 0 turns it off", NULL },
	{ "INBOX_ORDERING", "ordering", NULL, NULL, "shared", K_ENUM, F(ordering), 0, 0,
	  ordering_choices, "one shared queue with holds, or sharded with one active consumer "
	  "per shard", NULL },
	{ "INBOX_SHARDS", "shards", NULL, NULL, "4", K_INT, F(shards), 1, 64, NULL,
	  "shard queues when ordering is sharded", NULL },
	{ "INBOX_BATCH", "batch", NULL, NULL, "100", K_INT, F(batch), 1, CFG_BATCH_MAX, NULL,
	  "most messages per transaction (what is already waiting; never waits for more); at most INBOX_PREFETCH",
	  "Left unset, a smaller INBOX_PREFETCH lowers it." },
	{ "INBOX_MIGRATIONS_DIR", "migrations-dir", NULL, NULL, NULL, K_PATH,
	  F(migrations_dir), 0, 0, NULL, "directory of the SQL migrations", NULL },
	{ "INBOX_LIFECYCLE", "lifecycle", NULL, NULL, "", K_FILE, F(lifecycle), 0, 0, NULL,
	  "the lifecycle definition file the worker decides by; empty: the built-in order lifecycle "
	  "(lifecycles/order.json)",
	  "`run` loads and checks it at start-up (see doc/lifecycle.md) and refuses, exit 2 with one "
	  "line, a definition that is invalid, arrival-order dependent or needs a schema change." },
	{ "INBOX_ENVELOPE", "envelope", NULL, NULL, "native", K_ENUM, F(envelope), 0, 0, envelope_choices,
	  "how deliveries are read: our message format, CloudEvents 1.0 (structured or binary mode), "
	  "MassTransit, or auto (each delivery by its content type and headers)",
	  "auto: `application/cloudevents+json` or a `cloudEvents:specversion` header is CloudEvents, "
	  "`application/vnd.masstransit+json` MassTransit, anything else native.  See doc/envelopes.md." },
	{ "INBOX_TYPE_MAP", "type-map", NULL, NULL, "", K_TYPE_MAP, F(type_map), 0, 0, NULL,
	  "producer event types to ours: theirs=Ours,... (com.example.payment.authorized=PaymentAuthorized)",
	  "Ours is a type or alias of the definition that runs (INBOX_LIFECYCLE), judged once it is loaded.  "
	  "For MassTransit the key is the message URN without `urn:message:`; an unmapped type that is "
	  "one of ours (for MassTransit: whose last `:` segment is) needs no entry." },
	{ "INBOX_ORDER_ID_FIELD", "order-id-field", NULL, NULL, "", K_FIELD, F(order_id_field), 0, 0, NULL,
	  "where an envelope's key (order id) is: subject, a dotted path into the data (data.order.id), or one "
	  "field per envelope (cloudevents=subject,masstransit=message.order.id); empty: subject for CloudEvents, "
	  "the definition's key in camelCase (orderId) for MassTransit",
	  "A single value applies to the envelopes it fits: subject to CloudEvents, message.PATH to MassTransit, "
	  "any other path to both; an envelope it does not fit keeps its default.  A value that fits no envelope "
	  "INBOX_ENVELOPE receives (any value under native) is refused at start.  See doc/envelopes.md." },
	{ "INBOX_EMIT_ENVELOPE", "emit-envelope", NULL, NULL, "native", K_ENUM, F(emit_envelope), 0, 0,
	  emit_envelope_choices, "the envelope of emitted events: native, or cloudevents (structured mode)", NULL },
	{ "INBOX_OUTBOX_DISPATCH", "outbox-dispatch", NULL, NULL, "thread", K_ENUM, F(outbox_dispatch), 0, 0,
	  outbox_dispatch_choices, "who publishes the outbox rows a batch commits: the committing thread itself, "
	  "right after its commit, from memory, or the relay thread, woken by the commit",
	  "thread: the relay only sweeps rows no thread published, after INBOX_OUTBOX_SWEEP.  See doc/fleet.md." },
	{ "INBOX_OUTBOX_SWEEP", "outbox-sweep", NULL, NULL, "30s", K_DURATION, F(outbox_sweep_s), 1, 86400L, NULL,
	  "with INBOX_OUTBOX_DISPATCH=thread: how old an outbox row its own thread did not publish must be "
	  "before the relay publishes it",
	  "That thread publishes the rows right after its commit and marks them sent "
	  "in its next write; only a crash between the two (or a publish that failed) leaves a row for the "
	  "relay, under the same message id (a duplicate downstream if it had gone out)." },
	{ "INBOX_HTTP_MAX_ATTEMPTS", "http-max-attempts", NULL, NULL, "10", K_INT, F(http_max_attempts), 1, 1000, NULL,
	  "calls to an HTTP destination of the lifecycle per emitted event before it is dead-lettered as "
	  "delivery-failed (408, 425, 429, 5xx and no answer are called again; any other 4xx at once)",
	  "The waits double from 1 s to 60 s (half fixed, half jitter) and honour Retry-After: the default "
	  "keeps calling for about five minutes.  See doc/lifecycle.md." },
};

#define CFG_NSETTINGS (sizeof cfg_settings / sizeof cfg_settings[0])

/* The source tree's migrations when running from a build directory, else
 * the installed ones. */
static const char *default_value(const struct cfg_setting *s)
{
	struct stat st;

	if (s->def != NULL)
		return s->def;
	if (stat(INBOX_SOURCE_MIGRATIONS_DIR, &st) == 0 && S_ISDIR(st.st_mode))
		return INBOX_SOURCE_MIGRATIONS_DIR;
	return INBOX_MIGRATIONS_DIR_DEFAULT;
}

static int check_name(const char *v, long max, char *reason, size_t n)
{
	char shown[CFG_ECHO_MAX + 4];

	/* A name is stored beside message ids (the consumer is the first part
	 * of the inbox key): the same rule, msg.c's. */
	if (msg_id_valid(v, strlen(v), 1, (size_t)max))
		return 0;
	addr_echo(shown, sizeof shown, v);
	addr_errf(reason, n, "must be 1-%ld characters of [A-Za-z0-9._:-]: '%s'", max, shown);
	return -1;
}

/* A name lc_load takes for an event type: a letter, then letters, digits
 * or '_', at most 64 (lifecycle_load.c's name_ok). */
static bool type_name_ok(const char *s, size_t n)
{
	if (n == 0 || n > 64 || !((s[0] >= 'A' && s[0] <= 'Z') || (s[0] >= 'a' && s[0] <= 'z')))
		return false;
	for (size_t i = 1; i < n; i++)
		if (!((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= 'a' && s[i] <= 'z') || is_digit(s[i]) || s[i] == '_'))
			return false;
	return true;
}

/* INBOX_TYPE_MAP: comma-separated theirs=Ours pairs, theirs 1-255
 * printable characters without ',' and '=', Ours a type name.  Whether
 * Ours is a type of the definition that runs is judged once that is
 * loaded (env_check_settings): here the built-in one is bound, and a
 * user's definition has other types.  The envelope layer
 * (common/envelope.c) scans the checked string. */
static int check_type_map(const char *v, char *reason, size_t n)
{
	const char *p = v;
	char shown[CFG_ECHO_MAX + 4];

	addr_echo(shown, sizeof shown, v);
	while (*p != '\0') {
		const char *comma = strchr(p, ',');
		const char *end = comma != NULL ? comma : p + strlen(p);
		const char *eq = memchr(p, '=', (size_t)(end - p));

		if (eq == NULL || eq == p || eq + 1 == end || (size_t)(eq - p) > 255) {
			addr_errf(reason, n, "must be theirs=Ours pairs separated by commas: '%s'", shown);
			return -1;
		}
		for (const char *q = p; q < eq; q++) {
			if ((unsigned char)*q <= 0x20 || (unsigned char)*q > 0x7e) {
				addr_errf(reason, n, "a producer type holds a space or a non-printable byte: '%s'", shown);
				return -1;
			}
		}
		if (!type_name_ok(eq + 1, (size_t)(end - eq - 1))) {
			addr_errf(reason, n,
			          "'%.*s' is not an event type name (a letter, then letters, digits or _; at most 64): '%s'",
			          (int)((end - eq - 1) > CFG_ECHO_MAX ? CFG_ECHO_MAX : (end - eq - 1)), eq + 1, shown);
			return -1;
		}
		p = comma != NULL ? comma + 1 : end;
		if (comma != NULL && *p == '\0') {
			addr_errf(reason, n, "ends with a comma: '%s'", shown);
			return -1;
		}
	}
	return 0;
}

/* INBOX_BIND: topic patterns separated by commas, each 1-255 characters
 * of a queue name's alphabet and the wildcards. */
static int check_bindings(const char *v, char *reason, size_t n)
{
	char shown[CFG_ECHO_MAX + 4];
	size_t run = 0;

	addr_echo(shown, sizeof shown, v);
	for (const char *p = v;; p++) {
		if (*p == ',' || *p == '\0') {
			if (run == 0 && (*p == ',' || p != v)) {
				addr_errf(reason, n, "an empty routing key between commas: '%s'", shown);
				return -1;
			}
			if (*p == '\0')
				return 0;
			run = 0;
			continue;
		}
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || is_digit(*p) || strchr("._:-*#", *p) != NULL) ||
		    ++run > 255) {
			addr_errf(reason, n, "must be routing keys of [A-Za-z0-9._:-*#], 1-255 each, separated by commas: "
			          "'%s'", shown);
			return -1;
		}
	}
}

/* A path into an envelope's data: dot-separated names of [A-Za-z0-9_$-],
 * at most 255 characters. */
static bool path_ok(const char *v, size_t len)
{
	size_t seg = 0;

	if (len == 0 || len > 255)
		return false;
	for (size_t i = 0; i <= len; i++) {
		char c = i < len ? v[i] : '\0';

		if (c == '.' || c == '\0') {
			if (seg == 0)
				return false;
			seg = 0;
			continue;
		}
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || is_digit(c) || c == '_' || c == '-' ||
		      c == '$'))
			return false;
		seg++;
	}
	return true;
}

/* "subject" or a path, as one entry of INBOX_ORDER_ID_FIELD. */
static bool field_ok(const char *v, size_t len)
{
	return (len == 7 && memcmp(v, "subject", 7) == 0) || path_ok(v, len);
}

static bool has_prefix(const char *v, size_t len, const char *prefix)
{
	size_t pl = strlen(prefix);

	return len > pl && memcmp(v, prefix, pl) == 0;
}

const char *cfg_order_id_field(const char *v, enum cfg_envelope env, size_t *len)
{
	const char *want = env == CFG_ENVELOPE_CLOUDEVENTS ? "cloudevents=" : "masstransit=";
	size_t wl = strlen(want);

	if (v == NULL || v[0] == '\0' || (env != CFG_ENVELOPE_CLOUDEVENTS && env != CFG_ENVELOPE_MASSTRANSIT))
		return NULL;
	if (strchr(v, '=') == NULL) {
		*len = strlen(v);
		/* subject is CloudEvents' attribute; message is MassTransit's
		 * name for its data; any other path is into either's data. */
		if (strcmp(v, "subject") == 0)
			return env == CFG_ENVELOPE_CLOUDEVENTS ? v : NULL;
		if (has_prefix(v, *len, "message."))
			return env == CFG_ENVELOPE_MASSTRANSIT ? v : NULL;
		return v;
	}
	for (const char *p = v; *p != '\0';) {
		const char *comma = strchr(p, ',');
		const char *end = comma != NULL ? comma : p + strlen(p);

		if ((size_t)(end - p) > wl && memcmp(p, want, wl) == 0) {
			*len = (size_t)(end - p - (ptrdiff_t)wl);
			return p + wl;
		}
		p = comma != NULL ? comma + 1 : end;
	}
	return NULL;
}

/* INBOX_ORDER_ID_FIELD: "subject", a path into the data, or one field per
 * envelope, "cloudevents=FIELD,masstransit=FIELD" (either may be left
 * out: that envelope keeps its default).  cfg_order_id_field reads it. */
static int check_field(const char *v, char *reason, size_t n)
{
	char shown[CFG_ECHO_MAX + 4];
	bool seen_ce = false, seen_mt = false;

	addr_echo(shown, sizeof shown, v);
	if (v[0] == '\0')
		return 0;
	if (strchr(v, '=') == NULL) {
		if (field_ok(v, strlen(v)))
			return 0;
		goto bad;
	}
	for (const char *p = v; *p != '\0';) {
		const char *comma = strchr(p, ',');
		const char *end = comma != NULL ? comma : p + strlen(p);
		const char *eq = memchr(p, '=', (size_t)(end - p));
		size_t nl;
		bool *seen;

		if (eq == NULL || eq == p || !field_ok(eq + 1, (size_t)(end - eq - 1)))
			goto bad;
		nl = (size_t)(eq - p);
		if (nl == 6 && memcmp(p, "native", 6) == 0) {
			addr_errf(reason, n, "a native message carries its key in its own field; name cloudevents or "
			                     "masstransit: '%s'", shown);
			return -1;
		}
		if (nl == 11 && memcmp(p, "cloudevents", 11) == 0) {
			seen = &seen_ce;
		} else if (nl == 11 && memcmp(p, "masstransit", 11) == 0) {
			seen = &seen_mt;
			if ((size_t)(end - eq - 1) == 7 && memcmp(eq + 1, "subject", 7) == 0) {
				addr_errf(reason, n, "a MassTransit message has no subject (a path into its message, e.g. "
				                     "masstransit=message.orderId): '%s'", shown);
				return -1;
			}
		} else {
			addr_errf(reason, n, "'%.*s' is not an envelope (cloudevents or masstransit): '%s'",
			          (int)(nl > CFG_ECHO_MAX ? CFG_ECHO_MAX : nl), p, shown);
			return -1;
		}
		if (*seen) {
			addr_errf(reason, n, "%.*s is named twice: '%s'", (int)nl, p, shown);
			return -1;
		}
		*seen = true;
		p = comma != NULL ? comma + 1 : end;
		if (comma != NULL && *p == '\0')
			goto bad;
	}
	return 0;
bad:
	addr_errf(reason, n, "must be subject, a dotted path such as data.order.id, or "
	                     "cloudevents=FIELD,masstransit=FIELD: '%s'", shown);
	return -1;
}

/* INBOX_ORDER_ID_FIELD must apply to an envelope the worker receives
 * under its INBOX_ENVELOPE: a value no delivery would read is a mistake
 * to say at start, not a dead letter per message. */
static int check_field_fits(const struct cfg *c, char *err, size_t errlen)
{
	static const char *const hint[] = {
		[CFG_ENVELOPE_NATIVE] = "a native message carries its key in its own field",
		[CFG_ENVELOPE_CLOUDEVENTS] = "for CloudEvents: subject, data.PATH, PATH or cloudevents=FIELD",
		[CFG_ENVELOPE_MASSTRANSIT] = "for MassTransit: message.PATH, PATH or masstransit=FIELD",
		[CFG_ENVELOPE_AUTO] = "",
	};
	char shown[CFG_ECHO_MAX + 4];
	size_t len;
	bool fits;

	if (c->order_id_field == NULL || c->order_id_field[0] == '\0')
		return 0;
	switch (c->envelope) {
	case CFG_ENVELOPE_CLOUDEVENTS:
	case CFG_ENVELOPE_MASSTRANSIT:
		fits = cfg_order_id_field(c->order_id_field, c->envelope, &len) != NULL;
		break;
	case CFG_ENVELOPE_AUTO:
		fits = true; /* every value check_field takes fits one of the two */
		break;
	default:
		fits = false;
		break;
	}
	if (fits)
		return 0;
	addr_echo(shown, sizeof shown, c->order_id_field);
	addr_errf(err, errlen, "INBOX_ORDER_ID_FIELD: applies to no envelope that INBOX_ENVELOPE=%s receives (%s): '%s'",
	          envelope_choices[c->envelope], hint[c->envelope], shown);
	return -1;
}

/* host:port, :port or [v6]:port (addr_hostport_parse, the parser the
 * metrics server uses too); "" turns the listener off. */
static int check_addr(const char *v, char *reason, size_t n)
{
	struct addr_hostport a;

	if (v[0] == '\0')
		return 0;
	return addr_hostport_parse(v, &a, reason, n);
}

/* Parse `raw` into the field of `s`.  On error, reason has no name. */
static int parse_value(const struct cfg_setting *s, const char *raw, struct cfg *out,
                       char *reason, size_t n)
{
	void *field = (char *)out + s->off;
	char shown[CFG_ECHO_MAX + 4];
	char lim[32];
	long v;

	switch (s->kind) {
	case K_INT:
	case K_LONG:
		if (cfg_parse_long(raw, s->min, s->max, &v, reason, n) != 0)
			return -1;
		if (s->kind == K_INT)
			*(int *)field = (int)v;
		else
			*(long *)field = v;
		return 0;
	case K_DURATION:
		if (cfg_parse_duration(raw, &v, reason, n) != 0)
			return -1;
		if (v < s->min || v > s->max) {
			addr_echo(shown, sizeof shown, raw);
			cfg_format_duration(lim, sizeof lim, v < s->min ? s->min : s->max);
			addr_errf(reason, n, "must be at %s %s: '%s'", v < s->min ? "least" : "most",
			        lim, shown);
			return -1;
		}
		*(long *)field = v;
		return 0;
	case K_NAME:
	case K_PATH:
	case K_ADDR:
	case K_FILE:
		if (s->kind == K_NAME && check_name(raw, s->max, reason, n) != 0)
			return -1;
		if (s->kind == K_ADDR && check_addr(raw, reason, n) != 0)
			return -1;
		if (s->kind == K_PATH && raw[0] == '\0') {
			addr_errf(reason, n, "must not be empty");
			return -1;
		}
		*(char **)field = strdup(raw);
		if (*(char **)field == NULL) {
			addr_errf(reason, n, "out of memory");
			return -1;
		}
		return 0;
	case K_ENUM: {
		char list[128] = "";
		size_t used = 0;

		for (int i = 0; s->choices[i] != NULL; i++) {
			if (strcasecmp(raw, s->choices[i]) == 0) {
				*(int *)field = i;
				return 0;
			}
			used += (size_t)snprintf(list + used, sizeof list - used, "%s%s",
			                         i > 0 ? ", " : "", s->choices[i]);
			if (used >= sizeof list)
				break;
		}
		addr_echo(shown, sizeof shown, raw);
		addr_errf(reason, n, "must be one of %s: '%s'", list, shown);
		return -1;
	}
	case K_TYPE_MAP:
	case K_FIELD:
	case K_BINDINGS:
		if (s->kind == K_TYPE_MAP   ? check_type_map(raw, reason, n) != 0
		    : s->kind == K_FIELD    ? check_field(raw, reason, n) != 0
		                            : check_bindings(raw, reason, n) != 0)
			return -1;
		*(char **)field = strdup(raw);
		if (*(char **)field == NULL) {
			addr_errf(reason, n, "out of memory");
			return -1;
		}
		return 0;
	case K_AMQP_URL:
		return url_parse_amqp(raw, field, reason, n);
	case K_DB_URL:
		/* Only an optional URL has an empty default: unset. */
		if (raw[0] == '\0' && s->def != NULL && s->def[0] == '\0')
			return 0;
		return url_parse_db(raw, field, reason, n);
	}
	addr_errf(reason, n, "internal error: unknown kind");
	return -1;
}

/* The content of a *_URL_FILE, trailing white space trimmed, in *out for
 * the caller to free.  strerror is fine here: this runs before threads. */
static int read_value_file(const char *path, char **out, char *reason, size_t n)
{
	char shown[CFG_ECHO_MAX + 4];
	char *buf = NULL;
	size_t len = 0;
	int fd;

	*out = NULL;
	addr_echo(shown, sizeof shown, path);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		goto fail_errno;
	buf = malloc(CFG_FILE_MAX + 1);
	if (buf == NULL) {
		addr_errf(reason, n, "out of memory");
		goto fail;
	}
	for (;;) {
		ssize_t r = read(fd, buf + len, CFG_FILE_MAX + 1 - len);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			goto fail_errno;
		if (r == 0)
			break;
		len += (size_t)r;
		if (len > CFG_FILE_MAX) {
			addr_errf(reason, n, "'%s' is larger than %d bytes", shown, CFG_FILE_MAX);
			goto fail;
		}
	}
	close(fd);
	fd = -1;
	if (memchr(buf, '\0', len) != NULL) {
		addr_errf(reason, n, "'%s' holds a NUL byte", shown);
		goto fail;
	}
	while (len > 0 && (buf[len - 1] == ' ' || buf[len - 1] == '\t' ||
	                   buf[len - 1] == '\n' || buf[len - 1] == '\r'))
		len--;
	buf[len] = '\0';
	*out = buf;
	return 0;
fail_errno:
	if (errno == EACCES)
		/* The usual cause: a secret file bind-mounted into a container
		 * whose program runs as another user (compose.yaml's uid 10001
		 * and a checkout made with umask 077), or a unit's file that
		 * its user cannot read.  Say who must be able to read it. */
		addr_errf(reason, n, "cannot read '%s': %s (this process runs as uid %u, gid %u: "
		          "the file must be readable by it, e.g. chmod 0644 or chown)",
		          shown, strerror(errno), (unsigned)getuid(), (unsigned)getgid());
	else
		addr_errf(reason, n, "cannot read '%s': %s", shown, strerror(errno));
fail:
	free(buf);
	if (fd >= 0)
		close(fd);
	return -1;
}

/*
 * Pick the value of one setting (flag, else variable, else default), read
 * it from a file when asked, and parse it.  Errors name the setting.
 */
static int load_setting(const struct cfg_setting *s, const char *flag_val,
                        const char *flag_file, struct cfg *out, char *err, size_t errlen)
{
	char reason[CFG_REASON_MAX];
	const char *name = s->env;
	const char *raw = flag_val;
	const char *file = flag_file;
	char *owned = NULL;
	int rc;

	if (flag_val != NULL && flag_file != NULL) {
		addr_errf(err, errlen, "%s: both --%s and --%s are given; use one", s->env, s->flag,
		        s->file_flag);
		return -1;
	}
	if (raw == NULL && file == NULL) {
		raw = getenv(s->env);
		file = s->file_env != NULL ? getenv(s->file_env) : NULL;
		if (raw != NULL && file != NULL) {
			addr_errf(err, errlen, "%s: both %s and %s are set; use one", s->env, s->env,
			        s->file_env);
			return -1;
		}
	}
	if (file != NULL) {
		name = s->file_env;
		if (read_value_file(file, &owned, reason, sizeof reason) != 0) {
			addr_errf(err, errlen, "%s: %s", name, reason);
			return -1;
		}
		raw = owned;
	}
	if (raw == NULL)
		raw = default_value(s);
	rc = parse_value(s, raw, out, reason, sizeof reason);
	if (rc != 0)
		addr_errf(err, errlen, "%s: %s", name, reason);
	free(owned);
	return rc;
}

static const struct cfg_setting *find_flag(const char *name, size_t len, bool *is_file)
{
	for (size_t i = 0; i < CFG_NSETTINGS; i++) {
		const struct cfg_setting *s = &cfg_settings[i];

		if (strlen(s->flag) == len && strncmp(s->flag, name, len) == 0) {
			*is_file = false;
			return s;
		}
		if (s->file_flag != NULL && strlen(s->file_flag) == len &&
		    strncmp(s->file_flag, name, len) == 0) {
			*is_file = true;
			return s;
		}
	}
	return NULL;
}

/*
 * Collect flag values (pointers into argv) per setting.  --help and
 * --version win over any error, so that "--thread 4 --help" still helps;
 * otherwise the first error is reported.
 */
static enum cfg_result parse_flags(int argc, char **argv, const char **vals, const char **files,
                                   char *err, size_t errlen)
{
	bool help = false, version = false, failed = false;

	for (int i = 1; i < argc && argv != NULL; i++) {
		const char *a = argv[i];
		const struct cfg_setting *s;
		const char *name, *eq, *value;
		char shown[CFG_ECHO_MAX + 4];
		size_t len;
		bool is_file;

		if (a == NULL)
			break;
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			help = true;
			continue;
		}
		if (strcmp(a, "--version") == 0) {
			version = true;
			continue;
		}
		if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
			/* Not echoed: it may be a URL with a password. */
			if (!failed)
				addr_errf(err, errlen, "argument %d: unexpected; settings are given as "
				        "--flag value or INBOX_* variables (see --help)", i);
			failed = true;
			continue;
		}
		name = a + 2;
		eq = strchr(name, '=');
		len = eq != NULL ? (size_t)(eq - name) : strlen(name);
		s = find_flag(name, len, &is_file);
		if (s == NULL) {
			char nm[CFG_ECHO_MAX + 1];

			snprintf(nm, sizeof nm, "%.*s",
			         (int)(len < CFG_ECHO_MAX ? len : CFG_ECHO_MAX), name);
			addr_echo(shown, sizeof shown, nm);
			if (!failed)
				addr_errf(err, errlen, "--%s: unknown flag (see --help)", shown);
			failed = true;
			continue;
		}
		if (eq != NULL) {
			value = eq + 1;
		} else if (i + 1 < argc && argv[i + 1] != NULL) {
			value = argv[++i];
		} else {
			if (!failed)
				addr_errf(err, errlen, "--%s: missing value",
				        is_file ? s->file_flag : s->flag);
			failed = true;
			continue;
		}
		/* The last of a repeated flag wins, as with most tools. */
		if (is_file)
			files[s - cfg_settings] = value;
		else
			vals[s - cfg_settings] = value;
	}
	if (help)
		return CFG_HELP;
	if (version)
		return CFG_VERSION;
	return failed ? CFG_ERROR : CFG_OK;
}

/* INBOX_BATCH was given neither as a flag nor in the environment. */
static bool cfg_batch_defaulted(const char *const *vals, const char *const *files)
{
	for (size_t i = 0; i < CFG_NSETTINGS; i++)
		if (strcmp(cfg_settings[i].env, "INBOX_BATCH") == 0)
			return vals[i] == NULL && files[i] == NULL && getenv("INBOX_BATCH") == NULL;
	return false;
}

enum cfg_result cfg_load(struct cfg *out, int argc, char **argv, char *err, size_t errlen)
{
	const char *vals[CFG_NSETTINGS] = { 0 };
	const char *files[CFG_NSETTINGS] = { 0 };
	enum cfg_result r;

	memset(out, 0, sizeof *out);
	addr_errf(err, errlen, "%s", "");
	r = parse_flags(argc, argv, vals, files, err, errlen);
	if (r != CFG_OK)
		return r;
	for (size_t i = 0; i < CFG_NSETTINGS; i++) {
		if (load_setting(&cfg_settings[i], vals[i], files[i], out, err, errlen) != 0)
			goto fail;
	}
	/* A batch takes at most `batch` deliveries; the broker sends at most
	 * `prefetch` unacknowledged ones, so a larger batch would never fill.
	 * The default batch follows a smaller prefetch; a batch asked for
	 * must fit. */
	if (out->batch > out->prefetch && cfg_batch_defaulted(vals, files))
		out->batch = out->prefetch;
	if (out->batch > out->prefetch) {
		addr_errf(err, errlen, "INBOX_BATCH: must not exceed INBOX_PREFETCH (%d): '%d'",
		        out->prefetch, out->batch);
		goto fail;
	}
	if (check_field_fits(out, err, errlen) != 0)
		goto fail;
	return CFG_OK;
fail:
	cfg_free(out);
	return CFG_ERROR;
}

/* The password of one URL: from the first ':' after the scheme (or the
 * start) up to its last '@', so that an unencoded '@', '/' or '?' in the
 * password is covered too; a URL too broken to parse still loses it. */
static void scrub_url(char *v)
{
	char *start = strstr(v, "://");
	char *at = strrchr(v, '@');
	char *colon;

	start = start != NULL ? start + 3 : v;
	if (at == NULL || at < start)
		return;
	colon = memchr(start, ':', (size_t)(at - start));
	if (colon == NULL)
		return;
	for (char *p = colon + 1; p < at; p++)
		*p = '*';
}

void cfg_scrub_argv(int argc, char **argv)
{
	for (int i = 1; i < argc && argv != NULL && argv[i] != NULL; i++) {
		char *a = argv[i];
		char *eq;
		size_t len;

		if (strncmp(a, "--", 2) != 0)
			continue;
		eq = strchr(a, '=');
		len = eq != NULL ? (size_t)(eq - a) : strlen(a);
		if (len < 6 || strncmp(a + len - 4, "-url", 4) != 0)
			continue;
		if (eq != NULL)
			scrub_url(eq + 1);
		else if (i + 1 < argc && argv[i + 1] != NULL)
			scrub_url(argv[++i]);
	}
}

const struct cfg_db *cfg_migrate_db(const struct cfg *c)
{
	return c->migrate_db.host != NULL ? &c->migrate_db : &c->db;
}

void cfg_free(struct cfg *c)
{
	if (c == NULL)
		return;
	url_amqp_free(&c->amqp);
	url_db_free(&c->db);
	url_db_free(&c->migrate_db);
	free(c->consumer);
	free(c->queue);
	free(c->exchange);
	free(c->dlx);
	free(c->dlq);
	free(c->out_exchange);
	free(c->metrics_addr);
	free(c->migrations_dir);
	free(c->lifecycle);
	free(c->type_map);
	free(c->order_id_field);
	free(c->bind);
	memset(c, 0, sizeof *c);
}

static const char *kind_metavar(const struct cfg_setting *s)
{
	switch (s->kind) {
	case K_INT:
	case K_LONG: return "N";
	case K_DURATION: return "DURATION";
	case K_NAME: return "NAME";
	case K_PATH: return "DIR";
	case K_FILE: return "FILE";
	case K_ADDR: return "HOST:PORT";
	case K_ENUM: return "WORD";
	case K_AMQP_URL:
	case K_DB_URL: return "URL";
	case K_TYPE_MAP: return "MAP";
	case K_FIELD: return "FIELD";
	case K_BINDINGS: return "KEYS";
	}
	return "VALUE";
}

/* The bounds of a setting as --help shows them after its text: " [1, 256]",
 * " (text|json)"; "" for kinds without. */
static void fmt_limits(const struct cfg_setting *s, char *dst, size_t n)
{
	char lim[32], lim2[32];
	size_t used = 0;

	dst[0] = '\0';
	switch (s->kind) {
	case K_INT:
	case K_LONG:
		snprintf(dst, n, " [%ld, %ld]", s->min, s->max);
		break;
	case K_DURATION:
		cfg_format_duration(lim, sizeof lim, s->min);
		cfg_format_duration(lim2, sizeof lim2, s->max);
		snprintf(dst, n, " [%s, %s]", lim, lim2);
		break;
	case K_NAME:
		snprintf(dst, n, " (1-%ld of [A-Za-z0-9._:-])", s->max);
		break;
	case K_ENUM:
		for (int j = 0; s->choices[j] != NULL && used < n; j++)
			used += (size_t)snprintf(dst + used, n - used, "%s%s", j > 0 ? "|" : " (", s->choices[j]);
		if (used < n)
			snprintf(dst + used, n - used, ")");
		break;
	default:
		break;
	}
}

void cfg_print_help(FILE *f, const char *usage_line, bool (*keep)(const char *env))
{
	char flag[64], lim[160];

	if (usage_line != NULL)
		fprintf(f, "%s\n\n", usage_line);
	fprintf(f, "Settings: a flag overrides its variable, which overrides the default.\n"
	           "Flags take --flag VALUE or --flag=VALUE.  Durations: 30s, 10m, 2h, 7d.\n\n");
	for (size_t i = 0; i < CFG_NSETTINGS; i++) {
		const struct cfg_setting *s = &cfg_settings[i];
		const char *def = default_value(s);

		if (keep != NULL && !keep(s->env))
			continue;
		snprintf(flag, sizeof flag, "--%s %s", s->flag, kind_metavar(s));
		fprintf(f, "  %-22s %-28s default: %s\n", s->env, flag,
		        def[0] != '\0' ? def : "(empty)");
		fmt_limits(s, lim, sizeof lim);
		fprintf(f, "      %s%s\n", s->help, lim);
		if (s->file_env != NULL)
			fprintf(f, "      or %s / --%s FILE: read it from FILE (a secret).\n"
			           "      Prefer the variable or the file: a password given with --%s\n"
			           "      is masked at start, but other users may see it in `ps` until then.\n",
			        s->file_env, s->file_flag, s->flag);
	}
	fprintf(f, "\n  %-22s %-28s show this help\n", "", "--help, -h");
	fprintf(f, "  %-22s %-28s show the version\n", "", "--version");
}

/* Text into pandoc markdown: the characters it would read as markup
 * escaped, except backquotes, which the help texts use for code. */
static void put_md(FILE *f, const char *s)
{
	for (; *s != '\0'; s++) {
		if (strchr("\\*_[]<>|#~^$@", *s) != NULL)
			fputc('\\', f);
		fputc(*s, f);
	}
}

/* Text into a cell of a GitHub table: only '|' ends a cell. */
static void put_cell(FILE *f, const char *s)
{
	for (; *s != '\0'; s++) {
		if (*s == '|')
			fputc('\\', f);
		fputc(*s, f);
	}
}

/* The computed default (the migrations folder) depends on where the
 * program runs; the documents describe it instead. */
#define CFG_DOC_MIGRATIONS_MAN "the source tree's migrations/ when run from its build folder, else " \
	INBOX_MIGRATIONS_DIR_DEFAULT
#define CFG_DOC_MIGRATIONS_README "the source tree's `migrations/` when run from its build folder, else " \
	"the installed ones (`share/inbox-worker/migrations` under the prefix)"

static void doc_man(FILE *f, const struct cfg_setting *s, const char *lim)
{
	fputs("**", f);
	put_md(f, s->env);
	fputs("**, **\\-\\-", f);
	put_md(f, s->flag);
	fprintf(f, "** *%s*\n:   ", kind_metavar(s));
	put_md(f, s->help);
	put_md(f, lim);
	fputs(".", f);
	if (s->more != NULL) {
		fputc(' ', f);
		put_md(f, s->more);
	}
	if (s->def == NULL) {
		fputs(" Default: ", f);
		put_md(f, CFG_DOC_MIGRATIONS_MAN);
		fputs(".", f);
	} else if (s->def[0] == '\0') {
		fputs(" Default: empty.", f);
	} else {
		fprintf(f, " Default: `%s`.", s->def);
	}
	if (s->file_env != NULL) {
		fputs("\n\n    Or **", f);
		put_md(f, s->file_env);
		fputs("**, **\\-\\-", f);
		put_md(f, s->file_flag);
		fputs("** *FILE*: the value is read from *FILE* (a secret; trailing white space is dropped). "
		      "Prefer the variable or the file: a password given with **\\-\\-", f);
		put_md(f, s->flag);
		fputs("** is masked at start, but other users may see it in **ps**(1) until then.", f);
	}
	fputs("\n\n", f);
}

static void doc_readme(FILE *f, const struct cfg_setting *s, const char *lim)
{
	if (s->file_env != NULL)
		fprintf(f, "| `%s` or `%s` | `--%s %s` or `--%s FILE` | ", s->env, s->file_env, s->flag, kind_metavar(s),
		        s->file_flag);
	else
		fprintf(f, "| `%s` | `--%s %s` | ", s->env, s->flag, kind_metavar(s));
	if (s->def == NULL)
		fputs(CFG_DOC_MIGRATIONS_README, f);
	else if (s->def[0] == '\0')
		fputs("(empty)", f);
	else
		fprintf(f, "`%s`", s->def);
	fputs(" | ", f);
	put_cell(f, s->help);
	put_cell(f, lim);
	if (s->more != NULL) {
		fputs(". ", f);
		put_cell(f, s->more);
	}
	fputs(" |\n", f);
}

void cfg_print_doc(FILE *f, enum cfg_doc_format fmt, bool (*keep)(const char *env))
{
	char lim[160];

	if (fmt == CFG_DOC_README)
		fputs("| variable | flag | default | meaning |\n|---|---|---|---|\n", f);
	for (size_t i = 0; i < CFG_NSETTINGS; i++) {
		const struct cfg_setting *s = &cfg_settings[i];

		if (keep != NULL && !keep(s->env))
			continue;
		fmt_limits(s, lim, sizeof lim);
		if (fmt == CFG_DOC_MAN)
			doc_man(f, s, lim);
		else
			doc_readme(f, s, lim);
	}
}
