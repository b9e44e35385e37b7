"""The shipped default, GRADEX_POLICY=auto, under the README's lines on real processes: with SGD momentum and with
AdamW (optimizer= given, so gradex owns or adds no momentum as the optimizer needs), every rank ends with the same
bits and training follows plain DDP with the same optimizer. conftest.py runs the other plugin tests under the
fixed policy, so this file names auto itself; auto is the registry's default (checked here)."""
import torch_ranks as ranks

STEPS = 40
_ENV = {"GRADEX_POLICY": "auto", "GRADEX_TIMEOUT_S": "60", "GRADEX_POLICY_INTERVAL": "10"}


def _model():
    import torch
    torch.manual_seed(0)
    # 64 x 512 and 512 x 512 are above every dense threshold: the planner has large tensors to choose for.
    return torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.Tanh(), torch.nn.Linear(512, 512),
                               torch.nn.Tanh(), torch.nn.Linear(512, 10))


def _train(rank, world, optimizer):
    import hashlib

    import torch
    import torch.nn.functional as F
    import gradex.torch as gx

    def make_optimizer(params):
        if optimizer == "sgd":
            return torch.optim.SGD(params, lr=0.05, momentum=0.9)
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)

    def batches():
        gen = torch.Generator().manual_seed(200 + rank)
        w = torch.randn(64, 10, generator=torch.Generator().manual_seed(7))  # one task shared by the ranks
        for _ in range(STEPS):
            x = torch.randn(32, 64, generator=gen)
            yield x, (x @ w).argmax(dim=1)

    def train(hooked):
        model = _model()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = make_optimizer(model.parameters())
        state = None
        if hooked:
            state = gx.State(ddp, optimizer=opt)
            ddp.register_comm_hook(state, gx.hook)
        losses = []
        for x, y in batches():
            opt.zero_grad()
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        plan = gx.explain(state) if hooked else ""
        if state:
            state.close()
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
        return losses, digest, plan

    ddp_losses, _, _ = train(False)
    gx_losses, digest, plan = train(True)
    return {"ddp": ddp_losses, "gradex": gx_losses, "digest": digest, "plan": plan}


def _check(optimizer):
    out = ranks.run(_train, 2, env=_ENV, args=(optimizer,), timeout=300)
    assert out[0]["digest"] == out[1]["digest"], "ranks ended with different parameters"
    r = out[0]
    assert r["plan"].startswith("GRADEX_POLICY=auto"), r["plan"][:300]
    first, ddp_last, gx_last = r["ddp"][0], sum(r["ddp"][-5:]) / 5, sum(r["gradex"][-5:]) / 5
    print(f"\n{optimizer}: loss {first:.4f} -> DDP {ddp_last:.4f}, gradex auto {gx_last:.4f}")
    assert ddp_last < 0.8 * first, r["ddp"]  # the task is learnt: the comparison below means something
    # Training like the dense method: the last steps' mean loss within 5 % of DDP's, same optimizer.
    assert abs(gx_last - ddp_last) <= 0.05 * ddp_last, (r["ddp"][-5:], r["gradex"][-5:])


def test_auto_is_the_registry_default(monkeypatch):
    import gradex

    monkeypatch.delenv("GRADEX_POLICY", raising=False)  # conftest's fixed, for the other files
    line = next(line for line in gradex.describe_config().splitlines() if line.startswith("GRADEX_POLICY="))
    assert line.split()[0] == "GRADEX_POLICY=auto" and "[default" in line, line


def test_default_policy_with_sgd_momentum_trains_like_ddp():
    _check("sgd")


def test_default_policy_with_adamw_trains_like_ddp():
    _check("adamw")
