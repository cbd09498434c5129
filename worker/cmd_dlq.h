/*
 * cmd_dlq.h - the dead-letter queue for operators: `inbox-worker dlq list |
 * show | replay | purge | skip` (issue 15; skip: common/dlq_skip.h).
 *
 * Reading never settles anything: the queue is consumed with a prefetch
 * window as large as the queue and nothing is acked; closing the
 * connection hands every unacked message back, in its place.  Replay
 * publishes a copy to the inbox exchange with publisher confirms and acks
 * the dead letter only after the broker confirmed the copy, so a crash in
 * between duplicates a message (the inbox absorbs it) and never loses one.
 * Before publishing, replay asks the database whether the copy could do
 * anything: a body that still does not parse, a key the inbox holds with
 * another payload (a conflict) or an event whose prerequisite is still
 * missing is reported and left in the queue instead of going round again.
 *
 * Ownership: cmd_dlq_take points the options at argv's strings, which
 * must outlive them; dlq_main opens and closes its own connections.
 */
#ifndef INBOX_CMD_DLQ_H
#define INBOX_CMD_DLQ_H

#include <stdbool.h>
#include <stdio.h>

#include "args.h"
#include "cfg.h"
#include "deadletter.h" /* the header names */

#define DLQ_MAX_REASONS 16
#define DLQ_MAX_IDS 256

enum dlq_cmd { DLQ_LIST = 0, DLQ_SHOW, DLQ_REPLAY, DLQ_PURGE, DLQ_SKIP, DLQ_CMD_COUNT /* not a command */ };

struct dlq_opts {
	enum dlq_cmd cmd;
	const char *message_id;               /* show: the message id */
	const char *reasons[DLQ_MAX_REASONS]; /* --reason, any of them */
	int nreasons;
	const char *ids[DLQ_MAX_IDS];         /* --id, any of them */
	int nids;
	const char *order_id;                 /* --order */
	long since_s;                         /* --since: dead-lettered within; 0 = any */
	long limit;                           /* --limit: most messages replayed; 0 = all */
	bool json;                            /* --json (list) */
	bool dry_run;                         /* --dry-run (replay, skip) */
	bool yes;                             /* --yes (purge) */
};

/*
 * Take `SUBCOMMAND [MESSAGE_ID] [dlq options]` out of argv (argv[0] is
 * "dlq"), leaving "dlq <settings flags>" for cfg_load; *argc is updated.
 * Returns ARGS_OK, ARGS_HELP/ARGS_VERSION, or ARGS_ERROR with one line in
 * err (exit 2).
 */
enum args_result cmd_dlq_take(int *argc, char **argv, struct dlq_opts *o, char *err, size_t cap);

/* Run the subcommand; what it finds goes to out, logs to stderr.  Returns
 * the exit code: 0 done, 1 a runtime failure (a server unreachable, a
 * publish not confirmed, a replay that left a dead letter because the
 * broker returned or refused its copy, show finding no such message). */
int dlq_main(const struct cfg *conf, const struct dlq_opts *o, FILE *out);

/* The usage lines of the dlq commands, for --help. */
void dlq_usage(FILE *f);

#endif
