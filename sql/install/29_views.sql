------------------------------------------------------------------------------------------
-- The views analysts and data owners read (security barriers over the catalog tables).
------------------------------------------------------------------------------------------

-- Where a release's noise came from, as its model records it: the models view below shows
-- analysts only releases whose record says 'pg_strong_random' (a known seed gives the noise away).
CREATE OR REPLACE FUNCTION dpsql_internal._noise_source(noise_seed bigint)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN noise_seed IS NULL THEN 'pg_strong_random'
                ELSE 'user seed ' || noise_seed || ': NOT private' END
$$;

-- What analysts see of the models: private releases on datasets granted to them. Data owners
-- see everything (their non-private models too). (The models view's filter.)
CREATE OR REPLACE FUNCTION dpsql_internal._models_visible(m dpsql.model_store)
RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT dpsql_internal._is_admin()
        OR (m.privacy <> 'none' AND m.dataset_id IS NOT NULL
            -- a release with a known noise seed would give its noiseless model away
            AND m.params->'privacy'->>'noise_seed' = 'pg_strong_random'
            -- BST14 as printed is add/remove-calibrated: a reproduction, not a release
            AND coalesce(m.params->'privacy'->>'bst14_noise', 'strict') = 'strict'
            AND dpsql_internal._can_use_dataset(m.dataset_id))
$$;

-- A private release's timings are the data owner's only (issue 41): the time to prepare and
-- train depends on the rows (null records, the solver's work), and a released field is an
-- output. Others read NULL there. (Columns listed from the table: every other one as stored.)
DO $$
BEGIN
    EXECUTE format(
        'CREATE OR REPLACE VIEW dpsql.models WITH (security_barrier) AS SELECT %s FROM dpsql.model_store m',
        (SELECT string_agg(CASE WHEN a.attname IN ('prepare_seconds', 'train_seconds')
                                THEN format('CASE WHEN m.privacy = ''none'' OR (SELECT dpsql_internal._owns_dataset(d.created_by) '
                                            'FROM dpsql.datasets d WHERE d.dataset_id = m.dataset_id) THEN m.%1$I END AS %1$I',
                                            a.attname)
                                ELSE format('m.%I', a.attname) END, ', ' ORDER BY a.attnum)
           FROM pg_catalog.pg_attribute a
          WHERE a.attrelid = 'dpsql.model_store'::regclass AND a.attnum > 0 AND NOT a.attisdropped))
        || ' WHERE dpsql_internal._models_visible(m)';
END $$;
COMMENT ON VIEW dpsql.models IS
    'Trained models with their hyperparameters and provenance (analysts: released private models of their datasets)';

CREATE OR REPLACE VIEW dpsql.ledger WITH (security_barrier) AS
SELECT e.entry_id, e.dataset_id, d.name AS dataset, e.model_id, e.mechanism, e.epsilon, e.delta,
       e.charged_at, e.role, e.note,
       -- the release as a dp-accounting event, for anyone to re-account (dpsql.budget_report);
       -- entries from before 0.6.0 are plain (epsilon, delta) events
       coalesce(e.dp_event, jsonb_build_object('type', 'EpsilonDelta', 'epsilon', e.epsilon,
                                               'delta', e.delta)) AS dp_event,
       -- 'released', 'in progress', or the charge stands without output (28_ledger.sql). An
       -- estimate's output is its dataset's declaration, estimated once: the last committed
       -- estimate of a declaration that is set is the one kept. A describe's output is the
       -- rows it returned: kept when its transaction commits.
       dpsql_internal._ledger_outcome(
           CASE e.mechanism
               WHEN 'describe' THEN true
               WHEN 'estimate_bounds' THEN d.feature_bounds IS NOT NULL
               WHEN 'estimate_label_bound' THEN d.label_bound IS NOT NULL
               -- a private evaluation's output is its answer: released once committed
               WHEN 'evaluate' THEN true
               ELSE e.model_id IS NOT NULL END
           AND NOT EXISTS (SELECT 1 FROM dpsql.ledger_entries later
                            WHERE e.mechanism LIKE 'estimate%'
                              AND later.dataset_id = e.dataset_id
                              AND later.mechanism = e.mechanism
                              AND later.entry_id > e.entry_id
                              AND pg_xact_status(later.xact) = 'committed'),
           e.xact) AS outcome,
       -- what one unit of the entry's (epsilon, delta) is: fixed once anything is spent
       d.privacy_unit, d.max_rows_per_unit
  FROM dpsql.ledger_entries e
  JOIN dpsql.datasets d ON d.dataset_id = e.dataset_id
 WHERE dpsql_internal._can_use_dataset(e.dataset_id);
COMMENT ON VIEW dpsql.ledger IS 'Ledger entries of the datasets the login role can use';

CREATE OR REPLACE VIEW dpsql.budgets WITH (security_barrier) AS
SELECT d.dataset_id, d.name, d.epsilon_budget, d.delta_budget,
       s.epsilon_spent, s.delta_spent,
       greatest(d.epsilon_budget - s.epsilon_spent, 0) AS epsilon_remaining,
       greatest(d.delta_budget - s.delta_spent, 0) AS delta_remaining,
       d.dropped_at,
       d.composition  -- 'pld': charged by composition, see dpsql.budget_report
  FROM dpsql.datasets d
 JOIN dpsql_internal.spent s ON s.dataset_id = d.dataset_id
 WHERE dpsql_internal._can_use_dataset(d.dataset_id);
COMMENT ON VIEW dpsql.budgets IS 'Budget, spent and remaining (epsilon, delta) of usable datasets';

CREATE OR REPLACE VIEW dpsql.my_datasets WITH (security_barrier) AS
SELECT d.dataset_id, d.name, d.source, d.features, d.label, d.labels, d.row_norm,
       d.feature_bounds, d.epsilon_budget, d.delta_budget, s.epsilon_spent, s.delta_spent,
       greatest(d.epsilon_budget - s.epsilon_spent, 0) AS epsilon_remaining,
       greatest(d.delta_budget - s.delta_spent, 0) AS delta_remaining,
       d.label_bound, d.row_bound,
       d.dim, d.categories, d.label_values,  -- issue 27: how the columns are encoded (public)
       -- issue 44: a holdout split's side ('train', 'holdout'), its key column and the holdout's
       -- share of the rows (62_holdout.sql)
       d.split_side, d.split_key, d.split_fraction,
       -- issue 46: the privacy unit (a person's rows) and the rows each unit reads as
       -- (64_privacy_units.sql); NULL: a row is a unit
       d.privacy_unit, d.max_rows_per_unit
  FROM dpsql.datasets d
 JOIN dpsql_internal.spent s ON s.dataset_id = d.dataset_id
 WHERE d.dropped_at IS NULL AND dpsql_internal._can_use_dataset(d.dataset_id);
COMMENT ON VIEW dpsql.my_datasets IS
    'Datasets the login role can train on: public declarations and remaining budget';
