"""The node agent as its image runs it: how the contract tests and benchmarks start its process.

The image (`Dockerfile`) runs every Python process with `PYTHONOPTIMIZE=2`: docstrings and asserts
are left out of the loaded code, about 2 MiB of the agent's resident memory, and nothing of ours
or of our dependencies reads a docstring or relies on an assert at run time. The image also
compiles its bytecode at build time, so a start never compiles; `compile_like_the_image` does the
same for this interpreter, or the first measured start would include compiling and its memory.
A test keeps `IMAGE_ENVIRONMENT` and the Dockerfile's `ENV` in step.
"""

import compileall
import sysconfig
from pathlib import Path

IMAGE_ENVIRONMENT = {"PYTHONOPTIMIZE": "2"}
OPTIMIZATION_LEVEL = int(IMAGE_ENVIRONMENT["PYTHONOPTIMIZE"])
_REPOSITORY = Path(__file__).resolve().parents[2]


def compile_like_the_image() -> None:
    """Writes the optimised bytecode the agent's modules need next to their sources (quick once
    it exists). A directory that cannot be written is left alone: the agent then compiles those
    modules at start, as it always did."""
    paths = sysconfig.get_paths()
    directories = {paths["stdlib"], paths["purelib"], paths["platlib"], str(_REPOSITORY / "dra_driver")}
    for directory in sorted(directories):
        compileall.compile_dir(directory, quiet=2, optimize=OPTIMIZATION_LEVEL, workers=0)
