------------------------------------------------------------------------------------------
-- DPSGD-F, the theoretical version (Sun et al. 2024, §5, Algorithm 2): three private steps at
-- (epsilon/3, delta/3) each, composed basically to (epsilon, delta):
--   1. a diameter-adaptive private mean mu (the s. 3.2 substitute: coordinate-wise EM medians
--      c, an EM radius r of ||x - c||, then c + (sum Clip(x - c, r) + N(0, s^2)) / m);
--   2. tau: an EM quantile of ||x - mu|| at rank m - (100/epsilon) ln m (s. 3.3), plus one
--      grid step;
--   3. DP-SGD on x'' = Clip((x - mu, tau), sqrt(2) tau) with no separate bias (the tau
--      coordinate is the bias), clip norm C = sqrt(2) G tau so that no gradient is clipped,
--      step eta_0 / tau^2; Poisson sampling calibrated by the PLD accountant.
-- Then the map back (ERRATA s. 10.3): w = theta''[1:d], b = tau theta''[d+1] - w . mu. The
-- model is released as (w, b) on the rows as the model sees them (feature bounds and row
-- transform: R = 1), so predict / evaluate (SQL and Python) score w . x + b unchanged.
-- x: the rows after the registration's row transform. Replace-one neighbours, m public: the
-- rank utilities have sensitivity 1, the clipped sum 2 r. A null record (a malformed row)
-- counts as the value 0 / the point c, and is a null record (zero gradient) in the steps.
------------------------------------------------------------------------------------------

-- A deterministic seed per use of a data owner's noise seed (NULL: pg_strong_random).
CREATE OR REPLACE FUNCTION dpsql_internal._alg2_seed(noise_seed bigint, tag text)
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN noise_seed IS NOT NULL
                THEN ('x' || substr(md5(noise_seed::text || ':dpsgd_f_alg2:' || tag), 1, 16))::bit(64)::bigint END
$$;

-- The rows as the model sees them (the row transform applied), NULL for a null record; ids:
-- the training table's id columns (rid; on Citus row_id, rid).
CREATE OR REPLACE FUNCTION dpsql_internal._alg2_rows_sql(train_table text, dim int, row_flags int,
                                                        ids text DEFAULT 'rid')
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT format('SELECT %s, t.y, CASE WHEN cardinality(p.v) = %s THEN p.v END AS x'
                  '  FROM %s t, LATERAL (SELECT dpsql_internal._preprocess(t.x, NULL, %s, NULL) AS v) p',
                  't.' || replace(ids, ', ', ', t.'), dim, train_table, row_flags)
$$;

-- The SQL of ||x - $4|| for a row r of _alg2_rows_sql (NULL for a null record).
CREATE OR REPLACE FUNCTION dpsql_internal._alg2_distance_sql()
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT 'CASE WHEN r.x IS NOT NULL THEN sqrt((SELECT sum((e - $4[k]) ^ 2)'
           ' FROM unnest(r.x) WITH ORDINALITY q(e, k))) END'
$$;

-- An EM quantile (27_estimate_bounds.sql) of the values of value_sql over rows_sql, clamped to
-- [lo, hi] and rounded to the grid of step (a per-record map: free); NULL values count as 0.
-- value_sql may read ref as $4 (a parameter, never a literal: no float text round trip).
CREATE OR REPLACE FUNCTION dpsql_internal._alg2_quantile(rows_sql text, value_sql text, ref float8[],
                                                rank bigint, lo float8, hi float8, step float8,
                                                epsilon float8, seed bigint)
RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
    grid_values float8[];
    counts bigint[];
BEGIN
    EXECUTE format(
        'SELECT coalesce(array_agg(w ORDER BY w), ''{}''), coalesce(array_agg(c ORDER BY w), ''{}'') FROM ('
        '  SELECT %s AS w, count(*) AS c FROM (%s) r GROUP BY 1) v',
        dpsql_internal._grid_sql(format('coalesce(%s, 0)', value_sql)), rows_sql)
        INTO grid_values, counts USING lo, hi, step, ref;
    RETURN dpsql_internal._private_quantile(grid_values, counts, rank, lo, hi, step, epsilon, seed);
END $$;

-- Step 1, PrivMean (a substitute for Sun et al. 2024, Lemma 3, whose mean estimator is Huang,
-- Liang and Yi 2021's) at (epsilon_m, delta_m), R = 1: the mean,
-- and what it is made of (public: derived from released values only).
CREATE OR REPLACE FUNCTION dpsql_internal._alg2_private_mean(rows_sql text, dim int, m bigint,
                                                    epsilon_m float8, delta_m float8,
                                                    noise_seed bigint,
                                                    OUT mean float8[], OUT info jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    step float8 := 1.0 / (m::float8 * m);  -- R / m^2
    c float8[] := '{}';
    rad_rank bigint;
    rad_points float8 := 2 * m::float8 * m + 1;  -- grid points of [0, 2R]
    rad float8;
    s float8;
    total float8[];
    nrm float8;
BEGIN
    -- 1. coordinate-wise medians, rank floor(m/2), range [-R, R], epsilon_m / (3 d) each
    FOR j IN 1..dim LOOP
        c := c || dpsql_internal._alg2_quantile(rows_sql, format('r.x[%s]', j), NULL, greatest(m / 2, 1),
                                       -1, 1, step, epsilon_m / (3 * dim),
                                       dpsql_internal._alg2_seed(noise_seed, 'median' || j));
    END LOOP;
    -- 2. radius: rank m - ceil(2 / (epsilon_m/3) (ln(K + 1) + 2 ln m)), range [0, 2R], plus a step
    rad_rank := least(m, greatest(1, m - ceil(2 / (epsilon_m / 3) * (ln(rad_points) + 2 * ln(m)))::bigint));
    rad := dpsql_internal._alg2_quantile(rows_sql, dpsql_internal._alg2_distance_sql(), c, rad_rank, 0, 2, step, epsilon_m / 3, dpsql_internal._alg2_seed(noise_seed, 'radius')) + step;
    -- 3. c + (sum Clip(x - c, r) + N(0, s^2 I)) / m, replace-one sensitivity 2 r
    s := dpsql.gaussian_sigma(2 * rad, epsilon_m / 3, delta_m);
    EXECUTE format(
        'SELECT array_agg(coalesce(s.v, 0) ORDER BY j) FROM generate_series(1, $1) j LEFT JOIN ('
        '  SELECT u.j, sum(u.v) AS v FROM (%s) r,'
        '         LATERAL (SELECT sqrt(sum((e - $2[k]) ^ 2)) AS n'
        '                    FROM unnest(r.x) WITH ORDINALITY q(e, k)) z,'
        '         unnest(ARRAY(SELECT (e - $2[k]) * CASE WHEN z.n > $3 THEN $3 / z.n ELSE 1 END'
        '                        FROM unnest(r.x) WITH ORDINALITY q(e, k) ORDER BY k))'
        '           WITH ORDINALITY AS u(v, j)'
        '   WHERE r.x IS NOT NULL GROUP BY u.j) s USING (j)', rows_sql)
        INTO total USING dim, c, rad;
    total := dpsql_internal._add_gaussian(total, s, dpsql_internal._alg2_seed(noise_seed, 'mean'), 7101);
    mean := ARRAY(SELECT c[j] + total[j] / m FROM generate_series(1, dim) j);
    -- post-processing: the projection onto the R-ball
    nrm := sqrt((SELECT sum(v * v) FROM unnest(mean) v));
    IF nrm > 1 THEN
        mean := ARRAY(SELECT v / nrm FROM unnest(mean) WITH ORDINALITY q(v, k) ORDER BY k);
    END IF;
    info := jsonb_build_object('coarse_centre', c, 'radius', rad, 'radius_rank', rad_rank,
                               'noise_std', s, 'sensitivity', 2 * rad, 'grid_step', step,
                               'epsilon', epsilon_m, 'delta', delta_m,
                               'split', 'medians epsilon/(3d) each, radius epsilon/3, '
                                        'Gaussian (epsilon/3, delta)');
END $$;

-- Steps 3-4: x'' = Clip((x - mean, tau), sqrt(2) tau) (NULL for a null record).
CREATE OR REPLACE FUNCTION dpsql_internal._alg2_features(x float8[], mean float8[], tau float8)
RETURNS float8[] LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY(SELECT v * least(1, sqrt(2) * tau / nullif(n, 0))
                   FROM unnest(z.a) WITH ORDINALITY q(v, k) ORDER BY k)
      FROM (SELECT a, sqrt((SELECT sum(e * e) FROM unnest(a) e)) AS n
              FROM (SELECT ARRAY(SELECT e - mean[k] FROM unnest(x) WITH ORDINALITY q(e, k) ORDER BY k)
                           || tau AS a) a0) z
     WHERE x IS NOT NULL
$$;

-- Step 6: (w, b) from theta'' (d + 1, or K x (d + 1) for multinomial).
CREATE OR REPLACE FUNCTION dpsql_internal._alg2_map_back(theta float8[], mean float8[], tau float8)
RETURNS float8[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    d int := cardinality(mean);
    out float8[];
BEGIN
    IF array_ndims(theta) = 1 THEN
        RETURN theta[1:d] || (tau * theta[d + 1]
                              - (SELECT sum(theta[k] * mean[k]) FROM generate_series(1, d) k));
    END IF;
    out := array_fill(0::float8, ARRAY[array_length(theta, 1), d + 1]);
    FOR i IN 1..array_length(theta, 1) LOOP
        FOR k IN 1..d LOOP
            out[i][k] := theta[i][k];
        END LOOP;
        out[i][d + 1] := tau * theta[i][d + 1]
                         - (SELECT sum(theta[i][k] * mean[k]) FROM generate_series(1, d) k);
    END LOOP;
    RETURN out;
END $$;

-- Algorithm 2's base step eta_0 (the step is eta_0 / tau^2): the call's step_size, else the
-- default step of rows of norm sqrt(2) tau at tau = 1.
CREATE OR REPLACE FUNCTION dpsql_internal._alg2_eta0(canonical text, params jsonb)
RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
    eta0 float8 := coalesce((params->>'step_size')::float8,
                            dpsql_internal._default_step(canonical, 0.1, sqrt(2)));
BEGIN
    IF NOT (eta0 > 0 AND eta0 < 'Infinity') THEN
        PERFORM dpsql_internal._fail('step_size (eta_0; the step is eta_0 / tau^2) must be a finite number > 0');
    END IF;
    RETURN eta0;
END $$;

-- The release's calibration, DP-SGD's at (epsilon/3, delta/3) with Poisson sampling, at clip
-- norm C and step: tau (noisy) fixes both after the charge; the noise multiplier does not
-- depend on them.
CREATE OR REPLACE FUNCTION dpsql_internal._alg2_sgd_plan(spec jsonb, m bigint, epsilon float8, delta float8,
                                                        clip float8, step float8)
RETURNS dpsql_internal.sgd_plan LANGUAGE sql AS $$
    SELECT dpsql_internal._dpsgd_plan('dpsgd', spec, m, epsilon / 3, delta / 3,
                                      jsonb_build_object('sampling', 'poisson', 'clip_norm', clip,
                                                         'step_size', step))
$$;

DROP FUNCTION IF EXISTS dpsql_internal._train_dpsgd_f_alg2(dpsql.datasets, text, text, jsonb, float8, float8, bigint);
-- DPSGD-F Algorithm 2's plan: its refusals, the run prepared, the calibration at clip 1 and
-- the shape of the run on the rows x'' (d + 1 features, no intercept) checked; charged
-- (epsilon, delta) whole. _complete_dpsgd_f_alg2 after the charge.
CREATE OR REPLACE FUNCTION dpsql_internal._train_dpsgd_f_alg2(ds dpsql.datasets, model text, privacy text,
                                          params jsonb, epsilon float8, delta float8,
                                          noise_seed bigint)
RETURNS dpsql_internal.release_plan LANGUAGE plpgsql AS $$
DECLARE
    canonical text := dpsql_internal._canonical_model(model);
    p dpsql_internal.release_plan;
    r dpsql.runs;
    d int;
BEGIN
    -- Refusals first: nothing is charged (one transaction).
    IF canonical NOT IN ('logistic', 'multinomial') THEN
        PERFORM dpsql_internal._fail('dpsgd_f_alg2 trains logistic (binary) or multinomial models',
                            hint => 'Algorithm 2 is for Lipschitz margin losses; least squares has no gradient bound.');
    END IF;
    IF NOT (delta > 0) THEN
        PERFORM dpsql_internal._fail('dpsgd_f_alg2 is (epsilon, delta)-DP: delta must be > 0');
    END IF;
    IF params->>'noise_multiplier' IS NOT NULL THEN
        PERFORM dpsql_internal._fail('dpsgd_f_alg2 calibrates its noise from epsilon: give epsilon, not noise_multiplier');
    END IF;
    IF params->>'clip_norm' IS NOT NULL THEN
        PERFORM dpsql_internal._fail('dpsgd_f_alg2 clips features to sqrt(2) tau and gradients at sqrt(2) G tau: '
                            'clip_norm is not a parameter');
    END IF;
    IF coalesce((params->>'intercept')::boolean, false) THEN
        PERFORM dpsql_internal._fail('dpsgd_f_alg2 learns its bias through the feature tau: leave intercept false',
                            hint => 'The released model has an intercept (the map back).');
    END IF;
    IF params->>'schedule' IS NOT NULL AND params->>'schedule' <> 'constant'
       OR coalesce((params->>'lambda')::float8, 0) <> 0 THEN
        PERFORM dpsql_internal._fail('dpsgd_f_alg2 runs a constant step eta_0 / tau^2 without regularisation');
    END IF;
    PERFORM dpsql_internal._alg2_eta0(canonical, params);
    IF coalesce((params->>'batch_size')::bigint, 1) < 2 THEN
        params := params || jsonb_build_object('batch_size', greatest(
            50, dpsql_internal._distributed_min_batch(ds)));  -- on Citus: fewer steps
    END IF;
    r := dpsql_internal._prepare_private(ds, model, params);
    d := (r.spec->>'dim')::int;
    p := ROW(NULL, '_complete_dpsgd_f_alg2', ds, model, privacy, params, epsilon, delta, noise_seed,
             r, NULL, NULL, NULL)::dpsql_internal.release_plan;
    -- The calibration from public numbers (clip 1, step 1), then the charge, before any value
    -- is read.
    p.sgd := dpsql_internal._alg2_sgd_plan(r.spec || jsonb_build_object('dim', d + 1), r.rows, epsilon, delta,
                                           1.0, 1.0);
    -- The run's shape, checked before the charge: its state on the rows x'' (d + 1 features, no
    -- intercept) with this calibration (the run is armed after tau, with its clip and step).
    PERFORM dpsql_internal._initial_state(dpsql_internal._alg2_spec(r.spec), p.sgd);
    p.charge := ROW(ds.dataset_id, epsilon, delta, 'dpsgd_f_alg2', NULL, NULL, to_jsonb(p.sgd),
                    false)::dpsql_internal.release_charge;
    RETURN p;
END $$;

-- The run's spec on the rows x'': d + 1 features, no row transform, no intercept (tau is the
-- bias).
CREATE OR REPLACE FUNCTION dpsql_internal._alg2_spec(spec jsonb)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT spec || jsonb_build_object('dim', (spec->>'dim')::int + 1, 'flags', (spec->>'flags')::int & ~7,
                                      'intercept', false)
$$;

-- Over 100 lines: one function because its steps feed each other in one pass after the
-- charge: the private mean and quantile tau from the rows, the rows x'' they make, the run
-- armed with the plan tau fixes (clip and step), the map back.
CREATE OR REPLACE FUNCTION dpsql_internal._complete_dpsgd_f_alg2(p dpsql_internal.release_plan, entry bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    canonical text := dpsql_internal._canonical_model(p.model);
    c record := dpsql.loss_constants(canonical, 0, 0, 0.1);
    eta0 float8 := dpsql_internal._alg2_eta0(canonical, p.params);
    epsilon float8 := p.epsilon;
    delta float8 := p.delta;
    noise_seed bigint := p.noise_seed;
    r dpsql.runs;
    run bigint;
    d int := ((p.run).spec->>'dim')::int;
    m bigint := (p.run).rows;
    row_flags int := ((p.run).spec->>'flags')::int & dpsql_internal._flag('row_transform');
    flags int := ((p.run).spec->>'flags')::int;
    rows_sql text;
    plan dpsql_internal.sgd_plan;
    pm record;
    tau_rank bigint;
    tau_hat float8;
    tau float8;
    clip float8;
    step float8;
    theta float8[];
    released float8[];
    tbl text;
    ids text;
    mid bigint;
BEGIN
    r := dpsql_internal._read_rows(p.run);
    rows_sql := dpsql_internal._alg2_rows_sql(r.train_table, d, row_flags);
    -- 1. private mean at (epsilon/3, delta/3)
    pm := dpsql_internal._alg2_private_mean(rows_sql, d, m, epsilon / 3, delta / 3, noise_seed);
    -- 2. tau at epsilon/3 (pure), rank m - (100 / epsilon) ln m (total epsilon), in [1, m]
    tau_rank := least(m, greatest(1, ceil(m - 100 / epsilon * ln(m))::bigint));
    tau_hat := dpsql_internal._alg2_quantile(rows_sql, dpsql_internal._alg2_distance_sql(), pm.mean, tau_rank,
                                    0, 2, 1.0 / (m::float8 * m), epsilon / 3,
                                    dpsql_internal._alg2_seed(noise_seed, 'tau'));
    tau := tau_hat + 1.0 / (m::float8 * m);
    -- 3-4. the rows x'' in a new table: no row transform, no intercept (tau is the bias)
    -- (on Citus placed like the training table and filled shard by shard)
    tbl := r.train_table || '_a';
    ids := dpsql_internal._derived_training_table(r.train_table, tbl);
    EXECUTE format('INSERT INTO %s (%s, x, y) SELECT %s, dpsql_internal._alg2_features(r.x, $1, $2), r.y'
                   '  FROM (%s) r ORDER BY r.rid', tbl, ids, ids,
                   dpsql_internal._alg2_rows_sql(r.train_table, d, row_flags, ids)) USING pm.mean, tau;
    PERFORM dpsql_internal._replace_training_table(r.train_table, tbl);
    r.spec := dpsql_internal._alg2_spec(r.spec);
    -- 5. DP-SGD: C = sqrt(2) G tau, step eta_0 / tau^2 (the same calibration, now with C).
    -- tau is noisy, so the step is post-processing; it is capped so that a huge eta_0 over a
    -- small tau cannot overflow after the charge (the weights' box guards the rest, sgd.c).
    step := CASE WHEN ln(eta0) - 2 * ln(tau) > ln(1e300) THEN 1e300 ELSE eta0 / (tau * tau) END;
    clip := sqrt(2) * c.lipschitz_data * tau;
    plan := dpsql_internal._alg2_sgd_plan(r.spec, m, epsilon, delta, clip, step);
    run := dpsql_internal._start_run(dpsql_internal._arm(r, plan, noise_seed));
    theta := dpsql_internal._run_epochs(run);
    -- 6. map back; released as (w, b) on the rows after the row transform: the model records
    -- the registered dimension with an intercept
    released := dpsql_internal._alg2_map_back(theta, pm.mean, tau);
    mid := dpsql_internal._finish(run, released, recorded => jsonb_build_object(
        'dim', d, 'intercept', true,
        'flags', (flags & ~dpsql_internal._flag('row_transform')) | dpsql_internal._flag('intercept')),
        privacy => plan.info || jsonb_build_object(
        'mechanism', 'dpsgd_f_alg2', 'dataset_id', (p.ds).dataset_id,
        'algorithm', 'DPSGD-F (Sun, Suresh, Menon 2024, Algorithm 2): private mean, private quantile '
                     'tau, features (x - mean, tau) clipped to sqrt(2) tau, DP-SGD with C = sqrt(2) G tau, '
                     'map back b = tau theta[d+1] - w . mean',
        'epsilon', epsilon, 'delta', delta, 'noise_scale', plan.noise_scale,
        'ledger_entry', entry,
        'composition', 'basic: mean (epsilon/3, delta/3), tau (epsilon/3, 0), DP-SGD (epsilon/3, delta/3)',
        'theta', theta,
        'preprocessing', jsonb_build_object(
            'row_flags', row_flags, 'centre', array_fill(0::float8, ARRAY[d]),
            'mean', pm.mean, 'mean_info', pm.info,
            'tau', tau, 'tau_hat', tau_hat, 'tau_rank', tau_rank, 'tau_epsilon', epsilon / 3,
            'step_size', step, 'eta_0', eta0, 'clip_norm', clip),
        'noise_seed', dpsql_internal._noise_source(noise_seed)));
    PERFORM dpsql_internal._set_ledger_model(entry, mid);
    RETURN mid;
END $$;
