"""The delayed exchange (GRADEX_DELAY) through the DDP hook, real processes over gloo and gradex: the gradient
the hook's future resolves with is g_t + (avg_{t-D} - g_{t-D}) exactly (integer data: every sum is exact, the
reference average is gloo's), gx.synchronize() leaves every rank with the same parameters after delayed steps
under SGD momentum, and the hook's state_dict carries the averages in flight (a resumed run continues bit for
bit)."""
import pytest

import torch_ranks as ranks

EXACT = {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "0", "GRADEX_MOMENTUM": "0", "GRADEX_TIMEOUT_S": "60"}


def _integer_batch(gen):
    import torch
    x = torch.randint(-4, 5, (8, 64), generator=gen).float()
    weight = torch.randint(-3, 4, (8, 300), generator=gen).float()
    return x, weight


def _corrected_vs_reference(rank, world, delay, steps):
    """Per step, the largest difference between the hook's gradient and the reference correction computed
    here from this rank's own gradients and gloo's averages."""
    import copy

    import torch
    import torch.distributed as dist
    import gradex.torch as gx

    torch.manual_seed(0)
    model = torch.nn.Linear(64, 300)
    reference = copy.deepcopy(model)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = gx.State(ddp)
    ddp.register_comm_hook(state, gx.hook)
    gen = torch.Generator().manual_seed(100 + rank)
    local, averages, errors = [], [], []
    for t in range(steps):
        x, weight = _integer_batch(gen)
        ddp.zero_grad()
        (ddp(x) * weight).sum().backward()
        reference.zero_grad()
        (reference(x) * weight).sum().backward()
        own = [p.grad.clone() for p in reference.parameters()]
        avg = [g.clone() for g in own]
        for a in avg:
            dist.all_reduce(a)
            a /= world
        local.append(own)
        averages.append(avg)
        step_errors = []
        for i, p in enumerate(model.parameters()):
            expected = own[i] + (averages[t - delay][i] - local[t - delay][i]) if t >= delay else own[i]
            step_errors.append(float((p.grad - expected).abs().max()))
        errors.append(max(step_errors))
    differs = any(float((a - o).abs().max()) > 0 for a, o in zip(averages[-1], local[-1]))
    chosen = state.engine.delay()
    state.close()
    return {"errors": errors, "differs": differs, "delay": chosen}


@pytest.mark.parametrize("delay", [1, 2])
def test_hook_gradient_is_the_exact_correction(delay):
    env = dict(EXACT, GRADEX_DELAY=str(delay))
    for result in ranks.run(_corrected_vs_reference, 2, env=env, args=(delay, 6)):
        assert result["delay"] == delay
        assert result["differs"], "local gradients equal the average: the test cannot fail"
        assert result["errors"] == [0.0] * 6, result["errors"]


def _synchronize_then_compare(rank, world):
    import torch
    import torch.distributed as dist
    import gradex.torch as gx

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    state = gx.State(ddp, optimizer=opt)
    ddp.register_comm_hook(state, gx.hook)
    gen = torch.Generator().manual_seed(7 + rank)

    def spread():
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        low, high = flat.clone(), flat.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        return float((high - low).max())

    for _ in range(5):
        x = torch.randn(16, 32, generator=gen)
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
    before = spread()
    # What synchronize must leave everywhere: the mean of the ranks' parameters (one flat average of every
    # parameter, each at its own offset).
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    mean = flat.clone()
    dist.all_reduce(mean)
    mean /= world
    gx.synchronize(state)
    after = spread()
    off_mean = float((torch.cat([p.detach().flatten() for p in model.parameters()]) - mean).abs().max())
    # Training goes on after the drain.
    x = torch.randn(16, 32, generator=gen)
    opt.zero_grad()
    ddp(x).square().mean().backward()
    opt.step()
    state.close()
    return {"before": before, "after": after, "off_mean": off_mean}


def test_synchronize_leaves_every_rank_the_same_model():
    env = dict(EXACT, GRADEX_DELAY="1")
    for result in ranks.run(_synchronize_then_compare, 2, env=env):
        assert result["before"] > 0, "the ranks never differed: the test cannot fail"
        assert result["after"] == 0.0, result
        assert result["off_mean"] < 1e-6, result  # every parameter got its own slice of the average back


def _batchnorm_steps(rank, world, broadcast_buffers):
    """A BatchNorm model under GRADEX_DELAY=1: the ranks' buffers (running statistics, from their own
    batches) before and after gx.synchronize, and the warnings the gradex logger gave."""
    import logging

    import torch
    import torch.distributed as dist
    import gradex.torch as gx

    said = []

    class Collect(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    logging.getLogger("gradex").addHandler(Collect(level=logging.INFO))
    logging.getLogger("gradex").setLevel(logging.INFO)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=broadcast_buffers)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    state = gx.State(ddp, optimizer=opt)
    ddp.register_comm_hook(state, gx.hook)
    gen = torch.Generator().manual_seed(11 + rank)

    def buffer_spread():
        flat = torch.cat([b.detach().double().flatten() for b in model.buffers()])
        low, high = flat.clone(), flat.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        return float((high - low).max())

    for _ in range(4):
        x = torch.randn(16, 32, generator=gen) + rank
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
    before = buffer_spread()
    rank0 = [b.clone() for b in model.buffers()]
    for b in rank0:
        dist.broadcast(b, src=0)
    gx.synchronize(state)
    equal_to_rank0 = all(torch.equal(b, r) for b, r in zip(model.buffers(), rank0))
    state.close()
    return {"before": before, "after": buffer_spread(), "equal_to_rank0": equal_to_rank0,
            "warned": [m for m in said if "broadcast_buffers" in m],
            "statistics": [m for m in said if "update_bn" in m]}


@pytest.mark.parametrize("broadcast_buffers", [False, True])
def test_synchronize_gives_every_rank_rank0s_buffers_and_the_log_names_the_broadcast(broadcast_buffers):
    env = dict(EXACT, GRADEX_DELAY="1")
    for rank, result in enumerate(ranks.run(_batchnorm_steps, 2, env=env, args=(broadcast_buffers,))):
        # Each forward updates the running statistics from the rank's own batch (DDP's broadcast comes
        # before it), so the ranks' buffers differ after a step either way.
        assert result["before"] > 0, "the ranks' buffers never differed: the test cannot fail"
        assert result["after"] == 0.0 and result["equal_to_rank0"], result
        # The broadcast at every forward is a latency a step that the delay cannot hide: said once, by name.
        assert len(result["warned"]) == (1 if broadcast_buffers else 0), result["warned"]
        if broadcast_buffers:
            assert "broadcast_buffers=False" in result["warned"][0] and "GRADEX_DELAY=1" in result["warned"][0]
        # The synchronized model's running statistics are rank 0's, for rank 0's parameters: said once, with
        # the remedy.
        assert len(result["statistics"]) == 1 and "BatchNorm layers (1)" in result["statistics"][0], result["statistics"]


def _resume(rank, world):
    """Six steps in one run against three, a checkpoint (hook state, model, optimizer), and three more in a
    new State and model restored from it: the gradients of the last three steps must be equal bit for bit."""
    import copy

    import torch
    import gradex.torch as gx

    def make(seed_state=None):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        state = gx.State(ddp, optimizer=opt)
        ddp.register_comm_hook(state, gx.hook)
        return model, ddp, opt, state

    def steps(ddp, opt, model, first, count, out):
        for t in range(first, first + count):
            gen = torch.Generator().manual_seed(1000 * t + rank)
            x = torch.randn(16, 32, generator=gen)
            opt.zero_grad()
            ddp(x).square().mean().backward()
            out.append([p.grad.clone() for p in model.parameters()])
            opt.step()

    model, ddp, opt, state = make()
    whole = []
    steps(ddp, opt, model, 0, 6, whole)
    state.close()

    model, ddp, opt, state = make()
    part = []
    steps(ddp, opt, model, 0, 3, part)
    saved = {"hook": state.state_dict(), "model": copy.deepcopy(model.state_dict()),
             "opt": copy.deepcopy(opt.state_dict())}
    state.close()

    model, ddp, opt, state = make()
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    state.load_state_dict(saved["hook"])
    steps(ddp, opt, model, 3, 3, part)
    state.close()
    return all(torch.equal(a, b) for s, r in zip(whole, part) for a, b in zip(s, r))


def test_hook_checkpoint_with_exchanges_in_flight_resumes_bit_for_bit():
    env = dict(EXACT, GRADEX_DELAY="2")
    assert ranks.run(_resume, 2, env=env, timeout=240) == [True, True]


def _auto_delay_explained(rank, world, optimizer_name):
    """gx.explain's delay line after GRADEX_DELAY=auto has decided (step 10), under the named torch optimizer."""
    import torch
    import gradex.torch as gx

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64, bias=False), torch.nn.Tanh(),
                                torch.nn.Linear(64, 4, bias=False))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    if optimizer_name == "muon":
        opt = torch.optim.Muon(ddp.parameters(), lr=0.02)
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    state = gx.State(ddp, optimizer=opt)
    ddp.register_comm_hook(state, gx.hook)
    gen = torch.Generator().manual_seed(3 + rank)
    for _ in range(12):
        x = torch.randn(16, 32, generator=gen)
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
    text = gx.explain(state)
    chosen = state.engine.delay()
    state.close()
    return {"delay_line": next(line for line in text.splitlines() if line.startswith("delay: D=")),
            "delay": chosen}


def test_auto_keeps_no_delay_under_muon():
    """Muon orthogonalises its momentum: the correction g_t + avg_{t-D} - g_{t-D} would not carry through it, and
    the ranks' models would drift apart, so the plugin tells the engine (GRADEX_OPTIMIZER=other) and auto keeps
    D = 0, saying why; under SGD momentum the same run decides from its measured wait instead."""
    env = {"GRADEX_DELAY": "auto", "GRADEX_TIMEOUT_S": "60"}
    held = "kept at 0: the optimizer builds its own update"
    for result in ranks.run(_auto_delay_explained, 2, env=env, args=("muon",)):
        assert result["delay"] == 0 and held in result["delay_line"], result
    for result in ranks.run(_auto_delay_explained, 2, env=env, args=("sgd",)):
        assert "GRADEX_DELAY=auto: the framework waited" in result["delay_line"], result
        assert held not in result["delay_line"], result
