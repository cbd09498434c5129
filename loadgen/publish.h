/*
 * publish.h - inbox-loadgen publish: puts a scenario on the broker through
 * several confirmed connections and writes its ledger.
 */
#ifndef INBOX_LG_PUBLISH_H
#define INBOX_LG_PUBLISH_H

#include "cfg.h"
#include "scenario.h"

struct lg_publish_opts {
	double rate;            /* messages per second over all connections, 0 = unlimited */
	int settle_timeout_s;   /* bound on waiting for originals before the late phase */
	int retry_s;            /* how long to keep reconnecting after a broker fault */
	int settle_stall_s;     /* > 0: stop waiting for originals once none came for this long */
	const char *ledger;     /* path */
	bool progress;          /* progress lines even when stderr is not a terminal (one a second) */
};

/* Returns the process exit code: 0, or 1 on a runtime failure. */
int lg_publish(const struct cfg *conf, struct lg_scenario *s, const struct lg_publish_opts *po);

/* The progress line: "<label>: sent S/T (P%), confirmed C, elapsed M:SS,
 * R msg/s, ETA M:SS", with "ETA --" while the rate is not known. */
void lg_progress_line(char *buf, size_t cap, const char *label, unsigned long long sent,
                      unsigned long long confirmed, size_t total, double elapsed_s, bool have_rate, double rate);

/* "<out_exchange>.verify" into buf. */
void lg_verify_queue_name(const struct cfg *conf, char *buf, size_t cap);

/* Microseconds since the epoch (CLOCK_REALTIME) and monotonic seconds. */
int64_t lg_now_us(void);
double lg_mono(void);
void lg_sleep_ms(int ms);

#endif
