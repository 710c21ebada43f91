"""Experiment trackers: the per-step training metrics sent to TensorBoard, MLflow or W&B (opt-in, ``report_to``).

The store keeps every metric whatever this module does; a tracker is a second copy, written through the tracker's
own library, for people who read their runs there (as TRL users do with ``report_to``). Nothing here imports torch,
and each tracker's library is imported only when that tracker is opened (``pip install 'agentbolt[trackers]'``).

How the training loop calls it (``train_step`` counts finished optimizer steps; 0 is "before training")::

    from agentbolt.trainer.trackers import open_trackers

    trackers = open_trackers(
        config.report_to,                          # e.g. ["tensorboard", "wandb"]; [] or "none" opens nothing
        out_dir=out_dir,                           # the job's output folder (OUT)
        run_name=run_name,                         # e.g. out_dir.name
        config=config.model_dump(mode="json"),     # logged once as hyper-parameters
    )
    try:
        for train_step in range(1, steps + 1):
            ...
            trackers.log({"train_reward_mean": 0.42, "update_s": 12.5}, train_step)
    except BaseException:
        trackers.close(failed=True)                # MLflow status FAILED, W&B exit code 1
        raise
    trackers.close()

or, the same, ``with open_trackers(...) as trackers: ...``. ``open_trackers`` raises ``ConfigError`` before any run is
created when a name is unknown or a library is missing; once open, ``log``/``log_config``/``close`` never raise: a
tracker that fails logs one warning and its later failures are only counted (``TrackerSet.failures``), so training
goes on. Values that are not finite numbers (NaN, inf) are skipped, as the store skips them. Several ``log`` calls
may share a step (train metrics, then ``val_*`` of the same step: W&B merges them into one row), but the step must
never go down (W&B drops a step below its last one). ``log`` and ``close`` are synchronous and take milliseconds (an
MLflow SQLite write, a TensorBoard flush, a W&B queue put); ``open_trackers`` takes seconds (``wandb.init`` ~2 s, a
new MLflow database ~5-10 s of schema migrations), so in an event loop that serves other work meanwhile run it with
``await asyncio.to_thread(open_trackers, ...)``. None of it is thread-safe: call from one thread at a time.

Where each tracker writes (OUT is ``out_dir``):

- ``tensorboard`` (the tensorboard package's event-file writer): ``OUT/tensorboard/<run_name>/events.out.tfevents.*``.
- ``mlflow`` (mlflow-skinny + SQLAlchemy + Alembic): ``sqlite:///OUT/mlruns/mlflow.db``, or ``MLFLOW_TRACKING_URI``.
- ``wandb``: ``OUT/wandb/offline-run-*``; offline unless ``WANDB_MODE`` is set or an API key is found
  (``WANDB_API_KEY``, or ``~/.netrc`` from ``wandb login``), so it needs no network and no account by default.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import netrc
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, Literal, Protocol
from urllib.parse import urlparse

from agentbolt.errors import ConfigError

logger = logging.getLogger(__name__)

REPORT_TO_NAMES: Final[tuple[str, ...]] = ("tensorboard", "mlflow", "wandb")
"""The tracker names ``report_to`` accepts (besides ``"none"``, which means no tracker)."""

INSTALL_HINT: Final = "pip install 'agentbolt[trackers]'"

DEFAULT_PROJECT: Final = "agentbolt"
"""The MLflow experiment / W&B project when neither the caller nor ``MLFLOW_EXPERIMENT_NAME`` / ``WANDB_PROJECT``
names one."""

# The modules each tracker imports; checked before any tracker is opened, so a missing one fails before a run exists.
_REQUIRED_MODULES: Final[dict[str, tuple[str, ...]]] = {
    "tensorboard": ("tensorboard",),
    "mlflow": ("mlflow",),
    "wandb": ("wandb",),
}
# The default MLflow store (SQLite under OUT/mlruns) also needs these; mlflow-skinny leaves them out.
_MLFLOW_SQL_MODULES: Final = ("sqlalchemy", "alembic")
_MLFLOW_MAX_PARAM_VALUE_CHARS: Final = 6000  # mlflow rejects longer param values
_MLFLOW_MAX_PARAMS_PER_BATCH: Final = 100
_MLFLOW_MAX_METRICS_PER_BATCH: Final = 1000
_MLFLOW_BAD_KEY_CHARS: Final = re.compile(r"[^\w\-. /]")  # mlflow allows letters, digits, _ - . space /

ConfigValue = str | int | float | bool
"""A flattened hyper-parameter value."""

WandbMode = Literal["online", "offline", "disabled"]


class Tracker(Protocol):
    """One experiment tracker. Implementations may raise from any method; ``TrackerSet`` contains the failures."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` (name -> value, the unit in the name) at ``step`` (the train step)."""
        ...

    def log_config(self, config: Mapping[str, object]) -> None:
        """Record the run's hyper-parameters, once, at the start. Nested mappings are allowed."""
        ...

    def close(self, *, failed: bool = False) -> None:
        """Flush and finish the run; ``failed`` marks it as failed where the tracker has such a status."""
        ...


def finite_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """The entries of ``metrics`` whose value is a finite number, as floats; NaN, inf and non-numbers are dropped."""
    kept: dict[str, float] = {}
    for name, value in metrics.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            kept[name] = number
    return kept


def flatten_config(config: Mapping[str, object], *, separator: str = ".") -> dict[str, ConfigValue]:
    """Flatten nested mappings to ``{"grpo.group_size": 4, ...}`` for trackers whose parameters are flat.

    Scalars (str, int, float, bool) are kept; ``None`` becomes ``"None"``; lists and other values become their JSON
    text (``str()`` for what JSON cannot encode).
    """
    flat: dict[str, ConfigValue] = {}

    def visit(prefix: str, value: object) -> None:
        if isinstance(value, Mapping):
            for key, inner in value.items():
                visit(f"{prefix}{separator}{key}" if prefix else str(key), inner)
        elif isinstance(value, str | int | float | bool):
            flat[prefix] = value
        elif value is None:
            flat[prefix] = "None"
        else:
            flat[prefix] = json.dumps(value, default=str)

    visit("", config)
    return flat


def _jsonable(config: Mapping[str, object]) -> dict[str, object]:
    """A JSON round trip of ``config`` (paths, enums and the like become strings)."""
    return json.loads(json.dumps(dict(config), default=str))


def _safe_dir_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "run"


class TensorBoardTracker:
    """Writes TensorBoard event files with the ``tensorboard`` package's own writer (no TensorFlow, no torch).

    Each metric is a scalar (the ``simple_value`` that TensorBoard's Scalars tab and ``EventAccumulator.Scalars``
    read) at ``step``; the config is a text summary ``config`` (JSON) plus an HParams session (flattened).
    Every ``log`` flushes, so a running ``tensorboard --logdir OUT/tensorboard`` shows each step when it ends.
    """

    def __init__(self, log_dir: Path) -> None:
        """Open an event file in ``log_dir`` (created). Raises ``ImportError`` when tensorboard is not installed."""
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(self.log_dir))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Write one event holding every finite metric as a scalar at ``step``, then flush."""
        # The generated protobuf modules ship without type stubs.
        from tensorboard.compat.proto.event_pb2 import Event  # pyright: ignore[reportAttributeAccessIssue]
        from tensorboard.compat.proto.summary_pb2 import Summary  # pyright: ignore[reportAttributeAccessIssue]

        values = [Summary.Value(tag=name, simple_value=v) for name, v in finite_metrics(metrics).items()]
        if not values:
            return
        event = Event(wall_time=time.time(), step=step, summary=Summary(value=values))
        self._writer.add_event(event)
        self._writer.flush()

    def log_config(self, config: Mapping[str, object]) -> None:
        """Write ``config`` as a text summary (JSON in a code block) and as HParams (flattened scalars)."""
        from tensorboard.compat.proto.event_pb2 import Event  # pyright: ignore[reportAttributeAccessIssue]
        from tensorboard.compat.proto.summary_pb2 import Summary  # pyright: ignore[reportAttributeAccessIssue]
        from tensorboard.compat.proto.tensor_pb2 import TensorProto  # pyright: ignore[reportAttributeAccessIssue]
        from tensorboard.compat.proto.tensor_shape_pb2 import (
            TensorShapeProto,  # pyright: ignore[reportAttributeAccessIssue]
        )
        from tensorboard.compat.proto.types_pb2 import DT_STRING  # pyright: ignore[reportAttributeAccessIssue]
        from tensorboard.plugins.hparams import summary_v2 as hparams_summary
        from tensorboard.plugins.text import metadata as text_metadata

        text = "```json\n" + json.dumps(_jsonable(config), indent=2, sort_keys=True) + "\n```"
        tensor = TensorProto(
            dtype=DT_STRING,
            string_val=[text.encode()],
            tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]),
        )
        text_value = Summary.Value(
            tag="config",
            tensor=tensor,
            metadata=text_metadata.create_summary_metadata(display_name="config", description="agentbolt config"),
        )
        now = time.time()
        self._writer.add_event(Event(wall_time=now, step=0, summary=Summary(value=[text_value])))
        hparams = hparams_summary.hparams_pb(flatten_config(config), start_time_secs=int(now))
        self._writer.add_event(Event(wall_time=now, step=0, summary=hparams))
        self._writer.flush()

    def close(self, *, failed: bool = False) -> None:
        """Flush and close the event file (``failed`` has no TensorBoard equivalent)."""
        del failed
        self._writer.close()


class MLflowTracker:
    """One MLflow run, written with ``MlflowClient`` (never the global ``mlflow.start_run``, so a user's own active
    run is left alone).

    Tracking URI: ``MLFLOW_TRACKING_URI`` when set (a server, Databricks, a database), else the SQLite file
    ``OUT/mlruns/mlflow.db`` with artifacts under ``OUT/mlruns/artifacts``. A new SQLite file takes a few seconds to
    create (MLflow's schema migrations). Metric names get characters MLflow refuses replaced by ``_``; config values
    longer than MLflow's 6000-character limit are cut.
    """

    def __init__(self, out_dir: Path, *, run_name: str, experiment_name: str) -> None:
        """Create (or reuse) experiment ``experiment_name`` and start run ``run_name`` in it.

        Raises:
            ImportError: mlflow (or, for the default SQLite store, sqlalchemy/alembic) is not installed.
            mlflow.exceptions.MlflowException: the tracking store refused (e.g. an unreachable server).
        """
        from mlflow.tracking import MlflowClient

        env_uri = os.environ.get("MLFLOW_TRACKING_URI")
        artifact_location: str | None = None
        if env_uri:
            self.tracking_uri = env_uri
        else:
            store_dir = Path(out_dir).resolve() / "mlruns"
            store_dir.mkdir(parents=True, exist_ok=True)
            self.tracking_uri = f"sqlite:///{store_dir / 'mlflow.db'}"
            artifact_location = (store_dir / "artifacts").as_uri()
        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        experiment = self._client.get_experiment_by_name(experiment_name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            experiment_id = self._client.create_experiment(experiment_name, artifact_location=artifact_location)
        self.experiment_id: str = experiment_id
        self.run_id: str = self._client.create_run(experiment_id, run_name=run_name).info.run_id

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log every finite metric at ``step`` in one batch (timestamps in ms, as MLflow stores them)."""
        from mlflow.entities import Metric

        timestamp_ms = int(time.time() * 1000)
        batch = [
            Metric(_MLFLOW_BAD_KEY_CHARS.sub("_", name), value, timestamp_ms, step)
            for name, value in finite_metrics(metrics).items()
        ]
        for start in range(0, len(batch), _MLFLOW_MAX_METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=batch[start : start + _MLFLOW_MAX_METRICS_PER_BATCH])

    def log_config(self, config: Mapping[str, object]) -> None:
        """Log ``config`` flattened (``grpo.group_size``) as run parameters (strings, as MLflow keeps them)."""
        from mlflow.entities import Param

        params = [
            Param(_MLFLOW_BAD_KEY_CHARS.sub("_", key), str(value)[:_MLFLOW_MAX_PARAM_VALUE_CHARS])
            for key, value in flatten_config(config).items()
        ]
        for start in range(0, len(params), _MLFLOW_MAX_PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, params=params[start : start + _MLFLOW_MAX_PARAMS_PER_BATCH])

    def close(self, *, failed: bool = False) -> None:
        """End the run with status ``FINISHED`` (or ``FAILED``)."""
        self._client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


def wandb_api_key_found() -> bool:
    """True when ``WANDB_API_KEY`` is set or ``~/.netrc`` has an entry for the W&B host (``WANDB_BASE_URL``'s host,
    else ``api.wandb.ai``), as ``wandb login`` writes. Never raises; an unreadable netrc counts as no key."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    try:
        entry = netrc.netrc(os.environ.get("NETRC")).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def wandb_mode() -> WandbMode | None:
    """The mode ``WandbTracker`` passes to ``wandb.init``: ``None`` when ``WANDB_MODE`` is set (wandb reads it
    itself), else ``"online"`` with an API key (``wandb_api_key_found``) and ``"offline"`` without one."""
    if os.environ.get("WANDB_MODE"):
        return None
    return "online" if wandb_api_key_found() else "offline"


class WandbTracker:
    """One W&B run (``wandb.init(..., reinit="create_new")``, so a user's own ``wandb.run`` is left alone).

    Files go to ``OUT/wandb/`` (``dir=OUT``): ``offline-run-<time>-<id>/run-<id>.wandb`` in offline mode, which needs
    no network and no account; upload it later with ``wandb sync``. The mode is ``wandb_mode()``.
    """

    def __init__(self, out_dir: Path, *, run_name: str, project: str, mode: WandbMode | None = None) -> None:
        """Start the run. ``mode`` (``"offline"``, ``"online"``, ``"disabled"``) overrides ``wandb_mode()``.

        Raises:
            ImportError: wandb is not installed.
            wandb.errors.Error: ``wandb.init`` failed (e.g. online mode without network or with a bad key).
        """
        import wandb

        self.out_dir = Path(out_dir).resolve()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        chosen = mode if mode is not None else wandb_mode()
        if chosen is None:  # WANDB_MODE is set; wandb reads it
            settings = wandb.Settings(reinit="create_new")
        else:
            settings = wandb.Settings(mode=chosen, reinit="create_new")
        self._run = wandb.init(project=project, name=run_name, dir=str(self.out_dir), settings=settings)

    @property
    def run_dir(self) -> Path:
        """The run's folder (``OUT/wandb/offline-run-*`` offline, ``OUT/wandb/run-*`` online)."""
        return Path(self._run.dir).parent

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log every finite metric at ``step``; W&B commits a step's row when a later step arrives or at ``close``, so
        several calls with the same step make one row."""
        values = finite_metrics(metrics)
        if values:
            self._run.log(values, step=step)

    def log_config(self, config: Mapping[str, object]) -> None:
        """Merge ``config`` (nested mappings kept) into ``run.config``."""
        self._run.config.update(_jsonable(config), allow_val_change=True)

    def close(self, *, failed: bool = False) -> None:
        """Finish the run (exit code 1 when ``failed``), which writes the last step's row."""
        self._run.finish(exit_code=1 if failed else 0)


class TrackerSet:
    """Fans each call out to several trackers and contains their failures.

    ``log``, ``log_config`` and ``close`` never raise (``Exception`` only; ``KeyboardInterrupt`` goes through): the
    first failure of a tracker is logged as a warning with its traceback, later ones are counted in ``failures``.
    After ``close`` the set ignores further calls. An empty set does nothing.
    """

    def __init__(self, trackers: Mapping[str, Tracker]) -> None:
        """``trackers``: name -> tracker, in the order calls are made."""
        self._trackers = dict(trackers)
        self._failures: dict[str, int] = dict.fromkeys(self._trackers, 0)
        self._closed = False

    @property
    def names(self) -> tuple[str, ...]:
        """The trackers' names, in call order."""
        return tuple(self._trackers)

    @property
    def failures(self) -> dict[str, int]:
        """Failed calls per tracker name (a copy)."""
        return dict(self._failures)

    def __len__(self) -> int:
        return len(self._trackers)

    def __iter__(self) -> Iterator[str]:
        return iter(self._trackers)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Send the finite entries of ``metrics`` at ``step`` (the train step) to every tracker."""
        values = finite_metrics(metrics)
        if not values:
            return
        self._each("log", lambda tracker: tracker.log(values, step))

    def log_config(self, config: Mapping[str, object]) -> None:
        """Send the hyper-parameters to every tracker (``open_trackers`` already did, once)."""
        self._each("log_config", lambda tracker: tracker.log_config(config))

    def close(self, *, failed: bool = False) -> None:
        """Close every tracker once (``failed`` marks the runs failed); warns when any call had failed."""
        if self._closed:
            return
        self._each("close", lambda tracker: tracker.close(failed=failed))
        self._closed = True
        failed_calls = {name: n for name, n in self._failures.items() if n}
        if failed_calls:
            logger.warning("experiment trackers: failed calls during the run: %s", failed_calls)

    def __enter__(self) -> TrackerSet:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close(failed=exc_type is not None)

    def _each(self, method: str, call: Callable[[Tracker], None]) -> None:
        if self._closed:
            return
        for name, tracker in self._trackers.items():
            try:
                call(tracker)
            except Exception:
                self._failures[name] += 1
                if self._failures[name] == 1:
                    logger.warning(
                        "experiment tracker %r failed in %s; training goes on, its later failures are only counted",
                        name,
                        method,
                        exc_info=True,
                    )


def validate_report_to(report_to: str | Sequence[str] | None) -> tuple[str, ...]:
    """Normalize ``report_to`` (a name, a list of names, ``"none"``, ``[]`` or ``None``) to known names.

    Names are matched case-insensitively and repeats are dropped, order kept. Does not import any tracker library,
    so a config can be checked when it is parsed.

    Raises:
        ConfigError: a name that is not in ``REPORT_TO_NAMES`` (the message lists them).
    """
    if report_to is None:
        return ()
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    normalized: list[str] = []
    for raw in names:
        name = str(raw).strip().lower()
        if name == "none" and len(names) == 1:
            return ()
        if name not in REPORT_TO_NAMES:
            known = ", ".join(REPORT_TO_NAMES)
            raise ConfigError(f"report_to: unknown tracker {raw!r}; known: {known} (or none)")
        if name not in normalized:
            normalized.append(name)
    return tuple(normalized)


def _check_installed(name: str, *, default_mlflow_store: bool) -> None:
    modules = _REQUIRED_MODULES[name]
    if name == "mlflow" and default_mlflow_store:
        modules += _MLFLOW_SQL_MODULES
    missing = [module for module in modules if importlib.util.find_spec(module) is None]
    if missing:
        raise ConfigError(
            f"report_to: {name} needs the Python package(s) {', '.join(missing)}, which are not installed: "
            f"{INSTALL_HINT} (or drop {name} from report_to)"
        )


def open_trackers(
    report_to: str | Sequence[str] | None,
    *,
    out_dir: Path,
    run_name: str,
    config: Mapping[str, object],
    project: str | None = None,
) -> TrackerSet:
    """Open the trackers named in ``report_to``, log ``config`` to each once, and return them as one ``TrackerSet``.

    Args:
        report_to: names from ``REPORT_TO_NAMES`` (see ``validate_report_to``); empty or ``"none"`` returns an empty
            set that does nothing.
        out_dir: the job's output folder; TensorBoard writes ``out_dir/tensorboard/<run_name>/``, MLflow
            ``out_dir/mlruns/`` (unless ``MLFLOW_TRACKING_URI`` is set), W&B ``out_dir/wandb/``.
        run_name: the run's name in each tracker (and TensorBoard's sub-folder, with unsafe characters replaced).
        config: hyper-parameters (nested mappings allowed; JSON-like values), e.g.
            ``TrainConfig.model_dump(mode="json")``.
        project: MLflow experiment and W&B project; default ``MLFLOW_EXPERIMENT_NAME`` / ``WANDB_PROJECT``, else
            ``"agentbolt"``.

    Raises:
        ConfigError: an unknown name, or a tracker whose library is not installed (the message gives the pip
            command). Checked for every name before any tracker is opened.
        Exception: whatever a tracker's library raises while starting its run (an unreachable MLflow server, W&B
            online mode without network); trackers opened before it are closed first.
    """
    names = validate_report_to(report_to)
    default_mlflow_store = not os.environ.get("MLFLOW_TRACKING_URI")
    for name in names:
        _check_installed(name, default_mlflow_store=default_mlflow_store)
    out_dir = Path(out_dir)
    opened: dict[str, Tracker] = {}
    try:
        for name in names:
            if name == "tensorboard":
                opened[name] = TensorBoardTracker(out_dir / "tensorboard" / _safe_dir_name(run_name))
            elif name == "mlflow":
                experiment = project or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
                opened[name] = MLflowTracker(out_dir, run_name=run_name, experiment_name=experiment)
            else:
                wandb_project = project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
                opened[name] = WandbTracker(out_dir, run_name=run_name, project=wandb_project)
    except BaseException:
        TrackerSet(opened).close(failed=True)
        raise
    trackers = TrackerSet(opened)
    trackers.log_config(config)
    return trackers
