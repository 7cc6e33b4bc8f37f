"""The laptop's stack: `tidemark dev` (devstack.py) and `tidemark demo` (demo.py)."""
