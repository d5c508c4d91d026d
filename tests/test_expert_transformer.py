"""The transformer expert rule (GPipe / Megatron even split) on the tiny gpt and clip."""
from __future__ import annotations

import numpy as np
import pytest

from placer.baselines.expert import expert, transformer_role
from placer.graphs.models import build_model
from placer.sim.cluster import parse_cluster


def _stage_of_layers(g, dev, tower=""):
    out: dict[int, set[int]] = {}
    for i, nm in enumerate(g.names):
        r = transformer_role(nm)
        if r and r[0] == tower:
            out.setdefault(r[1], set()).add(int(dev[i]))
    return out


# the 4-stage case builds and places a graph twice as big (~30 s): slow; the 2-stage one runs by default
@pytest.mark.parametrize("layers,cluster", [(4, "2xV100"), pytest.param(8, "4xA100", marks=pytest.mark.slow)])
def test_gpt_expert_is_equal_contiguous_stages(layers, cluster):
    g = build_model("gpt", size="tiny", layers=layers)
    c = parse_cluster(cluster)
    dev = expert(g, c)
    stages = _stage_of_layers(g, dev)
    assert sorted(stages) == list(range(layers))
    assert all(len(s) == 1 for s in stages.values()), stages            # every op of a layer on one GPU
    seq = [next(iter(stages[i])) for i in range(layers)]
    assert seq == sorted(seq)                                           # contiguous, in layer order
    gpus = c.gpu_indices
    counts = [seq.count(d) for d in gpus]
    assert counts == [layers // len(gpus)] * len(gpus)                  # equal stages, one per GPU
    first = {int(dev[i]) for i, nm in enumerate(g.names) if transformer_role(nm) == ("first", 0)}
    last = {int(dev[i]) for i, nm in enumerate(g.names) if nm.startswith("gpt_1/head")}
    assert first == {gpus[0]} and last == {gpus[-1]}


def test_clip_expert_splits_each_tower():
    g = build_model("clip", size="tiny")
    c = parse_cluster("2xV100")
    dev = expert(g, c)
    for tower in ("image", "text"):
        st = _stage_of_layers(g, dev, tower)
        assert {k: sorted(v) for k, v in st.items()} == {0: [0], 1: [1]}, tower
    names = np.array(g.names)
    assert {int(d) for d, nm in zip(dev, names) if nm.startswith("clip_1/contrastive")} == {1}
    assert {int(d) for d, nm in zip(dev, names) if nm.startswith("clip_1/image_embedding")} == {0}
