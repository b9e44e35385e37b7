"""Muon for a transformer's hidden weight matrices and AdamW for everything else, as one optimizer object: the
split Muon's authors recommend (embeddings, the output layer, norms and biases stay with AdamW), handed to the
training loop and to gradex (`gx.State(ddp, optimizer=opt)`) as users do. The class name tells gradex's
optimizer rule that this optimizer builds its own update (python/gradex/_optimizer_family.py): gradex then
adds no momentum and compresses with error-feedback top-k."""
import torch


def hidden_matrices(model):
    """(name, parameter) of the 2-D weights inside the transformer blocks; the rest goes to AdamW."""
    return [(n, p) for n, p in model.named_parameters() if p.ndim == 2 and n.startswith("blocks.")]


class MuonWithAuxAdam:
    """step() and zero_grad() over a torch.optim.Muon and a torch.optim.AdamW that split the parameters."""

    def __init__(self, model, lr, adam_lr, weight_decay=0.01, momentum=0.95):
        hidden = {id(p) for _, p in hidden_matrices(model)}
        self.muon = torch.optim.Muon([p for p in model.parameters() if id(p) in hidden], lr=lr,
                                     weight_decay=weight_decay, momentum=momentum,
                                     adjust_lr_fn="match_rms_adamw")
        self.adamw = torch.optim.AdamW([p for p in model.parameters() if id(p) not in hidden], lr=adam_lr,
                                       weight_decay=weight_decay)
        self.param_groups = self.muon.param_groups + self.adamw.param_groups

    def zero_grad(self, set_to_none=True):
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)

    def step(self):
        self.muon.step()
        self.adamw.step()

    def state_dict(self):
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state):
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])
