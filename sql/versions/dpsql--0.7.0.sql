-- dpsql: in-database SGD (Bismarck-style epoch aggregate), training runs, models,
-- private releases (bolt-on, white-box, linear regression), datasets, roles and the ledger.
\echo Use "CREATE EXTENSION dpsql" to load this file. \quit

-- Training tables of runs in progress live here, out of analysts' reach.
CREATE SCHEMA IF NOT EXISTS dpsql_work;
-- The extension's internal functions (names starting with _): the dpsql schema holds the API.
CREATE SCHEMA IF NOT EXISTS dpsql_internal;

------------------------------------------------------------------------------------------
-- C functions (sql/src, cython_ext/core)
------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_transition(state float8[], x float8[], y float8, init float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_transition'
LANGUAGE C CALLED ON NULL INPUT PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_final(state float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_final'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_combine(a float8[], b float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_combine_states'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- One call = one SGD epoch over the scanned rows, in scan order. COMBINEFUNC averages the
-- models of parallel partial scans weighted by their row counts (opt-in model averaging).
CREATE OR REPLACE AGGREGATE dpsql.sgd_epoch(x float8[], y float8, init float8[]) (
    SFUNC = dpsql_internal._sgd_transition,
    STYPE = float8[],
    FINALFUNC = dpsql_internal._sgd_final,
    COMBINEFUNC = dpsql_internal._sgd_combine,
    PARALLEL = SAFE
);

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_init(model text, dim int, n_classes int, lambda float8,
                                schedule text, eta float8, step_offset float8, radius float8,
                                huber_h float8, batch_size bigint, flags int,
                                clip_norm float8 DEFAULT 0, noise text DEFAULT 'none',
                                noise_scale float8 DEFAULT 0, noise_divisor float8 DEFAULT 0,
                                steps_per_epoch bigint DEFAULT 0, noise_seed bigint DEFAULT NULL)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_init_state'
LANGUAGE C CALLED ON NULL INPUT VOLATILE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_info(state float8[], OUT step bigint, OUT rows bigint,
                                OUT objective float8, OUT dropped bigint, OUT clipped bigint,
                                OUT shards int)
AS 'MODULE_PATHNAME', 'dpsql_sgd_state_info'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_weights(state float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_state_weights'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._predict(loss int, flags int, coef float8[], x float8[])
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_predict_coef'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._loss_code(model text)
RETURNS int AS 'MODULE_PATHNAME', 'dpsql_loss_code'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql.loss_constants(model text, lambda float8 DEFAULT 0,
                                     radius float8 DEFAULT 0, huber_h float8 DEFAULT 0.1,
                                     OUT lipschitz float8, OUT lipschitz_data float8,
                                     OUT smoothness float8, OUT strong_convexity float8)
AS 'MODULE_PATHNAME', 'dpsql_loss_constants_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION dpsql.loss_constants(text, float8, float8, float8) IS
    'Lipschitz, smoothness and strong-convexity constants of one example''s loss for ||x|| <= 1';

CREATE OR REPLACE FUNCTION dpsql_internal._shuffle_key(seed bigint, pos bigint)
RETURNS bigint AS 'MODULE_PATHNAME', 'dpsql_shuffle_key_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._random_seed()
RETURNS bigint AS 'MODULE_PATHNAME', 'dpsql_random_seed'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._apply_bounds(x float8[], bounds float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_apply_bounds'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- A row as a model with preprocessing sees it: bounds, row transform, minus the centre
-- (cython_ext/core/prediction.h; Python's Model.predict uses it too).
CREATE OR REPLACE FUNCTION dpsql_internal._preprocess(x float8[], bounds float8[], row_flags int, centre float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_preprocess_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

-- A state flag bit of sgd.h by name (clip_rows, unit_rows, row_transform, intercept, sanitize).
CREATE OR REPLACE FUNCTION dpsql_internal._flag(name text)
RETURNS int AS 'MODULE_PATHNAME', 'dpsql_row_flag'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- The binary decision rule (cython_ext/core/prediction.h; Python's Model.predict uses it too).
CREATE OR REPLACE FUNCTION dpsql_internal._is_positive(loss int, raw float8)
RETURNS boolean AS 'MODULE_PATHNAME', 'dpsql_is_positive_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._bolton_release(state float8[], sensitivity float8, epsilon float8,
                                      delta float8, per_output boolean, calibration text,
                                      seed bigint, OUT weights float8[], OUT noise_scale float8)
AS 'MODULE_PATHNAME', 'dpsql_bolton_release'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

-- L2 sensitivity of the PSGD output: the closed forms of the C core (exact => the growth
-- recursion instead; paper_minibatch => the paper's unsound strongly convex mini-batch form).
CREATE OR REPLACE FUNCTION dpsql.bolton_sensitivity(schedule text, eta float8, step_offset float8,
                                         lipschitz float8, smoothness float8,
                                         strong_convexity float8, rows bigint, batch_size bigint,
                                         epochs int, fresh boolean DEFAULT false,
                                         exact boolean DEFAULT false,
                                         paper_minibatch boolean DEFAULT false)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_bolton_sensitivity_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._exponential_mechanism(utility float8[], epsilon float8, sensitivity float8,
                                             seed bigint)
RETURNS int AS 'MODULE_PATHNAME', 'dpsql_exponential_mechanism_sql'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_transition_batch(state float8[], x float8[], y float8, batch bigint,
                                            init float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_transition_batch'
LANGUAGE C CALLED ON NULL INPUT;

-- An epoch whose rows carry their batch number (Poisson sampling, sampling with replacement):
-- call it with ORDER BY batch. Sequential by nature: no combine function.
CREATE OR REPLACE AGGREGATE dpsql.sgd_epoch_batches(x float8[], y float8, batch bigint, init float8[]) (
    SFUNC = dpsql_internal._sgd_transition_batch,
    STYPE = float8[],
    FINALFUNC = dpsql_internal._sgd_final
);

CREATE OR REPLACE FUNCTION dpsql_internal._poisson_batches(seed bigint, rid bigint, steps int, q float8)
RETURNS int[] AS 'MODULE_PATHNAME', 'dpsql_poisson_batches'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- A sampled epoch without a sort (sampled_fmgr.c): the scan files each row by its rid, and
-- the final function replays the steps (Poisson or draws with replacement) from the epoch's
-- secret seed. Holds rows x (features + 1) doubles: _sampled_epoch_fits says whether the
-- table fits in dpsql.sampling_memory. Given a run and its training table, the filed rows stay
-- for the run's later epochs in the same transaction, which _sgd_epoch_replayed replays
-- without a scan (NULL when it does not hold them).
CREATE OR REPLACE FUNCTION dpsql_internal._sgd_sampled_transition(internal, x float8[], y float8, rid bigint,
                                              init float8[], sampling text, seed bigint,
                                              rows bigint, q float8, run bigint, relation oid)
RETURNS internal AS 'MODULE_PATHNAME', 'dpsql_sampled_transition'
LANGUAGE C CALLED ON NULL INPUT;

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_sampled_final(internal)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sampled_final'
LANGUAGE C CALLED ON NULL INPUT;

CREATE OR REPLACE AGGREGATE dpsql_internal._sgd_epoch_sampled(x float8[], y float8, rid bigint, init float8[],
                                                 sampling text, seed bigint, rows bigint,
                                                 q float8, run bigint, relation oid) (
    SFUNC = dpsql_internal._sgd_sampled_transition,
    STYPE = internal,
    FINALFUNC = dpsql_internal._sgd_sampled_final,
    FINALFUNC_MODIFY = READ_WRITE
);

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_epoch_replayed(init float8[], run bigint, relation oid,
                                          sampling text, seed bigint, rows bigint, q float8)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sampled_replayed'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

CREATE OR REPLACE FUNCTION dpsql_internal._sampled_epoch_fits(state float8[], rows bigint)
RETURNS boolean AS 'MODULE_PATHNAME', 'dpsql_sampled_fits'
LANGUAGE C STRICT STABLE PARALLEL SAFE;

-- The members (step, rid) of a sampled epoch's steps, in the order the replay visits them.
CREATE OR REPLACE FUNCTION dpsql_internal._sampled_members(sampling text, seed bigint, rows bigint, steps int,
                                       q float8, batch bigint)
RETURNS TABLE (step int, rid bigint) AS 'MODULE_PATHNAME', 'dpsql_sampled_members'
LANGUAGE C STRICT IMMUTABLE ROWS 1000;

CREATE OR REPLACE FUNCTION dpsql_internal._uniform_index(seed bigint, pos bigint, rows bigint)
RETURNS bigint AS 'MODULE_PATHNAME', 'dpsql_uniform_index'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql.gaussian_sigma(sensitivity float8, epsilon float8, delta float8,
                                     calibration text DEFAULT 'analytic')
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_gaussian_sigma_sql'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION dpsql.gaussian_sigma(float8, float8, float8, text) IS
    'Gaussian noise for (epsilon, delta): analytic (Balle-Wang) or classic (eq. 4, epsilon < 1)';

CREATE OR REPLACE FUNCTION dpsql_internal._accountant(request text)
RETURNS text AS 'MODULE_PATHNAME', 'dpsql_accountant'
LANGUAGE C STRICT VOLATILE;
------------------------------------------------------------------------------------------
-- Tables
------------------------------------------------------------------------------------------

-- Every trained model; analysts read it through the filtered view dpsql.models (29_views.sql).
CREATE TABLE IF NOT EXISTS dpsql.model_store (
    model_id        bigserial PRIMARY KEY,
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      name NOT NULL DEFAULT current_user,
    source          text NOT NULL,
    features        text[] NOT NULL,
    label           text NOT NULL,
    model           text NOT NULL,          -- logistic | linear | huber | multinomial
    classes         float8[],               -- binary: {negative, positive}; multinomial: classes
    n_features      int NOT NULL,
    fit_intercept   boolean NOT NULL,
    coef            float8[] NOT NULL,      -- 1-D, or classes x features for multinomial
    intercept       float8[],               -- one per output when fit_intercept
    weights         float8[] NOT NULL,      -- coef with the intercept column, as trained
    flags           int NOT NULL,           -- row transform flags of the C core
    epochs          int NOT NULL,           -- requested
    epochs_run      int NOT NULL,           -- fewer when the tolerance stopped training
    batch_size      bigint NOT NULL,
    lambda          float8 NOT NULL,
    schedule        text NOT NULL,
    step_size       float8,
    step_offset     float8 NOT NULL,
    radius          float8,
    huber_h         float8,
    row_norm        text NOT NULL,
    shuffle         boolean NOT NULL,
    seed            bigint,
    seed_policy     text,                   -- user | random (pg_strong_random) | none
    rows            bigint NOT NULL,
    dropped_rows    bigint NOT NULL,        -- rows of partial last batches (drop_last), last epoch
    clipped_rows    bigint,                 -- rows scaled down by the row transform, last epoch
                                            -- (NULL for private models: data-dependent)
    train_loss      float8,                 -- objective of the last epoch (NULL when private)
    loss_history    float8[] NOT NULL,      -- empty for private models
    prepare_seconds float8 NOT NULL,
    train_seconds   float8 NOT NULL,
    privacy         text NOT NULL DEFAULT 'none',
    dataset_id      bigint,                 -- the registered dataset a private model charged
    epsilon         float8,
    delta           float8,
    sensitivity     float8,                 -- L2 sensitivity of the released model
    noise_scale     float8,                 -- Gamma scale sensitivity/epsilon, or Gaussian sigma
    params          jsonb NOT NULL          -- every argument of the run, for reproduction
);
COMMENT ON TABLE dpsql.model_store IS 'Trained models with their hyperparameters and provenance';

-- Runs in progress: their noiseless state never leaves this table.
CREATE TABLE IF NOT EXISTS dpsql.runs (
    run_id          bigserial PRIMARY KEY,
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      name NOT NULL DEFAULT current_user,
    spec            jsonb NOT NULL,
    train_table     text NOT NULL,
    state           float8[] NOT NULL,
    rows            bigint NOT NULL,
    epochs_done     int NOT NULL DEFAULT 0,
    losses          float8[] NOT NULL DEFAULT '{}',
    done            boolean NOT NULL DEFAULT false,
    prepare_seconds float8 NOT NULL,
    train_seconds   float8 NOT NULL DEFAULT 0,
    sampling_seed   bigint          -- secret coins of sampled batches: never copied to a model
);
------------------------------------------------------------------------------------------
-- Preparing sources
------------------------------------------------------------------------------------------

-- ERROR "dpsql: message" with SQLSTATE code and the hint when not empty; no CONTEXT (the
-- caller's frames only repeat the call: sql/src/errors_fmgr.c).
CREATE OR REPLACE FUNCTION dpsql_internal._fail(message text, code text DEFAULT '22023', hint text DEFAULT NULL)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_fail_sql'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

-- The relation a source names, or NULL (a query, or no such relation): a query is no valid
-- name, so to_regclass refuses it.
CREATE OR REPLACE FUNCTION dpsql_internal._source_regclass(source text)
RETURNS regclass LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN to_regclass(regexp_replace(source, ';\s*$', ''));
EXCEPTION WHEN OTHERS THEN
    RETURN NULL;
END $$;

-- FROM-clause text of a source: a table or view name (resolved, safely quoted) or a query.
CREATE OR REPLACE FUNCTION dpsql_internal._source_sql(source text)
RETURNS text LANGUAGE plpgsql STABLE
AS $$
DECLARE
    rel regclass;
    q text := regexp_replace(coalesce(source, ''), ';\s*$', '');
BEGIN
    IF btrim(q) = '' THEN
        PERFORM dpsql_internal._fail('source is empty');
    END IF;
    IF q ~* '^\s*(\(|select\s|with\s|values\s|table\s)' THEN
        RETURN '(' || q || ') AS src';
    END IF;
    rel := dpsql_internal._source_regclass(q);
    IF rel IS NULL THEN
        PERFORM dpsql_internal._fail(format('relation %s does not exist', quote_literal(q)), '42P01',
                            'Give a table or view name (schema-qualified if needed) or a SELECT query.');
    END IF;
    RETURN rel::text || ' AS src';
END $$;

-- SQL expression of the feature vector, and its dimension: declared (registered datasets: the
-- column types and dim are known, no row is read), else probed on the first row.
-- Public feature bounds (d x 2), when given, clip and rescale each feature onto [-1, 1].
CREATE OR REPLACE FUNCTION dpsql_internal._feature_sql(src text, features text[], bounds float8[] DEFAULT NULL,
                                   feature_types text[] DEFAULT NULL, declared_dim int DEFAULT NULL,
                                   OUT expr text, OUT dim int)
LANGUAGE plpgsql AS $$
DECLARE
    types text[] := feature_types;
    bad int;
BEGIN
    IF features IS NULL OR cardinality(features) = 0 OR array_ndims(features) <> 1
       OR array_position(features, NULL) IS NOT NULL THEN
        PERFORM dpsql_internal._fail('features must be a non-empty list of column names');
    END IF;
    IF types IS NULL THEN
        -- pg_typeof of a scalar subquery gives the column's type even when no row is read; an
        -- unknown column raises undefined_column here.
        SELECT 'SELECT ARRAY[' || string_agg(format('pg_typeof((SELECT %I FROM %s LIMIT 1))::text', f, src),
                                            ', ' ORDER BY i) || ']'
          INTO expr FROM unnest(features) WITH ORDINALITY AS t(f, i);
        EXECUTE expr INTO types;
    END IF;
    IF cardinality(features) = 1 AND types[1] LIKE '%[]' THEN
        IF types[1] NOT IN ('double precision[]', 'real[]', 'integer[]', 'bigint[]', 'smallint[]',
                            'numeric[]') THEN
            PERFORM dpsql_internal._fail(format('feature column %I has type %s, not a numeric array',
                                       features[1], types[1]), '42804');
        END IF;
        expr := format('%I::float8[]', features[1]);
        IF bounds IS NOT NULL THEN
            -- The declared dimension: no row is read to learn it.
            expr := format('dpsql_internal._apply_bounds(%s, %L::float8[])', expr, bounds::text);
            dim := array_length(bounds, 1);
            RETURN;
        END IF;
        IF declared_dim IS NOT NULL THEN
            dim := declared_dim;
            RETURN;
        END IF;
        EXECUTE format('SELECT array_length(%s, 1) FROM %s LIMIT 1', expr, src) INTO dim;
        IF dim IS NULL THEN
            PERFORM dpsql_internal._fail(format('the feature array column %I is NULL or empty in the first row',
                                       features[1]));
        END IF;
        RETURN;
    END IF;
    SELECT min(i) INTO bad FROM unnest(types) WITH ORDINALITY AS t(ty, i)
     WHERE ty NOT IN ('double precision', 'real', 'integer', 'bigint', 'smallint', 'numeric');
    IF bad IS NOT NULL THEN
        PERFORM dpsql_internal._fail(format('feature column %I has type %s: give several numeric columns or '
                                   'one float8[] column', features[bad], types[bad]), '42804');
    END IF;
    SELECT 'ARRAY[' || string_agg(format('%I::float8', f), ', ' ORDER BY i) || ']'
      INTO expr FROM unnest(features) WITH ORDINALITY AS t(f, i);
    dim := cardinality(features);
    IF bounds IS NOT NULL THEN
        IF array_length(bounds, 1) <> dim THEN
            PERFORM dpsql_internal._fail(format('%s feature bounds for %s features', array_length(bounds, 1), dim));
        END IF;
        expr := format('dpsql_internal._apply_bounds(%s, %L::float8[])', expr, bounds::text);
    END IF;
END $$;

-- SQL expression of the training label: +-1 for binary models, a class index for multinomial
-- The error of a label outside the declared set. IMMUTABLE (it is only ever called with the
-- row's value, so never folded at plan time) so that Citus pushes the fill down to the shards.
CREATE OR REPLACE FUNCTION dpsql_internal._bad_label(value text, labels text)
RETURNS float8 LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RAISE EXCEPTION 'dpsql: label % is not in the declared label set %', value, labels
        USING ERRCODE = 'invalid_parameter_value';
END $$;

-- and one-vs-rest (3 or more labels). strict => false (private runs): a label outside the set is
-- NULL, which the aggregate turns into a null record instead of an error revealing the value.
CREATE OR REPLACE FUNCTION dpsql_internal._label_sql(model text, label text, labels float8[], strict boolean DEFAULT true)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    bad text := 'NULL::float8';
BEGIN
    IF label IS NULL THEN
        PERFORM dpsql_internal._fail('label must name a column');
    END IF;
    IF strict THEN
        bad := format('dpsql_internal._bad_label(coalesce(%I::text, ''NULL''), %L)', label,
                      coalesce(labels::text, '(any number)'));
    END IF;
    IF model = 'linear' THEN
        RETURN format('coalesce(%I::float8, %s)', label, bad);
    ELSIF model = 'multinomial' OR cardinality(labels) > 2 THEN
        RETURN format('coalesce((array_position(%L::float8[], %I::float8) - 1)::float8, %s)',
                      labels::text, label, bad);
    END IF;
    RETURN format('CASE %I::float8 WHEN %s THEN -1::float8 WHEN %s THEN 1::float8 ELSE %s END',
                  label, labels[1], labels[2], bad);
END $$;

-- The canonical name of a model (aliases accepted by the C core's loss names).
CREATE OR REPLACE FUNCTION dpsql_internal._canonical_model(model text)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT (ARRAY['logistic', 'linear', 'huber', 'multinomial'])[dpsql_internal._loss_code(model)]
$$;

-- Canonical model name and checked public label set.
CREATE OR REPLACE FUNCTION dpsql_internal._check_labels(model text, labels float8[], OUT canonical text, OUT checked float8[])
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    canonical := dpsql_internal._canonical_model(model);
    IF canonical = 'linear' THEN
        IF labels IS NOT NULL THEN
            PERFORM dpsql_internal._fail('labels apply to classification models only');
        END IF;
        RETURN;
    END IF;
    IF canonical IN ('logistic', 'huber') THEN
        -- Two labels: one binary model; three or more: one-vs-rest, one binary model per class.
        checked := coalesce(labels, '{-1,1}');
        IF cardinality(checked) < 2 OR cardinality(checked) > 1024 THEN
            PERFORM dpsql_internal._fail(format('%s models need labels => {negative, positive} (or 3 to 1024 '
                                       'classes for one-vs-rest), got %s', canonical, checked));
        END IF;
    ELSIF labels IS NULL THEN
        PERFORM dpsql_internal._fail('multinomial models need labels => the public list of classes');
    ELSE
        checked := labels;
        IF cardinality(checked) < 2 OR cardinality(checked) > 1024 THEN
            PERFORM dpsql_internal._fail('multinomial models need 2 to 1024 classes');
        END IF;
    END IF;
    IF array_ndims(checked) <> 1
       OR EXISTS (SELECT 1 FROM unnest(checked) v WHERE v IS NULL OR v IN ('NaN', 'Infinity', '-Infinity'))
       OR (SELECT count(DISTINCT v) FROM unnest(checked) v) <> cardinality(checked) THEN
        PERFORM dpsql_internal._fail(format('labels must be distinct finite numbers, got %s', checked));
    END IF;
END $$;
------------------------------------------------------------------------------------------
-- Roles (docs/privacy.md): data owners (dpsql_admin), analysts (dpsql_analyst) and the reader
-- that private runs read registered tables as (dpsql_reader).
------------------------------------------------------------------------------------------

-- Group roles. Roles are cluster-wide: create them only when missing (another database may have
-- the extension already); DROP EXTENSION keeps them. Members are login roles of the DBA's.
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['dpsql_admin', 'dpsql_analyst'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- created concurrently from another database
            END;
        END IF;
    END LOOP;
    -- Private training reads registered data as this role, never as a superuser (see
    -- dpsql_internal._read_source): it holds SELECT on the registered columns only, and reads every row
    -- of them whatever the row-level policies (as the extension owner did before 0.3.0).
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'dpsql_reader') THEN
        BEGIN
            CREATE ROLE dpsql_reader NOLOGIN BYPASSRLS;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
END $$;
------------------------------------------------------------------------------------------
-- Registered datasets (docs/privacy.md)
--
-- A data owner (dpsql_admin) registers a table with its public declarations (features, label
-- set, feature bounds, row normalisation) and an (epsilon, delta) budget, and grants it to
-- analysts (dpsql_analyst). Every private release is charged to the append-only ledger under a
-- row lock on the dataset, so concurrent trainings can never overspend.
--
-- Functions that run with the extension owner's rights (SECURITY DEFINER), and every function
-- here, pin search_path = pg_catalog, pg_temp: the caller's schemas never shadow a built-in.
-- Identity checks use session_user (the login role): inside a SECURITY DEFINER function
-- current_user is the extension owner.
------------------------------------------------------------------------------------------

CREATE TABLE IF NOT EXISTS dpsql.datasets (
    dataset_id      bigserial PRIMARY KEY,
    name            text NOT NULL UNIQUE,
    relid           regclass NOT NULL,          -- one live dataset (budget) per relation
    source          text NOT NULL,              -- schema-qualified, quoted name at registration
    features        text[] NOT NULL,            -- numeric columns, or one numeric array column
    label           text NOT NULL,
    labels          float8[] DEFAULT '{-1,1}',  -- the public label set (NULL: regression)
    feature_bounds  float8[],                   -- NULL or d x 2: public (lo, hi) per feature
    row_norm        text NOT NULL DEFAULT 'clip' CHECK (row_norm IN ('clip', 'unit', 'none')),
    epsilon_budget  float8 NOT NULL CHECK (epsilon_budget > 0 AND epsilon_budget < 'Infinity'),
    delta_budget    float8 NOT NULL DEFAULT 0 CHECK (delta_budget >= 0 AND delta_budget < 1),
    charges         bigint NOT NULL DEFAULT 0,  -- ledger entries; bumped under the row lock
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      name NOT NULL DEFAULT session_user,
    dropped_at      timestamptz,                -- the relation was dropped (event trigger)
    label_bound     float8,                     -- regression: public bound on |y| (NULL with
                                                -- labels NULL: not set yet, see
                                                -- dpsql.estimate_label_bound; untrainable)
    row_bound       float8,                     -- regression: public bound on ||x|| (or NULL)
    dim             int CHECK (dim > 0)         -- public number of features (NULL: registered
                                                -- before 0.3.0 from an empty array column)
);
CREATE UNIQUE INDEX IF NOT EXISTS datasets_live_relid_idx ON dpsql.datasets (relid) WHERE dropped_at IS NULL;
COMMENT ON TABLE dpsql.datasets IS
    'Registered datasets: public declarations of the data owner and the (epsilon, delta) budget';

CREATE TABLE IF NOT EXISTS dpsql.dataset_grants (
    dataset_id      bigint NOT NULL REFERENCES dpsql.datasets ON DELETE CASCADE,
    role            name NOT NULL,
    granted_at      timestamptz NOT NULL DEFAULT now(),
    granted_by      name NOT NULL DEFAULT session_user,
    PRIMARY KEY (dataset_id, role)
);
COMMENT ON TABLE dpsql.dataset_grants IS 'Roles (and their members) allowed to train on a dataset';

------------------------------------------------------------------------------------------
-- Who may do what
------------------------------------------------------------------------------------------

-- Whether the login role is a superuser or a data owner (member of dpsql_admin).
CREATE OR REPLACE FUNCTION dpsql_internal._is_admin()
RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce((SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = session_user), false)
           OR pg_has_role(session_user, 'dpsql_admin', 'MEMBER')
$$;

CREATE OR REPLACE FUNCTION dpsql_internal._require_admin(action text)
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT dpsql_internal._is_admin() THEN
        RAISE EXCEPTION 'dpsql: only a data owner (member of dpsql_admin) or a superuser can %',
                        action
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('Role %s is not a member of dpsql_admin.', session_user);
    END IF;
END $$;

-- Whether the login role may train on a dataset: superuser, data owner, or member of a role
-- the dataset is granted to. False for an unknown dataset.
CREATE OR REPLACE FUNCTION dpsql_internal._can_use_dataset(dataset_id bigint)
RETURNS boolean LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM dpsql.datasets d WHERE d.dataset_id = $1)
           AND (dpsql_internal._is_admin()
                OR EXISTS (SELECT 1
                             FROM dpsql.dataset_grants g
                             JOIN pg_roles r ON r.rolname = g.role  -- roles dropped since: ignored
                            WHERE g.dataset_id = $1
                              AND pg_has_role(session_user, r.oid, 'MEMBER')))
$$;

------------------------------------------------------------------------------------------
-- Registering datasets
------------------------------------------------------------------------------------------

-- 'scalar' for a numeric type, 'array' for a numeric array type, NULL otherwise (domains are
-- unwrapped).
CREATE OR REPLACE FUNCTION dpsql_internal._numeric_kind(typ oid)
RETURNS text LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t oid := typ;
    base oid;
BEGIN
    LOOP
        SELECT CASE WHEN ty.typtype = 'd' THEN ty.typbasetype END INTO base
          FROM pg_type ty WHERE ty.oid = t;
        EXIT WHEN base IS NULL;
        t := base;
    END LOOP;
    IF t::regtype IN ('float8'::regtype, 'float4'::regtype, 'int2'::regtype, 'int4'::regtype,
                      'int8'::regtype, 'numeric'::regtype) THEN
        RETURN 'scalar';
    ELSIF t::regtype IN ('float8[]'::regtype, 'float4[]'::regtype, 'int2[]'::regtype,
                         'int4[]'::regtype, 'int8[]'::regtype, 'numeric[]'::regtype) THEN
        RETURN 'array';
    END IF;
    RETURN NULL;
END $$;

-- Checks that a relation may be read by the private training path, which reads it with the
-- extension owner's rights. Tables, partitioned tables and materialized views run no code of
-- their owner's when read; views and foreign tables do (functions in the view, the owner's
-- user mappings), so they must be owned by a superuser. Returns (schema, name, owner).
CREATE OR REPLACE FUNCTION dpsql_internal._check_dataset_relation(relid regclass, what text,
                                              OUT nspname name, OUT relname name,
                                              OUT owner_is_superuser boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    kind "char";
    persistence "char";
BEGIN
    SELECT n.nspname, c.relname, c.relkind, c.relpersistence, o.rolsuper
      INTO nspname, relname, kind, persistence, owner_is_superuser
      FROM pg_class c
      JOIN pg_namespace n ON n.oid = c.relnamespace
      JOIN pg_roles o ON o.oid = c.relowner
     WHERE c.oid = relid;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'dpsql: the relation of % no longer exists', what
            USING ERRCODE = 'undefined_table';
    END IF;
    IF kind NOT IN ('r', 'p', 'm', 'v', 'f') THEN
        RAISE EXCEPTION 'dpsql: % is not a table or view', what USING ERRCODE = 'wrong_object_type';
    END IF;
    IF persistence = 't' THEN
        RAISE EXCEPTION 'dpsql: % is a temporary table', what USING ERRCODE = 'wrong_object_type';
    END IF;
    IF nspname IN ('dpsql', 'dpsql_work', 'pg_catalog', 'information_schema') THEN
        RAISE EXCEPTION 'dpsql: % is a system relation, not a dataset', what
            USING ERRCODE = 'wrong_object_type';
    END IF;
    IF kind IN ('v', 'f') AND NOT owner_is_superuser THEN
        RAISE EXCEPTION 'dpsql: % is a % owned by a non-superuser', what,
                        CASE kind WHEN 'v' THEN 'view' ELSE 'foreign table' END
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Private training reads datasets with the extension owner''s rights: '
                         'register a table or materialized view, or have a superuser own the view.';
    END IF;
END $$;

-- The registered columns: they exist, are numeric (or one numeric array) and readable by the
-- data owner; returns the public dimension (the columns, or the array's declared length).
CREATE OR REPLACE FUNCTION dpsql_internal._register_columns(relid regclass, what text,
                                                           features text[], label text,
                                                           dim int, feature_bounds float8[])
RETURNS int LANGUAGE plpgsql STABLE AS $$
DECLARE
    col text;
    att record;
    kinds text[] := '{}';
    d int;
BEGIN
    IF features IS NULL OR cardinality(features) = 0 OR array_ndims(features) <> 1
       OR array_position(features, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'dpsql: features must be a non-empty list of column names'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (SELECT count(DISTINCT f) FROM unnest(features) f) <> cardinality(features) THEN
        RAISE EXCEPTION 'dpsql: features must be distinct, got %', features
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF label IS NULL THEN
        RAISE EXCEPTION 'dpsql: label must name a column' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF label = ANY (features) THEN
        RAISE EXCEPTION 'dpsql: the label column % is also a feature', quote_ident(label)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOREACH col IN ARRAY features || label LOOP
        SELECT a.attnum, dpsql_internal._numeric_kind(a.atttypid) AS kind,
               format_type(a.atttypid, a.atttypmod) AS type
          INTO att FROM pg_attribute a
         WHERE a.attrelid = relid AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'dpsql: column % does not exist in %', quote_ident(col), what
                USING ERRCODE = 'undefined_column';
        END IF;
        IF NOT has_column_privilege(session_user, relid, att.attnum, 'SELECT') THEN
            RAISE EXCEPTION 'dpsql: role % cannot read column % of %', session_user,
                            quote_ident(col), what
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'A data owner registers only data they can read themselves.';
        END IF;
        kinds := kinds || att.kind;
        IF col = label AND att.kind IS DISTINCT FROM 'scalar' THEN
            RAISE EXCEPTION 'dpsql: label column % has type %, not a number', quote_ident(col), att.type
                USING ERRCODE = 'datatype_mismatch';
        ELSIF col <> label AND (att.kind IS NULL
                                OR (att.kind = 'array' AND cardinality(features) > 1)) THEN
            RAISE EXCEPTION 'dpsql: feature column % has type %: give numeric columns or one '
                            'numeric array column', quote_ident(col), att.type
                USING ERRCODE = 'datatype_mismatch';
        END IF;
    END LOOP;
    -- The public dimension: the columns, or the array column's declared length (the bounds'
    -- rows, or dim; register_dataset reads one row as the data owner when neither is given).
    d := CASE WHEN kinds[1] = 'array' THEN coalesce(array_length(feature_bounds, 1), dim)
              ELSE cardinality(features) END;
    IF d IS NULL OR d < 1 OR d > 100000 OR (dim IS NOT NULL AND dim <> d) THEN
        RAISE EXCEPTION 'dpsql: the dataset''s dimension must be declared: % features, dim => %',
                        coalesce(d::text, 'unknown'), coalesce(dim::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Give dim => the length of the feature array (1 to 100000), or feature_bounds.';
    END IF;
    RETURN d;
END $$;

-- Public feature bounds: d x 2, finite, lo < hi; returned with lower bounds 1.
CREATE OR REPLACE FUNCTION dpsql_internal._register_feature_bounds(feature_bounds float8[], d int)
RETURNS float8[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    bounds float8[];
    lo2 int;
BEGIN
    IF feature_bounds IS NOT NULL THEN
        IF array_ndims(feature_bounds) IS DISTINCT FROM 2
           OR array_length(feature_bounds, 2) <> 2
           OR (d IS NOT NULL AND array_length(feature_bounds, 1) <> d) THEN
            RAISE EXCEPTION 'dpsql: feature_bounds must be a % x 2 array of (lo, hi), got %',
                            coalesce(d::text, 'd'), feature_bounds
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        lo2 := array_lower(feature_bounds, 2);
        SELECT array_agg(ARRAY[feature_bounds[i][lo2], feature_bounds[i][lo2 + 1]] ORDER BY i)
          INTO bounds FROM generate_subscripts(feature_bounds, 1) i;
        IF EXISTS (SELECT 1 FROM generate_subscripts(bounds, 1) i
                    WHERE NOT (bounds[i][1] > '-Infinity' AND bounds[i][2] < 'Infinity'
                               AND bounds[i][1] < bounds[i][2])
                       OR bounds[i][1] IS NULL OR bounds[i][2] IS NULL) THEN
            RAISE EXCEPTION 'dpsql: feature_bounds must be finite with lo < hi in every row, got %',
                            feature_bounds
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    RETURN bounds;
END $$;

-- What a dataset predicts: a public label set (classification) or a public bound on |y|
-- (regression: given, estimated now with estimate => {"label_bound": ...}, or later with
-- regression => true), and the row normalisation and row bound that go with it.
CREATE OR REPLACE FUNCTION dpsql_internal._register_target(
    labels float8[], label_bound float8, row_bound float8, row_norm text, regression boolean,
    estimate jsonb, feature_bounds float8[], bounded_dim int,
    OUT is_regression boolean, OUT checked_labels float8[], OUT checked_row_norm text,
    OUT checked_row_bound float8)
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    is_regression := coalesce(regression,
                              label_bound IS NOT NULL OR coalesce(estimate ? 'label_bound', false));
    IF NOT is_regression AND (label_bound IS NOT NULL OR estimate ? 'label_bound') THEN
        RAISE EXCEPTION 'dpsql: a label bound is for regression datasets, and regression => false'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF label_bound IS NOT NULL AND estimate ? 'label_bound' THEN
        RAISE EXCEPTION 'dpsql: give label_bound or estimate it (estimate => {"label_bound": ...}), not both'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF feature_bounds IS NOT NULL AND estimate ? 'feature_bounds' THEN
        RAISE EXCEPTION 'dpsql: give feature_bounds or estimate them (estimate => {"feature_bounds": ...}), not both'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF is_regression THEN
        IF label_bound IS NOT NULL AND NOT (label_bound > 0 AND label_bound < 'Infinity') THEN
            RAISE EXCEPTION 'dpsql: label_bound must be a finite number > 0, got %', label_bound
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF labels IS NOT NULL THEN
            RAISE EXCEPTION 'dpsql: give labels (classification) or a label bound (regression), not both'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    ELSE
        labels := coalesce(labels, '{-1,1}');
    END IF;
    IF row_bound IS NOT NULL AND (NOT is_regression OR NOT (row_bound > 0 AND row_bound < 'Infinity')) THEN
        RAISE EXCEPTION 'dpsql: row_bound (a public bound on ||x||) is for regression datasets and must be a finite number > 0, got %',
                        row_bound
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The public label set.
    IF NOT is_regression AND (labels IS NULL OR array_ndims(labels) <> 1 OR cardinality(labels) < 2
       OR cardinality(labels) > 1024) THEN
        RAISE EXCEPTION 'dpsql: labels must list 2 to 1024 public label values, got %',
                        coalesce(labels::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(labels) v
                WHERE v IS NULL OR v IN ('NaN', 'Infinity', '-Infinity'))
       OR (SELECT count(DISTINCT v) FROM unnest(labels) v) <> cardinality(labels) THEN
        RAISE EXCEPTION 'dpsql: labels must be distinct finite numbers, got %', labels
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    row_norm := coalesce(row_norm, CASE WHEN is_regression THEN 'none' ELSE 'clip' END);
    IF NOT is_regression AND row_norm NOT IN ('clip', 'unit') THEN
        RAISE EXCEPTION 'dpsql: row_norm must be clip or unit, got %', row_norm
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'clip scales rows to norm <= 1, unit to norm = 1.';
    END IF;
    IF is_regression AND row_norm NOT IN ('none', 'clip') THEN
        RAISE EXCEPTION 'dpsql: row_norm of a regression dataset must be none or clip, got %', row_norm
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'clip scales rows to norm <= 1 (row_bound 1); none keeps them (row_bound, if given, clips).';
    END IF;
    IF is_regression THEN
        row_bound := dpsql_internal._regression_row_bound(row_norm, row_bound, bounded_dim);
    END IF;
    checked_labels := CASE WHEN NOT is_regression THEN labels END;
    checked_row_norm := row_norm;
    checked_row_bound := row_bound;
END $$;

-- The registration itself. Admin-only; nothing is written unless every check passes.
CREATE OR REPLACE FUNCTION dpsql_internal._register_dataset(
    relid regclass, features text[], label text, epsilon_budget float8,
    delta_budget float8 DEFAULT 0, labels float8[] DEFAULT NULL,
    feature_bounds float8[] DEFAULT NULL, row_norm text DEFAULT NULL, name text DEFAULT NULL,
    source_text text DEFAULT NULL, label_bound float8 DEFAULT NULL, row_bound float8 DEFAULT NULL,
    dim int DEFAULT NULL, regression boolean DEFAULT NULL, estimate jsonb DEFAULT NULL,
    composition text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    what text;
    rel record;
    nm text;
    privileged boolean;
    d int;
    bounds float8[];
    target record;
    existing text;
    id bigint;
BEGIN
    PERFORM dpsql_internal._require_admin('register datasets');
    IF relid IS NULL THEN
        RAISE EXCEPTION 'dpsql: relation % does not exist',
                        coalesce(quote_literal(source_text), 'NULL')
            USING ERRCODE = 'undefined_table',
                  HINT = 'Give a table name (schema-qualified if needed).';
    END IF;
    what := format('relation %s', quote_literal(coalesce(source_text, relid::oid::text)));
    rel := dpsql_internal._check_dataset_relation(relid, what);
    what := format('%I.%I', rel.nspname, rel.relname);
    SELECT r.rolsuper OR r.rolbypassrls INTO privileged
      FROM pg_roles r WHERE r.rolname = session_user;
    IF NOT privileged AND EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = relid AND c.relrowsecurity) THEN
        RAISE EXCEPTION 'dpsql: % has row-level security; only a superuser can register it', what
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Private training reads every row, whatever the policies.';
    END IF;

    d := dpsql_internal._register_columns(relid, what, features, label, dim, feature_bounds);
    bounds := dpsql_internal._register_feature_bounds(feature_bounds, d);
    PERFORM dpsql_internal._check_estimate_option(estimate);
    target := dpsql_internal._register_target(labels, label_bound, row_bound, row_norm, regression,
                                              estimate, feature_bounds,
                                              CASE WHEN bounds IS NOT NULL THEN d END);
    IF epsilon_budget IS NULL OR NOT (epsilon_budget > 0 AND epsilon_budget < 'Infinity') THEN
        RAISE EXCEPTION 'dpsql: epsilon_budget must be a finite number > 0, got %',
                        coalesce(epsilon_budget::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF delta_budget IS NULL OR NOT (delta_budget >= 0 AND delta_budget < 1) THEN
        RAISE EXCEPTION 'dpsql: delta_budget must be in [0, 1), got %',
                        coalesce(delta_budget::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- How releases are held against the budget (28_ledger.sql); NULL: the default, 'sum'.
    IF composition IS NOT NULL AND composition NOT IN ('sum', 'pld') THEN
        RAISE EXCEPTION 'dpsql: composition must be sum or pld, got %', quote_literal(composition)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pld: charged by the PLD composition of the releases (docs/privacy.md).';
    END IF;

    nm := coalesce(_register_dataset.name, rel.relname);
    IF btrim(nm) = '' THEN
        RAISE EXCEPTION 'dpsql: the dataset name must not be empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT ds.name INTO existing FROM dpsql.datasets ds
     WHERE ds.relid = _register_dataset.relid AND ds.dropped_at IS NULL;
    IF FOUND THEN
        RAISE EXCEPTION 'dpsql: % is already registered as dataset %', what, quote_literal(existing)
            USING ERRCODE = 'duplicate_object',
                  HINT = 'A relation has one budget; use the registered dataset.';
    END IF;
    IF EXISTS (SELECT 1 FROM dpsql.datasets ds WHERE ds.name = nm) THEN
        RAISE EXCEPTION 'dpsql: a dataset named % is already registered', quote_literal(nm)
            USING ERRCODE = 'duplicate_object', HINT = 'Choose another name => ...';
    END IF;

    INSERT INTO dpsql.datasets (name, relid, source, features, label, labels, feature_bounds,
                                row_norm, epsilon_budget, delta_budget, label_bound, row_bound,
                                dim, composition)
    VALUES (nm, relid, what, features, label, target.checked_labels, bounds,
            target.checked_row_norm, epsilon_budget, delta_budget, label_bound,
            target.checked_row_bound, d, coalesce(_register_dataset.composition, 'sum'))
    RETURNING dataset_id INTO id;
    PERFORM dpsql_internal._grant_reader(relid, features || label);
    -- Private bounds in the same transaction: an estimate that fails (budget, range, no rows)
    -- undoes the registration, and with it every charge (27_estimate_bounds.sql).
    PERFORM dpsql_internal._estimate_at_registration(nm, estimate);
    RETURN id;
END $$;

-- The tightest public bound on ||x|| a regression dataset's declarations imply: clipped rows
-- have norm <= 1; features with bounds (bounded_dim of them) are rescaled onto [-1, 1].
CREATE OR REPLACE FUNCTION dpsql_internal._regression_row_bound(row_norm text, row_bound float8, bounded_dim int)
RETURNS float8 LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN row_norm = 'clip' THEN least(coalesce(row_bound, 1), 1)
                WHEN row_bound IS NOT NULL THEN row_bound
                WHEN bounded_dim IS NOT NULL THEN sqrt(bounded_dim) END
$$;

-- Admin entry point. SECURITY INVOKER: it resolves source with the caller's search_path and
-- rights (nothing else runs under the caller's search_path: everything is schema-qualified),
-- then hands the resolved relation to the SECURITY DEFINER _register_dataset.
CREATE OR REPLACE FUNCTION dpsql.register_dataset(
    source text, features text[], label text, epsilon_budget float8,
    delta_budget float8 DEFAULT 0, labels float8[] DEFAULT NULL,
    feature_bounds float8[] DEFAULT NULL, row_norm text DEFAULT NULL, name text DEFAULT NULL,
    label_bound float8 DEFAULT NULL, row_bound float8 DEFAULT NULL, dim int DEFAULT NULL,
    regression boolean DEFAULT NULL, estimate jsonb DEFAULT NULL, composition text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    rel regclass;
BEGIN
    BEGIN
        rel := pg_catalog.to_regclass(source);
    EXCEPTION WHEN OTHERS THEN  -- invalid name syntax: reported as "does not exist"
        rel := NULL;
    END;
    IF rel IS NOT NULL AND dim IS NULL AND feature_bounds IS NULL AND cardinality(features) = 1
       AND pg_catalog.has_table_privilege(rel, 'SELECT') THEN
        -- One array column of undeclared length: the data owner's first row declares it (as
        -- the owner, who may read it; the dimension is public from now on).
        BEGIN
            EXECUTE format('SELECT pg_catalog.array_length(%I, 1) FROM %s WHERE %I IS NOT NULL LIMIT 1',
                           features[1], rel, features[1]) INTO dim;
        EXCEPTION WHEN OTHERS THEN
            dim := NULL;  -- not a readable array column: _register_dataset says what is wrong
        END;
    END IF;
    RETURN dpsql_internal._register_dataset(rel, features, label, epsilon_budget, delta_budget, labels,
                                   feature_bounds, row_norm, name, source, label_bound,
                                   row_bound, dim, regression, estimate, composition);
END $$;
COMMENT ON FUNCTION dpsql.register_dataset(text, text[], text, float8, float8, float8[], float8[],
                                           text, text, float8, float8, int, boolean, jsonb, text) IS
    'Register a table for private training with its public declarations and (epsilon, delta) budget';

CREATE OR REPLACE FUNCTION dpsql_internal._dataset_by_id(dataset_id bigint)
RETURNS dpsql.datasets LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d dpsql.datasets;
BEGIN
    SELECT * INTO d FROM dpsql.datasets ds WHERE ds.dataset_id = _dataset_by_id.dataset_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'dpsql: no dataset %', coalesce(dataset_id::text, 'NULL')
            USING ERRCODE = 'undefined_object';
    END IF;
    RETURN d;
END $$;

CREATE OR REPLACE FUNCTION dpsql.grant_dataset(dataset_id bigint, role name)
RETURNS void LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d dpsql.datasets;
BEGIN
    PERFORM dpsql_internal._require_admin('grant datasets');
    d := dpsql_internal._dataset_by_id(dataset_id);
    IF role IS NULL OR NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = grant_dataset.role) THEN
        RAISE EXCEPTION 'dpsql: role % does not exist', coalesce(quote_ident(role), 'NULL')
            USING ERRCODE = 'undefined_object';
    END IF;
    IF NOT pg_has_role(role, 'dpsql_analyst', 'MEMBER') AND NOT pg_has_role(role, 'dpsql_admin', 'MEMBER') THEN
        RAISE NOTICE 'dpsql: role % is not a member of dpsql_analyst, so it cannot call dpsql.train yet',
                     quote_ident(role)
            USING HINT = format('GRANT dpsql_analyst TO %I;', role);
    END IF;
    INSERT INTO dpsql.dataset_grants (dataset_id, role)
    VALUES (d.dataset_id, grant_dataset.role)
    ON CONFLICT ON CONSTRAINT dataset_grants_pkey DO NOTHING;
END $$;
COMMENT ON FUNCTION dpsql.grant_dataset(bigint, name) IS
    'Allow a role (and its members) to train privately on a registered dataset';

CREATE OR REPLACE FUNCTION dpsql.revoke_dataset(dataset_id bigint, role name)
RETURNS void LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d dpsql.datasets;
BEGIN
    PERFORM dpsql_internal._require_admin('revoke datasets');
    d := dpsql_internal._dataset_by_id(dataset_id);
    DELETE FROM dpsql.dataset_grants g
     WHERE g.dataset_id = d.dataset_id AND g.role = revoke_dataset.role;
END $$;
COMMENT ON FUNCTION dpsql.revoke_dataset(bigint, name) IS
    'Withdraw a role''s grant on a dataset (its ledger entries stay)';

-- The registered dataset a source names (the private training path and the estimates): its name, or, among
-- datasets whose relation still exists, the relation's current qualified name (quoted or not),
-- the name it was registered under, or its unqualified name when exactly one has it. No name is
-- resolved through a search_path. The relation is checked again (it may have been replaced
-- since registration), and the returned row's source is the relation's current schema-qualified
-- name: read that, never a name given by the caller.
CREATE OR REPLACE FUNCTION dpsql_internal._lookup_dataset(source text)
RETURNS dpsql.datasets LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d dpsql.datasets;
    parts text[];
    n int;
    rel record;
BEGIN
    SELECT * INTO d FROM dpsql.datasets ds WHERE ds.name = _lookup_dataset.source;
    IF NOT FOUND THEN
        BEGIN
            parts := parse_ident(_lookup_dataset.source);
        EXCEPTION WHEN OTHERS THEN
            parts := NULL;
        END;
        IF cardinality(parts) = 2 THEN  -- the relation's current name
            SELECT ds.* INTO d
              FROM dpsql.datasets ds
              JOIN pg_class c ON c.oid = ds.relid
              JOIN pg_namespace ns ON ns.oid = c.relnamespace
             WHERE ds.dropped_at IS NULL AND ns.nspname = parts[1] AND c.relname = parts[2];
        END IF;
        IF d.dataset_id IS NULL THEN  -- the name it was registered under
            SELECT * INTO d FROM dpsql.datasets ds
             WHERE ds.dropped_at IS NULL AND ds.source = _lookup_dataset.source;
        END IF;
        IF d.dataset_id IS NULL AND cardinality(parts) = 1 THEN
            SELECT count(*) INTO n
              FROM dpsql.datasets ds JOIN pg_class c ON c.oid = ds.relid
             WHERE ds.dropped_at IS NULL AND c.relname = parts[1];
            IF n > 1 THEN
                RAISE EXCEPTION 'dpsql: % names % registered datasets',
                                quote_literal(_lookup_dataset.source), n
                    USING ERRCODE = 'ambiguous_alias',
                          HINT = 'Give the dataset name or the schema-qualified table name.';
            END IF;
            SELECT ds.* INTO d
              FROM dpsql.datasets ds JOIN pg_class c ON c.oid = ds.relid
             WHERE ds.dropped_at IS NULL AND c.relname = parts[1];
        END IF;
    END IF;
    IF d.dataset_id IS NULL THEN
        RAISE EXCEPTION 'dpsql: % is not a registered dataset; private training needs '
                        'dpsql.register_dataset by a data owner (dpsql_admin)',
                        coalesce(quote_literal(_lookup_dataset.source), 'NULL')
            USING ERRCODE = 'undefined_object';
    END IF;
    IF d.dropped_at IS NOT NULL THEN
        -- Its oid may since name another relation: never follow it.
        RAISE EXCEPTION 'dpsql: the relation of dataset % was dropped at %', quote_literal(d.name),
                        d.dropped_at
            USING ERRCODE = 'undefined_table';
    END IF;
    rel := dpsql_internal._check_dataset_relation(d.relid, format('dataset %s', quote_literal(d.name)));
    d.source := format('%I.%I', rel.nspname, rel.relname);
    RETURN d;
END $$;

-- The dataset a private training reads: as _lookup_dataset, and trainable. A regression
-- dataset registered without its label bound is not (regression => true): the linear mechanisms
-- calibrate to it, so a data owner sets it first (dpsql.estimate_label_bound).
CREATE OR REPLACE FUNCTION dpsql_internal._dataset_for_source(source text)
RETURNS dpsql.datasets LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d dpsql.datasets := dpsql_internal._lookup_dataset(source);
BEGIN
    IF d.labels IS NULL AND d.label_bound IS NULL THEN
        RAISE EXCEPTION 'dpsql: dataset % is a regression dataset without a label bound yet',
                        quote_literal(d.name)
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'A data owner sets it: dpsql.estimate_label_bound(dataset, epsilon, search_range).';
    END IF;
    RETURN d;
END $$;

-- Datasets whose relation is dropped are marked, so that a later relation that happens to get
-- the same oid is never taken for them (and the relation can be registered anew).
CREATE OR REPLACE FUNCTION dpsql_internal._mark_dropped_datasets()
RETURNS event_trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF to_regclass('dpsql.datasets') IS NULL THEN  -- the extension itself is being dropped
        RETURN;
    END IF;
    UPDATE dpsql.datasets ds SET dropped_at = now()
     WHERE ds.dropped_at IS NULL
       AND ds.relid IN (SELECT o.objid FROM pg_event_trigger_dropped_objects() o
                         WHERE o.classid = 'pg_class'::regclass AND o.objsubid = 0);
END $$;
-- (Created once: upgrade scripts replay this file, and event triggers have no OR REPLACE.)
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger
                    WHERE evtname = 'dpsql_mark_dropped_datasets') THEN
        CREATE EVENT TRIGGER dpsql_mark_dropped_datasets ON sql_drop
            EXECUTE FUNCTION dpsql_internal._mark_dropped_datasets();
    END IF;
END $$;
------------------------------------------------------------------------------------------
-- Reading registered data (private training)
--
-- Private training runs as the extension owner (SECURITY DEFINER), but reading a registered
-- view runs its functions as the current user, and an owner's function without a pinned
-- search_path resolves its unqualified names in the caller's pg_temp, where an analyst can
-- put a view of their own: the red team wrote a file as superuser that way. So a registered
-- relation whose reading runs code (a view, a foreign table, an inheritance tree) is read by
-- dpsql_internal._read_source, which runs as dpsql_reader (no superuser, no login, SELECT on the
-- registered columns only) and refuses while the session holds temporary relations or types
-- that could capture names. A plain table or materialized view runs nobody's code when read.
------------------------------------------------------------------------------------------

-- SELECT on a registered relation's columns for dpsql_reader (and USAGE on its schema).
CREATE OR REPLACE FUNCTION dpsql_internal._grant_reader(relid regclass, columns text[])
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO dpsql_reader',
                   (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                     WHERE c.oid = relid));
    EXECUTE format('GRANT SELECT (%s) ON %s TO dpsql_reader',
                   (SELECT string_agg(quote_ident(c), ', ') FROM unnest(columns) c), relid);
END $$;

-- The select list that reads registered columns as float8 (scalars) or float8[] (an array
-- column), each under its own name. A numeric value out of float8's range becomes NULL (a
-- null record), so that no cast error prints a private value.
CREATE OR REPLACE FUNCTION dpsql_internal._read_list(relid regclass, columns text[])
RETURNS text LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    list text;
    found_columns int;
BEGIN
    SELECT string_agg(
               CASE WHEN t.typcategory = 'A' AND e.oid = 'numeric'::regtype THEN
                        format('ARRAY(SELECT CASE WHEN abs(v) <= 1.7976931348623157e308 THEN v::float8 END'
                               ' FROM unnest(%1$I) v) AS %1$I', a.attname)
                    WHEN t.typcategory = 'A' THEN format('%1$I::float8[] AS %1$I', a.attname)
                    WHEN coalesce(nullif(t.typbasetype, 0), t.oid) = 'numeric'::regtype THEN
                        format('CASE WHEN abs(%1$I) <= 1.7976931348623157e308 THEN %1$I::float8 END AS %1$I',
                               a.attname)
                    ELSE format('%1$I::float8 AS %1$I', a.attname) END,
               ', ' ORDER BY k), count(*)
      INTO list, found_columns
      FROM unnest(columns) WITH ORDINALITY AS u(col, k)
      JOIN pg_attribute a ON a.attrelid = relid AND a.attname = u.col AND a.attnum > 0
                         AND NOT a.attisdropped
      JOIN pg_type t ON t.oid = a.atttypid
      LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A';
    IF found_columns IS DISTINCT FROM cardinality(columns) THEN
        RAISE EXCEPTION 'dpsql: the registered columns of % no longer exist', relid
            USING ERRCODE = 'undefined_column';
    END IF;
    RETURN list;
END $$;

-- Whether reading a relation runs nobody's code: a table or materialized view without
-- inheritance children (a child or partition may be a foreign table). Those are read by the
-- private training directly; everything else through dpsql_internal._read_source.
CREATE OR REPLACE FUNCTION dpsql_internal._runs_no_code(relid regclass)
RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.relkind IN ('r', 'm') AND NOT c.relhassubclass FROM pg_class c WHERE c.oid = relid
$$;

-- Rows of a registered view, foreign table or inheritance tree (select_list from _read_list),
-- read as dpsql_reader. Callable by the extension owner only (no grants): it runs the list it
-- is given.
CREATE OR REPLACE FUNCTION dpsql_internal._read_source(relid regclass, select_list text)
RETURNS SETOF record LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = pg_my_temp_schema())
       OR EXISTS (SELECT 1 FROM pg_type t WHERE t.typnamespace = pg_my_temp_schema()) THEN
        RAISE EXCEPTION 'dpsql: this session has temporary tables or types, and the dataset is a view'
            USING ERRCODE = 'object_in_use',
                  HINT = 'They could capture names in the view''s code: DISCARD TEMP, or train from a new session.';
    END IF;
    RETURN QUERY EXECUTE format('SELECT %s FROM %s', select_list, relid);
END $$;
ALTER FUNCTION dpsql_internal._read_source(regclass, text) OWNER TO dpsql_reader;

-- Whether a dataset's features are one array column (else numeric columns).
CREATE OR REPLACE FUNCTION dpsql_internal._array_feature(ds dpsql.datasets)
RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT cardinality(ds.features) = 1
           AND (SELECT a.attndims > 0 OR t.typcategory = 'A'
                  FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
                 WHERE a.attrelid = ds.relid AND a.attname = ds.features[1])
$$;

-- The FROM item (alias src) that reads a registered dataset's features and label as float8
-- columns (or one float8[] and a float8): directly when that runs nobody's code, else through
-- dpsql_internal._read_source (as dpsql_reader).
CREATE OR REPLACE FUNCTION dpsql_internal._private_from(ds dpsql.datasets)
RETURNS text LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    columns text[] := ds.features || ds.label;
    list text := dpsql_internal._read_list(ds.relid, columns);
BEGIN
    IF dpsql_internal._runs_no_code(ds.relid) THEN
        RETURN format('(SELECT %s FROM %s) AS src', list, ds.relid);
    END IF;
    RETURN format('dpsql_internal._read_source(%s::regclass, %L) AS src(%s)', ds.relid::oid, list,
                  (SELECT string_agg(format('%I %s', c,
                                            CASE WHEN k = 1 AND dpsql_internal._array_feature(ds)
                                                 THEN 'double precision[]' ELSE 'double precision' END),
                                     ', ' ORDER BY k)
                     FROM unnest(columns) WITH ORDINALITY AS u(c, k)));
END $$;
------------------------------------------------------------------------------------------
-- Private bounds (issue 10; spec 001 s. 3.3): for a dataset registered without feature
-- bounds, each feature's lower and upper quantiles; for a regression dataset registered
-- without a label bound, an upper quantile of |y|. Each is the exponential mechanism on a
-- public grid, charged to the dataset's ledger, then registered as its declaration.
--
-- The grid is {a, a + step, ..., b} over the public search range [a, b], step (b - a)/m^2.
-- Values are clamped to [a, b] and rounded to the grid (a per-record map: free). A grid point
-- g has the tie-aware rank utility u(g) = -max(0, #{v < g} - r, r - #{v <= g}) for the target
-- rank r = ceil(q m): replacing one record moves both counts by at most 1, so u has
-- sensitivity 1, and g is drawn with probability proportional to exp(epsilon u(g) / 2). The
-- grid has m^2 points: u is constant between consecutive distinct values, so the draw picks
-- one of O(m) segments (weight: its points times exp(epsilon u / 2)), then a point in it.
------------------------------------------------------------------------------------------

-- The segments of the grid with their utility: a point at each distinct value (ties) and the
-- runs of points between them. grid_values: the distinct values, ascending; counts: how many
-- records have each.
CREATE OR REPLACE FUNCTION dpsql_internal._quantile_segments(grid_values float8[], counts bigint[], rank bigint,
                                         lo float8, hi float8, step float8,
                                         OUT start float8, OUT points float8, OUT utility float8)
RETURNS SETOF record LANGUAGE sql IMMUTABLE AS $$
    WITH v AS (
        SELECT w, c, sum(c) OVER (ORDER BY w) - c AS below, lead(w) OVER (ORDER BY w) AS nxt,
               row_number() OVER (ORDER BY w) AS i
          FROM unnest(grid_values, counts) AS t(w, c)
    ), s AS (
        -- before the first value (every point of the range when there is no value)
        SELECT lo AS start,
               round((coalesce((SELECT min(w) FROM v), hi + step) - lo) / step) AS points,
               0::numeric AS lt, 0::numeric AS le
        UNION ALL  -- each value: its ties
        SELECT w, 1, below, below + c FROM v
        UNION ALL  -- between a value and the next, or up to hi after the last
        SELECT w + step, round((coalesce(nxt, hi + step) - w) / step) - 1, below + c, below + c
          FROM v
    )
    SELECT start, points, -greatest(0, lt - rank, rank - le)::float8
      FROM s WHERE points >= 1
$$;

-- One private quantile: a segment by the exponential mechanism (its points' count enters as
-- 2/epsilon ln(points), so the draw is over grid points), then a uniform point in it.
CREATE OR REPLACE FUNCTION dpsql_internal._private_quantile(grid_values float8[], counts bigint[], rank bigint,
                                        lo float8, hi float8, step float8, epsilon float8,
                                        seed bigint)
RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
    segs record;
    starts float8[];
    points float8[];
    scores float8[];
    pick int;
BEGIN
    SELECT array_agg(s.start ORDER BY s.start), array_agg(s.points ORDER BY s.start),
           array_agg(s.utility + 2 / epsilon * ln(s.points) ORDER BY s.start)
      INTO starts, points, scores
      FROM dpsql_internal._quantile_segments(grid_values, counts, rank, lo, hi, step) s;
    pick := dpsql_internal._exponential_mechanism(scores, epsilon, 1, seed);
    RETURN starts[pick] + (dpsql_internal._uniform_index(coalesce(seed, dpsql_internal._random_seed()), pick,
                                                points[pick]::bigint) - 1) * step;
END $$;

-- The data owner's dataset to estimate a declaration of: admin only, granted.
CREATE OR REPLACE FUNCTION dpsql_internal._estimation_dataset(dataset text, action text)
RETURNS dpsql.datasets LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ds dpsql.datasets;
BEGIN
    PERFORM dpsql_internal._require_admin(action);
    ds := dpsql_internal._lookup_dataset(dataset);
    IF NOT dpsql_internal._can_use_dataset(ds.dataset_id) THEN
        PERFORM dpsql_internal._fail(format('dataset %s is not granted to %s', ds.name, session_user), '42501');
    END IF;
    RETURN ds;
END $$;

-- The public numbers of an estimate: epsilon, the search range [a, b] (lowest: the least a
-- allowed), the row count m and the grid step (b - a)/m^2. m is public (replace-one
-- neighbours): counting rows reads no value, and the charge follows, before any is read.
CREATE OR REPLACE FUNCTION dpsql_internal._estimate_grid(ds dpsql.datasets, epsilon float8,
                                                search_range float8[], lowest float8,
                                                OUT a float8, OUT b float8, OUT m bigint,
                                                OUT step float8)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF epsilon IS NULL OR NOT (epsilon > 0 AND epsilon < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('epsilon must be a finite number > 0, got %s', coalesce(epsilon::text, 'NULL')));
    END IF;
    a := search_range[array_lower(search_range, 1)];
    b := search_range[array_lower(search_range, 1) + 1];
    IF array_ndims(search_range) IS DISTINCT FROM 1 OR cardinality(search_range) <> 2
       OR NOT coalesce(a > '-Infinity' AND a >= lowest AND b < 'Infinity' AND a < b
                       -- b - a must not overflow float8
                       AND b / 2 - a / 2 < 8.98e307, false) THEN
        PERFORM dpsql_internal._fail(format('search_range must be {a, b}, finite, %sa < b',
                                   CASE WHEN lowest > '-Infinity' THEN lowest || ' <= ' ELSE '' END),
                            hint => 'A public range that surely holds the quantiles; wider costs little.');
    END IF;
    EXECUTE format('SELECT count(*) FROM %s', ds.relid) INTO m;
    IF m < 1 THEN
        PERFORM dpsql_internal._fail(format('dataset %s has no rows', ds.name), '22000');
    END IF;
    step := (b - a) / greatest(m::float8 * m, 1);
END $$;

-- Public: the exponential mechanism's rank error (2 / epsilon) ln(grid points), with
-- probability 1 - 1/e, against the target ranks' distance from the edges of the data.
CREATE OR REPLACE FUNCTION dpsql_internal._warn_rank_error(what text, m bigint, eps_each float8, edge_rows bigint)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF 2 / eps_each * ln(m::float8 * m + 1) > edge_rows THEN
        RAISE WARNING 'dpsql: with % rows, epsilon % per quantile and this search range, the % may land far outside the data',
                      m, round(eps_each::numeric, 4), what
            USING HINT = format('The rank error is about %s rows; the target ranks are %s rows from the edges. '
                                'Use a larger epsilon, quantiles further from 0 and 1, or more rows.',
                                round(2 / eps_each * ln(m::float8 * m + 1)), edge_rows);
    END IF;
END $$;

-- SQL of a value on the grid: clamped to [$1, $2], rounded to the step $3 (a per-record map:
-- free). One place for both estimates' reading queries.
CREATE OR REPLACE FUNCTION dpsql_internal._grid_sql(value_sql text)
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT format('$1 + round((least(greatest(%s, $1), $2) - $1) / $3) * $3', value_sql)
$$;

-- search_range is the owner's public statement of where the quantiles surely lie: the grid's
-- empty stretches weigh against the data's (a range 10^6 times too wide needs about
-- 2 ln(10^6) / epsilon more rows at the target rank).
CREATE OR REPLACE FUNCTION dpsql.estimate_bounds(dataset text, epsilon float8, search_range float8[],
                                      lower_quantile float8 DEFAULT 0.01,
                                      upper_quantile float8 DEFAULT 0.99,
                                      noise_seed bigint DEFAULT NULL)
RETURNS float8[] LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ds dpsql.datasets;
    g record;
    a float8;
    b float8;
    m bigint;
    step float8;
    eps_each float8;
    values_expr text;
    f record;
    lo float8;
    hi float8;
    bounds float8[] := '{}';
BEGIN
    ds := dpsql_internal._estimation_dataset(dataset, 'estimate feature bounds');
    IF ds.feature_bounds IS NOT NULL THEN
        PERFORM dpsql_internal._fail(format('dataset %s already has feature bounds', ds.name),
                            hint => 'Bounds are estimated once, for a dataset registered without them.');
    END IF;
    IF ds.dim IS NULL THEN
        PERFORM dpsql_internal._fail(format('dataset %s was registered without a known dimension', ds.name));
    END IF;
    IF lower_quantile IS NULL OR upper_quantile IS NULL
       OR NOT (0 <= lower_quantile AND lower_quantile < upper_quantile AND upper_quantile <= 1) THEN
        PERFORM dpsql_internal._fail('quantiles must satisfy 0 <= lower_quantile < upper_quantile <= 1');
    END IF;
    g := dpsql_internal._estimate_grid(ds, epsilon, search_range, '-Infinity');
    a := g.a;
    b := g.b;
    m := g.m;
    step := g.step;
    eps_each := epsilon / (2 * ds.dim);
    PERFORM dpsql_internal._warn_rank_error('bounds', m, eps_each,
                                   least(ceil(lower_quantile * m), m - ceil(upper_quantile * m))::bigint);
    PERFORM dpsql_internal._charge(ds.dataset_id, epsilon, 0, 'estimate_bounds',
                          note => format('quantiles %s and %s of %s features over [%s, %s]',
                                         lower_quantile, upper_quantile, ds.dim, a, b));
    values_expr := CASE WHEN dpsql_internal._array_feature(ds) THEN format('src.%I', ds.features[1])
                        ELSE format('ARRAY[%s]', (SELECT string_agg(format('src.%I', c), ', ' ORDER BY k)
                                                    FROM unnest(ds.features) WITH ORDINALITY AS u(c, k)))
                   END;
    FOR f IN EXECUTE format(
        'SELECT j, g.w, g.c FROM generate_series(1, $4) j LEFT JOIN ('
        '  SELECT j, array_agg(w ORDER BY w) AS w, array_agg(c ORDER BY w) AS c FROM ('
        '    SELECT u.j, %s AS w, count(*) AS c'
        '      FROM %s, unnest(%s) WITH ORDINALITY AS u(v, j)'
        '     WHERE u.v IS NOT NULL AND u.v <> ''NaN'' AND u.j <= $4'
        '     GROUP BY 1, 2) q GROUP BY j) g USING (j) ORDER BY j',
        dpsql_internal._grid_sql('u.v'), dpsql_internal._private_from(ds), values_expr)
        USING a, b, step, ds.dim
    LOOP
        lo := dpsql_internal._private_quantile(coalesce(f.w, '{}'), coalesce(f.c, '{}'),
                                      ceil(lower_quantile * m)::bigint, a, b, step, eps_each,
                                      noise_seed # (2 * f.j));
        hi := dpsql_internal._private_quantile(coalesce(f.w, '{}'), coalesce(f.c, '{}'),
                                      ceil(upper_quantile * m)::bigint, a, b, step, eps_each,
                                      noise_seed # (2 * f.j + 1));
        IF hi <= lo THEN  -- a feature constant in the data, or crossed draws
            hi := greatest(hi, lo) + step;
            lo := least(hi - step, lo);
        END IF;
        bounds := bounds || ARRAY[ARRAY[lo, hi]];
    END LOOP;
    UPDATE dpsql.datasets d
       SET feature_bounds = bounds,
           row_bound = CASE WHEN d.labels IS NULL  -- regression
                            THEN dpsql_internal._regression_row_bound(d.row_norm, d.row_bound, d.dim)
                            ELSE d.row_bound END
     WHERE d.dataset_id = ds.dataset_id;
    RETURN bounds;
END $$;
COMMENT ON FUNCTION dpsql.estimate_bounds(text, float8, float8[], float8, float8, bigint) IS
    'Private per-feature quantile bounds of a dataset registered without bounds, charged to its ledger (noise_seed: tests only)';


-- The distinct values of |y| on the grid [a, b] of step, ascending, and how many records have
-- each (NULL and NaN labels: none). What the label bound's utility counts.
CREATE OR REPLACE FUNCTION dpsql_internal._label_grid(ds dpsql.datasets, a float8, b float8, step float8,
                                             OUT grid_values float8[], OUT counts bigint[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    EXECUTE format(
        'SELECT coalesce(array_agg(w ORDER BY w), ''{}''), coalesce(array_agg(c ORDER BY w), ''{}'') FROM ('
        '  SELECT %s AS w, count(*) AS c FROM %s'
        '   WHERE src.%I IS NOT NULL AND src.%I <> ''NaN'' GROUP BY 1) v',
        dpsql_internal._grid_sql(format('abs(src.%I)', ds.label)), dpsql_internal._private_from(ds), ds.label, ds.label)
        INTO grid_values, counts USING a, b, step;
END $$;

-- Private label bound (regression): the quantile-q value of |y| by the same mechanism, at the
-- whole epsilon, registered as label_bound. The linear mechanisms use it as the public bound on
-- |y| (docs/linear.md): AdaSSP clips y to [-label_bound, label_bound] in its aggregate (its
-- sensitivities assume it), DP-SSGD and DP-AMBSSGD derive their clip norm and domain from it
-- and clip per-example gradients, so the rows above the bound never break the privacy proof.
-- search_range is a public range of |y|: 0 <= a < b.
CREATE OR REPLACE FUNCTION dpsql.estimate_label_bound(dataset text, epsilon float8, search_range float8[],
                                                      quantile float8 DEFAULT 0.99,
                                                      noise_seed bigint DEFAULT NULL)
RETURNS float8 LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ds dpsql.datasets;
    g record;
    v record;
    bound float8;
BEGIN
    ds := dpsql_internal._estimation_dataset(dataset, 'estimate label bounds');
    IF ds.labels IS NOT NULL THEN
        PERFORM dpsql_internal._fail(format('dataset %s is a classification dataset (labels %s)', ds.name, ds.labels),
                            hint => 'A label bound is for regression: register with regression => true (and no labels).');
    END IF;
    IF ds.label_bound IS NOT NULL THEN
        PERFORM dpsql_internal._fail(format('dataset %s already has a label bound', ds.name),
                            hint => 'A label bound is estimated once, for a dataset registered without it.');
    END IF;
    IF quantile IS NULL OR NOT (0 < quantile AND quantile <= 1) THEN
        PERFORM dpsql_internal._fail(format('quantile must be in (0, 1], got %s', coalesce(quantile::text, 'NULL')));
    END IF;
    g := dpsql_internal._estimate_grid(ds, epsilon, search_range, 0);
    PERFORM dpsql_internal._warn_rank_error('label bound', g.m, epsilon, (g.m - ceil(quantile * g.m))::bigint);
    PERFORM dpsql_internal._charge(ds.dataset_id, epsilon, 0, 'estimate_label_bound',
                          note => format('quantile %s of |%s| over [%s, %s]', quantile, ds.label, g.a, g.b));
    v := dpsql_internal._label_grid(ds, g.a, g.b, g.step);
    bound := dpsql_internal._private_quantile(v.grid_values, v.counts,
                                     ceil(quantile * g.m)::bigint, g.a, g.b, g.step, epsilon, noise_seed);
    bound := greatest(bound, g.step);  -- > 0 (post-processing: labels all 0, or a = 0 drawn)
    UPDATE dpsql.datasets d SET label_bound = bound WHERE d.dataset_id = ds.dataset_id;
    RETURN bound;
END $$;
COMMENT ON FUNCTION dpsql.estimate_label_bound(text, float8, float8[], float8, bigint) IS
    'Private bound on |y| of a regression dataset registered without one, charged to its ledger (noise_seed: tests only)';

-- register_dataset(..., estimate => ...): the estimates to run at registration, each with its
-- own epsilon (charged separately, basic composition: the total is their sum, delta 0):
--   {"feature_bounds": {"epsilon": e1, "search_range": [a, b]
--                       [, "lower_quantile": .01, "upper_quantile": .99]},
--    "label_bound":    {"epsilon": e2, "search_range": [0, B] [, "quantile": .99]},
--    "noise_seed": n}                                              (tests only)
-- Checked here for shape only; the numbers by the estimates themselves (one place each).
CREATE OR REPLACE FUNCTION dpsql_internal._check_estimate_option(estimate jsonb)
RETURNS void LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    step text;
    k text;
    usage constant text := 'estimate => {"feature_bounds": {"epsilon": e, "search_range": [a, b]}, '
                           '"label_bound": {"epsilon": e, "search_range": [0, b]}} (either or both)';
BEGIN
    IF estimate IS NULL THEN
        RETURN;
    END IF;
    IF jsonb_typeof(estimate) <> 'object'
       OR NOT (estimate ? 'feature_bounds' OR estimate ? 'label_bound')
       OR EXISTS (SELECT 1 FROM jsonb_object_keys(estimate) o(key)
                   WHERE o.key NOT IN ('feature_bounds', 'label_bound', 'noise_seed')) THEN
        PERFORM dpsql_internal._fail(format('estimate must name feature_bounds and/or label_bound, got %s', estimate),
                            hint => usage);
    END IF;
    IF estimate ? 'noise_seed' THEN
        IF jsonb_typeof(estimate->'noise_seed') <> 'number' THEN
            PERFORM dpsql_internal._fail(format('estimate.noise_seed must be an integer, got %s', estimate->'noise_seed'));
        END IF;
        IF (estimate->>'noise_seed')::numeric NOT BETWEEN -9223372036854775808 AND 9223372036854775807
           OR (estimate->>'noise_seed')::numeric % 1 <> 0 THEN
            PERFORM dpsql_internal._fail(format('estimate.noise_seed must be an integer, got %s', estimate->'noise_seed'));
        END IF;
    END IF;
    FOREACH step IN ARRAY ARRAY['feature_bounds', 'label_bound'] LOOP
        CONTINUE WHEN NOT estimate ? step;
        IF jsonb_typeof(estimate->step) <> 'object' THEN
            PERFORM dpsql_internal._fail(format('estimate.%s must be an object, got %s', step, estimate->step),
                                hint => usage);
        END IF;
        FOR k IN SELECT jsonb_object_keys(estimate->step) LOOP
            IF k <> ALL (CASE step WHEN 'feature_bounds'
                                   THEN '{epsilon,search_range,lower_quantile,upper_quantile}'
                                   ELSE '{epsilon,search_range,quantile}' END::text[]) THEN
                PERFORM dpsql_internal._fail(format('unknown key estimate.%s.%s', step, k), hint => usage);
            END IF;
            IF k <> 'search_range' AND jsonb_typeof(estimate->step->k) <> 'number' THEN
                PERFORM dpsql_internal._fail(format('estimate.%s.%s must be a number, got %s', step, k,
                                           estimate->step->k));
            END IF;
        END LOOP;
        IF NOT (estimate->step ? 'epsilon' AND estimate->step ? 'search_range') THEN
            PERFORM dpsql_internal._fail(format('estimate.%s needs epsilon and search_range', step), hint => usage);
        END IF;
        IF jsonb_typeof(estimate->step->'search_range') <> 'array'
           OR jsonb_array_length(estimate->step->'search_range') <> 2
           OR EXISTS (SELECT 1 FROM jsonb_array_elements(estimate->step->'search_range') e
                       WHERE jsonb_typeof(e) <> 'number') THEN
            PERFORM dpsql_internal._fail(format('estimate.%s.search_range must be [a, b], got %s', step,
                                       estimate->step->'search_range'));
        END IF;
        -- A number jsonb holds that float8 does not (1e400) fails here, not mid-registration.
        BEGIN
            PERFORM (estimate->step->>o.key)::float8 FROM jsonb_object_keys(estimate->step) o(key)
              WHERE o.key <> 'search_range';
            PERFORM e::text::float8 FROM jsonb_array_elements(estimate->step->'search_range') e;
        EXCEPTION WHEN numeric_value_out_of_range THEN
            PERFORM dpsql_internal._fail(format('estimate.%s has a number out of float8''s range', step));
        END;
    END LOOP;
END $$;

-- The estimates of a registration (checked by _check_estimate_option), on the dataset just
-- inserted under this name, in this transaction: feature bounds first (a regression dataset's
-- row_bound follows from them), then the label bound.
CREATE OR REPLACE FUNCTION dpsql_internal._estimate_at_registration(dataset text, estimate jsonb)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    seed bigint := (estimate->>'noise_seed')::bigint;
    e jsonb;
BEGIN
    -- Named arguments for the keys given only: the defaults stay the estimates' own.
    IF estimate ? 'feature_bounds' THEN
        e := estimate->'feature_bounds';
        EXECUTE format('SELECT dpsql.estimate_bounds($1, $2, $3, noise_seed => $4%s%s)',
                       CASE WHEN e ? 'lower_quantile' THEN ', lower_quantile => $5' END,
                       CASE WHEN e ? 'upper_quantile' THEN ', upper_quantile => $6' END)
            USING dataset, (e->>'epsilon')::float8, dpsql_internal._jsonb_float8s(e->'search_range'), seed,
                  (e->>'lower_quantile')::float8, (e->>'upper_quantile')::float8;
    END IF;
    IF estimate ? 'label_bound' THEN
        e := estimate->'label_bound';
        EXECUTE format('SELECT dpsql.estimate_label_bound($1, $2, $3, noise_seed => $4%s)',
                       CASE WHEN e ? 'quantile' THEN ', quantile => $5' END)
            USING dataset, (e->>'epsilon')::float8, dpsql_internal._jsonb_float8s(e->'search_range'), seed,
                  (e->>'quantile')::float8;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION dpsql_internal._jsonb_float8s(numbers jsonb)
RETURNS float8[] LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT ARRAY(SELECT v::text::float8 FROM jsonb_array_elements(numbers) WITH ORDINALITY AS t(v, k)
                  ORDER BY k)
$$;
------------------------------------------------------------------------------------------
-- The privacy ledger: append-only, one row per charged release, charged under a row lock on
-- the dataset so that concurrent trainings can never overspend.
------------------------------------------------------------------------------------------

-- The privacy ledger. Append-only (trigger below); a dataset with entries cannot be deleted.
CREATE TABLE IF NOT EXISTS dpsql.ledger_entries (
    entry_id        bigserial PRIMARY KEY,
    dataset_id      bigint NOT NULL REFERENCES dpsql.datasets,
    model_id        bigint,                     -- set once the released model is stored
    mechanism       text NOT NULL,
    epsilon         float8 NOT NULL CHECK (epsilon >= 0 AND epsilon < 'Infinity'),
    delta           float8 NOT NULL CHECK (delta >= 0 AND delta < 1),
    charged_at      timestamptz NOT NULL DEFAULT now(),
    role            name NOT NULL DEFAULT session_user,  -- the login role that was charged
    note            text,
    dp_event        jsonb   -- the release as a dp-accounting DpEvent (dpsql/ledger_events.py);
                            -- NULL before 0.6.0, which means the plain (epsilon, delta) event
);
-- Entries written before 0.6.0 keep dp_event NULL (ALTER EXTENSION UPDATE adds the column).
ALTER TABLE dpsql.ledger_entries ADD COLUMN IF NOT EXISTS dp_event jsonb;
CREATE INDEX IF NOT EXISTS ledger_entries_dataset_idx ON dpsql.ledger_entries (dataset_id);
COMMENT ON TABLE dpsql.ledger_entries IS 'Append-only privacy ledger: one row per charged release';

-- How a dataset's releases are held against its budget (docs/privacy.md, "Re-accounting the
-- ledger"): 'sum' adds up epsilons and deltas; 'pld' composes the entries' dp_events with
-- dp-accounting's PLD accountant and compares epsilon at the delta budget. Declared here, with
-- the charge that reads it, on install and upgrade alike.
ALTER TABLE dpsql.datasets ADD COLUMN IF NOT EXISTS composition text NOT NULL DEFAULT 'sum'
    CHECK (composition IN ('sum', 'pld'));

-- The only change allowed to a ledger entry: model_id from NULL to a value, with charged_at
-- moving forward to the release's time, nothing else.
CREATE OR REPLACE FUNCTION dpsql_internal._ledger_append_only()
RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    expected dpsql.ledger_entries;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        expected := OLD;
        expected.model_id := NEW.model_id;
        expected.charged_at := NEW.charged_at;
        IF OLD.model_id IS NULL AND NEW.model_id IS NOT NULL AND NEW.charged_at >= OLD.charged_at
           AND NEW IS NOT DISTINCT FROM expected THEN
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION 'dpsql: the privacy ledger is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Only model_id may be filled in once, by dpsql_internal._set_ledger_model.';
END $$;

CREATE OR REPLACE TRIGGER ledger_entries_append_only
    BEFORE UPDATE OR DELETE ON dpsql.ledger_entries
    FOR EACH ROW EXECUTE FUNCTION dpsql_internal._ledger_append_only();
CREATE OR REPLACE TRIGGER ledger_entries_no_truncate
    BEFORE TRUNCATE ON dpsql.ledger_entries
    FOR EACH STATEMENT EXECUTE FUNCTION dpsql_internal._ledger_append_only();
-- ALWAYS: also under session_replication_role = replica.
ALTER TABLE dpsql.ledger_entries ENABLE ALWAYS TRIGGER ledger_entries_append_only;
ALTER TABLE dpsql.ledger_entries ENABLE ALWAYS TRIGGER ledger_entries_no_truncate;

------------------------------------------------------------------------------------------
-- Charging the ledger
------------------------------------------------------------------------------------------

-- What each dataset has spent: the one sum of the ledger, read by the charge and the views.
CREATE OR REPLACE VIEW dpsql_internal.spent AS
SELECT d.dataset_id, coalesce(sum(e.epsilon), 0) AS epsilon_spent,
       coalesce(sum(e.delta), 0) AS delta_spent
  FROM dpsql.datasets d LEFT JOIN dpsql.ledger_entries e ON e.dataset_id = d.dataset_id
 GROUP BY d.dataset_id;

-- The event of a release known only to be (epsilon, delta)-DP (dpsql/ledger_events.py).
CREATE OR REPLACE FUNCTION dpsql_internal._epsilon_delta_event(epsilon float8, delta float8)
RETURNS jsonb LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT jsonb_build_object('type', 'EpsilonDelta', 'epsilon', epsilon, 'delta', delta)
$$;

-- Charge (epsilon, delta) to a dataset; returns the ledger entry. The dataset row is locked
-- (FOR UPDATE, then bumped) before the spent budget is summed, so concurrent charges serialize:
-- under READ COMMITTED the next charger waits and then sees this entry; under REPEATABLE READ or
-- SERIALIZABLE it fails with a serialization error instead of using a stale sum. Raises
-- SQLSTATE DP001 when the budget would be exceeded, and then writes nothing. dp_event is the
-- release as a dp-accounting event when the caller knows one tighter than (epsilon, delta)
-- (51_budget_report.sql); NULL records the plain (epsilon, delta) event, always sound. A 'pld'
-- dataset is charged by the PLD composition of every entry's event and this one at its delta
-- budget, instead of the sums.
CREATE OR REPLACE FUNCTION dpsql_internal._charge(dataset_id bigint, epsilon float8, delta float8, mechanism text,
                              model_id bigint DEFAULT NULL, note text DEFAULT NULL,
                              dp_event jsonb DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    slack constant float8 := 1e-12;  -- relative, for float sums of many charges
    d dpsql.datasets;
    eps_spent float8;
    delta_spent float8;
    event jsonb;
    composed jsonb;
    eps_composed float8;
    entry bigint;
BEGIN
    PERFORM dpsql_internal._refuse_on_worker();  -- the one ledger is the coordinator's
    IF epsilon IS NULL OR NOT (epsilon > 0 AND epsilon < 'Infinity') THEN
        RAISE EXCEPTION 'dpsql: epsilon must be a finite number > 0, got %',
                        coalesce(epsilon::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF delta IS NULL OR NOT (delta >= 0 AND delta < 1) THEN
        RAISE EXCEPTION 'dpsql: delta must be in [0, 1), got %', coalesce(delta::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF mechanism IS NULL OR btrim(mechanism) = '' THEN
        RAISE EXCEPTION 'dpsql: a charge needs the name of its mechanism'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO d FROM dpsql.datasets ds WHERE ds.dataset_id = _charge.dataset_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'dpsql: no dataset %', coalesce(dataset_id::text, 'NULL')
            USING ERRCODE = 'undefined_object';
    END IF;
    event := coalesce(dp_event, dpsql_internal._epsilon_delta_event(epsilon, delta));
    IF jsonb_typeof(event) IS DISTINCT FROM 'object' OR NOT event ? 'type' THEN
        RAISE EXCEPTION 'dpsql: a charge''s dp_event must be a serialised DpEvent, got %', event
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT s.epsilon_spent, s.delta_spent INTO eps_spent, delta_spent
      FROM dpsql_internal.spent s WHERE s.dataset_id = d.dataset_id;
    IF d.composition = 'pld' THEN
        -- The tight total of every release so far and this one, by dp-accounting (pessimistic
        -- PLD: an upper bound), in place of both sums; NULL epsilon: no finite guarantee.
        composed := dpsql_internal._compose_ledger(d.dataset_id, d.delta_budget, event);
        eps_composed := (composed->>'epsilon_pld')::float8;
        IF eps_composed IS NULL OR eps_composed > d.epsilon_budget * (1 + slack) THEN
            RAISE EXCEPTION USING
                ERRCODE = 'DP001',
                MESSAGE = format('dpsql: privacy budget of dataset %s exceeded: composed by PLD '
                                 'with this release ε=%s at δ=%s; budget ε=%s, δ=%s; this '
                                 'release needs ε=%s, δ=%s',
                                 quote_literal(d.name), coalesce(eps_composed::text, 'Infinity'),
                                 d.delta_budget, d.epsilon_budget, d.delta_budget, epsilon,
                                 delta),
                HINT = 'Nothing was charged. Ask the data owner for a larger budget, or release '
                       'with a smaller epsilon/delta.';
        END IF;
    ELSIF eps_spent + epsilon > d.epsilon_budget * (1 + slack)
       OR delta_spent + delta > d.delta_budget * (1 + slack) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'DP001',
            MESSAGE = format('dpsql: privacy budget of dataset %s exceeded: spent ε=%s, δ=%s; '
                             'budget ε=%s, δ=%s; this release needs ε=%s, δ=%s',
                             quote_literal(d.name), eps_spent, delta_spent, d.epsilon_budget,
                             d.delta_budget, epsilon, delta),
            HINT = 'Nothing was charged. Ask the data owner for a larger budget, or release with '
                   'a smaller epsilon/delta.';
    END IF;
    INSERT INTO dpsql.ledger_entries (dataset_id, model_id, mechanism, epsilon, delta, charged_at,
                                      role, note, dp_event)
    VALUES (d.dataset_id, _charge.model_id, _charge.mechanism, _charge.epsilon, _charge.delta,
            clock_timestamp(), session_user, _charge.note, event)
    RETURNING entry_id INTO entry;
    UPDATE dpsql.datasets ds SET charges = ds.charges + 1 WHERE ds.dataset_id = d.dataset_id;
    RETURN entry;
END $$;

-- Record the model a charged release produced (the only update the ledger allows).
CREATE OR REPLACE FUNCTION dpsql_internal._set_ledger_model(entry_id bigint, model_id bigint)
RETURNS void LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF model_id IS NULL THEN
        RAISE EXCEPTION 'dpsql: model_id must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- charged_at: when the model was released (clock time, not the transaction's start)
    UPDATE dpsql.ledger_entries e SET model_id = _set_ledger_model.model_id,
                                      charged_at = clock_timestamp()
     WHERE e.entry_id = _set_ledger_model.entry_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'dpsql: no ledger entry %', coalesce(entry_id::text, 'NULL')
            USING ERRCODE = 'undefined_object';
    END IF;
END $$;
------------------------------------------------------------------------------------------
-- The views analysts and data owners read (security barriers over the catalog tables).
------------------------------------------------------------------------------------------

-- Where a release's noise came from, as its model records it: the models view below shows
-- analysts only releases whose record says 'pg_strong_random' (a known seed gives the noise away).
CREATE OR REPLACE FUNCTION dpsql_internal._noise_source(noise_seed bigint)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN noise_seed IS NULL THEN 'pg_strong_random'
                ELSE 'user seed ' || noise_seed || ': NOT private' END
$$;

-- What analysts see of the models: private releases on datasets granted to them. Data owners
-- see everything (their non-private models too).
CREATE OR REPLACE VIEW dpsql.models WITH (security_barrier) AS
    SELECT * FROM dpsql.model_store m
     WHERE dpsql_internal._is_admin()
        OR (m.privacy <> 'none' AND m.dataset_id IS NOT NULL
            -- a release with a known noise seed would give its noiseless model away
            AND m.params->'privacy'->>'noise_seed' = 'pg_strong_random'
            -- BST14 as printed is add/remove-calibrated: a reproduction, not a release
            AND coalesce(m.params->'privacy'->>'bst14_noise', 'strict') = 'strict'
            AND dpsql_internal._can_use_dataset(m.dataset_id));
COMMENT ON VIEW dpsql.models IS
    'Trained models with their hyperparameters and provenance (analysts: released private models of their datasets)';

CREATE OR REPLACE VIEW dpsql.ledger WITH (security_barrier) AS
SELECT e.entry_id, e.dataset_id, d.name AS dataset, e.model_id, e.mechanism, e.epsilon, e.delta,
       e.charged_at, e.role, e.note,
       -- the release as a dp-accounting event, for anyone to re-account (dpsql.budget_report);
       -- entries from before 0.6.0 are plain (epsilon, delta) events
       coalesce(e.dp_event, jsonb_build_object('type', 'EpsilonDelta', 'epsilon', e.epsilon,
                                               'delta', e.delta)) AS dp_event
  FROM dpsql.ledger_entries e
  JOIN dpsql.datasets d ON d.dataset_id = e.dataset_id
 WHERE dpsql_internal._can_use_dataset(e.dataset_id);
COMMENT ON VIEW dpsql.ledger IS 'Ledger entries of the datasets the login role can use';

CREATE OR REPLACE VIEW dpsql.budgets WITH (security_barrier) AS
SELECT d.dataset_id, d.name, d.epsilon_budget, d.delta_budget,
       s.epsilon_spent, s.delta_spent,
       greatest(d.epsilon_budget - s.epsilon_spent, 0) AS epsilon_remaining,
       greatest(d.delta_budget - s.delta_spent, 0) AS delta_remaining,
       d.dropped_at,
       d.composition  -- 'pld': charged by composition, see dpsql.budget_report
  FROM dpsql.datasets d
 JOIN dpsql_internal.spent s ON s.dataset_id = d.dataset_id
 WHERE dpsql_internal._can_use_dataset(d.dataset_id);
COMMENT ON VIEW dpsql.budgets IS 'Budget, spent and remaining (epsilon, delta) of usable datasets';

CREATE OR REPLACE VIEW dpsql.my_datasets WITH (security_barrier) AS
SELECT d.dataset_id, d.name, d.source, d.features, d.label, d.labels, d.row_norm,
       d.feature_bounds, d.epsilon_budget, d.delta_budget, s.epsilon_spent, s.delta_spent,
       greatest(d.epsilon_budget - s.epsilon_spent, 0) AS epsilon_remaining,
       greatest(d.delta_budget - s.delta_spent, 0) AS delta_remaining,
       d.label_bound, d.row_bound
  FROM dpsql.datasets d
 JOIN dpsql_internal.spent s ON s.dataset_id = d.dataset_id
 WHERE d.dropped_at IS NULL AND dpsql_internal._can_use_dataset(d.dataset_id);
COMMENT ON VIEW dpsql.my_datasets IS
    'Datasets the login role can train on: public declarations and remaining budget';
------------------------------------------------------------------------------------------
-- Training runs: prepare -> epochs -> finish. dpsql.train and the Python controller both
-- drive these, so the logic lives here once.
------------------------------------------------------------------------------------------

-- Copy the source into a shuffled training table (rid, x, y) and build the initial state.
-- Parallel scans and synchronized scans are off: row positions must follow the physical order
-- so that the permutation is a function of the seed alone.
-- A run's settings, checked before anything is read (bad input changes nothing).
CREATE OR REPLACE FUNCTION dpsql_internal._check_run_settings(
    epochs int, batch_size bigint, lambda float8, step_size float8, schedule text,
    step_offset float8, radius float8, row_norm text, huber_h float8, tolerance float8,
    parallel_workers int, shuffle boolean, permutation text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF epochs IS NULL OR epochs < 1 THEN
        PERFORM dpsql_internal._fail(format('epochs must be >= 1, got %s', coalesce(epochs::text, 'NULL')));
    END IF;
    IF batch_size IS NULL OR batch_size < 1 THEN
        PERFORM dpsql_internal._fail(format('batch_size must be >= 1, got %s', coalesce(batch_size::text, 'NULL')));
    END IF;
    IF lambda IS NULL OR NOT (lambda >= 0 AND lambda < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('lambda must be a finite number >= 0, got %s', coalesce(lambda::text, 'NULL')));
    END IF;
    IF step_size IS NOT NULL AND NOT (step_size > 0 AND step_size < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('step_size must be a finite number > 0, got %s', step_size));
    END IF;
    IF schedule IS NULL OR schedule NOT IN ('constant', 'decreasing', 'inverse', 'sqrt') THEN
        PERFORM dpsql_internal._fail(format('unknown schedule %s', coalesce(quote_literal(schedule), 'NULL')),
                            hint => 'Use constant, decreasing (min(1/beta, 1/(lambda t))), inverse or sqrt.');
    END IF;
    IF schedule = 'decreasing' AND lambda = 0 THEN
        PERFORM dpsql_internal._fail('the decreasing schedule min(1/beta, 1/(lambda t)) needs lambda > 0');
    END IF;
    IF step_offset IS NULL OR NOT (step_offset >= 0 AND step_offset < 'Infinity') THEN
        PERFORM dpsql_internal._fail('step_offset must be a finite number >= 0');
    END IF;
    IF radius IS NOT NULL AND NOT (radius >= 0 AND radius < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('radius must be a finite number >= 0, got %s', radius));
    END IF;
    IF row_norm IS NULL OR row_norm NOT IN ('none', 'clip', 'unit') THEN
        PERFORM dpsql_internal._fail(format('row_norm must be none, clip or unit, got %s', coalesce(row_norm, 'NULL')));
    END IF;
    IF huber_h IS NULL OR NOT (huber_h > 0 AND huber_h < 1) THEN
        PERFORM dpsql_internal._fail('huber_h must be in (0, 1)');
    END IF;
    IF tolerance IS NOT NULL AND NOT (tolerance > 0) THEN
        PERFORM dpsql_internal._fail('tolerance must be > 0');
    END IF;
    IF parallel_workers IS NULL OR parallel_workers < 0 OR parallel_workers > 64 THEN
        PERFORM dpsql_internal._fail('parallel_workers must be between 0 and 64');
    END IF;
    IF shuffle IS NULL THEN
        PERFORM dpsql_internal._fail('shuffle must be true or false');
    END IF;
    IF permutation IS NULL OR permutation NOT IN ('once', 'fresh') THEN
        PERFORM dpsql_internal._fail('permutation must be once (shuffle once) or fresh (a new one each epoch)');
    END IF;
    IF permutation = 'fresh' AND (NOT shuffle OR parallel_workers > 0) THEN
        PERFORM dpsql_internal._fail('fresh permutations need shuffle => true and a serial scan');
    END IF;
END $$;

-- The training table dpsql_work.train_<run> of a run: the source's rows as (rid, x, y) in
-- the order of a seeded, data-independent permutation (the source's own order without
-- shuffle), feature arrays kept inline. *seed receives the seed used (a random one when NULL).
CREATE OR REPLACE FUNCTION dpsql_internal._fill_training_table(
    run bigint, src text, x_expr text, y_expr text, dim int, parallel_workers int,
    shuffle boolean, INOUT seed bigint, OUT train_table text, OUT rows bigint,
    OUT seed_policy text, OUT layout jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    tbl text;
BEGIN
    seed_policy := 'none';
    tbl := format('dpsql_work.%I', 'train_' || run);
    EXECUTE format('CREATE UNLOGGED TABLE %s (rid bigint NOT NULL, x float8[], y float8) '
                   'WITH (autovacuum_enabled = false%s)', tbl,
                   CASE WHEN parallel_workers > 0 THEN ', parallel_workers = ' || parallel_workers ELSE '' END);
    -- Keep feature arrays inline and uncompressed: a TOASTed row costs a detoast per epoch.
    EXECUTE format('ALTER TABLE %s ALTER COLUMN x SET STORAGE %s', tbl,
                   CASE WHEN dim <= 1000 THEN 'PLAIN' ELSE 'EXTERNAL' END);
    IF shuffle THEN
        seed_policy := CASE WHEN seed IS NULL THEN 'random' ELSE 'user' END;
        seed := coalesce(seed, dpsql_internal._random_seed());
        EXECUTE format(
            'INSERT INTO %s (rid, x, y) '
            'SELECT row_number() OVER (ORDER BY k, pos), x, y FROM ('
            '  SELECT dpsql_internal._shuffle_key($1, pos) AS k, pos, x, y FROM ('
            '    SELECT row_number() OVER () AS pos, %s AS x, %s AS y FROM %s) a) b '
            'ORDER BY k, pos', tbl, x_expr, y_expr, src) USING seed;
    ELSE
        seed := NULL;
        EXECUTE format('INSERT INTO %s (rid, x, y) SELECT row_number() OVER (), %s, %s FROM %s',
                       tbl, x_expr, y_expr, src);
    END IF;
    GET DIAGNOSTICS rows = ROW_COUNT;
    train_table := tbl;
END $$;

CREATE OR REPLACE FUNCTION dpsql_internal._prepare(
    source text, features text[], label text, model text, epochs int, batch_size bigint,
    lambda float8, step_size float8, schedule text, step_offset float8, radius float8,
    shuffle boolean, seed bigint, labels float8[], intercept boolean, row_norm text,
    huber_h float8, tolerance float8, parallel_workers int DEFAULT 0,
    private boolean DEFAULT false, feature_bounds float8[] DEFAULT NULL,
    permutation text DEFAULT 'once', feature_types text[] DEFAULT NULL, dim int DEFAULT NULL,
    shard_parallel boolean DEFAULT false, relation regclass DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql
SET max_parallel_workers_per_gather = 0
SET synchronize_seqscans = off
AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
    src text;
    lab record;
    feat record;
    yexpr text;
    run bigint;
    tbl text;
    m bigint;
    m_any boolean;
    r float8;
    eta float8;
    flags int;
    seed_policy text;
    filled record;
    init float8[];
    layout record;
BEGIN
    PERFORM dpsql_internal._refuse_on_worker();
    lab := dpsql_internal._check_labels(model, labels);
    PERFORM dpsql_internal._check_run_settings(epochs, batch_size, lambda, step_size, schedule,
                                               step_offset, radius, row_norm, huber_h, tolerance,
                                               parallel_workers, shuffle, permutation);
    src := dpsql_internal._source_sql(source);
    relation := coalesce(relation, dpsql_internal._source_regclass(source));
    layout := dpsql_internal._citus_layout(relation);
    IF layout.dist_column IS NOT NULL THEN
        IF parallel_workers > 0 OR permutation = 'fresh' THEN
            PERFORM dpsql_internal._fail('on a distributed table the shards are the parallel scans: '
                                         'parallel_workers and fresh permutations do not apply', '0A000');
        END IF;
        IF NOT private AND NOT shard_parallel THEN
            PERFORM dpsql_internal._fail(
                format('%s is distributed over %s shards: SGD epochs there train one model per shard '
                       'and average them; pass shard_parallel => true to accept that', relation,
                       layout.shard_count), '0A000', 'See docs/citus.md.');
        END IF;
    ELSIF shard_parallel THEN
        PERFORM dpsql_internal._fail(format('shard_parallel => true needs a Citus distributed table; '
                                            'source %s is not one', source));
    ELSIF NOT layout.single_shard AND dpsql_internal._reads_citus(src, relation) THEN
        PERFORM dpsql_internal._fail(
            format('source %s reads Citus tables through a query or view: dpsql pushes training down '
                   'only for a hash-distributed table itself', source), '0A000',
            'Train on (or register) the distributed table, or copy the rows into a local table.');
    END IF;
    BEGIN
        IF NOT private THEN  -- a private source is read once (its row count m is public)
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s)', src) INTO STRICT m_any;
            IF NOT m_any THEN
                PERFORM dpsql_internal._fail(format('source %s has no rows', source), '22000');
            END IF;
        END IF;
        feat := dpsql_internal._feature_sql(src, features, feature_bounds, feature_types, dim);
        yexpr := dpsql_internal._label_sql(lab.canonical, label, lab.checked, NOT private);
        run := nextval(pg_get_serial_sequence('dpsql.runs', 'run_id'));
        IF layout.dist_column IS NOT NULL THEN
            filled := dpsql_internal._fill_distributed_table(run, relation, feat.expr, yexpr,
                                                             feat.dim, shuffle, seed);
        ELSE
            filled := dpsql_internal._fill_training_table(run, src, feat.expr, yexpr, feat.dim,
                                                          parallel_workers, shuffle, seed);
        END IF;
        tbl := filled.train_table;
        m := filled.rows;
        seed := filled.seed;
        seed_policy := filled.seed_policy;
    EXCEPTION WHEN undefined_column THEN
        RAISE EXCEPTION 'dpsql: %', SQLERRM USING ERRCODE = 'undefined_column',
            DETAIL = format('source %s, features %s, label %s', source, features, label);
    END;
    IF m = 0 THEN
        PERFORM dpsql_internal._fail(format('source %s has no rows', source), '22000');
    END IF;

    r := CASE WHEN radius IS NOT NULL THEN radius
              WHEN schedule = 'decreasing' THEN 1.0 / lambda  -- L = 1 + lambda R needs the ball
              ELSE 0 END;
    eta := coalesce(step_size,
                    CASE schedule
                        WHEN 'constant' THEN 1.0 / sqrt(m)     -- the bolt-on paper's choice
                        WHEN 'decreasing' THEN 0
                        ELSE 2.0 / (dpsql.loss_constants(lab.canonical, lambda, r, huber_h)).smoothness
                    END);
    flags := CASE row_norm WHEN 'clip' THEN dpsql_internal._flag('clip_rows')
                           WHEN 'unit' THEN dpsql_internal._flag('unit_rows') ELSE 0 END
           | CASE WHEN intercept THEN dpsql_internal._flag('intercept') ELSE 0 END
           -- malformed rows become null records
           | CASE WHEN private THEN dpsql_internal._flag('sanitize') ELSE 0 END;
    init := dpsql_internal._sgd_init(lab.canonical, feat.dim, coalesce(cardinality(lab.checked), 1), lambda,
                            schedule, eta, step_offset, r, huber_h, batch_size, flags);

    INSERT INTO dpsql.runs (run_id, spec, train_table, state, rows, prepare_seconds)
    VALUES (run,
            jsonb_build_object(
                'source', source, 'features', features, 'label', label, 'model', lab.canonical,
                'classes', lab.checked, 'dim', feat.dim, 'epochs', epochs, 'batch_size', batch_size,
                'lambda', lambda, 'schedule', schedule,
                'step_size', CASE WHEN schedule = 'decreasing' THEN NULL ELSE eta END,
                'step_offset', step_offset, 'radius', CASE WHEN r > 0 THEN r END,
                'huber_h', CASE WHEN lab.canonical = 'huber' THEN huber_h END,
                'row_norm', row_norm, 'intercept', intercept, 'shuffle', shuffle, 'seed', seed,
                'seed_policy', seed_policy, 'tolerance', tolerance, 'flags', flags,
                'parallel_workers', parallel_workers, 'remainder', 'drop_last',
                'private', private, 'permutation', permutation, 'feature_bounds', feature_bounds,
                'shard_parallel', shard_parallel, 'distributed', filled.layout),
            tbl, init, m, extract(epoch FROM clock_timestamp() - t0));
    RETURN run;
END $$;

-- A run's row, locked for the rest of the transaction.
CREATE OR REPLACE FUNCTION dpsql_internal._locked_run(run_id bigint)
RETURNS dpsql.runs LANGUAGE plpgsql AS $$
DECLARE
    r dpsql.runs;
BEGIN
    SELECT * INTO r FROM dpsql.runs WHERE runs.run_id = _locked_run.run_id FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM dpsql_internal._fail(format('no training run %s', coalesce(run_id::text, 'NULL')), '42704');
    END IF;
    RETURN r;
END $$;

-- Progress of a long run as NOTICEs "dpsql: <unit> <done>/<total>": the first and the last,
-- and at most one a second between them (the last time is a session setting: a function's
-- SET clause would undo a local one). Python's Database.train draws them as a tqdm bar;
-- psql shows them, and SET client_min_messages = warning silences them. Units and totals are
-- public (epochs, steps): they say nothing about the rows.
CREATE OR REPLACE FUNCTION dpsql_internal._progress(unit text, done bigint, total bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    at float8 := extract(epoch FROM clock_timestamp());
    last float8 := nullif(current_setting('dpsql_progress.last', true), '')::float8;
    reporting text := nullif(current_setting('dpsql_progress.only', true), '');
BEGIN
    IF reporting IS NOT NULL AND unit <> reporting THEN
        RETURN;  -- an audit's hundreds of runs report as its own (52_audit.sql)
    END IF;
    IF done <= 1 OR done >= total OR last IS NULL OR at - last >= 1 THEN
        RAISE NOTICE 'dpsql: % %/%', unit, done, total;
        PERFORM set_config('dpsql_progress.last', at::text, false);
    END IF;
END $$;

-- One epoch of sampled batches (Poisson sampling, draws with replacement), from the run's
-- secret sampling seed mixed with the epoch number. Without a sort when the rows fit in
-- dpsql.sampling_memory: the scan files them by rid and the final function replays the steps,
-- and the run's later epochs in this transaction replay the filed rows without a scan
-- (sampled_fmgr.c). Larger tables join every row to its steps and sort.
CREATE OR REPLACE FUNCTION dpsql_internal._sampled_epoch(r dpsql.runs)
RETURNS float8[] LANGUAGE plpgsql AS $$
DECLARE
    seed bigint := r.sampling_seed # (r.epochs_done::bigint << 40);
    q float8 := coalesce((r.spec->>'sampling_rate')::float8, 0);
    st float8[];
BEGIN
    IF dpsql_internal._sampled_epoch_fits(r.state, r.rows) THEN
        st := dpsql_internal._sgd_epoch_replayed(r.state, r.run_id, r.train_table::regclass,
                                                 r.spec->>'sampling', seed, r.rows, q);
        IF st IS NULL THEN
            EXECUTE format('SELECT dpsql_internal._sgd_epoch_sampled(x, y, rid, $1, $2, $3, $4, $5,'
                           '       $6, $7) FROM %s', r.train_table)
               INTO st USING r.state, r.spec->>'sampling', seed, r.rows, q, r.run_id,
                             r.train_table::regclass::oid;
        END IF;
    ELSIF r.spec->>'sampling' = 'poisson' THEN
        -- each row joins each step with probability q; rows sorted by step, and steps no row
        -- joined still step (noise only)
        EXECUTE format('SELECT dpsql.sgd_epoch_batches(t.x, t.y, b.batch, $1 ORDER BY b.batch)'
                       '  FROM %s t CROSS JOIN LATERAL unnest(dpsql_internal._poisson_batches($2, t.rid,'
                       '       $3, $4)) AS b(batch)', r.train_table)
           INTO st USING r.state, seed, (r.spec->>'steps_per_epoch')::int, q;
    ELSE
        -- BST14: every step draws batch_size rows uniformly with replacement, sorted by draw
        EXECUTE format('SELECT dpsql.sgd_epoch_batches(t.x, t.y, (g.pos - 1) / $3 + 1, $1'
                       '       ORDER BY g.pos)'
                       '  FROM generate_series(1::bigint, $3 * $4) AS g(pos)'
                       '  JOIN %s t ON t.rid = dpsql_internal._uniform_index($2, g.pos, $5)', r.train_table)
           INTO st USING r.state, seed, (r.spec->>'batch_size')::bigint,
                         (r.spec->>'steps_per_epoch')::bigint, r.rows;
    END IF;
    RETURN st;
END $$;

-- One epoch of a run: one aggregate scan of its training table. Returns the epoch number,
-- the epoch's training objective, and whether the run is done (epochs reached or converged).
CREATE OR REPLACE FUNCTION dpsql_internal._run_epoch(run_id bigint, OUT epoch int, OUT objective float8, OUT done boolean)
LANGUAGE plpgsql
SET max_parallel_workers_per_gather = 0
SET synchronize_seqscans = off
SET parallel_setup_cost = 1000
SET parallel_tuple_cost = 0.1
SET min_parallel_table_scan_size = '8MB'
AS $$
DECLARE
    r dpsql.runs;
    t0 timestamptz := clock_timestamp();
    st float8[];
    info record;
    workers int;
    prev float8;
    tol float8;
BEGIN
    r := dpsql_internal._locked_run(run_id);
    IF r.done THEN
        PERFORM dpsql_internal._fail(format('training run %s is already done', run_id));
    END IF;
    workers := coalesce((r.spec->>'parallel_workers')::int, 0);
    IF r.spec->'distributed' <> 'null' AND NOT (r.spec->>'shard_parallel')::boolean THEN
        PERFORM dpsql_internal._fail('SGD epochs on a distributed training table need shard_parallel => true',
                                     '0A000');
    END IF;
    IF workers > 0 THEN
        -- Opt-in model averaging over parallel partial scans (COMBINEFUNC).
        PERFORM set_config('max_parallel_workers_per_gather', workers::text, true);
        PERFORM set_config('parallel_setup_cost', '0', true);
        PERFORM set_config('parallel_tuple_cost', '0', true);
        PERFORM set_config('min_parallel_table_scan_size', '0', true);
    END IF;
    IF r.spec->>'sampling' IN ('poisson', 'replacement') THEN
        st := dpsql_internal._sampled_epoch(r);  -- private runs only (the definer's rights)
    ELSIF r.spec->>'permutation' = 'fresh' AND r.epochs_done > 0 THEN
        -- A new data-independent permutation for this pass: the epoch number mixed into the seed.
        EXECUTE format('SELECT dpsql.sgd_epoch(x, y, $1 ORDER BY dpsql_internal._shuffle_key($2, rid)) FROM %s',
                       r.train_table)
           INTO st USING r.state, (r.spec->>'seed')::bigint # (r.epochs_done::bigint << 40);
    ELSE
        EXECUTE format('SELECT dpsql.sgd_epoch(x, y, $1) FROM %s', r.train_table) INTO st USING r.state;
    END IF;
    info := dpsql_internal._sgd_info(st);
    epoch := r.epochs_done + 1;
    objective := info.objective;
    prev := r.losses[cardinality(r.losses)];
    tol := (r.spec->>'tolerance')::float8;
    done := epoch >= (r.spec->>'epochs')::int
            OR (tol IS NOT NULL AND prev IS NOT NULL
                AND abs(prev - objective) <= tol * greatest(abs(prev), 1e-300));
    UPDATE dpsql.runs
       SET state = st, epochs_done = epoch, losses = losses || objective, done = _run_epoch.done,
           train_seconds = runs.train_seconds + extract(epoch FROM clock_timestamp() - t0)
     WHERE runs.run_id = _run_epoch.run_id;
    IF (r.spec->>'private')::boolean THEN  -- (non-private runs report their objective)
        PERFORM dpsql_internal._progress('epoch', epoch, (r.spec->>'epochs')::int);
    END IF;
END $$;

-- Store the run's model with its provenance, drop its training table, forget its state.
-- released (private runs): the noisy weights to store instead of the state's; privacy: the
-- mechanism's record (mechanism, dataset_id, epsilon, delta, sensitivity, noise_scale, ...).
CREATE OR REPLACE FUNCTION dpsql_internal._finish(run_id bigint, released float8[] DEFAULT NULL,
                              privacy jsonb DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    r dpsql.runs;
    s jsonb;
    info record;
    w float8[];
    d int;
    mid bigint;
    fit_icpt boolean;
BEGIN
    r := dpsql_internal._locked_run(run_id);
    IF r.epochs_done = 0 THEN
        PERFORM dpsql_internal._fail(format('training run %s has not run any epoch', run_id));
    END IF;
    s := r.spec;
    info := dpsql_internal._sgd_info(r.state);
    w := coalesce(released, dpsql_internal._sgd_weights(r.state));
    IF (s->>'private')::boolean AND (released IS NULL OR privacy IS NULL) THEN
        PERFORM dpsql_internal._fail('a private run can only finish with a released (noisy) model', 'XX000');
    END IF;
    d := (s->>'dim')::int;
    fit_icpt := (s->>'intercept')::boolean;
    INSERT INTO dpsql.model_store (
        created_by, source, features, label, model, classes, n_features, fit_intercept, coef, intercept,
        weights, flags, epochs, epochs_run, batch_size, lambda, schedule, step_size, step_offset,
        radius, huber_h, row_norm, shuffle, seed, seed_policy, rows, dropped_rows, clipped_rows,
        train_loss, loss_history, prepare_seconds, train_seconds, privacy, dataset_id, epsilon,
        delta, sensitivity, noise_scale, params)
    VALUES (
        -- a private release runs as the extension owner: its model is the caller's, like
        -- its ledger entry (the login role)
        CASE WHEN privacy IS NULL THEN current_user ELSE session_user END,
        s->>'source', ARRAY(SELECT jsonb_array_elements_text(s->'features')), s->>'label',
        s->>'model',
        CASE WHEN s->'classes' <> 'null' THEN ARRAY(SELECT jsonb_array_elements_text(s->'classes'))::float8[] END,
        d, fit_icpt,
        CASE WHEN array_ndims(w) = 1 THEN w[1:d] ELSE w[:][1:d] END,
        CASE WHEN NOT fit_icpt THEN NULL
             WHEN array_ndims(w) = 1 THEN ARRAY[w[d + 1]]
             ELSE ARRAY(SELECT w[i][d + 1] FROM generate_series(1, array_length(w, 1)) i) END,
        w, (s->>'flags')::int, (s->>'epochs')::int, r.epochs_done, (s->>'batch_size')::bigint,
        (s->>'lambda')::float8, s->>'schedule', (s->>'step_size')::float8,
        (s->>'step_offset')::float8, (s->>'radius')::float8, (s->>'huber_h')::float8,
        s->>'row_norm', (s->>'shuffle')::boolean, (s->>'seed')::bigint, s->>'seed_policy',
        r.rows, info.dropped,
        -- Diagnostics computed from the data are not released with a private model.
        CASE WHEN privacy IS NULL THEN info.clipped END,
        CASE WHEN privacy IS NULL THEN info.objective END,
        CASE WHEN privacy IS NULL THEN r.losses ELSE '{}' END,
        r.prepare_seconds, r.train_seconds, coalesce(privacy->>'mechanism', 'none'),
        (privacy->>'dataset_id')::bigint, (privacy->>'epsilon')::float8,
        (privacy->>'delta')::float8, (privacy->>'sensitivity')::float8,
        (privacy->>'noise_scale')::float8, s || coalesce(jsonb_build_object('privacy', privacy), '{}'))
    RETURNING model_id INTO mid;
    EXECUTE format('DROP TABLE %s', r.train_table);
    DELETE FROM dpsql.runs WHERE runs.run_id = _finish.run_id;
    RETURN mid;
END $$;

-- Abandon a run: drop its training table and state.
CREATE OR REPLACE FUNCTION dpsql_internal._abort(run_id bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    tbl text;
BEGIN
    DELETE FROM dpsql.runs WHERE runs.run_id = _abort.run_id RETURNING train_table INTO tbl;
    IF tbl IS NOT NULL THEN
        EXECUTE format('DROP TABLE IF EXISTS %s', tbl);
    END IF;
END $$;
------------------------------------------------------------------------------------------
-- The mechanism registry: one row per privacy mechanism, written by the mechanism's own file
-- (dpsql_internal._register_mechanism), read by the dispatch (_train_private), the defaults
-- (34_defaults.sql), refusal hints, dpsql.mechanisms() and the Python registry's test. Adding
-- a mechanism = its own SQL file (the row and a train function with the common signature; a
-- linear one: a plan and a fit function for _train_linear), its C in the core, its docs page
-- and its test module.
------------------------------------------------------------------------------------------

CREATE TABLE IF NOT EXISTS dpsql.mechanism_catalog (
    name           text PRIMARY KEY,
    -- dpsql_internal.<train_function>(ds dpsql.datasets, model text, privacy text, params jsonb,
    --                        epsilon float8, delta float8, noise_seed bigint) -> model_id
    train_function text NOT NULL,
    -- 'any': trains classifiers and regressions (the models column says which)
    task           text NOT NULL CONSTRAINT mechanism_catalog_task_check
                        CHECK (task IN ('classification', 'regression', 'any')),
    -- takes the SGD defaults of 34_defaults.sql (epochs, batch, step, clip)
    sgd_defaults   boolean NOT NULL,
    needs_delta    boolean NOT NULL,
    summary        text NOT NULL,
    docs           text NOT NULL,
    -- the keys of options => {...} it accepts (any other is refused)
    options        text[] NOT NULL,
    -- the plan-and-fit mechanisms' two halves, called by _train_planned (33_planned.sql):
    -- dpsql_internal.<plan_function>(privacy text, ds dpsql.datasets, n bigint, d int,
    --                       epsilon float8, delta float8, params jsonb) -> plan jsonb
    -- dpsql_internal.<fit_function>(train_table text, plan jsonb, noise_seed bigint,
    --                      OUT weights float8[], OUT info jsonb, OUT iterates float8[])
    plan_function  text,
    fit_function   text,
    -- the models it trains (canonical names, dpsql_internal._erm_model); NULL: the task's
    -- (classification: logistic, huber, multinomial; regression: linear)
    models         text[],
    -- the dpsql.train parameters it takes beyond every mechanism's (privacy, epsilon, delta,
    -- noise_seed, features, label, seed, intercept, model): any other one given is refused
    params         text[] NOT NULL DEFAULT '{}',
    -- how it runs on a Citus hash-distributed dataset (32_distributed.sql): 'sums' (its scans
    -- are exact sums, combined across shards before any noise), 'averaged' (SGD epochs average
    -- per-shard models; needs shard_parallel => true); NULL: refused there (sequential)
    distributed    text CONSTRAINT mechanism_catalog_distributed_check
                        CHECK (distributed IN ('sums', 'averaged'))
);
COMMENT ON TABLE dpsql.mechanism_catalog IS
    'The privacy mechanisms: dispatch, defaults and docs (written by each mechanism''s file)';

CREATE OR REPLACE FUNCTION dpsql_internal._register_mechanism(name text, train_function text, task text,
                                          sgd_defaults boolean, needs_delta boolean,
                                          summary text, docs text, options text[] DEFAULT '{}',
                                          plan_function text DEFAULT NULL,
                                          fit_function text DEFAULT NULL,
                                          models text[] DEFAULT NULL,
                                          params text[] DEFAULT '{}',
                                          distributed text DEFAULT NULL)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO dpsql.mechanism_catalog AS c
        VALUES (name, train_function, task, sgd_defaults, needs_delta, summary, docs, options,
                plan_function, fit_function, models, params, distributed)
    ON CONFLICT ON CONSTRAINT mechanism_catalog_pkey DO UPDATE
       SET train_function = excluded.train_function, task = excluded.task,
           sgd_defaults = excluded.sgd_defaults, needs_delta = excluded.needs_delta,
           summary = excluded.summary, docs = excluded.docs, options = excluded.options,
           plan_function = excluded.plan_function, fit_function = excluded.fit_function,
           models = excluded.models, params = excluded.params,
           distributed = excluded.distributed
$$;

-- The dpsql.train parameters a caller set away from their defaults (dpsql.train's private
-- branch passes them all in params): what a mechanism must take or refuse.
CREATE OR REPLACE FUNCTION dpsql_internal._given_params(params jsonb)
RETURNS text[] LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(array_agg(k ORDER BY k COLLATE "C"), '{}')
      FROM (VALUES
                ('epochs', params->>'epochs' IS NOT NULL),
                ('batch_size', params->>'batch_size' IS NOT NULL),
                ('lambda', coalesce((params->>'lambda')::float8, 0) <> 0),
                ('step_size', params->>'step_size' IS NOT NULL),
                ('schedule', params->>'schedule' IS NOT NULL),
                ('step_offset', coalesce((params->>'step_offset')::float8, 0) <> 0),
                ('radius', params->>'radius' IS NOT NULL),
                ('huber_h', coalesce((params->>'huber_h')::float8, 0.1) <> 0.1),
                ('clip_norm', params->>'clip_norm' IS NOT NULL),
                ('sampling', coalesce(params->>'sampling', 'shuffle') <> 'shuffle'),
                ('noise_multiplier', params->>'noise_multiplier' IS NOT NULL),
                ('bst14_noise', coalesce(params->>'bst14_noise', 'strict') <> 'strict'),
                ('steps', params->>'steps' IS NOT NULL),
                ('ci', params->>'ci' IS NOT NULL),
                ('ci_draws', params->>'ci_draws' IS NOT NULL),
                ('burn_in', params->>'burn_in' IS NOT NULL),
                ('options', coalesce(params->'options', 'null') <> 'null'),
                ('tuning_lambdas', coalesce(params->'tuning_lambdas', 'null') <> 'null'),
                ('tuning_epochs', coalesce(params->'tuning_epochs', 'null') <> 'null'),
                ('permutation', coalesce(params->>'permutation', 'once') <> 'once'),
                ('gaussian', coalesce(params->>'gaussian', 'analytic') <> 'analytic'),
                ('parallel_workers', coalesce((params->>'parallel_workers')::int, 0) <> 0),
                ('shard_parallel', coalesce((params->>'shard_parallel')::boolean, false)),
                ('labels', coalesce(params->'labels', 'null') <> 'null'),
                ('row_norm', coalesce(params->>'row_norm', 'none') <> 'none'))
           AS t(k, set_by_caller)
     WHERE set_by_caller
$$;

-- Refuse the parameters the mechanism does not take, rather than ignore them.
CREATE OR REPLACE FUNCTION dpsql_internal._refuse_unused_params(m dpsql.mechanism_catalog, params jsonb)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    unused text[] := ARRAY(SELECT u FROM (SELECT unnest(dpsql_internal._given_params(params))
                                          EXCEPT SELECT unnest(m.params)) s(u)
                            ORDER BY u COLLATE "C");
BEGIN
    IF unused && '{labels,row_norm}' THEN
        PERFORM dpsql_internal._fail('labels and row_norm of a private run are the registration''s',
                                     hint => 'Leave them at their defaults; the data owner registers them.');
    END IF;
    IF cardinality(unused) > 0 THEN
        PERFORM dpsql_internal._fail(
            format('%s does not take %s', m.name, array_to_string(unused, ', ')),
            hint => CASE WHEN cardinality(m.params) > 0
                         THEN format('It takes %s (and epsilon, delta, intercept, seed).',
                                     array_to_string(m.params, ', '))
                         ELSE 'It takes epsilon, delta, intercept and seed only.' END);
    END IF;
END $$;

-- A model name as the mechanisms know it: the loss's canonical name (20_sources.sql), or
-- 'lasso' (least squares in an L1 ball: a model of the mechanisms that list it).
CREATE OR REPLACE FUNCTION dpsql_internal._erm_model(model text)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN model = 'lasso' THEN 'lasso' ELSE dpsql_internal._canonical_model(model) END
$$;

-- The models a registered mechanism trains.
CREATE OR REPLACE FUNCTION dpsql_internal._mechanism_models(m dpsql.mechanism_catalog)
RETURNS text[] LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(m.models, CASE m.task WHEN 'regression' THEN '{linear}'::text[]
                                          ELSE '{logistic,huber,multinomial}'::text[] END)
$$;

-- The registry row of a mechanism; unknown names are refused with the list.
CREATE OR REPLACE FUNCTION dpsql_internal._mechanism(privacy text)
RETURNS dpsql.mechanism_catalog LANGUAGE plpgsql STABLE AS $$
DECLARE
    m dpsql.mechanism_catalog;
BEGIN
    SELECT * INTO m FROM dpsql.mechanism_catalog c WHERE c.name = privacy;
    IF NOT FOUND THEN
        PERFORM dpsql_internal._fail(
            format('unknown privacy mechanism %s', coalesce(quote_literal(privacy), 'NULL')),
            hint => 'Available: auto (chosen for you), '
                    || (SELECT string_agg(c.name, ', ' ORDER BY c.name COLLATE "C") FROM dpsql.mechanism_catalog c)
                    || '. SELECT * FROM dpsql.mechanisms() describes them.');
    END IF;
    RETURN m;
END $$;

-- What analysts may know of the registry.
CREATE OR REPLACE FUNCTION dpsql.mechanisms()
RETURNS TABLE (name text, task text, models text[], needs_delta boolean, params text[],
               options text[], distributed text, summary text, docs text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.name, c.task, dpsql_internal._mechanism_models(c), c.needs_delta, c.params,
           c.options, c.distributed, c.summary, c.docs
      FROM dpsql.mechanism_catalog c ORDER BY c.task COLLATE "C", c.name COLLATE "C"
$$;
COMMENT ON FUNCTION dpsql.mechanisms() IS
    'The privacy mechanisms dpsql.train accepts (privacy => name), with their task and docs';
------------------------------------------------------------------------------------------
-- Citus: a hash-distributed source trains on a distributed training table, colocated with it
-- and filled shard by shard, so that every scan is pushed down to the workers (docs/citus.md).
-- Nothing here needs Citus installed: its catalogs are read by dynamic SQL only when it is.
------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION dpsql_internal._citus_installed()
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')
$$;

-- The ledger, budgets and models live on the coordinator (workers hold empty copies of the
-- tables): a run started on a worker would be charged nowhere, so it is refused.
CREATE OR REPLACE FUNCTION dpsql_internal._refuse_on_worker()
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    coordinator boolean;
BEGIN
    IF dpsql_internal._citus_installed() THEN
        EXECUTE 'SELECT pg_catalog.citus_is_coordinator()' INTO coordinator;
        IF NOT coordinator THEN
            PERFORM dpsql_internal._fail('this is a Citus worker: train on the coordinator', '55000',
                                         'The privacy ledger and the budgets live on the coordinator.');
        END IF;
    END IF;
END $$;

-- The layout of a hash-distributed table: its distribution column (and type), shard count,
-- colocation group and the number of nodes holding its shards. NULL fields: not a
-- hash-distributed table (Citus absent, a local, reference or Citus-local table).
-- single_shard: a reference or Citus-local table (read whole, like a local table).
CREATE OR REPLACE FUNCTION dpsql_internal._citus_layout(rel regclass, OUT dist_column text,
                                                       OUT dist_type text, OUT shard_count int,
                                                       OUT colocation_id int, OUT nodes int,
                                                       OUT single_shard boolean)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    single_shard := false;
    IF rel IS NULL OR NOT dpsql_internal._citus_installed() THEN
        RETURN;
    END IF;
    EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = $1 AND partmethod = ''n'')'
       INTO single_shard USING rel;
    EXECUTE 'SELECT a.attname, format_type(a.atttypid, a.atttypmod), p.colocationid,
                    (SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid),
                    (SELECT count(DISTINCT pl.groupid) FROM pg_dist_shard s
                       JOIN pg_dist_placement pl USING (shardid) WHERE s.logicalrelid = p.logicalrelid)
               FROM pg_dist_partition p
               JOIN pg_attribute a ON a.attrelid = p.logicalrelid
                                  AND a.attname = column_to_column_name(p.logicalrelid, p.partkey)
              WHERE p.logicalrelid = $1 AND p.partmethod = ''h'''
       INTO dist_column, dist_type, colocation_id, shard_count, nodes USING rel;
END $$;

-- Whether reading a source runs a Citus plan over distributed tables. A relation (a view,
-- possibly of views) is answered from the catalogs: planning it could run its functions,
-- and private runs call this as the extension owner. A query (data owners' runs, with their
-- own rights) is planned.
CREATE OR REPLACE FUNCTION dpsql_internal._reads_citus(src text, rel regclass)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    plan text;
    found boolean;
BEGIN
    IF NOT dpsql_internal._citus_installed() THEN
        RETURN false;
    END IF;
    IF rel IS NOT NULL THEN
        EXECUTE 'WITH RECURSIVE deps(oid) AS (
                     SELECT $1::oid
                     UNION
                     SELECT d.refobjid FROM deps
                       JOIN pg_rewrite r ON r.ev_class = deps.oid
                       JOIN pg_depend d ON d.classid = ''pg_rewrite''::regclass AND d.objid = r.oid
                                       AND d.refclassid = ''pg_class''::regclass)
                 SELECT EXISTS (SELECT 1 FROM deps JOIN pg_dist_partition p ON p.logicalrelid = deps.oid
                                 WHERE p.partmethod = ''h'')'
           INTO found USING rel;
        RETURN found;
    END IF;
    EXECUTE format('EXPLAIN (FORMAT JSON) SELECT 1 FROM %s', src) INTO plan;
    RETURN plan LIKE '%"Custom Plan Provider": "Citus%';
END $$;

-- The training table of a hash-distributed source: (row_id, rid, x, y), distributed by row_id
-- and colocated with the source, filled by one INSERT ... SELECT that Citus pushes down to
-- every shard. Within a shard the rows are stored in the order of rid, a seeded key of the
-- row id (without shuffle: the row id itself), so a record's shard and position depend on its
-- row id and the seed only, never on its values. The row id is the distribution column, and
-- must be unique (a primary key or unique constraint on it alone).
CREATE OR REPLACE FUNCTION dpsql_internal._fill_distributed_table(
    run bigint, rel regclass, x_expr text, y_expr text, dim int, shuffle boolean,
    INOUT seed bigint, OUT train_table text, OUT rows bigint, OUT seed_policy text,
    OUT layout jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    l record := dpsql_internal._citus_layout(rel);
    id_expr text;
    key text;
    fill text;
    plan text;
BEGIN
    IF NOT dpsql_internal._runs_no_code(rel) THEN
        PERFORM dpsql_internal._fail(format('distributed source %s runs code when read (rules, policies '
                                            'or a non-table)', rel), '0A000');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a
                     ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                    WHERE i.indrelid = rel AND i.indisunique AND i.indnkeyatts = 1
                      AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = l.dist_column) THEN
        PERFORM dpsql_internal._fail(
            format('distributed source %s needs a unique row id: its distribution column %I with a '
                   'primary key or unique constraint of its own', rel, l.dist_column), '0A000',
            'The row id fixes each row''s shard and its place in the seeded order.');
    END IF;
    id_expr := format('src.%I', l.dist_column);
    -- 64-bit input of the shuffle key; ties (hash collisions) are broken by the id itself
    key := CASE WHEN l.dist_type IN ('bigint', 'integer', 'smallint') THEN id_expr || '::bigint'
                ELSE format('hashtextextended(%s::text, 0)', id_expr) END;
    seed_policy := 'none';
    IF shuffle THEN
        seed_policy := CASE WHEN seed IS NULL THEN 'random' ELSE 'user' END;
        seed := coalesce(seed, dpsql_internal._random_seed());
        key := format('dpsql_internal._shuffle_key(%s, %s)', seed, key);
    ELSE
        seed := NULL;
    END IF;
    train_table := format('dpsql_work.%I', 'train_' || run);
    -- parallel_workers = 0: a shard is scanned by one process, in its stored order
    EXECUTE format('CREATE UNLOGGED TABLE %s (row_id %s NOT NULL, rid bigint NOT NULL, x float8[], '
                   'y float8) WITH (autovacuum_enabled = false, parallel_workers = 0)',
                   train_table, l.dist_type);
    EXECUTE format('ALTER TABLE %s ALTER COLUMN x SET STORAGE %s', train_table,
                   CASE WHEN dim <= 1000 THEN 'PLAIN' ELSE 'EXTERNAL' END);
    PERFORM create_distributed_table(train_table, 'row_id', colocate_with => rel::text);
    fill := format('INSERT INTO %s (row_id, rid, x, y) SELECT %s, %s, %s, %s FROM %s AS src '
                   'ORDER BY 2, 1', train_table, id_expr, key, x_expr, y_expr, rel);
    -- Guard: one task per shard pair, or nothing (Citus would otherwise pull every row to the
    -- coordinator, or repartition them, without saying so).
    EXECUTE 'EXPLAIN (FORMAT JSON) ' || fill INTO plan;
    IF plan LIKE '%"INSERT/SELECT method"%' THEN
        -- (the plan itself stays here: it holds the seed)
        PERFORM dpsql_internal._fail(format('Citus cannot push the training table''s fill down to the shards of %s',
                                            rel), 'XX000',
                                     'A volatile expression over the columns stops the pushdown.');
    END IF;
    EXECUTE fill;
    GET DIAGNOSTICS rows = ROW_COUNT;
    layout := jsonb_build_object('distribution_column', l.dist_column, 'shard_count', l.shard_count,
                                 'nodes', l.nodes, 'colocation_id', l.colocation_id,
                                 'order', CASE WHEN shuffle THEN 'seeded key of the row id'
                                               ELSE 'row id' END);
END $$;

-- An empty table shaped like a training table, for a derived copy (e.g. whitened rows):
-- distributed and colocated with it when it is. Returns its column list before x.
CREATE OR REPLACE FUNCTION dpsql_internal._derived_training_table(train_table text, name text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    l record := dpsql_internal._citus_layout(train_table::regclass);
BEGIN
    EXECUTE format('CREATE UNLOGGED TABLE %s (LIKE %s INCLUDING STORAGE) '
                   'WITH (autovacuum_enabled = false)', name, train_table);
    IF l.dist_column IS NULL THEN
        RETURN 'rid';
    END IF;
    EXECUTE format('ALTER TABLE %s SET (parallel_workers = 0)', name);
    PERFORM create_distributed_table(name, 'row_id', colocate_with => train_table);
    RETURN 'row_id, rid';
END $$;

-- Which mechanisms may run on a hash-distributed dataset (the registry's distributed column),
-- checked before anything is read or charged.
CREATE OR REPLACE FUNCTION dpsql_internal._check_distributed(mech dpsql.mechanism_catalog,
                                                            ds dpsql.datasets, params jsonb)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    l record := dpsql_internal._citus_layout(ds.relid);
    shard_parallel boolean := coalesce((params->>'shard_parallel')::boolean, false);
BEGIN
    IF l.dist_column IS NULL THEN
        IF shard_parallel THEN
            PERFORM dpsql_internal._fail(format('shard_parallel => true needs a Citus distributed dataset; '
                                                '%s is not distributed', ds.name));
        END IF;
        RETURN;
    END IF;
    IF mech.distributed IS NULL THEN
        PERFORM dpsql_internal._fail(
            format('%s is sequential: it does not run on the distributed dataset %s (its rows would '
                   'have to be pulled to the coordinator)', mech.name, ds.name), '0A000',
            'Mechanisms that run on Citus: ' || (SELECT string_agg(c.name, ', ' ORDER BY c.name COLLATE "C")
                                                   FROM dpsql.mechanism_catalog c
                                                  WHERE c.distributed IS NOT NULL)
            || '. See docs/citus.md.');
    END IF;
    IF mech.distributed = 'averaged' AND NOT shard_parallel THEN
        PERFORM dpsql_internal._fail(
            format('%s on the distributed dataset %s trains one model per shard and averages them: '
                   'pass shard_parallel => true to accept that', mech.name, ds.name), '0A000',
            'docs/citus.md states the privacy argument and what averaging costs in accuracy.');
    END IF;
END $$;
------------------------------------------------------------------------------------------
-- Mechanisms as a plan and a fit: the linear-regression mechanisms (40_linear.sql) and the
-- private-ERM toolbox (45_*.sql onwards). The mechanism's plan function computes every public
-- number it uses (noise scales, step counts, regularisers) from n, d, the registration and
-- the analyst's parameters, never from the data; its fit function scans the training table
-- and releases. _train_planned runs them in one transaction: prepare, plan, charge, fit,
-- finish. A failure anywhere releases and charges nothing; a fit that returns no weights (its
-- certificate failed) releases nothing and keeps the charge.
--   plan: dpsql_internal.<plan_function>(privacy text, ds dpsql.datasets, n bigint, d int,
--                                         epsilon float8, delta float8, params jsonb) -> jsonb
--         (params->>'model' is the canonical model, params->'classes' the mapped label set;
--          the plan's 'info' goes into the model's provenance)
--   fit:  dpsql_internal.<fit_function>(train_table text, plan jsonb, noise_seed bigint,
--                                        OUT weights float8[], OUT info jsonb,
--                                        OUT iterates float8[])
------------------------------------------------------------------------------------------

-- The analyst's options => {...}, checked against the mechanism's registered keys.
CREATE OR REPLACE FUNCTION dpsql_internal._plan_options(privacy text, params jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    options jsonb := nullif(params->'options', 'null');
    known text[] := (dpsql_internal._mechanism(privacy)).options;
    unknown text;
BEGIN
    IF options IS NOT NULL AND jsonb_typeof(options) <> 'object' THEN
        PERFORM dpsql_internal._fail('options must be a JSON object');
    END IF;
    SELECT string_agg(k, ', ') INTO unknown
      FROM jsonb_object_keys(coalesce(options, '{}')) k WHERE k <> ALL (known);
    IF unknown IS NOT NULL THEN
        PERFORM dpsql_internal._fail(format('unknown options for %s: %s', privacy, unknown),
                            hint => CASE WHEN cardinality(known) > 0
                                         THEN 'Known: ' || array_to_string(known, ', ') || '.'
                                         ELSE privacy || ' takes no options.' END);
    END IF;
    RETURN options;
END $$;

-- Train a plan-and-fit mechanism on a registered dataset and release the model. Called by
-- _train_private (SECURITY DEFINER) after its checks, directly or through a task's own checks
-- (_train_linear). Charged before the fit touches the data, in the release's transaction.
CREATE OR REPLACE FUNCTION dpsql_internal._train_planned(ds dpsql.datasets, model text, privacy text,
                                                params jsonb, epsilon float8, delta float8,
                                                noise_seed bigint)
RETURNS bigint LANGUAGE plpgsql
SET max_parallel_workers_per_gather = 0
SET synchronize_seqscans = off
AS $$
DECLARE
    mech dpsql.mechanism_catalog := dpsql_internal._mechanism(privacy);
    canonical text := dpsql_internal._erm_model(model);
    run bigint;
    r dpsql.runs;
    plan jsonb;
    entry bigint;
    rel record;
    mid bigint;
BEGIN
    IF mech.plan_function IS NULL OR mech.fit_function IS NULL THEN
        PERFORM dpsql_internal._fail(format('%s is not a plan-and-fit mechanism', privacy), 'XX000');
    END IF;
    run := dpsql_internal._prepare_private(ds, CASE WHEN canonical = 'lasso' THEN 'linear' ELSE model END,
                                           params);
    r := dpsql_internal._locked_run(run);
    EXECUTE format('SELECT dpsql_internal.%I($1, $2, $3, $4, $5, $6, $7)', mech.plan_function)
       INTO plan USING privacy, ds, r.rows, (r.spec->>'dim')::int, epsilon, delta,
                       params || jsonb_build_object('model', canonical, 'classes', r.spec->'classes');
    entry := dpsql_internal._charge(ds.dataset_id, epsilon, delta, privacy);
    EXECUTE format('SELECT * FROM dpsql_internal.%I($1, $2, $3)', mech.fit_function)
       INTO rel USING r.train_table, plan, noise_seed;
    IF rel.weights IS NULL THEN
        -- The fit could not certify what its proof needs (an exact minimiser): nothing is
        -- released, and the budget stays spent (whether it converged depends on the data).
        PERFORM dpsql_internal._abort(run);
        -- (the fit's diagnostics depend on the data: they are not shown)
        RAISE WARNING 'dpsql: % released nothing: its solver did not certify the minimiser; '
                      'the budget of this call is spent', privacy
            USING HINT = 'Raise options.max_scans, or lambda (a better conditioned objective).';
        RETURN NULL;
    END IF;
    UPDATE dpsql.runs SET epochs_done = 1, done = true WHERE runs.run_id = run;
    mid := dpsql_internal._finish(run, rel.weights, (plan->'info') || rel.info || jsonb_build_object(
        'mechanism', privacy, 'model', canonical, 'dataset_id', ds.dataset_id, 'epsilon', epsilon,
        'delta', delta, 'ledger_entry', entry,
        'noise_seed', dpsql_internal._noise_source(noise_seed)));
    IF rel.iterates IS NOT NULL THEN
        INSERT INTO dpsql.model_iterates (model_id, iterates) VALUES (mid, rel.iterates);
    END IF;
    PERFORM dpsql_internal._set_ledger_model(entry, mid);
    RETURN mid;
END $$;
------------------------------------------------------------------------------------------
-- Default hyperparameters of the private SGD mechanisms, chosen from public quantities only:
-- the registration (dimension, classes, norm and label bounds), the public row count m,
-- epsilon and delta; never from the data, so they cost nothing. A caller's own values are
-- kept: only parameters left NULL are filled in, and the model records which (privacy ->
-- defaults). docs/defaults.md gives the rule and why; bench/RESULTS.md (auto_defaults) the
-- measurements.
------------------------------------------------------------------------------------------

-- The bolt-on's target for the expected norm of its noise: in units of the rows' norm bound
-- (1), a logit moves by about target / sqrt(dim). Fixed once from the bolt-on benchmarks; the
-- step then follows from the public sensitivity (docs/defaults.md).
-- The default clip norm of least squares, whose gradient (x^T w - y) x has no bound: the label
-- bound B, the public scale of a residual (clipping near the typical gradient, not the
-- largest, as adaptive clipping finds), i.e. rows with |residual| ||x|| <= B are not clipped.
-- DP-SGD, DPSGD-F (below) and DP-FTRL (46_dp_ftrl.sql) use it.
CREATE OR REPLACE FUNCTION dpsql_internal._least_squares_clip(ds dpsql.datasets)
RETURNS float8 LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(ds.label_bound, 1)
$$;

CREATE OR REPLACE FUNCTION dpsql_internal._bolton_noise_target()
RETURNS float8 LANGUAGE sql IMMUTABLE AS 'SELECT 8.0::float8';

-- The step 1/(2 beta), beta the loss's tight smoothness over rows of norm <= r (the core's
-- loss_constants give the bolt-on paper's looser beta = 1 for logistic and multinomial):
-- logistic r^2/4, multinomial r^2/2, Huber r^2/(2h), least squares r^2.
CREATE OR REPLACE FUNCTION dpsql_internal._default_step(canonical text, huber_h float8, r float8)
RETURNS float8 LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE canonical WHEN 'logistic' THEN 2.0 WHEN 'multinomial' THEN 1.0
                          WHEN 'huber' THEN huber_h ELSE 0.5 END / (r * r)
$$;

-- The expected norm of a k-dimensional noise draw per unit of sensitivity: the Gamma-norm
-- noise (epsilon-DP) has norm ~ Gamma(k, 1/epsilon), mean k/epsilon; the Gaussian sigma sqrt(k).
CREATE OR REPLACE FUNCTION dpsql_internal._unit_noise_norm(k int, epsilon float8, delta float8)
RETURNS float8 LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN delta > 0 THEN dpsql.gaussian_sigma(1, epsilon, delta) * sqrt(k)
                ELSE k / epsilon END
$$;

-- The expected norm of the noise on one step's mean gradient with batch b, for the white-box
-- mechanisms (the per-step noise of 36_whitebox.sql), in units of the gradient bound.
CREATE OR REPLACE FUNCTION dpsql_internal._step_noise(privacy text, params jsonb, m bigint, b bigint, k int)
RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
    epsilon float8 := (params->>'epsilon')::float8;
    delta float8 := coalesce((params->>'delta')::float8, 0);
    epochs int := (params->>'epochs')::int;
BEGIN
    IF privacy = 'dpsgd' THEN
        -- shuffled disjoint batches: k Gaussian mechanisms per row, noise multiplier z of C
        -- (the caller's, or calibrated to epsilon)
        RETURN coalesce((params->>'noise_multiplier')::float8, (dpsql_internal._account(jsonb_build_object(
            'op', 'calibrate', 'scheme', 'shuffle', 'delta', delta, 'target_epsilon', epsilon,
            'noise_multiplier', NULL, 'epochs', epochs, 'steps', NULL, 'sampling_rate', NULL))
            ->>'noise_multiplier')::float8) * sqrt(k) / b;
    ELSIF privacy = 'scs13' THEN
        -- (epsilon, delta) / epochs per pass on the sum, sensitivity 2 L
        RETURN 2 * dpsql_internal._unit_noise_norm(k, epsilon / epochs, delta / epochs) / b;
    ELSIF privacy = 'bst14' THEN
        -- replace-one: sensitivity 2 L
        RETURN 2 * (dpsql_internal._bst14_noise(epsilon, delta, m, b, epochs)).sigma * sqrt(k) / b;
    END IF;
    RETURN 0;
END $$;

CREATE OR REPLACE FUNCTION dpsql_internal._private_defaults(ds dpsql.datasets, model text, privacy text,
                                        params jsonb, m bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    canonical text := dpsql_internal._canonical_model(model);
    epsilon float8 := (params->>'epsilon')::float8;
    delta float8 := coalesce((params->>'delta')::float8, 0);
    lambda float8 := coalesce((params->>'lambda')::float8, 0);
    huber_h float8 := coalesce((params->>'huber_h')::float8, 0.1);
    classes int := greatest(cardinality(ds.labels), 2);
    ovr boolean := canonical IN ('logistic', 'huber') AND classes > 2;  -- one-vs-rest bolt-on
    -- the model's dimension: one weight vector per class for multinomial, plus the intercept
    k int := (ds.dim + coalesce((params->>'intercept')::boolean, false)::int)
             * CASE WHEN canonical = 'multinomial' THEN classes ELSE 1 END;
    -- rows have norm <= 1 for the classifiers (registration); regression: the public bound
    r float8 := CASE WHEN canonical = 'linear'
                     THEN sqrt(coalesce(ds.row_bound, 1) ^ 2
                               + coalesce((params->>'intercept')::boolean, false)::int)
                     ELSE 1 END;
    c record := dpsql.loss_constants(canonical, 0, 0, huber_h);
    filled jsonb := '{}';
    all_params jsonb;
    b bigint;
    step float8;
BEGIN
    -- Called for the registry's SGD mechanisms (sgd_defaults) after _train_private checked
    -- epsilon (NULL only for DP-SGD given a noise multiplier); the linear mechanisms' plans are
    -- their specs' (40_linear.sql).
    IF (params->>'epochs')::int < 1 THEN  -- the rules below divide by it; _prepare says the same
        PERFORM dpsql_internal._fail(format('epochs must be >= 1, got %s', params->>'epochs'));
    END IF;
    IF params->>'epochs' IS NULL THEN
        -- SCS13 composes its passes basically: its batch grows with the epochs and its steps
        -- do not, so one pass. Poisson-sampled DP-SGD (and DPSGD-F): ceil(10 epsilon) passes,
        -- at most 10; below epsilon = 1 the noise multiplier grows fast as epsilon shrinks,
        -- and its noise piles up in the last iterate faster than more passes add signal.
        -- The others: 10 passes, more steps for the same noise.
        filled := filled || jsonb_build_object('epochs', CASE
            WHEN privacy = 'scs13' THEN 1
            WHEN privacy = 'dpsgd_f' OR (privacy = 'dpsgd' AND params->>'sampling' = 'poisson')
                THEN least(10, greatest(1, ceil(10 * epsilon)))::int
            ELSE 10 END);
    END IF;
    IF privacy IN ('dpsgd', 'dpsgd_f') AND params->>'clip_norm' IS NULL THEN
        -- the loss's gradient bound L; least squares has none (_least_squares_clip)
        filled := filled || jsonb_build_object('clip_norm', CASE WHEN canonical = 'linear'
                                                               THEN dpsql_internal._least_squares_clip(ds)
                                                               ELSE c.lipschitz_data END);
    END IF;
    all_params := params || filled;
    IF params->>'batch_size' IS NULL THEN
        -- The smallest batch >= 50 whose mean gradient's expected noise norm is at most a
        -- quarter of the gradient bound, doubling, with at least 50 steps an epoch: shuffled
        -- DP-SGD, SCS13 and BST14, whose noise on the mean falls with the batch (the steps only
        -- with its square root or not at all). Poisson DP-SGD, DPSGD-F and the bolt-on get 50
        -- (step noise 0): amplification by sampling makes the noise on the mean grow as the
        -- batch shrinks, so small batches only add steps.
        b := 50;
        WHILE b * 2 <= m / 50
              AND dpsql_internal._step_noise(CASE WHEN privacy = 'dpsgd'
                                              AND coalesce(params->>'sampling', 'shuffle') <> 'shuffle'
                                         THEN 'poisson' ELSE privacy END,
                                    all_params, m, b, k) > 0.25 LOOP
            b := b * 2;
        END LOOP;
        filled := filled || jsonb_build_object('batch_size', greatest(1, least(b, m / 10)));
    END IF;
    all_params := params || filled;
    IF params->>'step_size' IS NULL AND params->>'schedule' IS NULL AND lambda = 0 THEN
        -- Constant step; SCS13 and BST14 keep their papers' 1/sqrt(t) schedules, lambda > 0
        -- the strongly convex decreasing one.
        step := dpsql_internal._default_step(canonical, huber_h, r);
        IF privacy = 'bolton' THEN
            -- Algorithm 1 (convex, constant step): the sensitivity is linear in eta (2 k L eta
            -- / b); the step whose release has the target expected noise norm, at most 1/(2 beta).
            step := least(step, dpsql_internal._bolton_noise_target() / c.smoothness
                                / dpsql.bolton_sensitivity('constant', 1 / c.smoothness, 0, c.lipschitz,
                                                           c.smoothness, 0, m,
                                                           (all_params->>'batch_size')::bigint,
                                                           (all_params->>'epochs')::int)
                                / dpsql_internal._unit_noise_norm(CASE WHEN ovr THEN ds.dim ELSE k END,
                                                         epsilon / CASE WHEN ovr THEN classes ELSE 1 END,
                                                         delta / CASE WHEN ovr THEN classes ELSE 1 END));
        END IF;
        IF privacy IN ('bolton', 'dpsgd', 'dpsgd_f') THEN
            filled := filled || jsonb_build_object('step_size', step);
        END IF;
    END IF;
    IF privacy = 'bst14' AND lambda = 0 AND params->>'radius' IS NULL THEN
        -- Algorithm 4's domain: with rows of norm <= 1 a model of norm 10 reaches logits of
        -- +-10 (probabilities within 5e-5 of 0 and 1); beyond it the loss is flat.
        filled := filled || jsonb_build_object('radius', 10);
    END IF;
    RETURN params || filled || jsonb_build_object('defaults', filled);
END $$;
------------------------------------------------------------------------------------------
-- Private training: bolt-on output perturbation (spec 003), released by the server
------------------------------------------------------------------------------------------

-- Algorithm 1 or 2 of the bolt-on paper for the run's loss and schedule, its sensitivity
-- (C core closed forms) and the noise it needs; the noiseless state never leaves the server.
CREATE OR REPLACE FUNCTION dpsql_internal._bolton_mechanism(spec jsonb, rows bigint, epsilon float8, delta float8,
                                        calibration text, OUT per_output boolean,
                                        OUT model_epsilon float8, OUT model_delta float8,
                                        OUT sensitivity float8, OUT algorithm text,
                                        OUT lipschitz float8)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    model text := spec->>'model';
    lambda float8 := (spec->>'lambda')::float8;
    radius float8 := coalesce((spec->>'radius')::float8, 0);
    c record;
    outputs int := coalesce(jsonb_array_length(spec->'classes'), 1);
    schedule text := spec->>'schedule';
BEGIN
    IF lambda > 0 AND radius = 0 THEN
        PERFORM dpsql_internal._fail('a strongly convex bolt-on run (lambda > 0) needs the ball ||w|| <= radius',
                            hint => 'Leave radius unset with schedule => ''decreasing'' (R = 1/lambda), or give one.');
    END IF;
    c := dpsql.loss_constants(model, lambda, radius, coalesce((spec->>'huber_h')::float8, 0.1));
    lipschitz := c.lipschitz;
    -- Parallel epochs (parallel_workers, or Citus shards) average shard models with weights
    -- n_s/m <= 1: the convex constant-step bound 2kL eta/b still holds (docs/citus.md); the
    -- other closed forms are not derived for averaging.
    IF (coalesce((spec->>'parallel_workers')::int, 0) > 0
        OR coalesce((spec->>'shard_parallel')::boolean, false))
       AND NOT (lambda = 0 AND schedule = 'constant') THEN
        PERFORM dpsql_internal._fail('parallel bolt-on runs need the convex constant-step algorithm (lambda = 0)');
    END IF;
    sensitivity := dpsql.bolton_sensitivity(
        schedule, coalesce((spec->>'step_size')::float8, 0), (spec->>'step_offset')::float8,
        c.lipschitz, c.smoothness, c.strong_convexity, rows, (spec->>'batch_size')::bigint,
        (spec->>'epochs')::int, spec->>'permutation' = 'fresh');
    algorithm := CASE WHEN lambda > 0 AND schedule = 'decreasing' THEN 'Algorithm 2 (strongly convex)'
                      WHEN lambda > 0 THEN 'strongly convex, ' || schedule || ' step'
                      ELSE 'Algorithm 1 (convex), ' || schedule || ' step' END;
    -- One-vs-rest: C binary models, each on all the data: split the budget evenly (spec 003 s. 8).
    per_output := model IN ('logistic', 'huber') AND outputs > 2;
    model_epsilon := CASE WHEN per_output THEN epsilon / outputs ELSE epsilon END;
    model_delta := CASE WHEN per_output THEN delta / outputs ELSE delta END;
    IF delta > 0 AND calibration = 'classic' AND model_epsilon >= 1 THEN
        PERFORM dpsql_internal._fail(format('the classic Gaussian mechanism (eq. 4) needs epsilon < 1 per model, got %s',
                                   model_epsilon), hint => 'Use gaussian => ''analytic'' (the default).');
    END IF;
END $$;

-- Train a prepared private run for its fixed number of epochs and release it: the weights
-- with bolt-on noise and the mechanism's record. The noiseless state stays in dpsql.runs.
CREATE OR REPLACE FUNCTION dpsql_internal._bolton_fit(run bigint, epsilon float8, delta float8, calibration text,
                                  noise_seed bigint, OUT weights float8[], OUT info jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    r dpsql.runs := dpsql_internal._locked_run(run);
    mech record := dpsql_internal._bolton_mechanism(r.spec, r.rows, epsilon, delta, calibration);
    rel record;
    e record;
    draw int;
    noise_norm float8;
    lambda float8;
    reachable float8;
BEGIN
    LOOP
        e := dpsql_internal._run_epoch(run);  -- its training loss stays here
        EXIT WHEN e.done;
    END LOOP;
    r := dpsql_internal._locked_run(run);
    rel := dpsql_internal._bolton_release(r.state, dpsql_internal._audit_sensitivity(r.spec, r.rows, mech.sensitivity),
                                 mech.model_epsilon, mech.model_delta,
                                 mech.per_output, calibration, noise_seed);
    weights := rel.weights;
    -- Public: one noise draw's expected norm (Gamma(k, scale) has mean k scale; a Gaussian
    -- vector about sigma sqrt(k)) against the largest norm a regularised model reaches,
    -- lambda/2 ||w||^2 <= F(0) = phi(0).
    draw := cardinality(weights) / CASE WHEN mech.per_output THEN array_length(weights, 1) ELSE 1 END;
    noise_norm := CASE WHEN delta = 0 THEN draw * rel.noise_scale ELSE rel.noise_scale * sqrt(draw) END;
    lambda := (r.spec->>'lambda')::float8;
    IF lambda > 0 THEN
        reachable := sqrt(2 * CASE r.spec->>'model' WHEN 'logistic' THEN ln(2)
                                   WHEN 'multinomial' THEN ln(jsonb_array_length(r.spec->'classes'))
                                   ELSE 1 END / lambda);
        reachable := least(reachable, coalesce((r.spec->>'radius')::float8, reachable));
        IF noise_norm > reachable THEN
            RAISE WARNING 'dpsql: the bolt-on noise (expected norm %) exceeds the largest norm a model with lambda = % reaches (%): the release is mostly noise',
                          round(noise_norm::numeric, 3), lambda, round(reachable::numeric, 3)
                USING HINT = 'The noise falls as 1/lambda and the reachable norm as 1/sqrt(lambda): '
                             'raise lambda or epsilon, or use privacy => ''auto''.';
        END IF;
    END IF;
    info := jsonb_build_object(
        'mechanism', 'bolton', 'algorithm', mech.algorithm, 'epsilon', epsilon, 'delta', delta,
        'sensitivity', mech.sensitivity, 'noise_scale', rel.noise_scale,
        'lipschitz', mech.lipschitz,
        'noise', CASE WHEN delta = 0 THEN 'gamma-norm (eq. 3), uniform direction'
                      ELSE 'gaussian (' || calibration || ')' END,
        'expected_noise_norm', noise_norm, 'reachable_norm', reachable,
        'one_vs_rest', mech.per_output, 'model_epsilon', mech.model_epsilon,
        'model_delta', mech.model_delta, 'neighbouring', 'replace-one, m public',
        'noise_seed', dpsql_internal._noise_source(noise_seed));
END $$;

-- Weights back from their jsonb form (1-D, or 2-D for several outputs).
CREATE OR REPLACE FUNCTION dpsql_internal._jsonb_weights(j jsonb)
RETURNS float8[] LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT CASE WHEN jsonb_typeof(j->0) = 'array'
                THEN (SELECT array_agg(ARRAY(SELECT v::float8 FROM jsonb_array_elements_text(r) v)
                                       ORDER BY i)
                        FROM jsonb_array_elements(j) WITH ORDINALITY AS t(r, i))
                ELSE ARRAY(SELECT v::float8 FROM jsonb_array_elements_text(j) v) END
$$;

-- Classification errors of released weights on the rows rid in (lo, hi] of a training table.
CREATE OR REPLACE FUNCTION dpsql_internal._errors(train_table text, model text, flags int, weights float8[],
                              lo bigint, hi bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    EXECUTE format('SELECT count(*) FILTER (WHERE NOT (%s)) FROM ('
                   '  SELECT dpsql_internal._predict(%s, %s, $1, x) AS p, y FROM %s'
                   '   WHERE rid > $2 AND rid <= $3) e',
                   CASE WHEN array_ndims(weights) = 2 THEN 'p IS NOT DISTINCT FROM y'
                        ELSE format('coalesce(dpsql_internal._is_positive(%s, p) = (y > 0), false)',
                                    dpsql_internal._loss_code(model)) END,
                   dpsql_internal._loss_code(model), flags, train_table)
       INTO n USING weights, lo, hi;
    RETURN n;
END $$;

-- A private run's training table and initial state from a registered dataset: the data owner's
-- source, columns, labels, bounds and row normalisation; the analyst's numbers from params.
-- The data is read as float8 columns (or one float8[]) of the registered dimension: nothing is
-- probed. A view, foreign table or inheritance tree is read through dpsql_internal._read_source (as
-- dpsql_reader, never as a superuser); a plain table or materialized view directly.
CREATE OR REPLACE FUNCTION dpsql_internal._prepare_private(ds dpsql.datasets, model text, params jsonb)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    types text[] := CASE WHEN dpsql_internal._array_feature(ds) THEN '{double precision[]}'
                         ELSE array_fill('double precision'::text, ARRAY[cardinality(ds.features)]) END;
BEGIN
    IF ds.dim IS NULL THEN
        PERFORM dpsql_internal._fail(format('dataset %s was registered without a known dimension', ds.name),
                            hint => 'Register it again with dim => the length of its feature array.');
    END IF;
    RETURN dpsql_internal._prepare(
        source => 'SELECT * FROM ' || dpsql_internal._private_from(ds),
        feature_types => types, dim => ds.dim,
        features => ds.features, label => ds.label, model => model,
        epochs => coalesce((params->>'epochs')::int, 10),
        batch_size => coalesce((params->>'batch_size')::bigint, 1),
        lambda => coalesce((params->>'lambda')::float8, 0),
        step_size => (params->>'step_size')::float8,
        schedule => coalesce(params->>'schedule',
                             CASE WHEN coalesce((params->>'lambda')::float8, 0) > 0
                                  THEN 'decreasing' ELSE 'constant' END),
        step_offset => coalesce((params->>'step_offset')::float8, 0),
        radius => (params->>'radius')::float8, shuffle => true, seed => (params->>'seed')::bigint,
        -- regression (DP-SGD): the registered label set does not apply
        labels => CASE WHEN dpsql_internal._canonical_model(model) = 'linear' THEN NULL ELSE ds.labels END,
        intercept => coalesce((params->>'intercept')::boolean, false),
        row_norm => ds.row_norm, huber_h => coalesce((params->>'huber_h')::float8, 0.1),
        tolerance => NULL, parallel_workers => coalesce((params->>'parallel_workers')::int, 0),
        private => true, feature_bounds => ds.feature_bounds,
        permutation => coalesce(params->>'permutation', 'once'),
        shard_parallel => coalesce((params->>'shard_parallel')::boolean, false), relation => ds.relid);
END $$;

-- The privacy entry point behind dpsql.train: runs as the extension owner on a registered
-- dataset only, with the data owner's columns, labels and bounds. Analysts pass numbers and
-- names from fixed lists, never SQL. The budget is charged in the same transaction as the
-- release; a run that fails releases nothing and, being one transaction, charges nothing
-- (private runs have no data-dependent error: malformed rows become null records).
-- With tuning grids it is Algorithm 3 of the bolt-on paper (private tuning, spec 003 s. 9).
CREATE OR REPLACE FUNCTION dpsql_internal._train_private(source text, model text, params jsonb)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ds dpsql.datasets;
    privacy text := params->>'privacy';
    epsilon float8 := (params->>'epsilon')::float8;
    delta float8 := coalesce((params->>'delta')::float8, 0);
    calibration text := coalesce(params->>'gaussian', 'analytic');
    noise_seed bigint := (params->>'noise_seed')::bigint;  -- tests only: makes the noise predictable
    lambdas float8[] := ARRAY(SELECT jsonb_array_elements_text(
        coalesce(nullif(params->'tuning_lambdas', 'null'), '[]'))::float8);
    epochs_grid int[] := ARRAY(SELECT jsonb_array_elements_text(
        coalesce(nullif(params->'tuning_epochs', 'null'), '[]'))::int);
    mid bigint;
    canonical text;
    auto jsonb;
    rows bigint;
    mech dpsql.mechanism_catalog;
BEGIN
    PERFORM dpsql_internal._refuse_on_worker();
    IF privacy = 'auto' THEN
        -- Resolve to a named mechanism from public quantities (37_auto.sql), run it, and say so
        -- in the model's record. The grant is checked first: the choice reads the registration.
        ds := dpsql_internal._dataset_for_source(source);
        IF NOT dpsql_internal._can_use_dataset(ds.dataset_id) THEN
            PERFORM dpsql_internal._fail(format('dataset %s is not granted to %s', ds.name, session_user), '42501');
        END IF;
        auto := dpsql_internal._auto_choice(ds, model, params);
        mid := dpsql_internal._train_private(source, model, params || (auto->'params'));
        UPDATE dpsql.model_store m
           SET params = jsonb_set(m.params, '{privacy,auto}', auto->'record')
         WHERE m.model_id = mid;
        RETURN mid;
    END IF;
    mech := dpsql_internal._mechanism(privacy);  -- the registry (31_mechanisms.sql); refuses unknown names
    canonical := dpsql_internal._erm_model(model);
    IF canonical <> ALL (dpsql_internal._mechanism_models(mech)) THEN
        PERFORM dpsql_internal._fail(
            format('%s trains model => %s, not %s', privacy,
                   (SELECT string_agg(quote_literal(m), ' or ')
                      FROM unnest(dpsql_internal._mechanism_models(mech)) m),
                   quote_literal(model)),
            hint => CASE WHEN canonical = 'linear'
                         THEN 'Least squares has no gradient bound: it needs a linear-regression mechanism.' END);
    END IF;
    IF NOT params ? 'defaults' THEN
        -- what the caller set (the defaults are filled in after): each must be the mechanism's
        PERFORM dpsql_internal._refuse_unused_params(mech, params);
    END IF;
    IF coalesce((params->>'paper_minibatch_formula')::boolean, false) THEN
        PERFORM dpsql_internal._fail('paper_minibatch_formula is refused for real releases: it underestimates '
                            'the strongly convex mini-batch sensitivity (spec 003 section 5.5)',
                            hint => 'Use dpsql.bolton_sensitivity(..., paper_minibatch => true) to compare.');
    END IF;
    IF (epsilon IS NOT NULL OR privacy <> 'dpsgd' OR params->>'noise_multiplier' IS NULL)
       AND (epsilon IS NULL OR NOT (epsilon > 0 AND epsilon < 'Infinity')) THEN
        PERFORM dpsql_internal._fail(format('epsilon must be a finite number > 0, got %s', coalesce(epsilon::text, 'NULL')));
    END IF;
    IF NOT (delta >= 0 AND delta < 1) THEN
        PERFORM dpsql_internal._fail(format('delta must be in [0, 1), got %s', delta));
    END IF;
    IF calibration NOT IN ('analytic', 'classic') THEN
        PERFORM dpsql_internal._fail('gaussian must be analytic or classic');
    END IF;
    IF coalesce(params->>'bst14_noise', 'strict') <> 'strict' AND NOT dpsql_internal._is_admin() THEN
        PERFORM dpsql_internal._fail('bst14_noise => paper (the paper''s add/remove noise) is for data owners'' '
                            'reproductions: it is not replace-one DP at the stated epsilon', '42501');
    END IF;
    IF noise_seed IS NOT NULL AND NOT dpsql_internal._is_admin() THEN
        PERFORM dpsql_internal._fail('noise_seed is for data owners'' tests: whoever knows the noise seed can '
                            'subtract the noise', '42501');
    END IF;
    IF params->>'tolerance' IS NOT NULL THEN
        PERFORM dpsql_internal._fail('tolerance is not allowed in private runs: a data-dependent stop would leak',
                            hint => 'The number of epochs is fixed in advance.');
    END IF;
    IF NOT coalesce((params->>'shuffle')::boolean, true) THEN
        PERFORM dpsql_internal._fail('private runs shuffle the data (a data-independent permutation)');
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(lambdas) v WHERE v IS NULL OR NOT (v >= 0 AND v < 'Infinity'))
       OR EXISTS (SELECT 1 FROM unnest(epochs_grid) k WHERE k IS NULL OR k < 1)
       OR cardinality(lambdas) * greatest(cardinality(epochs_grid), 1) > 100 THEN
        PERFORM dpsql_internal._fail('tuning grids: lambdas >= 0, epochs >= 1, at most 100 candidates');
    END IF;

    ds := dpsql_internal._dataset_for_source(source);
    IF NOT dpsql_internal._can_use_dataset(ds.dataset_id) THEN
        PERFORM dpsql_internal._fail(format('dataset %s is not granted to %s', ds.name, session_user), '42501');
    END IF;
    PERFORM dpsql_internal._check_distributed(mech, ds, params);
    IF params->'features' <> 'null' AND params->'features' <> to_jsonb(ds.features) THEN
        PERFORM dpsql_internal._fail(format('dataset %s is registered with features %s', ds.name, ds.features),
                            hint => 'Pass NULL (or the registered features): private runs use the registration.');
    END IF;
    IF params->>'label' IS NOT NULL AND params->>'label' <> ds.label THEN
        PERFORM dpsql_internal._fail(format('dataset %s is registered with label %s', ds.name, ds.label));
    END IF;

    IF NOT params ? 'defaults' THEN
        -- Fill in the hyperparameters left NULL from public quantities (34_defaults.sql), run,
        -- and record what was chosen with the model.
        IF mech.sgd_defaults THEN
            EXECUTE format('SELECT count(*) FROM %s', dpsql_internal._private_from(ds)) INTO rows;
            params := dpsql_internal._private_defaults(ds, model, privacy, params, rows);
        END IF;
        mid := dpsql_internal._train_private(source, model, params || '{"defaults": {}}');
        auto := params->'defaults';
        IF auto <> '{}' THEN
            UPDATE dpsql.model_store m SET params = jsonb_set(m.params, '{privacy,defaults}', auto)
             WHERE m.model_id = mid;
        END IF;
        RETURN mid;
    END IF;
    IF ds.label_bound IS NOT NULL AND canonical NOT IN ('linear', 'lasso') THEN
        PERFORM dpsql_internal._fail(format('dataset %s is a regression dataset (label_bound): model => ''linear''',
                                   ds.name));
    END IF;
    IF ds.label_bound IS NULL AND canonical = 'lasso' THEN
        PERFORM dpsql_internal._fail(format('dataset %s is a classification dataset: model => ''lasso'' '
                                            'needs a regression dataset (label_bound)', ds.name));
    END IF;
    -- The mechanism's own train function: plan from public numbers, charge, fit, release.
    EXECUTE format('SELECT dpsql_internal.%I($1, $2, $3, $4, $5, $6, $7)', mech.train_function)
       INTO mid USING ds, model, privacy, params, epsilon, delta, noise_seed;
    RETURN mid;
END $$;

-- The bolt-on (spec 003): Algorithms 1 and 2, or Algorithm 3 with tuning grids. Noiseless
-- epochs, then output perturbation once.
CREATE OR REPLACE FUNCTION dpsql_internal._train_bolton(ds dpsql.datasets, model text, privacy text, params jsonb,
                                    epsilon float8, delta float8, noise_seed bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    calibration text := coalesce(params->>'gaussian', 'analytic');
    lambdas float8[] := ARRAY(SELECT jsonb_array_elements_text(
        coalesce(nullif(params->'tuning_lambdas', 'null'), '[]'))::float8);
    epochs_grid int[] := ARRAY(SELECT jsonb_array_elements_text(
        coalesce(nullif(params->'tuning_epochs', 'null'), '[]'))::int);
    tuning boolean := cardinality(lambdas) + cardinality(epochs_grid) > 0;
    entry bigint;
    run bigint;
    fit record;
    mid bigint;
BEGIN
    IF tuning AND (dpsql_internal._citus_layout(ds.relid)).dist_column IS NOT NULL THEN
        PERFORM dpsql_internal._fail('private tuning (Algorithm 3) splits the rows by position: not on a '
                                     'distributed dataset', '0A000');
    END IF;
    -- The parameters are checked (the run's spec, the mechanism's sensitivity) before the
    -- budget: a bad argument is reported as such, also on an exhausted dataset.
    run := dpsql_internal._prepare_private(ds, model, params);
    IF NOT tuning THEN
        PERFORM dpsql_internal._bolton_mechanism(r.spec, r.rows, epsilon, delta, calibration)
           FROM dpsql.runs r WHERE r.run_id = run;
    END IF;
    -- Checks the budget under the dataset's row lock and appends the ledger entry; no epoch
    -- has run yet.
    entry := dpsql_internal._charge(ds.dataset_id, epsilon, delta, privacy,
                           note => CASE WHEN tuning THEN 'private tuning (Algorithm 3)' END);
    IF tuning THEN
        fit := dpsql_internal._bolton_tune(run, model, params, lambdas, epochs_grid, epsilon, delta,
                                  calibration, noise_seed);
        run := fit.run;
    ELSE
        fit := dpsql_internal._bolton_fit(run, epsilon, delta, calibration, noise_seed);
    END IF;
    mid := dpsql_internal._finish(run, fit.weights,
                         fit.info || jsonb_build_object('dataset_id', ds.dataset_id, 'ledger_entry', entry));
    PERFORM dpsql_internal._set_ledger_model(entry, mid);
    RETURN mid;
END $$;
SELECT dpsql_internal._register_mechanism(
    'bolton', '_train_bolton', 'classification', true, false,
    'bolt-on output perturbation of noiseless SGD (Algorithms 1-3; epsilon-DP with delta = 0)',
    'docs/bolton.md',
    params => '{epochs,batch_size,lambda,step_size,schedule,step_offset,radius,huber_h,'
              'parallel_workers,permutation,gaussian,tuning_lambdas,tuning_epochs,shard_parallel}',
    distributed => 'averaged');

-- Algorithm 3: split the shuffled training table into l + 1 equal portions; train candidate i
-- (a (lambda, epochs) pair) on portion i with the full (epsilon, delta) and m = portion size;
-- count each released candidate's errors chi_i on the last portion; pick one with probability
-- proportional to exp(-epsilon chi_i / 2). Portions are disjoint, so training costs (epsilon,
-- delta) by parallel composition and the selection epsilon on the held-out portion.
CREATE OR REPLACE FUNCTION dpsql_internal._bolton_tune(base bigint, model text, params jsonb, lambdas float8[],
                                   epochs_grid int[], epsilon float8, delta float8,
                                   calibration text, noise_seed bigint,
                                   OUT run bigint, OUT weights float8[], OUT info jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    b dpsql.runs := dpsql_internal._locked_run(base);
    grid_l float8[] := CASE WHEN cardinality(lambdas) > 0 THEN lambdas
                            ELSE ARRAY[coalesce((params->>'lambda')::float8, 0)] END;
    grid_k int[] := CASE WHEN cardinality(epochs_grid) > 0 THEN epochs_grid
                         ELSE ARRAY[coalesce((params->>'epochs')::int, 10)] END;
    l int := cardinality(grid_l) * cardinality(grid_k);
    portion bigint := b.rows / (l + 1);
    batch bigint := coalesce((params->>'batch_size')::bigint, 1);
    labels float8[];
    lam float8;
    k int;
    i int := 0;
    cand bigint;
    fit record;
    candidates jsonb := '[]';
    errors float8[] := '{}';
    pick int;
BEGIN
    IF portion < batch THEN
        PERFORM dpsql_internal._fail(format('%s rows cannot be split into %s portions of at least one batch',
                                   b.rows, l + 1));
    END IF;
    -- The base table already holds transformed features and mapped labels.
    labels := CASE WHEN jsonb_array_length(b.spec->'classes') > 2 OR b.spec->>'model' = 'multinomial'
                   THEN ARRAY(SELECT generate_series(0, jsonb_array_length(b.spec->'classes') - 1)::float8)
                   ELSE '{-1,1}' END;
    FOREACH lam IN ARRAY grid_l LOOP
        FOREACH k IN ARRAY grid_k LOOP
            i := i + 1;
            cand := dpsql_internal._prepare(
                source => format('SELECT x, y FROM %s WHERE rid > %s AND rid <= %s',
                                 b.train_table, (i - 1) * portion, i * portion),
                features => '{x}', label => 'y', model => model, epochs => k, batch_size => batch,
                lambda => lam, step_size => (params->>'step_size')::float8,
                schedule => CASE WHEN lam > 0 THEN 'decreasing' ELSE 'constant' END,
                step_offset => 0, radius => NULL, shuffle => true, seed => (b.spec->>'seed')::bigint + i,
                labels => labels, intercept => (b.spec->>'intercept')::boolean,
                row_norm => b.spec->>'row_norm', huber_h => coalesce((params->>'huber_h')::float8, 0.1),
                tolerance => NULL, private => true,
                -- the registered dimension: no row of the training table is probed
                feature_types => '{double precision[]}', dim => (b.spec->>'dim')::int);
            fit := dpsql_internal._bolton_fit(cand, epsilon, delta, calibration,
                                     noise_seed # (i::bigint << 32));
            errors := errors || dpsql_internal._errors(b.train_table, model, (b.spec->>'flags')::int,
                                              fit.weights, l::bigint * portion,
                                              (l + 1)::bigint * portion)::float8;
            candidates := candidates || jsonb_build_object(
                'run', cand, 'lambda', lam, 'epochs', k, 'weights', to_jsonb(fit.weights),
                'info', fit.info);
        END LOOP;
    END LOOP;
    -- Utility -chi_i with sensitivity 1: p_i proportional to exp(-epsilon chi_i / 2).
    pick := dpsql_internal._exponential_mechanism(ARRAY(SELECT -v FROM unnest(errors) v), epsilon, 1, noise_seed);
    FOR i IN 1..l LOOP
        IF i <> pick THEN
            PERFORM dpsql_internal._abort((candidates->(i - 1)->>'run')::bigint);
        END IF;
    END LOOP;
    PERFORM dpsql_internal._abort(base);
    run := (candidates->(pick - 1)->>'run')::bigint;
    weights := dpsql_internal._jsonb_weights(candidates->(pick - 1)->'weights');
    info := (candidates->(pick - 1)->'info') || jsonb_build_object(
        'epsilon', epsilon, 'delta', delta,
        'tuning', jsonb_build_object(
            'algorithm', 'Algorithm 3 (private tuning)', 'candidates', l,
            'portion_rows', portion, 'lambdas', grid_l, 'epochs', grid_k,
            'chosen_lambda', (candidates->(pick - 1)->>'lambda')::float8,
            'chosen_epochs', (candidates->(pick - 1)->>'epochs')::int,
            'selection', 'exponential mechanism, utility -errors, sensitivity 1'));
END $$;

-- Arm a prepared run with a white-box plan (noise inside every step), run all its epochs and
-- return the final weights: the release, with no output noise.
CREATE OR REPLACE FUNCTION dpsql_internal._run_armed(run bigint, plan jsonb, noise_seed bigint)
RETURNS float8[] LANGUAGE plpgsql AS $$
DECLARE
    e record;
BEGIN
    PERFORM dpsql_internal._arm_whitebox(run, plan, noise_seed);
    LOOP
        e := dpsql_internal._run_epoch(run);
        EXIT WHEN e.done;
    END LOOP;
    RETURN dpsql_internal._sgd_weights((dpsql_internal._locked_run(run)).state);
END $$;

------------------------------------------------------------------------------------------
-- White-box private SGD: noise inside every step of the aggregate (SCS13, BST14, DP-SGD)
------------------------------------------------------------------------------------------

-- BST14's per-step epsilon_1 (spec 003 s. 10.2, line 5, with the ERRATA e^{epsilon_1}):
-- the root of epsilon = T e1 (e^{e1} - 1) + sqrt(2 T ln(1/delta1)) e1 (C core:
-- dpsql_advanced_composition_step, cython_ext/core/composition.h).
CREATE OR REPLACE FUNCTION dpsql_internal._bst14_epsilon1(epsilon float8, delta1 float8, steps bigint)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_advanced_composition_step_sql'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- BST14's per-step noise std at add/remove sensitivity 1 (Algorithm 4/5 with k epochs of
-- T = k floor(m / b) steps of b draws with replacement): the Gaussian for (epsilon_2, delta_1),
-- epsilon_2 = min(1, m epsilon_1 / (2 b)) by amplification, delta_1 = delta / T.
CREATE OR REPLACE FUNCTION dpsql_internal._bst14_noise(epsilon float8, delta float8, rows bigint, b bigint,
                                   k int, OUT epsilon_1 float8, OUT epsilon_2 float8,
                                   OUT delta_1 float8, OUT sigma float8)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    t bigint := k * (rows / b);
BEGIN
    delta_1 := delta / t;
    epsilon_1 := dpsql_internal._bst14_epsilon1(epsilon, delta_1, t);
    epsilon_2 := least(1.0, rows * epsilon_1 / (2 * b));
    sigma := sqrt(2 * ln(1.25 / delta_1)) / epsilon_2;
END $$;

-- Answers of the accountant, a deterministic function of the request (a call costs seconds).
CREATE TABLE IF NOT EXISTS dpsql.accountant_answers (
    request  jsonb PRIMARY KEY,
    answer   jsonb NOT NULL,
    asked_at timestamptz NOT NULL DEFAULT now()
);

-- Ask the dp-accounting accountant (dpsql/accounting.py) for a DP-SGD calibration or epsilon.
CREATE OR REPLACE FUNCTION dpsql_internal._account(request jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    answer jsonb;
BEGIN
    SELECT a.answer INTO answer FROM dpsql.accountant_answers a WHERE a.request = _account.request;
    IF FOUND THEN
        RETURN answer;
    END IF;
    -- seconds of work the first time a configuration is asked: say so
    RAISE NOTICE 'dpsql: calibrating the noise with the accountant (a new configuration)';
    answer := dpsql_internal._accountant(request::text)::jsonb;
    IF answer ? 'error' THEN
        PERFORM dpsql_internal._fail('the accountant refused: ' || (answer->>'error'));
    END IF;
    INSERT INTO dpsql.accountant_answers (request, answer) VALUES (request, answer)
        ON CONFLICT DO NOTHING;
    RETURN answer;
END $$;

-- Noise, clipping, step schedule, sampling and accounting of a white-box mechanism for a
-- prepared run of `rows` rows (m public). 'public' keys go into the model's provenance.
CREATE OR REPLACE FUNCTION dpsql_internal._whitebox_plan(privacy text, spec jsonb, rows bigint, epsilon float8,
                                     delta float8, params jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    model text := spec->>'model';
    lambda float8 := (spec->>'lambda')::float8;
    b bigint := (spec->>'batch_size')::bigint;
    k int := (spec->>'epochs')::int;
    n bigint := rows / b;
    c record := dpsql.loss_constants(model, 0, 0, coalesce((spec->>'huber_h')::float8, 0.1));
    clip float8;
    sampling text := coalesce(params->>'sampling', 'shuffle');
    z float8 := (params->>'noise_multiplier')::float8;
    acct jsonb;
    eps_p float8;
    delta_p float8;
    radius float8 := (spec->>'radius')::float8;
    bst record;
    sigma float8;
    lip float8;
    g float8;
    plan jsonb;
BEGIN
    IF n < 1 THEN
        PERFORM dpsql_internal._fail(format('%s rows make no batch of %s', rows, b));
    END IF;
    IF privacy IN ('scs13', 'bst14') AND model IN ('logistic', 'huber')
       AND coalesce(jsonb_array_length(nullif(spec->'classes', 'null')), 1) > 2 THEN
        PERFORM dpsql_internal._fail(privacy || ' trains binary or multinomial models here, not one-vs-rest');
    END IF;
    IF privacy = 'dpsgd' THEN
        clip := coalesce((params->>'clip_norm')::float8, 1.0);
        IF NOT (clip > 0 AND clip < 'Infinity') THEN
            PERFORM dpsql_internal._fail('clip_norm must be a finite number > 0');
        END IF;
        IF NOT (delta > 0) THEN
            PERFORM dpsql_internal._fail('DP-SGD is (epsilon, delta)-DP: delta must be > 0');
        END IF;
        IF sampling NOT IN ('shuffle', 'poisson') THEN
            PERFORM dpsql_internal._fail('sampling must be shuffle (disjoint batches) or poisson');
        END IF;
        IF (epsilon IS NULL) = (z IS NULL) THEN
            PERFORM dpsql_internal._fail('DP-SGD takes either epsilon (the noise is calibrated) or '
                                'noise_multiplier (epsilon is reported)');
        END IF;
        IF z IS NOT NULL AND NOT (z > 0 AND z < 'Infinity') THEN
            PERFORM dpsql_internal._fail('noise_multiplier must be a finite number > 0');
        END IF;
        -- Shuffled disjoint batches: k Gaussian mechanisms per record, no amplification.
        -- Poisson: q = b/m per step, k*n steps, amplification by sampling (PLD, replace-one).
        acct := dpsql_internal._account(jsonb_build_object(
            'op', CASE WHEN z IS NULL THEN 'calibrate' ELSE 'report' END,
            'scheme', sampling, 'delta', delta,
            'target_epsilon', epsilon, 'noise_multiplier', z,
            'epochs', CASE WHEN sampling = 'shuffle' THEN k END,
            'steps', CASE WHEN sampling = 'poisson' THEN k * n END,
            'sampling_rate', CASE WHEN sampling = 'poisson' THEN b::float8 / rows END)
            -- DPSGD-F: its private mean, a Gaussian released before the steps, composed with them
            || CASE WHEN params->>'prefix_noise_multiplier' IS NOT NULL
                    THEN jsonb_build_object('prefix_noise_multiplier',
                                            (params->>'prefix_noise_multiplier')::float8)
                    ELSE '{}' END);
        z := coalesce(z, (acct->>'noise_multiplier')::float8);
        plan := jsonb_build_object(
            'noise', 'gaussian', 'noise_scale', z * clip, 'clip_norm', clip,
            'noise_divisor', b, 'schedule', spec->>'schedule',
            'step_size', coalesce((params->>'step_size')::float8, 0.5),
            'radius', radius, 'sampling', sampling,
            'steps_per_epoch', CASE WHEN sampling = 'poisson' THEN n ELSE 0 END,
            'sampling_rate', CASE WHEN sampling = 'poisson' THEN b::float8 / rows END,
            'epsilon', coalesce(epsilon, (acct->>'epsilon')::float8), 'delta', delta,
            'info', jsonb_build_object(
                'algorithm', 'DP-SGD, per-example clipping, Gaussian noise per step',
                'noise_multiplier', z, 'clip_norm', clip, 'sampling', sampling,
                'accountant', acct, 'sensitivity', 2 * clip, 'noise_scale', z * clip,
                'neighbouring', 'replace-one (per-step sensitivity 2 C), m public'));
    ELSIF privacy = 'scs13' THEN
        -- Per pass epsilon/k (basic composition over passes; one batch per record per pass);
        -- noise on the gradient SUM with sensitivity 2 L, then divided by b; steps 1/sqrt(t).
        clip := c.lipschitz_data;
        eps_p := epsilon / k;
        delta_p := delta / k;
        plan := jsonb_build_object(
            'noise', CASE WHEN delta = 0 THEN 'gamma_norm' ELSE 'gaussian' END,
            'noise_scale', CASE WHEN delta = 0 THEN 2 * clip / eps_p
                                ELSE dpsql.gaussian_sigma(2 * clip, eps_p, delta_p,
                                                          coalesce(params->>'gaussian', 'analytic')) END,
            'clip_norm', clip, 'noise_divisor', b, 'schedule', 'sqrt', 'step_size', 1.0,
            'radius', CASE WHEN lambda > 0 THEN 1 / lambda ELSE radius END,
            'sampling', 'shuffle', 'steps_per_epoch', 0, 'epsilon', epsilon, 'delta', delta,
            'info', jsonb_build_object(
                'algorithm', 'SCS13 (Song, Chaudhuri, Sarwate 2013), k passes',
                'epsilon_per_pass', eps_p, 'delta_per_pass', delta_p, 'sensitivity', 2 * clip,
                'neighbouring', 'replace-one, m public'));
    ELSIF privacy = 'bst14' THEN
        IF NOT (delta > 0) THEN
            PERFORM dpsql_internal._fail('BST14 exists only for (epsilon, delta): delta must be > 0');
        END IF;
        clip := c.lipschitz_data;
        radius := CASE WHEN lambda > 0 THEN 1 / lambda ELSE coalesce(radius, 1e4) END;
        lip := clip + lambda * radius;
        -- Algorithm 4/5 with constant epochs: T = k m / b steps of b draws with replacement.
        bst := dpsql_internal._bst14_noise(epsilon, delta, rows, b, k);
        sigma := bst.sigma;
        -- 'paper': std sigma (iota = 1, add/remove sensitivity 1); 'strict': replace-one, 2L.
        IF coalesce(params->>'bst14_noise', 'strict') = 'strict' THEN
            sigma := sigma * 2 * clip;
        ELSIF params->>'bst14_noise' <> 'paper' THEN
            PERFORM dpsql_internal._fail('bst14_noise must be strict (replace-one) or paper');
        END IF;
        g := sqrt((spec->>'dim')::float8 * sigma * sigma + b * b * lip * lip);
        plan := jsonb_build_object(
            'noise', 'gaussian', 'noise_scale', sigma, 'clip_norm', clip, 'noise_divisor', b,
            'schedule', CASE WHEN lambda > 0 THEN 'inverse' ELSE 'sqrt' END,
            -- average form: eta_t = 1/(gamma t) (Alg. 5); b * 2R/(G sqrt t) (Alg. 4, sum form)
            'step_size', CASE WHEN lambda > 0 THEN 1 / lambda ELSE b * 2 * radius / g END,
            'radius', radius, 'sampling', 'replacement', 'steps_per_epoch', n,
            'epsilon', epsilon, 'delta', delta,
            'info', jsonb_build_object(
                'algorithm', CASE WHEN lambda > 0 THEN 'BST14 Algorithm 5 (strongly convex)'
                                  ELSE 'BST14 Algorithm 4 (convex)' END,
                'epsilon_1', bst.epsilon_1, 'epsilon_2', bst.epsilon_2, 'delta_1', bst.delta_1, 'G', g,
                'bst14_noise', coalesce(params->>'bst14_noise', 'strict'),
                'note', 'advanced composition as printed: the total delta slightly exceeds delta',
                'sensitivity', CASE WHEN coalesce(params->>'bst14_noise', 'strict') = 'strict'
                                    THEN 2 * clip ELSE 1 END));
    ELSE
        PERFORM dpsql_internal._fail(format('unknown privacy mechanism %s', quote_literal(privacy)));
    END IF;
    RETURN plan;
END $$;

-- Rebuild a prepared private run's initial state with the plan's noise, clipping, schedule
-- and sampling (keyed by pg_strong_random), and draw its secret sampling seed.
CREATE OR REPLACE FUNCTION dpsql_internal._arm_whitebox(run_id bigint, plan jsonb, noise_seed bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    r dpsql.runs := dpsql_internal._locked_run(run_id);
    s jsonb := r.spec;
    init float8[];
BEGIN
    init := dpsql_internal._sgd_init(
        s->>'model', (s->>'dim')::int, coalesce(jsonb_array_length(nullif(s->'classes', 'null')), 1),
        (s->>'lambda')::float8, plan->>'schedule', (plan->>'step_size')::float8,
        (s->>'step_offset')::float8, coalesce((plan->>'radius')::float8, 0),
        coalesce((s->>'huber_h')::float8, 0.1), (s->>'batch_size')::bigint, (s->>'flags')::int,
        (plan->>'clip_norm')::float8, plan->>'noise', (plan->>'noise_scale')::float8,
        (plan->>'noise_divisor')::float8, (plan->>'steps_per_epoch')::bigint, noise_seed);
    UPDATE dpsql.runs
       SET state = init,
           spec = spec || jsonb_build_object(
               'schedule', plan->>'schedule', 'step_size', (plan->>'step_size')::float8,
               'radius', (plan->>'radius')::float8, 'sampling', plan->>'sampling',
               'sampling_rate', (plan->>'sampling_rate')::float8,
               'steps_per_epoch', (plan->>'steps_per_epoch')::bigint,
               'clip_norm', (plan->>'clip_norm')::float8),
           -- A data owner's noise seed fixes the coins too (reproductions and audits: NOT private).
           sampling_seed = CASE WHEN noise_seed IS NULL THEN dpsql_internal._random_seed()
                                ELSE noise_seed # x'5A5A5A5A5A5A5A5A'::bigint END
     WHERE runs.run_id = _arm_whitebox.run_id;
END $$;

-- SCS13, BST14 and DP-SGD: the noise is added inside every step of the aggregate, from the
-- state's CSPRNG; the final model is the release (no output noise). Charged after the plan
-- (DP-SGD's epsilon may come from the accountant) and before any epoch runs.
CREATE OR REPLACE FUNCTION dpsql_internal._train_whitebox(ds dpsql.datasets, model text, privacy text, params jsonb,
                                      epsilon float8, delta float8, noise_seed bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    run bigint;
    r dpsql.runs;
    plan jsonb;
    entry bigint;
    mid bigint;
BEGIN
    run := dpsql_internal._prepare_private(ds, model, params);
    r := dpsql_internal._locked_run(run);
    plan := dpsql_internal._whitebox_plan(privacy, r.spec, r.rows, epsilon, coalesce(delta, 0), params);
    plan := dpsql_internal._audit_plan(r.spec, r.rows, plan);  -- a superuser's test switch (52_audit.sql)
    entry := dpsql_internal._charge(ds.dataset_id, (plan->>'epsilon')::float8, (plan->>'delta')::float8,
                           privacy, dp_event => CASE WHEN privacy = 'dpsgd' THEN dpsql_internal._dpsgd_event(
                               plan, (r.spec->>'epochs')::int, (params->>'prefix_noise_multiplier')::float8) END);
    mid := dpsql_internal._finish(run, dpsql_internal._run_armed(run, plan, noise_seed),
                         (plan->'info') || jsonb_build_object(
        'mechanism', privacy, 'dataset_id', ds.dataset_id, 'epsilon', plan->'epsilon',
        'delta', plan->'delta', 'noise_scale', plan->'noise_scale', 'ledger_entry', entry,
        'noise_seed', dpsql_internal._noise_source(noise_seed)));
    PERFORM dpsql_internal._set_ledger_model(entry, mid);
    RETURN mid;
END $$;
SELECT dpsql_internal._register_mechanism(
    'dpsgd', '_train_whitebox', 'classification', true, true,
    'DP-SGD: per-example clipping and Gaussian noise in every step; shuffled or Poisson batches '
    '(dp-accounting); also least squares', 'docs/whitebox.md',
    models => '{logistic,huber,multinomial,linear}',
    params => '{epochs,batch_size,lambda,step_size,schedule,step_offset,radius,huber_h,clip_norm,sampling,noise_multiplier}');
SELECT dpsql_internal._register_mechanism(
    'scs13', '_train_whitebox', 'classification', true, false,
    'SCS13: noisy mini-batch SGD, epsilon / k per pass (Gamma-norm or Gaussian noise)',
    'docs/whitebox.md', params => '{epochs,batch_size,lambda,radius,huber_h,gaussian}');
SELECT dpsql_internal._register_mechanism(
    'bst14', '_train_whitebox', 'classification', true, true,
    'BST14: noisy SGD on batches drawn with replacement, amplified and advanced composition',
    'docs/whitebox.md', params => '{epochs,batch_size,lambda,radius,huber_h,bst14_noise}');
------------------------------------------------------------------------------------------
-- privacy => 'auto': a mechanism and its hyperparameters chosen from public quantities only
-- (the registration, the model, epsilon and delta), never from the data, so the choice costs
-- nothing; the chosen mechanism is then run and charged as if it had been named. The rule and
-- the measurements behind it are in docs/auto.md and bench/RESULTS.md (auto_defaults).
------------------------------------------------------------------------------------------

-- Parameters that auto chooses itself: given anything but their defaults, it refuses rather
-- than drop them silently.
CREATE OR REPLACE FUNCTION dpsql_internal._auto_refuse_overrides(params jsonb)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    given text[] := ARRAY(
        SELECT unnest(dpsql_internal._given_params(params))
        INTERSECT
        SELECT unnest(ARRAY['epochs', 'batch_size', 'lambda', 'step_size', 'schedule', 'radius',
                            'clip_norm', 'sampling', 'noise_multiplier', 'steps', 'ci', 'options',
                            'tuning_lambdas', 'tuning_epochs', 'permutation', 'gaussian',
                            'parallel_workers', 'shard_parallel'])
        ORDER BY 1);
BEGIN
    IF cardinality(given) > 0 THEN
        PERFORM dpsql_internal._fail(format('privacy => auto chooses %s itself', array_to_string(given, ', ')),
                            hint => 'Leave them at their defaults, or name a mechanism to set them.');
    END IF;
END $$;

-- The choice: (the named mechanism's parameters, the record stored with the model). Only the
-- mechanism is chosen here; its hyperparameters are its defaults (34_defaults.sql).
-- Classification, delta > 0: DPSGD-F (38_dpsgd_f.sql: rows centred on a private mean, whose
-- Gaussian the accountant composes with the steps) with Poisson sampling.
-- Classification, delta = 0: bolt-on (Algorithm 1, epsilon-DP).
-- Regression, delta > 0: DP-GD, whitened by its private preconditioner
-- (44_dpgd_precondition.sql) when the rows have a public norm bound.
-- Regression, delta = 0: objective perturbation (45_objective_perturbation.sql).
-- Classification on a Citus distributed dataset: objective perturbation, whose scans are exact
-- sums over the shards (the others are sequential or average shards: docs/citus.md).
CREATE OR REPLACE FUNCTION dpsql_internal._auto_choice(ds dpsql.datasets, model text, params jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    delta float8 := coalesce((params->>'delta')::float8, 0);
    chosen jsonb;
    rule text;
BEGIN
    PERFORM dpsql_internal._auto_refuse_overrides(params);
    IF (ds.label_bound IS NOT NULL OR dpsql_internal._canonical_model(model) = 'linear')
       AND NOT (delta > 0) THEN
        IF ds.row_bound IS NULL THEN
            PERFORM dpsql_internal._fail('privacy => auto for regression with delta = 0 needs a public bound on ||x|| '
                                         '(objective perturbation); with delta > 0 it trains DP-GD',
                                         hint => 'Register the dataset with row_bound, feature_bounds or row_norm => ''clip'', or give delta.');
        END IF;
        chosen := jsonb_build_object('privacy', 'objective_perturbation');
        rule := 'regression, delta = 0: objective perturbation (epsilon-DP; Huber regression with '
                'threshold the label bound), the only epsilon-DP regression mechanism';
    ELSIF ds.label_bound IS NOT NULL OR dpsql_internal._canonical_model(model) = 'linear' THEN
        -- With a public bound on ||x||, whiten by the private preconditioner (a tenth of rho).
        chosen := jsonb_build_object('privacy', 'dpgd') || CASE WHEN ds.row_bound IS NOT NULL
            THEN jsonb_build_object('options', jsonb_build_object('precondition', true)) ELSE '{}' END;
        rule := 'regression: DP-GD with batch-means intervals, whitened by the private '
                'preconditioner when the rows have a public norm bound';
    ELSIF (dpsql_internal._citus_layout(ds.relid)).dist_column IS NOT NULL THEN
        chosen := jsonb_build_object('privacy', 'objective_perturbation');
        rule := 'classification on a Citus distributed dataset: objective perturbation (exact sums '
                'over the shards; epsilon-DP, or Gaussian with delta > 0)';
    ELSIF delta > 0 THEN
        chosen := jsonb_build_object('privacy', 'dpsgd_f', 'sampling', 'poisson');
        rule := 'classification, delta > 0: DPSGD-F (private mean, centred rows), DP-SGD with '
                'Poisson sampling at its defaults';
    ELSE
        chosen := jsonb_build_object('privacy', 'bolton');
        rule := 'classification, delta = 0: bolt-on Algorithm 1 (epsilon-DP) at its defaults';
    END IF;
    RETURN jsonb_build_object('params', chosen,
                              'record', jsonb_build_object('rule', rule, 'chosen', chosen,
                                                           'cost', 'none: public quantities only'));
END $$;
------------------------------------------------------------------------------------------
-- DPSGD-F* (spec 001 section 4): private feature preprocessing for DP linear classification.
-- A private mean of the rows (Gaussian mechanism on their sum), the rows centred on it, then
-- DP-SGD with Poisson sampling and an ordinary bias. The mean's Gaussian and the steps are
-- composed in the same PLD accountant (spec 001 s. 5.3: not an epsilon split). The mean is
-- released with the model, and predict / evaluate (SQL and Python) centre rows on it.
------------------------------------------------------------------------------------------

-- Share of epsilon that fixes the mean's noise: it sets the noise multiplier p of the mean
-- (the analytic Gaussian for (mean_fraction * epsilon, delta) alone), and the accountant then
-- calibrates the steps so that the composition of both is (epsilon, delta).
CREATE OR REPLACE FUNCTION dpsql_internal._dpsgd_f_mean_fraction()
RETURNS float8 LANGUAGE sql IMMUTABLE AS 'SELECT 0.1::float8';

-- The rows' noisy mean: rows as the model sees them (bounds applied in the training table),
-- scaled by 1 / x_bound, put through the row transform (clip or unit: norm <= 1) and scaled
-- back, summed, a null record counting as zero, plus N(0, std^2 I) (replace-one sensitivity
-- 2 x_bound), divided by the public m.
CREATE OR REPLACE FUNCTION dpsql_internal._private_mean(train_table text, dim int, row_flags int, rows bigint,
                                    noise_std float8, noise_seed bigint,
                                    x_bound float8 DEFAULT 1)
RETURNS float8[] LANGUAGE plpgsql AS $$
DECLARE
    total float8[];
BEGIN
    EXECUTE format('SELECT array_agg(coalesce(s.v, 0) ORDER BY j)'
                   '  FROM generate_series(1, $2) j LEFT JOIN ('
                   '    SELECT u.j, sum(u.v) * $3 AS v'
                   '      FROM %s t, unnest(dpsql_internal._preprocess('
                   '             CASE WHEN $3 = 1 THEN t.x ELSE ARRAY(SELECT e / $3 FROM unnest(t.x)'
                   '                  WITH ORDINALITY AS q(e, k) ORDER BY k) END, NULL, $1, NULL))'
                   '           WITH ORDINALITY AS u(v, j)'
                   '     GROUP BY u.j) s USING (j)', train_table)
       INTO total USING row_flags, dim, x_bound;
    total := dpsql_internal._add_gaussian(total, noise_std, noise_seed, 7001);
    RETURN ARRAY(SELECT v / rows FROM unnest(total) WITH ORDINALITY AS u(v, j) ORDER BY j);
END $$;

CREATE OR REPLACE FUNCTION dpsql_internal._train_dpsgd_f(ds dpsql.datasets, model text, privacy text,
                                     params jsonb, epsilon float8, delta float8,
                                     noise_seed bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    canonical text := dpsql_internal._canonical_model(model);
    x_bound float8 := CASE WHEN canonical = 'linear' THEN ds.row_bound ELSE 1 END;
    mean_epsilon float8 := dpsql_internal._dpsgd_f_mean_fraction() * epsilon;
    prefix float8;
    run bigint;
    r dpsql.runs;
    row_flags int;
    centre float8[];
    tbl text;
    plan jsonb;
    entry bigint;
    mid bigint;
BEGIN
    IF canonical = 'linear' AND (ds.label_bound IS NULL OR ds.row_bound IS NULL) THEN
        PERFORM dpsql_internal._fail('dpsgd_f for least squares needs a regression dataset with a public bound on ||x||',
                            hint => 'Register it with label_bound and row_bound (or feature_bounds).');
    END IF;
    IF NOT (delta > 0) THEN
        PERFORM dpsql_internal._fail('dpsgd_f is (epsilon, delta)-DP: delta must be > 0');
    END IF;
    -- Always Poisson sampling, the sampling the composed accountant assumes (spec 001 s. 4
    -- [R]); 'shuffle' is dpsql.train's default for sampling, so it cannot mean a choice here.
    IF params->>'noise_multiplier' IS NOT NULL THEN
        PERFORM dpsql_internal._fail('dpsgd_f calibrates its noise from epsilon: give epsilon, not noise_multiplier');
    END IF;
    -- Poisson batches of expected size 1 would cost a step per row: b < 2 means the default 50.
    IF coalesce((params->>'batch_size')::bigint, 1) < 2 THEN
        params := params || '{"batch_size": 50}';
    END IF;
    -- The mean's noise std for (mean_epsilon, delta) alone at replace-one sensitivity 2 r, r
    -- the rows' norm bound (1 for classifiers); std / r is the accountant's prefix multiplier
    -- (the steps' multiplier is std / C at sensitivity 2 C).
    prefix := dpsql.gaussian_sigma(2 * x_bound, mean_epsilon, delta);
    run := dpsql_internal._prepare_private(ds, model, params);
    r := dpsql_internal._locked_run(run);
    -- the registration's clip / unit rows
    row_flags := (r.spec->>'flags')::int & dpsql_internal._flag('row_transform');
    -- The plan (and the charge) before any private number is computed from the rows.
    plan := dpsql_internal._whitebox_plan('dpsgd', r.spec, r.rows, epsilon, delta,
                                 params || jsonb_build_object('sampling', 'poisson',
                                                              'prefix_noise_multiplier', prefix / x_bound));
    entry := dpsql_internal._charge(ds.dataset_id, (plan->>'epsilon')::float8, (plan->>'delta')::float8,
                           'dpsgd_f', dp_event => dpsql_internal._dpsgd_event(
                               plan, (r.spec->>'epochs')::int, prefix / x_bound));
    -- regression rows (row_norm none) are clipped to x_bound for the sum only
    centre := dpsql_internal._private_mean(r.train_table, (r.spec->>'dim')::int,
                                  CASE WHEN canonical = 'linear' THEN 1 ELSE row_flags END,
                                  r.rows, prefix, noise_seed, x_bound);
    -- Centre the rows in a new table (an UPDATE would leave every row's old version for the
    -- epochs to skip): the row transform is done, and the bias is a plain feature 1.
    tbl := r.train_table || '_c';
    EXECUTE format('CREATE UNLOGGED TABLE %s (LIKE %s INCLUDING ALL) WITH (autovacuum_enabled = false)',
                   tbl, r.train_table);
    EXECUTE format('INSERT INTO %s (rid, x, y) SELECT rid, dpsql_internal._preprocess(x, NULL, $1, $2), y'
                   '  FROM %s ORDER BY rid', tbl, r.train_table) USING row_flags, centre;
    EXECUTE format('DROP TABLE %s', r.train_table);
    EXECUTE format('ALTER TABLE %s RENAME TO %I', tbl, split_part(r.train_table, '.', 2));
    UPDATE dpsql.runs
       SET spec = spec || jsonb_build_object('flags', ((spec->>'flags')::int
                                                        & ~dpsql_internal._flag('row_transform'))
                                                       | dpsql_internal._flag('intercept'),
                                             'intercept', true)
     WHERE runs.run_id = run;
    mid := dpsql_internal._finish(run, dpsql_internal._run_armed(run, plan, noise_seed),
                         (plan->'info') || jsonb_build_object(
        'mechanism', 'dpsgd_f', 'dataset_id', ds.dataset_id,
        'algorithm', 'DPSGD-F* (Sun, Suresh, Menon 2024, Algorithm 3): private mean, centred rows, '
                     'DP-SGD with Poisson sampling and a bias',
        'epsilon', plan->'epsilon', 'delta', plan->'delta', 'noise_scale', plan->'noise_scale',
        'ledger_entry', entry,
        'preprocessing', jsonb_build_object(
            'row_flags', row_flags, 'centre', centre,
            'mean_noise_std', prefix, 'mean_sensitivity', 2 * x_bound,
            'mean_epsilon_alone', mean_epsilon,
            'accounting', 'the mean''s Gaussian and the steps composed by the PLD accountant'),
        'noise_seed', dpsql_internal._noise_source(noise_seed)));
    PERFORM dpsql_internal._set_ledger_model(entry, mid);
    RETURN mid;
END $$;
SELECT dpsql_internal._register_mechanism(
    'dpsgd_f', '_train_dpsgd_f', 'classification', true, true,
    'DPSGD-F*: rows centred on a private mean, then Poisson DP-SGD, composed in one accountant; '
    'also least squares', 'docs/whitebox.md', models => '{logistic,huber,multinomial,linear}',
    params => '{epochs,batch_size,lambda,step_size,schedule,step_offset,radius,huber_h,clip_norm,sampling,noise_multiplier}');
------------------------------------------------------------------------------------------
-- DPSGD-F, the theoretical version (spec 001 s. 3, Algorithm 2): three private steps at
-- (epsilon/3, delta/3) each, composed basically to (epsilon, delta):
--   1. a diameter-adaptive private mean mu (the s. 3.2 substitute: coordinate-wise EM medians
--      c, an EM radius r of ||x - c||, then c + (sum Clip(x - c, r) + N(0, s^2)) / m);
--   2. tau: an EM quantile of ||x - mu|| at rank m - (100/epsilon) ln m (s. 3.3), plus one
--      grid step;
--   3. DP-SGD on x'' = Clip((x - mu, tau), sqrt(2) tau) with no separate bias (the tau
--      coordinate is the bias), clip norm C = sqrt(2) G tau so that no gradient is clipped,
--      step eta_0 / tau^2; Poisson sampling calibrated by the PLD accountant.
-- Then the map back (ERRATA s. 10.3): w = theta''[1:d], b = tau theta''[d+1] - w . mu. The
-- model is released as (w, b) on the rows as the model sees them (feature bounds and row
-- transform: R = 1), so predict / evaluate (SQL and Python) score w . x + b unchanged.
-- x: the rows after the registration's row transform. Replace-one neighbours, m public: the
-- rank utilities have sensitivity 1, the clipped sum 2 r. A null record (a malformed row)
-- counts as the value 0 / the point c, and is a null record (zero gradient) in the steps.
------------------------------------------------------------------------------------------

-- A deterministic seed per use of a data owner's noise seed (NULL: pg_strong_random).
CREATE OR REPLACE FUNCTION dpsql_internal._alg2_seed(noise_seed bigint, tag text)
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN noise_seed IS NOT NULL
                THEN ('x' || substr(md5(noise_seed::text || ':dpsgd_f_alg2:' || tag), 1, 16))::bit(64)::bigint END
$$;

-- The rows as the model sees them (the row transform applied), NULL for a null record.
CREATE OR REPLACE FUNCTION dpsql_internal._alg2_rows_sql(train_table text, dim int, row_flags int)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT format('SELECT t.rid, t.y, CASE WHEN cardinality(p.v) = %s THEN p.v END AS x'
                  '  FROM %s t, LATERAL (SELECT dpsql_internal._preprocess(t.x, NULL, %s, NULL) AS v) p',
                  dim, train_table, row_flags)
$$;

-- The SQL of ||x - $4|| for a row r of _alg2_rows_sql (NULL for a null record).
CREATE OR REPLACE FUNCTION dpsql_internal._alg2_distance_sql()
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT 'CASE WHEN r.x IS NOT NULL THEN sqrt((SELECT sum((e - $4[k]) ^ 2)'
           ' FROM unnest(r.x) WITH ORDINALITY q(e, k))) END'
$$;

-- An EM quantile (27_estimate_bounds.sql) of the values of value_sql over rows_sql, clamped to
-- [lo, hi] and rounded to the grid of step (a per-record map: free); NULL values count as 0.
-- value_sql may read ref as $4 (a parameter, never a literal: no float text round trip).
CREATE OR REPLACE FUNCTION dpsql_internal._alg2_quantile(rows_sql text, value_sql text, ref float8[],
                                                rank bigint, lo float8, hi float8, step float8,
                                                epsilon float8, seed bigint)
RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
    grid_values float8[];
    counts bigint[];
BEGIN
    EXECUTE format(
        'SELECT coalesce(array_agg(w ORDER BY w), ''{}''), coalesce(array_agg(c ORDER BY w), ''{}'') FROM ('
        '  SELECT %s AS w, count(*) AS c FROM (%s) r GROUP BY 1) v',
        dpsql_internal._grid_sql(format('coalesce(%s, 0)', value_sql)), rows_sql)
        INTO grid_values, counts USING lo, hi, step, ref;
    RETURN dpsql_internal._private_quantile(grid_values, counts, rank, lo, hi, step, epsilon, seed);
END $$;

-- Step 1, PrivMean (spec 001 s. 3.2 substitute) at (epsilon_m, delta_m), R = 1: the mean,
-- and what it is made of (public: derived from released values only).
CREATE OR REPLACE FUNCTION dpsql_internal._alg2_private_mean(rows_sql text, dim int, m bigint,
                                                    epsilon_m float8, delta_m float8,
                                                    noise_seed bigint,
                                                    OUT mean float8[], OUT info jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    step float8 := 1.0 / (m::float8 * m);  -- R / m^2
    c float8[] := '{}';
    rad_rank bigint;
    rad_points float8 := 2 * m::float8 * m + 1;  -- grid points of [0, 2R]
    rad float8;
    s float8;
    total float8[];
    nrm float8;
BEGIN
    -- 1. coordinate-wise medians, rank floor(m/2), range [-R, R], epsilon_m / (3 d) each
    FOR j IN 1..dim LOOP
        c := c || dpsql_internal._alg2_quantile(rows_sql, format('r.x[%s]', j), NULL, greatest(m / 2, 1),
                                       -1, 1, step, epsilon_m / (3 * dim),
                                       dpsql_internal._alg2_seed(noise_seed, 'median' || j));
    END LOOP;
    -- 2. radius: rank m - ceil(2 / (epsilon_m/3) (ln(K + 1) + 2 ln m)), range [0, 2R], plus a step
    rad_rank := least(m, greatest(1, m - ceil(2 / (epsilon_m / 3) * (ln(rad_points) + 2 * ln(m)))::bigint));
    rad := dpsql_internal._alg2_quantile(rows_sql, dpsql_internal._alg2_distance_sql(), c, rad_rank, 0, 2, step, epsilon_m / 3, dpsql_internal._alg2_seed(noise_seed, 'radius')) + step;
    -- 3. c + (sum Clip(x - c, r) + N(0, s^2 I)) / m, replace-one sensitivity 2 r
    s := dpsql.gaussian_sigma(2 * rad, epsilon_m / 3, delta_m);
    EXECUTE format(
        'SELECT array_agg(coalesce(s.v, 0) ORDER BY j) FROM generate_series(1, $1) j LEFT JOIN ('
        '  SELECT u.j, sum(u.v) AS v FROM (%s) r,'
        '         LATERAL (SELECT sqrt(sum((e - $2[k]) ^ 2)) AS n'
        '                    FROM unnest(r.x) WITH ORDINALITY q(e, k)) z,'
        '         unnest(ARRAY(SELECT (e - $2[k]) * CASE WHEN z.n > $3 THEN $3 / z.n ELSE 1 END'
        '                        FROM unnest(r.x) WITH ORDINALITY q(e, k) ORDER BY k))'
        '           WITH ORDINALITY AS u(v, j)'
        '   WHERE r.x IS NOT NULL GROUP BY u.j) s USING (j)', rows_sql)
        INTO total USING dim, c, rad;
    total := dpsql_internal._add_gaussian(total, s, dpsql_internal._alg2_seed(noise_seed, 'mean'), 7101);
    mean := ARRAY(SELECT c[j] + total[j] / m FROM generate_series(1, dim) j);
    -- post-processing: the projection onto the R-ball
    nrm := sqrt((SELECT sum(v * v) FROM unnest(mean) v));
    IF nrm > 1 THEN
        mean := ARRAY(SELECT v / nrm FROM unnest(mean) WITH ORDINALITY q(v, k) ORDER BY k);
    END IF;
    info := jsonb_build_object('coarse_centre', c, 'radius', rad, 'radius_rank', rad_rank,
                               'noise_std', s, 'sensitivity', 2 * rad, 'grid_step', step,
                               'epsilon', epsilon_m, 'delta', delta_m,
                               'split', 'medians epsilon/(3d) each, radius epsilon/3, '
                                        'Gaussian (epsilon/3, delta)');
END $$;


-- Steps 3-4: x'' = Clip((x - mean, tau), sqrt(2) tau) (NULL for a null record).
CREATE OR REPLACE FUNCTION dpsql_internal._alg2_features(x float8[], mean float8[], tau float8)
RETURNS float8[] LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY(SELECT v * least(1, sqrt(2) * tau / nullif(n, 0))
                   FROM unnest(z.a) WITH ORDINALITY q(v, k) ORDER BY k)
      FROM (SELECT a, sqrt((SELECT sum(e * e) FROM unnest(a) e)) AS n
              FROM (SELECT ARRAY(SELECT e - mean[k] FROM unnest(x) WITH ORDINALITY q(e, k) ORDER BY k)
                           || tau AS a) a0) z
     WHERE x IS NOT NULL
$$;

-- Step 6: (w, b) from theta'' (d + 1, or K x (d + 1) for multinomial).
CREATE OR REPLACE FUNCTION dpsql_internal._alg2_map_back(theta float8[], mean float8[], tau float8)
RETURNS float8[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    d int := cardinality(mean);
    out float8[];
BEGIN
    IF array_ndims(theta) = 1 THEN
        RETURN theta[1:d] || (tau * theta[d + 1]
                              - (SELECT sum(theta[k] * mean[k]) FROM generate_series(1, d) k));
    END IF;
    out := array_fill(0::float8, ARRAY[array_length(theta, 1), d + 1]);
    FOR i IN 1..array_length(theta, 1) LOOP
        FOR k IN 1..d LOOP
            out[i][k] := theta[i][k];
        END LOOP;
        out[i][d + 1] := tau * theta[i][d + 1]
                         - (SELECT sum(theta[i][k] * mean[k]) FROM generate_series(1, d) k);
    END LOOP;
    RETURN out;
END $$;

CREATE OR REPLACE FUNCTION dpsql_internal._train_dpsgd_f_alg2(ds dpsql.datasets, model text, privacy text,
                                          params jsonb, epsilon float8, delta float8,
                                          noise_seed bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    canonical text := dpsql_internal._canonical_model(model);
    c record := dpsql.loss_constants(canonical, 0, 0, 0.1);
    run bigint;
    r dpsql.runs;
    d int;
    m bigint;
    row_flags int;
    flags int;
    rows_sql text;
    plan jsonb;
    entry bigint;
    pm record;
    tau_rank bigint;
    tau_hat float8;
    tau float8;
    clip float8;
    eta0 float8;
    sgd_params jsonb;
    theta float8[];
    released float8[];
    tbl text;
    mid bigint;
BEGIN
    -- Refusals first: nothing is charged (one transaction).
    IF canonical NOT IN ('logistic', 'multinomial') THEN
        PERFORM dpsql_internal._fail('dpsgd_f_alg2 trains logistic (binary) or multinomial models',
                            hint => 'Algorithm 2 is for Lipschitz margin losses; least squares has no gradient bound.');
    END IF;
    IF NOT (delta > 0) THEN
        PERFORM dpsql_internal._fail('dpsgd_f_alg2 is (epsilon, delta)-DP: delta must be > 0');
    END IF;
    IF params->>'noise_multiplier' IS NOT NULL THEN
        PERFORM dpsql_internal._fail('dpsgd_f_alg2 calibrates its noise from epsilon: give epsilon, not noise_multiplier');
    END IF;
    IF params->>'clip_norm' IS NOT NULL THEN
        PERFORM dpsql_internal._fail('dpsgd_f_alg2 clips features to sqrt(2) tau and gradients at sqrt(2) G tau: '
                            'clip_norm is not a parameter');
    END IF;
    IF coalesce((params->>'intercept')::boolean, false) THEN
        PERFORM dpsql_internal._fail('dpsgd_f_alg2 learns its bias through the feature tau: leave intercept false',
                            hint => 'The released model has an intercept (the map back).');
    END IF;
    IF params->>'schedule' IS NOT NULL AND params->>'schedule' <> 'constant'
       OR coalesce((params->>'lambda')::float8, 0) <> 0 THEN
        PERFORM dpsql_internal._fail('dpsgd_f_alg2 runs a constant step eta_0 / tau^2 without regularisation');
    END IF;
    eta0 := coalesce((params->>'step_size')::float8,
                     dpsql_internal._default_step(canonical, 0.1, sqrt(2)));  -- rows of norm sqrt(2) tau, tau = 1
    IF NOT (eta0 > 0 AND eta0 < 'Infinity') THEN
        PERFORM dpsql_internal._fail('step_size (eta_0; the step is eta_0 / tau^2) must be a finite number > 0');
    END IF;
    IF coalesce((params->>'batch_size')::bigint, 1) < 2 THEN
        params := params || '{"batch_size": 50}';
    END IF;
    run := dpsql_internal._prepare_private(ds, model, params);
    r := dpsql_internal._locked_run(run);
    d := (r.spec->>'dim')::int;
    m := r.rows;
    row_flags := (r.spec->>'flags')::int & dpsql_internal._flag('row_transform');
    flags := (r.spec->>'flags')::int;
    -- The DP-SGD calibration at (epsilon/3, delta/3) from public numbers (clip 1: the noise
    -- multiplier does not depend on it), then the charge, before any value is read.
    sgd_params := jsonb_build_object('sampling', 'poisson', 'clip_norm', 1.0, 'step_size', 1.0);
    plan := dpsql_internal._whitebox_plan('dpsgd', r.spec || jsonb_build_object('dim', d + 1), m,
                                 epsilon / 3, delta / 3, sgd_params);
    entry := dpsql_internal._charge(ds.dataset_id, epsilon, delta, 'dpsgd_f_alg2');
    rows_sql := dpsql_internal._alg2_rows_sql(r.train_table, d, row_flags);
    -- 1. private mean at (epsilon/3, delta/3)
    pm := dpsql_internal._alg2_private_mean(rows_sql, d, m, epsilon / 3, delta / 3, noise_seed);
    -- 2. tau at epsilon/3 (pure), rank m - (100 / epsilon) ln m (total epsilon), in [1, m]
    tau_rank := least(m, greatest(1, ceil(m - 100 / epsilon * ln(m))::bigint));
    tau_hat := dpsql_internal._alg2_quantile(rows_sql, dpsql_internal._alg2_distance_sql(), pm.mean, tau_rank,
                                    0, 2, 1.0 / (m::float8 * m), epsilon / 3,
                                    dpsql_internal._alg2_seed(noise_seed, 'tau'));
    tau := tau_hat + 1.0 / (m::float8 * m);
    -- 3-4. the rows x'' in a new table: no row transform, no intercept (tau is the bias)
    tbl := r.train_table || '_a';
    EXECUTE format('CREATE UNLOGGED TABLE %s (LIKE %s INCLUDING ALL) WITH (autovacuum_enabled = false)',
                   tbl, r.train_table);
    EXECUTE format('INSERT INTO %s (rid, x, y) SELECT r.rid, dpsql_internal._alg2_features(r.x, $1, $2), r.y'
                   '  FROM (%s) r ORDER BY r.rid', tbl, rows_sql) USING pm.mean, tau;
    EXECUTE format('DROP TABLE %s', r.train_table);
    EXECUTE format('ALTER TABLE %s RENAME TO %I', tbl, split_part(r.train_table, '.', 2));
    UPDATE dpsql.runs
       SET spec = spec || jsonb_build_object('dim', d + 1, 'flags', flags & ~7, 'intercept', false)
     WHERE runs.run_id = run;
    -- 5. DP-SGD: C = sqrt(2) G tau, step eta_0 / tau^2 (the same calibration, now with C)
    clip := sqrt(2) * c.lipschitz_data * tau;
    plan := dpsql_internal._whitebox_plan('dpsgd', (dpsql_internal._locked_run(run)).spec, m, epsilon / 3, delta / 3,
                                 sgd_params || jsonb_build_object('clip_norm', clip,
                                                                  'step_size', eta0 / (tau * tau)));
    theta := dpsql_internal._run_armed(run, plan, noise_seed);
    -- 6. map back; released as (w, b) on the rows after the row transform
    released := dpsql_internal._alg2_map_back(theta, pm.mean, tau);
    UPDATE dpsql.runs
       SET spec = spec || jsonb_build_object(
                'dim', d, 'intercept', true,
                'flags', (flags & ~dpsql_internal._flag('row_transform'))
                         | dpsql_internal._flag('intercept'))
     WHERE runs.run_id = run;
    mid := dpsql_internal._finish(run, released, (plan->'info') || jsonb_build_object(
        'mechanism', 'dpsgd_f_alg2', 'dataset_id', ds.dataset_id,
        'algorithm', 'DPSGD-F (Sun, Suresh, Menon 2024, Algorithm 2): private mean, private quantile '
                     'tau, features (x - mean, tau) clipped to sqrt(2) tau, DP-SGD with C = sqrt(2) G tau, '
                     'map back b = tau theta[d+1] - w . mean',
        'epsilon', epsilon, 'delta', delta, 'noise_scale', plan->'noise_scale',
        'ledger_entry', entry,
        'composition', 'basic: mean (epsilon/3, delta/3), tau (epsilon/3, 0), DP-SGD (epsilon/3, delta/3)',
        'theta', theta,
        'preprocessing', jsonb_build_object(
            'row_flags', row_flags, 'centre', array_fill(0::float8, ARRAY[d]),
            'mean', pm.mean, 'mean_info', pm.info,
            'tau', tau, 'tau_hat', tau_hat, 'tau_rank', tau_rank, 'tau_epsilon', epsilon / 3,
            'step_size', eta0 / (tau * tau), 'eta_0', eta0, 'clip_norm', clip),
        'noise_seed', dpsql_internal._noise_source(noise_seed)));
    PERFORM dpsql_internal._set_ledger_model(entry, mid);
    RETURN mid;
END $$;
SELECT dpsql_internal._register_mechanism(
    'dpsgd_f_alg2', '_train_dpsgd_f_alg2', 'classification', false, true,
    'DPSGD-F (Algorithm 2): private mean and quantile tau, features (x - mean, tau) clipped to '
    'sqrt(2) tau, DP-SGD, mapped back; epsilon/3 each', 'docs/whitebox.md',
    params => '{epochs,batch_size,lambda,step_size,schedule,huber_h,clip_norm,noise_multiplier}');
------------------------------------------------------------------------------------------
-- DP linear regression (docs/linear.md): DP-AMBSSGD and DP-SSGD (spec 000), DP-GD with
-- confidence intervals (spec 002) and AdaSSP. All are compositions of Gaussian mechanisms,
-- calibrated in zero-concentrated DP (rho-zCDP) under replace-one neighbours with public n.
-- This file holds what they share; each mechanism's plan and fit are in its own file
-- (41_ambssgd.sql, 42_dpgd.sql, 43_adassp.sql), found through the registry.
------------------------------------------------------------------------------------------

-- The largest rho whose zCDP -> (epsilon, delta) conversion rho + 2 sqrt(rho ln(1/delta)) is at
-- most epsilon (Bun-Steinke Prop. 1.3; spec 000 s. 3.3, spec 002 s. 2.2), and back. C core:
-- cython_ext/core/composition.h.
CREATE OR REPLACE FUNCTION dpsql.zcdp_rho(epsilon float8, delta float8)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_zcdp_rho_sql'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION dpsql.zcdp_rho(float8, float8) IS
    'Largest rho such that rho-zCDP implies (epsilon, delta)-DP';

CREATE OR REPLACE FUNCTION dpsql.zcdp_epsilon(rho float8, delta float8)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_zcdp_epsilon_sql'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION dpsql.zcdp_epsilon(float8, float8) IS 'epsilon of rho-zCDP at delta';

-- v plus i.i.d. N(0, sigma^2) noise on each coordinate (pg_strong_random unless a seed is given;
-- stream separates the uses of one seed).
CREATE OR REPLACE FUNCTION dpsql_internal._add_gaussian(v float8[], sigma float8, seed bigint, stream bigint)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_add_gaussian_sql' LANGUAGE C VOLATILE;

-- Every released iterate of a DP-GD model (N x p, in step order; independent runs one after
-- the other): the confidence intervals are post-processing of these.
CREATE TABLE IF NOT EXISTS dpsql.model_iterates (
    model_id    bigint PRIMARY KEY REFERENCES dpsql.model_store ON DELETE CASCADE,
    iterates    float8[] NOT NULL
);
COMMENT ON TABLE dpsql.model_iterates IS 'Released iterates of DP-GD models (for confidence intervals)';

-- A public number of a linear mechanism: the analyst's option, else the default; checked.
CREATE OR REPLACE FUNCTION dpsql_internal._linear_option(options jsonb, key text, fallback float8,
                                                lo float8 DEFAULT 0, lo_open boolean DEFAULT true)
RETURNS float8 LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v float8;
BEGIN
    IF options IS NULL OR options->key IS NULL OR options->key = 'null' THEN
        RETURN fallback;
    END IF;
    IF jsonb_typeof(options->key) <> 'number' THEN
        PERFORM dpsql_internal._fail(format('options.%s must be a number, got %s', key, options->key));
    END IF;
    v := (options->>key)::float8;
    IF NOT (v < 'Infinity') OR v < lo OR (lo_open AND v = lo) THEN
        PERFORM dpsql_internal._fail(format('options.%s must be a finite number %s %s, got %s', key,
                                   CASE WHEN lo_open THEN '>' ELSE '>=' END, lo, v));
    END IF;
    RETURN v;
END $$;

-- Clipping bounds every step, so ||w|| <= steps * eta * (clip + noise); refusing plans whose bound
-- is astronomical makes a non-finite model impossible whatever the data (an error there would be
-- a data-dependent, uncharged answer).
CREATE OR REPLACE FUNCTION dpsql_internal._check_finite_run(eta float8, steps float8, per_step float8)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF NOT (eta > 0 AND eta < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('step_size must be a finite number > 0, got %s', eta));
    END IF;
    IF NOT (eta * steps * per_step < 1e100) THEN
        PERFORM dpsql_internal._fail(format('step_size %s is too large: %s steps could overflow the model', eta, steps));
    END IF;
END $$;

-- What every linear plan starts from: the analyst's options checked against the mechanism's
-- registered list (31_mechanisms.sql), the intercept, p = d + intercept, rho, and the
-- registered bound on ||x||.
CREATE OR REPLACE FUNCTION dpsql_internal._linear_plan_common(privacy text, ds dpsql.datasets, d int,
                                                     epsilon float8, delta float8, params jsonb,
                                                     OUT options jsonb, OUT intercept boolean,
                                                     OUT p int, OUT rho float8, OUT x_bound float8)
LANGUAGE plpgsql AS $$
BEGIN
    options := dpsql_internal._plan_options(privacy, params);
    intercept := coalesce((params->>'intercept')::boolean, false);
    p := d + intercept::int;
    rho := dpsql.zcdp_rho(epsilon, delta);
    x_bound := coalesce(ds.row_bound, 0);  -- 0: rows are not clipped
END $$;

-- The plan of a linear mechanism: every public number it uses, computed from n, d, the
-- dataset's declarations and the analyst's parameters only (never from the data), and the
-- noise that makes it (epsilon, delta)-DP. 'info' goes into the model's provenance. The
-- mechanism's file registers its plan function.
CREATE OR REPLACE FUNCTION dpsql_internal._linear_plan(privacy text, ds dpsql.datasets, n bigint, d int,
                                              epsilon float8, delta float8, params jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    plan_function text := (dpsql_internal._mechanism(privacy)).plan_function;
    plan jsonb;
BEGIN
    IF plan_function IS NULL THEN
        PERFORM dpsql_internal._fail(format('%s is not a linear-regression mechanism', privacy));
    END IF;
    EXECUTE format('SELECT dpsql_internal.%I($1, $2, $3, $4, $5, $6, $7)', plan_function)
       INTO plan USING privacy, ds, n, d, epsilon, delta, params;
    RETURN plan;
END $$;

-- Train a linear mechanism on a registered regression dataset (the registered train
-- function of the linear mechanisms): their common checks, then plan and fit (33_planned.sql).
CREATE OR REPLACE FUNCTION dpsql_internal._train_linear(ds dpsql.datasets, model text, privacy text,
                                               params jsonb, epsilon float8, delta float8,
                                               noise_seed bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    IF ds.label_bound IS NULL THEN
        PERFORM dpsql_internal._fail(format('%s is linear regression, and dataset %s is a classification dataset',
                                   privacy, ds.name),
                            hint => 'Register the table with label_bound (a public bound on |y|) instead of labels.');
    END IF;
    IF delta IS NULL OR delta <= 0 THEN
        PERFORM dpsql_internal._fail(format('%s is (epsilon, delta)-DP through zCDP: delta must be > 0', privacy));
    END IF;
    RETURN dpsql_internal._train_planned(ds, 'linear', privacy, params, epsilon, delta, noise_seed);
END $$;

-- Student-t confidence intervals of a DP-GD model's coefficients, from its released iterates
-- (post-processing: no budget). coef_index is 1-based as in the coef array; with an intercept
-- the last index (n_features + 1) is the intercept.
CREATE OR REPLACE FUNCTION dpsql.confint(model_id bigint, alpha float8 DEFAULT 0.05)
RETURNS TABLE (coef_index int, estimate float8, lower float8, upper float8)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    m record;
    its float8[];
    ci jsonb;
BEGIN
    IF alpha IS NULL OR NOT (alpha > 0 AND alpha < 1) THEN
        PERFORM dpsql_internal._fail(format('alpha must be in (0, 1), got %s', coalesce(alpha::text, 'NULL')));
    END IF;
    -- Only models the caller may see (the row-filtered view, evaluated as the session user).
    SELECT v.model_id, v.privacy, v.params INTO m FROM dpsql.models v WHERE v.model_id = confint.model_id;
    IF NOT FOUND THEN
        PERFORM dpsql_internal._fail(format('no model %s', coalesce(model_id::text, 'NULL')), '42704');
    END IF;
    SELECT i.iterates INTO its FROM dpsql.model_iterates i WHERE i.model_id = confint.model_id;
    ci := m.params->'privacy'->'ci';
    IF its IS NULL OR ci IS NULL OR ci->>'method' = 'none' THEN
        PERFORM dpsql_internal._fail(format('model %s has no confidence intervals', model_id),
                            hint => 'Train with privacy => ''dpgd'' and ci => batch_means, checkpoints or independent_runs.');
    END IF;
    IF (ci->>'mixed')::boolean IS FALSE THEN
        RAISE WARNING 'dpsql: model %''s run had not mixed (autocorrelation % between draws): its intervals are biased',
                      model_id, round((ci->>'draw_autocorrelation')::numeric, 2)
            USING HINT = 'Scale the features to be close to isotropic, or use a larger step_size and more steps (docs/linear.md).';
    END IF;
    RETURN QUERY SELECT t.coef_index, t.estimate, t.lower, t.upper
                   FROM dpsql_internal._t_interval(dpsql_internal._confint_draws(its, ci->>'method',
                                                               (ci->>'draws')::int,
                                                               (ci->>'burn_in')::int), alpha) t;
END $$;
COMMENT ON FUNCTION dpsql.confint(bigint, float8) IS
    'Student-t confidence intervals of a DP-GD model''s coefficients (from its released iterates)';
------------------------------------------------------------------------------------------
-- DP-AMBSSGD and DP-SSGD (spec 000): one pass over a shuffled training table, in one
-- aggregate call (cython_ext/core/ambssgd.h). The state holds noiseless intermediate values
-- (residuals, gradient sums): it stays inside the server; _ambssgd_result releases the
-- private transcript only. Not granted to anyone here (the entry points call these). Then
-- their plans (public numbers only) and their shared fit.
------------------------------------------------------------------------------------------

-- A fresh pass state (w_0 = 0). stat > 0: adaptive clipping (DP-STAT, levels
-- domain 2^(i - levels), count noise sigma_c, threshold theta, zeta_t = r_x gamma_t log_factor);
-- stat = 0: fixed clipping norm zeta_fixed (DP-SSGD with batch 1 and blocks = n_rows).
-- The noise generator is keyed by pg_strong_random, or by seed (tests only: not private).
CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_init(dim int, intercept boolean, x_bound float8,
                                               n_rows bigint, blocks int, batch bigint,
                                               stat bigint, alpha float8, eta float8,
                                               r_x float8, log_factor float8, domain float8,
                                               levels int, sigma_c float8, theta float8,
                                               zeta_fixed float8, seed bigint)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_ambssgd_init_state'
LANGUAGE C CALLED ON NULL INPUT VOLATILE PARALLEL UNSAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_transition(state float8[], x float8[], y float8,
                                                     init float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_ambssgd_transition'
LANGUAGE C CALLED ON NULL INPUT VOLATILE PARALLEL UNSAFE;

-- The whole one-pass algorithm: rows count in the order they arrive (call it with
-- ORDER BY rid); init comes from _ambssgd_init and is used for one pass only. Sequential by
-- nature: no combine function, never in a parallel plan. Malformed rows (NULL x or y, wrong
-- length, NaN/Inf) are zero records, never errors.
CREATE OR REPLACE AGGREGATE dpsql.ambssgd_pass(x float8[], y float8, init float8[]) (
    SFUNC = dpsql_internal._ambssgd_transition,
    STYPE = float8[],
    PARALLEL = UNSAFE
);

-- The released transcript of a finished pass: the tail average w_bar, gamma_t and zeta_t of
-- every block, and how many noisy counts each block's DP-STAT made (<= levels + 1).
CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_result(state float8[], OUT weights float8[],
                                                 OUT gammas float8[], OUT zetas float8[],
                                                 OUT draws int[], OUT rows_used bigint,
                                                 OUT rows_unused bigint)
AS 'MODULE_PATHNAME', 'dpsql_ambssgd_result_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

-- R_x: the "expected x norm" of spec 000 (E||x||^2 x x^T <= R_x^2 H); the registered bound on
-- ||x|| is one (plus the intercept's constant 1).
CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_r_x(privacy text, options jsonb, x_bound float8,
                                              intercept boolean)
RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
    r_x float8 := dpsql_internal._linear_option(options, 'r_x', sqrt(nullif(x_bound, 0) ^ 2 + intercept::int));
BEGIN
    IF r_x IS NULL THEN
        PERFORM dpsql_internal._fail(format('%s needs a public R_x (a bound on ||x||)', privacy),
                            hint => 'Register the dataset with row_bound (or feature_bounds), or pass options => ''{"r_x": ...}''.');
    END IF;
    RETURN r_x;
END $$;

-- The plan of DP-AMBSSGD (its registered plan_function, called by _train_planned, 33_planned.sql).
CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_plan(privacy text, ds dpsql.datasets, n bigint, d int,
                                               epsilon float8, delta float8, params jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    options jsonb;
    intercept boolean;
    p int;
    rho float8;
    x_bound float8;
    r_x float8;
    h_norm float8;
    blocks bigint;
    m bigint;
    s bigint;
    b bigint;
    eta float8;
    alpha float8;
    levels int;
    sigma_c float8;
    gamma_hat float8;
    beta_s float8;
    domain float8;
    log_factor float8;
BEGIN
    SELECT * INTO options, intercept, p, rho, x_bound
      FROM dpsql_internal._linear_plan_common(privacy, ds, d, epsilon, delta, params);
    r_x := dpsql_internal._ambssgd_r_x(privacy, options, x_bound, intercept);
    -- Spec 000 s. 2.3 / 5.3: T = c1 kappa ln N blocks (even), blocks of b + s rows with
    -- s = floor(m / 11); eta = b / (R_x^2 + (b - 1) ||H||) (Lemma 22); the robust DP-STAT
    -- (V1: n_q = L + 1 counts of std alpha sqrt(n_q); V2: threshold s - Gamma_hat;
    -- V3: refuse s < 2 Gamma_hat; Delta = B 2^-L with L = ceil(log2 N)).
    h_norm := dpsql_internal._linear_option(options, 'h_norm', r_x ^ 2);  -- ||H|| <= E||x||^2 <= R_x^2
    blocks := coalesce((params->>'steps')::bigint,
                       2 * ceil(dpsql_internal._linear_option(options, 'c1', 8)
                                * dpsql_internal._linear_option(options, 'condition_number', 1, 1, false)
                                * ln(n) / 2)::bigint);
    IF blocks < 2 OR blocks % 2 <> 0 THEN
        PERFORM dpsql_internal._fail(format('DP-AMBSSGD needs an even number of blocks >= 2 (steps), got %s', blocks));
    END IF;
    m := n / blocks;
    s := m / 11;
    b := m - s;
    IF s < 1 OR b < 1 THEN
        PERFORM dpsql_internal._fail(format('%s rows make no blocks of a stat sample and a batch for %s blocks',
                                   n, blocks),
                            hint => 'Use fewer blocks (steps), more rows, or privacy => ''dpgd'' (or ''auto'').');
    END IF;
    eta := coalesce((params->>'step_size')::float8,
                    dpsql_internal._linear_option(options, 'step_scale', 1) * b / (r_x ^ 2 + (b - 1) * h_norm));
    -- Paper accounting: DP-STAT and the gradient step each 1/(2 alpha^2)-zCDP, added (rho =
    -- 1/alpha^2); tight: a record is in one of them only (rho = 1/(2 alpha^2), s. 3.4).
    alpha := CASE WHEN coalesce((options->>'tight_accounting')::boolean, false)
                  THEN 1 / sqrt(2 * rho) ELSE 1 / sqrt(rho) END;
    levels := ceil(log(2, n::numeric))::int;
    sigma_c := alpha * sqrt(levels + 1);
    beta_s := dpsql_internal._linear_option(options, 'beta_stat', 1e-3);
    IF beta_s >= 1 THEN
        PERFORM dpsql_internal._fail('options.beta_stat must be in (0, 1)');
    END IF;
    gamma_hat := sigma_c * sqrt(2 * ln(2 * (levels + 1) / beta_s));
    IF s < 2 * gamma_hat THEN
        PERFORM dpsql_internal._fail(format('DP-STAT is infeasible: stat samples of %s rows < 2 Gamma = %s '
                                   '(it would return a tiny clip norm and learn nothing, spec 000 V3)',
                                   s, round(2 * gamma_hat)),
                            hint => format('Needs about %s rows at this epsilon and %s blocks; use more rows, '
                                           'a larger epsilon or fewer blocks (steps), or privacy => ''dpgd'' '
                                           '(or ''auto''), which works on this many rows.',
                                           ceil(2 * gamma_hat) * 11 * blocks, blocks));
    END IF;
    domain := dpsql_internal._linear_option(options, 'domain_bound', 2 * ds.label_bound);
    log_factor := ln(n) ^ dpsql_internal._linear_option(options, 'log_exponent', 0.5, 0, false);
    -- zeta_t <= r_x B log_factor; the noise's normals stay below 100 sd.
    PERFORM dpsql_internal._check_finite_run(eta, blocks, r_x * domain * log_factor * (1 + 200 * alpha * sqrt(p)));
    RETURN jsonb_build_object(
        'epsilon', epsilon, 'delta', delta, 'rho', rho, 'noise_multiplier', alpha,
        'blocks', blocks, 'batch_size', b, 'stat_size', s, 'step_size', eta, 'r_x', r_x,
        'h_norm', h_norm, 'log_factor', log_factor, 'domain_bound', domain, 'levels', levels,
        'count_noise_std', sigma_c, 'stat_threshold', s - gamma_hat, 'beta_stat', beta_s,
        'x_bound', x_bound, 'intercept', intercept, 'dim', d, 'rows', n,
        'unused_rows', n - blocks * (b + s),
        'info', jsonb_build_object(
            'algorithm', 'DP-AMBSSGD (Varshney, Thakurta, Jain 2022; one pass, robust DP-STAT V1-V4)',
            'accounting', CASE WHEN coalesce((options->>'tight_accounting')::boolean, false)
                               THEN 'zCDP, parallel composition over blocks, rho = 1/(2 alpha^2) (a record is in DP-STAT or the step)'
                               ELSE 'zCDP, parallel composition over blocks, rho = 1/alpha^2 (paper)' END,
            'rho', rho, 'noise_multiplier', alpha, 'blocks', blocks, 'batch_size', b,
            'stat_size', s, 'step_size', eta, 'r_x', r_x, 'h_norm', h_norm,
            'log_factor', log_factor, 'domain_bound', domain, 'levels', levels,
            'count_noise_std', sigma_c, 'stat_threshold', s - gamma_hat,
            'gradient_noise_std', '2 zeta_t alpha / b on the mean gradient',
            'unused_rows', n - blocks * (b + s),
            'neighbouring', 'replace-one, n public'));
END $$;

-- The plan of DP-SSGD (its registered plan_function, called by _train_planned, 33_planned.sql).
CREATE OR REPLACE FUNCTION dpsql_internal._ssgd_plan(privacy text, ds dpsql.datasets, n bigint, d int,
                                            epsilon float8, delta float8, params jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    options jsonb;
    intercept boolean;
    p int;
    rho float8;
    x_bound float8;
    r_x float8;
    blocks bigint;
    zeta float8;
    eta float8;
    alpha float8;
    sd float8;
BEGIN
    SELECT * INTO options, intercept, p, rho, x_bound
      FROM dpsql_internal._linear_plan_common(privacy, ds, d, epsilon, delta, params);
    r_x := dpsql_internal._ambssgd_r_x(privacy, options, x_bound, intercept);
    -- Spec 000 Algorithm 1: batch 1, one pass, fixed clip zeta, noise 2 zeta alpha on each
    -- step's gradient; each record is in one Gaussian step (parallel composition; no
    -- amplification by shuffling is claimed: rho = 1/(2 alpha^2)).
    blocks := (n / 2) * 2;
    zeta := coalesce((params->>'clip_norm')::float8, r_x * ds.label_bound);
    IF NOT (zeta > 0 AND zeta < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('clip_norm must be a finite number > 0, got %s', zeta));
    END IF;
    eta := coalesce((params->>'step_size')::float8, 1 / (2 * r_x ^ 2));
    alpha := 1 / sqrt(2 * rho);
    PERFORM dpsql_internal._check_finite_run(eta, blocks, zeta * (1 + 200 * alpha * sqrt(p)));
    -- Constant-step SGD settles with the iterate's noise covariance about
    -- (eta s^2 / 2) H^-1 (s the gradient noise std), so a row's prediction noise has
    -- E (x^T noise)^2 = eta s^2 p / 2 whatever H: public. At the label bound or above, the
    -- release predicts no better than 0; it is refused unless reproducing the baseline.
    sd := sqrt(eta * p / 2) * 2 * zeta * alpha;
    IF sd >= ds.label_bound AND NOT coalesce((options->>'baseline')::boolean, false) THEN
        PERFORM dpsql_internal._fail(format('DP-SSGD''s noise would swamp the model: its predictions would carry '
                                   'noise of sd %s, beyond the label bound %s', round(sd::numeric, 2),
                                   ds.label_bound),
                            hint => 'One noisy step per row is the paper''s baseline: use privacy => '
                                    '''dpgd'', ''adassp'' or ''auto'', or options => {"baseline": true} '
                                    'to reproduce it anyway.');
    END IF;
    RETURN jsonb_build_object(
        'epsilon', epsilon, 'delta', delta, 'rho', rho, 'noise_multiplier', alpha,
        'blocks', blocks, 'batch_size', 1, 'stat_size', 0, 'step_size', eta, 'r_x', r_x,
        'clip_norm', zeta, 'x_bound', x_bound, 'intercept', intercept, 'dim', d, 'rows', n,
        'unused_rows', n - blocks,
        'info', jsonb_build_object(
            'algorithm', 'DP-SSGD (Varshney, Thakurta, Jain 2022, Algorithm 1; baseline)',
            'accounting', 'zCDP, one Gaussian step per record (parallel composition), rho = 1/(2 alpha^2); no shuffling amplification',
            'rho', rho, 'noise_multiplier', alpha, 'clip_norm', zeta, 'step_size', eta,
            'r_x', r_x, 'gradient_noise_std', 2 * zeta * alpha, 'unused_rows', n - blocks,
            'stationary_prediction_noise_sd', sd,
            'neighbouring', 'replace-one, n public'));
END $$;

-- DP-AMBSSGD / DP-SSGD: one aggregate scan of the shuffled training table in rid order.
CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_fit(train_table text, plan jsonb, noise_seed bigint,
                                              OUT weights float8[], OUT info jsonb,
                                              OUT iterates float8[])
LANGUAGE plpgsql
SET max_parallel_workers_per_gather = 0
SET synchronize_seqscans = off
AS $$
DECLARE
    st float8[];
    res record;
BEGIN
    st := dpsql_internal._ambssgd_init(
        (plan->>'dim')::int, (plan->>'intercept')::boolean, (plan->>'x_bound')::float8,
        (plan->>'rows')::bigint, (plan->>'blocks')::int, (plan->>'batch_size')::bigint,
        (plan->>'stat_size')::bigint, (plan->>'noise_multiplier')::float8,
        (plan->>'step_size')::float8, (plan->>'r_x')::float8,
        coalesce((plan->>'log_factor')::float8, 1), coalesce((plan->>'domain_bound')::float8, 1),
        coalesce((plan->>'levels')::int, 0), coalesce((plan->>'count_noise_std')::float8, 0),
        coalesce((plan->>'stat_threshold')::float8, 0), coalesce((plan->>'clip_norm')::float8, 0),
        noise_seed);
    -- One pass in the order of the (data-independent) permutation.
    EXECUTE format('SELECT dpsql.ambssgd_pass(x, y, $1 ORDER BY rid) FROM %s', train_table)
       INTO st USING st;
    res := dpsql_internal._ambssgd_result(st);
    weights := res.weights;
    -- The transcript (gamma_t, zeta_t) is covered by the guarantee (spec 000 s. 2.3).
    info := CASE WHEN (plan->>'stat_size')::bigint > 0
                 THEN jsonb_build_object('released_gammas', res.gammas, 'released_zetas', res.zetas)
                 ELSE '{}' END;
    iterates := NULL;
END $$;

SELECT dpsql_internal._register_mechanism(
    'dp_ambssgd', '_train_linear', 'regression', false, true,
    'DP-AMBSSGD: one pass, adaptive clipping by DP-STAT, tail averaging', 'docs/linear.md',
    options => '{r_x,h_norm,condition_number,c1,step_scale,domain_bound,beta_stat,tight_accounting,log_exponent}',
    plan_function => '_ambssgd_plan', fit_function => '_ambssgd_fit',
    params => '{steps,clip_norm,step_size,options}');
SELECT dpsql_internal._register_mechanism(
    'dp_ssgd', '_train_linear', 'regression', false, true,
    'DP-SSGD: the spec''s baseline, one noisy step per row (refused where its noise swamps the model)',
    'docs/linear.md', options => '{r_x,baseline}',
    plan_function => '_ssgd_plan', fit_function => '_ambssgd_fit',
    params => '{steps,clip_norm,step_size,options}');
------------------------------------------------------------------------------------------
-- DP-GD for linear regression (spec 002): one aggregate scan per gradient step, the noisy
-- step in the server, and the confidence intervals built from released iterates. Then its
-- plan and fit.
------------------------------------------------------------------------------------------

-- The clipped gradient sum of one full-batch step. Rows: x_bound > 0 clips x to that norm,
-- intercept appends a feature 1 after it; a NULL or malformed record (NULL x or y, wrong
-- length, NULL elements, NaN/Inf) counts as a row and adds nothing. theta, gamma, intercept
-- and x_bound are the step's public constants (read on the first row).
CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_gradient_transition(state float8[], x float8[], y float8,
                                                           theta float8[], gamma float8,
                                                           intercept boolean, x_bound float8)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_dpgd_gradient_transition'
LANGUAGE C CALLED ON NULL INPUT PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_gradient_combine(a float8[], b float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_dpgd_gradient_combine'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_gradient_final(state float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_dpgd_gradient_final'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

-- Returns [sum_1 .. sum_p, n, clipped] (p = length of theta): the sum over rows of
-- x_i (<x_i, theta> - y_i) clipped to norm gamma (gamma = 'Infinity': no clipping), the row
-- count n, and the number of clipped gradients (a diagnostic, NOT private: never release it).
-- NULL when no row was scanned. Partial sums of a parallel scan add up (COMBINEFUNC).
CREATE OR REPLACE AGGREGATE dpsql.dpgd_gradient(x float8[], y float8, theta float8[], gamma float8,
                                                intercept boolean, x_bound float8) (
    SFUNC = dpsql_internal._dpgd_gradient_transition,
    STYPE = float8[],
    FINALFUNC = dpsql_internal._dpgd_gradient_final,
    COMBINEFUNC = dpsql_internal._dpgd_gradient_combine,
    PARALLEL = SAFE
);

-- theta - eta * sum / n + eta * z, z ~ N(0, noise_std^2 I), from dpgd_gradient's output
-- grad. The noise is keyed by pg_strong_random, or by seed (tests only: NOT private) with
-- stream separating the steps of a run.
CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_step(theta float8[], grad float8[], eta float8,
                                            noise_std float8, seed bigint DEFAULT NULL,
                                            stream bigint DEFAULT 0)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_dpgd_step_sql'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

-- The m draws of a confidence-interval method from released iterates (N x p, row k holds
-- theta_k): 'independent_runs' (the runs' iterates concatenated; the mean of each run's
-- iterates after the burn-in), 'checkpoints' (theta_{b + l B}, B = floor((N - b) / m)) or
-- 'batch_means' (means of m consecutive batches of B iterates after the burn-in).
CREATE OR REPLACE FUNCTION dpsql_internal._confint_draws(iterates float8[], method text, draws int,
                                                burn_in int)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_confint_draws_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- Rows estimate (mean), sd (ddof = 1), lower, upper of the per-coordinate t-interval
-- mean -/+ t_{m-1, 1-alpha/2} sd / sqrt(m) from m draws (m x p).
CREATE OR REPLACE FUNCTION dpsql_internal._t_interval_matrix(draws float8[], alpha float8)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_t_interval_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- The same, one row per coefficient (coef_index 1..p).
CREATE OR REPLACE FUNCTION dpsql_internal._t_interval(draws float8[], alpha float8,
                                             OUT coef_index int, OUT estimate float8,
                                             OUT lower float8, OUT upper float8, OUT sd float8)
RETURNS SETOF record LANGUAGE sql STRICT IMMUTABLE PARALLEL SAFE AS $$
    SELECT j, ci[1][j], ci[3][j], ci[4][j], ci[2][j]
    FROM (SELECT dpsql_internal._t_interval_matrix(draws, alpha) AS ci) AS t,
         generate_series(1, array_length(t.ci, 2)) AS j
$$;

-- The p-quantile of Student's t with df >= 1 degrees of freedom.
CREATE OR REPLACE FUNCTION dpsql.t_quantile(p float8, df float8)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_t_quantile_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- The plan of DP-GD (its registered plan_function, called by _train_planned, 33_planned.sql).
CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_plan(privacy text, ds dpsql.datasets, n bigint, d int,
                                            epsilon float8, delta float8, params jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    options jsonb;
    intercept boolean;
    p int;
    rho float8;
    x_bound float8;
    ci text;
    draws int;
    burn_in int;
    precondition boolean;
    steps bigint;
    runs int;
    eta float8;
    gamma float8;
    rho_check float8;
    rho_pre float8;
    rho_gd float8;
    lam float8;
BEGIN
    SELECT * INTO options, intercept, p, rho, x_bound
      FROM dpsql_internal._linear_plan_common(privacy, ds, d, epsilon, delta, params);
    -- Spec 002: eta = 1/5, gamma = 5 sqrt(p) max(sigma_prior, 1), theta_0 = 0, and
    -- lambda^2 = 2 N gamma^2 / (rho n^2) over all N released steps (Lemma 2.1).
    ci := coalesce(params->>'ci', 'batch_means');
    IF ci NOT IN ('none', 'batch_means', 'checkpoints', 'independent_runs') THEN
        PERFORM dpsql_internal._fail(format('unknown ci %s', quote_literal(ci)),
                            hint => 'Use batch_means (default), checkpoints, independent_runs or none.');
    END IF;
    draws := coalesce((params->>'ci_draws')::int, 10);
    burn_in := coalesce((params->>'burn_in')::int, 20);
    IF ci <> 'none' AND (draws IS NULL OR draws < 2 OR draws > 1000) THEN
        PERFORM dpsql_internal._fail(format('ci_draws must be between 2 and 1000, got %s', draws));
    END IF;
    IF burn_in < 0 THEN
        PERFORM dpsql_internal._fail(format('burn_in must be >= 0, got %s', burn_in));
    END IF;
    -- On by default when the rows have a public norm bound (the noisy matrix needs one).
    precondition := coalesce((options->>'precondition')::boolean, x_bound > 0);
    -- Draws 40 steps apart (spec 002); whitened, 120: the directions the private
    -- preconditioner cannot resolve (eigenvalues under its noise floor) keep whitened
    -- eigenvalues near 0.03, and (1 - 0.03)^120 < 0.03, the `mixed` threshold.
    steps := coalesce((params->>'steps')::bigint,
                      CASE WHEN ci = 'none' THEN 20
                           WHEN ci = 'independent_runs' THEN draws * (burn_in + 40)
                           ELSE burn_in + CASE WHEN precondition THEN 120 ELSE 40 END * draws END);
    IF steps < 1 OR steps > 20000 THEN  -- each step is a scan; iterates are appended
        PERFORM dpsql_internal._fail(format('steps must be between 1 and 20000, got %s', steps));
    END IF;
    runs := CASE WHEN ci = 'independent_runs' THEN draws ELSE 1 END;
    IF ci = 'independent_runs' AND (steps % draws <> 0 OR steps / draws <= burn_in) THEN
        PERFORM dpsql_internal._fail(format('independent runs: steps (%s) must split into %s runs longer than the burn-in (%s)',
                                   steps, draws, burn_in));
    ELSIF ci IN ('batch_means', 'checkpoints') AND (steps - burn_in) / draws < 1 THEN
        PERFORM dpsql_internal._fail(format('%s steps leave no %s draws after a burn-in of %s', steps, draws, burn_in));
    END IF;
    -- Whitened rows have a Hessian near I, where a step of 1 mixes in a few steps.
    eta := coalesce((params->>'step_size')::float8, CASE WHEN precondition THEN 1.0 ELSE 0.2 END);
    gamma := coalesce((params->>'clip_norm')::float8,
                      5 * sqrt(p) * greatest(dpsql_internal._linear_option(options, 'noise_level', 1), 1));
    IF NOT (gamma > 0 AND gamma < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('clip_norm must be a finite number > 0, got %s', gamma));
    END IF;
    -- What the intervals cover depends on clipping at the estimate: a noisy count of the
    -- rows clipped there (sensitivity 1) takes 1/50 of rho unless options.clip_check = false.
    rho_check := CASE WHEN coalesce((options->>'clip_check')::boolean, true) THEN rho / 50 ELSE 0 END;
    -- A private preconditioner (44_dpgd_precondition.sql) takes a tenth of rho.
    IF precondition AND x_bound = 0 THEN
        PERFORM dpsql_internal._fail('the preconditioner needs a public bound on ||x||',
                            hint => 'Register the dataset with row_bound, feature_bounds or row_norm => ''clip''.');
    END IF;
    rho_pre := CASE WHEN precondition THEN rho / 10 ELSE 0 END;
    rho_gd := rho - rho_check - rho_pre;
    lam := sqrt(2 * steps) * gamma / (sqrt(rho_gd) * n);
    PERFORM dpsql_internal._check_finite_run(eta, steps, gamma + 100 * lam * sqrt(p));
    RETURN jsonb_build_object(
        'epsilon', epsilon, 'delta', delta, 'rho', rho, 'steps', steps, 'runs', runs,
        'step_size', eta, 'clip_norm', gamma, 'noise_std', lam, 'ci', ci, 'ci_draws', draws,
        'burn_in', burn_in, 'rho_check', rho_check,
        'precondition', precondition, 'rho_pre', rho_pre,
        'pre_noise_std', CASE WHEN precondition
                              THEN (dpsql.adassp_sensitivities(sqrt(x_bound ^ 2 + intercept::int), 1)).xtx
                                   / sqrt(2 * rho_pre) END,
        'check_noise_std', CASE WHEN rho_check > 0 THEN 1 / sqrt(2 * rho_check) END,
        'x_bound', x_bound, 'intercept', intercept, 'dim', d, 'rows', n,
        'info', jsonb_build_object(
            'algorithm', 'DP-GD (Brown et al. 2024, Algorithm 1), every iterate released',
            'accounting', format('zCDP: %s Gaussian steps of sensitivity 2 gamma/n (rho %s)%s%s',
                                 steps, rho_gd, CASE WHEN rho_check > 0
                                 THEN format(' + a clipped-row count at the estimate (rho %s)', rho_check) ELSE '' END,
                                 CASE WHEN precondition
                                 THEN format(' + the preconditioner''s second-moment matrix (rho %s)', rho_pre) ELSE '' END),
            'rho', rho, 'steps', steps, 'runs', runs, 'step_size', eta, 'clip_norm', gamma,
            'noise_std', lam, 'theta0', 0,
            'neighbouring', 'replace-one, n public'));
END $$;

-- The registry's fit of DP-GD: on the privately whitened rows when the plan has a
-- preconditioner (44_dpgd_precondition.sql), else on the rows as they are.
CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_fit(train_table text, plan jsonb, noise_seed bigint,
                                           OUT weights float8[], OUT info jsonb,
                                           OUT iterates float8[])
LANGUAGE plpgsql AS $$
BEGIN
    IF (plan->>'precondition')::boolean THEN
        SELECT * INTO weights, info, iterates
          FROM dpsql_internal._dpgd_fit_preconditioned(train_table, plan, noise_seed);
    ELSE
        SELECT * INTO weights, info, iterates FROM dpsql_internal._dpgd_fit_plain(train_table, plan, noise_seed);
    END IF;
END $$;

-- DP-GD on the rows as they are: one aggregate scan per step for the clipped gradient sum; the
-- noise is added in the server. Every iterate is kept (released) for the confidence intervals.
CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_fit_plain(train_table text, plan jsonb, noise_seed bigint,
                                                 OUT weights float8[], OUT info jsonb,
                                                 OUT iterates float8[])
LANGUAGE plpgsql AS $$
DECLARE
    p int := (plan->>'dim')::int + (plan->>'intercept')::boolean::int;
    steps bigint := (plan->>'steps')::bigint;
    runs int := (plan->>'runs')::int;
    per_run bigint := steps / runs;
    gamma float8 := (plan->>'clip_norm')::float8;
    icpt boolean := (plan->>'intercept')::boolean;
    xb float8 := (plan->>'x_bound')::float8;
    q text := format('SELECT dpsql.dpgd_gradient(x, y, $1, $2, $3, $4) FROM %s', train_table);
    theta float8[];
    g float8[];
    k bigint := 0;
    rows_clipped float8;
    ci text := plan->>'ci';
    lag_ac float8;
BEGIN
    iterates := '{}';
    FOR run_i IN 1..runs LOOP
        theta := array_fill(0::float8, ARRAY[p]);
        FOR t IN 1..per_run LOOP
            k := k + 1;
            EXECUTE q INTO g USING theta, gamma, icpt, xb;
            theta := dpsql_internal._dpgd_step(theta, g, (plan->>'step_size')::float8,
                                      (plan->>'noise_std')::float8, noise_seed, k);
            iterates := iterates || ARRAY[theta];
            PERFORM dpsql_internal._progress('step', k, runs::bigint * per_run);
        END LOOP;
    END LOOP;
    IF ci = 'none' THEN
        weights := theta;  -- the final iterate (spec 002 s. 2.1)
    ELSE
        SELECT array_agg(estimate ORDER BY coef_index) INTO weights
          FROM dpsql_internal._t_interval(dpsql_internal._confint_draws(iterates, ci, (plan->>'ci_draws')::int,
                                                      (plan->>'burn_in')::int), 0.05);
    END IF;
    IF ci = 'batch_means' OR ci = 'checkpoints' THEN
        -- draws are (steps - burn_in) / m iterates apart: they should be nearly uncorrelated
        lag_ac := dpsql_internal._iterate_autocorrelation(iterates, (plan->>'burn_in')::int,
            ((steps - (plan->>'burn_in')::int) / (plan->>'ci_draws')::int)::int);
    ELSIF ci = 'independent_runs' THEN
        -- within a run: its post-burn-in mean should have forgotten the start
        lag_ac := dpsql_internal._iterate_autocorrelation(iterates[1:per_run], (plan->>'burn_in')::int,
                                                 (per_run - (plan->>'burn_in')::int)::int);
    END IF;
    info := jsonb_build_object('ci', jsonb_build_object(
        'method', ci, 'draws', (plan->'ci_draws'), 'burn_in', (plan->'burn_in'),
        'draw_autocorrelation', lag_ac,
        'mixed', CASE WHEN lag_ac IS NOT NULL THEN lag_ac < 0.03 END,
        'estimate', CASE WHEN ci = 'none' THEN 'final iterate' ELSE 'mean of the draws' END,
        'covers', 'the OLS solution of the training rows if no gradient is clipped near it; '
                  'otherwise the minimiser of the Huberised loss with B_i = clip_norm/||x_i|| (spec 002 s. 3.5)'));
    IF (plan->>'rho_check')::float8 > 0 THEN
        EXECUTE q INTO g USING weights, gamma, icpt, xb;
        rows_clipped := (dpsql_internal._add_gaussian(ARRAY[g[p + 2]], (plan->>'check_noise_std')::float8,
                                             noise_seed, k + 1))[1];
        info := jsonb_set(info, '{ci,clipped_rows_at_estimate}', to_jsonb(rows_clipped));
        info := jsonb_set(info, '{ci,clipped_rows_noise_std}', plan->'check_noise_std');
        info := jsonb_set(info, '{ci,target}', to_jsonb(
            CASE WHEN rows_clipped > 3 * (plan->>'check_noise_std')::float8
                 THEN 'huberised' ELSE 'ols' END));
    END IF;
END $$;

-- The correlation between draws `lag` iterates apart implied by each coordinate's lag-1
-- autocorrelation r after the burn-in (r^lag, the AR(1) the unclipped run is along each
-- eigen-direction), the largest over the coordinates: a free check (post-processing of released
-- iterates) that the draws are nearly independent. A run that has not mixed (a slow direction,
-- spec 002 traps 8-9) has r near 1. (r^lag is far more stable than the lag-`lag` sample
-- autocorrelation, which is biased low for slow series.) C core: stats.h; a tiny r^lag is 0,
-- never an underflow error (an error after the noise would be an uncharged answer).
CREATE OR REPLACE FUNCTION dpsql_internal._iterate_autocorrelation(iterates float8[], burn_in int, lag int)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_iterate_autocorrelation_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

SELECT dpsql_internal._register_mechanism(
    'dpgd', '_train_linear', 'regression', false, true,
    'DP-GD: full-batch noisy gradient descent with confidence intervals, privately preconditioned',
    'docs/linear.md', options => '{noise_level,clip_check,precondition}',
    plan_function => '_dpgd_plan', fit_function => '_dpgd_fit',
    params => '{steps,ci,ci_draws,burn_in,clip_norm,step_size,options}', distributed => 'sums');
------------------------------------------------------------------------------------------
-- AdaSSP (Wang 2018, Algorithm 2; spec 002 section 6.4): DP linear regression by
-- sufficient-statistics perturbation with an adaptive ridge. C core: cython_ext/core/adassp.h
-- (the mechanism, the sensitivities and their proofs); glue: sql/src/adassp_fmgr.c. Then its
-- plan and fit.
------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION dpsql_internal._adassp_gram_transition(state float8[], x float8[], y float8,
                                                         x_bound float8, y_bound float8,
                                                         intercept boolean, dim int)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_adassp_gram_transition'
LANGUAGE C CALLED ON NULL INPUT PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._adassp_gram_combine(a float8[], b float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_adassp_gram_combine'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._adassp_gram_final(state float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_adassp_gram_final'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- The noiseless sufficient statistics of one scan, [n, p, X^T X (p*p, row-major), X^T y (p)]:
-- each row's dim features (plus a constant 1, last, when intercept; p = dim + intercept) are
-- clipped as ONE vector to norm x_bound (x_bound >= 1 with an intercept), y to
-- [-y_bound, y_bound]. A NULL x or y, an x of another length, or a NaN/Infinity makes the
-- zero record: it counts in n and adds nothing. NULL when there are no rows. dim must be
-- public (never inferred from the rows). Parallel partial scans are summed.
CREATE OR REPLACE AGGREGATE dpsql.adassp_gram(x float8[], y float8, x_bound float8,
                                              y_bound float8, intercept boolean, dim int) (
    SFUNC = dpsql_internal._adassp_gram_transition,
    STYPE = float8[],
    FINALFUNC = dpsql_internal._adassp_gram_final,
    COMBINEFUNC = dpsql_internal._adassp_gram_combine,
    PARALLEL = SAFE
);

-- The release (adassp.h): lambda_tilde = max(lambda_min(X^T X) + sigma_min Z - min_shift, 0),
-- ridge = max(0, ridge_factor - lambda_tilde),
-- weights = (X^T X + sigma_xx E + ridge I)^{-1} (X^T y + sigma_xy z). The caller calibrates the
-- sigmas from dpsql.adassp_sensitivities. Noise from pg_strong_random unless seed is given
-- (tests only: not private). A singular noisy system raises SQLSTATE 22P01 (nothing released).
CREATE OR REPLACE FUNCTION dpsql_internal._adassp_release(gram float8[], sigma_min float8, sigma_xx float8,
                                                 sigma_xy float8, min_shift float8,
                                                 ridge_factor float8, seed bigint DEFAULT NULL,
                                                 OUT weights float8[], OUT ridge float8,
                                                 OUT lambda_min_noisy float8)
AS 'MODULE_PATHNAME', 'dpsql_adassp_release_sql'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

CREATE OR REPLACE FUNCTION dpsql.adassp_sensitivities(x_bound float8, y_bound float8,
                                                      OUT lambda_min float8, OUT xtx float8,
                                                      OUT xty float8)
AS 'MODULE_PATHNAME', 'dpsql_adassp_sensitivities_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION dpsql.adassp_sensitivities(float8, float8) IS
    'Replace-one L2 sensitivities of AdaSSP''s lambda_min (x_bound^2), X^T X (Frobenius, '
    'sqrt(2) x_bound^2) and X^T y (2 x_bound y_bound) for ||x|| <= x_bound, |y| <= y_bound';

-- The plan of AdaSSP (its registered plan_function, called by _train_planned, 33_planned.sql).
CREATE OR REPLACE FUNCTION dpsql_internal._adassp_plan(privacy text, ds dpsql.datasets, n bigint, d int,
                                              epsilon float8, delta float8, params jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    options jsonb;
    intercept boolean;
    p int;
    rho float8;
    x_bound float8;
    sens record;
    sd float8;
    varrho float8;
BEGIN
    SELECT * INTO options, intercept, p, rho, x_bound
      FROM dpsql_internal._linear_plan_common(privacy, ds, d, epsilon, delta, params);
    -- AdaSSP (Wang 2018, Algorithm 2) with its three releases calibrated in zCDP (rho/3
    -- each) to their replace-one sensitivities for ||x|| <= X, |y| <= Y.
    IF ds.row_bound IS NULL THEN
        PERFORM dpsql_internal._fail('AdaSSP needs a public bound on ||x||',
                            hint => 'Register the dataset with row_bound, feature_bounds or row_norm => ''clip''.');
    END IF;
    x_bound := sqrt(ds.row_bound ^ 2 + intercept::int);
    sens := dpsql.adassp_sensitivities(x_bound, ds.label_bound);
    sd := 1 / sqrt(2 * rho / 3);
    varrho := dpsql_internal._linear_option(options, 'varrho', 0.05);
    IF varrho >= 1 THEN
        PERFORM dpsql_internal._fail('options.varrho must be in (0, 1)');
    END IF;
    RETURN jsonb_build_object(
        'epsilon', epsilon, 'delta', delta, 'rho', rho, 'x_bound', x_bound,
        'y_bound', ds.label_bound, 'intercept', intercept, 'dim', d, 'rows', n,
        'sigma_min', sens.lambda_min * sd, 'sigma_xx', sens.xtx * sd, 'sigma_xy', sens.xty * sd,
        'min_shift', sens.lambda_min * sd * sqrt(ln(6 / delta)),
        'ridge_factor', sens.xtx * sd * sqrt(p * ln(2.0 * p * p / varrho)),
        'info', jsonb_build_object(
            'algorithm', 'AdaSSP (Wang 2018, Algorithm 2): noisy X^T X, X^T y and lambda_min, adaptive ridge',
            'accounting', 'zCDP: three Gaussian releases of rho/3 each',
            'rho', rho, 'x_bound', x_bound, 'y_bound', ds.label_bound, 'varrho', varrho,
            'sensitivities', jsonb_build_object('lambda_min', sens.lambda_min, 'xtx', sens.xtx,
                                                 'xty', sens.xty),
            'noise_std', jsonb_build_object('lambda_min', sens.lambda_min * sd,
                                             'xtx', sens.xtx * sd, 'xty', sens.xty * sd),
            'neighbouring', 'replace-one, n public'));
END $$;

-- AdaSSP: one aggregate scan for X^T X, X^T y (rows clipped to the public bounds); the noise,
-- the adaptive ridge and the solve in the server.
CREATE OR REPLACE FUNCTION dpsql_internal._adassp_fit(train_table text, plan jsonb, noise_seed bigint,
                                             OUT weights float8[], OUT info jsonb,
                                             OUT iterates float8[])
LANGUAGE plpgsql AS $$
DECLARE
    gram float8[];
    rel record;
BEGIN
    EXECUTE format('SELECT dpsql.adassp_gram(x, y, $1, $2, $3, $4) FROM %s', train_table)
       INTO gram USING (plan->>'x_bound')::float8, (plan->>'y_bound')::float8,
                       (plan->>'intercept')::boolean, (plan->>'dim')::int;
    rel := dpsql_internal._adassp_release(gram, (plan->>'sigma_min')::float8, (plan->>'sigma_xx')::float8,
                                 (plan->>'sigma_xy')::float8, (plan->>'min_shift')::float8,
                                 (plan->>'ridge_factor')::float8, noise_seed);
    weights := rel.weights;
    info := jsonb_build_object('ridge', rel.ridge, 'lambda_min_noisy', rel.lambda_min_noisy);
    iterates := NULL;
END $$;

SELECT dpsql_internal._register_mechanism(
    'adassp', '_train_linear', 'regression', false, true,
    'AdaSSP: sufficient-statistics perturbation with an adaptive ridge', 'docs/linear.md',
    options => '{varrho}', plan_function => '_adassp_plan', fit_function => '_adassp_fit',
    params => '{options}', distributed => 'sums');
------------------------------------------------------------------------------------------
-- DP-GD with a private preconditioner (issue 10; spec 002's conditioning): on ill-conditioned
-- features DP-GD's iterates barely move along the small eigen-directions and its intervals do
-- not cover. A noisy second-moment matrix of the rows (x clipped, 1 appended) is released
-- (Gaussian, zCDP, a tenth of rho), floored to be positive definite, G = L L^T; DP-GD runs on
-- the whitened rows L^{-1} (x, 1) and every iterate maps back by L^{-T} (the batch means and
-- intervals commute with that linear map). On by default when the rows have a public norm
-- bound; options => {"precondition": false} runs the spec's plain DP-GD.
------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION dpsql_internal._cholesky(a float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_cholesky_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._whiten_row(x float8[], l float8[], append_one boolean, x_bound float8)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_whiten_row'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._unwhiten(theta float8[], l float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_unwhiten'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._min_eigenvalue(a float8[])
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_min_eigenvalue'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- The released preconditioner: the noisy, floored G = (X~^T X~ + E) / n + f I (E symmetric,
-- its upper triangle i.i.d. N(0, sigma^2), sigma = Delta / sqrt(2 rho_pre) with Delta the
-- replace-one Frobenius sensitivity sqrt(2) (x_bound^2 + intercept)); f lifts the noisy
-- spectrum to at least 2 sigma sqrt(p) / n (public). Returns its Cholesky factor and the
-- bound on a whitened row's norm.
CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_preconditioner(train_table text, plan jsonb, noise_seed bigint,
                                           OUT factor float8[], OUT row_bound float8,
                                           OUT info jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    d int := (plan->>'dim')::int;
    icpt boolean := (plan->>'intercept')::boolean;
    p int := d + icpt::int;
    xb float8 := (plan->>'x_bound')::float8;
    n bigint := (plan->>'rows')::bigint;
    sigma float8 := (plan->>'pre_noise_std')::float8;
    gram float8[];
    upper float8[];
    g float8[];
    g_noisy float8[];
    lambda_min float8;
    floor_ float8;
BEGIN
    -- The gram clips each (x, 1) as one vector: to sqrt(x_bound^2 + 1), the norm bound the
    -- noise is calibrated to (and >= 1 with an intercept, as the aggregate needs).
    EXECUTE format('SELECT dpsql.adassp_gram(x, y, $1, 1, $2, $3) FROM %s', train_table)
       INTO gram USING sqrt(xb ^ 2 + icpt::int), icpt, d;
    -- The upper triangle (the diagonal included), row by row, noised once.
    upper := dpsql_internal._add_gaussian(
        ARRAY(SELECT gram[2 + (i - 1) * p + j] FROM generate_series(1, p) i,
                     generate_series(1, p) j WHERE j >= i ORDER BY i, j),
        sigma, noise_seed, 8001);
    g := ARRAY(SELECT upper[(least(i, j) - 1) * p - (least(i, j) - 1) * (least(i, j) - 2) / 2
                            + greatest(i, j) - least(i, j) + 1] / n
                 FROM generate_series(1, p) i, generate_series(1, p) j ORDER BY i, j);
    g_noisy := g;
    lambda_min := dpsql_internal._min_eigenvalue(g);
    floor_ := greatest(0, -lambda_min) + 2 * sigma * sqrt(p) / n;
    g := ARRAY(SELECT g[(i - 1) * p + j] + CASE WHEN i = j THEN floor_ ELSE 0 END
                 FROM generate_series(1, p) i, generate_series(1, p) j ORDER BY i, j);
    factor := dpsql_internal._cholesky(g);
    -- ||L^{-1} x~|| <= ||x~|| / sqrt(lambda_min(G)), lambda_min(G) = lambda_min + floor
    row_bound := sqrt(xb ^ 2 + icpt::int) / sqrt(lambda_min + floor_);
    info := jsonb_build_object('rho', plan->'rho_pre', 'noise_std', sigma,
                               'second_moment', g_noisy,
                               'lambda_min_noisy', lambda_min, 'floor', floor_,
                               'whitened_row_bound', row_bound);
END $$;

-- DP-GD on the whitened rows (a table of L^{-1} (x, 1), no intercept flag, the whitened
-- bound), then the estimate and every iterate mapped back by L^{-T}.
CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_fit_preconditioned(train_table text, plan jsonb, noise_seed bigint,
                                               OUT weights float8[], OUT info jsonb,
                                               OUT iterates float8[])
LANGUAGE plpgsql AS $$
DECLARE
    pre record := dpsql_internal._dpgd_preconditioner(train_table, plan, noise_seed);
    p int := (plan->>'dim')::int + (plan->>'intercept')::boolean::int;
    whitened text := train_table || '_w';
    ids text;
    fit record;
BEGIN
    -- shaped (and, on Citus, placed) like the training table: filled shard by shard
    ids := dpsql_internal._derived_training_table(train_table, whitened);
    EXECUTE format('INSERT INTO %s SELECT %s, dpsql_internal._whiten_row(x, $1, $2, $3), y FROM %s ORDER BY rid',
                   whitened, ids, train_table)
        USING pre.factor, (plan->>'intercept')::boolean, (plan->>'x_bound')::float8;
    fit := dpsql_internal._dpgd_fit_plain(whitened, plan || jsonb_build_object('dim', p, 'intercept', false,
                                                                       'x_bound', pre.row_bound),
                                 noise_seed);
    EXECUTE format('DROP TABLE %s', whitened);
    weights := dpsql_internal._unwhiten(fit.weights, pre.factor);
    iterates := (SELECT array_agg(dpsql_internal._unwhiten(ARRAY(SELECT unnest(fit.iterates[i:i][1:p])),
                                                  pre.factor) ORDER BY i)
                   FROM generate_series(1, array_length(fit.iterates, 1)) i);
    info := fit.info || jsonb_build_object('preconditioner', pre.info);
END $$;
------------------------------------------------------------------------------------------
-- The exact-minimiser toolbox shared by objective perturbation (45_objective_perturbation.sql)
-- and output perturbation (49_output_perturbation.sql), spec 004 cards A2 and A10. C core:
-- cython_ext/core/objective.h (the GLM losses, the Newton direction and every calibration);
-- glue: sql/src/objective_fmgr.c.
--
-- The solver is Newton's method with backtracking on the strongly convex
--   J(theta) = sum_i l(<x_i, theta>, y_i) + (reg/2) ||theta||^2 + <b, theta>,
-- one aggregate scan per iterate (loss, gradient and Hessian at theta). It stops when the
-- certificate ||grad J|| <= tolerance holds (then ||theta - argmin J|| <= tolerance/reg, which
-- the mechanisms' extra noise covers) or after max_scans scans; an uncertified point is never
-- released.
------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION dpsql_internal._glm_sums_transition(state float8[], x float8[], y float8,
                                                      theta float8[], loss int, param float8,
                                                      y_bound float8, x_bound float8,
                                                      intercept boolean)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_glm_sums_transition'
LANGUAGE C CALLED ON NULL INPUT PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._glm_sums_combine(a float8[], b float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_glm_sums_combine'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._glm_sums_final(state float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_glm_sums_final'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

-- [n, loss, gradient (p), Hessian (p x p)] of the GLM loss at theta over the rows (noiseless:
-- never released). Rows clipped to x_bound, then the intercept 1 appended; loss 1 logistic,
-- 2 Huber SVM (param = h), 3 Huber regression (param = k, y clamped to y_bound). A NULL or
-- malformed record counts in n and adds nothing. NULL when there are no rows.
CREATE OR REPLACE AGGREGATE dpsql_internal._glm_sums(x float8[], y float8, theta float8[],
                                                     loss int, param float8, y_bound float8,
                                                     x_bound float8, intercept boolean) (
    SFUNC = dpsql_internal._glm_sums_transition,
    STYPE = float8[],
    FINALFUNC = dpsql_internal._glm_sums_final,
    COMBINEFUNC = dpsql_internal._glm_sums_combine,
    PARALLEL = SAFE
);

-- The Newton direction -(H + reg I)^{-1} grad J at theta, J(theta), ||grad J|| and the slope.
CREATE OR REPLACE FUNCTION dpsql_internal._glm_newton(sums float8[], theta float8[], reg float8,
                                                      b float8[], OUT direction float8[],
                                                      OUT objective float8, OUT grad_norm float8,
                                                      OUT slope float8)
AS 'MODULE_PATHNAME', 'dpsql_glm_newton_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

-- L (sup of one example's gradient norm) and lambda_max (of its rank-1 Hessian).
CREATE OR REPLACE FUNCTION dpsql_internal._glm_constants(loss int, param float8, y_bound float8,
                                                         x_bound float8, intercept boolean, p int,
                                                         OUT lipschitz float8, OUT curvature float8)
AS 'MODULE_PATHNAME', 'dpsql_glm_constants_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

-- v plus one noise vector for L2 sensitivity (delta = 0: Gamma-norm; > 0: analytic Gaussian).
CREATE OR REPLACE FUNCTION dpsql_internal._perturb(v float8[], sensitivity float8, epsilon float8,
                                                   delta float8, seed bigint, stream bigint,
                                                   OUT weights float8[], OUT noise_scale float8)
AS 'MODULE_PATHNAME', 'dpsql_perturb_sql'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

-- Replace-one sensitivity 2 (L + tolerance) / reg of a certified regularised minimiser (A10).
CREATE OR REPLACE FUNCTION dpsql_internal._output_perturbation_sensitivity(lipschitz float8,
                                                                          reg float8,
                                                                          tolerance float8)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_output_perturbation_sensitivity_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- The certificate ||grad J|| <= 1e-8 L sqrt(n) (objective.h: dpsql_erm_tolerance).
CREATE OR REPLACE FUNCTION dpsql_internal._erm_tolerance(lipschitz float8, n float8)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_erm_tolerance_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- The GLM a plan describes: the loss code and parameter of the model, the public bounds, the
-- constants (L, lambda_max), the solver's certificate and cap, and the analyst's lambda and
-- options.radius (a public bound on ||theta*||, default 10) that set the regulariser. Logistic and Huber SVM are binary classifiers; 'linear' is
-- Huber regression with threshold k (options.huber_threshold, default the label bound):
-- least squares on every residual |r| <= k, and Lipschitz, which least squares is not.
CREATE OR REPLACE FUNCTION dpsql_internal._glm_plan(privacy text, ds dpsql.datasets, n bigint,
                                                    d int, params jsonb, options jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    model text := params->>'model';
    intercept boolean := coalesce((params->>'intercept')::boolean, false);
    p int := d + intercept::int;
    loss int;
    param float8;
    c record;
    -- classification rows are clipped (or normalised) to norm 1 by their registration
    x_bound float8 := CASE WHEN ds.label_bound IS NULL THEN 1 ELSE ds.row_bound END;
    classes int := CASE WHEN model IN ('logistic', 'huber')
                        THEN jsonb_array_length(coalesce(nullif(params->'classes', 'null'), '[]'))
                        ELSE 0 END;
    max_scans float8 := dpsql_internal._linear_option(options, 'max_scans', 100, 1, false);
    radius float8 := dpsql_internal._linear_option(options, 'radius', 10);
    lambda float8 := coalesce((params->>'lambda')::float8, 0);
BEGIN
    IF NOT (lambda >= 0 AND lambda < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('lambda must be a finite number >= 0, got %s', lambda));
    END IF;
    IF x_bound IS NULL THEN
        PERFORM dpsql_internal._fail(format('%s needs a public bound on ||x||', privacy),
                            hint => 'Register the dataset with row_bound, feature_bounds or row_norm => ''clip''.');
    END IF;
    -- Whether Newton certifies within a few scans depends on the data: a cap the analyst
    -- could lower would turn the refusal into a probe (charged, but outside the proof).
    IF options ? 'max_scans' AND NOT dpsql_internal._is_admin() THEN
        PERFORM dpsql_internal._fail('options.max_scans is for data owners'' tests: whether the solver '
                                     'certifies within a few scans depends on the data', '42501');
    END IF;
    IF max_scans <> floor(max_scans) OR max_scans > 10000 THEN
        PERFORM dpsql_internal._fail(format('options.max_scans must be an integer in [1, 10000], got %s', max_scans));
    END IF;
    IF p > 512 THEN
        PERFORM dpsql_internal._fail(format('%s solves a p x p Newton system: at most 512 coefficients, got %s',
                                            privacy, p));
    END IF;
    loss := CASE model WHEN 'logistic' THEN 1 WHEN 'huber' THEN 2 WHEN 'linear' THEN 3 END;
    param := CASE model
        WHEN 'huber' THEN coalesce((params->>'huber_h')::float8, 0.1)
        WHEN 'linear' THEN dpsql_internal._linear_option(options, 'huber_threshold', ds.label_bound)
        ELSE 0 END;
    IF model = 'huber' AND NOT (param > 0 AND param < 1) THEN
        PERFORM dpsql_internal._fail(format('huber_h must be in (0, 1), got %s', param));
    END IF;
    c := dpsql_internal._glm_constants(loss, param, coalesce(ds.label_bound, 1), x_bound,
                                       intercept, p);
    RETURN jsonb_build_object('loss', loss, 'param', param, 'y_bound', coalesce(ds.label_bound, 1),
                              'x_bound', x_bound, 'intercept', intercept, 'p', p,
                              -- three or more classes: one-vs-rest, C binary models on all the rows
                              'outputs', CASE WHEN classes > 2 THEN classes ELSE 1 END,
                              'lipschitz', c.lipschitz, 'curvature', c.curvature,
                              'tolerance', dpsql_internal._erm_tolerance(c.lipschitz, n),
                              'max_scans', max_scans::int, 'radius', radius, 'lambda', lambda);
END $$;

-- Newton's method with backtracking (Armijo, or a gradient that shrinks at an objective that
-- does not rise: near the optimum rounding hides the objective's decrease) from theta = 0.
-- positive: the class index of a one-vs-rest model (labels mapped to +1 for it, -1 for the
-- others).
CREATE OR REPLACE FUNCTION dpsql_internal._erm_solve(train_table text, plan jsonb, b float8[],
                                                     positive float8 DEFAULT NULL,
                                                     OUT theta float8[], OUT grad_norm float8,
                                                     OUT scans int, OUT certified boolean)
LANGUAGE plpgsql AS $$
DECLARE
    reg float8 := (plan->>'regularizer')::float8;
    tolerance float8 := (plan->>'tolerance')::float8;
    max_scans int := (plan->>'max_scans')::int;
    -- one-vs-rest: the class index positive against the rest (a NULL label stays NULL)
    q text := format('SELECT dpsql_internal._glm_sums(x, %s, $1, $2, $3, $4, $5, $6) FROM %s',
                     CASE WHEN positive IS NULL THEN 'y'
                          ELSE format('CASE WHEN y = %s THEN 1.0 WHEN y IS NOT NULL THEN -1.0 END',
                                      positive) END,
                     train_table);
    loss int := (plan->>'loss')::int;
    param float8 := (plan->>'param')::float8;
    y_bound float8 := (plan->>'y_bound')::float8;
    x_bound float8 := (plan->>'x_bound')::float8;
    intercept boolean := (plan->>'intercept')::boolean;
    sums float8[];
    here record;
    there record;
    candidate float8[];
    step float8;
    accepted boolean;
BEGIN
    theta := array_fill(0::float8, ARRAY[(plan->>'p')::int]);
    EXECUTE q INTO sums USING theta, loss, param, y_bound, x_bound, intercept;
    scans := 1;
    IF sums IS NULL THEN
        PERFORM dpsql_internal._fail('the training table is empty', 'XX000');
    END IF;
    here := dpsql_internal._glm_newton(sums, theta, reg, b);
    WHILE here.grad_norm > tolerance AND scans < max_scans LOOP
        step := 1;
        LOOP
            candidate := ARRAY(SELECT t + step * dd
                                 FROM unnest(theta, here.direction) WITH ORDINALITY AS u(t, dd, i)
                                ORDER BY i);
            EXECUTE q INTO sums USING candidate, loss, param, y_bound, x_bound, intercept;
            scans := scans + 1;
            there := dpsql_internal._glm_newton(sums, candidate, reg, b);
            -- A shrinking gradient alone must not accept a step that raises the objective:
            -- on piecewise-quadratic losses (Huber) Newton then cycles between two points.
            accepted := there.objective <= here.objective + 1e-4 * step * here.slope
                        OR (there.grad_norm < 0.5 * here.grad_norm
                            AND there.objective <= here.objective + 1e-12 * abs(here.objective));
            -- a step below 1e-12 makes no progress (and bounds the arithmetic above)
            EXIT WHEN accepted OR scans >= max_scans OR step < 1e-12;
            step := step / 2;
        END LOOP;
        EXIT WHEN NOT accepted;
        theta := candidate;
        here := there;
    END LOOP;
    grad_norm := here.grad_norm;
    certified := grad_norm <= tolerance;
END $$;
------------------------------------------------------------------------------------------
-- Objective perturbation (spec 004 card A2; Chaudhuri, Monteleoni and Sarwate 2011; the
-- Gaussian variant after Kifer, Smith and Thakurta 2012): release the minimiser of
--   J(theta) = sum_i l(<x_i, theta>, y_i) + (reg/2) ||theta||^2 + <b, theta>
-- for a secret noise vector b, for GLM losses that are convex with a bounded rank-1 Hessian
-- (logistic, Huber SVM, Huber regression). Replace-one neighbours, n public. The privacy loss
-- at any output splits into the noise term (b moves by at most 2L between neighbours: eps_noise)
-- and the Jacobian term (|log det ratio| <= ln(1 + lambda_max/reg) <= eps_det once
-- reg >= lambda_max / (1 - e^{-eps_det})). The released point is the Newton solver's certified
-- approximation (45_erm_solver.sql) plus extra noise for its distance to the exact minimiser
-- (Iyengar et al. 2019): 1% of (epsilon, delta). All calibration is in the C core
-- (objective.h: dpsql_objpert_calibrate). docs/objective_perturbation.md.
------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION dpsql_internal._objpert_calibrate(epsilon float8, delta float8, p int,
                                                             lipschitz float8, curvature float8,
                                                             n float8,
                                                             OUT eps_noise float8, OUT eps_det float8,
                                                             OUT eps_extra float8,
                                                             OUT delta_noise float8,
                                                             OUT delta_extra float8,
                                                             OUT min_reg float8,
                                                             OUT noise_scale float8,
                                                             OUT noise_sq_norm float8,
                                                             OUT tolerance float8)
AS 'MODULE_PATHNAME', 'dpsql_objpert_calibrate_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

-- The plan: the GLM, the calibration and the regulariser
-- reg = max(Delta_priv, n lambda if the analyst gave lambda > 0, else the utility choice
-- 2 sqrt(E ||b||^2) / radius, radius a public bound on ||theta*|| (options.radius, default 10)).
CREATE OR REPLACE FUNCTION dpsql_internal._objpert_plan(privacy text, ds dpsql.datasets, n bigint,
                                                        d int, epsilon float8, delta float8,
                                                        params jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    options jsonb := dpsql_internal._plan_options(privacy, params);
    glm jsonb := dpsql_internal._glm_plan(privacy, ds, n, d, params, options);
    cal record;
    radius float8 := (glm->>'radius')::float8;
    lambda float8 := (glm->>'lambda')::float8;
    outputs int := (glm->>'outputs')::int;
    reg float8;
BEGIN
    -- one-vs-rest: each of the C models gets (epsilon, delta) / C (basic composition)
    cal := dpsql_internal._objpert_calibrate(epsilon / outputs, delta / outputs, (glm->>'p')::int,
                                             (glm->>'lipschitz')::float8,
                                             (glm->>'curvature')::float8, n);
    reg := greatest(cal.min_reg, CASE WHEN lambda > 0 THEN n * lambda
                                      ELSE 2 * sqrt(cal.noise_sq_norm) / radius END);
    RETURN glm || jsonb_build_object(
        'regularizer', reg, 'tolerance', cal.tolerance, 'noise_scale', cal.noise_scale,
        'eps_noise', cal.eps_noise, 'eps_extra', cal.eps_extra, 'delta_extra', cal.delta_extra,
        'gaussian', delta > 0,
        'extra_sensitivity', 2 * cal.tolerance / reg,
        'info', jsonb_build_object(
            'algorithm', 'objective perturbation (spec 004 A2): exact minimiser of the perturbed, '
                         'regularised SUM loss by Newton''s method, certified ||grad J|| <= tolerance',
            'loss', CASE (glm->>'loss')::int WHEN 1 THEN 'logistic' WHEN 2 THEN 'huber svm'
                                              ELSE 'huber regression' END,
            'noise', CASE WHEN delta > 0 THEN 'gaussian (GLM variant)' ELSE 'gamma-norm' END,
            'noise_scale', cal.noise_scale, 'regularizer', reg, 'min_regularizer', cal.min_reg,
            'lipschitz', glm->'lipschitz', 'curvature', glm->'curvature',
            'epsilon_split', jsonb_build_object('noise', cal.eps_noise, 'jacobian', cal.eps_det,
                                                'certificate', cal.eps_extra),
            'delta_split', jsonb_build_object('noise', cal.delta_noise, 'certificate', cal.delta_extra),
            'tolerance', cal.tolerance, 'radius', radius, 'one_vs_rest', outputs > 1,
            'model_epsilon', epsilon / outputs, 'model_delta', delta / outputs,
            'huber_threshold', CASE WHEN (glm->>'loss')::int = 3 THEN glm->'param' END,
            'neighbouring', 'replace-one, n public'));
END $$;

CREATE OR REPLACE FUNCTION dpsql_internal._objpert_fit(train_table text, plan jsonb, noise_seed bigint,
                                                       OUT weights float8[], OUT info jsonb,
                                                       OUT iterates float8[])
LANGUAGE plpgsql AS $$
DECLARE
    p int := (plan->>'p')::int;
    outputs int := (plan->>'outputs')::int;
    zero float8[] := array_fill(0::float8, ARRAY[p]);
    b float8[];
    sol record;
    rel record;
    scans int := 0;
    scales float8[] := '{}';
BEGIN
    weights := '{}';
    iterates := NULL;
    FOR c IN 0 .. outputs - 1 LOOP
        -- The secret linear term (never leaves the server); streams keep the draws apart.
        IF (plan->>'gaussian')::boolean THEN
            b := dpsql_internal._add_gaussian(zero, (plan->>'noise_scale')::float8, noise_seed, 1 + 2 * c);
        ELSE
            -- density exp(-eps_noise ||b|| / (2L)): scale 2L / eps_noise
            b := (dpsql_internal._perturb(zero, 2 * (plan->>'lipschitz')::float8,
                                          (plan->>'eps_noise')::float8, 0, noise_seed, 1 + 2 * c)).weights;
        END IF;
        sol := dpsql_internal._erm_solve(train_table, plan, b,
                                         CASE WHEN outputs > 1 THEN c END);
        scans := scans + sol.scans;
        IF NOT sol.certified THEN
            weights := NULL;  -- nothing is released (33_planned.sql keeps the charge)
            info := jsonb_build_object('scans', scans, 'certified', false, 'output', c);
            RETURN;
        END IF;
        rel := dpsql_internal._perturb(sol.theta, (plan->>'extra_sensitivity')::float8,
                                       (plan->>'eps_extra')::float8, (plan->>'delta_extra')::float8,
                                       noise_seed, 2 + 2 * c);
        weights := CASE WHEN outputs > 1 THEN weights || ARRAY[rel.weights] ELSE rel.weights END;
        scales := scales || rel.noise_scale;
    END LOOP;
    info := jsonb_build_object('scans', scans, 'certified', true, 'extra_noise_scale', scales[1]);
END $$;

SELECT dpsql_internal._register_mechanism(
    'objective_perturbation', '_train_planned', 'any', false, false,
    'objective perturbation: the exact minimiser of a randomly perturbed, regularised objective '
    '(epsilon-DP Gamma-norm noise, or Gaussian with delta > 0)',
    'docs/objective_perturbation.md', options => '{radius,huber_threshold,max_scans}',
    plan_function => '_objpert_plan', fit_function => '_objpert_fit',
    models => '{logistic,huber,linear}', params => '{lambda,huber_h,options}',
    distributed => 'sums');
------------------------------------------------------------------------------------------
-- DP-FTRL with tree aggregation (spec 004 cards A4 and A5; Kairouz et al. 2021), the
-- streaming private optimiser: one ordered scan per epoch, no sampling. Leaves are minibatches
-- of B consecutive rids of the secretly shuffled training table (leaf t = rids ((t-1)B, tB]);
-- a leaf is the SUM of its rows' per-example gradients at the current iterate, clipped to
-- norm C; a streaming binary tree releases noisy prefix sums (node noise N(0, sigma^2 I_p),
-- drawn in C as each node completes) and theta_{t+1} = Pi_{||theta|| <= R}(-S_t / Delta).
-- E epochs restart the tree; S carries the previous epochs' noisy totals. Released: the
-- average of the iterates used (or the last, options.output).
--
-- Privacy (replace-one, n public): a row is in one leaf per epoch and moves it by <= 2C; the
-- leaf enters m = floor(lg n_leaves) + 1 node releases per epoch, so the adaptively composed
-- Gaussian node releases have L2 sensitivity 2C sqrt(m E): sigma is the analytic Gaussian of
-- that sensitivity at (epsilon, delta). C core: cython_ext/core/ftrl.h; glue:
-- sql/src/ftrl_fmgr.c; docs/dp_ftrl.md.
------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION dpsql_internal._dp_ftrl_sigma(clip float8, levels int, epochs int,
                                                         epsilon float8, delta float8)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_ftrl_sigma_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- m = floor(lg n) + 1: the tree levels used over n leaves.
CREATE OR REPLACE FUNCTION dpsql_internal._dp_ftrl_levels(n_leaves bigint)
RETURNS int AS 'MODULE_PATHNAME', 'dpsql_tree_levels_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._dp_ftrl_epoch_transition(state internal, x float8[],
                                                                    y float8, config float8[],
                                                                    s_prev float8[], seed bigint,
                                                                    stream bigint)
RETURNS internal AS 'MODULE_PATHNAME', 'dpsql_ftrl_epoch_transition'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

CREATE OR REPLACE FUNCTION dpsql_internal._dp_ftrl_epoch_final(state internal)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_ftrl_epoch_final'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

-- One epoch over the rows, to be called with ORDER BY rid: config = [loss, huber h, x_bound,
-- y_bound, intercept, p, clip, batch, n, sigma, reg, radius]; s_prev the previous epochs'
-- noisy total (NULL: zeros); seed NULL = pg_strong_random; stream = the epoch. Returns
-- [leaves, S_prev + this epoch's noisy total (p), sum of the iterates used (p), last iterate
-- (p)]: all post-processing of the noisy tree nodes.
CREATE OR REPLACE AGGREGATE dpsql_internal._dp_ftrl_epoch(x float8[], y float8, config float8[],
                                                          s_prev float8[], seed bigint,
                                                          stream bigint) (
    SFUNC = dpsql_internal._dp_ftrl_epoch_transition,
    STYPE = internal,
    FINALFUNC = dpsql_internal._dp_ftrl_epoch_final,
    FINALFUNC_MODIFY = READ_WRITE
);

-- The plan: every number from n, d, the registration and the analyst's parameters.
CREATE OR REPLACE FUNCTION dpsql_internal._dp_ftrl_plan(privacy text, ds dpsql.datasets, n bigint,
                                                        d int, epsilon float8, delta float8,
                                                        params jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    options jsonb := dpsql_internal._plan_options(privacy, params);
    model text := params->>'model';
    intercept boolean := coalesce((params->>'intercept')::boolean, false);
    p int := d + intercept::int;
    classes int := jsonb_array_length(coalesce(nullif(params->'classes', 'null'), '[]'));
    -- three or more classes: one-vs-rest, C binary models on all the rows, (epsilon, delta) / C each
    outputs int := CASE WHEN classes > 2 AND model IN ('logistic', 'huber') THEN classes ELSE 1 END;
    loss int := CASE model WHEN 'logistic' THEN 1 WHEN 'huber' THEN 2 WHEN 'linear' THEN 3 END;
    huber_h float8 := coalesce((params->>'huber_h')::float8, 0.1);
    -- classification rows are clipped (or normalised) to norm 1 by their registration
    x_bound float8 := CASE WHEN ds.label_bound IS NULL THEN 1 ELSE ds.row_bound END;
    y_bound float8 := coalesce(ds.label_bound, 1);
    epochs int := coalesce((params->>'epochs')::int, 1);
    radius float8 := dpsql_internal._linear_option(options, 'radius', 10);
    output text := coalesce(options->>'output', 'average');
    clip float8;
    batch bigint := (params->>'batch_size')::bigint;
    leaves bigint;
    levels int;
    sigma float8;
    steps bigint;
    noisy_nodes bigint;
    g float8;
    b_noise float8;
    reg float8;
BEGIN
    IF loss IS NULL THEN
        PERFORM dpsql_internal._fail(format('%s trains logistic, huber or linear models, not %s', privacy, model));
    END IF;
    IF NOT (delta > 0) THEN
        PERFORM dpsql_internal._fail(format('%s adds Gaussian noise: it needs delta > 0', privacy));
    END IF;
    IF x_bound IS NULL THEN
        PERFORM dpsql_internal._fail(format('%s needs a public bound on ||x||', privacy),
                            hint => 'Register the dataset with row_bound, feature_bounds or row_norm => ''clip''.');
    END IF;
    IF p > 4096 THEN
        PERFORM dpsql_internal._fail(format('%s: at most 4096 coefficients, got %s', privacy, p));
    END IF;
    IF model = 'huber' AND NOT (huber_h > 0 AND huber_h < 1) THEN
        PERFORM dpsql_internal._fail(format('huber_h must be in (0, 1), got %s', huber_h));
    END IF;
    IF NOT (epochs BETWEEN 1 AND 1000) THEN
        PERFORM dpsql_internal._fail(format('epochs must be in 1..1000, got %s', epochs));
    END IF;
    IF output NOT IN ('average', 'last') THEN
        PERFORM dpsql_internal._fail(format('options.output must be ''average'' or ''last'', got %s',
                                            options->'output'));
    END IF;
    -- C: the per-example gradient bound of the classifiers (|l'| <= 1, ||(x, 1)|| <= rx: no
    -- clipping happens); least squares: the rule of every least-squares mechanism (34_defaults.sql).
    clip := coalesce((params->>'clip_norm')::float8,
                     CASE WHEN loss = 3 THEN dpsql_internal._least_squares_clip(ds)
                          ELSE sqrt(x_bound ^ 2 + intercept::int) END);
    IF NOT (clip > 0 AND clip < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('clip_norm must be a finite number > 0, got %s', clip));
    END IF;
    IF batch IS NULL THEN
        -- the smallest B (doubling from 1, at most n/10) whose noisy prefix sum per row,
        -- sigma sqrt(p m) / B, is <= C / 4 (sigma depends on m, which depends on B)
        batch := 1;
        LOOP
            leaves := (n + batch - 1) / batch;
            levels := dpsql_internal._dp_ftrl_levels(leaves);
            sigma := dpsql_internal._dp_ftrl_sigma(clip, levels, epochs, epsilon / outputs,
                                                   delta / outputs);
            EXIT WHEN sigma * sqrt(p * levels) / batch <= clip / 4 OR batch * 2 > n / 10;
            batch := batch * 2;
        END LOOP;
    ELSIF NOT (batch BETWEEN 1 AND n) THEN
        PERFORM dpsql_internal._fail(format('batch_size must be in 1..%s (the rows), got %s', n, batch));
    END IF;
    leaves := (n + batch - 1) / batch;
    levels := dpsql_internal._dp_ftrl_levels(leaves);
    sigma := dpsql_internal._dp_ftrl_sigma(clip, levels, epochs, epsilon / outputs, delta / outputs);
    steps := epochs * leaves;
    -- the noise in S at any step: at most (E - 1) popcount(n_leaves) + m nodes
    noisy_nodes := (epochs - 1) * length(replace(leaves::bit(63)::text, '0', '')) + levels;
    g := batch * clip;
    b_noise := sigma * sqrt(noisy_nodes) * (sqrt(p) + sqrt(2 * ln(steps / 0.05)));
    reg := dpsql_internal._linear_option(options, 'regularizer',
                                         sqrt(2 * steps * (g ^ 2 + g * b_noise)) / radius);
    RETURN jsonb_build_object(
        'config', jsonb_build_array(loss, CASE WHEN loss = 2 THEN huber_h ELSE 0 END, x_bound,
                                    y_bound, intercept::int, p, clip, batch, n, sigma, reg, radius),
        'p', p, 'epochs', epochs, 'output', output, 'outputs', outputs,
        'info', jsonb_build_object(
            'algorithm', 'DP-FTRL with tree aggregation (spec 004 A4/A5; Kairouz et al. 2021): '
                         'minibatch leaves of consecutive shuffled rows, one ordered scan per '
                         'epoch, a fresh tree per epoch',
            'accounting', format('Gaussian: the node releases of %s epochs x %s levels, L2 '
                                 'sensitivity 2 C sqrt(m E) = %s, analytic Gaussian sigma %s',
                                 epochs, levels, 2 * clip * sqrt(levels * epochs), sigma),
            'loss', model, 'clip_norm', clip, 'batch_size', batch, 'leaves', leaves,
            'levels', levels, 'epochs', epochs, 'steps', steps, 'noise_std', sigma,
            'noise_multiplier', sigma / (2 * clip * sqrt(levels * epochs)),
            'regularizer', reg, 'radius', radius, 'output', output,
            'huber_h', CASE WHEN loss = 2 THEN huber_h END, 'x_bound', x_bound,
            'one_vs_rest', outputs > 1, 'model_epsilon', epsilon / outputs,
            'model_delta', delta / outputs,
            'neighbouring', 'replace-one, n public'));
END $$;

CREATE OR REPLACE FUNCTION dpsql_internal._dp_ftrl_fit(train_table text, plan jsonb, noise_seed bigint,
                                                       OUT weights float8[], OUT info jsonb,
                                                       OUT iterates float8[])
LANGUAGE plpgsql AS $$
DECLARE
    p int := (plan->>'p')::int;
    epochs int := (plan->>'epochs')::int;
    outputs int := coalesce((plan->>'outputs')::int, 1);
    config float8[] := ARRAY(SELECT jsonb_array_elements_text(plan->'config')::float8);
    s_prev float8[];
    theta_sum float8[];
    last float8[];
    out float8[];
    leaves bigint;
    w float8[];
BEGIN
    weights := '{}';
    FOR c IN 0 .. outputs - 1 LOOP
        s_prev := NULL;
        theta_sum := array_fill(0::float8, ARRAY[p]);
        leaves := 0;
        FOR e IN 1 .. epochs LOOP
            -- one-vs-rest: class c against the rest (a NULL label stays NULL); the streams of
            -- the noise keep the models' and epochs' draws apart
            EXECUTE format('SELECT dpsql_internal._dp_ftrl_epoch(x, %s, $1, $2, $3, $4 ORDER BY rid) FROM %s',
                           CASE WHEN outputs > 1
                                THEN format('CASE WHEN y = %s THEN 1.0 WHEN y IS NOT NULL THEN -1.0 END', c)
                                ELSE 'y' END,
                           train_table)
               INTO out USING config, s_prev, noise_seed, (c::bigint << 32) + e;
            IF out IS NULL THEN
                PERFORM dpsql_internal._fail('the training table is empty', 'XX000');
            END IF;
            leaves := leaves + out[1]::bigint;
            s_prev := out[2 : p + 1];
            theta_sum := ARRAY(SELECT a + b FROM unnest(theta_sum, out[p + 2 : 2 * p + 1]) WITH ORDINALITY
                                             AS u(a, b, i) ORDER BY i);
            last := out[2 * p + 2 : 3 * p + 1];
            PERFORM dpsql_internal._progress('epoch', c::bigint * epochs + e, outputs::bigint * epochs);
        END LOOP;
        w := CASE WHEN plan->>'output' = 'last' THEN last
                  ELSE ARRAY(SELECT a / leaves FROM unnest(theta_sum) WITH ORDINALITY AS u(a, i)
                              ORDER BY i) END;
        weights := CASE WHEN outputs > 1 THEN weights || ARRAY[w] ELSE w END;
    END LOOP;
    info := jsonb_build_object('scans', epochs * outputs, 'iterates_averaged',
                               CASE WHEN plan->>'output' = 'last' THEN 1 ELSE leaves END);
    iterates := NULL;
END $$;

SELECT dpsql_internal._register_mechanism(
    'dp_ftrl', '_train_planned', 'any', false, true,
    'DP-FTRL with tree aggregation: one ordered scan per epoch over minibatch leaves, noisy '
    'prefix sums of clipped gradients, no sampling (Gaussian, needs delta > 0)',
    'docs/dp_ftrl.md', options => '{radius,regularizer,output}',
    plan_function => '_dp_ftrl_plan', fit_function => '_dp_ftrl_fit',
    models => '{logistic,huber,linear}',
    params => '{epochs,batch_size,clip_norm,huber_h,options}');
------------------------------------------------------------------------------------------
-- Private Frank-Wolfe over the L1 ball (spec 004 cards A6-A8): LASSO from one scan of
-- sufficient statistics, logistic regression with one gradient scan per step. The vertex of
-- each step is drawn by the exponential mechanism in C; C core and proofs:
-- cython_ext/core/frank_wolfe.h; glue: sql/src/frank_wolfe_fmgr.c; docs/frank_wolfe.md.
------------------------------------------------------------------------------------------

-- The plan's numbers (frank_wolfe.h, the one place of the formulas): L_1, K (NULL steps: the
-- default of Thm 6.22), eps_step and Delta_u = 2 s L_1.
CREATE OR REPLACE FUNCTION dpsql_internal._fw_numbers(model text, r_inf float8, s float8, y_bound float8,
                                                      n float8, epsilon float8, delta float8,
                                                      rho float8, steps int,
                                                      OUT l1 float8, OUT steps int,
                                                      OUT eps_step float8, OUT delta_u float8)
AS 'MODULE_PATHNAME', 'dpsql_fw_numbers_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._fw_gradient_transition(state float8[], x float8[], y float8,
                                                                  theta float8[], x_bound float8,
                                                                  intercept boolean, l1_clamp float8)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_fw_gradient_transition'
LANGUAGE C CALLED ON NULL INPUT PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._fw_gradient_combine(a float8[], b float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_fw_gradient_combine'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._fw_gradient_final(state float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_fw_gradient_final'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- [n, g_1..g_p]: the SUM over rows of the logistic gradient at theta, each row's x clipped to
-- L2 norm x_bound (then a 1 appended with an intercept), y in {-1, +1}, each per-example
-- gradient clamped coordinate-wise to [-l1_clamp, l1_clamp]. A NULL or malformed record counts
-- in n and adds nothing. Noiseless: internal (the fit feeds it to _fw_step only).
CREATE OR REPLACE AGGREGATE dpsql_internal._fw_gradient(x float8[], y float8, theta float8[],
                                                        x_bound float8, intercept boolean,
                                                        l1_clamp float8) (
    SFUNC = dpsql_internal._fw_gradient_transition,
    STYPE = float8[],
    FINALFUNC = dpsql_internal._fw_gradient_final,
    COMBINEFUNC = dpsql_internal._fw_gradient_combine,
    PARALLEL = SAFE
);

-- theta_{k+1} = (1 - 2/(k+2)) theta_k + 2/(k+2) v, v drawn by the exponential mechanism with
-- P(v) ∝ exp(-eps_step <v, g> / (2 delta_u)). Noise from pg_strong_random unless seed is
-- given (tests only: NOT private), stream k.
CREATE OR REPLACE FUNCTION dpsql_internal._fw_step(theta float8[], grad float8[], k int, s float8,
                                                   eps_step float8, delta_u float8,
                                                   seed bigint DEFAULT NULL)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_fw_step_sql'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

-- All K private steps from dpsql.adassp_gram's [n, p, X^T X, X^T y] (g = X^T X theta - X^T y).
CREATE OR REPLACE FUNCTION dpsql_internal._fw_lasso(gram float8[], s float8, steps int, eps_step float8,
                                                    delta_u float8, seed bigint DEFAULT NULL)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_fw_lasso_sql'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

-- The plan: every number from n, d, the registration and the analyst's options.
CREATE OR REPLACE FUNCTION dpsql_internal._fw_plan(privacy text, ds dpsql.datasets, n bigint, d int,
                                                   epsilon float8, delta float8, params jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    options jsonb := dpsql_internal._plan_options(privacy, params);
    model text := params->>'model';
    intercept boolean := coalesce((params->>'intercept')::boolean, false);
    p int := d + intercept::int;
    s float8 := dpsql_internal._linear_option(options, 'l1_radius', 1);
    steps_opt float8 := dpsql_internal._linear_option(options, 'steps', NULL, 1, false);
    x_bound float8;
    r_inf float8;
    y_bound float8 := 0;
    rho float8;
    num record;
    max_p int;
BEGIN
    IF model NOT IN ('lasso', 'logistic') THEN
        PERFORM dpsql_internal._fail(format('frank_wolfe trains model => lasso or logistic, not %s',
                                            quote_literal(model)));
    END IF;
    IF model = 'logistic' AND jsonb_array_length(params->'classes') <> 2 THEN
        PERFORM dpsql_internal._fail('frank_wolfe trains binary logistic regression (2 classes)');
    END IF;
    IF steps_opt IS NOT NULL AND (steps_opt <> floor(steps_opt) OR steps_opt > 2000) THEN
        PERFORM dpsql_internal._fail(format('options.steps must be a whole number between 1 and 2000, got %s',
                                            steps_opt));
    END IF;
    max_p := CASE WHEN model = 'lasso' THEN 1024 ELSE 65536 END;
    IF p > max_p THEN
        PERFORM dpsql_internal._fail(format('frank_wolfe %s takes at most %s coefficients, got %s',
                                            model, max_p, p));
    END IF;
    IF model = 'lasso' THEN
        -- dpsql.adassp_gram clips each (x, 1) to L2 norm x_bound, so |x_j| <= x_bound.
        IF ds.row_bound IS NULL THEN
            PERFORM dpsql_internal._fail('frank_wolfe LASSO needs a public bound on ||x||',
                                hint => 'Register the dataset with row_bound, feature_bounds or row_norm => ''clip''.');
        END IF;
        x_bound := sqrt(ds.row_bound ^ 2 + intercept::int);
        -- feature bounds map every feature onto [-1, 1] (and the intercept is 1): |x_j| <= 1
        r_inf := CASE WHEN ds.feature_bounds IS NOT NULL THEN least(x_bound, 1) ELSE x_bound END;
        y_bound := ds.label_bound;
    ELSE
        -- Classification rows are registered with row_norm clip or unit: ||x|| <= 1. The
        -- intercept coordinate is 1, so R_inf = 1 (and per-example gradients are clamped).
        x_bound := 1;
        r_inf := 1;
    END IF;
    IF delta > 0 THEN
        rho := dpsql.zcdp_rho(epsilon, delta);
    END IF;
    num := dpsql_internal._fw_numbers(model, r_inf, s, y_bound, n, epsilon, delta, rho, steps_opt::int);
    RETURN jsonb_build_object(
        'model', model, 'intercept', intercept, 'dim', d, 'rows', n, 'x_bound', x_bound,
        'y_bound', y_bound, 'l1_radius', s, 'l1', num.l1, 'steps', num.steps,
        'eps_step', num.eps_step, 'delta_u', num.delta_u,
        'info', jsonb_build_object(
            'algorithm', format('private Frank-Wolfe over the L1 ball of radius %s (spec 004 A7/A8): '
                                'theta_0 = 0, mu_k = 2/(k+2), vertex by the exponential mechanism on '
                                'the SUM-gradient scores%s', s,
                                CASE WHEN model = 'lasso' THEN ', one scan of sufficient statistics'
                                     ELSE ', one gradient scan per step' END),
            'accounting', CASE WHEN delta > 0
                THEN format('zCDP: %s exponential mechanisms of eps_step^2/8 each (bounded range), rho %s',
                            num.steps, rho)
                ELSE format('pure epsilon-DP: basic composition of %s eps_step-DP steps', num.steps) END,
            'steps', num.steps, 'eps_step', num.eps_step, 'delta_u', num.delta_u,
            'l1_radius', s, 'l1', num.l1, 'r_inf', r_inf, 'x_bound', x_bound,
            'y_bound', CASE WHEN model = 'lasso' THEN y_bound END, 'rho', rho,
            'theta0', 0, 'neighbouring', 'replace-one, n public'));
END $$;

CREATE OR REPLACE FUNCTION dpsql_internal._fw_fit(train_table text, plan jsonb, noise_seed bigint,
                                                  OUT weights float8[], OUT info jsonb,
                                                  OUT iterates float8[])
LANGUAGE plpgsql AS $$
DECLARE
    icpt boolean := (plan->>'intercept')::boolean;
    d int := (plan->>'dim')::int;
    steps int := (plan->>'steps')::int;
    s float8 := (plan->>'l1_radius')::float8;
    eps_step float8 := (plan->>'eps_step')::float8;
    delta_u float8 := (plan->>'delta_u')::float8;
    gram float8[];
    g float8[];
    q text;
BEGIN
    IF plan->>'model' = 'lasso' THEN
        EXECUTE format('SELECT dpsql.adassp_gram(x, y, $1, $2, $3, $4) FROM %s', train_table)
           INTO gram USING (plan->>'x_bound')::float8, (plan->>'y_bound')::float8, icpt, d;
        IF gram IS NULL THEN  -- no rows: the zero statistics
            gram := ARRAY[0, d + icpt::int]::float8[] || array_fill(0::float8, ARRAY[(d + icpt::int) * (d + icpt::int + 1)]);
        END IF;
        weights := dpsql_internal._fw_lasso(gram, s, steps, eps_step, delta_u, noise_seed);
    ELSE
        weights := array_fill(0::float8, ARRAY[d + icpt::int]);
        q := format('SELECT dpsql_internal._fw_gradient(x, y, $1, $2, $3, $4) FROM %s', train_table);
        FOR k IN 0..steps - 1 LOOP
            EXECUTE q INTO g USING weights, (plan->>'x_bound')::float8, icpt, (plan->>'l1')::float8;
            IF g IS NULL THEN
                g := array_fill(0::float8, ARRAY[d + icpt::int + 1]);
            END IF;
            weights := dpsql_internal._fw_step(weights, g, k, s, eps_step, delta_u, noise_seed);
            -- one scan per step: say how far it is (K is public)
            PERFORM dpsql_internal._progress('step', k + 1, steps);
        END LOOP;
    END IF;
    info := jsonb_build_object('nnz', (SELECT count(*) FROM unnest(weights) w WHERE w <> 0));
    iterates := NULL;
END $$;

SELECT dpsql_internal._register_mechanism(
    'frank_wolfe', '_train_planned', 'any', false, false,
    'private Frank-Wolfe over an L1 ball (sparse LASSO / logistic), exponential-mechanism vertex choice',
    'docs/frank_wolfe.md',
    options => '{l1_radius,steps}', plan_function => '_fw_plan', fit_function => '_fw_fit',
    models => '{lasso,logistic}', params => '{options}',
    distributed => 'sums');
------------------------------------------------------------------------------------------
-- Exponential-mechanism ERM on a public grid (spec 004 card A1), pure epsilon-DP, p <= 5:
-- one scan sums the loss at every grid point, the draw is made in C. C core and proofs:
-- cython_ext/core/exp_mech_erm.h; glue: sql/src/exp_mech_erm_fmgr.c;
-- docs/exponential_mechanism.md.
------------------------------------------------------------------------------------------

-- L over the ball of radius R_C: R_x (logistic, huber) or R_x (R_x R_C + Y) (linear).
CREATE OR REPLACE FUNCTION dpsql_internal._em_lipschitz(model text, r_x float8, radius float8,
                                                        y_bound float8)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_em_lipschitz_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._em_losses_transition(state float8[], x float8[], y float8,
                                                                model text, dim int, intercept boolean,
                                                                x_bound float8, y_bound float8,
                                                                radius float8, huber_h float8,
                                                                max_points int)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_em_losses_transition'
LANGUAGE C CALLED ON NULL INPUT PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._em_losses_combine(a float8[], b float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_em_losses_combine'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- The state [header, grid (G x p), Loss(0), Loss(g_1..g_G)]: the SUM loss of the clipped rows
-- at the anchor 0 and every point of the public grid (exp_mech_erm.h). Noiseless: internal
-- (the fit hands it to _em_release only).
CREATE OR REPLACE AGGREGATE dpsql_internal._em_losses(x float8[], y float8, model text, dim int,
                                                      intercept boolean, x_bound float8,
                                                      y_bound float8, radius float8,
                                                      huber_h float8, max_points int) (
    SFUNC = dpsql_internal._em_losses_transition,
    STYPE = float8[],
    COMBINEFUNC = dpsql_internal._em_losses_combine,
    PARALLEL = SAFE
);

CREATE OR REPLACE FUNCTION dpsql_internal._em_release(state float8[], epsilon float8, delta_u float8,
                                                      seed bigint DEFAULT NULL,
                                                      OUT weights float8[], OUT grid_points int)
AS 'MODULE_PATHNAME', 'dpsql_em_release_sql'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

CREATE OR REPLACE FUNCTION dpsql_internal._em_plan(privacy text, ds dpsql.datasets, n bigint, d int,
                                                   epsilon float8, delta float8, params jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    options jsonb := dpsql_internal._plan_options(privacy, params);
    model text := params->>'model';
    intercept boolean := coalesce((params->>'intercept')::boolean, false);
    p int := d + intercept::int;
    radius float8 := dpsql_internal._linear_option(options, 'radius', 1);
    points float8 := dpsql_internal._linear_option(options, 'grid_points', 4096, 1, false);
    huber_h float8 := coalesce((params->>'huber_h')::float8, 0.1);
    x_bound float8;
    r_x float8;
    y_bound float8 := 0;
    lip float8;
BEGIN
    IF delta > 0 THEN
        PERFORM dpsql_internal._fail('exponential_mechanism is pure epsilon-DP: it takes delta => 0',
                                     hint => 'Pass delta => 0 (the mechanism cannot use delta).');
    END IF;
    IF model NOT IN ('logistic', 'huber', 'linear') THEN
        PERFORM dpsql_internal._fail(format('exponential_mechanism trains model => logistic, huber or linear, not %s',
                                            quote_literal(model)));
    END IF;
    IF p > 5 THEN
        PERFORM dpsql_internal._fail(format('exponential-mechanism ERM is for p <= 5: the grid grows as k^p '
                                            '(got p = %s coefficients)', p));
    END IF;
    IF points <> floor(points) OR points > 65536 THEN
        PERFORM dpsql_internal._fail(format('options.grid_points must be a whole number between 1 and 65536, got %s',
                                            points));
    END IF;
    IF model <> 'linear' AND jsonb_array_length(params->'classes') <> 2 THEN
        PERFORM dpsql_internal._fail('exponential_mechanism trains binary classifiers (2 classes)');
    END IF;
    IF model = 'linear' THEN
        IF ds.row_bound IS NULL THEN
            PERFORM dpsql_internal._fail('exponential_mechanism needs a public bound on ||x||',
                                hint => 'Register the dataset with row_bound, feature_bounds or row_norm => ''clip''.');
        END IF;
        x_bound := ds.row_bound;
        y_bound := ds.label_bound;
    ELSE
        x_bound := 1;  -- classification rows: row_norm clip or unit, ||x|| <= 1
    END IF;
    IF NOT (huber_h > 0 AND huber_h < 1) THEN
        PERFORM dpsql_internal._fail('huber_h must be in (0, 1)');
    END IF;
    r_x := sqrt(x_bound ^ 2 + intercept::int);
    lip := dpsql_internal._em_lipschitz(model, r_x, radius, y_bound);
    RETURN jsonb_build_object(
        'model', model, 'intercept', intercept, 'dim', d, 'rows', n, 'x_bound', x_bound,
        'y_bound', y_bound, 'radius', radius, 'grid_points', points::int, 'huber_h', huber_h,
        'epsilon', epsilon, 'delta_u', 2 * lip * radius,
        'info', jsonb_build_object(
            'algorithm', format('exponential-mechanism ERM (spec 004 A1) on a public grid of at most %s '
                                'points in the L2 ball of radius %s, anchored at 0, one scan', points::int, radius),
            'accounting', 'pure epsilon-DP: one exponential mechanism',
            'lipschitz', lip, 'radius', radius, 'delta_u', 2 * lip * radius, 'r_x', r_x,
            'y_bound', CASE WHEN model = 'linear' THEN y_bound END,
            'theta0', 0, 'neighbouring', 'replace-one, n public'));
END $$;

CREATE OR REPLACE FUNCTION dpsql_internal._em_fit(train_table text, plan jsonb, noise_seed bigint,
                                                  OUT weights float8[], OUT info jsonb,
                                                  OUT iterates float8[])
LANGUAGE plpgsql AS $$
DECLARE
    st float8[];
    rel record;
BEGIN
    EXECUTE format('SELECT dpsql_internal._em_losses(x, y, $1, $2, $3, $4, $5, $6, $7, $8) FROM %s',
                   train_table)
       INTO st USING plan->>'model', (plan->>'dim')::int, (plan->>'intercept')::boolean,
                     (plan->>'x_bound')::float8, (plan->>'y_bound')::float8,
                     (plan->>'radius')::float8, (plan->>'huber_h')::float8,
                     (plan->>'grid_points')::int;
    IF st IS NULL THEN  -- no rows: every score is 0, the draw is uniform
        EXECUTE 'SELECT dpsql_internal._em_losses(NULL, NULL, $1, $2, $3, $4, $5, $6, $7, $8)'
           INTO st USING plan->>'model', (plan->>'dim')::int, (plan->>'intercept')::boolean,
                         (plan->>'x_bound')::float8, (plan->>'y_bound')::float8,
                         (plan->>'radius')::float8, (plan->>'huber_h')::float8,
                         (plan->>'grid_points')::int;
    END IF;
    rel := dpsql_internal._em_release(st, (plan->>'epsilon')::float8, (plan->>'delta_u')::float8,
                                      noise_seed);
    weights := rel.weights;
    info := jsonb_build_object('grid_size', rel.grid_points);
    iterates := NULL;
END $$;

SELECT dpsql_internal._register_mechanism(
    'exponential_mechanism', '_train_planned', 'any', false, false,
    'exponential-mechanism ERM on a public grid (pure epsilon-DP, p <= 5)',
    'docs/exponential_mechanism.md',
    options => '{radius,grid_points}', plan_function => '_em_plan', fit_function => '_em_fit',
    models => '{logistic,huber,linear}', params => '{huber_h,options}',
    distributed => 'sums');
------------------------------------------------------------------------------------------
-- Output perturbation of the exact regularised minimiser (spec 004 card A10; Chaudhuri,
-- Monteleoni and Sarwate 2011): minimise sum_i l + (reg/2) ||theta||^2 by the certified Newton
-- solver (45_erm_solver.sql), then add noise for the replace-one sensitivity
-- 2 (L + tolerance) / reg (dpsql_output_perturbation_sensitivity, objective.h): Gamma-norm for
-- epsilon-DP, the analytic Gaussian with delta > 0. With reg = n lambda it is the bolt-on's
-- strongly convex sensitivity 2L / (lambda m) for the exact minimiser (tests check both agree).
-- docs/objective_perturbation.md.
------------------------------------------------------------------------------------------

-- The plan: reg = n lambda if the analyst gave lambda > 0, else card A10's utility choice
-- L sqrt(2 n p / epsilon) / radius (radius a public bound on ||theta*||, default 10).
CREATE OR REPLACE FUNCTION dpsql_internal._outpert_plan(privacy text, ds dpsql.datasets, n bigint,
                                                        d int, epsilon float8, delta float8,
                                                        params jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    options jsonb := dpsql_internal._plan_options(privacy, params);
    glm jsonb := dpsql_internal._glm_plan(privacy, ds, n, d, params, options);
    radius float8 := (glm->>'radius')::float8;
    lambda float8 := (glm->>'lambda')::float8;
    lipschitz float8 := (glm->>'lipschitz')::float8;
    tolerance float8 := (glm->>'tolerance')::float8;
    outputs int := (glm->>'outputs')::int;
    reg float8;
    sensitivity float8;
BEGIN
    IF NOT (epsilon > 0 AND epsilon < 'Infinity') OR NOT (delta >= 0 AND delta < 1) THEN
        PERFORM dpsql_internal._fail('output perturbation needs epsilon > 0 and 0 <= delta < 1');
    END IF;
    reg := CASE WHEN lambda > 0 THEN n * lambda
                ELSE lipschitz * sqrt(2.0 * n * (glm->>'p')::int * outputs / epsilon) / radius END;
    sensitivity := dpsql_internal._output_perturbation_sensitivity(lipschitz, reg, tolerance);
    RETURN glm || jsonb_build_object(
        'regularizer', reg, 'sensitivity', sensitivity,
        -- one-vs-rest: each of the C models gets (epsilon, delta) / C (basic composition)
        'epsilon', epsilon / outputs, 'delta', delta / outputs,
        'info', jsonb_build_object(
            'algorithm', 'output perturbation (spec 004 A10) of the regularised minimiser, '
                         'certified by Newton''s method',
            'noise', CASE WHEN delta > 0 THEN 'gaussian (analytic)' ELSE 'gamma-norm' END,
            'sensitivity', sensitivity, 'regularizer', reg, 'lipschitz', lipschitz,
            'tolerance', tolerance, 'radius', radius, 'one_vs_rest', outputs > 1,
            'model_epsilon', epsilon / outputs, 'model_delta', delta / outputs,
            'neighbouring', 'replace-one, n public'));
END $$;

CREATE OR REPLACE FUNCTION dpsql_internal._outpert_fit(train_table text, plan jsonb, noise_seed bigint,
                                                       OUT weights float8[], OUT info jsonb,
                                                       OUT iterates float8[])
LANGUAGE plpgsql AS $$
DECLARE
    outputs int := (plan->>'outputs')::int;
    sol record;
    rel record;
    scans int := 0;
BEGIN
    weights := '{}';
    iterates := NULL;
    FOR c IN 0 .. outputs - 1 LOOP
        sol := dpsql_internal._erm_solve(train_table, plan, NULL, CASE WHEN outputs > 1 THEN c END);
        scans := scans + sol.scans;
        IF NOT sol.certified THEN
            weights := NULL;  -- nothing is released (33_planned.sql keeps the charge)
            info := jsonb_build_object('scans', scans, 'certified', false, 'output', c);
            RETURN;
        END IF;
        rel := dpsql_internal._perturb(sol.theta, (plan->>'sensitivity')::float8,
                                       (plan->>'epsilon')::float8, (plan->>'delta')::float8,
                                       noise_seed, 1 + c);
        weights := CASE WHEN outputs > 1 THEN weights || ARRAY[rel.weights] ELSE rel.weights END;
    END LOOP;
    info := jsonb_build_object('scans', scans, 'certified', true, 'noise_scale', rel.noise_scale);
END $$;

SELECT dpsql_internal._register_mechanism(
    'output_perturbation', '_train_planned', 'any', false, false,
    'output perturbation of the exact regularised minimiser (epsilon-DP Gamma-norm noise, or '
    'Gaussian with delta > 0)',
    'docs/objective_perturbation.md', options => '{radius,huber_threshold,max_scans}',
    plan_function => '_outpert_plan', fit_function => '_outpert_fit',
    models => '{logistic,huber,linear}', params => '{lambda,huber_h,options}',
    distributed => 'sums');
------------------------------------------------------------------------------------------
-- Analyst API
------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION dpsql.train(
    source text, features text[], label text, model text DEFAULT 'logistic',
    epochs int DEFAULT NULL, batch_size bigint DEFAULT NULL, lambda float8 DEFAULT 0,
    step_size float8 DEFAULT NULL, schedule text DEFAULT NULL,
    radius float8 DEFAULT NULL, shuffle boolean DEFAULT true, seed bigint DEFAULT NULL,
    privacy text DEFAULT 'none', labels float8[] DEFAULT NULL, intercept boolean DEFAULT false,
    row_norm text DEFAULT 'none', huber_h float8 DEFAULT 0.1, step_offset float8 DEFAULT 0,
    tolerance float8 DEFAULT NULL, parallel_workers int DEFAULT 0,
    epsilon float8 DEFAULT NULL, delta float8 DEFAULT 0, gaussian text DEFAULT 'analytic',
    permutation text DEFAULT 'once', paper_minibatch_formula boolean DEFAULT false,
    noise_seed bigint DEFAULT NULL, tuning_lambdas float8[] DEFAULT NULL,
    tuning_epochs int[] DEFAULT NULL, clip_norm float8 DEFAULT NULL,
    sampling text DEFAULT 'shuffle', noise_multiplier float8 DEFAULT NULL,
    bst14_noise text DEFAULT 'strict', steps int DEFAULT NULL, ci text DEFAULT NULL,
    ci_draws int DEFAULT NULL, burn_in int DEFAULT NULL, options jsonb DEFAULT NULL,
    shard_parallel boolean DEFAULT false)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    run bigint;
    e record;
BEGIN
    IF privacy IS DISTINCT FROM 'none' THEN
        -- Registered datasets only, with their owner's columns, labels and bounds (features
        -- and label may be NULL, or must match the registration).
        RETURN dpsql_internal._train_private(source, model, jsonb_build_object(
            'privacy', privacy, 'epsilon', epsilon, 'delta', delta, 'gaussian', gaussian,
            'epochs', epochs, 'batch_size', batch_size, 'lambda', lambda, 'step_size', step_size,
            'schedule', schedule, 'radius', radius, 'shuffle', shuffle, 'seed', seed,
            'intercept', intercept, 'huber_h', huber_h, 'step_offset', step_offset,
            'tolerance', tolerance, 'parallel_workers', parallel_workers,
            'permutation', permutation, 'paper_minibatch_formula', paper_minibatch_formula,
            'noise_seed', noise_seed, 'features', features, 'label', label,
            'tuning_lambdas', tuning_lambdas, 'tuning_epochs', tuning_epochs,
            'clip_norm', clip_norm, 'sampling', sampling, 'noise_multiplier', noise_multiplier,
            'bst14_noise', bst14_noise, 'steps', steps, 'ci', ci, 'ci_draws', ci_draws,
            'burn_in', burn_in, 'options', options, 'shard_parallel', shard_parallel,
            -- the registration's: refused when given
            'labels', labels, 'row_norm', nullif(row_norm, 'none')));
    END IF;
    IF NOT dpsql_internal._is_admin() THEN
        PERFORM dpsql_internal._fail('privacy => ''none'' is for data owners (dpsql_admin): analysts train '
                            'private models of registered datasets', '42501',
                            'Use privacy => ''bolton'' with epsilon (and delta).');
    END IF;
    IF epsilon IS NOT NULL OR noise_seed IS NOT NULL OR tuning_lambdas IS NOT NULL
       OR tuning_epochs IS NOT NULL OR clip_norm IS NOT NULL OR noise_multiplier IS NOT NULL
       OR sampling <> 'shuffle' OR steps IS NOT NULL OR ci IS NOT NULL OR ci_draws IS NOT NULL
       OR burn_in IS NOT NULL OR options IS NOT NULL THEN
        PERFORM dpsql_internal._fail('privacy parameters given with privacy => ''none''',
                            hint => 'Use privacy => ''bolton'' for a private model.');
    END IF;
    -- Non-private defaults: 10 epochs of batch 1 (private runs: 34_defaults.sql).
    epochs := coalesce(epochs, 10);
    batch_size := coalesce(batch_size, 1);
    run := dpsql_internal._prepare(source, features, label, model, epochs, batch_size, lambda, step_size,
                          coalesce(schedule, 'constant'), step_offset, radius, shuffle, seed,
                          labels, intercept, row_norm, huber_h, tolerance, parallel_workers,
                          permutation => permutation, shard_parallel => shard_parallel);
    LOOP
        e := dpsql_internal._run_epoch(run);
        RAISE NOTICE 'dpsql: epoch %/% objective %', e.epoch, epochs, round(e.objective::numeric, 6);
        EXIT WHEN e.done;
    END LOOP;
    RETURN dpsql_internal._finish(run);
END $$;
COMMENT ON FUNCTION dpsql.train IS
    'Train a model by in-database SGD (one aggregate scan per epoch); returns its model_id';

CREATE OR REPLACE FUNCTION dpsql_internal._model(model_id bigint)
RETURNS dpsql.models LANGUAGE plpgsql STABLE AS $$
DECLARE
    m dpsql.models;
BEGIN
    SELECT * INTO m FROM dpsql.models WHERE models.model_id = _model.model_id;
    IF NOT FOUND THEN
        PERFORM dpsql_internal._fail(format('no model %s', coalesce(model_id::text, 'NULL')), '42704');
    END IF;
    RETURN m;
END $$;

-- Probability of the positive class (logistic), score (huber, linear) or class (multinomial).
CREATE OR REPLACE FUNCTION dpsql.predict(model_id bigint, x float8[])
RETURNS float8 LANGUAGE plpgsql STABLE AS $$
DECLARE
    m dpsql.models := dpsql_internal._model(model_id);
    bounds float8[] := dpsql_internal._jsonb_weights(nullif(m.params->'feature_bounds', 'null'));
    pre jsonb := nullif(m.params->'privacy'->'preprocessing', 'null');
    p float8 := dpsql_internal._predict(dpsql_internal._loss_code(m.model), m.flags, m.weights,
                               CASE WHEN pre IS NOT NULL
                                    THEN dpsql_internal._preprocess(x, bounds, (pre->>'row_flags')::int,
                                                           dpsql_internal._jsonb_weights(pre->'centre'))
                                    WHEN bounds IS NULL THEN x
                                    ELSE dpsql_internal._apply_bounds(x, bounds) END);
BEGIN
    IF array_ndims(m.weights) = 2 THEN  -- multinomial or one-vs-rest: a class index
        RETURN m.classes[p::int + 1];
    END IF;
    RETURN p;
END $$;

-- Accuracy (classification) or mean squared error (linear) of a model over a table or query.
CREATE OR REPLACE FUNCTION dpsql.evaluate(model_id bigint, source text, features text[] DEFAULT NULL,
                               label text DEFAULT NULL,
                               OUT metric text, OUT value float8, OUT rows bigint)
LANGUAGE plpgsql
SET max_parallel_workers_per_gather = 0
AS $$
DECLARE
    m dpsql.models := dpsql_internal._model(model_id);
    src text := dpsql_internal._source_sql(source);
    feat record;
    yexpr text;
    pexpr text;
BEGIN
    -- The rows are read with the caller's rights: an analyst evaluates on a test table the
    -- data owner granted, never on a registered dataset (its accuracy is not private).
    BEGIN
        -- The same public feature bounds as in training (registered datasets).
        feat := dpsql_internal._feature_sql(src, coalesce(features, m.features),
                                   dpsql_internal._jsonb_weights(nullif(m.params->'feature_bounds', 'null')));
    EXCEPTION WHEN insufficient_privilege THEN
        PERFORM dpsql_internal._fail(format('evaluate reads the rows of %s as %s, who may not: %s',
                                            source, current_user, SQLERRM), '42501',
            'dpsql.evaluate needs SELECT on the test rows (GRANT SELECT ON ... TO the role): '
            'a held-out test table, not a registered dataset, whose rows analysts never read.');
    END;
    IF feat.dim <> m.n_features THEN
        PERFORM dpsql_internal._fail(format('model %s has %s features, the source gives %s',
                                   model_id, m.n_features, feat.dim));
    END IF;
    IF m.params->'privacy'->'preprocessing' <> 'null' THEN  -- DPSGD-F: rows centred as in training
        feat.expr := format('dpsql_internal._preprocess(%s, NULL, %s, %L::float8[])', feat.expr,
                            (m.params->'privacy'->'preprocessing'->>'row_flags')::int,
                            dpsql_internal._jsonb_weights(m.params->'privacy'->'preprocessing'->'centre'));
    END IF;
    yexpr := dpsql_internal._label_sql(m.model, coalesce(label, m.label), m.classes);
    pexpr := format('dpsql_internal._predict(%s, %s, %L::float8[], %s)',
                    dpsql_internal._loss_code(m.model), m.flags, m.weights, feat.expr);
    IF m.model = 'linear' THEN
        metric := 'mse';
        EXECUTE format('SELECT avg((p - y) ^ 2), count(*) FROM (SELECT %s AS p, %s AS y FROM %s) e',
                       pexpr, yexpr, src) INTO value, rows;
    ELSE
        metric := 'accuracy';
        EXECUTE format('SELECT avg((%s)::int), count(*) FROM (SELECT %s AS p, %s AS y FROM %s) e',
                       CASE WHEN array_ndims(m.weights) = 2 THEN 'p = y'
                            ELSE format('dpsql_internal._is_positive(%s, p) = (y > 0)',
                                        dpsql_internal._loss_code(m.model)) END,
                       pexpr, yexpr, src) INTO value, rows;
    END IF;
END $$;
------------------------------------------------------------------------------------------
-- Re-accounting the ledger (docs/privacy.md): every entry stores its release as a
-- dp-accounting DpEvent (dpsql/ledger_events.py), and the accountant composes a dataset's
-- events by PLD (and RDP), next to the charged sums. 'pld' datasets are charged that way
-- (dpsql_internal._charge).
------------------------------------------------------------------------------------------

-- DP-SGD's release as dpsql/accounting.py accounts it, in the ledger's convention
-- (REPLACE_ONE with the multiplier z itself, dpsql/ledger_events.py): per record, `epochs`
-- Gaussians for shuffled disjoint batches, epochs * steps_per_epoch Poisson-subsampled ones
-- (plain Gaussians when q = 1), after DPSGD-F's mean Gaussian (multiplier `prefix`) if any.
-- NULL for a plan that is not DP-SGD's: the charge then records (epsilon, delta).
CREATE OR REPLACE FUNCTION dpsql_internal._dpsgd_event(plan jsonb, epochs int, prefix float8 DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    z float8 := (plan->'info'->>'noise_multiplier')::float8;
    q float8 := (plan->>'sampling_rate')::float8;
    gaussian jsonb := jsonb_build_object('type', 'Gaussian', 'noise_multiplier', z);
    steps jsonb;
BEGIN
    IF z IS NULL OR epochs IS NULL THEN
        RETURN NULL;
    ELSIF plan->>'sampling' = 'shuffle' THEN
        steps := jsonb_build_object('type', 'SelfComposed', 'event', gaussian, 'count', epochs);
    ELSIF plan->>'sampling' = 'poisson' AND q > 0 THEN
        steps := jsonb_build_object(
            'type', 'SelfComposed',
            'event', CASE WHEN q < 1
                          THEN jsonb_build_object('type', 'PoissonSampled',
                                                  'sampling_probability', q, 'event', gaussian)
                          ELSE gaussian END,
            'count', epochs * (plan->>'steps_per_epoch')::bigint);
    ELSE
        RETURN NULL;
    END IF;
    IF prefix IS NULL THEN
        RETURN steps;
    END IF;
    RETURN jsonb_build_object('type', 'Composed', 'events', jsonb_build_array(
        jsonb_build_object('type', 'Gaussian', 'noise_multiplier', prefix), steps));
END $$;

-- The accountant's composition of a dataset's ledger (plus `extra`, a release about to be
-- charged) at `delta`. Identical events are sent once with their count, in a fixed order, so
-- the request is short and the same ledger asks the same question: small requests are cached
-- in dpsql.accountant_answers (a btree key holds at most about 2.7 kB).
CREATE OR REPLACE FUNCTION dpsql_internal._compose_ledger(dataset_id bigint, delta float8,
                                                          extra jsonb DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    events jsonb;
    req jsonb;
    answer jsonb;
BEGIN
    SELECT coalesce(jsonb_agg(CASE WHEN g.n = 1 THEN g.ev
                                   ELSE jsonb_build_object('type', 'SelfComposed', 'event', g.ev,
                                                           'count', g.n) END
                              ORDER BY g.ev::text), '[]')
      INTO events
      FROM (SELECT u.ev, count(*) AS n
              FROM (SELECT coalesce(e.dp_event,
                                    dpsql_internal._epsilon_delta_event(e.epsilon, e.delta)) AS ev
                      FROM dpsql.ledger_entries e WHERE e.dataset_id = _compose_ledger.dataset_id
                    UNION ALL
                    SELECT extra WHERE extra IS NOT NULL) u
             GROUP BY u.ev) g;
    req := jsonb_build_object('op', 'compose', 'events', events, 'delta', delta);
    IF jsonb_array_length(events) = 0 THEN  -- nothing released: no need to ask
        RETURN jsonb_build_object('op', 'compose', 'epsilon_pld', 0, 'epsilon_rdp', 0,
                                  'delta', delta, 'events', 0);
    END IF;
    SELECT a.answer INTO answer FROM dpsql.accountant_answers a WHERE a.request = req;
    IF FOUND THEN
        RETURN answer;
    END IF;
    answer := dpsql_internal._accountant(req::text)::jsonb;
    IF answer ? 'error' THEN
        PERFORM dpsql_internal._fail('the accountant refused the ledger''s events: '
                                     || (answer->>'error'));
    END IF;
    IF octet_length(req::text) <= 2000 THEN
        INSERT INTO dpsql.accountant_answers (request, answer) VALUES (req, answer)
            ON CONFLICT DO NOTHING;
    END IF;
    RETURN answer;
END $$;

-- A dataset's spend re-accounted: the charged sums next to the tight PLD composition of its
-- ledger's events at the delta budget (and the RDP one when every event has an RDP curve),
-- and what summation wastes. Same visibility as dpsql.budgets.
CREATE OR REPLACE FUNCTION dpsql.budget_report(dataset text)
RETURNS TABLE (dataset_id bigint, name text, composition text, entries bigint,
               epsilon_budget float8, delta_budget float8, epsilon_spent float8,
               delta_spent float8, epsilon_pld float8, epsilon_rdp float8,
               epsilon_saving float8, dp_accounting text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d dpsql.datasets;
    composed jsonb;
BEGIN
    IF budget_report.dataset IS NULL THEN
        RAISE EXCEPTION 'dpsql: budget_report needs a dataset name, got NULL'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'dpsql.budgets lists the datasets you can use.';
    END IF;
    SELECT * INTO d FROM dpsql.datasets ds WHERE ds.name = budget_report.dataset;
    -- An ungranted dataset is reported like an unknown one: its name is not disclosed either.
    IF NOT FOUND OR NOT dpsql_internal._can_use_dataset(d.dataset_id) THEN
        RAISE EXCEPTION 'dpsql: no dataset % among the datasets you can use',
                        quote_literal(budget_report.dataset)
            USING ERRCODE = 'undefined_object',
                  HINT = 'dpsql.budgets lists the datasets you can use.';
    END IF;
    composed := dpsql_internal._compose_ledger(d.dataset_id, d.delta_budget);
    dataset_id := d.dataset_id;
    name := d.name;
    composition := d.composition;
    epsilon_budget := d.epsilon_budget;
    delta_budget := d.delta_budget;
    SELECT count(*), coalesce(sum(e.epsilon), 0), coalesce(sum(e.delta), 0)
      INTO entries, epsilon_spent, delta_spent
      FROM dpsql.ledger_entries e WHERE e.dataset_id = d.dataset_id;
    -- NULL: no finite guarantee at this delta (PLD), or no RDP curve for some event.
    epsilon_pld := (composed->>'epsilon_pld')::float8;
    epsilon_rdp := (composed->>'epsilon_rdp')::float8;
    epsilon_saving := epsilon_spent - epsilon_pld;
    dp_accounting := composed->>'dp_accounting';
    RETURN NEXT;
END $$;
COMMENT ON FUNCTION dpsql.budget_report(text) IS
    'A dataset''s ledger re-accounted: charged sums next to the PLD (and RDP) composition of its events';
------------------------------------------------------------------------------------------
-- Privacy audits (docs/audit.md): an empirical lower bound on a mechanism's epsilon, measured
-- by training it on copies of a registered dataset with canaries. The copies are datasets of
-- their own (never granted, charged to their own ledger entries, dropped at the end): the
-- audited dataset's budget and ledger are not touched, and no model outlives the call.
------------------------------------------------------------------------------------------

CREATE SCHEMA IF NOT EXISTS dpsql_audit;
REVOKE ALL ON SCHEMA dpsql_audit FROM PUBLIC;
COMMENT ON SCHEMA dpsql_audit IS 'Scratch copies of datasets with canaries, inside one dpsql.audit call';

CREATE TABLE IF NOT EXISTS dpsql.audits (
    audit_id        bigserial PRIMARY KEY,
    dataset_id      bigint NOT NULL REFERENCES dpsql.datasets,
    privacy         text NOT NULL,
    model           text NOT NULL,
    epsilon_claimed float8 NOT NULL,
    delta           float8 NOT NULL,
    epsilon_lower   float8 NOT NULL,
    confidence      float8 NOT NULL,
    runs            int NOT NULL,
    method          text NOT NULL,
    options         jsonb NOT NULL,             -- the audited configuration, as given
    details         jsonb NOT NULL,             -- counts, threshold, canaries, mutation
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    created_by      name NOT NULL DEFAULT session_user
);
COMMENT ON TABLE dpsql.audits IS
    'Privacy audits: claimed epsilon against an empirical lower bound (data owners only)';
-- An audit's counts come from uncharged releases: each auditor reads their own audits only.
ALTER TABLE dpsql.audits ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS own_audits ON dpsql.audits;
CREATE POLICY own_audits ON dpsql.audits FOR SELECT USING (created_by = current_user);

-- The test-only switch that breaks a mechanism on purpose (docs/audit.md, "mutations"): a
-- setting only a superuser's session may carry; any other caller is refused outright.
CREATE OR REPLACE FUNCTION dpsql_internal._mutation()
RETURNS text LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    m text := nullif(current_setting('dpsql_audit.mutation', true), '');
BEGIN
    IF m IS NULL THEN
        RETURN NULL;
    END IF;
    IF NOT coalesce((SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = session_user), false) THEN
        PERFORM dpsql_internal._fail('dpsql_audit.mutation is a superuser''s test switch', '42501',
                                     'RESET dpsql_audit.mutation');
    END IF;
    IF m NOT IN ('half_noise', 'paper_minibatch', 'no_clipping', 'poisson_on_shuffle') THEN
        PERFORM dpsql_internal._fail(format('unknown mutation %s', quote_literal(m)));
    END IF;
    RETURN m;
END $$;

-- The bolt-on's sensitivity as a mutation breaks it: halved (half the noise), or the paper's
-- mini-batch formula for strongly convex runs (too small by the batch size, spec 003 s. 5.5).
CREATE OR REPLACE FUNCTION dpsql_internal._audit_sensitivity(spec jsonb, rows bigint, sensitivity float8)
RETURNS float8 LANGUAGE plpgsql STABLE AS $$
DECLARE
    m text := dpsql_internal._mutation();
    c record;
BEGIN
    IF m = 'half_noise' THEN
        RETURN sensitivity / 2;
    ELSIF m = 'paper_minibatch' THEN
        c := dpsql.loss_constants(spec->>'model', (spec->>'lambda')::float8,
                                  coalesce((spec->>'radius')::float8, 0),
                                  coalesce((spec->>'huber_h')::float8, 0.1));
        RETURN dpsql.bolton_sensitivity(
            spec->>'schedule', coalesce((spec->>'step_size')::float8, 0),
            (spec->>'step_offset')::float8, c.lipschitz, c.smoothness, c.strong_convexity, rows,
            (spec->>'batch_size')::bigint, (spec->>'epochs')::int, spec->>'permutation' = 'fresh',
            paper_minibatch => true);
    END IF;
    RETURN sensitivity;
END $$;

-- A white-box plan as a mutation breaks it: half the noise, no clipping (the noise stays
-- calibrated to the clip norm), or shuffled batches accounted as if they were Poisson.
CREATE OR REPLACE FUNCTION dpsql_internal._audit_plan(spec jsonb, rows bigint, plan jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    m text := dpsql_internal._mutation();
    b bigint := (spec->>'batch_size')::bigint;
    acct jsonb;
BEGIN
    IF m = 'half_noise' THEN
        RETURN plan || jsonb_build_object('noise_scale', (plan->>'noise_scale')::float8 / 2);
    ELSIF m = 'no_clipping' AND plan ? 'clip_norm' THEN
        RETURN plan || jsonb_build_object('clip_norm', 1e12);
    ELSIF m = 'poisson_on_shuffle' AND plan->>'sampling' = 'shuffle' THEN
        acct := dpsql_internal._account(jsonb_build_object(
            'op', 'calibrate', 'scheme', 'poisson', 'delta', (plan->>'delta')::float8,
            'target_epsilon', (plan->>'epsilon')::float8,
            'steps', (spec->>'epochs')::int * (rows / b), 'sampling_rate', b::float8 / rows));
        RETURN plan || jsonb_build_object('noise_scale', (acct->>'noise_multiplier')::float8
                                                         * (plan->>'clip_norm')::float8);
    END IF;
    RETURN plan;
END $$;

-- A copy of the dataset's rows (read as the extension owner) plus `slots` rows the audit fills
-- with canaries, registered as a dataset of its own with the same public declarations and a
-- budget for two releases (a distinguishing audit keeps its first run and rolls each later one
-- back, its charge included).
CREATE OR REPLACE FUNCTION dpsql_internal._audit_copy(ds dpsql.datasets, slots int,
                                                      epsilon float8, delta float8)
RETURNS dpsql.datasets LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- (random() may be seeded by options.seed: the name comes from elsewhere)
    name text := format('audit_%s_%s', ds.dataset_id, substr(md5(gen_random_uuid()::text), 1, 10));
    xexpr text := CASE WHEN dpsql_internal._array_feature(ds) THEN quote_ident(ds.features[1])
                       ELSE format('ARRAY[%s]::float8[]',
                                   (SELECT string_agg(quote_ident(f), ', ') FROM unnest(ds.features) f))
                  END;
    copy dpsql.datasets;
BEGIN
    EXECUTE format('CREATE TABLE dpsql_audit.%I (x float8[], y float8, slot int)', name);
    EXECUTE format('INSERT INTO dpsql_audit.%I (x, y) SELECT %s, %I FROM %s',
                   name, xexpr, ds.label, dpsql_internal._private_from(ds));
    EXECUTE format('INSERT INTO dpsql_audit.%I (slot) SELECT generate_series(1, %s)', name, slots);
    INSERT INTO dpsql.datasets (name, relid, source, features, label, labels, feature_bounds,
                                row_norm, epsilon_budget, delta_budget, label_bound, row_bound, dim)
    VALUES (name, format('dpsql_audit.%I', name)::regclass, format('dpsql_audit.%I', name),
            '{x}', 'y', ds.labels, ds.feature_bounds, ds.row_norm, epsilon * 2.001,
            least(delta * 2.001, 0.999), ds.label_bound, ds.row_bound, ds.dim)
    RETURNING * INTO copy;
    PERFORM dpsql_internal._grant_reader(copy.relid, '{x,y}');
    RETURN copy;
END $$;

-- A raw row whose public transform (feature bounds onto [-1, 1], then the row norm) is t, a
-- point of the unit ball: the audit designs canaries where the model sees them.
CREATE OR REPLACE FUNCTION dpsql_internal._audit_raw(ds dpsql.datasets, t float8[])
RETURNS float8[] LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN ds.feature_bounds IS NOT NULL THEN
                ARRAY(SELECT ds.feature_bounds[i][1] + (t[i] + 1) / 2
                             * (ds.feature_bounds[i][2] - ds.feature_bounds[i][1])
                        FROM generate_subscripts(t, 1) i ORDER BY i)
           ELSE ARRAY(SELECT v * coalesce(ds.row_bound, 1) FROM unnest(t) v) END
$$;

-- A uniformly random direction of the unit sphere in dim dimensions (Box-Muller on random(),
-- which options.seed seeds: the canaries, not the mechanism's noise).
CREATE OR REPLACE FUNCTION dpsql_internal._audit_direction(dim int)
RETURNS float8[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    g float8[] := ARRAY(SELECT sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random())
                          FROM generate_series(1, dim));
    norm float8 := sqrt((SELECT sum(v * v) FROM unnest(g) v));
BEGIN
    RETURN ARRAY(SELECT v / norm FROM unnest(g) v);
END $$;

-- One private release of the copy: its model id (NULL when an uncertified solver released
-- nothing). The audit deletes the copy's models before it returns.
CREATE OR REPLACE FUNCTION dpsql_internal._audit_release(copy dpsql.datasets, model text, params jsonb)
RETURNS bigint LANGUAGE sql AS $$
    SELECT dpsql_internal._train_private(copy.name, model, params)
$$;

-- The audit (dpsql.audit below is its interface): the new dpsql.audits row's summary.
CREATE OR REPLACE FUNCTION dpsql_internal._audit(dataset text, privacy text, epsilon float8,
                                                 delta float8, n_runs int, method text,
                                                 opts jsonb)
RETURNS TABLE (claimed float8, lower_bound float8, level float8, trainings int, how text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET extra_float_digits = 3  -- the scores and thresholds sent to the statistics, in full
AS $$
DECLARE
    conf float8 := coalesce((opts->>'confidence')::float8, 0.95);
    ds dpsql.datasets;
    model text;
    train jsonb := coalesce(opts->'train', '{}');
    params jsonb;
    copy dpsql.datasets;
    dim int;
    canary float8[];
    labels float8[];
    positive float8;
    mid bigint;
    w float8[];
    answer jsonb;
    request jsonb;
    details jsonb;
    m int;
    id bigint;
BEGIN
    opts := coalesce(opts, '{}');
    conf := coalesce((opts->>'confidence')::float8, 0.95);
    train := coalesce(opts->'train', '{}');
    PERFORM dpsql_internal._require_admin('audit a mechanism');
    IF method IS NULL OR method NOT IN ('one_run', 'distinguish') THEN
        PERFORM dpsql_internal._fail(format('method must be one_run or distinguish, got %s',
                                            coalesce(quote_literal(method), 'NULL')));
    END IF;
    IF jsonb_typeof(opts) <> 'object' OR jsonb_typeof(train) <> 'object'
       OR EXISTS (SELECT 1 FROM jsonb_object_keys(opts) k
                   WHERE k NOT IN ('confidence', 'train', 'model', 'canaries', 'seed', 'mutation',
                                   'test')) THEN
        PERFORM dpsql_internal._fail('options takes confidence, model, train (dpsql.train''s '
                                     'parameters), canaries, seed, test and mutation',
                                     hint => 'e.g. options => ''{"train": {"epochs": 2}, "canaries": 500}''');
    END IF;
    IF NOT (epsilon > 0 AND epsilon < 'Infinity') OR NOT (delta >= 0 AND delta < 1) THEN
        PERFORM dpsql_internal._fail('epsilon must be a finite number > 0 and delta in [0, 1)');
    END IF;
    IF coalesce(opts->>'test', 'dp') NOT IN ('dp', 'gdp')
       OR (opts ? 'test' AND method <> 'distinguish') THEN
        PERFORM dpsql_internal._fail('options.test is dp (any mechanism) or gdp (Gaussian compositions), '
                                     'for method => ''distinguish''');
    END IF;
    IF NOT (conf >= 0.5 AND conf < 1) THEN
        PERFORM dpsql_internal._fail(format('options.confidence must be in [0.5, 1), got %s', conf));
    END IF;
    n_runs := coalesce(n_runs, CASE WHEN method = 'one_run' THEN 1 ELSE 200 END);
    IF method = 'one_run' AND n_runs <> 1 THEN
        PERFORM dpsql_internal._fail('a one_run audit trains once: runs => 1 (or NULL)');
    END IF;
    IF method = 'distinguish' AND NOT (n_runs BETWEEN 20 AND 20000) THEN
        PERFORM dpsql_internal._fail(format('a distinguish audit takes 20 to 20000 runs per dataset, got %s', n_runs));
    END IF;
    ds := dpsql_internal._dataset_for_source(dataset);
    -- Thousands of uncharged releases are no worse than the rows themselves only for a role
    -- that can read those rows: the data owner, not any member of dpsql_admin.
    IF EXISTS (SELECT 1 FROM unnest(ds.features || ds.label) c
                WHERE NOT has_column_privilege(session_user, ds.relid, c, 'SELECT')) THEN
        PERFORM dpsql_internal._fail(format('an audit of %s trains on its rows uncharged: only a '
                                            'role that can read them may run it', ds.name), '42501',
                                     'The data owner audits (GRANT SELECT on the registered columns).');
    END IF;
    IF opts ? 'seed' THEN
        PERFORM setseed(((opts->>'seed')::bigint % 1000003) / 1000003.0);
    END IF;
    IF opts ? 'mutation' THEN
        -- the switch is a superuser's, for this call only (_mutation refuses anyone else)
        PERFORM set_config('dpsql_audit.mutation', opts->>'mutation', true);
        PERFORM dpsql_internal._mutation();
    END IF;
    model := coalesce(opts->>'model', CASE WHEN ds.labels IS NULL THEN 'linear' ELSE 'logistic' END);
    params := train || jsonb_build_object('privacy', privacy, 'epsilon', epsilon, 'delta', delta);
    labels := ds.labels;
    positive := labels[cardinality(labels)];
    dim := coalesce(ds.dim, cardinality(ds.features));
    -- the runs report their own progress; an audit reports its runs
    PERFORM set_config('dpsql_progress.only', 'audit run', true);
    CREATE TEMP TABLE IF NOT EXISTS dpsql_audit_runs (side int, i int, w float8[]) ON COMMIT DROP;
    TRUNCATE dpsql_audit_runs;

    IF method = 'distinguish' THEN
        -- Replace-one neighbours: the slot holds the canary with the first label (D0) or the
        -- last (D1), or y = +B / -B for regression; one direction of the unit ball.
        copy := dpsql_internal._audit_copy(ds, 1, epsilon, delta);
        canary := dpsql_internal._audit_raw(ds, dpsql_internal._audit_direction(dim));
        FOR side IN 0 .. 1 LOOP
            EXECUTE format('UPDATE %s SET x = $1, y = $2 WHERE slot = 1', copy.relid)
              USING canary, CASE WHEN labels IS NULL THEN (1 - 2 * side) * ds.label_bound
                                 WHEN side = 0 THEN labels[1] ELSE positive END;
            FOR i IN 1 .. n_runs LOOP
                -- Each run after the first in a subtransaction that is rolled back once its
                -- weights are read: its training table, locks, model and charge go (thousands
                -- of runs would exhaust the lock table otherwise); the weights stay in a
                -- variable. The first run stays, so that the accountant's answer stays cached.
                w := NULL;
                IF side = 0 AND i = 1 THEN
                    mid := dpsql_internal._audit_release(copy, model, params);
                    SELECT ARRAY(SELECT v FROM unnest(m.weights) v) INTO w
                      FROM dpsql.model_store m WHERE m.model_id = mid;
                ELSE
                    BEGIN
                        mid := dpsql_internal._audit_release(copy, model, params);
                        SELECT ARRAY(SELECT v FROM unnest(m.weights) v) INTO w
                          FROM dpsql.model_store m WHERE m.model_id = mid;
                        RAISE EXCEPTION USING ERRCODE = 'DPA01';
                    EXCEPTION WHEN SQLSTATE 'DPA01' THEN
                        NULL;
                    END;
                END IF;
                INSERT INTO dpsql_audit_runs VALUES (side, i, w);
                PERFORM dpsql_internal._progress('audit run', side * n_runs + i, 2 * n_runs);
            END LOOP;
        END LOOP;
        -- The test: project on the difference of the two sides' mean models over the
        -- calibration half (odd runs); the even runs judge it.
        WITH released AS (
            SELECT r.side AS d, r.i % 2 = 1 AS calibration, r.w AS weights
              FROM dpsql_audit_runs r WHERE r.w IS NOT NULL),
        mean AS (
            SELECT k, avg(v) FILTER (WHERE d = 1) - avg(v) FILTER (WHERE d = 0) AS dv
              FROM released, unnest(released.weights) WITH ORDINALITY AS u(v, k)
             WHERE calibration GROUP BY k),
        score AS (
            SELECT d, calibration,
                   (SELECT sum(u.v * mean.dv) FROM unnest(released.weights) WITH ORDINALITY AS u(v, k)
                      JOIN mean USING (k)) AS s
              FROM released),
        -- candidate thresholds: 399 quantiles of the calibration scores; the statistics get
        -- the error counts at each, a few kilobytes whatever the number of runs
        grid AS (
            SELECT DISTINCT unnest(percentile_disc(ARRAY(SELECT g / 400.0 FROM generate_series(1, 399) g))
                                   WITHIN GROUP (ORDER BY s)) AS t
              FROM score WHERE calibration),
        errors AS (
            SELECT g.t,
                   count(*) FILTER (WHERE sc.d = 0 AND sc.calibration AND sc.s > g.t) AS fp_c,
                   count(*) FILTER (WHERE sc.d = 1 AND sc.calibration AND sc.s <= g.t) AS fn_c,
                   count(*) FILTER (WHERE sc.d = 0 AND NOT sc.calibration AND sc.s > g.t) AS fp_e,
                   count(*) FILTER (WHERE sc.d = 1 AND NOT sc.calibration AND sc.s <= g.t) AS fn_e
              FROM grid g CROSS JOIN score sc GROUP BY g.t)
        SELECT jsonb_build_object(
                   'op', 'audit_bound', 'method', 'distinguish', 'delta', delta, 'confidence', conf,
                   'test', coalesce(opts->>'test', 'dp'),
                   'thresholds', jsonb_agg(e.t ORDER BY e.t),
                   'fp_calibration', jsonb_agg(e.fp_c ORDER BY e.t),
                   'fn_calibration', jsonb_agg(e.fn_c ORDER BY e.t),
                   'fp_evaluation', jsonb_agg(e.fp_e ORDER BY e.t),
                   'fn_evaluation', jsonb_agg(e.fn_e ORDER BY e.t),
                   'calibration0', (SELECT count(*) FROM score WHERE d = 0 AND calibration),
                   'calibration1', (SELECT count(*) FROM score WHERE d = 1 AND calibration),
                   'evaluation0', (SELECT count(*) FROM score WHERE d = 0 AND NOT calibration),
                   'evaluation1', (SELECT count(*) FROM score WHERE d = 1 AND NOT calibration))
          INTO request FROM errors e;
    ELSE
        IF model = 'multinomial' OR cardinality(labels) > 2 THEN
            PERFORM dpsql_internal._fail('one_run audits binary and linear models (a canary''s '
                                         'score is its margin)', '0A000',
                                         'Use method => ''distinguish''.');
        END IF;
        -- m canary slots, each with its canary or a neutral row (x = 0 after the transform)
        -- by a fair coin: the guesses are judged against the coins.
        m := coalesce((opts->>'canaries')::int, 1000);
        -- (their scores travel to the statistics as one command-line argument: at most ~80 kB)
        IF NOT (m BETWEEN 10 AND 3000) THEN
            PERFORM dpsql_internal._fail(format('options.canaries must be in [10, 3000], got %s', m));
        END IF;
        copy := dpsql_internal._audit_copy(ds, m, epsilon, delta);
        CREATE TEMP TABLE IF NOT EXISTS dpsql_audit_canaries
            (slot int, x float8[], y float8, included boolean) ON COMMIT DROP;
        TRUNCATE dpsql_audit_canaries;
        INSERT INTO dpsql_audit_canaries
        SELECT s, dpsql_internal._audit_raw(ds, dpsql_internal._audit_direction(dim)),
               CASE WHEN labels IS NULL THEN CASE WHEN random() < 0.5 THEN ds.label_bound
                                                  ELSE -ds.label_bound END
                    WHEN random() < 0.5 THEN labels[1] ELSE positive END,
               random() < 0.5
          FROM generate_series(1, m) s;
        EXECUTE format('UPDATE %s t SET x = CASE WHEN c.included THEN c.x ELSE $1 END, y = c.y'
                       '  FROM dpsql_audit_canaries c WHERE t.slot = c.slot', copy.relid)
          USING dpsql_internal._audit_raw(ds, array_fill(0::float8, ARRAY[dim]));
        mid := dpsql_internal._audit_release(copy, model, params);
        IF mid IS NULL THEN
            PERFORM dpsql_internal._fail('the audited mechanism released nothing (its solver did '
                                         'not certify): no bound', '55000');
        END IF;
        INSERT INTO dpsql_audit_runs VALUES (1, 1, '{}');
        -- score: the margin the model gives the canary's label (higher when it was trained on)
        SELECT jsonb_build_object(
                   'op', 'audit_bound', 'method', 'one_run', 'delta', delta, 'confidence', conf,
                   'scores', jsonb_agg(s ORDER BY slot), 'included', jsonb_agg(included ORDER BY slot))
          INTO request
          FROM (SELECT c.slot, c.included,
                       CASE WHEN labels IS NULL THEN -((p.v - c.y) ^ 2)
                            WHEN model = 'logistic' THEN CASE WHEN c.y = positive THEN p.v ELSE 1 - p.v END
                            ELSE CASE WHEN c.y = positive THEN p.v ELSE -p.v END END AS s
                  FROM dpsql_audit_canaries c,
                       LATERAL (SELECT dpsql.predict(mid, c.x) AS v) p) q;
    END IF;
    answer := dpsql_internal._accountant(request::text)::jsonb;
    IF answer ? 'error' THEN
        PERFORM dpsql_internal._fail('the audit''s statistics refused: ' || (answer->>'error'), 'XX000');
    END IF;
    details := (answer - 'op' - 'method' - 'confidence')
               || jsonb_build_object('mutation', opts->'mutation', 'copy', copy.name,
                                     'released', (SELECT count(r.w) FROM dpsql_audit_runs r));
    -- The switches end with the audit, not with the transaction: a release after it in the
    -- same transaction is neither mutated nor silent.
    PERFORM set_config('dpsql_audit.mutation', '', true);
    PERFORM set_config('dpsql_progress.only', '', true);
    -- No model of the copies survives, and the copy is dropped (marked so by the event trigger).
    DELETE FROM dpsql.model_store s WHERE s.dataset_id = copy.dataset_id;
    EXECUTE format('DROP TABLE %s', copy.relid);
    INSERT INTO dpsql.audits (dataset_id, privacy, model, epsilon_claimed, delta, epsilon_lower,
                              confidence, runs, method, options, details)
    VALUES (ds.dataset_id, privacy, model, epsilon, delta, (answer->>'epsilon_lower')::float8,
            conf, n_runs, method, opts, details)
    RETURNING audit_id INTO id;
    RETURN QUERY SELECT a.epsilon_claimed, a.epsilon_lower, a.confidence, a.runs, a.method
                   FROM dpsql.audits a WHERE a.audit_id = id;
END $$;

-- The interface (a SQL function: its parameters and its result columns share names).
CREATE OR REPLACE FUNCTION dpsql.audit(dataset text, privacy text, epsilon float8,
                                       delta float8 DEFAULT 0, runs int DEFAULT NULL,
                                       method text DEFAULT 'one_run', options jsonb DEFAULT '{}')
RETURNS TABLE (epsilon_claimed float8, epsilon_lower float8, confidence float8, runs int,
               method text)
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM dpsql_internal._audit($1, $2, $3, $4, $5, $6, $7)
$$;
COMMENT ON FUNCTION dpsql.audit(text, text, float8, float8, int, text, jsonb) IS
    'Empirical lower bound on a mechanism''s epsilon on copies of a dataset with canaries (data owners; docs/audit.md)';
------------------------------------------------------------------------------------------
-- Pinned session settings (runs after every function is created, before the privileges).
--
-- Plans, specs and parameters travel between dpsql's functions as jsonb and text, and the
-- conversions of numbers, arrays and times to text follow the caller's session settings: with
-- extra_float_digits = -15 an analyst once rounded the step size the sensitivity was computed
-- from (0.1414 -> 0.1) while the state ran with the true one, and so cut the noise under a
-- full charge. Every dpsql function written in SQL or PL/pgSQL therefore runs with these
-- settings, whoever calls it, and so does everything it calls. The C functions need none: they
-- convert nothing to text (and a SET clause would cost a GUC save/restore per row).
-- tests/server/test_pinned_settings.py checks the catalog and replays every mechanism under hostile
-- settings.
------------------------------------------------------------------------------------------

DO $$
DECLARE
    -- Every setting any role may change (a SET clause of a superuser-only setting would fail
    -- for analysts) that alters a value's text form, its parsing or the shape of a plan;
    -- search_path is pinned per function (its own rule).
    pinned text[][] := ARRAY[
        ['extra_float_digits', '3'],                -- float8 -> text: shortest exact round trip
        ['lc_numeric', 'C'],                        -- to_char / money formatting
        ['DateStyle', 'ISO, YMD'],
        ['IntervalStyle', 'postgres'],
        ['bytea_output', 'hex'],
        ['standard_conforming_strings', 'on'],      -- how format(%L) output is parsed back
        ['array_nulls', 'on'],                      -- '{NULL}' is a NULL element
        ['transform_null_equals', 'off'],
        ['plpgsql.extra_errors', 'none'],
        ['debug_parallel_query', 'off'],            -- epochs scan in one process unless opted in
        ['force_parallel_mode', 'off']];            -- its PostgreSQL 15 name
    i int;
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure
               FROM pg_catalog.pg_proc p
               JOIN pg_catalog.pg_language l ON l.oid = p.prolang
              WHERE p.pronamespace IN ('dpsql'::regnamespace, 'dpsql_internal'::regnamespace)
                AND p.prokind IN ('f', 'p')
                AND l.lanname IN ('sql', 'plpgsql')
    LOOP
        FOR i IN 1..array_length(pinned, 1) LOOP
            -- a server has one of debug_parallel_query (16+) and force_parallel_mode (15)
            CONTINUE WHEN pinned[i][1] NOT LIKE '%.%'
                      AND pg_catalog.current_setting(pinned[i][1], true) IS NULL;
            EXECUTE format('ALTER FUNCTION %s SET %s = %L', f, pinned[i][1], pinned[i][2]);
        END LOOP;
    END LOOP;
END $$;
------------------------------------------------------------------------------------------
-- Privileges (runs last: covers every object created above). Least privilege, DESIGN.md §3:
-- PUBLIC gets nothing; dpsql_analyst gets the entry points only; dpsql_admin (data owners)
-- gets those plus dataset registration and grants. No role but the extension owner reads the
-- tables (raw states, training tables, ledger) or runs the non-private aggregate.
------------------------------------------------------------------------------------------

REVOKE ALL ON ALL TABLES IN SCHEMA dpsql, dpsql_internal, dpsql_work FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA dpsql, dpsql_work FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA dpsql, dpsql_internal FROM PUBLIC;  -- aggregates included
-- From scratch on every install and upgrade: a grant that a release withdraws goes away.
REVOKE ALL ON ALL TABLES IN SCHEMA dpsql, dpsql_internal, dpsql_work FROM dpsql_analyst, dpsql_admin;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA dpsql, dpsql_internal FROM dpsql_analyst, dpsql_admin;
REVOKE ALL ON SCHEMA dpsql, dpsql_internal, dpsql_work FROM PUBLIC;

-- dpsql_internal: the granted helpers below are called by the entry points as the caller.
GRANT USAGE ON SCHEMA dpsql, dpsql_internal TO dpsql_analyst, dpsql_admin;

-- EXECUTE by function name (every overload), so that signature changes need no edit here.
DO $$
DECLARE
    -- The analyst entry points, and the SECURITY INVOKER helpers that evaluate/predict call.
    analyst text[] := ARRAY[
        'train', 'predict', 'evaluate', 'loss_constants',
        '_source_sql', '_source_regclass', '_feature_sql', '_label_sql', '_bad_label',
        '_check_labels', '_canonical_model',
        '_loss_code', '_predict',
        '_fail', '_model', '_apply_bounds', '_is_positive', '_preprocess', '_jsonb_weights',
        '_is_admin', '_can_use_dataset',  -- called by train and by the views
        'confint', 'zcdp_rho', 'zcdp_epsilon', 'mechanisms',
        'budget_report'];  -- SECURITY DEFINER; shows what dpsql.budgets shows
    -- Entry points created by later releases' files; granted when present.
    analyst_optional text[] := ARRAY['_train_private', 'bolton_sensitivity'];
    -- Data owners: registration (the INVOKER wrapper calls the DEFINER _register_dataset).
    -- and the non-private run machinery: data owners train noiseless models as themselves
    -- (SECURITY INVOKER, reading only what they can read).
    admin text[] := ARRAY['register_dataset', '_register_dataset', 'grant_dataset', 'audit',
                          'revoke_dataset', 'estimate_bounds', 'estimate_label_bound',
                          '_prepare', '_check_run_settings', '_fill_training_table',
                          '_run_epoch', '_finish', '_abort', '_locked_run',
                          'sgd_epoch', '_sgd_init', '_sgd_info', '_sgd_weights', '_shuffle_key',
                          '_random_seed', '_flag',
                          -- Citus sources (32_distributed.sql)
                          '_refuse_on_worker', '_citus_installed',
                          '_citus_layout', '_reads_citus', '_fill_distributed_table', '_runs_no_code'];
    -- Not granted to anyone: an aggregate runs its support functions with its owner's rights,
    -- so data owners need sgd_epoch only; EXECUTE on _sgd_transition / _sgd_final would let
    -- them build aggregates of their own around those functions with forged states.
    missing text;
    f record;
BEGIN
    SELECT string_agg(w, ', ') INTO missing
      FROM unnest(analyst || admin) w
     WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p
                        WHERE p.pronamespace IN ('dpsql'::regnamespace, 'dpsql_internal'::regnamespace)
                          AND p.proname = w);
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'dpsql install: functions to grant do not exist: %', missing;
    END IF;
    FOR f IN SELECT p.oid::regprocedure AS sig, p.proname = ANY (admin) AS admin_only
               FROM pg_catalog.pg_proc p
              WHERE p.pronamespace IN ('dpsql'::regnamespace, 'dpsql_internal'::regnamespace)
                AND p.proname = ANY (analyst || analyst_optional || admin)
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', f.sig,
                       CASE WHEN f.admin_only THEN 'dpsql_admin'
                            ELSE 'dpsql_analyst, dpsql_admin' END);
    END LOOP;
END $$;

GRANT SELECT ON dpsql.ledger, dpsql.budgets, dpsql.my_datasets TO dpsql_analyst, dpsql_admin;
-- Audits (52_audit.sql) are the data owners': their canaries and counts describe the data.
GRANT SELECT ON dpsql.audits TO dpsql_admin;
-- Data owners may list who was granted what (metadata only).
GRANT SELECT ON dpsql.dataset_grants TO dpsql_admin;

-- dpsql.models is readable only as the row-filtered view over dpsql.model_store; never as a
-- table (a table named models would hold every model, noiseless ones included).
DO $$
BEGIN
    IF (SELECT c.relkind FROM pg_catalog.pg_class c
         WHERE c.oid = pg_catalog.to_regclass('dpsql.models')) = 'v' THEN
        GRANT SELECT ON dpsql.models TO dpsql_analyst, dpsql_admin;
    END IF;
END $$;

-- Data owners' non-private runs (dpsql.train with privacy => 'none' runs as the caller). A
-- private run's noiseless state lives in dpsql.runs only inside its own transaction, and row
-- security limits a data owner to the runs and models of their own non-private training
-- (the extension owner, who runs every private release, bypasses it): a data owner can
-- neither read another role's run nor forge a release.
GRANT SELECT, INSERT, UPDATE, DELETE ON dpsql.runs TO dpsql_admin;
GRANT SELECT, INSERT ON dpsql.model_store TO dpsql_admin;
ALTER TABLE dpsql.runs ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS own_runs ON dpsql.runs;
CREATE POLICY own_runs ON dpsql.runs
    USING (created_by = current_user) WITH CHECK (created_by = current_user);
ALTER TABLE dpsql.model_store ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS read_models ON dpsql.model_store;
CREATE POLICY read_models ON dpsql.model_store FOR SELECT USING (true);
DROP POLICY IF EXISTS store_own_noiseless_models ON dpsql.model_store;
CREATE POLICY store_own_noiseless_models ON dpsql.model_store FOR INSERT
    WITH CHECK (created_by = current_user AND privacy = 'none' AND dataset_id IS NULL
                AND epsilon IS NULL AND delta IS NULL AND sensitivity IS NULL
                AND noise_scale IS NULL
                AND coalesce(params->'privacy', 'null') = 'null');
GRANT USAGE ON ALL SEQUENCES IN SCHEMA dpsql TO dpsql_admin;
GRANT USAGE, CREATE ON SCHEMA dpsql_work TO dpsql_admin;

-- dpsql_reader reads the registered columns of live datasets (registration grants them; this
-- covers datasets registered before 0.3.0, when the extension owner read them).
DO $$
DECLARE
    ds record;
BEGIN
    FOR ds IN SELECT d.relid, d.features || d.label AS columns FROM dpsql.datasets d
               WHERE d.dropped_at IS NULL LOOP
        PERFORM dpsql_internal._grant_reader(ds.relid, ds.columns);
    END LOOP;
END $$;
