"""The optimizers the training race can run every method with (train_suite.py --optimizer, train_rank.py
--optimizer; methods.py builds them), and the methods that cannot run under one, with the reason: a method
is rejected rather than given another optimizer than the one asked for."""

OPTIMIZERS = ("sgd", "adamw")  # sgd: SGD momentum 0.9, the race's default; adamw: AdamW
ADAMW_WEIGHT_DECAY = 0.01
ADAMW_UNSUPPORTED = {
    "gradex_dgc": "gradex_dgc is DGC with gradex's momentum correction, which exists only for SGD momentum "
                  "(gradex adds no momentum to an AdamW optimizer); under AdamW gradex_default and gradex_auto "
                  "compress through the auto policy's Adam ladder (8-bit with error feedback by default)"}
