/*
 * verify_read.h - what the worker left behind, read for inbox-loadgen
 * verify: it waits for the run to settle, then reads processed_messages,
 * order_events and orders, and browses the dead-letter queue and the
 * `<out>.verify` queue, filling the "found" side of struct v_state.
 * Nothing here judges; the readers only record and list what the ledger
 * does not know (st->unexpected).
 */
#ifndef INBOX_LG_VERIFY_READ_H
#define INBOX_LG_VERIFY_READ_H

#include "verify_ledger.h"

/* Wait until the run is settled or timeout_s passes (then verify anyway
 * and let the report show what is missing); opens st->db.  Returns 0, or
 * -1 when a server refused our credentials or never came back. */
int v_wait_idle(struct v_state *st, int timeout_s);
/* The run's inbox rows, ledger rows and order rows.  ST_OK or an error
 * (db_errmsg(st->db) says which). */
int v_read_db(struct v_state *st);
/* Browse the dead-letter queue and the verify queue (without taking
 * anything off them).  ST_OK or an error, said on stderr. */
int v_read_queues(struct v_state *st);

#endif
