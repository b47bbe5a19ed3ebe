------------------------------------------------------------------------------------------
-- The privacy ledger: append-only, one row per charged release, charged under a row lock on
-- the dataset so that concurrent trainings can never overspend, and committed in a transaction
-- of its own before the release computes anything (charge_fmgr.c): no rollback of the caller's
-- transaction takes a charge back.
------------------------------------------------------------------------------------------

-- The privacy ledger. Append-only (trigger below); a dataset with entries cannot be deleted.
CREATE TABLE IF NOT EXISTS dpsql.ledger_entries (
    entry_id        bigserial PRIMARY KEY,
    dataset_id      bigint NOT NULL REFERENCES dpsql.datasets,
    model_id        bigint,                     -- set once the released model is stored
    mechanism       text NOT NULL,
    epsilon         float8 NOT NULL CHECK (epsilon >= 0 AND epsilon < 'Infinity'),
    delta           float8 NOT NULL CHECK (delta >= 0 AND delta < 1),
    charged_at      timestamptz NOT NULL DEFAULT now(),
    role            name NOT NULL DEFAULT session_user,  -- the login role that was charged
    note            text,
    dp_event        jsonb,  -- the release as a dp-accounting DpEvent (dpsql/ledger_events.py);
                            -- NULL before 0.6.0, which means the plain (epsilon, delta) event
    xact            xid8    -- the releasing transaction (the charge commits in another one);
                            -- NULL before 0.8.0, when both were one transaction
);
-- Entries written before 0.6.0 keep dp_event NULL (ALTER EXTENSION UPDATE adds the column).
ALTER TABLE dpsql.ledger_entries ADD COLUMN IF NOT EXISTS dp_event jsonb;
ALTER TABLE dpsql.ledger_entries ADD COLUMN IF NOT EXISTS xact xid8;
CREATE INDEX IF NOT EXISTS ledger_entries_dataset_idx ON dpsql.ledger_entries (dataset_id);
COMMENT ON TABLE dpsql.ledger_entries IS 'Append-only privacy ledger: one row per charged release';

-- How a dataset's releases are held against its budget (docs/privacy.md, "Re-accounting the
-- ledger"): 'sum' adds up epsilons and deltas; 'pld' composes the entries' dp_events with
-- dp-accounting's PLD accountant and compares epsilon at the delta budget. Declared here, with
-- the charge that reads it, on install and upgrade alike.
ALTER TABLE dpsql.datasets ADD COLUMN IF NOT EXISTS composition text NOT NULL DEFAULT 'sum'
    CHECK (composition IN ('sum', 'pld'));
-- Issue 27: tables as they come (25_datasets.sql): the public values of categorical columns
-- (one-hot) and a text label's public values (trained as classes 0, 1, ...).
ALTER TABLE dpsql.datasets ADD COLUMN IF NOT EXISTS categories jsonb;
ALTER TABLE dpsql.datasets ADD COLUMN IF NOT EXISTS label_values text[];
-- Issue 44: a holdout split (62_holdout.sql): the relation's rows are two datasets, 'train'
-- and 'holdout', chosen by a secret-keyed hash of the key column. (Here, after the columns of
-- earlier versions: a fresh table has an upgraded one's column order.) One live dataset
-- (budget) per relation, or one per side of its split.
ALTER TABLE dpsql.datasets ADD COLUMN IF NOT EXISTS split_side text CHECK (split_side IN ('train', 'holdout'));
ALTER TABLE dpsql.datasets ADD COLUMN IF NOT EXISTS split_key text;       -- the key column
ALTER TABLE dpsql.datasets ADD COLUMN IF NOT EXISTS split_fraction float8; -- the holdout's share
ALTER TABLE dpsql.datasets ADD COLUMN IF NOT EXISTS split_of bigint;      -- holdout: its training dataset
DROP INDEX IF EXISTS dpsql.datasets_live_relid_idx;
CREATE UNIQUE INDEX IF NOT EXISTS datasets_live_split_idx ON dpsql.datasets (relid, coalesce(split_side, 'all'))
    WHERE dropped_at IS NULL;
-- Issue 46: the privacy unit (64_privacy_units.sql): the column whose value names the person a
-- row belongs to, and the rows each unit keeps (every read keeps exactly that many slots per
-- unit). NULL: one row is one unit, as before.
ALTER TABLE dpsql.datasets ADD COLUMN IF NOT EXISTS privacy_unit text;
ALTER TABLE dpsql.datasets ADD COLUMN IF NOT EXISTS max_rows_per_unit int
    CHECK (max_rows_per_unit BETWEEN 1 AND 1000);

-- The only change allowed to a ledger entry: model_id from NULL to a value, with charged_at
-- moving forward to the release's time, nothing else.
CREATE OR REPLACE FUNCTION dpsql_internal._ledger_append_only()
RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    expected dpsql.ledger_entries;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        expected := OLD;
        expected.model_id := NEW.model_id;
        expected.charged_at := NEW.charged_at;
        IF OLD.model_id IS NULL AND NEW.model_id IS NOT NULL AND NEW.charged_at >= OLD.charged_at
           AND NEW IS NOT DISTINCT FROM expected THEN
            RETURN NEW;
        END IF;
    END IF;
    PERFORM dpsql_internal._fail(
        format('the privacy ledger is append-only (%s refused)', TG_OP), '42501',
        hint => 'Only model_id may be filled in once, by dpsql_internal._set_ledger_model.');
END $$;

CREATE OR REPLACE TRIGGER ledger_entries_append_only
    BEFORE UPDATE OR DELETE ON dpsql.ledger_entries
    FOR EACH ROW EXECUTE FUNCTION dpsql_internal._ledger_append_only();
CREATE OR REPLACE TRIGGER ledger_entries_no_truncate
    BEFORE TRUNCATE ON dpsql.ledger_entries
    FOR EACH STATEMENT EXECUTE FUNCTION dpsql_internal._ledger_append_only();
-- ALWAYS: also under session_replication_role = replica.
ALTER TABLE dpsql.ledger_entries ENABLE ALWAYS TRIGGER ledger_entries_append_only;
ALTER TABLE dpsql.ledger_entries ENABLE ALWAYS TRIGGER ledger_entries_no_truncate;

------------------------------------------------------------------------------------------
-- Charging the ledger
------------------------------------------------------------------------------------------

-- What each dataset has spent: the one sum of the ledger, read by the charge and the views.
CREATE OR REPLACE VIEW dpsql_internal.spent AS
SELECT d.dataset_id, coalesce(sum(e.epsilon), 0) AS epsilon_spent,
       coalesce(sum(e.delta), 0) AS delta_spent
  FROM dpsql.datasets d LEFT JOIN dpsql.ledger_entries e ON e.dataset_id = d.dataset_id
 GROUP BY d.dataset_id;

-- The event of a release known only to be (epsilon, delta)-DP (dpsql/ledger_events.py).
CREATE OR REPLACE FUNCTION dpsql_internal._epsilon_delta_event(epsilon float8, delta float8)
RETURNS jsonb LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT jsonb_build_object('type', 'EpsilonDelta', 'epsilon', epsilon, 'delta', delta)
$$;

-- Charge (epsilon, delta) to a dataset; returns the ledger entry, already committed: the
-- charge runs in a background worker's transaction of its own (charge_fmgr.c), so nothing the
-- caller does afterwards (ROLLBACK, a savepoint, an exception block) takes it back. Raises
-- SQLSTATE DP001 when the budget would be exceeded, and then writes nothing. dp_event is the
-- release as a dp-accounting event when the caller knows one tighter than (epsilon, delta)
-- (51_budget_report.sql); NULL records the plain (epsilon, delta) event, always sound. The
-- ledger records the releasing transaction (xact), so that dpsql.ledger can say whether the
-- release's output was kept.
--
-- One exception: a dataset created by this very transaction (register_dataset with
-- estimate => ..., an audit's copy) is not visible to the worker; its charge goes in this
-- transaction, with the dataset: both commit or neither exists. Every path that creates a
-- dataset first checks that the caller can read its rows (registration, dpsql.audit), so a
-- rollback gives them nothing the rows do not already tell them.
-- Refusals of the caller's transaction, before any row is read (issue 41): a release writes its
-- model and ledger entry, and its charge commits in a READ COMMITTED transaction of its own,
-- which a REPEATABLE READ or SERIALIZABLE caller's snapshot cannot see afterwards (the charge
-- would stand and nothing be released). A preview charges nothing and is not refused.
CREATE OR REPLACE FUNCTION dpsql_internal._check_release_transaction()
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF dpsql_internal._previewing() THEN
        RETURN;
    END IF;
    IF current_setting('transaction_read_only') = 'on' THEN
        PERFORM dpsql_internal._fail('a release cannot run in a read-only transaction', '25006',
                                     hint => 'A release writes its model and its ledger entry: use a '
                                             'read-write transaction. Nothing was charged.');
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM dpsql_internal._fail(
            format('a release runs in a READ COMMITTED transaction, not %s',
                   upper(current_setting('transaction_isolation'))), '25001',
            hint => 'Its charge commits in a transaction of its own, which a '
                    'REPEATABLE READ or SERIALIZABLE snapshot cannot see: release outside that '
                    'transaction (or SET default_transaction_isolation = ''read committed''). '
                    'Nothing was charged.');
    END IF;
END $$;

-- Waits until the dataset's row can be locked as a charge locks it (or until give_up), and
-- lets it go: the lock is taken in a subtransaction that is then rolled back.
CREATE OR REPLACE FUNCTION dpsql_internal._await_dataset_row(dataset_id bigint, give_up timestamptz)
RETURNS void LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    wait_ms bigint := greatest(1, ceil(extract(epoch FROM give_up - clock_timestamp()) * 1000));
BEGIN
    BEGIN
        PERFORM set_config('lock_timeout', wait_ms || 'ms', true);  -- (undone with the block)
        PERFORM 1 FROM dpsql.datasets ds WHERE ds.dataset_id = _await_dataset_row.dataset_id
           FOR NO KEY UPDATE;
        -- not _fail: this is no refusal, only the way to roll the block back (releasing the
        -- lock and the setting); it is caught just below.
        RAISE EXCEPTION USING ERRCODE = 'DPLCK';
    EXCEPTION
        WHEN SQLSTATE 'DPLCK' THEN
            NULL;
        WHEN lock_not_available THEN
            PERFORM dpsql_internal._fail(
                'the dataset''s registration is held by another transaction: waited a minute to charge',
                '55P03', hint => 'Nothing was charged. A data owner''s open transaction that changed the '
                                 'dataset (alter_dataset, an estimate, a charge) holds it: retry once it ends.');
    END;
END $$;

-- The budget rule of a dataset composed by sums (the default): spent plus this release within
-- the budget, with a relative slack for float sums of many charges. The one place it is
-- written: the charge applies it under the dataset's row lock, and releases apply it before
-- reading a row (dpsql_internal._check_budget_left: dpsql.tune, before its two charges).
CREATE OR REPLACE FUNCTION dpsql_internal._refuse_over_sums(d dpsql.datasets, eps_spent float8,
                                                            delta_spent float8, epsilon float8,
                                                            delta float8)
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    slack constant float8 := 1e-12;
BEGIN
    IF eps_spent + epsilon > d.epsilon_budget * (1 + slack)
       OR delta_spent + delta > d.delta_budget * (1 + slack) THEN
        PERFORM dpsql_internal._fail(
            format('privacy budget of dataset %s exceeded: spent ε=%s, δ=%s; '
                   'budget ε=%s, δ=%s; this release needs ε=%s, δ=%s',
                   quote_literal(d.name), dpsql_internal._round(eps_spent),
                   dpsql_internal._round(delta_spent), d.epsilon_budget, d.delta_budget,
                   dpsql_internal._round(epsilon), dpsql_internal._round(delta)),
            'DP001',
            hint => 'Nothing was charged. Ask the data owner for a larger budget, or release with '
                    'a smaller epsilon/delta.');
    END IF;
END $$;

-- Refuses a release that the budget of a dataset composed by sums cannot pay for (DP001), from
-- the ledger as it stands; the charge checks again, atomically. A 'pld' dataset's total needs
-- the release's DpEvent, and a release given a noise multiplier has no epsilon yet: there only
-- the charge decides. dpsql.tune calls it before its first charge.
CREATE OR REPLACE FUNCTION dpsql_internal._check_budget_left(d dpsql.datasets, epsilon float8,
                                                             delta float8)
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    spent record;
BEGIN
    IF d.composition = 'pld' OR epsilon IS NULL THEN
        RETURN;
    END IF;
    SELECT s.epsilon_spent, s.delta_spent INTO spent FROM dpsql_internal.spent s
     WHERE s.dataset_id = d.dataset_id;
    PERFORM dpsql_internal._refuse_over_sums(d, coalesce(spent.epsilon_spent, 0),
                                             coalesce(spent.delta_spent, 0), epsilon,
                                             coalesce(delta, 0));
END $$;

-- What a release is charged, as its plan computed it before anything was charged or read:
-- the dataset, epsilon and delta (at row level unless unit_level: a privacy unit's charge
-- converts them, below), the mechanism, a note, the DpEvent (NULL: (epsilon, delta)) and the
-- public plan its ledger entry records. A release passes it to _charge; dpsql.preview shows
-- it (57_preview.sql). Created only where missing (an upgrade replays this script).
DO $$
BEGIN
    CREATE TYPE dpsql_internal.release_charge AS (
        dataset_id bigint, epsilon float8, delta float8, mechanism text, note text,
        dp_event jsonb, plan jsonb, unit_level boolean);
EXCEPTION WHEN duplicate_object THEN
    NULL;
END $$;

-- A charge's terms checked, and at unit level: a dataset with a privacy unit of k > 1 rows
-- (64_privacy_units.sql) had the release planned at row level, and is charged at unit level
-- (group privacy; Gaussian and Laplace events with their multipliers / k), unless unit_level
-- says its numbers already are (tune's selection). What _charge books and a preview shows.
CREATE OR REPLACE FUNCTION dpsql_internal._charge_terms(c dpsql_internal.release_charge,
                                                       OUT terms dpsql_internal.release_charge,
                                                       OUT d dpsql.datasets)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    unit record;
BEGIN
    IF c.epsilon IS NULL OR NOT (c.epsilon > 0 AND c.epsilon < 'Infinity') THEN
        PERFORM dpsql_internal._fail(
            format('epsilon must be a finite number > 0, got %s', coalesce(c.epsilon::text, 'NULL')));
    END IF;
    IF c.delta IS NULL OR NOT (c.delta >= 0 AND c.delta < 1) THEN
        PERFORM dpsql_internal._fail(
            format('delta must be in [0, 1), got %s', coalesce(c.delta::text, 'NULL')));
    END IF;
    IF c.mechanism IS NULL OR btrim(c.mechanism) = '' THEN
        PERFORM dpsql_internal._fail('a charge needs the name of its mechanism');
    END IF;
    IF c.dp_event IS NOT NULL AND (jsonb_typeof(c.dp_event) IS DISTINCT FROM 'object' OR NOT c.dp_event ? 'type') THEN
        PERFORM dpsql_internal._fail(
            format('a charge''s dp_event must be a serialised DpEvent, got %s', c.dp_event));
    END IF;
    SELECT * INTO d FROM dpsql.datasets ds WHERE ds.dataset_id = c.dataset_id;
    IF NOT FOUND THEN
        PERFORM dpsql_internal._fail(
            format('no dataset %s', coalesce(c.dataset_id::text, 'NULL')), '42704');
    END IF;
    terms := c;
    IF dpsql_internal._unit_rows(d) > 1 AND NOT coalesce(c.unit_level, false) THEN
        unit := dpsql_internal._unit_charge(d.max_rows_per_unit, c.epsilon, c.delta, c.dp_event);
        terms.epsilon := unit.epsilon;
        terms.delta := unit.delta;
        terms.dp_event := unit.dp_event;
        terms.unit_level := true;
    END IF;
END $$;

DROP FUNCTION IF EXISTS dpsql_internal._charge(bigint, float8, float8, text, bigint, text, jsonb, jsonb);
-- The charge of a release's terms (_charge_terms: checked, at unit level), committed before
-- the release reads a row.
CREATE OR REPLACE FUNCTION dpsql_internal._charge(dataset_id bigint, epsilon float8, delta float8, mechanism text,
                              model_id bigint DEFAULT NULL, note text DEFAULT NULL,
                              dp_event jsonb DEFAULT NULL, plan jsonb DEFAULT NULL,
                              unit_level boolean DEFAULT false)
RETURNS bigint LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d dpsql.datasets;
    checked record;
    terms dpsql_internal.release_charge;
    request jsonb;
    give_up timestamptz;
    entry bigint;
BEGIN
    PERFORM dpsql_internal._refuse_on_worker();  -- the one ledger is the coordinator's
    IF dpsql_internal._previewing() THEN
        -- A preview runs a release's plan only (57_preview.sql) and never gets here; a caller
        -- who set the flag gets no release.
        PERFORM dpsql_internal._fail('a preview charges nothing: this transaction''s preview flag '
                                     '(dpsql_preview.on) is set', '55000',
                                     hint => 'dpsql.preview sets it while it plans: set it off to release.');
    END IF;
    checked := dpsql_internal._charge_terms(ROW(dataset_id, epsilon, delta, mechanism, note, dp_event, plan,
                                                unit_level)::dpsql_internal.release_charge);
    terms := checked.terms;
    d := checked.d;
    -- a run of this transaction's dpsql.tune: paid by the selection's one charge (63_tune.sql)
    entry := dpsql_internal._tune_prepaid_entry(d.dataset_id, terms.epsilon, terms.delta);
    IF entry IS NOT NULL THEN
        RETURN entry;
    END IF;
    PERFORM dpsql_internal._check_release_transaction();
    request := jsonb_build_object('dataset_id', d.dataset_id, 'epsilon', terms.epsilon, 'delta', terms.delta,
                                  'mechanism', mechanism, 'model_id', model_id, 'note', note,
                                  'dp_event', terms.dp_event, 'role', session_user,
                                  'xact', pg_current_xact_id()::text);
    -- The charge worker holds a slot of a pool every role shares (max_worker_processes): it
    -- must not wait there for the dataset's row lock, which any data owner can hold in an open
    -- transaction (issue 41). So the row lock is waited for here first, without a worker, for
    -- at most a minute, and let go; the worker waits at most 2 s, and if another transaction
    -- took the lock in between, the wait starts again here.
    -- An audit's copy (52_audit.sql: a table of dpsql_audit, where only the definer role
    -- creates tables, registered by the audit's own transaction, dropped at its end) is seen by
    -- no other transaction: the worker could not charge it (DP002 below), and a rollback takes
    -- the copy with its charges. Charged here, without starting a worker for nothing.
    IF (SELECT c.relnamespace = 'dpsql_audit'::regnamespace FROM pg_class c WHERE c.oid = d.relid) THEN
        RETURN dpsql_internal._charge_committed(request);
    END IF;
    give_up := clock_timestamp() + interval '60 seconds';
    LOOP
        PERFORM dpsql_internal._await_dataset_row(d.dataset_id, give_up);
        BEGIN
            RETURN dpsql_internal._charge_durably(request::text);
        EXCEPTION
            WHEN SQLSTATE 'DP002' THEN
                EXIT;  -- the worker cannot see the dataset this caller sees: this transaction made it
            WHEN lock_not_available THEN
                -- (the worker waited on this very transaction: charge_fmgr.c says so)
                IF clock_timestamp() >= give_up OR SQLERRM LIKE '%your own transaction%' THEN
                    RAISE;
                END IF;
        END;
    END LOOP;
    RETURN dpsql_internal._charge_committed(request);
END $$;

-- Runs dpsql_internal._charge_committed(request) in a background worker's transaction, as
-- the current user, and returns its ledger entry once committed, or raises its error.
CREATE OR REPLACE FUNCTION dpsql_internal._charge_durably(request text)
RETURNS bigint AS 'MODULE_PATHNAME', 'dpsql_charge_durably'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- The charge itself, as the background worker runs it (in its own READ COMMITTED
-- transaction). The dataset row is locked (FOR NO KEY UPDATE: the releasing transaction's
-- models hold KEY SHARE locks on it, which must not block the next charge) before the spent
-- budget is summed, so concurrent charges serialize: the next charger waits and then sees
-- this entry. A 'pld' dataset is charged by the PLD composition of every entry's event and
-- this one at its delta budget, instead of the sums.
CREATE OR REPLACE FUNCTION dpsql_internal._charge_committed(request jsonb)
RETURNS bigint LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    slack constant float8 := 1e-12;  -- relative, for float sums of many charges
    epsilon float8 := (request->>'epsilon')::float8;
    delta float8 := (request->>'delta')::float8;
    d dpsql.datasets;
    eps_spent float8;
    delta_spent float8;
    event jsonb;
    composed jsonb;
    eps_composed float8;
    entry bigint;
BEGIN
    SELECT * INTO d FROM dpsql.datasets ds WHERE ds.dataset_id = (request->>'dataset_id')::bigint
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        PERFORM dpsql_internal._fail(
            format('no committed dataset %s', request->>'dataset_id'), 'DP002',
            hint => 'A release is charged in a transaction of its own: commit the registration first.');
    END IF;
    event := CASE WHEN jsonb_typeof(request->'dp_event') = 'object' THEN request->'dp_event'
                  ELSE dpsql_internal._epsilon_delta_event(epsilon, delta) END;
    SELECT s.epsilon_spent, s.delta_spent INTO eps_spent, delta_spent
      FROM dpsql_internal.spent s WHERE s.dataset_id = d.dataset_id;
    IF d.composition = 'pld' THEN
        -- The tight total of every release so far and this one, by dp-accounting (pessimistic
        -- PLD: an upper bound), in place of both sums; NULL epsilon: no finite guarantee.
        composed := dpsql_internal._compose_ledger(d.dataset_id, d.delta_budget, event);
        eps_composed := (composed->>'epsilon_pld')::float8;
        IF eps_composed IS NULL OR eps_composed > d.epsilon_budget * (1 + slack) THEN
            PERFORM dpsql_internal._fail(
                format('privacy budget of dataset %s exceeded: composed by PLD '
                       'with this release ε=%s at δ=%s; budget ε=%s, δ=%s; this '
                       'release needs ε=%s, δ=%s',
                           quote_literal(d.name), coalesce(dpsql_internal._round(eps_composed), 'Infinity'),
                       d.delta_budget, d.epsilon_budget, d.delta_budget, dpsql_internal._round(epsilon),
                       dpsql_internal._round(delta)),
                'DP001',
                hint => 'Nothing was charged. Ask the data owner for a larger budget, or release '
                        'with a smaller epsilon/delta.');
        END IF;
    ELSE
        PERFORM dpsql_internal._refuse_over_sums(d, eps_spent, delta_spent, epsilon, delta);
    END IF;
    INSERT INTO dpsql.ledger_entries (dataset_id, model_id, mechanism, epsilon, delta, charged_at,
                                      role, note, dp_event, xact)
    VALUES (d.dataset_id, (request->>'model_id')::bigint, request->>'mechanism', epsilon, delta,
            clock_timestamp(), (request->>'role')::name, request->>'note', event,
            (request->>'xact')::xid8)
    RETURNING entry_id INTO entry;
    UPDATE dpsql.datasets ds SET charges = ds.charges + 1 WHERE ds.dataset_id = d.dataset_id;
    RETURN entry;
END $$;

-- What became of a charged release (dpsql.ledger): its output was kept, is being computed, or
-- was lost after the charge (rolled back or failed), which leaves the charge standing. kept:
-- the release's output exists (its model, or the declaration an estimate wrote).
CREATE OR REPLACE FUNCTION dpsql_internal._ledger_outcome(kept boolean, xact xid8)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN xact IS NULL THEN 'released'  -- before 0.8.0: charged with its release
                WHEN pg_xact_status(xact) = 'in progress' THEN 'in progress'
                WHEN pg_xact_status(xact) = 'aborted' THEN 'charged, output rolled back'
                WHEN pg_xact_status(xact) IS NULL THEN 'charged'  -- too old to tell
                WHEN kept THEN 'released'
                ELSE 'charged, output not kept' END  -- a savepoint rolled back, say
$$;

-- Record the model a charged release produced (the only update the ledger allows).
CREATE OR REPLACE FUNCTION dpsql_internal._set_ledger_model(entry_id bigint, model_id bigint)
RETURNS void LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF model_id IS NULL THEN
        PERFORM dpsql_internal._fail('model_id must not be NULL');
    END IF;
    -- a run of this transaction's dpsql.tune: tune records its one released model itself
    IF EXISTS (SELECT 1 FROM dpsql_internal.tune_prepaid p
                WHERE p.entry_id = _set_ledger_model.entry_id AND p.backend = pg_backend_pid()
                  AND p.xact = pg_current_xact_id_if_assigned()) THEN
        RETURN;
    END IF;
    -- charged_at: when the model was released (clock time, not the transaction's start)
    UPDATE dpsql.ledger_entries e SET model_id = _set_ledger_model.model_id,
                                      charged_at = clock_timestamp()
     WHERE e.entry_id = _set_ledger_model.entry_id;
    IF NOT FOUND THEN
        PERFORM dpsql_internal._fail(
            format('no ledger entry %s', coalesce(entry_id::text, 'NULL')), '42704');
    END IF;
END $$;

-- A charge needs a background worker slot, from the pool parallel query shares: with no slots
-- that parallel query cannot take, any role can hold up every release (issue 41, route 2).
DO $$
BEGIN
    IF current_setting('max_worker_processes')::int
       - current_setting('max_parallel_workers')::int < 4 THEN
        RAISE WARNING 'dpsql: parallel query can take every background worker slot, and every release needs one'
            USING DETAIL = format('max_worker_processes = %s, max_parallel_workers = %s: any role running '
                                  'parallel queries can hold up every other role''s release.',
                                  current_setting('max_worker_processes'),
                                  current_setting('max_parallel_workers')),
                  HINT = 'Set max_worker_processes = 24 and max_parallel_workers = 8 (or keep at least '
                         '4 slots apart otherwise) and restart the server: docs/install.md.';
    END IF;
END $$;
