"""`placer pretrain`: train one portable policy (`placer.rl.portable`) over a corpus of graphs and clusters, so
that it places a graph it never saw in seconds (`placer place --policy DIR`) and fine-tunes faster than a search
from scratch (`placer search --policy DIR`).

    from placer.pretrain import pretrain, default_corpus
    info = pretrain("policy/", budget_seconds=1800)            # writes policy/policy.npz and policy/policy.json

The corpus (`default_corpus`): the LSTM benchmark families (rnnlm, nmt, nmt4) at their full and small sizes on
2 and 4 K80s and on 4 and 8 V100s, and random Keras stacks of conv, dense, LSTM and attention blocks
(`placer.graphs.models.random_stack`) on 2-8 devices. The families `HELD_OUT` (inception_v3, gpt, clip) are
never in it: `benchmarks/transfer.py` evaluates on them.

One set of weights, one Adam, one agent per corpus problem (each with its own reward baseline and its own
best placement so far). Training has two phases within the budget:
1. imitation (at most `imitation_share` of the budget): each problem's best grouped baseline, a few Adam steps
   per problem in turn, so the policy first learns what the usual heuristics do on every kind of graph;
2. REINFORCE, problems in turn: sample K placements, simulate them, one policy-gradient step, then an elite
   step towards the best placement known for that problem (baseline or sample), as `placer search` does.
Rewards are simulated (each problem's preset cluster and analytical costs).
"""
from __future__ import annotations

import datetime
import logging
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from placer.errors import PlacerError, SearchError

log = logging.getLogger(__name__)

HELD_OUT = ("inception_v3", "gpt", "clip")


@dataclass(frozen=True)
class CorpusItem:
    model: str                 # a built-in model name, "random" (random_stack with `seed`) or "towers"
    cluster: str
    size: str = "full"
    seed: int = 0              # random_stack's / random_towers' seed
    batch_size: int | None = None
    precision: str = "fp32"    # random stacks and towers only (Keras mixed-precision policy)

    @property
    def name(self) -> str:
        g = f"{self.model}_{self.seed}" if self.model in GENERATED else f"{self.model}_{self.size}"
        return (f"{g}{'' if self.batch_size is None else f'_b{self.batch_size}'}@{self.cluster}"
                f"{'' if self.precision == 'fp32' else ':' + self.precision}")

    @classmethod
    def on(cls, model: str, spec: str, **kw) -> "CorpusItem":
        """An item on `spec` = "cluster[:precision]" (the form its name ends with), e.g. "DGX1:fp16"."""
        cluster, _, precision = spec.partition(":")
        return cls(model, cluster, precision=precision or "fp32", **kw)


GENERATED = ("random", "towers")   # corpus models drawn by `placer.graphs.models.random_stack`


def default_corpus() -> list[CorpusItem]:
    items = []
    for m in ("rnnlm", "nmt", "nmt4"):
        items += [CorpusItem(m, "2xK80"), CorpusItem(m, "4xK80"), CorpusItem(m, "4xV100", "small"),
                  CorpusItem(m, "8xV100", "small", batch_size=128)]
    clusters = ("2xK80", "4xV100", "8xV100", "4xK80", "3xV100", "6xK80")
    items += [CorpusItem("random", clusters[s % len(clusters)], seed=s) for s in range(12)]
    return items


def wide_corpus() -> list[CorpusItem]:
    """`default_corpus` and 12 more: eight random multi-input tower models (`random_stack.build_random_towers`,
    seeds 0-7) and four random stacks (seeds 12-15) in fp16, on the DGX-1 topology (NVLink, fp16 on tensor cores)
    and the K80 / V100 presets. Still none of the held-out families."""
    towers = ("DGX1:fp16", "4xV100", "8xV100:fp16", "2xK80", "4xK80", "DGX1", "3xV100:fp16", "6xK80")
    items = default_corpus()
    items += [CorpusItem.on("towers", spec, seed=s) for s, spec in enumerate(towers)]
    items += [CorpusItem("random", c, seed=s, precision="fp16")
              for s, c in zip(range(12, 16), ("DGX1", "8xV100", "DGX1", "4xV100"))]
    return items


PARALLEL_CLUSTERS = ("DGX1:fp16", "4xK80", "8xV100:fp16", "6xK80", "8xV100", "DGX1:fp16")


def parallel_corpus() -> list[CorpusItem]:
    """`default_corpus` and 12 compute-bound multi-input models: random towers (`build_random_towers`, seeds
    0-11) at batch 512 (seeds 0-5) and 256 (seeds 6-11), on 4-8 devices. The default corpus's 8-device problems
    are small (millisecond steps, bound by transfers), so a policy trained on it learns to co-locate; on many of
    these towers the best baseline spreads the work over 4-8 devices. Still none of the held-out families."""
    items = default_corpus()
    items += [CorpusItem.on("towers", PARALLEL_CLUSTERS[s % len(PARALLEL_CLUSTERS)], seed=s,
                            batch_size=512 if s < 6 else 256) for s in range(12)]
    return items


def quick_corpus() -> list[CorpusItem]:
    """Three tiny problems (tests)."""
    return [CorpusItem("rnnlm", "2xK80", "tiny"), CorpusItem("nmt", "4xK80", "tiny"),
            CorpusItem("random", "3xV100", seed=2)]


CORPORA = {"default": default_corpus, "wide": wide_corpus, "parallel": parallel_corpus, "quick": quick_corpus}


def build_graph(item: CorpusItem):
    if item.model in GENERATED:
        from placer.graphs.models.random_stack import build_random_stack, build_random_towers

        build = build_random_stack if item.model == "random" else build_random_towers
        return build(item.seed, item.batch_size, precision=item.precision)
    from placer.graphs.models import build_model

    return build_model(item.model, item.size, item.batch_size)


@dataclass
class _Task:
    item: CorpusItem
    problem: object
    agent: object
    best_baseline_s: float
    target: np.ndarray | None      # best known group placement (grouped baseline, then the best sample)
    target_s: float
    fail_s: float
    capacity: np.ndarray
    best_sample_s: float = float("inf")
    updates: int = 0
    teacher_s: float | None = None   # the annealed target's step time (`teacher_seconds`; None: not faster)


def _task(item: CorpusItem, weights, optimizer, config, seed: int, split_groups: str | None = None) -> _Task | None:
    from placer.bench import evaluate_baselines
    from placer.grouped import grouped_baselines
    from placer.problem import build_problem
    from placer.rl.portable import PortablePolicy
    from placer.rl.reinforce import Reinforce
    from placer.search import policy_inputs

    graph = build_graph(item)
    problem = build_problem(graph, item.cluster, seed=seed, split_groups=split_groups)
    if int(problem.allowed.sum(axis=1).max()) <= 1:
        problem.close()
        return None
    times, _ = evaluate_baselines(problem)
    ok = {k: v for k, v in times.items() if v is not None and k not in ("random", "round_robin")}
    if not ok:
        log.warning("pretrain: skipping %s: no baseline fits", item.name)
        problem.close()
        return None
    names, targets = grouped_baselines(problem.baselines, ok, problem.grouping.op_group,
                                       problem.grouping.num_groups, problem.allowed)
    outs = problem.simulator.evaluate([problem.grouping.expand(t, problem.cluster.cpu_index) for t in targets])
    gt = [o.step_time if o.ok else np.inf for o in outs]
    j = int(np.argmin(gt)) if gt else 0
    pol = PortablePolicy.from_config(weights, policy_inputs(problem), problem.allowed, config, seed=seed)
    agent = Reinforce(None, problem.allowed, config, policy=pol, optimizer=optimizer)
    best = min(ok.values())
    return _Task(item, problem, agent, best, targets[j] if gt and np.isfinite(gt[j]) else None,
                 float(gt[j]) if gt else np.inf, config.failure_factor * max(ok.values()),
                 np.array([d.capacity_bytes for d in problem.cluster.devices], np.float64))


def _teach(tasks: list[_Task], seconds: float, seed: int, progress: bool) -> float:
    """Anneal each task's target for `seconds` (from the target; linked blocks); a faster result becomes the
    target. Returns the wall time."""
    from placer.baselines.anneal import anneal

    t0 = time.perf_counter()
    for i, t in enumerate(tasks):
        if t.target is None:
            continue
        r = anneal(t.problem, start=t.target, budget_seconds=seconds, seed=seed + i)
        if r.group_devices is not None and r.step_time < t.target_s:
            t.target, t.target_s = np.asarray(r.group_devices).copy(), float(r.step_time)
            t.teacher_s = t.target_s
        if progress:
            print(f"pretrain: teacher {t.item.name}: {r.start_s:.4g} s -> {r.step_time:.4g} s in {r.evaluations} "
                  f"evaluations", flush=True)
    return time.perf_counter() - t0


def _greedy_ratio(t: _Task) -> float:
    a = t.agent.policy.sample(1, greedy=True)[0][0]
    o = t.problem.simulator.evaluate([t.problem.grouping.expand(a, t.problem.cluster.cpu_index)])[0]
    return float(o.step_time / t.best_baseline_s) if o.ok else float("inf")


def existing_policy(out_dir) -> Path | None:
    """The policy file (policy.npz or policy.json) directory `out_dir` already holds, or None."""
    for name in ("policy.npz", "policy.json"):
        if (Path(out_dir) / name).exists():
            return Path(out_dir) / name
    return None


def pretrain(out_dir, *, budget_seconds: float = 1800.0, corpus: list[CorpusItem] | str = "default", seed: int = 0,
             hidden_size: int = 128, attn_size: int = 32, imitation_share: float = 0.3, progress: bool = False,
             learning_rate: float = 1e-3, init=None, split_groups: str | None = None,
             teacher_seconds: float = 0.0, overwrite: bool = False) -> dict:
    """Train a portable policy on `corpus` for `budget_seconds` of training (building the corpus is extra and
    reported as `build_wall_s`); write it to `out_dir`. Returns the info written into policy.json.
    init: go on training this policy (a `placer pretrain` directory, "default", or `PortableWeights`; its sizes
    replace hidden_size and attn_size) instead of a new one. split_groups: each corpus problem's groups follow
    this baseline's device boundaries ("best": the fastest; `build_problem(split_groups=...)`), so that the
    imitation target is that baseline exactly rather than its group-majority version. teacher_seconds: before
    training, anneal each problem's target (its best grouped baseline) for this many seconds
    (`placer.baselines.anneal`, linked blocks) and imitate the annealed placement instead when it is faster, so the
    policy learns what a local search finds rather than what the heuristics do (expert iteration's improvement
    operator, applied once); this time comes on top of the budget and is reported as `teacher_wall_s`.
    overwrite: replace the policy `out_dir` already holds (else SearchError naming its file, before any work, as
    `placer search --out` refuses a directory holding a search)."""
    held = existing_policy(out_dir)
    if held is not None and not overwrite:
        raise SearchError(f"{out_dir} already holds a policy ({held}), which the new one would overwrite: pick "
                          f"another directory, train on from it into a new one (--init {out_dir} --out NEW; "
                          f"init=), or overwrite it (--force; overwrite=True)")
    import keras
    import tensorflow as tf

    from placer.rl.policy import POLICY_DEVICE
    from placer.rl.portable import PortableWeights
    from placer.rl.reinforce import ReinforceConfig
    from placer.rl.search import Interrupted, DeferredInterrupt

    if not budget_seconds > 0:
        raise SearchError(f"pretrain budget must be positive, got {budget_seconds} s")
    if not (np.isfinite(teacher_seconds) and teacher_seconds >= 0.0):
        raise SearchError(f"pretrain --teacher-seconds must be >= 0, got {teacher_seconds}")
    from placer.problem import check_split_groups

    check_split_groups(split_groups)      # now, not after building the corpus
    if isinstance(corpus, str):
        if corpus not in CORPORA:
            raise SearchError(f"unknown corpus {corpus!r}: use one of {', '.join(CORPORA)}")
        corpus_name, corpus = corpus, CORPORA[corpus]()
    else:
        corpus_name = "custom"
    held = [c.name for c in corpus if c.model in HELD_OUT]
    if held:
        log.warning("pretrain: the corpus holds graphs of held-out families: %s", ", ".join(held))
    started = datetime.datetime.now(datetime.timezone.utc)
    init_info = None
    if init is not None:
        if not isinstance(init, PortableWeights):
            from placer.rl.portable import resolve_policy

            init_name, init = str(init), PortableWeights.load(resolve_policy(init))
        else:
            init_name = "weights"
        hidden_size, attn_size = init.hidden_size, init.attn_size
        old = getattr(init, "info", None) or {}
        init_info = {"policy": init_name, "date": old.get("date"), "budget_s": old.get("budget_s"),
                     "corpus": old.get("corpus"), "init": old.get("init")}
    config = ReinforceConfig(seed=seed, hidden_size=hidden_size, attn_size=attn_size, portable=True,
                             learning_rate=learning_rate)
    weights = init if init is not None else PortableWeights(hidden_size, attn_size, config.forget_bias, seed=seed)
    with tf.device(POLICY_DEVICE):
        optimizer = keras.optimizers.Adam(config.learning_rate, global_clipnorm=config.grad_clip)
        optimizer.build(list(weights.trainable_variables))
    t0 = time.perf_counter()
    tasks: list[_Task] = []
    skipped: dict[str, str] = {}
    for i, item in enumerate(corpus):
        try:
            t = _task(item, weights, optimizer, config, seed + i, split_groups)
        except PlacerError as e:
            skipped[item.name] = str(e).splitlines()[0]
            log.warning("pretrain: skipping %s: %s", item.name, e)
            continue
        if t is None:
            skipped[item.name] = "nothing to place (one device per group) or no baseline fits"
            continue
        tasks.append(t)
        log.info("pretrain: %s: %d ops, %d groups, best baseline %.4g s", item.name, t.problem.graph.num_ops,
                 t.problem.grouping.num_groups, t.best_baseline_s)
    if not tasks:
        first = next(iter(skipped.items()), None)
        raise SearchError("pretrain: no problem of the corpus could be built"
                          + (f" ({first[0]}: {first[1]})" if first else ""))
    build_wall = time.perf_counter() - t0
    teacher_wall = _teach(tasks, teacher_seconds, seed, progress) if teacher_seconds > 0 else 0.0
    t0 = time.perf_counter()
    # Ctrl-C or SIGTERM while training ends it after the current step and saves the policy trained so far (it was
    # all lost), marked "stop_reason": "interrupted" in policy.json; `--init DIR` trains on from it
    with DeferredInterrupt() as interrupt:
        rounds, imitation_rounds = _train(tasks, config, budget_seconds, imitation_share, progress, t0, interrupt)
    train_wall = time.perf_counter() - t0
    per = {}
    for t in tasks:
        per[t.item.name] = {"ops": int(t.problem.graph.num_ops), "groups": int(t.problem.grouping.num_groups),
                            "best_baseline_s": t.best_baseline_s,
                            **({"teacher_s": t.teacher_s} if teacher_seconds > 0 else {}),
                            "best_sample_s": None if not np.isfinite(t.best_sample_s) else t.best_sample_s,
                            "greedy_over_best_baseline": _greedy_ratio(t), "updates": t.updates}
        t.problem.close()
    info = {"corpus": corpus_name, "problems": [t.item.name for t in tasks], "skipped": skipped,
            "held_out_families": list(HELD_OUT), "budget_s": float(budget_seconds), "train_wall_s": train_wall,
            "build_wall_s": build_wall, **({"teacher_seconds": float(teacher_seconds),
                                            "teacher_wall_s": teacher_wall} if teacher_seconds > 0 else {}),
            "imitation_rounds": imitation_rounds, "rounds": rounds,
            "updates": int(sum(t.updates for t in tasks)), "config": asdict(config), "per_problem": per,
            "imitation_share": float(imitation_share), **({"init": init_info} if init_info else {}),
            **({"split_groups": split_groups} if split_groups else {}),
            **({"stop_reason": "interrupted"} if interrupt.pending else {}),
            "date": started.strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.machine()}, Python {platform.python_version()}"}
    weights.save(out_dir, info=info)
    if interrupt.pending:
        raise Interrupted(interrupt.signum)
    return info


def _train(tasks: list[_Task], config, budget_seconds: float, imitation_share: float, progress: bool, t0: float,
           interrupt) -> tuple[int, int]:
    """`pretrain`'s training from `t0` for `budget_seconds`, until `interrupt.pending`: (rounds, imitation rounds)."""
    from placer.rl.reinforce import reinforce_update

    rounds = imitation_rounds = 0
    # phase 1: imitate each problem's target (its best grouped baseline, or the teacher's placement), problems in turn
    while time.perf_counter() - t0 < imitation_share * budget_seconds and not interrupt.pending:
        probs = [t.agent.imitate(t.target, max_steps=3, target_prob=0.95)["imitation_prob"]
                 for t in tasks if t.target is not None]
        imitation_rounds += 1
        if progress:
            print(f"pretrain: imitation round {imitation_rounds}: mean per-group prob {np.mean(probs):.3f}", flush=True)
        if probs and min(probs) >= 0.95:
            break
    # phase 2: REINFORCE with elite steps, problems in turn
    last = time.perf_counter()
    while time.perf_counter() - t0 < budget_seconds and not interrupt.pending:
        rounds += 1
        ratios = []
        for t in tasks:
            if time.perf_counter() - t0 >= budget_seconds or interrupt.pending:
                break
            p = t.problem
            upd = reinforce_update(t.agent, p.grouping, p.simulator, p.cluster.cpu_index, t.fail_s, t.capacity)
            t.updates += 1
            ok = ~upd.failed & np.isfinite(upd.step_times)
            if ok.any():
                k = int(np.argmin(np.where(ok, upd.step_times, np.inf)))
                s = float(upd.step_times[k])
                t.best_sample_s = min(t.best_sample_s, s)
                if s < t.target_s:
                    t.target_s, t.target = s, upd.group_devices[k].copy()
                ratios.append(s / t.best_baseline_s)
            if t.target is not None and config.elite_steps > 0:
                t.agent.imitate(t.target, max_steps=2)
        if progress and ratios and time.perf_counter() - last >= 30:
            last = time.perf_counter()
            print(f"pretrain: round {rounds}: best sample / best baseline, median {np.median(ratios):.3f}, "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
    return rounds, imitation_rounds


__all__ = ["CorpusItem", "HELD_OUT", "default_corpus", "existing_policy", "parallel_corpus", "pretrain",
           "quick_corpus", "wide_corpus"]
