"""Graph clean-up: a GraphDef + fetch names -> the pruned, checked, runnable training step as an OpGraph.

    g = convert_graph_def(graph_def, ["train_op", "loss:0"], batch_size=32, name="mine", where="mine.pb")

Steps (the rules are spelled out in :mod:`placer.graphs.load`'s docstring): inline function calls (Grappler's
function optimizer), prune to what the fetches need, refuse loops, check for cycles, fix placeholder batch
dimensions, keep existing variable initialisers and synthesize missing ones, then build the runnable
MetaGraphDef (collections read by :mod:`placer.graphs.runnable`) and the OpGraph (facts from
:mod:`placer.graphs.opfacts`). Also the small GraphDef surgery helpers the importers and the built-in models
share (:func:`op_name`, :func:`rename_inputs`, :func:`unique_name`).
"""
from __future__ import annotations

import graphlib
import hashlib
import logging
import re
from typing import Callable, Iterable, Sequence

from placer.errors import GraphImportError
from placer.graphs.opfacts import VARIABLE_OPS, feed_limits, graph_precision, op_records
from placer.graphs.opgraph import OpGraph
from placer.graphs.runnable import FEED_LIMITS_COLLECTION, FEEDS_COLLECTION, FETCHES_COLLECTION, INIT_COLLECTION

log = logging.getLogger(__name__)

INIT_OP_NAME = "placer_init"
ASSIGN_OPS = frozenset({"Assign", "AssignVariableOp"})
TF1_LOOP_OPS = frozenset({"Enter", "Exit", "NextIteration", "LoopCond", "RefEnter", "RefExit", "RefNextIteration"})
LOOP_OPS = frozenset({"While", "StatelessWhile", "_While"})
BRANCH_OPS = frozenset({"If", "StatelessIf", "Case", "StatelessCase"})


# --------------------------------------------------------------------------------------------- names
def op_name(inp: str) -> str:
    """The op of a NodeDef input: ``^a`` / ``a:1`` / ``a`` -> ``a``."""
    s = inp[1:] if inp.startswith("^") else inp
    return s.split(":")[0]


_RAISED = re.compile(r"^\s*[A-Za-z_][\w.]*(Error|Exception): \S")


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (TF's run to pages), or its type's name. An error raised inside a
    traced function (autograph's "in user code:", then the frames) gives the line of the error it wraps.

    >>> first_line(ValueError('in user code:\\n\\n    File "x.py", line 3, in f  *\\n        g()\\n\\n'
    ...                       '    ValueError: No loss to compute.\\n'))
    'ValueError: No loss to compute.'
    """
    s = str(getattr(e, "message", None) or e).strip()
    lines = s.splitlines()
    if lines and lines[0].strip() == "in user code:":
        raised = [ln.strip() for ln in lines if _RAISED.match(ln)]
        if raised:
            return raised[-1]
    return lines[0] if s else type(e).__name__


def unique_name(base: str, taken: set[str]) -> str:
    """`base`, or `base_<i>` with the smallest i not in `taken`."""
    if base not in taken:
        return base
    i = 1
    while f"{base}_{i}" in taken:
        i += 1
    return f"{base}_{i}"


def renamed_input(inp: str, rename: dict[str, str]) -> str:
    """A NodeDef input (``^a``, ``a:1``) with its op renamed per `rename`."""
    ctrl = inp.startswith("^")
    s = inp[1:] if ctrl else inp
    op, sep, idx = s.partition(":")
    if op in rename:
        s = rename[op] + sep + idx
    return ("^" + s) if ctrl else s


def rename_inputs(gd, rename: dict[str, str]) -> None:
    """Point every input and ``_class`` co-location attr of `gd` at the renamed ops (the nodes themselves are
    renamed by the caller)."""
    for n in gd.node:
        if "_class" in n.attr:
            vals = [v.decode(errors="replace") for v in n.attr["_class"].list.s]
            if any(v[5:] in rename for v in vals):
                del n.attr["_class"].list.s[:]
                n.attr["_class"].list.s.extend(("loc:@" + rename.get(v[5:], v[5:])).encode() for v in vals)
        if any(op_name(i) in rename for i in n.input):
            new = [renamed_input(i, rename) for i in n.input]
            del n.input[:]
            n.input.extend(new)


def group_control_fetches(gd, fetches: list[str]) -> list[str]:
    """Replace the op (non-tensor) fetches by one NoOp `train_op` depending on them all (compact fetch list)."""
    ops_ = [f for f in fetches if ":" not in f]
    if len(ops_) <= 1:
        return fetches
    node = gd.node.add()
    node.name = unique_name("train_op", {n.name for n in gd.node})
    node.op = "NoOp"
    node.input.extend("^" + f for f in sorted(ops_))
    return [f for f in fetches if ":" in f] + [node.name]


def unknown_fetch(f: str, nodes: Iterable[str], where: str) -> GraphImportError:
    import difflib

    close = difflib.get_close_matches(op_name(f), list(nodes), n=3)
    hint = f" (did you mean {close}?)" if close else ""
    return GraphImportError(f"{where}: fetch {f!r} names no op in the graph{hint}")


# --------------------------------------------------------------------------------------------- function calls
def inline_functions(gd, fetches: Sequence[str], where: str):
    """Inline PartitionedCall/StatefulPartitionedCall with Grappler's function optimizer (If/While are kept)."""
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, rewriter_config_pb2
    from tensorflow.python.grappler import tf_optimizer

    gd2 = type(gd)()
    gd2.CopyFrom(gd)
    for nds in [gd2.node] + [f.node_def for f in gd2.library.function]:
        for n in nds:  # keep functional control flow as single ops (no Switch/Merge lowering)
            if n.op in LOOP_OPS or n.op in BRANCH_OPS:
                n.attr["_lower_using_switch_merge"].b = False
    for f in gd2.library.function:
        if "api_implements" in f.attr:
            del f.attr["api_implements"]
    mg = meta_graph_pb2.MetaGraphDef()
    mg.graph_def.CopyFrom(gd2)
    nodes = {n.name for n in gd2.node}
    for f in fetches:
        if op_name(f) not in nodes:
            raise unknown_fetch(f, nodes, where)
        mg.collection_def["train_op"].node_list.value.append(f)
    config = config_pb2.ConfigProto()
    rw = config.graph_options.rewrite_options
    rw.min_graph_nodes = -1
    rw.optimizers.append("function")
    rw.function_optimization = rewriter_config_pb2.RewriterConfig.AGGRESSIVE
    rw.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    try:
        return tf_optimizer.OptimizeGraph(config, mg)
    except Exception as e:  # noqa: BLE001
        log.warning("%s: function inlining failed (%s); calls are kept as single ops", where, first_line(e))
        return gd


def used_functions(node_defs, library) -> set[str]:
    """Names of the library functions the given nodes call (directly, through attrs, or nested)."""
    lib = {f.signature.name: f for f in library.function}
    if not lib:
        return set()

    def called(nds) -> set[str]:
        out = set()
        for nd in nds:
            if nd.op in lib:
                out.add(nd.op)
            for a in nd.attr.values():
                if a.HasField("func"):
                    out.add(a.func.name)
                out.update(f.name for f in a.list.func)
        return out & set(lib)

    return reachable(called(node_defs), lambda f: called(lib[f].node_def))


# --------------------------------------------------------------------------------------------- pruning, checks
def reachable(roots: Iterable[str], successors: Callable[[str], Iterable[str]]) -> set[str]:
    """`roots` and everything reachable from them through `successors` (depth first)."""
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(successors(n))
    return seen


def closure(roots: Iterable[str], nodes: dict) -> set[str]:
    """Names of `roots` and every op they need (data + control inputs, transitively); unknown names included."""
    return reachable(roots, lambda n: map(op_name, nodes[n].input) if n in nodes else ())


def check_cycles(names: set[str], nodes: dict, where: str) -> None:
    """Raise GraphImportError naming ops of a cycle among `names` (inputs outside `names` are ignored)."""
    deps = {n: {m for m in map(op_name, nodes[n].input) if m in names} for n in names}
    try:
        graphlib.TopologicalSorter(deps).prepare()
    except graphlib.CycleError as e:
        cycle = list(dict.fromkeys(e.args[1]))
        raise GraphImportError(f"{where}: the graph has a cycle through ops {cycle[:5]}") from None


def _fmt_shape(dims) -> str:
    return "[" + ",".join("?" if d < 0 else str(d) for d in dims) + "]"


def fix_placeholder(nd, batch_size: int | None, where: str) -> bool:
    """Give placeholder NodeDef `nd` a fully static shape (an unknown first dim becomes `batch_size`); True when
    it took `batch_size`."""
    shape = nd.attr["shape"].shape
    if "shape" not in nd.attr or shape.unknown_rank:
        raise GraphImportError(f"{where}: placeholder {nd.name!r} has no static shape; give it a shape "
                               "(synthetic feeds need one)")
    dims = [d.size for d in shape.dim]
    fixed = bool(dims) and dims[0] < 0
    if fixed:
        if batch_size is None:
            raise GraphImportError(f"{where}: placeholder {nd.name!r} has an unknown batch dimension "
                                   f"{_fmt_shape(dims)}: give a batch size (--batch-size B / batch_size=B)")
        shape.dim[0].size = int(batch_size)
        dims[0] = int(batch_size)
    if any(d < 0 for d in dims):
        raise GraphImportError(f"{where}: placeholder {nd.name!r} has unknown dimensions {_fmt_shape(dims)}; only the "
                               "batch (first) dimension can be fixed with --batch-size")
    return fixed


# --------------------------------------------------------------------------------------------- initialisers
def add_initializers(g, uninit: set[str], var_values: dict[str, tuple[float, float]], init_roots: list[str]) -> str:
    """Synthesize initialisers for variables without one, then one NoOp `placer_init` running them all."""
    import tensorflow as tf

    assigns = [g.get_operation_by_name(n) for n in init_roots]
    for vname in sorted(uninit):
        var = g.get_operation_by_name(vname)
        dtype = tf.as_dtype(var.get_attr("dtype"))
        shape = tf.TensorShape(var.get_attr("shape"))
        lo, hi = var_values.get(vname, (0.0, 0.0))
        with g.colocate_with(var), g.name_scope(f"placer_init/{vname}/"):
            if lo == hi or not (dtype.is_floating):
                value = tf.fill(shape.as_list(), tf.constant(lo if dtype.is_floating else int(lo), dtype=dtype))
            else:
                value = tf.random.uniform(shape.as_list(), lo, hi, dtype=dtype)
            if var.type == "VarHandleOp":
                a = tf.raw_ops.AssignVariableOp(resource=var.outputs[0], value=value, name="assign")
            else:
                a = tf.compat.v1.assign(var.outputs[0], value, name="assign").op
        assigns.append(a)
    name = unique_name(INIT_OP_NAME, {op.name for op in g.get_operations()})
    with g.control_dependencies(assigns):
        tf.no_op(name=name)
    return name


def build_meta_graph(run_gd, fetches: list[str], feeds: list[str], init: str, limits: Sequence[int] = ()):
    """The runnable MetaGraphDef: `run_gd` plus the collections :func:`placer.graphs.runnable.runtime_spec` reads."""
    import tensorflow as tf
    from tensorflow.core.protobuf import meta_graph_pb2

    mg = meta_graph_pb2.MetaGraphDef()
    mg.graph_def.CopyFrom(run_gd)
    mg.meta_info_def.tensorflow_version = tf.__version__
    mg.meta_info_def.tags.append("train")
    for key in (FETCHES_COLLECTION, "train_op"):
        mg.collection_def[key].node_list.value.extend(fetches)
    mg.collection_def[INIT_COLLECTION].node_list.value.append(init)
    if feeds:
        mg.collection_def[FEEDS_COLLECTION].node_list.value.extend(feeds)
        if any(limits):
            mg.collection_def[FEED_LIMITS_COLLECTION].int64_list.value.extend(int(x) for x in limits)
    return mg


# --------------------------------------------------------------------------------------------- the converter
def _kept_graph_def(gd, everything: set[str], keep: set[str], batch_size, where):
    """The nodes of `gd` in `everything` (device cleared, control inputs sorted, `_class` pruned, placeholders of
    the step fixed) and the functions they use; returns (GraphDef, feed names)."""
    from tensorflow.core.framework import graph_pb2

    out_gd = graph_pb2.GraphDef()
    out_gd.versions.CopyFrom(gd.versions)
    feeds, took_batch = [], False
    for nd in gd.node:
        if nd.name not in everything:
            continue
        nn = out_gd.node.add()
        nn.CopyFrom(nd)
        nn.device = ""
        ctrl = [i for i in nn.input if i.startswith("^")]
        if len(ctrl) > 1:  # TF2 auto control deps come in set order: sort them for a stable fingerprint
            data = [i for i in nn.input if not i.startswith("^")]
            del nn.input[:]
            nn.input.extend(data + sorted(set(ctrl)))
        if "_class" in nn.attr:  # drop colocation with ops that are not kept (TF refuses to import those)
            vals = [v for v in nn.attr["_class"].list.s if v.decode(errors="replace")[5:] in everything]
            if vals:
                del nn.attr["_class"].list.s[:]
                nn.attr["_class"].list.s.extend(vals)
            else:
                del nn.attr["_class"]
        if nd.op == "Placeholder" and nd.name in keep:
            feeds.append(nd.name)
            took_batch = fix_placeholder(nn, batch_size, where) or took_batch
    if batch_size is not None and not took_batch:      # it would be silently unused
        raise GraphImportError(f"{where}: batch size {batch_size} is unused: no placeholder of the step has an unknown "
                               "batch dimension (drop --batch-size / batch_size=)")
    used = used_functions(out_gd.node, gd.library)
    if used:
        out_gd.library.function.extend(f for f in gd.library.function if f.signature.name in used)
        out_gd.library.gradient.extend(x for x in gd.library.gradient if x.function_name in used)
    return out_gd, feeds


def convert_graph_def(gd, fetches: list[str], *, batch_size: int | None, name: str, where: str,
                      var_values: dict[str, tuple[float, float]] | None = None,
                      unknown_level: int = logging.WARNING) -> OpGraph:
    """GraphDef + fetch names -> pruned, checked, runnable OpGraph.

    `var_values`: (min, max) of a variable's current value, for synthesized initialisers (captured TF2
    variables); `unknown_level`: the log level of the unknown-shape note."""
    import tensorflow as tf

    if not len(gd.node):
        raise GraphImportError(f"{where}: the graph is empty (no ops)")
    if not fetches:
        raise GraphImportError(f"{where}: no fetches given (train op / loss names)")
    if len(gd.library.function) and any(n.op in ("PartitionedCall", "StatefulPartitionedCall") for n in gd.node):
        gd = inline_functions(gd, fetches, where)
    nodes = {n.name: n for n in gd.node}
    fetches = list(dict.fromkeys(f.decode() if isinstance(f, bytes) else str(f) for f in fetches))
    for f in fetches:
        if op_name(f) not in nodes:
            raise unknown_fetch(f, nodes, where)
        if f.startswith("^") or (":" in f and not f.partition(":")[2].isdigit()):
            raise GraphImportError(f"{where}: fetch {f!r} is neither an op name nor a tensor name (op:index), "
                                   f"e.g. {op_name(f)!r}")
    keep = closure([op_name(f) for f in fetches], nodes)
    missing = sorted(n for n in keep if n not in nodes)
    if missing:
        raise GraphImportError(f"{where}: ops {missing[:5]} are used as inputs but not defined in the graph")

    loops = sorted(n for n in keep if nodes[n].op in TF1_LOOP_OPS or nodes[n].op in LOOP_OPS)
    if loops:
        raise GraphImportError(
            f"{where}: the graph has a loop ({nodes[loops[0]].op} op {loops[0]!r}{' and others' if len(loops) > 1 else ''}); "
            "placer needs each iteration as separate ops: unroll the loop (e.g. keras.layers.LSTM(..., unroll=True), "
            "or a Python for-loop over time steps)")
    resource_ph = sorted(n for n in keep if nodes[n].op == "Placeholder"
                         and nodes[n].attr["dtype"].type == tf.resource.as_datatype_enum)
    if resource_ph:
        raise GraphImportError(f"{where}: resource placeholders {resource_ph[:3]} are not bound to variables; "
                               "import the tf.function / Keras model itself so its captured variables can be converted")

    # variables: existing initialisers = assigns on kept variables that the step itself does not need
    var_ops = {n for n in keep if nodes[n].op in VARIABLE_OPS}
    init_roots = [n for n, nd in nodes.items()
                  if n not in keep and nd.op in ASSIGN_OPS and nd.input and op_name(nd.input[0]) in var_ops]
    initialised = {op_name(nodes[n].input[0]) for n in init_roots}
    everything = keep | closure(init_roots, nodes)
    check_cycles(everything, nodes, where)

    out_gd, feeds = _kept_graph_def(gd, everything, keep, batch_size, where)
    fingerprint = hashlib.sha256(out_gd.SerializeToString(deterministic=True) + repr(fetches).encode()).hexdigest()[:16]

    g = tf.Graph()
    with g.as_default():
        try:
            tf.graph_util.import_graph_def(out_gd, name="")
        except Exception as e:  # noqa: BLE001 - TF's message, one line
            raise GraphImportError(f"{where}: TensorFlow cannot import the graph: {first_line(e)}") from None
        for f in fetches:
            if ":" in f:
                op = g.get_operation_by_name(op_name(f))
                if int(f.partition(":")[2]) >= len(op.outputs):
                    raise GraphImportError(f"{where}: fetch {f!r} names no tensor: op {op.name!r} ({op.type}) has "
                                           f"{len(op.outputs)} output(s)")
        init_name = add_initializers(g, var_ops - initialised, var_values or {}, init_roots)
    run_gd = g.as_graph_def()

    ops_rec, edges, control, coloc = op_records(g, keep, out_gd, where, unknown_level)
    mg = build_meta_graph(run_gd, fetches, feeds, init_name, feed_limits(g, feeds))
    return OpGraph.build(ops_rec, edges, control, colocate=coloc, name=name, fetches=fetches,
                         meta_graph=mg.SerializeToString(deterministic=True), fingerprint=fingerprint,
                         precision=graph_precision(g, ops_rec))
