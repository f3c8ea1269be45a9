"""Where a run's outputs go: a local folder, or a prefix in object storage (``s3://``, ``gs://``).

An :class:`OutputLocation` is the one thing the pipeline is given as ``--out``. A local folder
is written in place, as always. A prefix (``--out s3://bucket/scored/``) is written through a
local *staging* folder in cyto's cache (the bucket's, keyed by its printed URL and its
endpoint, with the prefix's keys as folders in it), which mirrors the prefix: every slide
is scored into its staging folder by the very code of a local run (locks, resumable chunks,
the seal), then :meth:`OutputLocation.publish` uploads each finished file to its final key,
one object per file (an S3 PUT is atomic: an object is there whole or not at all), after
removing the old seal, and ``seal.json`` last. A publish stopped half way leaves no seal, so
what it left is never reused; the finished result stays in the staging folder, and
``--resume`` uploads it (:meth:`OutputLocation.unpublished`).

Before outputs are reused or checked (``--resume``, the refusal of a finished folder, the
folder names of a cohort), :meth:`OutputLocation.pull` makes the staging folder a copy of the
remote folder's files (a file whose ETag and bytes did not change since the last pull or
publish is not fetched again; files the remote folder lacks are removed). The seal is then
checked by :func:`cyto.seal.read_sealed` on those bytes: the remote outputs are trusted by the
same rule as local ones, and a remote summary edited by hand is scored again.

The file systems and credentials are those of the remote slides (:mod:`cyto.slides.remote`:
``--storage-option``, the standard AWS variables and profiles); requests are retried as theirs
are, and URLs are printed through :func:`~cyto.slides.remote.redact`. Object stores have no
locks: two machines writing one slide's folder at once are not refused (on one machine the
staging folder's lock refuses the second run). The chunks of an interrupted slide stay in the
staging folder of the machine that scored it: another machine starts that slide afresh.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path
from urllib.parse import unquote, urlsplit

from cyto.envvars import env_text, user_path
from cyto.errors import CytoError, InputPathError, OutputWriteError
from cyto.flags import passing
from cyto.seal import SEAL
from cyto.slides.remote import (
    Requests,
    SlideURL,
    _filesystem,
    is_url,
    redact,
)
from cyto.tables import json_text

#: at the root of a staging folder: the printed URL of the prefix it mirrors
MARK = ".cyto-location.json"
#: in each staged folder: per file, the sha256 and remote ETag when it was last pulled or pushed
RECORD = ".cyto-remote.json"
#: in a staged slide folder whose upload failed: the prefix's seal then (its ETag, or none)
FAILED = ".cyto-upload-failed.json"
#: URL schemes outputs can be written to
SCHEMES = ("s3", "gs", "gcs")


def _hash(path: Path) -> str:
    from cyto.bundle import sha256_file

    return sha256_file(path)


class OutputLocation(Requests):
    """An output folder (see the module docstring): ``local`` is where cyto writes (the folder
    itself, or its staging folder); ``remote`` the URL of the prefix, or None. ``str()`` is
    what may be printed. Pickles (to Ray actors) with its storage options."""

    said_once = "said once"  # a prefix: no slide of its own

    def said_as(self) -> str:
        return str(self)

    def __init__(
        self, where: str | os.PathLike, options: dict | None = None, parts: tuple[str, ...] = ()
    ) -> None:
        self._fs = None
        self._said_retry = False
        #: set by :meth:`pull` when it kept a result sealed here that was never uploaded
        self.kept_unpublished = False
        self._kept_seal: str | None = None
        #: set by :meth:`writing` when what it published is the result :meth:`pull` kept
        self.kept_uploaded = False
        self._seal_before: str | None = None  # the prefix's seal when a publish began
        self.parts = tuple(parts)
        if not is_url(where):
            self.remote = self.ref = self.root = None
            self.local = user_path(where).joinpath(*self.parts)
            return
        url = str(where.url if isinstance(where, SlideURL) else where)
        scheme = urlsplit(url).scheme.lower()  # before SlideURL, whose refusal is of slides'
        if scheme not in SCHEMES:  # (file:// was told "cyto reads slides from": round 45, 14)
            raise InputPathError(
                f"{passing('out', redact(url))}: cyto writes outputs to a local folder or to "
                f"s3:// or gs:// prefixes, not {scheme}://"
            )
        root = SlideURL(url.rstrip("/") + "/", options)
        if "?" in url:
            raise InputPathError(
                f"{passing('out', redact(url))}: give the prefix without a query string"
            )
        self.root = root
        self.ref = SlideURL(root.url + "".join(f"{p}/" for p in self.parts), options)
        self.remote = self.ref.url
        # staged by the bucket and the keys under it: one folder of objects is one staging
        # folder however it is named (a cohort's prefix and a slide's folder under it, given
        # to cyto score and to cyto.score_slide, kept two and missed each other's results)
        split = urlsplit(root.url)
        keys = [unquote(k) for k in split.path.split("/") if k]
        if any(k in (".", "..") for k in keys):
            raise InputPathError(
                f"{passing('out', redact(url))}: a prefix of . or .. segments is not a folder "
                "of objects cyto writes; name it without them"
            )
        bucket = SlideURL(f"{split.scheme}://{split.netloc}/", options)
        self.local = staging_root(bucket).joinpath(*keys, *self.parts)

    # ----- what the pipeline asks of an output folder
    @property
    def is_remote(self) -> bool:
        return self.remote is not None

    def __str__(self) -> str:
        return str(self.ref).rstrip("/") if self.is_remote else str(self.local)

    def __repr__(self) -> str:
        return f"OutputLocation({str(self)!r})"

    def __getstate__(self):
        if self.is_remote:
            return (self.root.url, self.root.options, self.parts)
        return (str(self.local), None, ())

    def __setstate__(self, state) -> None:
        # a Ray actor on another machine stages in its own cache
        self.__init__(*state)

    def child(self, name: str) -> OutputLocation:
        """The folder ``name`` inside this one (a slide's)."""
        if not self.is_remote:
            return OutputLocation(self.local / name)
        return OutputLocation(self.root.url, self.root.options, (*self.parts, name))

    def words(self, text: str) -> str:
        """``text`` with the staging folder named as the remote prefix it stands for."""
        if not self.is_remote:
            return text
        return text.replace(str(self.local), str(self))

    @contextlib.contextmanager
    def writing(self):
        """The block writes this location's outputs into :attr:`local`: its files pulled first
        (what is reused is what the prefix holds), published after (``seal.json`` last) and the
        staged copy released; an error inside names the prefix, never the staging folder."""
        try:
            self.pull()
            yield self
            self.publish()
            self.kept_uploaded = self._still_kept()  # said by the caller: "already scored"
            self.release()
        except CytoError as exc:
            self.translated(exc)
            raise

    def translated(self, exc: BaseException) -> BaseException:
        """``exc`` (a cyto error met while writing here) naming the remote prefix, not the
        staging folder."""
        if self.is_remote and isinstance(exc, CytoError) and exc.args:
            exc.args = (self.words(str(exc.args[0])), *exc.args[1:])
        return exc

    # ----- the remote side
    def fs(self):
        if self._fs is None:
            self._fs, self._path, _ = _filesystem(self.ref)
            self._path = self._path.rstrip("/")
        return self._fs

    def _key(self, name: str) -> str:
        self.fs()
        return f"{self._path}/{name}"

    def _listing(self) -> dict[str, dict]:
        """The files directly under this prefix (name -> their info), none when there is none;
        hidden names (a temporary of a client) are not cyto's outputs."""
        found = {}
        for entry in self._entries():
            name = entry["name"].rstrip("/").rpartition("/")[2]
            if entry.get("type") == "file" and name and not name.startswith("."):
                found[name] = entry
        return found

    def folders(self) -> list[str]:
        """The names of the folders directly under this prefix."""
        if not self.is_remote:
            return (
                sorted(p.name for p in self.local.iterdir() if p.is_dir())
                if (self.local.is_dir())
                else []
            )
        return sorted(
            e["name"].rstrip("/").rpartition("/")[2]
            for e in self._entries()
            if e.get("type") == "directory"
        )

    def _entries(self) -> list[dict]:
        """What the server lists directly under this prefix now (not a cached listing)."""
        fs = self.fs()

        def ls():
            fs.invalidate_cache(self._path)
            try:
                return fs.ls(self._path, detail=True)
            except FileNotFoundError:
                return []

        return self._call(ls, "list")

    def check(self, reading: bool = False) -> None:
        """Before any work: the bucket answers and can be listed with these credentials
        (``reading``: outputs are to be read from it, not written to it, and are said so)."""
        if not self.is_remote:
            return
        fs = self.fs()
        bucket = self._path.split("/", 1)[0]
        try:
            self._call(lambda: fs.info(bucket), "info")
        except CytoError as exc:
            reason = _reason(exc, self)
            if reason == "not found (404)":  # the bucket itself: said so, by its name
                reason = f"there is no bucket {bucket!r} (404)"
            if reading:
                raise InputPathError(f"cannot read {self}: {reason}") from None
            raise OutputWriteError(f"cannot write {passing('out', str(self))}: {reason}") from None

    def pull(self, names: tuple[str, ...] | None = None) -> None:
        """Make the staging folder a copy of the remote folder's files (``names``: only these,
        when they are there); a file unchanged since it was last pulled or pushed is not
        fetched again. Nothing for a local folder."""
        if not self.is_remote:
            return
        if names is not None:
            self._pull(names)
            return
        from cyto.locks import OutputLock

        # a run on this machine writing the folder now keeps it: refused as locally
        with OutputLock(self.local):
            remote = self._listing()
            # the prefix's seal now: what a failed upload of this run leaves it holding, even
            # where the upload fails before it can list the prefix (a store down, not read-only)
            self._seal_before = _etag(remote[SEAL]) if SEAL in remote else None
            if self._kept_over(remote):
                self.kept_unpublished = True
                self._kept_seal = _hash(self.local / SEAL)
                return  # a result this machine sealed and could not upload: kept, not lost
            self._pull(None, remote)

    def uploaded_words(self, slide_name: str) -> str | None:
        """What :meth:`writing` did beyond the slide's own lines: the line that says the
        result kept on this machine went up now (``--resume`` said only "already scored"), or
        None. ``cyto score`` and :func:`cyto.score_slide` say it alike."""
        if not self.kept_uploaded:
            return None
        return f"{slide_name}: uploaded to {self} (the result kept on this machine)"

    def _still_kept(self) -> bool:
        """Whether the folder's result is the one :meth:`pull` kept (not one scored again over
        it: a slide changed since, or ``--overwrite``)."""
        seal = self.local / SEAL
        return self.kept_unpublished and seal.is_file() and _hash(seal) == self._kept_seal

    def _kept_over(self, remote: dict) -> bool:
        """Whether the staging folder's finished result, sealed here and never uploaded
        (:meth:`unpublished`), is newer than what the prefix holds: the prefix has no seal, or
        still the seal it had when this result's upload failed (an older result, whose seal
        a read-only bucket kept). A seal another machine published since wins."""
        if not self.unpublished():
            return False
        if SEAL not in remote:
            return True
        failed = self._failed_upload()
        return failed is not None and failed.get("seal_etag") == _etag(remote[SEAL])

    def unpublished(self) -> bool:
        """Whether the staging folder holds a finished result sealed here and never uploaded
        whole (its upload failed): its seal holds, and its upload is recorded as failed, or no
        record says it was pushed or pulled. Such a folder is kept by :meth:`pull` (see
        :meth:`_kept_over`), so that ``--resume`` publishes it instead of scoring the slide
        again."""
        if not self.is_remote or not (self.local / SEAL).is_file():
            return False
        known = self._record().get(SEAL) or {}
        pushed = known.get("etag") is not None and known.get("sha256") == _hash(self.local / SEAL)
        if pushed and self._failed_upload() is None:
            return False  # it came from the prefix, or went there: the prefix decides
        from cyto.seal import read_sealed

        return read_sealed(self.local).ok

    def _failed_upload(self) -> dict | None:
        """What :meth:`publish` recorded when this folder's upload failed (the prefix's seal
        then), or None."""
        try:
            data = json.loads((self.local / FAILED).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _pull(self, names: tuple[str, ...] | None, remote: dict | None = None) -> None:
        remote = self._listing() if remote is None else remote
        if names is not None:
            remote = {k: v for k, v in remote.items() if k in names}
        record = self._record()
        kept = {}
        self.local.mkdir(parents=True, exist_ok=True)
        for name, info in remote.items():
            path, etag = self.local / name, _etag(info)
            known = record.get(name) or {}
            if (
                path.is_file()
                and etag is not None
                and known.get("etag") == etag
                and path.stat().st_size == info.get("size")
                and known.get("sha256") == _hash(path)
            ):
                kept[name] = known
                continue
            tmp = self.local / f".{name}.pull"
            try:
                self._call(lambda n=name, t=tmp: self.fs().get_file(self._key(n), str(t)), "get")
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
            kept[name] = {"etag": etag, "sha256": _hash(path)}
        for path in list(self.local.iterdir()):  # what the remote folder no longer holds
            if (
                path.is_file()
                and not path.name.startswith(".")
                and path.name not in remote
                and (names is None or path.name in names)
            ):
                path.unlink()
        if names is not None:
            kept = {**{k: v for k, v in record.items() if k not in names}, **kept}
        self._write_record(kept)

    def publish(self, names: tuple[str, ...] | None = None) -> None:
        """Upload this folder's outputs to the remote prefix. A sealed slide folder: the old
        seal is removed first, each sealed file then goes to its final key (skipped when the
        remote one is the bytes last pushed), outputs of cyto no longer sealed are removed, and
        ``seal.json`` goes last. ``names``: plain files of no seal (``cohort.csv``)."""
        if not self.is_remote:
            return
        try:
            self._publish(names)
        except CytoError as exc:
            if names is None:  # the result stays here, newer than the seal the prefix holds
                from cyto.bundle import atomic_write

                seal = {"seal_etag": self._seal_before}
                with contextlib.suppress(OSError):
                    atomic_write(self.local / FAILED, json_text(seal).encode())
            kept = (
                f"; the finished result is kept on this machine: run again with "
                f"{passing('resume')} to upload it"
                if names is None
                else ""
            )
            raise OutputWriteError(
                f"cannot write the outputs to {self}: {_reason(exc, self)}{kept}"
            ) from None

    def _publish(self, names) -> None:
        fs, record = self.fs(), self._record()
        remote = self._listing()
        if names is None:
            self._seal_before = _etag(remote[SEAL]) if SEAL in remote else None
            seal = json.loads((self.local / SEAL).read_text())
            files = [n for n in seal["files"] if n != SEAL]
            stale = [
                n
                for n in seal.get("owned", [])
                if n not in seal["files"] and n != SEAL and n in remote
            ]
            # a seal must never vouch for files half replaced: it goes first, comes back last
            changing = [n for n in files if not self._same(n, remote, record)]
            if not changing and not stale and self._same(SEAL, remote, record):
                (self.local / FAILED).unlink(missing_ok=True)
                return
            if SEAL in remote:
                self._delete(SEAL)
                record.pop(SEAL, None)
                self._write_record(record)
            order = [*changing, SEAL]
        else:
            stale, order = [], [n for n in names if not self._same(n, remote, record)]
        for name in stale:
            self._delete(name)
            record.pop(name, None)
        for name in order:
            path = self.local / name
            self._call(lambda p=path, n=name: fs.put_file(str(p), self._key(n)), "put")
            fs.invalidate_cache(self._path)
            info = self._call(lambda n=name: fs.info(self._key(n)), "info")
            record[name] = {"etag": _etag(info), "sha256": _hash(path)}
            self._write_record(record)
        if names is None:  # uploaded whole, seal last
            (self.local / FAILED).unlink(missing_ok=True)

    def _delete(self, name: str) -> None:
        """Remove the key ``name``; one already gone is what was asked (S3 answers a delete of a
        missing key with success, Google Cloud Storage with 404)."""
        fs = self.fs()

        def rm() -> None:
            with contextlib.suppress(FileNotFoundError):
                fs.rm_file(self._key(name))

        self._call(rm, "delete")

    def release(self) -> None:
        """Once a slide's folder is published, its staged copy goes (the prefix holds it: a
        cohort does not keep a second copy of every table in the cache), unless another run on
        this machine holds the folder now. Nothing for a local folder."""
        if not self.is_remote or not self.local.is_dir():
            return
        from cyto.errors import OutputBusyError
        from cyto.locks import OutputLock

        try:
            lock = OutputLock(self.local).acquire()
        except OutputBusyError:
            return
        try:
            for path in self.local.iterdir():
                if path == lock.path:
                    continue
                if path.is_dir() and not path.is_symlink():
                    # a slide's folder holds no folder of outputs: one of another name is the
                    # staging of a prefix under this one (s3://B/r/a/x/ beside the slide a of
                    # s3://B/r/), whose kept result or running chunks were removed with it
                    if path.name.startswith("."):
                        shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        finally:
            lock.release()
        with contextlib.suppress(OSError):  # a file another run put there since
            self.local.rmdir()

    def _same(self, name: str, remote: dict, record: dict) -> bool:
        """Whether the remote ``name`` holds the bytes of the local one (by the record of the
        last push or pull: the same ETag, and the local file unchanged since)."""
        known, info, path = record.get(name) or {}, remote.get(name), self.local / name
        return (
            info is not None
            and path.is_file()
            and known.get("etag") is not None
            and known.get("etag") == _etag(info)
            and known.get("sha256") == _hash(path)
        )

    def _record(self) -> dict:
        try:
            data = json.loads((self.local / RECORD).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write_record(self, record: dict) -> None:
        from cyto.bundle import atomic_write

        self.local.mkdir(parents=True, exist_ok=True)
        atomic_write(self.local / RECORD, json_text(record, sort_keys=True).encode())


def _etag(info: dict) -> str | None:
    etag = info.get("ETag") or info.get("etag") or info.get("md5Hash")
    return str(etag).strip('"') if etag else None


def _reason(exc: CytoError, where: OutputLocation) -> str:
    """A request's one-line error, without the URL it starts with (the caller names it)."""
    text = str(exc)
    for prefix in (f"{where.ref}: ", f"{where}: "):
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text


def staging_root(ref: SlideURL) -> Path:
    """The staging folder of the bucket ``ref`` in cyto's cache (its prefixes are folders in
    it): named by the printed URL and the endpoint it is read from (one bucket name on two
    servers is two places)."""
    from cyto.cachedir import cache_dir

    endpoint = (
        ref.options.get("endpoint_url")
        or (ref.options.get("client_kwargs") or {}).get("endpoint_url")
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
        or ""
    )
    shown = str(ref).rstrip("/")
    key = hashlib.sha256(f"{shown}\t{redact(str(endpoint))}".encode()).hexdigest()[:20]
    root = Path(cache_dir()) / "outputs" / key
    root.mkdir(parents=True, exist_ok=True)
    mark = root / MARK
    if not mark.is_file():
        from cyto.bundle import atomic_write

        atomic_write(mark, json_text({"url": shown}).encode())
    return root


def recorded(path: str | os.PathLike) -> str:
    """``path`` as a summary records it: a staging folder as the remote prefix it stands for
    (:func:`shown`), any other path absolute (a record read from another folder still names
    it)."""
    said = shown(path)
    return said if said != str(Path(path)) else str(Path(path).resolve())


def shown(path: str | os.PathLike) -> str:
    """``path`` as it may be printed and recorded: a staging folder (or a file in it) as the
    remote prefix it stands for; any other path as it is."""
    from cyto.cachedir import cache_dir

    path = Path(path)
    base = Path(cache_dir()) / "outputs"
    try:
        rel = path.resolve().relative_to(base.resolve())
    except (ValueError, OSError, RuntimeError):
        return str(path)
    if not rel.parts:
        return str(path)
    try:
        url = json.loads((base / rel.parts[0] / MARK).read_text())["url"]
    except (OSError, ValueError, KeyError, TypeError):
        return str(path)
    return "/".join([url, *rel.parts[1:]])


def urls_for_staging(text: str) -> str:
    """``text`` with every path into a staging folder (``CACHE/outputs/KEY/...``) written as
    the remote prefix it stands for (:func:`shown`): the one rule of every message a command
    or a public call ends with, so that none names cyto's cache where the user named a URL
    (a lock's refusal, a reader's refusal of a folder pulled from a prefix)."""
    import re

    from cyto.cachedir import cache_dir

    try:
        base = str(Path(cache_dir()) / "outputs")
    except (CytoError, OSError):  # the message may be the refusal of the cache itself
        return text
    if base not in text:
        return text
    pattern = re.compile(re.escape(base) + r"/[0-9a-f]{20}(?:/[^\s:;,()'\"]*)?")

    def url(m: re.Match) -> str:
        path = m.group(0)
        trail = "/" if path.endswith("/") else ""
        said = shown(path.rstrip("/"))
        return said + trail if said != path.rstrip("/") else path

    return pattern.sub(url, text)


def output_location(out: str | os.PathLike | OutputLocation, options: dict | None = None):
    """The one reading of an ``--out``: an :class:`OutputLocation` (a URL: a prefix in object
    storage, with the storage options; anything else: a local folder)."""
    if isinstance(out, OutputLocation):
        return out
    return OutputLocation(out, options)


def scored_here(
    where: str | os.PathLike, options: dict | None = None
) -> tuple[Path, OutputLocation]:
    """A scored folder given by a path or by its URL (``s3://bucket/out/slide``), as a local
    folder: a URL's files are pulled into its staging folder in cyto's cache (a file unchanged
    since it was last pulled is not fetched again), and its sub-folders too when it is a
    cohort's prefix. What the folder holds is then trusted only through its seal, as a local
    folder's is. Returns (the local folder, its location: ``translated`` names the URL in
    errors)."""
    loc = output_location(where, options)
    if not loc.is_remote:
        return loc.local, loc
    loc.check(reading=True)
    pulled = [loc]
    loc.pull()
    if not (loc.local / "summary.json").is_file():
        children = loc.folders()
        for name in children:
            pulled.append(loc.child(name))
            pulled[-1].pull()
        # a slide's folder this machine scored and failed to upload is not listed there
        for path in sorted(loc.local.iterdir()):
            if path.is_dir() and path.name not in children and not path.name.startswith("."):
                child = loc.child(path.name)
                child.kept_unpublished = child.unpublished()
                pulled.append(child)
        if not children and not any(p for p in loc.local.iterdir() if not p.name.startswith(".")):
            raise InputPathError(f"{loc}: holds no outputs of cyto score (nothing under it)")
    for each in pulled:  # what the prefix does not hold is not read as if it did
        if each.kept_unpublished:
            older = "holds an older result; " if each._seal_before is not None else ""
            raise InputPathError(
                f"{each}: {older}the result scored on this machine was never uploaded there "
                f"(its upload failed): score it again with {passing('resume')} to upload it"
            )
    return loc.local, loc


def table_here(given, options: dict | None = None) -> tuple[Path, OutputLocation]:
    """(a local path, its location) of a score table given by a path or a URL: the folder of a
    URL (a slide's ``scores.parquet`` in object storage, or the slide's folder) is pulled to
    cyto's cache with its seal (:func:`scored_here`), so it is checked as a local one. The one
    rule of the commands that read one slide's table (``cyto calibrate``, ``cyto eval scores``:
    it took no URL of ``--out s3://`` results, hostile round 72, 6)."""
    from cyto.slides.remote import is_url

    if not is_url(given):
        here = user_path(given)  # ~ the home folder, as every local path (round 45, 5)
        return here, output_location(here)
    url = str(given)
    name = ""
    if url.rstrip("/").endswith((".parquet", ".csv")):
        url, _, name = url.rstrip("/").rpartition("/")
    folder, where = scored_here(url, options)
    return (folder / name if name else folder), where


def scored_folders(given, options: dict | None = None) -> list[Path]:
    """Scored folders (or cohort folders) given by paths or URLs, as local folders: each URL
    through :func:`scored_here` (pulled to cyto's cache, trusted through its seal), each path
    as it is. The one rule of every command that reads scored folders (``cyto review``,
    ``cyto data cells``, ``cyto view``, ``cyto calibrate``): a URL is never read as a path
    (``s3:/bucket/...`` "is not a folder")."""
    return [scored_here(g, options)[0] if is_url(g) else user_path(g) for g in given]


def local_path(field: str, value: str | os.PathLike, what: str, cli_name: str = "") -> Path:
    """``value`` of an argument that takes a local path only (a model bundle, training cells,
    a table to write: :class:`cyto.flags.Local`), as a path; a URL is refused in one line naming
    the argument in the caller's words (``data=`` from Python, ``--data`` at the command line,
    ``cli_name`` for a command's positional argument) and the URL as it may be printed
    (:func:`~cyto.slides.remote.redact`), never turned into a path (``https:/host/...``) and
    reported missing. The one rule of the Python API (:func:`local_args`) and the CLI
    (``cyto.cli._app.LocalPath``); ``what``: what the argument names and what to do instead."""
    from cyto.flags import python_call, said

    if is_url(value):
        label = cli_name if cli_name and not python_call() else said(field)
        raise InputPathError(
            f"{label} takes a local path, not a URL: {redact(str(value))} ({what})"
        )
    return user_path(value)


def local_args(given: dict, hints: dict) -> dict:
    """Every argument in ``given`` whose annotation in ``hints`` marks it local-only
    (:class:`cyto.flags.Local`) held to :func:`local_path`: the arguments read so (``~`` the
    home folder), each of the type it was given (a ``str`` stays one), to put in their place."""
    from cyto.flags import local_of

    read = {}
    for field, value in given.items():
        mark = local_of(hints.get(field))
        if mark is not None and isinstance(value, (str, os.PathLike)):
            path = local_path(field, value, mark.what)
            read[field] = path if isinstance(value, os.PathLike) else str(path)
    return read


def refuse_unusable_cache() -> None:
    """A ``CYTO_CACHE_DIR`` the user named that cannot be cyto's cache is refused before any
    work: the CLI and the Python API's front door call this first (``cyto export`` wrote the
    bundle's graph, then was refused where it first used the cache). The default folder is left
    to :func:`cyto.cache_dir`, which falls back with a word where it is used."""

    from cyto.cachedir import cache_dir

    if env_text("CYTO_CACHE_DIR"):
        cache_dir()
