#!/bin/sh
# One-shot, once the Temporal server is up: the namespace Tidemark runs in (created if missing,
# the plain server image creates none) and the search attributes RunPlan upserts, which
# `temporal workflow list --query 'TidemarkState = "needs_decision"'` needs. Idempotent: it runs
# on every `docker compose up`.
#
# Needs the `temporal` CLI and TEMPORAL_ADDRESS (host:port). TEMPORAL_NAMESPACE: default
# "default"; TIDEMARK_NAMESPACE_RETENTION: how long closed workflows are kept (default 30d).
# The CLI's own TEMPORAL_TLS_* variables apply when the frontend speaks TLS.
set -eu

namespace=${TEMPORAL_NAMESPACE:-default}
retention=${TIDEMARK_NAMESPACE_RETENTION:-30d}
tries=${TIDEMARK_SETUP_TRIES:-60}
pause=${TIDEMARK_SETUP_PAUSE_S:-2}

retry() {  # WHAT COMMAND [ARG...]: COMMAND until it succeeds, at most $tries times
    what=$1
    shift
    n=1
    until "$@"; do
        [ "$n" -lt "$tries" ] || { echo "temporal-setup: gave up: $what" >&2; exit 1; }
        n=$((n + 1))
        sleep "$pause"
    done
}

serving() {
    temporal operator cluster health 2>/dev/null | grep -q SERVING
}

namespace_ready() {
    temporal operator namespace describe --namespace "$namespace" >/dev/null 2>&1 ||
        temporal operator namespace create --namespace "$namespace" --retention "$retention"
}

# A namespace just created reaches every service's cache a few seconds later; until then the
# create is refused, and so it is retried.
attributes_ready() {
    temporal operator search-attribute create --namespace "$namespace" \
        --name TidemarkTaskId --type Keyword \
        --name TidemarkState --type Keyword \
        --name TidemarkNeeds --type Keyword
}

retry "the Temporal server at ${TEMPORAL_ADDRESS:?set TEMPORAL_ADDRESS} is not serving" serving
retry "namespace $namespace could not be created" namespace_ready
retry "search attributes could not be created in namespace $namespace" attributes_ready
echo "temporal-setup: namespace $namespace and search attributes TidemarkTaskId, TidemarkState, TidemarkNeeds ready"
