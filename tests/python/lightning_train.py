"""Trains a small model with PyTorch Lightning's DDPStrategy and the gradex comm hook, as a user would:

    strategy = DDPStrategy(process_group_backend="gloo", ddp_comm_state=gx.State(), ddp_comm_hook=gx.hook)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, callbacks=[CommHook()], ...)

(CommHook: Lightning registers comm hooks only on CUDA devices; see gradex/torch/lightning.py.)

Run by tests/python/test_lightning.py as a script (Lightning's default launcher re-runs the script for every
rank). Usage: lightning_train.py OUT_DIR {popen|spawn} {hook|localsgd|scalars}. Every rank writes
OUT_DIR/rank<r>.json with whether all ranks ended with bit-identical parameters, gradex's statistics and the final
loss. "scalars" is "hook" with a TensorBoardLogger in OUT_DIR and gradex.torch.lightning.Scalars every 4 steps.
"""
import json
import os
import sys

import torch
import pytorch_lightning as pl
from pytorch_lightning.strategies import DDPStrategy

import gradex.torch as gx
from gradex.torch.lightning import CommHook, Scalars

STEPS = 12


class Net(pl.LightningModule):
    def __init__(self, out_dir, mode):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.Tanh(), torch.nn.Linear(128, 4))
        self.out_dir = out_dir
        self.mode = mode
        self.lsgd = None

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        # The optimizer owns momentum: the hook's State is built before it exists (no optimizer=), so gradex
        # adds none; under LocalSGD the optimizer owns it anyway.
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def on_fit_start(self):
        if self.mode == "localsgd":  # the documented recipe: LocalSGD around Lightning's DDP module
            self.lsgd = gx.LocalSGD(self.trainer.strategy.model, period=3, warmup_steps=3)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.lsgd is not None:
            self.lsgd.step()

    def on_train_end(self):
        import torch.distributed as dist
        flat = torch.cat([p.detach().reshape(-1) for p in self.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, flat)
        helper = self.lsgd if self.lsgd is not None else self.trainer.strategy._ddp_comm_state
        stats = gx.stats(helper)
        with torch.no_grad():
            x, y = dataset()[:]
            loss = float(torch.nn.functional.cross_entropy(self.net(x), y))
        result = {"rank": dist.get_rank(), "identical": all(torch.equal(g, gathered[0]) for g in gathered),
                  "stats": stats, "last": gx.stats(helper, last_step=True), "loss": loss, "pid": os.getpid()}
        if self.lsgd is None:
            result["plan"] = gx.explain(helper)
        with open(os.path.join(self.out_dir, f"rank{dist.get_rank()}.json"), "w") as f:
            json.dump(result, f)


def dataset():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(512, 256, generator=gen)
    y = (x[:, :4].argmax(1)).long()
    return torch.utils.data.TensorDataset(x, y)


def main():
    out_dir, launcher, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    torch.set_num_threads(1)
    callbacks = []
    logger = False
    if mode == "scalars":
        # TensorBoard would import TensorFlow, which aborts beside torch (tests/python/test_scalars.py).
        import types
        sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
        from pytorch_lightning.loggers import TensorBoardLogger
        logger = TensorBoardLogger(out_dir, name="tb")
        callbacks.append(Scalars(every_n_steps=4))
        os.environ.setdefault("GRADEX_SPARSITY", "0.99")
    if mode in ("hook", "scalars"):
        strategy = DDPStrategy(process_group_backend="gloo", ddp_comm_state=gx.State(), ddp_comm_hook=gx.hook,
                               start_method=launcher)
        callbacks.append(CommHook())
    else:
        strategy = DDPStrategy(process_group_backend="gloo", start_method=launcher)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, callbacks=callbacks, max_steps=STEPS,
                         logger=logger,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=16, shuffle=True)
    trainer.fit(Net(out_dir, mode), loader)


if __name__ == "__main__":
    main()
