/*
 * mq_private.h - what the two halves of a struct mq share: mq.c
 * (connections, topology, consuming) and pub.c (publishing with
 * confirms).  Included by those two files only; callers see mq.h and
 * pub.h.  rabbitmq-c keeps its own amqp_private.h the same way.
 *
 * Ownership: struct mq is allocated by mq_open and freed by mq_close
 * (mq.c).  Its pub member is read and written by pub.c only; mq.c only
 * initialises it (pub_state_init).
 */
#ifndef INBOX_MQ_PRIVATE_H
#define INBOX_MQ_PRIVATE_H

#include <amqp.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "cfg.h"
#include "mq.h"

#define MQ_CHANNEL 1
/* Deliveries one connection can hold at once (a batch in hand, and what
 * mq_service keeps aside meanwhile) are what the broker may send it: the
 * prefetch of its consumers, summed.  So the room is that (and one slot to
 * read the next frame into), one limit, not a second one beside it:
 * mq_consume_start grows it (mq_room) before it
 * consumes, and the broker never sends more.  (It was a fixed 512: a
 * larger prefetch ran out of room during a database outage, the thread
 * slept instead of servicing the connection, and the broker dropped it
 * for missed heartbeats.)  INBOX_BATCH <= INBOX_PREFETCH (cfg.c), so a
 * batch always fits too.  Each envelope is allocated the first time its
 * slot is used and never moves: a delivery points into it. */

/* Consumers one channel can carry: a thread consumes at most every shard. */
#define MQ_MAX_CONSUMERS 64

struct mq_consumer {
	char tag[128];          /* the broker's consumer tag */
	char queue[256];
	int prefetch;
	int priority;           /* x-priority of basic.consume (0: none) */
	bool cancelled;         /* the broker sent basic.cancel for it */
};

/* Confirm mode of the channel (pub.c). */
struct pub_state {
	bool confirming;
	uint64_t next_seq;      /* delivery tag of the next publish */
	uint64_t confirmed;     /* all seq <= confirmed are settled */
	bool nacked;            /* a nack or return arrived since the last wait */
	/* Outcomes of the last MQ_TRACK_MAX publishes, at seq % MQ_TRACK_MAX
	 * (see mq_outcome); track_pending counts those still awaiting their
	 * ack or nack, so that a wait ends only when each one is settled. */
	struct pub_track {
		uint64_t seq;
		uint8_t outcome;    /* enum mq_outcome */
		bool returned;
	} track[MQ_TRACK_MAX];
	int track_pending;
	uint64_t mandatory_seq; /* the latest mandatory publish: a return is its */
};

struct mq {
	amqp_connection_state_t conn;
	bool broken;
	struct pub_state pub;
	/* The room: nslots envelope slots (see above). */
	amqp_envelope_t **envs;
	bool *env_used;
	int *free_slots;
	int nfree;
	int nslots;
	/* Deliveries read by mq_service while the thread took no new work, in
	 * arrival order (a ring of envelope slots, nslots long); mq_consume
	 * hands them out before it reads the socket again.  The broker's
	 * prefetch bounds how many arrive. */
	int *stash;
	int stash_head;
	int nstash;
	struct mq_consumer consumers[MQ_MAX_CONSUMERS];
	int nconsumers;
	int ncancelled;
	amqp_message_t got;     /* basic.get result */
	bool has_got;
	/* The first X509 verification error of this connection's handshake
	 * (0: none), for the reason in the log line (mq_tls_fail). */
	long tls_verify_err;
	char err[256];
};

/* NULL-safe amqp_bytes_t of a C string. */
amqp_bytes_t mq_b(const char *s);
/* Record what failed in m->err ("what: detail") and return code; any code
 * but ST_ERR_TIMEOUT marks the connection broken. */
int mq_fail(struct mq *m, int code, const char *what, const char *detail);
/* A librabbitmq status as an st_code (through mq_fail). */
int mq_status(struct mq *m, int status, const char *what);
/* The last RPC's reply as an st_code (through mq_fail). */
int mq_rpc(struct mq *m, const char *what);
/* "channel closed by broker: 406 PRECONDITION_FAILED ..." (or "connection
 * closed ...") for a channel.close or connection.close method into buf;
 * returns its reply code. */
unsigned mq_close_line(const amqp_method_t *method, char *buf, size_t cap);

/* Milliseconds left of timeout_ms since start (CLOCK_MONOTONIC) into
 * *left: ST_OK, or ST_ERR_MQ_CONN through mq_fail when the clock fails.
 * The bounded waits of mq_service and mq_wait_confirms. */
int mq_ms_left(struct mq *m, const struct timespec *start, int timeout_ms, const char *what, long *left);

/* Start the confirm bookkeeping of a new connection (pub.c). */
void pub_state_init(struct pub_state *s);

#endif
