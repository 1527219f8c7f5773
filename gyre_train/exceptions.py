"""Errors raised by gyre_train: one root, one subclass per kind of failure.

GyreTrainError
 ├── InvalidTreeError          the admission tree or its node tokens are inconsistent
 ├── InvalidLeafError          a candidate leaf names a node the tree does not hold
 ├── InvalidConfigError        a configuration value is out of range
 ├── InvalidRewardsError       a group's rewards cannot produce advantages
 ├── InvalidLossInputError     loss tensors disagree in shape, dtype or content
 ├── InvalidRowsError          materialized token rows are inconsistent
 ├── RowTooLongError           a token row does not fit in one micro-step
 ├── BatchClosedError          groups or micro-steps were asked of a closed batch
 ├── UnknownGroupError         a group id is not ready in the source
 │   └── GroupNotTrainableError a group cannot become training input (overfull, rejected outcome)
 ├── UnknownExecutionError     an evaluation names an execution that was never dispatched
 ├── ExecutionNotClosedError   an execution was asked for its outcome before it closed
 ├── InvalidEvaluationError    an evaluator's result is malformed, out of range or names an unknown artifact
 ├── EvaluatorFailure          an evaluator could not evaluate the preserved state (retryable)
 │  tasks and sandboxes (gyre_train.tasks, gyre_train.sandbox):
 ├── TaskSourceError           a task source (Harbor directory, JSONL file, builtin family) is malformed
 ├── SandboxError              a sandbox kind cannot run a command or a task as asked
 │  streaming training (gyre_train.cells):
 ├── ClaimQueueError           the claim queue refused an operation
 ├── ContributionError         the micro-steps reduced into a batch are not each there exactly once
 ├── WeightTransportError      a weight snapshot could not be exposed or pulled
 ├── PublicationError          an engine did not take the published weights
 ├── CellFailedError           a cell process failed or did not finish in time
 ├── EngineServerDied          a rollout engine's server process exited while it was serving
 └── ProducerTimeoutError      a batch's groups did not become ready in time
"""

from __future__ import annotations

from gyre_store.catalog import EvaluationErrorKind


class GyreTrainError(Exception):
    """A training operation failed."""

    def __init__(self, detail: str = "") -> None:
        doc = (type(self).__doc__ or "").strip()
        super().__init__(f"{doc}: {detail}" if detail else doc)


class InvalidTreeError(GyreTrainError):
    """The admission tree or its node tokens are inconsistent."""


class InvalidLeafError(GyreTrainError):
    """A candidate leaf names a node the tree does not hold."""


class InvalidConfigError(GyreTrainError):
    """A configuration value is out of range."""


class InvalidRewardsError(GyreTrainError):
    """A group's rewards cannot produce advantages."""


class InvalidLossInputError(GyreTrainError):
    """Loss tensors disagree in shape, dtype or content."""


class InvalidRowsError(GyreTrainError):
    """Materialized token rows are inconsistent."""


class RowTooLongError(GyreTrainError):
    """A token row does not fit in one micro-step; raise PackingConfig.token_budget."""


class BatchClosedError(GyreTrainError):
    """Groups or micro-steps were asked of a batch whose stream is closed."""


class UnknownGroupError(GyreTrainError):
    """A group id is not ready in the source."""


class GroupNotTrainableError(UnknownGroupError):
    """A group cannot become training input."""


class UnknownExecutionError(GyreTrainError):
    """No execution of that id was ever dispatched."""


class ExecutionNotClosedError(GyreTrainError):
    """The execution has not closed yet; evaluate it after it finishes."""


class InvalidEvaluationError(GyreTrainError):
    """The evaluator's result cannot be a reward."""

    def __init__(self, kind: EvaluationErrorKind, detail: str = "") -> None:
        super().__init__(f"{kind.value}: {detail}" if detail else kind.value)
        self.kind = kind


class EvaluatorFailure(GyreTrainError):
    """The evaluator could not evaluate the preserved state; the evaluation stays pending."""


class TaskSourceError(GyreTrainError):
    """The task source is malformed"""


class SandboxError(GyreTrainError):
    """The sandbox cannot run this"""


class ClaimQueueError(GyreTrainError):
    """The claim queue refused an operation."""


class ContributionError(GyreTrainError):
    """The micro-steps reduced into a batch are not each there exactly once."""


class WeightTransportError(GyreTrainError):
    """A weight snapshot could not be exposed or pulled."""


class PublicationError(GyreTrainError):
    """An engine did not take the published weights."""


class CellFailedError(GyreTrainError):
    """A cell process failed or did not finish in time."""


class EngineServerDied(GyreTrainError):
    """A rollout engine's server process exited while it was serving."""


class ProducerTimeoutError(GyreTrainError):
    """A batch's groups did not become ready in time."""
