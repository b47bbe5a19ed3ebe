-- dpsql 0.7.0 -> 0.8.0: trust at the edges (issue 24). This prologue makes the changes that
-- replaying the (idempotent) install script, which follows it, cannot make.
\echo Use "ALTER EXTENSION dpsql UPDATE" to load this file. \quit
DROP FUNCTION IF EXISTS dpsql_internal._estimation_dataset(text, text);
