"""What the balanced Trainer cannot do exactly, refused in one line on every process.

``python trainer_refusals.py CASE`` under torchrun (2 processes, CPU): ``trainer.train()`` ends the
script as it would a user's (one ``bno-hvd: error:`` line, exit code 2 on every process). The cases:

- ``accumulate``: ``TrainingArguments(gradient_accumulation_steps=2)``;
- ``dropout``: a Llama whose config sets ``attention_dropout=0.1``;
- ``no-lengths``: a training set without its sequences' lengths (and no ``lengths=``);
- ``miscount``: lengths that count a sequence's tokens, not its predictions (one more each);
- ``fixed-by-cost``: ``strategy="fixed:3,1"`` with the default ``cost="tokens"`` (sequences per
  process, where the split is by work);
- ``zero``: ``strategy="fixed:4,0"`` with ``cost=None`` (a process at 0 sequences: none sits out).
"""

import sys
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

import bno_hvd as bno


class Sequences(torch.utils.data.Dataset):
    def __init__(self, with_lengths: bool, predictions: int = 1):
        self.items = [torch.arange(1, 3 + i % 5) for i in range(32)]
        if with_lengths:
            self.lengths = [len(s) - predictions for s in self.items]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(sequences):
    ids = torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True)
    return {"input_ids": ids, "labels": ids.masked_fill(ids == 0, -100)}


def main(case: str) -> None:
    dropout = 0.1 if case == "dropout" else 0.0
    config = LlamaConfig(
        vocab_size=16,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        attention_dropout=dropout,
    )
    args = TrainingArguments(
        tempfile.mkdtemp(),
        use_cpu=True,
        max_steps=2,
        per_device_train_batch_size=2,
        report_to="none",
        gradient_accumulation_steps=2 if case == "accumulate" else 1,
        save_strategy="no",
    )
    data = Sequences(with_lengths=case != "no-lengths", predictions=0 if case == "miscount" else 1)
    split = {"fixed-by-cost": {"strategy": "fixed:3,1"}, "zero": {"strategy": "fixed:4,0", "cost": None}}
    trainer = bno.hf.BalancedTrainer(
        model=LlamaForCausalLM(config), args=args, train_dataset=data, data_collator=collate, **split.get(case, {})
    )
    trainer.train()
    print(f"{case} was not refused", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
