"""The calc agent example: calculator, answer parsing, correctness, reward arithmetic, the loop, task loading."""

from __future__ import annotations

import ast
import itertools
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from examples.calc_agent import agent as agent_module
from examples.calc_agent import calculator as calculator_module
from examples.calc_agent.agent import (
    TOOL_RESULT_FORMAT,
    CalcAgentConfig,
    EpisodeFacts,
    calc_agent,
    compute_reward,
    extract_answer_line,
    parse_answer,
    run_episode,
    run_tool_call,
    sampling_kwargs,
)
from examples.calc_agent.calculator import calculate, evaluate, format_number
from examples.calc_agent.tasks import (
    VAL_POOL_SIZE,
    VAL_SET_NAMES,
    Task,
    is_correct,
    load_calc_x,
    load_gsm_hard,
    load_train_tasks,
    load_val_sets,
    parse_number,
)
from openai.types.chat import ChatCompletion

from agentbolt import LLM, semconv
from agentbolt.tracing.context import AttemptContext, attempt_scope

REPO_ROOT = Path(__file__).resolve().parents[2]


def _task(answer: str, question: str = "Calculate -5 * -6.") -> Task:
    return Task(task_id="t-1", question=question, answer=answer, source="test")


# --- calculator ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("2+3*4", "14"),
        ("(2 + 3) * 4", "20"),
        ("965 / 5", "193"),
        ("7/2", "3.5"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("2 ** 10", "1024"),
        ("2^10", "1024"),
        ("2 ** -1", "0.5"),
        ("-3 - -3", "0"),
        ("+5", "5"),
        ("-7 + (-6) * (-9)", "47"),
        ("1/3", "0.3333333333"),
        ("1/7", "0.1428571429"),
        ("0.1 + 0.2", "0.3"),
        ("2/3*3", "2"),
        ("1e3", "1000"),
        ("-0.5 * 1", "-0.5"),
        ("4 + 3 =", "7"),
        ("6 × 7 ÷ 2 − 1", "20"),
        ("123456789 * 1000", "123456789000"),
        ("0.000012345678912", "0.00001234567891"),
        ("-0.0", "0"),
        ("2 ** 0.5", "1.414213562"),
    ],
)
def test_calculator_values(expression: str, expected: str) -> None:
    assert calculate(expression) == expected


def test_integer_arithmetic_stays_exact() -> None:
    assert evaluate("99999999999 * 99999999") == 99999999999 * 99999999
    assert isinstance(evaluate("10 / 2"), int)
    assert isinstance(evaluate("10 / 4"), float)


@pytest.mark.parametrize(
    ("expression", "error_part"),
    [
        ("", "empty expression"),
        ("   =", "empty expression"),
        ("x + 1", 'names are not allowed (found "x")'),
        ("__import__('os').system('echo pwned')", "not allowed"),
        ("(1).real", "attributes"),
        ("abs(-3)", "functions"),
        ("[1, 2][0]", "indexing are not allowed"),
        ("[1, 2]", "unsupported syntax (List)"),
        ("'a' * 3", "only numbers are allowed"),
        ("True + 1", "only numbers are allowed"),
        ("1,000", "commas are not allowed"),
        ("lambda: 1", "unsupported syntax"),
        ("1 if 1 else 2", "unsupported syntax"),
        ("3 < 4", "unsupported syntax"),
        ("6 & 3", "operator BitAnd is not supported"),
        ("2 ** 1000", "exponent too large"),
        ("9 ** 9 ** 9", "exponent too large"),
        ("10 ** 20 * 10 ** 20", "result too large"),
        ("10.0 ** 99", "result too large"),
        ("1e400", "not a finite number"),
        ("9" * 40, "result too large"),
        ("1 / 0", "division by zero"),
        ("1 // 0", "division by zero"),
        ("1 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 +", "invalid syntax"),
        ("1" + "+1" * 150, "expression too long"),
    ],
)
def test_calculator_errors(expression: str, error_part: str) -> None:
    result = calculate(expression)
    assert result.startswith("Error: "), result
    assert error_part in result


def test_calculator_rejects_non_strings() -> None:
    assert calculate(12).startswith("Error: the expression must be a string")  # type: ignore[arg-type]


def test_calculator_never_evaluates_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "pwned"
    payloads = [
        f"__import__('pathlib').Path({str(marker)!r}).touch()",
        f"open({str(marker)!r}, 'w')",
        "().__class__.__bases__[0].__subclasses__()",
        "(lambda: 1)()",
    ]
    for payload in payloads:
        assert calculate(payload).startswith("Error: ")
    assert not marker.exists()


def test_calculator_source_has_no_eval_or_exec() -> None:
    tree = ast.parse(Path(calculator_module.__file__).read_text())
    called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert not called & {"eval", "exec", "compile", "__import__"}


def test_format_number() -> None:
    assert format_number(3431580.0) == "3431580"
    assert format_number(-2) == "-2"
    assert format_number(1e17) == "100000000000000000"
    assert format_number(2 / 3) == "0.6666666667"
    assert format_number(-1234.5678901234) == "-1234.56789"


# --- answer parsing and correctness ---------------------------------------------------------------------------------


def test_extract_and_parse_answer() -> None:
    assert extract_answer_line("The sum is 7.\nAnswer: 7") == "7"
    assert extract_answer_line("Answer: 3\nwait, no.\nAnswer: 4 apples") == "4 apples"
    assert parse_answer("Answer: 3\nwait, no.\nAnswer: 4 apples") == "4"
    assert parse_answer("**Answer:** 1,234") == "1,234"
    assert parse_answer("answer: -2/3 cup") == "-2/3"
    assert parse_answer("Answer: $12.50") == "12.50"
    assert parse_answer("Answer: C) 6") == "6"
    assert extract_answer_line("Answer: C) 6") == "C) 6"
    assert parse_answer("The answer is 42.") is None
    assert parse_answer("Answer: unknown") is None
    assert parse_answer(None) is None
    assert extract_answer_line("") is None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("-7", Fraction(-7)),
        ("about $1,234.50 total", Fraction(2469, 2)),
        ("2/3", Fraction(2, 3)),
        ("-4 / 6", Fraction(-2, 3)),
        ("1e3", Fraction(1000)),
        ("\u22125", Fraction(-5)),
        (".5", Fraction(1, 2)),
        ("3/0", None),
        ("no digits", None),
        (None, None),
    ],
)
def test_parse_number(text: str | None, value: Fraction | None) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        ("42", "42", True),
        ("42.0", "42", True),
        ("42 apples", "42", True),
        ("42.001", "42", False),
        ("41", "42", False),
        (None, "42", False),
        ("", "42", False),
        ("-9,867,630", "-9867630", True),
        ("3244047.1", "3244047.1", True),
        ("3244047.09", "3244047.1", True),  # relative error 3e-9
        ("3244400", "3244047.1", False),  # relative error 1e-4 + a bit
        ("2/3", "2/3", True),
        ("4/6", "2/3", True),
        ("0.6667", "2/3", True),  # relative error 5e-5
        ("0.667", "2/3", False),  # relative error 5e-4
        ("C", "C", True),
        ("C) 6", "C", True),
        ("(C)", "C", True),
        ("6", "C", False),
        ("Choice C", "C", False),
        ("CD", "C", False),
        ("B", "C", False),
    ],
)
def test_is_correct(pred: str | None, gold: str, expected: bool) -> None:
    assert is_correct(pred, _task(gold)) is expected


# --- tool calls and reward arithmetic --------------------------------------------------------------------------------


def test_run_tool_call_outcomes() -> None:
    ok = run_tool_call("calculator", '{"expression": "6 * 7"}')
    assert (ok.result, ok.well_formed, ok.ok) == ("42", True, True)
    assert run_tool_call("calculator", {"expression": "1+1"}).result == "2"
    expr_error = run_tool_call("calculator", '{"expression": "x + 1"}')
    assert (expr_error.well_formed, expr_error.ok) == (True, False)
    assert expr_error.result.startswith("Error: names are not allowed")
    for name, arguments, why in [
        ("calculate_ducks", '{"daily_eggs": 16}', "unknown tool"),
        ("calculator", '{"expression": "1+1"', "not valid JSON"),
        ("calculator", None, "not valid JSON"),
        ("calculator", '{"expr": "1+1"}', "string field expression"),
        ("calculator", '{"expression": 5}', "string field expression"),
        ("calculator", '["1+1"]', "string field expression"),
        (None, "{}", "unknown tool"),
    ]:
        outcome = run_tool_call(name, arguments)
        assert (outcome.well_formed, outcome.ok) == (False, False)
        assert outcome.result.startswith("Error: ") and why in outcome.result


@pytest.mark.parametrize(
    ("facts", "expected", "total"),
    [
        # no call, correct answer: no answer_line credit without a tool result, so correct 1.0 only
        (EpisodeFacts(answered=True, correct=True), [0.0, 0.0, 0.0, 1.0], 1.0),
        # one good call, correct answer: 0.1 + 0.1 + 0.25 + 1.0
        (EpisodeFacts(1, 1, 1, answered=True, correct=True), [0.1, 0.1, 0.25, 1.0], 1.45),
        # one good call, wrong answer: 0.1 + 0.1 + 0.25
        (EpisodeFacts(1, 1, 1, answered=True), [0.1, 0.1, 0.25, 0.0], 0.45),
        # three good calls (the baseline loop), no answer: binary credits, so 0.1 + 0.1 and no more
        (EpisodeFacts(3, 3, 3), [0.1, 0.1, 0.0, 0.0], 0.2),
        # the same loop, then a right answer in the forced turn: no answer_line credit
        (EpisodeFacts(3, 3, 3, answered=True, forced_answer=True, correct=True), [0.1, 0.1, 0.0, 1.0], 1.2),
        # malformed call (wrong name / bad JSON), no answer
        (EpisodeFacts(1, 0, 0), [0.0, 0.0, 0.0, 0.0], 0.0),
        # malformed call, then a wrong answer: no tool result, so no answer_line credit
        (EpisodeFacts(2, 0, 0, answered=True), [0.0, 0.0, 0.0, 0.0], 0.0),
        # well-formed call whose expression failed, no answer
        (EpisodeFacts(1, 1, 0), [0.1, 0.0, 0.0, 0.0], 0.1),
    ],
)
def test_compute_reward(facts: EpisodeFacts, expected: list[float], total: float) -> None:
    rewards = compute_reward(facts)
    assert list(rewards) == ["format_call", "tool_ok", "answer_line", "correct"]
    assert list(rewards.values()) == pytest.approx(expected)
    assert sum(rewards.values()) == pytest.approx(total)


def test_reward_orderings_hold_for_every_combination() -> None:
    """Right beats wrong always; after a tool result, answering on its own beats not answering or a forced answer;
    a wrong guess without the tool earns less than using the tool (so guessing is not a local optimum)."""
    right, wrong, own_after_tool, not_own_after_tool, wrong_guess, tool_used = [], [], [], [], [], []
    for wf, ok, answered, forced, correct in itertools.product(
        [0, 1], [0, 1], [False, True], [False, True], [False, True]
    ):
        if (ok and not wf) or (correct and not answered):
            continue
        facts = EpisodeFacts(max(wf, 1), wf, ok, answered=answered, forced_answer=forced, correct=correct)
        total = sum(compute_reward(facts).values())
        (right if correct else wrong).append(total)
        if ok:
            tool_used.append(total)
            if answered and not forced:
                own_after_tool.append((correct, total))
            elif not answered or forced:
                not_own_after_tool.append((correct, total))
    guess = EpisodeFacts(answered=True)
    wrong_guess.append(sum(compute_reward(guess).values()))
    assert min(right) > max(wrong)
    for correct in (False, True):
        own = [t for c, t in own_after_tool if c == correct]
        other = [t for c, t in not_own_after_tool if c == correct]
        assert own and other and min(own) > max(other)
    assert max(wrong_guess) < min(tool_used)


# --- the loop, against a scripted model ------------------------------------------------------------------------------


def _completion(content: str | None = None, calls: list[tuple[str, str]] = ()) -> ChatCompletion:
    tool_calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": arguments}}
        for i, (name, arguments) in enumerate(calls)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
        }
    )


class ScriptedModel:
    """Stand-in for ``client.chat.completions.create``: returns the scripted replies in order, records requests."""

    def __init__(self, replies: list[ChatCompletion]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> ChatCompletion:
        self.requests.append(json.loads(json.dumps(kwargs)))
        return self.replies.pop(0)


def _call(expression: str) -> tuple[str, str]:
    return ("calculator", json.dumps({"expression": expression}))


def test_episode_direct_answer() -> None:
    model = ScriptedModel([_completion("Answer: 30")])
    episode = run_episode(model, _task("30"), model="m")
    assert len(model.requests) == 1
    request = model.requests[0]
    assert request["tools"][0]["function"]["name"] == "calculator"
    assert (request["temperature"], request["max_tokens"]) == (1.0, 192)
    assert [m["role"] for m in request["messages"]] == ["system", "user"]
    assert request["messages"][1]["content"] == "Calculate -5 * -6."
    assert episode.facts == EpisodeFacts(answered=True, correct=True)
    assert episode.answer_text == "30"


def test_episode_call_then_answer() -> None:
    model = ScriptedModel([_completion(None, [_call("-5 * -6")]), _completion("The result is 30.\nAnswer: 30")])
    episode = run_episode(model, _task("30"), model="m", sampling={"temperature": 0.7, "max_tokens": 64})
    assert len(model.requests) == 2
    second = model.requests[1]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool"]
    assert second[2]["tool_calls"][0]["function"] == {"name": "calculator", "arguments": '{"expression": "-5 * -6"}'}
    assert second[3] == {"role": "tool", "tool_call_id": "call_0", "content": TOOL_RESULT_FORMAT.format(result="30")}
    assert second[3]["content"].startswith("30\n") and second[3]["content"].endswith("Answer: 30")
    assert model.requests[1]["temperature"] == 0.7
    assert episode.facts == EpisodeFacts(1, 1, 1, answered=True, correct=True)
    assert episode.messages[-1] == {"role": "assistant", "content": "The result is 30.\nAnswer: 30"}
    assert sum(compute_reward(episode.facts).values()) == pytest.approx(1.45)


def test_episode_loop_then_forced_answer() -> None:
    model = ScriptedModel([_completion(None, [_call("-5 * -6")]) for _ in range(3)] + [_completion("Answer: 30")])
    episode = run_episode(model, _task("30"), model="m", config=CalcAgentConfig(final_answer_turn=True))
    assert len(model.requests) == 4
    assert all("tools" in request for request in model.requests[:3])
    final_request = model.requests[3]
    assert "tools" not in final_request
    assert final_request["messages"][-1]["role"] == "user"
    assert "used the calculator 3 times" in final_request["messages"][-1]["content"]
    assert episode.facts == EpisodeFacts(3, 3, 3, answered=True, forced_answer=True, correct=True)
    assert compute_reward(episode.facts)["answer_line"] == 0.0
    assert sum(compute_reward(episode.facts).values()) == pytest.approx(1.2)


def test_episode_loop_without_final_turn_never_answers() -> None:
    model = ScriptedModel([_completion(None, [_call("-5 * -6")]) for _ in range(3)])
    config = CalcAgentConfig(final_answer_turn=False)
    episode = run_episode(model, _task("30"), model="m", config=config)
    assert len(model.requests) == 3
    assert episode.final_text is None and episode.answer_text is None
    assert episode.facts == EpisodeFacts(3, 3, 3)
    assert sum(compute_reward(episode.facts).values()) == pytest.approx(0.2)


def test_episode_malformed_calls_get_error_results() -> None:
    model = ScriptedModel(
        [
            _completion(None, [("calculate_ducks", '{"daily_eggs": 16}')]),
            _completion(None, [("calculator", '{"expression": ')]),
            _completion("I think it is 31."),
        ]
    )
    episode = run_episode(model, _task("30"), model="m")
    tool_messages = [m for m in episode.messages if m["role"] == "tool"]
    assert [m["content"].split(";")[0] for m in tool_messages] == [
        'Error: unknown tool "calculate_ducks"',
        "Error: the arguments are not valid JSON",
    ]
    assert episode.facts == EpisodeFacts(tool_calls=2)
    assert sum(compute_reward(episode.facts).values()) == 0.0


def test_episode_calls_beyond_budget_are_not_executed() -> None:
    model = ScriptedModel([_completion(None, [_call("1+1"), _call("2+2")]), _completion("Answer: B")])
    config = CalcAgentConfig(max_tool_calls=1, final_answer_turn=True)
    episode = run_episode(model, _task("B"), model="m", config=config)
    tool_messages = [m for m in episode.messages if m["role"] == "tool"]
    assert tool_messages[0]["content"] == TOOL_RESULT_FORMAT.format(result="2")
    assert tool_messages[1]["content"].startswith("Error: no calculator calls left")
    assert episode.facts == EpisodeFacts(1, 1, 1, answered=True, forced_answer=True, correct=True)
    assert "tools" not in model.requests[1]


def test_forced_turn_that_still_calls_the_tool_is_no_answer() -> None:
    replies = [_completion(None, [_call("1+1")])] * 3 + [_completion(None, [_call("1+1")])]
    config = CalcAgentConfig(final_answer_turn=True)
    episode = run_episode(ScriptedModel(replies), _task("2"), model="m", config=config)
    assert episode.facts == EpisodeFacts(3, 3, 3, forced_answer=True)


def test_sampling_kwargs() -> None:
    assert sampling_kwargs({}) == {"temperature": 1.0, "max_tokens": 192}
    params = {"temperature": 0.0, "max_tokens": 32, "top_p": 0.9, "seed": 7, "top_k": 5}
    assert sampling_kwargs(params) == {"temperature": 0.0, "max_tokens": 32, "top_p": 0.9, "seed": 7}


def test_config_rejects_negative_budget() -> None:
    with pytest.raises(ValueError, match="max_tool_calls"):
        CalcAgentConfig(max_tool_calls=-1)


# --- the @rollout agent over real HTTP -------------------------------------------------------------------------------


@pytest.fixture
def scripted_server() -> Iterator[tuple[str, list[dict[str, Any]], list[ChatCompletion]]]:
    """A loopback OpenAI-compatible server that answers with scripted completions and records request bodies."""
    requests: list[dict[str, Any]] = []
    replies: list[ChatCompletion] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server API)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            requests.append({"path": self.path, **body})
            payload = replies.pop(0).model_dump_json().encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", requests, replies
    finally:
        server.shutdown()
        server.server_close()


def test_rollout_agent_emits_components_and_returns_total(scripted_server) -> None:
    endpoint, requests, replies = scripted_server
    replies.extend([_completion(None, [_call("-5 * -6")]), _completion("Answer: 30")])
    llm = LLM(endpoint=endpoint, model="qwen", sampling_parameters={"temperature": 0.5, "max_tokens": 50})
    ctx = AttemptContext(rollout_id="ro-1", attempt_id="at-1")
    with attempt_scope(ctx):
        total = calc_agent(_task("30"), llm)
    assert total == pytest.approx(1.45)
    assert [r["path"] for r in requests] == ["/v1/chat/completions"] * 2
    assert requests[0]["model"] == "qwen" and requests[0]["temperature"] == 0.5 and requests[0]["max_tokens"] == 50
    emitted = {s.attributes[semconv.REWARD_NAME]: s.attributes[semconv.REWARD_VALUE] for s in ctx.spans}
    assert emitted == {"format_call": 0.1, "tool_ok": 0.1, "answer_line": 0.25, "correct": 1.0}
    assert all(s.name == semconv.SPAN_REWARD for s in ctx.spans)


def test_agent_module_is_agent_side_only() -> None:
    code = (
        "import sys, examples.calc_agent.agent\n"
        "bad = [m for m in ('torch', 'transformers', 'agentbolt.server') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=60)


def test_agent_object() -> None:
    assert calc_agent.name == "calc_agent"
    assert agent_module.REWARD_WEIGHTS["correct"] == 1.0


# --- tasks ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def val_sets() -> dict[str, list[Task]]:
    return load_val_sets()


@pytest.fixture(scope="module")
def train_tasks() -> list[Task]:
    return load_train_tasks(512)


def test_val_set_sizes(val_sets: dict[str, list[Task]]) -> None:
    assert list(val_sets) == list(VAL_SET_NAMES)
    assert {name: len(tasks) for name, tasks in val_sets.items()} == {
        "rg_basic_arithmetic": VAL_POOL_SIZE,
        "rg_chain_sum": VAL_POOL_SIZE,
        "calc_x": 10,
        "gsm_hard": 64,
    }
    small = load_val_sets(8)
    assert all(len(tasks) == 8 for tasks in small.values())
    assert all(small[name] == val_sets[name][:8] for name in VAL_SET_NAMES)
    assert load_val_sets(0) == {name: [] for name in VAL_SET_NAMES}
    with pytest.raises(ValueError):
        load_val_sets(-1)


def test_task_shape(val_sets: dict[str, list[Task]], train_tasks: list[Task]) -> None:
    for task in train_tasks + [t for tasks in val_sets.values() for t in tasks]:
        assert set(task) == {"task_id", "question", "answer", "source"}
        assert all(isinstance(value, str) and value for value in task.values())
    ids = [t["task_id"] for t in train_tasks] + [t["task_id"] for tasks in val_sets.values() for t in tasks]
    assert len(ids) == len(set(ids))


def test_train_mix_size_and_determinism(train_tasks: list[Task]) -> None:
    assert len(train_tasks) == 512
    assert [t["source"] for t in train_tasks[:4]] == ["rg_basic_arithmetic", "rg_chain_sum"] * 2
    assert sum(t["source"] == "rg_chain_sum" for t in train_tasks) == 256
    assert load_train_tasks(64) == train_tasks[:64]
    assert load_train_tasks(0) == []
    other_seed = load_train_tasks(64, seed=7)
    assert [t["question"] for t in other_seed] != [t["question"] for t in train_tasks[:64]]
    with pytest.raises(ValueError):
        load_train_tasks(-1)


def test_train_and_val_are_disjoint(val_sets: dict[str, list[Task]], train_tasks: list[Task]) -> None:
    val_questions = {t["question"] for tasks in val_sets.values() for t in tasks}
    train_questions = [t["question"] for t in train_tasks]
    assert len(set(train_questions)) == len(train_questions)
    assert not val_questions & set(train_questions)


def test_train_seed_overlapping_val_seed_is_still_disjoint(val_sets: dict[str, list[Task]]) -> None:
    # reasoning-gym seeds item i with seed + i: seed 1224 items 10.. are the val (seed 1234) items 0..
    train = load_train_tasks(40, seed=1224)
    val_questions = {t["question"] for tasks in val_sets.values() for t in tasks}
    assert len(train) == 40
    assert not val_questions & {t["question"] for t in train}


def test_rg_golds_agree_with_the_calculator(val_sets: dict[str, list[Task]], train_tasks: list[Task]) -> None:
    for task in train_tasks + val_sets["rg_basic_arithmetic"] + val_sets["rg_chain_sum"]:
        expression = task["question"].removeprefix("Calculate ").removesuffix(".").split(":")[-1]
        assert calculate(expression) == task["answer"], task


def test_copied_data_files_load() -> None:
    calc_x, gsm_hard = load_calc_x(), load_gsm_hard()
    assert len(calc_x) == 10 and len(gsm_hard) == 64
    assert calc_x[0]["answer"] == "2/3" and calc_x[0]["task_id"] == "calc_x-ape210k__00384263"
    assert sorted(t["answer"] for t in calc_x if t["answer"].isalpha()) == ["B", "C"]
    assert gsm_hard[0]["answer"] == "-9867630"
    assert gsm_hard[7]["answer"] == "3244047.1"  # target 3244047.0999999996
    for task in calc_x + gsm_hard:
        assert task["answer"].isalpha() or parse_number(task["answer"]) is not None
        assert is_correct(task["answer"], task)
