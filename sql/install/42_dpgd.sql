------------------------------------------------------------------------------------------
-- DP-GD for linear regression (Brown et al. 2024, "Private gradient descent for linear regression",
-- ICML 2024, Algorithm 1 and §3): one aggregate scan per gradient step, the noisy
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

-- The noise std of each of `steps` steps that compose to rho-zCDP, the mean gradient's
-- replace-one sensitivity 2 gamma / n: sqrt(2 steps) gamma / (sqrt(rho) n), the zCDP Gaussian
-- (_zcdp_sigma) in the order DP-GD has always rounded it. C core: dpsql_dpgd_noise_std, dpgd.h.
CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_noise_std(gamma float8, rho float8, steps bigint,
                                                          n bigint)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_dpgd_noise_std_sql'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

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

-- The coefficients' intervals, widened for the correlation between the draws (issue 42, item
-- 10). The t-interval of m draws assumes them independent; draws of one chain are not. With r
-- the largest lag-1 autocorrelation of any coefficient's iterates after the burn-in (the
-- slowest direction; a coefficient that mixes fast on its own can still carry a slow one), the
-- chain as an AR(1), consecutive draws correlate by rho (checkpoints B iterates apart: r^B;
-- batch means of B iterates: r(1 - r^B)^2 / ((1 - r)^2 B + 2r(B(1 - r) - 1 + r^B))). The mean
-- of m such draws has c = 1 + 2S times the variance of independent ones, S = sum_{k<m} (1 - k/m)
-- rho^k, and their sample variance is low by g = 1 - 2S/(m - 1): the half-width is
-- t_{1-alpha/2, m/c - 1} sd sqrt(c / (g m)), m/c the effective number of draws. Independent
-- runs need none. Fewer than 2 effective draws leave no variance to estimate: the intervals
-- are withheld (NULL bounds). bench/dpgd_coverage.py measures the coverage (0.96-0.98 where
-- the plain t-intervals covered 0.72-0.89).
CREATE OR REPLACE FUNCTION dpsql_internal._confint_rows(iterates float8[], method text, draws int,
                                                      burn_in int, alpha float8)
RETURNS TABLE (coef_index int, estimate float8, lower float8, upper float8, effective_draws float8)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    b float8 := ((array_length(iterates, 1) - burn_in) / draws)::float8;
    r float8 := least(coalesce(dpsql_internal._iterate_autocorrelation(iterates, burn_in, 1), 0),
                      1 - 1e-9);
    rho float8;
    s float8;
    c float8 := 1;
    g float8 := 1;
BEGIN
    IF method <> 'independent_runs' THEN
        rho := CASE WHEN method = 'batch_means'
                    THEN r * (1 - r ^ b) ^ 2 / ((1 - r) ^ 2 * b + 2 * r * (b * (1 - r) - 1 + r ^ b))
                    ELSE r ^ b END;
        s := (SELECT coalesce(sum((1 - k::float8 / draws) * rho ^ k), 0)
                FROM generate_series(1, draws - 1) k);
        c := 1 + 2 * s;
        g := greatest(1 - 2 * s / (draws - 1), 1e-9);
    END IF;
    RETURN QUERY
        SELECT t.coef_index, t.estimate, t.estimate - h.half, t.estimate + h.half, draws / c
          FROM dpsql_internal._t_interval(dpsql_internal._confint_draws(iterates, method, draws, burn_in),
                                          alpha) t,
               LATERAL (SELECT CASE WHEN draws / c >= 2
                                    THEN dpsql.t_quantile(1 - alpha / 2, draws / c - 1) * t.sd * sqrt(c / (g * draws))
                               END AS half) h;
END $$;

-- The plan of DP-GD: every public number its fit uses (NULL: a part it does not run: the
-- private clip bound, the preconditioner, the clipped-row check).
DO $$
BEGIN
    CREATE TYPE dpsql_internal.dpgd_plan AS (
        epsilon float8, delta float8, rho float8, steps bigint, runs int, step_size float8,
        clip_norm float8, noise_std float8, noise_multiplier float8,
        ci text, ci_draws int, burn_in int,
        rho_check float8, check_noise_std float8,
        clip_quantile float8, clip_pilot_steps int, clip_grid float8[], rho_clip float8,
        clip_noise_std float8,
        precondition boolean, rho_pre float8, pre_noise_std float8,
        x_bound float8, intercept boolean, dim int, rows bigint,
        intercept_after_row_transform boolean, row_clip_radius float8,
        info jsonb);
EXCEPTION WHEN duplicate_object THEN
    NULL;  -- (an upgrade replays this script; a change of its fields needs its ALTER TYPE)
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._dpgd_plan(text, dpsql.datasets, bigint, int, float8, float8, jsonb);
-- The plan of DP-GD (its registered plan_function, called by _train_planned, 33_planned.sql).
-- Over 100 lines: one sequential argument, each number from the ones before it (the clip
-- quantile sets the burn-in, which with ci and the preconditioner sets the steps, which with
-- the split of rho set the noise) and all of them in its typed plan and its record.
CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_plan(privacy text, ds dpsql.datasets, n bigint, d int,
                                            epsilon float8, delta float8, params jsonb)
RETURNS dpsql_internal.dpgd_plan LANGUAGE plpgsql AS $$
DECLARE
    plan dpsql_internal.dpgd_plan;
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
    cq jsonb;
    clip_q float8;
    rho_clip float8;
    pilot int;
    grid float8[];
BEGIN
    SELECT * INTO options, intercept, p, rho, x_bound
      FROM dpsql_internal._linear_plan_common(privacy, ds, d, epsilon, delta, params);
    -- Brown et al. 2024, §4: eta = 1/5, gamma = 5 sqrt(p) max(sigma_prior, 1), theta_0 = 0, and
    -- lambda^2 = 2 N gamma^2 / (rho n^2) over all N released steps (Lemma 2.1).
    ci := coalesce(params->>'ci', 'batch_means');  -- its choices and ci_draws' range: the spec's
    -- Issue 25: unless the analyst fixes clip_norm (or options.clip_quantile = false), gamma is
    -- a private quantile (default 0.995) of the per-example gradient norms at the iterate that
    -- ends a pilot of burn_in / 2 steps run at the public rule's gamma: clipping is then rare
    -- wherever the public rule over- or under-shoots. The pilot is part of the burn-in (the
    -- default burn-in doubles to 40 so that 20 steps follow the switch).
    cq := nullif(options->'clip_quantile', 'null');
    IF params->>'clip_norm' IS NOT NULL OR cq = 'false'::jsonb THEN
        clip_q := NULL;
    ELSIF cq IS NULL THEN
        clip_q := 0.995;
    ELSIF jsonb_typeof(cq) = 'number' AND (cq::text)::float8 >= 0.5 AND (cq::text)::float8 < 1 THEN
        clip_q := (cq::text)::float8;
    ELSE
        PERFORM dpsql_internal._fail(format('options.clip_quantile must be a number in [0.5, 1) or false, got %s', cq),
                            hint => 'The fraction of gradients left unclipped at the pilot''s iterate, e.g. 0.995.');
    END IF;
    draws := coalesce((params->>'ci_draws')::int, 10);
    burn_in := coalesce((params->>'burn_in')::int, CASE WHEN clip_q IS NULL THEN 20 ELSE 40 END);
    IF clip_q IS NOT NULL AND ci <> 'none' AND burn_in < 2 THEN
        PERFORM dpsql_internal._fail(format('the private clip bound is chosen within the burn-in: burn_in must be >= 2, got %s', burn_in),
                            hint => 'Give clip_norm, or options => {"clip_quantile": false}.');
    END IF;
    -- On by default when the rows have a public norm bound (the noisy matrix needs one).
    precondition := coalesce((options->>'precondition')::boolean, x_bound > 0);
    -- Issue 25: DP-GD's noise falls as 1 / (n epsilon); below the line auto draws (37_auto.sql)
    -- its defaults are often mostly noise (California housing, n epsilon 8,000-16,000: worse
    -- than the mean predictor in one run of two). Said before the charge (a warning: the
    -- demo and the intervals' users run it there on purpose).
    IF n * epsilon < dpsql_internal._auto_dpgd_min_n_epsilon() AND params->>'steps' IS NULL
       AND params->>'clip_norm' IS NULL AND coalesce(params->'options', 'null') = 'null' THEN
        RAISE WARNING 'dpsql: dpgd at n epsilon = % (below %) is often mostly noise',
                      round((n * epsilon)::numeric), dpsql_internal._auto_dpgd_min_n_epsilon()
            USING HINT = 'privacy => ''auto'' or ''dpsgd_f'' (Poisson sampling amplifies privacy) is more '
                         'accurate there; a larger epsilon or more rows help DP-GD.';
    END IF;
    -- Draws 40 steps apart (ours: Brown et al. 2024, §3.1, want draws many mixing times apart);
    -- whitened, 120: the directions the private preconditioner cannot resolve (eigenvalues under
    -- its noise floor) keep whitened eigenvalues near 0.03, and (1 - 0.03)^120 < 0.03, the `mixed`
    -- threshold.
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
    -- The clip quantile: a Gaussian histogram of the gradient norms over a public geometric
    -- grid gamma_0 2^j, j = -5..5 (gamma_0 the public rule's gamma). Replacing one row moves
    -- one count down and one up: two counts of sensitivity 1, rho_clip / 2 each, so
    -- N(0, 1/rho_clip) per count is rho_clip-zCDP (L2 sensitivity sqrt 2, Delta^2 / (2 sigma^2)).
    -- It takes 1/10 of rho; a grid this coarse keeps the few bins summed into a tail count
    -- (their noise adds up) few.
    rho_clip := CASE WHEN clip_q IS NOT NULL THEN rho / 10 ELSE 0 END;
    pilot := CASE WHEN clip_q IS NULL THEN 0 WHEN ci = 'none' THEN greatest(steps / 2, 1) ELSE burn_in / 2 END;
    IF clip_q IS NOT NULL THEN
        grid := ARRAY(SELECT gamma * 2 ^ j FROM generate_series(-5, 5) j ORDER BY j);
    END IF;
    rho_gd := rho - rho_check - rho_pre - rho_clip;
    -- Every step keeps noise_std / clip_norm = sqrt(2 N) / (sqrt(rho_gd) n) whatever gamma it
    -- clips at: each is then rho_gd / N-zCDP (Lemma 2.1), and zCDP composes adaptively, so a
    -- gamma chosen from released outputs (the pilot's iterate, the noisy histogram) is fine.
    lam := dpsql_internal._dpgd_noise_std(gamma, rho_gd, steps, n);
    PERFORM dpsql_internal._check_finite_run(eta, steps,
                                             coalesce(grid[11], gamma) * (1 + 100 * lam / gamma * sqrt(p)));
    plan.epsilon := epsilon;
    plan.delta := delta;
    plan.rho := rho;
    plan.steps := steps;
    plan.runs := runs;
    plan.step_size := eta;
    plan.clip_norm := gamma;
    plan.noise_std := lam;
    plan.ci := ci;
    plan.ci_draws := draws;
    plan.burn_in := burn_in;
    plan.rho_check := rho_check;
    plan.noise_multiplier := lam / gamma;
    plan.clip_quantile := clip_q;
    plan.clip_pilot_steps := pilot;
    plan.clip_grid := grid;
    plan.rho_clip := rho_clip;
    plan.clip_noise_std := CASE WHEN rho_clip > 0 THEN dpsql_internal._zcdp_sigma(1, rho_clip, 2) END;
    plan.precondition := precondition;
    plan.rho_pre := rho_pre;
    plan.pre_noise_std := CASE WHEN precondition
                          THEN dpsql_internal._zcdp_sigma(
                                   (dpsql.adassp_sensitivities(sqrt(x_bound ^ 2 + intercept::int), 1)).xtx,
                                   rho_pre) END;
    plan.check_noise_std := CASE WHEN rho_check > 0 THEN dpsql_internal._zcdp_sigma(1, rho_check) END;
    plan.x_bound := x_bound;
    plan.intercept := intercept;
    plan.dim := d;
    plan.rows := n;
    -- x clipped to x_bound, then the 1 (plain and whitened rows alike): 33_planned.sql
    plan.intercept_after_row_transform := intercept;
    plan.row_clip_radius := nullif(x_bound, 0);
    plan.info := jsonb_build_object(
        'algorithm', 'DP-GD (Brown et al. 2024, Algorithm 1), every iterate released',
        'accounting', format('zCDP: %s Gaussian steps of sensitivity 2 gamma/n (rho %s)%s%s%s',
                             steps, rho_gd, CASE WHEN rho_check > 0
                             THEN format(' + a clipped-row count at the estimate (rho %s)', rho_check) ELSE '' END,
                             CASE WHEN precondition
                             THEN format(' + the preconditioner''s second-moment matrix (rho %s)', rho_pre) ELSE '' END,
                             CASE WHEN rho_clip > 0
                             THEN format(' + the clip bound''s histogram of gradient norms (rho %s)', rho_clip) ELSE '' END),
        'rho', rho, 'steps', steps, 'runs', runs, 'step_size', eta, 'clip_norm', gamma,
        'noise_std', lam, 'noise_multiplier', lam / gamma, 'theta0', 0,
        'neighbouring', 'replace-one, n public');
    RETURN plan;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._dpgd_fit(text, jsonb, bigint);
-- The registry's fit of DP-GD: on the privately whitened rows when the plan has a
-- preconditioner (44_dpgd_precondition.sql), else on the rows as they are.
CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_fit(train_table text, plan dpsql_internal.dpgd_plan, noise_seed bigint,
                                           OUT weights float8[], OUT info jsonb,
                                           OUT iterates float8[])
LANGUAGE plpgsql AS $$
BEGIN
    IF plan.precondition THEN
        SELECT * INTO weights, info, iterates
          FROM dpsql_internal._dpgd_fit_preconditioned(train_table, plan, noise_seed);
    ELSE
        SELECT * INTO weights, info, iterates FROM dpsql_internal._dpgd_fit_plain(train_table, plan, noise_seed);
    END IF;
END $$;

-- The exact (NOISELESS: internal, never released) histogram of the per-example gradient norms
-- ||x_i (<x_i, theta> - y_i)|| over the ascending edges e_1..e_K: K + 1 counts, of the norms
-- <= e_1, in (e_j, e_j+1], and > e_K. Rows as dpgd_gradient sees them (x clipped to x_bound,
-- the intercept's 1, malformed rows: norm 0). One scan per edge (its clipped count).
CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_clip_histogram(train_table text, theta float8[], edges float8[],
                                                      intercept boolean, x_bound float8)
RETURNS float8[] LANGUAGE plpgsql AS $$
DECLARE
    p int := cardinality(theta);
    q text := format('SELECT dpsql.dpgd_gradient(x, y, $1, $2, $3, $4) FROM %s', train_table);
    g float8[];
    n float8;
    tail float8[];
BEGIN
    FOR j IN 1..cardinality(edges) LOOP
        EXECUTE q INTO g USING theta, edges[j], intercept, x_bound;
        n := coalesce(g[p + 1], 0);
        tail := tail || coalesce(g[p + 2], 0);
    END LOOP;
    RETURN ARRAY[n - tail[1]]
           || ARRAY(SELECT tail[j - 1] - tail[j] FROM generate_series(2, cardinality(edges)) j ORDER BY j)
           || tail[cardinality(edges)];
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._dpgd_private_clip(text, jsonb, float8[], boolean, float8, bigint, int);
-- The private clip bound (plan: clip_grid, clip_noise_std, clip_quantile) from the histogram
-- at theta: the noisy counts, then the smallest edge whose noisy tail count (of the norms
-- above it: a sum of k noisy counts, noise std sd sqrt k) is at most max((1 - q) n, sd sqrt k)
-- (post-processing); the top edge if none is. Without the floor sd sqrt k, an allowance
-- (1 - q) n below the noise (small n or epsilon) would fail by noise alone up to the top
-- edge. Returns the bound and its record (all of it released).
CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_private_clip(train_table text, plan dpsql_internal.dpgd_plan, theta float8[],
                                                    intercept boolean, x_bound float8,
                                                    noise_seed bigint, pilot int,
                                                    OUT gamma float8, OUT info jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    edges float8[] := plan.clip_grid;
    k int := cardinality(edges);
    n float8 := plan.rows::float8;
    allowed float8 := (1 - plan.clip_quantile) * n;
    noisy float8[];
    tail float8 := 0;
    tail_at float8;
BEGIN
    -- stream 1e6 + 25: apart from the steps' 1..20000 and the check's N + 1 (seeded runs)
    noisy := dpsql_internal._add_gaussian(
        dpsql_internal._dpgd_clip_histogram(train_table, theta, edges, intercept, x_bound),
        plan.clip_noise_std, noise_seed, 1000025);
    -- The true tail counts fall fast along a grid of ratio 2, so a low edge passes by noise
    -- only when its true tail is near the allowance: the first edge from the bottom that does.
    gamma := edges[k];
    tail_at := noisy[k + 1];
    FOR j IN REVERSE k..1 LOOP
        tail := tail + noisy[j + 1];  -- the noisy count above edges[j]
        IF tail <= greatest(allowed, plan.clip_noise_std * sqrt(k + 1 - j)) THEN
            gamma := edges[j];
            tail_at := tail;
        END IF;
    END LOOP;
    info := jsonb_build_object(
        'rule', 'private quantile of the per-example gradient norms',
        'quantile', plan.clip_quantile, 'reference', format('iterate %s (the pilot''s last)', pilot),
        'pilot_clip_norm', plan.clip_norm, 'grid', plan.clip_grid,
        'noisy_histogram', to_jsonb(noisy), 'noise_std', plan.clip_noise_std, 'rho', plan.rho_clip,
        'clipped_fraction_at_reference', greatest(tail_at, 0) / n);
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._dpgd_fit_plain(text, jsonb, bigint);
-- DP-GD on the rows as they are: one aggregate scan per step for the clipped gradient sum; the
-- noise is added in the server. Every iterate is kept (released) for the confidence intervals.
-- With a private clip bound (plan clip_quantile), the first clip_pilot_steps steps clip at the
-- public rule's gamma, then every step at the private quantile (the noise keeps its ratio).
CREATE OR REPLACE FUNCTION dpsql_internal._dpgd_fit_plain(train_table text, plan dpsql_internal.dpgd_plan, noise_seed bigint,
                                                 OUT weights float8[], OUT info jsonb,
                                                 OUT iterates float8[])
LANGUAGE plpgsql AS $$
DECLARE
    p int := plan.dim + plan.intercept::int;
    steps bigint := plan.steps;
    runs int := plan.runs;
    per_run bigint := steps / runs;
    gamma float8 := plan.clip_norm;
    lam float8 := plan.noise_std;
    pilot int := coalesce(plan.clip_pilot_steps, 0);
    clip_info jsonb;
    icpt boolean := plan.intercept;
    xb float8 := plan.x_bound;
    q text := format('SELECT dpsql.dpgd_gradient(x, y, $1, $2, $3, $4) FROM %s', train_table);
    theta float8[];
    g float8[];
    k bigint := 0;
    rows_clipped float8;
    n float8 := plan.rows::float8;
    check_sd float8 := plan.check_noise_std;
    ci text := plan.ci;
    lag_ac float8;
BEGIN
    iterates := '{}';
    FOR run_i IN 1..runs LOOP
        theta := array_fill(0::float8, ARRAY[p]);
        FOR t IN 1..per_run LOOP
            k := k + 1;
            EXECUTE q INTO g USING theta, gamma, icpt, xb;
            theta := dpsql_internal._dpgd_step(theta, g, plan.step_size, lam, noise_seed, k);
            iterates := iterates || ARRAY[theta];
            IF k = pilot THEN
                SELECT * INTO gamma, clip_info
                  FROM dpsql_internal._dpgd_private_clip(train_table, plan, theta, icpt, xb, noise_seed, pilot);
                lam := gamma * plan.noise_multiplier;
            END IF;
            PERFORM dpsql_internal._progress('step', k, runs::bigint * per_run);
        END LOOP;
    END LOOP;
    IF ci = 'none' THEN
        weights := theta;  -- the final iterate (Brown et al. 2024, Theorem 2.7)
    ELSE
        SELECT array_agg(estimate ORDER BY coef_index) INTO weights
          FROM dpsql_internal._t_interval(dpsql_internal._confint_draws(iterates, ci, plan.ci_draws,
                                                      plan.burn_in), 0.05);
    END IF;
    IF ci = 'batch_means' OR ci = 'checkpoints' THEN
        -- draws are (steps - burn_in) / m iterates apart: they should be nearly uncorrelated
        lag_ac := dpsql_internal._iterate_autocorrelation(iterates, plan.burn_in,
            ((steps - plan.burn_in) / plan.ci_draws)::int);
    ELSIF ci = 'independent_runs' THEN
        -- within a run: its post-burn-in mean should have forgotten the start
        lag_ac := dpsql_internal._iterate_autocorrelation(iterates[1:per_run], plan.burn_in,
                                                 (per_run - plan.burn_in)::int);
    END IF;
    -- The gamma and noise the steps after the pilot used (all of them without a pilot).
    info := jsonb_build_object('clip_norm', gamma, 'noise_std', lam, 'ci', jsonb_build_object(
        'method', ci, 'draws', plan.ci_draws, 'burn_in', plan.burn_in,
        'draw_autocorrelation', lag_ac,
        'mixed', CASE WHEN lag_ac IS NOT NULL THEN lag_ac < 0.03 END,
        'estimate', CASE WHEN ci = 'none' THEN 'final iterate' ELSE 'mean of the draws' END,
        'covers', 'the OLS solution of the training rows if (almost) no gradient is clipped near it; '
                  'otherwise the minimiser of the clipped least-squares (Huberised) loss with '
                  'B_i = clip_norm/||x_i||, x_i the row as the steps saw it (Brown et al. 2024, section 2.5)'));
    IF clip_info IS NOT NULL THEN
        info := info || jsonb_build_object('clip', clip_info);
    END IF;
    IF plan.rho_check > 0 THEN
        EXECUTE q INTO g USING weights, gamma, icpt, xb;
        rows_clipped := (dpsql_internal._add_gaussian(ARRAY[g[p + 2]], check_sd, noise_seed, k + 1))[1];
        info := jsonb_set(info, '{ci,clipped_rows_at_estimate}', to_jsonb(rows_clipped));
        info := jsonb_set(info, '{ci,clipped_rows_noise_std}', to_jsonb(plan.check_noise_std));
        -- the estimated fraction of rows clipped at the estimate, and its noise's std
        info := jsonb_set(info, '{ci,clipped_fraction}', to_jsonb(greatest(rows_clipped, 0) / n));
        info := jsonb_set(info, '{ci,clipped_fraction_std}', to_jsonb(check_sd / n));
        info := jsonb_set(info, '{ci,target}', to_jsonb(
            CASE WHEN rows_clipped > 3 * check_sd THEN 'clipped least squares' ELSE 'ols' END));
    END IF;
END $$;

-- The correlation between draws `lag` iterates apart implied by each coordinate's lag-1
-- autocorrelation r after the burn-in (r^lag, the AR(1) the unclipped run is along each
-- eigen-direction), the largest over the coordinates: a free check (post-processing of released
-- iterates) that the draws are nearly independent. A run that has not mixed (a slow direction,
-- consecutive iterates correlated at lag 1 about 1 - eta mu_min) has r near 1. (r^lag is far more
-- stable than the lag-`lag` sample autocorrelation, which is biased low for slow series.) C core:
-- stats.h; a tiny r^lag is 0,
-- never an underflow error (an error after the noise would be an uncharged answer).
CREATE OR REPLACE FUNCTION dpsql_internal._iterate_autocorrelation(iterates float8[], burn_in int, lag int)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_iterate_autocorrelation_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;
