"""The import graph follows ../shared/ARCHITECTURE.md: imports point down only, no cycles.

Every ``import`` in ``src/cyto`` counts, those inside functions too (a lazy import is still a
dependency). Layers, top to bottom:

    cli
    bench  demo  review  view  predict  doctor  api
    cohort
    infer  eval
    train  export  stats  location
    runtime  detect  slides
    models  data  bundle  seal
    errors  progress  interrupts  locks  reuse  flags  outputs_check  localserver  cachedir
    envvars  staging  version  (and the root)

A module may import its own layer's package and anything below. On top of that:
``infer/``, ``cohort/`` and ``runtime/`` never import ``train/`` or ``eval/``; ``export/`` never
imports ``train/`` or ``data.synth``; ``slides/`` and ``detect/`` know nothing of models (nor of
each other: the pipeline hands tiles from one to the other); ``runtime/`` imports no torch at
module level. No module imports itself back through others (no cycles), and the two nucleus
detectors meet only in their shared modules (parameters, peaks).

One import points up by design: the package root re-exports the public API of ``cyto.api``
lazily (PEP 562, on first attribute access, after the package has loaded), so ``cyto/__init__``
may import ``cyto.api`` inside a function, and that edge is no import-time cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "cyto"

LAYERS = {
    "cli": 7,
    "__main__": 7,
    "bench": 6,
    "demo": 6,
    "review": 6,
    "view": 6,
    "predict": 6,
    "doctor": 6,
    "api": 6,
    "cohort": 5,
    "infer": 4,
    "eval": 4,
    "train": 3,
    "export": 3,
    "stats": 3,
    "location": 3,  # an output folder or object-store prefix: over the remote slides' file systems
    "runtime": 2,
    "detect": 2,
    "slides": 2,
    "models": 1,
    "data": 1,
    "bundle": 1,
    "seal": 1,  # a slide folder's seal, made with the bundle's file hashing
    "errors": 0,
    "progress": 0,
    "interrupts": 0,
    "locks": 0,
    "outputs_check": 0,
    "reuse": 0,
    "flags": 0,
    "tables": 0,
    "localserver": 0,
    "cachedir": 0,
    "envvars": 0,  # cyto's environment variables, read by one rule
    "staging": 0,  # folders a run builds an output in, named for their process
    "version": 0,
    "__init__": 0,
}
# packages of one layer that must not import each other
APART = {
    ("infer", "eval"),
    ("eval", "infer"),
    ("train", "export"),
    ("export", "train"),
    ("train", "stats"),
    ("export", "stats"),
    ("stats", "train"),
    ("stats", "export"),
    ("runtime", "detect"),
    ("runtime", "slides"),
    ("detect", "runtime"),
    ("detect", "slides"),
    ("slides", "detect"),
}
_MODELS = ("cyto.models", "cyto.bundle", "cyto.train", "cyto.export", "cyto.runtime.scorer")
FORBIDDEN = {
    "infer": ("cyto.train", "cyto.eval"),
    "cohort": ("cyto.train", "cyto.eval"),
    "runtime": ("cyto.train", "cyto.eval", "cyto.export", "cyto.infer"),
    "export": ("cyto.train", "cyto.data.synth"),
    "slides": _MODELS,
    "detect": _MODELS,
}


# (importing module, imported module): the package root's lazy re-export of the public API (see the
# module docstring); nothing else
ROOT_REEXPORTS = {("cyto", "cyto.api")}


def _modules() -> dict[str, Path]:
    out = {}
    for f in SRC.rglob("*.py"):
        rel = f.relative_to(SRC.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _imports(module: str, path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import in ``path``."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    found = []
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[: len(parent) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.append((base, node.lineno, id(node) in top))
            # `from cyto import infer` imports the subpackage
            found += [(f"{base}.{a.name}", node.lineno, id(node) in top) for a in node.names]
    return found


def _layer_key(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "cyto":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def _violations(modules: dict[str, Path]) -> list[str]:
    bad = []
    for mod, path in sorted(modules.items()):
        src_key = _layer_key(mod)
        for target, line, at_top in _imports(mod, path):
            if (
                _layer_key(target) is None
                or target not in modules
                and not any(m.startswith(target + ".") for m in modules)
            ):
                continue
            if (mod, target) in ROOT_REEXPORTS and not at_top:  # lazy, inside a function only
                continue
            dst_key = _layer_key(target)
            where = f"{path.relative_to(SRC.parent)}:{line} imports {target}"
            if src_key not in LAYERS or dst_key not in LAYERS:
                bad.append(f"{where}: module outside the layer table")
                continue
            if dst_key != src_key and LAYERS[dst_key] > LAYERS[src_key]:
                bad.append(f"{where}: points up ({src_key} -> {dst_key})")
            if (src_key, dst_key) in APART:
                bad.append(f"{where}: {src_key} and {dst_key} stay apart")
            for prefix in FORBIDDEN.get(src_key, ()):
                if target == prefix or target.startswith(prefix + "."):
                    bad.append(f"{where}: {src_key} never imports {prefix}")
    return bad


def test_imports_point_down_only():
    assert _violations(_modules()) == []


def _root_names(modules: dict[str, Path]) -> list[str]:
    """``import cyto``, and ``from cyto import NAME`` where NAME is no module of cyto: the
    package root itself, or a name it defines or re-exports, which would tie the importer to
    the root and, through its lazy re-export, to the public API at the top."""
    bad = []
    for path in sorted(modules.values()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import) and any(a.name == "cyto" for a in node.names):
                bad.append(f"{path.relative_to(SRC.parent)}:{node.lineno} imports the root")
            elif isinstance(node, ast.ImportFrom) and node.module == "cyto" and not node.level:
                bad += [
                    f"{path.relative_to(SRC.parent)}:{node.lineno} takes {a.name} from the root"
                    for a in node.names
                    if f"cyto.{a.name}" not in modules
                ]
    return bad


def test_no_module_takes_a_name_from_the_package_root(tmp_path):
    """The root sits on top (it re-exports the public calls of :mod:`cyto.api`): what it offers
    every layer (``cache_dir``, ``__version__``) lives in a bottom module of its own, and a
    module imports it from there (sixteen modules took them from the root, an arrow back up
    through the public API to each)."""
    assert _root_names(_modules()) == []
    # the check can fail: a name of the root is caught, a submodule taken from it is not
    (tmp_path / "cyto").mkdir()
    (tmp_path / "cyto" / "__init__.py").write_text("x = 1\n")
    (tmp_path / "cyto" / "errors.py").write_text("")
    (tmp_path / "cyto" / "bundle.py").write_text(
        "from cyto import errors, x\nimport cyto.errors\n\n\ndef f():\n    import cyto\n"
    )
    mods = {
        "cyto": tmp_path / "cyto" / "__init__.py",
        "cyto.errors": tmp_path / "cyto" / "errors.py",
        "cyto.bundle": tmp_path / "cyto" / "bundle.py",
    }
    global SRC
    saved, SRC = SRC, tmp_path / "cyto"
    try:
        assert _root_names(mods) == [
            "cyto/bundle.py:1 takes x from the root",
            "cyto/bundle.py:6 imports the root",
        ]
    finally:
        SRC = saved


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    """The rule fails on an upward import hidden inside a function (not a vacuous check)."""
    pkg = tmp_path / "cyto"
    (pkg / "runtime").mkdir(parents=True)
    (pkg / "train").mkdir()
    for f in ("__init__.py", "runtime/__init__.py", "train/__init__.py", "train/api.py"):
        (pkg / f).write_text("")
    (pkg / "runtime" / "x.py").write_text("def f():\n    from ..train import api\n")
    mods = {
        "cyto": pkg / "__init__.py",
        "cyto.runtime": pkg / "runtime/__init__.py",
        "cyto.runtime.x": pkg / "runtime/x.py",
        "cyto.train": pkg / "train/__init__.py",
        "cyto.train.api": pkg / "train/api.py",
    }
    global SRC
    saved, SRC = SRC, pkg
    try:
        bad = _violations(mods)
    finally:
        SRC = saved
    assert any("points up (runtime -> train)" in b for b in bad), bad
    assert any("runtime never imports cyto.train" in b for b in bad), bad


@pytest.mark.parametrize("package", ["runtime"])
def test_runtime_imports_no_torch_at_module_level(package):
    heavy = ("torch", "torchvision", "tensorrt", "onnxruntime")
    bad = []
    for mod, path in _modules().items():
        if _layer_key(mod) != package:
            continue
        for target, line, at_top in _imports(mod, path):
            if at_top and target.split(".")[0] in heavy:
                bad.append(f"{path.name}:{line} imports {target} at module level")
    assert bad == []


def _edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules it imports (``from pkg import name`` points at ``pkg.name`` when that
    is a module, else at ``pkg``)."""
    out: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        tree = ast.parse(path.read_text())
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")
                    base = ".".join(
                        parent[: len(parent) - node.level + 1] + ([base] if base else [])
                    )
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    for a in node.names
                ]
            out[mod] |= {
                t for t in targets if t in modules and t != mod and (mod, t) not in ROOT_REEXPORTS
            }
    return out


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert _cycles(_edges(_modules())) == []


def test_the_cycle_check_sees_a_cycle_through_a_lazy_import():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_two_detectors_meet_only_in_their_parameters():
    edges = _edges(_modules())
    forms = {"cyto.detect.numpy_form", "cyto.detect.torch_form"}
    for form in forms:
        assert not edges[form] & (forms | {"cyto.detect"}), (form, edges[form])
        assert "cyto.detect.params" in edges[form]


@pytest.mark.parametrize("package", ["infer", "cli"])
def test_modules_of_the_pipeline_and_the_cli_stay_small(package):
    """No module over 500 lines in ``infer/`` or ``cli/`` (issue 33: one job per module)."""
    sizes = {f.name: len(f.read_text().splitlines()) for f in (SRC / package).glob("*.py")}
    assert sizes and {n: k for n, k in sizes.items() if k > 500} == {}
