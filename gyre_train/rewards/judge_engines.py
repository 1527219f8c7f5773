"""A judge on the run's own engines: each call an execution of the side run ``<run>~judge``.

``[eval] judge = "policy"`` asks the policy under training, ``"engine:NAME"`` one named engine
of the run. Either way the call goes through the run's proxy, like a harness's: the client
issues the call its own API key, records ``execution.started`` in the side run with the slot
the proxy routes it by (``pool``, or ``engine:<name>`` for one engine and no other), posts the
chat completion, then records ``execution.finished`` and revokes the key. So the proxy
tokenizes, routes and records the judge's tokens as model calls (TITO records) of that
execution, and an auditor joins ``judge.called.side_execution`` to them. The side run is never
dispatched into a rollout group, so nothing in it is trained on, counted in the run's groups or
scheduled; evaluator workers do not evaluate its executions.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Sequence
from types import TracebackType

import httpx

from gyre_store import (
    ApiKeyIssued,
    ApiKeyRevoked,
    EventLog,
    EventMetadata,
    ExecutionFinished,
    ExecutionStarted,
    FinishReason,
    NewEvent,
)
from gyre_store.log import base_run
from gyre_train.exceptions import EvaluatorFailure, InvalidConfigError
from gyre_train.rewards.judge import MIN_BUDGET_CHARS, SYSTEM_PROMPT, ChatAnswer, ChatMessage, post_completion

JUDGE_SIDE_RUN = "judge"  # the side run's own name: ``<run>~judge``
JUDGE_LAUNCHER = "judge"  # ``execution.started.launcher`` of a judge's call
JUDGE_HARNESS = "judge"  # ``execution.key_issued.harness`` of a judge's call
POLICY_SLOT = "pool"  # the run's rollout engines: the pool first, then any of the run's
PINNED_SLOT = "engine:"  # one named engine: the proxy's routing reads the same prefix
PROXY_MODEL = "gyre-policy"  # the model name sent to the proxy (which serves the one policy)


def judge_run(run_id: str) -> str:
    """The side run holding the judge's calls for run ``run_id`` (or one of its side runs)."""
    return f"{base_run(run_id)}~{JUDGE_SIDE_RUN}"


def is_judge_run(run_id: str) -> bool:
    """Whether ``run_id`` is a run's judge side run (its executions are judge calls)."""
    return run_id.endswith(f"~{JUDGE_SIDE_RUN}") and judge_run(run_id) == run_id


def judge_slot(judge: str, engine_name: Callable[[str], str]) -> str:
    """The routing slot of a judge setting: ``policy`` is the pool; ``engine:NAME`` pins the
    engine ``engine_name(NAME)`` (its name in the log). Raises InvalidConfigError otherwise."""
    if judge == "policy":
        return POLICY_SLOT
    name = judge.removeprefix(PINNED_SLOT).strip()
    if not judge.startswith(PINNED_SLOT) or not name:
        raise InvalidConfigError(f'a judge on the run\'s engines is "policy" or "engine:NAME", got {judge!r}')
    return PINNED_SLOT + engine_name(name)


class EngineJudgeClient:
    """A ChatClient whose calls are executions of ``<run>~judge`` through the run's proxy.

    ``proxy_url()`` is the proxy's base URL now (None before it has registered: that call
    fails and is retried); ``slot`` is from ``judge_slot``. Each call appends two events before
    it posts (its key, its start) and two after (its end, the key revoked), whether it was
    answered or not; a store that refuses them fails the call.
    """

    def __init__(
        self,
        log: EventLog,
        run_id: str,
        *,
        slot: str,
        proxy_url: Callable[[], str | None],
        timeout_s: float = 300.0,
        max_tokens: int = 4096,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if slot != POLICY_SLOT and not (slot.startswith(PINNED_SLOT) and slot != PINNED_SLOT):
            raise InvalidConfigError(f"a judge's slot is {POLICY_SLOT!r} or 'engine:<name>', got {slot!r}")
        if timeout_s <= 0 or max_tokens < 1:
            raise InvalidConfigError(
                f"timeout_s must be positive and max_tokens >= 1 ({timeout_s}, {max_tokens})"
            )
        self._log = log
        self._side = judge_run(run_id)
        self._slot = slot
        self._proxy_url = proxy_url
        self._max_tokens = max_tokens
        self._endpoint = ""
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s), transport=transport)

    @property
    def model(self) -> str:
        return PROXY_MODEL

    @property
    def endpoint(self) -> str:
        """Where the last call went ("" before the first)."""
        return self._endpoint

    @property
    def slot(self) -> str:
        return self._slot

    def side_execution(self, call_id: str) -> str:
        return f"{self._side}/{call_id}"

    def complete(self, messages: Sequence[ChatMessage], *, call_id: str = "") -> ChatAnswer:
        if not call_id:
            raise InvalidConfigError(
                "a judge call on the run's engines needs its call id (its execution's name)"
            )
        base = self._proxy_url()
        url = self._endpoint = f"{base.rstrip('/')}/v1/chat/completions" if base else ""
        if not url:
            raise EvaluatorFailure(
                f"the proxy of run {base_run(self._side)} has not registered its address yet"
            )
        execution = self.side_execution(call_id)
        api_key = "gyre-" + secrets.token_urlsafe(24)
        key_hash = hashlib.sha256(api_key.encode()).hexdigest()  # as the proxy's key store reads it
        meta = EventMetadata(run_id=self._side)
        issued = ApiKeyIssued(
            key_hash=key_hash, execution_id=execution, run_id=self._side, harness=JUDGE_HARNESS
        )
        started = ExecutionStarted(
            execution_id=execution, run_id=self._side, engine=self._slot, launcher=JUDGE_LAUNCHER
        )
        self._log.append(
            [NewEvent(issued, expected_version=0), NewEvent(started, f"start:{execution}", metadata=meta)]
        )
        reason, detail = FinishReason.FAILED, ""
        try:
            answer = post_completion(
                self._http, url, PROXY_MODEL, messages, max_tokens=self._max_tokens, api_key=api_key
            )
            reason = FinishReason.COMPLETED
            return answer
        except EvaluatorFailure as exc:
            detail = str(exc)[:2000]
            raise
        finally:
            finished = ExecutionFinished(
                execution_id=execution, run_id=self._side, reason=reason, detail=detail
            )
            self._log.append(
                [
                    NewEvent(finished, f"finish:{execution}", metadata=meta),
                    NewEvent(ApiKeyRevoked(key_hash=key_hash, reason="judge call done")),
                ]
            )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EngineJudgeClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


TEMPLATE_ALLOWANCE = 512  # tokens for the chat template and the judge's own framing of the parts


def context_budget_chars(max_context: int, max_tokens: int, prompt: str, rubric: str) -> int:
    """The workspace characters a judge on the run's engines may show so that its call fits a
    context of ``max_context`` tokens and leaves ``max_tokens`` to answer (at least
    ``MIN_BUDGET_CHARS``). A token of ASCII text holds at least one character, so counting
    characters as tokens (the system message, prompt and rubric too) never under-counts it."""
    fixed = len(SYSTEM_PROMPT) + len(prompt) + len(rubric) + TEMPLATE_ALLOWANCE
    return max(MIN_BUDGET_CHARS, max_context - max_tokens - fixed)
