"""An argument given as a flag (``cyto predict CELLS --model M``, the way ``cyto score`` takes its
model) is named as the command's argument, with its usage (hostile round 15, case 21: click
said "No such option: --model (Possible options: --help)")."""

from __future__ import annotations

from tests.cli_runner import leaf_commands, run_cyto


def _arguments() -> list[tuple[list[str], str, list[str]]]:
    """(command path, an argument's name, the command's own flags) of every command that takes
    an argument with no flag of the same name."""
    found = []
    for path, cmd in leaf_commands():
        own = {o for p in cmd.params for o in p.opts}
        for p in cmd.params:
            flag = "--" + p.name.replace("_", "-")
            if p.param_type_name == "argument" and flag not in own:
                found.append((path, p.name, sorted(own)))
    return found


def test_every_argument_given_as_a_flag_is_named_with_the_usage(tmp_path):
    found = _arguments()
    assert any(path == ["predict"] and name == "model" for path, name, _ in found), found
    for path, name, _ in found:
        flag = "--" + name.replace("_", "-")
        proc = run_cyto(*path, flag, str(tmp_path / "x"))
        assert proc.returncode == 2, (path, proc.stderr)
        last = proc.stderr.strip().splitlines()[-1]
        cmd = " ".join(["cyto", *path])
        assert last.startswith(
            f"error: {cmd} takes {name} as an argument, not {flag}: usage {cmd} "
        )
        assert "Traceback" not in proc.stderr


def test_a_flag_a_command_has_is_not_called_an_argument(tmp_path):
    proc = run_cyto("predict", str(tmp_path / "m.cyto"), "--dat", str(tmp_path))
    assert proc.returncode == 2
    assert "as an argument" not in proc.stderr, proc.stderr


def test_an_option_of_the_python_api_only_is_said_so_not_matched_to_another_flag(tmp_path):
    """`cyto score S --chunk-cells 200`: click offered --burden-cells (round 15, case 21);
    chunk_cells= is an option of the Python API only (FLAGS: None), and is said so."""
    from cyto.flags import FLAGS

    for field in [f for f, flag in FLAGS.items() if flag is None and f != "echo"]:
        flag = "--" + field.replace("_", "-")
        proc = run_cyto("score", str(tmp_path / "s.tif"), flag, "1")
        assert proc.returncode == 2, proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert last == (
            f"error: {flag} is no flag of cyto score: {field}= is an option of cyto's Python "
            "API only (docs/reference/api.md)"
        ), last


def test_a_refusal_at_the_command_line_names_no_python_value():
    """ "--fdr must be a finite number or None": None is a Python caller's to give, and
    "n_normal must be >= 1" named no flag (hostile round 69, 8). The command line's words name
    flags and no None; a Python call's keep None."""
    import pytest

    from cyto.errors import ConfigError
    from cyto.flags import check_value, python_words

    with pytest.raises(ConfigError) as cli:
        check_value("fdr_alpha", float("nan"), float | None)
    assert str(cli.value) == "--fdr must be a finite number, got nan"
    with python_words("score_slide"), pytest.raises(ConfigError) as api:
        check_value("fdr_alpha", float("nan"), float | None)
    assert str(api.value) == "fdr_alpha= must be a finite number or None, got nan"
    made = run_cyto("synth", "patches", "p", "--n-normal", "-5", "--n-abnormal", "2")
    assert made.returncode == 2
    assert "error: --n-normal must be >= 1 and --n-abnormal >= 0, got -5 and 2" in made.stderr


def test_a_command_that_is_an_option_of_another_says_which():
    """Hostile round 76, 11: `cyto watch FOLDER` said only "No such command 'watch'"; watching
    is `cyto score FOLDER --watch`. Every such name is an option of the command it names."""
    from cyto.cli import AS_OPTIONS

    for name, words in AS_OPTIONS.items():
        proc = run_cyto(name, "folder")
        assert proc.returncode == 2, proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert last == f"error: No such command '{name}': {name} is {words}", last
        command = words.split("cyto ", 2)[2].split()[0]  # "... of cyto score: cyto score F"
        assert f"--{name}" in run_cyto(command, "--help").stdout
