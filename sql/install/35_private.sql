------------------------------------------------------------------------------------------
-- Private training: bolt-on output perturbation (spec 003), released by the server
------------------------------------------------------------------------------------------

-- What analysts see of the models: private releases on datasets granted to them. Data owners
-- see everything (their non-private models too).
CREATE VIEW dpsql.models WITH (security_barrier) AS
    SELECT * FROM dpsql.model_store m
     WHERE dpsql._is_admin()
        OR (m.privacy <> 'none' AND m.dataset_id IS NOT NULL AND dpsql._can_use_dataset(m.dataset_id));
COMMENT ON VIEW dpsql.models IS
    'Trained models with their hyperparameters and provenance (analysts: released private models of their datasets)';

-- Algorithm 1 or 2 of the bolt-on paper for the run's loss and schedule, its sensitivity
-- (C core closed forms) and the noise it needs; the noiseless state never leaves the server.
CREATE FUNCTION dpsql._bolton_mechanism(spec jsonb, rows bigint, epsilon float8, delta float8,
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
        PERFORM dpsql._fail('a strongly convex bolt-on run (lambda > 0) needs the ball ||w|| <= radius',
                            hint => 'Leave radius unset with schedule => ''decreasing'' (R = 1/lambda), or give one.');
    END IF;
    c := dpsql.loss_constants(model, lambda, radius, coalesce((spec->>'huber_h')::float8, 0.1));
    lipschitz := c.lipschitz;
    -- Parallel epochs average shard models with weights n_s/m <= 1: the convex constant-step
    -- bound 2kL eta/b still holds; the other closed forms are not derived for averaging.
    IF coalesce((spec->>'parallel_workers')::int, 0) > 0
       AND NOT (lambda = 0 AND schedule = 'constant') THEN
        PERFORM dpsql._fail('parallel bolt-on runs need the convex constant-step algorithm (lambda = 0)');
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
        PERFORM dpsql._fail(format('the classic Gaussian mechanism (eq. 4) needs epsilon < 1 per model, got %s',
                                   model_epsilon), hint => 'Use gaussian => ''analytic'' (the default).');
    END IF;
END $$;

-- The privacy entry point behind dpsql.train: runs as the extension owner on a registered
-- dataset only, with the data owner's columns, labels and bounds. Analysts pass numbers and
-- names from fixed lists, never SQL. The budget is charged in the same transaction as the
-- release; a run that fails releases nothing and, being one transaction, charges nothing
-- (private runs have no data-dependent error: malformed rows become null records).
CREATE FUNCTION dpsql._train_private(source text, model text, params jsonb)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ds dpsql.datasets;
    privacy text := params->>'privacy';
    epsilon float8 := (params->>'epsilon')::float8;
    delta float8 := coalesce((params->>'delta')::float8, 0);
    calibration text := coalesce(params->>'gaussian', 'analytic');
    seed bigint := (params->>'seed')::bigint;              -- the permutation's (data-independent)
    noise_seed bigint := (params->>'noise_seed')::bigint;  -- tests only: makes the noise predictable
    entry bigint;
    run bigint;
    r dpsql.runs;
    mech record;
    rel record;
    e record;
    lambda float8 := coalesce((params->>'lambda')::float8, 0);
    schedule text := coalesce(params->>'schedule',
                              CASE WHEN coalesce((params->>'lambda')::float8, 0) > 0
                                   THEN 'decreasing' ELSE 'constant' END);
BEGIN
    IF privacy IS DISTINCT FROM 'bolton' THEN
        PERFORM dpsql._fail(format('unknown privacy mechanism %s', coalesce(quote_literal(privacy), 'NULL')),
                            hint => 'Available: bolton.');
    END IF;
    IF coalesce((params->>'paper_minibatch_formula')::boolean, false) THEN
        PERFORM dpsql._fail('paper_minibatch_formula is refused for real releases: it underestimates '
                            'the strongly convex mini-batch sensitivity (spec 003 section 5.5)',
                            hint => 'Use dpsql.bolton_sensitivity(..., paper_minibatch => true) to compare.');
    END IF;
    IF dpsql._loss_code(model) = 2 THEN
        PERFORM dpsql._fail('bolt-on needs a Lipschitz loss: logistic, huber or multinomial',
                            hint => 'Least squares has no gradient bound; DP linear regression has its own mechanisms.');
    END IF;
    IF epsilon IS NULL OR NOT (epsilon > 0 AND epsilon < 'Infinity') THEN
        PERFORM dpsql._fail(format('epsilon must be a finite number > 0, got %s', coalesce(epsilon::text, 'NULL')));
    END IF;
    IF NOT (delta >= 0 AND delta < 1) THEN
        PERFORM dpsql._fail(format('delta must be in [0, 1), got %s', delta));
    END IF;
    IF calibration NOT IN ('analytic', 'classic') THEN
        PERFORM dpsql._fail('gaussian must be analytic or classic');
    END IF;
    IF params->>'tolerance' IS NOT NULL THEN
        PERFORM dpsql._fail('tolerance is not allowed in private runs: a data-dependent stop would leak',
                            hint => 'The number of epochs is fixed in advance.');
    END IF;
    IF NOT coalesce((params->>'shuffle')::boolean, true) THEN
        PERFORM dpsql._fail('private runs shuffle the data (a data-independent permutation)');
    END IF;

    ds := dpsql._dataset_for_source(source);
    IF NOT dpsql._can_use_dataset(ds.dataset_id) THEN
        PERFORM dpsql._fail(format('dataset %s is not granted to %s', ds.name, session_user), '42501');
    END IF;
    IF params->'features' <> 'null' AND params->'features' <> to_jsonb(ds.features) THEN
        PERFORM dpsql._fail(format('dataset %s is registered with features %s', ds.name, ds.features),
                            hint => 'Pass NULL (or the registered features): private runs use the registration.');
    END IF;
    IF params->>'label' IS NOT NULL AND params->>'label' <> ds.label THEN
        PERFORM dpsql._fail(format('dataset %s is registered with label %s', ds.name, ds.label));
    END IF;

    -- Checks the budget under the dataset's row lock and appends the ledger entry.
    entry := dpsql._charge(ds.dataset_id, epsilon, delta, privacy);

    run := dpsql._prepare(
        source => ds.source, features => ds.features, label => ds.label, model => model,
        epochs => coalesce((params->>'epochs')::int, 10),
        batch_size => coalesce((params->>'batch_size')::bigint, 1), lambda => lambda,
        step_size => (params->>'step_size')::float8, schedule => schedule,
        step_offset => coalesce((params->>'step_offset')::float8, 0),
        radius => (params->>'radius')::float8, shuffle => true, seed => seed,
        labels => ds.labels, intercept => coalesce((params->>'intercept')::boolean, false),
        row_norm => ds.row_norm, huber_h => coalesce((params->>'huber_h')::float8, 0.1),
        tolerance => NULL, parallel_workers => coalesce((params->>'parallel_workers')::int, 0),
        private => true, feature_bounds => ds.feature_bounds,
        permutation => coalesce(params->>'permutation', 'once'));
    r := dpsql._locked_run(run);
    mech := dpsql._bolton_mechanism(r.spec, r.rows, epsilon, delta, calibration);
    LOOP
        e := dpsql._run_epoch(run);  -- its training loss stays here
        EXIT WHEN e.done;
    END LOOP;
    r := dpsql._locked_run(run);
    rel := dpsql._bolton_release(r.state, mech.sensitivity, mech.model_epsilon, mech.model_delta,
                                 mech.per_output, calibration, noise_seed);
    run := dpsql._finish(run, rel.weights, jsonb_build_object(
        'mechanism', privacy, 'algorithm', mech.algorithm, 'dataset_id', ds.dataset_id,
        'epsilon', epsilon, 'delta', delta, 'sensitivity', mech.sensitivity,
        'noise_scale', rel.noise_scale, 'lipschitz', mech.lipschitz,
        'noise', CASE WHEN delta = 0 THEN 'gamma-norm (eq. 3), uniform direction'
                      ELSE 'gaussian (' || calibration || ')' END,
        'one_vs_rest', mech.per_output, 'model_epsilon', mech.model_epsilon,
        'model_delta', mech.model_delta, 'neighbouring', 'replace-one, m public',
        'noise_seed', CASE WHEN noise_seed IS NULL THEN 'pg_strong_random'
                           ELSE 'user seed ' || noise_seed || ': NOT private' END,
        'ledger_entry', entry));
    PERFORM dpsql._set_ledger_model(entry, run);
    RETURN run;
END $$;
