-- @online no earlier workers: it creates the first release's tables (orders, processed_messages, order_events).
-- @locks none that exist: CREATE TABLE IF NOT EXISTS only.
-- The tables of SPEC.md: orders, the inbox (processed_messages) and the
-- ledger of applied effects (order_events).
--
-- Identifiers are ASCII with a binary collation: message ids are
-- case-sensitive ("A1" and "a1" are two messages), and a case-insensitive
-- collation would make the UNIQUE index call them duplicates.

CREATE TABLE IF NOT EXISTS orders (
  id            VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  status        VARCHAR(24)  CHARACTER SET ascii NOT NULL,
  version       INT UNSIGNED NOT NULL,
  flags         TINYINT UNSIGNED NOT NULL DEFAULT 0 COMMENT '1 = payment took effect, 2 = inventory reserved',
  amount_cents  BIGINT       NULL,
  paid_at       DATETIME(6)  NULL,
  created_at    DATETIME(6)  NOT NULL,
  updated_at    DATETIME(6)  NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS processed_messages (
  id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  consumer        VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  source          VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  message_id      VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  payload_sha256  CHAR(64)     CHARACTER SET ascii NOT NULL,
  type            VARCHAR(32)  CHARACTER SET ascii NOT NULL,
  order_id        VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  outcome         VARCHAR(16)  CHARACTER SET ascii NOT NULL,
  reason          VARCHAR(32)  CHARACTER SET ascii NULL,
  published_at    DATETIME(6)  NULL COMMENT 'x-published-us header, for latency',
  processed_at    DATETIME(6)  NOT NULL,
  PRIMARY KEY (id),
  -- The only arbiter of duplicates, concurrent ones included.
  UNIQUE KEY uq_processed_messages_key (consumer, source, message_id),
  KEY ix_processed_messages_processed_at (processed_at),
  KEY ix_processed_messages_order (order_id)
) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS order_events (
  id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  order_id    VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  consumer    VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  source      VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  message_id  VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  type        VARCHAR(32)  CHARACTER SET ascii NOT NULL,
  outcome     VARCHAR(16)  CHARACTER SET ascii NOT NULL COMMENT 'applied or compensated',
  from_status VARCHAR(24)  CHARACTER SET ascii NOT NULL,
  to_status   VARCHAR(24)  CHARACTER SET ascii NOT NULL,
  version     INT UNSIGNED NOT NULL COMMENT 'orders.version after this effect',
  applied_at  DATETIME(6)  NOT NULL,
  PRIMARY KEY (id),
  -- A second guard: one effect per message even if the inbox were bypassed.
  UNIQUE KEY uq_order_events_message (consumer, source, message_id),
  UNIQUE KEY uq_order_events_order_version (order_id, version)
) ENGINE=InnoDB;
