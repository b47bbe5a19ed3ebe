------------------------------------------------------------------------------------------
-- DPSGD-F* (Sun et al. 2024, "The importance of feature preprocessing for differentially private
-- linear optimization", Appendix C, Algorithm 3): private feature preprocessing for DP linear
-- classification.
-- A private mean of the rows (Gaussian mechanism on their sum), the rows centred on it, then
-- DP-SGD with Poisson sampling and an ordinary bias. The mean's Gaussian and the steps are
-- composed in the same PLD accountant (as the paper's Lemma 9 does: not an epsilon split). The mean
-- is released with the model (preprocessing.mean) and folded into its intercept: coef and
-- intercept score the registered features after the row transform, as x . coef + intercept.
------------------------------------------------------------------------------------------

-- Share of epsilon that fixes the mean's noise: it sets the noise multiplier p of the mean
-- (the analytic Gaussian for (mean_fraction * epsilon, delta) alone), and the accountant then
-- calibrates the steps so that the composition of both is (epsilon, delta).
CREATE OR REPLACE FUNCTION dpsql_internal._dpsgd_f_mean_fraction()
RETURNS float8 LANGUAGE sql IMMUTABLE AS 'SELECT 0.1::float8';

-- The rows' noisy mean: rows as the model sees them (bounds applied in the training table),
-- scaled by 1 / x_bound, put through the row transform (clip or unit: norm <= 1) and scaled
-- back, summed, a null record counting as zero, plus N(0, std^2 I) (replace-one sensitivity
-- 2 x_bound), divided by the public m.
CREATE OR REPLACE FUNCTION dpsql_internal._private_mean(train_table text, dim int, row_flags int, rows bigint,
                                    noise_std float8, noise_seed bigint,
                                    x_bound float8 DEFAULT 1)
RETURNS float8[] LANGUAGE plpgsql AS $$
DECLARE
    total float8[];
BEGIN
    EXECUTE format('SELECT array_agg(coalesce(s.v, 0) ORDER BY j)'
                   '  FROM generate_series(1, $2) j LEFT JOIN ('
                   '    SELECT u.j, sum(u.v) * $3 AS v'
                   '      FROM %s t, unnest(dpsql_internal._preprocess('
                   '             CASE WHEN $3 = 1 THEN t.x ELSE ARRAY(SELECT e / $3 FROM unnest(t.x)'
                   '                  WITH ORDINALITY AS q(e, k) ORDER BY k) END, NULL, $1, NULL))'
                   '           WITH ORDINALITY AS u(v, j)'
                   -- a row of another length is a null record (zero), not a partial sum
                   '     WHERE cardinality(t.x) = $2'
                   '     GROUP BY u.j) s USING (j)', train_table)
       INTO total USING row_flags, dim, x_bound;
    total := dpsql_internal._add_gaussian(total, noise_std, noise_seed, 7001);
    RETURN ARRAY(SELECT v / rows FROM unnest(total) WITH ORDINALITY AS u(v, j) ORDER BY j);
END $$;

-- The mean's noise: its share of epsilon, the rows' norm bound x_bound (1 for classifiers: the
-- row transform's unit rows) and the noise std for (mean_epsilon, delta) alone at replace-one
-- sensitivity 2 x_bound; std / x_bound is the accountant's prefix multiplier (the steps'
-- multiplier is std / C at sensitivity 2 C).
CREATE OR REPLACE FUNCTION dpsql_internal._dpsgd_f_mean_noise(ds dpsql.datasets, model text, epsilon float8,
                                                             delta float8, OUT x_bound float8,
                                                             OUT mean_epsilon float8, OUT std float8)
LANGUAGE plpgsql AS $$
BEGIN
    x_bound := CASE WHEN dpsql_internal._canonical_model(model) = 'linear' THEN ds.row_bound ELSE 1 END;
    mean_epsilon := dpsql_internal._dpsgd_f_mean_fraction() * epsilon;
    std := dpsql.gaussian_sigma(2 * x_bound, mean_epsilon, delta);
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._train_dpsgd_f(dpsql.datasets, text, text, jsonb, float8, float8, bigint);
-- DPSGD-F*'s plan: its refusals, the run prepared, DP-SGD's plan with the mean's noise in its
-- accountant, the state armed for the centred rows; _complete_dpsgd_f after the charge.
CREATE OR REPLACE FUNCTION dpsql_internal._train_dpsgd_f(ds dpsql.datasets, model text, privacy text,
                                     params jsonb, epsilon float8, delta float8,
                                     noise_seed bigint)
RETURNS dpsql_internal.release_plan LANGUAGE plpgsql AS $$
DECLARE
    canonical text := dpsql_internal._canonical_model(model);
    mean record;
    r dpsql.runs;
    p dpsql_internal.release_plan;
BEGIN
    IF canonical = 'linear' AND (ds.label_bound IS NULL OR ds.row_bound IS NULL) THEN
        PERFORM dpsql_internal._fail('dpsgd_f for least squares needs a regression dataset with a public bound on ||x||',
                            hint => 'Register it with label_bound and row_bound (or feature_bounds).');
    END IF;
    IF NOT (delta > 0) THEN
        PERFORM dpsql_internal._fail('dpsgd_f is (epsilon, delta)-DP: delta must be > 0');
    END IF;
    IF NOT (params->>'intercept')::boolean THEN  -- a value given: the default is true
        PERFORM dpsql_internal._fail('dpsgd_f centres the rows on a private mean: its model always has an intercept',
                                     hint => 'Leave intercept NULL (or true); the centring is folded into it at release.');
    END IF;
    -- Always Poisson sampling, the sampling the composed accountant assumes (the paper
    -- leaves the sampling open); 'shuffle' is dpsql.train's default for sampling, so it cannot mean
    -- a choice here.
    IF params->>'noise_multiplier' IS NOT NULL THEN
        PERFORM dpsql_internal._fail('dpsgd_f calibrates its noise from epsilon: give epsilon, not noise_multiplier');
    END IF;
    -- Poisson batches of expected size 1 would cost a step per row: b < 2 means the default 50.
    IF coalesce((params->>'batch_size')::bigint, 1) < 2 THEN
        params := params || jsonb_build_object('batch_size', greatest(
            50, dpsql_internal._distributed_min_batch(ds)));  -- on Citus: fewer steps
    END IF;
    mean := dpsql_internal._dpsgd_f_mean_noise(ds, model, epsilon, delta);
    r := dpsql_internal._prepare_private(ds, model, params);
    p := ROW(NULL, '_complete_dpsgd_f', ds, model, privacy, params, epsilon, delta, noise_seed,
             NULL, NULL, NULL, NULL)::dpsql_internal.release_plan;
    -- the registration's clip / unit rows
    p.fit := jsonb_build_object('row_flags', (r.spec->>'flags')::int & dpsql_internal._flag('row_transform'));
    -- The plan (and the charge) before any private number is computed from the rows.
    p.sgd := dpsql_internal._dpsgd_plan('dpsgd', r.spec, r.rows, epsilon, delta,
                                        params || jsonb_build_object('sampling', 'poisson',
                                                                     'prefix_noise_multiplier',
                                                                     mean.std / mean.x_bound));
    -- the run trains on the centred rows (_complete_dpsgd_f), with the bias as a plain feature
    -- 1: its state is armed for them before the charge
    r.spec := r.spec || jsonb_build_object(
        'flags', ((r.spec->>'flags')::int & ~dpsql_internal._flag('row_transform'))
                 | dpsql_internal._flag('intercept'),
        'intercept', true);
    p.run := dpsql_internal._arm(r, p.sgd, noise_seed);
    -- the mean and the steps
    p.charge := ROW(ds.dataset_id, (p.sgd).epsilon, (p.sgd).delta, 'dpsgd_f', NULL, (p.sgd).dp_event,
                    to_jsonb(p.sgd), false)::dpsql_internal.release_charge;
    RETURN p;
END $$;

-- DPSGD-F* after its charge: the rows read, their private mean, the rows centred on it, the
-- epochs, the model in the registered features' space.
CREATE OR REPLACE FUNCTION dpsql_internal._complete_dpsgd_f(p dpsql_internal.release_plan, entry bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    canonical text := dpsql_internal._canonical_model(p.model);
    mean record := dpsql_internal._dpsgd_f_mean_noise(p.ds, p.model, p.epsilon, p.delta);
    row_flags int := (p.fit->>'row_flags')::int;
    r dpsql.runs;
    run bigint;
    centre float8[];
    theta float8[];
    tbl text;
    ids text;
    mid bigint;
BEGIN
    r := dpsql_internal._read_rows(p.run);
    -- regression rows (row_norm none) are clipped to x_bound for the sum only
    centre := dpsql_internal._private_mean(r.train_table, (r.spec->>'dim')::int,
                                  CASE WHEN canonical = 'linear' THEN 1 ELSE row_flags END,
                                  r.rows, mean.std, p.noise_seed, mean.x_bound);
    -- Centre the rows in a new table (an UPDATE would leave every row's old version for the
    -- epochs to skip): the row transform is done, and the bias is a plain feature 1.
    -- (on Citus placed like the training table and filled shard by shard)
    tbl := r.train_table || '_c';
    ids := dpsql_internal._derived_training_table(r.train_table, tbl);
    EXECUTE format('INSERT INTO %s (%s, x, y) SELECT %s, dpsql_internal._preprocess(x, NULL, $1, $2), y'
                   '  FROM %s ORDER BY rid', tbl, ids, ids, r.train_table) USING row_flags, centre;
    PERFORM dpsql_internal._replace_training_table(r.train_table, tbl);
    run := dpsql_internal._start_run(r);
    theta := dpsql_internal._run_epochs(run);
    -- Released in the space of the registered features (privacy rule 10, issue 25):
    -- the centring folded into the bias, w . (t(x) - mean) + b = w . t(x) + (b - w . mean),
    -- t the row transform (the mean is taken after it). Post-processing of (theta, mean).
    mid := dpsql_internal._finish(run, dpsql_internal._alg2_map_back(theta, centre, 1),
                         (p.sgd).info || jsonb_build_object(
        'mechanism', 'dpsgd_f', 'dataset_id', (p.ds).dataset_id,
        'algorithm', 'DPSGD-F* (Sun, Suresh, Menon 2024, Algorithm 3): private mean, centred rows, '
                     'DP-SGD with Poisson sampling and a bias',
        'epsilon', (p.sgd).epsilon, 'delta', (p.sgd).delta, 'noise_scale', (p.sgd).noise_scale,
        'ledger_entry', entry,
        'preprocessing', jsonb_build_object(
            -- predict / evaluate / Python: the row transform alone (the centre is folded)
            'row_flags', row_flags, 'centre', array_fill(0::float8, ARRAY[cardinality(centre)]),
            'mean', centre, 'theta', theta,
            'mean_noise_std', mean.std, 'mean_sensitivity', 2 * mean.x_bound,
            'mean_epsilon_alone', mean.mean_epsilon,
            'accounting', 'the mean''s Gaussian and the steps composed by the PLD accountant'),
        'noise_seed', dpsql_internal._noise_source(p.noise_seed)));
    PERFORM dpsql_internal._set_ledger_model(entry, mid);
    RETURN mid;
END $$;
