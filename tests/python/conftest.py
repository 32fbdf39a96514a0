import pytest

from tiers import tier_fixture


@pytest.fixture
def tier(request, monkeypatch):
    return tier_fixture(request, monkeypatch)
