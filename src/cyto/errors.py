"""Typed errors raised by the cyto library.

Every message names the input, what was expected and how to fix it. The CLI turns any
:class:`CytoError` into one line on stderr and a non-zero exit code (``CYTO_DEBUG=1`` shows the
traceback); so are the machine's own failures in :data:`SYSTEM_ERRORS` (a full disk).
"""

from __future__ import annotations

import contextvars
import errno
import os
import re

#: what an OSError of the machine (not of cyto) means, by errno: the CLI says it in one line
SYSTEM_ERRORS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "no permission",
    errno.EPERM: "no permission",
    errno.ENAMETOOLONG: "a name in the path is longer than the file system allows (255 bytes "
    "a name, 4096 a path)",
    errno.ELOOP: "too many levels of symbolic links (a link that leads back to itself?)",
    # a file where cyto makes a folder (data field --out FILE, a stray OUT.train-state file):
    # tracebacks of mkdir (hostile round 45, 4)
    errno.EEXIST: "a file is in the way of a folder cyto makes there: move it, or give another "
    "output",
    errno.ENOTDIR: "a file stands where the path needs a folder",
}


#: the local paths the running command or call was given (its path arguments) and cyto's
#: cache, set by the CLI's guard and the API's front door (:func:`cyto.cachedir.places_of`):
#: where a full disk without a file named is looked for
PLACES: contextvars.ContextVar[tuple] = contextvars.ContextVar("cyto_places", default=())
#: a file system with less room than this is the full one a write without a file named met
FULL_BYTES = 4 << 20


def _full_places(exc: OSError) -> str:
    """' (PLACE: N kB free)' for the file systems among the command's paths and cyto's cache
    that are (nearly) full, for a full disk's error that names no file: a write on an open file
    carries none, and "the disk is full" alone did not say which, the output's or the cache's
    (hostile round 47, 5); '' where none is found."""
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return ""
    seen, full = set(), []
    for place in PLACES.get():
        if callable(place):  # cyto's cache, named only now
            try:
                place = str(place())
            except Exception:  # noqa: BLE001 - a cache that cannot be named is no place to name
                continue
        at = os.path.abspath(place)
        while not os.path.exists(at) and os.path.dirname(at) != at:
            at = os.path.dirname(at)
        try:
            st, vfs = os.stat(at), os.statvfs(at)
        except OSError:
            continue
        if st.st_dev in seen:
            continue
        seen.add(st.st_dev)
        free = vfs.f_bavail * vfs.f_frsize
        if free < FULL_BYTES:
            full.append(f"{place}: {free // 1024:,} kB free")
    return f" ({'; '.join(full[:2])})" if full else ""


def system_words(exc: OSError) -> str | None:
    """One line for an OSError of the machine (:data:`SYSTEM_ERRORS`): the file it names, cut
    to a length a line can hold, and what the error means; None for any other OSError. The
    CLI's last word and the Python API's front door say it so (:class:`PathError`)."""
    why = SYSTEM_ERRORS.get(exc.errno)
    if why is None:
        return None
    name = os_error_path(exc) or ""
    if len(name) > 120:  # a name of 300 x's, said whole, is no longer one line
        name = f"{name[:60]}...{name[-40:]} ({len(name)} characters)"
    return f"{name}: {why}" if name else why + _full_places(exc)


def os_error_path(exc: OSError) -> str | None:
    """The file an OSError is about: its ``filename``, or the path a library's message quotes
    where it gives none (Arrow: "Failed to open local file '/o/s/.partial/chunk-...'"; a chunk
    that could not be written was said as the slide's folder: hostile round 35, 2)."""
    if exc.filename is not None:
        return str(exc.filename)
    import re

    # as the library was given it: absolute, or relative to the working folder (an --out of
    # the docs' kind, "scored/": round 36, 1); a quoted word with no folder in it is no path
    found = re.search(r"'([^']*/[^']*)'", str(exc))
    return found.group(1) if found else None


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says the machine ran out of memory: Python's ``MemoryError``, torch's
    ``OutOfMemoryError``, OpenCV's failed allocation. Said in one line naming the sizes to
    lower (:func:`cyto.cohort.local.unforeseen`, training), never as a bug to report."""
    if isinstance(exc, MemoryError):
        return True
    name, text = type(exc).__name__, str(exc)
    return name == "OutOfMemoryError" or (
        name == "error" and ("Failed to allocate" in text or "Insufficient memory" in text)
    )


class CytoError(Exception):
    """Base class of every error cyto raises on purpose."""

    exit_code = 1
    #: the output folder is another run's (it holds it, or finished it since this run began):
    #: this run scored nothing there, and its cohort row yields to that run's
    another_run = False


class CytoWarning(UserWarning):
    """Base class of cyto's warnings; the CLI prints each as one ``warning: ...`` line."""


class UnsealedBundleWarning(CytoWarning):
    """A bundle of an older format whose manifest has no seal: an edit to it cannot be seen."""


class ScaleWarning(CytoWarning):
    """Patches that look much smaller or larger than the model's training cells."""


class StainWarning(CytoWarning):
    """Cells stained otherwise than the model's training cells (another stain, batch or lab)."""


class WarningLine(str):
    """A ``warning: ...`` line said through an ``echo`` that knows which Python warning it is:
    the CLI prints it as any line, and a library call warns it in its :attr:`category`
    (:func:`cyto.api._said`): a slide's scale lines are ``ScaleWarning``s, as
    :func:`cyto.predict`'s are, so one filter catches both (hostile round 22)."""

    category: type[Warning] = CytoWarning

    def __new__(cls, text: str, category: type[Warning] = CytoWarning) -> WarningLine:
        line = super().__new__(cls, text)
        line.category = category
        return line


def warning_echo(echo, category: type[Warning]):
    """``echo`` whose ``warning:`` lines are :class:`WarningLine` lines of ``category``."""

    def said(line: str) -> None:
        echo(WarningLine(line, category) if line.startswith("warning: ") else line)

    return said


class InputPathError(CytoError):
    """A path given by the user is missing, of the wrong kind, or empty."""

    exit_code = 2


class DatasetError(CytoError):
    """A patch dataset or manifest cannot be used as asked (classes, columns, labels)."""

    exit_code = 2


class UnreadableImageError(DatasetError):
    """An image file cannot be decoded; ``skip``: how the caller skips such files, in its
    words (``cyto.flags.passing("skip_unreadable")``: ``--skip-unreadable`` at the command line,
    ``skip_unreadable=True`` from Python). Exit code 1, as a slide or bundle that exists but
    cannot be read: the command line was right (it was 2, a usage error: hostile round 33)."""

    exit_code = 1

    def __init__(self, path: object, reason: str, skip: str | None) -> None:
        self.path = path
        self.reason = reason
        # None: the command has no such flag (cyto synth slide --cells)
        also = f", or pass {skip} to skip and count such files" if skip else ""
        super().__init__(f"cannot read image {path}: {reason} (fix or remove the file{also})")


class ConfigError(CytoError):
    """A configuration value is outside what is allowed."""

    exit_code = 2


class UnsupportedSlideError(CytoError):
    """A file is not a whole-slide image cyto can read."""


class SlideFailedError(CytoError):
    """One slide of a cohort or watch failed in a way cyto does not foresee (a bug in cyto or a
    library it calls): said in one line with Python's words, and the other slides go on."""


class SlideWriteError(CytoError):
    """A synthetic slide cannot be written as requested."""


class BundleError(CytoError):
    """A model bundle is missing, incomplete, tampered with, or from an incompatible version."""


class BundlePathError(BundleError):
    """The path given as a model bundle does not exist or is no folder: a bad argument, exit 2
    like every other path that does not exist (a bundle that exists but is broken stays 1)."""

    exit_code = 2


class TrainingError(CytoError):
    """Training cannot go on (NaN loss, collapsed scores, unusable data for the method)."""


class PathError(CytoError):
    """The machine refused a path (a name too long, a loop of links, no permission, a full
    disk): :func:`system_words`, raised by the Python API where the CLI prints it."""


class OutputWriteError(CytoError):
    """An output cannot be written (disk full, read-only, no permission); finished work is kept."""


class OutputBusyError(CytoError):
    """Another process is writing the same output folder (one writer per folder)."""

    exit_code = 3
    another_run = True


class OutputTakenError(InputPathError):
    """Another run finished the output folder after this one began (this one found it empty):
    replaced only with ``--overwrite``."""

    another_run = True


class DeviceError(CytoError):
    """The requested device is not available (e.g. CUDA on a machine without a GPU)."""

    exit_code = 2


class MissingDependencyError(CytoError):
    """An optional dependency needed for the requested feature is not installed."""

    def __init__(self, package: str, feature: str, install: str) -> None:
        self.package = package
        super().__init__(f"{feature} needs {package}, which is not available: {install}")


class VerificationError(CytoError):
    """A graph or engine does not reproduce the bundle's golden cells on this machine."""

    exit_code = 2


class ParityError(ConfigError):
    """A reduced-precision graph or engine does not keep the fp32 ranking (not added)."""


class NotFittedError(CytoError):
    """A method was asked to embed or score before ``fit``."""


class MetricError(CytoError, ValueError):
    """Inputs a metric cannot rank (NaN scores, non-binary labels, K < 1, ...)."""

    exit_code = 2


class RemoteAccessError(CytoError):
    """A remote slide cannot be read: the server does not answer, or answers with an error."""


class SlideChangedError(CytoError):
    """A remote slide was replaced while it was read: nothing read from it is kept."""


class NoRangesError(UnsupportedSlideError):
    """A server answers a byte-range request with the whole object: the slide cannot be read
    in place, only through a copy fetched whole (``--download``:
    :func:`cyto.slides.remote.download`)."""


def as_arg(value: object) -> str:
    """``value`` (a path) as a command that a message advises takes it, to be pasted into a
    shell: quoted where a shell would split or read it (a bundle under ``sp ace/`` was advised
    ``cyto export sp ace/m.cyto``, which failed as pasted: hostile round 54, 4)."""
    import shlex

    text = str(value)
    if text.startswith("-"):  # read as an option, not a path (hostile round 55, 7)
        text = f"./{text}"
    return shlex.quote(text)


#: a line of a C++ library's message that says only where it was raised (OpenVINO stacks them
#: before what went wrong: "Exception from src/inference/src/cpp/core.cpp:217:")
_WHERE_ONLY = re.compile(r"^(Exception from \S+:\d+:|Check '.*' failed at \S+:\d+:)$")


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message that says what went wrong (a library's may be
    a page, and OpenVINO's open with lines naming its source files: a damaged kept engine was
    said "(Exception from src/inference/src/cpp/core.cpp:217:)", hostile round 65, 4), or its
    type's name when it has none: what a one-line error quotes of its cause."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    return next((ln for ln in lines if not _WHERE_ONLY.match(ln)), lines[0])


def warn_caller(message: str, category: type[Warning] = CytoWarning) -> None:
    """Warn pointing at the first frame outside cyto (the user's own line), however many of
    cyto's frames lie between (the API function, its front door, the package's lazy
    re-export): a fixed ``stacklevel`` pointed into cyto (``cyto/api.py:47``)."""
    import os
    import sys
    import warnings

    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    level, frame = 2, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
