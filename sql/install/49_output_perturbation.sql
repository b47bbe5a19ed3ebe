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

-- The plan: reg = n lambda if the analyst gave lambda > 0, else the utility choice below
-- (radius a public bound on ||theta*||: options.radius; default for classifiers
-- _erm_default_radius, for regression max(10, 2Y)).
CREATE OR REPLACE FUNCTION dpsql_internal._outpert_plan(privacy text, ds dpsql.datasets, n bigint,
                                                        d int, epsilon float8, delta float8,
                                                        params jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    options jsonb := dpsql_internal._plan_options(privacy, params);
    glm jsonb := dpsql_internal._glm_plan(privacy, ds, n, d, params, options);
    radius float8 := (glm->>'radius')::float8;
    lambda float8 := (glm->>'lambda')::float8;
    lipschitz float8 := (glm->>'lipschitz')::float8;
    tolerance float8 := (glm->>'tolerance')::float8;
    ovr record;
    outputs int;
    p int := (glm->>'p')::int;
    k float8;
    reg float8;
    sensitivity float8;
BEGIN
    IF NOT (epsilon > 0 AND epsilon < 'Infinity') OR NOT (delta >= 0 AND delta < 1) THEN
        PERFORM dpsql_internal._fail('output perturbation needs epsilon > 0 and 0 <= delta < 1');
    END IF;
    -- one-vs-rest: C binary models on all the rows, (epsilon, delta) / C each (basic composition)
    ovr := dpsql_internal._one_vs_rest(params->>'model', (glm->>'classes')::int, epsilon, delta);
    outputs := ovr.models;
    -- Default reg: the minimiser of the smooth loss's second-order excess
    -- (1/2) n beta E||b||^2 + (reg/2) R^2 with E||b||^2 = (2L/reg)^2 k, k = p(p+1)/eps^2
    -- (Gamma-norm) or 2 p ln(1.25/delta)/eps^2 (the classic Gaussian's variance, an estimate
    -- of the analytic one's), per model: reg^3 = 8 n beta L^2 k / R^2 (_noise_sq_norm).
    -- Card A10's first-order L sqrt(2np/eps)/R charges every row L ||b|| and so over-regularises
    -- by 1.2-2.5x at n = 400-70000: on one-hot rows (entries 1/sqrt(k) after clipping) the
    -- model then predicted the majority class at every epsilon.
    k := dpsql_internal._noise_sq_norm(p, epsilon, delta, outputs);
    IF (glm->>'radius_default')::boolean THEN
        -- the largest radius whose excess-loss bound at the reg below, (3/4) (8 n beta L^2
        -- k)^(1/3) R^(4/3), stays below the zero model's loss (45_erm_solver.sql)
        radius := dpsql_internal._erm_default_radius(
            dpsql_internal._erm_zero_loss((glm->>'loss')::int, n, (glm->>'y_bound')::float8),
            0.75 * cbrt(8 * n * (glm->>'curvature')::float8 * lipschitz ^ 2 * k), 4.0 / 3);
        glm := glm || jsonb_build_object('radius', radius);
    END IF;
    reg := CASE WHEN lambda > 0 THEN n * lambda
                ELSE cbrt(8 * n * (glm->>'curvature')::float8 * lipschitz ^ 2 * k / radius ^ 2) END;
    -- the same refusal as objective perturbation's, with the second-order excess above
    PERFORM dpsql_internal._erm_refuse_useless(
        privacy, (glm->>'loss')::int, n, lambda,
        2 * n * (glm->>'curvature')::float8 * lipschitz ^ 2 * k / reg ^ 2 + reg * radius ^ 2 / 2,
        epsilon, outputs, (glm->>'y_bound')::float8);
    PERFORM dpsql_internal._erm_refuse_shrunk(privacy, n, p, reg, (glm->>'curvature')::float8,
                                              (glm->>'radius_default')::boolean, outputs,
                                              epsilon);
    sensitivity := dpsql_internal._output_perturbation_sensitivity(lipschitz, reg, tolerance);
    RETURN glm || jsonb_build_object(
        'outputs', outputs, 'regularizer', reg, 'sensitivity', sensitivity,
        'epsilon', ovr.model_epsilon, 'delta', ovr.model_delta,
        'info', jsonb_build_object(
            'algorithm', 'output perturbation (Chaudhuri et al. 2011) of the regularised minimiser, '
                         'certified by Newton''s method',
            'noise', CASE WHEN delta > 0 THEN 'gaussian (analytic)' ELSE 'gamma-norm' END,
            'sensitivity', sensitivity, 'regularizer', reg, 'lipschitz', lipschitz,
            'tolerance', tolerance, 'radius', radius, 'one_vs_rest', outputs > 1,
            'model_epsilon', ovr.model_epsilon, 'model_delta', ovr.model_delta,
            'neighbouring', 'replace-one, n public'));
END $$;

CREATE OR REPLACE FUNCTION dpsql_internal._outpert_fit(train_table text, plan jsonb, noise_seed bigint,
                                                       OUT weights float8[], OUT info jsonb,
                                                       OUT iterates float8[])
LANGUAGE plpgsql AS $$
DECLARE
    outputs int := (plan->>'outputs')::int;
    sol record;
    rel record;
BEGIN
    weights := '{}';
    iterates := NULL;
    FOR c IN 0 .. outputs - 1 LOOP
        -- scans and certificate are not released (50_objective_perturbation.sql)
        sol := dpsql_internal._erm_solve(train_table, plan, NULL, CASE WHEN outputs > 1 THEN c END);
        rel := dpsql_internal._perturb(sol.theta, (plan->>'sensitivity')::float8,
                                       (plan->>'epsilon')::float8, (plan->>'delta')::float8,
                                       noise_seed, 1 + c);
        weights := CASE WHEN outputs > 1 THEN weights || ARRAY[rel.weights] ELSE rel.weights END;
    END LOOP;
    info := jsonb_build_object('noise_scale', rel.noise_scale);
END $$;
