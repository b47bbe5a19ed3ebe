-- The upgrade paths: every released version (a prologue in sql/upgrade) updates to the current
-- one with a single script, its prologues followed by the install script (sql/Makefile). The
-- old install scripts are not shipped: tests/packaging/test_upgrade.py builds them from git
-- history and checks that an updated database equals a fresh install.
SELECT count(*) >= 7 AS released,
       bool_and(path IS NOT DISTINCT FROM source || '--' || target) AS direct
  FROM pg_extension_update_paths('dpsql')
 WHERE target = (SELECT default_version FROM pg_available_extensions WHERE name = 'dpsql');
