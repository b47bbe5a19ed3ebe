------------------------------------------------------------------------------------------
-- Output perturbation of the exact regularised minimiser (Chaudhuri,
-- Monteleoni and Sarwate 2011): minimise sum_i l + (reg/2) ||theta||^2 by the certified Newton
-- solver (45_erm_solver.sql), then add noise for the replace-one sensitivity
-- 2 (L + tolerance) / reg (dpsql_output_perturbation_sensitivity, objective.h): Gamma-norm for
-- epsilon-DP, the analytic Gaussian with delta > 0. With reg = n lambda it is the bolt-on's
-- strongly convex sensitivity 2L / (lambda m) for the exact minimiser (tests check both agree).
-- docs/objective_perturbation.md.
------------------------------------------------------------------------------------------

-- E||b||^2 / sensitivity^2 of a p-dimensional noise draw at (epsilon, delta) / shares: the
-- Gamma-norm noise's p (p + 1) (shares / epsilon)^2, or p times the classic Gaussian's
-- variance 2 ln(1.25 shares / delta) (shares / epsilon)^2 (C core: dpsql_noise_sq_norm,
-- noise.h, beside the classic sigma).
CREATE OR REPLACE FUNCTION dpsql_internal._noise_sq_norm(dim int, epsilon float8, delta float8,
                                                         shares int)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_noise_sq_norm_sql'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

DROP FUNCTION IF EXISTS dpsql_internal._outpert_plan(text, dpsql.datasets, bigint, int, float8, float8, jsonb);
-- The plan: reg = n lambda if the analyst gave lambda > 0, else the utility choice below
-- (radius a public bound on ||theta*||: options.radius; default for classifiers
-- _erm_default_radius, for regression max(10, 2Y)).
CREATE OR REPLACE FUNCTION dpsql_internal._outpert_plan(privacy text, ds dpsql.datasets, n bigint,
                                                        d int, epsilon float8, delta float8,
                                                        params jsonb)
RETURNS dpsql_internal.erm_plan LANGUAGE plpgsql AS $$
DECLARE
    options jsonb := dpsql_internal._plan_options(privacy, params);
    plan dpsql_internal.erm_plan := dpsql_internal._glm_plan(privacy, ds, n, d, params, options);
    radius float8 := plan.radius;
    lambda float8 := plan.lambda;
    lipschitz float8 := plan.lipschitz;
    tolerance float8 := plan.tolerance;
    ovr record;
    outputs int;
    p int := plan.p;
    k float8;
    reg float8;
    sensitivity float8;
BEGIN
    IF NOT (epsilon > 0 AND epsilon < 'Infinity') OR NOT (delta >= 0 AND delta < 1) THEN
        PERFORM dpsql_internal._fail('output perturbation needs epsilon > 0 and 0 <= delta < 1');
    END IF;
    -- one-vs-rest: C binary models on all the rows, (epsilon, delta) / C each (basic composition)
    ovr := dpsql_internal._one_vs_rest(params->>'model', plan.classes, epsilon, delta);
    outputs := ovr.models;
    -- Default reg: the minimiser of the smooth loss's second-order excess
    -- (1/2) n beta E||b||^2 + (reg/2) R^2 with E||b||^2 = (2L/reg)^2 k, k = p(p+1)/eps^2
    -- (Gamma-norm) or 2 p ln(1.25/delta)/eps^2 (the classic Gaussian's variance, an estimate
    -- of the analytic one's), per model: reg^3 = 8 n beta L^2 k / R^2 (_noise_sq_norm).
    -- Card A10's first-order L sqrt(2np/eps)/R charges every row L ||b|| and so over-regularises
    -- by 1.2-2.5x at n = 400-70000: on one-hot rows (entries 1/sqrt(k) after clipping) the
    -- model then predicted the majority class at every epsilon.
    k := dpsql_internal._noise_sq_norm(p, epsilon, delta, outputs);
    IF plan.radius_default THEN
        -- the largest radius whose excess-loss bound at the reg below, (3/4) (8 n beta L^2
        -- k)^(1/3) R^(4/3), stays below the zero model's loss (45_erm_solver.sql)
        radius := dpsql_internal._erm_default_radius(
            dpsql_internal._erm_zero_loss(plan.loss, n, plan.y_bound),
            0.75 * cbrt(8 * n * plan.curvature * lipschitz ^ 2 * k), 4.0 / 3);
        plan.radius := radius;
    END IF;
    reg := CASE WHEN lambda > 0 THEN n * lambda
                ELSE cbrt(8 * n * plan.curvature * lipschitz ^ 2 * k / radius ^ 2) END;
    -- the same refusal as objective perturbation's, with the second-order excess above
    PERFORM dpsql_internal._erm_refuse_useless(
        privacy, plan.loss, n, lambda,
        2 * n * plan.curvature * lipschitz ^ 2 * k / reg ^ 2 + reg * radius ^ 2 / 2,
        epsilon, outputs, plan.y_bound);
    PERFORM dpsql_internal._erm_refuse_shrunk(privacy, n, p, reg, plan.curvature,
                                              plan.radius_default, outputs,
                                              epsilon);
    sensitivity := dpsql_internal._output_perturbation_sensitivity(lipschitz, reg, tolerance);
    plan.outputs := outputs;
    plan.regularizer := reg;
    plan.sensitivity := sensitivity;
    plan.epsilon := ovr.model_epsilon;
    plan.delta := ovr.model_delta;
    plan.info := jsonb_build_object(
        'algorithm', 'output perturbation (Chaudhuri et al. 2011) of the regularised minimiser, '
                     'certified by Newton''s method',
        'noise', CASE WHEN delta > 0 THEN 'gaussian (analytic)' ELSE 'gamma-norm' END,
        'sensitivity', sensitivity, 'regularizer', reg, 'lipschitz', lipschitz,
        'tolerance', tolerance, 'radius', radius, 'one_vs_rest', outputs > 1,
        'model_epsilon', ovr.model_epsilon, 'model_delta', ovr.model_delta,
        'neighbouring', 'replace-one, n public');
    RETURN plan;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._outpert_fit(text, jsonb, bigint);
CREATE OR REPLACE FUNCTION dpsql_internal._outpert_fit(train_table text, plan dpsql_internal.erm_plan, noise_seed bigint,
                                                       OUT weights float8[], OUT info jsonb,
                                                       OUT iterates float8[])
LANGUAGE plpgsql AS $$
DECLARE
    outputs int := plan.outputs;
    sol record;
    rel record;
BEGIN
    weights := '{}';
    iterates := NULL;
    FOR c IN 0 .. outputs - 1 LOOP
        -- scans and certificate are not released (50_objective_perturbation.sql)
        sol := dpsql_internal._erm_solve(train_table, plan, NULL, CASE WHEN outputs > 1 THEN c END);
        rel := dpsql_internal._perturb(sol.theta, plan.sensitivity,
                                       plan.epsilon, plan.delta,
                                       noise_seed, 1 + c);
        weights := CASE WHEN outputs > 1 THEN weights || ARRAY[rel.weights] ELSE rel.weights END;
    END LOOP;
    info := jsonb_build_object('noise_scale', rel.noise_scale);
END $$;
