------------------------------------------------------------------------------------------
-- White-box audits of the SGD family with Dirac canaries (docs/audit.md, method 'dirac').
-- The audit's copy gets m + 1 extra features that no data row uses (all 0): one coordinate per
-- canary and a marker. A canary row has the marker set, and the aggregate (core/sgd.h,
-- DPSQL_FLAG_CANARY_ROWS; DP-FTRL's leaves: core/ftrl.h, the config's canary) adds exactly
-- clip_norm * (+e_k) to the gradient sum of each step that samples it when its secret coin
-- says "in", or clip_norm * (-e_k) when it says "out":
-- two rows whose clipped gradients are as far apart as replace-one allows (2 C). No data row
-- and no other canary touches coordinate k, so the released weight w_k is the canary's steps
-- plus the noise: the strongest score an attacker with the final model can have (Steinke,
-- Nasr and Jagielski 2023, "Privacy auditing with one (1) training run": their white-box
-- Dirac gradient canaries). Each of `runs` trainings draws fresh coins; all the canaries of all the
-- runs are scored together (a neighbour changes one canary, so the runs together are one
-- mechanism whose guarantee holds for each canary).
------------------------------------------------------------------------------------------

-- The guess counts of a dirac audit: the k highest scores guessed "in", for k over these
-- fractions of all the canaries (fixed in advance; Bonferroni in dpsql/audit_stats.py), at
-- most 20,000 guesses each (the statistics' recursion is linear in the guesses).
CREATE OR REPLACE FUNCTION dpsql_internal._audit_dirac_guesses(total int)
RETURNS int[] LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY(SELECT DISTINCT least(greatest(1, floor(f * total)::int), 20000)
                   FROM unnest(ARRAY[0.005, 0.01, 0.02, 0.05, 0.1]) f ORDER BY 1)
$$;

-- The statistics a dirac audit uses by default: gdp where the claim is a composition of
-- Gaussian mechanisms that is exactly mu-GDP (shuffled DP-SGD: one Gaussian per epoch; the
-- bolt-on's and output perturbation's analytic Gaussian output noise; DP-FTRL's tree, one
-- Gaussian of sensitivity 2 C sqrt(levels epochs) over its nodes), dp (any (epsilon,
-- delta) claim) elsewhere (objective perturbation's claim splits epsilon between its noise,
-- its Jacobian and its certificate: not a Gaussian mechanism's).
CREATE OR REPLACE FUNCTION dpsql_internal._audit_dirac_test(privacy text, params jsonb, delta float8)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN delta > 0 AND (
                    (privacy = 'dpsgd' AND coalesce(params->>'sampling', 'shuffle') = 'shuffle')
                    OR (privacy = 'bolton' AND coalesce(params->>'gaussian', 'analytic') = 'analytic')
                    OR privacy IN ('output_perturbation', 'dp_ftrl'))
                THEN 'gdp' ELSE 'dp' END
$$;

-- The mechanisms whose dirac canaries are data rows (no SGD step to take a gradient canary):
-- the exact regularised minimisers with output or objective noise (49_, 50_*.sql).
CREATE OR REPLACE FUNCTION dpsql_internal._audit_row_canaries(privacy text)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT privacy IN ('output_perturbation', 'objective_perturbation')
$$;

-- A crafted canary row for those mechanisms (Chaudhuri, Monteleoni and Sarwate 2011, "Differentially
-- private empirical risk minimization", §3's sensitivity argument is tight for it): the data
-- features at 0 after the transform, scale * (+e_k) or scale * (-e_k) on canary coordinate k
-- (scale the largest norm the registration lets a row keep: the pad is declared on [-1, 1], or
-- the row bound without feature bounds), the marker at 0 (a shared coordinate would couple the
-- canaries). Its transformed norm is the row bound, so the mechanism's sensitivity covers it;
-- its label (fixed) makes the loss's derivative the Lipschitz constant on a coordinate no data
-- row spans, so the minimiser's w_k moves by nearly the sensitivity's share of the row.
CREATE OR REPLACE FUNCTION dpsql_internal._audit_crafted_row(zero float8[], m int, k int,
                                                             included boolean, scale float8)
RETURNS float8[] LANGUAGE sql IMMUTABLE AS $$
    SELECT zero || array_fill(0::float8, ARRAY[k - 1])
           || ARRAY[CASE WHEN included THEN scale ELSE -scale END]::float8[]
           || array_fill(0::float8, ARRAY[m - k]) || ARRAY[0::float8]
$$;

-- The epsilon at which a Gaussian mechanism's noise is half its noise at (epsilon, delta)
-- (analytic calibration: mu doubles), by bisection on dpsql.gaussian_sigma.
CREATE OR REPLACE FUNCTION dpsql_internal._audit_half_noise_epsilon(epsilon float8, delta float8)
RETURNS float8 LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    target float8 := dpsql.gaussian_sigma(1, epsilon, delta) / 2;
    lo float8 := epsilon;
    hi float8 := 64 * epsilon;
    mid float8;
BEGIN
    FOR i IN 1 .. 60 LOOP
        mid := (lo + hi) / 2;
        IF dpsql.gaussian_sigma(1, mid, delta) > target THEN lo := mid; ELSE hi := mid; END IF;
    END LOOP;
    RETURN hi;
END $$;

-- The half_noise mutation of a row-canary mechanism (a superuser's test switch: _mutation
-- refused anyone else before the audit started): its releases are calibrated at the epsilon
-- whose Gaussian noise is half the claim's (1 -> 2.15 at delta 1e-5), the claim unchanged, and
-- at the claim's own regulariser (its plan on the copy, fixed through lambda), so that for
-- output perturbation only the noise changes: exactly half of it. (Objective perturbation's
-- noise is then calibrated at the larger epsilon's share: a true epsilon of 2.15 claimed as 1.)
CREATE OR REPLACE FUNCTION dpsql_internal._audit_half_noise_params(copy dpsql.datasets, privacy text,
                                                                   model text, params jsonb, d int,
                                                                   epsilon float8, delta float8)
RETURNS jsonb LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    mech dpsql.mechanism_catalog := dpsql_internal._mechanism(privacy);
    n bigint;
    regularizer float8;
BEGIN
    IF delta <= 0 THEN
        PERFORM dpsql_internal._fail('the half_noise mutation of output and objective perturbation '
                                     'takes delta > 0 (Gaussian noise)', '0A000');
    END IF;
    EXECUTE format('SELECT count(*) FROM %s', copy.relid) INTO n;
    -- (both plans are an erm_plan: 45_erm_solver.sql)
    EXECUTE format('SELECT (dpsql_internal.%I($1, $2, $3, $4, $5, $6, $7)).regularizer', mech.plan_function)
       INTO regularizer USING privacy, copy, n, d, epsilon, delta,
                              params || jsonb_build_object('model', dpsql_internal._erm_model(model),
                                                           'classes', to_jsonb(copy.labels));
    RETURN params || jsonb_build_object(
        'epsilon', dpsql_internal._audit_half_noise_epsilon(epsilon, delta),
        'lambda', regularizer / n);
END $$;

-- The state flags a run adds for an audit: Dirac canary rows for the copy that the running
-- dirac audit trains (the setting names its table), nothing for any other run. (Were an
-- analyst to set the switch, a row with its last feature set would still contribute one
-- gradient of norm clip_norm: the mechanism's guarantee does not depend on it.)
CREATE OR REPLACE FUNCTION dpsql_internal._audit_canary_flags(spec jsonb)
RETURNS int LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    copy text := nullif(current_setting('dpsql_audit.canary_copy', true), '');
BEGIN
    IF copy IS NULL OR copy NOT LIKE 'dpsql_audit.audit\_%'
       OR strpos(coalesce(spec->>'source', ''), copy) = 0 THEN
        RETURN 0;
    END IF;
    RETURN dpsql_internal._flag('canary_rows');
END $$;

-- A canary row's raw features: the data features at 0 after the transform, then +e_k or -e_k
-- among the m canary coordinates, then the marker.
CREATE OR REPLACE FUNCTION dpsql_internal._audit_dirac_row(zero float8[], m int, k int, included boolean)
RETURNS float8[] LANGUAGE sql IMMUTABLE AS $$
    SELECT zero || array_fill(0::float8, ARRAY[k - 1])
           || ARRAY[CASE WHEN included THEN 1 ELSE -1 END]::float8[]
           || array_fill(0::float8, ARRAY[m - k]) || ARRAY[1::float8]
$$;

-- A dirac audit: `n_runs` releases of a copy of ds with m Dirac canaries each, then the guess
-- counts of the scores -w_k (an "in" canary pushes w_k down; the statistics' request).
CREATE OR REPLACE FUNCTION dpsql_internal._audit_dirac(ds dpsql.datasets, model text, privacy text,
                                                       params jsonb, dim int, n_runs int,
                                                       epsilon float8, delta float8, conf float8,
                                                       opts jsonb,
                                                       OUT copy dpsql.datasets, OUT request jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    rows boolean := dpsql_internal._audit_row_canaries(privacy);
    -- (row canaries: 50 by default, a (d + 51)-dimensional problem a run)
    m int := coalesce((opts->>'canaries')::int, CASE WHEN rows THEN 50 ELSE 1000 END);
    label float8 := CASE WHEN ds.labels IS NULL THEN 0 ELSE ds.labels[1] END;
    zero float8[] := dpsql_internal._audit_raw(ds, array_fill(0::float8, ARRAY[dim]));
    coins boolean[];
    w float8[];
    ks int[];
BEGIN
    IF privacy NOT IN ('dpsgd', 'scs13', 'bst14', 'dpsgd_f', 'dpsgd_f_alg2', 'bolton', 'dp_ftrl')
       AND NOT rows THEN
        PERFORM dpsql_internal._fail(format('method dirac audits the SGD mechanisms (dpsgd, scs13, bst14, '
                                            'dpsgd_f, dpsgd_f_alg2, bolton, dp_ftrl) and output and '
                                            'objective perturbation, not %s', privacy),
                                     '0A000', 'Use method => ''one_run'' or ''distinguish''.');
    END IF;
    -- every row of the copy carries the m canary coordinates (zeros compress well); the
    -- minimisers solve a (d + m + 1)-dimensional Newton system: fewer canaries, more runs
    IF NOT (m BETWEEN 10 AND CASE WHEN rows THEN 200 ELSE 5000 END) THEN
        PERFORM dpsql_internal._fail(format('options.canaries must be in [10, %s] for dirac%s, got %s',
                                            CASE WHEN rows THEN 200 ELSE 5000 END,
                                            CASE WHEN rows THEN ' on ' || privacy ELSE '' END, m));
    END IF;
    copy := dpsql_internal._audit_copy(ds, m, epsilon, delta, pad => m + 1);
    IF rows THEN
        -- a row canary: the positive label (or the label bound), the loss pushing w_k by its sign
        label := CASE WHEN ds.labels IS NULL THEN ds.label_bound ELSE ds.labels[cardinality(ds.labels)] END;
        IF dpsql_internal._mutation() = 'half_noise' THEN
            params := dpsql_internal._audit_half_noise_params(copy, privacy, model, params, dim + m + 1,
                                                              epsilon, delta);
            -- (the copy's budget: two releases at the mutated epsilon)
            UPDATE dpsql.datasets SET epsilon_budget = (params->>'epsilon')::float8 * 2.001
             WHERE dataset_id = copy.dataset_id;
        END IF;
    ELSE
        PERFORM set_config('dpsql_audit.canary_copy', copy.relid::text, true);
    END IF;
    FOR r IN 1 .. n_runs LOOP
        coins := ARRAY(SELECT random() < 0.5 FROM generate_series(1, m));
        EXECUTE format('UPDATE %s t SET x = CASE WHEN $5 THEN dpsql_internal._audit_crafted_row($1, $2, t.slot, $3[t.slot], $6)'
                       ' ELSE dpsql_internal._audit_dirac_row($1, $2, t.slot, $3[t.slot]) END, y = $4'
                       ' WHERE t.slot IS NOT NULL', copy.relid)
          USING zero, m, coins, label, rows,
                CASE WHEN ds.feature_bounds IS NULL THEN coalesce(ds.row_bound, 1) ELSE 1 END;
        -- each run after the first rolled back once its weights are read (as distinguish does)
        w := dpsql_internal._audit_weights(copy, model, params, r = 1);
        IF w IS NULL OR cardinality(w) < dim + m
           OR EXISTS (SELECT 1 FROM unnest(w[dim + 1 : dim + m]) v WHERE NOT (v > '-Infinity' AND v < 'Infinity')) THEN
            PERFORM dpsql_internal._fail('the audited mechanism released no finite model: no bound', '55000');
        END IF;
        INSERT INTO dpsql_internal.audit_canaries
        -- (a gradient canary "in" pushes w_k down; a row canary "in" pulls it up)
        SELECT copy.name, (r - 1) * m + k, NULL, CASE WHEN rows THEN w[dim + k] ELSE -w[dim + k] END,
               coins[k]
          FROM generate_series(1, m) k;
        INSERT INTO dpsql_internal.audit_runs VALUES (copy.name, 1, r, '{}');
        PERFORM dpsql_internal._progress('audit run', r, n_runs);
    END LOOP;
    ks := dpsql_internal._audit_dirac_guesses(n_runs * m);
    -- ties broken by slot: an order the coins do not set
    WITH ranked AS (
        SELECT c.included, row_number() OVER (ORDER BY c.y DESC, c.slot) AS rank
          FROM dpsql_internal.audit_canaries c WHERE c.audit = copy.name)
    SELECT jsonb_build_object(
               'op', 'audit_bound', 'method', 'dirac', 'delta', delta, 'confidence', conf,
               'test', coalesce(opts->>'test', dpsql_internal._audit_dirac_test(privacy, params, delta)),
               'canaries', n_runs * m, 'guesses', to_jsonb(ks),
               'correct', (SELECT jsonb_agg((SELECT count(*) FROM ranked WHERE rank <= k AND included)
                                            ORDER BY k) FROM unnest(ks) k))
      INTO request;
    PERFORM set_config('dpsql_audit.canary_copy', '', true);
END $$;
