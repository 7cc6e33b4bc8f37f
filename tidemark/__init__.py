"""Tidemark core: the two-phase journal, plans, keys, settings and the step algorithm.

Nothing in the core talks to Temporal (settings.py reads only the SDK's environment
configuration, temporalio.envconfig, and codec.py encrypts the payloads a client or worker
sends); workflows/, activities/ and worker.py build on it, and the
tooling in tools/ drives them all.
"""
