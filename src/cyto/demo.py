"""``make demo``: the main job on built-in synthetic data, end to end, on 2 CPU cores.

Today it draws a synthetic patch dataset and a synthetic whole slide with planted abnormal cells,
checks both (dataset summary, slide opened by OpenSlide), and writes pictures to look at. Each step
is a library call that a user can run alone through the CLI.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def run_demo(out: Path, seed: int = 0, echo: Callable[[str], None] = print) -> dict[str, object]:
    """Run every demo step into ``out``; returns what was made."""
    from cyto.data.dataset import PatchDataset, data_info
    from cyto.data.mosaic import class_mosaic
    from cyto.data.synth.patches import PatchSynthConfig, write_patches
    from cyto.data.synth.slide import SlideSynthConfig, write_slide

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    made: dict[str, object] = {}
    t0 = time.perf_counter()

    echo("[1/4] synthetic cell patches (normal lymphocyte-like + six abnormal morphologies)")
    patches = out / "patches"
    counts = write_patches(
        patches, PatchSynthConfig(n_normal=300, n_abnormal=20, seed=seed), overwrite=True
    )
    info = data_info(patches)
    echo(
        f"      {info.n_files} images, classes: "
        + ", ".join(f"{k} {v}" for k, v in info.classes.items())
    )
    made["patches"] = patches
    made["counts"] = counts

    echo("[2/4] load them as a one-class dataset (normal vs everything else), decoded once")
    ds = PatchDataset.from_path(patches, normal="normal")
    echo(
        f"      {len(ds)} images {tuple(ds.images.shape[1:])}, {int(ds.labels.sum())} abnormal, "
        f"fingerprint {ds.fingerprint[:12]}"
    )

    echo("[3/4] mosaic of every class")
    mosaic = class_mosaic(patches, out / "patches_mosaic.png", per_class=8, seed=seed)
    echo(f"      {mosaic}")
    made["mosaic"] = mosaic

    echo("[4/4] synthetic whole slide (NDPI) with planted abnormal cells and ground truth")
    res = write_slide(
        out / "slide.ndpi",
        SlideSynthConfig(width=4096, height=4096, abnormal_fraction=0.02, seed=seed),
        overwrite=True,
    )
    echo(
        f"      {res.paths[0]}: {res.size[0]}x{res.size[1]} px, {len(res.levels)} levels, "
        f"{res.n_cells} cells, {res.n_abnormal} planted abnormal; truth in {res.ground_truth}"
    )
    made["slide"] = res.paths[0]
    made["ground_truth"] = res.ground_truth
    try:
        import openslide

        with openslide.OpenSlide(str(res.paths[0])) as slide:
            vendor = slide.properties.get("openslide.vendor")
            thumb = out / "slide_thumbnail.png"
            slide.get_thumbnail((1024, 1024)).save(thumb)
        echo(f"      OpenSlide opens it as vendor '{vendor}'; thumbnail {thumb}")
        made["thumbnail"] = thumb
    except ImportError:
        echo("      (openslide-python is not installed: skipped the OpenSlide check)")
    echo(f"done in {time.perf_counter() - t0:.1f} s; everything is in {out}/")
    return made
