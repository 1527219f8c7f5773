"""An LLM judge: a model scores the preserved workspace against the task's rubric.

``JudgeEvaluator`` reads the workspace's text files (in path order, within a character
budget; binary files, ``.git``, ``.gyre`` and symbolic links left out), asks a ``ChatClient``
to grade them against the rubric, and reads the score from the answer's last ``SCORE:`` line.
Every call, answered or not, is appended as ``judge.called`` before the evaluator returns or
raises, so the log holds what each judge saw (a digest of the messages, the files shown) and
said. The answer without its score line is the evaluation's critique. A call that fails, or
an answer without a usable score, is an evaluator failure: the runner retries it.
``OpenAIChatClient`` speaks OpenAI's chat completions to any compatible server;
``post_completion`` is that exchange, shared with the judge on the run's own engines
(``judge_engines.EngineJudgeClient``, which makes each call an execution of a side run).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import math
import os
import re
import stat
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx
import msgspec

from gyre_store import (
    EvaluationStatus,
    EventLog,
    EventMetadata,
    JudgeCalled,
    JudgedFile,
    NewEvent,
    judge_call_key,
)
from gyre_train.exceptions import EvaluatorFailure, InvalidConfigError
from gyre_train.rewards.evaluation import EvaluationResult, PreservedState

DEFAULT_BUDGET_CHARS = 60_000  # workspace text in the message: file headers and contents
MIN_BUDGET_CHARS = 1_000  # a judge shown less than this could not judge anything
SKIPPED_DIRS = frozenset({".git", ".gyre"})  # version control, and gyre's own files in a workspace
SNIFF_BYTES = 8192  # a NUL byte in a file's first bytes marks it binary
NAMED_NOT_SHOWN = 200  # files past the budget named in the message, at most
RECORDED_ANSWER_CHARS = 100_000  # an answer longer than this is cut in the record (not in the critique)

SYSTEM_PROMPT = (
    "You are a strict grader. You grade the work a coding agent left in its workspace against a "
    "rubric. You are given the task the agent was asked to do, the rubric, and the text files of "
    "the workspace. Judge only what the files show. Say briefly what meets the rubric and what "
    "misses it, then end your answer with one line of the form\n"
    "SCORE: <number between 0 and 1>\n"
    "where 1 means the work fully meets the rubric and 0 means it meets none of it."
)

_FAILURE_PREFIX = f"{(EvaluatorFailure.__doc__ or '').strip()}: "
_THINKING = re.compile(r"<think>.*?</think>", re.DOTALL)
_SCORE_LINE = re.compile(r"^[\s*_`#>]*score\s*:(.*)$", re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


# -- the chat seam --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a chat: ``system``, ``user`` or ``assistant``, and its text."""

    role: str
    content: str


@dataclass(frozen=True, slots=True)
class ChatAnswer:
    """A model's answer: its text, the model the server says answered, and the token counts."""

    text: str
    model: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class ChatClient(Protocol):
    """Asks one model for a chat completion; raises EvaluatorFailure when it gets no answer.

    ``call_id`` names the judge's call; ``side_execution(call_id)`` is the execution whose
    model calls record it, where the client makes one ("" for a plain server)."""

    @property
    def model(self) -> str: ...

    @property
    def endpoint(self) -> str: ...

    def complete(self, messages: Sequence[ChatMessage], *, call_id: str = "") -> ChatAnswer: ...

    def side_execution(self, call_id: str) -> str: ...


class _Message(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    message: _Message


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _Completion(msgspec.Struct):
    choices: list[_Choice]
    model: str = ""
    usage: _Usage | None = None


class OpenAIChatClient:
    """POSTs ``{base_url}/chat/completions`` (non-streaming, temperature 0) to an OpenAI-compatible
    server. ``api_key`` is sent as a bearer token when not empty. Every failure (connection,
    non-2xx status, malformed JSON, no choice, no text) raises EvaluatorFailure with one line."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        timeout_s: float = 300.0,
        max_tokens: int = 4096,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if urlsplit(base_url).scheme not in ("http", "https") or not urlsplit(base_url).netloc:
            raise InvalidConfigError(f"a judge's base URL must be an http(s) URL, got {base_url!r}")
        if not model:
            raise InvalidConfigError("a judge needs the name of the model to ask for")
        if timeout_s <= 0 or max_tokens < 1:
            raise InvalidConfigError(
                f"timeout_s must be positive and max_tokens >= 1 ({timeout_s}, {max_tokens})"
            )
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._model = model
        self._max_tokens = max_tokens
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s), headers=headers, transport=transport)

    @property
    def model(self) -> str:
        return self._model

    @property
    def endpoint(self) -> str:
        return _public_url(self._url)

    def complete(self, messages: Sequence[ChatMessage], *, call_id: str = "") -> ChatAnswer:
        return post_completion(self._http, self._url, self._model, messages, max_tokens=self._max_tokens)

    def side_execution(self, call_id: str) -> str:
        return ""  # a server of its own: its calls are not gyre's model calls

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> OpenAIChatClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def post_completion(
    http: httpx.Client,
    url: str,
    model: str,
    messages: Sequence[ChatMessage],
    *,
    max_tokens: int,
    api_key: str = "",
) -> ChatAnswer:
    """POST one non-streaming chat completion (temperature 0) to ``url`` and read its answer;
    ``api_key``, when given, is sent as a bearer token for this request. Every failure
    (connection, non-2xx status, malformed JSON, no choice, no text) raises EvaluatorFailure
    with one line naming ``url`` without its credentials."""
    endpoint = _public_url(url)
    body = {
        "model": model,
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": False,
    }
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        response = http.post(url, json=body, headers=headers)
    except httpx.HTTPError as exc:
        raise EvaluatorFailure(
            f"cannot reach {endpoint}: {_one_line(str(exc) or type(exc).__name__)}"
        ) from exc
    if not response.is_success:
        raise EvaluatorFailure(
            f"{endpoint} answered HTTP {response.status_code}: {_one_line(response.text)[:300]}"
        )
    try:
        completion = msgspec.json.decode(response.content, type=_Completion)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise EvaluatorFailure(f"{endpoint} answered a malformed completion: {_one_line(str(exc))}") from exc
    if not completion.choices:
        raise EvaluatorFailure(f"{endpoint} answered no choices")
    text = completion.choices[0].message.content
    if not text:
        raise EvaluatorFailure(f"{endpoint} answered a choice without text")
    usage = completion.usage or _Usage()
    return ChatAnswer(text, completion.model, usage.prompt_tokens, usage.completion_tokens)


# -- what the judge is shown ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShownFile:
    """A workspace file's text as the judge is shown it (a prefix when ``truncated``)."""

    path: str
    size: int  # bytes on disk
    text: str
    truncated: bool

    @property
    def header(self) -> str:
        if self.truncated:
            return f"=== {self.path} (truncated to fit: the file has {self.size} bytes) ===\n"
        return f"=== {self.path} ===\n"

    def record(self) -> JudgedFile:
        return JudgedFile(path=self.path, size=self.size, sent_chars=len(self.text), truncated=self.truncated)


@dataclass(frozen=True, slots=True)
class WorkspaceText:
    """The text files of a workspace within a budget, the files past it, and the binary ones."""

    shown: tuple[ShownFile, ...]
    not_shown: tuple[str, ...]
    binary: int


def read_workspace(root: Path, budget_chars: int = DEFAULT_BUDGET_CHARS) -> WorkspaceText:
    """Read ``root``'s regular files in sorted path order until ``budget_chars`` (headers
    included) are spent; the file that crosses it is truncated, later ones are only named.

    Skips ``SKIPPED_DIRS``, symbolic links (never followed out of the workspace), other
    non-regular files, unreadable files and binary files (a NUL byte, or not UTF-8).
    """
    paths: list[str] = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        paths.extend(Path(folder, f).relative_to(root).as_posix() for f in files)
    shown: list[ShownFile] = []
    not_shown: list[str] = []
    binary, left = 0, budget_chars
    for rel in sorted(paths):
        if left <= 0:
            not_shown.append(rel)
            continue
        read = _read_text(root / rel, left)
        if read is None:
            continue
        if read.binary:
            binary += 1
            continue
        whole = ShownFile(rel, read.size, read.text, truncated=False)
        if read.complete and len(whole.header) + len(whole.text) <= left:
            shown.append(whole)
            left -= len(whole.header) + len(whole.text)
            continue
        cut = ShownFile(rel, read.size, "", truncated=True)
        room = left - len(cut.header)
        if room > 0:
            shown.append(ShownFile(rel, read.size, read.text[:room], truncated=True))
        else:
            not_shown.append(rel)
        left = 0
    return WorkspaceText(tuple(shown), tuple(not_shown), binary)


@dataclass(frozen=True, slots=True)
class _Read:
    size: int
    text: str
    complete: bool  # read to the end of the file
    binary: bool


def _read_text(path: Path, chars: int) -> _Read | None:
    """The first ``chars`` or more characters of a regular file (None: not one, or unreadable)."""
    try:
        # O_NOFOLLOW: a file swapped for a link after the walk is refused, not followed;
        # O_NONBLOCK: a named pipe the agent left cannot hang the judge (fstat refuses it next).
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            return None
        limit = chars * 4 + 4  # a character is at most four bytes of UTF-8
        data = fh.read(limit + 1)
    complete = len(data) <= limit
    if b"\0" in data[:SNIFF_BYTES]:
        return _Read(info.st_size, "", complete, binary=True)
    try:
        # An incomplete character at the cut is held back, not an error (final=False).
        text = codecs.getincrementaldecoder("utf-8")("strict").decode(data[:limit], final=complete)
    except UnicodeDecodeError:
        return _Read(info.st_size, "", complete, binary=True)
    return _Read(info.st_size, text, complete, binary=False)


def judge_messages(prompt: str, rubric: str, workspace: WorkspaceText) -> tuple[ChatMessage, ChatMessage]:
    """The system and user messages a judge is sent: the task prompt, the rubric, the files."""
    parts = [
        "# The task the agent was given\n\n",
        prompt.strip(),
        "\n\n# The rubric\n\n",
        rubric.strip(),
        f"\n\n# The workspace\n\n{len(workspace.shown)} text files, in path order.\n\n",
    ]
    for file in workspace.shown:
        parts += [file.header, file.text, "" if file.text.endswith("\n") or not file.text else "\n"]
    if workspace.not_shown:
        named = ", ".join(workspace.not_shown[:NAMED_NOT_SHOWN])
        more = len(workspace.not_shown) - NAMED_NOT_SHOWN
        parts.append(
            f"\nNot shown, past the length limit: {named}" + (f" and {more} more" if more > 0 else "") + ".\n"
        )
    if workspace.binary:
        parts.append(f"\n{workspace.binary} binary files are not shown.\n")
    return ChatMessage("system", SYSTEM_PROMPT), ChatMessage("user", "".join(parts))


def messages_digest(messages: Sequence[ChatMessage]) -> str:
    """sha256 of the messages as the JSON array ``[{"role": ..., "content": ...}, ...]``
    (UTF-8, no ASCII escaping, separators ``,`` and ``:``), the form ``judge.called`` records."""
    wire = [{"role": m.role, "content": m.content} for m in messages]
    return _sha256(json.dumps(wire, ensure_ascii=False, separators=(",", ":")))


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# -- what the judge said --------------------------------------------------------------------------


def parse_score(answer: str) -> tuple[float, str]:
    """The score on the last ``SCORE:`` line of ``answer`` and the critique: the answer without
    that line (and without ``<think>`` blocks). Raises EvaluatorFailure when the last such line
    holds no number in [0, 1], or there is none."""
    visible = _THINKING.sub("", answer)
    lines = visible.splitlines()
    at = next((i for i in range(len(lines) - 1, -1, -1) if _SCORE_LINE.match(lines[i])), None)
    if at is None:
        raise EvaluatorFailure("the judge's answer has no SCORE: line")
    match = _SCORE_LINE.match(lines[at])
    assert match is not None  # found by the same pattern
    value = match.group(1).strip().strip("*_`").strip().removesuffix(".")
    if not _NUMBER.fullmatch(value):
        raise EvaluatorFailure(f"the judge's SCORE: line holds no number: {lines[at].strip()[:100]!r}")
    score = float(value)
    if not (math.isfinite(score) and 0.0 <= score <= 1.0):
        raise EvaluatorFailure(f"the judge's score {value} is not between 0 and 1")
    critique = "\n".join(lines[:at] + lines[at + 1 :]).strip()
    return score, critique


def _public_url(url: str) -> str:
    """``url`` without credentials or query (where keys hide); other text is returned as it is."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _reason(exc: Exception) -> str:
    """What went wrong, in one line: an EvaluatorFailure's detail, or another error's type and text."""
    if isinstance(exc, EvaluatorFailure):
        return _one_line(str(exc).removeprefix(_FAILURE_PREFIX))
    return _one_line(f"{type(exc).__name__}: {exc}")


def _one_line(text: str) -> str:
    return " ".join(text.split())


# -- the evaluator --------------------------------------------------------------------------------


class JudgeEvaluator:
    """Scores a preserved workspace with an LLM judge and records every call as ``judge.called``.

    ``judge`` is the configured setting, recorded as given (``policy``, ``engine:NAME``, a URL;
    a URL's credentials and query are dropped); ``prompt`` and ``rubric`` are the task's. A
    missing workspace is NOT_EVALUABLE without a call. Raises EvaluatorFailure when the call
    fails or the answer holds no score in [0, 1], after recording the call.
    """

    def __init__(
        self,
        client: ChatClient,
        log: EventLog,
        *,
        judge: str,
        prompt: str,
        rubric: str,
        task_id: str = "",
        budget_chars: int = DEFAULT_BUDGET_CHARS,
        name: str = "judge",
        new_call_id: Callable[[], str] = lambda: uuid.uuid4().hex,
    ) -> None:
        if not rubric.strip():
            raise InvalidConfigError(f"task {task_id or '?'} has no rubric for the judge to score against")
        if budget_chars < MIN_BUDGET_CHARS:
            raise InvalidConfigError(f"budget_chars must be at least {MIN_BUDGET_CHARS}, got {budget_chars}")
        if not judge:
            raise InvalidConfigError("a judge needs its setting (policy, engine:NAME or a URL)")
        self._client = client
        self._log = log
        self._judge = _public_url(judge)
        self._prompt = prompt
        self._rubric = rubric
        self._task_id = task_id
        self._budget = budget_chars
        self._name = name
        self._new_call_id = new_call_id

    @property
    def name(self) -> str:
        return self._name

    def evaluate(self, state: PreservedState) -> EvaluationResult:
        workspace = Path(state.location)
        if not state.location or not workspace.is_dir():
            return EvaluationResult(
                None,
                EvaluationStatus.NOT_EVALUABLE,
                state.artifact_version,
                detail=f"no preserved workspace at {state.location!r}",
            )
        text = read_workspace(workspace, self._budget)
        messages = judge_messages(self._prompt, self._rubric, text)
        call_id = self._new_call_id()
        started = time.monotonic()
        answer = ChatAnswer("")
        try:
            answer = self._client.complete(messages, call_id=call_id)
            score, critique = parse_score(answer.text)
        except Exception as exc:  # a client is plug-in code: any failure is recorded, then retried
            error = _reason(exc)
            self._record(state, call_id, messages, text, answer, None, time.monotonic() - started, error)
            raise EvaluatorFailure(f"judge call {call_id}: {error}") from exc
        self._record(state, call_id, messages, text, answer, score, time.monotonic() - started, "")
        return EvaluationResult(
            score,
            EvaluationStatus.VALID,
            state.artifact_version,
            critique=critique,
            detail=f"judge {self._client.model} at {self._judge}: {score:g} (call {call_id})",
        )

    def _record(
        self,
        state: PreservedState,
        call_id: str,
        messages: Sequence[ChatMessage],
        text: WorkspaceText,
        answer: ChatAnswer,
        score: float | None,
        seconds: float,
        error: str,
    ) -> None:
        recorded = answer.text
        if len(recorded) > RECORDED_ANSWER_CHARS:
            recorded = (
                recorded[:RECORDED_ANSWER_CHARS] + f"\n[cut in the record: {len(answer.text)} characters]"
            )
        event = JudgeCalled(
            call_id=call_id,
            execution_id=state.execution_id,
            run_id=state.run_id,
            artifact_version=state.artifact_version,
            task_id=self._task_id,
            judge=self._judge,
            endpoint=self._client.endpoint,
            model=self._client.model,
            served_model=answer.model,
            messages_sha256=messages_digest(messages),
            rubric_sha256=_sha256(self._rubric),
            prompt_sha256=_sha256(self._prompt),
            files=tuple(f.record() for f in text.shown),
            files_not_shown=len(text.not_shown),
            binary_files=text.binary,
            answer=recorded,
            score=score,
            seconds=max(seconds, 0.0),
            prompt_tokens=_count(answer.prompt_tokens),
            completion_tokens=_count(answer.completion_tokens),
            error=error[:2000],
            side_execution=self._client.side_execution(call_id),
        )
        metadata = EventMetadata(run_id=state.run_id)
        self._log.append([NewEvent(event, judge_call_key(call_id), metadata=metadata)])


def _count(value: int | None) -> int | None:
    return value if value is not None and value >= 0 else None
