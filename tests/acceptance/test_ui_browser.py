"""``gyre ui`` in headless Chromium on a finished short run: go run, step, execution, tree node,
and find on the pages the figures of the run's JSON report; then see an open page follow the log.

The run is `gyre run` with two steps of one group of two executions (an untrained policy), the
view is `gyre ui` as a user starts it, and Chromium is Debian's, driven by Selenium through
chromium-driver. Fails when either is missing; ``GYRE_TEST_SKIP_BROWSER=1`` skips it instead.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.acceptance.processes import gyre_process, gyre_run, live_run_env
from tests.real_servers import require

pytestmark = pytest.mark.timeout(600)

CONFIG = """
seed = 3
steps = 2
policy = "async"
phi = 1.0
mu = 1
B = 1
N = 2
cells = 1
rollout_engines = 1
engine_capacity = 4
harness = "builtin"
[model]
init = "random"
max_tokens = 16
[tasks]
train = 4
heldout = 2
budget_s = 150
"""
STEP_KEYS = ("policy_version", "mean_reward", "groups", "executions", "admitted_trajectories",
             "trainable_tokens", "loss", "grad_norm", "staleness_mean", "wall_s")  # fmt: skip


def _browser_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (the dev extra has it)"
    for binary in ("chromium", "chromedriver"):
        if shutil.which(binary) is None:
            return f"{binary} is not on PATH: apt-get install chromium chromium-driver"
    return None


@pytest.fixture(scope="module")
def finished_run(
    tmp_path_factory: pytest.TempPathFactory, acceptance_template: str
) -> Iterator[tuple[str, dict[str, Any]]]:
    from tests import pg

    require("browser", _browser_missing())
    folder = tmp_path_factory.mktemp("ui")
    (folder / "run.toml").write_text(CONFIG)
    with pg.database_from(acceptance_template) as url:
        gyre_run(folder, live_run_env(url, folder / "data"))
        yield url, json.loads((folder / "run.json").read_text())


@pytest.fixture(scope="module")
def ui(finished_run: tuple[str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url, _ = finished_run
    log = tmp_path_factory.mktemp("ui-log") / "ui.log"
    with gyre_process(["ui", "--database-url", url], log) as (base, _):
        yield base


@pytest.fixture(scope="module")
def browser(ui: str) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium") or "chromium"
    driver = webdriver.Chrome(
        options=options, service=Service(shutil.which("chromedriver") or "chromedriver")
    )
    try:
        yield driver
    finally:
        driver.quit()


def _figures(scope: Any) -> dict[str, tuple[Any, str]]:
    """The figures inside ``scope``: key -> (exact value, the text shown)."""
    from selenium.webdriver.common.by import By

    return {
        e.get_attribute("data-key"): (json.loads(e.get_attribute("data-value")), e.text)
        for e in scope.find_elements(By.CSS_SELECTOR, "span.fig")
    }


def _shown(value: Any) -> str:
    """How the view writes a figure (floats to 4 places)."""
    return "—" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)


def _check(figures: dict[str, tuple[Any, str]], expected: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        value, text = figures[key]
        assert value == expected[key], (key, value, expected[key])
        assert text == _shown(expected[key]), (key, text)


def test_run_step_execution_node_show_the_run_json_figures(
    browser: Any, ui: str, finished_run: tuple[str, dict[str, Any]]
) -> None:
    from selenium.webdriver.common.by import By

    _, summary = finished_run
    run_id = summary["run_id"]
    browser.get(ui + "/")
    browser.find_element(By.LINK_TEXT, run_id).click()

    # The run: every step's figures, the held-out pass rates, staleness and the cells' time.
    assert browser.find_element(By.TAG_NAME, "h1").text == f"Run {run_id}"
    rows = browser.find_elements(By.CSS_SELECTOR, "#steps tr[data-step]")
    assert (
        [int(r.get_attribute("data-step")) for r in rows] == [s["step"] for s in summary["steps"]] == [0, 1]
    )
    for row, step in zip(rows, summary["steps"], strict=True):
        _check(_figures(row), step, STEP_KEYS)
    held = {
        r.get_attribute("data-name"): _figures(r)
        for r in browser.find_elements(By.CSS_SELECTOR, "#held-out tr[data-name]")
    }
    assert held["heldout-before"]["pass_rate"][0] == summary["eval"]["pass_rate_before"]
    assert held["heldout-after"]["pass_rate"][0] == summary["eval"]["pass_rate_after"]
    _check(
        _figures(browser.find_element(By.ID, "staleness")),
        summary["staleness"],
        ("measured_mean", "expected_mean", "groups"),
    )
    page = _figures(browser.find_element(By.ID, "main"))
    _check(page, summary["cell_time"], ("trainer_useful_fraction", "engine_generating_fraction"))
    _check(page, summary, ("transitions",))
    assert len(browser.find_elements(By.CSS_SELECTOR, "#reward-chart circle")) == 2

    # A step: its figures, and a reward that links to the evaluation it came from.
    rows[0].find_element(By.CSS_SELECTOR, "a.step").click()
    assert browser.find_element(By.TAG_NAME, "h1").text == f"Step 0 of {run_id}"
    _check(_figures(browser.find_element(By.ID, "step-figures")), summary["steps"][0],
           ("policy_version", "mean_reward", "admitted_trajectories", "trainable_tokens", "loss", "staleness_mean"))  # fmt: skip
    rewards = browser.find_elements(By.CSS_SELECTOR, "a.reward")
    assert len(rewards) == summary["steps"][0]["executions"] == 2
    shown = [_figures(a)["reward"][0] for a in rewards]
    assert sum(shown) / len(shown) == pytest.approx(summary["steps"][0]["mean_reward"])
    evaluation = rewards[0].get_attribute("href").split("#evaluation-")[1]

    # An execution: its tree drawn, the evaluation the reward came from, the admitted trajectories.
    browser.find_elements(By.CSS_SELECTOR, "a.execution")[0].click()
    assert browser.find_element(By.TAG_NAME, "h1").text.startswith("Execution ")
    evaluated = browser.find_element(By.ID, f"evaluation-{evaluation}")
    assert _figures(evaluated)["score"][0] == shown[0]
    nodes = browser.find_elements(By.CSS_SELECTOR, "svg.tree a.node")
    assert len(nodes) == _figures(browser.find_element(By.ID, "tree-stats"))["tree_nodes"][0] > 0
    assert browser.find_elements(By.CSS_SELECTOR, "#admitted tr td")  # step 0 trained on it

    # A tree node: its messages, every token with its provenance.
    browser.find_elements(By.CSS_SELECTOR, "a.leaf")[0].click()
    assert browser.find_element(By.TAG_NAME, "h1").text.startswith("Node ")
    tokens = browser.find_elements(By.CSS_SELECTOR, "span.tok")
    assert tokens and {t.get_attribute("data-provenance") for t in tokens} >= {"sampled"}

    # A page at the head follows the log: a new dispatch of the run appears without a reload.
    from gyre_store import PostgresEventLog, StoreConfig
    from tests.unit.train.runs import dispatch_group

    browser.get(f"{ui}/runs/{run_id}")
    before = int(browser.find_element(By.ID, "main").get_attribute("data-position"))
    points = len(browser.find_elements(By.CSS_SELECTOR, "#waterlevel-chart circle"))
    with PostgresEventLog(StoreConfig(finished_run[0])) as log:
        dispatch_group(log, run_id, f"{run_id}/ui-late", [f"{run_id}/ui-late-e0"], policy_version=2)
    deadline = time.monotonic() + 30
    while int(browser.find_element(By.ID, "main").get_attribute("data-position")) == before:
        assert time.monotonic() < deadline, "the page did not follow the log"
        time.sleep(0.5)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#waterlevel-chart circle")) == points + 1
