-- dpsql 0.7.0 -> 0.8.0: trust at the edges (issue 24). This prologue makes the changes that
-- replaying the (idempotent) install script, which follows it, cannot make.
\echo Use "ALTER EXTENSION dpsql UPDATE" to load this file. \quit
DROP FUNCTION IF EXISTS dpsql_internal._estimation_dataset(text, text);

-- Before 0.8.0 data owners could create in dpsql_work, where private runs create their
-- training tables under predictable names: what a role other than the extension owner owns
-- there (their non-private runs' tables, or relations and types planted under a future run's
-- name) moves to dpsql_owner_work, their schema from now on, and their runs follow it.
CREATE SCHEMA IF NOT EXISTS dpsql_owner_work;
DO $$
DECLARE
    o record;
    ext oid := (SELECT e.extowner FROM pg_catalog.pg_extension e WHERE e.extname = 'dpsql');
BEGIN
    FOR o IN SELECT c.oid, c.relname AS name,
                    CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                                   WHEN 'f' THEN 'FOREIGN TABLE' WHEN 'S' THEN 'SEQUENCE'
                                   ELSE 'TABLE' END AS kind
               FROM pg_catalog.pg_class c
              WHERE c.relnamespace = 'dpsql_work'::regnamespace AND c.relowner <> ext
                AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
              ORDER BY c.relkind = 'S' LOOP
        -- (a sequence owned by a column has moved with its table, before it)
        CONTINUE WHEN (SELECT c.relnamespace FROM pg_catalog.pg_class c WHERE c.oid = o.oid)
                      <> 'dpsql_work'::regnamespace;
        EXECUTE format('ALTER %s dpsql_work.%I SET SCHEMA dpsql_owner_work', o.kind, o.name);
        UPDATE dpsql.runs r SET train_table = format('dpsql_owner_work.%I', o.name)
         WHERE r.train_table = format('dpsql_work.%I', o.name);
    END LOOP;
    -- standalone types (a composite type takes a table's name as well)
    FOR o IN SELECT t.oid, t.typname AS name FROM pg_catalog.pg_type t
              WHERE t.typnamespace = 'dpsql_work'::regnamespace AND t.typowner <> ext
                AND t.typelem = 0 AND t.typcategory <> 'A'
                AND (t.typrelid = 0 OR (SELECT c.relkind FROM pg_catalog.pg_class c
                                         WHERE c.oid = t.typrelid) = 'c') LOOP
        EXECUTE format('ALTER TYPE dpsql_work.%I SET SCHEMA dpsql_owner_work', o.name);
    END LOOP;
END $$;
