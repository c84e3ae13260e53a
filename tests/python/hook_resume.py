"""A DDP job with gradzip's hook checkpointed and resumed in a new job: does it continue
bit for bit? Ten SGD steps straight, against five, a checkpoint (model, optimizer, hook
state), a new job and five more."""
import copy

import torch


def resumes_bit_exactly(make, inputs):
    """make() -> (model, ddp, state, optimizer), a new job each call; inputs(step) -> the
    step's batch on this rank. True when the resumed parameters equal the straight run's."""

    def run(ddp, opt, steps):
        for step in steps:
            opt.zero_grad()
            ddp(inputs(step)).pow(2).sum().backward()
            opt.step()

    model, ddp, state, opt = make()
    run(ddp, opt, range(10))
    straight = [p.detach().clone() for p in model.parameters()]
    model, ddp, state, opt = make()
    run(ddp, opt, range(5))
    saved = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()})
    model, ddp, state, opt = make()  # a new job: the hook state carries the iteration count too
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    state.load_state_dict(saved["hook"])
    run(ddp, opt, range(5, 10))
    return all(torch.equal(a, b) for a, b in zip(straight, model.parameters()))
