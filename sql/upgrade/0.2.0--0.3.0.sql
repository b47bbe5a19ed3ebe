-- dpsql 0.2.0 -> 0.3.0: the red team's findings closed (issue 9). This prologue makes the
-- changes that replaying the (idempotent) install script, which follows it, cannot make.
\echo Use "ALTER EXTENSION dpsql UPDATE" to load this file. \quit
