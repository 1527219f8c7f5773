"""Rewards: evaluation outcomes of preserved workspaces into rewards (partial scoring,
pending, retry, exclusion, placeholders), the evaluators, and group-relative advantages.
No value function, no torch.
"""

from __future__ import annotations

from gyre_train.rewards.advantages import (
    AdvantageConfig,
    ExecutionReward,
    GroupAdvantages,
    RewardStatus,
    group_advantages,
)
from gyre_train.rewards.claims import CLAIM_DONE, CLAIM_UNKNOWN, EvaluationClaims
from gyre_train.rewards.evaluation import (
    Clock,
    EvaluationConfig,
    EvaluationOutcome,
    EvaluationResult,
    EvaluationRunner,
    Evaluator,
    MonotonicClock,
    PreservedState,
    check_result,
)
from gyre_train.rewards.evaluators import CallableEvaluator, CommandEvaluator, JUnitCounts, read_junit
from gyre_train.rewards.judge import (
    ChatAnswer,
    ChatClient,
    ChatMessage,
    JudgeEvaluator,
    OpenAIChatClient,
    ShownFile,
    WorkspaceText,
    judge_messages,
    messages_digest,
    parse_score,
    post_completion,
    read_workspace,
)
from gyre_train.rewards.judge_engines import (
    EngineJudgeClient,
    context_budget_chars,
    is_judge_run,
    judge_run,
    judge_slot,
)
from gyre_train.rewards.worker import EvaluatorWorker, WorkerConfig

__all__ = [
    "CLAIM_DONE",
    "CLAIM_UNKNOWN",
    "AdvantageConfig",
    "CallableEvaluator",
    "ChatAnswer",
    "ChatClient",
    "ChatMessage",
    "Clock",
    "CommandEvaluator",
    "EngineJudgeClient",
    "EvaluationClaims",
    "EvaluationConfig",
    "EvaluationOutcome",
    "EvaluationResult",
    "EvaluationRunner",
    "Evaluator",
    "EvaluatorWorker",
    "ExecutionReward",
    "GroupAdvantages",
    "JUnitCounts",
    "JudgeEvaluator",
    "MonotonicClock",
    "OpenAIChatClient",
    "PreservedState",
    "RewardStatus",
    "ShownFile",
    "WorkerConfig",
    "WorkspaceText",
    "check_result",
    "context_budget_chars",
    "group_advantages",
    "is_judge_run",
    "judge_messages",
    "judge_run",
    "judge_slot",
    "messages_digest",
    "parse_score",
    "post_completion",
    "read_junit",
    "read_workspace",
]
