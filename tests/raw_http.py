"""Requests the local servers' tests send byte for byte (no client-side normalization of the
path, as a browser or urllib would do), to check what the servers refuse."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit


def raw_get(url: str, path: str) -> tuple[int, bytes]:
    """(status, whole response) of a GET with ``path`` sent exactly as written."""
    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {u.netloc}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1]), data
