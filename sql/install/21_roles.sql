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

-- The role dpsql's definer code runs as (docs/architecture.md, privacy rule 9; docs/privacy.md,
-- "The definer role"): every SECURITY DEFINER function and the charge worker. Not a superuser, no
-- login, no CREATEROLE or CREATEDB: what it may do is granted in 90_privileges.sql (dpsql's own
-- schemas,
-- tables and functions) and by registration (dpsql_reader's SELECT on registered columns), so
-- that a route into definer code that nobody has found yields this role at most. BYPASSRLS, as
-- dpsql_reader: a private read counts every row whatever the owner's policies, and the run and
-- model tables' own policies are for data owners. Its attributes are set on every install and
-- upgrade, whatever a superuser changed.
DO $$
DECLARE
    r record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'dpsql_definer') THEN
        BEGIN
            CREATE ROLE dpsql_definer NOLOGIN BYPASSRLS;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
    ALTER ROLE dpsql_definer NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION BYPASSRLS INHERIT;
    -- No login, except on Citus after dpsql.citus_setup_definer(): Citus runs a distributed
    -- statement over connections made as the current user (32_distributed.sql).
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        ALTER ROLE dpsql_definer NOLOGIN PASSWORD NULL;
    END IF;
    -- registered columns (granted to dpsql_reader at registration) and _read_source; and no
    -- other role's rights (pg_read_server_files, say)
    FOR r IN SELECT g.rolname FROM pg_catalog.pg_auth_members m
               JOIN pg_catalog.pg_roles g ON g.oid = m.roleid
              WHERE m.member = 'dpsql_definer'::regrole AND g.rolname <> 'dpsql_reader' LOOP
        EXECUTE format('REVOKE %I FROM dpsql_definer', r.rolname);
    END LOOP;
    GRANT dpsql_reader TO dpsql_definer;
END $$;

-- Hands every SECURITY DEFINER function to dpsql_definer, except dpsql_internal._read_source
-- (dpsql_reader's) and dpsql_internal._grant_reader (the extension owner's; 26_reading.sql).
-- Called by 90_privileges.sql on every install and upgrade, and by dpsql.citus_setup_definer().
CREATE OR REPLACE FUNCTION dpsql_internal._give_definer_functions()
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    f record;
BEGIN
    FOR f IN SELECT p.oid::regprocedure AS sig FROM pg_catalog.pg_proc p
              WHERE p.pronamespace IN ('dpsql'::regnamespace, 'dpsql_internal'::regnamespace)
                AND p.prosecdef AND p.proowner <> 'dpsql_reader'::regrole
                AND p.proowner <> 'dpsql_definer'::regrole
                AND p.proname <> '_grant_reader' LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO dpsql_definer', f.sig);
    END LOOP;
END $$;
