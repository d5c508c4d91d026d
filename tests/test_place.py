"""placer.place() end to end on a small Keras model: the placement's placed graph runs in a TF Session."""
import numpy as np
import pytest

import placer
from placer.placement import Placement


@pytest.fixture(scope="module")
def keras_model():
    import keras

    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu", name="hidden"),
                              keras.layers.Dense(4, name="logits")])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_place_keras_model_placed_graph_runs_on_logical_cpus(keras_model, tmp_path):
    import tensorflow as tf

    from placer.graphs import load
    from placer.graphs.load import runtime_spec, synthetic_feeds

    result = placer.place(keras_model, devices="cpu:2", reward="sim", budget_seconds=8, batch_size=8,
                          out_dir=tmp_path / "run", max_updates=2)
    graph = load(keras_model, batch_size=8)
    p = result.placement
    assert isinstance(p, Placement) and set(p.mapping) == set(graph.names)
    assert set(p.mapping.values()) <= {"/CPU:0", "/CPU:1"}
    assert result.step_time > 0 and result.lower_bound <= result.step_time
    assert (tmp_path / "run" / "placement.json").exists()
    # round trip through the file, then run the placed graph on two logical CPUs
    p2 = Placement.load(tmp_path / "run" / "placement.json")
    placed = p2.apply(graph)
    for node in placed.graph_def.node:
        if node.name in p.mapping:
            assert node.device == p.mapping[node.name]
    spec = runtime_spec(placed)
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.train.import_meta_graph(placed, clear_devices=False)
    config = tf.compat.v1.ConfigProto(device_count={"CPU": 2}, allow_soft_placement=False)
    with tf.compat.v1.Session(graph=g, config=config) as sess:
        sess.run(spec.init_op)
        feeds = synthetic_feeds(spec)
        for _ in range(2):
            sess.run(list(spec.fetches), feed_dict=feeds)


def test_place_needs_exactly_one_target(keras_model):
    from placer.errors import PlacerError

    with pytest.raises(PlacerError, match="exactly one"):
        placer.place(keras_model, batch_size=8)
