------------------------------------------------------------------------------------------
-- Citus: a hash-distributed source trains on a distributed training table, colocated with it
-- and filled shard by shard, so that every scan is pushed down to the workers (docs/citus.md).
-- Nothing here needs Citus installed: its catalogs are read by dynamic SQL only when it is.
------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION dpsql_internal._citus_installed()
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')
$$;

-- The ledger, budgets and models live on the coordinator (workers hold empty copies of the
-- tables): a run started on a worker would be charged nowhere, so it is refused.
CREATE OR REPLACE FUNCTION dpsql_internal._refuse_on_worker()
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    coordinator boolean;
BEGIN
    IF dpsql_internal._citus_installed() THEN
        EXECUTE 'SELECT pg_catalog.citus_is_coordinator()' INTO coordinator;
        IF NOT coordinator THEN
            PERFORM dpsql_internal._fail('this is a Citus worker: train on the coordinator', '55000',
                                         'The privacy ledger and the budgets live on the coordinator.');
        END IF;
    END IF;
END $$;

-- Gives dpsql_definer a login on every node, so that definer code runs as it on Citus as on a
-- single server: Citus runs a distributed statement over connections made as the current user
-- (citusdata/citus#7719), and a role without login cannot make them. The password is random,
-- never shown, and kept where Citus reads it (pg_dist_authinfo, superuser-only); Citus
-- propagates the role's new password to the workers. Superuser, on the coordinator, after the
-- workers are added; run again after adding a node (a new password each time).
CREATE OR REPLACE FUNCTION dpsql.citus_setup_definer()
RETURNS text LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    secret text := encode(sha256(convert_to(gen_random_uuid()::text || gen_random_uuid()::text,
                                            'UTF8')), 'hex');
    coordinator boolean;
    failed text;
    workers bigint;
BEGIN
    IF NOT dpsql_internal._citus_installed() THEN
        PERFORM dpsql_internal._fail('Citus is not installed here: dpsql_definer needs no login', '55000',
                                     'On a single server the definer code runs as dpsql_definer already.');
    END IF;
    IF NOT (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = current_user) THEN
        PERFORM dpsql_internal._fail('only a superuser sets up the definer role on Citus', '42501');
    END IF;
    EXECUTE 'SELECT pg_catalog.citus_is_coordinator()' INTO coordinator;
    IF NOT coordinator THEN
        PERFORM dpsql_internal._fail('this is a Citus worker: run dpsql.citus_setup_definer() on the coordinator',
                                     '55000');
    END IF;
    EXECUTE format('ALTER ROLE dpsql_definer LOGIN PASSWORD %L', secret);
    EXECUTE 'DELETE FROM pg_catalog.pg_dist_authinfo WHERE rolename = $1' USING 'dpsql_definer';
    EXECUTE 'INSERT INTO pg_catalog.pg_dist_authinfo (nodeid, rolename, authinfo) VALUES (0, $1, $2)'
      USING 'dpsql_definer', 'password=' || secret;
    PERFORM dpsql_internal._give_definer_functions();
    -- the workers' copies of the definer code too (refused there, but refused as this role)
    EXECUTE $q$SELECT count(*),
                      string_agg(format('%s:%s: %s', nodename, nodeport, result), '; ')
                          FILTER (WHERE NOT success)
                 FROM pg_catalog.run_command_on_workers('SELECT dpsql_internal._give_definer_functions()')$q$
       INTO workers, failed;
    IF failed IS NOT NULL THEN
        PERFORM dpsql_internal._fail('dpsql_definer could not take over the definer code on a worker', '55000',
                                     failed);
    END IF;
    RETURN format('dpsql_definer runs the definer code on the coordinator and %s workers', workers);
END $$;

-- The layout of a hash-distributed table: its distribution column (and type), shard count,
-- colocation group and the number of nodes holding its shards. NULL fields: not a
-- hash-distributed table (Citus absent, a local, reference or Citus-local table).
-- single_shard: a reference or Citus-local table (read whole, like a local table).
CREATE OR REPLACE FUNCTION dpsql_internal._citus_layout(rel regclass, OUT dist_column text,
                                                       OUT dist_type text, OUT shard_count int,
                                                       OUT colocation_id int, OUT nodes int,
                                                       OUT single_shard boolean)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    single_shard := false;
    IF rel IS NULL OR NOT dpsql_internal._citus_installed() THEN
        RETURN;
    END IF;
    EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1 AND partmethod = ''n'')'
       INTO single_shard USING rel;
    EXECUTE 'SELECT a.attname, format_type(a.atttypid, a.atttypmod), p.colocationid,
                    (SELECT count(*) FROM pg_catalog.pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid),
                    (SELECT count(DISTINCT pl.groupid) FROM pg_catalog.pg_dist_shard s
                       JOIN pg_catalog.pg_dist_placement pl USING (shardid) WHERE s.logicalrelid = p.logicalrelid)
               FROM pg_catalog.pg_dist_partition p
               JOIN pg_attribute a ON a.attrelid = p.logicalrelid
                                  AND a.attname = column_to_column_name(p.logicalrelid, p.partkey)
              WHERE p.logicalrelid = $1 AND p.partmethod = ''h'''
       INTO dist_column, dist_type, colocation_id, shard_count, nodes USING rel;
END $$;

-- Whether reading a source runs a Citus plan over distributed tables. A relation (a view,
-- possibly of views) is answered from the catalogs: planning it could run its functions,
-- and private runs call this as the extension owner. A query (data owners' runs, with their
-- own rights) is planned.
CREATE OR REPLACE FUNCTION dpsql_internal._reads_citus(src text, rel regclass)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    plan text;
    found boolean;
BEGIN
    IF NOT dpsql_internal._citus_installed() THEN
        RETURN false;
    END IF;
    IF rel IS NOT NULL THEN
        EXECUTE 'WITH RECURSIVE deps(oid) AS (
                     SELECT $1::oid
                     UNION
                     SELECT d.refobjid FROM deps
                       JOIN pg_rewrite r ON r.ev_class = deps.oid
                       JOIN pg_depend d ON d.classid = ''pg_rewrite''::regclass AND d.objid = r.oid
                                       AND d.refclassid = ''pg_class''::regclass)
                 SELECT EXISTS (SELECT 1 FROM deps JOIN pg_catalog.pg_dist_partition p ON p.logicalrelid = deps.oid
                                 WHERE p.partmethod = ''h'')'
           INTO found USING rel;
        RETURN found;
    END IF;
    EXECUTE format('EXPLAIN (FORMAT JSON) SELECT 1 FROM %s', src) INTO plan;
    RETURN plan LIKE '%"Custom Plan Provider": "Citus%';
END $$;

-- A privacy unit (64_privacy_units.sql) on a hash-distributed table: its distribution column,
-- so that each unit's rows are on one shard and the bounded read (k slots per unit, a window
-- over the unit's rows) runs on the shards. A table distributed by another column spreads a
-- unit over shards: refused before anything is read (registration, and every release, since
-- the table may have been distributed after registration).
CREATE OR REPLACE FUNCTION dpsql_internal._check_distributed_unit(rel regclass, unit text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    l record := dpsql_internal._citus_layout(rel);
BEGIN
    IF unit IS NOT NULL AND l.dist_column IS NOT NULL AND l.dist_column IS DISTINCT FROM unit THEN
        PERFORM dpsql_internal._fail(
            format('the privacy unit %s of the Citus distributed table %s is not its distribution column '
                   '%s: a unit''s rows are spread over shards', quote_ident(unit), rel,
                   quote_ident(l.dist_column)), '0A000',
            format('Distribute the table by the unit (SELECT alter_distributed_table(%L, %L)): each '
                   'unit''s rows then stay on one shard, where its k slots are chosen (docs/citus.md).',
                   rel::text, unit));
    END IF;
END $$;

-- The training table of a hash-distributed source: (row_id, rid, x, y), distributed by row_id
-- and colocated with the source, filled by one INSERT ... SELECT that Citus pushes down to
-- every shard. Within a shard the rows are stored in the order of rid, a seeded key of the
-- row id (without shuffle: the row id itself), so a record's shard and position depend on its
-- row id and the seed only, never on its values. The row id is the distribution column, and
-- must be unique (a primary key or unique constraint on it alone).
CREATE OR REPLACE FUNCTION dpsql_internal._fill_distributed_table(
    run bigint, rel regclass, x_expr text, y_expr text, dim int, shuffle boolean,
    INOUT seed bigint, empty boolean, OUT train_table text, OUT rows bigint, OUT seed_policy text,
    OUT layout jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    l record := dpsql_internal._citus_layout(rel);
    id_expr text;
    key text;
    fill text;
    plan text;
BEGIN
    IF NOT dpsql_internal._runs_no_code(rel) THEN
        PERFORM dpsql_internal._fail(format('distributed source %s runs code when read (rules, policies '
                                            'or a non-table)', rel), '0A000');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a
                     ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                    WHERE i.indrelid = rel AND i.indisunique AND i.indnkeyatts = 1
                      AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = l.dist_column) THEN
        PERFORM dpsql_internal._fail(
            format('distributed source %s needs a unique row id: its distribution column %I with a '
                   'primary key or unique constraint of its own', rel, l.dist_column), '0A000',
            'The row id fixes each row''s shard and its place in the seeded order.');
    END IF;
    IF (SELECT a.atttypid >= 16384 FROM pg_attribute a  -- FirstNormalObjectId
         WHERE a.attrelid = rel AND a.attname = l.dist_column) THEN
        -- (its casts, operators and hash functions would be its owner's code, run here)
        PERFORM dpsql_internal._fail(
            format('distributed source %s is distributed by %I of type %s, which is not built in',
                   rel, l.dist_column, l.dist_type), '0A000',
            'Distribute the table by a unique id of a built-in type, e.g. bigint (docs/citus.md).');
    END IF;
    id_expr := format('src.%I', l.dist_column);
    -- 64-bit input of the shuffle key; ties (hash collisions) are broken by the id itself
    key := CASE WHEN l.dist_type IN ('bigint', 'integer', 'smallint') THEN id_expr || '::bigint'
                ELSE format('hashtextextended(%s::text, 0)', id_expr) END;
    seed_policy := 'none';
    IF shuffle THEN
        seed_policy := CASE WHEN seed IS NULL THEN 'random' ELSE 'user' END;
        seed := coalesce(seed, dpsql_internal._random_seed());
        key := format('dpsql_internal._shuffle_key(%s, %s)', seed, key);
    ELSE
        seed := NULL;
    END IF;
    train_table := dpsql_internal._training_table_name(run);
    PERFORM dpsql_internal._load_module();  -- workers: session_preload_libraries (docs/citus.md)
    -- parallel_workers = 0: a shard is scanned by one process, in its stored order
    EXECUTE format('CREATE UNLOGGED TABLE %s (row_id %s NOT NULL, rid bigint NOT NULL, x float8[], '
                   'y float8) WITH (autovacuum_enabled = false, parallel_workers = 0)',
                   train_table, l.dist_type);
    EXECUTE format('ALTER TABLE %s ALTER COLUMN x SET STORAGE %s', train_table,
                   CASE WHEN dim <= 1000 THEN 'PLAIN' ELSE 'EXTERNAL' END);
    PERFORM create_distributed_table(train_table, 'row_id', colocate_with => rel::text);
    fill := format('INSERT INTO %s (row_id, rid, x, y) SELECT %s, %s, %s, %s FROM %s AS src %s'
                   'ORDER BY 2, 1', train_table, id_expr, key, x_expr, y_expr, rel,
                   -- before the charge (and in a preview) no row is read
                   CASE WHEN empty THEN 'WHERE false ' ELSE '' END);
    -- Guard: one task per shard pair, or nothing (Citus would otherwise pull every row to the
    -- coordinator, or repartition them, without saying so).
    EXECUTE 'EXPLAIN (FORMAT JSON) ' || fill INTO plan;
    IF plan LIKE '%"INSERT/SELECT method"%' THEN
        -- (the plan itself stays here: it holds the seed)
        PERFORM dpsql_internal._fail(format('Citus cannot push the training table''s fill down to the shards of %s',
                                            rel), 'XX000',
                                     'A volatile expression over the columns stops the pushdown.');
    END IF;
    EXECUTE fill;
    GET DIAGNOSTICS rows = ROW_COUNT;
    layout := jsonb_build_object('distribution_column', l.dist_column, 'shard_count', l.shard_count,
                                 'nodes', l.nodes, 'colocation_id', l.colocation_id,
                                 'order', CASE WHEN shuffle THEN 'seeded key of the row id'
                                               ELSE 'row id' END);
END $$;

-- A unit secret (64_privacy_units.sql) of a dataset on a hash-distributed table, shared with
-- the workers: copied from dpsql_internal.unit_secrets by INSERT ... SELECT (never in a
-- statement's text) into dpsql_work.unit_secrets, a reference table made on first use. The
-- training table's fill reads it on the shards (_fill_distributed_units): a subquery of the
-- coordinator's table would make Citus pull the fill's rows through the coordinator, and a
-- table written in the training's own transaction could not be read by its parallel shard
-- tasks. In dpsql_work, as the training tables: only the definer role (and superusers) read
-- it, on every node. Kept while the dataset is, as on the coordinator.
CREATE OR REPLACE FUNCTION dpsql_internal._share_unit_secret(dataset_id bigint)
RETURNS void LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    rel regclass := (SELECT d.relid FROM dpsql.datasets d WHERE d.dataset_id = _share_unit_secret.dataset_id);
BEGIN
    IF (dpsql_internal._citus_layout(rel)).dist_column IS NULL THEN
        RETURN;
    END IF;
    IF to_regclass('dpsql_work.unit_secrets') IS NULL THEN
        CREATE TABLE dpsql_work.unit_secrets (dataset_id bigint PRIMARY KEY, secret bytea NOT NULL);
        PERFORM create_reference_table('dpsql_work.unit_secrets');
    END IF;
    EXECUTE 'INSERT INTO dpsql_work.unit_secrets (dataset_id, secret)'
            ' SELECT u.dataset_id, u.secret FROM dpsql_internal.unit_secrets u WHERE u.dataset_id = $1'
            ' ON CONFLICT (dataset_id) DO NOTHING'
      USING dataset_id;
END $$;

-- Whether a dataset's unit secret is in the workers' copy (made when it is first shared). Read
-- from the coordinator's own placement of it when there is one, as a plain table: through
-- Citus, the read would run locally, and Citus then refuses, for the rest of the transaction,
-- the statements that must not (e.g. BST14's count of rows per shard).
CREATE OR REPLACE FUNCTION dpsql_internal._unit_secret_shared(dataset_id bigint)
RETURNS boolean LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    found boolean := false;
    placement text;
BEGIN
    IF to_regclass('dpsql_work.unit_secrets') IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE 'SELECT pg_catalog.shard_name(s.logicalrelid, s.shardid) FROM pg_catalog.pg_dist_shard s'
            ' WHERE s.logicalrelid = $1'
       INTO placement USING to_regclass('dpsql_work.unit_secrets');
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s u WHERE u.dataset_id = $1)',
                   coalesce(to_regclass(placement)::text, 'dpsql_work.unit_secrets'))
       INTO found USING dataset_id;
    RETURN found;
END $$;

-- The training table of a dataset with a privacy unit on a table distributed by the unit
-- (_check_distributed_unit): (row_id, rid, x, y) as above, row_id the unit, colocated with the
-- source. The bounded read itself (_private_from: the same k slots per unit as on one node,
-- chosen on the unit's shard, the secret read from the workers' copy, _share_unit_secret) fills
-- a colocated table of the slots, and the training table is filled from it: two pushed-down
-- INSERT ... SELECTs (one would not do: Citus evaluates a statement's coordinator-evaluable
-- parts when it calls a stable function, the bounded read's convert_to, and then evaluates a
-- simple CASE's arms, the label's, wrongly). So U * k rows, k sharing a row id. rid is the
-- seeded key of the unit with the slot's number (0 .. k - 1, k <= 1000) in its low ten bits: a
-- unit's slots stored together, units in a seeded order, each slot's number readable for the
-- keyed draws (59_distributed_sampled.sql): functions of the unit and the seed, never of the
-- values. Private runs only (the secret is the extension owner's).
CREATE OR REPLACE FUNCTION dpsql_internal._fill_distributed_units(
    run bigint, ds dpsql.datasets, x_expr text, y_expr text, dim int, INOUT seed bigint,
    empty boolean, OUT train_table text, OUT rows bigint, OUT seed_policy text, OUT layout jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    rel regclass := ds.relid;
    l record := dpsql_internal._citus_layout(rel);
    unit_key text;
    slots text;
BEGIN
    PERFORM dpsql_internal._check_distributed_unit(rel, ds.privacy_unit);
    IF NOT dpsql_internal._runs_no_code(rel) THEN
        PERFORM dpsql_internal._fail(format('distributed source %s runs code when read (rules, policies '
                                            'or a non-table)', rel), '0A000');
    END IF;
    IF (SELECT a.atttypid >= 16384 FROM pg_attribute a  -- FirstNormalObjectId
         WHERE a.attrelid = rel AND a.attname = l.dist_column) THEN
        -- (its casts, operators and hash functions would be its owner's code, run here)
        PERFORM dpsql_internal._fail(
            format('distributed source %s is distributed by %I of type %s, which is not built in',
                   rel, l.dist_column, l.dist_type), '0A000',
            'Distribute the table by a unit column of a built-in type, e.g. bigint (docs/citus.md).');
    END IF;
    unit_key := CASE WHEN l.dist_type IN ('bigint', 'integer', 'smallint') THEN 'src."dpsql unit id"::bigint'
                     ELSE 'hashtextextended(src."dpsql unit id"::text, 0)' END;
    seed_policy := CASE WHEN seed IS NULL THEN 'random' ELSE 'user' END;
    seed := coalesce(seed, dpsql_internal._random_seed());
    train_table := dpsql_internal._training_table_name(run);
    slots := train_table || '_slots';
    PERFORM dpsql_internal._load_module();  -- workers: session_preload_libraries (docs/citus.md)
    EXECUTE format('CREATE UNLOGGED TABLE %s (%s, "dpsql unit id" %s NOT NULL, "dpsql slot" bigint NOT NULL) '
                   'WITH (autovacuum_enabled = false, parallel_workers = 0)', slots,
                   (SELECT string_agg(format('%I %s', c, t), ', ' ORDER BY i)
                      FROM unnest(ds.features || ds.label,
                                  dpsql_internal._feature_types(ds)
                                  || CASE WHEN ds.label_values IS NOT NULL THEN 'text' ELSE 'float8' END)
                           WITH ORDINALITY u(c, t, i)),
                   l.dist_type);
    PERFORM create_distributed_table(slots, 'dpsql unit id', colocate_with => rel::text);
    PERFORM dpsql_internal._insert_on_shards(
        format('INSERT INTO %s SELECT * FROM %s%s', slots,
               dpsql_internal._private_from(ds, slots_secret => 'dpsql_work.unit_secrets'),
               -- before the charge (and in a preview) no row is read
               CASE WHEN empty THEN ' WHERE false' ELSE '' END),
        format('the bounded read of %s (k slots per unit)', rel));
    EXECUTE format('CREATE UNLOGGED TABLE %s (row_id %s NOT NULL, rid bigint NOT NULL, x float8[], '
                   'y float8) WITH (autovacuum_enabled = false, parallel_workers = 0)',
                   train_table, l.dist_type);
    EXECUTE format('ALTER TABLE %s ALTER COLUMN x SET STORAGE %s', train_table,
                   CASE WHEN dim <= 1000 THEN 'PLAIN' ELSE 'EXTERNAL' END);
    PERFORM create_distributed_table(train_table, 'row_id', colocate_with => rel::text);
    rows := dpsql_internal._insert_on_shards(
        format('INSERT INTO %s (row_id, rid, x, y) SELECT src."dpsql unit id", '
               '(dpsql_internal._shuffle_key(%s, %s) & ~1023::bigint) | (src."dpsql slot" - 1), %s, %s '
               'FROM %s AS src ORDER BY 2, 1', train_table, seed, unit_key, x_expr, y_expr, slots),
        format('the training table of %s', rel));
    EXECUTE format('DROP TABLE %s', slots);
    layout := jsonb_build_object('distribution_column', l.dist_column, 'shard_count', l.shard_count,
                                 'nodes', l.nodes, 'colocation_id', l.colocation_id,
                                 'privacy_unit', ds.privacy_unit, 'slots_per_unit', ds.max_rows_per_unit,
                                 'order', 'seeded key of the unit, then its slots');
END $$;

-- The private dataset with a privacy unit whose distributed table a private run reads: at most
-- one (a distributed table has no holdout split, _check_distributed); NULL without a unit.
CREATE OR REPLACE FUNCTION dpsql_internal._distributed_unit_dataset(rel regclass)
RETURNS dpsql.datasets LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT d FROM dpsql.datasets d
     WHERE d.relid = rel AND d.dropped_at IS NULL AND d.split_side IS NULL AND d.privacy_unit IS NOT NULL
$$;

-- An empty table shaped like a training table, for a derived copy (e.g. whitened rows):
-- distributed and colocated with it when it is. Returns its column list before x.
CREATE OR REPLACE FUNCTION dpsql_internal._derived_training_table(train_table text, name text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    l record := dpsql_internal._citus_layout(train_table::regclass);
BEGIN
    PERFORM dpsql_internal._load_module();
    EXECUTE format('CREATE UNLOGGED TABLE %s (LIKE %s INCLUDING STORAGE) '
                   'WITH (autovacuum_enabled = false)', name, train_table);
    IF l.dist_column IS NULL THEN
        RETURN 'rid';
    END IF;
    EXECUTE format('ALTER TABLE %s SET (parallel_workers = 0)', name);
    PERFORM create_distributed_table(name, 'row_id', colocate_with => train_table);
    RETURN 'row_id, rid';
END $$;

-- A derived copy takes the training table's place (its name, which the run records).
CREATE OR REPLACE FUNCTION dpsql_internal._replace_training_table(train_table text, copy text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('DROP TABLE %s', train_table);
    EXECUTE format('ALTER TABLE %s RENAME TO %I', copy, split_part(train_table, '.', 2));
END $$;

-- Which mechanisms may run on a hash-distributed dataset (the registry's distributed column),
-- checked before anything is read or charged.
CREATE OR REPLACE FUNCTION dpsql_internal._check_distributed(mech dpsql.mechanism_catalog,
                                                            ds dpsql.datasets, params jsonb)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    l record := dpsql_internal._citus_layout(ds.relid);
    shard_parallel boolean := coalesce((params->>'shard_parallel')::boolean, false);
BEGIN
    IF l.dist_column IS NULL THEN
        IF shard_parallel THEN
            PERFORM dpsql_internal._fail(format('shard_parallel => true needs a Citus distributed dataset; '
                                                '%s is not distributed', ds.name));
        END IF;
        -- before anything counts its rows (the count would be pulled through the coordinator)
        IF NOT l.single_shard AND dpsql_internal._reads_citus(
               dpsql_internal._source_sql('SELECT * FROM ' || dpsql_internal._private_from(ds)), ds.relid) THEN
            PERFORM dpsql_internal._fail(
                format('dataset %s reads Citus tables through a view: dpsql pushes training down only '
                       'for a hash-distributed table itself', ds.name), '0A000',
                'Register the distributed table itself, or copy the rows into a local table.');
        END IF;
        RETURN;
    END IF;
    IF ds.split_side IS NOT NULL THEN  -- distributed after registration: the runs read shards
        PERFORM dpsql_internal._fail(
            format('dataset %s is one side of a holdout split of a table distributed since; its '
                   'distributed runs would read both sides', ds.name), '0A000',
            'Split the table into two tables and register each (docs/tune.md).');
    END IF;
    -- (distributed since registration by another column: its units are spread over shards)
    PERFORM dpsql_internal._check_distributed_unit(ds.relid, ds.privacy_unit);
    IF ds.privacy_unit IS NOT NULL AND NOT dpsql_internal._unit_secret_shared(coalesce(ds.split_of, ds.dataset_id)) THEN
        PERFORM dpsql_internal._fail(
            format('dataset %s declares a privacy unit, and its table was distributed since: the workers '
                   'do not have its unit secret', ds.name), '0A000',
            'Register the distributed table again (a new dataset): registration shares the secret '
            'with the workers (docs/citus.md).');
    END IF;
    IF mech.distributed IS NULL THEN
        PERFORM dpsql_internal._fail(
            format('%s is sequential: it does not run on the distributed dataset %s (its rows would '
                   'have to be pulled to the coordinator)', mech.name, ds.name), '0A000',
            'Mechanisms that run on Citus: ' || (SELECT string_agg(c.name, ', ' ORDER BY c.name COLLATE "C")
                                                   FROM dpsql.mechanism_catalog c
                                                  WHERE c.distributed IS NOT NULL)
            || '. See docs/citus.md.');
    END IF;
    IF mech.distributed = 'sampled' THEN
        -- 59_distributed_sampled.sql: steps keyed by the row id
        IF l.dist_type NOT IN ('bigint', 'integer', 'smallint') THEN
            PERFORM dpsql_internal._fail(
                format('%s samples rows by their row id on the distributed dataset %s: its distribution '
                       'column %I must be an integer (it is %s)', mech.name, ds.name, l.dist_column,
                       l.dist_type), '0A000',
                'Distribute the table by a unique integer id (docs/citus.md).');
        END IF;
    END IF;
    IF mech.distributed = 'averaged' AND NOT shard_parallel THEN
        PERFORM dpsql_internal._fail(
            format('%s on the distributed dataset %s trains one model per shard and averages them: '
                   'pass shard_parallel => true to accept that', mech.name, ds.name), '0A000',
            'docs/citus.md states the privacy argument and what averaging costs in accuracy.');
    END IF;
END $$;
