import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every model test on one torch thread (``one_torch_thread``, tests/conftest.py)."""
