"""The `tidemark` command.

It holds its parser and entry point (main.py), one module per group of subcommands, and the
checks of what a person typed (inputs.py)."""
