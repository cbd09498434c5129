-- The first round trip of a batch: claim every key, lock every order.
--
-- p_keys: a JSON array with one entry per distinct key of the batch,
-- sorted by (source, message_id) in binary order by the caller, so that
-- two batches take their index locks in the same order:
--   [source, message_id, sha256, type, order_id, published_us]
-- The claim is one multi-row INSERT; a key already taken stays as it is
-- (the no-op ON DUPLICATE KEY UPDATE waits for, and then locks, the row of
-- a concurrent claim, exactly as a failed INSERT would).  Then the lock
-- rows of the orders of the keys that are ours are created or bumped, in
-- order_id order (a real write: see 0010), and read with their orders.
--
-- Result, one row per key, then one per locked order:
--   0, n, stored_sha256, mine, NULL, NULL, 0, 0, 0   (n: 1-based index in p_keys)
--   1, 0, order_id,      0,    held, status, version, flags, 0   (status NULL: no order yet)
-- The decisions stay in C (common/order.c); this only moves rows.

DROP PROCEDURE IF EXISTS inbox_claim_batch;

CREATE PROCEDURE inbox_claim_batch(
  IN p_consumer VARCHAR(64) CHARACTER SET ascii,
  IN p_claim    BIGINT UNSIGNED,
  IN p_keys     LONGTEXT CHARACTER SET utf8mb4)
  MODIFIES SQL DATA
BEGIN
  INSERT INTO processed_messages (consumer, source, message_id, payload_sha256, type, order_id,
                                  outcome, published_at, processed_at, claim)
  SELECT p_consumer, k.source, k.message_id, k.sha256, k.type, k.order_id, 'applied',
         IF(k.published_us > 0, FROM_UNIXTIME(k.published_us / 1000000), NULL), NOW(6), p_claim
    FROM JSON_TABLE(p_keys, '$[*]' COLUMNS (
           n            FOR ORDINALITY,
           source       VARCHAR(255) PATH '$[0]',
           message_id   VARCHAR(255) PATH '$[1]',
           sha256       VARCHAR(255) PATH '$[2]',
           type         VARCHAR(255) PATH '$[3]',
           order_id     VARCHAR(255) PATH '$[4]',
           published_us BIGINT       PATH '$[5]')) k
   ORDER BY k.n
  ON DUPLICATE KEY UPDATE claim = processed_messages.claim;

  INSERT INTO order_locks (order_id, held, locks)
  SELECT DISTINCT p.order_id, 0, 1
    FROM JSON_TABLE(p_keys, '$[*]' COLUMNS (
           source     VARCHAR(255) PATH '$[0]',
           message_id VARCHAR(255) PATH '$[1]')) k
    JOIN processed_messages p
      ON p.consumer = p_consumer
     AND p.source = CONVERT(k.source USING ascii) COLLATE ascii_bin
     AND p.message_id = CONVERT(k.message_id USING ascii) COLLATE ascii_bin
   WHERE p.claim = p_claim
   ORDER BY p.order_id
  ON DUPLICATE KEY UPDATE locks = order_locks.locks + 1;

  SELECT 0 AS kind, k.n AS n, p.payload_sha256 AS txt, p.claim <=> p_claim AS mine,
         NULL AS held, NULL AS status, 0 AS version, 0 AS flags
    FROM JSON_TABLE(p_keys, '$[*]' COLUMNS (
           n          FOR ORDINALITY,
           source     VARCHAR(255) PATH '$[0]',
           message_id VARCHAR(255) PATH '$[1]')) k
    JOIN processed_messages p
      ON p.consumer = p_consumer
     AND p.source = CONVERT(k.source USING ascii) COLLATE ascii_bin
     AND p.message_id = CONVERT(k.message_id USING ascii) COLLATE ascii_bin
  UNION ALL
  SELECT 1, 0, l.order_id, 0, l.held, o.status, o.version, o.flags
    FROM order_locks l
    LEFT JOIN orders o ON o.id = l.order_id
   WHERE l.order_id IN (SELECT p.order_id
                          FROM JSON_TABLE(p_keys, '$[*]' COLUMNS (
                                 source     VARCHAR(255) PATH '$[0]',
                                 message_id VARCHAR(255) PATH '$[1]')) k
                          JOIN processed_messages p
                            ON p.consumer = p_consumer
                           AND p.source = CONVERT(k.source USING ascii) COLLATE ascii_bin
                           AND p.message_id = CONVERT(k.message_id USING ascii) COLLATE ascii_bin
                         WHERE p.claim = p_claim);
END;
