/*
 * test_cfg.c - configuration as the operator meets it: every class of bad
 * value gives one exact line naming the setting, good values land in the
 * struct, flags beat variables beat defaults, and no password ever shows in
 * an error or in a *_redacted string.
 *
 * Criterion runs each test in its own process, so setenv() here cannot leak
 * into another test; the suite's init still clears every INBOX_* variable
 * the runner may have inherited.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "addr.h"
#include "cfg.h"
#include "url.h"
#include "config.h"

extern char **environ;

static void clear_inbox_env(void)
{
	char name[256];

	for (;;) {
		bool found = false;

		for (char **e = environ; *e != NULL; e++) {
			const char *eq = strchr(*e, '=');

			if (strncmp(*e, "INBOX_", 6) == 0 && eq != NULL &&
			    (size_t)(eq - *e) < sizeof name) {
				snprintf(name, sizeof name, "%.*s", (int)(eq - *e), *e);
				found = true;
				break;
			}
		}
		if (!found)
			return;
		unsetenv(name); /* environ changed: rescan from the start */
	}
}

TestSuite(cfg, .init = clear_inbox_env);

static enum cfg_result load_args(struct cfg *c, char *err, size_t errlen, char **argv)
{
	int argc = 0;

	while (argv[argc] != NULL)
		argc++;
	return cfg_load(c, argc, argv, err, errlen);
}

/* LOAD(&c, err, "--threads", "8", NULL); the list always ends with NULL. */
#define LOAD(c, err, ...) \
	load_args((c), (err), sizeof(err), (char *[]){ "inbox-worker", __VA_ARGS__ })

/* Loading fails with exactly `msg`, and leaves nothing to free. */
#define EXPECT_ERR(msg, ...)                                                     \
	do {                                                                     \
		struct cfg c_;                                                   \
		char e_[512];                                                    \
		cr_assert_eq(LOAD(&c_, e_, __VA_ARGS__), CFG_ERROR, "expected: %s", (msg)); \
		cr_assert_str_eq(e_, (msg));                                     \
		cr_assert_null(c_.consumer);                                     \
		cr_assert_null(c_.amqp.host);                                    \
		cr_assert_null(c_.db.host);                                      \
	} while (0)

/* Loading with variable `var` set to `value` fails with exactly `msg`. */
static void expect_env_err(const char *var, const char *value, const char *msg)
{
	setenv(var, value, 1);
	EXPECT_ERR(msg, NULL);
	unsetenv(var);
}

static void load_ok(struct cfg *c, char **argv)
{
	char err[512];
	enum cfg_result r = load_args(c, err, sizeof err, argv);

	cr_assert_eq(r, CFG_OK, "cfg_load failed: %s", err);
}

#define LOAD_OK(c, ...) load_ok((c), (char *[]){ "inbox-worker", __VA_ARGS__ })

/* ---- good values -------------------------------------------------------- */

Test(cfg, defaults_match_the_spec)
{
	struct cfg c;
	struct stat st;

	LOAD_OK(&c, NULL);
	cr_assert_str_eq(c.amqp.host, "127.0.0.1");
	cr_assert_eq(c.amqp.port, 5672);
	cr_assert_str_eq(c.amqp.user, "guest");
	cr_assert_str_eq(c.amqp.password, "guest");
	cr_assert_str_eq(c.amqp.vhost, "/");
	cr_assert_not(c.amqp.tls);
	cr_assert_str_eq(c.amqp.redacted, "amqp://guest:***@127.0.0.1:5672/%2f");
	cr_assert_str_eq(c.db.host, "127.0.0.1");
	cr_assert_eq(c.db.port, 3306);
	cr_assert_str_eq(c.db.user, "inbox");
	cr_assert_str_eq(c.db.password, "inbox");
	cr_assert_str_eq(c.db.database, "inbox");
	cr_assert_null(c.db.socket);
	cr_assert_null(c.db.ssl_ca);
	cr_assert_not(c.db.ssl);
	cr_assert_not(c.db.ssl_verify);
	cr_assert_eq(c.db.connect_timeout_s, 5);
	cr_assert_str_eq(c.db.redacted, "mysql://inbox:***@127.0.0.1:3306/inbox");
	cr_assert_eq(c.threads, 4);
	cr_assert_eq(c.prefetch, 200); /* issue 10 (newer than SPEC.md: 32): chosen by measurement, bench/README.md */
	cr_assert_str_eq(c.consumer, "order-status");
	cr_assert_str_eq(c.queue, "orders.inbox");
	cr_assert_str_eq(c.exchange, "orders");
	cr_assert_str_eq(c.dlx, "orders.dlx");
	cr_assert_str_eq(c.dlq, "orders.inbox.dlq");
	cr_assert_str_eq(c.out_exchange, "orders.out");
	cr_assert_eq(c.max_body, 65536);
	cr_assert_eq(c.retention_s, 7L * 86400);
	cr_assert_eq(c.cleanup_interval_s, 600);
	cr_assert_eq(c.hold_ttl_s, 600);
	cr_assert_str_eq(c.metrics_addr, "127.0.0.1:9464");
	cr_assert_eq(c.log_format, LOG_FORMAT_TEXT);
	cr_assert_eq(c.log_level, LOG_LEVEL_INFO);
	cr_assert_eq(c.delivery_limit, 5);
	cr_assert_eq(c.max_retries, 8);
	cr_assert_eq(c.heartbeat_s, 30);
	cr_assert_eq(c.ordering, CFG_ORDERING_SHARED);
	cr_assert_eq(c.shards, 4);
	cr_assert_eq(c.batch, 100);
	if (stat(INBOX_SOURCE_MIGRATIONS_DIR, &st) == 0 && S_ISDIR(st.st_mode))
		cr_assert_str_eq(c.migrations_dir, INBOX_SOURCE_MIGRATIONS_DIR);
	else
		cr_assert_str_eq(c.migrations_dir, INBOX_MIGRATIONS_DIR_DEFAULT);
	cfg_free(&c);
	cfg_free(&c); /* cfg_free clears, so a second call is harmless */
}

Test(cfg, env_overrides_default)
{
	struct cfg c;

	setenv("INBOX_THREADS", "8", 1);
	setenv("INBOX_QUEUE", "other.q", 1);
	setenv("INBOX_RETENTION", "2h", 1);
	setenv("INBOX_LOG_FORMAT", "json", 1);
	LOAD_OK(&c, NULL);
	cr_assert_eq(c.threads, 8);
	cr_assert_str_eq(c.queue, "other.q");
	cr_assert_eq(c.retention_s, 7200);
	cr_assert_eq(c.log_format, LOG_FORMAT_JSON);
	cr_assert_eq(c.prefetch, 200); /* untouched settings keep their default */
	cfg_free(&c);
}

Test(cfg, flag_overrides_env_overrides_default)
{
	struct cfg c;

	setenv("INBOX_THREADS", "8", 1);
	setenv("INBOX_PREFETCH", "64", 1);
	LOAD_OK(&c, "--threads", "12", NULL);
	cr_assert_eq(c.threads, 12); /* flag */
	cr_assert_eq(c.prefetch, 64); /* env */
	cr_assert_eq(c.shards, 4);    /* default */
	cfg_free(&c);
}

Test(cfg, flag_accepts_equals_and_separate_value)
{
	struct cfg c;

	LOAD_OK(&c, "--threads=16", "--consumer", "billing", "--log-level=debug",
	        "--metrics-addr=", "--hold-ttl", "90", NULL);
	cr_assert_eq(c.threads, 16);
	cr_assert_str_eq(c.consumer, "billing");
	cr_assert_eq(c.log_level, LOG_LEVEL_DEBUG);
	cr_assert_str_eq(c.metrics_addr, ""); /* empty turns metrics off */
	cr_assert_eq(c.hold_ttl_s, 90);
	cfg_free(&c);
}

Test(cfg, last_of_a_repeated_flag_wins)
{
	struct cfg c;

	LOAD_OK(&c, "--threads", "2", "--threads", "3", NULL);
	cr_assert_eq(c.threads, 3);
	cfg_free(&c);
}

Test(cfg, every_setting_has_a_flag)
{
	struct cfg c;

	LOAD_OK(&c, "--amqp-url", "amqps://a:b@mq/v", "--db-url", "mariadb://u:p@db/d",
	        "--threads", "2", "--prefetch", "10", "--consumer", "c1", "--queue", "q1",
	        "--exchange", "x1", "--dlx", "dx", "--dlq", "dq", "--out-exchange", "ox",
	        "--max-body", "1024", "--retention", "1d", "--hold-ttl", "5m",
	        "--metrics-addr", "0.0.0.0:9000", "--log-format", "json", "--log-level", "warn",
	        "--delivery-limit", "7", "--max-retries", "0", "--heartbeat", "0",
	        "--ordering", "sharded", "--shards", "16", "--batch", "10",
	        "--migrations-dir", "/tmp/m", NULL);
	cr_assert_str_eq(c.amqp.host, "mq");
	cr_assert_str_eq(c.db.host, "db");
	cr_assert_eq(c.threads, 2);
	cr_assert_eq(c.prefetch, 10);
	cr_assert_str_eq(c.consumer, "c1");
	cr_assert_str_eq(c.queue, "q1");
	cr_assert_str_eq(c.exchange, "x1");
	cr_assert_str_eq(c.dlx, "dx");
	cr_assert_str_eq(c.dlq, "dq");
	cr_assert_str_eq(c.out_exchange, "ox");
	cr_assert_eq(c.max_body, 1024);
	cr_assert_eq(c.retention_s, 86400);
	cr_assert_eq(c.hold_ttl_s, 300);
	cr_assert_str_eq(c.metrics_addr, "0.0.0.0:9000");
	cr_assert_eq(c.log_format, LOG_FORMAT_JSON);
	cr_assert_eq(c.log_level, LOG_LEVEL_WARN);
	cr_assert_eq(c.delivery_limit, 7);
	cr_assert_eq(c.max_retries, 0);
	cr_assert_eq(c.heartbeat_s, 0);
	cr_assert_eq(c.ordering, CFG_ORDERING_SHARDED);
	cr_assert_eq(c.shards, 16);
	cr_assert_eq(c.batch, 10);
	cr_assert_str_eq(c.migrations_dir, "/tmp/m");
	cfg_free(&c);
}

Test(cfg, enum_values_are_case_insensitive)
{
	struct cfg c;

	setenv("INBOX_LOG_FORMAT", "JSON", 1);
	setenv("INBOX_LOG_LEVEL", "Error", 1);
	setenv("INBOX_ORDERING", "SHARDED", 1);
	LOAD_OK(&c, NULL);
	cr_assert_eq(c.log_format, LOG_FORMAT_JSON);
	cr_assert_eq(c.log_level, LOG_LEVEL_ERROR);
	cr_assert_eq(c.ordering, CFG_ORDERING_SHARDED);
	cfg_free(&c);
}

Test(cfg, bounds_are_inclusive)
{
	struct cfg c;

	LOAD_OK(&c, "--threads", "1", "--prefetch", "65535", "--max-body", "16777216",
	        "--retention", "60", "--hold-ttl", "1s", "--batch", "500", NULL);
	cr_assert_eq(c.threads, 1);
	cr_assert_eq(c.prefetch, 65535);
	cr_assert_eq(c.max_body, 16777216);
	cr_assert_eq(c.retention_s, 60);
	cr_assert_eq(c.hold_ttl_s, 1);
	cr_assert_eq(c.batch, 500);
	cfg_free(&c);
	LOAD_OK(&c, "--threads", "256", NULL);
	cr_assert_eq(c.threads, 256);
	cfg_free(&c);
}

Test(cfg, metrics_addr_forms)
{
	struct cfg c;

	LOAD_OK(&c, "--metrics-addr", "[::1]:9464", NULL);
	cr_assert_str_eq(c.metrics_addr, "[::1]:9464");
	cfg_free(&c);
	setenv("INBOX_METRICS_ADDR", "", 1);
	LOAD_OK(&c, NULL);
	cr_assert_str_eq(c.metrics_addr, "");
	cfg_free(&c);
	LOAD_OK(&c, "--metrics-addr", "metrics.local:80", NULL);
	cr_assert_str_eq(c.metrics_addr, "metrics.local:80");
	cfg_free(&c);
}

Test(cfg, help_and_version)
{
	struct cfg c;
	char err[256];

	cr_assert_eq(LOAD(&c, err, "--help", NULL), CFG_HELP);
	cr_assert_eq(LOAD(&c, err, "-h", NULL), CFG_HELP);
	cr_assert_eq(LOAD(&c, err, "--version", NULL), CFG_VERSION);
	/* --help wins over a mistake elsewhere on the line. */
	cr_assert_eq(LOAD(&c, err, "--thread", "4", "--help", NULL), CFG_HELP);
	/* ... and over bad values, which are not even looked at. */
	setenv("INBOX_THREADS", "abc", 1);
	cr_assert_eq(LOAD(&c, err, "--help", NULL), CFG_HELP);
}

/* ---- bad numbers, durations, names, enums -------------------------------- */

Test(cfg, non_number_is_rejected)
{
	expect_env_err("INBOX_THREADS", "abc", "INBOX_THREADS: not a number: 'abc'");
	expect_env_err("INBOX_THREADS", "8x", "INBOX_THREADS: not a number: '8x'");
	expect_env_err("INBOX_THREADS", "", "INBOX_THREADS: not a number: ''");
	expect_env_err("INBOX_THREADS", " 8", "INBOX_THREADS: not a number: ' 8'");
	expect_env_err("INBOX_THREADS", "0x10", "INBOX_THREADS: not a number: '0x10'");
	expect_env_err("INBOX_THREADS", "4.5", "INBOX_THREADS: not a number: '4.5'");
	expect_env_err("INBOX_PREFETCH", "+", "INBOX_PREFETCH: not a number: '+'");
	EXPECT_ERR("INBOX_THREADS: not a number: 'abc'", "--threads", "abc", NULL);
	EXPECT_ERR("INBOX_MAX_BODY: not a number: 'big'", "--max-body=big", NULL);
}

Test(cfg, out_of_range_is_rejected)
{
	expect_env_err("INBOX_THREADS", "0", "INBOX_THREADS: out of range [1, 256]: '0'");
	expect_env_err("INBOX_THREADS", "257", "INBOX_THREADS: out of range [1, 256]: '257'");
	expect_env_err("INBOX_THREADS", "-1", "INBOX_THREADS: out of range [1, 256]: '-1'");
	expect_env_err("INBOX_THREADS", "99999999999999999999",
	               "INBOX_THREADS: out of range [1, 256]: '99999999999999999999'");
	expect_env_err("INBOX_PREFETCH", "65536",
	               "INBOX_PREFETCH: out of range [1, 65535]: '65536'");
	expect_env_err("INBOX_MAX_BODY", "63", "INBOX_MAX_BODY: out of range [64, 16777216]: '63'");
	expect_env_err("INBOX_DELIVERY_LIMIT", "1001",
	               "INBOX_DELIVERY_LIMIT: out of range [1, 1000]: '1001'");
	expect_env_err("INBOX_MAX_RETRIES", "-1", "INBOX_MAX_RETRIES: out of range [0, 100]: '-1'");
	expect_env_err("INBOX_HEARTBEAT", "601", "INBOX_HEARTBEAT: out of range [0, 600]: '601'");
	expect_env_err("INBOX_SHARDS", "65", "INBOX_SHARDS: out of range [1, 64]: '65'");
	expect_env_err("INBOX_BATCH", "501", "INBOX_BATCH: out of range [1, 500]: '501'");
	EXPECT_ERR("INBOX_THREADS: out of range [1, 256]: '0'", "--threads", "0", NULL);
}

Test(cfg, batch_larger_than_prefetch_is_rejected)
{
	EXPECT_ERR("INBOX_BATCH: must not exceed INBOX_PREFETCH (32): '64'", "--prefetch", "32", "--batch", "64",
	           NULL);
}

/* The default batch follows a smaller prefetch instead of refusing it. */
Test(cfg, default_batch_follows_a_smaller_prefetch)
{
	struct cfg c;

	LOAD_OK(&c, "--prefetch", "40", NULL);
	cr_assert_eq(c.prefetch, 40);
	cr_assert_eq(c.batch, 40);
	cfg_free(&c);
}

Test(cfg, bad_duration_is_rejected)
{
	const char *bad[] = { "5x", "-5s", "", "5 s", "5ss", "s", "1h30m", "+5", " 5", "5S" };

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char msg[128];

		snprintf(msg, sizeof msg, "INBOX_RETENTION: bad duration: '%s' (use e.g. 30s, 10m, 7d)",
		         bad[i]);
		expect_env_err("INBOX_RETENTION", bad[i], msg);
	}
	EXPECT_ERR("INBOX_HOLD_TTL: bad duration: '10 minutes' (use e.g. 30s, 10m, 7d)",
	           "--hold-ttl", "10 minutes", NULL);
}

Test(cfg, duration_overflow_is_rejected)
{
	expect_env_err("INBOX_RETENTION", "99999999999999999999",
	               "INBOX_RETENTION: duration too large: '99999999999999999999'");
	expect_env_err("INBOX_RETENTION", "9223372036854775807d",
	               "INBOX_RETENTION: duration too large: '9223372036854775807d'");
}

Test(cfg, duration_outside_its_bounds_is_rejected)
{
	expect_env_err("INBOX_RETENTION", "59s", "INBOX_RETENTION: must be at least 1m: '59s'");
	expect_env_err("INBOX_HOLD_TTL", "0", "INBOX_HOLD_TTL: must be at least 1s: '0'");
	expect_env_err("INBOX_RETENTION", "3651d",
	               "INBOX_RETENTION: must be at most 3650d: '3651d'");
}

Test(cfg, parse_duration_units)
{
	long s;
	char err[128];

	cr_assert_eq(cfg_parse_duration("30", &s, err, sizeof err), 0);
	cr_assert_eq(s, 30);
	cr_assert_eq(cfg_parse_duration("45s", &s, err, sizeof err), 0);
	cr_assert_eq(s, 45);
	cr_assert_eq(cfg_parse_duration("10m", &s, err, sizeof err), 0);
	cr_assert_eq(s, 600);
	cr_assert_eq(cfg_parse_duration("2h", &s, err, sizeof err), 0);
	cr_assert_eq(s, 7200);
	cr_assert_eq(cfg_parse_duration("7d", &s, err, sizeof err), 0);
	cr_assert_eq(s, 604800);
	cr_assert_eq(cfg_parse_duration("0s", &s, err, sizeof err), 0);
	cr_assert_eq(s, 0);
	cr_assert_eq(cfg_parse_duration("5x", &s, err, sizeof err), -1);
	cr_assert_str_eq(err, "bad duration: '5x' (use e.g. 30s, 10m, 7d)");
	cr_assert_eq(cfg_parse_duration(NULL, &s, err, sizeof err), -1);
}

Test(cfg, parse_long_checks)
{
	long v;
	char err[128];

	cr_assert_eq(cfg_parse_long("-5", -10, 10, &v, err, sizeof err), 0);
	cr_assert_eq(v, -5);
	cr_assert_eq(cfg_parse_long("10", -10, 10, &v, err, sizeof err), 0);
	cr_assert_eq(v, 10);
	cr_assert_eq(cfg_parse_long("11", -10, 10, &v, err, sizeof err), -1);
	cr_assert_str_eq(err, "out of range [-10, 10]: '11'");
	cr_assert_eq(cfg_parse_long("1e3", 0, 10000, &v, err, sizeof err), -1);
	cr_assert_str_eq(err, "not a number: '1e3'");
	cr_assert_eq(cfg_parse_long("-", 0, 1, &v, err, sizeof err), -1);
	cr_assert_str_eq(err, "not a number: '-'");
	cr_assert_eq(cfg_parse_long(NULL, 0, 1, &v, NULL, 0), -1); /* no err buffer: fine */
}

Test(cfg, bad_enum_is_rejected)
{
	expect_env_err("INBOX_LOG_FORMAT", "xml",
	               "INBOX_LOG_FORMAT: must be one of text, json: 'xml'");
	expect_env_err("INBOX_LOG_LEVEL", "loud",
	               "INBOX_LOG_LEVEL: must be one of error, warn, info, debug: 'loud'");
	expect_env_err("INBOX_ORDERING", "",
	               "INBOX_ORDERING: must be one of shared, sharded: ''");
	EXPECT_ERR("INBOX_LOG_LEVEL: must be one of error, warn, info, debug: 'trace'",
	           "--log-level", "trace", NULL);
}

Test(cfg, bad_names_are_rejected)
{
	char long_name[70];

	memset(long_name, 'a', 65);
	long_name[65] = '\0';
	expect_env_err("INBOX_CONSUMER", "bad name!",
	               "INBOX_CONSUMER: must be 1-64 characters of [A-Za-z0-9._:-]: 'bad name!'");
	expect_env_err("INBOX_CONSUMER", "",
	               "INBOX_CONSUMER: must be 1-64 characters of [A-Za-z0-9._:-]: ''");
	expect_env_err("INBOX_CONSUMER", long_name,
	               "INBOX_CONSUMER: must be 1-64 characters of [A-Za-z0-9._:-]: "
	               "'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...'");
	expect_env_err("INBOX_QUEUE", "q/1",
	               "INBOX_QUEUE: must be 1-255 characters of [A-Za-z0-9._:-]: 'q/1'");
	expect_env_err("INBOX_MIGRATIONS_DIR", "", "INBOX_MIGRATIONS_DIR: must not be empty");
}

Test(cfg, bad_metrics_addr_is_rejected)
{
	const char *bad[] = { "nohost", "h:0", "h:65536", "h:", "h:x", "::1:9464", ":",
	                      "[::1]", "[]:80", "a b:80", "h:080000" };

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char msg[300];

		snprintf(msg, sizeof msg, "INBOX_METRICS_ADDR: bad address: '%s' "
		         "(use host:port, :port or [v6]:port, e.g. 127.0.0.1:9464, localhost:9464, :9464, "
		         "[::1]:9464; empty turns it off)", bad[i]);
		expect_env_err("INBOX_METRICS_ADDR", bad[i], msg);
	}
}

/* What the check accepts is what the metrics server binds: the same
 * parser (addr_hostport_parse) reads it in both places. */
Test(cfg, metrics_addr_takes_hostnames_port_alone_and_v6)
{
	const char *good[] = { "localhost:9464", ":9464", "[::1]:9464", "[::]:9464", "0.0.0.0:1",
	                       "metrics.example-1.internal:65535" };
	struct { const char *in, *host; int port; bool v6; } parsed[] = {
		{ "localhost:9464", "localhost", 9464, false },
		{ ":9464", "", 9464, false },
		{ "[::1]:80", "::1", 80, true },
	};

	for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
		struct cfg c;

		LOAD_OK(&c, "--metrics-addr", (char *)good[i], NULL);
		cr_assert_str_eq(c.metrics_addr, good[i]);
		cfg_free(&c);
	}
	for (size_t i = 0; i < sizeof parsed / sizeof parsed[0]; i++) {
		struct addr_hostport a;
		char err[256];

		cr_assert_eq(addr_hostport_parse(parsed[i].in, &a, err, sizeof err), 0, "%s", err);
		cr_assert_str_eq(a.host, parsed[i].host);
		cr_assert_eq(a.port, parsed[i].port);
		cr_assert_eq(a.v6, parsed[i].v6);
	}
}

Test(cfg, echoed_values_are_one_printable_line)
{
	expect_env_err("INBOX_THREADS", "4\nINBOX_FAKE: injected",
	               "INBOX_THREADS: not a number: '4?INBOX_FAKE: injected'");
	expect_env_err("INBOX_THREADS", "\x1b[31m", "INBOX_THREADS: not a number: '?[31m'");
}

Test(cfg, small_error_buffer_is_truncated_not_overrun)
{
	struct cfg c;
	char err[8];

	setenv("INBOX_THREADS", "abc", 1);
	cr_assert_eq(LOAD(&c, err, NULL), CFG_ERROR);
	cr_assert_str_eq(err, "INBOX_T");
}

/* ---- flags --------------------------------------------------------------- */

Test(cfg, unknown_flag_is_rejected)
{
	EXPECT_ERR("--bogus: unknown flag (see --help)", "--bogus", NULL);
	EXPECT_ERR("--thread: unknown flag (see --help)", "--thread=4", NULL);
	EXPECT_ERR("--x: unknown flag (see --help)", "--x", "--threads", "0", NULL);
}

Test(cfg, flag_without_value_is_rejected)
{
	EXPECT_ERR("--threads: missing value", "--threads", NULL);
	EXPECT_ERR("--db-url-file: missing value", "--db-url-file", NULL);
}

Test(cfg, positional_argument_is_rejected_without_echoing_it)
{
	EXPECT_ERR("argument 1: unexpected; settings are given as --flag value or INBOX_* "
	           "variables (see --help)", "amqp://u:hunter2@h/", NULL);
	EXPECT_ERR("argument 3: unexpected; settings are given as --flag value or INBOX_* "
	           "variables (see --help)", "--threads", "2", "-t", NULL);
	EXPECT_ERR("argument 1: unexpected; settings are given as --flag value or INBOX_* "
	           "variables (see --help)", "--", "x", NULL);
}

/* ---- URL files ----------------------------------------------------------- */

static char *write_temp(const char *content)
{
	char *path = strdup("/tmp/test_cfg_XXXXXX");
	int fd;

	cr_assert_not_null(path);
	fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, content, strlen(content)), (ssize_t)strlen(content));
	close(fd);
	return path;
}

Test(cfg, url_file_is_read_and_trimmed)
{
	struct cfg c;
	char *amqp = write_temp("amqp://svc:fr0m-file@mq.internal:5673/prod\n");
	char *db = write_temp("mysql://svc:db-s3cret@db.internal/orders \r\n\t\n");

	setenv("INBOX_AMQP_URL_FILE", amqp, 1);
	LOAD_OK(&c, "--db-url-file", db, NULL);
	cr_assert_str_eq(c.amqp.host, "mq.internal");
	cr_assert_eq(c.amqp.port, 5673);
	cr_assert_str_eq(c.amqp.password, "fr0m-file");
	cr_assert_str_eq(c.amqp.vhost, "prod");
	cr_assert_str_eq(c.db.password, "db-s3cret");
	cr_assert_str_eq(c.db.database, "orders");
	cr_assert_str_eq(c.db.redacted, "mysql://svc:***@db.internal/orders");
	cfg_free(&c);
	unlink(amqp);
	unlink(db);
	free(amqp);
	free(db);
}

Test(cfg, unreadable_url_file_is_rejected)
{
	expect_env_err("INBOX_DB_URL_FILE", "/x",
	               "INBOX_DB_URL_FILE: cannot read '/x': No such file or directory");
	expect_env_err("INBOX_AMQP_URL_FILE", "/",
	               "INBOX_AMQP_URL_FILE: cannot read '/': Is a directory");
	EXPECT_ERR("INBOX_DB_URL_FILE: cannot read '/nonexistent/db': No such file or directory",
	           "--db-url-file", "/nonexistent/db", NULL);
}

Test(cfg, bad_url_in_file_names_the_file_variable)
{
	char *p = write_temp("mysql://u:p@/db\n");

	expect_env_err("INBOX_DB_URL_FILE", p, "INBOX_DB_URL_FILE: bad URL: missing host");
	unlink(p);
	free(p);
}

Test(cfg, url_and_file_together_are_rejected)
{
	setenv("INBOX_DB_URL", "mysql://u:p@h/d", 1);
	setenv("INBOX_DB_URL_FILE", "/run/secrets/db", 1);
	EXPECT_ERR("INBOX_DB_URL: both INBOX_DB_URL and INBOX_DB_URL_FILE are set; use one", NULL);
	EXPECT_ERR("INBOX_AMQP_URL: both --amqp-url and --amqp-url-file are given; use one",
	           "--amqp-url", "amqp://h/", "--amqp-url-file", "/x", NULL);
}

Test(cfg, flag_url_overrides_env_file)
{
	struct cfg c;

	/* The flag layer wins outright, so the env pair is not a conflict. */
	setenv("INBOX_DB_URL_FILE", "/nonexistent", 1);
	LOAD_OK(&c, "--db-url", "mysql://u:p@flaghost/d", NULL);
	cr_assert_str_eq(c.db.host, "flaghost");
	cfg_free(&c);
}

/* ---- AMQP URLs ----------------------------------------------------------- */

static void amqp_ok(const char *url, struct cfg_amqp *a)
{
	char err[256];

	cr_assert_eq(url_parse_amqp(url, a, err, sizeof err), 0, "%s: %s", url, err);
}

static void amqp_bad(const char *url, const char *msg)
{
	struct cfg_amqp a;
	char err[256];

	cr_assert_eq(url_parse_amqp(url, &a, err, sizeof err), -1, "accepted %s", url);
	cr_assert_str_eq(err, msg, "for %s", url);
	cr_assert_null(a.host);
	cr_assert_null(strstr(err, "hunter2"), "password in error: %s", err);
}

Test(cfg, amqp_url_full)
{
	struct cfg_amqp a;

	amqp_ok("amqp://alice:hunter2@mq.example.com:5673/prod", &a);
	cr_assert_str_eq(a.host, "mq.example.com");
	cr_assert_eq(a.port, 5673);
	cr_assert_str_eq(a.user, "alice");
	cr_assert_str_eq(a.password, "hunter2");
	cr_assert_str_eq(a.vhost, "prod");
	cr_assert_not(a.tls);
	cr_assert_str_eq(a.redacted, "amqp://alice:***@mq.example.com:5673/prod");
	url_amqp_free(&a);
	cr_assert_null(a.host);
	url_amqp_free(&a);
	url_amqp_free(NULL);
}

Test(cfg, amqps_means_tls_and_port_5671)
{
	struct cfg_amqp a;

	amqp_ok("amqps://u:p@mq/", &a);
	cr_assert(a.tls);
	cr_assert_eq(a.port, 5671);
	cr_assert_str_eq(a.vhost, "/");
	url_amqp_free(&a);
	amqp_ok("AMQPS://u:p@mq:443", &a);
	cr_assert(a.tls);
	cr_assert_eq(a.port, 443);
	url_amqp_free(&a);
}

/* RabbitMQ's URI spec names: verification is on unless verify=verify_none. */
Test(cfg, amqps_tls_options)
{
	struct cfg_amqp a;

	amqp_ok("amqps://u:p@mq/v", &a);
	cr_assert(a.tls_verify, "verification is the default");
	cr_assert_null(a.cacertfile);
	url_amqp_free(&a);
	amqp_ok("amqps://u:p@mq:5671/v?cacertfile=/ca%20x.pem&certfile=/c.pem&keyfile=/k.pem&verify=verify_peer",
	        &a);
	cr_assert_str_eq(a.cacertfile, "/ca x.pem");
	cr_assert_str_eq(a.certfile, "/c.pem");
	cr_assert_str_eq(a.keyfile, "/k.pem");
	cr_assert(a.tls_verify);
	cr_assert_str_eq(a.vhost, "v");
	cr_assert_str_eq(a.redacted,
	                 "amqps://u:***@mq:5671/v?cacertfile=/ca%20x.pem&certfile=/c.pem&keyfile=/k.pem&verify=verify_peer");
	url_amqp_free(&a);
	amqp_ok("amqps://u:p@mq?verify=verify_none", &a);
	cr_assert_not(a.tls_verify);
	cr_assert_str_eq(a.vhost, "/");
	url_amqp_free(&a);
	amqp_bad("amqp://u:hunter2@h/v?cacertfile=/ca.pem", "bad URL: TLS options need amqps://");
	amqp_bad("amqps://u:hunter2@h/v?verify=yes", "bad URL: verify must be verify_peer or verify_none");
	amqp_bad("amqps://u:hunter2@h/v?certfile=/c.pem", "bad URL: certfile and keyfile go together");
	amqp_bad("amqps://u:hunter2@h/v?cacertfile=", "bad URL: cacertfile needs a path");
}

/* server_name_indication: the name sent in the ClientHello (and checked
 * against the certificate); without it the URL's host. */
Test(cfg, amqps_server_name_indication)
{
	struct cfg_amqp a;

	amqp_ok("amqps://u:p@10.0.0.7/v", &a);
	cr_assert_null(a.sni, "no SNI option: the URL's host is sent");
	url_amqp_free(&a);
	amqp_ok("amqps://u:p@10.0.0.7/v?server_name_indication=mq.example.com&verify=verify_peer", &a);
	cr_assert_str_eq(a.sni, "mq.example.com");
	cr_assert_str_eq(a.host, "10.0.0.7");
	cr_assert(a.tls_verify);
	url_amqp_free(&a);
	cr_assert_null(a.sni);
	amqp_bad("amqp://u:hunter2@h/v?server_name_indication=mq.example", "bad URL: TLS options need amqps://");
	amqp_bad("amqps://u:hunter2@h/v?server_name_indication=",
	         "bad URL: server_name_indication must be a DNS name (letters, digits, '-' and '.', at most 253)");
	amqp_bad("amqps://u:hunter2@h/v?server_name_indication=a%20b",
	         "bad URL: server_name_indication must be a DNS name (letters, digits, '-' and '.', at most 253)");
	amqp_bad("amqps://u:hunter2@h/v?server_name_indication=mq_x.example",
	         "bad URL: server_name_indication must be a DNS name (letters, digits, '-' and '.', at most 253)");
	/* RFC 6066: SNI carries no IP literal. */
	amqp_bad("amqps://u:hunter2@h/v?server_name_indication=10.0.0.7",
	         "bad URL: server_name_indication must be a DNS name (letters, digits, '-' and '.', at most 253)");
	amqp_bad("amqps://u:hunter2@h/v?server_name_indication=[::1]",
	         "bad URL: server_name_indication must be a DNS name (letters, digits, '-' and '.', at most 253)");
}

Test(cfg, amqp_defaults_guest_and_root_vhost)
{
	struct cfg_amqp a;

	amqp_ok("amqp://localhost", &a);
	cr_assert_str_eq(a.user, "guest");
	cr_assert_str_eq(a.password, "guest");
	cr_assert_str_eq(a.vhost, "/");
	cr_assert_eq(a.port, 5672);
	cr_assert_str_eq(a.redacted, "amqp://localhost"); /* nothing to hide */
	url_amqp_free(&a);
	amqp_ok("amqp://localhost/", &a);
	cr_assert_str_eq(a.vhost, "/");
	url_amqp_free(&a);
	amqp_ok("amqp://bob@localhost/v", &a);
	cr_assert_str_eq(a.user, "bob");
	cr_assert_str_eq(a.password, "guest");
	url_amqp_free(&a);
}

Test(cfg, amqp_percent_decoding)
{
	struct cfg_amqp a;

	amqp_ok("amqp://us%40er:p%3As%2Fw%25d@h/%2Fprod%20eu", &a);
	cr_assert_str_eq(a.user, "us@er");
	cr_assert_str_eq(a.password, "p:s/w%d");
	cr_assert_str_eq(a.vhost, "/prod eu");
	cr_assert_str_eq(a.redacted, "amqp://us%40er:***@h/%2Fprod%20eu");
	url_amqp_free(&a);
	amqp_ok("amqp://h/%2f", &a);
	cr_assert_str_eq(a.vhost, "/");
	url_amqp_free(&a);
	/* An unencoded '@' in the password: the last '@' ends the user info. */
	amqp_ok("amqp://u:a@b@h/", &a);
	cr_assert_str_eq(a.password, "a@b");
	cr_assert_str_eq(a.host, "h");
	cr_assert_str_eq(a.redacted, "amqp://u:***@h/");
	url_amqp_free(&a);
}

Test(cfg, amqp_ipv6_host)
{
	struct cfg_amqp a;

	amqp_ok("amqp://u:p@[::1]:5673/v", &a);
	cr_assert_str_eq(a.host, "::1");
	cr_assert_eq(a.port, 5673);
	url_amqp_free(&a);
	amqp_ok("amqp://[fe80::1]", &a);
	cr_assert_str_eq(a.host, "fe80::1");
	cr_assert_eq(a.port, 5672);
	url_amqp_free(&a);
}

Test(cfg, amqp_bad_urls)
{
	amqp_bad("", "bad URL: empty");
	amqp_bad("http://u:hunter2@h/", "bad URL: scheme must be amqp:// or amqps://");
	amqp_bad("u:hunter2@h", "bad URL: scheme must be amqp:// or amqps://");
	amqp_bad("amqp://u:hunter2@/v", "bad URL: missing host");
	amqp_bad("amqp://", "bad URL: missing host");
	amqp_bad("amqp://u:hunter2@:5672/v", "bad URL: missing host");
	amqp_bad("amqp://u:hunter2@h:abc/", "bad URL: port is not a number");
	amqp_bad("amqp://u:hunter2@h:-1/", "bad URL: port is not a number");
	amqp_bad("amqp://u:hunter2@h:0/", "bad URL: port out of range [1, 65535]");
	amqp_bad("amqp://u:hunter2@h:65536/", "bad URL: port out of range [1, 65535]");
	amqp_bad("amqp://u:hunter2@h:99999999999999999999/", "bad URL: port out of range [1, 65535]");
	amqp_bad("amqp://u:hunter2@h:/", "bad URL: missing port after ':'");
	amqp_bad("amqp://u:hunter2%zz@h/", "bad URL: bad percent escape in password");
	amqp_bad("amqp://u%4:hunter2@h/", "bad URL: bad percent escape in user name");
	amqp_bad("amqp://u:hunter2@h/v%2", "bad URL: bad percent escape in vhost");
	amqp_bad("amqp://u:hunter2@h/v%", "bad URL: bad percent escape in vhost");
	amqp_bad("amqp://u:hunter2@h/v%00", "bad URL: %00 not allowed in vhost");
	amqp_bad("amqp://u:hunter2@h/a/b", "bad URL: vhost must not contain '/' (write it as %2f)");
	amqp_bad("amqp://u:hunter2@h/v?heartbeat=5",
	         "bad URL: unknown option 'heartbeat' "
	         "(known: cacertfile, certfile, keyfile, verify, server_name_indication)");
	amqp_bad("amqp://u:hunter2@h/v#f", "bad URL: '#' is not allowed (percent-encode it as %23)");
	amqp_bad("amqp://u:hunter2@h o/", "bad URL: contains a space or control character");
	amqp_bad("amqp://u:hunter2@h/v\n", "bad URL: contains a space or control character");
	amqp_bad("amqp://:hunter2@h/", "bad URL: empty user name");
	amqp_bad("amqp://u:hunter2@::1/", "bad URL: an IPv6 address must be in brackets: [::1]");
	amqp_bad("amqp://u:hunter2@[::1/", "bad URL: missing ']' after IPv6 address");
	amqp_bad("amqp://u:hunter2@[]/", "bad URL: missing host");
	amqp_bad("amqp://u:hunter2@[::g]/", "bad URL: bad IPv6 address");
	amqp_bad("amqp://u:hunter2@[::1]x/", "bad URL: expected ':' or '/' after ']'");
	amqp_bad("amqp://u:hunter2@h%41/", "bad URL: bad character in host");
	/* An unencoded '/' in the password would put part of it in the vhost. */
	amqp_bad("amqp://u:hun/ter2@h/", "bad URL: '@' after the host "
	         "(percent-encode '/', '?' and '@' in user name and password)");
}

Test(cfg, amqp_error_from_load_names_the_variable)
{
	expect_env_err("INBOX_AMQP_URL", "amqp://u:hunter2@/v", "INBOX_AMQP_URL: bad URL: missing host");
	EXPECT_ERR("INBOX_AMQP_URL: bad URL: port is not a number", "--amqp-url=amqp://h:x/", NULL);
}

/* ---- MySQL URLs ---------------------------------------------------------- */

static void db_ok(const char *url, struct cfg_db *d)
{
	char err[256];

	cr_assert_eq(url_parse_db(url, d, err, sizeof err), 0, "%s: %s", url, err);
}

static void db_bad(const char *url, const char *msg)
{
	struct cfg_db d;
	char err[256];

	cr_assert_eq(url_parse_db(url, &d, err, sizeof err), -1, "accepted %s", url);
	cr_assert_str_eq(err, msg, "for %s", url);
	cr_assert_null(d.host);
	cr_assert_null(strstr(err, "hunter2"), "password in error: %s", err);
}

Test(cfg, db_url_full_with_options)
{
	struct cfg_db d;

	db_ok("mysql://app:hunter2@db.example.com:3307/orders"
	      "?ssl=1&ssl-ca=/etc/ssl/ca%20b.pem&ssl-verify=true&connect-timeout=10", &d);
	cr_assert_str_eq(d.host, "db.example.com");
	cr_assert_eq(d.port, 3307);
	cr_assert_str_eq(d.user, "app");
	cr_assert_str_eq(d.password, "hunter2");
	cr_assert_str_eq(d.database, "orders");
	cr_assert(d.ssl);
	cr_assert_str_eq(d.ssl_ca, "/etc/ssl/ca b.pem");
	cr_assert(d.ssl_verify);
	cr_assert_eq(d.connect_timeout_s, 10);
	cr_assert_null(d.socket);
	cr_assert_str_eq(d.redacted, "mysql://app:***@db.example.com:3307/orders"
	                 "?ssl=1&ssl-ca=/etc/ssl/ca%20b.pem&ssl-verify=true&connect-timeout=10");
	url_db_free(&d);
	cr_assert_null(d.host);
	url_db_free(&d);
	url_db_free(NULL);
}

Test(cfg, db_url_defaults_and_mariadb_scheme)
{
	struct cfg_db d;

	db_ok("mariadb://app@db/orders", &d);
	cr_assert_eq(d.port, 3306);
	cr_assert_str_eq(d.password, "");
	cr_assert_not(d.ssl);
	cr_assert_not(d.ssl_verify);
	cr_assert_eq(d.connect_timeout_s, 5);
	cr_assert_str_eq(d.redacted, "mariadb://app@db/orders");
	url_db_free(&d);
	db_ok("mysql://app:p@db/orders?ssl=false&ssl-verify=0", &d);
	cr_assert_not(d.ssl);
	url_db_free(&d);
}

Test(cfg, db_url_socket_without_host)
{
	struct cfg_db d;

	db_ok("mysql://app:p%40ss@/orders?socket=/run/mysqld/mysqld.sock", &d);
	cr_assert_str_eq(d.host, "localhost");
	cr_assert_str_eq(d.socket, "/run/mysqld/mysqld.sock");
	cr_assert_str_eq(d.password, "p@ss");
	url_db_free(&d);
}

Test(cfg, db_url_ipv6_and_database_alphabet)
{
	struct cfg_db d;

	db_ok("mysql://u:p@[2001:db8::5]:3306/Inbox_2$x", &d);
	cr_assert_str_eq(d.host, "2001:db8::5");
	cr_assert_str_eq(d.database, "Inbox_2$x");
	url_db_free(&d);
}

/* SPEC.md: any TLS option turns TLS on, and the server certificate is
 * verified unless ssl-verify=0. */
Test(cfg, db_url_any_tls_option_turns_tls_on_and_verifies)
{
	static const char *const on[] = {
		"mysql://u:p@h/d?ssl=1",
		"mysql://u:p@h/d?ssl-ca=/ca.pem",
		"mysql://u:p@h/d?ssl-capath=/etc/ssl/certs",
		"mysql://u:p@h/d?ssl-cert=/c.pem&ssl-key=/k.pem",
		"mysql://u:p@h/d?ssl-verify=1",
		"mysql://u:p@h/d?ssl-verify=true&ssl-ca=/ca.pem",
	};
	struct cfg_db d;

	for (size_t i = 0; i < sizeof on / sizeof on[0]; i++) {
		db_ok(on[i], &d);
		cr_expect(d.ssl, "%s: TLS on", on[i]);
		cr_expect(d.ssl_verify, "%s: the server certificate verified", on[i]);
		url_db_free(&d);
	}
	db_ok("mysql://u:p@h/d?ssl-ca=/ca.pem&ssl-cert=/c.pem&ssl-key=/k.pem&ssl-capath=/cas", &d);
	cr_assert_str_eq(d.ssl_ca, "/ca.pem");
	cr_assert_str_eq(d.ssl_cert, "/c.pem");
	cr_assert_str_eq(d.ssl_key, "/k.pem");
	cr_assert_str_eq(d.ssl_capath, "/cas");
	url_db_free(&d);
	db_ok("mysql://u:p@h/d?ssl-verify=0&ssl-ca=/ca.pem", &d);
	cr_assert(d.ssl, "ssl-verify=0 is a TLS option too: encrypted, not verified");
	cr_assert_not(d.ssl_verify);
	url_db_free(&d);
	db_ok("mysql://u:p@h/d?ssl=1&ssl-verify=false", &d);
	cr_assert(d.ssl);
	cr_assert_not(d.ssl_verify);
	url_db_free(&d);
	db_ok("mysql://u:p@h/d?ssl=0", &d);
	cr_assert_not(d.ssl);
	cr_assert_not(d.ssl_verify);
	url_db_free(&d);
	db_bad("mysql://u:hunter2@h/d?ssl=0&ssl-ca=/ca.pem",
	       "bad URL: ssl=0 contradicts the other ssl-* options");
	db_bad("mysql://u:hunter2@h/d?ssl-cert=/c.pem", "bad URL: ssl-cert and ssl-key go together");
	db_bad("mysql://u:hunter2@h/d?ssl-key=/k.pem", "bad URL: ssl-cert and ssl-key go together");
	db_bad("mysql://u:hunter2@h/d?ssl-key=", "bad URL: ssl-key needs a path");
}

Test(cfg, db_bad_urls)
{
	db_bad("", "bad URL: empty");
	db_bad("postgres://u:hunter2@h/d", "bad URL: scheme must be mysql:// or mariadb://");
	db_bad("mysql://u:hunter2@/d", "bad URL: missing host");
	db_bad("mysql://h/d", "bad URL: missing user name (mysql://user:pass@host/db)");
	db_bad("mysql://u:hunter2@h", "bad URL: missing database name (mysql://user:pass@host/db)");
	db_bad("mysql://u:hunter2@h/", "bad URL: missing database name (mysql://user:pass@host/db)");
	db_bad("mysql://u:hunter2@h/my-db",
	       "bad URL: database name must be 1-64 characters of [A-Za-z0-9_$]");
	db_bad("mysql://u:hunter2@h/a%2Fb",
	       "bad URL: database name must be 1-64 characters of [A-Za-z0-9_$]");
	db_bad("mysql://u:hunter2@h/"
	       "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
	       "bad URL: database name must be 1-64 characters of [A-Za-z0-9_$]");
	db_bad("mysql://u:hunter2@h:70000/d", "bad URL: port out of range [1, 65535]");
	db_bad("mysql://u:hunter2@h/d?sslmode=require",
	       "bad URL: unknown option 'sslmode' "
	       "(known: ssl, ssl-ca, ssl-capath, ssl-cert, ssl-key, ssl-verify, socket, connect-timeout)");
	db_bad("mysql://u:hunter2@h/d?password=hunter2",
	       "bad URL: unknown option 'password' "
	       "(known: ssl, ssl-ca, ssl-capath, ssl-cert, ssl-key, ssl-verify, socket, connect-timeout)");
	db_bad("mysql://u:hunter2@h/d?ssl=yes", "bad URL: ssl must be 0, 1, true or false");
	db_bad("mysql://u:hunter2@h/d?ssl-verify=2", "bad URL: ssl-verify must be 0, 1, true or false");
	db_bad("mysql://u:hunter2@h/d?ssl", "bad URL: option 'ssl' needs a value (name=value)");
	db_bad("mysql://u:hunter2@h/d?ssl=1&&socket=/s", "bad URL: empty option");
	db_bad("mysql://u:hunter2@h/d?connect-timeout=0",
	       "bad URL: connect-timeout: out of range [1, 3600]: '0'");
	db_bad("mysql://u:hunter2@h/d?connect-timeout=5s",
	       "bad URL: connect-timeout: not a number: '5s'");
	db_bad("mysql://u:hunter2@h/d?socket=", "bad URL: socket needs a path");
	db_bad("mysql://u:hunter2@h/d?ssl-ca=%zz", "bad URL: bad percent escape in option value");
	db_bad("mysql://u:hunter2%@h/d", "bad URL: bad percent escape in password");
}

Test(cfg, db_error_from_load_names_the_variable)
{
	expect_env_err("INBOX_DB_URL", "mysql://u:hunter2@h/d?tls=1",
	               "INBOX_DB_URL: bad URL: unknown option 'tls' "
	               "(known: ssl, ssl-ca, ssl-capath, ssl-cert, ssl-key, ssl-verify, socket, connect-timeout)");
	EXPECT_ERR("INBOX_DB_URL: bad URL: missing host", "--db-url", "mysql://u:hunter2@/d", NULL);
}

/* ---- passwords ----------------------------------------------------------- */

Test(cfg, password_never_in_error_or_redacted)
{
	/* Each is broken somewhere; none may echo the password. */
	const char *bad[] = {
		"amqp://u:hunter2@h:bad/",       "amqp://u:hunter2@h/a/b",
		"amqp://u:hunter2/x@h/",         "amqp://u:hunter2",
		"amqp://u:hunter2@h?x=1",        "amqps://u:hunter2@[::1",
		"mysql://u:hunter2@h/d?x=1",     "mysql://u:hunter2@h:0/d",
		"mysql://u:hunter2",             "mysql://u:hun?ter2@h/d",
		"hunter2",                       "amqp://u:hunter2@h o/",
	};
	struct cfg c;
	char err[512];

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		setenv(strncmp(bad[i], "mysql", 5) == 0 ? "INBOX_DB_URL" : "INBOX_AMQP_URL", bad[i], 1);
		cr_assert_eq(LOAD(&c, err, NULL), CFG_ERROR, "accepted %s", bad[i]);
		cr_assert_null(strstr(err, "hunter2"), "password in error: %s", err);
		cr_assert_null(strstr(err, "hun"), "part of password in error: %s", err);
		unsetenv("INBOX_DB_URL");
		unsetenv("INBOX_AMQP_URL");
	}
	/* Good URLs: the redacted forms hide the password, encoded or not. */
	setenv("INBOX_AMQP_URL", "amqps://u:hunter2@mq/v", 1);
	setenv("INBOX_DB_URL", "mysql://u:hunter%32@db/d?ssl=1", 1);
	LOAD_OK(&c, NULL);
	cr_assert_null(strstr(c.amqp.redacted, "hunter"));
	cr_assert_null(strstr(c.db.redacted, "hunter"));
	cr_assert_str_eq(c.amqp.redacted, "amqps://u:***@mq/v");
	cr_assert_str_eq(c.db.redacted, "mysql://u:***@db/d?ssl=1");
	cr_assert_str_eq(c.db.password, "hunter2");
	cfg_free(&c);
}

/* ---- help ---------------------------------------------------------------- */

Test(cfg, help_lists_every_setting)
{
	static const char *const want[] = {
		"INBOX_AMQP_URL", "--amqp-url", "INBOX_AMQP_URL_FILE", "--amqp-url-file",
		"INBOX_DB_URL", "--db-url", "INBOX_DB_URL_FILE", "--db-url-file",
		"INBOX_THREADS", "--threads", "INBOX_PREFETCH", "--prefetch",
		"INBOX_CONSUMER", "--consumer", "INBOX_QUEUE", "--queue",
		"INBOX_EXCHANGE", "--exchange", "INBOX_DLX", "--dlx", "INBOX_DLQ", "--dlq",
		"INBOX_OUT_EXCHANGE", "--out-exchange", "INBOX_MAX_BODY", "--max-body",
		"INBOX_RETENTION", "--retention", "INBOX_CLEANUP_INTERVAL", "--cleanup-interval",
		"INBOX_HOLD_TTL", "--hold-ttl",
		"INBOX_METRICS_ADDR", "--metrics-addr", "INBOX_LOG_FORMAT", "--log-format",
		"INBOX_LOG_LEVEL", "--log-level", "INBOX_DELIVERY_LIMIT", "--delivery-limit",
		"INBOX_MAX_RETRIES", "--max-retries", "INBOX_HEARTBEAT", "--heartbeat",
		"INBOX_ORDERING", "--ordering", "INBOX_SHARDS", "--shards",
		"INBOX_BATCH", "--batch", "INBOX_MIGRATIONS_DIR", "--migrations-dir",
		"INBOX_OUTBOX_DISPATCH", "--outbox-dispatch", "INBOX_OUTBOX_SWEEP", "--outbox-sweep",
		"--help", "--version", "usage: inbox-worker [flags]",
		"default: 4", "default: 7d", "default: amqp://guest:guest@127.0.0.1:5672/%2f",
		"[1, 256]", "shared|sharded",
	};
	char buf[16384];
	FILE *f = tmpfile();
	size_t n;

	cr_assert_not_null(f);
	cfg_print_help(f, "usage: inbox-worker [flags]", NULL);
	rewind(f);
	n = fread(buf, 1, sizeof buf - 1, f);
	buf[n] = '\0';
	fclose(f);
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
		cr_assert_not_null(strstr(buf, want[i]), "help lacks %s:\n%s", want[i], buf);
}

static bool only_threads(const char *env)
{
	return strcmp(env, "INBOX_THREADS") == 0;
}

/* inbox-loadgen's --help shows only the settings it reads: the filter
 * keeps a setting's whole block and drops the others', and the --help and
 * --version lines stay. */
Test(cfg, help_filter_keeps_the_chosen_settings_blocks)
{
	char buf[16384];
	FILE *f = tmpfile();
	size_t n;

	cr_assert_not_null(f);
	cfg_print_help(f, NULL, only_threads);
	rewind(f);
	n = fread(buf, 1, sizeof buf - 1, f);
	buf[n] = '\0';
	fclose(f);
	cr_assert_not_null(strstr(buf, "INBOX_THREADS"), "%s", buf);
	cr_assert_not_null(strstr(buf, "[1, 256]"), "the kept setting's help line: %s", buf);
	cr_assert_not_null(strstr(buf, "--version"), "%s", buf);
	cr_assert_null(strstr(buf, "INBOX_AMQP_URL"), "%s", buf);
	cr_assert_null(strstr(buf, "INBOX_PREFETCH"), "%s", buf);
}

Test(cfg, scrub_argv_masks_the_password_of_every_url_flag)
{
	char a0[] = "inbox-worker", a1[] = "--amqp-url", a2[] = "amqps://u:se@cr/et@h:5671/v?verify=verify_peer",
	     a3[] = "--db-url=mysql://u:pw@h/db", a4[] = "--migrate-db-url", a5[] = "mysql://owner:topsecret@h/db",
	     a6[] = "--threads", a7[] = "u:notapassword@x", a8[] = "--db-url-file", a9[] = "/run/a:b@c",
	     a10[] = "--amqp-url=amqp://nouser@h/";
	char *argv[] = { a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, NULL };

	cfg_scrub_argv(11, argv);
	cr_assert_str_eq(argv[2], "amqps://u:********@h:5671/v?verify=verify_peer");
	cr_assert_str_eq(argv[3], "--db-url=mysql://u:**@h/db");
	cr_assert_str_eq(argv[5], "mysql://owner:*********@h/db");
	cr_assert_str_eq(argv[7], "u:notapassword@x", "not a URL flag: left alone");
	cr_assert_str_eq(argv[9], "/run/a:b@c", "a *_URL_FILE path holds no password");
	cr_assert_str_eq(argv[10], "--amqp-url=amqp://nouser@h/");
}

/* ---- several nodes of one cluster (SPEC.md: comma-separated) ----------- */

Test(cfg, url_lists_are_the_nodes_of_one_cluster)
{
	struct cfg_amqp a;
	struct cfg_db d;

	amqp_ok("amqp://u:hunter2@mq1:5690/v,amqp://u:hunter2@mq2:5691/v,amqps://u:hunter2@mq3/v", &a);
	cr_assert_str_eq(a.host, "mq1");
	cr_assert_eq(a.port, 5690);
	cr_assert_str_eq(a.redacted, "amqp://u:***@mq1:5690/v");
	cr_assert_not_null(a.next);
	cr_assert_str_eq(a.next->host, "mq2");
	cr_assert_eq(a.next->port, 5691);
	cr_assert_not_null(a.next->next);
	cr_assert_str_eq(a.next->next->host, "mq3");
	cr_assert(a.next->next->tls);
	cr_assert_eq(a.next->next->port, 5671);
	cr_assert_null(a.next->next->next);
	url_amqp_free(&a);
	cr_assert_null(a.next);

	db_ok("mysql://w:hunter2@db1:3320/inbox,mysql://w:hunter2@db2:3321/inbox?connect-timeout=2", &d);
	cr_assert_str_eq(d.host, "db1");
	cr_assert_eq(d.port, 3320);
	cr_assert_not_null(d.next);
	cr_assert_str_eq(d.next->host, "db2");
	cr_assert_eq(d.next->connect_timeout_s, 2);
	cr_assert_null(d.next->next);
	url_db_free(&d);
	cr_assert_null(d.next);

	/* one URL is a list of one */
	db_ok("mysql://w:hunter2@db1/inbox", &d);
	cr_assert_null(d.next);
	url_db_free(&d);
}

Test(cfg, a_bad_node_in_a_list_is_named_by_its_place)
{
	amqp_bad("amqp://u:hunter2@mq1/v,", "node 2 of the list: empty");
	amqp_bad("amqp://u:hunter2@mq1/v,,amqp://mq3/v", "node 2 of the list: empty");
	amqp_bad("amqp://u:hunter2@mq1/v,http://mq2/v", "node 2 of the list: bad URL: scheme must be amqp:// or amqps://");
	db_bad("mysql://w:hunter2@db1/inbox,mysql://w:hunter2@db2:99999/inbox", "node 2 of the list: bad URL: port out of range [1, 65535]");
}

/* The list's bound holds for both kinds (one loop, url_list): 16 nodes are
 * taken in order, a 17th is refused, and a bad last node frees the ones
 * before it (cr_assert_null(host) in *_bad; ASan would see a leak). */
Test(cfg, a_list_takes_sixteen_nodes_and_not_seventeen)
{
	char amqp[2048], db[2048];
	size_t al = 0, dl = 0;
	struct cfg_amqp a;
	struct cfg_db d;
	int n = 0;

	for (int i = 1; i <= URL_MAX_NODES + 1; i++) {
		if (i == URL_MAX_NODES + 1) {
			amqp_ok(amqp, &a);
			for (const struct cfg_amqp *x = &a; x != NULL; x = x->next) {
				char host[16];

				snprintf(host, sizeof host, "mq%d", ++n);
				cr_assert_str_eq(x->host, host);
			}
			cr_assert_eq(n, 16);
			url_amqp_free(&a);
			n = 0;
			db_ok(db, &d);
			for (const struct cfg_db *x = &d; x != NULL; x = x->next)
				n++;
			cr_assert_eq(n, 16);
			url_db_free(&d);
		}
		al += (size_t)snprintf(amqp + al, sizeof amqp - al, "%samqp://u:hunter2@mq%d/v", i > 1 ? "," : "", i);
		dl += (size_t)snprintf(db + dl, sizeof db - dl, "%smysql://w:hunter2@db%d/inbox", i > 1 ? "," : "", i);
		cr_assert_lt(al, sizeof amqp);
		cr_assert_lt(dl, sizeof db);
	}
	amqp_bad(amqp, "more than 16 nodes in the list");
	db_bad(db, "more than 16 nodes in the list");
	db_bad("mysql://w:hunter2@db1/inbox,mysql://w:hunter2@db2/inbox,mysql://w@db3/bad-name",
	       "node 3 of the list: bad URL: database name must be 1-64 characters of [A-Za-z0-9_$]");
}

/* One query walker for both kinds (url_query), each kind keeping its order
 * of checks: an amqps:// option's name is judged before its value is
 * decoded, a mysql:// option's value is decoded first. */
Test(cfg, each_kind_judges_an_option_in_its_own_order)
{
	amqp_bad("amqps://u:hunter2@h/v?bogus=%zz",
	         "bad URL: unknown option 'bogus' "
	         "(known: cacertfile, certfile, keyfile, verify, server_name_indication)");
	amqp_bad("amqp://u:hunter2@h/v?verify=%zz", "bad URL: TLS options need amqps://");
	amqp_bad("amqps://u:hunter2@h/v?verify=%zz", "bad URL: bad percent escape in option value");
	db_bad("mysql://w:hunter2@h/inbox?bogus=%zz", "bad URL: bad percent escape in option value");
	amqp_bad("amqps://u:hunter2@h/v?verify", "bad URL: option 'verify' needs a value (name=value)");
	db_bad("mysql://w:hunter2@h/inbox?ssl", "bad URL: option 'ssl' needs a value (name=value)");
	amqp_bad("amqps://u:hunter2@h/v?verify=verify_none&&x=1", "bad URL: empty option");
	db_bad("mysql://w:hunter2@h/inbox?ssl=1&&ssl-verify=1", "bad URL: empty option");
}

/* ---- settings that name a type or a field (issue 43, item 2) ------------- */

/* The map's right-hand sides are judged by the definition that runs, once
 * it is loaded (env_check_settings): cfg takes any type name. */
Test(cfg, the_type_map_takes_any_type_name_for_the_definition_to_judge)
{
	struct cfg c;

	setenv("INBOX_TYPE_MAP", "com.example.labelled=ShipmentLabelled", 1);
	LOAD_OK(&c, NULL);
	cr_expect_str_eq(c.type_map, "com.example.labelled=ShipmentLabelled");
	cfg_free(&c);
	unsetenv("INBOX_TYPE_MAP");
	expect_env_err("INBOX_TYPE_MAP", "x=not-a-type",
	               "INBOX_TYPE_MAP: 'not-a-type' is not an event type name (a letter, then letters, digits or _; "
	               "at most 64): 'x=not-a-type'");
}

/* INBOX_BIND: more topic patterns for the queue (a worker downstream of
 * another binds that one's emitted events), none by default. */
Test(cfg, bind_takes_routing_key_patterns)
{
	struct cfg c;

	LOAD_OK(&c, NULL);
	cr_expect_str_eq(c.bind, "");
	cfg_free(&c);
	setenv("INBOX_BIND", "ticket.#,loan.*.Approved", 1);
	LOAD_OK(&c, NULL);
	cr_expect_str_eq(c.bind, "ticket.#,loan.*.Approved");
	cfg_free(&c);
	unsetenv("INBOX_BIND");
	expect_env_err("INBOX_BIND", "ticket.#,", "INBOX_BIND: an empty routing key between commas: 'ticket.#,'");
	expect_env_err("INBOX_BIND", "ticket #", "INBOX_BIND: must be routing keys of [A-Za-z0-9._:-*#], 1-255 each, "
	                                         "separated by commas: 'ticket #'");
}

Test(cfg, the_order_id_field_takes_one_field_per_envelope)
{
	struct cfg c;

	setenv("INBOX_ENVELOPE", "auto", 1);
	setenv("INBOX_ORDER_ID_FIELD", "cloudevents=subject,masstransit=message.order.id", 1);
	LOAD_OK(&c, NULL);
	cfg_free(&c);
	setenv("INBOX_ORDER_ID_FIELD", "masstransit=orderRef", 1);
	LOAD_OK(&c, NULL);
	cfg_free(&c);
	expect_env_err("INBOX_ORDER_ID_FIELD", "a..b",
	               "INBOX_ORDER_ID_FIELD: must be subject, a dotted path such as data.order.id, or "
	               "cloudevents=FIELD,masstransit=FIELD: 'a..b'");
	expect_env_err("INBOX_ORDER_ID_FIELD", "kafka=subject",
	               "INBOX_ORDER_ID_FIELD: 'kafka' is not an envelope (cloudevents or masstransit): 'kafka=subject'");
	expect_env_err("INBOX_ORDER_ID_FIELD", "native=order_id",
	               "INBOX_ORDER_ID_FIELD: a native message carries its key in its own field; name cloudevents or "
	               "masstransit: 'native=order_id'");
	expect_env_err("INBOX_ORDER_ID_FIELD", "masstransit=subject",
	               "INBOX_ORDER_ID_FIELD: a MassTransit message has no subject (a path into its message, e.g. "
	               "masstransit=message.orderId): 'masstransit=subject'");
	expect_env_err("INBOX_ORDER_ID_FIELD", "cloudevents=subject,cloudevents=data.id",
	               "INBOX_ORDER_ID_FIELD: cloudevents is named twice: 'cloudevents=subject,cloudevents=data.id'");
	expect_env_err("INBOX_ORDER_ID_FIELD", "cloudevents=",
	               "INBOX_ORDER_ID_FIELD: must be subject, a dotted path such as data.order.id, or "
	               "cloudevents=FIELD,masstransit=FIELD: 'cloudevents='");
	unsetenv("INBOX_ENVELOPE");
}

/* A value that fits no envelope the worker receives is refused. */
Test(cfg, an_order_id_field_that_fits_no_envelope_received_is_refused)
{
	setenv("INBOX_ENVELOPE", "native", 1);
	expect_env_err("INBOX_ORDER_ID_FIELD", "subject",
	               "INBOX_ORDER_ID_FIELD: applies to no envelope that INBOX_ENVELOPE=native receives (a native "
	               "message carries its key in its own field): 'subject'");
	setenv("INBOX_ENVELOPE", "masstransit", 1);
	expect_env_err("INBOX_ORDER_ID_FIELD", "subject",
	               "INBOX_ORDER_ID_FIELD: applies to no envelope that INBOX_ENVELOPE=masstransit receives (for "
	               "MassTransit: message.PATH, PATH or masstransit=FIELD): 'subject'");
	expect_env_err("INBOX_ORDER_ID_FIELD", "cloudevents=data.id",
	               "INBOX_ORDER_ID_FIELD: applies to no envelope that INBOX_ENVELOPE=masstransit receives (for "
	               "MassTransit: message.PATH, PATH or masstransit=FIELD): 'cloudevents=data.id'");
	setenv("INBOX_ENVELOPE", "cloudevents", 1);
	expect_env_err("INBOX_ORDER_ID_FIELD", "message.orderId",
	               "INBOX_ORDER_ID_FIELD: applies to no envelope that INBOX_ENVELOPE=cloudevents receives (for "
	               "CloudEvents: subject, data.PATH, PATH or cloudevents=FIELD): 'message.orderId'");
	unsetenv("INBOX_ENVELOPE");
}
