#!/usr/bin/env python3
"""CPU generation: the embedded backend behind agentbolt's gateway, plain transformers and llama.cpp, against the
memory-bandwidth roofline of this machine, on the calc agent's first-turn requests.

Workload (the same for every arm): the calc agent's first turn, ``messages = [system: SYSTEM_PROMPT, user:
question]`` with ``tools=[CALCULATOR_TOOL]`` (``examples/calc_agent/agent.py``), temperature 1.0, top_p 1, no top-k,
no penalties, ``--max-tokens`` (default 64) generated tokens at most. Questions: ``--tasks train`` (default) takes
the calc agent's training tasks (``tasks.load_train_tasks(512)``, the set ``agentbolt train`` uses), ``gsm_hard``
the 64 GSM-Hard ones; the pool is shuffled with ``random.Random(--seed)`` and every level of every arm takes its
first ``requests`` questions (distinct within a level, the same ones for every arm). Prompts are the model's chat
template with the generation prompt, rendered as the embedded backend renders them (``chat_format``: a template
that knows no tools, SmolLM2's, gets them in the system message), so the gateway arms and the two arms without the
gateway see the same prompt ids (``prompt_tokens`` in each line shows it). Generated tokens end at the first stop
id (eos / end-of-turn, counted, as agentbolt's ``usage.completion_tokens`` counts it) or at ``max_tokens``; their
count comes from what each arm returned, so arms that sample different lengths are compared per token.

Concurrency levels (``--concurrency``, default ``1,4,8,16,32``): at level ``c`` an arm serves
``--requests-per-level`` requests (default ``max(4c, 8)``) with at most ``c`` in flight; ``wall_s`` runs from the
first request sent to the last one answered, ``tokens_per_s`` = generated tokens / ``wall_s``. A level starts with
``c`` requests at once on a cold cache and ends draining its last rows; with 2c requests (the default until
2026-12-04) that was about half of a level at 16 on the 2-core AMD EPYC (1.8 s joining the first 16, 2.3 s draining,
of 8.7 s) and its figure went 70-94 tokens/s from run to run, against 90-102 over levels of 64 requests. Each arm
loads its model once, sends one untimed warm-up request (4 tokens), then runs the levels in order; every level starts
cold (no cached prefix). Arms (``--arms``, default all):

* ``gateway-continuous``: the default serving path. ``EmbeddedBackend.load(model, num_threads=--threads)``
  (continuous batching on: rows join and leave the running batch at every decode step, prompts start from their
  longest cached prefix) behind the real HTTP gateway: ``create_app`` over an in-memory store, served by uvicorn
  in this process (``serve_in_background``, as ``agentbolt train`` serves it), called with the ``openai`` package's
  ``AsyncOpenAI`` on ``127.0.0.1``. Calls go to the rollout route
  ``/v1/rollouts/{rollout}/attempts/{attempt}/v1/chat/completions`` (one rollout and attempt per request, created
  and set running before the clock starts, without a lease; each call is recorded as an ``agentbolt.llm_call``
  span, as an agent's calls are): the plain ``/v1/chat/completions`` refuses ``stream``. Requests stream with
  ``stream_options.include_usage``. ``max_batch_size`` is set to ``c`` at each level; ``batch_wait_s`` is the
  default 0.02 s. At the start of a level the backend is paused (the running batch drains) and its prefix cache
  emptied.
* ``gateway-generate``: the same, with continuous batching off: every batch is one ``model.generate`` over
  left-padded prompts (the path before continuous batching; still the path of seeded, penalized and constrained
  requests). Its ``decode_steps`` count one per ``model.generate`` batch, so ``mean_batch_size`` there is requests
  per batch.
* ``transformers-generate``: no agentbolt serving code. ``AutoModelForCausalLM`` in bf16 from the same prepared
  model directory (``prepare_model``), ``model.generate`` on left-padded batches of ``c`` prompts, one batch after
  the other (sampling, temperature 1, top_k 0, top_p 1, the stop ids as eos). Tokens after a row's first stop id
  are padding and not counted.
* ``llamacpp``: llama-cpp-python (``llama_cpp.Llama(gguf, n_ctx=4096, n_threads=--threads, n_batch=512)``) on a
  GGUF of the same prepared weights in ``--gguf-type`` (bf16 by default, no quantization). ``--gguf PATH``, else
  ``<cache>/gguf/<model>-<source sha256[:12]>-<type>.gguf``, converted there on first use by llama.cpp's
  ``convert_hf_to_gguf.py`` found under ``--llama-cpp-src`` (a llama.cpp checkout, or the extracted
  llama-cpp-python sdist, whose copy is in ``vendor/llama.cpp``; see Setup). Neither: the arm is skipped with its
  reason. The prompt ids are the HF tokenizer's (the same ids as every other arm) and go to ``Llama.generate``
  (top_k 0, top_p 1, min_p 0, typical_p 1, temperature 1, repeat penalty 1). Its Python API serves one sequence
  at a time, so the requests of a level run one after the other whatever ``c`` is; each reuses the keys and values
  of its longest common prefix with the previous sequence (the shared system + tools prefix; ``Llama.reset()``
  at the start of a level makes the first one cold). Timings include llama-cpp-python's per-token Python loop.
* roofline: not an arm. Memory read bandwidth measured with torch on ``--threads`` threads (median of
  ``--bandwidth-repeats`` ``.sum()`` over a ``--bandwidth-gib`` float32 tensor: a float32 sum is bound by memory
  on any CPU, while a bf16 one is bound by the widening where bf16 is emulated, 16 against 28 GB/s on the 2-core
  Xeon of 2026-12-04; a ``copy_`` figure, bytes read + written, is reported too), and the weight bytes one decode
  step reads: every tensor of ``model.safetensors`` (the tied embedding counted once, as the LM head; an untied
  input embedding is left out: a step reads one row of it), with the matrices the embedded backend packs counted
  at its compute dtype (``packed_linear.compute_dtype()``: float32 where the CPU emulates bf16, so twice the file's
  bytes). Roofline tokens/s at level ``c`` = bandwidth / weight bytes * ``c``: one read of the weights per step,
  every row of the batch gets a token; keys/values, activations and compute are ignored, so it is an upper bound
  that large batches (compute-bound) do not approach. ``roofline_bf16_tokens_per_s`` counts the weights in bf16
  (what a CPU with native bf16 reads).
* linear roofline: not an arm either; it counts compute. The model's matrices (random weights of its shapes: every
  packed 2-D weight of ``model.safetensors`` and the output projection) packed once in the backend's compute dtype
  with its own kernel pair (``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``), and the median
  time of ``--linear-repeats`` passes of ``r`` rows through all of them (``linear_step_ms``, at 1, 2, 4, ... up to
  the highest level): ``linear_roofline_tokens_per_s`` at level ``c`` = ``c`` / that time, what a decode step of
  ``c`` full rows would give if it did nothing but its matrix products. ``prefill_ms_per_token``: the same pass at
  64 prompt ids without the output projection, per id. Gateway level lines add ``linear_floor_s``, the time the
  level's own work needs in linears alone (its decode steps at their mean row count, interpolated, plus its
  prefilled ids), ``linear_floor_tokens_per_s`` and ``linear_floor_share`` (floor / wall): the rest of the wall is
  attention, sampling, scheduling, the gateway and rows not full. ``linear_gflops`` / ``linear_read_gb_s`` (per
  row count) say which limit a step's linears meet: the arithmetic rate, and the read bandwidth they used beside
  the measured one (on the 2-core AMD EPYC of 2026-12-04, 16 rows ran at ~290 GFLOPS reading ~18 of 34 GB/s:
  bound by compute, so the bandwidth roofline is out of reach there; ``prefill_gflops``, 64 ids, ~390).
* full-batch roofline (gateway level lines, ``full_batch_roofline_tokens_per_s``): the level's own work, its
  generated tokens (each request's first from its prefill, the rest from decode steps) and the prompt ids it
  prefilled, as if every decode step ran ``c`` full rows and did nothing but
  matrix products at the probe's speed: what that level's mix of prefill and decode allows with no ramp, no drain
  and no overhead. The summary line gives each gateway arm's ratio to it.

Latency, per request (medians; ``ttft_s`` also p90):

* ``ttft_s``: time to the first generated token. Gateway arms: from the client sending the request to the first
  text delta of the backend's stream (taken in the server by a thin wrapper around ``EmbeddedBackend.stream``: it
  only stamps the time of each delta; a first token without text of its own moves it one token later); it includes
  the HTTP hop, queueing and prefill. ``transformers-generate``: from the start of the request's batch to the first
  decode step of that batch (a ``StoppingCriteria`` stamps every step). ``llamacpp``: from the call to the first
  token yielded (prefill of the prompt's uncached part). Queueing behind earlier batches (transformers) or earlier
  requests (llama.cpp) is not in it for those two.
* ``tpot_s``: (time of the last token - time of the first) / (generated tokens - 1), requests of 2+ tokens. Gateway
  arms: server-side, the first text delta to the end of the backend's stream (with ``model.generate``, a row's
  stream ends with its batch, so a row that stopped early counts the wait for the others). transformers: up to
  the decode step of the row's own last token.
* ``visible_ttft_s`` (gateway arms): the first SSE chunk carrying ``content`` or ``tool_calls``, as the client sees
  it. The gateway holds back text that may be a tool call (everything from ``<tool_call>`` on, a message starting
  with ``{``), so for a reply that calls the calculator it comes at the end of generation.
* ``e2e_s``: request sent -> answer complete.

Per (arm, level) JSON line: arm, model, concurrency, requests, errors, generated_tokens, wall_s, tokens_per_s,
ttft_s / ttft_p90_s / tpot_s / e2e_s (+ visible_ttft_s), prompt_tokens (mean), cached_prompt_tokens (mean, what
the backend did not prefill), finish reasons; gateway arms add the level's delta of ``backend.stats``
(decode_steps, decode_rows, mean_batch_size, generation_s; for the continuous batch prefill_s, decode_s,
prefill_tokens and decode_step_ms: with the one-pass step a decode step also prefills the rows joining it, and
prefill_s counts only joins into an empty batch; see ``ThroughputStats``) and of ``prefix_cache.hit_tokens`` /
``lookup_tokens``. First a ``machine`` line (CPU model, cores, threads, load average, versions, commit, date), then
a ``roofline`` line, the level lines as they finish, a ``skipped`` line per arm that could not run, and a
``summary`` line per level: each arm's tokens/s over the roofline and over llamacpp, and gateway-continuous over
gateway-generate. Every line is printed and appended to ``--out`` (default
``benchmarks/results/generation-<date>.jsonl``); a table follows at the end. Everything is seeded
(``torch.manual_seed(--seed)`` at every level; llama.cpp's sampler seed), but sampled lengths still differ
between arms.

Threads: ``--threads 2`` by default (torch intra-op threads for the embedded backend, transformers and the
bandwidth probe; llama.cpp's ``n_threads``/``n_threads_batch``). Clients (``--clients``): ``process`` (default)
sends the gateway arms' requests from one child process (its own event loop and ``AsyncOpenAI`` clients), as
``agentbolt train`` runs agents in runner processes while the gateway shares the job's process with the backend;
``inline`` sends them from the gateway's own event loop (each wake-up of that loop takes the GIL from the embedded
backend's generation thread: measured 20-30% fewer tokens/s at concurrency 16). Level lines say which
(``clients``) and carry the child's CPU seconds (``client_cpu_s``). On a machine whose cores
are busy with other work (load average at or above the core count), two OpenMP threads are pathological: every
parallel region waits for a thread that is not scheduled, and on a 2-core machine at load 3-4 one SmolLM2 forward
of 282 tokens took 6-8 s of CPU with 2 threads against 0.3 s with 1. Each level line carries ``cpu_s`` (this
process's CPU seconds in the level; far above ``threads * wall_s`` of useful work shows the spinning) and
``load_avg_1m``; on such a machine use ``--threads 1``. The main thread's OpenMP workers (the probes', the
transformers arm's) are ended after the probes and after each arm (``release_openmp_threads``): left alive they
outnumber the cores with the backend's, and libgomp then lets every worker sleep after each op (measured before
that: 55-69 tokens/s at concurrency 16 where the backend alone gave 80-90).

Setup, once, for the llamacpp arm: ``make bench-deps`` builds llama-cpp-python from source for this CPU (about ten
minutes on two cores) and unpacks its source, with llama.cpp's converter, into ``.agentbolt/llama-src`` (the default
``--llama-cpp-src``). By hand::

    .venv/bin/pip download llama-cpp-python==0.3.36 --no-deps --no-binary :all: -d /tmp/llsrc
    tar xzf /tmp/llsrc/llama_cpp_python-0.3.36.tar.gz -C /tmp/llsrc
    # convert_hf_to_gguf.py imports sentencepiece before it looks for tokenizer.model; the prepared directories
    # have none (tokenizer.json only), so when sentencepiece is missing this script skips that step for them.

Usage::

    .venv/bin/python benchmarks/generation.py --quick --out /tmp/gen-quick.jsonl         # smoke: smollm2, c=1,4, ~30 s
    .venv/bin/python benchmarks/generation.py            # all arms, qwen2.5-0.5b, c=1,4,8,16,32 (~15 min)
    .venv/bin/python benchmarks/generation.py --arms gateway-continuous,gateway-generate --concurrency 8,16
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from machine_info import cpu_model, git_commit
from roofline import PREFILL_PROBE_ROWS, linear_floor_fields, measure_bandwidth, measure_linear_floor, weight_bytes

from agentbolt.inference.openmp_threads import release_openmp_threads, run_then_release

REPO_ROOT = Path(__file__).resolve().parent.parent
ARMS = ("gateway-continuous", "gateway-generate", "gateway-llamacpp", "transformers-generate", "llamacpp")
GATEWAY_ARMS = ("gateway-continuous", "gateway-generate", "gateway-llamacpp")
WARMUP_TOKENS = 4


# ---------------------------------------------------------------------------------------------------------------
# workload


def load_questions(tasks: str, seed: int, needed: int) -> list[str]:
    """``needed`` distinct questions of the calc agent's ``tasks`` set, in a seeded order."""
    sys.path.insert(0, str(REPO_ROOT))
    from examples.calc_agent import tasks as calc_tasks

    pool = calc_tasks.load_train_tasks(512) if tasks == "train" else calc_tasks.load_gsm_hard()
    questions = list(dict.fromkeys(task["question"] for task in pool))
    random.Random(seed).shuffle(questions)
    if len(questions) < needed:
        raise SystemExit(f"--tasks {tasks} has {len(questions)} distinct questions; a level asks for {needed}")
    return questions[:needed]


def calc_request(question: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The calc agent's first-turn ``(messages, tools)``."""
    sys.path.insert(0, str(REPO_ROOT))
    from examples.calc_agent.agent import CALCULATOR_TOOL, SYSTEM_PROMPT

    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}], [CALCULATOR_TOOL]


def prompt_ids(tokenizer: Any, question: str) -> list[int]:
    """The prompt ids as ``EmbeddedBackend.encode_prompt`` renders them: the chat template with the generation prompt
    (tools passed to the template, or written into the system message when the template knows no tools), tokenized
    without adding special tokens."""
    from agentbolt.inference.chat_format import normalize_messages, tools_in_system_message

    messages, tools = calc_request(question)
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    chat = normalize_messages(messages, inline_tool_calls="tool_calls" not in template)
    template_tools: list[dict[str, Any]] | None = tools
    if "tools" not in template:
        chat = tools_in_system_message(chat, tools)
        template_tools = None
    text = tokenizer.apply_chat_template(chat, tools=template_tools, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(str(text), add_special_tokens=False)["input_ids"])


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """eos ids of the generation config and tokenizer, plus the end-of-turn tokens the vocabulary has (the embedded
    backend's rule, :func:`agentbolt.inference.prompt_encoding.stop_token_ids`)."""
    from agentbolt.inference.prompt_encoding import stop_token_ids as rule

    return rule(tokenizer, getattr(getattr(model, "generation_config", None), "eos_token_id", None))


def model_dir(name: str) -> Path:
    """The prepared bf16 Hugging Face directory of an embedded model name, or a directory given as is."""
    from agentbolt.inference.model_files import MODEL_SPECS, prepare_model

    if name in MODEL_SPECS:
        return prepare_model(name)
    path = Path(name).expanduser()
    if not path.is_dir():
        raise SystemExit(f"--model {name!r} is neither an embedded model ({', '.join(sorted(MODEL_SPECS))}) nor a dir")
    return path


# ---------------------------------------------------------------------------------------------------------------
# figures


@dataclass
class Sample:
    """One request's outcome."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    visible_ttft_s: float | None = None
    cached_prompt_tokens: int | None = None
    finish: str | None = None
    error: str | None = None


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile ``q`` in [0, 1]; ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def level_line(
    arm: str, args: argparse.Namespace, c: int, samples: list[Sample], wall_s: float, cpu_s: float
) -> dict[str, Any]:
    """The JSON line of one (arm, level) from its requests; ``cpu_s``: CPU seconds of this process in the level."""
    ok = [s for s in samples if s.error is None]
    tokens = sum(s.completion_tokens for s in ok)

    def values(name: str) -> list[float]:
        return [v for v in (getattr(s, name) for s in ok) if v is not None]

    cached = values("cached_prompt_tokens")
    line: dict[str, Any] = {
        "kind": "level",
        "arm": arm,
        "model": args.model,
        "concurrency": c,
        "requests": len(samples),
        "errors": len(samples) - len(ok),
        "generated_tokens": tokens,
        "wall_s": round(wall_s, 3),
        "cpu_s": round(cpu_s, 3),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "tokens_per_s": round(tokens / wall_s, 2) if wall_s > 0 else None,
        "ttft_s": _r(statistics.median(values("ttft_s")) if values("ttft_s") else None),
        "ttft_p90_s": _r(pct(values("ttft_s"), 0.9)),
        "tpot_s": _r(statistics.median(values("tpot_s")) if values("tpot_s") else None),
        "e2e_s": _r(statistics.median(values("e2e_s")) if values("e2e_s") else None),
        "prompt_tokens": round(statistics.mean(s.prompt_tokens for s in ok), 1) if ok else None,
        "completion_tokens_mean": round(tokens / len(ok), 1) if ok else None,
        "cached_prompt_tokens": round(statistics.mean(cached), 1) if cached else None,
        "finish": dict(Counter(s.finish or "?" for s in ok)),
        "max_tokens": args.max_tokens,
        "threads": args.threads,
    }
    if arm in GATEWAY_ARMS:
        line["visible_ttft_s"] = _r(statistics.median(values("visible_ttft_s")) if values("visible_ttft_s") else None)
    errors = [s.error for s in samples if s.error is not None]
    if errors:
        line["first_error"] = errors[0][:500]
    return line


# ---------------------------------------------------------------------------------------------------------------
# gateway arms


@dataclass
class ServerTimes:
    """What the backend wrapper saw of one request: first text delta and end of its stream (monotonic seconds)."""

    first_s: float | None = None
    end_s: float | None = None
    extra: dict[str, Any] | None = None


class _TimedStream:
    """A generation stream that stamps its deltas (everything else is the wrapped stream's)."""

    def __init__(self, inner: Any, times: ServerTimes) -> None:
        self._inner = inner
        self._times = times
        self.prompt_tokens = getattr(inner, "prompt_tokens", None)

    async def text_deltas(self) -> AsyncIterator[str]:
        async for delta in self._inner.text_deltas():
            if self._times.first_s is None:
                self._times.first_s = time.monotonic()
            yield delta
        self._times.end_s = time.monotonic()

    async def result(self) -> Any:
        result = await self._inner.result()
        if self._times.extra is None:
            self._times.extra = dict(result.extra or {})
        return result

    def cancel(self) -> None:
        self._inner.cancel()


class TimedBackend:
    """The embedded backend as the gateway sees it, with the stream's delta times kept per question (the last user
    message; questions are distinct within a level)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.times: dict[str, ServerTimes] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def generate(self, request: Any) -> Any:
        return await self._inner.generate(request)

    async def stream(self, request: Any) -> Any:
        from agentbolt.inference.base import start_stream

        times = self.times.setdefault(str(request.messages[-1].get("content")), ServerTimes())
        return _TimedStream(await start_stream(self._inner, request), times)  # whole answer at once without stream

    async def close(self) -> None:
        await self._inner.close()


def load_backend(args: argparse.Namespace, directory: Path, continuous: bool) -> tuple[Any, str | None]:
    """``EmbeddedBackend.load`` with ``continuous_batching``; when ``load`` does not take that argument, the same
    load done here and the constructor called with it. Returns the backend and a note when the fallback was used."""
    import inspect

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentbolt.inference.embedded import EmbeddedBackend

    if args.quantization != "none":  # only a tree with int8 serving has the argument
        backend = EmbeddedBackend.load(
            directory,
            num_threads=args.threads,
            max_batch_size=32,
            continuous_batching=continuous,
            quantization=args.quantization,
        )
        return backend, None
    if "continuous_batching" in inspect.signature(EmbeddedBackend.load).parameters:
        backend = EmbeddedBackend.load(
            directory, num_threads=args.threads, max_batch_size=32, continuous_batching=continuous
        )
        return backend, None
    if continuous:
        return EmbeddedBackend.load(directory, num_threads=args.threads, max_batch_size=32), None
    # EmbeddedBackend.load(...) has no continuous_batching: load as it does, pass it to the constructor
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.bfloat16)
    model.eval()
    backend = EmbeddedBackend(
        model,
        tokenizer,
        model_name=args.model,
        num_threads=args.threads,
        max_batch_size=32,
        continuous_batching=False,
    )
    return backend, "EmbeddedBackend.load has no continuous_batching argument: built with EmbeddedBackend(...)"


def _stats(backend: Any) -> dict[str, float]:
    stats = backend.stats
    cache = getattr(backend, "prefix_cache", None)
    return {
        "requests": stats.requests,
        "generated_tokens": stats.generated_tokens,
        "decode_steps": stats.decode_steps,
        "decode_rows": stats.decode_rows,
        "generation_s": stats.generation_s,
        "prefill_s": getattr(stats, "prefill_s", 0.0),
        "decode_s": getattr(stats, "decode_s", 0.0),
        "prefill_tokens": getattr(getattr(backend, "_batch", None), "prefill_tokens", 0),
        "batches": stats.batches,
        "failed_requests": stats.failed_requests,
        "prefix_hit_tokens": getattr(cache, "hit_tokens", 0),
        "prefix_lookup_tokens": getattr(cache, "lookup_tokens", 0),
    }


async def _gateway_call(
    client: Any, args: argparse.Namespace, question: str, timed: TimedBackend, max_tokens: int
) -> Sample:
    times = timed.times.setdefault(question, ServerTimes())
    sample, sent_s = await _client_call(client, args.model, question, max_tokens)
    return _with_server_times(sample, sent_s, times)


async def _client_call(client: Any, model: str, question: str, max_tokens: int) -> tuple[Sample, float]:
    """One streamed request as the client sees it; ``(sample, sent_s)`` (``time.monotonic()``, which is
    system-wide on Linux, so a child process's times compare with the server's)."""
    messages, tools = calc_request(question)
    sample = Sample()
    sent_s = time.monotonic()
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=messages,
            tools=tools,
            temperature=1.0,
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                delta = choice.delta
                if sample.visible_ttft_s is None and (delta.content or delta.tool_calls):
                    sample.visible_ttft_s = time.monotonic() - sent_s
                if choice.finish_reason:
                    sample.finish = choice.finish_reason
        sample.e2e_s = time.monotonic() - sent_s
        if usage is None:
            raise RuntimeError("the stream ended without a usage chunk")
        sample.prompt_tokens = usage.prompt_tokens
        sample.completion_tokens = usage.completion_tokens
    except Exception as exc:  # recorded in the level's line; the level goes on
        sample.error = f"{type(exc).__name__}: {exc}"
    return sample, sent_s


def _with_server_times(sample: Sample, sent_s: float, times: ServerTimes) -> Sample:
    if sample.error is not None:
        return sample
    if times.first_s is not None:
        sample.ttft_s = times.first_s - sent_s
        if times.end_s is not None and sample.completion_tokens > 1:
            sample.tpot_s = (times.end_s - times.first_s) / (sample.completion_tokens - 1)
    if times.extra is not None and "cached_prompt_tokens" in times.extra:
        sample.cached_prompt_tokens = int(times.extra["cached_prompt_tokens"])
    return sample


async def _client_worker() -> None:
    """``--client-worker``: read one level per stdin line (JSON: ``urls``, ``questions``, ``c``, ``model``,
    ``max_tokens``, ``timeout_s``), send its requests with at most ``c`` in flight, write one JSON line back: the
    samples with their ``sent_s``, and this process's CPU seconds for the level."""
    from openai import AsyncOpenAI

    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        job = json.loads(line)
        clients = [
            AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=job["timeout_s"]) for url in job["urls"]
        ]
        gate = asyncio.Semaphore(job["c"])

        async def one(
            index: int, gate: asyncio.Semaphore = gate, clients: list[Any] = clients, job: dict[str, Any] = job
        ) -> tuple[Sample, float]:
            async with gate:
                return await _client_call(clients[index], job["model"], job["questions"][index], job["max_tokens"])

        cpu = time.process_time()
        results = await asyncio.gather(*(one(i) for i in range(len(clients))))
        for client in clients:
            await client.close()
        answer = {
            "samples": [{**dataclasses.asdict(sample), "sent_s": sent_s} for sample, sent_s in results],
            "cpu_s": time.process_time() - cpu,
        }
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


class ClientProcess:
    """The child process that sends a gateway arm's requests (``--clients process``)."""

    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None

    async def run_level(
        self, args: argparse.Namespace, urls: list[str], questions: list[str], c: int, timed: TimedBackend
    ) -> tuple[list[Sample], float, float]:
        """Send one level's requests from the child; ``(samples, child CPU seconds, when the first request was sent)``
        (``time.monotonic()``, the same clock in both processes on Linux; the child's start-up, about 2 s on the first
        level, comes before it)."""
        if self._proc is None:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                str(Path(__file__).resolve()),
                "--client-worker",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=2**26,
            )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        for question in questions:
            timed.times.setdefault(question, ServerTimes())
        job = {"urls": urls, "questions": questions, "c": c, "model": args.model}
        job.update(max_tokens=args.max_tokens, timeout_s=args.timeout_s)
        self._proc.stdin.write((json.dumps(job) + "\n").encode())
        await self._proc.stdin.drain()
        line = await self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the client process exited (code {await self._proc.wait()})")
        answer = json.loads(line)
        samples, first_sent_s = [], float("inf")
        for question, raw in zip(questions, answer["samples"], strict=True):
            sent_s = raw.pop("sent_s")
            first_sent_s = min(first_sent_s, sent_s)
            samples.append(_with_server_times(Sample(**raw), sent_s, timed.times[question]))
        return samples, float(answer["cpu_s"]), first_sent_s

    async def close(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            await self._proc.wait()


async def run_gateway_arm(
    arm: str,
    args: argparse.Namespace,
    directory: Path,
    questions: list[str],
    emit: Callable[[dict[str, Any]], None],
    roof: dict[str, Any],
) -> None:
    import torch
    from openai import AsyncOpenAI

    from agentbolt.server.app import create_app
    from agentbolt.server.serving import serve_in_background
    from agentbolt.store.memory import InMemoryLightningStore
    from agentbolt.types import AttemptStatus, RolloutConfig

    server = None
    if arm == "gateway-llamacpp":
        backend, server, note = await start_llamacpp_engine(args, directory)
    else:
        backend, note = await asyncio.to_thread(
            run_then_release, load_backend, args, directory, arm == "gateway-continuous"
        )
    timed = TimedBackend(backend)
    store = InMemoryLightningStore()
    no_lease = RolloutConfig(unresponsive_seconds=None)
    client_process = ClientProcess()
    try:
        async with serve_in_background(create_app(store, timed)) as url:
            client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=args.timeout_s)

            async def attempt_urls(n: int) -> list[str]:
                for _ in range(n):
                    await store.enqueue_rollout({"benchmark": "generation"}, config=no_lease)
                claimed = await store.claim_many("generation-bench", n)
                urls = []
                for item in claimed:
                    rid, aid = item.rollout.rollout_id, item.attempt.attempt_id
                    await store.update_attempt(rid, aid, AttemptStatus.RUNNING)
                    urls.append(f"{url}/v1/rollouts/{rid}/attempts/{aid}/v1")
                return urls

            async def attempt_clients(n: int) -> list[Any]:
                return [client.with_options(base_url=u) for u in await attempt_urls(n)]

            (warm_client,) = await attempt_clients(1)
            warm = await _gateway_call(warm_client, args, "What is 2 + 2?", timed, WARMUP_TOKENS)
            if warm.error is not None:
                emit({"kind": "skipped", "arm": arm, "model": args.model, "reason": f"warm-up failed: {warm.error}"})
                return
            for c in args.levels:
                n = args.requests_for(c)
                urls = await attempt_urls(n)
                async with backend.paused():
                    if server is not None:  # a fresh llama-server: no prompt cached from the level before
                        await server.stop()
                        await server.start()
                    else:
                        backend.prefix_cache.clear()
                        backend.max_batch_size = c
                timed.times.clear()
                torch.manual_seed(args.seed)
                before = _stats(backend)
                gate = asyncio.Semaphore(c)

                clients = [client.with_options(base_url=u) for u in urls]

                async def one(index: int, gate: asyncio.Semaphore = gate, clients: list[Any] = clients) -> Sample:
                    async with gate:
                        return await _gateway_call(clients[index], args, questions[index], timed, args.max_tokens)

                started, cpu = time.monotonic(), time.process_time()
                client_cpu_s = None
                if args.clients == "process":
                    samples, client_cpu_s, first_sent_s = await client_process.run_level(
                        args, urls, questions[:n], c, timed
                    )
                    started = min(max(started, first_sent_s), time.monotonic())
                else:
                    samples = list(await asyncio.gather(*(one(i) for i in range(n))))
                wall_s = time.monotonic() - started
                after = _stats(backend)
                delta = {key: after[key] - before[key] for key in after}
                line = level_line(arm, args, c, samples, wall_s, time.process_time() - cpu)
                line.update(
                    decode_steps=delta["decode_steps"],
                    decode_rows=delta["decode_rows"],
                    mean_batch_size=round(delta["decode_rows"] / delta["decode_steps"], 2)
                    if delta["decode_steps"]
                    else None,
                    backend_generation_s=round(delta["generation_s"], 3),
                    backend_prefill_s=round(delta["prefill_s"], 3),
                    backend_decode_s=round(delta["decode_s"], 3),
                    backend_prefill_tokens=delta["prefill_tokens"],
                    # the continuous batch's stats count its decode steps and prefilled ids; model.generate's do not
                    **linear_floor_fields(roof, line, delta if arm == "gateway-continuous" else None),
                    decode_step_ms=round(1000 * delta["decode_s"] / delta["decode_steps"], 1)
                    if delta["decode_steps"]
                    else None,
                    backend_batches=delta["batches"],
                    backend_failed_requests=delta["failed_requests"],
                    prefix_hit_tokens=delta["prefix_hit_tokens"],
                    prefix_lookup_tokens=delta["prefix_lookup_tokens"],
                    prefix_cache_cleared=True,
                    clients=args.clients,
                    client_cpu_s=None if client_cpu_s is None else round(client_cpu_s, 3),
                    max_batch_size=c,
                    batch_wait_s=getattr(backend, "batch_wait_s", None),
                    continuous_batching=arm in ("gateway-continuous", "gateway-llamacpp"),
                    quantization=args.quantization if arm != "gateway-llamacpp" else None,
                    **({"llama_server_parallel": server.parallel} if server is not None else {}),
                    **({"note": note} if note else {}),
                )
                emit(line)
            await client.close()
    finally:
        await client_process.close()
        await backend.close()
        with contextlib.suppress(Exception):
            await store.close()


async def start_llamacpp_engine(args: argparse.Namespace, directory: Path) -> tuple[Any, Any, str]:
    """agentbolt's llamacpp engine (``inference.engine: llamacpp``): llama-server built by ``make llamacpp`` with
    one slot per request of the highest level, behind the gateway's token-in/token-out backend."""
    from agentbolt.inference.llamacpp import start_llama_server
    from agentbolt.inference.token_engines import TokenEngineBackend

    parallel = max(args.levels)
    server = await start_llama_server(
        directory, Path("/tmp/agentbolt-bench-llama"), parallel=parallel, context_per_slot=1024, threads=args.threads,
        outtype=args.gguf_type,
    )  # fmt: skip
    backend = await TokenEngineBackend.connect(
        "llamacpp", server.url, model_dir=directory, model_name=args.model, max_context_tokens=1024,
        on_close=server.stop,
    )  # fmt: skip
    return backend, server, f"llama-server --parallel {parallel}, {args.gguf_type} GGUF {server.gguf.name}"


# ---------------------------------------------------------------------------------------------------------------
# transformers-generate


def run_transformers_arm(
    args: argparse.Namespace, directory: Path, questions: list[str], emit: Callable[[dict[str, Any]], None]
) -> None:
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        GenerationConfig,
        StoppingCriteria,
        StoppingCriteriaList,
    )

    class StepClock(StoppingCriteria):
        """Stamps each decode step (called once per new token of the batch); never stops anything."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            self.times.append(time.monotonic())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.bfloat16)
    model.eval()
    stops = stop_token_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if isinstance(tokenizer.pad_token_id, int) else stops[0]
    prompts = [prompt_ids(tokenizer, q) for q in questions]

    def run_batch(batch: list[list[int]], max_tokens: int) -> list[Sample]:
        width = max(len(p) for p in batch)
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            mask[row, width - len(ids) :] = 1
        config = GenerationConfig(
            max_new_tokens=max_tokens,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            repetition_penalty=1.0,
            eos_token_id=stops,
            pad_token_id=pad,
        )
        clock = StepClock()
        started = time.monotonic()
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                generation_config=config,
                stopping_criteria=StoppingCriteriaList([clock]),
            )
        generated = out[:, width:].tolist()
        samples = []
        for row, ids in enumerate(generated):
            n, finish = len(ids), "length"
            for index, token in enumerate(ids):
                if token in stops:
                    n, finish = index + 1, "stop"
                    break
            n = min(n, max_tokens)
            sample = Sample(prompt_tokens=len(batch[row]), completion_tokens=n, finish=finish, cached_prompt_tokens=0)
            if clock.times:
                sample.ttft_s = clock.times[0] - started
                last = clock.times[min(n, len(clock.times)) - 1]
                sample.e2e_s = last - started
                if n > 1:
                    sample.tpot_s = (last - clock.times[0]) / (n - 1)
            samples.append(sample)
        return samples

    torch.manual_seed(args.seed)
    run_batch(prompts[:1], WARMUP_TOKENS)
    for c in args.levels:
        n = args.requests_for(c)
        torch.manual_seed(args.seed)
        samples: list[Sample] = []
        started, cpu = time.monotonic(), time.process_time()
        for first in range(0, n, c):
            samples += run_batch(prompts[first : min(n, first + c)], args.max_tokens)
        wall_s = time.monotonic() - started
        line = level_line("transformers-generate", args, c, samples, wall_s, time.process_time() - cpu)
        line["batches"] = -(-n // c)
        emit(line)


# ---------------------------------------------------------------------------------------------------------------
# llamacpp


def _converter(src: str | None) -> Path | None:
    if not src:
        return None
    root = Path(src).expanduser()
    for candidate in (root, root / "vendor" / "llama.cpp"):
        if (candidate / "convert_hf_to_gguf.py").is_file():
            return candidate / "convert_hf_to_gguf.py"
    return None


def find_gguf(args: argparse.Namespace, directory: Path) -> tuple[Path | None, str]:
    """The GGUF to run and how it was found, or ``(None, why not)``; converts into the cache when it can."""
    if args.gguf:
        path = Path(args.gguf).expanduser()
        return (path, "--gguf") if path.is_file() else (None, f"--gguf {path} does not exist")
    from agentbolt.inference.model_files import MARKER_FILE, default_cache_dir

    source = "local"
    with contextlib.suppress(OSError, ValueError):
        source = str(json.loads((directory / MARKER_FILE).read_text()).get("source_sha256", "local"))[:12]
    name = Path(args.model).name
    cache = Path(args.gguf_dir).expanduser() if args.gguf_dir else default_cache_dir().parent / "gguf"
    path = cache / f"{name}-{source}-{args.gguf_type}.gguf"
    if path.is_file():
        return path, "cache"
    script = _converter(args.llama_cpp_src)
    if script is None:
        why = (
            "no --llama-cpp-src given"
            if not args.llama_cpp_src
            else f"no convert_hf_to_gguf.py under {args.llama_cpp_src}"
        )
        return None, f"no GGUF at {path} and {why} to convert one (run make bench-deps; see the module docstring)"
    cache.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    from agentbolt.inference.llamacpp import CONVERT_BOOTSTRAP

    cmd = [sys.executable, "-c", CONVERT_BOOTSTRAP, str(script), str(directory)]
    cmd += ["--outtype", args.gguf_type, "--outfile", str(partial)]
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        return None, "convert_hf_to_gguf.py ran for more than 30 minutes"
    if proc.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        return None, f"convert_hf_to_gguf.py failed (exit {proc.returncode}): {proc.stderr.strip()[-600:]}"
    partial.rename(path)
    return path, f"converted in {time.monotonic() - started:.0f} s"


def run_llamacpp_arm(
    args: argparse.Namespace, directory: Path, questions: list[str], emit: Callable[[dict[str, Any]], None]
) -> None:
    try:
        import llama_cpp
    except ImportError as exc:
        emit({"kind": "skipped", "arm": "llamacpp", "model": args.model, "reason": f"import llama_cpp: {exc}"})
        return
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    gguf, how = find_gguf(args, directory)
    if gguf is None:
        emit({"kind": "skipped", "arm": "llamacpp", "model": args.model, "reason": how})
        return
    tokenizer = AutoTokenizer.from_pretrained(str(directory))

    generation_config = None
    with contextlib.suppress(OSError, ValueError):
        generation_config = GenerationConfig.from_pretrained(str(directory))
    stops = set(stop_token_ids(SimpleNamespace(generation_config=generation_config), tokenizer))
    vocab = AutoConfig.from_pretrained(str(directory)).vocab_size
    llm = llama_cpp.Llama(
        model_path=str(gguf),
        n_ctx=4096,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_batch=512,
        seed=args.seed,
        verbose=False,
    )
    if llm.n_vocab() != vocab:
        why = f"the GGUF has {llm.n_vocab()} tokens, the model {vocab}: not the same weights"
        emit({"kind": "skipped", "arm": "llamacpp", "model": args.model, "reason": why})
        return
    stops.add(llm.token_eos())
    prompts = [prompt_ids(tokenizer, q) for q in questions]
    previous: list[int] = []

    def one(ids: list[int], max_tokens: int) -> Sample:
        nonlocal previous
        common = 0
        for a, b in zip(previous, ids, strict=False):
            if a != b:
                break
            common += 1
        sample = Sample(prompt_tokens=len(ids), cached_prompt_tokens=min(common, len(ids) - 1), finish="length")
        generated: list[int] = []
        times: list[float] = []
        started = time.monotonic()
        tokens = llm.generate(ids, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, temp=1.0, repeat_penalty=1.0)
        for token in tokens:
            times.append(time.monotonic())
            generated.append(int(token))
            if token in stops:
                sample.finish = "stop"
                break
            if len(generated) >= max_tokens:
                break
        tokens.close()
        previous = ids + generated
        sample.completion_tokens = len(generated)
        if times:
            sample.ttft_s = times[0] - started
            sample.e2e_s = times[-1] - started
            if len(times) > 1:
                sample.tpot_s = (times[-1] - times[0]) / (len(times) - 1)
        return sample

    one(prompts[0], WARMUP_TOKENS)
    for c in args.levels:
        n = args.requests_for(c)
        llm.reset()
        previous = []
        with contextlib.suppress(AttributeError):
            llm.set_seed(args.seed)
        started, cpu = time.monotonic(), time.process_time()
        samples = [one(prompts[i], args.max_tokens) for i in range(n)]
        wall_s = time.monotonic() - started
        line = level_line("llamacpp", args, c, samples, wall_s, time.process_time() - cpu)
        line.update(gguf=str(gguf), gguf_found=how, gguf_type=args.gguf_type, llama_cpp=llama_cpp.__version__)
        line["note"] = "one sequence at a time: requests run sequentially at every concurrency"
        emit(line)
    with contextlib.suppress(Exception):
        llm.close()


# ---------------------------------------------------------------------------------------------------------------
# machine, summary, table


def machine_line(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    import torch
    import transformers

    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    with contextlib.suppress(ImportError):
        import llama_cpp

        versions["llama_cpp"] = llama_cpp.__version__
    with contextlib.suppress(ImportError):
        import openai

        versions["openai"] = openai.__version__
    return {
        "kind": "machine",
        "model": args.model,
        "model_dir": str(directory),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "threads": args.threads,
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        **versions,
        "python": platform.python_version(),
        "commit": git_commit(REPO_ROOT),
        "arms": args.arm_list,
        "concurrency": args.levels,
        "max_tokens": args.max_tokens,
        "tasks": args.tasks,
        "seed": args.seed,
        "quick": args.quick,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def summary_lines(args: argparse.Namespace, lines: list[dict[str, Any]], roof: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    levels = {(x["arm"], x["concurrency"]): x for x in lines if x.get("kind") == "level"}
    for c in args.levels:
        roofline = roof["roofline_tokens_per_s"][str(c)]
        llama = levels.get(("llamacpp", c), {}).get("tokens_per_s")
        line: dict[str, Any] = {
            "kind": "summary",
            "model": args.model,
            "concurrency": c,
            "roofline_tokens_per_s": roofline,
        }
        for arm in ARMS:
            tps = levels.get((arm, c), {}).get("tokens_per_s")
            if tps is None:
                continue
            line[f"{arm}_tokens_per_s"] = tps
            line[f"{arm}_over_roofline"] = round(tps / roofline, 3) if roofline else None
            linear = roof["linear_roofline_tokens_per_s"].get(str(c))
            line[f"{arm}_over_linear_roofline"] = round(tps / linear, 3) if linear else None
            full = levels.get((arm, c), {}).get("full_batch_roofline_tokens_per_s")
            if full:
                line[f"{arm}_over_full_batch_roofline"] = round(tps / full, 3)
            if arm != "llamacpp":
                line[f"{arm}_over_llamacpp"] = round(tps / llama, 3) if llama else None
        cont = levels.get(("gateway-continuous", c), {}).get("tokens_per_s")
        gen = levels.get(("gateway-generate", c), {}).get("tokens_per_s")
        line["continuous_over_generate"] = round(cont / gen, 3) if cont and gen else None
        out.append(line)
    return out


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(args: argparse.Namespace, lines: list[dict[str, Any]], roof: dict[str, Any]) -> None:
    roof_tps = roof["roofline_tokens_per_s"]
    print()
    print(
        f"{args.model}, {args.threads} threads, max_tokens {args.max_tokens}; read bandwidth {roof['read_gb_s']} GB/s "
        f"(copy {roof['copy_gb_s']}), {roof['served_weight_bytes_per_step'] / 1e6:.0f} MB of weights per step "
        f"({roof['served_dtype']} matrices; {roof['weight_bytes_per_step'] / 1e6:.0f} MB in bf16)"
    )
    header = (
        f"{'arm':<22}{'c':>4}{'req':>5}{'err':>4}{'tokens':>8}{'wall_s':>9}{'tok/s':>9}{'ttft50':>8}{'ttft90':>8}"
        f"{'vis50':>8}{'tpot50':>8}{'batch':>7}{'%roof':>7}{'x llama':>8}"
    )
    print(header)
    print("-" * len(header))
    llama = {x["concurrency"]: x["tokens_per_s"] for x in lines if x.get("kind") == "level" and x["arm"] == "llamacpp"}
    for line in lines:
        if line.get("kind") != "level":
            continue
        c, tps = line["concurrency"], line["tokens_per_s"]
        roofline = roof_tps[str(c)]
        print(
            f"{line['arm']:<22}{c:>4}{line['requests']:>5}{line['errors']:>4}{line['generated_tokens']:>8}"
            f"{line['wall_s']:>9.2f}{_fmt(tps, '.1f'):>9}{_fmt(line['ttft_s'], '.3f'):>8}"
            f"{_fmt(line['ttft_p90_s'], '.3f'):>8}{_fmt(line.get('visible_ttft_s'), '.3f'):>8}"
            f"{_fmt(line['tpot_s'], '.4f'):>8}{_fmt(line.get('mean_batch_size'), '.1f'):>7}"
            f"{_fmt(tps / roofline * 100 if tps and roofline else None, '.1f'):>7}"
            f"{_fmt(tps / llama[c] if tps and llama.get(c) else None, '.2f'):>8}"
        )
    print(
        "(tok/s: generated tokens / wall; ttft50/90: seconds to the first token, median / p90; vis50: to the first "
        "visible text or tool call; tpot50: seconds per output token; batch: mean rows per decode step; %roof: of the "
        "bandwidth roofline; x llama: over the llamacpp arm)"
    )
    for c in args.levels:
        print(f"{'roofline':<22}{c:>4}{'':>43}{roof_tps[str(c)]:>9.1f}")
    for c in args.levels:
        linear = roof["linear_roofline_tokens_per_s"][str(c)]
        print(f"{'linear roofline':<22}{c:>4}{'':>43}{linear:>9.1f}")
    print(
        f"prefill linears: {roof['prefill_ms_per_token']} ms a prompt id ({roof['prefill_rows']} ids a pass, "
        f"{roof['prefill_gflops']} GFLOPS)"
    )
    print(
        "decode linears: "
        + ", ".join(
            f"{n} rows {roof['linear_gflops'][str(n)]} GFLOPS / {roof['linear_read_gb_s'][str(n)]} GB/s"
            for n in args.levels
        )
        + f" (read bandwidth {roof['read_gb_s']} GB/s)"
    )
    for line in lines:
        if line.get("kind") == "level" and line.get("linear_floor_tokens_per_s"):
            full = line.get("full_batch_roofline_tokens_per_s")
            print(
                f"{line['arm']} c={line['concurrency']}: linears alone at the probe's speed {line['linear_floor_s']} s "
                f"({line['linear_floor_share']:.0%} of the wall), {line['linear_floor_tokens_per_s']} tok/s"
                + (
                    f"; full-batch roofline {full} tok/s ({line['tokens_per_s'] / full:.0%} reached)"
                    if full and line["tokens_per_s"]
                    else ""
                )
            )
    for line in lines:
        if line.get("kind") == "skipped":
            print(f"skipped {line['arm']}: {line['reason']}")
    speedups = [(x["concurrency"], x["continuous_over_generate"]) for x in lines if x.get("kind") == "summary"]
    speedups = [(c, s) for c, s in speedups if s is not None]
    if speedups:
        print("gateway-continuous / gateway-generate: " + ", ".join(f"c={c}: {s:.2f}x" for c, s in speedups))


# ---------------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-0.5b", help="embedded model name (or a HF model directory)")
    parser.add_argument(
        "--arms", help=f"comma-separated, of {', '.join(ARMS)} (default all; gateway-continuous with --quick)"
    )
    parser.add_argument("--concurrency", default="1,4,8,16,32", help="comma-separated levels")
    parser.add_argument("--requests-per-level", type=int, help="requests per level (default max(4c, 8))")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tasks", choices=("train", "gsm_hard"), default="train", help="where the questions come from")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quantization",
        choices=("none", "int8"),
        default="none",
        help="the embedded arms' EmbeddedBackend quantization (int8: agentbolt.inference.int8_linear)",
    )
    parser.add_argument("--gguf", help="GGUF of the same weights for the llamacpp arm")
    parser.add_argument(
        "--gguf-type", choices=("bf16", "f16", "q8_0"), default="bf16",
        help="GGUF weight type of the llama.cpp arms (q8_0: 8-bit weights, not the trainer's numbers)",
    )  # fmt: skip
    parser.add_argument("--gguf-dir", help="where converted GGUFs are kept (default <agentbolt cache>/gguf)")
    parser.add_argument(
        "--llama-cpp-src",
        default=str(REPO_ROOT / ".agentbolt" / "llama-src" / "llama_cpp_python-0.3.36"),
        help="llama.cpp source (or the extracted llama-cpp-python sdist) to convert (default: make bench-deps puts it)",
    )
    parser.add_argument("--bandwidth-gib", type=float, default=1.0, help="size of the bandwidth probe's tensor")
    parser.add_argument("--bandwidth-repeats", type=int, default=7)
    parser.add_argument("--linear-repeats", type=int, default=5, help="passes per row count of the linear-floor probe")
    parser.add_argument("--timeout-s", type=float, default=3600, help="per gateway request")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run (about 30 s): smollm2-135m, c=1,4, 8 requests, 16 tokens, gateway-continuous unless --arms",
    )
    parser.add_argument("--out", help="JSONL file to append to (default benchmarks/results/generation-<date>.jsonl)")
    parser.add_argument(
        "--clients",
        choices=("process", "inline"),
        default="process",
        help="where the gateway arms' clients run: a child process (as train's runner processes) or the gateway's loop",
    )
    parser.add_argument("--client-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client_worker:
        asyncio.run(_client_worker())
        return
    if args.quick:
        args.model, args.concurrency, args.requests_per_level, args.max_tokens = "smollm2-135m", "1,4", 8, 16
        args.bandwidth_gib = min(args.bandwidth_gib, 0.25)
        args.arms = args.arms or "gateway-continuous"
    args.arms = args.arms or ",".join(ARMS)
    args.levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    args.arm_list = [x.strip() for x in args.arms.split(",") if x.strip()]
    unknown = [x for x in args.arm_list if x not in ARMS]
    if unknown or not args.levels or min(args.levels) < 1:
        parser.error(f"unknown arms {unknown}" if unknown else "--concurrency needs levels >= 1")
    args.requests_for = lambda c: args.requests_per_level or max(4 * c, 8)

    out = Path(args.out or REPO_ROOT / "benchmarks/results" / f"generation-{time.strftime('%Y-%m-%d')}.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    lines: list[dict[str, Any]] = []

    def emit(line: dict[str, Any]) -> None:
        print(json.dumps(line), flush=True)
        lines.append(line)
        with out.open("a") as f:
            f.write(json.dumps(line) + "\n")

    directory = model_dir(args.model)
    questions = load_questions(args.tasks, args.seed, max(args.requests_for(c) for c in args.levels))
    emit(machine_line(args, directory))
    roof = {"kind": "roofline", "model": args.model, "threads": args.threads}
    roof.update(measure_bandwidth(args.threads, args.bandwidth_gib, args.bandwidth_repeats))
    roof.update(weight_bytes(directory))
    served, stored = roof["served_weight_bytes_per_step"], roof["weight_bytes_per_step"]
    roof["roofline_tokens_per_s"] = {str(c): round(roof["read_gb_s"] * 1e9 / served * c, 1) for c in args.levels}
    roof["roofline_bf16_tokens_per_s"] = {str(c): round(roof["read_gb_s"] * 1e9 / stored * c, 1) for c in args.levels}
    top = max(args.levels)
    rows = sorted({n for n in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64) if n <= top} | set(args.levels))
    roof.update(measure_linear_floor(directory, args.threads, rows, PREFILL_PROBE_ROWS, args.linear_repeats))
    emit(roof)
    release_openmp_threads()  # the probes' OpenMP workers would throttle the backend's (see the docstring)

    for arm in args.arm_list:
        started = time.monotonic()
        try:
            if arm in GATEWAY_ARMS:
                asyncio.run(run_gateway_arm(arm, args, directory, questions, emit, roof))
            elif arm == "transformers-generate":
                run_transformers_arm(args, directory, questions, emit)
            else:
                run_llamacpp_arm(args, directory, questions, emit)
        except Exception as exc:  # one arm failing does not end the run
            emit({"kind": "skipped", "arm": arm, "model": args.model, "reason": f"failed: {type(exc).__name__}: {exc}"})
        gc.collect()
        release_openmp_threads()
        print(f"# {arm}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)

    for line in summary_lines(args, lines, roof):
        emit(line)
    print_table(args, lines, roof)


if __name__ == "__main__":
    main()
