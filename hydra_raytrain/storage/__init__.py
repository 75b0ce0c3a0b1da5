"""Where a run's files live: the run dir's files (``rundir.py``, the output contract), its logs (``logfiles.py``), one
holder of a folder at a time (``locks.py``), and a URI storage whose transient errors are retried (``retry.py``)."""
