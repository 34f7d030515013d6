"""The `simplan` command: thin subcommands over library code (see scripts/cli.py)."""
