"""REINFORCE for device placement, CleanRL style: every hyperparameter in one dataclass (with its source), and
one update readable top to bottom in `reinforce_update`.

One update (Mirhoseini et al. 2017, §3.2; TF's hierarchical_controller.py):
    1. sample K group→device placements from the policy (one batched call; logit noise early on)
    2. expand each to an op→device array with the Grouping (CPU-only ops forced onto the CPU)
    3. evaluate the K op placements in one `Evaluator.evaluate` call (simulator or real measurement)
    4. reward R = -sqrt(step time); a failed placement (OOM, error) gets the step time `failure_step_time`
       (× its memory overflow peak/capacity when it ran out of memory: a graded signal toward fitting)
    5. advantage A = R - b with b an exponential moving average of past mean rewards
    6. loss = -mean_k(A_k · log π(a_k)) / G - entropy_coef · mean entropy; Adam step with global-norm clipping
    7. (in `placer.rl.search.Search`) elite step: fit π to the best placement of the current run (`imitate`);
       after `restart_updates` updates without a better one, re-fit π to the warm-start placement (a restart)

Example (toy evaluator: step time = number of groups not on device g % D):
    >>> import numpy as np
    >>> agent = Reinforce(np.eye(8, dtype="float32"), np.ones((8, 3), bool), ReinforceConfig(hidden_size=32))
    >>> actions, noise = agent.sample()
    >>> times = np.array([1.0 + (a != np.arange(8) % 3).sum() for a in actions])
    >>> stats = agent.learn(actions, noise, agent.rewards(times, np.zeros(len(times), bool), 100.0))
    >>> sorted(stats)[:3]
    ['baseline', 'entropy', 'grad_norm']

TensorFlow is imported at module import: import this module lazily from CLI paths.
"""
from __future__ import annotations

import collections
import functools
import itertools
import threading
import time
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from placer.grouped import charged_step_times, screened
from placer.rl.policy import POLICY_DEVICE, PlacementPolicy


@dataclass
class ReinforceConfig:
    """The search's hyperparameters. Each line cites its source: a paper or the controller's code
    (`hierarchical_controller`), or the benchmark row that chose it; why each non-paper default is what it is:
    benchmarks/RESULTS.md, "Search hyperparameters"."""
    # --- sampling ---
    num_samples: int = 16            # K placements per update (Mirhoseini 2017 used many workers; one batched sim call)
    # --- policy network ---
    hidden_size: int = 128           # LSTM width (paper 256, controller 512); 128 meets 0.5 s/update (bench_search.py)
    attn_size: int = 32              # additive-attention width (controller: hidden_size); kept small for speed
    group_embedding: int = 16        # learned per-group position embedding appended to the features (toy tasks)
    stay_bias: float = 0.0           # initial "same device as the previous group" logit term (0 = the paper's decoder)
    forget_bias: float = 1.0         # hierarchical_controller forget_bias_init=1.0
    temperature: float = 1.0         # hierarchical_controller temperature=1.0
    tanh_constant: float = 5.0       # logits = C·tanh(logits/T); controller 1.0; 5.0 lets a group reach p≈0.99
    noise_scale: float = 0.0         # logit noise / RMS(logits); controller 0.5 for its cold start (nmt4 150 s row)
    explore_groups: float = 1.0      # ε-uniform exploration, ε = explore_groups / G (not in the papers)
    explore_max: float = 0.05        # ...and at most this ε
    noise_stop_update: int = 50      # controller stop_noise_step=750 samples ≈ 750 / 16 updates
    # --- optimisation ---
    learning_rate: float = 3e-4      # Adam; controller lr=0.1 with C=1; 3e-3 saturated the tanh with C=5 (measured)
    grad_clip: float = 1.0           # hierarchical_controller grad_bound=1.0
    entropy_coef: float = 0.01       # CleanRL ppo.py ent_coef=0.01 (the controller has none)
    # --- reward ---
    baseline_decay: float = 0.9      # hierarchical_controller bl_dec=0.9
    baseline_mode: str = "ema"       # "ema" (the controller) or "batch" (mean reward of the K samples)
    normalize_advantage: bool = True  # CleanRL ppo.py norm_adv=True
    advantage_std_floor: float = 0.01  # advantages divided by at least this fraction of |baseline| (toy task)
    failure_factor: float = 10.0     # failed step time = this × the single-device time (controller: 100 s)
    # rounds of baseline evaluation; above 1 (measured rewards), each distinct baseline placement is evaluated
    # once per round, rounds interleaved, and its time is the median of all its runs: copies of one placement
    # measured once each differed by 8-27% on this VM (RESULTS.md, "Measured on a real 2-task cluster")
    baseline_rounds: int = 1
    # placements already evaluated are not evaluated again (the annealer's rule): their outcome is looked up, and
    # the policy draws more samples, up to `max_draws` × K, until K new ones are in the batch. On in
    # FEW_EVALUATIONS (an evaluation is a measurement of seconds); off for simulated searches, where a repeat costs
    # a millisecond and the extra draws cost more (and the 300 s tables were searched without it)
    reuse_evaluations: bool = False
    max_draws: int = 4
    # --- warm start (not in the papers; off with imitation_steps=0) ---
    imitation_steps: int = 300       # fit the best grouped baseline before REINFORCE, at most this many Adam steps
    warm_start_tolerance: float | None = None  # imitate only within this fraction of the best baseline (None: if it fits)
    imitation_prob: float = 0.99     # ...until the per-group probability reaches this (nmt4 150 s row: 0.97 worse)
    # --- elite steps (Post, Gao et al. NeurIPS 2018; cf. self-imitation, Oh et al. ICML 2018) ---
    elite_steps: int = 5             # after every update, ≤ this many Adam steps fitting the best sample so far
    elite_size: int = 1              # ...fitting the best this many distinct samples of the run (CEM's elite set)
    restart_updates: int = 100       # re-fit the warm start after this many updates without a better sample (Update 4)
    # --- local moves (expert iteration: Anthony et al. NeurIPS 2017; a policy's samples refined by local search,
    # as Kool et al. ICLR 2019 do with 2-opt) ---
    # after every update, up to this many evaluations of one annealing chain's moves (the annealer's moves and
    # rule, `placer.grouped`), in batches of `local_batch`; the chain jumps to each new best the policy samples,
    # and its improvements become the run's best, which the elite step fits (Search._local_moves). 0: off
    local_moves: int = 0
    local_batch: int = 8             # AnnealConfig.batch
    local_accept0: float = 0.3       # AnnealConfig.accept0: T0 accepts a median worsening move with this probability
    local_t_final: float = 1e-4      # AnnealConfig.t_final, reached at the end of the search's budget
    local_block: str = "linked"      # AnnealConfig.block: blocks grown by the grouping's links ("run": in group order)
    local_attract_prob: float = 0.2  # AnnealConfig.attract_prob: share of attraction moves (to where links pull)
    # share of policy-guided moves: a group goes to a device in proportion to how often the policy's recent samples
    # (an average over updates, halved each update) put it there, a group drawn by how much of that weight lies
    # away from the chain's point: the chain follows what the policy has learned, where it disagrees with the chain.
    # 0.3 at 1,000 evaluations (nmt, nmt4 4xK80, 4 seeds) was 5.9% and 3.3% worse than 0: off (RESULTS.md
    # "Policy-guided local moves at 1,000 evaluations")
    local_policy_prob: float = 0.0
    # screening (a measured search: the simulator screens what is measured): draw this many x the chain's batch of
    # moves, score them all with the Search's `screen` evaluator (the problem's simulator), and evaluate the batch
    # best by that score (AnnealConfig.screen). No effect without a screen. 1: off
    local_screen: int = 1
    # ...and the policy's samples screened the same way: draw this many x `num_samples` new placements, score the
    # new ones with the `screen`, evaluate the `num_samples` best by that score (and look up the repeats) and learn
    # on those rows. No effect without a screen. 1: off
    sample_screen: int = 1
    local_cluster_prob: float | None = None  # AnnealConfig.cluster_prob: share of cluster moves (a METIS part of the
    #                                  groups, at 2, 4, 8... parts, to one device; placer.grouped.cluster_levels);
    #                                  None: by the device count (placer.grouped.auto_cluster_prob), as merges
    local_merge_prob: float | None = None  # AnnealConfig.merge_prob: share of merge moves (a device's groups to
    #                                  another); None: by the device count (placer.grouped.auto_merge_prob), the
    #                                  Search's config then holds the share it uses
    local_jump: bool = True          # the chain jumps to each new best of the run the policy samples (False: it
    #                                  keeps its own point, as annealing does, and the policy's bests are only kept)
    local_jump_after: float = 0.0    # ...once this share of the search's budget is spent (0: from the start; the
    #                                  chain wanders on its own while it is hot, then refines the policy's bests)
    # ...and past `local_moves`, more of the chain's moves until they have taken this share of the search's wall
    # time so far (warm start included). 0: exactly `local_moves` per update
    local_share: float = 0.0
    # ...and this larger share while the policy's samples are idle: once they have gone `local_share_patience`
    # updates without a new best of the run (the chain's bests included), until their next one. A share counts
    # from the update it began at. 0: off (always `local_share`)
    local_share_idle: float = 0.0
    local_share_patience: int = 10
    # the chain's temperature schedule: "chain" falls from T0 at the chain's first batch to `local_t_final` at the
    # budget's end, as annealing's spans its own moves; "search" spans the whole budget (warm start and first
    # update included), so a chain whose first batch comes some way into the budget starts cooler than T0
    local_schedule: str = "search"
    # reheats of the chain (annealing's `AnnealConfig.restarts` for the chain): its schedule is cut into this many
    # + 1 equal parts, and at the start of each part after the first the chain goes back to the run's best and its
    # temperature to T0. 0: one schedule
    local_restarts: int = 0
    imitation_rows: int = 8          # imitation batch: the placement + 7 copies with perturbed decoder histories
    imitation_perturb: float = 2.0   # ...each with on average this many groups moved (DAgger-style)
    imitation_group_rows: int = 640  # ...at most this many rows × groups per step (8 rows up to G = 80, 2 at 256)
    # --- pretrained (portable) policy: placer.rl.portable ---
    portable: bool = False           # the size- and device-count-independent policy (placer.rl.portable)
    zero_shot_samples: int = 64      # placements sampled from a pretrained policy before any update (one is greedy)
    zero_shot_seconds: float = 0.0   # ...and more batches of as many until this many seconds (`placer place`: 5)
    zero_shot_max: int = 2048        # ...drawing at most this many (a batch that draws nothing new also stops)
    # ...then local moves from the best of them (the annealer's moves; never from a baseline) for this many
    # seconds (`placer place`: placer.search.PLACE_REFINE_SECONDS), the chain's T0 accepting a median worsening
    # move with this probability (colder than the annealer's 0.3: a few seconds leave no time to wander)
    zero_shot_refine_seconds: float = 0.0
    # ...or until this many local moves (evaluations), whichever comes first; the schedule then runs over the
    # moves (the seconds only stop it). 0: seconds only. A budget in moves gives the same answer for the same seed every
    # run, wherever the machine spends it within the seconds (`placer place`: placer.search.PLACE_REFINE_MOVES)
    zero_shot_refine_moves: int = 0
    zero_shot_refine_accept0: float = 0.05
    # the wall budget counts from the zero-shot answer (sampled and refined), not from the search's start: `placer
    # place --budget S` is S seconds of fine-tuning after the answer, however long the answer took
    budget_after_zero_shot: bool = False
    # a fine-tune fits the pretrained policy to its start (as the warm start fits a fresh one): "auto" unless the
    # zero-shot best beats every baseline (then the policy knows the graph), "always", "never". At equal
    # evaluations (benchmarks/finetune_start.py): fitting helped inception_v3 (whose zero-shot best is slower than
    # m_etf) and hurt gpt (whose zero-shot best beats every baseline); RESULTS.md "Placing unseen graphs"
    pretrained_fit: str = "auto"
    # where a fine-tune's chain starts when the zero-shot best is faster than every grouped baseline: "best" (the
    # zero-shot best) or "grouped" (the best grouped baseline, where a search from scratch starts; the zero-shot
    # best stays the run's best: CHEAP_EVALUATIONS). On gpt@DGX1:fp16, the one held-out graph whose zero-shot best
    # beats its grouped baselines, the chain from the zero-shot best ended 1.5% behind a search from scratch at
    # 30,000 evaluations (the policy's placement, half the work on one GPU, lies in a poorer basin than the
    # heuristics'); at 1,000 evaluations from graphs the policy was trained on it was level (nmt4 4xK80) or 0.7%
    # ahead (nmt 2xK80) (RESULTS.md "Where a fine-tune's chain starts")
    pretrained_chain_start: str = "best"
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def for_reward(cls, reward: str, **overrides) -> "ReinforceConfig":
        """The defaults for a reward. "measure": each evaluation is a real step of seconds, so a search sees
        hundreds to a few thousand of them: FEW_EVALUATIONS. "sim": an evaluation costs about a millisecond, less
        than a policy update: CHEAP_EVALUATIONS over the defaults above (tuned on 300 s searches of ~16,000
        evaluations), unless `local_moves=0` asks for the policy alone (then the defaults, its full warm start)."""
        if reward == "measure":
            base = FEW_EVALUATIONS
        else:
            base = CHEAP_EVALUATIONS if overrides.get("local_moves", 1) else {}
        return cls(**{**base, **overrides})

    def explore_for(self, num_groups: int) -> float:
        """ε for a policy over `num_groups` groups: explore_groups / G, at most explore_max."""
        return min(self.explore_max, self.explore_groups / max(1, num_groups))


# Settings for searches of few evaluations (measured rewards): smaller batches, so more updates per evaluation,
# a faster learning rate, and an elite step that re-centres the policy on each new best. At 1,000 evaluations
# (simulated, 4xK80, 3 seeds; RESULTS.md "Policy against annealing at equal evaluations", bench_anneal.py
# --policy-config): nmt4 0.453 s against 0.525 s with the defaults, inception_v3 0.398 s against 0.434 s. And
# placements evaluated before are looked up, not evaluated again: better in 6 of the 8 K80 cells at 1,000
# evaluations (RESULTS.md "Every K80 cell at 1,000 evaluations"), and no measurement is spent on a repeat. The
# elite step fits the run's best 4 distinct samples (the cross-entropy method's elite set), not only the best:
# ahead of annealing in 5 of the 8 K80 cells and behind by at most 1.6%, against 3 and 2.9% with one (RESULTS.md
# "An elite set"; about even on the mean), for ~3x the wall per update (a set rarely reaches imitation_prob).
# And 8 local moves per update (an annealing chain's moves from the run's best; about half the evaluations): over
# seeds 0-5 in all 8 cells, ahead of annealing's mean in 5 and behind in 3 by 0.2-0.6% (the elite set alone:
# behind by 0.6-1.6%), the mean lead 1.4% against 1.0% (RESULTS.md "An elite set", "Local moves at 1,000").
# And the chain's moves screened by the simulator (a measured search: `Search.screen`, the problem's simulator):
# 4x the moves drawn, the quarter it scores fastest measured. In an emulation (the "measurement" the simulator, the
# screen the simulator with per-op costs times lognormal noise 0.3; 1,000 evaluations, seeds 0-3) the search
# reached 0.3038 s on nmt 4xK80 against 0.3219 unscreened (-5.6%) and 0.4243 on nmt4 against 0.4397 (-3.5%);
# annealing screened the same way gained 0.4-5.8% in the four 4-K80 cells, 8 seeds, screens of rank agreement
# 0.76-0.99 (RESULTS.md "Moves screened by the simulator, for measured searches"). Not measured on real devices.
# And the policy's samples screened the same way (`sample_screen`: 4x the new samples drawn, the 8 the simulator
# scores fastest measured): in the same emulation over seeds 0-7, nmt4 4xK80 0.4183 s against 0.4260 (-1.8%,
# better on 6 of 8 seeds), nmt level (0.3111 both) (RESULTS.md "The policy's samples screened too").
FEW_EVALUATIONS = {"num_samples": 8, "elite_steps": 50, "learning_rate": 1e-3, "baseline_rounds": 2,
                   "reuse_evaluations": True, "elite_size": 4, "local_moves": 8, "local_screen": 4,
                   "sample_screen": 4}

# Settings for searches whose evaluations cost less than a policy update (simulated rewards, ~1-4 ms against
# ~0.2-1 s): between updates, at least 128 evaluations of an annealing chain that the policy's new bests restart
# (local moves; Search._local_moves). At equal wall time (120 s, the 8 K80 cells, 3 seeds; RESULTS.md "At equal
# wall time") the policy alone was 1.3-7.8% behind annealing in 5 of 8 cells (it evaluates 2-8x fewer
# placements); with 128 moves per update it was within 1% of annealing's mean in all 8 (3 seeds; 6-9 in the 4-K80
# cells). Against annealing with linked blocks (2026-12-05, nmt 4xK80, 3 seeds) 128 moves fell 6.9% behind: the
# updates took ~2/3 of the wall. So the chain also gets 3/4 of the wall time (local_share), and the warm start
# fits the start in at most 50 steps instead of 300 (~15 s of a 120 s budget): 2.3% behind with the share
# alone, 0.6% ahead with both; with the warm start as the chain's start too, within 1% in 3 of the 4 4-K80 cells
# and 1.7% behind on nmt (3 seeds; RESULTS.md "At equal wall time against linked blocks"). Measured searches
# make 8 moves (FEW_EVALUATIONS). In those searches the policy's samples never beat the run's best once the chain
# runs (0 bests in all 24 recorded 120 s runs on clip and gpt, DGX1 fp16; `policy_improvements`), so its
# updates' quarter of the wall bought nothing: on 8 GPUs the search was 2.0% (clip) and 1.7% (gpt) behind
# annealing (RESULTS.md "Merges by device count"). Once the policy has gone 10 updates without a best, the chain
# takes 95% of the wall (local_share_idle), until the policy's next best. That did not close the gap: 1.6% (clip,
# seeds 8-11) and 2.4% (gpt, seeds 8-15) behind, interleaved; at 20,000 evaluations the search is ahead of
# annealing (1.6% / 2.3%), so the chain is not the gap, the policy's time and seed spread are (RESULTS.md "The
# chain's share while the policy brings no best", "Equal evaluations on 8 GPUs", "The idle share on the K80 cells").
# Since 2026-12-06 evening the chain takes 98% after 3 idle updates: it had 112-115 s of each 120 s (105-110
# before) and made as many evaluations as annealing, yet gpt stayed 1.6% behind over 8 more seeds; and its
# temperature schedule starts at T0 at its first batch (`local_schedule` "chain"), as annealing's does, instead of
# some way into its fall (the warm start and the first update come first); then gpt was 0.9% ahead and clip 1.0%
# behind (RESULTS.md "The policy's last share, and the chain's schedule").
CHEAP_EVALUATIONS = {"local_moves": 128, "local_share": 0.75, "imitation_steps": 50, "local_share_idle": 0.98,
                     "local_share_patience": 3, "local_schedule": "chain", "pretrained_chain_start": "grouped"}


def reward_of(step_times: np.ndarray, failed: np.ndarray, failure_step_time: float) -> np.ndarray:
    """R = -sqrt(step time) (hierarchical_controller reward_function="sqrt"); failures count as
    `failure_step_time`."""
    t = np.where(failed | ~np.isfinite(step_times), failure_step_time, step_times)
    return -np.sqrt(np.maximum(t, 0.0))


class Reinforce:
    """The learner: a PlacementPolicy, Adam, and the EMA reward baseline.

    features: float32[G, F]; allowed: bool[G, D]. `sample()` → (actions [K, G], noise); `learn(actions,
    noise, rewards)` → stats dict. `get_state()` / `set_state()` give everything a checkpoint needs.
    """

    def __init__(self, features: np.ndarray, allowed: np.ndarray, config: ReinforceConfig | None = None,
                 policy=None, optimizer=None):
        self.config = cfg = config or ReinforceConfig()
        # `policy`: an already built policy with PlacementPolicy's interface (a pretrained PortablePolicy), else one
        # for `features` and this seed; the agent may use a collected agent's traced twin of it (`_own_core`)
        policy = policy if policy is not None else _new_policy(features, allowed, cfg)
        if optimizer is None:
            self.policy, self.optimizer, self._step_fn = _own_core(self, policy, cfg)
        else:      # Adam shared by several agents over the same weights (pretraining): nothing to hand on
            self.policy, self.optimizer = policy, optimizer
            self._step_fn = _traced_step(policy, optimizer)
        self.variables = list(self.policy.trainable_variables)
        self.baseline: float | None = None     # EMA of mean batch reward; set by the first batch
        self.updates = 0                       # completed learn() calls
        self._np_rng = np.random.default_rng(cfg.seed + 1)   # perturbed histories (checkpointed)

    @property
    def noise_scale(self) -> float:
        c = self.config
        return c.noise_scale if self.updates < c.noise_stop_update else 0.0

    def sample(self, k: int | None = None, greedy: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """K placements int32[K, G] and the logit noise used float32[K, G, D]."""
        return self.policy.sample(k or self.config.num_samples, self.noise_scale, greedy=greedy)

    def rewards(self, step_times: np.ndarray, failed: np.ndarray, failure_step_time: float) -> np.ndarray:
        return reward_of(np.asarray(step_times, np.float64), np.asarray(failed, bool), failure_step_time)

    def _train(self, actions, noise, noise_scale, advantages):
        """A REINFORCE step (the fit step with the mixture, the entropy bonus and teacher forcing)."""
        return self._step_fn(actions, actions, noise, noise_scale, advantages, tf.constant(True),
                             tf.constant(float(self.config.entropy_coef), tf.float32))

    def _imitate_fn(self, actions, history):
        """An imitation step: -log π(row 0) / G, the first (unperturbed) row's per-group negative log-likelihood."""
        G, D = self.policy.num_groups, self.policy.num_devices
        n = int(actions.shape[0])
        _, _, _, logp = self._step_fn(actions, history, tf.zeros([n, G, D]), tf.constant(0.0), tf.ones([n]),
                                      tf.constant(False), tf.constant(0.0))
        return -logp[0] / float(G)

    def _histories(self, group_devices: np.ndarray, rows: int) -> np.ndarray:
        """`rows` copies of a placement as decoder histories: row 0 as is, the others with each group replaced
        by a uniformly drawn allowed device with probability `imitation_perturb` / G."""
        G = self.policy.num_groups
        allowed = np.asarray(self.policy.allowed)
        h = np.repeat(np.asarray(group_devices, np.int32)[None], rows, 0)
        if rows > 1 and self.config.imitation_perturb > 0:
            flip = self._np_rng.random((rows - 1, G)) < min(0.5, self.config.imitation_perturb / G)
            rand = (self._np_rng.random((rows - 1, G, allowed.shape[1])) * allowed[None]).argmax(-1).astype(np.int32)
            h[1:] = np.where(flip, rand, h[1:])
        return h

    def imitate(self, group_devices: np.ndarray, max_steps: int | None = None,
                target_prob: float | None = None, deadline: float | None = None) -> dict[str, float]:
        """Maximum-likelihood fit to one group placement: Adam steps on -log π(group_devices) / G until
        the geometric-mean per-group probability reaches `target_prob` (or `max_steps`, or `deadline`). The
        decoder also reads perturbed histories (`imitation_rows` - 1 copies with a few earlier groups moved), so
        that after one group is sampled elsewhere the policy still places the next groups as in `group_devices`."""
        return self.imitate_set(np.asarray(group_devices)[None], max_steps=max_steps, target_prob=target_prob,
                                deadline=deadline)

    def imitate_set(self, placements: np.ndarray, max_steps: int | None = None,
                    target_prob: float | None = None, deadline: float | None = None) -> dict[str, float]:
        """Maximum-likelihood fit to E group placements at once (E > 1: the cross-entropy method's elite set,
        best first): each row of `placements` int[E, G] gets an equal share of the imitation rows, its own
        perturbed histories as in `imitate` (E = 1 is `imitate`). Stops after `max_steps`, when the first
        placement's geometric-mean per-group probability reaches `target_prob`, or once `time.perf_counter()`
        passes `deadline` (no step starts after it: a search's budget; 0 steps when it has passed already)."""
        cfg = self.config
        max_steps = cfg.imitation_steps if max_steps is None else max_steps
        target_prob = cfg.imitation_prob if target_prob is None else target_prob
        placements = np.asarray(placements, np.int32).reshape(-1, self.policy.num_groups)
        rows = max(1, min(int(cfg.imitation_rows), max(2, int(cfg.imitation_group_rows) // self.policy.num_groups)))
        per = max(1, -(-rows // len(placements)))
        a = tf.constant(np.repeat(placements, per, 0), tf.int32)
        prob, steps = 0.0, 0
        while steps < max_steps and (deadline is None or time.perf_counter() < deadline):
            steps += 1
            h = tf.constant(np.concatenate([self._histories(p, per) for p in placements]), tf.int32)
            with tf.device(POLICY_DEVICE):
                prob = float(np.exp(-float(self._imitate_fn(a, h))))   # row 0: the first, unperturbed
            if prob >= target_prob:
                break
        return {"imitation_steps": steps, "imitation_prob": prob}

    def learn(self, actions: np.ndarray, noise: np.ndarray, rewards: np.ndarray) -> dict[str, float]:
        """One policy-gradient step on K sampled placements and their rewards."""
        cfg = self.config
        rewards = np.asarray(rewards, np.float64)
        if self.baseline is None:
            self.baseline = float(rewards.mean())
        adv = rewards - (self.baseline if cfg.baseline_mode == "ema" else rewards.mean())
        if cfg.normalize_advantage:
            adv = adv / (rewards.std() + cfg.advantage_std_floor * abs(self.baseline) + 1e-12)
        with tf.device(POLICY_DEVICE):
            loss, entropy, grad_norm, logp = self._train(
                tf.constant(actions, tf.int32), tf.constant(noise, tf.float32),
                tf.constant(self.noise_scale, tf.float32), tf.constant(adv, tf.float32))
        self.baseline = cfg.baseline_decay * self.baseline + (1 - cfg.baseline_decay) * float(rewards.mean())
        self.updates += 1
        return {"loss": float(loss), "entropy": float(entropy), "grad_norm": float(grad_norm),
                "baseline": float(self.baseline), "reward_mean": float(rewards.mean()),
                "logp_mean": float(np.mean(logp.numpy()))}

    # ---------------------------------------------------------------- checkpoint state
    def get_state(self) -> dict[str, Any]:
        return {"policy": self.policy.get_state(), "optimizer": [v.numpy() for v in self.optimizer.variables],
                "baseline": self.baseline, "updates": self.updates, "config": self.config.to_dict(),
                "imitation_rng": self._np_rng.bit_generator.state}

    def set_state(self, state: dict[str, Any]) -> None:
        self.policy.set_state(state["policy"])
        opt_vars = self.optimizer.variables
        if len(opt_vars) != len(state["optimizer"]):
            raise KeyError("optimizer state does not match the policy")
        for v, a in zip(opt_vars, state["optimizer"]):
            v.assign(a)
        self.baseline = state["baseline"]
        self.updates = int(state["updates"])
        if "imitation_rng" in state:     # checkpoints from before the perturbed-history imitation lack it
            self._np_rng.bit_generator.state = state["imitation_rng"]


def _fit_step(policy, optimizer, actions, history, noise, noise_scale, weights, mixture, entropy_coef):
    """One Adam step on -mean(weights · log π(actions | history)) / G - entropy_coef · entropy. REINFORCE
    (`Reinforce.learn`): weights are the advantages, history = actions (teacher forcing), log-probabilities under
    the exploration mixture (`mixture`). Imitation (`imitate_set`): weights 1, perturbed histories, no noise, the
    softmax alone, no entropy term. Returns (loss, entropy, global gradient norm, log-probabilities [K])."""
    with tf.device(POLICY_DEVICE):
        variables = list(policy.trainable_variables)
        G = float(policy.num_groups)
        with tf.GradientTape() as tape:
            logp, entropy = policy._log_probs(actions, noise, noise_scale, mixture=mixture, history=history)
            pg_loss = -tf.reduce_mean(weights * logp) / G       # per group, so entropy_coef is per decision
            entropy = tf.reduce_mean(entropy)
            loss = pg_loss - entropy_coef * entropy
        grads = tape.gradient(loss, variables)
        grad_norm = tf.linalg.global_norm(grads)
        optimizer.apply_gradients(zip(grads, variables))   # clips to grad_clip (global norm)
        return loss, entropy, grad_norm, logp


def _traced_step(policy, optimizer):
    """The fit step as one tf.function for REINFORCE and imitation (one trace, ~3 s on this VM; its fixed
    signature never retraces). It holds the policy and Adam, never the agent (`_own_core`)."""
    G, D = policy.num_groups, policy.num_devices
    return tf.function(functools.partial(_fit_step, policy, optimizer), input_signature=[
        tf.TensorSpec([None, G], tf.int32), tf.TensorSpec([None, G], tf.int32),
        tf.TensorSpec([None, G, D], tf.float32), tf.TensorSpec([], tf.float32), tf.TensorSpec([None], tf.float32),
        tf.TensorSpec([], tf.bool), tf.TensorSpec([], tf.float32)], autograph=False)


def _new_policy(features, allowed, cfg: ReinforceConfig) -> PlacementPolicy:
    return PlacementPolicy(features, allowed, hidden_size=cfg.hidden_size, attn_size=cfg.attn_size,
                           temperature=cfg.temperature, tanh_constant=cfg.tanh_constant, forget_bias=cfg.forget_bias,
                           group_embedding=cfg.group_embedding, stay_bias=cfg.stay_bias,
                           explore=cfg.explore_for(features.shape[0]), seed=cfg.seed)


def _adam(cfg: ReinforceConfig, variables):
    import keras

    with tf.device(POLICY_DEVICE):
        opt = keras.optimizers.Adam(cfg.learning_rate, global_clipnorm=cfg.grad_clip)
        opt.build(list(variables))
    return opt


# A new agent's first sample and first fit step trace and compile the policy's tf.functions: ~5 s on this VM, most
# of a short search's start (and of the tests' time). So an agent that is garbage-collected hands its policy, Adam
# and traced step (a "core") to the next agent of this process whose policy has the same `core_key()` (shapes,
# traced settings; for a pretrained policy, the same weights object), which re-initialises them: its own policy's
# weights, RNG state and graph inputs (`reset_to`), Adam zeroed at its learning rate. Same values as a new build,
# no retrace (tested). Cores are only handed on once their agent is gone, so two live agents never share one; at
# most `_POOL_MAX` wait, the least recently given back dropped first.
_POOL: collections.OrderedDict[tuple, tuple] = collections.OrderedDict()   # (key, serial) → core, oldest first
_POOL_LOCK = threading.Lock()
_POOL_MAX = 8
_serial = itertools.count()
# Cores given back wait here until the next agent takes the lock: a finalizer runs whenever the garbage collector
# does, possibly inside `_own_core`'s locked section, and a bounded deque's append needs no lock.
_RETURNED: collections.deque = collections.deque(maxlen=_POOL_MAX)


def _give_back(key: tuple, core: tuple) -> None:
    _RETURNED.append((key, core))


def _own_core(agent: "Reinforce", policy, cfg: ReinforceConfig) -> tuple:
    """(policy, Adam, traced step) for a new agent whose policy is `policy` (just built, untraced): a collected
    agent's, re-initialised to `policy`'s values, or `policy` with a new Adam and step."""
    key = (*policy.core_key(), cfg.grad_clip, POLICY_DEVICE)
    with _POOL_LOCK:
        while True:
            try:
                k, c = _RETURNED.popleft()
            except IndexError:
                break
            _POOL[(k, next(_serial))] = c
        while len(_POOL) > _POOL_MAX:
            _POOL.popitem(last=False)
        found = next((k for k in reversed(_POOL) if k[0] == key), None)
        core = _POOL.pop(found) if found is not None else None
    if core is None:
        opt = _adam(cfg, policy.trainable_variables)
        core = (policy, opt, _traced_step(policy, opt))
    else:
        pooled, opt, _ = core
        pooled.reset_to(policy)
        for v in opt.variables:
            v.assign(np.zeros(v.shape, v.dtype))
        opt.learning_rate = cfg.learning_rate
    weakref.finalize(agent, _give_back, key, core)
    return core


class EvaluationCache:
    """Group placements already evaluated → (step time, failed, charged step time). Only outcomes that would
    come out the same again are kept: a placement that worked, or that ran out of memory; not an error, a
    timeout or a lost device (those may pass the next time). Arrays in and out for checkpoints."""

    def __init__(self):
        self._d: dict[bytes, tuple[float, bool, float]] = {}
        self._rows: list[np.ndarray] = []

    @staticmethod
    def key(group_devices) -> bytes:
        return np.asarray(group_devices, np.int32).tobytes()

    def __len__(self) -> int:
        return len(self._d)

    def get(self, group_devices) -> tuple[float, bool, float] | None:
        return self.lookup(self.key(group_devices))

    def lookup(self, key: bytes) -> tuple[float, bool, float] | None:
        return self._d.get(key)

    def put(self, group_devices, outcome, charged: float) -> None:
        if outcome.failed and (not outcome.oom or outcome.lost_devices):
            return
        k = self.key(group_devices)
        if k not in self._d:
            self._rows.append(np.asarray(group_devices, np.int32).copy())
        self._d[k] = (float(outcome.step_time), bool(outcome.failed), float(charged))

    def to_arrays(self) -> dict[str, np.ndarray]:
        vals = [self._d[self.key(r)] for r in self._rows]
        G = self._rows[0].shape[0] if self._rows else 0
        groups = np.stack(self._rows) if self._rows else np.zeros((0, G), np.int32)
        if groups.size and groups.max() < 2**15:      # device indices: half the checkpoint's bytes
            groups = groups.astype(np.int16)
        return {"groups": groups,
                "values": np.array(vals, np.float64).reshape(-1, 3)}

    @classmethod
    def from_arrays(cls, groups: np.ndarray, values: np.ndarray) -> "EvaluationCache":
        c = cls()
        for g, (t, f, ch) in zip(np.asarray(groups, np.int32), np.asarray(values, np.float64)):
            c._rows.append(g.copy())
            c._d[cls.key(g)] = (float(t), bool(f), float(ch))
        return c


@dataclass
class UpdateResult:
    """What one REINFORCE update sampled and learned. With a cache, rows whose placement was evaluated before
    (or earlier in the batch) carry that outcome's times and were not evaluated again: `evaluated` marks the
    rows that were, and `outcomes` holds only theirs."""
    group_devices: np.ndarray              # int32[K, G]
    op_placements: list[np.ndarray]        # K op→device arrays
    step_times: np.ndarray                 # float64[K] (inf where no time exists)
    failed: np.ndarray                     # bool[K]
    outcomes: list                         # list[Outcome] of the evaluated rows
    evaluated: np.ndarray = None           # bool[K]: rows evaluated in this update (None: all)
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def num_evaluated(self) -> int:
        return len(self.failed) if self.evaluated is None else int(np.sum(self.evaluated))


def _draw(agent: "Reinforce", cache: EvaluationCache, k: int, max_draws: int) -> tuple[np.ndarray, np.ndarray]:
    """Samples in batches of K until K placements in them are new (neither in `cache` nor earlier in the
    draw), at most `max_draws` batches; the rows up to the K-th new one (all rows when fewer were found)."""
    acts, noises, seen, new = [], [], set(), 0
    for _ in range(max(1, max_draws)):
        a, n = agent.sample(k)
        for i in range(len(a)):
            key = cache.key(a[i])
            if key not in seen and cache.lookup(key) is None:
                new += 1
            seen.add(key)
            if new >= k:
                acts.append(a[:i + 1])
                noises.append(n[:i + 1])
                return np.concatenate(acts), np.concatenate(noises)
        acts.append(a)
        noises.append(n)
    return np.concatenate(acts), np.concatenate(noises)


def screen_rows(actions: np.ndarray, k: int, screen, expand, cache: EvaluationCache | None = None) -> np.ndarray:
    """The rows of the group placements `actions` to evaluate when a cheap Evaluator `screen` chooses: the `k` new
    placements (not in `cache`, first copies) it scores fastest (`placer.grouped.screened`: failures last, ties in
    draw order), with their copies, and every row `cache` already holds (a lookup costs nothing). Row order kept.

    >>> class Sim:
    ...     def evaluate(self, ps): return [type("O", (), {"ok": True, "step_time": float(p.sum())})() for p in ps]
    >>> screen_rows(np.array([[3], [1], [2], [1]]), 1, Sim(), lambda a: a).tolist()
    [1, 3]
    """
    key = EvaluationCache.key
    first: dict[bytes, int] = {}
    for i, a in enumerate(actions):
        kb = key(a)
        if kb not in first and (cache is None or cache.lookup(kb) is None):
            first[kb] = i
    if len(first) <= k:
        return np.arange(len(actions))
    chosen = {key(a) for a in screened([actions[i] for i in first.values()], k, screen, expand)}
    return np.array([i for i, a in enumerate(actions) if key(a) not in first or key(a) in chosen], dtype=np.int64)


@dataclass
class GroupOutcomes:
    """What `evaluate_groups` found for N group placements: a row looked up in the cache or copied from an
    earlier row of the batch carries that outcome's times and was not evaluated again."""
    step_times: np.ndarray                 # float64[N] (the outcome's own; inf where no time exists)
    failed: np.ndarray                     # bool[N]
    charged: np.ndarray                    # float64[N]: what the search is charged (`charged_step_times`)
    evaluated: np.ndarray                  # bool[N]: rows evaluated in this call
    outcomes: list                         # list[Outcome] of the evaluated rows, in row order

    @property
    def times(self) -> np.ndarray:
        """The step times of the rows that worked; inf elsewhere."""
        return np.where(~self.failed & np.isfinite(self.step_times), self.step_times, np.inf)


def evaluate_groups(groups: Sequence[np.ndarray], expand, evaluator, failure_step_time: float,
                    capacity: np.ndarray | None = None, cache: EvaluationCache | None = None) -> GroupOutcomes:
    """Evaluate group placements in one `evaluator.evaluate` call: with a `cache`, rows evaluated before are
    looked up; copies of a row within the batch are evaluated once (with a cache) and share its outcome; the
    outcomes are put in the cache. `expand(i)` gives row i's op placement (only evaluated rows are expanded).
    The one path by which the search's samples (`reinforce_update`) and its local moves (`Search._local_moves`)
    reach the evaluator."""
    n = len(groups)
    step_times, failed = np.zeros(n), np.zeros(n, bool)
    charged = np.zeros(n)
    evaluated = np.zeros(n, bool)
    first: dict = {}
    copy_of: dict[int, int] = {}                    # row → the earlier row of the same placement
    todo = []
    for i, a in enumerate(groups):
        key = EvaluationCache.key(a) if cache is not None else i
        hit = cache.lookup(key) if cache is not None else None
        if hit is not None:
            step_times[i], failed[i], charged[i] = hit
        elif key in first:
            copy_of[i] = first[key]                 # filled in below
        else:
            first[key] = i
            todo.append(i)
    outcomes = evaluator.evaluate([expand(i) for i in todo]) if todo else []
    ch = charged_step_times(outcomes, failure_step_time, capacity) if outcomes else np.zeros(0)
    for i, o, c in zip(todo, outcomes, ch):
        step_times[i], failed[i], charged[i], evaluated[i] = o.step_time, o.failed, c, True
        if cache is not None:
            cache.put(groups[i], o, c)
    for i, j in copy_of.items():
        step_times[i], failed[i], charged[i] = step_times[j], failed[j], charged[j]
    return GroupOutcomes(step_times, failed, charged, evaluated, list(outcomes))


def reinforce_update(agent: Reinforce, grouping, evaluator, cpu_index: int | None,
                     failure_step_time: float, capacity: np.ndarray | None = None,
                     cache: EvaluationCache | None = None, screen=None) -> UpdateResult:
    """Sample K placements → expand to ops → evaluate in one batch → rewards → one policy-gradient step.
    With a `cache`: keep sampling until K placements not evaluated before are drawn (`_draw`), evaluate only
    those, look the others up, and learn on every row drawn (REINFORCE on the policy's own samples).
    With a `screen` (an Evaluator, cheaper than `evaluator`: the simulator of a measured search) and
    `config.sample_screen` S > 1: draw S x K new placements, keep the K new ones the screen scores fastest and the
    repeats (`screen_rows`), and evaluate and learn on those rows only."""
    t0 = time.perf_counter()
    k = agent.config.num_samples
    factor = max(1, int(agent.config.sample_screen)) if screen is not None else 1
    if cache is None:
        actions, noise = agent.sample(k * factor)                                # 1. sample
    else:
        actions, noise = _draw(agent, cache, k * factor, agent.config.max_draws)
    if factor > 1:
        keep = screen_rows(actions, k, screen, lambda a: grouping.expand(a, cpu_index), cache)
        actions, noise = actions[keep], noise[keep]
    t1 = time.perf_counter()
    placements = [grouping.expand(a, cpu_index) for a in actions]                # 2. expand
    r = evaluate_groups(actions, placements.__getitem__, evaluator, failure_step_time, capacity, cache)  # 3.
    t2 = time.perf_counter()
    rewards = agent.rewards(r.charged, np.zeros(len(actions), bool), failure_step_time)  # 4. reward = -sqrt(time)
    stats = agent.learn(actions, noise, rewards)                                # 5-6. baseline, loss, Adam
    t3 = time.perf_counter()
    stats.update(sample_s=t1 - t0, evaluate_s=t2 - t1, learn_s=t3 - t2)
    return UpdateResult(actions, placements, r.step_times, r.failed, r.outcomes, r.evaluated, stats)


def toy_step_times(actions: np.ndarray, target: Sequence[int], base: float = 1.0, per_miss: float = 0.1) -> np.ndarray:
    """A toy cost with a known optimum: base + per_miss × (groups not on their target device)."""
    return base + per_miss * (np.asarray(actions) != np.asarray(target)[None]).sum(axis=1)
