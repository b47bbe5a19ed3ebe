-- dpsql 0.5.0 -> 0.6.0: training on Citus (issue 13). This prologue makes the changes that
-- replaying the (idempotent) install script, which follows it, cannot make.
\echo Use "ALTER EXTENSION dpsql UPDATE" to load this file. \quit
-- From an older version this runs right after the older prologues, with no install script
-- between: what only a newer release created is dropped or altered IF EXISTS.

-- The registry says how each mechanism runs on Citus; dpsql.train takes shard_parallel.
ALTER TABLE IF EXISTS dpsql.mechanism_catalog ADD COLUMN distributed text
    CONSTRAINT mechanism_catalog_distributed_check CHECK (distributed IN ('sums', 'averaged'));
DROP FUNCTION IF EXISTS dpsql_internal._register_mechanism(text, text, text, boolean, boolean, text,
                                                           text, text[], text, text, text[],
                                                           text[]);
DROP FUNCTION IF EXISTS dpsql.mechanisms();
DROP FUNCTION IF EXISTS dpsql.train(text, text[], text, text, int, bigint, float8, float8, text,
                                    float8, boolean, bigint, text, float8[], boolean, text, float8,
                                    float8, float8, int, float8, float8, text, text, boolean,
                                    bigint, float8[], int[], float8, text, float8, text, int, text,
                                    int, int, jsonb);
DROP FUNCTION IF EXISTS dpsql_internal._prepare(text, text[], text, text, int, bigint, float8,
                                                float8, text, float8, float8, boolean, bigint,
                                                float8[], boolean, text, float8, float8, int,
                                                boolean, float8[], text, text[], int);
DROP FUNCTION IF EXISTS dpsql_internal._fill_training_table(bigint, text, text, text, int, int,
                                                            boolean, bigint);

-- Issue 16, re-accounting the ledger: the charge records each release's DpEvent, and a dataset
-- may be charged by PLD composition (the columns are added by the install script's ALTERs).
DROP FUNCTION IF EXISTS dpsql_internal._charge(bigint, float8, float8, text, bigint, text);
DROP FUNCTION IF EXISTS dpsql.register_dataset(text, text[], text, float8, float8, float8[],
                                               float8[], text, text, float8, float8, int, boolean,
                                               jsonb);
DROP FUNCTION IF EXISTS dpsql_internal._register_dataset(regclass, text[], text, float8, float8,
                                                         float8[], float8[], text, text, text,
                                                         float8, float8, int, boolean, jsonb);
