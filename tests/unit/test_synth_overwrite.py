"""`cyto synth slide --overwrite` replaces only a synthetic slide's own files (a hostile check:
a user's own `u.cells.parquet` beside the slide name was refused without saying cyto did not
write it, and `--overwrite` then replaced it)."""

from __future__ import annotations

import pytest

from cyto.data.synth.slide import SlideSynthConfig, ground_truth_path, synthetic_file, write_slide
from cyto.errors import InputPathError


@pytest.mark.parametrize("suffix", [".tif", ".ndpi"])
def test_overwrite_replaces_its_own_slide_and_refuses_a_users_file(tmp_path, suffix):
    config = SlideSynthConfig(width=512, height=512, n_cells=20, seed=1)
    out = tmp_path / f"s{suffix}"
    write_slide(out, config, workers=1)
    assert synthetic_file(out) and synthetic_file(ground_truth_path(out))
    write_slide(out, config, overwrite=True, workers=1)  # its own: replaced
    user = tmp_path / f"u{suffix}"
    ground_truth_path(user).write_text("my notes\n")
    with pytest.raises(InputPathError, match="that cyto did not write") as err:
        write_slide(user, config, overwrite=True, workers=1)
    assert "u.cells.parquet" in str(err.value) and "\n" not in str(err.value)
    assert ground_truth_path(user).read_text() == "my notes\n"
    assert not synthetic_file(ground_truth_path(user))
    # without overwrite too, at once: the advice to pass overwrite came first, which then
    # refused it (hostile round 28, 13)
    with pytest.raises(InputPathError, match="that cyto did not write") as err:
        write_slide(user, config, workers=1)
    assert "exists (pass" not in str(err.value)


def _race(monkeypatch, module, step: str, write) -> dict:
    """Two runs of ``write(seed)`` at once: the first held inside ``module.step`` (a step it
    takes after its checks) until the second has started; {"first": ..., "second": ...}: what
    each returned, or the InputPathError it raised."""
    import threading

    real, first_in, go = getattr(module, step), threading.Event(), threading.Event()

    def held(*args, **kwargs):
        if threading.current_thread().name == "first" and not first_in.is_set():
            first_in.set()
            go.wait(10)  # the second run starts while the first writes
        return real(*args, **kwargs)

    monkeypatch.setattr(module, step, held)
    results: dict = {}

    def run(name, seed):
        try:
            results[name] = write(seed)
        except InputPathError as exc:
            results[name] = exc

    a = threading.Thread(target=run, args=("first", 1), name="first")
    a.start()
    assert first_in.wait(10)
    b = threading.Thread(target=run, args=("second", 2), name="second")
    b.start()
    b.join(0.5)  # it waits on the first run's lock
    go.set()
    a.join(60)
    b.join(60)
    return results


def test_two_runs_into_one_folder_at_once_write_one_dataset_and_refuse_the_other(
    tmp_path, monkeypatch
):
    """A hostile check (round 3): two `cyto synth patches OUT` at once both said "wrote 90
    patches" and the folder held one seed's images. The later one now waits for the first and
    is refused as a later run is; the folder is the first run's, whole."""
    import cyto.data.synth.patches as patches
    from cyto.data.synth.patches import PatchSynthConfig, write_patches

    out = tmp_path / "ds"
    results = _race(monkeypatch, patches, "render_patch", lambda seed: write_patches(
        out, PatchSynthConfig(n_normal=3, n_abnormal=0, size=32, seed=seed)))  # fmt: skip
    assert results["first"] == {"normal": 3}
    assert isinstance(results["second"], InputPathError) and "exists" in str(results["second"])
    monkeypatch.undo()
    alone = tmp_path / "alone"
    write_patches(alone, PatchSynthConfig(n_normal=3, n_abnormal=0, size=32, seed=1))
    for f in sorted((alone / "normal").iterdir()):
        assert (out / "normal" / f.name).read_bytes() == f.read_bytes()


def test_two_slides_written_to_one_path_at_once_keep_one_and_refuse_the_other(
    tmp_path, monkeypatch
):
    """A hostile check (round 4): two `cyto synth slide OUT` at once both said "wrote" and one
    run's slide was lost (as `synth patches` did in round 3): the later one waits and is refused."""
    import cyto.data.synth.slide as slide

    out = tmp_path / "s.tif"
    results = _race(monkeypatch, slide, "layout", lambda seed: write_slide(
        out, SlideSynthConfig(width=512, height=512, seed=seed), workers=0))  # fmt: skip
    assert not isinstance(results["first"], Exception)
    assert isinstance(results["second"], InputPathError) and "exists" in str(results["second"])


def test_a_drawn_slide_s_option_with_cells_lists_every_option_a_composed_slide_takes(tmp_path):
    """The refusal listed --normal ... --height but not --seed, --tile or --quality, which a
    composed slide takes (hostile round 7, H47): every flag of `cyto synth slide` is a drawn
    slide's (refused, named), a composed slide's (listed), or every slide's."""
    import click
    import typer

    from cyto.cli import app
    from tests.cli_runner import run_cyto

    proc = run_cyto(
        "synth", "slide", str(tmp_path / "x.tif"), "--cells", str(tmp_path), "--normal", "NILM",
        "--mpp", "0.25", "--classes", "a", "--planes", "-1,0", "--defocus", "1", "--scale", "3",
        "--smear-extent", "0.2", "--stain-seed", "1",
    )  # fmt: skip
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    refused, taken = line.removeprefix("error: ").split(": options of a drawn slide; ")
    one = run_cyto("synth", "slide", str(tmp_path / "x.tif"), "--cells", str(tmp_path),
                   "--normal", "NILM", "--mpp", "0.25", "--scale", "3")  # fmt: skip
    assert one.stderr.startswith("error: --scale: an option of a drawn slide; "), one.stderr
    assert taken.startswith("a slide composed from --cells takes ")
    taken, every = taken.removeprefix("a slide composed from --cells takes ").split(
        ", and every slide's "
    )
    taken, every = (set(t.replace(" and ", ", ").split(", ")) for t in (taken, every))
    assert {"--seed", "--tile", "--quality"} <= taken
    command = typer.main.get_command(app)
    for part in ("synth", "slide"):
        command = command.get_command(click.Context(command), part)
    flags = {o for p in command.params for o in p.opts if o.startswith("--")}
    assert every == {"--format", "--workers", "--overwrite"}  # named too (round 68, nit)
    assert set(refused.split(", ")) | taken | every | {"--cells"} == flags
    assert not set(refused.split(", ")) & (taken | every)
