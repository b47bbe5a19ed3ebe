------------------------------------------------------------------------------------------
-- DP-AMBSSGD and DP-SSGD (Varshney et al. 2022, "(Nearly) optimal private linear regression via
-- adaptive clipping", COLT 2022, Algorithms 1-3): one pass over a shuffled training table, in one
-- aggregate call (core/ambssgd.h). The state holds noiseless intermediate values
-- (residuals, gradient sums): it stays inside the server; _ambssgd_result releases the
-- private transcript only. Not granted to anyone here (the entry points call these). Then
-- their plans (public numbers only) and their shared fit.
------------------------------------------------------------------------------------------

-- A fresh pass state (w_0 = 0). stat > 0: adaptive clipping (DP-STAT, levels
-- domain 2^(i - levels), count noise sigma_c, threshold theta, zeta_t = r_x gamma_t log_factor);
-- stat = 0: fixed clipping norm zeta_fixed (DP-SSGD with batch 1 and blocks = n_rows).
-- The noise generator is keyed by pg_strong_random, or by seed (tests only: not private).
CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_init(dim int, intercept boolean, x_bound float8,
                                               n_rows bigint, blocks int, batch bigint,
                                               stat bigint, alpha float8, eta float8,
                                               r_x float8, log_factor float8, domain float8,
                                               levels int, sigma_c float8, theta float8,
                                               zeta_fixed float8, seed bigint)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_ambssgd_init_state'
LANGUAGE C CALLED ON NULL INPUT VOLATILE PARALLEL UNSAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_transition(state float8[], x float8[], y float8,
                                                     init float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_ambssgd_transition'
LANGUAGE C CALLED ON NULL INPUT VOLATILE PARALLEL UNSAFE;

-- The whole one-pass algorithm: rows count in the order they arrive (call it with
-- ORDER BY rid); init comes from _ambssgd_init and is used for one pass only. Sequential by
-- nature: no combine function, never in a parallel plan. Malformed rows (NULL x or y, wrong
-- length, NaN/Inf) are zero records, never errors.
CREATE OR REPLACE AGGREGATE dpsql.ambssgd_pass(x float8[], y float8, init float8[]) (
    SFUNC = dpsql_internal._ambssgd_transition,
    STYPE = float8[],
    PARALLEL = UNSAFE
);

-- The released transcript of a finished pass: the tail average w_bar, gamma_t and zeta_t of
-- every block, and how many noisy counts each block's DP-STAT made (<= levels + 1).
CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_result(state float8[], OUT weights float8[],
                                                 OUT gammas float8[], OUT zetas float8[],
                                                 OUT draws int[], OUT rows_used bigint,
                                                 OUT rows_unused bigint)
AS 'MODULE_PATHNAME', 'dpsql_ambssgd_result_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

-- DP-AMBSSGD on Citus (ambssgd_shards_fmgr.c, docs/citus.md): the same pass, block by block.
-- The shards number their rows (the shards by name, each one's rows in (rid, row id) order:
-- a data-independent order, as one node's rid order) and file the used rows of block t under
-- step 2t + 1 (its stat sample) or 2t + 2 (its gradient batch); each block's residual counts
-- and clipped-gradient sum are pushed-down aggregates at the coordinator's probe (w_t and the
-- block's clipping norm), and the coordinator's state takes DP-STAT and the noisy step.
CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_block_steps(blocks int, batch bigint, stat bigint,
                                                              rows bigint, relation oid, shards text[],
                                                              counts bigint[], rid bigint, row_id bigint)
RETURNS int[] AS 'MODULE_PATHNAME', 'dpsql_ambssgd_block_steps'
LANGUAGE C STABLE PARALLEL UNSAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_probe(state float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_ambssgd_probe_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_stat_transition(sums float8[], x float8[], y float8,
                                                                  probe float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_ambssgd_stat_transition'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_gradient_transition(sums float8[], x float8[],
                                                                      y float8, probe float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_ambssgd_gradient_transition'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_sums_combine(a float8[], b float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_ambssgd_sums_combine_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- A stat sample's residuals at the probe's w_t, by DP-STAT level: [rows, bucket counts].
CREATE OR REPLACE AGGREGATE dpsql_internal._ambssgd_stat_counts(x float8[], y float8, probe float8[]) (
    SFUNC = dpsql_internal._ambssgd_stat_transition,
    STYPE = float8[],
    COMBINEFUNC = dpsql_internal._ambssgd_sums_combine,
    PARALLEL = SAFE
);

-- A gradient batch's clipped gradients at the probe's w_t and zeta_t: [rows, clipped, sum].
CREATE OR REPLACE AGGREGATE dpsql_internal._ambssgd_gradient_sum(x float8[], y float8, probe float8[]) (
    SFUNC = dpsql_internal._ambssgd_gradient_transition,
    STYPE = float8[],
    COMBINEFUNC = dpsql_internal._ambssgd_sums_combine,
    PARALLEL = SAFE
);

-- The coordinator's state after its block's DP-STAT, then after its noisy step.
CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_block_stat(state float8[], counts float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_ambssgd_block_stat_sql'
LANGUAGE C CALLED ON NULL INPUT VOLATILE PARALLEL UNSAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_block_step(state float8[], sums float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_ambssgd_block_step_sql'
LANGUAGE C CALLED ON NULL INPUT VOLATILE PARALLEL UNSAFE;

-- The blocks of a pass from a fresh state, over a members' table (row_id, step, x, y) that
-- files block t's stat sample under step 2t + 1 and its batch under 2t + 2, each step's rows in
-- the pass's order: two aggregates a block (pushed down on Citus). The state, with its
-- generator, stays here; the shards get its probes.
CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_blocks(members text, blocks int, stat bigint,
                                                         st float8[])
RETURNS float8[] LANGUAGE plpgsql AS $$
DECLARE
    sums float8[];
BEGIN
    FOR t IN 0 .. blocks - 1 LOOP
        IF stat > 0 THEN
            EXECUTE format('SELECT dpsql_internal._ambssgd_stat_counts(x, y, $1) FROM %s WHERE step = $2', members)
               INTO sums USING dpsql_internal._ambssgd_probe(st), 2 * t + 1;
            st := dpsql_internal._ambssgd_block_stat(st, sums);
        END IF;
        EXECUTE format('SELECT dpsql_internal._ambssgd_gradient_sum(x, y, $1) FROM %s WHERE step = $2', members)
           INTO sums USING dpsql_internal._ambssgd_probe(st), 2 * t + 2;
        st := dpsql_internal._ambssgd_block_step(st, sums);
        PERFORM dpsql_internal._progress('block', t + 1, blocks);
    END LOOP;
    RETURN st;
END $$;

-- The plan of DP-AMBSSGD and DP-SSGD (one fit): every public number the fit uses; NULL where
-- the mechanism has none (DP-SSGD's DP-STAT, DP-AMBSSGD's fixed clip).
DO $$
BEGIN
    CREATE TYPE dpsql_internal.ambssgd_plan AS (
        epsilon float8, delta float8, rho float8, noise_multiplier float8,
        blocks bigint, batch_size bigint, stat_size bigint, step_size float8, r_x float8,
        h_norm float8, log_factor float8, domain_bound float8, levels int,
        count_noise_std float8, stat_threshold float8, beta_stat float8, clip_norm float8,
        x_bound float8, intercept boolean, dim int, rows bigint,
        intercept_after_row_transform boolean, row_clip_radius float8, unused_rows bigint,
        info jsonb);
EXCEPTION WHEN duplicate_object THEN
    NULL;  -- (an upgrade replays this script; a change of its fields needs its ALTER TYPE)
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._ambssgd_fill_blocks(text, jsonb);
-- The members' table of a pass over a distributed training table: the blocks' rows filed on
-- the shards, exactly T (b + s) of them (or the run fails before any block).
CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_fill_blocks(train_table text, plan dpsql_internal.ambssgd_plan)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    blocks int := plan.blocks::int;
    b bigint := plan.batch_size;
    s bigint := plan.stat_size;
    members text := dpsql_internal._members_table(train_table, plan.dim);
    l record := dpsql_internal._shard_row_counts(train_table);
    got bigint;
BEGIN
    got := dpsql_internal._insert_on_shards(format(
        'INSERT INTO %s (row_id, step, x, y)'
        ' SELECT o.row_id, unnest(dpsql_internal._ambssgd_block_steps(%s, %s, %s, %s, o.tableoid, %L, %L,'
        '                                                           o.rid, o.row_id::bigint)), o.x, o.y'
        '   FROM (SELECT tableoid, row_id, rid, x, y FROM %s ORDER BY rid, row_id) o'
        '  ORDER BY 2, o.rid, o.row_id',
        members, blocks, b, s, plan.rows, l.shards, l.counts, train_table),
        'DP-AMBSSGD''s blocks');
    IF got <> blocks * (b + s) THEN
        PERFORM dpsql_internal._fail(format('the shards filed %s rows in DP-AMBSSGD''s blocks, not %s x %s: '
                                            'a shard''s rows were not numbered in one scan', got, blocks, b + s),
                                     'XX000');
    END IF;
    RETURN members;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._ambssgd_pass_on_shards(text, jsonb, float8[]);
-- The pass over a distributed training table from a fresh state.
CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_pass_on_shards(train_table text, plan dpsql_internal.ambssgd_plan,
                                                                 st float8[])
RETURNS float8[] LANGUAGE plpgsql AS $$
DECLARE
    members text := dpsql_internal._ambssgd_fill_blocks(train_table, plan);
BEGIN
    st := dpsql_internal._ambssgd_blocks(members, plan.blocks::int, plan.stat_size, st);
    EXECUTE format('DROP TABLE %s', members);
    RETURN st;
END $$;

-- R_x: the "expected x norm" of Varshney et al. 2022, §2 (E||x||^2 x x^T <= R_x^2 H); the
-- registered bound on ||x|| is one (plus the intercept's constant 1).
CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_r_x(privacy text, options jsonb, x_bound float8,
                                              intercept boolean)
RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
    r_x float8 := dpsql_internal._linear_option(options, 'r_x', sqrt(nullif(x_bound, 0) ^ 2 + intercept::int));
BEGIN
    IF r_x IS NULL THEN
        PERFORM dpsql_internal._fail(format('%s needs a public R_x (a bound on ||x||)', privacy),
                            hint => 'Register the dataset with row_bound (or feature_bounds), or pass options => ''{"r_x": ...}''.');
    END IF;
    RETURN r_x;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._ambssgd_plan(text, dpsql.datasets, bigint, int, float8, float8, jsonb);
-- The plan of DP-AMBSSGD (its registered plan_function, called by _train_planned, 33_planned.sql).
-- Over 100 lines: one sequential argument (the blocks set the batch, the batch the step, the
-- noise the DP-STAT threshold, each checked where it is made), then its typed plan, a field a line.
CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_plan(privacy text, ds dpsql.datasets, n bigint, d int,
                                               epsilon float8, delta float8, params jsonb)
RETURNS dpsql_internal.ambssgd_plan LANGUAGE plpgsql AS $$
DECLARE
    plan dpsql_internal.ambssgd_plan;
    options jsonb;
    intercept boolean;
    p int;
    rho float8;
    x_bound float8;
    r_x float8;
    h_norm float8;
    blocks bigint;
    m bigint;
    s bigint;
    b bigint;
    eta float8;
    alpha float8;
    levels int;
    sigma_c float8;
    gamma_hat float8;
    beta_s float8;
    domain float8;
    log_factor float8;
BEGIN
    SELECT * INTO options, intercept, p, rho, x_bound
      FROM dpsql_internal._linear_plan_common(privacy, ds, d, epsilon, delta, params);
    r_x := dpsql_internal._ambssgd_r_x(privacy, options, x_bound, intercept);
    -- Varshney et al. 2022, Algorithm 2, with constants the paper leaves to O(.): T = c1 kappa
    -- ln N blocks (even), blocks of b + s rows with s = floor(m / 11); eta = b / (R_x^2 + (b - 1)
    -- ||H||) (Lemma 22); DP-STAT (Algorithm 3) made robust: n_q = L + 1 counts of std
    -- alpha sqrt(n_q) (the paper calibrates for L counts but its loop can run L + 1), threshold
    -- s - Gamma_hat instead of s (which overshoots geometrically), a refusal when s < 2 Gamma_hat
    -- (below that DP-STAT returns a tiny level), and Delta = B 2^-L with L = ceil(log2 N) (the
    -- paper's B / N^100 underflows).
    h_norm := dpsql_internal._linear_option(options, 'h_norm', r_x ^ 2);  -- ||H|| <= E||x||^2 <= R_x^2
    blocks := coalesce((params->>'steps')::bigint,
                       2 * ceil(dpsql_internal._linear_option(options, 'c1', 8)
                                * dpsql_internal._linear_option(options, 'condition_number', 1, 1, false)
                                * ln(n) / 2)::bigint);
    IF blocks < 2 OR blocks % 2 <> 0 THEN
        PERFORM dpsql_internal._fail(format('DP-AMBSSGD needs an even number of blocks >= 2 (steps), got %s', blocks));
    END IF;
    m := n / blocks;
    s := m / 11;
    b := m - s;
    IF s < 1 OR b < 1 THEN
        PERFORM dpsql_internal._fail(format('%s rows make no blocks of a stat sample and a batch for %s blocks',
                                   n, blocks),
                            hint => 'Use fewer blocks (steps), more rows, or privacy => ''dpgd'' (or ''auto'').');
    END IF;
    eta := coalesce((params->>'step_size')::float8,
                    dpsql_internal._linear_option(options, 'step_scale', 1) * b / (r_x ^ 2 + (b - 1) * h_norm));
    -- Paper accounting: DP-STAT and the gradient step each 1/(2 alpha^2)-zCDP, added (rho =
    -- 1/alpha^2: two shares of rho); tight: a record is in one of them only (rho =
    -- 1/(2 alpha^2), s. 3.4). alpha is the noise of a sensitivity-1 release.
    alpha := dpsql_internal._zcdp_sigma(1, rho, CASE WHEN coalesce((options->>'tight_accounting')::boolean, false)
                                                     THEN 1 ELSE 2 END);
    levels := ceil(log(2, n::numeric))::int;
    sigma_c := alpha * sqrt(levels + 1);
    beta_s := dpsql_internal._linear_option(options, 'beta_stat', 1e-3);
    IF beta_s >= 1 THEN
        PERFORM dpsql_internal._fail('options.beta_stat must be in (0, 1)');
    END IF;
    gamma_hat := sigma_c * sqrt(2 * ln(2 * (levels + 1) / beta_s));
    IF s < 2 * gamma_hat THEN
        PERFORM dpsql_internal._fail(format('DP-STAT is infeasible: stat samples of %s rows < 2 Gamma = %s '
                                   '(it would return a tiny clip norm and learn nothing)',
                                   s, round(2 * gamma_hat)),
                            hint => format('Needs about %s rows at this epsilon and %s blocks; use more rows, '
                                           'a larger epsilon or fewer blocks (steps), or privacy => ''dpgd'' '
                                           '(or ''auto''), which works on this many rows.',
                                           ceil(2 * gamma_hat) * 11 * blocks, blocks));
    END IF;
    domain := dpsql_internal._linear_option(options, 'domain_bound', 2 * ds.label_bound);
    log_factor := ln(n) ^ dpsql_internal._linear_option(options, 'log_exponent', 0.5, 0, false);
    -- zeta_t <= r_x B log_factor; the noise's normals stay below 100 sd.
    PERFORM dpsql_internal._check_finite_run(eta, blocks, r_x * domain * log_factor * (1 + 200 * alpha * sqrt(p)));
    plan.epsilon := epsilon;
    plan.delta := delta;
    plan.rho := rho;
    plan.noise_multiplier := alpha;
    plan.blocks := blocks;
    plan.batch_size := b;
    plan.stat_size := s;
    plan.step_size := eta;
    plan.r_x := r_x;
    plan.h_norm := h_norm;
    plan.log_factor := log_factor;
    plan.domain_bound := domain;
    plan.levels := levels;
    plan.count_noise_std := sigma_c;
    plan.stat_threshold := s - gamma_hat;
    plan.beta_stat := beta_s;
    plan.x_bound := x_bound;
    plan.intercept := intercept;
    plan.dim := d;
    plan.rows := n;
    -- rows clipped to x_bound, then the 1 (ambssgd.c; 33_planned.sql records it)
    plan.intercept_after_row_transform := intercept;
    plan.row_clip_radius := nullif(x_bound, 0);
    plan.unused_rows := n - blocks * (b + s);
    plan.info := jsonb_build_object(
        'algorithm', 'DP-AMBSSGD (Varshney, Thakurta, Jain 2022; one pass, robust DP-STAT V1-V4)',
        'accounting', CASE WHEN coalesce((options->>'tight_accounting')::boolean, false)
                           THEN 'zCDP, parallel composition over blocks, rho = 1/(2 alpha^2) (a record is in DP-STAT or the step)'
                           ELSE 'zCDP, parallel composition over blocks, rho = 1/alpha^2 (paper)' END,
        'rho', rho, 'noise_multiplier', alpha, 'blocks', blocks, 'batch_size', b,
        'stat_size', s, 'step_size', eta, 'r_x', r_x, 'h_norm', h_norm,
        'log_factor', log_factor, 'domain_bound', domain, 'levels', levels,
        'count_noise_std', sigma_c, 'stat_threshold', s - gamma_hat,
        'gradient_noise_std', '2 zeta_t alpha / b on the mean gradient',
        'unused_rows', n - blocks * (b + s),
        'neighbouring', 'replace-one, n public');
    RETURN plan;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._ssgd_plan(text, dpsql.datasets, bigint, int, float8, float8, jsonb);
-- The plan of DP-SSGD (its registered plan_function, called by _train_planned, 33_planned.sql).
CREATE OR REPLACE FUNCTION dpsql_internal._ssgd_plan(privacy text, ds dpsql.datasets, n bigint, d int,
                                            epsilon float8, delta float8, params jsonb)
RETURNS dpsql_internal.ambssgd_plan LANGUAGE plpgsql AS $$
DECLARE
    plan dpsql_internal.ambssgd_plan;
    options jsonb;
    intercept boolean;
    p int;
    rho float8;
    x_bound float8;
    r_x float8;
    blocks bigint;
    zeta float8;
    eta float8;
    alpha float8;
    sd float8;
BEGIN
    SELECT * INTO options, intercept, p, rho, x_bound
      FROM dpsql_internal._linear_plan_common(privacy, ds, d, epsilon, delta, params);
    r_x := dpsql_internal._ambssgd_r_x(privacy, options, x_bound, intercept);
    -- Varshney et al. 2022, Algorithm 1: batch 1, one pass, fixed clip zeta, noise 2 zeta alpha on
    -- each step's gradient; each record is in one Gaussian step (parallel composition; no
    -- amplification by shuffling is claimed: rho = 1/(2 alpha^2)).
    blocks := (n / 2) * 2;
    zeta := coalesce((params->>'clip_norm')::float8, r_x * ds.label_bound);
    IF NOT (zeta > 0 AND zeta < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('clip_norm must be a finite number > 0, got %s', zeta));
    END IF;
    eta := coalesce((params->>'step_size')::float8, 1 / (2 * r_x ^ 2));
    alpha := dpsql_internal._zcdp_sigma(1, rho);
    PERFORM dpsql_internal._check_finite_run(eta, blocks, zeta * (1 + 200 * alpha * sqrt(p)));
    -- Constant-step SGD settles with the iterate's noise covariance about
    -- (eta s^2 / 2) H^-1 (s the gradient noise std), so a row's prediction noise has
    -- E (x^T noise)^2 = eta s^2 p / 2 whatever H: public. At the label bound or above, the
    -- release predicts no better than 0; it is refused unless reproducing the baseline.
    sd := sqrt(eta * p / 2) * 2 * zeta * alpha;
    IF sd >= ds.label_bound AND NOT coalesce((options->>'baseline')::boolean, false) THEN
        PERFORM dpsql_internal._fail(format('DP-SSGD''s noise would swamp the model: its predictions would carry '
                                   'noise of sd %s, beyond the label bound %s', round(sd::numeric, 2),
                                   ds.label_bound),
                            hint => 'One noisy step per row is the paper''s baseline: use privacy => '
                                    '''dpgd'', ''adassp'' or ''auto'', or options => {"baseline": true} '
                                    'to reproduce it anyway.');
    END IF;
    plan.epsilon := epsilon;
    plan.delta := delta;
    plan.rho := rho;
    plan.noise_multiplier := alpha;
    plan.blocks := blocks;
    plan.batch_size := 1;
    plan.stat_size := 0;
    plan.step_size := eta;
    plan.r_x := r_x;
    plan.clip_norm := zeta;
    plan.x_bound := x_bound;
    plan.intercept := intercept;
    plan.dim := d;
    plan.rows := n;
    plan.intercept_after_row_transform := intercept;
    plan.row_clip_radius := nullif(x_bound, 0);
    plan.unused_rows := n - blocks;
    plan.info := jsonb_build_object(
        'algorithm', 'DP-SSGD (Varshney, Thakurta, Jain 2022, Algorithm 1; baseline)',
        'accounting', 'zCDP, one Gaussian step per record (parallel composition), rho = 1/(2 alpha^2); no shuffling amplification',
        'rho', rho, 'noise_multiplier', alpha, 'clip_norm', zeta, 'step_size', eta,
        'r_x', r_x, 'gradient_noise_std', 2 * zeta * alpha, 'unused_rows', n - blocks,
        'stationary_prediction_noise_sd', sd,
        'neighbouring', 'replace-one, n public');
    RETURN plan;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._ambssgd_fit(text, jsonb, bigint);
-- DP-AMBSSGD / DP-SSGD: one aggregate scan of the shuffled training table in rid order (on
-- Citus, DP-AMBSSGD's blocks on the shards).
CREATE OR REPLACE FUNCTION dpsql_internal._ambssgd_fit(train_table text, plan dpsql_internal.ambssgd_plan, noise_seed bigint,
                                              OUT weights float8[], OUT info jsonb,
                                              OUT iterates float8[])
LANGUAGE plpgsql
SET max_parallel_workers_per_gather = 0
SET synchronize_seqscans = off
AS $$
DECLARE
    st float8[];
    res record;
BEGIN
    st := dpsql_internal._ambssgd_init(
        plan.dim, plan.intercept, plan.x_bound,
        plan.rows, plan.blocks::int, plan.batch_size,
        plan.stat_size, plan.noise_multiplier,
        plan.step_size, plan.r_x,
        coalesce(plan.log_factor, 1), coalesce(plan.domain_bound, 1),
        coalesce(plan.levels, 0), coalesce(plan.count_noise_std, 0),
        coalesce(plan.stat_threshold, 0), coalesce(plan.clip_norm, 0),
        noise_seed);
    -- One pass in the order of the (data-independent) permutation.
    IF (dpsql_internal._citus_layout(train_table::regclass)).dist_column IS NOT NULL THEN
        st := dpsql_internal._ambssgd_pass_on_shards(train_table, plan, st);
    ELSE
        EXECUTE format('SELECT dpsql.ambssgd_pass(x, y, $1 ORDER BY rid) FROM %s', train_table)
           INTO st USING st;
    END IF;
    res := dpsql_internal._ambssgd_result(st);
    weights := res.weights;
    -- The transcript (gamma_t, zeta_t) is covered by the guarantee (Varshney et al. 2022, Theorem
    -- 9).
    info := CASE WHEN plan.stat_size > 0
                 THEN jsonb_build_object('released_gammas', res.gammas, 'released_zetas', res.zetas)
                 ELSE '{}' END;
    iterates := NULL;
END $$;
