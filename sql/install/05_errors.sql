------------------------------------------------------------------------------------------
-- Refusals
--
-- Every refusal of dpsql is one call: dpsql_internal._fail(message, code, hint) raises ERROR
-- "dpsql: <message>" with SQLSTATE code (22023, invalid_parameter_value, unless the call names
-- another) and the hint when it is not empty, without a CONTEXT: the caller's PL/pgSQL and SQL
-- frames would only repeat the call (sql/src/errors_fmgr.c). The Python API turns each
-- SQLSTATE into its class (dpsql/errors.py), so a refusal's code is part of the interface.
--
-- A PL/pgSQL RAISE stays where _fail cannot serve, with a comment saying why: a function that
-- runs as a role without EXECUTE on _fail (dpsql_reader), a refusal with a DETAIL, an internal
-- signal that a handler catches. The C glue reports through ereport (sql/src/glue.h).
------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION dpsql_internal._fail(message text, code text DEFAULT '22023', hint text DEFAULT NULL)
RETURNS float8 AS 'MODULE_PATHNAME', 'dpsql_fail_sql'
LANGUAGE C CALLED ON NULL INPUT VOLATILE;

-- Whether this transaction is previewing a release (dpsql.preview, 57_preview.sql): the
-- release's plan then collects its public facts and warnings for the answer. Anyone can set
-- the flag; it can only make a release refuse at its charge, with nothing read or released.
CREATE OR REPLACE FUNCTION dpsql_internal._previewing()
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT coalesce(current_setting('dpsql_preview.on', true), '') = 'on'
$$;

-- A warning that depends on public quantities only, raised before any charge: also collected
-- for dpsql.preview's answer.
CREATE OR REPLACE FUNCTION dpsql_internal._warn(message text, hint text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF dpsql_internal._previewing() THEN
        PERFORM dpsql_internal._preview_note('warnings',
            coalesce(nullif(current_setting('dpsql_preview.context', true), '')::jsonb->'warnings', '[]')
            || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object('warning', message, 'hint', hint))));
    END IF;
    IF hint IS NULL THEN
        RAISE WARNING 'dpsql: %', message;
    ELSE
        RAISE WARNING 'dpsql: %', message USING HINT = hint;
    END IF;
END $$;

-- Numbers in messages as people write them: 6 significant digits (3.0999999999999996 -> 3.1).
CREATE OR REPLACE FUNCTION dpsql_internal._round(v float8)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN v IS NULL THEN NULL WHEN v = 0 OR v IN ('NaN', 'Infinity', '-Infinity') THEN v::text
                ELSE (round(v::numeric, greatest(0, 5 - floor(log(abs(v::numeric)))::int)))::float8::text END
$$;
