"""Measures which source files one tensor's step enters, from gx.hook to the wire and back.

The journey of docs/architecture.md, counted by running it rather than by reading: two ranks train a
one-tensor model (a 1024x256 linear layer, bias-free, GRADEX_POLICY=fixed: DGC at 99%, or dense 16-bit)
through DistributedDataParallel and gx.hook, on a coverage build of libgradex.so and the op library
(build-cov/). A C++ file is entered per step when one of its lines runs at least once more per extra
step in a run of 2N steps than in one of N (the set-up is the same in both); a Python file when a
function of it is called after the first two steps (sys.setprofile in every thread). Headers are listed
apart (inline code), as are the leaf libraries a reader treats as black boxes behind their interface
header (base/, compress/, comm's transport, seal and topology).

    .venv/bin/python -m bench.experiments.journey_files [--paths dgc,fp16] [--steps 6] \\
        [--out docs/benchmarks/journey_files.json]

Builds build-cov/ first (incremental; about a minute on 2 cores from nothing, with the runs).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from types import FrameType
from typing import Any, Dict, List, Optional, Set

from bench.harness import results

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, "build-cov")
# Where a newcomer follows the tensor (the rest are libraries behind one header each).
ORCHESTRATION = ("python/gradex/", "plugins/", "capi/", "sync/", "comm/collectives/")
# The tensor's path: GRADEX_SPARSITY under GRADEX_POLICY=fixed (0: dense, 16-bit on the wire).
PATH_SPARSITY = {"dgc": "0.99", "fp16": "0"}


def build() -> None:
    if not os.path.exists(os.path.join(BUILD, "build.ninja")):
        subprocess.run(["cmake", "-S", ROOT, "-B", BUILD, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Debug",
                        "-DCMAKE_CXX_FLAGS=--coverage", "-DCMAKE_SHARED_LINKER_FLAGS=--coverage",
                        "-DGRADEX_BUILD_TESTS=OFF", "-DGRADEX_BUILD_BENCH=OFF", "-DGRADEX_THRUST_OMP=OFF",
                        "-DGRADEX_CUDA=OFF", "-DGRADEX_BUILD_TORCH=ON", f"-DPython3_EXECUTABLE={sys.executable}"],
                       check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", BUILD, "--target", "gradex", "gradex_torch_ops"], check=True,
                   stdout=subprocess.DEVNULL)


def package(into: str) -> str:
    """A copy of python/gradex with the coverage build's libraries in it; returns its parent."""
    shutil.copytree(os.path.join(ROOT, "python", "gradex"), os.path.join(into, "gradex"))
    for lib in ("libgradex.so", "libgradex_torch_ops.so"):
        shutil.copy(os.path.join(BUILD, "lib", lib), os.path.join(into, "gradex", lib))
    return into


def rank_main(steps: int, sparsity: str, out: str) -> None:
    """One rank: the training loop; writes the Python files entered after step 2 to `out`."""
    import threading

    import torch
    import torch.distributed as dist

    import gradex.torch as gx

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 256, bias=False)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    state = gx.State(ddp, config={"GRADEX_POLICY": "fixed", "GRADEX_SPARSITY": sparsity,
                                  "GRADEX_WARMUP_STEPS": "0"}, optimizer=opt)
    ddp.register_comm_hook(state, gx.hook)
    package_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(gx.__file__))))
    entered: Set[str] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> Optional[Any]:
        name = frame.f_code.co_filename
        if event == "call" and name.startswith(package_dir):
            entered.add("python/" + os.path.relpath(name, package_dir))
        return None

    generator = torch.Generator().manual_seed(dist.get_rank())
    for step in range(steps):
        if step == 2:
            sys.setprofile(profile)
            threading.setprofile(profile)
        opt.zero_grad()
        ddp(torch.randn(32, 1024, generator=generator)).square().mean().backward()
        opt.step()
    sys.setprofile(None)
    threading.setprofile(None)
    with open(out, "w") as f:
        json.dump(sorted(entered), f)
    dist.destroy_process_group()


def run(steps: int, sparsity: str, package_root: str, gcda_dir: str, python_out: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([package_root, ROOT]), RANK=str(rank), WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GCOV_PREFIX=gcda_dir,
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-m", "bench.experiments.journey_files", "--rank-steps",
                                       str(steps), "--rank-sparsity", sparsity, "--rank-out", python_out + f".{rank}"],
                                      env=env, cwd=ROOT))
    for p in procs:
        if p.wait(timeout=600) != 0:
            raise SystemExit(f"journey: a rank exited with {p.returncode}")


def line_counts(gcda_dir: str) -> Dict[str, Dict[int, int]]:
    """{source file under ROOT: {line: count}} from every .gcda under gcda_dir."""
    counts: Dict[str, Dict[int, int]] = collections.defaultdict(dict)
    for directory, _, files in os.walk(gcda_dir):
        for name in files:
            if not name.endswith(".gcda"):
                continue
            gcda = os.path.join(directory, name)
            object_path = os.path.relpath(gcda, gcda_dir)[:-len(".gcda")]
            shutil.copy("/" + object_path + ".gcno", gcda[:-len(".gcda")] + ".gcno")
            report = subprocess.run(["gcov", "--json-format", "--stdout", "-o", directory, gcda],
                                    capture_output=True, text=True, check=True, cwd=directory).stdout
            for line in filter(str.strip, report.splitlines()):
                for source in json.loads(line)["files"]:
                    path = source["file"]
                    rel = os.path.relpath(path, ROOT)
                    if not path.startswith(ROOT + "/") or rel.startswith((".venv/", "build")):
                        continue  # torch's headers, generated files
                    for entry in source["lines"]:
                        counts[rel][entry["line_number"]] = counts[rel].get(entry["line_number"], 0) + entry["count"]
    return counts


def grown(short: Dict[str, Dict[int, int]], long: Dict[str, Dict[int, int]], at_least: int) -> List[str]:
    """The files of which some line ran at least `at_least` more times in the longer run (once per extra step
    for code every step runs); what runs by the clock (the stall inspector, late TCP pacing) and grew less is
    left out."""
    return sorted(f for f, lines in long.items()
                  if any(count - short.get(f, {}).get(line, 0) >= at_least for line, count in lines.items()))


def classify(files: List[str]) -> Dict[str, List[str]]:
    groups: Dict[str, List[str]] = {"orchestration": [], "orchestration headers": [], "leaf libraries": [],
                                    "leaf headers": []}
    for f in files:
        header = f.endswith(".h")
        where = "orchestration" if f.startswith(ORCHESTRATION) else "leaf libraries"
        if header:
            where = "orchestration headers" if where == "orchestration" else "leaf headers"
        groups[where].append(f)
    return groups


def measure(path: str, steps: int, package_root: str, work: str) -> Dict[str, List[str]]:
    """The files one step of a `path` tensor enters, grouped (classify)."""
    counts: Dict[int, Dict[str, Dict[int, int]]] = {}
    python_files: Set[str] = set()
    for n in (steps, 2 * steps):
        gcda_dir = os.path.join(work, f"{path}-gcda{n}")
        python_out = os.path.join(work, f"{path}-python{n}")
        run(n, PATH_SPARSITY[path], package_root, gcda_dir, python_out)
        counts[n] = line_counts(gcda_dir)
        for rank in range(2):
            with open(f"{python_out}.{rank}") as f:
                python_files.update(json.load(f))
    cpp = grown(counts[steps], counts[2 * steps], at_least=steps)  # once per extra step, on one rank at least
    return classify(sorted(set(cpp) | python_files))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--paths", default="dgc,fp16", help=f"comma-separated, of {', '.join(PATH_SPARSITY)}")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", default=None, help="a JSON result file to write")
    parser.add_argument("--rank-steps", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--rank-sparsity", default="", help=argparse.SUPPRESS)
    parser.add_argument("--rank-out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_steps:
        rank_main(args.rank_steps, args.rank_sparsity, args.rank_out)
        return
    paths = args.paths.split(",")
    unknown = [p for p in paths if p not in PATH_SPARSITY]
    if unknown:
        parser.error(f"--paths: {', '.join(unknown)} not one of {', '.join(PATH_SPARSITY)}")
    build()
    measured: Dict[str, Dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="gradex-journey-") as work:
        root = package(os.path.join(work, "package"))
        for path in paths:
            groups = measure(path, args.steps, root, work)
            measured[path] = {"counts": {k: len(v) for k, v in groups.items()}, "files": groups}
            print(f"{path}: " + ", ".join(f"{name} {len(files)}" for name, files in groups.items()))
            for name, files in groups.items():
                print(f"  {name}: {len(files)}")
                for source in files:
                    print(f"    {source}")
    if args.out:
        results.write(args.out, {"steps": [args.steps, 2 * args.steps], "paths": measured},
                      link="loopback, 2 ranks")


if __name__ == "__main__":
    main()
