-- @online yes: workers of 0.4.0 keep running while it is applied.
-- @locks processed_messages, order_events, held_events: VARCHAR(64/128) to VARCHAR(255) ascii keeps the one-byte length,
-- @locks and the server takes each MODIFY, indexed columns too, and held_events' two ADD COLUMN as ALGORITHM=INSTANT (tried
-- @locks on MariaDB 10.11): a metadata lock for milliseconds, whatever the rows.
-- Keys wide enough for CloudEvents, and what a held event needs to be
-- released as it arrived (issue 26; SPEC.md, Envelopes).
--
-- A CloudEvent's dedup key is its source + id: source a URI-reference and
-- id any printable ASCII, each up to 255 characters.  The key columns stay
-- ascii with the binary collation (0001): what the envelope layer accepts
-- is printable ASCII, and one byte a character keeps the UNIQUE indexes
-- small: consumer 64 + source 255 + message_id 255 = 574 bytes, far below
-- InnoDB's 3,072-byte key limit (utf8mb4 would be 2,296 and still fit, but
-- would admit what the layer never stores).  ascii_bin pads with spaces
-- when it compares, so the layer refuses an id that ends in a space
-- (msg_wide_id_valid): "a" and "a " must not be one key here and two in C.
-- Native messages keep their narrower rules (msg.c); only the columns grow.
ALTER TABLE processed_messages
  MODIFY source VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  MODIFY message_id VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL;
ALTER TABLE order_events
  MODIFY source VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  MODIFY message_id VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL;
-- A held event keeps, beside its original body and properties (for its
-- dead-letter copy):
--   event    the canonical event the envelope layer mapped it to (NULL for
--            a native message, whose body is its event), parsed again
--            when it is released, so a CloudEvent or MassTransit message
--            is applied as it was read, whatever INBOX_TYPE_MAP says by then;
--   context  the trace context and correlation id it carries into what it
--            causes (JSON, common/envelope.c; NULL: none).
-- The outbox needs nothing new: message_id is VARCHAR(255) already (0016),
-- and an emitted event's trace and correlation travel in its props.
ALTER TABLE held_events
  MODIFY source VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  MODIFY message_id VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  ADD COLUMN IF NOT EXISTS event MEDIUMBLOB NULL COMMENT 'canonical event of an enveloped message; NULL: native',
  ADD COLUMN IF NOT EXISTS context TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL
    COMMENT 'trace context and correlation id (JSON); NULL: none';
