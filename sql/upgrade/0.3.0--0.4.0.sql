-- dpsql 0.3.0 -> 0.4.0: good private models by default (issue 10). This prologue makes the
-- changes that replaying the (idempotent) install script, which follows it, cannot make.
\echo Use "ALTER EXTENSION dpsql UPDATE" to load this file. \quit
