/*
 * test_log.c - the log line format, as an operator's grep and a json
 * parser see it.  stderr is redirected to a temporary file around each
 * emit, and the json lines are checked by parsing them back with jansson,
 * so "valid json" means what a log shipper means by it.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* included on purpose: log.h must not clash with the names of <syslog.h> */
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

#define CAPTURE_MAX 65536

static int saved_fd = -1;
static FILE *capture_file;
static char captured[CAPTURE_MAX];

static void capture_begin(void)
{
	capture_file = tmpfile();
	cr_assert_not_null(capture_file);
	saved_fd = dup(STDERR_FILENO);
	cr_assert_geq(saved_fd, 0);
	cr_assert_geq(dup2(fileno(capture_file), STDERR_FILENO), 0);
}

/* Restore stderr and return what was written to it. */
static const char *capture_end(void)
{
	size_t n;

	cr_assert_geq(dup2(saved_fd, STDERR_FILENO), 0);
	close(saved_fd);
	saved_fd = -1;
	rewind(capture_file);
	n = fread(captured, 1, sizeof captured - 1, capture_file);
	captured[n] = '\0';
	fclose(capture_file);
	capture_file = NULL;
	return captured;
}

static void reset(void)
{
	log_setup(LOG_LEVEL_INFO, LOG_FORMAT_TEXT);
}

TestSuite(log, .init = reset);

static bool matches(const char *s, const char *ere)
{
	regex_t re;
	int rc;

	cr_assert_eq(regcomp(&re, ere, REG_EXTENDED | REG_NOSUB), 0, "bad regex %s", ere);
	rc = regexec(&re, s, 0, NULL, 0);
	regfree(&re);
	return rc == 0;
}

#define TS_RE "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z"

/* The text after "<timestamp> ", for exact comparisons. */
static const char *after_ts(const char *line)
{
	cr_assert(matches(line, "^" TS_RE " "), "no timestamp: %s", line);
	return line + 25;
}

static const char *text_line(const char *key, const char *value)
{
	log_setup(LOG_LEVEL_INFO, LOG_FORMAT_TEXT);
	capture_begin();
	LOG(LOG_LEVEL_INFO, "ev", LOG_S(key, value));
	return after_ts(capture_end());
}

Test(log, text_line_has_timestamp_level_message_and_fields)
{
	const char *out;

	capture_begin();
	LOG(LOG_LEVEL_INFO, "handled", LOG_I("worker", 3), LOG_S("message_id", "abc"),
	    LOG_S("outcome", "duplicate"));
	out = capture_end();
	cr_assert(matches(out, "^" TS_RE " info handled worker=3 message_id=abc outcome=duplicate\n$"),
	          "got: %s", out);
}

Test(log, text_quotes_values_with_spaces_quotes_or_equals)
{
	cr_assert_str_eq(text_line("k", "a b"), "info ev k=\"a b\"\n");
	cr_assert_str_eq(text_line("k", "say \"hi\""), "info ev k=\"say \\\"hi\\\"\"\n");
	cr_assert_str_eq(text_line("k", "a=b"), "info ev k=\"a=b\"\n");
	cr_assert_str_eq(text_line("k", "a\\b"), "info ev k=\"a\\\\b\"\n");
	cr_assert_str_eq(text_line("k", "plain-value_1.2:3"), "info ev k=plain-value_1.2:3\n");
}

Test(log, text_escapes_control_characters_so_a_value_cannot_forge_a_line)
{
	cr_assert_str_eq(text_line("k", "a\nb"), "info ev k=\"a\\nb\"\n");
	cr_assert_str_eq(text_line("k", "a\r\tb"), "info ev k=\"a\\r\\tb\"\n");
	cr_assert_str_eq(text_line("k", "a\x01" "b"), "info ev k=\"a\\x01b\"\n");
	cr_assert_str_eq(text_line("k", "\x1b[31m"), "info ev k=\"\\x1b[31m\"\n");
}

Test(log, text_escapes_bytes_that_are_not_utf8)
{
	cr_assert_str_eq(text_line("k", "a\xff" "b"), "info ev k=\"a\\xffb\"\n");
	/* An overlong '/' and a lone continuation byte. */
	cr_assert_str_eq(text_line("k", "\xc0\xaf"), "info ev k=\"\\xc0\\xaf\"\n");
	/* Valid UTF-8 passes through unquoted. */
	cr_assert_str_eq(text_line("k", "caf\xc3\xa9"), "info ev k=caf\xc3\xa9\n");
}

Test(log, text_empty_and_null_values)
{
	cr_assert_str_eq(text_line("k", ""), "info ev k=\n");
	cr_assert_str_eq(text_line("k", NULL), "info ev k=\n");
}

Test(log, text_message_with_spaces_is_quoted)
{
	capture_begin();
	LOG0(LOG_LEVEL_WARN, "broker connection lost");
	cr_assert_str_eq(after_ts(capture_end()), "warn \"broker connection lost\"\n");
}

Test(log, text_key_with_bad_characters_is_sanitised)
{
	cr_assert_str_eq(text_line("a b=c", "v"), "info ev a_b_c=v\n");
}

static json_t *json_line(const char *line)
{
	json_error_t jerr;
	json_t *j;

	cr_assert(strlen(line) > 0 && line[strlen(line) - 1] == '\n', "no newline: %s", line);
	cr_assert_eq(strchr(line, '\n'), line + strlen(line) - 1, "more than one line: %s", line);
	j = json_loads(line, 0, &jerr);
	cr_assert_not_null(j, "not json (%s): %s", jerr.text, line);
	return j;
}

static const char *jstr(json_t *j, const char *key)
{
	json_t *v = json_object_get(j, key);

	cr_assert(json_is_string(v), "%s is not a string", key);
	return json_string_value(v);
}

Test(log, json_line_is_one_object_with_ts_level_msg_and_fields)
{
	const char *out;
	json_t *j;

	log_setup(LOG_LEVEL_INFO, LOG_FORMAT_JSON);
	capture_begin();
	LOG(LOG_LEVEL_INFO, "handled", LOG_I("worker", 3), LOG_S("order", "o-1"),
	    LOG_I("neg", -42));
	out = capture_end();
	cr_assert(matches(out, "^\\{\"ts\":\"" TS_RE "\",\"level\":\"info\",\"msg\":\"handled\","
	                       "\"worker\":3,\"order\":\"o-1\",\"neg\":-42\\}\n$"),
	          "got: %s", out);
	j = json_line(out);
	cr_assert_eq(json_object_size(j), 6);
	json_decref(j);
}

Test(log, json_field_named_like_a_reserved_key_is_renamed)
{
	json_t *j;

	log_setup(LOG_LEVEL_INFO, LOG_FORMAT_JSON);
	capture_begin();
	LOG(LOG_LEVEL_INFO, "handled", LOG_S("msg", "abc"), LOG_S("level", "x"));
	j = json_line(capture_end());
	cr_assert_str_eq(jstr(j, "msg"), "handled");
	cr_assert_str_eq(jstr(j, "msg_id"), "abc");
	cr_assert_str_eq(jstr(j, "level"), "info");
	cr_assert_str_eq(jstr(j, "level_id"), "x");
	json_decref(j);
}

Test(log, json_escapes_quotes_backslashes_and_control_characters)
{
	const char *nasty = "q\"b\\n\nt\tc\x01" "d\x7f" "e\x1f";
	const char *out;
	json_t *j;

	log_setup(LOG_LEVEL_INFO, LOG_FORMAT_JSON);
	capture_begin();
	LOG(LOG_LEVEL_INFO, "ev", LOG_S("v", nasty), LOG_S("k\"ey", "x"));
	out = capture_end();
	cr_assert_not_null(strstr(out, "\"v\":\"q\\\"b\\\\n\\nt\\tc\\u0001d\\u007fe\\u001f\""),
	                   "got: %s", out);
	j = json_line(out);
	cr_assert_str_eq(jstr(j, "v"), nasty);
	cr_assert_str_eq(jstr(j, "k\"ey"), "x");
	json_decref(j);
}

Test(log, json_escapes_bytes_that_are_not_utf8_and_keeps_valid_utf8)
{
	const char *out;
	json_t *j;

	log_setup(LOG_LEVEL_INFO, LOG_FORMAT_JSON);
	capture_begin();
	LOG(LOG_LEVEL_INFO, "ev", LOG_S("bad", "a\xff\xfe" "b"), LOG_S("sur", "\xed\xa0\x80"),
	    LOG_S("good", "caf\xc3\xa9 \xf0\x9f\x93\xa6"), LOG_S("null", NULL));
	out = capture_end();
	j = json_line(out); /* jansson rejects invalid UTF-8: this proves it */
	cr_assert_str_eq(jstr(j, "bad"), "a\\xff\\xfeb");
	cr_assert_str_eq(jstr(j, "sur"), "\\xed\\xa0\\x80");
	cr_assert_str_eq(jstr(j, "good"), "caf\xc3\xa9 \xf0\x9f\x93\xa6");
	cr_assert_str_eq(jstr(j, "null"), "");
	json_decref(j);
}

Test(log, level_filtering_drops_less_severe_events)
{
	const char *out;

	log_setup(LOG_LEVEL_WARN, LOG_FORMAT_TEXT);
	cr_assert(log_enabled(LOG_LEVEL_ERROR));
	cr_assert(log_enabled(LOG_LEVEL_WARN));
	cr_assert_not(log_enabled(LOG_LEVEL_INFO));
	cr_assert_not(log_enabled(LOG_LEVEL_DEBUG));
	capture_begin();
	LOG0(LOG_LEVEL_DEBUG, "dropped-debug");
	LOG0(LOG_LEVEL_INFO, "dropped-info");
	log_emit(LOG_LEVEL_INFO, "dropped-direct", NULL, 0);
	LOG0(LOG_LEVEL_WARN, "kept-warn");
	LOG0(LOG_LEVEL_ERROR, "kept-error");
	out = capture_end();
	cr_assert_null(strstr(out, "dropped"), "got: %s", out);
	cr_assert(matches(out, "^" TS_RE " warn kept-warn\n" TS_RE " error kept-error\n$"),
	          "got: %s", out);
}

Test(log, debug_is_off_by_default)
{
	cr_assert(log_enabled(LOG_LEVEL_INFO));
	cr_assert_not(log_enabled(LOG_LEVEL_DEBUG));
}

static int side_effects;

static int bump(void)
{
	return ++side_effects;
}

Test(log, arguments_of_a_disabled_level_are_not_evaluated)
{
	capture_begin();
	LOG(LOG_LEVEL_DEBUG, "x", LOG_I("n", bump()));
	cr_assert_str_eq(capture_end(), "");
	cr_assert_eq(side_effects, 0);
}

Test(log, long_value_is_cut_and_line_stays_bounded)
{
	char *big = malloc(10001);
	const char *out;
	json_t *j;

	cr_assert_not_null(big);
	memset(big, 'x', 10000);
	big[10000] = '\0';
	capture_begin();
	LOG(LOG_LEVEL_INFO, "ev", LOG_S("big", big), LOG_I("after", 1));
	out = capture_end();
	cr_assert_leq(strlen(out), 4096);
	cr_assert_not_null(strstr(out, "xxx... after=1\n"), "got tail: %s", out + strlen(out) - 40);

	log_setup(LOG_LEVEL_INFO, LOG_FORMAT_JSON);
	capture_begin();
	LOG(LOG_LEVEL_INFO, "ev", LOG_S("big", big));
	out = capture_end();
	cr_assert_leq(strlen(out), 4096);
	j = json_line(out);
	cr_assert_eq(strlen(jstr(j, "big")), 1024 + 3);
	json_decref(j);
	free(big);
}

Test(log, overflowing_line_drops_fields_and_stays_valid_json)
{
	/* Each value escapes to 6x its size: \u0001 per byte. */
	char ctl[1001];
	struct log_kv kv[8];
	const char *out;
	json_t *j;

	memset(ctl, 1, 1000);
	ctl[1000] = '\0';
	for (int i = 0; i < 8; i++)
		kv[i] = LOG_S("f", ctl);
	log_setup(LOG_LEVEL_INFO, LOG_FORMAT_JSON);
	capture_begin();
	log_emit(LOG_LEVEL_INFO, "ev", kv, 8);
	out = capture_end();
	cr_assert_leq(strlen(out), 4096);
	j = json_line(out);
	cr_assert(json_is_true(json_object_get(j, "truncated")), "got: %s", out);
	json_decref(j);

	log_setup(LOG_LEVEL_INFO, LOG_FORMAT_TEXT);
	capture_begin();
	log_emit(LOG_LEVEL_INFO, "ev", kv, 8);
	out = capture_end();
	cr_assert_leq(strlen(out), 4096);
	cr_assert(matches(out, "\" truncated=true\n$"), "got tail: %s", out + strlen(out) - 40);
	cr_assert_eq(strchr(out, '\n'), out + strlen(out) - 1);
}

Test(log, cut_of_a_long_utf8_value_falls_on_a_character_boundary)
{
	char big[4001];
	json_t *j;

	for (int i = 0; i < 4000; i += 2) {
		big[i] = (char)0xc3;
		big[i + 1] = (char)0xa9;
	}
	big[4000] = '\0';
	log_setup(LOG_LEVEL_INFO, LOG_FORMAT_JSON);
	capture_begin();
	LOG(LOG_LEVEL_INFO, "ev", LOG_S("v", big + 1)); /* starts mid-character */
	j = json_line(capture_end());
	cr_assert_str_eq(jstr(j, "v") + strlen(jstr(j, "v")) - 3, "...");
	json_decref(j);
}

Test(log, timestamp_is_utc_now_with_milliseconds)
{
	struct tm tm = { 0 };
	const char *out;
	time_t t;

	capture_begin();
	LOG0(LOG_LEVEL_INFO, "now");
	out = capture_end();
	cr_assert_not_null(strptime(out, "%Y-%m-%dT%H:%M:%S", &tm));
	t = timegm(&tm);
	cr_assert_leq(labs((long)(time(NULL) - t)), 5, "got %s", out);
	cr_assert_eq(out[19], '.');
	cr_assert_eq(out[23], 'Z');
}

Test(log, parse_and_name_levels_and_formats)
{
	enum log_level l;
	enum log_format f;

	cr_assert_eq(log_level_parse("error", &l), 0);
	cr_assert_eq(l, LOG_LEVEL_ERROR);
	cr_assert_eq(log_level_parse("warn", &l), 0);
	cr_assert_eq(l, LOG_LEVEL_WARN);
	cr_assert_eq(log_level_parse("INFO", &l), 0);
	cr_assert_eq(l, LOG_LEVEL_INFO);
	cr_assert_eq(log_level_parse("debug", &l), 0);
	cr_assert_eq(l, LOG_LEVEL_DEBUG);
	cr_assert_eq(log_level_parse("loud", &l), -1);
	cr_assert_eq(log_level_parse("", &l), -1);
	cr_assert_eq(log_level_parse(NULL, &l), -1);
	cr_assert_eq(log_format_parse("text", &f), 0);
	cr_assert_eq(f, LOG_FORMAT_TEXT);
	cr_assert_eq(log_format_parse("json", &f), 0);
	cr_assert_eq(f, LOG_FORMAT_JSON);
	cr_assert_eq(log_format_parse("xml", &f), -1);
	cr_assert_str_eq(log_level_name(LOG_LEVEL_WARN), "warn");
	cr_assert_str_eq(log_level_name(LOG_LEVEL_DEBUG), "debug");
	cr_assert_str_eq(log_level_name((enum log_level)42), "unknown");
}
