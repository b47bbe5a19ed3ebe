-- plpgsql_check over the install SQL (.ci/plpgsql-check, `make plpgsql-check`): every PL/pgSQL
-- function of the schemas dpsql and dpsql_internal, trigger functions with their table. All
-- findings are listed; an error fails the check unless it is accepted below, with why.
-- Warnings (implicit casts of '{}' defaults, unused parameters of a common signature, ...) are
-- listed only. plpgsql_check's security and performance warnings are off: every EXECUTE here
-- formats names that are quoted, regclass or the extension's own.
SET client_min_messages = warning;
CREATE EXTENSION plpgsql_check;
CREATE EXTENSION dpsql;

CREATE TEMP TABLE finding AS
SELECT p.proname::text AS name, p.oid::regprocedure::text AS function, r.level, r.lineno,
       r.message, r.detail
  FROM pg_proc p
  JOIN pg_language l ON l.oid = p.prolang AND l.lanname = 'plpgsql'
  LEFT JOIN LATERAL (SELECT t.tgrelid FROM pg_trigger t WHERE t.tgfoid = p.oid LIMIT 1) tg ON true
 CROSS JOIN LATERAL plpgsql_check_function_tb(p.oid, coalesce(tg.tgrelid, 0),
                                              fatal_errors => false) r
 WHERE p.pronamespace IN ('dpsql'::regnamespace, 'dpsql_internal'::regnamespace);

-- The accepted errors: (function name, message pattern, why).
CREATE TEMP TABLE accepted (name text, message text, why text);
INSERT INTO accepted VALUES
    ('_citus_layout', 'relation "pg_catalog.pg_dist_partition" does not exist',
     'Citus''s catalog: called only when Citus is installed (32_distributed.sql)'),
    ('_reads_citus', 'relation "pg_catalog.pg_dist_partition" does not exist',
     'Citus''s catalog: called only when Citus is installed (32_distributed.sql)'),
    ('_refuse_on_worker', 'function pg_catalog.citus_is_coordinator() does not exist',
     'Citus''s function: called only when Citus is installed (32_distributed.sql)'),
    ('_grant_reader', 'relation "pg_catalog.pg_dist_partition" does not exist',
     'Citus''s catalog: read only when Citus is installed (26_reading.sql)'),
    ('_grant_reader', 'function pg_catalog.run_command_on_placements(regclass, text) does not exist',
     'Citus''s function: called only for a Citus table (26_reading.sql)'),
    ('_grant_reader', 'function pg_catalog.run_command_on_workers(text) does not exist',
     'Citus''s function: called only for a Citus table (26_reading.sql)'),
    ('citus_setup_definer', 'function pg_catalog.citus_is_coordinator() does not exist',
     'Citus''s function: reached only when Citus is installed (32_distributed.sql)'),
    ('citus_setup_definer', 'relation "pg_catalog.pg_dist_authinfo" does not exist',
     'Citus''s catalog: reached only when Citus is installed (32_distributed.sql)'),
    ('citus_setup_definer', 'function pg_catalog.run_command_on_workers(unknown) does not exist',
     'Citus''s function: reached only when Citus is installed (32_distributed.sql)'),
    ('_derived_training_table', 'function create_distributed_table(%) does not exist',
     'Citus''s function: called only for a distributed source'),
    ('_fill_distributed_table', 'function create_distributed_table(%) does not exist',
     'Citus''s function: called only for a distributed source'),
    ('_members_table', 'function create_distributed_table(%) does not exist',
     'Citus''s function: called only for a distributed training table'),
    ('_fill_distributed_units', 'function create_distributed_table(%) does not exist',
     'Citus''s function: called only for a distributed source with a privacy unit'),
    ('_share_unit_secret', 'function create_reference_table(%) does not exist',
     'Citus''s function: called only for a distributed source (32_distributed.sql)'),
    ('_share_unit_secret', 'relation "dpsql_work.unit_secrets" does not exist',
     'made by the function itself, on a Citus coordinator only (32_distributed.sql)'),
    ('_unit_secret_shared', 'relation "pg_catalog.pg_dist_shard" does not exist',
     'Citus''s catalog: read only when the workers'' copy exists, on Citus (32_distributed.sql)'),
    ('_complete_planned', 'record "rel" is not assigned yet',
     'rel is the row of the mechanism''s fit function, which EXECUTE names at run time'),
    ('estimate_bounds', 'record "f" is not assigned yet',
     'f loops over a query that EXECUTE builds at run time');

\echo plpgsql_check findings (errors first):
SELECT level, function, lineno, message, left(coalesce(detail, ''), 70) AS detail
  FROM finding
 ORDER BY level, function, lineno;

RESET client_min_messages;
DO $$
DECLARE
    unexpected text;
    stale text;
BEGIN
    SELECT string_agg(format('%s line %s: %s', f.function, f.lineno, f.message), E'\n')
      INTO unexpected
      FROM finding f
     WHERE f.level = 'error'
       AND NOT EXISTS (SELECT 1 FROM accepted a WHERE a.name = f.name AND f.message LIKE a.message);
    SELECT string_agg(format('%s: %s', a.name, a.message), E'\n') INTO stale
      FROM accepted a
     WHERE NOT EXISTS (SELECT 1 FROM finding f
                        WHERE f.level = 'error' AND f.name = a.name AND f.message LIKE a.message);
    IF unexpected IS NOT NULL THEN
        RAISE EXCEPTION E'plpgsql_check found errors:\n%', unexpected;
    END IF;
    IF stale IS NOT NULL THEN
        RAISE EXCEPTION E'accepted errors no longer found (drop them from .ci/plpgsql_check.sql):\n%',
                        stale;
    END IF;
    RAISE NOTICE 'plpgsql_check: % functions, no unexpected error (% accepted, % warnings)',
        (SELECT count(*) FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
          WHERE l.lanname = 'plpgsql'
            AND p.pronamespace IN ('dpsql'::regnamespace, 'dpsql_internal'::regnamespace)),
        (SELECT count(*) FROM finding WHERE level = 'error'),
        (SELECT count(*) FROM finding WHERE level <> 'error');
END $$;
