"""Constrained decoding for the embedded backend: OpenAI ``response_format`` and forced ``tool_choice``, per row of
a batch, with llguidance (https://github.com/guidance-ai/llguidance).

Two steps:

1. :func:`answer_grammar` turns what a request asks of its answer (an :class:`OutputFormat`, a :class:`ToolChoice`
   and the declared tools) into one llguidance grammar string, or ``None`` when the answer is free. A schema that
   llguidance cannot compile is refused there (:class:`RequestRefused`, 400), before anything is queued.
2. :class:`RowGrammars`, a transformers ``LogitsProcessor``, keeps one ``LLMatcher`` per constrained row of a
   ``model.generate`` batch and sets the logits of the ids the grammar does not allow next to ``-inf``. Once the
   grammar is complete, only the stop ids are left, so a constrained row ends with an end-of-turn id.

Tool calls are constrained to the Hermes/Qwen text form that
:func:`agentbolt.server.gateway.toolcalls.parse_tool_calls` reads back (and
:func:`agentbolt.inference.chat_format.normalize_messages` writes)::

    <tool_call>
    {"name": "NAME", "arguments": {...}}
    </tool_call>

The frame (``<tool_call>\\n{"name": "NAME", "arguments": `` ... ``}\\n</tool_call>``) is fixed text; inside
``arguments`` llguidance's default JSON rules apply (any JSON whitespace between tokens, none after the value),
and the arguments are a JSON document of their own, so ``$ref``/``$defs`` in a function's ``parameters`` resolve
against ``parameters``. Some tokenizers have the tags as single added tokens (Qwen2.5: ``<tool_call>`` is id
151657), which llguidance treats as special and never matches against text: given the model's tokenizer,
:func:`answer_grammar` allows each such tag as that one token or as text, so the model writes its tags the way it
was trained to (decoded, both are the same text).

Sampling logprobs stay those of the unconstrained policy: the embedded backend's recorder
(:class:`~agentbolt.inference.generation_hooks.SamplingLogprobs`) comes first in the processor list and reads the
raw logits, before this mask; transformers applies custom processors before its temperature/top_p warpers, so
top_p truncates the masked distribution. The recorded ``log pi(token)`` is therefore the model's own, which is what
the trainer recomputes; the mask only changes which ids get sampled.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import torch
from llguidance import LLExecutor, LLMatcher, LLTokenizer
from llguidance.hf import from_tokenizer
from llguidance.numpy import fill_next_token_bitmask_par
from transformers import LogitsProcessor, PreTrainedTokenizerBase

from agentbolt.inference.base import OutputFormat, RequestRefused, ToolChoice

logger = logging.getLogger(__name__)

ANY_OBJECT: Final[dict[str, Any]] = {"type": "object"}
"""The schema of ``json_object`` answers and of the arguments of a function declared without ``parameters``."""

CALL_SEPARATOR: Final[str] = "\n"
"""Between two tool-call blocks of one answer (parallel tool calls)."""


# ---------------------------------------------------------------------- grammars


def answer_grammar(
    output_format: OutputFormat | None,
    tool_choice: ToolChoice,
    tools: list[dict[str, Any]] | None,
    parallel_tool_calls: bool,
    *,
    tokenizer: LLTokenizer | None = None,
) -> str | None:
    """The llguidance grammar the whole answer must match, or ``None`` when it is unconstrained.

    Rules, first match wins:

    - ``tool_choice`` ``function``: exactly one block
      ``<tool_call>\\n{"name": "NAME", "arguments": ARGS}\\n</tool_call>``, ARGS being JSON valid against that
      function's ``parameters`` (any JSON object when it has none or they are empty).
    - ``tool_choice`` ``required``: one such block for any declared function (a choice between them); with
      ``parallel_tool_calls``, one or more blocks separated by ``"\\n"``.
      A forced tool choice wins over ``output_format``, as in OpenAI's API (the answer is the call; the format
      would apply to a text answer, and there is none).
    - ``output_format`` ``json_object``: any JSON object; ``json_schema``: JSON valid against ``schema`` (any JSON
      object when ``schema`` is ``None``). With ``tool_choice`` ``auto`` and declared functions, tool-call blocks
      (as for ``required``) are allowed instead of the formatted answer, since ``auto`` lets the model call a
      function (OpenAI's API does the same).
    - otherwise (no format, ``auto`` or ``none``): ``None``.

    Args:
        output_format: the requested answer format, or ``None``.
        tool_choice: which tool calls the model may or must make.
        tools: OpenAI Chat tool definitions (``{"type": "function", "function": {"name", "description",
            "parameters"}}``; a bare ``{"name", "parameters"}`` is accepted too). Tools of another ``type`` are
            ignored.
        parallel_tool_calls: False: at most one tool call per answer.
        tokenizer: the model's llguidance tokenizer (:func:`tokenizer_info`). Pass it when the grammar is for a
            known model: tool-call tags that it has as single special tokens are then allowed in that form too
            (without it, Qwen2.5 would have to spell ``<tool_call>`` out of ordinary tokens), and the grammar is
            validated against it. Without it the grammar holds for any tokenizer.

    Returns:
        A grammar string for ``llguidance.LLMatcher`` (a JSON-schema grammar or a Lark grammar), or ``None``.

    Raises:
        RequestRefused: ``param="response_format"``, ``code="invalid_value"`` when llguidance rejects the schema
            (the message carries its reason); ``param="tool_choice"`` when the named function is not declared, or
            ``required`` comes without any function; ``param="tools[i].function.parameters"`` when llguidance
            rejects a function's parameters schema.
    """
    functions = _declared_functions(tools)
    if tool_choice.mode == "function":
        name = tool_choice.name
        if not name or name not in functions:
            declared = ", ".join(sorted(functions)) or "none"
            raise RequestRefused(
                f"tool_choice names function {name!r}, which tools does not declare (declared: {declared})",
                param="tool_choice",
                code="invalid_value",
            )
        return _tool_call_grammar({name: functions[name]}, repeat=False, tokenizer=tokenizer)
    if tool_choice.mode == "required":
        if not functions:
            raise RequestRefused(
                "tool_choice 'required' needs at least one function in tools; declare one or use 'auto'",
                param="tool_choice",
                code="invalid_value",
            )
        return _tool_call_grammar(functions, repeat=parallel_tool_calls, tokenizer=tokenizer)
    if output_format is None:
        return None
    schema = ANY_OBJECT if output_format.kind == "json_object" or output_format.schema is None else output_format.schema
    _check_schema(schema, param="response_format")
    if tool_choice.mode == "auto" and functions:
        calls_rules = _tool_call_rules(functions, repeat=parallel_tool_calls, tokenizer=tokenizer)
        return _lark_grammar(f"start: answer | calls\nanswer: %json {_schema_text(schema)}\n{calls_rules}", tokenizer)
    return LLMatcher.grammar_from_json_schema(_canonical(schema))


def _declared_functions(tools: list[dict[str, Any]] | None) -> dict[str, tuple[int, dict[str, Any]]]:
    """``name -> (index in tools, parameters schema)`` of the declared functions (the first one of a name wins)."""
    functions: dict[str, tuple[int, dict[str, Any]]] = {}
    for index, tool in enumerate(tools or []):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            continue
        nested = tool.get("function")
        function: dict[str, Any] = nested if isinstance(nested, dict) else tool
        name = function.get("name")
        if not isinstance(name, str) or not name or name in functions:
            continue
        parameters = function.get("parameters")
        functions[name] = (index, parameters if isinstance(parameters, dict) and parameters else ANY_OBJECT)
    return functions


def _tool_call_grammar(
    functions: dict[str, tuple[int, dict[str, Any]]], *, repeat: bool, tokenizer: LLTokenizer | None
) -> str:
    return _lark_grammar(f"start: calls\n{_tool_call_rules(functions, repeat=repeat, tokenizer=tokenizer)}", tokenizer)


def _tool_call_rules(
    functions: dict[str, tuple[int, dict[str, Any]]], *, repeat: bool, tokenizer: LLTokenizer | None
) -> str:
    """Lark rules defining ``calls``: one tool-call block (or, with ``repeat``, one or more separated by
    :data:`CALL_SEPARATOR`) for any of ``functions``; each schema is checked first."""
    lines = [
        f"calls: call ({json.dumps(CALL_SEPARATOR)} call)*" if repeat else "calls: call",
        "call: " + " | ".join(f"call_{k}" for k in range(len(functions))),
        f"open_tag: {_tag_expression('<tool_call>', tokenizer)}",
        f"close_tag: {_tag_expression('</tool_call>', tokenizer)}",
    ]
    tail = json.dumps("}\n")
    for k, (name, (index, parameters)) in enumerate(functions.items()):
        _check_schema(parameters, param=f"tools[{index}].function.parameters")
        head = json.dumps('\n{"name": ' + json.dumps(name) + ', "arguments": ')
        lines.append(f"call_{k}: open_tag {head} args_{k} {tail} close_tag")
        lines.append(f"args_{k}: %json {_schema_text(parameters)}")
    return "\n".join(lines)


def _tag_expression(tag: str, tokenizer: LLTokenizer | None) -> str:
    """Lark for ``tag``: its text, or (its one special token | its text) when ``tokenizer`` has it as one token."""
    text = json.dumps(tag)
    if tokenizer is None:
        return text
    ids = tokenizer.tokenize_str(tag, parse_special=True)
    if len(ids) == 1 and tokenizer.is_special_token(ids[0]):
        return f"(<[{ids[0]}]> | {text})"
    return text


CANONICAL_JSON: dict[str, Any] = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}
"""llguidance's JSON options for every constrained answer: the layout of Python's ``json.dumps`` (``", "`` and
``": "``, no other whitespace). A tool call then reads exactly as the chat template writes it back in the next
turn (``tojson``), so the next prompt extends this answer token for token and the turns merge into one training
sample; and a small model cannot spend its budget on newlines and indentation."""


def _canonical(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with :data:`CANONICAL_JSON` as its ``x-guidance`` options (llguidance's per-schema options)."""
    return {**schema, "x-guidance": {**CANONICAL_JSON, **schema.get("x-guidance", {})}}


def _schema_text(schema: dict[str, Any]) -> str:
    """``schema`` (with :data:`CANONICAL_JSON`) as one line of JSON (the form ``%json`` takes inside a Lark
    grammar)."""
    return json.dumps(_canonical(schema), ensure_ascii=True, separators=(",", ":"))


def _check_schema(schema: Any, *, param: str) -> None:
    """Raise :class:`RequestRefused` (``param``, ``invalid_value``) if llguidance cannot compile ``schema``."""
    if not isinstance(schema, dict):
        raise RequestRefused(f"the JSON schema must be an object, got {type(schema).__name__}", param, "invalid_value")
    try:
        grammar = LLMatcher.grammar_from_json_schema(schema)
    except (ValueError, TypeError) as exc:
        raise RequestRefused(f"invalid JSON schema: {exc}", param, "invalid_value") from exc
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        reason = messages[0] if messages else "unknown error"
        raise RequestRefused(f"unsupported or invalid JSON schema: {reason}", param, "invalid_value")


def _lark_grammar(lark: str, tokenizer: LLTokenizer | None) -> str:
    grammar = LLMatcher.grammar_from_lark(lark)
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    if is_error:  # each schema passed on its own: the composition failing is our bug, or a limit hit
        reason = messages[0] if messages else "unknown error"
        raise RequestRefused(f"cannot build the tool-call grammar: {reason}", "tools", "invalid_value")
    return grammar


# ---------------------------------------------------------------------- the logits processor

_TOKENIZERS: weakref.WeakKeyDictionary[PreTrainedTokenizerBase, LLTokenizer] = weakref.WeakKeyDictionary()
_TOKENIZERS_LOCK = threading.Lock()
_EXECUTOR: list[LLExecutor] = []


def tokenizer_info(hf_tokenizer: PreTrainedTokenizerBase) -> LLTokenizer:
    """The llguidance tokenizer of ``hf_tokenizer`` (a fast tokenizer), built once per tokenizer object and cached
    while that object lives. Thread-safe. The first call is slow (0.7 s for SmolLM2's 49k vocabulary, 2.8 s for
    Qwen2.5's 152k, on 2 cores): call it off the event loop, or once at load.

    Raises:
        ValueError: ``hf_tokenizer`` is not a fast (Rust ``tokenizers``) tokenizer.
    """
    with _TOKENIZERS_LOCK:
        cached = _TOKENIZERS.get(hf_tokenizer)
        if cached is None:
            cached = from_tokenizer(hf_tokenizer)  # pyright: ignore[reportArgumentType]
            _TOKENIZERS[hf_tokenizer] = cached
        return cached


def _executor() -> LLExecutor:
    """The process's llguidance thread pool for batch masks (made on first use)."""
    with _TOKENIZERS_LOCK:
        if not _EXECUTOR:
            _EXECUTOR.append(LLExecutor())
        return _EXECUTOR[0]


class RowGrammars(LogitsProcessor):
    """Masks each constrained row's logits to the ids its grammar allows next (a transformers ``LogitsProcessor``).

    Per row with a grammar, an ``LLMatcher``. At each call it first feeds each constrained row the ids sampled
    since the last call (``input_ids[row, prompt_len + seen:]``; all rows share the ``prompt_len`` left-padded
    prompt columns), then computes the rows' allowed-id bitmasks (in parallel, llguidance's thread pool), unpacks
    them (numpy on the CPU, torch bit ops on an accelerator) and sets every other logit to ``-inf``:

    - while the grammar is incomplete: the ids the grammar allows (no stop id);
    - once it is complete (accepting): those ids plus every stop id; once it can take nothing more (stopped):
      only the stop ids, so the row ends with an end-of-turn id. (Accepting but not stopped happens with parallel
      tool calls: another block may follow.)
    - logits columns past the tokenizer's vocabulary (models pad their output layer) are always disallowed.

    A row ends for the processor at its first stop id; later ids (padding) are not fed. A row that the backend
    stopped otherwise (its own ``max_tokens``, a cancel) gets padding that its grammar did not allow: it is
    dropped silently. Rows without a grammar are untouched. A matcher that fails (invalid grammar, an allowed id
    that it then refuses: should not happen) is logged and its row is left unconstrained from then on; the
    reason is kept in :attr:`errors`. The batch never fails because of a grammar.

    Sampling logprobs: put the backend's recorder (:class:`~agentbolt.inference.generation_hooks.SamplingLogprobs`)
    BEFORE this processor in the list. It then records logprobs of the raw logits, i.e. of the unconstrained
    policy, which is what the trainer recomputes; this mask only decides which ids can be sampled.

    Args:
        tokenizer_info: the llguidance tokenizer (:func:`tokenizer_info` of the model's tokenizer).
        grammars: one per batch row (``B``): a grammar from :func:`answer_grammar`, or ``None``.
        prompt_len: columns of the (left-padded) prompt in ``input_ids``.
        stop_token_ids: the ids that end a row (``generate``'s ``eos_token_id``); ids outside the tokenizer's
            vocabulary are ignored.

    Attributes:
        errors: per row, why its constraint was dropped, or ``None``.
    """

    def __init__(
        self,
        tokenizer_info: LLTokenizer,
        grammars: Sequence[str | None],
        prompt_len: int,
        stop_token_ids: Sequence[int],
    ) -> None:
        self._prompt_len = prompt_len
        self._vocab_size = tokenizer_info.vocab_size
        self._stop_ids = [t for t in dict.fromkeys(stop_token_ids) if 0 <= t < self._vocab_size]
        self._stop_set = frozenset(self._stop_ids)
        self._grammar_eos_ids = [t for t in tokenizer_info.eos_tokens if 0 <= t < self._vocab_size]
        self._seen = 0
        self.errors: list[str | None] = [None] * len(grammars)
        self._matchers: list[LLMatcher | None] = []
        for row, grammar in enumerate(grammars):
            matcher = None
            if grammar is not None:
                matcher = LLMatcher(tokenizer_info, grammar, log_level=0)
                if matcher.is_error():
                    self._drop(row, f"grammar rejected: {matcher.get_error()}")
                    matcher = None
            self._matchers.append(matcher)
        words = (self._vocab_size + 31) // 32
        self._bitmask_BW = np.zeros((len(grammars), words), dtype=np.int32)
        """The last allowed-id bitmask per row (bit ``t % 32`` of word ``t // 32`` is id ``t``)."""
        self._masked = [False] * len(grammars)
        """Rows whose logits were masked at the last call (their next id must be in ``_bitmask_BW``)."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        """``scores`` ``(B, V)`` with the disallowed ids of constrained rows at ``-inf`` (a new tensor; ``V`` may
        exceed the tokenizer's vocabulary). ``input_ids`` ``(B, prompt_len + generated)``."""
        self._feed(input_ids)
        live = [row for row, matcher in enumerate(self._matchers) if matcher is not None]
        self._masked = [False] * len(self._matchers)
        if not live:
            return scores
        self._bitmask_BW[live] = 0
        fill_next_token_bitmask_par(
            _executor(),
            [(matcher, row) for row, matcher in enumerate(self._matchers) if matcher is not None],
            self._bitmask_BW,
        )
        for row in live:
            matcher = self._matchers[row]
            assert matcher is not None
            if matcher.is_error():
                self._drop(row, f"mask failed: {matcher.get_error()}")
                continue
            mask_W = self._bitmask_BW[row]
            self._set_bits(mask_W, self._grammar_eos_ids, False)
            if matcher.is_accepting() or matcher.is_stopped():
                self._set_bits(mask_W, self._stop_ids, True)
            if not mask_W.any():  # nothing allowed and not complete (a grammar limit hit): end the row
                logger.warning("row %d: its grammar allows no next token (%s); ending it", row, matcher.stop_reason())
                self._set_bits(mask_W, self._stop_ids, True)
            self._masked[row] = True
        rows = [row for row in live if self._masked[row]]
        if not rows:
            return scores
        return self._apply(scores, rows)

    def _feed(self, input_ids: torch.Tensor) -> None:
        """Feed each constrained row the ids that appeared after the prompt since the last call."""
        start = self._prompt_len + self._seen
        if input_ids.shape[1] <= start:
            return
        new_ids = input_ids[:, start:].tolist()
        self._seen = input_ids.shape[1] - self._prompt_len
        for row, matcher in enumerate(self._matchers):
            if matcher is None:
                continue
            for position, token_id in enumerate(new_ids[row]):
                if token_id in self._stop_set:  # the row ended; what follows is padding
                    self._matchers[row] = None
                    break
                if position == 0 and self._masked[row] and not self._bit(row, token_id):
                    # not an id the mask allowed: padding after the backend stopped the row (max_tokens, cancel)
                    logger.debug("row %d: stopped outside its grammar (id %d); no longer constrained", row, token_id)
                    self._matchers[row] = None
                    break
                if not matcher.consume_token(token_id):
                    self._drop(row, f"id {token_id} refused: {matcher.get_error()}")
                    break

    def _apply(self, scores: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """``scores`` with the ids not set in ``rows``' bitmasks (and columns past the vocabulary) at ``-inf``."""
        allowed_RV = _unpack(self._bitmask_BW[rows], scores.shape[1], scores.device)
        if len(rows) == scores.shape[0]:
            return torch.where(allowed_RV, scores, float("-inf"))
        index_R = torch.tensor(rows, dtype=torch.long, device=scores.device)
        masked = scores.clone()
        masked[index_R] = torch.where(allowed_RV, scores[index_R], float("-inf"))
        return masked

    def _bit(self, row: int, token_id: int) -> bool:
        if not 0 <= token_id < self._vocab_size:
            return False
        return bool((int(self._bitmask_BW[row, token_id >> 5]) >> (token_id & 31)) & 1)

    @staticmethod
    def _set_bits(mask_W: np.ndarray, token_ids: list[int], value: bool) -> None:
        for token_id in token_ids:
            bit = np.int32(1 << (token_id & 31)) if (token_id & 31) < 31 else np.int32(-(2**31))
            if value:
                mask_W[token_id >> 5] |= bit
            else:
                mask_W[token_id >> 5] &= ~bit

    def _drop(self, row: int, reason: str) -> None:
        logger.warning("row %d: constrained decoding dropped, the row continues unconstrained: %s", row, reason)
        self.errors[row] = reason
        self._matchers[row] = None


def _unpack(words_RW: np.ndarray, width: int, device: torch.device) -> torch.Tensor:
    """``(R, width)`` bool on ``device`` from ``(R, W)`` int32 bitmasks (bit ``t % 32`` of word ``t // 32`` is id
    ``t``); ids past ``32 * W`` are False. On the CPU numpy unpacks the bytes (no threads: ~0.2 ms for 8 x 152k
    ids); elsewhere the words travel packed (1/8 of the bytes) and torch bit ops unpack them on the device."""
    if device.type == "cpu":
        return _unpack_numpy(words_RW, width)
    return _unpack_torch(words_RW, width, device)


def _unpack_numpy(words_RW: np.ndarray, width: int) -> torch.Tensor:
    bytes_RB = np.ascontiguousarray(words_RW, dtype="<i4").view(np.uint8)
    bits_RV = np.unpackbits(bytes_RB, axis=1, bitorder="little").view(np.bool_)
    return _fit(torch.from_numpy(bits_RV), width)


def _unpack_torch(words_RW: np.ndarray, width: int, device: torch.device) -> torch.Tensor:
    words = torch.from_numpy(words_RW).to(device)
    shifts = torch.arange(32, dtype=torch.int32, device=device)
    return _fit(((words.unsqueeze(-1) >> shifts) & 1).bool().reshape(words.shape[0], -1), width)


def _fit(allowed_RV: torch.Tensor, width: int) -> torch.Tensor:
    """``allowed_RV`` cut or padded (with False) to ``width`` columns."""
    if allowed_RV.shape[1] >= width:
        return allowed_RV[:, :width]
    padding = torch.zeros(
        (allowed_RV.shape[0], width - allowed_RV.shape[1]), dtype=torch.bool, device=allowed_RV.device
    )
    return torch.cat([allowed_RV, padding], dim=1)
