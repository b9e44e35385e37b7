#!/usr/bin/env python3
"""The status codes are defined once, in include/gradex/gradex.h (gradex_status_t). Every other place
that spells them must agree with it exactly: base/error.h (ErrorCode), the plugins' status names
(include/gradex/status_name.h, which Python parses from "gradex[NAME]: ..." messages) and the Python exception
classes (python/gradex/_errors.py). Exits 1 naming each disagreement.
Usage: status_table_check.py SOURCE_DIR"""
import importlib.util
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
problems = []

header = (root / "include/gradex/gradex.h").read_text()
enum = re.search(r"typedef enum gradex_status \{(.*?)\} gradex_status_t;", header, re.S).group(1)
table = {int(v): n for n, v in re.findall(r"GRADEX_(?:ERR_)?(\w+) = (\d+)", enum)}  # value -> NAME
if table.get(0) != "OK" or len(table) < 2:
    problems.append(f"gradex.h: could not read the status table ({table})")

# base/error.h: kInvalidArgument = 1 -> INVALID_ARGUMENT
error_h = (root / "base/error.h").read_text()
codes = re.search(r"enum class ErrorCode : int \{(.*?)\};", error_h, re.S).group(1)
cpp = {int(v): re.sub(r"(?<!^)([A-Z])", r"_\1", n).upper()
       for n, v in re.findall(r"\bk(\w+) = (\d+)", codes)}
if cpp != table:
    problems.append(f"base/error.h ErrorCode {cpp} != gradex.h {table}")

# include/gradex/status_name.h (both plugins' "gradex[NAME]: ..." names): case GRADEX_ERR_X: return "X";
ops = root / "include/gradex/status_name.h"
if ops.exists():
    names = dict(re.findall(r"case GRADEX_(?:ERR_)?(\w+):\s*return \"(\w+)\";", ops.read_text()))
    want = {n: n for n in table.values()}
    if names != want:
        problems.append(f"include/gradex/status_name.h status names {names} != gradex.h {want}")

# python/gradex/_errors.py (plain Python, no dependencies): one class per non-zero code.
spec = importlib.util.spec_from_file_location("gradex_errors", root / "python/gradex/_errors.py")
errors = importlib.util.module_from_spec(spec)
spec.loader.exec_module(errors)
py = {cls.status: cls.name for cls in errors._CLASSES}
want = {v: n for v, n in table.items() if v != 0}
if py != want:
    problems.append(f"python/gradex/_errors.py {py} != gradex.h {want}")
if set(errors._BY_NAME) != set(want.values()):
    problems.append(f"python/gradex/_errors.py _BY_NAME keys {sorted(errors._BY_NAME)}")

for p in problems:
    print("status table:", p)
print("status table:", "MISMATCH" if problems else f"{len(table)} codes agree everywhere")
sys.exit(1 if problems else 0)
