"""The turn-by-turn ratios of interleaved harness runs, from their JSON.

    python -m benchmarks.paired benchmarks/results-2026-12-04-fit-runAL.json [...]

For each file, case and peer: the reference peer's time ÷ the peer's, each round's
``i``-th repetition against the other's (``benchmarks.run --interleave`` ran them one
after the other), their median and its distribution-free 95% interval
(:func:`benchmarks.common.median_ci`): the column ``benchmarks.run`` adds to its tables
since 2026-12-04, computed here for runs recorded before it as well. A file whose peers
did not take turns (no ``interleaved`` results) has no pairs and prints nothing for them.
"""

from __future__ import annotations

import argparse
import collections
import json
from typing import Dict, List, Tuple

from benchmarks import common
from benchmarks.workloads import by_name


def pairs(results: List[Dict]) -> Dict[Tuple[str, str], Dict[str, List[float]]]:
    """``{(workload, case): {peer: ratios}}``: the reference ÷ each peer, turn by turn."""
    rounds: Dict = collections.defaultdict(lambda: collections.defaultdict(dict))
    for r in results:
        if r.get("interleaved") and "values" in r:
            rounds[(r["workload"], r["case"])][r["peer"]][r.get("round", 0)] = r["values"]
    out: Dict = {}
    for (workload, case), peers in rounds.items():
        ref = peers.get(by_name()[workload].reference)
        if ref is None:
            continue
        numbers = sorted(ref)
        out[(workload, case)] = {
            peer: common.paired_ratios([ref[i] for i in numbers], [got.get(i) for i in numbers])
            for peer, got in peers.items()
            if got is not ref
        }
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", nargs="+", help="benchmarks.run --json files")
    args = parser.parse_args(argv)
    for path in args.json:
        with open(path) as f:
            results = json.load(f)
        results = results["results"] if isinstance(results, dict) else results
        print(path)
        for (workload, case), peers in pairs(results).items():
            reference = by_name()[workload].reference
            print(f"  {case}: {reference} ÷ peer, turn by turn: median [95% CI] (pairs)")
            for peer, ratios in peers.items():
                if ratios:
                    print(f"    {peer:26s} {common.median_ci_text(ratios)}")


if __name__ == "__main__":
    main()
