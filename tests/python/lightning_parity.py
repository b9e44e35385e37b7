"""integration_parity.py's classifier trained by PyTorch Lightning as a user writes it:

    strategy = DDPStrategy(process_group_backend="gloo", ddp_comm_state=gx.State(), ddp_comm_hook=gx.hook)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, callbacks=[CommHook()])

with SGD(momentum=0.9) from configure_optimizers (which runs after the State exists: CommHook hands it to the
State at on_fit_start) and each rank's batches as integration_parity.batch_positions gives them (Lightning's
distributed sampler off). Run as a script (Lightning's launcher re-runs it for every rank):
    lightning_parity.py SEED OUT_DIR
Every rank saves OUT_DIR/rank<r>.pt: accuracy, flat parameters, whether the ranks ended bit-identical, gradex's
statistics and the optimizer's momentum while gradex owned it.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import integration_parity as parity  # noqa: E402
import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
from pytorch_lightning.strategies import DDPStrategy  # noqa: E402

import gradex.torch as gx  # noqa: E402
from gradex.torch.lightning import CommHook  # noqa: E402


class Net(pl.LightningModule):
    def __init__(self, seed, out_dir):
        super().__init__()
        self.net = parity.Classifier.net(seed)
        self.seed, self.out_dir = seed, out_dir

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=parity.LR, momentum=0.9)

    def train_dataloader(self):
        x, y, _, _ = parity.data(self.seed, 2)
        mine = parity.batch_positions(self.trainer.global_rank, 2)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[mine], y[mine]),
                                           batch_size=parity.BATCH, shuffle=False)

    def on_train_end(self):
        import torch.distributed as dist
        state = self.trainer.strategy._ddp_comm_state
        out = parity._result(self.net, self.seed, dist.get_world_size(), state)
        out["momentum_while_owned"] = self.trainer.optimizers[0].param_groups[0]["momentum"]
        out["rank"] = dist.get_rank()
        torch.save(out, os.path.join(self.out_dir, f"rank{dist.get_rank()}.pt"))


def main():
    seed, out_dir = int(sys.argv[1]), sys.argv[2]
    os.environ.update(parity.DGC)
    os.environ.setdefault("GRADEX_POLICY", "fixed")
    torch.set_num_threads(1)
    strategy = DDPStrategy(process_group_backend="gloo", ddp_comm_state=gx.State(), ddp_comm_hook=gx.hook)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, callbacks=[CommHook()],
                         max_steps=parity.STEPS, use_distributed_sampler=False, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Net(seed, out_dir))


if __name__ == "__main__":
    main()
