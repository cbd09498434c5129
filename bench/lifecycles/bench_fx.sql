-- bench/lifecycles/bench_fx.sql - the tables of order_fx1.json's and
-- order_fx3.json's statements (bench/run --lifecycles creates them before
-- each row that runs one, and empties them with the worker's tables).
CREATE TABLE IF NOT EXISTS bench_fx_log (
  message_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
  order_id VARCHAR(64) CHARACTER SET ascii NOT NULL,
  type VARCHAR(64) CHARACTER SET ascii NOT NULL,
  at DATETIME(6) NOT NULL
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS bench_fx_seen (
  message_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
  occurred DATETIME(6) NULL
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS bench_fx_counts (
  bucket INT NOT NULL PRIMARY KEY,
  n BIGINT NOT NULL DEFAULT 0
) ENGINE=InnoDB;
INSERT IGNORE INTO bench_fx_counts (bucket) SELECT seq FROM seq_0_to_63;
