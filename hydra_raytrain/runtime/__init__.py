"""What a command runs on: the one door to Ray (``reach.py``), the host's facts (``host.py``), the private names of
the libraries we wrap (``internals.py``), and package exports loaded on first use (``lazy.py``)."""
