-- @online yes: workers of 0.2.0 keep running while it is applied.
-- @locks processed_messages: ADD COLUMN, INSTANT (a metadata lock for milliseconds).
-- When an event was held (issue 12, items 3 and 8).
--
-- A held event's inbox row is overwritten with its final outcome when it is
-- released or expires, and its held_events row is deleted, so nothing else
-- says afterwards that it had to wait.  held_at keeps that: NULL for an
-- event that never waited, else when it was first held.  inbox_write_batch
-- sets it when it writes the 'held' outcome and never clears it.
-- `inbox-loadgen verify` counts held-then-released events from it, and the
-- accounting test compares inbox_held_total with it.  Rows written before
-- this migration have NULL.

ALTER TABLE processed_messages
  ADD COLUMN IF NOT EXISTS held_at DATETIME(6) NULL COMMENT 'when the event was held; NULL: never held';
