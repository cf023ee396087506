"""imports_frozen: no full collection inside; thresholds restored and the block's objects frozen after."""

import gc
from collections.abc import Iterator

import pytest

from dra_driver.commands.imports import imports_frozen


@pytest.fixture(autouse=True)
def _collector_as_it_was() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_no_full_collection_inside_and_the_thresholds_restored_even_when_left_by_system_exit() -> None:
    gc.set_threshold(700, 10, 10)
    full: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    gc.callbacks.append(count)
    try:
        with pytest.raises(SystemExit), imports_frozen():
            for _ in range(200):  # 200 middle-generation collections: 20 full ones without the pause
                gc.collect(1)
            raise SystemExit(0)
    finally:
        gc.callbacks.remove(count)
    assert full == []
    assert gc.get_threshold() == (700, 10, 10)


def test_what_the_block_made_is_frozen() -> None:
    gc.unfreeze()
    with imports_frozen():
        made: list[list[int]] = [[] for _ in range(1000)]
    assert gc.get_freeze_count() >= len(made)
