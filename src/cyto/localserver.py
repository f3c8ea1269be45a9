"""What cyto's local web pages share (``cyto review serve``, ``cyto view``): the posture of a
server that runs on a user's computer and shows patient material.

- It listens on loopback by default, and the ``Host`` header must name the address it listens on
  (no DNS rebinding: :data:`LOCAL_HOSTS`, Starlette's ``TrustedHostMiddleware``).
- Beyond this computer, where the Host check cannot tell who is asking, every request needs an
  access key printed once in the address (:class:`AccessKey`, then an HTTP-only same-site cookie).
- Every response carries :data:`SECURITY_HEADERS`: only the server's own scripts, images and
  styles, no framing by another site, no referrer, nothing kept by the browser unless the
  response says otherwise (:class:`SecurityHeaders`).
- :func:`bind` gives a listening socket or a one-line error naming the option to change.

Starlette and uvicorn are imported by the callers, inside their functions.
"""

from __future__ import annotations

import contextlib
import secrets
import signal
import socket
import threading

from cyto.errors import ConfigError

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Resource-Policy": "same-origin",
}


class SecurityHeaders:
    """Pure ASGI middleware adding :data:`SECURITY_HEADERS` (with ``overrides``: those of a
    page that needs more) to every response; a header the response sets itself, a tile's
    ``Cache-Control`` say, is kept."""

    def __init__(self, app, overrides: dict[str, str] | None = None) -> None:
        self.app = app
        self.headers = {**SECURITY_HEADERS, **(overrides or {})}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", [])}
                extra = [
                    (k.lower().encode(), v.encode())
                    for k, v in self.headers.items()
                    if k.lower().encode() not in have
                ]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)


class AccessKey:
    """Pure ASGI middleware: every request needs the access key, given once in the address
    (``?key=...``, then kept in a same-site, HTTP-only cookie named ``cookie``). ``what`` names
    the page in the refusal ("this review")."""

    def __init__(self, app, key: str, cookie: str = "cyto_review_key", what: str = "this review"):
        self.app, self.key, self.cookie, self.what = app, key, cookie, what

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        from http.cookies import SimpleCookie
        from urllib.parse import parse_qs

        headers = dict(scope.get("headers") or [])
        jar = SimpleCookie()
        with contextlib.suppress(Exception):
            jar.load(headers.get(b"cookie", b"").decode("latin-1"))
        cookie = jar[self.cookie].value if self.cookie in jar else ""
        given = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("key", [""])[0]
        if secrets.compare_digest(cookie, self.key):
            return await self.app(scope, receive, send)
        if not secrets.compare_digest(given, self.key):
            from starlette.responses import PlainTextResponse

            refused = PlainTextResponse(
                f"{self.what} needs its access key: open the address printed when it started",
                status_code=401,
            )
            return await refused(scope, receive, send)

        async def with_cookie(message):
            if message["type"] == "http.response.start":
                value = f"{self.cookie}={self.key}; Path=/; HttpOnly; SameSite=Strict"
                message = {
                    **message,
                    "headers": [*message.get("headers", []), (b"set-cookie", value.encode())],
                }
            await send(message)

        await self.app(scope, receive, with_cookie)


def posture(host: str) -> tuple[tuple[str, ...], str | None, str]:
    """(the Host names a request may give, the access key or None, the host as an address shows
    it) for a server listening on ``host``: on loopback, the loopback names and no key; on a
    chosen interface any name, and a fresh key, since the Host check cannot stand guard there."""
    shown = f"[{host}]" if ":" in host else host
    if host in LOCAL_HOSTS:
        return tuple({*LOCAL_HOSTS, host, shown}), None, shown
    return ("*",), secrets.token_urlsafe(18), shown


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, or a one-line error naming the port."""
    import errno

    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be between 0 (any free one) and 65535, got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say so (proto 0 does not),
    # and without it every response after a connection's first waited 40 ms for a delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if isinstance(exc, socket.gaierror) or exc.errno in (errno.EADDRNOTAVAIL, errno.EINVAL):
            raise ConfigError(
                f"cannot listen on {host}: not an address of this computer "
                f"({exc.strerror or exc}); pass another --host (127.0.0.1 keeps it here)"
            ) from exc
        raise ConfigError(
            f"cannot listen on {host}:{port} ({exc.strerror}); "
            "pass another --port (0: any free one)"
        ) from exc
    sock.listen(64)
    sock.set_inheritable(True)
    return sock


def run_server(app, sock: socket.socket) -> None:
    """Serve ``app`` on ``sock`` with uvicorn until a stop: Ctrl-C, SIGTERM, or the SIGHUP of a
    closed terminal, which uvicorn does not take itself: it reached cyto's handler inside the
    event loop and printed a traceback before "stopped (SIGHUP)" (hostile round 59, 1). A
    SIGHUP is the server's stop as the others are, then raised again once it has shut down, so
    the command ends as any command a closed terminal stops (exit 129)."""
    import uvicorn

    hup = getattr(signal, "SIGHUP", None)

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            if hup is None or threading.current_thread() is not threading.main_thread():
                with super().capture_signals():
                    yield
                return
            before = signal.signal(hup, self.handle_exit)
            try:
                with super().capture_signals():
                    yield
            finally:
                signal.signal(hup, before)
            if hup in self._captured_signals:
                signal.raise_signal(hup)

    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    _Server(config).run(sockets=[sock])
