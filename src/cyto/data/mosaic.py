"""Sample mosaics of a patch dataset: one labelled row per class."""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from cyto.bundle import atomic_write
from cyto.data.dataset import PatchRecord, load_records, refuse_listed_output
from cyto.data.images import read_image, resize_rgb
from cyto.errors import ConfigError
from cyto.flags import check_seed, passing
from cyto.outputs_check import refuse_input_as_output, refuse_to_replace


def class_rows(
    records: list[PatchRecord], per_class: int, tile: int, seed: int
) -> list[tuple[str, np.ndarray]]:
    """``[(class, (tile, per_class*tile, 3) uint8 row)]`` with images picked by ``seed``; a
    row is as long as ``per_class`` or the largest class, whichever is shorter (memory follows
    the images there are, not the number asked for)."""
    rng = np.random.default_rng(check_seed(seed))
    by_class: dict[str, list[PatchRecord]] = {}
    for r in records:
        by_class.setdefault(r.cls, []).append(r)
    per_class = min(per_class, max((len(v) for v in by_class.values()), default=1))
    rows = []
    for cls in sorted(by_class):
        items = by_class[cls]
        pick = rng.choice(len(items), size=min(per_class, len(items)), replace=False)
        row = np.full((tile, per_class * tile, 3), 255, dtype=np.uint8)
        for j, i in enumerate(sorted(pick)):
            row[:, j * tile : (j + 1) * tile] = resize_rgb(read_image(items[i].path), tile)
        rows.append((cls, row))
    return rows


def render_rows(
    rows: list[tuple[str, np.ndarray]], label_width: int = 130, title: str | None = None
) -> Image.Image:
    """Stack labelled rows into one image (class names on the left)."""
    if not rows:
        raise ConfigError("nothing to draw: the dataset has no classes")
    tile_h = rows[0][1].shape[0]
    width = label_width + max(r.shape[1] for _, r in rows)
    top = 24 if title else 0
    canvas = Image.new("RGB", (width, top + tile_h * len(rows)), "white")
    draw = ImageDraw.Draw(canvas)
    if title:
        draw.text((6, 6), title, fill="black")
    for k, (cls, row) in enumerate(rows):
        y = top + k * tile_h
        canvas.paste(Image.fromarray(row), (label_width, y))
        draw.text((6, y + tile_h // 2 - 6), cls, fill="black")
    return canvas


IMAGE_ENDINGS = (".png", ".jpg", ".jpeg")


def class_mosaic(
    source: Path,
    out: Path,
    per_class: int = 8,
    tile: int = 128,
    seed: int = 0,
    overwrite: bool = False,
    echo: Callable[[str], None] | None = None,
) -> Path:
    """Write a PNG (or JPEG, by ``out``'s ending) with ``per_class`` sample images of every
    class in ``source``; the folders above ``out`` are made, an existing ``out`` is replaced
    only with ``overwrite``. ``per_class`` above the largest class's count draws that many
    (said through ``echo``)."""
    out = Path(out)
    check_seed(seed)
    if per_class < 1 or tile < 16:
        raise ConfigError(f"--per-class must be >= 1 and --tile >= 16, got {per_class} and {tile}")
    if out.suffix.lower() not in IMAGE_ENDINGS:
        raise ConfigError(f"--out {out}: a mosaic is a .png, .jpg or .jpeg file")
    refuse_listed_output(out, source, "PATH")  # one of the images a manifest lists
    refuse_to_replace(out, overwrite, inputs={"PATH": source})
    records = load_records(Path(source))
    if out.exists():  # one of the folder's own images (it was replaced by the mosaic)
        mine = out.resolve()
        hit = next((r.path for r in records if Path(r.path).resolve() == mine), None)
        refuse_input_as_output(out, passing("out", out), {"PATH": hit})
    if Path(source).is_dir():  # a mosaic in a class folder is read as a cell next (round 43, 11)
        refuse_input_as_output(out, passing("out", out), {"PATH": source}, inside=("PATH",))
    largest = max(Counter(r.cls for r in records).values(), default=0)
    if per_class > largest > 0 and echo is not None:
        echo(
            f"{passing('per_class', per_class)}: the largest class holds {largest} images; "
            f"drawing at most {largest} per class"
        )
    rows = class_rows(records, per_class, tile, seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    drawn = io.BytesIO()  # written at once: a stopped run leaves the last mosaic whole
    image = render_rows(rows, title=str(source))
    image.save(drawn, format=Image.registered_extensions()[out.suffix.lower()])
    atomic_write(out, drawn.getvalue())
    return out
