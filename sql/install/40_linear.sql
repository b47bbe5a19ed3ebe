------------------------------------------------------------------------------------------
-- DP linear regression (docs/linear.md): DP-AMBSSGD and DP-SSGD (Varshney et al. 2022),
-- DP-GD with confidence intervals (Brown et al. 2024) and AdaSSP. All are compositions of Gaussian
-- mechanisms, calibrated in zero-concentrated DP (rho-zCDP) under replace-one neighbours with
-- public n.
-- This file holds what they share; each mechanism's plan and fit are in its own file
-- (41_ambssgd.sql, 42_dpgd.sql, 43_adassp.sql), found through the registry.
------------------------------------------------------------------------------------------

-- The largest rho whose zCDP -> (epsilon, delta) conversion rho + 2 sqrt(rho ln(1/delta)) is at
-- most epsilon (Bun-Steinke Prop. 1.3; Varshney et al. 2022,
-- Theorem 9; Brown et al. 2024, Claim A.6), and back. C core:
-- core/composition.h.
CREATE OR REPLACE FUNCTION dpsql.zcdp_rho(epsilon float8, delta float8)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_zcdp_rho_sql'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION dpsql.zcdp_rho(float8, float8) IS
    'Largest rho such that rho-zCDP implies (epsilon, delta)-DP';

CREATE OR REPLACE FUNCTION dpsql.zcdp_epsilon(rho float8, delta float8)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_zcdp_epsilon_sql'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION dpsql.zcdp_epsilon(float8, float8) IS 'epsilon of rho-zCDP at delta';

-- The Gaussian noise std of every zCDP release: L2 sensitivity Delta, (rho / shares)-zCDP
-- (one of `shares` equal releases), sigma = Delta / sqrt(2 rho / shares). C core:
-- dpsql_zcdp_sigma, core/composition.h.
CREATE OR REPLACE FUNCTION dpsql_internal._zcdp_sigma(sensitivity float8, rho float8,
                                                      shares float8 DEFAULT 1)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_zcdp_sigma_sql'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

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
    EXECUTE format('SELECT to_jsonb(dpsql_internal.%I($1, $2, $3, $4, $5, $6, $7))', plan_function)
       INTO plan USING privacy, ds, n, d, epsilon, delta, params;
    RETURN plan;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._train_linear(dpsql.datasets, text, text, jsonb, float8, float8, bigint);
-- Plan a linear mechanism's release on a registered regression dataset (the registered train
-- function of the linear mechanisms): their common checks, then the plan (33_planned.sql).
CREATE OR REPLACE FUNCTION dpsql_internal._train_linear(ds dpsql.datasets, model text, privacy text,
                                               params jsonb, epsilon float8, delta float8,
                                               noise_seed bigint)
RETURNS dpsql_internal.release_plan LANGUAGE plpgsql AS $$
BEGIN
    -- (a classification dataset is refused before: _check_dataset_model, 35_private.sql)
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
    idx int[];
    est float8[];
    lo float8[];
    hi float8[];
    worth float8;
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
    -- widened for the draws' correlation, withheld below 2 effective draws (42_dpgd.sql)
    SELECT array_agg(t.coef_index ORDER BY t.coef_index), array_agg(t.estimate ORDER BY t.coef_index),
           array_agg(t.lower ORDER BY t.coef_index), array_agg(t.upper ORDER BY t.coef_index),
           min(t.effective_draws)
      INTO idx, est, lo, hi, worth
      FROM dpsql_internal._confint_rows(its, ci->>'method', (ci->>'draws')::int, (ci->>'burn_in')::int, alpha) t;
    IF worth < 2 THEN
        RAISE WARNING 'dpsql: model %''s draws correlate so much (% between draws) that they are worth % independent ones: its intervals are withheld (NULL)',
                      model_id, round((ci->>'draw_autocorrelation')::numeric, 2), round(worth::numeric, 1)
            USING HINT = 'Scale the features to be close to isotropic, or use a larger step_size and more steps (docs/linear.md).';
    ELSIF (ci->>'mixed')::boolean IS FALSE THEN
        RAISE NOTICE 'dpsql: model %''s run had not mixed (% between draws): its intervals are widened to % effective draws',
                     model_id, round((ci->>'draw_autocorrelation')::numeric, 2), round(worth::numeric, 1);
    END IF;
    RETURN QUERY SELECT * FROM unnest(idx, est, lo, hi);
END $$;
COMMENT ON FUNCTION dpsql.confint(bigint, float8) IS
    'Student-t confidence intervals of a DP-GD model''s coefficients (from its released iterates)';
