"""The ``agentbolt`` command line (Typer). Each command parses options into a config object and calls one function;
heavy modules are imported inside the commands so ``agentbolt --help`` stays fast."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

import typer
from pydantic import ValidationError

from agentbolt.cli import jobs
from agentbolt.cli.common import console, fail, print_table
from agentbolt.errors import AgentboltError

QUIET_BARS_ENV = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
"""Set (unless already set) when stderr is not a terminal: the tqdm bars of transformers and huggingface_hub (model
loading, GGUF conversion) would write carriage-return frames into a log file; agentbolt's own progress prints plain
lines there (:class:`agentbolt.trainer.progress_bars.JobProgress`). Child processes (runners) inherit them."""


def _quiet_bars_off_a_terminal() -> None:
    if not sys.stderr.isatty():
        for key, value in QUIET_BARS_ENV.items():
            os.environ.setdefault(key, value)


app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="agentbolt: train any LLM agent from its own executions.",
    callback=_quiet_bars_off_a_terminal,
)


DEFAULT_SERVE_STORE = "sqlite:///agentbolt.db"
"""The store of ``agentbolt serve`` without ``--store`` (created when missing)."""


@app.command()
def serve(
    store: str | None = typer.Option(
        None,
        help=f"store URL: memory://, sqlite:///path.db or postgresql://user@host/db (default {DEFAULT_SERVE_STORE}, "
        "created if missing); a SQLite file given here must exist, unless --create",
    ),
    create: bool = typer.Option(
        False, "--create", help="start a new, empty SQLite store when the --store file does not exist"
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
    from agentbolt.errors import ConfigError
    from agentbolt.server.app import create_app
    from agentbolt.server.middleware import MIB
    from agentbolt.server.serving import serve_in_background
    from agentbolt.store import SqliteLightningStore, build_store, redact_url

    max_body_bytes = int(max_body_mb * MIB)
    if max_body_bytes < 1:
        fail(ValueError(f"--max-body-mb must be positive, got {max_body_mb}"))
    served_version = None
    if adapter is not None:
        try:
            model, served_version = _adapter_model(adapter, model, backend_kind)
        except AgentboltError as exc:
            fail(exc)
    kind = backend_kind or ("embedded" if model is not None else None)
    if backend_url and kind in (None, "embedded"):
        fail(
            ValueError(
                "--backend-url is for a remote backend; add --backend vllm or --backend openai "
                "(the embedded backend runs in this process and has no URL)"
            )
        )

    if store is None:
        store, create = DEFAULT_SERVE_STORE, True
    try:
        st = build_store(store)
    except AgentboltError as exc:
        fail(exc)
    sqlite_path = st.path if isinstance(st, SqliteLightningStore) else None
    new_file = sqlite_path is not None and not sqlite_path.exists()
    if new_file and not create:
        fail(
            ConfigError(
                f"no store file at {str(sqlite_path)!r} (from --store {store}); check the path (sqlite:/// then a "
                "relative path, four slashes for an absolute one), or pass --create to start a new, empty store there"
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
                from agentbolt.algorithms.rl.adapter_files import untrained_adapter

                if untrained_adapter(adapter):
                    console.print(
                        f"warning: this adapter was never trained (every LoRA B matrix is 0): it answers as {model} "
                        "does; was every update of its run skipped? (its summary.json: updates_applied)",
                        style="bold yellow",
                        markup=False,
                        highlight=False,
                    )
        try:
            await st.query_workers()  # open the store now: a bad file or an unreachable database fails here, plainly
            server_app = create_app(st, backend, token=token, max_body_bytes=max_body_bytes)
            async with serve_in_background(server_app, host, port) as url:
                made = ", a new file" if new_file else ""  # e.g. ./agentbolt.db when --store was not given
                console.print(f"agentbolt serving on {url} (store {redact_url(store)}{made}); Ctrl-C to stop")
                console.print(f"dashboard: {url}/" + (" (it asks for the token once)" if token else ""))
                if adapter is not None and backend is not None:
                    # The checkpoint's agents run here unchanged: `agentbolt run` gives them this llm resource.
                    from agentbolt.types import LLM

                    llm = LLM(endpoint=f"{url}/v1", model=backend.model_name)
                    published = await st.add_resources({"llm": llm}, metadata={"served_adapter": str(adapter)})
                    console.print(
                        f"published resources {published.resources_id}: llm -> {llm.endpoint} ({llm.model}); "
                        f"runners (agentbolt run --store {url}) give it to your agent"
                    )
                await stop.wait()
                console.print("agentbolt server stopping")
                if backend is not None:  # first: running generations end at once (failed), and their calls are
                    closing, backend = backend, None  # recorded while the server and the store are still up
                    await closing.close()
        finally:
            await st.close()
            if backend is not None:
                await backend.close()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    except AgentboltError as exc:
        fail(exc)


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
    _near_miss_adapter(adapter)
    check_adapter_files(adapter)  # a damaged adapter fails here, before the model loads
    if not (adapter / CHECKPOINT_FILE).is_file():  # a bare peft adapter folder: the model must be named
        if model is None:
            raise ConfigError(f"{adapter} is not an agentbolt checkpoint; name its base model with --model")
        return model, None
    info = read_checkpoint(adapter)
    if model is not None and model != info.model:
        raise ConfigError(f"{adapter} was trained from {info.model!r}, not {model!r}; drop --model or pass that one")
    return info.model, info.model_version


def _near_miss_adapter(folder: Path) -> None:
    """Refuse, with the right argument to give, a folder that is next to a checkpoint rather than one: a run's output
    folder or its ``checkpoints`` folder (-> one of its checkpoints), or a full model folder such as
    ``export-model`` writes (-> ``--model FOLDER``: the adapter is merged into it already).

    Raises:
        ConfigError: naming the folder to give instead.
    """
    from agentbolt.algorithms.rl.adapter_files import ADAPTER_CONFIG
    from agentbolt.errors import ConfigError
    from agentbolt.trainer.checkpoint import best_checkpoint, list_checkpoints

    if (folder / ADAPTER_CONFIG).is_file():
        return
    out = folder.parent if folder.name == "checkpoints" else folder
    found = list_checkpoints(out)
    if found:
        best = best_checkpoint(found)
        chosen, which = (best, "the best by validation accuracy") if best else (found[-1], "the newest")
        what = "checkpoints folder" if out is not folder else "output folder"
        raise ConfigError(
            f"{folder} is a run's {what}, not one checkpoint; give one of its checkpoints "
            f"({', '.join(info.path.name for info in found)}), e.g. --adapter {chosen.path} ({which})"
        )
    if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
        raise ConfigError(
            f"{folder} is a whole model (as export-model writes), with any adapter merged into it already: serve it "
            f"with --model {folder} (no --adapter)"
        )


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
    from agentbolt.runner.isolation import default_isolation
    from agentbolt.runner.processes import load_agent
    from agentbolt.runner.worker import Runner

    logging.basicConfig(level=logging.WARNING)
    if concurrency < 1:
        fail(ValueError(f"--concurrency must be >= 1, got {concurrency}"))
    if exit_after is not None and exit_after < 1:
        fail(ValueError(f"--exit-after must be >= 1, got {exit_after}"))
    if no_instrument and instrument:
        fail(ValueError("--no-instrument and --instrument exclude each other"))
    if ray_runners < 0:
        fail(ValueError(f"--ray-runners must be >= 0, got {ray_runners}"))
    if ray_address is not None and not ray_runners:
        fail(ValueError("--ray-address needs --ray-runners N"))
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
        runner = Runner(
            load_agent(agent),
            client,
            worker_id=worker_id,
            concurrency=concurrency,
            instrument=frameworks,
            isolation=default_isolation(),
        )

        def stopped() -> bool:
            ended = runner.stats.succeeded + runner.stats.failed + runner.stats.timed_out
            return stop.is_set() or (exit_after is not None and ended >= exit_after)

        try:
            console.print(f"agentbolt runner {runner.worker_id} running {agent} against {store}")
            stats = await runner.run(stop=stopped)
            console.print(
                f"runner {runner.worker_id} stopped: {stats.succeeded} succeeded, {stats.failed} failed, "
                f"{stats.timed_out} timed out, "
                f"{stats.spans_written} spans written, {stats.span_write_errors + stats.spans_dropped} spans lost"
            )
        finally:
            await client.close()

    try:
        asyncio.run(main())
    except AgentboltError as exc:
        fail(exc)


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
        fail(exc)


app.command()(jobs.demo)
app.command()(jobs.train)
app.command(name="eval")(jobs.eval_)
app.command()(jobs.plot)


STORE_HELP = (
    "the store: its SQLite file (runs/demo/store.db, sqlite:///path.db), the http(s):// address of a running "
    "`agentbolt serve`, or a postgresql:// URL"
)


EXPORT_OPTIONS = {
    "resources_id": "--resources",
    "credit_assignment": "--credit",
    "advantage_estimator": "--estimator",
    "merge_samples": "--merge",
}
"""The ``export`` options whose ExportConfig field has another name (the others are ``--field-name``)."""


@app.command()
def export(
    store: str = typer.Option(..., help=STORE_HELP),
    kind: str = typer.Option(
        ..., help="sft: OpenAI chat fine-tuning rows; rl: one row per training sample with exact token ids"
    ),
    out: str = typer.Option(..., help="the file to write (replaced if it exists)"),
    format_: str | None = typer.Option(
        None, "--format", help="jsonl or parquet (parquet needs pyarrow); default: what --out's suffix says, else jsonl"
    ),
    mode: str | None = typer.Option(
        None,
        help="only rollouts of this mode: train, val, test or all (default: train for rl, all for sft; val and test "
        "rollouts are greedy evaluation runs on held-out tasks)",
    ),
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
            out=out,  # type: ignore[arg-type]  # a str: the config refuses one ending in a separator
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
        fail(exc, EXPORT_OPTIONS)


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
            print_table(render(inspection))  # piped: at its own width, not cut to 80 columns

    try:
        asyncio.run(main())
    except AgentboltError as exc:
        fail(exc)


@app.command()
def rollouts(
    store: str = typer.Option(..., help=STORE_HELP),
    status: str | None = typer.Option(None, help="only these statuses, comma-separated (e.g. failed,cancelled)"),
    cause: str | None = typer.Option(
        None, help="only this failure cause (agent_exception, no_reward, bad_reward, no_gateway_call, timeout, ...)"
    ),
    mode: str | None = typer.Option(None, help="only rollouts of this mode: train, val or test"),
    limit: int = typer.Option(50, min=1, help="at most this many rows, newest first"),
    json_: bool = typer.Option(False, "--json", help="print one JSON object per line"),
    token: str | None = typer.Option(None, envvar="AGENTBOLT_TOKEN", help="bearer token of the server"),
) -> None:
    """List rollouts: id, status, attempts, final reward and, for those that gave nothing to train on, the cause."""
    import json

    from agentbolt.cli.rollouts_cmd import list_rollouts, parse_filters, render_rows
    from agentbolt.cli.stores import open_store

    async def main() -> None:
        statuses, parsed_mode, wanted = parse_filters(status, mode, cause)
        st = open_store(store, token=token)
        try:
            # one row past the limit tells whether the listing is cut
            rows = await list_rollouts(st, statuses=statuses, mode=parsed_mode, cause=wanted, limit=limit + 1)
        finally:
            await st.close()
        more, rows = len(rows) > limit, rows[:limit]
        if json_:
            for row in rows:
                typer.echo(json.dumps(row.to_json(), ensure_ascii=False))
        else:
            print_table(render_rows(rows, more=more))

    try:
        asyncio.run(main())
    except AgentboltError as exc:
        fail(exc)


app.command(name="export-model")(jobs.export_model)


if __name__ == "__main__":
    app()
