"""The shell every command shares: its options, refusals, exit codes and end (``program.py``), and the command
line's keys checked against the schema before Hydra composes (``overrides.py``)."""
