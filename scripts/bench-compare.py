#!/usr/bin/env python3
"""Compare the agent's criterion benchmarks between two commits, interleaved on one machine.

A change that should not move the agent's figures (a restructuring) has to show it (CONTRIBUTING.md,
"Benchmarks"). Two `make bench` runs hours apart differ by more than most changes do: the machine's
load, its CPU frequency and the page cache move the medians by 10-20 %. This script measures both
commits in the same minutes instead: it checks each commit out into a git worktree, builds the
bench once per commit, then runs the benches in rounds, BASE then HEAD in each round, and prints
one markdown table with every round's median per benchmark, the spread between rounds (the noise
on this machine, in %) and the change of HEAD's median over BASE's (in %). A change smaller than
the larger spread is noise.

Worktrees and cargo target dirs live under `.cache/bench-compare/` (git-ignored): the worktrees are
removed on every exit path, the target dirs are kept so a second comparison does not rebuild the
dependencies (one target dir per commit, a few GB each; delete the folder to reclaim them).
Each round gets a fresh CRITERION_HOME, so criterion compares nothing across rounds or commits.
Only commits are measured: uncommitted changes in this checkout are not (commit them first).

Exit status: 0 with the table printed; 1 if a commit does not resolve, a build fails or a run
prints no criterion figure (its output is printed); 2 on bad arguments.
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

# A criterion result: `<group>/<id>` at the start of a line, then (on the same line or the next)
# `time:   [<low> <unit> <median> <unit> <high> <unit>]`.
NAME_RE = re.compile(r"^(\S+/\S+)")
TIME_RE = re.compile(r"time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]")
UNIT_SECONDS = {"ps": 1e-12, "ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_medians(output):
    """Criterion's text output -> [(benchmark, median in seconds)], in the order printed."""
    out, name = [], None
    for line in output.splitlines():
        m = NAME_RE.match(line)
        if m and not line.startswith(("Benchmarking", "Found", "Warning")):
            name = m.group(1)
        t = TIME_RE.search(line)
        if t and name:
            out.append((name, float(t.group(1)) * UNIT_SECONDS[t.group(2)]))
            name = None
    return out


def fmt_time(seconds):
    """Seconds as criterion prints them: three significant digits in ns, µs, ms or s."""
    for unit, scale in (("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3)):
        if seconds < scale * 1000:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds:.3g} s"


def spread(values):
    """(max - min) / min of one commit's medians across rounds, in %."""
    return (max(values) - min(values)) / min(values) * 100


def table(base, head, names, medians):
    """The markdown table: one row per benchmark in `names`; `medians[(commit, name)]` lists each
    round's median in seconds."""
    rows = [
        f"| benchmark | {base} (each round) | {head} (each round) | spread {base} / {head} | change |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        b, h = medians.get((base, name), []), medians.get((head, name), [])
        if not b or not h:
            rows.append(f"| {name} | {' / '.join(map(fmt_time, b)) or 'absent'} | "
                        f"{' / '.join(map(fmt_time, h)) or 'absent'} | | |")
            continue
        change = (statistics.median(h) / statistics.median(b) - 1) * 100
        rows.append(
            f"| {name} | {' / '.join(map(fmt_time, b))} | {' / '.join(map(fmt_time, h))} | "
            f"{spread(b):.0f} % / {spread(h):.0f} % | {change:+.1f} % |"
        )
    return "\n".join(rows)


def git(*args, cwd=None):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def resolve(rev):
    """A revision -> its full commit id; exits 1 naming the revision if git does not know it."""
    try:
        return git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        sys.exit(f"bench-compare: {rev!r} is not a commit of this repository")


def cargo_bench(tree, target, args, env_extra=None, capture=False):
    cargo = os.environ.get("CARGO", "cargo")
    env = dict(os.environ, CARGO_TARGET_DIR=target, **(env_extra or {}))
    cmd = [cargo, "bench", "-p", "aether-agent-reconciler", *args]
    return subprocess.run(cmd, cwd=tree, env=env, capture_output=capture, text=True)


def main():
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: scripts/bench-compare.py main~5 HEAD --rounds 3 --filter 'agent_(full_build|pod_change)'",
    )
    p.add_argument("base", help="the commit measured first in each round (e.g. main, a sha)")
    p.add_argument("head", nargs="?", default="HEAD", help="the commit compared with it (default: HEAD)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of BASE then HEAD (default: 2; at least 1)")
    p.add_argument("--bench", default="scale",
                   help="the criterion bench target of aether-agent-reconciler (default: scale)")
    p.add_argument("--filter", default="agent_(full_build|policy_change|pod_change)",
                   help="criterion's filter, a regex over `group/id` (default: the agent's own path)")
    opts = p.parse_args()
    if opts.rounds < 1:
        p.error(f"--rounds must be at least 1, got {opts.rounds}")

    top = git("rev-parse", "--show-toplevel")
    work = os.path.join(top, ".cache", "bench-compare")
    os.makedirs(work, exist_ok=True)
    commits = {}
    for rev in (opts.base, opts.head):
        commits[rev] = resolve(rev)
    label = {rev: commits[rev][:12] for rev in commits}
    if label[opts.base] == label[opts.head]:
        sys.exit(f"bench-compare: {opts.base} and {opts.head} are the same commit ({label[opts.base]})")

    trees = {}
    try:
        for rev, sha in commits.items():
            tree = os.path.join(work, f"tree-{label[rev]}")
            if os.path.exists(tree):
                # Left by a run that was killed: a registered worktree, or a bare folder after a prune.
                subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=top, capture_output=True)
                shutil.rmtree(tree, ignore_errors=True)
                git("worktree", "prune", cwd=top)
            git("worktree", "add", "--detach", tree, sha, cwd=top)
            trees[rev] = tree
            print(f"bench-compare: building {rev} ({label[rev]}) in {tree}", file=sys.stderr, flush=True)
            built = cargo_bench(tree, os.path.join(work, f"target-{label[rev]}"), ["--bench", opts.bench, "--no-run"])
            if built.returncode != 0:
                sys.exit(f"bench-compare: building the {opts.bench} bench at {rev} failed (status {built.returncode})")

        medians, names = {}, []
        with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
            for r in range(1, opts.rounds + 1):
                for rev in (opts.base, opts.head):
                    print(f"bench-compare: round {r}/{opts.rounds}: {rev} ({label[rev]})", file=sys.stderr, flush=True)
                    env = {"CRITERION_HOME": os.path.join(tmp, f"criterion-{label[rev]}-{r}"),
                           "AETHER_BENCH_OUT": os.path.join(tmp, f"out-{label[rev]}-{r}")}
                    run = cargo_bench(trees[rev], os.path.join(work, f"target-{label[rev]}"),
                                      ["--bench", opts.bench, "--", "--noplot", opts.filter], env, capture=True)
                    found = parse_medians(run.stdout)
                    if run.returncode != 0 or not found:
                        print(run.stdout + run.stderr, file=sys.stderr)
                        sys.exit(f"bench-compare: {opts.bench} at {rev} (round {r}) exited {run.returncode} "
                                 f"with {len(found)} criterion figures for filter {opts.filter!r}")
                    for name, median in found:
                        if name not in names:
                            names.append(name)
                        medians.setdefault((label[rev], name), []).append(median)
        print(f"Medians of `cargo bench -p aether-agent-reconciler --bench {opts.bench} -- '{opts.filter}'`, "
              f"{opts.rounds} round(s) of {opts.base} ({label[opts.base]}) then {opts.head} ({label[opts.head]}):\n")
        print(table(label[opts.base], label[opts.head], names, medians))
    finally:
        for tree in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=top, capture_output=True)
        subprocess.run(["git", "worktree", "prune"], cwd=top, capture_output=True)


if __name__ == "__main__":
    main()
