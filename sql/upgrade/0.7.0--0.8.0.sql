-- dpsql 0.7.0 -> 0.8.0: trust at the edges (issue 24). This prologue makes the changes that
-- replaying the (idempotent) install script, which follows it, cannot make.
\echo Use "ALTER EXTENSION dpsql UPDATE" to load this file. \quit
-- From an older version this runs right after the older prologues, with no install script
-- between: what only a newer release created is dropped or altered IF EXISTS.
DROP FUNCTION IF EXISTS dpsql_internal._estimation_dataset(text, text);

-- Issue 25: each mechanism's intercept default and when it is recommended.
ALTER TABLE IF EXISTS dpsql.mechanism_catalog
    ADD COLUMN IF NOT EXISTS intercept_default boolean NOT NULL DEFAULT true,
    ADD COLUMN IF NOT EXISTS recommended text;
DROP FUNCTION IF EXISTS dpsql_internal._register_mechanism(text, text, text, boolean, boolean, text, text,
                                                           text[], text, text, text[], text[], text);
DROP FUNCTION IF EXISTS dpsql.mechanisms();
DROP FUNCTION IF EXISTS dpsql_internal._bolton_noise_target();

-- Issue 26: the registry comes from each mechanism's spec (sql/mechanisms/*.toml), with its
-- parameters and delta default; the parameter check reads them.
ALTER TABLE IF EXISTS dpsql.mechanism_catalog
    ADD COLUMN IF NOT EXISTS delta_default float8 NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS parameters jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN IF NOT EXISTS step_noise_function text;
-- Issue 28: Poisson-sampled private SGD runs on Citus ('sampled').
ALTER TABLE IF EXISTS dpsql.mechanism_catalog
    DROP CONSTRAINT IF EXISTS mechanism_catalog_distributed_check,
    ADD CONSTRAINT mechanism_catalog_distributed_check
        CHECK (distributed IN ('sums', 'averaged', 'sampled'));
DROP FUNCTION IF EXISTS dpsql_internal._alg2_rows_sql(text, int, int);
DROP FUNCTION IF EXISTS dpsql_internal._step_noise(text, jsonb, bigint, bigint, int);
DROP FUNCTION IF EXISTS dpsql_internal._refuse_unused_params(dpsql.mechanism_catalog, jsonb);
-- Issue 26: privacy formulas in one place (the C core): the defaults size noise with
-- dpsql_internal._noise_size.
DROP FUNCTION IF EXISTS dpsql_internal._unit_noise_norm(int, float8, float8);
-- DP-SGD charges the DpEvent its accountant composed (the answer's ledger_event), no longer
-- one rebuilt in SQL; cached answers from before do not carry it (asking again is exact).
DROP FUNCTION IF EXISTS dpsql_internal._dpsgd_event(jsonb, int, float8);
DELETE FROM dpsql.accountant_answers
 WHERE request->>'op' IN ('calibrate', 'epsilon', 'report') AND NOT answer ? 'ledger_event';

-- Issue 27: tables as they come. Categorical columns (one-hot) and text labels are declared
-- at registration; labels take the label column's own type; registration reports (and refuses
-- unless accepted) what the rows hold against the declarations; reading takes text columns.
-- (the columns dpsql.datasets.categories and label_values: 28_ledger.sql, after composition)
DROP FUNCTION IF EXISTS dpsql.register_dataset(text, text[], text, float8, float8, float8[], float8[],
                                               text, text, float8, float8, int, boolean, jsonb, text);
DROP FUNCTION IF EXISTS dpsql_internal._register_dataset(regclass, text[], text, float8, float8, float8[],
                                                         float8[], text, text, text, float8, float8, int,
                                                         boolean, jsonb, text);
DROP FUNCTION IF EXISTS dpsql_internal._register_columns(regclass, text, text[], text, int, float8[]);
DROP FUNCTION IF EXISTS dpsql_internal._feature_sql(text, text[], float8[], text[], int);
DROP FUNCTION IF EXISTS dpsql_internal._read_list(regclass, text[]);
DROP FUNCTION IF EXISTS dpsql.evaluate(bigint, text, text[], text);  -- issue 27: baselines and metrics
DROP FUNCTION IF EXISTS dpsql_internal._charge(bigint, float8, float8, text, bigint, text, jsonb);
DROP FUNCTION IF EXISTS dpsql_internal._label_sql(text, text, float8[], boolean);
DROP FUNCTION IF EXISTS dpsql_internal._prepare(text, text[], text, text, int, bigint, float8, float8, text,
                                                float8, float8, boolean, bigint, float8[], boolean, text,
                                                float8, float8, int, boolean, float8[], text, text[], int,
                                                boolean, regclass);
-- Issue 45: a private run's rows are read after its charge (_read_rows); the fills take
-- empty (no row before the charge) instead of asking whether a preview runs.
DROP FUNCTION IF EXISTS dpsql_internal._fill_distributed_table(bigint, regclass, text, text, int, boolean,
                                                               bigint);
ALTER TABLE IF EXISTS dpsql.runs ADD COLUMN IF NOT EXISTS fill jsonb;
-- Issue 45: a run's state is built once (_initial_state); a private run's row is written once,
-- after its plan, its charge and its read (_prepare_private returns the prepared row,
-- _start_run writes it; _run_epochs runs it).
DROP FUNCTION IF EXISTS dpsql_internal._arm_whitebox(bigint, jsonb, bigint);
DROP FUNCTION IF EXISTS dpsql_internal._run_armed(bigint, jsonb, bigint);
DROP FUNCTION IF EXISTS dpsql_internal._prepare_private(dpsql.datasets, text, jsonb);
DROP FUNCTION IF EXISTS dpsql_internal._fill_training_table(bigint, text, text, text, int, int, boolean,
                                                            bigint);

-- Before 0.8.0 data owners could create in dpsql_work, where private runs create their
-- training tables under predictable names: what a role other than the extension owner owns
-- there (their non-private runs' tables, or relations and types planted under a future run's
-- name) moves to dpsql_owner_work, their schema from now on, and their runs follow it.
CREATE SCHEMA IF NOT EXISTS dpsql_owner_work;
DO $$
DECLARE
    o record;
    ext oid := (SELECT e.extowner FROM pg_catalog.pg_extension e WHERE e.extname = 'dpsql');
BEGIN
    FOR o IN SELECT c.oid, c.relname AS name,
                    CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                                   WHEN 'f' THEN 'FOREIGN TABLE' WHEN 'S' THEN 'SEQUENCE'
                                   ELSE 'TABLE' END AS kind
               FROM pg_catalog.pg_class c
              WHERE c.relnamespace = 'dpsql_work'::regnamespace AND c.relowner <> ext
                AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
              ORDER BY c.relkind = 'S' LOOP
        -- (a sequence owned by a column has moved with its table, before it)
        CONTINUE WHEN (SELECT c.relnamespace FROM pg_catalog.pg_class c WHERE c.oid = o.oid)
                      <> 'dpsql_work'::regnamespace;
        EXECUTE format('ALTER %s dpsql_work.%I SET SCHEMA dpsql_owner_work', o.kind, o.name);
        UPDATE dpsql.runs r SET train_table = format('dpsql_owner_work.%I', o.name)
         WHERE r.train_table = format('dpsql_work.%I', o.name);
    END LOOP;
    -- standalone types (a composite type takes a table's name as well)
    FOR o IN SELECT t.oid, t.typname AS name FROM pg_catalog.pg_type t
              WHERE t.typnamespace = 'dpsql_work'::regnamespace AND t.typowner <> ext
                AND t.typelem = 0 AND t.typcategory <> 'A'
                AND (t.typrelid = 0 OR (SELECT c.relkind FROM pg_catalog.pg_class c
                                         WHERE c.oid = t.typrelid) = 'c') LOOP
        EXECUTE format('ALTER TYPE dpsql_work.%I SET SCHEMA dpsql_owner_work', o.name);
    END LOOP;
END $$;

-- Issue 25 (privacy rule 10, docs/architecture.md): a released model's coef and intercept score the
-- registered features. DPSGD-F models of 0.7.0 were released for rows centred on their
-- private mean: the centre is folded into the intercept (b - w . centre), kept as 'mean'.
-- And the private-ERM fits and DP-GD with an intercept (rows clipped, then the 1 appended) record that
-- representation as their preprocessing, so that predict and evaluate score what they
-- trained (0.7.0 scored them with the 1 appended before the row transform).
DO $$
DECLARE
    m record;
    c float8[];
    w float8[];
    d int;
BEGIN
    FOR m IN SELECT model_id, weights, n_features, params FROM dpsql.model_store
              WHERE params->'privacy'->'preprocessing'->'centre' IS NOT NULL
                AND EXISTS (SELECT 1 FROM jsonb_array_elements_text(
                                params->'privacy'->'preprocessing'->'centre') v
                             WHERE v::float8 <> 0) LOOP
        c := ARRAY(SELECT v::float8 FROM jsonb_array_elements_text(
                       m.params->'privacy'->'preprocessing'->'centre') v);
        w := m.weights;
        d := m.n_features;
        IF array_ndims(w) = 1 THEN
            w[d + 1] := w[d + 1] - (SELECT sum(w[k] * c[k]) FROM generate_series(1, d) k);
        ELSE
            FOR i IN 1 .. array_length(w, 1) LOOP
                w[i][d + 1] := w[i][d + 1]
                               - (SELECT sum(w[i][k] * c[k]) FROM generate_series(1, d) k);
            END LOOP;
        END IF;
        UPDATE dpsql.model_store
           SET weights = w,
               intercept = CASE WHEN array_ndims(w) = 1 THEN ARRAY[w[d + 1]]
                                ELSE ARRAY(SELECT w[i][d + 1] FROM generate_series(1, array_length(w, 1)) i) END,
               params = jsonb_set(params, '{privacy,preprocessing}',
                                  (params->'privacy'->'preprocessing')
                                  || jsonb_build_object('mean', to_jsonb(c),
                                                        'centre', to_jsonb(array_fill(0::float8, ARRAY[d])),
                                                        'theta', to_jsonb(m.weights)))
         WHERE model_id = m.model_id;
    END LOOP;
    UPDATE dpsql.model_store
       SET flags = flags & ~3,
           params = jsonb_set(params, '{privacy,preprocessing}', jsonb_build_object(
               'row_flags', flags & 3,
               'centre', to_jsonb(array_fill(0::float8, ARRAY[n_features])),
               'intercept', 'appended after the row transform'))
     WHERE fit_intercept
       AND privacy IN ('objective_perturbation', 'output_perturbation', 'dp_ftrl',
                       'exponential_mechanism', 'dp_ambssgd', 'dp_ssgd', 'frank_wolfe', 'dpgd')
       AND NOT (privacy = 'frank_wolfe' AND params->'privacy'->>'model' = 'lasso')
       AND params->'privacy'->'preprocessing' IS NULL;
END $$;

-- Issue 25: private bounds scan a grid of magnitudes (27_estimate_bounds.sql); the helpers of
-- the linear grid's estimates are gone (DPSGD-F keeps _private_quantile and _grid_sql).
DROP FUNCTION IF EXISTS dpsql_internal._estimate_grid(dpsql.datasets, float8, float8[], float8);
DROP FUNCTION IF EXISTS dpsql_internal._warn_rank_error(text, bigint, float8, bigint);
DROP FUNCTION IF EXISTS dpsql_internal._label_grid(dpsql.datasets, float8, float8, float8);

-- Issue 47: white-box audits. An audit's copy takes extra canary features (_audit_copy's pad)
-- and the argument check returns the method it picked.
DROP FUNCTION IF EXISTS dpsql_internal._audit_copy(dpsql.datasets, int, float8, float8);
DROP FUNCTION IF EXISTS dpsql_internal._audit_arguments(text, float8, float8, int, text, jsonb);
