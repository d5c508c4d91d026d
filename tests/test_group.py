import numpy as np
import pytest

from placer.graphs.group import default_max_groups, group
from placer.graphs.opgraph import OpGraph


def random_graph(n=600, seed=0, cpu_every=50, coloc=40):
    rng = np.random.default_rng(seed)
    ops = [(f"op{i}", ["MatMul", "Add", "Relu", "Conv2D"][i % 4], int(rng.integers(1, 10**6)), 0,
            float(rng.integers(0, 10**9)), i % cpu_every == 7) for i in range(n)]
    edges = [(f"op{i}", f"op{j}") for i in range(n - 1)
             for j in set(rng.integers(i + 1, min(n, i + 20), size=2).tolist())]
    colocate = [[f"op{i}", f"op{n - 1 - i}", f"op{i + n // 3}"] for i in range(coloc)]
    return OpGraph.build(ops, edges, colocate=colocate)


@pytest.mark.parametrize("G", [1, 5, 80, 256])
def test_groups_bounded_and_colocation_kept(G):
    g = random_graph()
    gr = group(g, G)
    assert 1 <= gr.num_groups <= G
    assert gr.op_group.shape == (g.num_ops,)
    assert set(np.unique(gr.op_group)) == set(range(gr.num_groups))  # no empty group ids
    for c in np.unique(g.colocation):
        assert len(np.unique(gr.op_group[g.colocation == c])) == 1, f"co-location group {c} split"


def test_cpu_only_groups_are_homogeneous_and_expand_forces_cpu():
    g = random_graph()
    assert g.cpu_only.any()
    gr = group(g, 40)
    for k in range(gr.num_groups):
        members = g.cpu_only[gr.op_group == k]
        assert members.all() or not members.any()
        assert gr.cpu_only[k] == members.all()
    devs = np.zeros(gr.num_groups, np.int32)  # every group on device 0 ...
    ops = gr.expand(devs, cpu_index=4)          # ... but CPU-only ops forced to the CPU (index 4)
    assert (ops[g.cpu_only] == 4).all() and (ops[~g.cpu_only] == 0).all()
    mask = gr.allowed_mask(5, 4)
    assert (mask[gr.cpu_only].sum(1) == 1).all() and mask[gr.cpu_only, 4].all()
    assert mask[~gr.cpu_only].all()


def test_chain_cut_into_balanced_contiguous_runs():
    # 12 equal ops in a chain, 4 groups -> 4 contiguous runs of 3 ops
    ops = [(f"n{i}", "MatMul", 1000, 0, 1e9) for i in range(12)]
    g = OpGraph.build(ops, [(f"n{i}", f"n{i + 1}") for i in range(11)])
    gr = group(g, 4)
    assert gr.num_groups == 4
    assert gr.op_group.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]


def test_single_consumer_chain_merged_before_clustering():
    # a -> b (b's only consumer is c) and big independent ops: a tiny, single-consumer chain folds together
    ops = [("a", "Const", 4, 0, 0.0), ("b", "Neg", 4, 0, 0.0), ("c", "MatMul", 4, 0, 1e10),
           ("d", "MatMul", 4, 0, 1e10), ("e", "MatMul", 4, 0, 1e10)]
    g = OpGraph.build(ops, [("a", "b"), ("b", "c"), ("c", "e"), ("d", "e")])
    gr = group(g, 3)
    grp = dict(zip(g.names, gr.op_group))
    assert grp["a"] == grp["b"] == grp["c"]


def test_features_normalised_and_adjacency_counts_cross_group_bytes():
    g = random_graph(300)
    gr = group(g, 20)
    f = gr.features
    assert f.shape[0] == gr.num_groups and np.isfinite(f).all()
    assert f.min() >= 0.0 and f.max() <= 1.0 + 1e-6
    assert gr.adjacency.shape == (gr.num_groups, gr.num_groups)
    assert np.allclose(np.diag(gr.adjacency), 0.0)
    # adjacency[i, j] > 0 exactly when some data edge crosses from group i to j
    gs, gd = gr.op_group[g.edge_src], gr.op_group[g.edge_dst]
    want = np.zeros_like(gr.adjacency, dtype=bool)
    want[gs[gs != gd], gd[gs != gd]] = True
    assert ((gr.adjacency > 0) == want).all()


def test_default_max_groups():
    assert default_max_groups(4) == 80 and default_max_groups(2) == 40 and default_max_groups(64) == 256


def test_groups_split_by_a_placement_express_it_exactly():
    """`split_by` (build_problem's split_groups): every group lies on one device of the given placement, so its
    group-level version is the placement itself; a placement scattering every group beyond REFINE_FACTOR x G
    keeps the scope-level split only."""
    import numpy as np

    from placer.graphs.group import REFINE_FACTOR, group
    from placer.graphs.models import build_model

    g = build_model("nmt", "tiny")
    rng = np.random.default_rng(0)
    plain = group(g, max_groups=20)
    # a placement by layer halves: contiguous, so a split grouping expresses it with few extra groups
    split = (np.arange(g.num_ops) >= g.num_ops // 2).astype(np.int64)
    _, first, inv = np.unique(np.asarray(g.colocation), return_index=True, return_inverse=True)
    split = split[first[inv]]          # a placement respects co-location, as the baselines do
    gr = group(g, max_groups=20, split_by=split)
    for k in range(gr.num_groups):
        assert len(np.unique(split[gr.op_group == k])) == 1, f"group {k} straddles the placement's devices"
    assert gr.num_groups <= REFINE_FACTOR * 20 and gr.features.shape[0] == gr.num_groups
    # ops of a group stay in one co-location group's device, as without the split
    scattered = rng.integers(0, 4, g.num_ops)
    gs = group(g, max_groups=20, split_by=scattered)
    assert gs.num_groups <= REFINE_FACTOR * 20 and plain.num_groups <= 20


def test_build_problem_split_groups_names_a_baseline(tmp_path):
    import numpy as np
    import pytest

    from placer.errors import SearchError
    from placer.graphs.models import build_model
    from placer.grouped import group_majority
    from placer.problem import build_problem

    g = build_model("nmt", "tiny")
    p = build_problem(g, "4xK80", split_groups="best")
    try:
        name = p.meta["split_groups"]
        b = p.baselines[name]
        maj = group_majority(b, p.grouping.op_group, p.grouping.num_groups, p.cluster.num_devices)
        assert np.array_equal(p.grouping.expand(maj, p.cluster.cpu_index), b)
    finally:
        p.close()
    with pytest.raises(SearchError, match="no such baseline"):
        build_problem(g, "4xK80", split_groups="nope")


def test_split_never_breaks_a_colocation_group():
    import numpy as np

    from placer.graphs.group import group
    from placer.graphs.models import build_model

    g = build_model("rnnlm", "tiny")
    scattered = np.random.default_rng(1).integers(0, 2, g.num_ops)
    gr = group(g, max_groups=40, split_by=scattered)
    co = np.asarray(g.colocation)
    for c in np.unique(co):
        assert len(np.unique(gr.op_group[co == c])) == 1


def test_unscoped_gradient_sums_stay_with_their_layer():
    """TF's gradient sums (`AddN_k` at the top level, `gradients/AddN_k` in TF1) have no scope of their own: each
    joins the layer its heaviest input comes from, so a layer's gradient never crosses devices to be summed.
    (They once formed a group of their own: on CLIP, 80 MB per layer crossed to it and back.)"""
    from placer.graphs.group import anchors

    L, big, MB = 4, 1e10, 80 * 2**20
    ops, edges = [], []
    for i in range(L):
        ops += [(f"m/layer_{i}/MatMul", "MatMul", MB, 0, big), (f"m/layer_{i}/Gelu", "Gelu", MB, 0, big / 10)]
        edges += [(f"m/layer_{i}/MatMul", f"m/layer_{i}/Gelu")]
        if i:
            edges.append((f"m/layer_{i - 1}/Gelu", f"m/layer_{i}/MatMul"))
    prev = f"m/layer_{L - 1}/Gelu"
    for i in reversed(range(L)):                  # backward: two gradient paths per layer, summed by AddN_i
        a, b = f"gradient_tape/m/layer_{i}/Gelu/mul", f"gradient_tape/m/layer_{i}/Gelu/Neg"
        ops += [(a, "Mul", MB, 0, big / 10), (b, "Neg", MB, 0, big / 10), (f"AddN_{i}", "AddN", MB, 0, big / 5),
                (f"gradient_tape/m/layer_{i}/MatMul/MatMul_1", "MatMul", MB, 0, big)]
        edges += [(prev, a), (prev, b), (f"m/layer_{i}/Gelu", a), (a, f"AddN_{i}"), (b, f"AddN_{i}"),
                  (f"AddN_{i}", f"gradient_tape/m/layer_{i}/MatMul/MatMul_1")]
        prev = f"gradient_tape/m/layer_{i}/MatMul/MatMul_1"
    g = OpGraph.build(ops, edges)
    _, scopes = anchors(g)
    for i in range(L):
        assert scopes[g.names.index(f"AddN_{i}")] == ["m", f"layer_{i}"]
    gr = group(g, L)
    grp = dict(zip(g.names, gr.op_group.tolist()))
    assert gr.num_groups == L
    for i in range(L):
        assert grp[f"AddN_{i}"] == grp[f"m/layer_{i}/MatMul"] == grp[f"gradient_tape/m/layer_{i}/Gelu/mul"]


def test_small_sub_scopes_stay_with_their_layer():
    """A layer's cheap sub-scope (`layer_i/attn_out`: below a quarter of a mean group) is grouped with its own
    layer, never with the other layers' cheap sub-scopes in one cross-layer "misc" group."""
    L, big, small, MB = 6, 1e10, 1e8, 2**20
    ops, edges, prev = [], [], None
    for i in range(L):
        names = [f"m/layer_{i}/qkv/MatMul", f"m/layer_{i}/mlp/MatMul", f"m/layer_{i}/attn_out/MatMul"]
        ops += [(names[0], "MatMul", MB, 0, big), (names[1], "MatMul", MB, 0, big),
                (names[2], "MatMul", MB, 0, small)]
        edges += [(names[0], names[2]), (names[2], names[1])] + ([(prev, names[0])] if prev else [])
        prev = names[1]
    g = OpGraph.build(ops, edges)
    gr = group(g, 3 * L)
    layer_of_group: dict[int, set] = {}
    for nm, k in zip(g.names, gr.op_group.tolist()):
        layer_of_group.setdefault(k, set()).add(nm.split("/")[1])
    assert all(len(v) == 1 for v in layer_of_group.values()), layer_of_group


def test_flat_optimizer_updates_and_variables_join_their_layers():
    """Keras 3 writes its optimizer flat (`adam/Mul_7`, `adam/AssignSubVariableOp_3`) and its variables outside
    the layers' call scopes (`layer_0/kernel` read in `m/layer_0/...`): each update follows its gradient's layer,
    each slot variable its update's, each variable its first reader's; the learning rate, read by every update,
    stays a hub of its own."""
    from placer.graphs.group import anchors

    L, MB, W = 3, 2**20, 4 * 2**20
    ops = [("x", "Placeholder", MB), ("adam/lr", "VarHandleOp", 4, 4), ("adam/lr/Read", "ReadVariableOp", 4)]
    edges = [("adam/lr", "adam/lr/Read")]
    prev = "x"
    for i in range(L):
        ops += [(f"layer_{i}/kernel", "VarHandleOp", 8, W), (f"m/layer_{i}/Read", "ReadVariableOp", W),
                (f"m/layer_{i}/MatMul", "MatMul", MB, 0, 1e9)]
        edges += [(f"layer_{i}/kernel", f"m/layer_{i}/Read"), (f"m/layer_{i}/Read", f"m/layer_{i}/MatMul"),
                  (prev, f"m/layer_{i}/MatMul")]
        prev = f"m/layer_{i}/MatMul"
    for i in reversed(range(L)):
        gname = f"gradient_tape/m/layer_{i}/MatMul/MatMul_1"
        ops.append((gname, "MatMul", W, 0, 1e9))
        edges += [(prev, gname), (f"m/layer_{i}/Read", gname)]
    for i in range(L):
        gname, mom = f"gradient_tape/m/layer_{i}/MatMul/MatMul_1", f"adam/layer_{i}_kernel_momentum"
        ops += [(mom, "VarHandleOp", 8, W), (f"adam/ReadVariableOp_{i}", "ReadVariableOp", W),
                (f"adam/Mul_{i}", "Mul", W), (f"adam/Add_{i}", "AddV2", W),
                (f"adam/AssignVariableOp_{i}", "AssignVariableOp", 0),
                (f"adam/Mul_{L + i}", "Mul", W), (f"adam/AssignSubVariableOp_{i}", "AssignSubVariableOp", 0)]
        edges += [(mom, f"adam/ReadVariableOp_{i}"), (f"adam/ReadVariableOp_{i}", f"adam/Add_{i}"),
                  (gname, f"adam/Mul_{i}"), (f"adam/Mul_{i}", f"adam/Add_{i}"), (mom, f"adam/AssignVariableOp_{i}"),
                  (f"adam/Add_{i}", f"adam/AssignVariableOp_{i}"), (f"adam/Add_{i}", f"adam/Mul_{L + i}"),
                  ("adam/lr/Read", f"adam/Mul_{L + i}"), (f"layer_{i}/kernel", f"adam/AssignSubVariableOp_{i}"),
                  (f"adam/Mul_{L + i}", f"adam/AssignSubVariableOp_{i}")]
    g = OpGraph.build(ops, edges)
    anchor, scopes = anchors(g)
    at = {nm: g.names[int(a)] for nm, a in zip(g.names, anchor)}
    for i in range(L):
        home = f"m/layer_{i}/MatMul"
        for nm in (f"adam/Mul_{i}", f"adam/Add_{i}", f"adam/AssignVariableOp_{i}", f"adam/Mul_{L + i}",
                   f"adam/AssignSubVariableOp_{i}", f"adam/layer_{i}_kernel_momentum", f"adam/ReadVariableOp_{i}"):
            assert at[nm] == home, (nm, at[nm])
        assert scopes[g.names.index(f"layer_{i}/kernel")] == ["m", f"layer_{i}"]
    assert at["adam/lr/Read"] == "adam/lr/Read" and at["adam/lr"] in ("adam/lr", "adam/lr/Read")
    gr = group(g, 2 * L)
    grp = dict(zip(g.names, gr.op_group.tolist()))
    own = [{grp[f"m/layer_{i}/MatMul"], grp[f"gradient_tape/m/layer_{i}/MatMul/MatMul_1"]} for i in range(L)]
    for i in range(L):
        assert grp[f"adam/AssignSubVariableOp_{i}"] in own[i] and grp[f"layer_{i}/kernel"] in own[i]
        assert not own[i] & own[(i + 1) % L]
