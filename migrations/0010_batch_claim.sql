-- @online yes: workers of 0.1.0 keep running while it is applied (their procedures go only with 0021).
-- @locks processed_messages and order_locks: one ADD COLUMN each, INSTANT (a metadata lock for milliseconds).
-- @replaces 0857675009fde3dea49e29713c6a17b7a39690e45a2b25750d09aed62f2bc1c2 its text up to 0.8.0, which also dropped inbox_claim and inbox_settle
-- A batch's transaction in two round trips (issue 10).
--
-- processed_messages.claim: a random 64-bit token written by the batch's
-- multi-row INSERT.  The INSERT keeps every key of the batch (ON DUPLICATE
-- KEY UPDATE changes nothing on a key already taken, so the UNIQUE index
-- stays the only arbiter and a value the column refuses is still an
-- error, as INSERT IGNORE would not keep it); reading the rows back, a
-- row carrying the batch's token is ours, any other is a duplicate or a
-- conflict by its stored hash.  NULL on rows claimed before this change.
--
-- order_locks.locks: bumped by every transaction that locks the order, so
-- that taking the lock is a real write.  A no-op update (held = held)
-- changes no row, and a certification-based cluster (Galera) only sees
-- conflicts between rows that change.
--
-- The per-message procedures of 0003/0004 are replaced by the batch
-- procedures in migrations/procedures/, which migrate re-applies when
-- they change.  They are dropped by 0021, a contract file: until 0.8.0
-- this file dropped them, and workers of 0.1.0 still running while it was
-- applied lost them mid-run.

ALTER TABLE processed_messages
  ADD COLUMN IF NOT EXISTS claim BIGINT UNSIGNED NULL COMMENT 'token of the transaction that inserted the row';

ALTER TABLE order_locks
  ADD COLUMN IF NOT EXISTS locks BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'transactions that locked the order';
