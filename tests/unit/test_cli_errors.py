"""Bad CLI options fail with one clear line and exit code 2, before anything is loaded or written."""

from pathlib import Path

from typer.testing import CliRunner

from agentbolt.cli.main import app


def test_group_of_one_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["demo", "--steps", "1", "--group-size", "1", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "group_size=1" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "x").exists()


def test_unknown_model_is_refused_before_the_output_dir_is_made(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["demo", "--model", "nope", "--out", str(tmp_path / "y")])
    assert result.exit_code == 2
    assert "unknown embedded model 'nope'" in result.output
    assert not (tmp_path / "y").exists()


def test_unknown_store_url_is_refused() -> None:
    result = CliRunner().invoke(app, ["serve", "--store", "ftp://x", "--port", "0"])
    assert result.exit_code == 2
    assert "unknown store URL" in result.output


def test_a_port_out_of_range_is_refused() -> None:
    result = CliRunner().invoke(app, ["serve", "--store", "memory://", "--port", "99999"])
    assert result.exit_code == 2
    assert "port must be between 0 and 65535" in result.output and "Traceback" not in result.output


def test_a_file_that_is_not_a_sqlite_store_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_text("not a database")
    for target in (junk, tmp_path):  # a text file, and a folder
        result = CliRunner().invoke(app, ["serve", "--store", f"sqlite:///{target}", "--port", "0"])
        assert result.exit_code == 2, result.output
        assert f"cannot open the SQLite store file {target}" in result.output and "Traceback" not in result.output
    assert junk.read_text() == "not a database"  # left as it was


def test_a_runner_needs_the_address_of_a_server() -> None:
    result = CliRunner().invoke(app, ["run", "--agent", "examples.calc_agent.agent:calc_agent", "--store", "x.db"])
    assert result.exit_code == 2
    assert "must be the http(s):// address of an agentbolt server" in result.output


def test_an_output_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("x")
    result = CliRunner().invoke(app, ["demo", "--steps", "1", "--out", str(taken)])
    assert result.exit_code == 2
    assert "is a file" in result.output and "Traceback" not in result.output
    assert taken.read_text() == "x"


def test_a_cuda_device_on_a_machine_without_one_is_refused_before_writing(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():  # pragma: no cover - this check is for machines without a GPU
        return
    result = CliRunner().invoke(app, ["demo", "--steps", "1", "--device", "cuda", "--out", str(tmp_path / "z")])
    assert result.exit_code == 2
    assert "device 'cuda' is not available here" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "z").exists()


def test_error_text_keeps_its_brackets(tmp_path: Path) -> None:
    """An error's text is printed as plain text, not rich markup: ``'agentbolt[verl]'`` keeps its ``[verl]``."""
    config = tmp_path / "train.yaml"
    config.write_text(f"trainer: verl\nout_dir: {tmp_path / 'run'}\n")
    result = CliRunner().invoke(app, ["train", str(config)])
    assert result.exit_code == 2, result.output
    assert "pip install 'agentbolt[verl]'" in result.output and "Traceback" not in result.output


def test_a_bad_option_value_is_named_by_its_option(tmp_path: Path) -> None:
    """A value the options' config refuses names the option (was: only pydantic's reason, "Input should be ...")."""
    out = str(tmp_path / "x.jsonl")
    store = str(tmp_path / "s.db")
    result = CliRunner().invoke(app, ["export", "--store", store, "--kind", "foo", "--out", out])
    assert result.exit_code == 2 and "--kind: Input should be 'sft' or 'rl'" in result.output, result.output
    result = CliRunner().invoke(app, ["export", "--store", store, "--kind", "rl", "--format", "xml", "--out", out])
    assert result.exit_code == 2 and "--format: Input should be 'jsonl' or 'parquet'" in result.output
    result = CliRunner().invoke(app, ["export", "--store", store, "--kind", "rl", "--out", f"{tmp_path}/new/"])
    assert result.exit_code == 2 and "ends in a path separator: give a file name" in result.output, result.output
    assert not (tmp_path / "new").exists()  # found by a new-user pass: it wrote a file named "new"
    result = CliRunner().invoke(app, ["demo", "--group-size", "0", "--out", str(tmp_path / "d")])
    assert result.exit_code == 2 and "--group-size: Input should be greater than or equal to 1" in result.output
