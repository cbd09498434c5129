-- @online no earlier workers: the first release's procedure (dropped again by the contract file 0021).
-- @locks no table: DROP and CREATE PROCEDURE.
-- The claim and the order lock in one round trip.
--
-- Per message the worker must (1) INSERT the key into processed_messages,
-- (2) on a duplicate read the stored hash, otherwise (3) lock the order's
-- lock row, creating it for an order never seen, and read the order.  Done
-- from the client these are two or three round trips; on a machine where
-- loopback round trips are the cost (see bench/), doing them in one CALL is
-- the difference between four and five round trips per message.  The
-- decision itself stays in C (common/order.c): this procedure only moves
-- rows.
--
-- Result: one row (dup, stored_sha256, held, status, version, flags).
--   dup = 1: the key was already claimed; stored_sha256 is its hash (no
--            row at all if the first claim rolled back meanwhile: retry).
--   dup = 0: claimed; the order is locked; status NULL = no order yet.

DROP PROCEDURE IF EXISTS inbox_claim;

CREATE PROCEDURE inbox_claim(
  IN p_consumer     VARCHAR(64)  CHARACTER SET ascii,
  IN p_source       VARCHAR(64)  CHARACTER SET ascii,
  IN p_message_id   VARCHAR(128) CHARACTER SET ascii,
  IN p_sha256       CHAR(64)     CHARACTER SET ascii,
  IN p_type         VARCHAR(32)  CHARACTER SET ascii,
  IN p_order_id     VARCHAR(64)  CHARACTER SET ascii,
  IN p_published_us BIGINT)
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
