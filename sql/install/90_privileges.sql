------------------------------------------------------------------------------------------
-- Privileges (runs last: covers every object created above). Least privilege (docs/architecture.md,
-- privacy rule 2): PUBLIC gets nothing; dpsql_analyst gets the entry points only; dpsql_admin (data
-- owners) gets those plus dataset registration and grants. No role but the extension owner reads
-- the
-- tables (raw states, training tables, ledger) or runs the non-private aggregate.
------------------------------------------------------------------------------------------

REVOKE ALL ON ALL TABLES IN SCHEMA dpsql, dpsql_internal, dpsql_work FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA dpsql, dpsql_internal, dpsql_work FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA dpsql, dpsql_internal FROM PUBLIC;  -- aggregates included
-- From scratch on every install and upgrade: a grant that a release withdraws goes away.
REVOKE ALL ON ALL TABLES IN SCHEMA dpsql, dpsql_internal, dpsql_work
    FROM dpsql_analyst, dpsql_admin, dpsql_definer;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA dpsql, dpsql_internal FROM dpsql_analyst, dpsql_admin, dpsql_definer;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA dpsql, dpsql_internal, dpsql_work
    FROM dpsql_analyst, dpsql_admin, dpsql_definer;
REVOKE ALL ON SCHEMA dpsql, dpsql_internal, dpsql_work, dpsql_owner_work, dpsql_audit
    FROM dpsql_analyst, dpsql_admin, dpsql_definer;
REVOKE ALL ON SCHEMA dpsql, dpsql_internal, dpsql_work, dpsql_owner_work FROM PUBLIC;
-- Only the definer role creates in dpsql_work: private runs never meet a table they did not
-- create (data owners had CREATE there before 0.8.0).
REVOKE ALL ON SCHEMA dpsql_work FROM dpsql_analyst, dpsql_admin;

-- The definer role (21_roles.sql): dpsql's definer code and charge worker run as it, with
-- dpsql's own schemas, tables, sequences and functions, and nothing else of the server's.
-- Its training tables and audit copies are its own. Every SECURITY DEFINER function is its,
-- except dpsql_internal._read_source (dpsql_reader's) and dpsql_internal._grant_reader (the
-- extension owner's, callable by the definer role only; 26_reading.sql says why).
GRANT USAGE ON SCHEMA dpsql, dpsql_internal, dpsql_work, dpsql_audit TO dpsql_definer;
GRANT CREATE ON SCHEMA dpsql_work, dpsql_audit TO dpsql_definer;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA dpsql, dpsql_internal TO dpsql_definer;
GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA dpsql, dpsql_internal TO dpsql_definer;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA dpsql, dpsql_internal TO dpsql_definer;
-- On Citus only once dpsql.citus_setup_definer() has given the role a login (32_distributed.sql):
-- Citus runs a distributed statement on the workers over connections as the current user.
-- Until then the definer code runs as the extension owner, as before 0.8.0 (docs/citus.md).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')
       AND NOT (SELECT rolcanlogin FROM pg_catalog.pg_roles WHERE rolname = 'dpsql_definer') THEN
        RAISE NOTICE 'dpsql: on Citus the definer code runs as the extension owner until dpsql.citus_setup_definer() runs'
            USING DETAIL = 'Citus connects to the workers as the current user, and dpsql_definer cannot log in yet.',
                  HINT = 'As a superuser on the coordinator, once every worker is added: SELECT dpsql.citus_setup_definer();';
        RETURN;
    END IF;
    PERFORM dpsql_internal._give_definer_functions();
END $$;

-- dpsql_internal: the granted helpers below are called by the entry points as the caller.
GRANT USAGE ON SCHEMA dpsql, dpsql_internal TO dpsql_analyst, dpsql_admin;

-- EXECUTE by function name (every overload), so that signature changes need no edit here.
DO $$
DECLARE
    -- The analyst entry points, and the SECURITY INVOKER helpers that evaluate/predict call.
    analyst text[] := ARRAY[
        'train', 'predict', 'evaluate', 'loss_constants',
        '_source_sql', '_source_regclass', '_feature_sql', '_label_sql', '_bad_label',
        '_check_labels', '_canonical_model',
        '_loss_code', '_predict',
        '_fail', '_model', '_apply_bounds', '_is_positive', '_preprocess', '_jsonb_weights',
        '_clip_norm', '_preprocessed', '_preprocessed_sql',
        -- categorical columns and text labels (issue 27)
        'predict_label', 'predict_row', '_predict_label', '_one_hot', '_one_hot_sql', '_category_values', '_model_label_values',
        '_encode_row', '_binary_metrics', '_multiclass_metrics', '_regression_metrics',
        -- previews (57_preview.sql); _previewing is read by _warn, which owners' calls reach too
        'preview', '_preview_private', '_private_params', '_previewing',
        '_is_admin', '_can_use_dataset', '_ledger_outcome',  -- called by train and by the views
        '_owns_dataset', '_models_visible',  -- the models view
        'confint', 'zcdp_rho', 'zcdp_epsilon', 'mechanisms',
        'budget_report'];  -- SECURITY DEFINER; shows what dpsql.budgets shows
    -- Entry points created by later releases' files; granted when present.
    analyst_optional text[] := ARRAY['_train_private', 'bolton_sensitivity',
        -- the analyst's private releases beside training (issue 44)
        'describe', 'preview_describe', 'preview_evaluate', 'tune', 'preview_tune', '_train_validated',
        -- private evaluation's entry (SECURITY DEFINER, its own checks) and evaluate's hint
        '_evaluate_private', '_names_usable_dataset'];
    -- Data owners: registration (the INVOKER wrapper calls the DEFINER _register_dataset).
    -- and the non-private run machinery: data owners train noiseless models as themselves
    -- (SECURITY INVOKER, reading only what they can read).
    admin text[] := ARRAY['register_dataset', '_register_dataset', 'grant_dataset', 'audit',
                          'alter_dataset', 'drop_dataset',  -- 55_dataset_admin.sql
                          'revoke_dataset', 'estimate_bounds', 'estimate_label_bound',
                          '_prepare', '_check_run_settings', '_fill_run', '_fill_training_table',
                          '_initial_state', '_huber_h', '_run_epoch', '_finish', '_abort', '_locked_run',
                          'sgd_epoch', '_sgd_init', '_sgd_info', '_sgd_weights', '_shuffle_key',
                          '_random_seed', '_flag', '_work_schema', '_training_table_name',
                          '_load_module',  -- before a training table (durable_drops.c)
                          -- Citus sources (32_distributed.sql)
                          '_refuse_on_worker', '_citus_installed',
                          '_citus_layout', '_reads_citus', '_fill_distributed_table', '_runs_no_code'];
    -- Not granted to anyone: an aggregate runs its support functions with its owner's rights,
    -- so data owners need sgd_epoch only; EXECUTE on _sgd_transition / _sgd_final would let
    -- them build aggregates of their own around those functions with forged states.
    missing text;
    f record;
BEGIN
    SELECT string_agg(w, ', ') INTO missing
      FROM unnest(analyst || admin) w
     WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p
                        WHERE p.pronamespace IN ('dpsql'::regnamespace, 'dpsql_internal'::regnamespace)
                          AND p.proname = w);
    IF missing IS NOT NULL THEN
        -- (a RAISE, not _fail: a broken install script, not a refusal of a call)
        RAISE EXCEPTION 'dpsql install: functions to grant do not exist: %', missing;
    END IF;
    FOR f IN SELECT p.oid::regprocedure AS sig, p.proname = ANY (admin) AS admin_only
               FROM pg_catalog.pg_proc p
              WHERE p.pronamespace IN ('dpsql'::regnamespace, 'dpsql_internal'::regnamespace)
                AND p.proname = ANY (analyst || analyst_optional || admin)
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', f.sig,
                       CASE WHEN f.admin_only THEN 'dpsql_admin'
                            ELSE 'dpsql_analyst, dpsql_admin' END);
    END LOOP;
END $$;

GRANT SELECT ON dpsql.ledger, dpsql.budgets, dpsql.my_datasets TO dpsql_analyst, dpsql_admin;
-- Audits (52_audit.sql) are the data owners': their canaries and counts describe the data.
GRANT SELECT ON dpsql.audits TO dpsql_admin;
-- Data owners may list who was granted what (metadata only).
GRANT SELECT ON dpsql.dataset_grants TO dpsql_admin;
-- and every change to a registration (55_dataset_admin.sql)
GRANT SELECT ON dpsql.dataset_history TO dpsql_admin;

-- dpsql.models is readable only as the row-filtered view over dpsql.model_store; never as a
-- table (a table named models would hold every model, noiseless ones included).
DO $$
BEGIN
    IF (SELECT c.relkind FROM pg_catalog.pg_class c
         WHERE c.oid = pg_catalog.to_regclass('dpsql.models')) = 'v' THEN
        GRANT SELECT ON dpsql.models TO dpsql_analyst, dpsql_admin;
    END IF;
END $$;

-- Data owners' non-private runs (dpsql.train with privacy => 'none' runs as the caller). A
-- private run's noiseless state lives in dpsql.runs only inside its own transaction, and row
-- security limits a data owner to the runs and models of their own non-private training
-- (the extension owner, who runs every private release, bypasses it): a data owner can
-- neither read another role's run nor forge a release.
-- A data owner inserts a run only under the id their session just drew, and never changes
-- it: a row taken under an id another session will draw would make that run fail.
GRANT SELECT, INSERT, DELETE ON dpsql.runs TO dpsql_admin;
GRANT UPDATE (state, epochs_done, losses, done, train_seconds) ON dpsql.runs TO dpsql_admin;
GRANT SELECT, INSERT ON dpsql.model_store TO dpsql_admin;
ALTER TABLE dpsql.runs ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS own_runs ON dpsql.runs;  -- (before 0.8.0: one policy for every command)
DROP POLICY IF EXISTS read_own_runs ON dpsql.runs;
CREATE POLICY read_own_runs ON dpsql.runs FOR SELECT USING (created_by = current_user);
DROP POLICY IF EXISTS update_own_runs ON dpsql.runs;
CREATE POLICY update_own_runs ON dpsql.runs FOR UPDATE
    USING (created_by = current_user) WITH CHECK (created_by = current_user);
DROP POLICY IF EXISTS delete_own_runs ON dpsql.runs;
CREATE POLICY delete_own_runs ON dpsql.runs FOR DELETE USING (created_by = current_user);
DROP POLICY IF EXISTS insert_drawn_runs ON dpsql.runs;
CREATE POLICY insert_drawn_runs ON dpsql.runs FOR INSERT
    WITH CHECK (created_by = current_user
                AND run_id = currval(pg_get_serial_sequence('dpsql.runs', 'run_id')));
ALTER TABLE dpsql.model_store ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS read_models ON dpsql.model_store;
CREATE POLICY read_models ON dpsql.model_store FOR SELECT USING (true);
DROP POLICY IF EXISTS store_own_noiseless_models ON dpsql.model_store;
-- (under the id their session just drew: never one a private release will draw)
CREATE POLICY store_own_noiseless_models ON dpsql.model_store FOR INSERT
    WITH CHECK (created_by = current_user
                AND model_id = currval(pg_get_serial_sequence('dpsql.model_store', 'model_id'))
                AND privacy = 'none' AND dataset_id IS NULL
                AND epsilon IS NULL AND delta IS NULL AND sensitivity IS NULL
                AND noise_scale IS NULL
                AND coalesce(params->'privacy', 'null') = 'null');
GRANT USAGE ON ALL SEQUENCES IN SCHEMA dpsql TO dpsql_admin;
GRANT USAGE, CREATE ON SCHEMA dpsql_owner_work TO dpsql_admin;

-- dpsql_reader reads the registered columns of live datasets (registration grants them; this
-- covers datasets registered before 0.3.0, when the extension owner read them).
DO $$
DECLARE
    ds record;
BEGIN
    FOR ds IN SELECT d.relid, d.features || d.label || array_remove(ARRAY[d.split_key], NULL) AS columns
                FROM dpsql.datasets d
               WHERE d.dropped_at IS NULL LOOP
        PERFORM dpsql_internal._grant_reader(ds.relid, ds.columns);
    END LOOP;
END $$;
