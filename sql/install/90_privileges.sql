------------------------------------------------------------------------------------------
-- Privileges (runs last: covers every object created above). Least privilege, DESIGN.md §3:
-- PUBLIC gets nothing; dpsql_analyst gets the entry points only; dpsql_admin (data owners)
-- gets those plus dataset registration and grants. No role but the extension owner reads the
-- tables (raw states, training tables, ledger) or runs the non-private aggregate.
------------------------------------------------------------------------------------------

REVOKE ALL ON ALL TABLES IN SCHEMA dpsql, dpsql_work FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA dpsql, dpsql_work FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA dpsql FROM PUBLIC;  -- aggregates included
REVOKE ALL ON SCHEMA dpsql, dpsql_work FROM PUBLIC;

GRANT USAGE ON SCHEMA dpsql TO dpsql_analyst, dpsql_admin;

-- EXECUTE by function name (every overload), so that signature changes need no edit here.
DO $$
DECLARE
    -- The analyst entry points, and the SECURITY INVOKER helpers that evaluate/predict call.
    analyst text[] := ARRAY[
        'train', 'predict', 'evaluate', 'loss_constants',
        '_source_sql', '_feature_sql', '_label_sql', '_check_labels', '_loss_code', '_predict',
        '_fail', '_model', '_apply_bounds', '_jsonb_weights',
        '_is_admin', '_can_use_dataset',  -- called by train and by the views
        'confint', 'zcdp_rho', 'zcdp_epsilon'];
    -- Entry points created by later releases' files; granted when present.
    analyst_optional text[] := ARRAY['_train_private', 'bolton_sensitivity'];
    -- Data owners: registration (the INVOKER wrapper calls the DEFINER _register_dataset).
    -- and the non-private run machinery: data owners train noiseless models as themselves
    -- (SECURITY INVOKER, reading only what they can read).
    admin text[] := ARRAY['register_dataset', '_register_dataset', 'grant_dataset',
                          'revoke_dataset',
                          '_prepare', '_run_epoch', '_finish', '_abort', '_locked_run',
                          'sgd_epoch', '_sgd_transition', '_sgd_final', '_sgd_combine',
                          '_sgd_init', '_sgd_info', '_sgd_weights', '_shuffle_key',
                          '_random_seed'];
    missing text;
    f record;
BEGIN
    SELECT string_agg(w, ', ') INTO missing
      FROM unnest(analyst || admin) w
     WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p
                        WHERE p.pronamespace = 'dpsql'::regnamespace AND p.proname = w);
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'dpsql install: functions to grant do not exist: %', missing;
    END IF;
    FOR f IN SELECT p.oid::regprocedure AS sig, p.proname = ANY (admin) AS admin_only
               FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = 'dpsql'::regnamespace
                AND p.proname = ANY (analyst || analyst_optional || admin)
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', f.sig,
                       CASE WHEN f.admin_only THEN 'dpsql_admin'
                            ELSE 'dpsql_analyst, dpsql_admin' END);
    END LOOP;
END $$;

GRANT SELECT ON dpsql.ledger, dpsql.budgets, dpsql.my_datasets TO dpsql_analyst, dpsql_admin;
-- Data owners may list who was granted what (metadata only).
GRANT SELECT ON dpsql.dataset_grants TO dpsql_admin;

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
-- private run's noiseless state lives in dpsql.runs only inside its own transaction, so no
-- other session ever sees it.
GRANT SELECT, INSERT, UPDATE, DELETE ON dpsql.runs TO dpsql_admin;
GRANT SELECT, INSERT ON dpsql.model_store TO dpsql_admin;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA dpsql TO dpsql_admin;
GRANT USAGE, CREATE ON SCHEMA dpsql_work TO dpsql_admin;
