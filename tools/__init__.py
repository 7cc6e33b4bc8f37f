"""Tidemark's tooling, by audience.

It holds the `tidemark` command (cli), what the operator's controls do (operate), the laptop's
stack (stack), and the harnesses that ship with the product because a user runs them against
their own stack (chaos, fleet, the conformance kit). The developers' harnesses live in ``dev``,
which is not installed.

The layering contracts (pyproject.toml, checked by `lint-imports`) let this package import every
other part; nothing in the core (the rest of ``tidemark``), the workers' packages or the probes
imports it.
"""
