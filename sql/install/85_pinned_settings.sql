------------------------------------------------------------------------------------------
-- Pinned session settings (runs after every function is created, before the privileges).
--
-- Specs, parameters and a release's record travel between dpsql's functions as jsonb and text
-- (a plan-and-fit mechanism's typed plan too, from its plan to its fit: 33_planned.sql), and
-- the conversions of numbers, arrays and times to text follow the caller's session settings: with
-- extra_float_digits = -15 an analyst once rounded the step size the sensitivity was computed
-- from (0.1414 -> 0.1) while the state ran with the true one, and so cut the noise under a
-- full charge. Every dpsql function written in SQL or PL/pgSQL therefore runs with these
-- settings, whoever calls it, and so does everything it calls. The C functions need none: they
-- convert nothing to text (and a SET clause would cost a GUC save/restore per row).
-- tests/server/test_pinned_settings.py checks the catalog and replays every mechanism under hostile
-- settings.
------------------------------------------------------------------------------------------

DO $$
DECLARE
    -- Every setting any role may change (a SET clause of a superuser-only setting would fail
    -- for analysts) that alters a value's text form, its parsing or the shape of a plan;
    -- search_path is pinned per function (its own rule).
    pinned text[][] := ARRAY[
        ['extra_float_digits', '3'],                -- float8 -> text: shortest exact round trip
        ['lc_numeric', 'C'],                        -- to_char / money formatting
        ['DateStyle', 'ISO, YMD'],
        ['IntervalStyle', 'postgres'],
        ['bytea_output', 'hex'],
        ['standard_conforming_strings', 'on'],      -- how format(%L) output is parsed back
        ['array_nulls', 'on'],                      -- '{NULL}' is a NULL element
        ['transform_null_equals', 'off'],
        ['plpgsql.extra_errors', 'none'],
        ['debug_parallel_query', 'off'],            -- epochs scan in one process unless opted in
        ['force_parallel_mode', 'off']];            -- its PostgreSQL 15 name
    i int;
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure
               FROM pg_catalog.pg_proc p
               JOIN pg_catalog.pg_language l ON l.oid = p.prolang
              WHERE p.pronamespace IN ('dpsql'::regnamespace, 'dpsql_internal'::regnamespace)
                AND p.prokind IN ('f', 'p')
                AND l.lanname IN ('sql', 'plpgsql')
    LOOP
        FOR i IN 1..array_length(pinned, 1) LOOP
            -- a server has one of debug_parallel_query (16+) and force_parallel_mode (15)
            CONTINUE WHEN pinned[i][1] NOT LIKE '%.%'
                      AND pg_catalog.current_setting(pinned[i][1], true) IS NULL;
            EXECUTE format('ALTER FUNCTION %s SET %s = %L', f, pinned[i][1], pinned[i][2]);
        END LOOP;
    END LOOP;
END $$;
