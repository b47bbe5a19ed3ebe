------------------------------------------------------------------------------------------
-- Roles (docs/privacy.md): data owners (dpsql_admin), analysts (dpsql_analyst) and the reader
-- that private runs read registered tables as (dpsql_reader).
------------------------------------------------------------------------------------------

-- Group roles. Roles are cluster-wide: create them only when missing (another database may have
-- the extension already); DROP EXTENSION keeps them. Members are login roles of the DBA's.
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['dpsql_admin', 'dpsql_analyst'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- created concurrently from another database
            END;
        END IF;
    END LOOP;
    -- Private training reads registered data as this role, never as a superuser (see
    -- dpsql_internal._read_source): it holds SELECT on the registered columns only, and reads every row
    -- of them whatever the row-level policies (as the extension owner did before 0.3.0).
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'dpsql_reader') THEN
        BEGIN
            CREATE ROLE dpsql_reader NOLOGIN BYPASSRLS;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
END $$;
