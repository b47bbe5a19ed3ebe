------------------------------------------------------------------------------------------
-- What a registration finds in the rows (issue 27)
--
-- A data owner may read the rows, so checking them against the declarations costs no
-- privacy: registration counts, in one scan read as private training reads them, the rows
-- training would drop (a NULL or non-finite number, a label outside the declared set), the
-- categorical values outside the declared categories (encoded as zeros), the values outside
-- the feature bounds or the label bound (clipped), and, without feature bounds, the rows that
-- row normalisation scales down. The counts go to the data owner alone (a NOTICE, never
-- stored: analysts see the dataset). Any row that training would drop, encode as zeros or clip
-- refuses the registration (nothing is registered) unless the owner accepts them (accept =>
-- true); rows scaled by row_norm only warn.
------------------------------------------------------------------------------------------

-- The checks of a registration's rows, each a boolean SQL expression over the registered
-- columns, and their names: missing (rows training drops), label or label_bound, category <c>
-- per categorical feature, bounds (declared feature bounds; estimate's are not checked) or
-- norm (rows row_norm scales down).
CREATE OR REPLACE FUNCTION dpsql_internal._registration_checks(ds dpsql.datasets, estimate jsonb,
                                                               OUT names text[], OUT checks text[])
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    as_text text[] := dpsql_internal._text_columns(ds);
    array_feature boolean := dpsql_internal._array_feature(ds);
    numeric_cols text[] := ARRAY(SELECT c FROM unnest(ds.features) c WHERE c <> ALL (as_text));
    lbl text := quote_ident(ds.label);
    bounds_given boolean := ds.feature_bounds IS NOT NULL AND NOT coalesce(estimate ? 'feature_bounds', false);
    f text;
BEGIN
    names := '{}';
    checks := '{}';
    -- rows training drops: a NULL or non-finite number, or a label outside the set
    names := names || 'missing'::text;
    checks := checks || (SELECT coalesce(string_agg(format(CASE WHEN array_feature AND c = ds.features[1]
                                                       THEN '%1$I IS NULL OR cardinality(%1$I) <> %2$s OR array_position(%1$I, NULL) IS NOT NULL OR ''NaN'' = ANY (%1$I) OR ''Infinity'' = ANY (%1$I) OR ''-Infinity'' = ANY (%1$I)'
                                                       ELSE '%1$I IS NULL OR %1$I IN (''NaN'', ''Infinity'', ''-Infinity'')' END,
                                                  c, ds.dim), ' OR '), 'false')
                           FROM unnest(numeric_cols || CASE WHEN ds.label_values IS NULL THEN ARRAY[ds.label] END) c);
    IF ds.label_values IS NOT NULL THEN
        checks[cardinality(checks)] := format('(%s) OR %s IS NULL', checks[cardinality(checks)], lbl);
    END IF;
    IF ds.labels IS NOT NULL THEN
        names := names || 'label'::text;
        checks := checks || CASE WHEN ds.label_values IS NOT NULL
                                 THEN format('%s <> ALL (%L::text[])', lbl, ds.label_values)
                                 ELSE format('%s <> ALL (%L::float8[])', lbl, ds.labels) END;
    ELSIF ds.label_bound IS NOT NULL THEN
        names := names || 'label_bound'::text;
        checks := checks || format('abs(%s) > %s', lbl, ds.label_bound);
    END IF;
    FOREACH f IN ARRAY ARRAY(SELECT k FROM jsonb_object_keys(coalesce(ds.categories, '{}')) k ORDER BY k) LOOP
        names := names || ('category ' || f);
        checks := checks || format('%I IS NULL OR %I <> ALL (%L::text[])', f, f,
                                   dpsql_internal._category_values(ds.categories, f));
    END LOOP;
    IF bounds_given THEN
        names := names || 'bounds'::text;
        checks := checks || CASE WHEN array_feature
            THEN format('EXISTS (SELECT 1 FROM unnest(%I) WITH ORDINALITY u(v, i) WHERE v < (%L::float8[])[i][1] OR v > (%L::float8[])[i][2])',
                        ds.features[1], ds.feature_bounds, ds.feature_bounds)
            ELSE (SELECT coalesce(string_agg(format('%I < %s OR %I > %s', c, ds.feature_bounds[k][1], c,
                                                    ds.feature_bounds[k][2]), ' OR '), 'false')
                    FROM (SELECT c, (SELECT sum(CASE WHEN coalesce(ds.categories ? p, false)
                                                     THEN jsonb_array_length(ds.categories->p) ELSE 1 END)
                                       FROM unnest(ds.features[:o]) p)::int AS k
                            FROM unnest(ds.features) WITH ORDINALITY u(c, o)) s
                   WHERE c = ANY (numeric_cols)) END;
    ELSIF ds.row_norm IN ('clip', 'unit') AND cardinality(numeric_cols) > 0 THEN
        names := names || 'norm'::text;
        checks := checks || format('sqrt(%s) > 1',
                                   CASE WHEN array_feature
                                        THEN format('(SELECT sum(v * v) FROM unnest(%I) v)', ds.features[1])
                                        ELSE (SELECT string_agg(format('coalesce(%I, 0) ^ 2', c), ' + ')
                                                FROM unnest(numeric_cols) c) END);
    END IF;

END $$;

-- One line per check that found rows (counts, in the order of names), with the values found
-- for a label or a category; refused when any but norm found rows, padded when some values
-- differ from declared ones only by white space.
CREATE OR REPLACE FUNCTION dpsql_internal._registration_finding_lines(ds dpsql.datasets, names text[],
                                                                      checks text[], counts bigint[],
                                                                      OUT lines text[], OUT refused boolean,
                                                                      OUT padded boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lbl text := quote_ident(ds.label);
    outside text;
    declared text[];
    spaced boolean;
BEGIN
    lines := '{}';
    refused := false;
    padded := false;
    FOR i IN 1..cardinality(names) LOOP
        CONTINUE WHEN counts[i] = 0;
        IF names[i] = 'label' OR names[i] LIKE 'category %' THEN
            -- the values found, text quoted (a leading space shows), the commonest first; and
            -- whether some differ from a declared value only by surrounding white space
            declared := CASE WHEN names[i] = 'label' THEN coalesce(ds.label_values, ds.labels::text[])
                             ELSE dpsql_internal._category_values(ds.categories, substr(names[i], 10)) END;
            EXECUTE format('SELECT string_agg(format(''%%s (%%s rows)'', coalesce(%s, ''NULL''), c), '', ''),'
                           ' coalesce(bool_or(btrim(v) = ANY (%L::text[])), false) FROM '
                           '(SELECT %s::text AS v, count(*) AS c FROM %s WHERE %s GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 5) s',
                           CASE WHEN names[i] = 'label' AND ds.label_values IS NULL THEN 'v' ELSE 'quote_literal(v)' END,
                           declared, CASE WHEN names[i] = 'label' THEN lbl ELSE quote_ident(substr(names[i], 10)) END,
                           dpsql_internal._private_from(ds), checks[i]) INTO outside, spaced;
            padded := padded OR spaced;
        END IF;
        refused := refused OR names[i] <> 'norm';
        lines := lines || CASE
            WHEN names[i] = 'missing' THEN format('%s rows with a NULL or non-finite number (training drops them)', counts[i])
            WHEN names[i] = 'label' THEN format('%s rows with a label outside %s (training drops them): %s',
                                                counts[i], coalesce(ds.label_values::text, ds.labels::text), outside)
            WHEN names[i] = 'label_bound' THEN format('%s rows with |label| > label_bound %s (training clips them)',
                                                      counts[i], ds.label_bound)
            WHEN names[i] = 'bounds' THEN format('%s rows with a feature outside feature_bounds (training clips them)', counts[i])
            WHEN names[i] = 'norm' THEN format('%s rows with norm > 1, which row_norm %s scales down: without feature_bounds, '
                                               'features on large scales dominate', counts[i], ds.row_norm)
            ELSE format('%s rows with %s outside its categories or NULL (encoded as zeros): %s',
                        counts[i], substr(names[i], 10), outside) END;
    END LOOP;
END $$;

-- One finding per line: (what, rows, what training does with them, a hint).
CREATE OR REPLACE FUNCTION dpsql_internal._registration_findings(dataset_id bigint, accept boolean,
                                                                estimate jsonb)
RETURNS void LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ds dpsql.datasets;
    checks text[];
    names text[];
    counts bigint[];
    n bigint;
    lines text[];
    refused boolean;
    padded boolean;
BEGIN
    SELECT * INTO ds FROM dpsql.datasets d WHERE d.dataset_id = _registration_findings.dataset_id;
    PERFORM dpsql_internal._unit_findings(ds);
    ds.privacy_unit := NULL;  -- the checks count rows, not a unit's slots
    IF NOT dpsql_internal._runs_no_code(ds.relid) AND (dpsql_internal._citus_layout(ds.relid)).dist_column IS NULL
       AND dpsql_internal._reads_citus(NULL, ds.relid) THEN
        -- a view over distributed tables: private training refuses it (30_runs.sql), and its
        -- reader cannot reach the workers
        RAISE WARNING 'dpsql: the rows of % were not checked: it reads Citus distributed tables through a view, '
                      'which private training refuses', ds.source
            USING HINT = 'Register the distributed table itself.';
        RETURN;
    END IF;
    SELECT c.names, c.checks INTO names, checks FROM dpsql_internal._registration_checks(ds, estimate) c;
    EXECUTE format('SELECT count(*), ARRAY[%s] FROM %s',
                   (SELECT string_agg(format('count(*) FILTER (WHERE coalesce(%s, false))', c), ', ')
                      FROM unnest(checks) c),
                   dpsql_internal._private_from(ds))
       INTO n, counts;

    SELECT l.lines, l.refused, l.padded INTO lines, refused, padded
      FROM dpsql_internal._registration_finding_lines(ds, names, checks, counts) l;
    IF refused AND NOT accept THEN
        PERFORM dpsql_internal._fail(
            format('%s: of %s rows, %s', ds.source, n, array_to_string(lines, '; ')), '22000',
            hint => CASE WHEN 'label' = ANY (names) AND counts[array_position(names, 'label')] > 0
                         THEN 'Declare the label column''s values: labels => ARRAY[...] (binary: the negative class first). '
                         ELSE '' END
                    || CASE WHEN padded
                            THEN 'Some values differ from the declared ones only by the spaces around them (shown quoted): '
                                 'trim the column (UPDATE ... SET c = btrim(c)). '
                            ELSE '' END
                    || 'Fix the rows or the declarations, or pass accept => true to register them as they are. '
                    || 'Nothing was registered.');
    END IF;
    IF 'norm' = ANY (names) AND counts[array_position(names, 'norm')] > 0 THEN
        RAISE WARNING 'dpsql: %: of % rows, %', ds.source, n, array_to_string(lines, '; ')
            USING HINT = 'Declare feature_bounds (public (lo, hi) per numeric feature), or estimate them: '
                         'estimate => {"feature_bounds": ...}.';
    ELSIF cardinality(lines) > 0 THEN
        RAISE WARNING 'dpsql: %: of % rows, % (accepted)', ds.source, n, array_to_string(lines, '; ');
    ELSE
        RAISE NOTICE 'dpsql: % registered: % rows match the declarations', ds.source, n;
    END IF;
END $$;
