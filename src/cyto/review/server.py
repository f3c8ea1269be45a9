"""The review web page: a local Starlette app served by uvicorn, one server per reviewer.

What it serves, and nothing else: its own page and assets (shipped in ``cyto/review/static``, no
CDN), the blinded case list, the crops of the review folder by case id and grid position, a larger
context view read from the slide on demand, and this reviewer's marks. File paths never come from
the request, so nothing outside the review folder can be reached. Writes (marks, "done") need the
token the page was served with, a JSON body and, when the browser sends one, an ``Origin`` equal to
the server's own: a page from another origin can neither read the token nor send such a request
without a CORS preflight, which this server never grants. The ``Host`` header must name the address
the server listens on (no DNS rebinding), and the page may not be framed by another site.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import io
import os
import re
import secrets
from pathlib import Path

from cyto.errors import ConfigError
from cyto.localserver import LOCAL_HOSTS, SECURITY_HEADERS, bind, posture, run_server  # noqa: F401
from cyto.localserver import AccessKey as _AccessKey
from cyto.localserver import SecurityHeaders as _SecurityHeaders
from cyto.review.session import CROPS, DETAILS, Session
from cyto.review.store import MarkStore

STATIC = Path(__file__).parent / "static"
# letters of any script (Zoë, Łukasz, 李), digits, spaces, '.', '_', '-' and "'"
REVIEWER_RE = re.compile(r"^[^\W_][\w .'-]{0,63}$")
MAX_BODY = 64 * 1024  # a mark is a few dozen bytes


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def check_reviewer(name: str) -> str:
    """The reviewer's name as marks are kept under it: ``ann``, ``ANN`` and ``ann `` are one
    reviewer (spaces trimmed and collapsed, case folded, Unicode in one normal form)."""
    import unicodedata

    norm = " ".join(unicodedata.normalize("NFC", name or "").split()).casefold()
    if not REVIEWER_RE.match(norm):
        raise ConfigError(
            f"reviewer name {name!r}: use 1-64 letters, digits, spaces, '.', '_', '-' or "
            "apostrophes, starting with a letter or digit"
        )
    return norm


def make_app(
    session: Session,
    reviewer: str,
    token: str,
    hosts: tuple[str, ...] = LOCAL_HOSTS,
    access_key: str | None = None,
):
    """The Starlette app of one reviewer's review of ``session``; with ``access_key``, nothing is
    served to a browser that has not opened the address holding it."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    reviewer = check_reviewer(reviewer)
    store = MarkStore(session.root, session.session_id)
    order = session.order_for(reviewer)
    page = (STATIC / "index.html").read_text()
    page = page.replace("{{token}}", html.escape(token)).replace(
        "{{reviewer}}", html.escape(reviewer)
    )

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    def case_state(case: str) -> dict:
        cells = {
            str(pos): {"marked": True, "detail": detail}
            for (_, _, pos), (_, detail) in store.marks(reviewer, case).items()
        }
        return {
            "case": case,
            "n": session.n_cells(case),
            "cols": session.cols,
            "crop_px": int(session.key["cases"][case]["crop_px"]),  # the crops' size, px
            "marks": cells,
            "done": (reviewer, case) in store.done(reviewer),
        }

    async def index(request):
        return HTMLResponse(page)

    async def session_info(request):
        marks, done = store.marks(reviewer), store.done(reviewer)
        per_case = {}
        for _, c, _ in marks:
            per_case[c] = per_case.get(c, 0) + 1
        return JSONResponse(
            {
                "reviewer": reviewer,
                "details": list(DETAILS),
                "cols": session.cols,
                "cases": [
                    {
                        "case": c,
                        "n": session.n_cells(c),
                        "marked": per_case.get(c, 0),
                        "done": (reviewer, c) in done,
                    }
                    for c in order
                ],
            }
        )

    async def case_info(request):
        case = request.path_params["case"]
        if session.n_cells(case) is None:
            return error(404, f"no case {case}")
        return JSONResponse(case_state(case))

    root = session.root.resolve()

    async def crop(request):
        path = session.crop_path(request.path_params["case"], request.path_params["pos"])
        # a crop is a plain file of the review folder: a link (to a system file, say) is not
        if (
            path is None
            or path.is_symlink()
            or not path.is_file()
            or root not in path.resolve().parents
        ):
            return error(404, "no such cell")
        data = path.read_bytes()
        # the crop as built (its seal), checked as it is served: one swapped while the page is
        # open would be marked as the cell the key names
        name = f"{path.parent.name}/{path.name}"
        if session.crop_hashes is not None and session.crop_hashes.get(name) != _sha256(data):
            return error(
                409,
                f"{CROPS}/{name} changed since the review was built: build the review again "
                "into a new folder",
            )
        return Response(data, media_type="image/png")

    async def context(request):
        from starlette.concurrency import run_in_threadpool

        from cyto.errors import CytoError, InputPathError, SlideChangedError
        from cyto.review.session import context_image, context_slide

        case, pos = request.path_params["case"], request.path_params["pos"]
        if session.crop_path(case, pos) is None:
            return error(404, "no such cell")
        # the slide at its place checked against the key on every view, cached or not: a view
        # is kept under the identity of the slide it was read from, never served for another
        try:
            slide = await run_in_threadpool(context_slide, session, case)
            identity = session.key["cases"][case].get("slide_identity") or "unknown"
        except (InputPathError, SlideChangedError) as exc:
            return error(409, f"no context view: {exc}")
        except CytoError as exc:
            return error(404, f"the slide cannot be read for a context view: {exc}")
        tag = hashlib.sha256(str(identity).encode()).hexdigest()[:16]
        cached = session.root / "context" / case / f"{pos:03d}-{tag}.png"
        if not cached.is_file():
            try:
                img = await run_in_threadpool(context_image, session, case, pos, slide=slide)
            except CytoError as exc:
                return error(404, f"the slide cannot be read for a context view: {exc}")
            buf = io.BytesIO()
            img.save(buf, format="PNG")
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
            tmp.write_bytes(buf.getvalue())
            os.replace(tmp, cached)
        return FileResponse(cached, media_type="image/png")

    async def write_guard(request) -> tuple[dict | None, Response | None]:
        """The JSON body of a write from this reviewer's own page, or the refusal."""
        if not secrets.compare_digest(request.headers.get("x-cyto-token", ""), token):
            return None, error(403, "missing or wrong review token: reload the page")
        origin = request.headers.get("origin")
        if origin is not None and origin != f"{request.url.scheme}://{request.headers['host']}":
            return None, error(403, f"writes from another origin ({origin}) are refused")
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return None, error(415, "send JSON")
        try:
            body = await request.json()
        except (ValueError, RecursionError):  # RecursionError: JSON nested too deep to parse
            return None, error(400, "the body is not JSON (or is nested too deep)")
        if not isinstance(body, dict) or session.n_cells(str(body.get("case"))) is None:
            return None, error(400, "unknown case")
        return body, None

    async def mark(request):
        body, refused = await write_guard(request)
        if refused:
            return refused
        case, pos = str(body["case"]), body.get("position")
        if (
            not isinstance(pos, int)
            or isinstance(pos, bool)
            or session.crop_path(case, pos) is None
        ):
            return error(400, "unknown cell position")
        detail = body.get("detail") or ""
        if not isinstance(detail, str) or detail and detail not in DETAILS:
            return error(400, f"unknown label {detail!r}; one of {', '.join(DETAILS)}")
        if not isinstance(body.get("marked"), bool):  # "false" is a string, and true in Python
            return error(400, "marked must be true or false")
        store.mark(reviewer, case, pos, body["marked"], detail)
        return JSONResponse(case_state(case))

    async def done(request):
        body, refused = await write_guard(request)
        if refused:
            return refused
        if not isinstance(body.get("done"), bool):
            return error(400, "done must be true or false")
        store.set_done(reviewer, str(body["case"]), body["done"])
        return JSONResponse(case_state(str(body["case"])))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        store.close()

    app = Starlette(
        routes=[
            Route("/", index),
            Route("/api/session", session_info),
            Route("/api/cases/{case}", case_info),
            Route("/api/mark", mark, methods=["POST"]),
            Route("/api/done", done, methods=["POST"]),
            Route("/crops/{case}/{pos:int}.png", crop),
            Route("/context/{case}/{pos:int}.png", context),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        middleware=[
            Middleware(TrustedHostMiddleware, allowed_hosts=list(hosts)),
            Middleware(_SecurityHeaders),
            *([Middleware(_AccessKey, key=access_key)] if access_key else []),
        ],
        lifespan=lifespan,
        max_body_size=MAX_BODY,
    )
    return app


def serve(session: Session, reviewer: str, host: str = "127.0.0.1", port: int = 8765, echo=print):
    """Serve the review page until Ctrl-C; prints the address first."""

    from cyto.locks import OutputLock

    reviewer = check_reviewer(reviewer)
    # one page per reviewer and review: two pages of one reviewer each kept its own view of the
    # marks, and the last write won without a word (other reviewers' pages are theirs)
    lock = OutputLock(
        session.root / f".reviewer-{reviewer}",
        f"cyto review page of reviewer {reviewer!r}",
        "use the page already open, or stop it (Ctrl-C) before opening another",
    )
    with lock:
        _serve(session, reviewer, host, port, echo)


def _serve(session: Session, reviewer: str, host: str, port: int, echo) -> None:
    sock = bind(host, port)
    port = sock.getsockname()[1]
    # beyond this computer the Host check cannot stand guard: a secret in the address does
    hosts, access_key, shown = posture(host)
    token = secrets.token_urlsafe(24)
    app = make_app(session, reviewer, token, hosts=hosts, access_key=access_key)
    if access_key:
        echo(
            f"warning: listening on {host}, beyond this computer: the page opens only with the "
            "access key in the address below (printed once; give it only to the reviewer)"
        )
    n = sum(c["n"] for c in session.cases)
    echo(
        f"review of {len(session.cases)} case(s), {n} cells, as {reviewer!r}; marks go to "
        f"{session.root / 'marks.sqlite'}"
    )
    address = f"http://{shown}:{port}/" + (f"?key={access_key}" if access_key else "")
    echo(f"open {address}  (Ctrl-C stops; marks are already saved)")
    run_server(app, sock)
