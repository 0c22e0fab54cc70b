"""The plugin marks every test that reaches a real service as an integration test."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def test_a_test_using_a_service_fixture_is_integration_whatever_its_module_says(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(
        """
import pytest

@pytest.fixture
def through_another(kafka_bootstrap):
    return kafka_bootstrap
"""
    )
    pytester.makepyfile(
        test_mixed="""
def test_pure():
    assert True

def test_direct(postgres_admin_dsn):
    pass

def test_indirect(through_another):
    pass

def test_private(private_kafka):
    pass
"""
    )
    result = pytester.runpytest(
        "-m", "not integration", "--collect-only", "-q", "-p", "no:cacheprovider"
    )
    collected = [line for line in result.outlines if "::" in line]
    assert collected == ["test_mixed.py::test_pure"]
    result = pytester.runpytest(
        "-m", "integration", "--collect-only", "-q", "-p", "no:cacheprovider"
    )
    assert sorted(line for line in result.outlines if "::" in line) == [
        "test_mixed.py::test_direct",
        "test_mixed.py::test_indirect",
        "test_mixed.py::test_private",
    ]
