------------------------------------------------------------------------------------------
-- Registered datasets (docs/privacy.md)
--
-- A data owner (dpsql_admin) registers a table with its public declarations (features, label
-- set, feature bounds, row normalisation) and an (epsilon, delta) budget, and grants it to
-- analysts (dpsql_analyst). Every private release is charged to the append-only ledger under a
-- row lock on the dataset, so concurrent trainings can never overspend.
--
-- Functions that run with the extension owner's rights (SECURITY DEFINER), and every function
-- here, pin search_path = pg_catalog, pg_temp: the caller's schemas never shadow a built-in.
-- Identity checks use session_user (the login role): inside a SECURITY DEFINER function
-- current_user is the extension owner.
------------------------------------------------------------------------------------------

CREATE TABLE IF NOT EXISTS dpsql.datasets (
    dataset_id      bigserial PRIMARY KEY,
    name            text NOT NULL,              -- unique among live datasets (55_dataset_admin.sql)
    relid           regclass NOT NULL,          -- one live dataset (budget) per relation
    source          text NOT NULL,              -- schema-qualified, quoted name at registration
    features        text[] NOT NULL,            -- numeric columns, or one numeric array column
    label           text NOT NULL,
    labels          float8[] DEFAULT '{-1,1}',  -- the public label set (NULL: regression)
    feature_bounds  float8[],                   -- NULL or d x 2: public (lo, hi) per feature
    row_norm        text NOT NULL DEFAULT 'clip' CHECK (row_norm IN ('clip', 'unit', 'none')),
    epsilon_budget  float8 NOT NULL CHECK (epsilon_budget > 0 AND epsilon_budget < 'Infinity'),
    delta_budget    float8 NOT NULL DEFAULT 0 CHECK (delta_budget >= 0 AND delta_budget < 1),
    charges         bigint NOT NULL DEFAULT 0,  -- ledger entries; bumped under the row lock
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      name NOT NULL DEFAULT session_user,
    dropped_at      timestamptz,                -- the relation was dropped (event trigger)
    label_bound     float8,                     -- regression: public bound on |y| (NULL with
                                                -- labels NULL: not set yet, see
                                                -- dpsql.estimate_label_bound; untrainable)
    row_bound       float8,                     -- regression: public bound on ||x|| (or NULL)
    dim             int CHECK (dim > 0)         -- public number of features (NULL: registered
                                                -- before 0.3.0 from an empty array column)
);
-- One live dataset (budget) per relation, or one per side of a holdout split: the unique
-- index is made with the split's columns (28_ledger.sql, after the older columns).
COMMENT ON TABLE dpsql.datasets IS
    'Registered datasets: public declarations of the data owner and the (epsilon, delta) budget';

CREATE TABLE IF NOT EXISTS dpsql.dataset_grants (
    dataset_id      bigint NOT NULL REFERENCES dpsql.datasets ON DELETE CASCADE,
    role            name NOT NULL,
    granted_at      timestamptz NOT NULL DEFAULT now(),
    granted_by      name NOT NULL DEFAULT session_user,
    PRIMARY KEY (dataset_id, role)
);
COMMENT ON TABLE dpsql.dataset_grants IS 'Roles (and their members) allowed to train on a dataset';

------------------------------------------------------------------------------------------
-- Who may do what
------------------------------------------------------------------------------------------

-- Whether the login role is a superuser or a data owner (member of dpsql_admin).
CREATE OR REPLACE FUNCTION dpsql_internal._is_admin()
RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce((SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = session_user), false)
           OR pg_has_role(session_user, 'dpsql_admin', 'MEMBER')
$$;

CREATE OR REPLACE FUNCTION dpsql_internal._require_admin(action text)
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT dpsql_internal._is_admin() THEN
        PERFORM dpsql_internal._fail(
            format('only a data owner (member of dpsql_admin) or a superuser can %s', action),
            '42501',
            hint => format('Role %s is not a member of dpsql_admin.', session_user));
    END IF;
END $$;

-- Whether the login role owns a dataset: it registered it, or it is a superuser. A dataset
-- belongs to its registering owner for every grant, revoke, estimate and change (issue 41: data
-- owners granted each other's datasets to themselves and spent their budgets).
CREATE OR REPLACE FUNCTION dpsql_internal._owns_dataset(created_by name)
RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT created_by = session_user
           OR coalesce((SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = session_user), false)
$$;

CREATE OR REPLACE FUNCTION dpsql_internal._require_dataset_owner(d dpsql.datasets, action text)
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT dpsql_internal._owns_dataset(d.created_by) THEN
        PERFORM dpsql_internal._fail(
            format('dataset %s was registered by %s: only they (or a superuser) can %s',
                   quote_literal(d.name), quote_ident(d.created_by), action), '42501');
    END IF;
END $$;

-- Whether the login role may train on a dataset: its owner (or a superuser), or a member of a
-- role the dataset is granted to; other data owners only when granted. False for an unknown
-- dataset.
CREATE OR REPLACE FUNCTION dpsql_internal._can_use_dataset(dataset_id bigint)
RETURNS boolean LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM dpsql.datasets d WHERE d.dataset_id = $1)
           AND (dpsql_internal._owns_dataset((SELECT d.created_by FROM dpsql.datasets d
                                               WHERE d.dataset_id = $1))
                OR EXISTS (SELECT 1
                             FROM dpsql.dataset_grants g
                             JOIN pg_roles r ON r.rolname = g.role  -- roles dropped since: ignored
                            WHERE g.dataset_id = $1
                              AND pg_has_role(session_user, r.oid, 'MEMBER')))
$$;

-- Whether the login role can read every registered column of a dataset itself (a superuser
-- can): what a noise seed, or a charge that a rollback can undo, may be given to, since such a
-- caller learns nothing from the release that the rows do not already tell them.
CREATE OR REPLACE FUNCTION dpsql_internal._can_read_rows(ds dpsql.datasets)
RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce((SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = session_user), false)
           OR (ds.relid IS NOT NULL AND ds.dropped_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM unnest(ds.features || ds.label) AS c(name)
                                WHERE NOT EXISTS (
                                    SELECT 1 FROM pg_attribute a
                                     WHERE a.attrelid = ds.relid AND a.attname = c.name
                                       AND NOT a.attisdropped
                                       AND has_column_privilege(session_user, ds.relid, a.attnum,
                                                                'SELECT'))))
$$;

CREATE OR REPLACE FUNCTION dpsql_internal._noise_seed_refused()
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM dpsql_internal._fail('noise_seed is for tests by those who can read the rows: whoever '
                                 'knows the noise seed can subtract the noise', '42501',
                                 hint => 'Leave noise_seed NULL: the noise then comes from pg_strong_random.');
END $$;

------------------------------------------------------------------------------------------
-- Registering datasets
------------------------------------------------------------------------------------------

-- The built-in numeric type a column's values are read as (int2, int4, int8, float4, float8
-- or numeric), and whether the column is an array of them: domains are resolved to their base
-- types, recursively, also over an array and as its elements. base is NULL for anything else
-- (a type of the owner's: its casts are the owner's functions, which the definer would run).
CREATE OR REPLACE FUNCTION dpsql_internal._numeric_base(typ oid, OUT base regtype, OUT is_array boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t oid := typ;
    ty record;
BEGIN
    is_array := false;
    LOOP
        SELECT p.typtype, p.typbasetype, p.typelem, p.typcategory, p.typsubscript INTO ty
          FROM pg_type p WHERE p.oid = t;
        IF NOT FOUND THEN
            RETURN;
        ELSIF ty.typtype = 'd' THEN
            t := ty.typbasetype;
        ELSIF ty.typcategory = 'A' AND ty.typsubscript = 'array_subscript_handler'::regproc
              AND NOT is_array THEN
            t := ty.typelem;
            is_array := true;
        ELSE
            EXIT;
        END IF;
    END LOOP;
    IF t IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype, 'float4'::regtype,
             'float8'::regtype, 'numeric'::regtype) THEN
        base := t;
    END IF;
END $$;

-- 'scalar' for a numeric type, 'array' for a numeric array type, NULL otherwise (see
-- _numeric_base).
CREATE OR REPLACE FUNCTION dpsql_internal._numeric_kind(typ oid)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN b.base IS NULL THEN NULL WHEN b.is_array THEN 'array' ELSE 'scalar' END
      FROM dpsql_internal._numeric_base(typ) b
$$;

-- How private training reads a column (issue 27): 'scalar' and 'array' as _numeric_kind,
-- 'boolean' (read as 0/1), 'text' for text, varchar, char and enum columns (read as text:
-- categorical features and text labels), NULL for anything else. Domains resolve to their
-- base type. How a text-kind value is read: dpsql_internal._text_of.
CREATE OR REPLACE FUNCTION dpsql_internal._column_kind(typ oid)
RETURNS text LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t oid := typ;
    ty record;
    kind text := dpsql_internal._numeric_kind(typ);
BEGIN
    IF kind IS NOT NULL THEN
        RETURN kind;
    END IF;
    LOOP
        SELECT p.typtype, p.typbasetype INTO ty FROM pg_type p WHERE p.oid = t;
        EXIT WHEN NOT FOUND OR ty.typtype <> 'd';
        t := ty.typbasetype;
    END LOOP;
    IF t = 'bool'::regtype THEN
        RETURN 'boolean';
    ELSIF t IN ('text'::regtype, 'varchar'::regtype, 'bpchar'::regtype)
          OR (ty.typtype = 'e') THEN
        RETURN 'text';
    END IF;
    RETURN NULL;
END $$;

-- The base type a text or boolean column's values are cast through (a domain's checks are
-- the owner's code: never run as the definer).
CREATE OR REPLACE FUNCTION dpsql_internal._base_type(typ oid)
RETURNS regtype LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t oid := typ;
    base oid;
BEGIN
    LOOP
        SELECT CASE WHEN p.typtype = 'd' THEN p.typbasetype END INTO base FROM pg_type p WHERE p.oid = t;
        EXIT WHEN base IS NULL;
        t := base;
    END LOOP;
    RETURN t;
END $$;

-- The expression that reads column col (of type typ, a text kind) as text, in definer code.
-- An enum is its owner's type, and so is every cast from or to it: `col::text` on an enum runs
-- the owner's CREATE CAST (olivia.colour AS text) function, as the definer (issue 41). So an
-- enum is read through its type's own output function, named schema-qualified and called
-- without a cast (a domain's relabelling to its base type looks nothing up); text, varchar and
-- char are built-in types, whose casts no role but a superuser can create.
CREATE OR REPLACE FUNCTION dpsql_internal._text_of(col text, typ oid)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN t.typtype = 'e'
                THEN format('pg_catalog.textin(pg_catalog.enum_out(%I::%s))', col, t.oid::regtype)
                ELSE format('%I::%s::pg_catalog.text', col, t.oid::regtype) END
      FROM pg_type t WHERE t.oid = dpsql_internal._base_type(typ)
$$;

-- Checks that a relation may be read by the private training path, which reads it with the
-- extension owner's rights. Tables, partitioned tables and materialized views run no code of
-- their owner's when read; views and foreign tables do (functions in the view, the owner's
-- user mappings), so they must be owned by a superuser. Returns (schema, name, owner).
CREATE OR REPLACE FUNCTION dpsql_internal._check_dataset_relation(relid regclass, what text,
                                              OUT nspname name, OUT relname name,
                                              OUT owner_is_superuser boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    kind "char";
    persistence "char";
BEGIN
    SELECT n.nspname, c.relname, c.relkind, c.relpersistence, o.rolsuper
      INTO nspname, relname, kind, persistence, owner_is_superuser
      FROM pg_class c
      JOIN pg_namespace n ON n.oid = c.relnamespace
      JOIN pg_roles o ON o.oid = c.relowner
     WHERE c.oid = relid;
    IF NOT FOUND THEN
        PERFORM dpsql_internal._fail(format('the relation of %s no longer exists', what), '42P01');
    END IF;
    IF kind NOT IN ('r', 'p', 'm', 'v', 'f') THEN
        PERFORM dpsql_internal._fail(format('%s is not a table or view', what), '42809');
    END IF;
    IF persistence = 't' THEN
        PERFORM dpsql_internal._fail(format('%s is a temporary table', what), '42809');
    END IF;
    IF nspname IN ('dpsql', 'dpsql_internal', 'dpsql_work', 'dpsql_owner_work', 'pg_catalog',
                   'information_schema') THEN
        PERFORM dpsql_internal._fail(
            format('%s is a system relation, not a dataset', what), '42809');
    END IF;
    IF kind IN ('v', 'f') AND NOT owner_is_superuser THEN
        PERFORM dpsql_internal._fail(
            format('%s is a %s owned by a non-superuser',
                   what, CASE kind WHEN 'v' THEN 'view' ELSE 'foreign table' END), '42501',
            hint => 'Private training reads datasets with the extension owner''s rights: '
                    'register a table or materialized view, or have a superuser own the view.');
    END IF;
END $$;

-- The registered columns: they exist, are readable by the data owner and of a kind private
-- training reads (dpsql_internal._column_kind): numeric columns or one numeric array column,
-- boolean features (0/1), text or integer columns with declared categories (one-hot); a
-- numeric, boolean or text label. Returns the public dimension (each categorical column counts
-- its categories; an array column its declared length) and the label column's kind.
CREATE OR REPLACE FUNCTION dpsql_internal._register_columns(relid regclass, what text,
                                                           features text[], label text,
                                                           dim int, feature_bounds float8[],
                                                           categories jsonb,
                                                           OUT d int, OUT label_kind text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    col text;
    att record;
    kinds text[] := '{}';
BEGIN
    IF features IS NULL OR cardinality(features) = 0 OR array_ndims(features) <> 1
       OR array_position(features, NULL) IS NOT NULL THEN
        PERFORM dpsql_internal._fail('features must be a non-empty list of column names');
    END IF;
    IF (SELECT count(DISTINCT f) FROM unnest(features) f) <> cardinality(features) THEN
        PERFORM dpsql_internal._fail(format('features must be distinct, got %s', features));
    END IF;
    IF label IS NULL THEN
        PERFORM dpsql_internal._fail('label must name a column');
    END IF;
    IF label = ANY (features) THEN
        PERFORM dpsql_internal._fail(
            format('the label column %s is also a feature', quote_ident(label)));
    END IF;
    PERFORM dpsql_internal._check_categories(categories, features);
    FOREACH col IN ARRAY features || label LOOP
        SELECT a.attnum, a.atttypid, dpsql_internal._column_kind(a.atttypid) AS kind,
               format_type(a.atttypid, a.atttypmod) AS type
          INTO att FROM pg_attribute a
         WHERE a.attrelid = relid AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped;
        IF NOT FOUND THEN
            PERFORM dpsql_internal._fail(
                format('column %s does not exist in %s', quote_ident(col), what), '42703');
        END IF;
        IF NOT has_column_privilege(session_user, relid, att.attnum, 'SELECT') THEN
            PERFORM dpsql_internal._fail(
                format('role %s cannot read column %s of %s', session_user, quote_ident(col), what),
                '42501',
                hint => 'A data owner registers only data they can read themselves.');
        END IF;
        IF col = label THEN
            IF att.kind IS NULL OR att.kind = 'array' THEN
                PERFORM dpsql_internal._fail(
                    format('label column %s has type %s: give a numeric, boolean or text label column',
                           quote_ident(col), att.type), '42804');
            END IF;
            label_kind := att.kind;
        ELSIF categories ? col THEN
            IF att.kind IS DISTINCT FROM 'text'
               AND NOT (att.kind = 'scalar' AND (dpsql_internal._numeric_base(att.atttypid)).base
                                                IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype)) THEN
                PERFORM dpsql_internal._fail(
                    format('categorical column %s has type %s: categories are for text, enum or integer columns',
                           quote_ident(col), att.type), '42804');
            END IF;
            kinds := kinds || 'categorical'::text;
        ELSIF att.kind = 'text' THEN
            PERFORM dpsql_internal._fail(
                format('feature column %s has type %s: declare its public values to encode it one-hot',
                       quote_ident(col), att.type), '42804',
                hint => format('categories => ''{"%s": ["a", "b", ...]}'' (a value not listed becomes all zeros); '
                               'SELECT DISTINCT %I FROM ... lists them.', col, col));
        ELSIF att.kind IS NULL OR (att.kind = 'array' AND cardinality(features) > 1) THEN
            PERFORM dpsql_internal._fail(
                format('feature column %s has type %s: give numeric, boolean or categorical columns, or one '
                       'numeric array column', quote_ident(col), att.type), '42804');
        ELSE
            kinds := kinds || att.kind;
        END IF;
    END LOOP;
    -- The public dimension: the columns (a categorical column one per category), or the array
    -- column's declared length (the bounds' rows, or dim; register_dataset reads one row as
    -- the data owner when neither is given).
    d := CASE WHEN kinds[1] = 'array' THEN coalesce(array_length(feature_bounds, 1), dim)
              ELSE (SELECT sum(CASE WHEN categories ? f THEN jsonb_array_length(categories->f) ELSE 1 END)
                      FROM unnest(features) f)::int END;
    IF d IS NULL OR d < 1 OR d > 100000 OR (dim IS NOT NULL AND dim <> d) THEN
        PERFORM dpsql_internal._fail(
            format('the dataset''s dimension must be declared: %s features, dim => %s',
                   coalesce(d::text, 'unknown'), coalesce(dim::text, 'NULL')),
            hint => 'Give dim => the length of the feature array (1 to 100000), or feature_bounds.');
    END IF;
END $$;

-- Public categories of categorical columns: {"column": ["value", ...]}, each a feature, with
-- 1 to 1024 distinct non-empty values (JSON strings or numbers, compared as text).
CREATE OR REPLACE FUNCTION dpsql_internal._check_categories(categories jsonb, features text[])
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    col text;
    vals jsonb;
BEGIN
    IF categories IS NULL THEN
        RETURN;
    END IF;
    IF jsonb_typeof(categories) <> 'object' THEN
        PERFORM dpsql_internal._fail(
            'categories must be a JSON object {"column": ["value", ...]}',
            hint => 'e.g. categories => ''{"colour": ["red", "green", "blue"]}''.');
    END IF;
    FOR col, vals IN SELECT * FROM jsonb_each(categories) LOOP
        IF col <> ALL (features) THEN
            PERFORM dpsql_internal._fail(
                format('categories name %s, which is not a feature', quote_ident(col)),
                hint => 'List the categorical column among features => too.');
        END IF;
        IF jsonb_typeof(vals) <> 'array' OR jsonb_array_length(vals) NOT BETWEEN 1 AND 1024
           OR EXISTS (SELECT 1 FROM jsonb_array_elements(vals) v
                       WHERE jsonb_typeof(v) NOT IN ('string', 'number') OR v #>> '{}' = '')
           OR (SELECT count(DISTINCT v #>> '{}') FROM jsonb_array_elements(vals) v)
              <> jsonb_array_length(vals) THEN
            PERFORM dpsql_internal._fail(
                format('categories of %s must be 1 to 1024 distinct values (strings or numbers), got %s',
                       quote_ident(col), vals));
        END IF;
    END LOOP;
END $$;

-- A categorical column's public values as text (how its column is compared: col::text).
CREATE OR REPLACE FUNCTION dpsql_internal._category_values(categories jsonb, col text)
RETURNS text[] LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY(SELECT v #>> '{}' FROM jsonb_array_elements(categories->col) WITH ORDINALITY u(v, i)
                  ORDER BY i)
$$;

-- The public label set of a label column in its own kind (labels in any array type: the
-- caller's text, numbers or booleans). Numeric columns: the numbers. Boolean columns: false
-- 0, true 1 (default {false, true}). Text columns: the values as the column reads them
-- (label_values, through the column's built-in base type), trained as classes 0, 1, ...
CREATE OR REPLACE FUNCTION dpsql_internal._register_labels(relid regclass, label text, label_kind text,
                                                          labels text[], OUT numeric_labels float8[],
                                                          OUT label_values text[])
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    base regtype;
BEGIN
    IF label_kind <> 'scalar' AND labels IS NOT NULL
       AND (array_ndims(labels) IS DISTINCT FROM 1 OR array_position(labels, NULL) IS NOT NULL) THEN
        PERFORM dpsql_internal._fail(format('labels must be a list of values, got %s', labels));
    END IF;
    IF label_kind = 'scalar' THEN  -- (_register_target checks the numbers)
        BEGIN
            numeric_labels := labels::float8[];
        EXCEPTION WHEN invalid_text_representation OR numeric_value_out_of_range THEN
            PERFORM dpsql_internal._fail(
                format('labels %s are not numbers, and label column %s is numeric', labels, quote_ident(label)),
                '42804', hint => 'Give the label column''s values, e.g. labels => ARRAY[0, 1] (negative first).');
        END;
        RETURN;
    END IF;
    IF label_kind = 'boolean' THEN
        BEGIN
            numeric_labels := ARRAY(SELECT v::boolean::int::float8
                                      FROM unnest(coalesce(labels, '{false,true}')) WITH ORDINALITY u(v, i)
                                     ORDER BY i);
        EXCEPTION WHEN invalid_text_representation THEN
            PERFORM dpsql_internal._fail(
                format('labels %s are not booleans, and label column %s is boolean', labels, quote_ident(label)),
                '42804', hint => 'labels => ARRAY[false, true] (the default: false is the negative class).');
        END;
        RETURN;
    END IF;
    IF labels IS NULL THEN
        PERFORM dpsql_internal._fail(
            format('label column %s holds text: declare its public values', quote_ident(label)),
            hint => 'labels => ARRAY[''no'', ''yes''] (binary: the negative class first), or every class.');
    END IF;
    base := dpsql_internal._base_type((SELECT a.atttypid FROM pg_attribute a
                                        WHERE a.attrelid = relid AND a.attname = label));
    IF (SELECT t.typtype = 'e' FROM pg_type t WHERE t.oid = base) THEN
        -- An enum value's text is its label: compared with the catalog's labels, never cast to
        -- the owner's type (a text -> enum cast of theirs would run here, as the definer).
        label_values := labels;
        IF EXISTS (SELECT 1 FROM unnest(labels) v
                    WHERE NOT EXISTS (SELECT 1 FROM pg_enum e
                                       WHERE e.enumtypid = base AND e.enumlabel = v)) THEN
            PERFORM dpsql_internal._fail(
                format('labels %s are not values of label column %s (%s)', labels, quote_ident(label), base),
                '42804');
        END IF;
    ELSE
        -- (text, varchar or char: built-in types and casts)
        BEGIN
            EXECUTE format('SELECT array_agg(v::%s::pg_catalog.text ORDER BY i) FROM unnest($1) WITH ORDINALITY u(v, i)',
                           base)
               INTO label_values USING labels;
        EXCEPTION WHEN invalid_text_representation OR string_data_right_truncation THEN
            PERFORM dpsql_internal._fail(
                format('labels %s are not values of label column %s (%s)', labels, quote_ident(label), base),
                '42804');
        END;
    END IF;
    IF (SELECT count(DISTINCT v) FROM unnest(label_values) v) <> cardinality(label_values) THEN
        PERFORM dpsql_internal._fail(format('labels must be distinct, got %s', labels));
    END IF;
    numeric_labels := ARRAY(SELECT generate_series(0, cardinality(labels) - 1)::float8);
END $$;

-- Feature bounds given for the non-categorical features only, completed with (-1, 1) for
-- each one-hot coordinate (the identity on [-1, 1]: a 0/1 coordinate is kept as is); as given
-- otherwise.
CREATE OR REPLACE FUNCTION dpsql_internal._categorical_bounds(feature_bounds float8[], features text[],
                                                             categories jsonb)
RETURNS float8[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    lo2 int := array_lower(feature_bounds, 2);
    k int := 0;
    f text;
    i int;
    rows float8[] := '{}';
BEGIN
    IF feature_bounds IS NULL OR categories IS NULL OR array_ndims(feature_bounds) <> 2
       OR array_length(feature_bounds, 1) <> (SELECT count(*) FROM unnest(features) u(c)
                                               WHERE NOT categories ? u.c) THEN
        RETURN feature_bounds;
    END IF;
    FOREACH f IN ARRAY features LOOP
        IF categories ? f THEN
            FOR i IN 1..jsonb_array_length(categories->f) LOOP
                rows := rows || ARRAY[[-1::float8, 1::float8]];
            END LOOP;
        ELSE
            k := k + 1;
            rows := rows || ARRAY[[feature_bounds[array_lower(feature_bounds, 1) + k - 1][lo2],
                                   feature_bounds[array_lower(feature_bounds, 1) + k - 1][lo2 + 1]]];
        END IF;
    END LOOP;
    RETURN rows;
END $$;

-- Public feature bounds: d x 2, finite, lo < hi; returned with lower bounds 1.
CREATE OR REPLACE FUNCTION dpsql_internal._register_feature_bounds(feature_bounds float8[], d int)
RETURNS float8[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    bounds float8[];
    lo2 int;
BEGIN
    IF feature_bounds IS NOT NULL THEN
        IF array_ndims(feature_bounds) IS DISTINCT FROM 2
           OR array_length(feature_bounds, 2) <> 2
           OR (d IS NOT NULL AND array_length(feature_bounds, 1) <> d) THEN
            PERFORM dpsql_internal._fail(
                format('feature_bounds must be a %s x 2 array of (lo, hi), got %s',
                       coalesce(d::text, 'd'), feature_bounds));
        END IF;
        lo2 := array_lower(feature_bounds, 2);
        SELECT array_agg(ARRAY[feature_bounds[i][lo2], feature_bounds[i][lo2 + 1]] ORDER BY i)
          INTO bounds FROM generate_subscripts(feature_bounds, 1) i;
        IF EXISTS (SELECT 1 FROM generate_subscripts(bounds, 1) i
                    WHERE NOT (bounds[i][1] > '-Infinity' AND bounds[i][2] < 'Infinity'
                               AND bounds[i][1] < bounds[i][2])
                       OR bounds[i][1] IS NULL OR bounds[i][2] IS NULL) THEN
            PERFORM dpsql_internal._fail(
                format('feature_bounds must be finite with lo < hi in every row, got %s',
                       feature_bounds));
        END IF;
    END IF;
    RETURN bounds;
END $$;

-- What a dataset predicts: a public label set (classification) or a public bound on |y|
-- (regression: given, estimated now with estimate => {"label_bound": ...}, or later with
-- regression => true), and the row normalisation and row bound that go with it.
CREATE OR REPLACE FUNCTION dpsql_internal._register_target(
    labels float8[], label_bound float8, row_bound float8, row_norm text, regression boolean,
    estimate jsonb, feature_bounds float8[], bounded_dim int,
    OUT is_regression boolean, OUT checked_labels float8[], OUT checked_row_norm text,
    OUT checked_row_bound float8)
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    is_regression := coalesce(regression,
                              label_bound IS NOT NULL OR coalesce(estimate ? 'label_bound', false));
    IF NOT is_regression AND (label_bound IS NOT NULL OR estimate ? 'label_bound') THEN
        PERFORM dpsql_internal._fail(
            'a label bound is for regression datasets, and regression => false');
    END IF;
    IF label_bound IS NOT NULL AND estimate ? 'label_bound' THEN
        PERFORM dpsql_internal._fail(
            'give label_bound or estimate it (estimate => {"label_bound": ...}), not both');
    END IF;
    IF feature_bounds IS NOT NULL AND estimate ? 'feature_bounds' THEN
        PERFORM dpsql_internal._fail(
            'give feature_bounds or estimate them (estimate => {"feature_bounds": ...}), not both');
    END IF;
    IF is_regression THEN
        IF label_bound IS NOT NULL AND NOT (label_bound > 0 AND label_bound < 'Infinity') THEN
            PERFORM dpsql_internal._fail(
                format('label_bound must be a finite number > 0, got %s', label_bound));
        END IF;
        IF labels IS NOT NULL THEN
            PERFORM dpsql_internal._fail(
                'give labels (classification) or a label bound (regression), not both');
        END IF;
    ELSE
        labels := coalesce(labels, '{-1,1}');
    END IF;
    IF row_bound IS NOT NULL AND (NOT is_regression OR NOT (row_bound > 0 AND row_bound < 'Infinity')) THEN
        PERFORM dpsql_internal._fail(
            format('row_bound (a public bound on ||x||) is for regression datasets and must be a finite number > 0, got %s',
                   row_bound));
    END IF;

    -- The public label set.
    IF NOT is_regression AND (labels IS NULL OR array_ndims(labels) <> 1 OR cardinality(labels) < 2
       OR cardinality(labels) > 1024) THEN
        PERFORM dpsql_internal._fail(
            format('labels must list 2 to 1024 public label values, got %s',
                   coalesce(labels::text, 'NULL')));
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(labels) v
                WHERE v IS NULL OR v IN ('NaN', 'Infinity', '-Infinity'))
       OR (SELECT count(DISTINCT v) FROM unnest(labels) v) <> cardinality(labels) THEN
        PERFORM dpsql_internal._fail(
            format('labels must be distinct finite numbers, got %s', labels));
    END IF;

    row_norm := coalesce(row_norm, CASE WHEN is_regression THEN 'none' ELSE 'clip' END);
    IF NOT is_regression AND row_norm NOT IN ('clip', 'unit') THEN
        PERFORM dpsql_internal._fail(
            format('row_norm must be clip or unit, got %s', row_norm),
            hint => 'clip scales rows to norm <= 1, unit to norm = 1.');
    END IF;
    IF is_regression AND row_norm NOT IN ('none', 'clip') THEN
        PERFORM dpsql_internal._fail(
            format('row_norm of a regression dataset must be none or clip, got %s', row_norm),
            hint => 'clip scales rows to norm <= 1 (row_bound 1); none keeps them (row_bound, if given, clips).');
    END IF;
    IF is_regression THEN
        row_bound := dpsql_internal._regression_row_bound(row_norm, row_bound, bounded_dim);
    END IF;
    checked_labels := CASE WHEN NOT is_regression THEN labels END;
    checked_row_norm := row_norm;
    checked_row_bound := row_bound;
END $$;

-- A dataset name: not empty, and without a dot, so that no dataset name reads as a
-- schema-qualified relation name (_lookup_dataset resolves a qualified name as a relation).
CREATE OR REPLACE FUNCTION dpsql_internal._check_dataset_name(name text)
RETURNS void LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF name IS NULL OR btrim(name) = '' THEN
        PERFORM dpsql_internal._fail('the dataset name must not be empty');
    END IF;
    IF strpos(name, '.') > 0 THEN
        PERFORM dpsql_internal._fail(format('dataset name %s has a dot', quote_literal(name)), '42602',
                                     hint => 'A name with a dot reads as a schema-qualified table: '
                                             'give name => without one.');
    END IF;
END $$;

-- A registration's budget: epsilon_budget finite and > 0, delta_budget in [0, 1), and how
-- releases are held against it (composition sum or pld; NULL: sum).
CREATE OR REPLACE FUNCTION dpsql_internal._check_dataset_budget(epsilon_budget float8, delta_budget float8,
                                                                composition text)
RETURNS void LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF epsilon_budget IS NULL OR NOT (epsilon_budget > 0 AND epsilon_budget < 'Infinity') THEN
        PERFORM dpsql_internal._fail(
            format('epsilon_budget must be a finite number > 0, got %s',
                   coalesce(epsilon_budget::text, 'NULL')));
    END IF;
    IF delta_budget IS NULL OR NOT (delta_budget >= 0 AND delta_budget < 1) THEN
        PERFORM dpsql_internal._fail(
            format('delta_budget must be in [0, 1), got %s', coalesce(delta_budget::text, 'NULL')));
    END IF;

    -- How releases are held against the budget (28_ledger.sql); NULL: the default, 'sum'.
    IF composition IS NOT NULL AND composition NOT IN ('sum', 'pld') THEN
        PERFORM dpsql_internal._fail(
            format('composition must be sum or pld, got %s', quote_literal(composition)),
            hint => 'pld: charged by the PLD composition of the releases (docs/privacy.md).');
    END IF;
END $$;

-- Neither the relation (what: its name in messages) nor the dataset name nm registered yet.
CREATE OR REPLACE FUNCTION dpsql_internal._check_dataset_unregistered(relid regclass, nm text, what text)
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    existing text;
BEGIN
    SELECT ds.name INTO existing FROM dpsql.datasets ds
     WHERE ds.relid = _check_dataset_unregistered.relid AND ds.dropped_at IS NULL;
    IF FOUND THEN
        PERFORM dpsql_internal._fail(
            format('%s is already registered as dataset %s', what, quote_literal(existing)),
            '42710',
            hint => 'A relation has one budget; use the registered dataset.');
    END IF;
    IF EXISTS (SELECT 1 FROM dpsql.datasets ds WHERE ds.name = nm AND ds.dropped_at IS NULL) THEN
        PERFORM dpsql_internal._fail(
            format('a dataset named %s is already registered', quote_literal(nm)), '42710',
            hint => 'Choose another name => ...');
    END IF;
END $$;

-- The registration itself. Admin-only; nothing is written unless every check passes.
-- (0.8.0: holdout and key, then privacy_unit and max_rows_per_unit added)
DROP FUNCTION IF EXISTS dpsql_internal._register_dataset(regclass, text[], text, float8, float8, text[],
                                                         float8[], text, text, text, float8, float8, int,
                                                         boolean, jsonb, text, jsonb, boolean);
DROP FUNCTION IF EXISTS dpsql_internal._register_dataset(regclass, text[], text, float8, float8, text[],
                                                         float8[], text, text, text, float8, float8, int,
                                                         boolean, jsonb, text, jsonb, boolean, float8, text);
CREATE OR REPLACE FUNCTION dpsql_internal._register_dataset(
    relid regclass, features text[], label text, epsilon_budget float8,
    delta_budget float8 DEFAULT 0, labels text[] DEFAULT NULL,
    feature_bounds float8[] DEFAULT NULL, row_norm text DEFAULT NULL, name text DEFAULT NULL,
    source_text text DEFAULT NULL, label_bound float8 DEFAULT NULL, row_bound float8 DEFAULT NULL,
    dim int DEFAULT NULL, regression boolean DEFAULT NULL, estimate jsonb DEFAULT NULL,
    composition text DEFAULT NULL, categories jsonb DEFAULT NULL, accept boolean DEFAULT false,
    holdout float8 DEFAULT NULL, key text DEFAULT NULL, privacy_unit text DEFAULT NULL,
    max_rows_per_unit int DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    what text;
    rel record;
    nm text;
    privileged boolean;
    cols record;
    lab record;
    bounds float8[];
    target record;
    id bigint;
    holdout_key text;  -- the holdout's key column (62_holdout.sql)
BEGIN
    PERFORM dpsql_internal._require_admin('register datasets');
    IF relid IS NULL THEN
        PERFORM dpsql_internal._fail(
            format('relation %s does not exist', coalesce(quote_literal(source_text), 'NULL')),
            '42P01',
            hint => 'Give a table name (schema-qualified if needed).');
    END IF;
    what := format('relation %s', quote_literal(coalesce(source_text, relid::oid::text)));
    rel := dpsql_internal._check_dataset_relation(relid, what);
    what := format('%I.%I', rel.nspname, rel.relname);
    SELECT r.rolsuper OR r.rolbypassrls INTO privileged
      FROM pg_roles r WHERE r.rolname = session_user;
    IF NOT privileged AND EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = relid AND c.relrowsecurity) THEN
        PERFORM dpsql_internal._fail(
            format('%s has row-level security; only a superuser can register it', what), '42501',
            hint => 'Private training reads every row, whatever the policies.');
    END IF;

    cols := dpsql_internal._register_columns(relid, what, features, label, dim, feature_bounds,
                                             categories);
    bounds := dpsql_internal._register_feature_bounds(
        dpsql_internal._categorical_bounds(feature_bounds, features, categories), cols.d);
    PERFORM dpsql_internal._check_estimate_option(estimate);
    IF estimate ? 'feature_bounds' THEN
        PERFORM dpsql_internal._refuse_categorical_estimate(categories);
    END IF;
    lab := dpsql_internal._register_labels(relid, label, cols.label_kind, labels);
    IF lab.label_values IS NOT NULL AND (regression OR label_bound IS NOT NULL) THEN
        PERFORM dpsql_internal._fail(format('label column %s holds text: a classification dataset, not regression',
                                            quote_ident(label)));
    END IF;
    target := dpsql_internal._register_target(lab.numeric_labels, label_bound, row_bound, row_norm,
                                              regression, estimate, feature_bounds,
                                              CASE WHEN bounds IS NOT NULL THEN cols.d END);
    PERFORM dpsql_internal._check_dataset_budget(epsilon_budget, delta_budget, composition);
    nm := coalesce(_register_dataset.name, rel.relname);
    PERFORM dpsql_internal._check_dataset_name(nm);
    PERFORM dpsql_internal._check_dataset_unregistered(relid, nm, what);
    holdout_key := dpsql_internal._check_holdout(relid, holdout,
                                                 coalesce(key, CASE WHEN holdout IS NOT NULL THEN privacy_unit END),
                                                 nm, features, label);
    PERFORM dpsql_internal._check_privacy_unit(relid, privacy_unit, max_rows_per_unit, features, label,
                                               holdout_key);

    INSERT INTO dpsql.datasets (name, relid, source, features, label, labels, feature_bounds,
                                row_norm, epsilon_budget, delta_budget, label_bound, row_bound,
                                dim, composition, categories, label_values, privacy_unit,
                                max_rows_per_unit)
    VALUES (nm, relid, what, features, label, target.checked_labels, bounds,
            target.checked_row_norm, epsilon_budget, delta_budget, label_bound,
            target.checked_row_bound, cols.d, coalesce(_register_dataset.composition, 'sum'),
            categories, lab.label_values, privacy_unit, max_rows_per_unit)
    RETURNING dataset_id INTO id;
    IF privacy_unit IS NOT NULL THEN
        PERFORM dpsql_internal._draw_unit_secret(id);
    END IF;
    PERFORM dpsql_internal._grant_reader(relid, features || label
                                                || array_remove(ARRAY[holdout_key, privacy_unit], NULL));
    -- What the rows hold against the declarations, told to the data owner (who may read them),
    -- and refused unless accepted: nothing is registered then (30_registration_findings.sql).
    -- Of the whole relation, before a holdout splits it (the owner's rows, either side).
    PERFORM dpsql_internal._registration_findings(id, accept, estimate);
    IF holdout_key IS NOT NULL THEN  -- the training side and '<name>_holdout' (62_holdout.sql)
        UPDATE dpsql.datasets d SET split_side = 'train', split_key = holdout_key,
                                    split_fraction = holdout
         WHERE d.dataset_id = id;
        PERFORM dpsql_internal._register_holdout(id);
    END IF;
    -- Private bounds in the same transaction: an estimate that fails (budget, range, no rows)
    -- undoes the registration, and with it every charge (27_estimate_bounds.sql).
    PERFORM dpsql_internal._estimate_at_registration(nm, estimate);
    IF holdout_key IS NOT NULL THEN
        PERFORM dpsql_internal._holdout_takes_bounds(id);
    END IF;
    RETURN id;
END $$;

-- The tightest public bound on ||x|| a regression dataset's declarations imply: clipped rows
-- have norm <= 1; features with bounds (bounded_dim of them) are rescaled onto [-1, 1].
CREATE OR REPLACE FUNCTION dpsql_internal._regression_row_bound(row_norm text, row_bound float8, bounded_dim int)
RETURNS float8 LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN row_norm = 'clip' THEN least(coalesce(row_bound, 1), 1)
                WHEN row_bound IS NOT NULL THEN row_bound
                WHEN bounded_dim IS NOT NULL THEN sqrt(bounded_dim) END
$$;

-- Admin entry point. SECURITY INVOKER: it resolves source with the caller's search_path and
-- rights (nothing else runs under the caller's search_path: everything is schema-qualified),
-- then hands the resolved relation to the SECURITY DEFINER _register_dataset.
DROP FUNCTION IF EXISTS dpsql.register_dataset(text, text[], text, float8, float8, anycompatiblearray,
                                                float8[], text, text, float8, float8, int, boolean, jsonb,
                                                text, jsonb, boolean);
DROP FUNCTION IF EXISTS dpsql.register_dataset(text, text[], text, float8, float8, anycompatiblearray,
                                                float8[], text, text, float8, float8, int, boolean, jsonb,
                                                text, jsonb, boolean, float8, text);
CREATE OR REPLACE FUNCTION dpsql.register_dataset(
    source text, features text[], label text, epsilon_budget float8,
    delta_budget float8 DEFAULT 0, labels anycompatiblearray DEFAULT NULL::float8[],
    feature_bounds float8[] DEFAULT NULL, row_norm text DEFAULT NULL, name text DEFAULT NULL,
    label_bound float8 DEFAULT NULL, row_bound float8 DEFAULT NULL, dim int DEFAULT NULL,
    regression boolean DEFAULT NULL, estimate jsonb DEFAULT NULL, composition text DEFAULT NULL,
    categories jsonb DEFAULT NULL, accept boolean DEFAULT false, holdout float8 DEFAULT NULL,
    key text DEFAULT NULL, privacy_unit text DEFAULT NULL, max_rows_per_unit int DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    rel regclass;
BEGIN
    BEGIN
        rel := pg_catalog.to_regclass(source);
    EXCEPTION WHEN OTHERS THEN  -- invalid name syntax: reported as "does not exist"
        rel := NULL;
    END;
    IF rel IS NOT NULL AND dim IS NULL AND feature_bounds IS NULL AND cardinality(features) = 1
       AND pg_catalog.has_table_privilege(rel, 'SELECT') THEN
        -- One array column of undeclared length: the data owner's first row declares it (as
        -- the owner, who may read it; the dimension is public from now on).
        BEGIN
            EXECUTE format('SELECT pg_catalog.array_length(%I, 1) FROM %s WHERE %I IS NOT NULL LIMIT 1',
                           features[1], rel, features[1]) INTO dim;
        EXCEPTION WHEN OTHERS THEN
            dim := NULL;  -- not a readable array column: _register_dataset says what is wrong
        END;
    END IF;
    RETURN dpsql_internal._register_dataset(rel, features, label, epsilon_budget, delta_budget,
                                   labels::text[], feature_bounds, row_norm, name, source,
                                   label_bound, row_bound, dim, regression, estimate, composition,
                                   categories, coalesce(accept, false), holdout, key, privacy_unit,
                                   max_rows_per_unit);
END $$;
COMMENT ON FUNCTION dpsql.register_dataset(text, text[], text, float8, float8, anycompatiblearray,
                                           float8[], text, text, float8, float8, int, boolean, jsonb,
                                           text, jsonb, boolean, float8, text, text, int) IS
    'Register a table for private training with its public declarations and (epsilon, delta) budget, '
    'which protects one row, or all of one privacy unit''s rows (privacy_unit, max_rows_per_unit)';

CREATE OR REPLACE FUNCTION dpsql_internal._dataset_by_id(dataset_id bigint)
RETURNS dpsql.datasets LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d dpsql.datasets;
BEGIN
    SELECT * INTO d FROM dpsql.datasets ds WHERE ds.dataset_id = _dataset_by_id.dataset_id;
    IF NOT FOUND THEN
        PERFORM dpsql_internal._fail(
            format('no dataset %s', coalesce(dataset_id::text, 'NULL')), '42704');
    END IF;
    RETURN d;
END $$;

CREATE OR REPLACE FUNCTION dpsql.grant_dataset(dataset_id bigint, role name)
RETURNS void LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d dpsql.datasets;
BEGIN
    PERFORM dpsql_internal._require_admin('grant datasets');
    d := dpsql_internal._dataset_by_id(dataset_id);
    PERFORM dpsql_internal._require_dataset_owner(d, 'grant it');
    IF role IS NULL OR NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = grant_dataset.role) THEN
        PERFORM dpsql_internal._fail(
            format('role %s does not exist', coalesce(quote_ident(role), 'NULL')), '42704');
    END IF;
    IF NOT pg_has_role(role, 'dpsql_analyst', 'MEMBER') AND NOT pg_has_role(role, 'dpsql_admin', 'MEMBER') THEN
        RAISE NOTICE 'dpsql: role % is not a member of dpsql_analyst, so it cannot call dpsql.train yet',
                     quote_ident(role)
            USING HINT = format('GRANT dpsql_analyst TO %I;', role);
    END IF;
    INSERT INTO dpsql.dataset_grants (dataset_id, role)
    VALUES (d.dataset_id, grant_dataset.role)
    ON CONFLICT ON CONSTRAINT dataset_grants_pkey DO NOTHING;
    IF FOUND THEN
        PERFORM dpsql_internal._record_change(d.dataset_id, jsonb_build_object('granted', grant_dataset.role));
    END IF;
END $$;
COMMENT ON FUNCTION dpsql.grant_dataset(bigint, name) IS
    'Allow a role (and its members) to train privately on a registered dataset';

CREATE OR REPLACE FUNCTION dpsql.revoke_dataset(dataset_id bigint, role name)
RETURNS void LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d dpsql.datasets;
BEGIN
    PERFORM dpsql_internal._require_admin('revoke datasets');
    d := dpsql_internal._dataset_by_id(dataset_id);
    PERFORM dpsql_internal._require_dataset_owner(d, 'revoke its grants');
    DELETE FROM dpsql.dataset_grants g
     WHERE g.dataset_id = d.dataset_id AND g.role = revoke_dataset.role;
    IF FOUND THEN
        PERFORM dpsql_internal._record_change(d.dataset_id, jsonb_build_object('revoked', revoke_dataset.role));
    END IF;
END $$;
COMMENT ON FUNCTION dpsql.revoke_dataset(bigint, name) IS
    'Withdraw a role''s grant on a dataset (its ledger entries stay)';

-- The registered dataset a source names (the private training path and the estimates): its name, or, among
-- datasets whose relation still exists, the relation's current qualified name (quoted or not),
-- the name it was registered under, or its unqualified name when exactly one has it. No name is
-- resolved through a search_path. Only datasets the caller may use are looked at: to an
-- analyst, one not granted to them is unknown, with the same error (no name, no count). The relation is checked again (it may have been replaced
-- since registration), and the returned row's source is the relation's current schema-qualified
-- name: read that, never a name given by the caller.
CREATE OR REPLACE FUNCTION dpsql_internal._lookup_dataset(source text)
RETURNS dpsql.datasets LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d dpsql.datasets;
    parts text[];
    n int;
    rel record;
BEGIN
    BEGIN
        parts := parse_ident(_lookup_dataset.source);
    EXCEPTION WHEN OTHERS THEN
        parts := NULL;
    END;
    -- A dataset name has no dot (since 0.8.0): a qualified name is a relation's, never a
    -- dataset's that shadows it (issue 41: a dataset named olivia.cls took analysts' training
    -- of the table olivia.cls). Only names registered before then are looked up last.
    IF cardinality(parts) IS DISTINCT FROM 2 THEN
        SELECT * INTO d FROM dpsql.datasets ds
         WHERE ds.name = _lookup_dataset.source AND dpsql_internal._can_use_dataset(ds.dataset_id)
         ORDER BY ds.dropped_at IS NOT NULL, ds.dataset_id DESC  -- the live one; else the last dropped
         LIMIT 1;
    END IF;
    IF d.dataset_id IS NULL THEN
        IF cardinality(parts) = 2 THEN  -- the relation's current name
            SELECT ds.* INTO d
              FROM dpsql.datasets ds
              JOIN pg_class c ON c.oid = ds.relid
              JOIN pg_namespace ns ON ns.oid = c.relnamespace
             WHERE ds.dropped_at IS NULL AND ns.nspname = parts[1] AND c.relname = parts[2]
               AND ds.split_side IS DISTINCT FROM 'holdout'  -- a holdout is named by its name
               AND dpsql_internal._can_use_dataset(ds.dataset_id);
        END IF;
        IF d.dataset_id IS NULL THEN  -- the name it was registered under
            SELECT * INTO d FROM dpsql.datasets ds
             WHERE ds.dropped_at IS NULL AND ds.source = _lookup_dataset.source
               AND ds.split_side IS DISTINCT FROM 'holdout'
               AND dpsql_internal._can_use_dataset(ds.dataset_id);
        END IF;
        IF d.dataset_id IS NULL AND cardinality(parts) = 2 THEN  -- a name registered before 0.8.0
            SELECT * INTO d FROM dpsql.datasets ds
             WHERE ds.name = _lookup_dataset.source AND dpsql_internal._can_use_dataset(ds.dataset_id)
             ORDER BY ds.dropped_at IS NOT NULL, ds.dataset_id DESC
             LIMIT 1;
        END IF;
        IF d.dataset_id IS NULL AND cardinality(parts) = 1 THEN
            SELECT count(*) INTO n
              FROM dpsql.datasets ds JOIN pg_class c ON c.oid = ds.relid
             WHERE ds.dropped_at IS NULL AND c.relname = parts[1]
               AND ds.split_side IS DISTINCT FROM 'holdout'
               AND dpsql_internal._can_use_dataset(ds.dataset_id);
            IF n > 1 THEN
                PERFORM dpsql_internal._fail(
                    format('%s names %s registered datasets',
                           quote_literal(_lookup_dataset.source), n), '42P09',
                    hint => 'Give the dataset name or the schema-qualified table name.');
            END IF;
            SELECT ds.* INTO d
              FROM dpsql.datasets ds JOIN pg_class c ON c.oid = ds.relid
             WHERE ds.dropped_at IS NULL AND c.relname = parts[1]
               AND ds.split_side IS DISTINCT FROM 'holdout'
               AND dpsql_internal._can_use_dataset(ds.dataset_id);
        END IF;
    END IF;
    IF d.dataset_id IS NULL AND NOT dpsql_internal._is_admin() THEN
        -- (as dpsql.budget_report says it)
        PERFORM dpsql_internal._fail(
            format('no dataset %s among the datasets you can use',
                   coalesce(quote_literal(_lookup_dataset.source), 'NULL')), '42704',
            hint => 'dpsql.budgets lists the datasets you can use.');
    ELSIF d.dataset_id IS NULL THEN
        PERFORM dpsql_internal._fail(
            format('%s is not a registered dataset; private training needs '
                   'dpsql.register_dataset by a data owner (dpsql_admin)',
                   coalesce(quote_literal(_lookup_dataset.source), 'NULL')), '42704');
    END IF;
    IF d.dropped_at IS NOT NULL THEN
        -- Its oid may since name another relation: never follow it.
        PERFORM dpsql_internal._fail(
            format('dataset %s was dropped at %s', quote_literal(d.name), d.dropped_at), '42P01',
            hint => 'dpsql.my_datasets lists the live datasets.');
    END IF;
    rel := dpsql_internal._check_dataset_relation(d.relid, format('dataset %s', quote_literal(d.name)));
    d.source := format('%I.%I', rel.nspname, rel.relname);
    RETURN d;
END $$;

-- The dataset a private training reads: as _lookup_dataset, and trainable. A regression
-- dataset registered without its label bound is not (regression => true): the linear mechanisms
-- calibrate to it, so a data owner sets it first (dpsql.estimate_label_bound).
CREATE OR REPLACE FUNCTION dpsql_internal._dataset_for_source(source text)
RETURNS dpsql.datasets LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d dpsql.datasets := dpsql_internal._lookup_dataset(source);
BEGIN
    IF d.labels IS NULL AND d.label_bound IS NULL THEN
        PERFORM dpsql_internal._fail(
            format('dataset %s is a regression dataset without a label bound yet',
                   quote_literal(d.name)), '55000',
            hint => 'A data owner sets it: dpsql.estimate_label_bound(dataset, epsilon, search_range).');
    END IF;
    RETURN d;
END $$;

-- Datasets whose relation is dropped are marked, so that a later relation that happens to get
-- the same oid is never taken for them (and the relation can be registered anew).
CREATE OR REPLACE FUNCTION dpsql_internal._mark_dropped_datasets()
RETURNS event_trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF to_regclass('dpsql.datasets') IS NULL THEN  -- the extension itself is being dropped
        RETURN;
    END IF;
    -- (recorded in dpsql.dataset_history, 55_dataset_admin.sql, once it exists: an upgrade
    -- script drops relations before creating it; the name is free again)
    IF to_regclass('dpsql.dataset_history') IS NULL THEN
        UPDATE dpsql.datasets ds SET dropped_at = now()
         WHERE ds.dropped_at IS NULL
           AND ds.relid IN (SELECT o.objid FROM pg_event_trigger_dropped_objects() o
                             WHERE o.classid = 'pg_class'::regclass AND o.objsubid = 0);
        RETURN;
    END IF;
    WITH marked AS (
        UPDATE dpsql.datasets ds SET dropped_at = now()
         WHERE ds.dropped_at IS NULL
           AND ds.relid IN (SELECT o.objid FROM pg_event_trigger_dropped_objects() o
                             WHERE o.classid = 'pg_class'::regclass AND o.objsubid = 0)
        RETURNING ds.dataset_id, ds.name)
    INSERT INTO dpsql.dataset_history (dataset_id, change)
    SELECT m.dataset_id, jsonb_build_object('relation_dropped', m.name) FROM marked m;
END $$;
-- (Created once: upgrade scripts replay this file, and event triggers have no OR REPLACE.)
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger
                    WHERE evtname = 'dpsql_mark_dropped_datasets') THEN
        CREATE EVENT TRIGGER dpsql_mark_dropped_datasets ON sql_drop
            EXECUTE FUNCTION dpsql_internal._mark_dropped_datasets();
    END IF;
END $$;
