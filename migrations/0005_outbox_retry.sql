-- @online yes: workers of 0.1.0 keep running while it is applied.
-- @locks outbox: three ADD COLUMN, INSTANT (a metadata lock for milliseconds); CREATE INDEX
-- @locks ix_outbox_due, INPLACE with LOCK=NONE (reads and writes go on while it builds); DROP INDEX, INSTANT.
-- Each outbox row is settled on its own (issue 9, item 2).
--
-- A row the broker returns, nacks or refuses, or one that cannot be
-- published at all (bad stored headers), is retried with a backoff of its
-- own while the rows beside it go on:
--   attempts         failed publishes so far;
--   next_attempt_at  NULL while the row has never failed; otherwise the
--                    relay leaves it alone until then;
--   last_error       why the last attempt failed, for operators.
--
-- The relay's two scans both walk ix_outbox_due in order and touch only the
-- rows they take: rows that never failed by (sent_at IS NULL,
-- next_attempt_at IS NULL, id) -- outbox order, and no backing-off row is
-- ever read -- and rows whose backoff ran out by (sent_at IS NULL,
-- next_attempt_at <= now).  The index also serves what ix_outbox_pending
-- served (the pending count, retention by sent_at), so that one goes: one
-- index less to update per outbox row.

ALTER TABLE outbox
  ADD COLUMN IF NOT EXISTS attempts INT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'failed publishes',
  ADD COLUMN IF NOT EXISTS next_attempt_at DATETIME(6) NULL COMMENT 'NULL: never failed; else retried from then',
  ADD COLUMN IF NOT EXISTS last_error VARCHAR(255) NULL COMMENT 'why the last publish failed';

CREATE INDEX IF NOT EXISTS ix_outbox_due ON outbox (sent_at, next_attempt_at, id);

DROP INDEX IF EXISTS ix_outbox_pending ON outbox;
