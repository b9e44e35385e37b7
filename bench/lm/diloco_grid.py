#!/usr/bin/env python3
"""DiLoCo's settings at the LM race's H, compared at equal inner steps: the race's transformer and corpus
(lm_rank.py --steps), P ranks on loopback in this namespace, one run per setting, the held-out loss of the
global model after the last step. Wall time plays no part (a shared machine's noise cannot move the
result); bytes are what gradex itself counted on rank 0 (a DiLoCo run's `bytes_sent`) or, for DDP, the
fp32 ring allreduce's 2(P-1)/P x 4 bytes per parameter per step.

    .venv/bin/python -m bench.lm.diloco_grid --steps 256 --ranks 2 --grid defaults
    .venv/bin/python -m bench.lm.diloco_grid --only "ddp;diloco8 lr=0.7 m=0.9"

Each setting is "<method> key=value ..." with method one of ddp, nocomm, diloco4, diloco8, diloco32,
topk, and keys lr (outer), m (outer momentum), H, F (fragments), d (delay), density (topk), keep (the final
synchronize(): 1 merges every rank's steps since each fragment's last sync, 0 drops them). Unset keys take
the race's values (lm_rank.py: H 32, 4 fragments, delay 2, outer lr 0.7, momentum 0.5, density 0.01, keep 1).
Prints one line per run and a Markdown table; writes every curve to --out (JSON).
"""
import argparse
import json
import os
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
from bench.lm import corpus  # noqa: E402
from bench.harness import network  # noqa: E402
from bench.harness import results as result_files  # noqa: E402
from bench.lm import race  # noqa: E402

METHOD = {"ddp": "ddp", "nocomm": "nocomm", "diloco4": "gradex_diloco4", "diloco8": "gradex_diloco8",
          "diloco32": "gradex_diloco32", "topk": "gradex_diloco_topk"}
OPTION = {"lr": "--outer-lr", "m": "--outer-momentum", "H": "--period", "F": "--fragments", "d": "--delay",
          "density": "--density", "keep": "--keep-local"}

# Named grids. "defaults": outer lr x momentum at the race's H in 8 bits, then the codecs at the race's
# published settings and at the grid's best (chosen by the caller after reading the first part).
GRIDS = {
    "lrm": ["ddp", "nocomm"] + [f"diloco8 lr={lr} m={m}" for lr in (0.4, 0.7, 1.0) for m in (0.0, 0.5, 0.9)],
    "codecs": ["diloco32", "diloco4", "topk density=0.01", "topk density=0.03"],
}


def parse_setting(text):
    words = text.split()
    if not words or words[0] not in METHOD:
        raise ValueError(f"setting {text!r}: the first word must be one of {', '.join(METHOD)}")
    options = []
    for word in words[1:]:
        key, _, value = word.partition("=")
        if key not in OPTION or not value:
            raise ValueError(f"setting {text!r}: {word!r} is not key=value with key one of {', '.join(OPTION)}")
        float(value)  # a number, or ValueError naming it
        options += [OPTION[key], value]
    return METHOD[words[0]], options


def run(setting, args, data_path, net):
    method, options = parse_setting(setting)
    ns = argparse.Namespace(python=args.python, budget=0, method_slack=args.timeout, hosts=args.ranks,
                            rank_args=" ".join([f"--steps {args.steps}", f"--eval-steps {args.eval_steps}",
                                                *options, args.rank_args]))
    os.makedirs(args.log_dir, exist_ok=True)
    t0 = time.monotonic()
    out = race.run_method(net, method, ns, data_path, args.log_dir)
    out["setting"], out["wall_s"] = setting, time.monotonic() - t0
    return out


def bytes_per_rank(result, steps, ranks):
    if result["method"] == "ddp":
        return 2 * (ranks - 1) / ranks * 4 * result["parameters"] * steps
    if result["method"] == "nocomm":
        return 0
    return result.get("gradex_bytes_sent_rank0")


def table(results, steps, ranks):
    ddp = next((r for r in results if r["method"] == "ddp"), None)
    lines = [f"| setting ({ranks} ranks, {steps} inner steps) | held-out loss | vs DDP | MB sent per rank |",
             "|---|---|---|---|"]
    for r in results:
        loss = r["curve"][-1][2]
        rel = f"{100 * (loss / ddp['curve'][-1][2] - 1):+.1f}%" if ddp else "-"
        b = bytes_per_rank(r, steps, ranks)
        lines.append(f"| {r['setting']} | {loss:.4f} | {rel} | {'-' if b is None else f'{b / 1e6:.1f}'} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grid", default="", help=f"named grids, comma-separated: {', '.join(GRIDS)}")
    p.add_argument("--only", default="", help="settings separated by ';' (instead of, or after, --grid)")
    p.add_argument("--steps", type=int, default=256)
    p.add_argument("--eval-steps", type=int, default=64)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--corpus-bytes", type=int, default=8 << 20)
    p.add_argument("--rank-args", default="", help="extra lm_rank.py options for every run")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one run may take")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--out", default=str(HERE.parents[1] / "build" / "bench-lm" / "diloco_grid.json"))
    p.add_argument("--log-dir", default=str(HERE.parents[1] / "build" / "bench-lm"))
    args = p.parse_args(argv)
    settings = [s for g in args.grid.split(",") if g for s in GRIDS[g]]
    settings += [s.strip() for s in args.only.split(";") if s.strip()]
    if not settings:
        p.error("nothing to run: give --grid and/or --only")
    for s in settings:
        try:
            parse_setting(s)
        except ValueError as e:
            p.error(str(e))
    os.makedirs(args.log_dir, exist_ok=True)
    data_path = os.path.join(args.log_dir, f"lm.corpus.{args.vocab}.{args.corpus_bytes}.pt")
    if not os.path.exists(data_path):
        corpus.save(corpus.build(args.vocab, args.corpus_bytes), data_path + ".tmp")
        os.replace(data_path + ".tmp", data_path)
    results = []
    if os.path.exists(args.out):  # runs accumulate: a later invocation adds settings to the same table
        with open(args.out) as f:
            old = json.load(f)
        if old.get("steps") == args.steps and old.get("ranks") == args.ranks:
            results = [r for r in old["results"] if r["setting"] not in settings]
    net = network.RootLoopback()
    for setting in settings:
        r = run(setting, args, data_path, net)
        results.append(r)
        print(f"[grid] {setting}: loss {r['curve'][-1][2]:.4f} "
              f"({r['wall_s']:.0f} s, {bytes_per_rank(r, args.steps, args.ranks)} B/rank)", flush=True)
        result_files.write(args.out, {"steps": args.steps, "ranks": args.ranks, "results": results},
                           link="loopback")
    print(table(results, args.steps, args.ranks))


if __name__ == "__main__":
    main()
