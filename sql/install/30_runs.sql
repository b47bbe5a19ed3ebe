------------------------------------------------------------------------------------------
-- Training runs: prepare -> epochs -> finish. dpsql.train and the Python controller both
-- drive these, so the logic lives here once.
------------------------------------------------------------------------------------------

-- A run's shuffled training table (rid, x, y) from its source and its initial state.
-- Parallel scans and synchronized scans are off: row positions must follow the physical order
-- so that the permutation is a function of the seed alone.
-- A run's settings, checked before anything is read (bad input changes nothing).
CREATE OR REPLACE FUNCTION dpsql_internal._check_run_settings(
    epochs int, batch_size bigint, lambda float8, step_size float8, schedule text,
    step_offset float8, radius float8, row_norm text, huber_h float8, tolerance float8,
    parallel_workers int, shuffle boolean, permutation text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF epochs IS NULL OR epochs < 1 OR epochs > 100000 THEN
        PERFORM dpsql_internal._fail(format('epochs must be >= 1 and <= 100000, got %s', coalesce(epochs::text, 'NULL')),
                                     hint => 'The number of passes over the rows, fixed in advance.');
    END IF;
    IF batch_size IS NULL OR batch_size < 1 THEN
        PERFORM dpsql_internal._fail(format('batch_size must be >= 1, got %s', coalesce(batch_size::text, 'NULL')),
                                     hint => 'Rows per step: 1 to the number of rows.');
    END IF;
    IF lambda IS NULL OR NOT (lambda >= 0 AND lambda < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('lambda must be a finite number >= 0, got %s', coalesce(lambda::text, 'NULL')),
                                     hint => 'The L2 regularisation: 0 (none) or a small positive number such as 0.01.');
    END IF;
    IF step_size IS NOT NULL AND NOT (step_size > 0 AND step_size < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('step_size must be a finite number > 0, got %s', step_size),
                                     hint => 'Leave it NULL for the schedule''s default.');
    END IF;
    IF schedule IS NULL OR schedule NOT IN ('constant', 'decreasing', 'inverse', 'sqrt') THEN
        PERFORM dpsql_internal._fail(format('unknown schedule %s', coalesce(quote_literal(schedule), 'NULL')),
                            hint => 'Use constant, decreasing (min(1/beta, 1/(lambda t))), inverse or sqrt.');
    END IF;
    IF schedule = 'decreasing' AND lambda = 0 THEN
        PERFORM dpsql_internal._fail('the decreasing schedule min(1/beta, 1/(lambda t)) needs lambda > 0',
                                     hint => 'Give lambda > 0, or schedule => ''constant''.');
    END IF;
    IF step_offset IS NULL OR NOT (step_offset >= 0 AND step_offset < 'Infinity') THEN
        PERFORM dpsql_internal._fail('step_offset must be a finite number >= 0',
                                     hint => '0 unless the step schedule should start later.');
    END IF;
    IF radius IS NOT NULL AND NOT (radius >= 0 AND radius < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('radius must be a finite number >= 0, got %s', radius),
                                     hint => 'The ball ||w|| <= radius the weights are projected onto; NULL for none.');
    END IF;
    IF row_norm IS NULL OR row_norm NOT IN ('none', 'clip', 'unit') THEN
        PERFORM dpsql_internal._fail(format('row_norm must be none, clip or unit, got %s', coalesce(row_norm, 'NULL')));
    END IF;
    IF huber_h IS NULL OR NOT (huber_h > 0 AND huber_h < 1) THEN
        PERFORM dpsql_internal._fail('huber_h must be in (0, 1)',
                                     hint => 'The Huber loss''s smoothing width, e.g. 0.1.');
    END IF;
    IF tolerance IS NOT NULL AND NOT (tolerance > 0) THEN
        PERFORM dpsql_internal._fail('tolerance must be > 0',
                                     hint => 'The relative change of the objective that stops training; NULL for none.');
    END IF;
    IF parallel_workers IS NULL OR parallel_workers < 0 OR parallel_workers > 64 THEN
        PERFORM dpsql_internal._fail('parallel_workers must be between 0 and 64',
                                     hint => '0 for a serial scan.');
    END IF;
    IF shuffle IS NULL THEN
        PERFORM dpsql_internal._fail('shuffle must be true or false');
    END IF;
    IF permutation IS NULL OR permutation NOT IN ('once', 'fresh') THEN
        PERFORM dpsql_internal._fail('permutation must be once (shuffle once) or fresh (a new one each epoch)');
    END IF;
    IF permutation = 'fresh' AND (NOT shuffle OR parallel_workers > 0) THEN
        PERFORM dpsql_internal._fail('fresh permutations need shuffle => true and a serial scan',
                                     hint => 'Use permutation => ''once'' with parallel_workers or shuffle => false.');
    END IF;
END $$;

-- The schema of the current user's training tables: dpsql_work, where only the extension
-- owner (and superusers) may create, for private runs; dpsql_owner_work for data owners.
CREATE OR REPLACE FUNCTION dpsql_internal._work_schema()
RETURNS name LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN has_schema_privilege('dpsql_work', 'CREATE') THEN 'dpsql_work'
                ELSE 'dpsql_owner_work' END::name
$$;

-- A run's training table's name: train_<run> in dpsql_work, where only the definer creates;
-- in dpsql_owner_work, where every data owner creates, train_<run>_<random>, so that no owner
-- can create another owner's table before it (issue 41, route 9).
CREATE OR REPLACE FUNCTION dpsql_internal._training_table_name(run bigint)
RETURNS text LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT format('%I.%I', w, 'train_' || run
                              || CASE WHEN w = 'dpsql_owner_work'
                                      THEN '_' || left(replace(gen_random_uuid()::text, '-', ''), 16)
                                      ELSE '' END)
      FROM dpsql_internal._work_schema() w
$$;

-- A run's training table (named by dpsql_internal._training_table_name): the source's rows
-- as (rid, x, y) in the order of a seeded, data-independent permutation (the source's own
-- order without shuffle), feature arrays kept inline. *seed receives the seed used (a random
-- one when NULL). Created here, never found (created: the one a private run's _prepare made
-- empty, under the same name).
CREATE OR REPLACE FUNCTION dpsql_internal._fill_training_table(
    run bigint, src text, x_expr text, y_expr text, dim int, parallel_workers int,
    shuffle boolean, INOUT seed bigint, OUT train_table text, OUT rows bigint,
    OUT seed_policy text, OUT layout jsonb, created boolean DEFAULT false)
LANGUAGE plpgsql AS $$
DECLARE
    tbl text;
BEGIN
    seed_policy := 'none';
    tbl := dpsql_internal._training_table_name(run);
    IF NOT created THEN  -- (created: a private run's, empty since _prepare)
        PERFORM dpsql_internal._load_module();  -- its files go only after the WAL says so
        EXECUTE format('CREATE UNLOGGED TABLE %s (rid bigint NOT NULL, x float8[], y float8) '
                       'WITH (autovacuum_enabled = false%s)', tbl,
                       CASE WHEN parallel_workers > 0 THEN ', parallel_workers = ' || parallel_workers ELSE '' END);
        -- Keep feature arrays inline and uncompressed: a TOASTed row costs a detoast per epoch.
        EXECUTE format('ALTER TABLE %s ALTER COLUMN x SET STORAGE %s', tbl,
                       CASE WHEN dim <= 1000 THEN 'PLAIN' ELSE 'EXTERNAL' END);
    END IF;
    IF shuffle THEN
        seed_policy := CASE WHEN seed IS NULL THEN 'random' ELSE 'user' END;
        seed := coalesce(seed, dpsql_internal._random_seed());
        EXECUTE format(
            'INSERT INTO %s (rid, x, y) '
            'SELECT row_number() OVER (ORDER BY k, pos), x, y FROM ('
            '  SELECT dpsql_internal._shuffle_key($1, pos) AS k, pos, x, y FROM ('
            '    SELECT row_number() OVER () AS pos, %s AS x, %s AS y FROM %s) a) b '
            'ORDER BY k, pos', tbl, x_expr, y_expr, src) USING seed;
    ELSE
        seed := NULL;
        EXECUTE format('INSERT INTO %s (rid, x, y) SELECT row_number() OVER (), %s, %s FROM %s',
                       tbl, x_expr, y_expr, src);
    END IF;
    GET DIAGNOSTICS rows = ROW_COUNT;
    train_table := tbl;
END $$;

-- A run's training table, created and filled from its source (fill: what _prepare resolved,
-- public): through the shards on a hash-distributed table (a privacy unit's slots bounded
-- there), else here. empty: created with no row (a preview's, or a private run's before its
-- charge). The seed used comes back (a random one when fill has none).
CREATE OR REPLACE FUNCTION dpsql_internal._fill_run(run bigint, fill jsonb, empty boolean,
    OUT train_table text, OUT rows bigint, OUT seed bigint, OUT seed_policy text, OUT layout jsonb,
    created boolean DEFAULT false)
LANGUAGE plpgsql AS $$
DECLARE
    units dpsql.datasets;
BEGIN
    IF fill->>'units' IS NOT NULL THEN  -- k slots per unit, bounded on the shards
        SELECT * INTO STRICT units FROM dpsql.datasets d WHERE d.dataset_id = (fill->>'units')::bigint;
        SELECT f.train_table, f.rows, f.seed, f.seed_policy, f.layout
          INTO STRICT train_table, rows, seed, seed_policy, layout
          FROM dpsql_internal._fill_distributed_units(run, units, fill->>'x', fill->>'y',
                                                      (fill->>'dim')::int, (fill->>'seed')::bigint, empty) f;
    ELSIF (fill->>'distributed')::boolean THEN
        SELECT f.train_table, f.rows, f.seed, f.seed_policy, f.layout
          INTO STRICT train_table, rows, seed, seed_policy, layout
          FROM dpsql_internal._fill_distributed_table(run, (fill->>'relation')::oid::regclass, fill->>'x',
                                                      fill->>'y', (fill->>'dim')::int,
                                                      (fill->>'shuffle')::boolean, (fill->>'seed')::bigint,
                                                      empty) f;
    ELSE
        SELECT f.train_table, f.rows, f.seed, f.seed_policy, f.layout
          INTO STRICT train_table, rows, seed, seed_policy, layout
          FROM dpsql_internal._fill_training_table(
                   run, CASE WHEN empty THEN format('(SELECT * FROM %s WHERE false) e', fill->>'src')
                             ELSE fill->>'src' END,
                   fill->>'x', fill->>'y', (fill->>'dim')::int, (fill->>'parallel_workers')::int,
                   (fill->>'shuffle')::boolean, (fill->>'seed')::bigint, created) f;
    END IF;
END $$;

-- A run from a source: every check, its training table and its spec, as its row. A data
-- owner's run (the caller's rights) is stored at once, with its state. A private run
-- (deferred) is only prepared, from public numbers: its row count the release's public one, its
-- table created empty (the layout checks and the Citus pushdown guard run on it), the read it
-- will make kept in the row's fill. Its controller plans from the returned spec and rows,
-- charges, reads (_read_rows) and writes the row once (_start_run).
-- Over 100 lines: one function because the spec it builds needs every checked argument at once
-- (labels, layout, training table, step and seed policy).
CREATE OR REPLACE FUNCTION dpsql_internal._prepare(
    source text, features text[], label text, model text, epochs int, batch_size bigint,
    lambda float8, step_size float8, schedule text, step_offset float8, radius float8,
    shuffle boolean, seed bigint, labels float8[], intercept boolean, row_norm text,
    huber_h float8, tolerance float8, parallel_workers int DEFAULT 0,
    private boolean DEFAULT false, feature_bounds float8[] DEFAULT NULL,
    permutation text DEFAULT 'once', feature_types text[] DEFAULT NULL, dim int DEFAULT NULL,
    shard_parallel boolean DEFAULT false, relation regclass DEFAULT NULL,
    categories jsonb DEFAULT NULL, label_values text[] DEFAULT NULL, deferred boolean DEFAULT false,
    public_rows bigint DEFAULT NULL)
RETURNS dpsql.runs LANGUAGE plpgsql
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
    seed_policy text;
    fill jsonb;
    filled record;
    spec jsonb;
    layout record;
    ltype text;
    units dpsql.datasets;  -- a private run's dataset with a privacy unit, on Citus
    prepared dpsql.runs;
BEGIN
    PERFORM dpsql_internal._refuse_on_worker();
    IF (deferred AND NOT private) OR (public_rows IS NOT NULL AND NOT deferred) THEN
        -- (a data owner's run reads its rows at once: its count is its own)
        PERFORM dpsql_internal._fail('only a private run is prepared without its rows', 'XX000');
    END IF;
    lab := dpsql_internal._check_labels(model, labels);
    PERFORM dpsql_internal._check_run_settings(epochs, batch_size, lambda, step_size, schedule,
                                               step_offset, radius, row_norm, huber_h, tolerance,
                                               parallel_workers, shuffle, permutation);
    src := dpsql_internal._source_sql(source);
    relation := coalesce(relation, dpsql_internal._source_regclass(source));
    layout := dpsql_internal._citus_layout(relation);
    IF layout.dist_column IS NOT NULL THEN
        IF parallel_workers > 0 OR permutation = 'fresh' THEN
            PERFORM dpsql_internal._fail('on a distributed table the shards are the parallel scans: '
                                         'parallel_workers and fresh permutations do not apply', '0A000');
        END IF;
        -- The shards read the relation's own columns with col::float8, not through
        -- _read_list: a numeric value out of float8's range would print itself in the error.
        IF private THEN
            IF EXISTS (SELECT 1 FROM unnest(features || label) u(col)
                         JOIN pg_catalog.pg_attribute a
                           ON a.attrelid = relation AND a.attname = u.col
                          AND a.attnum > 0 AND NOT a.attisdropped
                        WHERE (dpsql_internal._numeric_base(a.atttypid)).base = 'numeric'::regtype) THEN
                PERFORM dpsql_internal._fail(format('distributed dataset %s has numeric columns: its shards '
                                                    'read float8, float4 and integer columns only', relation),
                                             '0A000', 'ALTER TABLE ... ALTER COLUMN ... TYPE float8.');
            END IF;
        END IF;
        IF NOT private AND NOT shard_parallel THEN
            PERFORM dpsql_internal._fail(
                format('%s is distributed over %s shards: SGD epochs there train one model per shard '
                       'and average them; pass shard_parallel => true to accept that', relation,
                       layout.shard_count), '0A000', 'See docs/citus.md.');
        END IF;
    ELSIF shard_parallel THEN
        PERFORM dpsql_internal._fail(format('shard_parallel => true needs a Citus distributed table; '
                                            'source %s is not one', source));
    ELSIF NOT layout.single_shard AND dpsql_internal._reads_citus(src, relation) THEN
        PERFORM dpsql_internal._fail(
            format('source %s reads Citus tables through a query or view: dpsql pushes training down '
                   'only for a hash-distributed table itself', source), '0A000',
            'Train on (or register) the distributed table, or copy the rows into a local table.');
    END IF;
    BEGIN
        IF NOT private THEN  -- a private source is read once (its row count m is public)
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s)', src) INTO STRICT m_any;
            IF NOT m_any THEN
                PERFORM dpsql_internal._fail(format('source %s has no rows', source), '22000');
            END IF;
        END IF;
        feat := dpsql_internal._feature_sql(src, features, feature_bounds, feature_types, dim, categories);
        IF NOT private AND label IS NOT NULL THEN
            -- (a private run's label is registered and read as float8)
            EXECUTE format('SELECT pg_typeof((SELECT %I FROM %s LIMIT 1))::text', label, src) INTO ltype;
            IF ltype NOT IN ('double precision', 'real', 'integer', 'bigint', 'smallint', 'numeric') THEN
                PERFORM dpsql_internal._fail(format('label column %I has type %s, not a number', label, ltype),
                                             '42804', 'Give a numeric label column.');
            END IF;
        END IF;
        yexpr := dpsql_internal._label_sql(lab.canonical, label, lab.checked, NOT private, label_values);
        run := nextval(pg_get_serial_sequence('dpsql.runs', 'run_id'));
        IF private AND layout.dist_column IS NOT NULL THEN  -- (a statement of its own: owners' runs)
            units := dpsql_internal._distributed_unit_dataset(relation);
        END IF;
        fill := jsonb_build_object('src', src, 'relation', relation::oid,
                                   'distributed', layout.dist_column IS NOT NULL,
                                   'units', units.dataset_id, 'x', feat.expr, 'y', yexpr,
                                   'dim', feat.dim, 'parallel_workers', parallel_workers,
                                   'shuffle', shuffle, 'seed', seed);
        IF deferred THEN
            -- a private run: its row count is public (counted once per release: the
            -- defaults' count when they made one); its table is created empty and filled
            -- after its charge (_read_rows)
            m := public_rows;
            IF m IS NULL THEN
                EXECUTE format('SELECT count(*) FROM %s', src) INTO STRICT m;
            END IF;
        END IF;
        filled := dpsql_internal._fill_run(run, fill, empty => deferred);
        tbl := filled.train_table;
        m := coalesce(m, filled.rows);
        seed := filled.seed;
        seed_policy := filled.seed_policy;
    EXCEPTION WHEN undefined_column THEN
        -- RAISE, not _fail (05_errors.sql): the refusal has a DETAIL, which _fail does not take.
        RAISE EXCEPTION 'dpsql: %', SQLERRM USING ERRCODE = 'undefined_column',
            DETAIL = format('source %s, features %s, label %s', source, features, label);
    END;
    IF m = 0 THEN
        PERFORM dpsql_internal._fail(format('source %s has no rows', source), '22000');
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
    flags := CASE row_norm WHEN 'clip' THEN dpsql_internal._flag('clip_rows')
                           WHEN 'unit' THEN dpsql_internal._flag('unit_rows') ELSE 0 END
           | CASE WHEN intercept THEN dpsql_internal._flag('intercept') ELSE 0 END
           -- malformed rows become null records
           | CASE WHEN private THEN dpsql_internal._flag('sanitize') ELSE 0 END;
    IF private THEN
        -- a white-box audit's copy takes Dirac canary rows (65_audit_dirac.sql). A statement of
        -- its own: a data owner's non-private run (the caller's rights) may not execute it,
        -- and PostgreSQL checks that when a statement starts, whatever a CASE would take.
        flags := flags | dpsql_internal._audit_canary_flags(jsonb_build_object('source', source));
    END IF;
    spec := jsonb_build_object(
        'source', source, 'features', features, 'label', label, 'model', lab.canonical,
        'classes', lab.checked, 'dim', feat.dim, 'epochs', epochs, 'batch_size', batch_size,
        'lambda', lambda, 'schedule', schedule,
        'step_size', CASE WHEN schedule = 'decreasing' THEN NULL ELSE eta END,
        'step_offset', step_offset, 'radius', CASE WHEN r > 0 THEN r END,
        'huber_h', CASE WHEN lab.canonical = 'huber' THEN huber_h END,
        'row_norm', row_norm, 'intercept', intercept, 'shuffle', shuffle, 'seed', seed,
        'seed_policy', seed_policy, 'tolerance', tolerance, 'flags', flags,
        'parallel_workers', parallel_workers, 'remainder', 'drop_last',
        'private', private, 'permutation', permutation, 'feature_bounds', feature_bounds,
        'categories', categories, 'label_values', label_values,
        'shard_parallel', shard_parallel, 'distributed', filled.layout);
    prepared.run_id := run;
    prepared.spec := spec;
    prepared.train_table := tbl;
    prepared.rows := m;
    prepared.state := '{}';
    prepared.prepare_seconds := extract(epoch FROM clock_timestamp() - t0);
    IF deferred THEN
        -- (a private run's row is written once its plan is charged and its rows read: _start_run)
        prepared.fill := fill || jsonb_build_object('seed', seed);
        RETURN prepared;
    END IF;
    INSERT INTO dpsql.runs (run_id, spec, train_table, state, rows, prepare_seconds)
    VALUES (run, spec, tbl, dpsql_internal._initial_state(spec), m, prepared.prepare_seconds)
    RETURNING * INTO prepared;
    RETURN prepared;
END $$;

-- A white-box SGD plan (36_whitebox.sql's plan functions compute it from public numbers): what
-- the release is charged (epsilon and delta; DP-SGD's accountant's event, else NULL), what the
-- C core's state is armed with (_initial_state: clipping, noise, schedule, step, radius,
-- sampling), which the run's spec records for its epochs (_arm), and its provenance (info).
-- Typed: its numbers reach the core as the float8s they were computed as. Created only where
-- missing: a change of its fields needs its ALTER TYPE in the upgrade's prologue (sql/upgrade/).
DO $$
BEGIN
    CREATE TYPE dpsql_internal.sgd_plan AS (
        epsilon float8, delta float8, dp_event jsonb,
        noise text, noise_scale float8, noise_divisor float8, clip_norm float8,
        schedule text, step_size float8, radius float8,
        sampling text, sampling_rate float8, steps_per_epoch bigint,
        info jsonb);
EXCEPTION WHEN duplicate_object THEN
    NULL;  -- (an upgrade replays this script)
END $$;

-- A training release's plan, what its mechanism's train function returns
-- (31_mechanisms.sql) once every refusal that needs no row is behind it: what it is charged
-- (charge), and what the release does after the charge, by the function it names
-- (dpsql_internal.<complete>(plan release_plan, entry bigint) -> model id: read, fit,
-- finish). The run prepared from the public row count (its table empty, its state armed),
-- the SGD family's typed plan, a plan-and-fit mechanism's own (fit), and the call's
-- arguments as the defaults filled them (epsilon and delta at row level). dpsql.preview stops
-- here, with the charge (57_preview.sql). Created only where missing, as sgd_plan.
DO $$
BEGIN
    CREATE TYPE dpsql_internal.release_plan AS (
        charge dpsql_internal.release_charge, complete text,
        ds dpsql.datasets, model text, privacy text, params jsonb,
        epsilon float8, delta float8, noise_seed bigint,
        run dpsql.runs, sgd dpsql_internal.sgd_plan, fit jsonb, recorded jsonb);
EXCEPTION WHEN duplicate_object THEN
    NULL;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._initial_state(jsonb, jsonb, bigint);
-- A run's initial SGD state, the one place it is built: from the run's spec, with a white-box
-- plan's schedule, step, radius, clipping, noise and sampling when one is given (_arm), its
-- noise keyed by noise_seed (NULL: pg_strong_random).
CREATE OR REPLACE FUNCTION dpsql_internal._initial_state(spec jsonb, plan dpsql_internal.sgd_plan DEFAULT NULL,
                                                        noise_seed bigint DEFAULT NULL)
RETURNS float8[] LANGUAGE plpgsql AS $$
DECLARE
    classes int := coalesce(jsonb_array_length(nullif(spec->'classes', 'null')), 1);
BEGIN
    IF plan IS NULL THEN
        RETURN dpsql_internal._sgd_init(
            spec->>'model', (spec->>'dim')::int, classes, (spec->>'lambda')::float8, spec->>'schedule',
            coalesce((spec->>'step_size')::float8, 0), (spec->>'step_offset')::float8,
            coalesce((spec->>'radius')::float8, 0), dpsql_internal._huber_h(spec),
            (spec->>'batch_size')::bigint, (spec->>'flags')::int);
    END IF;
    RETURN dpsql_internal._sgd_init(
        spec->>'model', (spec->>'dim')::int, classes, (spec->>'lambda')::float8, plan.schedule,
        plan.step_size, (spec->>'step_offset')::float8, coalesce(plan.radius, 0),
        dpsql_internal._huber_h(spec),
        (spec->>'batch_size')::bigint,
        -- a white-box audit's copy takes Dirac canary rows (65_audit_dirac.sql)
        (spec->>'flags')::int | dpsql_internal._audit_canary_flags(spec),
        plan.clip_norm, plan.noise, plan.noise_scale, plan.noise_divisor, plan.steps_per_epoch,
        noise_seed);
END $$;

-- A prepared private run's rows, read after its charge: its table, created empty by _prepare
-- (from the public row count), filled as _prepare would have, with the same seed. The count
-- and this read are two snapshots (READ COMMITTED; a lock would let a data owner's open
-- transaction hold up analysts): a row count that changed in between refuses the release,
-- whose charge stands (rows replaced one for one do not: the plan depends on the count only).
-- A preview never gets here (it stops after the plan).
CREATE OR REPLACE FUNCTION dpsql_internal._read_rows(prepared dpsql.runs)
RETURNS dpsql.runs LANGUAGE plpgsql
SET max_parallel_workers_per_gather = 0
SET synchronize_seqscans = off
AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
    distributed boolean := (prepared.fill->>'distributed')::boolean;
    filled record;
BEGIN
    IF prepared.fill IS NULL THEN
        PERFORM dpsql_internal._fail(format('training run %s has no pending read', prepared.run_id), 'XX000');
    END IF;
    -- the empty table is filled where it stands; on Citus it is made again (distributed and
    -- colocated by the fill itself)
    IF distributed THEN
        EXECUTE format('DROP TABLE %s', prepared.train_table);
    END IF;
    filled := dpsql_internal._fill_run(prepared.run_id, prepared.fill, empty => false,
                                       created => NOT distributed);
    IF filled.train_table <> prepared.train_table THEN  -- (a private run's: dpsql_work.train_<run>)
        PERFORM dpsql_internal._fail(format('training run %s was read into another table', prepared.run_id),
                                     'XX000');
    END IF;
    IF filled.rows <> prepared.rows THEN
        -- DP003, not 40001: a client's automatic retry of a serialization failure would charge
        -- again at every attempt
        PERFORM dpsql_internal._fail(
            'the dataset''s rows changed while this release was planned: nothing is released, '
            'and its charge stands', 'DP003',
            hint => 'A new call is a new release, charged again: train again if the budget allows.');
    END IF;
    prepared.fill := NULL;
    prepared.prepare_seconds := prepared.prepare_seconds + extract(epoch FROM clock_timestamp() - t0);
    RETURN prepared;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._arm(dpsql.runs, jsonb, bigint);
-- A prepared private run's state, built once, before its charge (a shape the core cannot hold
-- is refused before anything is charged): a white-box plan's, armed with its clipping, noise
-- and sampling (noise keyed by noise_seed, NULL: pg_strong_random; a secret sampling seed),
-- whose schedule, step, radius, sampling and clip the spec then records for the epochs; without
-- a plan, the plain state of the spec (the bolt-on's).
CREATE OR REPLACE FUNCTION dpsql_internal._arm(prepared dpsql.runs, plan dpsql_internal.sgd_plan DEFAULT NULL,
                                              noise_seed bigint DEFAULT NULL)
RETURNS dpsql.runs LANGUAGE plpgsql AS $$
BEGIN
    prepared.state := dpsql_internal._initial_state(prepared.spec, plan, noise_seed);
    IF NOT plan IS NULL THEN  -- (a composite IS NOT NULL only when every field is)
        prepared.spec := prepared.spec || jsonb_build_object(
            'schedule', plan.schedule, 'step_size', plan.step_size, 'radius', plan.radius,
            'sampling', plan.sampling, 'sampling_rate', plan.sampling_rate,
            'steps_per_epoch', plan.steps_per_epoch, 'clip_norm', plan.clip_norm);
        -- A data owner's noise seed fixes the coins too (reproductions and audits: NOT private).
        prepared.sampling_seed := CASE WHEN noise_seed IS NULL THEN dpsql_internal._random_seed()
                                       ELSE noise_seed # x'5A5A5A5A5A5A5A5A'::bigint END;
    END IF;
    RETURN prepared;
END $$;

-- A private run's row, written once, after its charge and its read (_read_rows): its spec and
-- its state as armed (_arm; none for a plan-and-fit release or Algorithm 3's base).
CREATE OR REPLACE FUNCTION dpsql_internal._start_run(prepared dpsql.runs)
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    IF prepared.fill IS NOT NULL THEN
        PERFORM dpsql_internal._fail(format('training run %s has not read its rows', prepared.run_id), 'XX000');
    END IF;
    INSERT INTO dpsql.runs (run_id, spec, train_table, state, rows, prepare_seconds, sampling_seed)
    VALUES (prepared.run_id, prepared.spec, prepared.train_table, coalesce(prepared.state, '{}'),
            prepared.rows, prepared.prepare_seconds, prepared.sampling_seed);
    RETURN prepared.run_id;
END $$;

-- Run a started run's epochs to the end and return its final weights (a white-box run's
-- release: the noise was added inside every step).
CREATE OR REPLACE FUNCTION dpsql_internal._run_epochs(run bigint)
RETURNS float8[] LANGUAGE plpgsql AS $$
DECLARE
    e record;
BEGIN
    LOOP
        e := dpsql_internal._run_epoch(run);
        EXIT WHEN e.done;
    END LOOP;
    RETURN dpsql_internal._sgd_weights((dpsql_internal._locked_run(run)).state);
END $$;

-- A run's row, locked for the rest of the transaction.
CREATE OR REPLACE FUNCTION dpsql_internal._locked_run(run_id bigint)
RETURNS dpsql.runs LANGUAGE plpgsql AS $$
DECLARE
    r dpsql.runs;
BEGIN
    SELECT * INTO r FROM dpsql.runs WHERE runs.run_id = _locked_run.run_id FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM dpsql_internal._fail(format('no training run %s', coalesce(run_id::text, 'NULL')), '42704');
    END IF;
    RETURN r;
END $$;

-- Progress of a long run as NOTICEs "dpsql: <unit> <done>/<total>": the first and the last,
-- and at most one a second between them (the last time is a session setting: a function's
-- SET clause would undo a local one). Python's Database.train draws them as a tqdm bar;
-- psql shows them, and SET client_min_messages = warning silences them. Units and totals are
-- public (epochs, steps): they say nothing about the rows.
CREATE OR REPLACE FUNCTION dpsql_internal._progress(unit text, done bigint, total bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    at float8 := extract(epoch FROM clock_timestamp());
    last float8 := nullif(current_setting('dpsql_progress.last', true), '')::float8;
    reporting text := nullif(current_setting('dpsql_progress.only', true), '');
BEGIN
    IF reporting IS NOT NULL AND unit <> reporting THEN
        RETURN;  -- an audit's hundreds of runs report as its own (52_audit.sql)
    END IF;
    IF done <= 1 OR done >= total OR last IS NULL OR at - last >= 1 THEN
        RAISE NOTICE 'dpsql: % %/%', unit, done, total;
        PERFORM set_config('dpsql_progress.last', at::text, false);
    END IF;
END $$;

-- One epoch of sampled batches (Poisson sampling, draws with replacement), from the run's
-- secret sampling seed mixed with the epoch number. Without a sort when the rows fit in
-- dpsql.sampling_memory: the scan files them by rid and the final function replays the steps,
-- and the run's later epochs in this transaction replay the filed rows without a scan
-- (sampled_fmgr.c). Larger tables join every row to its steps and sort.
CREATE OR REPLACE FUNCTION dpsql_internal._sampled_epoch(r dpsql.runs)
RETURNS float8[] LANGUAGE plpgsql AS $$
DECLARE
    seed bigint := r.sampling_seed # (r.epochs_done::bigint << 40);
    q float8 := coalesce((r.spec->>'sampling_rate')::float8, 0);
    st float8[];
BEGIN
    IF r.spec->'distributed' <> 'null' THEN
        RETURN dpsql_internal._sampled_epoch_distributed(r, seed, q);  -- 59_distributed_sampled.sql
    END IF;
    IF r.spec->>'sampling' = 'poisson' OR dpsql_internal._sampled_epoch_fits(r.state, r.rows) THEN
        -- Poisson: each row joins each step with probability q (its own stream keyed by the
        -- row id); member rows bucketed by step range, spilled to temporary files over
        -- dpsql.sampling_memory, replayed in step order, or, up to
        -- dpsql.sampling_in_place_memory, listed by step and read in place (sampled_fmgr.c).
        -- BST14 in memory:
        -- rows filed by rid, draws replayed. The first epoch's rows are kept for the later
        -- ones (Poisson: when they fit beside the buckets).
        st := dpsql_internal._sgd_epoch_replayed(r.state, r.run_id, r.train_table::regclass,
                                                 r.spec->>'sampling', seed, r.rows, q);
        IF st IS NULL THEN
            EXECUTE format('SELECT dpsql_internal._sgd_epoch_sampled(x, y, rid, $1, $2, $3, $4, $5,'
                           '       $6, $7) FROM %s', r.train_table)
               INTO st USING r.state, r.spec->>'sampling', seed, r.rows, q, r.run_id,
                             r.train_table::regclass::oid;
        END IF;
    ELSE
        -- BST14 over dpsql.sampling_memory: every step draws batch_size rows uniformly with
        -- replacement, sorted by draw
        EXECUTE format('SELECT dpsql.sgd_epoch_batches(t.x, t.y, (g.pos - 1) / $3 + 1, $1'
                       '       ORDER BY g.pos)'
                       '  FROM generate_series(1::bigint, $3 * $4) AS g(pos)'
                       '  JOIN %s t ON t.rid = dpsql_internal._uniform_index($2, g.pos, $5)', r.train_table)
           INTO st USING r.state, seed, (r.spec->>'batch_size')::bigint,
                         (r.spec->>'steps_per_epoch')::bigint, r.rows;
    END IF;
    RETURN st;
END $$;

-- One epoch of a run: one aggregate scan of its training table. Returns the epoch number,
-- the epoch's training objective, and whether the run is done (epochs reached or converged).
CREATE OR REPLACE FUNCTION dpsql_internal._run_epoch(run_id bigint, OUT epoch int, OUT objective float8, OUT done boolean)
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
    r := dpsql_internal._locked_run(run_id);
    IF r.done THEN
        PERFORM dpsql_internal._fail(format('training run %s is already done', run_id));
    END IF;
    workers := coalesce((r.spec->>'parallel_workers')::int, 0);
    IF r.spec->'distributed' <> 'null'
       AND NOT coalesce(r.spec->>'sampling' IN ('poisson', 'shuffle', 'replacement'), false)
       AND NOT coalesce((r.spec->>'shard_parallel')::boolean, false) THEN
        PERFORM dpsql_internal._fail('SGD epochs on a distributed training table need shard_parallel => true',
                                     '0A000');
    END IF;
    IF workers > 0 THEN
        -- Opt-in model averaging over parallel partial scans (COMBINEFUNC).
        PERFORM set_config('max_parallel_workers_per_gather', workers::text, true);
        PERFORM set_config('parallel_setup_cost', '0', true);
        PERFORM set_config('parallel_tuple_cost', '0', true);
        PERFORM set_config('min_parallel_table_scan_size', '0', true);
    END IF;
    IF r.spec->>'sampling' IN ('poisson', 'replacement')
       OR (r.spec->'distributed' <> 'null' AND r.spec->>'sampling' = 'shuffle') THEN
        st := dpsql_internal._sampled_epoch(r);  -- private runs only (the definer's rights)
    ELSIF r.spec->>'permutation' = 'fresh' AND r.epochs_done > 0 THEN
        -- A new data-independent permutation for this pass: the epoch number mixed into the seed.
        EXECUTE format('SELECT dpsql.sgd_epoch(x, y, $1 ORDER BY dpsql_internal._shuffle_key($2, rid)) FROM %s',
                       r.train_table)
           INTO st USING r.state, (r.spec->>'seed')::bigint # (r.epochs_done::bigint << 40);
    ELSE
        EXECUTE format('SELECT dpsql.sgd_epoch(x, y, $1) FROM %s', r.train_table) INTO st USING r.state;
    END IF;
    info := dpsql_internal._sgd_info(st);
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
    IF (r.spec->>'private')::boolean THEN  -- (non-private runs report their objective)
        PERFORM dpsql_internal._progress('epoch', epoch, (r.spec->>'epochs')::int);
    END IF;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._finish(bigint, float8[], jsonb);
-- Store the run's model with its provenance, drop its training table, forget its state.
-- released (private runs): the noisy weights to store instead of the state's; privacy: the
-- mechanism's record (mechanism, dataset_id, epsilon, delta, sensitivity, noise_scale, ...);
-- recorded: spec fields the released model has in place of the run's (a map back to the
-- registered features, e.g. DPSGD-F's Algorithm 2: dimension, intercept, flags).
CREATE OR REPLACE FUNCTION dpsql_internal._finish(run_id bigint, released float8[] DEFAULT NULL,
                              privacy jsonb DEFAULT NULL, recorded jsonb DEFAULT NULL)
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
    r := dpsql_internal._locked_run(run_id);
    IF r.epochs_done = 0 THEN
        PERFORM dpsql_internal._fail(format('training run %s has not run any epoch', run_id));
    END IF;
    s := r.spec || coalesce(recorded, '{}');
    -- (a plan-and-fit release trains no SGD state: none was built, and none of its rows dropped)
    SELECT * INTO STRICT info
      FROM dpsql_internal._sgd_info(CASE WHEN cardinality(r.state) > 0 THEN r.state END);
    w := coalesce(released, dpsql_internal._sgd_weights(r.state));
    IF (s->>'private')::boolean AND (released IS NULL OR privacy IS NULL) THEN
        PERFORM dpsql_internal._fail('a private run can only finish with a released (noisy) model', 'XX000');
    END IF;
    d := (s->>'dim')::int;
    fit_icpt := (s->>'intercept')::boolean;
    INSERT INTO dpsql.model_store (
        created_by, source, features, label, model, classes, n_features, fit_intercept, coef, intercept,
        weights, flags, epochs, epochs_run, batch_size, lambda, schedule, step_size, step_offset,
        radius, huber_h, row_norm, shuffle, seed, seed_policy, rows, dropped_rows, clipped_rows,
        train_loss, loss_history, prepare_seconds, train_seconds, privacy, dataset_id, epsilon,
        delta, sensitivity, noise_scale, params)
    VALUES (
        -- a private release runs as the extension owner: its model is the caller's, like
        -- its ledger entry (the login role)
        CASE WHEN privacy IS NULL THEN current_user ELSE session_user END,
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
        r.rows, coalesce(info.dropped, 0),
        -- Diagnostics computed from the data are not released with a private model.
        CASE WHEN privacy IS NULL THEN info.clipped END,
        CASE WHEN privacy IS NULL THEN info.objective END,
        CASE WHEN privacy IS NULL THEN r.losses ELSE '{}' END,
        r.prepare_seconds, r.train_seconds, coalesce(privacy->>'mechanism', 'none'),
        (privacy->>'dataset_id')::bigint, (privacy->>'epsilon')::float8,
        (privacy->>'delta')::float8, (privacy->>'sensitivity')::float8,
        (privacy->>'noise_scale')::float8, s || coalesce(jsonb_build_object('privacy', privacy), '{}'))
    RETURNING model_id INTO mid;
    EXECUTE format('DROP TABLE %s', r.train_table);
    DELETE FROM dpsql.runs WHERE runs.run_id = _finish.run_id;
    RETURN mid;
END $$;

-- Abandon a run: drop its training table and state.
CREATE OR REPLACE FUNCTION dpsql_internal._abort(run_id bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    tbl text;
BEGIN
    DELETE FROM dpsql.runs WHERE runs.run_id = _abort.run_id RETURNING train_table INTO tbl;
    IF tbl IS NOT NULL THEN
        EXECUTE format('DROP TABLE IF EXISTS %s', tbl);
    END IF;
END $$;
