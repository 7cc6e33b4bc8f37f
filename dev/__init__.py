"""The developers' harnesses, which are not installed.

They are the mutation check and its mutants, the rule map, the fuzz corpus's generator, the
recorder of workflow histories and the screenshots. Run them from a checkout:
`python -m dev.<module>`."""
