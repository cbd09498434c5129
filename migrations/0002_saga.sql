-- @online no earlier workers: it creates the first release's tables (order_locks, held_events, outbox).
-- @locks none that exist: CREATE TABLE IF NOT EXISTS only.
-- What the saga needs beyond SPEC.md's tables: a lock row per order (so that
-- an event for an order that does not exist yet still serialises with its
-- OrderCreated), the held events, and the transactional outbox.

CREATE TABLE IF NOT EXISTS order_locks (
  order_id  VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  held      INT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'held_events rows of this order',
  PRIMARY KEY (order_id)
) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS held_events (
  id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  consumer    VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  source      VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  message_id  VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  order_id    VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  type        VARCHAR(32)  CHARACTER SET ascii NOT NULL,
  routing_key VARCHAR(255) NOT NULL,
  props       TEXT         NULL COMMENT 'AMQP properties, kept for a dead-letter',
  body        MEDIUMBLOB   NOT NULL,
  held_at     DATETIME(6)  NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uq_held_events_key (consumer, source, message_id),
  KEY ix_held_events_order (order_id, id),
  KEY ix_held_events_held_at (held_at)
) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS outbox (
  id           BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  message_id   VARCHAR(255) NOT NULL COMMENT 'stable AMQP message-id',
  exchange     VARCHAR(255) NOT NULL,
  routing_key  VARCHAR(255) NOT NULL,
  type         VARCHAR(64)  NOT NULL,
  order_id     VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  props        TEXT         NULL COMMENT 'AMQP properties as JSON (dead-letters keep the original)',
  headers      TEXT         NULL COMMENT 'extra headers as a JSON object of strings',
  body         MEDIUMBLOB   NOT NULL,
  created_at   DATETIME(6)  NOT NULL,
  sent_at      DATETIME(6)  NULL,
  PRIMARY KEY (id),
  KEY ix_outbox_pending (sent_at, id)
) ENGINE=InnoDB;
