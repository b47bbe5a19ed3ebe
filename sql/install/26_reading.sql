------------------------------------------------------------------------------------------
-- Reading registered data (private training)
--
-- Private training runs as the extension owner (SECURITY DEFINER), but reading a registered
-- view runs its functions as the current user, and an owner's function without a pinned
-- search_path resolves its unqualified names in the caller's pg_temp, where an analyst can
-- put a view of their own: the red team wrote a file as superuser that way. So a registered
-- relation whose reading runs code (a view, a foreign table, an inheritance tree) is read by
-- dpsql_internal._read_source, which runs as dpsql_reader (no superuser, no login, SELECT on the
-- registered columns only) and refuses while the session holds temporary relations or types
-- that could capture names. A plain table or materialized view runs nobody's code when read.
------------------------------------------------------------------------------------------

-- SELECT on a registered relation's columns for dpsql_reader (and USAGE on its schema). The
-- definer role cannot grant on data owners' tables, so this one statement runs as the
-- extension owner (90_privileges.sql leaves it theirs; only the definer role may call it),
-- and only for what the session's own role may read: a route into definer code that calls
-- it gains nothing that role could not already read. A GRANT runs no user code (event
-- triggers are superusers').
CREATE OR REPLACE FUNCTION dpsql_internal._grant_reader(relid regclass, columns text[])
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    nsp oid := (SELECT c.relnamespace FROM pg_class c WHERE c.oid = relid);
    statement text;
    distributed boolean := false;
    dist_column text;
    propagation text;
    failed text;
BEGIN
    IF nsp IS NULL OR EXISTS (SELECT 1 FROM unnest(columns) c
                               WHERE c IS NULL
                                  OR NOT has_column_privilege(session_user, relid, c, 'SELECT')) THEN
        -- (a RAISE, not _fail: an internal misuse, not a refusal an entry point gives)
        RAISE EXCEPTION 'dpsql: % cannot read every column of % to grant', session_user, relid
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- Two registrations at once in one schema would both update its ACL ("tuple concurrently
    -- updated"): the grants are serialised, and a grant already there is not made again.
    PERFORM pg_advisory_xact_lock(hashtext('dpsql_internal._grant_reader ' || nsp::text));
    -- (a relation lock, unlike an advisory one, reads the catalog changes committed meanwhile:
    -- the check below then sees the other registration's grant)
    LOCK TABLE dpsql.dataset_history IN ACCESS SHARE MODE;
    IF NOT has_schema_privilege('dpsql_reader', nsp, 'USAGE') THEN
        EXECUTE format('GRANT USAGE ON SCHEMA %s TO dpsql_reader', nsp::regnamespace);
    END IF;
    IF dpsql_internal._citus_installed() THEN
        -- and its distribution column, the row id a distributed run is filled and shuffled by
        -- (public like the row count, docs/citus.md)
        EXECUTE $q$SELECT true, column_to_column_name(logicalrelid, partkey)
                     FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1$q$
           INTO distributed, dist_column USING relid;
        distributed := coalesce(distributed, false);
        IF dist_column IS NOT NULL AND NOT dist_column = ANY (columns) THEN
            IF NOT has_column_privilege(session_user, relid, dist_column, 'SELECT') THEN
                -- (a RAISE, not _fail: as above)
                RAISE EXCEPTION 'dpsql: % cannot read the distribution column of % to grant', session_user, relid
                    USING ERRCODE = 'insufficient_privilege';
            END IF;
            columns := columns || dist_column;
        END IF;
    END IF;
    -- (a statement with %s for the table, as run_command_on_placements takes it)
    statement := format('GRANT SELECT (%s) ON %%s TO dpsql_reader',
                        replace((SELECT string_agg(quote_ident(c), ', ') FROM unnest(columns) c), '%', '%%'));
    IF NOT distributed THEN
        EXECUTE format(statement, relid);
        RETURN;
    END IF;
    -- A Citus table. Citus refuses to read placements as one user in a transaction where
    -- another changed them ("modified in this transaction by a different user"), and its
    -- GRANT changes them as this function's owner; the definer role reads them next (the
    -- registration findings). So the shards (and the workers' copies of the table) get the
    -- grant over Citus's own connections, committed at once: a registration that fails after
    -- this leaves dpsql_reader that grant on the shards, which reach no one but the definer code.
    propagation := current_setting('citus.enable_ddl_propagation');
    PERFORM set_config('citus.enable_ddl_propagation', 'off', true);
    EXECUTE format(statement, relid);
    PERFORM set_config('citus.enable_ddl_propagation', propagation, true);
    EXECUTE $q$SELECT string_agg(result, '; ') FILTER (WHERE NOT success)
                 FROM pg_catalog.run_command_on_placements($1, $2)$q$
       INTO failed USING relid, statement;
    IF failed IS NULL THEN
        EXECUTE $q$SELECT string_agg(result, '; ') FILTER (WHERE NOT success)
                     FROM pg_catalog.run_command_on_workers($1)$q$
           INTO failed USING 'SET citus.enable_ddl_propagation TO off; ' || format(statement, relid);
    END IF;
    IF failed IS NOT NULL THEN
        -- (a RAISE, not _fail: a node refused a grant, not a refusal an entry point gives)
        RAISE EXCEPTION 'dpsql: could not grant dpsql_reader the registered columns on the shards of %', relid
            USING ERRCODE = 'insufficient_privilege', DETAIL = failed;
    END IF;
END $$;

-- The relations a read of relid reads: itself, its inheritance children and partitions, and
-- the relations a view's rules read, recursively.
CREATE OR REPLACE FUNCTION dpsql_internal._read_tree(relid regclass)
RETURNS TABLE (oid oid) LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH RECURSIVE tree(oid) AS (
        SELECT relid::oid
        UNION
        SELECT n.oid FROM tree t,
               LATERAL (SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = t.oid
                        UNION ALL
                        SELECT d.refobjid FROM pg_rewrite r
                          JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass
                                          AND d.objid = r.oid
                                          AND d.refclassid = 'pg_class'::regclass
                         WHERE r.ev_class = t.oid) AS n(oid))
    SELECT tree.oid FROM tree
$$;

-- A private read's lock on one relation (read_lock_fmgr.c): ROW EXCLUSIVE, no privilege check.
CREATE OR REPLACE FUNCTION dpsql_internal._lock_for_read(relid oid)
RETURNS void AS 'MODULE_PATHNAME', 'dpsql_lock_for_read'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;

-- The select list that reads registered columns as float8 (scalars and booleans as 0/1),
-- float8[] (an array column) or text (the columns as_text: categorical features and a text
-- label, through their built-in base type), each under its own name; columns are
-- features || label. Checked at every read, the
-- relation locked first (no change in between): each column is read through its built-in
-- numeric base type only (dpsql_internal._numeric_base), never through a cast of the owner's,
-- and one that is no longer numeric is refused by its type, naming no value. A numeric value
-- out of float8's range becomes NULL (a null record) and one below it 0, so that no cast
-- error prints a private value.
CREATE OR REPLACE FUNCTION dpsql_internal._read_list(relid regclass, columns text[],
                                                     as_text text[] DEFAULT '{}')
RETURNS text LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    list text;
    found_columns int;
    bad record;
    -- numeric to float8 without an error: v is a numeric expression
    numeric_float8 text := 'CASE WHEN abs(%1$s) <= 1.7976931348623157e308 THEN'
                           ' (CASE WHEN abs(%1$s) >= 1e-300 THEN %1$s ELSE 0 END)::float8 END';
BEGIN
    -- (ROW EXCLUSIVE: no ALTER TABLE, CREATE INDEX or CREATE TRIGGER until the transaction
    -- ends; reads and writes go on, and so do other releases: the mode does not conflict with
    -- itself. Before 0.8.0 it was SHARE UPDATE EXCLUSIVE, which does, and an analyst's open
    -- transaction after a release blocked every other release on the dataset (issue 41). The
    -- price: CREATE STATISTICS (SHARE UPDATE EXCLUSIVE) is not blocked, so one committed between
    -- the check below and the read's planning would be folded as the reader; every mode that
    -- blocks it either conflicts with itself or blocks the owner's writes. A view's lock is its
    -- relations', a table's its children's, as LOCK TABLE walks them, but without its privilege
    -- check (read_lock_fmgr.c): the definer role may only read the relation. On Citus the
    -- coordinator's lock is the one DDL takes; it is not sent to the workers.)
    PERFORM dpsql_internal._lock_for_read(t.oid)
       FROM dpsql_internal._read_tree(relid) t JOIN pg_class c ON c.oid = t.oid
      WHERE c.relkind IN ('r', 'p', 'v');
    SELECT u.col, format_type(a.atttypid, a.atttypmod) AS type, kind INTO bad
      FROM unnest(columns) WITH ORDINALITY AS u(col, k)
      JOIN pg_attribute a ON a.attrelid = relid AND a.attname = u.col AND a.attnum > 0
                         AND NOT a.attisdropped,
           LATERAL dpsql_internal._column_kind(a.atttypid) kind
     WHERE kind IS NULL
        OR (kind = 'array' AND (k > 1 OR cardinality(columns) <> 2))  -- one feature array
        OR (kind = 'text' AND u.col <> ALL (as_text))
     ORDER BY k LIMIT 1;
    IF FOUND THEN
        PERFORM dpsql_internal._fail(
            format('registered column %s of %s has type %s, %s', quote_ident(bad.col), relid, bad.type,
                   CASE WHEN bad.kind = 'text' THEN 'a text column not registered as categorical'
                        ELSE 'not a built-in numeric type' END), '42804',
            hint => 'It changed since registration: private training reads int, float, numeric and '
                    'boolean columns (or one array of them), and text columns declared as categories '
                    'or as a text label. The data owner restores it.');
    END IF;
    -- The planner folds an IMMUTABLE function of constants in an index's expressions or
    -- predicate, or in extended statistics, into a constant as the reader: in the relation, its
    -- inheritance children and the relations a view reads, those may use built-in functions,
    -- operators and types only.
    IF EXISTS (WITH tree(oid) AS (SELECT t.oid FROM dpsql_internal._read_tree(relid) t)
               SELECT 1 FROM pg_depend d
                WHERE d.refobjid >= 16384  -- FirstNormalObjectId: not built in
                  AND d.refclassid IN ('pg_proc'::regclass, 'pg_operator'::regclass,
                                       'pg_type'::regclass, 'pg_opclass'::regclass,
                                       'pg_opfamily'::regclass)
                  AND ((d.classid = 'pg_class'::regclass
                        AND d.objid IN (SELECT x.indexrelid FROM pg_index x
                                         WHERE x.indrelid IN (SELECT oid FROM tree)))
                       OR (d.classid = 'pg_statistic_ext'::regclass
                           AND d.objid IN (SELECT x.oid FROM pg_statistic_ext x
                                            WHERE x.stxrelid IN (SELECT oid FROM tree))))) THEN
        PERFORM dpsql_internal._fail(
            format('an index or statistics object of %s uses functions, operators or types that are not built in',
                   relid), '55000',
            hint => 'Planning a read runs such code with the reader''s rights: the data owner drops '
                    'the index or statistics object.');
    END IF;
    SELECT string_agg(
               CASE WHEN u.col = ANY (as_text) THEN format('%s AS %I',
                                                           dpsql_internal._text_of(a.attname, a.atttypid),
                                                           a.attname)
                    WHEN b.base IS NULL THEN  -- boolean: 0/1
                        format('%1$I::boolean::int::float8 AS %1$I', a.attname)
                    WHEN b.is_array AND b.base = 'numeric'::regtype THEN
                        format('ARRAY(SELECT %s FROM unnest(%I::numeric[]) v) AS %I',
                               format(numeric_float8, 'v'), a.attname, a.attname)
                    WHEN b.is_array THEN format('%1$I::%2$s[]::float8[] AS %1$I', a.attname, b.base)
                    WHEN b.base = 'numeric'::regtype THEN
                        format('%s AS %I', format(numeric_float8, quote_ident(a.attname) || '::numeric'),
                               a.attname)
                    ELSE format('%1$I::%2$s::float8 AS %1$I', a.attname, b.base) END,
               ', ' ORDER BY k), count(*)
      INTO list, found_columns
      FROM unnest(columns) WITH ORDINALITY AS u(col, k)
      JOIN pg_attribute a ON a.attrelid = relid AND a.attname = u.col AND a.attnum > 0
                         AND NOT a.attisdropped,
           LATERAL dpsql_internal._numeric_base(a.atttypid) b;
    IF found_columns IS DISTINCT FROM cardinality(columns) THEN
        PERFORM dpsql_internal._fail(
            format('the registered columns of %s no longer exist', relid), '42703');
    END IF;
    RETURN list;
END $$;

-- Whether reading a relation runs nobody's code: a table or materialized view without
-- inheritance children (a child or partition may be a foreign table). Those are read by the
-- private training directly; everything else through dpsql_internal._read_source.
CREATE OR REPLACE FUNCTION dpsql_internal._runs_no_code(relid regclass)
RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.relkind IN ('r', 'm') AND NOT c.relhassubclass FROM pg_class c WHERE c.oid = relid
$$;

-- Rows of a registered view, foreign table or inheritance tree (select_list from _read_list),
-- read as dpsql_reader. Callable by the extension owner only (no grants): it runs the list it
-- is given.
CREATE OR REPLACE FUNCTION dpsql_internal._read_source(relid regclass, select_list text)
RETURNS SETOF record LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = pg_my_temp_schema())
       OR EXISTS (SELECT 1 FROM pg_type t WHERE t.typnamespace = pg_my_temp_schema()) THEN
        -- RAISE, not _fail (05_errors.sql): this function runs as dpsql_reader, which has no
        -- EXECUTE on dpsql_internal._fail.
        RAISE EXCEPTION 'dpsql: this session has temporary tables or types, and the dataset is a view'
            USING ERRCODE = 'object_in_use',
                  HINT = 'They could capture names in the view''s code: DISCARD TEMP, or train from a new session.';
    END IF;
    RETURN QUERY EXECUTE format('SELECT %s FROM %s', select_list, relid);
END $$;
ALTER FUNCTION dpsql_internal._read_source(regclass, text) OWNER TO dpsql_reader;

-- The registered columns read as text: categorical features and a text label.
-- (PL/pgSQL: the columns are added after this file, in 28_ledger.sql)
CREATE OR REPLACE FUNCTION dpsql_internal._text_columns(ds dpsql.datasets)
RETURNS text[] LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN ARRAY(SELECT k FROM jsonb_object_keys(coalesce(ds.categories, '{}')) k)
           || CASE WHEN ds.label_values IS NOT NULL THEN ARRAY[ds.label] ELSE '{}'::text[] END;
END $$;

-- Whether a dataset's features are one array column (else numeric columns).
CREATE OR REPLACE FUNCTION dpsql_internal._array_feature(ds dpsql.datasets)
RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT cardinality(ds.features) = 1
           AND (SELECT a.attndims > 0 OR (dpsql_internal._numeric_base(a.atttypid)).is_array
                  FROM pg_attribute a
                 WHERE a.attrelid = ds.relid AND a.attname = ds.features[1])
$$;

-- The SQL types a private run reads a dataset's features as (_feature_sql's feature_types).
CREATE OR REPLACE FUNCTION dpsql_internal._feature_types(ds dpsql.datasets)
RETURNS text[] LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN CASE WHEN dpsql_internal._array_feature(ds) THEN '{double precision[]}'::text[]
                ELSE ARRAY(SELECT CASE WHEN coalesce(ds.categories ? f, false) THEN 'text'
                                       ELSE 'double precision' END
                             FROM unnest(ds.features) WITH ORDINALITY u(f, i) ORDER BY i) END;
END $$;

-- A FROM item reading select_list from relid, as alias(column_defs): directly when that runs
-- nobody's code, else through dpsql_internal._read_source (as dpsql_reader).
CREATE OR REPLACE FUNCTION dpsql_internal._source_from(relid regclass, select_list text, alias text,
                                                      column_defs text)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN dpsql_internal._runs_no_code(relid)
                THEN format('(SELECT %s FROM %s) AS %s', select_list, relid, alias)
                ELSE format('dpsql_internal._read_source(%s::regclass, %L) AS %s(%s)', relid::oid,
                            select_list, alias, column_defs) END
$$;

DROP FUNCTION IF EXISTS dpsql_internal._private_from(dpsql.datasets);
DROP FUNCTION IF EXISTS dpsql_internal._private_from(dpsql.datasets, boolean);
-- The FROM item (alias src) that reads a registered dataset's features and label as float8
-- columns (or one float8[] and a float8): directly when that runs nobody's code, else through
-- dpsql_internal._read_source (as dpsql_reader). One side of a holdout split: that side's rows
-- only, chosen by the key column (read with them, never exposed). A dataset with a privacy
-- unit: exactly max_rows_per_unit slots per unit (64_privacy_units.sql), with_unit adding the
-- unit's text as "dpsql unit" (an audit's copy); slots_secret: a Citus training table's fill
-- (_bounded_from, 32_distributed.sql).
CREATE OR REPLACE FUNCTION dpsql_internal._private_from(ds dpsql.datasets, with_unit boolean DEFAULT false,
                                                       slots_secret text DEFAULT NULL)
RETURNS text LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    columns text[] := ds.features || ds.label;
    as_text text[] := dpsql_internal._text_columns(ds);
    list text := dpsql_internal._read_list(ds.relid, columns, as_text);
    names text := (SELECT string_agg(format('s.%I', c), ', ' ORDER BY k)
                     FROM unnest(columns) WITH ORDINALITY AS u(c, k));
    plain boolean := ds.split_side IS NULL AND ds.privacy_unit IS NULL;
    alias text := CASE WHEN plain THEN 'src' ELSE 's' END;
    extra text := '';
    inner_from text;
    condition text;
    unit_text text;
    unit_type text;
BEGIN
    IF ds.split_side IS NOT NULL THEN  -- one side of a holdout split (62_holdout.sql)
        list := list || ', ' || dpsql_internal._split_key_sql(ds.relid, ds.split_key) || ' AS "dpsql split key"';
        extra := ', "dpsql split key" text';
    END IF;
    IF ds.privacy_unit IS NOT NULL THEN  -- the unit's value, read to bound it (64_privacy_units.sql)
        unit_text := dpsql_internal._key_text_sql(ds.relid, ds.privacy_unit, 'the privacy unit');
        -- the column as its built-in type too: the bounded read's windows are partitioned by it
        SELECT format_type(dpsql_internal._base_type(a.atttypid), NULL) INTO unit_type
          FROM pg_attribute a WHERE a.attrelid = ds.relid AND a.attname = ds.privacy_unit;
        list := list || format(', %s AS "dpsql unit", %I::%s AS "dpsql unit id"', unit_text, ds.privacy_unit,
                               unit_type);
        extra := extra || format(', "dpsql unit" text, "dpsql unit id" %s', unit_type);
    END IF;
    inner_from := dpsql_internal._source_from(ds.relid, list, alias,
                      (SELECT string_agg(format('%I %s', c,
                                                CASE WHEN c = ANY (as_text) THEN 'text'
                                                     WHEN k = 1 AND dpsql_internal._array_feature(ds)
                                                     THEN 'double precision[]' ELSE 'double precision' END),
                                         ', ' ORDER BY k)
                         FROM unnest(columns) WITH ORDINALITY AS u(c, k)) || extra);
    IF plain THEN
        RETURN inner_from;
    END IF;
    condition := dpsql_internal._split_condition(ds, 's."dpsql split key"');
    IF ds.privacy_unit IS NOT NULL THEN
        RETURN dpsql_internal._bounded_from(ds, inner_from, columns, condition, with_unit, slots_secret);
    END IF;
    RETURN format('(SELECT %s FROM %s WHERE %s) AS src', names, inner_from, condition);
END $$;

-- The row count, public (replace-one neighbours): it releases n and nothing else. (The count
-- runs the read path: a view's own filters, and a privacy unit's keyed ranks, which hash each
-- row's values to order a unit's rows; n is then U k, the units' slots.)
CREATE OR REPLACE FUNCTION dpsql_internal._public_row_count(ds dpsql.datasets)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n bigint;
BEGIN
    EXECUTE format('SELECT count(*) FROM %s', dpsql_internal._private_from(ds)) INTO n;
    RETURN n;
END $$;
