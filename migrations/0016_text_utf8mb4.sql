-- @online yes: workers of 0.3.0 keep running while it is applied; on a latin1 database their writes to outbox and held_events wait for the copy.
-- @locks held_events and outbox, on a database created utf8mb4 (as scripts/stack makes it): a collation change, INSTANT for
-- @locks held_events and NOCOPY with LOCK=NONE for outbox (its indexed message_id's index is rebuilt in place; writes go on).
-- @locks On a latin1 database the bytes change: the server allows only ALGORITHM=COPY with LOCK=SHARED, so both tables take
-- @locks reads but hold writes for the copy, in time with their rows (keep the outbox small: cleanup deletes sent rows).
-- @locks orders, processed_messages, order_events, order_locks: DEFAULT CHARACTER SET only, INSTANT.
-- Every column that stores text from a message says its character set
-- itself (issue 22, item 4).
--
-- 0002 left held_events' and outbox's text columns to the database's
-- default character set.  MariaDB's upstream default is latin1, and there a
-- valid held payment with a non-Latin-1 header value (its AMQP properties,
-- kept as JSON for a later dead-letter) was refused ("Incorrect string
-- value ... for column held_events.props") and dead-lettered unprocessable.
-- The worker accepts any UTF-8 (routing keys without NUL bytes, properties
-- and headers as JSON text), so these columns are utf8mb4 whatever the
-- server's defaults; utf8mb4_bin keeps the bytes as they came and compares
-- them as bytes (none of these columns is indexed or compared by case).
-- The tables' own default follows, so a column added later without a
-- character set is utf8mb4 too.  Identifiers stay ascii_bin (0001).
--
-- On a server whose default was utf8mb4 already this changes at most the
-- collation of unindexed columns; on a latin1 one MariaDB converts the
-- stored values (Latin-1 text is valid utf8mb4 after conversion).

ALTER TABLE held_events
  DEFAULT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  MODIFY routing_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  MODIFY props TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL COMMENT 'AMQP properties, kept for a dead-letter';

ALTER TABLE outbox
  DEFAULT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  MODIFY message_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL COMMENT 'stable AMQP message-id',
  MODIFY exchange VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  MODIFY routing_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  MODIFY type VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  MODIFY props TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL
    COMMENT 'AMQP properties as JSON (dead-letters keep the original)',
  MODIFY headers TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL COMMENT 'extra headers as a JSON object of strings',
  MODIFY last_error VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL COMMENT 'why the last publish failed';

ALTER TABLE orders DEFAULT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
ALTER TABLE processed_messages DEFAULT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
ALTER TABLE order_events DEFAULT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
ALTER TABLE order_locks DEFAULT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
