------------------------------------------------------------------------------------------
-- Holdout splits (issue 44): register_dataset(..., holdout => f, key => 'id') registers one
-- relation as two datasets with budgets of their own: '<name>' (training) and
-- '<name>_holdout' (validation and test: private evaluation, tune's scoring).
--
-- A row is in the holdout when U(key) < f, U(key) in [0, 1) the first 52 bits of
-- SHA-256(s || SHA-256(s || key)) for a 256-bit secret s drawn at registration (never shown):
-- a pseudorandom function of the row's key, independent of every other value of the row.
-- Rows with a NULL key are in neither dataset.
--
-- Why the two budgets compose in parallel (docs/privacy.md, "Holdout splits"): the key is
-- the row's public identity (a surrogate id, not a sensitive value), and dpsql's neighbouring
-- datasets replace one row's values, which here keeps its key. The side of every key is fixed
-- by s and the keys alone, so two neighbouring relations give neighbouring training datasets
-- and identical holdouts, or identical training datasets and neighbouring holdouts; each
-- side's row count is a function of the keys (public). Every release reads one side, so a
-- change of one row is seen by one side's releases only, and the whole is (max(e1, e2),
-- max(d1, d2))-DP (parallel composition, McSherry, "Privacy integrated queries", SIGMOD
-- 2009, s. 2.3).
------------------------------------------------------------------------------------------

-- The split's secret, kept by the training dataset (the extension owner's: nobody reads it).
CREATE TABLE IF NOT EXISTS dpsql_internal.split_secrets (
    dataset_id  bigint PRIMARY KEY REFERENCES dpsql.datasets ON DELETE CASCADE,
    secret      bytea NOT NULL
);

-- U(key): the first 52 bits of the nested SHA-256 as a number in [0, 1) (header).
CREATE OR REPLACE FUNCTION dpsql_internal._split_unit(key text, secret bytea)
RETURNS float8 LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT ('x' || left(encode(sha256(secret || sha256(secret || convert_to(key, 'UTF8'))), 'hex'), 13))::bit(52)::bigint
           / 4503599627370496::float8
$$;

-- A key column's value as text, in SQL (the holdout's key, the privacy unit): built-in
-- integer, text and uuid types only (their casts to text are built in: no cast or function a
-- data owner created is resolved), checked at every read, since the column may have changed
-- since registration. what names the column's role in errors.
CREATE OR REPLACE FUNCTION dpsql_internal._key_text_sql(relid regclass, key text, what text)
RETURNS text LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    base oid;
BEGIN
    SELECT dpsql_internal._base_type(a.atttypid) INTO base
      FROM pg_attribute a
     WHERE a.attrelid = relid AND a.attname = _key_text_sql.key AND a.attnum > 0 AND NOT a.attisdropped;
    IF base IS NULL THEN
        PERFORM dpsql_internal._fail(format('%s has no column %s (%s)', relid, quote_ident(key), what),
                                     '42703');
    END IF;
    IF base NOT IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype, 'text'::regtype,
                    'varchar'::regtype, 'bpchar'::regtype, 'uuid'::regtype) THEN
        PERFORM dpsql_internal._fail(
            format('%s column %s of %s has type %s', what, quote_ident(key), relid,
                   format_type(base, NULL)), '42804',
            hint => 'A key column is an integer, text or uuid column (a row or person id).');
    END IF;
    RETURN format('%I::%s::pg_catalog.text', key, base::regtype);
END $$;

CREATE OR REPLACE FUNCTION dpsql_internal._split_key_sql(relid regclass, key text)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT dpsql_internal._key_text_sql(relid, key, 'the holdout''s key')
$$;

-- The condition that keeps a dataset's side of its split, on the key's text column (alias)
-- of the inner read; '' for an unsplit dataset. The secret is read by a subquery (evaluated
-- once), never written into the statement's text (errors show statements).
CREATE OR REPLACE FUNCTION dpsql_internal._split_condition(ds dpsql.datasets, key_column text)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN ds.split_side IS NULL THEN ''
                ELSE format('dpsql_internal._split_unit(%s, (SELECT s.secret FROM dpsql_internal.split_secrets s '
                            'WHERE s.dataset_id = %s)) %s %s', key_column,
                            coalesce(ds.split_of, ds.dataset_id),
                            CASE ds.split_side WHEN 'holdout' THEN '<' ELSE '>=' END,
                            ds.split_fraction) END
$$;

-- register_dataset's holdout and key, checked before anything is written: the fraction in
-- (0, 1), the key column (given, else the table's one-column primary key), its type; not on
-- a Citus distributed table (its runs read the shards, not this split). Returns the key.
CREATE OR REPLACE FUNCTION dpsql_internal._check_holdout(relid regclass, holdout float8, key text,
                                                        name text, features text[], label text)
RETURNS text LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    k text := key;
BEGIN
    IF holdout IS NULL THEN
        IF key IS NOT NULL THEN
            PERFORM dpsql_internal._fail('key is the holdout''s: give holdout => a fraction too',
                                         hint => 'e.g. holdout => 0.2, key => ''id''');
        END IF;
        RETURN NULL;
    END IF;
    IF NOT (holdout > 0 AND holdout < 1) THEN
        PERFORM dpsql_internal._fail(format('holdout must be a fraction in (0, 1), got %s', holdout),
                                     hint => 'The share of rows held out, e.g. 0.2.');
    END IF;
    IF k IS NULL THEN  -- the primary key, when it is one column
        SELECT a.attname INTO k
          FROM pg_index x JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0]
         WHERE x.indrelid = relid AND x.indisprimary AND x.indnkeyatts = 1;
        IF k IS NULL THEN
            PERFORM dpsql_internal._fail(format('holdout needs a key column: %s has no one-column primary key', relid),
                                         hint => 'Name a row id column: key => ''id'' (integer, text or uuid).');
        END IF;
    END IF;
    IF k = ANY (features || label) THEN
        PERFORM dpsql_internal._fail(format('the holdout''s key %s is a registered feature or label', quote_ident(k)),
                                     hint => 'The key is a public row id; it is never trained on.');
    END IF;
    PERFORM dpsql_internal._split_key_sql(relid, k);
    IF (dpsql_internal._citus_layout(relid)).dist_column IS NOT NULL THEN
        PERFORM dpsql_internal._fail(format('a holdout of the Citus distributed table %s is not supported', relid),
                                     '0A000', 'Split it into two tables and register each.');
    END IF;
    PERFORM dpsql_internal._check_dataset_name(name || '_holdout');
    IF EXISTS (SELECT 1 FROM dpsql.datasets ds WHERE ds.name = _check_holdout.name || '_holdout' AND ds.dropped_at IS NULL) THEN
        PERFORM dpsql_internal._fail(format('a dataset named %s is already registered', quote_literal(name || '_holdout')),
                                     '42710', hint => 'Choose another name => ... for the dataset.');
    END IF;
    RETURN k;
END $$;

-- The holdout of a training dataset just registered with its split (same declarations and
-- budget; its own ledger): its secret drawn (gen_random_uuid's strong randomness), the
-- dataset inserted. Returns its id.
CREATE OR REPLACE FUNCTION dpsql_internal._register_holdout(train_id bigint)
RETURNS bigint LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    id bigint;
BEGIN
    INSERT INTO dpsql_internal.split_secrets (dataset_id, secret)
    VALUES (train_id, uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid())
                      || uuid_send(gen_random_uuid()));
    INSERT INTO dpsql.datasets (name, relid, source, features, label, labels, feature_bounds,
                                row_norm, epsilon_budget, delta_budget, label_bound, row_bound,
                                dim, composition, categories, label_values,
                                split_side, split_key, split_fraction, split_of, privacy_unit,
                                max_rows_per_unit)
    SELECT d.name || '_holdout', d.relid, d.source, d.features, d.label, d.labels, d.feature_bounds,
           d.row_norm, d.epsilon_budget, d.delta_budget, d.label_bound, d.row_bound,
           d.dim, d.composition, d.categories, d.label_values,
           'holdout', d.split_key, d.split_fraction, d.dataset_id, d.privacy_unit, d.max_rows_per_unit
      FROM dpsql.datasets d WHERE d.dataset_id = train_id
    RETURNING dataset_id INTO id;
    RETURN id;
END $$;

-- After the registration's private estimates: the holdout takes the training dataset's
-- bounds, public from their release on.
CREATE OR REPLACE FUNCTION dpsql_internal._holdout_takes_bounds(train_id bigint)
RETURNS void LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE dpsql.datasets h
       SET feature_bounds = t.feature_bounds, label_bound = t.label_bound, row_bound = t.row_bound
      FROM dpsql.datasets t
     WHERE t.dataset_id = train_id AND h.split_of = train_id AND h.dropped_at IS NULL
$$;
