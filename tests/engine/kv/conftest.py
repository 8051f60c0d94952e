import pytest

from support.factories import FakeClock


@pytest.fixture
def clock():
    return FakeClock()
