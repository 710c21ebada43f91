"""The two agents of the SQL example: a **writer** that drafts SQLite queries and a **checker** that reviews them.

Protocol of one rollout (:func:`run_system`), with plain ``openai`` calls only:
    1. **writer, draft.** The writer sees the compact schema (:func:`compact_schema`) and the question and replies
       with one query in a ```` ```sql ```` block.
    2. **execute.** The draft's SQL (:func:`~examples.sql_agent.reward.extract_sql`) runs read-only through
       :func:`~examples.sql_agent.reward.run_sql`; the result (first rows) or the error is described in one short
       text (:func:`describe_result`). A reply without SQL is described as ``no query found``.
    3. **checker.** The checker sees the schema, the question, the draft and its result, and answers ``APPROVE`` or
       a corrected query (:func:`parse_verdict`). It runs once per rollout, whatever the draft looks like.
    4. **writer, revision** (only when the checker did not approve): the writer's own conversation continues with
       the checker's feedback (the corrected query, or the checker's words) and the draft's result, and the writer
       replies with its final query. At most one revision.
    5. **final SQL**: the draft's when the checker approved, else the revision's. The reward is
       :func:`~examples.sql_agent.reward.score_sql` of the final SQL against the gold: 1.0 on a match, else 0.0; no
       SQL gives 0.0.

Each agent's calls are made inside ``with agentbolt.agent("writer")`` / ``agentbolt.agent("checker")``, so every LLM
call the gateway records carries its agent's name; the trainer's ``agent_match`` then selects the writer's calls
as training data and leaves the checker's out (see ``train.py``). The scope reaches the gateway through the
runner's ``openai`` instrumentation (the ``[integrations]`` extra); each request also sends its agent's name in the
``x-agentbolt-agent`` header, so the names arrive without that extra too.

Rewards: the agent emits ``correct`` (the final reward, the name evaluation reads as accuracy) and
``draft_correct`` (the draft's score, to see what the checker adds), and returns the final reward.

The checker runs on the same model as the writer (the ``llm`` resource, through the gateway) unless
:class:`SqlAgentsConfig` names another OpenAI-compatible endpoint; :data:`sql_agents` reads that endpoint from the
environment (:meth:`SqlAgentsConfig.from_env`), so runner processes started by ``train.py`` see it.

This module is agent-side: it imports ``openai`` and ``agentbolt``'s client API, never torch, transformers or the
server. Model output is never trusted: garbage, empty replies and replies without SQL never raise.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openai import OpenAI
from openai.types.chat import ChatCompletion

import agentbolt
from agentbolt import LLM, emit_reward, rollout
from agentbolt.runner.agent import FunctionAgent
from agentbolt.semconv import AGENT_NAME_HEADER

from .reward import QueryResult, extract_sql, run_sql, score_sql
from .tasks import DB_PATH, SqlTask, connect_readonly

WRITER = "writer"
"""Agent name of the writer: the only agent trained (``agent_match="writer"``)."""
CHECKER = "checker"
"""Agent name of the checker: it runs, its calls are recorded, it is not trained."""

DEFAULT_TEMPERATURE = 1.0
DEFAULT_MAX_TOKENS = 160
RESULT_PREVIEW_ROWS = 5
"""Rows of a query result shown to the checker and in the revision prompt."""
RESULT_PREVIEW_CHARS = 400
"""Longest description of a query result (longer ones are cut and end in ``...``)."""
FEEDBACK_CHARS = 300
"""Longest checker feedback quoted to the writer when the checker gave words, not a query."""
CHECKER_URL_ENV = "AGENTBOLT_SQL_CHECKER_BASE_URL"
CHECKER_MODEL_ENV = "AGENTBOLT_SQL_CHECKER_MODEL"
CHECKER_KEY_ENV = "AGENTBOLT_SQL_CHECKER_API_KEY"

WRITER_SYSTEM = (
    "You write one SQLite query that answers the question, using only the tables and columns of the schema.\n"
    "Reply with the query in a ```sql block and nothing else."
)
WRITER_USER = "Schema:\n{schema}\n\nQuestion: {question}"
CHECKER_SYSTEM = (
    "You review a SQLite query written for a question. If it answers the question correctly, reply APPROVE.\n"
    "Otherwise reply with a corrected query in a ```sql block."
)
CHECKER_USER = "Schema:\n{schema}\n\nQuestion: {question}\n\nQuery:\n{query}\n\nResult: {result}"
REVISION_WITH_QUERY = (
    "Your query gave: {result}\nA reviewer suggests:\n```sql\n{suggestion}\n```\n"
    "Reply with your final query in a ```sql block."
)
REVISION_WITH_WORDS = (
    "Your query gave: {result}\nA reviewer did not approve it: {feedback}\n"
    "Reply with your final query in a ```sql block."
)

_APPROVE_RE = re.compile(r"\bAPPROVE", re.IGNORECASE)
_SPACE_RE = re.compile(r"\s+")
_SAMPLING_KEYS = ("temperature", "max_tokens", "top_p", "seed")

CreateCompletion = Callable[..., ChatCompletion]
"""``client.chat.completions.create`` of a sync ``openai.OpenAI`` client, or a stand-in with the same contract."""


@dataclass(frozen=True)
class ChatEndpoint:
    """An OpenAI-compatible endpoint for the checker when it does not share the writer's model.

    Attributes:
        base_url: the client's base URL (ends in ``/v1``). Calls to it do not go through the attempt's gateway,
            so they are not recorded as LLM calls of the rollout (they are never training data anyway).
        model: the model name to request.
        api_key: the key to send (``"agentbolt"`` for servers that need none).
    """

    base_url: str
    model: str
    api_key: str = "agentbolt"


@dataclass(frozen=True)
class SqlAgentsConfig:
    """Settings of the two-agent system.

    Attributes:
        checker: where the checker runs; ``None``: on the writer's ``llm`` resource (the gateway, same model).
        checker_temperature: the checker's sampling temperature; ``None``: the ``llm`` resource's.
        db_path: the database the queries run on.
    """

    checker: ChatEndpoint | None = None
    checker_temperature: float | None = None
    db_path: Path = DB_PATH

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SqlAgentsConfig:
        """The config named by the environment: ``AGENTBOLT_SQL_CHECKER_BASE_URL`` (with
        ``AGENTBOLT_SQL_CHECKER_MODEL`` and optionally ``AGENTBOLT_SQL_CHECKER_API_KEY``) puts the checker on that
        endpoint; unset, the checker shares the writer's model.

        Raises:
            ValueError: the base URL is set without a model name.
        """
        env = os.environ if environ is None else environ
        base_url = env.get(CHECKER_URL_ENV, "").strip()
        if not base_url:
            return cls()
        model = env.get(CHECKER_MODEL_ENV, "").strip()
        if not model:
            raise ValueError(f"{CHECKER_URL_ENV} is set to {base_url!r} but {CHECKER_MODEL_ENV} is not; set both")
        return cls(checker=ChatEndpoint(base_url, model, env.get(CHECKER_KEY_ENV) or "agentbolt"))


@dataclass(frozen=True)
class Verdict:
    """What the checker said about a draft.

    Attributes:
        approved: the checker approved the draft (and proposed no different query).
        suggestion: the corrected query it proposed, when it proposed one that differs from the draft.
        text: its whole reply (``""`` for an empty one).
    """

    approved: bool
    suggestion: str | None
    text: str


@dataclass
class SystemRun:
    """One rollout of the two-agent system.

    Attributes:
        draft_text / draft_sql: the writer's first reply and the SQL extracted from it (``None``: none found).
        draft_result: what the draft's SQL returned (``None`` when there was no SQL).
        verdict: the checker's verdict.
        revision_text / revision_sql: the writer's second reply and its SQL (``None`` when approved or none found).
        final_sql: the SQL that is scored (``None``: no SQL, reward 0).
        draft_reward / reward: the draft's and the final SQL's score, 1.0 or 0.0.
        reason: why the final SQL got its reward (``match``, an error, a mismatch, ``no SQL found``).
        calls: LLM calls made, as ``(agent name, reply text)`` in order.
    """

    draft_text: str
    draft_sql: str | None
    draft_result: QueryResult | None
    verdict: Verdict
    revision_text: str | None
    revision_sql: str | None
    final_sql: str | None
    draft_reward: float
    reward: float
    reason: str
    calls: list[tuple[str, str]]


@functools.cache
def compact_schema(db_path: Path = DB_PATH) -> str:
    """The tables of ``db_path`` in one short line each, for small models' prompts.

    Example line: ``Track(TrackId, Name, AlbumId -> Album, MediaTypeId -> MediaType, ..., UnitPrice)``; a column
    that is a foreign key names the table it points to. About 900 characters for Chinook, against about 4,200 for
    the ``CREATE TABLE`` statements.

    Raises:
        FileNotFoundError: ``db_path`` does not exist.
    """
    connection = connect_readonly(db_path)
    try:
        tables = [
            row[0]
            for row in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        ]
        lines = []
        for table in tables:
            quoted = table.replace('"', '""')
            foreign = {row[3]: row[2] for row in connection.execute(f'PRAGMA foreign_key_list("{quoted}")')}
            columns = [
                f"{row[1]} -> {foreign[row[1]]}" if row[1] in foreign else str(row[1])
                for row in connection.execute(f'PRAGMA table_info("{quoted}")')
            ]
            lines.append(f"{table}({', '.join(columns)})")
    finally:
        connection.close()
    return "\n".join(lines)


def describe_result(result: QueryResult | None, *, max_rows: int = RESULT_PREVIEW_ROWS) -> str:
    """One short text describing a query's outcome, for the checker and the revision prompt.

    Returns:
        ``no query found`` (``result`` is ``None``), ``error: <reason>``, ``no rows``, or
        ``<n> rows (<columns>): <first rows>`` (``...`` after them when there are more), cut to
        :data:`RESULT_PREVIEW_CHARS` characters.
    """
    if result is None:
        return "no query found"
    if result.error is not None:
        text = f"error: {result.error}"
    elif not result.rows:
        text = "no rows"
    else:
        shown = "; ".join(repr(tuple(row)) for row in result.rows[:max_rows])
        more = " ..." if len(result.rows) > max_rows else ""
        count = f"{len(result.rows)} row" + ("" if len(result.rows) == 1 else "s")
        text = f"{count} ({', '.join(result.columns)}): {shown}{more}"
    return text if len(text) <= RESULT_PREVIEW_CHARS else text[: RESULT_PREVIEW_CHARS - 3] + "..."


def parse_verdict(text: str | None, draft_sql: str | None) -> Verdict:
    """Read the checker's reply. Never raises.

    Rules, first that applies:
        1. the reply holds SQL (:func:`extract_sql`) that differs from the draft (ignoring case and whitespace):
           a correction, not approved;
        2. the reply contains the word ``APPROVE`` (any case, ``APPROVED`` too): approved;
        3. otherwise (garbage, empty, or the draft repeated without approval): not approved, no suggestion.
    """
    reply = text or ""
    suggestion = extract_sql(reply)
    if suggestion is not None and (draft_sql is None or _normalized(suggestion) != _normalized(draft_sql)):
        return Verdict(approved=False, suggestion=suggestion, text=reply)
    return Verdict(approved=_APPROVE_RE.search(reply) is not None, suggestion=None, text=reply)


def sampling_kwargs(sampling_parameters: Mapping[str, object]) -> dict[str, object]:
    """Request keyword arguments from ``LLM.sampling_parameters``: temperature (default 1.0), max_tokens (160),
    and top_p / seed when given. Other keys are ignored."""
    kwargs: dict[str, object] = {"temperature": DEFAULT_TEMPERATURE, "max_tokens": DEFAULT_MAX_TOKENS}
    kwargs.update({key: sampling_parameters[key] for key in _SAMPLING_KEYS if key in sampling_parameters})
    return kwargs


def run_system(
    task: SqlTask,
    writer: CreateCompletion,
    checker: CreateCompletion,
    *,
    writer_model: str,
    checker_model: str,
    writer_sampling: Mapping[str, object] | None = None,
    checker_sampling: Mapping[str, object] | None = None,
    db_path: Path = DB_PATH,
) -> SystemRun:
    """Run the writer -> execute -> checker -> (revision) protocol of the module docstring on one task and score it.

    Each call is made inside ``agentbolt.agent(WRITER)`` or ``agentbolt.agent(CHECKER)`` and sends the same name in
    the ``x-agentbolt-agent`` header (``extra_headers``).

    Args:
        task: the question and its gold rows.
        writer / checker: ``client.chat.completions.create`` of the clients the two agents call (the same one when
            they share a model).
        writer_model / checker_model: the model names to request.
        writer_sampling / checker_sampling: request keyword arguments (see :func:`sampling_kwargs`).
        db_path: the database the queries run on.

    Returns:
        The run, with its final reward (1.0 or 0.0).

    Raises:
        openai.OpenAIError: a request failed (the runner records the attempt as failed, not scored 0).
    """
    writer_kwargs = dict(writer_sampling or sampling_kwargs({}))
    checker_kwargs = dict(checker_sampling or sampling_kwargs({}))
    schema = compact_schema(db_path)
    calls: list[tuple[str, str]] = []

    messages: list[dict[str, Any]] = [
        {"role": "system", "content": WRITER_SYSTEM},
        {"role": "user", "content": WRITER_USER.format(schema=schema, question=task.question)},
    ]
    with agentbolt.agent(WRITER):
        draft_text = _reply(writer(model=writer_model, messages=messages, **writer_kwargs, **_named(WRITER)))
    calls.append((WRITER, draft_text))
    draft_sql = extract_sql(draft_text)
    draft_result = run_sql(draft_sql, db_path) if draft_sql is not None else None
    described = describe_result(draft_result)

    review = [
        {"role": "system", "content": CHECKER_SYSTEM},
        {
            "role": "user",
            "content": CHECKER_USER.format(
                schema=schema,
                question=task.question,
                query=f"```sql\n{draft_sql}\n```" if draft_sql is not None else "(none)",
                result=described,
            ),
        },
    ]
    with agentbolt.agent(CHECKER):
        checker_text = _reply(checker(model=checker_model, messages=review, **checker_kwargs, **_named(CHECKER)))
    calls.append((CHECKER, checker_text))
    verdict = parse_verdict(checker_text, draft_sql)

    revision_text: str | None = None
    revision_sql: str | None = None
    if verdict.approved:
        final_sql = draft_sql
    else:
        if verdict.suggestion is not None:
            follow_up = REVISION_WITH_QUERY.format(result=described, suggestion=verdict.suggestion)
        else:
            feedback = _SPACE_RE.sub(" ", verdict.text).strip()[:FEEDBACK_CHARS] or "(no reason given)"
            follow_up = REVISION_WITH_WORDS.format(result=described, feedback=feedback)
        messages += [{"role": "assistant", "content": draft_text}, {"role": "user", "content": follow_up}]
        with agentbolt.agent(WRITER):
            revision_text = _reply(writer(model=writer_model, messages=messages, **writer_kwargs, **_named(WRITER)))
        calls.append((WRITER, revision_text))
        revision_sql = extract_sql(revision_text)
        final_sql = revision_sql

    draft_reward = score_sql(draft_sql, task, db_path).reward if draft_sql is not None else 0.0
    if final_sql is None:
        reward, reason = 0.0, "no SQL found in the final answer"
    else:
        score = score_sql(final_sql, task, db_path)
        reward, reason = score.reward, score.reason
    return SystemRun(
        draft_text=draft_text,
        draft_sql=draft_sql,
        draft_result=draft_result,
        verdict=verdict,
        revision_text=revision_text,
        revision_sql=revision_sql,
        final_sql=final_sql,
        draft_reward=draft_reward,
        reward=reward,
        reason=reason,
        calls=calls,
    )


def make_sql_agents(config: SqlAgentsConfig | None = None) -> FunctionAgent:
    """Build the ``@rollout`` agent running the two-agent system (:data:`sql_agents` is the one built from
    :meth:`SqlAgentsConfig.from_env`).

    The agent takes the task as a dict (``SqlTask.model_dump(mode="json")``, as the store hands it over) and the
    ``llm`` resource; it emits ``draft_correct`` and ``correct`` with ``emit_reward`` and returns the final reward.

    Raises (from the built agent):
        pydantic.ValidationError: the task is not a valid :class:`SqlTask`.
        openai.OpenAIError: a request failed.
    """
    settings = config or SqlAgentsConfig()

    def sql_agents(task: Mapping[str, Any], llm: LLM) -> float:
        sql_task = SqlTask.model_validate(task)
        writer_sampling = sampling_kwargs(llm.sampling_parameters)
        checker_sampling = dict(writer_sampling)
        if settings.checker_temperature is not None:
            checker_sampling["temperature"] = settings.checker_temperature
        client = OpenAI(base_url=llm.endpoint, api_key="agentbolt", max_retries=0)
        other = (
            OpenAI(base_url=settings.checker.base_url, api_key=settings.checker.api_key)
            if settings.checker is not None
            else None
        )
        try:
            run = run_system(
                sql_task,
                client.chat.completions.create,
                (other or client).chat.completions.create,
                writer_model=llm.model,
                checker_model=settings.checker.model if settings.checker is not None else llm.model,
                writer_sampling=writer_sampling,
                checker_sampling=checker_sampling,
                db_path=settings.db_path,
            )
        finally:
            client.close()
            if other is not None:
                other.close()
        emit_reward(run.draft_reward, name="draft_correct")
        emit_reward(run.reward, name="correct")
        return run.reward

    return rollout(sql_agents)


sql_agents = make_sql_agents(SqlAgentsConfig.from_env())
"""The two-agent system; the checker shares the writer's model unless ``AGENTBOLT_SQL_CHECKER_BASE_URL`` is set."""


def _reply(completion: ChatCompletion) -> str:
    """The text of the first choice ("" when there is none or it has no content)."""
    choices = getattr(completion, "choices", None) or []
    if not choices:
        return ""
    message = getattr(choices[0], "message", None)
    content = getattr(message, "content", None)
    return content if isinstance(content, str) else ""


def _named(agent_name: str) -> dict[str, Any]:
    """Request keyword arguments that send the agent's name to the gateway (``x-agentbolt-agent``)."""
    return {"extra_headers": {AGENT_NAME_HEADER: agent_name}}


def _normalized(sql: str) -> str:
    return _SPACE_RE.sub(" ", sql).strip().rstrip(";").strip().lower()
