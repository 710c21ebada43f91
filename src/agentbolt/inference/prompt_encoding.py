"""Chat messages -> exact prompt token ids, and generated ids -> text and OpenAI logprob entries. Torch-free.

Every backend that records token ids renders the chat template itself, here, so the recorded ids are the ones the
model ran whatever template an engine would have applied: the embedded backend (transformers in this process) and
the token-in/token-out engines (:mod:`agentbolt.inference.token_engines`: llama.cpp, vLLM, SGLang), which receive
prompt token ids and answer with generated ids.

:class:`PromptEncoder` wraps a Hugging Face tokenizer (``transformers.AutoTokenizer``: no torch needed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentbolt.errors import ConfigError
from agentbolt.inference.base import TOP_LOGPROBS_MAX, GenerationRequest, RequestRefused
from agentbolt.inference.chat_format import normalize_messages, tools_in_system_message
from agentbolt.inference.transcripts import TranscriptCache

STOP_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>")
"""End-of-turn tokens used as stop ids when the tokenizer has them as single tokens."""


def _byte_alphabet() -> dict[str, int]:
    """The GPT-2 byte-level alphabet, read backwards: the character a byte-level BPE token uses for each byte."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}


class PromptEncoder:
    """The tokenizer side of a backend: chat template, stop ids, decoding and logprob entries.

    Args:
        tokenizer: a Hugging Face tokenizer that owns the chat template.
        eos_token_ids: the model's ``generation_config.eos_token_id`` (an id, a list, or ``None``); the stop ids are
            these, the tokenizer's eos and the end-of-turn tokens of :data:`STOP_TOKENS` the vocabulary has.
        vocab_size: ids the model can produce, for checking raw token prompts (default: the tokenizer's length).

    Attributes:
        stop_token_ids: ids that end a response (kept in the response ids).
        transcripts: recent generations' prompt + response, reused by :meth:`encode_prompt`.

    Raises:
        ConfigError: the tokenizer has no eos token and no known end-of-turn token.
    """

    def __init__(self, tokenizer: Any, *, eos_token_ids: int | list[int] | None = None, vocab_size: int = 0) -> None:
        self.tokenizer = tokenizer
        self.stop_token_ids = stop_token_ids(tokenizer, eos_token_ids)
        template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
        self._template_renders_tool_calls = "tool_calls" in template
        self._template_renders_tools = "tools" in template
        self._vocab = vocab_size
        self._byte_of_char = _byte_alphabet()
        self.transcripts = TranscriptCache()

    @classmethod
    def from_model_dir(cls, path: Path | str) -> PromptEncoder:
        """The encoder of a Hugging Face model directory (its tokenizer, ``generation_config.json`` and
        ``config.json``).

        Raises:
            BackendError: the tokenizer files are missing or unreadable.
        """
        from transformers import AutoTokenizer

        from agentbolt.errors import BackendError

        where = Path(path)
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(where))
        except Exception as exc:
            raise BackendError(f"loading the tokenizer from {where} failed: {exc!r}") from exc
        eos: Any = None
        vocab = 0
        for name in ("generation_config.json", "config.json"):
            try:
                data = json.loads((where / name).read_text())
            except (OSError, ValueError):
                continue
            if eos is None:
                eos = data.get("eos_token_id")
            if name == "config.json":
                vocab = int(data.get("vocab_size") or 0)
        return cls(tokenizer, eos_token_ids=eos, vocab_size=vocab)

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer can produce (added tokens included), or the model's vocabulary when given."""
        if self._vocab:
            return self._vocab
        try:
            return len(self.tokenizer)
        except TypeError:
            return int(getattr(self.tokenizer, "vocab_size", 0))

    def encode_prompt(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """The exact prompt ids for ``messages``: the chat template with the generation prompt, applied once.

        OpenAI messages are adapted first (``chat_format.normalize_messages``); when the template cannot render
        tools or tool calls, they are written in the Hermes/Qwen text form instead. ``chat_template_kwargs`` are
        extra template variables (e.g. ``enable_thinking``). The rendered text is tokenized as
        ``apply_chat_template`` does, except that a part of it that is a recent generation's prompt + response
        keeps that generation's ids (:class:`~agentbolt.inference.transcripts.TranscriptCache`), so a conversation
        that sends the model's answers back extends its earlier calls token for token.

        Raises:
            ConfigError: the template rejects the messages.
        """
        chat = normalize_messages(messages, inline_tool_calls=not self._template_renders_tool_calls)
        template_tools: list[Any] | None = list(tools) if tools else None
        if template_tools and not self._template_renders_tools:
            chat = tools_in_system_message(chat, template_tools)
            template_tools = None
        try:
            rendered = self.tokenizer.apply_chat_template(
                chat,
                tools=template_tools,
                add_generation_prompt=True,
                tokenize=False,
                **(chat_template_kwargs or {}),
            )
        except Exception as exc:  # jinja errors: bad roles, order, missing fields
            raise ConfigError(f"the chat template cannot render these messages: {exc}") from exc
        return self.transcripts.encode(str(rendered), self.tokenize)

    def tokenize(self, text: str) -> list[int]:
        """``text`` (a rendered template: special tokens written out) as ids, as ``apply_chat_template`` does."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode_text(self, prompt: str | list[int]) -> list[int]:
        """The ids of a raw prompt (legacy Completions): text tokenized as the tokenizer does by default (its BOS
        added if it has one), or token ids checked against the vocabulary. No chat template.

        Raises:
            RequestRefused: an empty prompt, or an id outside the vocabulary.
        """
        if isinstance(prompt, str):
            ids = list(self.tokenizer(prompt)["input_ids"])
        else:
            ids = [int(i) for i in prompt]
            vocab = self.vocab_size
            bad = [i for i in ids if not 0 <= i < vocab]
            if bad:
                raise RequestRefused(
                    f"prompt token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", "prompt", "invalid_value"
                )
        if not ids:
            raise RequestRefused("the prompt is empty; send at least one token", "prompt", "invalid_value")
        return ids

    def request_ids(self, request: GenerationRequest) -> list[int]:
        """The prompt ids of ``request``: its raw ``prompt`` (:meth:`encode_text`) or its chat (:meth:`encode_prompt`).

        Raises:
            ConfigError: the template rejects the messages, or a bad raw prompt.
        """
        if request.prompt is not None:
            return self.encode_text(request.prompt)
        return self.encode_prompt(request.messages, request.tools, request.chat_template_kwargs)

    def decode(self, ids: list[int]) -> str:
        """``ids`` as text, special tokens skipped."""
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def remember(self, prompt_ids: list[int], response_ids: list[int]) -> None:
        """Keep a finished generation's transcript, so that a next turn that sends its answer back reuses its ids
        (see :meth:`encode_prompt`)."""
        full = [*prompt_ids, *response_ids]
        text = self.tokenizer.decode(full, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        self.transcripts.add(str(text), full)

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes of one token: byte-level BPE tokens (Qwen, SmolLM2) map back through the GPT-2 byte
        alphabet; others (and special tokens) are their decoded text in UTF-8."""
        token = self.tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(token, str) and token and all(ch in self._byte_of_char for ch in token):
            return bytes(self._byte_of_char[ch] for ch in token)
        return str(self.tokenizer.decode([token_id])).encode()

    def token_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        """One OpenAI ``ChatCompletionTokenLogprob``-shaped entry ``{"token", "logprob", "bytes"}``."""
        raw = self.token_bytes(token_id)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}

    def token_logprobs(
        self, ids: list[int], logprobs: list[float], top: list[list[tuple[int, float]]] | None = None
    ) -> list[dict[str, Any]]:
        """OpenAI ``ChatCompletionTokenLogprob`` entries for ``ids`` with their ``logprobs`` and, per step, the
        top alternatives ``[(id, logprob), ...]`` (a final stop id is left out: it is not text)."""
        if ids and ids[-1] in self.stop_token_ids:
            ids = ids[:-1]
        entries: list[dict[str, Any]] = []
        for step, token_id in enumerate(ids):
            entry = self.token_entry(token_id, logprobs[step])
            alternatives = top[step] if top is not None and step < len(top) else []
            entry["top_logprobs"] = [self.token_entry(alt, value) for alt, value in alternatives]
            entries.append(entry)
        return entries


def stop_token_ids(tokenizer: Any, eos_token_ids: int | list[int] | None = None) -> list[int]:
    """The given eos ids (a model's ``generation_config.eos_token_id``) and the tokenizer's, plus the end-of-turn
    tokens of :data:`STOP_TOKENS` the vocabulary has.

    Raises:
        ConfigError: none at all (the tokenizer has no eos token and no known end-of-turn token).
    """
    ids: list[int] = []
    configured = eos_token_ids if isinstance(eos_token_ids, list) else [eos_token_ids]
    for candidate in [*configured, tokenizer.eos_token_id]:
        if isinstance(candidate, int) and candidate not in ids:
            ids.append(candidate)
    vocab = tokenizer.get_vocab()
    for token in STOP_TOKENS:
        token_id = vocab.get(token)
        if isinstance(token_id, int) and token_id not in ids:
            ids.append(token_id)
    if not ids:
        raise ConfigError("the tokenizer has no eos token and no known end-of-turn token; cannot tell when to stop")
    return ids


def check_sampling(request: GenerationRequest) -> None:
    """Check the request's sampling values against OpenAI's ranges.

    Raises:
        ConfigError: a value out of range (the message names it and its range).
    """
    if not 0 <= request.top_logprobs <= TOP_LOGPROBS_MAX:
        raise ConfigError(f"top_logprobs must be in 0..{TOP_LOGPROBS_MAX}, got {request.top_logprobs}")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(request, name)
        if not -2 <= value <= 2:
            raise ConfigError(f"{name} must be in [-2, 2], got {value}")
    for token_id, bias in (request.logit_bias or {}).items():
        if not -100 <= bias <= 100:
            raise ConfigError(f"logit_bias values must be in [-100, 100], got {bias} for token {token_id}")
    if request.max_tokens < 1:
        raise ConfigError(f"max_tokens must be >= 1, got {request.max_tokens}")
    if request.temperature < 0:
        raise ConfigError(f"temperature must be >= 0, got {request.temperature}")
    if not 0 < request.top_p <= 1:
        raise ConfigError(f"top_p must be in (0, 1], got {request.top_p}")


def entries_within(entries: list[dict[str, Any]], length: int) -> list[dict[str, Any]]:
    """The first token entries whose texts add up to at most ``length`` characters, and the one that crosses it
    (a token that holds both the end of the text and the start of the stop string)."""
    kept: list[dict[str, Any]] = []
    total = 0
    for entry in entries:
        if total >= length:
            break
        kept.append(entry)
        total += len(entry["token"])
    return kept
