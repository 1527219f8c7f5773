"""``gyre run --metrics wandb``: each step's scalars logged to Weights & Biases as it lands, once,
offline unless W&B is configured, read back from the run file the real ``wandb`` wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre_store import StepFigures
from gyre_tools.run_steps import WandbSteps, metric_sinks, wandb_mode, wandb_run_id
from tests.wandb_files import history, whole_records


def figures(step: int, reward: float | None, loss: float | None = 0.25) -> StepFigures:
    return StepFigures(
        step=step, policy_version=step + 1, mean_reward=reward, groups=2, executions=4,
        admitted_trajectories=5, trainable_tokens=900, loss=loss, grad_norm=1.5, wall_s=12.5,
        staleness_mean=0.5,
    )  # fmt: skip


def test_metrics_takes_tensorboard_wandb_both_or_none() -> None:
    assert metric_sinks("tensorboard") == {"tensorboard"}
    assert metric_sinks("tensorboard, wandb") == {"tensorboard", "wandb"}
    assert metric_sinks("none") == frozenset() == metric_sinks("")
    with pytest.raises(ValueError, match=r"unknown \['mlflow'\]; use none or any of tensorboard, wandb"):
        metric_sinks("wandb,mlflow")


def test_wandb_is_online_when_configured_and_offline_otherwise() -> None:
    assert wandb_mode({}) == "offline"
    assert wandb_mode({"WANDB_API_KEY": "k"}) == "online"
    assert wandb_mode({"WANDB_API_KEY": "k", "WANDB_MODE": "disabled"}) == "disabled"
    assert wandb_run_id("demo/run:1 #2") == "demo-run-1--2"


def test_each_step_is_logged_once_as_it_lands_and_the_run_summary_at_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    with WandbSteps(tmp_path, "run-7", {"seed": 3}) as steps:
        assert steps.mode == "offline"
        steps.write(figures(0, 0.25))
        steps.write(figures(1, None, loss=None))  # a step without reward or loss: the rest only
        steps.write(figures(1, 0.9))  # seen again (the report phase): not logged twice
        steps.write(figures(2, 0.75))
        steps.summarize({"eval/pass_rate_after": 0.625, "reward/gain": None})
    [run_file] = list((tmp_path / "wandb").glob("offline-run-*-run-7/run-run-7.wandb"))
    records = whole_records(run_file)
    logged = history(records)
    assert sorted(logged) == [0, 1, 2] and steps.written == {0, 1, 2}
    assert logged[0] == {
        "reward/mean": "0.25", "staleness/mean": "0.5", "train/loss": "0.25", "train/grad_norm": "1.5",
        "admission/trajectories": "5", "admission/trainable_tokens": "900", "time/step_s": "12.5",
    }  # fmt: skip
    assert "reward/mean" not in logged[1] and "train/loss" not in logged[1]
    assert logged[2]["reward/mean"] == "0.75"
    summary = {
        i.key: i.value_json
        for r in records
        if r.WhichOneof("record_type") == "summary"
        for i in r.summary.update
    }
    assert summary["eval/pass_rate_after"] == "0.625" and "reward/gain" not in summary
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.run_id, run.display_name, run.project) == ("run-7", "run-7", "gyre")
