"""A tracker that fails on purpose, imported inside Ray workers (the repo root is on their path)."""


class Broken:
    """Raises in ``start`` or in ``log_metrics`` (``fail_in``), as a tracker whose server is down would."""

    def __init__(self, fail_in: str = "start"):
        self.fail_in = fail_in

    def start(self, config, run_dir, run_id):
        if self.fail_in == "start":
            raise RuntimeError("tracker server unavailable")
        return "broken"

    def log_metrics(self, metrics, step):
        raise RuntimeError("tracker lost its connection")

    def finish(self, status):
        pass
