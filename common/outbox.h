/*
 * outbox.h - the relay that publishes outbox rows with publisher confirms.
 *
 * Rows are claimed with SELECT ... FOR UPDATE SKIP LOCKED, so several relays
 * (threads or processes) share the work without publishing a row twice in
 * the normal case; a row is marked sent only after the broker confirmed it.
 * A crash between the confirm and the commit re-publishes the row later with
 * the same message-id, which downstream consumers deduplicate.
 *
 * Each row is settled on its own: a confirmed row is marked sent whatever
 * happens to the rows beside it; a row that the broker returns (a mandatory
 * dead-letter copy with no queue bound), nacks or refuses, or one that
 * cannot be published at all (stored headers that are not a JSON object of
 * strings, a name too long for AMQP), gets attempts + 1, a backoff of its own
 * (next_attempt_at; 1 s doubling up to 60 s) and last_error, and is left
 * alone until then.  A row's failure is logged when it starts and when its
 * reason changes, and its recovery once, not every retry.
 *
 * The rows are written by the transaction that decides them (in its write
 * request, common/inbox_write.c); what a row holds is the relay's format,
 * so it is built here too (outbox_row_event, outbox_row_dead_letter) and
 * read back by the same file: headers a JSON object of strings, props the
 * JSON of mq_delivery_props_json (NULL: none), body bytes.
 *
 * Rows a committing thread publishes itself from memory (outbox_dispatch.h)
 * carry its claim token and are taken here only once older than
 * INBOX_OUTBOX_SWEEP: one no thread published or marked (a crash between
 * the commit and the mark, a publish that failed), which a live thread
 * never leaves that long.  A row without a tag (hold expiry's, an older
 * version's, one written by hand) is the relay's at once.
 *
 * Ownership: outbox_open prepares statements on a caller-owned db and owns
 * the row buffers (grown to fit what is stored); the mq publisher is
 * borrowed per call.  The row writers append to the caller's sqlbuf and
 * keep nothing.
 */
#ifndef INBOX_OUTBOX_H
#define INBOX_OUTBOX_H

#include "cfg.h"
#include "db.h"
#include "envelope.h"
#include "mq.h"
#include "sqlbuf.h"

struct outbox;

/* What one relay round did. */
struct outbox_round {
	int taken;  /* rows claimed (a round with taken == limit may have left more) */
	int sent;   /* confirmed and marked sent */
	int failed; /* returned, nacked or unpublishable: attempts + 1, retried later */
};

/* The head of the multi-row INSERT that the row writers add rows to
 * (after sqlbuf_list; the caller ends the statement).  The row writers
 * take mem: NULL, the row is the relay's (claim NULL); else the row is
 * tagged with mem->claim and a copy is added to mem for its writer to
 * publish after the commit. */
#define OUTBOX_INSERT_HEAD                                                                             \
	"INSERT INTO outbox (message_id, exchange, routing_key, type, order_id, props, headers, body,"  \
	" created_at, claim, destination) VALUES "

/* The exchange column of a row for an HTTP destination (migration 0019):
 * not an exchange anyone declares, so that a relay of a build before
 * destinations, were one to take the row, fails to publish it and keeps
 * it rather than publish it nowhere and mark it sent. */
#define OUTBOX_HTTP_EXCHANGE "inbox-http:"

/* A copy of a row the transaction wrote, kept for the committing thread
 * to publish from memory after the COMMIT (outbox_dispatch.h). */
struct outbox_msg {
	char *message_id, *exchange, *routing_key, *type, *props, *headers; /* props, headers: JSON or NULL */
	void *body;
	size_t len;
};

struct outbox_mem {
	int64_t claim; /* the rows' outbox.claim */
	struct outbox_msg *v;
	int n, cap;
};

/* Forget the copies (keeping the room), or free everything. */
void outbox_mem_reset(struct outbox_mem *mem);
void outbox_mem_free(struct outbox_mem *mem);

/* An event the worker emits, kind emit of the running definition
 * (lifecycle_emit.h), in SPEC.md's envelope, to conf->out_exchange with
 * routing key <aggregate>.<type>, and one row more for each HTTP
 * destination the definition routes the kind to (lifecycle_dest.h), the
 * same id, body and properties, destination set.  Its message id, lc_emit_id's
 * "<type>:<order id>" (":<cause>" when several events emit the type), names
 * this one event of the order, so that a re-publish after a crash is
 * recognisable downstream.  cause_*: the event that caused it (data);
 * ctx (NULL: nothing) what it carried: the trace continued and the
 * correlation id (props), with conf->emit_envelope's envelope.
 * seq > 0: the cause's number in a sequenced definition, which the id
 * ends with (":<seq>": a loop emits a type again, under another id) and
 * the body carries as data.cause_sequence; emitted > 0: this event's own
 * number among those its aggregate emitted (1, 2, ... without gaps),
 * data.sequence, by which a worker downstream orders them.
 * ST_OK, ST_ERR_NOMEM, ST_ERR_INVALID (no clock). */
int outbox_row_event(struct sqlbuf *b, const struct cfg *conf, struct outbox_mem *mem, int emit,
                     const char *order_id, const char *cause_message_id, const char *cause_type,
                     const struct env_context *ctx, int64_t seq, int64_t emitted);

/* The dead-letter copy of an event (its transition is impossible, its
 * hold expired, its stored body cannot be applied): its own body,
 * properties, routing key and message id, to conf->dlx, with the headers
 * deadletter_headers builds (common/deadletter.h), as the worker's own
 * dead-letter copies have them: detail gets what the saved properties had
 * to escape or drop. */
struct outbox_dead_letter {
	const char *message_id;
	const char *routing_key;
	const char *type;
	const char *order_id;
	const char *props;  /* JSON or NULL */
	const void *body;
	size_t len;
	const char *reason; /* x-inbox-reason */
	const char *detail; /* x-inbox-detail */
	int64_t deliveries; /* x-inbox-delivery-count; 0 when unknown */
	const char *destination; /* x-inbox-destination (delivery-failed); NULL: none */
};
int outbox_row_dead_letter(struct sqlbuf *b, const struct cfg *conf, struct outbox_mem *mem,
                           const struct outbox_dead_letter *d);

int outbox_open(struct outbox **out, struct db *db, const struct cfg *conf);
void outbox_close(struct outbox **ob);

/* One round over up to limit pending rows (at most 64).  Returns ST_OK, a
 * broker error (ST_ERR_MQ*: the caller reconnects the publisher; rows
 * confirmed before it are marked sent all the same, the others stay
 * pending) or a database error (the round is rolled back; every row stays
 * pending).  *r is filled when the round committed. */
int outbox_relay(struct outbox *ob, struct mq *pub, int limit, struct outbox_round *r);

/* How long a round may go on publishing after its lease began: past it,
 * the round publishes nothing more (at least one row per round all the
 * same) and gives the lease of the rest back, so no row is published after
 * its lease ran out and another relay took it.  The default fits the
 * lease (OUTBOX_LEASE_S) with the confirm waits; tests set a small one to
 * see a round stop. */
void outbox_set_round_budget(struct outbox *ob, int ms);

/* Pending rows and the age in seconds of the oldest (0 when none), for the
 * inbox_outbox_pending and inbox_outbox_oldest_pending_seconds gauges. */
int outbox_stats(struct outbox *ob, int64_t *pending, double *oldest_s);

#endif
