"""m-TOPO: memory-constrained topological placement (Baechi, SoCC 2020, `TopoUniformWithColocation`).

Rule: walk the ops in topological order and fill the GPUs one after another. A device takes ops until
the next co-location group (its whole memory, reserved when its first op is met) would push it past
`⌈total model memory / N⌉` (so memory spreads evenly) or past its capacity; then the walk moves on to the
next GPU (an empty GPU always takes one group; the last GPU takes the rest up to its capacity; a group
that fits nowhere on the way goes to the GPU with the most free memory). Baechi adds
the largest group as slack to the per-device limit, which can leave the last GPUs empty; we do not. Ops of a group already placed follow their group; CPU-only ops go to the CPU.
When the last GPU is full, PlacementError names the op, memory needed and available.

Forward-operator placement (`colocate_gradients`): see `placer.baselines._common.with_gradient_fallback`.
"""
from __future__ import annotations

import numpy as np

from placer.baselines._common import group_fixed_device, memory_error, prepare, with_gradient_fallback
from placer.graphs.opgraph import OpGraph
from placer.sim.cluster import Cluster


def m_topo(graph: OpGraph, cluster: Cluster, costs=None, *, colocate_gradients: bool | None = None) -> np.ndarray:
    """Topological-order, memory-balanced placement: op→device index array.

    >>> import numpy as np
    >>> from placer.sim.cluster import Cluster, Device
    >>> g = OpGraph.build([(f"op{i}", "X", 100) for i in range(4)], [(f"op{i}", f"op{i+1}") for i in range(3)])
    >>> devs = tuple(Device(f"/GPU:{i}", "X", 2**30) for i in range(2))
    >>> m_topo(g, Cluster(devs, np.full((2, 2), 1e9), np.zeros((2, 2)))).tolist()
    [0, 0, 1, 1]
    """
    def run(cg: bool) -> np.ndarray:
        p = prepare(graph, cluster, costs, colocate_gradients=cg)
        fixed = group_fixed_device(p)
        gpus = [int(d) for d in p.gpus]
        free_groups = fixed < 0
        total = int(p.group_mem[free_groups].sum())
        limit = -(-total // max(len(gpus), 1))
        used = np.zeros(p.D, np.int64)
        gdev = fixed.copy()
        for g in np.flatnonzero(fixed >= 0):
            used[fixed[g]] += p.group_mem[g]
        ops_of = np.argsort(p.group, kind="stable")
        ops_ptr = np.searchsorted(p.group[ops_of], np.arange(p.num_groups + 1))
        charged: set[tuple[int, int]] = set()  # (kept tensor, device) copies already counted

        def copies(g: int, d: int) -> list[int]:
            """Kept tensors the group's backward ops would copy onto d (producer placed elsewhere, not there yet)."""
            out = []
            for i in ops_of[ops_ptr[g]:ops_ptr[g + 1]]:
                for t in p.kin_tensor[p.kin_ptr[i]:p.kin_ptr[i + 1]]:
                    pd = gdev[p.group[p.t_op[t]]]
                    if pd >= 0 and pd != d and (int(t), d) not in charged:
                        out.append(int(t))
            return out

        def need(g: int, d: int) -> int:
            return int(p.group_mem[g]) + int(sum(p.t_bytes[t] for t in set(copies(g, d))))

        cur = 0
        for g in np.argsort(p.group_first, kind="stable"):  # groups in the topological order of their first op
            if gdev[g] >= 0:
                continue
            while cur < len(gpus):
                d = gpus[cur]
                last = cur == len(gpus) - 1
                nd = need(g, d)
                fits = p.group_allowed[g, d] and used[d] + nd <= p.capacity[d]
                if fits and (last or used[d] + nd <= limit or used[d] == 0):
                    break  # (an empty device always takes one group, even one bigger than the limit)
                cur += 1
            if cur < len(gpus):
                d = gpus[cur]
            else:
                # past the last GPU: the GPU with the most free memory that can take the group (fragmentation)
                cur = len(gpus) - 1
                free = [p.capacity[e] - used[e] - need(g, e) if p.group_allowed[g, e] else -1 for e in gpus]
                d = gpus[int(np.argmax(free))]
                if max(free) < 0:
                    needs = np.zeros(p.D, np.int64)
                    needs[gpus] = [need(g, e) for e in gpus]
                    raise memory_error(p, int(g), used, gpus, "m_topo", need=needs)
            used[d] += need(g, d)
            charged.update((t, d) for t in copies(g, d))
            gdev[g] = d
        return gdev[p.group]

    return with_gradient_fallback(run, colocate_gradients)
