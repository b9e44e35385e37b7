"""Realistic synthetic gradients for a model profile: the same recipe as gradex-bench's C++ generator
(bench/gradient_gen.h), so that the PyTorch baselines exchange gradients with the same statistics.

 - magnitude per tensor from its fan-in: weights ~ 1/sqrt(numel / shape[0]); one-dimensional tensors
   (biases, norms) 0.1/sqrt(numel);
 - heavy tails: 70% gaussian, 25% laplace, 5% student-t(3), normalized to zero mean, unit variance;
 - correlated across ranks: a component shared by all ranks (`shared_fraction` of the variance) plus
   per-rank noise;
 - different every step: each (step, tensor) reads the two value pools at fresh offsets, with a fresh
   sign and a scale jitter in [0.8, 1.25].

The values are not bit-identical to the C++ ones (different random streams), only identically
distributed; deterministic per (seed, rank, step, tensor).
"""
import numpy as np

SHARED_POOL = (1 << 20) + 7  # coprime lengths: no run of values repeats within a realistic tensor
RANK_POOL = (1 << 20) - 3


def _pool(size, rng):
    pick = rng.random(size)
    values = rng.standard_normal(size)
    laplace = pick >= 0.70
    values[laplace] = rng.laplace(0.0, 1.0 / np.sqrt(2.0), int(laplace.sum()))
    student = pick >= 0.95
    values[student] = rng.standard_t(3, int(student.sum()))
    values -= values.mean()
    values /= values.std()
    return values.astype(np.float32)


class GradientGenerator:
    def __init__(self, profile, rank, seed=1, shared_fraction=0.3):
        if not 0.0 <= shared_fraction <= 1.0:
            raise ValueError(f"shared_fraction must be in [0, 1], got {shared_fraction}")
        self.profile = profile
        self.rank = rank
        self.seed = seed
        self.shared_fraction = shared_fraction
        self.offsets = np.cumsum([0] + profile.numels[:-1]).tolist()
        self.scales = [0.1 / np.sqrt(n) if len(shape) == 1 else 1.0 / np.sqrt(n // shape[0])
                       for (_, shape), n in zip(profile.tensors, profile.numels)]
        self.shared = _pool(SHARED_POOL, np.random.default_rng([seed, 0x5EED]))
        self.own = _pool(RANK_POOL, np.random.default_rng([seed, 0x7A2C, rank + 1]))

    def generate(self, step, out):
        """Writes every tensor's gradient for `step` into the flat float32 array `out`
        (profile.total_numel values, tensors back to back in profile order)."""
        for t, numel in enumerate(self.profile.numels):
            self.tensor(step, t, out[self.offsets[t]:self.offsets[t] + numel])

    def tensor(self, step, t, out):
        """Tensor t's gradient for `step` into `out` (its numel float32 values)."""
        common = np.random.default_rng([self.seed, step, t])
        mine = np.random.default_rng([self.seed, step, t, 0x1000 + self.rank])
        sign = 1.0 if common.random() < 0.5 else -1.0
        jitter = lambda rng: np.exp((2.0 * rng.random() - 1.0) * np.log(1.25))  # noqa: E731
        a = np.float32(sign * self.scales[t] * np.sqrt(self.shared_fraction) * jitter(common))
        b = np.float32(self.scales[t] * np.sqrt(1.0 - self.shared_fraction) * jitter(mine))
        ps = int(common.integers(SHARED_POOL))
        pr = int(mine.integers(RANK_POOL))
        i, count = 0, out.size
        while i < count:  # contiguous runs up to the next wrap of either pool
            run = min(count - i, SHARED_POOL - ps, RANK_POOL - pr)
            dst = out[i:i + run]
            np.multiply(self.shared[ps:ps + run], a, out=dst)
            dst += b * self.own[pr:pr + run]
            i += run
            ps = (ps + run) % SHARED_POOL
            pr = (pr + run) % RANK_POOL
