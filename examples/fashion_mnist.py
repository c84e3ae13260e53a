"""Fashion-MNIST for the examples and benchmarks: Debian's dataset-fashion-mnist IDX
files (no download), a small CNN, and test accuracy evaluated by all ranks together."""
import gzip
import os
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

DATA_DIR = Path(os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (the MNIST format): magic with the element type and rank, sizes, data."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if raw[:2] != b"\0\0" or raw[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path}: {data.size} bytes of data for shape {shape}")
    return data.reshape(shape)


def load(split: str):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(DATA_DIR / f"{prefix}-images-idx3-ubyte.gz")
    labels = read_idx(DATA_DIR / f"{prefix}-labels-idx1-ubyte.gz")
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    return (x - 0.2860) / 0.3530, torch.from_numpy(labels.astype(np.int64))


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = torch.nn.Linear(32 * 7 * 7, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def evaluate(model, x, y, rank, world):
    """Test accuracy over the whole test set: each rank scores a slice, then a sum."""
    model.eval()
    mine = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
    with torch.no_grad():
        correct = (model(x[mine]).argmax(1) == y[mine]).sum()
    counts = torch.tensor([correct.item(), len(y[mine])], dtype=torch.int64)
    dist.all_reduce(counts)
    model.train()
    return counts[0].item() / counts[1].item()
