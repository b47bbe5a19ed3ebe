------------------------------------------------------------------------------------------
-- Private Frank-Wolfe over the L1 ball (Thakurta, "Private Optimization",
-- §6.4, Algorithms 5-6, Corollary 6.24): LASSO from one scan of
-- sufficient statistics, logistic regression with one SUM gradient per step (from rows kept in
-- memory by 20 scans when they fit, else one gradient scan per step). The vertex of
-- each step is drawn by the exponential mechanism in C; C core and proofs:
-- core/frank_wolfe.h; glue: sql/src/frank_wolfe_fmgr.c; docs/frank_wolfe.md.
------------------------------------------------------------------------------------------

-- The plan's numbers (frank_wolfe.h, the one place of the formulas): L_1, K (NULL steps: the
-- default of Thm 6.22), eps_step and Delta_u = 2 s L_1.
CREATE OR REPLACE FUNCTION dpsql_internal._fw_numbers(model text, r_inf float8, s float8, y_bound float8,
                                                      n float8, epsilon float8, delta float8,
                                                      rho float8, steps int,
                                                      OUT l1 float8, OUT steps int,
                                                      OUT eps_step float8, OUT delta_u float8)
AS 'MODULE_PATHNAME', 'dpsql_fw_numbers_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._fw_gradient_transition(state float8[], x float8[], y float8,
                                                                  theta float8[], x_bound float8,
                                                                  intercept boolean, l1_clamp float8)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_fw_gradient_transition'
LANGUAGE C CALLED ON NULL INPUT PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._fw_gradient_combine(a float8[], b float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_fw_gradient_combine'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._fw_gradient_final(state float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_fw_gradient_final'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- [n, g_1..g_p]: the SUM over rows of the logistic gradient at theta, each row's x clipped to
-- L2 norm x_bound (then a 1 appended with an intercept), y in {-1, +1}, each per-example
-- gradient clamped coordinate-wise to [-l1_clamp, l1_clamp]. A NULL or malformed record counts
-- in n and adds nothing. Noiseless: internal (the fit feeds it to _fw_step only).
CREATE OR REPLACE AGGREGATE dpsql_internal._fw_gradient(x float8[], y float8, theta float8[],
                                                        x_bound float8, intercept boolean,
                                                        l1_clamp float8) (
    SFUNC = dpsql_internal._fw_gradient_transition,
    STYPE = float8[],
    FINALFUNC = dpsql_internal._fw_gradient_final,
    COMBINEFUNC = dpsql_internal._fw_gradient_combine,
    PARALLEL = SAFE
);

-- theta_{k+1} = (1 - 2/(k+2)) theta_k + 2/(k+2) v, v drawn by the exponential mechanism with
-- P(v) ∝ exp(-eps_step <v, g> / (2 delta_u)). Noise from pg_strong_random unless seed is
-- given (tests only: NOT private), stream k.
CREATE OR REPLACE FUNCTION dpsql_internal._fw_step(theta float8[], grad float8[], k int, s float8,
                                                   eps_step float8, delta_u float8,
                                                   seed bigint DEFAULT NULL)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_fw_step_sql'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

-- All K private steps from dpsql.adassp_gram's [n, p, X^T X, X^T y] (g = X^T X theta - X^T y).
-- Steps k_from .. k_to - 1 from theta over the rows of one scan, kept in memory (clipped):
-- _fw_gradient and _fw_step's arithmetic, streams and results, bit for bit, without a scan per
-- step. No combine function, and parallel unsafe: the rows in the one scan order.
CREATE OR REPLACE FUNCTION dpsql_internal._fw_steps_transition(state internal, x float8[], y float8,
                                                               theta float8[], x_bound float8,
                                                               intercept boolean, l1_clamp float8,
                                                               k_from int, k_to int, s float8,
                                                               eps_step float8, delta_u float8,
                                                               seed bigint)
RETURNS internal AS 'MODULE_PATHNAME', 'dpsql_fw_steps_transition'
LANGUAGE C CALLED ON NULL INPUT;

CREATE OR REPLACE FUNCTION dpsql_internal._fw_steps_final(state internal)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_fw_steps_final'
LANGUAGE C CALLED ON NULL INPUT;

CREATE OR REPLACE AGGREGATE dpsql_internal._fw_logistic_steps(x float8[], y float8, theta float8[],
                                                              x_bound float8, intercept boolean,
                                                              l1_clamp float8, k_from int, k_to int,
                                                              s float8, eps_step float8,
                                                              delta_u float8, seed bigint) (
    SFUNC = dpsql_internal._fw_steps_transition,
    STYPE = internal,
    FINALFUNC = dpsql_internal._fw_steps_final
);

-- The plan of Frank-Wolfe (_fw_plan, below): every public number its fit uses.
DO $$
BEGIN
    CREATE TYPE dpsql_internal.fw_plan AS (
        intercept_after_row_transform boolean, model text, intercept boolean, dim int,
        rows bigint, x_bound float8, y_bound float8, l1_radius float8, l1 float8, steps int,
        eps_step float8, delta_u float8,
        info jsonb);
EXCEPTION WHEN duplicate_object THEN
    NULL;  -- (an upgrade replays this script; a change of its fields needs its ALTER TYPE)
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._fw_in_memory(text, jsonb);
-- Whether a logistic fit keeps the rows in memory: a local table (Citus pushes each step's
-- gradient down instead) of at most dpsql.sampling_memory as clipped rows. Public: n and d.
CREATE OR REPLACE FUNCTION dpsql_internal._fw_in_memory(train_table text, plan dpsql_internal.fw_plan)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    layout record := dpsql_internal._citus_layout(to_regclass(train_table));
BEGIN
    RETURN plan.rows::float8 > 0 AND layout.dist_column IS NULL AND NOT layout.single_shard
       AND plan.rows::float8 * (plan.dim + 1) * 8
           <= pg_size_bytes(current_setting('dpsql.sampling_memory'));
END $$;

CREATE OR REPLACE FUNCTION dpsql_internal._fw_lasso(gram float8[], s float8, steps int, eps_step float8,
                                                    delta_u float8, seed bigint DEFAULT NULL)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_fw_lasso_sql'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

-- The default number of steps K of a Frank-Wolfe plan (_fw_plan, below; its numbers by
-- _fw_numbers), refused before any charge when its vertex draws are close to uniform.
CREATE OR REPLACE FUNCTION dpsql_internal._fw_default_steps(model text, r_inf float8, s float8,
                                                            y_bound float8, n bigint, d int, p int,
                                                            epsilon float8, delta float8, rho float8)
RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
    steps_opt float8;
    num record;
    k int;
    best float8;
    bound float8;
BEGIN
    -- Default K: the minimiser of the derived high-probability bound (Thakurta, Theorem 6.22,
    -- with mu_k = 2/(k+2) and the noise on the SUM gradient) 2 n Gamma / (K + 2) + 4 b ln(2p K
    -- / 0.05), b = 2 Delta_u / eps_step the selection noise, over K = 2..2000 (x1.25 steps).
    -- Thm 6.22's K (K^(3/2) ~ n eps) drops that log and the zCDP split: it gave 50-2000 steps
    -- of near-uniform vertex draws.
    k := 2;
    WHILE k <= 2000 LOOP
        num := dpsql_internal._fw_numbers(model, r_inf, s, y_bound, n, epsilon, delta, rho, k);
        bound := 2 * n * (2 * s * r_inf) ^ 2 / CASE WHEN model = 'lasso' THEN 1 ELSE 4 END / (k + 2)
                 + 8 * num.delta_u / num.eps_step * ln(2 * p * k / 0.05);
        IF best IS NULL OR bound < best THEN
            best := bound;
            steps_opt := k;
        END IF;
        k := greatest(k + 1, (k * 1.25)::int);
    END LOOP;
    num := dpsql_internal._fw_numbers(model, r_inf, s, y_bound, n, epsilon, delta, rho, steps_opt::int);
    -- Refused before any charge when the vertex draws are close to uniform: the best
    -- vertex's score lead is at most n a L_1 s (a: the share of the L_inf bound one
    -- coordinate of a row uses, 1 for LASSO's [-1, 1] features, 1/sqrt(d) for rows clipped
    -- to L2 norm 1), the selection noise 2 Delta_u / eps_step = 4 s L_1 / eps_step over 2p
    -- candidates, so a useful draw needs n a eps_step well above ln(2p K); below 50 x that
    -- the defaults learned nothing on any dataset we ran (bench/RESULTS.md).
    IF n * num.eps_step * (CASE WHEN model = 'lasso' THEN 1 ELSE 1 / sqrt(d) END)
       < 50 * ln(2 * p * steps_opt) THEN
        PERFORM dpsql_internal._fail(
            format('frank_wolfe cannot learn here: at epsilon %s its %s steps choose their '
                   'vertices almost at random (n a eps_step = %s, below 50 ln(2p K) = %s)',
                   epsilon, steps_opt,
                   round((n * num.eps_step * CASE WHEN model = 'lasso' THEN 1
                                                  ELSE 1 / sqrt(d) END)::numeric, 1),
                   round((50 * ln(2 * p * steps_opt))::numeric, 1)),
            hint => CASE WHEN model = 'lasso'
                         THEN 'Use privacy => ''auto'', ''adassp'' or ''objective_perturbation'', '
                              'a larger epsilon or more rows.'
                         ELSE 'Use privacy => ''auto'' or ''objective_perturbation'' (dense '
                              'rows use little of the L_inf bound Frank-Wolfe pays for), a '
                              'larger epsilon or more rows.' END);
    END IF;
    RETURN steps_opt;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._fw_plan(text, dpsql.datasets, bigint, int, float8, float8, jsonb);
-- The plan: every number from n, d, the registration and the analyst's options.
-- Over 100 lines: the model's bounds, each with its refusal, the steps from them, then its
-- typed plan, a field a line.
CREATE OR REPLACE FUNCTION dpsql_internal._fw_plan(privacy text, ds dpsql.datasets, n bigint, d int,
                                                   epsilon float8, delta float8, params jsonb)
RETURNS dpsql_internal.fw_plan LANGUAGE plpgsql AS $$
DECLARE
    plan dpsql_internal.fw_plan;
    options jsonb := dpsql_internal._plan_options(privacy, params);
    model text := params->>'model';
    intercept boolean := coalesce((params->>'intercept')::boolean, false);
    p int := d + intercept::int;
    s float8;
    steps_opt float8 := dpsql_internal._linear_option(options, 'steps', NULL, 1, false);
    x_bound float8;
    r_inf float8;
    y_bound float8 := 0;
    rho float8;
    num record;
    max_p int;
BEGIN
    IF model NOT IN ('lasso', 'logistic') THEN
        PERFORM dpsql_internal._fail(format('frank_wolfe trains model => lasso or logistic, not %s',
                                            quote_literal(model)));
    END IF;
    IF model = 'logistic' AND jsonb_array_length(params->'classes') <> 2 THEN
        PERFORM dpsql_internal._fail('frank_wolfe trains binary logistic regression (2 classes)');
    END IF;
    IF steps_opt IS NOT NULL AND (steps_opt <> floor(steps_opt) OR steps_opt > 2000) THEN
        PERFORM dpsql_internal._fail(format('options.steps must be a whole number between 1 and 2000, got %s',
                                            steps_opt));
    END IF;
    max_p := CASE WHEN model = 'lasso' THEN 1024 ELSE 65536 END;
    IF p > max_p THEN
        PERFORM dpsql_internal._fail(format('frank_wolfe %s takes at most %s coefficients, got %s',
                                            model, max_p, p));
    END IF;
    IF model = 'lasso' THEN
        -- dpsql.adassp_gram clips each (x, 1) to L2 norm x_bound, so |x_j| <= x_bound.
        IF ds.row_bound IS NULL THEN
            PERFORM dpsql_internal._fail('frank_wolfe LASSO needs a public bound on ||x||',
                                hint => 'Register the dataset with row_bound, feature_bounds or row_norm => ''clip''.');
        END IF;
        x_bound := sqrt(ds.row_bound ^ 2 + intercept::int);
        -- feature bounds map every feature onto [-1, 1] (and the intercept is 1): |x_j| <= 1
        r_inf := CASE WHEN ds.feature_bounds IS NOT NULL THEN least(x_bound, 1) ELSE x_bound END;
        -- Issue 25: with only a row bound R each coordinate's bound is R itself, and the vertex
        -- choice's noise grows with it: on California housing and diamonds (features within
        -- [-1, 1] and [0, 1], declared by a row bound) the defaults were worse than the mean at
        -- every epsilon up to 4. Refused there before any charge.
        IF ds.feature_bounds IS NULL AND options->'l1_radius' IS NULL AND steps_opt IS NULL THEN
            PERFORM dpsql_internal._fail(
                'frank_wolfe LASSO at its defaults needs per-feature bounds: with only a row bound, '
                'each coordinate is bounded by the whole row bound and its vertex draws are mostly noise',
                hint => 'Register feature_bounds (dpsql.estimate_bounds finds them privately), or use '
                        'privacy => ''auto'' or ''dpgd''; options => {"l1_radius": ..., "steps": ...} runs it anyway.');
        END IF;
        y_bound := ds.label_bound;
    ELSE
        -- Classification rows are registered with row_norm clip or unit: ||x|| <= 1. The
        -- intercept coordinate is 1, so R_inf = 1 (and per-example gradients are clamped).
        x_bound := 1;
        r_inf := 1;
    END IF;
    -- Default s: LASSO's predictions |<x, theta>| <= s R_inf reach the label bound Y (radius 1
    -- could not even reach California housing's mean, MSE 2.5-3.6 against the mean's 1.37);
    -- logistic: margins up to 10 R_inf (at s = 1 every margin is <= 1, the regime where a
    -- logistic model predicts the majority class).
    s := dpsql_internal._linear_option(options, 'l1_radius',
                                       CASE WHEN model = 'lasso' THEN greatest(1, y_bound / r_inf)
                                            ELSE 10 END);
    IF delta > 0 THEN
        rho := dpsql.zcdp_rho(epsilon, delta);
    END IF;
    IF steps_opt IS NULL THEN
        steps_opt := dpsql_internal._fw_default_steps(model, r_inf, s, y_bound, n, d, p, epsilon, delta, rho);
    END IF;
    num := dpsql_internal._fw_numbers(model, r_inf, s, y_bound, n, epsilon, delta, rho, steps_opt::int);
    -- logistic rows clipped to x_bound, then the 1 (frank_wolfe.c; 33_planned.sql records
    -- it); LASSO clips (x, 1) as one row (dpsql.adassp_gram)
    plan.intercept_after_row_transform := intercept AND model <> 'lasso';
    plan.model := model;
    plan.intercept := intercept;
    plan.dim := d;
    plan.rows := n;
    plan.x_bound := x_bound;
    plan.y_bound := y_bound;
    plan.l1_radius := s;
    plan.l1 := num.l1;
    plan.steps := num.steps;
    plan.eps_step := num.eps_step;
    plan.delta_u := num.delta_u;
    plan.info := jsonb_build_object(
        'algorithm', format('private Frank-Wolfe over the L1 ball of radius %s (Thakurta, Private Optimization, '
                            'Algorithm 6): '
                            'theta_0 = 0, mu_k = 2/(k+2), vertex by the exponential mechanism on '
                            'the SUM-gradient scores%s', s,
                            CASE WHEN model = 'lasso' THEN ', one scan of sufficient statistics'
                                 ELSE ', the SUM gradient of every step' END),
        'accounting', CASE WHEN delta > 0
            THEN format('zCDP: %s exponential mechanisms of eps_step^2/8 each (bounded range), rho %s',
                        num.steps, rho)
            ELSE format('pure epsilon-DP: basic composition of %s eps_step-DP steps', num.steps) END,
        'steps', num.steps, 'eps_step', num.eps_step, 'delta_u', num.delta_u,
        'l1_radius', s, 'l1', num.l1, 'r_inf', r_inf, 'x_bound', x_bound,
        'y_bound', CASE WHEN model = 'lasso' THEN y_bound END, 'rho', rho,
        'theta0', 0, 'neighbouring', 'replace-one, n public');
    RETURN plan;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._fw_fit(text, jsonb, bigint);
CREATE OR REPLACE FUNCTION dpsql_internal._fw_fit(train_table text, plan dpsql_internal.fw_plan, noise_seed bigint,
                                                  OUT weights float8[], OUT info jsonb,
                                                  OUT iterates float8[])
LANGUAGE plpgsql AS $$
DECLARE
    icpt boolean := plan.intercept;
    d int := plan.dim;
    steps int := plan.steps;
    s float8 := plan.l1_radius;
    eps_step float8 := plan.eps_step;
    delta_u float8 := plan.delta_u;
    gram float8[];
    g float8[];
    q text;
    done int := 0;
    scans int := 1;  -- LASSO's one
BEGIN
    IF plan.model = 'lasso' THEN
        EXECUTE format('SELECT dpsql.adassp_gram(x, y, $1, $2, $3, $4) FROM %s', train_table)
           INTO gram USING plan.x_bound, plan.y_bound, icpt, d;
        IF gram IS NULL THEN  -- no rows: the zero statistics
            gram := ARRAY[0, d + icpt::int]::float8[] || array_fill(0::float8, ARRAY[(d + icpt::int) * (d + icpt::int + 1)]);
        END IF;
        weights := dpsql_internal._fw_lasso(gram, s, steps, eps_step, delta_u, noise_seed);
    ELSE
        weights := array_fill(0::float8, ARRAY[d + icpt::int]);
        scans := 0;
        IF dpsql_internal._fw_in_memory(train_table, plan) THEN
            -- one scan: its final function takes the K steps over the rows it keeps (and
            -- reports progress)
            EXECUTE format('SELECT dpsql_internal._fw_logistic_steps(x, y, $1, $2, $3, $4, $5, '
                           '$6, $7, $8, $9, $10) FROM %s', train_table)
               INTO g USING weights, plan.x_bound, icpt, plan.l1, 0,
                    steps, s, eps_step, delta_u, noise_seed;
            scans := 1;
            IF g IS NOT NULL THEN  -- no rows: the zero gradient's steps below
                weights := g;
                done := steps;
            END IF;
        END IF;
        q := format('SELECT dpsql_internal._fw_gradient(x, y, $1, $2, $3, $4) FROM %s', train_table);
        FOR k IN done..steps - 1 LOOP
            EXECUTE q INTO g USING weights, plan.x_bound, icpt, plan.l1;
            scans := scans + 1;
            IF g IS NULL THEN
                g := array_fill(0::float8, ARRAY[d + icpt::int + 1]);
            END IF;
            weights := dpsql_internal._fw_step(weights, g, k, s, eps_step, delta_u, noise_seed);
            -- one scan per step: say how far it is (K is public)
            PERFORM dpsql_internal._progress('step', k + 1, steps);
        END LOOP;
    END IF;
    -- scans: public (K, n, d and dpsql.sampling_memory decide it)
    info := jsonb_build_object('nnz', (SELECT count(*) FROM unnest(weights) w WHERE w <> 0),
                               'scans', scans);
    iterates := NULL;
END $$;
