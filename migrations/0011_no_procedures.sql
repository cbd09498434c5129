-- @contract it drops the batch procedures that workers of 0.2.0 call: apply it once they have stopped.
-- @online no for workers of 0.2.0 (their transactions fail); yes for every later release.
-- @locks no table: DROP PROCEDURE.
-- The batch transaction is two multi-statement requests built in C
-- (common/inbox.c), no longer two JSON_TABLE procedures: the same rows as
-- multi-row INSERTs cost the server less (bench/), the SQL stays portable
-- to MySQL 8.0, and the worker's account needs no EXECUTE.
DROP PROCEDURE IF EXISTS inbox_claim_batch;
DROP PROCEDURE IF EXISTS inbox_write_batch;
