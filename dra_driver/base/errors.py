"""The one root of the driver's errors, and its three branches: whose fault a failure is.

Every exception class of dra_driver sits under exactly one branch (tests/unit/base/test_error_tree.py
walks them all), so the two places that answer for a failure choose by class instead of by a
list kept by hand:

- kubelet hears a `ClaimFault`'s message as it is, and "internal error during ..." for anything
  else (claims/calls.py, `failure_answer`);
- a command exits 2 with an `OperatorFault`'s one line, and 1 with any other `DriverError`'s
  (cli.py, `main`);
- a loop that retries (the claim status writer, the slice controller, the list-and-watch loop)
  retries a `TransientFault` and gives up on a `ClaimFault` or `OperatorFault`. The one
  exception, named in kube/errors.py (`KEPT_TRYING`): the loops that keep the agent's view of
  the API server for its lifetime retry the server's final answers too.

A family of errors whose branch depends on the case (kube's `ApiError`, by the answer's status)
sits on the root itself and is never an instance of its own: it makes the member of the branch
the case calls for, so `except` catches the family and `isinstance` asks the branch.

A class keeps a builtin base (ValueError, RuntimeError, OSError) as its second base where callers
or tests catch it by that one. A lower layer's error that the layer above gives a different
meaning (a decoding error of a claim is the claim's fault, of a node config the operator's) is
translated once, where it crosses into that layer, and keeps its branch otherwise.
"""


class DriverError(Exception):
    """Something dra_driver raises on purpose: a failure it can name, as opposed to a bug."""


class ClaimFault(DriverError):
    """What the claim asks for cannot be done (its identity, its config, a device it cannot
    have): the claim's author fixes it, so kubelet hears the message as it is, and every other
    claim is unaffected. Retrying the same claim gives the same answer."""


class OperatorFault(DriverError):
    """What the operator gave the driver is wrong: a flag, a variable, a config or node-config
    file, or the node's files they are in charge of (the driver root, the state directory). The
    message names the field or the flag; a command exits 2 with it, on one line, and no retry can
    help until a person changes the input."""


class TransientFault(DriverError):
    """Neither the claim nor the operator's input is wrong: the failure is one of the moment (the
    API server unavailable, a conflict, a timeout, a GPU or a socket that did not answer as
    expected, a stop under way). Another try (kubelet's retry, the next sync, the pod's restart) is
    the remedy; a command exits 1."""


def exit_code(error: DriverError) -> int:
    """What a command that fails with `error` exits with, chosen by its branch: 2 for the
    operator's invalid input (the message names the flag or field), 1 for any other failure."""
    return 2 if isinstance(error, OperatorFault) else 1
