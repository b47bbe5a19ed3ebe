------------------------------------------------------------------------------------------
-- Mechanisms as a plan and a fit: the linear-regression mechanisms (40_linear.sql) and the
-- private-ERM toolbox (45_*.sql onwards). The mechanism's plan function computes every public
-- number it uses (noise scales, step counts, regularisers) from n, d, the registration and
-- the analyst's parameters, never from the data; its fit function scans the training table
-- and releases. _train_planned prepares the run (no row read) and calls the plan;
-- _train_release (35_private.sql) charges (committed at once, 28_ledger.sql); then
-- _complete_planned reads the rows and starts the run (_read_rows, _start_run: its row
-- written once), fits and finishes, in the same transaction. A refusal before the charge
-- charges nothing; after it, nothing is released and the charge stands, as when a fit
-- returns no weights (its certificate failed).
--   plan: dpsql_internal.<plan_function>(privacy text, ds dpsql.datasets, n bigint, d int,
--                                         epsilon float8, delta float8, params jsonb)
--             -> dpsql_internal.<mechanism>_plan
--         (its composite type, declared in its file; params->>'model' is the canonical model,
--          params->'classes' the mapped label set; the plan's 'info' goes into the model's
--          provenance, 'intercept_after_row_transform' and 'row_clip_radius' into its
--          preprocessing)
--   fit:  dpsql_internal.<fit_function>(train_table text, plan dpsql_internal.<mechanism>_plan,
--                                        noise_seed bigint, OUT weights float8[], OUT info jsonb,
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

-- What a plan-and-fit model records of its rows' preprocessing (NULL: its flags say it all),
-- from the plan and the registration (public).
-- Issue 25 (privacy rule 10, docs/architecture.md): a fit that appends the intercept's 1 AFTER
-- the row transform (plan key intercept_after_row_transform: the private-ERM fits, which clip x
-- and then append 1, ||(x, 1)|| <= sqrt(x_bound^2 + 1) in their constants) records that
-- representation, so that predict, evaluate and Python score what it trained: the row
-- transform moves from the model's flags (which append 1 before it) to its preprocessing
-- (the row transform alone, then the intercept; the key 'intercept' says so).
-- A fit that clips rows without a row transform (a regression's x to the registered row
-- bound: plan key row_clip_radius) records the radius, so that a row beyond the bound is
-- scored clipped as it was trained (preprocessing.clip_radius; 54_api.sql, models.py).
CREATE OR REPLACE FUNCTION dpsql_internal._planned_preprocessing(spec jsonb, plan jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    transform int := (spec->>'flags')::int & dpsql_internal._flag('row_transform');
    zeros float8[] := array_fill(0::float8, ARRAY[(spec->>'dim')::int]);
    pre jsonb;
BEGIN
    IF coalesce((plan->>'intercept_after_row_transform')::boolean, false)
       AND (spec->>'intercept')::boolean THEN
        pre := jsonb_build_object('row_flags', transform, 'centre', zeros,
                                  'intercept', 'appended after the row transform');
    END IF;
    IF plan->>'row_clip_radius' IS NOT NULL AND transform = 0 THEN
        pre := coalesce(pre, jsonb_build_object('row_flags', 0, 'centre', zeros))
               || jsonb_build_object('clip_radius', (plan->>'row_clip_radius')::float8);
    END IF;
    RETURN pre;
END $$;

-- The composite type a plan-and-fit mechanism's plan function returns (its own file declares
-- it): its fit function takes its plan as that type. A release carries the plan as its
-- jsonb (release_plan.fit: the ledger's public record), exact with the pinned float output
-- (85_pinned_settings.sql).
CREATE OR REPLACE FUNCTION dpsql_internal._plan_type(mech dpsql.mechanism_catalog)
RETURNS regtype LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT f.prorettype::regtype FROM pg_proc f
     WHERE f.pronamespace = 'dpsql_internal'::regnamespace AND f.proname = mech.plan_function
$$;

DROP FUNCTION IF EXISTS dpsql_internal._train_planned(dpsql.datasets, text, text, jsonb, float8, float8, bigint);
-- Plan a plan-and-fit mechanism's release on a registered dataset (its registered train
-- function, or _train_linear's after its checks; called by _train_plan, 35_private.sql): the
-- run prepared from the public row count, the mechanism's plan, what it is charged. Reads no
-- row; _complete_planned releases after the charge.
CREATE OR REPLACE FUNCTION dpsql_internal._train_planned(ds dpsql.datasets, model text, privacy text,
                                                params jsonb, epsilon float8, delta float8,
                                                noise_seed bigint)
RETURNS dpsql_internal.release_plan LANGUAGE plpgsql
SET max_parallel_workers_per_gather = 0
SET synchronize_seqscans = off
AS $$
DECLARE
    mech dpsql.mechanism_catalog := dpsql_internal._mechanism(privacy);
    canonical text := dpsql_internal._erm_model(model);
    p dpsql_internal.release_plan;
BEGIN
    IF mech.plan_function IS NULL OR mech.fit_function IS NULL THEN
        PERFORM dpsql_internal._fail(format('%s is not a plan-and-fit mechanism', privacy), 'XX000');
    END IF;
    p := ROW(NULL, '_complete_planned', ds, model, privacy, params, epsilon, delta, noise_seed,
             NULL, NULL, NULL, NULL)::dpsql_internal.release_plan;
    p.run := dpsql_internal._prepare_private(ds, CASE WHEN canonical = 'lasso' THEN 'linear' ELSE model END,
                                             params);
    EXECUTE format('SELECT to_jsonb(dpsql_internal.%I($1, $2, $3, $4, $5, $6, $7))', mech.plan_function)
       INTO p.fit USING privacy, ds, (p.run).rows, ((p.run).spec->>'dim')::int, epsilon, delta,
                        params || jsonb_build_object('model', canonical, 'classes', (p.run).spec->'classes');
    p.charge := ROW(ds.dataset_id, epsilon, delta, privacy, NULL, NULL, p.fit, false)::dpsql_internal.release_charge;
    RETURN p;
END $$;

-- A plan-and-fit release after its charge: the rows read, the mechanism's fit, the model.
CREATE OR REPLACE FUNCTION dpsql_internal._complete_planned(p dpsql_internal.release_plan, entry bigint)
RETURNS bigint LANGUAGE plpgsql
SET max_parallel_workers_per_gather = 0
SET synchronize_seqscans = off
AS $$
DECLARE
    mech dpsql.mechanism_catalog := dpsql_internal._mechanism(p.privacy);
    canonical text := dpsql_internal._erm_model(p.model);
    r dpsql.runs := p.run;
    run bigint;
    rel record;
    mid bigint;
    pre jsonb;
BEGIN
    pre := dpsql_internal._planned_preprocessing(r.spec, p.fit);
    IF pre ? 'intercept' THEN  -- the row transform moves from the flags to the preprocessing
        r.spec := r.spec || jsonb_build_object('flags', (r.spec->>'flags')::int
                                                        & ~dpsql_internal._flag('row_transform'));
    END IF;
    run := dpsql_internal._start_run(dpsql_internal._read_rows(r));  -- (no SGD state: none runs)
    -- the fit takes the plan as the type its plan function returned
    EXECUTE format('SELECT * FROM dpsql_internal.%I($1, jsonb_populate_record(NULL::%s, $2), $3)',
                   mech.fit_function, dpsql_internal._plan_type(mech))
       INTO rel USING r.train_table, p.fit, p.noise_seed;
    IF rel.weights IS NULL THEN
        -- The fit could not certify what its proof needs (an exact minimiser): nothing is
        -- released, and the budget stays spent (whether it converged depends on the data).
        PERFORM dpsql_internal._abort(run);
        -- (the fit's diagnostics depend on the data: they are not shown)
        RAISE WARNING 'dpsql: % released nothing: its solver did not certify the minimiser; '
                      'the budget of this call is spent', p.privacy
            USING HINT = 'Raise options.newton_steps, or lambda (a better conditioned objective).';
        RETURN NULL;
    END IF;
    UPDATE dpsql.runs SET epochs_done = 1, done = true WHERE runs.run_id = run;
    mid := dpsql_internal._finish(run, rel.weights, (p.fit->'info') || rel.info || jsonb_build_object(
        'mechanism', p.privacy, 'model', canonical, 'dataset_id', (p.ds).dataset_id, 'epsilon', p.epsilon,
        'delta', p.delta, 'ledger_entry', entry,
        'noise_seed', dpsql_internal._noise_source(p.noise_seed))
        || CASE WHEN pre IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('preprocessing', pre) END);
    IF rel.iterates IS NOT NULL THEN
        INSERT INTO dpsql.model_iterates (model_id, iterates) VALUES (mid, rel.iterates);
    END IF;
    -- (issue 45) no SGD ran: the SGD fields the run's table carried are not the model's (its
    -- own steps, scans or draws are in params->'privacy')
    UPDATE dpsql.model_store m
       SET epochs = NULL, epochs_run = NULL, batch_size = NULL, schedule = NULL, step_size = NULL,
           step_offset = NULL, shuffle = NULL
     WHERE m.model_id = mid;
    PERFORM dpsql_internal._set_ledger_model(entry, mid);
    RETURN mid;
END $$;
