"""`OpGraph`: the immutable, array-based view of a training-step graph that every room consumes.

Ops are indexed 0..n-1 in a topological order (data + control edges). Everything per-op is a numpy
array so hot loops (simulator, policy features) never touch TensorFlow protos. The runnable
MetaGraphDef (when the graph came from TensorFlow) rides along as serialized bytes.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from placer.errors import GraphImportError


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
    ) -> "OpGraph":
        """Build an OpGraph from plain records (tests and hand-made graphs use this; importers too).

        ops:   (name, type, out_bytes[, persistent_bytes[, flops[, cpu_only]]]) — one tensor per op
               output; out_bytes may be an int or a list of ints (one per output tensor).
        edges: (src, dst) or (src, dst, output_index) — data edges (op names).
        control: (src, dst) control edges.
        colocate: lists of op names that must share a device.
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

        # colocation: union-find
        parent = list(range(n))

        def find(x):
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for grp in colocate:
            ids = [_idx(x, "colocation") for x in grp]
            for x in ids[1:]:
                ra, rb = find(ids[0]), find(x)
                if ra != rb:
                    parent[rb] = ra

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
        roots = np.asarray([find(i) for i in range(n)], dtype=np.int64)[order]
        _, coloc = np.unique(roots, return_inverse=True)
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

    def save(self, path) -> None:
        """Save to an .npz file (arrays, names, the MetaGraphDef bytes)."""
        arrs = {k: getattr(self, k) for k in self._ARRAYS}
        np.savez(
            path,
            names=np.asarray(self.names, dtype=object),
            types=np.asarray(self.types, dtype=object),
            fetches=np.asarray(self.fetches, dtype=object),
            header=np.asarray([self.fingerprint, self.name], dtype=object),
            meta_graph=np.frombuffer(self.meta_graph or b"", dtype=np.uint8),
            has_meta=np.asarray(self.meta_graph is not None),
            **arrs,
        )

    @staticmethod
    def load(path) -> "OpGraph":
        try:
            z = np.load(path, allow_pickle=True)
            fp, nm = (str(x) for x in z["header"])
            return OpGraph(
                names=tuple(str(x) for x in z["names"]),
                types=tuple(str(x) for x in z["types"]),
                fetches=tuple(str(x) for x in z["fetches"]),
                fingerprint=fp,
                name=nm,
                meta_graph=z["meta_graph"].tobytes() if bool(z["has_meta"]) else None,
                **{k: z[k] for k in OpGraph._ARRAYS},
            )
        except Exception as e:  # noqa: BLE001 - any unreadable cache file is one clear error
            raise GraphImportError(f"cannot read cached graph {path}: {e}") from e


def _topo_order(n: int, src: np.ndarray, dst: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """Kahn's algorithm, stable (ties keep the given order). Raises GraphImportError on a cycle."""
    import heapq

    indeg = np.bincount(dst, minlength=n).astype(np.int64) if len(dst) else np.zeros(n, np.int64)
    succ_order = np.argsort(src, kind="stable")
    starts = np.searchsorted(src[succ_order], np.arange(n + 1)) if len(src) else np.zeros(n + 1, np.int64)
    succ = dst[succ_order]
    heap = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        i = heapq.heappop(heap)
        out.append(i)
        for j in succ[starts[i]:starts[i + 1]]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(heap, int(j))
    if len(out) != n:
        stuck = [names[i] for i in range(n) if indeg[i] > 0][:5]
        raise GraphImportError(f"the graph has a cycle through ops {stuck}")
    return np.asarray(out, dtype=np.int64)


# ops whose output is the variable's own buffer on the variable's device: TF's ReadVariableOp kernel returns the
# variable tensor itself (resource_variable_ops.cc, `ctx->set_output(0, *variable->tensor())`; an update while
# a read is alive copies on write), so a read allocates nothing where it runs; a copy sent elsewhere does
ALIASING_OP_TYPES = frozenset({"ReadVariableOp"})


def aliases_variable(g: "OpGraph") -> np.ndarray:
    """bool[n]: the op's output aliases a variable's persistent buffer (allocates no memory of its own)."""
    return np.fromiter((t in ALIASING_OP_TYPES for t in g.types), bool, g.num_ops)
