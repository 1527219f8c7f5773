"""GPU checks (`-m gpu`): skipped where torch sees no CUDA device; `tools/gpu-check.sh` runs them."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run tools/gpu-check.sh on a machine with one)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
