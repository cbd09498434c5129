/*
 * lifecycle_dest.h - where a definition's emitted events go: its HTTP
 * destinations ("destinations") and the route of each emitted type
 * ("deliver"), read by lc_load, and a destination's values resolved when
 * a command starts.
 *
 *   "destinations": {
 *     "mail": {
 *       "url": {"env": "INVOICE_MAIL_URL"},
 *       "method": "POST",
 *       "headers": {"X-Tenant": "acme", "Authorization": {"env": "INVOICE_MAIL_TOKEN"}},
 *       "ca_file": "/etc/ssl/mail-ca.pem",
 *       "timeout_ms": 5000, "connect_timeout_ms": 2000
 *     }
 *   },
 *   "deliver": {"ReceiptRequested": ["mail"], "RefundRequested": ["exchange", "mail"]}
 *
 * A value is its text, or {"env": NAME}: the variable NAME, or when
 * NAME_FILE is set the content of the file it names (the *_FILE
 * convention of container secrets), or {"file": PATH}.  A header read
 * from the environment or a file is a secret: http_dest_format shows it
 * as ***, and no log line carries it.  An emitted type not in "deliver"
 * goes to our exchange, as before; "exchange" names it in a list.
 *
 * The definition holds the values as written (lc_load reads no
 * environment and no file); lc_dest_resolve reads them, so `lifecycle
 * check` and `run` say at start-up which variable or file is missing.
 *
 * Ownership: lc_dest_resolve fills a caller's struct http_dest, which the
 * caller releases with http_dest_free (also after a failure).
 */
#ifndef INBOX_LIFECYCLE_DEST_H
#define INBOX_LIFECYCLE_DEST_H

#include <stddef.h>

#include "http_call.h"
#include "lifecycle.h"

/* "exchange": our exchange's name in a "deliver" list. */
#define LC_DELIVER_EXCHANGE "exchange"

/* The destination called name; -1 when none. */
int lc_dest_find(const struct lc_def *def, const char *name);

/* Destination d's values read and checked into *out: ST_OK, or an error
 * with one line in err naming the destination, the value and what is
 * missing or wrong (never a secret's value). */
int lc_dest_resolve(const struct lc_def *def, int d, struct http_dest *out, char *err, size_t errlen);

/* Whether emitted kind k goes to our exchange, and to destination d. */
static inline bool lc_emit_to_exchange(const struct lc_def *def, int k)
{
	return (def->emit_no_exchange & (1u << k)) == 0;
}
static inline bool lc_emit_to_dest(const struct lc_def *def, int k, int d)
{
	return (def->emit_dests[k] & (1u << d)) != 0;
}

#endif
