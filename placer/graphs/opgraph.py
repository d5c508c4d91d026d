"""`OpGraph`: the immutable, array-based view of a training-step graph that every room consumes.

Ops are indexed 0..n-1 in a topological order (data + control edges). Everything per-op is a numpy
array so hot loops (simulator, policy features) never touch TensorFlow protos. The runnable
MetaGraphDef (when the graph came from TensorFlow) rides along as serialized bytes.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from placer._npz import load_npz
from placer.errors import GraphImportError


class UnionFind:
    """Disjoint sets of 0..n-1 (scipy's `DisjointSet`), each named by a representative element: at first each
    element itself; `union(a, b)` keeps a's representative. So a set's name depends only on the order of the
    unions (never on the library's balancing), and so do co-location group ids and groupings.

    >>> u = UnionFind(4)
    >>> u.union(2, 0), u.union(3, 0)      # 0 joins 2's set, then 2's set joins 3's
    (2, 3)
    >>> [u.find(i) for i in range(4)]
    [3, 1, 3, 3]
    """

    def __init__(self, n: int):
        from scipy.cluster.hierarchy import DisjointSet

        self._sets = DisjointSet(range(n))
        self._rep = np.arange(n)   # by the library's root

    def find(self, x: int) -> int:
        return int(self._rep[self._sets[x]])

    def union(self, a: int, b: int) -> int:
        """Merge b's set into a's; returns the merged set's representative (a's)."""
        ra = self.find(a)
        self._sets.merge(a, b)
        self._rep[self._sets[a]] = ra
        return ra


@dataclass(frozen=True, eq=False)
class OpGraph:
    """A training-step graph.

    Per op i (arrays of length n):
      names[i], types[i]          TF op name and type
      out_bytes[i]                total bytes of op i's outputs (sum over its tensors)
      persistent_bytes[i]         bytes held for the whole step (variables, optimizer slots); 0 otherwise
      flops[i]                    floating-point operations (0 when unknown / not compute)
      colocation[i]               co-location group id (ops sharing an id must share a device)
      cpu_only[i]                 True when the op (or its co-location group) has no GPU kernel
    Tensors (arrays of length T): tensor_op[t] producer op, tensor_bytes[t] size.
    Data edges (length E): edge_src[e] -> edge_dst[e] carrying tensor edge_tensor[e]
      (one edge per (tensor, consumer op) pair; an op consuming a tensor twice has one edge).
    Control edges (length C): ctrl_src[c] -> ctrl_dst[c].
    """

    names: tuple[str, ...]
    types: tuple[str, ...]
    out_bytes: np.ndarray
    persistent_bytes: np.ndarray
    flops: np.ndarray
    colocation: np.ndarray
    cpu_only: np.ndarray
    tensor_op: np.ndarray
    tensor_bytes: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_tensor: np.ndarray
    ctrl_src: np.ndarray
    ctrl_dst: np.ndarray
    fingerprint: str = ""
    name: str = "graph"
    fetches: tuple[str, ...] = ()
    meta_graph: bytes | None = field(default=None, repr=False)  # serialized runnable MetaGraphDef
    precision: str = "fp32"   # compute precision (fp32 | fp16 | bf16): --precision, or the imported matmuls' dtype

    # ---- basic facts -------------------------------------------------------------------
    @property
    def num_ops(self) -> int:
        return len(self.names)

    def __len__(self) -> int:
        return len(self.names)

    @property
    def num_edges(self) -> int:
        """Data + control edges (as `placer inspect` reports them)."""
        return int(len(self.edge_src) + len(self.ctrl_src))

    @property
    def num_colocation_groups(self) -> int:
        return int(len(np.unique(self.colocation))) if self.num_ops else 0

    def index(self, name: str) -> int:
        """Index of the op called `name` (raises GraphImportError naming it when absent)."""
        idx = self._name_index
        if name not in idx:
            raise GraphImportError(f"op {name!r} is not in graph {self.name!r}")
        return idx[name]

    @property
    def _name_index(self) -> dict[str, int]:
        cache = self.__dict__.get("_name_index_cache")
        if cache is None:
            cache = {n: i for i, n in enumerate(self.names)}
            object.__setattr__(self, "_name_index_cache", cache)
        return cache

    def op_type_counts(self) -> dict[str, int]:
        types, counts = np.unique(np.asarray(self.types, dtype=object), return_counts=True)
        return {str(t): int(c) for t, c in sorted(zip(types, counts), key=lambda x: (-x[1], x[0]))}

    def meta_graph_def(self):
        """The runnable MetaGraphDef (parsed lazily; needs TensorFlow)."""
        if self.meta_graph is None:
            raise GraphImportError(f"graph {self.name!r} was built by hand and carries no runnable TensorFlow graph")
        from tensorflow.core.protobuf import meta_graph_pb2

        mg = meta_graph_pb2.MetaGraphDef()
        mg.ParseFromString(self.meta_graph)
        return mg

    # ---- construction -------------------------------------------------------------------
    @staticmethod
    def build(
        ops: Sequence[tuple],
        edges: Iterable[tuple] = (),
        control: Iterable[tuple[str, str]] = (),
        *,
        colocate: Iterable[Sequence[str]] = (),
        name: str = "graph",
        fetches: Sequence[str] = (),
        meta_graph: bytes | None = None,
        fingerprint: str | None = None,
        precision: str = "fp32",
    ) -> "OpGraph":
        """Build an OpGraph from plain records (tests and hand-made graphs use this; importers too).

        ops:   (name, type, out_bytes[, persistent_bytes[, flops[, cpu_only]]]) — one tensor per op
               output; out_bytes may be an int or a list of ints (one per output tensor).
        edges: (src, dst) or (src, dst, output_index) — data edges (op names).
        control: (src, dst) control edges.
        colocate: lists of op names that must share a device.
        precision: the step's compute precision (fp32 | fp16 | bf16: what its matmuls run in).
        Ops may be given in any order; they are sorted topologically (a cycle is an error).

        >>> g = OpGraph.build([("a", "Const", 4), ("b", "Neg", 4)], [("a", "b")])
        >>> g.num_ops, g.num_edges
        (2, 1)
        """
        n = len(ops)
        names = [str(o[0]) for o in ops]
        if len(set(names)) != n:
            dup = sorted({x for x in names if names.count(x) > 1})[:3]
            raise GraphImportError(f"duplicate op names: {dup}")
        pos = {nm: i for i, nm in enumerate(names)}

        def _idx(nm: str, what: str) -> int:
            if nm not in pos:
                raise GraphImportError(f"{what} names unknown op {nm!r}")
            return pos[nm]

        # tensors
        t_op, t_bytes, first_tensor = [], [], []
        for i, o in enumerate(ops):
            ob = o[2]
            outs = list(ob) if isinstance(ob, (list, tuple)) else [ob]
            first_tensor.append(len(t_op))
            for b in outs:
                t_op.append(i)
                t_bytes.append(int(b))
        n_out = [(first_tensor[i + 1] if i + 1 < n else len(t_op)) - first_tensor[i] for i in range(n)]
        es, ed, et = [], [], []
        seen = set()
        for e in edges:
            s, d = _idx(e[0], "edge"), _idx(e[1], "edge")
            k = int(e[2]) if len(e) > 2 else 0
            if k >= n_out[s]:
                raise GraphImportError(f"edge {e[0]}:{k} -> {e[1]}: op {e[0]!r} has only {n_out[s]} outputs")
            t = first_tensor[s] + k
            if (t, d) in seen:
                continue
            seen.add((t, d))
            es.append(s), ed.append(d), et.append(t)
        cs, cd = [], []
        for s_, d_ in control:
            cs.append(_idx(s_, "control edge")), cd.append(_idx(d_, "control edge"))

        sets = UnionFind(n)
        for grp in colocate:
            ids = [_idx(x, "colocation") for x in grp]
            for x in ids[1:]:
                sets.union(ids[0], x)
        order = _topo_order(n, np.asarray(es + cs, dtype=np.int64), np.asarray(ed + cd, dtype=np.int64), names)
        inv = np.empty(n, dtype=np.int64)
        inv[order] = np.arange(n)
        # re-index tensors in op order
        t_op_arr = inv[np.asarray(t_op, dtype=np.int64)] if t_op else np.zeros(0, np.int64)
        t_perm = np.argsort(t_op_arr, kind="stable")
        t_inv = np.empty(len(t_perm), dtype=np.int64)
        t_inv[t_perm] = np.arange(len(t_perm))

        def col(j, default, dtype):
            return np.asarray([(o[j] if len(o) > j else default) for o in ops], dtype=dtype)[order]

        out_b = np.asarray([sum(o[2]) if isinstance(o[2], (list, tuple)) else int(o[2]) for o in ops], np.int64)[order]
        # group ids: the representatives' ranks in the given op order
        _, coloc = np.unique(np.fromiter((sets.find(i) for i in range(n)), np.int64, n)[order], return_inverse=True)
        cpu_only = col(5, False, bool)
        # a co-location group with a CPU-only member is CPU-only as a whole
        if cpu_only.any():
            bad = np.unique(coloc[cpu_only])
            cpu_only = np.isin(coloc, bad)
        g = OpGraph(
            names=tuple(names[i] for i in order),
            types=tuple(str(ops[i][1]) for i in order),
            out_bytes=out_b,
            persistent_bytes=col(3, 0, np.int64),
            flops=col(4, 0.0, np.float64),
            colocation=coloc.astype(np.int32),
            cpu_only=cpu_only,
            tensor_op=t_op_arr[t_perm].astype(np.int32),
            tensor_bytes=np.asarray(t_bytes, np.int64)[t_perm],
            edge_src=inv[np.asarray(es, np.int64)].astype(np.int32),
            edge_dst=inv[np.asarray(ed, np.int64)].astype(np.int32),
            edge_tensor=t_inv[np.asarray(et, np.int64)].astype(np.int32) if et else np.zeros(0, np.int32),
            ctrl_src=inv[np.asarray(cs, np.int64)].astype(np.int32),
            ctrl_dst=inv[np.asarray(cd, np.int64)].astype(np.int32),
            name=name,
            fetches=tuple(fetches),
            meta_graph=meta_graph,
            fingerprint=fingerprint or "",
            precision=precision,
        )
        if not fingerprint:
            object.__setattr__(g, "fingerprint", g.structural_fingerprint())
        return g

    def structural_fingerprint(self) -> str:
        h = hashlib.sha256()
        h.update("\0".join(self.names).encode())
        h.update("\0".join(self.types).encode())
        for a in (self.out_bytes, self.tensor_bytes, self.edge_src, self.edge_dst, self.ctrl_src, self.ctrl_dst):
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()[:16]

    # ---- persistence (cache) --------------------------------------------------------------
    _ARRAYS = ("out_bytes", "persistent_bytes", "flops", "colocation", "cpu_only", "tensor_op", "tensor_bytes",
               "edge_src", "edge_dst", "edge_tensor", "ctrl_src", "ctrl_dst")

    _PER_OP = ("out_bytes", "persistent_bytes", "flops", "colocation", "cpu_only")
    SAVE_FORMAT = 2   # 1 (pickled object arrays) is no longer read

    def save(self, path) -> None:
        """Save to an .npz of plain numeric arrays: the per-op/tensor/edge arrays, the MetaGraphDef bytes (uint8)
        and a JSON header (uint8: names, types, fetches, fingerprint, name). No pickles."""
        header = {"format": self.SAVE_FORMAT, "names": list(self.names), "types": list(self.types),
                  "fetches": list(self.fetches), "fingerprint": self.fingerprint, "name": self.name,
                  "has_meta_graph": self.meta_graph is not None, "precision": self.precision}
        np.savez(
            path,
            header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8),
            meta_graph=np.frombuffer(self.meta_graph or b"", dtype=np.uint8),
            **{k: getattr(self, k) for k in self._ARRAYS},
        )

    @staticmethod
    def load(path) -> "OpGraph":
        """Read a file written by :meth:`save` (``allow_pickle=False``); GraphImportError when it is unreadable,
        inconsistent or of another format."""
        try:
            with load_npz(path) as z:
                h = json.loads(z["header"].tobytes().decode())
                if h.get("format") != OpGraph.SAVE_FORMAT:
                    raise ValueError(f"format {h.get('format')!r}, expected {OpGraph.SAVE_FORMAT}")
                arrays = {k: z[k] for k in OpGraph._ARRAYS}
                meta = z["meta_graph"].tobytes() if h["has_meta_graph"] else None
            g = OpGraph(names=tuple(h["names"]), types=tuple(h["types"]), fetches=tuple(h["fetches"]),
                        fingerprint=str(h["fingerprint"]), name=str(h["name"]), meta_graph=meta,
                        precision=str(h.get("precision", "fp32")), **arrays)
            g._check_shapes()
            return g
        except Exception as e:  # noqa: BLE001 - any unreadable cache file is one clear error
            raise GraphImportError(f"cannot read cached graph {path}: {e}") from e

    def _check_shapes(self) -> None:
        """Raise ValueError unless the arrays agree with each other (lengths, index ranges)."""
        n, t = self.num_ops, len(self.tensor_op)
        sizes = {k: n for k in self._PER_OP} | {"types": n, "tensor_op": t, "tensor_bytes": t,
                                                "edge_dst": len(self.edge_src), "edge_tensor": len(self.edge_src),
                                                "ctrl_dst": len(self.ctrl_src)}
        for k, m in sizes.items():
            if len(getattr(self, k)) != m:
                raise ValueError(f"{k} has {len(getattr(self, k))} entries, expected {m}")
        for k, m in (("tensor_op", n), ("edge_src", n), ("edge_dst", n), ("edge_tensor", t), ("ctrl_src", n),
                     ("ctrl_dst", n)):
            a = getattr(self, k)
            if len(a) and (a.min() < 0 or a.max() >= m):
                raise ValueError(f"{k} indexes outside 0..{m - 1}")


def _topo_order(n: int, src: np.ndarray, dst: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """Topological order, stable: of the ops ready, the first given goes first (Kahn's algorithm with a heap,
    networkx's `lexicographical_topological_sort`). Raises GraphImportError naming a cycle's ops."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(zip(src.tolist(), dst.tolist()))
    try:
        return np.fromiter(nx.lexicographical_topological_sort(g), np.int64, n)
    except nx.NetworkXUnfeasible:
        cycle = [names[u] for u, _ in nx.find_cycle(g)]
        raise GraphImportError(f"the graph has a cycle through ops {cycle[:5]}") from None


# ops whose output is the variable's own buffer on the variable's device: TF's ReadVariableOp kernel returns the
# variable tensor itself (resource_variable_ops.cc, `ctx->set_output(0, *variable->tensor())`; an update while
# a read is alive copies on write), so a read allocates nothing where it runs; a copy sent elsewhere does
ALIASING_OP_TYPES = frozenset({"ReadVariableOp"})


def aliases_variable(g: "OpGraph") -> np.ndarray:
    """bool[n]: the op's output aliases a variable's persistent buffer (allocates no memory of its own)."""
    return np.fromiter((t in ALIASING_OP_TYPES for t in g.types), bool, g.num_ops)
