"""Why the agent cannot start, as the one line an operator reads, and which exit code it gets."""

from dra_driver.base.errors import OperatorFault, TransientFault


class StartupError(TransientFault, RuntimeError):
    """The agent cannot start; the message is the one line an operator needs."""


class SetupError(OperatorFault, RuntimeError):
    """The options describe a node that cannot be (an unknown simulated profile, a node config
    that does not fit the GPUs): the operator's input is wrong, so commands exit 2, not 1."""
