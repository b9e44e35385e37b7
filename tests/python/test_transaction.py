"""Step transactions through the Python binding: Engine.snapshot_state() / rollback_state() make a step that does
not commit (torchft's should_commit() == False) leave the engine's state as if it never ran: the run continues
bit-identical to one that never took the step. Two real processes over torch's TCPStore."""
import torch_ranks as ranks

_CONFIG = {"GRADEX_DENSE_THRESHOLD": "1024", "GRADEX_MOMENTUM": "0.9", "GRADEX_SPARSITY": "0.99",
           "GRADEX_TIMEOUT_S": "300"}
_SPARSE_N, _DENSE_N = 4096, 300


def _run(store, prefix, rank, rejected_step):
    import torch
    from gradex import _capi

    engine = _capi.Engine(rank, 2, store, prefix, _CONFIG)
    engine.register("a", _SPARSE_N, _capi.FLOAT32)
    engine.register("d", _DENSE_N, _capi.FLOAT32)

    def step(seed):
        g = torch.Generator().manual_seed(seed)
        a, d = torch.randn(_SPARSE_N, generator=g), torch.randn(_DENSE_N, generator=g)
        for h in [engine.submit("a", a.data_ptr()), engine.submit("d", d.data_ptr())]:
            engine.wait(h)
        engine.end_step()
        return torch.cat([a, d])

    for s in range(4):
        step(100 * rank + s)
    if rejected_step:
        engine.snapshot_state()
        step(7777 + rank)  # does not commit
        engine.rollback_state()
    results = [step(100 * rank + s) for s in range(4, 8)]
    state = engine.save_state()
    engine.close()
    return torch.stack(results), state


def _compare(rank, world):
    import datetime
    import os

    import torch
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), is_master=rank == 0,
                          timeout=datetime.timedelta(seconds=120), wait_for_workers=False)
    reference, reference_state = _run(store, "ref/", rank, False)
    rolled_back, rolled_back_state = _run(store, "tx/", rank, True)
    if rank == 1:
        store.set("done/1", b"1")  # rank 0 serves the store: it leaves last
    else:
        store.get("done/1")
    return {"results_equal": torch.equal(reference, rolled_back), "state_equal": reference_state == rolled_back_state}


def test_rollback_is_bit_exact():
    results = ranks.run(_compare, 2, timeout=180, process_group=False)
    assert results == [{"results_equal": True, "state_equal": True}] * 2, results
