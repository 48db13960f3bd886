#!/usr/bin/env python3
"""The layers of docs/design.md, held: every `#include "FOLDER/..."` of app/, lib/ and io/ goes
to its own folder or to one the Layout table's "may use" column allows, and the folders' includes
form no cycle.

usage: scripts/check_layers.py [SOURCE_DIR]     (default: the repository holding this script)

The contract is read from docs/design.md itself (its "## Layout" table: the first column names
the folder, the last the folders it may use, in backticks; "all of lib" is every lib folder, and
every folder may use the foundation, io/base), so
the table and this check cannot disagree. Before the sources, the check runs itself on a made-up
wrong include and fails unless it catches it. Exit 0: the layers hold; 1: an include goes the
wrong way or the folders include each other in a cycle (each named, with file and line).
"""
import os
import re
import sys

SOURCE_EXTENSIONS = (".cpp", ".h", ".cu", ".cuh", ".in")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def read_contract(design_text):
    """{folder: set of folders it may use} from the Layout table (folders without a slash at the end)."""
    section = design_text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    contract = {}
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        folders = re.findall(r"`([a-z_/]+)/`", cells[0])
        if not folders:
            continue
        may_use = set(re.findall(r"`([a-z_/]+)`", cells[-1]))
        if "all of lib" in cells[-1]:
            may_use.add("lib/*")
        for folder in folders:
            contract[folder] = may_use
    lib_folders = sorted(f for f in contract if f.startswith("lib/"))
    for folder, may_use in contract.items():
        if "lib/*" in may_use:
            may_use.discard("lib/*")
            may_use.update(f for f in lib_folders if f != folder)
        if folder != "io/base":
            may_use.add("io/base")  # the foundation, below everything
    return contract


def folder_of(path, contract):
    """The contract's folder that holds `path` (the longest that matches), or None."""
    best = None
    for folder in contract:
        if path.startswith(folder + "/") and (best is None or len(folder) > len(best)):
            best = folder
    return best


def check(files, contract):
    """files: {path: text}. Returns (problems, edges): wrong-way includes, and the folder graph."""
    problems, edges = [], {}
    for path in sorted(files):
        source = folder_of(path, contract)
        if source is None:
            continue
        for number, line in enumerate(files[path].splitlines(), 1):
            match = INCLUDE.match(line)
            if not match:
                continue
            target = folder_of(match.group(1), contract)
            if target is None or target == source:
                continue
            edges.setdefault(source, {}).setdefault(target, f"{path}:{number}")
            if target not in contract[source]:
                allowed = ", ".join(sorted(contract[source])) or "nothing"
                problems.append(f"{path}:{number}: {source}/ includes {match.group(1)} ({target}/), but "
                                f"{source}/ may use only: {allowed} (docs/design.md, Layout). Move the code "
                                f"to a folder {source}/ may use, or change the contract there and say why")
    return problems, edges


def cycles(edges):
    """Every cycle of the folder graph, each once, as a list of folders."""
    found, seen = [], set()

    def walk(node, path):
        for nxt in sorted(edges.get(node, {})):
            if nxt in path:
                cycle = path[path.index(nxt):]
                key = frozenset(cycle)
                if key not in seen:
                    seen.add(key)
                    found.append(cycle + [nxt])
            elif len(path) < len(edges) + 1:
                walk(nxt, path + [nxt])

    for start in sorted(edges):
        walk(start, [start])
    return found


def layer_order(edges, contract):
    """The folders bottom up (each after everything it includes)."""
    order, done = [], set()

    def visit(folder):
        if folder in done:
            return
        done.add(folder)
        for used in sorted(edges.get(folder, {})):
            visit(used)
        order.append(folder)

    for folder in sorted(contract):
        if folder.split("/")[0] in ("app", "lib", "io"):
            visit(folder)
    return order


def self_test(contract):
    """The check must catch a made-up back-include and a made-up cycle, or it proves nothing."""
    wrong = {"lib/model/made_up.cpp": '#include "lib/backend/cpu_model.h"\n',
             "lib/backend/made_up.cpp": '#include "lib/model/spec.h"\n'}
    problems, edges = check(wrong, contract)
    if not any("lib/model/made_up.cpp:1" in p for p in problems) or not cycles(edges):
        sys.exit("check_layers: FAIL: the self-test's wrong include (lib/model -> lib/backend) or its cycle "
                 "went unreported; the check is broken")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "design.md"), encoding="utf-8") as f:
        contract = read_contract(f.read())
    for needed in ("app", "io", "io/base", "lib/model", "lib/backend", "lib/train"):
        if needed not in contract:
            sys.exit(f"check_layers: FAIL: docs/design.md's Layout table has no row for `{needed}/`")
    self_test(contract)
    files = {}
    for top in ("app", "lib", "io"):
        for directory, _, names in os.walk(os.path.join(root, top)):
            for name in names:
                if name.endswith(SOURCE_EXTENSIONS):
                    full = os.path.join(directory, name)
                    with open(full, encoding="utf-8", errors="replace") as f:
                        files[os.path.relpath(full, root)] = f.read()
    problems, edges = check(files, contract)
    loops = cycles(edges)
    for cycle in loops:
        steps = [f"{a}/ -> {b}/ ({edges[a][b]})" for a, b in zip(cycle, cycle[1:])]
        problems.append("the folders include each other in a cycle: " + "; ".join(steps))
    if problems:
        print(f"check_layers: FAIL: {len(problems)} include(s) against the layers:", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        sys.exit(1)
    print(f"check_layers: {len(files)} files, every include within the layers, no cycle; bottom up: "
          + " < ".join(f + "/" for f in layer_order(edges, contract)))


if __name__ == "__main__":
    main()
