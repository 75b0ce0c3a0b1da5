"""What passes between a run's processes: a preemption notice to the workers (``notice.py``), and what a run and its
rank 0 hand back (``outcome.py``)."""
