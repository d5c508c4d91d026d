import os

# keep TensorFlow quiet and the cache out of the user's home
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Each test session uses its own PLACER_CACHE_DIR (shared across tests for speed)."""
    d = os.environ.get("PLACER_TEST_CACHE") or str(tmp_path_factory.getbasetemp() / "placer-cache")
    monkeypatch.setenv("PLACER_CACHE_DIR", d)
    yield
