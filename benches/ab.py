#!/usr/bin/env python3
"""Compares engine bench binaries (or settings of one) in alternating runs.

Each round runs every variant once, one after the other, so that all of
them see the same machine; a shape's phases then get, for each variant,
the median time and peak RSS of its runs, and for each variant after the
first, the median of the rounds' ratios to the first (with their range
and how many rounds it was faster in).

    cargo bench --bench engine --no-run   # prints the binary's path
    cp target/release/deps/engine-<hash> /tmp/engine-before
    # ... change, build again ...
    python3 benches/ab.py --shape c100kx1 --rounds 8 \\
        before=/tmp/engine-before after=target/release/deps/engine-<hash>
    python3 benches/ab.py --shape c10kx10 --last-phase first \\
        default=/tmp/engine 'one-shard=/tmp/engine WEIR_BENCH_SHARDS=1'

A variant is `NAME=BINARY [VAR=VALUE ...]`: environment settings after the
binary apply to that variant alone. Runs print `SAMPLE shape phase secs
rss_mb` lines (`WEIR_BENCH_CHILD`, see `benches/engine.rs`); `--raw FILE`
keeps them, prefixed by the variant's name.
"""

import argparse
import os
import shlex
import statistics
import subprocess
import sys
from collections import defaultdict


def parse_variant(spec):
    name, _, rest = spec.partition("=")
    words = shlex.split(rest)
    if not name or not words:
        sys.exit(f"ab.py: a variant is NAME=BINARY [VAR=VALUE ...], not {spec!r}")
    binary = words[0]
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        sys.exit(f"ab.py: variant {name}: {binary} is not an executable file")
    env = {}
    for word in words[1:]:
        var, eq, value = word.partition("=")
        if not eq:
            sys.exit(f"ab.py: variant {name}: {word!r} is not VAR=VALUE")
        env[var] = value
    return name, binary, env


def run_once(binary, env, shape, last_phase):
    child_env = dict(os.environ, **env, WEIR_BENCH_CHILD=shape)
    if last_phase:
        child_env["WEIR_BENCH_LAST_PHASE"] = last_phase
    out = subprocess.run(
        [binary, "--bench"], env=child_env, capture_output=True, text=True, check=False
    )
    samples = []
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0] == "SAMPLE":
            samples.append((parts[2], float(parts[3]), float(parts[4])))
    if not samples:
        sys.exit(f"ab.py: {binary} printed no SAMPLE line (exit {out.returncode}):\n{out.stderr}")
    return samples


def report(names, results):
    first = names[0]
    phases = list(dict.fromkeys(p for runs in results[first] for p, _, _ in runs))
    for phase in phases:
        by_name = {
            n: [(s, r) for runs in results[n] for p, s, r in runs if p == phase] for n in names
        }
        cells = [
            f"{n} {statistics.median(s for s, _ in v):.3f} s {statistics.median(r for _, r in v):.0f} MB"
            for n, v in by_name.items()
        ]
        print(f"{phase:>12}: " + ", ".join(cells))
        base = by_name[first]
        for n in names[1:]:
            ratios = [s / b for (s, _), (b, _) in zip(by_name[n], base)]
            faster = sum(1 for r in ratios if r < 1)
            print(
                f"{'':>12}  {n} / {first}: {statistics.median(ratios):.3f} "
                f"({min(ratios):.2f}-{max(ratios):.2f}), faster in {faster} of {len(ratios)}"
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variants", nargs="+", help="NAME=BINARY [VAR=VALUE ...]")
    parser.add_argument("--shape", default="c100kx1")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--last-phase", help="stop each run after this phase")
    parser.add_argument("--raw", help="append every SAMPLE line to this file")
    args = parser.parse_args()
    variants = [parse_variant(v) for v in args.variants]
    names = [n for n, _, _ in variants]
    if len(set(names)) != len(names):
        sys.exit("ab.py: two variants share a name")
    results = defaultdict(list)
    with open(args.raw or os.devnull, "a", encoding="utf-8") as raw:
        for _ in range(args.rounds):
            for name, binary, env in variants:
                samples = run_once(binary, env, args.shape, args.last_phase)
                results[name].append(samples)
                for phase, secs, rss in samples:
                    raw.write(f"{name} SAMPLE {args.shape} {phase} {secs} {rss}\n")
    print(f"{args.shape}, {args.rounds} rounds")
    report(names, results)


if __name__ == "__main__":
    main()
