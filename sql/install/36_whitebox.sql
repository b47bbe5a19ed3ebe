------------------------------------------------------------------------------------------
-- White-box private SGD: noise inside every step of the aggregate (SCS13, BST14, DP-SGD)
------------------------------------------------------------------------------------------

-- BST14's per-step epsilon_1 (Wu et al. 2017, Appendix F, Algorithm 4 line 5, read with
-- e^{epsilon_1} where the paper prints (e_1^eps - 1)): the root of epsilon = T e1 (e^{e1} - 1) +
-- sqrt(2 T ln(1/delta1)) e1 (C core:
-- dpsql_advanced_composition_step, core/composition.h).
CREATE OR REPLACE FUNCTION dpsql_internal._bst14_epsilon1(epsilon float8, delta1 float8, steps bigint)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_advanced_composition_step_sql'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- The per-step noise of SCS13 and BST14, for their plans below and for the defaults' batch
-- rule (34_defaults.sql, _step_noise): one place each, in the C core (mechanisms.h).
--
-- SCS13 (as the bolt-on paper ran it): k passes at (epsilon, delta) / k each (basic
-- composition), noise on a step's gradient sum of L2 sensitivity s: the Gamma-norm scale
-- s / epsilon_pass (delta = 0) or the Gaussian sigma (calibration); over dim coordinates its
-- size (_noise_size; dim = 1: the scale).
CREATE OR REPLACE FUNCTION dpsql_internal._scs13_step_noise(sensitivity float8, epsilon float8,
                                                            delta float8, passes int, dim int,
                                                            calibration text,
                                                            OUT epsilon_pass float8,
                                                            OUT delta_pass float8,
                                                            OUT noise float8)
AS 'MODULE_PATHNAME', 'dpsql_scs13_step_noise_sql'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- BST14's per-step noise std at add/remove sensitivity 1 (Algorithm 4/5 with k epochs of
-- T = k floor(m / b) steps of b draws with replacement): the classic Gaussian for
-- (epsilon_2, delta_1), epsilon_2 = min(1, m epsilon_1 / (2 b)) by amplification,
-- delta_1 = delta / T, epsilon_1 as _bst14_epsilon1 (C core: dpsql_bst14_step_noise).
CREATE OR REPLACE FUNCTION dpsql_internal._bst14_noise(epsilon float8, delta float8, rows bigint, b bigint,
                                   k int, OUT epsilon_1 float8, OUT epsilon_2 float8,
                                   OUT delta_1 float8, OUT sigma float8)
AS 'MODULE_PATHNAME', 'dpsql_bst14_step_noise_sql'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- Answers of the accountant, a deterministic function of the request (a call costs seconds).
CREATE TABLE IF NOT EXISTS dpsql.accountant_answers (
    request  jsonb PRIMARY KEY,
    answer   jsonb NOT NULL,
    asked_at timestamptz NOT NULL DEFAULT now()
);

-- Seconds the accountant is predicted to need for a request, from its public parameters
-- (issue 24). dp-accounting's PLD of a Poisson-subsampled Gaussian over T steps costs about
-- T^1.5 per evaluation (its sparse self-composition computes size**T as a big integer), and a
-- calibration evaluates it up to about thirty times: 9 to 20 s at 3e6 steps, 60 to 120 s at
-- 1e7 on one core of the development machine. Everything else takes about a second.
CREATE OR REPLACE FUNCTION dpsql_internal._accountant_seconds(request jsonb)
RETURNS float8 LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN request->>'scheme' = 'poisson' AND (request->>'sampling_rate')::float8 < 1
                THEN CASE request->>'op' WHEN 'calibrate' THEN 20 ELSE 1.5 END
                     * ((request->>'steps')::float8 / 3e6) ^ 1.5
                ELSE 0 END
$$;

-- Ask the dp-accounting accountant (dpsql/accounting.py) for a DP-SGD calibration or epsilon.
CREATE OR REPLACE FUNCTION dpsql_internal._account(request jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    answer jsonb;
    predicted float8 := dpsql_internal._accountant_seconds(request);
    limit_s float8 := coalesce((SELECT setting::float8 FROM pg_settings
                                WHERE name = 'dpsql.accountant_timeout'), 300);
    lock_timeout text := current_setting('lock_timeout');
BEGIN
    SELECT a.answer INTO answer FROM dpsql.accountant_answers a WHERE a.request = _account.request;
    IF FOUND THEN
        RETURN answer;
    END IF;
    -- refused before it runs (and before the caller charges anything): it would time out
    IF limit_s > 0 AND predicted > limit_s THEN
        PERFORM dpsql_internal._fail(
            format('the accountant would need about %s s for %s steps, more than '
                   'dpsql.accountant_timeout (%s s)', round(predicted::numeric),
                   request->>'steps', limit_s),
            '54000',
            'Raise epsilon, train fewer epochs or with larger batches (fewer steps), or have a '
            'superuser raise dpsql.accountant_timeout.');
    END IF;
    -- seconds of work the first time a configuration is asked: say so
    RAISE NOTICE 'dpsql: calibrating the noise with the accountant (a new configuration)';
    answer := dpsql_internal._accountant(request::text)::jsonb;
    IF answer ? 'error' THEN
        PERFORM dpsql_internal._fail('the accountant refused: ' || (answer->>'error'));
    END IF;
    -- Kept for the next call, unless another transaction is storing the same answer: its
    -- uncommitted row would make this insert wait for it to end, and an open transaction of
    -- another role (a preview or a release left open) must not hold this release up.
    BEGIN
        PERFORM set_config('lock_timeout', '1ms', true);  -- (undone with the block on a conflict)
        INSERT INTO dpsql.accountant_answers (request, answer) VALUES (request, answer)
            ON CONFLICT DO NOTHING;
        PERFORM set_config('lock_timeout', lock_timeout, true);
    EXCEPTION WHEN lock_not_available THEN
        NULL;  -- the other transaction stores it
    END;
    RETURN answer;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._whitebox_plan(text, jsonb, bigint, float8, float8, jsonb);
-- The SGD family's plans: noise, clipping, step schedule, sampling and accounting of a
-- white-box mechanism for a prepared run of `rows` rows (m public), each mechanism's own
-- function, named by its spec (sgd_plan_function; 31_mechanisms.sql):
--   dpsql_internal.<sgd_plan_function>(privacy text, spec jsonb, rows bigint, epsilon float8,
--                                      delta float8, params jsonb) -> dpsql_internal.sgd_plan
-- (30_runs.sql); its info's keys go into the model's provenance. _whitebox_plan checks what
-- every one needs.
CREATE OR REPLACE FUNCTION dpsql_internal._whitebox_plan(privacy text, spec jsonb, rows bigint, epsilon float8,
                                     delta float8, params jsonb)
RETURNS dpsql_internal.sgd_plan LANGUAGE plpgsql AS $$
DECLARE
    fn text := (dpsql_internal._mechanism(privacy)).sgd_plan_function;
    plan dpsql_internal.sgd_plan;
BEGIN
    IF fn IS NULL THEN
        PERFORM dpsql_internal._fail(format('%s has no SGD plan', quote_literal(privacy)), 'XX000');
    END IF;
    IF rows / (spec->>'batch_size')::bigint < 1 THEN
        PERFORM dpsql_internal._fail(format('%s rows make no batch of %s', rows, spec->>'batch_size'));
    END IF;
    EXECUTE format('SELECT * FROM dpsql_internal.%I($1, $2, $3, $4, $5, $6)', fn)
       INTO plan USING privacy, spec, rows, epsilon, delta, params;
    RETURN plan;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._dpsgd_plan(text, jsonb, bigint, float8, float8, jsonb);
-- DP-SGD (Abadi et al. 2016): per-example clipping, Gaussian noise per step, shuffled or
-- Poisson batches accounted by dp-accounting (and DPSGD-F's private mean composed with them).
CREATE OR REPLACE FUNCTION dpsql_internal._dpsgd_plan(privacy text, spec jsonb, rows bigint, epsilon float8,
                                                      delta float8, params jsonb)
RETURNS dpsql_internal.sgd_plan LANGUAGE plpgsql AS $$
DECLARE
    plan dpsql_internal.sgd_plan;
    b bigint := (spec->>'batch_size')::bigint;
    k int := (spec->>'epochs')::int;
    n bigint := rows / b;
    radius float8 := (spec->>'radius')::float8;
    clip float8;
    sampling text := coalesce(params->>'sampling', 'shuffle');
    z float8 := (params->>'noise_multiplier')::float8;
    acct jsonb;
BEGIN
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
    -- The event it accounted is the one the release charges (the ledger's dp_event).
    IF jsonb_typeof(acct->'ledger_event') IS DISTINCT FROM 'object' THEN
        PERFORM dpsql_internal._fail('the accountant did not say which event it accounted: '
                                     'its dpsql package is older than the extension',
                                     '55000', 'Install the same dpsql version for the server''s Python.');
    END IF;
    z := coalesce(z, (acct->>'noise_multiplier')::float8);
    plan.epsilon := coalesce(epsilon, (acct->>'epsilon')::float8);
    plan.delta := delta;
    plan.dp_event := acct->'ledger_event';
    plan.noise := 'gaussian';
    plan.noise_scale := z * clip;
    plan.noise_divisor := b;
    plan.clip_norm := clip;
    plan.schedule := spec->>'schedule';
    plan.step_size := coalesce((params->>'step_size')::float8, 0.5);
    plan.radius := radius;
    plan.sampling := sampling;
    plan.sampling_rate := CASE WHEN sampling = 'poisson' THEN b::float8 / rows END;
    -- on Citus shuffled batches are steps too: each row's step a keyed uniform draw
    -- (59_distributed_sampled.sql)
    plan.steps_per_epoch := CASE WHEN sampling = 'poisson' OR coalesce(spec->'distributed', 'null') <> 'null'
                                 THEN n ELSE 0 END;
    plan.info := jsonb_build_object(
            'algorithm', 'DP-SGD, per-example clipping, Gaussian noise per step',
            'noise_multiplier', z, 'clip_norm', clip, 'sampling', sampling,
            'accountant', acct - 'ledger_event', 'sensitivity', 2 * clip, 'noise_scale', z * clip,
            'neighbouring', 'replace-one (per-step sensitivity 2 C), m public');
    RETURN plan;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._scs13_plan(text, jsonb, bigint, float8, float8, jsonb);
-- SCS13 (Song, Chaudhuri and Sarwate 2013): k passes, noise on each step's gradient sum.
CREATE OR REPLACE FUNCTION dpsql_internal._scs13_plan(privacy text, spec jsonb, rows bigint, epsilon float8,
                                                      delta float8, params jsonb)
RETURNS dpsql_internal.sgd_plan LANGUAGE plpgsql AS $$
DECLARE
    plan dpsql_internal.sgd_plan;
    model text := spec->>'model';
    lambda float8 := (spec->>'lambda')::float8;
    b bigint := (spec->>'batch_size')::bigint;
    k int := (spec->>'epochs')::int;
    n bigint := rows / b;
    c record := dpsql.loss_constants(model, 0, 0, dpsql_internal._huber_h(spec));
    clip float8;
    radius float8 := (spec->>'radius')::float8;
    scs record;
BEGIN
    PERFORM dpsql_internal._binary_or_multinomial(privacy, spec);
    -- Per pass epsilon/k (basic composition over passes; one batch per record per pass);
    -- noise on the gradient SUM with sensitivity 2 L, then divided by b; steps 1/sqrt(t).
    clip := c.lipschitz_data;
    scs := dpsql_internal._scs13_step_noise(2 * clip, epsilon, delta, k, 1,
                                            coalesce(params->>'gaussian', 'analytic'));
    plan.epsilon := epsilon;
    plan.delta := delta;
    plan.noise := CASE WHEN delta = 0 THEN 'gamma_norm' ELSE 'gaussian' END;
    plan.noise_scale := scs.noise;
    plan.noise_divisor := b;
    plan.clip_norm := clip;
    plan.schedule := 'sqrt';
    plan.step_size := 1.0;
    plan.radius := CASE WHEN lambda > 0 THEN 1 / lambda ELSE radius END;
    -- on Citus each row's step a keyed uniform draw, as shuffled DP-SGD's there: every row in
    -- exactly one step a pass (59_distributed_sampled.sql)
    plan.sampling := 'shuffle';
    plan.steps_per_epoch := CASE WHEN coalesce(spec->'distributed', 'null') <> 'null' THEN n ELSE 0 END;
    plan.info := jsonb_build_object(
        'algorithm', 'SCS13 (Song, Chaudhuri, Sarwate 2013), k passes',
        'epsilon_per_pass', scs.epsilon_pass, 'delta_per_pass', scs.delta_pass,
        'sensitivity', 2 * clip,
        'neighbouring', 'replace-one, m public');
    RETURN plan;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._bst14_plan(text, jsonb, bigint, float8, float8, jsonb);
-- BST14 (Bassily, Smith and Thakurta 2014), Algorithms 4 and 5: draws with replacement.
CREATE OR REPLACE FUNCTION dpsql_internal._bst14_plan(privacy text, spec jsonb, rows bigint, epsilon float8,
                                                      delta float8, params jsonb)
RETURNS dpsql_internal.sgd_plan LANGUAGE plpgsql AS $$
DECLARE
    plan dpsql_internal.sgd_plan;
    model text := spec->>'model';
    lambda float8 := (spec->>'lambda')::float8;
    b bigint := (spec->>'batch_size')::bigint;
    k int := (spec->>'epochs')::int;
    n bigint := rows / b;
    c record := dpsql.loss_constants(model, 0, 0, dpsql_internal._huber_h(spec));
    clip float8;
    radius float8 := (spec->>'radius')::float8;
    bst record;
    sigma float8;
    lip float8;
    g float8;
BEGIN
    PERFORM dpsql_internal._binary_or_multinomial(privacy, spec);
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
    plan.epsilon := epsilon;
    plan.delta := delta;
    plan.noise := 'gaussian';
    plan.noise_scale := sigma;
    plan.noise_divisor := b;
    plan.clip_norm := clip;
    plan.schedule := CASE WHEN lambda > 0 THEN 'inverse' ELSE 'sqrt' END;
    -- average form: eta_t = 1/(gamma t) (Alg. 5); b * 2R/(G sqrt t) (Alg. 4, sum form)
    plan.step_size := CASE WHEN lambda > 0 THEN 1 / lambda ELSE b * 2 * radius / g END;
    plan.radius := radius;
    plan.sampling := 'replacement';
    plan.steps_per_epoch := n;
    plan.info := jsonb_build_object(
            'algorithm', CASE WHEN lambda > 0 THEN 'BST14 Algorithm 5 (strongly convex)'
                              ELSE 'BST14 Algorithm 4 (convex)' END,
            'epsilon_1', bst.epsilon_1, 'epsilon_2', bst.epsilon_2, 'delta_1', bst.delta_1, 'G', g,
            'bst14_noise', coalesce(params->>'bst14_noise', 'strict'),
            'note', 'advanced composition as printed: the total delta slightly exceeds delta',
            'sensitivity', CASE WHEN coalesce(params->>'bst14_noise', 'strict') = 'strict'
                                THEN 2 * clip ELSE 1 END);
    RETURN plan;
END $$;

-- SCS13 and BST14 train binary or multinomial models, not one-vs-rest.
CREATE OR REPLACE FUNCTION dpsql_internal._binary_or_multinomial(privacy text, spec jsonb)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF spec->>'model' IN ('logistic', 'huber')
       AND coalesce(jsonb_array_length(nullif(spec->'classes', 'null')), 1) > 2 THEN
        PERFORM dpsql_internal._fail(privacy || ' trains binary or multinomial models here, not one-vs-rest');
    END IF;
END $$;

-- The expected norm of the noise on one step's mean gradient with batch b, in units of the
-- gradient bound, for the defaults' batch rule (quiet_steps, 34_defaults.sql): each
-- mechanism's, named by its spec (step_noise_function).
-- DP-SGD: shuffled disjoint batches, k Gaussian mechanisms per row, noise multiplier z of C
-- (the caller's, or calibrated to epsilon); Poisson batches are amplified: 0, the rule does
-- not apply.
CREATE OR REPLACE FUNCTION dpsql_internal._dpsgd_batch_noise(params jsonb, m bigint, b bigint, k int)
RETURNS float8 LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(params->>'sampling', 'shuffle') <> 'shuffle' THEN
        RETURN 0;
    END IF;
    RETURN coalesce((params->>'noise_multiplier')::float8, (dpsql_internal._account(jsonb_build_object(
        'op', 'calibrate', 'scheme', 'shuffle', 'delta', coalesce((params->>'delta')::float8, 0),
        'target_epsilon', (params->>'epsilon')::float8, 'noise_multiplier', NULL,
        'epochs', (params->>'epochs')::int, 'steps', NULL, 'sampling_rate', NULL))
        ->>'noise_multiplier')::float8) * sqrt(k) / b;
END $$;

-- SCS13: (epsilon, delta) / epochs per pass on the sum, sensitivity 2 L.
CREATE OR REPLACE FUNCTION dpsql_internal._scs13_batch_noise(params jsonb, m bigint, b bigint, k int)
RETURNS float8 LANGUAGE sql AS $$
    SELECT 2 * (dpsql_internal._scs13_step_noise(1, (params->>'epsilon')::float8,
                                                  coalesce((params->>'delta')::float8, 0),
                                                  (params->>'epochs')::int, k, 'analytic')).noise / b
$$;

-- BST14: replace-one, sensitivity 2 L.
CREATE OR REPLACE FUNCTION dpsql_internal._bst14_batch_noise(params jsonb, m bigint, b bigint, k int)
RETURNS float8 LANGUAGE sql AS $$
    SELECT 2 * (dpsql_internal._bst14_noise((params->>'epsilon')::float8,
                                            coalesce((params->>'delta')::float8, 0), m, b,
                                            (params->>'epochs')::int)).sigma * sqrt(k) / b
$$;

DROP FUNCTION IF EXISTS dpsql_internal._train_whitebox(dpsql.datasets, text, text, jsonb, float8, float8, bigint);
-- SCS13, BST14 and DP-SGD: the noise is added inside every step of the aggregate, from the
-- state's CSPRNG; the final model is the release (no output noise). The plan: the run
-- prepared, the mechanism's SGD plan (DP-SGD's epsilon may come from the accountant), the
-- state armed with it; _complete_whitebox runs the epochs after the charge.
CREATE OR REPLACE FUNCTION dpsql_internal._train_whitebox(ds dpsql.datasets, model text, privacy text, params jsonb,
                                      epsilon float8, delta float8, noise_seed bigint)
RETURNS dpsql_internal.release_plan LANGUAGE plpgsql AS $$
DECLARE
    p dpsql_internal.release_plan := ROW(NULL, '_complete_whitebox', ds, model, privacy, params, epsilon,
                                         delta, noise_seed, NULL, NULL, NULL, NULL);
BEGIN
    p.run := dpsql_internal._prepare_private(ds, model, params);
    p.sgd := dpsql_internal._whitebox_plan(privacy, (p.run).spec, (p.run).rows, epsilon, coalesce(delta, 0), params);
    p.sgd := dpsql_internal._audit_plan((p.run).spec, (p.run).rows, p.sgd);  -- a superuser's test switch (52_audit.sql)
    p.run := dpsql_internal._arm(p.run, p.sgd, noise_seed);
    -- DP-SGD charges the event its accountant composed (the plan's dp_event); the others record
    -- (epsilon, delta)
    p.charge := ROW(ds.dataset_id, (p.sgd).epsilon, (p.sgd).delta, privacy, NULL, (p.sgd).dp_event, to_jsonb(p.sgd),
                    false)::dpsql_internal.release_charge;
    RETURN p;
END $$;

-- A white-box release after its charge: the rows read, the epochs, the model.
CREATE OR REPLACE FUNCTION dpsql_internal._complete_whitebox(p dpsql_internal.release_plan, entry bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    run bigint := dpsql_internal._start_run(dpsql_internal._read_rows(p.run));
    mid bigint;
BEGIN
    mid := dpsql_internal._finish(run, dpsql_internal._run_epochs(run),
                         (p.sgd).info || jsonb_build_object(
        'mechanism', p.privacy, 'dataset_id', (p.ds).dataset_id, 'epsilon', (p.sgd).epsilon,
        'delta', (p.sgd).delta, 'noise_scale', (p.sgd).noise_scale, 'ledger_entry', entry,
        'noise_seed', dpsql_internal._noise_source(p.noise_seed)));
    PERFORM dpsql_internal._set_ledger_model(entry, mid);
    RETURN mid;
END $$;
