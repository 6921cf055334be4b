"""Shared test configuration: the ``tuning`` and ``slow`` markers.

A test that tunes, builds and times candidates, or compiles and runs whole models, is marked
``tuning``: every test of the modules in ``TUNING_MODULES``, and tests elsewhere marked
``@pytest.mark.tuning`` one by one. A differential test over many inputs that takes tens of
seconds is marked ``slow``. ``scripts/test --quick`` deselects both (``-m "not tuning and not
slow"``) and runs the unit tests in about two minutes on 2 cores; the full suite (``scripts/test``) runs
everything and is what CI and the README run.
"""

from __future__ import annotations

import pytest

#: Test modules whose every test tunes or measures.
TUNING_MODULES = {
    "test_cli.py",
    "test_database.py",
    "test_dropin.py",
    "test_durability.py",
    "test_faults.py",
    "test_fusion_search.py",
    "test_relax_tune.py",
    "test_remote.py",
    "test_tune.py",
    "test_warm_start.py",
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "tuning: tunes, builds and times candidates or whole models (deselected by --quick)"
    )
    config.addinivalue_line("markers", "slow: a differential test over many inputs (deselected by --quick)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in TUNING_MODULES:
            item.add_marker(pytest.mark.tuning)
