"""Cluster presets, spec parsing, JSON round trip and bad input."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from placer.errors import ClusterError
from placer.sim.cluster import (GPU_KINDS, LINKS, PRESETS, cluster_from_args, cluster_from_devices, parse_cluster,
                                short_device_name, to_json)


def test_nxkind_is_n_gpus_plus_host_cpu_last():
    c = parse_cluster("4xK80")
    assert c.device_names == ["/GPU:0", "/GPU:1", "/GPU:2", "/GPU:3", "/CPU:0"]
    assert c.cpu_index == 4 and c.gpu_indices == [0, 1, 2, 3]
    k80 = c.devices[0]
    assert k80.kind == "K80" and k80.memory_bytes == 12 * 2**30 and k80.concurrency == 1
    assert k80.peak_flops == pytest.approx(4.37e12) and k80.mem_bandwidth == pytest.approx(240e9)
    assert c.devices[4].kind == "cpu" and c.devices[4].concurrency > 1
    # GPU<->GPU and GPU<->CPU over PCIe 3 on a K80 box
    assert c.bandwidth[0, 1] == LINKS["pcie3"]["bandwidth"] and c.bandwidth[0, 4] == LINKS["pcie3"]["bandwidth"]
    assert 5e-6 <= c.latency[0, 1] <= 20e-6 and c.latency[2, 2] == 0


@pytest.mark.parametrize("kind", GPU_KINDS)
def test_every_preset_parses(kind):
    c = parse_cluster(f"2x{kind}")
    assert c.num_devices == 3 and c.devices[0].kind == kind
    assert c.devices[0].capacity_bytes > 0 and c.devices[0].peak_flops > 1e12


def test_nvlink_presets_faster_than_pcie_between_gpus():
    v = parse_cluster("2xV100")
    assert v.devices[0].memory_bytes == 16 * 2**30
    assert v.bandwidth[0, 1] > v.bandwidth[0, 2]  # NVLink between GPUs, PCIe to the host
    assert parse_cluster("2xA100-80G").devices[0].memory_bytes == 80 * 2**30
    assert parse_cluster("1xa100").devices[0].memory_bytes == 40 * 2**30  # case-insensitive


def test_cpu_alone():
    c = parse_cluster("cpu")
    assert c.device_names == ["/CPU:0"] and c.cpu_index == 0 and c.gpu_indices == [0]
    assert c.devices[0].memory_bytes >= 128 * 2**30


@pytest.mark.parametrize("spec", ["4xK81", "TPU", "0xK80", "4xcpu", ""])
def test_bad_specs_name_the_spec_and_valid_kinds(spec):
    with pytest.raises(ClusterError) as e:
        parse_cluster(spec)
    msg = str(e.value)
    if spec in ("4xK81", "TPU"):
        assert spec in msg and "K80" in msg and "H100" in msg


def test_json_round_trip(tmp_path):
    c = parse_cluster("2xV100")
    p = tmp_path / "box.json"
    to_json(c, p)
    c2 = parse_cluster(str(p))
    assert c2.device_names == c.device_names
    assert [d.kind for d in c2.devices] == [d.kind for d in c.devices]
    assert np.array_equal(c2.bandwidth, c.bandwidth) and np.array_equal(c2.latency, c.latency)
    assert c2.devices[0].memory_bytes == c.devices[0].memory_bytes


def test_json_round_trip_keeps_link_fractions_and_compute_groups(tmp_path):
    """A calibrated cluster's copy fraction per link, pipelining and compute group survive to_json → parse (a
    fraction of 0.5 once came back as `true`, i.e. 1.0)."""
    from placer.sim.cluster import cluster_from_dict, link_cpu_copy, link_pipelined

    obj = {"devices": [{"name": "/job:w/task:0/device:CPU:0", "kind": "cpu"},
                       {"name": "/job:w/task:1/device:CPU:0", "kind": "cpu"}],
           "links": [[None, {"bandwidth_Bps": 4e9, "latency_s": 3e-4, "pipelined": True, "cpu_copy": 0.5}],
                     [{"bandwidth_Bps": 3e9, "latency_s": 2e-4, "cpu_copy": True}, None]],
           "compute_groups": [{"devices": ["/job:w/task:0/device:CPU:0", "/job:w/task:1/device:CPU:0"],
                               "shared_speed": 0.6}]}
    c = cluster_from_dict(obj, "calibrated")
    p = tmp_path / "c.json"
    to_json(c, p)
    c2 = parse_cluster(str(p))
    assert np.array_equal(link_cpu_copy(c2), link_cpu_copy(c)) and link_cpu_copy(c2)[0, 1] == 0.5
    assert link_cpu_copy(c2)[1, 0] == 1.0
    assert np.array_equal(link_pipelined(c2), link_pipelined(c))
    assert np.array_equal(c2.bandwidth, c.bandwidth) and np.array_equal(c2.latency, c.latency)
    assert c2.meta["compute_groups"] == c.meta["compute_groups"]


def test_json_minimal_and_custom_kind_and_links(tmp_path):
    p = tmp_path / "custom.json"
    p.write_text(json.dumps({
        "devices": [{"name": "/GPU:0", "kind": "K80"},
                    {"name": "/GPU:1", "kind": "Chip", "memory_bytes": 1e10, "peak_flops": 2e13,
                     "mem_bandwidth": 1e12},
                    {"name": "/CPU:0", "kind": "cpu", "concurrency": 8}],
        "bandwidth": [[None, 5e9, 5e9], [5e9, None, 5e9], [5e9, 5e9, None]]}))
    c = parse_cluster(str(p))
    assert c.devices[1].kind == "Chip" and c.devices[1].memory_bytes == 10**10
    assert c.devices[2].concurrency == 8
    assert c.bandwidth[0, 1] == 5e9 and c.latency[0, 1] > 0  # default latency kept


def test_json_errors_name_the_file_and_field(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"devices": [{"name": "/GPU:0", "kind": "Chip"}]}))
    with pytest.raises(ClusterError, match="bad.json.*Chip.*memory_bytes"):
        parse_cluster(str(p))
    p.write_text("{not json")
    with pytest.raises(ClusterError, match="bad.json"):
        parse_cluster(str(p))
    p.write_text(json.dumps({"devices": [{"name": "/GPU:0", "kind": "K80"}], "bandwidth": [[1, 2]]}))
    with pytest.raises(ClusterError, match="1x1"):
        parse_cluster(str(p))
    with pytest.raises(ClusterError, match="does not exist"):
        parse_cluster(str(tmp_path / "missing.json"))


@pytest.mark.parametrize("device, field", [
    ({"name": "/GPU:0", "kind": "K80", "memory_bytes": "lots"}, "memory_bytes"),
    ({"name": "/GPU:0", "kind": "K80", "concurrency": "two"}, "concurrency"),
    ({"name": "/GPU:0", "kind": "Chip", "memory_bytes": 1e10, "peak_flops": 1e13, "mem_bandwidth": 1e11,
      "concurrency": "two"}, "concurrency"),
    ({"name": "/GPU:0", "kind": "K80", "peak_flops": True}, "peak_flops")])
def test_json_device_figure_that_is_no_number_names_file_device_and_field(tmp_path, device, field):
    p = tmp_path / "cl.json"
    p.write_text(json.dumps({"devices": [device, {"name": "/CPU:0", "kind": "cpu"}]}))
    with pytest.raises(ClusterError, match=f"cl.json: device '/GPU:0': \"{field}\" must be a number") as e:
        parse_cluster(str(p))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["bogus", "GPU0", "/GPU:x", ""])
def test_json_device_name_that_is_no_tf_device_names_file_and_device(tmp_path, name):
    """A cluster JSON device must be named as TF names devices (its placements are applied and measured by
    that name): anything else is one line naming the file and the name, never a silently simulated cluster."""
    p = tmp_path / "cl.json"
    p.write_text(json.dumps({"devices": [{"name": "/GPU:0", "kind": "K80"}, {"name": name, "kind": "K80"}]}))
    with pytest.raises(ClusterError, match=f"cl.json: device #1: '{name}' is not a TensorFlow device name") as e:
        parse_cluster(str(p))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("obj", [{"foo": 1}, {"devices": []}])
def test_json_without_devices_is_one_line(tmp_path, obj):
    p = tmp_path / "cl.json"
    p.write_text(json.dumps(obj))
    with pytest.raises(ClusterError, match="cl.json: a cluster JSON needs a non-empty \"devices\" list") as e:
        parse_cluster(str(p))
    assert "\n" not in str(e.value) and "CLUSTER_JSON_DOC" in str(e.value)


def test_a_placement_file_as_cluster_json_is_named_so(tmp_path):
    p = tmp_path / "placement.json"
    p.write_text(json.dumps({"format": 1, "graph_fingerprint": "f", "devices": ["/GPU:0", "/CPU:0"],
                             "placement": {"a": "/GPU:0"}}))
    with pytest.raises(ClusterError) as e:      # it said: device #0 needs at least a "name"
        parse_cluster(str(p))
    assert str(e.value) == f"{p} is a placement file (op → device), not a cluster JSON: pass it as --placement"


def test_cpu_n_logical_devices():
    c = cluster_from_devices("cpu:3")
    assert c.device_names == ["/CPU:0", "/CPU:1", "/CPU:2"]
    assert all(d.kind == "cpu" and d.concurrency == 1 for d in c.devices)
    assert np.isfinite(c.bandwidth[0, 1])
    with pytest.raises(ClusterError):
        cluster_from_devices("cpu:0")


def test_cluster_from_args():
    assert cluster_from_args(argparse.Namespace(cluster="2xK80", devices=None)).num_devices == 3
    assert cluster_from_args(argparse.Namespace(cluster=None, devices="cpu:2")).num_devices == 2
    with pytest.raises(ClusterError, match="--cluster"):
        cluster_from_args(argparse.Namespace(cluster=None, devices=None))


def test_short_device_names():
    assert short_device_name("/job:localhost/replica:0/task:0/device:GPU:1") == "/GPU:1"
    assert short_device_name("/device:CPU:0") == "/CPU:0"
    assert short_device_name("gpu:2") == "/GPU:2"
    assert short_device_name("/job:worker/replica:0/task:1/device:GPU:0").startswith("/job:worker")
    with pytest.raises(ClusterError):
        short_device_name("banana")


def test_tf_device_list_unknown_device_is_clear_error():
    # TF on this machine has no GPU: naming one is a ClusterError listing what TF sees
    with pytest.raises(ClusterError, match=r"/GPU:7.*/CPU:0"):
        cluster_from_devices("/CPU:0,/GPU:7")
    c = cluster_from_devices("/CPU:0")
    assert c.device_names == ["/CPU:0"] and c.devices[0].kind == "cpu"


def test_presets_are_data_with_every_figure():
    for kind, p in PRESETS.items():
        for f in ("memory_bytes", "reserve_bytes", "concurrency", "peak_flops", "mem_bandwidth", "link",
                  "host_link"):
            assert f in p, (kind, f)
        assert p["link"] in LINKS and p["host_link"] in LINKS


def test_links_matrix_sets_per_pair_latency_and_bandwidth(tmp_path):
    p = tmp_path / "links.json"
    ln = {"bandwidth_Bps": 2e9, "latency_s": 3e-4, "shared": None}
    p.write_text(json.dumps({
        "devices": [{"name": "/GPU:0", "kind": "K80"}, {"name": "/GPU:1", "kind": "K80"},
                    {"name": "/CPU:0", "kind": "cpu", "concurrency": 4}],
        "bandwidth": [[None, 5e9, 5e9], [5e9, None, 5e9], [5e9, 5e9, None]],
        "links": [[None, ln, None], [dict(ln, bandwidth_Bps=1e9, shared="pcie-switch"), None, None],
                  [None, None, None]]}))
    c = parse_cluster(str(p))
    assert (c.bandwidth[0, 1], c.latency[0, 1]) == (2e9, 3e-4)          # links win over the plain matrix
    assert c.bandwidth[1, 0] == 1e9 and c.meta["link_shared"] == {"1,0": "pcie-switch"}
    assert c.bandwidth[0, 2] == 5e9 and c.latency[0, 2] == LINKS["pcie3"]["latency"]   # null: default kept
    assert c.devices[2].concurrency == 4
    from placer.graphs.opgraph import OpGraph
    from placer.sim.simulator import Simulator

    g = OpGraph.build([("a", "X", 10**6), ("b", "X", 8)], [("a", "b")])
    sim = Simulator(g, c, np.ones(2))
    assert sim.simulate(np.array([0, 1])).step_time == pytest.approx(2 + 3e-4 + 1e6 / 2e9)   # a -> b over 0->1
    assert sim.simulate(np.array([1, 0])).step_time == pytest.approx(2 + 3e-4 + 1e6 / 1e9)   # over 1->0
    for bad, words in ((["x"], "3x3"), ([[None, {"bandwidth_Bps": -1}, None], [None] * 3, [None] * 3], "> 0"),
                       ([[None, 5, None], [None] * 3, [None] * 3], "object")):
        p.write_text(json.dumps({"devices": [{"name": f"/GPU:{i}", "kind": "K80"} for i in range(3)],
                                 "links": bad}))
        with pytest.raises(ClusterError, match=words):
            parse_cluster(str(p))


def test_cluster_of_a_tasks_file(tmp_path):
    from placer.sim.cluster import cluster_from_reported, cluster_from_tasks

    p = tmp_path / "tasks.json"
    p.write_text(json.dumps({"format": 1, "job": "worker", "tasks": [
        {"address": "127.0.0.1:2222", "pid": None, "cores": [0, 1], "devices": ["/job:worker/task:0/device:CPU:0"]},
        {"address": "127.0.0.1:2223", "pid": None, "cores": [2],
         "devices": ["/job:worker/replica:0/task:1/device:CPU:0", "/job:worker/replica:0/task:1/device:GPU:0"]}]}))
    for c in (cluster_from_devices(str(p)), cluster_from_tasks(str(p))):
        assert c.device_names == ["/job:worker/replica:0/task:0/device:CPU:0",
                                  "/job:worker/replica:0/task:1/device:CPU:0",
                                  "/job:worker/replica:0/task:1/device:GPU:0"]
        assert [d.kind for d in c.devices] == ["cpu", "cpu", "V100"]
        assert [d.concurrency for d in c.devices[:2]] == [2, 1] and c.cpu_index == 0
        assert c.bandwidth[0, 1] == LINKS["grpc"]["bandwidth"] and c.latency[1, 0] == LINKS["grpc"]["latency"]
        assert c.bandwidth[1, 2] == LINKS["pcie3"]["bandwidth"]         # one task: its own host link
    with pytest.raises(ClusterError, match="tasks file"):
        parse_cluster(str(p))                                            # --cluster: the formats stay apart
    # remote measurement workers: the cluster of what they report, never the local TF device list
    c = cluster_from_reported(["/GPU:1", "/CPU:0"], {"h1:50051": ["/CPU:0", "/GPU:0", "/GPU:1"]})
    assert c.device_names == ["/GPU:1", "/CPU:0"] and c.devices[0].kind == "V100"
    with pytest.raises(ClusterError, match="worker h2:50051 has no device /GPU:1"):
        cluster_from_reported(["/GPU:1"], {"h1:50051": ["/GPU:1"], "h2:50051": ["/CPU:0", "/GPU:0"]})


def test_pipelined_link_lets_transfers_share_the_latency(tmp_path):
    """Two tensors sent back to back over link 0->1: a FIFO link serialises latency + bytes/bandwidth each; a
    pipelined one (gRPC between TF tasks) only the bytes, each arriving the latency after its bytes."""
    from placer.graphs.opgraph import OpGraph
    from placer.sim.cluster import to_json
    from placer.sim.simulator import Simulator

    def cluster(pipelined: bool):
        p = tmp_path / f"c{int(pipelined)}.json"
        ln = {"bandwidth_Bps": 1e6, "latency_s": 0.5, "shared": None, **({"pipelined": True} if pipelined else {})}
        p.write_text(json.dumps({"devices": [{"name": "/CPU:0", "kind": "cpu"}, {"name": "/CPU:1", "kind": "cpu"}],
                                 "links": [[None, ln], [ln, None]]}))
        return parse_cluster(str(p))

    g = OpGraph.build([("a", "X", 10**6), ("b", "X", 10**6), ("c", "X", 8)], [("a", "c"), ("b", "c")])
    pl = np.array([0, 0, 1])
    cost = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    fifo, pipe = cluster(False), cluster(True)
    assert Simulator(g, fifo, cost).simulate(pl).step_time == pytest.approx(2 * (1 + 0.5) + 1)
    assert Simulator(g, pipe, cost).simulate(pl).step_time == pytest.approx(2 * 1 + 0.5 + 1)
    assert pipe.meta["link_pipelined"] == ["0,1", "1,0"]
    again = parse_cluster(to_json(pipe, tmp_path / "again.json") and str(tmp_path / "again.json"))
    assert again.meta["link_pipelined"] == ["0,1", "1,0"]                 # written and read back


def test_compute_group_slows_devices_that_share_a_core(tmp_path):
    """Two tasks on one physical core (SMT siblings): while both compute, each runs at shared_speed."""
    from placer.graphs.opgraph import OpGraph
    from placer.problem import cluster_without
    from placer.sim.cluster import to_json
    from placer.sim.simulator import Simulator

    devs = [{"name": f"/CPU:{i}", "kind": "cpu", "concurrency": 1} for i in range(3)]
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"devices": devs, "compute_groups": [{"devices": ["/CPU:0", "/CPU:1"],
                                                                   "shared_speed": 0.5}]}))
    c = parse_cluster(str(p))
    g = OpGraph.build([("a", "X", 8), ("b", "X", 8)], [])
    cost = np.ones((2, 3))
    sim = Simulator(g, c, cost)
    assert sim.simulate(np.array([0, 1])).step_time == pytest.approx(2.0)    # both busy for 1 s at half speed
    assert sim.simulate(np.array([0, 2])).step_time == pytest.approx(1.0)    # /CPU:2 has a core of its own
    assert sim.simulate(np.array([0, 0])).step_time == pytest.approx(2.0)    # one after the other
    again = parse_cluster(to_json(c, tmp_path / "again.json") and str(tmp_path / "again.json"))
    assert again.meta["compute_groups"] == [{"devices": [0, 1], "shared_speed": 0.5}]
    survivors, _ = cluster_without(c, ["/CPU:0"])
    assert survivors.meta["compute_groups"] == []                            # one member left: no group
    p.write_text(json.dumps({"devices": devs, "compute_groups": [{"devices": ["/CPU:0", "/CPU:9"],
                                                                   "shared_speed": 0.5}]}))
    with pytest.raises(ClusterError, match="compute_groups"):
        parse_cluster(str(p))
