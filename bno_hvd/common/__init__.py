"""COMMON: what every wing may use. Imports nothing of bno_hvd outside this wing.

- :mod:`.errors` - :class:`UsageError` (one line, exit 2), :class:`TrainingError`, the warning channel
- :mod:`.atomic` - durable writes (a file is whole or untouched)
- :mod:`.parsing` - what a user types or points bno-hvd at: ranges, lists, JSON files, per-rank schedules
- :mod:`.arguments` - what a caller passes the library's public API: checks with one-line fix-its
"""
