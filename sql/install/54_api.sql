------------------------------------------------------------------------------------------
-- Analyst API
------------------------------------------------------------------------------------------

-- The parameters of a private release as dpsql.train and dpsql.preview pass them on. This
-- function, the signatures of dpsql.train (below) and dpsql.preview (57_preview.sql), the
-- argument lists that call it and _given_params (31_mechanisms.sql) are generated from one
-- list, sql/mechanisms/parameters.toml's arguments (`make generate`).
-- BEGIN GENERATED: _private_params (make generate; sql/mechanisms/parameters.toml)
CREATE OR REPLACE FUNCTION dpsql_internal._private_params(
    features text[],
    label text,
    epochs int,
    batch_size bigint,
    lambda float8,
    step_size float8,
    schedule text,
    radius float8,
    shuffle boolean,
    seed bigint,
    privacy text,
    labels float8[],
    intercept boolean,
    row_norm text,
    huber_h float8,
    step_offset float8,
    tolerance float8,
    parallel_workers int,
    epsilon float8,
    delta float8,
    gaussian text,
    permutation text,
    paper_minibatch_formula boolean,
    noise_seed bigint,
    tuning_lambdas float8[],
    tuning_epochs int[],
    clip_norm float8,
    sampling text,
    noise_multiplier float8,
    bst14_noise text,
    steps int,
    ci text,
    ci_draws int,
    burn_in int,
    options jsonb,
    shard_parallel boolean)
RETURNS jsonb LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp  -- (called in the caller's session: no operator of theirs)
AS $$
    SELECT jsonb_build_object(
        'features', features,
        'label', label,
        'epochs', epochs,
        'batch_size', batch_size,
        'lambda', lambda,
        'step_size', step_size,
        'schedule', schedule,
        'radius', radius,
        'shuffle', shuffle,
        'seed', seed,
        'privacy', privacy,
        'labels', labels,
        'intercept', intercept,
        'row_norm', nullif(row_norm, 'none'),
        'huber_h', huber_h,
        'step_offset', step_offset,
        'tolerance', tolerance,
        'parallel_workers', parallel_workers,
        'epsilon', epsilon,
        'delta', delta,
        'gaussian', gaussian,
        'permutation', permutation,
        'paper_minibatch_formula', paper_minibatch_formula,
        'noise_seed', noise_seed,
        'tuning_lambdas', tuning_lambdas,
        'tuning_epochs', tuning_epochs,
        'clip_norm', clip_norm,
        'sampling', sampling,
        'noise_multiplier', noise_multiplier,
        'bst14_noise', bst14_noise,
        'steps', steps,
        'ci', ci,
        'ci_draws', ci_draws,
        'burn_in', burn_in,
        'options', options,
        'shard_parallel', shard_parallel)
$$;
-- END GENERATED: _private_params

-- BEGIN GENERATED: train signature (make generate; sql/mechanisms/parameters.toml)
-- (0.8.0: validation added)
DROP FUNCTION IF EXISTS dpsql.train(
    text, text[], text, text, int, bigint, float8, float8, text, float8, boolean, bigint, text,
    float8[], boolean, text, float8, float8, float8, int, float8, float8, text, text, boolean,
    bigint, float8[], int[], float8, text, float8, text, int, text, int, int, jsonb, boolean);
CREATE OR REPLACE FUNCTION dpsql.train(
    source text,
    features text[],
    label text,
    model text DEFAULT 'logistic',
    epochs int DEFAULT NULL,
    batch_size bigint DEFAULT NULL,
    lambda float8 DEFAULT 0,
    step_size float8 DEFAULT NULL,
    schedule text DEFAULT NULL,
    radius float8 DEFAULT NULL,
    shuffle boolean DEFAULT true,
    seed bigint DEFAULT NULL,
    privacy text DEFAULT 'none',
    labels float8[] DEFAULT NULL,
    intercept boolean DEFAULT NULL,
    row_norm text DEFAULT 'none',
    huber_h float8 DEFAULT 0.1,
    step_offset float8 DEFAULT 0,
    tolerance float8 DEFAULT NULL,
    parallel_workers int DEFAULT 0,
    epsilon float8 DEFAULT NULL,
    delta float8 DEFAULT NULL,
    gaussian text DEFAULT 'analytic',
    permutation text DEFAULT 'once',
    paper_minibatch_formula boolean DEFAULT false,
    noise_seed bigint DEFAULT NULL,
    tuning_lambdas float8[] DEFAULT NULL,
    tuning_epochs int[] DEFAULT NULL,
    clip_norm float8 DEFAULT NULL,
    sampling text DEFAULT 'shuffle',
    noise_multiplier float8 DEFAULT NULL,
    bst14_noise text DEFAULT 'strict',
    steps int DEFAULT NULL,
    ci text DEFAULT NULL,
    ci_draws int DEFAULT NULL,
    burn_in int DEFAULT NULL,
    options jsonb DEFAULT NULL,
    shard_parallel boolean DEFAULT false,
    validation text DEFAULT NULL)
-- END GENERATED: train signature
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    run bigint;
    e record;
    -- every argument but source, model and validation, as the private path takes them
    params jsonb := dpsql_internal._private_params(
        -- BEGIN GENERATED: _private_params arguments (make generate; sql/mechanisms/parameters.toml)
        features, label, epochs, batch_size, lambda, step_size, schedule, radius, shuffle, seed,
        privacy, labels, intercept, row_norm, huber_h, step_offset, tolerance, parallel_workers,
        epsilon, delta, gaussian, permutation, paper_minibatch_formula, noise_seed, tuning_lambdas,
        tuning_epochs, clip_norm, sampling, noise_multiplier, bst14_noise, steps, ci, ci_draws,
        burn_in, options, shard_parallel
        -- END GENERATED: _private_params arguments
    );
BEGIN
    -- (the caller's search_path is in force here: an operator of theirs, or of a data owner's
    -- on it, must not decide; the private path pins its own)
    IF validation IS NOT NULL THEN  -- auto's choice made by private selection (63_tune.sql)
        RETURN dpsql_internal._train_validated(source, model, validation, params);
    END IF;
    IF NOT coalesce(pg_catalog.texteq(privacy, 'none'), false) THEN
        -- Registered datasets only, with their owner's columns, labels and bounds (features
        -- and label may be NULL, or must match the registration).
        RETURN dpsql_internal._train_private(source, model, params);
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
    run := (dpsql_internal._prepare(source, features, label, model, epochs, batch_size, lambda, step_size,
                           coalesce(schedule, 'constant'), step_offset, radius, shuffle, seed,
                           labels, coalesce(intercept, true),  -- scikit-learn's fit_intercept
                           row_norm, huber_h, tolerance, parallel_workers,
                           permutation => permutation, shard_parallel => shard_parallel)).run_id;
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

-- x scaled to norm <= r (r NULL: x). A released model's clip_radius (issue 25): the rows a
-- mechanism clipped to the registered row bound, scored as they were trained (models.py does
-- the same).
CREATE OR REPLACE FUNCTION dpsql_internal._clip_norm(x float8[], r float8)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_clip_norm_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

-- A row, feature bounds already applied, as a model with a recorded preprocessing sees it:
-- clipped to its clip_radius, its row transform, minus its centre. One place for predict and
-- evaluate: an expression over the SQL expression x with the preprocessing's numbers as
-- literals, so that evaluate's scan calls C functions only (a SQL function has pinned
-- settings, 85_pinned_settings.sql: it is never inlined, and would parse pre for every row).
CREATE OR REPLACE FUNCTION dpsql_internal._preprocessed_sql(x text, pre jsonb)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT format('dpsql_internal._preprocess(dpsql_internal._clip_norm(%s, %L::float8), NULL, %L::int,'
                  ' %L::float8[])', x, pre->>'clip_radius', pre->>'row_flags',
                  dpsql_internal._jsonb_weights(pre->'centre'))
$$;

-- The same for one row (predict).
CREATE OR REPLACE FUNCTION dpsql_internal._preprocessed(x float8[], pre jsonb)
RETURNS float8[] LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    out float8[];
BEGIN
    EXECUTE 'SELECT ' || dpsql_internal._preprocessed_sql('$1', pre) INTO out USING x;
    RETURN out;
END $$;

-- Probability of the positive class (logistic), score (huber, linear) or class (multinomial).
CREATE OR REPLACE FUNCTION dpsql.predict(model_id bigint, x float8[])
RETURNS float8 LANGUAGE plpgsql STABLE AS $$
DECLARE
    m dpsql.models := dpsql_internal._model(model_id);
    bounds float8[] := dpsql_internal._jsonb_weights(nullif(m.params->'feature_bounds', 'null'));
    pre jsonb := nullif(m.params->'privacy'->'preprocessing', 'null');
    bounded float8[];
    p float8;
BEGIN
    IF x IS NULL THEN
        RETURN NULL;
    END IF;
    IF array_ndims(x) IS DISTINCT FROM 1 OR cardinality(x) <> m.n_features
       OR array_position(x, NULL) IS NOT NULL THEN
        PERFORM dpsql_internal._fail(
            format('model %s takes %s features, got %s', model_id, m.n_features,
                   CASE WHEN array_position(x, NULL) IS NOT NULL THEN 'a NULL among them'
                        ELSE format('a vector of length %s', coalesce(cardinality(x), 0)) END),
            '22023',
            hint => format('Give the %s features %s in order (encoded: a categorical column one-hot), '
                           'or the row by its columns: dpsql.predict_row(%s, to_jsonb(t)).',
                           m.n_features, m.features, model_id));
    END IF;
    bounded := CASE WHEN bounds IS NULL THEN x ELSE dpsql_internal._apply_bounds(x, bounds) END;
    p := dpsql_internal._predict(dpsql_internal._loss_code(m.model), m.flags, m.weights,
                                 CASE WHEN pre IS NULL THEN bounded
                                      ELSE dpsql_internal._preprocessed(bounded, pre) END);
    IF array_ndims(m.weights) = 2 THEN  -- multinomial or one-vs-rest: a class index
        RETURN m.classes[p::int + 1];
    END IF;
    RETURN p;
END $$;

-- A model's text label values (a dataset registered with a text label), else NULL.
CREATE OR REPLACE FUNCTION dpsql_internal._model_label_values(m dpsql.models)
RETURNS text[] LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(m.params->'label_values') = 'array'
                THEN ARRAY(SELECT jsonb_array_elements_text(m.params->'label_values')) END
$$;

-- A row given as a JSON object of its columns (to_jsonb(t) of a table row), encoded as the
-- model's features: numbers, booleans as 0/1, categorical columns one-hot (a value not among
-- the public categories, or NULL, is all zeros).
CREATE OR REPLACE FUNCTION dpsql_internal._encode_row(m dpsql.models, r jsonb)
RETURNS float8[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    cats jsonb := nullif(m.params->'categories', 'null');
    f text;
    v jsonb;
    x float8[] := '{}';
BEGIN
    IF jsonb_typeof(r) IS DISTINCT FROM 'object' THEN
        PERFORM dpsql_internal._fail('predict takes a row as a JSON object of its columns',
                                     '22023', 'e.g. dpsql.predict(model_id, to_jsonb(t)) FROM test_table t');
    END IF;
    FOREACH f IN ARRAY m.features LOOP
        IF NOT r ? f THEN
            PERFORM dpsql_internal._fail(format('the row has no column %s', quote_ident(f)), '22023',
                                         format('Model %s reads features %s.', m.model_id, m.features));
        END IF;
        v := r->f;
        IF cats ? f THEN
            x := x || dpsql_internal._one_hot(array_position(dpsql_internal._category_values(cats, f), v #>> '{}'),
                                              jsonb_array_length(cats->f));
        ELSIF jsonb_typeof(v) = 'boolean' THEN
            x := x || (v::boolean)::int::float8;
        ELSIF jsonb_typeof(v) = 'array' AND cardinality(m.features) = 1 THEN
            x := x || ARRAY(SELECT e::float8 FROM jsonb_array_elements_text(v) e);
        ELSIF jsonb_typeof(v) = 'number' THEN
            x := x || (v #>> '{}')::float8;
        ELSE
            PERFORM dpsql_internal._fail(format('column %s of the row is %s, not a number', quote_ident(f),
                                                jsonb_typeof(v)), '22023');
        END IF;
    END LOOP;
    RETURN x;
END $$;

-- The prediction for a row given by its columns (see _encode_row). (Its own name: an
-- overload of predict would make predict(m, '{...}') ambiguous.)
CREATE OR REPLACE FUNCTION dpsql.predict_row(model_id bigint, r jsonb)
RETURNS float8 LANGUAGE sql STABLE AS $$
    SELECT dpsql.predict(model_id, dpsql_internal._encode_row(dpsql_internal._model(model_id), r))
$$;
COMMENT ON FUNCTION dpsql.predict_row(bigint, jsonb) IS
    'Prediction for a row given as a JSON object of its columns: SELECT dpsql.predict_row(m, to_jsonb(t)) FROM t';

-- The predicted class of a classification model as its label value (text: a text label's
-- value, else the number), for a row's columns.
CREATE OR REPLACE FUNCTION dpsql_internal._predict_label(model_id bigint, x float8[])
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    m dpsql.models := dpsql_internal._model(model_id);
    p float8 := dpsql.predict(model_id, x);
    cls float8;
BEGIN
    IF m.classes IS NULL THEN
        PERFORM dpsql_internal._fail(format('model %s is a regression model: it predicts numbers', model_id),
                                     '22023', 'Use dpsql.predict.');
    END IF;
    cls := CASE WHEN array_ndims(m.weights) = 2 THEN p
                WHEN dpsql_internal._is_positive(dpsql_internal._loss_code(m.model), p) THEN m.classes[2]
                ELSE m.classes[1] END;
    RETURN coalesce((dpsql_internal._model_label_values(m))[cls::int + 1], cls::text);
END $$;

CREATE OR REPLACE FUNCTION dpsql.predict_label(model_id bigint, r jsonb)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT dpsql_internal._predict_label(model_id, dpsql_internal._encode_row(dpsql_internal._model(model_id), r))
$$;
COMMENT ON FUNCTION dpsql.predict_label(bigint, jsonb) IS
    'Predicted class as its label value, for a row given as a JSON object of its columns';

-- A model's metrics over a table or query: accuracy (classification) or mean squared error
-- (linear) as metric and value, the same metric of the baseline predictor (majority class,
-- or mean) on the same rows, and every standard metric with its baseline in metrics
-- (58_metrics.sql). rows counts the rows read.
-- With epsilon (and delta), source names a registered dataset and the metrics are private:
-- noisy statistics charged to that dataset (61_private_evaluate.sql), for analysts who cannot
-- read its rows. Without, the rows are read with the caller's rights (a table they can read);
-- epsilon on a plain table is refused (a private evaluation is charged to a dataset's budget).
-- (0.x before issue 44 had no epsilon, delta, noise_seed: that signature goes, no overload stays)
DROP FUNCTION IF EXISTS dpsql.evaluate(bigint, text, text[], text);
CREATE OR REPLACE FUNCTION dpsql.evaluate(model_id bigint, source text, features text[] DEFAULT NULL,
                               label text DEFAULT NULL, epsilon float8 DEFAULT NULL,
                               delta float8 DEFAULT NULL, noise_seed bigint DEFAULT NULL,
                               OUT metric text, OUT value float8, OUT rows bigint,
                               OUT baseline float8, OUT metrics jsonb)
LANGUAGE plpgsql
SET max_parallel_workers_per_gather = 0
AS $$
DECLARE
    m dpsql.models;
    src text;
    feat record;
    yexpr text;
    pexpr text;
    pairs text;
BEGIN
    IF epsilon IS NOT NULL OR delta IS NOT NULL OR noise_seed IS NOT NULL THEN
        -- (no operator here: the caller's search_path is in force, and an operator of a data
        -- owner's on it would run as the caller; the private path pins its own)
        SELECT * INTO metric, value, rows, baseline, metrics
          FROM dpsql_internal._evaluate_private(model_id, source, features, label, epsilon, delta, noise_seed);
        RETURN;
    END IF;
    m := dpsql_internal._model(model_id);
    -- The rows are read with the caller's rights: a table the caller can read. A registered
    -- dataset's rows are read only privately (with epsilon), never noiselessly for an analyst.
    BEGIN
        src := dpsql_internal._source_sql(source);
        -- The same public feature bounds as in training (registered datasets).
        feat := dpsql_internal._feature_sql(src, coalesce(features, m.features),
                                   dpsql_internal._jsonb_weights(nullif(m.params->'feature_bounds', 'null')),
                                   categories => nullif(m.params->'categories', 'null'));
    EXCEPTION WHEN insufficient_privilege OR undefined_table THEN
        IF dpsql_internal._names_usable_dataset(source) THEN
            PERFORM dpsql_internal._fail(
                format('%s is a registered dataset: without epsilon evaluate reads only a table or query '
                       '%s can read itself; a dataset is evaluated privately, with epsilon',
                       quote_literal(source), session_user), '42501',
                format('dpsql.evaluate(%s, %L, epsilon => 0.1) returns noisy metrics charged to its budget '
                       '(dpsql.preview_evaluate says what it costs).', model_id, source));
        ELSIF pg_catalog.texteq(SQLSTATE, '42501') THEN
            PERFORM dpsql_internal._fail(format('evaluate reads the rows of %s as %s, who may not: %s',
                                                source, current_user, SQLERRM), '42501',
                'dpsql.evaluate without epsilon needs SELECT on the test rows (GRANT SELECT ON ... TO the '
                'role); on a registered dataset, give epsilon for a private evaluation.');
        END IF;
        RAISE;
    END;
    IF feat.dim <> m.n_features THEN
        PERFORM dpsql_internal._fail(format('model %s has %s features, the source gives %s',
                                   model_id, m.n_features, feat.dim));
    END IF;
    -- A recorded preprocessing (DPSGD-F, the private-ERM fits with an intercept): the row
    -- transform alone, then the intercept's 1 (the model's flags then have no row transform).
    IF m.params->'privacy'->'preprocessing' <> 'null' THEN
        feat.expr := dpsql_internal._preprocessed_sql(feat.expr, m.params->'privacy'->'preprocessing');
    END IF;
    yexpr := dpsql_internal._label_sql(m.model, coalesce(label, m.label), m.classes,
                                       label_values => dpsql_internal._model_label_values(m));
    pexpr := format('dpsql_internal._predict(%s, %s, %L::float8[], %s)',
                    dpsql_internal._loss_code(m.model), m.flags, m.weights, feat.expr);
    pairs := format('SELECT %s AS p, %s AS y FROM %s', pexpr, yexpr, src);
    EXECUTE format('SELECT count(*) FROM %s', src) INTO rows;
    IF m.model = 'linear' THEN
        metric := 'mse';
        metrics := dpsql_internal._regression_metrics(pairs);
    ELSIF array_ndims(m.weights) = 2 THEN
        metric := 'accuracy';
        metrics := dpsql_internal._multiclass_metrics(pairs);
    ELSE
        metric := 'accuracy';
        metrics := dpsql_internal._binary_metrics(pairs, dpsql_internal._loss_code(m.model));
    END IF;
    value := (metrics->>metric)::float8;
    baseline := (metrics->'baseline'->>metric)::float8;
    IF (metric = 'mse' AND value >= baseline) OR (metric = 'accuracy' AND value <= baseline) THEN
        RAISE WARNING 'dpsql: model % is no better than predicting the % on these rows (% %, baseline %)',
                      model_id, metrics->'baseline'->>'predictor', metric, round(value::numeric, 4),
                      round(baseline::numeric, 4)
            USING HINT = 'Look at dpsql.preview''s warnings: more epsilon, feature bounds, or '
                         'another mechanism (privacy => ''auto'').';
    END IF;
END $$;
