"""Experiment trackers (agentbolt.trainer.trackers) against the real libraries, read back with each one's own reader.

One module-scoped job logs three steps (a NaN and an inf among the values) and a config through TensorBoard, MLflow
(SQLite under OUT/mlruns) and W&B (offline) via ``open_trackers``; the tests then read that OUT back with
TensorBoard's ``EventAccumulator``, ``MlflowClient`` and ``wandb leet inspect --json``. W&B runs offline with no
network and no account; NETRC points at a missing file so a developer's own ``wandb login`` cannot make it go online.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentbolt.errors import ConfigError
from agentbolt.trainer.trackers import (
    REPORT_TO_NAMES,
    MLflowTracker,
    TensorBoardTracker,
    TrackerSet,
    finite_metrics,
    flatten_config,
    open_trackers,
    validate_report_to,
    wandb_mode,
)

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")
pytest.importorskip("wandb")

RUN_NAME = "calc-test"
CONFIG: dict[str, object] = {
    "model": "qwen2.5-0.5b",
    "learning_rate": 0.0002,
    "eval_before": True,
    "report_to": ["tensorboard", "mlflow", "wandb"],
    "grpo": {"steps": 3, "group_size": 4, "advantage_estimator": "grpo"},
    "checkpoint_dir": None,
}
# Values exact in float32 (TensorBoard stores scalars as float32). NaN and inf are not curve points.
STEPS: dict[int, dict[str, float]] = {
    1: {"train_reward_mean": 0.25, "update_s": 3.5, "update_kl": 0.125},
    2: {"train_reward_mean": 0.5, "update_s": 4.0, "update_kl": math.nan},
    3: {"train_reward_mean": 0.75, "update_s": 2.25, "update_kl": math.inf},
}
EXPECTED: dict[str, list[tuple[int, float]]] = {
    "train_reward_mean": [(1, 0.25), (2, 0.5), (3, 0.75)],
    "update_s": [(1, 3.5), (2, 4.0), (3, 2.25)],
    "update_kl": [(1, 0.125)],
}


def _offline_env(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(home / "no-netrc"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.setenv("WANDB__DISABLE_STATS", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(home / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(home / "wandb-data"))


@pytest.fixture(scope="module")
def logged_out_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """OUT after a whole job: open all three trackers, three steps, close."""
    home = tmp_path_factory.mktemp("home")
    out_dir = tmp_path_factory.mktemp("out")
    with pytest.MonkeyPatch.context() as monkeypatch:
        _offline_env(monkeypatch, home)
        with open_trackers(list(REPORT_TO_NAMES), out_dir=out_dir, run_name=RUN_NAME, config=CONFIG) as trackers:
            assert trackers.names == REPORT_TO_NAMES
            for train_step, metrics in STEPS.items():
                trackers.log(metrics, train_step)
        assert trackers.failures == {"tensorboard": 0, "mlflow": 0, "wandb": 0}
        yield out_dir


def test_tensorboard_event_file_reads_back(logged_out_dir: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import (
        HParamsPluginData,  # pyright: ignore[reportAttributeAccessIssue]  (generated, no stubs)
    )

    log_dir = logged_out_dir / "tensorboard" / RUN_NAME
    accumulator = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    assert set(accumulator.Tags()["scalars"]) == set(EXPECTED)
    for name, points in EXPECTED.items():
        assert [(event.step, event.value) for event in accumulator.Scalars(name)] == points

    (text_event,) = accumulator.Tensors("config")
    text = text_event.tensor_proto.string_val[0].decode()
    assert text.startswith("```json\n") and text.endswith("\n```")
    assert json.loads(text.removeprefix("```json\n").removesuffix("\n```")) == CONFIG

    hparams_content = accumulator.PluginTagToContent("hparams")
    (content,) = hparams_content.values()
    hparams = HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["grpo.group_size"].number_value == 4
    assert hparams["model"].string_value == "qwen2.5-0.5b"
    assert hparams["eval_before"].bool_value is True


def test_mlflow_sqlite_store_reads_back(logged_out_dir: Path) -> None:
    from mlflow.tracking import MlflowClient

    db_path = logged_out_dir / "mlruns" / "mlflow.db"
    assert db_path.is_file()
    client = MlflowClient(tracking_uri=f"sqlite:///{db_path}")
    experiment = client.get_experiment_by_name("agentbolt")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == RUN_NAME
    assert run.info.status == "FINISHED"
    for name, points in EXPECTED.items():
        history = sorted(client.get_metric_history(run.info.run_id, name), key=lambda metric: metric.step)
        assert [(metric.step, metric.value) for metric in history] == points
    assert set(run.data.metrics) == set(EXPECTED)
    assert run.data.params == {key: str(value) for key, value in flatten_config(CONFIG).items()}
    assert run.data.params["grpo.group_size"] == "4"


def test_mlflow_tracking_uri_from_environment(
    logged_out_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLFLOW_TRACKING_URI wins over OUT/mlruns (here: the database the job above created, already migrated)."""
    uri = f"sqlite:///{logged_out_dir / 'mlruns' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    tracker = MLflowTracker(tmp_path, run_name="second", experiment_name="agentbolt-env")
    tracker.log({"train_reward_mean": 1.0}, 1)
    tracker.close(failed=True)
    assert tracker.tracking_uri == uri
    assert not (tmp_path / "mlruns").exists()

    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=uri).get_run(tracker.run_id)
    assert run.info.status == "FAILED"
    assert run.data.metrics == {"train_reward_mean": 1.0}


def _wandb_records(run_dir: Path) -> list[dict[str, object]]:
    """The records of an offline run, read by wandb's own reader (``wandb leet inspect --json``)."""
    completed = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [json.loads(line) for line in completed.stdout.splitlines() if line.strip()]


def test_wandb_offline_run_reads_back(logged_out_dir: Path) -> None:
    (run_dir,) = (logged_out_dir / "wandb").glob("offline-run-*")
    (log_file,) = run_dir.glob("run-*.wandb")
    assert log_file.stat().st_size > 0

    records = _wandb_records(run_dir)
    history: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        if record["type"] != "history":
            continue
        row = record["history"]
        assert isinstance(row, dict)
        for name, value in row["item"].items():
            if not name.startswith("_"):
                history.setdefault(name, []).append((row["step"]["num"], value))
    assert history == EXPECTED

    (run_record,) = [record["run"] for record in records if record["type"] == "run"]
    assert isinstance(run_record, dict)
    assert run_record["display_name"] == RUN_NAME
    assert run_record["project"] == "agentbolt"
    config_updates = [record["config"] for record in records if record["type"] == "config"]
    logged_config: dict[str, object] = {}
    for update in [run_record.get("config", {}), *config_updates]:
        assert isinstance(update, dict)
        logged_config.update(update.get("update", {}))
    assert {key: logged_config[key] for key in CONFIG} == CONFIG
    (exit_record,) = [record["exit"] for record in records if record["type"] == "exit"]
    assert isinstance(exit_record, dict)
    assert exit_record.get("exit_code", 0) == 0  # protobuf JSON leaves zero fields out


def test_unknown_name_lists_known_names() -> None:
    with pytest.raises(ConfigError) as raised:
        validate_report_to(["tensorboard", "comet"])
    message = str(raised.value)
    assert "'comet'" in message
    assert all(name in message for name in REPORT_TO_NAMES)
    with pytest.raises(ConfigError):
        open_trackers(["tensorbord"], out_dir=Path("unused"), run_name="x", config={})


def test_report_to_forms() -> None:
    assert validate_report_to(None) == ()
    assert validate_report_to([]) == ()
    assert validate_report_to("none") == ()
    assert validate_report_to("TensorBoard") == ("tensorboard",)
    assert validate_report_to(["wandb", "tensorboard", "wandb"]) == ("wandb", "tensorboard")


def test_empty_report_to_opens_nothing(tmp_path: Path) -> None:
    with open_trackers([], out_dir=tmp_path, run_name="x", config=CONFIG) as trackers:
        trackers.log({"train_reward_mean": 1.0}, 1)
    assert len(trackers) == 0
    assert list(tmp_path.iterdir()) == []


def test_missing_library_names_the_pip_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module set to None in sys.modules is one Python cannot import (importlib's own rule)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match=r"pip install 'agentbolt\[trackers\]'") as raised:
        open_trackers(["tensorboard", "wandb"], out_dir=tmp_path, run_name="x", config={})
    assert "wandb" in str(raised.value)
    assert not (tmp_path / "tensorboard").exists(), "nothing is opened before every library is found"

    monkeypatch.setitem(sys.modules, "alembic", None)
    with pytest.raises(ConfigError, match="alembic"):
        open_trackers(["mlflow"], out_dir=tmp_path, run_name="x", config={})


@dataclass
class RaisingTracker:
    """A tracker whose backend is gone: every call raises."""

    calls: int = 0

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.calls += 1
        raise ConnectionError("tracking server unreachable")

    def log_config(self, config: Mapping[str, object]) -> None:
        raise ConnectionError("tracking server unreachable")

    def close(self, *, failed: bool = False) -> None:
        raise ConnectionError("tracking server unreachable")


def test_failing_tracker_is_counted_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    broken = RaisingTracker()
    tensorboard = TensorBoardTracker(tmp_path / "tb")
    trackers = TrackerSet({"broken": broken, "tensorboard": tensorboard})
    with caplog.at_level(logging.WARNING, logger="agentbolt.trainer.trackers"):
        for train_step, metrics in STEPS.items():
            trackers.log(metrics, train_step)
        trackers.close()
        trackers.close()  # a second close does nothing
        trackers.log({"train_reward_mean": 1.0}, 4)  # after close: ignored, not a failure
    assert broken.calls == 3
    assert trackers.failures == {"broken": 4, "tensorboard": 0}  # 3 logs + 1 close
    first_failure = [record for record in caplog.records if "failed in log" in record.getMessage()]
    assert len(first_failure) == 1
    assert any("'broken': 4" in record.getMessage() for record in caplog.records)

    accumulator = EventAccumulator(str(tmp_path / "tb"))
    accumulator.Reload()
    assert [(event.step, event.value) for event in accumulator.Scalars("train_reward_mean")] == EXPECTED[
        "train_reward_mean"
    ]


def test_closed_writer_failure_is_counted(tmp_path: Path) -> None:
    tensorboard = TensorBoardTracker(tmp_path / "tb")
    tensorboard.close()
    trackers = TrackerSet({"tensorboard": tensorboard})
    trackers.log({"train_reward_mean": 0.5}, 1)
    trackers.log({"train_reward_mean": 0.5}, 2)
    assert trackers.failures == {"tensorboard": 2}


def test_only_finite_numbers_are_logged() -> None:
    assert finite_metrics({"a": 1, "b": math.nan, "c": -math.inf, "d": 2.5}) == {"a": 1.0, "d": 2.5}


def test_flatten_config() -> None:
    assert flatten_config(CONFIG) == {
        "model": "qwen2.5-0.5b",
        "learning_rate": 0.0002,
        "eval_before": True,
        "report_to": '["tensorboard", "mlflow", "wandb"]',
        "grpo.steps": 3,
        "grpo.group_size": 4,
        "grpo.advantage_estimator": "grpo",
        "checkpoint_dir": "None",
    }


def test_wandb_mode_offline_without_a_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _offline_env(monkeypatch, tmp_path)
    assert wandb_mode() == "offline"
    netrc_file = tmp_path / "netrc"
    netrc_file.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    monkeypatch.setenv("NETRC", str(netrc_file))
    assert wandb_mode() == "online"
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_mode() is None  # wandb reads WANDB_MODE itself


def test_module_imports_no_tracker_library_and_no_torch() -> None:
    code = (
        "import sys, agentbolt.trainer.trackers\n"
        "heavy = {'torch', 'tensorboard', 'mlflow', 'wandb'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
