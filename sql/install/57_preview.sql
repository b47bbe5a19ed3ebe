------------------------------------------------------------------------------------------
-- Previews (issue 27): what a private release would do and cost, before paying
--
-- dpsql.preview takes dpsql.train's arguments (privacy defaults to 'auto') and runs the
-- release's plan, the steps before its charge: resolve, validate, default and plan
-- (_train_plan, 35_private.sql); dpsql.preview_describe and dpsql.preview_evaluate run theirs.
-- The transaction's preview flag is set meanwhile (dpsql_internal._previewing): the plan
-- collects its public facts and warnings for the answer (_preview_note). A plan reads no row
-- (the row count, public, is counted) and charges nothing: the preview returns the charge the
-- plan computed, with the budget before and after. Nothing is charged, released or kept (a
-- run's empty training table, made to run the fill's checks, is dropped); the answer holds
-- only public quantities: the mechanism, its plan and defaults, the epsilon and delta, every
-- warning, and the refusal the release would meet (the same error train would raise, also for
-- a budget it would exceed). A release that reaches its charge with the flag set (a caller
-- set it) is refused there, before it reads a row (28_ledger.sql).
------------------------------------------------------------------------------------------

-- Adds a public fact to the preview's answer (nothing when not previewing). A transaction
-- setting, read by _preview_statement once the plan has returned.
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

-- The preview of any release: runs statement (a query of the release's plan returning its
-- dpsql_internal.release_charge, built by the preview function from literals) with the
-- preview flag set, and returns the charge as _charge would book it (at unit level) with the
-- budget, or the refusal the plan raised (its subtransaction undone). As the caller: the
-- preview functions run it as the extension owner, as their releases run.
CREATE OR REPLACE FUNCTION dpsql_internal._preview_statement(statement text)
RETURNS jsonb LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    planned dpsql_internal.release_charge;
    checked record;
    charge dpsql_internal.release_charge;
    d dpsql.datasets;
    context jsonb;
    spent record;
    message text;
    hint text;
    state text;
    budget jsonb;
BEGIN
    PERFORM set_config('dpsql_preview.on', 'on', true);
    PERFORM set_config('dpsql_preview.context', '{}', true);
    BEGIN
        EXECUTE statement INTO planned;
        checked := dpsql_internal._charge_terms(planned);
        charge := checked.terms;
        d := checked.d;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS message = MESSAGE_TEXT, hint = PG_EXCEPTION_HINT, state = RETURNED_SQLSTATE;
    END;
    PERFORM set_config('dpsql_preview.on', 'off', true);
    IF state IS NOT NULL THEN
        RETURN jsonb_build_object('refused', jsonb_strip_nulls(jsonb_build_object(
                   'message', message, 'hint', nullif(hint, ''), 'sqlstate', state)));
    END IF;
    context := coalesce(nullif(current_setting('dpsql_preview.context', true), '')::jsonb, '{}');
    SELECT s.epsilon_spent, s.delta_spent INTO spent FROM dpsql_internal.spent s
     WHERE s.dataset_id = d.dataset_id;
    budget := jsonb_build_object(
        'composition', d.composition, 'epsilon_budget', d.epsilon_budget,
        'delta_budget', d.delta_budget, 'epsilon_spent', coalesce(spent.epsilon_spent, 0),
        'delta_spent', coalesce(spent.delta_spent, 0));
    budget := budget || jsonb_build_object(
        'epsilon_remaining', (budget->>'epsilon_budget')::float8 - (budget->>'epsilon_spent')::float8,
        'delta_remaining', (budget->>'delta_budget')::float8 - (budget->>'delta_spent')::float8,
        'exceeded', CASE WHEN d.composition = 'pld' THEN NULL
                         ELSE (budget->>'epsilon_spent')::float8 + charge.epsilon
                                  > (budget->>'epsilon_budget')::float8 * (1 + 1e-12)
                              OR (budget->>'delta_spent')::float8 + charge.delta
                                  > (budget->>'delta_budget')::float8 * (1 + 1e-12) END);
    RETURN jsonb_strip_nulls(jsonb_build_object(
        'dataset', context->'dataset', 'mechanism', coalesce(context->'mechanism', to_jsonb(charge.mechanism)),
        'model', context->'model',
        'epsilon', charge.epsilon, 'delta', charge.delta, 'note', charge.note,
        'rows', context->'run'->'rows', 'dim', context->'run'->'dim', 'run', context->'run',
        'plan', charge.plan, 'dp_event', charge.dp_event, 'defaults', context->'defaults',
        'auto', context->'auto', 'budget', budget, 'warnings', coalesce(context->'warnings', '[]'),
        'refused', CASE WHEN (budget->>'exceeded')::boolean THEN jsonb_build_object(
            'message', format('dpsql: privacy budget of dataset %s would be exceeded', context->>'dataset'),
            'sqlstate', 'DP001') END));
END $$;

-- A training release's preview: its plan (_train_plan), whose run's empty training table is
-- dropped; its charge.
CREATE OR REPLACE FUNCTION dpsql_internal._train_preview(source text, model text, params jsonb)
RETURNS dpsql_internal.release_charge LANGUAGE plpgsql AS $$
DECLARE
    p dpsql_internal.release_plan := dpsql_internal._train_plan(source, model, params);
BEGIN
    IF (p.run).train_table IS NOT NULL THEN
        EXECUTE format('DROP TABLE IF EXISTS %s', (p.run).train_table);
    END IF;
    RETURN p.charge;
END $$;

-- The preview of a training release, as the extension owner (like _train_private, whose
-- checks it runs).
CREATE OR REPLACE FUNCTION dpsql_internal._preview_private(source text, model text, params jsonb)
RETURNS jsonb LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT dpsql_internal._preview_statement(
        format('SELECT * FROM dpsql_internal._train_preview(%L, %L, %L::jsonb)', source, model, params))
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
