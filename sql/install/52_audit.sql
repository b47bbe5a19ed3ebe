------------------------------------------------------------------------------------------
-- Privacy audits (docs/audit.md): an empirical lower bound on a mechanism's epsilon, measured
-- by training it on copies of a registered dataset with canaries. The copies are datasets of
-- their own (never granted, charged to their own ledger entries, dropped at the end): the
-- audited dataset's budget and ledger are not touched, and no model outlives the call.
------------------------------------------------------------------------------------------

CREATE SCHEMA IF NOT EXISTS dpsql_audit;
REVOKE ALL ON SCHEMA dpsql_audit FROM PUBLIC;
COMMENT ON SCHEMA dpsql_audit IS 'Scratch copies of datasets with canaries, inside one dpsql.audit call';

-- An audit's released weights and canaries, keyed by its copy's name. Tables of the extension
-- owner's, never temporary ones: an unqualified temp table name is found in the caller's
-- pg_temp, where a table they created first runs their triggers with the definer's rights.
CREATE UNLOGGED TABLE IF NOT EXISTS dpsql_internal.audit_runs (
    audit text NOT NULL, side int, i int, w float8[]);
CREATE UNLOGGED TABLE IF NOT EXISTS dpsql_internal.audit_canaries (
    audit text NOT NULL, slot int, x float8[], y float8, included boolean);

CREATE TABLE IF NOT EXISTS dpsql.audits (
    audit_id        bigserial PRIMARY KEY,
    dataset_id      bigint NOT NULL REFERENCES dpsql.datasets,
    privacy         text NOT NULL,
    model           text NOT NULL,
    epsilon_claimed float8 NOT NULL,
    delta           float8 NOT NULL,
    epsilon_lower   float8 NOT NULL,
    confidence      float8 NOT NULL,
    runs            int NOT NULL,
    method          text NOT NULL,
    options         jsonb NOT NULL,             -- the audited configuration, as given
    details         jsonb NOT NULL,             -- counts, threshold, canaries, mutation
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    created_by      name NOT NULL DEFAULT session_user
);
COMMENT ON TABLE dpsql.audits IS
    'Privacy audits: claimed epsilon against an empirical lower bound (data owners only)';
-- An audit's counts come from uncharged releases: each auditor reads their own audits only.
ALTER TABLE dpsql.audits ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS own_audits ON dpsql.audits;
CREATE POLICY own_audits ON dpsql.audits FOR SELECT USING (created_by = current_user);

-- The test-only switch that breaks a mechanism on purpose (docs/audit.md, "mutations"): a
-- setting only a superuser's session may carry; any other caller is refused outright.
CREATE OR REPLACE FUNCTION dpsql_internal._mutation()
RETURNS text LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    m text := nullif(current_setting('dpsql_audit.mutation', true), '');
BEGIN
    IF m IS NULL THEN
        RETURN NULL;
    END IF;
    IF NOT coalesce((SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = session_user), false) THEN
        PERFORM dpsql_internal._fail('dpsql_audit.mutation is a superuser''s test switch', '42501',
                                     'RESET dpsql_audit.mutation');
    END IF;
    IF m NOT IN ('half_noise', 'paper_minibatch', 'no_clipping', 'poisson_on_shuffle', 'row_level_units') THEN
        PERFORM dpsql_internal._fail(format('unknown mutation %s', quote_literal(m)));
    END IF;
    RETURN m;
END $$;

-- The bolt-on's sensitivity as a mutation breaks it: halved (half the noise), or the paper's
-- mini-batch formula for strongly convex runs (too small by the batch size: Wu et al. 2017,
-- §3.2.3's division by b).
CREATE OR REPLACE FUNCTION dpsql_internal._audit_sensitivity(spec jsonb, rows bigint, sensitivity float8)
RETURNS float8 LANGUAGE plpgsql STABLE AS $$
DECLARE
    m text := dpsql_internal._mutation();
    c record;
BEGIN
    IF m = 'half_noise' THEN
        RETURN sensitivity / 2;
    ELSIF m = 'paper_minibatch' THEN
        c := dpsql.loss_constants(spec->>'model', (spec->>'lambda')::float8,
                                  coalesce((spec->>'radius')::float8, 0),
                                  dpsql_internal._huber_h(spec));
        RETURN dpsql.bolton_sensitivity(
            spec->>'schedule', coalesce((spec->>'step_size')::float8, 0),
            (spec->>'step_offset')::float8, c.lipschitz, c.smoothness, c.strong_convexity, rows,
            (spec->>'batch_size')::bigint, (spec->>'epochs')::int, spec->>'permutation' = 'fresh',
            paper_minibatch => true);
    END IF;
    RETURN sensitivity;
END $$;

-- A white-box plan as a mutation breaks it: half the noise, no clipping (the noise stays
-- calibrated to the clip norm), or shuffled batches accounted as if they were Poisson.
DROP FUNCTION IF EXISTS dpsql_internal._audit_plan(jsonb, bigint, jsonb);
CREATE OR REPLACE FUNCTION dpsql_internal._audit_plan(spec jsonb, rows bigint, plan dpsql_internal.sgd_plan)
RETURNS dpsql_internal.sgd_plan LANGUAGE plpgsql AS $$
DECLARE
    m text := dpsql_internal._mutation();
    b bigint := (spec->>'batch_size')::bigint;
    acct jsonb;
BEGIN
    IF m = 'half_noise' THEN
        plan.noise_scale := plan.noise_scale / 2;
    ELSIF m = 'no_clipping' AND plan.clip_norm IS NOT NULL THEN
        plan.clip_norm := 1e12;
    ELSIF m = 'poisson_on_shuffle' AND plan.sampling = 'shuffle' THEN
        acct := dpsql_internal._account(jsonb_build_object(
            'op', 'calibrate', 'scheme', 'poisson', 'delta', plan.delta,
            'target_epsilon', plan.epsilon,
            'steps', (spec->>'epochs')::int * (rows / b), 'sampling_rate', b::float8 / rows));
        plan.noise_scale := (acct->>'noise_multiplier')::float8 * plan.clip_norm;
    END IF;
    RETURN plan;
END $$;

-- A copy of the dataset's rows (read as the extension owner) plus `slots` rows the audit fills
-- with canaries, registered as a dataset of its own with the same public declarations and a
-- budget for two releases (a distinguishing audit keeps its first run and rolls each later one
-- back, its charge included). `pad` extra features, 0 in every data row and declared on
-- [-1, 1] (a raw value is its transformed value), give a white-box audit's canaries
-- coordinates of their own (65_audit_dirac.sql). A dataset with a privacy unit is audited at
-- unit level: the copy keeps the bounded read's units (k slots each) and its own unit secret,
-- and each canary slot is a unit of k identical rows, so a neighbour replaces a whole unit. The
-- row_level_units mutation plans the copy's releases at row level (64_privacy_units.sql's
-- _unit_release_target), as a dataset whose unit were ignored: its budget allows the k-fold charge.
CREATE OR REPLACE FUNCTION dpsql_internal._audit_copy(ds dpsql.datasets, slots int,
                                                      epsilon float8, delta float8,
                                                      pad int DEFAULT 0)
RETURNS dpsql.datasets LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- (random() may be seeded by options.seed: the name comes from elsewhere)
    name text := format('audit_%s_%s', ds.dataset_id, substr(md5(gen_random_uuid()::text), 1, 10));
    xexpr text := CASE WHEN dpsql_internal._array_feature(ds) THEN quote_ident(ds.features[1])
                       ELSE format('ARRAY[%s]::float8[]',
                                   (SELECT string_agg(quote_ident(f), ', ') FROM unnest(ds.features) f))
                  END;
    bounds float8[] := ds.feature_bounds;
    k int := dpsql_internal._unit_rows(ds);
    units boolean := ds.privacy_unit IS NOT NULL;
    -- (the unit-level charge of a row-level plan at epsilon: k epsilon)
    spend float8 := CASE WHEN dpsql_internal._mutation() = 'row_level_units' THEN k ELSE 1 END;
    copy dpsql.datasets;
BEGIN
    IF pad > 0 THEN
        xexpr := format('(%s) || array_fill(0::float8, ARRAY[%s])', xexpr, pad);
        IF bounds IS NOT NULL THEN
            bounds := bounds || (SELECT array_agg(ARRAY[-1, 1]::float8[]) FROM generate_series(1, pad));
        END IF;
    END IF;
    EXECUTE format('CREATE TABLE dpsql_audit.%I (x float8[], y float8, slot int, unit text)', name);
    EXECUTE format('INSERT INTO dpsql_audit.%I (x, y, unit) SELECT %s, %I, %s FROM %s',
                   name, xexpr, ds.label, CASE WHEN units THEN 'src."dpsql unit"' ELSE 'NULL' END,
                   dpsql_internal._private_from(ds, with_unit => units));
    EXECUTE format('INSERT INTO dpsql_audit.%I (slot, unit) SELECT s, %s FROM generate_series(1, %s) s, '
                   'generate_series(1, %s) r', name,
                   CASE WHEN units THEN '''dpsql canary '' || s' ELSE 'NULL' END, slots, k);
    INSERT INTO dpsql.datasets (name, relid, source, features, label, labels, feature_bounds,
                                row_norm, epsilon_budget, delta_budget, label_bound, row_bound, dim,
                                privacy_unit, max_rows_per_unit)
    VALUES (name, format('dpsql_audit.%I', name)::regclass, format('dpsql_audit.%I', name),
            '{x}', 'y', ds.labels, bounds, ds.row_norm, epsilon * 2.001 * spend,
            least(delta * 2.001 * CASE WHEN spend > 1 THEN exp(spend * epsilon) * spend ELSE 1 END, 0.999),
            ds.label_bound, ds.row_bound, ds.dim + pad,
            CASE WHEN units THEN 'unit' END, CASE WHEN units THEN k END)
    RETURNING * INTO copy;  -- (the definer role's own table: read as its owner)
    IF units THEN
        PERFORM dpsql_internal._draw_unit_secret(copy.dataset_id);
    END IF;
    RETURN copy;
END $$;

-- A raw row whose public transform (feature bounds onto [-1, 1], then the row norm) is t, a
-- point of the unit ball: the audit designs canaries where the model sees them.
CREATE OR REPLACE FUNCTION dpsql_internal._audit_raw(ds dpsql.datasets, t float8[])
RETURNS float8[] LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN ds.feature_bounds IS NOT NULL THEN
                ARRAY(SELECT ds.feature_bounds[i][1] + (t[i] + 1) / 2
                             * (ds.feature_bounds[i][2] - ds.feature_bounds[i][1])
                        FROM generate_subscripts(t, 1) i ORDER BY i)
           ELSE ARRAY(SELECT v * coalesce(ds.row_bound, 1) FROM unnest(t) v) END
$$;

-- A uniformly random direction of the unit sphere in dim dimensions (Box-Muller on random(),
-- which options.seed seeds: the canaries, not the mechanism's noise).
CREATE OR REPLACE FUNCTION dpsql_internal._audit_direction(dim int)
RETURNS float8[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    g float8[] := ARRAY(SELECT sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random())
                          FROM generate_series(1, dim));
    norm float8 := sqrt((SELECT sum(v * v) FROM unnest(g) v));
BEGIN
    RETURN ARRAY(SELECT v / norm FROM unnest(g) v);
END $$;

-- One private release of the copy: its model id (NULL when an uncertified solver released
-- nothing). The audit deletes the copy's models before it returns.
CREATE OR REPLACE FUNCTION dpsql_internal._audit_release(copy dpsql.datasets, model text, params jsonb)
RETURNS bigint LANGUAGE sql AS $$
    SELECT dpsql_internal._train_private(copy.name, model, params)
$$;

-- One audit release's weights (flattened). Unless keep, the release is rolled back once its weights are
-- read: its training table, locks, model and charge go (thousands of runs would exhaust the
-- lock table otherwise); the weights stay. The first run is kept, so that the accountant's
-- answer stays cached.
CREATE OR REPLACE FUNCTION dpsql_internal._audit_weights(copy dpsql.datasets, model text, params jsonb,
                                                         keep boolean)
RETURNS float8[] LANGUAGE plpgsql AS $$
DECLARE
    mid bigint;
    w float8[];
BEGIN
    IF keep THEN
        mid := dpsql_internal._audit_release(copy, model, params);
        SELECT ARRAY(SELECT v FROM unnest(m.weights) v) INTO w FROM dpsql.model_store m
         WHERE m.model_id = mid;
        RETURN w;
    END IF;
    BEGIN
        mid := dpsql_internal._audit_release(copy, model, params);
        SELECT ARRAY(SELECT v FROM unnest(m.weights) v) INTO w FROM dpsql.model_store m
         WHERE m.model_id = mid;
        -- (a RAISE, not _fail: a signal for the handler below, no refusal)
        RAISE EXCEPTION USING ERRCODE = 'DPA01';
    EXCEPTION WHEN SQLSTATE 'DPA01' THEN
        NULL;
    END;
    RETURN w;
END $$;

-- The refusals of an audit's arguments that need no dataset (the method, the options, epsilon
-- and delta, the runs), with delta and the runs filled in.
CREATE OR REPLACE FUNCTION dpsql_internal._audit_arguments(privacy text, epsilon float8, delta float8,
                                                           n_runs int, method text, opts jsonb,
                                                           OUT delta_used float8, OUT runs int,
                                                           OUT method_used text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    conf float8 := coalesce((opts->>'confidence')::float8, 0.95);
    train jsonb := coalesce(opts->'train', '{}');
BEGIN
    -- NULL: the mechanism's default, as dpsql.train takes it (its spec)
    delta_used := coalesce(delta, (SELECT c.delta_default FROM dpsql.mechanism_catalog c WHERE c.name = privacy), 0);
    -- NULL: the most powerful method for the mechanism (docs/audit.md): Dirac canaries in the
    -- aggregate where it takes them, or as crafted rows for output and objective perturbation
    -- (the bolt-on and those two only with Gaussian noise, where a canary reads one
    -- coordinate of the noise), else one run
    method := coalesce(method, CASE WHEN privacy IN ('dpsgd', 'scs13', 'bst14', 'dpsgd_f', 'dpsgd_f_alg2',
                                                     'dp_ftrl')
                                         OR (privacy IN ('bolton', 'output_perturbation',
                                                         'objective_perturbation') AND delta_used > 0)
                                    THEN 'dirac' ELSE 'one_run' END);
    method_used := method;
    IF method NOT IN ('one_run', 'distinguish', 'dirac') THEN
        PERFORM dpsql_internal._fail(format('method must be dirac, one_run or distinguish, got %s',
                                            coalesce(quote_literal(method), 'NULL')));
    END IF;
    IF jsonb_typeof(opts) <> 'object' OR jsonb_typeof(train) <> 'object'
       OR EXISTS (SELECT 1 FROM jsonb_object_keys(opts) k
                   WHERE k NOT IN ('confidence', 'train', 'model', 'canaries', 'seed', 'mutation',
                                   'test')) THEN
        PERFORM dpsql_internal._fail('options takes confidence, model, train (dpsql.train''s '
                                     'parameters), canaries, seed, test and mutation',
                                     hint => 'e.g. options => ''{"train": {"epochs": 2}, "canaries": 500}''');
    END IF;
    IF NOT (epsilon > 0 AND epsilon < 'Infinity') OR NOT (delta_used >= 0 AND delta_used < 1) THEN
        PERFORM dpsql_internal._fail('epsilon must be a finite number > 0 and delta in [0, 1)');
    END IF;
    IF coalesce(opts->>'test', 'dp') NOT IN ('dp', 'gdp')
       OR (opts ? 'test' AND method NOT IN ('distinguish', 'dirac')) THEN
        PERFORM dpsql_internal._fail('options.test is dp (any mechanism) or gdp (Gaussian compositions), '
                                     'for method => ''distinguish'' or ''dirac''');
    END IF;
    IF NOT (conf >= 0.5 AND conf < 1) THEN
        PERFORM dpsql_internal._fail(format('options.confidence must be in [0.5, 1), got %s', conf));
    END IF;
    runs := coalesce(n_runs, CASE WHEN method = 'distinguish' THEN 200 ELSE 1 END);
    IF method = 'one_run' AND runs <> 1 THEN
        PERFORM dpsql_internal._fail('a one_run audit trains once: runs => 1 (or NULL)');
    END IF;
    IF method = 'dirac' AND NOT (runs BETWEEN 1 AND 2000) THEN
        PERFORM dpsql_internal._fail(format('a dirac audit takes 1 to 2000 runs, got %s', runs));
    END IF;
    IF method = 'distinguish' AND NOT (runs BETWEEN 20 AND 20000) THEN
        PERFORM dpsql_internal._fail(format('a distinguish audit takes 20 to 20000 runs per dataset, got %s', runs));
    END IF;
END $$;

-- A distinguish audit: n_runs releases on each of two neighbouring copies of ds, then the
-- error counts of a threshold test on the released models (the statistics' request).
CREATE OR REPLACE FUNCTION dpsql_internal._audit_distinguish(ds dpsql.datasets, model text, params jsonb,
                                                             dim int, n_runs int, epsilon float8,
                                                             delta float8, conf float8, opts jsonb,
                                                             OUT copy dpsql.datasets, OUT request jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET extra_float_digits = 3  -- the scores and thresholds sent to the statistics, in full
AS $$
DECLARE
    labels float8[] := ds.labels;
    positive float8 := labels[cardinality(labels)];
    canary float8[];
    w float8[];
BEGIN
    -- Replace-one neighbours: the slot holds the canary with the first label (D0) or the
    -- last (D1), or y = +B / -B for regression; one direction of the unit ball.
    copy := dpsql_internal._audit_copy(ds, 1, epsilon, delta);
    canary := dpsql_internal._audit_raw(ds, dpsql_internal._audit_direction(dim));
    FOR side IN 0 .. 1 LOOP
        EXECUTE format('UPDATE %s SET x = $1, y = $2 WHERE slot = 1', copy.relid)
          USING canary, CASE WHEN labels IS NULL THEN (1 - 2 * side) * ds.label_bound
                             WHEN side = 0 THEN labels[1] ELSE positive END;
        FOR i IN 1 .. n_runs LOOP
            -- Each run after the first in a subtransaction that is rolled back once its
            -- weights are read (_audit_weights)
            w := dpsql_internal._audit_weights(copy, model, params, side = 0 AND i = 1);
            INSERT INTO dpsql_internal.audit_runs VALUES (copy.name, side, i, w);
            PERFORM dpsql_internal._progress('audit run', side * n_runs + i, 2 * n_runs);
        END LOOP;
    END LOOP;
    -- The test: project on the difference of the two sides' mean models over the
    -- calibration half (odd runs); the even runs judge it.
    WITH released AS (
        SELECT r.side AS d, r.i % 2 = 1 AS calibration, r.w AS weights
          FROM dpsql_internal.audit_runs r WHERE r.audit = copy.name AND r.w IS NOT NULL),
    mean AS (
        SELECT k, avg(v) FILTER (WHERE d = 1) - avg(v) FILTER (WHERE d = 0) AS dv
          FROM released, unnest(released.weights) WITH ORDINALITY AS u(v, k)
         WHERE calibration GROUP BY k),
    score AS (
        SELECT d, calibration,
               (SELECT sum(u.v * mean.dv) FROM unnest(released.weights) WITH ORDINALITY AS u(v, k)
                  JOIN mean USING (k)) AS s
          FROM released),
    -- candidate thresholds: 399 quantiles of the calibration scores; the statistics get
    -- the error counts at each, a few kilobytes whatever the number of runs
    grid AS (
        SELECT DISTINCT unnest(percentile_disc(ARRAY(SELECT g / 400.0 FROM generate_series(1, 399) g))
                               WITHIN GROUP (ORDER BY s)) AS t
          FROM score WHERE calibration),
    errors AS (
        SELECT g.t,
               count(*) FILTER (WHERE sc.d = 0 AND sc.calibration AND sc.s > g.t) AS fp_c,
               count(*) FILTER (WHERE sc.d = 1 AND sc.calibration AND sc.s <= g.t) AS fn_c,
               count(*) FILTER (WHERE sc.d = 0 AND NOT sc.calibration AND sc.s > g.t) AS fp_e,
               count(*) FILTER (WHERE sc.d = 1 AND NOT sc.calibration AND sc.s <= g.t) AS fn_e
          FROM grid g CROSS JOIN score sc GROUP BY g.t)
    SELECT jsonb_build_object(
               'op', 'audit_bound', 'method', 'distinguish', 'delta', delta, 'confidence', conf,
               'test', coalesce(opts->>'test', 'dp'),
               'thresholds', jsonb_agg(e.t ORDER BY e.t),
               'fp_calibration', jsonb_agg(e.fp_c ORDER BY e.t),
               'fn_calibration', jsonb_agg(e.fn_c ORDER BY e.t),
               'fp_evaluation', jsonb_agg(e.fp_e ORDER BY e.t),
               'fn_evaluation', jsonb_agg(e.fn_e ORDER BY e.t),
               'calibration0', (SELECT count(*) FROM score WHERE d = 0 AND calibration),
               'calibration1', (SELECT count(*) FROM score WHERE d = 1 AND calibration),
               'evaluation0', (SELECT count(*) FROM score WHERE d = 0 AND NOT calibration),
               'evaluation1', (SELECT count(*) FROM score WHERE d = 1 AND NOT calibration))
      INTO request FROM errors e;
END $$;

-- A one_run audit: one release on a copy of ds whose m canary slots each hold its canary or a
-- neutral row by a fair coin, then each canary's score (the statistics' request).
CREATE OR REPLACE FUNCTION dpsql_internal._audit_one_run(ds dpsql.datasets, model text, params jsonb,
                                                         dim int, epsilon float8, delta float8,
                                                         conf float8, opts jsonb,
                                                         OUT copy dpsql.datasets, OUT request jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET extra_float_digits = 3  -- the scores and thresholds sent to the statistics, in full
AS $$
DECLARE
    labels float8[] := ds.labels;
    positive float8 := labels[cardinality(labels)];
    m int;
    mid bigint;
BEGIN
    IF model = 'multinomial' OR cardinality(labels) > 2 THEN
        PERFORM dpsql_internal._fail('one_run audits binary and linear models (a canary''s '
                                     'score is its margin)', '0A000',
                                     'Use method => ''distinguish''.');
    END IF;
    -- m canary slots, each with its canary or a neutral row (x = 0 after the transform)
    -- by a fair coin: the guesses are judged against the coins.
    m := coalesce((opts->>'canaries')::int, 1000);
    -- (their scores travel to the statistics as one command-line argument: at most ~80 kB)
    IF NOT (m BETWEEN 10 AND 3000) THEN
        PERFORM dpsql_internal._fail(format('options.canaries must be in [10, 3000], got %s', m));
    END IF;
    copy := dpsql_internal._audit_copy(ds, m, epsilon, delta);
    INSERT INTO dpsql_internal.audit_canaries
    SELECT copy.name, s, dpsql_internal._audit_raw(ds, dpsql_internal._audit_direction(dim)),
           CASE WHEN labels IS NULL THEN CASE WHEN random() < 0.5 THEN ds.label_bound
                                              ELSE -ds.label_bound END
                WHEN random() < 0.5 THEN labels[1] ELSE positive END,
           random() < 0.5
      FROM generate_series(1, m) s;
    EXECUTE format('UPDATE %s t SET x = CASE WHEN c.included THEN c.x ELSE $1 END, y = c.y'
                   '  FROM dpsql_internal.audit_canaries c WHERE c.audit = $2 AND t.slot = c.slot',
                   copy.relid)
      USING dpsql_internal._audit_raw(ds, array_fill(0::float8, ARRAY[dim])), copy.name;
    mid := dpsql_internal._audit_release(copy, model, params);
    IF mid IS NULL THEN
        PERFORM dpsql_internal._fail('the audited mechanism released nothing (its solver did '
                                     'not certify): no bound', '55000');
    END IF;
    INSERT INTO dpsql_internal.audit_runs VALUES (copy.name, 1, 1, '{}');
    -- score: the margin the model gives the canary's label (higher when it was trained on)
    SELECT jsonb_build_object(
               'op', 'audit_bound', 'method', 'one_run', 'delta', delta, 'confidence', conf,
               'scores', jsonb_agg(s ORDER BY slot), 'included', jsonb_agg(included ORDER BY slot))
      INTO request
      FROM (SELECT c.slot, c.included,
                   CASE WHEN labels IS NULL THEN -((p.v - c.y) ^ 2)
                        WHEN model = 'logistic' THEN CASE WHEN c.y = positive THEN p.v ELSE 1 - p.v END
                        ELSE CASE WHEN c.y = positive THEN p.v ELSE -p.v END END AS s
              FROM dpsql_internal.audit_canaries c,
                   LATERAL (SELECT dpsql.predict(mid, c.x) AS v) p
             WHERE c.audit = copy.name) q;
END $$;

-- The audit (dpsql.audit below is its interface): the new dpsql.audits row's summary.
CREATE OR REPLACE FUNCTION dpsql_internal._audit(dataset text, privacy text, epsilon float8,
                                                 delta float8, n_runs int, method text,
                                                 opts jsonb)
RETURNS TABLE (claimed float8, lower_bound float8, level float8, trainings int, how text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET extra_float_digits = 3  -- the scores and thresholds sent to the statistics, in full
AS $$
DECLARE
    conf float8 := coalesce((opts->>'confidence')::float8, 0.95);
    ds dpsql.datasets;
    model text;
    train jsonb := coalesce(opts->'train', '{}');
    params jsonb;
    copy dpsql.datasets;
    run record;  -- the copy and the statistics' request (_audit_distinguish, _audit_one_run)
    dim int;
    answer jsonb;
    request jsonb;
    details jsonb;
    id bigint;
BEGIN
    opts := coalesce(opts, '{}');
    conf := coalesce((opts->>'confidence')::float8, 0.95);
    train := coalesce(opts->'train', '{}');
    PERFORM dpsql_internal._require_admin('audit a mechanism');
    SELECT x.delta_used, x.runs, x.method_used INTO delta, n_runs, method
      FROM dpsql_internal._audit_arguments(privacy, epsilon, delta, n_runs, method, opts) x;
    ds := dpsql_internal._dataset_for_source(dataset);
    -- Thousands of uncharged releases are no worse than the rows themselves only for a role
    -- that can read those rows: the data owner, not any member of dpsql_admin.
    IF NOT dpsql_internal._can_read_rows(ds) THEN
        PERFORM dpsql_internal._fail(format('an audit of %s trains on its rows uncharged: only a '
                                            'role that can read them may run it', ds.name), '42501',
                                     'The data owner audits (GRANT SELECT on the registered columns).');
    END IF;
    IF cardinality(dpsql_internal._text_columns(ds)) > 0 THEN
        PERFORM dpsql_internal._fail(format('dataset %s has categorical features or a text label, which audits '
                                            'do not encode yet', quote_literal(ds.name)), '0A000',
                                     'Audit a dataset of numeric (or boolean) columns.');
    END IF;
    IF opts ? 'seed' THEN
        PERFORM setseed(((opts->>'seed')::bigint % 1000003) / 1000003.0);
    END IF;
    IF opts ? 'mutation' THEN
        -- the switch is a superuser's, for this call only (_mutation refuses anyone else)
        PERFORM set_config('dpsql_audit.mutation', opts->>'mutation', true);
        PERFORM dpsql_internal._mutation();
    END IF;
    -- (row canaries default to the Huber SVM: its loss's derivative is its Lipschitz bound at
    -- a canary's margin, where the logistic loss's is half of it)
    model := coalesce(opts->>'model', CASE WHEN ds.labels IS NULL THEN 'linear'
                                           WHEN method = 'dirac' AND dpsql_internal._audit_row_canaries(privacy)
                                           THEN 'huber' ELSE 'logistic' END);
    IF opts->>'mutation' = 'half_noise' AND dpsql_internal._audit_row_canaries(privacy)
       AND method <> 'dirac' THEN
        PERFORM dpsql_internal._fail(format('the half_noise mutation of %s is for method => ''dirac''',
                                            privacy), '0A000');
    END IF;
    params := train || jsonb_build_object('privacy', privacy, 'epsilon', epsilon, 'delta', delta);
    dim := coalesce(ds.dim, cardinality(ds.features));
    -- the runs report their own progress; an audit reports its runs
    PERFORM set_config('dpsql_progress.only', 'audit run', true);

    IF method = 'distinguish' THEN
        run := dpsql_internal._audit_distinguish(ds, model, params, dim, n_runs, epsilon, delta, conf, opts);
    ELSIF method = 'dirac' THEN
        run := dpsql_internal._audit_dirac(ds, model, privacy, params, dim, n_runs, epsilon, delta, conf, opts);
    ELSE
        run := dpsql_internal._audit_one_run(ds, model, params, dim, epsilon, delta, conf, opts);
    END IF;
    copy := run.copy;
    request := run.request;
    answer := dpsql_internal._accountant(request::text)::jsonb;
    IF answer ? 'error' THEN
        PERFORM dpsql_internal._fail('the audit''s statistics refused: ' || (answer->>'error'), 'XX000');
    END IF;
    details := (answer - 'op' - 'method' - 'confidence')
               || jsonb_build_object('mutation', opts->'mutation', 'copy', copy.name, 'model', model,
                                     'canary', CASE WHEN method <> 'dirac' THEN 'row'
                                                    WHEN dpsql_internal._audit_row_canaries(privacy)
                                                    THEN 'crafted row' ELSE 'gradient' END,
                                     'released', (SELECT count(r.w) FROM dpsql_internal.audit_runs r
                                                   WHERE r.audit = copy.name))
               -- a dataset with a privacy unit is audited at unit level (_audit_copy)
               || CASE WHEN ds.privacy_unit IS NULL THEN '{}'::jsonb
                       ELSE jsonb_build_object('privacy_unit', jsonb_build_object(
                                'column', ds.privacy_unit, 'max_rows_per_unit', ds.max_rows_per_unit,
                                'canary', format('a unit of %s identical rows', ds.max_rows_per_unit))) END;
    DELETE FROM dpsql_internal.audit_runs r WHERE r.audit = copy.name;
    DELETE FROM dpsql_internal.audit_canaries c WHERE c.audit = copy.name;
    -- The switches end with the audit, not with the transaction: a release after it in the
    -- same transaction is neither mutated nor silent.
    PERFORM set_config('dpsql_audit.mutation', '', true);
    PERFORM set_config('dpsql_audit.canary_copy', '', true);
    PERFORM set_config('dpsql_progress.only', '', true);
    -- No model of the copies survives, and the copy is dropped (marked so by the event trigger).
    DELETE FROM dpsql.model_store s WHERE s.dataset_id = copy.dataset_id;
    EXECUTE format('DROP TABLE %s', copy.relid);
    INSERT INTO dpsql.audits (dataset_id, privacy, model, epsilon_claimed, delta, epsilon_lower,
                              confidence, runs, method, options, details)
    VALUES (ds.dataset_id, privacy, model, epsilon, delta, (answer->>'epsilon_lower')::float8,
            conf, n_runs, method, opts, details)
    RETURNING audit_id INTO id;
    RETURN QUERY SELECT a.epsilon_claimed, a.epsilon_lower, a.confidence, a.runs, a.method
                   FROM dpsql.audits a WHERE a.audit_id = id;
END $$;

-- The interface (a SQL function: its parameters and its result columns share names).
CREATE OR REPLACE FUNCTION dpsql.audit(dataset text, privacy text, epsilon float8,
                                       delta float8 DEFAULT NULL, runs int DEFAULT NULL,
                                       method text DEFAULT NULL, options jsonb DEFAULT '{}')
RETURNS TABLE (epsilon_claimed float8, epsilon_lower float8, confidence float8, runs int,
               method text)
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM dpsql_internal._audit($1, $2, $3, $4, $5, $6, $7)
$$;
COMMENT ON FUNCTION dpsql.audit(text, text, float8, float8, int, text, jsonb) IS
    'Empirical lower bound on a mechanism''s epsilon on copies of a dataset with canaries (data owners; docs/audit.md)';
