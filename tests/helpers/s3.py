"""An S3-compatible server (moto) on loopback: the tests' and the benchmarks' stand-in for S3."""

import os
import socket
import subprocess
import sys
import time


def start_moto_server(port: int) -> subprocess.Popen:
    """``moto_server`` on 127.0.0.1:``port``, returned once it listens (terminate it when done)."""
    server = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return server
        except OSError:
            if server.poll() is not None:
                raise RuntimeError(f"moto_server exited with {server.returncode}") from None
            time.sleep(0.1)
    server.terminate()
    raise RuntimeError(f"moto_server did not listen on {port} within 30 s")


def s3_environment(endpoint: str) -> dict[str, str]:
    """The variables that point boto3, pyarrow and Ray's processes at ``endpoint``, with dummy credentials."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
