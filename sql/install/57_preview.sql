------------------------------------------------------------------------------------------
-- Previews (issue 27): what a private release would do and cost, before paying
--
-- dpsql.preview takes dpsql.train's arguments (privacy defaults to 'auto') and runs the
-- release's own path, resolve, validate, default and plan, in a subtransaction, with the
-- transaction's preview flag set (dpsql_internal._previewing): the run's training table is
-- left empty (no row is read; the row count, public, is counted) and the charge, the first
-- step that spends, stops with what it would charge. Nothing is charged, written or released;
-- the answer holds only public quantities: the mechanism, its plan and defaults, the epsilon
-- and delta, the budget before and after, every warning, and the refusal the release would
-- meet (the same error train would raise, also for a budget it would exceed).
--
-- The charge stops a preview with a signal (SQLSTATE DPPRV), not a return value that every
-- release would have to test: a release function that forgot the test would go on to read
-- the rows and release, uncharged. With the signal nothing after the charge can run in a
-- preview, whatever the release function, and the subtransaction it unwinds takes with it all
-- the preview wrote before (a run's empty training table, made to run the fill's checks).
------------------------------------------------------------------------------------------

-- Adds a public fact to the preview's answer (nothing when not previewing). A transaction
-- setting: the charge's signal carries it out of the subtransaction that is undone.
CREATE OR REPLACE FUNCTION dpsql_internal._preview_note(key text, value jsonb)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF dpsql_internal._previewing() THEN
        PERFORM set_config('dpsql_preview.context',
                           jsonb_set(coalesce(nullif(current_setting('dpsql_preview.context', true), ''),
                                              '{}')::jsonb, ARRAY[key], coalesce(value, 'null'))::text,
                           true);
    END IF;
END $$;

-- The preview of any release: runs statement (one call of a release function, built by the
-- preview function from literals) with the preview flag set, in a subtransaction that is
-- undone, and returns what its charge would be. As the caller: the statement's release
-- function does its own checks (as every release, it charges before it reads a value).
CREATE OR REPLACE FUNCTION dpsql_internal._preview_statement(statement text)
RETURNS jsonb LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    charge jsonb;
    context jsonb;
    message text;
    hint text;
    state text;
    budget jsonb;
BEGIN
    PERFORM set_config('dpsql_preview.on', 'on', true);
    PERFORM set_config('dpsql_preview.context', '{}', true);
    BEGIN
        EXECUTE statement;
        -- (every release charges before it releases: reaching here is a bug)
        -- A RAISE, not _fail: an internal signal, caught just below.
        RAISE EXCEPTION 'dpsql: the preview reached no charge' USING ERRCODE = 'XX000';
    EXCEPTION
        WHEN SQLSTATE 'DPPRV' THEN
            GET STACKED DIAGNOSTICS message = PG_EXCEPTION_DETAIL;
            charge := message::jsonb;
        WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS message = MESSAGE_TEXT, hint = PG_EXCEPTION_HINT, state = RETURNED_SQLSTATE;
    END;
    PERFORM set_config('dpsql_preview.on', 'off', true);
    IF charge IS NULL THEN
        RETURN jsonb_build_object('refused', jsonb_strip_nulls(jsonb_build_object(
                   'message', message, 'hint', nullif(hint, ''), 'sqlstate', state)));
    END IF;
    context := coalesce(charge->'context', '{}');
    budget := charge->'budget';
    budget := budget || jsonb_build_object(
        'epsilon_remaining', (budget->>'epsilon_budget')::float8 - (budget->>'epsilon_spent')::float8,
        'delta_remaining', (budget->>'delta_budget')::float8 - (budget->>'delta_spent')::float8,
        'exceeded', CASE WHEN budget->>'composition' = 'pld' THEN NULL
                         ELSE (budget->>'epsilon_spent')::float8 + (charge->>'epsilon')::float8
                                  > (budget->>'epsilon_budget')::float8 * (1 + 1e-12)
                              OR (budget->>'delta_spent')::float8 + (charge->>'delta')::float8
                                  > (budget->>'delta_budget')::float8 * (1 + 1e-12) END);
    RETURN jsonb_strip_nulls(jsonb_build_object(
        'dataset', context->'dataset', 'mechanism', coalesce(context->'mechanism', charge->'mechanism'),
        'model', context->'model',
        'epsilon', charge->'epsilon', 'delta', charge->'delta', 'note', charge->'note',
        'rows', context->'run'->'rows', 'dim', context->'run'->'dim', 'run', context->'run',
        'plan', charge->'plan', 'dp_event', charge->'dp_event', 'defaults', context->'defaults',
        'auto', context->'auto', 'budget', budget, 'warnings', coalesce(context->'warnings', '[]'),
        'refused', CASE WHEN (budget->>'exceeded')::boolean THEN jsonb_build_object(
            'message', format('dpsql: privacy budget of dataset %s would be exceeded', context->>'dataset'),
            'sqlstate', 'DP001') END));
END $$;

-- The preview of a training release, as the extension owner (like _train_private, whose
-- checks it runs).
CREATE OR REPLACE FUNCTION dpsql_internal._preview_private(source text, model text, params jsonb)
RETURNS jsonb LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT dpsql_internal._preview_statement(
        format('SELECT dpsql_internal._train_private(%L, %L, %L::jsonb)', source, model, params))
$$;

-- BEGIN GENERATED: preview signature (make generate; sql/mechanisms/parameters.toml)
CREATE OR REPLACE FUNCTION dpsql.preview(
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
    privacy text DEFAULT 'auto',
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
    shard_parallel boolean DEFAULT false)
-- END GENERATED: preview signature
RETURNS jsonb LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT dpsql_internal._preview_private(source, model, dpsql_internal._private_params(
        -- BEGIN GENERATED: _private_params arguments (make generate; sql/mechanisms/parameters.toml)
        features, label, epochs, batch_size, lambda, step_size, schedule, radius, shuffle, seed,
        privacy, labels, intercept, row_norm, huber_h, step_offset, tolerance, parallel_workers,
        epsilon, delta, gaussian, permutation, paper_minibatch_formula, noise_seed, tuning_lambdas,
        tuning_epochs, clip_norm, sampling, noise_multiplier, bst14_noise, steps, ci, ci_draws,
        burn_in, options, shard_parallel
        -- END GENERATED: _private_params arguments
    ))
$$;
COMMENT ON FUNCTION dpsql.preview IS
    'What a private dpsql.train would do and charge (plan, epsilon, delta, warnings, refusal), '
    'without charging and without reading rows';
