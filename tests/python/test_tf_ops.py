"""gradex.tensorflow's ops on real processes: the grouped gradient exchange against NumPy's average (exact
with GRADEX_SPARSITY=0 and fp32, within rounding with fp16), DistributedGradientTape eagerly and in
tf.function, None and IndexedSlices gradients, allreduce, bit-exact broadcast of any dtype."""
import numpy as np

import tf_ranks

_EXACT = {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "0", "GRADEX_MOMENTUM": "0", "GRADEX_TIMEOUT_S": "60"}
_SHAPES = [(7,), (33, 20), (200, 100), (3, 5, 4)]  # (200, 100): above the DGC threshold by default


def _rank_data(rank, integer):
    rng = np.random.default_rng(1000 + rank)
    if integer:  # sums of small integers are exact in any order: exact comparisons on any world size
        return [rng.integers(-8, 9, size=s).astype(np.float32) for s in _SHAPES]
    return [rng.standard_normal(s).astype(np.float32) for s in _SHAPES]


def _tape_round(rank, world, integer, config=None):
    """Gradients of sum(v_i * c_i) are the rank's c_i: the exchange must return mean over ranks of c_i."""
    import tensorflow as tf
    import gradex.tensorflow as gxt

    coefficients = [tf.constant(c) for c in _rank_data(rank, integer)]
    variables = [tf.Variable(tf.zeros(s), name=f"w{i}") for i, s in enumerate(_SHAPES)]
    unused = tf.Variable(tf.zeros([3]), name="unused")  # None gradient on every rank
    embedding = tf.Variable(tf.zeros([10, 4]), name="embedding")  # IndexedSlices gradient

    def loss_fn():
        loss = tf.add_n([tf.reduce_sum(v * c) for v, c in zip(variables, coefficients)])
        rows = tf.gather(embedding, [rank % 10, 9])  # rank-dependent rows
        return loss + tf.reduce_sum(rows)

    sources = variables + [unused, embedding]

    def eager():
        with tf.GradientTape() as tape:
            loss = loss_fn()
        return gxt.DistributedGradientTape(tape, config=config, prefix="eager").gradient(loss, sources)

    @tf.function(jit_compile=False)
    def traced():
        with tf.GradientTape() as tape:
            loss = loss_fn()
        return gxt.DistributedGradientTape(tape, config=config, prefix="traced").gradient(loss, sources)

    return [[g.numpy() for g in eager()], [g.numpy() for g in traced()]]


def _expected(world, integer):
    data = [_rank_data(r, integer) for r in range(world)]
    means = [np.mean(np.stack([d[i] for d in data]), axis=0) for i in range(len(_SHAPES))]
    embedding = np.zeros((10, 4), np.float32)
    for r in range(world):
        embedding[r % 10] += 1
        embedding[9] += 1
    return means + [np.zeros(3, np.float32), embedding / np.float32(world)]


def _exact_and_collectives(rank, world):
    import tensorflow as tf
    import gradex.tensorflow as gxt

    gxt.init()
    out = {"rank": gxt.rank(), "size": gxt.size(), "tape": _tape_round(rank, world, integer=False)}
    # allreduce: exact fp32 average on the collective engine, eagerly and in a graph, named or not.
    x = tf.constant(np.arange(5, dtype=np.float32) * (rank + 1) + 0.25)
    out["allreduce"] = gxt.allreduce(x).numpy()
    out["allreduce_sum"] = gxt.allreduce(x, average=False, name="sum").numpy()
    out["allreduce_graph"] = tf.function(lambda: [gxt.allreduce(x), gxt.allreduce(2 * x)])()
    out["allreduce_graph"] = [t.numpy() for t in out["allreduce_graph"]]
    # broadcast: bit-exact for any dtype, from any root (NaN payloads and odd byte counts included).
    values = {"f32": np.array([np.pi, -0.0, np.nan, 1e-42], np.float32) * (rank + 1),
              "i64": np.array([2**62 + rank, -5], np.int64), "u8": np.array([rank, 255, 3], np.uint8),
              "bool": np.array([rank == 1, True, False]), "f16": np.array([0.1 * (rank + 1)], np.float16)}
    out["broadcast"] = {k: gxt.broadcast(tf.constant(v), root_rank=1, name=k).numpy() for k, v in values.items()}
    out["values"] = values
    v = tf.Variable(tf.fill([4, 3], float(rank)))
    step = tf.Variable(tf.constant(rank * 10, tf.int64))
    gxt.broadcast_variables([v, step], root_rank=world - 1)
    out["variables"] = [v.numpy(), int(step.numpy())]
    out["stats"] = gxt.stats()
    gxt.shutdown()
    return out


def test_fp32_exchange_equals_numpy_average_and_collectives():
    results = tf_ranks.run("test_tf_ops:_exact_and_collectives", 2, env=_EXACT)
    expected = _expected(2, integer=False)
    for r, res in enumerate(results):
        assert (res["rank"], res["size"]) == (r, 2)
        for grads in res["tape"]:  # eager, then tf.function
            assert len(grads) == len(expected)
            for got, want in zip(grads, expected):
                assert got.dtype == np.float32 and np.array_equal(got, want), (got, want)
        base = np.arange(5, dtype=np.float32)
        want = np.mean(np.stack([base * 1 + 0.25, base * 2 + 0.25]), axis=0)
        assert np.array_equal(res["allreduce"], want)
        assert np.allclose(res["allreduce_sum"], want * 2)
        assert np.array_equal(res["allreduce_graph"][0], want)
        assert np.array_equal(res["allreduce_graph"][1], np.mean(np.stack([2 * (base + 0.25), 2 * (2 * base + 0.25)]), axis=0))
        for key, value in res["broadcast"].items():
            root = results[1]["values"][key]
            assert value.dtype == root.dtype and value.tobytes() == root.tobytes(), key
        assert np.array_equal(res["variables"][0], np.full((4, 3), 1.0, np.float32))
        assert res["variables"][1] == 10
        assert res["stats"]["tensors"] > 0 and res["stats"]["steps"] == 2


def _integer_and_fp16(rank, world):
    import gradex.tensorflow as gxt

    gxt.init()
    exact = _tape_round(rank, world, integer=True)
    fp16 = _tape_round(rank, world, integer=False,
                       config={"GRADEX_SPARSITY": "0", "GRADEX_FP16": "1", "GRADEX_HALF_TYPE": "fp16"})
    stats = gxt.stats()
    gxt.shutdown()
    return {"exact": exact, "fp16": fp16, "stats": stats}


def test_exact_on_three_ranks_and_fp16_within_rounding():
    results = tf_ranks.run("test_tf_ops:_integer_and_fp16", 3, env=_EXACT)
    exact = _expected(3, integer=True)
    approx = _expected(3, integer=False)
    data = [_rank_data(r, False) for r in range(3)]
    for res in results:
        for grads in res["exact"]:
            for got, want in zip(grads, exact):
                assert np.array_equal(got, want)
        for grads in res["fp16"]:
            for i, (got, want) in enumerate(zip(grads, approx)):
                scale = max(max(float(np.abs(d[i]).max()) for d in data) if i < len(_SHAPES) else 1.0, 1e-3)
                # fp16 keeps 11 significant bits: each rank's value/3 is rounded once, the sum once more.
                assert np.allclose(got, want, rtol=0, atol=scale * 2.0**-10), (i, np.abs(got - want).max())
                assert not np.array_equal(got, want) or i >= len(_SHAPES)  # fp16 really was on the wire
    # Every rank ends with bit-identical results (one rank computes each chunk's sum, all receive it).
    for other in results[1:]:
        for a, b in zip(results[0]["fp16"][0], other["fp16"][0]):
            assert np.array_equal(a, b)
