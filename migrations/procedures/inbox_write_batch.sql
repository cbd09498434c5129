-- The second round trip of a batch: every row the batch writes, decided in
-- C (common/inbox.c) and sent as one JSON document.  The caller COMMITs
-- right after; this procedure never ends the transaction (one owner of the
-- transaction: inbox_run).
--
-- One JSON array per kind of row, NULL when there is none (each is parsed
-- only by the statement that writes it), written in this order:
--   d: held_events ids to delete (released, expired) [id]
--   h: events to hold                                 [source, message_id, order_id, type, routing_key, props, body_b64]
--   o: order rows, their state after the batch        [order_id, status, version, flags, paid_now, amount_cents]
--   e: ledger rows (order_events), in effect order    [order_id, source, message_id, type, outcome, from, to, version]
--   x: outbox rows, in emission order                 [message_id, exchange, routing_key, type, order_id, props, headers, body_b64]
--   m: inbox outcomes other than the claim's applied  [source, message_id, outcome, reason]
--   l: held counts of the orders, after the batch     [order_id, held]
-- Bodies travel in base64 (a stored body need not be text); the rest is
-- JSON text.  Values keep their columns' rules: a value too long for its
-- column is refused (strict mode), as it was for a single INSERT.

DROP PROCEDURE IF EXISTS inbox_write_batch;

CREATE PROCEDURE inbox_write_batch(
  IN p_consumer VARCHAR(64) CHARACTER SET ascii,
  IN p_d        LONGTEXT CHARACTER SET utf8mb4,
  IN p_h        LONGTEXT CHARACTER SET utf8mb4,
  IN p_o        LONGTEXT CHARACTER SET utf8mb4,
  IN p_e        LONGTEXT CHARACTER SET utf8mb4,
  IN p_x        LONGTEXT CHARACTER SET utf8mb4,
  IN p_m        LONGTEXT CHARACTER SET utf8mb4,
  IN p_l        LONGTEXT CHARACTER SET utf8mb4)
  MODIFIES SQL DATA
BEGIN
  IF p_d IS NOT NULL THEN
    -- Driven from the list, one primary-key lookup per id.  Written as
    -- "WHERE id IN (SELECT ... JSON_TABLE ...)" it was a dependent subquery
    -- over a scan of held_events (MariaDB 10.11 has no semi-join for a
    -- single-table DELETE): every release locked its way through other
    -- batches' held rows, and two releases deadlocked (seen in the chaos
    -- run: a message dead-lettered as retries-exhausted).
    DELETE h FROM JSON_TABLE(p_d, '$[*]' COLUMNS (id BIGINT PATH '$[0]')) d
      STRAIGHT_JOIN held_events h ON h.id = d.id;
  END IF;

  IF p_h IS NOT NULL THEN
    INSERT INTO held_events (consumer, source, message_id, order_id, type, routing_key, props, body, held_at)
    SELECT p_consumer, h.source, h.message_id, h.order_id, h.type, h.routing_key, h.props,
           FROM_BASE64(h.body), NOW(6)
      FROM JSON_TABLE(p_h, '$[*]' COLUMNS (
             n           FOR ORDINALITY,
             source      VARCHAR(255)  PATH '$[0]',
             message_id  VARCHAR(255)  PATH '$[1]',
             order_id    VARCHAR(255)  PATH '$[2]',
             type        VARCHAR(255)  PATH '$[3]',
             routing_key VARCHAR(1024) PATH '$[4]',
             props       LONGTEXT      PATH '$[5]',
             body        LONGTEXT      PATH '$[6]')) h
     ORDER BY h.n;
  END IF;

  IF p_o IS NOT NULL THEN
    INSERT INTO orders (id, status, version, flags, amount_cents, paid_at, created_at, updated_at)
    SELECT o.order_id, o.status, o.version, o.flags, o.amount_cents, IF(o.paid_now = 1, NOW(6), NULL),
           NOW(6), NOW(6)
      FROM JSON_TABLE(p_o, '$[*]' COLUMNS (
             n            FOR ORDINALITY,
             order_id     VARCHAR(255) PATH '$[0]',
             status       VARCHAR(255) PATH '$[1]',
             version      BIGINT       PATH '$[2]',
             flags        BIGINT       PATH '$[3]',
             paid_now     INT          PATH '$[4]',
             amount_cents BIGINT       PATH '$[5]')) o
     ORDER BY o.n
    ON DUPLICATE KEY UPDATE status = VALUES(status), version = VALUES(version), flags = VALUES(flags),
                            paid_at = IF(VALUES(paid_at) IS NOT NULL AND orders.paid_at IS NULL, VALUES(paid_at),
                                         orders.paid_at),
                            amount_cents = COALESCE(VALUES(amount_cents), orders.amount_cents),
                            updated_at = VALUES(updated_at);
  END IF;

  IF p_e IS NOT NULL THEN
    INSERT INTO order_events (order_id, consumer, source, message_id, type, outcome,
                              from_status, to_status, version, applied_at)
    SELECT e.order_id, p_consumer, e.source, e.message_id, e.type, e.outcome, e.from_status, e.to_status,
           e.version, NOW(6)
      FROM JSON_TABLE(p_e, '$[*]' COLUMNS (
             n           FOR ORDINALITY,
             order_id    VARCHAR(255) PATH '$[0]',
             source      VARCHAR(255) PATH '$[1]',
             message_id  VARCHAR(255) PATH '$[2]',
             type        VARCHAR(255) PATH '$[3]',
             outcome     VARCHAR(255) PATH '$[4]',
             from_status VARCHAR(255) PATH '$[5]',
             to_status   VARCHAR(255) PATH '$[6]',
             version     BIGINT       PATH '$[7]')) e
     ORDER BY e.n;
  END IF;

  IF p_x IS NOT NULL THEN
    INSERT INTO outbox (message_id, exchange, routing_key, type, order_id, props, headers, body, created_at)
    SELECT x.message_id, x.exchange, x.routing_key, x.type, x.order_id, x.props, x.headers,
           FROM_BASE64(x.body), NOW(6)
      FROM JSON_TABLE(p_x, '$[*]' COLUMNS (
             n           FOR ORDINALITY,
             message_id  VARCHAR(1024) PATH '$[0]',
             exchange    VARCHAR(1024) PATH '$[1]',
             routing_key VARCHAR(1024) PATH '$[2]',
             type        VARCHAR(1024) PATH '$[3]',
             order_id    VARCHAR(255)  PATH '$[4]',
             props       LONGTEXT      PATH '$[5]',
             headers     LONGTEXT      PATH '$[6]',
             body        LONGTEXT      PATH '$[7]')) x
     ORDER BY x.n;
  END IF;

  IF p_m IS NOT NULL THEN
    UPDATE processed_messages p
      JOIN JSON_TABLE(p_m, '$[*]' COLUMNS (
             source     VARCHAR(255) PATH '$[0]',
             message_id VARCHAR(255) PATH '$[1]',
             outcome    VARCHAR(255) PATH '$[2]',
             reason     VARCHAR(255) PATH '$[3]')) m
        ON p.consumer = p_consumer
       AND p.source = CONVERT(m.source USING ascii) COLLATE ascii_bin
       AND p.message_id = CONVERT(m.message_id USING ascii) COLLATE ascii_bin
       SET p.outcome = m.outcome, p.reason = m.reason, p.processed_at = NOW(6),
           p.held_at = IF(m.outcome = 'held', NOW(6), p.held_at);
  END IF;

  IF p_l IS NOT NULL THEN
    UPDATE order_locks l
      JOIN JSON_TABLE(p_l, '$[*]' COLUMNS (
             order_id VARCHAR(255) PATH '$[0]',
             held     BIGINT       PATH '$[1]')) c
        ON l.order_id = CONVERT(c.order_id USING ascii) COLLATE ascii_bin
       SET l.held = c.held;
  END IF;
END;
