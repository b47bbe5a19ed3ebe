------------------------------------------------------------------------------------------
-- Re-accounting the ledger (docs/privacy.md): every entry stores its release as a
-- dp-accounting DpEvent (dpsql/ledger_events.py; DP-SGD's is the event its accountant
-- composed, dpsql/accounting.py's ledger_event), and the accountant composes a dataset's
-- events by PLD (and RDP), next to the charged sums. 'pld' datasets are charged that way
-- (dpsql_internal._charge).
------------------------------------------------------------------------------------------

-- The accountant's composition of a dataset's ledger (plus `extra`, a release about to be
-- charged) at `delta`. Identical events are sent once with their count, in a fixed order, so
-- the request is short and the same ledger asks the same question: small requests are cached
-- in dpsql.accountant_answers (a btree key holds at most about 2.7 kB).
CREATE OR REPLACE FUNCTION dpsql_internal._compose_ledger(dataset_id bigint, delta float8,
                                                          extra jsonb DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    events jsonb;
    req jsonb;
    answer jsonb;
BEGIN
    SELECT coalesce(jsonb_agg(CASE WHEN g.n = 1 THEN g.ev
                                   ELSE jsonb_build_object('type', 'SelfComposed', 'event', g.ev,
                                                           'count', g.n) END
                              ORDER BY g.ev::text), '[]')
      INTO events
      FROM (SELECT u.ev, count(*) AS n
              FROM (SELECT coalesce(e.dp_event,
                                    dpsql_internal._epsilon_delta_event(e.epsilon, e.delta)) AS ev
                      FROM dpsql.ledger_entries e WHERE e.dataset_id = _compose_ledger.dataset_id
                    UNION ALL
                    SELECT extra WHERE extra IS NOT NULL) u
             GROUP BY u.ev) g;
    req := jsonb_build_object('op', 'compose', 'events', events, 'delta', delta);
    IF jsonb_array_length(events) = 0 THEN  -- nothing released: no need to ask
        RETURN jsonb_build_object('op', 'compose', 'epsilon_pld', 0, 'epsilon_rdp', 0,
                                  'delta', delta, 'events', 0);
    END IF;
    SELECT a.answer INTO answer FROM dpsql.accountant_answers a WHERE a.request = req;
    IF FOUND THEN
        RETURN answer;
    END IF;
    answer := dpsql_internal._accountant(req::text)::jsonb;
    IF answer ? 'error' THEN
        PERFORM dpsql_internal._fail('the accountant refused the ledger''s events: '
                                     || (answer->>'error'));
    END IF;
    IF octet_length(req::text) <= 2000 THEN
        INSERT INTO dpsql.accountant_answers (request, answer) VALUES (req, answer)
            ON CONFLICT DO NOTHING;
    END IF;
    RETURN answer;
END $$;

-- A dataset's spend re-accounted: the charged sums next to the tight PLD composition of its
-- ledger's events at the delta budget (and the RDP one when every event has an RDP curve),
-- and what summation wastes. Same visibility as dpsql.budgets.
-- (0.8.0: the privacy unit its entries were accounted for, 64_privacy_units.sql)
DROP FUNCTION IF EXISTS dpsql.budget_report(text);
CREATE OR REPLACE FUNCTION dpsql.budget_report(dataset text)
RETURNS TABLE (dataset_id bigint, name text, composition text, entries bigint,
               epsilon_budget float8, delta_budget float8, epsilon_spent float8,
               delta_spent float8, epsilon_pld float8, epsilon_rdp float8,
               epsilon_saving float8, dp_accounting text, privacy_unit text,
               max_rows_per_unit int)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d dpsql.datasets;
    composed jsonb;
BEGIN
    IF budget_report.dataset IS NULL THEN
        PERFORM dpsql_internal._fail(
            'budget_report needs a dataset name, got NULL', '22004',
            hint => 'dpsql.budgets lists the datasets you can use.');
    END IF;
    SELECT * INTO d FROM dpsql.datasets ds WHERE ds.name = budget_report.dataset
     ORDER BY ds.dropped_at IS NOT NULL, ds.dataset_id DESC LIMIT 1;  -- the live one first
    -- An ungranted dataset is reported like an unknown one: its name is not disclosed either.
    IF NOT FOUND OR NOT dpsql_internal._can_use_dataset(d.dataset_id) THEN
        PERFORM dpsql_internal._fail(
            format('no dataset %s among the datasets you can use',
                   quote_literal(budget_report.dataset)), '42704',
            hint => 'dpsql.budgets lists the datasets you can use.');
    END IF;
    composed := dpsql_internal._compose_ledger(d.dataset_id, d.delta_budget);
    dataset_id := d.dataset_id;
    name := d.name;
    composition := d.composition;
    epsilon_budget := d.epsilon_budget;
    delta_budget := d.delta_budget;
    SELECT count(*), coalesce(sum(e.epsilon), 0), coalesce(sum(e.delta), 0)
      INTO entries, epsilon_spent, delta_spent
      FROM dpsql.ledger_entries e WHERE e.dataset_id = d.dataset_id;
    -- NULL: no finite guarantee at this delta (PLD), or no RDP curve for some event.
    epsilon_pld := (composed->>'epsilon_pld')::float8;
    epsilon_rdp := (composed->>'epsilon_rdp')::float8;
    epsilon_saving := epsilon_spent - epsilon_pld;
    dp_accounting := composed->>'dp_accounting';
    -- every entry's event is at this unit's level (fixed once anything is spent)
    privacy_unit := d.privacy_unit;
    max_rows_per_unit := d.max_rows_per_unit;
    RETURN NEXT;
END $$;
COMMENT ON FUNCTION dpsql.budget_report(text) IS
    'A dataset''s ledger re-accounted: charged sums next to the PLD (and RDP) composition of its events';
