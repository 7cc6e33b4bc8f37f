"""Tidemark core: the two-phase journal, plans, keys and the step algorithm.

Nothing in this package imports Temporal; workflows/ and activities/ build on it.
"""
