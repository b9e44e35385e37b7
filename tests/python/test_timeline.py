"""Seeing a step: GRADEX_TIMELINE through the DDP hook on real ranks (every rank's trace parsed and checked for
every phase of every step and every peer's traffic, `gradex-bench timeline` merging them onto one clock), and
gradex's phases as named ranges in the user's own torch.profiler trace."""
import json
import os
import subprocess
import sys

import torch_ranks as ranks

STEPS = 6
_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_BENCH = os.path.join(_ROOT, "build", "bin", "gradex-bench")


def _train(rank, world, profile):
    import torch
    import gradex.torch as gx
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.Tanh(), torch.nn.Linear(128, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = gx.State(ddp, optimizer=opt)
    ddp.register_comm_hook(state, gx.hook)
    gen = torch.Generator().manual_seed(rank)

    def step():
        x = torch.randn(16, 256, generator=gen)
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()

    names = {}
    if profile:
        step()  # the engine exists before the profiled steps
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(STEPS - 1):
                step()
        for event in prof.events():
            if event.name.startswith("gradex."):
                names[event.name] = names.get(event.name, 0) + 1
    else:
        for _ in range(STEPS):
            step()
    stats = gx.stats(state)
    state.close()  # the engine shuts down: the trace is complete
    return {"names": names, "stats": stats}


def _events(path):
    with open(path) as f:
        return json.load(f)  # the recorder closes the array at shutdown: valid JSON


def test_timeline_records_every_phase_and_peer_and_merges(tmp_path):
    world = 3
    out = ranks.run(_train, world, args=(False,), timeout=240,
                    env={"GRADEX_TIMELINE": str(tmp_path), "GRADEX_SPARSITY": "0.99", "GRADEX_WARMUP_STEPS": "2",
                         "GRADEX_TIMEOUT_S": "60"})
    for rank in range(world):
        events = _events(tmp_path / f"rank{rank}.json")
        assert all(e["pid"] == rank for e in events)
        names = [e["name"] for e in events]
        for phase in ("submit", "inspect", "negotiate", "encode", "transfer", "decode", "complete", "wait",
                      "step end"):
            assert phase in names, (rank, phase)
        assert names.count("step end") == STEPS
        assert names.count("submit") == 4 * STEPS  # per parameter, from the first iteration
        # The completion thread waits on every submission.
        assert names.count("wait") == names.count("submit")
        # What the framework waited on gradex: a span on its own row, no longer than a step.
        waited = [e for e in events if e["name"] == "framework waits on gradex"]
        assert all(0 <= e["dur"] < 60e6 for e in waited)
        transfers = [e for e in events if e["name"] == "transfer"]
        routes = {e["args"]["route"] for e in transfers}
        assert {"sparse", "dense"} <= routes, routes
        assert all(e["args"]["codec"] and e["args"]["bytes_sent"] > 0 for e in transfers)
        assert any("dgc" in e["args"]["codec"] and "0.weight" in e["args"]["keys"] for e in transfers)
        assert len([e for e in events if e["name"] == "encode"]) == len(transfers)
        assert len([e for e in events if e["name"] == "decode"]) == len(transfers)
        # Every peer's sends and receives, with their bytes, for negotiation and for the data.
        for peer in range(world):
            mine = [e for e in events if e["ph"] == "X" and e.get("args", {}).get("peer") == peer]
            if peer == rank:
                assert not mine
                continue
            sent = sum(e["args"]["bytes"] for e in mine if e["name"].startswith("send "))
            received = sum(e["args"]["bytes"] for e in mine if e["name"].startswith("recv "))
            assert sent > 0 and received > 0, (rank, peer)
            assert {"send negotiation", "recv negotiation", "send sparse", "recv sparse"} <= {e["name"] for e in mine}
        # Named rows: threads and peers.
        rows = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
        assert "framework waits on gradex" in rows and any(r.startswith("progress thread") for r in rows), rows
    assert all(r["stats"]["exposed_seconds"] >= 0 for r in out)
    done = subprocess.run([_BENCH, "timeline", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    merged = _events(tmp_path / "merged.json")
    assert {e["pid"] for e in merged} == set(range(world))
    # On one clock: every rank's first negotiation round ends within a few ms of rank 0's.
    ends = {}
    for e in merged:
        if e["name"] == "negotiate" and e["args"]["round"] == 0:
            ends[e["pid"]] = e["ts"] + e["dur"]
    assert len(ends) == world and max(ends.values()) - min(ends.values()) < 50e3, ends
    # The docs' renderer draws a step of it and says how much of the step the named phases cover.
    picture = tmp_path / "step.png"
    drawn = subprocess.run([sys.executable, os.path.join(_ROOT, "scripts", "render_timeline.py"),
                            str(tmp_path / "merged.json"), "--step", str(STEPS - 1), "-o", str(picture)],
                           capture_output=True, text=True, timeout=120)
    assert drawn.returncode == 0, drawn.stdout + drawn.stderr
    assert picture.stat().st_size > 10000 and "named phases cover" in drawn.stdout


def test_profiler_trace_shows_gradex_phases():
    for r in ranks.run(_train, 2, args=(True,), timeout=240,
                       env={"GRADEX_SPARSITY": "0.99", "GRADEX_WARMUP_STEPS": "1", "GRADEX_TIMEOUT_S": "60"}):
        names = r["names"]
        # Every profiled backward pass hands its buckets over and waits for them on the training thread.
        assert names.get("gradex.submit", 0) >= STEPS - 1, names
        assert names.get("gradex.wait", 0) >= STEPS - 1, names
