"""The race's decoder-only transformer LM in plain torch.nn: pre-norm blocks, learned positions, separate
input embedding and output projection (untied).

The default shape (vocabulary 16,384, d 256, 3 layers, 4 heads, context 64) has 10,774,784 parameters,
78% of them in the embedding and the output projection: cheap to compute for a short context and a small batch,
but every one of them is a gradient to exchange. That is the point of the race: a step's exchange, not its
compute, sets the pace on a slow link.
"""
import torch
from torch import nn

DEFAULTS = {"vocab": 16384, "d": 256, "layers": 3, "heads": 4, "context": 64}


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


class LM(nn.Module):
    def __init__(self, vocab=16384, d=256, layers=3, heads=4, context=64):
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, d)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.pos = nn.Parameter(torch.zeros(context, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab, bias=False)
        # A plain attribute, not a buffer: the causal mask is a constant, and the methods that average or
        # exchange buffers (LocalSGD, DiLoCo) must neither send it nor do arithmetic on its -inf entries.
        self.mask = torch.ones(context, context, dtype=torch.bool).triu(1)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.embed(idx) + self.pos[:t]
        for b in self.blocks:
            x = b(x, self.mask[:t, :t])
        return self.out(self.ln(x))


def make(seed=0, **kw):
    torch.manual_seed(seed)
    return LM(**{**DEFAULTS, **kw})


def parameter_count(model):
    return sum(p.numel() for p in model.parameters())


def loss_of(model, x, y):
    return nn.functional.cross_entropy(model(x).reshape(-1, model.vocab), y.reshape(-1))


@torch.no_grad()
def held_out_loss(model, batches):
    """Mean cross-entropy (nats per token) over the fixed held-out batches."""
    was_training = model.training
    model.eval()
    total = sum(loss_of(model, x, y).item() for x, y in batches)
    model.train(was_training)
    return total / len(batches)
