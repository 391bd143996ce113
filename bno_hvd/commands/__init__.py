"""Subcommands of the bno-hvd CLI, one module each."""
