-- The upgrade path: the first release, then ALTER EXTENSION UPDATE to the current one through
-- every released version (sql/versions); the result is usable.
\set SHOW_CONTEXT never
SET client_min_messages = warning;
CREATE EXTENSION dpsql VERSION '0.1.0';
SELECT extversion FROM pg_extension WHERE extname = 'dpsql';
ALTER EXTENSION dpsql UPDATE;
SELECT extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'dpsql')
       AS current
  FROM pg_extension WHERE extname = 'dpsql';
SELECT count(*) >= 14 AS mechanisms FROM dpsql.mechanisms();
SELECT count(*) FROM dpsql.mechanisms() WHERE distributed IS NOT NULL;
-- pg_regress runs every file in one database: leave it as found
DROP EXTENSION dpsql CASCADE;
