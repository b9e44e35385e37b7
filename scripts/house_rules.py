"""The layout rules the tree keeps (CONTRIBUTING.md, "Style"), checked from the tree itself.

Run from the repository root: `python3 scripts/house_rules.py` prints every breach and exits 1 when there is one;
tests/python/test_house_rules.py runs it in the test command. The rules:

- no class or struct defined in sync/ holds more than 20 data members (counted by clang's own parse: the
  non-static fields a definition declares itself, nested records apart);
- outside sync/route/, no code switches on `route::Path` or compares with one of its values (a route owns
  what differs between routes; a default member value is not a decision);
- bench/ reaches the package and its harness by import, never through `sys.path.insert`;
- the Python package `gradex` has no import cycle among its modules at import time (imports inside
  functions run later and are not edges), and at most 123 of its lines name `Any` (half of the 246 it had
  when its types were first counted; counted as `grep -w Any` counts lines);
- the docs' limits: the benchmark prose (benchmarks.md, benchmark_details.md, wan.md) at most 1,200 lines in
  all, docs/architecture.md at most 250, the README's "Running the tests" section at most 25, and no line
  of a Markdown page longer than 1,000 characters.
"""
from __future__ import annotations

import ast
import concurrent.futures
import os
import pathlib
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

MAX_DATA_MEMBERS = 20
BENCHMARK_PROSE = ("docs/benchmarks.md", "docs/benchmark_details.md", "docs/wan.md")
MAX_BENCHMARK_PROSE_LINES = 1200
MAX_ARCHITECTURE_LINES = 250
MAX_README_TEST_SECTION_LINES = 25
MAX_LINE_CHARS = 1000
MAX_ANY_LINES = 123


@dataclass
class Record:
    """A class or struct definition and the data members it declares itself."""

    name: str
    path: str
    line: int
    members: Set[str] = field(default_factory=set)


# A node's source range in clang's text dump: a full path when the file changes, `line:` or `col:` otherwise.
_FULL_LOCATION = re.compile(r"<(?:\./)?([^<>:\s]+\.(?:h|hpp|cc|cpp|inc)):(\d+):\d+")
_LINE_LOCATION = re.compile(r"<line:(\d+):\d+")
_FIELD_NAME = re.compile(r"\s([A-Za-z_]\w*) '")


def records_in_dump(dump: str) -> List[Record]:
    """The record definitions in clang's `-ast-dump` text and the fields each declares directly.

    Depth is read from the tree's indentation (two characters a level); a field belongs to the record one level
    above it. Implicit records (a class's injected name, a lambda's closure type) are left out."""
    records: List[Record] = []
    current_file: Optional[str] = None
    open_records: List[Tuple[int, Record]] = []
    for text in dump.splitlines():
        start = re.search(r"[A-Za-z]", text)
        if start is None:
            continue
        depth = start.start() // 2
        node = text[start.start():]
        line: Optional[int] = None
        full = _FULL_LOCATION.search(node)
        if full:
            current_file, line = full.group(1), int(full.group(2))
        else:
            short = _LINE_LOCATION.search(node)
            if short:
                line = int(short.group(1))
        while open_records and open_records[-1][0] >= depth:
            open_records.pop()
        if node.startswith("CXXRecordDecl") and " definition" in node and " implicit " not in node:
            name = node.split(" definition")[0].split()[-1]
            record = Record(name, current_file or "?", line or 0)
            records.append(record)
            open_records.append((depth, record))
        elif node.startswith("FieldDecl") and open_records and open_records[-1][0] == depth - 1:
            found = _FIELD_NAME.search(node)
            if found:
                open_records[-1][1].members.add(found.group(1))
    return records


def _clang_dump(root: pathlib.Path, source: str) -> str:
    compiler = shutil.which("clang++")
    if compiler is None:
        raise RuntimeError("clang++ is not installed (scripts/setup.sh installs it): the data-member rule needs "
                           "clang's parse")
    done = subprocess.run(
        [compiler, "-std=c++17", "-fsyntax-only", "-fno-color-diagnostics", "-I.", "-Iinclude",
         "-Xclang", "-ast-dump", "-Xclang", "-ast-dump-filter=gradex", "-x", "c++", "-"],
        input=source, capture_output=True, text=True, cwd=root, check=False)
    if done.returncode != 0:
        first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr[:300])
        raise RuntimeError(f"clang++ could not parse {source.strip()!r}: {first}")
    return done.stdout


_DEFINES_A_RECORD = re.compile(r"^\s*(?:class|struct)\s+\w+[^;()]*$", re.MULTILINE)


def data_member_breaches(root: pathlib.Path, folder: str = "sync",
                         limit: int = MAX_DATA_MEMBERS) -> List[str]:
    """Every record defined under `folder` with more than `limit` data members: "path:line Name has N ...".

    The headers are parsed together (one translation unit, as a file including all of them would be); a source
    file is parsed alone, and only when it defines a record of its own."""
    base = root / folder
    headers = sorted(str(p.relative_to(root)) for p in base.rglob("*.h"))
    sources = sorted(str(p.relative_to(root)) for p in base.rglob("*.cc")
                     if _DEFINES_A_RECORD.search(p.read_text(encoding="utf-8")))
    units = ["".join(f'#include "{h}"\n' for h in headers)] + [f'#include "{s}"\n' for s in sources]
    workers = max(1, min(len(units), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        dumps = list(pool.map(lambda unit: _clang_dump(root, unit), units))
    merged: Dict[Tuple[str, int, str], Record] = {}
    for dump in dumps:
        for record in records_in_dump(dump):
            if not record.path.startswith(folder + "/"):
                continue
            key = (record.path, record.line, record.name)
            merged.setdefault(key, Record(record.name, record.path, record.line)).members |= record.members
    return [f"{r.path}:{r.line} {r.name} has {len(r.members)} data members (at most {limit}; group a concern's "
            f"fields in a struct of their own)"
            for r in sorted(merged.values(), key=lambda r: (r.path, r.line)) if len(r.members) > limit]


_PATH_DECISION = re.compile(r"switch\s*\([^)]*\bpath\b[^)]*\)|[=!]=\s*(?:route::)?Path::k\w+|"
                            r"Path::k\w+\s*[=!]=|case\s+(?:route::)?Path::k\w+")


def route_path_breaches(root: pathlib.Path) -> List[str]:
    """Decisions on `route::Path` outside sync/route/: a switch over a path, a comparison, a case label."""
    found: List[str] = []
    for folder in ("sync", "capi", "outer", "comm", "compress", "plugins"):
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".h", ".cc", ".cu", ".cuh") or "sync/route/" in path.as_posix():
                continue
            text = path.read_text(encoding="utf-8")
            if "route::" not in text and "namespace route" not in text:
                continue
            for number, line in enumerate(text.splitlines(), 1):
                if _PATH_DECISION.search(line) and "AllgathervPath" not in line:
                    found.append(f"{path.relative_to(root)}:{number} decides on route::Path outside sync/route/: "
                                 f"{line.strip()}")
    return found


def sys_path_breaches(root: pathlib.Path) -> List[str]:
    """`sys.path.insert` / `sys.path.append` anywhere in bench/."""
    found: List[str] = []
    for path in sorted((root / "bench").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"\bsys\.path\.(insert|append)\b", line):
                found.append(f"{path.relative_to(root)}:{number} changes sys.path (import bench.* or gradex "
                             f"instead)")
    return found


def _modules(package_root: pathlib.Path) -> Dict[str, Tuple[pathlib.Path, bool]]:
    modules: Dict[str, Tuple[pathlib.Path, bool]] = {}
    for path in package_root.rglob("*.py"):
        parts = list(path.relative_to(package_root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        modules[".".join(parts)] = (path, is_package)
    return modules


def _import_time_nodes(body: Sequence[ast.stmt]) -> Iterable[ast.AST]:
    """The statements that run when a module is imported: the module's body, with the branches of its `if`
    and `try` statements (not function or class bodies' functions)."""
    for statement in body:
        yield statement
        if isinstance(statement, ast.If):
            yield from _import_time_nodes(statement.body + statement.orelse)
        elif isinstance(statement, ast.Try):
            handlers: List[ast.stmt] = [s for h in statement.handlers for s in h.body]
            yield from _import_time_nodes(statement.body + handlers + statement.orelse + statement.finalbody)


def import_graph(package_root: pathlib.Path) -> Dict[str, Set[str]]:
    """Module -> the package's modules it imports while being imported. `from . import sub` is an edge to `sub`
    alone (the package object exists already); `from pkg import name` is an edge to `pkg`."""
    modules = _modules(package_root)
    graph: Dict[str, Set[str]] = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        edges: Set[str] = set()
        for node in _import_time_nodes(ast.parse(path.read_text(encoding="utf-8")).body):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    edges.add(sub if sub in modules else base)
        graph[name] = {m for m in edges if m in modules and m != name}
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: List[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def import_cycle_breaches(root: pathlib.Path) -> List[str]:
    return [f"python/gradex imports in a cycle: {' <-> '.join(c)}" for c in cycles(import_graph(root / "python"))]


def any_breaches(root: pathlib.Path, limit: int = MAX_ANY_LINES) -> List[str]:
    """The package's lines that name `Any`, when there are more than `limit`."""
    lines = [f"{path.relative_to(root)}:{number}"
             for path in sorted((root / "python" / "gradex").rglob("*.py"))
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\bAny\b", line)]
    if len(lines) <= limit:
        return []
    return [f"python/gradex names Any on {len(lines)} lines (at most {limit}; type what you can): "
            f"{', '.join(lines[:5])}, ..."]


def section_lines(markdown: str, heading: str) -> int:
    """Lines of the section under `heading` (a `## ` line), up to the next heading of its level or the end,
    the heading itself left out."""
    lines = markdown.splitlines()
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return end - start - 1


def docs_breaches(root: pathlib.Path) -> List[str]:
    found: List[str] = []
    prose = sum(len((root / p).read_text(encoding="utf-8").splitlines()) for p in BENCHMARK_PROSE)
    if prose > MAX_BENCHMARK_PROSE_LINES:
        found.append(f"the benchmark prose ({', '.join(BENCHMARK_PROSE)}) is {prose} lines "
                     f"(at most {MAX_BENCHMARK_PROSE_LINES})")
    architecture = len((root / "docs/architecture.md").read_text(encoding="utf-8").splitlines())
    if architecture > MAX_ARCHITECTURE_LINES:
        found.append(f"docs/architecture.md is {architecture} lines (at most {MAX_ARCHITECTURE_LINES})")
    tests = section_lines((root / "README.md").read_text(encoding="utf-8"), "## Running the tests")
    if tests > MAX_README_TEST_SECTION_LINES:
        found.append(f"README.md's 'Running the tests' is {tests} lines (at most {MAX_README_TEST_SECTION_LINES})")
    pages = [root / "README.md", root / "CONTRIBUTING.md", *sorted((root / "docs").rglob("*.md"))]
    for page in pages:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if len(line) > MAX_LINE_CHARS:
                found.append(f"{page.relative_to(root)}:{number} is {len(line)} characters (at most "
                             f"{MAX_LINE_CHARS})")
    return found


def breaches(root: pathlib.Path) -> List[str]:
    return (data_member_breaches(root) + route_path_breaches(root) + sys_path_breaches(root)
            + import_cycle_breaches(root) + any_breaches(root) + docs_breaches(root))


def main() -> int:
    root = pathlib.Path(__file__).resolve().parent.parent
    found = breaches(root)
    for line in found:
        print(line)
    print(f"house rules: {len(found)} breach(es)" if found else "house rules: kept")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
