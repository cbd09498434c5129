/*
 * receiver.h - http_receiver (loadgen/http_receiver.c) as a child of
 * a criterion test: started on a port of its own, its lines read back.
 * Shared by the unit suite http_call and the integration suites that
 * deliver to a destination (destinations, effects, lifecycle_load).
 *
 * Ownership: rcv_start fills *rv; rcv_stop ends the child and closes its
 * pipe, the log file stays (the caller's to read and unlink).  A child
 * started here dies with the test process (PR_SET_PDEATHSIG), so a failed
 * assertion never leaves it holding the test's stderr, which would keep
 * meson waiting.  Every failure is a criterion assertion.
 */
#ifndef INBOX_TEST_RECEIVER_H
#define INBOX_TEST_RECEIVER_H

#include <stdio.h>
#include <jansson.h>
#include <sys/types.h>

struct rcv_child {
	pid_t pid;
	FILE *out; /* its stdout: "ready PORT", "away" */
	int port;
	char log[64]; /* the file of its lines, one JSON object per request */
};

/* Start $INBOX_HTTP_RECEIVER_BIN --port 0 --out <a new file> plus extra
 * (NULL-terminated, may be NULL); returns when it said "ready PORT". */
void rcv_start(struct rcv_child *rv, const char *const *extra);
/* SIGTERM, and its exit 0 waited for. */
void rcv_stop(struct rcv_child *rv);
/* Its lines as JSON objects (new references, cap at most); the count. */
int rcv_lines(const struct rcv_child *rv, json_t **lines, int cap);
/* Each key accepted once: a 200 that was not a replay, per Idempotency-Key.
 * *keys (may be NULL) gets the count of keys accepted; returns the count
 * of calls in all.  Replays and 422s are counted into *replays, *conflicts
 * (either may be NULL). */
int rcv_accepted(const struct rcv_child *rv, int *keys, int *replays, int *conflicts);

#endif
