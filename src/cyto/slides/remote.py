"""Slides by URL: ``s3://``, ``gs://``, ``http(s)://``, read in place by byte range.

A :class:`SlideURL` names a remote slide wherever the pipeline holds a slide path: it prints
without its user info and query string (which may hold credentials or a signature), pickles to
the tile workers with what opens it (the full URL, the ``--storage-option`` values), and answers
the few questions the pipeline asks of a path (``name``, ``stem``, ``absolute()``).
:func:`slide_ref` is the one parser: a URL becomes a :class:`SlideURL`, anything else a
:class:`~pathlib.Path`.

:class:`RemoteObject` reads one object by byte range through fsspec's file systems (s3fs for
S3 and S3-compatible servers, gcsfs for Google Cloud Storage, its HTTP file system over aiohttp
for ``http(s)://``): the reasons are the credential chains they already implement (the AWS
environment variables and profiles, Google's default credentials) and one interface over all of
them. Every range is pinned to the version seen when the slide was opened (``If-Match`` on the
ETag over HTTP and S3, the generation on Google Cloud Storage), so an object replaced while it
is read stops that slide (:class:`SlideChangedError`) instead of mixing two versions. Ranges
are held in a bounded block cache; a dropped connection, a timeout or a 5xx answer is retried
with backoff and said once; 403 and 404 are one line each.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from cyto.errors import (
    ConfigError,
    CytoError,
    InputPathError,
    MissingDependencyError,
    NoRangesError,
    RemoteAccessError,
    SlideChangedError,
    warn_caller,
)
from cyto.flags import passing

#: URL schemes read in place, and the fsspec file system each needs
SCHEMES = {"http": "aiohttp", "https": "aiohttp", "s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs"}
#: DICOMweb: the series of one slide, read by plain HTTP (:mod:`cyto.slides.dicomweb`)
DICOMWEB_SCHEMES = ("dicomweb+http", "dicomweb+https")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
#: a URL's scheme with one slash after it (``s3:/bucket/key``): a URL mistyped
_ONE_SLASH = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/(?!/)")
#: the environment variable whose value is sent as a bearer token to http(s) servers
TOKEN_ENV = "CYTO_BEARER_TOKEN"
#: seconds a remote server may stay silent (connect or read) before the request is given up
TIMEOUT_ENV = "CYTO_REMOTE_TIMEOUT"
DEFAULT_TIMEOUT = 30.0
TRIES = 4  # one request and three retries, 0.25 s, 0.5 s and 1 s apart
#: a gs:// request (which gcsfs retries itself, unseen) said to take long after this many s
GCSFS_SAY_AFTER_S = 5.0
BLOCK = 256 << 10  # bytes fetched per block: a few tiles of a JPEG-tiled slide
CACHE_BYTES = 64 << 20  # the block cache of one open slide (per process)
#: the blocks shared by the processes that read one slide (the plan and the tile workers),
#: on disk in cyto's cache under the object's identity, at most this many bytes in all
SHARED_BYTES_ENV = "CYTO_REMOTE_BLOCKS_MB"
SHARED_BYTES = 256 << 20
#: the --download copies of every slide (``remote/`` in cyto's cache), at most this many bytes
#: in all: the least recently used go first
DOWNLOAD_BYTES_ENV = "CYTO_DOWNLOAD_MB"
DOWNLOAD_BYTES = 20 << 30

log = logging.getLogger("cyto.remote")
# the stores' libraries log what they retry and give up on (gcsfs: each failure with its
# traceback, six a request) where no logging is set up: cyto says each request's outcome in
# one line. A program that sets up logging still gets their records (they propagate).
_QUIET = logging.NullHandler()
for _name in ("gcsfs", "s3fs", "fsspec", "aiobotocore", "botocore"):
    logging.getLogger(_name).addHandler(_QUIET)


def is_url(text: object) -> bool:
    """Whether ``text`` is a URL (``scheme://...``), which :func:`slide_ref` reads as one."""
    return isinstance(text, SlideURL) or bool(_URL.match(str(text)))


def slide_name(slide: object) -> str:
    """A slide's file name as every line names it: a URL's last part decoded (``é 2.tif`` for
    ``.../%C3%A9%202.tif``, as its output folder and progress lines name it), a path's name. A
    run's summary line printed the URL's encoded form (hostile round 72, 5)."""
    if is_url(slide):
        return unquote(urlsplit(str(slide)).path.rstrip("/").rpartition("/")[2])
    from pathlib import Path

    return Path(str(slide)).name


def redact(text: str) -> str:
    """Every URL in ``text`` without its user info and query string: what may be printed."""

    def one(m: re.Match) -> str:
        parts = urlsplit(m.group(0))
        host = parts.netloc.rpartition("@")[2]
        return f"{parts.scheme}://{host}{parts.path}"

    return re.sub(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+", one, text)


def parse_options(pairs: list[str] | None) -> dict:
    """``--storage-option KEY=VALUE`` pairs as fsspec keyword arguments; a value that reads as
    JSON (``true``, ``3``, ``{"region_name": "x"}``) is taken as such, else as text."""
    out: dict = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--storage-option {pair.split('=')[0]!r}: give KEY=VALUE")
        try:
            out[key.strip()] = json.loads(value)
        except ValueError as exc:
            if value.lstrip()[:1] in ("{", "["):  # meant as JSON: its error, not its text
                raise ConfigError(
                    f"--storage-option {key.strip()}: its value does not read as JSON "
                    f"({exc.msg} at character {exc.pos}); write it as JSON, quoted for the "
                    """shell: 'client_kwargs={"region_name": "eu-west-1"}'"""
                ) from None
            out[key.strip()] = value
    refuse_unknown_options(out)  # before any work: a typo is said once, not per slide
    return out


class SlideURL:
    """A remote slide (see the module docstring). ``options``: fsspec storage options (never
    printed); ``download``: read through a local copy in cyto's cache (``--download``)."""

    __slots__ = ("url", "options", "download", "etag", "_display")

    def __init__(
        self,
        url: str,
        options: dict | None = None,
        download: bool = False,
        etag: str | None = None,
    ) -> None:
        """``etag``: the version a run pinned (:meth:`pinned`): an object found with another
        is a :class:`SlideChangedError`."""
        scheme = _URL.match(url).group(1).lower() if _URL.match(url) else ""
        if scheme not in SCHEMES and scheme not in DICOMWEB_SCHEMES:
            raise InputPathError(
                f"{redact(url)}: cyto reads slides from s3://, gs://, http://, https:// and "
                f"dicomweb+http(s):// URLs, not {scheme}://"
            )
        parts = urlsplit(url)
        if not parts.netloc.rpartition("@")[2]:
            raise InputPathError(f"{redact(url)}: a URL without a host (or bucket)")
        timeout()  # a bad CYTO_REMOTE_TIMEOUT: one line as the URL is read, before any work
        # (it was said once per slide, after the model had loaded: hostile round 45, 12)
        self.url = url
        self.options = dict(options or {})
        self.download = download
        self.etag = etag
        self._display = redact(url)

    # what the pipeline asks of a slide path
    def __str__(self) -> str:
        return self._display

    def __repr__(self) -> str:
        return f"SlideURL({self._display!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, SlideURL)
            and other._display == self._display
            and other.etag == self.etag
        )

    def __hash__(self) -> int:
        return hash(("SlideURL", self._display, self.etag))

    def __lt__(self, other: object) -> bool:
        return str(self) < str(other)

    def __getstate__(self):
        return (self.url, self.options, self.download, self.etag)

    def __setstate__(self, state) -> None:
        self.url, self.options, self.download, self.etag = state
        self._display = redact(self.url)

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme.lower()

    @property
    def name(self) -> str:
        return slide_name(self.url)

    @property
    def dicomweb(self) -> bool:
        """Whether this names a DICOMweb series (``dicomweb+https://.../series/UID``)."""
        return self.scheme in DICOMWEB_SCHEMES

    @property
    def suffix(self) -> str:
        if self.dicomweb:
            return ""  # the name is the Series Instance UID, whose dots are no suffix
        name = self.name
        return name[name.rfind(".") :] if "." in name.lstrip(".") else ""

    @property
    def stem(self) -> str:
        return self.name[: len(self.name) - len(self.suffix)] if self.suffix else self.name

    def absolute(self) -> SlideURL:
        return self

    resolve = absolute

    def is_absolute(self) -> bool:
        return True

    def exists(self) -> bool:
        """True: whether the object is there is said, in one line, when it is opened."""
        return True

    def is_dir(self) -> bool:
        if self.dicomweb:
            return False  # a DICOMweb URL names one series: one slide
        return self.url.split("?", 1)[0].endswith("/")

    def is_file(self) -> bool:
        return not self.is_dir()

    def pinned(self, etag: str | None) -> SlideURL:
        """This slide, to be read at version ``etag`` only (what one run reads)."""
        return SlideURL(self.url, self.options, self.download, etag)


def slide_ref(
    text: object, options: dict | None = None, download: bool = False
) -> SlideURL | os.PathLike:
    """The one reading of a slide argument: a URL as a :class:`SlideURL` (with the storage
    options and ``--download``), anything else as a :class:`~pathlib.Path`."""
    from pathlib import Path

    if isinstance(text, SlideURL):
        if options is None and not download:
            return text
        opts = {**text.options, **(options or {})}
        return SlideURL(text.url, opts, download or text.download, text.etag)
    from cyto.envvars import user_path

    if isinstance(text, os.PathLike):
        return user_path(text)
    if _URL.match(str(text)):
        return SlideURL(str(text), options, download)
    one = _ONE_SLASH.match(str(text))
    if one and one.group(1).lower() in (*SCHEMES, *DICOMWEB_SCHEMES) and not Path(text).exists():
        # read as a local path, it was "no such file" (hostile round 30, 15)
        raise InputPathError(
            f"{redact(str(text))}: no such file, and a URL takes two slashes after "
            f"{one.group(1)}: ({one.group(1)}://...)"
        )
    return user_path(str(text))


def timeout() -> float:
    """``CYTO_REMOTE_TIMEOUT``: seconds above 0 (a negative one "timed out" every request at
    once, blamed on the server: hostile round 41, 6), a day at most (1e10 s overflowed the
    clock of the first request in a traceback)."""
    from cyto.envvars import env_number

    return env_number(TIMEOUT_ENV, DEFAULT_TIMEOUT, "seconds", "30", positive=True, most=86400)


def _before_gcsfs() -> None:
    """What gcsfs reads when it is imported: an emulator (fake-gcs-server, named by
    ``STORAGE_EMULATOR_HOST``) speaks the JSON API only, and gcsfs's zonal-bucket probe over
    gRPC would stall each bucket's first call (a minute, or for good) before falling back."""
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


#: the storage options fsspec's base file system takes of every store
_COMMON_OPTIONS = {"skip_instance_cache", "use_listings_cache", "listings_expiry_time", "max_paths"}


@functools.cache
def _taken_by(scheme: str) -> frozenset[str] | None:
    """The storage options the file system of ``scheme`` takes by name: its class's
    parameters (and its bases'), and for HTTP what aiohttp takes of a request, where fsspec
    hands them; None where its library is not installed."""
    import importlib.util
    import inspect

    if (
        importlib.util.find_spec("fsspec") is None
        or importlib.util.find_spec(SCHEMES[scheme]) is None
    ):
        return None
    _before_gcsfs()  # the class is imported to read its parameters
    import fsspec

    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    calls = [k.__dict__["__init__"] for k in fsspec.get_filesystem_class(scheme).__mro__
             if "__init__" in k.__dict__]  # fmt: skip
    if scheme in ("http", "https"):
        import aiohttp

        calls.append(aiohttp.ClientSession._request)
    names = set(_COMMON_OPTIONS)
    for call in calls:
        try:
            names |= {
                p.name for p in inspect.signature(call).parameters.values() if p.kind in named
            }
        except (TypeError, ValueError):  # a builtin's __init__: no signature to read
            continue
    return frozenset(names - {"self", "method", "str_or_url"})


def options_for(scheme: str, options: dict) -> dict:
    """The ``--storage-option``s that the file system of ``scheme`` takes. One set is given for
    every URL of a run (its slides, its ``--out``), so an option another store takes (an S3
    ``endpoint_url`` beside an HTTP slide) is left out of this one's (it reached the HTTP file
    system and failed its slide "cannot read it (TypeError)": hostile round 30, 3); an option
    no store takes is refused (:func:`refuse_unknown_options`)."""
    if not options:  # no store's library is imported to read its parameters for nothing
        return {}
    mine = _taken_by(scheme)
    if mine is None:
        return dict(options)
    refuse_unknown_options(options, scheme)
    return {k: v for k, v in options.items() if k in mine}


#: the storage options that are mappings of settings: of the store's client, its config, HTTP's
#: headers
_MAPPINGS = ("client_kwargs", "config_kwargs", "headers")


def refuse_unknown_options(options: dict, scheme: str | None = None) -> None:
    """Refuse, in one line naming the nearest, a storage option that no installed store's file
    system takes (a misspelt ``endpont_url`` failed each slide "cannot read it (TypeError)",
    hostile round 30, 8); ``scheme``: the store it is read for, whose options are offered."""
    import difflib

    from cyto.flags import python_call

    if not options:
        return
    # the stores' libraries in order, each imported only where the ones before do not take a
    # key (gcsfs reads its settings when imported: not for an S3 endpoint)
    order = [scheme] if scheme in SCHEMES else []
    order += [s for s in ("s3", "http", "gs") if s not in order]
    for key, value in options.items():
        if key in _MAPPINGS and not isinstance(value, dict):
            # a setting of the store's client (client_kwargs, headers) given as no mapping:
            # s3fs failed deep inside, said "cannot write --out ...: cannot read it
            # (AttributeError)" (hostile round 72, 2); its value is never shown (a header's
            # may be a secret)
            given = f"storage_options[{key!r}]" if python_call() else f"--storage-option {key}"
            raise ConfigError(
                f"{given} takes a mapping (JSON: {key}={{...}}), got {type(value).__name__}"
            )
        if any(key in (_taken_by(s) or ()) for s in order):
            continue
        known = set().union(*(_taken_by(s) or () for s in order))
        if not known:
            return  # no store installed: said where a URL is read
        offered = sorted(_taken_by(scheme) or known) if scheme in SCHEMES else sorted(known)
        near = difflib.get_close_matches(key, offered, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        store = f"a {scheme}:// store" if scheme else "cyto's remote stores (S3, GCS, HTTP)"
        given = f"storage_options key {key!r}" if python_call() else f"--storage-option {key}"
        raise ConfigError(
            f"{given}: no option of {store}{hint}; fsspec's file systems take "
            "endpoint_url, key, secret, anon, client_kwargs (S3), token (GCS), headers (HTTP)"
        )


def has_authorization(headers: dict) -> bool:
    """Whether ``headers`` hold an Authorization header, in any case of its name: one given
    (``--storage-option headers=...``) or the bearer token's comes before a URL's user info,
    for an https:// slide and a DICOMweb series alike."""
    return any(str(k).lower() == "authorization" for k in headers)


def _filesystem(ref: SlideURL):
    """(fsspec file system, path in it, object version or None) of ``ref``."""
    import importlib.util

    scheme = ref.scheme
    need = SCHEMES[scheme]
    if importlib.util.find_spec("fsspec") is None or importlib.util.find_spec(need) is None:
        raise MissingDependencyError(
            f"fsspec and {need}", f"reading {scheme}:// slides", "pip install 'cyto[remote]'"
        )
    _before_gcsfs()
    import fsspec

    t = timeout()
    opts = options_for(scheme, ref.options)
    parts = urlsplit(ref.url)
    version = None
    if scheme in ("http", "https"):
        import aiohttp

        client = dict(opts.pop("client_kwargs", {}) or {})
        client.setdefault("timeout", aiohttp.ClientTimeout(total=None, connect=t, sock_read=t))
        headers = dict(opts.pop("headers", {}) or {})
        from cyto.envvars import env_text

        token = env_text(TOKEN_ENV)
        url = ref.url
        if token and not has_authorization(headers):
            headers["Authorization"] = f"Bearer {token}"
        if has_authorization(headers):  # it comes before the URL's user info, which aiohttp
            # refuses beside it ("cannot read it (ValueError)": hostile round 72, 1)
            url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        fs = fsspec.filesystem(
            scheme, client_kwargs=client, headers=headers, skip_instance_cache=True, **opts
        )
        return fs, url, None
    if scheme == "s3":
        config = dict(opts.pop("config_kwargs", {}) or {})
        config.setdefault("connect_timeout", t)
        config.setdefault("read_timeout", t)
        config.setdefault("retries", {"max_attempts": 1})  # retried here, said once
        opts["config_kwargs"] = config
        query = dict(p.partition("=")[::2] for p in parts.query.split("&") if p)
        version = query.get("versionId") or None
    if scheme in ("gs", "gcs"):  # gcsfs's requests wait for ever unless told
        import aiohttp

        opts.setdefault("requests_timeout", aiohttp.ClientTimeout(connect=t, sock_read=t))
    fs = fsspec.filesystem(scheme, skip_instance_cache=True, **opts)
    if scheme == "s3":  # s3fs retries a timeout five times itself, each under cyto's tries:
        fs.retries = 1  # a stalled endpoint took 20 min a slide; cyto's tries are said once
    return fs, f"{parts.netloc.rpartition('@')[2]}{unquote(parts.path)}", version


def _status(exc: BaseException) -> int | None:
    """The HTTP status an fsspec/aiohttp/botocore error carries, if any."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return status
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        meta = response.get("ResponseMetadata") or {}
        if isinstance(meta.get("HTTPStatusCode"), int):
            return meta["HTTPStatusCode"]
    for inner in (exc.__cause__, exc.__context__):
        if inner is not None and inner is not exc:
            found = _status(inner)
            if found is not None:
                return found
    return None


def _tls(exc: BaseException, ref) -> str | None:
    """What went wrong in a TLS handshake, in words, when that is what ``exc`` (or an error
    it came from) is: a certificate refused, or a server that speaks no TLS (an https:// URL
    of a plain HTTP server). None otherwise. Never a reason to try again."""
    names: set[str] = set()
    for _ in range(8):  # the error and those it came from (botocore's wraps ssl's)
        if exc is None:
            break
        names |= {c.__name__ for c in type(exc).__mro__}
        exc = exc.__cause__ or exc.__context__
    if names & {"SSLCertVerificationError", "ClientConnectorCertificateError"}:
        return (
            "its TLS certificate was not accepted (a private certificate authority is named "
            "by SSL_CERT_FILE)"
        )
    if names & {"SSLError", "ClientConnectorSSLError", "ClientSSLError"}:
        plain = str(ref).split("://", 1)[0].replace("https", "http")
        return (
            f"the TLS handshake failed: does the server speak HTTPS? (a plain HTTP server is "
            f"named {plain}://)"
        )
    return None


def _transient(exc: BaseException) -> str | None:
    """Why a failed request may succeed if tried again (a dropped connection, a timeout, a
    5xx), in words; None for an answer that will not change (403, 404, ...)."""
    import asyncio

    status = _status(exc)
    if status is not None:
        return f"the server answered {status}" if status >= 500 or status == 429 else None
    names = {c.__name__ for c in type(exc).__mro__}
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) or names & {
        "ServerTimeoutError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
    }:
        # the bound named where it was set: a tiny one failed as the server's fault (round 42)
        from cyto.envvars import env_text

        asked = env_text(TIMEOUT_ENV)
        return (
            f"the server did not answer {f'within {TIMEOUT_ENV}={asked} s' if asked else 'in time'}"
        )
    if isinstance(exc, ConnectionRefusedError) or names & {
        "ClientConnectorError",  # aiohttp: no connection made (refused, no route, no such host)
        "EndpointConnectionError",  # botocore: the same
        "NewConnectionError",
    }:
        return f"the server{_tried(exc)} could not be reached (no connection was made)"
    if isinstance(exc, ConnectionError) or names & {
        "ClientConnectionError",
        "ClientPayloadError",
        "ServerDisconnectedError",
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ResponseStreamingError",
        "IncompleteReadError",
    }:
        return "the connection was dropped"
    return None


def _chain(exc: BaseException | None):
    """``exc`` and the errors it was raised from or during, each once, depth first."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        stack += [e.__context__, e.__cause__]  # its cause first


def _no_bucket(exc: BaseException) -> bool:
    """Whether a 404 is of the bucket itself (S3's ``NoSuchBucket``; GCS's "bucket does not
    exist"), not of an object in it."""
    for e in _chain(exc):
        response = getattr(e, "response", None)
        code = (
            ((response or {}).get("Error") or {}).get("Code")
            if isinstance(response, dict)
            else None
        )
        if code == "NoSuchBucket" or "bucket does not exist" in str(e).lower():
            return True
    return False


def _chain_names(exc: BaseException | None) -> set[str]:
    """The class names of ``exc`` and of the errors it was raised from or during."""
    return {c.__name__ for e in _chain(exc) for c in type(e).__mro__}


def _tried(exc: BaseException) -> str:
    """`` at SCHEME://HOST:PORT``: the endpoint a connection that was never made was tried at,
    where the error names it (botocore's endpoint, aiohttp's host), without user info or path:
    an s3:// slide's endpoint is the environment's, a profile's or an option's, and a stale
    ``AWS_ENDPOINT_URL`` went unseen (hostile round 72, 4); '' where none is named."""
    for e in _chain(exc):
        kwargs = getattr(e, "kwargs", None)
        endpoint = kwargs.get("endpoint_url") if isinstance(kwargs, dict) else None
        if isinstance(endpoint, str) and "://" in endpoint:
            parts = urlsplit(endpoint)
            return f" at {parts.scheme}://{parts.netloc.rpartition('@')[2]}"
        host, port = getattr(e, "host", None), getattr(e, "port", None)
        if isinstance(host, str) and host and isinstance(port, int):
            return f" at {host}:{port}"
    return ""


def _gcsfs_tries() -> int:
    """How many times gcsfs sends a request before it gives up (its class's ``retries``)."""
    import gcsfs

    tries = getattr(gcsfs.GCSFileSystem, "retries", None)
    return tries if isinstance(tries, int) and tries > 0 else 6


#: the slides whose retries were said in this process (a slide has several readers: its
#: identity, its plan, its detection; "said once per slide" holds across them)
_SAID_RETRY: set[str] = set()
#: the marker in a slide's shared blocks' folder: its retry was said by a process of the run
RETRY_SAID = ".retry-said"
#: how long that marker holds (a run killed before it removed its folder left one)
RETRY_SAID_S = 600


#: the slides said in this process to have no version on their server (RemoteObject._sampled)
_SAID_UNVERSIONED: set[str] = set()
#: its marker in a slide's shared blocks' folder: said by a process of the run
UNVERSIONED_SAID = ".unversioned-said"


def _pin_named(pin: str | None) -> tuple[str, str]:
    """A pinned version as said, (what, value): ``("ETag", '"..."')``, or
    ``("Last-Modified", DATE)``."""
    if pin is not None and pin.startswith("modified:"):
        return "Last-Modified", pin.split(":", 1)[1]
    return "ETag", str(pin)


class Requests:
    """Requests to the server of one slide (``ref``): what may pass is retried with backoff and
    said once; what will not is one line (:meth:`_fault`). Shared by :class:`RemoteObject` and
    the DICOMweb series (:mod:`cyto.slides.dicomweb`)."""

    ref: SlideURL
    etag: str | None = None
    _said_retry: bool = False
    #: how often a retry is said: once for all readers of a slide (:data:`_SAID_RETRY`)
    said_once = "said once per slide"

    def said_as(self) -> str:
        """How the notes name what is asked."""
        return str(self.ref)

    def _tries(self) -> int:
        """How many times a request is sent here: once for ``gs://``, whose library (gcsfs)
        retries each request itself with its own backoff (six tries, over half a minute:
        retried here too, an unreachable store took two and a half minutes), else
        :data:`TRIES`."""
        return 1 if self.ref.scheme in ("gs", "gcs") else TRIES

    def _call(self, fn, what: str):
        """``fn()`` with retries of what may pass; one line for what will not. Once the
        retries of a fault that may pass are spent, every later request of this reader gives
        up at once with the same line: the readers of a run share one object per process
        (its plan, the threshold thread ahead of it), and each tried again in turn, a stalled
        server taking 3 x 4 tries where 4 were said (hostile round 61, 4)."""
        spent = getattr(self, "_gave_up", None)
        if spent is not None:
            raise type(spent)(*spent.args)
        delay = 0.25
        tries = self._tries()
        for attempt in range(tries):
            try:
                if tries == 1:  # gcsfs's own tries, unseen from here: said once they take long
                    return self._said_if_long(fn)
                return fn()
            except CytoError:
                raise
            except BaseException as exc:
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                why = None if _tls(exc, self.ref) else _transient(exc)
                if why is None or attempt == tries - 1:
                    fault = self._fault(exc, why, attempt + 1)
                    if why is not None:
                        self._gave_up = fault
                    raise fault from None
                if self._first_to_say_retry():
                    log.warning("note: %s: %s; retrying (%s)", self.said_as(), why, self.said_once)
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def _said_if_long(self, fn):
        """``fn()``, and a note (once per slide, as a retry is) when it has not returned after
        :data:`GCSFS_SAY_AFTER_S`: gcsfs retries a failed request itself, six tries over about
        half a minute, and an unreachable store was silent for 36-53 s before its one line
        (hostile round 74, 2)."""
        import threading

        def say() -> None:
            if self._first_to_say_retry():
                log.warning(
                    "note: %s: not answered after %g s: gcsfs tries each request up to %d "
                    "times, over about half a minute, before it gives up (%s)",
                    self.said_as(), GCSFS_SAY_AFTER_S, _gcsfs_tries(), self.said_once,
                )  # fmt: skip

        timer = threading.Timer(GCSFS_SAY_AFTER_S, say)
        timer.daemon = True
        timer.start()
        try:
            return fn()
        finally:
            timer.cancel()

    def _first_to_say_retry(self) -> bool:
        """Whether a retry of this slide is said here: once for every reader of it in this
        process, and once for the processes of a run (the tile workers) where they share its
        blocks' folder, by a marker made there first. The plan's process and a tile worker
        each said it, for two causes, "said once per slide" twice (hostile round 49, 4)."""
        if self._said_retry:
            return False
        self._said_retry = True
        return self._first_to_say(_SAID_RETRY, RETRY_SAID)

    def _first_to_say(self, said: set[str], marker_name: str) -> bool:
        """Whether a note of this slide is said here: once in this process (``said``: the
        slides it was said of) and once for the processes of a run that share the slide's
        blocks' folder (the marker ``marker_name`` made there first)."""
        if str(self.ref) in said:
            return False
        said.add(str(self.ref))  # every reader of the slide in this process
        folder = getattr(self, "_shared", None)  # gone with the slide's run (drop_blocks)
        if folder is None:
            return True
        marker = Path(folder) / marker_name
        with contextlib.suppress(OSError):  # one a killed run left is no run's of now
            if time.time() - marker.stat().st_mtime > RETRY_SAID_S:
                marker.unlink()
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        except OSError:  # a folder that takes nothing: said, as before
            return True
        return True

    def _fault(self, exc: BaseException, transient: str | None, tries: int) -> CytoError:
        status = _status(exc)
        if status == 412 or type(exc).__name__ == "PreconditionFailed":
            pin = getattr(self, "pin", None) or getattr(self, "etag", None)
            name, value = _pin_named(pin)
            return SlideChangedError(
                f"{self.ref}: the object changed while it was read (its {name} is no longer "
                f"{value}); nothing of this run of it is kept: score it again"
            )
        if isinstance(exc, FileNotFoundError) or status == 404:
            if _no_bucket(exc):  # the bucket, not the object: said by its name, as --out is
                # (an S3 slide of a missing bucket read as a missing object: round 74, 6)
                bucket = urlsplit(self.ref.url).netloc.rpartition("@")[2]  # as _filesystem
                return InputPathError(f"{self.ref}: there is no bucket {bucket!r} (404)")
            return InputPathError(f"{self.ref}: not found (404)")
        if isinstance(exc, PermissionError) or status in (401, 403):
            where = (
                f"the URL's user:password, --storage-option headers=..., {TOKEN_ENV}"
                if self.ref.dicomweb
                else f"environment, profile, --storage-option, {TOKEN_ENV}"
            )
            return InputPathError(
                f"{self.ref}: access denied ({status or 403}): check the credentials ({where})"
            )
        if _chain_names(exc) & {"NoCredentialsError", "PartialCredentialsError"}:
            # botocore found no key before any request: "cannot read it (NoCredentialsError)"
            from cyto.flags import python_call

            given = (
                "storage_options key=, secret="
                if python_call()
                else ("--storage-option key=... --storage-option secret=...")
            )
            return InputPathError(
                f"{self.ref}: no credentials for this store were found: set AWS_ACCESS_KEY_ID "
                f"and AWS_SECRET_ACCESS_KEY (or a profile, AWS_PROFILE), give {given}, or "
                "anon=true for a public bucket"
            )
        tls = _tls(exc, self.ref)
        if tls is not None:
            return RemoteAccessError(f"{self.ref}: {tls}")
        if transient is not None:
            if self.ref.scheme in ("gs", "gcs"):
                tries_said = f"{_gcsfs_tries()} tries by gcsfs"
            else:
                tries_said = f"{tries} tries"
            return RemoteAccessError(f"{self.ref}: {transient} ({tries_said}); giving up")
        what = f"HTTP {status}" if status else type(exc).__name__
        return RemoteAccessError(f"{self.ref}: cannot read it ({what})")


class RemoteObject(Requests):
    """One remote object, read by byte range (see the module docstring). Thread-safe."""

    def __init__(self, ref: SlideURL, block: int = BLOCK, cache_bytes: int = CACHE_BYTES):
        self.ref = ref
        self.block = block
        self.cache_bytes = max(cache_bytes, block)
        self._fs, self._path, self._version = _filesystem(ref)
        self._lock = threading.Lock()
        self._count = threading.Lock()
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        self.fetched_bytes = 0  # bytes that came over the network
        self.requests = 0
        self._said_retry = False
        info = self._call(self._info, "open")
        size = info.get("size")
        if info.get("type") == "directory" or size is None:
            raise InputPathError(f"{ref}: not an object (a folder, or a size the server hides)")
        self.size = int(size)
        self.etag = info.get("ETag") or info.get("etag")
        # S3's version id; Google Cloud Storage's generation, which every range then names
        self.version = self._version or info.get("VersionId") or info.get("generation") or None
        self.modified = str(
            info.get("LastModified") or info.get("Last-Modified") or info.get("updated") or ""
        )
        self.check_pin(ref)
        self._shared: Path | None = None

    def shared(self) -> Path:
        """The folder of this version's blocks that every process reading it shares: a tile
        the plan read is not fetched again by a worker, nor a block by two workers."""
        if self._shared is None:
            from cyto.cachedir import cache_dir

            self._shared = Path(cache_dir()) / "remote-blocks" / self.identity()[:32]
            self._shared.mkdir(parents=True, exist_ok=True)
        return self._shared

    @property
    def pin(self) -> str | None:
        """The version a run pins (:meth:`SlideURL.pinned`): the ETag; on an HTTP(S) server
        that sends none, its time of change (``modified:DATE``, each range then asked with
        ``If-Unmodified-Since``: nothing was pinned there, and an object replaced while it
        was scored was read half from each, or said as a slide that cannot be decoded;
        hostile round 62, 2); None where neither is stated."""
        if self.etag or not (self.modified and self.ref.scheme in ("http", "https")):
            return self.etag
        return f"modified:{self.modified}"

    def check_pin(self, ref: SlideURL) -> None:
        """A run pinned to another version of the object than this one: it changed."""
        if ref.etag is not None and ref.etag != self.pin:
            began, now = (" ".join(_pin_named(v)) for v in (ref.etag, self.pin))
            raise SlideChangedError(
                f"{ref}: the object changed while it was scored ({began} when the run began, "
                f"{now} now); nothing of this run of it is kept: score it again"
            )

    def _info(self) -> dict:
        kw = {"version_id": self._version} if self._version else {}
        if self.ref.scheme in ("http", "https"):
            head = self._http_head()
            if head is not None:
                return head
        try:
            return self._fs.info(self._path, **kw)
        except FileNotFoundError:
            if self.ref.scheme not in ("http", "https"):
                raise
            # fsspec says "not found" for any failed HEAD: one byte asked tells 403 from 404
            self._fs.cat_file(self._path, start=0, end=1)
            raise

    def identity(self) -> str:
        """The object's identity for resume and caches: its URL (printed form), size and
        version (S3 version id, else ETag, else time of change; a server that states none of
        them: its sampled bytes, :func:`cyto.slides.base.sampled_ranges`)."""
        import hashlib

        stamp = self.version or self.etag or self.modified or self._sampled()
        text = f"cyto-slide-identity-v1:remote\t{self.ref}\t{self.size}\t{stamp}"
        return hashlib.sha256(text.encode()).hexdigest()

    def _sampled(self) -> str:
        """The object's sampled bytes, for a server that states no version of it (no ETag, no
        time of change): known by its URL and size alone, a slide replaced by another of the
        same size was "already scored", and its cells were cut from the other's pixels
        (hostile round 61, 1). Read once per process (about 3 MiB, past the block cache), and
        said once per slide: a change while it is read cannot be seen."""
        if getattr(self, "_sampled_stamp", None) is None:
            import hashlib

            from cyto.slides.base import sampled_ranges

            h = hashlib.sha256(b"cyto-slide-identity-v1:remote-bytes")
            ranges = [(a, min(a + n, self.size)) for a, n in sampled_ranges(self.size)]
            # the ranges overlap on an object under 2 MiB (its first and last MiB): each byte
            # is fetched once, and hashed as every range reads it (a 254 KB object came 5x
            # over a run: hostile round 74, 3)
            spans = [(a, self._fetch(a, b)) for a, b in merged_spans(ranges)]
            for start, end in ranges:
                a, got = next(((a, got) for a, got in spans if a <= start < a + len(got)),
                              (start, b""))  # fmt: skip
                h.update(got[start - a : end - a] if start < end else b"")
            self._sampled_stamp = f"sampled:{h.hexdigest()}"
            self.shared()  # the run's folder of the slide, where the note's marker is made
            if self._first_to_say(_SAID_UNVERSIONED, UNVERSIONED_SAID):
                log.warning(
                    "note: %s: the server states no version of it (no ETag, no "
                    "Last-Modified): it is known by its size and sampled bytes, and a change "
                    "while it is scored cannot be seen",
                    self.said_as(),
                )
        return self._sampled_stamp

    def _fetch(self, start: int, end: int) -> bytes:
        """Bytes ``start`` .. ``end - 1`` from the server, pinned to the version opened."""
        scheme = self.ref.scheme

        def get() -> bytes:
            if scheme in ("http", "https"):
                return self._http_range(start, end)
            if scheme == "s3":
                return self._s3_range(start, end)
            if scheme in ("gs", "gcs") and self.version:
                try:  # the generation opened; replaced, it is gone (404) or another object
                    return self._fs.cat_file(
                        self._path, start=start, end=end, generation=self.version
                    )
                except FileNotFoundError:
                    raise SlideChangedError(
                        f"{self.ref}: the object changed while it was read (generation "
                        f"{self.version} is gone); nothing of this run of it is kept: score "
                        "it again"
                    ) from None
            return self._fs.cat_file(self._path, start=start, end=end)

        data = self._call(get, "read")
        if data is None or (len(data) != end - start and len(data) == self.size):
            raise NoRangesError(  # a 200 with the whole body (for HTTP: left unread)
                f"{self.ref}: the server answered the whole object ({self.size:,} bytes) to a "
                "byte-range request: it does not serve ranges, by which cyto reads a remote "
                f"slide in place; serve it from one that does (nginx, an S3 server), or pass "
                f"{passing('download')}"
            )
        if len(data) != end - start:
            raise SlideChangedError(
                f"{self.ref}: asked for bytes {start:,}-{end - 1:,} and got {len(data):,}: the "
                "object changed (or was cut short) while it was read; nothing of this run of it "
                "is kept"
            )
        with self._count:  # the read-ahead's threads fetch beside the readers
            self.fetched_bytes += len(data)
            self.requests += 1
        return data

    def _http_kwargs(self, **headers: str) -> dict:
        """The keywords of a GET of this HTTP(S) object by cyto's own request: the file
        system's (its client options, its headers), pinned to the ETag opened (``If-Match``),
        with ``headers`` added."""
        given = dict(self._fs.kwargs.get("headers") or {})
        if self.etag:
            given["If-Match"] = self.etag
        elif getattr(self, "modified", ""):  # set once opened: a server that sends no ETag
            given["If-Unmodified-Since"] = self.modified
        return {**self._fs.kwargs, "headers": {**given, **headers}}

    def _http_head(self) -> dict | None:
        """The object's size and version by one HEAD request, as fsspec's ``info`` says them;
        None when the answer does not tell them (an error status, no size: fsspec's ``info``
        then asks in its ways). One request a try: fsspec's ``info`` sends a HEAD, then a
        GET, then cyto one more to tell 403 from 404, each timed out in turn at a stalled
        server (twelve timeouts a slide, saying "4 tries"). A 5xx is raised, to be retried."""
        import aiohttp
        from fsspec.asyn import sync

        fs = self._fs
        kw = self._http_kwargs(**{"Accept-Encoding": "identity"})

        async def head() -> dict | None:
            session = await fs.set_session()
            async with session.head(fs.encode_url(self._path), allow_redirects=True, **kw) as r:
                if r.status >= 500 or r.status == 429:
                    raise aiohttp.ClientResponseError(
                        r.request_info, (), status=r.status, message=r.reason or ""
                    )
                encoded = r.headers.get("Content-Encoding", "identity") not in ("identity", "")
                if r.status != 200 or encoded or "Content-Length" not in r.headers:
                    return None
                info = {"name": self._path, "type": "file", "url": str(r.url)}
                info["size"] = int(r.headers["Content-Length"])
                for field in ("ETag", "Last-Modified"):
                    if r.headers.get(field):
                        info[field] = r.headers[field]
                return info

        return sync(fs.loop, head)

    def _http_range(self, start: int, end: int) -> bytes | None:
        """Bytes ``start`` .. ``end - 1`` of an HTTP(S) object by a range request pinned to
        the ETag opened (``If-Match``); None when the server answers with the whole object
        (200) instead, whose body is then never read (fsspec's ``cat_file`` reads it all into
        memory first: a slide of gigabytes, to be refused after)."""
        from fsspec.asyn import sync

        fs = self._fs
        kw = self._http_kwargs(Range=f"bytes={start}-{end - 1}")

        async def get() -> bytes | None:
            session = await fs.set_session()
            async with session.get(fs.encode_url(self._path), **kw) as r:
                if r.status == 200 and r.content_length != end - start:
                    r.close()  # the connection goes, with what the server still sends
                    return None
                fs._raise_not_found_for_status(r, self._path)
                return await r.read()

        return sync(fs.loop, get)

    def fetch_whole(self, fh, advance=None) -> None:
        """The whole object into the binary file ``fh``, streamed in one request pinned to
        the version opened: from a server that serves no byte ranges (:class:`NoRangesError`).
        ``advance(n)``: called with the count of each piece's bytes (a progress bar). Over
        HTTP by a GET of cyto's own: fsspec's ``open`` takes no headers of a call where its
        file system has some (it failed every such copy with "got multiple values for keyword
        argument 'headers'", said "not found (404)")."""
        from fsspec.asyn import sync

        fs = self._fs

        def wrote(piece: bytes) -> None:
            fh.write(piece)
            if advance is not None:
                advance(len(piece))

        async def http_get() -> None:
            session = await fs.set_session()
            async with session.get(fs.encode_url(self._path), **self._http_kwargs()) as r:
                fs._raise_not_found_for_status(r, self._path)
                async for piece in r.content.iter_chunked(8 << 20):
                    wrote(piece)

        def get() -> int:
            fh.seek(0)
            fh.truncate()
            if self.ref.scheme in ("http", "https"):
                sync(fs.loop, http_get)
            else:
                with fs.open(self._path, "rb", block_size=0) as src:
                    while piece := src.read(8 << 20):
                        wrote(piece)
            return fh.tell()

        got = self._call(get, "read")
        if got != self.size:
            raise SlideChangedError(
                f"{self.ref}: fetched {got:,} bytes of {self.size:,}: the object changed (or was "
                "cut short) while it was read; nothing of this run of it is kept"
            )
        with self._count:
            self.fetched_bytes += got
            self.requests += 1

    def _s3_range(self, start: int, end: int) -> bytes:
        from fsspec.asyn import sync

        fs = self._fs
        bucket, _, key = self._path.partition("/")
        pin = {"VersionId": self.version} if self._version else {}
        if self.etag and not pin:
            pin["IfMatch"] = self.etag

        async def get():
            resp = await fs._call_s3(
                "get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", **pin
            )
            try:
                return await resp["Body"].read()
            finally:
                resp["Body"].close()

        return sync(fs.loop, get)

    def read(self, start: int, size: int) -> bytes:
        """``size`` bytes from ``start`` (fewer at the end of the object), through the cache."""
        end = min(start + size, self.size)
        if start >= end:
            return b""
        first, last = start // self.block, (end - 1) // self.block
        with self._lock:
            missing = [b for b in range(first, last + 1) if b not in self._blocks]
            missing = [b for b in missing if not self._from_shared(b)]
            for run in _runs(missing):  # contiguous missing blocks in one request
                self._fetch_run(run)
            parts = []
            for b in range(first, last + 1):
                self._blocks.move_to_end(b)
                parts.append(self._blocks[b])
            while len(self._blocks) * self.block > self.cache_bytes:
                self._blocks.popitem(last=False)
        data = b"".join(parts)
        off = start - first * self.block
        return data[off : off + end - start]

    def _from_shared(self, b: int) -> bool:
        """Block ``b`` from the shared folder into this process's cache, if it is there."""
        data = shared(self.shared(), f"{b}.blk")
        if data is None:
            return False
        self._blocks[b] = data
        return True

    def _fetch_run(self, run: list[int]) -> None:
        """Fetch contiguous blocks in one request and share them. A block another process is
        fetching (its lock file exists) is waited for, at most the time of one request, not
        fetched twice."""
        mine = claim(self.shared(), [f"{b}.blk" for b in run], wait=True)
        self._fetch_claimed(sorted(int(n.split(".")[0]) for n in mine), keep=True)
        # those another process fetched; one already evicted again (the bound) is fetched here
        late = [b for b in run if b not in self._blocks and not self._from_shared(b)]
        self._fetch_claimed(late, keep=True, locked=False)

    def prefetch(self, blocks: list[int]) -> int:
        """Fetch the blocks of ``blocks`` that no process holds or is fetching into the shared
        folder only (read-ahead, :mod:`cyto.slides.ahead`: this process's cache is left as it
        is); returns the bytes that came over the network. A block being fetched elsewhere is
        not waited for."""
        folder = self.shared()
        todo = [b for b in sorted(set(blocks)) if not (folder / f"{b}.blk").exists()]
        mine = claim(folder, [f"{b}.blk" for b in todo], wait=False)
        return self._fetch_claimed(sorted(int(n.split(".")[0]) for n in mine), keep=False)

    def _fetch_claimed(self, mine: list[int], keep: bool, locked: bool = True) -> int:
        """Fetch the blocks this process claimed (contiguous ones in one request), write them
        to the shared folder (and, ``keep``, to this process's cache), and release them
        (``locked``: this process holds their locks)."""
        folder = self.shared()
        got = 0
        try:
            for part in _runs(mine):
                lo = part[0] * self.block
                hi = min((part[-1] + 1) * self.block, self.size)
                data = self._fetch(lo, hi)
                got += len(data)
                for i, b in enumerate(part):
                    block = data[i * self.block : (i + 1) * self.block]
                    if keep:
                        self._blocks[b] = block
                    share(folder, f"{b}.blk", block)
        finally:
            if locked:
                release(folder, [f"{b}.blk" for b in mine])
        if mine:
            bound_shared(folder.parent)
        return got

    def file(self) -> RemoteIO:
        """A seekable binary file over this object (for tifffile and libvips)."""
        return RemoteIO(self)


def _runs(blocks: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for b in sorted(blocks):
        if runs and runs[-1][-1] == b - 1:
            runs[-1].append(b)
        else:
            runs.append([b])
    return runs


def claim(folder: Path, names: list[str], wait: bool) -> list[str]:
    """The items of ``names`` (files in the shared ``folder``) this process is to fetch: it
    holds their lock files now. One another process is fetching (its lock exists) is waited
    for, at most the time of one request, and taken over only when it did not appear
    (``wait``), or left to that process (not ``wait``: read-ahead). An item already there is
    not claimed; with ``wait``, a folder that cannot be written leaves every item to this
    process."""
    mine = []
    for name in names:
        lock = folder / f"{name}.lock"
        try:
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            if not wait:
                continue
            deadline = time.monotonic() + timeout()
            while time.monotonic() < deadline and lock.exists():
                time.sleep(0.005)
            if not (folder / name).exists():
                mine.append(name)  # its fetcher failed or gave up: fetched here
            continue
        except OSError:
            if wait:
                mine.append(name)
            continue
        if (folder / name).exists():  # shared while the lock was being taken
            lock.unlink(missing_ok=True)
            continue
        mine.append(name)
    return mine


#: what ends every shared block or frame: this, then 16 bytes of sha256 (:func:`share`)
SEAL = b"cyto-shared-seal/1"
_said_damaged: set[str] = set()


def _seal_of(folder: Path, name: str, data: bytes) -> bytes:
    return hashlib.sha256(f"{folder.name}/{name}".encode() + b"\0" + data).digest()[:16]


def share(folder: Path, name: str, data: bytes) -> None:
    """Put ``data`` in the shared folder as ``name`` (written under a temporary name and
    renamed: a reader sees all of it or nothing), sealed: followed by :data:`SEAL` and the
    sha256 of the object's folder, the name and the bytes, so a block damaged, cut or copied
    from elsewhere is never read as the slide's (:func:`shared`); a folder that cannot be
    written is skipped."""
    tmp = folder / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        tmp.write_bytes(data + SEAL + _seal_of(folder, name, data))
        os.replace(tmp, folder / name)
    except OSError:
        tmp.unlink(missing_ok=True)


def shared(folder: Path, name: str) -> bytes | None:
    """The bytes of ``name`` in the shared folder when its seal holds; None when it is not
    there, or when it was damaged (then removed, so it is fetched again, and said once)."""
    path = folder / name
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    n = len(SEAL) + 16
    data = blob[:-n]
    if len(blob) > n and blob[-n:-16] == SEAL and _seal_of(folder, name, data) == blob[-16:]:
        return data
    path.unlink(missing_ok=True)
    if folder.name not in _said_damaged:
        _said_damaged.add(folder.name)
        log.warning(
            "note: a kept block of a remote slide (%s) did not match its seal (damaged, or put "
            "there from elsewhere): fetched again",
            path.relative_to(folder.parent.parent) if len(path.parts) > 2 else path,
        )
    return None


def release(folder: Path, names: list[str]) -> None:
    for name in names:
        (folder / f"{name}.lock").unlink(missing_ok=True)


def megabytes(name: str, default: int) -> int:
    """Bytes from the environment variable ``name`` (in MiB; ``default`` bytes when unset); a
    value that is no count of MiB is refused in one line."""
    from cyto.envvars import env_number

    return int(env_number(name, default / (1 << 20), "MiB", str(default >> 20)) * (1 << 20))


def bound_shared(root: Path) -> None:
    """Keep the shared blocks of every slide under ``CYTO_REMOTE_BLOCKS_MB`` (default 256),
    the least recently written going first."""
    limit = megabytes(SHARED_BYTES_ENV, SHARED_BYTES)
    try:
        files = [
            (f.stat().st_mtime_ns, f.stat().st_size, f)
            for pattern in ("*/*.blk", "*/*.frm")
            for f in root.glob(pattern)
        ]
    except OSError:
        return
    total = sum(size for _, size, _ in files)
    for _, size, f in sorted(files):
        if total <= limit:
            break
        f.unlink(missing_ok=True)
        total -= size


class RemoteIO(io.RawIOBase):
    """A read-only, seekable file over a :class:`RemoteObject`; each has its own position."""

    def __init__(self, obj: RemoteObject) -> None:
        super().__init__()
        self.obj, self.pos = obj, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.obj.size}[whence]
        self.pos = max(base + offset, 0)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buffer) -> int:
        data = self.obj.read(self.pos, len(buffer))
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)

    def read(self, size: int = -1) -> bytes:
        n = self.obj.size - self.pos if size is None or size < 0 else size
        data = self.obj.read(self.pos, n)
        self.pos += len(data)
        return data

    @property
    def name(self) -> str:
        return str(self.obj.ref)


def vips_source(obj: RemoteObject):
    """A libvips source over ``obj`` (its own position): libvips' loaders read the remote
    object as they read a file, so its pixels are the local file's, bit for bit. A fault the
    reads meet is kept on the source (``source.fault``), and libvips told that the read failed
    (-1): raised in the callback, it was printed by Python as "Exception ignored from cffi
    callback" with its traceback, once per read libvips tried (hostile round 30, 4)."""
    import pyvips

    f = obj.file()
    source = pyvips.SourceCustom()
    source.fault = None

    def on_read(buf) -> int:  # pyvips' "read" signal: fill buf, say how much (-1: failed)
        try:
            chunk = f.read(len(buf))
        except Exception as exc:  # noqa: BLE001 - kept, and raised by the reader after libvips
            source.fault = exc
            return -1
        buf[: len(chunk)] = chunk
        return len(chunk)

    source.signal_connect("read", on_read)
    source.on_seek(lambda offset, whence: f.seek(offset, whence))
    return source


_OPEN: dict[tuple, RemoteObject] = {}
_OPEN_LOCK = threading.Lock()
#: the object types of sources read otherwise than by byte range, by kind: a module below none of
#: this one's registers its own (cyto.slides.dicomweb: "dicomweb"); cyto.slides imports it
OPENERS: dict[str, type] = {}


def _open_key(ref: SlideURL) -> tuple:
    """The key of ``ref``'s object among those this process opened (:data:`_OPEN`): a fork
    starts afresh, and other storage options are another object."""
    return (os.getpid(), ref.url, json.dumps(ref.options, sort_keys=True, default=str))


def open_object(ref: SlideURL) -> RemoteObject:
    """The :class:`RemoteObject` of ``ref`` (a DICOMweb series: its
    :class:`~cyto.slides.dicomweb.DicomWebSeries`) in this process: opened once (one request for its
    version), then shared by its readers (one block cache). A fork starts afresh."""
    key = _open_key(ref)
    with _OPEN_LOCK:
        obj = _OPEN.get(key)
    if obj is None:
        obj = OPENERS["dicomweb"](ref) if ref.dicomweb else RemoteObject(ref)
        with _OPEN_LOCK:
            _OPEN[key] = obj
    obj.check_pin(ref)
    return obj


def merged_spans(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ``(start, end)`` byte ranges as disjoint spans, in order: overlapping or touching
    ranges merged, empty ones left out."""
    spans: list[list[int]] = []
    for a, b in sorted(r for r in ranges if r[0] < r[1]):
        if spans and a <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], b)
        else:
            spans.append([a, b])
    return [(a, b) for a, b in spans]


def known_by_bytes(ref: SlideURL) -> bool:
    """Whether this process knows ``ref``'s object by its sampled bytes (its server states no
    version of it: :meth:`RemoteObject._sampled`), from the object it opened; False where it
    opened none (nothing is asked of the server for it)."""
    with _OPEN_LOCK:
        obj = _OPEN.get(_open_key(ref))
    return getattr(obj, "_sampled_stamp", None) is not None


def pinned_ref(slide):
    """``slide`` pinned to the version this process opened (:meth:`SlideURL.pinned`), so the
    tile workers read that version or stop; a local path as it is."""
    if not isinstance(slide, SlideURL) or slide.etag is not None:
        return slide
    # a run starts from the server's version now, never from an object this process opened
    # for an earlier run (a long-lived process: cyto watch, a script; a URL served anew)
    forget(slide)
    obj = open_object(slide)
    return slide.pinned(getattr(obj, "pin", obj.etag))


def forget(ref: SlideURL) -> None:
    """Drop this process's open object of ``ref``: the next open asks the server again."""
    with _OPEN_LOCK:
        for key in [k for k in _OPEN if k[1] == ref.url]:
            del _OPEN[key]


def drop_blocks(slide) -> None:
    """Remove the shared blocks of a remote slide this process opened, once its run is over:
    nothing of a slide stays on disk after it is scored (a crash leaves them to the bound)."""
    import shutil

    if not isinstance(slide, SlideURL):
        return
    with _OPEN_LOCK:
        objs = [o for k, o in _OPEN.items() if k[1] == slide.url]
    for obj in objs:
        if obj._shared is not None:
            shutil.rmtree(obj._shared, ignore_errors=True)
            obj._shared = None


def remote_identity(ref: SlideURL) -> str:
    """:meth:`RemoteObject.identity`: of the version a run pinned, else asked of the server
    now (not from an object opened earlier)."""
    if ref.etag is None:
        forget(ref)
    return open_object(ref).identity()


def list_prefix(ref: SlideURL, suffixes: tuple[str, ...]) -> list[SlideURL]:
    """The slides under a prefix ``s3://bucket/slides/``: its objects ending in ``suffixes``,
    hidden names passed over as a folder's are (:func:`cyto.slides.base.listed_slide_name`)."""
    from cyto.slides.base import listed_slide_name

    fs, path, _ = _filesystem(ref)
    probe = RemoteObject.__new__(RemoteObject)
    probe.ref, probe._said_retry = ref, False
    scheme = ref.scheme
    if scheme in ("http", "https"):
        # a server's folder listing: the folder's own URL (without its slash it is a file,
        # 404), and a listing that cannot be read is an error, never an empty folder
        try:
            names = probe._call(lambda: fs.find(path.rstrip("/") + "/", on_error="raise"), "list")
        except InputPathError as exc:  # 403 or 404 of a folder: a server that lists none
            # answers so, and was taken for a credentials problem alone (hostile round 72, 3)
            raise InputPathError(
                f"{exc}; or the server lists no folders: an {scheme}:// prefix is read from "
                "the server's folder listing (nginx: autoindex on), else give each slide's URL"
            ) from None
    else:
        names = probe._call(lambda: fs.find(path.rstrip("/")), "list")
    out = [
        # HTTP lists full URLs, object stores bucket/key
        SlideURL(n if "://" in n else f"{scheme}://{n}", ref.options, ref.download)
        for n in sorted(names)
        if n.lower().endswith(suffixes) and listed_slide_name(n.rstrip("/").rsplit("/", 1)[-1])
    ]
    if not out:
        raise InputPathError(f"{ref} holds no slide (looked for {', '.join(suffixes)})")
    return out


def download(obj: RemoteObject, chunk: int = 8 << 20):
    """A local copy of ``obj`` in cyto's cache (``--download``), named by its identity, so a
    changed object is fetched again and an unchanged one once; written under a temporary name
    and renamed, each range pinned to the version opened. One fetch at a time of a copy: the
    slide's plan and its tiles open it in two threads at once, and each wrote, then renamed or
    removed, the same temporary file (a cohort's NDPI failed "No such file", hostile round 30);
    the second waits for the first's copy and takes it. The copies are kept within
    ``CYTO_DOWNLOAD_MB`` (:func:`bound_downloads`)."""
    import threading
    from pathlib import Path

    megabytes(DOWNLOAD_BYTES_ENV, DOWNLOAD_BYTES)  # a bad bound is refused before any fetch

    from cyto.cachedir import cache_dir
    from cyto.locks import file_lock

    def sha256_file(path: Path) -> str:  # bundle.sha256_file is a layer above this one
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()

    folder = Path(cache_dir()) / "remote" / obj.identity()[:24]
    target = folder / (obj.ref.name or "slide")
    record = folder / f".{target.name}.sha256"  # the bytes as fetched: a copy is checked
    folder.mkdir(parents=True, exist_ok=True)
    with file_lock(folder / f".{target.name}.lock"):  # other threads and processes too
        if target.is_file():
            stamp = _stamp(target)
            if _CHECKED.get(target) == stamp:  # hashed in this process, untouched since
                _used(record)
                return target
            kept = record.read_text().strip() if record.is_file() else None
            if target.stat().st_size == obj.size and kept == sha256_file(target):
                _CHECKED[target] = stamp
                _used(record)
                return target
            # a damaged copy was read as the slide's on every run ("cannot be decoded"), with
            # no word that the fault was cyto's own copy: it is fetched again, said once

            from cyto.errors import CytoWarning

            warn_caller(
                f"{obj.ref}: the copy in cyto's cache ({target}) is not as it was fetched; "
                "fetching it again",
                CytoWarning,
            )
        mine = f"{os.getpid()}-{threading.get_ident()}"
        tmp = folder / f".{target.name}.{mine}.part"
        from cyto.progress import progress

        try:
            # a slide of gigabytes over a slow link: its bytes counted on the way
            with (
                open(tmp, "wb") as fh,
                progress(f"fetching {obj.ref.name}", total=obj.size / (1 << 20), unit="MiB") as bar,
            ):
                try:
                    for start in range(0, obj.size, chunk):
                        data = obj._fetch(start, min(start + chunk, obj.size))
                        fh.write(data)
                        bar.advance(len(data) / (1 << 20))
                except NoRangesError:  # the server sends the whole object: one request
                    obj.fetch_whole(fh, lambda n: bar.advance(n / (1 << 20)))
            # its record first, then the copy into place: never a copy without one
            part = folder / f".{record.name}.{mine}"
            part.write_text(sha256_file(tmp))
            os.replace(part, record)
            os.replace(tmp, target)
            _CHECKED[target] = _stamp(target)
        finally:
            tmp.unlink(missing_ok=True)
    bound_downloads(folder.parent, target)
    return target


def held_copy(obj: RemoteObject) -> tuple[Path, object]:
    """The ``--download`` copy of ``obj`` (:func:`download`) and its hold: an open file whose
    shared lock (``.NAME.readers``) keeps :func:`bound_downloads` of every process from
    removing the copy until it is closed. A reader holds it while it is open: libvips opens
    a file again by its name between reads, and a copy removed under a viewer made each of
    its tiles "cannot be decoded" (hostile round 32). A copy removed between its fetch and
    the hold is fetched again."""
    import fcntl

    from cyto.locks import flock_or_not

    while True:
        copy = download(obj)
        hold = open(_readers_lock(copy), "a+")  # noqa: SIM115 (held open)
        try:
            flock_or_not(hold, fcntl.LOCK_SH)
        except BaseException:
            hold.close()
            raise
        if copy.is_file():
            return copy, hold
        hold.close()


def _readers_lock(copy: Path) -> Path:
    """The file whose shared lock the readers of a ``--download`` copy hold (:func:`held_copy`)."""
    return copy.parent / f".{copy.name}.readers"


def _used(record: Path) -> None:
    """A copy was used now: its record's time says so (the copy's own time is part of what
    says it is unchanged)."""
    with contextlib.suppress(OSError):
        os.utime(record)


def bound_downloads(root: Path, keep: Path) -> list[Path]:
    """Keep the ``--download`` copies under ``root`` within ``CYTO_DOWNLOAD_MB`` (default
    20 GiB), the least recently used going first; never ``keep`` (the copy just fetched) nor
    one another thread or process is fetching or reading now (its locks are held: see
    :func:`held_copy`). Said once a call, in a note; returns the copies removed."""
    limit = megabytes(DOWNLOAD_BYTES_ENV, DOWNLOAD_BYTES)
    copies = []
    with contextlib.suppress(OSError):
        for folder in root.iterdir():
            for f in folder.iterdir() if folder.is_dir() else ():
                if f.is_file() and not f.name.startswith("."):
                    record = folder / f".{f.name}.sha256"
                    used = (record if record.is_file() else f).stat().st_mtime_ns
                    copies.append((used, f.stat().st_size, f, record))
    total = sum(size for _, size, _, _ in copies)
    removed: list[Path] = []
    freed = 0
    for _, size, f, record in sorted(copies, key=lambda c: c[0]):
        if total <= limit:
            break
        if f == keep or not _remove_unless_busy(f, record):
            continue
        total -= size
        freed += size
        removed.append(f)
    from cyto.cachedir import size_words

    bound = f"{limit / (1 << 20):g}"  # as given: 0.25, not 0
    if removed:
        log.warning(
            "note: removed %d --download cop%s not used lately from cyto's cache (%s), "
            "to keep the copies within %s=%s",
            len(removed),
            "y" if len(removed) == 1 else "ies",
            size_words(freed),
            DOWNLOAD_BYTES_ENV,
            bound,
        )
    alone = next((size for _, size, f, _ in copies if f == keep), 0)
    if alone > limit:
        # the bound cannot hold the copy being read: the cache stayed over it, unsaid (hostile
        # round 62, 6)
        log.warning(
            "note: the --download copy of %s (%s) alone is over %s=%s: it is kept while it is "
            "read, and goes when the next copy needs the room; raise %s to keep a slide's copy",
            keep.name,
            size_words(alone),
            DOWNLOAD_BYTES_ENV,
            bound,
            DOWNLOAD_BYTES_ENV,
        )
    return removed


def _remove_unless_busy(copy: Path, record: Path) -> bool:
    """Remove a ``--download`` copy and its record, unless its fetch lock (of
    :func:`download`) or a reader's hold (:func:`held_copy`) is held now, tried by
    :func:`cyto.locks.flock_or_not`: a file system that cannot lock does not keep a copy for
    good. Its lock files stay: one removed while held would be taken by the next comer alone."""
    import fcntl

    from cyto.locks import flock_or_not

    with (
        open(copy.parent / f".{copy.name}.lock", "a+") as fetching,
        open(_readers_lock(copy), "a+") as reading,
    ):
        try:
            flock_or_not(fetching, fcntl.LOCK_EX | fcntl.LOCK_NB)
            flock_or_not(reading, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # being fetched, checked or read by a run now
        record.unlink(missing_ok=True)
        copy.unlink(missing_ok=True)
    return True


#: the --download copies this process hashed (or wrote), by their size, time and inode: a
#: slide's plan, its tiles and a viewer open the copy again and again, and each open read
#: (and hashed) the whole file; one changed since is hashed again
_CHECKED: dict = {}


def _stamp(path) -> tuple[int, int, int]:
    st = os.stat(path)
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def slide_bytes(path) -> int:
    """The size of a slide: its file's, the sum of a DICOM slide's instances (its folder), or a
    remote object's (a DICOMweb series: its instances')."""
    from pathlib import Path

    if isinstance(path, SlideURL):
        return open_object(path).size
    path = Path(path)
    if path.is_dir():
        from cyto.slides.dicom import slide_instances

        return sum(f.stat().st_size for f in slide_instances(path))
    return path.stat().st_size
