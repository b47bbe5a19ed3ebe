-- dpsql 0.6.0 -> 0.7.0: private SGD at the speed of a scan (issue 17). This prologue makes the
-- changes that replaying the (idempotent) install script, which follows it, cannot make.
\echo Use "ALTER EXTENSION dpsql UPDATE" to load this file. \quit
