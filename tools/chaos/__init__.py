"""`tidemark chaos`: interrupted runs of a plan, judged from the staging servers' logs.

It holds the runs (run.py), the kills it chooses, the faults in time and the stepped clock, the
judge and its report."""
