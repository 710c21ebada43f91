"""The ``agentbolt`` command line (Typer). Each command parses options into a config object and calls one function;
heavy modules are imported inside the commands so ``agentbolt --help`` stays fast."""

from __future__ import annotations

import asyncio
import logging
import shlex
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError
from rich.console import Console

from agentbolt.errors import AgentboltError

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="agentbolt: train any LLM agent from its own executions."
)
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


def _run_job(job: Coroutine[Any, Any, Any], *, on_stop: str | None = None) -> None:
    """Run a long job (``train``, ``demo``) until it ends or SIGINT/SIGTERM arrives; a signal cancels it, so its
    runners are stopped and its store closed on the way out (everything finished stays in the store), then exit 130.
    ``on_stop`` is printed after a signal (e.g. the command that resumes the run)."""

    async def main() -> None:
        import signal

        task = asyncio.ensure_future(job)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            console.print("stopped by a signal; the store keeps every rollout and span recorded so far")
            if on_stop:
                console.print(on_stop)
            raise typer.Exit(130) from None

    asyncio.run(main())


def _fail(exc: Exception) -> None:
    if isinstance(exc, ValidationError):  # a config object refused the options: show only the reasons
        message = "; ".join(str(err.get("msg", err)) for err in exc.errors())
    else:
        message = str(exc)
    err_console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code=2)


@app.command()
def serve(
    store: str = typer.Option(
        "sqlite:///agentbolt.db", help="store URL: memory://, sqlite:///path.db or postgresql://user@host/db"
    ),
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8765, help="TCP port (0 = any free port)"),
    model: str | None = typer.Option(
        None,
        help="the model behind the gateway: an embedded model (qwen2.5-0.5b, qwen2.5-coder-1.5b, smollm2-135m) for "
        "--backend embedded, else the remote model name (vllm: default its first model)",
    ),
    backend_kind: str | None = typer.Option(
        None,
        "--backend",
        help="inference backend: embedded (default when --model is given), vllm or openai (need --backend-url)",
    ),
    backend_url: str | None = typer.Option(
        None, help="API root of the vllm or openai backend's server, e.g. http://127.0.0.1:8000/v1"
    ),
    api_key: str | None = typer.Option(
        None, envvar="AGENTBOLT_BACKEND_API_KEY", help="API key for the vllm or openai backend's server"
    ),
    token: str | None = typer.Option(
        None, envvar="AGENTBOLT_TOKEN", help="require 'Authorization: Bearer TOKEN' on every route"
    ),
    max_body_mb: float = typer.Option(
        16.0, help="largest accepted request body in MiB (413 above it; OTLP bodies also after decompression)"
    ),
    adapter: Path | None = typer.Option(
        None,
        help="serve a trained policy: a checkpoint folder OUT/checkpoints/step-N (its LoRA adapter is merged into "
        "the embedded model; --model defaults to the one it was trained from)",
    ),
) -> None:
    """Run the store API, OTLP ingestion (POST /v1/traces) and the LLM gateway."""
    from agentbolt.server.app import create_app
    from agentbolt.server.middleware import MIB
    from agentbolt.server.serving import serve_in_background
    from agentbolt.store import build_store, redact_url

    max_body_bytes = int(max_body_mb * MIB)
    if max_body_bytes < 1:
        _fail(ValueError(f"--max-body-mb must be positive, got {max_body_mb}"))
    served_version = None
    if adapter is not None:
        try:
            model, served_version = _adapter_model(adapter, model, backend_kind)
        except AgentboltError as exc:
            _fail(exc)
    kind = backend_kind or ("embedded" if model is not None else None)
    if backend_url and kind in (None, "embedded"):
        _fail(
            ValueError(
                "--backend-url is for a remote backend; add --backend vllm or --backend openai "
                "(the embedded backend runs in this process and has no URL)"
            )
        )

    async def main() -> None:
        import signal

        backend = None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):  # both stop the server and close the store cleanly
            loop.add_signal_handler(sig, stop.set)
        if kind is not None:
            from agentbolt.inference.backends import open_backend

            backend = await open_backend(kind, model=model, url=backend_url, api_key=api_key)
            if adapter is not None:
                from agentbolt.algorithms.rl.weight_sync import apply_adapter
                from agentbolt.inference.embedded import EmbeddedBackend

                assert isinstance(backend, EmbeddedBackend)  # _adapter_model refused the remote backends
                changed = await asyncio.to_thread(apply_adapter, backend.model, adapter)
                backend.set_model_version(served_version or adapter.name)
                console.print(f"serving {model} with the LoRA adapter of {adapter} ({changed} weight matrices merged)")
        st = build_store(store)
        try:
            await st.query_workers()  # open the store now: a bad file or an unreachable database fails here, plainly
            server_app = create_app(st, backend, token=token, max_body_bytes=max_body_bytes)
            async with serve_in_background(server_app, host, port) as url:
                console.print(f"agentbolt serving on {url} (store {redact_url(store)}); Ctrl-C to stop")
                console.print(f"dashboard: {url}/" + (" (it asks for the token once)" if token else ""))
                await stop.wait()
                console.print("agentbolt server stopping")
        finally:
            await st.close()
            if backend is not None:
                await backend.close()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    except AgentboltError as exc:
        _fail(exc)


def _adapter_model(adapter: Path, model: str | None, backend_kind: str | None) -> tuple[str, str | None]:
    """The embedded model to load for ``serve --adapter`` and the weights version to stamp on its calls.

    Raises:
        ConfigError: a remote backend, a folder without an adapter or with a damaged one, or ``--model`` other than
            the checkpoint's.
    """
    from agentbolt.algorithms.rl.adapter_files import check_adapter_files
    from agentbolt.errors import ConfigError
    from agentbolt.trainer.checkpoint import CHECKPOINT_FILE, read_checkpoint

    if backend_kind not in (None, "embedded"):
        raise ConfigError("--adapter needs the embedded backend (it merges the adapter into the weights it serves)")
    if not adapter.is_dir():
        raise ConfigError(f"--adapter {adapter}: no such folder; give a checkpoint folder OUT/checkpoints/step-N")
    check_adapter_files(adapter)  # a damaged adapter fails here, before the model loads
    if not (adapter / CHECKPOINT_FILE).is_file():  # a bare peft adapter folder: the model must be named
        if model is None:
            raise ConfigError(f"{adapter} is not an agentbolt checkpoint; name its base model with --model")
        return model, None
    info = read_checkpoint(adapter)
    if model is not None and model != info.model:
        raise ConfigError(f"{adapter} was trained from {info.model!r}, not {model!r}; drop --model or pass that one")
    return info.model, info.model_version


@app.command()
def run(
    agent: str = typer.Option(
        ..., help="the agent as 'package.module:attribute': a @rollout function, a LitAgent or a plain function"
    ),
    store: str = typer.Option("http://127.0.0.1:8765", help="URL of the agentbolt server (agentbolt serve)"),
    concurrency: int = typer.Option(1, help="rollouts run at once by this runner"),
    instrument: list[str] | None = typer.Option(
        None,
        help="a framework to instrument (repeat for several: openai, langchain, openai-agents, autogen-agentchat, "
        "crewai, litellm); default: every one whose instrumentor and framework are installed",
    ),
    no_instrument: bool = typer.Option(False, "--no-instrument", help="instrument no framework"),
    exit_after: int | None = typer.Option(
        None, help="exit after this many attempts ended (succeeded or failed); default: run until Ctrl-C / SIGTERM"
    ),
    worker_id: str | None = typer.Option(None, help="name reported to the store (default: runner-<random hex>)"),
    app_dir: Path = typer.Option(
        Path("."), help="folder put first on sys.path before importing the agent (default: the current folder)"
    ),
    token: str | None = typer.Option(None, envvar="AGENTBOLT_TOKEN", help="bearer token of the server"),
    ray_runners: int = typer.Option(
        0,
        help="fan out on Ray: this many runners, one Ray actor each (--concurrency and --exit-after apply to each; "
        "--worker-id becomes their name prefix); 0: one runner in this process. Needs pip install 'agentbolt\\[ray]'",
    ),
    ray_address: str | None = typer.Option(
        None, help="with --ray-runners: the Ray cluster to join ('auto', 'ray://host:10001'); default: a local Ray"
    ),
) -> None:
    """Run a runner: claim rollouts from the server, run the agent on each, report the outcomes (agent side only)."""
    import signal
    import sys

    from agentbolt.client import HttpLightningStore
    from agentbolt.runner.processes import load_agent
    from agentbolt.runner.worker import Runner

    logging.basicConfig(level=logging.WARNING)
    if concurrency < 1:
        _fail(ValueError(f"--concurrency must be >= 1, got {concurrency}"))
    if exit_after is not None and exit_after < 1:
        _fail(ValueError(f"--exit-after must be >= 1, got {exit_after}"))
    if no_instrument and instrument:
        _fail(ValueError("--no-instrument and --instrument exclude each other"))
    if ray_runners < 0:
        _fail(ValueError(f"--ray-runners must be >= 0, got {ray_runners}"))
    if ray_address is not None and not ray_runners:
        _fail(ValueError("--ray-address needs --ray-runners N"))
    sys.path.insert(0, str(app_dir.resolve()))
    frameworks: bool | list[str] = False if no_instrument else (list(instrument) if instrument else True)
    if ray_runners:
        _run_on_ray(
            agent, store, ray_runners, concurrency, frameworks, exit_after, worker_id, app_dir, token, ray_address
        )
        return

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        client = HttpLightningStore(store, token=token)
        runner = Runner(load_agent(agent), client, worker_id=worker_id, concurrency=concurrency, instrument=frameworks)

        def stopped() -> bool:
            ended = runner.stats.succeeded + runner.stats.failed
            return stop.is_set() or (exit_after is not None and ended >= exit_after)

        try:
            console.print(f"agentbolt runner {runner.worker_id} running {agent} against {store}")
            stats = await runner.run(stop=stopped)
            console.print(
                f"runner {runner.worker_id} stopped: {stats.succeeded} succeeded, {stats.failed} failed, "
                f"{stats.spans_written} spans written, {stats.span_write_errors + stats.spans_dropped} spans lost"
            )
        finally:
            await client.close()

    try:
        asyncio.run(main())
    except AgentboltError as exc:
        _fail(exc)


def _run_on_ray(
    agent: str,
    store: str,
    runners: int,
    concurrency: int,
    frameworks: bool | list[str],
    exit_after: int | None,
    worker_id: str | None,
    app_dir: Path,
    token: str | None,
    ray_address: str | None,
) -> None:
    """``agentbolt run --ray-runners N``: N runners as Ray actors; until each hit --exit-after, Ctrl-C or SIGTERM."""
    import signal
    import threading
    import time

    from agentbolt.runner.ray_runners import RayRunnerPool

    pool = RayRunnerPool(
        agent,
        store,
        runners=runners,
        concurrency=concurrency,
        token=token,
        exit_after=exit_after,
        ray_address=ray_address,
        python_path=[str(app_dir.resolve())],
        instrument=frameworks,
        worker_prefix=worker_id or "ray",
    )
    try:
        pool.start()
        stopping = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stopping.set())  # after ray.init, which sets its own
        names = ", ".join(pool.worker_ids)
        console.print(f"agentbolt: {runners} Ray runners ({names}) running {agent} against {store}")
        try:
            while not stopping.is_set() and not pool.done():
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        stats = pool.stop()
        console.print(
            f"{runners} Ray runners stopped: {stats.succeeded} succeeded, {stats.failed} failed, "
            f"{stats.spans_written} spans written, {stats.span_write_errors + stats.spans_dropped} spans lost"
        )
    except (AgentboltError, TimeoutError) as exc:
        pool.stop(timeout_s=5.0)
        _fail(exc)


@app.command()
def demo(
    steps: int = typer.Option(4, help="GRPO steps"),
    out: Path = typer.Option(Path("runs/demo"), help="output directory"),
    model: str = typer.Option("qwen2.5-0.5b", help="embedded model: qwen2.5-0.5b, qwen2.5-coder-1.5b or smollm2-135m"),
    tasks_per_step: int = typer.Option(4, help="distinct tasks per step"),
    group_size: int = typer.Option(4, help="rollouts per task (GRPO group)"),
    val_size: int = typer.Option(8, help="tasks per validation set"),
    overwrite: bool = typer.Option(False, help="replace an existing OUT/store.db"),
    seed: int = typer.Option(0, help="task sampling seed"),
    device: str = typer.Option("cpu", help="where the model is served and trained: cpu, cuda or cuda:N"),
) -> None:
    """Train the calculator agent with GRPO on this machine and report validation accuracy before and after."""
    from agentbolt.config import GRPOConfig
    from agentbolt.trainer.job import run_training
    from agentbolt.trainer.job_config import TrainConfig

    logging.basicConfig(level=logging.WARNING)
    try:
        config = TrainConfig(
            out_dir=out,
            model=model,
            grpo=GRPOConfig(steps=steps, tasks_per_step=tasks_per_step, group_size=group_size, seed=seed),
            val_size=val_size,
            overwrite=overwrite,
            device=device,
        )
        _run_job(run_training(config, console))
    except (AgentboltError, ValidationError) as exc:
        _fail(exc)


@app.command()
def train(
    config: Path = typer.Argument(..., help="YAML file of the job's settings, e.g. examples/calc_agent/config.yaml"),
    set_: list[str] | None = typer.Option(
        None,
        "--set",
        help="override one setting, as dotted.key=value (repeatable), e.g. --set grpo.advantage_estimator=rloo",
    ),
    out: Path | None = typer.Option(None, help="output directory (overrides out_dir of the file)"),
    overwrite: bool = typer.Option(False, help="replace an existing OUT/store.db and OUT/checkpoints"),
    resume: bool = typer.Option(
        False, help="RL: continue the run in OUT from its newest complete checkpoint, on the same store"
    ),
) -> None:
    """Train an agent on this machine from a YAML config: LightningRL (writes store.db, checkpoints/step-N,
    summary.json, reward_curve.png), or with algorithm apo / gepa prompt optimization (writes store.db, summary.json,
    the best prompt and its diff from the seed)."""
    from agentbolt.errors import ConfigError
    from agentbolt.trainer.job import run_training
    from agentbolt.trainer.job_config import TrainConfig, load_job_config, validate_settings
    from agentbolt.trainer.prompt_opt import run_prompt_optimization

    logging.basicConfig(level=logging.WARNING)
    overrides = list(set_ or [])
    if out is not None:
        overrides.append(f"out_dir={out}")
    if overwrite:
        overrides.append("overwrite=true")
    try:
        job = load_job_config(config, overrides)
        if resume:
            if not isinstance(job, TrainConfig):
                raise ConfigError(f"{config}: --resume continues an RL run; a prompt-optimization job cannot resume")
            job = validate_settings(TrainConfig, {**job.to_settings(), "resume": True}, config)
        if isinstance(job, TrainConfig):
            sets = [arg for item in set_ or [] for arg in ("--set", item)]
            resume_command = shlex.join(
                ["agentbolt", "train", str(config), "--out", str(job.out_dir), *sets, "--resume"]
            )
            _run_job(run_training(job, console), on_stop=f"continue it from its last checkpoint: {resume_command}")
        else:
            _run_job(run_prompt_optimization(job, console))
    except (AgentboltError, ValidationError) as exc:
        _fail(exc)


@app.command(name="eval")
def eval_(
    config: Path = typer.Argument(
        ...,
        help="YAML file of the job: an RL config with --checkpoint (examples/calc_agent/config.yaml), or a "
        "prompt-optimization config with --resources (examples/room_agent/config.yaml)",
    ),
    checkpoint: Path | None = typer.Option(
        None, help="RL: the checkpoint to score, OUT/checkpoints/step-N (its LoRA adapter is served)"
    ),
    resources: str | None = typer.Option(None, help="prompt optimization: the resources version to evaluate (rs-N)"),
    split: str = typer.Option(
        "val", help="val (the validation tasks the train job scores) or test (the tasks module's load_test_tasks)"
    ),
    store: Path | None = typer.Option(
        None, help="prompt optimization: the SQLite store file holding the version (default: out_dir/store.db)"
    ),
    out: Path | None = typer.Option(
        None,
        help="where eval.json (and, for a checkpoint, a new store.db) is written (default: out_dir/eval-rs-N-SPLIT, "
        "or OUT/eval-step-N-SPLIT beside the checkpoints)",
    ),
    overwrite: bool = typer.Option(False, help="checkpoint: replace the store of an earlier evaluation in --out"),
    set_: list[str] | None = typer.Option(
        None, "--set", help="override one setting of the config, as dotted.key=value (repeatable), e.g. --set model=..."
    ),
) -> None:
    """Score a trained agent on a config's val or test tasks with the config's model and agent: an RL checkpoint
    (its adapter served; a new store in the output folder) or a stored prompt version (rollouts go into its store).
    The accuracy table is printed and written to eval.json."""
    from agentbolt.errors import ConfigError
    from agentbolt.trainer.job_config import TrainConfig, load_job_config

    logging.basicConfig(level=logging.WARNING)
    try:
        job = load_job_config(config, list(set_ or []))
        if isinstance(job, TrainConfig):
            if checkpoint is None or resources is not None:
                raise ConfigError(
                    f"{config} is an RL job: score one of its checkpoints with --checkpoint OUT/checkpoints/step-N"
                )
            from agentbolt.trainer.checkpoint_eval import run_checkpoint_eval

            _run_job(
                run_checkpoint_eval(
                    job, checkpoint=checkpoint, split=split, out_dir=out, overwrite=overwrite, console=console
                )
            )
            return
        if resources is None or checkpoint is not None:
            raise ConfigError(f"{config} is a prompt-optimization job: name the prompt version with --resources rs-N")
        from agentbolt.trainer.evaluate import run_eval

        _run_job(run_eval(job, resources_id=resources, split=split, store_path=store, out_dir=out, console=console))
    except (AgentboltError, ValidationError) as exc:
        _fail(exc)


@app.command()
def plot(
    summaries: list[Path] = typer.Argument(..., help="summary.json files written by agentbolt train / demo"),
    out: Path = typer.Option(Path("reward_curves.png"), help="the PNG to write"),
    label: str = typer.Option(
        "advantage_estimator",
        help="the summary field that names each curve (advantage_estimator, credit_assignment, async_rollouts), "
        "or 'dir' for the run's folder name",
    ),
) -> None:
    """Plot the train-reward curves of several runs in one figure (e.g. one run per advantage estimator)."""
    import json

    from agentbolt.trainer.plots import plot_reward_curves

    runs: dict[str, list[float]] = {}
    try:
        for path in summaries:
            try:
                summary = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise AgentboltError(f"cannot read {path}: {exc}") from None
            if not isinstance(summary, dict) or "train_reward" not in summary:
                raise AgentboltError(f"{path} is not a summary.json of agentbolt train (no train_reward)")
            name = path.parent.name if label == "dir" else str(summary.get(label, path.parent.name))
            if name in runs:
                name = f"{name} ({path.parent.name})"
            runs[name] = [float(x) for x in summary["train_reward"]]
            console.print(f"{name}: {[round(r, 3) for r in runs[name]]}")
        plot_reward_curves(out, runs)
    except AgentboltError as exc:
        _fail(exc)
    console.print(f"wrote {out}")


STORE_HELP = (
    "the store: its SQLite file (runs/demo/store.db, sqlite:///path.db), the http(s):// address of a running "
    "`agentbolt serve`, or a postgresql:// URL"
)


@app.command()
def export(
    store: str = typer.Option(..., help=STORE_HELP),
    kind: str = typer.Option(
        ..., help="sft: OpenAI chat fine-tuning rows; rl: one row per training sample with exact token ids"
    ),
    out: Path = typer.Option(..., help="the file to write (replaced if it exists)"),
    format_: str = typer.Option("jsonl", "--format", help="jsonl or parquet (parquet needs pyarrow)"),
    mode: str | None = typer.Option(None, help="only rollouts of this mode: train, val or test (default: all)"),
    resources: str | None = typer.Option(None, help="only rollouts that ran against this resources id (rs-N)"),
    min_reward: float | None = typer.Option(None, help="only rollouts whose final reward is >= this"),
    credit: str = typer.Option("broadcast", help="rl: credit assignment (broadcast, discounted, intermediate)"),
    estimator: str = typer.Option("grpo", help="rl: advantage estimator (grpo, grpo_no_std, rloo, reinforce_pp...)"),
    merge: bool = typer.Option(True, "--merge/--no-merge", help="rl: merge calls that extend each other"),
    agent_match: str | None = typer.Option(None, help="rl: only calls of agents whose name matches this regex"),
    token: str | None = typer.Option(None, envvar="AGENTBOLT_TOKEN", help="bearer token of the server"),
) -> None:
    """Export finished rollouts as a data set: SFT conversations or RL training samples, as JSON Lines or Parquet."""
    from agentbolt.cli.export import ExportConfig, run_export

    try:
        config = ExportConfig(
            store=store,
            kind=kind,  # type: ignore[arg-type]  # validated by the config
            format=format_,  # type: ignore[arg-type]
            out=out,
            mode=mode,  # type: ignore[arg-type]
            resources_id=resources,
            min_reward=min_reward,
            credit_assignment=credit,
            advantage_estimator=estimator,
            merge_samples=merge,
            agent_match=agent_match,
        )
        asyncio.run(run_export(config, token=token, console=console))
    except (AgentboltError, ValidationError) as exc:
        _fail(exc)


@app.command()
def inspect(
    rollout_id: str = typer.Argument(..., help="the rollout (ro-...)"),
    store: str = typer.Option(..., help=STORE_HELP),
    attempt: int | None = typer.Option(None, help="the attempt number to show (1, 2, ...; default: the latest)"),
    json_: bool = typer.Option(False, "--json", help="print JSON (rollout, attempts, span tree, raw spans)"),
    token: str | None = typer.Option(None, envvar="AGENTBOLT_TOKEN", help="bearer token of the server"),
) -> None:
    """Show one rollout: status, attempts (with errors) and an attempt's span tree (LLM calls, tools, rewards)."""
    import json

    from agentbolt.cli.inspect_cmd import load_inspection, render
    from agentbolt.cli.stores import open_store

    async def main() -> None:
        st = open_store(store, token=token)
        try:
            inspection = await load_inspection(st, rollout_id, attempt_sequence=attempt)
        finally:
            await st.close()
        if json_:
            typer.echo(json.dumps(inspection.to_json(), ensure_ascii=False, indent=2))
        else:
            console.print(render(inspection))

    try:
        asyncio.run(main())
    except AgentboltError as exc:
        _fail(exc)


@app.command(name="export-model")
def export_model(
    checkpoint: Path = typer.Argument(
        ..., help="a checkpoint folder written by a training run: OUT/checkpoints/step-N"
    ),
    out: Path = typer.Option(..., help="the folder to write (a Hugging Face model folder)"),
    gguf: bool = typer.Option(False, "--gguf", help="also write model.gguf for llama.cpp / Ollama (embedded models)"),
    gguf_dtype: str = typer.Option("f16", help="weight type of the GGUF: f16 (widest support) or bf16 (bit-exact)"),
    overwrite: bool = typer.Option(False, help="replace OUT if it exists and is not empty"),
) -> None:
    """Merge a checkpoint's LoRA adapter into its base model and write a model folder that plain transformers loads
    (and, with --gguf, a GGUF for llama.cpp and Ollama): the weights the agent was served during training."""
    from agentbolt.trainer.export_model import GGUF_FILE, export_merged_model

    logging.basicConfig(level=logging.WARNING)
    try:
        with console.status(f"merging {checkpoint} into its base model"):
            result = export_merged_model(
                checkpoint,
                out,
                gguf=gguf,
                gguf_dtype=gguf_dtype,  # type: ignore[arg-type]  # checked by export_merged_model
                overwrite=overwrite,
            )
    except AgentboltError as exc:
        _fail(exc)
        return
    console.print(
        f"wrote {result.out_dir} ({result.size_bytes / 1e6:.0f} MB, {result.duration_s:.1f} s): {result.model} with "
        f"the LoRA adapter of {result.checkpoint_dir} merged into {result.merged_tensors} weight matrices"
    )
    console.print("  " + ", ".join(result.files))
    console.print("load it with transformers:")
    console.print(
        "  from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"  model = AutoModelForCausalLM.from_pretrained({str(result.out_dir)!r})\n"
        f"  tokenizer = AutoTokenizer.from_pretrained({str(result.out_dir)!r})",
        markup=False,
        highlight=False,
    )
    if result.gguf_file is not None:
        console.print(f"the GGUF ({result.gguf_dtype}): {result.gguf_file}")
        console.print(f"  llama.cpp: llama-cli -m {result.gguf_file}", markup=False, highlight=False)
        console.print(
            f"  Ollama: a Modelfile with the line 'FROM {result.gguf_file}', then ollama create NAME -f Modelfile",
            markup=False,
            highlight=False,
        )
    else:
        console.print(f"  (for llama.cpp / Ollama, export with --gguf: it adds {GGUF_FILE})", highlight=False)


if __name__ == "__main__":
    app()
