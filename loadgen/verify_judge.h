/*
 * verify_judge.h - holds what inbox-loadgen verify found against what the
 * ledger expects, and sums up the figures of the report:
 *
 *   missing    an effect without its order_events row (or without an inbox
 *              row, or still held), an expected dead-letter or emitted
 *              message that never came;
 *   doubled    a message with more than one order_events row;
 *   wrong      an order whose status or version differs, an outcome or
 *              stored hash other than the ledger's;
 *   unexpected (listed by the readers) a row, dead-letter or emitted
 *              message the ledger does not foresee.
 */
#ifndef INBOX_LG_VERIFY_JUDGE_H
#define INBOX_LG_VERIFY_JUDGE_H

#include "verify_ledger.h"

/* The report's figures besides the lists and counters of struct v_state. */
struct v_figures {
	long eff_exp, eff_found;   /* effects the ledger expects, and found exactly once */
	long dead_exp, dead_seen;  /* dead-letters expected, and found with their reason */
	long emit_exp, emits_seen; /* emitted messages expected, and seen */
	long long dups_published, dups_absorbed;
	size_t rows;               /* inbox rows in the throughput figure */
	double span, tput, p50, p99, pmax; /* s, msg/s, ms */
};

/* Fill st's missing / doubled / wrong lists and counters, and *f.  Sorts
 * st->lat. */
void v_judge(struct v_state *st, struct v_figures *f);

#endif
