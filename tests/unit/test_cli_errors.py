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
