------------------------------------------------------------------------------------------
-- Private feature bounds (issue 10; spec 001 s. 3.3): for a dataset registered without
-- feature bounds, each feature's lower and upper quantiles by the exponential mechanism on a
-- public grid, charged to the dataset's ledger, then registered as its bounds.
--
-- The grid is {a, a + step, ..., b} over the public search range [a, b], step (b - a)/m^2.
-- Values are clamped to [a, b] and rounded to the grid (a per-record map: free). A grid point
-- g has the tie-aware rank utility u(g) = -max(0, #{v < g} - r, r - #{v <= g}) for the target
-- rank r = ceil(q m): replacing one record moves both counts by at most 1, so u has
-- sensitivity 1, and g is drawn with probability proportional to exp(epsilon u(g) / 2). The
-- grid has m^2 points: u is constant between consecutive distinct values, so the draw picks
-- one of O(m) segments (weight: its points times exp(epsilon u / 2)), then a point in it.
------------------------------------------------------------------------------------------

-- The segments of the grid with their utility: a point at each distinct value (ties) and the
-- runs of points between them. grid_values: the distinct values, ascending; counts: how many
-- records have each.
CREATE OR REPLACE FUNCTION dpsql._quantile_segments(grid_values float8[], counts bigint[], rank bigint,
                                         lo float8, hi float8, step float8,
                                         OUT start float8, OUT points float8, OUT utility float8)
RETURNS SETOF record LANGUAGE sql IMMUTABLE AS $$
    WITH v AS (
        SELECT w, c, sum(c) OVER (ORDER BY w) - c AS below, lead(w) OVER (ORDER BY w) AS nxt,
               row_number() OVER (ORDER BY w) AS i
          FROM unnest(grid_values, counts) AS t(w, c)
    ), s AS (
        -- before the first value (every point of the range when there is no value)
        SELECT lo AS start,
               round((coalesce((SELECT min(w) FROM v), hi + step) - lo) / step) AS points,
               0::numeric AS lt, 0::numeric AS le
        UNION ALL  -- each value: its ties
        SELECT w, 1, below, below + c FROM v
        UNION ALL  -- between a value and the next, or up to hi after the last
        SELECT w + step, round((coalesce(nxt, hi + step) - w) / step) - 1, below + c, below + c
          FROM v
    )
    SELECT start, points, -greatest(0, lt - rank, rank - le)::float8
      FROM s WHERE points >= 1
$$;

-- One private quantile: a segment by the exponential mechanism (its points' count enters as
-- 2/epsilon ln(points), so the draw is over grid points), then a uniform point in it.
CREATE OR REPLACE FUNCTION dpsql._private_quantile(grid_values float8[], counts bigint[], rank bigint,
                                        lo float8, hi float8, step float8, epsilon float8,
                                        seed bigint)
RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
    segs record;
    starts float8[];
    points float8[];
    scores float8[];
    pick int;
BEGIN
    SELECT array_agg(s.start ORDER BY s.start), array_agg(s.points ORDER BY s.start),
           array_agg(s.utility + 2 / epsilon * ln(s.points) ORDER BY s.start)
      INTO starts, points, scores
      FROM dpsql._quantile_segments(grid_values, counts, rank, lo, hi, step) s;
    pick := dpsql._exponential_mechanism(scores, epsilon, 1, seed);
    RETURN starts[pick] + (dpsql._uniform_index(coalesce(seed, dpsql._random_seed()), pick,
                                                points[pick]::bigint) - 1) * step;
END $$;

-- search_range is the owner's public statement of where the quantiles surely lie: the grid's
-- empty stretches weigh against the data's (a range 10^6 times too wide needs about
-- 2 ln(10^6) / epsilon more rows at the target rank).
CREATE OR REPLACE FUNCTION dpsql.estimate_bounds(dataset text, epsilon float8, search_range float8[],
                                      lower_quantile float8 DEFAULT 0.01,
                                      upper_quantile float8 DEFAULT 0.99,
                                      noise_seed bigint DEFAULT NULL)
RETURNS float8[] LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ds dpsql.datasets;
    a float8 := search_range[1];
    b float8 := search_range[2];
    m bigint;
    step float8;
    eps_each float8;
    values_expr text;
    f record;
    lo float8;
    hi float8;
    bounds float8[] := '{}';
BEGIN
    PERFORM dpsql._require_admin('estimate feature bounds');
    ds := dpsql._dataset_for_source(dataset);
    IF NOT dpsql._can_use_dataset(ds.dataset_id) THEN
        PERFORM dpsql._fail(format('dataset %s is not granted to %s', ds.name, session_user), '42501');
    END IF;
    IF ds.feature_bounds IS NOT NULL THEN
        PERFORM dpsql._fail(format('dataset %s already has feature bounds', ds.name),
                            hint => 'Bounds are estimated once, for a dataset registered without them.');
    END IF;
    IF ds.dim IS NULL THEN
        PERFORM dpsql._fail(format('dataset %s was registered without a known dimension', ds.name));
    END IF;
    IF epsilon IS NULL OR NOT (epsilon > 0 AND epsilon < 'Infinity') THEN
        PERFORM dpsql._fail(format('epsilon must be a finite number > 0, got %s', coalesce(epsilon::text, 'NULL')));
    END IF;
    IF lower_quantile IS NULL OR upper_quantile IS NULL
       OR NOT (0 <= lower_quantile AND lower_quantile < upper_quantile AND upper_quantile <= 1) THEN
        PERFORM dpsql._fail('quantiles must satisfy 0 <= lower_quantile < upper_quantile <= 1');
    END IF;
    IF cardinality(search_range) <> 2 OR NOT (a > '-Infinity' AND b < 'Infinity' AND a < b
                                               -- b - a must not overflow float8
                                               AND b / 2 - a / 2 < 8.98e307) THEN
        PERFORM dpsql._fail('search_range must be {a, b}, finite, a < b',
                            hint => 'A public range that surely holds the quantiles; wider costs little.');
    END IF;
    -- m is public (replace-one neighbours); the budget is charged before any row is read.
    EXECUTE format('SELECT count(*) FROM %s', ds.relid) INTO m;
    IF m < 1 THEN
        PERFORM dpsql._fail(format('dataset %s has no rows', ds.name), '22000');
    END IF;
    step := (b - a) / greatest(m::float8 * m, 1);
    eps_each := epsilon / (2 * ds.dim);
    -- Public: the exponential mechanism's rank error (2 / epsilon) ln(grid points), with
    -- probability 1 - 1/e, against the target ranks' distance from the edges of the data.
    IF 2 / eps_each * ln(m::float8 * m + 1) > least(ceil(lower_quantile * m), m - ceil(upper_quantile * m)) THEN
        RAISE WARNING 'dpsql: with % rows, epsilon % per quantile and this search range, the bounds may land far outside the data',
                      m, round(eps_each::numeric, 4)
            USING HINT = format('The rank error is about %s rows; the target ranks are %s rows from the edges. '
                                'Use a larger epsilon, quantiles further from 0 and 1, or more rows.',
                                round(2 / eps_each * ln(m::float8 * m + 1)),
                                least(ceil(lower_quantile * m), m - ceil(upper_quantile * m)));
    END IF;
    PERFORM dpsql._charge(ds.dataset_id, epsilon, 0, 'estimate_bounds',
                          note => format('quantiles %s and %s of %s features over [%s, %s]',
                                         lower_quantile, upper_quantile, ds.dim, a, b));
    values_expr := CASE WHEN dpsql._array_feature(ds) THEN format('src.%I', ds.features[1])
                        ELSE format('ARRAY[%s]', (SELECT string_agg(format('src.%I', c), ', ' ORDER BY k)
                                                    FROM unnest(ds.features) WITH ORDINALITY AS u(c, k)))
                   END;
    FOR f IN EXECUTE format(
        'SELECT j, g.w, g.c FROM generate_series(1, $4) j LEFT JOIN ('
        '  SELECT j, array_agg(w ORDER BY w) AS w, array_agg(c ORDER BY w) AS c FROM ('
        '    SELECT u.j, $1 + round((least(greatest(u.v, $1), $2) - $1) / $3) * $3 AS w, count(*) AS c'
        '      FROM %s, unnest(%s) WITH ORDINALITY AS u(v, j)'
        '     WHERE u.v IS NOT NULL AND u.v <> ''NaN'' AND u.j <= $4'
        '     GROUP BY 1, 2) q GROUP BY j) g USING (j) ORDER BY j', dpsql._private_from(ds), values_expr)
        USING a, b, step, ds.dim
    LOOP
        lo := dpsql._private_quantile(coalesce(f.w, '{}'), coalesce(f.c, '{}'),
                                      ceil(lower_quantile * m)::bigint, a, b, step, eps_each,
                                      noise_seed # (2 * f.j));
        hi := dpsql._private_quantile(coalesce(f.w, '{}'), coalesce(f.c, '{}'),
                                      ceil(upper_quantile * m)::bigint, a, b, step, eps_each,
                                      noise_seed # (2 * f.j + 1));
        IF hi <= lo THEN  -- a feature constant in the data, or crossed draws
            hi := greatest(hi, lo) + step;
            lo := least(hi - step, lo);
        END IF;
        bounds := bounds || ARRAY[ARRAY[lo, hi]];
    END LOOP;
    UPDATE dpsql.datasets d
       SET feature_bounds = bounds,
           row_bound = CASE WHEN d.label_bound IS NOT NULL AND d.row_norm = 'none' AND d.row_bound IS NULL
                            THEN sqrt(d.dim) ELSE d.row_bound END
     WHERE d.dataset_id = ds.dataset_id;
    RETURN bounds;
END $$;
COMMENT ON FUNCTION dpsql.estimate_bounds(text, float8, float8[], float8, float8, bigint) IS
    'Private per-feature quantile bounds of a dataset registered without bounds, charged to its ledger (noise_seed: tests only)';
