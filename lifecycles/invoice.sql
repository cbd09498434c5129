-- lifecycles/invoice.sql - the tables of lifecycles/invoice.json's own
-- statements: yours, not the worker's.  `inbox-worker migrate` creates the
-- worker's tables (invoices, invoice_events, invoice_locks); these you
-- create yourself, once, before `run`:
--
--   mariadb inbox < lifecycles/invoice.sql
--
-- Each payment writes one ledger row keyed by its message id (the UNIQUE
-- key makes a second copy of the same row impossible even outside the
-- worker) and adds its amount to its account.  A payment for an account
-- that does not exist is refused by the foreign key, and the worker
-- dead-letters it as effect-failed.
--
-- Accounts 1 .. 1000 are created here, every id the definition's
-- account_id allows ("max": 1000), so that `inbox-loadgen publish
-- --lifecycle lifecycles/invoice.json` draws only accounts that exist
-- (MariaDB's sequence engine makes the rows; IGNORE keeps a balance
-- already there when the file is run again).

CREATE TABLE IF NOT EXISTS accounts (
  id BIGINT NOT NULL PRIMARY KEY,
  balance_cents BIGINT NOT NULL DEFAULT 0,
  refunds_due_cents BIGINT NOT NULL DEFAULT 0
) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS ledger_entries (
  id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  message_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  kind VARCHAR(16) CHARACTER SET ascii NOT NULL,
  account_id BIGINT NOT NULL,
  invoice_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  amount_cents BIGINT NOT NULL,
  entry_at DATETIME(6) NOT NULL,
  UNIQUE KEY ledger_entries_message (message_id, kind),
  KEY ledger_entries_invoice (invoice_id),
  CONSTRAINT ledger_entries_account FOREIGN KEY (account_id) REFERENCES accounts (id)
) ENGINE=InnoDB;

INSERT IGNORE INTO accounts (id) SELECT seq FROM seq_1_to_1000;
