"""The ``agentbolt`` command line (Typer). Each command parses options into a config object and calls one function;
heavy modules are imported inside the commands so ``agentbolt --help`` stays fast."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import typer
from pydantic import ValidationError
from rich.console import Console

from agentbolt.errors import AgentboltError

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="agentbolt: train any LLM agent from its own executions."
)
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


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
        help="the model behind the gateway: an embedded model (qwen2.5-0.5b, smollm2-135m) for --backend embedded, "
        "else the remote model name (vllm: default its first model)",
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
) -> None:
    """Run the store API, OTLP ingestion (POST /v1/traces) and the LLM gateway."""
    from agentbolt.server.app import create_app
    from agentbolt.server.middleware import MIB
    from agentbolt.server.serving import serve_in_background
    from agentbolt.store import build_store, redact_url

    max_body_bytes = int(max_body_mb * MIB)
    if max_body_bytes < 1:
        _fail(ValueError(f"--max-body-mb must be positive, got {max_body_mb}"))

    async def main() -> None:
        backend = None
        kind = backend_kind or ("embedded" if model is not None else None)
        if kind is not None:
            from agentbolt.inference.backends import open_backend

            backend = await open_backend(kind, model=model, url=backend_url, api_key=api_key)
        st = build_store(store)
        try:
            await st.query_workers()  # open the store now: a bad file or an unreachable database fails here, plainly
            server_app = create_app(st, backend, token=token, max_body_bytes=max_body_bytes)
            async with serve_in_background(server_app, host, port) as url:
                console.print(f"agentbolt serving on {url} (store {redact_url(store)}); Ctrl-C to stop")
                await asyncio.Event().wait()
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


@app.command()
def demo(
    steps: int = typer.Option(4, help="GRPO steps"),
    out: Path = typer.Option(Path("runs/demo"), help="output directory"),
    model: str = typer.Option("qwen2.5-0.5b", help="embedded model: qwen2.5-0.5b or smollm2-135m"),
    tasks_per_step: int = typer.Option(4, help="distinct tasks per step"),
    group_size: int = typer.Option(4, help="rollouts per task (GRPO group)"),
    val_size: int = typer.Option(8, help="tasks per validation set"),
    overwrite: bool = typer.Option(False, help="replace an existing OUT/store.db"),
    seed: int = typer.Option(0, help="task sampling seed"),
) -> None:
    """Train the calculator agent with GRPO on this machine and report validation accuracy before and after."""
    from agentbolt.config import GRPOConfig
    from agentbolt.trainer.demo import DemoConfig, run_demo

    logging.basicConfig(level=logging.WARNING)
    try:
        config = DemoConfig(
            out_dir=out,
            model=model,
            grpo=GRPOConfig(steps=steps, tasks_per_step=tasks_per_step, group_size=group_size, seed=seed),
            val_size=val_size,
            overwrite=overwrite,
        )
        asyncio.run(run_demo(config, console))
    except (AgentboltError, ValidationError) as exc:
        _fail(exc)


if __name__ == "__main__":
    app()
