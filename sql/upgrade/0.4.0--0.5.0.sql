-- dpsql 0.4.0 -> 0.5.0: the private-ERM toolbox (issue 12). This prologue makes the changes
-- that replaying the (idempotent) install script, which follows it, cannot make.
\echo Use "ALTER EXTENSION dpsql UPDATE" to load this file. \quit

-- The registry learns which models a mechanism trains (mechanisms serving both tasks).
ALTER TABLE dpsql.mechanism_catalog DROP CONSTRAINT mechanism_catalog_task_check;
ALTER TABLE dpsql.mechanism_catalog ADD COLUMN models text[];
ALTER TABLE dpsql.mechanism_catalog ADD COLUMN params text[] NOT NULL DEFAULT '{}';
DROP FUNCTION dpsql_internal._register_mechanism(text, text, text, boolean, boolean, text, text,
                                                 text[], text, text);
ALTER TABLE dpsql.mechanism_catalog ADD CONSTRAINT mechanism_catalog_task_check
    CHECK (task IN ('classification', 'regression', 'any'));
DROP FUNCTION dpsql.mechanisms();
