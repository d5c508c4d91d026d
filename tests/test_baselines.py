"""Baselines on small hand-built graphs: valid devices, co-location, CPU-only ops, memory, hand-computed m-ETF."""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from placer.baselines import BASELINES, run_baseline
from placer.baselines._common import memory_use, op_memory, prepare, stand_in_costs
from placer.baselines._schedule import etf
from placer.baselines.expert import expert, forward_name
from placer.baselines.m_sct import favorite_children
from placer.errors import PlacementError
from placer.graphs.opgraph import OpGraph
from placer.sim.cluster import Cluster, Device

MEMORY_AWARE = ["metis", "scotch", "heft", "m_topo", "m_etf", "m_sct"]


def rb(name: str, g: OpGraph, c: Cluster, costs=None, seed: int = 0) -> np.ndarray:
    """run_baseline with the roofline stand-in costs (fast, no TensorFlow) unless costs are given."""
    return run_baseline(name, g, c, costs=stand_in_costs(g, c) if costs is None else costs, seed=seed)


def prep(g: OpGraph, c: Cluster):
    return prepare(g, c, stand_in_costs(g, c))


def make_cluster(n_gpus: int = 2, gpu_mem: int = 2**30, bw: float = 1e9, lat: float = 1e-5) -> Cluster:
    devs = [Device(f"/GPU:{i}", "T", gpu_mem, reserve_bytes=0, peak_flops=1e12, mem_bandwidth=1e11)
            for i in range(n_gpus)]
    devs.append(Device("/CPU:0", "cpu", 64 * 2**30, concurrency=4, peak_flops=1e11, mem_bandwidth=2e10))
    D = len(devs)
    return Cluster(tuple(devs), np.full((D, D), bw), np.full((D, D), lat), name=f"{n_gpus}xT")


def two_tower_graph(layers: int = 4, act: int = 1_000_000, var: int = 4_000_000) -> OpGraph:
    """Two towers of `layers` MatMuls with a variable each (co-located with its update), joined by a loss, plus
    a CPU-only input op and a CPU-only step counter co-located with its increment."""
    ops = [("input", "IteratorGetNext", act, 0, 0.0, True), ("step", "VarHandleOp", 8, 8, 0.0, True),
           ("step_inc", "AssignAdd", 8, 0, 0.0)]
    edges, coloc = [], [["step", "step_inc"]]
    for t in "ab":
        prev = "input"
        for i in range(layers):
            v, mm, up = f"{t}/layer_{i}/w", f"{t}/layer_{i}/MatMul", f"train/update_{t}/layer_{i}/w/Apply"
            ops += [(v, "VarHandleOp", 8, var), (mm, "MatMul", act, 0, 5e9), (up, "ResourceApply", 8, 0, 1e6)]
            edges += [(prev, mm), (v, mm), (mm, up)]
            coloc.append([v, up])
            prev = mm
        edges.append((prev, "loss"))
    ops.append(("loss", "Mean", 4, 0, 1e6))
    edges.append(("loss", "step_inc"))
    return OpGraph.build(ops, edges, colocate=coloc, name="towers")


@pytest.fixture(scope="module")
def graph() -> OpGraph:
    return two_tower_graph()


def test_registry_names_match_cli():
    expected = {"single_gpu", "single_cpu", "expert", "metis", "heft", "m_topo", "m_etf", "m_sct", "random"}
    assert expected <= set(BASELINES)
    with pytest.raises(PlacementError, match="valid baselines are .*m_etf"):
        run_baseline("nope", two_tower_graph(1), make_cluster())


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_valid_colocated_cpu_only(name, graph):
    if name not in BASELINES:
        pytest.skip(f"{name} unavailable")
    c = make_cluster(2)
    pl = rb(name, graph, c, seed=3)
    assert pl.shape == (graph.num_ops,) and pl.dtype == np.int64
    assert ((pl >= 0) & (pl < c.num_devices)).all()
    for g in np.unique(graph.colocation):  # co-location kept
        assert len(set(pl[graph.colocation == g].tolist())) == 1, graph.names[np.flatnonzero(graph.colocation == g)[0]]
    assert (pl[graph.cpu_only] == c.cpu_index).all()  # CPU-only ops on the CPU
    assert graph.cpu_only[graph.index("step_inc")]  # its co-location group made it CPU-only
    if name != "single_cpu":
        assert (pl[~graph.cpu_only] != c.cpu_index).all()  # everything else on the GPUs
    else:
        assert (pl == c.cpu_index).all()


@pytest.mark.parametrize("name", ["metis", "heft", "m_etf", "m_sct", "m_topo", "random", "round_robin"])
def test_uses_both_gpus(name, graph):
    pl = rb(name, graph, make_cluster(2))
    assert set(pl[~graph.cpu_only].tolist()) == {0, 1}


def test_single_gpu_is_first_gpu(graph):
    pl = rb("single_gpu", graph, make_cluster(2))
    assert (pl[~graph.cpu_only] == 0).all()


@pytest.mark.parametrize("name", MEMORY_AWARE)
def test_memory_respected_when_one_gpu_cannot_hold_the_model(name, graph):
    if name not in BASELINES:
        pytest.skip(f"{name} unavailable")
    total_gpu = int(prep(graph, make_cluster(2)).mem[~graph.cpu_only].sum())
    cap = int(total_gpu * 0.6)  # one GPU holds 60% of the model: two are needed
    c = make_cluster(2, gpu_mem=cap)
    p = prep(graph, c)
    assert memory_use(p, rb("single_gpu", graph, c))[0] > cap  # the naive placement does not fit
    pl = rb(name, graph, c)
    use = memory_use(p, pl)
    assert (use[:2] <= cap).all(), (name, use, cap)


@pytest.mark.parametrize("name", MEMORY_AWARE)
def test_memory_error_names_need_and_available(name, graph):
    if name not in BASELINES:
        pytest.skip(f"{name} unavailable")
    total_gpu = int(prep(graph, make_cluster(2)).mem[~graph.cpu_only].sum())
    c = make_cluster(2, gpu_mem=int(total_gpu * 0.4))  # both GPUs together hold 80%
    with pytest.raises(PlacementError, match=r"(needs|cannot fit).*(free|of)"):
        rb(name, graph, c)


def diamond():
    """a -> b, a -> c, b -> d, c -> d; costs 1, 2, 3, 1 s on each GPU; every transfer 0.5 s (latency)."""
    g = OpGraph.build([("a", "X", 0), ("b", "X", 0), ("c", "X", 0), ("d", "X", 0)],
                      [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    c = make_cluster(2, bw=1e30, lat=0.5)
    cost = np.array([[1, 1, 9], [2, 2, 9], [3, 3, 9], [1, 1, 9]], float)
    return g, c, cost


def test_m_etf_matches_hand_computed_schedule():
    g, c, cost = diamond()
    s = etf(prepare(g, c, cost))
    # t=0: a on GPU:0 [0,1] (tie between GPUs -> lower index).
    # b, c ready; both start earliest at 1 on GPU:0 -> c wins (b-level 3+0.5+1=4.5 > 2+0.5+1=3.5): c [1,4] on 0.
    # b: GPU:0 free at 4, GPU:1 at 1+0.5=1.5 -> b [1.5,3.5] on 1.
    # d: GPU:0 max(4, 3.5+0.5)=4, GPU:1 max(3.5, 4+0.5)=4.5 -> d [4,5] on 0.
    idx = {n: g.index(n) for n in "abcd"}
    assert [int(s.device[idx[n]]) for n in "abcd"] == [0, 1, 0, 0]
    assert [float(s.start[idx[n]]) for n in "abcd"] == [0.0, 1.5, 1.0, 4.0]
    assert s.makespan == 5.0
    assert rb("m_etf", g, c, costs=cost).tolist() == s.device.tolist()


def test_heft_on_diamond():
    g, c, cost = diamond()
    # ranks: d=1, b=2+0.5+1=3.5, c=3+0.5+1=4.5, a=1+0.5+4.5=6; order a, c, b, d.
    # a->GPU:0 [0,1]; c: EFT 0:4, 1:4.5 -> 0; b: EFT 0:6, 1:1.5+2=3.5 -> 1; d: 0: max(4,4)+1=5, 1: 4.5+1 -> 0.
    pl = rb("heft", g, c, costs=cost)
    assert [int(pl[g.index(n)]) for n in "abcd"] == [0, 1, 0, 0]


def test_m_sct_favorite_child_follows_heavy_edge():
    # a feeds b with 100 MB and c with 8 bytes: b is a's favorite child; a two-GPU schedule keeps b with a
    g = OpGraph.build([("a", "X", [100_000_000, 8], 0, 1e9), ("b", "X", 8, 0, 1e9), ("c", "X", 8, 0, 1e9)],
                      [("a", "b", 0), ("a", "c", 1)])
    c = make_cluster(2, bw=1e9, lat=1e-5)
    p = prep(g, c)
    fav = favorite_children(p)
    assert fav[g.index("b")] == g.index("a")
    assert fav[g.index("c")] == -1
    pl = rb("m_sct", g, c)
    assert pl[g.index("b")] == pl[g.index("a")]


def test_m_topo_fills_devices_in_order():
    g = OpGraph.build([(f"op{i}", "X", 100) for i in range(6)], [(f"op{i}", f"op{i+1}") for i in range(5)])
    pl = rb("m_topo", g, make_cluster(3))
    assert pl.tolist() == [0, 0, 1, 1, 2, 2]  # 600 bytes, 200 per GPU, in topological order


def test_random_is_seeded(graph):
    c = make_cluster(4)
    a, b = rb("random", graph, c, seed=1), rb("random", graph, c, seed=1)
    assert (a == b).all()
    assert any((rb("random", graph, c, seed=s) != a).any() for s in range(2, 6))


def test_metis_cuts_between_towers():
    # two independent towers of equal compute: min-cut puts each tower on its own GPU (only the loss is cut)
    g = two_tower_graph(layers=3)
    pl = rb("metis", g, make_cluster(2))
    towers = [{int(pl[i]) for i, n in enumerate(g.names) if n.startswith(t + "/") or f"update_{t}/" in n}
              for t in "ab"]
    assert all(len(t) == 1 for t in towers) and towers[0] != towers[1]


def test_forward_names():
    assert forward_name("gradients/decoder/layer_1/cell/MatMul_grad/MatMul") == "decoder/layer_1/cell/MatMul"
    assert forward_name("gradients_1/softmax/Softmax_grad/mul") == "softmax/Softmax"
    assert forward_name("Adam/update_encoder/layer_0/kernel/ResourceApplyAdam") == "encoder/layer_0/kernel"


def nmt_like(layers: int = 4) -> OpGraph:
    """An NMT-shaped graph: embeddings, L encoder and decoder layers, attention, softmax, loss, gradients and
    optimizer updates co-located with their variables."""
    ops, edges, coloc = [], [], []

    def layer(scope, prev):
        w, mm = f"{scope}/kernel", f"{scope}/MatMul"
        ops.extend([(w, "VarHandleOp", 8, 1000), (mm, "MatMul", 1000, 0, 1e9)])
        edges.extend([(prev, mm), (w, mm)])
        return mm

    prev = layer("encoder/embedding", "src")
    ops.append(("src", "Placeholder", 1000))
    for i in range(layers):
        prev = layer(f"encoder/layer_{i}", prev)
    enc = prev
    prev = layer("decoder/embedding", "src")
    for i in range(layers):
        prev = layer(f"decoder/layer_{i}", prev)
        if i == 0:
            prev = layer("decoder/attention", prev)
            edges.append((enc, prev))
    prev = layer("softmax", prev)
    ops.append(("loss/Mean", "Mean", 4, 0, 1e6))
    edges.append((prev, "loss/Mean"))
    fwd = [o[0] for o in ops if o[1] == "MatMul"]
    prev = "loss/Mean"
    for f in reversed(fwd):
        gname = f"gradients/{f}_grad/MatMul"
        ops.append((gname, "MatMul", 1000, 0, 1e9))
        edges.extend([(prev, gname), (f, gname)])
        w = f.rsplit("/", 1)[0] + "/kernel"
        up = f"Adam/update_{w}/ResourceApplyAdam"
        ops.append((up, "ResourceApplyAdam", 8, 0, 1e6))
        edges.append((gname, up))
        coloc.append([w, up])
        prev = gname
    return OpGraph.build(ops, edges, colocate=coloc, name="nmt")


@pytest.mark.parametrize("n_gpus", [2, 4])
def test_expert_layers_on_nmt_like_graph(n_gpus):
    L = 4
    g = nmt_like(L)
    c = make_cluster(n_gpus)
    pl = expert(g, c, stand_in_costs(g, c))
    dev = {n: int(pl[i]) for i, n in enumerate(g.names)}
    for i in range(L):
        want = (i * n_gpus) // L
        for stack in ("encoder", "decoder"):
            assert dev[f"{stack}/layer_{i}/MatMul"] == want
            assert dev[f"gradients/{stack}/layer_{i}/MatMul_grad/MatMul"] == want  # backward follows forward
            assert dev[f"Adam/update_{stack}/layer_{i}/kernel/ResourceApplyAdam"] == want  # update with variable
            assert dev[f"{stack}/layer_{i}/kernel"] == want
    assert dev["encoder/embedding/MatMul"] == 0 and dev["decoder/embedding/MatMul"] == 0
    assert dev["decoder/attention/MatMul"] == 0
    assert dev["softmax/MatMul"] == n_gpus - 1 and dev["loss/Mean"] == n_gpus - 1
    assert dev["src"] == 0  # unrecognised input follows its heaviest consumer


def test_expert_generic_rule_is_contiguous_and_balanced():
    names = [f"block{i}/conv" for i in range(8)]
    g = OpGraph.build([(n, "Conv2D", 100, 0, 1e9) for n in names], list(zip(names, names[1:])), name="custom")
    c = make_cluster(4)
    pl = expert(g, c, stand_in_costs(g, c))
    assert pl.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_expert_inception_is_single_gpu():
    names = [f"mixed_{i}/conv" for i in range(6)]
    g = OpGraph.build([(n, "Conv2D", 100, 0, 1e9) for n in names], list(zip(names, names[1:])),
                      name="inception_v3")
    c = make_cluster(4)
    assert (expert(g, c, stand_in_costs(g, c)) == 0).all()


def test_memory_model_counts_saved_activations_and_remote_copies():
    # fwd -> loss -> gradients/fwd_grad reads fwd's output (kept for backward); tmp is short-lived
    g = OpGraph.build([("x", "Placeholder", 100), ("fwd", "MatMul", 1000, 0, 1e9), ("tmp", "Relu", 5000, 0, 1e9),
                       ("loss", "Mean", 4, 0, 1e6), ("gradients/fwd_grad/MatMul", "MatMul", 10, 0, 1e9)],
                      [("x", "fwd"), ("fwd", "tmp"), ("tmp", "loss"), ("loss", "gradients/fwd_grad/MatMul"),
                       ("fwd", "gradients/fwd_grad/MatMul")])
    c = make_cluster(2)
    calibrated = prep(g, c)
    p = dataclasses.replace(calibrated, mem=op_memory(g).mem)   # the model before calibration
    assert p.mem[g.index("fwd")] == 1000 and p.mem[g.index("tmp")] == 0  # kept vs short-lived
    assert p.mem[g.index("x")] == 100  # a source: alive from the start of the step
    assert p.capacity[0] == c.devices[0].capacity_bytes - 5000  # headroom for the largest short-lived tensor
    together = np.zeros(g.num_ops, np.int64)
    split = together.copy()
    split[g.index("gradients/fwd_grad/MatMul")] = 1
    assert memory_use(p, together)[:2].tolist() == [1104, 0]  # x + fwd + loss (read by the backward op)
    assert memory_use(p, split)[:2].tolist() == [1104, 1004]  # the gradient's device holds copies
    # calibration: the one-device estimate (+ headroom) is the simulator's peak for that placement
    from placer.sim.simulator import Simulator

    peak = Simulator(g, c, calibrated.cost).simulate(together).peak_memory[0]
    assert memory_use(calibrated, together)[0] + (c.devices[0].capacity_bytes - calibrated.capacity[0]) \
        == pytest.approx(peak, rel=0.01)


def test_memory_model_variable_reads_alias_and_addends_wait():
    # a variable read allocates nothing on its own device (TF returns the variable's buffer); gradient
    # addends summed by AddN are kept until the sum
    g = OpGraph.build([("v", "VarHandleOp", 8, 4000), ("read", "ReadVariableOp", 4000), ("x", "Placeholder", 10),
                       ("mm", "MatMul", 50, 0, 1e6), ("loss", "Mean", 4),
                       ("gradients/g1", "MatMul", 4000, 0, 1e6), ("gradients/g2", "MatMul", 4000, 0, 1e6),
                       ("gradients/AddN", "AddN", 4000)],
                      [("v", "read"), ("read", "mm"), ("x", "mm"), ("mm", "loss"), ("loss", "gradients/g1"),
                       ("loss", "gradients/g2"), ("gradients/g1", "gradients/AddN"), ("gradients/g2", "gradients/AddN")])
    m = op_memory(g).mem
    assert m[g.index("read")] == 0 and m[g.index("v")] == 4000 + 8
    assert m[g.index("gradients/g1")] == 4000 and m[g.index("gradients/g2")] == 4000
    from placer.sim.simulator import Simulator

    c = make_cluster(2)
    split = np.zeros(g.num_ops, np.int64)
    split[g.index("mm")] = 1
    peak = Simulator(g, c, np.full(g.num_ops, 1e-3)).simulate(split).peak_memory
    assert peak[1] >= 4000          # the read's copy is allocated on the consumer's device
    together = Simulator(g, c, np.full(g.num_ops, 1e-3)).simulate(np.zeros(g.num_ops, np.int64)).peak_memory
    assert together[0] < 4000 + 4 * 4000     # variable + the three gradient tensors, no copy for the read


def test_expert_on_tiny_nmt_model():
    models = pytest.importorskip("placer.graphs.models")
    g = models.build_model("nmt", "tiny")
    c = make_cluster(2)
    pl = expert(g, c, stand_in_costs(g, c))
    dev = dict(zip(g.names, pl.tolist()))
    single = np.bincount(g.colocation)[g.colocation] == 1  # ops not tied to another op's device
    checked = 0
    for i, name in enumerate(g.names):
        if not single[i] or g.cpu_only[i]:
            continue
        fwd = forward_name(name)
        for stack in ("encoder", "decoder"):
            for layer in range(2):  # nmt: 2 layers per stack, 2 GPUs: layer i on GPU i
                if fwd.startswith(f"{stack}/layer_{layer}/"):
                    assert dev[name] == layer, name
                    checked += 1
        if fwd.startswith(("softmax/", "loss/")):
            assert dev[name] == 1, name
        if fwd.startswith(("decoder/attention/", "encoder/embedding/", "decoder/embedding/")):
            assert dev[name] == 0, name
    assert checked > 100
    assert any(n.startswith("gradients/encoder/layer_1/") and dev[n] == 1 for n in dev)  # backward follows forward
    for var in ("encoder/layer_1/kernel", "decoder/layer_1/bias", "softmax/weights"):
        if var in dev:
            assert dev[var] == 1, var
    for gid in np.unique(g.colocation):
        assert len(set(pl[g.colocation == gid].tolist())) == 1


@pytest.mark.parametrize("name", ["m_etf", "heft", "m_topo", "m_sct"])
def test_forward_operator_placement_keeps_gradients_with_forward_ops(name):
    g = nmt_like(4)
    c = make_cluster(4)
    pl = BASELINES[name](g, c, stand_in_costs(g, c), colocate_gradients=True)
    dev = dict(zip(g.names, pl.tolist()))
    grads = [n for n in g.names if n.startswith("gradients/")]
    assert grads and all(dev[n] == dev[forward_name(n)] for n in grads)
    assert len(set(pl.tolist())) > 1


def test_scotch_is_reproducible():
    if "scotch" not in BASELINES:
        pytest.skip("pyscotch unavailable")
    g = nmt_like(8)
    c = make_cluster(4)
    runs = [rb("scotch", g, c, seed=5) for _ in range(3)]
    assert all((r == runs[0]).all() for r in runs)


def test_scotch_maps_alike_on_one_core_and_on_two():
    """Scotch's deterministic option holds per thread count, and it takes a thread per core the process may use:
    placer runs it on one thread, so a machine's core count does not change the baseline (before: nmt tiny on
    4xK80 mapped one way pinned to one core, another on two)."""
    import subprocess
    import sys

    if "scotch" not in BASELINES:
        pytest.skip("pyscotch unavailable")
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    code = ("import os, sys, hashlib; os.sched_setaffinity(0, {%s}); "
            "from placer.graphs.models import build_model; from placer.sim.cluster import parse_cluster; "
            "from placer.sim.costs import analytical_costs; from placer.baselines.scotch import scotch_placement; "
            "g = build_model('nmt', 'tiny'); c = parse_cluster('4xK80'); "
            "p = scotch_placement(g, c, analytical_costs(g, c).matrix(c), seed=0); "
            "print(hashlib.md5(p.tobytes()).hexdigest())")
    outs = []
    for use in (cores[:1], cores[:2]):
        r = subprocess.run([sys.executable, "-c", code % ", ".join(map(str, use))], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(r.stdout.split()[-1])
    assert outs[0] == outs[1]
