"""One small classifier trained the same way through plain PyTorch and through each framework integration, so
that whether the optimizer reaches gradex is all that can differ (tests/python/test_integration_momentum.py).

The task: 4 classes given by a random linear teacher on 16 latent Gaussian factors that 256 noisy features mix
(10 % of the labels flipped), an MLP 256-128-4 (its 32,768-element first weight goes DGC under
GRADEX_POLICY=fixed, the rest dense), SGD with momentum 0.9 at learning rate 0.01, one epoch of STEPS steps of BATCH examples per rank. Every integration sees the same
batches: rank r's step s takes examples [(W*s + r)*BATCH, (W*s + r + 1)*BATCH) of the seed's order, which is
what a sequential sampler sharded by Accelerate (the Trainer) hands out, and what the other runs are given
explicitly. Each run returns its test accuracy, its flat parameters, whether the ranks ended bit-identical,
and gradex's statistics.

Run as a script, it measures every integration against the plain runs over three seeds (2 ranks):
    .venv/bin/python tests/python/integration_parity.py [SEEDS...] [--skip trainer]
"""
import os
import sys

STEPS = 64
BATCH = 16
FEATURES, HIDDEN, CLASSES = 256, 128, 4
LATENT, NOISE = 16, 0.5  # the features mix 16 latent factors, which the teacher labels, plus noise
LR = 0.01
# The settings: 99 % after 10 dense warm-up steps (the harness adds GRADEX_POLICY=fixed).
DGC = {"GRADEX_SPARSITY": "0.99", "GRADEX_WARMUP_STEPS": "10", "GRADEX_TIMEOUT_S": "60"}


def data(seed, world):
    """(train_x, train_y, test_x, test_y): the train set in the order the batches take it."""
    import torch
    gen = torch.Generator().manual_seed(1000 + seed)
    teacher = torch.randn(LATENT, CLASSES, generator=gen)
    mixing = torch.randn(LATENT, FEATURES, generator=gen) / LATENT ** 0.5
    n_train = STEPS * BATCH * world
    z = torch.randn(n_train + 1024, LATENT, generator=gen)
    x = z @ mixing + NOISE * torch.randn(n_train + 1024, FEATURES, generator=gen)
    y = (z @ teacher).argmax(1)
    flip = torch.rand(len(y), generator=gen) < 0.1
    y = torch.where(flip, torch.randint(0, CLASSES, (len(y),), generator=gen), y)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def batch_positions(rank, world):
    """The train-set positions rank `rank` takes, step after step."""
    return [i for s in range(STEPS) for i in range((world * s + rank) * BATCH, (world * s + rank + 1) * BATCH)]


class Classifier:
    """Builds the model: the same initial weights for a seed in every run."""

    @staticmethod
    def net(seed):
        import torch
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(),
                                   torch.nn.Linear(HIDDEN, CLASSES))


def _module_with_loss(seed):
    """The classifier as a module that returns {"loss", "logits"} (what the Hugging Face Trainer calls)."""
    import torch

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = Classifier.net(seed)

        def forward(self, x, labels=None):
            logits = self.net(x)
            out = {"logits": logits}
            if labels is not None:
                out["loss"] = torch.nn.functional.cross_entropy(logits, labels)
            return out

    return WithLoss()


def _result(net, seed, world, helper=None):
    import torch
    import torch.distributed as dist
    import gradex.torch as gx
    _, _, test_x, test_y = data(seed, world)
    with torch.no_grad():
        acc = float((net(test_x).argmax(1) == test_y).float().mean())
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    # numpy, not a tensor: torch_ranks' result queue would share a tensor's memory with a process that exits.
    out = {"acc": acc, "flat": flat.numpy(), "identical": all(torch.equal(g, gathered[0]) for g in gathered)}
    if helper is not None:
        out["stats"] = gx.stats(helper)
    return out


def _steps(ddp, opt, seed, rank, world, backward):
    """STEPS optimizer steps on this rank's batches (batch_positions), `backward(loss)` as the framework does it."""
    import torch
    x, y, _, _ = data(seed, world)
    positions = torch.tensor(batch_positions(rank, world))
    for s in range(STEPS):
        index = positions[s * BATCH:(s + 1) * BATCH]
        opt.zero_grad()
        backward(ddp(x[index], labels=y[index])["loss"])
        opt.step()


def plain(rank, world, seed, with_optimizer, env=DGC):
    """Plain PyTorch: DDP and the README's two lines (with_optimizer: gx.State(ddp, optimizer=opt))."""
    import torch
    import gradex.torch as gx
    os.environ.update(env)
    model = _module_with_loss(seed)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    state = gx.State(ddp, optimizer=opt if with_optimizer else None)
    ddp.register_comm_hook(state, gx.hook)
    _steps(ddp, opt, seed, rank, world, lambda loss: loss.backward())
    out = _result(model.net, seed, world, state)
    state.close()
    return out


def accelerate(rank, world, seed, env=DGC):
    """Hugging Face Accelerate: prepare(model, opt), then the hook with the optimizer prepare() returned."""
    import torch
    from accelerate import Accelerator
    import gradex.torch as gx
    os.environ.update(env)
    accelerator = Accelerator(cpu=True)
    model = _module_with_loss(seed)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    ddp, opt = accelerator.prepare(model, opt)
    state = gx.State(ddp, optimizer=opt)  # opt: Accelerate's AcceleratedOptimizer around the SGD
    ddp.register_comm_hook(state, gx.hook)
    _steps(ddp, opt, seed, rank, world, accelerator.backward)
    out = _result(model.net, seed, world, state)
    state.close()
    return out


def trainer(rank, world, seed, out_dir, env=DGC):
    """The Hugging Face Trainer with gradex.torch.transformers.CommHook, a sequential sampler (so that its
    batches are batch_positions'), constant learning rate, no clipping, no weight decay."""
    import torch
    import transformers
    from gradex.torch.transformers import CommHook
    os.environ.update(env)
    x, y, _, _ = data(seed, world)

    class Examples(torch.utils.data.Dataset):
        def __len__(self):
            return len(y)

        def __getitem__(self, i):
            return {"x": x[i], "labels": y[i]}

    class SequentialTrainer(transformers.Trainer):
        def _get_train_sampler(self, *args, **kwargs):
            return torch.utils.data.SequentialSampler(self.train_dataset)

    model = _module_with_loss(seed)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    args = transformers.TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=BATCH, max_steps=STEPS, use_cpu=True, ddp_backend="gloo",
        lr_scheduler_type="constant", max_grad_norm=0.0, weight_decay=0.0, report_to="none", save_strategy="no",
        logging_strategy="no", disable_tqdm=True, remove_unused_columns=False, dataloader_num_workers=0,
        seed=seed)
    hook = CommHook()
    run = SequentialTrainer(model=model, args=args, train_dataset=Examples(), optimizers=(opt, None),
                            callbacks=[hook])
    run.train()
    out = _result(model.net, seed, world, hook.gradex_state)
    out["took_momentum"] = opt.param_groups[0]["momentum"] == 0.0  # gradex owns it while the State is open
    hook.gradex_state.close()
    return out


def lightning_script(seed, out_dir):
    """The command line of lightning_parity.py for `seed` (it writes out_dir/rank<r>.pt)."""
    return [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lightning_parity.py"),
            str(seed), out_dir]


def _pair(rank, world, seed, which, out_dir):
    reference = plain(rank, world, seed, True)
    if which == "accelerate":
        other = accelerate(rank, world, seed)
    elif which == "trainer":
        other = trainer(rank, world, seed, out_dir)
    elif which in ("plain", "none"):
        other = plain(rank, world, seed, False)
    else:
        raise ValueError(f"unknown integration {which!r}")
    return reference, other


def main(seeds, skip=()):
    """Prints each integration's accuracy against the plain runs', per seed (`skip`: integrations left out)."""
    import subprocess
    import tempfile
    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_ranks as ranks
    os.environ.setdefault("GRADEX_POLICY", "fixed")
    columns = [c for c in ("plain+opt", "plain", "accelerate", "trainer", "lightning") if c not in skip]
    print("seed  " + "  ".join(f"{c:>18}" for c in columns) + "   (accuracy, max |param - plain+opt's|)")
    for seed in seeds:
        row = {}
        for which in [w for w in ("plain", "accelerate", "trainer") if w not in skip]:
            with tempfile.TemporaryDirectory() as tmp:
                results = ranks.run(_pair, 2, args=(seed, which, tmp), timeout=600)
            reference, other = results[0]
            assert all(r[1]["identical"] and r[0]["identical"] for r in results)
            row["plain+opt"] = (reference["acc"], 0.0)
            row[which] = (other["acc"], float(abs(other["flat"] - reference["flat"]).max()))
        if "lightning" not in skip:
            with tempfile.TemporaryDirectory() as tmp:
                env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ranks.free_port()))
                for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
                    env.pop(name, None)
                subprocess.run(lightning_script(seed, tmp), env=env, check=True, capture_output=True, timeout=600)
                light = [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(2)]
                assert light[0]["identical"]
                row["lightning"] = (light[0]["acc"], float(abs(light[0]["flat"] - results[0][0]["flat"]).max()))
        print(f"{seed:4d}  " + "  ".join(f"{row[k][0]:9.3f} ({row[k][1]:6.1e})" for k in columns), flush=True)


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description="integration accuracy against plain PyTorch + gradex")
    parser.add_argument("seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--skip", action="append", default=[], help="plain, accelerate, trainer or lightning")
    options = parser.parse_args()
    main(options.seeds, options.skip)
