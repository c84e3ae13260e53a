"""A rendezvous store that outlives torchrun's elastic agents.

    python examples/rendezvous_store.py 29400 &
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes 3:4 --nproc-per-node 1 --max-restarts 3 \
        --rdzv-backend c10d --rdzv-endpoint HOST:29400 --rdzv-id job \
        --rdzv-conf is_host=false,last_call_timeout=2 \
        examples/train_elastic.py --checkpoint /shared/elastic.pt      # on each of 4 nodes

With the c10d rendezvous backend, the agent on the endpoint's host serves the rendezvous
store itself, and a job that loses that agent's node cannot rendezvous again. Served from a
process of its own (is_host=false makes every agent a client), the store stays when any
node goes, and the agents that remain restart their workers at the world size left (at
least the minimum of --nnodes). The workers' own store needs the same care: by default the
agent that was rank 0 in the first round serves it for every later round, so losing that
node leaves the restarted workers a store that is gone (and one that outlives a round keeps
the last round's addresses); TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 makes each round's rank 0
serve a fresh one. tests/python/test_elastic.py runs this on one machine.
"""
import argparse
import time

import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("port", type=int)
    parser.add_argument("--host", default="0.0.0.0")
    args = parser.parse_args()
    store = dist.TCPStore(args.host, args.port, is_master=True, wait_for_workers=False)
    print(f"rendezvous store on port {store.port}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
