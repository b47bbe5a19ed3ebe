------------------------------------------------------------------------------------------
-- Preparing sources
------------------------------------------------------------------------------------------

-- The relation a source names, or NULL (a query, or no such relation): a query is no valid
-- name, so to_regclass refuses it.
CREATE OR REPLACE FUNCTION dpsql_internal._source_regclass(source text)
RETURNS regclass LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN to_regclass(regexp_replace(source, ';\s*$', ''));
EXCEPTION WHEN OTHERS THEN
    RETURN NULL;
END $$;

-- FROM-clause text of a source: a table or view name (resolved, safely quoted) or a query.
CREATE OR REPLACE FUNCTION dpsql_internal._source_sql(source text)
RETURNS text LANGUAGE plpgsql STABLE
AS $$
DECLARE
    rel regclass;
    q text := regexp_replace(coalesce(source, ''), ';\s*$', '');
BEGIN
    IF btrim(q) = '' THEN
        PERFORM dpsql_internal._fail('source is empty');
    END IF;
    IF q ~* '^\s*(\(|select\s|with\s|values\s|table\s)' THEN
        RETURN '(' || q || ') AS src';
    END IF;
    rel := dpsql_internal._source_regclass(q);
    IF rel IS NULL THEN
        PERFORM dpsql_internal._fail(format('relation %s does not exist', quote_literal(q)), '42P01',
                            'Give a table or view name (schema-qualified if needed) or a SELECT query.');
    END IF;
    RETURN rel::text || ' AS src';
END $$;

-- SQL expression of the feature vector, and its dimension: declared (registered datasets: the
-- column types and dim are known, no row is read), else probed on the first row. Numeric
-- columns as float8, booleans as 0/1, and each categorical column (categories: its public
-- values) one-hot: one coordinate per value, all zero for a value not listed or NULL.
-- Public feature bounds (d x 2), when given, clip and rescale each coordinate onto [-1, 1].
CREATE OR REPLACE FUNCTION dpsql_internal._feature_sql(src text, features text[], bounds float8[] DEFAULT NULL,
                                   feature_types text[] DEFAULT NULL, declared_dim int DEFAULT NULL,
                                   categories jsonb DEFAULT NULL,
                                   OUT expr text, OUT dim int)
LANGUAGE plpgsql AS $$
DECLARE
    types text[] := feature_types;
    bad int;
BEGIN
    IF features IS NULL OR cardinality(features) = 0 OR array_ndims(features) <> 1
       OR array_position(features, NULL) IS NOT NULL THEN
        PERFORM dpsql_internal._fail('features must be a non-empty list of column names');
    END IF;
    IF types IS NULL THEN
        -- pg_typeof of a scalar subquery gives the column's type even when no row is read; an
        -- unknown column raises undefined_column here.
        SELECT 'SELECT ARRAY[' || string_agg(format('pg_typeof((SELECT %I FROM %s LIMIT 1))::text', f, src),
                                            ', ' ORDER BY i) || ']'
          INTO expr FROM unnest(features) WITH ORDINALITY AS t(f, i);
        EXECUTE expr INTO types;
    END IF;
    IF cardinality(features) = 1 AND types[1] LIKE '%[]' AND NOT coalesce(categories ? features[1], false) THEN
        IF types[1] NOT IN ('double precision[]', 'real[]', 'integer[]', 'bigint[]', 'smallint[]',
                            'numeric[]') THEN
            PERFORM dpsql_internal._fail(format('feature column %I has type %s, not a numeric array',
                                       features[1], types[1]), '42804');
        END IF;
        expr := format('%I::float8[]', features[1]);
        IF bounds IS NOT NULL THEN
            -- The declared dimension: no row is read to learn it.
            expr := format('dpsql_internal._apply_bounds(%s, %L::float8[])', expr, bounds::text);
            dim := array_length(bounds, 1);
            RETURN;
        END IF;
        IF declared_dim IS NOT NULL THEN
            dim := declared_dim;
            RETURN;
        END IF;
        EXECUTE format('SELECT array_length(%s, 1) FROM %s LIMIT 1', expr, src) INTO dim;
        IF dim IS NULL THEN
            PERFORM dpsql_internal._fail(format('the feature array column %I is NULL or empty in the first row',
                                       features[1]));
        END IF;
        RETURN;
    END IF;
    SELECT min(i) INTO bad FROM unnest(types) WITH ORDINALITY AS t(ty, i)
     WHERE ty NOT IN ('double precision', 'real', 'integer', 'bigint', 'smallint', 'numeric', 'boolean')
       AND NOT coalesce(categories ? features[i], false);
    IF bad IS NOT NULL THEN
        PERFORM dpsql_internal._fail(format('feature column %I has type %s: give several numeric columns or '
                                   'one float8[] column', features[bad], types[bad]), '42804',
                                   CASE WHEN types[bad] IN ('text', 'character varying', 'character')
                                        THEN 'A data owner registers a text column with its categories => {...}.' END);
    END IF;
    SELECT string_agg(CASE WHEN coalesce(categories ? f, false)
                           THEN dpsql_internal._one_hot_sql(f, dpsql_internal._category_values(categories, f))
                           WHEN types[i] = 'boolean' THEN format('ARRAY[%I::int::float8]', f)
                           ELSE format('ARRAY[%I::float8]', f) END,
                      ' || ' ORDER BY i),
           sum(CASE WHEN coalesce(categories ? f, false) THEN jsonb_array_length(categories->f) ELSE 1 END)
      INTO expr, dim FROM unnest(features) WITH ORDINALITY AS t(f, i);
    IF bounds IS NOT NULL THEN
        IF array_length(bounds, 1) <> dim THEN
            PERFORM dpsql_internal._fail(format('%s feature bounds for %s features', array_length(bounds, 1), dim));
        END IF;
        expr := format('dpsql_internal._apply_bounds(%s, %L::float8[])', expr, bounds::text);
    END IF;
END $$;

-- One-hot coordinates of a categorical column: 1 at the position of its value among the
-- public values, zeros for a value not listed or NULL (an expression of built-in and C calls:
-- no subquery per row, and Citus pushes it down to the shards).
CREATE OR REPLACE FUNCTION dpsql_internal._one_hot_sql(col text, vals text[])
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT format('dpsql_internal._one_hot(array_position(%L::text[], %I::text), %s)',
                  vals::text, col, cardinality(vals))
$$;

-- k coordinates, 1 at position p (NULL: all zero). In C: a SQL function has pinned settings
-- (85_pinned_settings.sql), so it is never inlined and would cost a call per row.
CREATE OR REPLACE FUNCTION dpsql_internal._one_hot(p int, k int)
RETURNS float8[] AS 'MODULE_PATHNAME', 'dpsql_one_hot_sql'
LANGUAGE C CALLED ON NULL INPUT IMMUTABLE PARALLEL SAFE;

-- SQL expression of the training label: +-1 for binary models, a class index for multinomial
-- The error of a label outside the declared set. IMMUTABLE (it is only ever called with the
-- row's value, so never folded at plan time) so that Citus pushes the fill down to the shards.
CREATE OR REPLACE FUNCTION dpsql_internal._bad_label(value text, labels text)
RETURNS float8 LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN dpsql_internal._fail(format('label %s is not in the declared label set %s', value, labels));
END $$;

-- and one-vs-rest (3 or more labels). strict => false (private runs): a label outside the set is
-- NULL, which the aggregate turns into a null record instead of an error revealing the value.
-- label_values: a text label's public values, read as classes 0, 1, ... (labels {0, 1, ...}).
CREATE OR REPLACE FUNCTION dpsql_internal._label_sql(model text, label text, labels float8[], strict boolean DEFAULT true,
                                                     label_values text[] DEFAULT NULL)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    bad text := 'NULL::float8';
    y text := CASE WHEN label_values IS NOT NULL
                   THEN format('(array_position(%L::text[], %I::text) - 1)::float8', label_values::text, label)
                   ELSE format('%I::float8', label) END;
BEGIN
    IF label IS NULL THEN
        PERFORM dpsql_internal._fail('label must name a column');
    END IF;
    IF strict THEN
        bad := format('dpsql_internal._bad_label(coalesce(%I::text, ''NULL''), %L)', label,
                      coalesce(label_values::text, labels::text, '(any number)'));
    END IF;
    IF model = 'linear' THEN
        RETURN format('coalesce(%s, %s)', y, bad);
    ELSIF model = 'multinomial' OR cardinality(labels) > 2 THEN
        RETURN format('coalesce((array_position(%L::float8[], %s) - 1)::float8, %s)',
                      labels::text, y, bad);
    END IF;
    RETURN format('CASE %s WHEN %s THEN -1::float8 WHEN %s THEN 1::float8 ELSE %s END',
                  y, labels[1], labels[2], bad);
END $$;

-- The Huber loss's smoothing width of a run's parameters or spec: dpsql.train's default, 0.1,
-- when absent (the one place in SQL; sql/mechanisms/parameters.toml records it, and a test
-- holds it equal to dpsql.train's signature).
CREATE OR REPLACE FUNCTION dpsql_internal._huber_h(params jsonb)
RETURNS float8 LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce((params->>'huber_h')::float8, 0.1)
$$;

-- The canonical name of a model (aliases accepted by the C core's loss names).
CREATE OR REPLACE FUNCTION dpsql_internal._canonical_model(model text)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT (ARRAY['logistic', 'linear', 'huber', 'multinomial'])[dpsql_internal._loss_code(model)]
$$;

-- Canonical model name and checked public label set.
CREATE OR REPLACE FUNCTION dpsql_internal._check_labels(model text, labels float8[], OUT canonical text, OUT checked float8[])
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    canonical := dpsql_internal._canonical_model(model);
    IF canonical IS NULL THEN
        PERFORM dpsql_internal._fail('model must be logistic, linear, huber or multinomial, got NULL');
    END IF;
    IF canonical = 'linear' THEN
        IF labels IS NOT NULL THEN
            PERFORM dpsql_internal._fail('labels apply to classification models only');
        END IF;
        RETURN;
    END IF;
    IF canonical IN ('logistic', 'huber') THEN
        -- Two labels: one binary model; three or more: one-vs-rest, one binary model per class.
        checked := coalesce(labels, '{-1,1}');
        IF cardinality(checked) < 2 OR cardinality(checked) > 1024 THEN
            PERFORM dpsql_internal._fail(format('%s models need labels => {negative, positive} (or 3 to 1024 '
                                       'classes for one-vs-rest), got %s', canonical, checked));
        END IF;
    ELSIF labels IS NULL THEN
        PERFORM dpsql_internal._fail('multinomial models need labels => the public list of classes');
    ELSE
        checked := labels;
        IF cardinality(checked) < 2 OR cardinality(checked) > 1024 THEN
            PERFORM dpsql_internal._fail('multinomial models need 2 to 1024 classes');
        END IF;
    END IF;
    IF array_ndims(checked) <> 1
       OR EXISTS (SELECT 1 FROM unnest(checked) v WHERE v IS NULL OR v IN ('NaN', 'Infinity', '-Infinity'))
       OR (SELECT count(DISTINCT v) FROM unnest(checked) v) <> cardinality(checked) THEN
        PERFORM dpsql_internal._fail(format('labels must be distinct finite numbers, got %s', checked));
    END IF;
END $$;
