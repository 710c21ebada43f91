"""llama.cpp on this machine: its ``llama-server`` started and restarted by agentbolt, the model and each new LoRA
adapter converted to GGUF with llama.cpp's own converters.

The toolchain (``llama-server`` built from source, and the llama.cpp source tree whose ``convert_hf_to_gguf.py`` and
``convert_lora_to_gguf.py`` write the GGUF files) lives in one folder, :func:`default_llama_cpp_dir` (``make
llamacpp`` builds it; ``scripts/build_llama_cpp.sh`` by hand). :class:`LlamaCppTools` finds it.

:class:`LlamaServer` runs ``llama-server`` on a free loopback port with ``--parallel`` slots sharing one context
(continuous batching; each slot keeps its prompt's KV, so requests with a common prefix reuse it through
``cache_prompt``). llama.cpp loads adapter files only at start (``POST /lora-adapters`` sets the scales of adapters
already loaded), so :meth:`LlamaServer.load_adapter` converts the adapter and restarts the server with ``--lora``;
the caller holds requests meanwhile (:meth:`TokenEngineBackend.paused
<agentbolt.inference.token_engines.TokenEngineBackend.paused>`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from agentbolt.errors import BackendError, ConfigError

logger = logging.getLogger(__name__)

LLAMA_CPP_ENV = "AGENTBOLT_LLAMA_CPP"
"""Environment variable naming the llama.cpp toolchain folder (overrides the default)."""

CONVERT_BOOTSTRAP = """
import os, runpy, sys
script = sys.argv[1]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
try:
    import sentencepiece  # noqa: F401
except ImportError:  # imported before the converter checks that tokenizer.model exists: skip it when it does not
    from conversion import base
    original = base.TextModel._create_vocab_sentencepiece
    def create_vocab_sentencepiece(self):
        if not (self.dir_model / "tokenizer.model").is_file():
            raise FileNotFoundError(self.dir_model / "tokenizer.model")
        return original(self)
    base.TextModel._create_vocab_sentencepiece = create_vocab_sentencepiece
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""
"""Runs ``SCRIPT ARGS...`` (a llama.cpp converter) with its own folder on ``sys.path`` (it imports ``conversion`` and
``gguf`` from there). The prepared model folders have ``tokenizer.json`` only, and the converter imports
sentencepiece before it checks for ``tokenizer.model``: without sentencepiece that step is skipped for them."""


def default_llama_cpp_dir() -> Path:
    """``$AGENTBOLT_LLAMA_CPP``, else ``$AGENTBOLT_CACHE/llama.cpp``, else ``~/.cache/agentbolt/llama.cpp``."""
    named = os.environ.get(LLAMA_CPP_ENV)
    if named:
        return Path(named).expanduser()
    from agentbolt.inference.model_files import default_cache_dir

    return default_cache_dir().parent / "llama.cpp"


@dataclass(frozen=True)
class LlamaCppTools:
    """A built llama.cpp: ``server`` (the ``llama-server`` binary) and ``source`` (the tree with the converters)."""

    server: Path
    source: Path

    @classmethod
    def find(cls, folder: Path | str | None = None) -> LlamaCppTools:
        """The toolchain in ``folder`` (default :func:`default_llama_cpp_dir`): ``llama-server`` at
        ``bin/llama-server`` or ``build/bin/llama-server``, converters at ``src/`` or the folder itself.

        Raises:
            ConfigError: not built there (the message gives the command that builds it).
        """
        root = Path(folder).expanduser() if folder else default_llama_cpp_dir()
        servers = [root / "bin" / "llama-server", root / "build" / "bin" / "llama-server"]
        sources = [root / "src", root]
        server = next((path for path in servers if path.is_file() and os.access(path, os.X_OK)), None)
        source = next((path for path in sources if (path / "convert_lora_to_gguf.py").is_file()), None)
        if server is None or source is None:
            missing = "llama-server" if server is None else "llama.cpp's converters (convert_lora_to_gguf.py)"
            raise ConfigError(
                f"no {missing} in {root}: build llama.cpp there with "
                f"`scripts/build_llama_cpp.sh {shlex.quote(str(root))}` (`make llamacpp` runs it for {LLAMA_CPP_ENV} "
                "or the default folder; about 15 minutes on two cores, once), or point "
                f"{LLAMA_CPP_ENV} / inference.llama_cpp_dir at a folder with bin/llama-server and the "
                "llama.cpp source in src/"
            )
        return cls(server=server, source=source)

    def convert(self, script: str, args: list[str], *, timeout_s: float = 1800.0) -> None:
        """Run the converter ``script`` (``convert_hf_to_gguf.py``, ``convert_lora_to_gguf.py``) with ``args``.

        Raises:
            BackendError: it failed or ran past ``timeout_s`` (the message ends with its error output).
        """
        cmd = [sys.executable, "-c", CONVERT_BOOTSTRAP, str(self.source / script), *args]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise BackendError(f"{script} ran for more than {timeout_s:.0f} s") from exc
        if proc.returncode != 0:
            raise BackendError(f"{script} failed (exit {proc.returncode}): {proc.stderr.strip()[-800:]}")


def model_gguf(tools: LlamaCppTools, model_dir: Path, cache_dir: Path, *, outtype: str = "bf16") -> Path:
    """The GGUF of the Hugging Face model in ``model_dir`` (converted once with ``convert_hf_to_gguf.py``, kept in
    ``cache_dir`` under a name that changes with the weights file's size and time).

    Raises:
        BackendError: the conversion failed.
    """
    weights = sorted(model_dir.glob("*.safetensors"))
    stamp = hashlib.sha256(
        json.dumps([[w.name, w.stat().st_size, int(w.stat().st_mtime)] for w in weights]).encode()
    ).hexdigest()[:12]
    path = cache_dir / f"{model_dir.name}-{stamp}-{outtype}.gguf"
    if path.is_file():
        return path
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    started = time.monotonic()
    tools.convert("convert_hf_to_gguf.py", [str(model_dir), "--outtype", outtype, "--outfile", str(partial)])
    partial.rename(path)
    logger.info("converted %s to %s in %.0f s", model_dir, path, time.monotonic() - started)
    return path


def adapter_gguf(tools: LlamaCppTools, adapter_dir: Path, model_dir: Path, out: Path) -> Path:
    """Convert the peft LoRA adapter in ``adapter_dir`` (for the model in ``model_dir``) to the GGUF adapter ``out``
    with ``convert_lora_to_gguf.py`` (f32: the LoRA factors are small).

    Raises:
        BackendError: the conversion failed (e.g. a target module llama.cpp has no tensor for).
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    args = ["--base", str(model_dir), "--outtype", "f32", "--outfile", str(partial), str(adapter_dir)]
    tools.convert("convert_lora_to_gguf.py", args, timeout_s=600.0)
    partial.replace(out)
    return out


def _die_with_parent() -> Callable[[], None] | None:
    """On Linux, a ``preexec_fn`` that asks the kernel to SIGTERM the child when the thread that started it dies
    (``PR_SET_PDEATHSIG``), so a job killed with SIGKILL leaves no ``llama-server`` behind. libc is loaded here,
    before the fork, so the child only makes the one call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def arm() -> None:
        prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG

    return arm


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LlamaServer:
    """A ``llama-server`` process serving ``gguf`` (and a LoRA adapter) on 127.0.0.1.

    Args:
        tools: the llama.cpp toolchain.
        gguf: the model's GGUF file.
        model_dir: the Hugging Face model it was converted from (the adapter converter reads its config).
        work_dir: where converted adapters and the server's log (``llama-server.log``) go.
        parallel: slots (``--parallel``): requests generated together.
        context_per_slot: tokens of context each slot has (``--ctx-size`` is ``parallel`` times this).
        threads: CPU threads (``--threads``, ``--threads-batch``); default ``os.cpu_count()``.
        ready_timeout_s: longest wait for the server's health check after a start.

    Attributes:
        url: ``http://127.0.0.1:PORT`` once started.
        adapter: the GGUF adapter it serves, or ``None``.
    """

    def __init__(
        self,
        tools: LlamaCppTools,
        gguf: Path,
        model_dir: Path,
        work_dir: Path,
        *,
        parallel: int = 16,
        context_per_slot: int = 4096,
        threads: int | None = None,
        ready_timeout_s: float = 300.0,
    ) -> None:
        if parallel < 1 or context_per_slot < 64:
            raise ConfigError(
                f"llama-server needs parallel >= 1 and context_per_slot >= 64, got {parallel}, {context_per_slot}"
            )
        self.tools = tools
        self.gguf = gguf
        self.model_dir = model_dir
        self.work_dir = work_dir
        self.parallel = parallel
        self.context_per_slot = context_per_slot
        self.threads = threads or os.cpu_count() or 1
        self.ready_timeout_s = ready_timeout_s
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.adapter: Path | None = None
        self.restarts = 0
        self._process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """The ``llama-server`` command line."""
        cmd = [
            str(self.tools.server),
            "--model", str(self.gguf),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--parallel", str(self.parallel),
            "--ctx-size", str(self.parallel * self.context_per_slot),
            "--threads", str(self.threads),
            "--threads-batch", str(self.threads),
            "--cont-batching",
            "--no-webui",
        ]  # fmt: skip
        if self.adapter is not None:
            cmd += ["--lora", str(self.adapter)]
        return cmd

    async def start(self) -> None:
        """Start the server and wait until ``GET /health`` answers 200.

        Raises:
            BackendError: it exited, or was not ready within ``ready_timeout_s`` (the message ends with its log).
        """
        self.work_dir.mkdir(parents=True, exist_ok=True)
        log = (self.work_dir / "llama-server.log").open("ab")
        try:  # the command first, so the log says which model, adapter and settings each start had
            log.write(f"\n[agentbolt] {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(self.command())}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent()
            )
        finally:
            log.close()
        deadline = time.monotonic() + self.ready_timeout_s
        async with httpx.AsyncClient(timeout=5.0) as client:
            while True:
                if self._process.poll() is not None:
                    raise BackendError(f"llama-server exited (code {self._process.returncode}): {self._log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{self.url}/health")).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    await self.stop()
                    raise BackendError(
                        f"llama-server was not ready after {self.ready_timeout_s:.0f} s: {self._log_tail()}"
                    )
                await asyncio.sleep(0.2)

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.work_dir / "llama-server.log").read_text(errors="replace")[-800:]
        return "(no log)"

    async def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            await asyncio.to_thread(process.wait, 10.0)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait)

    async def load_adapter(self, adapter_dir: Path, version: str) -> None:
        """Serve the peft LoRA adapter in ``adapter_dir`` from now on: convert it to GGUF
        (``work_dir/adapters/VERSION.gguf``) and restart the server with it. Requests must be held meanwhile.

        Raises:
            BackendError: the conversion failed, or the server did not come back.
        """
        out = self.work_dir / "adapters" / f"{version}.gguf"
        await asyncio.to_thread(adapter_gguf, self.tools, adapter_dir, self.model_dir, out)
        previous = self.adapter
        self.adapter = out
        await self.stop()
        await self.start()
        self.restarts += 1
        if previous is not None and previous != out:
            previous.unlink(missing_ok=True)

    async def adapter_loader(self, adapter_dir: Path, version: str) -> str | None:
        """:data:`~agentbolt.inference.token_engines.AdapterLoader` for the token engine backend: the adapter is
        loaded at start, so requests need not name it."""
        await self.load_adapter(adapter_dir, version)
        return None


async def start_llama_server(
    model_dir: Path,
    work_dir: Path,
    *,
    llama_cpp_dir: Path | str | None = None,
    gguf_cache_dir: Path | None = None,
    parallel: int = 16,
    context_per_slot: int = 4096,
    threads: int | None = None,
    outtype: str = "bf16",
) -> LlamaServer:
    """Find the toolchain, convert the model once (cached) to GGUF weights of type ``outtype`` (``convert_hf_to_gguf.py
    --outtype``: ``bf16``, ``f16``, ``f32`` or ``q8_0``), start ``llama-server``; return it running.

    Raises:
        ConfigError: llama.cpp is not built (the message says how to build it).
        BackendError: the conversion failed, or the server did not start.
    """
    tools = LlamaCppTools.find(llama_cpp_dir)
    if gguf_cache_dir is None:
        from agentbolt.inference.model_files import default_cache_dir

        gguf_cache_dir = default_cache_dir().parent / "gguf"
    gguf = await asyncio.to_thread(model_gguf, tools, model_dir, gguf_cache_dir, outtype=outtype)
    server = LlamaServer(
        tools, gguf, model_dir, work_dir, parallel=parallel, context_per_slot=context_per_slot, threads=threads
    )
    await server.start()
    return server


def which_llama_server() -> str | None:
    """``llama-server`` on ``PATH``, if any (a system install; agentbolt prefers its own build)."""
    return shutil.which("llama-server")
