"""npz files a user hands back (graph caches, run directories, checkpoints, policies): a file that is no npz is one
line naming it, never numpy's advice to load it with allow_pickle (which would run code the file holds)."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from placer._npz import load_npz
from placer.errors import GraphImportError, SearchError
from placer.graphs.opgraph import OpGraph

JUNK = [b"", b"garbage", pickle.dumps({"a": 1})]


@pytest.mark.parametrize("content", JUNK)
def test_load_npz_names_the_file_and_never_advises_pickle(tmp_path, content):
    p = tmp_path / "x.npz"
    p.write_bytes(content)
    with pytest.raises(ValueError, match="x.npz is not an npz archive") as e:
        load_npz(p)
    assert "pickle" not in str(e.value)
    np.savez(p, a=np.arange(3))
    with load_npz(p) as z:
        assert list(z["a"]) == [0, 1, 2]


def test_a_truncated_npz_is_named_not_a_bad_zip_traceback(tmp_path):
    """An npz cut short (a kill while copying it) starts with "PK" like a good one: numpy let zipfile's
    BadZipFile out, a traceback for `placer replace` of a run whose problem.npz was truncated."""
    p = tmp_path / "problem.npz"
    np.savez(p, a=np.arange(1000))
    p.write_bytes(p.read_bytes()[:300])
    with pytest.raises(ValueError, match="problem.npz is not an npz archive"):
        load_npz(p)


@pytest.mark.parametrize("content", JUNK)
def test_graph_cache_file_that_is_no_npz(tmp_path, content):
    p = tmp_path / "graph.npz"
    p.write_bytes(content)
    with pytest.raises(GraphImportError, match="graph.npz is not an npz archive") as e:
        OpGraph.load(p)
    assert "pickle" not in str(e.value)


def test_policy_weights_that_are_no_npz(tmp_path):
    pytest.importorskip("tensorflow")
    import shutil

    from placer.rl.portable import PortableWeights, resolve_policy

    d = tmp_path / "policy"
    shutil.copytree(resolve_policy("default"), d)
    (d / "policy.npz").write_bytes(b"garbage")
    with pytest.raises(SearchError, match="policy.npz.*is not an npz archive") as e:
        PortableWeights.load(d)
    assert "pickle" not in str(e.value)
