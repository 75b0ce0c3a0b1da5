"""An S3-compatible server (moto) on loopback: the tests' and the benchmarks' stand-in for S3."""

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable


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


class CuttableProxy:
    """A TCP proxy on 127.0.0.1 in front of ``target_port``: the network to the server, which ``cut()`` takes away
    (new connections refused, open ones closed) and ``restore()`` brings back on the same port, the server's data
    intact."""

    def __init__(self, target_port: int, port: int):
        self.target_port, self.port = target_port, port
        self.lock = threading.Lock()
        self.connections: list[socket.socket] = []
        self.listener: socket.socket | None = None
        self.refusal: bytes | None = None  # throttle(): the answer to every request
        self.refused = 0  # the requests answered with it since throttle()
        self.restore()

    def restore(self) -> None:
        """The network back (after ``cut`` or ``throttle``): every connection forwarded to the server."""
        self.cut()
        self.refusal = None
        self._listen()

    def _listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def throttle(self, status: str = "503 Slow Down", code: str = "SlowDown") -> None:
        """From now on every request is answered ``status`` with S3's error ``code`` (as S3 throttles), until
        ``restore()``."""
        self.cut()
        self.refused = 0
        self.refusal = (
            f"HTTP/1.1 {status}\r\nContent-Type: application/xml\r\nConnection: close\r\nContent-Length: "
            f"{len(_error_xml(code))}\r\n\r\n{_error_xml(code)}"
        ).encode()
        self._listen()

    def _refuse(self, client: socket.socket, answer: bytes) -> None:
        _refuse(client, answer, self._count_refusal)

    def _count_refusal(self) -> None:
        with self.lock:
            self.refused += 1

    def refused_once_seen(self, timeout: float = 10) -> int:
        """``refused`` once at least one refusal is counted (its thread may count a moment after the client has
        read the answer), ``timeout`` seconds at most."""
        deadline = time.monotonic() + timeout
        while self.refused == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.refused

    def cut(self) -> None:
        with self.lock:
            listener, self.listener = self.listener, None
            connections, self.connections = self.connections, []
        if listener is not None:
            _close(listener)  # shut down first: that wakes the thread blocked in accept(), freeing the port
        for connection in connections:
            _close(connection)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # cut
                return
            if self.refusal is not None:
                threading.Thread(target=self._refuse, args=(client, self.refusal), daemon=True).start()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                _close(client)
                continue
            with self.lock:
                if self.listener is not listener:  # cut while connecting
                    _close(client)
                    _close(upstream)
                    return
                self.connections += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        _close(source)
        _close(sink)


def _close(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    connection.close()


def _error_xml(code: str) -> str:
    return f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{code}</Message></Error>'


def _refuse(client: socket.socket, answer: bytes, answered: Callable[[], None]) -> None:
    """Read one request (its head, and its body unless the client waits for "100 Continue"), answer it (and call
    ``answered`` at once: the client may keep the connection open a while), close: a body left unread would make the
    kernel reset the connection, which the client reports instead of the answer."""
    try:
        client.settimeout(5)
        head = b""
        while b"\r\n\r\n" not in head:
            data = client.recv(65536)
            if not data:
                return
            head += data
        head, _, body = head.partition(b"\r\n\r\n")
        fields = dict(line.split(b":", 1) for line in head.lower().split(b"\r\n")[1:] if b":" in line)
        length = 0 if b"100-continue" in fields.get(b"expect", b"") else int(fields.get(b"content-length", b"0"))
        while len(body) < length:
            data = client.recv(65536)
            if not data:
                break
            body += data
        client.sendall(answer)
        answered()
        client.shutdown(socket.SHUT_WR)
        while client.recv(65536):  # whatever the client still sends, until it closes
            pass
    except OSError:
        pass
    finally:
        _close(client)
