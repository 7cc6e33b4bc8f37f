#!/bin/sh
# Runs once, when the Postgres data volume is new (the postgres image's docker-entrypoint-initdb.d).
# One role per user of the server, each owning only its own databases: Temporal's two, and the
# journal's. The worker applies the journal's migrations itself at start-up.
# Passwords are passed as psql variables and quoted by psql (:'name'), never spliced into SQL.
set -eu

psql --no-psqlrc --set=ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
     --set=temporal_password="$TEMPORAL_DB_PASSWORD" \
     --set=tidemark_password="$TIDEMARK_DB_PASSWORD" <<'SQL'
CREATE ROLE temporal LOGIN PASSWORD :'temporal_password';
CREATE DATABASE temporal OWNER temporal;
CREATE DATABASE temporal_visibility OWNER temporal;

CREATE ROLE tidemark LOGIN PASSWORD :'tidemark_password';
CREATE DATABASE tidemark OWNER tidemark;
SQL
