-- dpsql 0.5.0 -> 0.6.0: training on Citus (issue 13). This prologue makes the changes that
-- replaying the (idempotent) install script, which follows it, cannot make.
\echo Use "ALTER EXTENSION dpsql UPDATE" to load this file. \quit
