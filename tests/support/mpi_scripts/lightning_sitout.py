"""Ranks that sit out inside Lightning's loop (``bno.lightning.BalancedStrategy``), under torchrun.

Usage::

    python lightning_sitout.py OUT_DIR DATA_ROOT [--devices 1] [--resume CKPT] [--checkpoint-at N] [--max-steps N]

The model is ``examples/lightning_mnist.py``'s ``FashionClassifier`` (its CNN with BatchNorm and two
dropouts), float64, SGD with momentum, 3 epochs of a 200-sample training set (13 global batches of
16 each). Its ``training_step`` also logs the loss with ``sync_dist=True`` on step and on epoch, and
a validation of 2 batches runs every 5 updates (``sync_dist=True`` too). On 4 ranks the split
changes every 2 updates (:class:`Splits`): everyone at first, then rank 3 out and back, three of
four out at once, a rank at 1 sample, and rank 3 out for the whole second epoch; on 1 process
(``--devices 1``) the whole global batch. ``--checkpoint-at N`` saves a checkpoint at update N
(``OUT_DIR/ckpt``), ``--resume`` resumes from one, ``--max-steps`` stops early, ``--no-val``
drops the validation.

Each rank writes ``OUT_DIR/rank-R.json``: every update it computed (global step, batch size and a
hash of the model's and the optimizer's state before its forward), a hash at every validation, and
at the end; rank 0 also ``OUT_DIR/model.pt`` (the ``Net``'s state) and the logged metrics.
"""

import argparse
import hashlib
import importlib.util
import json
import os

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, Subset
from torchvision import datasets

import bno_hvd as bno
from bno_hvd.allocation import Strategy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
spec = importlib.util.spec_from_file_location("lightning_mnist", os.path.join(ROOT, "examples", "lightning_mnist.py"))
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)

GLOBAL, EPOCHS = 16, 3
CYCLE = [[1, 7, 3, 5], [6, 1, 9, 0], [8, 4, 4, 0], [1, 1, 5, 9], [4, 0, 0, 12], [16, 0, 0, 0], [2, 5, 8, 1]]
WHOLE_EPOCH_OUT = range(12, 34)  # rank 3 out from here (the second epoch is updates 13..25)


class Splits(Strategy):
    """Every 2 updates the next split of ``CYCLE``; rank 3 out through ``WHOLE_EPOCH_OUT``."""

    name = "splits"

    def __init__(self):
        super().__init__(4, 4, global_batch=GLOBAL)

    def initial(self):
        return [4, 4, 4, 4]

    def rebalance(self, metrics, current, update):
        self._begin(metrics, current)
        if update in WHOLE_EPOCH_OUT:
            return [1, 9, 6, 0] if update % 4 else [5, 5, 6, 0]
        return list(CYCLE[(update // 2) % len(CYCLE)])


def state_hash(module, optimizers) -> str:
    digest = hashlib.sha256()
    for value in module.state_dict().values():
        digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    for optimizer in optimizers:
        for state in optimizer.state.values():
            for value in state.values():
                if torch.is_tensor(value):
                    digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


class Classifier(example.FashionClassifier):
    """The example's module with a synced training log, a validation, and the notes above."""

    def __init__(self, data_dir, batch_size):
        super().__init__(data_dir, batch_size=batch_size, lr=0.05)
        self.notes = {"computed": [], "validated": []}

    def train_dataloader(self):
        train_set = datasets.FashionMNIST(self.data_dir, train=True, transform=self.to_input)
        return DataLoader(train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        val_set = Subset(datasets.FashionMNIST(self.data_dir, train=False, transform=self.to_input), range(64))
        return DataLoader(val_set, batch_size=8)

    def training_step(self, batch, batch_idx):
        images, _ = batch
        here = state_hash(self.net, self.trainer.optimizers)
        self.notes["computed"].append([self.trainer.global_step, len(images), here])
        loss = super().training_step(batch, batch_idx)
        self.log("synced_loss", loss, sync_dist=True, on_step=True, on_epoch=True)
        return loss

    def on_validation_epoch_start(self):
        self.notes["validated"].append([self.trainer.global_step, state_hash(self.net, self.trainer.optimizers)])

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        loss = torch.nn.functional.nll_loss(self.net(images), labels)
        self.log("val_loss", loss, sync_dist=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("data")
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--resume")
    parser.add_argument("--checkpoint-at", type=int, default=0)
    parser.add_argument("--no-val", action="store_true")
    parser.add_argument("--max-steps", type=int, default=-1)
    args = parser.parse_args()
    torch.set_default_dtype(torch.float64)
    L.seed_everything(5)
    model = Classifier(args.data, GLOBAL // args.devices)
    split = Splits() if args.devices == 4 else "equal"
    every = args.checkpoint_at or None
    ckpt = ModelCheckpoint(dirpath=os.path.join(args.out, "ckpt"), every_n_train_steps=every, save_top_k=-1)
    trainer = L.Trainer(
        strategy=bno.lightning.BalancedStrategy(split, 2),
        accelerator="cpu",
        devices=args.devices,
        max_epochs=EPOCHS,
        max_steps=args.max_steps,
        logger=CSVLogger(os.path.join(args.out, "logs")),
        log_every_n_steps=1,
        val_check_interval=5,
        limit_val_batches=0 if args.no_val else 2,
        num_sanity_val_steps=0,
        callbacks=[ckpt] if every else [],
        enable_checkpointing=bool(every),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, ckpt_path=args.resume)
    rank = trainer.global_rank
    model.notes["final"] = state_hash(model.net, trainer.optimizers)
    model.notes["global_step"] = trainer.global_step
    with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as fh:
        json.dump(model.notes, fh)
    if rank == 0:
        torch.save(model.net.state_dict(), os.path.join(args.out, "model.pt"))
    open(os.path.join(args.out, f"done-{rank}"), "w").close()
    del trainer, model
    from bno_hvd.processes.torchenv import finish_process_group

    finish_process_group()  # the models first, then the groups (pytorch/pytorch#56297, #190489)


if __name__ == "__main__":
    main()
