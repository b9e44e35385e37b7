"""The DDP comm hook against gloo's allreduce: exact with GRADEX_SPARSITY=0 and fp32, within fp16 rounding
with fp16 on the wire. GRADEX_MOMENTUM=0 here: with m > 0 gradex applies momentum on the dense path too, and
the hook's output is then SGD-with-momentum's step, not the plain average."""
import torch_ranks as ranks


def _hook_vs_gloo(rank, world, integer_data, bucket_view=False):
    """Per iteration, the gradients DDP + gx.hook leaves vs the average of the ranks' local gradients taken
    with gloo (dist.all_reduce, divided by the world size). bucket_view: DDP's gradient_as_bucket_view, and
    the result says how many distinct storages the parameters' .grad had after the last iteration."""
    import copy

    import torch
    import torch.distributed as dist
    import gradex.torch as gx

    torch.manual_seed(0)  # the same model on every rank
    model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.Tanh(), torch.nn.Linear(300, 10))
    if integer_data:
        # Gradients of a sum of linear outputs with integer inputs are integers: sums are exact in any
        # order, so the comparison can be exact for any world size.
        model = torch.nn.Linear(64, 300)
    reference = copy.deepcopy(model)  # trained locally: its gradients are this rank's own
    ddp = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=bucket_view)
    state = gx.State()
    ddp.register_comm_hook(state, gx.hook)
    gen = torch.Generator().manual_seed(100 + rank)  # different data on every rank
    max_error = []
    for _ in range(4):
        if integer_data:
            x = torch.randint(-4, 5, (8, 64), generator=gen).float()
            weight = torch.randint(-3, 4, (8, 300), generator=gen).float()
            loss_fn = lambda m: (m(x) * weight).sum()  # noqa: E731
        else:
            x = torch.randn(8, 64, generator=gen)
            loss_fn = lambda m: m(x).square().sum()  # noqa: E731
        ddp.zero_grad()
        loss_fn(ddp).backward()
        reference.zero_grad()
        loss_fn(reference).backward()
        errors = []
        for p, r in zip(model.parameters(), reference.parameters()):
            expected = r.grad.clone()
            dist.all_reduce(expected)
            expected /= world
            errors.append(((p.grad - expected).abs().max().item(),
                           float(expected.abs().max().item())))
        max_error.append(errors)
    stats = gx.stats(state)
    state.close()
    return {"errors": max_error, "iteration": state.iteration, "tensors": stats["tensors"],
            "params": len(list(model.parameters())),
            "storages": len({p.grad.untyped_storage().data_ptr() for p in model.parameters()})}


def _check_exact(results):
    for rank_result in results:
        assert rank_result["iteration"] == 4
        # Every iteration went through gradex, per parameter (the State found the DDP module's names).
        assert rank_result["tensors"] == 4 * rank_result["params"]
        for errors in rank_result["errors"]:
            assert all(err == 0.0 for err, _ in errors), rank_result["errors"]


def test_sparsity0_fp32_equals_gloo_average_two_ranks():
    env = {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "0", "GRADEX_MOMENTUM": "0", "GRADEX_TIMEOUT_S": "60"}
    _check_exact(ranks.run(_hook_vs_gloo, 2, env=env, args=(False,)))


def test_sparsity0_fp32_equals_gloo_average_four_ranks():
    env = {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "0", "GRADEX_MOMENTUM": "0", "GRADEX_TIMEOUT_S": "60"}
    _check_exact(ranks.run(_hook_vs_gloo, 4, env=env, args=(True,)))


def test_fp16_within_fp16_rounding():
    env = {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "1", "GRADEX_HALF_TYPE": "fp16", "GRADEX_MOMENTUM": "0",
           "GRADEX_TIMEOUT_S": "60"}
    results = ranks.run(_hook_vs_gloo, 4, env=env, args=(False,))
    some_error = False
    for rank_result in results:
        for errors in rank_result["errors"]:  # every iteration went through gradex (keys are parameter names)
            for err, scale in errors:
                # fp16 keeps 11 significant bits; each of 4 contributions and the partial sums round once.
                assert err <= 8 * 2.0 ** -11 * scale + 1e-6, (err, scale)
                some_error = some_error or err > 0
    assert some_error, "fp16 on the wire should differ from fp32 somewhere"
