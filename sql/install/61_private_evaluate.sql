------------------------------------------------------------------------------------------
-- Private evaluation (issue 44, item 1): dpsql.evaluate(model_id, '<dataset>', epsilon => e)
--
-- An analyst granted a registered dataset (a held-out test set, say) learns how good a model
-- is on it without reading a row: the metrics are post-processing of noisy sufficient
-- statistics, released once and charged once to that dataset's ledger (mechanism 'evaluate',
-- the model in the note). docs/privacy.md, "Private evaluation", has the argument in prose.
--
-- What is released (replace-one neighbours, one row = one person, the row count m public:
-- counting rows reads no value). Each row is mapped by a public function (the model, which
-- the caller can see, with its feature bounds and preprocessing) to its prediction p and its
-- label y; a row whose p or y is missing or malformed (NULL, NaN, a label outside the public
-- set) is left out of every statistic (no error that depends on a row).
--   Two classes: the confusion matrix (tp, fp, fn, tn) and, per true label, the histogram of
--     p over a public grid of 16 bins (sizes: 4 + 32 counts). The grid is on the score s
--     (the logit of p for a logistic model, the raw score otherwise): boundaries 0 and
--     +-2^k for k = -3 .. 3, so the decision threshold (s >= 0, p >= 0.5) is a boundary, the
--     bins are fine near it and grow with |s| (a grid that fits probabilities and unbounded
--     scores alike, and does not depend on the data). Replacing one row moves one count of
--     each block down by one and one up: L1 sensitivity 2 per block, L2 sqrt 2.
--   Several classes: the k x k confusion matrix (true class, predicted class): L1 2, L2 sqrt 2.
--   Regression (the dataset's public label bound B): y clipped to [-B, B], the residual
--     r = p - y clipped to [-2B, 2B]; the count n of rows with both, sum y, sum y^2, sum r^2,
--     sum |r|, and then sum |y - c| around the released mean c = clip(sum y / n, -B, B) (the
--     mean baseline's absolute error: a second release, adaptively composed). A row's
--     contribution lies in [0, 1], [-B, B], [0, B^2], [0, 4B^2], [0, 2B], [0, 2B] (0 when it
--     is left out), so the replace-one sensitivities are 1, 2B, B^2, 4B^2, 2B, 2B.
--
-- Noise. delta = 0 (the default): every count gets discrete Laplace noise (P(k) ~
--   exp(-|k| / t), t = L1 / (epsilon share)), exact integers as in estimate_bounds; the bounded
--   float sums are first quantized to a public grid of Q = 2^20 steps of their range (a row's
--   value rounded to the nearest multiple of range / Q: a public per-row map, so the integer
--   sum's sensitivity is Q steps) and get integer noise of scale Q / (epsilon share); the
--   released sum is the noisy integer times the step. Each block is (epsilon share)-DP, the
--   shares add up to 1: epsilon-DP by basic composition, delta 0. The ledger records a
--   ComposedDpEvent of one (epsilon share, 0) event per block: dp-accounting's LaplaceDpEvent
--   describes continuous Laplace noise, whose privacy profile does not dominate the discrete
--   one's (at 0 < eps' < epsilon its delta is smaller), so it would understate the spend.
-- delta > 0: Gaussian noise on the raw (unquantized) statistics, block b with sigma_b =
--   L2_b sigma_1 / sqrt(share_b), sigma_1 = dpsql.gaussian_sigma(1, epsilon, delta) (analytic
--   Gaussian, Balle and Wang 2018): the statistics divided by their sigmas move by at most
--   sqrt(sum share_b) / sigma_1 = 1 / sigma_1 in L2 norm, one Gaussian mechanism of
--   sensitivity 1 and noise sigma_1, recorded as GaussianDpEvent(2 sigma_1) (the ledger's
--   replace-one convention, dpsql/ledger_events.py: sensitivity 2 per unit multiplier).
--
--   Classifiers also release the count of correct predictions (replace-one sensitivity 1):
--     accuracy, the main metric, is that count over the public row count (the target:
--     within 0.005 at epsilon 0.1 on 10k rows; the matrix's tp + tn carries two cells' noise
--     of a sensitivity-2 block, 2.8 times the sd at the same share).
--
-- The split of epsilon (public, the same for every call): two classes 1/2 correct count, 1/4
-- confusion matrix, 1/4 histograms; several classes 1/2 correct count, 1/2 matrix; regression
-- count 0.1, sum y 0.15, sum y^2 0.2, sum r^2 0.3, sum |r| 0.15, sum |y - c| 0.1.
--
-- Metrics (post-processing of the statistics as released, each clamped to its range after):
-- accuracy from the correct count over the rows (a row the model cannot score counts as a
-- miss); balanced accuracy, F1 and the majority-class baseline from the confusion matrix;
-- ROC AUC from the two histograms (Mann-Whitney, ties within a bin counted half); MSE, MAE,
-- R^2 and the mean baseline from the sums, over the noisy count. Each metric's noise standard
-- deviation (metrics->'noise_sd'): every statistic's noise sd propagated to first order, by
-- central differences one sd wide at the released values (an estimate: post-processing too).
-- Log loss is not released (it would need p itself, unbounded near 0 and 1).
--
-- Every refusal that needs no row comes before the charge: unknown or invisible model, a
-- dataset not granted, a model whose features, categories or labels are not the dataset's,
-- epsilon or delta out of range, a noise seed from a caller who cannot read the rows, the
-- budget (the charge itself).
------------------------------------------------------------------------------------------

-- The public score grid: 15 boundaries, 16 bins (the header). Scores, ascending.
CREATE OR REPLACE FUNCTION dpsql_internal._evaluation_score_grid()
RETURNS float8[] LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT '{-8,-4,-2,-1,-0.5,-0.25,-0.125,0,0.125,0.25,0.5,1,2,4,8}'::float8[]
$$;

-- The grid as a model's outputs: probabilities (a logistic model, sigmoid of the scores:
-- 0.5 exactly at 0) or the scores.
CREATE OR REPLACE FUNCTION dpsql_internal._evaluation_thresholds(loss_code int)
RETURNS float8[] LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN loss_code = dpsql_internal._loss_code('logistic')
                THEN ARRAY(SELECT 1 / (1 + exp(-s)) FROM unnest(g) WITH ORDINALITY AS u(s, k) ORDER BY k)
                ELSE g END
      FROM (SELECT dpsql_internal._evaluation_score_grid() AS g) grid
$$;

-- What kind of evaluation a model gets: 'binary', 'multiclass' or 'regression'.
CREATE OR REPLACE FUNCTION dpsql_internal._evaluation_kind(m dpsql.models)
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN m.model = 'linear' THEN 'regression'
                WHEN array_ndims(m.weights) = 2 THEN 'multiclass' ELSE 'binary' END
$$;

-- (_discrete_laplace_sd, the sd of discrete Laplace noise: 60_describe.sql, one definition for both)

-- The statistics of a private evaluation of model m (of kind, _evaluation_kind) on dataset ds, in
-- blocks {name, size, unit, l1, l2, share} (header of _private_evaluation_plan, below): a
-- regression model's six sums, a classifier's confusion matrix (a binary one's score histogram
-- too) and correct count; refuses a model and a dataset of different tasks, a regression
-- dataset without a usable label bound, and a classifier without classes.
CREATE OR REPLACE FUNCTION dpsql_internal._private_evaluation_blocks(m dpsql.models, ds dpsql.datasets,
                                                                     kind text, gaussian boolean)
RETURNS jsonb LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q constant float8 := 1048576;  -- Q = 2^20 quantization steps per range (header)
    b float8 := ds.label_bound;
    k int := cardinality(m.classes);
    blocks jsonb;
BEGIN
    IF kind = 'regression' THEN
        IF ds.labels IS NOT NULL THEN
            PERFORM dpsql_internal._fail(
                format('model %s is a regression model and dataset %s a classification dataset',
                       m.model_id, quote_literal(ds.name)), '22023');
        END IF;
        IF b IS NULL OR NOT (b >= 1e-100 AND b <= 1e100) THEN
            PERFORM dpsql_internal._fail(
                format('dataset %s has no label bound in [1e-100, 1e100] to clip its labels and residuals to',
                       quote_literal(ds.name)), '55000',
                hint => 'A data owner sets it: dpsql.estimate_label_bound(dataset, epsilon, search_range).');
        END IF;
        blocks := jsonb_build_array(
            jsonb_build_object('name', 'count', 'size', 1, 'range', 1, 'share', 0.1),
            jsonb_build_object('name', 'sum_y', 'size', 1, 'range', 2 * b, 'share', 0.15),
            jsonb_build_object('name', 'sum_y2', 'size', 1, 'range', b * b, 'share', 0.2),
            jsonb_build_object('name', 'sum_r2', 'size', 1, 'range', 4 * b * b, 'share', 0.3),
            jsonb_build_object('name', 'sum_abs_r', 'size', 1, 'range', 2 * b, 'share', 0.15),
            jsonb_build_object('name', 'sum_abs_dev', 'size', 1, 'range', 2 * b, 'share', 0.1));
        -- one number each: L1 = L2 = its range; counts are not quantized, sums are (pure epsilon)
        SELECT jsonb_agg(e || jsonb_build_object(
                   'l1', (e->>'range')::float8, 'l2', (e->>'range')::float8,
                   'unit', CASE WHEN e->>'name' = 'count' OR gaussian THEN 1
                                ELSE (e->>'range')::float8 / q END) ORDER BY i)
          INTO blocks FROM jsonb_array_elements(blocks) WITH ORDINALITY AS t(e, i);
    ELSE
        IF ds.labels IS NULL THEN
            PERFORM dpsql_internal._fail(
                format('model %s is a classifier and dataset %s a regression dataset',
                       m.model_id, quote_literal(ds.name)), '22023');
        END IF;
        IF k IS NULL OR k < 2 THEN
            PERFORM dpsql_internal._fail(format('model %s has no classes', m.model_id));
        END IF;
        -- the correct count last: accuracy, the main metric, from one count of sensitivity 1
        -- (a confusion matrix's tp + tn carries two cells' noise of a block of sensitivity 2)
        blocks := CASE kind
            WHEN 'binary' THEN jsonb_build_array(
                jsonb_build_object('name', 'confusion', 'size', 4, 'share', 0.25),
                jsonb_build_object('name', 'histogram', 'size', 32, 'share', 0.25),
                jsonb_build_object('name', 'correct', 'size', 1, 'share', 0.5))
            ELSE jsonb_build_array(jsonb_build_object('name', 'confusion', 'size', k * k, 'share', 0.5),
                                   jsonb_build_object('name', 'correct', 'size', 1, 'share', 0.5)) END;
        SELECT jsonb_agg(e || CASE WHEN e->>'name' = 'correct'
                                   THEN jsonb_build_object('l1', 1, 'l2', 1, 'unit', 1)
                                   ELSE jsonb_build_object('l1', 2, 'l2', sqrt(2::float8), 'unit', 1) END
                         ORDER BY i)
          INTO blocks FROM jsonb_array_elements(blocks) WITH ORDINALITY AS t(e, i);
    END IF;
    RETURN blocks;
END $$;

-- The public plan of a private evaluation of model m on dataset ds: its statistics in blocks
-- ({name, size, unit, l1, l2, share}: unit the step a sum is quantized to, 1 for counts; the
-- sensitivities in the statistic's own units), the mechanism and its noise per block, and the
-- DpEvent the ledger records. Refuses (before any charge) what needs no row: the epsilon,
-- delta and model checks of the header.
CREATE OR REPLACE FUNCTION dpsql_internal._private_evaluation_plan(m dpsql.models, ds dpsql.datasets,
                                                                   epsilon float8, delta float8)
RETURNS jsonb LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    kind text := dpsql_internal._evaluation_kind(m);
    blocks jsonb;
    gaussian boolean;
    sigma1 float8;
    out jsonb := '[]'::jsonb;
    blk jsonb;
    events jsonb := '[]'::jsonb;
BEGIN
    IF epsilon IS NULL OR NOT (epsilon > 0 AND epsilon < 'Infinity') THEN
        PERFORM dpsql_internal._fail(format('epsilon must be a finite number > 0, got %s',
                                            coalesce(epsilon::text, 'NULL')),
                                     hint => 'A private evaluation spends epsilon of the dataset''s budget.');
    END IF;
    IF delta IS NULL OR NOT (delta >= 0 AND delta < 1) THEN
        PERFORM dpsql_internal._fail(format('delta must be in [0, 1), got %s', coalesce(delta::text, 'NULL')),
                                     hint => '0 (the default): discrete Laplace noise; > 0: Gaussian noise.');
    END IF;
    gaussian := delta > 0;
    blocks := dpsql_internal._private_evaluation_blocks(m, ds, kind, gaussian);
    IF gaussian THEN
        -- at least 1e-150 (more noise, as private), so that no product with it underflows
        sigma1 := greatest(dpsql.gaussian_sigma(1, epsilon, delta), 1e-150);
    END IF;
    FOR blk IN SELECT e FROM jsonb_array_elements(blocks) WITH ORDINALITY AS t(e, i) ORDER BY i LOOP
        IF gaussian THEN
            -- sigma_b = L2_b sigma_1 / sqrt(share_b), in the statistic's units
            blk := blk || jsonb_build_object(
                'sigma', (blk->>'l2')::float8 * sigma1 / sqrt((blk->>'share')::float8));
            blk := blk || jsonb_build_object('noise_sd', blk->'sigma');
        ELSE
            IF epsilon * (blk->>'share')::float8 < 1e-9 THEN
                PERFORM dpsql_internal._fail(
                    format('epsilon per statistic must be at least 1e-9, got %s for %s',
                           epsilon * (blk->>'share')::float8, blk->>'name'),
                    hint => 'A private evaluation splits epsilon over its statistics (docs/privacy.md).');
            END IF;
            -- t = L1 in integer steps / (epsilon share); the released value is the step times
            -- (at least 1e-200, more noise, as private: a draw's scale * ln U never underflows)
            blk := blk || jsonb_build_object(
                'scale', greatest((blk->>'l1')::float8 / (blk->>'unit')::float8
                                  / (epsilon * (blk->>'share')::float8), 1e-200));
            blk := blk || jsonb_build_object(
                'noise_sd', (blk->>'unit')::float8 * dpsql_internal._discrete_laplace_sd((blk->>'scale')::float8));
            events := events || jsonb_build_object('type', 'EpsilonDelta',
                                                   'epsilon', epsilon * (blk->>'share')::float8, 'delta', 0);
        END IF;
        out := out || jsonb_build_array(blk);
    END LOOP;
    RETURN jsonb_build_object(
        'kind', kind, 'epsilon', epsilon, 'delta', delta,
        'mechanism', CASE WHEN gaussian THEN 'gaussian' ELSE 'discrete_laplace' END,
        'blocks', out,
        'score_grid', CASE WHEN kind = 'binary' THEN to_jsonb(dpsql_internal._evaluation_score_grid()) END,
        'sigma_1', sigma1,
        'dp_event', CASE WHEN gaussian THEN jsonb_build_object('type', 'Gaussian', 'noise_multiplier', 2 * sigma1)
                         ELSE jsonb_build_object('type', 'Composed', 'events', events) END);
END $$;

-- Whether model m can be evaluated on dataset ds: the same registered columns in the same
-- order, the same categories, the same label classes (a refusal before the charge, public).
CREATE OR REPLACE FUNCTION dpsql_internal._check_evaluation_pair(m dpsql.models, ds dpsql.datasets,
                                                                 features text[], label text)
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    hint constant text := 'A private evaluation reads the dataset''s registered columns: evaluate a model '
                          'trained on the same columns (its training dataset''s holdout, or a test '
                          'dataset registered like it).';
BEGIN
    IF features IS NOT NULL AND features IS DISTINCT FROM ds.features THEN
        PERFORM dpsql_internal._fail(format('dataset %s has features %s, not %s', quote_literal(ds.name),
                                            ds.features, features), hint => 'Leave features NULL.');
    END IF;
    IF label IS NOT NULL AND label IS DISTINCT FROM ds.label THEN
        PERFORM dpsql_internal._fail(format('dataset %s has label %s, not %s', quote_literal(ds.name),
                                            ds.label, label), hint => 'Leave label NULL.');
    END IF;
    IF m.features IS DISTINCT FROM ds.features OR m.n_features IS DISTINCT FROM ds.dim
       OR coalesce(nullif(m.params->'categories', 'null'), '{}') <> coalesce(ds.categories, '{}') THEN
        PERFORM dpsql_internal._fail(
            format('model %s reads features %s (%s coordinates), dataset %s has %s (%s)', m.model_id,
                   m.features, m.n_features, quote_literal(ds.name), ds.features, ds.dim), '22023', hint);
    END IF;
    IF (m.classes IS NULL) <> (ds.labels IS NULL)
       OR (m.classes IS NOT NULL AND m.classes::text <> ds.labels::text)
       OR dpsql_internal._model_label_values(m) IS DISTINCT FROM ds.label_values THEN
        PERFORM dpsql_internal._fail(
            format('model %s predicts %s, dataset %s has labels %s', m.model_id,
                   coalesce(dpsql_internal._model_label_values(m)::text, m.classes::text, 'numbers'),
                   quote_literal(ds.name), coalesce(ds.label_values::text, ds.labels::text, 'numbers')),
            '22023', hint);
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(m.weights) w WHERE NOT (w > '-Infinity' AND w < 'Infinity')) THEN
        PERFORM dpsql_internal._fail(format('model %s has non-finite coefficients', m.model_id), '22023');
    END IF;
END $$;

-- The (p, y) pairs of a dataset's rows under model m, as SQL: p the model's output (NULL for
-- a row it cannot score: a malformed row), y the label as training reads it (NULL outside the
-- public set). Only C functions and built-ins per row; none raises for any row value: the
-- rows are bounded as the model was trained, checked for length and finiteness, and scaled
-- into a ball where no score overflows (a norm no bounded row reaches).
CREATE OR REPLACE FUNCTION dpsql_internal._evaluation_pairs_sql(m dpsql.models, ds dpsql.datasets)
RETURNS text LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    src text := dpsql_internal._private_from(ds);
    feat record;
    x text;
    big float8;
BEGIN
    feat := dpsql_internal._feature_sql(src, ds.features,
                                        dpsql_internal._jsonb_weights(nullif(m.params->'feature_bounds', 'null')),
                                        dpsql_internal._feature_types(ds), ds.dim,
                                        categories => ds.categories);
    x := feat.expr;
    IF m.params->'privacy'->'preprocessing' <> 'null' THEN
        x := dpsql_internal._preprocessed_sql(x, m.params->'privacy'->'preprocessing');
    END IF;
    SELECT 1e150 / greatest(1, max(abs(w))) / greatest(1, count(*)) INTO big FROM unnest(m.weights) w;
    x := format('dpsql_internal._clip_norm(dpsql_internal._preprocess(%s, NULL, 0, %L::float8[]), %L::float8)',
                x, array_fill(0::float8, ARRAY[m.n_features]), big);
    RETURN format('SELECT dpsql_internal._predict(%s, %s, %L::float8[], %s) AS p, %s AS y FROM %s',
                  dpsql_internal._loss_code(m.model), m.flags, m.weights, x,
                  dpsql_internal._label_sql(m.model, ds.label, m.classes, false,
                                            dpsql_internal._model_label_values(m)),
                  src);
END $$;

-- The exact statistics (the header's blocks, concatenated; sums in quantization steps when the
-- plan quantizes). c: the released mean for the regression's sum |y - c| (stage 2), else NULL.
CREATE OR REPLACE FUNCTION dpsql_internal._evaluation_statistics(m dpsql.models, ds dpsql.datasets,
                                                                 plan jsonb, c float8 DEFAULT NULL)
RETURNS float8[] LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    pairs text := dpsql_internal._evaluation_pairs_sql(m, ds);
    kind text := plan->>'kind';
    k int := cardinality(m.classes);
    b float8 := ds.label_bound;
    units float8[];
    quantize boolean := plan->>'mechanism' = 'discrete_laplace';
    stats float8[];
    cell int;
    bin int;
    n bigint;
    yc text;
    res text;
BEGIN
    IF kind = 'binary' THEN
        stats := array_fill(0::float8, ARRAY[36]);  -- then the correct count (37)
        FOR cell, bin, n IN EXECUTE format(
            'SELECT CASE WHEN pos THEN CASE WHEN y > 0 THEN 1 ELSE 2 END'
            '            ELSE CASE WHEN y > 0 THEN 3 ELSE 4 END END AS cell,'
            '       4 + CASE WHEN y > 0 THEN 16 ELSE 0 END + width_bucket(p, $1) + 1 AS bin, count(*) AS n'
            '  FROM (SELECT p, y, dpsql_internal._is_positive(%s, p) AS pos FROM (%s) e0) e'
            ' WHERE pos IS NOT NULL AND y IS NOT NULL GROUP BY 1, 2',
            dpsql_internal._loss_code(m.model), pairs)
            USING dpsql_internal._evaluation_thresholds(dpsql_internal._loss_code(m.model))
        LOOP
            stats[cell] := stats[cell] + n;
            stats[bin] := stats[bin] + n;
        END LOOP;
        RETURN stats || (stats[1] + stats[4]);  -- the correct count
    ELSIF kind = 'multiclass' THEN
        stats := array_fill(0::float8, ARRAY[k * k]);
        FOR cell, n IN EXECUTE format(
            'SELECT (y::int * $1 + p::int + 1) AS cell, count(*) AS n FROM (%s) e'
            ' WHERE p IS NOT NULL AND y IS NOT NULL AND p >= 0 AND p < $1 AND y >= 0 AND y < $1'
            ' GROUP BY 1', pairs) USING k
        LOOP
            stats[cell] := n;
        END LOOP;
        RETURN stats || (SELECT sum(stats[j * k + j + 1]) FROM generate_series(0, k - 1) g(j));  -- correct
    END IF;
    SELECT array_agg((e->>'unit')::float8 ORDER BY i) INTO units
      FROM jsonb_array_elements(plan->'blocks') WITH ORDINALITY AS t(e, i);
    -- regression: rows with a finite prediction and a label that is a number. A value below
    -- b 1e-12 in magnitude counts as 0 (far below a quantization step, b 2^-19): no square or
    -- quotient of a row's value underflows (float8 raises on underflow; no row may raise).
    yc := dpsql_internal._evaluation_clip_sql('y', b, b * 1e-12);
    res := dpsql_internal._evaluation_clip_sql(format('(p - %s)', yc), 2 * b, b * 1e-12);
    IF c IS NULL THEN
        EXECUTE format(
            'SELECT ARRAY[count(*)::float8, %s, %s, %s, %s] FROM (%s) e'
            ' WHERE p IS NOT NULL AND y IS NOT NULL AND p <> ''NaN'' AND y <> ''NaN''',
            dpsql_internal._quantized_sum(yc, units[2], quantize),
            dpsql_internal._quantized_sum(yc || ' ^ 2', units[3], quantize),
            dpsql_internal._quantized_sum(res || ' ^ 2', units[4], quantize),
            dpsql_internal._quantized_sum(format('abs(%s)', res), units[5], quantize), pairs)
            INTO stats;
        RETURN stats;
    END IF;
    EXECUTE format('SELECT ARRAY[%s] FROM (%s) e'
                   ' WHERE p IS NOT NULL AND y IS NOT NULL AND p <> ''NaN'' AND y <> ''NaN''',
                   dpsql_internal._quantized_sum(
                       format('abs(%s)', dpsql_internal._evaluation_clip_sql(format('(%s - %L::float8)', yc, c),
                                                                             2 * b, b * 1e-12)),
                       units[6], quantize),
                   pairs)
        INTO stats;
    RETURN stats;
END $$;

-- SQL of v clipped to [-hi, hi], 0 when |v| < tiny (the regression's per-row values): built-ins
-- only, written into the scan (a SQL function of dpsql's has pinned settings: never inlined).
CREATE OR REPLACE FUNCTION dpsql_internal._evaluation_clip_sql(v text, hi float8, tiny float8)
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT format('CASE WHEN abs(%1$s) < %3$L::float8 THEN 0::float8 ELSE least(greatest(%1$s, %4$L::float8), %2$L::float8) END',
                  v, hi, tiny, -hi)
$$;

-- SQL of a sum over the rows of v: in quantization steps of unit (each row's value rounded:
-- a public map), or as is (Gaussian noise). 0 over no rows.
CREATE OR REPLACE FUNCTION dpsql_internal._quantized_sum(v text, unit float8, quantize boolean)
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN quantize THEN format('coalesce(sum(round((%s) / %L::float8)::bigint), 0)::float8', v, unit)
                ELSE format('coalesce(sum(%s), 0)::float8', v) END
$$;

-- The statistics plus their noise (plan's mechanism), in the statistics' own units (sums
-- times their step). first: the position of the first statistic among the plan's (its
-- discrete Laplace draws' stream positions, its Gaussian stream).
CREATE OR REPLACE FUNCTION dpsql_internal._noised_statistics(plan jsonb, stats float8[], first int,
                                                             seed bigint)
RETURNS float8[] LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    out float8[] := '{}'::float8[];
    blk jsonb;
    pos int := 0;   -- 0-based position of the block's first statistic in the plan
    size int;
    lo int;
    hi int;
    part float8[];
BEGIN
    FOR blk IN SELECT e FROM jsonb_array_elements(plan->'blocks') WITH ORDINALITY AS t(e, i) ORDER BY i LOOP
        size := (blk->>'size')::int;
        -- the block's statistics among those given (stats starts at position first)
        lo := greatest(pos, first);
        hi := least(pos + size, first + cardinality(stats));
        IF lo < hi THEN
            part := stats[lo - first + 1 : hi - first];
            IF plan->>'mechanism' = 'gaussian' THEN
                part := dpsql_internal._add_gaussian(part, (blk->>'sigma')::float8, seed, lo);
            ELSE
                SELECT array_agg(((v + dpsql_internal._discrete_laplace(seed, lo + i - 1,
                                                                         (blk->>'scale')::float8))
                                  * (blk->>'unit')::float8) ORDER BY i)
                  INTO part FROM unnest(part) WITH ORDINALITY AS u(v, i);
            END IF;
            out := out || part;
        END IF;
        pos := pos + size;
    END LOOP;
    RETURN out;
END $$;

-- The metrics of released statistics (post-processing; the header's definitions), with the
-- baseline's. The statistics are used as released, negative ones included (clamping a noisy
-- count at 0 biases every ratio of it: an empty bin's noise would always add mass), and each
-- metric is then clamped to its range ([0, 1]; MSE, MAE and the variance >= 0; R^2 <= 1);
-- clamped false: not (the noise sds' differences, which a clamp would flatten to 0).
-- rows: the public row count, over which accuracy is the noisy correct count's share (a row
-- the model cannot score, or whose label is outside the set, counts as a miss); NULL: over
-- the confusion matrix's noisy total.
DROP FUNCTION IF EXISTS dpsql_internal._metrics_of_statistics(text, float8[]);
DROP FUNCTION IF EXISTS dpsql_internal._metrics_of_statistics(text, float8[], boolean);
DROP FUNCTION IF EXISTS dpsql_internal._unit_clamp(float8);
CREATE OR REPLACE FUNCTION dpsql_internal._metrics_of_statistics(kind text, s float8[], clamped boolean DEFAULT true,
                                                                 rows float8 DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tp float8; fp float8; fn float8; tn float8;
    n float8;
    prior float8;
    npos float8; nneg float8;
    below float8 := 0;
    area float8 := 0;
    k int;
    support float8; predicted float8; diag float8;
    correct float8 := 0;
    balanced float8 := 0;
    f1 float8 := 0;
    present int := 0;
    listed int := 0;
    majority float8 := 0;
    mse float8; mae float8; mean float8; var float8;
    hits float8;
BEGIN
    IF kind = 'binary' THEN
        hits := s[37];
        tp := s[1]; fp := s[2]; fn := s[3]; tn := s[4];
        n := tp + fp + fn + tn;
        IF n <= 0 THEN
            RETURN NULL;
        END IF;
        prior := dpsql_internal._unit_clamp((tp + fn) / n, clamped);
        npos := (SELECT sum(x) FROM unnest(s[21:36]) x);
        nneg := (SELECT sum(x) FROM unnest(s[5:20]) x);
        FOR i IN 1..16 LOOP
            area := area + s[20 + i] * (below + s[4 + i] / 2);
            below := below + s[4 + i];
        END LOOP;
        RETURN jsonb_strip_nulls(jsonb_build_object(
            'accuracy', dpsql_internal._unit_clamp(CASE WHEN rows > 0 AND hits IS NOT NULL THEN hits / rows
                                                        ELSE (tp + tn) / n END, clamped),
            'balanced_accuracy', dpsql_internal._unit_clamp(
                (CASE WHEN tp + fn > 0 THEN dpsql_internal._unit_clamp(tp / (tp + fn), clamped) END
                 + CASE WHEN tn + fp > 0 THEN dpsql_internal._unit_clamp(tn / (tn + fp), clamped) END) / 2, clamped),
            -- (a label's noisy total at 0 or below: the noise swamps the ranking, 0.5 says so)
            'roc_auc', CASE WHEN npos > 0 AND nneg > 0 THEN dpsql_internal._unit_clamp(area / (npos * nneg), clamped)
                            WHEN clamped THEN 0.5 END,
            'f1', CASE WHEN 2 * tp + fp + fn > 0 THEN dpsql_internal._unit_clamp(2 * tp / (2 * tp + fp + fn), clamped)
                       ELSE 0 END,
            'baseline', jsonb_strip_nulls(jsonb_build_object(
                'predictor', 'majority class',
                'accuracy', greatest(prior, 1 - prior),
                'balanced_accuracy', 0.5,
                'roc_auc', CASE WHEN prior > 0 AND prior < 1 THEN 0.5 END,
                'f1', CASE WHEN prior > 0.5 THEN 2 * prior / (prior + 1) ELSE 0 END))));
    ELSIF kind = 'multiclass' THEN
        k := floor(sqrt(cardinality(s)))::int;  -- k x k cells, then the correct count
        IF cardinality(s) = k * k + 1 THEN
            hits := s[k * k + 1];
            s := s[1 : k * k];
        END IF;
        n := (SELECT sum(x) FROM unnest(s) x);
        IF n <= 0 THEN
            RETURN NULL;
        END IF;
        FOR c IN 0..k - 1 LOOP
            support := (SELECT sum(s[c * k + j + 1]) FROM generate_series(0, k - 1) j);
            predicted := (SELECT sum(s[i * k + c + 1]) FROM generate_series(0, k - 1) i);
            diag := s[c * k + c + 1];
            correct := correct + diag;
            IF support > 0 THEN
                balanced := balanced + dpsql_internal._unit_clamp(diag / support, clamped);
                present := present + 1;
            END IF;
            IF support + predicted > 0 THEN
                f1 := f1 + dpsql_internal._unit_clamp(2 * diag / (support + predicted), clamped);
                listed := listed + 1;
            END IF;
            majority := greatest(majority, support);
        END LOOP;
        majority := least(majority, n);
        RETURN jsonb_build_object(
            'accuracy', dpsql_internal._unit_clamp(CASE WHEN rows > 0 AND hits IS NOT NULL THEN hits / rows
                                                        ELSE correct / n END, clamped),
            'balanced_accuracy', balanced / greatest(present, 1),
            'f1', f1 / greatest(listed, 1),
            'baseline', jsonb_build_object(
                'predictor', 'majority class',
                'accuracy', majority / n,
                'balanced_accuracy', 1.0 / greatest(present, 1),
                'f1', (2 * majority / (majority + n)) / greatest(present, 1)));
    END IF;
    -- regression: count, sum y, sum y^2, sum r^2, sum |r|, sum |y - c|
    n := greatest(s[1], 1);
    mse := CASE WHEN clamped THEN greatest(s[4] / n, 0) ELSE s[4] / n END;
    mae := CASE WHEN clamped THEN greatest(s[5] / n, 0) ELSE s[5] / n END;
    mean := s[2] / n;
    var := CASE WHEN clamped THEN greatest(s[3] / n - mean * mean, 0) ELSE s[3] / n - mean * mean END;
    RETURN jsonb_strip_nulls(jsonb_build_object(
        'mse', mse, 'mae', mae,
        'r2', CASE WHEN var > 0 THEN CASE WHEN clamped THEN least(1 - mse / var, 1) ELSE 1 - mse / var END END,
        'baseline', jsonb_strip_nulls(jsonb_build_object(
            'predictor', 'mean', 'mse', var,
            'mae', CASE WHEN clamped THEN greatest(s[6] / n, 0) ELSE s[6] / n END,
            'r2', CASE WHEN var > 0 THEN 0 END))));
END $$;

-- x clamped to [0, 1] (a rate computed from noisy counts), unless clamped is false.
CREATE OR REPLACE FUNCTION dpsql_internal._unit_clamp(x float8, clamped boolean)
RETURNS float8 LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN clamped THEN least(greatest(x, 0), 1) ELSE x END
$$;

DROP FUNCTION IF EXISTS dpsql_internal._metrics_noise_sd(text, float8[], float8[]);
-- Each metric's noise standard deviation (and its baseline's): the statistics' noise sds
-- propagated to first order, by central differences one sd wide at the released values, of
-- the metrics before their clamps.
CREATE OR REPLACE FUNCTION dpsql_internal._metrics_noise_sd(kind text, s float8[], sd float8[],
                                                            rows float8 DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    up jsonb;
    down jsonb;
    sq jsonb := '{}'::jsonb;
    sq_base jsonb := '{}'::jsonb;
    key text;
    d float8;
BEGIN
    FOR i IN 1..cardinality(s) LOOP
        -- (unclamped: at a clamp the difference would be 0, "0 +- 0" for a metric at its bound)
        up := dpsql_internal._metrics_of_statistics(kind, s[:i - 1] || (s[i] + sd[i]) || s[i + 1:], false, rows);
        down := dpsql_internal._metrics_of_statistics(kind, s[:i - 1] || (s[i] - sd[i]) || s[i + 1:], false, rows);
        CONTINUE WHEN up IS NULL OR down IS NULL;
        FOR key IN SELECT jsonb_object_keys(up) LOOP
            IF jsonb_typeof(up->key) = 'number' AND jsonb_typeof(down->key) = 'number' THEN
                d := ((up->>key)::float8 - (down->>key)::float8) / 2;
                sq := jsonb_set(sq, ARRAY[key], to_jsonb(coalesce((sq->>key)::float8, 0) + d * d));
            END IF;
        END LOOP;
        FOR key IN SELECT jsonb_object_keys(up->'baseline') LOOP
            IF jsonb_typeof(up->'baseline'->key) = 'number' AND jsonb_typeof(down->'baseline'->key) = 'number' THEN
                d := ((up->'baseline'->>key)::float8 - (down->'baseline'->>key)::float8) / 2;
                sq_base := jsonb_set(sq_base, ARRAY[key], to_jsonb(coalesce((sq_base->>key)::float8, 0) + d * d));
            END IF;
        END LOOP;
    END LOOP;
    RETURN (SELECT coalesce(jsonb_object_agg(e.key, sqrt(e.value::text::float8)), '{}') FROM jsonb_each(sq) e)
           || jsonb_build_object('baseline', (SELECT coalesce(jsonb_object_agg(e.key, sqrt(e.value::text::float8)), '{}')
                                                FROM jsonb_each(sq_base) e));
END $$;

-- The noise sd of every statistic of a plan, in order.
CREATE OR REPLACE FUNCTION dpsql_internal._statistics_noise_sd(plan jsonb)
RETURNS float8[] LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT array_agg((e->>'noise_sd')::float8 ORDER BY i, j)
      FROM jsonb_array_elements(plan->'blocks') WITH ORDINALITY AS t(e, i),
           generate_series(1, (e->>'size')::int) j
$$;

-- The private evaluation's core, for dpsql.evaluate and dpsql.tune: reads the rows of ds,
-- releases the plan's noisy statistics of model m once, and returns the metrics (as
-- dpsql.evaluate's metrics column, with noise_sd and the release under 'private').
-- It CHARGES NOTHING: call it only after a charge of (epsilon, delta) to ds that covers
-- exactly this release (dpsql_internal._charge with the plan's dp_event), from definer code
-- that has made the checks of _evaluate_private (model visible, pair checked, noise_seed
-- allowed). noise_seed: tests only (NULL: pg_strong_random).
CREATE OR REPLACE FUNCTION dpsql_internal._private_metrics(m dpsql.models, ds dpsql.datasets, epsilon float8,
                                                           delta float8, noise_seed bigint)
RETURNS jsonb LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET max_parallel_workers_per_gather = 0
AS $$
DECLARE
    plan jsonb := dpsql_internal._private_evaluation_plan(m, ds, epsilon, coalesce(delta, 0));
    kind text := plan->>'kind';
    seed bigint := coalesce(noise_seed, dpsql_internal._random_seed());
    noisy float8[];
    c float8;
    released jsonb;
    metrics jsonb;
    rows float8;
BEGIN
    noisy := dpsql_internal._noised_statistics(plan, dpsql_internal._evaluation_statistics(m, ds, plan), 0, seed);
    IF kind = 'regression' THEN
        -- stage 2: sum |y - c| around the released mean (post-processing of stage 1)
        c := least(greatest(noisy[2] / greatest(noisy[1], 1), -ds.label_bound), ds.label_bound);
        noisy := noisy || dpsql_internal._noised_statistics(
            plan, dpsql_internal._evaluation_statistics(m, ds, plan, c), 5, seed);
    END IF;
    SELECT jsonb_object_agg(e->>'name', to_jsonb(CASE WHEN (e->>'size')::int = 1 THEN to_jsonb(noisy[o + 1])
                                                      ELSE to_jsonb(noisy[o + 1 : o + (e->>'size')::int]) END))
      INTO released
      FROM (SELECT e, coalesce(sum((e->>'size')::int) OVER (ORDER BY i ROWS BETWEEN UNBOUNDED PRECEDING
                                                                       AND 1 PRECEDING), 0)::int AS o
              FROM jsonb_array_elements(plan->'blocks') WITH ORDINALITY AS t(e, i)) b;
    rows := dpsql_internal._public_row_count(ds);
    metrics := dpsql_internal._metrics_of_statistics(kind, noisy, true, rows);
    IF metrics IS NULL THEN  -- no row counted, after noise: nothing to divide by
        metrics := '{}';
    END IF;
    RETURN metrics || jsonb_build_object(
        'noise_sd', dpsql_internal._metrics_noise_sd(kind, noisy, dpsql_internal._statistics_noise_sd(plan), rows),
        'private', jsonb_strip_nulls(jsonb_build_object(
            'epsilon', epsilon, 'delta', coalesce(delta, 0), 'mechanism', plan->'mechanism',
            'statistics', released, 'mean', c,
            'shares', (SELECT jsonb_object_agg(e->>'name', e->'share') FROM jsonb_array_elements(plan->'blocks') e),
            'score_grid', plan->'score_grid',
            'noise_seed', dpsql_internal._noise_source(noise_seed))));
END $$;
COMMENT ON FUNCTION dpsql_internal._private_metrics(dpsql.models, dpsql.datasets, float8, float8, bigint) IS
    'Noisy metrics of a model on a dataset: reads the rows and charges NOTHING; only after a charge covering it';

-- A private evaluation's plan: the model and the dataset as the login role may use them, every
-- refusal that needs no row, the statistics' plan at row level (row_epsilon, row_delta), the
-- public row count and what the release is charged. Reads no row; dpsql.preview_evaluate
-- stops here.
CREATE OR REPLACE FUNCTION dpsql_internal._evaluate_release_plan(
    model_id bigint, dataset text, features text[], label text, epsilon float8, delta float8,
    noise_seed bigint, OUT charge dpsql_internal.release_charge, OUT m dpsql.models, OUT ds dpsql.datasets,
    OUT plan jsonb, OUT row_epsilon float8, OUT row_delta float8, OUT rows bigint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    target record;
BEGIN
    m := dpsql_internal._model(model_id);  -- the models the login role may see
    ds := dpsql_internal._lookup_dataset(dataset);  -- granted datasets only
    PERFORM dpsql_internal._check_evaluation_pair(m, ds, features, label);
    -- a privacy unit of k rows: planned at row level for the unit-level (epsilon, delta), which
    -- the charge pays (64_privacy_units.sql)
    target := dpsql_internal._unit_release_target(ds, epsilon, coalesce(delta, 0));
    row_epsilon := target.epsilon;
    row_delta := target.delta;
    plan := dpsql_internal._private_evaluation_plan(m, ds, target.epsilon, target.delta);
    IF noise_seed IS NOT NULL AND NOT dpsql_internal._can_read_rows(ds) THEN
        PERFORM dpsql_internal._noise_seed_refused();
    END IF;
    rows := dpsql_internal._public_row_count(ds);  -- public (header); reads no value
    IF rows < 1 THEN
        PERFORM dpsql_internal._fail(format('dataset %s has no rows', quote_literal(ds.name)), '22000');
    END IF;
    PERFORM dpsql_internal._preview_note('dataset', to_jsonb(ds.name));
    PERFORM dpsql_internal._preview_note('model', to_jsonb(m.model_id));
    PERFORM dpsql_internal._preview_note('mechanism', to_jsonb('evaluate'::text));
    charge := ROW(ds.dataset_id, target.epsilon, target.delta, 'evaluate',
                  format('model %s, %s metrics, %s noise%s', m.model_id, plan->>'kind', plan->>'mechanism',
                         CASE WHEN noise_seed IS NOT NULL THEN ', user noise seed: NOT private' ELSE '' END),
                  plan->'dp_event', plan - 'dp_event', false)::dpsql_internal.release_charge;
END $$;

-- dpsql.evaluate on a registered dataset (54_api.sql dispatches here when epsilon is given):
-- its plan, the charge, then the release. As the extension owner (the rows are read as a
-- private run reads them); the model and the dataset are looked up as the login role.
CREATE OR REPLACE FUNCTION dpsql_internal._evaluate_private(model_id bigint, dataset text, features text[],
                                                            label text, epsilon float8, delta float8,
                                                            noise_seed bigint,
                                                            OUT metric text, OUT value float8, OUT rows bigint,
                                                            OUT baseline float8, OUT metrics jsonb)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p record := dpsql_internal._evaluate_release_plan(model_id, dataset, features, label, epsilon, delta,
                                                      noise_seed);
    m dpsql.models := p.m;
    ds dpsql.datasets := p.ds;
    plan jsonb := p.plan;
BEGIN
    rows := p.rows;
    PERFORM dpsql_internal._charge((p.charge).dataset_id, (p.charge).epsilon, (p.charge).delta,
                                   (p.charge).mechanism, note => (p.charge).note,
                                   dp_event => (p.charge).dp_event, plan => (p.charge).plan);
    metrics := dpsql_internal._private_metrics(m, ds, p.row_epsilon, p.row_delta, noise_seed);
    IF ds.privacy_unit IS NOT NULL THEN  -- said at unit level, as charged
        metrics := jsonb_set(metrics, '{private}', (metrics->'private') || jsonb_build_object(
            'epsilon', epsilon, 'delta', coalesce(delta, 0), 'row_epsilon', p.row_epsilon,
            'row_delta', p.row_delta, 'privacy_unit', ds.privacy_unit,
            'max_rows_per_unit', ds.max_rows_per_unit));
    END IF;
    metric := CASE WHEN plan->>'kind' = 'regression' THEN 'mse' ELSE 'accuracy' END;
    value := (metrics->>metric)::float8;
    baseline := (metrics->'baseline'->>metric)::float8;
    IF (metric = 'mse' AND value >= baseline) OR (metric = 'accuracy' AND value <= baseline) THEN
        RAISE WARNING 'dpsql: model % looks no better than predicting the % on these rows (noisy % %, baseline %)',
                      m.model_id, metrics->'baseline'->>'predictor', metric, round(value::numeric, 4),
                      round(baseline::numeric, 4)
            USING HINT = format('Both are noisy (noise sd %s and %s: metrics->''noise_sd'').',
                                round((metrics->'noise_sd'->>metric)::numeric, 4),
                                round((metrics->'noise_sd'->'baseline'->>metric)::numeric, 4));
    END IF;
END $$;

CREATE OR REPLACE FUNCTION dpsql.preview_evaluate(model_id bigint, dataset text, epsilon float8,
                                                  delta float8 DEFAULT 0)
RETURNS jsonb LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- its plan, as the extension owner (as the release): 57_preview.sql
    SELECT dpsql_internal._preview_statement(
        format('SELECT (p.charge).* FROM dpsql_internal._evaluate_release_plan(%L, %L, NULL, NULL, %L, %L, NULL) p',
               model_id, dataset, epsilon, delta))
$$;
COMMENT ON FUNCTION dpsql.preview_evaluate(bigint, text, float8, float8) IS
    'What a private dpsql.evaluate would charge (epsilon, delta, its DpEvent, the budget after), '
    'or its refusal, without charging and without reading rows';

-- Whether source names a registered dataset the login role can use (what evaluate without
-- epsilon refuses with a hint, instead of a missing table or a permission error).
CREATE OR REPLACE FUNCTION dpsql_internal._names_usable_dataset(source text)
RETURNS boolean LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM dpsql_internal._lookup_dataset(source);
    RETURN true;
EXCEPTION WHEN OTHERS THEN
    RETURN false;
END $$;
