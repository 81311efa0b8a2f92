import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run faster on one thread, and a loaded 2-core box makes OpenMP spin badly."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
