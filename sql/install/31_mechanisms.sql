------------------------------------------------------------------------------------------
-- The mechanism registry: one row per privacy mechanism, from the mechanism's spec
-- (sql/mechanisms/<name>.toml, rendered into 53_mechanisms.sql), read by the dispatch
-- (_train_private), the parameter checks (_check_params), the defaults (34_defaults.sql),
-- refusal hints and dpsql.mechanisms(). Adding a mechanism = its spec, its own SQL file (a
-- train function with the common signature, or its family's: a plan-and-fit one registers a
-- plan and a fit function, an SGD one its SGD plan function),
-- its C in the core, its docs page and its test module (docs/architecture.md).
------------------------------------------------------------------------------------------

CREATE TABLE IF NOT EXISTS dpsql.mechanism_catalog (
    name           text PRIMARY KEY,
    -- dpsql_internal.<train_function>(ds dpsql.datasets, model text, privacy text, params jsonb,
    --     epsilon float8, delta float8, noise_seed bigint) -> dpsql_internal.release_plan: the
    -- release planned, no row read (30_runs.sql); _train_release charges it and calls the
    -- function the plan names to complete it
    train_function text NOT NULL,
    -- 'any': trains classifiers and regressions (the models column says which)
    task           text NOT NULL CONSTRAINT mechanism_catalog_task_check
                        CHECK (task IN ('classification', 'regression', 'any')),
    -- takes the SGD defaults of 34_defaults.sql (epochs, batch, step, clip)
    sgd_defaults   boolean NOT NULL,
    needs_delta    boolean NOT NULL,
    summary        text NOT NULL,
    docs           text NOT NULL,
    -- the keys of options => {...} it accepts (any other is refused)
    options        text[] NOT NULL,
    -- the plan-and-fit mechanisms' two halves, called by _train_planned (33_planned.sql):
    -- dpsql_internal.<plan_function>(privacy text, ds dpsql.datasets, n bigint, d int,
    --                       epsilon float8, delta float8, params jsonb) -> plan jsonb
    -- dpsql_internal.<fit_function>(train_table text, plan jsonb, noise_seed bigint,
    --                      OUT weights float8[], OUT info jsonb, OUT iterates float8[])
    plan_function  text,
    fit_function   text,
    -- the models it trains (canonical names, dpsql_internal._erm_model); NULL: the task's
    -- (classification: logistic, huber, multinomial; regression: linear)
    models         text[],
    -- the dpsql.train parameters it takes beyond every mechanism's (privacy, epsilon, delta,
    -- noise_seed, features, label, seed, intercept, model): any other one given is refused
    params         text[] NOT NULL DEFAULT '{}',
    -- how it runs on a Citus hash-distributed dataset (32_distributed.sql): 'sums' (its scans
    -- are exact sums, combined across shards before any noise), 'averaged' (SGD epochs average
    -- per-shard models; needs shard_parallel => true), 'sampled' (Poisson-sampled steps, each a
    -- sum over the shards: 59_distributed_sampled.sql); NULL: refused there (sequential)
    distributed    text CONSTRAINT mechanism_catalog_distributed_check
                        CHECK (distributed IN ('sums', 'averaged', 'sampled')),
    -- a classifier's intercept when the call leaves it NULL (_intercept_default)
    intercept_default boolean NOT NULL DEFAULT true,
    -- when to use it: the data, size and epsilon where it is the one to pick (issue 25)
    recommended    text,
    -- the delta of a call that leaves it NULL (issue 26)
    delta_default  float8 NOT NULL DEFAULT 0,
    -- every parameter it takes, from its spec: SQL type, who may set it, the server's default
    -- rule, range or choices (checked by _check_params), what it means
    parameters     jsonb NOT NULL DEFAULT '{}',
    -- the defaults' batch rule quiet_steps (34_defaults.sql): dpsql_internal.<function>(params
    -- jsonb, m bigint, b bigint, k int) -> the noise on a step's mean gradient, in units of the
    -- gradient bound
    step_noise_function text,
    -- the SGD family's plan (36_whitebox.sql): dpsql_internal.<sgd_plan_function>(privacy text,
    -- spec jsonb, rows bigint, epsilon float8, delta float8, params jsonb) -> plan jsonb
    sgd_plan_function text
);
ALTER TABLE dpsql.mechanism_catalog ADD COLUMN IF NOT EXISTS sgd_plan_function text;
COMMENT ON TABLE dpsql.mechanism_catalog IS
    'The privacy mechanisms: dispatch, defaults and docs (written by each mechanism''s file)';

-- One mechanism's registry row from its spec (sql/mechanisms/<name>.toml, rendered as jsonb
-- into 53_mechanisms.sql by dpsql.mechanism_spec).
CREATE OR REPLACE FUNCTION dpsql_internal._register_mechanism(spec jsonb)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO dpsql.mechanism_catalog AS c
    SELECT r.name, r.train_function, r.task, r.sgd_defaults, r.needs_delta, r.summary, r.docs,
           r.options, r.plan_function, r.fit_function, r.models, r.params, r.distributed,
           r.intercept_default, r.recommended, r.delta_default, r.parameters, r.step_noise_function,
           r.sgd_plan_function
      FROM jsonb_populate_record(NULL::dpsql.mechanism_catalog, spec) r
    ON CONFLICT ON CONSTRAINT mechanism_catalog_pkey DO UPDATE
       SET train_function = excluded.train_function, task = excluded.task,
           sgd_defaults = excluded.sgd_defaults, needs_delta = excluded.needs_delta,
           summary = excluded.summary, docs = excluded.docs, options = excluded.options,
           plan_function = excluded.plan_function, fit_function = excluded.fit_function,
           models = excluded.models, params = excluded.params,
           distributed = excluded.distributed, intercept_default = excluded.intercept_default,
           recommended = excluded.recommended, delta_default = excluded.delta_default,
           parameters = excluded.parameters, step_noise_function = excluded.step_noise_function,
           sgd_plan_function = excluded.sgd_plan_function
$$;

-- The dpsql.train parameters a caller set away from their defaults (dpsql.train's private
-- branch passes them all in params): what a mechanism must take or refuse. Generated from
-- sql/mechanisms/parameters.toml: every parameter but those every mechanism takes, and the
-- registration's labels and row_norm.
-- BEGIN GENERATED: _given_params (make generate; sql/mechanisms/parameters.toml)
CREATE OR REPLACE FUNCTION dpsql_internal._given_params(params jsonb)
RETURNS text[] LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(array_agg(k ORDER BY k COLLATE "C"), '{}')
      FROM (VALUES
                ('epochs', params->>'epochs' IS NOT NULL),
                ('batch_size', params->>'batch_size' IS NOT NULL),
                ('lambda', coalesce((params->>'lambda')::float8, 0) <> 0),
                ('step_size', params->>'step_size' IS NOT NULL),
                ('schedule', params->>'schedule' IS NOT NULL),
                ('radius', params->>'radius' IS NOT NULL),
                ('labels', coalesce(params->'labels', 'null') <> 'null'),
                ('row_norm', coalesce(params->>'row_norm', 'none') <> 'none'),
                ('huber_h', coalesce((params->>'huber_h')::float8, 0.1) <> 0.1),
                ('step_offset', coalesce((params->>'step_offset')::float8, 0) <> 0),
                ('parallel_workers', coalesce((params->>'parallel_workers')::int, 0) <> 0),
                ('gaussian', coalesce(params->>'gaussian', 'analytic') <> 'analytic'),
                ('permutation', coalesce(params->>'permutation', 'once') <> 'once'),
                ('tuning_lambdas', coalesce(params->'tuning_lambdas', 'null') <> 'null'),
                ('tuning_epochs', coalesce(params->'tuning_epochs', 'null') <> 'null'),
                ('clip_norm', params->>'clip_norm' IS NOT NULL),
                ('sampling', coalesce(params->>'sampling', 'shuffle') <> 'shuffle'),
                ('noise_multiplier', params->>'noise_multiplier' IS NOT NULL),
                ('bst14_noise', coalesce(params->>'bst14_noise', 'strict') <> 'strict'),
                ('steps', params->>'steps' IS NOT NULL),
                ('ci', params->>'ci' IS NOT NULL),
                ('ci_draws', params->>'ci_draws' IS NOT NULL),
                ('burn_in', params->>'burn_in' IS NOT NULL),
                ('options', coalesce(params->'options', 'null') <> 'null'),
                ('shard_parallel', coalesce((params->>'shard_parallel')::boolean, false) <> false))
           AS t(k, set_by_caller)
     WHERE set_by_caller
$$;
-- END GENERATED: _given_params

-- The parameters a caller set, against the mechanism's spec: one it does not take is refused
-- rather than ignored; a value outside the spec's choices or range is refused, and one set
-- away from its default where the spec says who = owner needs a data owner.
CREATE OR REPLACE FUNCTION dpsql_internal._check_params(m dpsql.mechanism_catalog, params jsonb)
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    unused text[] := ARRAY(SELECT u FROM (SELECT unnest(dpsql_internal._given_params(params))
                                          EXCEPT SELECT unnest(m.params)) s(u)
                            ORDER BY u COLLATE "C");
    p record;
    v float8;
BEGIN
    IF unused && '{labels,row_norm}' THEN
        PERFORM dpsql_internal._fail('labels and row_norm of a private run are the registration''s',
                                     hint => 'Leave them at their defaults; the data owner registers them.');
    END IF;
    IF cardinality(unused) > 0 THEN
        PERFORM dpsql_internal._fail(
            format('%s does not take %s', m.name, array_to_string(unused, ', ')),
            hint => CASE WHEN cardinality(m.params) > 0
                         THEN format('It takes %s (and epsilon, delta, intercept, seed).',
                                     array_to_string(m.params, ', '))
                         ELSE 'It takes epsilon, delta, intercept and seed only.' END);
    END IF;
    FOR p IN SELECT k.key AS name, k.value AS spec, params->k.key AS value
               FROM jsonb_each(m.parameters) k
              WHERE coalesce(params->k.key, 'null') <> 'null'
              ORDER BY k.key COLLATE "C"
    LOOP
        IF p.spec ? 'choices' AND NOT p.spec->'choices' @> jsonb_build_array(p.value) THEN
            PERFORM dpsql_internal._fail(
                format('%s must be %s, got %s', p.name,
                       (SELECT string_agg(quote_literal(c), ' or ')
                          FROM jsonb_array_elements_text(p.spec->'choices') c),
                       quote_literal(p.value #>> '{}')),
                hint => format('%s: %s.', p.name, p.spec->>'doc'));
        END IF;
        IF jsonb_typeof(p.value) = 'number' THEN
            v := (p.value #>> '{}')::float8;
            IF v < (p.spec->>'min')::float8 OR v <= (p.spec->>'exclusive_min')::float8
               OR v > (p.spec->>'max')::float8 THEN
                PERFORM dpsql_internal._fail(
                    format('%s must be %s, got %s', p.name,
                           concat_ws(' and ', '>= ' || (p.spec->>'min'), '> ' || (p.spec->>'exclusive_min'),
                                     '<= ' || (p.spec->>'max')),
                           p.value #>> '{}'),
                    hint => format('%s: %s.', p.name, p.spec->>'doc'));
            END IF;
        END IF;
        IF p.spec->>'who' = 'owner' AND p.spec ? 'sql_default'
           AND p.value <> p.spec->'sql_default' AND NOT dpsql_internal._is_admin() THEN
            PERFORM dpsql_internal._fail(
                format('%s => %s is for data owners: %s', p.name, p.value #>> '{}', p.spec->>'doc'),
                '42501');
        END IF;
    END LOOP;
END $$;

-- A model name as the mechanisms know it: the loss's canonical name (20_sources.sql), or
-- 'lasso' (least squares in an L1 ball: a model of the mechanisms that list it).
CREATE OR REPLACE FUNCTION dpsql_internal._erm_model(model text)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN model = 'lasso' THEN 'lasso' ELSE dpsql_internal._canonical_model(model) END
$$;

-- The intercept of a call that leaves it NULL (issue 25; docs/defaults.md), from public
-- quantities: a regression fits one (labels are rarely centred); a classifier fits one if
-- its mechanism's registration says so (scikit-learn's convention, which the mechanisms
-- whose bias was measured to cost accuracy decline: bench intercept_default). Non-private
-- runs always fit one (dpsql.train).
CREATE OR REPLACE FUNCTION dpsql_internal._intercept_default(canonical text, classifier_default boolean)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT canonical IN ('linear', 'lasso') OR classifier_default
$$;

-- A classifier's intercept when the call leaves it NULL (the classifier_default above): the
-- registry's intercept_default, or, under the spec's intercept rule 'uncentred' (issue 42),
-- one whenever the registration does not centre every feature. feature_bounds map each
-- feature's public range onto [-1, 1], so the zero model sits at the centre of what is
-- public; without them nothing public says where the rows lie, and a model through the
-- origin cannot represent a bias: on positive rows (bench default_learning, numeric) even the
-- non-private logistic regression without one scored 0.7428 against the majority class's
-- 0.7408, and objective perturbation went from 0.742 to 0.777 at epsilon 1 with one. With
-- feature bounds the one-hot rows carry a bias of their own (every row's coordinates sum to a
-- constant), and the extra coordinate only adds noise (objective perturbation 0.754 with an
-- intercept, 0.763 without, at the same epsilon). A spec's max_features keeps the intercept
-- out where it would take a coefficient the mechanism does not have (the exponential
-- mechanism's fifth: HI's five numeric columns learned without one, 0.70 against 0.61).
CREATE OR REPLACE FUNCTION dpsql_internal._classifier_intercept(m dpsql.mechanism_catalog,
                                                                ds dpsql.datasets)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT m.intercept_default
        OR coalesce(m.parameters->'intercept'->>'rule' = 'uncentred' AND ds.feature_bounds IS NULL
                    -- (a mechanism with few coefficients: the exponential mechanism's 5)
                    AND coalesce(ds.dim <= (m.parameters->'intercept'->>'max_features')::int, true),
                    false)
$$;

-- The models a registered mechanism trains.
CREATE OR REPLACE FUNCTION dpsql_internal._mechanism_models(m dpsql.mechanism_catalog)
RETURNS text[] LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(m.models, CASE m.task WHEN 'regression' THEN '{linear}'::text[]
                                          ELSE '{logistic,huber,multinomial}'::text[] END)
$$;

-- The registry row of a mechanism; unknown names are refused with the list.
CREATE OR REPLACE FUNCTION dpsql_internal._mechanism(privacy text)
RETURNS dpsql.mechanism_catalog LANGUAGE plpgsql STABLE AS $$
DECLARE
    m dpsql.mechanism_catalog;
BEGIN
    SELECT * INTO m FROM dpsql.mechanism_catalog c WHERE c.name = privacy;
    IF NOT FOUND THEN
        PERFORM dpsql_internal._fail(
            format('unknown privacy mechanism %s', coalesce(quote_literal(privacy), 'NULL')),
            hint => 'Available: auto (chosen for you), '
                    || (SELECT string_agg(c.name, ', ' ORDER BY c.name COLLATE "C") FROM dpsql.mechanism_catalog c)
                    || '. SELECT * FROM dpsql.mechanisms() describes them.');
    END IF;
    RETURN m;
END $$;

-- What analysts may know of the registry.
CREATE OR REPLACE FUNCTION dpsql.mechanisms()
RETURNS TABLE (name text, task text, models text[], needs_delta boolean, params text[],
               options text[], distributed text, summary text, docs text, recommended text,
               delta_default float8, parameters jsonb)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.name, c.task, dpsql_internal._mechanism_models(c), c.needs_delta, c.params,
           c.options, c.distributed, c.summary, c.docs, c.recommended, c.delta_default,
           c.parameters
      FROM dpsql.mechanism_catalog c ORDER BY c.task COLLATE "C", c.name COLLATE "C"
$$;
COMMENT ON FUNCTION dpsql.mechanisms() IS
    'The privacy mechanisms dpsql.train accepts (privacy => name), with their task, docs and when each is recommended';
