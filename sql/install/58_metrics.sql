------------------------------------------------------------------------------------------
-- Evaluation metrics and their baselines (issue 27): dpsql.evaluate's numbers
--
-- Each function takes a query of (p, y) pairs, p the model's output (a probability for
-- logistic models, a score for huber, a class index for several classes, a value for linear)
-- and y the label as training reads it (+-1 for two classes, a class index, or a value), and
-- returns the standard metrics with the same metrics of the baseline predictor on the same
-- rows: the majority class (classification) or the mean (regression). A model no better than
-- its baseline has learned nothing the label counts do not say. The definitions are
-- scikit-learn's (tests/server/test_evaluate_metrics.py checks each against sklearn.metrics).
------------------------------------------------------------------------------------------

-- Two classes: accuracy, balanced accuracy, ROC AUC (Mann-Whitney, tied scores at their mean
-- rank), F1 of the positive class (labels[2]), log loss (logistic: p clipped to
-- [1e-15, 1 - 1e-15]).
CREATE OR REPLACE FUNCTION dpsql_internal._binary_metrics(pairs text, loss_code int)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    n float8;
    tp bigint;
    fp bigint;
    fn bigint;
    tn bigint;
    rank_sum float8;
    log_loss float8;
    prior float8;
BEGIN
    EXECUTE format(
        'SELECT count(*) AS n, count(*) FILTER (WHERE pos AND y > 0) AS tp,'
        '       count(*) FILTER (WHERE pos AND y <= 0) AS fp,'
        '       count(*) FILTER (WHERE NOT pos AND y > 0) AS fn,'
        '       count(*) FILTER (WHERE NOT pos AND y <= 0) AS tn,'
        '       sum(r) FILTER (WHERE y > 0) AS rank_sum,'
        '       -avg(CASE WHEN y > 0 THEN ln(least(greatest(p, 1e-15), 1 - 1e-15))'
        '                 ELSE ln(least(greatest(1 - p, 1e-15), 1 - 1e-15)) END) AS log_loss'
        '  FROM (SELECT p, y, coalesce(dpsql_internal._is_positive(%s, p), false) AS pos,'
        '               rank() OVER (ORDER BY p) + (count(*) OVER (PARTITION BY p) - 1) / 2.0 AS r'
        '          FROM (%s) e WHERE p IS NOT NULL AND y IS NOT NULL) s', loss_code, pairs)
       INTO n, tp, fp, fn, tn, rank_sum, log_loss;
    IF n = 0 THEN
        RETURN NULL;
    END IF;
    prior := (tp + fn) / n;  -- the positive class's share
    RETURN jsonb_strip_nulls(jsonb_build_object(
        'accuracy', (tp + tn) / n,
        'balanced_accuracy', (CASE WHEN tp + fn > 0 THEN tp::float8 / (tp + fn) END
                              + CASE WHEN tn + fp > 0 THEN tn::float8 / (tn + fp) END) / 2,
        'roc_auc', CASE WHEN tp + fn > 0 AND tn + fp > 0
                        THEN (rank_sum - (tp + fn) * (tp + fn + 1) / 2.0)
                             / ((tp + fn)::float8 * (tn + fp)) END,
        'f1', CASE WHEN 2 * tp + fp + fn > 0 THEN 2.0 * tp / (2 * tp + fp + fn) ELSE 0 END,
        'log_loss', CASE WHEN loss_code = dpsql_internal._loss_code('logistic') THEN log_loss END,
        'baseline', jsonb_strip_nulls(jsonb_build_object(
            'predictor', 'majority class',
            'accuracy', greatest(prior, 1 - prior),
            'balanced_accuracy', 0.5,
            'roc_auc', CASE WHEN prior > 0 AND prior < 1 THEN 0.5 END,
            'f1', CASE WHEN prior > 0.5 THEN 2 * prior / (prior + 1) ELSE 0 END,
            'log_loss', CASE WHEN loss_code = dpsql_internal._loss_code('logistic')
                             THEN -(CASE WHEN prior > 0 THEN prior * ln(prior) ELSE 0 END
                                    + CASE WHEN prior < 1 THEN (1 - prior) * ln(1 - prior) ELSE 0 END) END))));
END $$;

-- Several classes (class indexes 0 .. k-1): accuracy, balanced accuracy (mean recall over the
-- classes present), macro F1 (over the classes present or predicted).
CREATE OR REPLACE FUNCTION dpsql_internal._multiclass_metrics(pairs text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
    correct bigint;
    balanced float8;
    f1 float8;
    majority bigint;
    present bigint;
BEGIN
    EXECUTE format(
        'WITH e AS (SELECT p, y FROM (%s) e0 WHERE p IS NOT NULL AND y IS NOT NULL),'
        '     k AS (SELECT c, count(*) FILTER (WHERE y = c) AS support,'
        '                  count(*) FILTER (WHERE p = c) AS predicted,'
        '                  count(*) FILTER (WHERE p = c AND y = c) AS tp'
        '             FROM e, (SELECT y AS c FROM e UNION SELECT p FROM e) cs GROUP BY c)'
        ' SELECT (SELECT count(*) FROM e) AS n,'
        '        (SELECT count(*) FILTER (WHERE p = y) FROM e) AS correct,'
        '        avg(tp::float8 / support) FILTER (WHERE support > 0) AS balanced,'
        '        avg(2.0 * tp / (support + predicted)) AS f1,'
        '        max(support) AS majority, count(*) FILTER (WHERE support > 0) AS present'
        '   FROM k', pairs) INTO n, correct, balanced, f1, majority, present;
    IF n = 0 THEN
        RETURN NULL;
    END IF;
    RETURN jsonb_build_object(
        'accuracy', correct::float8 / n, 'balanced_accuracy', balanced, 'f1', f1,
        'baseline', jsonb_build_object(
            'predictor', 'majority class',
            'accuracy', majority::float8 / n,
            'balanced_accuracy', 1.0 / present,
            -- the majority class's F1 (2 s / (s + n)), 0 for the others present
            'f1', (2.0 * majority / (majority + n)) / present));
END $$;

-- Regression: MSE, MAE and R^2, against the mean of the evaluation rows (R^2 = 0).
CREATE OR REPLACE FUNCTION dpsql_internal._regression_metrics(pairs text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
    mse float8;
    mae float8;
    var float8;
    mae_mean float8;
BEGIN
    EXECUTE format(
        'SELECT count(*) AS n, avg((p - y) ^ 2) AS mse, avg(abs(p - y)) AS mae, var_pop(y) AS var,'
        '       avg(abs(y - m)) AS mae_mean'
        '  FROM (SELECT p, y, avg(y) OVER () AS m FROM (%s) e0'
        '         WHERE p IS NOT NULL AND y IS NOT NULL) e', pairs) INTO n, mse, mae, var, mae_mean;
    IF n = 0 THEN
        RETURN NULL;
    END IF;
    RETURN jsonb_strip_nulls(jsonb_build_object(
        -- R^2 as scikit-learn's r2_score (force_finite): constant labels give 1 for a perfect
        -- fit, else 0
        'mse', mse, 'mae', mae,
        'r2', CASE WHEN var > 0 THEN 1 - mse / var WHEN mse = 0 THEN 1 ELSE 0 END,
        'baseline', jsonb_strip_nulls(jsonb_build_object(
            'predictor', 'mean', 'mse', var, 'mae', mae_mean,
            'r2', CASE WHEN var > 0 THEN 0 ELSE 1 END))));
END $$;
