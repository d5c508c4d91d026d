"""Topology presets (DGX1, DGX-A100, HGX-H100, NxDGX-A100), link matrices, shared links, precision peaks."""
from __future__ import annotations

import json

import numpy as np
import pytest

from placer.cli import main
from placer.errors import ClusterError
from placer.graphs.opgraph import OpGraph
from placer.sim.cluster import DGX1_NVLINKS, LINKS, load_cluster, make_device, parse_cluster, to_json
from placer.sim.costs import analytical_costs


def test_dgx1_link_matrix_is_symmetric_and_non_nvlink_pairs_are_slower():
    c = parse_cluster("DGX1")
    assert c.num_devices == 9 and c.device_names[-1] == "/CPU:0" and c.devices[0].kind == "V100"
    bw = c.bandwidth[:8, :8]
    assert np.array_equal(bw, bw.T) and np.array_equal(c.latency, c.latency.T)
    nv = np.zeros((8, 8), bool)
    for (i, j), k in DGX1_NVLINKS.items():
        nv[i, j] = nv[j, i] = True
        assert bw[i, j] == k * LINKS["nvlink2"]["bandwidth"]
    assert all(sum(DGX1_NVLINKS.get((min(i, j), max(i, j)), 0) for j in range(8) if j != i) == 6 for i in range(8))
    off = ~np.eye(8, dtype=bool)
    slow = off & ~nv
    assert slow.sum() == 24                      # 12 unordered pairs without NVLink
    assert bw[slow].max() < bw[nv].min() and c.latency[:8, :8][slow].min() > c.latency[:8, :8][nv].max()
    # each non-NVLink path crosses the sender's PCIe switch, named as a shared link
    assert c.meta["link_shared"]["0,5"] == "node0/pcie_switch0" and "node0/pcie_switch0" in c.meta["shared_links"]


def test_nvswitch_nodes_and_multi_node_infiniband(tmp_path):
    a, h = parse_cluster("DGX-A100"), parse_cluster("HGX-H100")
    assert a.devices[0].kind == "A100" and h.devices[0].kind == "H100"
    assert a.bandwidth[0, 7] == LINKS["nvlink3"]["bandwidth"] and h.bandwidth[3, 4] == LINKS["nvlink4"]["bandwidth"]
    c = parse_cluster("2xDGX-A100")
    assert c.num_devices == 17 and len(c.gpu_indices) == 16
    assert c.bandwidth[0, 8] == 25e9 < c.bandwidth[0, 7]               # HDR 200 Gb/s across nodes
    assert c.meta["link_shared"]["9,0"] == "node1/nic1"
    p = tmp_path / "two.json"
    to_json(c, p)
    d = load_cluster(p)                                                # JSON round trip keeps links
    assert np.array_equal(d.bandwidth, c.bandwidth) and d.meta["link_shared"] == c.meta["link_shared"]


def test_bad_link_matrix_shape_is_a_one_line_error(tmp_path, capsys):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps({"devices": [{"name": "/GPU:0", "kind": "V100"}, {"name": "/GPU:1", "kind": "V100"}],
                             "links": [[None, {"bandwidth_Bps": 1e9}]]}))
    with pytest.raises(ClusterError, match="must be a 2x2 matrix"):
        load_cluster(f)
    rc = main(["simulate", "--model", "gpt", "--size", "tiny", "--cluster", str(f), "--json"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and "2x2" in err and "\n" not in err


def test_peaks_by_precision_follow_the_datasheets():
    v, a = make_device("/GPU:0", "V100"), make_device("/GPU:0", "A100")
    assert v.peak_for("fp32") == 15.7e12 and v.peak_for("fp16") == 125e12
    assert a.peak_for("bf16") == a.peak_for("fp16") == 312e12 and a.peak_for("fp32") == 19.5e12
    assert make_device("/GPU:0", "H100").peak_for("fp16") > 900e12
    with pytest.raises(ClusterError, match="V100 .* no bf16"):
        v.peak_for("bf16")
    with pytest.raises(ClusterError, match="K80 .* no fp16"):
        make_device("/GPU:0", "K80").peak_for("fp16")


def _mm_graph(precision):
    g = OpGraph.build([("a", "MatMul", 1 << 20, 0, 1e12), ("b", "Relu", 1 << 20, 0, 1e6)], [("a", "b")])
    object.__setattr__(g, "precision", precision)
    return g


def test_fp16_matmuls_use_tensor_cores_and_k80_refuses_fp16():
    c = parse_cluster("DGX1")
    t32 = analytical_costs(_mm_graph("fp32"), c, cache=False).for_kind("V100")
    t16 = analytical_costs(_mm_graph("fp16"), c, cache=False).for_kind("V100")
    assert t32[0] / t16[0] == pytest.approx(125 / 15.7, rel=1e-3) and t16[1] == t32[1]
    with pytest.raises(ClusterError, match="K80"):
        analytical_costs(_mm_graph("fp16"), parse_cluster("2xK80"), cache=False)


def test_cli_fp16_on_k80_is_a_one_line_error(capsys):
    rc = main(["simulate", "--model", "gpt", "--size", "tiny", "--precision", "fp16", "--cluster", "2xK80", "--json"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and "K80" in err and "fp16" in err and "\n" not in err and "Traceback" not in err


def _two_flows_cluster(tmp_path, shared: bool):
    ln = {"bandwidth_Bps": 1e9, "latency_s": 0.0, "shared": "nic" if shared else None}
    links = [[None, None, dict(ln)], [None, None, dict(ln)], [None, None, None]]
    f = tmp_path / f"flows{int(shared)}.json"
    f.write_text(json.dumps({"devices": [{"name": f"/GPU:{i}", "kind": "V100"} for i in range(3)],
                             "links": links, "shared_links": {"nic": {"bandwidth_Bps": 1e9}} if shared else {}}))
    return load_cluster(f)


def test_a_transfer_over_a_shared_nic_is_slower_when_two_flows_share_it(tmp_path):
    from placer.sim.simulator import Simulator

    mb = 100 << 20
    g = OpGraph.build([("a", "X", mb, 0, 0.0), ("b", "X", mb, 0, 0.0), ("c", "AddV2", 0, 0, 0.0)],
                      [("a", "c"), ("b", "c")])
    p = np.array([0, 1, 2])
    alone = Simulator(g, _two_flows_cluster(tmp_path, False)).simulate(p).step_time
    shared = Simulator(g, _two_flows_cluster(tmp_path, True)).simulate(p).step_time
    one = mb / 1e9
    assert one < alone < 1.1 * one                  # two links in parallel: one transfer time
    assert 2 * one < shared < 2.2 * one             # one NIC: the flows take turns
    # a single flow through the NIC is as fast as without it
    single = Simulator(g, _two_flows_cluster(tmp_path, True)).simulate(np.array([0, 2, 2])).step_time
    assert single < 1.1 * one
