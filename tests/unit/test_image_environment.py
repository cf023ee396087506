"""The environment the tests and benchmarks run the agent in is the image's."""

import re
from pathlib import Path

from tests.support.image import IMAGE_ENVIRONMENT, OPTIMIZATION_LEVEL

DOCKERFILE = Path(__file__).resolve().parents[2] / "Dockerfile"


def _final_stage() -> str:
    return DOCKERFILE.read_text(encoding="utf-8").rpartition("\nFROM ")[2]


def test_the_image_sets_what_the_tests_run_the_agent_with() -> None:
    stage = _final_stage()
    set_there = dict(re.findall(r"^ENV (\w+)=(\S+)$", stage, flags=re.MULTILINE))
    assert set_there == IMAGE_ENVIRONMENT


def test_the_image_compiles_its_bytecode_at_the_level_it_runs() -> None:
    compiles = re.findall(r"^RUN python -m compileall .*-o (\d)", _final_stage(), flags=re.MULTILINE)
    assert compiles == [str(OPTIMIZATION_LEVEL)]
