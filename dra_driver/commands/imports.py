"""Importing a command's code without full collections, and frozen after.

`dra-driver node` imports about 540 modules before it can answer kubelet. Their objects (classes,
functions, constants) live as long as the process, yet the cyclic garbage collector walks them
while they are created: on the agent's start, when it still imported 700 modules, about 120 young
collections, a dozen of the middle generation and one full one, 60-95 ms of CPU, a tenth of the
imports' (issue 31). The full collection, a third to a half of that, walks everything imported so
far and finds next to nothing; it is held off while importing, and what was imported is frozen
after (moved out of the collected generations, as `gc.freeze` does), so no later full collection
walks it either. Young collections keep running: pausing them too saved the rest, but left the
imports' short-lived garbage in place until the end, and the agent 0.5 MiB larger for good.
"""

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# A threshold for full collections that importing never reaches (it counts collections of the
# middle generation: a dozen while the agent imports).
_NEVER = 2**30


@contextmanager
def imports_frozen() -> Iterator[None]:
    """The block runs without full collections; on leaving, however it is left (`--help` and
    argparse's errors leave by SystemExit), everything alive is frozen and the collector's
    thresholds are what they were."""
    young, middle, full = gc.get_threshold()
    gc.set_threshold(young, middle, _NEVER)
    try:
        yield
    finally:
        gc.freeze()
        gc.set_threshold(young, middle, full)
