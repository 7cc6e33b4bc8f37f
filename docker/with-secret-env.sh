#!/bin/sh
# with-secret-env.sh NAME=FILE... -- COMMAND [ARG...]
#
# Sets each NAME to the contents of FILE (a Docker secret; trailing newlines dropped) and execs
# COMMAND. For programs that take a password from a variable only: Temporal's server
# (POSTGRES_PWD), temporal-sql-tool (SQL_PASSWORD) and psql's \getenv. The password is then in
# that one process's environment (readable by its own uid and root only), and never in the
# compose file, `docker inspect`, a command line or a log.
#
# Compose mounts a file secret with its owner and mode from the host; a file this uid cannot
# read stops here with the numbers and the fix, instead of a server that cannot log in.
# A password is letters, digits and . _ ~ - only: Temporal splices it unescaped into its YAML
# configuration, and these need no quoting in a URL either.
set -eu

me=with-secret-env.sh
fail() {
    echo "$me: $*" >&2
    exit 78  # EX_CONFIG
}

while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    name=${1%%=*}
    file=${1#*=}
    case $name in
        '' | *[!A-Za-z0-9_]*) fail "expected NAME=FILE, got: $1" ;;
    esac
    [ "$name" != "$1" ] || fail "expected NAME=FILE, got: $1"
    [ -n "$file" ] || fail "$name: no file named (is its *_FILE variable set?)"
    [ -e "$file" ] || fail "$name: $file does not exist (is the secret listed under the service's secrets:?)"
    if [ ! -r "$file" ]; then
        held=$(ls -ln "$file" | awk '{print "owned by uid " $3 " with mode " $1}')
        fail "$name: cannot read $file: permission denied to uid $(id -u) ($held). Docker compose mounts a secret file with its owner and mode from the host: make it readable there, e.g. chmod 0444 on the file with its directory kept chmod 0700"
    fi
    value=$(cat "$file")
    case $value in
        '') fail "$name: $file is empty" ;;
        *[!A-Za-z0-9._~-]*) fail "$name: $file holds characters other than letters, digits and . _ ~ - (a line break or space inside it, perhaps); Temporal puts the password into its YAML configuration unescaped: make a new one, e.g. openssl rand -hex 32" ;;
    esac
    export "$name=$value"
    shift
done
[ $# -ge 2 ] || fail "usage: $me NAME=FILE... -- COMMAND [ARG...]"
shift
exec "$@"
