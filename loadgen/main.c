/*
 * main.c - inbox-loadgen: the duplicate-injection publisher and the
 * verifier that proves every effect happened exactly once.
 *
 *   inbox-loadgen publish --ledger FILE [scenario options] [connection options]
 *   inbox-loadgen verify  --ledger FILE [--timeout S] [connection options]
 *   inbox-loadgen dlq unbind|bind [connection options]
 *
 * The command's own options are taken first; everything left over goes to
 * cfg_load, so the worker's environment (INBOX_AMQP_URL, INBOX_DB_URL,
 * INBOX_QUEUE, ...) and flags (--amqp-url, ...) mean the same here.
 * Exit codes follow SPEC.md: 2 for a usage or configuration error (one line
 * naming the setting), 1 for a runtime failure — and for verify, 1 when
 * anything is missing, doubled, wrong or unexpected.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "array.h"
#include "amqpx.h"
#include "args.h"
#include "cfg.h"
#include "db.h"
#include "log.h"
#include "mq.h"
#include "msg.h"
#include "publish.h"
#include "scenario.h"
#include "status.h"
#include "verify.h"

#define USAGE "usage: inbox-loadgen publish|verify --ledger FILE [options] | inbox-loadgen dlq unbind|bind\n" \
	"       inbox-loadgen send ROUTING_KEY BODY [--message-id ID] [settings]"

/* The settings inbox-loadgen reads (connections, names, the topology
 * publish declares, logging); the worker's pool, retention and metrics
 * settings mean nothing here. */
static const char *const lg_settings_used[] = {
	"INBOX_AMQP_URL", "INBOX_DB_URL", "INBOX_CONSUMER", "INBOX_QUEUE", "INBOX_EXCHANGE", "INBOX_DLX",
	"INBOX_DLQ", "INBOX_DLQ_TYPE", "INBOX_OUT_EXCHANGE", "INBOX_MAX_BODY", "INBOX_DELIVERY_LIMIT", "INBOX_ORDERING",
	"INBOX_SHARDS", "INBOX_LOG_FORMAT", "INBOX_LOG_LEVEL", NULL,
};

/* cfg_print_doc's filter: a variable name of lg_settings_used. */
static bool lg_setting_used_name(const char *env)
{
	for (int i = 0; lg_settings_used[i] != NULL; i++)
		if (strcmp(env, lg_settings_used[i]) == 0)
			return true;
	return false;
}

static bool lg_setting_used(const char *line)
{
	for (int i = 0; lg_settings_used[i] != NULL; i++) {
		size_t n = strlen(lg_settings_used[i]);
		if (strncmp(line, lg_settings_used[i], n) == 0 && (line[n] == ' ' || line[n] == '\0'))
			return true;
	}
	return false;
}

/* cfg_print_help prints every setting of the worker and has no filter (and
 * cfg.c is not ours to change here): print it into memory and keep the
 * blocks of the settings above — a block is a line "  INBOX_X ..." and the
 * indented lines after it.  The text stays the worker's, defaults included. */
static void help_settings(FILE *f)
{
	char *buf = NULL, *line, *save = NULL;
	size_t len = 0;
	FILE *mem = open_memstream(&buf, &len);
	bool keep = true;

	if (mem == NULL) {
		cfg_print_help(f, "connection options (same as inbox-worker):");
		return;
	}
	cfg_print_help(mem, "settings (as inbox-worker reads them; only those inbox-loadgen uses):");
	if (fclose(mem) != 0 || buf == NULL) {
		free(buf);
		cfg_print_help(f, "connection options (same as inbox-worker):");
		return;
	}
	for (line = strtok_r(buf, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
		/* The --help and --version lines after the last setting are
		 * not that setting's (they were dropped with it). */
		if (line[strspn(line, " ")] == '-')
			keep = true;
		else if (strncmp(line, "  INBOX_", 8) == 0)
			keep = lg_setting_used(line + 2);
		else if (strncmp(line, "      ", 6) != 0)
			keep = true;
		if (keep)
			fprintf(f, "%s\n", line);
	}
	free(buf);
}

/* `send`: one message to INBOX_EXCHANGE, persistent and confirmed (the
 * topology declared first, as the worker declares it): what an operator
 * needs to try a fix or to stage an incident by hand (doc/operations.md,
 * *Dead letters*).  argv: "send" RK BODY [--message-id ID] [settings]. */
static int lg_send(int argc, char **argv)
{
	struct cfg conf;
	char err[512];
	const char *mid = NULL;
	struct mq *m = NULL;
	int j = 1, rc, code = 1;

	if (argc < 3) {
		fprintf(stderr, "inbox-loadgen: send: say ROUTING_KEY and BODY\n%s\n", USAGE);
		return 2;
	}
	for (int i = 3; i < argc; i++) {
		if (strcmp(argv[i], "--message-id") == 0 && i + 1 < argc)
			mid = argv[++i];
		else
			argv[j++] = argv[i];
	}
	rc = cfg_load(&conf, j, argv, err, sizeof err);
	cfg_scrub_argv(j, argv);
	if (rc != CFG_OK) {
		if (rc == CFG_ERROR)
			fprintf(stderr, "inbox-loadgen: %s\n", err);
		else
			fprintf(stdout, "%s\n", USAGE);
		return rc == CFG_ERROR ? 2 : 0;
	}
	log_setup(conf.log_level, conf.log_format);
	rc = mq_open(&m, &conf.amqp, 0, "inbox-loadgen send");
	if (rc == ST_OK)
		rc = mq_declare_topology(m, &conf);
	if (rc == ST_OK) {
		struct mq_message msg = { .exchange = conf.exchange, .routing_key = argv[1], .body = argv[2],
			                  .len = strlen(argv[2]), .message_id = mid, .mandatory = true };
		rc = mq_publish_confirmed(m, &msg, 10000);
	}
	if (rc == ST_OK) {
		printf("sent %s to %s\n", argv[1], conf.exchange);
		code = 0;
	} else {
		fprintf(stderr, "inbox-loadgen: send: %s\n", m != NULL ? mq_errmsg(m) : st_strerror(rc));
	}
	mq_close(&m);
	cfg_free(&conf);
	return code;
}

static int parse_share(const char *name, const char *v, double *out, char *err, size_t errlen)
{
	char *end;
	double d;

	errno = 0;
	d = strtod(v, &end);
	if (errno != 0 || end == v || *end != '\0' || !isfinite(d) || d < 0.0 || d > 1.0) {
		snprintf(err, errlen, "%s: not a share between 0 and 1: '%s'", name, v);
		return -1;
	}
	*out = d;
	return 0;
}

static int parse_num(const char *name, const char *v, long min, long max, long *out, char *err, size_t errlen)
{
	char why[128];

	if (cfg_parse_long(v, min, max, out, why, sizeof why) != 0) {
		snprintf(err, errlen, "%s: %s", name, why);
		return -1;
	}
	return 0;
}

/* A duration as the worker takes it (cfg_parse_duration: 30, 30s, 5m, 2h,
 * 1d), bounded to [min, max] seconds. */
static int parse_dur(const char *name, const char *v, long min, long max, int *out, char *err, size_t errlen)
{
	char why[128];
	long s;

	if (cfg_parse_duration(v, &s, why, sizeof why) != 0) {
		snprintf(err, errlen, "%s: %s", name, why);
		return -1;
	}
	if (s < min || s > max) {
		snprintf(err, errlen, "%s: out of range [%lds, %lds]: '%s'", name, min, max, v);
		return -1;
	}
	*out = (int)s;
	return 0;
}

struct lg_args {
	struct lg_opts sc;
	long messages;
	struct lg_publish_opts po;
	struct lg_verify_opts vo;
};

/* What each option is when not given: --help and the man page print them
 * from here, main starts from a copy. */
static const struct lg_args lg_defaults = {
	.sc = { .seed = 1, .orders = 1000, .cancel_share = 0.3, .invalid_share = 0.01, .dup_rate = 0.2,
	        .concurrent_dups = 0.25, .delayed_dups = 0.25, .reorder_window = 3, .interleave = 32, .connections = 4 },
	.po = { .settle_timeout_s = 600, .retry_s = 120 },
	.vo = { .timeout_s = 300, .list_max = 20 },
};

/* What an option's value is and where it goes. */
enum lg_opt_kind {
	LG_OPT_STR,   /* const char * */
	LG_OPT_FLAG,  /* bool, no value */
	LG_OPT_LONG,  /* long in [min, max] */
	LG_OPT_INT,   /* int in [min, max] */
	LG_OPT_U64,   /* uint64_t in [min, max] */
	LG_OPT_RATE,  /* double, an integer in [min, max] */
	LG_OPT_SHARE, /* double in [0, 1] */
	LG_OPT_DUR,   /* int seconds in [min, max] */
	LG_OPT_RUN,   /* the run tag: char[], 1..16 of [A-Za-z0-9] */
};

#define LG_FOR_PUBLISH 0x1u
#define LG_FOR_VERIFY 0x2u

struct lg_opt {
	const char *name;
	unsigned cmds; /* LG_FOR_*: the commands that take it */
	enum lg_opt_kind kind;
	long min, max;
	size_t off;          /* of the value in struct lg_args */
	const char *metavar; /* NULL for a flag */
	const char *help;    /* --help and inbox-loadgen(1); the default is added from lg_defaults */
};

#define P LG_FOR_PUBLISH
#define V LG_FOR_VERIFY
#define A(field) offsetof(struct lg_args, field)

/* One table of options instead of one branch each (they were the same five
 * lines twenty times); parsing, --help and the man page read it. */
static const struct lg_opt lg_opt_table[] = {
	{ "--ledger", P | V, LG_OPT_STR, 0, 0, A(po.ledger), "FILE",
	  "the ledger: publish writes the expected outcomes there (JSON lines), verify reads them" },
	{ "--timeout", V, LG_OPT_DUR, 1, 86400, A(vo.timeout_s), "D", "wait at most D for the worker to go idle" },
	{ "--list", V, LG_OPT_INT, 1, 100000, A(vo.list_max), "N", "ids listed per problem kind" },
	{ "--json", V, LG_OPT_FLAG, 0, 0, A(vo.json), NULL,
	  "the report as one JSON object with every figure (exit code as ever)" },
	{ "--seed", P, LG_OPT_U64, 0, INT64_MAX, A(sc.seed), "N", "scenario seed" },
	{ "--run", P, LG_OPT_RUN, 0, 0, A(sc.run), "TAG",
	  "run tag in every id, [A-Za-z0-9] up to 16 (default: from the clock)" },
	{ "--orders", P, LG_OPT_LONG, 0, 10000000, A(sc.orders), "N", "orders" },
	{ "--messages", P, LG_OPT_LONG, 1, 40000000, A(messages), "N",
	  "instead of --orders: about N published messages" },
	{ "--cancel-share", P, LG_OPT_SHARE, 0, 0, A(sc.cancel_share), "F",
	  "share of orders cancelled, split over the 3 cancel paths" },
	{ "--invalid-share", P, LG_OPT_SHARE, 0, 0, A(sc.invalid_share), "F",
	  "share of cancelled orders that also get a ShipmentCreated" },
	{ "--dup-rate", P, LG_OPT_SHARE, 0, 0, A(sc.dup_rate), "F", "share of events published more than once" },
	{ "--concurrent-dups", P, LG_OPT_SHARE, 0, 0, A(sc.concurrent_dups), "F",
	  "of those, share sent at the same moment from several connections" },
	{ "--delayed-dups", P, LG_OPT_SHARE, 0, 0, A(sc.delayed_dups), "F",
	  "of those, share sent again after the originals were processed" },
	{ "--reorder-window", P, LG_OPT_INT, 0, 8, A(sc.reorder_window), "W",
	  "shuffle each order's events within W positions" },
	{ "--interleave", P, LG_OPT_LONG, 1, 1000000, A(sc.interleave), "N",
	  "orders whose events are interleaved: an order's events lie about N messages apart in the queue" },
	{ "--conflicts", P, LG_OPT_LONG, 0, 10000000, A(sc.conflicts), "N", "keys re-sent later with another payload" },
	{ "--malformed", P, LG_OPT_LONG, 0, 1000000, A(sc.malformed), "N",
	  "malformed messages spread over every SPEC.md class" },
	{ "--connections", P, LG_OPT_INT, 1, 64, A(sc.connections), "C", "publisher connections, each a thread" },
	{ "--rate", P, LG_OPT_RATE, 0, 10000000, A(po.rate), "R",
	  "messages per second over all connections, 0 = unlimited" },
	{ "--progress", P, LG_OPT_FLAG, 0, 0, A(po.progress), NULL,
	  "a progress line a second on stderr even when it is not a terminal" },
	{ "--settle-timeout", P, LG_OPT_DUR, 1, 86400, A(po.settle_timeout_s), "D",
	  "wait at most D for originals before the delayed phase" },
	{ "--settle-stall", P, LG_OPT_DUR, 0, 86400, A(po.settle_stall_s), "D",
	  "stop waiting for originals when none came for D, publish the delayed phase anyway and let "
	  "verify name the missing; 0 = never" },
	{ "--retry-timeout", P, LG_OPT_DUR, 1, 86400, A(po.retry_s), "D",
	  "after a broker fault keep reconnecting and re-publishing what was not confirmed for at most D; "
	  "a re-publish is a duplicate" },
};

#undef P
#undef V
#undef A

/* The default of option o as text ("" when it has none to show: a
 * string, a flag, or a number below the option's minimum, which means
 * unset, like --messages). */
static void opt_default(const struct lg_opt *o, char *dst, size_t n)
{
	const void *v = (const char *)&lg_defaults + o->off;

	dst[0] = '\0';
	if ((o->kind == LG_OPT_LONG && *(const long *)v < o->min) || (o->kind == LG_OPT_INT && *(const int *)v < o->min))
		return;
	switch (o->kind) {
	case LG_OPT_LONG: snprintf(dst, n, "%ld", *(const long *)v); break;
	case LG_OPT_INT: snprintf(dst, n, "%d", *(const int *)v); break;
	case LG_OPT_U64: snprintf(dst, n, "%llu", (unsigned long long)*(const uint64_t *)v); break;
	case LG_OPT_RATE:
	case LG_OPT_SHARE: snprintf(dst, n, "%g", *(const double *)v); break;
	case LG_OPT_DUR: cfg_format_duration(dst, n, *(const int *)v); break;
	case LG_OPT_STR:
	case LG_OPT_FLAG:
	case LG_OPT_RUN: break;
	}
}

/* The options of the commands in cmds, one "  --name META  help (default)"
 * each, the help wrapped under itself. */
static void print_opts(FILE *f, unsigned cmds)
{
	for (size_t i = 0; i < ARRAY_LEN(lg_opt_table); i++) {
		const struct lg_opt *o = &lg_opt_table[i];
		char left[64], def[32], text[512];
		const char *p;
		int col;

		if (!(o->cmds & cmds))
			continue;
		opt_default(o, def, sizeof def);
		snprintf(left, sizeof left, "%s%s%s", o->name, o->metavar ? " " : "", o->metavar ? o->metavar : "");
		snprintf(text, sizeof text, "%s%s%s%s", o->help, def[0] ? " (" : "", def, def[0] ? ")" : "");
		fprintf(f, "  %-22s", left);
		col = 25;
		for (p = text; *p != '\0';) {
			size_t w = strcspn(p, " ");

			if (col > 25 && col + 1 + (int)w > 100) {
				fprintf(f, "\n%24s", "");
				col = 24;
			}
			fputc(' ', f);
			col++;
			fprintf(f, "%.*s", (int)w, p);
			col += (int)w;
			p += w;
			while (*p == ' ')
				p++;
		}
		fputc('\n', f);
	}
}

/* Text into pandoc markdown (as cfg.c's put_md). */
static void put_md(FILE *f, const char *s)
{
	for (; *s != '\0'; s++) {
		if (strchr("\\*_[]<>|#~^$@", *s) != NULL)
			fputc('\\', f);
		fputc(*s, f);
	}
}

/* `inbox-loadgen --help-man publish|verify|settings`: the options of a
 * command, or the settings inbox-loadgen reads, as a pandoc definition
 * list for inbox-loadgen(1) (man/meson.build).  Not in --help. */
static int help_man(const char *what)
{
	unsigned cmds = strcmp(what, "publish") == 0 ? LG_FOR_PUBLISH : strcmp(what, "verify") == 0 ? LG_FOR_VERIFY : 0;

	if (strcmp(what, "settings") == 0) {
		cfg_print_doc(stdout, CFG_DOC_MAN, lg_setting_used_name);
	} else if (cmds == 0) {
		fprintf(stderr, "inbox-loadgen: --help-man publish|verify|settings\n");
		return 2;
	}
	for (size_t i = 0; cmds != 0 && i < ARRAY_LEN(lg_opt_table); i++) {
		const struct lg_opt *o = &lg_opt_table[i];
		char def[32];

		if (!(o->cmds & cmds))
			continue;
		opt_default(o, def, sizeof def);
		fputs("**\\-\\-", stdout);
		put_md(stdout, o->name + 2);
		fputs("**", stdout);
		if (o->metavar != NULL)
			fprintf(stdout, " *%s*", o->metavar);
		fputs("\n:   ", stdout);
		put_md(stdout, o->help);
		fputs(".", stdout);
		if (def[0] != '\0')
			fprintf(stdout, " Default: %s.", def);
		fputs("\n\n", stdout);
	}
	return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}

static void usage(FILE *f)
{
	fputs(USAGE "\n\n"
	      "publish: build a deterministic scenario from --seed, write its ledger, publish it.\n", f);
	print_opts(f, LG_FOR_PUBLISH);
	fputs("\n"
	      "verify: wait for the worker to go idle, then check the database and queues against the ledger.\n", f);
	print_opts(f, LG_FOR_VERIFY);
	fputs("\n"
	      "dlq unbind|bind: remove or restore the binding of the dead-letter queue (INBOX_DLQ) to the\n"
	      "  dead-letter exchange (INBOX_DLX), key '#'; a fault the chaos run injects.\n"
	      "send ROUTING_KEY BODY: one persistent, confirmed message to INBOX_EXCHANGE (--message-id ID\n"
	      "  sets its message id), the topology declared first.\n"
	      "Durations as inbox-worker takes them: 90, 90s, 5m, 2h, 1d.\n"
	      "\n",
	      f);
	help_settings(f);
}

/* Parse value v of option o into its place in a.  Returns 0 or -1 (err). */
static int parse_opt(const struct lg_opt *o, struct lg_args *a, const char *v, char *err, size_t errlen)
{
	void *dst = (char *)a + o->off;
	long n;

	switch (o->kind) {
	case LG_OPT_STR:
		*(const char **)dst = v;
		return 0;
	case LG_OPT_FLAG:
		*(bool *)dst = true;
		return 0;
	case LG_OPT_SHARE:
		return parse_share(o->name, v, dst, err, errlen);
	case LG_OPT_DUR:
		return parse_dur(o->name, v, o->min, o->max, dst, err, errlen);
	case LG_OPT_RUN:
		if (strlen(v) == 0 || strlen(v) > 16 ||
		    strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") != strlen(v)) {
			snprintf(err, errlen, "%s: 1..16 characters of [A-Za-z0-9]: '%s'", o->name, v);
			return -1;
		}
		snprintf(dst, sizeof ((struct lg_opts *)NULL)->run, "%s", v);
		return 0;
	case LG_OPT_LONG:
	case LG_OPT_INT:
	case LG_OPT_U64:
	case LG_OPT_RATE:
		break;
	}
	if (parse_num(o->name, v, o->min, o->max, &n, err, errlen) != 0)
		return -1;
	if (o->kind == LG_OPT_LONG)
		*(long *)dst = n;
	else if (o->kind == LG_OPT_INT)
		*(int *)dst = (int)n;
	else if (o->kind == LG_OPT_U64)
		*(uint64_t *)dst = (uint64_t)n;
	else
		*(double *)dst = (double)n;
	return 0;
}

/* Take the options this program knows out of argv; the rest is copied to
 * rest (argv[0] first) for cfg_load.  Returns 0, 1 for --help, -1 on error. */
static int parse_args(bool publish, bool dlq, int argc, char **argv, struct lg_args *a, char **rest, int *nrest,
                      char *err, size_t errlen)
{
	const unsigned cmd = publish ? LG_FOR_PUBLISH : LG_FOR_VERIFY;

	*nrest = 0;
	rest[(*nrest)++] = argv[0];
	for (int i = 1; i < argc; i++) {
		const struct lg_opt *o = NULL;
		const char *v = NULL;
		bool missing = false;

		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
			return 1;
		for (size_t k = 0; k < ARRAY_LEN(lg_opt_table) && o == NULL; k++) {
			const struct lg_opt *t = &lg_opt_table[k];

			if (!(t->cmds & cmd))
				continue;
			if (t->kind == LG_OPT_FLAG) {
				if (strcmp(argv[i], t->name) == 0)
					o = t;
			} else if ((v = args_value(argc, argv, &i, t->name, &missing)) != NULL || missing) {
				o = t;
			}
		}
		if (o == NULL) {
			rest[(*nrest)++] = argv[i];
			continue;
		}
		if (missing) {
			snprintf(err, errlen, "%s: needs a value", o->name);
			return -1;
		}
		if (parse_opt(o, a, v, err, errlen) != 0)
			return -1;
	}
	a->vo.ledger = a->po.ledger;
	rest[*nrest] = NULL;
	if (a->po.ledger == NULL && !dlq) {
		snprintf(err, errlen, "--ledger: required");
		return -1;
	}
	if (a->sc.cancel_share + a->sc.invalid_share > 1.0) {
		snprintf(err, errlen, "--cancel-share: with --invalid-share more than 1");
		return -1;
	}
	if (a->sc.concurrent_dups + a->sc.delayed_dups > 1.0) {
		snprintf(err, errlen, "--concurrent-dups: with --delayed-dups more than 1");
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct lg_args a = lg_defaults;
	struct cfg conf;
	char err[512];
	char **rest;
	int nrest, rc, code = 1;
	bool publish, dlq, bind = false;

	if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (strcmp(argv[1], "--version") == 0) {
		printf("inbox-loadgen %s\n", INBOX_VERSION);
		return 0;
	}
	if (strcmp(argv[1], "--help-man") == 0)
		return help_man(argc > 2 ? argv[2] : "");
	if (strcmp(argv[1], "send") == 0)
		return lg_send(argc - 1, argv + 1);
	if (strcmp(argv[1], "publish") != 0 && strcmp(argv[1], "verify") != 0 && strcmp(argv[1], "dlq") != 0) {
		fprintf(stderr, "inbox-loadgen: unknown command '%s'\n%s\n", argv[1], USAGE);
		return 2;
	}
	publish = strcmp(argv[1], "publish") == 0;
	dlq = strcmp(argv[1], "dlq") == 0;
	if (dlq) {
		if (argc < 3 || (strcmp(argv[2], "unbind") != 0 && strcmp(argv[2], "bind") != 0)) {
			fprintf(stderr, "inbox-loadgen: dlq: say unbind or bind\n%s\n", USAGE);
			return 2;
		}
		bind = strcmp(argv[2], "bind") == 0;
		argv++;
		argc--;
	}
	rest = calloc((size_t)argc + 1, sizeof *rest);
	if (rest == NULL)
		return 1;
	rc = parse_args(publish, dlq, argc - 1, argv + 1, &a, rest, &nrest, err, sizeof err);
	if (rc == 1) {
		usage(stdout);
		free(rest);
		return 0;
	}
	if (rc != 0) {
		fprintf(stderr, "inbox-loadgen: %s\n", err);
		free(rest);
		return 2;
	}
	rc = cfg_load(&conf, nrest, rest, err, sizeof err);
	/* rest points into argv: mask the URLs' passwords in the process list. */
	cfg_scrub_argv(nrest, rest);
	switch (rc) {
	case CFG_OK:
		break;
	case CFG_HELP:
		usage(stdout);
		free(rest);
		return 0;
	case CFG_VERSION:
		printf("inbox-loadgen %s\n", INBOX_VERSION);
		free(rest);
		return 0;
	default:
		fprintf(stderr, "inbox-loadgen: %s\n", err);
		free(rest);
		return 2;
	}
	free(rest);
	/* Library logs (connect failures) at warn and above only: the report
	 * is what this program is for. */
	log_setup(conf.log_level < LOG_LEVEL_WARN ? conf.log_level : LOG_LEVEL_WARN, conf.log_format);
	if (db_global_init() != ST_OK) {
		fprintf(stderr, "inbox-loadgen: cannot initialise the database client\n");
		cfg_free(&conf);
		return 1;
	}
	if (dlq) {
		if (lgx_queue_bind(&conf.amqp, conf.dlq, conf.dlx, "#", bind, err, sizeof err) != 0) {
			fprintf(stderr, "inbox-loadgen: dlq %s: %s\n", bind ? "bind" : "unbind", err);
		} else {
			printf("%s %s %s '#'\n", conf.dlq, bind ? "bound to" : "unbound from", conf.dlx);
			code = 0;
		}
	} else if (publish) {
		struct lg_scenario s;

		a.sc.max_body = conf.max_body;
		if (a.messages > 0) {
			a.sc.orders = (long)((double)a.messages / lg_messages_per_order(&a.sc) + 0.5);
			if (a.sc.orders < 1)
				a.sc.orders = 1;
		}
		if (lg_scenario_build(&s, &a.sc) != 0) {
			fprintf(stderr, "inbox-loadgen: cannot build the scenario\n");
		} else {
			code = lg_publish(&conf, &s, &a.po);
			lg_scenario_free(&s);
		}
	} else {
		code = lg_verify(&conf, &a.vo);
	}
	db_global_end();
	cfg_free(&conf);
	return code;
}
