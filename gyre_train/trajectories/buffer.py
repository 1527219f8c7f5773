"""The trajectory buffer on the event store: ready rollout groups into ReadyGroup rows.

``StoreGroupSource`` is the ``ReadyGroupSource`` the stream packing buffer pulls from. It lists
ready groups (oldest policy version first is the packer's choice), and ``take`` turns one into
training input: group-relative advantages from the recorded outcomes, admission on each valid
execution's stored trajectory tree, token rows, and a ``group.consumed`` event that ties the
rewards to the training step. It keeps no state of its own beyond the current step number.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from gyre_store import (
    BatchGroupClaimed,
    EvaluationsProjection,
    EventLog,
    GroupConsumed,
    GroupReady,
    GroupsProjection,
    GroupStatus,
    GyreStoreError,
    NewEvent,
    NoTrajectoryTree,
    OutcomeStatus,
    ProjectionStore,
    StreamId,
    catch_up,
    consumption_key,
)
from gyre_store.catalog import FinishReason
from gyre_store.log import EventMetadata
from gyre_store.projections import Row
from gyre_store.trees import TreeProjection, TreeTopology
from gyre_train.exceptions import GroupNotTrainableError, UnknownGroupError
from gyre_train.rewards import AdvantageConfig, ExecutionReward, RewardStatus, group_advantages
from gyre_train.trajectories.admission import AdmissionConfig, admission_rng, admit
from gyre_train.trajectories.packing import GroupTicket, ReadyGroup
from gyre_train.trajectories.rows import ExecutionRows, TokenRow, materialize_rows
from gyre_train.trajectories.stored import admitted_tokens, stored_topology

log = logging.getLogger(__name__)

_STATUS = {
    OutcomeStatus.VALID: RewardStatus.VALID,
    OutcomeStatus.PLACEHOLDER: RewardStatus.PLACEHOLDER,
    OutcomeStatus.EXCLUDED: RewardStatus.EXCLUDED,
}


@dataclass(frozen=True, slots=True)
class GroupSourceConfig:
    """Admission and advantage settings, the run seed for admission draws, the trainer's name,
    and the run whose groups it trains on (None: any run's, as a store of one run holds)."""

    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    advantages: AdvantageConfig = field(default_factory=AdvantageConfig)
    seed: int = 0
    trainer: str = ""
    run_id: str | None = None


def execution_rows(
    store: ProjectionStore, execution_id: str, config: GroupSourceConfig
) -> tuple[TokenRow, ...]:
    """Admit and materialize one execution's trajectories; none when it recorded no model call.

    Only an absent tree gives no rows. Any other store error (an outage while the tree loads)
    propagates, logged here: the group is then neither built nor consumed, and waits."""
    try:
        # Admission reads the topology row only; tokens come for the admitted paths alone.
        stored = stored_topology(TreeTopology.load(store, execution_id))
        admission = admit(stored.tree, config.admission, admission_rng(config.seed, execution_id))
        tokens = admitted_tokens(store, stored, admission)
    except NoTrajectoryTree:
        return ()  # no trajectory tree: L_i = 0, it still counts in B*N
    except GyreStoreError:
        log.exception("cannot load the trajectory tree of execution %s; its group waits", execution_id)
        raise
    return materialize_rows(execution_id, stored.tree, tokens, admission)


def _one(rows: list[Row]) -> Row | None:
    return rows[0] if rows else None


class StoreGroupSource:
    """Ready groups read from projections kept in ``store``; ``take`` records the consumption.

    With ``refresh`` (default) every ``ready_groups`` call first catches the tree, evaluation and
    group projections up with the log; pass False when a projector maintains them elsewhere.
    """

    def __init__(
        self,
        log: EventLog,
        store: ProjectionStore,
        config: GroupSourceConfig | None = None,
        *,
        step: int = 0,
        refresh: bool = True,
    ) -> None:
        self._log = log
        self._store = store
        self._config = config or GroupSourceConfig()
        self._refresh = refresh
        self.step = step  # the training step that the next `take` feeds

    def ready_groups(self) -> Sequence[GroupTicket]:
        if self._refresh:
            # One cut of the log for all three: caught up one after another to their own heads,
            # a reward appended in between would make a group ready before its reward row exists.
            head = self._log.head()
            for projection in (TreeProjection(), EvaluationsProjection(), GroupsProjection()):
                catch_up(self._log, self._store, projection, until=head)
        run = self._config.run_id
        return tuple(
            GroupTicket(row["group_id"], int(row["policy_version"]), int(row["ready_position"]))
            for row in self._store.select("gyre_groups", "status", GroupStatus.READY)
            if run is None or row["run_id"] == run
        )

    def build(self, group_id: str) -> ReadyGroup:
        """The group as training input, without consuming it. Raises UnknownGroupError or
        GroupNotTrainableError when it is not ready or its recorded outcomes do not add up."""
        group = _one(self._store.select("gyre_groups", "group_id", group_id))
        if group is None or group["status"] not in (GroupStatus.READY, GroupStatus.CONSUMED):
            state = "unknown" if group is None else group["status"]
            raise UnknownGroupError(f"group {group_id} is {state}, not ready")
        members = sorted(
            (
                m
                for m in self._store.select("gyre_group_members", "group_id", group_id)
                if m["finish_reason"] != FinishReason.SURPLUS.value
            ),
            key=lambda m: int(m["dispatched_position"]),
        )
        if len(members) != int(group["size"]):
            raise GroupNotTrainableError(f"group {group_id} has {len(members)} members, N={group['size']}")
        rewards = []
        for member in members:
            outcome = _one(self._store.select("gyre_rewards", "execution_id", member["execution_id"]))
            status = None if outcome is None else _STATUS.get(outcome["status"])
            if outcome is None or status is None:
                detail = "no outcome" if outcome is None else f"{outcome['status']}: {outcome['error']}"
                raise GroupNotTrainableError(f"execution {member['execution_id']} of {group_id}: {detail}")
            reward = 0.0 if outcome["reward"] is None else float(outcome["reward"])
            rewards.append(ExecutionReward(member["execution_id"], reward, status))
        advantages = group_advantages(rewards, self._config.advantages)
        executions = []
        for member_reward, advantage in zip(rewards, advantages.advantages, strict=True):
            rows: tuple[TokenRow, ...] = ()
            if member_reward.status is RewardStatus.VALID:
                rows = execution_rows(self._store, member_reward.execution_id, self._config)
            executions.append(ExecutionRows(member_reward.execution_id, advantage, rows))
        return ReadyGroup(group_id, int(group["policy_version"]), tuple(executions))

    def take(self, group_id: str) -> ReadyGroup:
        """Build the group and record that step ``self.step`` consumed it (once per group).

        The same append records the facts the scheduler's decision core counts: the group is
        ready (``group.ready``, a no-op if the evaluators announced it already) and the packing
        buffer claimed it for the step (``batch.group_claimed``). Raises UnknownGroupError for a
        group that is not ready or was consumed already (``retake`` resumes a step's own)."""
        group = _one(self._store.select("gyre_groups", "group_id", group_id))
        if group is None or group["status"] != GroupStatus.READY:
            state = "unknown" if group is None else group["status"]
            raise UnknownGroupError(f"group {group_id} is {state}, not ready")
        ready = self.build(group_id)
        if self._record_take(ready, str(group["run_id"])):
            raise UnknownGroupError(f"group {group_id} was already consumed by another trainer")
        return ready

    def retake(self, group_id: str) -> ReadyGroup:
        """A group this trainer's current step consumed before a restart, built again (its
        records stand as they are). Raises UnknownGroupError for any other group."""
        if self._consumed_by(group_id) != (self.step, self._config.trainer):
            raise UnknownGroupError(f"group {group_id} was not consumed by step {self.step} of this trainer")
        return self.build(group_id)

    def _record_take(self, ready: ReadyGroup, run_id: str) -> bool:
        """Append the take's facts; True when the group had been consumed already."""
        group_id = ready.group_id
        consumed = GroupConsumed(
            group_id=group_id,
            run_id=run_id,
            step=self.step,
            trainer=self._config.trainer,
            trajectories=sum(len(e.rows) for e in ready.executions),
            target_tokens=sum(r.target_count for e in ready.executions for r in e.rows),
        )
        meta = EventMetadata(run_id=run_id)
        results = self._log.append(
            [
                NewEvent(
                    GroupReady(group_id=group_id, run_id=run_id), f"group.ready:{group_id}", metadata=meta
                ),
                NewEvent(consumed, idempotency_key=consumption_key(group_id), metadata=meta),
                NewEvent(
                    BatchGroupClaimed(run_id=run_id, step=self.step, group_id=group_id),
                    f"batch.claimed:{group_id}",
                    metadata=meta,
                ),
            ]
        )
        return results[1].duplicate

    def consumed_by_step(self, step: int) -> tuple[str, ...]:
        """The groups of this source's run recorded as consumed by ``step``, in the order they
        were taken (a trainer resuming a step it had begun takes these again, first). Another
        run's step of the same number, in the same database, is not this trainer's."""
        run = self._config.run_id
        return tuple(
            r.event.group_id
            for r in self._log.read(0, types=["group.consumed"], limit=1_000_000)
            if isinstance(r.event, GroupConsumed)
            and r.event.step == step
            and r.event.trainer == self._config.trainer
            and (run is None or r.event.run_id == run)
        )

    def _consumed_by(self, group_id: str) -> tuple[int, str] | None:
        for recorded in self._log.read_stream(StreamId("group", group_id)):
            if isinstance(recorded.event, GroupConsumed):
                return recorded.event.step, recorded.event.trainer
        return None
