"""Subcommands of the bno-hvd CLI, one module each: they parse flags and call the library."""
