"""The placement search: baselines as the floor, then REINFORCE updates until a budget runs out, with
best-so-far tracking, checkpoints that survive `kill -9`, a progress bar, TensorBoard events and `curve.png`.

    result = run_loop(grouping, evaluator, budget_seconds=60, baselines={"single_gpu": single},
                        cpu_index=cluster.cpu_index, out_dir="out")
    result.placement     # op→device int array: the best of the baselines and of every sampled placement
    result.search_best   # the best step time the policy itself sampled (no baseline floor)

Between updates: with `ReinforceConfig.local_moves` > 0, local moves (one annealing chain through the search,
with the annealer's moves and rule, which jumps to each new best the policy samples; an improvement is the run's
new best); the elite step (fit the policy to the
current run's best sample, or its best `elite_size`) and, after `ReinforceConfig.restart_updates` updates
without a better one, a restart from the warm-start placement. `result.search_best` counts the local moves'
placements: they are the search's own, never a baseline's.

Stops on whichever comes first: the wall-time budget (counting time spent before a resume), `max_updates`
policy updates (counting updates before a resume), or `patience` updates without a new best.

Bad input:
  * every group has a single allowed device (e.g. a one-device cluster): return at once, no learning;
  * `budget_seconds <= 0`: SearchError (use `max_updates=0` to only evaluate the baselines);
  * nothing fits in memory (every baseline and every sample OOMs): SearchError naming the memory needed
    on the fullest device against what it holds;
  * most evaluations fail for one reason that is not memory (a missing device, a lost worker): after the
    baselines and 3 updates, SearchError with that reason (`_check_systematic_failure`), the checkpoint kept.

`rl/` sees only the Grouping (features, CPU-only groups, `expand`) and the Evaluator: never TF protos.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace as dc_replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from placer._npz import load_npz
from placer.errors import MeasurementError, SearchError, fmt_bytes
from placer.grouped import (accept0_error, accept_move, auto_shares, charged_step_times, cluster_levels,
                            failure_reference, first_copies, group_key, grouped_baselines,
                            initial_temperature, move_shares_error, neighbours, screen_error, screened)

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "state.json"    # scalars, lists, dicts; names the npz that holds the arrays
CHECKPOINT_FORMAT = 2             # 1 was a pickle (state.pkl): refused with a one-line error
OLD_CHECKPOINT_FILE = "state.pkl"
CHECKPOINT_SECONDS = 60.0         # the loop checkpoints every `checkpoint_every` updates or this many seconds
# the string-valued ReinforceConfig fields and the values the search reads (Search checks them before any work)
CONFIG_CHOICES = {"baseline_mode": ("ema", "batch"), "local_block": ("linked", "run"),
                  "local_schedule": ("search", "chain"), "pretrained_fit": ("auto", "always", "never"),
                  "pretrained_chain_start": ("best", "grouped")}
POLICY_FREQ_DECAY = 0.5       # where the policy's samples put each group: each update's weight halves per update
LOCAL_SEEN_MAX = 200_000      # the local moves forget what they evaluated beyond this many placements (memory)
STOP_AFTER_UPDATES = 3        # updates before a systematic failure may stop the search
STOP_FAILED_FRACTION = 0.5    # ... when one non-memory reason accounts for this fraction of all evaluations
# an imitation fit (warm start, fine-tune start, restart) takes at most this share of the wall budget left, so that
# a short budget ends on time and still gets updates (the fit alone changes no placement); a long budget's fit
# (at most `imitation_steps` Adam steps, a few seconds) is not cut
IMITATION_TIME_SHARE = 0.5


@dataclass
class LoopResult:
    """What a search returns. Times in seconds; placements are op→device index arrays."""
    placement: np.ndarray                       # the returned placement (never worse than the best baseline)
    step_time: float                            # its step time
    source: str                                 # "search" or the name of the baseline that stayed best
    search_best: float                          # best step time the policy itself sampled (inf if none worked)
    search_best_placement: np.ndarray | None
    baselines: dict[str, float | None]          # name → step time, None when it failed (OOM, error)
    history: list[dict[str, float]]             # one row per update (see Search._record)
    evaluations: int                            # placements evaluated, baselines included
    updates: int                                # policy updates done (across resumes)
    wall_s: float                               # search wall time (across resumes)
    stop_reason: str                            # "budget", "max_updates", "max_evaluations", "patience", "one_device",
                                                # or stop_check's
    devices: list[str] = field(default_factory=list)
    failure_step_time: float = float("nan")     # the step time charged to failed placements
    search_best_groups: np.ndarray | None = None  # group→device of the best sampled placement
    baseline_failures: dict[str, str] = field(default_factory=dict)   # name → why its evaluation failed
    grouped_baselines: dict[str, float | None] = field(default_factory=dict)  # name → its group-level version's
                                                # step time (None: failed), evaluated for the warm start
    zero_shot: dict = field(default_factory=dict)   # a pretrained policy's first batch (Search._zero_shot)
    local: dict = field(default_factory=dict)   # local moves (ReinforceConfig.local_moves > 0): evaluations, improvements
    best_curve: list = field(default_factory=list)  # [evaluations, search_best] after each batch that improved the
                                                # policy's own best (samples, local moves, refinement)

    def summary(self) -> dict[str, Any]:
        return {"step_time_s": self.step_time, "source": self.source,
                "search_best_s": None if not np.isfinite(self.search_best) else self.search_best,
                "baselines": dict(self.baselines), "evaluations": self.evaluations, "updates": self.updates,
                "wall_s": self.wall_s, "stop_reason": self.stop_reason}


def grouping_fingerprint(grouping) -> str:
    """Identifies the grouping a checkpoint was made for (op→group map and features)."""
    h = hashlib.sha1()
    h.update(np.ascontiguousarray(grouping.op_group, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(grouping.features, dtype=np.float32).tobytes())
    h.update(np.ascontiguousarray(grouping.cpu_only, dtype=bool).tobytes())
    return h.hexdigest()


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _json_num(x):
    """A float for JSON: inf/nan as strings (JSON has no such numbers)."""
    if isinstance(x, (float, np.floating)) and not np.isfinite(x):
        return str(float(x))
    return float(x) if isinstance(x, np.floating) else x


def _num_json(x):
    """Inverse of `_json_num`."""
    return float(x) if isinstance(x, str) and x in ("inf", "-inf", "nan") else x


class Search:
    """A resumable REINFORCE placement search over one grouping and one evaluator.

    grouping: has `features` [G, F], `cpu_only` [G], `num_groups`, `expand(group_devices, cpu_index)`.
    evaluator: `placer.sim.evaluator.Evaluator` (its `devices` are the placement indices).
    allowed: bool[G, D] devices each group may use (default: `grouping.allowed_mask` if it has one, else all
    devices, CPU-only groups on `cpu_index` only). baselines: name → op placement, evaluated before learning.
    device_capacity: bytes per device (for the out-of-memory error message).
    """

    def __init__(self, grouping, evaluator, *, cpu_index: int | None = None, allowed: np.ndarray | None = None,
                 baselines: Mapping[str, np.ndarray] | None = None, config=None, seed: int = 0,
                 out_dir: str | os.PathLike | None = None, progress: bool = True, checkpoint_every: int = 10,
                 device_capacity: Sequence[float] | None = None, tensorboard: bool = True,
                 policy_inputs=None, pretrained=None, screen=None):
        self.grouping = grouping
        # an Evaluator cheaper than `evaluator` that ranks the chain's candidate moves before any is evaluated
        # (`ReinforceConfig.local_screen`; the problem's simulator when the reward is measured). None: no screening
        self.screen = screen
        # a portable policy (placer.rl.portable): its inputs for this problem, and pretrained weights to start
        # from (None: fresh weights); the search then starts from the policy, not from a baseline's imitation
        self.policy_inputs = policy_inputs
        self.pretrained = pretrained
        self.evaluator = evaluator
        self.devices = list(evaluator.devices)
        self.cpu_index = cpu_index
        D = len(self.devices)
        if allowed is None:
            if hasattr(grouping, "allowed_mask"):
                allowed = grouping.allowed_mask(D, cpu_index)
            else:
                allowed = np.ones((grouping.num_groups, D), bool)
                if cpu_index is not None:
                    allowed[np.asarray(grouping.cpu_only, bool)] = False
                    allowed[np.asarray(grouping.cpu_only, bool), cpu_index] = True
        self.allowed = np.asarray(allowed, bool)
        if self.allowed.shape != (grouping.num_groups, D):
            raise SearchError(f"allowed mask has shape {self.allowed.shape}, expected ({grouping.num_groups}, {D})")
        if not self.allowed.any(axis=1).all():
            g = int(np.flatnonzero(~self.allowed.any(axis=1))[0])
            raise SearchError(f"group {g} may not use any of the devices {self.devices}")
        self.baseline_placements = {k: np.asarray(v) for k, v in (baselines or {}).items()}
        self.seed = int(seed)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.progress = progress
        self.checkpoint_every = max(1, int(checkpoint_every))
        # ...and after any update once this many seconds passed since the last save: a kill -9 (or a crash) on a
        # graph whose updates take minutes loses at most about this much, not `checkpoint_every` updates
        self.checkpoint_seconds = CHECKPOINT_SECONDS
        self._last_save = time.perf_counter()
        self.device_capacity = None if device_capacity is None else np.asarray(device_capacity, np.float64)
        self.tensorboard = tensorboard
        # called before every update (the first one too: after the baselines) and after it, before the check for
        # systematic failures: a non-empty string stops the search with that stop_reason (e.g. the measured
        # search's watch for lost devices, `placer.search`)
        self.stop_check = None
        from placer.rl.reinforce import ReinforceConfig

        self.config = config or ReinforceConfig(seed=self.seed)
        # "auto" shares (None): by the number of accelerators; the config then holds the shares used
        self.config = auto_shares(self.config, D, cpu_index, "local_")
        for name in ("local_accept0", "zero_shot_refine_accept0"):     # before any work, not at the first move
            if (msg := accept0_error(getattr(self.config, name), f"ReinforceConfig.{name}")) is not None:
                raise SearchError(msg)
        for name in ("local_screen", "sample_screen"):
            if (msg := screen_error(getattr(self.config, name), f"ReinforceConfig.{name}")) is not None:
                raise SearchError(msg)
        if (msg := move_shares_error(self.config.local_merge_prob, self.config.local_attract_prob,
                                     "ReinforceConfig.local_", self.config.local_policy_prob,
                                     "policy_prob", self.config.local_cluster_prob)) is not None:
            raise SearchError(msg)
        if not isinstance(self.config.local_restarts, int) or self.config.local_restarts < 0:
            raise SearchError(f"ReinforceConfig.local_restarts must be a whole number >= 0, "
                              f"got {self.config.local_restarts!r}")
        for name, choices in CONFIG_CHOICES.items():   # a typo must not silently pick the other choice
            if getattr(self.config, name) not in choices:
                raise SearchError(f"ReinforceConfig.{name} must be {' or '.join(choices)}, "
                                  f"got {getattr(self.config, name)!r}")
        self.fingerprint = grouping_fingerprint(grouping)
        self._agent = None
        # XLA-compile the policy's sampling loop: pays back over a search's updates, not for one zero-shot batch
        # (`run(max_updates=0)` with a pretrained policy: two compilations, the greedy sample and the batch)
        self._policy_jit = True
        # search state (everything below is checkpointed)
        self.baselines: dict[str, float | None] = {}
        self.baseline_failures: dict[str, str] = {}   # name → why its evaluation failed
        self.grouped_times: dict[str, float | None] = {}   # name → its grouped version's step time (warm start)
        self.best_time = float("inf")
        self.best_placement: np.ndarray | None = None
        self.best_source = ""
        self.search_best = float("inf")
        self.search_best_placement: np.ndarray | None = None
        self.search_best_groups: np.ndarray | None = None
        self.history: list[dict[str, float]] = []
        self.evaluations = 0
        self.updates = 0
        self.wall_before = 0.0         # wall seconds spent in earlier (killed/finished) runs
        self.since_improvement = 0
        self.failure_step_time: float | None = None
        self.baselines_done = False
        self.zero_shot: dict = {}      # a pretrained policy's zero-shot batch (samples, fits, best_s, wall_s)
        self.imitated = ""             # the baseline the policy was warm-started on ("" = not yet, "-" = skipped)
        self.start_groups: np.ndarray | None = None   # group→device the policy was warm-started on
        self.elite_groups: np.ndarray | None = None   # best sample of the current run (since the last restart)
        self.elite_time = float("inf")
        self.elite_set: list[tuple[float, np.ndarray]] = []   # the run's best `elite_size` distinct samples
        self.since_elite = 0           # updates since the current run's best improved
        self.restarts = 0
        self.local_evaluations = 0     # evaluations spent on local moves (ReinforceConfig.local_moves)
        self.local_improvements = 0    # local moves that improved the run's best
        self.local_seconds = 0.0       # wall seconds spent on local moves (ReinforceConfig.local_share)
        self.policy_improvements = 0   # updates whose samples improved the run's best (beat the chain's too)
        self.since_policy_best = 0     # updates since the policy's samples last improved the run's best
        # the chain's share of the wall time now (ReinforceConfig.local_share or local_share_idle) and where it began:
        # (wall seconds, local_seconds) then
        self.share_now = self.config.local_share
        self.share_mark = (0.0, 0.0)
        # the search's own best against evaluations, finer than `history` (one row per update): a point
        # [evaluations after the batch, search_best] each time a batch (samples or local moves) improved it
        self.best_curve: list[list[float]] = []
        self._local_rng = np.random.default_rng(self.seed + 2)
        self._chain: np.ndarray | None = None   # the local moves' annealing chain: its point,
        self._chain_c = float("inf")   # its charged step time,
        self._chain_t0 = float("nan")  # and its starting temperature,
        self._chain_p0 = float("nan")  # the budget's share spent at its first batch (`local_schedule` "chain")
        self._chain_best = float("inf")   # the run's best when the chain last moved (a better one: the policy's)
        self._chain_seg = 0               # the part of the chain's schedule it is in (`local_restarts`)
        self._policy_freq: np.ndarray | None = None   # float[G, D]: where the policy's recent samples put each
        #                                               group (`local_policy_prob`; `_note_policy_samples`)
        self._cluster_levels: list[np.ndarray] | None = None   # the cluster moves' levels (`_clusters`)
        self._local_seen: set[bytes] = set()   # group placements the chain evaluated (not checkpointed)
        self._interrupt = DeferredInterrupt()   # Ctrl-C in the loop: stop after the current step, checkpointed
        self._cands: list = []         # the chain's last batch of neighbours (_chain_batch) and their charged
        self._cands_charged = np.empty(0)   # step times, for _chain_accept
        self._budget: tuple[float | None, int | None] = (None, None)   # run()'s budget, for the chain's schedule
        self._oom_seen: list = []      # (max used/capacity ratio, device index, used, capacity) of OOM outcomes
        self.failure_counts: dict[str, int] = {}   # first line of a non-memory failure's reason → how many
        self.evaluated = 0             # outcomes seen by _note_oom (this run and before a resume)
        # group placements evaluated so far (ReinforceConfig.reuse_evaluations): not evaluated again
        from placer.rl.reinforce import EvaluationCache

        self.cache = EvaluationCache() if getattr(self.config, "reuse_evaluations", False) else None
        self._t_start = time.perf_counter()
        self._writer = None

    # ------------------------------------------------------------------ the agent (TF) is built lazily
    @property
    def agent(self):
        if self._agent is None:
            from placer.rl.reinforce import Reinforce

            policy = None
            if self.config.portable:
                if self.policy_inputs is None:
                    raise SearchError("this search uses a portable policy, which needs the problem's policy inputs")
                from placer.rl.portable import PortablePolicy, PortableWeights

                cfg = self.config
                weights = self.pretrained if self.pretrained is not None else PortableWeights(
                    cfg.hidden_size, cfg.attn_size, cfg.forget_bias, seed=cfg.seed)
                inputs = self.policy_inputs() if callable(self.policy_inputs) else self.policy_inputs
                policy = PortablePolicy.from_config(weights, inputs, self.allowed, cfg, jit=self._policy_jit)
            self._agent = Reinforce(np.asarray(self.grouping.features, np.float32), self.allowed, self.config,
                                    policy=policy)
        return self._agent

    # ------------------------------------------------------------------ checkpoints
    @property
    def checkpoint_path(self) -> Path | None:
        return None if self.out_dir is None else self.out_dir / "checkpoint" / CHECKPOINT_FILE

    def wall_s(self) -> float:
        return self.wall_before + (time.perf_counter() - self._t_start)

    def save_checkpoint(self) -> None:
        """Everything needed to continue: policy weights, Adam state, EMA baseline, RNG state, best placement,
        history and counters. Data only, never code: the arrays go to an npz (no object arrays), the rest to
        JSON (`state.json`, naming its npz). The npz is written first under a new name, then the JSON is
        replaced atomically, then the older npz is removed: a kill at any point leaves a consistent checkpoint."""
        path = self.checkpoint_path
        if path is None:
            return
        arrays: dict[str, np.ndarray] = {}

        def arr(key: str, a) -> str | None:
            if a is None:
                return None
            arrays[key] = np.asarray(a)
            return key

        agent = None
        if self._agent is not None:
            st = self.agent.get_state()
            agent = {"policy": {k: arr(f"policy/{k}", v) for k, v in st["policy"].items()},
                     "optimizer": [arr(f"optimizer/{i}", v) for i, v in enumerate(st["optimizer"])],
                     "baseline": _json_num(st["baseline"]), "updates": int(st["updates"]),
                     "imitation_rng": st.get("imitation_rng")}
        state = {
            "format": CHECKPOINT_FORMAT, "fingerprint": self.fingerprint, "devices": self.devices, "agent": agent,
            "baselines": self.baselines, "baseline_failures": self.baseline_failures,
            "grouped_times": self.grouped_times,
            "baselines_done": self.baselines_done,
            "best_time": _json_num(self.best_time), "best_placement": arr("best_placement", self.best_placement),
            "best_source": self.best_source, "search_best": _json_num(self.search_best),
            "search_best_placement": arr("search_best_placement", self.search_best_placement),
            "search_best_groups": arr("search_best_groups", self.search_best_groups),
            "history": [{k: _json_num(v) for k, v in r.items()} for r in self.history],
            "best_curve": [[int(e), _json_num(t)] for e, t in self.best_curve],
            "evaluations": self.evaluations, "updates": self.updates, "wall_s": self.wall_s(),
            "since_improvement": self.since_improvement, "failure_step_time": _json_num(self.failure_step_time),
            "imitated": self.imitated, "start_groups": arr("start_groups", self.start_groups),
            "elite_groups": arr("elite_groups", self.elite_groups), "elite_time": _json_num(self.elite_time),
            "since_elite": self.since_elite, "restarts": self.restarts, "allowed": arr("allowed", self.allowed),
            "local_evaluations": self.local_evaluations, "local_improvements": self.local_improvements,
            "local_seconds": self.local_seconds, "policy_improvements": self.policy_improvements,
            "since_policy_best": self.since_policy_best, "share_now": self.share_now,
            "share_mark": list(self.share_mark), "local_rng": self._local_rng.bit_generator.state,
            "local_chain": arr("local_chain", self._chain),
            "local_policy_freq": arr("local_policy_freq", self._policy_freq),
            "local_chain_c": _json_num(self._chain_c), "local_t0": _json_num(self._chain_t0),
            "local_p0": _json_num(self._chain_p0),
            "local_chain_best": _json_num(self._chain_best), "local_chain_seg": self._chain_seg,
            "config": self.config.to_dict(), "oom_seen": [list(x) for x in self._oom_seen[-64:]],
            "failure_counts": self.failure_counts, "evaluated": self.evaluated,
            "zero_shot": {k: _json_num(v) for k, v in self.zero_shot.items()},
        }
        if self.elite_set:
            state["elite_set"] = {"groups": arr("elite_set/groups", np.stack([g for _, g in self.elite_set])),
                                  "times": [_json_num(t) for t, _ in self.elite_set]}
        if self.cache is not None:
            c = self.cache.to_arrays()
            state["cache"] = {"groups": arr("cache/groups", c["groups"]), "values": arr("cache/values", c["values"])}
        self._saves = getattr(self, "_saves", 0) + 1
        npz = f"arrays-{os.getpid()}-{self._saves}.npz"
        state["arrays"] = npz
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        _atomic_write_bytes(path.parent / npz, buf.getvalue())
        _atomic_write_bytes(path, json.dumps(state).encode())
        for old in path.parent.glob("arrays-*.npz"):
            if old.name != npz:
                old.unlink(missing_ok=True)
        self._last_save = time.perf_counter()

    def load_checkpoint(self) -> bool:
        """Restore from out_dir/checkpoint; False when there is none. A corrupt, foreign or old-format
        (pickled) checkpoint is a SearchError naming the file."""
        path = self.checkpoint_path
        if path is None:
            return False
        if not path.exists():
            old = path.parent / OLD_CHECKPOINT_FILE
            if old.exists():
                raise SearchError(f"checkpoint {old} is in an old format (a pickle) that this placer does not "
                                  "read: start a new search")
            return False
        try:
            state = json.loads(path.read_text())
            with load_npz(path.parent / state["arrays"]) as z:
                arrays = {k: z[k] for k in z.files}
        except Exception as e:  # truncated/corrupt file: name it
            raise SearchError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}") from None
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            raise SearchError(f"checkpoint {path} has format {state.get('format') if isinstance(state, dict) else '?'}"
                              f", expected {CHECKPOINT_FORMAT}")
        try:
            self._restore(path, state, arrays)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:   # a key missing, a wrong type
            raise SearchError(f"checkpoint {path} is incomplete or corrupt ({type(e).__name__}: {e}): it cannot be "
                              f"resumed") from None
        return True

    def _restore(self, path: Path, state: dict, arrays: dict) -> None:
        """`load_checkpoint`'s restoring of a read checkpoint (`state`: state.json, `arrays`: its npz)."""
        if state["fingerprint"] != self.fingerprint:
            raise SearchError(f"checkpoint {path} was made for another grouping of the graph "
                              f"(fingerprint {state['fingerprint'][:12]} != {self.fingerprint[:12]})")
        if list(state["devices"]) != self.devices:
            raise SearchError(f"checkpoint {path} was made for devices {state['devices']}, not {self.devices}")

        def arr(key):
            if key is None:
                return None
            if key not in arrays:
                raise SearchError(f"checkpoint {path}: array {key!r} is missing from {state['arrays']}")
            return arrays[key]

        from dataclasses import fields

        from placer.rl.reinforce import ReinforceConfig

        unknown = sorted(set(state["config"]) - {f.name for f in fields(ReinforceConfig)})
        if unknown:      # written by a newer placer: its settings cannot be honoured here
            raise SearchError(f"checkpoint {path} has settings this placer does not know ({', '.join(unknown)}): "
                              f"it was written by a newer version; resume it with that version")
        self.config = ReinforceConfig(**state["config"])
        self.allowed = np.asarray(arr(state["allowed"]), bool)
        self._agent = None
        if state["agent"] is not None:
            a = state["agent"]
            rng = a.get("imitation_rng")
            try:
                self.agent.set_state({"policy": {k: arr(v) for k, v in a["policy"].items()},
                                      "optimizer": [arr(v) for v in a["optimizer"]],
                                      "baseline": _num_json(a["baseline"]), "updates": a["updates"],
                                      **({"imitation_rng": rng} if rng is not None else {})})
            except (KeyError, ValueError) as e:
                raise SearchError(f"checkpoint {path} does not match this policy: {e}") from None
        for k in ("baselines", "baselines_done", "best_source", "evaluations", "updates", "since_improvement",
                  "imitated", "since_elite", "restarts"):
            setattr(self, k, state[k])
        for k in ("best_time", "search_best", "elite_time"):
            setattr(self, k, float(_num_json(state[k])))
        f = state["failure_step_time"]
        self.failure_step_time = None if f is None else float(_num_json(f))
        for k in ("best_placement", "search_best_placement", "search_best_groups", "start_groups", "elite_groups"):
            setattr(self, k, arr(state[k]))
        self.history = [{k: _num_json(v) for k, v in r.items()} for r in state["history"]]
        self.best_curve = [[int(e), float(_num_json(t))] for e, t in state.get("best_curve", [])]
        self._oom_seen = [tuple(x) for x in state.get("oom_seen", [])]
        self.baseline_failures = dict(state.get("baseline_failures", {}))
        self.grouped_times = dict(state.get("grouped_times", {}))
        self.failure_counts = {str(k): int(v) for k, v in state.get("failure_counts", {}).items()}
        self.evaluated = int(state.get("evaluated", 0))
        self.zero_shot = {k: _num_json(v) for k, v in state.get("zero_shot", {}).items()}
        self.local_evaluations = int(state.get("local_evaluations", 0))
        self.local_improvements = int(state.get("local_improvements", 0))
        self.local_seconds = float(state.get("local_seconds", 0.0))
        self.policy_improvements = int(state.get("policy_improvements", 0))
        self.since_policy_best = int(state.get("since_policy_best", 0))
        self.share_now = float(state.get("share_now", self.config.local_share))
        self.share_mark = tuple(float(x) for x in state.get("share_mark", (0.0, 0.0)))
        if state.get("local_rng") is not None:
            self._local_rng.bit_generator.state = state["local_rng"]
        ch = state.get("local_chain")
        self._chain = None if ch is None else np.asarray(arr(ch), np.int32)
        self._chain_c = float(_num_json(state.get("local_chain_c", float("inf"))))
        self._chain_t0 = float(_num_json(state.get("local_t0", float("nan"))))
        # a checkpoint from before `local_schedule` has no p0: its chain's schedule spanned the budget (p0 = 0)
        self._chain_p0 = float(_num_json(state.get("local_p0", 0.0 if np.isfinite(self._chain_t0) else float("nan"))))
        self._chain_best = float(_num_json(state.get("local_chain_best", float("inf"))))
        self._chain_seg = int(state.get("local_chain_seg", 0))
        pf = state.get("local_policy_freq")
        self._policy_freq = None if pf is None else np.asarray(arr(pf), np.float64)
        e = state.get("elite_set")
        self.elite_set = [] if not e else [(float(_num_json(t)), np.asarray(g, np.int32))
                                           for t, g in zip(e["times"], arr(e["groups"]))]
        from placer.rl.reinforce import EvaluationCache

        c = state.get("cache")
        self.cache = None if not self.config.reuse_evaluations else \
            EvaluationCache.from_arrays(arr(c["groups"]), arr(c["values"])) if c else EvaluationCache()
        self.wall_before = float(state["wall_s"])
        self._t_start = time.perf_counter()

    def restore_policy(self, checkpoint_dir: str | os.PathLike, device_map: Sequence[int]) -> str | None:
        """Re-placement: start from the policy of another search's checkpoint (same grouping) whose devices were
        a superset of this search's: this search's device k was that search's device `device_map[k]`. The
        device-indexed weights (device embeddings, the device softmax, the device→device term) keep the rows of
        the surviving devices, so every group keeps its learned preference among them and a group that preferred
        a lost device is re-sampled among the survivors. Adam's state starts afresh. Returns None when restored,
        else why not (the caller then searches cold)."""
        path = Path(checkpoint_dir) / CHECKPOINT_FILE
        if not path.exists():
            old = Path(checkpoint_dir) / OLD_CHECKPOINT_FILE
            return f"{old} is in an old format (a pickle)" if old.exists() else f"no checkpoint in {checkpoint_dir}"
        try:
            state = json.loads(path.read_text())
            if state.get("format") != CHECKPOINT_FORMAT:
                return f"checkpoint {path} has format {state.get('format')}, expected {CHECKPOINT_FORMAT}"
            if state.get("agent") is not None and state["fingerprint"] == self.fingerprint:
                with load_npz(path.parent / state["arrays"]) as z:
                    state["policy"] = {k: z[v] for k, v in state["agent"]["policy"].items()}
        except Exception as e:  # noqa: BLE001 - any unreadable checkpoint: search cold, say why
            return f"cannot read checkpoint {path}: {type(e).__name__}: {e}"
        return self.restore_policy_state(state, device_map, f"checkpoint {path}")

    def policy_state(self) -> dict | None:
        """The policy as `restore_policy_state` takes it (its weights, this search's grouping fingerprint and
        devices), in memory; None before the first update."""
        if self._agent is None:
            return None
        return {"fingerprint": self.fingerprint, "devices": list(self.devices),
                "policy": {k: np.array(v) for k, v in self.agent.get_state()["policy"].items()}}

    def restore_policy_state(self, state: dict, device_map: Sequence[int], where: str = "the run") -> str | None:
        """`restore_policy` from a state in memory (`policy_state()`, or a checkpoint read: `fingerprint`,
        `devices`, `policy`); `where` names it in the reason returned when it cannot be restored."""
        if state["fingerprint"] != self.fingerprint:
            return f"{where} was made for another grouping of the graph"
        if state.get("policy") is None:
            return f"{where} holds no policy (its search made no update)"
        weights = dict(state["policy"])
        keep = np.asarray(device_map, np.int64)
        old_d = len(state["devices"])
        if keep.size != len(self.devices) or keep.min() < 0 or keep.max() >= old_d:
            return f"{where} was made for devices {state['devices']}, not a superset of {self.devices}"
        for k, w in list(weights.items()):
            if "device_embeddings" in k:
                weights[k] = w[keep]
            elif "device_softmax" in k:
                weights[k] = w[:, keep]
            elif "transition" in k:
                weights[k] = w[np.ix_(keep, keep)]
        try:
            self.agent.policy.set_state(weights)
        except (KeyError, ValueError) as e:
            return f"{where} does not match this policy: {e}"
        self.imitated = "restored"        # no warm start: the restored policy is the start
        return None

    # ------------------------------------------------------------------ bookkeeping
    def _note_oom(self, outcomes) -> None:
        """Record what failed: out-of-memory peaks (for the error when nothing fits) and the reasons of other
        failures (for `_check_systematic_failure`)."""
        self.evaluated += len(outcomes)
        for o in outcomes:
            if o.failed and not o.oom:
                key = (o.reason or "failed without a reason").strip().splitlines()[0][:300]
                self.failure_counts[key] = self.failure_counts.get(key, 0) + 1
        if self.device_capacity is None:
            return
        cap = self.device_capacity
        for o in outcomes:
            if o.oom and len(o.peak_memory) == len(cap):
                ratio = np.asarray(o.peak_memory, np.float64) / np.maximum(cap, 1.0)
                d = int(np.argmax(ratio))
                self._oom_seen.append((float(ratio[d]), d, float(o.peak_memory[d]), float(cap[d])))

    def _check_systematic_failure(self) -> None:
        """A search in which most evaluations fail for one reason that is not memory cannot mean anything (a
        missing device, a dead worker, a graph that does not run): stop with that reason instead of learning to
        avoid it. Checked once the baselines and `STOP_AFTER_UPDATES` updates have been evaluated."""
        if self.updates < STOP_AFTER_UPDATES or not self.failure_counts or self.evaluated == 0:
            return
        reason, count = max(self.failure_counts.items(), key=lambda kv: kv[1])
        if count >= STOP_FAILED_FRACTION * self.evaluated:
            self.save_checkpoint()
            raise SearchError(f"search stopped: {count} of {self.evaluated} evaluations failed with the same error, "
                              f"so its result would mean nothing: {reason}")

    def _consider(self, placement: np.ndarray, step_time: float, source: str) -> bool:
        if np.isfinite(step_time) and step_time < self.best_time:
            self.best_time, self.best_placement, self.best_source = float(step_time), placement.copy(), source
            return True
        return False

    def _evaluate_baselines(self) -> None:
        names = list(self.baseline_placements)
        if names:
            if self.config.baseline_rounds > 1:
                outcomes = self._baseline_rounds(names)
            else:
                outcomes = self.evaluator.evaluate([self.baseline_placements[n] for n in names])
                self.evaluations += len(names)
            self._note_oom(outcomes)
            for n, o in zip(names, outcomes):
                self.baselines[n] = None if o.failed or not np.isfinite(o.step_time) else float(o.step_time)
                if self.baselines[n] is None:
                    self.baseline_failures[n] = o.reason or "no step time"
                if self.baselines[n] is not None:
                    self._consider(self.baseline_placements[n], o.step_time, n)
            # reference for the failure reward: the single-device time (simulated even when it OOMs)
            ref = failure_reference(names, outcomes)
            if ref is not None:
                self.failure_step_time = self.config.failure_factor * ref
        self.baselines_done = True

    def _baseline_rounds(self, names: list[str]) -> list:
        """`config.baseline_rounds` interleaved rounds over the distinct baseline placements (a placement that
        several baselines give is evaluated once per round and shared); each gets the median of all its runs.
        A placement that failed is not evaluated again (a hang would cost its timeout once more)."""
        first = {n: names[j] for n, j in zip(names, first_copies([self.baseline_placements[n] for n in names]))}
        uniq = [n for n in names if first[n] == n]
        runs: dict[str, list[float]] = {n: [] for n in uniq}
        last: dict[str, object] = {}
        for r in range(self.config.baseline_rounds):
            order = [n for n in (uniq if r % 2 == 0 else uniq[::-1]) if n not in last or last[n].ok]
            outs = self.evaluator.evaluate([self.baseline_placements[n] for n in order])
            self.evaluations += len(order)
            for n, o in zip(order, outs):
                last[n] = o
                if o.ok:
                    runs[n].extend(o.runs or (o.step_time,))
        out = {}
        for n in uniq:
            o = last[n]
            out[n] = dc_replace(o, step_time=float(np.median(runs[n])), runs=tuple(runs[n])) if o.ok and runs[n] else o
        return [out[first[n]] for n in names]

    def _grouped_baselines(self):
        """Each working baseline turned into its group-level version (majority device per group, CPU-only groups
        on the CPU), evaluated in one batch. Returns (names, group placements, outcomes, index of the best that
        fits in memory, or of the least bad), or None without baselines."""
        names, targets = grouped_baselines(self.baseline_placements, self.baselines, self.grouping.op_group,
                                           self.grouping.num_groups, self.allowed)
        if not names:
            return None
        placements = [self.grouping.expand(t, self.cpu_index) for t in targets]
        outcomes = self.evaluator.evaluate(placements)
        self.evaluations += len(placements)
        self.grouped_times = {n: float(o.step_time) if o.ok else None for n, o in zip(names, outcomes)}
        charged = charged_step_times(outcomes, self.failure_step_time or 100.0, self.device_capacity)
        if self.cache is not None:
            for t, o, c in zip(targets, outcomes, charged):
                self.cache.put(t, o, c)
        for n, p, o in zip(names, placements, outcomes):
            if o.ok:
                self._consider(p, o.step_time, f"{n} (grouped)")
        return names, targets, outcomes, int(np.argmin(charged))

    def _warm_start(self) -> None:
        """Imitate a baseline before learning: the best grouped baseline (`_grouped_baselines`) that fits in
        memory (none fits: cold start). It is also the run's first elite, as annealing's start is annealing's: the
        local moves' chain starts from it and the elite steps fit it until a sample or a move beats it (a policy
        fitted in few imitation steps may sample far from it)."""
        grouped = self._grouped_baselines()
        if grouped is None:
            return
        names, targets, outcomes, k = grouped
        best_op_level = min(t for t in self.baselines.values() if t is not None)
        tol = self.config.warm_start_tolerance
        if not outcomes[k].ok or (tol is not None and outcomes[k].step_time > (1.0 + tol) * best_op_level):
            # no grouped baseline fits (or, with a tolerance, the groups cannot express the best baseline
            # closely enough): start cold
            self.imitated = "-"
            log.info("warm start skipped: best grouped baseline %s is %s, best baseline %.4g s", names[k],
                     f"{outcomes[k].step_time:.4g} s" if outcomes[k].ok else "failing", best_op_level)
            self.save_checkpoint()
            return
        info = self.agent.imitate(targets[k], deadline=self._deadline())
        self.imitated = names[k]
        self.start_groups = targets[k].copy()
        self._start_elite(targets[k], float(outcomes[k].step_time))
        log.info("warm start: imitated %s at group level (%.4g s) in %d steps (per-group prob %.3f)", names[k],
                 outcomes[k].step_time, info["imitation_steps"], info["imitation_prob"])
        self.save_checkpoint()

    def _deadline(self) -> float | None:
        """When an imitation fit (warm start, fine-tune start, restart) must stop, as a `time.perf_counter()`
        value: after `IMITATION_TIME_SHARE` of the wall budget left (None outside `run`), so that up to
        `imitation_steps` Adam steps do not overrun a short budget and leave it no update."""
        budget_s = self._budget[0]
        if budget_s is None:
            return None
        return time.perf_counter() + IMITATION_TIME_SHARE * max(0.0, budget_s - self.wall_s())

    def _start_elite(self, groups: np.ndarray, t: float) -> None:
        """A start placement (step time `t`) becomes the run's elite (and a member of its elite set)."""
        self.elite_time, self.elite_groups = t, np.asarray(groups, np.int32).copy()
        if self.config.elite_size > 1:
            self._update_elite_set(self.elite_groups[None], np.array([t]), np.array([True]))

    def _pretrained_start(self) -> None:
        """A fine-tune from a pretrained policy starts as a search from scratch does: from the better of the
        zero-shot best and the best grouped baseline (when a grouped baseline fits and is faster, it becomes the
        elite, which the elite steps fit a few Adam steps at a time and the local moves' chain starts from, and
        the restart point). Where the zero-shot best beats every baseline, the policy knows this graph: its
        distribution is kept. Otherwise its samples are worse than a heuristic's, and it is fitted to the start
        (`imitate`, as the warm start fits a fresh policy to its baseline), so that it explores around the start
        rather than where its pretraining put it (RESULTS.md "Placing unseen graphs"). The start is not the
        policy's own best: that stays what the policy samples and the local moves find. Done once
        (`zero_shot["imitation_steps"]`, 0 when the policy was trusted; kept in the checkpoint)."""
        if "imitation_steps" in self.zero_shot:
            return
        grouped = self._grouped_baselines()
        if grouped is not None:
            names, targets, outcomes, k = grouped
            if outcomes[k].ok and outcomes[k].step_time < self.elite_time:
                self.start_groups = np.asarray(targets[k], np.int32).copy()
                self._start_elite(self.start_groups, float(outcomes[k].step_time))
                self.zero_shot["start"] = f"{names[k]} (grouped)"
            elif outcomes[k].ok and self.config.pretrained_chain_start == "grouped":
                # the chain starts where a search from scratch does, the policy's faster best kept as the run's
                self._chain = np.asarray(targets[k], np.int32).copy()
                self._chain_c, self._chain_best = float(outcomes[k].step_time), float(self.elite_time)
                self._local_seen.add(group_key(self._chain))
                self.zero_shot["chain_start"] = f"{names[k]} (grouped)"
        heuristics = [t for t in list(self.baselines.values()) + list(self.grouped_times.values())
                      if t is not None and np.isfinite(t)]
        zs = self.zero_shot.get("sampled_best_s", self.zero_shot.get("best_s"))   # the policy's samples, unrefined
        trusted = zs is not None and np.isfinite(zs) and all(zs < t for t in heuristics)
        fit = self.config.pretrained_fit     # one of CONFIG_CHOICES["pretrained_fit"] (checked at the start)
        trusted = fit == "never" or (fit == "auto" and trusted)
        self.zero_shot["imitation_steps"] = 0
        if self.start_groups is not None and not trusted:
            info = self.agent.imitate(self.start_groups, deadline=self._deadline())
            self.zero_shot["imitation_steps"] = int(info["imitation_steps"])
            self.zero_shot["imitation_prob"] = float(info["imitation_prob"])
        log.info("fine-tune starts from %s (%.4g s; zero-shot best %s, best heuristic %s)%s",
                 self.zero_shot.get("start", "the zero-shot best"), self.elite_time, zs,
                 min(heuristics) if heuristics else None,
                 f": policy fitted to it in {self.zero_shot['imitation_steps']} steps (per-group prob "
                 f"{self.zero_shot['imitation_prob']:.3f})" if "imitation_prob" in self.zero_shot else
                 ": policy kept as pretrained" + (" (it beats every heuristic)" if fit == "auto" and trusted else ""))
        self.save_checkpoint()

    def _zero_shot(self) -> None:
        """A pretrained policy's first answer: `zero_shot_samples` placements (the greedy one and samples),
        evaluated in one batch; with `zero_shot_seconds` > 0, more batches of that size until that many seconds
        have passed, `zero_shot_max` placements were drawn, or a batch drew nothing new (`placer place`). Only
        distinct placements are evaluated. The best becomes the policy's own best, the elite and the restart
        point."""
        t0 = time.perf_counter()
        cfg = self.config
        k = max(1, int(cfg.zero_shot_samples))
        cap = max(k, int(cfg.zero_shot_max))
        pol = self.agent.policy
        seen: set[bytes] = set()
        rows, placements, outcomes = [], [], []
        drawn = batches = 0
        while True:
            acts = pol.sample(1, greedy=True)[0] if batches == 0 else np.empty((0, pol.num_groups), np.int32)
            n = min(k, cap - drawn) - len(acts)
            if n > 0:
                acts = np.concatenate([acts, pol.sample(n)[0]])
            drawn += len(acts)
            batches += 1
            new = []
            for a in acts:
                key = a.tobytes()
                if key not in seen:
                    seen.add(key)
                    new.append(a)
            if new:
                expanded = [self.grouping.expand(a, self.cpu_index) for a in new]
                outs = self.evaluator.evaluate(expanded)
                self.evaluations += len(new)
                self._note_oom(outs)
                rows.append(np.stack(new))
                placements.extend(expanded)
                outcomes.extend(outs)
            if (not len(new) or drawn >= cap or cfg.zero_shot_seconds <= 0
                    or time.perf_counter() - t0 >= cfg.zero_shot_seconds):
                break
        acts = np.concatenate(rows)
        times = np.array([o.step_time if o.ok else np.inf for o in outcomes], np.float64)
        if self.failure_step_time is None and np.isfinite(times).any():
            self.failure_step_time = self.config.failure_factor * float(times[np.isfinite(times)].max())
        if self.cache is not None:
            fail_t = self.failure_step_time if self.failure_step_time is not None else 100.0
            for a, o, c in zip(acts, outcomes, charged_step_times(outcomes, fail_t, self.device_capacity)):
                self.cache.put(a, o, c)
        self.imitated = "pretrained"
        self.zero_shot = {"samples": drawn, "evaluated": len(placements), "batches": batches,
                          "fits": int(np.isfinite(times).sum()),
                          "greedy_s": _json_num(float(times[0])), "wall_s": time.perf_counter() - t0}
        if np.isfinite(times).any():
            j = int(np.argmin(times))
            self.search_best, self.search_best_placement = float(times[j]), placements[j].copy()
            self.search_best_groups = acts[j].copy()
            self._curve_point()
            self.elite_time, self.elite_groups = float(times[j]), acts[j].copy()
            if self.config.elite_size > 1:
                self._update_elite_set(acts, times, np.isfinite(times))
            self.start_groups = acts[j].copy()
            self._consider(placements[j], float(times[j]), "pretrained (zero-shot)")
            self.zero_shot["best_s"] = float(times[j])
        log.info("zero-shot: %d placements from the pretrained policy (%d distinct), %d fit, best %s in %.2f s",
                 drawn, len(placements), self.zero_shot["fits"],
                 f"{self.search_best:.4g} s" if np.isfinite(self.search_best) else "none", self.zero_shot["wall_s"])
        self._refine()
        self.history.append({"update": 0, "wall_s": self.wall_s(), "evaluations": self.evaluations,
                             "best_s": self.best_time, "search_best_s": self.search_best,
                             "mean_s": float(np.mean(times[np.isfinite(times)])) if np.isfinite(times).any()
                             else float("nan"), "min_s": float(times.min()) if np.isfinite(times).any()
                             else float("nan"), "failed": float((~np.isfinite(times)).mean()), "zero_shot": 1.0})
        self._tb(self.history[-1])
        self.save_checkpoint()

    def _update_elite_set(self, group_devices: np.ndarray, step_times: np.ndarray, ok: np.ndarray) -> None:
        """Merge working samples (`ok` rows of `group_devices` int[K, G], `step_times` float[K]) into the run's
        `elite_size` best distinct ones, best first."""
        keys = {g.tobytes() for _, g in self.elite_set}
        for k in np.flatnonzero(ok):
            g = np.asarray(group_devices[k], np.int32)
            if g.tobytes() not in keys:
                keys.add(g.tobytes())
                self.elite_set.append((float(step_times[k]), g.copy()))
        self.elite_set.sort(key=lambda e: e[0])
        del self.elite_set[self.config.elite_size:]

    def _local_moves(self, limit: int | None = None) -> tuple[bool, bool]:
        """Local moves (`ReinforceConfig.local_moves`, expert iteration's improvement operator): one annealing
        chain that lives through the whole search. Each call evaluates up to `local_moves` neighbours of the
        chain's point (`placer.grouped.neighbours`, the annealer's moves) in batches of `local_batch`, each batch
        accepted by the annealer's rule (`placer.grouped.accept_move`, "greedy") at a temperature that falls
        geometrically from T0 (a median worsening move of the first batch accepted with probability
        `local_accept0`) to `local_t_final` over the search's budget (wall seconds or `max_evaluations`). When the
        policy has sampled a new best of the run since the chain's last moves, the chain jumps to it (a worse
        point the chain accepted is kept otherwise, as in annealing; with `local_jump` off it never jumps, and
        before `local_jump_after` of the budget is spent it does not jump yet): the policy proposes, the chain
        refines, and the chain's improvements become the run's best, which the elite step fits. With
        `local_share` > 0 the chain goes on past `local_moves` until its moves have taken that share of the
        search's wall time so far (or the wall budget is spent); `_chain_share` raises it while the policy's
        samples bring no best. At most `limit` evaluations (what is left of
        `max_evaluations`), through `evaluate_groups` (with the cache, placements evaluated before are looked
        up). With `local_restarts` > 0 the schedule is cut into parts, each starting again at T0 from the run's
        best (`_chain_reheat`). Returns (the search's best improved, the run's best improved)."""
        cfg = self.config
        n = cfg.local_moves if limit is None else min(cfg.local_moves, limit)
        if n <= 0 or self.elite_groups is None or not np.isfinite(self.elite_time):
            return False, False
        t_call = time.perf_counter()
        budget_s = self._budget[0]
        share = self._chain_share()
        mark_wall, mark_local = self.share_mark

        def wanted() -> int:
            """How many more moves to draw: the rest of `local_moves` (n is within `limit`), then batches while the
            chain is under its share of the wall time, within the budget and `limit`; none once interrupted."""
            if self._interrupt.pending:
                return 0
            if drawn < n:
                return n - drawn
            if share <= 0:
                return 0
            wall = self.wall_s()
            if (budget_s is not None and wall >= budget_s) \
                    or self.local_seconds - mark_local + time.perf_counter() - t_call >= share * (wall - mark_wall):
                return 0
            return cfg.local_batch if limit is None else min(cfg.local_batch, limit - drawn)
        if self._chain is None or (cfg.local_jump and self.elite_time < self._chain_best      # a new best: jump
                                   and self._progress() >= cfg.local_jump_after):
            self._chain_to_elite()
        if len(self._local_seen) > LOCAL_SEEN_MAX:
            self._local_seen = {group_key(self._chain)}
        improved = improved_run = False
        drawn = 0
        while (want := wanted()) > 0:
            if cfg.local_restarts > 0 and np.isfinite(self._chain_t0):
                self._chain_reheat()
            step = self._chain_batch(min(max(1, cfg.local_batch), want))
            if step is None:
                break
            n_drawn, charged, i, ir = step
            drawn += n_drawn
            improved, improved_run = improved or i, improved_run or ir
            delta = charged / max(self._chain_c, 1e-30) - 1.0
            if not np.isfinite(self._chain_t0):          # T0 from the first batch's worsening moves
                self._chain_t0 = initial_temperature(delta, cfg.local_accept0)
                self._chain_p0 = min(self._progress(), 1.0) if cfg.local_schedule == "chain" else 0.0
            t0 = self._chain_t0
            t_fin = min(cfg.local_t_final, t0)
            temp = t0 * (t_fin / t0) ** self._chain_part()[1]
            self._chain_accept(delta, temp)
        self._chain_best = float(self.elite_time)
        self.local_seconds += time.perf_counter() - t_call
        return improved, improved_run

    def _note_policy_samples(self, group_devices: np.ndarray) -> None:
        """Where the policy's samples of an update (int[K, G]) put each group, averaged into `_policy_freq` with
        weight 1 - POLICY_FREQ_DECAY (the chain's policy-guided moves, `ReinforceConfig.local_policy_prob`)."""
        g = np.asarray(group_devices, np.int64)
        if g.ndim != 2 or g.shape[0] == 0:
            return
        freq = np.zeros(self.allowed.shape, np.float64)
        np.add.at(freq, (np.broadcast_to(np.arange(g.shape[1]), g.shape), g), 1.0 / g.shape[0])
        self._policy_freq = freq if self._policy_freq is None \
            else POLICY_FREQ_DECAY * self._policy_freq + (1.0 - POLICY_FREQ_DECAY) * freq

    def _chain_q(self) -> float:
        """Where the chain is in its temperature schedule, 0..1: the share of the budget spent (`_progress`), or with
        `local_schedule` "chain" the share of what was left at its first batch, so that the chain starts at T0
        wherever in the budget its first batch falls, as annealing does."""
        p0 = self._chain_p0 if np.isfinite(self._chain_p0) else 0.0     # "search": 0, the whole budget
        return min(1.0, max(0.0, (self._progress() - p0) / max(1e-9, 1.0 - p0)))

    def _chain_part(self) -> tuple[int, float]:
        """Which part of its schedule the chain is in (`local_restarts` + 1 equal parts of `_chain_q`) and where in
        it, 0..1 (with `local_restarts` = 0: part 0, at `_chain_q`)."""
        parts = self.config.local_restarts + 1
        q = self._chain_q()
        seg = min(int(q * parts), parts - 1)
        return seg, min(1.0, q * parts - seg)

    def _chain_to_elite(self) -> None:
        """The chain's point becomes the run's best (a jump to the policy's new best, or a reheat)."""
        self._chain, self._chain_c = np.asarray(self.elite_groups, np.int32).copy(), float(self.elite_time)
        self._local_seen.add(group_key(self._chain))

    def _chain_reheat(self) -> None:
        """`ReinforceConfig.local_restarts`: once the chain's schedule enters a new part, the chain goes back to the
        run's best (its temperature is back at T0 by `_chain_part`), as annealing's restarts go back to the best
        so far."""
        seg = self._chain_part()[0]
        if seg == self._chain_seg:
            return
        self._chain_seg = seg
        if self.elite_groups is not None and np.isfinite(self.elite_time):
            self._chain_to_elite()
            log.info("local moves: reheat %d of %d from the run's best (%.4g s)", seg, self.config.local_restarts,
                     self.elite_time)

    def _chain_share(self) -> float:
        """The chain's share of the wall time (`_local_moves`): `ReinforceConfig.local_share`, or
        `local_share_idle` once the policy's samples have gone `local_share_patience` updates without a new best
        of the run. Their updates then cost more wall than they bring: the chain, which makes a few hundred
        evaluations in the time of one update, gets more of it. A change of share starts its count afresh
        (`share_mark`), so that the new share holds from here on, not over the whole search."""
        cfg = self.config
        idle = cfg.local_share_idle > cfg.local_share and self.since_policy_best >= cfg.local_share_patience
        share = cfg.local_share_idle if idle else cfg.local_share
        if share != self.share_now:
            self.share_now, self.share_mark = share, (self.wall_s(), self.local_seconds)
        return share

    def _clusters(self) -> list[np.ndarray]:
        """The cluster moves' levels (`placer.grouped.cluster_levels` of the grouping), computed once, when
        `local_cluster_prob` asks for them."""
        if self.config.local_cluster_prob <= 0:
            return []
        if self._cluster_levels is None:
            self._cluster_levels = cluster_levels(self.grouping.adjacency, self.grouping.group_cost)
        return self._cluster_levels

    def _chain_batch(self, k: int):
        """One batch of the chain: up to `k` neighbours of its point not evaluated before (the annealer's moves,
        `ReinforceConfig.local_block`), evaluated in one call (through the cache); a working one faster than the
        run's best becomes the run's best (`_note_sample`). Returns None when no new neighbour is left, else
        (neighbours evaluated, their charged step times, the search's best improved, the run's best improved);
        the neighbours are kept in `self._cands` for `_chain_accept`."""
        from placer.rl.reinforce import evaluate_groups

        cfg = self.config
        links = getattr(self.grouping, "adjacency", None) if cfg.local_block == "linked" else None
        screen = max(1, int(cfg.local_screen)) if self.screen is not None else 1
        cands = neighbours(self._chain, self.allowed, self._local_rng, k * screen, self._local_seen, links=links,
                           merge_prob=cfg.local_merge_prob, attract_prob=cfg.local_attract_prob,
                           prefer=self._policy_freq, prefer_prob=cfg.local_policy_prob,
                           clusters=self._clusters(), cluster_prob=cfg.local_cluster_prob)
        if not cands:
            return None
        if len(cands) > k:          # the screened-out ones may be drawn again later, as in annealing
            cands = screened(cands, k, self.screen, lambda g: self.grouping.expand(g, self.cpu_index))
        self._local_seen.update(group_key(g) for g in cands)
        fail_t = self.failure_step_time if self.failure_step_time is not None else 100.0
        r = evaluate_groups(cands, lambda i: self.grouping.expand(cands[i], self.cpu_index), self.evaluator,
                            fail_t, self.device_capacity, self.cache)
        self.evaluations += len(r.outcomes)
        self.local_evaluations += len(r.outcomes)
        self._note_oom(r.outcomes)
        times = r.times
        ok = np.isfinite(times)
        if cfg.elite_size > 1:
            self._update_elite_set(np.stack(cands), times, ok)
        improved = improved_run = False
        b = int(np.argmin(times))
        # the chain's placements are the search's own: one slower than the run's best (e.g. every neighbour of a
        # start that is a strict local optimum) still counts for the search's best, as a policy sample would
        if ok[b] and (times[b] < self.elite_time or times[b] < self.search_best):
            g = np.asarray(cands[b], np.int32)
            improved, improved_run = self._note_sample(g, self.grouping.expand(g, self.cpu_index), float(times[b]))
            self.local_improvements += int(improved_run)
        self._cands, self._cands_charged = cands, r.charged
        return len(cands), r.charged, improved, improved_run

    def _chain_accept(self, delta: np.ndarray, temp: float) -> None:
        """The annealer's "greedy" rule on the last batch's relative changes `delta` at temperature `temp`: the
        chain moves to the accepted neighbour, if any."""
        k = accept_move(delta, temp, "greedy", self._local_rng)
        if k is not None:
            self._chain, self._chain_c = np.asarray(self._cands[k], np.int32), float(self._cands_charged[k])

    def _refine(self) -> None:
        """`placer place`'s refinement of the zero-shot answer: for `zero_shot_refine_seconds` or
        `zero_shot_refine_moves` evaluations (when > 0), whichever ends first, an annealing chain from the best
        placement the policy sampled (never from a baseline), with the annealer's moves and rule, T0 accepting a
        median worsening move with probability `zero_shot_refine_accept0` and falling geometrically to
        `local_t_final` over the moves (over the seconds when there is no budget in moves): so where the moves end
        first, nothing in the chain depends on the machine's speed; where the seconds do, the chain stops before
        it has cooled, keeping its best. Its improvements become the search's best (as the
        local moves' do); `zero_shot` records the sampled best (`sampled_best_s`), the refined one (`best_s`),
        the chain's evaluations and wall, and which budget ended it (`refine_stop`: "moves", "seconds" or
        "exhausted": no neighbour left to evaluate)."""
        cfg = self.config
        secs = float(cfg.zero_shot_refine_seconds)
        moves = max(0, int(cfg.zero_shot_refine_moves))
        if secs <= 0 or self.elite_groups is None or not np.isfinite(self.elite_time):
            return
        t_start = time.perf_counter()
        evals0 = self.evaluations
        self.zero_shot["sampled_best_s"] = float(self.elite_time)
        self._chain, self._chain_c = np.asarray(self.elite_groups, np.int32).copy(), float(self.elite_time)
        self._local_seen.add(group_key(self._chain))
        t0 = float("nan")
        while True:
            done, spent = self.evaluations - evals0, time.perf_counter() - t_start
            if moves and done >= moves:
                stop = "moves"
                break
            if spent >= secs:
                stop = "seconds"
                break
            step = self._chain_batch(max(1, min(cfg.local_batch, moves - done) if moves else cfg.local_batch))
            if step is None:
                stop = "exhausted"
                break
            delta = step[1] / max(self._chain_c, 1e-30) - 1.0
            if not np.isfinite(t0):
                t0 = initial_temperature(delta, cfg.zero_shot_refine_accept0)
            t_fin = min(cfg.local_t_final, t0)
            frac = (self.evaluations - evals0) / moves if moves else spent / secs
            self._chain_accept(delta, t0 * (t_fin / t0) ** min(1.0, frac))
        self.zero_shot.update(best_s=float(self.search_best), refine_evaluations=self.evaluations - evals0,
                              refine_s=time.perf_counter() - t_start, refine_stop=stop)
        self._chain, self._chain_c, self._chain_best = None, float("inf"), float("inf")  # the search's own chain
        self._local_seen = set()
        log.info("zero-shot refined by local moves: %.4g s -> %.4g s in %d evaluations, %.2f s",
                 self.zero_shot["sampled_best_s"], self.search_best, self.zero_shot["refine_evaluations"],
                 self.zero_shot["refine_s"])

    def _note_sample(self, groups: np.ndarray, placement: np.ndarray, t: float) -> tuple[bool, bool]:
        """A working placement the search evaluated (a sample or a local move), step time `t`: the search's best,
        the run's best (the elite) and the overall best follow it. Returns (search's best improved, run's best
        improved)."""
        improved = improved_run = False
        if t < self.search_best:
            self.search_best, self.search_best_placement = t, placement.copy()
            self.search_best_groups = np.asarray(groups).copy()
            self._curve_point()
            improved = True
        if t < self.elite_time:
            self.elite_time, self.elite_groups = t, np.asarray(groups).copy()
            improved_run = True
        self._consider(placement, t, "search")
        return improved, improved_run

    def _curve_point(self) -> None:
        """Note the search's best after the batch just evaluated (`best_curve`); a later point of the same batch
        (evaluations unchanged) replaces it."""
        if self.best_curve and self.best_curve[-1][0] == self.evaluations:
            self.best_curve[-1][1] = float(self.search_best)
        else:
            self.best_curve.append([int(self.evaluations), float(self.search_best)])

    def _progress(self) -> float:
        """The share of the search's budget used (wall seconds or `max_evaluations`, whichever is further)."""
        budget_s, max_evals = self._budget
        p = self.wall_s() / budget_s if budget_s else 0.0
        if max_evals:
            p = max(p, self.evaluations / max_evals)
        return p

    def _restart(self) -> None:
        """Start the local search again from the warm-start placement (the best found so far is kept)."""
        info = self.agent.imitate(self.start_groups, deadline=self._deadline())
        self.elite_groups, self.elite_time, self.since_elite = None, float("inf"), 0
        self.elite_set = []
        self.restarts += 1
        log.info("restart %d after %d updates without a better sample: re-fitted the start in %d steps",
                 self.restarts, self.config.restart_updates, info["imitation_steps"])

    def _record(self, upd, wall: float) -> dict[str, float]:
        ok = ~upd.failed & np.isfinite(upd.step_times)
        row = {"update": self.updates, "wall_s": wall, "evaluations": self.evaluations,
               "best_s": self.best_time, "search_best_s": self.search_best,
               "mean_s": float(upd.step_times[ok].mean()) if ok.any() else float("nan"),
               "min_s": float(upd.step_times[ok].min()) if ok.any() else float("nan"),
               "failed": float((~ok).mean()), "entropy": upd.stats["entropy"],
               "reward_mean": upd.stats["reward_mean"], "baseline": upd.stats["baseline"],
               "sample_s": upd.stats["sample_s"], "evaluate_s": upd.stats["evaluate_s"],
               "learn_s": upd.stats["learn_s"], "restarts": self.restarts,
               "drawn": float(len(upd.step_times)), "new": float(upd.num_evaluated)}
        if self.config.local_moves > 0:
            row["local_evaluations"] = float(self.local_evaluations)
        self.history.append(row)
        return row

    def _tb(self, row: dict[str, float]) -> None:
        """TensorBoard scalars via TF's core `tf.summary.write` with the scalars-plugin metadata (what
        `tf.summary.scalar` writes, without needing the tensorboard package installed). The first call also
        writes the baselines' step times (`baseline/NAME`, at step 0); a row without some key (the zero-shot
        batch's has no reward, `_finish`'s no samples) writes the others, and no value that is not finite."""
        if not self.tensorboard or self.out_dir is None:
            return
        import tensorflow as tf
        from tensorflow.core.framework import summary_pb2

        tags = {"reward/mean": "reward_mean", "reward/baseline": "baseline", "step_time/sampled_mean": "mean_s",
                "step_time/sampled_min": "min_s", "step_time/best_so_far": "best_s",
                "step_time/policy_best": "search_best_s", "policy/entropy": "entropy",
                "policy/failed_fraction": "failed"}
        points = [(tag, int(row["update"]), row.get(key)) for tag, key in tags.items()]
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(str(self.out_dir / "tb"))
            self._tb_meta = summary_pb2.SummaryMetadata(
                plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
            points = [(f"baseline/{k}", 0, v) for k, v in self.baselines.items()] + points
        with self._writer.as_default():
            for tag, step, value in points:
                if value is not None and np.isfinite(value):
                    tf.summary.write(tag, tf.constant(value, tf.float32), step=step, metadata=self._tb_meta)

    def write_curve(self, path: str | os.PathLike | None = None) -> Path | None:
        """curve.png: best-so-far and sampled (mean, min) step time against wall time."""
        if path is None:
            if self.out_dir is None:
                return None
            path = self.out_dir / "curve.png"
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        h = self.history
        if h:
            w = [r["wall_s"] for r in h]
            ax.plot(w, [r["mean_s"] for r in h], ".", ms=3, alpha=0.5, label="sampled (mean of K)")
            ax.plot(w, [r["min_s"] for r in h], ".", ms=3, alpha=0.5, label="sampled (best of K)")
            ax.step(w, [r["search_best_s"] for r in h], where="post", label="policy's best so far")
            ax.step(w, [r["best_s"] for r in h], where="post", label="returned (incl. baselines)")
        ok = {k: v for k, v in self.baselines.items() if v is not None}
        if ok:
            name = min(ok, key=ok.get)
            ax.axhline(ok[name], color="gray", ls="--", lw=1, label=f"best baseline ({name})")
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("step time (s)")
        ax.set_title("placement search")
        if ax.get_legend_handles_labels()[0]:       # nothing drawn (no history, no baseline): no empty legend
            ax.legend(fontsize=8)
        finite = [r["min_s"] for r in h if np.isfinite(r["min_s"])] + list(ok.values())
        if finite:
            lo, hi = min(finite), np.nanpercentile([r["mean_s"] for r in h if np.isfinite(r["mean_s"])] or finite, 95)
            ax.set_ylim(lo * 0.95, max(hi, lo) * 1.05)
        fig.tight_layout()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path

    # ------------------------------------------------------------------ the loop
    def _result(self, stop_reason: str) -> LoopResult:
        if self.best_placement is None:
            raise self._nothing_fits()
        return LoopResult(placement=self.best_placement, step_time=self.best_time, source=self.best_source,
                            search_best=self.search_best, search_best_placement=self.search_best_placement,
                            baselines=dict(self.baselines), history=list(self.history),
                            evaluations=self.evaluations, updates=self.updates, wall_s=self.wall_s(),
                            stop_reason=stop_reason, devices=self.devices,
                            failure_step_time=float(self.failure_step_time or float("nan")),
                            search_best_groups=self.search_best_groups,
                            baseline_failures=dict(self.baseline_failures),
                            grouped_baselines=dict(self.grouped_times), zero_shot=dict(self.zero_shot),
                            local={"evaluations": self.local_evaluations, "improvements": self.local_improvements,
                                   "seconds": round(self.local_seconds, 3),
                                   "policy_improvements": self.policy_improvements}
                            if self.config.local_moves > 0 else {}, best_curve=[list(p) for p in self.best_curve])

    def _nothing_fits(self) -> SearchError:
        # baselines that share a placement are evaluated once (measured rounds): never a negative sample count
        sampled = max(0, self.evaluations - len(self.baselines))
        tried = f"{len(self.baselines)} baseline(s) and {sampled} sampled placement(s)"
        if self._oom_seen:
            ratio, d, used, cap = min(self._oom_seen)
            return SearchError(
                f"no placement fits in memory ({tried} tried): the best one still needs {fmt_bytes(used)} on "
                f"{self.devices[d]}, which holds {fmt_bytes(cap)}; use devices with more memory or more devices")
        why = ""
        if self.failure_counts:
            reason, count = max(self.failure_counts.items(), key=lambda kv: kv[1])
            why = f"; {count} failed with: {reason}"
        return SearchError(f"no placement could be evaluated successfully ({tried} tried, all failed{why})")

    def run(self, budget_seconds: float, max_updates: int | None = None, patience: int | None = None,
            max_evaluations: int | None = None) -> LoopResult:
        """Search until the budget, `max_updates` total updates, `max_evaluations` evaluations (the baselines
        count), or `patience` updates without a new best."""
        if budget_seconds is None or not budget_seconds > 0:
            raise SearchError(f"search budget must be positive, got {budget_seconds} s "
                              "(use max_updates=0 / --max-updates 0 to only evaluate the baselines)")
        from placer.rl.reinforce import reinforce_update

        self._budget = (float(budget_seconds), max_evaluations)
        if not self.baselines_done:
            self._evaluate_baselines()
            self.save_checkpoint()
        one_choice = int(self.allowed.sum(axis=1).max()) <= 1     # one allowed device per group
        if self.updates == 0 and not self.imitated and self.pretrained is not None:
            if max_updates == 0 and self._agent is None:
                self._policy_jit = False     # one batch of samples: tracing alone beats tracing + XLA compiling
            self._zero_shot()                # the pretrained policy is the start: no baseline imitation
            if self.config.budget_after_zero_shot:
                budget_seconds = float(budget_seconds) + self.wall_s()
                self._budget = (budget_seconds, max_evaluations)
        if self.updates == 0 and self.imitated == "pretrained" and not self.grouped_times and max_updates != 0 \
                and self.config.imitation_steps > 0 and self.best_placement is not None and not one_choice:
            self._pretrained_start()         # also when resumed after the zero-shot batch (or a zero-shot answer)
        if self.updates == 0 and not self.imitated and self.config.imitation_steps > 0 \
                and self.best_placement is not None and not one_choice and max_updates != 0:
            self._warm_start()       # (max_updates=0: the baselines alone; a resume with updates fits then)
        if one_choice:                                     # nothing to choose
            forced = self.grouping.expand(self.allowed.argmax(axis=1), self.cpu_index)
            if self.best_placement is None:
                o = self.evaluator.evaluate([forced])[0]
                self.evaluations += 1
                self._note_oom([o])
                self._consider(forced, o.step_time if o.ok else float("inf"), "forced")
            return self._finish("one_device")

        from tqdm import tqdm

        bar = tqdm(total=max_updates, initial=self.updates, disable=None if self.progress else True, unit="upd",
                   desc="search", dynamic_ncols=True, leave=False)
        stop = None
        try:
            self._interrupt.__enter__()
            while True:
                if self._interrupt.pending:
                    stop = "interrupted"
                elif self.stop_check is not None and (lost := self.stop_check()):
                    stop = lost      # checked first: devices lost while the baselines were measured count too
                elif max_updates is not None and self.updates >= max_updates:
                    stop = "max_updates"
                elif max_evaluations is not None and self.evaluations >= max_evaluations:
                    stop = "max_evaluations"
                elif patience is not None and self.since_improvement >= patience:
                    stop = "patience"
                elif self.wall_s() >= budget_seconds:
                    stop = "budget"
                if stop:
                    break
                fail_t = self.failure_step_time
                upd = reinforce_update(self.agent, self.grouping, self.evaluator, self.cpu_index,
                                       fail_t if fail_t is not None else 100.0, self.device_capacity, self.cache,
                                       screen=self.screen)
                if self.failure_step_time is None:   # no baselines: reference = worst working sample
                    ok = ~upd.failed & np.isfinite(upd.step_times)
                    if ok.any():
                        self.failure_step_time = self.config.failure_factor * float(upd.step_times[ok].max())
                self.updates += 1
                self.evaluations += upd.num_evaluated
                self._note_oom(upd.outcomes)
                improved = improved_run = False
                ok = ~upd.failed & np.isfinite(upd.step_times)
                if ok.any():
                    k = int(np.argmin(np.where(ok, upd.step_times, np.inf)))
                    improved, improved_run = self._note_sample(upd.group_devices[k], upd.op_placements[k],
                                                               float(upd.step_times[k]))
                self.policy_improvements += improved_run
                self.since_policy_best = 0 if improved_run else self.since_policy_best + 1
                if self.config.elite_size > 1:
                    self._update_elite_set(upd.group_devices, upd.step_times, ok)
                if self.config.local_policy_prob > 0:
                    self._note_policy_samples(upd.group_devices)
                if self.config.local_moves > 0:
                    li, lr = self._local_moves(None if max_evaluations is None else max_evaluations - self.evaluations)
                    improved, improved_run = improved or li, improved_run or lr
                if self.config.elite_steps > 0 and self.config.elite_size > 1 and self.elite_set:
                    # cross-entropy step on the elite set (Post, 2018; Rubinstein's CEM fits the best few)
                    self.agent.imitate_set(np.stack([g for _, g in self.elite_set]),
                                           max_steps=self.config.elite_steps)
                elif self.config.elite_steps > 0 and self.elite_groups is not None:
                    # cross-entropy step on the elite (Post, 2018): keeps the policy centred on the run's best
                    # sample (a few Adam steps after a new best, one when it is already there)
                    self.agent.imitate(self.elite_groups, max_steps=self.config.elite_steps)
                self.since_improvement = 0 if improved else self.since_improvement + 1
                self.since_elite = 0 if improved_run else self.since_elite + 1
                if self.config.restart_updates > 0 and self.start_groups is not None \
                        and self.since_elite >= self.config.restart_updates:
                    self._restart()
                wall = self.wall_s()
                row = self._record(upd, wall)
                self._tb(row)
                bar.update(1)
                bar.set_postfix(best=f"{self.best_time:.4g}s", policy=f"{self.search_best:.4g}s",
                                reward=f"{row['reward_mean']:.3g}", evals_s=f"{self.evaluations / max(wall, 1e-9):.1f}")
                if self.updates % self.checkpoint_every == 0 \
                        or time.perf_counter() - self._last_save >= self.checkpoint_seconds:
                    self.save_checkpoint()
                stop = self.stop_check() if self.stop_check is not None else None
                if stop:
                    break
                self._check_systematic_failure()
        except MeasurementError:
            self.save_checkpoint()   # no device or worker left to measure on: the updates so far are kept (--resume)
            raise
        finally:
            self._interrupt.__exit__()
            bar.close()
        if stop == "interrupted":     # the work so far is kept: `placer search --resume DIR` continues from it
            self.save_checkpoint()
            raise Interrupted(self._interrupt.signum,
                              self._result("interrupted") if self.best_placement is not None else None)
        return self._finish(stop)

    def _finish(self, stop: str) -> LoopResult:
        self.save_checkpoint()
        if self._writer is None:     # no update ran: tb/ (CLI.md) still holds the baselines and the best so far
            self._tb({"update": self.updates, "best_s": self.best_time, "search_best_s": self.search_best})
        if self._writer is not None:
            self._writer.flush()
        if self.out_dir is not None:
            try:
                self.write_curve()
            except Exception as e:  # a plotting problem must not lose the search
                log.warning("could not write curve.png: %s", e)
        return self._result(stop)


class Interrupted(KeyboardInterrupt):
    """A search stopped by a signal (SIGINT, SIGTERM): `signum` says which, so that a command exits with 128 + it
    (130 for Ctrl-C, 143 for SIGTERM), as a process the signal had killed would. `result`: the search's best so
    far (a LoopResult, stop_reason "interrupted") when it stopped between two steps with a placement that fits,
    else None (a second signal stops at once)."""

    def __init__(self, signum: int = signal.SIGINT, result: "LoopResult | None" = None):
        super().__init__(signum)
        self.signum = int(signum)
        self.result = result


class DeferredInterrupt:
    """Ctrl-C (SIGINT) or a polite kill (SIGTERM: `kill PID`, `timeout`, a job scheduler) during the search loop:
    the first only sets `pending`, so that the loop stops at the end of the current update (or local-move batch),
    saves its checkpoint and then raises KeyboardInterrupt, losing no work done since the last periodic
    checkpoint; a second signal interrupts at once. Each signal is taken over only where Python's default
    handler for it is installed, in the main thread."""

    DEFAULTS = ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL))

    def __init__(self):
        self.pending = False
        self.signum = int(signal.SIGINT)   # the signal that set `pending`
        self._old: dict = {}

    def __enter__(self) -> "DeferredInterrupt":
        self.pending = False
        if threading.current_thread() is threading.main_thread():
            for sig, default in self.DEFAULTS:
                if signal.getsignal(sig) is default:
                    self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.pending:
            raise Interrupted(signum)
        self.pending, self.signum = True, int(signum)
        log.warning("%s: finishing the current step to save the checkpoint (again to stop now)",
                    "interrupted" if signum == signal.SIGINT else signal.Signals(signum).name)

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}


def run_loop(grouping, evaluator, *, budget_seconds: float = 300.0, max_updates: int | None = None,
               patience: int | None = None, seed: int = 0, out_dir: str | os.PathLike | None = None,
               baselines: Mapping[str, np.ndarray] | None = None, progress: bool = True,
               cpu_index: int | None = None, allowed: np.ndarray | None = None, config=None,
               checkpoint_every: int = 10, device_capacity: Sequence[float] | None = None,
               resume: bool = False) -> LoopResult:
    """Run (or, with resume=True, continue from out_dir/checkpoint) a REINFORCE placement search.

    Example (a toy evaluator; see tests/test_rl_search.py):
        >>> res = run_loop(grouping, evaluator, budget_seconds=30, max_updates=20,
        ...                  baselines={"single_gpu": np.zeros(n_ops, int)})   # doctest: +SKIP
        >>> res.step_time <= res.baselines["single_gpu"]                         # doctest: +SKIP
        True
    """
    if config is None:
        from placer.rl.reinforce import ReinforceConfig

        config = ReinforceConfig(seed=seed)
    s = Search(grouping, evaluator, cpu_index=cpu_index, allowed=allowed, baselines=baselines, config=config,
               seed=seed, out_dir=out_dir, progress=progress, checkpoint_every=checkpoint_every,
               device_capacity=device_capacity)
    if resume:
        if out_dir is None:
            raise SearchError("resume needs the search directory")
        if not s.load_checkpoint():
            raise SearchError(f"no checkpoint to resume in {Path(out_dir) / 'checkpoint'}")
    return s.run(budget_seconds, max_updates=max_updates, patience=patience)


def history_to_json(history: list[dict[str, float]]) -> str:
    return json.dumps([{k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in r.items()}
                       for r in history])
