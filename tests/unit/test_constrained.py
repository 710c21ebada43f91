"""Constrained decoding (``agentbolt.inference.constrained``): the grammars of ``response_format`` and forced
``tool_choice``, and the per-row logits processor inside a real ``model.generate`` (SmolLM2-135M on the CPU).

The grammar tests check acceptance with a real llguidance matcher over SmolLM2's tokenizer: the text is tokenized,
consumed token by token, and must leave the matcher complete (accepting) or be refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from llguidance import LLMatcher, LLTokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessorList, PreTrainedTokenizerBase

from agentbolt.inference import constrained
from agentbolt.inference.base import OutputFormat, RequestRefused, ToolChoice
from agentbolt.inference.constrained import RowGrammars, answer_grammar, tokenizer_info
from agentbolt.server.gateway.toolcalls import parse_tool_calls


def _function(name: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "description": f"the {name} function"}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


CALCULATE = _function(
    "calculate",
    {
        "type": "object",
        "properties": {"expression": {"type": "string", "maxLength": 24}},
        "required": ["expression"],
        "additionalProperties": False,
    },
)
LOOKUP = _function("lookup")  # no parameters: any JSON object
ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "integer", "minimum": -1000, "maximum": 1000}},
    "required": ["answer"],
    "additionalProperties": False,
}
AUTO = ToolChoice()


# ---------------------------------------------------------------------- answer_grammar, without a tokenizer


@pytest.mark.parametrize("mode", ["auto", "none"])
def test_no_format_and_no_forced_call_is_unconstrained(mode: Any) -> None:
    assert answer_grammar(None, ToolChoice(mode), [CALCULATE], True) is None
    assert answer_grammar(None, ToolChoice(mode), None, False) is None


def test_a_schema_llguidance_rejects_is_refused_with_its_reason() -> None:
    with pytest.raises(RequestRefused) as refused:
        answer_grammar(OutputFormat("json_schema", {"type": "objekt"}), AUTO, None, True)
    assert refused.value.param == "response_format"
    assert refused.value.code == "invalid_value"
    assert "objekt" in str(refused.value)
    lookaround = {"type": "string", "pattern": "(?<=a)b"}
    with pytest.raises(RequestRefused, match="look-around"):
        answer_grammar(OutputFormat("json_schema", lookaround), AUTO, None, True)


def test_an_undeclared_function_or_required_without_functions_is_refused() -> None:
    with pytest.raises(RequestRefused, match="'nope'.*declared: calculate") as refused:
        answer_grammar(None, ToolChoice("function", "nope"), [CALCULATE], True)
    assert (refused.value.param, refused.value.code) == ("tool_choice", "invalid_value")
    with pytest.raises(RequestRefused) as refused:
        answer_grammar(None, ToolChoice("required"), [], True)
    assert refused.value.param == "tool_choice"


def test_a_bad_parameters_schema_is_refused_on_its_tool() -> None:
    tools = [CALCULATE, _function("broken", {"type": "objekt"})]
    with pytest.raises(RequestRefused) as refused:
        answer_grammar(None, ToolChoice("required"), tools, True)
    assert refused.value.param == "tools[1].function.parameters"


# ---------------------------------------------------------------------- grammars against a real matcher


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def ll_tokenizer(hf_tokenizer: PreTrainedTokenizerBase) -> LLTokenizer:
    return tokenizer_info(hf_tokenizer)


def _accepts(tokenizer: LLTokenizer, grammar: str | None, text: str) -> bool:
    """Whether ``text`` is a complete answer under ``grammar``."""
    assert grammar is not None
    matcher = LLMatcher(tokenizer, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher.consume_tokens(tokenizer.tokenize_str(text)) and matcher.is_accepting()


def _block(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def test_the_tokenizer_is_built_once_per_tokenizer(hf_tokenizer: PreTrainedTokenizerBase) -> None:
    assert tokenizer_info(hf_tokenizer) is tokenizer_info(hf_tokenizer)


def test_json_object_and_json_schema(ll_tokenizer: LLTokenizer) -> None:
    any_object = answer_grammar(OutputFormat("json_object"), AUTO, None, True)
    assert _accepts(ll_tokenizer, any_object, '{"a": [1, {"b": null}]}')
    assert not _accepts(ll_tokenizer, any_object, "[1]")
    assert not _accepts(ll_tokenizer, any_object, 'sure: {"a": 1}')
    schema = answer_grammar(OutputFormat("json_schema", ANSWER_SCHEMA, "answer"), ToolChoice("none"), None, True)
    assert _accepts(ll_tokenizer, schema, '{"answer": 5}')
    assert _accepts(ll_tokenizer, schema, '{"answer": -7}')
    # json.dumps' layout only: what the chat template writes back next turn, and no budget spent on whitespace
    assert not _accepts(ll_tokenizer, schema, '{\n  "answer": -7\n}')
    assert not _accepts(ll_tokenizer, schema, '{"answer":5}')
    assert not _accepts(ll_tokenizer, schema, '{"answer": "5"}')
    assert not _accepts(ll_tokenizer, schema, '{"answer": 5, "more": 1}')


def test_a_named_function_is_one_block_that_parses_back(ll_tokenizer: LLTokenizer) -> None:
    grammar = answer_grammar(None, ToolChoice("function", "calculate"), [LOOKUP, CALCULATE], True)
    text = _block("calculate", '{"expression": "6*7"}')
    assert _accepts(ll_tokenizer, grammar, text)
    content, calls = parse_tool_calls(text, {"calculate", "lookup"})
    assert content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("calculate", {"expression": "6*7"})
    ]
    assert not _accepts(ll_tokenizer, grammar, _block("lookup", "{}"))
    assert not _accepts(ll_tokenizer, grammar, _block("calculate", '{"expression": 6}'))
    assert not _accepts(ll_tokenizer, grammar, text + "\n" + text)  # one call, even with parallel_tool_calls


def test_required_chooses_among_functions_and_repeats_only_when_parallel(ll_tokenizer: LLTokenizer) -> None:
    two = _block("lookup", '{"q": "x"}') + "\n" + _block("calculate", '{"expression": "1+1"}')
    parallel = answer_grammar(None, ToolChoice("required"), [CALCULATE, LOOKUP], True)
    assert _accepts(ll_tokenizer, parallel, _block("lookup", "{}"))
    assert _accepts(ll_tokenizer, parallel, two)
    assert [c["function"]["name"] for c in parse_tool_calls(two)[1]] == ["lookup", "calculate"]
    assert not _accepts(ll_tokenizer, parallel, "I will call a tool.")
    single = answer_grammar(None, ToolChoice("required"), [CALCULATE, LOOKUP], False)
    assert _accepts(ll_tokenizer, single, _block("calculate", '{"expression": "2"}'))
    assert not _accepts(ll_tokenizer, single, two)


def test_a_forced_tool_choice_wins_over_the_format(ll_tokenizer: LLTokenizer) -> None:
    grammar = answer_grammar(OutputFormat("json_schema", ANSWER_SCHEMA), ToolChoice("required"), [CALCULATE], True)
    assert _accepts(ll_tokenizer, grammar, _block("calculate", '{"expression": "2"}'))
    assert not _accepts(ll_tokenizer, grammar, '{"answer": 2}')


def test_format_with_auto_tools_allows_the_answer_or_calls(ll_tokenizer: LLTokenizer) -> None:
    grammar = answer_grammar(OutputFormat("json_schema", ANSWER_SCHEMA), AUTO, [CALCULATE], False)
    assert _accepts(ll_tokenizer, grammar, '{"answer": 2}')
    assert _accepts(ll_tokenizer, grammar, _block("calculate", '{"expression": "2"}'))
    assert not _accepts(ll_tokenizer, grammar, "two")
    # tool_choice none: the format only
    only_format = answer_grammar(OutputFormat("json_schema", ANSWER_SCHEMA), ToolChoice("none"), [CALCULATE], False)
    assert not _accepts(ll_tokenizer, only_format, _block("calculate", '{"expression": "2"}'))


def test_parameters_with_refs_resolve_inside_the_arguments(ll_tokenizer: LLTokenizer) -> None:
    parameters = {
        "type": "object",
        "$defs": {"unit": {"enum": ["c", "f"]}},
        "properties": {"unit": {"$ref": "#/$defs/unit"}},
        "required": ["unit"],
    }
    grammar = answer_grammar(None, ToolChoice("function", "weather"), [_function("weather", parameters)], True)
    assert _accepts(ll_tokenizer, grammar, _block("weather", '{"unit": "c"}'))
    assert not _accepts(ll_tokenizer, grammar, _block("weather", '{"unit": "k"}'))


def test_tags_that_are_single_tokens_may_be_written_as_those_tokens(smollm2_dir: Path) -> None:
    # Qwen2.5's tokenizer has <tool_call> and </tool_call> as added tokens; give SmolLM2's the same two
    hf_tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    hf_tokenizer.add_tokens(["<tool_call>", "</tool_call>"])
    tokenizer = tokenizer_info(hf_tokenizer)
    text = _block("calculate", '{"expression": "1+1"}')
    ids = list(hf_tokenizer.encode(text, add_special_tokens=False))
    assert ids[0] == hf_tokenizer.convert_tokens_to_ids("<tool_call>")  # what the model was trained to write
    choice = ToolChoice("function", "calculate")

    def accepts_ids(grammar: str | None) -> bool:
        assert grammar is not None
        matcher = LLMatcher(tokenizer, grammar, log_level=0)
        return matcher.consume_tokens(ids) and matcher.is_accepting()

    assert accepts_ids(answer_grammar(None, choice, [CALCULATE], True, tokenizer=tokenizer))
    assert not accepts_ids(answer_grammar(None, choice, [CALCULATE], True))  # text only: the tag token is refused
    assert parse_tool_calls(hf_tokenizer.decode(ids, skip_special_tokens=True))[1][0]["function"]["name"] == "calculate"


# ---------------------------------------------------------------------- RowGrammars


@pytest.mark.parametrize("width", [70, 64, 100])
def test_bitmasks_unpack_to_the_ids_they_name_on_both_paths(width: int) -> None:
    allowed = {0: [0, 5, 31, 32, 63], 1: [1, 30, 62]}  # 31 and 63: the sign bit of a word
    words_RW = np.zeros((2, 2), dtype=np.int32)
    for row, ids in allowed.items():
        for token_id in ids:
            words_RW[row, token_id // 32] |= np.int32(np.uint32(1 << (token_id % 32)).view(np.int32))
    expected = torch.zeros((2, width), dtype=torch.bool)  # ids past the 64 of the masks: never allowed
    for row, ids in allowed.items():
        expected[row, [t for t in ids if t < width]] = True
    assert torch.equal(constrained._unpack_numpy(words_RW, width), expected)
    assert torch.equal(constrained._unpack_torch(words_RW, width, torch.device("cpu")), expected)


def test_rows_past_their_grammar_may_only_stop_and_free_rows_are_untouched(
    hf_tokenizer: PreTrainedTokenizerBase, ll_tokenizer: LLTokenizer
) -> None:
    grammar = answer_grammar(OutputFormat("json_object"), AUTO, None, True)
    stop_ids = [2, 0]
    processor = RowGrammars(ll_tokenizer, [grammar, None, grammar], prompt_len=1, stop_token_ids=stop_ids)
    width = ll_tokenizer.vocab_size + 64  # the model pads its output layer
    scores = torch.zeros((3, width))
    first = processor(torch.tensor([[7], [7], [7]]), scores)
    assert torch.equal(first[1], scores[1])
    assert torch.isinf(first[0, ll_tokenizer.vocab_size :]).all()  # the padding ids
    assert torch.isinf(first[0, stop_ids]).all()  # "" is not an object: no stop yet
    brace = list(hf_tokenizer.encode("{}", add_special_tokens=False))
    assert len(brace) == 1 and not torch.isinf(first[0, brace[0]])
    # row 0 wrote "{}" (complete); row 2 was stopped by the backend and got padding its grammar did not allow
    second = processor(torch.tensor([[7, brace[0]], [7, 5], [7, 5]]), scores)
    assert torch.isfinite(second[0]).sum() == len(stop_ids) and torch.isfinite(second[0, stop_ids]).all()
    assert torch.equal(second[2], scores[2]) and torch.equal(second[1], scores[1])
    assert processor.errors == [None, None, None]


# ---------------------------------------------------------------------- RowGrammars inside model.generate


def _stop_ids(ids: list[int], stop_ids: set[int]) -> list[int]:
    """``ids`` up to and including the first stop id (all of them if none)."""
    for index, token_id in enumerate(ids):
        if token_id in stop_ids:
            return ids[: index + 1]
    return ids


@pytest.mark.slow
def test_a_batch_with_a_schema_row_a_forced_call_row_and_a_free_row(
    smollm2_dir: Path, hf_tokenizer: PreTrainedTokenizerBase, ll_tokenizer: LLTokenizer
) -> None:
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    grammars = [
        answer_grammar(OutputFormat("json_schema", ANSWER_SCHEMA), AUTO, None, True, tokenizer=ll_tokenizer),
        answer_grammar(None, ToolChoice("function", "calculate"), [CALCULATE], True, tokenizer=ll_tokenizer),
        None,
    ]
    questions = ["What is 2+3? Answer in JSON.", "Compute 17*23.", "Say hi."]
    prompts = [
        list(
            hf_tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )
        for q in questions
    ]
    prompt_len = max(len(p) for p in prompts)
    pad_id = int(hf_tokenizer.pad_token_id)  # type: ignore[arg-type]
    input_ids_BL = torch.full((3, prompt_len), pad_id, dtype=torch.long)
    attention_mask_BL = torch.zeros((3, prompt_len), dtype=torch.long)
    for row, ids in enumerate(prompts):  # left padding, as the embedded backend does
        input_ids_BL[row, prompt_len - len(ids) :] = torch.tensor(ids)
        attention_mask_BL[row, prompt_len - len(ids) :] = 1
    stop_ids = [int(hf_tokenizer.convert_tokens_to_ids("<|im_end|>")), int(hf_tokenizer.eos_token_id)]  # type: ignore[arg-type]

    def generate(processors: list[Any]) -> list[list[int]]:
        torch.manual_seed(0)
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids_BL,
                attention_mask=attention_mask_BL,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=60,
                eos_token_id=stop_ids,
                pad_token_id=pad_id,
                logits_processor=LogitsProcessorList(processors),
            )
        return [_stop_ids(row, set(stop_ids)) for row in out[:, prompt_len:].tolist()]

    grammars_processor = RowGrammars(ll_tokenizer, grammars, prompt_len, stop_ids)
    constrained = generate([grammars_processor])
    free = generate([])
    assert grammars_processor.errors == [None, None, None]
    # seed 0 lets both constrained rows finish well inside 60 ids (37 ids here); a platform whose sampling differs
    # may need another seed, not a larger budget
    for row in (0, 1):
        assert constrained[row][-1] in stop_ids, hf_tokenizer.decode(constrained[row])

    answer = json.loads(hf_tokenizer.decode(constrained[0], skip_special_tokens=True))
    assert set(answer) == {"answer"}
    assert isinstance(answer["answer"], int) and -1000 <= answer["answer"] <= 1000

    content, calls = parse_tool_calls(hf_tokenizer.decode(constrained[1], skip_special_tokens=True), {"calculate"})
    assert content is None
    assert len(calls) == 1 and calls[0]["function"]["name"] == "calculate"
    arguments = json.loads(calls[0]["function"]["arguments"])
    assert set(arguments) == {"expression"} and isinstance(arguments["expression"], str)

    # the free row saw the same random numbers and its own logits untouched: same ids as without the processor
    assert constrained[2] == free[2]
    assert constrained[2][-1] in stop_ids
