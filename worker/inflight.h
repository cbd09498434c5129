/*
 * inflight.h - the orders each consuming thread of this process has in a
 * transaction right now, so that a thread can settle first what no other
 * thread is working on.
 *
 * Why: the broker hands consecutive deliveries to different threads, and
 * in a backlog an order's events lie close enough that two threads'
 * batches of a hundred nearly always share an order or a few.  A batch
 * locks its orders first, in one statement; on a shared one it waits, with
 * the orders it already locked, for the whole of the other transaction,
 * and the threads behind it wait for it: a convoy, one transaction at a
 * time, with the CPU idle meanwhile (bench/run's backlog of 40,000
 * messages at 8 threads: 800-900 lock waits).  With this set a thread splits its batch:
 * the orders no other thread of the process has go in one transaction at
 * once, the others in a second one right after, when the other thread
 * has most likely committed.  Nothing waits here.
 *
 * A hint, never a lock: the database's order locks and the UNIQUE claim
 * still decide everything, across threads and processes alike; a stale or
 * colliding entry only costs a wait in the database, as before.  Orders
 * are kept as 64-bit hashes of their ids.
 *
 * Ownership: inflight_open allocates the set for `threads` threads of at
 * most `batch` orders each; inflight_close frees it after every thread
 * has ended.  Threads call take and drop with their own index.
 */
#ifndef INBOX_INFLIGHT_H
#define INBOX_INFLIGHT_H

#include <stdbool.h>

struct inflight;

int inflight_open(struct inflight **out, int threads, int batch);
void inflight_close(struct inflight **f);

/* Of n order ids, set busy[i] when another thread has ids[i] in a
 * transaction now.  Records them (the first `batch` of them) as thread t's,
 * busy or not (its next transaction locks them whether it waits for some
 * or not), replacing what it had.  Returns how many were free. */
int inflight_take(struct inflight *f, int t, const char *const *ids, int n, bool *busy);

/* Thread t's transaction ended: its orders are free again. */
void inflight_drop(struct inflight *f, int t);

/* A delivery of a batch to split: its order and its message key. */
struct inflight_key {
	const char *order_id;
	const char *source;
	const char *message_id;
};

/* Which of a batch's n deliveries (k, in delivery order) go to the second
 * transaction of a split: on entry second[i] says that k[i]'s order is
 * busy (inflight_take), on return that it goes second.  The second set is
 * closed, in delivery order, under "shares an order or a message key with
 * an earlier delivery that goes second", so no delivery overtakes an
 * earlier one of its order or of its key.  Returns how many go first. */
int inflight_split(const struct inflight_key *k, int n, bool *second);

#endif
