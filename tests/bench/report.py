"""Where a benchmark ran, and how its JSON report is printed and kept (docs/bench/ holds the
committed ones), so that every report says the same about its machine in the same words."""

import json
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def host() -> dict[str, str]:
    """The Python and the machine's architecture and usable cores: without them, numbers taken on
    another machine cannot be told apart from a regression."""
    return {
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
    }


def publish(results: Mapping[str, Any], output: Path | None) -> None:
    """Printed, and written to `output` too when one is given."""
    text = json.dumps(results, indent=2) + "\n"
    if output:
        output.write_text(text)
    print(text, end="")
