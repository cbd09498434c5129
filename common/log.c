/*
 * log.c - one line per event on stderr, as text or as one JSON object.
 *
 * Why it is shaped so:
 * - A line is built in a fixed buffer on the stack and handed to one
 *   write(2).  The buffer is PIPE_BUF (4 KiB) long, so a line written to a
 *   pipe is atomic and threads never interleave inside a line; nothing is
 *   allocated, so logging works when memory has run out.
 * - Every value is escaped: text quotes a value holding spaces, quotes, '='
 *   or bytes that are not printable UTF-8; json escapes per RFC 8259.  Bytes
 *   that are not valid UTF-8 are written as the four characters \xNN in both
 *   formats, so a hostile message id cannot forge a line or break a parser.
 * - A long value is cut at LOG_VALUE_MAX bytes (marked "..."); a line that
 *   would still overflow drops its remaining fields and says truncated=true.
 *   Room for the closing characters is reserved, so json stays valid.
 * - Level and format are plain statics: log_setup runs once before threads
 *   start and they are only read afterwards.
 */
#include "log.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "array.h"
#include "status.h"

#define LOG_LINE_MAX 4096  /* == PIPE_BUF on Linux: one atomic write */
#define LOG_VALUE_MAX 1024 /* input bytes of one value before it is cut */
#define LOG_TAIL_RESERVE 48 /* closing quote, truncation marker, "}\n" */

static enum log_level log_level_cur = LOG_LEVEL_INFO;
static enum log_format log_format_cur = LOG_FORMAT_TEXT;

static const char *const log_level_names[] = {
	[LOG_LEVEL_ERROR] = "error",
	[LOG_LEVEL_WARN] = "warn",
	[LOG_LEVEL_INFO] = "info",
	[LOG_LEVEL_DEBUG] = "debug",
};
_Static_assert(ARRAY_LEN(log_level_names) == LOG_LEVEL_COUNT, "one name per enum log_level");

static const char *const log_format_names[] = {
	[LOG_FORMAT_TEXT] = "text",
	[LOG_FORMAT_JSON] = "json",
};
_Static_assert(ARRAY_LEN(log_format_names) == LOG_FORMAT_COUNT, "one name per enum log_format");

void log_setup(enum log_level level, enum log_format format)
{
	log_level_cur = level;
	log_format_cur = format;
}

bool log_enabled(enum log_level level)
{
	return level <= log_level_cur;
}

int log_level_parse(const char *s, enum log_level *out)
{
	if (s == NULL)
		return -1;
	for (size_t i = 0; i < sizeof log_level_names / sizeof log_level_names[0]; i++) {
		if (strcasecmp(s, log_level_names[i]) == 0) {
			*out = (enum log_level)i;
			return 0;
		}
	}
	return -1;
}

int log_format_parse(const char *s, enum log_format *out)
{
	if (s == NULL)
		return -1;
	for (size_t i = 0; i < sizeof log_format_names / sizeof log_format_names[0]; i++) {
		if (strcasecmp(s, log_format_names[i]) == 0) {
			*out = (enum log_format)i;
			return 0;
		}
	}
	return -1;
}

const char *log_level_name(enum log_level level)
{
	if ((int)level < 0 || (size_t)level >= sizeof log_level_names / sizeof log_level_names[0])
		return "unknown";
	return log_level_names[level];
}

/* The line being built.  `limit` leaves LOG_TAIL_RESERVE bytes that only
 * the closing characters may use (line_put_tail). */
struct line {
	char buf[LOG_LINE_MAX];
	size_t len;
	size_t limit;
	bool full; /* a put did not fit: stop adding fields */
};

static bool line_put(struct line *l, const char *s, size_t n)
{
	if (l->full || n > l->limit - l->len) {
		l->full = true;
		return false;
	}
	memcpy(l->buf + l->len, s, n);
	l->len += n;
	return true;
}

static bool line_puts(struct line *l, const char *s)
{
	return line_put(l, s, strlen(s));
}

/* For the closing characters only: may use the reserve, never the end. */
static void line_put_tail(struct line *l, const char *s)
{
	size_t n = strlen(s);

	if (n > sizeof l->buf - l->len)
		n = sizeof l->buf - l->len;
	memcpy(l->buf + l->len, s, n);
	l->len += n;
}

/*
 * Length of the valid UTF-8 sequence at s (n bytes available), or 0 when
 * the bytes there are not one: stray continuation bytes, overlong forms,
 * surrogates and code points above U+10FFFF all count as invalid.
 */
static size_t utf8_seq_len(const unsigned char *s, size_t n)
{
	unsigned c = s[0];
	size_t len;
	unsigned cp;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf) {
		len = 2;
		cp = c & 0x1f;
	} else if (c >= 0xe0 && c <= 0xef) {
		len = 3;
		cp = c & 0x0f;
	} else if (c >= 0xf0 && c <= 0xf4) {
		len = 4;
		cp = c & 0x07;
	} else {
		return 0;
	}
	if (len > n)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3f);
	}
	if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
	    (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

static bool text_needs_quotes(const char *s, size_t n)
{
	const unsigned char *u = (const unsigned char *)s;

	for (size_t i = 0; i < n;) {
		size_t len = utf8_seq_len(u + i, n - i);

		if (len == 0 || u[i] <= ' ' || u[i] == '"' || u[i] == '=' || u[i] == '\\' ||
		    u[i] == 0x7f)
			return true;
		i += len;
	}
	return false;
}

/*
 * Append s escaped for the current format (json: the inside of a string;
 * text: the inside of quotes, or the bare value when `quoted` is false, in
 * which case it holds nothing that needs escaping).  Stops at the first
 * character that does not fit.
 */
static void put_escaped(struct line *l, const char *s, size_t n, bool json)
{
	const unsigned char *u = (const unsigned char *)s;
	char tmp[8];

	for (size_t i = 0; i < n;) {
		size_t len = utf8_seq_len(u + i, n - i);
		const char *esc = NULL;
		bool ok;

		if (len == 0) {
			/* Not UTF-8: show the byte, keep the output valid. */
			snprintf(tmp, sizeof tmp, json ? "\\\\x%02x" : "\\x%02x", u[i]);
			ok = line_puts(l, tmp);
			len = 1;
		} else if (len > 1) {
			ok = line_put(l, s + i, len);
		} else {
			switch (u[i]) {
			case '"': esc = "\\\""; break;
			case '\\': esc = "\\\\"; break;
			case '\n': esc = "\\n"; break;
			case '\r': esc = "\\r"; break;
			case '\t': esc = "\\t"; break;
			default: break;
			}
			if (esc != NULL) {
				ok = line_puts(l, esc);
			} else if (u[i] < 0x20 || u[i] == 0x7f) {
				snprintf(tmp, sizeof tmp, json ? "\\u%04x" : "\\x%02x", u[i]);
				ok = line_puts(l, tmp);
			} else {
				ok = line_put(l, s + i, 1);
			}
		}
		if (!ok)
			return;
		i += len;
	}
}

/* A string value: cut at LOG_VALUE_MAX, quoted/escaped as the format wants. */
static void put_value(struct line *l, const char *s, bool json)
{
	size_t n = s != NULL ? strnlen(s, LOG_VALUE_MAX + 1) : 0;
	bool cut = n > LOG_VALUE_MAX;
	bool quoted;

	if (cut) {
		/* Back up to a character boundary so the cut adds no bad byte. */
		n = LOG_VALUE_MAX;
		while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80)
			n--;
	}
	quoted = json || text_needs_quotes(s, n);
	if (quoted && !line_put(l, "\"", 1)) {
		if (json)
			line_put_tail(l, "\"\""); /* "key": must have a value */
		return;
	}
	put_escaped(l, s, n, json);
	if (cut && !l->full)
		line_puts(l, "...");
	if (quoted)
		line_put_tail(l, "\"");
}

/* Keys come from our code, but a bad one must still not break the line. */
static void put_text_key(struct line *l, const char *key)
{
	for (const char *p = key; *p != '\0' && !l->full; p++) {
		char c = *p;
		bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		          c == '_' || c == '.' || c == '-';

		line_put(l, ok ? &c : "_", 1);
	}
}

static void put_timestamp(struct line *l)
{
	struct timespec ts;
	struct tm tm;
	char buf[40];
	size_t n;

	if (clock_gettime(CLOCK_REALTIME, &ts) != 0 || gmtime_r(&ts.tv_sec, &tm) == NULL) {
		line_puts(l, "1970-01-01T00:00:00.000Z");
		return;
	}
	n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf + n, sizeof buf - n, ".%03ldZ", ts.tv_nsec / 1000000L);
	line_puts(l, buf);
}

/* json keys "ts", "level" and "msg" are ours; a field with the same name
 * gets "_id" appended so the object never holds a key twice. */
static bool json_key_reserved(const char *key)
{
	return strcmp(key, "ts") == 0 || strcmp(key, "level") == 0 || strcmp(key, "msg") == 0;
}

static void build_text(struct line *l, enum log_level level, const char *msg,
                       const struct log_kv *kv, int n)
{
	char num[32];

	put_timestamp(l);
	line_puts(l, " ");
	line_puts(l, log_level_name(level));
	line_puts(l, " ");
	put_value(l, msg, false);
	for (int i = 0; i < n && !l->full; i++) {
		size_t mark = l->len;

		line_puts(l, " ");
		put_text_key(l, kv[i].key != NULL ? kv[i].key : "");
		line_puts(l, "=");
		if (l->full) {
			l->len = mark; /* no half-written key */
			break;
		}
		if (kv[i].is_num) {
			snprintf(num, sizeof num, "%lld", kv[i].num);
			line_puts(l, num);
		} else {
			put_value(l, kv[i].str, false);
		}
	}
	if (l->full)
		line_put_tail(l, " truncated=true");
	line_put_tail(l, "\n");
}

static void build_json(struct line *l, enum log_level level, const char *msg,
                       const struct log_kv *kv, int n)
{
	char num[32];

	line_puts(l, "{\"ts\":\"");
	put_timestamp(l);
	line_puts(l, "\",\"level\":\"");
	line_puts(l, log_level_name(level));
	line_puts(l, "\",\"msg\":");
	put_value(l, msg, true);
	for (int i = 0; i < n && !l->full; i++) {
		const char *key = kv[i].key != NULL ? kv[i].key : "";
		size_t mark = l->len;

		line_puts(l, ",\"");
		put_escaped(l, key, strlen(key), true);
		if (json_key_reserved(key))
			line_puts(l, "_id");
		line_puts(l, "\":");
		if (l->full) {
			/* A half-written key is not valid json: take it back. */
			l->len = mark;
			break;
		}
		if (kv[i].is_num) {
			snprintf(num, sizeof num, "%lld", kv[i].num);
			if (!line_puts(l, num))
				line_put_tail(l, "null");
		} else {
			put_value(l, kv[i].str, true);
		}
	}
	if (l->full)
		line_put_tail(l, ",\"truncated\":true");
	line_put_tail(l, "}\n");
}

/* The trace of the message this thread is handling (log_trace_set):
 * OpenTelemetry's log correlation fields, added to every line the thread
 * writes meanwhile.  Empty: none. */
static _Thread_local char log_trace_id[33];
static _Thread_local char log_span_id[17];

/* Lines with more fields than this are written without the trace fields
 * (none of ours has nearly as many). */
#define LOG_KV_MAX 32

void log_trace_set(const char *trace_id, const char *span_id)
{
	if (trace_id == NULL || span_id == NULL || trace_id[0] == '\0' || strlen(trace_id) >= sizeof log_trace_id ||
	    strlen(span_id) >= sizeof log_span_id) {
		log_trace_id[0] = log_span_id[0] = '\0';
		return;
	}
	memcpy(log_trace_id, trace_id, strlen(trace_id) + 1);
	memcpy(log_span_id, span_id, strlen(span_id) + 1);
}

void log_trace_clear(void)
{
	log_trace_id[0] = log_span_id[0] = '\0';
}

void log_emit(enum log_level level, const char *msg, const struct log_kv *kv, int n)
{
	struct log_kv all[LOG_KV_MAX + 2];
	struct line l;
	size_t off = 0;

	if (!log_enabled(level))
		return;
	if (msg == NULL)
		msg = "";
	if (kv == NULL || n < 0)
		n = 0;
	if (log_trace_id[0] != '\0' && n <= LOG_KV_MAX) {
		for (int i = 0; i < n; i++)
			all[i] = kv[i];
		all[n++] = LOG_S("trace_id", log_trace_id);
		all[n++] = LOG_S("span_id", log_span_id);
		kv = all;
	}
	l.len = 0;
	l.limit = sizeof l.buf - LOG_TAIL_RESERVE;
	l.full = false;
	if (log_format_cur == LOG_FORMAT_JSON)
		build_json(&l, level, msg, kv, n);
	else
		build_text(&l, level, msg, kv, n);

	/* One write; loop only for EINTR or a short write to a full pipe. */
	while (off < l.len) {
		ssize_t w = write(STDERR_FILENO, l.buf + off, l.len - off);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return; /* nowhere left to report it */
		}
		off += (size_t)w;
	}
}

void log_refused(int rc, const char *link, const char *user, const char *url, const char *why)
{
	bool db = strcmp(link, "db") == 0;
	const char *what;

	if (rc == ST_ERR_TLS_CERT)
		what = db ? "database TLS refused: fix the URL's host or ssl-ca/ssl-capath/ssl-cert/ssl-key, or the "
		            "server's certificate (its chain must lead to that CA, and it must name the URL's host)"
		          : "broker TLS refused: fix the URL's host, cacertfile, certfile/keyfile or "
		            "server_name_indication, or the broker's certificate (its chain must lead to that CA, and "
		            "it must name the URL's host, or server_name_indication's)";
	else
		what = db ? "database refused the login: fix the URL's user, password or database, "
		            "or the account's grants"
		          : "broker refused the login: fix the URL's user, password or vhost, "
		            "or the user's permissions on the vhost";
	LOG(LOG_LEVEL_ERROR, what, LOG_S("link", link), LOG_S("user", user), LOG_S(db ? "db" : "amqp", url),
	    LOG_S("error", why));
}
