------------------------------------------------------------------------------------------
-- Fixing registrations (issue 27): alter a dataset's budget or name, drop it, grant by name
--
-- A dataset's budgets and name belong to the data owner who registered it (created_by) and
-- to superusers; every change is appended to dpsql.dataset_history (who, when, from what to
-- what), as the ledger keeps every charge. A budget never drops below what is spent. Dropping
-- a dataset keeps its row, history and ledger (dropped_at) and frees its name and its
-- relation for a new registration; a dropped relation's dataset is marked the same way.
------------------------------------------------------------------------------------------

CREATE TABLE IF NOT EXISTS dpsql.dataset_history (
    change_id   bigserial PRIMARY KEY,
    dataset_id  bigint NOT NULL REFERENCES dpsql.datasets,
    changed_at  timestamptz NOT NULL DEFAULT now(),
    changed_by  name NOT NULL DEFAULT session_user,
    change      jsonb NOT NULL          -- {"epsilon_budget": [old, new], ...} or {"dropped": ...}
);
COMMENT ON TABLE dpsql.dataset_history IS
    'Every change to a registered dataset after its registration: who, when, from what to what';

-- Appends one change to dpsql.dataset_history (as session_user: the login role that made it).
CREATE OR REPLACE FUNCTION dpsql_internal._record_change(dataset_id bigint, change jsonb)
RETURNS void LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO dpsql.dataset_history (dataset_id, change) VALUES ($1, $2)
$$;

-- A name is taken by live datasets only: a dropped one keeps its row under its old name.
ALTER TABLE dpsql.datasets DROP CONSTRAINT IF EXISTS datasets_name_key;
CREATE UNIQUE INDEX IF NOT EXISTS datasets_live_name_idx ON dpsql.datasets (name) WHERE dropped_at IS NULL;

-- The live dataset a data owner names (its name, or its id as text), which the caller may
-- change: its registering owner, or a superuser. Locked against concurrent charges.
CREATE OR REPLACE FUNCTION dpsql_internal._owned_dataset(dataset text, action text)
RETURNS dpsql.datasets LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    id bigint := dpsql_internal._dataset_id(dataset, action);
    d dpsql.datasets;
BEGIN
    SELECT * INTO d FROM dpsql.datasets ds WHERE ds.dataset_id = id AND ds.dropped_at IS NULL
       FOR NO KEY UPDATE;  -- as a charge locks it (28_ledger.sql): none runs in between
    IF NOT FOUND THEN  -- dropped since the lookup
        PERFORM dpsql_internal._fail(format('no dataset %s', quote_literal(dataset)), '42704');
    END IF;
    PERFORM dpsql_internal._require_dataset_owner(d, action);
    RETURN d;
END $$;

-- (0.8.0: privacy_unit and max_rows_per_unit, 64_privacy_units.sql; privacy_unit => '' says
-- a row is a unit again)
DROP FUNCTION IF EXISTS dpsql.alter_dataset(text, float8, float8, text);
CREATE OR REPLACE FUNCTION dpsql.alter_dataset(dataset text, epsilon_budget float8 DEFAULT NULL,
                                               delta_budget float8 DEFAULT NULL,
                                               new_name text DEFAULT NULL,
                                               privacy_unit text DEFAULT NULL,
                                               max_rows_per_unit int DEFAULT NULL)
RETURNS void LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d dpsql.datasets := dpsql_internal._owned_dataset(dataset, 'alter datasets');
    spent record;
    change jsonb := '{}';
BEGIN
    IF privacy_unit IS NOT NULL OR max_rows_per_unit IS NOT NULL THEN
        change := dpsql_internal._alter_privacy_unit(d, nullif(privacy_unit, ''),
                                                     CASE WHEN privacy_unit = '' THEN max_rows_per_unit
                                                          ELSE coalesce(max_rows_per_unit, d.max_rows_per_unit) END,
                                                     coalesce(privacy_unit = '', false));
    END IF;
    SELECT s.epsilon_spent, s.delta_spent INTO spent FROM dpsql_internal.spent s
     WHERE s.dataset_id = d.dataset_id;
    IF epsilon_budget IS NOT NULL THEN
        IF NOT (epsilon_budget > 0 AND epsilon_budget < 'Infinity') THEN
            PERFORM dpsql_internal._fail(format('epsilon_budget must be a finite number > 0, got %s',
                                                epsilon_budget));
        END IF;
        IF epsilon_budget < spent.epsilon_spent THEN
            PERFORM dpsql_internal._fail(
                format('dataset %s has spent epsilon %s: its budget cannot be %s',
                       quote_literal(d.name), dpsql_internal._round(spent.epsilon_spent), epsilon_budget),
                hint => 'A budget can shrink to what is spent, not below: the ledger is never undone.');
        END IF;
        change := change || jsonb_build_object('epsilon_budget', jsonb_build_array(d.epsilon_budget, epsilon_budget));
    END IF;
    IF delta_budget IS NOT NULL THEN
        IF NOT (delta_budget >= 0 AND delta_budget < 1) THEN
            PERFORM dpsql_internal._fail(format('delta_budget must be in [0, 1), got %s', delta_budget));
        END IF;
        IF delta_budget < spent.delta_spent THEN
            PERFORM dpsql_internal._fail(
                format('dataset %s has spent delta %s: its delta budget cannot be %s',
                       quote_literal(d.name), dpsql_internal._round(spent.delta_spent), delta_budget),
                hint => 'A budget can shrink to what is spent, not below: the ledger is never undone.');
        END IF;
        change := change || jsonb_build_object('delta_budget', jsonb_build_array(d.delta_budget, delta_budget));
    END IF;
    IF new_name IS NOT NULL THEN
        PERFORM dpsql_internal._check_dataset_name(new_name);
        IF EXISTS (SELECT 1 FROM dpsql.datasets ds WHERE ds.name = new_name AND ds.dropped_at IS NULL
                                                     AND ds.dataset_id <> d.dataset_id) THEN
            PERFORM dpsql_internal._fail(format('a dataset named %s is already registered', quote_literal(new_name)),
                                         '42710');
        END IF;
        change := change || jsonb_build_object('name', jsonb_build_array(d.name, new_name));
    END IF;
    IF change = '{}' THEN
        PERFORM dpsql_internal._fail('alter_dataset changes nothing',
                                     hint => 'Give epsilon_budget, delta_budget, new_name, privacy_unit or '
                                             'max_rows_per_unit.');
    END IF;
    UPDATE dpsql.datasets ds
       SET epsilon_budget = coalesce(alter_dataset.epsilon_budget, ds.epsilon_budget),
           delta_budget = coalesce(alter_dataset.delta_budget, ds.delta_budget),
           name = coalesce(new_name, ds.name)
     WHERE ds.dataset_id = d.dataset_id;
    PERFORM dpsql_internal._record_change(d.dataset_id, change);
END $$;
COMMENT ON FUNCTION dpsql.alter_dataset(text, float8, float8, text, text, int) IS
    'Change a dataset''s budgets (never below what is spent), name or privacy unit (while nothing is spent); '
    'recorded in dpsql.dataset_history';

CREATE OR REPLACE FUNCTION dpsql.drop_dataset(dataset text)
RETURNS void LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d dpsql.datasets := dpsql_internal._owned_dataset(dataset, 'drop datasets');
BEGIN
    UPDATE dpsql.datasets ds SET dropped_at = now() WHERE ds.dataset_id = d.dataset_id;
    PERFORM dpsql_internal._record_change(d.dataset_id, jsonb_build_object('dropped', d.name));
END $$;
COMMENT ON FUNCTION dpsql.drop_dataset(text) IS
    'Retire a dataset: its name and relation are free for a new registration; its ledger and history stay';

-- Grants by name (or by id as text): the bigint forms stay (25_datasets.sql).
CREATE OR REPLACE FUNCTION dpsql.grant_dataset(dataset text, role name)
RETURNS void LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM dpsql.grant_dataset(dpsql_internal._dataset_id(dataset, 'grant datasets'), role);
END $$;
COMMENT ON FUNCTION dpsql.grant_dataset(text, name) IS
    'Allow a role (and its members) to train privately on a registered dataset, by name';

CREATE OR REPLACE FUNCTION dpsql.revoke_dataset(dataset text, role name)
RETURNS void LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM dpsql.revoke_dataset(dpsql_internal._dataset_id(dataset, 'revoke datasets'), role);
END $$;
COMMENT ON FUNCTION dpsql.revoke_dataset(text, name) IS
    'Withdraw a role''s grant on a dataset, by name (its ledger entries stay)';

-- A live dataset's id from its name, or from its id as text (data owners only: the action
-- names what they are doing, for the refusal).
CREATE OR REPLACE FUNCTION dpsql_internal._dataset_id(dataset text, action text)
RETURNS bigint LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    id bigint;
BEGIN
    PERFORM dpsql_internal._require_admin(action);
    SELECT ds.dataset_id INTO id FROM dpsql.datasets ds
     WHERE ds.dropped_at IS NULL
       AND (ds.name = dataset OR (dataset ~ '^[0-9]{1,18}$' AND ds.dataset_id = dataset::bigint))
     ORDER BY ds.name = dataset DESC
     LIMIT 1;
    IF id IS NULL THEN
        PERFORM dpsql_internal._fail(format('no dataset %s', coalesce(quote_literal(dataset), 'NULL')), '42704',
                                     hint => 'dpsql.my_datasets lists the live datasets.');
    END IF;
    RETURN id;
END $$;
