"""Every exception class of dra_driver is under the one root and exactly one of its branches, so
kubelet's answer and a command's exit code, which are chosen by branch, cover every error: a new
class left outside the tree fails here, not silently in front of kubelet or a script."""

import importlib
import inspect
import pkgutil
from types import ModuleType

import dra_driver
from dra_driver.base.errors import ClaimFault, DriverError, OperatorFault, TransientFault
from dra_driver.kube.errors import ApiError, FinalApiError, TransientApiError

BRANCHES = (ClaimFault, OperatorFault, TransientFault)
ROOT_MODULE = "dra_driver.base.errors"
# On the root, under no branch: each is made as one of its members, each under one branch.
FAMILIES = (ApiError,)


def _modules() -> list[ModuleType]:
    """Every module of the package; __main__ alone is left out, as importing it runs the CLI."""
    names = [info.name for info in pkgutil.walk_packages(dra_driver.__path__, "dra_driver.")]
    return [dra_driver] + [importlib.import_module(name) for name in names if not name.endswith(".__main__")]


def _error_classes() -> list[type[BaseException]]:
    return [
        value
        for module in _modules()
        for value in vars(module).values()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == module.__name__
        and module.__name__ != ROOT_MODULE
    ]


def test_every_error_class_is_under_the_root_and_exactly_one_branch() -> None:
    classes = _error_classes()
    # The walk finds the tree (47 classes when it was planted), not an empty list that passes.
    assert len(classes) >= 45, classes
    misplaced = {
        f"{error.__module__}.{error.__qualname__}": [
            branch.__name__ for branch in BRANCHES if issubclass(error, branch)
        ]
        for error in classes
        if error not in FAMILIES
        and (not issubclass(error, DriverError) or sum(issubclass(error, branch) for branch in BRANCHES) != 1)
    }
    assert misplaced == {}


def test_the_root_has_exactly_the_three_branches_and_the_families() -> None:
    assert set(DriverError.__subclasses__()) == set(BRANCHES) | set(FAMILIES)
    assert all(branch.__bases__ == (DriverError,) for branch in BRANCHES)


def test_a_family_is_made_as_one_of_its_members_never_as_itself() -> None:
    """ApiError(...) with a status the same request may pass is transient; with a final one it is
    the operator's (kube/errors.py, FINAL_STATUSES)."""
    made = {
        status: ApiError("GET thing", status, "", "said so") for status in (0, 401, 409, 410, 429, 500, 503)
    }
    made |= {
        status: ApiError("GET thing", status, "", "said so") for status in (400, 403, 404, 405, 415, 422)
    }
    assert all(type(error) is not ApiError for error in made.values())
    assert {status for status, error in made.items() if isinstance(error, TransientFault)} == {
        0,
        401,
        409,
        410,
        429,
        500,
        503,
    }
    assert all(isinstance(made[status], FinalApiError) for status in (400, 403, 404, 405, 415, 422))
    assert all(isinstance(error, TransientApiError | FinalApiError) for error in made.values())


def test_classes_that_callers_catch_by_a_builtin_keep_it() -> None:
    """`except ValueError` around a decoding, `except RuntimeError` around a start: still caught."""
    from dra_driver.agent.errors import SetupError, StartupError  # noqa: PLC0415
    from dra_driver.base.strict_decode import DecodeError  # noqa: PLC0415
    from dra_driver.claims.identity import InvalidClaimIdentity  # noqa: PLC0415
    from dra_driver.config.option_values import SettingsError  # noqa: PLC0415
    from dra_driver.kube.http_wire import HttpProtocolError  # noqa: PLC0415

    assert all(issubclass(error, ValueError) for error in (DecodeError, InvalidClaimIdentity, SettingsError))
    assert issubclass(HttpProtocolError, ValueError)  # one of kube/errors.py's TRANSPORT_ERRORS
    assert issubclass(StartupError, RuntimeError) and issubclass(SetupError, RuntimeError)
