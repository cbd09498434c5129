-- @online yes: workers of 0.6.0 keep running while it is applied.
-- @locks outbox: ADD COLUMN, INSTANT; CREATE INDEX ix_outbox_route, INPLACE with LOCK=NONE; DROP INDEX, INSTANT.
-- Calls to other services through the outbox (issue 45, item 2).
--
-- An emitted event the definition routes to an HTTP destination
-- ("deliver", common/lifecycle_dest.h) is an outbox row like any other,
-- written by the transaction that decided it, with destination set to the
-- destination's name.  Its courier thread (common/outbox_http.h) delivers
-- it with the row's message_id as the Idempotency-Key and keeps the same
-- attempts, next_attempt_at, last_error and leased_until the relay keeps;
-- the relay takes only rows with destination NULL, ours as before.
--
-- ix_outbox_route replaces ix_outbox_due (0005) with the destination
-- after sent_at: the relay's scans (sent_at IS NULL, destination IS NULL,
-- then next_attempt_at), a courier's (sent_at IS NULL, destination = ?,
-- ...) and retention's (sent_at < ?) each read one range of it, and no
-- scan walks over the other's rows.
--
-- Running fleet: workers of the previous release keep running while this
-- is applied.  The column is added in place without copying the table
-- (ALGORITHM=INSTANT, a metadata change) and the index is built online
-- (LOCK=NONE: writes go on while it is built); the old index is dropped
-- once the new one serves the same scans.  An old relay never sees a row
-- for a destination unless a new worker wrote it, and such a row's
-- exchange ("inbox-http:<name>") is declared by no one, so an old relay
-- fails to publish it and leaves it pending rather than lose it.

ALTER TABLE outbox
  ADD COLUMN IF NOT EXISTS destination VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL
    COMMENT 'an HTTP destination of the definition; NULL: our exchange',
  ALGORITHM=INSTANT;

CREATE INDEX IF NOT EXISTS ix_outbox_route ON outbox (sent_at, destination, next_attempt_at, id)
  ALGORITHM=INPLACE LOCK=NONE;

DROP INDEX IF EXISTS ix_outbox_due ON outbox;
