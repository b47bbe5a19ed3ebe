------------------------------------------------------------------------------------------
-- The exact-minimiser toolbox shared by objective perturbation (50_objective_perturbation.sql)
-- and output perturbation (49_output_perturbation.sql), spec 004 cards A2 and A10. C core:
-- core/objective.h (the GLM losses, the Newton direction and every calibration);
-- glue: sql/src/objective_fmgr.c.
--
-- The solver is Newton's method with backtracking on the strongly convex
--   J(theta) = sum_i l(<x_i, theta>, y_i) + (reg/2) ||theta||^2 + <b, theta>,
-- one aggregate scan per iterate (loss, gradient and Hessian at theta). It stops when the
-- certificate ||grad J|| <= tolerance holds (then ||theta - argmin J|| <= tolerance/reg, which
-- the mechanisms' extra noise covers) or after max_scans scans (public: 100, or the data
-- owner's option). Whether and when it certified depend on the rows: the mechanisms release
-- neither, and release the last iterate either way (an uncertified one is outside the proof,
-- the documented approximation: Newton certifies in 5-10 scans on these strongly convex
-- objectives).
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

-- The GLM a plan describes: the loss code and parameter of the model, the public bounds, the
-- constants (L, lambda_max), the solver's certificate and cap, and the analyst's lambda and
-- options.radius (a public bound on ||theta*||, default 10, for regression max(10, 2Y)) that
-- set the regulariser. Logistic and Huber SVM are binary classifiers; 'linear' is
-- Huber regression with threshold k (options.huber_threshold, default the label bound):
-- least squares on every residual |r| <= k, and Lipschitz, which least squares is not.
CREATE OR REPLACE FUNCTION dpsql_internal._glm_plan(privacy text, ds dpsql.datasets, n bigint,
                                                    d int, params jsonb, options jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    model text := params->>'model';
    intercept boolean := coalesce((params->>'intercept')::boolean, false);
    p int := d + intercept::int;
    loss int;
    param float8;
    c record;
    -- classification rows are clipped (or normalised) to norm 1 by their registration
    x_bound float8 := CASE WHEN ds.label_bound IS NULL THEN 1 ELSE ds.row_bound END;
    classes int := jsonb_array_length(coalesce(nullif(params->'classes', 'null'), '[]'));
    max_scans float8 := dpsql_internal._linear_option(options, 'max_scans', 100, 1, false);
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
    -- Whether Newton certifies within a few scans depends on the data: a cap the analyst
    -- could lower would turn the refusal into a probe (charged, but outside the proof).
    IF options ? 'max_scans' AND NOT dpsql_internal._is_admin() THEN
        PERFORM dpsql_internal._fail('options.max_scans is for data owners'' tests: whether the solver '
                                     'certifies within a few scans depends on the data', '42501');
    END IF;
    IF max_scans <> floor(max_scans) OR max_scans > 10000 THEN
        PERFORM dpsql_internal._fail(format('options.max_scans must be an integer in [1, 10000], got %s', max_scans));
    END IF;
    IF p > 512 THEN
        PERFORM dpsql_internal._fail(format('%s solves a p x p Newton system: at most 512 coefficients, got %s',
                                            privacy, p));
    END IF;
    loss := CASE model WHEN 'logistic' THEN 1 WHEN 'huber' THEN 2 WHEN 'linear' THEN 3 END;
    param := CASE model
        WHEN 'huber' THEN dpsql_internal._huber_h(params)
        WHEN 'linear' THEN dpsql_internal._linear_option(options, 'huber_threshold', ds.label_bound)
        ELSE 0 END;
    IF model = 'huber' AND NOT (param > 0 AND param < 1) THEN
        PERFORM dpsql_internal._fail(format('huber_h must be in (0, 1), got %s', param));
    END IF;
    c := dpsql_internal._glm_constants(loss, param, coalesce(ds.label_bound, 1), x_bound,
                                       intercept, p);
    RETURN jsonb_build_object('loss', loss, 'param', param, 'y_bound', coalesce(ds.label_bound, 1),
                              'x_bound', x_bound, 'intercept', intercept, 'p', p,
                              -- the mapped label set's size: three or more classes are
                              -- one-vs-rest, split by each plan (_one_vs_rest)
                              'classes', classes,
                              'lipschitz', c.lipschitz, 'curvature', c.curvature,
                              'tolerance', dpsql_internal._erm_tolerance(c.lipschitz, n),
                              'max_scans', max_scans::int, 'radius', radius, 'lambda', lambda,
                              -- rows clipped to x_bound, then the 1 (33_planned.sql)
                              'intercept_after_row_transform', intercept,
                              -- a regression's x clipped to its row bound (33_planned.sql)
                              'row_clip_radius', x_bound);
END $$;

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
    zero_loss float8 := n * CASE loss WHEN 1 THEN ln(2) WHEN 2 THEN 1 ELSE y_bound ^ 2 / 2 END;
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

-- Newton's method with backtracking (Armijo, or a gradient that shrinks at an objective that
-- does not rise: near the optimum rounding hides the objective's decrease) from theta = 0.
-- positive: the class index of a one-vs-rest model (labels mapped to +1 for it, -1 for the
-- others).
CREATE OR REPLACE FUNCTION dpsql_internal._erm_solve(train_table text, plan jsonb, b float8[],
                                                     positive float8 DEFAULT NULL,
                                                     OUT theta float8[], OUT grad_norm float8,
                                                     OUT scans int, OUT certified boolean)
LANGUAGE plpgsql AS $$
DECLARE
    reg float8 := (plan->>'regularizer')::float8;
    tolerance float8 := (plan->>'tolerance')::float8;
    max_scans int := (plan->>'max_scans')::int;
    -- one-vs-rest: the class index positive against the rest (a NULL label stays NULL)
    q text := format('SELECT dpsql_internal._glm_sums(x, %s, $1, $2, $3, $4, $5, $6) FROM %s',
                     CASE WHEN positive IS NULL THEN 'y'
                          ELSE format('CASE WHEN y = %s THEN 1.0 WHEN y IS NOT NULL THEN -1.0 END',
                                      positive) END,
                     train_table);
    loss int := (plan->>'loss')::int;
    param float8 := (plan->>'param')::float8;
    y_bound float8 := (plan->>'y_bound')::float8;
    x_bound float8 := (plan->>'x_bound')::float8;
    intercept boolean := (plan->>'intercept')::boolean;
    sums float8[];
    here record;
    there record;
    candidate float8[];
    step float8;
    accepted boolean;
BEGIN
    theta := array_fill(0::float8, ARRAY[(plan->>'p')::int]);
    EXECUTE q INTO sums USING theta, loss, param, y_bound, x_bound, intercept;
    scans := 1;
    IF sums IS NULL THEN
        PERFORM dpsql_internal._fail('the training table is empty', 'XX000');
    END IF;
    here := dpsql_internal._glm_newton(sums, theta, reg, b);
    WHILE here.grad_norm > tolerance AND scans < max_scans LOOP
        step := 1;
        LOOP
            candidate := ARRAY(SELECT t + step * dd
                                 FROM unnest(theta, here.direction) WITH ORDINALITY AS u(t, dd, i)
                                ORDER BY i);
            EXECUTE q INTO sums USING candidate, loss, param, y_bound, x_bound, intercept;
            scans := scans + 1;
            there := dpsql_internal._glm_newton(sums, candidate, reg, b);
            -- A shrinking gradient alone must not accept a step that raises the objective:
            -- on piecewise-quadratic losses (Huber) Newton then cycles between two points.
            accepted := there.objective <= here.objective + 1e-4 * step * here.slope
                        OR (there.grad_norm < 0.5 * here.grad_norm
                            AND there.objective <= here.objective + 1e-12 * abs(here.objective));
            -- a step below 1e-12 makes no progress (and bounds the arithmetic above)
            EXIT WHEN accepted OR scans >= max_scans OR step < 1e-12;
            step := step / 2;
        END LOOP;
        EXIT WHEN NOT accepted;
        theta := candidate;
        here := there;
    END LOOP;
    grad_norm := here.grad_norm;
    certified := grad_norm <= tolerance;
END $$;
