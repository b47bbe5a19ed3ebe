------------------------------------------------------------------------------------------
-- DP-GD for linear regression (spec 002): one aggregate scan per gradient step, the noisy
-- step in the server, and the confidence intervals built from released iterates. Then its
-- plan and fit.
------------------------------------------------------------------------------------------

-- The clipped gradient sum of one full-batch step. Rows: x_bound > 0 clips x to that norm,
-- intercept appends a feature 1 after it; a NULL or malformed record (NULL x or y, wrong
-- length, NULL elements, NaN/Inf) counts as a row and adds nothing. theta, gamma, intercept
-- and x_bound are the step's public constants (read on the first row).
CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_gradient_transition(state float8[], x float8[], y float8,
                                                           theta float8[], gamma float8,
                                                           intercept boolean, x_bound float8)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_dpgd_gradient_transition'
LANGUAGE C CALLED ON NULL INPUT PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_gradient_combine(a float8[], b float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_dpgd_gradient_combine'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_gradient_final(state float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_dpgd_gradient_final'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

-- Returns [sum_1 .. sum_p, n, clipped] (p = length of theta): the sum over rows of
-- x_i (<x_i, theta> - y_i) clipped to norm gamma (gamma = 'Infinity': no clipping), the row
-- count n, and the number of clipped gradients (a diagnostic, NOT private: never release it).
-- NULL when no row was scanned. Partial sums of a parallel scan add up (COMBINEFUNC).
CREATE OR REPLACE AGGREGATE dpsql.dpgd_gradient(x float8[], y float8, theta float8[], gamma float8,
                                                intercept boolean, x_bound float8) (
    SFUNC = dpsql_internal._dpgd_gradient_transition,
    STYPE = float8[],
    FINALFUNC = dpsql_internal._dpgd_gradient_final,
    COMBINEFUNC = dpsql_internal._dpgd_gradient_combine,
    PARALLEL = SAFE
);

-- theta - eta * sum / n + eta * z, z ~ N(0, noise_std^2 I), from dpgd_gradient's output
-- grad. The noise is keyed by pg_strong_random, or by seed (tests only: NOT private) with
-- stream separating the steps of a run.
CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_step(theta float8[], grad float8[], eta float8,
                                            noise_std float8, seed bigint DEFAULT NULL,
                                            stream bigint DEFAULT 0)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_dpgd_step_sql'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

-- The m draws of a confidence-interval method from released iterates (N x p, row k holds
-- theta_k): 'independent_runs' (the runs' iterates concatenated; the mean of each run's
-- iterates after the burn-in), 'checkpoints' (theta_{b + l B}, B = floor((N - b) / m)) or
-- 'batch_means' (means of m consecutive batches of B iterates after the burn-in).
CREATE OR REPLACE FUNCTION dpsql_internal._confint_draws(iterates float8[], method text, draws int,
                                                burn_in int)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_confint_draws_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- Rows estimate (mean), sd (ddof = 1), lower, upper of the per-coordinate t-interval
-- mean -/+ t_{m-1, 1-alpha/2} sd / sqrt(m) from m draws (m x p).
CREATE OR REPLACE FUNCTION dpsql_internal._t_interval_matrix(draws float8[], alpha float8)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_t_interval_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- The same, one row per coefficient (coef_index 1..p).
CREATE OR REPLACE FUNCTION dpsql_internal._t_interval(draws float8[], alpha float8,
                                             OUT coef_index int, OUT estimate float8,
                                             OUT lower float8, OUT upper float8, OUT sd float8)
RETURNS SETOF record LANGUAGE sql STRICT IMMUTABLE PARALLEL SAFE AS $$
    SELECT j, ci[1][j], ci[3][j], ci[4][j], ci[2][j]
    FROM (SELECT dpsql_internal._t_interval_matrix(draws, alpha) AS ci) AS t,
         generate_series(1, array_length(t.ci, 2)) AS j
$$;

-- The p-quantile of Student's t with df >= 1 degrees of freedom.
CREATE OR REPLACE FUNCTION dpsql.t_quantile(p float8, df float8)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_t_quantile_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- The plan of DP-GD (its registered plan_function, called by _train_planned, 33_planned.sql).
CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_plan(privacy text, ds dpsql.datasets, n bigint, d int,
                                            epsilon float8, delta float8, params jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    options jsonb;
    intercept boolean;
    p int;
    rho float8;
    x_bound float8;
    ci text;
    draws int;
    burn_in int;
    precondition boolean;
    steps bigint;
    runs int;
    eta float8;
    gamma float8;
    rho_check float8;
    rho_pre float8;
    rho_gd float8;
    lam float8;
BEGIN
    SELECT * INTO options, intercept, p, rho, x_bound
      FROM dpsql_internal._linear_plan_common(privacy, ds, d, epsilon, delta, params);
    -- Spec 002: eta = 1/5, gamma = 5 sqrt(p) max(sigma_prior, 1), theta_0 = 0, and
    -- lambda^2 = 2 N gamma^2 / (rho n^2) over all N released steps (Lemma 2.1).
    ci := coalesce(params->>'ci', 'batch_means');
    IF ci NOT IN ('none', 'batch_means', 'checkpoints', 'independent_runs') THEN
        PERFORM dpsql_internal._fail(format('unknown ci %s', quote_literal(ci)),
                            hint => 'Use batch_means (default), checkpoints, independent_runs or none.');
    END IF;
    draws := coalesce((params->>'ci_draws')::int, 10);
    burn_in := coalesce((params->>'burn_in')::int, 20);
    IF ci <> 'none' AND (draws IS NULL OR draws < 2 OR draws > 1000) THEN
        PERFORM dpsql_internal._fail(format('ci_draws must be between 2 and 1000, got %s', draws));
    END IF;
    IF burn_in < 0 THEN
        PERFORM dpsql_internal._fail(format('burn_in must be >= 0, got %s', burn_in));
    END IF;
    -- On by default when the rows have a public norm bound (the noisy matrix needs one).
    precondition := coalesce((options->>'precondition')::boolean, x_bound > 0);
    -- Draws 40 steps apart (spec 002); whitened, 120: the directions the private
    -- preconditioner cannot resolve (eigenvalues under its noise floor) keep whitened
    -- eigenvalues near 0.03, and (1 - 0.03)^120 < 0.03, the `mixed` threshold.
    steps := coalesce((params->>'steps')::bigint,
                      CASE WHEN ci = 'none' THEN 20
                           WHEN ci = 'independent_runs' THEN draws * (burn_in + 40)
                           ELSE burn_in + CASE WHEN precondition THEN 120 ELSE 40 END * draws END);
    IF steps < 1 OR steps > 20000 THEN  -- each step is a scan; iterates are appended
        PERFORM dpsql_internal._fail(format('steps must be between 1 and 20000, got %s', steps));
    END IF;
    runs := CASE WHEN ci = 'independent_runs' THEN draws ELSE 1 END;
    IF ci = 'independent_runs' AND (steps % draws <> 0 OR steps / draws <= burn_in) THEN
        PERFORM dpsql_internal._fail(format('independent runs: steps (%s) must split into %s runs longer than the burn-in (%s)',
                                   steps, draws, burn_in));
    ELSIF ci IN ('batch_means', 'checkpoints') AND (steps - burn_in) / draws < 1 THEN
        PERFORM dpsql_internal._fail(format('%s steps leave no %s draws after a burn-in of %s', steps, draws, burn_in));
    END IF;
    -- Whitened rows have a Hessian near I, where a step of 1 mixes in a few steps.
    eta := coalesce((params->>'step_size')::float8, CASE WHEN precondition THEN 1.0 ELSE 0.2 END);
    gamma := coalesce((params->>'clip_norm')::float8,
                      5 * sqrt(p) * greatest(dpsql_internal._linear_option(options, 'noise_level', 1), 1));
    IF NOT (gamma > 0 AND gamma < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('clip_norm must be a finite number > 0, got %s', gamma));
    END IF;
    -- What the intervals cover depends on clipping at the estimate: a noisy count of the
    -- rows clipped there (sensitivity 1) takes 1/50 of rho unless options.clip_check = false.
    rho_check := CASE WHEN coalesce((options->>'clip_check')::boolean, true) THEN rho / 50 ELSE 0 END;
    -- A private preconditioner (44_dpgd_precondition.sql) takes a tenth of rho.
    IF precondition AND x_bound = 0 THEN
        PERFORM dpsql_internal._fail('the preconditioner needs a public bound on ||x||',
                            hint => 'Register the dataset with row_bound, feature_bounds or row_norm => ''clip''.');
    END IF;
    rho_pre := CASE WHEN precondition THEN rho / 10 ELSE 0 END;
    rho_gd := rho - rho_check - rho_pre;
    lam := sqrt(2 * steps) * gamma / (sqrt(rho_gd) * n);
    PERFORM dpsql_internal._check_finite_run(eta, steps, gamma + 100 * lam * sqrt(p));
    RETURN jsonb_build_object(
        'epsilon', epsilon, 'delta', delta, 'rho', rho, 'steps', steps, 'runs', runs,
        'step_size', eta, 'clip_norm', gamma, 'noise_std', lam, 'ci', ci, 'ci_draws', draws,
        'burn_in', burn_in, 'rho_check', rho_check,
        'precondition', precondition, 'rho_pre', rho_pre,
        'pre_noise_std', CASE WHEN precondition
                              THEN (dpsql.adassp_sensitivities(sqrt(x_bound ^ 2 + intercept::int), 1)).xtx
                                   / sqrt(2 * rho_pre) END,
        'check_noise_std', CASE WHEN rho_check > 0 THEN 1 / sqrt(2 * rho_check) END,
        'x_bound', x_bound, 'intercept', intercept, 'dim', d, 'rows', n,
        -- x clipped to x_bound, then the 1 (plain and whitened rows alike): 33_planned.sql
        'intercept_after_row_transform', intercept,
        'info', jsonb_build_object(
            'algorithm', 'DP-GD (Brown et al. 2024, Algorithm 1), every iterate released',
            'accounting', format('zCDP: %s Gaussian steps of sensitivity 2 gamma/n (rho %s)%s%s',
                                 steps, rho_gd, CASE WHEN rho_check > 0
                                 THEN format(' + a clipped-row count at the estimate (rho %s)', rho_check) ELSE '' END,
                                 CASE WHEN precondition
                                 THEN format(' + the preconditioner''s second-moment matrix (rho %s)', rho_pre) ELSE '' END),
            'rho', rho, 'steps', steps, 'runs', runs, 'step_size', eta, 'clip_norm', gamma,
            'noise_std', lam, 'theta0', 0,
            'neighbouring', 'replace-one, n public'));
END $$;

-- The registry's fit of DP-GD: on the privately whitened rows when the plan has a
-- preconditioner (44_dpgd_precondition.sql), else on the rows as they are.
CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_fit(train_table text, plan jsonb, noise_seed bigint,
                                           OUT weights float8[], OUT info jsonb,
                                           OUT iterates float8[])
LANGUAGE plpgsql AS $$
BEGIN
    IF (plan->>'precondition')::boolean THEN
        SELECT * INTO weights, info, iterates
          FROM dpsql_internal._dpgd_fit_preconditioned(train_table, plan, noise_seed);
    ELSE
        SELECT * INTO weights, info, iterates FROM dpsql_internal._dpgd_fit_plain(train_table, plan, noise_seed);
    END IF;
END $$;

-- DP-GD on the rows as they are: one aggregate scan per step for the clipped gradient sum; the
-- noise is added in the server. Every iterate is kept (released) for the confidence intervals.
CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_fit_plain(train_table text, plan jsonb, noise_seed bigint,
                                                 OUT weights float8[], OUT info jsonb,
                                                 OUT iterates float8[])
LANGUAGE plpgsql AS $$
DECLARE
    p int := (plan->>'dim')::int + (plan->>'intercept')::boolean::int;
    steps bigint := (plan->>'steps')::bigint;
    runs int := (plan->>'runs')::int;
    per_run bigint := steps / runs;
    gamma float8 := (plan->>'clip_norm')::float8;
    icpt boolean := (plan->>'intercept')::boolean;
    xb float8 := (plan->>'x_bound')::float8;
    q text := format('SELECT dpsql.dpgd_gradient(x, y, $1, $2, $3, $4) FROM %s', train_table);
    theta float8[];
    g float8[];
    k bigint := 0;
    rows_clipped float8;
    ci text := plan->>'ci';
    lag_ac float8;
BEGIN
    iterates := '{}';
    FOR run_i IN 1..runs LOOP
        theta := array_fill(0::float8, ARRAY[p]);
        FOR t IN 1..per_run LOOP
            k := k + 1;
            EXECUTE q INTO g USING theta, gamma, icpt, xb;
            theta := dpsql_internal._dpgd_step(theta, g, (plan->>'step_size')::float8,
                                      (plan->>'noise_std')::float8, noise_seed, k);
            iterates := iterates || ARRAY[theta];
            PERFORM dpsql_internal._progress('step', k, runs::bigint * per_run);
        END LOOP;
    END LOOP;
    IF ci = 'none' THEN
        weights := theta;  -- the final iterate (spec 002 s. 2.1)
    ELSE
        SELECT array_agg(estimate ORDER BY coef_index) INTO weights
          FROM dpsql_internal._t_interval(dpsql_internal._confint_draws(iterates, ci, (plan->>'ci_draws')::int,
                                                      (plan->>'burn_in')::int), 0.05);
    END IF;
    IF ci = 'batch_means' OR ci = 'checkpoints' THEN
        -- draws are (steps - burn_in) / m iterates apart: they should be nearly uncorrelated
        lag_ac := dpsql_internal._iterate_autocorrelation(iterates, (plan->>'burn_in')::int,
            ((steps - (plan->>'burn_in')::int) / (plan->>'ci_draws')::int)::int);
    ELSIF ci = 'independent_runs' THEN
        -- within a run: its post-burn-in mean should have forgotten the start
        lag_ac := dpsql_internal._iterate_autocorrelation(iterates[1:per_run], (plan->>'burn_in')::int,
                                                 (per_run - (plan->>'burn_in')::int)::int);
    END IF;
    info := jsonb_build_object('ci', jsonb_build_object(
        'method', ci, 'draws', (plan->'ci_draws'), 'burn_in', (plan->'burn_in'),
        'draw_autocorrelation', lag_ac,
        'mixed', CASE WHEN lag_ac IS NOT NULL THEN lag_ac < 0.03 END,
        'estimate', CASE WHEN ci = 'none' THEN 'final iterate' ELSE 'mean of the draws' END,
        'covers', 'the OLS solution of the training rows if no gradient is clipped near it; '
                  'otherwise the minimiser of the Huberised loss with B_i = clip_norm/||x_i|| (spec 002 s. 3.5)'));
    IF (plan->>'rho_check')::float8 > 0 THEN
        EXECUTE q INTO g USING weights, gamma, icpt, xb;
        rows_clipped := (dpsql_internal._add_gaussian(ARRAY[g[p + 2]], (plan->>'check_noise_std')::float8,
                                             noise_seed, k + 1))[1];
        info := jsonb_set(info, '{ci,clipped_rows_at_estimate}', to_jsonb(rows_clipped));
        info := jsonb_set(info, '{ci,clipped_rows_noise_std}', plan->'check_noise_std');
        info := jsonb_set(info, '{ci,target}', to_jsonb(
            CASE WHEN rows_clipped > 3 * (plan->>'check_noise_std')::float8
                 THEN 'huberised' ELSE 'ols' END));
    END IF;
END $$;

-- The correlation between draws `lag` iterates apart implied by each coordinate's lag-1
-- autocorrelation r after the burn-in (r^lag, the AR(1) the unclipped run is along each
-- eigen-direction), the largest over the coordinates: a free check (post-processing of released
-- iterates) that the draws are nearly independent. A run that has not mixed (a slow direction,
-- spec 002 traps 8-9) has r near 1. (r^lag is far more stable than the lag-`lag` sample
-- autocorrelation, which is biased low for slow series.) C core: stats.h; a tiny r^lag is 0,
-- never an underflow error (an error after the noise would be an uncharged answer).
CREATE OR REPLACE FUNCTION dpsql_internal._iterate_autocorrelation(iterates float8[], burn_in int, lag int)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_iterate_autocorrelation_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

SELECT dpsql_internal._register_mechanism(
    'dpgd', '_train_linear', 'regression', false, true,
    'DP-GD: full-batch noisy gradient descent with confidence intervals, privately preconditioned',
    'docs/linear.md', options => '{noise_level,clip_check,precondition}',
    plan_function => '_dpgd_plan', fit_function => '_dpgd_fit',
    params => '{steps,ci,ci_draws,burn_in,clip_norm,step_size,options}', distributed => 'sums');
