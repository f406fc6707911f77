"""A real S3-compatible server on loopback (moto's server, in its own process), and a proxy in
front of it that can be made slow or failing.

``python -m tests.support.s3_server PORT`` serves S3 on 127.0.0.1:PORT and reads commands on
stdin: ``fill BUCKET PREFIX COUNT`` writes COUNT small text objects straight into the
server's backend (10,000 keys in a second, not the minutes of 10,000 PUTs), then answers
``ok``.
"""

from __future__ import annotations

import http.client
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from tests.support.loopback import free_port, serve, stop_group

ROOT = Path(__file__).resolve().parents[2]
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing-key", "AWS_SECRET_ACCESS_KEY": "testing-secret"}


@dataclass
class S3Server:
    """The running server: its URL, a boto3 client on it, and the fill command."""

    url: str
    process: subprocess.Popen[bytes]

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )

    def fill(self, bucket: str, prefix: str, count: int) -> None:
        """Write ``count`` objects ``PREFIX00000.txt``… (bucket created if needed)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"fill {bucket} {prefix} {count}\n".encode())
        self.process.stdin.flush()
        answer = self.process.stdout.readline().decode().strip()
        assert answer == "ok", answer


@contextmanager
def s3_server() -> Iterator[S3Server]:
    """Start the server in its own process group; stop it (and its threads) after the block."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.s3_server", str(port)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        ready = process.stdout.readline().decode().strip()
        assert ready == "ready", f"the S3 server did not start ({ready!r})"
        yield S3Server(f"http://127.0.0.1:{port}", process)
    finally:
        stop_group(process)


@dataclass
class Faults:
    """What the proxy does to each request: pass it, delay it, or answer 503."""

    delay_s: float = 0.0
    fail_next: int = 0  # answer 503 to this many requests, then pass them again
    fail_all: bool = False
    fail_paths: str | None = None  # answer every request whose path holds this, with status
    status: int = 503
    requests: list[str] = field(default_factory=list)


@contextmanager
def faulty_proxy(upstream: str, faults: Faults) -> Iterator[str]:
    """An HTTP proxy on loopback in front of ``upstream`` that applies ``faults``."""
    host, _, port = upstream.removeprefix("http://").partition(":")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            with lock:
                faults.requests.append(f"{self.command} {self.path}")
                fail = faults.fail_all or faults.fail_next > 0
                fail = fail or bool(faults.fail_paths and faults.fail_paths in self.path)
                if faults.fail_next > 0:
                    faults.fail_next -= 1
            if faults.delay_s:
                time.sleep(faults.delay_s)
            if fail:
                code = "AccessDenied" if faults.status == 403 else "ServiceUnavailable"
                message = f"<Error><Code>{code}</Code><Message>no</Message></Error>".encode()
                self.send_response(faults.status)
                self.send_header("Content-Length", str(len(message)))
                self.end_headers()
                self.wfile.write(message)
                return
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
            conn.request(self.command, self.path, body=body, headers=headers)
            reply = conn.getresponse()
            data = reply.read()
            self.send_response(reply.status)
            for name, value in reply.getheaders():
                if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            conn.close()

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

    with serve(Handler) as url:
        yield url


def _main(port: int) -> None:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    print("ready", flush=True)
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    for line in sys.stdin:
        command, *args = line.split()
        if command == "fill":
            bucket, prefix, count = args[0], args[1], int(args[2])
            if bucket not in backend.buckets:
                backend.create_bucket(bucket, "us-east-1")
            for i in range(count):
                backend.put_object(bucket, f"{prefix}{i:05d}.txt", f"object {i}\n".encode())
            print("ok", flush=True)
    server.stop()


if __name__ == "__main__":
    _main(int(sys.argv[1]))
