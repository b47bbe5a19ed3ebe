------------------------------------------------------------------------------------------
-- White-box audits of the SGD family with Dirac canaries (docs/audit.md, method 'dirac').
-- The audit's copy gets m + 1 extra features that no data row uses (all 0): one coordinate per
-- canary and a marker. A canary row has the marker set, and the aggregate (core/sgd.h,
-- DPSQL_FLAG_CANARY_ROWS) adds exactly clip_norm * (+e_k) to the gradient sum of each step
-- that samples it when its secret coin says "in", or clip_norm * (-e_k) when it says "out":
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
-- bolt-on's analytic Gaussian output noise), dp (any (epsilon, delta) claim) elsewhere.
CREATE OR REPLACE FUNCTION dpsql_internal._audit_dirac_test(privacy text, params jsonb, delta float8)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN delta > 0 AND (
                    (privacy = 'dpsgd' AND coalesce(params->>'sampling', 'shuffle') = 'shuffle')
                    OR (privacy = 'bolton' AND coalesce(params->>'gaussian', 'analytic') = 'analytic'))
                THEN 'gdp' ELSE 'dp' END
$$;

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
    m int := coalesce((opts->>'canaries')::int, 1000);
    label float8 := CASE WHEN ds.labels IS NULL THEN 0 ELSE ds.labels[1] END;
    zero float8[] := dpsql_internal._audit_raw(ds, array_fill(0::float8, ARRAY[dim]));
    coins boolean[];
    mid bigint;
    w float8[];
    ks int[];
BEGIN
    IF privacy NOT IN ('dpsgd', 'scs13', 'bst14', 'dpsgd_f', 'dpsgd_f_alg2', 'bolton') THEN
        PERFORM dpsql_internal._fail(format('method dirac audits the SGD mechanisms (dpsgd, scs13, bst14, '
                                            'dpsgd_f, dpsgd_f_alg2, bolton), not %s', privacy),
                                     '0A000', 'Use method => ''one_run'' or ''distinguish''.');
    END IF;
    -- every row of the copy carries the m canary coordinates (zeros compress well)
    IF NOT (m BETWEEN 10 AND 5000) THEN
        PERFORM dpsql_internal._fail(format('options.canaries must be in [10, 5000] for dirac, got %s', m));
    END IF;
    copy := dpsql_internal._audit_copy(ds, m, epsilon, delta, pad => m + 1);
    PERFORM set_config('dpsql_audit.canary_copy', copy.relid::text, true);
    FOR r IN 1 .. n_runs LOOP
        coins := ARRAY(SELECT random() < 0.5 FROM generate_series(1, m));
        EXECUTE format('UPDATE %s t SET x = dpsql_internal._audit_dirac_row($1, $2, t.slot, $3[t.slot]), y = $4'
                       ' WHERE t.slot IS NOT NULL', copy.relid)
          USING zero, m, coins, label;
        -- each run after the first rolled back once its weights are read (as distinguish does)
        w := NULL;
        IF r = 1 THEN
            mid := dpsql_internal._audit_release(copy, model, params);
            SELECT ARRAY(SELECT v FROM unnest(s.weights) v) INTO w
              FROM dpsql.model_store s WHERE s.model_id = mid;
        ELSE
            BEGIN
                mid := dpsql_internal._audit_release(copy, model, params);
                SELECT ARRAY(SELECT v FROM unnest(s.weights) v) INTO w
                  FROM dpsql.model_store s WHERE s.model_id = mid;
                RAISE EXCEPTION USING ERRCODE = 'DPA01';
            EXCEPTION WHEN SQLSTATE 'DPA01' THEN
                NULL;
            END;
        END IF;
        IF w IS NULL OR cardinality(w) < dim + m
           OR EXISTS (SELECT 1 FROM unnest(w[dim + 1 : dim + m]) v WHERE NOT (v > '-Infinity' AND v < 'Infinity')) THEN
            PERFORM dpsql_internal._fail('the audited mechanism released no finite model: no bound', '55000');
        END IF;
        INSERT INTO dpsql_internal.audit_canaries
        SELECT copy.name, (r - 1) * m + k, NULL, -w[dim + k], coins[k] FROM generate_series(1, m) k;
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
