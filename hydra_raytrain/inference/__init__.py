"""The wing for finished runs: read one (``finished``), score it (``scoring``, ``evaluate``), export its model,
predict a file's rows with it on Ray Data (``predict``), serve it over HTTP with Ray Serve (``serve``).

Nothing is imported here: each command and each model actor loads only what it uses.
"""
