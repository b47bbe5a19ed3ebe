------------------------------------------------------------------------------------------
-- Sampled private SGD on Citus (DP-SGD with Poisson sampling or shuffled batches, both
-- DPSGD-F variants), the rows staying on their shards (docs/citus.md, "Sampled private SGD").
-- Each epoch, every shard lists the steps each of its rows joins: a keyed function of (the
-- epoch's secret seed, the row id) that draws, for every step independently, whether the row
-- joins it with probability q (_poisson_batches), so the batches follow exactly the law the
-- accountant assumes (shuffled batches: one uniform step per row and epoch). Each step, the
-- shards sum their members' clipped gradients at
-- the current model into a probe (one d-vector per shard reaches the coordinator), and the
-- coordinator adds the step's noise once and updates the model (sgd.c, dpsql_sgd_add_batch).
------------------------------------------------------------------------------------------

-- The smallest default batch of sampled SGD on a dataset of m rows: on Citus each step is a
-- round trip to every shard (about a millisecond, bench/RESULTS.md), so at most 2,000 steps an
-- epoch there (m / b); 1 on one node. Public: m and the layout. A batch given is kept.
-- (m NULL: counted, on Citus only)
CREATE OR REPLACE FUNCTION dpsql_internal._distributed_min_batch(ds dpsql.datasets, m bigint DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    IF (dpsql_internal._citus_layout(ds.relid)).dist_column IS NULL THEN
        RETURN 1;
    END IF;
    RETURN greatest(1, ceil(coalesce(m, dpsql_internal._public_row_count(ds)) / 2000.0))::bigint;
END $$;

-- A noise-free probe of a batched state at its batch: the shards sum into it.
CREATE OR REPLACE FUNCTION dpsql_internal._sgd_probe(state float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_probe_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_epoch_start(state float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_epoch_start'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_probe_transition(sums float8[], x float8[], y float8,
                                                              probe float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_probe_transition'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION dpsql_internal._sgd_probe_combine(a float8[], b float8[])
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_probe_combine_sql'
LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

-- One batch's clipped-gradient sum at the probe's model: a sum, so Citus pushes it down and
-- combines one state per shard on the coordinator. NULL: no member row.
CREATE OR REPLACE AGGREGATE dpsql_internal._sgd_batch_sum(x float8[], y float8, probe float8[]) (
    SFUNC = dpsql_internal._sgd_probe_transition,
    STYPE = float8[],
    COMBINEFUNC = dpsql_internal._sgd_probe_combine,
    PARALLEL = SAFE
);

-- The batch's sums added to the coordinator's state, and its noisy step taken.
CREATE OR REPLACE FUNCTION dpsql_internal._sgd_add_batch(state float8[], sums float8[], batch bigint)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_sgd_add_batch_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

-- BST14's draws with replacement on a shard (replacement_fmgr.c): the steps that draw each of
-- the shard's rows, called once per row in (rid, row id) order; shards and counts number the
-- rows of all shards (public: the shard of a row is the hash of its id).
CREATE OR REPLACE FUNCTION dpsql_internal._replacement_steps(seed bigint, rows bigint, steps int, batch bigint,
                                                            relation oid, shards text[], counts bigint[],
                                                            rid bigint, row_id bigint)
RETURNS int[] AS 'MODULE_PATHNAME', 'dpsql_replacement_steps'
LANGUAGE C STABLE PARALLEL UNSAFE;

-- A relation's name without its schema: a shard's, from its rows' tableoid.
CREATE OR REPLACE FUNCTION dpsql_internal._relation_name(relation oid)
RETURNS text AS 'MODULE_PATHNAME', 'dpsql_relation_name'
LANGUAGE C STRICT STABLE PARALLEL SAFE;

-- An INSERT ... SELECT between colocated distributed tables, run only if Citus pushes it down
-- to the shards (one task per shard): otherwise it would pull every row to the coordinator,
-- or repartition them, without saying so.
CREATE OR REPLACE FUNCTION dpsql_internal._insert_on_shards(fill text, what text)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    plan text;
    rows bigint;
BEGIN
    EXECUTE 'EXPLAIN (FORMAT JSON) ' || fill INTO plan;
    IF plan LIKE '%"INSERT/SELECT method"%' THEN
        -- (the plan itself stays here: it may hold a seed)
        PERFORM dpsql_internal._fail(format('Citus cannot push %s down to the shards', what), 'XX000',
                                     'A volatile expression over the columns stops the pushdown.');
    END IF;
    EXECUTE fill;
    GET DIAGNOSTICS rows = ROW_COUNT;
    RETURN rows;
END $$;

-- The (seed, stream) SQL of a distributed training table's keyed draws (Poisson batches,
-- shuffled steps, DP-FTRL's leaves), for a row t: the seed and the row id, every row its own
-- stream. With a privacy unit (_fill_distributed_units) k slots share their unit's row id, and
-- the slot's number (rid's low ten bits) keys the seed: each slot its own stream too, so the
-- slots are drawn independently, as the U * k rows of one node's training table are (the law
-- the row-level accountant assumes; a unit's slots drawn together would not have it).
CREATE OR REPLACE FUNCTION dpsql_internal._draw_key_sql(train_table text, seed bigint, OUT seed_sql text,
                                                       OUT id_sql text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    id_sql := 't.row_id::bigint';
    seed_sql := seed::text;
    IF EXISTS (SELECT 1 FROM dpsql.runs r
                WHERE r.train_table = _draw_key_sql.train_table AND r.spec->'distributed' ? 'slots_per_unit') THEN
        seed_sql := format('dpsql_internal._shuffle_key(%s, t.rid & 1023)', seed);
    END IF;
END $$;

-- The members' table of a distributed training table (train_table || '_members'): (row_id,
-- step, x, y), colocated with it, indexed by step; emptied when it exists. In dpsql_work, as the
-- training table: only the extension owner reads it.
CREATE OR REPLACE FUNCTION dpsql_internal._members_table(train_table text, dim int)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    members text := train_table || '_members';
    id_type text;
BEGIN
    IF to_regclass(members) IS NULL THEN
        SELECT format_type(a.atttypid, a.atttypmod) INTO id_type
          FROM pg_attribute a WHERE a.attrelid = train_table::regclass AND a.attname = 'row_id';
        EXECUTE format('CREATE UNLOGGED TABLE %s (row_id %s NOT NULL, step int NOT NULL, x float8[], '
                       'y float8) WITH (autovacuum_enabled = false, parallel_workers = 0)',
                       members, id_type);
        EXECUTE format('ALTER TABLE %s ALTER COLUMN x SET STORAGE %s', members,
                       CASE WHEN dim <= 1000 THEN 'PLAIN' ELSE 'EXTERNAL' END);
        PERFORM create_distributed_table(members, 'row_id', colocate_with => train_table);
        EXECUTE format('CREATE INDEX ON %s (step)', members);
    ELSE
        EXECUTE format('TRUNCATE %s', members);
    END IF;
    RETURN members;
END $$;

-- The shards of a distributed training table by name, with their row counts: one count grouped
-- by shard on the shards (public: a row's shard is the hash of its id). The numbering of
-- shard_scan.h (BST14's draws, DP-AMBSSGD's blocks) lists the shards in this order.
CREATE OR REPLACE FUNCTION dpsql_internal._shard_row_counts(train_table text, OUT shards text[],
                                                           OUT counts bigint[])
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('SELECT array_agg(shard ORDER BY shard COLLATE "C"), array_agg(n ORDER BY shard COLLATE "C")'
                   '  FROM (SELECT dpsql_internal._relation_name(tableoid) AS shard, count(*) AS n'
                   '          FROM %s GROUP BY 1) c', train_table)
       INTO shards, counts;
END $$;

-- BST14's members for an epoch: b draws a step, uniform over all the rows with replacement,
-- one node's draws (the same stream, _sampled_members) over a numbering of the shards' rows:
-- the shards by name, each shard's rows in (rid, row id) order (replacement_fmgr.c). Each
-- shard draws the epoch's stream and writes a copy of a row per draw of it; exactly
-- steps x batch copies in all, or the epoch fails before any step.
CREATE OR REPLACE FUNCTION dpsql_internal._replacement_members(r dpsql.runs, seed bigint, members text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    steps bigint := (r.spec->>'steps_per_epoch')::bigint;
    b bigint := (r.spec->>'batch_size')::bigint;
    l record := dpsql_internal._shard_row_counts(r.train_table);
    got bigint;
BEGIN
    got := dpsql_internal._insert_on_shards(format(
        'INSERT INTO %s (row_id, step, x, y)'
        ' SELECT o.row_id, unnest(dpsql_internal._replacement_steps(%s, %s, %s, %s, o.tableoid, %L, %L,'
        '                                                         o.rid, o.row_id::bigint)), o.x, o.y'
        '   FROM (SELECT tableoid, row_id, rid, x, y FROM %s ORDER BY rid, row_id) o ORDER BY 2, 1',
        members, seed, r.rows, steps, b, l.shards, l.counts, r.train_table),
        'an epoch''s draws with replacement');
    IF got <> steps * b THEN
        PERFORM dpsql_internal._fail(format('the shards drew %s rows, not %s x %s: a shard''s rows were '
                                            'not numbered in one scan', got, steps, b), 'XX000');
    END IF;
END $$;

-- One Poisson-sampled epoch of a run on a distributed training table. The epoch's members,
-- one copy of a row per step it joins (about one per row an epoch), go to a colocated table
-- ordered and indexed by step; then each step is one pushed-down aggregate over the step's
-- members and one noisy update on the coordinator. Only the run's owner (the extension owner)
-- runs it: the members' table, the seed in its fill and the probes never reach the analyst.
CREATE OR REPLACE FUNCTION dpsql_internal._sampled_epoch_distributed(r dpsql.runs, seed bigint, q float8)
RETURNS float8[] LANGUAGE plpgsql AS $$
DECLARE
    steps int := (r.spec->>'steps_per_epoch')::int;
    members text := r.train_table || '_members';
    st float8[] := dpsql_internal._sgd_epoch_start(r.state);
    sums float8[];
    t int;
    key record;
BEGIN
    IF r.spec->>'sampling' NOT IN ('poisson', 'shuffle', 'replacement') THEN
        PERFORM dpsql_internal._fail('only Poisson, shuffled or with-replacement batches run on a '
                                     'distributed training table', '0A000');
    END IF;
    PERFORM dpsql_internal._members_table(r.train_table, (r.spec->>'dim')::int);
    IF r.spec->>'sampling' = 'replacement' THEN
        PERFORM dpsql_internal._replacement_members(r, seed, members);
    ELSE
        -- The key is the row id itself (unique, an integer: _check_distributed), so every row has
        -- its own stream (a privacy unit's slots: _draw_key_sql). Poisson: the steps the row
        -- joins, each with probability q. Shuffled batches: one step, uniform (each row in
        -- exactly one step an epoch, as the shuffle's accounting assumes; the batch sizes vary
        -- around m / T). The seed and q are literals, as in the training table's fill.
        key := dpsql_internal._draw_key_sql(r.train_table, seed);
        PERFORM dpsql_internal._insert_on_shards(format(
            'INSERT INTO %s (row_id, step, x, y) SELECT t.row_id, b.step, t.x, t.y FROM %s t'
            '  CROSS JOIN LATERAL unnest(%s) AS b(step) ORDER BY 2, 1', members, r.train_table,
            CASE WHEN r.spec->>'sampling' = 'poisson'
                 THEN format('dpsql_internal._poisson_batches(%s, %s, %s, %s::float8)',
                             key.seed_sql, key.id_sql, steps, quote_literal(q::text))
                 ELSE format('ARRAY[dpsql_internal._uniform_index(%s, %s, %s)]', key.seed_sql, key.id_sql,
                             steps)
            END),
            'an epoch''s sampled batches');
    END IF;
    FOR t IN 1..steps LOOP
        EXECUTE format('SELECT dpsql_internal._sgd_batch_sum(x, y, $1) FROM %s WHERE step = $2', members)
           INTO sums USING dpsql_internal._sgd_probe(st), t;
        st := dpsql_internal._sgd_add_batch(st, sums, t);
        PERFORM dpsql_internal._progress('step', t, steps);
    END LOOP;
    -- The run's last epoch (private runs have no early stop) drops the members' table here,
    -- in dpsql_work: _finish would have to name it in a schema data owners can create in. A
    -- failed run rolls it back with the transaction that created it.
    IF r.epochs_done + 1 >= (r.spec->>'epochs')::int THEN
        EXECUTE format('DROP TABLE %s', members);
    END IF;
    RETURN dpsql_internal._sgd_final(st);
END $$;
