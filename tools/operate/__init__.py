"""What an operator's controls do, shared by the command, the decider and the agent client.

The controls are: starting runs, the layered kill, the series' schedules, the worklist's rows
and the inbox."""
