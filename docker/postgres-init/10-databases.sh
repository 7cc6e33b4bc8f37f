#!/bin/sh
# Runs once, when the Postgres data volume is new (the postgres image's docker-entrypoint-initdb.d),
# as the image's postgres user. One role per user of the server, each owning only its own
# databases: Temporal's two, and the journal's. The worker applies the journal's migrations
# itself at start-up.
#
# The two passwords come from the secret files named by TEMPORAL_DB_PASSWORD_FILE and
# TIDEMARK_DB_PASSWORD_FILE. with-secret-env.sh reads them into psql's environment only; psql
# takes them with \getenv and quotes them itself (:'name'): they are never on a command line and
# never spliced into SQL.
set -eu

sh "${WITH_SECRET_ENV:-/opt/tidemark/with-secret-env.sh}" \
    TEMPORAL_DB_PASSWORD="${TEMPORAL_DB_PASSWORD_FILE:-}" \
    TIDEMARK_DB_PASSWORD="${TIDEMARK_DB_PASSWORD_FILE:-}" -- \
    psql --no-psqlrc --set=ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres <<'SQL'
\getenv temporal_password TEMPORAL_DB_PASSWORD
\getenv tidemark_password TIDEMARK_DB_PASSWORD
CREATE ROLE temporal LOGIN PASSWORD :'temporal_password';
CREATE DATABASE temporal OWNER temporal;
CREATE DATABASE temporal_visibility OWNER temporal;

CREATE ROLE tidemark LOGIN PASSWORD :'tidemark_password';
CREATE DATABASE tidemark OWNER tidemark;
SQL
