"""The portable (pretrained) policy, issue 13: any graph size and device count, the shipped policy places a graph
of a family it never saw, sampling and teacher forcing agree, bad policy files get one line, pretraining and
`placer place` write their files."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from placer.errors import SearchError


@pytest.fixture(scope="module")
def nmt_tiny():
    from placer.graphs.models import build_model

    return build_model("nmt", "tiny")


@pytest.fixture(scope="module")
def inception_tiny():
    from placer.graphs.models import build_model

    return build_model("inception_v3", "tiny")


class _Recording:
    """An evaluator that keeps a copy of every placement it is asked to evaluate (`seen`)."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []

    def evaluate(self, placements):
        self.seen.extend(np.asarray(p).copy() for p in placements)
        return self.inner.evaluate(placements)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _bound(graph, spec, weights, seed=0, baselines=False):
    from placer.problem import build_problem
    from placer.rl.portable import PortablePolicy
    from placer.search import policy_inputs

    p = build_problem(graph, spec, seed=seed, baselines=baselines)
    return p, PortablePolicy(weights, policy_inputs(p), p.allowed, seed=seed)


def test_one_set_of_weights_places_any_device_count(nmt_tiny):
    from placer.rl.portable import PortableWeights

    w = PortableWeights(32, 16, seed=1)
    before = {k: v.copy() for k, v in w.state().items()}
    for n in (3, 8):       # (the shipped policy is checked on 2, 5 and 8 below)
        p, pol = _bound(nmt_tiny, f"{n}xV100", w)
        try:
            a, noise = pol.sample(6)
            G, D = p.grouping.num_groups, p.cluster.num_devices
            assert a.shape == (6, G) and noise.shape == (6, G, D) and D == n + 1
            assert p.allowed[np.arange(G)[None], a].all(), "a sample used a device its group may not use"
            lp, ent = pol.log_probs(a, noise)
            assert np.isfinite(lp.numpy()).all() and (lp.numpy() < 0).all()
        finally:
            p.close()
    # the weights are the same objects for every device count: nothing was added per problem
    assert set(w.state()) == set(before) and all(w.state()[k].shape == before[k].shape for k in before)


def test_greedy_sample_is_the_teacher_forced_argmax(inception_tiny):
    """The decoder's step-by-step placement state (load, memory, inflow, previous device) and the teacher-forced
    one computed with cumulative sums are the same features: the greedy choice at each group is the argmax of
    the teacher-forced distribution given the greedy history."""
    from placer.rl.portable import PortableWeights

    p, pol = _bound(inception_tiny, "4xK80", PortableWeights(32, 16, seed=3))
    try:
        a, _ = pol.sample(1, greedy=True)
        logp = pol.group_log_probs(a)
        assert (logp[0].argmax(-1) == a[0]).all()
        # and a sampled (non-greedy) history is scored consistently: its log-probability is the sum of its steps
        s, _ = pol.sample(3)
        lp = pol.group_log_probs(s)
        total = np.take_along_axis(lp, s[..., None], -1)[..., 0].sum(1)
        assert np.allclose(total, pol.log_probs(s)[0].numpy(), rtol=1e-4, atol=1e-3)
    finally:
        p.close()


def test_zero_shot_only_samples_without_xla_and_draws_what_xla_draws(nmt_tiny):
    """A zero-shot answer (`run(max_updates=0)`) binds the policy without XLA (one batch does not pay back two
    compilations); both samplers draw the same placements from the same seed, so the answer is the same."""
    from placer.problem import build_problem
    from placer.rl.portable import PortablePolicy, PortableWeights
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import Search
    from placer.search import load_policy, policy_inputs

    w = PortableWeights(32, 16, seed=5)
    p = build_problem(nmt_tiny, "4xK80", seed=0, baselines=False)
    try:
        inputs = policy_inputs(p)
        drawn = []
        for jit in (True, False):
            pol = PortablePolicy(w, inputs, p.allowed, seed=7, explore=0.1, jit=jit)
            drawn.append((pol.sample(1, greedy=True)[0], pol.sample(9)[0]))
        assert all((a == b).all() for a, b in zip(*drawn))
        weights = load_policy("default")
        cfg = ReinforceConfig(seed=0, portable=True, hidden_size=weights.hidden_size, attn_size=weights.attn_size)
        s = Search(p.grouping, p.simulator, cpu_index=p.cluster.cpu_index, allowed=p.allowed, config=cfg,
                   progress=False, tensorboard=False, policy_inputs=lambda: policy_inputs(p), pretrained=weights)
        s.run(1.0, max_updates=0)
        assert s.updates == 0 and s.zero_shot["samples"] >= 1 and s.agent.policy._decode_fn._jit_compile is False
    finally:
        p.close()


def test_zero_shot_samples_batches_for_its_seconds_and_evaluates_each_placement_once(nmt_tiny):
    """`placer place` keeps drawing batches for `zero_shot_seconds` (at most `zero_shot_max` placements; a batch
    that draws nothing new stops it) and simulates each distinct placement once; with 0 seconds, one batch."""
    from placer.problem import build_problem
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import Search
    from placer.search import load_policy, policy_inputs

    weights = load_policy("default")
    p = build_problem(nmt_tiny, "4xK80", seed=0, baselines=False)
    try:
        for seconds, cap in ((0.0, 2048), (60.0, 40), (60.0, 2048)):
            ev = _Recording(p.simulator)
            cfg = ReinforceConfig(seed=0, portable=True, hidden_size=weights.hidden_size, attn_size=weights.attn_size,
                                  zero_shot_samples=8, zero_shot_seconds=seconds, zero_shot_max=cap)
            s = Search(p.grouping, ev, cpu_index=p.cluster.cpu_index, allowed=p.allowed, config=cfg, progress=False,
                       tensorboard=False, policy_inputs=lambda: policy_inputs(p), pretrained=weights)
            s.run(120.0, max_updates=0)
            z = s.zero_shot
            keys = [x.tobytes() for x in ev.seen]
            assert len(keys) == len(set(keys)) == z["evaluated"] == s.evaluations, (seconds, cap, z)
            assert 1 <= z["evaluated"] <= z["samples"]
            if seconds == 0:
                assert z["samples"] == 8 and z["batches"] == 1
            elif cap == 40:       # the cap, unless a batch drew nothing new first
                assert z["samples"] == 40 and z["batches"] == 5 or z["samples"] < 40, z
            else:                 # 60 s is long: stopped by a batch with nothing new, or by the cap
                assert z["samples"] == 2048 or z["evaluated"] < z["samples"], z
                assert z["batches"] > 1 and z["wall_s"] < 60
    finally:
        p.close()


def test_zero_shot_refinement_starts_from_the_policys_best_sample_and_keeps_its_seconds(nmt_tiny):
    """`placer place` refines the best sample by local moves for `zero_shot_refine_seconds`: the chain starts from
    that sample (its first moves are neighbours of it, not of a baseline, though baselines were evaluated), every
    move keeps groups on allowed devices, each placement is evaluated once, the answer is never worse than the
    sampled best, and the seconds are kept."""
    from placer.problem import build_problem
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import Search
    from placer.search import load_policy, policy_inputs

    weights = load_policy("default")
    p = build_problem(nmt_tiny, "4xK80", seed=0)
    try:
        ev = _Recording(p.simulator)
        cfg = ReinforceConfig(seed=0, portable=True, hidden_size=weights.hidden_size, attn_size=weights.attn_size,
                              zero_shot_samples=8, zero_shot_seconds=0.0, zero_shot_refine_seconds=1.0)
        s = Search(p.grouping, ev, cpu_index=p.cluster.cpu_index, allowed=p.allowed, config=cfg,
                   baselines=p.baselines, progress=False, tensorboard=False,
                   policy_inputs=lambda: policy_inputs(p), pretrained=weights)
        s.run(60.0, max_updates=0)
        z = s.zero_shot
        nb = len(p.baselines)
        sampled = [ev.inner.evaluate([x])[0].step_time for x in ev.seen[nb:nb + z["evaluated"]]]
        assert z["sampled_best_s"] == pytest.approx(min(sampled))
        assert z["refine_evaluations"] >= 1 and s.evaluations == nb + z["evaluated"] + z["refine_evaluations"]
        assert len(ev.seen) == s.evaluations
        assert s.search_best == z["best_s"] <= z["sampled_best_s"]
        assert 1.0 <= z["refine_s"] < 10.0
        keys = [x.tobytes() for x in ev.seen[nb:]]
        assert len(keys) == len(set(keys)), "a placement was evaluated twice"
        # the first local move is a neighbour of the best sample: at most AnnealConfig.block_max (8) groups moved
        best = ev.seen[nb + int(np.argmin(sampled))]
        first = ev.seen[nb + z["evaluated"]]
        moved = np.unique(p.grouping.op_group[best != first])
        assert 1 <= len(moved) <= 8
        # every refined placement keeps each op on a device its group may use (CPU-only ops: the CPU)
        free = ~np.asarray(p.grouping.op_cpu_only, bool)
        for x in ev.seen[nb + z["evaluated"]:]:
            assert p.allowed[p.grouping.op_group[free], x[free]].all()
            assert (x[~free] == p.cluster.cpu_index).all()
    finally:
        p.close()


def test_zero_shot_refinement_stops_at_its_moves_and_repeats_for_a_seed(nmt_tiny):
    """With `zero_shot_refine_moves`, the refinement stops after that many local moves (well inside its seconds),
    says so (`refine_stop`), and the same seed gives the same moves and the same answer twice; a different seed
    other moves."""
    from placer.problem import build_problem
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import Search
    from placer.search import load_policy, policy_inputs

    weights = load_policy("default")
    p = build_problem(nmt_tiny, "4xK80", seed=0, baselines=False)

    def run(seed, moves=40):
        ev = _Recording(p.simulator)
        cfg = ReinforceConfig(seed=seed, portable=True, hidden_size=weights.hidden_size,
                              attn_size=weights.attn_size, zero_shot_samples=8, zero_shot_seconds=0.0,
                              zero_shot_refine_seconds=60.0, zero_shot_refine_moves=moves)
        s = Search(p.grouping, ev, cpu_index=p.cluster.cpu_index, allowed=p.allowed, config=cfg,
                   baselines=p.baselines, progress=False, tensorboard=False,
                   policy_inputs=lambda: policy_inputs(p), pretrained=weights)
        s.run(120.0, max_updates=0)
        return s, [x.tobytes() for x in ev.seen]

    try:
        a, seen_a = run(0)
        assert a.zero_shot["refine_evaluations"] == 40 and a.zero_shot["refine_stop"] == "moves"
        assert a.zero_shot["refine_s"] < 60.0
        b, seen_b = run(0)
        assert seen_a == seen_b and b.search_best == a.search_best
        assert np.array_equal(a.search_best_placement, b.search_best_placement)
        c, seen_c = run(1)
        assert seen_c[-40:] != seen_a[-40:]
        d, _ = run(0, moves=13)     # a cap that is not a multiple of the batch (8) is kept exactly
        assert d.zero_shot["refine_evaluations"] == 13
    finally:
        p.close()


def test_save_load_roundtrip_and_bad_files_get_one_line(tmp_path):
    from placer.rl.portable import PortableWeights

    w = PortableWeights(16, 8, seed=2)
    w.save(tmp_path / "pol", info={"corpus": "test"})
    back = PortableWeights.load(tmp_path / "pol")
    assert all(np.array_equal(back.state()[k], v) for k, v in w.state().items())
    assert back.info["corpus"] == "test"
    # another version
    other = tmp_path / "old"
    shutil.copytree(tmp_path / "pol", other)
    head = json.loads((other / "policy.json").read_text())
    head["version"] = 0
    (other / "policy.json").write_text(json.dumps(head))
    with pytest.raises(SearchError) as e:
        PortableWeights.load(other)
    assert "version" in str(e.value) and "\n" not in str(e.value)
    # a corrupt weights file
    bad = tmp_path / "bad"
    shutil.copytree(tmp_path / "pol", bad)
    (bad / "policy.npz").write_bytes((bad / "policy.npz").read_bytes()[:100])
    with pytest.raises(SearchError) as e:
        PortableWeights.load(bad)
    assert "policy.npz" in str(e.value) and "\n" not in str(e.value)
    # not a policy at all
    with pytest.raises(SearchError, match="not a policy directory"):
        PortableWeights.load(tmp_path)


def test_cli_place_with_a_corrupt_policy_is_one_line(tmp_path, capsys):
    from placer.cli import main

    (tmp_path / "pol").mkdir()
    (tmp_path / "pol" / "policy.json").write_text("{not json")
    (tmp_path / "pol" / "policy.npz").write_bytes(b"junk")
    rc = main(["place", "--policy", str(tmp_path / "pol"), "--model", "nmt", "--size", "tiny", "--cluster", "2xK80",
               "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "policy.json" in err



def test_a_missing_policy_path_is_named_as_given(tmp_path, monkeypatch, capsys):
    """--policy /nonexistent (or a relative name) names that path, not its parent directory (/ or .)."""
    from placer.cli import main
    from placer.rl.portable import PortableWeights
    from placer.search import load_policy

    monkeypatch.chdir(tmp_path)
    for spec in ("/nonexistent-policy", "nonexistent-policy", str(tmp_path / "no" / "such")):
        for load in (PortableWeights.load, load_policy):
            with pytest.raises(SearchError) as e:
                load(spec)
            assert str(e.value).startswith(f"{spec} does not exist") and "\n" not in str(e.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SearchError, match=r"^empty is not a policy directory"):
        load_policy("empty")
    import placer.cli as cli

    real = cli.load_from_args
    # a bad --policy is refused before the graph is read (placer search read it and built every baseline first,
    # and left an args.json in --out)
    monkeypatch.setattr(cli, "load_from_args", lambda args: pytest.fail("the graph was read"))
    for cmd in ("place", "search"):
        rc = main([cmd, "--policy", "nonexistent-policy", "--model", "nmt", "--size", "tiny", "--cluster", "2xK80",
                   "--budget", "5", "--out", str(tmp_path / cmd)])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and "nonexistent-policy does not exist" in err, (cmd, err)
        assert not (tmp_path / cmd).exists()
    monkeypatch.setattr(cli, "load_from_args", real)

def test_shipped_policy_places_a_family_it_never_saw(inception_tiny):
    """inception_v3 is held out of the pretraining corpus; the shipped policy places it on 2 to 8 GPUs, every
    group on an allowed device, and its zero-shot best is a real placement the simulator accepts."""
    import placer
    from placer.pretrain import HELD_OUT
    from placer.rl.portable import PortableWeights, default_policy_dir

    assert "inception_v3" in HELD_OUT
    info = PortableWeights.load(default_policy_dir()).info
    assert not any(n.startswith(HELD_OUT) for n in info["problems"]), "a held-out family is in the corpus"
    for n in (2, 5, 8):
        r = placer.place(inception_tiny, cluster=f"{n}xK80", policy="default", budget_seconds=0, samples=16,
                         sample_seconds=0, refine_seconds=0)
        z = r.extra["zero_shot"]
        assert z["samples"] == 16 and z["fits"] >= 1
        assert np.isfinite(r.search_best) and r.step_time <= r.search_best
        assert r.extra["updates"] == 0
        used = set(r.placement.mapping.values())
        assert used <= set(r.extra["devices"]) and len(r.extra["devices"]) == n + 1


def test_cli_place_writes_placement_and_summary(tmp_path, tb_scalars):
    from placer.cli import main

    out = tmp_path / "d"
    assert main(["place", "--policy", "default", "--model", "nmt", "--size", "tiny", "--cluster", "4xK80",
                 "--samples", "8", "--refine-seconds", "60", "--refine-moves", "30", "--out", str(out),
                 "--no-progress"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert (out / "placement.json").exists()
    # by default one batch of --samples, then the local moves (placer.search.PLACE_SAMPLE_SECONDS = 0)
    assert s["policy"] == "default" and s["zero_shot"]["samples"] == 8 and s["zero_shot"]["batches"] == 1
    assert s["updates"] == 0
    assert s["search_best_s"] <= s["zero_shot"]["sampled_best_s"]
    assert s["zero_shot"]["refine_evaluations"] == 30 and s["zero_shot"]["refine_stop"] == "moves"
    assert s["search_best_s"] is not None and s["step_time_s"] <= s["search_best_s"] + 1e-12
    # no policy update ran, yet tb/ (listed and in CLI.md) holds the zero-shot point and the baselines
    tb = tb_scalars(out / "tb")
    assert tb["step_time/sampled_min"] == [(0, pytest.approx(s["zero_shot"]["sampled_best_s"]))]
    assert {f"baseline/{k}" for k, v in s["baselines"].items() if v is not None} <= set(tb)


def test_cli_place_on_devices_as_cli_md_says(tmp_path, capsys):
    from placer.cli import main

    out = tmp_path / "d"
    assert main(["place", "--policy", "default", "--model", "nmt", "--size", "tiny", "--devices", "cpu:2",
                 "--samples", "8", "--refine-moves", "30", "--out", str(out), "--no-progress", "--json"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["devices"] == ["/CPU:0", "/CPU:1"] and s["zero_shot"]["samples"] == 8
    assert main(["place", "--policy", "default", "--model", "nmt", "--size", "tiny", "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["placer place: error: give --cluster SPEC (simulated hardware, e.g. 4xK80) or --devices LIST "
                   "(e.g. cpu:2)"]


def test_cli_place_with_negative_refine_moves_is_one_line(tmp_path, capsys):
    from placer.cli import main

    rc = main(["place", "--policy", "default", "--model", "nmt", "--size", "tiny", "--cluster", "2xK80",
               "--refine-moves", "-1", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "--refine-moves" in err


def test_search_from_a_policy_fine_tunes_and_resumes(tmp_path, nmt_tiny):
    from placer.problem import build_problem
    from placer.rl.portable import PortableWeights
    from placer.search import search

    from placer.rl.reinforce import ReinforceConfig

    w = PortableWeights(32, 16, seed=0)
    p = build_problem(nmt_tiny, "3xK80", seed=0)
    try:
        r = search(p, budget_seconds=600, max_updates=2, policy=w, out_dir=tmp_path / "run",
                   config=ReinforceConfig(num_samples=4, zero_shot_samples=8, imitation_steps=20))
        assert r.extra["updates"] == 2 and r.extra["zero_shot"]["samples"] == 8
        assert r.extra["config"]["portable"] is True
        r2 = search(p, budget_seconds=600, max_updates=4, out_dir=tmp_path / "run", resume=True)
        assert r2.extra["updates"] == 4 and r2.search_best <= r.search_best
    finally:
        p.close()


def test_a_fine_tune_with_the_default_config_makes_cluster_moves_and_a_search_from_scratch_does_not(nmt_tiny):
    """search(policy=P) without a config: the sim defaults plus FINETUNE_CLUSTER_PROB of cluster moves in its
    chain; the same search without a policy keeps the defaults' share (none)."""
    from placer.problem import build_problem
    from placer.rl.portable import PortableWeights
    from placer.rl.reinforce import ReinforceConfig
    from placer.search import FINETUNE_CLUSTER_PROB, search

    p = build_problem(nmt_tiny, "3xK80", seed=0)
    try:
        r = search(p, budget_seconds=600, max_updates=1, max_evaluations=300, policy=PortableWeights(32, 16, seed=0))
        assert r.extra["config"]["local_cluster_prob"] == FINETUNE_CLUSTER_PROB > 0
        assert r.extra["config"]["local_moves"] == ReinforceConfig.for_reward("sim").local_moves > 0
        r = search(p, budget_seconds=600, max_updates=1, max_evaluations=300)
        assert r.extra["config"]["local_cluster_prob"] == 0.0
    finally:
        p.close()


def test_chain_flags_of_a_cli_fine_tune_keep_its_cluster_moves(tmp_path):
    """`placer search --policy P --local-moves N` (or --merge-share) builds its config on a fine-tune's defaults:
    the chain's FINETUNE_CLUSTER_PROB of cluster moves stayed only when no chain flag was given (with one, the
    share fell silently to the device count's, 0 on 3 K80s). --cluster-share still sets it."""
    from placer.cli import main
    from placer.search import FINETUNE_CLUSTER_PROB

    def share(*flags):
        out = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        argv = ["search", "--model", "nmt", "--size", "tiny", "--cluster", "3xK80", "--policy", "default",
                "--max-updates", "1", "--max-evaluations", "300", "--no-progress", "--out", str(out), *flags]
        assert main(argv) == 0
        return json.loads((out / "checkpoint" / "state.json").read_text())["config"]["local_cluster_prob"]

    assert share("--local-moves", "64") == FINETUNE_CLUSTER_PROB > 0
    assert share("--cluster-share", "0.2") == 0.2


def test_fine_tune_starts_from_the_better_of_zero_shot_and_the_grouped_baselines(nmt_tiny):
    """A fine-tune starts where a search from scratch starts when that is better than its zero-shot best: the best
    grouped baseline becomes the elite and the restart point."""
    from placer.problem import build_problem
    from placer.rl.portable import PortableWeights
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import Search
    from placer.search import policy_inputs

    w = PortableWeights(32, 16, seed=0)          # untrained: its zero-shot samples are poor
    p = build_problem(nmt_tiny, "3xK80", seed=0)
    try:
        cfg = ReinforceConfig(seed=0, portable=True, hidden_size=32, attn_size=16, num_samples=4,
                              zero_shot_samples=4, imitation_steps=20)     # where it starts, not how well it fits
        s = Search(p.grouping, p.simulator, cpu_index=p.cluster.cpu_index, allowed=p.allowed, config=cfg,
                   baselines=p.baselines, progress=False, tensorboard=False,
                   policy_inputs=lambda: policy_inputs(p), pretrained=w)
        s.run(600.0, max_updates=1)
        grouped = [t for t in s.grouped_times.values() if t is not None]
        assert grouped and s.imitated == "pretrained"
        assert s.elite_time <= min(min(grouped), s.zero_shot["best_s"])
        if min(grouped) < s.zero_shot["best_s"]:
            assert s.zero_shot["start"].endswith("(grouped)") and s.start_groups is not None
        # a zero-shot answer alone evaluates no grouped baseline (it must return in seconds)
        s0 = Search(p.grouping, p.simulator, cpu_index=p.cluster.cpu_index, allowed=p.allowed, config=cfg,
                    baselines=p.baselines, progress=False, tensorboard=False,
                    policy_inputs=lambda: policy_inputs(p), pretrained=w)
        s0.run(1.0, max_updates=0)
        assert s0.grouped_times == {} and "start" not in s0.zero_shot
        # fine-tuned afterwards (or resumed between the zero-shot batch and the grouped start): it starts there too
        s0.run(600.0, max_updates=1)
        assert s0.updates == 1 and s0.grouped_times == s.grouped_times
        assert s0.elite_time <= min(min(grouped), s0.zero_shot["best_s"])
    finally:
        p.close()


def test_a_fine_tunes_chain_starts_at_the_grouped_baseline_even_behind_a_faster_zero_shot_best(nmt_tiny, monkeypatch):
    """Where the zero-shot best beats every grouped baseline it stays the run's best (the elite), but the chain
    starts from the best grouped baseline, as a search from scratch's does (`pretrained_chain_start` "grouped",
    a simulated search's default); with "best" (a measured search's) it starts from the zero-shot best. The
    zero-shot batch is made 1000x faster than the simulator says (an untrained policy's samples are ~100x slower
    than the grouped single GPU), so that it beats them."""
    from dataclasses import replace

    from placer.grouped import group_key
    from placer.problem import build_problem
    from placer.rl.portable import PortableWeights
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import Search
    from placer.search import policy_inputs

    class FastZeroShot:          # the simulator, but the zero-shot samples run 1000x faster
        def __init__(self, sim):
            self.sim, self.devices, self.fast = sim, sim.devices, False

        def evaluate(self, placements):
            outs = self.sim.evaluate(placements)
            return [replace(o, step_time=o.step_time / 1000) for o in outs] if self.fast else outs

    zero_shot = Search._zero_shot

    def fast_zero_shot(self):
        self.evaluator.fast = True
        try:
            zero_shot(self)
        finally:
            self.evaluator.fast = False

    monkeypatch.setattr(Search, "_zero_shot", fast_zero_shot)

    p = build_problem(nmt_tiny, "3xK80", seed=0)
    try:
        assert ReinforceConfig.for_reward("sim").pretrained_chain_start == "grouped"
        assert ReinforceConfig.for_reward("measure").pretrained_chain_start == "best"
        for where in ("grouped", "best"):
            cfg = ReinforceConfig(seed=0, portable=True, hidden_size=32, attn_size=16, num_samples=4,
                                  zero_shot_samples=4, imitation_steps=5, local_moves=0, pretrained_chain_start=where)
            s = Search(p.grouping, FastZeroShot(p.simulator), cpu_index=p.cluster.cpu_index, allowed=p.allowed,
                       config=cfg, baselines=p.baselines, progress=False, tensorboard=False,
                       policy_inputs=lambda: policy_inputs(p), pretrained=PortableWeights(32, 16, seed=0))
            s.run(600.0, max_updates=1)
            grouped = [t for t in s.grouped_times.values() if t is not None]
            assert grouped and s.zero_shot["best_s"] < min(grouped) and s.elite_time == s.zero_shot["best_s"]
            assert "start" not in s.zero_shot          # the zero-shot best is the run's best
            if where == "grouped":
                assert s.zero_shot["chain_start"].endswith("(grouped)")
                assert s._chain_c == min(grouped) and group_key(s._chain) != group_key(s.elite_groups)
            else:
                assert "chain_start" not in s.zero_shot and s._chain is None     # set from the elite at the chain's
    finally:                                                                         # first batch
        p.close()


def test_place_budget_is_fine_tuning_after_the_zero_shot_answer(nmt_tiny, monkeypatch):
    """`placer place --budget S` / `place(policy=..., budget_seconds=S)` (place_settings: budget_after_zero_shot)
    fine-tunes for S seconds after the zero-shot answer, however long the answer took, and the fine-tune's fit
    takes at most half of them. A plain search's budget counts from its start. On a clock that only evaluations
    advance (10 ms each)."""
    import placer.rl.reinforce as reinforce_mod
    import placer.rl.search as search_mod
    from placer.problem import build_problem
    from placer.rl.portable import PortableWeights
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import IMITATION_TIME_SHARE, Search
    from placer.search import place_settings, policy_inputs

    assert place_settings(16)["budget_after_zero_shot"] is True       # what the CLI and the API pass
    with pytest.raises(SearchError, match="--samples must be 1 to 4096 .*--sample-seconds.*got 10000000"):
        place_settings(10_000_000, flag=lambda n: "--" + n.replace("_", "-"))    # it sampled until killed
    clock = [0.0]
    fake = type("Clock", (), {"perf_counter": staticmethod(lambda: clock[0])})
    monkeypatch.setattr(search_mod, "time", fake)
    monkeypatch.setattr(reinforce_mod, "time", fake)
    w = PortableWeights(32, 16, seed=0)          # untrained: its zero-shot best is slower than a baseline
    p = build_problem(nmt_tiny, "3xK80", seed=0)

    class Slow:
        devices = p.simulator.devices

        def evaluate(self, placements):
            clock[0] += 0.01 * len(placements)
            return p.simulator.evaluate(placements)

    try:
        for after in (True, False):
            settings = {**place_settings(16, refine_seconds=600, refine_moves=100), "budget_after_zero_shot": after}
            cfg = ReinforceConfig(seed=0, portable=True, hidden_size=32, attn_size=16, num_samples=4, elite_steps=0,
                                  imitation_steps=20, local_moves=0, **settings)
            s = Search(p.grouping, Slow(), cpu_index=p.cluster.cpu_index, allowed=p.allowed, config=cfg,
                       baselines=p.baselines, progress=False, tensorboard=False,
                       policy_inputs=lambda: policy_inputs(p), pretrained=w)
            fits, imitate = [], s.agent.imitate

            def spy(groups, **k):
                fits.append((clock[0], s.wall_s(), k.get("deadline")))
                return imitate(groups, **k)

            monkeypatch.setattr(s.agent, "imitate", spy)
            res = s.run(0.5, max_updates=2)
            answer = s.history[0]["wall_s"]      # the zero-shot answer's wall: 16 samples and 100 moves, > 0.5 s
            assert s.zero_shot["refine_evaluations"] == 100 and answer > 1.0
            if after:
                assert res.updates == 2 and s._budget[0] == pytest.approx(answer + 0.5)
                (now, wall, deadline), = fits
                assert deadline == pytest.approx(now + IMITATION_TIME_SHARE * (answer + 0.5 - wall))
            else:
                assert res.updates == 0 and res.stop_reason == "budget"
    finally:
        p.close()


def test_fine_tune_fits_the_pretrained_policy_to_its_start_unless_it_beats_every_heuristic(nmt_tiny):
    """Before its first update, a fine-tune whose zero-shot best is slower than some baseline fits the pretrained
    policy to its start (as the warm start fits a fresh policy to its baseline), once, not again on resume; one
    whose zero-shot best beats every baseline keeps the policy as pretrained."""
    from placer.problem import build_problem
    from placer.rl.portable import PortableWeights
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import Search
    from placer.search import policy_inputs

    w = PortableWeights(32, 16, seed=0)          # untrained: its samples are unrelated to any baseline
    p = build_problem(nmt_tiny, "3xK80", seed=0)
    try:
        cfg = ReinforceConfig(seed=0, portable=True, hidden_size=32, attn_size=16, num_samples=4,
                              zero_shot_samples=4, elite_steps=0, local_moves=0)   # imitate: only the start's fit

        def make(baselines):
            return Search(p.grouping, p.simulator, cpu_index=p.cluster.cpu_index, allowed=p.allowed, config=cfg,
                          baselines=baselines, progress=False, tensorboard=False,
                          policy_inputs=lambda: policy_inputs(p), pretrained=w)

        s = make(p.baselines)
        s.run(600.0, max_updates=0)                  # the zero-shot answer: no fitting
        assert "imitation_steps" not in s.zero_shot
        assert s.zero_shot["best_s"] > min(t for t in s.baselines.values() if t is not None)
        greedy0 = s.agent.policy.sample(1, greedy=True)[0][0]
        s.run(600.0, max_updates=1)
        assert s.zero_shot["imitation_steps"] >= 1 and s.start_groups is not None
        greedy = s.agent.policy.sample(1, greedy=True)[0][0]
        agree = float((greedy == s.start_groups).mean())
        assert agree >= 0.9 and agree > float((greedy0 == s.start_groups).mean())
        steps = s.zero_shot["imitation_steps"]
        s.run(600.0, max_updates=2)                  # fitted once: a later run does not fit again
        assert s.zero_shot["imitation_steps"] == steps and s.updates == 2

        # the only heuristic is round-robin, which the zero-shot best beats (at op and at group level): kept
        t = make({"round_robin": p.baselines["round_robin"]})
        t.run(600.0, max_updates=0)
        assert t.zero_shot["best_s"] < t.baselines["round_robin"]
        fits = []
        t.agent.imitate = lambda *a, **k: fits.append(a)       # noqa: E731  (elite_steps=0: no other caller)
        t.run(600.0, max_updates=1)
        assert t.zero_shot["imitation_steps"] == 0 and t.updates == 1 and fits == []
    finally:
        p.close()


@pytest.mark.slow     # ~12 s: builds and trains on two problems (make test-slow)
def test_pretrain_writes_a_policy_that_loads(tmp_path):
    from placer.pretrain import CorpusItem, pretrain
    from placer.rl.portable import PortableWeights

    info = pretrain(tmp_path / "p", budget_seconds=4, corpus=[CorpusItem("rnnlm", "2xK80", "tiny"),
                                                              CorpusItem("random", "3xV100", seed=2)],
                    hidden_size=16, attn_size=8, imitation_share=0.0)   # REINFORCE from the start: >= 1 update under load
    assert info["problems"] == ["rnnlm_tiny@2xK80", "random_2@3xV100"] and info["updates"] >= 1
    w = PortableWeights.load(tmp_path / "p")
    assert w.hidden_size == 16 and w.info["budget_s"] == 4
    assert all(np.isfinite(v["greedy_over_best_baseline"]) for v in info["per_problem"].values())


def test_pretrain_goes_on_from_a_policy(tmp_path):
    """`placer pretrain --init DIR`: training starts from that policy's weights (its sizes win) and the new
    policy.json says where it came from; a bad --init gets one line."""
    from placer.cli import main
    from placer.pretrain import CorpusItem, pretrain
    from placer.rl.portable import PortableWeights

    corpus = [CorpusItem("rnnlm", "2xK80", "tiny")]
    first = PortableWeights(16, 8, seed=4)
    first.save(tmp_path / "a", info={"corpus": "test", "budget_s": 1.0, "date": "then"})
    start = {k: v.copy() for k, v in PortableWeights.load(tmp_path / "a").state().items()}
    info = pretrain(tmp_path / "b", budget_seconds=3, corpus=corpus, hidden_size=64, attn_size=32,
                    imitation_share=0.0, init=str(tmp_path / "a"))
    assert info["init"]["policy"] == str(tmp_path / "a") and info["init"]["date"] == "then" and info["updates"] >= 1
    w = PortableWeights.load(tmp_path / "b")
    assert (w.hidden_size, w.attn_size) == (16, 8) and w.info["init"]["budget_s"] == 1.0
    after = w.state()
    assert set(after) == set(start) and any(not np.array_equal(after[k], start[k]) for k in start)
    fresh = PortableWeights(16, 8, seed=0).state()
    gap = lambda s: sum(float(np.abs(s[k] - start[k]).sum()) for k in start)     # noqa: E731
    assert gap(after) < gap(fresh)          # it moved from the given weights, not from a new draw
    assert main(["pretrain", "--out", str(tmp_path / "c"), "--budget", "1", "--corpus", "quick",
                 "--init", str(tmp_path / "nope"), "--no-progress"]) == 2


def test_an_interrupted_pretrain_saves_the_policy_trained_so_far(tmp_path, capsys, monkeypatch):
    """Ctrl-C (or SIGTERM) during `placer pretrain` lost every minute trained: nothing was written. Now the
    current step ends, the policy so far is saved ("stop_reason": "interrupted" in policy.json) and the command
    names it and how to train on from it, exiting 130."""
    import signal

    import placer.pretrain as pt
    import placer.rl.reinforce as rf
    from placer.cli import main
    from placer.pretrain import CorpusItem
    from placer.rl.portable import PortableWeights
    from placer.rl.search import Interrupted

    real = rf.reinforce_update

    def ctrl_c_in_first_update(*a, **k):
        signal.raise_signal(signal.SIGINT)
        return real(*a, **k)

    monkeypatch.setattr(rf, "reinforce_update", ctrl_c_in_first_update)
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)     # a terminal's (pytest-xdist ignores it)
    try:
        with pytest.raises(Interrupted):
            pt.pretrain(tmp_path / "p", budget_seconds=600, corpus=[CorpusItem("rnnlm", "2xK80", "tiny")],
                        hidden_size=16, attn_size=8, imitation_share=0.0)
    finally:
        signal.signal(signal.SIGINT, saved)
    w = PortableWeights.load(tmp_path / "p")
    assert w.info["stop_reason"] == "interrupted" and w.info["updates"] == 1 and w.info["train_wall_s"] < 600

    def stopped(out, **kw):      # the command's message, on the policy just saved
        raise Interrupted(signal.SIGINT)

    monkeypatch.setattr(pt, "pretrain", stopped)
    assert main(["pretrain", "--out", str(tmp_path / "p"), "--force", "--no-progress"]) == 130
    err = capsys.readouterr().err
    assert f"policy trained so far is in {tmp_path / 'p'} (train on from it with --init" in err, err


def test_pretrain_never_overwrites_a_policy_without_force(capsys, tmp_path, monkeypatch):
    """`placer pretrain --out DIR` silently replaced the policy DIR held (hours of training): refused now, one line
    naming the file, before any work (the library too); --force overwrites it."""
    import placer.pretrain as pt
    from placer.cli import main
    from placer.rl.portable import PortableWeights

    d = tmp_path / "p"
    PortableWeights(16, 8, seed=0).save(d, info={"mine": True})
    before = {f: (d / f).read_bytes() for f in ("policy.npz", "policy.json")}
    monkeypatch.setattr(pt, "_task", lambda *a, **k: pytest.fail("the corpus was built"))
    assert main(["pretrain", "--out", str(d), "--budget", "1", "--corpus", "quick", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"already holds a policy ({d / 'policy.npz'})" in err and "--force" in err
    with pytest.raises(SearchError, match="already holds a policy .*overwrite=True"):
        pt.pretrain(d, budget_seconds=1, corpus="quick")
    assert {f: (d / f).read_bytes() for f in before} == before
    calls = []
    done = {"problems": [], "skipped": {}, "corpus": "quick", "train_wall_s": 0.0, "updates": 0,
            "build_wall_s": 0.0, "per_problem": {}}
    monkeypatch.setattr(pt, "pretrain", lambda out, **kw: calls.append(kw["overwrite"]) or done)
    assert main(["pretrain", "--out", str(d), "--budget", "1", "--corpus", "quick", "--no-progress",
                 "--force"]) == 0 and calls == [True]


def test_random_towers_are_independent_until_the_merge():
    """A random tower model (the `wide` corpus) has side-by-side towers: in the forward pass no tower's op feeds
    another tower's op (they meet only at the merge), and `precision` builds it under the fp16 policy."""
    import networkx as nx

    from placer.graphs.models.random_stack import build_random_towers, describe_towers
    from placer.pretrain import HELD_OUT, wide_corpus

    seed = 7                                  # the smallest of seeds 0-7: two towers, ~2,900 ops
    g = build_random_towers(seed, precision="fp16")
    n = len(describe_towers(seed)["towers"])
    assert n >= 2 and g.precision == "fp16"
    assert any(t == "Cast" for t in g.types), "an fp16 model casts its fp32 variables"
    fwd = f"towers_{seed}_1/"
    dg = nx.DiGraph((int(a), int(b)) for a, b in zip(g.edge_src, g.edge_dst))
    towers = [{i for i, nm in enumerate(g.names) if nm.startswith(f"{fwd}tower_{t}_")} for t in range(n)]
    merge = {i for i, nm in enumerate(g.names) if nm.startswith(f"{fwd}merge")}
    assert all(towers) and merge
    for t in range(n):
        reach = set().union(*(nx.descendants(dg, i) for i in towers[t] if i in dg))
        assert reach & merge, f"tower {t} does not reach the merge"
        for u in range(n):
            if u != t:
                assert not reach & towers[u], f"tower {t} feeds tower {u} before the merge"
    names = [c.name for c in wide_corpus()]
    assert len(set(names)) == len(names) and "towers_0@DGX1:fp16" in names
    assert not any(nm.startswith(HELD_OUT) for nm in names)


def test_parallel_corpus_adds_large_batch_towers_on_many_devices():
    """The `parallel` corpus is the default one plus twelve tower models at batch 256 or 512 on 4-8 devices, with
    unique names and no held-out family."""
    from placer.pretrain import CORPORA, HELD_OUT, default_corpus, parallel_corpus
    from placer.sim.cluster import parse_cluster

    items = CORPORA["parallel"]()
    names = [c.name for c in items]
    assert len(set(names)) == len(names) and not any(nm.startswith(HELD_OUT) for nm in names)
    assert names[:len(default_corpus())] == [c.name for c in default_corpus()]
    extra = parallel_corpus()[len(default_corpus()):]
    assert len(extra) == 12 and {c.model for c in extra} == {"towers"}
    assert {c.batch_size for c in extra} == {256, 512}
    assert {c.precision for c in extra} == {"fp32", "fp16"}
    assert all(sum(not d.is_cpu for d in parse_cluster(c.cluster).devices) >= 4 for c in extra)


def _tiny_task(item, split_groups=None):
    """One pretraining corpus task (`placer.pretrain._task`) with a small fresh portable policy and its Adam."""
    import keras
    import tensorflow as tf

    from placer.pretrain import _task
    from placer.rl.policy import POLICY_DEVICE
    from placer.rl.portable import PortableWeights
    from placer.rl.reinforce import ReinforceConfig

    config = ReinforceConfig(seed=0, hidden_size=16, attn_size=8, portable=True)
    w = PortableWeights(16, 8, config.forget_bias, seed=0)
    with tf.device(POLICY_DEVICE):
        opt = keras.optimizers.Adam(1e-3)
        opt.build(list(w.trainable_variables))
    return _task(item, w, opt, config, 0, split_groups)


def test_pretrain_names_an_unknown_split_groups_before_building_its_corpus(tmp_path, monkeypatch):
    """`placer pretrain --split-groups bogus` said so only after building every corpus problem (minutes)."""
    import placer.pretrain as pt
    from placer.pretrain import pretrain

    monkeypatch.setattr(pt, "_task", lambda *a, **k: pytest.fail("the corpus was built"))
    with pytest.raises(SearchError, match="cannot split groups by 'bogus': no such baseline .*best"):
        pretrain(tmp_path / "p", budget_seconds=5, split_groups="bogus")


def test_pretrain_split_groups_imitates_the_best_baseline_exactly(capsys, tmp_path):
    """`placer pretrain --split-groups best`: each corpus problem's groups follow its fastest baseline's devices,
    so the imitation target is that baseline exactly (the same simulated step time), not its group-majority
    version; a baseline name that does not exist skips every problem with one clear error."""
    from placer.errors import SearchError
    from placer.pretrain import CorpusItem, pretrain

    t = _tiny_task(CorpusItem("nmt", "4xK80", "tiny"), split_groups="best")
    try:
        assert t.problem.meta["split_groups"] in t.problem.baselines
        assert t.target is not None and t.target_s == pytest.approx(t.best_baseline_s, rel=1e-9)
    finally:
        t.problem.close()
    with pytest.raises(SearchError, match="cannot split groups by 'nope': no such baseline"):   # before the corpus
        pretrain(tmp_path / "a", budget_seconds=1, corpus=[CorpusItem("rnnlm", "2xK80", "tiny")], split_groups="nope")
    from placer.cli import main

    assert main(["pretrain", "--out", str(tmp_path / "b"), "--budget", "1", "--corpus", "quick", "--split-groups", "nope",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'nope'" in err               # one line, naming the bad baseline


def test_pretrain_teacher_imitates_the_annealed_placement(capsys, tmp_path):
    """`placer pretrain --teacher-seconds S`: each problem's imitation target becomes its best grouped baseline
    annealed for S seconds when that is faster (the target's own simulated step time is the one recorded), and a
    negative S gets one line."""
    from placer.cli import main
    from placer.pretrain import CorpusItem, _teach

    t = _tiny_task(CorpusItem("random", "3xV100", seed=2))
    try:
        before, start = t.target_s, t.target.copy()
        wall = _teach([t], 2.0, 0, progress=False)
        assert wall >= 2.0 and t.teacher_s is not None
        assert t.target_s == t.teacher_s < before and not np.array_equal(t.target, start)
        p = t.problem
        o = p.simulator.evaluate([p.grouping.expand(t.target, p.cluster.cpu_index)])[0]
        assert o.ok and o.step_time == pytest.approx(t.target_s, rel=1e-9)
        assert p.allowed[np.arange(len(t.target)), t.target].all()
    finally:
        t.problem.close()
    assert main(["pretrain", "--out", str(tmp_path / "b"), "--budget", "1", "--corpus", "quick",
                 "--teacher-seconds", "-1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--teacher-seconds" in err
