-- @online yes: workers of 0.4.0 keep running while it is applied.
-- @locks outbox: ADD COLUMN, INSTANT; CREATE INDEX ix_outbox_claim, INPLACE with LOCK=NONE.
-- The outbox dispatched from memory (issue 25, item 2).
--
-- The transaction that writes outbox rows tags them with its claim token;
-- right after its COMMIT the same thread publishes them from memory and
-- marks them sent by that tag in its next write (ix_outbox_claim), instead
-- of the relay scanning, leasing, reading back and marking every row.  The
-- relay takes a tagged row only when it is older than INBOX_OUTBOX_SWEEP
-- (a crash between the commit and the mark); an untagged one (hold
-- expiry, rows of an older version) at once, as before.

ALTER TABLE outbox
  ADD COLUMN IF NOT EXISTS claim BIGINT NULL COMMENT 'the writing transaction''s claim token; NULL: the relay''s at once';

CREATE INDEX IF NOT EXISTS ix_outbox_claim ON outbox (claim);
