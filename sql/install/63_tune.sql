------------------------------------------------------------------------------------------
-- Private selection (issue 44): dpsql.tune trains candidates on a dataset, scores each
-- privately on a validation dataset (61_private_evaluate.sql), and releases only the best
-- one's model, for a total cost on each dataset of at most the epsilon (and delta) given.
--
-- A run draws a candidate uniformly (public coins), trains it at the run's (e, d) on the
-- training dataset and scores it at e_v on the validation dataset; after each run tune stops
-- with probability gamma = 1/K (K candidates: K runs on average). Only the best run's model
-- leaves the function, with its noisy score; the others are deleted before it returns.
--   Validation dataset: every score is pure e_v-DP, so by Liu and Talwar ("Private selection
--   from private candidates", STOC 2019, Theorem 3.4) the selection is 3 e_v-DP there:
--   e_v = epsilon / 3, delta 0.
--   Training dataset, delta = 0: every candidate pure e-DP, Liu-Talwar again: e = epsilon / 3.
--   Training dataset, delta > 0: Papernot and Steinke ("Hyperparameter tuning with Renyi
--   differential privacy", ICLR 2022, Theorem 2, geometric K) on the largest of the
--   candidates' Renyi curves (dpsql/selection.py, by dp-accounting's RepeatAndSelect bound);
--   e is the largest per-run epsilon (each candidate calibrated to (e, delta) by its own
--   accountant) whose selection is at most epsilon at delta, found by a few secant steps.
-- Each dataset is charged once, before any row is read: the validation dataset (epsilon, 0),
-- then the training dataset (its selection's epsilon, delta), each an EpsilonDelta event with
-- the selection's parameters in the note. The candidates' own charges inside the selection
-- are paid by that one charge (dpsql_internal.tune_prepaid, read by _charge). The number of
-- runs and the winner's index are public coins' outcomes and the selection's output.
------------------------------------------------------------------------------------------

-- The runs of a selection in progress, paid by its charge: one row per (backend, its
-- transaction, training dataset), written and deleted by dpsql.tune inside its transaction,
-- so no other session ever sees it. _charge takes a run's charges from it (up to the run's
-- budget) instead of charging the ledger.
CREATE TABLE IF NOT EXISTS dpsql_internal.tune_prepaid (
    backend     int NOT NULL,
    xact        xid8 NOT NULL,
    dataset_id  bigint NOT NULL,
    entry_id    bigint NOT NULL,          -- the selection's ledger entry
    epsilon     float8 NOT NULL,          -- a run's budget
    delta       float8 NOT NULL,
    used_epsilon float8 NOT NULL DEFAULT 0,  -- this run's charges so far
    used_delta  float8 NOT NULL DEFAULT 0,
    PRIMARY KEY (backend, xact, dataset_id)
);

-- Called by _charge: the selection's ledger entry when this transaction's dpsql.tune pays for
-- the charge (a run of its selection), else NULL. A charge beyond the run's budget is a bug.
CREATE OR REPLACE FUNCTION dpsql_internal._tune_prepaid_entry(dataset_id bigint, epsilon float8, delta float8)
RETURNS bigint LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p dpsql_internal.tune_prepaid;
BEGIN
    IF pg_current_xact_id_if_assigned() IS NULL THEN
        RETURN NULL;
    END IF;
    UPDATE dpsql_internal.tune_prepaid t
       SET used_epsilon = t.used_epsilon + _tune_prepaid_entry.epsilon,
           used_delta = t.used_delta + _tune_prepaid_entry.delta
     WHERE t.backend = pg_backend_pid() AND t.xact = pg_current_xact_id()
       AND t.dataset_id = _tune_prepaid_entry.dataset_id
    RETURNING t.* INTO p;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF p.used_epsilon > p.epsilon * (1 + 1e-9) OR p.used_delta > p.delta * (1 + 1e-9) + 1e-300 THEN
        -- (a RAISE, not _fail: the selection's own accounting is wrong)
        RAISE EXCEPTION 'dpsql: a tune run charged (%, %) beyond its budget (%, %)',
                        p.used_epsilon, p.used_delta, p.epsilon, p.delta USING ERRCODE = 'XX000';
    END IF;
    RETURN p.entry_id;
END $$;

-- A dpsql.train (or dpsql.preview) call of a candidate: its arguments checked against
-- dpsql.train's names and types (never a caller's name or type in the text), plus the run's
-- epsilon, delta and noise seed. Values are literals cast to the argument's built-in type.
CREATE OR REPLACE FUNCTION dpsql_internal._tune_call(fn text, source text, candidate jsonb, epsilon float8,
                                                    delta float8, noise_seed bigint, i int)
RETURNS text LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    args text := format('%L', source) || ', NULL, NULL';
    k text;
    v jsonb;
    typ text;
    reserved constant text[] := '{source,features,label,epsilon,delta,noise_seed,validation}';
BEGIN
    IF fn NOT IN ('dpsql.train', 'dpsql.preview') THEN
        -- (a RAISE, not _fail: a misuse inside the extension, not a refusal of a call)
        RAISE EXCEPTION 'dpsql: _tune_call of %', fn USING ERRCODE = 'XX000';
    END IF;
    IF jsonb_typeof(candidate) IS DISTINCT FROM 'object' OR NOT candidate ? 'privacy' THEN
        PERFORM dpsql_internal._fail(format('candidate %s must be an object of dpsql.train arguments with '
                                            'privacy, got %s', i, coalesce(candidate::text, 'NULL')),
                                     hint => 'e.g. [{"privacy": "dpsgd", "sampling": "poisson"}, '
                                             '{"privacy": "bolton", "lambda": 0.001}]');
    END IF;
    -- a private mechanism only: privacy => 'none' would train noiselessly, here as the
    -- extension owner
    IF jsonb_typeof(candidate->'privacy') IS DISTINCT FROM 'string'
       OR NOT (candidate->>'privacy' = 'auto'
               OR EXISTS (SELECT 1 FROM dpsql.mechanism_catalog m WHERE m.name = candidate->>'privacy')) THEN
        PERFORM dpsql_internal._fail(format('candidate %s: privacy must be auto or a mechanism of dpsql.mechanisms(), got %s',
                                            i, candidate->'privacy'),
                                     hint => 'SELECT name FROM dpsql.mechanisms() lists them.');
    END IF;
    FOR k, v IN SELECT * FROM jsonb_each(candidate) ORDER BY 1 LOOP
        SELECT format_type(p.proargtypes[a.n - 1], NULL) INTO typ
          FROM pg_proc p, unnest(p.proargnames) WITH ORDINALITY AS a(name, n)
         WHERE p.pronamespace = 'dpsql'::regnamespace AND p.proname = 'train'
           AND a.name = k;
        IF typ IS NULL OR k = ANY (reserved) THEN
            PERFORM dpsql_internal._fail(format('candidate %s: %s is not a dpsql.train argument a candidate may set',
                                                i, quote_literal(k)),
                                         hint => 'Candidates differ in mechanism and hyperparameters; epsilon '
                                                 'and delta are the selection''s.');
        END IF;
        args := args || format(', %I => %s', k,
                               CASE WHEN jsonb_typeof(v) = 'null' THEN 'NULL'
                                    WHEN jsonb_typeof(v) = 'array'
                                    THEN format('%L::%s', translate(v::text, '[]', '{}'), typ)
                                    WHEN typ = 'jsonb' THEN format('%L::jsonb', v::text)
                                    ELSE format('%L::%s', v #>> '{}', typ) END);
    END LOOP;
    RETURN format('SELECT %s(%s, epsilon => %s, delta => %s, noise_seed => %s)', fn, args,
                  epsilon, delta, coalesce(noise_seed::text, 'NULL'));
END $$;

-- The default candidates: auto's choice (first) and alternatives of the same kind, by task
-- and by whether delta > 0 (candidates a preview refuses are left out of a default set). With
-- delta > 0 only Gaussian mechanisms: the selection's Renyi bound takes the largest of the
-- candidates' curves, and a pure candidate's (flat at epsilon for large orders) would halve
-- every run's epsilon (bench/RESULTS.md, tune_selection: 0.26-0.29 epsilon per run with the
-- bolt-on in the set, against about 0.6 without).
CREATE OR REPLACE FUNCTION dpsql_internal._tune_default_candidates(ds dpsql.datasets, delta float8)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN ds.labels IS NULL AND delta > 0 THEN
                    '[{"privacy": "auto", "model": "linear"}, {"privacy": "dpsgd_f", "model": "linear"},
                      {"privacy": "dpsgd", "sampling": "poisson", "model": "linear", "intercept": true}]'
                WHEN ds.labels IS NULL THEN
                    '[{"privacy": "auto", "model": "linear"},
                      {"privacy": "output_perturbation", "model": "linear", "intercept": true}]'
                WHEN delta > 0 THEN
                    '[{"privacy": "auto"}, {"privacy": "dpsgd_f"},
                      {"privacy": "dpsgd", "sampling": "poisson", "intercept": true, "lambda": 0.001}]'
                ELSE
                    '[{"privacy": "auto"}, {"privacy": "objective_perturbation", "intercept": true},
                      {"privacy": "bolton", "lambda": 0.001}]' END::jsonb
$$;

-- The metrics tune may select on, and whether larger is better.
CREATE OR REPLACE FUNCTION dpsql_internal._tune_metric(ds dpsql.datasets, metric text, OUT name text, OUT larger_better boolean)
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    name := coalesce(metric, CASE WHEN ds.labels IS NULL THEN 'mse' ELSE 'accuracy' END);
    IF ds.labels IS NULL AND name NOT IN ('mse', 'mae', 'r2')
       OR ds.labels IS NOT NULL AND name NOT IN ('accuracy', 'balanced_accuracy', 'f1', 'roc_auc') THEN
        PERFORM dpsql_internal._fail(format('tune selects on %s, not %s',
                                            CASE WHEN ds.labels IS NULL THEN 'mse, mae or r2'
                                                 ELSE 'accuracy, balanced_accuracy, f1 or roc_auc' END,
                                            quote_literal(name)));
    END IF;
    larger_better := name NOT IN ('mse', 'mae');
END $$;

-- The accountant's answer to a selection request (dpsql/selection.py), or the refusal.
CREATE OR REPLACE FUNCTION dpsql_internal._tune_accountant(req jsonb)
RETURNS jsonb LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    answer jsonb := dpsql_internal._accountant(req::text)::jsonb;
BEGIN
    IF answer ? 'error' THEN
        PERFORM dpsql_internal._fail('the selection cannot be accounted: ' || (answer->>'error'),
                                     hint => 'Candidates with delta > 0 need Renyi curves (Gaussian noise).');
    END IF;
    RETURN answer;
END $$;

-- The refusals of a selection's arguments that need no candidate: epsilon and delta out of range,
-- a validation dataset that is the training dataset or has other columns, a noise seed from a
-- caller who cannot read both datasets' rows.
CREATE OR REPLACE FUNCTION dpsql_internal._tune_check_arguments(ds dpsql.datasets, vs dpsql.datasets,
                                                                epsilon float8, delta float8,
                                                                noise_seed bigint)
RETURNS void LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF epsilon IS NULL OR NOT (epsilon > 0 AND epsilon < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('epsilon must be a finite number > 0, got %s', coalesce(epsilon::text, 'NULL')));
    END IF;
    IF delta IS NOT NULL AND NOT (delta >= 0 AND delta < 1) THEN
        PERFORM dpsql_internal._fail(format('delta must be in [0, 1), got %s', delta));
    END IF;
    IF ds.dataset_id = vs.dataset_id THEN
        PERFORM dpsql_internal._fail(format('tune scores on a validation dataset other than %s', quote_literal(ds.name)),
                                     hint => 'A data owner registers one with register_dataset(..., holdout => 0.2): '
                                             'then validation => ''<name>_holdout''.');
    END IF;
    IF ds.features IS DISTINCT FROM vs.features OR ds.label IS DISTINCT FROM vs.label
       OR ds.labels IS DISTINCT FROM vs.labels OR ds.categories IS DISTINCT FROM vs.categories
       OR ds.label_values IS DISTINCT FROM vs.label_values THEN
        PERFORM dpsql_internal._fail(format('validation dataset %s does not have the features, label and labels of %s',
                                            quote_literal(vs.name), quote_literal(ds.name)));
    END IF;
    IF noise_seed IS NOT NULL AND NOT (dpsql_internal._can_read_rows(ds) AND dpsql_internal._can_read_rows(vs)) THEN
        PERFORM dpsql_internal._noise_seed_refused();
    END IF;
END $$;

-- One round of the selection's search: each candidate of todo ({candidate, index}) previewed at
-- the per-run budget e (delta d when it needs one), with the refusals of _tune_plan (below);
-- previews and events of those that run; feasible false when, after the first round
-- (first_round), a member of the fixed set is refused at e.
CREATE OR REPLACE FUNCTION dpsql_internal._tune_previews(ds dpsql.datasets, todo jsonb, e float8, d float8,
                                                         noise_seed bigint, given boolean, first_round boolean,
                                                         OUT previews jsonb, OUT events jsonb,
                                                         OUT feasible boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c jsonb;
    i int;
    p jsonb;
    needs_delta boolean;
BEGIN
    previews := '[]';
    events := '[]';
    feasible := true;
    FOR c IN SELECT x FROM jsonb_array_elements(todo) x LOOP
        i := (c->>'index')::int;
        -- (auto takes the selection's delta: its choice with delta > 0, as train's auto)
        needs_delta := coalesce((SELECT m.needs_delta FROM dpsql.mechanism_catalog m
                                  WHERE m.name = c->'candidate'->>'privacy'),
                                c->'candidate'->>'privacy' = 'auto' AND d > 0);
        IF d = 0 AND needs_delta THEN
            PERFORM dpsql_internal._fail(format('candidate %s (%s) needs delta > 0; the selection is pure (delta 0)',
                                                i, c->'candidate'),
                                         hint => 'Give tune a delta, or only pure candidates.');
        END IF;
        EXECUTE dpsql_internal._tune_call('dpsql.preview', ds.name, c->'candidate', e,
                                          CASE WHEN needs_delta THEN d ELSE 0 END, noise_seed, i) INTO p;
        -- (a budget it would exceed is the selection's question, answered by its charges)
        IF p ? 'refused' AND p->'refused'->>'sqlstate' IS DISTINCT FROM 'DP001' THEN
            IF given AND first_round THEN
                PERFORM dpsql_internal._fail(format('candidate %s (%s) is refused: %s', i, c->'candidate',
                                                    p->'refused'->>'message'),
                                             hint => p->'refused'->>'hint');
            END IF;
            IF NOT first_round THEN  -- a member of the set refused at this e: e does not work
                feasible := false;
                EXIT;
            END IF;
            CONTINUE;
        END IF;
        IF d = 0 AND (p->>'delta')::float8 > 0 THEN
            PERFORM dpsql_internal._fail(format('candidate %s (%s) needs delta > 0; the selection is pure (delta 0)',
                                                i, c->'candidate'),
                                         hint => 'Give tune a delta, or only pure candidates.');
        END IF;
        -- Papernot-Steinke needs each run's Renyi curve: a release known only as
        -- (epsilon, delta > 0)-DP has none (dpsql/selection.py)
        IF d > 0 AND jsonb_path_exists(coalesce(p->'dp_event',
                                                dpsql_internal._epsilon_delta_event((p->>'epsilon')::float8,
                                                                                    (p->>'delta')::float8)),
                                       '$.** ? (@.type == "EpsilonDelta" && @.delta > 0)') THEN
            IF given THEN
                PERFORM dpsql_internal._fail(
                    format('candidate %s (%s) is known only as (epsilon, delta)-DP: the selection''s '
                           'Renyi bound needs its curve', i, c->'candidate'),
                    hint => 'Leave it out; Gaussian-noise mechanisms (dpsgd, dpsgd_f, dpgd) and pure ones qualify.');
            END IF;
            CONTINUE;
        END IF;
        previews := previews || jsonb_build_array(jsonb_build_object(
            'candidate', c->'candidate', 'index', i, 'mechanism', p->'mechanism', 'epsilon', p->'epsilon',
            'delta', p->'delta', 'dp_event', p->'dp_event', 'warnings', p->'warnings'));
        events := events || jsonb_build_array(coalesce(p->'dp_event',
            dpsql_internal._epsilon_delta_event((p->>'epsilon')::float8, (p->>'delta')::float8)));
    END LOOP;
END $$;

-- The whole public plan of a selection, before anything is charged or read: the datasets,
-- the candidates (each previewed at the run's budget: its refusal is the selection's), the
-- per-run budgets, what each dataset is charged, the metric. Every refusal that needs no row.
-- defaults: candidates is a default set (its refused candidates are left out), not the caller's.
CREATE OR REPLACE FUNCTION dpsql_internal._tune_plan(dataset text, validation text, epsilon float8,
                                                    delta float8, candidates jsonb, metric text,
                                                    noise_seed bigint, defaults boolean DEFAULT false)
RETURNS jsonb LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ds dpsql.datasets := dpsql_internal._dataset_for_source(dataset);
    vs dpsql.datasets := dpsql_internal._lookup_dataset(validation);
    d float8;
    given boolean := candidates IS NOT NULL AND NOT defaults;
    cands jsonb := '[]';
    met record;
    e float8;
    best_e float8;
    best_total float8;
    total float8;
    previews jsonb;
    events jsonb;
    todo jsonb;
    feasible boolean;
    lo float8;
    hi float8;
BEGIN
    PERFORM dpsql_internal._tune_check_arguments(ds, vs, epsilon, delta, noise_seed);
    d := coalesce(delta, dpsql_internal._auto_delta(ds));
    met := dpsql_internal._tune_metric(ds, metric);
    IF candidates IS NOT NULL AND (jsonb_typeof(candidates) IS DISTINCT FROM 'array' OR jsonb_array_length(candidates) = 0
                  OR jsonb_array_length(candidates) > 100) THEN
        PERFORM dpsql_internal._fail('candidates must be a JSON array of 1 to 100 dpsql.train argument objects',
                                     hint => 'e.g. ''[{"privacy": "dpsgd", "sampling": "poisson"}, {"privacy": "bolton"}]''');
    END IF;
    -- The per-run budget on the training dataset: pure, Liu-Talwar (epsilon / 3); else the
    -- largest e whose Papernot-Steinke selection over the candidates' curves is <= epsilon.
    -- The candidates: those that run at epsilon / 3 (a default set leaves out the ones their
    -- previews refuse there; a caller's candidate refused is the selection's refusal). The set
    -- is then fixed, so that the selection's epsilon grows with e (the search below).
    todo := (SELECT jsonb_agg(jsonb_build_object('candidate', x, 'index', n) ORDER BY n)
               FROM jsonb_array_elements(coalesce(candidates, dpsql_internal._tune_default_candidates(ds, d)))
                    WITH ORDINALITY AS t(x, n));
    e := epsilon / 3;
    FOR k IN 1 .. CASE WHEN d > 0 THEN 10 ELSE 1 END LOOP
        SELECT r.previews, r.events, r.feasible INTO previews, events, feasible
          FROM dpsql_internal._tune_previews(ds, todo, e, d, noise_seed, given, k = 1) r;
        IF k = 1 THEN
            IF jsonb_array_length(previews) = 0 THEN
                PERFORM dpsql_internal._fail(format('no candidate can run on %s at epsilon %s per run', ds.name,
                                                    round(e::numeric, 6)),
                                             hint => 'dpsql.preview says why for each; more epsilon, or other candidates.');
            END IF;
            todo := (SELECT jsonb_agg(jsonb_build_object('candidate', x->'candidate', 'index', x->'index'))
                       FROM jsonb_array_elements(previews) x);
        END IF;
        total := NULL;
        IF feasible AND d = 0 THEN
            total := (dpsql_internal._tune_accountant(jsonb_build_object('op', 'select', 'pure_epsilon', e))->>'epsilon')::float8;
        ELSIF feasible THEN
            total := (dpsql_internal._tune_accountant(jsonb_build_object(
                          'op', 'select', 'events', events, 'mean', jsonb_array_length(todo), 'delta', d))->>'epsilon')::float8;
        END IF;
        IF total <= epsilon * (1 + 1e-12) THEN
            IF best_e IS NULL OR e > best_e THEN
                best_e := e;
                best_total := total;
                cands := previews;
            END IF;
            lo := greatest(lo, e);
        ELSIF total IS NOT NULL THEN
            hi := least(hi, e);
        ELSE
            lo := NULL;  -- refused here: smaller e is not known to work either; search below
            hi := least(hi, e);
        END IF;
        EXIT WHEN total <= epsilon AND total >= 0.97 * epsilon;
        -- the next e: the secant (the selection grows about linearly in e) kept inside the
        -- bracket found so far, else its geometric middle
        e := CASE WHEN total IS NOT NULL THEN e * epsilon / total * 0.99 ELSE e / 2 END;
        IF (lo IS NOT NULL AND e <= lo) OR (hi IS NOT NULL AND e >= hi) THEN
            e := CASE WHEN lo IS NOT NULL AND hi IS NOT NULL THEN sqrt(lo * hi)
                      WHEN lo IS NOT NULL THEN lo * 1.5 ELSE hi / 1.5 END;
        END IF;
    END LOOP;
    IF best_e IS NULL THEN
        PERFORM dpsql_internal._fail(format('a selection among these candidates costs more than epsilon %s at delta %s', epsilon, d),
                                     hint => 'Its bound has terms in log(candidates) and log(1/delta) that no run '
                                             'avoids: more epsilon, or fewer candidates.');
    END IF;
    RETURN jsonb_build_object(
        'dataset', ds.name, 'dataset_id', ds.dataset_id, 'validation', vs.name, 'validation_id', vs.dataset_id,
        'epsilon', epsilon, 'delta', d, 'metric', met.name, 'larger_better', met.larger_better,
        'candidates', cands, 'mean_runs', jsonb_array_length(cands),
        'run_epsilon', best_e, 'run_delta', d, 'score_epsilon', epsilon / 3,
        'charges', jsonb_build_array(
            jsonb_build_object('dataset', vs.name, 'epsilon', epsilon, 'delta', 0,
                               'bound', 'Liu-Talwar random stopping (3 x ' || epsilon / 3 || ')'),
            jsonb_build_object('dataset', ds.name, 'epsilon', best_total, 'delta', d,
                               'bound', CASE WHEN d = 0 THEN 'Liu-Talwar random stopping (3 x ' || best_e || ')'
                                             ELSE 'Papernot-Steinke, geometric runs' END)));
END $$;

-- One run's model scored on the validation dataset (private, paid by the selection).
CREATE OR REPLACE FUNCTION dpsql_internal._tune_score(model_id bigint, vs dpsql.datasets, epsilon float8,
                                                     metric text, noise_seed bigint)
RETURNS float8 LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- planned at row level for the unit-level epsilon the selection paid (64_privacy_units.sql)
    metrics jsonb := dpsql_internal._private_metrics(dpsql_internal._model(model_id), vs,
                                                     (dpsql_internal._unit_release_target(vs, epsilon, 0)).epsilon,
                                                     0, noise_seed);
BEGIN
    RETURN (metrics->>metric)::float8;
END $$;

-- The selection (the header); defaults as in _tune_plan.
CREATE OR REPLACE FUNCTION dpsql_internal._tune(dataset text, validation text, epsilon float8, delta float8,
                                               candidates jsonb, metric text, noise_seed bigint,
                                               defaults boolean)
RETURNS bigint LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    plan jsonb := dpsql_internal._tune_plan(dataset, validation, epsilon, delta, candidates, metric, noise_seed,
                                            defaults);
    ds dpsql.datasets := dpsql_internal._dataset_by_id((plan->>'dataset_id')::bigint);
    vs dpsql.datasets := dpsql_internal._dataset_by_id((plan->>'validation_id')::bigint);
    cands jsonb := plan->'candidates';
    k int := jsonb_array_length(cands);
    larger boolean := (plan->>'larger_better')::boolean;
    s bigint := coalesce(noise_seed, dpsql_internal._random_seed());
    note text;
    v_entry bigint;
    d_entry bigint;
    run int := 0;
    pick int;
    c jsonb;
    mid bigint;
    score float8;
    best bigint;
    best_score float8;
    best_index int;
    needs_delta boolean;
BEGIN
    PERFORM dpsql_internal._preview_note('dataset', to_jsonb(ds.name));
    note := format('tune: best of a geometric number of runs (mean %s) over %s candidates by %s; per run epsilon %s '
                   '(delta %s) on %s, score epsilon %s on %s', k, k, plan->>'metric',
                   round((plan->>'run_epsilon')::numeric, 6), plan->>'run_delta', ds.name,
                   round((plan->>'score_epsilon')::numeric, 6), vs.name);
    -- both charges before any row is read: both budgets checked first, then the validation
    -- charged (a budget refusal then leaves both uncharged but for a race, which the charge
    -- itself settles)
    PERFORM dpsql_internal._check_budget_left(vs, (plan->'charges'->0->>'epsilon')::float8, 0);
    PERFORM dpsql_internal._check_budget_left(ds, (plan->'charges'->1->>'epsilon')::float8,
                                              (plan->'charges'->1->>'delta')::float8);
    -- (the selection's own numbers: at unit level already, 64_privacy_units.sql)
    v_entry := dpsql_internal._charge(vs.dataset_id, (plan->'charges'->0->>'epsilon')::float8, 0, 'tune',
                                      note => note || '; ' || (plan->'charges'->0->>'bound'),
                                      unit_level => true);
    d_entry := dpsql_internal._charge(ds.dataset_id, (plan->'charges'->1->>'epsilon')::float8,
                                      (plan->'charges'->1->>'delta')::float8, 'tune',
                                      note => note || '; ' || (plan->'charges'->1->>'bound'),
                                      unit_level => true);
    INSERT INTO dpsql_internal.tune_prepaid (backend, xact, dataset_id, entry_id, epsilon, delta)
    VALUES (pg_backend_pid(), pg_current_xact_id(), ds.dataset_id, d_entry,
            (plan->>'run_epsilon')::float8, (plan->>'run_delta')::float8);
    LOOP
        run := run + 1;
        pick := dpsql_internal._uniform_index(s, 2 * run, k)::int;
        c := cands->(pick - 1)->'candidate';
        IF noise_seed IS NOT NULL AND NOT c ? 'seed' THEN  -- a seeded selection replays exactly
            c := c || jsonb_build_object('seed', noise_seed # (1000 * run + 2));
        END IF;
        needs_delta := (cands->(pick - 1)->>'delta')::float8 > 0;
        UPDATE dpsql_internal.tune_prepaid t SET used_epsilon = 0, used_delta = 0
         WHERE t.backend = pg_backend_pid() AND t.xact = pg_current_xact_id() AND t.dataset_id = ds.dataset_id;
        EXECUTE dpsql_internal._tune_call('dpsql.train', ds.name, c, (plan->>'run_epsilon')::float8,
                                          CASE WHEN needs_delta THEN (plan->>'run_delta')::float8 ELSE 0 END,
                                          CASE WHEN noise_seed IS NOT NULL THEN noise_seed # (1000 * run) END,
                                          (cands->(pick - 1)->>'index')::int) INTO mid;
        -- a run that released nothing (a fit that could not certify its minimiser, as train
        -- returns NULL then) is a run without a model or a score: the selection goes on
        score := CASE WHEN mid IS NOT NULL THEN
                     dpsql_internal._tune_score(mid, vs, (plan->>'score_epsilon')::float8, plan->>'metric',
                                                CASE WHEN noise_seed IS NOT NULL THEN noise_seed # (1000 * run + 1) END)
                 END;
        IF mid IS NULL THEN
            NULL;
        ELSIF best IS NULL OR (score IS NOT NULL AND (best_score IS NULL
                                                      OR (larger AND score > best_score)
                                                      OR (NOT larger AND score < best_score))) THEN
            IF best IS NOT NULL THEN
                DELETE FROM dpsql.model_store m WHERE m.model_id = best;  -- never released
            END IF;
            best := mid;
            best_score := score;
            best_index := (cands->(pick - 1)->>'index')::int;
        ELSE
            DELETE FROM dpsql.model_store m WHERE m.model_id = mid;
        END IF;
        -- stop with probability 1/K (U uniform in (0, 1])
        EXIT WHEN dpsql_internal._uniform_index(s, 2 * run + 1, 9007199254740992) <= 9007199254740992::float8 / k;
    END LOOP;
    DELETE FROM dpsql_internal.tune_prepaid t
     WHERE t.backend = pg_backend_pid() AND t.xact = pg_current_xact_id() AND t.dataset_id = ds.dataset_id;
    IF best IS NULL THEN
        RAISE WARNING 'dpsql: tune released nothing: no run released a model; the budget of this call is spent'
            USING HINT = 'Other candidates, or options that let their fits certify (docs/tune.md).';
        RETURN NULL;
    END IF;
    UPDATE dpsql.model_store m
       SET params = m.params || jsonb_build_object('tune', jsonb_build_object(
               'validation', vs.name, 'metric', plan->>'metric', 'score', best_score,
               'score_noise', 'private evaluation at epsilon ' || (plan->>'score_epsilon'),
               'candidate', best_index, 'candidates', (SELECT jsonb_agg(x->'candidate') FROM jsonb_array_elements(cands) x),
               'runs', run, 'epsilon', plan->'charges'->1->'epsilon', 'delta', plan->'charges'->1->'delta',
               'validation_epsilon', plan->'charges'->0->'epsilon'))
     WHERE m.model_id = best;
    PERFORM dpsql_internal._set_ledger_model(d_entry, best);
    PERFORM dpsql_internal._set_ledger_model(v_entry, best);
    RETURN best;
END $$;

CREATE OR REPLACE FUNCTION dpsql.tune(dataset text, validation text, epsilon float8, delta float8 DEFAULT NULL,
                                      candidates jsonb DEFAULT NULL, metric text DEFAULT NULL,
                                      noise_seed bigint DEFAULT NULL)
RETURNS bigint LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT dpsql_internal._tune(dataset, validation, epsilon, delta, candidates, metric, noise_seed, false)
$$;
COMMENT ON FUNCTION dpsql.tune(text, text, float8, float8, jsonb, text, bigint) IS
    'Private model selection: trains candidates on dataset, scores them privately on validation, '
    'releases only the best model; at most epsilon (and delta) on each dataset (noise_seed: tests only)';

-- dpsql.train(..., privacy => 'auto', validation => '<name>'): auto's candidates (with the
-- call's model on a classification dataset) through dpsql.tune at the call's epsilon, delta
-- and noise seed; auto's other refusals stand (it chooses every other setting itself).
CREATE OR REPLACE FUNCTION dpsql_internal._train_validated(source text, model text, validation text, params jsonb)
RETURNS bigint LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ds dpsql.datasets := dpsql_internal._dataset_for_source(source);
    cands jsonb;
BEGIN
    IF params->>'privacy' IS DISTINCT FROM 'auto' THEN
        PERFORM dpsql_internal._fail(format('validation => chooses among auto''s candidates privately: privacy '
                                            '=> ''auto'' only, got %s', coalesce(quote_literal(params->>'privacy'), 'NULL')),
                                     hint => 'To choose among mechanisms of your own: dpsql.tune(dataset, validation, '
                                             'epsilon, delta, candidates => ...).');
    END IF;
    PERFORM dpsql_internal._auto_refuse_overrides(params);
    IF (params->'features' <> 'null' AND params->'features' <> to_jsonb(ds.features))
       OR (params->'label' <> 'null' AND params->>'label' IS DISTINCT FROM ds.label) THEN
        PERFORM dpsql_internal._fail(format('features and label are dataset %s''s registration''s', quote_literal(ds.name)),
                                     hint => 'Leave them NULL.');
    END IF;
    cands := dpsql_internal._tune_default_candidates(ds, coalesce((params->>'delta')::float8, dpsql_internal._auto_delta(ds)));
    IF ds.labels IS NOT NULL AND coalesce(model, 'logistic') <> 'logistic' THEN
        cands := (SELECT jsonb_agg(c || jsonb_build_object('model', model)) FROM jsonb_array_elements(cands) c);
    END IF;
    RETURN dpsql_internal._tune(source, validation, (params->>'epsilon')::float8, (params->>'delta')::float8,
                                cands, NULL, (params->>'noise_seed')::bigint, true);
END $$;

-- What dpsql.tune would do and charge, without charging or reading rows.
CREATE OR REPLACE FUNCTION dpsql.preview_tune(dataset text, validation text, epsilon float8, delta float8 DEFAULT NULL,
                                              candidates jsonb DEFAULT NULL, metric text DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    plan jsonb;
    message text;
    hint text;
    state text;
BEGIN
    BEGIN
        plan := dpsql_internal._tune_plan(dataset, validation, epsilon, delta, candidates, metric, NULL);
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS message = MESSAGE_TEXT, hint = PG_EXCEPTION_HINT, state = RETURNED_SQLSTATE;
        RETURN jsonb_build_object('refused', jsonb_strip_nulls(jsonb_build_object(
                   'message', message, 'hint', nullif(hint, ''), 'sqlstate', state)));
    END;
    RETURN plan - 'dataset_id' - 'validation_id' || jsonb_build_object('budgets', (
        SELECT jsonb_agg(jsonb_build_object(
                   'dataset', b.name, 'epsilon_spent', s.epsilon_spent, 'delta_spent', s.delta_spent,
                   'epsilon_budget', b.epsilon_budget, 'delta_budget', b.delta_budget,
                   'exceeded', CASE WHEN b.composition = 'pld' THEN NULL
                                    ELSE s.epsilon_spent + (ch->>'epsilon')::float8 > b.epsilon_budget * (1 + 1e-12)
                                         OR s.delta_spent + (ch->>'delta')::float8 > b.delta_budget * (1 + 1e-12) END)
                   ORDER BY o)
          FROM jsonb_array_elements(plan->'charges') WITH ORDINALITY AS x(ch, o)
          JOIN dpsql.datasets b ON b.name = ch->>'dataset' AND b.dropped_at IS NULL
          JOIN dpsql_internal.spent s ON s.dataset_id = b.dataset_id));
END $$;
