#!/usr/bin/env bash
# First start of a Citus node (before 10-dpsql.sh): the citus extension, the password the nodes
# use with each other (pg_dist_authinfo, superuser-only; every node has POSTGRES_PASSWORD), and
# on the coordinator the cluster itself:
#   CITUS_ROLE=coordinator|worker, CITUS_HOST (default 127.0.0.1), PGPORT (this node's port),
#   CITUS_WORKERS=host:port,host:port (the coordinator's workers; they must be up: compose's
#   depends_on: service_healthy).
set -euo pipefail
q() { psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" "$@"; }
q -c 'CREATE EXTENSION IF NOT EXISTS citus'
q -v auth="password=$POSTGRES_PASSWORD" <<-'SQL'
	INSERT INTO pg_dist_authinfo (nodeid, rolename, authinfo) VALUES (0, 'postgres', :'auth');
SQL
if [ "${CITUS_ROLE:-}" = coordinator ]; then
	q -c "SELECT citus_set_coordinator_host('${CITUS_HOST:-127.0.0.1}', ${PGPORT:-5432})"
	for worker in ${CITUS_WORKERS//,/ }; do
		q -c "SELECT citus_add_node('${worker%:*}', ${worker##*:})"
	done
fi
