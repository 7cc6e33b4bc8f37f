"""Tidemark's tooling: the `tidemark` command and what it drives (the dev stack, the demo, chaos
runs, the starters of workflows), the agent client, and the probe conformance kit for pytest.

The layering contracts (pyproject.toml, checked by `lint-imports`) let this package import every
other part; nothing in the core (the rest of ``tidemark``), the workers' packages or the probes
imports it.
"""
