-- @online yes: workers of 0.8.0 keep running while it is applied.
-- @locks held_events and orders: ADD COLUMN, INSTANT (a metadata lock for milliseconds).
-- The version of the lifecycle definition that decided a row (issue 46,
-- item 3; doc/lifecycle.md, "When a definition changes").
--
-- A definition has a version: its "version", or a hash of its content
-- (common/lifecycle.h).  A held event keeps the one it was held under and
-- an aggregate row the one that last wrote it, so that `run`, started by a
-- changed definition, can say at start-up how many rows and held events
-- an older version decided, and refuse one that has lost a state those
-- rows are in or an event those held events are of (worker/preflight.c).
-- NULL: written before this migration, by a version nobody recorded.
--
-- orders is the built-in definition's table (0002); a definition of your
-- own gets the column on its table from `migrate` with INBOX_LIFECYCLE
-- (common/lifecycle_schema.c).  ascii_bin as the other key columns: a
-- version is printable ASCII, compared byte for byte.
--
-- Running fleet: workers of the previous release keep running while this
-- is applied.  Each column is added at the end of its table without
-- copying it (ALGORITHM=INSTANT, a change of metadata only): the ALTER
-- waits for the transactions open on the table to end (a batch each, at
-- most a lock wait of 20 s) and holds the table only for that instant.
-- An old worker names its columns, so its rows get NULL here, and an
-- update of a row by one leaves the version a new worker gave it: run one
-- definition in a fleet.

ALTER TABLE held_events
  ADD COLUMN IF NOT EXISTS lifecycle_version VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL
    COMMENT 'the definition version it was held under; NULL: before 0020',
  ALGORITHM=INSTANT;

ALTER TABLE orders
  ADD COLUMN IF NOT EXISTS lifecycle_version VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL
    COMMENT 'the definition version that last wrote it; NULL: before 0020',
  ALGORITHM=INSTANT;
