/*
 * main.c - inbox-loadgen: the duplicate-injection publisher and the
 * verifier that proves every effect happened exactly once.
 *
 *   inbox-loadgen publish --ledger FILE [--lifecycle FILE] [--envelope E] [scenario options] [connection options]
 *   inbox-loadgen verify  --ledger FILE [--lifecycle FILE] [--timeout S] [connection options]
 *   inbox-loadgen dlq unbind|bind [connection options]
 *
 *   inbox-loadgen send ROUTING_KEY BODY [--message-id ID] [connection options]
 *
 * A table of commands (lg_commands) and one table of every command's
 * options (lg_opt_table, read by args.h's parser, --help and the man
 * page).  The command's own options are taken first; everything left over
 * goes to cfg_load, so the worker's environment (INBOX_AMQP_URL,
 * INBOX_DB_URL, INBOX_QUEUE, ...) and flags (--amqp-url, ...) mean the same
 * here.
 * --lifecycle FILE (or INBOX_LIFECYCLE) plans and verifies the aggregates
 * of that lifecycle definition instead of the built-in order lifecycle,
 * which is itself a definition (lc_builtin_order) read the same way.
 * Exit codes follow SPEC.md: 2 for a usage or configuration error (one line
 * naming the setting), 1 for a runtime failure — and for verify, 1 when
 * anything is missing, doubled, wrong or unexpected.
 */
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
#include "lifecycle.h"
#include "log.h"
#include "mq.h"
#include "msg.h"
#include "publish.h"
#include "scenario.h"
#include "status.h"
#include "verify.h"
#include "version.h"

#define USAGE "usage: inbox-loadgen publish|verify --ledger FILE [options] | inbox-loadgen dlq unbind|bind\n" \
	"       inbox-loadgen send ROUTING_KEY BODY [--message-id ID] [settings]"

/* The settings inbox-loadgen reads (connections, names, the topology
 * publish declares, logging); the worker's pool, retention and metrics
 * settings mean nothing here. */
static const char *const lg_settings_used[] = {
	"INBOX_AMQP_URL", "INBOX_DB_URL", "INBOX_CONSUMER", "INBOX_QUEUE", "INBOX_EXCHANGE", "INBOX_DLX",
	"INBOX_DLQ", "INBOX_DLQ_TYPE", "INBOX_OUT_EXCHANGE", "INBOX_MAX_BODY", "INBOX_DELIVERY_LIMIT", "INBOX_ORDERING",
	"INBOX_SHARDS", "INBOX_LIFECYCLE", "INBOX_HEARTBEAT", "INBOX_LOG_FORMAT", "INBOX_LOG_LEVEL", NULL,
};

/* cfg_print_help's and cfg_print_doc's filter: a variable name of
 * lg_settings_used. */
static bool lg_setting_used_name(const char *env)
{
	for (int i = 0; lg_settings_used[i] != NULL; i++)
		if (strcmp(env, lg_settings_used[i]) == 0)
			return true;
	return false;
}

struct lg_args {
	struct lg_opts sc;
	long messages;
	struct lg_publish_opts po;
	struct lg_verify_opts vo;
	const char *message_id; /* send */
	const char *lifecycle;  /* publish, verify: --lifecycle FILE */
	const char *envelope;   /* publish: --envelope NAME (lg_envelope_names) */
	const char *pos[2];     /* the words after the command: dlq unbind|bind; send ROUTING_KEY BODY */
};

/* What each option is when not given: --help and the man page print them
 * from here, main starts from a copy. */
static const struct lg_args lg_defaults = {
	.sc = { .seed = 1, .orders = 1000, .cancel_share = 0.3, .invalid_share = 0.01, .dup_rate = 0.2,
	        .concurrent_dups = 0.25, .delayed_dups = 0.25, .reorder_window = 3, .interleave = 32, .connections = 4 },
	.po = { .settle_timeout_s = 600, .retry_s = 120 },
	.vo = { .timeout_s = 300, .list_max = 20 },
};

/* The commands, in the order of the bits of the option table. */
enum lg_cmd { LG_PUBLISH = 0, LG_VERIFY, LG_DLQ, LG_SEND, LG_NCMDS };
static const char *const lg_cmd_names[] = {
	[LG_PUBLISH] = "publish", [LG_VERIFY] = "verify", [LG_DLQ] = "dlq", [LG_SEND] = "send",
};
_Static_assert(ARRAY_LEN(lg_cmd_names) == LG_NCMDS, "one name per enum lg_cmd");

#define P ARGS_BIT(LG_PUBLISH)
#define V ARGS_BIT(LG_VERIFY)
#define S ARGS_BIT(LG_SEND)
#define A(field) offsetof(struct lg_args, field)

_Static_assert(sizeof ((struct lg_opts *)NULL)->run > 16, "--run holds 16 characters and the NUL");

/* Every option of every command: parsing (args_take), --help and the man
 * page read this one table. */
static const struct args_opt lg_opt_table[] = {
	{ "--ledger", P | V, ARGS_STR, 0, 0, A(po.ledger), 0, "FILE",
	  "the ledger: publish writes the expected outcomes there (JSON lines), verify reads them" },
	{ "--lifecycle", P | V, ARGS_STR, 0, 0, A(lifecycle), 0, "FILE",
	  "the lifecycle definition to plan (publish) and verify against, as the worker's INBOX_LIFECYCLE "
	  "(default: INBOX_LIFECYCLE, else the built-in order lifecycle)" },
	{ "--envelope", P, ARGS_STR, 0, 0, A(envelope), 0, "E",
	  "how each message is sent: native (our format), cloudevents (CloudEvents 1.0 structured mode: "
	  "application/cloudevents+json) or cloudevents-binary (cloudEvents:* headers, the data as the body); "
	  "in CloudEvents the sources are URIs and part of the ids 150 characters, and the worker must read "
	  "them (INBOX_ENVELOPE cloudevents or auto)" },
	{ "--timeout", V, ARGS_DUR_INT, 1, 86400, A(vo.timeout_s), 0, "D", "wait at most D for the worker to go idle" },
	{ "--list", V, ARGS_INT, 1, 100000, A(vo.list_max), 0, "N", "ids listed per problem kind" },
	{ "--json", V, ARGS_FLAG, 0, 0, A(vo.json), 0, NULL,
	  "the report as one JSON object with every figure (exit code as ever)" },
	{ "--seed", P, ARGS_U64, 0, INT64_MAX, A(sc.seed), 0, "N", "scenario seed" },
	{ "--run", P, ARGS_TAG, 0, 16, A(sc.run), 0, "TAG",
	  "run tag in every id, [A-Za-z0-9] up to 16 (default: from the clock)" },
	{ "--orders", P, ARGS_LONG, 0, 10000000, A(sc.orders), 0, "N", "orders (with --lifecycle: aggregates)" },
	{ "--messages", P, ARGS_LONG, 1, 40000000, A(messages), 0, "N",
	  "instead of --orders: about N published messages" },
	{ "--cancel-share", P, ARGS_SHARE, 0, 0, A(sc.cancel_share), 0, "F",
	  "share of orders cancelled, split over the 3 cancel paths (with --lifecycle: of aggregates ending in a "
	  "terminal branch off the main path, split over the branches)" },
	{ "--invalid-share", P, ARGS_SHARE, 0, 0, A(sc.invalid_share), 0, "F",
	  "share of cancelled orders that also get a ShipmentCreated (with --lifecycle: of aggregates on the "
	  "invalid route, a branch plus an event invalid after it)" },
	{ "--dup-rate", P, ARGS_SHARE, 0, 0, A(sc.dup_rate), 0, "F", "share of events published more than once" },
	{ "--concurrent-dups", P, ARGS_SHARE, 0, 0, A(sc.concurrent_dups), 0, "F",
	  "of those, share sent at the same moment from several connections" },
	{ "--delayed-dups", P, ARGS_SHARE, 0, 0, A(sc.delayed_dups), 0, "F",
	  "of those, share sent again after the originals were processed" },
	{ "--reorder-window", P, ARGS_INT, 0, 8, A(sc.reorder_window), 0, "W",
	  "shuffle each order's events within W positions" },
	{ "--interleave", P, ARGS_LONG, 1, 1000000, A(sc.interleave), 0, "N",
	  "orders whose events are interleaved: an order's events lie about N messages apart in the queue" },
	{ "--conflicts", P, ARGS_LONG, 0, 10000000, A(sc.conflicts), 0, "N", "keys re-sent later with another payload" },
	{ "--malformed", P, ARGS_LONG, 0, 1000000, A(sc.malformed), 0, "N",
	  "malformed messages spread over every SPEC.md class" },
	{ "--connections", P, ARGS_INT, 1, 64, A(sc.connections), 0, "C", "publisher connections, each a thread" },
	{ "--rate", P, ARGS_RATE, 0, 10000000, A(po.rate), 0, "R",
	  "messages per second over all connections, 0 = unlimited" },
	{ "--progress", P, ARGS_FLAG, 0, 0, A(po.progress), 0, NULL,
	  "a progress line a second on stderr even when it is not a terminal" },
	{ "--settle-timeout", P, ARGS_DUR_INT, 1, 86400, A(po.settle_timeout_s), 0, "D",
	  "wait at most D for originals before the delayed phase" },
	{ "--settle-stall", P, ARGS_DUR_INT, 0, 86400, A(po.settle_stall_s), 0, "D",
	  "stop waiting for originals when none came for D, publish the delayed phase anyway and let "
	  "verify name the missing; 0 = never" },
	{ "--retry-timeout", P, ARGS_DUR_INT, 1, 86400, A(po.retry_s), 0, "D",
	  "after a broker fault keep reconnecting and re-publishing what was not confirmed for at most D; "
	  "a re-publish is a duplicate" },
	{ "--message-id", S, ARGS_STR, 0, 0, A(message_id), 0, "ID", "the message id of the message sent" },
};

#undef P
#undef V
#undef S
#undef A

static const struct args_spec lg_spec = {
	.prefix = "", .cmd_names = lg_cmd_names, .ncmds = LG_NCMDS,
	.opts = lg_opt_table, .nopts = ARRAY_LEN(lg_opt_table), .defaults = &lg_defaults,
};

/* `inbox-loadgen --help-man publish|verify|settings`: the options of a
 * command, or the settings inbox-loadgen reads, as a pandoc definition
 * list for inbox-loadgen(1) (man/meson.build).  Not in --help. */
static int help_man(const char *what)
{
	int cmd = args_find(lg_cmd_names, LG_DLQ, what); /* publish or verify */

	if (strcmp(what, "settings") == 0) {
		cfg_print_doc(stdout, CFG_DOC_MAN, lg_setting_used_name);
	} else if (cmd < 0) {
		fprintf(stderr, "inbox-loadgen: --help-man publish|verify|settings\n");
		return 2;
	} else {
		args_print_man(stdout, &lg_spec, (size_t)cmd);
	}
	return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}

static void usage(FILE *f)
{
	fputs(USAGE "\n\n"
	      "publish: build a deterministic scenario from --seed, write its ledger, publish it.\n", f);
	args_print_help(f, &lg_spec, LG_PUBLISH);
	fputs("\n"
	      "verify: wait for the worker to go idle, then check the database and queues against the ledger.\n", f);
	args_print_help(f, &lg_spec, LG_VERIFY);
	fputs("\n"
	      "dlq unbind|bind: remove or restore the binding of the dead-letter queue (INBOX_DLQ) to the\n"
	      "  dead-letter exchange (INBOX_DLX), key '#'; a fault the chaos run injects.\n"
	      "send ROUTING_KEY BODY: one persistent, confirmed message to INBOX_EXCHANGE (--message-id ID\n"
	      "  sets its message id), the topology declared first.\n"
	      "Durations as inbox-worker takes them: 90, 90s, 5m, 2h, 1d.\n"
	      "\n",
	      f);
	cfg_print_help(f, "settings (as inbox-worker reads them; only those inbox-loadgen uses):", lg_setting_used_name);
}

/* What the options say together, beyond each one's own bounds.  0, or -1
 * with one line in err. */
static int lg_args_check(enum lg_cmd cmd, struct lg_args *a, char *err, size_t errlen)
{
	a->vo.ledger = a->po.ledger;
	if (a->po.ledger == NULL && (cmd == LG_PUBLISH || cmd == LG_VERIFY)) {
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
	if (a->envelope != NULL) {
		int e = args_find(lg_envelope_names, LG_ENV_COUNT, a->envelope);
		if (e < 0) {
			snprintf(err, errlen, "--envelope: '%s' is not native, cloudevents or cloudevents-binary", a->envelope);
			return -1;
		}
		a->sc.envelope = (enum lg_envelope)e;
	}
	return 0;
}

/* The definition --lifecycle or INBOX_LIFECYCLE names, else the built-in
 * order lifecycle; NULL with the errors on stderr.  *path: the file, or
 * NULL for the built-in one. */
static struct lc_def *lg_lifecycle(const struct cfg *conf, const struct lg_args *a, const char **path)
{
	struct lc_errors errs;
	struct lc_def *def;

	*path = a->lifecycle != NULL ? a->lifecycle
	        : conf->lifecycle != NULL && conf->lifecycle[0] != '\0' ? conf->lifecycle
	                                                                : NULL;
	memset(&errs, 0, sizeof errs);
	def = *path != NULL ? lc_load_file(*path, &errs) : lc_load(lc_builtin_order, lc_builtin_order_len, &errs);
	if (def == NULL) {
		fprintf(stderr, "inbox-loadgen: the lifecycle definition is not valid:\n");
		lc_errors_print(&errs, *path != NULL ? *path : "(built-in order lifecycle)", stderr);
	}
	return def;
}

static int lg_publish_main(const struct cfg *conf, struct lg_args *a)
{
	struct lg_scenario s;
	struct lc_def *def = lg_lifecycle(conf, a, &a->sc.lifecycle);
	int code;

	if (def == NULL)
		return 2;
	a->sc.def = def;
	a->sc.max_body = conf->max_body;
	if (a->messages > 0) {
		a->sc.orders = (long)((double)a->messages / lg_messages_per_order(&a->sc) + 0.5);
		if (a->sc.orders < 1)
			a->sc.orders = 1;
	}
	if (lg_scenario_build(&s, &a->sc) != 0) {
		fprintf(stderr, "inbox-loadgen: cannot build the scenario\n");
		lc_free(def);
		return 1;
	}
	code = lg_publish(conf, &s, &a->po);
	lg_scenario_free(&s);
	lc_free(def);
	return code;
}

static int lg_verify_main(const struct cfg *conf, struct lg_args *a)
{
	const char *path;
	struct lc_def *def = lg_lifecycle(conf, a, &path);
	int code;

	if (def == NULL)
		return 2;
	a->vo.def = def;
	a->vo.lifecycle = path;
	code = lg_verify(conf, &a->vo);
	lc_free(def);
	return code;
}

/* `dlq unbind|bind`: the chaos run's fault on the DLQ's binding. */
static int lg_dlq_main(const struct cfg *conf, struct lg_args *a)
{
	bool bind = strcmp(a->pos[0], "bind") == 0;
	char err[512];

	if (lgx_queue_bind(&conf->amqp, conf->dlq, conf->dlx, "#", bind, err, sizeof err) != 0) {
		fprintf(stderr, "inbox-loadgen: dlq %s: %s\n", a->pos[0], err);
		return 1;
	}
	printf("%s %s %s '#'\n", conf->dlq, bind ? "bound to" : "unbound from", conf->dlx);
	return 0;
}

/* `send`: one message to INBOX_EXCHANGE, persistent and confirmed (the
 * topology declared first, as the worker declares it): what an operator
 * needs to try a fix or to stage an incident by hand (doc/operations.md, *Dead
 * letters*). */
static int lg_send_main(const struct cfg *conf, struct lg_args *a)
{
	struct mq *m = NULL;
	int rc, code = 1;

	rc = mq_open(&m, &conf->amqp, 0, "inbox-loadgen send");
	if (rc == ST_OK)
		rc = mq_declare_topology(m, conf);
	if (rc == ST_OK) {
		struct mq_message msg = { .exchange = conf->exchange, .routing_key = a->pos[0], .body = a->pos[1],
			                  .len = strlen(a->pos[1]), .message_id = a->message_id, .mandatory = true };
		rc = mq_publish_confirmed(m, &msg, 10000);
	}
	if (rc == ST_OK) {
		printf("sent %s to %s\n", a->pos[0], conf->exchange);
		code = 0;
	} else {
		fprintf(stderr, "inbox-loadgen: send: %s\n", m != NULL ? mq_errmsg(m) : st_strerror(rc));
	}
	mq_close(&m);
	return code;
}

static bool lg_dlq_word(const char *w)
{
	return strcmp(w, "unbind") == 0 || strcmp(w, "bind") == 0;
}

/* One row per command: the words it takes before its options (checked by
 * pos_ok when given, else only counted) and what it runs once its options
 * and the settings are read. */
static const struct lg_command {
	int npos;
	bool (*pos_ok)(const char *word);
	const char *pos_err; /* the line when the words are missing or wrong */
	bool all_logs;       /* the settings' log level as given, not at least warn */
	int (*run)(const struct cfg *conf, struct lg_args *a);
} lg_commands[] = {
	[LG_PUBLISH] = { 0, NULL, NULL, false, lg_publish_main },
	[LG_VERIFY] = { 0, NULL, NULL, false, lg_verify_main },
	[LG_DLQ] = { 1, lg_dlq_word, "dlq: say unbind or bind", false, lg_dlq_main },
	[LG_SEND] = { 2, NULL, "send: say ROUTING_KEY and BODY", true, lg_send_main },
};
_Static_assert(ARRAY_LEN(lg_commands) == LG_NCMDS, "one row per enum lg_cmd");

/* --version, wherever it stands: the release and the commit it was built
 * from (version.h), in the form inbox-worker prints.  The exit code. */
static int say_version(void)
{
	printf("inbox-loadgen %s (%s)\n", INBOX_VERSION, INBOX_COMMIT);
	return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}

/* Everything between the command's name and running it: its words, its
 * options, the settings.  Returns -1 with *conf loaded, or an exit code. */
static int lg_prepare(enum lg_cmd cmd, int argc, char **argv, struct lg_args *a, struct cfg *conf)
{
	const struct lg_command *c = &lg_commands[cmd];
	char err[512];
	enum args_result asked = args_asks(argc, argv);

	if (asked == ARGS_VERSION)
		return say_version();
	if (asked == ARGS_HELP) {
		usage(stdout);
		return 0;
	}
	for (int k = 0; k < c->npos; k++) {
		if (argc < 2 + k || (c->pos_ok != NULL && !c->pos_ok(argv[1 + k]))) {
			fprintf(stderr, "inbox-loadgen: %s\n%s\n", c->pos_err, USAGE);
			return 2;
		}
		a->pos[k] = argv[1 + k];
	}
	/* argv[0] for args_take and cfg_load: the last word taken. */
	argc -= c->npos;
	argv += c->npos;
	if (args_take(&lg_spec, cmd, &argc, argv, a, err, sizeof err) != ARGS_OK ||
	    lg_args_check(cmd, a, err, sizeof err) != 0) {
		fprintf(stderr, "inbox-loadgen: %s\n", err);
		return 2;
	}
	enum cfg_result loaded = cfg_load(conf, argc, argv, err, sizeof err);

	/* The rest points into argv: mask the URLs' passwords in the process
	 * list. */
	cfg_scrub_argv(argc, argv);
	switch (loaded) {
	case CFG_OK:
		return -1;
	case CFG_HELP:
		usage(stdout);
		return 0;
	case CFG_VERSION:
		return say_version();
	case CFG_ERROR:
	default:
		fprintf(stderr, "inbox-loadgen: %s\n", err);
		return 2;
	}
}

int main(int argc, char **argv)
{
	struct lg_args a = lg_defaults;
	struct cfg conf;
	int cmd, code;

	if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (strcmp(argv[1], "--version") == 0) {
		return say_version();
	}
	if (strcmp(argv[1], "--help-man") == 0)
		return help_man(argc > 2 ? argv[2] : "");
	cmd = args_find(lg_cmd_names, LG_NCMDS, argv[1]);
	if (cmd < 0) {
		fprintf(stderr, "inbox-loadgen: unknown command '%s'\n%s\n", argv[1], USAGE);
		return 2;
	}
	code = lg_prepare((enum lg_cmd)cmd, argc - 1, argv + 1, &a, &conf);
	if (code >= 0)
		return code;
	/* Library logs (connect failures) at warn and above only: the report
	 * is what this program is for. */
	log_setup(lg_commands[cmd].all_logs || conf.log_level < LOG_LEVEL_WARN ? conf.log_level : LOG_LEVEL_WARN,
	          conf.log_format);
	if (db_global_init() != ST_OK) {
		fprintf(stderr, "inbox-loadgen: cannot initialise the database client\n");
		code = 1;
	} else {
		code = lg_commands[cmd].run(&conf, &a);
		db_global_end();
	}
	cfg_free(&conf);
	return code;
}
