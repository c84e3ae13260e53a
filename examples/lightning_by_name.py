"""A PyTorch Lightning script that picks the gradzip backend by name and never imports
gradzip: torch finds it through its entry points, and the launch line sets the aggregation.

    GRADZIP_AGGREGATION=stc:density=0.01 torchrun --standalone --nproc-per-node 2 examples/lightning_by_name.py
    GRADZIP_AGGREGATION=topk:density=0.01 python examples/lightning_by_name.py   # Lightning starts rank 1

Each rank prints the backend and a checksum of its weights when training ends.
"""
import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch, batch_index):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def on_train_end(self):
        checksum = sum(float(p.detach().double().abs().sum()) for p in self.parameters())
        print(f"rank {self.global_rank} backend {torch.distributed.get_backend()} checksum {checksum:.12g};", flush=True)


def main():
    pl.seed_everything(0)
    x = torch.randn(512, 32)
    data = TensorDataset(x, x[:, :4].sum(1, keepdim=True))
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gradzip"),
                         max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(Regression(), DataLoader(data, batch_size=16))


if __name__ == "__main__":
    main()
