"""Trackers in tests: one that fails on purpose (imported inside Ray workers: the repo root is on their path),
and a reader of TensorBoard's event files."""

import struct

from tensorboardX.proto import event_pb2


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


def read_scalars(folder):
    """TensorBoard's record format: length, crc, an Event protobuf, crc."""
    scalars = {}
    for path in folder.glob("events.out.tfevents.*"):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars
