"""Graph files and protos: tell a GraphDef, MetaGraphDef and SavedModel apart, parse them, and find their fetches.

    proto = parse_graph_file(Path("model.pb"), data)       # GraphDef | MetaGraphDef | SavedModel proto
    sm = read_saved_model(Path("export_dir"))               # saved_model.pb or saved_model.pbtxt
    gd, fetches = saved_model_graph(sm, None, where="export_dir")

Sniffing: ``.pbtxt``/``.txt``/``.prototxt`` are text protos (GraphDef, then MetaGraphDef, then SavedModel); other
files are binary, tried as MetaGraphDef, GraphDef, SavedModel (``.pb``: GraphDef first; ``saved_model.pb``:
SavedModel first). A parse counts only when the graph is non-empty and every node has a name and a
well-formed op type, so random bytes are not mistaken for an empty proto. Anything else is one clear
GraphImportError naming the file.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

from placer.errors import GraphImportError, os_reason
from placer.graphs.runnable import FETCHES_COLLECTION

_OP_RE = re.compile(r"^[A-Za-z_>][A-Za-z0-9_>./\-]*$")


def read_file(path: Path) -> bytes:
    """The bytes of graph file `path`; an unreadable one (permissions, I/O error) is one GraphImportError naming it."""
    try:
        return path.read_bytes()
    except OSError as e:
        raise GraphImportError(f"{path}: cannot read it: {os_reason(e)}") from None


def hash_files(d: Path) -> str:
    """sha256 over the relative paths and bytes of every file below directory `d` (a SavedModel's cache key)."""
    h = hashlib.sha256()
    for p in sorted(d.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(d)).encode())
            h.update(read_file(p))
    return h.hexdigest()


def _valid_graph_def(gd) -> bool:
    return len(gd.node) > 0 and all(n.name and n.op and _OP_RE.match(n.op) for n in gd.node)


def _proto_ok(p) -> bool:
    name = type(p).__name__
    if name == "GraphDef":
        return _valid_graph_def(p)
    if name == "MetaGraphDef":
        return _valid_graph_def(p.graph_def)
    if name == "SavedModel":
        return len(p.meta_graphs) > 0 and _valid_graph_def(p.meta_graphs[0].graph_def)
    return False


def parse_graph_file(path: Path, data: bytes):
    """Parse a .pb/.pbtxt/.meta file into a GraphDef, MetaGraphDef or SavedModel (clear error otherwise)."""
    from google.protobuf import message, text_format
    from tensorflow.core.framework import graph_pb2
    from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

    bad = f"{path} is not a TensorFlow graph (truncated, corrupt or another kind of file)"
    suffix = path.suffix.lower()
    if suffix in (".pbtxt", ".txt", ".prototxt"):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise GraphImportError(bad) from None
        furthest = ((0, 0), "")     # the syntax error of the parse that got furthest: where the text is wrong
        for cls in (graph_pb2.GraphDef, meta_graph_pb2.MetaGraphDef, saved_model_pb2.SavedModel):
            p = cls()
            try:
                text_format.Parse(text, p)
            except (text_format.ParseError, message.DecodeError, ValueError) as e:
                at = (getattr(e, "GetLine", lambda: 0)() or 0, getattr(e, "GetColumn", lambda: 0)() or 0)
                if at > max(furthest[0], (1, 1)):
                    furthest = (at, str(e).split(" : ", 1)[-1].splitlines()[0])
                continue
            if _proto_ok(p):
                return p
        (line, col), why = furthest
        raise GraphImportError(f"{bad}: line {line} column {col}: {why}" if line else bad)
    order = [meta_graph_pb2.MetaGraphDef, graph_pb2.GraphDef, saved_model_pb2.SavedModel]
    if suffix == ".pb":
        order = [graph_pb2.GraphDef, meta_graph_pb2.MetaGraphDef, saved_model_pb2.SavedModel]
    if path.name == "saved_model.pb":
        order = [saved_model_pb2.SavedModel] + order[:2]
    for cls in order:
        p = cls()
        try:
            p.ParseFromString(data)
        except (message.DecodeError, ValueError, RuntimeError):
            continue
        if _proto_ok(p):
            return p
    raise GraphImportError(bad)


def read_saved_model(path: Path):
    """The SavedModel proto of directory `path` (``saved_model.pb``, else ``saved_model.pbtxt``)."""
    from google.protobuf import message, text_format
    from tensorflow.core.protobuf import saved_model_pb2

    sm = saved_model_pb2.SavedModel()
    try:
        if (path / "saved_model.pb").exists():
            sm.ParseFromString(read_file(path / "saved_model.pb"))
        else:
            text_format.Parse(read_file(path / "saved_model.pbtxt").decode("utf-8"), sm)
    except (message.DecodeError, text_format.ParseError, ValueError, UnicodeDecodeError):
        raise GraphImportError(f"{path}/saved_model.pb is not a SavedModel (truncated or corrupt)") from None
    if not sm.meta_graphs:
        raise GraphImportError(f"SavedModel {path} holds no graph")
    return sm


def meta_graph_fetches(mg, fetches: list[str] | None, where: str) -> list[str]:
    """`fetches` when given, else the MetaGraphDef's ``placer_fetches`` or ``train_op`` collection."""
    if not fetches:
        col = mg.collection_def
        for key in (FETCHES_COLLECTION, "train_op"):
            if key in col and col[key].node_list.value:
                fetches = [str(x) for x in col[key].node_list.value]
                break
    if not fetches:
        raise GraphImportError(f"{where} has no `train_op` collection: pass fetches / --fetch NAME (train op / loss)")
    return list(fetches)


def saved_model_graph(sm, fetches: list[str] | None, where: str):
    """(GraphDef, fetches) of a SavedModel's first MetaGraph: `fetches` when given, else its ``train_op``
    collection, else the outputs of a signature called ``train``/``train_step``."""
    mg = sm.meta_graphs[0]
    col = mg.collection_def
    if not fetches and "train_op" in col and col["train_op"].node_list.value:
        fetches = [str(x) for x in col["train_op"].node_list.value]
    if not fetches:
        for sig_name in ("train", "train_step"):
            if sig_name in mg.signature_def:
                sig = mg.signature_def[sig_name]
                fetches = [t.name for _, t in sorted(sig.outputs.items())]
                break
    if not fetches:
        sigs = sorted(mg.signature_def)
        raise GraphImportError(
            f"SavedModel {where} has no `train_op` collection and no `train` signature (signatures: {sigs}): "
            "pass fetches / --fetch NAME")
    return mg.graph_def, list(fetches)
