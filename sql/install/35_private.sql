------------------------------------------------------------------------------------------
-- Private training: bolt-on output perturbation (Wu et al. 2017, "Bolt-on differential privacy for
-- scalable SGD-based analytics", SIGMOD 2017), released by the server
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
    ovr record := dpsql_internal._one_vs_rest(model, coalesce(jsonb_array_length(spec->'classes'), 1),
                                              epsilon, delta);
    schedule text := spec->>'schedule';
BEGIN
    IF lambda > 0 AND radius = 0 THEN
        PERFORM dpsql_internal._fail('a strongly convex bolt-on run (lambda > 0) needs the ball ||w|| <= radius',
                            hint => 'Leave radius unset with schedule => ''decreasing'' (R = 1/lambda), or give one.');
    END IF;
    c := dpsql.loss_constants(model, lambda, radius, dpsql_internal._huber_h(spec));
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
    -- One-vs-rest: C binary models, each on all the data: split the budget evenly (Wu et al. 2017,
    -- §4.3).
    per_output := ovr.models > 1;
    model_epsilon := ovr.model_epsilon;
    model_delta := ovr.model_delta;
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
    norms record;
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
    norms := dpsql_internal._bolton_noise_norms(r.spec, cardinality(weights), mech.per_output, delta,
                                                rel.noise_scale);
    info := jsonb_build_object(
        'mechanism', 'bolton', 'algorithm', mech.algorithm, 'epsilon', epsilon, 'delta', delta,
        'sensitivity', mech.sensitivity, 'noise_scale', rel.noise_scale,
        'lipschitz', mech.lipschitz,
        'noise', CASE WHEN delta = 0 THEN 'gamma-norm (eq. 3), uniform direction'
                      ELSE 'gaussian (' || calibration || ')' END,
        'expected_noise_norm', norms.expected, 'reachable_norm', norms.reachable,
        'one_vs_rest', mech.per_output, 'model_epsilon', mech.model_epsilon,
        'model_delta', mech.model_delta, 'neighbouring', 'replace-one, m public',
        'noise_seed', dpsql_internal._noise_source(noise_seed));
END $$;

-- Public: one noise draw's expected norm (Gamma(k, scale) has mean k scale; a Gaussian
-- vector about sigma sqrt(k)) against the largest norm a regularised model reaches,
-- lambda/2 ||w||^2 <= F(0) = phi(0) (NULL without lambda).
CREATE OR REPLACE FUNCTION dpsql_internal._bolton_noise_norms(spec jsonb, weights int, per_output boolean,
                                                             delta float8, noise_scale float8,
                                                             OUT expected float8, OUT reachable float8)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    lambda float8 := (spec->>'lambda')::float8;
    outputs int := CASE WHEN per_output THEN jsonb_array_length(spec->'classes') ELSE 1 END;
    draw int := weights / outputs;
BEGIN
    expected := CASE WHEN delta = 0 THEN draw * noise_scale ELSE noise_scale * sqrt(draw) END;
    IF lambda > 0 THEN
        reachable := sqrt(2 * CASE spec->>'model' WHEN 'logistic' THEN ln(2)
                                   WHEN 'multinomial' THEN ln(jsonb_array_length(spec->'classes'))
                                   ELSE 1 END / lambda);
        reachable := least(reachable, coalesce((spec->>'radius')::float8, reachable));
    END IF;
END $$;

-- Before the charge (public quantities only): the bolt-on's noise size for a prepared run
-- with its initial state, and a warning when it exceeds what the model can reach. Returns the
-- norms for a preview.
CREATE OR REPLACE FUNCTION dpsql_internal._bolton_noise_check(r dpsql.runs, epsilon float8, delta float8,
                                                             calibration text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    mech record := dpsql_internal._bolton_mechanism(r.spec, r.rows, epsilon, delta, calibration);
    -- the noise scale of a release of the initial state (weights discarded: a fixed seed)
    scale float8 := (dpsql_internal._bolton_release(
                         r.state, dpsql_internal._audit_sensitivity(r.spec, r.rows, mech.sensitivity),
                         mech.model_epsilon, mech.model_delta, mech.per_output, calibration, 1)).noise_scale;
    k int := ((r.spec->>'dim')::int + CASE WHEN (r.spec->>'intercept')::boolean THEN 1 ELSE 0 END)
             * CASE WHEN mech.per_output THEN jsonb_array_length(r.spec->'classes') ELSE 1 END;
    norms record := dpsql_internal._bolton_noise_norms(r.spec, k, mech.per_output, delta, scale);
BEGIN
    IF norms.expected > norms.reachable THEN
        PERFORM dpsql_internal._warn(
            format('the bolt-on noise (expected norm %s) exceeds the largest norm a model with lambda = %s '
                   'reaches (%s): the release would be mostly noise', round(norms.expected::numeric, 3),
                   r.spec->>'lambda', round(norms.reachable::numeric, 3)),
            'The noise falls as 1/lambda and the reachable norm as 1/sqrt(lambda): '
            'raise lambda or epsilon, or use privacy => ''auto''.');
    END IF;
    RETURN jsonb_build_object('sensitivity', mech.sensitivity, 'noise_scale', scale,
                              'expected_noise_norm', norms.expected, 'reachable_norm', norms.reachable,
                              'algorithm', mech.algorithm, 'one_vs_rest', mech.per_output);
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

-- A private run prepared from a registered dataset (_prepare, deferred: its row, not stored,
-- its table empty): the data owner's source, columns, labels, bounds and row normalisation;
-- the analyst's numbers from params.
-- The data is read as float8 columns (or one float8[]) of the registered dimension: nothing is
-- probed. A view, foreign table or inheritance tree is read through dpsql_internal._read_source (as
-- dpsql_reader, never as a superuser); a plain table or materialized view directly.
CREATE OR REPLACE FUNCTION dpsql_internal._prepare_private(ds dpsql.datasets, model text, params jsonb)
RETURNS dpsql.runs LANGUAGE plpgsql AS $$
DECLARE
    types text[] := dpsql_internal._feature_types(ds);
    prepared dpsql.runs;
BEGIN
    IF ds.dim IS NULL THEN
        PERFORM dpsql_internal._fail(format('dataset %s was registered without a known dimension', ds.name),
                            hint => 'Register it again with dim => the length of its feature array.');
    END IF;
    -- No row is read before the charge: the run's table is created empty, its row count the
    -- public one, and the controller reads the rows after charging (_read_rows).
    prepared := dpsql_internal._prepare(
        source => 'SELECT * FROM ' || dpsql_internal._private_from(ds), deferred => true,
        public_rows => (params->>'public_rows')::bigint,
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
        intercept => (params->>'intercept')::boolean,
        row_norm => ds.row_norm, huber_h => dpsql_internal._huber_h(params),
        tolerance => NULL, parallel_workers => coalesce((params->>'parallel_workers')::int, 0),
        private => true, feature_bounds => ds.feature_bounds,
        permutation => coalesce(params->>'permutation', 'once'),
        shard_parallel => coalesce((params->>'shard_parallel')::boolean, false), relation => ds.relid,
        categories => ds.categories, label_values => ds.label_values);
    PERFORM dpsql_internal._preview_note('run', prepared.spec - 'source' - 'seed' - 'seed_policy'
                                                || jsonb_build_object('rows', prepared.rows));
    RETURN prepared;
END $$;

-- The privacy entry point behind dpsql.train: runs as the extension owner on a registered
-- dataset only, with the data owner's columns, labels and bounds. Analysts pass numbers and
-- names from fixed lists, never SQL. One straight pass (docs/architecture.md), each step a
-- function of its own, called once:
--   resolve  auto's choice of a mechanism, from public quantities (_release_resolve);
--   validate every parameter the caller set against the mechanism's spec, the dataset, the
--            grant and the registered columns (_release_validate);
--   default  what was left NULL, from public quantities: delta and the intercept (the spec),
--            the SGD family's hyperparameters (_release_defaults, 34_defaults.sql);
--   plan     the mechanism's train function: the run prepared from the public row count,
--            its typed plan, what it is charged (a dpsql_internal.release_plan);
-- (_train_plan: dpsql.preview stops here, with the plan's charge) then
--   charge   durably, before any row is read (28_ledger.sql);
--   complete the function the plan names: read, fit, finish; then the model records what was
--            chosen for the caller.
-- With tuning grids the bolt-on is Algorithm 3 (private tuning, Wu et al. 2017, §4.1).
-- Runs inside dpsql_internal._train_private (below), with its rights.
CREATE OR REPLACE FUNCTION dpsql_internal._train_release(source text, model text, params jsonb)
RETURNS bigint LANGUAGE plpgsql
AS $$
DECLARE
    p dpsql_internal.release_plan := dpsql_internal._train_plan(source, model, params);
    entry bigint;
    mid bigint;
BEGIN
    entry := dpsql_internal._charge((p.charge).dataset_id, (p.charge).epsilon, (p.charge).delta,
                                    (p.charge).mechanism, note => (p.charge).note,
                                    dp_event => (p.charge).dp_event, plan => (p.charge).plan,
                                    unit_level => (p.charge).unit_level);
    EXECUTE format('SELECT dpsql_internal.%I($1, $2)', p.complete) INTO mid USING p, entry;
    PERFORM dpsql_internal._record_unit(p.ds, mid);
    IF p.recorded <> '{}' THEN
        UPDATE dpsql.model_store m
           SET params = jsonb_set(m.params, '{privacy}', (m.params->'privacy') || p.recorded)
         WHERE m.model_id = mid;
    END IF;
    RETURN mid;
END $$;

-- A training release's steps up to its plan (resolve, validate, default, plan): every refusal
-- that needs no row, no charge, no row read. What dpsql.preview shows (57_preview.sql).
CREATE OR REPLACE FUNCTION dpsql_internal._train_plan(source text, model text, params jsonb)
RETURNS dpsql_internal.release_plan LANGUAGE plpgsql
AS $$
DECLARE
    noise_seed bigint := (params->>'noise_seed')::bigint;  -- tests only: makes the noise predictable
    auto jsonb;
    ds dpsql.datasets;
    mech dpsql.mechanism_catalog;
    step record;
    chosen record;
    p dpsql_internal.release_plan;
BEGIN
    PERFORM dpsql_internal._refuse_on_worker();
    step := dpsql_internal._release_resolve(source, model, params);
    params := step.params;
    auto := step.auto;
    ds := step.ds;
    step := dpsql_internal._release_validate(source, model, params, ds);
    ds := step.ds;
    mech := step.mech;
    chosen := dpsql_internal._release_defaults(ds, model, mech, params);
    PERFORM dpsql_internal._preview_note('dataset', to_jsonb(ds.name));
    PERFORM dpsql_internal._preview_note('mechanism', to_jsonb(mech.name));
    PERFORM dpsql_internal._preview_note('model', to_jsonb(dpsql_internal._erm_model(model)));
    PERFORM dpsql_internal._preview_note('defaults', nullif(chosen.filled, '{}'));
    PERFORM dpsql_internal._preview_note('auto', auto->'record');
    EXECUTE format('SELECT * FROM dpsql_internal.%I($1, $2, $3, $4, $5, $6, $7)', mech.train_function)
       INTO p USING ds, model, mech.name, chosen.params, chosen.epsilon, chosen.delta, noise_seed;
    p.recorded := jsonb_strip_nulls(jsonb_build_object('defaults', nullif(chosen.filled, '{}'),
                                                       'auto', auto->'record'));
    RETURN p;
END $$;

-- Resolve: privacy => 'auto' becomes a named mechanism and its parameters (37_auto.sql),
-- chosen from public quantities, with auto's delta when delta is left NULL. ds is the granted
-- dataset when auto read its registration (NULL otherwise). A privacy unit's release is
-- chosen for the row-level epsilon it will be planned at.
CREATE OR REPLACE FUNCTION dpsql_internal._release_resolve(source text, model text, INOUT params jsonb,
                                                          OUT auto jsonb, OUT ds dpsql.datasets)
LANGUAGE plpgsql AS $$
BEGIN
    IF params->>'privacy' IS DISTINCT FROM 'auto' THEN  -- (NULL is refused as unknown: validate)
        RETURN;
    END IF;
    -- The grant is checked first: the choice reads the registration.
    ds := dpsql_internal._granted_dataset(source);
    PERFORM dpsql_internal._check_dataset_model(ds, model, 'auto');
    IF ds.feature_bounds IS NULL AND ds.row_norm IN ('clip', 'unit') THEN
        PERFORM dpsql_internal._warn(
            format('dataset %s declares no feature bounds: every row is scaled to norm <= 1 as it is, '
                   'so features on large scales dominate and the others barely count', ds.name),
            'A data owner can declare feature_bounds (public (lo, hi) per feature) or estimate them '
            '(dpsql.estimate_bounds); the model then sees every feature on [-1, 1].');
    END IF;
    auto := dpsql_internal._auto_choice(
        ds, model, params || jsonb_build_object('delta', coalesce((params->>'delta')::float8,
                                                                  dpsql_internal._auto_delta(ds)))
                   || jsonb_strip_nulls(jsonb_build_object(
                          'epsilon', (dpsql_internal._unit_release_target(
                                          ds, (params->>'epsilon')::float8, 0)).epsilon)));
    IF params->>'delta' IS NULL THEN
        auto := jsonb_set(auto, '{params,delta}', to_jsonb(dpsql_internal._auto_delta(ds)));
        auto := jsonb_set(auto, '{record,delta_default}', auto->'params'->'delta');
    END IF;
    params := params || (auto->'params');
END $$;

-- Validate: every parameter the caller (or auto) set, against the mechanism's spec
-- (_check_params), then the dataset and the grant, the noise seed, the registered columns and
-- the Citus layout. Every refusal comes before anything is charged or read; the budget's
-- comes last, at the charge (issue 41, route 7: a release the budget refuses reads no row,
-- and a bad argument is named as such on an exhausted dataset too).
-- Over 100 lines: the checks in the order their refusals are promised (a bad argument is named
-- as such, on an exhausted dataset too); each is a few lines.
CREATE OR REPLACE FUNCTION dpsql_internal._release_validate(source text, model text, params jsonb,
                                                           INOUT ds dpsql.datasets,
                                                           OUT mech dpsql.mechanism_catalog)
LANGUAGE plpgsql AS $$
DECLARE
    privacy text := params->>'privacy';
    epsilon float8 := (params->>'epsilon')::float8;
    delta float8 := coalesce((params->>'delta')::float8, 0);
    grids record := dpsql_internal._bolton_tuning(params);
    canonical text;
BEGIN
    mech := dpsql_internal._mechanism(privacy);  -- the registry (31_mechanisms.sql); refuses unknown names
    canonical := dpsql_internal._erm_model(model);
    IF canonical IS NULL THEN
        PERFORM dpsql_internal._fail(format('model must be %s, got NULL',
                                            (SELECT string_agg(quote_literal(m), ' or ')
                                               FROM unnest(dpsql_internal._mechanism_models(mech)) m)),
                                     hint => 'model => ''logistic'' (classification) or ''linear'' (regression).');
    END IF;
    IF canonical <> ALL (dpsql_internal._mechanism_models(mech)) THEN
        PERFORM dpsql_internal._fail(
            format('%s trains model => %s, not %s', privacy,
                   (SELECT string_agg(quote_literal(m), ' or ')
                      FROM unnest(dpsql_internal._mechanism_models(mech)) m),
                   quote_literal(model)),
            hint => CASE WHEN canonical = 'linear'
                         THEN 'Least squares has no gradient bound: it needs a linear-regression mechanism.'
                         WHEN mech.task = 'regression'
                         THEN format('%s is a regression mechanism: on a regression dataset pass model => ''linear''.',
                                     privacy) END);
    END IF;
    PERFORM dpsql_internal._check_params(mech, params);  -- what the caller (or auto) set
    IF coalesce((params->>'paper_minibatch_formula')::boolean, false) THEN
        PERFORM dpsql_internal._fail('paper_minibatch_formula is refused for real releases: it underestimates '
                            'the strongly convex mini-batch sensitivity by the batch size (the division by b of Wu et al. 2017, '
                            '§3.2.3, fails with decreasing steps)',
                            hint => 'Use dpsql.bolton_sensitivity(..., paper_minibatch => true) to compare.');
    END IF;
    -- epsilon may be left NULL only where the spec names an alternative (DP-SGD's noise
    -- multiplier, from which epsilon is computed and charged) and the call gives it
    IF (epsilon IS NOT NULL OR params->>(mech.parameters->'epsilon'->>'alternative') IS NULL)
       AND (epsilon IS NULL OR NOT (epsilon > 0 AND epsilon < 'Infinity')) THEN
        PERFORM dpsql_internal._fail(format('epsilon must be a finite number > 0, got %s', coalesce(epsilon::text, 'NULL')),
                                     hint => 'The release''s privacy loss, e.g. 1: it is charged to the dataset''s budget.');
    END IF;
    IF NOT (delta >= 0 AND delta < 1) THEN
        PERFORM dpsql_internal._fail(format('delta must be in [0, 1), got %s', delta),
                                     hint => 'e.g. 1e-5, well below 1 / rows; 0 for pure epsilon-DP.');
    END IF;
    IF params->>'tolerance' IS NOT NULL THEN
        PERFORM dpsql_internal._fail('tolerance is not allowed in private runs: a data-dependent stop would leak',
                            hint => 'The number of epochs is fixed in advance.');
    END IF;
    IF NOT coalesce((params->>'shuffle')::boolean, true) THEN
        PERFORM dpsql_internal._fail('private runs shuffle the data (a data-independent permutation)');
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(grids.lambdas) v WHERE v IS NULL OR NOT (v >= 0 AND v < 'Infinity'))
       OR EXISTS (SELECT 1 FROM unnest(grids.epochs) k WHERE k IS NULL OR k < 1 OR k > 100000)
       OR cardinality(grids.lambdas) * greatest(cardinality(grids.epochs), 1) > 100 THEN
        PERFORM dpsql_internal._fail('tuning grids: lambdas >= 0, epochs from 1 to 100000, at most 100 candidates');
    END IF;
    IF ds.dataset_id IS NULL THEN
        ds := dpsql_internal._granted_dataset(source);
    END IF;
    IF params->>'noise_seed' IS NOT NULL AND NOT dpsql_internal._can_read_rows(ds) THEN
        PERFORM dpsql_internal._noise_seed_refused();
    END IF;
    -- The registered columns' types, now (an owner may have changed them): before any charge.
    PERFORM dpsql_internal._read_list(ds.relid, ds.features || ds.label, dpsql_internal._text_columns(ds));
    PERFORM dpsql_internal._check_distributed(mech, ds, params);
    IF params->'features' <> 'null' AND params->'features' <> to_jsonb(ds.features) THEN
        PERFORM dpsql_internal._fail(format('dataset %s is registered with features %s', ds.name, ds.features),
                            hint => 'Pass NULL (or the registered features): private runs use the registration.');
    END IF;
    IF params->>'label' IS NOT NULL AND params->>'label' <> ds.label THEN
        PERFORM dpsql_internal._fail(format('dataset %s is registered with label %s', ds.name, ds.label));
    END IF;
END $$;

-- Default: what the call left NULL, from public quantities, recorded with the model
-- (params->'privacy'->'defaults', in filled): delta and the intercept from the spec, then the
-- SGD family's hyperparameters (34_defaults.sql). A privacy unit of k rows is planned at row
-- level for the unit-level (epsilon, delta) asked for (64_privacy_units.sql), which the
-- charge then pays: epsilon and delta are that row-level target, and the defaults follow it.
CREATE OR REPLACE FUNCTION dpsql_internal._release_defaults(ds dpsql.datasets, model text,
                                                           mech dpsql.mechanism_catalog, INOUT params jsonb,
                                                           OUT filled jsonb, OUT epsilon float8,
                                                           OUT delta float8)
LANGUAGE plpgsql AS $$
DECLARE
    privacy text := params->>'privacy';
    target record;
    rows bigint;
BEGIN
    filled := '{}';
    params := params - 'public_rows';  -- (set below from the count, never from a caller)
    IF params->>'delta' IS NULL THEN
        filled := jsonb_build_object('delta', mech.delta_default);  -- its spec's
    END IF;
    IF params->>'intercept' IS NULL THEN
        filled := filled || jsonb_build_object('intercept', dpsql_internal._intercept_default(
                                        dpsql_internal._erm_model(model),
                                        dpsql_internal._classifier_intercept(mech, ds)));
    END IF;
    params := params || filled;
    delta := (params->>'delta')::float8;
    PERFORM dpsql_internal._check_dataset_model(ds, model, privacy);
    IF delta > ds.delta_budget THEN
        -- before anything is planned: the user's real mistake, not a budget refusal later
        PERFORM dpsql_internal._fail(
            format('dataset %s has a delta budget of %s, and this release needs delta = %s%s',
                   ds.name, dpsql_internal._round(ds.delta_budget), dpsql_internal._round(delta),
                   CASE WHEN filled ? 'delta' THEN format(' (%s''s default)', privacy) ELSE '' END),
            'DP001',
            hint => CASE WHEN mech.needs_delta
                         THEN format('%s needs delta > 0: use privacy => ''auto'' (which picks an epsilon-DP '
                                     'mechanism here), or ask the data owner for a delta budget.', privacy)
                         ELSE 'Pass delta => 0 (pure epsilon-DP), or ask the data owner for a delta budget.' END
                    || ' Nothing was charged.');
    END IF;
    target := dpsql_internal._unit_release_target(ds, (params->>'epsilon')::float8, delta);
    epsilon := target.epsilon;
    delta := target.delta;
    IF mech.sgd_defaults THEN
        rows := dpsql_internal._public_row_count(ds);
        params := dpsql_internal._private_defaults(
            ds, model, privacy,
            params || jsonb_strip_nulls(jsonb_build_object('epsilon', epsilon, 'delta', delta)), rows);
        filled := (params->'defaults') || filled;
        -- (the run is prepared from the same count: _prepare_private)
        params := params - 'defaults' || jsonb_build_object('public_rows', rows);
    END IF;
    IF dpsql_internal._unit_rows(ds) > 1 THEN
        params := params || jsonb_build_object('epsilon', epsilon, 'delta', delta);
    END IF;
END $$;

-- The model kind a dataset supports, said as the user's mistake: a regression dataset
-- (label_bound) trains model => 'linear' (or 'lasso'), a classification dataset the others,
-- and a regression mechanism needs a regression dataset.
CREATE OR REPLACE FUNCTION dpsql_internal._check_dataset_model(ds dpsql.datasets, model text, privacy text)
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    canonical text := dpsql_internal._erm_model(model);
BEGIN
    IF privacy <> 'auto' AND (dpsql_internal._mechanism(privacy)).task = 'regression' AND ds.labels IS NOT NULL THEN
        PERFORM dpsql_internal._fail(format('%s is linear regression, and dataset %s is a classification dataset',
                                            privacy, ds.name),
                                     hint => 'Register the table with label_bound (a public bound on |y|) instead of labels.');
    END IF;
    IF ds.labels IS NULL AND canonical NOT IN ('linear', 'lasso') THEN
        PERFORM dpsql_internal._fail(format('dataset %s is a regression dataset: pass model => ''linear''',
                                            ds.name),
                                     hint => format('model => %s is for classification datasets (registered with labels).',
                                                    quote_literal(model)));
    END IF;
    IF ds.labels IS NOT NULL AND canonical = 'lasso' THEN
        PERFORM dpsql_internal._fail(format('dataset %s is a classification dataset: model => ''lasso'' '
                                            'needs a regression dataset (label_bound)', ds.name));
    END IF;
END $$;

-- The registered dataset a private run names, granted to the caller (else refused).
CREATE OR REPLACE FUNCTION dpsql_internal._granted_dataset(source text)
RETURNS dpsql.datasets LANGUAGE plpgsql STABLE AS $$
DECLARE
    ds dpsql.datasets := dpsql_internal._dataset_for_source(source);
BEGIN
    IF NOT dpsql_internal._can_use_dataset(ds.dataset_id) THEN
        PERFORM dpsql_internal._fail(format('dataset %s is not granted to %s', ds.name, session_user), '42501');
    END IF;
    RETURN ds;
END $$;

-- The privacy entry point (dpsql.train's private path, also callable directly with any jsonb):
-- dpsql_internal._train_release with the extension owner's rights. A parameter PostgreSQL
-- cannot read or compute with (text for a number, a number that overflows float8) is refused
-- as such, a dpsql error naming no value, instead of a raw cast or overflow error; a refused
-- parameter without a hint gets one.
CREATE OR REPLACE FUNCTION dpsql_internal._train_private(source text, model text, params jsonb)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    message text;
    hint text;
BEGIN
    PERFORM dpsql_internal._check_release_transaction();  -- before anything is read
    RETURN dpsql_internal._train_release(source, model, params);
EXCEPTION
    WHEN invalid_parameter_value THEN
        -- every refused parameter says where to look
        GET STACKED DIAGNOSTICS message = MESSAGE_TEXT, hint = PG_EXCEPTION_HINT;
        IF coalesce(hint, '') <> '' OR message NOT LIKE 'dpsql: %' THEN
            RAISE;
        END IF;
        PERFORM dpsql_internal._fail(substr(message, 8), '22023',
            'SELECT name, params, options, docs FROM dpsql.mechanisms() lists what each mechanism '
            'takes, and where it is documented.');
    WHEN invalid_text_representation OR cannot_coerce OR invalid_binary_representation THEN
        IF SQLERRM LIKE 'dpsql:%' THEN
            RAISE;  -- dpsql's own (e.g. a divergence), already said as such
        END IF;
        PERFORM dpsql_internal._fail(
            'a parameter or option is not a value of its type (a number, true/false or a name)',
            hint => 'options => {...} takes numbers as JSON numbers and flags as true or false; '
                    'SELECT name, params, options FROM dpsql.mechanisms() lists what each mechanism takes.');
    WHEN numeric_value_out_of_range OR division_by_zero OR floating_point_exception THEN
        IF SQLERRM LIKE 'dpsql:%' THEN
            RAISE;
        END IF;
        PERFORM dpsql_internal._fail(
            'the parameters are out of the range this mechanism computes with (a number overflows)',
            hint => 'Give moderate values: epsilon and delta not tiny, lambda 0 or not tiny, '
                    'radius, clip_norm, step_size and noise_multiplier not huge.');
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._train_bolton(dpsql.datasets, text, text, jsonb, float8, float8, bigint);
-- The bolt-on (Wu et al. 2017, §3.1): Algorithms 1 and 2, or Algorithm 3 with tuning grids.
-- Noiseless epochs, then output perturbation once. Its plan: the run prepared and its state
-- built, the noise's calibration (or Algorithm 3's candidates) checked; _complete_bolton
-- trains after the charge.
CREATE OR REPLACE FUNCTION dpsql_internal._train_bolton(ds dpsql.datasets, model text, privacy text, params jsonb,
                                    epsilon float8, delta float8, noise_seed bigint)
RETURNS dpsql_internal.release_plan LANGUAGE plpgsql AS $$
DECLARE
    calibration text := coalesce(params->>'gaussian', 'analytic');
    grids record := dpsql_internal._bolton_tuning(params);
    tuning boolean := cardinality(grids.lambdas) + cardinality(grids.epochs) > 0;
    p dpsql_internal.release_plan;
BEGIN
    IF tuning AND (dpsql_internal._citus_layout(ds.relid)).dist_column IS NOT NULL THEN
        PERFORM dpsql_internal._fail('private tuning (Algorithm 3) splits the rows by position: not on a '
                                     'distributed dataset', '0A000');
    END IF;
    p := ROW(NULL, '_complete_bolton', ds, model, privacy, params, epsilon, delta, noise_seed,
             NULL, NULL, NULL, NULL)::dpsql_internal.release_plan;
    -- The parameters are checked (the run's spec, the mechanism's sensitivity) before the
    -- budget: a bad argument is reported as such, also on an exhausted dataset.
    p.run := dpsql_internal._arm(dpsql_internal._prepare_private(ds, model, params));
    IF tuning THEN
        -- Algorithm 3 trains candidates of their own (its base's state checks their shape)
        PERFORM dpsql_internal._bolton_tune_check(p.run, params, grids.lambdas, grids.epochs, epsilon, delta,
                                                  calibration);
    ELSE
        p.fit := dpsql_internal._bolton_noise_check(p.run, epsilon, delta, calibration);
    END IF;
    p.charge := ROW(ds.dataset_id, epsilon, delta, privacy,
                    CASE WHEN tuning THEN 'private tuning (Algorithm 3)' END, NULL, p.fit,
                    false)::dpsql_internal.release_charge;
    RETURN p;
END $$;

-- The bolt-on after its charge: the rows read, the noiseless epochs (or Algorithm 3's
-- candidates), the output noise, the model.
CREATE OR REPLACE FUNCTION dpsql_internal._complete_bolton(p dpsql_internal.release_plan, entry bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    calibration text := coalesce(p.params->>'gaussian', 'analytic');
    grids record := dpsql_internal._bolton_tuning(p.params);
    run bigint;
    fit record;
    mid bigint;
BEGIN
    run := dpsql_internal._start_run(dpsql_internal._read_rows(p.run));
    IF cardinality(grids.lambdas) + cardinality(grids.epochs) > 0 THEN
        fit := dpsql_internal._bolton_tune(run, p.model, p.params, grids.lambdas, grids.epochs, p.epsilon,
                                           p.delta, calibration, p.noise_seed);
        run := fit.run;
    ELSE
        fit := dpsql_internal._bolton_fit(run, p.epsilon, p.delta, calibration, p.noise_seed);
    END IF;
    mid := dpsql_internal._finish(run, fit.weights,
                         fit.info || jsonb_build_object('dataset_id', (p.ds).dataset_id, 'ledger_entry', entry));
    PERFORM dpsql_internal._set_ledger_model(entry, mid);
    RETURN mid;
END $$;

-- Algorithm 3's tuning grids as the call gave them (empty: no tuning).
CREATE OR REPLACE FUNCTION dpsql_internal._bolton_tuning(params jsonb, OUT lambdas float8[], OUT epochs int[])
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY(SELECT jsonb_array_elements_text(
               coalesce(nullif(params->'tuning_lambdas', 'null'), '[]'))::float8),
           ARRAY(SELECT jsonb_array_elements_text(
               coalesce(nullif(params->'tuning_epochs', 'null'), '[]'))::int)
$$;

-- Algorithm 3's grids: the tuning grids given, else the call's own lambda and epochs.
CREATE OR REPLACE FUNCTION dpsql_internal._bolton_grids(params jsonb, lambdas float8[], epochs_grid int[],
                                                       OUT grid_l float8[], OUT grid_k int[])
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN cardinality(lambdas) > 0 THEN lambdas
                ELSE ARRAY[coalesce((params->>'lambda')::float8, 0)] END,
           CASE WHEN cardinality(epochs_grid) > 0 THEN epochs_grid
                ELSE ARRAY[coalesce((params->>'epochs')::int, 10)] END
$$;

-- Algorithm 3's candidates, from public numbers: each (lambda, epochs) pair of the grids,
-- numbered 1..l in the grids' order, with its schedule and the portion size, the row count
-- split into l + 1 equal portions.
CREATE OR REPLACE FUNCTION dpsql_internal._bolton_candidates(rows bigint, params jsonb, lambdas float8[],
                                                            epochs_grid int[])
RETURNS TABLE (i int, lambda float8, epochs int, schedule text, portion bigint, l int)
LANGUAGE sql IMMUTABLE AS $$
    SELECT (row_number() OVER (ORDER BY gl.o, gk.o))::int, gl.v, gk.v,
           CASE WHEN gl.v > 0 THEN 'decreasing' ELSE 'constant' END,
           rows / (count(*) OVER () + 1), (count(*) OVER ())::int
      FROM dpsql_internal._bolton_grids(params, lambdas, epochs_grid) g,
           unnest(g.grid_l) WITH ORDINALITY gl(v, o), unnest(g.grid_k) WITH ORDINALITY gk(v, o)
     ORDER BY gl.o, gk.o
$$;

-- Algorithm 3's refusals that need no row, before its charge: the split (portions of at least
-- one batch) and each candidate's settings and bolt-on mechanism at the portion's size, as
-- _bolton_tune prepares them.
CREATE OR REPLACE FUNCTION dpsql_internal._bolton_tune_check(b dpsql.runs, params jsonb, lambdas float8[],
                                                            epochs_grid int[], epsilon float8, delta float8,
                                                            calibration text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    batch bigint := coalesce((params->>'batch_size')::bigint, 1);
    step float8 := (params->>'step_size')::float8;
    c record;
BEGIN
    FOR c IN SELECT * FROM dpsql_internal._bolton_candidates(b.rows, params, lambdas, epochs_grid) LOOP
        IF c.portion < batch THEN
            PERFORM dpsql_internal._fail(format('%s rows cannot be split into %s portions of at least one batch',
                                                b.rows, c.l + 1));
        END IF;
        PERFORM dpsql_internal._check_run_settings(c.epochs, batch, c.lambda, step, c.schedule, 0, NULL,
                                                   b.spec->>'row_norm', dpsql_internal._huber_h(params),
                                                   NULL, 0, true, 'once');
        PERFORM dpsql_internal._bolton_mechanism(
            b.spec || jsonb_build_object(
                'lambda', c.lambda, 'epochs', c.epochs, 'batch_size', batch, 'schedule', c.schedule,
                'step_size', CASE WHEN c.schedule = 'constant' THEN coalesce(step, 1.0 / sqrt(c.portion)) END,
                'step_offset', 0, 'radius', CASE WHEN c.lambda > 0 THEN 1.0 / c.lambda END,
                'parallel_workers', 0, 'shard_parallel', false, 'permutation', 'once'),
            c.portion, epsilon, delta, calibration);
    END LOOP;
END $$;

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
    grids record := dpsql_internal._bolton_grids(params, lambdas, epochs_grid);
    batch bigint := coalesce((params->>'batch_size')::bigint, 1);
    labels float8[];
    c record;
    l int;
    portion bigint;
    cand bigint;
    fit record;
    candidates jsonb := '[]';
    errors float8[] := '{}';
    pick int;
BEGIN
    -- The base table already holds transformed features and mapped labels.
    labels := CASE WHEN jsonb_array_length(b.spec->'classes') > 2 OR b.spec->>'model' = 'multinomial'
                   THEN ARRAY(SELECT generate_series(0, jsonb_array_length(b.spec->'classes') - 1)::float8)
                   ELSE '{-1,1}' END;
    -- (checked before the charge: _bolton_tune_check)
    FOR c IN SELECT * FROM dpsql_internal._bolton_candidates(b.rows, params, lambdas, epochs_grid) LOOP
        l := c.l;
        portion := c.portion;
        cand := (dpsql_internal._prepare(
            source => format('SELECT x, y FROM %s WHERE rid > %s AND rid <= %s',
                             b.train_table, (c.i - 1) * portion, c.i * portion),
            features => '{x}', label => 'y', model => model, epochs => c.epochs, batch_size => batch,
            lambda => c.lambda, step_size => (params->>'step_size')::float8,
            schedule => c.schedule, step_offset => 0, radius => NULL, shuffle => true,
            seed => (b.spec->>'seed')::bigint + c.i,
            labels => labels, intercept => (b.spec->>'intercept')::boolean,
            row_norm => b.spec->>'row_norm', huber_h => dpsql_internal._huber_h(params),
            tolerance => NULL, private => true,
            -- the registered dimension: no row of the training table is probed
            feature_types => '{double precision[]}', dim => (b.spec->>'dim')::int)).run_id;
        fit := dpsql_internal._bolton_fit(cand, epsilon, delta, calibration,
                                 noise_seed # (c.i::bigint << 32));
        errors := errors || dpsql_internal._errors(b.train_table, model, (b.spec->>'flags')::int,
                                          fit.weights, l::bigint * portion,
                                          (l + 1)::bigint * portion)::float8;
        candidates := candidates || jsonb_build_object(
            'run', cand, 'lambda', c.lambda, 'epochs', c.epochs, 'weights', to_jsonb(fit.weights),
            'info', fit.info);
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
            'portion_rows', portion,
            'lambdas', grids.grid_l, 'epochs', grids.grid_k,
            'chosen_lambda', (candidates->(pick - 1)->>'lambda')::float8,
            'chosen_epochs', (candidates->(pick - 1)->>'epochs')::int,
            'selection', 'exponential mechanism, utility -errors, sensitivity 1'));
END $$;
