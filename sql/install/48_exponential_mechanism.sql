------------------------------------------------------------------------------------------
-- Exponential-mechanism ERM on a public grid (Thakurta, "Private Optimization", §6.2.1,
-- Algorithm 1), pure epsilon-DP, p <= 5:
-- one scan sums the loss at every grid point, the draw is made in C. C core and proofs:
-- core/exp_mech_erm.h; glue: sql/src/exp_mech_erm_fmgr.c;
-- docs/exponential_mechanism.md.
------------------------------------------------------------------------------------------

-- L over the ball of radius R_C: R_x (logistic, huber) or R_x (R_x R_C + Y) (linear).
CREATE OR REPLACE FUNCTION dpsql_internal._em_lipschitz(model text, r_x float8, radius float8,
                                                        y_bound float8)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_em_lipschitz_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._em_losses_transition(state float8[], x float8[], y float8,
                                                                model text, dim int, intercept boolean,
                                                                x_bound float8, y_bound float8,
                                                                radius float8, huber_h float8,
                                                                max_points int)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_em_losses_transition'
LANGUAGE C CALLED ON NULL INPUT PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._em_losses_combine(a float8[], b float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_em_losses_combine'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- The state [header, grid (G x p), Loss(0), Loss(g_1..g_G)]: the SUM loss of the clipped rows
-- at the anchor 0 and every point of the public grid (exp_mech_erm.h). Noiseless: internal
-- (the fit hands it to _em_release only).
CREATE OR REPLACE AGGREGATE dpsql_internal._em_losses(x float8[], y float8, model text, dim int,
                                                      intercept boolean, x_bound float8,
                                                      y_bound float8, radius float8,
                                                      huber_h float8, max_points int) (
    SFUNC = dpsql_internal._em_losses_transition,
    STYPE = float8[],
    COMBINEFUNC = dpsql_internal._em_losses_combine,
    PARALLEL = SAFE
);

CREATE OR REPLACE FUNCTION dpsql_internal._em_release(state float8[], epsilon float8, delta_u float8,
                                                      seed bigint DEFAULT NULL,
                                                      OUT weights float8[], OUT grid_points int)
AS 'MODULE_PATHNAME', 'dpsql_em_release_sql'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

-- The plan of exponential-mechanism ERM: its grid, bounds and score sensitivity.
DO $$
BEGIN
    CREATE TYPE dpsql_internal.em_plan AS (
        intercept_after_row_transform boolean, row_clip_radius float8, model text,
        intercept boolean, dim int, rows bigint, x_bound float8, y_bound float8, radius float8,
        grid_points int, huber_h float8, epsilon float8, delta_u float8,
        info jsonb);
EXCEPTION WHEN duplicate_object THEN
    NULL;  -- (an upgrade replays this script; a change of its fields needs its ALTER TYPE)
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._em_plan(text, dpsql.datasets, bigint, int, float8, float8, jsonb);
CREATE OR REPLACE FUNCTION dpsql_internal._em_plan(privacy text, ds dpsql.datasets, n bigint, d int,
                                                   epsilon float8, delta float8, params jsonb)
RETURNS dpsql_internal.em_plan LANGUAGE plpgsql AS $$
DECLARE
    plan dpsql_internal.em_plan;
    options jsonb := dpsql_internal._plan_options(privacy, params);
    model text := params->>'model';
    intercept boolean := coalesce((params->>'intercept')::boolean, false);
    p int := d + intercept::int;
    radius float8;
    points float8 := dpsql_internal._linear_option(options, 'grid_points', 4096, 1, false);
    huber_h float8 := dpsql_internal._huber_h(params);
    x_bound float8;
    r_x float8;
    y_bound float8 := 0;
    lip float8;
BEGIN
    IF delta > 0 THEN
        PERFORM dpsql_internal._fail('exponential_mechanism is pure epsilon-DP: it takes delta => 0',
                                     hint => 'Pass delta => 0 (the mechanism cannot use delta).');
    END IF;
    IF model NOT IN ('logistic', 'huber', 'linear') THEN
        PERFORM dpsql_internal._fail(format('exponential_mechanism trains model => logistic, huber or linear, not %s',
                                            quote_literal(model)));
    END IF;
    IF p > 5 THEN
        PERFORM dpsql_internal._fail(format('exponential-mechanism ERM is for p <= 5: the grid grows as k^p, '
                                            'so at p = %s coefficients a grid of at most 65536 points '
                                            'has %s points per axis, too coarse to beat the majority '
                                            'class or the mean', p, floor(65536 ^ (1.0 / p))),
                                     hint => 'Use privacy => ''auto'', or ''objective_perturbation'' with '
                                             'delta => 0 for pure epsilon-DP at any p up to 512.');
    END IF;
    IF points <> floor(points) OR points > 65536 THEN
        PERFORM dpsql_internal._fail(format('options.grid_points must be a whole number between 1 and 65536, got %s',
                                            points));
    END IF;
    IF model <> 'linear' AND jsonb_array_length(params->'classes') <> 2 THEN
        PERFORM dpsql_internal._fail('exponential_mechanism trains binary classifiers (2 classes)',
                                     hint => 'Use privacy => ''auto'' or ''objective_perturbation'' '
                                             '(one-vs-rest) for more classes.');
    END IF;
    IF model = 'linear' THEN
        IF ds.row_bound IS NULL THEN
            PERFORM dpsql_internal._fail('exponential_mechanism needs a public bound on ||x||',
                                hint => 'Register the dataset with row_bound, feature_bounds or row_norm => ''clip''.');
        END IF;
        x_bound := ds.row_bound;
        y_bound := ds.label_bound;
    ELSE
        x_bound := 1;  -- classification rows: row_norm clip or unit, ||x|| <= 1
    END IF;
    -- Default R_C: regression max(1, Y), so that the intercept can reach any label mean (at
    -- R_C = 1 California housing's income model stayed far above the mean's MSE); classifiers
    -- 10, as every ERM mechanism (at R_C = 1 every margin is <= 1 and the draw predicted the
    -- majority class).
    radius := dpsql_internal._linear_option(options, 'radius',
                                            CASE WHEN model = 'linear' THEN greatest(1, y_bound)
                                                 ELSE 10 END);
    IF NOT (huber_h > 0 AND huber_h < 1) THEN
        PERFORM dpsql_internal._fail('huber_h must be in (0, 1)');
    END IF;
    r_x := sqrt(x_bound ^ 2 + intercept::int);
    lip := dpsql_internal._em_lipschitz(model, r_x, radius, y_bound);
    -- rows clipped to x_bound, then the 1 (exp_mech_erm.c; 33_planned.sql records it)
    plan.intercept_after_row_transform := intercept;
    plan.row_clip_radius := x_bound;
    plan.model := model;
    plan.intercept := intercept;
    plan.dim := d;
    plan.rows := n;
    plan.x_bound := x_bound;
    plan.y_bound := y_bound;
    plan.radius := radius;
    plan.grid_points := points::int;
    plan.huber_h := huber_h;
    plan.epsilon := epsilon;
    plan.delta_u := 2 * lip * radius;
    plan.info := jsonb_build_object(
        'algorithm', format('exponential-mechanism ERM (Thakurta, Private Optimization, Algorithm 1) '
                            'on a public grid of at most %s '
                            'points in the L2 ball of radius %s, anchored at 0, one scan', points::int, radius),
        'accounting', 'pure epsilon-DP: one exponential mechanism',
        'lipschitz', lip, 'radius', radius, 'delta_u', 2 * lip * radius, 'r_x', r_x,
        'y_bound', CASE WHEN model = 'linear' THEN y_bound END,
        'theta0', 0, 'neighbouring', 'replace-one, n public');
    RETURN plan;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._em_fit(text, jsonb, bigint);
CREATE OR REPLACE FUNCTION dpsql_internal._em_fit(train_table text, plan dpsql_internal.em_plan, noise_seed bigint,
                                                  OUT weights float8[], OUT info jsonb,
                                                  OUT iterates float8[])
LANGUAGE plpgsql AS $$
DECLARE
    st float8[];
    rel record;
BEGIN
    EXECUTE format('SELECT dpsql_internal._em_losses(x, y, $1, $2, $3, $4, $5, $6, $7, $8) FROM %s',
                   train_table)
       INTO st USING plan.model, plan.dim, plan.intercept,
                     plan.x_bound, plan.y_bound,
                     plan.radius, plan.huber_h,
                     plan.grid_points;
    IF st IS NULL THEN  -- no rows: every score is 0, the draw is uniform
        EXECUTE 'SELECT dpsql_internal._em_losses(NULL, NULL, $1, $2, $3, $4, $5, $6, $7, $8)'
           INTO st USING plan.model, plan.dim, plan.intercept,
                         plan.x_bound, plan.y_bound,
                         plan.radius, plan.huber_h,
                         plan.grid_points;
    END IF;
    rel := dpsql_internal._em_release(st, plan.epsilon, plan.delta_u,
                                      noise_seed);
    weights := rel.weights;
    info := jsonb_build_object('grid_size', rel.grid_points);
    iterates := NULL;
END $$;
