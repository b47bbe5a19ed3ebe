-- dpsql 0.3.0 -> 0.4.0: good private models by default (issue 10). This prologue makes the
-- changes that replaying the (idempotent) install script, which follows it, cannot make.
\echo Use "ALTER EXTENSION dpsql UPDATE" to load this file. \quit
-- From an older version this runs right after the older prologues, with no install script
-- between: what only a newer release created is dropped or altered IF EXISTS.

-- Signatures that gained parameters (regression, estimate: private bounds at registration).
DROP FUNCTION IF EXISTS dpsql.register_dataset(text, text[], text, float8, float8, float8[],
                                               float8[], text, text, float8, float8, int);
DROP FUNCTION IF EXISTS dpsql._register_dataset(regclass, text[], text, float8, float8, float8[],
                                                float8[], text, text, text, float8, float8, int);

-- The mechanisms' train functions take one signature (the registry, 31_mechanisms.sql).
DROP FUNCTION IF EXISTS dpsql._train_linear(dpsql.datasets, jsonb, text, float8, float8, bigint);
DROP FUNCTION IF EXISTS dpsql._train_dpsgd_f(dpsql.datasets, text, jsonb, float8, float8, bigint);
DROP FUNCTION IF EXISTS dpsql._train_whitebox(dpsql.datasets, text, jsonb, text, float8, float8,
                                              bigint);

-- DPSGD-F's private mean takes the rows' norm bound (least squares).
DROP FUNCTION IF EXISTS dpsql._private_mean(text, int, int, bigint, float8, bigint);

-- Internal functions leave the API schema: every dpsql._* routine moves to dpsql_internal
-- (the install script then replaces them there; references are by qualified name).
CREATE SCHEMA dpsql_internal;
DO $$
DECLARE
    f record;
BEGIN
    FOR f IN SELECT p.oid::regprocedure AS sig, p.prokind
               FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = 'dpsql'::regnamespace AND p.proname LIKE '\_%'
    LOOP
        EXECUTE format('ALTER %s %s SET SCHEMA dpsql_internal',
                       CASE f.prokind WHEN 'a' THEN 'AGGREGATE' WHEN 'p' THEN 'PROCEDURE'
                                      ELSE 'FUNCTION' END, f.sig);
    END LOOP;
END $$;
