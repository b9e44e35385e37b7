"""A small decoder-only transformer LM in plain torch.nn (pre-norm blocks, learned positions, tied input
and output embeddings, output scaled by d^-1/2)."""
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab=256, d=128, layers=2, heads=4, context=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(context, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.register_buffer("mask", torch.triu(torch.full((context, context), float("-inf")), 1),
                             persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.embed(idx) + self.pos[:t]
        for b in self.blocks:
            x = b(x, self.mask[:t, :t])
        # Tied output embedding, scaled so that initial logits are O(1) (embeddings are N(0, 1)).
        return (self.ln(x) @ self.embed.weight.t()) * self.embed.embedding_dim ** -0.5


def make(seed=0, **kw):
    torch.manual_seed(seed)
    return TinyLM(**kw)


@torch.no_grad()
def held_out_loss(model, batches):
    model.eval()
    total = 0.0
    for x, y in batches:
        total += nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1)).item()
    model.train()
    return total / len(batches)
