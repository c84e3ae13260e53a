"""gradzip's DDP hook inside a torchft job: compressed aggregation across replica groups
that come and go (torchft: https://github.com/pytorch/torchft; docs/torchft.md).

    import torchft, gradzip.torchft
    pg = torchft.ProcessGroupGloo()                      # or torchft.ProcessGroupNCCL()
    manager = torchft.Manager(pg=pg, use_async_quorum=False, load_state_dict=..., state_dict=..., ...)
    model = gradzip.torchft.DistributedDataParallel(manager, pg, model, "topk:density=0.01", optimizer=opt)
    optimizer = torchft.optim.OptimizerWrapper(manager, opt)
    # loop: optimizer.zero_grad(); loss(model(x)).backward(); optimizer.step()

It is torch's DDP over torchft's ProcessGroupDummy, as torchft's own DistributedDataParallel,
with gradzip's hook (gradzip.hooks) in place of torchft's: each bucket is compressed with
error feedback over the quorum's group (`pg.parent`, made anew by torchft at each quorum).
At each step's first bucket it:

- waits for the quorum; if the last step was not committed (a replica failed inside it),
  restores the error feedback and counters to what they were before it (State.restore);
- on a new quorum, moves the State to the new group (State.set_process_group): the
  replicas that stay rescale their residuals and velocities by W'/W (W, W' the old and new
  replica counts: their share of the update not yet applied is kept); a replica that joins
  starts with zero residuals; a departed replica's residuals die with it: their L1 mass, as
  all-gathered at the start of its last step, is counted in stats()["dropped_residual_l1"];
- takes a State.snapshot() and all-gathers each replica's residual L1 mass (one float).

A joining replica heals from a peer through torchft: the key "gradzip" of the Manager's
state dict carries the peer's State.peer_state_dict() (counters, no residuals), model and
optimizer come from the Manager's own state dict functions as usual. A step in which the
hook fails (a peer died) is reported to the Manager, whose should_commit() then discards
it on every replica.

Requires use_async_quorum=False (a healing replica then takes part in the step it healed
in, and every quorum member takes part, so gradzip's average over the group is torchft's
average over the participants). The spec runs flat (hierarchy=off): the nodes' groups of
the hierarchical exchange would have to be made anew at each quorum.
"""
import zlib

import torch
from torch.nn.parallel import DistributedDataParallel as _TorchDDP

from .hooks import State, hook
from .spec import bind_spec


def _flat(spec) -> str:
    """The spec with hierarchy=off (its default is auto), refused if it asks for a hierarchy."""
    bound = bind_spec(spec)
    hierarchy = bound.params.get("hierarchy")
    if hierarchy not in (None, "off"):
        raise ValueError(f"gradzip.torchft: {bound} asks for hierarchy={hierarchy}; inside torchft the exchange "
                         "runs flat (the hierarchy's node and lane groups would have to be made at every quorum)")
    text = str(bound)
    return text if hierarchy == "off" else text + ("," if ":" in text else ":") + "hierarchy=off"


def _done(tensor: torch.Tensor) -> torch.futures.Future:
    future = torch.futures.Future()
    future.set_result(tensor)
    return future


class DistributedDataParallel(_TorchDDP):
    """`module` trained by one torchft replica group, its gradients averaged across the
    quorum's replicas by gradzip's hook with the aggregation `spec`.

    manager: the torchft.Manager, made with use_async_quorum=False.
    pg: the torchft process group given to that Manager (a ProcessGroupWrapper such as
        ProcessGroupGloo or ProcessGroupNCCL): the hook aggregates over its current group.
    optimizer, start_iter, scaler: as gradzip.hooks.State's.
    key: the name of gradzip's entry in the Manager's state dict (default "gradzip").
    Other keyword arguments go to torch's DistributedDataParallel.
    """

    def __init__(self, manager, pg, module: torch.nn.Module, spec, *, optimizer=None, start_iter: int = 1,
                 scaler=None, key: str = "gradzip", **kwargs):
        from torchft.process_group import ProcessGroupDummy, ProcessGroupWrapper

        # torchft has no public accessor for this option; its Manager keeps it here.
        if getattr(manager, "_use_async_quorum", False):
            raise ValueError("gradzip.torchft: make the torchft.Manager with use_async_quorum=False: with the "
                             "asynchronous quorum a healing replica sits its first step out, and gradzip's "
                             "average over the group would no longer be torchft's over the participants")
        if not isinstance(pg, ProcessGroupWrapper):
            raise TypeError(f"gradzip.torchft: pg is the torchft ProcessGroupWrapper given to the Manager "
                            f"(ProcessGroupGloo, ProcessGroupNCCL), not {type(pg).__name__}")
        super().__init__(module, process_group=ProcessGroupDummy(0, 1), find_unused_parameters=True, **kwargs)
        self.gradzip_state = State(_flat(spec), start_iter=start_iter, model=self, scaler=scaler,
                                   optimizer=optimizer)
        self._ft_manager, self._ft_pg = manager, pg
        self._ft_group = None      # the quorum group the error feedback was accumulated over
        self._ft_snapshot = None   # (the Manager's step, State.snapshot()) before the step in flight
        self._ft_masses = None     # each replica's residual L1 at the start of the last step
        self._ft_departed, self._ft_dropped = 0, 0.0
        self.register_comm_hook(self, _hook)
        manager.register_state_dict_fn(key, self._load_peer, self._peer)

    def stats(self) -> dict:
        """The hook's byte counts (gradzip.hooks.State.stats()), with "replicas_departed" (the
        replicas seen leaving by this one) and "dropped_residual_l1" (the L1 mass of their
        residuals as of the start of their last step, and of two-phase owners' residuals
        dropped at a change of size): mass never applied."""
        return {**self.gradzip_state.stats(), "replicas_departed": self._ft_departed,
                "dropped_residual_l1": self._ft_dropped}

    def _settle(self) -> None:
        """Undoes the last step's effect on the error feedback unless the Manager committed it."""
        if self._ft_snapshot is not None and self._ft_manager.current_step() == self._ft_snapshot[0]:
            self.gradzip_state.restore(self._ft_snapshot[1])
        self._ft_snapshot = None

    def _peer(self) -> dict:
        # torchft calls it on its quorum thread while the training thread waits in start_quorum.
        self._settle()
        return self.gradzip_state.peer_state_dict()

    def _load_peer(self, state: dict) -> None:
        self.gradzip_state.load_state_dict(state)
        self._ft_group, self._ft_snapshot, self._ft_masses = None, None, None

    def _require_all_take_part(self) -> None:
        manager = self._ft_manager
        manager.wait_quorum()
        size = self._ft_pg.parent.size()
        if manager.num_participants() != size or not manager.is_participating():
            raise RuntimeError(f"gradzip.torchft: the quorum's group has {size} replicas and "
                               f"{manager.num_participants()} take part (this one: {manager.is_participating()}); "
                               "gradzip averages over the whole group, so every member must take part "
                               "(no spare replicas)")

    def _begin_step(self, device: torch.device) -> None:
        manager = self._ft_manager
        self._settle()
        group = self._ft_pg.parent
        if group is not self._ft_group:
            self._count_departed(group, device)
            previous = None if self._ft_group is None else self._ft_group.size()
            self._ft_dropped += self.gradzip_state.set_process_group(group, previous)
            self._ft_group = group
        snapshot = self.gradzip_state.snapshot()
        self._ft_snapshot = (manager.current_step(), snapshot)
        mine = torch.tensor([self.gradzip_state.residual_mass(snapshot)], dtype=torch.float64, device=device)
        every = [torch.empty_like(mine) for _ in range(group.size())]
        group.allgather([every], [mine]).wait()
        self._ft_masses = torch.cat(every).cpu()

    def _count_departed(self, group, device: torch.device) -> None:
        """Collective over the new group: each member says which group it comes from (a
        checksum of that group's last gathered masses, -1 for none) and its rank there; the
        ranks of this replica's last group that are not here have departed."""
        tag = -1 if self._ft_masses is None else zlib.crc32(self._ft_masses.numpy().tobytes())
        rank = -1 if self._ft_group is None else self._ft_group.rank()
        mine = torch.tensor([tag, rank], dtype=torch.int64, device=device)
        every = [torch.empty_like(mine) for _ in range(group.size())]
        group.allgather([every], [mine]).wait()
        if self._ft_masses is None:
            return
        here = {int(r) for t, r in (x.tolist() for x in every) if t == tag}
        gone = [r for r in range(len(self._ft_masses)) if r not in here]
        self._ft_departed += len(gone)
        self._ft_dropped += float(sum(self._ft_masses[r] for r in gone))


def _hook(ddp: DistributedDataParallel, bucket) -> torch.futures.Future[torch.Tensor]:
    manager = ddp._ft_manager
    if bucket.index() == 0:
        ddp._require_all_take_part()
        try:
            ddp._begin_step(bucket.buffer().device)
        except Exception as e:  # a peer gone: torchft discards the step on every replica
            manager.report_error(e)
    if manager.errored():
        return _done(bucket.buffer())
    try:
        future = hook(ddp.gradzip_state, bucket)
    except Exception as e:
        manager.report_error(e)
        return _done(bucket.buffer())
    return manager.wrap_future(future, bucket.buffer())
