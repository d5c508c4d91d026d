"""Built-in transformer models (issue 14): clip and gpt at tiny size, mixed precision, bad input."""
from __future__ import annotations

import numpy as np
import pytest

from placer.cli import main
from placer.errors import GraphImportError
from placer.graphs.models import build_model
from placer.graphs.models.transformer import GPT_FULL, gpt_params


@pytest.fixture(scope="module")
def gpt32():
    return build_model("gpt", size="tiny")


@pytest.fixture(scope="module")
def gpt16():
    return build_model("gpt", size="tiny", precision="fp16")


def _bytes(g, pred):
    return {n: int(g.out_bytes[i]) for i, n in enumerate(g.names) if pred(n, g.types[i])}


def test_gpt_tiny_builds_a_layered_training_step(gpt32):
    assert gpt32.name == "gpt" and gpt32.precision == "fp32" and gpt32.num_ops > 500
    for layer in ("embedding", "layer_0", "layer_1", "head"):
        assert any(n.startswith(f"gpt_1/{layer}") for n in gpt32.names), layer
    assert any(n.startswith("gradient_tape/") for n in gpt32.names)
    assert any(n.lower().startswith("adam/") for n in gpt32.names)


def test_gpt_layers_scales_depth():
    g = build_model("gpt", size="tiny", layers=3)
    assert any("layer_2" in n for n in g.names) and not any("layer_3" in n for n in g.names)


def test_clip_tiny_has_two_towers_and_a_contrastive_loss():
    g = build_model("clip", size="tiny")
    for scope in ("image_embedding", "image_layer_1", "image_head", "text_embedding", "text_layer_1",
                  "text_head", "contrastive"):
        assert any(f"/{scope}" in n for n in g.names), scope
    # the B x B similarity matrix of the tiny batch (4) in fp32
    sim = _bytes(g, lambda n, t: n.startswith("clip_1/contrastive") and t in ("MatMul", "BatchMatMulV2"))
    assert 4 * 4 * 4 in sim.values()


def test_fp16_halves_activation_bytes_and_keeps_fp32_master_weights(gpt32, gpt16):
    assert gpt16.precision == "fp16"
    fwd = lambda n, t: n.startswith("gpt_1/layer_0_1/") and t == "MatMul"   # noqa: E731
    a, b = _bytes(gpt32, fwd), _bytes(gpt16, fwd)
    assert a and a.keys() == b.keys()
    for n in a:
        assert b[n] * 2 == a[n], n
    w32 = {n: int(gpt32.persistent_bytes[i]) for i, n in enumerate(gpt32.names) if n.startswith("layer_0/")}
    w16 = {n: int(gpt16.persistent_bytes[i]) for i, n in enumerate(gpt16.names) if n.startswith("layer_0/")}
    assert w32 and w32 == w16                    # fp32 master weights: same bytes
    # loss scaling for fp16: gradients divided by the scale before the update, as ops (no `If` over every
    # variable, which would co-locate the whole model with it)
    assert any(n.startswith("scaled_adam/truediv") for n in gpt16.names)
    assert not any(n.startswith("scaled_adam/") for n in gpt32.names)
    assert not {"If", "StatelessIf", "IdentityN"} & set(gpt16.types)   # nothing joins every gradient


def test_bf16_builds_with_16_bit_activations(gpt32):
    g = build_model("gpt", size="tiny", precision="bf16")
    fwd = lambda n, t: n.startswith("gpt_1/layer_0_1/") and t == "MatMul"   # noqa: E731
    assert sum(_bytes(g, fwd).values()) * 2 == sum(_bytes(gpt32, fwd).values())


def test_full_gpt_is_about_1_3b_parameters():
    assert 1.2e9 < gpt_params(**GPT_FULL) < 1.4e9


def test_unknown_precision_and_misused_flags_are_errors():
    with pytest.raises(GraphImportError, match="unknown precision 'fp8'"):
        build_model("gpt", size="tiny", precision="fp8")
    with pytest.raises(GraphImportError, match="not available for model 'nmt'"):
        build_model("nmt", size="tiny", precision="fp16")
    with pytest.raises(GraphImportError, match="--layers applies to model 'gpt' only"):
        build_model("clip", size="tiny", layers=2)
    # a huge depth was built until the machine ran out of memory; now refused at once, naming the limit
    with pytest.raises(GraphImportError, match="--layers 100000: at most 256"):
        build_model("gpt", size="tiny", layers=100000)


def test_cli_unknown_precision_is_one_line(capsys):
    rc = main(["inspect", "--model", "gpt", "--size", "tiny", "--precision", "fp8", "--json"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and "unknown precision 'fp8'" in err and "\n" not in err and "Traceback" not in err


def test_inception_takes_the_precision_too():
    g = build_model("inception_v3", size="tiny", precision="bf16")
    assert g.precision == "bf16"
    conv32 = _bytes(build_model("inception_v3", size="tiny"), lambda n, t: t == "Conv2D")
    conv16 = _bytes(g, lambda n, t: t == "Conv2D")
    assert sum(conv16.values()) * 2 == sum(conv32.values()) > 0


def test_structure_only_build_is_the_same_graph_without_weights(gpt32):
    from placer.graphs.models.transformer import build_gpt

    g = build_gpt("tiny", None, materialize=False)   # every variable uninitialised
    assert g.fingerprint == gpt32.fingerprint and g.num_ops == gpt32.num_ops
    assert np.array_equal(g.persistent_bytes, gpt32.persistent_bytes)
    assert np.array_equal(g.out_bytes, gpt32.out_bytes)
    import keras

    from placer.graphs.models.transformer import structure_only

    with structure_only(1):
        v = keras.Variable(np.zeros((4, 4), "float32"))
    assert type(v.value).__name__ == "UninitializedVariable" or "Uninitialized" in type(v._value).__name__
    assert "Uninitialized" not in type(keras.Variable(np.zeros((4, 4), "float32"))._value).__name__


def test_gpt_whose_weights_the_gpus_cannot_hold_is_one_line_naming_the_bytes(gpt32, tmp_path, capsys):
    """A cluster whose GPUs together cannot hold the model's weights (and optimizer state): one line with the
    bytes needed against the bytes held, before any search."""
    import json

    need = int(np.asarray(gpt32.persistent_bytes, np.float64).sum())
    small = {"format": 1, "name": "two small GPUs",
             "devices": [{"name": f"/GPU:{i}", "kind": "V100", "memory_bytes": need // 4, "reserve_bytes": 0}
                         for i in range(2)] + [{"name": "/CPU:0", "kind": "cpu"}]}
    path = tmp_path / "small.json"
    path.write_text(json.dumps(small))
    rc = main(["search", "--model", "gpt", "--size", "tiny", "--cluster", str(path), "--budget", "5",
               "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "needs at least" in err and "hold" in err and "/GPU:0" in err and "/GPU:1" in err, err
    assert not (tmp_path / "o" / "summary.json").exists()


def test_gpt_groups_keep_each_layer_with_its_optimizer_updates(gpt16):
    """Keras 3's flat optimizer (`adam/Mul_12`, `adam/AssignSubVariableOp_3`) and its variables (`layer_0/kernel`,
    read in `gpt_1/layer_0_1/...`) are grouped with their layers on the tiny gpt: no group holds two layers' ops
    (variables aside), and every update of a layer's variable lies in a group of that layer. (On the full gpt most
    optimizer ops form groups of their own, by measurement: `_anchor_updates`' docstring.)"""
    import re

    from placer.graphs.group import group

    gr = group(gpt16, 40)
    layer = re.compile(r"(?:^|/)layer_(\d+)")
    layers_of: dict[int, set] = {}
    for nm, t, k in zip(gpt16.names, gpt16.types, gr.op_group.tolist()):
        m = layer.search(nm)
        # variables are not checked: a few slot variables (e.g. layer_0's mlp_out bias momentum) stay in a shared
        # group, because their update reads the loss-unscaled gradient (`truediv_13`, anchored by the unscoped-op
        # rule, not as an update) and so is not anchored. Closing that gap (dbf6acb), or anchoring every optimizer
        # write at its variable's layer, measured worse on the full fp16 gpt and clip (grouped_start.py, simulated),
        # so `_anchor_updates` keeps it; see its docstring
        if m and t != "VarHandleOp":
            layers_of.setdefault(k, set()).add(m.group(1))
    assert layers_of and all(len(v) == 1 for v in layers_of.values()), layers_of
    index = {nm: i for i, nm in enumerate(gpt16.names)}
    checked = 0
    for s, d in zip(gpt16.edge_src.tolist(), gpt16.edge_dst.tolist()):
        var, op = gpt16.names[s], gpt16.names[d]
        m = re.match(r"layer_(\d+)/", var)
        if m and gpt16.types[d] in ("AssignSubVariableOp", "AssignVariableOp", "AssignAddVariableOp"):
            assert layers_of.get(int(gr.op_group[index[op]])) == {m.group(1)}, (var, op)
            checked += 1
    assert checked >= 4
