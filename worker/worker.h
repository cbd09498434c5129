/*
 * worker.h - one consuming thread of the pool: its broker connections, its
 * database side and the batch it has in hand.
 *
 * Ownership: pool_main fills t and the shards, worker_alloc the batch
 * arrays (worker_free frees them, after the thread was joined); the
 * thread opens and closes its connections itself.
 */
#ifndef INBOX_WORKER_H
#define INBOX_WORKER_H

#include <stdbool.h>
#include <stdint.h>

#include "outbox_dispatch.h"
#include "pool.h"

struct item;
struct inbox_in;
struct inbox_result;
struct mq;

struct worker {
	struct pool_thread t; /* index >= 0 */
	struct pool_db d;
	struct mq *consumer;
	/* The broker node the consumer starts from (INBOX_AMQP_URL may list
	 * a cluster's nodes): moved on past a node whose connection failed,
	 * so a thread goes to another node instead of waiting. */
	int consumer_node;
	/* The outbox's side of the thread: its publisher (dead letters and
	 * the copies of what it commits), the copies in flight, their marks. */
	struct outbox_dispatcher out;
	/* The queues this thread consumes: indexes for mq_consume_queue_name
	 * (one, 0, in shared ordering; its shards in sharded ordering). */
	int shard[64];
	int nshards;
	uint64_t shard_mask;  /* sharded ordering: bit i = shard i */
	bool consumed_once;   /* a topology refusal after this is not fatal */
	struct item *items;   /* INBOX_BATCH deliveries */
	struct inbox_in *ins; /* the valid ones of a batch, as the inbox takes them */
	struct inbox_result *res;
	/* A batch split by worker_settle_apart: the order ids, which are in
	 * another thread's transaction, the orders and keys (inflight_split),
	 * and the items settled second; the items settled first, and which of
	 * them another process's transaction held (inbox_run_nowait). */
	const char **ids;
	struct inflight_key *keys;
	bool *busy;
	struct item **later;
	struct item **first;
	bool *held;
	/* Settled deliveries not yet acked: every tag up to ack_tag is done
	 * (committed or confirmed in the DLQ), so one basic.ack with
	 * multiple=true settles them all (see worker_ack_flush). */
	uint64_t ack_tag;
	int ack_pending;
};

/* The batch arrays for conf->batch deliveries: ST_OK or ST_ERR_NOMEM. */
int worker_alloc(struct worker *w);
void worker_free(struct worker *w);

/* The thread: consume, handle batches, until the stop flag. */
void *worker_main(void *arg);

#endif
