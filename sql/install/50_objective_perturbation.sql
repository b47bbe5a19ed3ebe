------------------------------------------------------------------------------------------
-- Objective perturbation (Thakurta, "Private Optimization", §6.2.2, Algorithm 2;
-- Chaudhuri, Monteleoni and Sarwate 2011; the
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

DROP FUNCTION IF EXISTS dpsql_internal._objpert_plan(text, dpsql.datasets, bigint, int, float8, float8, jsonb);
-- The plan: the GLM, the calibration and the regulariser
-- reg = max(Delta_priv, n lambda if the analyst gave lambda > 0, else the utility choice
-- 2 sqrt(E ||b||^2) / radius, radius a public bound on ||theta*|| (options.radius; default
-- for classifiers _erm_default_radius, for regression max(10, 2Y))).
CREATE OR REPLACE FUNCTION dpsql_internal._objpert_plan(privacy text, ds dpsql.datasets, n bigint,
                                                        d int, epsilon float8, delta float8,
                                                        params jsonb)
RETURNS dpsql_internal.erm_plan LANGUAGE plpgsql AS $$
DECLARE
    options jsonb := dpsql_internal._plan_options(privacy, params);
    plan dpsql_internal.erm_plan := dpsql_internal._glm_plan(privacy, ds, n, d, params, options);
    cal record;
    radius float8 := plan.radius;
    lambda float8 := plan.lambda;
    ovr record;
    outputs int;
    reg float8;
BEGIN
    -- one-vs-rest: C binary models on all the rows, (epsilon, delta) / C each (basic composition)
    ovr := dpsql_internal._one_vs_rest(params->>'model', plan.classes, epsilon, delta);
    outputs := ovr.models;
    cal := dpsql_internal._objpert_calibrate(ovr.model_epsilon, ovr.model_delta, plan.p,
                                             plan.lipschitz,
                                             plan.curvature, n);
    IF plan.radius_default THEN
        -- the largest radius whose excess-loss bound 2 sqrt(E||b||^2) R (the bound below at
        -- reg = 2 sqrt(E||b||^2) / R) stays below the zero model's loss (45_erm_solver.sql)
        radius := dpsql_internal._erm_default_radius(
            dpsql_internal._erm_zero_loss(plan.loss, n, plan.y_bound),
            2 * sqrt(cal.noise_sq_norm), 1);
        plan.radius := radius;
    END IF;
    reg := greatest(cal.min_reg, CASE WHEN lambda > 0 THEN n * lambda
                                      ELSE 2 * sqrt(cal.noise_sq_norm) / radius END);
    -- At the default regulariser: refused before any charge when the expected excess-loss
    -- bound 2 E||b||^2 / reg + (reg/2) R^2 (card A2, per model) is far above the zero model's
    -- loss (_erm_refuse_useless): there (e.g. ten one-vs-rest models at epsilon 1 / 10 each on
    -- 1,258 rows, or 310 rows of labels up to 400) the releases were no better than trivial.
    PERFORM dpsql_internal._erm_refuse_useless(
        privacy, plan.loss, n, lambda,
        2 * cal.noise_sq_norm / reg + reg * radius ^ 2 / 2, epsilon, outputs, plan.y_bound);
    PERFORM dpsql_internal._erm_refuse_shrunk(privacy, n, plan.p, reg,
                                              plan.curvature,
                                              plan.radius_default, outputs, epsilon);
    plan.outputs := outputs;
    plan.regularizer := reg;
    plan.tolerance := cal.tolerance;
    plan.noise_scale := cal.noise_scale;
    plan.eps_noise := cal.eps_noise;
    plan.eps_extra := cal.eps_extra;
    plan.delta_extra := cal.delta_extra;
    plan.gaussian := delta > 0;
    plan.extra_sensitivity := 2 * cal.tolerance / reg;
    plan.info := jsonb_build_object(
        'algorithm', 'objective perturbation (Thakurta, Private Optimization, Algorithm 2): exact minimiser of the perturbed, '
                     'regularised SUM loss by Newton''s method, certified ||grad J|| <= tolerance',
        'loss', CASE plan.loss WHEN 1 THEN 'logistic' WHEN 2 THEN 'huber svm'
                                          ELSE 'huber regression' END,
        'noise', CASE WHEN delta > 0 THEN 'gaussian (GLM variant)' ELSE 'gamma-norm' END,
        'noise_scale', cal.noise_scale, 'regularizer', reg, 'min_regularizer', cal.min_reg,
        'lipschitz', plan.lipschitz, 'curvature', plan.curvature,
        'epsilon_split', jsonb_build_object('noise', cal.eps_noise, 'jacobian', cal.eps_det,
                                            'certificate', cal.eps_extra),
        'delta_split', jsonb_build_object('noise', cal.delta_noise, 'certificate', cal.delta_extra),
        'tolerance', cal.tolerance, 'radius', radius, 'one_vs_rest', outputs > 1,
        'model_epsilon', ovr.model_epsilon, 'model_delta', ovr.model_delta,
        'huber_threshold', CASE WHEN plan.loss = 3 THEN plan.param END,
        'neighbouring', 'replace-one, n public');
    RETURN plan;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._objpert_fit(text, jsonb, bigint);
CREATE OR REPLACE FUNCTION dpsql_internal._objpert_fit(train_table text, plan dpsql_internal.erm_plan, noise_seed bigint,
                                                       OUT weights float8[], OUT info jsonb,
                                                       OUT iterates float8[])
LANGUAGE plpgsql AS $$
DECLARE
    p int := plan.p;
    outputs int := plan.outputs;
    zero float8[] := array_fill(0::float8, ARRAY[p]);
    b float8[];
    sol record;
    rel record;
    scales float8[] := '{}';
BEGIN
    weights := '{}';
    iterates := NULL;
    FOR c IN 0 .. outputs - 1 LOOP
        -- The secret linear term (never leaves the server); streams keep the draws apart.
        IF plan.gaussian THEN
            b := dpsql_internal._add_gaussian(zero, plan.noise_scale, noise_seed, 1 + 2 * c);
        ELSE
            -- density exp(-eps_noise ||b|| / (2L)): scale 2L / eps_noise
            b := (dpsql_internal._perturb(zero, 2 * plan.lipschitz,
                                          plan.eps_noise, 0, noise_seed, 1 + 2 * c)).weights;
        END IF;
        -- Its scan count and certificate depend on the rows: neither is released, and an
        -- uncertified last iterate is released like a certified one (45_erm_solver.sql).
        sol := dpsql_internal._erm_solve(train_table, plan, b,
                                         CASE WHEN outputs > 1 THEN c END);
        rel := dpsql_internal._perturb(sol.theta, plan.extra_sensitivity,
                                       plan.eps_extra, plan.delta_extra,
                                       noise_seed, 2 + 2 * c);
        weights := CASE WHEN outputs > 1 THEN weights || ARRAY[rel.weights] ELSE rel.weights END;
        scales := scales || rel.noise_scale;
    END LOOP;
    info := jsonb_build_object('extra_noise_scale', scales[1]);
END $$;
