-- The worker's own account (doc/operations.md, "Database accounts"): rows only (DML).  The schema belongs to inbox_owner (MARIADB_USER in
-- compose.yaml), which `inbox-worker migrate` uses.  Run once, by the
-- MariaDB image's entrypoint, when the data volume is first initialised.
CREATE USER IF NOT EXISTS 'inbox'@'%' IDENTIFIED BY 'inbox';
GRANT SELECT, INSERT, UPDATE, DELETE ON `inbox`.* TO 'inbox'@'%';
