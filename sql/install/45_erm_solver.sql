------------------------------------------------------------------------------------------
-- The exact-minimiser toolbox shared by objective perturbation (50_objective_perturbation.sql)
-- and output perturbation (49_output_perturbation.sql), Thakurta, "Private Optimization",
-- §6.2.2 and Chaudhuri et al. 2011. C core:
-- core/objective.h (the GLM losses, the Newton direction and every calibration) and
-- core/erm_solver.h (the fixed-work solver); glue: sql/src/objective_fmgr.c and
-- sql/src/erm_solver_fmgr.c.
--
-- The solver is Newton's method with a fixed line search on the strongly convex
--   J(theta) = sum_i l(<x_i, theta>, y_i) + (reg/2) ||theta||^2 + <b, theta>
-- from theta = 0, and its work is a function of public numbers only (issue 30: a solver that
-- stopped at its certificate took 5-9 scans depending on the rows, and the release's wall
-- time showed how many). Always S = options.newton_steps Newton steps (public; default
-- _erm_newton_steps: 16, or 24 for the Huber SVM), each one evaluation of J, grad J and the
-- Hessian at theta, then one evaluation of J at the m step sizes 1, 1/2, ..., 2^-(m-1) along the
-- Newton direction (m = 8 for logistic, 16 for the Huber losses; all of them; the first that
-- passes Armijo is taken, else theta stays), then one last evaluation of J and grad J: 2 S + 1
-- evaluations over all the rows, malformed ones included (as zero rows). Once ||grad J|| <=
-- tolerance (the certificate: then ||theta - argmin J|| <= tolerance/reg, which the mechanisms'
-- extra noise covers) theta is kept, and the later steps' work is done and discarded. Whether
-- and when it certified depend on the rows: the mechanisms release neither, and release the
-- last iterate either way (an uncertified one is outside the proof, the documented
-- approximation; the defaults leave 5-6 steps above the most any measured solve needed).
--
-- Where the evaluations run depends on public numbers only (_erm_in_memory: n, p,
-- dpsql.sampling_memory and the table's layout): a local table whose rows fit is read by ONE
-- scan that keeps the rows and solves in its final function (_glm_solve_rows); any other
-- (larger, or on Citus: the sums are pushed down to the shards) takes 2 S + 1 scans
-- (_glm_sums, _glm_line). Both compute every sum in the same order (each Hessian entry a chain
-- of fma over the rows in their order): on a local table, the same model bit for bit.
------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION dpsql_internal._glm_sums_transition(state float8[], x float8[], y float8,
                                                      theta float8[], loss int, param float8,
                                                      y_bound float8, x_bound float8,
                                                      intercept boolean)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_glm_sums_transition'
LANGUAGE C CALLED ON NULL INPUT PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._glm_sums_combine(a float8[], b float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_glm_sums_combine'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._glm_sums_final(state float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_glm_sums_final'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

-- [n, loss, gradient (p), Hessian (p x p)] of the GLM loss at theta over the rows (noiseless:
-- never released). Rows clipped to x_bound, then the intercept 1 appended; loss 1 logistic,
-- 2 Huber SVM (param = h), 3 Huber regression (param = k, y clamped to y_bound). A NULL or
-- malformed record counts in n and adds nothing. NULL when there are no rows.
CREATE OR REPLACE AGGREGATE dpsql_internal._glm_sums(x float8[], y float8, theta float8[],
                                                     loss int, param float8, y_bound float8,
                                                     x_bound float8, intercept boolean) (
    SFUNC = dpsql_internal._glm_sums_transition,
    STYPE = float8[],
    FINALFUNC = dpsql_internal._glm_sums_final,
    COMBINEFUNC = dpsql_internal._glm_sums_combine,
    PARALLEL = SAFE
);

-- The Newton direction -(H + reg I)^{-1} grad J at theta, J(theta), ||grad J|| and the slope.
CREATE OR REPLACE FUNCTION dpsql_internal._glm_newton(sums float8[], theta float8[], reg float8,
                                                      b float8[], OUT direction float8[],
                                                      OUT objective float8, OUT grad_norm float8,
                                                      OUT slope float8)
AS 'MODULE_PATHNAME', 'dpsql_glm_newton_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._glm_line_transition(state float8[], x float8[], y float8,
                                                               theta float8[], direction float8[],
                                                               loss int, param float8,
                                                               y_bound float8, x_bound float8,
                                                               intercept boolean)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_glm_line_transition'
LANGUAGE C CALLED ON NULL INPUT PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._glm_line_combine(a float8[], b float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_glm_line_combine'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._glm_line_final(state float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_glm_line_final'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

-- The line search's scan: [n, the GLM loss at theta + 2^-k direction for k = 0 .. m - 1 (m: 8
-- logistic, 16 the Huber losses; then zeros up to 16), the loss gradient at theta + direction
-- (p)] over the rows (noiseless: never released); rows and settings as _glm_sums. NULL when
-- there are no rows.
CREATE OR REPLACE AGGREGATE dpsql_internal._glm_line(x float8[], y float8, theta float8[],
                                                     direction float8[], loss int, param float8,
                                                     y_bound float8, x_bound float8,
                                                     intercept boolean) (
    SFUNC = dpsql_internal._glm_line_transition,
    STYPE = float8[],
    FINALFUNC = dpsql_internal._glm_line_final,
    COMBINEFUNC = dpsql_internal._glm_line_combine,
    PARALLEL = SAFE
);

-- theta + t direction for the first of the loss's step sizes t the line sums accept (Armijo,
-- or the full step when it halves ||grad J|| without raising J beyond rounding), else theta.
CREATE OR REPLACE FUNCTION dpsql_internal._glm_line_choose(line float8[], theta float8[],
                                                           direction float8[], reg float8,
                                                           b float8[], objective float8,
                                                           grad_norm float8, slope float8,
                                                           loss int)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_glm_line_choose_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._glm_solve_rows_transition(state internal, x float8[],
                                                                    y float8, p int, loss int,
                                                                    param float8, y_bound float8,
                                                                    x_bound float8,
                                                                    intercept boolean, reg float8,
                                                                    b float8[], tolerance float8,
                                                                    steps int, rows float8)
RETURNS internal AS 'MODULE_PATHNAME', 'dpsql_glm_solve_rows_transition'
LANGUAGE C CALLED ON NULL INPUT;

CREATE OR REPLACE FUNCTION dpsql_internal._glm_solve_rows_final(state internal)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_glm_solve_rows_final'
LANGUAGE C CALLED ON NULL INPUT;

-- The whole solve from one scan (the rows kept in memory, prepared as _glm_sums reads them):
-- [theta (p), ||grad J(theta)||, evaluations over the rows (2 steps + 1)], _erm_solve's scanned
-- path bit for bit. NULL when there are no rows. No combine function, and parallel unsafe:
-- the rows in the one scan's order. rows: the public row count (room for them at once).
CREATE OR REPLACE AGGREGATE dpsql_internal._glm_solve_rows(x float8[], y float8, p int, loss int,
                                                           param float8, y_bound float8,
                                                           x_bound float8, intercept boolean,
                                                           reg float8, b float8[],
                                                           tolerance float8, steps int,
                                                           rows float8) (
    SFUNC = dpsql_internal._glm_solve_rows_transition,
    STYPE = internal,
    FINALFUNC = dpsql_internal._glm_solve_rows_final
);

-- Whether n prepared rows of p coefficients (padded to a multiple of 16, the label and a
-- weight: 8 (p' + 2) bytes each) fit in dpsql.sampling_memory.
CREATE OR REPLACE FUNCTION dpsql_internal._glm_rows_fit(n float8, p int)
RETURNS boolean AS 'MODULE_PATHNAME', 'dpsql_glm_rows_fit'
LANGUAGE C STRICT STABLE PARALLEL SAFE;

-- Whether _erm_solve keeps the rows in memory: a local table (Citus pushes each evaluation's
-- sums down instead) whose rows fit (_glm_rows_fit). Public: n, p and the setting.
CREATE OR REPLACE FUNCTION dpsql_internal._erm_in_memory(train_table text, n float8, p int)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    layout record := dpsql_internal._citus_layout(to_regclass(train_table));
BEGIN
    RETURN n > 0 AND layout.dist_column IS NULL AND NOT layout.single_shard
       AND dpsql_internal._glm_rows_fit(n, p);
END $$;

-- L (sup of one example's gradient norm) and lambda_max (of its rank-1 Hessian).
CREATE OR REPLACE FUNCTION dpsql_internal._glm_constants(loss int, param float8, y_bound float8,
                                                         x_bound float8, intercept boolean, p int,
                                                         OUT lipschitz float8, OUT curvature float8)
AS 'MODULE_PATHNAME', 'dpsql_glm_constants_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

-- v plus one noise vector for L2 sensitivity (delta = 0: Gamma-norm; > 0: analytic Gaussian).
CREATE OR REPLACE FUNCTION dpsql_internal._perturb(v float8[], sensitivity float8, epsilon float8,
                                                   delta float8, seed bigint, stream bigint,
                                                   OUT weights float8[], OUT noise_scale float8)
AS 'MODULE_PATHNAME', 'dpsql_perturb_sql'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

-- Replace-one sensitivity 2 (L + tolerance) / reg of a certified regularised minimiser (A10).
CREATE OR REPLACE FUNCTION dpsql_internal._output_perturbation_sensitivity(lipschitz float8,
                                                                          reg float8,
                                                                          tolerance float8)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_output_perturbation_sensitivity_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- The certificate ||grad J|| <= 1e-8 L sqrt(n) (objective.h: dpsql_erm_tolerance).
CREATE OR REPLACE FUNCTION dpsql_internal._erm_tolerance(lipschitz float8, n float8)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_erm_tolerance_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- S, the solver's default number of Newton steps for a loss (public: the model decides). On
-- Protein's 72,876 rows (bench/objpert_solver.py, and the C kernels on 18 (regulariser, noise)
-- pairs) Newton certified within 7-11 steps for logistic, 3-5 for Huber regression and 10-17 for
-- the Huber SVM (its h-wide quadratic pieces: the active set settles slowly; 18 on one test
-- set); the test data take fewer. The defaults leave 5-6 steps to spare; each costs 2
-- evaluations over the rows.
CREATE OR REPLACE FUNCTION dpsql_internal._erm_newton_steps(loss int)
RETURNS int LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE loss WHEN 2 THEN 24 ELSE 16 END;

-- The plan of the private-ERM solver's mechanisms (output and objective perturbation): the
-- GLM (_glm_plan: the loss, the bounds, the constants, the solver's certificate and steps,
-- the regulariser's inputs), then each mechanism's calibration (NULL: the other's).
DO $$
BEGIN
    CREATE TYPE dpsql_internal.erm_plan AS (
        loss int, param float8, y_bound float8, x_bound float8, intercept boolean, p int,
        classes int, lipschitz float8, curvature float8, tolerance float8, newton_steps int,
        rows bigint, radius float8, radius_default boolean, lambda float8,
        intercept_after_row_transform boolean, row_clip_radius float8,
        outputs int, regularizer float8,
        -- output perturbation: each model's (epsilon, delta) and its sensitivity
        epsilon float8, delta float8, sensitivity float8,
        -- objective perturbation: the linear term's noise and the certificate's extra noise
        noise_scale float8, eps_noise float8, eps_extra float8, delta_extra float8,
        gaussian boolean, extra_sensitivity float8,
        info jsonb);
EXCEPTION WHEN duplicate_object THEN
    NULL;  -- (an upgrade replays this script; a change of its fields needs its ALTER TYPE)
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._glm_plan(text, dpsql.datasets, bigint, int, jsonb, jsonb);
-- The GLM a plan describes: the loss code and parameter of the model, the public bounds, the
-- constants (L, lambda_max), the solver's certificate and cap, and the analyst's lambda and
-- options.radius (a public bound on ||theta*||, default 10, for regression max(10, 2Y)) that
-- set the regulariser. Logistic and Huber SVM are binary classifiers; 'linear' is
-- Huber regression with threshold k (options.huber_threshold, default the label bound):
-- least squares on every residual |r| <= k, and Lipschitz, which least squares is not.
CREATE OR REPLACE FUNCTION dpsql_internal._glm_plan(privacy text, ds dpsql.datasets, n bigint,
                                                    d int, params jsonb, options jsonb)
RETURNS dpsql_internal.erm_plan LANGUAGE plpgsql AS $$
DECLARE
    plan dpsql_internal.erm_plan;
    model text := params->>'model';
    intercept boolean := coalesce((params->>'intercept')::boolean, false);
    p int := d + intercept::int;
    loss int;
    param float8;
    c record;
    -- classification rows are clipped (or normalised) to norm 1 by their registration
    x_bound float8 := CASE WHEN ds.label_bound IS NULL THEN 1 ELSE ds.row_bound END;
    classes int := jsonb_array_length(coalesce(nullif(params->'classes', 'null'), '[]'));
    -- S, the solver's public number of Newton steps (its default: _erm_newton_steps)
    newton_steps float8;
    -- default R: 10, and for regression at least 2Y (Y the label bound): the intercept alone
    -- may have to reach the labels' mean, and 10 is the rule's value at California housing's
    -- Y = 5 (at Y = 400 a bound of 10 kept every model near 0, far worse than the mean)
    radius float8 := dpsql_internal._linear_option(
        options, 'radius', CASE WHEN model = 'linear' THEN greatest(10, 2 * ds.label_bound)
                                ELSE 10 END);
    lambda float8 := coalesce((params->>'lambda')::float8, 0);
BEGIN
    IF NOT (lambda >= 0 AND lambda < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('lambda must be a finite number >= 0, got %s', lambda));
    END IF;
    IF x_bound IS NULL THEN
        PERFORM dpsql_internal._fail(format('%s needs a public bound on ||x||', privacy),
                            hint => 'Register the dataset with row_bound, feature_bounds or row_norm => ''clip''.');
    END IF;
    -- Whether Newton certifies within S steps depends on the data: below Newton's 4-8 steps
    -- the release is an uncertified iterate, outside the proof; only data owners test that.
    IF (options ? 'newton_steps' OR options ? 'max_scans') AND NOT dpsql_internal._is_admin() THEN
        PERFORM dpsql_internal._fail(format('options.%s is for data owners'' tests: whether the solver '
                                            'certifies within a few steps depends on the data',
                                            CASE WHEN options ? 'newton_steps' THEN 'newton_steps'
                                                 ELSE 'max_scans' END), '42501');
    END IF;
    -- max_scans, the cap of the solver before 0.8.0 (which stopped at its certificate), is
    -- read as newton_steps (at most 100)
    IF options ? 'max_scans' THEN
        IF options ? 'newton_steps' THEN
            PERFORM dpsql_internal._fail('options.max_scans is the older name of newton_steps: give one');
        END IF;
        options := options - 'max_scans' || jsonb_build_object(
            'newton_steps', least(dpsql_internal._linear_option(options, 'max_scans', 1, 1, false), 100));
    END IF;
    IF p > 512 THEN
        PERFORM dpsql_internal._fail(format('%s solves a p x p Newton system: at most 512 coefficients, got %s',
                                            privacy, p));
    END IF;
    loss := CASE model WHEN 'logistic' THEN 1 WHEN 'huber' THEN 2 WHEN 'linear' THEN 3 END;
    newton_steps := dpsql_internal._linear_option(options, 'newton_steps',
                                                  dpsql_internal._erm_newton_steps(loss), 1, false);
    IF newton_steps <> floor(newton_steps) OR newton_steps > 100 THEN
        PERFORM dpsql_internal._fail(format('options.newton_steps must be an integer in [1, 100], got %s', newton_steps));
    END IF;
    param := CASE model
        WHEN 'huber' THEN dpsql_internal._huber_h(params)
        WHEN 'linear' THEN dpsql_internal._linear_option(options, 'huber_threshold', ds.label_bound)
        ELSE 0 END;
    IF model = 'huber' AND NOT (param > 0 AND param < 1) THEN
        PERFORM dpsql_internal._fail(format('huber_h must be in (0, 1), got %s', param));
    END IF;
    c := dpsql_internal._glm_constants(loss, param, coalesce(ds.label_bound, 1), x_bound,
                                       intercept, p);
    plan.loss := loss;
    plan.param := param;
    plan.y_bound := coalesce(ds.label_bound, 1);
    plan.x_bound := x_bound;
    plan.intercept := intercept;
    plan.p := p;
    -- the mapped label set's size: three or more classes are
    -- one-vs-rest, split by each plan (_one_vs_rest)
    plan.classes := classes;
    plan.lipschitz := c.lipschitz;
    plan.curvature := c.curvature;
    plan.tolerance := dpsql_internal._erm_tolerance(c.lipschitz, n);
    plan.newton_steps := newton_steps::int;
    plan.rows := n;
    plan.radius := radius;
    -- a classifier's radius left to the default: each plan may raise
    -- it to what its noise affords (_erm_default_radius)
    plan.radius_default := NOT coalesce(options ? 'radius', false) AND model <> 'linear'
                      AND lambda = 0;
    plan.lambda := lambda;
    -- rows clipped to x_bound, then the 1 (33_planned.sql)
    plan.intercept_after_row_transform := intercept;
    -- a regression's x clipped to its row bound (33_planned.sql)
    plan.row_clip_radius := x_bound;
    RETURN plan;
END $$;

-- The SUM loss of the zero model, n l(0): n ln 2 (logistic), n (Huber SVM at margin 0) and
-- n Y^2 / 2 for Huber regression (labels at the bound: a worst case).
CREATE OR REPLACE FUNCTION dpsql_internal._erm_zero_loss(loss int, n bigint, y_bound float8)
RETURNS float8 LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN n * CASE loss WHEN 1 THEN ln(2) WHEN 2 THEN 1 ELSE y_bound ^ 2 / 2 END;

-- The default radius of a classifier (issue 42): the largest R, at least 10, at which the
-- mechanism's excess-loss bound at its default regulariser, excess(R) = c R^a (c and a from
-- the plan: objective perturbation 2 sqrt(E||b||^2) R, card A2; output perturbation
-- (3/4) (8 n beta L^2 k)^(1/3) R^(4/3), card A10), is still below the zero model's loss n l(0):
-- the largest ball in which the bound still promises better than predicting nothing. The
-- radius is the public bound on ||theta*|| that sets the regulariser (reg ~ 1/R); a fixed 10
-- is far below ||theta*|| on rows of many features each using a small share of the unit ball
-- (one-hot rows mapped onto [-1, 1]: ||theta*|| ~ 28 at d = 105; positive numeric columns
-- scaled by public maxima: ~ 44), and the regularised minimiser then predicts the majority
-- class even without noise (||theta_reg|| <= n L / reg). Where the noise is large the rule
-- keeps 10 (ten one-vs-rest models at epsilon 0.1 each on 60,000 rows: 10.2). Public: n, p,
-- epsilon, delta, the loss's constants.
CREATE OR REPLACE FUNCTION dpsql_internal._erm_default_radius(zero_loss float8, c float8, a float8)
RETURNS float8 LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN greatest(10, (zero_loss / c) ^ (1 / a));

-- Refuses (before any charge: plans run first) a model whose default regulariser leaves an
-- expected excess-loss bound above a multiple of the zero model's loss: 20 n ln 2 (logistic)
-- or 20 n (Huber SVM at margin 0), and 1 x n Y^2 / 2 for Huber regression, whose zero-model
-- loss n Y^2 / 2 is itself a worst case (labels at the bound), about 5-10x the real one. The
-- bounds are loose, but beyond them the releases we measured were at or below the majority
-- class or the mean (bench/RESULTS.md, "ERM toolbox defaults"). An analyst's lambda is not
-- judged.
CREATE OR REPLACE FUNCTION dpsql_internal._erm_refuse_useless(privacy text, loss int, n bigint,
                                                              lambda float8, excess float8,
                                                              epsilon float8, outputs int,
                                                              y_bound float8)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    zero_loss float8 := dpsql_internal._erm_zero_loss(loss, n, y_bound);
    times int := CASE WHEN loss = 3 THEN 1 ELSE 20 END;
BEGIN
    IF lambda > 0 OR zero_loss IS NULL OR excess <= times * zero_loss THEN
        RETURN;
    END IF;
    PERFORM dpsql_internal._fail(
        format('%s cannot learn here: at epsilon %s per model its excess-loss bound (%s) is over '
               '%s times the loss of the zero model (%s), on %s rows',
               privacy, epsilon / outputs, round(excess::numeric), times,
               round(zero_loss::numeric), n),
        hint => CASE WHEN outputs > 1
                     THEN 'One-vs-rest splits epsilon over the classes: use a larger epsilon, '
                          'more rows, or privacy => ''auto'' (a multinomial model).'
                     ELSE 'Use a larger epsilon or more rows, or privacy => ''auto''.' END);
END $$;

-- Refuses (before any charge) a binary classifier whose default regulariser shrinks the
-- features' effects away (issue 42). The minimiser of sum l + (reg/2) ||theta||^2 keeps, along a
-- direction u, about the share c_u / (c_u + reg/n) of theta*'s component, c_u <= beta E(u.x)^2
-- the loss's curvature there. Rows of norm <= 1 in p coordinates have sum_j E x_j^2 <= 1: an
-- average direction has E(u.x)^2 <= 1/p, so c_u <= beta / p, while the direction every row
-- shares (the intercept, or the all-(-1) direction of one-hot rows mapped onto [-1, 1]) has
-- E(u.x)^2 near 1 and keeps nearly all of its component: beyond reg/n = beta / p the features
-- keep less than half their effect against the class balance's, and the release predicts the
-- majority class even before noise. Measured (bench default_learning, one-hot rows, d = 105,
-- 24,000 rows): output perturbation at epsilon 1 (reg/n = 2.7 beta/p) gave the majority class
-- (noiseless at that reg too), at epsilon 4 (0.7 beta/p) 0.760. One-vs-rest models are
-- judged by the zero-loss rule alone (the argmax over the classes needs far less signal), an
-- analyst's lambda or radius not at all.
CREATE OR REPLACE FUNCTION dpsql_internal._erm_refuse_shrunk(privacy text, n bigint, p int,
                                                             reg float8, curvature float8,
                                                             judged boolean, outputs int,
                                                             epsilon float8)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT judged OR outputs > 1 OR NOT (reg / n > curvature / p) THEN
        RETURN;
    END IF;
    PERFORM dpsql_internal._fail(
        format('%s cannot learn here: at epsilon %s its default regulariser (reg/n = %s) is above '
               'the loss''s curvature along an average direction of the rows (beta/p = %s), so '
               'the regularised model keeps under half of each feature''s effect and predicts '
               'the majority class', privacy, epsilon, round((reg / n)::numeric, 5),
               round((curvature / p)::numeric, 5)),
        hint => 'Use privacy => ''objective_perturbation'' or ''auto'', a larger epsilon or more rows; '
                'lambda => ... or options => {"radius": ...} runs it anyway.');
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._erm_solve(text, jsonb, float8[], float8);
-- The fixed-work Newton solver (the header above) from theta = 0. positive: the class index of
-- a one-vs-rest model (labels mapped to +1 for it, -1 for the others). scans: the evaluations
-- over the rows (2 S + 1 on either path, whatever the rows: public). A plan without
-- 'newton_steps' takes the default, without 'rows' the scanned path.
CREATE OR REPLACE FUNCTION dpsql_internal._erm_solve(train_table text, plan dpsql_internal.erm_plan, b float8[],
                                                     positive float8 DEFAULT NULL,
                                                     OUT theta float8[], OUT grad_norm float8,
                                                     OUT scans int, OUT certified boolean)
LANGUAGE plpgsql AS $$
DECLARE
    reg float8 := plan.regularizer;
    tolerance float8 := plan.tolerance;
    steps int := coalesce(plan.newton_steps,
                          dpsql_internal._erm_newton_steps(plan.loss));
    p int := plan.p;
    -- one-vs-rest: the class index positive against the rest (a NULL label stays NULL)
    y_expr text := CASE WHEN positive IS NULL THEN 'y'
                        ELSE format('CASE WHEN y = %s THEN 1.0 WHEN y IS NOT NULL THEN -1.0 END',
                                    positive) END;
    q text := format('SELECT dpsql_internal._glm_sums(x, %s, $1, $2, $3, $4, $5, $6) FROM %s',
                     y_expr, train_table);
    q_line text := format('SELECT dpsql_internal._glm_line(x, %s, $1, $2, $3, $4, $5, $6, $7) FROM %s',
                          y_expr, train_table);
    loss int := plan.loss;
    param float8 := plan.param;
    y_bound float8 := plan.y_bound;
    x_bound float8 := plan.x_bound;
    intercept boolean := plan.intercept;
    sums float8[];
    line float8[];
    here record;
    next float8[];
    solved float8[];
BEGIN
    -- the plan's public numbers, checked alike for both paths
    IF NOT (steps BETWEEN 1 AND 100) THEN
        PERFORM dpsql_internal._fail(format('newton_steps must be in [1, 100], got %s', steps));
    END IF;
    IF NOT (reg > 0 AND reg < 'Infinity' AND tolerance >= 0 AND tolerance < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('the solver needs a finite regularizer > 0 and '
                                            'tolerance >= 0, got %s and %s', reg, tolerance));
    END IF;
    IF dpsql_internal._erm_in_memory(train_table, plan.rows::float8, p) THEN
        EXECUTE format('SELECT dpsql_internal._glm_solve_rows(x, %s, $1, $2, $3, $4, $5, $6, $7, '
                       '$8, $9, $10, $11) FROM %s', y_expr, train_table)
           INTO solved USING p, loss, param, y_bound, x_bound, intercept, reg, b, tolerance, steps,
                             plan.rows::float8;
        IF solved IS NULL THEN
            PERFORM dpsql_internal._fail('the training table is empty', 'XX000');
        END IF;
        theta := solved[1:p];
        grad_norm := solved[p + 1];
        scans := solved[p + 2]::int;
        certified := grad_norm <= tolerance;
        RETURN;
    END IF;
    theta := array_fill(0::float8, ARRAY[p]);
    scans := 0;
    FOR s IN 1 .. steps LOOP
        EXECUTE q INTO sums USING theta, loss, param, y_bound, x_bound, intercept;
        IF sums IS NULL THEN
            PERFORM dpsql_internal._fail('the training table is empty', 'XX000');
        END IF;
        here := dpsql_internal._glm_newton(sums, theta, reg, b);
        -- every step size, taken or not (the work is public)
        EXECUTE q_line INTO line USING theta, here.direction, loss, param, y_bound, x_bound,
                                       intercept;
        scans := scans + 2;
        next := dpsql_internal._glm_line_choose(line, theta, here.direction, reg, b,
                                                here.objective, here.grad_norm, here.slope,
                                                loss);
        -- a certified iterate is kept (the step's work done and discarded)
        IF here.grad_norm > tolerance THEN
            theta := next;
        END IF;
    END LOOP;
    -- the certificate at the last iterate
    EXECUTE q INTO sums USING theta, loss, param, y_bound, x_bound, intercept;
    scans := scans + 1;
    grad_norm := (dpsql_internal._glm_newton(sums, theta, reg, b)).grad_norm;
    certified := grad_norm <= tolerance;
    RAISE DEBUG 'dpsql: _erm_solve: % Newton steps by scans, % evaluations', steps, scans;
END $$;
