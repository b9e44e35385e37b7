"""PyTorch Lightning on CPU, devices=2, as a user writes it (tests/python/lightning_train.py): the gradex comm
hook through DDPStrategy(ddp_comm_state=gx.State(), ddp_comm_hook=gx.hook) under Lightning's default
(subprocess) launcher and its spawn launcher (which pickles the unused State), and the LocalSGD recipe.
Ranks must end bit-identical and gradex's statistics must show the compression."""
import json
import math
import os
import subprocess
import sys

import pytest
import test_scalars
import torch_ranks as ranks

_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lightning_train.py")


def _train(tmp_path, launcher, mode):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ranks.free_port()), GRADEX_TIMEOUT_S="60")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, _SCRIPT, str(tmp_path), launcher, mode], env=env,
                          capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    results = []
    for rank in range(2):
        with open(tmp_path / f"rank{rank}.json") as f:
            results.append(json.load(f))
    assert results[0]["pid"] != results[1]["pid"]
    for r in results:
        assert r["identical"], r
        assert r["loss"] < math.log(4) - 0.2, r  # trained: below chance-level cross entropy
    return results


# The default launcher's run also carries the TensorBoard logger and gradex.torch.lightning.Scalars ("scalars"
# mode: the hook at 99 %), whose event files are checked here as test_scalars.py checks the other front ends':
# one Lightning job instead of two (each interpreter spends ~7 s of CPU importing Lightning).
# The spawn launcher's case is the opt-in stage's (GX_SLOW=1): what it adds to the default launcher's run is the
# State's trip through pickle, which test_lazy_state.py checks with DDP in a second (53 s here, the suite's
# longest case: three interpreters importing Lightning).
@pytest.mark.parametrize("launcher,mode", [("popen", "scalars"),
                                           pytest.param("spawn", "hook", marks=pytest.mark.slow)])
def test_lightning_ddp_strategy_with_gradex_hook(tmp_path, launcher, mode):
    for r in _train(tmp_path, launcher, mode):
        s = r["stats"]
        assert s["steps"] == 12 and s["tensors"] == 12 * 4  # per parameter, from the first iteration
        assert s["sparse_exchanges"] == 12  # the 32768-element weight goes DGC every step
        assert s["compression_ratio"] > 20, s
    if mode == "scalars":
        values = test_scalars.scalars_in(str(tmp_path))
        test_scalars.check_scalars(values)
        assert sorted(s for s, _ in values["gradex/compression_ratio"]) == [4, 8, 12]


def test_lightning_localsgd_recipe(tmp_path):
    for r in _train(tmp_path, "popen", "localsgd"):
        s = r["stats"]
        # 3 synchronous steps, then an average every 3 steps: after steps 6, 9 and 12 (4 tensors each).
        assert s["parameter_averages"] == 3 * 4, s
