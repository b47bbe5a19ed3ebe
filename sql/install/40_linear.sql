------------------------------------------------------------------------------------------
-- DP linear regression (docs/linear.md): DP-AMBSSGD and DP-SSGD (spec 000), DP-GD with
-- confidence intervals (spec 002) and AdaSSP. All are compositions of Gaussian mechanisms,
-- calibrated in zero-concentrated DP (rho-zCDP) under replace-one neighbours with public n.
------------------------------------------------------------------------------------------

-- The largest rho whose zCDP -> (epsilon, delta) conversion rho + 2 sqrt(rho ln(1/delta)) is at
-- most epsilon (Bun-Steinke Prop. 1.3; spec 000 s. 3.3, spec 002 s. 2.2).
CREATE OR REPLACE FUNCTION dpsql.zcdp_rho(epsilon float8, delta float8)
RETURNS float8 LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
    IF NOT (epsilon > 0 AND epsilon < 'Infinity') OR NOT (delta > 0 AND delta < 1) THEN
        PERFORM dpsql._fail(format('zCDP needs epsilon > 0 and 0 < delta < 1, got (%s, %s)',
                                   epsilon, delta),
                            hint => 'The linear-regression mechanisms are (epsilon, delta)-DP with delta > 0.');
    END IF;
    RETURN (sqrt(ln(1 / delta) + epsilon) - sqrt(ln(1 / delta))) ^ 2;
END $$;
COMMENT ON FUNCTION dpsql.zcdp_rho(float8, float8) IS
    'Largest rho such that rho-zCDP implies (epsilon, delta)-DP';

CREATE OR REPLACE FUNCTION dpsql.zcdp_epsilon(rho float8, delta float8)
RETURNS float8 LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT rho + 2 * sqrt(rho * ln(1 / delta))
$$;
COMMENT ON FUNCTION dpsql.zcdp_epsilon(float8, float8) IS 'epsilon of rho-zCDP at delta';

-- v plus i.i.d. N(0, sigma^2) noise on each coordinate (pg_strong_random unless a seed is given;
-- stream separates the uses of one seed).
CREATE OR REPLACE FUNCTION dpsql._add_gaussian(v float8[], sigma float8, seed bigint, stream bigint)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_add_gaussian_sql' LANGUAGE C VOLATILE;

-- Every released iterate of a DP-GD model (N x p, in step order; independent runs one after
-- the other): the confidence intervals are post-processing of these.
CREATE TABLE IF NOT EXISTS dpsql.model_iterates (
    model_id    bigint PRIMARY KEY REFERENCES dpsql.model_store ON DELETE CASCADE,
    iterates    float8[] NOT NULL
);
COMMENT ON TABLE dpsql.model_iterates IS 'Released iterates of DP-GD models (for confidence intervals)';

-- A public number of a linear mechanism: the analyst's option, else the default; checked.
CREATE OR REPLACE FUNCTION dpsql._linear_option(options jsonb, key text, fallback float8,
                                                lo float8 DEFAULT 0, lo_open boolean DEFAULT true)
RETURNS float8 LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v float8;
BEGIN
    IF options IS NULL OR options->key IS NULL OR options->key = 'null' THEN
        RETURN fallback;
    END IF;
    IF jsonb_typeof(options->key) <> 'number' THEN
        PERFORM dpsql._fail(format('options.%s must be a number, got %s', key, options->key));
    END IF;
    v := (options->>key)::float8;
    IF NOT (v < 'Infinity') OR v < lo OR (lo_open AND v = lo) THEN
        PERFORM dpsql._fail(format('options.%s must be a finite number %s %s, got %s', key,
                                   CASE WHEN lo_open THEN '>' ELSE '>=' END, lo, v));
    END IF;
    RETURN v;
END $$;

-- Clipping bounds every step, so ||w|| <= steps * eta * (clip + noise); refusing plans whose bound
-- is astronomical makes a non-finite model impossible whatever the data (an error there would be
-- a data-dependent, uncharged answer).
CREATE OR REPLACE FUNCTION dpsql._check_finite_run(eta float8, steps float8, per_step float8)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF NOT (eta > 0 AND eta < 'Infinity') THEN
        PERFORM dpsql._fail(format('step_size must be a finite number > 0, got %s', eta));
    END IF;
    IF NOT (eta * steps * per_step < 1e100) THEN
        PERFORM dpsql._fail(format('step_size %s is too large: %s steps could overflow the model', eta, steps));
    END IF;
END $$;

-- The plan of a linear mechanism: every public number it uses, computed from n, d, the
-- dataset's declarations and the analyst's parameters only (never from the data), and the
-- noise that makes it (epsilon, delta)-DP. 'info' goes into the model's provenance.
CREATE OR REPLACE FUNCTION dpsql._linear_plan(privacy text, ds dpsql.datasets, n bigint, d int,
                                              epsilon float8, delta float8, params jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    options jsonb := nullif(params->'options', 'null');
    intercept boolean := coalesce((params->>'intercept')::boolean, false);
    p int := d + intercept::int;
    rho float8 := dpsql.zcdp_rho(epsilon, delta);
    x_bound float8 := coalesce(ds.row_bound, 0);  -- 0: rows are not clipped
    known text[] := CASE privacy
        WHEN 'dp_ambssgd' THEN '{r_x,h_norm,condition_number,c1,step_scale,domain_bound,beta_stat,tight_accounting,log_exponent}'
        WHEN 'dp_ssgd' THEN '{r_x,baseline}'
        WHEN 'dpgd' THEN '{noise_level,clip_check,precondition}'
        ELSE '{varrho}' END::text[];
    unknown text;
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
    zeta float8;
    steps bigint;
    runs int;
    draws int;
    burn_in int;
    ci text;
    gamma float8;
    rho_check float8;
    rho_gd float8;
    rho_pre float8;
    precondition boolean;
    lam float8;
    sens record;
    sd float8;
    varrho float8;
BEGIN
    SELECT string_agg(k, ', ') INTO unknown
      FROM jsonb_object_keys(coalesce(options, '{}')) k WHERE k <> ALL (known);
    IF unknown IS NOT NULL THEN
        PERFORM dpsql._fail(format('unknown options for %s: %s', privacy, unknown),
                            hint => 'Known: ' || array_to_string(known, ', ') || '.');
    END IF;
    IF options IS NOT NULL AND jsonb_typeof(options) <> 'object' THEN
        PERFORM dpsql._fail('options must be a JSON object');
    END IF;

    IF privacy IN ('dp_ambssgd', 'dp_ssgd') THEN
        -- R_x: the "expected x norm" of spec 000 (E||x||^2 x x^T <= R_x^2 H); the registered
        -- bound on ||x|| is one (plus the intercept's constant 1).
        r_x := dpsql._linear_option(options, 'r_x',
                                    sqrt(nullif(x_bound, 0) ^ 2 + intercept::int));
        IF r_x IS NULL THEN
            PERFORM dpsql._fail(format('%s needs a public R_x (a bound on ||x||)', privacy),
                                hint => 'Register the dataset with row_bound (or feature_bounds), or pass options => ''{"r_x": ...}''.');
        END IF;
    END IF;

    IF privacy = 'dp_ambssgd' THEN
        -- Spec 000 s. 2.3 / 5.3: T = c1 kappa ln N blocks (even), blocks of b + s rows with
        -- s = floor(m / 11); eta = b / (R_x^2 + (b - 1) ||H||) (Lemma 22); the robust DP-STAT
        -- (V1: n_q = L + 1 counts of std alpha sqrt(n_q); V2: threshold s - Gamma_hat;
        -- V3: refuse s < 2 Gamma_hat; Delta = B 2^-L with L = ceil(log2 N)).
        h_norm := dpsql._linear_option(options, 'h_norm', r_x ^ 2);  -- ||H|| <= E||x||^2 <= R_x^2
        blocks := coalesce((params->>'steps')::bigint,
                           2 * ceil(dpsql._linear_option(options, 'c1', 8)
                                    * dpsql._linear_option(options, 'condition_number', 1, 1, false)
                                    * ln(n) / 2)::bigint);
        IF blocks < 2 OR blocks % 2 <> 0 THEN
            PERFORM dpsql._fail(format('DP-AMBSSGD needs an even number of blocks >= 2 (steps), got %s', blocks));
        END IF;
        m := n / blocks;
        s := m / 11;
        b := m - s;
        IF s < 1 OR b < 1 THEN
            PERFORM dpsql._fail(format('%s rows make no blocks of a stat sample and a batch for %s blocks',
                                       n, blocks),
                                hint => 'Use fewer blocks (steps), more rows, or privacy => ''dpgd'' (or ''auto'').');
        END IF;
        eta := coalesce((params->>'step_size')::float8,
                        dpsql._linear_option(options, 'step_scale', 1) * b / (r_x ^ 2 + (b - 1) * h_norm));
        -- Paper accounting: DP-STAT and the gradient step each 1/(2 alpha^2)-zCDP, added (rho =
        -- 1/alpha^2); tight: a record is in one of them only (rho = 1/(2 alpha^2), s. 3.4).
        alpha := CASE WHEN coalesce((options->>'tight_accounting')::boolean, false)
                      THEN 1 / sqrt(2 * rho) ELSE 1 / sqrt(rho) END;
        levels := ceil(log(2, n::numeric))::int;
        sigma_c := alpha * sqrt(levels + 1);
        beta_s := dpsql._linear_option(options, 'beta_stat', 1e-3);
        IF beta_s >= 1 THEN
            PERFORM dpsql._fail('options.beta_stat must be in (0, 1)');
        END IF;
        gamma_hat := sigma_c * sqrt(2 * ln(2 * (levels + 1) / beta_s));
        IF s < 2 * gamma_hat THEN
            PERFORM dpsql._fail(format('DP-STAT is infeasible: stat samples of %s rows < 2 Gamma = %s '
                                       '(it would return a tiny clip norm and learn nothing, spec 000 V3)',
                                       s, round(2 * gamma_hat)),
                                hint => format('Needs about %s rows at this epsilon and %s blocks; use more rows, '
                                               'a larger epsilon or fewer blocks (steps), or privacy => ''dpgd'' '
                                               '(or ''auto''), which works on this many rows.',
                                               ceil(2 * gamma_hat) * 11 * blocks, blocks));
        END IF;
        domain := dpsql._linear_option(options, 'domain_bound', 2 * ds.label_bound);
        log_factor := ln(n) ^ dpsql._linear_option(options, 'log_exponent', 0.5, 0, false);
        -- zeta_t <= r_x B log_factor; the noise's normals stay below 100 sd.
        PERFORM dpsql._check_finite_run(eta, blocks, r_x * domain * log_factor * (1 + 200 * alpha * sqrt(p)));
        RETURN jsonb_build_object(
            'epsilon', epsilon, 'delta', delta, 'rho', rho, 'noise_multiplier', alpha,
            'blocks', blocks, 'batch_size', b, 'stat_size', s, 'step_size', eta, 'r_x', r_x,
            'h_norm', h_norm, 'log_factor', log_factor, 'domain_bound', domain, 'levels', levels,
            'count_noise_std', sigma_c, 'stat_threshold', s - gamma_hat, 'beta_stat', beta_s,
            'x_bound', x_bound, 'intercept', intercept, 'dim', d, 'rows', n,
            'unused_rows', n - blocks * (b + s),
            'info', jsonb_build_object(
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
                'neighbouring', 'replace-one, n public'));
    ELSIF privacy = 'dp_ssgd' THEN
        -- Spec 000 Algorithm 1: batch 1, one pass, fixed clip zeta, noise 2 zeta alpha on each
        -- step's gradient; each record is in one Gaussian step (parallel composition; no
        -- amplification by shuffling is claimed: rho = 1/(2 alpha^2)).
        blocks := (n / 2) * 2;
        zeta := coalesce((params->>'clip_norm')::float8, r_x * ds.label_bound);
        IF NOT (zeta > 0 AND zeta < 'Infinity') THEN
            PERFORM dpsql._fail(format('clip_norm must be a finite number > 0, got %s', zeta));
        END IF;
        eta := coalesce((params->>'step_size')::float8, 1 / (2 * r_x ^ 2));
        alpha := 1 / sqrt(2 * rho);
        PERFORM dpsql._check_finite_run(eta, blocks, zeta * (1 + 200 * alpha * sqrt(p)));
        -- Constant-step SGD settles with the iterate's noise covariance about
        -- (eta s^2 / 2) H^-1 (s the gradient noise std), so a row's prediction noise has
        -- E (x^T noise)^2 = eta s^2 p / 2 whatever H: public. At the label bound or above, the
        -- release predicts no better than 0; it is refused unless reproducing the baseline.
        sd := sqrt(eta * p / 2) * 2 * zeta * alpha;
        IF sd >= ds.label_bound AND NOT coalesce((options->>'baseline')::boolean, false) THEN
            PERFORM dpsql._fail(format('DP-SSGD''s noise would swamp the model: its predictions would carry '
                                       'noise of sd %s, beyond the label bound %s', round(sd::numeric, 2),
                                       ds.label_bound),
                                hint => 'One noisy step per row is the paper''s baseline: use privacy => '
                                        '''dpgd'', ''adassp'' or ''auto'', or options => {"baseline": true} '
                                        'to reproduce it anyway.');
        END IF;
        RETURN jsonb_build_object(
            'epsilon', epsilon, 'delta', delta, 'rho', rho, 'noise_multiplier', alpha,
            'blocks', blocks, 'batch_size', 1, 'stat_size', 0, 'step_size', eta, 'r_x', r_x,
            'clip_norm', zeta, 'x_bound', x_bound, 'intercept', intercept, 'dim', d, 'rows', n,
            'unused_rows', n - blocks,
            'info', jsonb_build_object(
                'algorithm', 'DP-SSGD (Varshney, Thakurta, Jain 2022, Algorithm 1; baseline)',
                'accounting', 'zCDP, one Gaussian step per record (parallel composition), rho = 1/(2 alpha^2); no shuffling amplification',
                'rho', rho, 'noise_multiplier', alpha, 'clip_norm', zeta, 'step_size', eta,
                'r_x', r_x, 'gradient_noise_std', 2 * zeta * alpha, 'unused_rows', n - blocks,
                'stationary_prediction_noise_sd', sd,
                'neighbouring', 'replace-one, n public'));
    ELSIF privacy = 'dpgd' THEN
        -- Spec 002: eta = 1/5, gamma = 5 sqrt(p) max(sigma_prior, 1), theta_0 = 0, and
        -- lambda^2 = 2 N gamma^2 / (rho n^2) over all N released steps (Lemma 2.1).
        ci := coalesce(params->>'ci', 'batch_means');
        IF ci NOT IN ('none', 'batch_means', 'checkpoints', 'independent_runs') THEN
            PERFORM dpsql._fail(format('unknown ci %s', quote_literal(ci)),
                                hint => 'Use batch_means (default), checkpoints, independent_runs or none.');
        END IF;
        draws := coalesce((params->>'ci_draws')::int, 10);
        burn_in := coalesce((params->>'burn_in')::int, 20);
        IF ci <> 'none' AND (draws IS NULL OR draws < 2 OR draws > 1000) THEN
            PERFORM dpsql._fail(format('ci_draws must be between 2 and 1000, got %s', draws));
        END IF;
        IF burn_in < 0 THEN
            PERFORM dpsql._fail(format('burn_in must be >= 0, got %s', burn_in));
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
            PERFORM dpsql._fail(format('steps must be between 1 and 20000, got %s', steps));
        END IF;
        runs := CASE WHEN ci = 'independent_runs' THEN draws ELSE 1 END;
        IF ci = 'independent_runs' AND (steps % draws <> 0 OR steps / draws <= burn_in) THEN
            PERFORM dpsql._fail(format('independent runs: steps (%s) must split into %s runs longer than the burn-in (%s)',
                                       steps, draws, burn_in));
        ELSIF ci IN ('batch_means', 'checkpoints') AND (steps - burn_in) / draws < 1 THEN
            PERFORM dpsql._fail(format('%s steps leave no %s draws after a burn-in of %s', steps, draws, burn_in));
        END IF;
        -- Whitened rows have a Hessian near I, where a step of 1 mixes in a few steps.
        eta := coalesce((params->>'step_size')::float8, CASE WHEN precondition THEN 1.0 ELSE 0.2 END);
        gamma := coalesce((params->>'clip_norm')::float8,
                          5 * sqrt(p) * greatest(dpsql._linear_option(options, 'noise_level', 1), 1));
        IF NOT (gamma > 0 AND gamma < 'Infinity') THEN
            PERFORM dpsql._fail(format('clip_norm must be a finite number > 0, got %s', gamma));
        END IF;
        -- What the intervals cover depends on clipping at the estimate: a noisy count of the
        -- rows clipped there (sensitivity 1) takes 1/50 of rho unless options.clip_check = false.
        rho_check := CASE WHEN coalesce((options->>'clip_check')::boolean, true) THEN rho / 50 ELSE 0 END;
        -- A private preconditioner (44_dpgd_precondition.sql) takes a tenth of rho.
        IF precondition AND x_bound = 0 THEN
            PERFORM dpsql._fail('the preconditioner needs a public bound on ||x||',
                                hint => 'Register the dataset with row_bound, feature_bounds or row_norm => ''clip''.');
        END IF;
        rho_pre := CASE WHEN precondition THEN rho / 10 ELSE 0 END;
        rho_gd := rho - rho_check - rho_pre;
        lam := sqrt(2 * steps) * gamma / (sqrt(rho_gd) * n);
        PERFORM dpsql._check_finite_run(eta, steps, gamma + 100 * lam * sqrt(p));
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
    ELSE
        -- AdaSSP (Wang 2018, Algorithm 2) with its three releases calibrated in zCDP (rho/3
        -- each) to their replace-one sensitivities for ||x|| <= X, |y| <= Y.
        IF ds.row_bound IS NULL THEN
            PERFORM dpsql._fail('AdaSSP needs a public bound on ||x||',
                                hint => 'Register the dataset with row_bound, feature_bounds or row_norm => ''clip''.');
        END IF;
        x_bound := sqrt(ds.row_bound ^ 2 + intercept::int);
        sens := dpsql.adassp_sensitivities(x_bound, ds.label_bound);
        sd := 1 / sqrt(2 * rho / 3);
        varrho := dpsql._linear_option(options, 'varrho', 0.05);
        IF varrho >= 1 THEN
            PERFORM dpsql._fail('options.varrho must be in (0, 1)');
        END IF;
        RETURN jsonb_build_object(
            'epsilon', epsilon, 'delta', delta, 'rho', rho, 'x_bound', x_bound,
            'y_bound', ds.label_bound, 'intercept', intercept, 'dim', d, 'rows', n,
            'sigma_min', sens.lambda_min * sd, 'sigma_xx', sens.xtx * sd, 'sigma_xy', sens.xty * sd,
            'min_shift', sens.lambda_min * sd * sqrt(ln(6 / delta)),
            'ridge_factor', sens.xtx * sd * sqrt(p * ln(2.0 * p * p / varrho)),
            'info', jsonb_build_object(
                'algorithm', 'AdaSSP (Wang 2018, Algorithm 2): noisy X^T X, X^T y and lambda_min, adaptive ridge',
                'accounting', 'zCDP: three Gaussian releases of rho/3 each',
                'rho', rho, 'x_bound', x_bound, 'y_bound', ds.label_bound, 'varrho', varrho,
                'sensitivities', jsonb_build_object('lambda_min', sens.lambda_min, 'xtx', sens.xtx,
                                                     'xty', sens.xty),
                'noise_std', jsonb_build_object('lambda_min', sens.lambda_min * sd,
                                                 'xtx', sens.xtx * sd, 'xty', sens.xty * sd),
                'neighbouring', 'replace-one, n public'));
    END IF;
END $$;

-- Train a linear mechanism on a registered regression dataset and release the model. Called
-- by _train_private (SECURITY DEFINER) after its checks; charged before anything touches the
-- data, in the same transaction as the release.
CREATE OR REPLACE FUNCTION dpsql._train_linear(ds dpsql.datasets, model text, privacy text,
                                               params jsonb, epsilon float8, delta float8,
                                               noise_seed bigint)
RETURNS bigint LANGUAGE plpgsql
SET max_parallel_workers_per_gather = 0
SET synchronize_seqscans = off
AS $$
DECLARE
    run bigint;
    r dpsql.runs;
    plan jsonb;
    entry bigint;
    rel record;
    weights float8[];
    info jsonb;
    iterates float8[];
    mid bigint;
BEGIN
    IF ds.label_bound IS NULL THEN
        PERFORM dpsql._fail(format('%s is linear regression, and dataset %s is a classification dataset',
                                   privacy, ds.name),
                            hint => 'Register the table with label_bound (a public bound on |y|) instead of labels.');
    END IF;
    IF delta IS NULL OR delta <= 0 THEN
        PERFORM dpsql._fail(format('%s is (epsilon, delta)-DP through zCDP: delta must be > 0', privacy));
    END IF;
    run := dpsql._prepare_private(ds, 'linear', params);
    r := dpsql._locked_run(run);
    plan := dpsql._linear_plan(privacy, ds, r.rows, (r.spec->>'dim')::int, epsilon, delta, params);
    entry := dpsql._charge(ds.dataset_id, epsilon, delta, privacy);
    IF privacy IN ('dp_ambssgd', 'dp_ssgd') THEN
        rel := dpsql._ambssgd_fit(r.train_table, plan, noise_seed);
    ELSIF privacy = 'dpgd' AND (plan->>'precondition')::boolean THEN
        rel := dpsql._dpgd_fit_preconditioned(r.train_table, plan, noise_seed);
    ELSIF privacy = 'dpgd' THEN
        rel := dpsql._dpgd_fit(r.train_table, plan, noise_seed);
    ELSE
        rel := dpsql._adassp_fit(r.train_table, plan, noise_seed);
    END IF;
    UPDATE dpsql.runs SET epochs_done = 1, done = true WHERE runs.run_id = run;
    mid := dpsql._finish(run, rel.weights, (plan->'info') || rel.info || jsonb_build_object(
        'mechanism', privacy, 'dataset_id', ds.dataset_id, 'epsilon', epsilon, 'delta', delta,
        'ledger_entry', entry,
        'noise_seed', CASE WHEN noise_seed IS NULL THEN 'pg_strong_random'
                           ELSE 'user seed ' || noise_seed || ': NOT private' END));
    IF rel.iterates IS NOT NULL THEN
        INSERT INTO dpsql.model_iterates (model_id, iterates) VALUES (mid, rel.iterates);
    END IF;
    PERFORM dpsql._set_ledger_model(entry, mid);
    RETURN mid;
END $$;

-- DP-AMBSSGD / DP-SSGD: one aggregate scan of the shuffled training table in rid order.
CREATE OR REPLACE FUNCTION dpsql._ambssgd_fit(train_table text, plan jsonb, noise_seed bigint,
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
    st := dpsql._ambssgd_init(
        (plan->>'dim')::int, (plan->>'intercept')::boolean, (plan->>'x_bound')::float8,
        (plan->>'rows')::bigint, (plan->>'blocks')::int, (plan->>'batch_size')::bigint,
        (plan->>'stat_size')::bigint, (plan->>'noise_multiplier')::float8,
        (plan->>'step_size')::float8, (plan->>'r_x')::float8,
        coalesce((plan->>'log_factor')::float8, 1), coalesce((plan->>'domain_bound')::float8, 1),
        coalesce((plan->>'levels')::int, 0), coalesce((plan->>'count_noise_std')::float8, 0),
        coalesce((plan->>'stat_threshold')::float8, 0), coalesce((plan->>'clip_norm')::float8, 0),
        noise_seed);
    -- One pass in the order of the (data-independent) permutation.
    EXECUTE format('SELECT dpsql.ambssgd_pass(x, y, $1 ORDER BY rid) FROM %s', train_table)
       INTO st USING st;
    res := dpsql._ambssgd_result(st);
    weights := res.weights;
    -- The transcript (gamma_t, zeta_t) is covered by the guarantee (spec 000 s. 2.3).
    info := CASE WHEN (plan->>'stat_size')::bigint > 0
                 THEN jsonb_build_object('released_gammas', res.gammas, 'released_zetas', res.zetas)
                 ELSE '{}' END;
    iterates := NULL;
END $$;

-- The correlation between draws `lag` iterates apart implied by each coordinate's lag-1
-- autocorrelation r after the burn-in (r^lag, the AR(1) the unclipped run is along each
-- eigen-direction), the largest over the coordinates: a free check (post-processing of released
-- iterates) that the draws are nearly independent. A run that has not mixed (a slow direction,
-- spec 002 traps 8-9) has r near 1. (r^lag is far more stable than the lag-`lag` sample
-- autocorrelation, which is biased low for slow series.)
CREATE OR REPLACE FUNCTION dpsql._iterate_autocorrelation(iterates float8[], burn_in int, lag int)
RETURNS float8 LANGUAGE sql IMMUTABLE STRICT AS $$
    WITH v AS (
        SELECT t, j, iterates[t][j] - avg(iterates[t][j]) OVER (PARTITION BY j) AS x
          FROM generate_series(burn_in + 1, array_length(iterates, 1)) t,
               generate_series(1, array_length(iterates, 2)) j)
    SELECT max(greatest(r, 0) ^ lag) FROM (
        SELECT a.j, sum(a.x * b.x) / nullif((SELECT sum(c.x ^ 2) FROM v c WHERE c.j = a.j), 0) AS r
          FROM v a JOIN v b ON b.j = a.j AND b.t = a.t + 1 GROUP BY a.j) s
$$;

-- DP-GD: one aggregate scan per step for the clipped gradient sum; the noise is added in the
-- server. Every iterate is kept (released) for the confidence intervals.
CREATE OR REPLACE FUNCTION dpsql._dpgd_fit(train_table text, plan jsonb, noise_seed bigint,
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
            theta := dpsql._dpgd_step(theta, g, (plan->>'step_size')::float8,
                                      (plan->>'noise_std')::float8, noise_seed, k);
            iterates := iterates || ARRAY[theta];
        END LOOP;
    END LOOP;
    IF ci = 'none' THEN
        weights := theta;  -- the final iterate (spec 002 s. 2.1)
    ELSE
        SELECT array_agg(estimate ORDER BY coef_index) INTO weights
          FROM dpsql._t_interval(dpsql._confint_draws(iterates, ci, (plan->>'ci_draws')::int,
                                                      (plan->>'burn_in')::int), 0.05);
    END IF;
    IF ci = 'batch_means' OR ci = 'checkpoints' THEN
        -- draws are (steps - burn_in) / m iterates apart: they should be nearly uncorrelated
        lag_ac := dpsql._iterate_autocorrelation(iterates, (plan->>'burn_in')::int,
            ((steps - (plan->>'burn_in')::int) / (plan->>'ci_draws')::int)::int);
    ELSIF ci = 'independent_runs' THEN
        -- within a run: its post-burn-in mean should have forgotten the start
        lag_ac := dpsql._iterate_autocorrelation(iterates[1:per_run], (plan->>'burn_in')::int,
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
        rows_clipped := (dpsql._add_gaussian(ARRAY[g[p + 2]], (plan->>'check_noise_std')::float8,
                                             noise_seed, k + 1))[1];
        info := jsonb_set(info, '{ci,clipped_rows_at_estimate}', to_jsonb(rows_clipped));
        info := jsonb_set(info, '{ci,clipped_rows_noise_std}', plan->'check_noise_std');
        info := jsonb_set(info, '{ci,target}', to_jsonb(
            CASE WHEN rows_clipped > 3 * (plan->>'check_noise_std')::float8
                 THEN 'huberised' ELSE 'ols' END));
    END IF;
END $$;

-- AdaSSP: one aggregate scan for X^T X, X^T y (rows clipped to the public bounds); the noise,
-- the adaptive ridge and the solve in the server.
CREATE OR REPLACE FUNCTION dpsql._adassp_fit(train_table text, plan jsonb, noise_seed bigint,
                                             OUT weights float8[], OUT info jsonb,
                                             OUT iterates float8[])
LANGUAGE plpgsql AS $$
DECLARE
    gram float8[];
    rel record;
BEGIN
    EXECUTE format('SELECT dpsql.adassp_gram(x, y, $1, $2, $3, $4) FROM %s', train_table)
       INTO gram USING (plan->>'x_bound')::float8, (plan->>'y_bound')::float8,
                       (plan->>'intercept')::boolean, (plan->>'dim')::int;
    rel := dpsql._adassp_release(gram, (plan->>'sigma_min')::float8, (plan->>'sigma_xx')::float8,
                                 (plan->>'sigma_xy')::float8, (plan->>'min_shift')::float8,
                                 (plan->>'ridge_factor')::float8, noise_seed);
    weights := rel.weights;
    info := jsonb_build_object('ridge', rel.ridge, 'lambda_min_noisy', rel.lambda_min_noisy);
    iterates := NULL;
END $$;

-- Student-t confidence intervals of a DP-GD model's coefficients, from its released iterates
-- (post-processing: no budget). coef_index is 1-based as in the coef array; with an intercept
-- the last index (n_features + 1) is the intercept.
CREATE OR REPLACE FUNCTION dpsql.confint(model_id bigint, alpha float8 DEFAULT 0.05)
RETURNS TABLE (coef_index int, estimate float8, lower float8, upper float8)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    m record;
    its float8[];
    ci jsonb;
BEGIN
    IF alpha IS NULL OR NOT (alpha > 0 AND alpha < 1) THEN
        PERFORM dpsql._fail(format('alpha must be in (0, 1), got %s', coalesce(alpha::text, 'NULL')));
    END IF;
    -- Only models the caller may see (the row-filtered view, evaluated as the session user).
    SELECT v.model_id, v.privacy, v.params INTO m FROM dpsql.models v WHERE v.model_id = confint.model_id;
    IF NOT FOUND THEN
        PERFORM dpsql._fail(format('no model %s', coalesce(model_id::text, 'NULL')), '42704');
    END IF;
    SELECT i.iterates INTO its FROM dpsql.model_iterates i WHERE i.model_id = confint.model_id;
    ci := m.params->'privacy'->'ci';
    IF its IS NULL OR ci IS NULL OR ci->>'method' = 'none' THEN
        PERFORM dpsql._fail(format('model %s has no confidence intervals', model_id),
                            hint => 'Train with privacy => ''dpgd'' and ci => batch_means, checkpoints or independent_runs.');
    END IF;
    IF (ci->>'mixed')::boolean IS FALSE THEN
        RAISE WARNING 'dpsql: model %''s run had not mixed (autocorrelation % between draws): its intervals are biased',
                      model_id, round((ci->>'draw_autocorrelation')::numeric, 2)
            USING HINT = 'Scale the features to be close to isotropic, or use a larger step_size and more steps (docs/linear.md).';
    END IF;
    RETURN QUERY SELECT t.coef_index, t.estimate, t.lower, t.upper
                   FROM dpsql._t_interval(dpsql._confint_draws(its, ci->>'method',
                                                               (ci->>'draws')::int,
                                                               (ci->>'burn_in')::int), alpha) t;
END $$;
COMMENT ON FUNCTION dpsql.confint(bigint, float8) IS
    'Student-t confidence intervals of a DP-GD model''s coefficients (from its released iterates)';
