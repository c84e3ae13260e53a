"""What a resumed job does at each door, for the checkpoint golden files.

scenario(rank, world_size, door, saved) runs on real ranks. Without `saved` it runs a
door for two steps, takes the door's state_dict() (and what the job itself would save:
the model, the optimizer), runs a third step and returns {"checkpoint", "outputs"}; with
`saved` (that checkpoint) it builds the door afresh, loads it and returns the outputs of
the third step. tests/python/checkpoints/generate.py writes a build's golden files with
it; test_checkpoints.py loads them into this build and compares the third step.

Only the API every format's build shares is used here (gradzip.Aggregation(spec)(tensor),
gradzip.hooks.State(spec, model=...), gradzip.hooks.hook): the same file ran on the
build that wrote format 0.
"""
import copy

import torch
import torch.distributed as dist

SPECS = {
    "aggregation": "topk:density=0.1",      # residual, calls
    "aggregation_qsgd": "qsgd:bits=4,ef=1", # and the step its random draws follow (QSGD's draws changed after format 0)
    "hook": "topk:density=0.1",            # one bucket, keyed by its index
    # model=: state per parameter, two buckets; layers=off, as formats 0 and 1 ran it (per
    # parameter, the small parameters would go exact, and this model's sums are not the
    # same bits from process to process).
    "hook_model": "sign:block=0,layers=off",
    # Each chunk whole, as formats 1 and 2 ran it (their files read as layers=off).
    "fsdp": "stc:density=0.1,layers=off",
    # Format 3 on: each parameter's shard by itself, a level chosen for each (layers=adapt).
    "fsdp_layers": "stc:adapt_every=1,density=0.1",
    "diloco": "qsgd:bits=4,norm=max,ef=1",
    "backend": "topk:density=0.1",
}
FORMAT_0_DOORS = ("aggregation", "hook", "hook_model")  # the doors that existed before format 1


def inputs(rank, step, n):
    return torch.randn(n, generator=torch.Generator().manual_seed(1000 * step + rank))


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.Tanh(), torch.nn.Linear(30, 5))


def one_parameter():
    """A model whose one bucket has the same layout before and after DDP rebuilds it (a
    resumed DDP starts from its initial layout, and per-bucket residuals follow the
    layout: gradzip.hooks, "Resuming"), with weights in {-1, 0, 1}: with such inputs
    and a power-of-two rate every value stays exact, the same whatever order a matrix
    product sums in (CPU BLAS sums in orders that can change between runs)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 5, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.randint(-1, 2, model.weight.shape))
    return model


def scenario(rank, world_size, door, saved=None):
    return globals()[f"_{door}"](rank, world_size, SPECS[door], saved)


def saved_now(checkpoint):
    """A copy, as torch.save makes at once: model and optimizer state_dict()s hold live tensors."""
    return copy.deepcopy(checkpoint)


def third_step(step, saved, save, load):
    """Without `saved`: steps 0 and 1, then the checkpoint save() returns; with it,
    load(saved). Then step 2, whose outputs are compared."""
    checkpoint = None
    if saved is None:
        for i in range(2):
            step(i)
        checkpoint = saved_now(save())
    else:
        load(saved)
    return {"checkpoint": checkpoint, "outputs": step(2)}


def _aggregation(rank, world_size, spec, saved):
    import gradzip
    dist.init_process_group("gloo")
    aggregation = gradzip.Aggregation(spec)
    checkpoint = None
    if saved is None:
        for step in range(2):
            aggregation(inputs(rank, step, 3000))
        checkpoint = saved_now(aggregation.state_dict())
    else:
        aggregation.load_state_dict(saved)
    out = aggregation(inputs(rank, 2, 3000))
    return {"checkpoint": checkpoint, "outputs": [out]}


_aggregation_qsgd = _aggregation  # the same steps, with SPECS' QSGD


def _ddp_steps(rank, spec, saved, model_keyed):
    import gradzip
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = mlp() if model_keyed else one_parameter()
    if saved is not None:
        model.load_state_dict(saved["model"])
    ddp = DDP(model, bucket_cap_mb=0.004 if model_keyed else 25)  # two buckets, or one
    state = gradzip.hooks.State(spec, model=model) if model_keyed else gradzip.hooks.State(spec)
    ddp.register_comm_hook(state, gradzip.hooks.hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 if model_keyed else 2**-6, momentum=0.9 if model_keyed else 0)

    def step(i):
        if model_keyed:
            x, loss = inputs(rank, i, 8 * 40).view(8, 40), lambda y: y.square().mean()
        else:  # inputs in {-1, 0, 1}, a sum: exact (one_parameter)
            x, loss = inputs(rank, i, 4 * 8).view(4, 8).round().clamp(-1, 1), lambda y: y.square().sum()
        opt.zero_grad()
        loss(ddp(x)).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
        return grads

    def load(saved):
        opt.load_state_dict(saved["optimizer"])
        state.load_state_dict(saved["hook"])

    return third_step(step, saved, lambda: {"model": model.state_dict(), "optimizer": opt.state_dict(),
                                            "hook": state.state_dict()}, load)


def _hook(rank, world_size, spec, saved):
    dist.init_process_group("gloo")
    return _ddp_steps(rank, spec, saved, model_keyed=False)


def _hook_model(rank, world_size, spec, saved):
    dist.init_process_group("gloo")
    return _ddp_steps(rank, spec, saved, model_keyed=True)


def _fsdp(rank, world_size, spec, saved, model=None):
    import gradzip
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("gloo")
    model = model or mlp()
    mesh = init_device_mesh("cpu", (world_size,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    state = gradzip.fsdp.compress(model, spec)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(i):
        x = inputs(rank, i, 8 * 40).view(8, 40)
        opt.zero_grad()
        model(x).square().mean().backward()
        grads = [p.grad.to_local().clone() for p in model.parameters()]
        opt.step()
        return grads

    def load(saved):
        with torch.no_grad():
            for p, shard in zip(model.parameters(), saved["shards"]):
                p.to_local().copy_(shard)
        state.load_state_dict(saved["fsdp"])

    return third_step(step, saved, lambda: {"shards": [p.to_local().detach() for p in model.parameters()],
                                            "fsdp": state.state_dict()}, load)


def _fsdp_layers(rank, world_size, spec, saved):
    """FSDP with weights whose shards are compressed (2 ranks: 1200 and 1500 elements)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 60), torch.nn.Tanh(), torch.nn.Linear(60, 50))
    return _fsdp(rank, world_size, spec, saved, model)


def _diloco(rank, world_size, spec, saved):
    import gradzip
    dist.init_process_group("gloo")
    model = mlp()
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    outer = gradzip.diloco.DiLoCo(model, spec, local_steps=2)

    def steps(first):
        for i in range(first, first + 2):
            x = inputs(rank, i, 8 * 40).view(8, 40)
            inner.zero_grad()
            model(x).square().mean().backward()
            inner.step()
            outer.step()

    checkpoint = None
    if saved is None:
        steps(0)
        steps(2)
        checkpoint = saved_now({"model": model.state_dict(), "inner": inner.state_dict(), "diloco": outer.state_dict()})
    else:
        model.load_state_dict(saved["model"])
        inner.load_state_dict(saved["inner"])
        outer.load_state_dict(saved["diloco"])
    steps(4)
    return {"checkpoint": checkpoint, "outputs": [p.detach().clone() for p in model.parameters()]}


def _backend(rank, world_size, spec, saved):
    import gradzip
    dist.init_process_group("gradzip", pg_options=gradzip.Options(aggregation=spec))
    checkpoint = None
    if saved is None:
        for step in range(2):
            dist.all_reduce(inputs(rank, step, 3000))
        checkpoint = saved_now(gradzip.state_dict() if hasattr(gradzip, "state_dict") else
                               dist.group.WORLD._get_backend(torch.device("cpu")).state_dict())
    else:
        gradzip.load_state_dict(saved)
    out = inputs(rank, 2, 3000)
    dist.all_reduce(out)
    return {"checkpoint": checkpoint, "outputs": [out]}
