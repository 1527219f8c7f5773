"""Errors of streaming training (claims, cells, weight transport, publication).

GyreTrainError (gyre_train.exceptions)
 ├── ClaimQueueError           the Redis claim queue refused an operation
 ├── ContributionError         the micro-steps reduced into a batch are not each there exactly once
 ├── WeightTransportError      a weight snapshot could not be exposed or pulled
 ├── PublicationError          an engine did not take the published weights
 ├── CellFailedError           a cell process failed or did not finish in time
 └── ProducerTimeoutError      a batch's groups did not become ready in time
"""

from __future__ import annotations

from gyre_train.exceptions import GyreTrainError


class ClaimQueueError(GyreTrainError):
    """The Redis claim queue refused an operation."""


class ContributionError(GyreTrainError):
    """The micro-steps reduced into a batch are not each there exactly once."""


class WeightTransportError(GyreTrainError):
    """A weight snapshot could not be exposed or pulled."""


class PublicationError(GyreTrainError):
    """An engine did not take the published weights."""


class CellFailedError(GyreTrainError):
    """A cell process failed or did not finish in time."""


class ProducerTimeoutError(GyreTrainError):
    """A batch's groups did not become ready in time."""
