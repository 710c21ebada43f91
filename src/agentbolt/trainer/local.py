"""Everything one machine needs to train an agent with the embedded model: the machinery behind ``agentbolt demo``.

:func:`local_training` starts, in this order, and stops in reverse: the embedded model (served by the
:class:`~agentbolt.inference.embedded.EmbeddedBackend` and trained with LoRA by the ``torch`` backend, sharing one set
of weights), a SQLite store file, the server (store API + gateway) on a free loopback port, runner processes that
execute the agent against the gateway, and the :class:`~agentbolt.trainer.loop.RLTrainer` that drives them. Callers
only pick tasks and call ``trainer.train_step`` / ``trainer.evaluate``.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import shutil
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rich.console import Console

from agentbolt.config import GRPOConfig
from agentbolt.errors import BackendError, ConfigError
from agentbolt.inference.openmp_threads import run_then_release

if TYPE_CHECKING:
    from torch.nn import Module

    from agentbolt.algorithms.rl.torch_backend import TorchPolicyTrainer, TorchTrainerConfig
    from agentbolt.inference.embedded import EmbeddedBackend
    from agentbolt.runner.processes import RunnerPool
    from agentbolt.server.gateway.swap import WeightSwapGate
    from agentbolt.store.sqlite import SqliteLightningStore
    from agentbolt.trainer.job_config import InferenceConfig
    from agentbolt.trainer.loop import RLTrainer

logger = logging.getLogger(__name__)

INT8_TIS_CAP = 2.0
"""``tis_cap`` a job sets when ``inference.quantization`` is ``int8`` and the trainer settings leave it unset: the
cap of truncated importance sampling (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
Training", which uses C = 2 for a vLLM sampler against an FSDP trainer)."""


@dataclass
class LocalTraining:
    """What :func:`local_training` started.

    Attributes:
        trainer: the RL loop over the store (its ``updater`` owns the LoRA policy).
        store: the SQLite store (``db_path``).
        backend: the embedded inference backend (its ``stats`` count generated tokens).
        url: the server's root URL (store API and gateway).
        model_setup_s: seconds spent preparing and loading the model.
        updater: the torch trainer backend that owns the LoRA policy (``trainer.updater``; ``save_state`` writes a
            checkpoint's weights).
        runners: the runner processes (a stopping job ends them with :func:`stop_runners` before it cancels the
            rollouts they hold).
        unscoped_calls / runner_exits: as in :class:`LocalServing`.
    """

    trainer: RLTrainer
    store: SqliteLightningStore
    backend: Any
    url: str
    model_setup_s: float
    updater: TorchPolicyTrainer
    runners: RunnerPool
    unscoped_calls: Callable[[], int]
    runner_exits: list[dict[str, Any]]


class MachineSettings(Protocol):
    """What a job's settings say about running it on this machine (``TrainConfig`` and ``PromptOptConfig`` have
    these fields)."""

    @property
    def model(self) -> str: ...
    @property
    def agent(self) -> str: ...
    @property
    def runner_processes(self) -> int: ...
    @property
    def runner_concurrency(self) -> int: ...
    @property
    def max_batch_size(self) -> int: ...
    @property
    def batch_wait_s(self) -> float: ...
    @property
    def device(self) -> str: ...


@dataclass(frozen=True)
class LocalMachine:
    """How a job runs on this machine: the embedded model, the agent, the runner fan-out and the model's batching.

    Attributes:
        model: an embedded model name (``qwen2.5-0.5b``, ``smollm2-135m``) or a prepared bf16 directory.
        agent: the agent as ``package.module:attribute``, imported by each runner process (the current ``sys.path``
            is handed to them, so put the repository root on it first for ``examples.*``).
        runner_processes / runner_concurrency: runner fan-out (processes x rollouts at once each).
        max_batch_size / batch_wait_s: batching of the embedded backend (requests, seconds).
        device: where the model is served (and, for training, where the LoRA policy lives): ``cpu``, ``cuda`` or
            ``cuda:N``.
    """

    model: str | Path
    agent: str
    runner_processes: int = 2
    runner_concurrency: int = 8
    max_batch_size: int = 16
    batch_wait_s: float = 0.25
    device: str = "cpu"
    inference: InferenceConfig | None = None

    @classmethod
    def of(cls, settings: MachineSettings) -> LocalMachine:
        """The machine part of a job's settings (``TrainConfig``, ``PromptOptConfig``)."""
        return cls(
            model=settings.model,
            agent=settings.agent,
            runner_processes=settings.runner_processes,
            runner_concurrency=settings.runner_concurrency,
            max_batch_size=settings.max_batch_size,
            batch_wait_s=settings.batch_wait_s,
            device=settings.device,
            inference=getattr(settings, "inference", None),
        )

    @property
    def engine(self) -> str:
        """The serving engine: ``embedded`` unless :attr:`inference` names another."""
        return self.inference.engine if self.inference is not None else "embedded"

    def load_model(self, console: Console | None = None) -> LoadedModel:
        """Prepare and load :attr:`model` (:func:`load_embedded`) with this machine's device and batching."""
        settings = self.inference
        backend, setup_s = load_embedded(
            self.model,
            device=self.device,
            max_batch_size=self.max_batch_size,
            batch_wait_s=self.batch_wait_s,
            console=console,
            continuous_batching=settings.continuous_batching if settings is not None else True,
            prefix_cache_bytes=(settings.prefix_cache_mb if settings is not None else 512) * 1024 * 1024,
            quantization=settings.quantization if settings is not None else "none",
        )
        return LoadedModel(backend, setup_s)


def with_serving_tis(config: TorchTrainerConfig, inference: InferenceConfig | None) -> TorchTrainerConfig:
    """``config`` with truncated importance sampling on (``tis_cap`` :data:`INT8_TIS_CAP`) when the engine serves
    in int8 (``inference.quantization``) and ``tis_cap`` is unset (``None``; a resolved config file writes that
    default too, so an explicit ``null`` cannot turn it off); otherwise ``config`` as it is."""
    if inference is None or inference.quantization != "int8" or config.tis_cap is not None:
        return config
    return config.model_copy(update={"tis_cap": INT8_TIS_CAP})


@dataclass
class LoadedModel:
    """An embedded model loaded for a job, and the seconds spent preparing it (a caller that changes its weights
    before serving, e.g. merging a checkpoint's adapter, adds its own time to ``setup_s``)."""

    backend: Any
    """An :class:`~agentbolt.inference.embedded.EmbeddedBackend`, or a
    :class:`~agentbolt.inference.token_engines.TokenEngineBackend` for another engine."""
    setup_s: float


def resolve_model(model: str | Path) -> Path:
    """The bf16 Hugging Face directory of ``model``: a directory as given, or an embedded model name prepared with
    :func:`~agentbolt.inference.model_files.prepare_model` (converted on first use).

    Raises:
        ConfigError: ``model`` is neither a directory nor a known embedded model name.
        BackendError: the model package is missing or the conversion failed.
    """
    from agentbolt.inference.model_files import get_model_spec, prepare_model

    if Path(model).is_dir():
        return Path(model)
    get_model_spec(str(model))  # an unknown name fails here with the list of known ones
    return prepare_model(str(model))


STORE_FILES = ("store.db", "store.db-wal", "store.db-shm")
"""A job's store file and SQLite's write-ahead log and shared-memory files beside it (moved together)."""

RUN_FILES = ("checkpoints", "summary.json", "reward_curve.png")
"""What a job writes besides its store that ``--overwrite`` moves aside with it."""

DATA_TABLES = ("rollouts", "attempts", "spans", "resources", "metrics", "trained_samples")
"""The store tables that hold records (a store whose tables are all empty holds nothing to keep)."""


def fresh_db_path(out_dir: Path, *, overwrite: bool, resumable: bool = True, console: Console | None = None) -> Path:
    """``out_dir/store.db`` for a new run, creating ``out_dir``; nothing there is ever deleted that holds a record.

    With ``overwrite``, an existing store (with its WAL files) and the previous run's checkpoints, ``summary.json``
    and ``reward_curve.png`` are moved into ``out_dir/.overwritten-<time>/`` (the console says where). A store that
    holds no rollout (a run that stopped before its first rollout) blocks nothing: it is moved aside without
    ``overwrite``, or removed when it holds no record at all. All of this happens only while no other process has
    the store open (:mod:`agentbolt.store.sqlite_lock`): an ``agentbolt serve`` on it would go on acknowledging
    writes into a file that is no longer there.

    Args:
        out_dir: the job's output directory.
        overwrite: move aside what is there.
        resumable: the job can continue a stopped run (``train``): the refusal names ``--resume`` too.
        console: where the move is reported (default: a new stdout console).

    Raises:
        ConfigError: another process has the store open (the message names it); the store holds rollouts, or
            checkpoints exist, and ``overwrite`` is false (the message names ``--overwrite``, and ``--resume`` for a
            resumable job); ``out_dir`` is a file or cannot be created; or a file cannot be moved aside.
    """
    from agentbolt.store.sqlite_lock import exclusive_store
    from agentbolt.trainer.checkpoint import checkpoints_dir

    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"{out_dir} is a file; the output must be a directory (choose another --out)")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the output directory {out_dir}: {exc}") from exc
    db = out_dir / "store.db"
    checkpoints = checkpoints_dir(out_dir)
    action = "--overwrite would move it aside" if overwrite else "this job would replace it"
    with exclusive_store(db, action=action):
        blocking = (db.exists() and _count_rows(db, ("rollouts",)) != 0) or checkpoints.exists()
        if blocking and not overwrite:
            what = db if db.exists() else checkpoints
            resume = "pass --resume to continue that run, " if resumable else "pass "
            raise ConfigError(f"{what} already exists; {resume}--overwrite to replace it, or choose another --out")
        if db.exists() and not blocking and _count_rows(db, DATA_TABLES) == 0:
            for name in STORE_FILES:  # a store that holds no record at all: nothing to keep
                (out_dir / name).unlink(missing_ok=True)
        names = STORE_FILES + RUN_FILES if overwrite else STORE_FILES
        moved = _move_aside(out_dir, [name for name in names if (out_dir / name).exists()])
    if moved is not None:
        (console or Console(soft_wrap=True)).print(
            f"moved the previous run's files ({', '.join(sorted({p.name for p in moved.iterdir()}))}) to {moved}; "
            "delete that folder when you no longer need them"
        )
    return db


def _move_aside(out_dir: Path, names: list[str]) -> Path | None:
    """Move ``out_dir/<name>`` for each name into a new ``out_dir/.overwritten-<time>/``; return it (``None`` when
    ``names`` is empty).

    Raises:
        ConfigError: a file cannot be moved (the message names it).
    """
    import datetime

    if not names:
        return None
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    target = out_dir / f".overwritten-{stamp}"
    n = 1
    while target.exists():
        n += 1
        target = out_dir / f".overwritten-{stamp}-{n}"
    try:
        target.mkdir()
        for name in names:  # the store's files first: a store is never left apart from its WAL
            (out_dir / name).rename(target / name)
    except OSError as exc:
        raise ConfigError(f"cannot move the previous run's files into {target}: {exc}; move or remove them") from exc
    return target


def _count_rows(db: Path, tables: tuple[str, ...]) -> int | None:
    """Rows in those of ``tables`` that the SQLite file ``db`` has (0 for a file without them); ``None`` for a file
    that is not a SQLite database (counted as holding something)."""
    import sqlite3

    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            present = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            return sum(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables if t in present)
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        return None


def discard_unused_store(db: Path, console: Console | None = None) -> bool:
    """Remove the store file ``db`` (and its WAL files) of a run that failed before its first rollout ended, so a
    plain rerun is not blocked by it; return whether it was removed.

    It is kept when a rollout ended in it (succeeded or failed), when it is not a SQLite store, or when another
    process has it open. Never raises for these: the caller is already failing with its own error.
    """
    from agentbolt.store.sqlite_lock import exclusive_store

    if not db.exists():
        return False
    try:
        with exclusive_store(db, action="it is kept"):
            if _count_rows(db, ("rollouts",)) is None or _ended_rollouts(db) != 0:
                return False
            for suffix in ("", "-wal", "-shm"):
                Path(f"{db}{suffix}").unlink(missing_ok=True)
    except (ConfigError, OSError) as exc:
        logger.debug("kept %s: %s", db, exc)
        return False
    (console or Console(soft_wrap=True)).print(
        f"removed {db}: the run stopped before any rollout ended, so it held no result"
    )
    return True


def _ended_rollouts(db: Path) -> int:
    """Rollouts of ``db`` that ended with a result (``succeeded`` or ``failed``)."""
    import sqlite3

    from agentbolt.types import RolloutStatus

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        present = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "rollouts" not in present:
            return 0
        ended = (RolloutStatus.SUCCEEDED.value, RolloutStatus.FAILED.value)
        return conn.execute("SELECT COUNT(*) FROM rollouts WHERE status IN (?, ?)", ended).fetchone()[0]
    finally:
        conn.close()


def load_embedded(
    model: str | Path,
    *,
    device: str,
    max_batch_size: int,
    batch_wait_s: float,
    console: Console | None = None,
    continuous_batching: bool = True,
    prefix_cache_bytes: int = 512 * 1024 * 1024,
    quantization: str = "none",
) -> tuple[EmbeddedBackend, float]:
    """Prepare (first use converts the GGUF) and load an embedded model under a console status; return the backend
    with the seconds this took.

    Raises:
        ConfigError: an unknown model name.
        BackendError: the model package is missing or the conversion failed.
    """
    from agentbolt.inference.embedded import EmbeddedBackend

    console = console or Console()
    t_start = time.perf_counter()
    with console.status(f"preparing the embedded model {model} (first run converts the GGUF once)"):
        backend = EmbeddedBackend.load(
            resolve_model(model),
            device=device,
            max_batch_size=max_batch_size,
            batch_wait_s=batch_wait_s,
            continuous_batching=continuous_batching,
            prefix_cache_bytes=prefix_cache_bytes,
            quantization=quantization,
        )
    return backend, time.perf_counter() - t_start


async def load_engine(
    machine: LocalMachine, work_dir: Path, console: Console | None = None
) -> tuple[LoadedModel, Path]:
    """Start or connect the token-in/token-out engine of ``machine.inference`` for ``machine.model``; return it as
    a :class:`LoadedModel` with the model's Hugging Face directory (its tokenizer renders the prompts; the trainer
    loads its weights).

    ``llamacpp``: converts the model to GGUF once (cached), starts ``llama-server`` on a free loopback port with its
    log in ``work_dir``, and stops it when the backend closes. ``vllm`` / ``sglang``: connects to ``inference.url``.

    Raises:
        ConfigError: an unknown model, or llama.cpp not built (the message says how to build it).
        BackendError: the conversion failed, or the engine did not start or cannot be reached.
    """
    from agentbolt.inference.token_engines import TokenEngineBackend

    settings = machine.inference
    assert settings is not None and settings.engine != "embedded"
    console = console or Console()
    t_start = time.perf_counter()
    model_dir = await asyncio.to_thread(resolve_model, machine.model)
    name = Path(str(machine.model)).name
    if settings.engine == "llamacpp":
        from agentbolt.inference.llamacpp import start_llama_server

        with console.status(f"starting llama-server for {machine.model} (the first run converts it to GGUF once)"):
            server = await start_llama_server(
                model_dir,
                work_dir,
                llama_cpp_dir=settings.llama_cpp_dir,
                parallel=settings.parallel,
                context_per_slot=settings.context_per_request,
                threads=settings.threads,
            )
        try:
            backend = await TokenEngineBackend.connect(
                "llamacpp",
                server.url,
                model_dir=model_dir,
                model_name=name,
                max_context_tokens=settings.context_per_request,
                timeout_s=settings.timeout_s,
                adapter_loader=server.adapter_loader,
                on_close=server.stop,
            )
        except BaseException:
            await server.stop()
            raise
    else:
        assert settings.url is not None
        backend = await TokenEngineBackend.connect(
            settings.engine,
            settings.url,
            model_dir=model_dir,
            model_name=settings.served_model or name,
            max_context_tokens=settings.context_per_request,
            api_key=settings.api_key,
            timeout_s=settings.timeout_s,
        )
    return LoadedModel(backend, time.perf_counter() - t_start), model_dir


@dataclass
class LocalServing:
    """What :func:`local_serving` started.

    Attributes:
        store: the SQLite store (``db_path``).
        backend: the embedded inference backend (its ``stats`` count generated tokens).
        url: the server's root URL (store API, rollout gateway, and the unrecorded ``/v1/chat/completions``).
        gate: the gateway's weight-swap gate.
        model_setup_s: seconds spent preparing and loading the model.
        runners: the runner processes.
        unscoped_calls: how many LLM calls reached the server's plain ``/v1`` LLM routes so far (recorded
            nowhere: an agent that ignored ``llm.endpoint``).
        runner_exits: runner processes that exited while the job ran (:attr:`RunnerWatch.exits`), filled as it runs.
    """

    store: SqliteLightningStore
    backend: Any
    url: str
    gate: WeightSwapGate
    model_setup_s: float
    runners: RunnerPool
    unscoped_calls: Callable[[], int]
    runner_exits: list[dict[str, Any]]


class RunnersExited(BackendError):
    """Every runner process of a job exited while rollouts waited. Exit code 1 (the job ran and failed)."""

    exit_code = 1


class RunnerWatch:
    """Cancels the task that started it when every runner process of ``pool`` has exited, so a job waiting on
    rollouts fails instead of waiting forever (a runner killed by the OS, or crashing at start-up).

    The task then gets :class:`~agentbolt.errors.BackendError` from :meth:`raise_if_dead`, called where it catches
    the cancellation. Checks every ``interval_s`` seconds; :meth:`close` stops watching.
    """

    def __init__(self, pool: RunnerPool, interval_s: float = 1.0) -> None:
        self.pool = pool
        self.interval_s = interval_s
        self.exit_codes: list[int | None] | None = None
        self.exits: list[dict[str, Any]] = []
        """Every runner process seen exited while the job ran: ``{"runner", "exit_code", "runners_left"}``."""
        self._owner = asyncio.current_task()
        self._watcher = asyncio.create_task(self._watch())

    def _note_exits(self) -> None:
        """Log each runner process that exited since the last check (the job goes on with the others)."""
        seen = {exit["runner"] for exit in self.exits}
        left = self.pool.alive()
        for process in self.pool.processes:
            if process.name in seen or process.is_alive():
                continue
            self.exits.append({"runner": process.name, "exit_code": process.exitcode, "runners_left": left})
            logger.warning(
                "runner process %s exited (exit code %s%s); %d of %d runners left. Its rollouts in flight are "
                "retried once their lease ends (grpo.rollout_unresponsive_s)",
                process.name,
                process.exitcode,
                ", killed by a signal: out of memory?" if (process.exitcode or 0) < 0 else "",
                left,
                len(self.pool.processes),
            )

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self._note_exits()
            if self.pool.alive() == 0:
                self.exit_codes = [process.exitcode for process in self.pool.processes]
                if self._owner is not None:
                    self._owner.cancel()
                return

    def raise_if_dead(self) -> None:
        """Raise :class:`~agentbolt.errors.BackendError` if the watch cancelled the task (the cancellation is
        withdrawn); return otherwise.

        Raises:
            RunnersExited: every runner process exited; the message gives their exit codes.
        """
        if self.exit_codes is None:
            return
        if self._owner is not None:
            self._owner.uncancel()
        codes = ", ".join(str(code) for code in self.exit_codes)
        raise RunnersExited(
            f"every runner process exited (exit codes {codes}) while rollouts were waiting; a negative code is the "
            "signal that killed it (-9: the system ran out of memory, or a kill -9), a positive one an error printed "
            "above. A run with a checkpoint continues with the same command and --resume"
        )

    def close(self) -> None:
        """Stop watching (the runners are about to be stopped on purpose)."""
        self._watcher.cancel()


RUNNER_STOP_S = 10.0
"""How long stopping the runners waits for each to finish its in-flight attempts before terminating it (seconds)."""

RUNNER_STOP_ON_CANCEL_S = 0.2
"""The same when the job was cancelled (Ctrl-C): its rollouts are cancelled in the store, so their attempts are
not waited for (seconds, for all runners together)."""


def stop_runners(pool: RunnerPool, grace_s: float) -> None:
    """Ask every runner process of ``pool`` to stop, wait up to ``grace_s`` seconds for all of them together, then
    terminate (SIGTERM) those still running (an attempt's child process dies with its runner). Their peak resident
    memory is read first (:meth:`RunnerPool.note_peak_rss`)."""
    pool.note_peak_rss()
    pool.stop_event.set()
    deadline = time.monotonic() + grace_s
    for process in pool.processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in pool.processes:
        if process.is_alive():
            logger.info("runner %s still busy after %.1f s; terminating it", process.name, grace_s)
            process.terminate()
    for process in pool.processes:
        process.join(2.0)


@asynccontextmanager
async def local_serving(
    machine: LocalMachine,
    *,
    db_path: Path,
    console: Console | None = None,
    loaded: LoadedModel | None = None,
) -> AsyncIterator[LocalServing]:
    """Start the embedded model, a SQLite store, the server and runner processes; yield them; stop them all.

    Args:
        machine: the model, agent, runner fan-out, batching and device.
        db_path: the SQLite store file (created; see :func:`fresh_db_path`).
        console: where the model-preparation status is shown.
        loaded: the model, already loaded (and changed: a policy built from it, a checkpoint's adapter merged)
            by the caller; it is served from here on and closed at the end. ``None``: load ``machine.model``.

    Raises:
        ConfigError: an unknown model name or a bad ``agent`` reference (before anything is started).
        BackendError: every runner process exited while the block was running (:class:`RunnerWatch`): the block is
            cancelled and this is raised instead of waiting forever for rollouts.
    """
    from agentbolt.runner.processes import load_agent, start_runner_processes
    from agentbolt.server.app import create_app
    from agentbolt.server.gateway.swap import WeightSwapGate
    from agentbolt.server.serving import serve_in_background
    from agentbolt.store.sqlite import SqliteLightningStore

    try:
        load_agent(machine.agent)
    except BaseException:
        if loaded is not None:
            await loaded.backend.close()
        raise
    if loaded is None and machine.engine != "embedded":
        loaded, _ = await load_engine(machine, db_path.parent / "engine", console)
    elif loaded is None:  # in a thread: the loop stays free, so a Ctrl-C during the load lands at once
        loaded = await asyncio.to_thread(run_then_release, machine.load_model, console)
    backend = loaded.backend
    try:
        store = SqliteLightningStore(db_path)
    except BaseException:
        await backend.close()
        raise
    try:
        gate = WeightSwapGate()
        app = create_app(store, backend, swap_gate=gate)
        async with serve_in_background(app) as url:
            pool = start_runner_processes(
                machine.agent, url, n_processes=machine.runner_processes, concurrency=machine.runner_concurrency
            )
            watch = RunnerWatch(pool)
            grace_s = RUNNER_STOP_S
            try:
                yield LocalServing(
                    store,
                    backend,
                    url,
                    gate,
                    loaded.setup_s,
                    pool,
                    lambda: int(app.state.unscoped_calls),
                    watch.exits,
                )
            except asyncio.CancelledError:
                watch.raise_if_dead()
                grace_s = RUNNER_STOP_ON_CANCEL_S  # a stop (Ctrl-C): in-flight attempts are not waited for
                raise
            finally:
                watch.close()
                # In a thread: joining blocks, and the server on this loop must keep answering the runners.
                await asyncio.to_thread(stop_runners, pool, grace_s)
    finally:
        await store.close()
        await backend.close()


@dataclass
class ModelServing:
    """What :func:`model_serving` started.

    Attributes:
        backend: the embedded inference backend.
        url: the server's root URL; the model answers at ``{url}/v1/chat/completions`` (unrecorded).
        model_setup_s: seconds spent preparing and loading the model.
    """

    backend: EmbeddedBackend
    url: str
    model_setup_s: float


@asynccontextmanager
async def model_serving(
    *,
    model: str | Path,
    max_batch_size: int = 16,
    batch_wait_s: float = 0.25,
    console: Console | None = None,
    device: str = "cpu",
) -> AsyncIterator[ModelServing]:
    """Load an embedded model and serve it on a free loopback port, with an in-memory store (nothing recorded is
    kept); yield it; stop it. Used for a second model in one job, e.g. a larger prompt optimizer next to the agent's
    model.

    The model is loaded in a worker thread: a first use converts its GGUF (a minute or more), and a server already
    running on this event loop (the job's, with runner processes polling it) must keep answering meanwhile, or the
    runners' requests time out and they exit.

    Raises:
        ConfigError: an unknown model name.
        BackendError: the model package is missing or the conversion failed.
    """
    from agentbolt.server.app import create_app
    from agentbolt.server.serving import serve_in_background
    from agentbolt.store.memory import InMemoryLightningStore

    backend, model_setup_s = await asyncio.to_thread(
        run_then_release,
        load_embedded,
        model,
        device=device,
        max_batch_size=max_batch_size,
        batch_wait_s=batch_wait_s,
        console=console,
    )
    store = InMemoryLightningStore()
    try:
        async with serve_in_background(create_app(store, backend)) as url:
            yield ModelServing(backend, url, model_setup_s)
    finally:
        await store.close()
        await backend.close()


@asynccontextmanager
async def local_training(
    machine: LocalMachine,
    *,
    db_path: Path,
    grpo: GRPOConfig,
    trainer_config: TorchTrainerConfig | None = None,
    agent_match: str | None = None,
    console: Console | None = None,
    resume_from: Path | None = None,
) -> AsyncIterator[LocalTraining]:
    """Start what :func:`local_serving` starts, plus the LoRA policy and an :class:`RLTrainer` over them; yield them;
    stop them all.

    The policy is a copy of the served model with LoRA adapters; after each update its merged weights are written
    into the served model (serving through peft's LoRA layers is ~5x slower on CPU,
    :mod:`agentbolt.algorithms.rl.weight_sync`). It is built before the server starts, so the gateway never serves
    other weights than the policy's.

    Args:
        machine, db_path, console: as in :func:`local_serving` (the LoRA policy lives on ``machine.device`` too).
        grpo: the RL settings.
        trainer_config: settings of the torch trainer backend (LoRA, learning rate, loss); ``None``: its defaults.
        agent_match: regular expression over agent names; only the matching agents' LLM calls become training
            samples (``None``: all calls). See :class:`~agentbolt.trainer.loop.RLTrainer`.
        resume_from: a checkpoint folder (``OUT/checkpoints/step-N``): its adapter, value head, optimizer and RNG
            states are loaded into the policy and its merged weights into the served model before the server
            starts. The loop's own state is the caller's to restore (``trainer.load_state_dict``).

    Raises:
        ConfigError: an unknown model name, a bad ``agent`` reference, a bad ``agent_match`` pattern or unknown
            algorithm names (before the model loads), or a checkpoint that does not fit the model.
    """
    from agentbolt.adapter.lightning_rl import LightningRL
    from agentbolt.algorithms.rl.torch_backend import TorchPolicyTrainer, TorchTrainerConfig, attach_lora
    from agentbolt.algorithms.rl.weight_sync import load_weights, merged_lora_weights
    from agentbolt.runner.processes import load_agent
    from agentbolt.trainer.loop import RLTrainer

    LightningRL(grpo, agent_match=agent_match)  # bad names and patterns fail before the model loads
    load_agent(machine.agent)
    config = trainer_config if trainer_config is not None else TorchTrainerConfig()
    config = with_serving_tis(config, machine.inference)
    if machine.engine != "embedded":
        async with _engine_training(
            machine,
            db_path=db_path,
            grpo=grpo,
            config=config,
            agent_match=agent_match,
            console=console,
            resume_from=resume_from,
        ) as training:
            yield training
        return

    def build_policy(loaded: LoadedModel) -> tuple[Module, TorchPolicyTrainer]:
        t_policy = time.perf_counter()
        policy = attach_lora(copy.deepcopy(loaded.backend.model), config)
        updater = TorchPolicyTrainer(policy, config, pad_token_id=loaded.backend.pad_token_id)
        if resume_from is not None:
            updater.load_state(resume_from)
            load_weights(loaded.backend.model, merged_lora_weights(policy))
        loaded.setup_s += time.perf_counter() - t_policy
        return policy, updater

    # Both in a thread (tens of seconds on CPU): the loop stays free, so a Ctrl-C meanwhile lands at once (the
    # thread is abandoned; the process exits without waiting for it, see agentbolt.cli.common.run_job).
    loaded = await asyncio.to_thread(run_then_release, machine.load_model, console)
    try:
        policy, updater = await asyncio.to_thread(run_then_release, build_policy, loaded)
    except BaseException:
        await loaded.backend.close()
        raise

    async with local_serving(machine, db_path=db_path, console=console, loaded=loaded) as serving:
        backend = serving.backend

        def sync_weights() -> None:
            load_weights(backend.model, merged_lora_weights(policy))

        trainer = RLTrainer(
            serving.store,
            backend,
            updater,
            grpo,
            gateway_url=serving.url,
            sync_weights=sync_weights,
            agent_match=agent_match,
            swap_gate=serving.gate,
        )
        try:
            yield _training(trainer, serving, updater)
        finally:
            trainer.close()


@asynccontextmanager
async def _engine_training(
    machine: LocalMachine,
    *,
    db_path: Path,
    grpo: GRPOConfig,
    config: TorchTrainerConfig,
    agent_match: str | None,
    console: Console | None,
    resume_from: Path | None,
) -> AsyncIterator[LocalTraining]:
    """:func:`local_training` with a token-in/token-out engine serving: the policy is the model's weights loaded
    here with LoRA; after each update its adapter is saved to ``OUT/engine/adapters/VERSION`` and loaded into the
    engine (:meth:`~agentbolt.inference.token_engines.TokenEngineBackend.load_adapter`), while gateway calls wait."""
    from transformers import AutoModelForCausalLM

    from agentbolt.algorithms.rl.torch_backend import TorchPolicyTrainer, attach_lora
    from agentbolt.trainer.loop import RLTrainer

    work_dir = db_path.parent / "engine"
    loaded, model_dir = await load_engine(machine, work_dir, console)
    backend = loaded.backend
    tokenizer = backend.encoder.tokenizer
    pad = tokenizer.pad_token_id if isinstance(tokenizer.pad_token_id, int) else backend.encoder.stop_token_ids[0]

    def build_policy() -> tuple[Module, TorchPolicyTrainer]:
        import torch

        t_policy = time.perf_counter()
        base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16)
        base.to(machine.device)  # type: ignore[arg-type]
        policy = attach_lora(base, config)
        updater = TorchPolicyTrainer(policy, config, pad_token_id=pad)
        if resume_from is not None:
            updater.load_state(resume_from)
        loaded.setup_s += time.perf_counter() - t_policy
        return policy, updater

    try:
        policy, updater = await asyncio.to_thread(run_then_release, build_policy)
        if resume_from is not None:  # the engine serves the checkpoint's adapter before any rollout
            await backend.load_adapter(resume_from, resume_from.name)
    except BaseException:
        await backend.close()
        raise
    adapters = work_dir / "adapters"

    async with local_serving(machine, db_path=db_path, console=console, loaded=loaded) as serving:

        def save_adapter(folder: Path) -> None:
            policy.save_pretrained(str(folder))  # pyright: ignore[reportCallIssue]

        async def publish(version: str) -> None:
            folder = adapters / version
            await trainer.on_update_thread(save_adapter, folder)
            await backend.load_adapter(folder, version)
            for old in adapters.iterdir():  # the engine has its own copy now (GGUF, or loaded in memory)
                if old.name != version and old.is_dir():
                    shutil.rmtree(old, ignore_errors=True)

        trainer = RLTrainer(
            serving.store,
            backend,
            updater,
            grpo,
            gateway_url=serving.url,
            publish_weights=publish,
            agent_match=agent_match,
            swap_gate=serving.gate,
        )
        try:
            yield _training(trainer, serving, updater)
        finally:
            trainer.close()


def _training(trainer: RLTrainer, serving: LocalServing, updater: TorchPolicyTrainer) -> LocalTraining:
    """What :func:`local_training` yields: the trainer over what :func:`local_serving` started."""
    return LocalTraining(
        trainer,
        serving.store,
        serving.backend,
        serving.url,
        serving.model_setup_s,
        updater,
        serving.runners,
        serving.unscoped_calls,
        serving.runner_exits,
    )
