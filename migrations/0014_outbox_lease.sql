-- @online yes: workers of 0.2.0 keep running while it is applied.
-- @locks outbox: ADD COLUMN, INSTANT (a metadata lock for milliseconds).
-- The outbox relay's claim as a committed write (issue 13, item 3).
--
-- The relay used to claim rows by holding their row locks (SELECT ... FOR
-- UPDATE SKIP LOCKED) across the publish.  Row locks are local to a node of
-- a Galera cluster: two relays writing to different nodes both took the
-- same rows and published them, and one round's COMMIT then failed its
-- certification, so its rows were published again later.  Now a round
-- first commits a lease on the rows it takes (leased_until), which
-- certification orders against any other relay's lease of the same rows;
-- the rows are published only after that commit, and marking them sent
-- clears the lease.  A relay that dies mid-round leaves the lease to run
-- out, and the rows are published again after it (with their stable
-- message-id, as after any crash).

ALTER TABLE outbox
  ADD COLUMN IF NOT EXISTS leased_until DATETIME(6) NULL COMMENT 'a relay publishes this row until then; NULL: free';
