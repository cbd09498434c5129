-- @contract it drops the procedures that workers of 0.1.0 call: apply it once they have stopped.
-- @online no for workers of 0.1.0 (their claims fail); yes for every later release, which never calls them.
-- @locks no table: DROP PROCEDURE.
-- The per-message procedures of 0003 and 0004.  Until 0.8.0, 0010 dropped
-- them with its columns, so an upgrade from 0.1.0 under load stopped the
-- old fleet the moment 0010 ran; now the columns go in while it runs and
-- the procedures go once it is gone (`inbox-worker migrate --contract`).
-- On a database 0010 migrated before, they are gone already.
DROP PROCEDURE IF EXISTS inbox_claim;
DROP PROCEDURE IF EXISTS inbox_settle;
