"""Convergence of the dense 8-bit route (GRADEX_SPARSITY_OVERRIDES '*:int8') on scikit-learn's digits, 4
ranks, 300 steps of SGD with momentum 0.9 (gradex owns it): plain DDP (gloo, fp32) vs gradex dense fp32 vs
gradex dense 16-bit vs gradex dense 8-bit. 8-bit must reach DDP's test accuracy within 1 point, every rank
must end with the same model, and its bytes on the wire must be about half of 16-bit's and a quarter of
fp32's (the 8-bit route's 1.03 bytes per element in the same two-phase pattern as a ring).
"""
import os
import sys

import torch_ranks as ranks

_EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "examples")
STEPS = 300

# Every tensor dense on the named wire; the 30 warm-up steps of the example's DGC mode are irrelevant
# here (no tensor is DGC).
MODES = {
    "fp32": {"GRADEX_SPARSITY_OVERRIDES": "*:dense", "GRADEX_FP16": "0"},
    "16-bit": {"GRADEX_SPARSITY_OVERRIDES": "*:dense", "GRADEX_FP16": "1"},
    "8-bit": {"GRADEX_SPARSITY_OVERRIDES": "*:int8"},
}


def _run_all(rank, world):
    sys.path.insert(0, _EXAMPLES)
    import torch
    import torch_ddp_digits as digits
    import gradex.torch as gx

    out = {}
    out["ddp"], _ = digits.train("ddp", steps=STEPS)
    for name, config in MODES.items():
        acc, state = digits.train("dgc", steps=STEPS, config=config)
        s = gx.stats(state)
        out[name] = acc
        out[name + "_bytes"] = s["bytes_sent"] - s["control_bytes"]
        out[name + "_sparse"] = s["sparse_exchanges"]
        state.close()
    out["params"] = sum(p.numel() for p in digits.make_model().parameters())
    out["digest"] = torch.tensor([out[k] for k in ("fp32", "16-bit", "8-bit")]).tolist()
    return out


def test_digits_int8_matches_dense():
    results = ranks.run(_run_all, 4, env={"GRADEX_TIMEOUT_S": "120"}, timeout=600)
    r = results[0]
    print(f"\ndigits, 4 ranks, {STEPS} steps: plain DDP {r['ddp']:.2f}%, gradex fp32 {r['fp32']:.2f}%, "
          f"16-bit {r['16-bit']:.2f}%, 8-bit {r['8-bit']:.2f}%; bytes sent per rank: fp32 {r['fp32_bytes']}, "
          f"16-bit {r['16-bit_bytes']}, 8-bit {r['8-bit_bytes']}")
    for other in results[1:]:
        assert other["digest"] == r["digest"]  # every rank's model ends the same
    assert r["ddp"] > 90.0
    for name in MODES:
        assert r[name + "_sparse"] == 0
    assert r["8-bit"] >= r["ddp"] - 1.0
    assert r["8-bit"] >= r["fp32"] - 1.0
    assert 0.45 <= r["8-bit_bytes"] / r["16-bit_bytes"] <= 0.6
    assert 0.22 <= r["8-bit_bytes"] / r["fp32_bytes"] <= 0.3
