"""Point-to-point on a gradzip group (checked send/recv) with real ranks: every pattern
that completes on Gloo completes on gradzip, in every order of posting and waiting, with
the bytes Gloo delivers; pipeline schedules give Gloo's bits; a stopped peer is an error."""
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import p2p_patterns
from ranks import run_ranks

SIZES = (0, 1, 1000, 1 << 18)  # elements: up to 1 MB of float32
BIG = 1 << 24  # 64 MB of float32 (in the ring)


def patterns_as_gloo(rank, world):
    """Every pattern, size, posting and wait order on a gradzip group and on a Gloo group."""
    import gradzip
    gradzip.init_process_group("gradzip", timeout=timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    cases = [(name, n, post, wait) for name in p2p_patterns.PATTERNS for n in SIZES
             for post in p2p_patterns.POST_ORDERS for wait in p2p_patterns.WAIT_ORDERS]
    cases += [("ring", BIG, post, wait) for post in ("sends_first", "receives_first")
              for wait in ("sends_first", "receives_first")]
    for name, n, post, wait in cases:
        what = f"{name}, {n} elements, posted {post}, waited {wait}"
        results = []
        for group in (dist.group.WORLD, gloo):
            sends, receives = p2p_patterns.PATTERNS[name](rank, world, n)
            results.append(p2p_patterns.exchange(group, sends, receives, post, wait))
        p2p_patterns.check(rank, receives, results[0], what + " (gradzip)")
        for ours, theirs in zip(*results):
            assert torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8)), what
    return len(cases)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_pattern_in_every_order_completes_as_on_gloo(world):
    counts = run_ranks(patterns_as_gloo, world, timeout=600)
    assert counts == [len(p2p_patterns.PATTERNS) * len(SIZES) * 12 + 4] * world


def many_lines(rank, world):
    """Each rank receives on 12 tags from every other rank at once, all waited for in
    reverse: one line per (source, tag), each driven without the application."""
    import gradzip
    gradzip.init_process_group("gradzip")
    peers = [p for p in range(world) if p != rank]
    receives = [(src, tag, torch.empty(100 + tag)) for src in peers for tag in range(12)]
    works = [dist.irecv(t, src, tag=tag) for src, tag, t in receives]
    sends = [dist.isend(torch.full((100 + tag,), float(rank * 100 + tag)), dst, tag=tag)
             for dst in peers for tag in reversed(range(12))]
    for w in sends + list(reversed(works)):
        w.wait()
    return all(torch.equal(t, torch.full_like(t, float(src * 100 + tag))) for src, tag, t in receives)


def test_receives_on_many_tags_at_once_complete():
    assert run_ranks(many_lines, 3) == [True] * 3


def any_source_with_named(rank, world):
    """On one tag: a receive from any rank, one from rank 1, one from any rank, posted at
    once; ranks 1..world-1 each send one message and rank 1 a second. Receives are matched
    in the order they were made: the named one gets a message rank 1 sent, and every
    message is received exactly once, whatever order the application waits in."""
    import gradzip
    gradzip.init_process_group("gradzip")
    outcomes = []
    for wait in ("in order", "reversed"):
        if rank == 0:
            into = [torch.empty(4) for _ in range(world)]
            sources = [None, 1] + [None] * (world - 2)
            works = [dist.irecv(t, src, tag=5) for t, src in zip(into, sources)]
            for w in (works if wait == "in order" else reversed(works)):
                w.wait()
            got = sorted(tuple(t.tolist()) for t in into)
            sent = sorted([(r, 0.0, 0.0, 0.0) for r in range(1, world)] + [(1, 1.0, 1.0, 1.0)])
            assert got == [tuple(float(x) for x in m) for m in sent], (got, sent)
            assert into[1][0].item() == 1.0, "the receive from rank 1 got another rank's message"
            named_first = into[1].tolist() == [1.0, 0.0, 0.0, 0.0] or into[0][0].item() == 1.0
            assert named_first, "rank 1's two messages were received out of order"
            outcomes.append([w._source_rank() for w in works])
        else:
            messages = [torch.tensor([float(rank), 0.0, 0.0, 0.0])]
            if rank == 1:
                messages.append(torch.tensor([1.0, 1.0, 1.0, 1.0]))
            for m in messages:
                dist.send(m, 0, tag=5)
        dist.barrier()
    return outcomes


def test_any_source_and_named_receives_on_one_tag_are_matched_in_order():
    outcomes = run_ranks(any_source_with_named, 3)[0]
    for sources in outcomes:
        assert sources[1] == 1 and sorted(sources) == [1, 1, 2], sources


def stopped_peer(rank, world, seconds):
    """Rank 0 never receives rank 1's message and never sends what rank 1 waits for."""
    import gradzip
    gradzip.init_process_group("gradzip", timeout=timedelta(seconds=seconds))
    start = time.monotonic()
    try:
        if rank == 0:
            dist.isend(torch.ones(10), 1, tag=7).wait()
        else:
            dist.irecv(torch.empty(10), 0, tag=3).wait()
    except RuntimeError as error:
        return time.monotonic() - start, str(error)
    return time.monotonic() - start, None


def test_a_stopped_peer_gives_an_error_within_the_timeout():
    """Both ranks raise within the timeout, and the first names it. Both time out at
    about the same moment: the rank that raises first leaves its task and its group's
    connections close, so the other may hear the closed connection before its own timer
    fires (either way it is an error, in time)."""
    seconds = 4
    outcomes = run_ranks(stopped_peer, 2, seconds, timeout=120)
    timed_out = lambda error: "Timed out" in error or "timed out" in error or "timeout" in error
    for elapsed, error in outcomes:
        assert error is not None, "a send or receive with no peer completed"
        assert elapsed < seconds + 5, elapsed
        assert timed_out(error) or "Connection closed by peer" in error, error
    assert any(timed_out(error) for _, error in outcomes), outcomes


def oversized_announcement(rank, world):
    """A peer announcing far more than the receive expects is refused without allocating
    it; a near miss is drained and the stream stays in step."""
    import gradzip
    gradzip.init_process_group("gradzip", timeout=timedelta(seconds=5))
    if rank == 0:
        dist.send(torch.ones(12), 1, tag=1)  # 48 bytes against 40: drained
        dist.send(torch.full((5,), 2.0), 1, tag=1)  # in step afterwards
        unreceived = dist.isend(torch.ones(1 << 19), 1, tag=2)  # 2 MiB against 4 bytes: refused
        dist.barrier()
        assert not unreceived.is_completed()
        return None
    errors = []
    for n in (10, 5):
        into = torch.zeros(n)
        try:
            dist.recv(into, 0, tag=1)
            errors.append(into.tolist())
        except RuntimeError as error:
            errors.append(str(error))
    for _ in range(2):  # the refusal, then every later receive on that stream
        try:
            dist.recv(torch.zeros(1), 0, tag=2)
            errors.append(None)
        except RuntimeError as error:
            errors.append(str(error))
    dist.barrier()
    return errors


def test_an_announcement_past_the_bound_is_refused_and_a_near_miss_drained():
    seen = run_ranks(oversized_announcement, 2, timeout=120)[1]
    assert "expects 10 elements of Float, rank 0 sent 12 elements of Float" in seen[0], seen[0]
    assert seen[1] == [2.0] * 5
    assert "more than 4x the receive's bytes + 1 MiB" in seen[2], seen[2]
    assert "out of step" in seen[3], seen[3]


def tag_range(rank, world):
    """Over Gloo a checked message's data travels on its tag + 2^30: the highest tag a user
    may take, 2^30 - 1, works; 2^30 is refused by name on both sides."""
    import gradzip
    gradzip.init_process_group("gradzip", timeout=timedelta(seconds=30))
    errors = []
    for call in (lambda: dist.send(torch.ones(3), 1 - rank, tag=1 << 30),
                 lambda: dist.recv(torch.empty(3), 1 - rank, tag=1 << 30)):
        try:
            call()
            errors.append(None)
        except RuntimeError as error:
            errors.append(str(error))
    got = torch.arange(4.0) if rank == 0 else torch.empty(4)
    (dist.send if rank == 0 else dist.recv)(got, 1 - rank, tag=(1 << 30) - 1)
    return errors, got.tolist()


def test_the_highest_tag_works_and_the_next_is_refused():
    for errors, got in run_ranks(tag_range, 2):
        assert all(e and "takes tags 0..1073741823, got 1073741824" in e for e in errors), errors
        assert got == [0.0, 1.0, 2.0, 3.0]


def pipeline(rank, world, schedule_name):
    """A small MLP in `world` stages through torch.distributed.pipelining, once over the
    gradzip group and once over a Gloo group: losses and gradients bit for bit."""
    import gradzip
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    gradzip.init_process_group("gradzip")
    gloo = dist.new_group(backend="gloo")
    schedule_type = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule_name]
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh()) for _ in range(world)]
    x, y = torch.randn(16, 32), torch.randn(16, 32)
    outcomes = []
    for group in (dist.group.WORLD, gloo):
        block = blocks[rank]
        block.zero_grad()
        stage = PipelineStage(block, rank, world, torch.device("cpu"), group=group)
        schedule = schedule_type(stage, n_microbatches=4, loss_fn=torch.nn.functional.mse_loss)
        losses = []
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        outcomes.append(([loss.detach().clone() for loss in losses], [p.grad.clone() for p in block.parameters()]))
    (our_losses, our_grads), (their_losses, their_grads) = outcomes
    assert len(our_losses) == (4 if rank == world - 1 else 0)
    assert all(torch.equal(a, b) for a, b in zip(our_losses, their_losses))
    assert all(torch.equal(a, b) for a, b in zip(our_grads, their_grads))
    assert all(g.abs().sum() > 0 for g in our_grads)
    return True


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_schedules_match_gloo_bitwise(world, schedule):
    assert run_ranks(pipeline, world, schedule) == [True] * world


def cuda_patterns(rank, world):
    """CUDA tensors are forwarded to NCCL: the same patterns, each rank on its own GPU."""
    import gradzip
    torch.cuda.set_device(rank)
    gradzip.init_process_group("gradzip", device_id=torch.device("cuda", rank))
    for name in ("ring", "all_pairs", "halo"):
        for wait in p2p_patterns.WAIT_ORDERS:
            sends, receives = p2p_patterns.PATTERNS[name](rank, world, 1 << 16)
            sends = [(dst, tag, t.cuda()) for dst, tag, t in sends]
            receives = [(src, tag, t.cuda()) for src, tag, t in receives]
            got = p2p_patterns.exchange(dist.group.WORLD, sends, receives, "batch", wait)
            p2p_patterns.check(rank, receives, [t.cpu() for t in got], f"{name} on CUDA, waited {wait}")
    return True


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (CUDA p2p is forwarded to NCCL)")
def test_cuda_patterns_forwarded_to_nccl():
    assert run_ranks(cuda_patterns, 2) == [True, True]
