"""The CLI edge: one clear line for library errors, a traceback only with CYTO_DEBUG=1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_runner import run_cyto


def test_missing_path_is_one_line_and_exit_2(tmp_path):
    proc = run_cyto("data", "info", str(tmp_path / "nope"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "does not exist" in lines[0] and "nope" in lines[0]
    assert "Traceback" not in proc.stderr


def test_empty_folder_error(tmp_path):
    proc = run_cyto("data", "info", str(tmp_path))
    assert proc.returncode == 2
    assert "empty folder" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_folder_without_images_error(tmp_path):
    (tmp_path / "LYT").mkdir()
    (tmp_path / "LYT" / "notes.txt").write_text("no images here")
    proc = run_cyto("data", "info", str(tmp_path))
    assert proc.returncode == 2
    assert "no images found" in proc.stderr


def test_unknown_class_name_lists_known_ones(synth_patches):
    proc = run_cyto("data", "info", str(synth_patches), "--normal", "normal", "--abnormal", "blast")
    assert proc.returncode == 2
    assert "unknown class name(s) --abnormal blast in" in proc.stderr
    assert "enlarged" in proc.stderr and "normal" in proc.stderr


def test_an_unknown_class_is_named_by_its_option_and_a_case_slip_answered(synth_patches):
    """Hostile round 26 (12): `normal="nilm"` for NILM/ read "unknown class name(s) nilm",
    naming neither the option nor the class meant. The option is named in the caller's words,
    a name that differs only in case is offered, every wrong name is said."""
    from cyto.data.dataset import PatchDataset
    from cyto.errors import DatasetError
    from cyto.flags import python_words

    proc = run_cyto("data", "info", str(synth_patches), "--normal", "NORMAL", "--abnormal",
                    "Enlarged,blast")  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "unknown class name(s) --normal NORMAL (did you mean normal?), --abnormal Enlarged " in (
        line
    )
    assert "(did you mean enlarged?), --abnormal blast in " in line, line
    with python_words("train"), pytest.raises(DatasetError) as err:
        PatchDataset.from_path(synth_patches, normal="Normal")
    assert "unknown class name(s) normal='Normal' (did you mean normal?)" in str(err.value)


def test_debug_shows_traceback(tmp_path):
    proc = run_cyto("data", "info", str(tmp_path / "nope"), env={"CYTO_DEBUG": "1"})
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr
    assert "InputPathError" in proc.stderr


@pytest.mark.realdata
def test_data_info_on_real_bone_marrow(bone_marrow):
    proc = run_cyto(
        "data",
        "info",
        str(bone_marrow),
        "--normal",
        "LYT",
        "--abnormal",
        "BLA,PMO,EOS,MON",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["files"] == 800
    assert info["classes"] == {"BLA": 100, "EOS": 20, "LYT": 600, "MON": 20, "PMO": 60}
    assert info["sizes"] == {"250x250": 800}
    assert info["unreadable"] == []
    assert info["split"]["normal"] == 600 and info["split"]["abnormal"] == 200


@pytest.mark.realdata
def test_data_info_table_on_real_bone_marrow(bone_marrow):
    proc = run_cyto("data", "info", str(bone_marrow))
    assert proc.returncode == 0
    assert "800 files, 5 classes" in proc.stdout
    assert "LYT" in proc.stdout and "600" in proc.stdout


def test_data_info_lists_unreadable_file(tmp_path, synth_patches):
    import shutil

    data = tmp_path / "d"
    shutil.copytree(synth_patches / "normal", data / "normal")
    bad = data / "normal" / "broken.jpg"
    bad.write_bytes(b"not a jpeg at all")
    proc = run_cyto("data", "info", str(data), "--json")
    assert proc.returncode == 0
    info = json.loads(proc.stdout)
    assert [Path(u["path"]).name for u in info["unreadable"]] == ["broken.jpg"]


def test_synth_patches_cli(tmp_path):
    out = tmp_path / "p"
    proc = run_cyto(
        "synth",
        "patches",
        str(out),
        "--n-normal",
        "3",
        "--n-abnormal",
        "1",
        "--classes",
        "enlarged,coarse",
        "--size",
        "64",
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["coarse", "enlarged", "normal"]
    # the resolution the patches are drawn at, to train with (0.18 um/px at scale 1)
    assert "at 0.12 um/px" in proc.stdout and "--set mpp=0.12" in proc.stdout
    again = run_cyto("synth", "patches", str(out), "--n-normal", "3")
    assert again.returncode == 2 and "--overwrite" in again.stderr


def test_synth_patches_rejects_unknown_class(tmp_path):
    proc = run_cyto("synth", "patches", str(tmp_path / "p"), "--classes", "blast")
    assert proc.returncode == 2
    assert "unknown abnormal class(es) blast" in proc.stderr


def test_synth_slide_cli_errors(tmp_path):
    proc = run_cyto("synth", "slide", str(tmp_path / "slide.png"))
    assert proc.returncode == 2 and ".ndpi" in proc.stderr
    proc = run_cyto("synth", "slide", str(tmp_path / "s.tif"), "--abnormal-fraction", "2")
    assert proc.returncode == 2 and "--abnormal-fraction must be in" in proc.stderr
    proc = run_cyto("synth", "slide", str(tmp_path / "s.tif"), "--planes", "1,2")
    assert proc.returncode == 2 and "include 0.0" in proc.stderr


def test_data_mosaic_cli(tmp_path, synth_patches):
    out = tmp_path / "new" / "m.png"  # a folder that does not exist yet is made
    proc = run_cyto(
        "data", "mosaic", str(synth_patches), "--out", str(out), "--per-class", "3", "--tile", "32"
    )
    assert proc.returncode == 0, proc.stderr
    from PIL import Image

    with Image.open(out) as im:
        assert im.width == 130 + 3 * 32
        assert im.height == 24 + 7 * 32  # title + one row per class
    bad = run_cyto("data", "mosaic", str(synth_patches), "--out", str(tmp_path / "m"))
    assert bad.returncode == 2 and bad.stderr.startswith("error: --out ")
    assert "a mosaic is a .png, .jpg or .jpeg file" in bad.stderr
    # stopped while the PNG is written (a full disk): the last mosaic stays whole
    before = out.read_bytes()

    def disk_full(self, fp, *args, **kwargs):
        (fp.write if hasattr(fp, "write") else Path(fp).write_bytes)(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    real = Image.Image.save
    Image.Image.save = disk_full
    try:
        full = run_cyto(
            "data", "mosaic", str(synth_patches), "--out", str(out), "--seed", "1", "--overwrite"
        )
    finally:
        Image.Image.save = real
    assert full.returncode == 1 and "disk is full" in full.stderr, full.stderr
    assert out.read_bytes() == before and sorted(p.name for p in out.parent.iterdir()) == ["m.png"]


def test_slides_of_one_name_are_told_apart_in_the_expert_table():
    """Two slides named alike showed as identical rows (issue 35): the table names as many
    folders as tell them apart, and a unique name alone."""
    from cyto.review.report import slide_names

    got = slide_names(
        {"c1": "/data/a/slide.ndpi", "c2": "/data/b/slide.ndpi", "c3": "/data/b/other.svs"}
    )
    assert got == {"c1": "a/slide.ndpi", "c2": "b/slide.ndpi", "c3": "other.svs"}
    deep = slide_names({"c1": "/x/run/a/s.tif", "c2": "/y/run/a/s.tif"})
    assert deep == {"c1": "x/run/a/s.tif", "c2": "y/run/a/s.tif"}


def test_every_command_the_readme_shows_exists_with_its_options():
    """A command or option renamed in the code and not in the README or the guides fails a
    reader who copies it: every ``cyto ...`` line of the code blocks of the README, the
    tutorials and the how-to guides names a command and its options."""
    import re
    import shlex

    import typer.main

    from cyto.cli import app

    root = typer.main.get_command(app)
    repo = Path(__file__).resolve().parents[2]
    pages = [repo / "README.md", *sorted((repo / "docs").glob("tutorials/*.md"))]
    pages += sorted((repo / "docs").glob("how-to/*.md"))
    blocks = []
    for page in pages:  # fenced blocks of shell or plain text, each page on its own
        lang, lines = None, []
        for raw in page.read_text().splitlines():
            fence = re.match(r"\s*```(\S*)", raw)
            if fence and lang is None:
                lang, lines = fence.group(1), []
            elif fence:
                if lang in ("", "bash", "sh", "console", "text"):
                    blocks.append("\n".join(lines) + "\n")
                lang = None
            elif lang is not None:
                lines.append(raw)
    checked = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if not line.startswith("cyto "):
                continue
            args = shlex.split(line.split(" #")[0])[1:]
            cmd = root
            while hasattr(cmd, "commands") and args and not args[0].startswith("-"):
                # 'cyto review DIR' is 'cyto review serve DIR'
                cmd = cmd.commands.get(args[0]) or cmd.commands.get("serve")
                assert cmd is not None, f"no such command in {line!r}"
                if cmd.name == args[0]:
                    args.pop(0)
            if hasattr(cmd, "commands"):  # 'cyto --help'
                continue
            known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
            for a in args[: args.index("&&")] if "&&" in args else args:
                assert not a.startswith("--") or a.split("=")[0] in known, (line, a)
            checked.append(line)
    assert len(checked) >= 25  # the quick start, the tutorials' and the guides' examples


def _commands(cmd, path=()):
    yield path, cmd
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from _commands(sub, (*path, name))


def test_every_help_reads_on_an_80_column_terminal():
    """Each command's --help at 80 columns: the description's paragraphs flow (every line as
    full as its next word allows, not broken where the source broke), no line wider than the
    terminal, and every command in a list described whole, never cut off with '...'."""
    import typer

    from cyto.cli import app

    root = typer.main.get_command(app)
    seen = 0
    for path, _ in _commands(root):
        proc = run_cyto(*path, "--help", env={"COLUMNS": "80"})
        assert proc.returncode == 0, (path, proc.stderr)
        lines = [line.rstrip() for line in proc.stdout.splitlines()]
        assert all(len(line) <= 80 for line in lines), (path, max(lines, key=len))
        usage = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage:"))
        end = next(i for i, line in enumerate(lines) if i > usage and _section(line))
        para: list[str] = []
        for line in [*lines[usage + 1 : end], ""]:
            if line.strip():
                para.append(line.strip())
                continue
            for a, b in zip(para, para[1:], strict=False):  # b's first word did not fit on a's line
                assert len(a) + 1 + len(b.split()[0]) > 76, (path, a, b)
            para = []
        listed = lines[end:]
        assert not [line for line in listed if line.strip("│ ").endswith("...")], path
        seen += 1
    assert seen >= 25


def test_no_word_of_a_help_text_is_longer_than_its_column():
    """A word longer than the help's column (about 53 characters at any terminal width: the
    help is at most 80 wide, options take the first 25) is cut in the middle where it reaches
    the edge: `dicomweb+https://SERVER/PRE` / `FIX/studies/...` (hostile round 52). Every
    option's and argument's help, of every command, holds only words that fit."""
    import typer

    from cyto.cli import app

    root = typer.main.get_command(app)
    long = []
    for path, command in _commands(root):
        for param in command.params:
            for word in (getattr(param, "help", None) or "").split():
                if len(word) > 50:
                    long.append((" ".join(path), param.name, word))
    assert not long, long


def _section(line: str) -> bool:
    """A help section's first line: 'Options:' (click) or '╭─ Options ───╮' (rich)."""
    return line.startswith("╭") or (bool(line) and line[0] != " " and line.endswith(":"))


def test_a_usage_error_is_one_line_without_a_box():
    proc = run_cyto("score", "slide.ndpi", env={"COLUMNS": "80"})
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert errors == ["error: Missing option '--model'."], proc.stderr
    assert not set("╭│╰") & set(proc.stderr)


def test_every_usage_error_is_said_as_cyto_says_every_refusal():
    """click's usage errors said `Error: ...` and cyto's own refusals `error: ...` (hostile
    rounds 28 and 29): every command's usage error, an unknown command and a value click
    cannot read, is one `error:` line after the usage and its hint, exit status 2."""
    from tests.cli_runner import leaf_commands

    cases = [[*path, "--no-such-flag"] for path, _ in leaf_commands()]
    cases += [["nosuch"], ["synth", "nosuch"], ["eval", "scores", "t.parquet", "--json", "x"]]
    for args in cases:
        proc = run_cyto(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert lines[-1].startswith("error: ") and not lines[-1].startswith("error: error"), args
        assert [line for line in lines if "error:" in line.lower()] == [lines[-1]], args
        assert lines[0].startswith("Usage: cyto"), (args, lines)


def test_the_help_of_scoring_names_every_kind_of_url_cyto_reads_slides_from():
    """`cyto score --help` and ``cyto.score_slide``'s docstring named s3, gs and https URLs, not
    the DICOMweb ones that work as well (hostile round 49, 5): every scheme cyto reads slides
    from is named in both."""
    import re

    import cyto
    from cyto.slides.remote import DICOMWEB_SCHEMES, SCHEMES

    helped = run_cyto("score", "--help", env={"COLUMNS": "200"}).stdout
    helped = re.sub(r"\s*│\s*", " ", helped)  # the help's box, its lines joined
    for scheme in [*SCHEMES.keys() - {"gcs", "http"}, *DICOMWEB_SCHEMES[1:]]:
        assert f"{scheme}://" in helped, scheme
        assert f"{scheme}://" in cyto.score_slide.__doc__, scheme
