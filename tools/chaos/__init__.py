"""`tidemark chaos`: interrupted runs of a plan judged from the staging servers' logs (run.py),
the kills it chooses, the faults in time and the stepped clock, the judge and its report."""
