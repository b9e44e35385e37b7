"""Exact collectives through gradex_group_* on real processes: gx.broadcast_parameters, gx.broadcast_ and
gx.allreduce(op=gx.Sum) bit for bit for every dtype with a root that is not rank 0; mismatched sizes refused
on every rank with a message naming the ranks; a peer that dies mid-broadcast fails every surviving rank; the
C API refuses bad arguments by name."""
import ctypes

import pytest
import torch_ranks as ranks

_ENV = {"GRADEX_TIMEOUT_S": "30", "GRADEX_RING_CHUNK_KB": "4"}  # small pieces: multi-piece chains

_DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool",
           "complex64"]


def _values(dtype_name, seed, n):
    """n values of a dtype from raw random bytes (NaN payloads, negative zeros and all): a bit-exact
    transport keeps every one of them."""
    import torch
    g = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, dtype_name)
    size = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype)


def _raw(t):
    import torch
    flat = t.detach().reshape(-1).contiguous().cpu()
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def _broadcast_every_dtype(rank, world):
    import torch
    import gradex.torch as gx
    root = world - 1
    state = {f"t.{d}": _values(d, 100 * rank + i, 37 + 1000 * i) for i, d in enumerate(_DTYPES)}
    state["empty"] = torch.zeros(0)
    state["scalar"] = torch.tensor(1.5 + rank)
    gx.broadcast_parameters(state, root_rank=root)
    single = _values("int64", rank, 5000)
    gx.broadcast_(single, root_rank=root)
    summed = gx.allreduce(torch.arange(10, dtype=torch.int64) * (rank + 1), op=gx.Sum)
    gathered = [_raw(t) for t in gx.collectives._allgather_bytes(torch.full((3,), rank, dtype=torch.uint8))]
    return {"state": {k: _raw(v) for k, v in state.items()}, "single": _raw(single), "summed": summed.tolist(),
            "gathered": gathered}


@pytest.mark.parametrize("process_group", [True, False])
def test_broadcast_is_bit_exact_for_every_dtype_from_a_root_other_than_0(process_group):
    world = 3
    results = ranks.run(_broadcast_every_dtype, world, env=_ENV, process_group=process_group)
    root = world - 1
    import torch
    for i, d in enumerate(_DTYPES):
        expected = _raw(_values(d, 100 * root + i, 37 + 1000 * i))
        for r in range(world):
            assert results[r]["state"][f"t.{d}"] == expected, (d, r)
    for r in range(world):
        assert results[r]["state"]["scalar"] == _raw(torch.tensor(1.5 + root))
        assert results[r]["single"] == _raw(_values("int64", root, 5000))
        assert results[r]["summed"] == [v * 6 for v in range(10)]
        assert results[r]["gathered"] == [bytes([q] * 3) for q in range(world)]


def _mismatched(rank, world):
    import torch
    import gradex
    import gradex.torch as gx
    out = {}
    try:
        gx.broadcast_(torch.zeros(100 + (rank == 1)), root_rank=1)
    except gradex.MismatchError as e:
        out["broadcast_"] = str(e)
    group = gx.collectives.group()
    raw = torch.zeros(100 + (rank == 1))
    try:
        group.broadcast(raw.data_ptr(), raw.numel() * 4, 1)
    except gradex.MismatchError as e:
        out["broadcast"] = str(e)
    data = torch.zeros(8 + rank, dtype=torch.uint8)
    result = torch.zeros(world * 10, dtype=torch.uint8)
    try:
        group.allgather(data.data_ptr(), data.numel(), result.data_ptr())
    except gradex.MismatchError as e:
        out["allgather"] = str(e)
    # The group stays usable after a refused call.
    ok = torch.full((4,), float(rank))
    gx.broadcast_(ok, root_rank=0)
    out["after"] = ok.tolist()
    return out


def test_mismatched_sizes_are_refused_on_every_rank():
    results = ranks.run(_mismatched, 3, env=_ENV, process_group=False)
    for r, out in enumerate(results):
        assert "ranks passed different tensors (names, shapes or dtypes); groups of ranks that agree: " \
            "[[0, 2], [1]]" in out["broadcast_"], out
        assert "ranks passed different sizes or roots" in out["broadcast"], out
        assert "ranks 0,2: 400 bytes from root 1" in out["broadcast"], out
        assert "rank 1: 404 bytes from root 1" in out["broadcast"], out
        assert "rank 0: 8 bytes; rank 1: 9 bytes; rank 2: 10 bytes" in out["allgather"], out
        assert out["after"] == [0.0] * 4


def _dies_mid_broadcast(rank, world):
    import time
    import torch
    import gradex
    import gradex.torch as gx
    gx.broadcast_(torch.zeros(4), root_rank=0)  # connected
    if rank == 1:
        return ranks.EXIT  # leaves at once: the chain 0 -> 1 -> 2 loses its middle
    start = time.monotonic()
    try:
        gx.broadcast_(torch.zeros(1 << 20), root_rank=0)
        return ("completed", 0.0)
    except gradex.GradexError as e:
        return (type(e).__name__, time.monotonic() - start)


def test_a_dead_peer_fails_every_rank():
    results = ranks.run(_dies_mid_broadcast, 3, env=_ENV, process_group=False, leave_together=False)
    for r in (0, 2):
        kind, seconds = results[r]
        assert kind in ("PeerError", "AbortedError"), results
        assert seconds < 25, results  # the failure, not the timeout


def _bad_arguments(rank, world):
    import gradex
    import gradex.torch as gx
    group = gx.collectives.group()
    out = {}
    try:
        group.broadcast(0, 16, 0)  # a NULL buffer
    except gradex.InvalidArgumentError as e:
        out["null"] = str(e)
    buf = ctypes.create_string_buffer(16)
    try:
        group.broadcast(ctypes.addressof(buf), 16, world)
    except gradex.InvalidArgumentError as e:
        out["root"] = str(e)
    return out


def test_bad_arguments_are_named_on_every_rank():
    results = ranks.run(_bad_arguments, 2, env=_ENV, process_group=False)
    for out in results:
        assert "a NULL buffer for 16 bytes on rank(s) 0, 1" in out["null"], out
        assert "root 2 is not a rank of a world of 2" in out["root"], out
