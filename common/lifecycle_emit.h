/*
 * lifecycle_emit.h - what a definition emits, as kinds with one stable id
 * each: an emitted type split by the event whose effect it is (its cause).
 *
 * SPEC invites a consumer downstream to deduplicate by message-id, so an
 * emitted event's id must name exactly one event of an aggregate's life.
 * A type one cause emits keeps "<type>:<key>" (every type of the built-in
 * order lifecycle: ids stay what they were); a type several causes emit
 * is one kind per cause, "<type>:<key>:<cause>", the cause being the event
 * type whose effect it is:
 *
 *  - an event's "emits": that event;
 *  - a compensation {"if_took_effect": P, "emit": X}: P (what is undone),
 *    not the terminal event that owes it, so a refund has one id whether
 *    the payment was compensated at the cancellation or arrived after it;
 *  - an event's "after": {state: {"compensate": [...]}}: that event.
 *
 * Two sites of one kind are exclusive in one aggregate's life (an event
 * takes effect or is compensated, once; one terminal transition runs)
 * except one: X emitted when P takes effect and again by a compensation
 * if P took effect.  Those would be two events under one id, and the
 * definition is refused there (lc_emit_split).
 *
 * Pure; no allocation.  def->emits[k] stays the type name of kind k, and
 * def->emit_cause[k] is its cause's event index, or -1 when the id names
 * none.  Bits of lc_verdict.emits, lc_event.emits and .after_emits and
 * comp[].emit are kinds.
 */
#ifndef INBOX_LIFECYCLE_EMIT_H
#define INBOX_LIFECYCLE_EMIT_H

#include <stddef.h>

#include "lifecycle.h"

/*
 * Called by lc_load once the events are read (comp[].mark still an event
 * index): splits the emitted types into kinds and renumbers every site.
 * Returns 0, or -1 with why (cut at cap) and *line (the event's line, 0
 * for the file) when the definition cannot give each event its own id.
 */
int lc_emit_split(struct lc_def *def, char *why, size_t cap, int *line);

/* Kind k's stable id for the aggregate key into buf.  Returns its length,
 * or -1 when k is not a kind or cap is too small (never a cut id). */
int lc_emit_id(const struct lc_def *def, int k, const char *key, char *buf, size_t cap);

/* Kind k as a ledger or a person names it: "<type>" or "<type>:<cause>".
 * Returns its length, or -1 as lc_emit_id. */
int lc_emit_label(const struct lc_def *def, int k, char *buf, size_t cap);

/* The kind of a label; -1 when none. */
int lc_emit_find_label(const struct lc_def *def, const char *label);

#endif
