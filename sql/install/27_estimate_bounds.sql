------------------------------------------------------------------------------------------
-- Private bounds (issues 10 and 25; PrivQuantile, Sun et al. 2024, Lemma 4): for a dataset
-- registered without feature bounds, each feature's lower and upper quantiles; for a regression
-- dataset registered without a label bound, an upper quantile of |y|. Each is a private scan of a
-- public grid of magnitudes (below), charged to the dataset's ledger, then registered as its
-- declaration.
--
-- The grid: 0, then J = 64 points per octave of magnitude, +-F 2^k (1 + j/J) (F = 2^-40 the
-- floor, k >= 0, 0 <= j < J), with the linear steps +-F i/J below F, intersected with the
-- public search range [a, b], plus a and b. It depends on a and b only (public), its
-- resolution is relative (a step is 1/64 to 1/128 of the value), and a wider range costs 2J
-- points per octave: {-2^40, 2^40}, the default, has 10,369 points, {-10, 10} 5,665.
--
-- The scan (AboveThreshold, Dwork and Roth 2014 s. 3.6, on monotone counts): an upper
-- quantile q at the target rank r = max(1, ceil(q m)) is the first grid point g, ascending,
-- with c(g) + nu_g >= r + rho, where c(g) = #{v <= g}, rho and every nu_g are independent
-- discrete Laplace of scale 2/epsilon (P(k) ~ exp(-|k| epsilon / 2)); no stop: b. A lower
-- quantile is the same scan descending from b on #{v >= g} with r' = m + 1 - r (the last g
-- with at least r values at or below it). Privacy, replace-one neighbours D, D' (m public):
-- replacing one value moves every c(g) by at most 1 and all in the same direction (the
-- counts are monotone in the change). If c' >= c, shift rho and the stopping point's nu by
-- +1; if c' <= c, shift that nu only: every earlier point still does not stop, the stopping
-- point still does (no stop: shift rho, or nothing). Each shift of an integer by 1 costs a
-- factor exp(epsilon / 2), so every output has probability within exp(epsilon) on D and D':
-- epsilon-DP per quantile, delta 0, whatever the grid's size. The counts are integers and
-- the noise is integer (discrete Laplace, as the difference of two geometrics drawn by
-- inversion from the ChaCha20 stream): no floating-point noise is compared. (The inversion's
-- 53-bit uniforms cut each geometric at 36.7 scales, an event of probability 2^-53: the
-- shift argument fails only there.)
--
-- Why a scan and not the exponential mechanism on this grid: the rank utility gives every
-- point above the data the utility -(m - r), so at m - r = 40 rows and epsilon / (2d) per
-- quantile the empty octaves above the data outweigh the few points at the quantile and the
-- draw lands far above it; the scan stops at the first point the counts reach, before the
-- empty range.
-- Work: one pass over the rows puts each value's place on the grid (a binary search, a
-- per-record map) into a histogram of at most 2n + 1 places; then per quantile a running
-- sum over those places and two draws per grid point: O(m log n + n) for n grid points.
--
-- The exponential mechanism on a linear grid of m^2 points (_private_quantile, below) is
-- what DPSGD-F's private mean uses (39_dpsgd_f_alg2.sql) on its bounded range.
--
-- The grid's EM: {a, a + step, ..., b} over the public search range [a, b], step (b - a)/m^2.
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
CREATE OR REPLACE FUNCTION dpsql_internal._quantile_segments(grid_values float8[], counts bigint[], rank bigint,
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
CREATE OR REPLACE FUNCTION dpsql_internal._private_quantile(grid_values float8[], counts bigint[], rank bigint,
                                        lo float8, hi float8, step float8, epsilon float8,
                                        seed bigint)
RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
    starts float8[];
    points float8[];
    scores float8[];
    pick int;
BEGIN
    SELECT array_agg(s.start ORDER BY s.start), array_agg(s.points ORDER BY s.start),
           array_agg(s.utility + 2 / epsilon * ln(s.points) ORDER BY s.start)
      INTO starts, points, scores
      FROM dpsql_internal._quantile_segments(grid_values, counts, rank, lo, hi, step) s;
    pick := dpsql_internal._exponential_mechanism(scores, epsilon, 1, seed);
    RETURN starts[pick] + (dpsql_internal._uniform_index(coalesce(seed, dpsql_internal._random_seed()), pick,
                                                points[pick]::bigint) - 1) * step;
END $$;

-- The data owner's dataset to estimate a declaration of: admin only, granted.
CREATE OR REPLACE FUNCTION dpsql_internal._estimation_dataset(dataset text, action text,
                                                       noise_seed bigint DEFAULT NULL)
RETURNS dpsql.datasets LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ds dpsql.datasets;
BEGIN
    PERFORM dpsql_internal._require_admin(action);
    ds := dpsql_internal._lookup_dataset(dataset);
    -- (an estimate spends the budget and changes the registration: the owner's)
    PERFORM dpsql_internal._require_dataset_owner(ds, action);
    -- a data owner may estimate on a table they cannot read, but not with known noise
    IF noise_seed IS NOT NULL AND NOT dpsql_internal._can_read_rows(ds) THEN
        PERFORM dpsql_internal._noise_seed_refused();
    END IF;
    RETURN ds;
END $$;

-- The public grid of magnitudes in [a, b], ascending, a and b included (the header: J = 64
-- points per octave above the floor F = 2^-40, F/64 apart below it). F 2^k stops at 2^1023.
CREATE OR REPLACE FUNCTION dpsql_internal._magnitude_grid(a float8, b float8)
RETURNS float8[] LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT array_agg(g ORDER BY g) FROM (
        SELECT a AS g UNION SELECT b
        UNION
        SELECT s.sign * p.v
          FROM (SELECT 2 ^ (-40::float8) * i / 64 AS v FROM generate_series(0, 63) i
                UNION ALL
                SELECT 2 ^ (k - 40::float8) * (1 + j / 64::float8)
                  FROM generate_series(0, least(1063, greatest(0, 41 + ceil(
                           ln(greatest(abs(a), abs(b))) / ln(2::float8))::int))) k,
                       generate_series(0, 63) j) p,
               (VALUES (1::float8), (-1::float8)) s(sign)
         WHERE s.sign * p.v > a AND s.sign * p.v < b) q
$$;

-- The grid negated, ascending (for _grid_place).
CREATE OR REPLACE FUNCTION dpsql_internal._negated(grid float8[])
RETURNS float8[] LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT array_agg(-g ORDER BY k DESC) FROM unnest(grid) WITH ORDINALITY AS t(g, k)
$$;

-- A value's place on the grid (a per-record map: free): 2k - 1 on the k-th point, 2k between
-- the k-th and the next (0 below the grid, 2n above). neg_grid: the grid negated, ascending.
-- So #{v <= g_k} counts the places <= 2k - 1 and #{v >= g_k} those >= 2k - 1.
CREATE OR REPLACE FUNCTION dpsql_internal._grid_place(v float8, grid float8[], neg_grid float8[])
RETURNS int LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT width_bucket(v, grid) - width_bucket(-v, neg_grid) + cardinality(grid)
$$;

-- The scan's counts at each grid point from the places' histogram (places, counts):
-- #{v <= g_k} (ascending) or #{v >= g_k} (descending). Each moves by at most 1, all in one
-- direction, when one record is replaced (the header's privacy argument).
CREATE OR REPLACE FUNCTION dpsql_internal._grid_counts(n int, places int[], counts bigint[], ascending boolean)
RETURNS bigint[] LANGUAGE sql IMMUTABLE AS $$
    SELECT array_agg(t ORDER BY k) FROM (
        SELECT k, CASE WHEN ascending THEN sum(coalesce(h.c, 0)) OVER (ORDER BY k)
                       ELSE sum(coalesce(h.c, 0)) OVER (ORDER BY k DESC) END::bigint AS t
          FROM generate_series(0, 2 * n) k LEFT JOIN unnest(places, counts) h(place, c) ON h.place = k
    ) s WHERE k % 2 = 1
$$;

-- Discrete Laplace of the given scale at position pos of the ChaCha20 stream of seed:
-- P(k) ~ exp(-|k| / scale), the difference of two geometrics of ratio exp(-1/scale), each
-- floor(-scale ln U) with U uniform on (0, 1] in steps of 2^-53 (integers: no floating-point
-- noise is released or compared).
CREATE OR REPLACE FUNCTION dpsql_internal._discrete_laplace(seed bigint, pos bigint, scale float8)
RETURNS bigint LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT floor(-scale * ln(dpsql_internal._uniform_index(seed, 2 * pos, 9007199254740992)
                             / 9007199254740992::float8))::bigint
         - floor(-scale * ln(dpsql_internal._uniform_index(seed, 2 * pos + 1, 9007199254740992)
                             / 9007199254740992::float8))::bigint
$$;

-- One private quantile by the scan (header): ascending, the first grid point whose count
-- #{v <= g} plus noise reaches target plus noise (none: b); descending, the first from the
-- top whose #{v >= g} does (none: a). rho is position 0 of the stream, g_k's noise position k.
CREATE OR REPLACE FUNCTION dpsql_internal._private_scan(grid float8[], places int[], counts bigint[],
                                                target bigint, ascending boolean, epsilon float8,
                                                seed bigint)
RETURNS float8 LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s bigint := coalesce(seed, dpsql_internal._random_seed());
    n int := cardinality(grid);
    -- 2 / epsilon; at least 1e-200 (more noise, as private), where a draw is 0 anyway, so that
    -- scale * ln(U) never underflows (an error, after the charge) at epsilon near float8's max
    scale float8 := greatest(2 / epsilon, 1e-200);
    rho bigint := dpsql_internal._discrete_laplace(s, 0, scale);
    k int;
BEGIN
    SELECT CASE WHEN ascending THEN min(c.k) ELSE max(c.k) END INTO k
      FROM unnest(dpsql_internal._grid_counts(n, places, counts, ascending)) WITH ORDINALITY AS c(t, k)
     WHERE c.t + dpsql_internal._discrete_laplace(s, c.k, scale) >= target + rho;
    RETURN grid[coalesce(k, CASE WHEN ascending THEN n ELSE 1 END)];
END $$;

-- The public numbers of an estimate: epsilon, the search range [a, b] (lowest: the least a
-- allowed), the row count m and the grid. m is public (replace-one neighbours): counting rows
-- reads no value, and the charge follows, before any is read.
CREATE OR REPLACE FUNCTION dpsql_internal._estimate_range(ds dpsql.datasets, epsilon float8,
                                                 search_range float8[], lowest float8,
                                                 OUT a float8, OUT b float8, OUT m bigint,
                                                 OUT grid float8[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF epsilon IS NULL OR NOT (epsilon > 0 AND epsilon < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('epsilon must be a finite number > 0, got %s', coalesce(epsilon::text, 'NULL')));
    END IF;
    a := search_range[array_lower(search_range, 1)];
    b := search_range[array_lower(search_range, 1) + 1];
    IF array_ndims(search_range) IS DISTINCT FROM 1 OR cardinality(search_range) <> 2
       OR NOT coalesce(a > '-Infinity' AND a >= lowest AND b < 'Infinity' AND a < b
                       -- b - a must not overflow float8
                       AND b / 2 - a / 2 < 8.98e307, false) THEN
        PERFORM dpsql_internal._fail(format('search_range must be {a, b}, finite, %sa < b',
                                   CASE WHEN lowest > '-Infinity' THEN lowest || ' <= ' ELSE '' END),
                            hint => 'A public range that surely holds the quantiles; NULL (the default) is '
                                    '{-2^40, 2^40} ({0, 2^40} for |y|), and a wider range costs little.');
    END IF;
    -- (read as every private read is: the registered columns' types and the relation checked)
    EXECUTE format('SELECT count(*) FROM %s', dpsql_internal._private_from(ds)) INTO m;
    IF m < 1 THEN
        PERFORM dpsql_internal._fail(format('dataset %s has no rows', ds.name), '22000');
    END IF;
    grid := dpsql_internal._magnitude_grid(a, b);
END $$;

-- Public, before the charge: an epsilon per quantile of at least 1e-9, whose noise (2/epsilon
-- rows, at most 36.7 scales: < 2^63) stays an exact integer; below it the noise swamps any
-- table. Then a warning when the scan may run past the data (a bound far outside it): its
-- noise, about 2 / epsilon per count, is more than the target ranks' distance from the edges.
CREATE OR REPLACE FUNCTION dpsql_internal._check_scan_epsilon(what text, m bigint, eps_each float8, edge_rows bigint)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF eps_each < 1e-9 THEN
        PERFORM dpsql_internal._fail(format('epsilon per quantile must be at least 1e-9, got %s', eps_each),
                            hint => 'The bounds split epsilon over their quantiles (2 per feature).');
    END IF;
    IF 2 / eps_each > edge_rows THEN
        RAISE WARNING 'dpsql: with % rows and epsilon % per quantile, the % may land far outside the data',
                      m, round(eps_each::numeric, 4), what
            USING HINT = format('The noise is about %s rows; the target ranks are %s rows from the edges. '
                                'Use a larger epsilon, quantiles further from 0 and 1, or more rows.',
                                round(2 / eps_each), edge_rows);
    END IF;
END $$;

-- SQL of a value on the grid: clamped to [$1, $2], rounded to the step $3 (a per-record map:
-- free). The linear grid of _private_quantile (DPSGD-F's private mean).
CREATE OR REPLACE FUNCTION dpsql_internal._grid_sql(value_sql text)
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT format('$1 + round((least(greatest(%s, $1), $2) - $1) / $3) * $3', value_sql)
$$;

-- Feature bounds are estimated for numeric features only: a dataset with categorical
-- features is refused, at registration and before an estimate's charge (the estimate read them
-- as numbers, failed after the charge and kept it: issue 42).
CREATE OR REPLACE FUNCTION dpsql_internal._refuse_categorical_estimate(categories jsonb)
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF categories IS NOT NULL AND categories <> '{}' THEN
        PERFORM dpsql_internal._fail('estimate feature bounds of numeric features only: not with categories',
                                     hint => 'Declare feature_bounds for the numeric features instead '
                                             '(categorical features need none). Nothing was charged.');
    END IF;
END $$;

-- search_range is the owner's public statement of where the quantiles surely lie; NULL is
-- {-2^40, 2^40}. Its width costs little (the header): 2 * 64 grid points per octave.
CREATE OR REPLACE FUNCTION dpsql.estimate_bounds(dataset text, epsilon float8, search_range float8[] DEFAULT NULL,
                                      lower_quantile float8 DEFAULT 0.01,
                                      upper_quantile float8 DEFAULT 0.99,
                                      noise_seed bigint DEFAULT NULL)
RETURNS float8[] LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ds dpsql.datasets;
    g record;
    m bigint;
    eps_each float8;
    r_lo bigint;
    r_hi bigint;
    values_expr text;
    f record;
    lo float8;
    hi float8;
    bounds float8[] := '{}';
BEGIN
    ds := dpsql_internal._estimation_dataset(dataset, 'estimate feature bounds', noise_seed);
    -- a privacy unit of k rows: planned at epsilon / k, charged epsilon (64_privacy_units.sql)
    epsilon := (dpsql_internal._unit_release_target(ds, epsilon, 0)).epsilon;
    IF ds.feature_bounds IS NOT NULL THEN
        PERFORM dpsql_internal._fail(format('dataset %s already has feature bounds', ds.name),
                            hint => 'Bounds are estimated once, for a dataset registered without them.');
    END IF;
    IF ds.dim IS NULL THEN
        PERFORM dpsql_internal._fail(format('dataset %s was registered without a known dimension', ds.name));
    END IF;
    PERFORM dpsql_internal._refuse_categorical_estimate(ds.categories);
    IF lower_quantile IS NULL OR upper_quantile IS NULL
       OR NOT (0 <= lower_quantile AND lower_quantile < upper_quantile AND upper_quantile <= 1) THEN
        PERFORM dpsql_internal._fail('quantiles must satisfy 0 <= lower_quantile < upper_quantile <= 1');
    END IF;
    g := dpsql_internal._estimate_range(ds, epsilon, coalesce(search_range, '{-1099511627776,1099511627776}'),
                                        '-Infinity');
    m := g.m;
    -- the 2d quantiles, epsilon / (2d) each (basic composition)
    eps_each := epsilon / (2 * ds.dim);
    r_lo := greatest(1, ceil(lower_quantile * m));
    r_hi := greatest(1, ceil(upper_quantile * m));
    PERFORM dpsql_internal._check_scan_epsilon('bounds', m, eps_each, least(r_lo - 1, m - r_hi));
    PERFORM dpsql_internal._charge(ds.dataset_id, epsilon, 0, 'estimate_bounds',
                          note => format('quantiles %s and %s of %s features over [%s, %s]',
                                         lower_quantile, upper_quantile, ds.dim, g.a, g.b));
    values_expr := CASE WHEN dpsql_internal._array_feature(ds) THEN format('src.%I', ds.features[1])
                        ELSE format('ARRAY[%s]', (SELECT string_agg(format('src.%I', c), ', ' ORDER BY k)
                                                    FROM unnest(ds.features) WITH ORDINALITY AS u(c, k)))
                   END;
    -- each feature's histogram of grid places (NULL and NaN: none)
    FOR f IN EXECUTE format(
        'SELECT j, h.p, h.c FROM generate_series(1, $3) j LEFT JOIN ('
        '  SELECT j, array_agg(p ORDER BY p) AS p, array_agg(c ORDER BY p) AS c FROM ('
        '    SELECT u.j, dpsql_internal._grid_place(u.v, $1, $2) AS p, count(*) AS c'
        '      FROM %s, unnest(%s) WITH ORDINALITY AS u(v, j)'
        '     WHERE u.v IS NOT NULL AND u.v <> ''NaN'' AND u.j <= $3'
        '     GROUP BY 1, 2) q GROUP BY j) h USING (j) ORDER BY j',
        dpsql_internal._private_from(ds), values_expr)
        USING g.grid, dpsql_internal._negated(g.grid), ds.dim
    LOOP
        -- the lower quantile: the last point with r_lo values at or below it, from the top
        lo := dpsql_internal._private_scan(g.grid, coalesce(f.p, '{}'), coalesce(f.c, '{}'), m + 1 - r_lo,
                                           false, eps_each, noise_seed # (2 * f.j));
        hi := dpsql_internal._private_scan(g.grid, coalesce(f.p, '{}'), coalesce(f.c, '{}'), r_hi,
                                           true, eps_each, noise_seed # (2 * f.j + 1));
        IF hi <= lo THEN  -- a feature constant in the data, or crossed draws: the next point up
            lo := least(lo, hi);
            hi := (SELECT min(x) FROM unnest(g.grid) x WHERE x > lo);
            IF hi IS NULL THEN
                hi := lo;
                lo := (SELECT max(x) FROM unnest(g.grid) x WHERE x < hi);
            END IF;
        END IF;
        bounds := bounds || ARRAY[ARRAY[lo, hi]];
    END LOOP;
    UPDATE dpsql.datasets d
       SET feature_bounds = bounds,
           row_bound = CASE WHEN d.labels IS NULL  -- regression
                            THEN dpsql_internal._regression_row_bound(d.row_norm, d.row_bound, d.dim)
                            ELSE d.row_bound END
     WHERE d.dataset_id = ds.dataset_id;
    PERFORM dpsql_internal._record_change(ds.dataset_id,
                                          jsonb_build_object('feature_bounds', jsonb_build_array(ds.feature_bounds, bounds)));
    RETURN bounds;
END $$;
COMMENT ON FUNCTION dpsql.estimate_bounds(text, float8, float8[], float8, float8, bigint) IS
    'Private per-feature quantile bounds of a dataset registered without bounds, charged to its ledger (noise_seed: tests only)';

-- The histogram of the grid places of |y| (NULL and NaN labels: none). What the label
-- bound's scan counts.
CREATE OR REPLACE FUNCTION dpsql_internal._label_places(ds dpsql.datasets, grid float8[],
                                               OUT places int[], OUT counts bigint[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    EXECUTE format(
        'SELECT coalesce(array_agg(p ORDER BY p), ''{}''), coalesce(array_agg(c ORDER BY p), ''{}'') FROM ('
        '  SELECT dpsql_internal._grid_place(abs(src.%I), $1, $2) AS p, count(*) AS c FROM %s'
        '   WHERE src.%I IS NOT NULL AND src.%I <> ''NaN'' GROUP BY 1) v',
        ds.label, dpsql_internal._private_from(ds), ds.label, ds.label)
        INTO places, counts USING grid, dpsql_internal._negated(grid);
END $$;

-- Private label bound (regression): the quantile-q value of |y| by the same scan, at the
-- whole epsilon, registered as label_bound. The linear mechanisms use it as the public bound on
-- |y| (docs/linear.md): AdaSSP clips y to [-label_bound, label_bound] in its aggregate (its
-- sensitivities assume it), DP-SSGD and DP-AMBSSGD derive their clip norm and domain from it
-- and clip per-example gradients, so the rows above the bound never break the privacy proof.
-- search_range is a public range of |y|: 0 <= a < b; NULL is {0, 2^40}.
CREATE OR REPLACE FUNCTION dpsql.estimate_label_bound(dataset text, epsilon float8, search_range float8[] DEFAULT NULL,
                                                      quantile float8 DEFAULT 0.99,
                                                      noise_seed bigint DEFAULT NULL)
RETURNS float8 LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ds dpsql.datasets;
    g record;
    v record;
    r bigint;
    bound float8;
BEGIN
    ds := dpsql_internal._estimation_dataset(dataset, 'estimate label bounds', noise_seed);
    -- a privacy unit of k rows: planned at epsilon / k, charged epsilon (64_privacy_units.sql)
    epsilon := (dpsql_internal._unit_release_target(ds, epsilon, 0)).epsilon;
    IF ds.labels IS NOT NULL THEN
        PERFORM dpsql_internal._fail(format('dataset %s is a classification dataset (labels %s)', ds.name, ds.labels),
                            hint => 'A label bound is for regression: register with regression => true (and no labels).');
    END IF;
    IF ds.label_bound IS NOT NULL THEN
        PERFORM dpsql_internal._fail(format('dataset %s already has a label bound', ds.name),
                            hint => 'A label bound is estimated once, for a dataset registered without it.');
    END IF;
    IF quantile IS NULL OR NOT (0 < quantile AND quantile <= 1) THEN
        PERFORM dpsql_internal._fail(format('quantile must be in (0, 1], got %s', coalesce(quantile::text, 'NULL')));
    END IF;
    g := dpsql_internal._estimate_range(ds, epsilon, coalesce(search_range, '{0,1099511627776}'), 0);
    r := greatest(1, ceil(quantile * g.m));
    PERFORM dpsql_internal._check_scan_epsilon('label bound', g.m, epsilon, g.m - r);
    PERFORM dpsql_internal._charge(ds.dataset_id, epsilon, 0, 'estimate_label_bound',
                          note => format('quantile %s of |%s| over [%s, %s]', quantile, ds.label, g.a, g.b));
    v := dpsql_internal._label_places(ds, g.grid);
    bound := dpsql_internal._private_scan(g.grid, v.places, v.counts, r, true, epsilon, noise_seed);
    IF bound <= 0 THEN  -- > 0 (post-processing: labels all 0, or a = 0 drawn): the next point
        bound := (SELECT min(x) FROM unnest(g.grid) x WHERE x > 0);
    END IF;
    UPDATE dpsql.datasets d SET label_bound = bound WHERE d.dataset_id = ds.dataset_id;
    PERFORM dpsql_internal._record_change(ds.dataset_id,
                                          jsonb_build_object('label_bound', jsonb_build_array(ds.label_bound, bound)));
    RETURN bound;
END $$;
COMMENT ON FUNCTION dpsql.estimate_label_bound(text, float8, float8[], float8, bigint) IS
    'Private bound on |y| of a regression dataset registered without one, charged to its ledger (noise_seed: tests only)';

-- register_dataset(..., estimate => ...): the estimates to run at registration, each with its
-- own epsilon (charged separately, basic composition: the total is their sum, delta 0):
--   {"feature_bounds": {"epsilon": e1 [, "search_range": [a, b]]
--                       [, "lower_quantile": .01, "upper_quantile": .99]},
--    "label_bound":    {"epsilon": e2 [, "search_range": [0, B]] [, "quantile": .99]},
--    "noise_seed": n}                                              (tests only)
-- Checked here for shape only; the numbers by the estimates themselves (one place each).
CREATE OR REPLACE FUNCTION dpsql_internal._check_estimate_option(estimate jsonb)
RETURNS void LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    step text;
    k text;
    usage constant text := 'estimate => {"feature_bounds": {"epsilon": e[, "search_range": [a, b]]}, '
                           '"label_bound": {"epsilon": e[, "search_range": [0, b]]}} (either or both)';
BEGIN
    IF estimate IS NULL THEN
        RETURN;
    END IF;
    IF jsonb_typeof(estimate) <> 'object'
       OR NOT (estimate ? 'feature_bounds' OR estimate ? 'label_bound')
       OR EXISTS (SELECT 1 FROM jsonb_object_keys(estimate) o(key)
                   WHERE o.key NOT IN ('feature_bounds', 'label_bound', 'noise_seed')) THEN
        PERFORM dpsql_internal._fail(format('estimate must name feature_bounds and/or label_bound, got %s', estimate),
                            hint => usage);
    END IF;
    IF estimate ? 'noise_seed' THEN
        IF jsonb_typeof(estimate->'noise_seed') <> 'number' THEN
            PERFORM dpsql_internal._fail(format('estimate.noise_seed must be an integer, got %s', estimate->'noise_seed'));
        END IF;
        IF (estimate->>'noise_seed')::numeric NOT BETWEEN -9223372036854775808 AND 9223372036854775807
           OR (estimate->>'noise_seed')::numeric % 1 <> 0 THEN
            PERFORM dpsql_internal._fail(format('estimate.noise_seed must be an integer, got %s', estimate->'noise_seed'));
        END IF;
    END IF;
    FOREACH step IN ARRAY ARRAY['feature_bounds', 'label_bound'] LOOP
        CONTINUE WHEN NOT estimate ? step;
        IF jsonb_typeof(estimate->step) <> 'object' THEN
            PERFORM dpsql_internal._fail(format('estimate.%s must be an object, got %s', step, estimate->step),
                                hint => usage);
        END IF;
        FOR k IN SELECT jsonb_object_keys(estimate->step) LOOP
            IF k <> ALL (CASE step WHEN 'feature_bounds'
                                   THEN '{epsilon,search_range,lower_quantile,upper_quantile}'
                                   ELSE '{epsilon,search_range,quantile}' END::text[]) THEN
                PERFORM dpsql_internal._fail(format('unknown key estimate.%s.%s', step, k), hint => usage);
            END IF;
            IF k <> 'search_range' AND jsonb_typeof(estimate->step->k) <> 'number' THEN
                PERFORM dpsql_internal._fail(format('estimate.%s.%s must be a number, got %s', step, k,
                                           estimate->step->k));
            END IF;
        END LOOP;
        IF NOT estimate->step ? 'epsilon' THEN
            PERFORM dpsql_internal._fail(format('estimate.%s needs epsilon', step), hint => usage);
        END IF;
        IF estimate->step ? 'search_range'  -- optional: the estimate's default range
           AND (jsonb_typeof(estimate->step->'search_range') <> 'array'
                OR jsonb_array_length(estimate->step->'search_range') <> 2
                OR EXISTS (SELECT 1 FROM jsonb_array_elements(estimate->step->'search_range') e
                       WHERE jsonb_typeof(e) <> 'number')) THEN
            PERFORM dpsql_internal._fail(format('estimate.%s.search_range must be [a, b], got %s', step,
                                       estimate->step->'search_range'));
        END IF;
        -- A number jsonb holds that float8 does not (1e400) fails here, not mid-registration.
        BEGIN
            PERFORM (estimate->step->>o.key)::float8 FROM jsonb_object_keys(estimate->step) o(key)
              WHERE o.key <> 'search_range';
            PERFORM e::text::float8 FROM jsonb_array_elements(estimate->step->'search_range') e;
        EXCEPTION WHEN numeric_value_out_of_range THEN
            PERFORM dpsql_internal._fail(format('estimate.%s has a number out of float8''s range', step));
        END;
    END LOOP;
END $$;

-- The estimates of a registration (checked by _check_estimate_option), on the dataset just
-- inserted under this name, in this transaction: feature bounds first (a regression dataset's
-- row_bound follows from them), then the label bound.
CREATE OR REPLACE FUNCTION dpsql_internal._estimate_at_registration(dataset text, estimate jsonb)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    seed bigint := (estimate->>'noise_seed')::bigint;
    e jsonb;
BEGIN
    -- Named arguments for the keys given only: the defaults stay the estimates' own.
    IF estimate ? 'feature_bounds' THEN
        e := estimate->'feature_bounds';
        EXECUTE format('SELECT dpsql.estimate_bounds($1, $2, $3, noise_seed => $4%s%s)',
                       CASE WHEN e ? 'lower_quantile' THEN ', lower_quantile => $5' END,
                       CASE WHEN e ? 'upper_quantile' THEN ', upper_quantile => $6' END)
            USING dataset, (e->>'epsilon')::float8,
                  CASE WHEN e ? 'search_range' THEN dpsql_internal._jsonb_float8s(e->'search_range') END, seed,
                  (e->>'lower_quantile')::float8, (e->>'upper_quantile')::float8;
    END IF;
    IF estimate ? 'label_bound' THEN
        e := estimate->'label_bound';
        EXECUTE format('SELECT dpsql.estimate_label_bound($1, $2, $3, noise_seed => $4%s)',
                       CASE WHEN e ? 'quantile' THEN ', quantile => $5' END)
            USING dataset, (e->>'epsilon')::float8,
                  CASE WHEN e ? 'search_range' THEN dpsql_internal._jsonb_float8s(e->'search_range') END, seed,
                  (e->>'quantile')::float8;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION dpsql_internal._jsonb_float8s(numbers jsonb)
RETURNS float8[] LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT ARRAY(SELECT v::text::float8 FROM jsonb_array_elements(numbers) WITH ORDINALITY AS t(v, k)
                  ORDER BY k)
$$;
