-- dpsql 0.2.0 -> 0.3.0: the red team's findings closed (issue 9). This prologue makes the
-- changes that replaying the (idempotent) install script, which follows it, cannot make.
\echo Use "ALTER EXTENSION dpsql UPDATE" to load this file. \quit
-- From an older version this runs right after the older prologues, with no install script
-- between: what only a newer release created is dropped or altered IF EXISTS.

-- Datasets declare their dimension (it was read from the first row at every private run).
ALTER TABLE dpsql.datasets ADD COLUMN dim int CHECK (dim > 0);
UPDATE dpsql.datasets
   SET dim = coalesce(array_length(feature_bounds, 1),
                      CASE WHEN cardinality(features) > 1 THEN cardinality(features) END);
DO $$
DECLARE
    ds record;
    kind "char";
    n int;
BEGIN
    -- The rest: one column, scalar (d = 1) or an array whose length the first row declares,
    -- read here once by the administrator who updates the extension.
    FOR ds IN SELECT d.dataset_id, d.relid, d.features[1] AS col FROM dpsql.datasets d
               WHERE d.dim IS NULL AND d.dropped_at IS NULL LOOP
        SELECT t.typcategory INTO kind FROM pg_catalog.pg_attribute a
          JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
         WHERE a.attrelid = ds.relid AND a.attname = ds.col;
        IF kind = 'A' THEN
            EXECUTE format('SELECT pg_catalog.array_length(%I, 1) FROM %s WHERE %I IS NOT NULL LIMIT 1',
                           ds.col, ds.relid, ds.col) INTO n;
        ELSE
            n := 1;
        END IF;
        UPDATE dpsql.datasets SET dim = n WHERE dataset_id = ds.dataset_id;
    END LOOP;
END $$;

-- Signatures that gained parameters.
DROP FUNCTION IF EXISTS dpsql.register_dataset(text, text[], text, float8, float8, float8[],
                                               float8[], text, text, float8, float8);
DROP FUNCTION IF EXISTS dpsql._register_dataset(regclass, text[], text, float8, float8, float8[],
                                                float8[], text, text, text, float8, float8);
DROP FUNCTION IF EXISTS dpsql._feature_sql(text, text[], float8[]);
DROP FUNCTION IF EXISTS dpsql._prepare(text, text[], text, text, int, bigint, float8, float8, text,
                                       float8, float8, boolean, bigint, float8[], boolean, text,
                                       float8, float8, int, boolean, float8[], text);
