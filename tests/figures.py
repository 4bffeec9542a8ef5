#!/usr/bin/env python3
"""Figures of docs/guarantees.md, from a run, stamped with the sources it ran on.

The tests that measure something (crash_injection, store_faults, clock, bad_input, fleet)
and fuzz/run.sh hand each figure to `record`, which appends one JSON line to
target/figures/<run>.jsonl (one file per test process) with the stamp of the sources.
`render` writes the Figures section of docs/guarantees.md (between the figures markers)
from the newest record of each figure; `check` fails when the committed section's stamp is
not the current sources' stamp. Counts may vary from run to run; the stamp may not.

    python3 tests/figures.py run [--fuzz SECONDS]  # run the figure tests, then render
    python3 tests/figures.py render [--print]      # write (or print) the section
    python3 tests/figures.py check                 # the section's stamp is the sources'
    python3 tests/figures.py stamp                 # print the current sources' stamp
    python3 tests/figures.py record --run ID       # (used by the tests) one JSON on stdin

The stamp (defined here only): SHA-256 over the files git tracks (or would track: untracked
files not ignored count too) under STAMPED, in path order, each as its path, a NUL, its
length in decimal, a NUL, then its bytes. Files listed but deleted from the working tree
are left out. Standard library only.
"""

import argparse
import datetime
import hashlib
import json
import os
import platform
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "guarantees.md")
BEGIN = "<!-- figures:begin -->"
END = "<!-- figures:end -->"

# What the stamp covers: the crates' sources, the tests and fuzz targets that produce the
# figures, and every Cargo.toml (git pathspecs, glob magic: `*` stays within a directory).
STAMPED = [
    ":(glob)src/**",
    ":(glob)macros/src/**",
    ":(glob)runtime/src/**",
    ":(glob)cli/src/**",
    ":(glob)tests/*.rs",
    ":(glob)tests/support/**",
    ":(glob)tests/figures/**",
    ":(glob)runtime/tests/**",
    ":(glob)fuzz/fuzz_targets/**",
    ":(glob)Cargo.toml",
    ":(glob)*/Cargo.toml",
]

# The figure tests, in the order the section shows them, and the figures each must have.
# A figure from fuzz/run.sh may be older than the sources (fuzzing needs nightly and
# minutes); it is then shown with its own stamp. Every other figure must be current.
REQUIRED = {
    "crash_injection": ["sqlite", "redis", "postgres"],
    "store_faults": [
        "redis server crash",
        "postgres server crash",
        "memory slow renewal",
        "redis slow renewal",
        "postgres slow renewal",
    ],
    "clock": [
        "redis",
        "postgres",
        "redis+worker-clock",
        "postgres+worker-clock",
        "sqlite",
        "sqlite+faketime",
    ],
    "fleet": ["sqlite", "redis", "postgres"],
    "bad_input": [],
    "fuzz": ["canonical_key", "decode_args"],
}
MAY_BE_OLDER = {"fuzz"}
CARGO_TESTS = ["crash_injection", "store_faults", "clock", "fleet", "bad_input"]


def target_dir():
    return os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")


def figures_dir():
    return os.path.join(target_dir(), "figures")


def stamp():
    """The SHA-256 of the stamped sources (see the module doc)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--"]
            + STAMPED,
            cwd=ROOT,
            check=True,
            capture_output=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"figures: the stamp needs a git checkout: {e}")
    paths = sorted(set(p for p in out.decode("utf-8").split("\0") if p))
    h = hashlib.sha256()
    for path in paths:
        full = os.path.join(ROOT, path)
        if not os.path.isfile(full):
            continue
        with open(full, "rb") as f:
            data = f.read()
        h.update(path.encode("utf-8") + b"\0" + str(len(data)).encode() + b"\0")
        h.update(data)
    return h.hexdigest()


def record(run_id):
    if not re.fullmatch(r"[A-Za-z0-9._-]+", run_id):
        sys.exit(f"figures: bad run id {run_id!r}")
    rec = json.loads(sys.stdin.read())
    for field in ("test", "figure", "line"):
        if not isinstance(rec.get(field), str):
            sys.exit(f"figures: a record needs a string {field!r}: {rec!r}")
    rec.setdefault("values", {})
    rec["stamp"] = stamp()
    rec["run"] = run_id
    rec["at"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    os.makedirs(figures_dir(), exist_ok=True)
    with open(os.path.join(figures_dir(), run_id + ".jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(rec, sort_keys=True) + "\n")


def load():
    """Every record under target/figures/, oldest first."""
    records = []
    d = figures_dir()
    if os.path.isdir(d):
        for name in sorted(os.listdir(d)):
            if not name.endswith(".jsonl"):
                continue
            with open(os.path.join(d, name), encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        sys.exit(f"figures: {name}:{n}: {e}")
    records.sort(key=lambda r: r.get("at", ""))
    return records


def newest(records, current):
    """(test, figure) -> the newest record; current-stamp records win over older ones."""
    best = {}
    for r in records:
        k = (r["test"], r["figure"])
        prev = best.get(k)
        r_cur, p_cur = r["stamp"] == current, prev is not None and prev["stamp"] == current
        if prev is None or r_cur or not p_cur:
            best[k] = r
    return best


def section(current):
    best = newest(load(), current)
    problems = []
    for test, figures in REQUIRED.items():
        for fig in figures:
            r = best.get((test, fig))
            if r is None:
                problems.append(f"{test}/{fig}: no record")
            elif r["stamp"] != current and test not in MAY_BE_OLDER:
                problems.append(f"{test}/{fig}: recorded on other sources ({r['stamp'][:12]})")
    if not any(t == "bad_input" and r["stamp"] == current for (t, _), r in best.items()):
        problems.append("bad_input: no record")
    if problems:
        sys.exit(
            "figures: cannot render, run `python3 tests/figures.py run` with every backend up:\n  "
            + "\n  ".join(problems)
        )

    def rec(test, fig):
        return best[(test, fig)]

    current_runs = [r for r in best.values() if r["stamp"] == current]
    first = min(r["at"] for r in current_runs)
    last = max(r["at"] for r in current_runs)
    out = [
        BEGIN,
        "",
        f"Sources stamp: `{current}`",
        "",
        "(`python3 tests/figures.py stamp`; what it covers is defined in `tests/figures.py`.)",
        "Rendered by `python3 tests/figures.py render` from the records the tests wrote between",
        f"{first[:19]}Z and {last[:19]}Z on {os.cpu_count()} cores ({platform.system()}",
        f"{platform.machine()}, debug build); every line below is a test's own record.",
        "",
    ]

    # Crash injection.
    out += [
        "**Crash injection** (`tests/crash_injection.rs`; `TC_CRASH_SEED` replays a run,",
        "`TC_CRASH_KILLS` changes the count):",
        "",
        "| store | kills survived | intents | effects in the ledger | unknown by design (plain, no `verify`) | reconciled by the recovery pass | duplicates seen |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {"sqlite": "SQLite", "redis": "Redis", "postgres": "PostgreSQL", "memory": "MemoryStore"}
    for fig in REQUIRED["crash_injection"]:
        v = rec("crash_injection", fig)["values"]
        out.append(
            f"| {names[fig]} | {v['kills']} | {v['intents']} | {v['effects']} | {v['unknown']} "
            f"| {v['reconciled']} | **{v['duplicates']}** |"
        )
    out += ["", "```text"]
    out += [rec("crash_injection", f)["line"] for f in REQUIRED["crash_injection"]]
    out += ["```", ""]

    # Store faults.
    out += ["**Store faults** (`tests/store_faults.rs`; private servers):", "", "```text"]
    out += [rec("store_faults", f)["line"] for f in REQUIRED["store_faults"]]
    out += ["```", ""]

    # Clocks.
    out += [
        "**Clocks** (`tests/clock.rs`; worker B in its own process under `faketime -f +1h`):",
        "",
        "```text",
    ]
    out += [rec("clock", f)["line"] for f in REQUIRED["clock"]]
    out += ["```", ""]

    # Fleet.
    out += ["**Fleet** (`tests/fleet.rs`; 4 OS processes × 200 intents):", "", "```text"]
    out += [rec("fleet", f)["line"] for f in REQUIRED["fleet"]]
    out += ["```", ""]

    # Bad input.
    bad = sorted(
        (fig, r) for (t, fig), r in best.items() if t == "bad_input" and r["stamp"] == current
    )
    out += [
        f"**Bad input** (`tests/bad_input.rs`): {len(bad)} tests of hostile input passed on these "
        "sources (each test's name says what it pins; the file records passes, not inputs):",
        "",
        "```text",
    ]
    out += [r["line"] for _, r in bad]
    out += ["```", ""]

    # Fuzz.
    out += ["**Fuzzing** (`fuzz/run.sh`, libFuzzer):", "", "```text"]
    for fig in REQUIRED["fuzz"]:
        r = rec("fuzz", fig)
        note = "" if r["stamp"] == current else f"  (older sources {r['stamp'][:12]}, {r['at'][:10]})"
        out.append(r["line"] + note)
    out += ["```", ""]

    # Totals.
    kills = sum(rec("crash_injection", f)["values"]["kills"] for f in REQUIRED["crash_injection"])
    crashes = sum(
        rec("store_faults", f)["values"].get("server_crashes", 0) for f in REQUIRED["store_faults"]
    )
    dups = sum(
        rec(t, f)["values"].get("duplicates", 0)
        for t in ("crash_injection", "store_faults", "fleet")
        for f in REQUIRED[t]
    )
    out += [
        f"Totals of these records: {kills} SIGKILLs and {crashes} store-server crashes survived, "
        f"{dups} duplicate effects.",
        "",
        END,
    ]
    return "\n".join(out)


def render(to_stdout):
    text = section(stamp())
    if to_stdout:
        print(text)
        return
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    if doc.count(BEGIN) != 1 or doc.count(END) != 1:
        sys.exit(f"figures: {DOC} needs exactly one {BEGIN} and one {END}")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(DOC, "w", encoding="utf-8") as f:
        f.write(head + text + tail)
    print(f"figures: rendered into {os.path.relpath(DOC, ROOT)}")


def check():
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    m = re.search(re.escape(BEGIN) + r".*?Sources stamp: `([0-9a-f]{64})`", doc, re.S)
    if not m:
        sys.exit(f"figures: no stamped Figures section in {DOC}")
    committed, current = m.group(1), stamp()
    if committed != current:
        sys.exit(
            f"figures: docs/guarantees.md's figures were rendered on sources {committed[:12]}, "
            f"the sources are now {current[:12]}: run `python3 tests/figures.py run` (backends "
            "up) and commit the rendered section"
        )
    print(f"figures: the Figures section is stamped with the current sources ({current[:12]})")


def run(fuzz_seconds):
    env = dict(os.environ)
    # The integration tests are the workspace member tool-contracts-tests (tests/Cargo.toml),
    # which fixes the facade's features itself (every store and `mcp`).
    cmd = ["cargo", "test", "-p", "tool-contracts-tests"]
    for t in CARGO_TESTS:
        cmd += ["--test", t]
    print("figures: " + " ".join(cmd), flush=True)
    if subprocess.run(cmd, cwd=ROOT, env=env).returncode != 0:
        sys.exit("figures: a figure test failed; nothing rendered")
    if fuzz_seconds:
        if subprocess.run(["bash", "fuzz/run.sh", str(fuzz_seconds)], cwd=ROOT).returncode != 0:
            sys.exit("figures: fuzzing failed; nothing rendered")
    render(False)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("stamp")
    r = sub.add_parser("record")
    r.add_argument("--run", required=True)
    rd = sub.add_parser("render")
    rd.add_argument("--print", action="store_true", help="print the section instead of writing it")
    sub.add_parser("check")
    rn = sub.add_parser("run")
    rn.add_argument("--fuzz", type=int, default=0, metavar="SECONDS", help="also fuzz each target")
    a = p.parse_args()
    if a.cmd == "stamp":
        print(stamp())
    elif a.cmd == "record":
        record(a.run)
    elif a.cmd == "render":
        render(a.print)
    elif a.cmd == "check":
        check()
    elif a.cmd == "run":
        run(a.fuzz)


if __name__ == "__main__":
    main()
