"""The tests' claim engines are wired in one place (tests/support/engines.py), so that a change to
the engine's collaborators is made once and every tier keeps testing the same wiring."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]
HELPER = TESTS / "support" / "engines.py"


def test_only_the_support_helper_constructs_a_claim_engine() -> None:
    copies = sorted(
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("*.py")
        if path not in (HELPER, Path(__file__).resolve()) and "ClaimEngine(" in path.read_text()
    )
    assert copies == [], "build engines with tests.support.engines.simulated_engine"
    assert "ClaimEngine(" in HELPER.read_text()
