-- What an analyst may not do, as the analyst: read rows, models' internals, runs or the
-- ledger's table; call internals; train without privacy; forge a charge. Every refusal is
-- 42501 and changes nothing.
\set SHOW_CONTEXT never
SET client_min_messages = warning;
\set VERBOSITY default
CREATE EXTENSION dpsql;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'regress_dpsql_analyst') THEN
        EXECUTE 'DROP OWNED BY regress_dpsql_analyst';
        EXECUTE 'DROP ROLE regress_dpsql_analyst';
    END IF;
END $$;
CREATE ROLE regress_dpsql_analyst IN ROLE dpsql_analyst;

CREATE TABLE secret AS
SELECT ARRAY[(i % 7) / 7.0, (i % 5) / 5.0]::float8[] AS x,
       CASE WHEN i % 2 = 0 THEN 1 ELSE 0 END::float8 AS y
  FROM generate_series(1, 400) i;
SELECT dpsql.register_dataset('secret', '{x}', 'y', epsilon_budget => 1, labels => '{0,1}',
                              name => 'secret') AS ds \gset
SELECT dpsql.grant_dataset(:ds, 'regress_dpsql_analyst');

SET ROLE regress_dpsql_analyst;
SELECT count(*) FROM secret;
SELECT count(*) FROM dpsql.model_store;
SELECT count(*) FROM dpsql.runs;
SELECT count(*) FROM dpsql.datasets;
INSERT INTO dpsql.ledger_entries DEFAULT VALUES;
SELECT dpsql_internal._charge(:ds, 0.1, 0, 'bolton');
SELECT dpsql_internal._prepare('secret', '{x}', 'y', 'logistic', 1, 1, 0, 0.1, 'constant', 0,
                               NULL, true, 1, '{0,1}', false, 'none', 0.1, NULL);
SELECT dpsql.train('secret', '{x}', 'y', labels => '{0,1}');
SELECT dpsql.register_dataset('secret', '{x}', 'y', epsilon_budget => 100, labels => '{0,1}');
SELECT dpsql.grant_dataset(:ds, 'regress_dpsql_analyst');
-- what the analyst may: a private release, charged once
SELECT dpsql.train('secret', NULL, NULL, privacy => 'bolton', epsilon => 0.5, seed => 1) > 0 AS released;
SELECT name, epsilon_spent, epsilon_remaining FROM dpsql.budgets;
RESET ROLE;

DROP OWNED BY regress_dpsql_analyst;
DROP ROLE regress_dpsql_analyst;
-- pg_regress runs every file in one database: leave it as found
DROP EXTENSION dpsql CASCADE;
DROP TABLE secret;
