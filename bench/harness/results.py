"""The result schema shared by every experiment: a result file is a JSON object whose "provenance" says
how it was made, so that a table or figure read from it names its command, commit, machine and link.

    provenance = {"schema": 1, "command": "python -m bench.train.train_suite --wan 1gbit,25ms ...",
                  "run": "bench/run --wan ..." (when bench/run started it), "commit": "abc1234",
                  "dirty": false, "machine": {...machine.describe()}, "link": {...} or "1gbit"}

write() adds it (and replaces an older one), atomically; load() reads a file and, with require=True,
refuses one without provenance, naming the missing fields. Files written before the schema existed
have no provenance: load() returns them as they are unless required.
"""
import json
import os
import shlex
import subprocess
import sys
from typing import Any, Dict, List, Mapping, Optional, Union

from bench.harness import machine

SCHEMA = 1
FIELDS = ("schema", "command", "commit", "machine", "link")
# bench/run exports its own command line here, so that a stage's results also name the run that made them.
RUN_VARIABLE = "GX_BENCH_COMMAND"

Link = Union[str, Mapping[str, Any], List[Any]]


def command_line(argv: Optional[List[str]] = None) -> str:
    """This process's command line as a user would type it from the repository root: the interpreter's
    path is shortened to `python` (sys.orig_argv keeps `-m module`, which sys.argv loses)."""
    words = list(argv if argv is not None else getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    if words and os.path.basename(words[0]).startswith("python"):
        words[0] = "python"
    return shlex.join(words)


def _git(*args: str) -> str:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def provenance(link: Link, command: Optional[str] = None, describe: bool = True) -> Dict[str, Any]:
    """The provenance of a result made now by this process over `link` (a network's label, a WAN's
    spec as a dict, or a list of either for a run over several links)."""
    record: Dict[str, Any] = {
        "schema": SCHEMA,
        "command": command or command_line(),
        "commit": _git("rev-parse", "--short", "HEAD") or "unknown",
        # Uncommitted changes to tracked files outside docs/: the commit alone does not say what ran.
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs")),
        "machine": machine.describe() if describe else {},
        "link": link,
    }
    if os.environ.get(RUN_VARIABLE):
        record["run"] = os.environ[RUN_VARIABLE]
    return record


def missing(data: Mapping[str, Any]) -> List[str]:
    """The provenance fields a result lacks (every one when it has no provenance)."""
    prov = data.get("provenance")
    if not isinstance(prov, Mapping):
        return list(FIELDS)
    return [f for f in FIELDS if prov.get(f) in (None, "")]


_made: Dict[str, Any] = {}


def write(path: Union[str, "os.PathLike[str]"], data: Dict[str, Any], link: Link) -> None:
    """Writes data with its provenance to path (a temporary file renamed over it: a reader never sees a
    half-written file, and a run killed mid-write leaves the previous one). A suite rewrites its file
    after every run: the provenance is made once per process (machine.describe() takes a moment) and
    its link replaced by `link` each time."""
    if not _made:
        _made.update(provenance(link))
    record = dict(_made, link=link)
    out = dict(data, provenance=record)
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def load(path: Union[str, "os.PathLike[str]"], require: bool = False) -> Dict[str, Any]:
    """A result file; with require=True a ValueError naming the file and its missing provenance fields
    when it lacks any."""
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{os.fspath(path)}: a result file holds a JSON object, not {type(data).__name__}")
    if require and missing(data):
        raise ValueError(f"{os.fspath(path)}: no provenance {', '.join(missing(data))} "
                         f"(bench/harness/results.py: written by results.write)")
    return data
