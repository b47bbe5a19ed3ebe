#!/usr/bin/env bash
# First start only (docker-entrypoint-initdb.d): the extension in the default database, and the
# roles named in the environment. Each variable pair is optional:
#   DPSQL_OWNER / DPSQL_OWNER_PASSWORD       a data owner (member of dpsql_admin)
#   DPSQL_ANALYST / DPSQL_ANALYST_PASSWORD   an analyst (member of dpsql_analyst)
# (or *_PASSWORD_FILE, read from a file, e.g. a Docker secret). Roles are created with
# `dpsql role create` later just as well.
set -euo pipefail

password() {  # the value of $1, or the content of the file named by ${1}_FILE
	local var="$1" file="${1}_FILE"
	if [ -n "${!file:-}" ]; then cat "${!file}"; else printf '%s' "${!var:-}"; fi
}

role() {  # role NAME PASSWORD GROUP
	[ -n "$1" ] || return 0
	if [ -z "$2" ]; then
		echo "dpsql: $1 needs a password (${3^^}: ..._PASSWORD or ..._PASSWORD_FILE)" >&2
		exit 1
	fi
	psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
		-v name="$1" -v password="$2" -v grp="$3" <<-'SQL'
		CREATE ROLE :"name" LOGIN PASSWORD :'password' IN ROLE :"grp";
	SQL
	if [ "$3" = dpsql_admin ]; then
		# a data owner's own schema, first on their search_path (PostgreSQL >= 15 gives
		# PUBLIC no CREATE on public): as `dpsql role create --owner` (dpsql/roles.py)
		psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
			-v name="$1" <<-'SQL'
			CREATE SCHEMA IF NOT EXISTS :"name" AUTHORIZATION :"name";
			ALTER ROLE :"name" SET search_path = :"name", public;
		SQL
	fi
}

# A Citus worker gets the extension and the roles from its coordinator (docker/citus).
if [ "${CITUS_ROLE:-}" = worker ]; then exit 0; fi
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
	-c 'CREATE EXTENSION IF NOT EXISTS dpsql'
# On a Citus coordinator (its workers are added by 05-citus.sh): the definer code's role logs in
# to the workers with a password of its own (docs/citus.md).
if [ "${CITUS_ROLE:-}" = coordinator ]; then
	psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
		-c 'SELECT dpsql.citus_setup_definer()'
fi
role "${DPSQL_OWNER:-}" "$(password DPSQL_OWNER_PASSWORD)" dpsql_admin
role "${DPSQL_ANALYST:-}" "$(password DPSQL_ANALYST_PASSWORD)" dpsql_analyst
