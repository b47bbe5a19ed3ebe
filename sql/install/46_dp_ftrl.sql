------------------------------------------------------------------------------------------
-- DP-FTRL with tree aggregation (Thakurta, "Private Optimization", §6.3.2,
-- Algorithm 4; Kairouz et al. 2021), the
-- streaming private optimiser: one ordered scan per epoch, no sampling. Leaves are minibatches
-- of B consecutive rids of the secretly shuffled training table (leaf t = rids ((t-1)B, tB]);
-- a leaf is the SUM of its rows' per-example gradients at the current iterate, clipped to
-- norm C; a streaming binary tree releases noisy prefix sums (node noise N(0, sigma^2 I_p),
-- drawn in C as each node completes) and theta_{t+1} = Pi_{||theta|| <= R}(-S_t / Delta).
-- E epochs restart the tree; S carries the previous epochs' noisy totals. Released: the
-- average of the iterates used (or the last, options.output).
--
-- Privacy (replace-one, n public): a row is in one leaf per epoch and moves it by <= 2C; the
-- leaf enters m = floor(lg n_leaves) + 1 node releases per epoch, so the adaptively composed
-- Gaussian node releases have L2 sensitivity 2C sqrt(m E): sigma is the analytic Gaussian of
-- that sensitivity at (epsilon, delta). C core: core/ftrl.h; glue:
-- sql/src/ftrl_fmgr.c; docs/dp_ftrl.md.
------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION dpsql_internal._dp_ftrl_sigma(clip float8, levels int, epochs int,
                                                         epsilon float8, delta float8)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_ftrl_sigma_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- m = floor(lg n) + 1: the tree levels used over n leaves.
CREATE OR REPLACE FUNCTION dpsql_internal._dp_ftrl_levels(n_leaves bigint)
RETURNS int AS 'MODULE_PATHNAME', 'dpsql_tree_levels_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._dp_ftrl_epoch_transition(state internal, x float8[],
                                                                    y float8, config float8[],
                                                                    s_prev float8[], seed bigint,
                                                                    stream bigint)
RETURNS internal AS 'MODULE_PATHNAME', 'dpsql_ftrl_epoch_transition'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

CREATE OR REPLACE FUNCTION dpsql_internal._dp_ftrl_epoch_final(state internal)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_ftrl_epoch_final'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

-- One epoch over the rows, to be called with ORDER BY rid: config = [loss, huber h, x_bound,
-- y_bound, intercept, p, clip, batch, n, sigma, reg, radius(, canary)]; s_prev the previous epochs'
-- noisy total (NULL: zeros); seed NULL = pg_strong_random; stream = the epoch. Returns
-- [leaves, S_prev + this epoch's noisy total (p), sum of the iterates used (p), last iterate
-- (p)]: all post-processing of the noisy tree nodes.
CREATE OR REPLACE AGGREGATE dpsql_internal._dp_ftrl_epoch(x float8[], y float8, config float8[],
                                                          s_prev float8[], seed bigint,
                                                          stream bigint) (
    SFUNC = dpsql_internal._dp_ftrl_epoch_transition,
    STYPE = internal,
    FINALFUNC = dpsql_internal._dp_ftrl_epoch_final,
    FINALFUNC_MODIFY = READ_WRITE
);

-- On Citus (docs/citus.md): a leaf's sum of clipped gradients at theta over its rows, [rows,
-- leaf (p)], pushed down to the shards and combined on the coordinator, which keeps the epoch
-- (_ftrl_shards_*: the tree, its noise generator and theta, in a bytea that stays there).
CREATE OR REPLACE FUNCTION dpsql_internal._ftrl_leaf_transition(sums float8[], x float8[], y float8,
                                                                config float8[], theta float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_ftrl_leaf_transition'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._ftrl_leaf_combine(a float8[], b float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_ftrl_leaf_combine'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE AGGREGATE dpsql_internal._ftrl_leaf_sum(x float8[], y float8, config float8[],
                                                          theta float8[]) (
    SFUNC = dpsql_internal._ftrl_leaf_transition,
    STYPE = float8[],
    COMBINEFUNC = dpsql_internal._ftrl_leaf_combine,
    PARALLEL = SAFE
);

CREATE OR REPLACE FUNCTION dpsql_internal._ftrl_shards_init(config float8[], s_prev float8[], seed bigint,
                                                            stream bigint)
RETURNS bytea AS 'MODULE_PATHNAME', 'dpsql_ftrl_shards_init'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

CREATE OR REPLACE FUNCTION dpsql_internal._ftrl_shards_theta(state bytea)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_ftrl_shards_theta'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE;

CREATE OR REPLACE FUNCTION dpsql_internal._ftrl_shards_leaf(state bytea, sums float8[])
RETURNS bytea AS 'MODULE_PATHNAME', 'dpsql_ftrl_shards_leaf'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

CREATE OR REPLACE FUNCTION dpsql_internal._ftrl_shards_final(state bytea)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_ftrl_shards_final'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

-- One epoch of DP-FTRL on a distributed training table: the leaves are the members' table's
-- steps (each row in exactly one, a keyed uniform draw: _dp_ftrl_fit); each leaf one pushed-down
-- sum at the coordinator's theta, then its tree nodes and noise on the coordinator. Returns
-- _dp_ftrl_epoch's array.
CREATE OR REPLACE FUNCTION dpsql_internal._dp_ftrl_epoch_distributed(members text, label text, config float8[],
                                                                     s_prev float8[], seed bigint,
                                                                     stream bigint, leaves bigint)
RETURNS float8[] LANGUAGE plpgsql AS $$
DECLARE
    st bytea := dpsql_internal._ftrl_shards_init(config, s_prev, seed, stream);
    sums float8[];
BEGIN
    FOR t IN 1 .. leaves LOOP
        EXECUTE format('SELECT dpsql_internal._ftrl_leaf_sum(x, %s, $1, $2) FROM %s WHERE step = $3',
                       label, members)
           INTO sums USING config, dpsql_internal._ftrl_shards_theta(st), t;
        st := dpsql_internal._ftrl_shards_leaf(st, sums);
        PERFORM dpsql_internal._progress('leaf', t, leaves);
    END LOOP;
    RETURN dpsql_internal._ftrl_shards_final(st);
END $$;

-- The plan of DP-FTRL: the C core's configuration (ftrl.h) and the passes over it.
DO $$
BEGIN
    CREATE TYPE dpsql_internal.dp_ftrl_plan AS (
        intercept_after_row_transform boolean, row_clip_radius float8,
        config float8[], p int, epochs int, leaves bigint, output text, outputs int,
        info jsonb);
EXCEPTION WHEN duplicate_object THEN
    NULL;  -- (an upgrade replays this script; a change of its fields needs its ALTER TYPE)
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._dp_ftrl_plan(text, dpsql.datasets, bigint, int, float8, float8, jsonb);
-- The plan: every number from n, d, the registration and the analyst's parameters.
-- Over 100 lines: one sequential argument, each number from the ones before it (one-vs-rest's
-- budget sets the clip, the clip the batch search, the batch the tree's levels and sigma, those
-- the refusals and the regulariser) and all of them in the record; most of its length is the
-- measurements behind its two refusals.
CREATE OR REPLACE FUNCTION dpsql_internal._dp_ftrl_plan(privacy text, ds dpsql.datasets, n bigint,
                                                        d int, epsilon float8, delta float8,
                                                        params jsonb)
RETURNS dpsql_internal.dp_ftrl_plan LANGUAGE plpgsql AS $$
DECLARE
    plan dpsql_internal.dp_ftrl_plan;
    options jsonb := dpsql_internal._plan_options(privacy, params);
    model text := params->>'model';
    intercept boolean := coalesce((params->>'intercept')::boolean, false);
    p int := d + intercept::int;
    classes int := jsonb_array_length(coalesce(nullif(params->'classes', 'null'), '[]'));
    ovr record;
    outputs int;
    loss int := CASE model WHEN 'logistic' THEN 1 WHEN 'huber' THEN 2 WHEN 'linear' THEN 3 END;
    huber_h float8 := dpsql_internal._huber_h(params);
    -- classification rows are clipped (or normalised) to norm 1 by their registration
    x_bound float8 := CASE WHEN ds.label_bound IS NULL THEN 1 ELSE ds.row_bound END;
    y_bound float8 := coalesce(ds.label_bound, 1);
    epochs int := coalesce((params->>'epochs')::int, 1);
    -- regression: at least 2Y, the rule of every ERM mechanism (45_erm_solver.sql, _glm_plan)
    radius float8 := dpsql_internal._linear_option(
        options, 'radius', CASE WHEN model = 'linear' THEN greatest(10, 2 * ds.label_bound)
                                ELSE 10 END);
    output text := coalesce(options->>'output', 'average');
    clip float8;
    batch bigint := (params->>'batch_size')::bigint;
    leaves bigint;
    levels int;
    sigma float8;
    steps bigint;
    noisy_nodes bigint;
    g float8;
    b_noise float8;
    reg float8;
BEGIN
    IF loss IS NULL THEN
        PERFORM dpsql_internal._fail(format('%s trains logistic, huber or linear models, not %s', privacy, model));
    END IF;
    IF NOT (delta > 0) THEN
        PERFORM dpsql_internal._fail(format('%s adds Gaussian noise: it needs delta > 0', privacy));
    END IF;
    IF x_bound IS NULL THEN
        PERFORM dpsql_internal._fail(format('%s needs a public bound on ||x||', privacy),
                            hint => 'Register the dataset with row_bound, feature_bounds or row_norm => ''clip''.');
    END IF;
    IF p > 4096 THEN
        PERFORM dpsql_internal._fail(format('%s: at most 4096 coefficients, got %s', privacy, p));
    END IF;
    IF model = 'huber' AND NOT (huber_h > 0 AND huber_h < 1) THEN
        PERFORM dpsql_internal._fail(format('huber_h must be in (0, 1), got %s', huber_h));
    END IF;
    IF NOT (epochs BETWEEN 1 AND 1000) THEN
        PERFORM dpsql_internal._fail(format('epochs must be in 1..1000, got %s', epochs));
    END IF;
    IF output NOT IN ('average', 'last') THEN
        PERFORM dpsql_internal._fail(format('options.output must be ''average'' or ''last'', got %s',
                                            options->'output'));
    END IF;
    -- three or more classes: one-vs-rest, C binary models on all the rows, (epsilon, delta) / C each
    ovr := dpsql_internal._one_vs_rest(model, classes, epsilon, delta);
    outputs := ovr.models;
    -- C: the per-example gradient bound of the classifiers (|l'| <= 1, ||(x, 1)|| <= rx: no
    -- clipping happens); least squares: the rule of every least-squares mechanism (34_defaults.sql).
    clip := coalesce((params->>'clip_norm')::float8,
                     CASE WHEN loss = 3 THEN dpsql_internal._least_squares_clip(ds)
                          ELSE sqrt(x_bound ^ 2 + intercept::int) END);
    IF NOT (clip > 0 AND clip < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('clip_norm must be a finite number > 0, got %s', clip));
    END IF;
    IF batch IS NULL THEN
        -- the smallest B (doubling from 1, at most n/10) whose noisy prefix sum per row,
        -- sigma sqrt(p m) / B, is <= C / 4 (sigma depends on m, which depends on B)
        batch := 1;
        LOOP
            leaves := (n + batch - 1) / batch;
            levels := dpsql_internal._dp_ftrl_levels(leaves);
            sigma := dpsql_internal._dp_ftrl_sigma(clip, levels, epochs, ovr.model_epsilon,
                                                   ovr.model_delta);
            EXIT WHEN sigma * sqrt(p * levels) / batch <= clip / 4 OR batch * 2 > n / 10;
            batch := batch * 2;
        END LOOP;
        -- on Citus each leaf is a round trip to every shard: at most 2,000 leaves an epoch
        batch := greatest(batch, dpsql_internal._distributed_min_batch(ds, n));
    ELSIF NOT (batch BETWEEN 1 AND n) THEN
        PERFORM dpsql_internal._fail(format('batch_size must be in 1..%s (the rows), got %s', n, batch));
    END IF;
    leaves := (n + batch - 1) / batch;
    levels := dpsql_internal._dp_ftrl_levels(leaves);
    sigma := dpsql_internal._dp_ftrl_sigma(clip, levels, epochs, ovr.model_epsilon, ovr.model_delta)
             -- (an audit's half_noise mutation, a superuser's test switch: 52_audit.sql)
             / CASE WHEN dpsql_internal._mutation() = 'half_noise' THEN 2 ELSE 1 END;
    steps := epochs * leaves;
    -- the noise in S at any step: at most (E - 1) popcount(n_leaves) + m nodes
    noisy_nodes := (epochs - 1) * length(replace(leaves::bit(63)::text, '0', '')) + levels;
    -- Refused before any charge when the noise of one prefix sum, sigma sqrt(p m), is at
    -- least half the largest total gradient n C: the iterates would be mostly noise, whatever
    -- the regulariser (public numbers only). Least squares: a quarter, since C bounds the
    -- gradient at a residual of the label bound and the zero model's residuals average at
    -- most about half of it (at n C / 2, 310 rows of labels up to 400 released models far
    -- worse than the mean). One-vs-rest: all of n C, since the argmax over the classes' noisy
    -- scores beats the majority class with far less signal per model (ten digits at epsilon
    -- 0.4 each: 0.16 against 0.11).
    IF sigma * sqrt(p * levels)
       >= n * clip / (CASE WHEN loss = 3 THEN 4 WHEN outputs > 1 THEN 1 ELSE 2 END) THEN
        PERFORM dpsql_internal._fail(
            format('%s cannot learn here: the noise of a prefix sum (sigma sqrt(p m) = %s) is at '
                   'least %s of the largest total gradient of the %s rows (n C = %s) at epsilon %s',
                   privacy, round((sigma * sqrt(p * levels))::numeric, 1),
                   CASE WHEN loss = 3 THEN 'a quarter' WHEN outputs > 1 THEN 'all' ELSE 'half' END, n,
                   round((n * clip)::numeric, 1), ovr.model_epsilon),
            hint => 'Use privacy => ''auto'' or ''objective_perturbation'' (one noise draw, not one '
                    'per tree node), a larger epsilon, more rows or fewer features.');
    END IF;
    -- Issue 42: a binary classifier at the default leaves and regulariser is refused when it
    -- would take fewer than 200 steps (epochs x leaves). theta_{t+1} = -S_t / Delta is gradient
    -- descent with the constant step 1/Delta on leaf sums: the first leaves' gradients point
    -- along what every row shares (the class balance), and a step that moves the model there
    -- in a few leaves overshoots into the majority class, while a step that does not cannot
    -- reach the margin in few leaves. Measured without noise (epsilon 1000) on one-hot and
    -- numeric rows (bench default_learning): 12 to 47 leaves of 512-2048 rows stayed at the
    -- majority class at every regulariser from 0.05 to 10^4; 480 leaves of 50 rows learned
    -- (0.78-0.79 at Delta = 5). The noise rule's leaves are that large because the prefix sums'
    -- noise sigma sqrt(p m) does not shrink with the leaf (at 50 rows: 6-16 times the gradient
    -- bound at epsilon 1 on 24,000 rows), so 200 steps need about 100,000 rows per unit of
    -- epsilon. It did learn in 16-18 leaves where the signal is strong (HI: 0.77 at epsilon 1,
    -- majority 0.61; a 24-column one-hot design of large effects: 0.80), and those are refused
    -- too: nothing public tells them apart. One-vs-rest models are not refused: the argmax
    -- over ten noisy scores beat the majority class on MNIST-50 at these leaves (0.55 at
    -- epsilon 1), nor is least squares. A batch_size or options.regularizer given runs it
    -- anyway.
    IF loss IN (1, 2) AND outputs = 1 AND steps < 200 AND params->>'batch_size' IS NULL
       AND NOT coalesce(options ? 'regularizer', false) THEN
        PERFORM dpsql_internal._fail(
            format('%s at its defaults does not learn a binary classifier here: at epsilon %s its '
                   'noise needs leaves of %s rows, %s steps in all, and its constant-step lazy '
                   'updates need more than 200 to leave the majority class (measured even '
                   'without noise)', privacy, epsilon, batch, steps),
            hint => 'Use privacy => ''objective_perturbation'' (no sampling either) or ''auto''; '
                    'batch_size => ... or options => {"regularizer": ...} runs it anyway.');
    END IF;
    g := batch * clip;
    b_noise := sigma * sqrt(noisy_nodes) * (sqrt(p) + sqrt(2 * ln(steps / 0.05)));
    -- Delta: the derived regret bound's sqrt(2 T (g^2 + g B)) / R (from Thakurta's Theorem 6.15
    -- proof) assumes every leaf's gradient has norm g and all point one way; on real data they
    -- mostly cancel, and
    -- that Delta keeps ||theta|| near 1, where a logistic model predicts the majority class
    -- (bench/RESULTS.md, "ERM toolbox defaults"). So the default divides it by 10 for the
    -- classifiers and by 2 for least squares, whose gradients grow with the residual instead of
    -- saturating (a smaller Delta overshoots). Privacy does not depend on Delta.
    reg := dpsql_internal._linear_option(options, 'regularizer',
                                         sqrt(2 * steps * (g ^ 2 + g * b_noise)) / radius
                                         / CASE WHEN loss = 3 THEN 2 ELSE 10 END);
    -- rows clipped to x_bound, then the 1 (ftrl.c; 33_planned.sql records it)
    plan.intercept_after_row_transform := intercept;
    plan.row_clip_radius := x_bound;
    -- the C core's layout (ftrl.h)
    plan.config := ARRAY[loss, CASE WHEN loss = 2 THEN huber_h ELSE 0 END, x_bound, y_bound,
                    intercept::int, p, clip, batch, n, sigma, reg, radius]::float8[];
    plan.leaves := leaves;
    plan.p := p;
    plan.epochs := epochs;
    plan.output := output;
    plan.outputs := outputs;
    plan.info := jsonb_build_object(
        'algorithm', 'DP-FTRL with tree aggregation (Thakurta, Private Optimization, Algorithm 4; '
                     'Kairouz et al. 2021): '
                     'minibatch leaves of consecutive shuffled rows, one ordered scan per '
                     'epoch, a fresh tree per epoch',
        'accounting', format('Gaussian: the node releases of %s epochs x %s levels, L2 '
                             'sensitivity 2 C sqrt(m E) = %s, analytic Gaussian sigma %s',
                             epochs, levels, 2 * clip * sqrt(levels * epochs), sigma),
        'loss', model, 'clip_norm', clip, 'batch_size', batch, 'leaves', leaves,
        'levels', levels, 'epochs', epochs, 'steps', steps, 'noise_std', sigma,
        'noise_multiplier', sigma / (2 * clip * sqrt(levels * epochs)),
        'regularizer', reg, 'radius', radius, 'output', output,
        'huber_h', CASE WHEN loss = 2 THEN huber_h END, 'x_bound', x_bound,
        'one_vs_rest', outputs > 1, 'model_epsilon', ovr.model_epsilon,
        'model_delta', ovr.model_delta,
        'neighbouring', 'replace-one, n public');
    RETURN plan;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._dp_ftrl_fit(text, jsonb, bigint);
CREATE OR REPLACE FUNCTION dpsql_internal._dp_ftrl_fit(train_table text, plan dpsql_internal.dp_ftrl_plan, noise_seed bigint,
                                                       OUT weights float8[], OUT info jsonb,
                                                       OUT iterates float8[])
LANGUAGE plpgsql AS $$
DECLARE
    p int := plan.p;
    epochs int := plan.epochs;
    outputs int := coalesce(plan.outputs, 1);
    -- (and the Dirac canary switch of an owner's audit of this run's copy: 65_audit_dirac.sql)
    config float8[] := plan.config
                       || CASE WHEN dpsql_internal._audit_canary_flags(jsonb_build_object('source',
                                    (SELECT r.spec->>'source' FROM dpsql.runs r
                                      WHERE r.train_table = _dp_ftrl_fit.train_table))) <> 0
                               THEN ARRAY[1::float8] ELSE '{}' END;
    s_prev float8[];
    theta_sum float8[];
    last float8[];
    out float8[];
    leaves bigint;
    w float8[];
    label text;
    -- Citus: each row's leaf a keyed uniform draw on its shard (docs/citus.md)
    members text;
    per_epoch bigint := plan.leaves;
    key record;
BEGIN
    weights := '{}';
    IF (dpsql_internal._citus_layout(train_table::regclass)).dist_column IS NOT NULL THEN
        members := dpsql_internal._members_table(train_table, p - config[5]::int);
        -- the leaves are secret, as one node's shuffled order; an owner's noise seed fixes them
        -- (a privacy unit's slots: each its own stream, _draw_key_sql)
        key := dpsql_internal._draw_key_sql(train_table,
                                            CASE WHEN noise_seed IS NULL THEN dpsql_internal._random_seed()
                                                 ELSE noise_seed # x'5A5A5A5A5A5A5A5A'::bigint END);
        PERFORM dpsql_internal._insert_on_shards(format(
            'INSERT INTO %s (row_id, step, x, y) SELECT t.row_id, dpsql_internal._uniform_index(%s,'
            ' %s, %s), t.x, t.y FROM %s t ORDER BY 2, 1', members, key.seed_sql, key.id_sql, per_epoch,
            train_table),
            'DP-FTRL''s leaves');
    END IF;
    FOR c IN 0 .. outputs - 1 LOOP
        s_prev := NULL;
        theta_sum := array_fill(0::float8, ARRAY[p]);
        leaves := 0;
        FOR e IN 1 .. epochs LOOP
            -- one-vs-rest: class c against the rest (a NULL label stays NULL); the streams of
            -- the noise keep the models' and epochs' draws apart
            label := CASE WHEN outputs > 1
                          THEN format('CASE WHEN y = %s THEN 1.0 WHEN y IS NOT NULL THEN -1.0 END', c)
                          ELSE 'y' END;
            IF members IS NOT NULL THEN
                out := dpsql_internal._dp_ftrl_epoch_distributed(members, label, config, s_prev, noise_seed,
                                                                 (c::bigint << 32) + e, per_epoch);
            ELSE
                EXECUTE format('SELECT dpsql_internal._dp_ftrl_epoch(x, %s, $1, $2, $3, $4 ORDER BY rid) FROM %s',
                               label, train_table)
                   INTO out USING config, s_prev, noise_seed, (c::bigint << 32) + e;
            END IF;
            IF out IS NULL THEN
                PERFORM dpsql_internal._fail('the training table is empty', 'XX000');
            END IF;
            leaves := leaves + out[1]::bigint;
            s_prev := out[2 : p + 1];
            theta_sum := ARRAY(SELECT a + b FROM unnest(theta_sum, out[p + 2 : 2 * p + 1]) WITH ORDINALITY
                                             AS u(a, b, i) ORDER BY i);
            last := out[2 * p + 2 : 3 * p + 1];
            PERFORM dpsql_internal._progress('epoch', c::bigint * epochs + e, outputs::bigint * epochs);
        END LOOP;
        w := CASE WHEN plan.output = 'last' THEN last
                  ELSE ARRAY(SELECT a / leaves FROM unnest(theta_sum) WITH ORDINALITY AS u(a, i)
                              ORDER BY i) END;
        weights := CASE WHEN outputs > 1 THEN weights || ARRAY[w] ELSE w END;
    END LOOP;
    IF members IS NOT NULL THEN
        EXECUTE format('DROP TABLE %s', members);
    END IF;
    info := jsonb_build_object('scans', epochs * outputs, 'iterates_averaged',
                               CASE WHEN plan.output = 'last' THEN 1 ELSE leaves END,
                               'leaf_assignment', CASE WHEN members IS NOT NULL
                                              THEN 'each row''s leaf a keyed uniform draw (Citus)'
                                              ELSE 'consecutive rows of the shuffled table' END);
    iterates := NULL;
END $$;
