"""benchmarks/bench_wall.py --table: the published equal-wall table is computed from the records as it says."""
import json

import pytest


@pytest.fixture(scope="module")
def bench_wall(benchmark_script):
    return benchmark_script("bench_wall")


def _rec(tag, method, seed, best, evals=100, model="nmt", cluster="4xK80"):
    return {"bench": "wall", "model": model, "cluster": cluster, "tag": tag, "method": method, "seed": seed,
            "best_s": best, "evaluations": evals}


def test_table_joins_tags_filters_methods_and_gives_the_gap_of_the_means(bench_wall, tmp_path):
    recs = [_rec("a", "anneal", 0, 1.0), _rec("a", "local", 0, 1.3), _rec("a", "other", 0, 9.0),
            _rec("b", "anneal", 1, 3.0), _rec("b", "local", 1, 2.7),
            _rec("c", "anneal", 2, 100.0), _rec("c", "local", 2, 1.0)]          # tag c is not asked for
    path = tmp_path / "wall.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))

    out = bench_wall.table("a,b", path=path, methods=["local"])
    lines = out.splitlines()
    assert "other" not in out and len(lines) == 3                    # header, rule, one cell
    cols = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cols[:3] == ["nmt", "4xK80", "0,1"]
    assert cols[3] == "2.0000 (1.000-3.000)"                         # annealing's mean over seeds 0 and 1
    assert cols[4] == "2.0000 (1.300-2.700)"
    assert cols[5] == "equal"                                        # mean 2.0 against 2.0 (not the mean of +30%, -10%)

    one = bench_wall.table("a", path=path, methods=["local"]).splitlines()[2]
    assert "30.0% slower" in one
    # a cell the method did not run: its columns are "-" (not "nan% faster")
    path.write_text("".join(json.dumps(r) + "\n" for r in recs + [_rec("a", "anneal", 0, 1.0, model="rnnlm")]))
    row = bench_wall.table("a", path=path, methods=["local"]).splitlines()[3]
    cols = [c.strip() for c in row.strip("|").split("|")]
    assert cols[0] == "rnnlm" and cols[4:6] == ["-", "-"] and cols[6] == "100 / -"
    # --cells keeps only the cells named
    only = bench_wall.table("a", path=path, methods=["local"], cells=["rnnlm:4xK80"]).splitlines()
    assert len(only) == 3 and only[2].startswith("| rnnlm | 4xK80 |")
    # a precision other than fp32 is part of the cluster column (and of --cells' names)
    path.write_text(json.dumps(dict(_rec("a", "anneal", 0, 1.0, model="clip", cluster="DGX1"), precision="fp16"))
                    + "\n")
    row = bench_wall.table("a", path=path, cells=["clip:DGX1:fp16"]).splitlines()[2]
    assert row.startswith("| clip | DGX1:fp16 |")


def test_paired_gap_is_the_mean_per_seed_gap_with_a_t_interval(bench_wall, tmp_path):
    from scipy import stats

    assert bench_wall.paired_gap([(1.1, 1.0)]) is None                 # one seed: no interval
    mean, lo, hi = bench_wall.paired_gap([(1.3, 1.0), (2.7, 3.0), (1.0, 1.0)])
    g = [0.3, -0.1, 0.0]
    sd = (sum((x - sum(g) / 3) ** 2 for x in g) / 2) ** 0.5
    half = stats.t.ppf(0.975, 2) * sd / 3 ** 0.5
    assert mean == pytest.approx(sum(g) / 3) and (lo, hi) == pytest.approx((mean - half, mean + half))
    # identical gaps: a zero-width interval; the table's last column prints it, "-" with one seed
    assert bench_wall.paired_gap([(1.02, 1.0), (2.04, 2.0)]) == pytest.approx((0.02, 0.02, 0.02))
    recs = [_rec("a", "anneal", 0, 1.0), _rec("a", "local", 0, 1.02), _rec("a", "anneal", 1, 2.0),
            _rec("a", "local", 1, 2.04), _rec("a", "anneal", 0, 1.0, model="rnnlm"),
            _rec("a", "local", 0, 0.9, model="rnnlm")]
    path = tmp_path / "wall.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    lines = bench_wall.table("a", path=path).splitlines()
    assert lines[0].endswith("| local: per-seed gap (95% CI) |")
    assert lines[2].endswith("| +2.0% (+2.0% to +2.0%) |") and lines[3].endswith("| - |")
    # --pool: the methods of several tags counted as one against their annealing runs
    recs += [_rec("b", "anneal", 2, 1.0), _rec("b", "other", 2, 1.04)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    lines = bench_wall.table("a,b", path=path, cells=["nmt:4xK80"], pool="all").splitlines()
    assert lines[0].startswith("| model | cluster | seeds | anneal (s) | all (s) | all vs anneal |")
    assert lines[2].endswith("| +2.7% (-0.2% to +5.5%) |")         # gaps 2%, 2%, 4% over seeds 0, 1, 2
