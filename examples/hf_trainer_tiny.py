"""The Hugging Face Trainer with gradex: a small BERT classifier built from a config (nothing downloaded), trained
data-parallel on CPU ranks with gradex's comm hook and SGD with momentum, which gradex takes over (DGC's
momentum correction), exactly as gx.State(ddp, optimizer=opt) does in plain PyTorch.

The change from a plain Trainer run is the marked line: callbacks=[CommHook()]. Run on 2 local processes:

    .venv/bin/torchrun --nproc-per-node 2 examples/hf_trainer_tiny.py

The task: sequences of 16 tokens of a 32-token vocabulary, labelled by whether their first token is below 16.
tests/python/test_integration_momentum.py calls train() from here.
"""
import argparse
import os
import tempfile

import torch
import transformers

import gradex.torch as gx
from gradex.torch.transformers import CommHook

VOCAB, LENGTH = 32, 16


def build_model(seed=0):
    """A 2-layer BERT small enough for a CPU test; its 64x256 and 256x64 feed-forward weights reach DGC under
    GRADEX_POLICY=fixed (16,384 elements each), the rest stays dense."""
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=256, max_position_embeddings=LENGTH, num_labels=2)
    torch.manual_seed(seed)
    return transformers.BertForSequenceClassification(config)


class Sequences(torch.utils.data.Dataset):
    def __init__(self, count, seed):
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, VOCAB, (count, LENGTH), generator=gen)
        self.labels = (self.ids[:, 0] < VOCAB // 2).long()

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(LENGTH, dtype=torch.long),
                "labels": self.labels[i]}


def train(out_dir, steps=60, seed=0, config=None):
    """Trains on this process's share; returns (trainer, the CommHook). The gradex State stays open:
    gx.stats(hook.gradex_state) reads its counters; close it when done."""
    model = build_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    args = transformers.TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=16, max_steps=steps, use_cpu=True, ddp_backend="gloo",
        lr_scheduler_type="constant", max_grad_norm=0.0, report_to="none", save_strategy="no", logging_steps=5,
        disable_tqdm=True, dataloader_num_workers=0, seed=seed)
    hook = CommHook(config=config)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Sequences(steps * 64, seed),
                                   optimizers=(opt, None),
                                   callbacks=[hook])  # gradex: the one added line
    trainer.train()
    return trainer, hook


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as out_dir:
        trainer, hook = train(out_dir, steps=args.steps,
                              config={"GRADEX_SPARSITY": "0.99", "GRADEX_WARMUP_STEPS": "10"})
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        if trainer.is_world_process_zero():
            s = gx.stats(hook.gradex_state)
            print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {args.steps} steps; gradex sent {s['bytes_sent']} B "
                  f"vs {s['dense_bytes']} B dense (ratio {s['compression_ratio']:.1f})", flush=True)
        hook.gradex_state.close()


if __name__ == "__main__" and "RANK" in os.environ:
    main()
elif __name__ == "__main__":
    raise SystemExit("launch with torchrun, e.g. torchrun --nproc-per-node 2 examples/hf_trainer_tiny.py")
