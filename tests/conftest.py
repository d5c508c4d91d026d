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


@pytest.fixture(scope="session")
def benchmark_script():
    """Load a script of benchmarks/ as a module: `benchmark_script("fidelity")`."""
    import importlib.util
    from pathlib import Path

    def load(name: str):
        path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(f"{name}_script", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load


@pytest.fixture(scope="session")
def tb_scalars():
    """Read a tb/ directory's TensorBoard events: `tb_scalars(path)` → {tag: [(step, value)]}."""
    def read(tb):
        import tensorflow as tf
        from tensorflow.core.util import event_pb2

        out: dict[str, list[tuple[int, float]]] = {}
        for f in sorted(tb.iterdir()):
            for rec in tf.data.TFRecordDataset(str(f)):
                e = event_pb2.Event.FromString(rec.numpy())
                for v in e.summary.value:
                    out.setdefault(v.tag, []).append((int(e.step), float(tf.make_ndarray(v.tensor))))
        return out

    return read
