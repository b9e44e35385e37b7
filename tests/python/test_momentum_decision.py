"""The momentum rule as a table (gradex/_momentum_rule.py): plain inputs, the decision and its reason. The
torch and Keras front ends read these inputs from their optimizers (test_momentum_ownership.py,
test_tf_momentum.py test them end to end)."""
import pytest

from gradex._momentum_rule import MomentumDecision, MomentumInputs, Reason, decide
from gradex._optimizer_family import Family

SGD = Family.SGD
F = frozenset

CASES = [
    # (inputs, expected decision)
    (MomentumInputs(None), MomentumDecision(Reason.NO_OPTIMIZER, None)),
    (MomentumInputs(None, explicit=0.9), MomentumDecision(Reason.NO_OPTIMIZER, None)),
    (MomentumInputs(Family.FIRST_MOMENT, explicit=0.9), MomentumDecision(Reason.OWN_MOMENTUM, 0.0)),
    (MomentumInputs(Family.OWN_UPDATE), MomentumDecision(Reason.OWN_MOMENTUM, 0.0)),
    (MomentumInputs(Family.OTHER, explicit=0.5), MomentumDecision(Reason.NO_SGD_MOMENTUM, None)),
    (MomentumInputs(SGD, F({0.0}), F({False})), MomentumDecision(Reason.NO_SGD_MOMENTUM, None)),
    (MomentumInputs(SGD, F({0.9}), F({True})), MomentumDecision(Reason.TAKEOVER, 0.9, True)),
    (MomentumInputs(SGD, F({0.9}), F({False}), explicit=0.5), MomentumDecision(Reason.TAKEOVER, 0.9, False)),
    (MomentumInputs(SGD, F({0.9}), F({False}), explicit=0.0), MomentumDecision(Reason.EXPLICIT_ZERO, None)),
    (MomentumInputs(SGD, F({0.9, 0.8}), F({False})),
     MomentumDecision(Reason.SGD_KEPT, 0.0, problems=("its parameter groups use different momentum or nesterov "
                                                      "settings",))),
    (MomentumInputs(SGD, F({0.9}), F({False, True})),
     MomentumDecision(Reason.SGD_KEPT, 0.0, problems=("its parameter groups use different momentum or nesterov "
                                                      "settings",))),
    (MomentumInputs(SGD, F({0.9}), F({False}), dampening=0.1),
     MomentumDecision(Reason.SGD_KEPT, 0.0, problems=("dampening is not 0",))),
    # torch.optim.SGD folds weight decay into its momentum buffer; Keras applies it outside momentum.
    (MomentumInputs(SGD, F({0.9}), F({False}), weight_decay=1e-4),
     MomentumDecision(Reason.SGD_KEPT, 0.0, problems=("weight decay is folded into SGD's momentum buffer",))),
    (MomentumInputs(SGD, F({0.9}), F({False}), weight_decay=1e-4, weight_decay_in_momentum=False),
     MomentumDecision(Reason.TAKEOVER, 0.9, False)),
    # LocalSGD (Keras): the optimizer keeps momentum whatever it is.
    (MomentumInputs(SGD, F({0.9}), F({False}), local_sgd=True), MomentumDecision(Reason.LOCAL_SGD, None)),
    (MomentumInputs(Family.FIRST_MOMENT, local_sgd=True, explicit=0.9), MomentumDecision(Reason.LOCAL_SGD, None)),
]


@pytest.mark.parametrize("inputs,expected", CASES, ids=[f"{i}-{e.reason.name}" for i, (_, e) in enumerate(CASES)])
def test_the_rule(inputs, expected):
    decision = decide(inputs)
    assert decision == expected
    assert decision.takeover == (expected.reason is Reason.TAKEOVER)


def test_torch_reads_weight_decay_as_folded_into_momentum():
    torch = pytest.importorskip("torch")
    from gradex.torch import _momentum

    p = torch.nn.Parameter(torch.zeros(2))
    inputs = _momentum.rule_inputs(torch.optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=1e-4), None)
    assert inputs.weight_decay_in_momentum and inputs.weight_decay == pytest.approx(1e-4)
    assert decide(inputs).reason is Reason.SGD_KEPT
    assert decide(_momentum.rule_inputs(torch.optim.Adam([p]), 0.9)).reason is Reason.OWN_MOMENTUM
    assert decide(_momentum.rule_inputs(None, None)).reason is Reason.NO_OPTIMIZER


def test_keras_reads_weight_decay_as_outside_momentum():
    pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    from gradex.tensorflow.keras import _momentum

    inputs = _momentum.rule_inputs(keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=1e-4), None, False)
    assert not inputs.weight_decay_in_momentum
    assert decide(inputs) == MomentumDecision(Reason.TAKEOVER, 0.9, False)
    assert decide(_momentum.rule_inputs(keras.optimizers.SGD(0.1, momentum=0.9), None, True)).reason \
        is Reason.LOCAL_SGD
