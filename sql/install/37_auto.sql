------------------------------------------------------------------------------------------
-- privacy => 'auto': a mechanism and its hyperparameters chosen from public quantities only
-- (the registration, the model, epsilon and delta), never from the data, so the choice costs
-- nothing; the chosen mechanism is then run and charged as if it had been named. The rule and
-- the measurements behind it are in docs/auto.md and bench/RESULTS.md (auto_defaults).
------------------------------------------------------------------------------------------

-- Parameters that auto chooses itself: given anything but their defaults, it refuses rather
-- than drop them silently.
CREATE OR REPLACE FUNCTION dpsql_internal._auto_refuse_overrides(params jsonb)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    given text[] := ARRAY(
        SELECT unnest(dpsql_internal._given_params(params))
        INTERSECT
        SELECT unnest(ARRAY['epochs', 'batch_size', 'lambda', 'step_size', 'schedule', 'radius',
                            'clip_norm', 'sampling', 'noise_multiplier', 'steps', 'ci', 'options',
                            'tuning_lambdas', 'tuning_epochs', 'permutation', 'gaussian',
                            'parallel_workers', 'shard_parallel'])
        ORDER BY 1);
BEGIN
    IF cardinality(given) > 0 THEN
        PERFORM dpsql_internal._fail(format('privacy => auto chooses %s itself', array_to_string(given, ', ')),
                            hint => 'Leave them at their defaults, or name a mechanism to set them.');
    END IF;
END $$;

-- auto's delta when the call leaves it NULL (issue 26; docs/auto.md): the default delta of
-- the mechanisms it picks with delta > 0 (DP-SGD's spec), if the dataset's registered delta
-- budget has room for it, else 0 (pure epsilon-DP). Public: the registration and the specs.
CREATE OR REPLACE FUNCTION dpsql_internal._auto_delta(ds dpsql.datasets)
RETURNS float8 LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN ds.delta_budget >= c.delta_default THEN c.delta_default ELSE 0 END
      FROM dpsql.mechanism_catalog c WHERE c.name = 'dpsgd'
$$;

-- DP-GD's noise falls as 1 / (n epsilon); below this it is mostly noise (docs/auto.md).
CREATE OR REPLACE FUNCTION dpsql_internal._auto_dpgd_min_n_epsilon()
RETURNS float8 LANGUAGE sql IMMUTABLE AS 'SELECT 20000::float8';

-- The choice: (the named mechanism's parameters, the record stored with the model). Only the
-- mechanism is chosen here; its hyperparameters are its defaults (34_defaults.sql).
-- Classification, delta > 0: DP-SGD with Poisson sampling and an intercept (issue 25: as good
-- as DPSGD-F within 0.006 on Protein, MNIST-50 and HI, and 0.02-0.03 ahead on HI's five
-- numeric columns, where DPSGD-F's private mean costs more than centring gains).
-- Classification, delta = 0: bolt-on (Algorithm 1, epsilon-DP).
-- Regression, delta > 0: DP-GD, whitened by its private preconditioner
-- (44_dpgd_precondition.sql) when the rows have a public norm bound; DPSGD-F (Poisson
-- sampling amplifies privacy) when n epsilon < 20,000 and the rows have one (issue 25: DP-GD's
-- noise falls as 1 / (n epsilon), and below that its preconditioner is mostly noise: at
-- epsilon 0.1 it was worse than the mean on both regression sets, DPSGD-F half of it).
-- Regression, delta = 0: objective perturbation (50_objective_perturbation.sql).
-- Regression fits an intercept (labels are rarely centred: without one the fit is worse than
-- the mean predictor whenever the mean is far from 0; issue 25).
-- Classification on a Citus distributed dataset: what one node picks with delta > 0 (DP-SGD's
-- Poisson steps are sums over the shards); with delta = 0 objective perturbation, whose scans
-- are exact sums (the bolt-on averages shards only on request: docs/citus.md).
CREATE OR REPLACE FUNCTION dpsql_internal._auto_choice(ds dpsql.datasets, model text, params jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    delta float8 := coalesce((params->>'delta')::float8, 0);
    epsilon float8 := (params->>'epsilon')::float8;
    layout record := dpsql_internal._citus_layout(ds.relid);
    chosen jsonb;
    rule text;
BEGIN
    PERFORM dpsql_internal._auto_refuse_overrides(params);
    IF (ds.label_bound IS NOT NULL OR dpsql_internal._canonical_model(model) = 'linear')
       AND NOT (delta > 0) THEN
        IF ds.row_bound IS NULL THEN
            PERFORM dpsql_internal._fail('privacy => auto for regression with delta = 0 needs a public bound on ||x|| '
                                         '(objective perturbation); with delta > 0 it trains DP-GD',
                                         hint => 'Register the dataset with row_bound, feature_bounds or row_norm => ''clip'', or give delta.');
        END IF;
        chosen := jsonb_build_object('privacy', 'objective_perturbation', 'intercept', true);
        rule := 'regression, delta = 0: objective perturbation (epsilon-DP; Huber regression with '
                'threshold the label bound), the only epsilon-DP regression mechanism, with an '
                'intercept';
    ELSIF (ds.label_bound IS NOT NULL OR dpsql_internal._canonical_model(model) = 'linear')
          AND ds.row_bound IS NOT NULL AND ds.label_bound IS NOT NULL
          AND (SELECT dpsql_internal._public_row_count(ds)) * epsilon < dpsql_internal._auto_dpgd_min_n_epsilon() THEN
        chosen := jsonb_build_object('privacy', 'dpsgd_f', 'intercept', true);
        rule := format('regression, delta > 0, n epsilon < %s: DPSGD-F (private mean, centred rows, '
                       'DP-SGD with Poisson sampling), where DP-GD''s preconditioner would be mostly noise; '
                       'no confidence intervals', dpsql_internal._auto_dpgd_min_n_epsilon());
    ELSIF ds.label_bound IS NOT NULL OR dpsql_internal._canonical_model(model) = 'linear' THEN
        -- With a public bound on ||x||, whiten by the private preconditioner (a tenth of rho).
        chosen := jsonb_build_object('privacy', 'dpgd', 'intercept', true)
                  || CASE WHEN ds.row_bound IS NOT NULL
                          THEN jsonb_build_object('options', jsonb_build_object('precondition', true))
                          ELSE '{}' END;
        rule := 'regression: DP-GD with batch-means intervals and an intercept, whitened by the '
                'private preconditioner when the rows have a public norm bound';
    ELSIF delta > 0 AND coalesce(layout.dist_type IN ('bigint', 'integer', 'smallint'), true) THEN
        -- on Citus too: the steps are sums over the shards (59_distributed_sampled.sql)
        chosen := jsonb_build_object('privacy', 'dpsgd', 'sampling', 'poisson');
        rule := 'classification, delta > 0: DP-SGD with Poisson sampling and an intercept, at its '
                'defaults';
    ELSIF layout.dist_column IS NOT NULL THEN
        chosen := jsonb_build_object('privacy', 'objective_perturbation');
        rule := 'classification on a Citus distributed dataset with delta = 0 (the bolt-on averages '
                'shards only on request) or a non-integer row id (DP-SGD samples by the row id): '
                'objective perturbation (exact sums over the shards)';
    ELSE
        chosen := jsonb_build_object('privacy', 'bolton');
        rule := 'classification, delta = 0: bolt-on Algorithm 1 (epsilon-DP) at its defaults';
    END IF;
    RETURN jsonb_build_object('params', chosen,
                              'record', jsonb_build_object('rule', rule, 'chosen', chosen,
                                                           'cost', 'none: public quantities only'));
END $$;
