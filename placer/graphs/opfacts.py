"""Facts about the ops of an imported step, read from TensorFlow: output bytes, persistent bytes, FLOPs, whether
an op can run on a GPU (TF's kernel registry), co-location, and what values an integer input may take.

    g = tf.Graph(); ...                                   # the cleaned step, imported
    recs, edges, control, coloc = op_records(g, keep, graph_def, where="model 'nmt'")
    OpGraph.build(recs, edges, control, colocate=coloc)

Rules (also in :mod:`placer.graphs.load`'s docstring): output bytes = dtype size x elements of the shapes TF
infers (resource/variant/string elements count ``HANDLE_BYTES``; an unknown dimension counts as
``UNKNOWN_DIM_FALLBACK``, a lower bound, and a warning names the first few such ops); persistent bytes = a
variable's full size on its variable op; flops = ``ops.get_stats_for_node_def(..., "flops")`` where TF registers
it, else 0 (a kept call/If/Case carries its largest body's flops); cpu_only = the op type has no GPU (or DEFAULT)
kernel; co-location = every consumer of a resource/ref tensor with that tensor's producer, plus ``_class`` attrs.
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)

UNKNOWN_DIM_FALLBACK = 1
HANDLE_BYTES = 8
VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable"})
CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall", "If", "StatelessIf", "Case", "StatelessCase"})
CALL_HOLDS_VARIABLES_WARN = 8   # a kept call/If/Case reading this many variables holds them on one device: warn
# feed limits: ops that pass integer values on unchanged (followed to the ops that index with them); of `Unique`
# only the values (output 0) are followed, its positions are valid by construction; ops whose validity does not
# depend on the values at all
INDEX_PASS_OPS = frozenset({"Identity", "Unpack", "Reshape", "Squeeze", "ExpandDims", "StridedSlice", "Slice",
                            "Split", "SplitV", "Transpose", "Pack", "ConcatV2", "Cast", "Unique"})
VALUE_AGNOSTIC_OPS = frozenset({"Shape", "Size", "Rank", "ZerosLike", "OnesLike"})
# op types that run on tensor cores in 16-bit precision (the rest keep their fp32-rate / bandwidth estimate)
TENSOR_CORE_OPS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum", "Conv2D",
                             "Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv3D", "DepthwiseConv2dNative",
                             "_FusedMatMul", "_FusedConv2D"})
_PRECISION_OF_DTYPE = {"float16": "fp16", "bfloat16": "bf16"}


def node_flops(graph, node_def) -> float:
    """TF's registered FLOP statistic for one node (raises when none is registered). TF's flops registry calls a
    deprecated shape helper that logs an "Instructions for updating" warning: silenced here."""
    from tensorflow.python.framework import ops as tf_ops
    from tensorflow.python.util import deprecation

    with deprecation.silence():
        return float(tf_ops.get_stats_for_node_def(graph, node_def, "flops").value or 0)


_CPU_ONLY_CACHE: dict[str, bool] = {}


def cpu_only(op_type: str, library_names: set[str] = frozenset()) -> bool:
    """True when TF registers kernels for `op_type` but none for GPU (nor a DEFAULT one). Library functions and
    op types without kernels are not pinned."""
    if op_type in library_names:
        return False
    r = _CPU_ONLY_CACHE.get(op_type)
    if r is None:
        from tensorflow.python.framework import kernels

        try:
            devs = {k.device_type for k in kernels.get_registered_kernels_for_op(op_type).kernel}
        except Exception:  # noqa: BLE001
            devs = set()
        # DEFAULT kernels (NoOp, VarHandleOp, ReadVariableOp...) run on any device, GPUs included;
        # an op with no kernels at all (e.g. a function name) is not pinned either
        r = bool(devs) and not (devs & {"GPU", "DEFAULT"})
        _CPU_ONLY_CACHE[op_type] = r
    return r


def tensor_bytes(t, unknown: list) -> int:
    """Bytes of tensor `t` (see the module docstring); appends t's op name to `unknown` when a dim is unknown."""
    import tensorflow as tf

    dt = t.dtype.base_dtype
    size = HANDLE_BYTES if dt in (tf.resource, tf.variant, tf.string) else dt.size
    shape = t.shape
    if shape.rank is None:
        unknown.append(t.op.name)
        return size * UNKNOWN_DIM_FALLBACK
    n = 1
    bad = False
    for d in shape.as_list():
        if d is None:
            bad = True
            n *= UNKNOWN_DIM_FALLBACK
        else:
            n *= d
    if bad:
        unknown.append(t.op.name)
    return int(size * n)


def op_records(g, keep: set[str], gd, where: str, unknown_level: int = logging.WARNING):
    """Records for :meth:`OpGraph.build` of the ops of tf.Graph `g` named in `keep` (in g's op order):
    (ops, data edges, control edges, co-location lists). `gd` supplies the function library."""
    import tensorflow as tf

    lib = {f.signature.name: f for f in gd.library.function}
    lib_names = set(lib)
    ops_rec, edges, control = [], [], []
    coloc: list[list[str]] = []
    class_groups: dict[str, list[str]] = {}
    unknown: list[str] = []
    for op in g.get_operations():
        if op.name not in keep:
            continue
        outs = [tensor_bytes(t, unknown) for t in op.outputs]
        persistent = 0
        if op.type in VARIABLE_OPS:
            dt = tf.as_dtype(op.get_attr("dtype"))
            shp = tf.TensorShape(op.get_attr("shape"))
            if shp.is_fully_defined():
                persistent = int(dt.size * shp.num_elements())
            else:
                unknown.append(op.name)
        flops = 0.0
        try:
            flops = node_flops(g, op.node_def)
        except Exception:  # noqa: BLE001 - no statistics registered for this op type
            flops = 0.0
        if op.type in CALL_OPS or op.type in lib_names:
            flops = _call_flops(op, lib)
        ops_rec.append((op.name, op.type, outs, persistent, flops, cpu_only(op.type, lib_names)))
        held = 0
        for inp in op.inputs:
            edges.append((inp.op.name, op.name, inp.value_index))
            dt = inp.dtype
            if dt.base_dtype == tf.resource or dt._is_ref_dtype:  # noqa: SLF001
                coloc.append([inp.op.name, op.name])
                held += inp.op.type in VARIABLE_OPS
        if held >= CALL_HOLDS_VARIABLES_WARN and op.type in CALL_OPS:
            log.warning("%s: %s op %r reads %d variables, so all of them share its device: the model cannot be "
                        "split across them (a Keras LossScaleOptimizer's cond(all gradients finite) does this; "
                        "import the compiled Keras model itself, which placer traces without that cond)",
                        where, op.type, op.name, held)
        for c in sorted(op.control_inputs, key=lambda c: c.name):   # TF's order varies from run to run
            control.append((c.name, op.name))
        try:
            groups = op.colocation_groups()
        except Exception:  # noqa: BLE001
            groups = []
        for grp in groups:
            target = grp.decode()[len("loc:@"):]
            if target != op.name:
                class_groups.setdefault(target, [target]).append(op.name)
    for target, members in class_groups.items():
        members = [m for m in members if m in keep]
        if len(members) > 1:
            coloc.append(members)
    if unknown:
        uniq = list(dict.fromkeys(unknown))
        log.log(unknown_level, "%s: %d ops have outputs of unknown shape (counted with unknown dims = %d): %s%s", where,
                len(uniq), UNKNOWN_DIM_FALLBACK, uniq[:5], " ..." if len(uniq) > 5 else "")
    return ops_rec, edges, control, coloc


def graph_precision(g, ops_rec) -> str:
    """The compute precision of a step: ``fp16`` / ``bf16`` when most of the FLOPs of its matmuls and
    convolutions (TENSOR_CORE_OPS) are in that dtype (a Keras ``mixed_float16`` / ``mixed_bfloat16`` policy, a
    hand-cast graph), else ``fp32``. `ops_rec` as :func:`op_records` returns them, `g` the tf.Graph they are of."""
    flops: dict[str, float] = {}
    for rec in ops_rec:
        if rec[1] not in TENSOR_CORE_OPS:
            continue
        try:
            dtype = g.get_operation_by_name(rec[0]).get_attr("T").name
        except (KeyError, ValueError):
            continue
        flops[dtype] = flops.get(dtype, 0.0) + max(float(rec[4]), 1.0)
    if not flops:
        return "fp32"
    return _PRECISION_OF_DTYPE.get(max(flops, key=flops.get), "fp32")


def _call_flops(op, lib: dict) -> float:
    """Cost of a kept functional op (If/Case/call): flops of its largest function body."""
    fnames = []
    for a in op.node_def.attr.values():
        if a.HasField("func"):
            fnames.append(a.func.name)
        fnames.extend(f.name for f in a.list.func)
    if op.type in lib:
        fnames.append(op.type)
    args = list(op.inputs)[1:] if op.type in ("If", "StatelessIf", "Case", "StatelessCase") else list(op.inputs)
    shapes = [t.shape for t in args]
    return max((_function_flops(fn, lib, shapes) for fn in fnames), default=0.0)


def _function_flops(fname: str, lib: dict, shapes=None, depth: int = 0) -> float:
    if fname not in lib or depth > 5:
        return 0.0
    from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

    try:
        fdef = lib[fname]
        if shapes is not None and len(shapes) != len(fdef.signature.input_arg):
            shapes = None
        fg = function_def_to_graph(fdef, input_shapes=shapes)
    except Exception:  # noqa: BLE001
        return 0.0
    total = 0.0
    for op in fg.get_operations():
        try:
            total += node_flops(fg, op.node_def)
        except Exception:  # noqa: BLE001
            pass
        for a in op.node_def.attr.values():
            if a.HasField("func"):
                total += _function_flops(a.func.name, lib, None, depth + 1)
    return total


# --------------------------------------------------------------------------------------------- integer inputs
def _variable_rows(handle) -> int | None:
    """Rows (dim 0) of the resource variable behind tensor `handle` (through Identity ops), None if unknown."""
    var = handle.op
    while var.type == "Identity":
        var = var.inputs[0].op
    if var.type != "VarHandleOp":
        return None
    dims = var.get_attr("shape").dim
    return int(dims[0].size) if dims and dims[0].size > 0 else None


def _index_limit(consumer, t) -> int | None:
    """The exclusive upper bound `consumer` accepts for the values of its input `t` (None: not an index input,
    or the bound is unknown)."""
    from tensorflow.python.framework import tensor_util

    ins = list(consumer.inputs)
    kind = consumer.type
    if len(ins) < 2:
        return None
    if kind == "ResourceGather" or kind.startswith("ResourceScatter"):
        return _variable_rows(ins[0]) if ins[1] is t else None
    if kind in ("GatherV2", "Gather") and ins[1] is t:
        axis = tensor_util.constant_value(ins[2]) if kind == "GatherV2" else 0
        dims = ins[0].shape.as_list() if ins[0].shape.rank is not None else []
        if axis is not None and -len(dims) <= int(axis) < len(dims) and dims[int(axis)]:
            return int(dims[int(axis)])
    if kind == "SparseSoftmaxCrossEntropyWithLogits" and ins[1] is t:
        dims = ins[0].shape.as_list() if ins[0].shape.rank else []
        return int(dims[-1]) if dims and dims[-1] else None
    if kind == "OneHot" and ins[0] is t:
        d = tensor_util.constant_value(ins[1])
        return int(d) if d is not None else None
    return None


def feed_limits(g, feeds: list[str]) -> list[int]:
    """Per integer placeholder in `feeds` (op names of tf.Graph `g`): the exclusive upper bound of the values
    every op indexing with it accepts (the smallest vocabulary / class count reached through reshapes, slices,
    casts and unstacks), or 0 when the values reach an op of unknown needs or no bound is known. Others: 0."""
    out = []
    for name in feeds:
        t0 = g.get_operation_by_name(name).outputs[0]
        bounds: list[int] = []
        todo, seen = [t0], {t0.name}
        while todo and t0.dtype.is_integer and bounds is not None:
            t = todo.pop()
            for c in t.consumers():
                if c.type in INDEX_PASS_OPS and (c.outputs[0].dtype.is_integer or c.outputs[0].dtype.is_floating):
                    outs = c.outputs[:1] if c.type == "Unique" else c.outputs
                    todo += [o for o in outs if o.name not in seen]
                    seen.update(o.name for o in outs)
                elif c.type not in VALUE_AGNOSTIC_OPS:
                    b = _index_limit(c, t)
                    if b is None:
                        bounds = None
                        break
                    bounds.append(b)
        out.append(min(bounds) if t0.dtype.is_integer and bounds else 0)
    return out
