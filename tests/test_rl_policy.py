"""The seq2seq placement policy and the REINFORCE learner (fast)."""
from __future__ import annotations

import collections

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from placer.rl.policy import PlacementPolicy, _lstm_gates, _lstm_seq  # noqa: E402
from placer.rl.reinforce import Reinforce, ReinforceConfig, reward_of, toy_step_times  # noqa: E402


def _mask(G: int, D: int, cpu: int) -> np.ndarray:
    allowed = np.ones((G, D), bool)
    allowed[::3] = False          # every third group is "CPU-only"
    allowed[::3, cpu] = True
    allowed[1, 0] = False         # and one group may not use device 0
    return allowed


def test_sample_shapes_and_masking():
    G, F, D, K = 10, 7, 4, 64
    allowed = _mask(G, D, cpu=3)
    pol = PlacementPolicy(np.random.default_rng(0).random((G, F), dtype=np.float32), allowed,
                          hidden_size=16, attn_size=8)
    actions, noise = pol.sample(K, noise_scale=0.5)
    assert actions.shape == (K, G) and actions.dtype == np.int32
    assert noise.shape == (K, G, D)
    assert actions.min() >= 0 and actions.max() < D
    # masked devices are never sampled
    assert allowed[np.arange(G)[None], actions].all()
    assert (actions[:, ::3] == 3).all()
    assert (actions[:, 1] != 0).all()
    logp, entropy = pol.log_probs(actions, noise, 0.5)
    assert logp.shape == (K,) and entropy.shape == (K,)
    assert np.isfinite(logp.numpy()).all() and (logp.numpy() <= 0).all()
    # CPU-only groups contribute 0 entropy, the rest at most log(#allowed)
    assert (entropy.numpy() >= 0).all() and (entropy.numpy() <= np.log(D)).all()
    greedy, _ = pol.sample(3, greedy=True)
    assert (greedy == greedy[0]).all()   # argmax decoding is deterministic


@pytest.mark.parametrize("explore", [0.0, 0.3])
def test_log_probs_match_sampling_frequencies(explore):
    # teacher-forced log-probs are the probabilities the sampler draws with (with ε-uniform exploration:
    # those of the mixture (1-ε)·π + ε·uniform(allowed), which still sums to 1 over every placement)
    G, D = 3, 3
    allowed = np.ones((G, D), bool)
    allowed[1, 0] = False
    pol = PlacementPolicy(np.random.default_rng(1).random((G, 4), dtype=np.float32), allowed,
                          hidden_size=16, attn_size=8, tanh_constant=3.0, seed=3, explore=explore)
    n = 20000
    actions, noise = pol.sample(n)
    assert allowed[np.arange(G)[None], actions].all()
    logp, _ = pol.log_probs(actions, noise)
    counts = collections.Counter(map(tuple, actions.tolist()))
    lp = {tuple(a): float(p) for a, p in zip(actions.tolist(), logp.numpy())}
    for seq, c in counts.most_common(6):
        assert abs(c / n - np.exp(lp[seq])) < 0.015, (seq, c / n, np.exp(lp[seq]))
    every = [(a, b, c) for a in range(D) for b in range(1, D) for c in range(D)]
    total = float(np.exp(pol.log_probs(np.array(every, np.int32))[0].numpy()).sum())
    assert total == pytest.approx(1.0, abs=1e-4)
    if explore:   # every allowed placement keeps at least the uniform share ε^G / (#allowed)
        assert np.exp(pol.log_probs(np.array(every, np.int32))[0].numpy()).min() >= (explore / 3) ** 2 * (explore / 2) * 0.999


def test_lstm_seq_matches_autodiff_of_a_scan():
    # the hand-written backward pass of the decoder LSTM gives the gradients autodiff gives for the plain scan
    rng = np.random.default_rng(5)
    T, B, H = 7, 3, 4
    xw, wh = (tf.constant(rng.standard_normal(s).astype(np.float32)) for s in ((T, B, 4 * H), (H, 4 * H)))
    c0, h0 = (tf.constant(rng.standard_normal((B, H)).astype(np.float32)) for _ in range(2))
    w = tf.constant(rng.standard_normal((T, B, H)).astype(np.float32))

    def scan(xw, c0, h0, wh):
        return tf.scan(lambda ch, x: _lstm_gates(x + ch[1] @ wh, ch[0]), xw, initializer=(c0, h0))[1]

    results = []
    for fn in (scan, _lstm_seq):
        with tf.GradientTape() as tape:
            tape.watch([xw, c0, h0, wh])
            hs = fn(xw, c0, h0, wh)
            loss = tf.reduce_sum(hs * w)
        results.append([hs] + tape.gradient(loss, [xw, c0, h0, wh]))
    for want, got in zip(*results):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)


def test_xla_sampling_loop_draws_the_same_placements():
    # the XLA-compiled decoder loop and the plain tf.function draw identical samples from identical states
    G, D = 9, 4
    feats = np.random.default_rng(6).random((G, 5), dtype=np.float32)
    kw = dict(hidden_size=16, attn_size=8, seed=7, explore=0.2)
    jit = PlacementPolicy(feats, _mask(G, D, 3), jit=True, **kw)
    plain = PlacementPolicy(feats, _mask(G, D, 3), jit=False, **kw)
    for noise_scale, greedy in ((0.0, False), (0.5, False), (0.0, True)):
        (a1, n1), (a2, n2) = jit.sample(32, noise_scale, greedy), plain.sample(32, noise_scale, greedy)
        np.testing.assert_array_equal(a1, a2)
        np.testing.assert_array_equal(n1, n2)


def test_policy_rejects_group_without_device():
    allowed = np.ones((3, 2), bool)
    allowed[2] = False
    with pytest.raises(ValueError, match="group 2"):
        PlacementPolicy(np.zeros((3, 2), np.float32), allowed, hidden_size=8)


def test_state_roundtrip_reproduces_samples():
    feats = np.random.default_rng(2).random((6, 5), dtype=np.float32)
    a = Reinforce(feats, np.ones((6, 3), bool), ReinforceConfig(hidden_size=16, attn_size=8, seed=4))
    x, n = a.sample()
    a.learn(x, n, a.rewards(toy_step_times(x, [0] * 6), np.zeros(len(x), bool), 10.0))
    state = a.get_state()
    b = Reinforce(feats, np.ones((6, 3), bool), ReinforceConfig(hidden_size=16, attn_size=8, seed=99))
    b.set_state(state)
    assert b.updates == 1 and b.baseline == a.baseline
    xa, _ = a.sample()
    xb, _ = b.sample()
    np.testing.assert_array_equal(xa, xb)     # same weights and same RNG state → same samples


def test_reward_failures_get_failure_time():
    r = reward_of(np.array([4.0, 1.0, np.inf]), np.array([False, True, False]), 100.0)
    np.testing.assert_allclose(r, [-2.0, -10.0, -10.0])


def test_reinforce_learns_toy_placement():
    """Toy evaluator with a known optimum: step time = 1 + 0.1 × (groups not on device target[g]); the group
    features say which device (as real features say "this group is big / talks to that one")."""
    G, D = 8, 3
    rng = np.random.default_rng(0)
    target = rng.integers(0, D, G)
    feats = np.concatenate([np.eye(D)[target], rng.random((G, 4))], 1).astype(np.float32)
    agent = Reinforce(feats, np.ones((G, D), bool), ReinforceConfig(hidden_size=32, attn_size=16, seed=0))
    first_mean, best, hit = None, np.inf, None
    for update in range(150):
        actions, noise = agent.sample()
        times = toy_step_times(actions, target)
        first_mean = first_mean if first_mean is not None else times.mean()
        best = min(best, times.min())
        agent.learn(actions, noise, agent.rewards(times, np.zeros(len(times), bool), 10.0))
        if best <= 1.0 + 1e-9:
            hit = update
            break
    assert hit is not None, f"best {best} after 150 updates"
    # and the policy itself moved toward the optimum (not just a lucky draw)
    actions, _ = agent.sample(64)
    assert toy_step_times(actions, target).mean() < first_mean


def test_policy_variables_and_ops_are_pinned_to_the_cpu():
    # on a GPU machine the policy must not run on (and take the memory of) the GPUs that measurements use
    from placer.rl.policy import POLICY_DEVICE

    G, D = 6, 3
    agent = Reinforce(np.random.default_rng(9).random((G, 4), dtype=np.float32), np.ones((G, D), bool),
                      ReinforceConfig(hidden_size=16, attn_size=8))
    x, n = agent.sample()
    agent.learn(x, n, -np.ones(len(x)))
    agent.imitate(x[0], max_steps=1)
    assert POLICY_DEVICE == "/CPU:0"
    for v in list(agent.policy.variables) + [getattr(v, "value", v) for v in agent.optimizer.variables]:
        assert "CPU" in v.device, (v.name, v.device)
    fns = [agent.policy._sample_fn, agent.policy._decode_fn, agent._step_fn]
    graphs = [c.graph for f in fns for c in f._list_all_concrete_functions()]
    assert graphs
    seen = 0
    for g in graphs:
        for op in g.get_operations():
            if op.type in ("Placeholder", "NoOp") or op.type.startswith("_") \
                    or any(t.dtype == tf.resource for t in op.inputs) \
                    or (op.type == "Identity" and not op.device):
                continue   # placed with their variable, or (outputs) on the caller's device: the CPU
            assert "CPU" in op.device.upper(), (g.name, op.name, op.type, op.device)
            seen += 1
    assert seen > 50


def test_one_traced_step_fits_imitation_to_the_softmax_and_reinforce_to_the_mixture():
    """REINFORCE and imitation share one traced step (`Reinforce._step_fn`): a REINFORCE step scores its samples
    under the exploration mixture, an imitation step under the softmax alone, and neither retraces."""
    G, D = 6, 3
    agent = Reinforce(np.random.default_rng(4).random((G, 4), dtype=np.float32), np.ones((G, D), bool),
                      ReinforceConfig(hidden_size=16, attn_size=8))
    assert agent.policy.explore > 0
    x, _ = agent.sample(4)
    zeros = np.zeros((4, G, D), np.float32)
    mixed, _ = agent.policy.log_probs(x)                  # teacher forcing, under the mixture
    soft, _ = agent.policy._log_probs(tf.constant(x), tf.constant(zeros), 0.0, mixture=False)
    eps, p = agent.policy.explore, np.exp(agent.policy.group_log_probs(x))             # [4, G, D]
    by_hand = np.log((1 - eps) * np.take_along_axis(p, x[..., None], -1)[..., 0] + eps / D).sum(1)
    np.testing.assert_allclose(mixed.numpy(), by_hand, rtol=1e-5)
    assert not np.allclose(mixed.numpy(), soft.numpy(), rtol=1e-4)
    nll = float(agent._imitate_fn(tf.constant(x), tf.constant(x)))      # scored before its update
    assert nll == pytest.approx(-float(soft[0]) / G, rel=1e-5)
    mixed_now, _ = agent.policy.log_probs(x)
    *_, logp = agent._train(tf.constant(x), tf.constant(zeros), tf.constant(0.0), tf.constant(np.ones(4, np.float32)))
    np.testing.assert_allclose(logp.numpy(), mixed_now.numpy(), rtol=1e-5)
    agent.imitate(x[1], max_steps=2)
    agent.learn(x, zeros, -np.ones(4))
    assert agent._step_fn.experimental_get_tracing_count() == 1


def test_a_collected_agents_traced_policy_serves_the_next_agent_with_a_new_builds_values():
    """An agent that is garbage-collected hands its traced policy, Adam and step to the next agent of the same
    shapes (`placer.rl.reinforce._own_core`): that agent samples and learns exactly as a new build for its seed,
    graph and learning rate does, with no new trace; two live agents never share one."""
    import gc

    G, D = 6, 3
    rng = np.random.default_rng(5)
    feats_a, feats_b = rng.random((G, 4), dtype=np.float32), rng.random((G, 4), dtype=np.float32)
    allowed_b = np.ones((G, D), bool)
    allowed_b[2, 0] = False
    small = dict(hidden_size=16, attn_size=8)

    def run(agent):
        x, noise = agent.sample(4)
        stats = agent.learn(x, noise, -np.arange(4.0))
        agent.imitate(x[0], max_steps=2)
        return x, stats, agent.sample(4)[0], agent.get_state()

    a = Reinforce(feats_a, np.ones((G, D), bool), ReinforceConfig(seed=0, **small))
    run(a)
    a.learn(*a.sample(4), -np.arange(4.0))        # Adam state and RNG moved on: the next agent must not see them
    traced, step = a.policy, a._step_fn
    del a
    gc.collect()
    b = Reinforce(feats_b, allowed_b, ReinforceConfig(seed=3, learning_rate=1e-3, **small))
    assert b.policy is traced and b._step_fn is step                     # handed on
    fresh = Reinforce(feats_b, allowed_b, ReinforceConfig(seed=3, learning_rate=1e-3, **small))
    assert fresh.policy is not b.policy                                  # b is alive: a new build
    got, want = run(b), run(fresh)
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1] == want[1]
    np.testing.assert_array_equal(got[2], want[2])
    assert not (got[0][:, 2] == 0).any()                                 # b's own mask
    for k, v in want[3]["policy"].items():
        np.testing.assert_array_equal(got[3]["policy"][k], v)
    for u, v in zip(got[3]["optimizer"], want[3]["optimizer"]):
        np.testing.assert_array_equal(u, v)
    assert step.experimental_get_tracing_count() == 1


def test_a_collected_agents_traced_portable_policy_serves_the_next_agent_over_the_same_weights():
    """The same for a pretrained (portable) policy: the next agent over the same weights object, with another
    graph's inputs of the same shapes, samples exactly as a new binding does; another weights object gets its own."""
    import gc

    from placer.rl.portable import DEVICE_FEATURES, GROUP_FEATURES, PolicyInputs, PortablePolicy, PortableWeights

    G, D = 5, 3
    rng = np.random.default_rng(6)
    w = PortableWeights(hidden_size=16, attn_size=8)

    def inputs():
        return PolicyInputs(rng.random((G, len(GROUP_FEATURES)), dtype=np.float32),
                            rng.random((G, G), dtype=np.float32), rng.random((G, D), dtype=np.float32),
                            rng.random((G, D), dtype=np.float32) * 0.1,
                            rng.random((D, len(DEVICE_FEATURES)), dtype=np.float32))

    cfg = ReinforceConfig(seed=2, hidden_size=16, attn_size=8)
    a = Reinforce(None, np.ones((G, D), bool), cfg, policy=PortablePolicy.from_config(w, inputs(), np.ones((G, D), bool), cfg))
    a.sample(3)
    traced = a.policy
    del a
    gc.collect()
    inp = inputs()
    b = Reinforce(None, np.ones((G, D), bool), cfg, policy=PortablePolicy.from_config(w, inp, np.ones((G, D), bool), cfg))
    assert b.policy is traced
    new = PortablePolicy.from_config(w, inp, np.ones((G, D), bool), cfg)
    np.testing.assert_array_equal(b.sample(6)[0], new.sample(6)[0])
    del b
    gc.collect()
    other = Reinforce(None, np.ones((G, D), bool), cfg, policy=PortablePolicy.from_config(
        PortableWeights(hidden_size=16, attn_size=8), inp, np.ones((G, D), bool), cfg))
    assert other.policy is not traced
