------------------------------------------------------------------------------------------
-- AdaSSP (Wang 2018, Algorithm 2; Brown et al. 2024's baseline, §4.1): DP linear regression by
-- sufficient-statistics perturbation with an adaptive ridge. C core: core/adassp.h
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

-- The plan of AdaSSP: what its fit needs, all public (its calibration in zCDP).
DO $$
BEGIN
    CREATE TYPE dpsql_internal.adassp_plan AS (
        epsilon float8, delta float8, rho float8, x_bound float8, y_bound float8,
        intercept boolean, dim int, rows bigint,
        -- x clipped to the row bound, then the 1 (the model's representation, 33_planned.sql);
        -- ||(x, 1)|| <= x_bound then holds without clipping the pair
        row_bound float8, intercept_after_row_transform boolean, row_clip_radius float8,
        sigma_min float8, sigma_xx float8, sigma_xy float8, min_shift float8, ridge_factor float8,
        info jsonb);
EXCEPTION WHEN duplicate_object THEN
    NULL;  -- (an upgrade replays this script; a change of its fields needs its ALTER TYPE)
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._adassp_plan(text, dpsql.datasets, bigint, int, float8, float8, jsonb);
-- AdaSSP's plan (its registered plan_function, called by _train_planned, 33_planned.sql).
CREATE OR REPLACE FUNCTION dpsql_internal._adassp_plan(privacy text, ds dpsql.datasets, n bigint, d int,
                                              epsilon float8, delta float8, params jsonb)
RETURNS dpsql_internal.adassp_plan LANGUAGE plpgsql AS $$
DECLARE
    options jsonb;
    intercept boolean;
    p int;
    rho float8;
    x_bound float8;
    sens record;
    sd float8;
    varrho float8;
    plan dpsql_internal.adassp_plan;
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
    sd := dpsql_internal._zcdp_sigma(1, rho, 3);  -- per unit of sensitivity
    varrho := dpsql_internal._linear_option(options, 'varrho', 0.05);
    IF varrho >= 1 THEN
        PERFORM dpsql_internal._fail('options.varrho must be in (0, 1)');
    END IF;
    plan.epsilon := epsilon;
    plan.delta := delta;
    plan.rho := rho;
    plan.x_bound := x_bound;
    plan.y_bound := ds.label_bound;
    plan.intercept := intercept;
    plan.dim := d;
    plan.rows := n;
    plan.row_bound := ds.row_bound;
    plan.intercept_after_row_transform := intercept;
    plan.row_clip_radius := ds.row_bound;
    plan.sigma_min := sens.lambda_min * sd;
    plan.sigma_xx := sens.xtx * sd;
    plan.sigma_xy := sens.xty * sd;
    plan.min_shift := sens.lambda_min * sd * sqrt(ln(6 / delta));
    plan.ridge_factor := sens.xtx * sd * sqrt(p * ln(2.0 * p * p / varrho));
    plan.info := jsonb_build_object(
        'algorithm', 'AdaSSP (Wang 2018, Algorithm 2): noisy X^T X, X^T y and lambda_min, adaptive ridge',
        'accounting', 'zCDP: three Gaussian releases of rho/3 each',
        'rho', rho, 'x_bound', x_bound, 'y_bound', ds.label_bound, 'varrho', varrho,
        'sensitivities', jsonb_build_object('lambda_min', sens.lambda_min, 'xtx', sens.xtx,
                                             'xty', sens.xty),
        'noise_std', jsonb_build_object('lambda_min', sens.lambda_min * sd,
                                         'xtx', sens.xtx * sd, 'xty', sens.xty * sd),
        'neighbouring', 'replace-one, n public');
    RETURN plan;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._adassp_fit(text, jsonb, bigint);
-- AdaSSP: one aggregate scan for X^T X, X^T y (rows clipped to the public bounds); the noise,
-- the adaptive ridge and the solve in the server.
CREATE OR REPLACE FUNCTION dpsql_internal._adassp_fit(train_table text, plan dpsql_internal.adassp_plan,
                                             noise_seed bigint, OUT weights float8[], OUT info jsonb,
                                             OUT iterates float8[])
LANGUAGE plpgsql AS $$
DECLARE
    gram float8[];
    rel record;
BEGIN
    -- x clipped to the row bound (_whiten_row with L = I: NULL for a malformed row, the zero
    -- record), so that the intercept's 1 enters after the clipping, as predict applies it
    EXECUTE format('SELECT dpsql.adassp_gram(dpsql_internal._whiten_row(x, $5, false, $6), y,'
                   ' $1, $2, $3, $4) FROM %s', train_table)
       INTO gram USING plan.x_bound, plan.y_bound, plan.intercept, plan.dim,
                       ARRAY(SELECT (i = j)::int::float8
                               FROM generate_series(1, plan.dim) i,
                                    generate_series(1, plan.dim) j ORDER BY i, j),
                       plan.row_bound;
    rel := dpsql_internal._adassp_release(gram, plan.sigma_min, plan.sigma_xx, plan.sigma_xy, plan.min_shift,
                                          plan.ridge_factor, noise_seed);
    weights := rel.weights;
    info := jsonb_build_object('ridge', rel.ridge, 'lambda_min_noisy', rel.lambda_min_noisy);
    iterates := NULL;
END $$;
