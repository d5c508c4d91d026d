"""The library surface: `place()` on top of the house (load → `build_problem` → evaluator → `search`).

    import placer
    result = placer.place(model_or_graph, cluster="4xK80", budget_seconds=60)
    result.placement.save("placement.json")
"""
from __future__ import annotations

from placer.errors import PlacerError, taking_back_empty_dirs
from placer.graphs.opgraph import OpGraph
from placer.placement import (BUILTIN_PLACEMENTS, DeviceFunction, Placement, random_placement,  # noqa: F401
                              round_robin_placement, single_placement)
from placer.problem import build_problem, resolve_placement  # noqa: F401
from placer.search import SearchResult, new_run_dir, search
from placer.search import replace as _replace

__all__ = ["place", "replace", "Placement", "SearchResult", "resolve_placement"]


@taking_back_empty_dirs()
def place(graph, *, cluster=None, devices=None, reward: str = "sim", budget_seconds: float = 300,
          seed: int = 0, workers=None, costs=None, max_groups: int | None = None, out_dir=None,
          progress: bool = False, batch_size: int | None = None, fetches=None, max_updates: int | None = None,
          token_file: str | None = None, config=None, allow_cpu: bool = False, policy=None,
          samples: int | None = None, sample_seconds: float | None = None,
          refine_seconds: float | None = None, refine_moves: int | None = None,
          tls_ca: str | None = None) -> SearchResult:
    """Learn a placement for `graph` (an OpGraph, tf.Graph, GraphDef, MetaGraphDef, path, tf.function
    concrete function or compiled Keras model).

    cluster: simulated hardware ("4xK80", a Cluster, a JSON path); devices: real devices ("cpu:2",
    ["/GPU:0", "/GPU:1"], a tasks file). reward "sim" scores placements with the simulator, "measure" runs them
    (locally, on a TF cluster's tasks, or on `workers` "host:port" addresses; `token_file` and `tls_ca`, the
    certificate of workers started with TLS, as `placer search`'s flags). With `workers`, `devices` are the
    workers' devices: the simulated cluster is built from what they report, never from this machine's TensorFlow.
    Returns a SearchResult whose `.placement` saves to placement.json.

    policy: a pretrained portable policy (`placer pretrain`'s directory, "default" for the shipped one, or
    `PortableWeights`): the search starts from its zero-shot answer (the best of the placements it samples, in
    batches of `samples` (default 64) for `sample_seconds`, default `placer.search.PLACE_SAMPLE_SECONDS`; 0: one batch;
    then local moves from that best for `refine_seconds`, default `PLACE_REFINE_SECONDS`, 0: none, or until
    `refine_moves` of them, default `PLACE_REFINE_MOVES`, 0: no limit, whichever ends first;
    `.extra["zero_shot"]`) instead of imitating a baseline, then fine-tunes for `budget_seconds` after that answer;
    with `budget_seconds=0` that answer is all (seconds).
    """
    if budget_seconds == 0 and policy is None:
        raise PlacerError("budget_seconds=0 places with a pretrained policy only: give policy= (e.g. 'default')")
    if (cluster is None) == (devices is None):
        raise PlacerError("place() needs exactly one of cluster= (simulated hardware) or devices= (real devices)")
    if reward == "measure" and devices is None and not workers:
        raise PlacerError("reward='measure' needs real devices: devices=... (local) or workers=[...]")
    if workers and reward != "measure":     # they would be silently ignored
        raise PlacerError(f"workers={workers!r} measure placements on remote hosts: give reward='measure' "
                          f"(reward={reward!r} does not use them)")
    zero_shot = {"samples": samples, "sample_seconds": sample_seconds, "refine_seconds": refine_seconds,
                 "refine_moves": refine_moves}
    if policy is None and any(v is not None for v in zero_shot.values()):     # they would be silently unused
        name = next(k for k, v in zero_shot.items() if v is not None)
        raise PlacerError(f"{name}={zero_shot[name]!r} sets how a pretrained policy places: give policy= "
                          "(e.g. 'default')")
    if isinstance(graph, OpGraph) and (fetches or batch_size is not None):
        raise PlacerError("fetches= and batch_size= apply when place() imports the graph, not to an OpGraph "
                          "(already imported: pass them to placer.graphs.load)")
    from placer.runtime import no_auth_without_workers, workers_problem_target

    no_auth_without_workers(workers, token_file=token_file, tls_ca=tls_ca)
    if out_dir is not None:
        new_run_dir(out_dir)       # now, not after the search: a bad or used directory never costs the budget
    from placer._tf import hide_gpus

    hide_gpus()        # this process's TF stays off the GPUs the measured graphs need
    if isinstance(graph, OpGraph):
        og = graph
    else:
        from placer.graphs import load

        og = load(graph, fetches=fetches, batch_size=batch_size)
    measured_on = devices          # what the evaluator measures on (a tasks file, local or the workers' devices)
    cluster, devices = workers_problem_target(og, cluster, devices, workers=workers, token_file=token_file,
                                              tls_ca=tls_ca)
    problem = build_problem(og, cluster, devices=devices, costs=costs, max_groups=max_groups, seed=seed,
                            allow_cpu=allow_cpu)
    evaluator = None
    try:
        if reward == "measure":
            from placer.runtime import make_evaluator

            evaluator = make_evaluator(og, measured_on if measured_on is not None else problem.device_names,
                                       workers=workers, token_file=token_file, tls_ca=tls_ca)
        if policy is not None:
            from dataclasses import replace as dc_replace

            from placer.rl.reinforce import ReinforceConfig

            from placer.search import place_settings

            config = dc_replace(config or ReinforceConfig(seed=seed),
                                **place_settings(ReinforceConfig().zero_shot_samples if samples is None else samples,
                                                 sample_seconds, refine_seconds, refine_moves))
            if budget_seconds == 0:
                budget_seconds, max_updates = 1.0, 0
        return search(problem, evaluator, reward=reward, budget_seconds=budget_seconds, seed=seed, config=config,
                      out_dir=out_dir, progress=progress, max_updates=max_updates, policy=policy)
    finally:
        if evaluator is not None:
            evaluator.close()
        problem.close()


@taking_back_empty_dirs()
def replace(result_or_run_dir, exclude, *, budget_seconds: float = 60, out_dir=None, seed: int | None = None,
            progress: bool = False, max_updates: int | None = None) -> SearchResult:
    """Re-place a search's graph onto the devices left after losing `exclude` (names like "/GPU:3"): a quick
    answer first (`.extra["quick_s"]`), then `budget_seconds` of search from the run's own policy.
    `result_or_run_dir`: the directory a search wrote (`place(..., out_dir=DIR)`, `placer search --out DIR`) or
    the SearchResult of a search (one without a directory re-places from `result.run`, in memory; a re-placed
    result can be re-placed again). See `placer.search.replace`."""
    if out_dir is not None:
        new_run_dir(out_dir)
    from placer._tf import hide_gpus

    hide_gpus()
    return _replace(result_or_run_dir, exclude, budget_seconds=budget_seconds, out_dir=out_dir, seed=seed,
                    progress=progress, max_updates=max_updates)
