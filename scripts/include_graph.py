#!/usr/bin/env python3
"""kvsim's include graph, by floor (docs/architecture.md).

Reads every `#include "..."` and `#include <kvsim/...>` of the C++/CUDA sources, resolves it the way the
build does (the including file's folder, then the include roots of the
targets: core/include, validation/include, sim/include, bench/include, the
repository root), and prints which floor includes which (the graph drawn in
docs/architecture.md). With --check it also enforces the floors' rules and
exits 1 naming every include that breaks one:

  core -> nothing above core      validation -> core only
  backends -> core, validation     sim -> core, validation, backends
  workload, bench, report -> core, validation, backends, sim
  cli, python -> any library floor, never each other
  backend implementations (backends/reference, cpu, cuda) never include each
  other; only the registry (backends/*.cpp) names them all
  nobody outside cli/ includes cli/, except tests/ (which test the parser)

and that core holds only descriptors and host/device work items: no core
header names std::string or throws (host validation lives in validation/).

Usage: include_graph.py [--root DIR] [--check] [--check-doc MD] [--tests] [--counts]
                        [--files] [--self-test]
"""
import argparse
import os
import re
import sys

SOURCE_EXT = (".hpp", ".cpp", ".cu", ".cuh", ".h")
INCLUDE_ROOTS = ("core/include", "validation/include", "sim/include", "workload/include", "bench/include", "report/include", ".")
FLOORS = ("core", "validation", "backends", "sim", "workload", "bench", "report", "cli", "python")
# The floors each floor may include (itself always allowed).
ALLOWED = {
    "core": set(),
    "validation": {"core"},
    "backends": {"core", "validation"},
    "sim": {"core", "validation", "backends"},
    "workload": {"core", "validation", "backends", "sim"},
    "bench": {"core", "validation", "backends", "sim"},
    "report": {"core", "validation", "backends", "sim"},
    "cli": {"core", "validation", "backends", "sim", "workload", "bench", "report"},
    "python": {"core", "validation", "backends", "sim", "workload", "bench", "report"},
    "tests": {"core", "validation", "backends", "sim", "workload", "bench", "report", "cli", "python"},
}
BACKEND_IMPLS = ("reference", "cpu", "cuda")
# Quoted includes resolve from the including file's folder first; <kvsim/...>
# ones only from the include roots.
INCLUDE = re.compile(r'^\s*#\s*include\s+(?:"([^"]+)"|<(kvsim/[^>]+)>)')


# What only host code may do: name std::string (std::string_view is fine) or
# throw. Comments and string literals are not code.
HOST_ONLY = re.compile(r"\bstd::string\b(?!_view)|\bthrow\b|#\s*include\s*<(?:string|stdexcept|sstream)>")
COMMENT_OR_LITERAL = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', re.S)


def host_only_uses(root):
    """(file, line, text) for every host-only construct in a core header."""
    for rel in sources(root):
        if not rel.startswith("core/"):
            continue
        text = open(os.path.join(root, rel), encoding="utf-8", errors="replace").read()
        # Blank out comments and literals, keeping newlines so line numbers hold.
        code = COMMENT_OR_LITERAL.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0))
                                      if not m.group(0).startswith('"') else '""', text)
        for number, line in enumerate(code.split("\n"), 1):
            m = HOST_ONLY.search(line)
            if m:
                yield rel, number, m.group(0)


def floor_of(rel):
    top = rel.split("/", 1)[0]
    return top if top in FLOORS or top == "tests" else None


def backend_impl_of(rel):
    parts = rel.split("/")
    if len(parts) > 2 and parts[0] == "backends" and parts[1] in BACKEND_IMPLS:
        return parts[1]
    return None


def sources(root):
    for top in FLOORS + ("tests",):
        base = os.path.join(root, top)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(("build", ".")))
            for name in sorted(filenames):
                if name.endswith(SOURCE_EXT):
                    yield os.path.relpath(os.path.join(dirpath, name), root)


def resolve(root, including, target, quoted):
    here = (os.path.dirname(including),) if quoted else ()
    for base in here + INCLUDE_ROOTS:
        candidate = os.path.normpath(os.path.join(base, target))
        if os.path.isfile(os.path.join(root, candidate)):
            return candidate
    return None


def edges(root):
    for rel in sources(root):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if m:
                    target = resolve(root, rel, m.group(1) or m.group(2), m.group(1) is not None)
                    if target is not None:
                        yield rel, number, target


def violation(src, dst):
    a, b = floor_of(src), floor_of(dst)
    if a is None or b is None:
        return None
    if a != b and b not in ALLOWED[a]:
        return f"{a} may not include {b}"
    if a == "backends" and b == "backends":
        ia, ib = backend_impl_of(src), backend_impl_of(dst)
        if ia and ib and ia != ib:
            return f"backends/{ia} may not include backends/{ib}"
        if ib and not ia and not src.startswith("backends/registry"):
            return f"only backends/registry.cpp names the backend implementations (backends/{ib})"
    return None


def folder_of(rel):
    """The node an edge is drawn between: the floor, or backends/<impl>."""
    impl = backend_impl_of(rel)
    return f"backends/{impl}" if impl else floor_of(rel)


def self_test():
    """The rules catch what they claim to: a scratch tree with one include of
    each forbidden kind must give exactly those violations, an allowed tree none."""
    import tempfile
    bad = {
        "core/include/kvsim/core/a.hpp": '#include "backends/backend.hpp"',
        "backends/backend.hpp": '#include "kvsim/sim/s.hpp"',
        "backends/cpu/c.cpp": '#include "backends/cuda/k.hpp"',
        "backends/cuda/k.hpp": '#include <kvsim/core/ok.hpp>',
        "sim/include/kvsim/sim/s.hpp": '#include "kvsim/bench/b.hpp"',
        "bench/include/kvsim/bench/b.hpp": '#include "cli/numbers.hpp"',
        "python/m.cpp": '#include "cli/numbers.hpp"',
        "cli/numbers.hpp": '#include "kvsim/bench/b.hpp"',
        "core/include/kvsim/core/ok.hpp": "",
        "core/include/kvsim/core/v.hpp": '#include "kvsim/validation/c.hpp"',
        "validation/include/kvsim/validation/c.hpp": '#include "backends/backend.hpp"',
        "backends/uses_validation.cpp": '#include "kvsim/validation/ok.hpp"',
        "validation/include/kvsim/validation/ok.hpp": '#include "kvsim/core/ok.hpp"',
        # core stays host/device: no std::string, no throw (std::string_view,
        # comments and literals that mention them are fine)
        "core/include/kvsim/core/s.hpp": "inline std::string name() { return {}; }",
        "core/include/kvsim/core/t.hpp": "inline void f(int x) {\n  if (x) throw 1;\n}",
        "core/include/kvsim/core/fine.hpp": ('#include <string_view>\n// std::string and throw, said in a comment\n'
                                             'constexpr std::string_view s = "throw std::string";'),
    }
    expected = {"core/include/kvsim/core/a.hpp", "backends/backend.hpp", "backends/cpu/c.cpp",
                "sim/include/kvsim/sim/s.hpp", "bench/include/kvsim/bench/b.hpp", "python/m.cpp",
                "core/include/kvsim/core/v.hpp", "validation/include/kvsim/validation/c.hpp"}
    expected_host_only = {("core/include/kvsim/core/s.hpp", 1, "std::string"),
                          ("core/include/kvsim/core/t.hpp", 2, "throw")}
    with tempfile.TemporaryDirectory() as root:
        for rel, text in bad.items():
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text + "\n")
        found = {src for src, _, dst in edges(root) if violation(src, dst)}
        host_only = set(host_only_uses(root))
    if found != expected:
        print(f"self-test: flagged {sorted(found)}, expected {sorted(expected)}", file=sys.stderr)
        return 1
    if host_only != expected_host_only:
        print(f"self-test: host-only code in core flagged {sorted(host_only)}, expected {sorted(expected_host_only)}",
              file=sys.stderr)
        return 1
    print(f"self-test: {len(expected)} forbidden includes and {len(expected_host_only)} host-only uses in core "
          "flagged, allowed ones not")
    return 0


NODE_ORDER = ("cli", "python", "workload", "bench", "report", "sim", "backends", "backends/reference", "backends/cpu",
              "backends/cuda", "validation", "core", "tests")
DOC_BEGIN = "<!-- include_graph.py: begin -->"
DOC_END = "<!-- include_graph.py: end -->"


def graph(root, with_tests, with_counts):
    """One line per including folder: the folders it includes, in floor order."""
    counts = {}
    for src, _, dst in edges(root):
        a, b = folder_of(src), folder_of(dst)
        if a != b and (with_tests or a != "tests"):
            counts[(a, b)] = counts.get((a, b), 0) + 1
    lines = []
    for a in NODE_ORDER:
        targets = [b for b in NODE_ORDER if (a, b) in counts]
        if targets:
            shown = [f"{b} ({counts[(a, b)]})" if with_counts else b for b in targets]
            lines.append(f"{a:<18} -> " + ", ".join(shown))
    return "\n".join(lines) + "\n"


def doc_block(path):
    text = open(path, encoding="utf-8").read()
    if DOC_BEGIN not in text or DOC_END not in text:
        return None
    block = text.split(DOC_BEGIN, 1)[1].split(DOC_END, 1)[0]
    return "\n".join(l for l in block.splitlines() if not l.startswith("```")).strip("\n") + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--check", action="store_true", help="exit 1 if an include breaks a floor rule")
    parser.add_argument("--check-doc", metavar="MD", help="exit 1 unless MD's generated graph block is current")
    parser.add_argument("--tests", action="store_true", help="draw tests/ too")
    parser.add_argument("--counts", action="store_true", help="how many includes each edge stands for")
    parser.add_argument("--files", action="store_true", help="list file-level edges instead")
    parser.add_argument("--self-test", action="store_true", help="check the rules on a scratch tree and exit")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    root = os.path.abspath(args.root)

    if args.files:
        for src, _, dst in edges(root):
            print(f"{src} -> {dst}")
    elif not args.check_doc:
        sys.stdout.write(graph(root, args.tests, args.counts))
    status = 0
    if args.check:
        broken = [f"{src}:{n}: includes {dst}: {violation(src, dst)}" for src, n, dst in edges(root)
                  if violation(src, dst)]
        for line in broken:
            print(line, file=sys.stderr)
        if broken:
            print(f"{len(broken)} include(s) break the floors of docs/architecture.md", file=sys.stderr)
            status = 1
        host_only = [f"{rel}:{n}: {what}: core holds descriptors and host/device work items only; host code "
                     "(validation, messages) goes in validation/" for rel, n, what in host_only_uses(root)]
        for line in host_only:
            print(line, file=sys.stderr)
        if host_only:
            print(f"{len(host_only)} host-only use(s) in core/", file=sys.stderr)
            status = 1
    if args.check_doc:
        want = graph(root, False, False)
        have = doc_block(os.path.join(root, args.check_doc))
        if have != want:
            print(f"{args.check_doc}: the include graph between '{DOC_BEGIN}' and '{DOC_END}' is stale;"
                  f" replace it with the output of scripts/include_graph.py:\n{want}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
