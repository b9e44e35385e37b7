"""The one optimizer-family rule (gradex/_optimizer_family.py) that the torch and Keras plugins share: who owns
momentum and which codec the policy's compressed tensors use, for the optimizers users bring."""
import logging

import pytest
import torch

from gradex import _optimizer_family as of
from gradex._optimizer_family import Family


def _params():
    return [torch.nn.Parameter(torch.zeros(4, 4))]


def _named(name, bases=(torch.optim.Optimizer,), **defaults):
    """An optimizer class called `name` (as third-party packages name theirs), with torch-style defaults."""
    def init(self, params):
        torch.optim.Optimizer.__init__(self, params, dict(defaults))
    return type(name, bases, {"__init__": init})(_params())


class _KerasLike:
    """Keras optimizers keep hyperparameters as attributes, not in defaults/param_groups."""


def _keras(name, **attributes):
    obj = type(name, (_KerasLike,), {})()
    obj.__dict__.update(attributes)
    return obj


def test_torch_optimizers():
    p = _params
    assert of.family(torch.optim.SGD(p(), lr=0.1, momentum=0.9)) is Family.SGD
    for cls in (torch.optim.Adam, torch.optim.AdamW, torch.optim.NAdam, torch.optim.RAdam, torch.optim.Adamax):
        assert of.family(cls(p(), lr=1e-3)) is Family.FIRST_MOMENT, cls
    assert of.family(torch.optim.RMSprop(p(), lr=1e-3, momentum=0.5)) is Family.FIRST_MOMENT
    assert of.family(torch.optim.RMSprop(p(), lr=1e-3)) is Family.OTHER
    assert of.family(torch.optim.Adagrad(p(), lr=1e-3)) is Family.OTHER
    assert of.family(torch.optim.Muon(p(), lr=1e-3)) is Family.OWN_UPDATE
    assert of.family(None) is Family.OTHER


def test_third_party_optimizers_by_name():
    # Orthogonalising / preconditioning / low-rank ones are matched by name before `betas` (SOAP has betas).
    for name in ("Dion", "DistributedShampoo", "Shampoo", "SOAP", "SingleDeviceMuon", "MuonWithAuxAdam",
                 "GaLoreAdamW"):
        assert of.family(_named(name, lr=1e-3, betas=(0.9, 0.99))) is Family.OWN_UPDATE, name
    for name in ("LARS", "SophiaG", "Adan", "Lion", "LAMB", "Adafactor", "AdaBelief", "FusedAdam"):
        assert of.family(_named(name, lr=1e-3)) is Family.FIRST_MOMENT, name
    assert of.family(_named("MyOptimizer", lr=1e-3, betas=(0.9, 0.99))) is Family.FIRST_MOMENT
    assert of.family(_named("MyOptimizer", lr=1e-3)) is Family.OTHER
    subclass = type("TunedMuon", (torch.optim.Muon,), {})
    assert of.family(subclass(_params(), lr=1e-3)) is Family.OWN_UPDATE


def test_keras_style_optimizers():
    assert of.family(_keras("SGD", momentum=0.9)) is Family.SGD
    assert of.family(_keras("Adam", beta_1=0.9)) is Family.FIRST_MOMENT
    assert of.family(_keras("Muon", adam_beta_1=0.9, momentum=0.95)) is Family.OWN_UPDATE
    assert of.family(_keras("RMSprop", momentum=0.0)) is Family.OTHER
    assert of.family(_keras("RMSprop", momentum=0.9)) is Family.FIRST_MOMENT


def test_codec_and_momentum_per_family():
    params = _params()
    assert of.engine_optimizer(torch.optim.AdamW(params)) == "adam"
    # The delayed exchange's correction carries through SGD's linear update only: the sparse codecs stay
    # DGC's, and GRADEX_DELAY=auto keeps D = 0 (sync/delay/delay_rule.cc) for `other`.
    assert of.engine_optimizer(torch.optim.Muon(params)) == "other"
    assert of.engine_optimizer(torch.optim.Adagrad(params)) == "other"
    assert of.engine_optimizer(torch.optim.SGD(params, lr=0.1, momentum=0.9)) is None
    assert of.engine_optimizer(None) is None
    assert of.keeps_own_momentum(Family.OWN_UPDATE) and of.keeps_own_momentum(Family.FIRST_MOMENT)
    assert not of.keeps_own_momentum(Family.SGD) and not of.keeps_own_momentum(Family.OTHER)


def test_torch_rule_never_takes_muons_momentum(caplog):
    from gradex.torch import _momentum
    muon = torch.optim.Muon(_params(), lr=1e-3, momentum=0.95)
    with caplog.at_level(logging.WARNING, logger="gradex"):
        config, takeover = _momentum.decide(muon, {"GRADEX_MOMENTUM": "0.9"}, "test")
    assert takeover is None
    assert config["GRADEX_MOMENTUM"] == "0" and config["GRADEX_OPTIMIZER"] == "other"
    assert muon.param_groups[0]["momentum"] == 0.95
    assert any("GRADEX_MOMENTUM=0.9 is ignored" in r.getMessage() and "Muon" in r.getMessage()
               for r in caplog.records)
    config, _ = _momentum.decide(torch.optim.AdamW(_params()), {}, "test")
    assert config["GRADEX_OPTIMIZER"] == "adam" and config["GRADEX_MOMENTUM"] == "0"


def test_keras_rule_uses_the_same_families():
    pytest.importorskip("tensorflow")
    from gradex.tensorflow.keras import _momentum as keras_momentum
    muon = _keras("Muon", momentum=0.95)
    settings, taken = keras_momentum.decide(muon, {"GRADEX_MOMENTUM": "0.9"}, False)
    assert taken == 0.0 and settings["GRADEX_MOMENTUM"] == "0" and settings["GRADEX_OPTIMIZER"] == "other"
    settings, taken = keras_momentum.decide(_keras("Adam", beta_1=0.9), {}, False)
    assert settings["GRADEX_OPTIMIZER"] == "adam" and taken == 0.0
    settings, taken = keras_momentum.decide(_keras("SGD", momentum=0.9, nesterov=False), {}, False)
    assert taken == 0.9 and settings["GRADEX_MOMENTUM"] == repr(0.9)
