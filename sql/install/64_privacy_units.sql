------------------------------------------------------------------------------------------
-- Privacy units (issue 46): protect people, not rows, when a person has many rows.
--
-- register_dataset(..., privacy_unit => 'patient_id', max_rows_per_unit => k) declares that
-- the rows sharing a value of that column are one person's (a unit's). Every private read of
-- the dataset (dpsql_internal._private_from: training, estimates, describe, evaluate, tune)
-- then keeps exactly k slots per unit:
--   - the unit's rows in a secret-keyed pseudorandom order (SHA-256 of a per-dataset secret
--     and the row's registered values: no rule that prefers some values over others), slot j
--     of k taking the row ((j - 1) mod c) + 1 of the c rows: a unit with fewer than k rows
--     repeats them, one with more keeps k of them;
--   - units in the order of a secret-keyed hash of the unit's value (public order, the same
--     for neighbouring datasets), NULL units in no slot.
-- So the number of rows read is U * k for U units: public under the unit-level neighbouring
-- relation, which replaces all of one unit's rows (U stays). Two neighbours differ in at most
-- k of the U * k slots, at the same positions.
--
-- Accounting (docs/privacy.md, "Privacy units"). A release is planned at row level for the
-- target (epsilon / k, delta / sum_{i<k} e^{i epsilon / k}) and charged at unit level:
--   - (epsilon, delta): group privacy on datasets of fixed size. An (e, d)-DP mechanism is
--     (k e, d sum_{i<k} e^{i e})-DP for datasets at distance k (Dwork and Roth, "The
--     algorithmic foundations of differential privacy", 2014, Theorem 2.2 with its sum kept),
--     for every mechanism: the target above charges exactly the (epsilon, delta) asked for.
--   - the DpEvent: a release whose event is made of Gaussian and Laplace noise (composed) is a
--     sum (or mean) with a replace-one sensitivity bound, which the triangle inequality makes
--     k times as large for k replaced slots: the same event with noise multipliers / k, exact.
--     Any other event (Poisson-sampled steps, (epsilon, delta) events) becomes the group
--     privacy (epsilon, delta) event above.
------------------------------------------------------------------------------------------

-- The secret that orders units and their rows, drawn at registration; kept by the training
-- dataset of a split (its holdout reads it there). The extension owner's: nobody reads it.
CREATE TABLE IF NOT EXISTS dpsql_internal.unit_secrets (
    dataset_id  bigint PRIMARY KEY REFERENCES dpsql.datasets ON DELETE CASCADE,
    secret      bytea NOT NULL
);

-- The largest max_rows_per_unit: the read repeats a unit's rows up to k times.
CREATE OR REPLACE FUNCTION dpsql_internal._max_rows_per_unit_limit()
RETURNS int LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1000 $$;

-- k of a dataset: 1 without a unit (a row is a unit).
CREATE OR REPLACE FUNCTION dpsql_internal._unit_rows(ds dpsql.datasets)
RETURNS int LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN ds.privacy_unit IS NULL THEN 1 ELSE ds.max_rows_per_unit END
$$;

-- register_dataset's (and alter_dataset's) privacy_unit and max_rows_per_unit, checked before
-- anything is written: both or neither, k in [1, 1000], a built-in key column (integer, text
-- or uuid) that is not trained on, on a Citus distributed table its distribution column
-- (32_distributed.sql), and, with a holdout, the split's key (a unit on both sides would be
-- seen by both budgets).
CREATE OR REPLACE FUNCTION dpsql_internal._check_privacy_unit(relid regclass, privacy_unit text,
                                                             max_rows_per_unit int, features text[],
                                                             label text, split_key text)
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF privacy_unit IS NULL THEN
        IF max_rows_per_unit IS NOT NULL THEN
            PERFORM dpsql_internal._fail('max_rows_per_unit is the privacy unit''s: give privacy_unit => a column too',
                                         hint => 'e.g. privacy_unit => ''patient_id'', max_rows_per_unit => 5');
        END IF;
        RETURN;
    END IF;
    IF max_rows_per_unit IS NULL THEN
        PERFORM dpsql_internal._fail('privacy_unit needs max_rows_per_unit => k, the rows each unit keeps',
                                     hint => 'Each unit (person) keeps k of its rows; k is public. Choose it from what '
                                             'is typical of one person, e.g. the 90th percentile of rows per person.');
    END IF;
    IF NOT max_rows_per_unit BETWEEN 1 AND dpsql_internal._max_rows_per_unit_limit() THEN
        PERFORM dpsql_internal._fail(format('max_rows_per_unit must be in [1, %s], got %s',
                                            dpsql_internal._max_rows_per_unit_limit(), max_rows_per_unit));
    END IF;
    IF privacy_unit = ANY (features || label) THEN
        PERFORM dpsql_internal._fail(format('the privacy unit %s is a registered feature or label',
                                            quote_ident(privacy_unit)),
                                     hint => 'The unit column names the person a row belongs to; it is never trained on.');
    END IF;
    PERFORM dpsql_internal._key_text_sql(relid, privacy_unit, 'the privacy unit');
    PERFORM dpsql_internal._check_distributed_unit(relid, privacy_unit);
    IF split_key IS NOT NULL AND split_key IS DISTINCT FROM privacy_unit THEN
        PERFORM dpsql_internal._fail(format('the holdout''s key %s is not the privacy unit %s',
                                            quote_ident(split_key), quote_ident(privacy_unit)),
                                     hint => 'A unit''s rows must all be on one side of the split: key => the unit column.');
    END IF;
END $$;

-- A dataset's unit secret, drawn once (gen_random_uuid's strong randomness); on a Citus
-- distributed table shared with the workers too (32_distributed.sql).
CREATE OR REPLACE FUNCTION dpsql_internal._draw_unit_secret(dataset_id bigint)
RETURNS void LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO dpsql_internal.unit_secrets (dataset_id, secret)
    VALUES ($1, uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()))
    ON CONFLICT (dataset_id) DO NOTHING;
    SELECT dpsql_internal._share_unit_secret($1);
$$;

DROP FUNCTION IF EXISTS dpsql_internal._bounded_from(dpsql.datasets, text, text[], text);
DROP FUNCTION IF EXISTS dpsql_internal._bounded_from(dpsql.datasets, text, text[], text, boolean);
-- The bounded read (header) around a read that has the unit's text as "dpsql unit", the unit
-- column itself as "dpsql unit id" and the registered columns (names, as s.<column>): exactly k
-- slots per unit, units in their hashed order; with_unit: the unit's text too, as "dpsql unit"
-- (an audit's copy keeps its units). The windows are partitioned by the unit column itself (the
-- same partition as its text), so that Citus runs them on the shards of a table distributed by
-- it. The secret is read by a subquery (evaluated once), never written into the statement.
-- slots_secret: a Citus training table's fill (32_distributed.sql) reads it from that table,
-- the workers' copy (a subquery of a local table would pull the rows to the coordinator), and
-- gets the unit column and the slot's number too, as "dpsql unit id" and "dpsql slot".
CREATE OR REPLACE FUNCTION dpsql_internal._bounded_from(ds dpsql.datasets, inner_from text, columns text[],
                                                       condition text, with_unit boolean DEFAULT false,
                                                       slots_secret text DEFAULT NULL)
RETURNS text LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    secret text := format('(SELECT u.secret FROM %s u WHERE u.dataset_id = %s)',
                          coalesce(slots_secret, 'dpsql_internal.unit_secrets'), coalesce(ds.split_of, ds.dataset_id));
BEGIN
    RETURN format(
        '(SELECT %1$s FROM ('
        '  SELECT s.*, row_number() OVER (PARTITION BY s."dpsql unit id" ORDER BY pg_catalog.sha256(%2$s || '
        '           pg_catalog.convert_to(pg_catalog.concat_ws(pg_catalog.chr(31), %3$s), ''UTF8''))) AS "dpsql rank",'
        '         count(*) OVER (PARTITION BY s."dpsql unit id") AS "dpsql rows"'
        '    FROM %4$s WHERE s."dpsql unit" IS NOT NULL%5$s) t'
        ' CROSS JOIN LATERAL pg_catalog.generate_series(t."dpsql rank", %6$s, t."dpsql rows") g(slot)'
        ' ORDER BY dpsql_internal._split_unit(t."dpsql unit", %2$s), t."dpsql unit", g.slot) AS src',
        (SELECT string_agg(format('t.%I', c), ', ' ORDER BY i) FROM unnest(columns) WITH ORDINALITY u(c, i))
            || CASE WHEN with_unit THEN ', t."dpsql unit"' ELSE '' END
            || CASE WHEN slots_secret IS NOT NULL THEN ', t."dpsql unit id", g.slot AS "dpsql slot"' ELSE '' END,
        secret,
        (SELECT string_agg(format('s.%I::pg_catalog.text', c), ', ' ORDER BY i)
           FROM unnest(columns) WITH ORDINALITY u(c, i)),
        inner_from, CASE WHEN condition <> '' THEN ' AND ' || condition ELSE '' END,
        ds.max_rows_per_unit);
END $$;

-- The row-level target of a release asked at unit level (header): (epsilon / k, delta / sum_{i<k}
-- e^{i epsilon / k}). k = 1: unchanged.
CREATE OR REPLACE FUNCTION dpsql_internal._unit_target(k int, unit_epsilon float8, unit_delta float8,
                                                      OUT epsilon float8, OUT delta float8)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT $2 / $1, $3 / (SELECT sum(exp(i * $2 / $1)) FROM generate_series(0, $1 - 1) i)
$$;

-- A DpEvent for k replaced slots: Gaussian and Laplace noise multipliers / k, through
-- compositions; NULL when the event holds anything else (sampling, an (epsilon, delta) event).
CREATE OR REPLACE FUNCTION dpsql_internal._unit_event(event jsonb, k int)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    inner_events jsonb := '[]';
    e jsonb;
    scaled jsonb;
BEGIN
    CASE event->>'type'
        WHEN 'NoOp' THEN
            RETURN event;
        WHEN 'Gaussian', 'Laplace' THEN
            RETURN jsonb_set(event, '{noise_multiplier}', to_jsonb((event->>'noise_multiplier')::float8 / k));
        WHEN 'SelfComposed' THEN
            scaled := dpsql_internal._unit_event(event->'event', k);
            RETURN CASE WHEN scaled IS NULL THEN NULL ELSE jsonb_set(event, '{event}', scaled) END;
        WHEN 'Composed' THEN
            FOR e IN SELECT * FROM jsonb_array_elements(event->'events') LOOP
                scaled := dpsql_internal._unit_event(e, k);
                IF scaled IS NULL THEN
                    RETURN NULL;
                END IF;
                inner_events := inner_events || jsonb_build_array(scaled);
            END LOOP;
            RETURN jsonb_set(event, '{events}', inner_events);
        ELSE
            RETURN NULL;
    END CASE;
END $$;

-- What a release planned at row level (epsilon, delta, its event) costs at unit level (header).
CREATE OR REPLACE FUNCTION dpsql_internal._unit_charge(k int, row_epsilon float8, row_delta float8, event jsonb,
                                                      OUT epsilon float8, OUT delta float8,
                                                      OUT dp_event jsonb)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    epsilon := k * row_epsilon;
    delta := row_delta * (SELECT sum(exp(i * row_epsilon)) FROM generate_series(0, k - 1) i);
    IF NOT (delta < 1) THEN
        PERFORM dpsql_internal._fail(
            format('at the privacy unit''s %s rows, this release''s delta is %s: not a guarantee', k, delta),
            hint => 'Use a smaller epsilon or delta, or a smaller max_rows_per_unit.');
    END IF;
    dp_event := coalesce(dpsql_internal._unit_event(event, k),
                         jsonb_build_object('type', 'EpsilonDelta', 'epsilon', epsilon, 'delta', delta));
END $$;

-- The record a release on a dataset with a unit keeps in its model (params->'privacy_unit'),
-- and the model's epsilon, delta and sensitivity said at unit level (header): what the ledger
-- charged, and k times the replace-one sensitivity (k slots replaced).
CREATE OR REPLACE FUNCTION dpsql_internal._record_unit(ds dpsql.datasets, model_id bigint)
RETURNS void LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    k int := dpsql_internal._unit_rows(ds);
    m dpsql.model_store;
    unit record;
BEGIN
    IF ds.privacy_unit IS NULL OR model_id IS NULL THEN
        RETURN;
    END IF;
    SELECT * INTO m FROM dpsql.model_store s WHERE s.model_id = _record_unit.model_id;
    unit := dpsql_internal._unit_charge(k, m.epsilon, coalesce(m.delta, 0), NULL);
    UPDATE dpsql.model_store s
       SET epsilon = unit.epsilon, delta = unit.delta, sensitivity = k * m.sensitivity,
           params = jsonb_set(m.params, '{privacy_unit}', jsonb_build_object(
               'column', ds.privacy_unit, 'max_rows_per_unit', k,
               'neighbouring', 'replace one unit''s rows (k slots of U * k)',
               'row_epsilon', m.epsilon, 'row_delta', m.delta, 'row_sensitivity', m.sensitivity))
               -- the release's record said at unit level too (its row-level plan is above)
               || jsonb_build_object('privacy', (m.params->'privacy') || jsonb_strip_nulls(jsonb_build_object(
                      'epsilon', unit.epsilon, 'delta', unit.delta,
                      'sensitivity', k * (m.params->'privacy'->>'sensitivity')::float8,
                      'neighbouring', format('replace one unit''s rows (%s slots per unit)', k))))
     WHERE s.model_id = m.model_id;
END $$;

-- The release target of a dataset's unit: (epsilon, delta) to plan with, refusing a call that
-- gives no epsilon (a noise multiplier alone is accounted at row level).
CREATE OR REPLACE FUNCTION dpsql_internal._unit_release_target(ds dpsql.datasets, unit_epsilon float8,
                                                              unit_delta float8, OUT epsilon float8,
                                                              OUT delta float8)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- (the audit's mutation that plans at row level what is charged at unit level: 52_audit.sql)
    IF dpsql_internal._unit_rows(ds) = 1 OR dpsql_internal._mutation() = 'row_level_units' THEN
        epsilon := unit_epsilon;
        delta := unit_delta;
        RETURN;
    END IF;
    IF unit_epsilon IS NULL THEN
        PERFORM dpsql_internal._fail(
            format('dataset %s protects units of %s rows: give epsilon', ds.name, ds.max_rows_per_unit),
            hint => 'A noise multiplier alone is accounted at row level; give epsilon (at unit level) instead.');
    END IF;
    SELECT t.epsilon, t.delta INTO epsilon, delta
      FROM dpsql_internal._unit_target(ds.max_rows_per_unit, unit_epsilon, coalesce(unit_delta, 0)) t;
END $$;

-- What a registration finds of its units, told to the data owner (a NOTICE, never stored):
-- the units, those with more than k rows (reads keep k of theirs) and the rows without a unit
-- (read in no slot). Read as private training reads the relation.
CREATE OR REPLACE FUNCTION dpsql_internal._unit_findings(ds dpsql.datasets)
RETURNS void LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    unit text;
    src text;
    units bigint;     -- units with a value
    over bigint;      -- of them, with more than k rows
    left_out bigint;  -- their rows beyond k
    most bigint;      -- the most rows of a unit
    no_unit bigint;   -- rows with a NULL unit
BEGIN
    IF ds.privacy_unit IS NULL THEN
        RETURN;
    END IF;
    unit := dpsql_internal._key_text_sql(ds.relid, ds.privacy_unit, 'the privacy unit');
    src := dpsql_internal._source_from(ds.relid, unit || ' AS u', 's', 'u text');
    EXECUTE format('SELECT count(*) FILTER (WHERE u IS NOT NULL),'
                   '       count(*) FILTER (WHERE u IS NOT NULL AND c > $1),'
                   '       coalesce(sum(c - $1) FILTER (WHERE u IS NOT NULL AND c > $1), 0),'
                   '       coalesce(max(c) FILTER (WHERE u IS NOT NULL), 0),'
                   '       coalesce(sum(c) FILTER (WHERE u IS NULL), 0)'
                   '  FROM (SELECT u, count(*) AS c FROM %s GROUP BY u) g', src)
       INTO units, over, left_out, most, no_unit USING ds.max_rows_per_unit;
    IF over = 0 AND no_unit = 0 THEN
        RAISE NOTICE 'dpsql: %: % units (privacy_unit %), none with more than % rows (the most: %)',
                     ds.source, units, ds.privacy_unit, ds.max_rows_per_unit, most;
        RETURN;
    END IF;
    RAISE WARNING 'dpsql: %: % units (privacy_unit %); % have more than % rows (the most: %), of which reads '
                  'keep % each (% rows left out); % rows have a NULL unit (read in no slot)',
                  ds.source, units, ds.privacy_unit, over, ds.max_rows_per_unit, most,
                  ds.max_rows_per_unit, left_out, no_unit
        USING HINT = 'Each unit reads as exactly max_rows_per_unit slots (its rows repeated or some left '
                     'out); a larger k keeps more rows and needs about k times the noise.';
END $$;

-- alter_dataset's privacy unit: only while nothing is spent on the dataset (or its split's
-- other side, which changes with it); the same checks as registration. Returns the change.
CREATE OR REPLACE FUNCTION dpsql_internal._alter_privacy_unit(d dpsql.datasets, unit text, k int,
                                                             clear boolean)
RETURNS jsonb LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    sides bigint[] := ARRAY(SELECT ds.dataset_id FROM dpsql.datasets ds
                             WHERE ds.dataset_id IN (d.dataset_id, d.split_of)
                                OR ds.split_of = coalesce(d.split_of, d.dataset_id));
BEGIN
    IF EXISTS (SELECT 1 FROM dpsql.ledger_entries e WHERE e.dataset_id = ANY (sides)) THEN
        PERFORM dpsql_internal._fail(
            format('dataset %s has spent budget: its privacy unit is fixed', quote_literal(d.name)), '55000',
            hint => 'Every charge so far was accounted for its unit; register the table again (a new '
                    'dataset) to protect another unit.');
    END IF;
    IF clear THEN
        IF k IS NOT NULL THEN
            PERFORM dpsql_internal._fail('privacy_unit => '''' makes a row a unit: give no max_rows_per_unit');
        END IF;
    ELSE
        unit := coalesce(unit, d.privacy_unit);
        PERFORM dpsql_internal._check_privacy_unit(d.relid, unit, k, d.features, d.label, d.split_key);
    END IF;
    UPDATE dpsql.datasets ds SET privacy_unit = unit, max_rows_per_unit = k
     WHERE ds.dataset_id = ANY (sides);
    IF unit IS NOT NULL THEN
        PERFORM dpsql_internal._draw_unit_secret(coalesce(d.split_of, d.dataset_id));
        PERFORM dpsql_internal._grant_reader(d.relid, ARRAY[unit]);
    END IF;
    RETURN jsonb_build_object('privacy_unit', jsonb_build_array(d.privacy_unit, unit),
                              'max_rows_per_unit', jsonb_build_array(d.max_rows_per_unit, k));
END $$;
