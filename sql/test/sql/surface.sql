-- The SQL surface as an analyst meets it: the mechanism list, and refusals that say why and
-- charge nothing (errors without CONTEXT: their text and hints are the interface; psql would
-- show one).
\set SHOW_CONTEXT errors
SET client_min_messages = warning;
\set VERBOSITY default
CREATE EXTENSION dpsql;

-- The mechanism list is the specs' (sql/mechanisms/*.toml; make generate writes it here and in
-- the expected output): a mechanism the registry has and the specs have not, or the other way
-- round, or one whose task, models or delta requirement differ, shows as a row.
CREATE TEMP TABLE specs (name text, task text, models text[], needs_delta boolean);
-- BEGIN GENERATED: mechanism list (make generate; sql/mechanisms/*.toml)
INSERT INTO specs (name, task, models, needs_delta) VALUES
    ('adassp', 'regression', '{linear}', true),
    ('bolton', 'classification', '{logistic,huber,multinomial}', false),
    ('bst14', 'classification', '{logistic,huber,multinomial}', true),
    ('dp_ambssgd', 'regression', '{linear}', true),
    ('dp_ftrl', 'any', '{logistic,huber,linear}', true),
    ('dp_ssgd', 'regression', '{linear}', true),
    ('dpgd', 'regression', '{linear}', true),
    ('dpsgd', 'classification', '{logistic,huber,multinomial,linear}', true),
    ('dpsgd_f', 'classification', '{logistic,huber,multinomial,linear}', true),
    ('dpsgd_f_alg2', 'classification', '{logistic,multinomial}', true),
    ('exponential_mechanism', 'any', '{logistic,huber,linear}', false),
    ('frank_wolfe', 'any', '{lasso,logistic}', false),
    ('objective_perturbation', 'any', '{logistic,huber,linear}', false),
    ('output_perturbation', 'any', '{logistic,huber,linear}', false),
    ('scs13', 'classification', '{logistic,huber,multinomial}', false);
-- END GENERATED: mechanism list
SELECT 'registry' AS only_in, * FROM (
    SELECT name, task, models, needs_delta FROM dpsql.mechanisms() EXCEPT SELECT * FROM specs) r
UNION ALL
SELECT 'specs', * FROM (
    SELECT * FROM specs EXCEPT SELECT name, task, models, needs_delta FROM dpsql.mechanisms()) s
ORDER BY name, only_in;

CREATE TABLE pts AS
SELECT ARRAY[(i % 7) / 7.0, (i % 5) / 5.0]::float8[] AS x,
       CASE WHEN i % 2 = 0 THEN 1 ELSE 0 END::float8 AS y
  FROM generate_series(1, 400) i;
SELECT dpsql.register_dataset('pts', '{x}', 'y', epsilon_budget => 1, labels => '{0,1}',
                              name => 'pts');

-- unknown mechanism: refused; the hint lists auto and the registry (every mechanism, in order)
\set VERBOSITY terse
SELECT dpsql.train('pts', NULL, NULL, privacy => 'nope', epsilon => 1);
\set VERBOSITY default
CREATE FUNCTION pg_temp.hint_of(query text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    hint text;
BEGIN
    EXECUTE query;
    RETURN NULL;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS hint = PG_EXCEPTION_HINT;
    RETURN hint;
END $$;
SELECT replace(pg_temp.hint_of($q$SELECT dpsql.train('pts', NULL, NULL, privacy => 'nope', epsilon => 1)$q$),
               (SELECT string_agg(name, ', ' ORDER BY name COLLATE "C") FROM dpsql.mechanisms()),
               '<the registry>') AS hint;
-- a model the mechanism does not train (the registry's models)
SELECT dpsql.train('pts', NULL, NULL, privacy => 'objective_perturbation', model => 'lasso',
                   epsilon => 1);
-- bad epsilon, a regression mechanism on a classification dataset, auto overriding a choice
SELECT dpsql.train('pts', NULL, NULL, privacy => 'bolton', epsilon => -1);
SELECT dpsql.train('pts', NULL, NULL, privacy => 'dpgd', model => 'linear', epsilon => 1,
                   delta => 1e-6);
SELECT dpsql.train('pts', NULL, NULL, privacy => 'auto', epsilon => 1, batch_size => 10);
-- private runs refuse a data-dependent stop
SELECT dpsql.train('pts', NULL, NULL, privacy => 'bolton', epsilon => 0.5, tolerance => 1e-3);
-- more than the budget: refused, nothing charged
SELECT dpsql.train('pts', NULL, NULL, privacy => 'bolton', epsilon => 2);
SELECT name, epsilon_spent, epsilon_remaining FROM dpsql.budgets;

-- a release within budget, with the defaults recorded; the ledger has one entry
SELECT dpsql.train('pts', NULL, NULL, privacy => 'bolton', epsilon => 0.5, seed => 1) > 0 AS trained;
SELECT params->'privacy'->'defaults' ? 'step_size' AS step_defaulted, epsilon, delta
  FROM dpsql.models;
SELECT mechanism, epsilon, delta FROM dpsql.ledger;
SELECT name, epsilon_spent, epsilon_remaining FROM dpsql.budgets;

-- tables as they come (issue 27): a text label, a categorical and a boolean column; what
-- registration finds in the rows (refused unless accepted); a preview charges nothing
CREATE TABLE people AS
SELECT i, (i % 50)::float8 / 50 AS score, (ARRAY['red', 'green', 'blue'])[1 + i % 3] AS colour,
       i % 4 = 0 AS member, CASE WHEN i % 3 = 0 THEN 'yes' ELSE 'no' END AS answer
  FROM generate_series(1, 300) i;
UPDATE people SET colour = 'mauve' WHERE i <= 2;
SELECT dpsql.register_dataset('people', '{score,colour,member}', 'answer', 2,
                              labels => '{no,yes}', categories => '{"colour": ["red", "green", "blue"]}',
                              feature_bounds => '{{0,1},{0,1}}');
SELECT dpsql.register_dataset('people', '{score,colour,member}', 'answer', 2,
                              labels => '{no,yes}', categories => '{"colour": ["red", "green", "blue"]}',
                              feature_bounds => '{{0,1},{0,1}}', accept => true) > 0 AS registered;
SELECT dim, labels, label_values FROM dpsql.my_datasets WHERE name = 'people';
SELECT p->>'mechanism' AS mechanism, p->'epsilon' AS epsilon, p->'rows' AS rows, p->'dim' AS dim,
       p->'budget'->'epsilon_remaining' AS remaining, p ? 'refused' AS refused
  FROM dpsql.preview('people', NULL, NULL, privacy => 'bolton', epsilon => 1) p;
SELECT p->'refused'->>'sqlstate' AS refused
  FROM dpsql.preview('people', NULL, NULL, privacy => 'bolton', epsilon => 5) p;
SELECT count(*) AS charges FROM dpsql.ledger WHERE dataset = 'people';

-- pg_regress runs every file in one database: leave it as found
DROP EXTENSION dpsql CASCADE;
DROP TABLE pts, people;
