------------------------------------------------------------------------------------------
-- Private exploratory statistics (issue 44, item 4): dpsql.describe(dataset, epsilon, delta,
-- features) releases, for an analyst granted a dataset (no SELECT on its table), each
-- column's
--   numeric feature (within its public bounds [lo, hi]): mean, stddev, quantile 0.1 0.25 0.5
--     0.75 0.9, histogram over B = 10 equal public bins of [lo, hi];
--   categorical feature: frequency (count) of each public category;
--   label: frequency of each public label (classification), or mean, stddev and quantiles of
--     [-label_bound, label_bound] (regression);
-- and the public row count m, as one release: one ledger entry (mechanism 'describe') whose
-- dp_event is the ComposedDpEvent of the parts.
--
-- Neighbours are replace-one and m is public (docs/privacy.md). Every value is first mapped
-- (a per-record map: free) to t = (clamp(v, lo, hi) - lo) / (hi - lo) in [0, 1]; a missing
-- value (NULL, NaN) is in no count and sits at the midpoint (t = 1/2) in the sums.
--
-- The public split of epsilon (basic composition; docs/describe.md): each of the k columns
-- described gets epsilon / k. Of a numeric column's share: mean 0.2, stddev 0.2, histogram
-- 0.2, each of the 5 quantiles 0.08. A counted column (categorical, classification label)
-- spends its share on its frequencies. With delta > 0 the mean and stddev shares of all
-- numeric columns are pooled into one Gaussian release of their sums (below), at that delta.
--
-- The statistics and their replace-one sensitivities (delta = 0: integer noise only, no
-- floating-point noise is released):
--   mean: S1 = sum of A = round((2t - 1) H), H = 2^15, A in [-H, H]: sensitivity 2H; S1 plus
--     discrete Laplace of scale 2H / eps_mean; mean = mid + half (S1 + noise) / (H m).
--   stddev: S2 = sum of A^2 in [0, H^2]: sensitivity H^2; scale H^2 / eps_stddev;
--     variance = half^2 max(0, (S2 + noise) / (H^2 m) - mean_a^2), post-processing of the
--     two noisy sums.
--   histogram and frequency: one count per bin or category; replacing one row moves one
--     record out of a bin and into another: L1 sensitivity 2; scale 2 / eps.
--   quantile: the scan of 27_estimate_bounds.sql (AboveThreshold on monotone counts, Dwork and
--     Roth 2014 s. 3.6), epsilon-DP per quantile whatever the grid, on the public grid
--     t in {0, 1/G, ..., 1}, G = 256; upward (q >= 0.5) or downward from 1 (q < 0.5, as the
--     bounds' lower quantile), so its early stop errs towards the middle. The five values are
--     then sorted (post-processing).
--   delta > 0: the vector, over the numeric columns, of (2t - 1, (2t - 1)^2 - 1/2) per row
--     has norm at most C = sqrt(5 n / 4) (n numeric columns): replace-one L2 sensitivity
--     2C = sqrt(5 n). N(0, sigma^2) on each sum, sigma = dpsql.gaussian_sigma(2C, eps_g,
--     delta) (analytic Gaussian, Balle and Wang 2018), is GaussianDpEvent(sigma / C) in the
--     ledger's convention (dpsql/ledger_events.py).
-- Each pure part is recorded as EpsilonDelta(eps, 0): the discrete Laplace's privacy loss on
-- an integer count of sensitivity s at scale s / eps is +-eps, the worst pair of eps-DP, so
-- no tighter event holds (dp-accounting's LaplaceDpEvent is the continuous one).
-- noise_sd: the standard deviation of each value's noise (mean, histogram, frequency: exact;
-- stddev: the delta method at the released values; quantile: NULL, the scan's error is not a
-- noise added to the value). A scale below 0.01 reports the sd of 0.01 (< 1e-21): exp's
-- underflow is an error, and no error may follow the charge.
------------------------------------------------------------------------------------------

-- The public constants: H (the sums' integer grid), G (the quantiles' grid), B (histogram
-- bins), the quantiles, and the split of a numeric column's share.
CREATE OR REPLACE FUNCTION dpsql_internal._describe_constants(
    OUT sum_grid int, OUT quantile_grid int, OUT bins int, OUT quantiles float8[],
    OUT mean_share float8, OUT stddev_share float8, OUT histogram_share float8,
    OUT quantile_share float8)
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 32768, 256, 10, '{0.1,0.25,0.5,0.75,0.9}'::float8[], 0.2::float8, 0.2::float8, 0.2::float8,
           0.08::float8
$$;

-- The standard deviation of discrete Laplace noise of scale t (P(k) ~ exp(-|k| / t)):
-- sqrt(2 q) / (1 - q), q = exp(-1/t); 1 - q by its series when 1/t is small (no cancellation).
-- (One definition for describe and the private evaluate, 61_private_evaluate.sql.)
CREATE OR REPLACE FUNCTION dpsql_internal._discrete_laplace_sd(t float8)
RETURNS float8 LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    -- (exp underflows to an error below -745: the sd is 0 to float8 long before)
    SELECT CASE WHEN x > 700 THEN 0::float8
                ELSE sqrt(2 * exp(-x)) / CASE WHEN x < 1e-4 THEN x * (1 - x / 2 + x * x / 6)
                                              ELSE 1 - exp(-x) END END
      FROM (SELECT 1 / greatest(t, 1e-200) AS x) s
$$;

-- The dataset's columns in order, as describe names them: the features (an array column's
-- elements as x[1], ..., x[d]) and the label last; row_of is each one's row of feature_bounds
-- (NULL: a categorical feature or the label).
CREATE OR REPLACE FUNCTION dpsql_internal._describe_layout(ds dpsql.datasets, OUT names text[],
                                                           OUT row_of int[])
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    f text;
    r int := 0;
BEGIN
    names := '{}';
    row_of := '{}';
    IF dpsql_internal._array_feature(ds) THEN
        IF ds.dim IS NULL THEN
            PERFORM dpsql_internal._fail(format('dataset %s was registered without a known dimension', ds.name),
                                         hint => 'The data owner declares feature_bounds (d rows).');
        END IF;
        FOR i IN 1..ds.dim LOOP
            names := names || format('%s[%s]', ds.features[1], i);
            row_of := row_of || i;
        END LOOP;
    ELSE
        FOREACH f IN ARRAY ds.features LOOP
            names := names || f;
            IF coalesce(ds.categories ? f, false) THEN
                row_of := row_of || NULL::int;
                r := r + jsonb_array_length(ds.categories->f);
            ELSE
                r := r + 1;
                row_of := row_of || r;
            END IF;
        END LOOP;
    END IF;
    names := names || ds.label;
    row_of := row_of || NULL::int;
END $$;

-- The names (of _describe_layout's) a describe reads: all of them when features is NULL, else
-- those named in features (an array column's name: all its elements), checked, in names' order.
CREATE OR REPLACE FUNCTION dpsql_internal._describe_wanted(ds dpsql.datasets, names text[], features text[])
RETURNS text[] LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    is_array boolean := dpsql_internal._array_feature(ds);
    unknown text;
BEGIN
    IF _describe_wanted.features IS NULL THEN
        RETURN names;
    END IF;
    IF cardinality(_describe_wanted.features) = 0 OR array_position(_describe_wanted.features, NULL) IS NOT NULL
       OR (SELECT count(DISTINCT u) FROM unnest(_describe_wanted.features) u)
          <> cardinality(_describe_wanted.features) THEN
        PERFORM dpsql_internal._fail(format('features must be distinct column names, got %s',
                                            _describe_wanted.features),
                                     hint => 'NULL describes every feature and the label.');
    END IF;
    SELECT string_agg(quote_literal(u), ', ') INTO unknown FROM unnest(_describe_wanted.features) u
     WHERE u <> ALL (names) AND NOT (is_array AND u = ds.features[1]);
    IF unknown IS NOT NULL THEN
        PERFORM dpsql_internal._fail(format('dataset %s has no column %s', quote_literal(ds.name), unknown),
                                     '42703',
                                     hint => format('Its registered columns: %s.',
                                                    array_to_string(CASE WHEN is_array
                                                        THEN ARRAY[ds.features[1] || '[1..' || ds.dim || ']', ds.label]
                                                        ELSE ds.features || ds.label END, ', ')));
    END IF;
    RETURN ARRAY(SELECT n FROM unnest(names) WITH ORDINALITY AS t(n, k)
                  WHERE n = ANY (_describe_wanted.features)
                     OR (is_array AND n <> ds.label AND ds.features[1] = ANY (_describe_wanted.features))
                  ORDER BY k);
END $$;

-- The columns a describe reads, public and checked (before any charge): the dataset's features
-- (an array column's elements as x[1], ..., x[d]) and its label, in that order, or those named
-- in features. kind: numeric (bounds lo, hi), categorical or classes (keys: the public values,
-- compared as text when as_text, else as float8). expr reads the value from the FROM item src.
CREATE OR REPLACE FUNCTION dpsql_internal._describe_columns(ds dpsql.datasets, features text[])
RETURNS TABLE (feature text, kind text, expr text, lo float8, hi float8, keys text[], as_text boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fb float8[] := ds.feature_bounds;
    r1 int := array_lower(ds.feature_bounds, 1);
    c1 int := array_lower(ds.feature_bounds, 2);
    is_array boolean := dpsql_internal._array_feature(ds);
    layout record := dpsql_internal._describe_layout(ds);
    names text[] := layout.names;
    row_of int[] := layout.row_of;  -- each name's row of feature_bounds (NULL: categorical or label)
    wanted text[] := dpsql_internal._describe_wanted(ds, layout.names, features);
    missing text;
BEGIN
    -- numeric features need their public bounds; a regression label its label bound
    SELECT string_agg(n, ', ') INTO missing FROM unnest(names, row_of) AS t(n, rw)
     WHERE n = ANY (wanted) AND rw IS NOT NULL AND fb IS NULL;
    IF missing IS NOT NULL THEN
        PERFORM dpsql_internal._fail(
            format('dataset %s has no public bounds for %s: describe reads numeric features within '
                   'their declared bounds', quote_literal(ds.name), missing), '55000',
            hint => 'The data owner declares feature_bounds, or estimates them privately with '
                    'dpsql.estimate_bounds; or describe the other columns (features => ...). '
                    'Nothing was charged.');
    END IF;
    IF ds.label = ANY (wanted) AND ds.labels IS NULL AND ds.label_bound IS NULL THEN
        PERFORM dpsql_internal._fail(
            format('dataset %s has no label bound for %s', quote_literal(ds.name), ds.label), '55000',
            hint => 'The data owner declares label_bound, or estimates it privately with '
                    'dpsql.estimate_label_bound; or describe the features only. Nothing was charged.');
    END IF;
    FOR i IN 1..cardinality(names) LOOP
        CONTINUE WHEN names[i] <> ALL (wanted);
        feature := names[i];
        keys := NULL;
        lo := NULL;
        hi := NULL;
        as_text := false;
        IF i = cardinality(names) THEN  -- the label
            expr := format('src.%I', ds.label);
            IF ds.labels IS NULL THEN
                kind := 'numeric';
                lo := -ds.label_bound;
                hi := ds.label_bound;
            ELSE
                kind := 'classes';
                as_text := ds.label_values IS NOT NULL;
                keys := coalesce(ds.label_values, ds.labels::text[]);
            END IF;
        ELSIF row_of[i] IS NULL THEN
            kind := 'categorical';
            expr := format('src.%I', names[i]);
            keys := dpsql_internal._category_values(ds.categories, names[i]);
            as_text := true;
        ELSE
            kind := 'numeric';
            expr := CASE WHEN is_array THEN format('src.%I[%s]', ds.features[1], i)
                         ELSE format('src.%I', names[i]) END;
            lo := fb[r1 + row_of[i] - 1][c1];
            hi := fb[r1 + row_of[i] - 1][c1 + 1];
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;

-- The public plan of a describe: each statistic's epsilon (the split, header), the noise
-- scales, and the release's DpEvent. n_numeric numeric and n_counted counted columns.
CREATE OR REPLACE FUNCTION dpsql_internal._describe_plan(n_numeric int, n_counted int, epsilon float8,
                                                         delta float8)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c record := dpsql_internal._describe_constants();
    eps_column float8 := epsilon / (n_numeric + n_counted);
    eps_mean float8 := c.mean_share * eps_column;
    eps_stddev float8 := c.stddev_share * eps_column;
    eps_histogram float8 := c.histogram_share * eps_column;
    eps_quantile float8 := c.quantile_share * eps_column;
    eps_gaussian float8;
    sensitivity float8;
    sigma float8;
    parts jsonb := '[]';
    plan jsonb;
BEGIN
    plan := jsonb_build_object(
        'epsilon_per_column', eps_column, 'numeric_columns', n_numeric, 'counted_columns', n_counted,
        'quantiles', to_jsonb(c.quantiles), 'histogram_bins', c.bins, 'quantile_grid', c.quantile_grid,
        'sum_grid', c.sum_grid);
    IF n_counted > 0 THEN
        plan := plan || jsonb_build_object('frequency', jsonb_build_object(
            'epsilon', eps_column, 'noise', 'discrete_laplace', 'scale', 2 / eps_column));
        parts := parts || jsonb_build_object('type', 'SelfComposed', 'count', n_counted, 'event',
            jsonb_build_object('type', 'EpsilonDelta', 'epsilon', eps_column, 'delta', 0));
    END IF;
    IF n_numeric > 0 THEN
        plan := plan || jsonb_build_object(
            'histogram', jsonb_build_object('epsilon', eps_histogram, 'noise', 'discrete_laplace',
                                            'scale', 2 / eps_histogram),
            'quantile', jsonb_build_object('epsilon', eps_quantile, 'noise', 'above_threshold',
                                           'scale', 2 / eps_quantile));
        -- the histograms and the quantiles of every numeric column
        parts := parts
            || jsonb_build_object('type', 'SelfComposed', 'count', n_numeric, 'event',
                   jsonb_build_object('type', 'EpsilonDelta', 'epsilon', eps_histogram, 'delta', 0))
            || jsonb_build_object('type', 'SelfComposed', 'count', n_numeric * cardinality(c.quantiles),
                   'event', jsonb_build_object('type', 'EpsilonDelta', 'epsilon', eps_quantile, 'delta', 0));
        IF delta = 0 THEN
            plan := plan || jsonb_build_object(
                'mean', jsonb_build_object('epsilon', eps_mean, 'noise', 'discrete_laplace',
                                           'scale', 2 * c.sum_grid / eps_mean),
                'stddev', jsonb_build_object('epsilon', eps_stddev, 'noise', 'discrete_laplace',
                                             'scale', c.sum_grid::float8 ^ 2 / eps_stddev));
            parts := parts
                || jsonb_build_object('type', 'SelfComposed', 'count', n_numeric, 'event',
                       jsonb_build_object('type', 'EpsilonDelta', 'epsilon', eps_mean, 'delta', 0))
                || jsonb_build_object('type', 'SelfComposed', 'count', n_numeric, 'event',
                       jsonb_build_object('type', 'EpsilonDelta', 'epsilon', eps_stddev, 'delta', 0));
        ELSE
            eps_gaussian := (eps_mean + eps_stddev) * n_numeric;
            sensitivity := sqrt(5 * n_numeric);
            sigma := dpsql.gaussian_sigma(sensitivity, eps_gaussian, delta);
            plan := plan || jsonb_build_object('sums', jsonb_build_object(
                'epsilon', eps_gaussian, 'delta', delta, 'noise', 'gaussian', 'sigma', sigma,
                'sensitivity', sensitivity));
            parts := parts || jsonb_build_object('type', 'Gaussian', 'noise_multiplier', 2 * sigma / sensitivity);
        END IF;
    END IF;
    RETURN plan || jsonb_build_object('dp_event', jsonb_build_object('type', 'Composed', 'events', parts));
END $$;

-- The refusals of a describe's arguments that need no column: a noise seed from a caller who
-- cannot read the rows, epsilon and delta out of range.
CREATE OR REPLACE FUNCTION dpsql_internal._describe_check_arguments(ds dpsql.datasets, epsilon float8,
                                                                    delta float8, noise_seed bigint)
RETURNS void LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- a noise seed lets its holder subtract the noise: only for those who can read the rows
    IF noise_seed IS NOT NULL AND NOT dpsql_internal._can_read_rows(ds) THEN
        PERFORM dpsql_internal._noise_seed_refused();
    END IF;
    IF epsilon IS NULL OR NOT (epsilon > 0 AND epsilon < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('epsilon must be a finite number > 0, got %s',
                                            coalesce(epsilon::text, 'NULL')));
    END IF;
    IF delta IS NULL OR NOT (delta >= 0 AND delta < 1) THEN
        PERFORM dpsql_internal._fail(format('delta must be in [0, 1), got %s', coalesce(delta::text, 'NULL')),
                                     hint => 'delta 0 (the default): pure epsilon-DP, integer noise throughout.');
    END IF;
END $$;

-- The one read of the numeric columns (exprs, bounds lo and hi): each value's t in [0, 1]
-- (clamped; NULL and NaN: none), then per column j the integer sums s1, s2, the Gaussian's sums
-- g1, g2, the bins' (hb, hc) and the grid places' (qp, qc) counts.
CREATE OR REPLACE FUNCTION dpsql_internal._describe_numeric_read(ds dpsql.datasets, exprs text[],
                                                                 lo float8[], hi float8[], grid float8[])
RETURNS TABLE (j int, s1 numeric, s2 numeric, g1 float8, g2 float8, hb int[], hc bigint[], qp int[],
               qc bigint[])
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c record := dpsql_internal._describe_constants();
BEGIN
    RETURN QUERY EXECUTE format(
        'WITH v AS MATERIALIZED ('
        '  SELECT u.j, least(greatest((u.v / 2 - $1[u.j] / 2) / ($2[u.j] / 2 - $1[u.j] / 2), 0), 1) AS t'
        '    FROM %s, unnest(ARRAY[%s]::float8[]) WITH ORDINALITY AS u(v, j)'
        '   WHERE u.v IS NOT NULL AND u.v <> ''NaN'')'
        ' SELECT jj AS j, coalesce(s.s1, 0) AS s1, coalesce(s.s2, 0) AS s2,'
        '        coalesce(s.g1, 0) AS g1, coalesce(s.g2, 0) AS g2,'
        '        coalesce(h.b, ''{}'') AS hb, coalesce(h.c, ''{}'') AS hc,'
        '        coalesce(q.p, ''{}'') AS qp, coalesce(q.c, ''{}'') AS qc'
        '   FROM generate_series(1, $6) jj'
        '   LEFT JOIN (SELECT w.j, sum(w.a) AS s1, sum(w.a * w.a) AS s2, sum(2 * w.t - 1) AS g1,'
        '                     sum((2 * w.t - 1) ^ 2 - 0.5) AS g2'
        '                FROM (SELECT v.j, v.t, round((2 * v.t - 1) * $3)::bigint AS a FROM v) w'
        '               GROUP BY w.j) s ON s.j = jj'
        '   LEFT JOIN (SELECT x.j, array_agg(x.b ORDER BY x.b) AS b, array_agg(x.n ORDER BY x.b) AS c'
        '                FROM (SELECT v.j, least(floor(v.t * $7)::int + 1, $7) AS b, count(*) AS n'
        '                        FROM v GROUP BY 1, 2) x GROUP BY x.j) h ON h.j = jj'
        '   LEFT JOIN (SELECT x.j, array_agg(x.p ORDER BY x.p) AS p, array_agg(x.n ORDER BY x.p) AS c'
        '                FROM (SELECT v.j, dpsql_internal._grid_place(v.t, $4, $5) AS p, count(*) AS n'
        '                        FROM v GROUP BY 1, 2) x GROUP BY x.j) q ON q.j = jj'
        '  ORDER BY jj',
        dpsql_internal._private_from(ds),
        array_to_string(exprs, ', '))
        USING lo, hi, c.sum_grid, grid, dpsql_internal._negated(grid), cardinality(exprs), c.bins;
END $$;

-- A numeric column's mean and stddev (col, the j-th numeric column, within [lo, hi]), in units of
-- a = 2t - 1 in [-1, 1]: delta 0, the integer sums s1, s2 with discrete Laplace noise; else the
-- Gaussian's sums g1, g2.
CREATE OR REPLACE FUNCTION dpsql_internal._describe_moments(
    col text, j int, lo float8, hi float8, s1 numeric, s2 numeric, g1 float8, g2 float8, m bigint,
    plan jsonb, delta float8, seed bigint, noise_seed bigint)
RETURNS TABLE (feature text, statistic text, key text, value float8, noise_sd float8)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c record := dpsql_internal._describe_constants();
    half float8 := hi / 2 - lo / 2;
    scale float8;
    sd float8;
    n1 bigint;
    n2 bigint;
    g float8[];
    mean_a float8;
    square_a float8;
    sd_mean_a float8;
    sd_square_a float8;
    var_a float8;
BEGIN
    feature := col;
    key := NULL;
    IF delta = 0 THEN
        scale := greatest((plan->'mean'->>'scale')::float8, 1e-200);
        n1 := dpsql_internal._discrete_laplace(seed # (64 * j + 1), 0, scale);
        mean_a := (s1 + n1)::float8 / (c.sum_grid::float8 * m);
        sd_mean_a := dpsql_internal._discrete_laplace_sd(greatest(scale, 0.01)) / (c.sum_grid::float8 * m);
        scale := greatest((plan->'stddev'->>'scale')::float8, 1e-200);
        n2 := dpsql_internal._discrete_laplace(seed # (64 * j + 2), 0, scale);
        square_a := (s2 + n2)::float8 / (c.sum_grid::float8 ^ 2 * m);
        sd_square_a := dpsql_internal._discrete_laplace_sd(greatest(scale, 0.01)) / (c.sum_grid::float8 ^ 2 * m);
    ELSE
        sd := (plan->'sums'->>'sigma')::float8;
        g := dpsql_internal._add_gaussian(ARRAY[g1::float8, g2::float8], sd, noise_seed, j);
        mean_a := g[1] / m;
        square_a := g[2] / m + 0.5;
        sd_mean_a := sd / m;
        sd_square_a := sd / m;
    END IF;
    statistic := 'mean';
    value := lo + half * (1 + mean_a);
    noise_sd := half * sd_mean_a;
    RETURN NEXT;
    var_a := greatest(square_a - mean_a ^ 2, 0);
    statistic := 'stddev';
    value := half * sqrt(var_a);
    -- the delta method at the released values (var_a = square_a - mean_a^2)
    noise_sd := CASE WHEN var_a > 0 THEN half * sqrt(sd_square_a ^ 2 + (2 * mean_a * sd_mean_a) ^ 2)
                                         / (2 * sqrt(var_a)) END;
    RETURN NEXT;
END $$;

-- A numeric column's quantiles by the scan (q < 0.5 downward from the top) over the grid
-- places' counts (qp, qc), sorted.
CREATE OR REPLACE FUNCTION dpsql_internal._describe_quantiles(
    col text, j int, lo float8, hi float8, grid float8[], qp int[], qc bigint[], m bigint, plan jsonb,
    seed bigint)
RETURNS TABLE (feature text, statistic text, key text, value float8, noise_sd float8)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c record := dpsql_internal._describe_constants();
    half float8 := hi / 2 - lo / 2;
    eps_q float8 := (plan->'quantile'->>'epsilon')::float8;
    qs float8[] := '{}';
BEGIN
    FOR k IN 1..cardinality(c.quantiles) LOOP
        qs := qs || (lo + 2 * half * dpsql_internal._private_scan(
            grid, qp, qc,
            CASE WHEN c.quantiles[k] < 0.5 THEN m + 1 - greatest(1, ceil(c.quantiles[k] * m))::bigint
                 ELSE greatest(1, ceil(c.quantiles[k] * m))::bigint END,
            c.quantiles[k] >= 0.5, eps_q, seed # (64 * j + 8 + k)));
    END LOOP;
    qs := ARRAY(SELECT x FROM unnest(qs) x ORDER BY x);
    feature := col;
    statistic := 'quantile';
    noise_sd := NULL;
    FOR k IN 1..cardinality(c.quantiles) LOOP
        key := c.quantiles[k]::text;
        value := qs[k];
        RETURN NEXT;
    END LOOP;
END $$;

-- A numeric column's histogram over B public bins of [lo, hi] (keys: their edges, exact
-- decimals) from the bins' counts (hb, hc), with discrete Laplace noise.
CREATE OR REPLACE FUNCTION dpsql_internal._describe_histogram(
    col text, j int, lo float8, hi float8, hb int[], hc bigint[], plan jsonb, seed bigint)
RETURNS TABLE (feature text, statistic text, key text, value float8, noise_sd float8)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c record := dpsql_internal._describe_constants();
    scale float8 := greatest((plan->'histogram'->>'scale')::float8, 1e-200);
BEGIN
    feature := col;
    statistic := 'histogram';
    noise_sd := dpsql_internal._discrete_laplace_sd(greatest(scale, 0.01));
    FOR k IN 1..c.bins LOOP
        key := format('[%s,%s%s',
                      ((lo::numeric * (c.bins - k + 1) + hi::numeric * (k - 1)) / c.bins)::float8,
                      ((lo::numeric * (c.bins - k) + hi::numeric * k) / c.bins)::float8,
                      CASE WHEN k = c.bins THEN ']' ELSE ')' END);
        value := coalesce(hc[array_position(hb, k)], 0)
                 + dpsql_internal._discrete_laplace(seed # (64 * j + 3), k, scale);
        RETURN NEXT;
    END LOOP;
END $$;

-- The frequencies of the counted columns (categorical features, a classification label): one
-- read per column, discrete Laplace noise on each public key's count.
CREATE OR REPLACE FUNCTION dpsql_internal._describe_frequencies(ds dpsql.datasets, features text[],
                                                                plan jsonb, seed bigint)
RETURNS TABLE (feature text, statistic text, key text, value float8, noise_sd float8)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    scale float8 := greatest((plan->'frequency'->>'scale')::float8, 1e-200);
    j int := 0;
    col record;
    counts bigint[];
BEGIN
    FOR col IN SELECT * FROM dpsql_internal._describe_columns(ds, features) x WHERE x.kind <> 'numeric' LOOP
        j := j + 1;
        IF col.as_text THEN
            EXECUTE format('SELECT array_agg(coalesce(h.n, 0) ORDER BY t.k)'
                           '  FROM unnest($1::text[]) WITH ORDINALITY AS t(v, k)'
                           '  LEFT JOIN (SELECT %s AS v, count(*) AS n FROM %s GROUP BY 1) h ON h.v = t.v',
                           col.expr, dpsql_internal._private_from(ds))
               INTO counts USING col.keys;
        ELSE
            EXECUTE format('SELECT array_agg(coalesce(h.n, 0) ORDER BY t.k)'
                           '  FROM unnest($1::float8[]) WITH ORDINALITY AS t(v, k)'
                           '  LEFT JOIN (SELECT %s AS v, count(*) AS n FROM %s GROUP BY 1) h ON h.v = t.v',
                           col.expr, dpsql_internal._private_from(ds))
               INTO counts USING col.keys::float8[];
        END IF;
        feature := col.feature;
        statistic := 'frequency';
        noise_sd := dpsql_internal._discrete_laplace_sd(greatest(scale, 0.01));
        FOR k IN 1..cardinality(col.keys) LOOP
            key := col.keys[k];
            value := counts[k] + dpsql_internal._discrete_laplace(seed # (64 * (j + 1024) + 4), k, scale);
            RETURN NEXT;
        END LOOP;
    END LOOP;
END $$;

-- The release's plan: the dataset as the caller may use it, every refusal that needs no value,
-- the numeric columns to read (names, exprs, bounds), the epsilon split (plan), the public row
-- count m and what the release is charged. Reads no value; dpsql.preview_describe stops here.
CREATE OR REPLACE FUNCTION dpsql_internal._describe_release_plan(
    dataset text, epsilon float8, delta float8, features text[], noise_seed bigint,
    OUT charge dpsql_internal.release_charge, OUT ds dpsql.datasets, OUT names text[], OUT exprs text[],
    OUT lo float8[], OUT hi float8[], OUT plan jsonb, OUT row_delta float8, OUT m bigint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n_numeric int;
    n_counted int;
    target record;
BEGIN
    ds := dpsql_internal._lookup_dataset(dataset);
    PERFORM dpsql_internal._describe_check_arguments(ds, epsilon, delta, noise_seed);
    -- the numeric columns (in arrays: one read), then the counted ones (a read each)
    SELECT coalesce(array_agg(x.feature ORDER BY x.k), '{}'), coalesce(array_agg(x.expr ORDER BY x.k), '{}'),
           coalesce(array_agg(x.lo ORDER BY x.k), '{}'), coalesce(array_agg(x.hi ORDER BY x.k), '{}')
      INTO names, exprs, lo, hi
      FROM dpsql_internal._describe_columns(ds, features) WITH ORDINALITY AS x(feature, kind, expr, lo, hi, keys, as_text, k)
     WHERE x.kind = 'numeric';
    n_numeric := cardinality(names);
    SELECT count(*) INTO n_counted FROM dpsql_internal._describe_columns(ds, features) x WHERE x.kind <> 'numeric';
    IF delta > 0 AND n_numeric = 0 THEN
        PERFORM dpsql_internal._fail('delta > 0 buys nothing here: it is for the sums of numeric columns, '
                                     'and none is described',
                                     hint => 'Use delta => 0: counts take integer noise at pure epsilon.');
    END IF;
    -- a privacy unit of k rows: planned at row level for the unit-level (epsilon, delta), which
    -- the charge pays (64_privacy_units.sql)
    target := dpsql_internal._unit_release_target(ds, epsilon, delta);
    row_delta := target.delta;
    plan := dpsql_internal._describe_plan(n_numeric, n_counted, target.epsilon, target.delta);
    -- (1e-8: the stddev's integer noise, H^2 / epsilon rows, at most 36.7 scales, stays < 2^63;
    -- below it the noise swamps any table)
    IF least((plan->'quantile'->>'epsilon')::float8, (plan->'frequency'->>'epsilon')::float8) < 1e-8 THEN
        PERFORM dpsql_internal._fail(format('epsilon %s is too small for %s columns: a statistic would get '
                                            'less than 1e-8', epsilon,
                                            n_numeric + n_counted),
                                     hint => 'Describe fewer columns (features => ...) or use a larger epsilon.');
    END IF;
    -- the public row count (counting reads no value); the read checks the registered columns
    m := dpsql_internal._public_row_count(ds);
    IF m < 1 THEN
        PERFORM dpsql_internal._fail(format('dataset %s has no rows', quote_literal(ds.name)), '22000');
    END IF;
    PERFORM dpsql_internal._preview_note('dataset', to_jsonb(ds.name));
    PERFORM dpsql_internal._preview_note('run', jsonb_build_object('rows', m));
    charge := ROW(ds.dataset_id, target.epsilon, target.delta, 'describe',
                  format('describe %s (%s rows)',
                         (SELECT string_agg(x.feature, ', ') FROM dpsql_internal._describe_columns(ds, features) x),
                         m),
                  plan->'dp_event', plan - 'dp_event', false)::dpsql_internal.release_charge;
END $$;

-- The release. As the extension owner (the analyst reads no row): its plan, the charge, then
-- one read of the numeric columns and one per counted column.
CREATE OR REPLACE FUNCTION dpsql.describe(dataset text, epsilon float8, delta float8 DEFAULT 0,
                                          features text[] DEFAULT NULL, noise_seed bigint DEFAULT NULL)
RETURNS TABLE (feature text, statistic text, key text, value float8, noise_sd float8)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c record := dpsql_internal._describe_constants();
    p record := dpsql_internal._describe_release_plan(dataset, epsilon, delta, features, noise_seed);
    seed bigint;
    grid float8[];
    r record;
BEGIN
    PERFORM dpsql_internal._charge((p.charge).dataset_id, (p.charge).epsilon, (p.charge).delta,
                                   (p.charge).mechanism, note => (p.charge).note,
                                   dp_event => (p.charge).dp_event, plan => (p.charge).plan);
    seed := coalesce(noise_seed, dpsql_internal._random_seed());

    feature := NULL;
    statistic := 'rows';
    key := NULL;
    value := p.m;
    noise_sd := 0;
    RETURN NEXT;

    IF cardinality(p.names) > 0 THEN
        grid := ARRAY(SELECT i::float8 / c.quantile_grid FROM generate_series(0, c.quantile_grid) i);
        -- one read, then per column its mean and stddev, quantiles and histogram
        FOR r IN SELECT * FROM dpsql_internal._describe_numeric_read(p.ds, p.exprs, p.lo, p.hi, grid) LOOP
            RETURN QUERY SELECT * FROM dpsql_internal._describe_moments(
                p.names[r.j], r.j, p.lo[r.j], p.hi[r.j], r.s1, r.s2, r.g1, r.g2, p.m, p.plan, p.row_delta, seed,
                noise_seed);
            RETURN QUERY SELECT * FROM dpsql_internal._describe_quantiles(
                p.names[r.j], r.j, p.lo[r.j], p.hi[r.j], grid, r.qp, r.qc, p.m, p.plan, seed);
            RETURN QUERY SELECT * FROM dpsql_internal._describe_histogram(
                p.names[r.j], r.j, p.lo[r.j], p.hi[r.j], r.hb, r.hc, p.plan, seed);
        END LOOP;
    END IF;

    -- frequencies: one read per counted column
    RETURN QUERY SELECT * FROM dpsql_internal._describe_frequencies(p.ds, features, p.plan, seed);
END $$;
COMMENT ON FUNCTION dpsql.describe(text, float8, float8, text[], bigint) IS
    'Private exploratory statistics of a registered dataset (means, spreads, quantiles, histograms, '
    'frequencies), one charge to its ledger (noise_seed: tests only)';

-- What dpsql.describe would charge, without charging or reading a value (57_preview.sql):
-- its plan, as the extension owner (as dpsql.describe).
CREATE OR REPLACE FUNCTION dpsql.preview_describe(dataset text, epsilon float8, delta float8 DEFAULT 0,
                                                  features text[] DEFAULT NULL)
RETURNS jsonb LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT dpsql_internal._preview_statement(
        format('SELECT (p.charge).* FROM dpsql_internal._describe_release_plan(%L, %L::float8, %L::float8, '
               '%L::text[], NULL) p', dataset, epsilon, delta, features))
$$;
COMMENT ON FUNCTION dpsql.preview_describe(text, float8, float8, text[]) IS
    'What dpsql.describe would charge (epsilon split, DpEvent, budget, refusal), without charging or reading rows';
