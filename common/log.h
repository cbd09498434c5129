/*
 * log.h - one line per event on stderr, as text or as one JSON object.
 *
 * An event is a short message plus key/value context, so that one grep
 * follows one message through the pool:
 *
 *     LOG(LOG_LEVEL_INFO, "handled", LOG_I("worker", 3), LOG_S("message_id", id),
 *         LOG_S("outcome", "duplicate"));
 *
 * text:  2026-11-29T18:00:00.123Z info handled worker=3 message_id=abc outcome=duplicate
 * json:  {"ts":"...","level":"info","msg":"handled","worker":3,"message_id":"abc",...}
 *
 * A message's id is `message_id` in both formats (SPEC.md's field name;
 * `msg` is logfmt's key for the event text, which json uses for it).
 * Outcomes are SPEC.md's outcome names (`applied`, `held`, `ignored`,
 * `compensated`, `dead_lettered`, `duplicate`); a dead letter adds
 * `reason=` with its x-inbox-reason (`invalid-transition`, ...).  The
 * janitor thread is `thread=janitor`, a worker thread `worker=N`.
 *
 * The level check happens before any argument is formatted.  Lines are
 * written with one write(2) so that threads never interleave inside a line.
 * Values are escaped (text: quoted when they hold spaces or quotes; json:
 * JSON-escaped).  Never pass a password or a whole message body.
 *
 * Levels are LOG_LEVEL_*, not LOG_INFO/LOG_DEBUG: those are <syslog.h>'s,
 * and test_log.c includes both headers so that a clash fails the build.
 */
#ifndef INBOX_LOG_H
#define INBOX_LOG_H

#include <stdbool.h>

/* The _COUNT sentinels are not values: they size the name tables. */
enum log_level { LOG_LEVEL_ERROR = 0, LOG_LEVEL_WARN = 1, LOG_LEVEL_INFO = 2, LOG_LEVEL_DEBUG = 3, LOG_LEVEL_COUNT };
enum log_format { LOG_FORMAT_TEXT = 0, LOG_FORMAT_JSON = 1, LOG_FORMAT_COUNT };

struct log_kv {
	const char *key;
	const char *str; /* used when is_num is false; NULL prints as empty */
	long long num;
	bool is_num;
};

#define LOG_S(k, v) ((struct log_kv){ .key = (k), .str = (v) })
#define LOG_I(k, v) ((struct log_kv){ .key = (k), .num = (long long)(v), .is_num = true })

/* Set once at start-up, before threads start. Defaults: info, text. */
void log_setup(enum log_level level, enum log_format format);
bool log_enabled(enum log_level level);

/* Parse "error|warn|info|debug" and "text|json"; return 0 or -1. */
int log_level_parse(const char *s, enum log_level *out);
int log_format_parse(const char *s, enum log_format *out);
const char *log_level_name(enum log_level level);

/* While a thread handles one message that carries a W3C trace, every line
 * it writes ends with trace_id= and span_id= (OpenTelemetry's names for
 * log correlation; the span is the message's own, envelope.h).  NULL or
 * "" clears it, as log_trace_clear does. */
void log_trace_set(const char *trace_id, const char *span_id);
void log_trace_clear(void);

/* Emit msg with n key/values. Prefer the LOG macros. */
void log_emit(enum log_level level, const char *msg, const struct log_kv *kv, int n);

/* The one error line every program writes when a link is refused for good
 * (link "db" or "amqp"; rc ST_ERR_ACCESS: the server refused the login,
 * ST_ERR_TLS_CERT: we refused the server's certificate): the user, the URL
 * without its password and the reason, so the operator knows what to fix. */
void log_refused(int rc, const char *link, const char *user, const char *url, const char *why);

#define LOG(level, msg, ...)                                                      \
	do {                                                                      \
		if (log_enabled(level)) {                                         \
			const struct log_kv log_kv_[] = { __VA_ARGS__ };          \
			log_emit((level), (msg), log_kv_,                         \
			         (int)(sizeof log_kv_ / sizeof log_kv_[0]));      \
		}                                                                 \
	} while (0)

#define LOG0(level, msg)                                                          \
	do {                                                                      \
		if (log_enabled(level))                                           \
			log_emit((level), (msg), 0, 0);                           \
	} while (0)

#endif
