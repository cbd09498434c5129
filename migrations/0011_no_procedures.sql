-- The batch transaction is two multi-statement requests built in C
-- (common/inbox.c), no longer two JSON_TABLE procedures: the same rows as
-- multi-row INSERTs cost the server less (bench/), the SQL stays portable
-- to MySQL 8.0, and the worker's account needs no EXECUTE.
DROP PROCEDURE IF EXISTS inbox_claim_batch;
DROP PROCEDURE IF EXISTS inbox_write_batch;
