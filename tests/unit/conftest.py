"""The unit tier's promise, checked: a run of only unit tests never imports torch.

Only when every collected item is a unit test: a full run loads torch in other tiers, and
which tier ran first must not decide whether a unit test fails.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

UNIT = Path(__file__).parent


def only_unit(session: pytest.Session) -> bool:
    """Whether this run collected unit tests and nothing else."""
    return all(UNIT in item.path.parents for item in session.items)


@pytest.fixture(scope="session", autouse=True)
def unit_collection_is_torch_free(request: pytest.FixtureRequest) -> None:
    """Importing the unit test modules (and what they import) loaded no torch."""
    if only_unit(request.session):
        assert "torch" not in sys.modules, "collecting the unit tier imported torch"


@pytest.fixture(autouse=True)
def unit_test_is_torch_free(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the unit test during which torch was first imported, naming it."""
    before = "torch" in sys.modules
    yield
    if only_unit(request.session) and not before and "torch" in sys.modules:
        pytest.fail(f"{request.node.nodeid} imported torch; the unit tier is torch-free (DESIGN.md)")
