"""The import graph follows ../shared/ARCHITECTURE.md: imports point down only.

Every ``import`` in ``src/cyto`` counts, those inside functions too (a lazy import is still a
dependency). Layers, top to bottom:

    cli
    bench  demo  review  predict  doctor
    infer  eval
    train  export
    runtime
    models  data  bundle
    errors  progress  interrupts  (and the package root)

A module may import its own layer's package and anything below. On top of that:
``infer/`` and ``runtime/`` never import ``train/`` or ``eval/``; ``export/`` never imports
``train/`` or ``data.synth``; ``runtime/`` imports no torch at module level.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "cyto"

LAYERS = {
    "cli": 6,
    "__main__": 6,
    "bench": 5,
    "demo": 5,
    "review": 5,
    "predict": 5,
    "doctor": 5,
    "infer": 4,
    "eval": 4,
    "train": 3,
    "export": 3,
    "runtime": 2,
    "models": 1,
    "data": 1,
    "bundle": 1,
    "errors": 0,
    "progress": 0,
    "interrupts": 0,
    "__init__": 0,
}
# packages of one layer that must not import each other
APART = {("infer", "eval"), ("eval", "infer"), ("train", "export"), ("export", "train")}
FORBIDDEN = {
    "infer": ("cyto.train", "cyto.eval"),
    "runtime": ("cyto.train", "cyto.eval", "cyto.export", "cyto.infer"),
    "export": ("cyto.train", "cyto.data.synth"),
}


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
        for target, line, _ in _imports(mod, path):
            if (
                _layer_key(target) is None
                or target not in modules
                and not any(m.startswith(target + ".") for m in modules)
            ):
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
