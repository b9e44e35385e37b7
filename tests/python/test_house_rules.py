"""The tree keeps its layout rules (scripts/house_rules.py, CONTRIBUTING.md, "Style"), and each rule's check
finds a breach written into a small tree of its own, so that a check that found nothing is not one that cannot."""
import pathlib
import textwrap

from scripts import house_rules

ROOT = pathlib.Path(__file__).resolve().parents[2]


def write(root: pathlib.Path, files: dict) -> pathlib.Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_the_tree_keeps_the_house_rules():
    assert house_rules.breaches(ROOT) == []


def test_a_class_with_more_than_twenty_data_members_is_named_with_its_count(tmp_path):
    fields = "".join(f"  int f{i}_ = 0;\n" for i in range(21))
    twenty = "".join(f"  float g{i} = 0;\n" for i in range(20))
    write(tmp_path, {
        "sync/engine/big.h": "#pragma once\nnamespace gradex::sync {\nclass Big {\n public:\n  int get() const;\n"
                             " private:\n  struct Inner { int a, b, c; };\n" + fields + "  Inner inner_;\n"
                             "  static int shared_;\n};\n"
                             "struct Twenty {\n" + twenty + "};\n}  // namespace gradex::sync\n",
        # A record a source file defines for itself counts as well.
        "sync/engine/local.cc": "namespace gradex::sync {\nnamespace {\nstruct Local {\n"
                                + "".join(f"  int l{i};\n" for i in range(23)) + "};\n}  // namespace\n"
                                "int local_size() { return sizeof(Local); }\n}  // namespace gradex::sync\n",
        # Outside the folder the rule does not apply.
        "comm/wide.h": "#pragma once\nnamespace gradex::comm {\nstruct Wide {\n"
                       + "".join(f"  int w{i};\n" for i in range(30)) + "};\n}  // namespace gradex::comm\n",
    })
    found = house_rules.data_member_breaches(tmp_path)
    # Big: 21 ints and the Inner member (its static and Inner's own fields are not Big's data members).
    assert [line.split(" (")[0] for line in found] == [
        "sync/engine/big.h:3 Big has 22 data members",
        "sync/engine/local.cc:3 Local has 23 data members",
    ]


def test_a_decision_on_route_path_outside_sync_route_is_named_a_default_value_is_not(tmp_path):
    decides = """\
        #include "sync/route/path.h"
        namespace gradex::sync {
        struct Unit { route::Path path = route::Path::kDense; };
        int cost(const Unit& unit) {
          switch (unit.path) {
            case route::Path::kSparse: return 1;
            default: return 0;
          }
        }
        bool dense(const Unit& unit) { return unit.path == route::Path::kDense; }
        }  // namespace gradex::sync
        """
    write(tmp_path, {"sync/engine/stages.cc": decides, "sync/route/sparse.cc": decides})
    found = house_rules.route_path_breaches(tmp_path)
    assert [line.split(" decides")[0] for line in found] == [
        "sync/engine/stages.cc:5", "sync/engine/stages.cc:6", "sync/engine/stages.cc:10"]


def test_sys_path_changes_in_bench_are_named(tmp_path):
    write(tmp_path, {"bench/experiments/old.py": "import sys\nsys.path.insert(0, '..')\n",
                     "bench/experiments/new.py": "from bench.harness import results\n"})
    assert [line.split(" changes")[0] for line in house_rules.sys_path_breaches(tmp_path)] == [
        "bench/experiments/old.py:2"]


def test_an_import_cycle_at_import_time_is_named_one_inside_a_function_is_not(tmp_path):
    write(tmp_path, {
        "python/gradex/__init__.py": "from . import a\n",
        "python/gradex/a.py": "from gradex import b\n",
        "python/gradex/b.py": "def later():\n    from gradex import a\n    return a\n",
    })
    assert house_rules.import_cycle_breaches(tmp_path) == []
    write(tmp_path, {"python/gradex/b.py": "try:\n    from . import a\nexcept ImportError:\n    a = None\n"})
    assert house_rules.import_cycle_breaches(tmp_path) == [
        "python/gradex imports in a cycle: gradex.a <-> gradex.b"]


def test_the_lines_naming_any_are_counted_past_the_limit(tmp_path):
    write(tmp_path, {"python/gradex/a.py": "from typing import Any\n\ndef f(x: Any) -> Any:\n    return x\n",
                     "python/gradex/b.py": "Anyway = 1  # not the name\n"})
    assert house_rules.any_breaches(tmp_path, limit=2) == []
    assert house_rules.any_breaches(tmp_path, limit=1) == [
        "python/gradex names Any on 2 lines (at most 1; type what you can): python/gradex/a.py:1, "
        "python/gradex/a.py:3, ..."]


def test_the_docs_limits_are_counted_as_written(tmp_path):
    readme = "# x\n\n## Running the tests\n" + "line\n" * 25 + "## Next\n" + "more\n" * 40
    write(tmp_path, {
        "README.md": readme, "CONTRIBUTING.md": "ok\n",
        "docs/benchmarks.md": "a\n" * 600, "docs/benchmark_details.md": "b\n" * 400,
        "docs/wan.md": "c\n" * 200, "docs/architecture.md": "d\n" * 250,
    })
    assert house_rules.section_lines(readme, "## Running the tests") == 25
    assert house_rules.docs_breaches(tmp_path) == []
    write(tmp_path, {"docs/wan.md": "c\n" * 200 + "x" * 1001 + "\n", "docs/architecture.md": "d\n" * 251})
    assert house_rules.docs_breaches(tmp_path) == [
        "the benchmark prose (docs/benchmarks.md, docs/benchmark_details.md, docs/wan.md) is 1201 lines "
        "(at most 1200)",
        "docs/architecture.md is 251 lines (at most 250)",
        "docs/wan.md:201 is 1001 characters (at most 1000)",
    ]
