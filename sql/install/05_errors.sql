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
