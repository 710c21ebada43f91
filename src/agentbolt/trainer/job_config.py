"""The settings of an RL job (``agentbolt train CONFIG.yaml``, ``agentbolt demo``): :class:`TrainConfig`, read from
YAML with ``--set`` overrides and validated when parsed, before any model loads: the algorithm picks the config type
(a discriminated union with the prompt optimizers' :class:`~agentbolt.trainer.prompt_opt.PromptOptConfig`), the
advantage estimator and credit assignment names are checked against their registries, and ``torch_trainer`` is a
typed :class:`~agentbolt.algorithms.rl.trainer_config.TorchTrainerConfig`.
"""

from __future__ import annotations

import difflib
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, Field, TypeAdapter, ValidationError, field_validator, model_validator

from agentbolt.algorithms.rl.trainer_config import TorchTrainerConfig
from agentbolt.config import GRPOConfig, _Config
from agentbolt.errors import ConfigError
from agentbolt.trainer.checkpoint import CheckpointConfig

if TYPE_CHECKING:
    from agentbolt.trainer.prompt_opt import PromptOptConfig

DEFAULT_AGENT = "examples.calc_agent.agent:calc_agent"


class InferenceConfig(_Config):
    """Which engine serves the agent's LLM calls during a job (``inference:`` in the YAML file).

    Attributes:
        engine: ``embedded`` (transformers in the job's process, the default), or a token-in/token-out engine
            (:mod:`agentbolt.inference.token_engines`): ``llamacpp`` (llama.cpp's ``llama-server``; without ``url``
            the job starts it on this machine and restarts it with each new LoRA adapter), ``vllm`` or ``sglang``
            (a running server at ``url``, started with LoRA enabled; each new adapter is loaded through its
            ``load_lora_adapter`` route from a folder it must be able to read).
        url: the engine's server root (``http://host:8000``; not the ``/v1`` API root). Required for ``vllm`` and
            ``sglang``; for ``llamacpp`` leave it unset.
        served_model: the name vLLM serves the base model under (default: the model's name).
        api_key: sent as a bearer token to a remote engine.
        context_per_request: tokens of context each request may use (prompt + ``max_tokens``; at least 256, and
            more than ``grpo.max_tokens``); for ``llamacpp`` each of its ``parallel`` slots gets this much.
        parallel: ``llamacpp``: requests generated together (``llama-server --parallel``).
        threads: ``llamacpp``: CPU threads (default all cores).
        llama_cpp_dir: ``llamacpp``: the folder with the built llama.cpp (default ``$AGENTBOLT_LLAMA_CPP`` or
            ``~/.cache/agentbolt/llama.cpp``; ``make llamacpp`` builds it).
        continuous_batching / prefix_cache_mb: ``embedded``: serve plain sampling requests from a running batch that
            rows join and leave at every step, and keep this many MiB of prompt keys and values for reuse (0: no
            prefix cache); see :class:`~agentbolt.inference.embedded.EmbeddedBackend`.
        quantization: ``embedded``: ``none`` (serve the weights as they are, the default) or ``int8`` (q, k, v, o,
            gate, up and the output projection in int8 with SmoothQuant scales,
            :mod:`agentbolt.inference.int8_linear`): faster generation on a CPU without native bf16, at the price of
            served logprobs farther from the trainer's; a job then trains with truncated importance sampling
            (``torch_trainer.tis_cap``, 2.0 unless set).
        timeout_s: longest wait for one answer from a remote engine.
    """

    engine: Literal["embedded", "llamacpp", "vllm", "sglang"] = "embedded"
    url: str | None = None
    served_model: str | None = None
    api_key: str | None = None
    context_per_request: int = Field(default=4096, ge=256)
    parallel: int = Field(default=16, ge=1)
    threads: int | None = Field(default=None, ge=1)
    llama_cpp_dir: str | None = None
    continuous_batching: bool = True
    prefix_cache_mb: int = Field(default=512, ge=0)
    quantization: Literal["none", "int8"] = "none"
    timeout_s: float = Field(default=600.0, gt=0)

    @model_validator(mode="after")
    def _url_where_needed(self) -> InferenceConfig:
        if self.engine in ("vllm", "sglang") and not self.url:
            raise ValueError(
                f"inference.engine {self.engine} needs inference.url, the root of a running {self.engine} server "
                "(e.g. http://127.0.0.1:8000)"
            )
        if self.url and self.url.rstrip("/").endswith("/v1"):
            root = self.url.rstrip("/").removesuffix("/v1")
            raise ValueError(
                f"inference.url is the {self.engine} server's root, not its OpenAI API root: use {root} instead of "
                f"{self.url} (agentbolt calls {root}/health and the engine's own token routes)"
            )
        if self.engine != "embedded" and self.quantization != "none":
            raise ValueError(
                f"inference.quantization applies to the embedded engine; {self.engine} serves the weights it is "
                "given (quantize them in the engine itself, e.g. a quantized GGUF or vLLM's --quantization)"
            )
        if self.engine == "embedded" and self.url:
            raise ValueError("inference.url is for a remote engine; the embedded engine runs in the job's process")
        if self.engine == "llamacpp" and self.url:
            raise ValueError(
                "inference.engine llamacpp starts its own llama-server (it is restarted with each new LoRA adapter, "
                "which llama.cpp loads only at start); leave inference.url unset"
            )
        return self


DEFAULT_TASKS = "examples.calc_agent.tasks"


class TrainConfig(_Config):
    """Settings of ``agentbolt train`` (the YAML file) and ``agentbolt demo``.

    Attributes:
        algorithm: ``lightningrl`` (the only value here; ``apo`` / ``gepa`` files are read as
            :class:`~agentbolt.trainer.prompt_opt.PromptOptConfig` by :func:`load_job_config`).
        out_dir: where ``store.db``, ``reward_curve.png`` and ``summary.json`` are written.
        model: embedded model name (``qwen2.5-0.5b`` or ``smollm2-135m``) or a prepared bf16 model directory.
        grpo: the RL settings (:class:`~agentbolt.config.GRPOConfig`: estimator, credit assignment, asynchronous
            training...).
        tasks: where the tasks come from: a module, as ``package.module``, imported from the current folder, that
            defines ``load_train_tasks(size) -> list[dict]`` and ``load_val_sets(n_per_set) -> dict[str, list[dict]]``;
            or a JSON Lines file (a path ending in ``.jsonl``: one JSON object per line, one task each) of training
            tasks. Every task is loaded and checked before the model loads (:func:`load_task_sets`).
        val_tasks: a JSON Lines file of validation tasks (one set, named after the file), used instead of the tasks
            module's ``load_val_sets``; with a ``tasks`` file and no ``val_tasks`` there is no evaluation.
        train_size: training tasks asked of ``load_train_tasks``.
        val_size: tasks per validation set (``None``: whole set; 0: no evaluation).
        eval_before / eval_after: evaluate on the validation sets before / after training.
        torch_trainer: more settings of the torch trainer backend, validated when the config is parsed
            (:class:`~agentbolt.algorithms.rl.torch_backend.TorchTrainerConfig` fields such as ``kl_coef``,
            ``tis_cap``, ``loss_aggregation``, ``micro_batch_tokens``); ``learning_rate`` is set above.
        runner_processes / runner_concurrency: runner fan-out (processes x rollouts at once each).
        max_batch_size: gateway batch limit of the embedded backend.
        batch_wait_s: how long the backend waits for more requests before starting a batch (seconds).
        learning_rate: AdamW learning rate of the LoRA update.
        overwrite: replace an existing ``store.db`` in ``out_dir`` instead of refusing.
        agent: the agent as ``module:attribute``.
        agent_match: regular expression over agent names; only the matching agents' LLM calls are trained
            (``None``: all of them).
        device: where the model is served and trained (``cpu``, ``cuda``, ``cuda:N``).
        checkpoint: when checkpoints ``out_dir/checkpoints/step-N`` are written and which are kept
            (:class:`~agentbolt.trainer.checkpoint.CheckpointConfig`).
        eval_every: also evaluate on the validation sets after every ``eval_every`` steps (``None``: only before and
            after training); each such checkpoint records its accuracy, and the best one is kept.
        resume: continue the run in ``out_dir`` from its newest complete checkpoint, on the same store
            (``agentbolt train --resume``).
        report_to: experiment trackers that also get every metric the job records (``tensorboard``, ``mlflow``,
            ``wandb``; W&B offline unless it has an API key), see :mod:`agentbolt.trainer.trackers`.
        inference: the engine that serves the agent (:class:`InferenceConfig`): ``engine: embedded`` (default),
            ``llamacpp``, ``vllm`` or ``sglang`` with ``url``.
        trainer: the trainer backend: ``torch`` (LoRA in the job's process, the default) or ``verl`` (GPU only:
            refused here with what it needs, see :mod:`agentbolt.algorithms.rl.verl`).
    """

    algorithm: Literal["lightningrl"] = "lightningrl"
    out_dir: Path = Path("runs/demo")
    model: str = "qwen2.5-0.5b"
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    tasks: str = DEFAULT_TASKS
    val_tasks: str | None = None
    train_size: int = Field(default=512, ge=1)
    val_size: int | None = Field(default=8, ge=0)
    eval_before: bool = True
    eval_after: bool = True
    torch_trainer: TorchTrainerConfig = Field(default_factory=TorchTrainerConfig)
    learning_rate: float = Field(default=2e-4, gt=0)
    runner_processes: int = Field(default=2, ge=1)
    runner_concurrency: int = Field(default=8, ge=1)
    max_batch_size: int = Field(default=16, ge=1)
    batch_wait_s: float = Field(default=0.25, ge=0)
    overwrite: bool = False
    agent: str = DEFAULT_AGENT
    agent_match: str | None = None
    device: str = "cpu"
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    eval_every: int | None = Field(default=None, ge=1)
    resume: bool = False
    report_to: tuple[str, ...] = ()
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    trainer: Literal["torch", "verl"] = "torch"

    @field_validator("report_to", mode="before")
    @classmethod
    def _known_trackers(cls, value: Any) -> tuple[str, ...]:
        from agentbolt.trainer.trackers import validate_report_to

        return validate_report_to(value)

    @field_validator("val_tasks")
    @classmethod
    def _val_tasks_is_a_file(cls, value: str | None) -> str | None:
        if value is not None and not is_tasks_file(value):
            raise ValueError(f"val_tasks must be a JSON Lines file (a path ending in .jsonl), got {value!r}")
        return None if value is None else str(Path(value.strip()).expanduser().resolve())

    @field_validator("tasks")
    @classmethod
    def _tasks_file_is_absolute(cls, value: str) -> str:
        # A file is read relative to the folder the job started in; the checkpoints' config.yaml keeps it absolute,
        # so `agentbolt eval CKPT/config.yaml` works from any folder.
        return str(Path(value.strip()).expanduser().resolve()) if is_tasks_file(value) else value

    @model_validator(mode="before")
    @classmethod
    def _one_learning_rate(cls, data: Any) -> Any:
        trainer = data.get("torch_trainer") if isinstance(data, dict) else None
        if isinstance(trainer, dict) and "learning_rate" in trainer:
            raise ValueError("set learning_rate at the top level of the config, not under torch_trainer")
        return data

    @model_validator(mode="after")
    def _resume_or_overwrite(self) -> TrainConfig:
        if self.resume and self.overwrite:
            raise ValueError("resume and overwrite exclude each other: --resume continues OUT, --overwrite replaces it")
        return self

    @model_validator(mode="after")
    def _answers_fit_the_engine(self) -> TrainConfig:
        """A token engine's context per request must hold more than the answer budget (``grpo.max_tokens``): else
        every call of the job is refused and nothing is trained."""
        if self.inference.engine != "embedded" and self.grpo.max_tokens >= self.inference.context_per_request:
            raise ValueError(
                f"grpo.max_tokens ({self.grpo.max_tokens}) leaves no room for a prompt in inference."
                f"context_per_request ({self.inference.context_per_request} tokens per request): raise "
                "inference.context_per_request above max_tokens plus the longest prompt, or lower grpo.max_tokens"
            )
        return self

    @model_validator(mode="after")
    def _known_names(self) -> TrainConfig:
        """The estimator, credit assignment and agent_match are checked against their registries when the config is
        parsed (the error names the known ones), not when the job reaches them."""
        from agentbolt.adapter.advantages import check_estimator_name
        from agentbolt.adapter.agents import compile_agent_match
        from agentbolt.adapter.credit import build_credit_scheme

        grpo = self.grpo
        checks: list[tuple[str, Callable[[], object]]] = [
            ("grpo.advantage_estimator", lambda: check_estimator_name(grpo.advantage_estimator)),
            (
                "grpo.credit_assignment",
                lambda: build_credit_scheme(
                    grpo.credit_assignment, gamma=grpo.credit_gamma, air_weights=grpo.air_weights
                ),
            ),
            ("agent_match", lambda: compile_agent_match(self.agent_match)),
        ]
        for name, check in checks:
            try:
                check()
            except ConfigError as exc:
                raise ValueError(f"{name}: {exc}") from None
        return self

    def to_settings(self) -> dict[str, Any]:
        """The settings as plain JSON data that :func:`validate_settings` reads back to an equal config (the torch
        trainer's ``learning_rate`` is left out: the top-level one is the setting)."""
        return self.model_dump(mode="json", exclude={"torch_trainer": {"learning_rate"}})

    @property
    def trainer_settings(self) -> TorchTrainerConfig:
        """``torch_trainer`` with this config's ``learning_rate``, and a value head when the estimator is ``gae``
        (PPO needs one)."""
        update: dict[str, Any] = {"learning_rate": self.learning_rate}
        if self.grpo.advantage_estimator == "gae":
            update["value_head"] = True
        return self.torch_trainer.model_copy(update=update)


RUN_PURPOSE = "run"
"""``metadata["purpose"]`` of the resources version a train job writes when it starts (and again when it resumes):
no resources, the metadata ``config`` (the resolved settings), ``out_dir`` (absolute) and ``resumed_from_step``
(``None`` for a fresh run). The dashboard's Run page reads it."""


def check_trainer(config: TrainConfig) -> None:
    """Check that this machine can run ``config.trainer`` (``torch`` always can).

    ``verl`` runs the update on GPUs through :class:`~agentbolt.algorithms.rl.verl.trainer.VerlPolicyUpdater`, whose
    actor and vLLM replicas a verl ``RayPPOTrainer`` owns; ``agentbolt train`` does not build that trainer yet (it is
    written against verl's source and has never run: no GPU here), so it is refused with what to do instead.

    Raises:
        ConfigError: ``trainer: verl`` (the message says whether verl is installed and what to use now).
    """
    if config.trainer == "torch":
        return
    import importlib.util

    installed = importlib.util.find_spec("verl") is not None
    raise ConfigError(
        "trainer: verl is not run by agentbolt train yet"
        + ("" if installed else " (and verl is not installed: pip install 'agentbolt[verl]' on a CUDA machine)")
        + ": build verl's RayPPOTrainer yourself and hand it to agentbolt.algorithms.rl.verl.VerlPolicyUpdater "
        "(docs/scaling.md, 'verl and vLLM'), or keep trainer: torch, which trains LoRA on the GPU with device: cuda "
        "and serves through inference.engine vllm or sglang"
    )


def check_device(device: str) -> None:
    """Raises ConfigError unless ``device`` is ``cpu``, or ``cuda`` / ``cuda:N`` with CUDA available to torch."""
    if device == "cpu":
        return
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        raise ConfigError(
            f"device {device!r} is not available here (torch sees {torch.cuda.device_count()} CUDA devices); "
            "use device cpu, cuda or cuda:N"
        )


TASKS_FILE_SUFFIX = ".jsonl"
"""A ``tasks`` value ending in this is a JSON Lines file of tasks, not a module name."""


def is_tasks_file(name: str) -> bool:
    """Whether the ``tasks`` value ``name`` names a JSON Lines file (else a module)."""
    return name.strip().lower().endswith(TASKS_FILE_SUFFIX)


def read_tasks_file(path: Path) -> list[dict[str, Any]]:
    """The tasks of a JSON Lines file: one JSON object per line (blank lines skipped), in file order.

    Raises:
        ConfigError: the file is missing or unreadable, holds no task, or a line is not valid JSON or not a JSON
            object; the message names the file and the line number (``FILE:LINE: ...``).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"tasks file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read tasks file {path}: {exc}") from None
    tasks: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{path}:{number}: not valid JSON ({exc}); write one JSON object per line") from None
        if not isinstance(row, dict):
            raise ConfigError(
                f"{path}:{number}: a task must be a JSON object, got {_kind(row)} {_clip(line)}; write one object "
                'per line, e.g. {"question": "...", "answer": "..."}'
            )
        tasks.append(row)
    if not tasks:
        raise ConfigError(f"tasks file {path} holds no task; write one JSON object per line")
    return tasks


def check_tasks(tasks: Any, source: str) -> list[dict[str, Any]]:
    """``tasks`` as a list, once every item is checked to be a task: a mapping with string keys that can be stored
    as JSON.

    Args:
        tasks: what a tasks module returned.
        source: where it came from, for the message (e.g. ``tasks module 'my.tasks' load_train_tasks()``).

    Raises:
        ConfigError: ``tasks`` is not a list (or tuple), or an item is not such a mapping; the message names
            ``source`` and the item's index.
    """
    from pydantic_core import PydanticSerializationError, to_json

    if not isinstance(tasks, list | tuple):
        raise ConfigError(f"{source} returned {_kind(tasks)}, not a list of tasks (dicts)")
    for index, task in enumerate(tasks):
        if not isinstance(task, dict) or not all(isinstance(key, str) for key in task):
            raise ConfigError(
                f"{source}: item {index} is {_kind(task)} {_clip(repr(task))}, not a task; each task must be a dict "
                "with string keys (a JSON object)"
            )
        try:
            to_json(task)
        except PydanticSerializationError as exc:
            raise ConfigError(f"{source}: item {index} cannot be stored as JSON ({exc})") from None
    return list(tasks)


def _kind(value: Any) -> str:
    """``a str``, ``an int``, ``null``... for a message."""
    if value is None:
        return "null"
    name = {"str": "string", "dict": "object", "list": "list"}.get(type(value).__name__, type(value).__name__)
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _clip(text: str, limit: int = 60) -> str:
    text = text.strip()
    return f"({text})" if len(text) <= limit else f"({text[:limit]}...)"


class TasksFile:
    """A JSON Lines tasks file behind the interface of a tasks module (``load_train_tasks`` / ``load_val_sets``), so
    every command that reads a config's ``tasks`` takes a file too. It has no validation sets of its own."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tasks = read_tasks_file(path)

    def load_train_tasks(self, size: int | None = None) -> list[dict[str, Any]]:
        """The first ``size`` tasks of the file (``None``: all)."""
        return list(self.tasks if size is None else self.tasks[:size])

    def load_val_sets(self, n_per_set: int | None = None) -> dict[str, list[dict[str, Any]]]:
        """No validation sets: give them with ``val_tasks``."""
        return {}


def load_task_sets(config: TrainConfig) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """The training tasks (``train_size`` of them) and the validation sets (``val_size`` tasks each; none when the
    job evaluates nothing) of ``config``, every task checked, so a bad one stops the job before the model loads.

    Raises:
        ConfigError: as :func:`load_tasks_module` and :func:`read_tasks_file` (file and line number), or a task the
            module returned is not a dict (:func:`check_tasks`: module, function and index), or there is no
            training task.
    """
    module = load_tasks_module(config.tasks)
    source = config.tasks if is_tasks_file(config.tasks) else f"tasks module {config.tasks!r}"
    train = check_tasks(module.load_train_tasks(size=config.train_size), f"{source} load_train_tasks()")
    if not train:
        raise ConfigError(f"{source} gave no training task (train_size={config.train_size})")
    val_sets: dict[str, list[dict[str, Any]]] = {}
    if config.val_size != 0 and (config.eval_before or config.eval_after or config.eval_every):
        if config.val_tasks is not None:
            path = Path(config.val_tasks)
            val_sets = {path.stem: read_tasks_file(path)[: config.val_size]}
        else:
            found = module.load_val_sets(n_per_set=config.val_size)
            if not isinstance(found, dict):
                raise ConfigError(f"{source} load_val_sets() returned {_kind(found)}, not a dict of set name -> tasks")
            val_sets = {
                str(name): check_tasks(tasks, f"{source} load_val_sets() set {name!r}") for name, tasks in found.items()
            }
    return train, val_sets


def load_tasks_module(name: str) -> Any:
    """Import the tasks module ``name`` and check its two functions; a ``name`` ending in ``.jsonl`` is read as a
    :class:`TasksFile` instead. Either way the current folder is put first on ``sys.path``, so the job's agent module
    (imported next, and by the runner processes, which inherit the path) is found there too.

    Raises:
        ConfigError: it cannot be imported (e.g. the calc example outside a clone of the repository) or lacks
            ``load_train_tasks`` / ``load_val_sets``; or, for a file, as :func:`read_tasks_file`.
    """
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    if is_tasks_file(name):
        return TasksFile(Path(name.strip()))
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        hint = (
            "; the calc example lives in examples/calc_agent: run from the root of a clone of the agentbolt repository"
            if name.startswith("examples.")
            else f"; run agentbolt from the folder that holds {name.split('.')[0]!r}, or add that folder to PYTHONPATH"
        )
        raise ConfigError(f"cannot import the tasks module {name!r} ({exc}){hint}") from exc
    for function in ("load_train_tasks", "load_val_sets"):
        if not callable(getattr(module, function, None)):
            raise ConfigError(f"tasks module {name!r} has no function {function}(); see TrainConfig.tasks")
    return module


def load_test_tasks(module: Any, name: str, instead: str) -> list[Any]:
    """The test split of a tasks module loaded by :func:`load_tasks_module` (its ``load_test_tasks()``), for the job
    whose tasks setting is ``name``.

    Raises:
        ConfigError: it has no ``load_test_tasks`` (a tasks file never has); the message names ``instead``, what
            to run for the validation split.
    """
    if not callable(getattr(module, "load_test_tasks", None)):
        raise ConfigError(
            f"the test split needs test tasks: {name!r} has no load_test_tasks() (a tasks file has only the train "
            f"and val splits; put the tasks in a Python module with load_test_tasks() for a test split), or {instead}"
        )
    return list(module.load_test_tasks())


def read_settings(path: Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The mapping of settings in a YAML file, with ``key.sub=value`` overrides applied on top.

    Args:
        path: the YAML file (a mapping).
        overrides: ``dotted.key=value`` strings; each value is read as YAML (``3``, ``0.5``, ``true``, ``rloo``).

    A relative ``tasks`` or ``val_tasks`` file is read relative to the current folder; when it is not there but is
    next to the config file, that one is taken (so ``agentbolt train my_agent/config.yaml`` with
    ``tasks: tasks.jsonl`` works from the folder above).

    Raises:
        ConfigError: the file is missing, unreadable (a directory), empty (without overrides) or not a YAML mapping,
            or an override has no ``=``, a value that is not valid YAML, or goes through a value that is not a
            section.
    """
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        reason = exc.strerror or exc
        raise ConfigError(f"cannot read config file {path}: {reason}; give the path of a YAML file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    if data is None:
        if not overrides:  # an empty file would run the whole default job (the calc example), which nobody asked for
            raise ConfigError(
                f"{path} is empty; write the job's settings in it (at least model, agent and tasks; see "
                "examples/calc_agent/config.yaml), or use 'agentbolt demo'"
            )
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of settings (key: value), got {type(data).__name__}")
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} must look like key=value, e.g. grpo.advantage_estimator=rloo")
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part} is not a section")
            node = child
        try:
            node[parts[-1]] = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or exc
            raise ConfigError(
                f"override {item!r}: the value is not valid YAML ({problem}); quote it, "
                f"e.g. --set '{key.strip()}=\"...\"'"
            ) from None
    for key in ("tasks", "val_tasks"):
        value = data.get(key)
        if isinstance(value, str) and is_tasks_file(value):
            data[key] = str(_next_to_config(key, Path(value.strip()).expanduser(), path))
    return data


def _next_to_config(key: str, file: Path, config: Path) -> Path:
    """``file`` as given when it is absolute or exists from the current folder; else the same relative path next to
    ``config`` when that exists.

    Raises:
        ConfigError: a relative ``file`` is in neither place (the message names ``key`` and both paths).
    """
    if file.is_absolute() or file.exists():
        return file
    beside = config.parent / file
    if beside.exists():
        return beside
    raise ConfigError(
        f"{config}: {key} file {file} does not exist; looked in {file.resolve()} (the current folder) and "
        f"{beside.resolve()} (next to the config file)"
    )


ConfigT = TypeVar("ConfigT", bound=_Config)


def validate_settings(model: type[ConfigT], data: dict[str, Any], path: Path, overrides: Sequence[str] = ()) -> ConfigT:
    """``model.model_validate(data)``, with a validation error turned into one ConfigError naming each bad field
    (an unknown one with the nearest known names; one set by an ``overrides`` item with that item)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_problems(exc, lambda loc: model, overrides)}") from None


def load_train_config(path: Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read a :class:`TrainConfig` from a YAML file, with ``key.sub=value`` overrides (see :func:`read_settings`).

    Raises:
        ConfigError: as :func:`read_settings`, or a value is invalid (the message names the field).
    """
    return validate_settings(TrainConfig, read_settings(path, overrides), path, overrides)


ALGORITHMS = ("lightningrl", "apo", "gepa")
"""The values of ``algorithm`` in a job file: RL (the default) or one of the two prompt optimizers."""


def _job_adapter() -> TypeAdapter[Any]:
    from agentbolt.trainer.prompt_opt import PromptOptConfig

    return TypeAdapter(Annotated[TrainConfig | PromptOptConfig, Field(discriminator="algorithm")])


def load_job_config(path: Path, overrides: Sequence[str] = ()) -> TrainConfig | PromptOptConfig:
    """The job of ``agentbolt train``: a :class:`TrainConfig` (``algorithm: lightningrl`` or absent) or a
    :class:`~agentbolt.trainer.prompt_opt.PromptOptConfig` (``algorithm: apo`` or ``gepa``), picked by ``algorithm``
    (a discriminated union) and validated whole before anything runs.

    Raises:
        ConfigError: as :func:`read_settings`, an unknown ``algorithm``, or an invalid value (the message names it).
    """
    data = read_settings(path, overrides)
    algorithm = data.setdefault("algorithm", "lightningrl")
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"{path}: algorithm {algorithm!r} is unknown; use one of {', '.join(ALGORITHMS)}")
    try:
        return _job_adapter().validate_python(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_problems(exc, _job_model, overrides, strip_tag=True)}") from None


def _job_model(loc: Sequence[object]) -> type[_Config]:
    """The config class a job error's location starts in (its first item is the ``algorithm`` tag)."""
    if loc and loc[0] in ("apo", "gepa"):
        from agentbolt.trainer.prompt_opt import PromptOptConfig

        return PromptOptConfig
    return TrainConfig


def _known_fields(model: type[BaseModel], path: Sequence[str]) -> list[str]:
    """The field names of the config section at ``path`` under ``model`` (empty when it is not a config)."""
    current: Any = model
    for part in path:
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        current = field.annotation
    if not (isinstance(current, type) and issubclass(current, BaseModel)):
        return []
    return list(current.model_fields)


def _field_paths(model: type[BaseModel], prefix: str = "", depth: int = 2) -> list[str]:
    """Dotted names of every setting under ``model``, sections included, down to ``depth`` levels."""
    paths: list[str] = []
    for name, field in model.model_fields.items():
        paths.append(prefix + name)
        kind = field.annotation
        if depth > 1 and isinstance(kind, type) and issubclass(kind, BaseModel):
            paths += _field_paths(kind, f"{prefix}{name}.", depth - 1)
    return paths


def _problems(
    exc: ValidationError,
    model_of: Callable[[Sequence[object]], type[_Config]],
    overrides: Sequence[str] = (),
    *,
    strip_tag: bool = False,
) -> str:
    """One line naming each bad field of a validation error (the union's tag left out of the path): an unknown
    field with the closest known names of its section (``difflib``), a field an override set with that override
    (``--set key=value``), an error of the whole config (no field) by its message alone."""
    set_by = {item.partition("=")[0].strip(): item for item in overrides}
    parts = []
    for error in exc.errors():
        loc = [str(x) for x in error["loc"]]
        model = model_of(error["loc"])
        if strip_tag and loc and loc[0] in ALGORITHMS:
            loc = loc[1:]
        message = str(error["msg"]).removeprefix("Value error, ")
        where = ".".join(loc)
        if error["type"] == "extra_forbidden":
            known = _known_fields(model, loc[:-1])
            prefix = ".".join(loc[:-1]) + "." if len(loc) > 1 else ""
            close = [prefix + name for name in difflib.get_close_matches(loc[-1], known, n=3, cutoff=0.6)]
            if not close:  # a setting of another section, e.g. "steps" for grpo.steps
                close = [path for path in _field_paths(model) if path.rsplit(".", 1)[-1] == loc[-1]][:3]
            message = "unknown setting" + (
                f"; did you mean {' or '.join(close)}?"
                if close
                else f"; known here: {', '.join(known)}"
                if known
                else ""
            )
        item = set_by.get(where) or next((v for k, v in set_by.items() if where and k.startswith(where + ".")), None)
        if item is not None:  # the field, or a section that only this override created
            where = f"{where} (--set {item})"
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)
