"""The developers' harnesses: the mutation check and its mutants, the rule map, the fuzz
corpus's generator, the recorder of workflow histories and the screenshots. Not installed:
run them from a checkout, `python -m dev.<module>`."""
