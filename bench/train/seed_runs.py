"""The seeds loop shared by the race's rank programs (train_rank.py for PyTorch, keras_rank.py for Keras):
one training run per seed, rank 0 printing one RESULT line each (the fields the suite parses, then the
program's `extra` ones) and rewriting the results file after every seed, so that a later failure keeps
the earlier seeds' records."""
import json
import sys


def _fmt(value):
    return "nan" if value is None else f"{value:.6g}"


def run_seeds(args, data, rank, world, train_one_seed, extra=()):
    """Runs train_one_seed(args, seed, data, rank, world) for each of args.seeds; returns the records."""
    records = []
    for seed in (int(s) for s in args.seeds.split(",")):
        r = train_one_seed(args, seed, data, rank, world)
        records.append(r)
        if rank != 0:
            continue
        sys.stderr.write("\r\033[K" if sys.stderr.isatty() else "")
        fields = [f"seed={seed}", f"steps={r['steps']}", f"train_s={r['train_s']:.6g}"]
        fields += [f"{k}={_fmt(r[k])}" for k in ("time_to_target_s", "steps_to_target", "final_accuracy")]
        fields += [f"{k}={_fmt(r[k])}" for k in extra]
        print("RESULT " + " ".join(fields), flush=True)
        with open(args.out, "w") as f:
            json.dump({"task": args.task, "method": args.method, "target": args.target,
                       "config": vars(args), "seeds": records}, f)
    return records
