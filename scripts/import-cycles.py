#!/usr/bin/env python3
"""Fail on an import circle between the modules of a Rust crate.

Usage: scripts/import-cycles.py [--graph] CRATE_SRC_DIR...

A module is a source file (`src/a.rs` or `src/a/mod.rs` is `a`, `src/a/b.rs` is `a::b`). An edge
A -> B is any path in A's product code (test modules, `#[cfg(test)]`, are left out) that names
`crate::b...`, `super::...`, `self::...` or a child module's name (`child::…`) and lands in B: `use` items, `pub use` re-exports (a
re-export does not hide the edge it makes) and paths written inline. A path resolves to the longest
module prefix it names; an item re-exported by the crate root (`lib.rs`/`main.rs`) resolves to the
module it comes from, and one re-exported from another crate is not an edge. The crate root itself
only declares modules, so it takes part in no edge.

Each strongly connected component of more than one module is a circle: it is printed with one
`file:line` per edge inside it and the exit status is 1. `--graph` also prints every edge, one
`from -> to` line each (the form the closing notes and ARCHITECTURE.md quote).

`--known PREFIX` (repeatable) tolerates one circle whose modules all start with `PREFIX` (e.g.
`xds::`, a layer being split): it is printed as known and does not fail the check; a `--known`
that matches no circle fails it, so the allowance is dropped together with the circle.
"""

import os
import re
import sys
from collections import defaultdict

PATH_RE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_RE = re.compile(r"\b(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.S)


def modules(src):
    """Map module path tuple -> file, for every .rs file under src (bin/ targets are crates of
    their own and are skipped)."""
    out = {}
    for dirpath, dirnames, files in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        parts = [] if rel == "." else rel.split(os.sep)
        if parts[:1] == ["bin"]:
            dirnames[:] = []
            continue
        for f in files:
            if not f.endswith(".rs"):
                continue
            name = f[:-3]
            if not parts and name in ("lib", "main"):
                out[()] = os.path.join(dirpath, f)
            elif name == "mod":
                out[tuple(parts)] = os.path.join(dirpath, f)
            else:
                out[tuple(parts + [name])] = os.path.join(dirpath, f)
    return out


def strip_tests(text):
    """Blank out `#[cfg(test)]` items (a `mod … { … }` block or a single item), keeping line
    numbers, and comments."""
    text = re.sub(r"//[^\n]*", lambda m: " " * len(m.group(0)), text)
    out = list(text)
    for m in re.finditer(r"#\[cfg\(test\)\]", text):
        i = m.end()
        depth, started = 0, False
        while i < len(text):
            c = text[i]
            if c == "{":
                depth += 1
                started = True
            elif c == "}":
                depth -= 1
                if started and depth == 0:
                    i += 1
                    break
            elif c == ";" and not started:
                i += 1
                break
            i += 1
        for j in range(m.start(), min(i, len(text))):
            if out[j] != "\n":
                out[j] = " "
    return "".join(out)


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e'] (renames and globs kept as paths)."""
    tree = re.sub(r"\s+", "", tree)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for c in s:
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            if c == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += c
        if cur:
            parts.append(cur)
        return parts

    def go(prefix, s):
        i = s.find("{")
        if i < 0:
            return [prefix + s.split("as")[0] if "::" in s or not prefix else prefix + s]
        head, body = s[:i], s[i + 1 : s.rfind("}")]
        res = []
        for p in split_top(body):
            res.extend(go(prefix + head, p))
        return res

    return [re.sub(r"\bas\b.*$", "", p) for p in go("", tree)]


def resolve(mods, here, kind, rest, root_exports):
    """The module a path lands in, or None (external, the root itself, or not a module path)."""
    segs = [s for s in rest.split("::") if s]
    if kind == "crate":
        base = ()
    elif kind == "self":
        base = here
    else:
        base = here
        for s in [kind] + segs:
            if s != "super":
                break
            base = base[:-1]
        segs = [s for s in segs if s != "super"]
    path = tuple(base)
    best = path if path in mods else None
    for s in segs:
        path = path + (s,)
        if path in mods:
            best = path
        else:
            break
    if best == () and segs:
        # an item of the crate root: follow its re-export, if it is one
        return root_exports.get(segs[0])
    return best


def root_reexports(mods, text):
    """name -> module for the crate root's `pub use module::…::name` items."""
    out = {}
    for m in USE_RE.finditer(strip_tests(text)):
        for p in expand_use(m.group(1)):
            segs = [s for s in p.split("::") if s]
            if not segs:
                continue
            if segs[0] == "crate":
                segs = segs[1:]
            path, best = (), None
            for s in segs[:-1]:
                path = path + (s,)
                if path in mods:
                    best = path
            if best is not None:
                out[segs[-1]] = best
    return out


def edges(src):
    mods = modules(src)
    root_text = open(mods[()]).read() if () in mods else ""
    exports = root_reexports(mods, root_text)
    graph = defaultdict(dict)
    for here, f in mods.items():
        if here == ():
            continue
        text = strip_tests(open(f).read())
        spots = []
        children = [m[-1] for m in mods if len(m) == len(here) + 1 and m[: len(here)] == here]
        for m in USE_RE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            for p in expand_use(m.group(1)):
                mm = re.match(r"(crate|super|self)((?:::[A-Za-z_*][A-Za-z0-9_]*)*)", p)
                if mm:
                    spots.append((line, mm.group(1), mm.group(2)))
                elif p.split("::")[0] in children:
                    # a 2018-edition path relative to this module: `use child::Item`
                    spots.append((line, "self", "::" + p))
        for m in PATH_RE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            spots.append((line, m.group(1), m.group(2)))
        for c in children:
            for m in re.finditer(r"(?<![:\w])" + re.escape(c) + r"((?:::[A-Za-z_][A-Za-z0-9_]*)+)", text):
                line = text.count("\n", 0, m.start()) + 1
                spots.append((line, "self", "::" + c + m.group(1)))
        for line, kind, rest in spots:
            to = resolve(mods, here, kind, rest, exports)
            if to is None or to == here or to == ():
                continue
            graph[here].setdefault(to, f"{f}:{line}")
    return mods, graph


def sccs(nodes, graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def name(m):
    return "::".join(m) or "crate"


def main(argv):
    show = "--graph" in argv
    known, dirs, args = [], [], iter(argv)
    for a in args:
        if a == "--known":
            known.append(next(args, ""))
        elif a != "--graph":
            dirs.append(a)
    used = set()
    if not dirs:
        print(__doc__, file=sys.stderr)
        return 2
    failed = False
    for src in dirs:
        mods, graph = edges(src)
        if show:
            print(f"# {src}")
            for a in sorted(graph):
                for b in sorted(graph[a]):
                    print(f"{name(a)} -> {name(b)}")
        for comp in sccs(sorted(mods), graph):
            if len(comp) < 2:
                continue
            members = set(comp)
            allowed = [k for k in known if all(name(c).startswith(k) for c in comp)]
            if allowed:
                used.update(allowed)
                print(f"known import circle in {src} (--known {allowed[0]}): {', '.join(sorted(name(c) for c in comp))}")
                continue
            failed = True
            print(f"import circle in {src}: {', '.join(sorted(name(c) for c in comp))}")
            for a in sorted(comp):
                for b, spot in sorted(graph[a].items()):
                    if b in members:
                        print(f"  {name(a)} -> {name(b)}  ({spot})")
    for k in known:
        if k not in used:
            failed = True
            print(f"--known {k} matches no import circle: drop it")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
