#!/usr/bin/env python3
"""Checks the shape of the source tree (run by `make test` as the ctest `structure_check`).

1. Layering: a folder includes only the folders below it (the picture in
   docs/architecture.md). `meta/` never includes `cachefs/`; `origin/` and `transport/` see only
   `common/`.
2. No include cycle between files (a header that, through others, includes itself).
3. No hand-written source file over the line limit (tests and generated code excepted).

Prints every violation and exits 1 if there is one.
"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
MAX_LINES = 600

# Folder -> the project folders its code may include (itself always allowed).
ALLOWED = {
    "common": set(),
    "origin": {"common"},
    "transport": {"common"},
    "meta": {"common", "origin"},
    "cachefs": {"common", "origin", "transport", "meta"},  # meta: its client and messages only
    "csi": {"common"},
    "tools": {"common", "origin", "transport", "meta", "cachefs", "csi"},
    "bench": {"common", "origin", "transport", "meta", "cachefs"},
    "tests": {"common", "origin", "transport", "meta", "cachefs", "csi", "tools", "tests"},
}
# What cachefs may include from meta: the client and the generated messages, not the server.
CACHEFS_META_OK = {"meta/meta_client.h", "meta/meta.pb.h", "meta/status_json.h"}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE_EXT = (".h", ".cc")


def sources():
    for folder in ALLOWED:
        base = os.path.join(ROOT, folder)
        for dirpath, _, files in os.walk(base):
            for f in files:
                if f.endswith(SOURCE_EXT):
                    yield os.path.relpath(os.path.join(dirpath, f), ROOT)


def top(path):
    return path.split("/", 1)[0]


def main():
    errors = []
    graph = {}
    files = sorted(sources())
    known = set(files)
    for path in files:
        with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as fh:
            lines = fh.readlines()
        is_test = path.startswith("tests/") or path.endswith(("_test.cc", "_test.h"))
        if not is_test and len(lines) > MAX_LINES:
            errors.append(f"{path}: {len(lines)} lines (limit {MAX_LINES}); split it along a seam")
        deps = []
        for n, line in enumerate(lines, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            inc = m.group(1)
            folder = top(inc)
            if folder not in ALLOWED:
                continue  # a system or third-party header in quotes
            src = top(path)
            # Unit tests beside the code may use the test helpers.
            if folder != src and folder not in ALLOWED[src] and not (is_test and folder == "tests"):
                errors.append(f"{path}:{n}: {src}/ must not include {inc}")
            if src == "cachefs" and folder == "meta" and inc not in CACHEFS_META_OK:
                errors.append(f"{path}:{n}: cachefs/ talks to meta only through "
                              f"{', '.join(sorted(CACHEFS_META_OK))}, not {inc}")
            if inc in known:
                deps.append(inc)
        graph[path] = deps

    # Cycles among files (depth-first search, colouring).
    WHITE, GREY, BLACK = 0, 1, 2
    colour = {f: WHITE for f in graph}
    stack = []

    def visit(f):
        colour[f] = GREY
        stack.append(f)
        for d in graph.get(f, []):
            if colour.get(d, BLACK) == GREY:
                cyc = stack[stack.index(d):] + [d]
                errors.append("include cycle: " + " -> ".join(cyc))
            elif colour.get(d) == WHITE:
                visit(d)
        stack.pop()
        colour[f] = BLACK

    sys.setrecursionlimit(10000)
    for f in graph:
        if colour[f] == WHITE:
            visit(f)

    for e in errors:
        print(e)
    if errors:
        print(f"structure check: {len(errors)} problem(s)")
        return 1
    print(f"structure check: {len(files)} files, layering and includes fine, none over {MAX_LINES} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
