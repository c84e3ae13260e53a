"""A Hugging Face Accelerate script on CPU ranks over the gradzip backend, which it never
imports: torch finds the name through its entry points, the launch line sets the aggregation.

    GRADZIP_AGGREGATION=stc:density=0.01 ACCELERATE_USE_CPU=1 \
        accelerate launch --multi_gpu --num_processes 2 examples/accelerate_by_name.py

Accelerate has no setting that names the process group's backend, and on CPU it replaces any
name with "gloo"; it does adopt a group that already exists. So the one line gradzip needs is
`init_process_group("gradzip")` before the Accelerator. (On GPUs,
`Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="gradzip")])` also works.)
Each rank prints the backend and a checksum of its weights.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main():
    dist.init_process_group("gradzip")
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(512, 32)
    loader = DataLoader(TensorDataset(x, x[:, :4].sum(1, keepdim=True)), batch_size=16)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for _ in range(2):
        for inputs, targets in loader:
            optimizer.zero_grad()
            accelerator.backward(F.mse_loss(model(inputs), targets))
            optimizer.step()
    checksum = sum(float(p.detach().double().abs().sum()) for p in model.parameters())
    print(f"rank {accelerator.process_index} backend {dist.get_backend()} checksum {checksum:.12g};", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
