"""The search loop: baseline floor, best tracking, stopping rules, checkpoint/resume (incl. SIGKILL), bad input."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from placer.errors import SearchError  # noqa: E402
from placer.rl.reinforce import ReinforceConfig  # noqa: E402
from placer.rl.search import Search, run_loop  # noqa: E402
from placer.sim.evaluator import Evaluator, Outcome  # noqa: E402

DEVICES = ["/GPU:0", "/GPU:1", "/GPU:2", "/CPU:0"]
CPU = 3


@dataclass
class ToyGrouping:
    """Two ops per group; group 0 is CPU-only (as the lead's Grouping: features, cpu_only, expand)."""
    target: np.ndarray  # best device per group

    def __post_init__(self):
        G = len(self.target)
        self.num_groups = G
        self.op_group = np.repeat(np.arange(G), 2).astype(np.int32)
        self.cpu_only = np.zeros(G, bool)
        self.cpu_only[0] = True
        rng = np.random.default_rng(0)
        self.features = np.concatenate([np.eye(4)[self.target], rng.random((G, 3))], 1).astype(np.float32)

    def expand(self, group_devices, cpu_index):
        op = np.asarray(group_devices)[..., self.op_group].astype(np.int32)
        op[..., self.op_group == 0] = cpu_index
        return op


class ToyEvaluator(Evaluator):
    """step time = 1 + 0.05 × (ops off their target device); more than `cap` ops on one GPU = OOM."""

    def __init__(self, target_ops: np.ndarray, cap: int = 10**9, delay: float = 0.0):
        self.devices = DEVICES
        self.target_ops = target_ops
        self.cap = cap
        self.delay = delay
        self.calls = 0

    def evaluate(self, placements):
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        out = []
        for p in placements:
            t = 1.0 + 0.05 * float((np.asarray(p) != self.target_ops).sum())
            use = np.bincount(p, minlength=len(DEVICES)).astype(np.int64) * 100
            if (use[:3] > self.cap * 100).any():
                out.append(Outcome.failure("oom", oom=True, step_time=t, peak_memory=use))
            else:
                out.append(Outcome(step_time=t, peak_memory=use))
        return out


def _setup(G=8, seed=0, **ev):
    rng = np.random.default_rng(seed)
    target = rng.integers(0, 3, G)
    target[0] = CPU
    gr = ToyGrouping(target)
    return gr, ToyEvaluator(gr.expand(target, CPU), **ev)


SMALL = dict(hidden_size=32, attn_size=16)
# the papers' cold start (logit noise, no warm start), for tests where the optimum is far from every baseline
COLD = dict(SMALL, noise_scale=0.5, imitation_steps=0)


def test_search_beats_baseline_and_reaches_optimum(tmp_path):
    gr, ev = _setup()
    single = gr.expand(np.zeros(gr.num_groups, int), CPU)
    res = run_loop(gr, ev, budget_seconds=120, max_updates=150, patience=None, seed=0, out_dir=tmp_path,
                     baselines={"single_gpu": single}, cpu_index=CPU, progress=False,
                     config=ReinforceConfig(seed=0, **COLD), device_capacity=[1e9] * 4)
    assert res.baselines["single_gpu"] == pytest.approx(ev.evaluate([single])[0].step_time)
    assert res.step_time <= res.baselines["single_gpu"]
    assert res.step_time == pytest.approx(1.0)          # the known optimum
    assert res.source == "search" and res.search_best == pytest.approx(1.0)
    np.testing.assert_array_equal(res.placement, ev.target_ops)
    assert (res.placement[gr.op_group == 0] == CPU).all()  # CPU-only group stayed on the CPU
    rows = res.history
    assert res.updates == len(rows) and res.evaluations == 1 + sum(int(h["new"]) for h in rows)
    assert all(h["new"] <= 16 for h in rows)
    assert all(rows[i]["best_s"] >= rows[i + 1]["best_s"] for i in range(len(rows) - 1))
    for f in ("curve.png", "checkpoint/state.json"):
        assert (tmp_path / f).exists(), f
    assert any((tmp_path / "tb").iterdir())


def test_tb_is_written_when_no_update_ran(tmp_path, tb_scalars):
    """CLI.md promises tb/ in every search directory: with no policy update (max_updates=0, one allowed device)
    it holds the baselines and the best so far."""
    gr, ev = _setup()
    single = gr.expand(np.zeros(gr.num_groups, int), CPU)
    res = run_loop(gr, ev, budget_seconds=60, max_updates=0, out_dir=tmp_path / "a", cpu_index=CPU, progress=False,
                   baselines={"single_gpu": single}, config=ReinforceConfig(**SMALL))
    assert res.updates == 0
    scalars = tb_scalars(tmp_path / "a" / "tb")
    assert scalars["baseline/single_gpu"] == [(0, pytest.approx(res.baselines["single_gpu"]))]
    assert scalars["step_time/best_so_far"] == [(0, pytest.approx(res.step_time))]
    assert "step_time/policy_best" not in scalars          # no sample: the infinite best is not written
    allowed = np.zeros((gr.num_groups, 4), bool)
    allowed[:, CPU] = True
    run_loop(gr, ev, budget_seconds=60, out_dir=tmp_path / "b", cpu_index=CPU, allowed=allowed, progress=False)
    assert "step_time/best_so_far" in tb_scalars(tmp_path / "b" / "tb")


def test_max_updates_0_evaluates_the_baselines_without_a_warm_start_fit():
    """max_updates=0 (`--max-updates 0`): the baselines alone, with no imitation fit that no update would use; a
    later run with updates makes the warm start then."""
    gr, ev = _setup()
    s = Search(gr, ev, cpu_index=CPU, baselines={"expert": ev.target_ops.copy()}, progress=False,
               config=ReinforceConfig(imitation_steps=200, imitation_prob=0.9, **SMALL))
    res = s.run(60, max_updates=0)
    assert res.updates == 0 and not s.imitated and not s.grouped_times and s.evaluations == 1
    s.run(60, max_updates=1)
    assert s.imitated == "expert" and s.grouped_times


def test_warm_start_imitates_best_baseline():
    gr, ev = _setup()
    perfect = ev.target_ops.copy()
    s = Search(gr, ev, cpu_index=CPU, baselines={"expert": perfect}, progress=False,
               config=ReinforceConfig(imitation_steps=200, imitation_prob=0.9, **SMALL))
    res = s.run(60, max_updates=1)
    assert s.imitated == "expert" and res.evaluations == 1 + 1 + res.history[0]["new"]   # baseline, its group
    assert 0 < res.history[0]["new"] <= 16                                            # version, 1 update
    actions, _ = s.agent.sample(32)
    assert (actions == gr.target[None]).mean() > 0.8                  # the policy now samples near the baseline


def test_baseline_floor_and_stopping_rules():
    gr, ev = _setup()
    perfect = ev.target_ops.copy()
    res = run_loop(gr, ev, budget_seconds=60, max_updates=3, baselines={"expert": perfect}, cpu_index=CPU,
                     progress=False, config=ReinforceConfig(**SMALL))
    assert res.source == "expert" and res.step_time == 1.0     # never worse than the best baseline
    assert res.updates == 3 and res.stop_reason == "max_updates"
    assert res.search_best >= 1.0
    res = run_loop(gr, ev, budget_seconds=60, max_updates=100, patience=2, cpu_index=CPU, progress=False,
                     config=ReinforceConfig(**SMALL))
    assert res.stop_reason in ("patience", "max_updates") and res.updates < 100
    t0 = time.perf_counter()
    slow = ToyEvaluator(ev.target_ops, delay=0.3)
    res = run_loop(gr, slow, budget_seconds=1.0, cpu_index=CPU, progress=False, config=ReinforceConfig(**SMALL))
    assert res.stop_reason == "budget" and time.perf_counter() - t0 < 30


def test_bad_input_budget_and_one_device():
    gr, ev = _setup()
    with pytest.raises(SearchError, match="budget must be positive"):
        run_loop(gr, ev, budget_seconds=0, cpu_index=CPU, progress=False)
    # one allowed device per group: no search, returns at once
    allowed = np.zeros((gr.num_groups, 4), bool)
    allowed[:, CPU] = True
    res = run_loop(gr, ev, budget_seconds=60, cpu_index=CPU, allowed=allowed, progress=False)
    assert res.stop_reason == "one_device" and res.updates == 0 and ev.calls == 1
    assert (res.placement == CPU).all()


def test_nothing_fits_names_memory():
    gr, ev = _setup(cap=1)   # at most one op per GPU: every placement with 2-op groups on a GPU OOMs
    allowed = np.zeros((gr.num_groups, 4), bool)
    allowed[:, :3] = True
    allowed[0] = [False, False, False, True]
    with pytest.raises(SearchError, match=r"needs .* on /GPU:\d, which holds"):
        run_loop(gr, ev, budget_seconds=60, max_updates=2, allowed=allowed, cpu_index=CPU, progress=False,
                   baselines={"single_gpu": gr.expand(np.zeros(gr.num_groups, int), CPU)},
                   config=ReinforceConfig(**SMALL), device_capacity=[100, 100, 100, 10**6])


def test_resume_continues_from_checkpoint(tmp_path):
    gr, ev = _setup()
    kw = dict(cpu_index=CPU, progress=False, config=ReinforceConfig(seed=1, **SMALL), checkpoint_every=4)
    first = run_loop(gr, ev, budget_seconds=120, max_updates=8, out_dir=tmp_path, **kw)
    assert first.updates == 8
    # a fresh Search from the directory continues: same best so far, update count continues
    s = Search(gr, ev, out_dir=tmp_path, **{k: v for k, v in kw.items()})
    assert s.load_checkpoint()
    assert s.updates == 8 and s.best_time == first.step_time and len(s.history) == 8
    np.testing.assert_array_equal(s.best_placement, first.placement)
    res = s.run(120, max_updates=12)
    assert res.updates == 12 and len(res.history) == 12
    assert [r["update"] for r in res.history] == list(range(1, 13))
    assert res.step_time <= first.step_time
    with pytest.raises(SearchError, match="no checkpoint"):
        run_loop(gr, ev, budget_seconds=10, out_dir=tmp_path / "nothing", resume=True, **kw)
    other = ToyGrouping(np.r_[CPU, np.zeros(7, int)])
    with pytest.raises(SearchError, match="another grouping"):
        run_loop(other, ev, budget_seconds=10, out_dir=tmp_path, resume=True, **kw)


class InterruptingEvaluator(ToyEvaluator):
    """Sends this process SIGINT (Ctrl-C) on its `at`-th call, as `timeout -s INT` or a user would."""

    def __init__(self, target_ops, at: int, sig=signal.SIGINT):
        super().__init__(target_ops)
        self.at, self.sig = at, sig

    def evaluate(self, placements):
        if self.calls + 1 == self.at:
            signal.raise_signal(self.sig)
        return super().evaluate(placements)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_saves_the_work_since_the_last_checkpoint(tmp_path, sig):
    """An interrupted (SIGINT) or politely killed (SIGTERM) search raises KeyboardInterrupt only after
    checkpointing its updates so far (not just those of the last periodic checkpoint); a resume continues."""
    gr, ev = _setup()
    ev = InterruptingEvaluator(ev.target_ops, at=12, sig=sig)
    kw = dict(cpu_index=CPU, progress=False, config=ReinforceConfig(seed=1, **SMALL), checkpoint_every=1000)
    # Python's own handlers, as a search started from a terminal has them (a pytest-xdist worker ignores SIGINT)
    saved = {s_: signal.signal(s_, h) for s_, h in ((signal.SIGINT, signal.default_int_handler),
                                                      (signal.SIGTERM, signal.SIG_DFL))}
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            run_loop(gr, ev, budget_seconds=120, max_updates=10**6, out_dir=tmp_path, **kw)
        assert info.value.signum == sig      # the CLI exits with 128 + it (130 for Ctrl-C, 143 for SIGTERM)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # the handlers are restored
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        for s_, h in saved.items():
            signal.signal(s_, h)
    state = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert state["updates"] >= 1 and state["evaluations"] > 1
    s = Search(gr, ev, out_dir=tmp_path, **kw)
    assert s.load_checkpoint() and s.updates == state["updates"]
    res = s.run(120, max_updates=state["updates"] + 2)
    assert res.updates == state["updates"] + 2


class CrashingEvaluator(ToyEvaluator):
    """Fails hard on its `at`-th call, as a kill -9 or a crash would end the process (no handler runs)."""

    def __init__(self, target_ops, at: int):
        super().__init__(target_ops)
        self.at = at

    def evaluate(self, placements):
        if self.calls + 1 == self.at:
            raise SystemError("crash")
        return super().evaluate(placements)


def test_checkpoints_are_also_timed(tmp_path):
    """Besides every `checkpoint_every` updates, the loop checkpoints after an update once `checkpoint_seconds`
    passed since the last save: a crash loses at most about that much work, not `checkpoint_every` updates."""
    gr, ev = _setup()
    ev = CrashingEvaluator(ev.target_ops, at=12)
    s = Search(gr, ev, cpu_index=CPU, progress=False, config=ReinforceConfig(seed=1, **SMALL), checkpoint_every=1000,
               out_dir=tmp_path)
    s.checkpoint_seconds = 0.0
    with pytest.raises(SystemError):
        s.run(120, max_updates=10**6)
    state = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert state["updates"] >= 1 and state["updates"] == s.updates


def test_nothing_fits_never_counts_negative_samples():
    """Baselines that share one placement are measured once, so evaluations < baselines: the message said
    "11 baseline(s) and -1 sampled placement(s) tried"."""
    gr, ev = _setup()
    s = Search(gr, ev, cpu_index=CPU, progress=False, config=ReinforceConfig(seed=1, **SMALL))
    s.baselines = {f"b{i}": None for i in range(11)}
    s.evaluations = 10
    assert "11 baseline(s) and 0 sampled placement(s) tried" in str(s._nothing_fits())


_CHILD = textwrap.dedent("""
    import sys, numpy as np
    sys.path.insert(0, {tests!r})
    from test_rl_search import _setup, SMALL, CPU
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import run_loop
    gr, ev = _setup()
    run_loop(gr, ev, budget_seconds=600, max_updates=10**6, out_dir={out!r}, cpu_index=CPU, progress=False,
               config=ReinforceConfig(seed=2, **SMALL), checkpoint_every=3, resume={resume})
""")


def test_resume_after_sigkill(tmp_path):
    """kill -9 mid-search loses at most one checkpoint interval; resuming continues the count."""
    out = tmp_path / "run"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    code = _CHILD.format(tests=str(Path(__file__).parent), out=str(out), resume=False)
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.DEVNULL)
    ckpt = out / "checkpoint" / "state.json"
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            if ckpt.exists():
                try:
                    st = json.loads(ckpt.read_text())
                except Exception:
                    st = None
                if st and st["updates"] >= 6:
                    break
            assert proc.poll() is None, "search child died"
            time.sleep(0.2)
        else:
            pytest.fail("no checkpoint with 6 updates in time")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    st = json.loads(ckpt.read_text())
    done = st["updates"]
    assert done >= 6 and done % 3 == 0
    gr, ev = _setup()
    s = Search(gr, ev, out_dir=out, cpu_index=CPU, progress=False, config=ReinforceConfig(seed=2, **SMALL))
    assert s.load_checkpoint() and s.updates == done and s.best_time == st["best_time"]
    res = s.run(600, max_updates=done + 2)
    assert res.updates == done + 2 and res.history[-1]["update"] == done + 2
    assert res.step_time <= st["best_time"]
    json.dumps(res.summary())   # the summary is plain JSON


def test_checkpoint_is_data_and_bad_ones_get_one_line(tmp_path):
    """The checkpoint is JSON + an npz without object arrays; an old pickled one, a corrupt one, one whose
    arrays file is missing and one with settings of a newer placer are each refused with a SearchError naming
    the file."""
    gr, ev = _setup()
    kw = dict(cpu_index=CPU, progress=False, config=ReinforceConfig(seed=1, **SMALL))
    run_loop(gr, ev, budget_seconds=60, max_updates=2, out_dir=tmp_path, **kw)
    ck = tmp_path / "checkpoint"
    state = json.loads((ck / "state.json").read_text())
    with np.load(ck / state["arrays"], allow_pickle=False) as z:      # loads without pickle
        assert any(k.startswith("policy/") for k in z.files) and "best_placement" in z.files
    assert sorted(p.name for p in ck.glob("arrays-*.npz")) == [state["arrays"]]   # older arrays removed
    (ck / "state.json").write_text('{"format": 2, "arr')
    with pytest.raises(SearchError, match=r"cannot read checkpoint .*state.json"):
        Search(gr, ev, out_dir=tmp_path, **kw).load_checkpoint()
    (ck / "state.json").write_text(json.dumps({**state, "arrays": "gone.npz"}))
    with pytest.raises(SearchError, match=r"cannot read checkpoint .*state.json"):
        Search(gr, ev, out_dir=tmp_path, **kw).load_checkpoint()
    (ck / "state.json").write_text(json.dumps({**state, "config": {**state["config"], "future_knob": 1}}))
    with pytest.raises(SearchError, match=r"settings this placer does not know \(future_knob\).*newer version"):
        Search(gr, ev, out_dir=tmp_path, **kw).load_checkpoint()
    # a key missing or of the wrong type (a hand-edited or damaged state.json) was a KeyError/TypeError traceback
    for bad in ({k: v for k, v in state.items() if k != "best_time"}, {**state, "history": 3}):
        (ck / "state.json").write_text(json.dumps(bad))
        with pytest.raises(SearchError, match=r"checkpoint .*state.json is incomplete or corrupt"):
            Search(gr, ev, out_dir=tmp_path, **kw).load_checkpoint()
    # a truncated arrays npz (still starting "PK") is named, not numpy's BadZipFile traceback
    (ck / "state.json").write_text(json.dumps(state))
    npz = ck / state["arrays"]
    npz.write_bytes(npz.read_bytes()[:200])
    with pytest.raises(SearchError, match=rf"cannot read checkpoint .*state.json: .*{state['arrays']} is not an npz"):
        Search(gr, ev, out_dir=tmp_path, **kw).load_checkpoint()
    (ck / "state.json").unlink()
    (ck / "state.pkl").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(SearchError, match=r"state.pkl is in an old format \(a pickle\)"):
        Search(gr, ev, out_dir=tmp_path, **kw).load_checkpoint()


def test_elite_steps_refit_policy_to_new_best():
    # cross-entropy step (Post, 2018): after an update samples a new best, the policy's mode is that placement
    gr, ev = _setup(G=8, seed=2, cap=10**6)
    s = Search(gr, ev, cpu_index=CPU, progress=False,
               config=ReinforceConfig(imitation_steps=0, elite_steps=300, imitation_prob=0.95, **SMALL))
    s.run(60, max_updates=1)
    assert s.search_best_groups is not None
    greedy, _ = s.agent.sample(1, greedy=True)
    np.testing.assert_array_equal(greedy[0], s.search_best_groups)
    s_off = Search(gr, ev, cpu_index=CPU, progress=False,
                   config=ReinforceConfig(imitation_steps=0, elite_steps=0, **SMALL))
    s_off.run(60, max_updates=1)
    greedy_off, _ = s_off.agent.sample(1, greedy=True)
    assert not np.array_equal(greedy_off[0], s_off.search_best_groups)   # one plain REINFORCE step does not


class FlatEvaluator(ToyEvaluator):
    """Every placement takes 1 s: no sample is ever better than the first."""

    def evaluate(self, placements):
        return [Outcome(step_time=1.0, peak_memory=np.zeros(len(DEVICES))) for _ in placements]


def test_restarts_refit_the_start_when_the_run_stalls(tmp_path):
    # after restart_updates updates without a better sample the policy is re-fitted to the warm-start placement
    # and the run's elite starts afresh; the search's best, and the count, survive a resume
    gr, ev = _setup(G=8, seed=3)
    start = gr.expand(np.full(gr.num_groups, 1), CPU)
    cfg = ReinforceConfig(imitation_steps=300, imitation_prob=0.9, restart_updates=3, **SMALL)
    s = Search(gr, FlatEvaluator(ev.target_ops), cpu_index=CPU, baselines={"single_gpu": start}, progress=False,
               config=cfg, out_dir=tmp_path)
    res = s.run(120, max_updates=8)
    # the warm start is the first run's elite: updates 1-3 find nothing better → restart; 4 sets the new run's
    # elite; 5-7 find nothing better → restart; 8 sets it again
    assert s.restarts == 2 and [r["restarts"] for r in res.history] == [0, 0, 1, 1, 1, 1, 2, 2]
    assert s.since_elite == 0 and s.search_best == 1.0
    greedy, _ = s.agent.sample(1, greedy=True)
    np.testing.assert_array_equal(greedy[0][1:], s.start_groups[1:])     # group 0 is CPU-only
    r = Search(gr, FlatEvaluator(ev.target_ops), cpu_index=CPU, baselines={"single_gpu": start}, progress=False,
               config=cfg, out_dir=tmp_path)
    assert r.load_checkpoint() and r.restarts == 2
    np.testing.assert_array_equal(r.start_groups, s.start_groups)
    cfg0 = ReinforceConfig(imitation_steps=300, imitation_prob=0.9, restart_updates=0, **SMALL)
    off = Search(gr, FlatEvaluator(ev.target_ops), cpu_index=CPU, baselines={"single_gpu": start}, progress=False,
                 config=cfg0)
    off.run(120, max_updates=8)
    assert off.restarts == 0


class MissingDeviceEvaluator(ToyEvaluator):
    """Every placement that uses /GPU:2 fails as on a worker that lacks the device (not a memory failure)."""

    def evaluate(self, placements):
        out = super().evaluate(placements)
        return [Outcome.failure("device /GPU:2 does not exist here (the worker has /GPU:0, /GPU:1, /CPU:0)")
                if (np.asarray(p) == 2).any() else o for p, o in zip(placements, out)]


def test_search_stops_when_most_evaluations_fail_for_one_reason(tmp_path):
    gr, ev = _setup(G=8)
    bad = MissingDeviceEvaluator(ev.target_ops)
    with pytest.raises(SearchError, match=r"search stopped: \d+ of \d+ evaluations failed with the same error.*"
                                          r"device /GPU:2 does not exist here"):
        run_loop(gr, bad, budget_seconds=120, max_updates=50, cpu_index=CPU, progress=False, out_dir=tmp_path,
                 config=ReinforceConfig(seed=0, **COLD))
    state = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert state["updates"] == 3 and max(state["failure_counts"].values()) >= state["evaluated"] / 2  # nothing lost
    # the same search with the device present runs to its update budget
    res = run_loop(gr, ev, budget_seconds=120, max_updates=5, cpu_index=CPU, progress=False,
                   config=ReinforceConfig(seed=0, **COLD))
    assert res.updates == 5


class RecordingEvaluator(ToyEvaluator):
    """Keeps every op placement it was asked to evaluate."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.seen: list[bytes] = []

    def evaluate(self, placements):
        self.seen.extend(np.asarray(p, np.int32).tobytes() for p in placements)
        return super().evaluate(placements)


def test_placements_already_evaluated_are_not_evaluated_again(tmp_path):
    # ReinforceConfig.reuse_evaluations (the annealer's rule): once the policy concentrates, most of its samples
    # repeat placements it has evaluated; those are looked up, not evaluated, and the policy draws more
    gr, ev = _setup(G=8, seed=4)
    single = gr.expand(np.zeros(gr.num_groups, int), CPU)
    kw = dict(cpu_index=CPU, baselines={"single_gpu": single}, progress=False)
    rec = RecordingEvaluator(ev.target_ops)
    s = Search(gr, rec, config=ReinforceConfig(seed=0, reuse_evaluations=True, **SMALL), out_dir=tmp_path, **kw)
    res = s.run(120, max_updates=25)
    after_start = rec.seen[2:]                    # the op-level baseline, its grouped version, then the updates
    assert len(set(after_start)) == len(after_start) and single.astype(np.int32).tobytes() not in after_start
    assert res.evaluations == len(rec.seen) == 2 + sum(int(h["new"]) for h in res.history)
    assert all(h["new"] <= 16 and h["drawn"] >= h["new"] for h in res.history)
    assert sum(h["drawn"] for h in res.history) > sum(h["new"] for h in res.history)   # repeats were drawn
    assert len(s.cache) == res.evaluations - 1                           # every group placement evaluated
    r = Search(gr, rec, config=ReinforceConfig(seed=0, reuse_evaluations=True, **SMALL), out_dir=tmp_path, **kw)
    assert r.load_checkpoint() and len(r.cache) == len(s.cache)        # the cache survives a resume
    assert r.cache.get(s.search_best_groups)[0] == pytest.approx(s.search_best)
    # the same search without the rule evaluates repeats
    rec_off = RecordingEvaluator(ev.target_ops)
    off = Search(gr, rec_off, config=ReinforceConfig(seed=0, reuse_evaluations=False, **SMALL), **kw)
    res_off = off.run(120, max_updates=25)
    assert res_off.evaluations == 2 + 16 * 25 and len(set(rec_off.seen[2:])) < len(rec_off.seen[2:])


def test_evaluation_cache_keeps_only_outcomes_that_would_repeat():
    from placer.rl.reinforce import EvaluationCache

    c = EvaluationCache()
    c.put([0, 1], Outcome(step_time=1.5), 1.5)
    c.put([1, 1], Outcome.failure("oom", oom=True, step_time=2.0), 20.0)
    c.put([1, 0], Outcome.failure("timed out after 600 s"), 20.0)           # may pass next time: not kept
    c.put([0, 0], Outcome(step_time=float("inf"), failed=True, oom=True, reason="task down", lost_devices=(1,)), 20.0)
    assert len(c) == 2 and c.get([0, 1]) == (1.5, False, 1.5) and c.get([1, 1]) == (2.0, True, 20.0)
    assert c.get([1, 0]) is None and c.get([0, 0]) is None
    back = EvaluationCache.from_arrays(**c.to_arrays())
    assert len(back) == 2 and back.get([1, 1]) == (2.0, True, 20.0)


def test_elite_set_keeps_the_best_distinct_samples_and_the_policy_fits_them_all(tmp_path):
    # elite_size > 1 (the cross-entropy method's elite set): the elite step fits the run's best few distinct
    # samples, not only the best one; the set is kept best first, without copies or failures, and is checkpointed
    gr, ev = _setup(G=8, seed=5)
    s = Search(gr, ev, cpu_index=CPU, progress=False,
               config=ReinforceConfig(imitation_steps=0, elite_steps=20, elite_size=3, **SMALL))
    rows = np.array([[3, 0, 0, 0, 0, 0, 0, 0], [3, 1, 1, 1, 1, 1, 1, 1], [3, 0, 0, 0, 0, 0, 0, 0],
                     [3, 2, 2, 2, 2, 2, 2, 2], [3, 0, 1, 2, 0, 1, 2, 0]], np.int32)
    s._update_elite_set(rows, np.array([1.3, 1.1, 1.3, 0.9, 1.2]), np.array([True, True, True, False, True]))
    assert [t for t, _ in s.elite_set] == [1.1, 1.2, 1.3]           # failed row 3 out, copy of row 0 once
    np.testing.assert_array_equal(np.stack([g for _, g in s.elite_set]), rows[[1, 4, 0]])
    s._update_elite_set(rows[3:4], np.array([1.0]), np.array([True]))
    assert [t for t, _ in s.elite_set] == [1.0, 1.1, 1.2]           # the worst drops out
    # the set's step raises the probability of every member
    members = np.stack([g for _, g in s.elite_set])
    before = s.agent.policy.log_probs(members)[0].numpy()
    s.agent.imitate_set(members, max_steps=20)
    after = s.agent.policy.log_probs(members)[0].numpy()
    assert (after > before).all()
    # a search keeps it, and a resume restores it
    cfg = ReinforceConfig(imitation_steps=0, elite_steps=20, elite_size=3, **SMALL)
    s = Search(gr, ev, cpu_index=CPU, progress=False, out_dir=tmp_path, config=cfg)
    res = s.run(60, max_updates=4)
    assert res.updates == 4 and 1 <= len(s.elite_set) <= 3
    times = [t for t, _ in s.elite_set]
    assert times == sorted(times) and times[0] == pytest.approx(s.elite_time)
    r = Search(gr, ev, cpu_index=CPU, progress=False, out_dir=tmp_path, config=cfg)
    assert r.load_checkpoint()
    assert [t for t, _ in r.elite_set] == times
    np.testing.assert_array_equal(np.stack([g for _, g in r.elite_set]), np.stack([g for _, g in s.elite_set]))


def test_local_moves_refine_the_runs_best_and_count_as_evaluations(tmp_path):
    # ReinforceConfig.local_moves: after every update, batches of an annealing chain's moves (single-group and
    # block moves), the chain jumping to the run's best sample when that is better; an improvement is the run's
    # best (the elite step fits it), every move is an evaluation
    gr, ev = _setup(G=8, seed=6)
    single = gr.expand(np.zeros(gr.num_groups, int), CPU)
    kw = dict(cpu_index=CPU, baselines={"single_gpu": single}, progress=False)
    cfg = ReinforceConfig(seed=0, local_moves=64, local_batch=8, **SMALL)
    rec = RecordingEvaluator(ev.target_ops)
    s = Search(gr, rec, config=cfg, out_dir=tmp_path, **kw)
    res = s.run(120, max_updates=4)
    local = s.local_evaluations
    assert 0 < local <= 4 * 64 and s.local_improvements > 0
    assert res.evaluations == len(rec.seen) == 2 + sum(int(h["new"]) for h in res.history) + local
    assert res.history[-1]["local_evaluations"] == local and res.local == {
        "evaluations": local, "improvements": s.local_improvements, "seconds": round(s.local_seconds, 3),
        "policy_improvements": s.policy_improvements}
    assert 0 <= s.policy_improvements <= res.updates
    ops = np.frombuffer(b"".join(rec.seen), np.int32).reshape(len(rec.seen), -1)
    assert (ops[:, gr.op_group == 0] == CPU).all()               # the CPU-only group never moved
    # the toy cost is separable, so single-group moves reach the optimum within these evaluations;
    # the policy alone, from the same start and seed, does not
    assert res.search_best == pytest.approx(1.0) and res.source == "search"
    alone = Search(gr, ToyEvaluator(ev.target_ops), config=ReinforceConfig(seed=0, **SMALL), **kw).run(120, max_updates=4)
    assert alone.search_best > 1.0
    # a resume restores the counters and the moves' random state
    r = Search(gr, rec, config=cfg, out_dir=tmp_path, **kw)
    assert r.load_checkpoint() and (r.local_evaluations, r.local_improvements) == (local, s.local_improvements)
    assert (r.policy_improvements, r.since_policy_best) == (s.policy_improvements, s.since_policy_best)
    assert (r.share_now, r.share_mark) == (s.share_now, s.share_mark)
    assert r._local_rng.bit_generator.state == s._local_rng.bit_generator.state
    np.testing.assert_array_equal(r._chain, s._chain)
    assert (r._chain_c, r._chain_t0) == (s._chain_c, s._chain_t0) and np.isfinite(s._chain_t0)
    assert r._chain_p0 == s._chain_p0 == 0.0          # the default schedule spans the whole budget
    # max_evaluations bounds the local moves too
    capped = Search(gr, ToyEvaluator(ev.target_ops), config=cfg, **kw).run(120, max_evaluations=50)
    assert capped.evaluations == 50 and capped.stop_reason == "max_evaluations"


def test_policy_guided_moves_follow_the_policys_samples_and_resume(tmp_path):
    # ReinforceConfig.local_policy_prob: a share of the chain's moves go where the policy's recent samples put a
    # group (an average halved each update); the average is kept in the checkpoint; a share that would take the
    # moves' shares over 1 is one line naming it, before any evaluation
    import placer.rl.search as search_mod

    gr, ev = _setup(G=8, seed=6)
    kw = dict(cpu_index=CPU, baselines={"single_gpu": gr.expand(np.zeros(gr.num_groups, int), CPU)}, progress=False)
    cfg = ReinforceConfig(seed=0, local_moves=16, local_batch=8, local_policy_prob=0.5, **SMALL)
    s = Search(gr, ev, config=cfg, out_dir=tmp_path, **kw)
    seen = []
    real = s._note_policy_samples
    s._note_policy_samples = lambda g: (seen.append(np.array(g)), real(g))[1]
    res = s.run(120, max_updates=3)
    assert res.updates == 3 and len(seen) == 3
    expect = None
    for g in seen:
        f = np.zeros(s.allowed.shape)
        np.add.at(f, (np.broadcast_to(np.arange(g.shape[1]), g.shape), g), 1.0 / g.shape[0])
        expect = f if expect is None else search_mod.POLICY_FREQ_DECAY * expect + (1 - search_mod.POLICY_FREQ_DECAY) * f
    np.testing.assert_allclose(s._policy_freq, expect)
    np.testing.assert_allclose(s._policy_freq.sum(axis=1), 1.0)
    r = Search(gr, ev, config=cfg, out_dir=tmp_path, **kw)
    assert r.load_checkpoint()
    np.testing.assert_array_equal(r._policy_freq, s._policy_freq)
    calls = ev.calls
    with pytest.raises(SearchError, match=r"ReinforceConfig.local_policy_prob \(shares? .*0.9"):
        Search(gr, ev, config=ReinforceConfig(local_policy_prob=0.9), **kw)
    assert ev.calls == calls


def _chain_start(monkeypatch):
    """A toy problem, and the bases of the chain's neighbour draws (recorded by a spy on `neighbours`)."""
    import placer.rl.search as search_mod

    gr, ev = _setup(G=8, seed=6)
    kw = dict(cpu_index=CPU, baselines={"single_gpu": gr.expand(np.zeros(gr.num_groups, int), CPU)}, progress=False)
    real, bases = search_mod.neighbours, []
    monkeypatch.setattr(search_mod, "neighbours", lambda g, *a, **k: (bases.append(np.array(g)), real(g, *a, **k))[1])
    return gr, ev, kw, bases


def _chain_base(s: Search, bases: list) -> np.ndarray:
    """Where the chain's next moves start from, when it was at `own` (best seen 40) and the policy has since
    sampled `best` (30)."""
    s._chain, s._chain_c, s._chain_best = OWN.copy(), 50.0, 40.0     # where the chain was, the best it saw
    s.elite_groups, s.elite_time = BEST.copy(), 30.0                  # a better sample of the policy since
    bases.clear()
    s._local_moves()
    return bases[0]


OWN = np.array([CPU, 1, 1, 1, 1, 1, 1, 1], np.int32)
BEST = np.array([CPU, 2, 2, 2, 2, 2, 2, 2], np.int32)


def test_the_chain_jumps_to_a_new_best_of_the_policy_unless_local_jump_is_off(monkeypatch):
    # ReinforceConfig.local_jump: when the policy has sampled a new best of the run since the chain last moved,
    # the chain's next moves start from that best (True, the default) or from its own point, as annealing's do
    gr, ev, kw, bases = _chain_start(monkeypatch)
    for jump in (True, False):
        s = Search(gr, ToyEvaluator(ev.target_ops), config=ReinforceConfig(seed=0, local_moves=8, local_jump=jump,
                                                                              **SMALL), **kw)
        s.run(60, max_updates=1)
        np.testing.assert_array_equal(_chain_base(s, bases), BEST if jump else OWN)


def test_the_chain_jumps_only_once_local_jump_after_of_the_budget_is_spent(monkeypatch):
    # ReinforceConfig.local_jump_after: before that share of the budget the chain keeps its own point (as with
    # local_jump off), from then on it jumps to the policy's new bests
    gr, ev, kw, bases = _chain_start(monkeypatch)
    for progress, expect in ((0.3, OWN), (0.6, BEST)):
        s = Search(gr, ToyEvaluator(ev.target_ops), config=ReinforceConfig(seed=0, local_moves=8, local_jump_after=0.5,
                                                                              **SMALL), **kw)
        s.run(60, max_updates=1)
        monkeypatch.setattr(s, "_progress", lambda p=progress: p)
        np.testing.assert_array_equal(_chain_base(s, bases), expect)


def test_local_restarts_reheat_the_chain_from_the_runs_best_once_per_part(monkeypatch, tmp_path):
    # ReinforceConfig.local_restarts: the chain's schedule is cut into parts; on entering a new part the chain goes
    # back to the run's best (even with local_jump off) and its temperature restarts at T0; within a part it keeps
    # its own point
    gr, ev, kw, bases = _chain_start(monkeypatch)
    for progress, expect, part_q in ((0.3, OWN, 0.6), (0.6, BEST, 0.2)):
        s = Search(gr, ToyEvaluator(ev.target_ops), config=ReinforceConfig(seed=0, local_moves=8, local_jump=False,
                                                                              local_restarts=1, **SMALL), **kw)
        s.run(60, max_updates=1)
        monkeypatch.setattr(s, "_progress", lambda p=progress: p)
        assert s._chain_part()[1] == pytest.approx(part_q)
        np.testing.assert_array_equal(_chain_base(s, bases), expect)
        assert s._chain_seg == (progress >= 0.5)
        bases.clear()
        s._chain = OWN.copy()             # the part's reheat happened: the next call keeps the chain's own point
        s._local_moves()
        np.testing.assert_array_equal(bases[0], OWN)
    with pytest.raises(SearchError, match=r"ReinforceConfig.local_restarts must be a whole number >= 0, got -1"):
        Search(gr, ev, config=ReinforceConfig(local_restarts=-1), **kw)
    cfg = ReinforceConfig(seed=0, local_moves=8, local_restarts=2, **SMALL)   # the part is checkpointed
    s = Search(gr, ToyEvaluator(ev.target_ops), config=cfg, out_dir=tmp_path, **kw)
    s.run(60, max_updates=1)
    s._chain_seg = 2
    s.save_checkpoint()
    r = Search(gr, ToyEvaluator(ev.target_ops), config=cfg, out_dir=tmp_path, **kw)
    assert r.load_checkpoint() and r._chain_seg == 2


def _slow_clock(monkeypatch):
    """The search's clock advanced only by evaluations, 10 ms each: (the evaluator class, grouping, toy evaluator,
    Search keywords)."""
    import placer.rl.search as search_mod

    clock = [0.0]
    monkeypatch.setattr(search_mod, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: clock[0])}))

    class Slow(ToyEvaluator):
        def evaluate(self, placements):
            clock[0] += 0.01 * len(placements)
            return super().evaluate(placements)

    gr, ev = _setup(G=8, seed=6)
    kw = dict(cpu_index=CPU, baselines={"single_gpu": gr.expand(np.zeros(gr.num_groups, int), CPU)}, progress=False)
    return Slow, gr, ev, kw


def test_local_share_gives_the_chain_its_share_of_the_wall_time(monkeypatch):
    # ReinforceConfig.local_share: past `local_moves`, the chain goes on until its moves have taken that share of
    # the search's wall time so far, within the budget. On a clock that only evaluations advance (10 ms each), a
    # call leaves the chain at or above its share exactly
    Slow, gr, ev, kw = _slow_clock(monkeypatch)
    cfg = ReinforceConfig(seed=0, local_moves=8, local_batch=8, local_share=0.75, **SMALL)
    s = Search(gr, Slow(ev.target_ops), config=cfg, **kw)
    calls, local_moves = [], s._local_moves

    def spy(limit=None):
        out = local_moves(limit)
        calls.append((s.local_seconds, s.wall_s()))
        return out

    monkeypatch.setattr(s, "_local_moves", spy)
    res = s.run(1000, max_updates=3)
    assert res.updates == 3 and len(calls) == 3
    for used, wall in calls:
        assert used >= 0.75 * wall - 1e-9
    plain = Search(gr, Slow(ev.target_ops), config=ReinforceConfig(seed=0, local_moves=8, local_batch=8, **SMALL),
                   **kw)
    plain.run(1000, max_updates=3)
    assert plain.local_evaluations == 24 < s.local_evaluations
    # the wall budget bounds the extra moves: they stop within one batch (80 ms here) of it
    b = Search(gr, Slow(ev.target_ops), config=cfg, **kw).run(1.0, max_updates=50)
    assert b.stop_reason == "budget" and 1.0 <= b.wall_s <= 1.08 + 1e-9


def test_the_chain_takes_more_of_the_wall_while_the_policy_brings_no_best(monkeypatch):
    # ReinforceConfig.local_share_idle: once the policy's samples have gone local_share_patience updates without a
    # new best of the run, the chain's share rises to local_share_idle, counted from the update it began at; a
    # new best from the policy brings it back. On a clock that only evaluations advance (10 ms each)
    Slow, gr, ev, kw = _slow_clock(monkeypatch)
    base = dict(seed=0, local_moves=8, local_batch=8, local_share=0.5, **SMALL)
    runs = {}
    for idle in (0.0, 0.9):
        s = Search(gr, Slow(ev.target_ops), config=ReinforceConfig(**base, local_share_idle=idle,
                                                                   local_share_patience=2), **kw)
        calls, local_moves = [], s._local_moves

        def spy(limit=None, s=s, calls=calls, local_moves=local_moves):
            quiet = s.since_policy_best
            out = local_moves(limit)
            calls.append((quiet, s.share_now, s.share_mark, s.local_seconds, s.wall_s()))
            return out

        monkeypatch.setattr(s, "_local_moves", spy)
        assert s.run(1000, max_updates=8).updates == 8
        runs[idle] = s
        for quiet, share, (mark_wall, mark_local), used, wall in calls:
            assert share == (0.9 if idle and quiet >= 2 else 0.5)
            assert share * (wall - mark_wall) - 1e-9 <= used - mark_local <= share * (wall - mark_wall) + 0.1
            assert mark_wall == 0.0 or share == 0.9 and 0 < mark_wall < wall    # the idle share counts from its start
        if idle:   # the policy's samples found no best of the run after the chain's first moves
            assert [c[1] for c in calls].count(0.9) >= 5 and s.policy_improvements <= 3
    assert runs[0.9].local_evaluations > runs[0.0].local_evaluations
    # a best from the policy brings the share back (from its own mark)
    s = runs[0.9]
    s.since_policy_best = 0
    assert s._chain_share() == 0.5 and s.share_mark == (s.wall_s(), s.local_seconds)


def test_the_chains_schedule_starts_at_t0_where_its_first_batch_falls(monkeypatch, tmp_path):
    # ReinforceConfig.local_schedule "chain": the chain's temperature falls from T0 at its first batch (after the
    # baselines, the warm start and the first update) to local_t_final at the budget's end, as annealing's spans
    # its own moves; "search" spans the whole budget, so the first batch is already cooler than T0
    Slow, gr, ev, kw = _slow_clock(monkeypatch)
    temps = {}
    for sched in ("chain", "search"):
        cfg = ReinforceConfig(seed=0, local_moves=8, local_batch=8, local_share=0.5, local_t_final=1e-3,
                              local_schedule=sched, **SMALL)
        s = Search(gr, Slow(ev.target_ops), config=cfg, out_dir=tmp_path / sched, **kw)
        seen, accept = [], s._chain_accept
        monkeypatch.setattr(s, "_chain_accept", lambda d, t, seen=seen, accept=accept: (seen.append(t), accept(d, t)))
        res = s.run(3.0, max_updates=100)
        assert res.stop_reason == "budget" and len(seen) > 10
        temps[sched] = (seen, s._chain_t0, s._chain_p0)
        r = Search(gr, Slow(ev.target_ops), config=cfg, out_dir=tmp_path / sched, **kw)
        assert r.load_checkpoint() and r._chain_p0 == s._chain_p0      # a resume keeps the schedule's start
    seen, t0, p0 = temps["chain"]
    assert 0.0 < p0 < 0.5 and seen[0] == t0                            # started late, at T0
    assert all(a >= b for a, b in zip(seen, seen[1:])) and seen[-1] == pytest.approx(1e-3, rel=0.2)
    seen, t0, p0 = temps["search"]
    assert p0 == 0.0 and seen[0] < t0 and seen[-1] == pytest.approx(1e-3, rel=0.2)


def test_an_unknown_choice_in_the_config_is_one_clear_error():
    # a string field with a value the search does not know (a typo) would act as the other choice: refused at once
    gr, ev = _setup(G=8, seed=6)
    for name, bad in (("local_schedule", "chian"), ("local_block", "linkd"), ("baseline_mode", "mean"),
                      ("pretrained_fit", "sometimes")):
        with pytest.raises(SearchError, match=f"ReinforceConfig.{name} must be .* got '{bad}'"):
            Search(gr, ev, cpu_index=CPU, progress=False, config=ReinforceConfig(**{name: bad}))


def test_the_warm_start_is_the_runs_first_elite():
    # the best grouped baseline the policy imitates is also where the local moves' chain starts, as annealing's
    # does, however few imitation steps fitted the policy to it
    gr, ev = _setup(G=8, seed=6)
    single = gr.expand(np.zeros(gr.num_groups, int), CPU)
    s = Search(gr, ev, cpu_index=CPU, baselines={"single_gpu": single}, progress=False,
               config=ReinforceConfig(seed=0, imitation_steps=2, local_moves=8, **SMALL))
    s.run(60, max_updates=0)                 # the baselines alone (no fit without an update to use it)
    s._warm_start()
    assert s.imitated and s.start_groups is not None
    np.testing.assert_array_equal(s.elite_groups, s.start_groups)
    assert s.elite_time == pytest.approx(s.grouped_times[s.imitated])


def test_an_imitation_fit_stops_at_its_deadline(monkeypatch):
    # Reinforce.imitate(deadline=...): no Adam step starts after the deadline (a clock that each step advances by
    # 0.1 s); a deadline already past makes no step
    import placer.rl.reinforce as reinforce_mod

    gr, ev = _setup()
    s = Search(gr, ev, cpu_index=CPU, progress=False,
               config=ReinforceConfig(seed=0, imitation_steps=50, imitation_prob=1.01, **SMALL))
    agent, clock = s.agent, [0.0]
    fit = agent._imitate_fn

    def step(*a):
        clock[0] += 0.1
        return fit(*a)

    monkeypatch.setattr(agent, "_imitate_fn", step)
    monkeypatch.setattr(reinforce_mod, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: clock[0])}))
    assert agent.imitate(gr.target, deadline=0.35)["imitation_steps"] == 4      # steps start at 0, .1, .2, .3
    assert agent.imitate(gr.target, deadline=0.0)["imitation_steps"] == 0
    assert agent.imitate(gr.target)["imitation_steps"] == 50                   # no deadline: max_steps


def test_imitation_fits_take_half_the_wall_budget_left(monkeypatch):
    # the warm start's fit (and a restart's) stops after IMITATION_TIME_SHARE of the budget left, so that a short
    # budget ends on time and still gets updates; outside run() there is no deadline. On a clock that only
    # evaluations advance (10 ms each)
    import placer.rl.search as search_mod

    Slow, gr, ev, kw = _slow_clock(monkeypatch)
    s = Search(gr, Slow(ev.target_ops), config=ReinforceConfig(seed=0, restart_updates=1, elite_steps=0, **SMALL), **kw)
    assert s._deadline() is None
    calls, imitate = [], s.agent.imitate

    def spy(groups, **k):
        calls.append((search_mod.time.perf_counter(), s.wall_s(), k.get("deadline")))
        return imitate(groups, **k)

    monkeypatch.setattr(s.agent, "imitate", spy)
    s.run(1.0, max_updates=2)
    assert s.imitated == "single_gpu" and s.restarts >= 1 and len(calls) >= 2    # the warm start, then a restart
    for now, wall, deadline in calls:
        assert deadline == pytest.approx(now + search_mod.IMITATION_TIME_SHARE * (1.0 - wall))
    s.run(s.wall_s(), max_updates=3)           # no time left: the deadline is now (no step)
    assert s._deadline() == pytest.approx(search_mod.time.perf_counter())


def test_a_short_budget_ends_on_time_however_many_imitation_steps(tmp_path):
    # real time: a warm start of up to 100,000 Adam steps (a target it never reaches) within a 2 s budget; the
    # search ends after at most one update past it (generous margin for a loaded machine)
    gr, ev = _setup()
    t0 = time.perf_counter()
    res = run_loop(gr, ev, budget_seconds=2.0, cpu_index=CPU, progress=False,
                   baselines={"single_gpu": gr.expand(np.zeros(gr.num_groups, int), CPU)},
                   config=ReinforceConfig(seed=0, imitation_steps=100_000, imitation_prob=1.01, **SMALL))
    assert res.stop_reason == "budget" and res.updates >= 1 and time.perf_counter() - t0 < 20


def test_cluster_moves_reach_the_chain_only_when_their_share_asks_and_placer_place_asks(monkeypatch):
    """ReinforceConfig.local_cluster_prob: the chain's neighbours get the grouping's cluster levels (computed once)
    and the share; with the share 0 no levels are computed. `placer place` (place_settings) turns the share on."""
    import placer.rl.search as rs
    from placer.search import PLACE_CLUSTER_PROB, place_settings

    assert place_settings(8)["local_cluster_prob"] == PLACE_CLUSTER_PROB > 0
    gr, ev = _setup(G=12, seed=6)
    gr.adjacency = np.eye(12, k=1)            # one chain of groups: two parts at the one level (12 groups)
    gr.group_cost = np.ones(12)
    single = gr.expand(np.zeros(gr.num_groups, int), CPU)
    calls = []
    real = rs.neighbours

    def spy(*a, **k):
        calls.append((k.get("clusters"), k.get("cluster_prob")))
        return real(*a, **k)

    monkeypatch.setattr(rs, "neighbours", spy)
    for share in (0.0, 0.5):
        calls.clear()
        s = Search(gr, ev, cpu_index=CPU, baselines={"single_gpu": single}, progress=False,
                   config=ReinforceConfig(seed=0, local_moves=16, local_cluster_prob=share, **SMALL))
        res = s.run(60, max_updates=2)
        assert calls and all(p == share for _, p in calls)
        if share == 0.0:
            assert all(c == [] for c, _ in calls) and s._cluster_levels is None
        else:
            (lv,) = calls[0][0]
            assert lv.shape == (12,) and len(set(lv.tolist())) == 2
            assert all(c is calls[0][0] for c, _ in calls)          # computed once
        assert np.isfinite(res.search_best)
