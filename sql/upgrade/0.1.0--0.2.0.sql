-- dpsql 0.1.0 -> 0.2.0: DP linear regression (DP-AMBSSGD, DP-SSGD, DP-GD with confidence
-- intervals, AdaSSP) and regression datasets. This prologue makes the changes that replaying
-- the (idempotent) install script, which follows it, cannot make.
\echo Use "ALTER EXTENSION dpsql UPDATE" to load this file. \quit

-- Regression datasets: no label set, a public bound on |y| (and on ||x||), rows kept as they are.
ALTER TABLE dpsql.datasets ALTER COLUMN labels DROP NOT NULL;
ALTER TABLE dpsql.datasets DROP CONSTRAINT datasets_row_norm_check;
ALTER TABLE dpsql.datasets ADD CONSTRAINT datasets_row_norm_check
    CHECK (row_norm IN ('clip', 'unit', 'none'));
ALTER TABLE dpsql.datasets ADD COLUMN label_bound float8, ADD COLUMN row_bound float8;

-- Signatures that gained parameters.
DROP FUNCTION dpsql.register_dataset(text, text[], text, float8, float8, float8[], float8[], text, text);
DROP FUNCTION dpsql._register_dataset(regclass, text[], text, float8, float8, float8[], float8[], text,
                                      text, text);
-- dpsql.train gained the linear mechanisms' parameters (every overload: only one exists).
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = 'dpsql'::regnamespace AND p.proname = 'train' LOOP
        EXECUTE format('DROP FUNCTION %s', f);
    END LOOP;
END $$;
