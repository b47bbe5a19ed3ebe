-- dpsql 0.4.0 -> 0.5.0: the private-ERM toolbox (issue 12). This prologue makes the changes
-- that replaying the (idempotent) install script, which follows it, cannot make.
\echo Use "ALTER EXTENSION dpsql UPDATE" to load this file. \quit
-- From an older version this runs right after the older prologues, with no install script
-- between: what only a newer release created is dropped or altered IF EXISTS.

-- The registry learns which models a mechanism trains (mechanisms serving both tasks).
ALTER TABLE IF EXISTS dpsql.mechanism_catalog DROP CONSTRAINT mechanism_catalog_task_check;
ALTER TABLE IF EXISTS dpsql.mechanism_catalog ADD COLUMN models text[];
ALTER TABLE IF EXISTS dpsql.mechanism_catalog ADD COLUMN params text[] NOT NULL DEFAULT '{}';
DROP FUNCTION IF EXISTS dpsql_internal._register_mechanism(text, text, text, boolean, boolean, text,
                                                           text, text[], text, text);
ALTER TABLE IF EXISTS dpsql.mechanism_catalog ADD CONSTRAINT mechanism_catalog_task_check
    CHECK (task IN ('classification', 'regression', 'any'));
DROP FUNCTION IF EXISTS dpsql.mechanisms();
