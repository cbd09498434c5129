-- @online no earlier workers: the first release's procedure (dropped again by the contract file 0021).
-- @locks no table: DROP and CREATE PROCEDURE.
-- The rest of a message's transaction in one round trip.
--
-- After the claim (inbox_claim) the worker decides in C (common/order.c)
-- and then writes: the order row, its ledger row, an outbox row, the inbox
-- outcome, and COMMIT.  Sent one by one these are up to five round trips;
-- on this kind of machine a loopback round trip costs more CPU, in the
-- kernel on both sides, than the statement it carries (see bench/), so the
-- statements go in one CALL.  Like inbox_claim, the procedures only move
-- rows: every value they write was decided by the caller.
--
-- inbox_claim gains p_alone: when the message is alone in its transaction,
-- a duplicate ends it here (ROLLBACK releases the shared lock the failed
-- INSERT took) instead of in a second round trip.

DROP PROCEDURE IF EXISTS inbox_claim;

CREATE PROCEDURE inbox_claim(
  IN p_consumer     VARCHAR(64)  CHARACTER SET ascii,
  IN p_source       VARCHAR(64)  CHARACTER SET ascii,
  IN p_message_id   VARCHAR(128) CHARACTER SET ascii,
  IN p_sha256       CHAR(64)     CHARACTER SET ascii,
  IN p_type         VARCHAR(32)  CHARACTER SET ascii,
  IN p_order_id     VARCHAR(64)  CHARACTER SET ascii,
  IN p_published_us BIGINT,
  IN p_alone        TINYINT)
  MODIFIES SQL DATA
BEGIN
  DECLARE v_dup INT DEFAULT 0;
  -- The UNIQUE index decides: a duplicate fails this INSERT alone (the
  -- statement is rolled back, the transaction goes on).
  DECLARE CONTINUE HANDLER FOR 1062 SET v_dup = 1;

  INSERT INTO processed_messages (consumer, source, message_id, payload_sha256, type, order_id,
                                  outcome, published_at, processed_at)
  VALUES (p_consumer, p_source, p_message_id, p_sha256, p_type, p_order_id, 'applied',
          IF(p_published_us > 0, FROM_UNIXTIME(p_published_us / 1000000), NULL), NOW(6));

  IF v_dup = 1 THEN
    SELECT 1, payload_sha256, 0, NULL, 0, 0 FROM processed_messages
     WHERE consumer = p_consumer AND source = p_source AND message_id = p_message_id;
    IF p_alone = 1 THEN
      ROLLBACK;
    END IF;
  ELSE
    -- Creates the lock row of an unseen order or locks the existing one:
    -- every event of an order serialises here, before the order exists too.
    INSERT INTO order_locks (order_id, held) VALUES (p_order_id, 0)
      ON DUPLICATE KEY UPDATE held = held;
    SELECT 0, NULL, l.held, o.status, o.version, o.flags
      FROM order_locks l LEFT JOIN orders o ON o.id = l.order_id
     WHERE l.order_id = p_order_id FOR UPDATE;
  END IF;
END;

-- p_order_op: 0 leaves the order alone, 1 creates it, 2 updates it; either
--   change also writes the ledger row (p_from_status -> p_status, p_version).
-- p_set_outcome: 1 records p_outcome/p_reason on the inbox row (the claim
--   wrote 'applied'; a held event's row says 'held').
-- p_out_message_id: NULL, or one outbox row to write.
-- p_commit: 1 commits the transaction with this call.
DROP PROCEDURE IF EXISTS inbox_settle;

CREATE PROCEDURE inbox_settle(
  IN p_consumer        VARCHAR(64)  CHARACTER SET ascii,
  IN p_source          VARCHAR(64)  CHARACTER SET ascii,
  IN p_message_id      VARCHAR(128) CHARACTER SET ascii,
  IN p_type            VARCHAR(32)  CHARACTER SET ascii,
  IN p_order_id        VARCHAR(64)  CHARACTER SET ascii,
  IN p_order_op        TINYINT,
  IN p_status          VARCHAR(32)  CHARACTER SET ascii,
  IN p_flags           INT UNSIGNED,
  IN p_paid_now        TINYINT,
  IN p_amount_cents    BIGINT,
  IN p_from_status     VARCHAR(32)  CHARACTER SET ascii,
  IN p_version         BIGINT,
  IN p_set_outcome     TINYINT,
  IN p_outcome         VARCHAR(32)  CHARACTER SET ascii,
  IN p_reason          VARCHAR(64)  CHARACTER SET ascii,
  IN p_out_message_id  VARCHAR(255),
  IN p_out_exchange    VARCHAR(255),
  IN p_out_routing_key VARCHAR(255),
  IN p_out_type        VARCHAR(64),
  IN p_out_props       TEXT,
  IN p_out_headers     TEXT,
  IN p_out_body        MEDIUMBLOB,
  IN p_commit          TINYINT)
  MODIFIES SQL DATA
BEGIN
  IF p_order_op = 1 THEN
    INSERT INTO orders (id, status, version, flags, amount_cents, created_at, updated_at)
    VALUES (p_order_id, p_status, 1, p_flags, p_amount_cents, NOW(6), NOW(6));
  ELSEIF p_order_op = 2 THEN
    UPDATE orders SET status = p_status, version = version + 1, flags = p_flags,
                      paid_at = IF(p_paid_now AND paid_at IS NULL, NOW(6), paid_at),
                      amount_cents = COALESCE(p_amount_cents, amount_cents), updated_at = NOW(6)
     WHERE id = p_order_id;
  END IF;
  IF p_order_op <> 0 THEN
    INSERT INTO order_events (order_id, consumer, source, message_id, type, outcome,
                              from_status, to_status, version, applied_at)
    VALUES (p_order_id, p_consumer, p_source, p_message_id, p_type, p_outcome,
            p_from_status, p_status, p_version, NOW(6));
  END IF;
  IF p_out_message_id IS NOT NULL THEN
    INSERT INTO outbox (message_id, exchange, routing_key, type, order_id, props, headers, body, created_at)
    VALUES (p_out_message_id, p_out_exchange, p_out_routing_key, p_out_type, p_order_id,
            p_out_props, p_out_headers, p_out_body, NOW(6));
  END IF;
  IF p_set_outcome = 1 THEN
    UPDATE processed_messages SET outcome = p_outcome, reason = p_reason, processed_at = NOW(6)
     WHERE consumer = p_consumer AND source = p_source AND message_id = p_message_id;
  END IF;
  IF p_commit = 1 THEN
    COMMIT;
  END IF;
END;
