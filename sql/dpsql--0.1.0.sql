-- dpsql 0.1.0: in-database SGD (Bismarck-style epoch aggregate), training runs, models.
\echo Use "CREATE EXTENSION dpsql" to load this file. \quit

-- Training tables of runs in progress live here, out of analysts' reach.
CREATE SCHEMA dpsql_work;

------------------------------------------------------------------------------------------
-- C functions (sql/src, cython_ext/core)
------------------------------------------------------------------------------------------

CREATE FUNCTION dpsql._sgd_transition(state float8[], x float8[], y float8, init float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_transition'
LANGUAGE C CALLED ON NULL INPUT PARALLEL SAFE;

CREATE FUNCTION dpsql._sgd_final(state float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_final'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

CREATE FUNCTION dpsql._sgd_combine(a float8[], b float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_combine_states'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- One call = one SGD epoch over the scanned rows, in scan order. COMBINEFUNC averages the
-- models of parallel partial scans weighted by their row counts (opt-in model averaging).
CREATE AGGREGATE dpsql.sgd_epoch(x float8[], y float8, init float8[]) (
    SFUNC = dpsql._sgd_transition,
    STYPE = float8[],
    FINALFUNC = dpsql._sgd_final,
    COMBINEFUNC = dpsql._sgd_combine,
    PARALLEL = SAFE
);

CREATE FUNCTION dpsql._sgd_init(model text, dim int, n_classes int, lambda float8,
                                schedule text, eta float8, step_offset float8, radius float8,
                                huber_h float8, batch_size bigint, flags int)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_init_state'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

CREATE FUNCTION dpsql._sgd_info(state float8[], OUT step bigint, OUT rows bigint,
                                OUT objective float8, OUT dropped bigint, OUT clipped bigint,
                                OUT shards int)
AS 'MODULE_PATHNAME', 'dpsql_sgd_state_info'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE FUNCTION dpsql._sgd_weights(state float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_state_weights'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE FUNCTION dpsql._predict(loss int, flags int, coef float8[], x float8[])
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_predict_coef'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE FUNCTION dpsql._loss_code(model text)
RETURNS int AS 'MODULE_PATHNAME', 'dpsql_loss_code'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE FUNCTION dpsql.loss_constants(model text, lambda float8 DEFAULT 0,
                                     radius float8 DEFAULT 0, huber_h float8 DEFAULT 0.1,
                                     OUT lipschitz float8, OUT lipschitz_data float8,
                                     OUT smoothness float8, OUT strong_convexity float8)
AS 'MODULE_PATHNAME', 'dpsql_loss_constants_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION dpsql.loss_constants(text, float8, float8, float8) IS
    'Lipschitz, smoothness and strong-convexity constants of one example''s loss for ||x|| <= 1';

CREATE FUNCTION dpsql._shuffle_key(seed bigint, pos bigint)
RETURNS bigint AS 'MODULE_PATHNAME', 'dpsql_shuffle_key_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE FUNCTION dpsql._random_seed()
RETURNS bigint AS 'MODULE_PATHNAME', 'dpsql_random_seed'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

------------------------------------------------------------------------------------------
-- Tables
------------------------------------------------------------------------------------------

CREATE TABLE dpsql.models (
    model_id        bigserial PRIMARY KEY,
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      name NOT NULL DEFAULT current_user,
    source          text NOT NULL,
    features        text[] NOT NULL,
    label           text NOT NULL,
    model           text NOT NULL,          -- logistic | linear | huber | multinomial
    classes         float8[],               -- binary: {negative, positive}; multinomial: classes
    n_features      int NOT NULL,
    fit_intercept   boolean NOT NULL,
    coef            float8[] NOT NULL,      -- 1-D, or classes x features for multinomial
    intercept       float8[],               -- one per output when fit_intercept
    weights         float8[] NOT NULL,      -- coef with the intercept column, as trained
    flags           int NOT NULL,           -- row transform flags of the C core
    epochs          int NOT NULL,           -- requested
    epochs_run      int NOT NULL,           -- fewer when the tolerance stopped training
    batch_size      bigint NOT NULL,
    lambda          float8 NOT NULL,
    schedule        text NOT NULL,
    step_size       float8,
    step_offset     float8 NOT NULL,
    radius          float8,
    huber_h         float8,
    row_norm        text NOT NULL,
    shuffle         boolean NOT NULL,
    seed            bigint,
    seed_policy     text,                   -- user | random (pg_strong_random) | none
    rows            bigint NOT NULL,
    dropped_rows    bigint NOT NULL,        -- rows of partial last batches (drop_last), last epoch
    clipped_rows    bigint NOT NULL,        -- rows scaled down by the row transform, last epoch
    train_loss      float8,                 -- objective of the last epoch
    loss_history    float8[] NOT NULL,
    prepare_seconds float8 NOT NULL,
    train_seconds   float8 NOT NULL,
    privacy         text NOT NULL DEFAULT 'none',
    epsilon         float8,
    delta           float8,
    params          jsonb NOT NULL          -- every argument of the run, for reproduction
);
COMMENT ON TABLE dpsql.models IS 'Trained models with their hyperparameters and provenance';

-- Runs in progress: their noiseless state never leaves this table.
CREATE TABLE dpsql.runs (
    run_id          bigserial PRIMARY KEY,
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      name NOT NULL DEFAULT current_user,
    spec            jsonb NOT NULL,
    train_table     text NOT NULL,
    state           float8[] NOT NULL,
    rows            bigint NOT NULL,
    epochs_done     int NOT NULL DEFAULT 0,
    losses          float8[] NOT NULL DEFAULT '{}',
    done            boolean NOT NULL DEFAULT false,
    prepare_seconds float8 NOT NULL,
    train_seconds   float8 NOT NULL DEFAULT 0
);

------------------------------------------------------------------------------------------
-- Preparing sources
------------------------------------------------------------------------------------------

CREATE FUNCTION dpsql._fail(message text, code text DEFAULT '22023', hint text DEFAULT NULL)
RETURNS float8 LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING MESSAGE = 'dpsql: ' || message, ERRCODE = code,
                          HINT = coalesce(hint, '');
END $$;

-- FROM-clause text of a source: a table or view name (resolved, safely quoted) or a query.
CREATE FUNCTION dpsql._source_sql(source text)
RETURNS text LANGUAGE plpgsql STABLE
AS $$
DECLARE
    rel regclass;
    q text := regexp_replace(coalesce(source, ''), ';\s*$', '');
BEGIN
    IF btrim(q) = '' THEN
        PERFORM dpsql._fail('source is empty');
    END IF;
    IF q ~* '^\s*(\(|select\s|with\s|values\s|table\s)' THEN
        RETURN '(' || q || ') AS src';
    END IF;
    BEGIN
        rel := to_regclass(q);
    EXCEPTION WHEN OTHERS THEN
        rel := NULL;
    END;
    IF rel IS NULL THEN
        PERFORM dpsql._fail(format('relation %s does not exist', quote_literal(q)), '42P01',
                            'Give a table or view name (schema-qualified if needed) or a SELECT query.');
    END IF;
    RETURN rel::text || ' AS src';
END $$;

-- SQL expression of the feature vector, and its dimension (probed on the first row).
CREATE FUNCTION dpsql._feature_sql(src text, features text[], OUT expr text, OUT dim int)
LANGUAGE plpgsql AS $$
DECLARE
    types text[];
    bad int;
BEGIN
    IF features IS NULL OR cardinality(features) = 0 OR array_ndims(features) <> 1
       OR array_position(features, NULL) IS NOT NULL THEN
        PERFORM dpsql._fail('features must be a non-empty list of column names');
    END IF;
    -- pg_typeof of a scalar subquery gives the column's type even when no row is read; an
    -- unknown column raises undefined_column here.
    SELECT 'SELECT ARRAY[' || string_agg(format('pg_typeof((SELECT %I FROM %s LIMIT 1))::text', f, src),
                                        ', ' ORDER BY i) || ']'
      INTO expr FROM unnest(features) WITH ORDINALITY AS t(f, i);
    EXECUTE expr INTO types;
    IF cardinality(features) = 1 AND types[1] LIKE '%[]' THEN
        IF types[1] NOT IN ('double precision[]', 'real[]', 'integer[]', 'bigint[]', 'smallint[]',
                            'numeric[]') THEN
            PERFORM dpsql._fail(format('feature column %I has type %s, not a numeric array',
                                       features[1], types[1]), '42804');
        END IF;
        expr := format('%I::float8[]', features[1]);
        EXECUTE format('SELECT array_length(%s, 1) FROM %s LIMIT 1', expr, src) INTO dim;
        IF dim IS NULL THEN
            PERFORM dpsql._fail(format('the feature array column %I is NULL or empty in the first row',
                                       features[1]));
        END IF;
        RETURN;
    END IF;
    SELECT min(i) INTO bad FROM unnest(types) WITH ORDINALITY AS t(ty, i)
     WHERE ty NOT IN ('double precision', 'real', 'integer', 'bigint', 'smallint', 'numeric');
    IF bad IS NOT NULL THEN
        PERFORM dpsql._fail(format('feature column %I has type %s: give several numeric columns or '
                                   'one float8[] column', features[bad], types[bad]), '42804');
    END IF;
    SELECT 'ARRAY[' || string_agg(format('%I::float8', f), ', ' ORDER BY i) || ']'
      INTO expr FROM unnest(features) WITH ORDINALITY AS t(f, i);
    dim := cardinality(features);
END $$;

-- SQL expression of the training label: +-1 for binary models, a class index for multinomial.
CREATE FUNCTION dpsql._label_sql(model text, label text, labels float8[])
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    bad text;
BEGIN
    IF label IS NULL THEN
        PERFORM dpsql._fail('label must name a column');
    END IF;
    bad := format('dpsql._fail(format(''label %%s is not in the declared label set %%s'', '
                  'coalesce(%I::text, ''NULL''), %L))', label, coalesce(labels::text, '(any number)'));
    IF model = 'linear' THEN
        RETURN format('coalesce(%I::float8, %s)', label, bad);
    ELSIF model = 'multinomial' THEN
        RETURN format('coalesce((array_position(%L::float8[], %I::float8) - 1)::float8, %s)',
                      labels::text, label, bad);
    END IF;
    RETURN format('CASE %I::float8 WHEN %s THEN -1::float8 WHEN %s THEN 1::float8 ELSE %s END',
                  label, labels[1], labels[2], bad);
END $$;

-- Canonical model name and checked public label set.
CREATE FUNCTION dpsql._check_labels(model text, labels float8[], OUT canonical text, OUT checked float8[])
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    canonical := (ARRAY['logistic', 'linear', 'huber', 'multinomial'])[dpsql._loss_code(model)];
    IF canonical = 'linear' THEN
        IF labels IS NOT NULL THEN
            PERFORM dpsql._fail('labels apply to classification models only');
        END IF;
        RETURN;
    END IF;
    IF canonical IN ('logistic', 'huber') THEN
        checked := coalesce(labels, '{-1,1}');
        IF cardinality(checked) <> 2 THEN
            PERFORM dpsql._fail(format('binary models need labels => {negative, positive}, got %s', checked));
        END IF;
    ELSIF labels IS NULL THEN
        PERFORM dpsql._fail('multinomial models need labels => the public list of classes');
    ELSE
        checked := labels;
        IF cardinality(checked) < 2 OR cardinality(checked) > 1024 THEN
            PERFORM dpsql._fail('multinomial models need 2 to 1024 classes');
        END IF;
    END IF;
    IF array_ndims(checked) <> 1
       OR EXISTS (SELECT 1 FROM unnest(checked) v WHERE v IS NULL OR v IN ('NaN', 'Infinity', '-Infinity'))
       OR (SELECT count(DISTINCT v) FROM unnest(checked) v) <> cardinality(checked) THEN
        PERFORM dpsql._fail(format('labels must be distinct finite numbers, got %s', checked));
    END IF;
END $$;

------------------------------------------------------------------------------------------
-- Training runs: prepare -> epochs -> finish. dpsql.train and the Python controller both
-- drive these, so the logic lives here once.
------------------------------------------------------------------------------------------

-- Copy the source into a shuffled training table (rid, x, y) and build the initial state.
-- Parallel scans and synchronized scans are off: row positions must follow the physical order
-- so that the permutation is a function of the seed alone.
CREATE FUNCTION dpsql._prepare(
    source text, features text[], label text, model text, epochs int, batch_size bigint,
    lambda float8, step_size float8, schedule text, step_offset float8, radius float8,
    shuffle boolean, seed bigint, labels float8[], intercept boolean, row_norm text,
    huber_h float8, tolerance float8, parallel_workers int DEFAULT 0)
RETURNS bigint LANGUAGE plpgsql
SET max_parallel_workers_per_gather = 0
SET synchronize_seqscans = off
AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
    src text;
    lab record;
    feat record;
    yexpr text;
    run bigint;
    tbl text;
    m bigint;
    m_any boolean;
    r float8;
    eta float8;
    flags int;
    seed_policy text := 'none';
    init float8[];
BEGIN
    lab := dpsql._check_labels(model, labels);
    IF epochs IS NULL OR epochs < 1 THEN
        PERFORM dpsql._fail(format('epochs must be >= 1, got %s', coalesce(epochs::text, 'NULL')));
    END IF;
    IF batch_size IS NULL OR batch_size < 1 THEN
        PERFORM dpsql._fail(format('batch_size must be >= 1, got %s', coalesce(batch_size::text, 'NULL')));
    END IF;
    IF lambda IS NULL OR NOT (lambda >= 0 AND lambda < 'Infinity') THEN
        PERFORM dpsql._fail(format('lambda must be a finite number >= 0, got %s', coalesce(lambda::text, 'NULL')));
    END IF;
    IF step_size IS NOT NULL AND NOT (step_size > 0 AND step_size < 'Infinity') THEN
        PERFORM dpsql._fail(format('step_size must be a finite number > 0, got %s', step_size));
    END IF;
    IF schedule IS NULL OR schedule NOT IN ('constant', 'decreasing', 'inverse', 'sqrt') THEN
        PERFORM dpsql._fail(format('unknown schedule %s', coalesce(quote_literal(schedule), 'NULL')),
                            hint => 'Use constant, decreasing (min(1/beta, 1/(lambda t))), inverse or sqrt.');
    END IF;
    IF schedule = 'decreasing' AND lambda = 0 THEN
        PERFORM dpsql._fail('the decreasing schedule min(1/beta, 1/(lambda t)) needs lambda > 0');
    END IF;
    IF step_offset IS NULL OR NOT (step_offset >= 0 AND step_offset < 'Infinity') THEN
        PERFORM dpsql._fail('step_offset must be a finite number >= 0');
    END IF;
    IF radius IS NOT NULL AND NOT (radius >= 0 AND radius < 'Infinity') THEN
        PERFORM dpsql._fail(format('radius must be a finite number >= 0, got %s', radius));
    END IF;
    IF row_norm IS NULL OR row_norm NOT IN ('none', 'clip', 'unit') THEN
        PERFORM dpsql._fail(format('row_norm must be none, clip or unit, got %s', coalesce(row_norm, 'NULL')));
    END IF;
    IF huber_h IS NULL OR NOT (huber_h > 0 AND huber_h < 1) THEN
        PERFORM dpsql._fail('huber_h must be in (0, 1)');
    END IF;
    IF tolerance IS NOT NULL AND NOT (tolerance > 0) THEN
        PERFORM dpsql._fail('tolerance must be > 0');
    END IF;
    IF parallel_workers IS NULL OR parallel_workers < 0 OR parallel_workers > 64 THEN
        PERFORM dpsql._fail('parallel_workers must be between 0 and 64');
    END IF;
    IF shuffle IS NULL THEN
        PERFORM dpsql._fail('shuffle must be true or false');
    END IF;

    src := dpsql._source_sql(source);
    BEGIN
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s)', src) INTO STRICT m_any;
        IF NOT m_any THEN
            PERFORM dpsql._fail(format('source %s has no rows', source), '22000');
        END IF;
        feat := dpsql._feature_sql(src, features);
        yexpr := dpsql._label_sql(lab.canonical, label, lab.checked);
        run := nextval(pg_get_serial_sequence('dpsql.runs', 'run_id'));
        tbl := format('dpsql_work.%I', 'train_' || run);
        EXECUTE format('CREATE UNLOGGED TABLE %s (rid bigint NOT NULL, x float8[], y float8) '
                       'WITH (autovacuum_enabled = false%s)', tbl,
                       CASE WHEN parallel_workers > 0 THEN ', parallel_workers = ' || parallel_workers ELSE '' END);
        -- Keep feature arrays inline and uncompressed: a TOASTed row costs a detoast per epoch.
        EXECUTE format('ALTER TABLE %s ALTER COLUMN x SET STORAGE %s', tbl,
                       CASE WHEN feat.dim <= 1000 THEN 'PLAIN' ELSE 'EXTERNAL' END);
        IF shuffle THEN
            seed_policy := CASE WHEN seed IS NULL THEN 'random' ELSE 'user' END;
            seed := coalesce(seed, dpsql._random_seed());
            EXECUTE format(
                'INSERT INTO %s (rid, x, y) '
                'SELECT row_number() OVER (ORDER BY k, pos), x, y FROM ('
                '  SELECT dpsql._shuffle_key($1, pos) AS k, pos, x, y FROM ('
                '    SELECT row_number() OVER () AS pos, %s AS x, %s AS y FROM %s) a) b '
                'ORDER BY k, pos', tbl, feat.expr, yexpr, src) USING seed;
        ELSE
            seed := NULL;
            EXECUTE format('INSERT INTO %s (rid, x, y) SELECT row_number() OVER (), %s, %s FROM %s',
                           tbl, feat.expr, yexpr, src);
        END IF;
        GET DIAGNOSTICS m = ROW_COUNT;
    EXCEPTION WHEN undefined_column THEN
        RAISE EXCEPTION 'dpsql: %', SQLERRM USING ERRCODE = 'undefined_column',
            DETAIL = format('source %s, features %s, label %s', source, features, label);
    END;
    IF m = 0 THEN
        PERFORM dpsql._fail(format('source %s has no rows', source), '22000');
    END IF;

    r := CASE WHEN radius IS NOT NULL THEN radius
              WHEN schedule = 'decreasing' THEN 1.0 / lambda  -- L = 1 + lambda R needs the ball
              ELSE 0 END;
    eta := coalesce(step_size,
                    CASE schedule
                        WHEN 'constant' THEN 1.0 / sqrt(m)     -- the bolt-on paper's choice
                        WHEN 'decreasing' THEN 0
                        ELSE 2.0 / (dpsql.loss_constants(lab.canonical, lambda, r, huber_h)).smoothness
                    END);
    flags := CASE row_norm WHEN 'clip' THEN 1 WHEN 'unit' THEN 2 ELSE 0 END
           | CASE WHEN intercept THEN 4 ELSE 0 END;
    init := dpsql._sgd_init(lab.canonical, feat.dim, coalesce(cardinality(lab.checked), 1), lambda,
                            schedule, eta, step_offset, r, huber_h, batch_size, flags);

    INSERT INTO dpsql.runs (run_id, spec, train_table, state, rows, prepare_seconds)
    VALUES (run,
            jsonb_build_object(
                'source', source, 'features', features, 'label', label, 'model', lab.canonical,
                'classes', lab.checked, 'dim', feat.dim, 'epochs', epochs, 'batch_size', batch_size,
                'lambda', lambda, 'schedule', schedule,
                'step_size', CASE WHEN schedule = 'decreasing' THEN NULL ELSE eta END,
                'step_offset', step_offset, 'radius', CASE WHEN r > 0 THEN r END,
                'huber_h', CASE WHEN lab.canonical = 'huber' THEN huber_h END,
                'row_norm', row_norm, 'intercept', intercept, 'shuffle', shuffle, 'seed', seed,
                'seed_policy', seed_policy, 'tolerance', tolerance, 'flags', flags,
                'parallel_workers', parallel_workers, 'remainder', 'drop_last'),
            tbl, init, m, extract(epoch FROM clock_timestamp() - t0));
    RETURN run;
END $$;

-- A run's row, locked for the rest of the transaction.
CREATE FUNCTION dpsql._locked_run(run_id bigint)
RETURNS dpsql.runs LANGUAGE plpgsql AS $$
DECLARE
    r dpsql.runs;
BEGIN
    SELECT * INTO r FROM dpsql.runs WHERE runs.run_id = _locked_run.run_id FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM dpsql._fail(format('no training run %s', coalesce(run_id::text, 'NULL')), '42704');
    END IF;
    RETURN r;
END $$;

-- One epoch of a run: one aggregate scan of its training table. Returns the epoch number,
-- the epoch's training objective, and whether the run is done (epochs reached or converged).
CREATE FUNCTION dpsql._run_epoch(run_id bigint, OUT epoch int, OUT objective float8, OUT done boolean)
LANGUAGE plpgsql
SET max_parallel_workers_per_gather = 0
SET synchronize_seqscans = off
SET parallel_setup_cost = 1000
SET parallel_tuple_cost = 0.1
SET min_parallel_table_scan_size = '8MB'
AS $$
DECLARE
    r dpsql.runs;
    t0 timestamptz := clock_timestamp();
    st float8[];
    info record;
    workers int;
    prev float8;
    tol float8;
BEGIN
    r := dpsql._locked_run(run_id);
    IF r.done THEN
        PERFORM dpsql._fail(format('training run %s is already done', run_id));
    END IF;
    workers := coalesce((r.spec->>'parallel_workers')::int, 0);
    IF workers > 0 THEN
        -- Opt-in model averaging over parallel partial scans (COMBINEFUNC).
        PERFORM set_config('max_parallel_workers_per_gather', workers::text, true);
        PERFORM set_config('parallel_setup_cost', '0', true);
        PERFORM set_config('parallel_tuple_cost', '0', true);
        PERFORM set_config('min_parallel_table_scan_size', '0', true);
    END IF;
    EXECUTE format('SELECT dpsql.sgd_epoch(x, y, $1) FROM %s', r.train_table) INTO st USING r.state;
    info := dpsql._sgd_info(st);
    epoch := r.epochs_done + 1;
    objective := info.objective;
    prev := r.losses[cardinality(r.losses)];
    tol := (r.spec->>'tolerance')::float8;
    done := epoch >= (r.spec->>'epochs')::int
            OR (tol IS NOT NULL AND prev IS NOT NULL
                AND abs(prev - objective) <= tol * greatest(abs(prev), 1e-300));
    UPDATE dpsql.runs
       SET state = st, epochs_done = epoch, losses = losses || objective, done = _run_epoch.done,
           train_seconds = runs.train_seconds + extract(epoch FROM clock_timestamp() - t0)
     WHERE runs.run_id = _run_epoch.run_id;
END $$;

-- Store the run's model with its provenance, drop its training table, forget its state.
CREATE FUNCTION dpsql._finish(run_id bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    r dpsql.runs;
    s jsonb;
    info record;
    w float8[];
    d int;
    mid bigint;
    fit_icpt boolean;
BEGIN
    r := dpsql._locked_run(run_id);
    IF r.epochs_done = 0 THEN
        PERFORM dpsql._fail(format('training run %s has not run any epoch', run_id));
    END IF;
    s := r.spec;
    info := dpsql._sgd_info(r.state);
    w := dpsql._sgd_weights(r.state);
    d := (s->>'dim')::int;
    fit_icpt := (s->>'intercept')::boolean;
    INSERT INTO dpsql.models (
        source, features, label, model, classes, n_features, fit_intercept, coef, intercept,
        weights, flags, epochs, epochs_run, batch_size, lambda, schedule, step_size, step_offset,
        radius, huber_h, row_norm, shuffle, seed, seed_policy, rows, dropped_rows, clipped_rows,
        train_loss, loss_history, prepare_seconds, train_seconds, privacy, params)
    VALUES (
        s->>'source', ARRAY(SELECT jsonb_array_elements_text(s->'features')), s->>'label',
        s->>'model',
        CASE WHEN s->'classes' <> 'null' THEN ARRAY(SELECT jsonb_array_elements_text(s->'classes'))::float8[] END,
        d, fit_icpt,
        CASE WHEN array_ndims(w) = 1 THEN w[1:d] ELSE w[:][1:d] END,
        CASE WHEN NOT fit_icpt THEN NULL
             WHEN array_ndims(w) = 1 THEN ARRAY[w[d + 1]]
             ELSE ARRAY(SELECT w[i][d + 1] FROM generate_series(1, array_length(w, 1)) i) END,
        w, (s->>'flags')::int, (s->>'epochs')::int, r.epochs_done, (s->>'batch_size')::bigint,
        (s->>'lambda')::float8, s->>'schedule', (s->>'step_size')::float8,
        (s->>'step_offset')::float8, (s->>'radius')::float8, (s->>'huber_h')::float8,
        s->>'row_norm', (s->>'shuffle')::boolean, (s->>'seed')::bigint, s->>'seed_policy',
        r.rows, info.dropped, info.clipped, info.objective, r.losses, r.prepare_seconds,
        r.train_seconds, 'none', s)
    RETURNING model_id INTO mid;
    EXECUTE format('DROP TABLE %s', r.train_table);
    DELETE FROM dpsql.runs WHERE runs.run_id = _finish.run_id;
    RETURN mid;
END $$;

-- Abandon a run: drop its training table and state.
CREATE FUNCTION dpsql._abort(run_id bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    tbl text;
BEGIN
    DELETE FROM dpsql.runs WHERE runs.run_id = _abort.run_id RETURNING train_table INTO tbl;
    IF tbl IS NOT NULL THEN
        EXECUTE format('DROP TABLE IF EXISTS %s', tbl);
    END IF;
END $$;

------------------------------------------------------------------------------------------
-- Analyst API
------------------------------------------------------------------------------------------

CREATE FUNCTION dpsql.train(
    source text, features text[], label text, model text DEFAULT 'logistic',
    epochs int DEFAULT 10, batch_size bigint DEFAULT 1, lambda float8 DEFAULT 0,
    step_size float8 DEFAULT NULL, schedule text DEFAULT 'constant',
    radius float8 DEFAULT NULL, shuffle boolean DEFAULT true, seed bigint DEFAULT NULL,
    privacy text DEFAULT 'none', labels float8[] DEFAULT NULL, intercept boolean DEFAULT false,
    row_norm text DEFAULT 'none', huber_h float8 DEFAULT 0.1, step_offset float8 DEFAULT 0,
    tolerance float8 DEFAULT NULL, parallel_workers int DEFAULT 0)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    run bigint;
    e record;
BEGIN
    IF privacy IS DISTINCT FROM 'none' THEN
        PERFORM dpsql._fail(format('privacy mechanism %s is not available in this version',
                                   coalesce(quote_literal(privacy), 'NULL')),
                            hint => 'This release trains non-private models only: privacy => ''none''.');
    END IF;
    run := dpsql._prepare(source, features, label, model, epochs, batch_size, lambda, step_size,
                          schedule, step_offset, radius, shuffle, seed, labels, intercept,
                          row_norm, huber_h, tolerance, parallel_workers);
    LOOP
        e := dpsql._run_epoch(run);
        RAISE NOTICE 'dpsql: epoch %/% objective %', e.epoch, epochs, round(e.objective::numeric, 6);
        EXIT WHEN e.done;
    END LOOP;
    RETURN dpsql._finish(run);
END $$;
COMMENT ON FUNCTION dpsql.train(text, text[], text, text, int, bigint, float8, float8, text, float8,
                                boolean, bigint, text, float8[], boolean, text, float8, float8,
                                float8, int) IS
    'Train a model by in-database SGD (one aggregate scan per epoch); returns its model_id';

CREATE FUNCTION dpsql._model(model_id bigint)
RETURNS dpsql.models LANGUAGE plpgsql STABLE AS $$
DECLARE
    m dpsql.models;
BEGIN
    SELECT * INTO m FROM dpsql.models WHERE models.model_id = _model.model_id;
    IF NOT FOUND THEN
        PERFORM dpsql._fail(format('no model %s', coalesce(model_id::text, 'NULL')), '42704');
    END IF;
    RETURN m;
END $$;

-- Probability of the positive class (logistic), score (huber, linear) or class (multinomial).
CREATE FUNCTION dpsql.predict(model_id bigint, x float8[])
RETURNS float8 LANGUAGE plpgsql STABLE AS $$
DECLARE
    m dpsql.models := dpsql._model(model_id);
    p float8 := dpsql._predict(dpsql._loss_code(m.model), m.flags, m.weights, x);
BEGIN
    IF m.model = 'multinomial' THEN
        RETURN m.classes[p::int + 1];
    END IF;
    RETURN p;
END $$;

-- Accuracy (classification) or mean squared error (linear) of a model over a table or query.
CREATE FUNCTION dpsql.evaluate(model_id bigint, source text, features text[] DEFAULT NULL,
                               label text DEFAULT NULL,
                               OUT metric text, OUT value float8, OUT rows bigint)
LANGUAGE plpgsql
SET max_parallel_workers_per_gather = 0
AS $$
DECLARE
    m dpsql.models := dpsql._model(model_id);
    src text := dpsql._source_sql(source);
    feat record;
    yexpr text;
    pexpr text;
BEGIN
    feat := dpsql._feature_sql(src, coalesce(features, m.features));
    IF feat.dim <> m.n_features THEN
        PERFORM dpsql._fail(format('model %s has %s features, the source gives %s',
                                   model_id, m.n_features, feat.dim));
    END IF;
    yexpr := dpsql._label_sql(m.model, coalesce(label, m.label), m.classes);
    pexpr := format('dpsql._predict(%s, %s, %L::float8[], %s)',
                    dpsql._loss_code(m.model), m.flags, m.weights, feat.expr);
    IF m.model = 'linear' THEN
        metric := 'mse';
        EXECUTE format('SELECT avg((p - y) ^ 2), count(*) FROM (SELECT %s AS p, %s AS y FROM %s) e',
                       pexpr, yexpr, src) INTO value, rows;
    ELSE
        metric := 'accuracy';
        EXECUTE format('SELECT avg((%s)::int), count(*) FROM (SELECT %s AS p, %s AS y FROM %s) e',
                       CASE m.model WHEN 'multinomial' THEN 'p = y'
                                    WHEN 'logistic' THEN '(p >= 0.5) = (y > 0)'
                                    ELSE '(p >= 0) = (y > 0)' END,
                       pexpr, yexpr, src) INTO value, rows;
    END IF;
END $$;
