-- @online yes: workers of 0.3.0 keep running while it is applied.
-- @locks order_events: ADD COLUMN, INSTANT (a metadata lock for milliseconds).
-- The ledger remembers what each effect's message said (issue 22, item 1).
--
-- Retention deletes processed_messages rows after INBOX_RETENTION, but
-- never order_events: the ledger is the longer memory.  A key whose inbox
-- row is gone and whose effect the ledger holds is not new: the claim
-- (common/inbox.c) reads the ledger row back and decides the delivery
-- against it, a duplicate when the payload is the same, a conflict
-- otherwise (the first one stands).  payload_sha256 is the hash the claim
-- stored for that message; NULL on rows written before this migration,
-- which are then compared by order and type.

ALTER TABLE order_events
  ADD COLUMN IF NOT EXISTS payload_sha256 CHAR(64) CHARACTER SET ascii NULL
    COMMENT 'the payload hash of the message that took this effect; NULL: written before 0015';
