"""Scotch graph partitioning (the papers' "Scotch" baseline; Pellegrini's static mapper, via `pyscotch`).

Rule: the same contracted graph as `metis` (co-location groups; vertex weight = compute seconds, edge
weight = bytes; CPU-only groups fixed to the CPU) mapped onto a complete graph of N GPUs with Scotch's
default mapping strategy (`pyscotch.Graph.partition`, in a deterministic Scotch context seeded with `seed` and run
on one thread: Scotch's "deterministic" option holds for a given thread count, and by default it takes as many
threads as the process may use cores, so gpt on DGX1 mapped to 0.421 s on two cores and 0.427 s on one). Memory
is re-balanced as in `metis` (PlacementError when the model cannot fit).
"""
from __future__ import annotations

import contextlib
import io

import numpy as np

from placer.baselines._common import partition_placement, prepare, to_int_weights
from placer.errors import PlacementError
from placer.graphs.opgraph import OpGraph
from placer.sim.cluster import Cluster


def _pyscotch():
    # pyscotch prints two "✓ Loaded Scotch" lines to stderr on first use; keep CLI output clean
    with contextlib.redirect_stderr(io.StringIO()):
        import pyscotch
        from pyscotch import Context, Graph

        pyscotch.get_scotch_dtype()
    return pyscotch, Graph, Context


def _one_thread(ctx) -> None:
    """Run the context's mapping on one thread (`SCOTCH_contextThreadSpawn(ctx, 1, NULL)`), whatever the cores:
    the same result on every machine. A libscotch without threads (the symbol missing) is one thread already."""
    import ctypes

    from pyscotch import libscotch as lib

    try:
        spawn = lib.SCOTCH_contextThreadSpawn
    except AttributeError:
        return
    spawn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    spawn.restype = ctypes.c_int
    if spawn(ctypes.addressof(ctx._ctx), 1, None) != 0:
        raise PlacementError("scotch: cannot set the mapping context to one thread")


def available() -> bool:
    """True when pyscotch imports and its bundled libscotch loads."""
    try:
        _pyscotch()
        return True
    except Exception:  # noqa: BLE001 - any load failure means "not available"
        return False


def scotch_placement(graph: OpGraph, cluster: Cluster, costs=None, seed: int = 0) -> np.ndarray:
    """Scotch k-way mapping over the N GPUs: op→device index array.

    >>> import numpy as np
    >>> from placer.sim.cluster import Cluster, Device
    >>> ops = [(f"{s}{i}", "X", 4, 0, 1e9) for s in "ab" for i in range(3)]
    >>> edges = [("a0", "a1"), ("a1", "a2"), ("b0", "b1"), ("b1", "b2"), ("a2", "b2")]
    >>> devs = tuple(Device(f"/GPU:{i}", "X", 2**30) for i in range(2))
    >>> pl = scotch_placement(OpGraph.build(ops, edges), Cluster(devs, np.full((2, 2), 1e9), np.zeros((2, 2))))
    >>> sorted(np.bincount(pl).tolist())
    [3, 3]
    """
    _, Graph, Context = _pyscotch()

    def part(cg, k: int) -> np.ndarray:
        sg, ctx, bound = Graph(), None, None
        try:
            ew = to_int_weights(cg.eweight) if len(cg.adjncy) else None
            sg.build(cg.xadj, cg.adjncy, velotab=to_int_weights(cg.vweight), edlotab=ew)
            # Scotch 7 maps with threads: a context with the deterministic option and a fixed seed makes the
            # result reproducible (SCOTCH_OPTIONNUMDETERMINISTIC = 0, SCOTCH_OPTIONNUMRANDOMFIXEDSEED = 1)
            ctx = Context()
            ctx.option_set(0, 1)
            ctx.option_set(1, 1)
            ctx.random_seed(int(seed))
            _one_thread(ctx)
            bound = ctx.bind_graph(sg)
            return np.asarray(bound.partition(k), np.int64)
        except (RuntimeError, ValueError) as e:
            raise PlacementError(f"scotch: partitioning graph {graph.name!r} failed: {e}") from e
        finally:
            for obj in (bound, ctx, sg):
                if obj is not None:
                    obj.close()

    return partition_placement(prepare(graph, cluster, costs), part, "scotch")
