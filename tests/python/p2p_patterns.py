"""Point-to-point patterns that real clients use, run in every order of posting and waiting.

A pattern gives each rank its sends [(dst, tag, tensor)] and receives [(src, tag, empty)];
exchange() posts them (sends first or receives first, one by one or as one P2POp batch)
and waits on the works in one of WAIT_ORDERS. Every message's contents follow from its
(source, destination, tag, index), so a receiver checks what it got without asking the
sender, and two groups given the same pattern must receive the same bytes.
"""
import torch
import torch.distributed as dist

WAIT_ORDERS = ("sends_first", "receives_first", "reversed", "interleaved")
POST_ORDERS = ("sends_first", "receives_first", "batch")
DTYPES = (torch.float32, torch.int64, torch.float16, torch.bfloat16, torch.uint8)


def message(src, dst, tag, index, n):
    """The index-th message from src to dst with this tag: n elements of a dtype that varies."""
    g = torch.Generator().manual_seed(((src * 131 + dst) * 131 + tag) * 131 + index)
    dtype = DTYPES[(src + dst + tag + index) % len(DTYPES)]
    return (torch.randn(n, generator=g) * 50).to(dtype)


def _pairs(rank, world, n, links):
    """Sends and receives for `links`: (peer to send to, tag, how many, peer to receive from)."""
    sends, receives = [], []
    for dst, tag, count, src in links:
        sends += [(dst, tag, message(rank, dst, tag, i, n)) for i in range(count)]
        receives += [(src, tag, torch.empty_like(message(src, rank, tag, i, n))) for i in range(count)]
    return sends, receives


def ring(rank, world, n):
    """Each rank sends to the next and receives from the previous."""
    return _pairs(rank, world, n, [((rank + 1) % world, 0, 1, (rank - 1) % world)])


def all_pairs(rank, world, n):
    """Every rank sends to and receives from every other."""
    return _pairs(rank, world, n, [(peer, 0, 1, peer) for peer in range(world) if peer != rank])


def halo(rank, world, n):
    """A halo exchange: left on tag 1, right on tag 2 (with two ranks, both to the one neighbour)."""
    left, right = (rank - 1) % world, (rank + 1) % world
    return _pairs(rank, world, n, [(left, 1, 1, right), (right, 2, 1, left)])


def neighbour_averaging(rank, world, n):
    """mlbench's decentralized averaging: three tensors to and from every ring neighbour, one tag."""
    neighbours = sorted({(rank - 1) % world, (rank + 1) % world} - {rank})
    return _pairs(rank, world, n, [(peer, 0, 3, peer) for peer in neighbours])


def several_in_flight(rank, world, n):
    """Three messages from one rank with one tag outstanding at once (they arrive in order)."""
    return _pairs(rank, world, n, [((rank + 1) % world, 3, 3, (rank - 1) % world)])


PATTERNS = {f.__name__: f for f in (ring, all_pairs, halo, neighbour_averaging, several_in_flight)}


def exchange(group, sends, receives, post, wait):
    """Posts the sends and receives (`post`), waits in `wait` order, returns the receive buffers."""
    send_ops = [dist.P2POp(dist.isend, t, dst, group, tag) for dst, tag, t in sends]
    recv_ops = [dist.P2POp(dist.irecv, t, src, group, tag) for src, tag, t in receives]
    if post == "batch":
        works = dist.batch_isend_irecv(send_ops + recv_ops)
    else:
        ops = send_ops + recv_ops if post == "sends_first" else recv_ops + send_ops
        works = [op.op(op.tensor, op.peer, op.group, op.tag) for op in ops]
        if post == "receives_first":
            works = works[len(recv_ops):] + works[:len(recv_ops)]
    sent, received = works[:len(send_ops)], works[len(send_ops):]
    if wait == "sends_first":
        order = sent + received
    elif wait == "receives_first":
        order = received + sent
    elif wait == "reversed":
        order = list(reversed(works))
    else:
        order = [w for pair in zip(sent, received) for w in pair]
        order += sent[len(received):] + received[len(sent):]
    for work in order:
        work.wait()
    return [t for _, _, t in receives]


def check(rank, receives, got, what):
    """Every received message is the one its sender made."""
    expected_index = {}
    for (src, tag, _), tensor in zip(receives, got):
        index = expected_index.get((src, tag), 0)
        expected_index[(src, tag)] = index + 1
        want = message(src, rank, tag, index, tensor.numel())
        assert tensor.dtype == want.dtype and torch.equal(tensor, want), f"{what}: message {index} from {src}, tag {tag}"
